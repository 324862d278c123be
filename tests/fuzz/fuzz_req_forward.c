/* fuzz_req_forward.c - POST /v1/forward request bodies, decoded, validated and run
 * as the server does (tests/fuzz/fuzz_request.h). */
#define FUZZ_ROUTE "/v1/forward"
#include "tests/fuzz/fuzz_request.h"
