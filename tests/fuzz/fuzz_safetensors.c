/* fuzz_safetensors.c - the safetensors header parser (core/io/safetensors.c).
 *
 * Input: a whole .safetensors file (u64 header length, JSON header, data).
 * lens_st_open must either refuse it with an error or return tensors whose
 * every byte lies inside the mapping, with nbytes = product(shape) x dtype
 * size; each tensor is read in full so ASan sees any byte outside, and
 * looked up again by name. */
#include "core/io/safetensors.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_write("model.safetensors", data, size);
    lens_safetensors st;
    lens_err err = {0};
    if (lens_st_open(fuzz_path("model.safetensors"), &st, &err)) {
        FUZZ_REQUIRE(err.msg[0], "refused without a message");
        return 0;
    }
    const unsigned char *lo = st.map, *hi = lo + st.map_len;
    unsigned sum = 0;
    for (int i = 0; i < st.n_tensors; i++) {
        const lens_st_tensor *t = &st.tensors[i];
        size_t elem = t->dtype == LENS_DT_F32 ? 4 : 2, n = elem;
        FUZZ_REQUIRE(t->ndim >= 0 && t->ndim <= LENS_ST_MAX_DIMS, "%s: ndim %d", t->name, t->ndim);
        for (int d = 0; d < t->ndim; d++) {
            FUZZ_REQUIRE(t->shape[d] >= 0, "%s: negative dim", t->name);
            n *= (size_t)t->shape[d];
        }
        FUZZ_REQUIRE(n == t->nbytes, "%s: %zu bytes for a shape of %zu", t->name, t->nbytes, n);
        const unsigned char *p = t->data;
        FUZZ_REQUIRE(t->nbytes == 0 || (p >= lo && p + t->nbytes <= hi), "%s: data outside the file", t->name);
        for (size_t b = 0; b < t->nbytes; b++) sum += p[b];
        FUZZ_REQUIRE(lens_st_find(&st, t->name) == t, "%s: not found by name", t->name);
    }
    fuzz_consume(sum);
    lens_st_close(&st);
    return 0;
}
