/* job_inline.h - an async job run at once on the calling thread, for tests
 * that drive api/ without the server (the fuzzers, the fault injection):
 * what server/jobs.c's job thread does, minus the queue. The job takes the
 * submitting call's body and decoded request and runs on a call of its own
 * (job), which the caller reads and then frees with api_call_free. */
#ifndef LENS_TEST_JOB_INLINE_H
#define LENS_TEST_JOB_INLINE_H

#include "api/api.h"

static inline void job_run_inline(api_call *c, const api_job_kind *kind, api_call *job)
{
    api_call_init(job, c->ctx, api_now());
    job->body = c->body, job->req = c->req, job->free_req = c->free_req;
    c->body = NULL, c->req = NULL, c->free_req = NULL;
    kind->run(job);
}

#endif
