/* fuzz_st_index.c - sharded checkpoints: model.safetensors.index.json and
 * the weights table over its shards (lens_weights_open / _get in
 * core/io/safetensors.c).
 *
 * Input: the index JSON, NUL, the bytes of a shard file "fuzz.safetensors".
 * The folder also holds a fixed valid shard "a.safetensors" (F32 "x" [2,3]
 * and "y" [4]) that an index may name. When the folder opens, every tensor
 * of both shards is fetched as float32 with its own shape (F16/BF16 are
 * converted, misaligned F32 copied) and read in full, and once with a wrong
 * shape, which must fail with a message; and in its file dtype
 * (lens_weights_get_raw): served as the file's dtype when aligned for it,
 * else as a float32 copy, and widened it must equal the float32 fetch bit
 * for bit. */
#include "core/io/safetensors.h"
#include "tests/fuzz/fuzz.h"

static void fetch_all(lens_weights *w, const char *file)
{
    lens_safetensors st;
    lens_err err = {0};
    if (lens_st_open(fuzz_path(file), &st, &err)) return;
    for (int i = 0; i < st.n_tensors; i++) {
        const lens_st_tensor *t = &st.tensors[i];
        if (!lens_weights_has(w, t->name)) continue;
        const float *x = lens_weights_get(w, t->name, t->ndim, t->shape, &err);
        FUZZ_REQUIRE(x != NULL, "%s: %s", t->name, err.msg);
        size_t n = t->nbytes / (t->dtype == LENS_DT_F32 ? 4 : 2);
        float sum = 0;
        for (size_t k = 0; k < n; k++) sum += x[k];
        fuzz_consume(sum);
        lens_dtype dt = LENS_DT_F32;
        const void *raw = lens_weights_get_raw(w, t->name, t->ndim, t->shape, &dt, &err);
        FUZZ_REQUIRE(raw != NULL && (dt == t->dtype || dt == LENS_DT_F32), "%s: raw %s", t->name, err.msg);
        for (size_t k = 0; k < n; k++) {
            float v;
            lens_widen(&v, lens_dtype_at(raw, dt, k), dt, 1);
            FUZZ_REQUIRE(!memcmp(&v, &x[k], sizeof v), "%s[%zu]: raw widened differs from the float32 fetch",
                         t->name, k);
        }
        int64_t wrong[LENS_ST_MAX_DIMS + 1] = {0};
        memcpy(wrong, t->shape, sizeof t->shape);
        wrong[t->ndim] = 7;
        err.msg[0] = 0;
        FUZZ_REQUIRE(!lens_weights_get(w, t->name, t->ndim + 1, wrong, &err) && err.msg[0],
                     "%s: wrong shape accepted", t->name);
    }
    lens_st_close(&st);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int ready;
    if (!ready) {
        const float x[6] = {1, 2, 3, 4, 5, 6}, y[4] = {-1, 0, 1, 2};
        lens_st_out t[2] = {{"x", 2, {2, 3}, x, LENS_DT_F32}, {"y", 1, {4}, y, LENS_DT_F32}};
        lens_err err = {0};
        FUZZ_REQUIRE(lens_st_write(fuzz_path("a.safetensors"), t, 2, &err) == 0, "%s", err.msg);
        ready = 1;
    }
    const uint8_t *index, *shard;
    size_t index_len, shard_len;
    fuzz_part(data, size, 0, &index, &index_len);
    fuzz_part(data, size, 1, &shard, &shard_len);
    fuzz_write("model.safetensors.index.json", index, index_len);
    fuzz_write("fuzz.safetensors", shard, shard_len);
    lens_err err = {0};
    lens_weights *w = lens_weights_open(fuzz_dir(), &err);
    if (!w) {
        FUZZ_REQUIRE(err.msg[0], "refused without a message");
        return 0;
    }
    fetch_all(w, "a.safetensors");
    fetch_all(w, "fuzz.safetensors");
    lens_weights_close(w);
    return 0;
}
