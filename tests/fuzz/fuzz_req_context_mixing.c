/* fuzz_req_context_mixing.c - POST /v1/context-mixing request bodies, decoded, validated and run
 * as the server does (tests/fuzz/fuzz_request.h). */
#define FUZZ_ROUTE "/v1/context-mixing"
#include "tests/fuzz/fuzz_request.h"
