/* attribution_tree.c - the attribution tree of Hao et al. 2021 (attattr's
 * attribution_tree.py, any depth) built from per-layer attribution scores
 * (attribution.h; rules and an example in docs/attribution.md). It reads
 * only the scores, so it knows no model. */
#include "core/analysis/attribution.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* attattr's examples/attribution_tree.py, for any number of layers L (the
 * released script hard-codes 12); docs/attribution.md states the rules. */
enum { NODE_ABSENT = -1, NODE_OPEN = 0, NODE_FIXED = 1 };

int lens_attr_tree_build(const float *const *attr, int L, int NH, int T, float threshold,
                         lens_attr_tree *tree, lens_err *err)
{
    memset(tree, 0, sizeof *tree);
    if (L < 1 || NH < 1 || T < 2) return lens_fail(err, LENS_EINVAL, "a tree needs >= 1 layer and >= 2 tokens");
    const size_t TT = (size_t)T * T;
    float *prop = malloc(sizeof(float) * L * TT); /* per layer: Σ_h attr / |max over rows 1..T-1| */
    double *total = calloc(TT, sizeof(double));   /* Σ_l Σ_h attr */
    int *state = malloc(sizeof(int) * T);
    tree->nodes = malloc(sizeof(lens_attr_node) * T);
    tree->edges = malloc(sizeof(lens_attr_edge) * T);
    if (!prop || !total || !state || !tree->nodes || !tree->edges) {
        free(prop), free(total), free(state), lens_attr_tree_free(tree);
        return lens_fail(err, LENS_ENOMEM, "out of memory for the attribution tree");
    }
    for (int l = 0; l < L; l++) {
        float *p = prop + l * TT;
        for (size_t ij = 0; ij < TT; ij++) {
            double s = 0;
            for (int h = 0; h < NH; h++) s += attr[l][h * TT + ij];
            p[ij] = (float)s;
            total[ij] += s;
        }
        float max = -INFINITY; /* rows 1.. : the [CLS] row is left out of the normaliser */
        for (size_t ij = T; ij < TT; ij++) max = p[ij] > max ? p[ij] : max;
        const float scale = fabsf(max);
        for (size_t ij = 0; ij < TT; ij++) {
            const float v = scale > 0 ? p[ij] / scale : 0.0f;
            p[ij] = v > threshold ? v : 0.0f;
        }
    }
    /* root: largest Σ_j max(0, total[i][j]) over j != i, among rows i >= 1
     * (ties: the larger i, as the reversed argsort does) */
    int root = T - 1;
    double best = -1;
    for (int i = 1; i < T; i++) {
        double s = 0;
        for (int j = 0; j < T; j++)
            if (j != i && total[(size_t)i * T + j] > 0) s += total[(size_t)i * T + j];
        if (s >= best) best = s, root = i;
    }
    tree->root = root;
    tree->threshold = threshold;
    for (int i = 0; i < T; i++) state[i] = NODE_ABSENT;
    state[root] = NODE_OPEN;
    tree->nodes[tree->n_nodes++] = (lens_attr_node){root, L};
#define ADD_EDGE(li, i, j)                                                                               \
    do {                                                                                                 \
        tree->edges[tree->n_edges++] = (lens_attr_edge){(li) + 1, (i), (j), prop[(li) * TT + (size_t)(i) * T + (j)]}; \
        tree->nodes[tree->n_nodes++] = (lens_attr_node){(j), (li) + 1};                                  \
    } while (0)
    if (L >= 2) { /* second-to-last layer: children of the root */
        const int li = L - 2;
        for (int j = 0; j < T; j++)
            if (j != root && prop[li * TT + (size_t)root * T + j] > threshold) {
                state[j] = NODE_OPEN;
                state[root] = NODE_FIXED;
                ADD_EDGE(li, root, j);
            }
    }
    for (int li = L - 3; li >= 0; li--)
        for (int i = 1; i < T; i++)
            for (int j = 0; j < T; j++) {
                /* an edge only from a node in the tree to a token not yet in it; the
                 * parent becomes fixed when it gains its first child below the root layer */
                if (prop[li * TT + (size_t)i * T + j] < threshold || state[i] == NODE_ABSENT) continue;
                if (state[j] != NODE_ABSENT) continue;
                state[i] = NODE_FIXED;
                state[j] = NODE_OPEN;
                ADD_EDGE(li, i, j);
            }
#undef ADD_EDGE
    free(prop), free(total), free(state);
    return 0;
}

void lens_attr_tree_free(lens_attr_tree *tree)
{
    free(tree->nodes), free(tree->edges);
    memset(tree, 0, sizeof *tree);
}
