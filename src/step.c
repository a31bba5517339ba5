/* SPDX-License-Identifier: MIT */
/*
 * The step every store runs: a key's whole state in, its new state and the
 * decision out.  Pure: no clock, no I/O, no allocation, no lock.
 *
 * Stored bytes (integers little-endian, src/kit.h):
 *
 *   header  u64 t_last      t_eff of the last admitted request
 *           u32 tag         the policy the components were made under: its
 *                           id in the store's records (format 3) or its
 *                           fingerprint (format 2, the first edition's)
 *           u8  components  u8 format (the version)
 *   then one component per limit, in the policy's order, each laid out by
 *   its algorithm (src/algo/).
 *
 * Several limits on one key: all see the same t_eff, n and max_wait; the
 * request passes only if every limit passes it, and only then does any
 * component change (spec, "Several limits on one key").
 *
 * A key whose state was made under another policy (a tier change, another
 * limiter or process) is read under the old policy, found by its tag among
 * the limiter's known policies (or fetched from the store's records by the
 * limiter, when the step asks for it with RATE__NEED_POLICY), as it stood
 * at t_last.  Limits are matched by what they are, not by position: the
 * same limit, else one whose state keeps its meaning (a bucket of its
 * kind, a window of its kind and length), is carried over and the new
 * policy governs the time from t_last on; any other limit is charged, as
 * admitted at t_eff, the most an unmatched old limit still holds at t_eff
 * or can have admitted in the time the new one counts; a limit with no
 * old one left starts cold (docs/algorithms.md, "Policy changes").
 * Nothing needs writing until the next admission, so denials still change
 * nothing.
 */
#include "algo/token_bucket.h"
#include "step.h"

/* The verdicts are written field by field just before they are folded; GCC's
 * straight-line vectorizer would read them back 16 bytes at a time, which
 * the CPU cannot forward from the narrower stores (a stall of ~15 cycles on
 * every decision).  Plain scalar copies are faster here. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-tree-slp-vectorize")
#endif

typedef struct parsed {
    uint64_t last;
    uint32_t tag;
    uint8_t format;
    const uint8_t *comp[RATE_MAX_LIMITS];
    uint64_t blocked_until; /* a blocking policy's: 0, or the block's end */
} parsed_t;

/* Reads the header; false for bytes no format of this library has. */
static bool parse_header(const uint8_t *st, size_t len, parsed_t *out)
{
    if (st == NULL || len < RATE__HEADER_LEN ||
        (st[13] != RATE__FORMAT && st[13] != RATE__FORMAT_V1))
        return false;
    out->last = rate__get64(st);
    out->tag = rate__get32(st + 8);
    out->format = st[13];
    return out->last <= RATE_TIME_MAX;
}

/* Splits the bytes into components laid out as `p` says, each checked to
 * be a state this library can have written under p. */
static bool parse_under(const rate_policy_t *p, const uint8_t *st, size_t len,
                        parsed_t *out)
{
    size_t off = RATE__HEADER_LEN;

    if (st[12] != p->count)
        return false;
    for (size_t i = 0; i < p->count; i++) {
        const rate__algo_t *a = p->algo[i];
        size_t n = a->size != NULL ? a->size(st + off, len - off) : a->fixed;
        if (n == 0 || n > len - off ||
            !a->valid(&p->limits[i], st + off, out->last))
            return false;
        out->comp[i] = st + off;
        off += n;
    }
    out->blocked_until = 0;
    if (p->block) { /* the block's end after the components */
        if (len - off != 8 || rate__get64(st + off) > RATE_TIME_MAX)
            return false;
        out->blocked_until = rate__get64(st + off);
        off += 8;
    }
    return off == len;
}

/* Whether the header names the request's own policy. */
static bool is_own(const rate__step_arg_t *arg, const parsed_t *ps)
{
    return ps->format == arg->format && ps->tag == arg->policy_id;
}

