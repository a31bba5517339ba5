/* SPDX-License-Identifier: MIT */
/*
 * Tests written against mutations that the rest of the suite let through:
 * each case names the line of behaviour it holds.  Memory and CAS stores only; the Redis ones
 * are in test_redis_mutants.c.
 */
#include "lib/helpers.h"

#include "registry.h"

/* ------------------------------------------- the fallback's own clock */

/* A store whose policy records work (kept in an inner CAS store) but
 * whose states fail, with a clock of its own far from the limiter's. */
static rate_store_t *inner;
static uint64_t store_time;
static unsigned now_calls;

static int f_load(void *self, const rate_key_t *key, void *buf, size_t cap,
                  size_t *len, uint64_t *version)
{
    (void)self;
    if (key->space != RATE_SPACE_POLICY)
        return RATE_ESTORE;
    return inner->m->load(inner->self, key, buf, cap, len, version);
}

static int f_cas(void *self, const rate_key_t *key, uint64_t version,
                 const void *state, size_t len, uint64_t ttl_ns)
{
    (void)self;
    if (key->space != RATE_SPACE_POLICY)
        return RATE_ESTORE;
    return inner->m->cas(inner->self, key, version, state, len, ttl_ns);
}

static int f_now(void *self, uint64_t *now_ns)
{
    (void)self;
    now_calls++;
    *now_ns = store_time;
    return RATE_OK;
}

static int f_remove(void *self, const rate_key_t *key)
{
    (void)self;
    (void)key;
    return RATE_ESTORE;
}

static void f_destroy(void *self) { (void)self; }

static const rate_store_methods_t failing_methods = {
    .version = RATE_STORE_VERSION,
    .name = "failing",
    .load = f_load,
    .cas = f_cas,
    .now = f_now,
    .remove = f_remove,
    .destroy = f_destroy,
};

static fake_clock_t own;

/* limiter.c finish(): the fallback decides at the limiter's own time, not
 * at the time the failed store's clock gave (store_part had already set
 * the step's time to it). */
static void fallback_keeps_the_limiters_clock(void **state)
{
    (void)state;
    rate_store_t *s;
    assert_int_equal(cas_store_new(&inner, NULL), RATE_OK);
    assert_int_equal(rate_store_new(&failing_methods, NULL, &s), RATE_OK);
    rate_clock_t clk = {fake_now, fake_sleep, &own};
    rate_limiter_config_t cfg = {0};
    cfg.store = s;
    cfg.clock = &clk;
    cfg.on_store_error = RATE_FAIL_FALLBACK;
    rate_limiter_t *l = limiter_cfg("fixed-window 2/h", cfg);
    own.now = 100 * SEC;    /* 3500 s left in the hour */
    store_time = 1000 * SEC; /* 2600 s left in the hour */
    now_calls = 0;
    rate_decision_t d;
    assert_int_equal(rate_limiter_check(l, "k", 1, 1, 0, &d), RATE_OK);
    assert_true(now_calls > 0); /* the failed store's clock was read */
    assert_true(d.allowed);
    assert_int_equal(d.reason, RATE_REASON_STORE_ERROR);
    assert_int_equal(d.error, RATE_ESTORE);
    assert_int_equal(d.remaining, 1);
    assert_int_equal(d.reset_after_ns, 3500 * SEC);
    /* Later on the limiter's clock, still in its first hour: the same
     * fallback window, whatever the store's clock says. */
    own.now = 3000 * SEC;
    store_time = 4000 * SEC; /* the store's next hour */
    assert_int_equal(rate_limiter_check(l, "k", 1, 1, 0, &d), RATE_OK);
    assert_true(d.allowed);
    assert_int_equal(d.remaining, 0);
    assert_int_equal(d.reset_after_ns, 600 * SEC);
    assert_false(rate_try_acquire(l, "k", 1));
    rate_limiter_free(l);
    rate_store_free(s);
    rate_store_free(inner);
}

/* --------------------------------- a token bucket's debt, converted */

