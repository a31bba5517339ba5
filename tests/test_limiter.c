/* SPDX-License-Identifier: MIT */
/*
 * The limiter front: bad input, the seed call, shadow mode, several limits
 * on one key, the blocking acquire on an injected clock, tier changes that
 * keep a key's state, and the fail mode when the store fails.
 */
#include <time.h>

#include "lib/helpers.h"
#include "ratelimit_shm.h"
#include "ratelimit_store.h"

static void bad_input(void **state)
{
    (void)state;
    rate_limiter_t *l = limiter_of("token-bucket 1/s burst=1", NULL);
    rate_decision_t d;
    char longkey[RATE_KEY_MAX + 2];
    memset(longkey, 'a', sizeof longkey - 1);
    longkey[sizeof longkey - 1] = '\0';

    assert_int_equal(rate_limiter_check(NULL, "k", 1, 1, 0, &d), RATE_EINVAL);
    assert_false(d.allowed);
    assert_int_equal(rate_limiter_check(l, NULL, 1, 1, 0, &d), RATE_EKEY);
    assert_int_equal(rate_limiter_check(l, "k", 0, 1, 0, &d), RATE_EKEY);
    assert_int_equal(rate_limiter_check(l, longkey, RATE_KEY_MAX + 1, 1, 0, &d),
                     RATE_EKEY);
    assert_int_equal(rate_limiter_check(l, longkey, RATE_KEY_MAX, 1, 0, &d),
                     RATE_OK); /* exactly the maximum is fine */
    assert_int_equal(rate_limiter_check(l, "k", 1, 1, 0, NULL), RATE_EINVAL);
    assert_int_equal(rate_limiter_check(l, "k", 1, UINT64_MAX, 0, &d),
                     RATE_ERANGE);
    assert_int_equal(rate_limiter_check(l, "k", 1, 1, UINT64_MAX, &d),
                     RATE_ERANGE);
    assert_int_equal(rate_limiter_check_at(l, "k", 1, 1, 0, UINT64_MAX, &d),
                     RATE_ERANGE);
    assert_false(rate_try_acquire(NULL, "k", 1));
    assert_false(rate_try_acquire(l, NULL, 1));
    assert_false(rate_try_acquire(l, "", 1));
    assert_false(rate_try_acquire(l, longkey, 1));
    assert_false(rate_try_acquire_len(NULL, "k", 1, 1));
    assert_false(rate_try_acquire_len(l, NULL, 1, 1));
    assert_false(rate_try_acquire_len(l, "k", 0, 1));
    assert_false(rate_try_acquire_len(l, longkey, RATE_KEY_MAX + 1, 1));
    assert_false(rate_try_acquire_len(l, longkey, SIZE_MAX, 1));
    assert_false(rate_try_acquire_len(l, "k", 1, UINT64_MAX));
    assert_false(rate_try_acquire_len_at(l, "k", 1, 1, UINT64_MAX));
    assert_false(rate_try_acquire_len_at(NULL, "k", 1, 1, 0));
    assert_int_equal(rate_limiter_acquire(l, NULL, 0, 1, SEC, &d), RATE_EKEY);
    /* None of that touched the key "k"'s state. */
    assert_true(rate_limiter_check_at(l, "k", 1, 1, 0, 0, &d) == RATE_OK &&
                d.allowed);

    rate_limiter_config_t cfg = {0};
    rate_limiter_t *x = (rate_limiter_t *)1;
    assert_int_equal(rate_limiter_new(&cfg, &x), RATE_EINVAL);
    assert_null(x);
    assert_int_equal(rate_limiter_new(NULL, &x), RATE_EINVAL);
    rate_clock_t half = {fake_now, NULL, NULL};
    cfg.policy = rate_limiter_policy(l);
    cfg.clock = &half;
    assert_int_equal(rate_limiter_new(&cfg, &x), RATE_EINVAL);
    cfg.clock = NULL;
    cfg.on_store_error = (rate_fail_mode_t)7;
    assert_int_equal(rate_limiter_new(&cfg, &x), RATE_EINVAL);
    rate_limiter_free(NULL);
    rate_limiter_free(l);
}

/* The limiter's keys and verdicts so far. */
static void expect_counts(rate_limiter_t *l, uint64_t keys, uint64_t allowed,
                          uint64_t denied)
{
    rate_stats_t s;
    assert_int_equal(rate_limiter_stats(l, &s), RATE_OK);
    assert_int_equal(s.keys, keys);
    assert_int_equal(s.allowed, allowed);
    assert_int_equal(s.denied, denied);
}

static void seed_interface(void **state)
{
    (void)state;
    rate_limiter_t *l = limiter_of("token-bucket 1/h burst=3", NULL);
    assert_true(rate_try_acquire1(l, "user:42"));
    assert_true(rate_try_acquire(l, "user:42", 2));
    assert_false(rate_try_acquire(l, "user:42", 1));
    assert_true(rate_try_acquire(l, "user:43", 3)); /* another key */
    assert_false(rate_try_acquire(l, "user:43", 4)); /* never */
    expect_counts(l, 2, 3, 2);
    rate_limiter_free(l);
}

/* Keys given with their length are any bytes: a NUL byte is part of the
 * key, and the same bytes given NUL-terminated are the same key. */
static void keys_with_length(void **state)
{
    (void)state;
    rate_limiter_t *l = limiter_of("token-bucket 1/h burst=2", NULL);
    static const char ip6[16] = {0x20, 0x01, 0x0d, (char)0xb8, 0, 0, 0, 0,
                                 0,    0,    0,    0,          0, 0, 0, 1};
    char heap_a[40] = {0}, heap_b[40] = {0}; /* longer than a slot holds */
    heap_b[39] = 1;

    assert_true(rate_try_acquire_len(l, ip6, sizeof ip6, 2));
    assert_false(rate_try_acquire_len(l, ip6, sizeof ip6, 1));
    /* Up to its first NUL, the address is a key of 4 bytes. */
    assert_true(rate_try_acquire(l, ip6, 1));
    assert_true(rate_try_acquire_len(l, ip6, 4, 1));
    assert_false(rate_try_acquire_len_at(l, ip6, 4, 1, 0));
    /* Bytes after a NUL tell keys apart. */
    assert_true(rate_try_acquire_len(l, "a\0b", 3, 2));
    assert_true(rate_try_acquire_len(l, "a\0c", 3, 2));
    assert_false(rate_try_acquire_len(l, "a\0b", 3, 1));
    assert_true(rate_try_acquire(l, "a", 2)); /* and "a" is a third key */
    assert_true(rate_try_acquire_len(l, heap_a, sizeof heap_a, 2));
    assert_true(rate_try_acquire_len(l, heap_b, sizeof heap_b, 2));
    assert_false(rate_try_acquire_len(l, heap_a, sizeof heap_a, 1));
    /* A length shorter than the string: only that many bytes. */
    assert_true(rate_try_acquire_len(l, "user:42 and more", 7, 2));
    assert_false(rate_try_acquire(l, "user:42", 1));
    expect_counts(l, 8, 9, 5);
    rate_limiter_free(l);
}

/* Every key length up to past the inline size, each key beside three that
 * differ from it in one byte (the last, the first, the middle): the
 * store's short keys are compared as zero-padded words built from
 * overlapping loads, so a byte misplaced there would merge or lose keys. */
static void keys_of_every_short_length(void **state)
{
    (void)state;
    rate_limiter_t *l = limiter_of("token-bucket 1/h burst=1", NULL);
    const char *text = "abcdefghijklmnopqrst";
    char key[21];

    for (size_t len = 1; len <= 20; len++) {
        for (int v = 0; v < 4; v++) {
            memcpy(key, text, len);
            key[len] = '\0';
            if (v == 1)
                key[len - 1] = 'X';
            else if (v == 2)
                key[0] = 'Y';
            else if (v == 3)
                key[len / 2] = 'Z';
            if (!(v % 2 ? rate_try_acquire_len_at(l, key, len, 1, SEC)
                        : rate_try_acquire_at(l, key, 1, SEC)))
                fail_msg("key '%s' (%zu bytes): denied at its first use",
                         key, len);
            if (v % 2 ? rate_try_acquire_at(l, key, 1, SEC)
                      : rate_try_acquire_len_at(l, key, len, 1, SEC))
                fail_msg("key '%s' (%zu bytes): admitted twice", key, len);
        }
    }
    expect_counts(l, 80, 80, 80);
    rate_limiter_free(l);
}

/* Shadow mode: decisions are computed and counted, every request is let
 * through, and the decision says it would have been denied. */
