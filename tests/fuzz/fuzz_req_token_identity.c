/* fuzz_req_token_identity.c - POST /v1/token-identity request bodies, decoded, validated and run
 * as the server does (tests/fuzz/fuzz_request.h). */
#define FUZZ_ROUTE "/v1/token-identity"
#include "tests/fuzz/fuzz_request.h"
