/* check.h - the test harness every tests/test_*.c uses.
 *
 * CHECK counts a pass or prints where and what failed; check_close compares
 * float arrays with a stated tolerance and, when they differ, prints the first
 * values and the largest difference. check_done prints the closing line
 * "name: N passed, N failed, N skipped" that scripts/run-tests.sh sums.
 * Skips are counted apart and never as passes. */
#ifndef LENS_CHECK_H
#define LENS_CHECK_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static int check_passed, check_failed, check_skipped;

#define CHECK(cond, ...)                                                   \
    do {                                                                   \
        if (cond) {                                                        \
            check_passed++;                                                \
        } else {                                                           \
            check_failed++;                                                \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);           \
            fprintf(stderr, __VA_ARGS__);                                  \
            fputc('\n', stderr);                                           \
        }                                                                  \
    } while (0)

#define SKIP(...)                                                          \
    do {                                                                   \
        check_skipped++;                                                   \
        printf("SKIP: ");                                                  \
        printf(__VA_ARGS__);                                               \
        putchar('\n');                                                     \
    } while (0)

/* |got - want| <= atol + rtol * |want| elementwise. Returns the max abs diff. */
static inline double check_close(const char *what, const float *got, const float *want,
                                 size_t n, double atol, double rtol)
{
    double max_diff = 0;
    size_t worst = 0, bad = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - (double)want[i]);
        if (!(d <= atol + rtol * fabs((double)want[i]))) bad++;
        if (!(d <= max_diff)) { max_diff = d; worst = i; }
    }
    if (bad) {
        check_failed++;
        fprintf(stderr, "FAIL %s: %zu of %zu values differ (atol %g, rtol %g); max |diff| %g at %zu (got %g, want %g)\n",
                what, bad, n, atol, rtol, max_diff, worst, (double)got[worst], (double)want[worst]);
        fprintf(stderr, "  first got: ");
        for (size_t i = 0; i < n && i < 5; i++) fprintf(stderr, "%g ", (double)got[i]);
        fprintf(stderr, "\n  first want:");
        for (size_t i = 0; i < n && i < 5; i++) fprintf(stderr, " %g", (double)want[i]);
        fputc('\n', stderr);
    } else {
        check_passed++;
    }
    return max_diff;
}

/* ../shared next to the repository, or $LENS_SHARED; NULL when absent. */
static inline const char *check_shared_dir(void)
{
    const char *env = getenv("LENS_SHARED");
    if (env && access(env, R_OK) == 0) return env;
    return access("../shared/models", R_OK) == 0 ? "../shared" : NULL;
}

static inline int check_done(const char *name)
{
    printf("%s: %d passed, %d failed, %d skipped\n", name, check_passed, check_failed, check_skipped);
    return check_failed ? 1 : 0;
}

#endif
