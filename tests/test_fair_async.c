/* SPDX-License-Identifier: MIT */
/*
 * The asynchronous waiting form of fair shares (rate_fair_acquire_start,
 * docs/fair.md) on a libuv loop: issue 31's property 5 (a light flow's
 * wait is bounded by its share: it never waits behind a heavy flow's
 * queue; every waiter is answered by its deadline, by the loop's timer,
 * with nothing else arriving), a thread's waiters and the loop's sharing
 * one table, answers at once, bad input, and freeing with waiters.
 * Orders are counted, not timed; the deadline checks have a stated slack.
 */
#include "lib/helpers.h"

#include <pthread.h>
#include <string.h>

#include <uv.h>

#include "ratelimit_fair.h"
#include "ratelimit_uv.h"

#define ORDER_MAX 128

typedef struct rec {
    int calls, admitted, denied, rc;
    char order[ORDER_MAX]; /* the flows' tags in the order admitted */
    int n;
    uint64_t answered_ns[ORDER_MAX];
} rec_t;

typedef struct ask {
    rec_t *rec;
    char tag;
    uint64_t deadline_ns;
} ask_t;

static void on_done(void *ud, int rc, const rate_decision_t *d)
{
    ask_t *a = ud;
    rec_t *r = a->rec;
    r->calls++;
    r->rc = rc;
    if (rc == RATE_OK && d->allowed) {
        r->admitted++;
        if (r->n < ORDER_MAX)
            r->order[r->n++] = a->tag;
    } else {
        if (r->denied < ORDER_MAX)
            r->answered_ns[r->denied] = rate_clock_monotonic_ns();
        r->denied++;
    }
}

static rate_limiter_t *lim_of(const char *text)
{
    rate_policy_t *p = NULL;
    assert_int_equal(rate_policy_parse(text, &p, NULL, 0), RATE_OK);
    rate_limiter_config_t c = {.policy = p};
    rate_limiter_t *lim = NULL;
    assert_int_equal(rate_limiter_new(&c, &lim), RATE_OK);
    rate_policy_free(p);
    return lim;
}

static rate_fair_t *fair_of(rate_limiter_t *lim, unsigned queue_max)
{
    rate_fair_config_t fc = {.limiter = lim, .key = "shared", .key_len = 6,
                             .queue_max = queue_max};
    rate_fair_t *f = NULL;
    char err[256] = "";
    if (rate_fair_new(&fc, &f, err, sizeof err) != RATE_OK)
        fail_msg("rate_fair_new: %s", err);
    return f;
}

/* Runs the loop until `want` callbacks came, failing after a generous
 * 60 s (a lost waiter would otherwise hang the suite). */
static void run_until(uv_loop_t *l, const rec_t *r, int want)
{
    uint64_t limit = rate_clock_monotonic_ns() + 60 * SEC;
    while (r->calls < want) {
        if (rate_clock_monotonic_ns() > limit)
            fail_msg("%d of %d answers after 60 s", r->calls, want);
        uv_run(l, UV_RUN_ONCE);
    }
}

static void start(rate_fair_t *f, rate_loop_t *loop, ask_t *a,
                  const char *flow, uint64_t max_wait, int *pending)
{
    rate_decision_t d;
    int rc = rate_fair_acquire_start(f, loop, flow, strlen(flow), 1, 1,
                                     max_wait, &d, on_done, a);
    if (rc == RATE_OK)
        on_done(a, RATE_OK, &d); /* answered at once */
    else
        assert_int_equal(rc, RATE_PENDING);
    *pending += rc == RATE_PENDING;
}

/* Property 5, the share: a heavy flow queues 30 waiters on 100/s (burst
 * 1), then a light flow queues one; the light one is admitted after at
 * most 2 of the heavy one's (its head's finish time is the smallest once
 * the heavy flow's service passes it), not after the heavy queue. */
static void light_not_behind_heavy(void **s)
{
    (void)s;
    uv_loop_t l;
    assert_int_equal(uv_loop_init(&l), 0);
    rate_loop_t loop;
    rate_loop_uv(&loop, &l);
    rate_limiter_t *lim = lim_of("token-bucket 100/s burst=1");
    rate_fair_t *f = fair_of(lim, 64);
    rec_t r = {0};
    ask_t heavy = {&r, 'H', 0}, light = {&r, 'L', 0};
    int pending = 0;
    for (int i = 0; i < 30; i++)
        start(f, &loop, &heavy, "heavy", 20 * SEC, &pending);
    start(f, &loop, &light, "light", 20 * SEC, &pending);
    run_until(&l, &r, 31);
    assert_int_equal(r.admitted, 31);
    const char *at = memchr(r.order, 'L', (size_t)r.n);
    assert_non_null(at);
    if (at - r.order > 3)
        fail_msg("the light flow was admitted %dth, after %d heavy ones",
                 (int)(at - r.order) + 1, (int)(at - r.order));
    rate_fair_free(f);
    rate_limiter_free(lim);
    uv_run(&l, UV_RUN_NOWAIT);
    assert_int_equal(uv_loop_close(&l), 0);
}

