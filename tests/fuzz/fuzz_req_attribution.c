/* fuzz_req_attribution.c - POST /v1/attribution request bodies, decoded, validated and run
 * as the server does (tests/fuzz/fuzz_request.h). */
#define FUZZ_ROUTE "/v1/attribution"
#include "tests/fuzz/fuzz_request.h"
