/* test_dtype.c - weights resident in their file dtype, and mkmodel's
 * --dtype / --max-shard-size writer.
 *
 * The reference for a BF16 (F16) checkpoint is the same checkpoint widened
 * to F32 by this test (every tensor read, widened exactly, written as F32):
 * the two must give bitwise equal results, since widening is exact and the
 * GEMM kernels widen the BF16/F16 panels packed at load (or, under the
 * portable kernel, each sub-panel) to the same float32 values the F32 model
 * packs at load (same kernel, same blocking, same summation order; with
 * LENS_GEMM_KERNEL=blas, OpenBLAS is given the widened W in the F32 one's
 * layout, and so computes the same products). Checked
 * on mkmodel'd BERT (classification, masked LM), GPT-2, RoBERTa, DistilBERT,
 * Llama (untied lm_head), Qwen3, GPT-NeoX and Gemma2 at the tiny preset: every hidden state, attention probability, value and logit of
 * a packed batch of two sequences (7 and 40 tokens, the longer one crossing a
 * 32-column GEMM panel), and the token identity vocabulary ranking (which
 * reads the embedding table block by block). Sharded checkpoints: an F32
 * checkpoint written in shards is bitwise the single-file one (same walk
 * order, same random stream), and the index says what HF's says
 * (total_size = bytes of tensor data, every tensor in the shard named). */
#include <dirent.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/analysis/token_identity.h"
#include "core/base/gemm.h"
#include "core/io/safetensors.h"
#include "core/model/arch.h"
#include "core/model/mkmodel.h"
#include "core/model/model.h"
#include "tests/check.h"

static char tmpdir[64];

static void copy_file(const char *from, const char *to)
{
    FILE *a = fopen(from, "rb"), *b = fopen(to, "wb");
    char buf[65536];
    size_t n;
    while (a && b && (n = fread(buf, 1, sizeof buf, a)) > 0) fwrite(buf, 1, n, b);
    if (a) fclose(a);
    if (b) fclose(b);
}

static int is_weights_file(const char *name)
{
    return !strncmp(name, "model", 5) && strstr(name, ".safetensors");
}

/* dst = src with every tensor widened to F32 in one model.safetensors; the
 * other files (config, tokenizer) copied. Returns the number of tensors. */
static int widen_checkpoint(const char *src, const char *dst)
{
    mkdir(dst, 0700);
    DIR *d = opendir(src);
    if (!d) return 0;
    lens_safetensors shards[64];
    int n_shards = 0, n = 0;
    lens_st_out out[512];
    struct dirent *e;
    while ((e = readdir(d))) {
        char from[512], to[512];
        snprintf(from, sizeof from, "%s/%s", src, e->d_name);
        snprintf(to, sizeof to, "%s/%s", dst, e->d_name);
        if (e->d_name[0] == '.') continue;
        if (!is_weights_file(e->d_name)) copy_file(from, to);
        else if (!strstr(e->d_name, ".json") && n_shards < 64) {
            lens_err err = {0};
            if (lens_st_open(from, &shards[n_shards], &err)) continue;
            const lens_safetensors *st = &shards[n_shards++];
            for (int i = 0; i < st->n_tensors && n < 512; i++, n++) {
                const lens_st_tensor *t = &st->tensors[i];
                const size_t elems = t->nbytes / lens_dtype_size(t->dtype);
                float *wide = malloc(sizeof(float) * (elems ? elems : 1));
                lens_widen(wide, t->data, t->dtype, elems);
                out[n] = (lens_st_out){.name = t->name, .ndim = t->ndim, .data = wide};
                memcpy(out[n].shape, t->shape, sizeof t->shape);
            }
        }
    }
    closedir(d);
    char path[512];
    snprintf(path, sizeof path, "%s/model.safetensors", dst);
    lens_err err = {0};
    CHECK(lens_st_write(path, out, n, &err) == 0, "write widened %s: %s", path, err.msg);
    for (int i = 0; i < n; i++) free((float *)out[i].data);
    for (int s = 0; s < n_shards; s++) lens_st_close(&shards[s]);
    return n;
}