/* Property 5, the deadlines: the shared limit (1 per 5 s, its one permit
 * taken) admits no one for 5 s; a first waiter (deadline 60 s) is
 * queued, then 5 waiters with deadlines of 50 to 250 ms, who queue
 * behind it; each is answered, denied, at or after its own deadline,
 * with no other request arriving (the loop's timers; slack: 10 s late).
 * Freeing the fair limit then answers the first (RATE_ECANCELED). */
static void answered_at_deadline(void **s)
{
    (void)s;
    uv_loop_t l;
    assert_int_equal(uv_loop_init(&l), 0);
    rate_loop_t loop;
    rate_loop_uv(&loop, &l);
    rate_limiter_t *lim = lim_of("token-bucket 1/5s burst=1");
    rate_fair_t *f = fair_of(lim, 16);
    assert_true(rate_fair_try_acquire(f, "first", 5, 1, 1));
    rec_t r = {0}, rb = {0};
    ask_t a[5], blocker = {&rb, 'b', 0};
    int pending = 0;
    start(f, &loop, &blocker, "blocker", 60 * SEC, &pending);
    assert_int_equal(pending, 1);
    pending = 0;
    uint64_t t0 = rate_clock_monotonic_ns();
    for (int i = 0; i < 5; i++) {
        a[i] = (ask_t){&r, (char)('a' + i), t0 + (uint64_t)(i + 1) * 50000000u};
        char flow[8];
        snprintf(flow, sizeof flow, "f%d", i % 2);
        start(f, &loop, &a[i], flow, (uint64_t)(i + 1) * 50000000u, &pending);
    }
    assert_int_equal(pending, 5);
    rate_fair_stats_t st;
    assert_int_equal(rate_fair_stats(f, &st), RATE_OK);
    assert_int_equal(st.waiting, 6);
    run_until(&l, &r, 5);
    assert_int_equal(r.denied, 5);
    /* answered in deadline order, each at or after its deadline */
    for (int i = 0; i < 5; i++) {
        assert_true(r.answered_ns[i] >= a[i].deadline_ns);
        assert_true(r.answered_ns[i] < a[i].deadline_ns + 10 * SEC);
    }
    assert_int_equal(rate_fair_stats(f, &st), RATE_OK);
    assert_int_equal(st.waiting, 1);
    assert_int_equal(st.timed_out, 5);
    assert_int_equal(rb.calls, 0);
    rate_fair_free(f);
    assert_int_equal(rb.calls, 1);
    assert_int_equal(rb.rc, RATE_ECANCELED);
    rate_limiter_free(lim);
    uv_run(&l, UV_RUN_NOWAIT);
    assert_int_equal(uv_loop_close(&l), 0);
}

/* Threads waiting (rate_fair_acquire) on a heavy flow and the loop's
 * waiters of a light flow on one table: a thread's admission wakes the
 * loop's next waiter (the eventfd), and every request is admitted. */
typedef struct th_arg {
    rate_fair_t *f;
    int got;
} th_arg_t;

static void *heavy_thread(void *p)
{
    th_arg_t *a = p;
    for (int i = 0; i < 8; i++) {
        rate_decision_t d;
        if (rate_fair_acquire(a->f, "heavy", 5, 1, 1, 30 * SEC, &d) ==
                RATE_OK && d.allowed)
            a->got++;
    }
    return NULL;
}

