/* SPDX-License-Identifier: MIT */
/*
 * Fair shares in memory (docs/fair.md): the regressions of issue 31's
 * second review, each a defect of src/fair/: an asynchronous
 * waiter's record freed while its seat still named it; loops told apart
 * by their ud alone.  White box: this file compiles src/fair/decide.c
 * itself (its definitions take the place of the library's) to reach the
 * table's lock and entries and to hook the path without the lock.
 */
#include "lib/helpers.h"

#include <errno.h>
#include <pthread.h>
#include <unistd.h>

/* The shared limit's bool call, as decide.c makes it, goes through
 * hooked_try: a test runs other decisions inside the path without the
 * lock, between its reading the table and its charging the flow. */
static bool hooked_try(rate_limiter_t *lim, const char *key, size_t len,
                       uint64_t permits, uint64_t now);
#define rate_try_acquire_len_at hooked_try
#include "fair/decide.c"
#include "lib/hand_loop.h"
#undef rate_try_acquire_len_at

static void (*try_hook)(void); /* run once, inside the next bool call */

static bool hooked_try(rate_limiter_t *lim, const char *key, size_t len,
                       uint64_t permits, uint64_t now)
{
    bool ok = rate_try_acquire_len_at(lim, key, len, permits, now);
    void (*hook)(void) = try_hook;
    try_hook = NULL;
    if (hook != NULL)
        hook();
    return ok;
}

/* Another adapter's timer_new: the same loop functions otherwise. */
static void *timer_new_other(void *ud, rate_loop_timer_fn fn, void *arg)
{
    return timer_new(ud, fn, arg);
}

/* Fires every armed timer once (a loop turn). */
static void fire(tloop_t *l)
{
    for (int i = 0; i < HAND_LOOP_TIMERS; i++)
        if (l->t[i].used && l->t[i].armed) {
            l->t[i].armed = false;
            l->t[i].fn(l->t[i].arg);
        }
}

typedef struct answers {
    int calls, rc;
} answers_t;

static void on_answer(void *ud, int rc, const rate_decision_t *d)
{
    answers_t *a = ud;
    (void)d;
    a->calls++;
    a->rc = rc;
}

static void *lock_and_exit(void *p)
{
    pthread_mutex_lock(p); /* robust: its owner ends holding it */
    return NULL;
}

/* Makes the table's (robust) lock unrecoverable: its owner ended holding
 * it, and the next owner left it without making it consistent. */
static void lock_break(pthread_mutex_t *mu)
{
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, lock_and_exit, mu), 0);
    pthread_join(th, NULL);
    assert_int_equal(pthread_mutex_lock(mu), EOWNERDEAD);
    pthread_mutex_unlock(mu);
    assert_int_equal(pthread_mutex_lock(mu), ENOTRECOVERABLE);
}

/* Makes the lock whole again (as a table made again would). */
static void lock_remake(pthread_mutex_t *mu)
{
    pthread_mutexattr_t ma;
    pthread_mutexattr_init(&ma);
    pthread_mutexattr_setrobust(&ma, PTHREAD_MUTEX_ROBUST);
    pthread_mutexattr_setpshared(&ma, PTHREAD_PROCESS_SHARED);
    pthread_mutex_destroy(mu);
    assert_int_equal(pthread_mutex_init(mu, &ma), 0);
    pthread_mutexattr_destroy(&ma);
}

/* The lost-lock tests' start: a fair limit on its own shm table, its one
 * permit taken, and flow "w" waiting on the hand-fired loop. */
typedef struct lost {
    char path[32];
    fake_clock_t clk;
    rate_clock_t ck;
    rate_limiter_t *lim;
    rate_fair_config_t fc;
    tloop_t *l;
    rate_loop_t loop;
    answers_t a;
} lost_t;

static rate_fair_t *lost_start(lost_t *x)
{
    snprintf(x->path, sizeof x->path, "/tmp/rate-fair-mem-XXXXXX");
    int fd = mkstemp(x->path);
    assert_true(fd >= 0);
    close(fd);
    unlink(x->path);
    x->clk = (fake_clock_t){.now = SEC};
    x->ck = (rate_clock_t){.now_ns = fake_now, .sleep_ns = fake_sleep,
                           .ud = &x->clk};
    x->lim = limiter_of("token-bucket 1/s burst=1", NULL);
    x->fc = (rate_fair_config_t){.limiter = x->lim, .key = "shared",
                                 .key_len = 6, .shm_path = x->path,
                                 .clock = &x->ck};
    rate_fair_t *f = NULL;
    char err[256] = "";
    if (rate_fair_new(&x->fc, &f, err, sizeof err) != RATE_OK)
        fail_msg("rate_fair_new: %s", err);
    x->l = calloc(1, sizeof *x->l);
    x->loop = loop_of(x->l);
    x->a = (answers_t){0};
    assert_true(rate_try_acquire_len_at(x->lim, "shared", 6, 1, x->clk.now));
    rate_decision_t d;
    assert_int_equal(rate_fair_acquire_start(f, &x->loop, "w", 1, 1, 1,
                                             10 * SEC, &d, on_answer, &x->a),
                     RATE_PENDING);
    return f;
}

