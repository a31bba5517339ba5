/* SPDX-License-Identifier: MIT */
/*
 * Token bucket (and GCRA, which makes the same decisions).
 *
 * State: u = tokens * P, plus the key's t_last kept in the state header.
 * A refill over dt adds dt * L scaled tokens, exactly; the bucket holds at
 * most B * P.  A reservation may leave u negative (a debt the next
 * requests pay), down to -2^62: the longest reservation queue is therefore
 * 2^62 / L ns (14 years at 10/s, 76 minutes at a million per second),
 * whatever the layout.
 *
 * Two layouts of the component, chosen by the limit alone:
 *
 *   narrow  B * P <= 2^62: u in one signed 64-bit word (8 bytes), the
 *           common case, with the plain pass (rate__token_bucket);
 *   wide    B * P > 2^62 (B up to 2^63-1, P up to 2^61, so B * P < 2^124):
 *           u as a signed 128-bit word, two little-endian u64 words, the
 *           low one first (16 bytes), no plain pass
 *           (rate__token_bucket_wide).
 *
 * Every function but load, commit and valid is shared, as the leaky
 * bucket's are: the view is 128 bits wide, so the layout only says how u
 * is stored.  The hot ones (advance, decide) are in token_bucket.h.
 * Durations beyond 2^63-1 ns (a wide bucket's refill of 2^124 scaled
 * tokens at 1 per ns) are reported as RATE_TIME_MAX.
 */
#include "token_bucket.h"

/* Reads either layout, by the limit's (a carried-over state is loaded
 * with the limit it was written under). */
static void tb_load_any(const rate_limit_t *l, const uint8_t *st,
                        rate__view_t *v)
{
    *v = (rate__view_t){0};
    if (st == NULL)
        v->x = tb_full(l);
    else
        v->x = rate__bucket_wide(l) ? rate__get128(st)
                                    : (int64_t)rate__get64(st);
}

static bool tb_is_cold(const rate_limit_t *l, const rate__view_t *v)
{
    return v->x == tb_full(l);
}

/* Tokens keep their number across a policy change: u * P'/P, rounded down
 * (a debt rounds further into debt), capped at the new burst and at the
 * debt bound.  Formed as q * P' + floor(r * P' / P) with u = q * P + r,
 * 0 <= r < P, so that no product passes 2^126. */
static void tb_convert(const rate_limit_t *from, const rate_limit_t *to,
                       uint64_t t, rate__view_t *v)
{
    rate_i128_t p = (rate_i128_t)from->period_ns;
    rate_i128_t q = v->x / p, r = v->x % p;
    rate_i128_t full = tb_full(to);

    (void)t;
    if (r < 0) {
        q -= 1;
        r += p;
    }
    if (q >= (rate_i128_t)to->burst) {
        v->x = full;
        return;
    }
    v->x = q * (rate_i128_t)to->period_ns +
           (rate_i128_t)((rate_u128_t)r * to->period_ns / (rate_u128_t)p);
    if (v->x > full)
        v->x = full;
    if (v->x < -RATE__DEBT_MAX)
        v->x = -RATE__DEBT_MAX;
}

static uint64_t tb_max_reset(const rate_limit_t *l)
{
    return rate__ceil_div_sat((rate_u128_t)l->burst * l->period_ns, l->limit);
}

RATE__DEFINE_PLAIN_FN(tb)

/* A refund adds its tokens, up to the burst; a penalty takes them, into
 * debt as far as a reservation may go. */
static uint64_t tb_adjust(const rate_limit_t *l, rate__view_t *v,
                          rate__op_t op, uint64_t n, uint64_t t)
{
    rate_i128_t amount = (rate_i128_t)n * l->period_ns;
    rate_i128_t full = (rate_i128_t)l->burst * l->period_ns;

    (void)t;
    if (op == RATE__OP_REFUND)
        v->x = v->x + amount > full ? full : v->x + amount;
    else
        v->x = v->x - amount < -RATE__DEBT_MAX ? -RATE__DEBT_MAX
                                               : v->x - amount;
    return 0;
}

/* Held: the tokens missing from the burst, a debt's included. */
static uint64_t tb_held(const rate_limit_t *l, const rate__view_t *v,
                        uint64_t t)
{
    (void)t;
    return rate__ceil_div_sat((rate_u128_t)(tb_full(l) - v->x), l->period_ns);
}

/* Admitted since a, at most: the tokens missing at last plus the refill
 * since a (the bucket was at most full at a). */
static uint64_t tb_since(const rate_limit_t *l, const rate__view_t *v,
                         uint64_t last, uint64_t a)
{
    return rate__sat_add(tb_held(l, v, last),
                         rate__ceil_div_sat((rate_u128_t)(last - a) * l->limit,
                                            l->period_ns));
}

/* Charged u permits: the burst less u, into debt as far as a reservation
 * may go (a debt that deep denies until it is paid, as u would). */
static void tb_charge(const rate_limit_t *l, rate__view_t *v, uint64_t t,
                      uint64_t u)
{
    (void)t;
    v->x = tb_full(l) - (rate_i128_t)u * l->period_ns;
    if (v->x < -RATE__DEBT_MAX)
        v->x = -RATE__DEBT_MAX;
}

const rate__algo_t rate__token_bucket = {
    .name = "token-bucket",
    .fixed = TB_FIXED,
    .grow = 0,
    RATE__LUA_RANGE(50, 51),
    .load = tb_load_any,
    .advance = tb_advance,
    .decide = tb_decide,
    .commit = tb_commit,
    .is_cold = tb_is_cold,
    .convert = tb_convert,
    .max_reset = tb_max_reset,
    .valid = tb_valid,
    .adjust = tb_adjust,
    .held = tb_held,
    .since = tb_since,
    .charge = tb_charge,
    .plain = tb_plain,
};

/* ----------------------------------------------------------- wide layout */

#define TBW_FIXED 16 /* bytes of stored state: u, 128 bits */

static size_t tbw_commit(const rate_limit_t *l, const rate__view_t *v,
                         uint64_t t, uint64_t n, uint8_t *out)
{
    (void)t;
    rate__put128(out, v->x - (rate_i128_t)n * l->period_ns);
    return TBW_FIXED;
}

static bool tbw_valid(const rate_limit_t *l, const uint8_t *st, uint64_t last)
{
    rate_i128_t u = rate__get128(st);

    (void)last;
    return u <= tb_full(l) && u >= -RATE__DEBT_MAX;
}

const rate__algo_t rate__token_bucket_wide = {
    .name = "token-bucket",
    .fixed = TBW_FIXED,
    .grow = 0,
    RATE__LUA_RANGE(50, 51),
    .load = tb_load_any,
    .advance = tb_advance,
    .decide = tb_decide,
    .commit = tbw_commit,
    .is_cold = tb_is_cold,
    .convert = tb_convert,
    .max_reset = tb_max_reset,
    .valid = tbw_valid,
    .adjust = tb_adjust,
    .held = tb_held,
    .since = tb_since,
    .charge = tb_charge,
    .plain = NULL,
};
