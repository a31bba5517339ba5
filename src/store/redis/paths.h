/* SPDX-License-Identifier: MIT */
/*
 * Which way a Redis store's decisions and leases go -- the module, a lean
 * script by FCALL or EVALSHA -- as found so far: one state, the
 * synchronous store's, that both transports read and update (store.c for
 * the synchronous one, async.c), so that neither calls the other.
 */
#ifndef RATE_STORE_REDIS_PATHS_H
#define RATE_STORE_REDIS_PATHS_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "ratelimit_redis.h"

/* Whether the server has ratelimit.so; while off, tried again no sooner
 * than RATE__MODULE_RETRY_NS after (docs/redis-module.md). */
enum { RATE__MODULE_UNKNOWN = 0, RATE__MODULE_ON = 1, RATE__MODULE_OFF = 2 };
#define RATE__MODULE_RETRY_NS (5 * RATE_NS_PER_S)

typedef struct rate__redis_paths {
    rate_redis_module_t module_mode; /* the store's option */
    _Atomic int module_state;        /* RATE__MODULE_* */
    _Atomic uint64_t module_retry_at_ns;
    atomic_bool fcall; /* every node took FUNCTION LOAD: FCALL, else EVALSHA */
    bool generic_leases;         /* lease() declines: leases by load + cas */
    atomic_bool lease_no_module; /* the module has no RATELIMIT.LEASE */
    atomic_bool fair_no_module;  /* the module has no RATELIMIT.FAIR */
} rate__redis_paths_t;

/* Whether to send RATELIMIT.STEP for a decision without probing first:
 * yes once the module answered; while its presence is not known, or after
 * it was found absent, one decision per pause asks (the others go by the
 * scripts: a transport never waits on a probe). */
bool rate__redis_module_try(rate__redis_paths_t *p);
/* What a module command came to: answered (used from now on), or an error
 * reply (the scripts for a pause). */
void rate__redis_module_seen(rate__redis_paths_t *p, bool answered);
/* Whether lean scripts go by FCALL; off for good once a server would not
 * load the library. */
bool rate__redis_fcall_on(rate__redis_paths_t *p);
void rate__redis_fcall_off(rate__redis_paths_t *p);
/* Leases: whether they go by the general path (generic_leases), whether the
 * module may make them (not known to lack RATELIMIT.LEASE), and that it
 * lacks it (an "unknown command" reply). */
bool rate__redis_generic_leases(const rate__redis_paths_t *p);
bool rate__redis_lease_module_ok(rate__redis_paths_t *p);
void rate__redis_lease_module_gone(rate__redis_paths_t *p);

#endif
