/* heap.h - the process's malloc policy: activations freed after one
 * forward are reused by the next instead of faulted in again (heap.c). */
#ifndef LENS_HEAP_H
#define LENS_HEAP_H

/* Call once at the top of main, before threads start. Leaves glibc's
 * defaults when the environment sets MALLOC_MMAP_THRESHOLD_,
 * MALLOC_TRIM_THRESHOLD_ or any glibc.malloc tunable. */
void lens_heap_setup(void);

#endif
