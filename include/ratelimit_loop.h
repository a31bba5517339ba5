/* SPDX-License-Identifier: MIT */
/*
 * ratelimit_loop.h -- driving a store from the caller's event loop.
 *
 * A store that talks to a server without blocking (the asynchronous Redis
 * store) needs three things of an event loop: to be told when a socket is
 * readable or writable, to be called back when a timer expires, and a
 * clock.  rate_loop_t is that, as a table of functions over the loop's own
 * objects; an adapter fills it for one loop (ratelimit_uv.h for libuv,
 * ratelimit_event.h for libevent; docs/async.md shows how to write one,
 * for nginx's ngx_event or libev).
 *
 * Threads: a store made over a loop calls these functions only from the
 * thread that runs the loop (inside rate_limiter_check_start, the loop's
 * callbacks, and rate_store_free), and timer_new once from the thread
 * that creates it (rate_store_redis_async_new makes its timer there):
 * create the store on the loop's thread, or before that loop runs; the
 * adapter need not lock.  The adapter
 * calls the store's ready functions only from inside the loop's callbacks,
 * never from inside one of its own functions below.
 */
#ifndef RATELIMIT_LOOP_H
#define RATELIMIT_LOOP_H

#include "ratelimit.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Events of a watched descriptor (a bit set). */
#define RATE_LOOP_READ 1u
#define RATE_LOOP_WRITE 2u

/* Called by the adapter when the descriptor is ready for `events` (some of
 * those it was told to watch).  The store may free the watch from inside
 * (io_free): the adapter must then call nothing more for it. */
typedef void (*rate_loop_io_fn)(void *arg, unsigned events);
/* Called by the adapter when an armed timer expires (once per arming). */
typedef void (*rate_loop_timer_fn)(void *arg);

typedef struct rate_loop {
    void *ud; /* the adapter's (its loop), passed to every function */

    /* A watch on fd, watching nothing yet: the adapter's handle, or NULL
     * when it cannot (the store then fails the connection). */
    void *(*io_new)(void *ud, int fd, rate_loop_io_fn fn, void *arg);
    /* Watch exactly `events` (0: nothing) from now on; level-triggered:
     * fn keeps being called while the descriptor is ready for a watched
     * event.  0, or -1 when the loop refuses (the store then fails the
     * connection). */
    int (*io_set)(void *ud, void *io, unsigned events);
    /* Stop watching and free the handle; fn is not called again, even if
     * the descriptor was ready in the loop's current turn.  The store
     * closes the descriptor itself, after this. */
    void (*io_free)(void *ud, void *io);

    /* A timer, not armed: the adapter's handle, or NULL. */
    void *(*timer_new)(void *ud, rate_loop_timer_fn fn, void *arg);
    /* Arm it to expire after_ns from now (replacing an earlier arming).
     * 0, or -1 when the loop refuses. */
    int (*timer_arm)(void *ud, void *timer, uint64_t after_ns);
    /* Disarm it (nothing when it is not armed). */
    void (*timer_cancel)(void *ud, void *timer);
    /* Disarm and free it; fn is not called again. */
    void (*timer_free)(void *ud, void *timer);

    /* Optional (NULL: CLOCK_MONOTONIC): now in ns, on the clock the
     * timers go by (a loop that caches its time per turn may return it). */
    uint64_t (*now)(void *ud);
} rate_loop_t;

/* A Redis store whose decisions never block the loop's thread: Redis's
 * asynchronous context (hiredis) driven by `loop`, for
 * rate_limiter_check_start and rate_limiter_check_async.  url and options
 * as rate_store_redis_new (docs/redis.md): the same keys, scripts and
 * state, so a key decided by a synchronous Redis store and by this one is
 * one key.  A single server or a Redis Cluster: each command goes to the
 * master of its key's slot, over one connection per node made
 * asynchronously when a decision first needs it; MOVED is followed (the
 * slot map mended, and read again with an asynchronous CLUSTER SLOTS),
 * ASK once with ASKING, TRYAGAIN after 20 ms, at most 5 redirections per
 * command, after which the decision fails as a store error
 * (docs/async.md, "Redis Cluster").  Each decision is one EVALSHA of the
 * step script (NOSCRIPT: SCRIPT LOAD on that connection and the EVALSHA
 * again; a second NOSCRIPT: EVAL), or, for a request the
 * script declines, a load (HMGET) and compare-and-set script, retried on
 * a conflict; its deadline is its start plus command_timeout_ns, kept by
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
 * `loop` is copied; the loop itself must outlive the store.  Creation
 * calls loop->timer_new (the store's one timer) on the calling thread:
 * call it on the loop's thread, or before the loop runs (libuv's and
 * libevent's handles are not to be made while another thread runs their
 * loop).  Every
 * callback runs on the loop's thread; rate_store_free, on that thread and
 * not from inside one of the store's callbacks, completes every decision
 * in flight, on every node (RATE_ECANCELED), before it returns.
 * Returns RATE_OK and *out, or RATE_EINVAL (NULL out, url or loop, a loop
 * table missing a function, a bad URL or option, with err), RATE_ENOMEM,
 * or rate_store_redis_new's errors (a cluster with a database other than
 * 0 is its RATE_EINVAL).
 * Thread-safe: creation yes; the store: the loop's thread only. */
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
} rate_redis_async_stats_t;

/* RATE_OK and *out, or RATE_EINVAL (NULL out, or a store that is not an
 * asynchronous Redis store). */
RATE_API int rate_store_redis_async_stats(rate_store_t *store,
                                          rate_redis_async_stats_t *out);

#ifdef __cplusplus
}
#endif
#endif /* RATELIMIT_LOOP_H */
