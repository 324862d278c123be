/* cost.h - the cost model: will a synchronous analysis finish within the
 * server's deadline? Decided before it runs, from a flop count per analysis
 * and a rate measured on this machine.
 *
 * The rate is a short calibration GEMM (about 60 ms: the best of 8 windows
 * of 5 ms after 20 ms of warm-up) with the threads a worker computes with,
 * measured once: at server start-up, or on first use (`lensd info`). Each analysis' flop count is divided by rate x its
 * efficiency (the fraction of the GEMM rate it was measured to reach; see
 * cost.c), and a request whose estimate passes the time left before its
 * deadline is answered 413 up front with a hint naming the alternative
 * (`"method": "estimate"`, a job, fewer steps); the same hint ends the 503
 * of a request that misses its deadline anyway. Jobs and the CLI have no
 * deadline and are never refused. */
#ifndef LENS_API_COST_H
#define LENS_API_COST_H

#include "api/api.h"

typedef struct {
    double gflops;         /* measured GEMM rate, GFLOP/s */
    int threads;           /* the threads it was measured with */
    double calibration_ms; /* how long the measurement took */
} api_cost_rate;

/* Measure the rate with `threads` compute threads (once; later calls return
 * the first measurement). */
const api_cost_rate *api_cost_calibrate(int threads);
/* Testing (--debug-gflops): take gflops as the measured rate; calibrate then measures nothing. */
void api_cost_set_rate(double gflops, int threads);

/* "cost_model": {gflops, threads, calibration_ms, efficiency: {...}},
 * calibrating on first use. */
void api_cost_write_info(jw *w);

/* Floating-point operations of one forward pass of T tokens through the
 * first n_layers layers. */
double api_cost_forward_flops(const lens_config *cfg, int T, int n_layers);

/* Analyses with a cost model (each has a measured efficiency in cost.c). */
typedef enum {
    API_COST_HIDDEN_ATTRIBUTION,
    API_COST_ATTRIBUTION,
    API_COST_IDENTIFIABILITY,
    API_COST_DECOMPOSITION,
    API_COST_TOKEN_IDENTITY,
    API_COST_CONTEXT_MIXING,
    API_COST_PATCHING,
    API_COST_N
} api_cost_kind;

/* The hint for kind (what to do instead), also set on c for its 503. */
void api_cost_hint(api_call *c, api_cost_kind kind);

/* For a synchronous server request: 413 "too_many_tokens" naming field when
 * flops of analysis kind would not finish in the time left before the
 * deadline at the measured rate; else 0. Sets the call's hint. Jobs and the
 * CLI always pass. */
int api_cost_check(api_call *c, api_cost_kind kind, double flops, const char *field);

#endif