/* The policy a state of another policy was made under, or NULL. */
static const rate_policy_t *other_policy(const rate__step_arg_t *arg,
                                         const parsed_t *ps)
{
    if (ps->format == RATE__FORMAT_V1 && ps->tag == arg->policy->fingerprint)
        return arg->policy; /* the first edition's tag of this policy */
    if (ps->format == RATE__FORMAT && arg->format == RATE__FORMAT &&
        ps->tag == arg->policy_id)
        return arg->policy; /* (a first-edition writer's id is its
                               fingerprint, which may be another's id) */
    return arg->known != NULL ? rate__known_find(arg->known, ps->format, ps->tag)
                              : NULL;
}

/* Whether every limit of a state parsed under `p` is back to its cold
 * start at t. */
static bool cold_by(const rate_policy_t *p, const parsed_t *ps, uint64_t t)
{
    if (ps->blocked_until > t)
        return false;
    for (size_t i = 0; i < p->count; i++) {
        rate__view_t v;
        p->algo[i]->load(&p->limits[i], ps->comp[i], &v);
        p->algo[i]->advance(&p->limits[i], &v, ps->last, t);
        if (!p->algo[i]->is_cold(&p->limits[i], &v))
            return false;
    }
    return true;
}

bool rate__is_cold(void *varg, const void *state, size_t len, uint64_t now)
{
    const rate__step_arg_t *arg = varg;
    const rate_policy_t *p;
    parsed_t ps;

    if (!parse_header(state, len, &ps) || (p = other_policy(arg, &ps)) == NULL)
        return false; /* a policy this limiter does not know: keep */
    if (p->count == 0)
        return true; /* a first-edition state of a policy nobody knows */
    return parse_under(p, state, len, &ps) &&
           cold_by(p, &ps, now > ps.last ? now : ps.last);
}

/* Whether two limits are the same limit (algorithm and numbers). */
static bool same_limit(const rate_limit_t *a, const rate_limit_t *b)
{
    return a->algorithm == b->algorithm && a->limit == b->limit &&
           a->period_ns == b->period_ns && a->burst == b->burst;
}

/* Whether a limit's state keeps its meaning under another, not the same,
 * limit: a bucket's under a bucket of its kind (its tokens or level, in
 * permits), a window's under one of its kind and length (its counts and
 * entries are of the same windows). */
static bool is_bucket(const rate_limit_t *l)
{
    return l->algorithm == RATE_TOKEN_BUCKET ||
           l->algorithm == RATE_LEAKY_BUCKET;
}

static bool same_meaning(const rate_limit_t *a, const rate_limit_t *b)
{
    return a->algorithm == b->algorithm &&
           (is_bucket(a) || a->period_ns == b->period_ns);
}

/* from[i] for a limit no old limit is matched with: charged what the
 * unmatched old limits count (OTHERS), or cold (NONE). */
#define FROM_OTHERS (-1)
#define FROM_NONE (-2)

/* Matches each limit of the new policy `to` with one of the old `old`'s
 * by what it is, not by its position: first the very same limit, then one
 * whose state keeps its meaning (same_meaning), in order; from[i] is the
 * old limit's index, or FROM_OTHERS when unmatched old limits are left
 * (charged), else FROM_NONE (a cold start: nothing was counted against
 * it).  With no state to carry, every limit is FROM_NONE. */
static void match_limits(const rate_policy_t *old, const rate_policy_t *to,
                         bool carry, int *from)
{
    bool taken[RATE_MAX_LIMITS] = {false};
    size_t left = carry ? old->count : 0;

    for (size_t i = 0; i < to->count; i++)
        from[i] = FROM_NONE;
    if (!carry)
        return;
    for (int pass = 0; pass < 2; pass++)
        for (size_t i = 0; i < to->count; i++)
            for (size_t j = 0; from[i] == FROM_NONE && j < old->count; j++)
                if (!taken[j] &&
                    (pass == 0 ? same_limit(&old->limits[j], &to->limits[i])
                               : same_meaning(&old->limits[j],
                                              &to->limits[i]))) {
                    from[i] = (int)j;
                    taken[j] = true;
                    left--;
                }
    for (size_t i = 0; i < to->count; i++)
        if (from[i] == FROM_NONE && left > 0)
            from[i] = FROM_OTHERS;
}

