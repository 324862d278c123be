/* fuzz_req_decomposition.c - POST /v1/decomposition request bodies, decoded, validated and run
 * as the server does (tests/fuzz/fuzz_request.h). */
#define FUZZ_ROUTE "/v1/decomposition"
#include "tests/fuzz/fuzz_request.h"