/* token_bucket.c tb_convert: on a policy change a debt is carried over
 * rounded further into debt (floor), never toward zero. */
static void debt_rounds_down_on_a_tier_change(void **state)
{
    (void)state;
    rate_store_t *ms;
    assert_int_equal(rate_store_memory_new(NULL, &ms), RATE_OK);
    rate_limiter_t *a = limiter_of("token-bucket 1/7s burst=2", ms);
    rate_limiter_t *b = limiter_of("token-bucket 1/s burst=2", ms);
    uint64_t t0 = 10 * SEC;
    rate_decision_t d = at(a, "k", t0, 2, 0); /* empty at t0 */
    assert_true(d.allowed);
    /* 3 ns later: 3 / 7e9 of a token, then one token reserved: a debt
     * of 1 - 3/7e9 tokens, 7e9 - 3 ns of the old refill. */
    d = at(a, "k", t0 + 3, 1, 10 * SEC);
    assert_true(d.allowed);
    assert_int_equal(d.delay_ns, 7 * SEC - 3);
    /* Under a policy of 1 token a second: a debt of (7e9 - 3) / 7 ns,
     * 999999999.57, carried as 1e9 ns (floor into debt): 2 s until one
     * token, not 1999999999 ns. */
    d = at(b, "k", t0 + 3, 1, 0);
    assert_false(d.allowed);
    assert_int_equal(d.retry_after_ns, 2 * SEC);
    rate_limiter_free(a);
    rate_limiter_free(b);
    rate_store_free(ms);
}

/* -------------------------------------------------- rate_store_new */

static int m_load(void *s, const rate_key_t *k, void *b, size_t c, size_t *l,
                  uint64_t *v)
{
    (void)s, (void)k, (void)b, (void)c, (void)l, (void)v;
    return RATE_ESTORE;
}
static int m_cas(void *s, const rate_key_t *k, uint64_t v, const void *st,
                 size_t l, uint64_t t)
{
    (void)s, (void)k, (void)v, (void)st, (void)l, (void)t;
    return RATE_ESTORE;
}
static int m_update(void *s, const rate_key_t *k, const rate_step_t *st)
{
    (void)s, (void)k, (void)st;
    return RATE_ESTORE;
}
static int m_remove(void *s, const rate_key_t *k)
{
    (void)s, (void)k;
    return RATE_OK;
}
static void m_destroy(void *s) { (void)s; }

static int try_new(rate_store_methods_t m)
{
    rate_store_t *s = (rate_store_t *)&s; /* must be cleared on failure */
    int rc = rate_store_new(&m, NULL, &s);
    if (rc == RATE_OK) {
        assert_non_null(s);
        free(s); /* rate_store_free would call m.destroy: the same */
    } else {
        assert_null(s);
    }
    return rc;
}

/* store.c rate_store_new: each method the contract requires, one at a
 * time, and the two complete tables (update; load and cas). */
static void store_new_refuses_incomplete_tables(void **state)
{
    (void)state;
    const rate_store_methods_t full = {
        .version = RATE_STORE_VERSION, .name = "t", .load = m_load,
        .cas = m_cas, .update = m_update, .remove = m_remove,
        .destroy = m_destroy};
    rate_store_methods_t m = full;
    assert_int_equal(try_new(m), RATE_OK);
    m.update = NULL; /* load and cas */
    assert_int_equal(try_new(m), RATE_OK);
    m = full;
    m.load = NULL, m.cas = NULL; /* update alone */
    assert_int_equal(try_new(m), RATE_OK);
    m = full;
    m.remove = NULL;
    assert_int_equal(try_new(m), RATE_EINVAL);
    m = full;
    m.destroy = NULL;
    assert_int_equal(try_new(m), RATE_EINVAL);
    m = full;
    m.version = RATE_STORE_VERSION + 1; /* 5: not yet */
    assert_int_equal(try_new(m), RATE_EINVAL);
    m.version = 2; /* the table before check_policy: still accepted */
    assert_int_equal(try_new(m), RATE_OK);
    m.version = 3; /* before rate_decide_req_t.op: still accepted */
    assert_int_equal(try_new(m), RATE_OK);
    m.version = 1;
    assert_int_equal(try_new(m), RATE_EINVAL);
    m = full;
    m.update = NULL, m.load = NULL; /* cas alone */
    assert_int_equal(try_new(m), RATE_EINVAL);
    m = full;
    m.update = NULL, m.cas = NULL; /* load alone */
    assert_int_equal(try_new(m), RATE_EINVAL);
    m = full;
    m.update = NULL, m.load = NULL, m.cas = NULL;
    m.decide = NULL; /* nothing to step with */
    assert_int_equal(try_new(m), RATE_EINVAL);
    rate_store_t *s = (rate_store_t *)&s;
    assert_int_equal(rate_store_new(NULL, NULL, &s), RATE_EINVAL);
    assert_null(s);
    assert_int_equal(rate_store_new(&full, NULL, NULL), RATE_EINVAL);
}

