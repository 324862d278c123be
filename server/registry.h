/* registry.h - the resident models: which to load, loading at start-up and
 * at run time, counted references, unloading, the folders that failed. */
#ifndef LENSD_REGISTRY_H
#define LENSD_REGISTRY_H

#include "api/api.h"
#include "server/config.h"

typedef struct registry registry;

/* Load every model named by --model and --models-dir. A folder that fails
 * to load is logged and listed as failed (GET /v1/models "failed"), the
 * others are served. Returns NULL (after logging why) only when the flags
 * are malformed, or when nothing loaded and there is no --models-dir to
 * load into at run time. */
registry *registry_create(const lensd_config *cfg);
/* Frees every model; no request may hold one any more. */
void registry_free(registry *r);
/* Points ctx's model hooks (api.h) at r. */
void registry_install(registry *r, api_ctx *ctx);

#endif
