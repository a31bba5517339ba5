/* SPDX-License-Identifier: MIT */
/*
 * A rate_loop_t whose timers and watch the test fires itself (no real
 * event loop): the tests of the fair limit's asynchronous waiting form.
 * HAND_LOOP_TIMERS timers at most (define it before including: 512).
 */
#ifndef RATE_TEST_HAND_LOOP_H
#define RATE_TEST_HAND_LOOP_H

#include <stdbool.h>
#include <string.h>

#include "ratelimit_loop.h"

#ifndef HAND_LOOP_TIMERS
#define HAND_LOOP_TIMERS 512
#endif

typedef struct ttimer {
    rate_loop_timer_fn fn;
    void *arg;
    bool used, armed;
} ttimer_t;

typedef struct tloop {
    ttimer_t t[HAND_LOOP_TIMERS];
    rate_loop_io_fn io_fn; /* the watch's, while there is one */
    void *io_arg;
} tloop_t;

static void *io_new(void *ud, int fd, rate_loop_io_fn fn, void *arg)
{
    tloop_t *l = ud;
    (void)fd;
    l->io_fn = fn;
    l->io_arg = arg;
    return l;
}

static int io_set(void *ud, void *io, unsigned ev)
{
    (void)ud;
    (void)io;
    (void)ev;
    return 0;
}

static void io_free(void *ud, void *io)
{
    (void)io;
    ((tloop_t *)ud)->io_fn = NULL;
}

static void *timer_new(void *ud, rate_loop_timer_fn fn, void *arg)
{
    tloop_t *l = ud;
    for (int i = 0; i < HAND_LOOP_TIMERS; i++)
        if (!l->t[i].used) {
            l->t[i] = (ttimer_t){fn, arg, true, false};
            return &l->t[i];
        }
    return NULL;
}

static int timer_arm(void *ud, void *t, uint64_t ns)
{
    (void)ud;
    (void)ns;
    ((ttimer_t *)t)->armed = true;
    return 0;
}

static void timer_cancel(void *ud, void *t)
{
    (void)ud;
    ((ttimer_t *)t)->armed = false;
}

static void timer_free(void *ud, void *t)
{
    (void)ud;
    memset(t, 0, sizeof(ttimer_t));
}

/* The loop's table over l. */
static inline rate_loop_t loop_of(tloop_t *l)
{
    return (rate_loop_t){.ud = l, .io_new = io_new, .io_set = io_set,
                         .io_free = io_free, .timer_new = timer_new,
                         .timer_arm = timer_arm, .timer_cancel = timer_cancel,
                         .timer_free = timer_free};
}

#endif /* RATE_TEST_HAND_LOOP_H */