/* ------------------------------------------------------- blocks */

/* step.c cold_by: a key still blocked is not cold, even when its limits
 * are back to their start: on a change to another blocking policy the
 * block carries over (read_state), as it would have been reclaimed had
 * it counted as cold. */
static void a_block_keeps_a_key_warm(void **state)
{
    (void)state;
    rate_store_t *ms;
    assert_int_equal(rate_store_memory_new(NULL, &ms), RATE_OK);
    rate_limiter_t *a = limiter_of("fixed-window 1/s block=1h", ms);
    rate_limiter_t *b = limiter_of("fixed-window 2/s block=1h", ms);
    assert_true(at(a, "k", 1 * SEC, 1, 0).allowed);
    rate_decision_t d = at(a, "k", 1 * SEC + 100 * MS, 1, 0);
    assert_false(d.allowed); /* blocked until 1.1 s + 1 h */
    assert_int_equal(d.retry_after_ns, 3600 * SEC);
    /* 10 s: a's window has long rolled (cold), the block has not. */
    d = at(b, "k", 10 * SEC, 1, 0);
    assert_false(d.allowed);
    assert_int_equal(d.reason, RATE_REASON_LIMITED);
    assert_int_equal(d.retry_after_ns, 3600 * SEC + 100 * MS - 9 * SEC);
    rate_limiter_free(a);
    rate_limiter_free(b);
    rate_store_free(ms);
}

/* step.c read_state: a block carries only to a policy that blocks.  A
 * policy without one never keeps the key for the old block's sake: a
 * penalty under it sets the TTL of its own charge. */
static void a_block_carries_only_to_a_blocking_policy(void **state)
{
    (void)state;
    rate_store_t *s;
    cas_store_t *h;
    assert_int_equal(cas_store_new(&s, &h), RATE_OK);
    rate_limiter_t *a = limiter_of("fixed-window 1/s block=1h", s);
    rate_limiter_t *b = limiter_of("fixed-window 5/s", s);
    assert_true(at(a, "k", 1 * SEC, 1, 0).allowed);
    assert_false(at(a, "k", 1 * SEC + 100 * MS, 1, 0).allowed);
    assert_int_equal(cas_store_ttl(h, "k"), 3600 * SEC);
    /* Under b, no block: its window's count carries, the block not. */
    assert_int_equal(rate_limiter_penalize_at(b, "k", 1, 1,
                                              1 * SEC + 200 * MS), RATE_OK);
    assert_true(cas_store_ttl(h, "k") <= 1 * SEC);
    rate_decision_t d = at(b, "k", 1 * SEC + 300 * MS, 3, 0);
    assert_true(d.allowed);
    assert_int_equal(d.remaining, 0); /* 1 + 1 (penalty) + 3 of 5 */
    rate_limiter_free(a);
    rate_limiter_free(b);
    rate_store_free(s);
}

/* step.c decide_blocking: only a limit that denies as "limited" blocks;
 * a request that can never pass (more than the burst) is denied as
 * "never" and blocks nothing. */