static void remove_dir(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    char p[512];
    while (d && (e = readdir(d)))
        if (e->d_name[0] != '.') snprintf(p, sizeof p, "%s/%s", dir, e->d_name), unlink(p);
    if (d) closedir(d);
    rmdir(dir);
}

static int same_floats(const float *a, const float *b, size_t n)
{
    return (a == NULL) == (b == NULL) && (!a || !memcmp(a, b, n * sizeof *a));
}

/* Every activation of a packed two-sequence batch, bitwise. */
static void compare_forward(const char *what, const lens_model *half, const lens_model *wide)
{
    const lens_config *c = &half->cfg;
    enum { T0 = 7, T1 = 40 };
    int ids[T0 + T1], lengths[2] = {T0, T1};
    for (int i = 0; i < T0 + T1; i++) ids[i] = (i * 7919 + 13) % c->vocab_size;
    const lens_batch batch = {.n_seqs = 2, .lengths = lengths, .ids = ids};
    const lens_forward_opts opts = {.keep = LENS_KEEP_HIDDEN | LENS_KEEP_ATTN | LENS_KEEP_VALUES | LENS_KEEP_LOGITS};
    lens_activations a = {0}, b = {0};
    lens_err err = {0};
    int ra = lens_forward(half, &batch, &opts, &a, &err), rb = lens_forward(wide, &batch, &opts, &b, &err);
    CHECK(ra == 0 && rb == 0, "%s: forward failed: %s", what, err.msg);
    if (ra || rb) return;
    const size_t N = T0 + T1, C = (size_t)c->d_model, L = (size_t)c->n_layers;
    const size_t attn = L * c->n_heads * a.attn_layer_size, values = L * N * c->n_heads * c->d_head_v;
    const size_t logits = c->task == LENS_TASK_CLASSIFICATION ? 2 * (size_t)c->n_labels
                        : c->task == LENS_TASK_ENCODER    ? 0
                                                          : N * c->vocab_size;
    CHECK(a.hidden && same_floats(a.hidden, b.hidden, (L + 1) * N * C), "%s: hidden states differ", what);
    CHECK(a.attn && same_floats(a.attn, b.attn, attn), "%s: attention differs", what);
    CHECK(a.values && same_floats(a.values, b.values, values), "%s: values differ", what);
    CHECK(!logits || (a.logits && same_floats(a.logits, b.logits, logits)), "%s: logits differ", what);
    lens_activations_free(&a), lens_activations_free(&b);
}

static void compare_token_identity(const char *what, const lens_model *half, const lens_model *wide)
{
    enum { T = 12, K = 5 };
    int ids[T];
    for (int i = 0; i < T; i++) ids[i] = (i * 104729 + 7) % half->cfg.vocab_size;
    const lens_ti_opts opts = {.top_k = K, .vocabulary = 1};
    lens_ti_result a = {0}, b = {0};
    lens_err err = {0};
    int ra = lens_token_identity(half, ids, NULL, NULL, T, &opts, &a, &err);
    int rb = lens_token_identity(wide, ids, NULL, NULL, T, &opts, &b, &err);
    CHECK(ra == 0 && rb == 0 && a.n_layers == b.n_layers && a.n_layers == half->cfg.n_layers + 1,
          "%s: token identity failed: %s", what, err.msg);
    int same = !ra && !rb;
    for (int l = 0; same && l < a.n_layers; l++)
        same = !memcmp(a.layers[l].rank, b.layers[l].rank, sizeof(int) * T) &&
               !memcmp(a.layers[l].vocab_rank, b.layers[l].vocab_rank, sizeof(int) * T) &&
               !memcmp(a.layers[l].vocab_neighbors, b.layers[l].vocab_neighbors, sizeof(int) * T * K);
    CHECK(same, "%s: token identity ranks differ", what);
    if (!ra) lens_ti_result_free(&a);
    if (!rb) lens_ti_result_free(&b);
}

