/* train_cli.c - `lensd train classify|mlm|causal|vocab`: options into lens_train_opts
 * (core/train/train.h); usage in lensd_train_usage. Progress goes to stderr. */
#include "cli/train_cli.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/base/blas.h"
#include "core/model/arch.h"
#include "core/train/train.h"
#include "core/train/train_bpe.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: lensd train classify --train TSV [--dev TSV] --out DIR (--vocab DIR [--arch bert] | --init DIR)\n"
            "         (--init: a checkpoint of any family with that head; --arch: a new model of the family)\n"
            "         [--layers 2] [--hidden 128] [--heads 2] [--ff 512] [--max-len 64]\n"
            "         [--head-dim-key DK] [--head-dim-value DV] [--head-combination concat|sum|sum_adjacent]\n"
            "         [--attention-scale DK|DV]\n"
            "         [--label-names a,b]\n"
            "         [--epochs 1] [--batch 32] [--lr 1e-3] [--warmup 0.06] [--weight-decay 0.01]\n"
            "         [--clip 1.0] [--seed 1] [--max-steps N] [--max-train N] [--save-every N]\n"
            "         [--resume] [--threads N]\n"
            "       lensd train mlm   (the classify options but labels; --dev gives the masked-LM loss)\n"
            "       lensd train causal --train TXT [--dev TXT] --out DIR (--vocab DIR [--arch gpt2] | --init DIR)\n"
            "         (any causal LM on plain text cut into windows of --max-len [128] tokens; --batch [16]\n"
            "         windows; --layers --hidden --heads --ff and the schedule options as classify; --dev gives\n"
            "         loss and perplexity)\n"
            "       families (--arch): %s\n"
            "       lensd train vocab --out DIR [--size 8000] [--min-count 2] FILE..\n"
            "       lensd train vocab --bpe --out DIR [--size 8000] [--min-count 2] FILE..  (GPT-2 byte-level BPE)\n",
            lens_family_names());
}

enum { TRAIN_CLASSIFY, TRAIN_MLM, TRAIN_CAUSAL };

/* classify, mlm and causal share the options (unused ones are ignored). */
static int cmd_classify(int argc, char **argv, int mode)
{
    const int masked_lm = mode == TRAIN_MLM;
    const char *name = mode == TRAIN_CAUSAL ? "causal" : masked_lm ? "mlm" : "classify";
    lens_train_opts o;
    lens_train_opts_default(&o);
    o.masked_lm = masked_lm;
    if (mode == TRAIN_CAUSAL) o.max_len = 128, o.batch_size = 16;
    for (int a = 0; a < argc; a++) {
        const char *k = argv[a];
        if (!strcmp(k, "--resume")) {
            o.resume = 1;
            continue;
        }
        const char *v = a + 1 < argc ? argv[++a] : NULL;
        if (!v) {
            fprintf(stderr, "lensd train %s: %s needs a value\n", name, k);
            return 2;
        }
        if (!strcmp(k, "--train")) o.train_path = v;
        else if (!strcmp(k, "--dev")) o.dev_path = v;
        else if (!strcmp(k, "--out")) o.out_dir = v;
        else if (!strcmp(k, "--vocab")) o.vocab_dir = v;
        else if (!strcmp(k, "--init")) o.init_dir = v;
        else if (!strcmp(k, "--arch")) o.arch = v;
        else if (!strcmp(k, "--label-names")) o.label_names = v;
        else if (!strcmp(k, "--layers")) o.layers = atoi(v);
        else if (!strcmp(k, "--hidden")) o.hidden = atoi(v);
        else if (!strcmp(k, "--heads")) o.heads = atoi(v);
        else if (!strcmp(k, "--ff")) o.ff = atoi(v);
        else if (!strcmp(k, "--max-len")) o.max_len = atoi(v);
        else if (!strcmp(k, "--head-dim-key")) o.d_head_k = atoi(v);
        else if (!strcmp(k, "--head-dim-value")) o.d_head_v = atoi(v);
        else if (!strcmp(k, "--attention-scale")) {
            if (strcmp(v, "DK") && strcmp(v, "DV")) {
                fprintf(stderr, "lensd train: --attention-scale is DK (the paper) or DV (declare-lab's code), not %s\n", v);
                return 2;
            }
            o.scale_by_dv = !strcmp(v, "DV");
        }
        else if (!strcmp(k, "--head-combination")) {
            if (lens_head_combination_parse(v, &o.head_combination)) {
                fprintf(stderr, "lensd train: --head-combination is concat, sum or sum_adjacent, not %s\n", v);
                return 2;
            }
        }
        else if (!strcmp(k, "--epochs")) o.epochs = atoi(v);
        else if (!strcmp(k, "--batch")) o.batch_size = atoi(v);
        else if (!strcmp(k, "--lr")) o.lr = strtof(v, NULL);
        else if (!strcmp(k, "--warmup")) o.warmup = strtof(v, NULL);
        else if (!strcmp(k, "--weight-decay")) o.weight_decay = strtof(v, NULL);
        else if (!strcmp(k, "--clip")) o.clip = strtof(v, NULL);
        else if (!strcmp(k, "--seed")) o.seed = strtoull(v, NULL, 10);
        else if (!strcmp(k, "--max-steps")) o.max_steps = atol(v);
        else if (!strcmp(k, "--max-train")) o.max_train = atoi(v);
        else if (!strcmp(k, "--save-every")) o.save_every = atoi(v);
        else if (!strcmp(k, "--threads")) o.threads = atoi(v);
        else {
            fprintf(stderr, "lensd train %s: unknown option %s\n", name, k);
            usage(stderr);
            return 2;
        }
    }
    if (o.layers < 1 || o.hidden < 1 || o.heads < 1 || o.ff < 1 || o.max_len < 2 || o.epochs < 1 ||
        o.batch_size < 1 || o.threads < 1) {
        fprintf(stderr, "lensd train %s: sizes, epochs, batch and threads must be positive\n", name);
        return 2;
    }
    if (!o.init_dir && !o.arch) o.arch = mode == TRAIN_CAUSAL ? "gpt2" : "bert"; /* a new model's default family */
    lens_blas_set_threads(o.threads);
    lens_train_result r;
    lens_err err = {0};
    if (mode == TRAIN_CAUSAL) {
        if (lens_train_causal(&o, &r, &err)) {
            fprintf(stderr, "lensd train causal: %s\n", err.msg);
            return 1;
        }
        char dev[96] = "\"dev_loss\": null, \"dev_perplexity\": null";
        if (r.dev_loss >= 0)
            snprintf(dev, sizeof dev, "\"dev_loss\": %.4f, \"dev_perplexity\": %.2f", r.dev_loss, exp(r.dev_loss));
        printf("{\"steps\": %ld, \"train_loss\": %.4f, %s, \"tokens_per_s\": %.0f, \"out\": \"%s\"}\n", r.steps,
               r.train_loss, dev, r.tokens_per_s, o.out_dir);
        return 0;
    }
    if (lens_train_classify(&o, &r, &err)) {
        fprintf(stderr, "lensd train %s: %s\n", name, err.msg);
        return 1;
    }
    printf("{\"steps\": %ld, \"train_loss\": %.4f, \"%s\": %.4f, \"tokens_per_s\": %.0f, \"out\": \"%s\"}\n",
           r.steps, r.train_loss, masked_lm ? "dev_mlm_loss" : "dev_accuracy", r.dev_accuracy, r.tokens_per_s, o.out_dir);
    return 0;
}

