/* SPDX-License-Identifier: MIT */
/*
 * What only the memory store (and the compare-and-set test store's TTLs)
 * promise: max_keys, eviction and reclaiming counted apart, statistics,
 * reserved words.  What every store promises is the store matrix
 * (tests/lib/store_matrix.h, the `stores` suite).
 */
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "lib/helpers.h"
#include "ratelimit_shm.h"
#include "ratelimit_synced.h"
#ifdef RATE_WITH_DYNAMODB
#include "ratelimit_dynamodb.h"
#endif
#ifdef RATE_WITH_REDIS
#include "ratelimit_redis.h"
#endif

static rate_decision_t at_key(rate_limiter_t *l, const char *key, size_t len,
                              uint64_t t, uint64_t n)
{
    rate_decision_t d;
    assert_int_equal(rate_limiter_check_at(l, key, len, n, 0, t, &d), RATE_OK);
    return d;
}

/* -------------------------------------------------- memory store only */

static void ttl_is_reset_after(void **state)
{
    (void)state;
    rate_store_t *s;
    cas_store_t *h;
    assert_int_equal(cas_store_new(&s, &h), RATE_OK);
    rate_limiter_t *l = limiter_of("token-bucket 3/s burst=3", s);
    rate_decision_t d = at_key(l, "t", 1, 0, 2);
    assert_int_equal(cas_store_ttl(h, "t"), d.reset_after_ns);
    assert_int_equal(d.reset_after_ns, 666666667);
    rate_limiter_free(l);
    rate_store_free(s);
}

/* A limiter for `text` on the clock c, over a new memory store (*s, to
 * free after the limiter) with the options o. */
static rate_limiter_t *on_clock(const char *text, fake_clock_t *c,
                                rate_memory_options_t o, rate_store_t **s)
{
    rate_clock_t clock = {fake_now, fake_sleep, c}; /* the limiter copies it */
    rate_limiter_config_t cfg = {0};
    assert_int_equal(rate_store_memory_new(&o, s), RATE_OK);
    cfg.store = *s;
    cfg.clock = &clock;
    return limiter_cfg(text, cfg);
}

static void max_keys_evicts_and_counts(void **state)
{
    (void)state;
    rate_memory_options_t o = {.max_keys = 4, .shards = 0};
    rate_store_t *s;
    assert_int_equal(rate_store_memory_new(&o, &s), RATE_OK);
    rate_limiter_t *l = limiter_of("fixed-window 10/h", s);
    const char *keys[] = {"a", "b", "c", "d"};
    for (int i = 0; i < 4; i++)
        at_key(l, keys[i], 1, 0, 1);
    for (int i = 0; i < 3; i++) /* a, b, c used again; d is not */
        at_key(l, keys[i], 1, 0, 1);
    at_key(l, "e", 1, 0, 1);
    rate_stats_t st;
    rate_store_stats(s, &st);
    assert_int_equal(st.keys, 4);
    assert_int_equal(st.evictions, 1);
    assert_int_equal(st.reclaimed, 0);
    /* d was the one not used since: it starts cold again (10 - 1 left). */
    assert_int_equal(at_key(l, "d", 1, 0, 1).remaining, 9);
    for (int i = 0; i < 1000; i++) {
        char k[16];
        snprintf(k, sizeof k, "k%d", i);
        at_key(l, k, strlen(k), 0, 1);
    }
    rate_store_stats(s, &st);
    assert_int_equal(st.keys, 4);
    assert_int_equal(st.evictions, 1002);
    rate_limiter_free(l);
    rate_store_free(s);

    rate_memory_options_t bad = {.shards = 1u << 20};
    assert_int_equal(rate_store_memory_new(&bad, &s), RATE_EINVAL);
    assert_int_equal(rate_store_memory_new(&o, NULL), RATE_EINVAL);
    rate_store_free(NULL);
}

/* With the library's clock, a key past its reset is reclaimed (no answer
 * changes); with caller-supplied times it never is, because another key's
 * time says nothing about this key's. */