typedef struct {
    const char *arch, *task;
    lens_dtype dtype;
    unsigned long long shard; /* max shard bytes, 0 = one file */
} dtype_case;

static void run_case(const dtype_case *k, int *n_run)
{
    char what[128], half_dir[256], wide_dir[256];
    snprintf(what, sizeof what, "%s/%s %s%s", k->arch, k->task ? k->task : "default", lens_dtype_name(k->dtype),
             k->shard ? " sharded" : "");
    snprintf(half_dir, sizeof half_dir, "%s/half-%d", tmpdir, *n_run);
    snprintf(wide_dir, sizeof wide_dir, "%s/wide-%d", tmpdir, *n_run);
    const lens_mkmodel_out how = {k->dtype, k->shard};
    lens_err err = {0};
    CHECK(lens_mkmodel_write(k->arch, "tiny", k->task, 7, NULL, half_dir, &how, &err) == 0, "%s: mkmodel: %s", what,
          err.msg);
    const int n_tensors = widen_checkpoint(half_dir, wide_dir);
    CHECK(n_tensors > 10, "%s: %d tensors widened", what, n_tensors);
    lens_model *half = lens_model_load(half_dir, &err);
    CHECK(half != NULL, "%s: load: %s", what, err.msg);
    lens_model *wide = half ? lens_model_load(wide_dir, &err) : NULL;
    CHECK(!half || wide != NULL, "%s: load widened: %s", what, err.msg);
    if (half && wide) {
        (*n_run)++;
        const lens_linear *q = &half->p.blocks[0].q;
        /* maps are packed at load (BF16/F16 ones in their 16 bits) unless the kernel is OpenBLAS,
         * which reads them as mapped */
        CHECK(half->p.emb_dtype == k->dtype && q->dtype == k->dtype && !q->packed == !lens_gemm_packs_weights() &&
                  !wide->p.blocks[0].q.packed == !lens_gemm_packs_weights(),
              "%s: resident dtype %s (embeddings %s), packed %p", what, lens_dtype_name(q->dtype),
              lens_dtype_name(half->p.emb_dtype), (const void *)q->packed);
        /* matrices are not copied: the half model holds about half the bytes */
        const size_t hb = lens_weights_bytes(half->weights), wb = lens_weights_bytes(wide->weights);
        CHECK(hb < wb * 0.55 && hb > wb * 0.45, "%s: weight bytes %zu vs %zu widened", what, hb, wb);
        compare_forward(what, half, wide);
        compare_token_identity(what, half, wide);
    }
    lens_model_free(half), lens_model_free(wide);
    remove_dir(half_dir), remove_dir(wide_dir);
}

static void test_resident_equals_widened(void)
{
    static const dtype_case cases[] = {
        {"gpt2", NULL, LENS_DT_BF16, 0},
        {"gpt2", NULL, LENS_DT_F16, 300000},
        {"bert", "classification", LENS_DT_BF16, 0},
        {"bert", "masked-lm", LENS_DT_BF16, 500000},
        {"bert", "masked-lm", LENS_DT_F16, 0},
        {"roberta", "classification", LENS_DT_BF16, 0},
        {"distilbert", "masked-lm", LENS_DT_BF16, 0},
        {"llama", NULL, LENS_DT_BF16, 400000},
        {"qwen3", NULL, LENS_DT_BF16, 0},
        {"gpt_neox", NULL, LENS_DT_BF16, 0},
        {"gemma2", NULL, LENS_DT_F16, 0},
    };
    const int n_cases = (int)(sizeof cases / sizeof *cases);
    int n_run = 0;
    for (int i = 0; i < n_cases; i++) run_case(&cases[i], &n_run);
    CHECK(n_cases == 11 && n_run == n_cases, "%d of %d dtype cases ran", n_run, n_cases);
}

