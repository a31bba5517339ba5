/* SPDX-License-Identifier: MIT */
/*
 * What the Redis stores share (src/store/redis.c, the synchronous store;
 * src/store/redis_async.c, the asynchronous one): the commands of the
 * store's part (keys, arguments, scripts) and the parsing of their
 * replies, so that both speak one protocol over one layout of keys.
 */
#ifndef RATE_REDIS_INTERNAL_H
#define RATE_REDIS_INTERNAL_H

#include <hiredis/hiredis.h>

#include "../internal.h"
#include "ratelimit_redis.h"
#include "redis_cluster.h"

typedef struct redis_store redis_store_t;

#define RATE__REDIS_ARGS_MAX (4 + 7 + 4 * RATE_MAX_LIMITS)

/* One command, built by a *_cmd function: argc, av, al for hiredis's
 * argv calls; the bytes it points to live in it (or in the caller's state
 * for a compare-and-set).  rate__redis_cmd_free() after use (once built). */
typedef struct rate__redis_cmd {
    int argc;
    const char *av[RATE__REDIS_ARGS_MAX];
    size_t al[RATE__REDIS_ARGS_MAX];
    char num[7 + 4 * RATE_MAX_LIMITS][24];
    char kb[RATE_KEY_MAX * 3 + 300]; /* the key's name when it fits */
    char *k;                         /* the key's name (kb or the heap) */
    size_t kl;
    int lean;           /* a decide's lean script (its index), or -1 */
    const char *script; /* the script of an EVALSHA, for NOSCRIPT */
    size_t script_len;
} rate__redis_cmd_t;

/* Build the command of a decide() (RATE_ENOTSUP: the script cannot decide
 * this request exactly, or it is a refund or a penalty no lean script
 * makes; RATE_EINVAL: a policy record's key), of a load()
 * and of a cas(), as the synchronous store sends them. */
int rate__redis_decide_cmd(const redis_store_t *r, const rate_key_t *key,
                           const rate_decide_req_t *q, rate__redis_cmd_t *c);
int rate__redis_load_cmd(const redis_store_t *r, const rate_key_t *key,
                         rate__redis_cmd_t *c);
int rate__redis_cas_cmd(const redis_store_t *r, const rate_key_t *key,
                        uint64_t version, const void *state, size_t len,
                        uint64_t ttl_ns, rate__redis_cmd_t *c);
void rate__redis_cmd_free(rate__redis_cmd_t *c);
/* Turn an EVALSHA into the EVAL of its script (after NOSCRIPT). */
void rate__redis_cmd_eval(rate__redis_cmd_t *c);

/* Replies.  reply_ok: rc, or for an error reply RATE_ESTORE (RATE_ECORRUPT
 * for WRONGTYPE).  The parsers take a reply that passed it. */
int rate__redis_reply_ok(int rc, const redisReply *rep);
bool rate__redis_noscript(const redisReply *rep);
int rate__redis_decide_parse(const redisReply *rep, rate_decision_t *d);
int rate__redis_load_parse(const redisReply *rep, const char **state,
                           size_t *len, uint64_t *version);
int rate__redis_cas_parse(const redisReply *rep);

/* rate_store_redis_new, which with try_now false and lazy_connect does
 * not try to connect at all (the asynchronous store's, whose creation
 * must not wait for a Redis that accepts and never answers). */
int rate__redis_new(const char *url, const rate_redis_options_t *opt,
                    bool try_now, rate_store_t **out, char *err,
                    size_t errlen);

/* The synchronous store's table and its settings. */
const rate_store_methods_t *rate__redis_methods(void);
typedef struct rate__redis_conf {
    const char *host; /* the first seed; a unix socket's path if port 0 */
    int port;
    const char *user, *password; /* "" when none */
    int db;
    bool cluster;
    uint64_t command_ns, connect_ns;
    bool breaker;
    unsigned breaker_failures;
    uint64_t breaker_cooldown_ns;
} rate__redis_conf_t;
void rate__redis_conf(const redis_store_t *r, rate__redis_conf_t *out);

/* The synchronous store an asynchronous Redis store owns (its back end),
 * or NULL for any other store (src/store/redis_async.c): what
 * rate_store_redis_drop and rate_store_redis_touch go through. */
redis_store_t *rate__redis_async_sync(rate_store_t *store);
/* rate_store_redis_last_error of an asynchronous Redis store (RATE_EINVAL
 * for another store). */
int rate__redis_async_last_error(rate_store_t *store, char *buf, size_t cap);

/* The synchronous store's topology as it knows it now (no I/O): the
 * addresses of its nodes (the masters it has seen, at most cap of them:
 * *n) and its slot map (map[slot]: a node's index + 1 in that list, 0
 * when no master is known for the slot).  False while the topology is not
 * known yet (a lazy store before its first call) or for a single server:
 * then nothing is set.  The key's slot of a built command is
 * rc_key_slot(c->k, c->kl) (redis_cluster.h). */
typedef struct rate__redis_addr {
    char host[RC_HOST_MAX];
    int port;
} rate__redis_addr_t;
bool rate__redis_topology(redis_store_t *r, rate__redis_addr_t *nodes,
                          unsigned cap, unsigned *n, uint8_t map[RC_SLOTS]);

#endif
