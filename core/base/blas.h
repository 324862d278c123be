/* blas.h - choosing OpenBLAS's kernels and threads before any BLAS call.
 *
 * Debian 12's OpenBLAS 0.3.21 misdetects some AVX-512 CPUs as "Prescott" and
 * then runs ~5x slower. The core type is read from OPENBLAS_CORETYPE only
 * while the library initialises (a constructor that runs before main), so
 * lens_blas_setup, called first thing in main, checks the core OpenBLAS chose
 * against what the CPU supports and, when it is wrong and the variable is
 * unset, sets it and re-executes the program. */
#ifndef LENS_BLAS_H
#define LENS_BLAS_H

/* Call at the top of main with main's argv. Returns only when the kernels are
 * right (or cannot be improved); may execv() the same program once. */
void lens_blas_setup(char **argv);

/* Name of the active OpenBLAS core ("SkylakeX", "Haswell", ...). */
const char *lens_blas_core(void);
/* What lens_blas_setup did: "auto" (detection was right), "env" (the user's
 * OPENBLAS_CORETYPE) or "corrected" (lensd set it). */
const char *lens_blas_core_source(void);
const char *lens_blas_config(void); /* OpenBLAS build string */

void lens_blas_set_threads(int n);
int lens_blas_threads(void);

#endif