/* config.json's "torch_dtype" as transformers writes it ("float32", "bfloat16", "float16"), for
 * every family and each dtype mkmodel writes; the loader takes it (HF's own key, informational:
 * the tensors' dtypes decide, so the widened copies of run_case, still saying "bfloat16", load). */
static void test_torch_dtype(void)
{
    static const struct {
        lens_dtype dt;
        const char *torch;
    } dtypes[] = {{LENS_DT_F32, "float32"}, {LENS_DT_BF16, "bfloat16"}, {LENS_DT_F16, "float16"}};
    int n = 0, n_families = 0;
    for (int i = 0; lens_families[i]; i++, n_families++)
        for (int d = 0; d < 3; d++) {
            const lens_family *f = lens_families[i];
            char dir[256], path[300];
            snprintf(dir, sizeof dir, "%s/torch-dtype-%s-%d", tmpdir, f->model_type, d);
            const lens_mkmodel_out how = {dtypes[d].dt, 0};
            lens_err err = {0};
            CHECK(lens_mkmodel_write(f->model_type, "micro", NULL, 5, NULL, dir, &how, &err) == 0, "%s %s: mkmodel: %s",
                  f->model_type, dtypes[d].torch, err.msg);
            snprintf(path, sizeof path, "%s/config.json", dir);
            json_t *cfg = json_load_file(path, 0, NULL);
            const char *got = json_string_value(json_object_get(cfg, "torch_dtype"));
            CHECK(got && !strcmp(got, dtypes[d].torch), "%s: config.json torch_dtype \"%s\", want \"%s\"",
                  f->model_type, got ? got : "(none)", dtypes[d].torch);
            json_decref(cfg);
            lens_model *m = lens_model_load(dir, &err);
            CHECK(m && m->p.emb_dtype == dtypes[d].dt, "%s %s: load: %s", f->model_type, dtypes[d].torch,
                  m ? "embeddings in another dtype" : err.msg);
            n += m != NULL;
            lens_model_free(m);
            remove_dir(dir);
        }
    CHECK(n_families >= 11 && n == 3 * n_families, "torch_dtype: %d of %d checkpoints (%d families)", n,
          3 * n_families, n_families);
    printf("torch_dtype: %d families x 3 dtypes written and loaded\n", n_families);
}

/* An F32 checkpoint written in shards: the index lists every tensor in the
 * shard that holds it, total_size is the data bytes, no shard exceeds the
 * limit unless it holds a single tensor, and the model equals the single
 * file one bitwise. */