static void a_never_does_not_block(void **state)
{
    (void)state;
    rate_limiter_t *l = limiter_of("token-bucket 2/s burst=2 block=1h", NULL);
    rate_decision_t d = at(l, "k", SEC, 5, 0);
    assert_false(d.allowed);
    assert_int_equal(d.reason, RATE_REASON_NEVER);
    assert_int_equal(d.retry_after_ns, RATE_NEVER);
    d = at(l, "k", SEC, 1, 0);
    assert_true(d.allowed);
    assert_int_equal(d.remaining, 1);
    /* A "limited" denial does block. */
    assert_true(at(l, "k", SEC, 1, 0).allowed);
    d = at(l, "k", SEC, 1, 0);
    assert_false(d.allowed);
    assert_int_equal(d.retry_after_ns, 3600 * SEC);
    rate_limiter_free(l);
}

/* ------------------------------------------ states no writer could make */

/* Pokes a one-component state for policy p (tag: its id in the store,
 * its fingerprint here, as no other policy took it) at t_last. */
static void poke_state(cas_store_t *h, const char *key,
                       const rate_policy_t *p, uint64_t t_last,
                       const uint8_t *comp, size_t comp_len)
{
    uint8_t st[14 + 64];
    uint32_t tag = rate_policy_fingerprint(p);

    assert_true(comp_len <= 64);
    for (int i = 0; i < 8; i++)
        st[i] = (uint8_t)(t_last >> (8 * i));
    for (int i = 0; i < 4; i++)
        st[8 + i] = (uint8_t)(tag >> (8 * i));
    st[12] = 1;
    st[13] = 3;
    memcpy(st + 14, comp, comp_len);
    cas_store_poke(h, key, st, 14 + comp_len);
}

static void le64(uint8_t *b, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        b[i] = (uint8_t)(v >> (8 * i));
}

/* Each is corrupt, denied under fail-closed, and left as it was. */
static void expect_corrupt(rate_limiter_t *l, const char *what)
{
    rate_decision_t d = at(l, "k", 2 * SEC, 1, 0);
    if (d.allowed || d.reason != RATE_REASON_STORE_ERROR ||
        d.error != RATE_ECORRUPT)
        fail_msg("%s: allowed=%d reason=%s error=%s, wanted a corrupt state",
                 what, d.allowed, rate_reason_name(d.reason),
                 rate_err_name(d.error));
}

