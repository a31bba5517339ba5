/* SPDX-License-Identifier: MIT */
/*
 * ratelimit_event.h -- a rate_loop_t over a libevent event_base
 * (header-only: include it in the program that has libevent, link with
 * -levent_core; the library itself does not depend on libevent; every
 * function here is static inline, so a program that includes it and never
 * calls rate_loop_event needs no -levent_core).  Debian: libevent-dev.
 *
 *   rate_loop_t loop;
 *   rate_loop_event(&loop, base);
 *   rate_store_redis_async_new(url, NULL, &loop, &store, err, sizeof err);
 *
 * A watch is two persistent events (read, write) added and deleted as the
 * store asks; a timer is an evtimer (microsecond resolution).  Everything
 * is freed at once (event_free), so no extra turn of the loop is needed.
 */
#ifndef RATELIMIT_EVENT_H
#define RATELIMIT_EVENT_H

#include <stdlib.h>
#include <string.h>
#include <event2/event.h>

#include "ratelimit_loop.h"

typedef struct rate_ev_io_ {
    struct event *rd, *wr;
    unsigned events;
    rate_loop_io_fn fn;
    void *arg;
} rate_ev_io_;

typedef struct rate_ev_timer_ {
    struct event *ev;
    rate_loop_timer_fn fn;
    void *arg;
} rate_ev_timer_;

static inline void rate_ev_io_cb_(evutil_socket_t fd, short what, void *arg)
{
    rate_ev_io_ *p = (rate_ev_io_ *)arg;
    (void)fd;
    p->fn(p->arg, ((what & EV_READ) ? RATE_LOOP_READ : 0) |
                      ((what & EV_WRITE) ? RATE_LOOP_WRITE : 0));
}

static inline void rate_ev_io_free_(void *ud, void *io)
{
    rate_ev_io_ *p = (rate_ev_io_ *)io;
    (void)ud;
    if (p->rd != NULL)
        event_free(p->rd);
    if (p->wr != NULL)
        event_free(p->wr);
    free(p);
}

static inline void *rate_ev_io_new_(void *ud, int fd, rate_loop_io_fn fn,
                                    void *arg)
{
    rate_ev_io_ *p = (rate_ev_io_ *)calloc(1, sizeof *p);
    if (p == NULL)
        return NULL;
    p->fn = fn;
    p->arg = arg;
    p->rd = event_new((struct event_base *)ud, fd, EV_READ | EV_PERSIST,
                      rate_ev_io_cb_, p);
    p->wr = event_new((struct event_base *)ud, fd, EV_WRITE | EV_PERSIST,
                      rate_ev_io_cb_, p);
    if (p->rd == NULL || p->wr == NULL) {
        rate_ev_io_free_(ud, p);
        return NULL;
    }
    return p;
}

static inline int rate_ev_io_set_(void *ud, void *io, unsigned events)
{
    rate_ev_io_ *p = (rate_ev_io_ *)io;
    unsigned diff = p->events ^ events;
    int rc = 0;
    (void)ud;
    if (diff & RATE_LOOP_READ)
        rc |= (events & RATE_LOOP_READ) ? event_add(p->rd, NULL)
                                        : event_del(p->rd);
    if (diff & RATE_LOOP_WRITE)
        rc |= (events & RATE_LOOP_WRITE) ? event_add(p->wr, NULL)
                                         : event_del(p->wr);
    p->events = events;
    return rc == 0 ? 0 : -1;
}

static inline void rate_ev_timer_cb_(evutil_socket_t fd, short what, void *arg)
{
    rate_ev_timer_ *t = (rate_ev_timer_ *)arg;
    (void)fd;
    (void)what;
    t->fn(t->arg);
}

static inline void *rate_ev_timer_new_(void *ud, rate_loop_timer_fn fn,
                                       void *arg)
{
    rate_ev_timer_ *t = (rate_ev_timer_ *)calloc(1, sizeof *t);
    if (t == NULL)
        return NULL;
    t->fn = fn;
    t->arg = arg;
    t->ev = evtimer_new((struct event_base *)ud, rate_ev_timer_cb_, t);
    if (t->ev == NULL) {
        free(t);
        return NULL;
    }
    return t;
}

static inline int rate_ev_timer_arm_(void *ud, void *timer, uint64_t after_ns)
{
    rate_ev_timer_ *t = (rate_ev_timer_ *)timer;
    uint64_t us = after_ns / 1000 + (after_ns % 1000 != 0);
    struct timeval tv;
    (void)ud;
    tv.tv_sec = (time_t)(us / 1000000);
    tv.tv_usec = (suseconds_t)(us % 1000000);
    return evtimer_add(t->ev, &tv) == 0 ? 0 : -1;
}

static inline void rate_ev_timer_cancel_(void *ud, void *timer)
{
    (void)ud;
    evtimer_del(((rate_ev_timer_ *)timer)->ev);
}

static inline void rate_ev_timer_free_(void *ud, void *timer)
{
    rate_ev_timer_ *t = (rate_ev_timer_ *)timer;
    (void)ud;
    event_free(t->ev);
    free(t);
}

/* Fills *out for `base`, which must outlive every store made with it. */
static inline void rate_loop_event(rate_loop_t *out, struct event_base *base)
{
    memset(out, 0, sizeof *out);
    out->ud = base;
    out->io_new = rate_ev_io_new_;
    out->io_set = rate_ev_io_set_;
    out->io_free = rate_ev_io_free_;
    out->timer_new = rate_ev_timer_new_;
    out->timer_arm = rate_ev_timer_arm_;
    out->timer_cancel = rate_ev_timer_cancel_;
    out->timer_free = rate_ev_timer_free_;
    out->now = NULL;
}

#endif /* RATELIMIT_EVENT_H */