/* Where the time a limit of another algorithm counts at t begins: a
 * fixed window's start, the start of the window before for a sliding
 * counter (its estimate weighs it), t - W + 1 for a log, and for a bucket
 * the time it takes to recover its whole capacity before t. */
static uint64_t counts_from(const rate__algo_t *alg, const rate_limit_t *l,
                            uint64_t t)
{
    uint64_t w = l->period_ns;
    switch (l->algorithm) {
    case RATE_FIXED_WINDOW:
        return t / w * w;
    case RATE_SLIDING_WINDOW:
        return t / w > 0 ? (t / w - 1) * w : 0;
    default: {
        uint64_t span = l->algorithm == RATE_SLIDING_LOG ? w
                                                         : alg->max_reset(l);
        return t >= span ? t - span + 1 : 0;
    }
    }
}

/* The permits a limit `to` (of algorithm `alg`) is charged at t: the
 * most any old limit not matched (from[0..count)) still holds at t by its
 * own rule, or can have admitted in the time `to` counts at t (all of it
 * taken as admitted at t); at most RATE__CHARGE_MAX. */
static uint64_t charge_of(const rate_policy_t *old, const parsed_t *ps,
                          const int *from, size_t count,
                          const rate__algo_t *alg, const rate_limit_t *to,
                          uint64_t t)
{
    uint64_t most = 0, a = counts_from(alg, to, t);

    for (size_t j = 0; j < old->count; j++) {
        bool matched = false;
        for (size_t i = 0; i < count; i++)
            matched = matched || from[i] == (int)j;
        if (matched)
            continue;
        const rate__algo_t *oa = old->algo[j];
        const rate_limit_t *l = &old->limits[j];
        rate__view_t v;
        oa->load(l, ps->comp[j], &v);
        /* a bucket's held count is all it can have left to a bucket */
        uint64_t since = a <= ps->last && !(is_bucket(l) && is_bucket(to))
                             ? oa->since(l, &v, ps->last, a)
                             : 0;
        oa->advance(l, &v, ps->last, t);
        uint64_t u = oa->held(l, &v, t);
        if (since > u)
            u = since;
        if (u > most)
            most = u;
    }
    return most < RATE__CHARGE_MAX ? most : RATE__CHARGE_MAX;
}

