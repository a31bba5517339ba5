/* SPDX-License-Identifier: MIT */
/*
 * Fair shares (docs/fair.md): a review's regressions, each a defect found
 * by attacking the fair table: virtual time over long runs; a process
 * killed while its waiter was the next one.
 */
#include "lib/helpers.h"
#include "lib/wait.h"

#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ratelimit_fair.h"

/* A flow far ahead of V keeps being ahead however long the run: its
 * virtual service must not wrap around 2^64 (it did: a flow admitted
 * 2^64 / 2^20 permits more than another active flow, at weight 1, came
 * back below V, was taken for the most owed flow and took the other's
 * reserve; the active heap, sifted down only, lost its order). */
static void vtime_no_wrap(void **s)
{
    (void)s;
    const uint64_t L = UINT64_C(1) << 42; /* the shared limit, per second */
    char pol[128];
    snprintf(pol, sizeof pol, "token-bucket %llu/s burst=%llu",
             (unsigned long long)L, (unsigned long long)L);
    rate_limiter_t *lim = limiter_of(pol, NULL);
    rate_fair_config_t fc = {.limiter = lim, .key = "shared", .key_len = 6};
    rate_fair_t *f = NULL;
    assert_int_equal(rate_fair_new(&fc, &f, NULL, 0), RATE_OK);
    rate_decision_t d;
    /* Each second the light flow asks a quarter of the limit and the
     * heavy one half: both admitted; the heavy flow's lead over V grows
     * by 2^60 a second (past 2^64 in the 17th).  From the third second
     * on, the heavy flow, far ahead, first asks the whole limit: denied,
     * the light flow's reserve kept, however long the run. */
    for (uint64_t i = 0; i < 40; i++) {
        uint64_t t = i * SEC;
        if (i >= 2) {
            assert_int_equal(rate_fair_check_at(f, "heavy", 5, 1, L, t, &d),
                             RATE_OK);
            if (d.allowed)
                fail_msg("second %llu: the heavy flow took the whole limit",
                         (unsigned long long)i);
            assert_int_equal(d.reason, RATE_REASON_LIMITED);
        }
        assert_int_equal(rate_fair_check_at(f, "light", 5, 1, L / 4, t + 1, &d),
                         RATE_OK);
        assert_true(d.allowed);
        assert_int_equal(rate_fair_check_at(f, "heavy", 5, 1, L / 2, t + 2,
                                            &d), RATE_OK);
        assert_true(d.allowed);
    }
    rate_fair_free(f);
    rate_limiter_free(lim);
}

typedef struct waiter_arg {
    rate_fair_t *f;
    int rc;
    rate_decision_t d;
} waiter_arg_t;

static void *wait_b(void *p)
{
    waiter_arg_t *a = p;
    a->rc = rate_fair_acquire(a->f, "b", 1, 1, 1, 30 * SEC, &a->d);
    return NULL;
}

/* Waits until the table holds n waiters. */
static void until_waiting(rate_fair_t *f, uint64_t n)
{
    rate_fair_stats_t st = {0};
    if (WAIT_UNTIL(rate_fair_stats(f, &st) == RATE_OK && st.waiting == n,
                   TEST_WAIT_S))
        return;
    fail_msg("never %llu waiters (%llu)", (unsigned long long)n,
             (unsigned long long)st.waiting);
}

/* On a table shared by processes, the next waiter's process is killed:
 * the waiter behind it, in another process, must not sleep until its
 * deadline (it did: only the next waiter asks the shared limit, and
 * nothing woke the one behind, which was then denied at its deadline
 * although the limit had room for it 1 s after the kill). */
static void dead_next_waiter(void **s)
{
    (void)s;
    char path[] = "/tmp/rate-fair-review-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    unlink(path);
    rate_limiter_t *lim = limiter_of("token-bucket 1/s burst=3", NULL);
    rate_fair_config_t fc = {.limiter = lim, .key = "shared", .key_len = 6,
                             .shm_path = path};
    rate_fair_t *f = NULL;
    char err[256] = "";
    if (rate_fair_new(&fc, &f, err, sizeof err) != RATE_OK)
        fail_msg("rate_fair_new: %s", err);
    assert_true(rate_try_acquire_len(lim, "shared", 6, 3)); /* drained */
    pid_t a = fork();
    assert_true(a >= 0);
    if (a == 0) { /* the next waiter: 3 permits (3 s), weight 4 */
        rate_decision_t d;
        rate_fair_acquire(f, "a", 1, 4, 3, 60 * SEC, &d);
        _exit(0);
    }
    until_waiting(f, 1);
    waiter_arg_t b = {.f = f};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, wait_b, &b), 0);
    until_waiting(f, 2);
    kill(a, SIGKILL);
    int st = 0;
    assert_int_equal(waitpid(a, &st, 0), a);
    pthread_join(th, NULL);
    assert_int_equal(b.rc, RATE_OK);
    assert_true(b.d.allowed); /* within 30 s: the limit refills in 1 */
    rate_fair_free(f);
    unlink(path);
    rate_limiter_free(lim);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(vtime_no_wrap),
        cmocka_unit_test(dead_next_waiter),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