static void shadow_mode(void **state)
{
    (void)state;
    rate_limiter_config_t cfg = {0};
    cfg.shadow = true;
    rate_limiter_t *l = limiter_cfg("fixed-window 2/s", cfg);
    rate_decision_t d;
    for (int i = 0; i < 2; i++) {
        d = at(l, "k", 0, 1, 0);
        assert_true(d.allowed && !d.shadow);
    }
    d = at(l, "k", 0, 1, 0);
    assert_true(d.allowed);
    assert_true(d.shadow); /* would have been denied */
    assert_int_equal(d.reason, RATE_REASON_LIMITED);
    d = at(l, "k", 0, 3, 0);
    assert_true(d.allowed && d.shadow);
    assert_int_equal(d.reason, RATE_REASON_NEVER);
    assert_int_equal(d.retry_after_ns, RATE_NEVER);
    /* The state follows the real decisions: the window is still full. */
    assert_int_equal(d.remaining, 0);
    rate_stats_t s;
    rate_limiter_stats(l, &s);
    assert_int_equal(s.allowed, 2);
    assert_int_equal(s.denied, 2);
    rate_limiter_free(l);

    /* The bool API: a request the policy denies is true, counted as
     * denied, and the state follows the real decisions. */
    l = limiter_cfg("token-bucket 1/h burst=2", cfg);
    for (int i = 0; i < 5; i++)
        assert_true(rate_try_acquire_at(l, "k", 1, SEC));
    assert_true(rate_try_acquire_at(l, "k", 3, SEC)); /* never: still true */
    assert_int_equal(rate_limiter_stats(l, &s), RATE_OK);
    assert_int_equal(s.allowed, 2);
    assert_int_equal(s.denied, 4);
    d = at(l, "k", SEC, 1, 0);
    assert_true(d.shadow);
    assert_int_equal(d.remaining, 0);
    rate_limiter_free(l);
}

/* A resolver that gives every key one policy: it keeps a limiter off the
 * memory store's lane, so the bool API takes the general path. */
static const rate_policy_t *one_policy(void *ud, const char *key, size_t len)
{
    (void)key;
    (void)len;
    return ud;
}

/* One of the four bool calls, by `form`: C string or length, the time
 * given or read from the limiter's clock (c, set to t first). */
static bool try_form(rate_limiter_t *l, fake_clock_t *c, int form,
                     const char *key, uint64_t n, uint64_t t)
{
    c->now = t;
    switch (form) {
    case 0:
        return rate_try_acquire_len_at(l, key, strlen(key), n, t);
    case 1:
        return rate_try_acquire_len(l, key, strlen(key), n);
    case 2:
        return rate_try_acquire_at(l, key, n, t);
    default:
        return rate_try_acquire(l, key, n);
    }
}

/* The bool API decides keys the memory store holds under the limiter's
 * policy in the store's lane, and everything else on the general path:
 * both give the same answers, counted the same, through each of the four
 * calls.  Each run interleaves a second policy on the same keys, so some
 * states are another policy's, and the full call's reservations, so that
 * buckets go into debt. */
static void bool_api_lane(void **state)
{
    static const char *texts[] = {
        "token-bucket 5/s burst=3",
        "leaky-bucket 5/s capacity=3",
        "fixed-window 4/s",
        "sliding-window 4/s",
        "sliding-log 4/s",
        "token-bucket 5/s burst=3; fixed-window 6/2s",
    };
    static const char *keys[] = {"a", "bb", "a-key-of-16-byte", "a key longer than sixteen bytes"};
    (void)state;
    for (size_t i = 0; i < sizeof texts / sizeof *texts; i++) {
        rate_store_t *s1, *s2;
        assert_int_equal(rate_store_memory_new(NULL, &s1), RATE_OK);
        assert_int_equal(rate_store_memory_new(NULL, &s2), RATE_OK);
        rate_policy_t *p = policy_of(texts[i]);
        rate_policy_t *q = policy_of("token-bucket 2/s burst=6");
        fake_clock_t c = {0, 0, 0};
        rate_clock_t clock = {fake_now, fake_sleep, &c};
        rate_limiter_config_t cfg = {0};
        rate_limiter_t *lane[2], *general[2];
        cfg.store = s1;
        cfg.clock = &clock;
        lane[0] = limiter_cfg(texts[i], cfg);
        lane[1] = limiter_cfg("token-bucket 2/s burst=6", cfg);
        cfg.store = s2;
        cfg.resolve = one_policy;
        cfg.resolve_ud = p;
        general[0] = limiter_cfg(texts[i], cfg);
        cfg.resolve_ud = q;
        general[1] = limiter_cfg("token-bucket 2/s burst=6", cfg);
        uint64_t t = 5 * SEC, seed = 12345 + i, reserved = 0;
        for (int step = 0; step < 4000; step++) {
            seed = seed * 6364136223846793005u + 1442695040888963407u;
            uint64_t r = seed >> 20;
            const char *key = keys[r % 4];
            uint64_t n = (r >> 2) % 5; /* 0..4: 4 is never for burst 3 */
            int which = (r >> 5) % 8 == 0;
            if ((r >> 8) % 16 == 0)
                t -= 100 * MS; /* backwards: no time passes */
            else
                t += (r >> 12) % (300 * MS);
            if ((r >> 30) % 16 == 0) { /* a reservation of up to 2 s */
                rate_decision_t d1, d2;
                size_t len = strlen(key);
                assert_int_equal(rate_limiter_check_at(lane[which], key, len,
                                                       n, 2 * SEC, t, &d1),
                                 RATE_OK);
                assert_int_equal(rate_limiter_check_at(general[which], key,
                                                       len, n, 2 * SEC, t,
                                                       &d2),
                                 RATE_OK);
                assert_int_equal(d1.allowed, d2.allowed);
                reserved += d1.delay_ns > 0;
                continue;
            }
            int fa = (int)((r >> 9) % 4), fb = (int)((r >> 11) % 4);
            bool a = try_form(lane[which], &c, fa, key, n, t);
            bool b = try_form(general[which], &c, fb, key, n, t);
            if (a != b)
                fail_msg("%s, step %d (key %s, %llu permits, limiter %d, "
                         "calls %d and %d): lane %d, general path %d",
                         texts[i], step, key, (unsigned long long)n, which,
                         fa, fb, a, b);
        }
        if (strncmp(texts[i], "token", 5) == 0 ||
            strncmp(texts[i], "leaky", 5) == 0)
            assert_true(reserved > 10); /* buckets went into debt */
        /* Each limiter counts its own verdicts. */
        rate_stats_t x, y;
        uint64_t allowed = 0, denied = 0;
        for (int w = 0; w < 2; w++) {
            assert_int_equal(rate_limiter_stats(lane[w], &x), RATE_OK);
            assert_int_equal(rate_limiter_stats(general[w], &y), RATE_OK);
            assert_int_equal(x.allowed, y.allowed);
            assert_int_equal(x.denied, y.denied);
            assert_int_equal(x.keys, y.keys);
            allowed += x.allowed;
            denied += x.denied;
        }
        assert_true(allowed > 100 && denied > 100);
        for (int w = 0; w < 2; w++) {
            rate_limiter_free(lane[w]);
            rate_limiter_free(general[w]);
        }
        rate_policy_free(p);
        rate_policy_free(q);
        rate_store_free(s1);
        rate_store_free(s2);
    }
}

static void composite_all_or_nothing(void **state)
{
    (void)state;
    rate_limiter_t *l =
        limiter_of("token-bucket 10/s burst=5; fixed-window 7/1m", NULL);
    rate_decision_t d;
    for (int i = 0; i < 5; i++)
        assert_true(at(l, "k", 0, 1, 0).allowed);
    d = at(l, "k", 0, 1, 0);
    assert_false(d.allowed);
    assert_int_equal(d.component, 0); /* the bucket denied */
    assert_int_equal(d.retry_after_ns, 100 * MS);
    assert_int_equal(d.remaining, 0);
    /* One second later the bucket is full again, the window has 2 left. */
    d = at(l, "k", SEC, 3, 0);
    assert_false(d.allowed);
    assert_int_equal(d.component, 1);
    assert_int_equal(d.retry_after_ns, 59 * SEC); /* the window's edge */
    assert_int_equal(d.remaining, 2);
    /* Nothing was charged to the bucket by that denial. */
    d = at(l, "k", SEC, 2, 0);
    assert_true(d.allowed);
    assert_int_equal(d.remaining, 0); /* smallest: the window */
    assert_int_equal(d.component, 1);
    assert_int_equal(d.limit, 7);
    assert_int_equal(d.reset_after_ns, 59 * SEC); /* largest */
    d = at(l, "k", SEC, 6, 0);
    assert_int_equal(d.reason, RATE_REASON_NEVER); /* above the burst */
    rate_limiter_free(l);
}