static int read_state(rate__step_arg_t *arg, const rate_step_io_t *io,
                      rate__view_t *views, uint64_t *t_eff, uint64_t *last,
                      uint64_t *blocked_until)
{
    const rate_policy_t *p = arg->policy, *old;
    const uint8_t *st = io->old_state;
    parsed_t ps;

    *t_eff = arg->now_ns;
    *last = 0;
    *blocked_until = 0;
    if (st == NULL || io->old_len == 0) { /* a new key: cold start */
        for (size_t i = 0; i < p->count; i++)
            p->algo[i]->load(&p->limits[i], NULL, &views[i]);
        return RATE_OK;
    }
    if (!parse_header(st, io->old_len, &ps))
        return RATE_ECORRUPT;
    *last = ps.last;
    if (ps.last > *t_eff)
        *t_eff = ps.last;
    if (is_own(arg, &ps)) {
        if (!parse_under(p, st, io->old_len, &ps))
            return RATE_ECORRUPT;
        *blocked_until = ps.blocked_until;
        for (size_t i = 0; i < p->count; i++) {
            const rate__algo_t *a = p->algo[i];
            a->load(&p->limits[i], ps.comp[i], &views[i]);
            a->advance(&p->limits[i], &views[i], ps.last, *t_eff);
        }
        return RATE_OK;
    }
    if ((old = other_policy(arg, &ps)) == NULL) {
        arg->need_tag = ps.tag; /* the limiter fetches it, then again */
        arg->need_format = ps.format;
        return RATE__NEED_POLICY;
    }
    /* Made under another policy: carry over what has the same meaning, as
     * of t_last, the new policy then governing the time since; charge the
     * rest at t_eff (match_limits, charge_of).  A state that
     * has reached its cold start under the old policy by t_eff is a cold
     * key, as it would be had the store forgotten it (which it may).  A
     * first-edition state of a policy no one knows (count 0) starts cold,
     * as the first edition itself read it. */
    bool carry = old->count > 0;
    if (carry && !parse_under(old, st, io->old_len, &ps))
        return RATE_ECORRUPT;
    carry = carry && !cold_by(old, &ps, *t_eff);
    if (carry && p->block) /* a block carries to a policy that blocks */
        *blocked_until = ps.blocked_until;
    int from[RATE_MAX_LIMITS];
    match_limits(old, p, carry, from);
    bool charged = false;
    for (size_t i = 0; i < p->count; i++) {
        const rate_limit_t *to = &p->limits[i];
        const rate__algo_t *a = p->algo[i];
        int j = from[i];
        if (j >= 0) { /* a limit of the same algorithm keeps its meaning */
            a->load(&old->limits[j], ps.comp[j], &views[i]);
            a->convert(&old->limits[j], to, ps.last, &views[i]);
            a->advance(to, &views[i], ps.last, *t_eff);
        } else if (carry && j == FROM_OTHERS) {
            /* Another algorithm: what the old limits still hold at t_eff,
             * each by its own rule, is charged to this one as admitted at
             * t_eff (the most any of them holds). */
            a->load(to, NULL, &views[i]);
            a->charge(to, &views[i], *t_eff,
                      charge_of(old, &ps, from, p->count, a, to, *t_eff));
            charged = true;
        } else {
            a->load(to, NULL, &views[i]); /* nothing the old one had */
        }
    }
    if (charged) /* a charged log's entry is at t_eff */
        *last = *t_eff;
    return RATE_OK;
}

/* Folds the limits' verdicts into one decision (spec: smallest remaining,
 * largest delay and reset_after, largest retry_after among the denials). */
static void combine(const rate_policy_t *p, const rate__verdict_t *v,
                    rate_decision_t *d)
{
    bool allowed = true, never = false;

    if (p->count == 1) { /* the common case: the verdict is the decision */
        const rate_limit_t *l = &p->limits[0];
        d->allowed = v->allowed;
        d->shadow = false;
        d->reason = v->reason;
        d->component = 0;
        d->error = 0;
        d->limit = rate__shown_limit(l);
        d->remaining = v->allowed ? v->remaining_after : v->remaining_now;
        d->delay_ns = v->allowed ? v->delay_ns : 0;
        d->retry_after_ns = v->retry_after_ns;
        d->reset_after_ns = v->allowed ? v->reset_after_ns : v->reset_now_ns;
        return;
    }

    for (size_t i = 0; i < p->count; i++) {
        allowed = allowed && v[i].allowed;
        never = never || v[i].reason == RATE_REASON_NEVER;
    }
    memset(d, 0, sizeof *d);
    d->allowed = allowed;
    d->reason = allowed ? RATE_REASON_ALLOWED
                        : never ? RATE_REASON_NEVER : RATE_REASON_LIMITED;
    d->remaining = UINT64_MAX;
    d->component = -1;
    for (size_t i = 0; i < p->count; i++) {
        uint64_t rem = allowed ? v[i].remaining_after : v[i].remaining_now;
        uint64_t reset = allowed ? v[i].reset_after_ns : v[i].reset_now_ns;
        if (allowed && rem < d->remaining)
            d->component = (int)i;
        if (!allowed && !v[i].allowed &&
            (d->component < 0 || v[i].retry_after_ns > d->retry_after_ns)) {
            d->component = (int)i;
            d->retry_after_ns = v[i].retry_after_ns;
        }
        if (rem < d->remaining)
            d->remaining = rem;
        if (v[i].delay_ns > d->delay_ns)
            d->delay_ns = v[i].delay_ns;
        if (reset > d->reset_after_ns)
            d->reset_after_ns = reset;
    }
    if (!allowed)
        d->delay_ns = 0;
    d->limit = rate__shown_limit(&p->limits[d->component]);
}

