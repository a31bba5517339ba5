/* SPDX-License-Identifier: MIT */
/*
 * What the asynchronous tests (test_async.c, test_async_cluster.c) share:
 * a loop that is libuv's or libevent's (the header-only adapters), the
 * decisions they start and count, a fake clock, limiters.
 */
#ifndef TEST_ASYNC_LOOP_H
#define TEST_ASYNC_LOOP_H

#include <stdbool.h>
#include <string.h>

#include <event2/event.h>
#include <uv.h>

#include <ratelimit_event.h>
#include <ratelimit_loop.h>
#include <ratelimit_uv.h>

#include "helpers.h"
#include "ratelimit_redis.h"

static int pending; /* callbacks still to come */

typedef struct tloop {
    rate_loop_t loop;
    bool uv;
    uv_loop_t uvl;
    struct event_base *base;
} tloop_t;

static void tloop_init(tloop_t *t, bool uv)
{
    memset(t, 0, sizeof *t);
    t->uv = uv;
    pending = 0;
    if (uv) {
        assert_int_equal(uv_loop_init(&t->uvl), 0);
        rate_loop_uv(&t->loop, &t->uvl);
    } else {
        t->base = event_base_new();
        assert_non_null(t->base);
        rate_loop_event(&t->loop, t->base);
    }
}

/* One turn: waits for an event (a socket or a timer). */
static void tloop_turn(tloop_t *t)
{
    if (t->uv)
        uv_run(&t->uvl, UV_RUN_ONCE);
    else
        event_base_loop(t->base, EVLOOP_ONCE);
}

/* One turn that does not wait. */
static inline void tloop_nowait(tloop_t *t)
{
    if (t->uv)
        uv_run(&t->uvl, UV_RUN_NOWAIT);
    else
        event_base_loop(t->base, EVLOOP_NONBLOCK);
}

/* After the stores are freed: nothing may be left on the loop. */
static void tloop_fini(tloop_t *t)
{
    if (t->uv) {
        uv_run(&t->uvl, UV_RUN_NOWAIT); /* the closed handles' callbacks */
        assert_int_equal(uv_loop_close(&t->uvl), 0);
    } else {
        assert_int_equal(event_base_get_num_events(t->base,
                                                   EVENT_BASE_COUNT_ADDED),
                         0);
        event_base_free(t->base);
    }
}

typedef struct req {
    int calls;
    int rc;
    int key; /* the test's index of its key (kept by start_at) */
    rate_decision_t d;
    uint64_t started, ended;
} req_t;

/* When set: what the store said failed (rate_store_redis_last_error) at
 * the first callback with a store error, read inside that callback. */
static rate_store_t *why_of;
static char first_why[256];

static void on_decided(void *ud, int rc, const rate_decision_t *d)
{
    req_t *q = ud;
    if (why_of != NULL && first_why[0] == '\0' &&
        d->reason == RATE_REASON_STORE_ERROR &&
        rate_store_redis_last_error(why_of, first_why, sizeof first_why) !=
            RATE_OK)
        first_why[0] = '?';
    q->calls++;
    q->rc = rc;
    q->d = *d;
    q->ended = rate_clock_monotonic_ns();
    pending--;
}

/* Starts one decision of n permits (at the limiter's clock, or at `at`
 * when it is not 0); RATE_OK (decided: q filled now) or RATE_PENDING. */
static int start_at(rate_limiter_t *l, const char *key, uint64_t n, req_t *q,
                    uint64_t at)
{
    int k = q->key;
    memset(q, 0, sizeof *q);
    q->key = k;
    q->started = rate_clock_monotonic_ns();
    int rc = at != 0 ? rate_limiter_check_start_at(l, key, strlen(key), n, 0,
                                                   at, &q->d, on_decided, q)
                     : rate_limiter_check_start(l, key, strlen(key), n, 0,
                                                &q->d, on_decided, q);
    if (rc == RATE_PENDING)
        pending++;
    else if (rc == RATE_OK)
        q->calls = 1, q->ended = q->started; /* counted as its one answer */
    return rc;
}

static void wait_all(tloop_t *t)
{
    while (pending > 0)
        tloop_turn(t);
}

static fake_clock_t fclock; /* the fake clock of lim(..., true, ...) */
static const rate_clock_t fake = {fake_now, fake_sleep, &fclock};

static rate_limiter_t *lim(const char *text, rate_store_t *s, bool fake_time,
                           rate_fail_mode_t fm)
{
    rate_limiter_config_t cfg = {0};
    cfg.store = s;
    cfg.clock = fake_time ? &fake : NULL;
    cfg.on_store_error = fm;
    return limiter_cfg(text, cfg);
}

#endif
