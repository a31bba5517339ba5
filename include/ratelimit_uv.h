/* SPDX-License-Identifier: MIT */
/*
 * ratelimit_uv.h -- a rate_loop_t over a libuv loop (header-only: include
 * it in the program that has libuv, link with -luv; the library itself
 * does not depend on libuv; every function here is static inline, so a
 * program that includes it and never calls rate_loop_uv needs no -luv).
 * Debian: libuv1-dev.
 *
 *   rate_loop_t loop;
 *   rate_loop_uv(&loop, uv_default_loop());
 *   rate_store_redis_async_new(url, NULL, &loop, &store, err, sizeof err);
 *
 * Watches are uv_poll_t, timers uv_timer_t (millisecond resolution: a
 * timer is rounded up to the next millisecond).  Their handles are closed
 * with uv_close, so after rate_store_free run the loop once more
 * (uv_run(loop, UV_RUN_NOWAIT)) before uv_loop_close, to free them.
 */
#ifndef RATELIMIT_UV_H
#define RATELIMIT_UV_H

#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "ratelimit_loop.h"

typedef struct rate_uv_io_ {
    uv_poll_t poll;
    rate_loop_io_fn fn;
    void *arg;
} rate_uv_io_;

typedef struct rate_uv_timer_ {
    uv_timer_t timer;
    rate_loop_timer_fn fn;
    void *arg;
} rate_uv_timer_;

static inline void rate_uv_closed_(uv_handle_t *h)
{
    free(h->data);
}

static inline void rate_uv_poll_cb_(uv_poll_t *h, int status, int events)
{
    rate_uv_io_ *p = (rate_uv_io_ *)h->data;
    unsigned ev = 0;
    if (status < 0) /* an error on the socket: let the reader find it */
        ev = RATE_LOOP_READ | RATE_LOOP_WRITE;
    if (events & UV_READABLE)
        ev |= RATE_LOOP_READ;
    if (events & UV_WRITABLE)
        ev |= RATE_LOOP_WRITE;
    p->fn(p->arg, ev);
}

static inline void *rate_uv_io_new_(void *ud, int fd, rate_loop_io_fn fn,
                                    void *arg)
{
    rate_uv_io_ *p = (rate_uv_io_ *)calloc(1, sizeof *p);
    if (p == NULL)
        return NULL;
    if (uv_poll_init((uv_loop_t *)ud, &p->poll, fd) != 0) {
        free(p);
        return NULL;
    }
    p->poll.data = p;
    p->fn = fn;
    p->arg = arg;
    return p;
}

static inline int rate_uv_io_set_(void *ud, void *io, unsigned events)
{
    rate_uv_io_ *p = (rate_uv_io_ *)io;
    int flags = ((events & RATE_LOOP_READ) ? UV_READABLE : 0) |
                ((events & RATE_LOOP_WRITE) ? UV_WRITABLE : 0);
    (void)ud;
    if (flags == 0)
        return uv_poll_stop(&p->poll) == 0 ? 0 : -1;
    return uv_poll_start(&p->poll, flags, rate_uv_poll_cb_) == 0 ? 0 : -1;
}

static inline void rate_uv_io_free_(void *ud, void *io)
{
    rate_uv_io_ *p = (rate_uv_io_ *)io;
    (void)ud;
    uv_poll_stop(&p->poll);
    uv_close((uv_handle_t *)&p->poll, rate_uv_closed_);
}

static inline void rate_uv_timer_cb_(uv_timer_t *h)
{
    rate_uv_timer_ *t = (rate_uv_timer_ *)h->data;
    t->fn(t->arg);
}

static inline void *rate_uv_timer_new_(void *ud, rate_loop_timer_fn fn,
                                       void *arg)
{
    rate_uv_timer_ *t = (rate_uv_timer_ *)calloc(1, sizeof *t);
    if (t == NULL)
        return NULL;
    if (uv_timer_init((uv_loop_t *)ud, &t->timer) != 0) {
        free(t);
        return NULL;
    }
    t->timer.data = t;
    t->fn = fn;
    t->arg = arg;
    return t;
}

static inline int rate_uv_timer_arm_(void *ud, void *timer, uint64_t after_ns)
{
    rate_uv_timer_ *t = (rate_uv_timer_ *)timer;
    uint64_t ms = after_ns / 1000000 + (after_ns % 1000000 != 0);
    (void)ud;
    /* uv_now is the time the loop's turn began: count from the real now */
    uv_update_time(t->timer.loop);
    return uv_timer_start(&t->timer, rate_uv_timer_cb_, ms, 0) == 0 ? 0 : -1;
}

static inline void rate_uv_timer_cancel_(void *ud, void *timer)
{
    (void)ud;
    uv_timer_stop(&((rate_uv_timer_ *)timer)->timer);
}

static inline void rate_uv_timer_free_(void *ud, void *timer)
{
    rate_uv_timer_ *t = (rate_uv_timer_ *)timer;
    (void)ud;
    uv_timer_stop(&t->timer);
    uv_close((uv_handle_t *)&t->timer, rate_uv_closed_);
}

/* Fills *out for `loop`, which must outlive every store made with it. */
static inline void rate_loop_uv(rate_loop_t *out, uv_loop_t *loop)
{
    memset(out, 0, sizeof *out);
    out->ud = loop;
    out->io_new = rate_uv_io_new_;
    out->io_set = rate_uv_io_set_;
    out->io_free = rate_uv_io_free_;
    out->timer_new = rate_uv_timer_new_;
    out->timer_arm = rate_uv_timer_arm_;
    out->timer_cancel = rate_uv_timer_cancel_;
    out->timer_free = rate_uv_timer_free_;
    out->now = NULL;
}

#endif /* RATELIMIT_UV_H */