static void write_header(const rate__step_arg_t *arg, uint64_t t,
                         uint8_t *out)
{
    rate__put64(out, t);
    rate__put32(out + 8, arg->policy_id);
    out[12] = (uint8_t)arg->policy->count;
    out[13] = arg->format;
}

/* The block's end after the components, for a policy that blocks. */
static size_t write_block(const rate_policy_t *p, uint64_t blocked_until,
                          uint8_t *out)
{
    if (!p->block)
        return 0;
    rate__put64(out, blocked_until);
    return 8;
}

static size_t write_state(const rate__step_arg_t *arg,
                          const rate__view_t *views, uint64_t t, uint64_t n,
                          uint64_t blocked_until, uint8_t *out)
{
    const rate_policy_t *p = arg->policy;
    size_t off = RATE__HEADER_LEN;

    write_header(arg, t, out);
    for (size_t i = 0; i < p->count; i++)
        off += p->algo[i]
                   ->commit(&p->limits[i], &views[i], t, n, out + off);
    return off + write_block(p, blocked_until, out + off);
}

/* Bytes the state will take after an admission, at most. */
static size_t state_bound(const rate_policy_t *p, const rate__view_t *views)
{
    size_t len = RATE__HEADER_LEN + (p->block ? 8 : 0);

    for (size_t i = 0; i < p->count; i++) {
        const rate__algo_t *a = p->algo[i];
        len += a->fixed + a->grow + (size_t)views[i].log_count * a->grow;
    }
    return len;
}

/* One fixed-size limit, its state `st` made under this very policy: decided
 * without the general path's loops, the new state written to io.  Returns
 * false (nothing written) when the state is anything else. */
static bool step_one(rate__step_arg_t *arg, rate_step_io_t *io)
{
    const rate_policy_t *p = arg->policy;
    const rate__algo_t *a = p->algo[0];
    const rate_limit_t *l = &p->limits[0];
    const uint8_t *st = io->old_state;
    rate_acquire_t req = {.policy = p, .policy_id = arg->policy_id,
                          .format = arg->format};
    rate__view_t v;
    rate__verdict_t verdict;

    if (a->grow != 0 || !rate__header_is(&req, st, io->old_len, a->fixed))
        return false;
    uint64_t last = rate__get64(st);
    if (!a->valid(l, st + RATE__HEADER_LEN, last))
        return false;
    uint64_t t = arg->now_ns > last ? arg->now_ns : last;
    rate_decision_t *d = arg->decision;
    a->load(l, st + RATE__HEADER_LEN, &v);
    a->advance(l, &v, last, t);
    a->decide(l, &v, t, arg->permits, arg->max_wait_ns, arg->detail,
              &verdict);
    combine(p, &verdict, d);
    io->write = false;
    io->new_len = 0;
    if (!verdict.allowed || arg->permits == 0)
        return true;
    uint8_t *out = io->new_state;
    a->commit(l, &v, t, arg->permits, out + RATE__HEADER_LEN);
    write_header(arg, t, out);
    io->write = true;
    io->new_len = io->old_len;
    io->ttl_ns = arg->detail ? d->reset_after_ns : p->max_reset_ns;
    return true;
}

/* Whether the views may be written back: what each algorithm's read left
 * to the write (a log's entries) checks out against t_last. */
