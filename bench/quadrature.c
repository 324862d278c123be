/* quadrature.c - measurement driver: the accuracy of attribution's
 * quadrature rules (riemann-m, gauss-n) against a high-order reference, on
 * real checkpoints (docs/attribution.md, "Quadrature").
 *
 *   quadrature --model DIR [--texts FILE] [--n 8] [--max-T 64] [--random-T T]
 *              [--riemann 5,10,20,50] [--gauss 2,3,4,6,8] [--ref 64] [--check 1000]
 *              [--threads 2]
 *
 * Inputs: the first --n non-empty lines of FILE (a TSV's first column, its
 * "sentence" header skipped), tokenized by the checkpoint's tokenizer and
 * cut to --max-T tokens; or, with --random-T, --n sequences of xorshift32
 * ids (bench.h; checkpoints without a useful tokenizer). Every layer is
 * attributed towards the predicted class (next token for a causal LM).
 * Reference: gauss-REF. --check M also runs riemann-M (right) and reports
 * its distance to the reference, which bounds how much of the reference
 * itself is trusted (a right Riemann sum's error is O(1/M)).
 *
 * Per rule, one JSON line: evaluations per layer, the relative error
 * ||Attr − Attr_ref||_F / ||Attr_ref||_F over all layers (mean and max over
 * the inputs), the largest |Attr − Attr_ref| over max |Attr_ref| (max over
 * inputs), the completeness gap max_l |Σ Attr_l − (F(A) − F(0)_l)| (max
 * over inputs) and the time of lens_attribution_run summed over the inputs. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"
#include "core/analysis/attribution.h"
#include "core/base/blas.h"
#include "core/base/heap.h"
#include "core/base/pool.h"
#include "core/io/tokenizer.h"
#include "core/model/model.h"

#define MAX_RULES 15 /* + the reference */

typedef struct {
    int *ids;
    int T;
} input;

typedef struct {
    lens_quadrature q;
    int m;
    double err_sum, err_max, abs_max, gap_max, ms;
} rule;

/* "2,3,4" into rules of quadrature q */
static int parse_rules(const char *s, lens_quadrature q, rule *r, int n)
{
    for (const char *p = s; *p && n < MAX_RULES; p = strchr(p, ',') ? strchr(p, ',') + 1 : p + strlen(p))
        r[n++] = (rule){.q = q, .m = atoi(p)};
    return n;
}

static int read_inputs(const lens_model *m, const char *path, int n, int max_T, input *in, lens_err *err)
{
    FILE *f = fopen(path, "r");
    if (!f) return lens_fail(err, LENS_ENOENT, "cannot open %s", path);
    char line[1 << 16];
    int k = 0;
    while (k < n && fgets(line, sizeof line, f)) {
        line[strcspn(line, "\t\r\n")] = 0;
        if (!strcmp(line, "sentence") || strspn(line, " ") == strlen(line)) continue;
        lens_token *tok;
        int T;
        if (lens_tokenize(m->tok, line, strlen(line), NULL, 0, &tok, &T, err)) break;
        if (T < 2) {
            free(tok);
            continue;
        }
        in[k].T = T < max_T ? T : max_T;
        in[k].ids = malloc(sizeof(int) * in[k].T);
        for (int t = 0; t < in[k].T; t++) in[k].ids[t] = tok[t].id;
        free(tok);
        k++;
    }
    fclose(f);
    return k;
}

static int run(const lens_model *m, const input *in, lens_quadrature q, int steps, lens_pool *pool,
               lens_attribution *out, double *ms)
{
    lens_err err = {0};
    lens_attr_opts o = {.steps = steps, .quadrature = q, .target = -1, .pool = pool};
    const double t0 = now_ms();
    if (lens_attribution_run(m, in->ids, NULL, in->T, &o, out, &err)) {
        fprintf(stderr, "quadrature: %s\n", err.msg);
        return -1;
    }
    *ms = now_ms() - t0;
    return 0;
}

/* errors of a against the reference, folded into r */
static void compare(const lens_attribution *a, const lens_attribution *ref, rule *r)
{
    const size_t n = (size_t)a->n_heads * a->T * a->T;
    double d2 = 0, r2 = 0, dmax = 0, rmax = 0, gap = 0;
    for (int l = 0; l < a->n_layers; l++) {
        for (size_t i = 0; i < n; i++) {
            const double d = a->layers[l].attr[i] - ref->layers[l].attr[i], v = ref->layers[l].attr[i];
            d2 += d * d, r2 += v * v;
            dmax = fabs(d) > dmax ? fabs(d) : dmax;
            rmax = fabs(v) > rmax ? fabs(v) : rmax;
        }
        const double g = fabs(a->layers[l].attr_sum - (a->f_full - a->layers[l].f_zero));
        gap = g > gap ? g : gap;
    }
    const double rel = r2 > 0 ? sqrt(d2 / r2) : sqrt(d2);
    r->err_sum += rel;
    r->err_max = rel > r->err_max ? rel : r->err_max;
    r->abs_max = rmax > 0 && dmax / rmax > r->abs_max ? dmax / rmax : r->abs_max;
    r->gap_max = gap > r->gap_max ? gap : r->gap_max;
}

