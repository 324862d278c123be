/* fuzz_req_attention.c - POST /v1/attention request bodies, decoded, validated and run
 * as the server does (tests/fuzz/fuzz_request.h). */
#define FUZZ_ROUTE "/v1/attention"
#include "tests/fuzz/fuzz_request.h"