static bool views_ok(const rate_policy_t *p, const rate__view_t *views,
                     uint64_t last)
{
    for (size_t i = 0; i < p->count; i++)
        if (p->algo[i]->view_ok != NULL &&
            !p->algo[i]->view_ok(&p->limits[i], &views[i], last))
            return false;
    return true;
}

/* An admission of arg->permits at t written to io, kept ttl_ns; never a
 * state whose views do not check out (RATE_ECORRUPT). */
static int write_admission(rate__step_arg_t *arg, rate_step_io_t *io,
                           const rate__view_t *views, uint64_t t,
                           uint64_t last, uint64_t ttl_ns)
{
    const rate_policy_t *p = arg->policy;

    if (!views_ok(p, views, last))
        return RATE_ECORRUPT; /* never written back */
    if (state_bound(p, views) > io->new_cap)
        return RATE_EINVAL; /* the store gave less room than promised */
    io->new_len = write_state(arg, views, t, arg->permits, 0, io->new_state);
    io->write = true;
    io->ttl_ns = ttl_ns;
    return RATE_OK;
}

/* A refund or a penalty: the state at t_eff, changed by each algorithm's
 * adjust, written back with t_last = t_eff.  A refund of a key that has no
 * state writes nothing (there is nothing to give back). */
static int step_adjust(rate__step_arg_t *arg, rate_step_io_t *io)
{
    const rate_policy_t *p = arg->policy;
    rate__view_t views[RATE_MAX_LIMITS];
    uint64_t admit[RATE_MAX_LIMITS];
    uint64_t t, last, blocked, ttl = 0;
    int rc = read_state(arg, io, views, &t, &last, &blocked);

    if (rc != RATE_OK)
        return rc;
    if (io->old_state == NULL && arg->op == RATE__OP_REFUND)
        return RATE_OK;
    if (!views_ok(p, views, last))
        return RATE_ECORRUPT;
    for (size_t i = 0; i < p->count; i++)
        admit[i] = p->algo[i]->adjust(&p->limits[i], &views[i], arg->op,
                                      arg->permits, t);
    if (state_bound(p, views) > io->new_cap)
        return RATE_EINVAL;
    size_t off = RATE__HEADER_LEN;
    write_header(arg, t, io->new_state);
    for (size_t i = 0; i < p->count; i++) {
        const rate__algo_t *a = p->algo[i];
        const rate_limit_t *l = &p->limits[i];
        rate__verdict_t v;
        a->decide(l, &views[i], t, 0, 0, true, &v);
        uint64_t reset = admit[i] > 0 ? a->max_reset(l) : v.reset_now_ns;
        if (reset > ttl)
            ttl = reset;
        off += a->commit(l, &views[i], t, admit[i], io->new_state + off);
    }
    off += write_block(p, blocked, io->new_state + off);
    if (blocked > t && blocked - t > ttl)
        ttl = blocked - t;
    io->new_len = off;
    io->write = true;
    io->ttl_ns = ttl;
    return RATE_OK;
}

/* A policy that blocks after a breach, once its limits have decided
 * (verdicts, combined into the decision): a key blocked until after t is
 * denied whatever the limits say (retry_after: the block's end; nothing
 * written; a query is allowed, with nothing remaining); a request a blocking limit denies ("limited") blocks the key,
 * written as its state at t with the block's end (t_last becomes t: the
 * documented exception, docs/algorithms.md); an admission writes as
 * usual, with no block. */
