/* SPDX-License-Identifier: MIT */
/*
 * The step every store runs: a key's whole state in, its new state and the
 * decision out.  Pure: no clock, no I/O, no allocation, no lock.
 *
 * Stored bytes (integers little-endian, src/internal.h):
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
 * at t_last;
 * each component is carried over to the new policy when the algorithm is
 * the same at the same position, starts used up at t_last when another
 * algorithm is there, and cold where the old policy had no limit; the new
 * policy governs the time from t_last on.  Nothing needs writing
 * until the next admission, so denials still change nothing.
 */
#include "algo/token_bucket.h"

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
     * of t_last; the new policy then governs the time since.  A state that
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
    for (size_t i = 0; i < p->count; i++) {
        const rate_limit_t *to = &p->limits[i];
        const rate__algo_t *a = p->algo[i];
        if (carry && i < old->count &&
            old->limits[i].algorithm == to->algorithm) {
            a->load(&old->limits[i], ps.comp[i], &views[i]);
            a->convert(&old->limits[i], to, ps.last, &views[i]);
            a->advance(to, &views[i], ps.last, *t_eff);
        } else if (carry && i < old->count) {
            /* Another algorithm: nothing of the old one's means the same,
             * so it starts used up at t_last (never more generous than
             * what the old state allowed), and recovers by its own rule. */
            a->load(to, NULL, &views[i]);
            a->exhaust(to, &views[i], ps.last);
            a->advance(to, &views[i], ps.last, *t_eff);
        } else {
            a->load(to, NULL, &views[i]); /* a limit the old one had not */
        }
    }
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