static void blocking_acquire(void **state)
{
    (void)state;
    fake_clock_t c = {1000 * SEC, 0, 0};
    rate_clock_t clk = {fake_now, fake_sleep, &c};
    rate_limiter_config_t cfg = {0};
    cfg.clock = &clk;
    rate_limiter_t *l = limiter_cfg("token-bucket 10/s burst=1", cfg);
    rate_decision_t d;
    const char *k = "k";

    assert_int_equal(rate_limiter_acquire(l, k, 1, 1, 0, &d), RATE_OK);
    assert_true(d.allowed);
    assert_int_equal(c.slept, 0);
    /* The next token is 100 ms away: a 50 ms deadline returns at once. */
    assert_int_equal(rate_limiter_acquire(l, k, 1, 1, 50 * MS, &d), RATE_OK);
    assert_false(d.allowed);
    assert_int_equal(c.slept, 0);
    assert_int_equal(d.retry_after_ns, 100 * MS);
    /* A 100 ms deadline is enough: it reserves and sleeps exactly that. */
    assert_int_equal(rate_limiter_acquire(l, k, 1, 1, 100 * MS, &d), RATE_OK);
    assert_true(d.allowed);
    assert_int_equal(c.slept, 100 * MS);
    assert_int_equal(d.delay_ns, 100 * MS);
    /* Never: at once. */
    assert_int_equal(rate_limiter_acquire(l, k, 1, 2, 10 * SEC, &d), RATE_OK);
    assert_int_equal(d.reason, RATE_REASON_NEVER);
    assert_int_equal(c.slept, 100 * MS);
    rate_limiter_free(l);

    /* A window waits for its edge, and never past the deadline. */
    c = (fake_clock_t){1000 * SEC + 400 * MS, 0, 0};
    l = limiter_cfg("fixed-window 1/s", cfg);
    assert_true(rate_limiter_acquire(l, k, 1, 1, 0, &d) == RATE_OK &&
                d.allowed);
    assert_int_equal(rate_limiter_acquire(l, k, 1, 1, 599 * MS, &d), RATE_OK);
    assert_false(d.allowed);
    assert_int_equal(c.slept, 0);
    assert_int_equal(rate_limiter_acquire(l, k, 1, 1, 600 * MS, &d), RATE_OK);
    assert_true(d.allowed);
    assert_int_equal(c.slept, 600 * MS);
    rate_limiter_free(l);
}

/* Tiers: free / pro keyed by prefix. */
static rate_policy_t *free_tier, *pro_tier;

static void tiers_new(void)
{
    free_tier = policy_of("token-bucket 1/s burst=2");
    pro_tier = policy_of("token-bucket 10/s burst=20");
}

static void tiers_free(void)
{
    rate_policy_free(free_tier);
    rate_policy_free(pro_tier);
}

static const rate_policy_t *tier_of(void *ud, const char *key, size_t len)
{
    (void)ud;
    if (len >= 4 && memcmp(key, "pro:", 4) == 0)
        return pro_tier;
    return free_tier;
}

static const char *upgraded;
static const rate_policy_t *upgradable(void *ud, const char *key, size_t len)
{
    (void)ud;
    (void)len;
    return upgraded != NULL && strcmp(key, upgraded) == 0 ? pro_tier
                                                           : free_tier;
}

/* A resolver's policies outlive limiters.  Each new limiter registers them
 * afresh, even one that malloc places where a freed one was, so a key's
 * state made under one of them is still read under it after an upgrade. */
static void policies_outlive_limiters(void **state)
{
    (void)state;
    tiers_new();
    rate_limiter_config_t cfg = {0};
    cfg.resolve = upgradable;
    for (int round = 0; round < 3; round++) {
        upgraded = NULL;
        rate_limiter_t *l = limiter_cfg("token-bucket 1/h burst=1", cfg);
        assert_true(at(l, "u", 0, 2, 0).allowed); /* the free bucket */
        upgraded = "u";
        rate_decision_t d = at(l, "u", 0, 1, 0);
        if (d.allowed)
            fail_msg("round %d: the upgrade lost the key's state", round);
        rate_limiter_free(l);
    }
    tiers_free();
}

static void tiers_and_upgrades(void **state)
{
    (void)state;
    tiers_new();
    rate_limiter_config_t cfg = {0};
    cfg.resolve = tier_of;
    rate_limiter_t *l = limiter_cfg("token-bucket 1/h burst=1", cfg);
    int free_ok = 0, pro_ok = 0;
    for (int i = 0; i < 30; i++) {
        free_ok += at(l, "free:1", 0, 1, 0).allowed;
        pro_ok += at(l, "pro:1", 0, 1, 0).allowed;
    }
    assert_int_equal(free_ok, 2);
    assert_int_equal(pro_ok, 20);
    rate_limiter_free(l);

    /* Upgrade mid-stream: the key keeps its tokens (0 after two requests)
     * and then refills at the pro rate. */
    cfg.resolve = upgradable;
    upgraded = NULL;
    l = limiter_cfg("token-bucket 1/h burst=1", cfg);
    assert_true(at(l, "u", 0, 2, 0).allowed);
    assert_false(at(l, "u", 0, 1, 0).allowed);
    upgraded = "u";
    rate_decision_t d = at(l, "u", 0, 1, 0);
    assert_false(d.allowed); /* still empty: state carried over */
    assert_int_equal(d.retry_after_ns, 100 * MS); /* pro refill rate */
    d = at(l, "u", 500 * MS, 5, 0);
    assert_true(d.allowed);
    assert_int_equal(d.remaining, 0);
    /* Downgrade: the pro bucket would hold 10 at 1.5 s; the free policy
     * governs the time since the last admission (at 0.5 s, with 0 tokens)
     * and refills 1 in that second. */
    d = at(l, "u", 1500 * MS, 0, 0);
    assert_int_equal(d.remaining, 10);
    upgraded = NULL;
    d = at(l, "u", 1500 * MS, 0, 0);
    assert_int_equal(d.remaining, 1);
    /* A full pro bucket (20) becomes a full free one (capped at 2). */
    upgraded = "u";
    at(l, "u", 1500 * MS, 1, 0);
    upgraded = NULL;
    d = at(l, "u", 100 * SEC, 0, 0);
    assert_int_equal(d.remaining, 2);
    /* A free key back at its cold start (full) is a cold pro key: all 20,
     * as if the store had forgotten it.  Not yet cold: carried over. */
    assert_true(at(l, "v", 0, 2, 0).allowed);
    upgraded = "v";
    d = at(l, "v", 1999 * MS, 0, 0); /* free refills 1.999 tokens by now */
    assert_int_equal(d.remaining, 19); /* pro since t_last: 19.99 */
    d = at(l, "v", 2 * SEC, 0, 0);  /* free is full again at 2 s */
    assert_int_equal(d.remaining, 20);
    rate_limiter_free(l);
    tiers_free();
}

/* A limiter configuration over a new test store whose failures the test
 * controls through *h. */
static rate_limiter_config_t on_cas_store(rate_store_t **store,
                                          cas_store_t **h)
{
    rate_limiter_config_t cfg = {0};
    assert_int_equal(cas_store_new(store, h), RATE_OK);
    cfg.store = *store;
    return cfg;
}

static void store_failure_modes(void **state)
{
    (void)state;
    rate_store_t *store;
    cas_store_t *h;
    rate_limiter_config_t cfg = on_cas_store(&store, &h);
    rate_limiter_t *closed = limiter_cfg("fixed-window 5/s", cfg);
    cfg.on_store_error = RATE_FAIL_OPEN;
    rate_limiter_t *open = limiter_cfg("fixed-window 5/s", cfg);
    cas_store_set_down(h, 1);
    rate_decision_t d = at(closed, "k", 0, 1, 0);
    assert_false(d.allowed);
    assert_int_equal(d.reason, RATE_REASON_STORE_ERROR);
    assert_int_equal(d.error, RATE_ESTORE);
    assert_false(rate_try_acquire(closed, "k", 1));
    d = at(open, "k", 0, 1, 0);
    assert_true(d.allowed);
    assert_int_equal(d.reason, RATE_REASON_STORE_ERROR);
    assert_true(rate_try_acquire(open, "k", 1));
    /* Fail-open admissions are admissions: counted as allowed. */
    rate_stats_t so;
    rate_limiter_stats(open, &so);
    assert_int_equal(so.allowed, 2);
    assert_int_equal(so.denied, 0);
    assert_int_equal(so.store_errors, 2);
    cas_store_set_down(h, 0);
    assert_true(at(closed, "k", 0, 1, 0).allowed);
    /* Conflicts are retried (counted), up to the bound. */
    cas_store_inject_conflicts(h, 3);
    assert_true(at(closed, "k", 0, 1, 0).allowed);
    rate_stats_t s;
    rate_limiter_stats(closed, &s);
    assert_int_equal(s.retries, 3);
    assert_int_equal(s.store_errors, 2);
    cas_store_inject_conflicts(h, 1000);
    d = at(closed, "k", 0, 1, 0);
    assert_int_equal(d.error, RATE_ECONFLICT);
    cas_store_inject_conflicts(h, 0);
    /* Corrupt bytes in the store: an error, and the key is not rewritten. */
    cas_store_poke(h, "k", "garbage", 7);
    d = at(closed, "k", 0, 1, 0);
    assert_int_equal(d.reason, RATE_REASON_STORE_ERROR);
    assert_int_equal(d.error, RATE_ECORRUPT);
    /* Bad input is refused whatever the fail mode. */
    assert_false(rate_try_acquire(open, NULL, 1));
    assert_false(rate_try_acquire(open, "", 1));
    rate_limiter_free(closed);
    rate_limiter_free(open);
    rate_store_free(store);
}

