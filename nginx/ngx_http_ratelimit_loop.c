/* SPDX-License-Identifier: MIT */
/*
 * A rate_loop_t over nginx's own event loop (ngx_event), for the
 * asynchronous Redis store of a store=redis:// zone (docs/nginx.md,
 * docs/async.md).  One per worker, made at init_process; everything runs
 * on the worker's only thread.
 *
 * A watch is an nginx connection taken with ngx_get_connection for the
 * store's descriptor (hiredis's socket), its read event added and deleted
 * level-triggered as the store asks.  Write interest on a socket that has
 * been writable once is a posted event instead: nginx runs it at the end
 * of the turn, after every request read in the turn has queued its
 * command, so a turn's commands go out in one write and no epoll_ctl.
 * Only a write that does not finish (the store still watches WRITE after
 * its callback) adds the level-triggered write event, until the store
 * drops it (docs/internals/nginx.md, "Redis zones").  hiredis closes the
 * descriptor itself: the connection is given back with fd = -1.  A timer
 * is an ngx_event_t on nginx's timer tree, in milliseconds rounded up.
 */
#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_event.h>

#include "ngx_http_ratelimit_loop.h"

typedef struct {
    ngx_connection_t *c;
    unsigned events; /* what the store watches */
    rate_loop_io_fn fn;
    void *arg;
    /* The socket was reported writable once (a connect in progress waits
     * for the kernel; after that, write interest is posted). */
    unsigned writable : 1;
    unsigned in_write : 1; /* inside fn for a write */
    unsigned freed : 1;    /* io_free'd inside it: freed after it */
} ngx_http_ratelimit_io_t;

typedef struct {
    ngx_event_t ev;
    rate_loop_timer_fn fn;
    void *arg;
} ngx_http_ratelimit_timer_t;

static void ngx_http_ratelimit_read_handler(ngx_event_t *ev) {
    ngx_connection_t *c = ev->data;
    ngx_http_ratelimit_io_t *io = c->data;

    /* The store may free the watch (and so c) from inside fn. */
    io->fn(io->arg, RATE_LOOP_READ);
}

/* Brings the write event in line with what the store watches after a
 * write callback: a write that did not finish (EAGAIN: Redis reads
 * slowly, a connect in progress) waits for the kernel's readiness,
 * level-triggered; one that did drops it. */
static void ngx_http_ratelimit_write_settle(ngx_http_ratelimit_io_t *io) {
    ngx_event_t *wev = io->c->write;

    if (io->events & RATE_LOOP_WRITE) {
        if (wev->active) {
            return;
        }
        /* (tests/nginx_redis_slow_test.sh looks for this line) */
        ngx_log_debug1(NGX_LOG_DEBUG_EVENT, wev->log, 0,
                       "ratelimit: a write to Redis did not finish, "
                       "waiting for fd:%d to be writable",
                       io->c->fd);
        if (ngx_add_event(wev, NGX_WRITE_EVENT, NGX_LEVEL_EVENT) != NGX_OK) {
            /* The loop refused: try again next turn rather than leave
             * the store's bytes unsent. */
            ngx_post_event(wev, &ngx_posted_next_events);
        }
    } else if (wev->active) {
        (void)ngx_del_event(wev, NGX_WRITE_EVENT, 0);
    }
}

/* The write event, posted (the socket was writable before: it is tried)
 * or reported by the kernel. */
static void ngx_http_ratelimit_write_handler(ngx_event_t *ev) {
    ngx_connection_t *c = ev->data;
    ngx_http_ratelimit_io_t *io = c->data;

    if (!(io->events & RATE_LOOP_WRITE)) {
        return; /* dropped meanwhile */
    }
    io->writable = 1;
    io->in_write = 1;
    io->fn(io->arg, RATE_LOOP_WRITE);
    io->in_write = 0;
    if (io->freed) { /* the store let go of the watch inside fn */
        ngx_free(io);
        return;
    }
    ngx_http_ratelimit_write_settle(io);
}

static void *ngx_http_ratelimit_io_new(void *ud, int fd, rate_loop_io_fn fn,
                                       void *arg) {
    ngx_log_t *log = ud;
    ngx_http_ratelimit_io_t *io;
    ngx_connection_t *c;

    io = ngx_calloc(sizeof(*io), log);
    if (io == NULL) {
        return NULL;
    }
    c = ngx_get_connection((ngx_socket_t)fd, log);
    if (c == NULL) {
        ngx_free(io);
        return NULL;
    }
    io->c = c;
    io->fn = fn;
    io->arg = arg;
    c->data = io;
    c->log = log;
    c->read->log = log;
    c->write->log = log;
    c->read->handler = ngx_http_ratelimit_read_handler;
    c->write->handler = ngx_http_ratelimit_write_handler;
    return io;
}

