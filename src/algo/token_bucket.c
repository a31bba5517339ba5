/*
 * Token bucket (and GCRA, which makes the same decisions).
 *
 * State: one signed 64-bit word u = tokens * P, plus the key's t_last kept in
 * the state header.  A refill over dt adds dt * L scaled tokens, exactly; the
 * bucket holds at most B * P (policy creation checks B * P <= 2^62).  A
 * reservation may leave u negative (a debt the next requests pay), down to
 * -2^62: the longest reservation queue is therefore 2^62 / L ns (14 years at
 * 10/s, 76 minutes at a million per second).
 */
#include "token_bucket.h"

#define TB_FIXED 8 /* bytes of stored state: u */

static void tb_load(const rate_limit_t *l, const uint8_t *st, rate__view_t *v)
{
    *v = (rate__view_t){0};
    v->x = st != NULL ? (int64_t)rate__get64(st)
                      : (rate_i128_t)(l->burst * l->period_ns);
}

/* The view of a token bucket always fits 64 bits (-2^62 <= u <= B * P <=
 * 2^62, or whatever a corrupt store gave), so the hot functions work in
 * 64-bit words (token_bucket.h); differences are taken unsigned, where
 * they fit whatever u is.  Only a reservation's bound needs 128 bits. */
static void tb_advance(const rate_limit_t *l, rate__view_t *v, uint64_t last,
                       uint64_t t)
{
    v->x = rate__tb_refill(l, (int64_t)v->x, t - last);
}

static uint64_t tb_remaining(const rate_limit_t *l, rate_i128_t u)
{
    return u > 0 ? rate__div64((rate_u128_t)u, l->period_ns) : 0;
}

static uint64_t tb_reset(const rate_limit_t *l, rate_i128_t u)
{
    rate_i128_t missing = (rate_i128_t)(l->burst * l->period_ns) - u;

    return missing > 0 ? rate__ceil_div64((rate_u128_t)missing, l->limit) : 0;
}

static void tb_decide(const rate_limit_t *l, const rate__view_t *v, uint64_t t,
                      uint64_t n, uint64_t max_wait, bool detail,
                      rate__verdict_t *out)
{
    int64_t u = (int64_t)v->x;
    int64_t need = 0;

    (void)t;
    *out = (rate__verdict_t){0};
    if (n > l->burst) {
        out->reason = RATE_REASON_NEVER;
        out->retry_after_ns = RATE_NEVER;
    } else {
        need = (int64_t)(n * l->period_ns); /* <= B * P */
        uint64_t missing = (uint64_t)need - (uint64_t)u; /* if u < need */
        if (rate__tb_takes(l, u, n)) {
            out->allowed = true;
        } else if (max_wait > 0 &&
                   (rate_i128_t)u - need >= -RATE__DEBT_MAX &&
                   missing <= (rate_u128_t)max_wait * l->limit) {
            out->allowed = true;
            out->delay_ns = rate__ceil_div64(missing, l->limit);
        } else {
            out->reason = RATE_REASON_LIMITED;
            out->retry_after_ns = rate__ceil_div64(missing, l->limit);
        }
    }
    if (!detail)
        return;
    out->remaining_now = tb_remaining(l, u);
    out->reset_now_ns = tb_reset(l, u);
    if (out->allowed) {
        out->remaining_after = tb_remaining(l, (rate_i128_t)u - need);
        out->reset_after_ns = tb_reset(l, (rate_i128_t)u - need);
    }
}

static size_t tb_commit(const rate_limit_t *l, const rate__view_t *v,
                        uint64_t t, uint64_t n, uint8_t *out)
{
    (void)t;
    /* Admitted: n <= B, and a reservation stays above -2^62. */
    rate__put64(out, (uint64_t)((int64_t)v->x - (int64_t)(n * l->period_ns)));
    return TB_FIXED;
}

static bool tb_is_cold(const rate_limit_t *l, const rate__view_t *v)
{
    return v->x == (rate_i128_t)(l->burst * l->period_ns);
}

/* Tokens keep their number across a policy change: u * P'/P, rounded down
 * (a debt rounds further into debt), capped at the new burst. */
static void tb_convert(const rate_limit_t *from, const rate_limit_t *to,
                       uint64_t t, rate__view_t *v)
{
    rate_i128_t num = v->x * (rate_i128_t)to->period_ns;
    rate_i128_t q = num / (rate_i128_t)from->period_ns;
    rate_i128_t full = (rate_i128_t)(to->burst * to->period_ns);

    (void)t;
    if (num % (rate_i128_t)from->period_ns != 0 && num < 0)
        q -= 1;
    if (q > full)
        q = full;
    if (q < -RATE__DEBT_MAX)
        q = -RATE__DEBT_MAX;
    v->x = q;
}

static uint64_t tb_max_reset(const rate_limit_t *l)
{
    return rate__ceil_div64((rate_u128_t)l->burst * l->period_ns, l->limit);
}

/* Written states hold at most B * P, and a debt of at most 2^62. */
static bool tb_valid(const rate_limit_t *l, const uint8_t *st, uint64_t last)
{
    int64_t u = (int64_t)rate__get64(st);

    (void)last;
    return u <= (int64_t)(l->burst * l->period_ns) && u >= -RATE__DEBT_MAX;
}

RATE__DEFINE_PLAIN(tb, TB_FIXED)

const rate__algo_t rate__token_bucket = {
    .name = "token-bucket",
    .fixed = TB_FIXED,
    .grow = 0,
    .load = tb_load,
    .advance = tb_advance,
    .decide = tb_decide,
    .commit = tb_commit,
    .is_cold = tb_is_cold,
    .convert = tb_convert,
    .max_reset = tb_max_reset,
    .valid = tb_valid,
    .plain = tb_plain,
};
