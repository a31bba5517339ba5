/*
 * Concurrency: threads hammer shared and private keys through one limiter.
 * Over the run, the permits admitted per key never exceed the algorithm's
 * bound for the elapsed time, and the counters add up.  Built and run under
 * ThreadSanitizer too (label "concurrency").
 */
#include <pthread.h>
#include <stdatomic.h>

#include "helpers.h"

#define THREADS 4
#define SHARED 3
#define ITERS 20000

typedef struct run {
    rate_limiter_t *lim;
    atomic_uint_fast64_t shared_ok[SHARED];
    atomic_uint_fast64_t own_ok[THREADS];
    atomic_uint_fast64_t calls;
    int id_next;
} run_t;

static void *worker(void *arg)
{
    run_t *r = arg;
    int id = __atomic_fetch_add(&r->id_next, 1, __ATOMIC_RELAXED);
    char own[32], shared[32];
    snprintf(own, sizeof own, "own-%d", id);
    for (int i = 0; i < ITERS; i++) {
        int s = i % SHARED;
        snprintf(shared, sizeof shared, "shared-%d", s);
        if (rate_try_acquire(r->lim, shared, 1))
            atomic_fetch_add(&r->shared_ok[s], 1);
        if (rate_try_acquire(r->lim, own, 1))
            atomic_fetch_add(&r->own_ok[id], 1);
        atomic_fetch_add(&r->calls, 2);
    }
    return NULL;
}

/* Runs the threads; returns the elapsed ns (a bound on every key's time). */
static uint64_t hammer(run_t *r)
{
    pthread_t th[THREADS];
    uint64_t t0 = rate_clock_monotonic_ns();
    for (int i = 0; i < THREADS; i++)
        assert_int_equal(pthread_create(&th[i], NULL, worker, r), 0);
    for (int i = 0; i < THREADS; i++)
        pthread_join(th[i], NULL);
    return rate_clock_monotonic_ns() - t0;
}

static void check_counts(run_t *r, uint64_t bound, const char *what)
{
    uint64_t total = 0;
    for (int s = 0; s < SHARED; s++) {
        uint64_t ok = atomic_load(&r->shared_ok[s]);
        if (ok > bound)
            fail_msg("%s: shared key %d admitted %llu > bound %llu", what, s,
                     (unsigned long long)ok, (unsigned long long)bound);
        assert_true(ok > 0);
        total += ok;
    }
    for (int i = 0; i < THREADS; i++) {
        uint64_t ok = atomic_load(&r->own_ok[i]);
        if (ok > bound)
            fail_msg("%s: own key %d admitted %llu > bound %llu", what, i,
                     (unsigned long long)ok, (unsigned long long)bound);
        total += ok;
    }
    rate_stats_t st;
    assert_int_equal(rate_limiter_stats(r->lim, &st), RATE_OK);
    assert_int_equal(st.allowed, total);
    assert_int_equal(st.allowed + st.denied + st.store_errors,
                     atomic_load(&r->calls));
    assert_int_equal(st.store_errors, 0);
}

static void token_bucket_bound(rate_store_t *store, const char *what)
{
    run_t r;
    memset(&r, 0, sizeof r);
    /* B + elapsed * L / P, with L/P = 1000/s and B = 50. */
    r.lim = limiter_of("token-bucket 1000/s burst=50", store);
    uint64_t elapsed = hammer(&r);
    check_counts(&r, 50 + elapsed / 1000000 + 1, what);
    rate_limiter_free(r.lim);
}

static void memory_token_bucket(void **state)
{
    (void)state;
    token_bucket_bound(NULL, "memory");
}

static void cas_token_bucket(void **state)
{
    (void)state;
    rate_store_t *s;
    assert_int_equal(cas_store_new(&s, NULL), RATE_OK);
    token_bucket_bound(s, "cas");
    rate_stats_t st;
    rate_store_stats(s, &st);
    rate_store_free(s);
}

static void memory_sliding_log(void **state)
{
    (void)state;
    run_t r;
    memset(&r, 0, sizeof r);
    /* At most L in any window W: over E, at most L * (E / W + 1). */
    r.lim = limiter_of("sliding-log 200/10ms", NULL);
    uint64_t elapsed = hammer(&r);
    check_counts(&r, 200 * (elapsed / (10 * MS) + 1), "sliding-log");
    rate_limiter_free(r.lim);
}

static void memory_small_table(void **state)
{
    (void)state;
    /* max_keys below the number of keys: evictions race with hits. */
    rate_memory_options_t o = {5, 0};
    rate_store_t *s;
    assert_int_equal(rate_store_memory_new(&o, &s), RATE_OK);
    run_t r;
    memset(&r, 0, sizeof r);
    r.lim = limiter_of("fixed-window 1000000/h", s);
    hammer(&r);
    rate_stats_t st;
    rate_limiter_stats(r.lim, &st);
    assert_true(st.keys <= 5);
    assert_true(st.evictions > 0);
    assert_int_equal(st.allowed, atomic_load(&r.calls));
    rate_limiter_free(r.lim);
    rate_store_free(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(memory_token_bucket),
        cmocka_unit_test(cas_token_bucket),
        cmocka_unit_test(memory_sliding_log),
        cmocka_unit_test(memory_small_table),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
