/* registry.h - the resident models: which to load, loading, freeing. */
#ifndef LENSD_REGISTRY_H
#define LENSD_REGISTRY_H

#include "api/api.h"
#include "server/config.h"

/* Load every model named by --model and --models-dir; on success sets
 * *models / *n (read-only from then on). On failure logs why and returns -1. */
int registry_load(const lensd_config *cfg, api_model **models, int *n);
void registry_free(api_model *models, int n);

#endif