int main(int argc, char **argv)
{
    lens_blas_setup(argv);
    lens_heap_setup();
    const char *dir = NULL, *texts = NULL, *riemann = "5,10,20,50", *gauss = "2,3,4,6,8";
    int n = 8, max_T = 64, random_T = 0, ref_nodes = 64, check = 1000, threads = 2;
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *a = argv[i], *v = argv[i + 1];
        if (!strcmp(a, "--model")) dir = v;
        else if (!strcmp(a, "--texts")) texts = v;
        else if (!strcmp(a, "--n")) n = atoi(v);
        else if (!strcmp(a, "--max-T")) max_T = atoi(v);
        else if (!strcmp(a, "--random-T")) random_T = atoi(v);
        else if (!strcmp(a, "--riemann")) riemann = v;
        else if (!strcmp(a, "--gauss")) gauss = v;
        else if (!strcmp(a, "--ref")) ref_nodes = atoi(v);
        else if (!strcmp(a, "--check")) check = atoi(v);
        else if (!strcmp(a, "--threads")) threads = atoi(v);
        else return fprintf(stderr, "quadrature: unknown option %s\n", a), 2;
    }
    if (!dir || (!texts && random_T < 1) || n < 1 || max_T < 2 || ref_nodes < 1 || threads < 1) {
        fprintf(stderr, "usage: quadrature --model DIR (--texts FILE | --random-T T) [--n 8] ...\n");
        return 2;
    }
    lens_err err = {0};
    lens_model *m = lens_model_load(dir, &err);
    if (!m) return fprintf(stderr, "quadrature: %s\n", err.msg), 1;
    lens_blas_set_threads(1);
    lens_pool *pool = threads > 1 ? lens_pool_create(threads) : NULL;
    input *in = calloc((size_t)n, sizeof *in);
    if (texts) n = read_inputs(m, texts, n, max_T, in, &err);
    else {
        uint32_t state = 42;
        for (int k = 0; k < n; k++) {
            in[k].T = random_T, in[k].ids = malloc(sizeof(int) * random_T);
            for (int t = 0; t < random_T; t++) in[k].ids[t] = (int)(xorshift32(&state) % (uint32_t)m->cfg.vocab_size);
        }
    }
    if (n < 1) return fprintf(stderr, "quadrature: no inputs (%s)\n", err.msg), 1;
    rule rules[MAX_RULES + 1];
    int nr = parse_rules(riemann, LENS_QUAD_RIEMANN, rules, 0);
    nr = parse_rules(gauss, LENS_QUAD_GAUSS, rules, nr);
    if (check > 0 && nr < MAX_RULES) rules[nr++] = (rule){.q = LENS_QUAD_RIEMANN, .m = check};
    rules[nr] = (rule){.q = LENS_QUAD_GAUSS, .m = ref_nodes}; /* the reference itself: its completeness gap */
    int T_sum = 0;
    for (int k = 0; k < n; k++) {
        lens_attribution ref;
        double ms;
        if (run(m, &in[k], LENS_QUAD_GAUSS, ref_nodes, pool, &ref, &ms)) return 1;
        compare(&ref, &ref, &rules[nr]);
        rules[nr].ms += ms;
        T_sum += in[k].T;
        for (int i = 0; i < nr; i++) {
            lens_attribution a;
            if (run(m, &in[k], rules[i].q, rules[i].m, pool, &a, &ms)) return 1;
            compare(&a, &ref, &rules[i]);
            rules[i].ms += ms;
            lens_attribution_free(&a);
        }
        lens_attribution_free(&ref);
    }
    for (int i = 0; i <= nr; i++) {
        const rule *r = &rules[i];
        printf("{\"model\":\"%s\",\"inputs\":%d,\"mean_T\":%.1f,\"layers\":%d,\"rule\":\"%s-%d\",\"evaluations\":%d,"
               "\"ref\":\"gauss-%d\",\"rel_err_mean\":%.3g,\"rel_err_max\":%.3g,\"max_abs_err_rel\":%.3g,"
               "\"completeness_gap_max\":%.3g,\"ms\":%.1f}\n",
               dir, n, (double)T_sum / n, m->cfg.n_layers, r->q == LENS_QUAD_GAUSS ? "gauss" : "riemann", r->m, r->m,
               ref_nodes, r->err_sum / n, r->err_max, r->abs_max, r->gap_max, r->ms);
    }
    for (int k = 0; k < n; k++) free(in[k].ids);
    free(in);
    lens_pool_free(pool);
    lens_model_free(m);
    return 0;
}