static void store_failure_fallback(void **state)
{
    (void)state;
    rate_store_t *store;
    cas_store_t *h;
    rate_limiter_config_t cfg = on_cas_store(&store, &h);
    cfg.on_store_error = RATE_FAIL_FALLBACK;
    rate_limiter_t *l = limiter_cfg("fixed-window 2/s", cfg);
    assert_true(at(l, "k", 0, 1, 0).allowed); /* the real store */
    cas_store_set_down(h, 1);
    /* Down: the insurance limiter enforces the same policy on its own. */
    rate_decision_t d = at(l, "k", 0, 1, 0);
    assert_true(d.allowed);
    assert_int_equal(d.reason, RATE_REASON_STORE_ERROR);
    assert_int_equal(d.error, RATE_ESTORE);
    assert_int_equal(d.remaining, 1);
    assert_true(at(l, "k", 0, 1, 0).allowed);
    d = at(l, "k", 0, 1, 0);
    assert_false(d.allowed);
    assert_int_equal(d.retry_after_ns, SEC);
    assert_int_equal(d.reason, RATE_REASON_STORE_ERROR);
    /* Back up: the real store decides again (it admitted one so far). */
    cas_store_set_down(h, 0);
    d = at(l, "k", 0, 1, 0);
    assert_true(d.allowed);
    assert_int_equal(d.reason, RATE_REASON_ALLOWED);
    assert_int_equal(d.remaining, 0);
    rate_stats_t st;
    rate_limiter_stats(l, &st);
    assert_int_equal(st.store_errors, 3);
    assert_int_equal(st.allowed, 4); /* fallback decisions count too */
    assert_int_equal(st.denied, 1);
    rate_limiter_free(l);
    rate_store_free(store);
}

/* rate_limiter_refund / _penalize / _reset: each algorithm's documented
 * change, exactly, at one instant (t = 1 s) unless said otherwise. */
static void refund_penalty_reset(void **state)
{
    (void)state;
    rate_limiter_t *l = limiter_of("token-bucket 10/s burst=10", NULL);
    for (int i = 0; i < 10; i++)
        assert_true(at(l, "k", SEC, 1, 0).allowed);
    assert_int_equal(rate_limiter_refund_at(l, "k", 1, 3, SEC), RATE_OK);
    for (int i = 0; i < 3; i++)
        assert_true(at(l, "k", SEC, 1, 0).allowed);
    assert_false(at(l, "k", SEC, 1, 0).allowed);
    /* A refund stops at the burst. */
    assert_int_equal(rate_limiter_refund_at(l, "k", 1, 100, SEC), RATE_OK);
    assert_int_equal(at(l, "k", SEC, 0, 0).remaining, 10);
    /* A penalty past what remains is a debt: 100 taken from 10 leaves -90,
     * and one token is 91 tokens away at 10/s. */
    assert_int_equal(rate_limiter_penalize_at(l, "k", 1, 100, SEC), RATE_OK);
    rate_decision_t d = at(l, "k", SEC, 1, 0);
    assert_false(d.allowed);
    assert_int_equal(d.retry_after_ns, 9100 * MS);
    /* Cancelling a reservation is refunding it: 15 reserved from a full
     * bucket waits 500 ms; refunded, 10 pass at once again. */
    assert_int_equal(rate_limiter_reset(l, "k", 1), RATE_OK);
    d = at(l, "k", SEC, 15, 0);
    assert_int_equal(d.reason, RATE_REASON_NEVER); /* above the burst */
    d = at(l, "k", SEC, 8, 0);
    assert_true(d.allowed);
    d = at(l, "k", SEC, 7, SEC); /* 5 short: 500 ms */
    assert_true(d.allowed);
    assert_int_equal(d.delay_ns, 500 * MS);
    assert_int_equal(rate_limiter_refund_at(l, "k", 1, 7, SEC), RATE_OK);
    assert_int_equal(at(l, "k", SEC, 0, 0).remaining, 2);
    /* Reset: a new key (full), and the time clamp of the old state gone. */
    assert_int_equal(rate_limiter_penalize_at(l, "k", 1, 10, 50 * SEC),
                     RATE_OK);
    assert_int_equal(rate_limiter_reset(l, "k", 1), RATE_OK);
    d = at(l, "k", SEC, 0, 0);
    assert_int_equal(d.remaining, 10);
    assert_int_equal(d.reset_after_ns, 0);
    /* Refunding a key that has no state writes nothing ("k" was reset and
     * only queried since: no key is held). */
    assert_int_equal(rate_limiter_refund_at(l, "none", 4, 1, SEC), RATE_OK);
    rate_stats_t st;
    assert_int_equal(rate_limiter_stats(l, &st), RATE_OK);
    assert_int_equal(st.keys, 0);
    /* Bad input. */
    assert_int_equal(rate_limiter_refund(NULL, "k", 1, 1), RATE_EINVAL);
    assert_int_equal(rate_limiter_penalize(l, NULL, 1, 1), RATE_EKEY);
    assert_int_equal(rate_limiter_refund_at(l, "k", 1, RATE_TIME_MAX + 1, 0),
                     RATE_ERANGE);
    assert_int_equal(rate_limiter_reset(l, "", 0), RATE_EKEY);
    rate_limiter_free(l);

    /* Leaky bucket: a penalty fills it to its capacity, no further; with
     * max_wait 0 it passes only empty again, 3 * 200 ms later. */
    l = limiter_of("leaky-bucket 5/s capacity=3", NULL);
    assert_int_equal(rate_limiter_penalize_at(l, "k", 1, 10, SEC), RATE_OK);
    d = at(l, "k", SEC, 1, 0);
    assert_false(d.allowed);
    assert_int_equal(d.retry_after_ns, 600 * MS);
    assert_int_equal(rate_limiter_refund_at(l, "k", 1, 2, SEC), RATE_OK);
    assert_int_equal(at(l, "k", SEC, 1, 0).retry_after_ns, 200 * MS);
    rate_limiter_free(l);

    /* Fixed window: refunds uncount in the current window only. */
    l = limiter_of("fixed-window 4/s", NULL);
    for (int i = 0; i < 4; i++)
        assert_true(at(l, "k", SEC, 1, 0).allowed);
    assert_int_equal(rate_limiter_refund_at(l, "k", 1, 2, SEC + 1), RATE_OK);
    assert_int_equal(at(l, "k", SEC + 2, 0, 0).remaining, 2);
    assert_int_equal(rate_limiter_refund_at(l, "k", 1, 2, 2 * SEC), RATE_OK);
    assert_int_equal(at(l, "k", 2 * SEC, 0, 0).remaining, 4); /* rolled */
    assert_int_equal(rate_limiter_penalize_at(l, "k", 1, 100, 2 * SEC),
                     RATE_OK);
    d = at(l, "k", 2 * SEC + 250 * MS, 1, 0);
    assert_false(d.allowed);
    assert_int_equal(d.retry_after_ns, 750 * MS);
    rate_limiter_free(l);

    /* Sliding window counter: from the current window, then the previous. */
    l = limiter_of("sliding-window 4/s", NULL);
    for (int i = 0; i < 3; i++)
        assert_true(at(l, "k", SEC, 1, 0).allowed);
    assert_true(at(l, "k", 2 * SEC, 1, 0).allowed); /* prev 3, curr 1 */
    assert_int_equal(rate_limiter_refund_at(l, "k", 1, 2, 2 * SEC), RATE_OK);
    /* prev 2, curr 0: at e = 0 the estimate is 2 */
    assert_int_equal(at(l, "k", 2 * SEC, 0, 0).remaining, 2);
    assert_int_equal(rate_limiter_penalize_at(l, "k", 1, 9, 2 * SEC), RATE_OK);
    assert_int_equal(at(l, "k", 2 * SEC, 0, 0).remaining, 0); /* curr 4 */
    rate_limiter_free(l);

    /* Sliding log: a refund takes from the newest entries. */
    l = limiter_of("sliding-log 4/s", NULL);
    assert_true(at(l, "k", SEC, 1, 0).allowed);
    assert_true(at(l, "k", SEC + 100 * MS, 2, 0).allowed);
    assert_int_equal(rate_limiter_refund_at(l, "k", 1, 2, SEC + 100 * MS),
                     RATE_OK);
    d = at(l, "k", SEC + 100 * MS, 0, 0);
    assert_int_equal(d.remaining, 3);
    assert_int_equal(d.reset_after_ns, 900 * MS); /* only the entry at 1 s */
    assert_int_equal(rate_limiter_penalize_at(l, "k", 1, 9, SEC + 200 * MS),
                     RATE_OK);
    d = at(l, "k", SEC + 200 * MS, 1, 0);
    assert_false(d.allowed);
    /* 1 at 1 s and the penalty's 3 at 1.2 s: one fits once 1 s leaves */
    assert_int_equal(d.retry_after_ns, 800 * MS);
    rate_limiter_free(l);
}