static void lost_end(lost_t *x)
{
    unlink(x->path);
    free(x->l);
    rate_limiter_free(x->lim);
}

/* Finding (a): an asynchronous waiter whose step finds the table's lock
 * unrecoverable is answered RATE_ESTORE; its seat cannot be removed then
 * and still names its record.  The record was freed at once, so a waker
 * that reached the seat later (the lock made whole, the seat next) used
 * freed memory (AddressSanitizer: heap-use-after-free; a plain build
 * crashed or called back twice).  Now the record is kept until the fair
 * limit is freed, and answered once. */
static void async_lock_lost(void **s)
{
    (void)s;
    lost_t x;
    rate_fair_t *f = lost_start(&x);
    rate_decision_t d;
    lock_break(&f->h->mu);
    fire(x.l); /* its first look: the lock cannot be taken */
    assert_int_equal(x.a.calls, 1);
    assert_int_equal(x.a.rc, RATE_ESTORE);
    lock_remake(&f->h->mu);
    /* Another flow's decision wakes the next waiter: the seat left. */
    assert_int_equal(rate_fair_check_at(f, "z", 1, 1, 1, x.clk.now, &d),
                     RATE_OK);
    if (x.l->io_fn != NULL)
        x.l->io_fn(x.l->io_arg, RATE_LOOP_READ);
    fire(x.l);
    assert_int_equal(x.a.calls, 1); /* answered once */
    rate_fair_free(f); /* the kept record freed, its seat removed */
    assert_int_equal(x.a.calls, 1);
    /* The seat is gone from the table: a new handle finds no waiter. */
    assert_int_equal(rate_fair_new(&x.fc, &f, NULL, 0), RATE_OK);
    rate_fair_stats_t st;
    assert_int_equal(rate_fair_stats(f, &st), RATE_OK);
    assert_int_equal(st.waiting, 0);
    rate_fair_free(f);
    lost_end(&x);
}

/* Finding (a), on freeing: waiters still pending when the fair limit is
 * freed with its lock unrecoverable are answered RATE_ECANCELED, and no
 * seat is left naming a freed record. */
static void free_lock_lost(void **s)
{
    (void)s;
    lost_t x;
    rate_fair_t *f = lost_start(&x), *g = NULL;
    assert_int_equal(rate_fair_new(&x.fc, &g, NULL, 0), RATE_OK);
    lock_break(&f->h->mu);
    rate_fair_free(f);
    assert_int_equal(x.a.calls, 1);
    assert_int_equal(x.a.rc, RATE_ECANCELED);
    /* Another handle of this process on the same table: the seat left
     * behind names no record (it would wake a freed one). */
    lock_remake(&g->h->mu);
    for (uint32_t i = 0; i < g->h->slots * g->h->queue_max; i++)
        if (g->wait[i].ticket != 0)
            assert_int_equal(g->wait[i].arec, 0);
    rate_decision_t d;
    assert_int_equal(rate_fair_check_at(g, "z", 1, 1, 1, x.clk.now, &d),
                     RATE_OK);
    rate_fair_free(g);
    lost_end(&x);
}

/* Finding (c): a fair limit serves one loop, told from another by its
 * whole table, not its ud alone: a second adapter with the same ud (and
 * other functions) is refused; the same table in another copy is the
 * same loop. */
static void loop_identity(void **s)
{
    (void)s;
    rate_limiter_t *lim = limiter_of("token-bucket 100/s burst=100", NULL);
    rate_fair_config_t fc = {.limiter = lim, .key = "shared", .key_len = 6};
    rate_fair_t *f = NULL;
    assert_int_equal(rate_fair_new(&fc, &f, NULL, 0), RATE_OK);
    tloop_t *l = calloc(1, sizeof *l);
    rate_loop_t a = loop_of(l), copy = loop_of(l), b = loop_of(l);
    b.timer_new = timer_new_other;
    answers_t ans = {0};
    rate_decision_t d;
    assert_int_equal(rate_fair_acquire_start(f, &a, "x", 1, 1, 1, SEC, &d,
                                             on_answer, &ans), RATE_OK);
    assert_true(d.allowed);
    assert_int_equal(rate_fair_acquire_start(f, &copy, "x", 1, 1, 1, SEC, &d,
                                             on_answer, &ans), RATE_OK);
    assert_true(d.allowed);
    assert_int_equal(rate_fair_acquire_start(f, &b, "x", 1, 1, 1, SEC, &d,
                                             on_answer, &ans), RATE_EINVAL);
    assert_false(d.allowed);
    b = loop_of(l);
    b.now = fake_now; /* a loop's clock is part of it too */
    assert_int_equal(rate_fair_acquire_start(f, &b, "x", 1, 1, 1, SEC, &d,
                                             on_answer, &ans), RATE_EINVAL);
    assert_int_equal(ans.calls, 0);
    rate_fair_free(f);
    free(l);
    rate_limiter_free(lim);
}

