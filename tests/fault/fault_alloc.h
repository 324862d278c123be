/* fault_alloc.h - allocation-failure injection for tests, SQLite style.
 *
 * A test binary linked with -Wl,--wrap=malloc,... (the Makefile's
 * FAULT_WRAP) routes every malloc, calloc, realloc, strdup, strndup,
 * aligned_alloc and free of lensd's own code (libcore, libapp) through the
 * __wrap_ functions below; jansson's too once api_json_init() ran. fault_arm(n) makes the n-th counted allocation from then on
 * return NULL (once: later ones succeed again, as after a transient
 * shortage); fault_fired() says whether it happened. Allocations made inside
 * libc (getline, realpath, stdio) and OpenBLAS are not seen.
 *
 * Every pointer handed out is kept in a set, so fault_live() counts blocks
 * that lensd allocated and has not freed: a leak on an error path shows as
 * a live count above the one before the operation (no ASan needed; under
 * make test-asan, LeakSanitizer checks the same at exit). */
#ifndef LENS_FAULT_ALLOC_H
#define LENS_FAULT_ALLOC_H

#include <execinfo.h>
#include <jansson.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

void *__real_malloc(size_t n);
void *__real_calloc(size_t k, size_t n);
void *__real_realloc(void *p, size_t n);
void *__real_aligned_alloc(size_t align, size_t n);
void __real_free(void *p);

static pthread_mutex_t fault_lock = PTHREAD_MUTEX_INITIALIZER;
static long fault_countdown; /* > 0: allocations until the one that fails */
static int fault_did_fire;
static long fault_n_allocs;  /* counted allocations since fault_arm */
static void *fault_where[16]; /* the call stack of the failed allocation */
static int fault_where_n;

/* Open-addressing set of live pointers (lock held). */
#define FAULT_SET_CAP (1u << 21)
static uintptr_t *fault_set;
static long fault_n_live;

static size_t fault_slot(uintptr_t p)
{
    return (size_t)((p >> 4) * 0x9E3779B97F4A7C15ull >> 43) & (FAULT_SET_CAP - 1);
}

static void fault_set_add(void *ptr)
{
    if (!ptr || !fault_set) return;
    size_t i = fault_slot((uintptr_t)ptr);
    while (fault_set[i] > 1) i = (i + 1) & (FAULT_SET_CAP - 1);
    fault_set[i] = (uintptr_t)ptr;
    fault_n_live++;
}

/* 1 marks a removed slot so that probing continues past it. */
static int fault_set_remove(void *ptr)
{
    if (!ptr || !fault_set) return 0;
    for (size_t i = fault_slot((uintptr_t)ptr); fault_set[i]; i = (i + 1) & (FAULT_SET_CAP - 1)) {
        if (fault_set[i] == (uintptr_t)ptr) {
            fault_set[i] = 1;
            fault_n_live--;
            return 1;
        }
    }
    return 0;
}

/* Counts one allocation; 1 when this one must fail. Lock held. */
static int fault_should_fail(void)
{
    fault_n_allocs++;
    if (fault_countdown > 0 && --fault_countdown == 0) {
        fault_did_fire = 1;
        fault_where_n = backtrace(fault_where, 16);
        return 1;
    }
    return 0;
}

#define FAULT_ALLOC(expr)                          \
    do {                                           \
        pthread_mutex_lock(&fault_lock);           \
        void *p_ = fault_should_fail() ? NULL : (expr); \
        fault_set_add(p_);                         \
        pthread_mutex_unlock(&fault_lock);         \
        return p_;                                 \
    } while (0)

void *__wrap_malloc(size_t n) { FAULT_ALLOC(__real_malloc(n)); }
void *__wrap_calloc(size_t k, size_t n) { FAULT_ALLOC(__real_calloc(k, n)); }
void *__wrap_aligned_alloc(size_t align, size_t n) { FAULT_ALLOC(__real_aligned_alloc(align, n)); }

void __wrap_free(void *p)
{
    if (!p) return;
    pthread_mutex_lock(&fault_lock);
    fault_set_remove(p);
    pthread_mutex_unlock(&fault_lock);
    __real_free(p);
}

void *__wrap_realloc(void *p, size_t n)
{
    pthread_mutex_lock(&fault_lock);
    void *q = NULL;
    if (!fault_should_fail()) {
        int known = fault_set_remove(p);
        q = __real_realloc(p, n);
        if (q) fault_set_add(q);
        else if (known) fault_set_add(p); /* p is still valid and still ours */
    }
    pthread_mutex_unlock(&fault_lock);
    return q;
}

char *__wrap_strndup(const char *s, size_t n)
{
    size_t len = strnlen(s, n);
    char *d = __wrap_malloc(len + 1);
    if (!d) return NULL;
    memcpy(d, s, len);
    d[len] = 0;
    return d;
}

char *__wrap_strdup(const char *s) { return __wrap_strndup(s, SIZE_MAX); }

/* jansson's allocations are lensd's once api_json_init() routed them
 * through api/request.c's malloc calls, which the wrapping catches. */
static inline void fault_init(void)
{
    fault_set = __real_calloc(FAULT_SET_CAP, sizeof *fault_set);
}

static inline void fault_arm(long n)
{
    pthread_mutex_lock(&fault_lock);
    fault_countdown = n, fault_did_fire = 0, fault_n_allocs = 0;
    pthread_mutex_unlock(&fault_lock);
}

/* Disarms; returns whether the armed failure happened. */
static inline int fault_fired(void)
{
    pthread_mutex_lock(&fault_lock);
    int fired = fault_did_fire;
    fault_countdown = 0;
    pthread_mutex_unlock(&fault_lock);
    return fired;
}

/* Where the last injected failure happened (symbols need -rdynamic; addr2line -e BINARY reads the addresses). */
static inline void fault_print_where(void)
{
    backtrace_symbols_fd(fault_where, fault_where_n, 1);
}

static inline long fault_live(void)
{
    pthread_mutex_lock(&fault_lock);
    long n = fault_n_live;
    pthread_mutex_unlock(&fault_lock);
    return n;
}

static inline long fault_allocs(void)
{
    pthread_mutex_lock(&fault_lock);
    long n = fault_n_allocs;
    pthread_mutex_unlock(&fault_lock);
    return n;
}

#endif
