/* jobs.h - async jobs: a bounded set of job threads, the job store, expiry.
 *
 * A job is a validated request of some kind (api/jobs.c) that runs on one of
 * --max-jobs dedicated threads, not on the request worker pool, and without
 * the request deadline. States: queued -> running -> done | failed |
 * cancelled (a queued job cancelled by DELETE never runs). At most
 * --max-stored-jobs jobs are kept, and each API key holds at most an equal
 * share of them (--max-stored-jobs / keys, at least 1): a key's new job past
 * its share drops that key's own finished job that finished first (never
 * another key's), and is 429 only when every job of the key is queued or
 * running. Finished jobs are dropped --job-ttl seconds after they finish, or
 * by DELETE. Every call sees only the jobs of its caller's API key
 * (api_call.principal). */
#ifndef LENSD_JOBS_H
#define LENSD_JOBS_H

#include "api/api.h"

typedef struct jobs jobs;

/* debug_delay_ms: testing hook (--debug-delay-ms), a running job first waits that long
 * (cancellable), so tests can observe the running state and cancel it. */
/* Each job thread computes with a lens_pool of threads_per_job threads.
 * n_keys: the API keys (principals) that share the store; 1 without keys. */
jobs *jobs_create(int max_running, int max_stored, int n_keys, double ttl_seconds, int threads_per_job,
                  int debug_delay_ms);
/* Cancels queued and running jobs, waits for the running ones to return,
 * joins the threads and frees everything. */
void jobs_destroy(jobs *j);

/* The api_ctx hooks (see api/api.h). */
void jobs_submit(jobs *j, api_call *c, const api_job_kind *kind);
void jobs_get(jobs *j, api_call *c, const char *id);
/* DELETE /v1/jobs/{id}: a queued or running job is cancelled, a finished
 * one removed; answers with the job as it was. */
void jobs_cancel(jobs *j, api_call *c, const char *id);
/* GET /v1/jobs: jobs in state (NULL = any; else 422 naming "state"), newest
 * first, at most limit, without their results; "total" counts every match. */
void jobs_list(jobs *j, api_call *c, const char *state, int limit);
/* GET /v1/jobs/{id}/events: 404, or c's stream set to Server-Sent Events:
 * "progress" on every state or progress change, then one of "done",
 * "failed", "cancelled" (the job object, with its result) and the end;
 * "error" when the job expired meanwhile; ": keep-alive" comments when idle. */
void jobs_events(jobs *j, api_call *c, const char *id);
/* Seconds between keep-alive comments (default 15). */
void jobs_set_keepalive(jobs *j, double seconds);

/* Prometheus lines: lensd_jobs{state="..."} gauges. */
void jobs_write_metrics(jobs *j, jw *w);

#endif
