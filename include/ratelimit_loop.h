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
 * (io_free): the adapter must then call nothing more for it.  An adapter
 * may call it for RATE_LOOP_WRITE without asking the kernel, on a
 * descriptor that was writable before (nginx's posts it to the end of the
 * turn): the store's write may then find EAGAIN, and it keeps WRITE
 * watched, which the adapter then waits for as level-triggered. */
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

    /* NULL: room for later optional functions (an adapter zeroes the
     * table first; a non-NULL one is refused with RATE_EINVAL). */
    void *reserved[4];
} rate_loop_t;

#ifdef __cplusplus
}
#endif
#endif /* RATELIMIT_LOOP_H */
