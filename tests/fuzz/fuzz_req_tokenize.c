/* fuzz_req_tokenize.c - POST /v1/tokenize request bodies, decoded, validated and run
 * as the server does (tests/fuzz/fuzz_request.h). */
#define FUZZ_ROUTE "/v1/tokenize"
#include "tests/fuzz/fuzz_request.h"
