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
 *           common case; its functions are in token_bucket.h, in 64-bit
 *           words, and it has the plain pass (rate__token_bucket);
 *   wide    B * P > 2^62 (B up to 2^63-1, P up to 2^61, so B * P < 2^124):
 *           u as a signed 128-bit word, two little-endian u64 words, the
 *           low one first (16 bytes); decided by the wide body of
 *           tb_decide_any (in 128 bits, reached only past the narrow
 *           range), no plain pass (rate__token_bucket_wide).
 *
 * Both decide alike: the layout only says how u is stored.  Durations a
 * wide bucket can reach beyond 2^63-1 ns (a refill of 2^124 scaled tokens
 * at 1 per ns) are reported as RATE_TIME_MAX.
 */
#include "token_bucket.h"

static rate_i128_t tb_full(const rate_limit_t *l)
{
    return (rate_i128_t)l->burst * l->period_ns;
}

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

static void tb_decide_any(const rate_limit_t *l, const rate__view_t *v,
                          uint64_t t, uint64_t n, uint64_t max_wait,
                          bool detail, rate__verdict_t *out);

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
    .decide = tb_decide_any,
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

/* u after a refill over dt ns: u + dt * L (< 2^126), capped at B * P. */
static void tbw_advance(const rate_limit_t *l, rate__view_t *v, uint64_t last,
                        uint64_t t)
{
    rate_i128_t full = tb_full(l);
    rate_u128_t add = (rate_u128_t)(t - last) * l->limit;

    if (v->x >= full)
        return;
    v->x = add >= (rate_u128_t)(full - v->x) ? full : v->x + (rate_i128_t)add;
}

static uint64_t tbw_remaining(const rate_limit_t *l, rate_i128_t u)
{
    return u > 0 ? (uint64_t)((rate_u128_t)u / l->period_ns) : 0; /* <= B */
}

static uint64_t tbw_reset(const rate_limit_t *l, rate_i128_t u)
{
    rate_i128_t missing = tb_full(l) - u;

    return missing > 0 ? rate__ceil_div_sat((rate_u128_t)missing, l->limit)
                       : 0;
}

/* tb_decide's rule in 128 bits, the wide body of tb_decide_any: u in
 * [-2^62, B * P], n * P <= B * P.  Out of line and cold: only a bucket
 * past the narrow range reaches it. */
__attribute__((noinline, cold)) static void
tb_decide_wide(const rate_limit_t *l, const rate__view_t *v, uint64_t n,
               uint64_t max_wait, bool detail, rate__verdict_t *out)
{
    rate_i128_t u = v->x, need = 0;

    *out = (rate__verdict_t){0};
    if (n > l->burst) {
        out->reason = RATE_REASON_NEVER;
        out->retry_after_ns = RATE_NEVER;
    } else {
        need = (rate_i128_t)n * l->period_ns;
        rate_u128_t missing = u < need ? (rate_u128_t)(need - u) : 0;
        if (n == 0 || need <= u) {
            out->allowed = true;
        } else if (max_wait > 0 && u - need >= -RATE__DEBT_MAX &&
                   missing <= (rate_u128_t)max_wait * l->limit) {
            out->allowed = true;
            out->delay_ns = rate__ceil_div_sat(missing, l->limit);
        } else {
            out->reason = RATE_REASON_LIMITED;
            out->retry_after_ns = rate__ceil_div_sat(missing, l->limit);
        }
    }
    if (!detail)
        return;
    out->remaining_now = tbw_remaining(l, u);
    out->reset_now_ns = tbw_reset(l, u);
    if (out->allowed) {
        out->remaining_after = tbw_remaining(l, u - need);
        out->reset_after_ns = tbw_reset(l, u - need);
    }
}

/* One decide for both layouts, both tables' .decide: a narrow bucket
 * (B * P <= 2^62) takes tb_decide, the 64-bit body that the plain pass
 * (rate_state_acquire) runs without this guard; a wide one the 128-bit
 * body.  The layout never changes a decision. */
static void tb_decide_any(const rate_limit_t *l, const rate__view_t *v,
                          uint64_t t, uint64_t n, uint64_t max_wait,
                          bool detail, rate__verdict_t *out)
{
    if (__builtin_expect(rate__bucket_wide(l), 0))
        tb_decide_wide(l, v, n, max_wait, detail, out);
    else
        tb_decide(l, v, t, n, max_wait, detail, out);
}

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
    .advance = tbw_advance,
    .decide = tb_decide_any,
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
