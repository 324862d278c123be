/* fuzz_partial.c - the shard partial reader (core/io/partial.c).
 *
 * Input: a whole partial file (LENSPART, u64 header length, JSON header,
 * tensor data). lens_partial_parse must refuse it with a message or return
 * tensors whose lengths are non-negative and whose bytes can all be read
 * (they are copies: ASan sees any byte past them), each found again by name. */
#include "core/io/partial.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    lens_partial p;
    lens_err err = {0};
    if (lens_partial_parse(data, size, &p, &err)) {
        FUZZ_REQUIRE(err.msg[0], "refused without a message");
        return 0;
    }
    FUZZ_REQUIRE(json_is_object(p.header) && !json_object_get(p.header, "tensors"), "header kept its tensor list");
    unsigned sum = 0;
    for (int i = 0; i < p.n_tensors; i++) {
        const lens_pt_tensor *t = &p.tensors[i];
        FUZZ_REQUIRE(t->length >= 0, "%s: length %lld", t->name, (long long)t->length);
        const unsigned char *b = t->data;
        for (int64_t k = 0; k < t->length * (int64_t)lens_partial_dtype_size(t->dtype); k++) sum += b[k];
        FUZZ_REQUIRE(lens_partial_find(&p, t->name) == t, "%s: not found by name", t->name);
        FUZZ_REQUIRE(lens_partial_get(&p, t->name, t->dtype, t->length, &err) == t->data, "%s: get", t->name);
    }
    fuzz_consume(sum);
    lens_partial_free(&p);
    return 0;
}
