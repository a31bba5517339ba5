/* SPDX-License-Identifier: MIT */
/*
 * The synchronous transport (sync.c): the nodes of a single server or of
 * a Redis Cluster's masters, each with a few shared, pipelined
 * connections, and the call that sends one command about a key to the
 * node that serves it.  The store (store.c) is built on it.
 */
#ifndef RATE_STORE_REDIS_SYNC_H
#define RATE_STORE_REDIS_SYNC_H

#include <pthread.h>

#include <hiredis/hiredis.h>

#include "../../call.h"
#include "../../kit.h"
#include "cluster.h"
#include "node.h"
#include "paths.h"
#include "protocol.h"
#include "ratelimit_redis.h"

#define RATE__REDIS_MAX_SEEDS 16

typedef struct rate__snode rate__snode_t; /* a node (sync.c) */

typedef struct redis_store {
    rc_addr_t seeds[RATE__REDIS_MAX_SEEDS];
    unsigned nseeds;
    char password[256], user[256];
    int db;
    bool unix_socket, lazy;
    unsigned pool;
    rate__breaker_conf_t breaker;
    uint64_t connect_ns, command_ns;
    rate__redis_proto_t proto;

    /* The topology: found once (ready), at creation or, lazily, by the
     * first call that reaches a seed; the slot map then follows the
     * cluster.  Discovery and map refreshes under topo_lock, which is held
     * across their I/O; new nodes under node_lock, which never is (a
     * call redirected to a new node must not wait for a refresh made by
     * another call, with that call's deadline). */
    pthread_mutex_t topo_lock;
    pthread_mutex_t node_lock;
    atomic_bool ready;
    bool cluster; /* set before ready */
    rate__backoff_t topo_backoff;
    _Atomic uint64_t refreshed_at_ns;
    rate__snode_t *_Atomic nodes[RATE__REDIS_MAX_NODES];
    atomic_uint nnodes;
    _Atomic uint8_t slot_node[RC_SLOTS]; /* node index + 1; 0: none known */

    pthread_mutex_t err_lock;
    char last_err[256]; /* the last connection's failure, or a call's;
                           "" since one succeeded */
    atomic_bool err_call; /* last_err is a call's (an error reply, a
                             connection lost under it): "" at the next
                             reply that is no error */
    atomic_uint_fast64_t st_lean, st_general, st_declined;
    atomic_uint_fast64_t st_lean_evalsha; /* of st_lean, not by FCALL */
    atomic_uint_fast64_t st_lean_adj, st_adj_declined; /* refunds, penalties */
    atomic_uint_fast64_t st_opened, st_rejected, st_redirects, st_refreshes,
        st_connect_failures;

    /* ratelimit.so, FCALL, leases: which way calls go (paths.h) */
    rate__redis_paths_t paths;
    atomic_uint_fast64_t st_module, st_module_fallbacks;
    atomic_uint_fast64_t st_module_leases, st_script_leases;
    atomic_uint_fast64_t st_module_fair, st_script_fair;
} redis_store_t;

/* A call's deadline: the command timeout from the start of the library
 * call it serves (a decision, refund or penalty: call.h,
 * rate__call_begin), so that a module probe, a fallback to the scripts, a
 * reconnect and the policy's record all share it; from now outside one. */
static inline uint64_t rate__rsync_deadline(const redis_store_t *r)
{
    return rate__call_deadline_ns(r->command_ns);
}

/* The locks made; rate__rsync_fini undoes it and frees the nodes. */
void rate__rsync_init(redis_store_t *r);
void rate__rsync_fini(redis_store_t *r);

/* Finds the topology from the seeds: the first that answers tells whether
 * it is a cluster (its slot map) or a single server (kept as the one
 * node, its connection the node's first).  With wait false (a call on a
 * lazy store) it does nothing while another thread tries, or before the
 * backoff since the last failed try is over: RATE_ESTORE at once. */
int rate__rsync_discover(redis_store_t *r, uint64_t dl, bool wait, char *err,
                         size_t errlen);

/* One command about the key name (NULL: any node will do): on the single
 * server, or on the master of the key's slot, following MOVED, ASK and
 * TRYAGAIN.  *out is the reply (perhaps an error reply) on RATE_OK;
 * otherwise no reply came (RATE_ESTORE, RATE_ETIMEDOUT, RATE_ENOMEM). */
int rate__rsync_call(redis_store_t *r, uint64_t dl, const char *key,
                     size_t klen, int argc, const char **argv,
                     const size_t *lens, redisReply **out);
/* A reply that is an array of at most RATE__RSYNC_INTS integers (a
 * step's), read without reply objects by rate__rsync_call_ints. */
#define RATE__RSYNC_INTS 9
typedef struct rate__rsync_ints {
    long long v[RATE__RSYNC_INTS];
    size_t n;
} rate__rsync_ints_t;
/* As rate__rsync_call, but a reply that is such an array is read into
 * *ints, *out NULL; any other reply (an error, a redirection) is *out. */
int rate__rsync_call_ints(redis_store_t *r, uint64_t dl, const char *key,
                          size_t klen, int argc, const char **argv,
                          const size_t *lens, rate__rsync_ints_t *ints,
                          redisReply **out);
/* One command on node n, through its breaker, as rate__rsync_call. */
int rate__rsync_call_node(redis_store_t *r, uint64_t dl, rate__snode_t *n,
                          int argc, const char **argv, const size_t *lens,
                          redisReply **out);
/* The masters now in the slot map (the single server: it), at most cap. */
size_t rate__rsync_masters(redis_store_t *r, rate__snode_t **out, size_t cap);
bool rate__rsync_node_open(const redis_store_t *r, const rate__snode_t *n);

/* The topology as known now (no I/O): the addresses of the nodes (at most
 * cap: *n) and the slot map (map[slot]: a node's index + 1 in that list,
 * 0 when no master is known for the slot).  False while the topology is
 * not known yet (a lazy store before its first call) or for a single
 * server: then nothing is set. */
bool rate__rsync_topology(redis_store_t *r, rc_addr_t *nodes, unsigned cap,
                          unsigned *n, uint8_t map[RC_SLOTS]);

/* rate_store_redis_last_error's text. */
void rate__rsync_set_err(redis_store_t *r, const char *msg);
/* An error reply that the store made a store error ("HOST:PORT: replied:
 * TEXT", the node of this thread's last error reply), kept until a later
 * reply is no error. */
void rate__rsync_replied(redis_store_t *r, const char *text);
void rate__rsync_last_error(redis_store_t *r, char *buf, size_t cap);

#endif
