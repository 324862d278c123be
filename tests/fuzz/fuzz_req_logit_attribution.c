/* fuzz_req_logit_attribution.c - POST /v1/logit-attribution request bodies, decoded, validated and run
 * as the server does (tests/fuzz/fuzz_request.h). */
#define FUZZ_ROUTE "/v1/logit-attribution"
#include "tests/fuzz/fuzz_request.h"
