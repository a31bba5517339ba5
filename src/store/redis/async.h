/* SPDX-License-Identifier: MIT */
/*
 * The asynchronous transport (async.c): the Redis store's part of a
 * decision over hiredis's asynchronous context, driven by the caller's
 * event loop (rate_loop_t).  The store (store.c) makes it over a
 * synchronous store it hands over, which serves the rest of the contract.
 */
#ifndef RATE_STORE_REDIS_ASYNC_H
#define RATE_STORE_REDIS_ASYNC_H

#include "../../call.h"
#include "../../kit.h"
#include "cluster.h"
#include "node.h"
#include "paths.h"
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
 * on failure.  paths (which way calls go), proto and the strings of conf
 * are sync's and live as long.
 * The first topology: nnodes nodes and map (node index + 1 per slot) for
 * a cluster, or map NULL: the conf's host, the one node serving every
 * slot. */
int rate__rasync_new(const rate_loop_t *loop, rate_store_t *sync,
                     const rate_store_methods_t *sm, void *sync_self,
                     rate__redis_paths_t *paths,
                     const rate__redis_proto_t *proto,
                     const rate__redis_conf_t *conf, const rc_addr_t *nodes,
                     unsigned nnodes, const uint8_t *map, rate_store_t **out);

/* The synchronous store's back end an asynchronous Redis store owns, or
 * NULL for any other store: what drop and touch go through. */
void *rate__rasync_sync(rate_store_t *store);
/* rate_store_redis_last_error of an asynchronous Redis store (RATE_EINVAL
 * for another store). */
int rate__rasync_last_error(rate_store_t *store, char *buf, size_t cap);

#endif