static void tampered_components_are_corrupt(void **state)
{
    (void)state;
    static const struct {
        const char *policy;
        size_t len;
        uint64_t words[2];
        const char *what;
    } cases[] = {
        {"fixed-window 5/s", 8, {6, 0}, "a window counting past its limit"},
        {"sliding-window 5/s", 16, {0, 6}, "a counter's current window past L"},
        {"sliding-window 5/s", 16, {6, 0}, "a counter's last window past L"},
        {"token-bucket 5/s burst=5", 8, {6 * SEC, 0}, "an over-full bucket"},
        {"leaky-bucket 5/s capacity=5", 8, {6 * SEC, 0}, "an over-full queue"},
        /* The wide layout (C * P > 2^62): a negative level. */
        {"leaky-bucket 1/13000d capacity=100", 16,
         {UINT64_MAX, UINT64_MAX}, "a wide queue below empty"},
        {"token-bucket 1/13000d burst=100", 16,
         {0, UINT64_C(1) << 60}, "a wide bucket far over full"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        rate_store_t *s;
        cas_store_t *h;
        assert_int_equal(cas_store_new(&s, &h), RATE_OK);
        rate_policy_t *p = policy_of(cases[i].policy);
        rate_limiter_t *l = limiter_of(cases[i].policy, s);
        assert_true(at(l, "k", SEC, 1, 0).allowed); /* the key exists */
        uint8_t comp[16];
        le64(comp, cases[i].words[0]);
        le64(comp + 8, cases[i].words[1]);
        poke_state(h, "k", p, SEC, comp, cases[i].len);
        expect_corrupt(l, cases[i].what);
        assert_false(rate_try_acquire_at(l, "k", 1, 2 * SEC));
        rate_limiter_free(l);
        rate_policy_free(p);
        rate_store_free(s);
    }
}

/* A log out of time order, which the constant-time checks of a read let
 * through: a denial may read it, but the admission that would write it
 * back checks every entry and refuses it. */
static void a_log_out_of_order_is_never_written(void **state)
{
    (void)state;
    rate_store_t *s;
    cas_store_t *h;
    assert_int_equal(cas_store_new(&s, &h), RATE_OK);
    rate_policy_t *p = policy_of("sliding-log 5/s");
    rate_limiter_t *l = limiter_of("sliding-log 5/s", s);
    assert_true(at(l, "k", SEC, 1, 0).allowed);
    uint8_t comp[8 + 3 * 16];
    const uint64_t times[3] = {SEC, 3 * SEC, 2 * SEC}; /* out of order */
    comp[0] = 3, comp[1] = comp[2] = comp[3] = 0;      /* count 3 */
    comp[4] = 3, comp[5] = comp[6] = comp[7] = 0;      /* sum 3 */
    for (int i = 0; i < 3; i++) {
        le64(comp + 8 + 16 * i, times[i]);
        le64(comp + 16 + 16 * i, 1);
    }
    poke_state(h, "k", p, 3 * SEC, comp, sizeof comp);
    /* At 3.5 s the first entry leaves the window; two remain, 2 + 1 <= 5
     * would pass: the admission finds them out of order. */
    rate_decision_t d = at(l, "k", 3 * SEC + 500 * MS, 1, 0);
    assert_false(d.allowed);
    assert_int_equal(d.reason, RATE_REASON_STORE_ERROR);
    assert_int_equal(d.error, RATE_ECORRUPT);
    rate_limiter_free(l);
    rate_policy_free(p);
    rate_store_free(s);
}

/* ------------------------------------------------------ policy records */

/* A policy record that does not parse names no policy: a state tagged with
 * it is corrupt for any other policy's reader, never a cold key. */
static void a_record_that_does_not_parse_is_corrupt(void **state)
{
    (void)state;
    rate_store_t *s;
    assert_int_equal(cas_store_new(&s, NULL), RATE_OK);
    rate_policy_t *p = policy_of("token-bucket 5/s burst=5");
    rate_limiter_t *lp = limiter_of("token-bucket 5/s burst=5", s);
    assert_true(at(lp, "k", SEC, 1, 0).allowed);
    /* Overwrite the record of p (at its fingerprint) with garbage. */
    uint32_t id = rate_policy_fingerprint(p);
    char kb[4] = {(char)id, (char)(id >> 8), (char)(id >> 16),
                  (char)(id >> 24)};
    rate_key_t k = {kb, 4, RATE_SPACE_POLICY};
    uint8_t buf[256];
    size_t len = 0;
    uint64_t version = 0;
    assert_int_equal(s->m->load(s->self, &k, buf, sizeof buf, &len, &version),
                     RATE_OK);
    assert_true(len > 0);
    assert_int_equal(s->m->cas(s->self, &k, version, "token-bucket ???", 16,
                               RATE_TTL_FOREVER),
                     RATE_OK);
    rate_limiter_t *lq = limiter_of("token-bucket 9/s burst=9", s);
    rate_decision_t d = at(lq, "k", SEC, 1, 0);
    assert_false(d.allowed);
    assert_int_equal(d.reason, RATE_REASON_STORE_ERROR);
    assert_int_equal(d.error, RATE_ECORRUPT);
    rate_limiter_free(lq);
    rate_limiter_free(lp);
    rate_policy_free(p);
    rate_store_free(s);
}

/* ------------------------------------------- the low-water mark only rises */

static void low_water_only_rises(void **state)
{
    (void)state;
    rate_store_t *s;
    assert_int_equal(rate_store_memory_new(&(rate_memory_options_t){.max_keys = 2, .shards = 1}, &s),
                     RATE_OK);
    rate_limiter_t *l = limiter_of("token-bucket 1000/s burst=1", s);
    assert_int_equal(rate_limiter_set_low_water(l, SEC), RATE_OK);
    assert_true(rate_try_acquire_at(l, "a", 1, SEC)); /* under a mark */
    assert_true(rate_try_acquire_at(l, "b", 1, SEC));
    /* Both cold by 2 s; a lower mark after it must not lower it. */
    assert_int_equal(rate_limiter_set_low_water(l, 2 * SEC), RATE_OK);
    assert_int_equal(rate_limiter_set_low_water(l, 1), RATE_OK);
    /* A third key in a store of two: a cold key makes room (reclaimed),
     * not an eviction; at a mark of 1 ns neither would be cold. */
    assert_true(rate_try_acquire_at(l, "c", 1, 2 * SEC));
    rate_stats_t st;
    rate_store_stats(s, &st);
    assert_int_equal(st.reclaimed, 1);
    assert_int_equal(st.evictions, 0);
    rate_limiter_free(l);
    rate_store_free(s);
}

/* ------------------------------------- an asynchronous whole decision */

static int async_calls;
static rate_decision_t async_d;
static void async_cb(void *ud, int rc, const rate_decision_t *d)
{
    (void)ud;
    assert_int_equal(rc, RATE_OK);
    async_calls++;
    async_d = *d;
}

/* A store whose decide() declines: the limiter starts the job again as
 * the step, which decides it. */
static void async_decline_runs_the_step(void **state)
{
    (void)state;
    rate_store_t *s;
    cas_store_t *h;
    assert_int_equal(cas_store_new_async_declining(&s, &h), RATE_OK);
    rate_limiter_t *l = limiter_of("token-bucket 5/s burst=2", s);
    for (int i = 0; i < 3; i++) {
        rate_decision_t now_d;
        assert_int_equal(rate_limiter_check_start(l, "k", 1, 1, 0, &now_d,
                                                  async_cb, NULL),
                         RATE_PENDING);
        /* declined, then run (after the policy's record, the first time) */
        assert_int_equal(cas_store_run_jobs(h), i == 0 ? 3 : 2);
        assert_int_equal(async_calls, i + 1);
        assert_int_equal(async_d.reason, i < 2 ? RATE_REASON_ALLOWED
                                               : RATE_REASON_LIMITED);
    }
    rate_limiter_free(l);
    rate_store_free(s);
}

/* A first-edition state's policy learnt twice (two threads meeting it at
 * once, one after the other here): the second learner finds it known,
 * and that is no error. */
static void learning_twice_is_no_error(void **state)
{
    (void)state;
    rate_store_t *s;
    assert_int_equal(rate_store_memory_new(NULL, &s), RATE_OK);
    rate__book_t b;
    assert_int_equal(rate__book_init(&b, s, 8), RATE_OK);
    assert_int_equal(rate__book_learn(&b, RATE__FORMAT_V1, 0x1234), RATE_OK);
    assert_int_equal(rate__book_learn(&b, RATE__FORMAT_V1, 0x1234), RATE_OK);
    assert_int_equal(atomic_load(&b.known.count), 1); /* once */
    rate__book_free(&b);
    rate_store_free(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(fallback_keeps_the_limiters_clock),
        cmocka_unit_test(debt_rounds_down_on_a_tier_change),
        cmocka_unit_test(store_new_refuses_incomplete_tables),
        cmocka_unit_test(a_block_keeps_a_key_warm),
        cmocka_unit_test(a_block_carries_only_to_a_blocking_policy),
        cmocka_unit_test(a_never_does_not_block),
        cmocka_unit_test(tampered_components_are_corrupt),
        cmocka_unit_test(a_log_out_of_order_is_never_written),
        cmocka_unit_test(a_record_that_does_not_parse_is_corrupt),
        cmocka_unit_test(low_water_only_rises),
        cmocka_unit_test(async_decline_runs_the_step),
        cmocka_unit_test(learning_twice_is_no_error),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