/* Asynchronous decisions: a store with the contract's start() completes
 * them later (the test store queues them until run), one that answers at
 * once before the call returns; either way each callback runs once, with
 * the decision the synchronous call makes. */
typedef struct async_seen {
    int calls;
    rate_decision_t d;
} async_seen_t;

static void async_cb(void *ud, int rc, const rate_decision_t *d)
{
    async_seen_t *seen = ud;
    assert_int_equal(rc, RATE_OK);
    seen->calls++;
    seen->d = *d;
}

/* An asynchronous test store (jobs run by cas_store_run_jobs) on a fake
 * clock at 1 s, a limiter of `text` on it (la), and the same policy on a
 * private memory store (lm: the reference, which answers at once). */
typedef struct async_fix {
    fake_clock_t c;
    rate_clock_t clock;
    rate_store_t *as;
    cas_store_t *h;
    rate_limiter_t *la, *lm;
} async_fix_t;

static void async_fix_new(async_fix_t *f, const char *text)
{
    f->c = (fake_clock_t){SEC, 0, 0};
    f->clock = (rate_clock_t){fake_now, fake_sleep, &f->c};
    assert_int_equal(cas_store_new_async(&f->as, &f->h), RATE_OK);
    rate_limiter_config_t cfg = {0};
    cfg.clock = &f->clock;
    cfg.store = f->as;
    f->la = limiter_cfg(text, cfg);
    cfg.store = NULL;
    f->lm = limiter_cfg(text, cfg);
}

static void async_fix_free(async_fix_t *f)
{
    rate_limiter_free(f->la);
    rate_limiter_free(f->lm);
    rate_store_free(f->as);
}

static void async_decisions(void **state)
{
    (void)state;
    async_fix_t f;
    async_fix_new(&f, "token-bucket 5/s burst=3");
    rate_limiter_t *la = f.la, *ls = f.lm;
    cas_store_t *h = f.h;
    /* Nothing queued: on a store that completes later the policy's record
     * is written at the first decision, through the store (a job of its
     * own, before the decision's). */
    assert_int_equal(cas_store_run_jobs(h), 0);
    enum { N = 40 };
    static async_seen_t seen[N];
    memset(seen, 0, sizeof seen);
    rate_decision_t ref[N], now_d;
    for (int round = 0; round < 2; round++) {
        for (int i = 0; i < N; i++) {
            const char *key = i % 2 ? "a" : "b";
            f.c.now = SEC + (uint64_t)(round * N + i) * 50 * MS;
            assert_int_equal(rate_limiter_check_start(la, key, 1, 1, 0, &now_d,
                                                      async_cb, &seen[i]),
                             RATE_PENDING);
            assert_int_equal(seen[i].calls, round); /* not yet */
            assert_int_equal(rate_limiter_check(ls, key, 1, 1, 0, &ref[i]),
                             RATE_OK);
            /* One at a time, so that the two see the same sequence. */
            assert_int_equal(cas_store_run_jobs(h),
                             round == 0 && i == 0 ? 2 : 1);
            assert_int_equal(seen[i].calls, round + 1);
            assert_memory_equal(&seen[i].d, &ref[i], sizeof ref[i]);
        }
    }
    /* Many in flight at once: each completes once. */
    for (int i = 0; i < N; i++)
        assert_int_equal(rate_limiter_check_start(la, "many", 4, 1, 0, &now_d,
                                                  async_cb, &seen[i]),
                         RATE_PENDING);
    assert_int_equal(cas_store_run_jobs(h), N);
    int allowed = 0;
    for (int i = 0; i < N; i++) {
        assert_int_equal(seen[i].calls, 3);
        allowed += seen[i].d.allowed;
    }
    assert_int_equal(allowed, 3); /* the burst, at one instant */
    /* A store failure is the fail mode's, in the callback. */
    cas_store_set_down(h, 1);
    assert_int_equal(rate_limiter_check_start(la, "a", 1, 1, 0, &now_d,
                                              async_cb, &seen[0]),
                     RATE_PENDING);
    assert_int_equal(cas_store_run_jobs(h), 1);
    assert_int_equal(seen[0].calls, 4);
    assert_false(seen[0].d.allowed);
    assert_int_equal(seen[0].d.reason, RATE_REASON_STORE_ERROR);
    cas_store_set_down(h, 0);
    /* A store that answers at once: the decision is the call's, and the
     * callback never runs. */
    memset(&seen[0], 0, sizeof seen[0]);
    assert_int_equal(rate_limiter_check_start(ls, "z", 1, 1, 0, &now_d,
                                              async_cb, &seen[0]),
                     RATE_OK);
    assert_int_equal(seen[0].calls, 0);
    assert_true(now_d.allowed);
    /* Bad input: an error and no callback. */
    assert_int_equal(rate_limiter_check_start(ls, "", 0, 1, 0, &now_d,
                                              async_cb, &seen[0]),
                     RATE_EKEY);
    assert_int_equal(rate_limiter_check_start(ls, "z", 1, 1, 0, &now_d, NULL,
                                              NULL),
                     RATE_EINVAL);
    assert_int_equal(rate_limiter_check_start(NULL, "z", 1, 1, 0, &now_d,
                                              async_cb, &seen[0]),
                     RATE_EINVAL);
    assert_int_equal(seen[0].calls, 0);
    rate_stats_t st;
    rate_limiter_stats(la, &st);
    assert_int_equal(st.allowed + st.denied, 2 * N + N + 1);
    async_fix_free(&f);
}

/* On a store that completes later nothing waits for a policy's record:
 * the call's policy is registered, and a foreign policy met in a state is
 * learnt, by jobs of the store's own, each before the decision that needs
 * it; the decisions are the synchronous ones; a record that cannot be
 * written is the fail mode's, and is written at the next decision. */