/* Finding (b): the path without the lock charges what it admits to the
 * flow's entry (pend) after the shared limit's call.  When the entry was
 * taken by another flow meanwhile (the table moved on two periods, by
 * another thread's caller-supplied time, and the entry went free), the
 * cost landed on the new flow, charged at its next decision under the
 * lock as its own service: the new flow was put behind for a request it
 * never made.  Now the entry's generation turns the late cost away. */
static rate_fair_t *reuse_f;
static fslot_t *reuse_sl;
static uint64_t reuse_s;

static bool reuse_unlocked; /* the hook ran without the table's lock */

static void take_entry(void)
{
    rate_decision_t d;
    reuse_unlocked = pthread_mutex_trylock(&reuse_f->h->mu) == 0;
    if (!reuse_unlocked)
        return; /* the locked path: not the one under test */
    pthread_mutex_unlock(&reuse_f->h->mu);
    /* 5 s on: x's entry is free, and y's home, so y takes it */
    assert_int_equal(rate_fair_check_at(reuse_f, "y", 1, 1, 1, 15 * SEC, &d),
                     RATE_OK);
    assert_true(d.allowed);
    reuse_s = reuse_sl->s;
}

static uint32_t home_of(const rate_fair_t *f, const char *key)
{
    uint64_t h = XXH3_64bits_withSeed(key, strlen(key), f->h->seed);
    h = h == 0 ? 1 : h;
    return (uint32_t)(((h >> 32) * f->h->slots) >> 32);
}

static void fast_cost_reused(void **s)
{
    (void)s;
    rate_limiter_t *lim =
        limiter_of("token-bucket 1000000/s burst=1000000", NULL);
    rate_fair_config_t fc = {.limiter = lim, .key = "shared", .key_len = 6,
                             .slots = 2};
    rate_fair_t *f = NULL;
    assert_int_equal(rate_fair_new(&fc, &f, NULL, 0), RATE_OK);
    /* A seed that gives x and y one home (the table's own, chosen here). */
    for (f->h->seed = 1; home_of(f, "x") != home_of(f, "y"); f->h->seed++)
        ;
    rate_decision_t d;
    assert_int_equal(rate_fair_check_at(f, "x", 1, 1, 1, 10 * SEC, &d),
                     RATE_OK);
    assert_true(d.allowed);
    fslot_t *x = &f->slot[home_of(f, "x")];
    reuse_f = f;
    reuse_sl = x;
    try_hook = take_entry;
    assert_true(rate_fair_try_acquire_at(f, "x", 1, 1, 1, 10 * SEC + 1));
    assert_null(try_hook);      /* the hook ran ... */
    assert_true(reuse_unlocked); /* ... in the path without the lock */
    uint64_t yhash = XXH3_64bits_withSeed("y", 1, f->h->seed);
    assert_int_equal(x->hash, yhash ? yhash : 1); /* y took x's entry */
    /* y's next decision under the lock: charged its own permit only. */
    assert_int_equal(rate_fair_check_at(f, "y", 1, 1, 1, 15 * SEC + 1, &d),
                     RATE_OK);
    assert_true(d.allowed);
    assert_int_equal(x->s - reuse_s, UINT64_C(1) << FIX);
    rate_fair_free(f);
    rate_limiter_free(lim);
}

/* The path without the lock reads a flow's home entry and the next
 * together: on tables of 1, 2 and 3 entries (the next is the home
 * itself, or the first again) flows found, not found and sharing an
 * entry are decided, each call returning. */
static void tiny_tables(void **s)
{
    (void)s;
    for (unsigned slots = 1; slots <= 3; slots++) {
        rate_limiter_t *lim =
            limiter_of("token-bucket 1000000/s burst=1000000", NULL);
        rate_fair_config_t fc = {.limiter = lim, .key = "shared",
                                 .key_len = 6, .slots = slots};
        rate_fair_t *f = NULL;
        assert_int_equal(rate_fair_new(&fc, &f, NULL, 0), RATE_OK);
        rate_decision_t d;
        assert_int_equal(rate_fair_check_at(f, "a", 1, 1, 1, SEC, &d),
                         RATE_OK);
        for (unsigned i = 0; i < 400; i++) {
            char key[8];
            int kn = snprintf(key, sizeof key, "f%u", i % 5);
            assert_true(rate_fair_try_acquire_at(f, key, (size_t)kn, 1, 1,
                                                 SEC + i));
        }
        rate_fair_stats_t st;
        assert_int_equal(rate_fair_stats(f, &st), RATE_OK);
        assert_true(st.flows <= slots);
        rate_fair_free(f);
        rate_limiter_free(lim);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(async_lock_lost),
        cmocka_unit_test(free_lock_lost),
        cmocka_unit_test(loop_identity),
        cmocka_unit_test(fast_cost_reused),
        cmocka_unit_test(tiny_tables),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
