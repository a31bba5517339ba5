/* SPDX-License-Identifier: MIT */
/*
 * Sliding window log: every admitted request is kept as (time, permits)
 * until it leaves the window (t - W, t].  Exact; memory grows with L.
 *
 * State: a 32-bit entry count and the 32-bit sum of their permits (at most
 * L <= RATE_SLIDING_LOG_MAX), then the entries in time order, 16 bytes
 * each.  Keeping the sum makes a denial O(log entries): only the pruned
 * prefix is read.  Requests admitted at the same t_eff share one
 * entry, so a key holds at most min(L, distinct times in W) entries.
 * Pruning happens only when an admission rewrites the state, relative to
 * that admission's t_eff (= the new t_last), as the spec requires.
 */
#include "../kit.h"

#define SL_HEAD 8u
#define SL_ENTRY 16u

static uint64_t sl_time(const uint8_t *log, uint32_t i)
{
    return rate__get64(log + (size_t)i * SL_ENTRY);
}

static uint64_t sl_permits(const uint8_t *log, uint32_t i)
{
    return rate__get64(log + (size_t)i * SL_ENTRY + 8);
}

static size_t sl_size(const uint8_t *st, size_t avail)
{
    size_t len;

    if (avail < SL_HEAD)
        return 0;
    len = SL_HEAD + (size_t)rate__get32(st) * SL_ENTRY;
    return len <= avail ? len : 0;
}

/* Drops the entries at or before t - W and sums the rest. */
static void sl_prune(const rate_limit_t *l, uint64_t t, rate__view_t *v)
{
    uint32_t lo = 0, hi = v->log_count;

    if (t >= l->period_ns) {
        uint64_t cut = t - l->period_ns;
        while (lo < hi) { /* first entry with time > cut */
            uint32_t mid = lo + (hi - lo) / 2;
            if (sl_time(v->log, mid) <= cut)
                lo = mid + 1;
            else
                hi = mid;
        }
    }
    for (uint32_t i = 0; i < lo; i++)
        v->log_sum -= sl_permits(v->log, i);
    v->log += (size_t)lo * SL_ENTRY;
    v->log_count -= lo;
}

static void sl_load(const rate_limit_t *l, const uint8_t *st, rate__view_t *v)
{
    *v = (rate__view_t){0};
    if (st == NULL)
        return;
    (void)l;
    v->log = st + SL_HEAD;
    v->log_count = rate__get32(st);
    v->log_sum = rate__get32(st + 4);
}

static void sl_advance(const rate_limit_t *l, rate__view_t *v, uint64_t last,
                       uint64_t t)
{
    (void)last;
    sl_prune(l, t, v);
}

/* Smallest d such that, once the oldest entries have left the window at
 * t + d, the rest plus n fits in L. */
static uint64_t sl_retry(const rate_limit_t *l, const rate__view_t *v,
                         uint64_t t, uint64_t n)
{
    uint64_t sum = v->log_sum;

    for (uint32_t i = 0; i < v->log_count; i++) {
        sum -= sl_permits(v->log, i);
        if (sum + n <= l->limit)
            return sl_time(v->log, i) + l->period_ns - t;
    }
    return 0; /* not reached for a denied request with n <= L */
}

static uint64_t sl_reset(const rate_limit_t *l, const rate__view_t *v,
                         uint64_t t)
{
    if (v->log_count == 0)
        return 0;
    return sl_time(v->log, v->log_count - 1) + l->period_ns - t;
}

static void sl_decide(const rate_limit_t *l, const rate__view_t *v, uint64_t t,
                      uint64_t n, uint64_t max_wait, bool detail,
                      rate__verdict_t *out)
{
    (void)max_wait;
    *out = (rate__verdict_t){0};
    if (n > l->limit) {
        out->reason = RATE_REASON_NEVER;
        out->retry_after_ns = RATE_NEVER;
    } else if (n == 0 || v->log_sum + n <= l->limit) {
        out->allowed = true;
    } else {
        out->reason = RATE_REASON_LIMITED;
        out->retry_after_ns = sl_retry(l, v, t, n);
    }
    if (!detail)
        return;
    out->remaining_now = v->log_sum < l->limit ? l->limit - v->log_sum : 0;
    out->reset_now_ns = sl_reset(l, v, t);
    if (out->allowed) {
        out->remaining_after =
            v->log_sum + n < l->limit ? l->limit - v->log_sum - n : 0;
        out->reset_after_ns = n > 0 ? l->period_ns : out->reset_now_ns;
    }
}

