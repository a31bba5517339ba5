/*
 * Tests written against mutations that the rest of the suite let through:
 * each case names the line of behaviour it holds.  Memory and CAS stores only; the Redis ones
 * are in test_redis_mutants.c.
 */
#include "helpers.h"

#include "internal.h"

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

static uint64_t own_time;
static uint64_t own_now(void *ud)
{
    (void)ud;
    return own_time;
}
static void own_sleep(void *ud, uint64_t ns)
{
    (void)ud;
    own_time += ns;
}

/* limiter.c finish(): the fallback decides at the limiter's own time, not
 * at the time the failed store's clock gave (store_part had already set
 * the step's time to it). */
static void fallback_keeps_the_limiters_clock(void **state)
{
    (void)state;
    rate_store_t *s;
    assert_int_equal(cas_store_new(&inner, NULL), RATE_OK);
    assert_int_equal(rate_store_new(&failing_methods, NULL, &s), RATE_OK);
    rate_clock_t clk = {own_now, own_sleep, NULL};
    rate_limiter_config_t cfg = {0};
    cfg.store = s;
    cfg.clock = &clk;
    cfg.on_store_error = RATE_FAIL_FALLBACK;
    rate_limiter_t *l = limiter_cfg("fixed-window 2/h", cfg);
    own_time = 100 * SEC;    /* 3500 s left in the hour */
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
    own_time = 3000 * SEC;
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
    m.version = RATE_STORE_VERSION + 1;
    assert_int_equal(try_new(m), RATE_EINVAL);
    m.version = RATE_STORE_VERSION - 1;
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(fallback_keeps_the_limiters_clock),
        cmocka_unit_test(debt_rounds_down_on_a_tier_change),
        cmocka_unit_test(store_new_refuses_incomplete_tables),
        cmocka_unit_test(a_block_keeps_a_key_warm),
        cmocka_unit_test(a_block_carries_only_to_a_blocking_policy),
        cmocka_unit_test(a_never_does_not_block),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
