/* SPDX-License-Identifier: MIT */
/*
 * ratelimit_redis.h -- the Redis and Redis Cluster stores
 * (docs/redis.md): the synchronous store, the asynchronous one driven by
 * an event loop (ratelimit_loop.h), their options and extras.  In the
 * library when it is built with RATE_WITH_REDIS (the default).
 */
#ifndef RATELIMIT_REDIS_H
#define RATELIMIT_REDIS_H

#include "ratelimit.h"
#include "ratelimit_loop.h"

#ifdef __cplusplus
extern "C" {
#endif

/* How the Redis store uses ratelimit.so, the Redis module whose
 * RATELIMIT.STEP runs the library's own step inside Redis over the same
 * keys as the scripts (docs/redis-module.md).  The decisions are the same
 * either way; only their speed and range differ (the module decides in
 * one round trip what the scripts hand back to compare-and-set). */
typedef enum rate_redis_module {
    RATE_REDIS_MODULE_AUTO = 0, /* use it when the server has it: asked at
                                   the first decision (COMMAND INFO); a
                                   decision answered with an error
                                   ("unknown command": the module
                                   unloaded, a failover to a server
                                   without it; an ACL's NOPERM) is made
                                   by the scripts at once, and the
                                   module is tried again no sooner than
                                   5 s later */
    RATE_REDIS_MODULE_ON = 1,   /* use it: creation fails (RATE_ESTORE)
                                   when the server has no RATELIMIT.STEP;
                                   a later "unknown command" falls back
                                   as with AUTO */
    RATE_REDIS_MODULE_OFF = 2   /* never: the scripts only */
} rate_redis_module_t;

typedef struct rate_redis_options {
    /* connect_timeout_ns, command_timeout_ns and breaker_cooldown_ns are
     * at most RATE_TIME_MAX (RATE_EINVAL above, naming the option). */
    uint64_t connect_timeout_ns; /* 0: 1 s.  The TCP connect's bound;
                                    at creation (and a lazy store's
                                    creation try), each seed tried has
                                    connect + command timeout for its
                                    whole connection, the TCP connect and
                                    the handshake together (AUTH, CLUSTER
                                    SLOTS, SELECT, SCRIPT LOAD, the ACL
                                    check), however soon TCP connects:
                                    2 s with the defaults against a server
                                    that accepts and never answers, times
                                    the seeds tried */
    uint64_t command_timeout_ns; /* 0: 1 s.  Every call returns within
                                    this of its start (plus the scheduling
                                    of threads, a few ms), all its
                                    commands together (a decision's probe,
                                    script, compare-and-set path, record,
                                    redirections): a command not
                                    answered by then fails with every
                                    command in flight on its connection
                                    (RATE_ETIMEDOUT), and a connection
                                    made on a call's behalf (the connect
                                    timeout included) is made within it */
    const char *prefix;          /* key namespace, copied; NULL: "ratelimit:";
                                    at most 256 bytes, no '{' or '}'
                                    (RATE_EINVAL); end it with a separator
                                    (docs/redis.md, "Key names") */
    unsigned pool_size;          /* connections per server (per master in
                                    a cluster), each shared by all callers
                                    (pipelined); 0: 2 */
    bool no_ttl;                 /* keep keys without expiry (replays on a
                                    virtual clock); default: expire each key
                                    after its reset_after by Redis's own
                                    clock (rounded up to ms, plus 1 ms) */
    bool client_time;            /* decide on the limiter's clock; default:
                                    on Redis's TIME, one clock for every
                                    client (times given to the *_at calls
                                    are always used as given) */
    uint64_t safety_ttl_ns;      /* with no_ttl: 0 (default) keeps the keys
                                    written without expiry (PERSIST); else
                                    every state and shadow state written
                                    gets this expiry instead, rounded up to
                                    ms, whatever its reset_after, so that
                                    keys left behind by a process that died
                                    go away (refresh them all with
                                    rate_store_redis_touch while they are
                                    in use).  Policy records are always
                                    kept without expiry when written.
                                    Ignored without no_ttl */
    bool lazy_connect;           /* creation succeeds even when no server
                                    answers (a malformed URL or option is
                                    still RATE_EINVAL): until one does,
                                    every call fails at once (RATE_ESTORE,
                                    so decisions follow the fail mode),
                                    and calls try again, one at a time,
                                    no more often than a backoff from
                                    10 ms doubling to 1 s;
                                    rate_store_redis_last_error says why.
                                    Default: connect at creation */
    unsigned breaker_failures;   /* the circuit breaker of each server: 0:
                                    5 calls in a row on that server that
                                    got no reply (a failed or timed-out
                                    connection; error replies do not
                                    count) open it.  Only the server's own
                                    calls count: not a cluster's slot-map
                                    refreshes, nor a call whose time was
                                    up before it reached the server */
    uint64_t breaker_cooldown_ns;/* 0: 1 s.  While open, every call on
                                    that server fails at once
                                    (RATE_ESTORE); after it, one call goes
                                    through as a probe: answered, the
                                    breaker closes; not, it opens again */
    bool no_breaker;             /* no circuit breaker */
    rate_redis_module_t module;  /* whether decisions go through
                                    ratelimit.so, the Redis module
                                    (docs/redis-module.md), when loaded;
                                    default AUTO; a value that is none of
                                    the three is RATE_EINVAL */
    bool general_script;         /* decide every policy with the general
                                    script (redis_step.lua), never a lean
                                    one: the same decisions, slower; for
                                    comparison (docs/redis.md) */
    uint64_t generic_leases;     /* non-zero: an in-flight limit's leases
                                    go by HMGET and compare-and-set (two
                                    round trips or more each), never by
                                    RATELIMIT.LEASE or the lease script
                                    (one); for comparison (docs/leases.md).
                                    From a reserved word of 0.4.0 */
    uint64_t reserved[7]; /* zero (= {...} or memset): room for later
                               fields; non-zero is RATE_EINVAL */
} rate_redis_options_t;

/* The Redis store: url is redis://[[user]:password@]host[:port][/db],
 * redis://[[user]:password@]host[:port],host[:port]... (seeds: tried in
 * order until one answers) or unix:///path.  A server that is a Redis
 * Cluster node is found to be one when the store connects: the store then
 * sends each key's commands to the master of its slot and follows the
 * cluster's redirections and failovers (docs/redis.md).  Each key lives
 * under PREFIX{KEY} (its own Cluster hash tag; a key holding '}' is
 * escaped, docs/redis.md).  Connects at creation (unless lazy_connect),
 * so that a bad host, password, database or a user's missing rights (the
 * ACL's NOPERM, for EVALSHA or HMGET on the store's keys) is reported
 * here.  Decisions are the memory store's, bit for bit, in one round trip
 * (a Lua twin of the step; see docs/algorithms.md, "Stores"; or, with
 * ratelimit.so loaded, the step itself inside Redis: options->module,
 * docs/redis-module.md).  `options` may be NULL (every option its
 * default).
 *
 * Returns: RATE_OK with the store in *out.
 *
 * Errors (`err`, if not NULL, errlen bytes with the NUL, then says why,
 * with the server's message; *out is NULL):
 *   RATE_EINVAL    NULL out or url; a malformed URL (rediss:// included:
 *                  no TLS) or option (non-zero reserved words, pool_size
 *                  above 1024, a module mode that is none of the three,
 *                  a timeout or cooldown above RATE_TIME_MAX,
 *                  a prefix above 256 bytes or holding '{' or '}'); a
 *                  database other than 0 in a cluster (with lazy_connect
 *                  too, when found at creation)
 *   RATE_ESTORE    Redis cannot be reached or refuses (a bad host,
 *                  password or database, NOPERM); module
 *                  RATE_REDIS_MODULE_ON and no module on the server
 *   RATE_ETIMEDOUT it does not answer in time (a server that accepts and
 *                  never answers: after connect_timeout_ns +
 *                  command_timeout_ns per seed tried, "HOST:PORT: CLUSTER
 *                  SLOTS: timed out after N ms")
 * With lazy_connect, a server that cannot be reached or does not answer
 * is no error here (rate_store_redis_last_error says why later).
 *   RATE_ENOMEM
 *
 * Ownership: url, options and options->prefix are read during the call
 * (the prefix and what the URL says are copied); err is the caller's.
 * The caller frees *out with rate_store_free.
 *
 * Thread-safe: yes (callers share pipelined connections). */
RATE_API int rate_store_redis_new(const char *url,
                                  const rate_redis_options_t *options,
                                  rate_store_t **out, char *err,
                                  size_t errlen);

/* Deletes every key of the Redis store's namespace: the names it writes
 * under its prefix (PREFIX{...}, PREFIX s{...}, PREFIX p{...},
 * PREFIX e{...}, PREFIX es{...}), never another name that merely starts
 * with the prefix (SCAN + UNLINK; in a cluster, on every master).
 * An asynchronous Redis store (ratelimit_loop.h) is dropped through the
 * synchronous store it owns, blocking as that one does.
 *
 * Returns: RATE_OK once every master's scan is done.
 *
 * Errors: RATE_EINVAL for a NULL store or one that is not a Redis store;
 * RATE_ESTORE or RATE_ETIMEDOUT when Redis fails or does not answer;
 * RATE_ECORRUPT for a reply that does not parse: in a cluster, a master
 * that fails ends its own scan only, the other masters' keys are still
 * deleted, and the first failure is returned at the end (the keys deleted
 * stay deleted; drop again once the master is back for the rest);
 * RATE_ENOMEM (stops at once).
 *
 * Ownership: store is borrowed; nothing is kept.
 *
 * Thread-safe: yes. */
RATE_API int rate_store_redis_drop(rate_store_t *store);

/* Tells why the store's last attempt to connect failed, with the server's
 * message, or why a call failed since: an error reply that made it a
 * store error ("HOST:PORT: replied: NOPERM ...", "... OOM ...",
 * "... CLUSTERDOWN ...") or RATE_ECORRUPT ("... WRONGTYPE ...": a key of
 * the store's name that is no hash), or a connection that failed under
 * it ("HOST:PORT: no reply within the command timeout (N ms)",
 * "HOST:PORT: connection lost: ..."), kept until a later reply succeeds.
 * An asynchronous Redis store (rate_store_redis_async_new) says the same
 * of its own connections (a connect refused, AUTH or SELECT refused, a
 * node that did not reply within the command timeout), of error
 * replies that became store errors and of a key that is no hash, each
 * with the node's address.
 *
 * Returns: RATE_OK with the text copied into buf (cap bytes, cap > 0,
 * NUL-terminated, cut to fit): "" when none failed since one succeeded.
 *
 * Errors: RATE_EINVAL for a NULL store or one that is not a Redis store
 * (synchronous or asynchronous), a NULL buf or a cap of 0.
 *
 * Ownership: store is borrowed; buf is the caller's; nothing is kept.
 *
 * Thread-safe: yes (an asynchronous store: on its loop's thread). */
RATE_API int rate_store_redis_last_error(rate_store_t *store, char *buf,
                                         size_t cap);

typedef struct rate_redis_status {
    bool ready;                /* the server (or cluster) was reached once */
    bool cluster;              /* a Redis Cluster */
    unsigned masters;          /* masters in the slot map (1: one server) */
    unsigned breakers_open;    /* of those, with the breaker open now */
    uint64_t breaker_opened;   /* times a breaker opened */
    uint64_t breaker_rejected; /* calls failed at once by an open breaker */
    uint64_t redirections;     /* MOVED, ASK and TRYAGAIN followed */
    uint64_t map_refreshes;    /* slot maps read from the cluster */
    uint64_t connect_failures; /* connections that could not be made */
    bool module;               /* decisions go through ratelimit.so now */
    uint64_t module_decisions; /* decisions the module made */
    uint64_t module_fallbacks; /* module calls answered with an error,
                                  "unknown command" (then made by the
                                  scripts) */
    uint64_t lean_decisions;   /* decided in one round trip by a lean
                                  script (docs/redis.md) */
    uint64_t general_decisions;/* ... by the general script */
    uint64_t declined;         /* decisions left to the limiter's
                                  compare-and-set path (a policy past the
                                  scripts' exact range, or a state they
                                  would not read): 3 round trips */
    uint64_t lean_adjustments; /* refunds and penalties made in one round
                                  trip by a lean script (docs/redis.md) */
    uint64_t declined_adjustments; /* ... left to the compare-and-set path
                                  (a composite policy, one past the lean
                                  scripts' range, a state they would not
                                  read) */
    uint64_t module_leases;    /* lease operations (docs/leases.md) made in
                                  one round trip by RATELIMIT.LEASE */
    uint64_t script_leases;    /* ... by the lease script (the others went
                                  by HMGET and compare-and-set) */
    uint64_t module_fair;      /* fair decisions (docs/fair.md, "Redis")
                                  made in one round trip by
                                  RATELIMIT.FAIR */
    uint64_t script_fair;      /* ... by the fair script */
    uint64_t lean_evalsha;     /* of lean_decisions, those sent by EVALSHA
                                  or EVAL, not FCALL: a server without
                                  Functions (before Redis 7) or one that
                                  would not load the library (a user
                                  without FUNCTION); the same decisions,
                                  more of Redis's time (docs/redis.md) */
    uint64_t reserved[3]; /* room for later fields; not read */
} rate_redis_status_t;

/* Reads the synchronous Redis store's state and counts since its
 * creation (an asynchronous one's: rate_store_redis_async_stats).
 *
 * Returns: RATE_OK with *out filled (zeroed first; the cluster, masters
 * and breakers_open only once the server was reached).
 *
 * Errors: RATE_EINVAL for a NULL store, one that is not a synchronous
 * Redis store, or a NULL out.
 *
 * Ownership: store is borrowed; *out is the caller's; nothing is kept.
 *
 * Thread-safe: yes. */
RATE_API int rate_store_redis_status(rate_store_t *store,
                                     rate_redis_status_t *out);

/* Sets the expiry of every key under the Redis store's prefix -- states,
 * shadow states and policy records alike -- to ttl_ns, rounded up to ms
 * (SCAN + PEXPIRE, a batch at a time): the refresh of a namespace written
 * with no_ttl and safety_ttl_ns, so that keys idle for a while keep their
 * expiry.  Keys written after the SCAN passed them are not touched.
 * An asynchronous Redis store: through the synchronous store it owns
 * (blocking as it does).
 *
 * Returns: RATE_OK once every master's scan is done.
 *
 * Errors: RATE_EINVAL for a store that is not a Redis store (or NULL) or
 * a ttl_ns of 0; RATE_ESTORE or RATE_ETIMEDOUT when Redis fails or does
 * not answer; RATE_ECORRUPT for a reply that does not parse (as for
 * rate_store_redis_drop, a failing master ends its own scan only, the
 * others are still touched, the first failure is returned at the end,
 * and the keys touched keep their new expiry); RATE_ENOMEM.
 *
 * Ownership: store is borrowed; nothing is kept.
 *
 * Thread-safe: yes, alongside decisions on the same store. */
RATE_API int rate_store_redis_touch(rate_store_t *store, uint64_t ttl_ns);


/* A Redis store whose decisions never block the loop's thread: Redis's
 * asynchronous context (hiredis) driven by `loop`, for
 * rate_limiter_check_start.  url and options
 * as rate_store_redis_new (docs/redis.md): the same keys, scripts and
 * state, so a key decided by a synchronous Redis store and by this one is
 * one key.  A single server or a Redis Cluster: each command goes to the
 * master of its key's slot, over one connection per node made
 * asynchronously when a decision first needs it; MOVED is followed (the
 * slot map mended, and read again with an asynchronous CLUSTER SLOTS),
 * ASK once with ASKING, TRYAGAIN after 20 ms, at most 5 redirections per
 * command, after which the decision fails as a store error
 * (docs/async.md, "Redis Cluster").  Each decision is one command, chosen
 * as the synchronous store chooses it: RATELIMIT.STEP when the server has
 * ratelimit.so (options->module; while that is not known yet, one
 * decision's command asks, and an error reply has the scripts decide it
 * at once, the module tried again 5 s later, as the synchronous store
 * does), else
 * a lean script's FCALL (after "no such function", FUNCTION LOAD on that
 * connection and the FCALL again; a server that will not load it:
 * EVALSHA), else the general script's EVALSHA (NOSCRIPT: SCRIPT LOAD on
 * that connection and the EVALSHA again; a second NOSCRIPT: EVAL); or,
 * for a request none of them decides, a load (HMGET) and compare-and-set
 * script, retried on a conflict; its deadline is its start plus command_timeout_ns, kept by
 * one loop timer: when the oldest decision in flight passes its deadline,
 * the connection its command is on is dropped and every decision on that
 * connection completes with a store error (RATE_ETIMEDOUT).  A node's
 * connection is made again after a failure no sooner than a backoff
 * doubling from 10 ms to 1 s: meanwhile that node's decisions fail at once
 * (answered by rate_limiter_check_start's RATE_OK, under the fail mode).
 * The circuit breaker (breaker_failures, breaker_cooldown_ns, no_breaker)
 * counts, per node, the commands that failed in a row, as the synchronous
 * store does.  pool_size is not used (one connection per node).
 *
 * A limiter's policy record and a foreign policy met in a state are
 * written and read through this store too, by jobs of their own before the
 * decision that needs them: nothing of rate_limiter_new or
 * rate_limiter_check_start waits for Redis.  The store's other entries
 * (reset, refund, penalty, rate_store_redis_drop, the synchronous calls)
 * go through a synchronous store over the same URL that this store owns,
 * and block as that store does: do resets outside the loop's hot path.
 * rate_store_redis_new's connection check at creation is made by that
 * store here too, and blocks as there; with lazy_connect no connection is
 * made at creation (nothing waits: a server down, or one that never
 * answers, is the first decisions' store error).  The cluster's slot map
 * found by that check is this store's first one (with lazy_connect it is
 * learnt from the first MOVED).
 *
 * Creation calls loop->timer_new (the store's one timer) on the calling
 * thread.  Every callback runs on the loop's thread; rate_store_free, on
 * that thread and not from inside one of the store's callbacks, completes
 * every decision in flight, on every node (RATE_ECANCELED), before it
 * returns.
 *
 * Returns: RATE_OK with the store in *out.
 *
 * Errors (with err, as for rate_store_redis_new; *out is NULL):
 * RATE_EINVAL for a NULL out, url or loop, a loop table missing a
 * function (all but now are required), a bad URL or option;
 * RATE_ENOMEM, also when loop->timer_new returns NULL; or
 * rate_store_redis_new's errors (a cluster with a database other than 0
 * is its RATE_EINVAL).
 *
 * Ownership: `loop` (the table) is copied; the loop itself must outlive
 * the store.  url and options as for rate_store_redis_new.  The caller
 * frees *out with rate_store_free, on the loop's thread.
 *
 * Thread-safe: creation yes, on the loop's thread or before the loop runs
 * (libuv's and libevent's handles are not to be made while another
 * thread runs their loop); the store: the loop's thread only. */
RATE_API int rate_store_redis_async_new(const char *url,
                                        const rate_redis_options_t *options,
                                        const rate_loop_t *loop,
                                        rate_store_t **out, char *err,
                                        size_t errlen);

/* What an asynchronous Redis store has seen, for tests and monitoring.
 * Thread: the loop's. */
typedef struct rate_redis_async_stats {
    uint64_t started;   /* decisions taken (start() said RATE_OK) */
    uint64_t completed; /* of those, completed (done() called) */
    uint64_t timed_out; /* completed with RATE_ETIMEDOUT */
    uint64_t refused;   /* refused at once (breaker open, backoff) */
    uint64_t connects;  /* connections attempted */
    uint64_t noscript;  /* NOSCRIPT replies answered (load, or EVAL) */
    uint64_t in_flight; /* taken, not yet completed */
    /* Redis Cluster redirections followed (a command's error reply that
     * named another master, or asked to wait), and slot maps read. */
    uint64_t moved;     /* MOVED: the map mended, sent there */
    uint64_t asked;     /* ASK: sent there after ASKING, once */
    uint64_t tryagain;  /* TRYAGAIN: sent again after 20 ms */
    uint64_t refreshes; /* CLUSTER SLOTS replies taken as the map */
    /* Refunds and penalties a lean script made in one round trip, and
     * those left to the C step over HMGET and compare-and-set (outside
     * the scripts' range, or declined by one), as the synchronous store's
     * rate_redis_status_t counts them. */
    uint64_t lean_adjustments;
    uint64_t declined_adjustments;
    /* How decisions were made, as rate_redis_status_t counts them: by
     * ratelimit.so (RATELIMIT.STEP), module calls answered with an error
     * (then made by the scripts), by a lean script, by the general script,
     * and left to the C step over HMGET and compare-and-set (from reserved
     * words of 0.4.0: a store of 0.4.0 leaves them 0). */
    uint64_t module_decisions;
    uint64_t module_fallbacks;
    uint64_t lean_decisions;
    uint64_t general_decisions;
    uint64_t declined;
    /* Lease operations made in one round trip by RATELIMIT.LEASE and by
     * the lease script (issue 32, from reserved words). */
    uint64_t module_leases;
    uint64_t script_leases;
    /* Of lean_decisions, those sent by EVALSHA or EVAL, as
     * rate_redis_status_t counts them (the last reserved word). */
    uint64_t lean_evalsha;
} rate_redis_async_stats_t;

/* Reads what an asynchronous Redis store has seen since its creation
 * (rate_redis_async_stats_t).
 *
 * Returns: RATE_OK with *out filled.
 *
 * Errors: RATE_EINVAL for a NULL out, or a NULL store or one that is not
 * an asynchronous Redis store.
 *
 * Ownership: store is borrowed; *out is the caller's; nothing is kept.
 *
 * Thread-safe: on the loop's thread only (the counts are the loop's). */
RATE_API int rate_store_redis_async_stats(rate_store_t *store,
                                          rate_redis_async_stats_t *out);

#ifdef __cplusplus
}
#endif
#endif /* RATELIMIT_REDIS_H */
