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

/* Used up: no tokens (and no debt). */
static void tb_exhaust(const rate_limit_t *l, rate__view_t *v, uint64_t t)
{
    (void)l;
    (void)t;
    v->x = 0;
}

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
    .adjust = tb_adjust,
    .exhaust = tb_exhaust,
    .plain = tb_plain,
};