static int decide_blocking(rate__step_arg_t *arg, rate_step_io_t *io,
                           rate__view_t *views,
                           const rate__verdict_t *verdicts, uint64_t t,
                           uint64_t last, uint64_t blocked)
{
    const rate_policy_t *p = arg->policy;
    rate_decision_t *d = arg->decision;
    uint64_t reset = 0, block = 0;

    for (size_t i = 0; i < p->count; i++) {
        if (verdicts[i].reset_now_ns > reset)
            reset = verdicts[i].reset_now_ns;
        if (!verdicts[i].allowed && verdicts[i].reason == RATE_REASON_LIMITED &&
            p->limits[i].block_ns > block)
            block = p->limits[i].block_ns;
    }
    if (blocked > t || (!d->allowed && block > 0)) {
        bool blocking_now = blocked <= t;
        if (blocking_now)
            blocked = rate__sat_add(t, block);
        d->remaining = 0;
        d->reset_after_ns = reset > blocked - t ? reset : blocked - t;
        if (arg->permits == 0)
            return RATE_OK; /* a query is allowed, and says so */
        if (d->reason != RATE_REASON_NEVER) {
            d->reason = RATE_REASON_LIMITED;
            if (blocked - t > d->retry_after_ns || d->allowed)
                d->retry_after_ns = blocked - t;
        }
        d->allowed = false;
        d->delay_ns = 0;
        if (!blocking_now)
            return RATE_OK; /* already blocked: nothing to write */
        if (state_bound(p, views) > io->new_cap)
            return RATE_EINVAL;
        io->new_len = write_state(arg, views, t, 0, blocked, io->new_state);
        io->write = true;
        io->ttl_ns = d->reset_after_ns;
        return RATE_OK;
    }
    if (!d->allowed || arg->permits == 0)
        return RATE_OK;
    return write_admission(arg, io, views, t, last,
                           d->reset_after_ns > p->max_reset_ns
                               ? d->reset_after_ns
                               : p->max_reset_ns);
}

int rate__step(void *varg, rate_step_io_t *io)
{
    rate__step_arg_t *arg = varg;
    const rate_policy_t *p = arg->policy;
    rate__view_t views[RATE_MAX_LIMITS];
    rate__verdict_t verdicts[RATE_MAX_LIMITS];
    uint64_t t, last, blocked;
    int rc;

    if (p->unlimited) { /* the limiter answers it first; never written */
        rate__unlimited_decision(arg->decision);
        io->write = false;
        io->new_len = 0;
        return RATE_OK;
    }
    if (arg->op == RATE__OP_DECIDE && p->count == 1 &&
        io->old_state != NULL && step_one(arg, io))
        return RATE_OK;
    io->write = false;
    io->new_len = 0;
    if (arg->op != RATE__OP_DECIDE)
        return step_adjust(arg, io);
    rc = read_state(arg, io, views, &t, &last, &blocked);
    if (rc != RATE_OK)
        return rc;
    bool detail = arg->detail || p->block; /* a block needs the resets */
    for (size_t i = 0; i < p->count; i++)
        p->algo[i]->decide(&p->limits[i], &views[i], t, arg->permits,
                           arg->max_wait_ns, detail, &verdicts[i]);
    combine(p, verdicts, arg->decision);
    if (p->block)
        return decide_blocking(arg, io, views, verdicts, t, last, blocked);
    if (!arg->decision->allowed || arg->permits == 0)
        return RATE_OK;
    return write_admission(arg, io, views, t, last,
                           arg->detail ? arg->decision->reset_after_ns
                                       : p->max_reset_ns);
}

/* The stores' pass for the bool calls.  The token bucket's, the common
 * case, is compiled in here from its header, so that a store's acquire()
 * makes this one call and no other; every other algorithm's is called
 * through its policy. */
int rate_state_acquire(const rate_acquire_t *req, uint64_t permits,
                       uint64_t now_ns, void *state, size_t len,
                       uint64_t *ttl_ns)
{
    const rate_policy_t *p = req->policy;

    if (p->algo[0] == &rate__token_bucket && p->count == 1)
        return tb_plain_inline(req, permits, now_ns, state, len, ttl_ns);
    return p->plain != NULL ? p->plain(req, permits, now_ns, state, len,
                                       ttl_ns)
                            : RATE_ENOTSUP;
}
