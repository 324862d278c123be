/* blas.c - OpenBLAS core selection and threading (see blas.h). */
#include "core/base/blas.h"

#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Not in Debian's cblas.h for every flavour; exported by libopenblas. */
extern char *openblas_get_corename(void);
extern char *openblas_get_config(void);
extern void openblas_set_num_threads(int n);
extern int openblas_get_num_threads(void);

#define CORRECTED_MARK "LENSD_BLAS_CORRECTED"

/* The best OpenBLAS core this CPU can run, or NULL to trust detection. */
static const char *best_core(void)
{
#if !defined(__x86_64__)
    return NULL; /* the misdetection is an x86 one; ARM64 and others keep OpenBLAS's choice */
#else
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
        return "SkylakeX";
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return "Haswell";
    return NULL;
#endif
}

/* Generic cores OpenBLAS falls back to when it does not recognise a CPU. */
static int is_fallback_core(const char *core)
{
    static const char *const fallback[] = {"Prescott", "Core2", "Nehalem", "Sandybridge", "Katmai", "Northwood"};
    for (size_t i = 0; i < sizeof fallback / sizeof *fallback; i++)
        if (strcasecmp(core, fallback[i]) == 0) return 1;
    return 0;
}

void lens_blas_setup(char **argv)
{
    if (getenv("OPENBLAS_CORETYPE")) return; /* the user's or ours after re-exec */
    const char *best = best_core();
    const char *core = openblas_get_corename();
    if (!best || !core || !is_fallback_core(core)) return;
    setenv("OPENBLAS_CORETYPE", best, 1);
    setenv(CORRECTED_MARK, core, 1);
    execv("/proc/self/exe", argv);
    /* execv failed: keep running with the slow kernels rather than not at all */
    fprintf(stderr, "lensd: warning: OpenBLAS chose core %s; could not re-exec with OPENBLAS_CORETYPE=%s\n",
            core, best);
}

const char *lens_blas_core(void) { return openblas_get_corename(); }

const char *lens_blas_core_source(void)
{
    if (getenv(CORRECTED_MARK)) return "corrected";
    return getenv("OPENBLAS_CORETYPE") ? "env" : "auto";
}

const char *lens_blas_config(void) { return openblas_get_config(); }

void lens_blas_set_threads(int n) { openblas_set_num_threads(n > 0 ? n : 1); }

int lens_blas_threads(void) { return openblas_get_num_threads(); }