static int cmd_vocab(int argc, char **argv)
{
    const char *out = NULL;
    int size = 8000, min_count = 2, n_files = 0, bpe = 0;
    const char **files = calloc((size_t)argc + 1, sizeof *files);
    if (!files) return 1;
    for (int a = 0; a < argc; a++) {
        const char *k = argv[a];
        if (!strcmp(k, "--bpe")) {
            bpe = 1;
        } else if (!strncmp(k, "--", 2)) {
            const char *v = a + 1 < argc ? argv[++a] : NULL;
            if (!v) {
                fprintf(stderr, "lensd train vocab: %s needs a value\n", k);
                free(files);
                return 2;
            }
            if (!strcmp(k, "--out")) out = v;
            else if (!strcmp(k, "--size")) size = atoi(v);
            else if (!strcmp(k, "--min-count")) min_count = atoi(v);
            else {
                fprintf(stderr, "lensd train vocab: unknown option %s\n", k);
                free(files);
                return 2;
            }
        } else {
            files[n_files++] = k;
        }
    }
    if (!out || !n_files || size < 200) {
        usage(stderr);
        free(files);
        return 2;
    }
    lens_err err = {0};
    int rc = bpe ? lens_train_bpe(files, n_files, size, min_count, out, &err)
                 : lens_train_vocab(files, n_files, size, min_count, out, &err);
    if (rc) fprintf(stderr, "lensd train vocab: %s\n", err.msg);
    free(files);
    return rc ? 1 : 0;
}

int lensd_cmd_train(int argc, char **argv)
{
    if (argc >= 1 && !strcmp(argv[0], "classify")) return cmd_classify(argc - 1, argv + 1, TRAIN_CLASSIFY);
    if (argc >= 1 && !strcmp(argv[0], "mlm")) return cmd_classify(argc - 1, argv + 1, TRAIN_MLM);
    if (argc >= 1 && !strcmp(argv[0], "causal")) return cmd_classify(argc - 1, argv + 1, TRAIN_CAUSAL);
    if (argc >= 1 && !strcmp(argv[0], "vocab")) return cmd_vocab(argc - 1, argv + 1);
    usage(argc >= 1 && !strcmp(argv[0], "--help") ? stdout : stderr);
    return 2;
}