static void reclaims_only_by_own_clock(void **state)
{
    (void)state;
    fake_clock_t c = {1000 * SEC, 0, 0};
    rate_store_t *s;
    rate_limiter_t *l =
        on_clock("fixed-window 1/s", &c, (rate_memory_options_t){.max_keys = 4, .shards = 0}, &s);
    const char *keys[] = {"a", "b", "c", "d", "e", "f"};
    for (int i = 0; i < 4; i++)
        assert_true(rate_try_acquire(l, keys[i], 1));
    c.now += 5 * SEC;
    assert_true(rate_try_acquire(l, "e", 1));
    rate_stats_t st;
    rate_store_stats(s, &st);
    assert_int_equal(st.reclaimed, 1);
    assert_int_equal(st.evictions, 0);

    /* Caller times far in the future: still an eviction, not a reclaim. */
    rate_decision_t d;
    assert_int_equal(rate_limiter_check_at(l, "f", 1, 1, 0, 9000 * SEC, &d),
                     RATE_OK);
    rate_store_stats(s, &st);
    assert_int_equal(st.reclaimed, 1);
    assert_int_equal(st.evictions, 1);
    rate_limiter_free(l);
    rate_store_free(s);
}

/* Whether a key may be reclaimed follows the clock of its last write,
 * whichever path wrote it: here the bool API rewrites keys in place (the
 * memory store's lane) at the other clock's time than they were first
 * stored at.  "a" ends on the library's clock, "c" on the caller's. */
static void reclaim_follows_last_write(void **state)
{
    (void)state;
    fake_clock_t c = {1000 * SEC, 0, 0};
    rate_store_t *s;
    rate_limiter_t *l =
        on_clock("fixed-window 1/s", &c, (rate_memory_options_t){.max_keys = 2, .shards = 0}, &s);
    rate_decision_t d;
    assert_int_equal(rate_limiter_check_at(l, "a", 1, 1, 0, 990 * SEC, &d),
                     RATE_OK);
    assert_true(d.allowed);
    assert_true(rate_try_acquire(l, "a", 1));
    assert_true(rate_try_acquire(l, "c", 1));
    assert_true(rate_try_acquire_at(l, "c", 1, 1002 * SEC));
    c.now += 5 * SEC; /* both windows are over */
    assert_true(rate_try_acquire(l, "e", 1));
    rate_stats_t st;
    rate_store_stats(s, &st);
    assert_int_equal(st.reclaimed, 1); /* a */
    assert_int_equal(st.evictions, 0);
    /* c is still there: its window at 1002 s is full. */
    assert_false(rate_try_acquire_at(l, "c", 1, 1002 * SEC + SEC / 2));
    rate_limiter_free(l);
    rate_store_free(s);
}

static void grows_and_reclaims_unbounded(void **state)
{
    (void)state;
    fake_clock_t c = {SEC, 0, 0};
    rate_store_t *s;
    rate_limiter_t *l = on_clock("token-bucket 10/s burst=10", &c,
                                 (rate_memory_options_t){.max_keys = 0, .shards = 4}, &s);
    char k[48];
    for (int i = 0; i < 20000; i++) {
        snprintf(k, sizeof k, "key-number-%d-long-enough", i);
        assert_true(rate_try_acquire(l, k, 10));
        if (i == 9999)
            c.now += 2 * SEC; /* the first 10000 are full again */
    }
    rate_stats_t st;
    rate_store_stats(s, &st);
    assert_true(st.reclaimed > 0);
    assert_int_equal(st.keys + st.reclaimed, 20000);
    assert_int_equal(st.evictions, 0);
    rate_limiter_stats(l, &st); /* verdicts are the limiter's to count */
    assert_int_equal(st.allowed, 20000);
    /* Every key still answers as the spec says. */
    for (int i = 10000; i < 20000; i++) {
        snprintf(k, sizeof k, "key-number-%d-long-enough", i);
        assert_false(rate_try_acquire(l, k, 1));
    }
    rate_limiter_free(l);
    rate_store_free(s);
}

/* max_keys means what it says: a store bounded at N holds N keys before
 * it evicts any (the first edition's per-shard shares evicted 0.65-4.6%
 * early), and never more. */