static void test_sharded_mkmodel(void)
{
    char single[256], sharded[256], path[512];
    snprintf(single, sizeof single, "%s/single", tmpdir);
    snprintf(sharded, sizeof sharded, "%s/sharded", tmpdir);
    const unsigned long long limit = 400000;
    lens_err err = {0};
    const lens_mkmodel_out one = {LENS_DT_F32, 0}, many = {LENS_DT_F32, limit};
    CHECK(lens_mkmodel_write("gpt2", "tiny", NULL, 3, NULL, single, &one, &err) == 0, "mkmodel single: %s", err.msg);
    CHECK(lens_mkmodel_write("gpt2", "tiny", NULL, 3, NULL, sharded, &many, &err) == 0, "mkmodel sharded: %s",
          err.msg);
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", sharded);
    json_error_t jerr;
    json_t *idx = json_load_file(path, 0, &jerr);
    CHECK(idx != NULL, "index: %s", jerr.text);
    snprintf(path, sizeof path, "%s/model.safetensors", sharded);
    CHECK(access(path, F_OK) != 0, "sharded folder has no model.safetensors");
    json_t *wm = json_object_get(idx, "weight_map");
    const json_int_t total = json_integer_value(json_object_get(json_object_get(idx, "metadata"), "total_size"));
    uint64_t sum = 0;
    int n_names = 0, in_place = 0, n_files = 0, oversize = 0;
    const char *name;
    json_t *file;
    json_object_foreach(wm, name, file) {
        n_names++;
        snprintf(path, sizeof path, "%s/%s", sharded, json_string_value(file));
        lens_safetensors st;
        if (lens_st_open(path, &st, &err)) continue;
        const lens_st_tensor *t = lens_st_find(&st, name);
        in_place += t != NULL;
        sum += t ? t->nbytes : 0;
        lens_st_close(&st);
    }
    for (int s = 1; s < 100; s++) {
        snprintf(path, sizeof path, "%s/model-%05d-of-%05d.safetensors", sharded, s, 0);
        char pat[512];
        struct stat sb;
        int found = 0;
        for (int n = 1; n < 100 && !found; n++) {
            snprintf(pat, sizeof pat, "%s/model-%05d-of-%05d.safetensors", sharded, s, n);
            if (!stat(pat, &sb)) {
                found = 1, n_files++;
                lens_safetensors st;
                if (!lens_st_open(pat, &st, &err)) {
                    size_t data = 0;
                    for (int i = 0; i < st.n_tensors; i++) data += st.tensors[i].nbytes;
                    oversize += data > limit && st.n_tensors > 1;
                    lens_st_close(&st);
                }
            }
        }
        if (!found) break;
    }
    CHECK(n_names > 20 && in_place == n_names, "%d of %d index entries found in their shard", in_place, n_names);
    CHECK(total > 0 && (uint64_t)total == sum, "total_size %lld, tensors hold %llu bytes", (long long)total,
          (unsigned long long)sum);
    CHECK(n_files > 1 && oversize == 0, "%d shards, %d over the limit with more than one tensor", n_files, oversize);
    json_decref(idx);
    lens_model *a = lens_model_load(single, &err), *b = lens_model_load(sharded, &err);
    CHECK(a && b, "load single/sharded: %s", err.msg);
    if (a && b) {
        CHECK(lens_model_fingerprint(a) == lens_model_fingerprint(b), "sharded model differs from the single file");
        compare_forward("gpt2 F32 sharded vs single", b, a);
    }
    lens_model_free(a), lens_model_free(b);
    /* rewriting the folder unsharded removes the index: it loads the new file */
    CHECK(lens_mkmodel_write("gpt2", "tiny", NULL, 4, NULL, sharded, &one, &err) == 0, "rewrite: %s", err.msg);
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", sharded);
    CHECK(access(path, F_OK) != 0, "rewritten folder keeps no stale index");
    remove_dir(single), remove_dir(sharded);
}

static void test_parse_size(void)
{
    static const struct {
        const char *s;
        int ok;
        uint64_t bytes;
    } cases[] = {{"5GB", 1, 5000000000ull}, {"500MB", 1, 500000000ull}, {"2GiB", 1, 2ull << 30},
                 {"100kb", 1, 100000}, {"123", 1, 123},            {"1.5GB", 0, 0},
                 {"-1GB", 0, 0},       {"GB", 0, 0},               {"5XB", 0, 0},
                 {"99999999999999999999", 0, 0}};
    const int n = (int)(sizeof cases / sizeof *cases);
    int good = 0;
    for (int i = 0; i < n; i++) {
        uint64_t b = 0;
        const int rc = lens_parse_size(cases[i].s, &b);
        good += cases[i].ok ? rc == 0 && b == cases[i].bytes : rc != 0;
        CHECK(cases[i].ok ? rc == 0 && b == cases[i].bytes : rc != 0, "parse_size \"%s\": rc %d, %llu", cases[i].s,
              rc, (unsigned long long)b);
    }
    CHECK(n == 10 && good == n, "%d of %d sizes parsed as expected", good, n);
}

int main(void)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/lensd-dtype-XXXXXX");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 2;
    }
    test_parse_size();
    test_resident_equals_widened();
    test_sharded_mkmodel();
    test_torch_dtype();
    rmdir(tmpdir);
    return check_done("test_dtype");
}
