/* fuzz_req_jobs.c - POST /v1/jobs request bodies, decoded, validated and run
 * as the server does (tests/fuzz/fuzz_request.h). */
#define FUZZ_ROUTE "/v1/jobs"
#include "tests/fuzz/fuzz_request.h"