static void max_keys_is_exact(void **state)
{
    (void)state;
    const size_t sizes[] = {200, 5000, 100000};
    for (size_t z = 0; z < sizeof sizes / sizeof *sizes; z++) {
        rate_memory_options_t o = {.max_keys = sizes[z], .shards = 0};
        rate_store_t *s;
        assert_int_equal(rate_store_memory_new(&o, &s), RATE_OK);
        rate_limiter_t *l = limiter_of("fixed-window 10/h", s);
        char k[32];
        for (size_t i = 0; i < sizes[z]; i++) {
            snprintf(k, sizeof k, "key-%zu", i);
            assert_true(rate_try_acquire_at(l, k, 1, SEC));
        }
        rate_stats_t st;
        rate_store_stats(s, &st);
        assert_int_equal(st.keys, sizes[z]);
        assert_int_equal(st.evictions, 0);
        for (size_t i = 0; i < 100; i++) {
            snprintf(k, sizeof k, "more-%zu", i);
            assert_true(rate_try_acquire_at(l, k, 1, SEC));
        }
        rate_store_stats(s, &st);
        assert_int_equal(st.keys, sizes[z]);
        assert_int_equal(st.evictions, 100);
        rate_limiter_free(l);
        rate_store_free(s);
    }
}

/* A store sized for a million keys of 16 bytes holds them in 48 bytes
 * each at most, everything counted (slots, control bytes, shards): 47.3
 * with every shard at its share, 0.2 more for each shard the keys' hash
 * overfills (one store in four has one; four, which would pass 48, is
 * about one in a million).  49.2 when shards grew past 7/8 full. */
static void a_million_keys_in_48_bytes(void **state)
{
    (void)state;
    const uint32_t n = 1u << 20;
    rate_store_t *s;
    assert_int_equal(rate_store_memory_new(
                         &(rate_memory_options_t){.max_keys = n}, &s),
                     RATE_OK);
    rate_limiter_t *l = limiter_of("token-bucket 1000/s burst=1000000", s);
    char k[17];
    for (uint32_t i = 0; i < n; i++) {
        snprintf(k, sizeof k, "user:%011u", i);
        assert_true(rate_try_acquire_at(l, k, 1, SEC));
    }
    rate_stats_t st;
    rate_store_stats(s, &st);
    assert_int_equal(st.keys, n);
    assert_int_equal(st.evictions, 0);
    assert_true(st.bytes <= 48ull * n);
    rate_limiter_free(l);
    rate_store_free(s);
}

/* The caller's low-water mark: keys decided only at caller times are
 * reclaimed once cold at the mark, as on the library's clock, and every
 * answer stays the spec's; without a mark none is (another key's time
 * says nothing about this one's). */
static void low_water_reclaims(void **state)
{
    (void)state;
    for (int marked = 0; marked < 2; marked++) {
        rate_store_t *s;
        assert_int_equal(rate_store_memory_new(
                             &(rate_memory_options_t){.max_keys = 0, .shards = 4}, &s),
                         RATE_OK);
        rate_limiter_t *l = limiter_of("token-bucket 1000/s burst=1", s);
        char k[32];
        uint64_t t = SEC;
        for (int i = 0; i < 50000; i++) {
            snprintf(k, sizeof k, "key-number-%d", i);
            assert_true(rate_try_acquire_at(l, k, 1, t));
            assert_false(rate_try_acquire_at(l, k, 1, t));
            t += 1000; /* each key is cold again 1 ms after its request */
            if (marked && i % 1000 == 999)
                assert_int_equal(rate_limiter_set_low_water(l, t), RATE_OK);
        }
        rate_stats_t st;
        rate_store_stats(s, &st);
        if (marked) {
            /* An unbounded shard reclaims when it grows: at the last
             * growth (7168 keys in each of the 4 shards) every key cold
             * at the mark went, all but the last 1000 or so (seen:
             * 24002; the library clock's run reclaims the same way). */
            assert_true(st.reclaimed > 20000);
            assert_int_equal(st.keys + st.reclaimed, 50000);
        } else {
            assert_int_equal(st.reclaimed, 0);
            assert_int_equal(st.keys, 50000);
        }
        assert_int_equal(st.evictions, 0);
        /* Every key answers as the spec says: the last one, 1 us after
         * its request, is still empty; a first one is full again. */
        assert_false(rate_try_acquire_at(l, "key-number-49999", 1, t));
        assert_true(rate_try_acquire_at(l, "key-number-0", 1, t));
        assert_int_equal(rate_limiter_set_low_water(l, RATE_TIME_MAX + 1),
                         RATE_ERANGE);
        assert_int_equal(rate_limiter_set_low_water(NULL, 1), RATE_EINVAL);
        rate_limiter_free(l);
        rate_store_free(s);
    }
}

