/* fuzz_config.c - config.json (core/model/config.c) and what the model loader
 * does with it.
 *
 * Input: a config.json. lens_config_load must refuse it with a message or
 * give sizes the loader can trust (positive, heads dividing what they must);
 * a config it accepts then goes through lens_model_load in a folder holding
 * a micro BERT's weights and vocabulary (lens_mkmodel, made once), so shapes
 * the config claims are checked against real tensors: the load succeeds or
 * fails with a message, never reads outside a tensor. */
#include "core/model/mkmodel.h"
#include "core/model/model.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static char model_dir[600];
    if (!model_dir[0]) {
        snprintf(model_dir, sizeof model_dir, "%s", fuzz_path("micro-bert"));
        lens_err err = {0};
        FUZZ_REQUIRE(lens_mkmodel("bert", "micro", "masked-lm", 1, model_dir, &err) == 0, "%s", err.msg);
    }
    char path[700];
    snprintf(path, sizeof path, "%s/config.json", model_dir);
    FILE *f = fopen(path, "wb");
    FUZZ_REQUIRE(f && fwrite(data, 1, size, f) == size && fclose(f) == 0, "cannot write %s", path);

    lens_config cfg;
    lens_err err = {0};
    if (lens_config_load(path, &cfg, &err)) {
        FUZZ_REQUIRE(err.msg[0], "refused without a message");
        return 0;
    }
    FUZZ_REQUIRE(cfg.n_layers > 0 && cfg.n_heads > 0 && cfg.d_model > 0 && cfg.d_ff > 0, "non-positive size");
    FUZZ_REQUIRE(cfg.d_head_k > 0 && cfg.d_head_v > 0 && cfg.vocab_size > 0 && cfg.max_positions > 0,
                 "non-positive head, vocabulary or position size");
    FUZZ_REQUIRE(memchr(cfg.architecture, 0, sizeof cfg.architecture) != NULL, "architecture not terminated");
    for (int i = 0; i < cfg.n_labels; i++) FUZZ_REQUIRE(cfg.labels && cfg.labels[i], "label %d missing", i);
    lens_config_free(&cfg);

    lens_model *m = lens_model_load(model_dir, &err);
    if (!m) {
        FUZZ_REQUIRE(err.msg[0], "model refused without a message");
        return 0;
    }
    lens_model_free(m);
    return 0;
}
