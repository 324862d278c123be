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
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/io/safetensors.h"

const char *const lens_mkmodel_presets[] = {"micro", "tiny", "small", "base", NULL};

typedef struct {
    int layers, hidden, heads, ff, positions;
    int vocab; /* 0: the arch's real size (BERT 30522, GPT-2 50257) */
} preset;

/* micro is for tests that run a model millions of times (the fuzzers of
 * tests/fuzz): 1000 tokens still hold every generated vocabulary entry
 * (GPT-2: 256 bytes + 702 merges + <|endoftext|>). */
static int find_preset(const char *name, int gpt2, preset *p)
{
    if (!strcmp(name, "micro")) *p = (preset){2, 16, 2, 64, 64, 1000};
    else if (!strcmp(name, "tiny")) *p = (preset){2, 128, 2, 512, gpt2 ? 256 : 512, 0};
    else if (!strcmp(name, "small")) *p = (preset){4, 256, 4, 1024, 512, 0};
    else if (!strcmp(name, "base")) *p = (preset){12, 768, 12, 3072, gpt2 ? 1024 : 512, 0};
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

/* The tensors being built: names and data owned here until written. */
typedef struct {
    lens_st_out *t;
    int n, cap;
    rng r;
    int failed;
} builder;

static void add(builder *b, const char *name, int64_t d0, int64_t d1, float fill, int random)
{
    if (b->failed) return;
    if (b->n == b->cap) {
        int cap = b->cap ? 2 * b->cap : 64;
        lens_st_out *t = realloc(b->t, sizeof *t * cap);
        if (!t) {
            b->failed = 1;
            return;
        }
        b->t = t, b->cap = cap;
    }
    size_t n = (size_t)d0 * (size_t)(d1 ? d1 : 1);
    float *data = malloc(n * sizeof(float));
    char *copy = strdup(name);
    if (!data || !copy) {
        free(data), free(copy);
        b->failed = 1;
        return;
    }
    for (size_t i = 0; i < n; i++) data[i] = random ? 0.02f * rng_normal(&b->r) : fill;
    b->t[b->n++] = (lens_st_out){.name = copy, .ndim = d1 ? 2 : 1, .shape = {d0, d1}, .data = data};
}

static void add_linear(builder *b, const char *name, int out, int in, int conv1d)
{
    char s[320];
    snprintf(s, sizeof s, "%s.weight", name);
    add(b, s, conv1d ? in : out, conv1d ? out : in, 0, 1);
    snprintf(s, sizeof s, "%s.bias", name);
    add(b, s, out, 0, 0, 0);
}

static void add_layernorm(builder *b, const char *name, int C)
{
    char s[320];
    snprintf(s, sizeof s, "%s.weight", name);
    add(b, s, C, 0, 1, 0);
    snprintf(s, sizeof s, "%s.bias", name);
    add(b, s, C, 0, 0, 0);
}

static void build_bert(builder *b, const preset *p, const char *task, int vocab)
{
    const int C = p->hidden;
    char n[256];
    add(b, "bert.embeddings.word_embeddings.weight", vocab, C, 0, 1);
    add(b, "bert.embeddings.position_embeddings.weight", p->positions, C, 0, 1);
    add(b, "bert.embeddings.token_type_embeddings.weight", 2, C, 0, 1);
    add_layernorm(b, "bert.embeddings.LayerNorm", C);
    for (int l = 0; l < p->layers; l++) {
#define AT(suffix) (snprintf(n, sizeof n, "bert.encoder.layer.%d.%s", l, suffix), n)
        add_linear(b, AT("attention.self.query"), C, C, 0);
        add_linear(b, AT("attention.self.key"), C, C, 0);
        add_linear(b, AT("attention.self.value"), C, C, 0);
        add_linear(b, AT("attention.output.dense"), C, C, 0);
        add_layernorm(b, AT("attention.output.LayerNorm"), C);
        add_linear(b, AT("intermediate.dense"), p->ff, C, 0);
        add_linear(b, AT("output.dense"), C, p->ff, 0);
        add_layernorm(b, AT("output.LayerNorm"), C);
#undef AT
    }
    if (!strcmp(task, "classification")) {
        add_linear(b, "bert.pooler.dense", C, C, 0);
        add_linear(b, "classifier", 2, C, 0);
    } else if (!strcmp(task, "masked-lm")) {
        add_linear(b, "cls.predictions.transform.dense", C, C, 0);
        add_layernorm(b, "cls.predictions.transform.LayerNorm", C);
        add(b, "cls.predictions.bias", vocab, 0, 0, 0);
    }
}

static void build_gpt2(builder *b, const preset *p, int vocab)
{
    const int C = p->hidden;
    char n[256];
    add(b, "transformer.wte.weight", vocab, C, 0, 1);
    add(b, "transformer.wpe.weight", p->positions, C, 0, 1);
    for (int l = 0; l < p->layers; l++) {
#define AT(suffix) (snprintf(n, sizeof n, "transformer.h.%d.%s", l, suffix), n)
        add_layernorm(b, AT("ln_1"), C);
        add_linear(b, AT("attn.c_attn"), 3 * C, C, 1);
        add_linear(b, AT("attn.c_proj"), C, C, 1);
        add_layernorm(b, AT("ln_2"), C);
        add_linear(b, AT("mlp.c_fc"), p->ff, C, 1);
        add_linear(b, AT("mlp.c_proj"), C, p->ff, 1);
#undef AT
    }
    add_layernorm(b, "transformer.ln_f", C);
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
    if (close_file(f, dir, "vocab.txt", err)) return -1;
    f = open_in(dir, "tokenizer_config.json", err);
    if (!f) return -1;
    fprintf(f, "{\"do_lower_case\": true, \"tokenizer_class\": \"BertTokenizer\"}\n");
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

static int write_gpt2_vocab(const char *dir, int vocab, lens_err *err)
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
    fprintf(v, ", \"<|endoftext|>\": %d}\n", n);
    int rc = close_file(mg, dir, "merges.txt", err);
    return close_file(v, dir, "vocab.json", err) || rc ? -1 : 0;
}

static int write_config(const char *dir, const char *arch, const char *task, const preset *p, int vocab,
                        lens_err *err)
{
    FILE *f = open_in(dir, "config.json", err);
    if (!f) return -1;
    if (!strcmp(arch, "gpt2")) {
        fprintf(f,
                "{\n  \"architectures\": [\"GPT2LMHeadModel\"],\n  \"model_type\": \"gpt2\",\n"
                "  \"activation_function\": \"gelu_new\",\n  \"n_embd\": %d,\n  \"n_layer\": %d,\n"
                "  \"n_head\": %d,\n  \"n_inner\": null,\n  \"n_positions\": %d,\n  \"n_ctx\": %d,\n"
                "  \"vocab_size\": %d,\n  \"layer_norm_epsilon\": 1e-05,\n  \"bos_token_id\": %d,\n"
                "  \"eos_token_id\": %d,\n  \"lensd_random_weights\": true\n}\n",
                p->hidden, p->layers, p->heads, p->positions, p->positions, vocab, vocab - 1, vocab - 1);
    } else {
        const char *archname = !strcmp(task, "classification") ? "BertForSequenceClassification"
                               : !strcmp(task, "masked-lm")    ? "BertForMaskedLM"
                                                               : "BertModel";
        fprintf(f,
                "{\n  \"architectures\": [\"%s\"],\n  \"model_type\": \"bert\",\n  \"hidden_act\": \"gelu\",\n"
                "  \"hidden_size\": %d,\n  \"num_hidden_layers\": %d,\n  \"num_attention_heads\": %d,\n"
                "  \"intermediate_size\": %d,\n  \"max_position_embeddings\": %d,\n  \"type_vocab_size\": 2,\n"
                "  \"vocab_size\": %d,\n  \"layer_norm_eps\": 1e-12,\n  \"pad_token_id\": 0,\n"
                "  \"position_embedding_type\": \"absolute\",\n%s  \"lensd_random_weights\": true\n}\n",
                archname, p->hidden, p->layers, p->heads, p->ff, p->positions, vocab,
                !strcmp(task, "classification")
                    ? "  \"id2label\": {\"0\": \"negative\", \"1\": \"positive\"},\n"
                      "  \"label2id\": {\"negative\": 0, \"positive\": 1},\n"
                    : "");
    }
    return close_file(f, dir, "config.json", err);
}

int lens_mkmodel(const char *arch, const char *preset_name, const char *task, unsigned long long seed,
                 const char *out_dir, lens_err *err)
{
    int gpt2 = !strcmp(arch, "gpt2");
    if (!gpt2 && strcmp(arch, "bert")) return lens_fail(err, LENS_EINVAL, "unknown arch \"%s\" (bert, gpt2)", arch);
    preset p;
    if (find_preset(preset_name, gpt2, &p))
        return lens_fail(err, LENS_EINVAL, "unknown preset \"%s\" (micro, tiny, small, base)", preset_name);
    if (!task) task = gpt2 ? "causal-lm" : "classification";
    if (gpt2 ? strcmp(task, "causal-lm") != 0
             : strcmp(task, "classification") && strcmp(task, "masked-lm") && strcmp(task, "encoder"))
        return lens_fail(err, LENS_EINVAL, "task \"%s\" is not available for %s", task, arch);
    if (mkdir(out_dir, 0755) && errno != EEXIST)
        return lens_fail(err, LENS_EIO, "%s: %s", out_dir, strerror(errno));
    const int vocab = p.vocab ? p.vocab : gpt2 ? 50257 : 30522;

    builder b = {.r = {seed}};
    if (gpt2) build_gpt2(&b, &p, vocab);
    else build_bert(&b, &p, task, vocab);
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors", out_dir);
    int rc = b.failed ? lens_fail(err, LENS_ENOMEM, "out of memory building %s %s", arch, preset_name)
                      : lens_st_write(path, b.t, b.n, err);
    for (int i = 0; i < b.n; i++) free((char *)b.t[i].name), free((float *)b.t[i].data);
    free(b.t);
    if (rc) return -1;
    if (write_config(out_dir, arch, task, &p, vocab, err)) return -1;
    return gpt2 ? write_gpt2_vocab(out_dir, vocab, err) : write_bert_vocab(out_dir, vocab, err);
}