static void async_records(void **state)
{
    (void)state;
    rate_store_t *as, *ref;
    cas_store_t *h;
    assert_int_equal(cas_store_new_async(&as, &h), RATE_OK);
    assert_int_equal(cas_store_new(&ref, NULL), RATE_OK);
    rate_limiter_t *a1 = limiter_of("token-bucket 5/s burst=3", as);
    rate_limiter_t *r1 = limiter_of("token-bucket 5/s burst=3", ref);
    rate_decision_t rd, out;
    async_seen_t seen = {0, {0}};
    /* a1's record: at its first decision, a job before the decision's */
    assert_int_equal(cas_store_run_jobs(h), 0);
    assert_int_equal(rate_limiter_check_start_at(a1, "k", 1, 2, 0, SEC, &out,
                                                 async_cb, &seen),
                     RATE_PENDING);
    assert_int_equal(cas_store_run_jobs(h), 2);
    assert_int_equal(seen.calls, 1);
    assert_int_equal(rate_limiter_check_at(r1, "k", 1, 2, 0, SEC, &rd),
                     RATE_OK);
    assert_memory_equal(&seen.d, &rd, sizeof rd);
    /* a2 meets a1's state: a1's policy is learnt through the store (the
     * decision, the learning, the decision again), after a2's record */
    rate_limiter_t *a2 = limiter_of("fixed-window 4/s", as);
    rate_limiter_t *r2 = limiter_of("fixed-window 4/s", ref);
    assert_int_equal(rate_limiter_check_start_at(a2, "k", 1, 1, 0,
                                                 SEC + 100 * MS, &out,
                                                 async_cb, &seen),
                     RATE_PENDING);
    assert_int_equal(cas_store_run_jobs(h), 4);
    assert_int_equal(seen.calls, 2);
    assert_int_equal(rate_limiter_check_at(r2, "k", 1, 1, 0, SEC + 100 * MS,
                                           &rd),
                     RATE_OK);
    assert_memory_equal(&seen.d, &rd, sizeof rd);
    /* Known now: one job a decision. */
    assert_int_equal(rate_limiter_check_start_at(a2, "k", 1, 1, 0,
                                                 SEC + 200 * MS, &out,
                                                 async_cb, &seen),
                     RATE_PENDING);
    assert_int_equal(cas_store_run_jobs(h), 1);
    assert_int_equal(seen.calls, 3);
    /* A record that cannot be written: the fail mode's (closed here), and
     * tried again at the next decision. */
    rate_limiter_config_t cfg = {0};
    cfg.store = as;
    cfg.on_store_error = RATE_FAIL_CLOSED;
    /* (10: charged a2's window and the 4 the one before can hold) */
    rate_limiter_t *a3 = limiter_cfg("sliding-window 10/s", cfg);
    cas_store_set_down(h, 1);
    assert_int_equal(rate_limiter_check_start_at(a3, "k", 1, 1, 0,
                                                 SEC + 300 * MS, &out,
                                                 async_cb, &seen),
                     RATE_PENDING);
    assert_int_equal(cas_store_run_jobs(h), 1); /* the record's job failed */
    assert_int_equal(seen.calls, 4);
    assert_false(seen.d.allowed);
    assert_int_equal(seen.d.reason, RATE_REASON_STORE_ERROR);
    cas_store_set_down(h, 0);
    assert_int_equal(rate_limiter_check_start_at(a3, "k", 1, 1, 0,
                                                 SEC + 400 * MS, &out,
                                                 async_cb, &seen),
                     RATE_PENDING);
    /* its record, then a2's state's policy learnt as above */
    assert_int_equal(cas_store_run_jobs(h), 4);
    assert_int_equal(seen.calls, 5);
    assert_true(seen.d.allowed);
    /* A burst of first decisions writes one record: the others wait on
     * it, and hear its failure too. */
    enum { B = 5 };
    async_seen_t burst[B];
    memset(burst, 0, sizeof burst);
    rate_limiter_t *a4 = limiter_cfg("sliding-log 3/s", cfg);
    cas_store_set_down(h, 1);
    for (int i = 0; i < B; i++)
        assert_int_equal(rate_limiter_check_start_at(a4, "b", 1, 1, 0,
                                                     SEC + 500 * MS, &out,
                                                     async_cb, &burst[i]),
                         RATE_PENDING);
    assert_int_equal(cas_store_run_jobs(h), 1); /* one record job */
    for (int i = 0; i < B; i++) {
        assert_int_equal(burst[i].calls, 1);
        assert_int_equal(burst[i].d.reason, RATE_REASON_STORE_ERROR);
    }
    cas_store_set_down(h, 0);
    for (int i = 0; i < B; i++)
        assert_int_equal(rate_limiter_check_start_at(a4, "b", 1, 1, 0,
                                                     SEC + 600 * MS, &out,
                                                     async_cb, &burst[i]),
                         RATE_PENDING);
    assert_int_equal(cas_store_run_jobs(h), 1 + B); /* a record, B decisions */
    int admitted = 0;
    for (int i = 0; i < B; i++) {
        assert_int_equal(burst[i].calls, 2);
        admitted += burst[i].d.allowed;
    }
    assert_int_equal(admitted, 3);
    /* 10 s of the limiter's time on, its record is checked again (the
     * store may have lost it): a job before the decision's, once. */
    assert_int_equal(rate_limiter_check_start_at(a4, "b", 1, 1, 0,
                                                 SEC + 11 * SEC, &out,
                                                 async_cb, &burst[0]),
                     RATE_PENDING);
    assert_int_equal(cas_store_run_jobs(h), 2);
    assert_int_equal(rate_limiter_check_start_at(a4, "b", 1, 1, 0,
                                                 SEC + 12 * SEC, &out,
                                                 async_cb, &burst[0]),
                     RATE_PENDING);
    assert_int_equal(cas_store_run_jobs(h), 1);
    assert_int_equal(burst[0].calls, 4);
    rate_limiter_free(a4);
    rate_limiter_free(a1);
    rate_limiter_free(a2);
    rate_limiter_free(a3);
    rate_limiter_free(r1);
    rate_limiter_free(r2);
    rate_store_free(as);
    rate_store_free(ref);
}

/* Refunds and penalties that do not wait: through a store's start() (its
 * policy's record first on a new limiter), their result in the callback;
 * at once on a store that answers at once; errors. */
static int adjusted_calls, adjusted_rc;
static void on_adjusted(void *ud, int rc)
{
    (void)ud;
    adjusted_calls++;
    adjusted_rc = rc;
}

static void async_adjust(void **state)
{
    (void)state;
    async_fix_t f;
    async_fix_new(&f, "fixed-window 3/s");
    rate_limiter_t *la = f.la, *lm = f.lm;
    cas_store_t *h = f.h;
    /* A refund first: the record's job, then the refund's. */
    adjusted_calls = 0;
    assert_int_equal(rate_limiter_refund_start(la, "k", 1, 1, on_adjusted,
                                               NULL),
                     RATE_PENDING);
    assert_int_equal(cas_store_run_jobs(h), 2);
    assert_int_equal(adjusted_calls, 1);
    assert_int_equal(adjusted_rc, RATE_OK);
    rate_decision_t d;
    for (int i = 0; i < 3; i++) {
        assert_int_equal(rate_limiter_check(la, "k", 1, 1, 0, &d), RATE_OK);
        assert_true(d.allowed);
    }
    assert_int_equal(rate_limiter_check(la, "k", 1, 1, 0, &d), RATE_OK);
    assert_false(d.allowed);
    /* Two refunded: two more pass. */
    assert_int_equal(rate_limiter_refund_start(la, "k", 1, 2, on_adjusted,
                                               NULL),
                     RATE_PENDING);
    assert_int_equal(adjusted_calls, 1); /* not yet */
    assert_int_equal(cas_store_run_jobs(h), 1);
    assert_int_equal(adjusted_calls, 2);
    assert_int_equal(adjusted_rc, RATE_OK);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(rate_limiter_check(la, "k", 1, 1, 0, &d), RATE_OK);
        assert_true(d.allowed);
    }
    assert_int_equal(rate_limiter_check(la, "k", 1, 1, 0, &d), RATE_OK);
    assert_false(d.allowed);
    /* A penalty on a fresh key takes its permits. */
    assert_int_equal(rate_limiter_penalize_start(la, "p", 1, 3, on_adjusted,
                                                 NULL),
                     RATE_PENDING);
    assert_int_equal(cas_store_run_jobs(h), 1);
    assert_int_equal(adjusted_calls, 3);
    assert_int_equal(adjusted_rc, RATE_OK);
    assert_int_equal(rate_limiter_check(la, "p", 1, 1, 0, &d), RATE_OK);
    assert_false(d.allowed);
    /* The store's error is the callback's, as is: no fail mode. */
    cas_store_set_down(h, 1);
    assert_int_equal(rate_limiter_refund_start(la, "k", 1, 1, on_adjusted,
                                               NULL),
                     RATE_PENDING);
    assert_int_equal(cas_store_run_jobs(h), 1);
    assert_int_equal(adjusted_calls, 4);
    assert_int_equal(adjusted_rc, RATE_ESTORE);
    cas_store_set_down(h, 0);
    /* A store that answers at once: the result now, no callback. */
    assert_true(at(lm, "m", SEC, 3, 0).allowed);
    assert_int_equal(rate_limiter_refund_start(lm, "m", 1, 1, on_adjusted,
                                               NULL),
                     RATE_OK);
    assert_int_equal(adjusted_calls, 4);
    assert_true(at(lm, "m", SEC, 1, 0).allowed);
    /* Bad input: an error, no callback. */
    assert_int_equal(rate_limiter_refund_start(la, "", 0, 1, on_adjusted,
                                               NULL),
                     RATE_EKEY);
    assert_int_equal(rate_limiter_refund_start(la, "k", 1, 1, NULL, NULL),
                     RATE_EINVAL);
    assert_int_equal(rate_limiter_penalize_start(NULL, "k", 1, 1,
                                                 on_adjusted, NULL),
                     RATE_EINVAL);
    assert_int_equal(rate_limiter_refund_start(la, "k", 1, RATE_TIME_MAX + 1,
                                               on_adjusted, NULL),
                     RATE_ERANGE);
    assert_int_equal(cas_store_run_jobs(h), 0);
    assert_int_equal(adjusted_calls, 4);
    async_fix_free(&f);
}

