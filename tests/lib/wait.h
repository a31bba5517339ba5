/* SPDX-License-Identifier: MIT */
/*
 * Waiting on a condition, never on time (header-only, static).  A suite
 * that needs something to have happened (a server answering, a key
 * written, a callback run) polls for it with wait_until(): it returns as
 * soon as the condition holds, so a fast machine waits little, and gives
 * up only at a deadline generous enough for a machine loaded far past its
 * cores (TEST_WAIT_S).  A bound the product promises is asserted apart,
 * with its slack stated where it is asserted (docs/contributing.md,
 * "Waiting in tests").
 */
#ifndef TEST_LIB_WAIT_H
#define TEST_LIB_WAIT_H

#include <stdbool.h>
#include <stdint.h>
#include <time.h>

/* How long a wait for something that must happen may last before the
 * test gives up: long, because giving up is a failure, not a measure. */
#define TEST_WAIT_S 60

static inline uint64_t test_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Calls cond(ud) until it is true (true) or `timeout_s` seconds have
 * passed (false; cond is called once more at the deadline).  The pause
 * between calls starts at 1 ms and doubles up to 50 ms. */
static inline bool wait_until(bool (*cond)(void *), void *ud,
                              unsigned timeout_s)
{
    uint64_t deadline = test_now_ns() + (uint64_t)timeout_s * 1000000000u;
    long pause_ns = 1000000;
    for (;;) {
        if (cond(ud))
            return true;
        if (test_now_ns() >= deadline)
            return cond(ud);
        struct timespec ts = {0, pause_ns};
        nanosleep(&ts, NULL);
        if (pause_ns < 50000000)
            pause_ns *= 2;
    }
}

/* The same for an expression: WAIT_UNTIL(atomic_load(&done) == n, 10). */
#define WAIT_UNTIL(expr, timeout_s)                                         \
    __extension__({                                                         \
        uint64_t wu_deadline_ =                                             \
            test_now_ns() + (uint64_t)(timeout_s) * 1000000000u;            \
        long wu_pause_ = 1000000;                                           \
        bool wu_ok_;                                                        \
        while (!(wu_ok_ = (expr)) && test_now_ns() < wu_deadline_) {        \
            struct timespec wu_ts_ = {0, wu_pause_};                        \
            nanosleep(&wu_ts_, NULL);                                       \
            if (wu_pause_ < 50000000)                                       \
                wu_pause_ *= 2;                                             \
        }                                                                   \
        wu_ok_ || (expr);                                                   \
    })

#endif