static size_t sl_commit(const rate_limit_t *l, const rate__view_t *v,
                        uint64_t t, uint64_t n, uint8_t *out)
{
    uint32_t count = v->log_count;
    size_t bytes = (size_t)count * SL_ENTRY;

    (void)l;
    if (bytes > 0) /* a cold log has no entries (and no pointer) */
        memmove(out + SL_HEAD, v->log, bytes);
    for (uint64_t trim = v->trim; trim > 0 && count > 0;) { /* a refund */
        uint8_t *p = out + SL_HEAD + (size_t)(count - 1) * SL_ENTRY + 8;
        uint64_t last = rate__get64(p);
        if (last <= trim) {
            count--;
            trim -= last;
        } else {
            rate__put64(p, last - trim);
            trim = 0;
        }
    }
    bytes = (size_t)count * SL_ENTRY;
    if (n == 0) {
        /* nothing to log */
    } else if (count > 0 && sl_time(out + SL_HEAD, count - 1) == t) {
        uint8_t *p = out + SL_HEAD + bytes - SL_ENTRY + 8;
        rate__put64(p, rate__get64(p) + n);
    } else {
        rate__put64(out + SL_HEAD + bytes, t);
        rate__put64(out + SL_HEAD + bytes + 8, n);
        count++;
    }
    rate__put32(out, count);
    rate__put32(out + 4, (uint32_t)(v->log_sum + n));
    return SL_HEAD + (size_t)count * SL_ENTRY;
}

static bool sl_is_cold(const rate_limit_t *l, const rate__view_t *v)
{
    (void)l;
    return v->log_count == 0;
}

/* Entries carry over and are pruned again to the new window. */
static void sl_convert(const rate_limit_t *from, const rate_limit_t *to,
                       uint64_t t, rate__view_t *v)
{
    (void)from;
    sl_prune(to, t, v);
}

static uint64_t sl_max_reset(const rate_limit_t *l)
{
    return l->period_ns;
}

/* What a read checks at once, in constant time: a sum of at most L over
 * at least as many permits as entries (each has one or more).  The
 * entries themselves are checked by sl_view_ok before an admission writes
 * them back; a denial reads only the prefix it prunes, and a tampered sum
 * can then only make it stricter (an underflow reads as a full log). */
static bool sl_valid(const rate_limit_t *l, const uint8_t *st, uint64_t last)
{
    uint32_t count = rate__get32(st), sum = rate__get32(st + 4);

    (void)last;
    return sum <= l->limit && count <= sum;
}

/* The entries still in the window, before an admission writes them back:
 * each of at least one permit, in time order, none after t_last, and
 * their sum the one the decision went by.  Linear in the log, as the
 * admission's copy of it is. */
static bool sl_view_ok(const rate_limit_t *l, const rate__view_t *v,
                       uint64_t last)
{
    uint64_t sum = 0, prev = 0;

    for (uint32_t i = 0; i < v->log_count; i++) {
        uint64_t t = sl_time(v->log, i), n = sl_permits(v->log, i);
        if (n == 0 || n > l->limit || t < prev || t > last)
            return false;
        sum += n; /* each n <= L <= RATE_SLIDING_LOG_MAX: no overflow */
        prev = t;
    }
    return sum == v->log_sum;
}

/* A refund takes its permits back from the newest entries (written out by
 * sl_commit, which drops them); a penalty is an entry of its permits at
 * t, as many as fit under the limit. */
static uint64_t sl_adjust(const rate_limit_t *l, rate__view_t *v,
                          rate__op_t op, uint64_t n, uint64_t t)
{
    (void)t;
    if (op == RATE__OP_REFUND) {
        v->trim = n < v->log_sum ? n : v->log_sum;
        v->log_sum -= v->trim;
        return 0;
    }
    return v->log_sum >= l->limit ? 0 : rate__min_u64(n, l->limit - v->log_sum);
}

/* Held: the permits logged in the window of t. */
static uint64_t sl_held(const rate_limit_t *l, const rate__view_t *v,
                        uint64_t t)
{
    (void)l;
    (void)t;
    return v->log_sum;
}

/* Admitted since a, at most: the logged permits at or after a, and, for
 * the time before the log's window (last - W, last], the limit per W. */
static uint64_t sl_since(const rate_limit_t *l, const rate__view_t *v,
                         uint64_t last, uint64_t a)
{
    rate_u128_t u = 0;
    for (uint32_t i = 0; i < v->log_count; i++)
        if (sl_time(v->log, i) >= a)
            u += sl_permits(v->log, i);
    if (last >= l->period_ns && a <= last - l->period_ns)
        u += (rate_u128_t)l->limit *
             ((last - l->period_ns - a) / l->period_ns + 1);
    return u > UINT64_MAX ? UINT64_MAX : (uint64_t)u;
}

/* Charged u permits: one entry of u at t, kept in the view itself (none
 * for 0: a cold log). */
static void sl_charge(const rate_limit_t *l, rate__view_t *v, uint64_t t,
                      uint64_t u)
{
    (void)l;
    if (u == 0)
        return;
    rate__put64(v->entry, t);
    rate__put64(v->entry + 8, u);
    v->log = v->entry;
    v->log_count = 1;
    v->log_sum = u;
}

const rate__algo_t rate__sliding_log = {
    .name = "sliding-log",
    .fixed = SL_HEAD,
    .grow = SL_ENTRY,
    RATE__LUA_RANGE(50, 51), /* lean: W at most 2^51 ns */
    .size = sl_size,
    .load = sl_load,
    .advance = sl_advance,
    .decide = sl_decide,
    .commit = sl_commit,
    .is_cold = sl_is_cold,
    .convert = sl_convert,
    .max_reset = sl_max_reset,
    .valid = sl_valid,
    .adjust = sl_adjust,
    .held = sl_held,
    .since = sl_since,
    .charge = sl_charge,
    .view_ok = sl_view_ok,
};