/* The contract's versions: the decide() of a version-3 table, or of a
 * version-4 one without decide_changes, is asked for admissions only,
 * never for a refund or a penalty (they take load and cas, synchronous
 * and through start() alike, as before version 4); a table with
 * decide_changes is asked for each refund and penalty first, and when it
 * declines they still take load and cas.  Either way every decision is
 * the memory store's, field by field. */
static void decide_asked_for_changes_from_v4(void **state)
{
    (void)state;
    /* a version-3 table; a version-4 one without decide_changes (a store
     * only rebuilt against the new header); one with it */
    for (int variant = 0; variant < 3; variant++) {
        int version = variant == 0 ? 3 : 4;
        bool changes = variant == 2;
        rate_store_t *s, *ms;
        cas_store_t *h;
        assert_int_equal(cas_store_new_recording(&s, &h, version, changes),
                         RATE_OK);
        assert_int_equal(rate_store_memory_new(NULL, &ms), RATE_OK);
        fake_clock_t clk = {SEC, 0, 0};
        rate_clock_t fc = {fake_now, fake_sleep, &clk};
        rate_limiter_config_t cfg = {0};
        cfg.clock = &fc;
        cfg.store = s;
        rate_limiter_t *l = limiter_cfg("token-bucket 5/s burst=3", cfg);
        cfg.store = ms;
        rate_limiter_t *m = limiter_cfg("token-bucket 5/s burst=3", cfg);
        unsigned decisions = 0, refunds = 0, penalties = 0;
        for (int i = 0; i < 40; i++) {
            clk.now += 70 * MS;
            rate_decision_t a = at(m, "k", clk.now, 1 + (uint64_t)(i % 2), 0);
            rate_decision_t b = at(l, "k", clk.now, 1 + (uint64_t)(i % 2), 0);
            expect_same_decision(&a, &b, "v3/v4 table", "recording", i,
                                 clk.now, 1, 0);
            decisions++;
            uint64_t n = (uint64_t)(i % 4);
            switch (i % 4) {
            case 0: /* synchronous, at the caller's time and the clock's */
                assert_int_equal(rate_limiter_refund_at(m, "k", 1, n, clk.now),
                                 RATE_OK);
                assert_int_equal(rate_limiter_refund_at(l, "k", 1, n, clk.now),
                                 RATE_OK);
                refunds++;
                break;
            case 1:
                assert_int_equal(rate_limiter_penalize(m, "k", 1, n), RATE_OK);
                assert_int_equal(rate_limiter_penalize(l, "k", 1, n), RATE_OK);
                penalties++;
                break;
            default: /* through start(): queued, then run */
                adjusted_calls = 0;
                assert_int_equal(
                    i % 4 == 2 ? rate_limiter_refund(m, "k", 1, n)
                               : rate_limiter_penalize(m, "k", 1, n),
                    RATE_OK);
                assert_int_equal(
                    i % 4 == 2
                        ? rate_limiter_refund_start(l, "k", 1, n, on_adjusted,
                                                    NULL)
                        : rate_limiter_penalize_start(l, "k", 1, n,
                                                      on_adjusted, NULL),
                    RATE_PENDING);
                cas_store_run_jobs(h);
                assert_int_equal(adjusted_calls, 1);
                assert_int_equal(adjusted_rc, RATE_OK);
                if (i % 4 == 2)
                    refunds++;
                else
                    penalties++;
            }
        }
        unsigned acq = cas_store_asked(h, RATE_DECIDE_ACQUIRE),
                 ref = cas_store_asked(h, RATE_DECIDE_REFUND),
                 pen = cas_store_asked(h, RATE_DECIDE_PENALTY);
        if (acq != decisions || ref != (changes ? refunds : 0) ||
            pen != (changes ? penalties : 0))
            fail_msg("a version-%d table (decide_changes %d) was asked %u "
                     "admissions (of %u), %u refunds (of %u), %u penalties "
                     "(of %u)",
                     version, changes, acq, decisions, ref, refunds, pen,
                     penalties);
        rate_limiter_free(l);
        rate_limiter_free(m);
        rate_store_free(s);
        rate_store_free(ms);
    }
}

/* Block after a breach (rate_limit_t.block_ns): once a blocking limit
 * denies a request, the key stays denied for the block, whatever its
 * limits say; retry_after says when; a "never" does not block; the store
 * keeps the key through the block; a reset ends it. */
static void block_after_breach(void **state)
{
    (void)state;
    rate_limit_t lim = {RATE_TOKEN_BUCKET, 2, SEC, 2, 10 * SEC, {0}};
    rate_policy_t *p;
    char err[200];
    assert_int_equal(rate_policy_new(&lim, 1, &p, err, sizeof err), RATE_OK);
    rate_store_t *s;
    cas_store_t *h;
    assert_int_equal(cas_store_new(&s, &h), RATE_OK);
    rate_limiter_config_t cfg = {.policy = p, .store = s};
    rate_limiter_t *l;
    assert_int_equal(rate_limiter_new(&cfg, &l), RATE_OK);
    assert_true(at(l, "k", SEC, 1, 0).allowed);
    assert_true(at(l, "k", SEC, 1, 0).allowed);
    /* Above the burst: "never", which does not block. */
    assert_int_equal(at(l, "k", SEC, 3, 0).reason, RATE_REASON_NEVER);
    assert_false(rate_try_acquire_at(l, "k", 1, SEC)); /* the breach */
    rate_decision_t d = at(l, "k", 2 * SEC, 1, 0); /* refilled, but blocked */
    assert_false(d.allowed);
    assert_int_equal(d.reason, RATE_REASON_LIMITED);
    assert_int_equal(d.retry_after_ns, 9 * SEC);
    assert_int_equal(d.reset_after_ns, 9 * SEC);
    assert_true(cas_store_ttl(h, "k") >= 10 * SEC); /* kept through it */
    d = at(l, "k", 11 * SEC - 1, 1, 0);
    assert_false(d.allowed);
    assert_int_equal(d.retry_after_ns, 1);
    d = at(l, "k", 11 * SEC, 1, 0);
    assert_true(d.allowed);
    assert_int_equal(d.remaining, 1);
    /* A query while blocked is allowed (a query always is) and says that
     * nothing remains until the block's end. */
    assert_true(at(l, "k", 11 * SEC, 1, 0).allowed);
    assert_false(at(l, "k", 11 * SEC, 1, 0).allowed); /* breach again */
    d = at(l, "k", 11 * SEC, 0, 0);
    assert_true(d.allowed);
    assert_int_equal(d.remaining, 0);
    assert_int_equal(d.reset_after_ns, 10 * SEC);
    assert_int_equal(at(l, "k", 11 * SEC, 1, 0).retry_after_ns, 10 * SEC);
    /* A reset ends the block. */
    assert_int_equal(rate_limiter_reset(l, "k", 1), RATE_OK);
    assert_true(at(l, "k", 12 * SEC, 1, 0).allowed);
    rate_limiter_free(l);
    /* Bounds. */
    rate_policy_t *q;
    lim.block_ns = (UINT64_C(1) << 61) + 1;
    assert_int_equal(rate_policy_new(&lim, 1, &q, err, sizeof err),
                     RATE_EPOLICY);
    assert_non_null(strstr(err, "block"));
    rate_policy_free(p);
    rate_store_free(s);

    /* A blocking sliding log asked at a time before its last admission
     * (which counts as that time): decided, not taken for a corrupt log. */
    l = limiter_of("sliding-log 3/1s block=5s", NULL);
    assert_true(at(l, "k", 10 * SEC, 1, 0).allowed);
    rate_decision_t e = at(l, "k", 9 * SEC, 1, 0);
    assert_true(e.allowed);
    assert_int_equal(e.reason, RATE_REASON_ALLOWED);
    rate_limiter_free(l);
}

/* A decision and a refund under a policy the caller gives (what the rules
 * layer uses): that policy decides, not the limiter's default, and the
 * key's state is the one every policy shares. */
