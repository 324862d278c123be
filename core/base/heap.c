/* heap.c - keep freed activations in the heap between forwards (heap.h).
 *
 * glibc gives freed memory back to the kernel at once when the chunk was
 * mmapped (above the mmap threshold: 128 KiB until a larger mmapped chunk
 * has been freed) or lies at the top of a heap past the trim threshold, so
 * each forward faulted its activations in again and the kernel zeroed
 * them: 947 page faults per BERT-base forward at T = 128, which then took
 * 10% longer at one thread and 16% at two (docs/operations.md, AMD EPYC
 * Zen 5). With chunks up to 32 MiB (the largest mmap threshold glibc
 * accepts on 64-bit) taken from the heap and freed memory kept there, a
 * repeated forward faults no page. The server gives the memory back once
 * its workers are idle (server/pool.c, malloc_trim), so RSS after a burst
 * is what it was. */
#include "core/base/heap.h"

#include <malloc.h>
#include <stdlib.h>
#include <string.h>

void lens_heap_setup(void)
{
    const char *tunables = getenv("GLIBC_TUNABLES");
    if (getenv("MALLOC_MMAP_THRESHOLD_") || getenv("MALLOC_TRIM_THRESHOLD_") ||
        (tunables && strstr(tunables, "glibc.malloc.")))
        return;
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
}