/* A struct a caller fills whose reserved words are not zero (a field of a
 * later header, run against this library) is refused, never ignored:
 * every constructor, each part's too (docs/design.md, "A stable ABI"). */
static void reserved_words_are_refused(void **state)
{
    (void)state;
    char err[200] = "";
    rate_policy_t *p = NULL;
    rate_limit_t l = {.algorithm = RATE_TOKEN_BUCKET, .limit = 1,
                      .period_ns = SEC, .burst = 1};
    l.reserved[1] = 1;
    assert_int_equal(rate_policy_new(&l, 1, &p, err, sizeof err),
                     RATE_EPOLICY);
    assert_non_null(strstr(err, "limit 1: its reserved words are not zero"));
    l.reserved[1] = 0;
    assert_int_equal(rate_policy_new(&l, 1, &p, err, sizeof err), RATE_OK);

    rate_limiter_t *lim = NULL;
    rate_limiter_config_t cfg = {.policy = p};
    cfg.reserved[7] = 1;
    assert_int_equal(rate_limiter_new(&cfg, &lim), RATE_EINVAL);
    assert_null(lim);

    rate_store_t *s = NULL;
    rate_memory_options_t mo = {.max_keys = 10};
    mo.reserved[0] = 1;
    assert_int_equal(rate_store_memory_new(&mo, &s), RATE_EINVAL);
    assert_null(s);

    rate_shm_options_t so = {.max_keys = 64};
    so.reserved[3] = 1;
    assert_int_equal(rate_store_shm_size(&so), 0);
    assert_int_equal(rate_store_shm_new("/ratelimit-test-reserved", &so, &s,
                                        err, sizeof err),
                     RATE_EINVAL);
    assert_non_null(strstr(err, "reserved words are not zero"));

    assert_int_equal(rate_store_memory_new(NULL, &s), RATE_OK);
    rate_synced_config_t sc = {.policy = p, .remote = s, .lease = 1};
    sc.reserved[0] = 2;
    rate_synced_t *sy = NULL;
    assert_int_equal(rate_synced_new(&sc, &sy, err, sizeof err), RATE_EINVAL);
    assert_non_null(strstr(err, "reserved words are not zero"));
    rate_store_free(s);
    s = NULL;
#ifdef RATE_WITH_REDIS
    rate_redis_options_t ro = {0};
    ro.reserved[6] = 1; /* the last (reserved[0] of 0.4.0 is generic_leases) */
    assert_int_equal(rate_store_redis_new("redis://127.0.0.1:1/0", &ro, &s,
                                          err, sizeof err),
                     RATE_EINVAL);
    assert_non_null(strstr(err, "reserved words are not zero"));
#endif
#ifdef RATE_WITH_DYNAMODB
    rate_dynamodb_options_t dopt = {0};
    dopt.reserved[0] = 1;
    assert_int_equal(rate_store_dynamodb_new("dynamodb://t?endpoint=http://"
                                             "127.0.0.1:1",
                                             &dopt, &s, err, sizeof err),
                     RATE_EINVAL);
    assert_non_null(strstr(err, "reserved words are not zero"));
#endif
    assert_null(s);
    rate_policy_free(p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(reserved_words_are_refused),
        cmocka_unit_test(ttl_is_reset_after),
        cmocka_unit_test(max_keys_evicts_and_counts),
        cmocka_unit_test(reclaims_only_by_own_clock),
        cmocka_unit_test(reclaim_follows_last_write),
        cmocka_unit_test(grows_and_reclaims_unbounded),
        cmocka_unit_test(max_keys_is_exact),
        cmocka_unit_test(a_million_keys_in_48_bytes),
        cmocka_unit_test(low_water_reclaims),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