static void threads_and_loop(void **s)
{
    (void)s;
    uv_loop_t l;
    assert_int_equal(uv_loop_init(&l), 0);
    rate_loop_t loop;
    rate_loop_uv(&loop, &l);
    rate_limiter_t *lim = lim_of("token-bucket 50/s burst=1");
    rate_fair_t *f = fair_of(lim, 16);
    th_arg_t ta[3] = {{f, 0}, {f, 0}, {f, 0}};
    pthread_t th[3];
    for (int i = 0; i < 3; i++)
        assert_int_equal(pthread_create(&th[i], NULL, heavy_thread, &ta[i]), 0);
    rec_t r = {0};
    ask_t light = {&r, 'L', 0};
    int pending = 0;
    for (int i = 0; i < 10; i++)
        start(f, &loop, &light, "light", 30 * SEC, &pending);
    run_until(&l, &r, 10);
    for (int i = 0; i < 3; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(ta[i].got, 8);
    }
    assert_int_equal(r.admitted, 10);
    rate_fair_free(f);
    rate_limiter_free(lim);
    uv_run(&l, UV_RUN_NOWAIT);
    assert_int_equal(uv_loop_close(&l), 0);
}

/* Answers at once, bad input named by its code, a full queue, and the
 * fair limit freed with waiters (RATE_ECANCELED to each). */
static void at_once_and_errors(void **s)
{
    (void)s;
    uv_loop_t l;
    assert_int_equal(uv_loop_init(&l), 0);
    rate_loop_t loop;
    rate_loop_uv(&loop, &l);
    rate_limiter_t *lim = lim_of("token-bucket 1/100s burst=1");
    rate_fair_t *f = fair_of(lim, 2);
    rec_t r = {0};
    ask_t a = {&r, 'a', 0};
    rate_decision_t d;
    /* a table with a reserved function set (ratelimit_loop.h: refused) */
    rate_loop_t later = loop;
    later.reserved[1] = &l;
    assert_int_equal(rate_fair_acquire_start(f, &later, "x", 1, 1, 1, SEC, &d,
                                             on_done, &a),
                     RATE_EINVAL);
    assert_int_equal(rate_fair_acquire_start(f, &loop, "x", 1, 1, 1, SEC, &d,
                                             on_done, &a),
                     RATE_OK);
    assert_true(d.allowed);
    assert_int_equal(rate_fair_acquire_start(f, NULL, "x", 1, 1, 1, SEC, &d,
                                             on_done, &a),
                     RATE_EINVAL);
    assert_int_equal(rate_fair_acquire_start(f, &loop, "x", 1, 1, 1, SEC, &d,
                                             NULL, &a),
                     RATE_EINVAL);
    assert_int_equal(rate_fair_acquire_start(f, &loop, "", 0, 1, 1, SEC, &d,
                                             on_done, &a),
                     RATE_EKEY);
    assert_int_equal(rate_fair_acquire_start(f, &loop, "x", 1, 1, 1,
                                             RATE_TIME_MAX + 1, &d, on_done,
                                             &a),
                     RATE_ERANGE);
    /* no wait wanted: denied at once */
    assert_int_equal(rate_fair_acquire_start(f, &loop, "x", 1, 1, 1, 0, &d,
                                             on_done, &a),
                     RATE_OK);
    assert_false(d.allowed);
    /* two wait (queue_max 2), the third is turned away at once */
    assert_int_equal(rate_fair_acquire_start(f, &loop, "x", 1, 1, 1, 200 * SEC,
                                             &d, on_done, &a),
                     RATE_PENDING);
    assert_int_equal(rate_fair_acquire_start(f, &loop, "x", 1, 1, 1, 200 * SEC,
                                             &d, on_done, &a),
                     RATE_PENDING);
    assert_int_equal(rate_fair_acquire_start(f, &loop, "x", 1, 1, 1, 200 * SEC,
                                             &d, on_done, &a),
                     RATE_OK);
    assert_false(d.allowed);
    assert_int_equal(d.reason, RATE_REASON_LIMITED);
    uv_run(&l, UV_RUN_NOWAIT);
    assert_int_equal(r.calls, 0);
    /* a second loop on the same fair limit is refused */
    uv_loop_t l2;
    assert_int_equal(uv_loop_init(&l2), 0);
    rate_loop_t loop2;
    rate_loop_uv(&loop2, &l2);
    assert_int_equal(rate_fair_acquire_start(f, &loop2, "y", 1, 1, 1, SEC, &d,
                                             on_done, &a),
                     RATE_EINVAL);
    assert_int_equal(uv_loop_close(&l2), 0);
    rate_fair_free(f);
    assert_int_equal(r.calls, 2);
    assert_int_equal(r.rc, RATE_ECANCELED);
    rate_limiter_free(lim);
    uv_run(&l, UV_RUN_NOWAIT);
    assert_int_equal(uv_loop_close(&l), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(light_not_behind_heavy),
        cmocka_unit_test(answered_at_deadline),
        cmocka_unit_test(threads_and_loop),
        cmocka_unit_test(at_once_and_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