static void under_a_given_policy(void **state)
{
    (void)state;
    fake_clock_t c = {.now = 1000 * SEC};
    rate_clock_t clk = {fake_now, fake_sleep, &c};
    rate_limiter_t *l =
        limiter_cfg("token-bucket 1/h burst=10",
                    (rate_limiter_config_t){.clock = &clk});
    rate_policy_t *strict;
    rate_decision_t d;
    assert_int_equal(rate_policy_parse("token-bucket 1/h burst=2", &strict,
                                       NULL, 0), RATE_OK);
    assert_int_equal(rate_limiter_check_policy(l, strict, "k", 1, 1, 0, &d),
                     RATE_OK);
    assert_true(d.allowed);
    assert_int_equal(d.limit, 2);
    assert_int_equal(d.remaining, 1);
    assert_int_equal(rate_limiter_check_policy_at(l, strict, "k", 1, 1, 0,
                                                  1000 * SEC, &d), RATE_OK);
    assert_true(d.allowed);
    assert_int_equal(rate_limiter_check_policy(l, strict, "k", 1, 1, 0, &d),
                     RATE_OK);
    assert_false(d.allowed); /* the given policy's burst, not the default's */
    assert_int_equal(rate_limiter_refund_policy(l, strict, "k", 1, 1), RATE_OK);
    assert_int_equal(rate_limiter_check_policy(l, strict, "k", 1, 1, 0, &d),
                     RATE_OK);
    assert_true(d.allowed); /* the refund gave one back */
    assert_int_equal(rate_limiter_refund_policy_at(l, strict, "k", 1, 1,
                                                   1000 * SEC), RATE_OK);
    /* Bad input. */
    d.allowed = true;
    assert_int_equal(rate_limiter_check_policy(l, NULL, "k", 1, 1, 0, &d),
                     RATE_EINVAL);
    assert_false(d.allowed);
    assert_int_equal(rate_limiter_check_policy_at(l, NULL, "k", 1, 1, 0, 0,
                                                  &d), RATE_EINVAL);
    assert_int_equal(rate_limiter_refund_policy(l, NULL, "k", 1, 1),
                     RATE_EINVAL);
    assert_int_equal(rate_limiter_refund_policy_at(l, NULL, "k", 1, 1, 0),
                     RATE_EINVAL);
    assert_int_equal(rate_limiter_check_policy(l, strict, "", 0, 1, 0, &d),
                     RATE_EKEY);
    assert_int_equal(rate_limiter_check_policy(NULL, strict, "k", 1, 1, 0,
                                               &d), RATE_EINVAL);
    rate_limiter_free(l);
    rate_policy_free(strict);
}

/* The library's clocks: each the same static clock at every call, each
 * reading its own kernel clock (the wall's the epoch's time, which no
 * monotonic clock is near), and their sleep waiting at least its span. */
static void the_clocks(void **state)
{
    (void)state;
    const rate_clock_t *c[3] = {rate_clock_exact(), rate_clock_coarse(),
                                rate_clock_wall()};
    assert_ptr_equal(c[0], rate_clock_exact());
    assert_ptr_equal(c[1], rate_clock_coarse());
    assert_ptr_equal(c[2], rate_clock_wall());
    struct timespec a, b;
    clock_gettime(CLOCK_REALTIME, &a);
    uint64_t mono = rate_clock_monotonic_ns();
    uint64_t t[3] = {c[0]->now_ns(c[0]->ud), c[1]->now_ns(c[1]->ud),
                     c[2]->now_ns(c[2]->ud)};
    clock_gettime(CLOCK_REALTIME, &b);
    assert_true(t[0] >= mono && t[0] <= rate_clock_monotonic_ns());
    /* the coarse clock lags by at most a tick (1-10 ms); a second here */
    assert_true(t[1] + 1000000000u >= mono && t[1] <= rate_clock_monotonic_ns());
    assert_true(t[2] >= (uint64_t)a.tv_sec * 1000000000u + (uint64_t)a.tv_nsec);
    assert_true(t[2] <= (uint64_t)b.tv_sec * 1000000000u + (uint64_t)b.tv_nsec);
    for (int i = 0; i < 3; i++) {
        uint64_t before = rate_clock_monotonic_ns();
        c[i]->sleep_ns(c[i]->ud, 2000000); /* 2 ms */
        assert_true(rate_clock_monotonic_ns() - before >= 2000000);
    }
}

/* The small calls, each as its header documents it: NULL arguments, the
 * limiter's accessors, the store contract's fair door and the shared-memory
 * calls given another store. */
static void small_calls_as_documented(void **state)
{
    (void)state;
    assert_int_equal(rate_limiter_id(NULL), 0);
    assert_null(rate_limiter_clock(NULL));
    assert_null(rate_limiter_store(NULL));
    assert_int_equal(rate_policy_state_max(NULL), 0);
    assert_int_equal(rate_policy_fingerprint(NULL), 0);
    assert_string_equal(rate_strerror(12345), "unknown error");
    assert_string_equal(rate_err_name(12345), "RATE_EUNKNOWN");
    assert_string_equal(rate_reason_name((rate_reason_t)77), "unknown");
    assert_null(rate_algorithm_name((rate_algorithm_t)0));

    rate_limiter_t *a = limiter_of("token-bucket 1/s burst=1", NULL);
    rate_limiter_t *b = limiter_of("token-bucket 1/s burst=1", NULL);
    assert_int_not_equal(rate_limiter_id(a), 0);
    assert_int_not_equal(rate_limiter_id(a), rate_limiter_id(b));
    assert_ptr_equal(rate_limiter_clock(a)->now_ns, rate_clock_exact()->now_ns);
    rate_store_t *st = rate_limiter_store(a);
    assert_non_null(st);
    assert_int_equal(rate_store_check_policy(st, NULL, NULL, 0), RATE_EINVAL);
    assert_int_equal(rate_store_check_policy(NULL, rate_limiter_policy(a),
                                             NULL, 0),
                     RATE_EINVAL);
    assert_int_equal(rate_store_check_policy(st, rate_limiter_policy(a), NULL,
                                             0),
                     RATE_OK);
    /* Calls of the shared-memory store, given the memory store. */
    rate_shm_info_t info;
    assert_int_equal(rate_store_shm_info(st, &info), RATE_EINVAL);
    assert_int_equal(rate_store_shm_check(st, NULL, 0), RATE_EINVAL);
    assert_int_equal(rate_store_shm_drop(st), RATE_EINVAL);

    /* rate_limiter_check_fair: the probe, then each bad input. */
    assert_int_equal(rate_limiter_check_fair(NULL, NULL, NULL, 0, NULL, 1,
                                             NULL),
                     RATE_ENOTSUP);
    assert_int_equal(rate_limiter_check_fair(a, NULL, NULL, 0, NULL, 1, NULL),
                     RATE_ENOTSUP); /* the memory store has no fair() */
    rate_fair_req_t good = {.flow_hash = 1, .weight = 1, .slots = 8};
    rate_fair_req_t bad[] = {
        {.flow_hash = 0, .weight = 1, .slots = 8},
        {.flow_hash = 1, .weight = 0, .slots = 8},
        {.flow_hash = 1, .weight = (1u << 20) + 1, .slots = 8},
        {.flow_hash = 1, .weight = 1, .slots = 0},
        {.flow_hash = 1, .weight = 1, .slots = 4097},
        {.flow_hash = 1, .weight = 1, .slots = 8, .reserved = {0, 0, 0, 1}},
    };
    rate_decision_t d;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        memset(&d, 0xff, sizeof d);
        assert_int_equal(rate_limiter_check_fair(a, NULL, "k", 1, &bad[i], 1,
                                                 &d),
                         RATE_EINVAL);
        assert_false(d.allowed); /* zeroed */
    }
    assert_int_equal(rate_limiter_check_fair(NULL, NULL, "k", 1, &good, 1, &d),
                     RATE_EINVAL);
    assert_int_equal(rate_limiter_check_fair(a, NULL, "k", 1, NULL, 1, &d),
                     RATE_EINVAL);
    assert_int_equal(rate_limiter_check_fair(a, NULL, "k", 1, &good, 1, NULL),
                     RATE_EINVAL);
    assert_int_equal(rate_limiter_check_fair(a, NULL, "k", 1, &good, 1, &d),
                     RATE_ENOTSUP); /* good input, no fair() here */
    rate_limiter_free(b);
    rate_limiter_free(a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(bad_input),
        cmocka_unit_test(the_clocks),
        cmocka_unit_test(seed_interface),
        cmocka_unit_test(under_a_given_policy),
        cmocka_unit_test(keys_with_length),
        cmocka_unit_test(keys_of_every_short_length),
        cmocka_unit_test(shadow_mode),
        cmocka_unit_test(bool_api_lane),
        cmocka_unit_test(composite_all_or_nothing),
        cmocka_unit_test(blocking_acquire),
        cmocka_unit_test(tiers_and_upgrades),
        cmocka_unit_test(policies_outlive_limiters),
        cmocka_unit_test(store_failure_modes),
        cmocka_unit_test(store_failure_fallback),
        cmocka_unit_test(refund_penalty_reset),
        cmocka_unit_test(async_decisions),
        cmocka_unit_test(async_records),
        cmocka_unit_test(async_adjust),
        cmocka_unit_test(decide_asked_for_changes_from_v4),
        cmocka_unit_test(block_after_breach),
        cmocka_unit_test(small_calls_as_documented),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