static int ngx_http_ratelimit_io_set(void *ud, void *p, unsigned events) {
    ngx_http_ratelimit_io_t *io = p;
    unsigned diff = io->events ^ events;
    ngx_int_t rc = NGX_OK;

    (void)ud;
    if (diff & RATE_LOOP_READ) {
        rc = (events & RATE_LOOP_READ)
                 ? ngx_add_event(io->c->read, NGX_READ_EVENT, NGX_LEVEL_EVENT)
                 : ngx_del_event(io->c->read, NGX_READ_EVENT, 0);
        if (rc != NGX_OK) {
            return -1;
        }
        io->events ^= RATE_LOOP_READ;
    }
    if (diff & RATE_LOOP_WRITE) {
        ngx_event_t *wev = io->c->write;

        if (io->in_write) {
            /* inside the write callback: settled after it */
        } else if (!(events & RATE_LOOP_WRITE)) {
            if (wev->posted) {
                ngx_delete_posted_event(wev);
            }
            if (wev->active &&
                ngx_del_event(wev, NGX_WRITE_EVENT, 0) != NGX_OK) {
                return -1;
            }
        } else if (io->writable) {
            /* Run at the end of this turn, after the other requests
             * read in it have queued their commands: one write. */
            ngx_post_event(wev, &ngx_posted_events);
        } else if (ngx_add_event(wev, NGX_WRITE_EVENT, NGX_LEVEL_EVENT) !=
                   NGX_OK) {
            return -1;
        }
        io->events ^= RATE_LOOP_WRITE;
    }
    return 0;
}

static void ngx_http_ratelimit_io_free(void *ud, void *p) {
    ngx_http_ratelimit_io_t *io = p;
    ngx_connection_t *c = io->c;

    (void)ud;
    if (c->read->active) {
        (void)ngx_del_event(c->read, NGX_READ_EVENT, 0);
    }
    if (c->write->active) {
        (void)ngx_del_event(c->write, NGX_WRITE_EVENT, 0);
    }
    if (c->read->posted) {
        ngx_delete_posted_event(c->read);
    }
    if (c->write->posted) {
        ngx_delete_posted_event(c->write);
    }
    /* As ngx_close_connection, without the close: hiredis closes the
     * descriptor after this; fd -1 marks any event of it still reported
     * in this turn as stale. */
    ngx_free_connection(c);
    c->fd = (ngx_socket_t)-1;
    io->events = 0;
    if (io->in_write) {
        io->freed = 1; /* the write handler frees it once fn returns */
        return;
    }
    ngx_free(io);
}

static void ngx_http_ratelimit_timer_handler(ngx_event_t *ev) {
    ngx_http_ratelimit_timer_t *t = ev->data;

    ev->timedout = 0;
    t->fn(t->arg);
}

static void *ngx_http_ratelimit_timer_new(void *ud, rate_loop_timer_fn fn,
                                          void *arg) {
    ngx_log_t *log = ud;
    ngx_http_ratelimit_timer_t *t;

    t = ngx_calloc(sizeof(*t), log);
    if (t == NULL) {
        return NULL;
    }
    t->fn = fn;
    t->arg = arg;
    t->ev.handler = ngx_http_ratelimit_timer_handler;
    t->ev.data = t;
    t->ev.log = log;
    /* Not cancelable: a graceful shutdown waits for the decisions in
     * flight (at most the zone's timeout), so that their requests are
     * answered.  The store arms the timer only while some are. */
    t->ev.cancelable = 0;
    return t;
}

static int ngx_http_ratelimit_timer_arm(void *ud, void *p, uint64_t after_ns) {
    ngx_http_ratelimit_timer_t *t = p;
    uint64_t ms = after_ns / 1000000 + (after_ns % 1000000 != 0);

    (void)ud;
    /* ngx_add_timer keeps an armed timer that would move by less than
     * NGX_TIMER_LAZY_DELAY: disarm first, so that the arming is exact.
     * (nginx's cached time may make it fire up to a turn early: the store
     * then finds nothing due and arms it again.) */
    if (t->ev.timer_set) {
        ngx_del_timer(&t->ev);
    }
    if (ms > 86400000) {
        ms = 86400000;
    }
    ngx_add_timer(&t->ev, (ngx_msec_t)ms);
    return 0;
}

static void ngx_http_ratelimit_timer_cancel(void *ud, void *p) {
    ngx_http_ratelimit_timer_t *t = p;

    (void)ud;
    if (t->ev.timer_set) {
        ngx_del_timer(&t->ev);
    }
}

static void ngx_http_ratelimit_timer_free(void *ud, void *p) {
    ngx_http_ratelimit_timer_t *t = p;

    ngx_http_ratelimit_timer_cancel(ud, p);
    if (t->ev.posted) {
        ngx_delete_posted_event(&t->ev);
    }
    ngx_free(t);
}

void ngx_http_ratelimit_loop_init(rate_loop_t *loop, ngx_log_t *log) {
    ngx_memzero(loop, sizeof(*loop));
    loop->ud = log;
    loop->io_new = ngx_http_ratelimit_io_new;
    loop->io_set = ngx_http_ratelimit_io_set;
    loop->io_free = ngx_http_ratelimit_io_free;
    loop->timer_new = ngx_http_ratelimit_timer_new;
    loop->timer_arm = ngx_http_ratelimit_timer_arm;
    loop->timer_cancel = ngx_http_ratelimit_timer_cancel;
    loop->timer_free = ngx_http_ratelimit_timer_free;
    loop->now = NULL; /* CLOCK_MONOTONIC: the store's deadlines are exact */
}
