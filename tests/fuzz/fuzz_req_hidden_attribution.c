/* fuzz_req_hidden_attribution.c - POST /v1/hidden-attribution request bodies, decoded, validated and run
 * as the server does (tests/fuzz/fuzz_request.h). */
#define FUZZ_ROUTE "/v1/hidden-attribution"
#include "tests/fuzz/fuzz_request.h"
