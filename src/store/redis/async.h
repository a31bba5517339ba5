/* SPDX-License-Identifier: MIT */
/*
 * The asynchronous transport (async.c): the Redis store's part of a
 * decision over hiredis's asynchronous context, driven by the caller's
 * event loop (rate_loop_t).  The store (store.c) makes it over a
 * synchronous store it hands over, which serves the rest of the contract.
 */
#ifndef RATE_STORE_REDIS_ASYNC_H
#define RATE_STORE_REDIS_ASYNC_H

#include "../../internal.h"
#include "cluster.h"
#include "node.h"
#include "protocol.h"
#include "ratelimit_loop.h"

/* The settings the transport needs. */
typedef struct rate__redis_conf {
    const char *host; /* the first seed; a unix socket's path if port 0 */
    int port;
    const char *user, *password; /* "" when none */
    int db;
    bool cluster;
    uint64_t command_ns, connect_ns;
    rate__breaker_conf_t breaker;
} rate__redis_conf_t;

/* RATE_OK for a loop with every function and reserved words NULL, else
 * RATE_EINVAL with err set. */
int rate__rasync_loop_ok(const rate_loop_t *loop, char *err, size_t errlen);

/* The asynchronous store over `sync` (a Redis store: its table sm, its
 * back end sync_self), which it owns from now on, freed with it, or here
 * on failure.  proto and the strings of conf are sync's and live as long.
 * The first topology: nnodes nodes and map (node index + 1 per slot) for
 * a cluster, or map NULL: the conf's host, the one node serving every
 * slot. */
int rate__rasync_new(const rate_loop_t *loop, rate_store_t *sync,
                     const rate_store_methods_t *sm, void *sync_self,
                     const rate__redis_proto_t *proto,
                     const rate__redis_conf_t *conf, const rc_addr_t *nodes,
                     unsigned nnodes, const uint8_t *map, rate_store_t **out);

/* The synchronous store's choices, which the asynchronous transport
 * follows (store.c; sync_self: its back end): whether to send
 * RATELIMIT.STEP for a decision (while the module's presence is not known
 * one decision's command asks, the others go by the scripts: the
 * transport never waits on a probe; once found absent, one decision tries
 * again after the synchronous store's pause), what one came to (answered: used by both from now on; an error
 * reply: the scripts for that pause), and whether lean scripts go by FCALL
 * (off for good once a server would not load the library). */
bool rate__redis_module_try(void *sync_self);
void rate__redis_module_seen(void *sync_self, bool answered);
bool rate__redis_fcall_on(void *sync_self);
void rate__redis_fcall_off(void *sync_self);
/* Leases (lease.h): whether they go by the general path (generic_leases),
 * whether the module may make them (not known to lack RATELIMIT.LEASE),
 * and that it lacks it (an "unknown command" reply). */
bool rate__redis_generic_leases(void *sync_self);
bool rate__redis_lease_module_ok(void *sync_self);
void rate__redis_lease_module_gone(void *sync_self);

/* The synchronous store's back end an asynchronous Redis store owns, or
 * NULL for any other store: what drop and touch go through. */
void *rate__rasync_sync(rate_store_t *store);
/* rate_store_redis_last_error of an asynchronous Redis store (RATE_EINVAL
 * for another store). */
int rate__rasync_last_error(rate_store_t *store, char *buf, size_t cap);

#endif
