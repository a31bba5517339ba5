/* SPDX-License-Identifier: MIT */
/*
 * The not-waiting decision on the fair table (decide.h): the flow's
 * request counted in its entry, the shared limit asked (the bool call or
 * the full decision, under the configured policy or the limiter's own),
 * and the fair rule applied to its answer: a request that is not light
 * must leave the room rule.h reserves for the light flows and the heavy
 * flows behind it, or its permits are given back and it is denied.  Also
 * the path without the lock (fast_try), taken while the shared limit has
 * more room than any reserve could need.
 */
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "decide.h"
#include "index.h"
#include "table.h"
#include "vtime.h"
#include "wait.h"

#define LEARN 64u /* permits asked between full decisions, room unknown */

/* What the flow asked lately, as the rule reads it: the larger of this
 * period's and the last's, plus what its waiters ask. */
static uint64_t recent(const fslot_t *sl)
{
    return (sl->asked_cur > sl->asked_prev ? sl->asked_cur : sl->asked_prev) +
           sl->qpermits;
}

/* The periods since the flow first asked, this one included (rule.h). */
static uint64_t age(const fslot_t *sl)
{
    return rate__fair_age(sl->since, sl->epoch);
}

/* The entry's flow as the rule reads it. */
static rate__fair_flow_t flow_of(const fslot_t *sl)
{
    return (rate__fair_flow_t){sl->asked_cur, sl->asked_prev, sl->lsum,
                               sl->since};
}

/* What the flows behind `me` that are not light are owed (docs/fair.md,
 * "The rule"): for each, rate__fair_owed, summed for rate__fair_need into
 * *terms.  A walk of the active list (RATE_ECORRUPT when it is damaged). */
static int terms_for(rate_fair_t *f, const fslot_t *me, uint64_t cap,
                     uint64_t now, uint64_t *terms)
{
    uint64_t total_w = f->h->total_w;
    unsigned __int128 r = 0;
    *terms = 0;
    if (total_w == 0 || me->s <= f->h->vtime)
        return RATE_OK;
    lwalk_t w = lwalk_start(f);
    for (;;) {
        fslot_t *sl;
        int rc = rate__ft_lwalk_next(f, &w, &sl);
        if (rc != RATE_OK)
            return rc;
        if (sl == NULL)
            break;
        if (sl == me || sl->s >= me->s)
            continue;
        rate__fair_flow_t fl = flow_of(sl);
        r += rate__fair_owed(&f->shape, now / 1000, cap, &fl, recent(sl),
                             age(sl), sl->weight, total_w, me->s - sl->s);
    }
    *terms = r > RATE__FAIR_LIGHT_MAX ? RATE__FAIR_LIGHT_MAX : (uint64_t)r;
    return RATE_OK;
}

/* Counts a request of the entry in the light estimator (lock held): its
 * permits go to the light backlog while the flow is light; a flow that
 * is no longer light takes back what it gave.  Returns whether it is
 * light. */
static bool light_count(rate_fair_t *f, fslot_t *sl, uint64_t permits,
                        uint64_t now)
{
    rate__fair_light_t *l = &f->h->light;
    rate__fair_flow_t fl = flow_of(sl);
    uint64_t g = sl->lgave;
    bool light = rate__fair_light_note(l, &f->shape, now / 1000, permits, &fl,
                                       recent(sl), age(sl), sl->weight,
                                       f->h->total_w, f->h->cap, &g);
    sl->lgave = g > UINT32_MAX ? UINT32_MAX : (uint32_t)g;
    ST(f->h->light_bound, rate__fair_light_bound(l, &f->shape, f->h->cap));
    return light;
}

/* The room a request of the entry that is not light must leave in the
 * shared limit of capacity cap, whose room after the request is
 * `remaining` (lock held), into *need.  The walk for the catch-up terms
 * is spared when the room exceeds the light part plus every permit asked
 * in this period and the last (and queued), a bound of any terms' sum. */
static int need_of(rate_fair_t *f, const fslot_t *sl, uint64_t cap,
                   uint64_t now, uint64_t remaining, uint64_t *need)
{
    fhdr_t *h = f->h;
    uint64_t light = rate__fair_need(&h->light, &f->shape, now / 1000, cap, 0);
    uint64_t bound = LD(h->asked_seq) - h->seq_prev + h->queued, terms;
    *need = light;
    if (remaining >= light && remaining - light >= bound)
        return RATE_OK;
    int rc = terms_for(f, sl, cap, now, &terms);
    if (rc == RATE_OK)
        *need = rate__fair_need(&h->light, &f->shape, now / 1000, cap, terms);
    return rc;
}

/* The shared limit's decision and refund, under the configured policy
 * or the limiter's own. */
int rate__ft_shared_check(rate_fair_t *f, uint64_t permits, uint64_t now,
                          rate_decision_t *out)
{
    int rc;
    if (f->policy != NULL)
        rc = rate_limiter_check_policy_at(f->limiter, f->policy, f->key,
                                          f->key_len, permits, 0, now, out);
    else
        rc = rate_limiter_check_at(f->limiter, f->key, f->key_len, permits, 0,
                                   now, out);
    if (rc == RATE_OK && out->limit != RATE_NO_LIMIT && out->limit > 0)
        f->h->cap = out->limit;
    uint64_t seq = LD(f->h->asked_seq);
    ST(f->h->room_until,
       rc == RATE_OK && out->reason == RATE_REASON_ALLOWED &&
               out->limit != RATE_NO_LIMIT && !out->shadow &&
               out->remaining > 0 && out->remaining <= UINT64_MAX - seq
           ? seq + out->remaining
           : 0);
    return rc;
}

static int shared_refund(rate_fair_t *f, uint64_t permits, uint64_t now)
{
    if (f->policy != NULL)
        return rate_limiter_refund_policy_at(f->limiter, f->policy, f->key,
                                             f->key_len, permits, now);
    return rate_limiter_refund_at(f->limiter, f->key, f->key_len, permits,
                                  now);
}

/* The bool call on the shared limit (the limiter's own policy); a denial
 * leaves the room unknown. */
static bool shared_try(rate_fair_t *f, uint64_t permits, uint64_t now)
{
    bool ok = rate_try_acquire_len_at(f->limiter, f->key, f->key_len, permits,
                                      now);
    if (!ok)
        ST(f->h->room_until, 0);
    return ok;
}

/* A fair denial into *out (the shared limit's permits already given
 * back): the room missing to `need`, refilled at the shared policy's
 * rate, as the retry estimate. */
static void fair_deny(rate_fair_t *f, rate_decision_t *out, uint64_t permits,
                      uint64_t need)
{
    uint64_t missing = need - out->remaining;
    unsigned __int128 t =
        ((unsigned __int128)missing * f->period_ns + f->rate_limit - 1) /
        f->rate_limit;
    out->allowed = false;
    out->reason = RATE_REASON_LIMITED;
    out->remaining += permits;
    out->delay_ns = 0;
    out->retry_after_ns = t > RATE_TIME_MAX ? RATE_TIME_MAX : (uint64_t)t;
    f->h->fair_denied++;
    ST(f->h->room_until, LD(f->h->asked_seq) + out->remaining);
}

/* A request the shared limit admitted whose table work then failed
 * (RATE_ECORRUPT): its permits are given back, and the failure is the
 * answer (the permits stay spent if the refund fails: the limit is kept
 * either way). */
int rate__ft_admitted_fail(rate_fair_t *f, uint64_t permits, uint64_t now,
                           int rc)
{
    (void)shared_refund(f, permits, now);
    return rc;
}

/* Decides a request of the entry (lock held) at now.  full: fill *out
 * (else the bool call's fast path: when the flow is within its share, or
 * when the shared limit's room, known from its last full decision, keeps
 * more than any reserve after the request). */
int rate__ft_decide(rate_fair_t *f, fslot_t *sl, uint64_t permits, uint64_t now,
                    bool full, rate_decision_t *out)
{
    fhdr_t *h = f->h;
    uint64_t seq = LD(h->asked_seq), until = LD(h->room_until);
    uint64_t bound = seq - h->seq_prev + h->queued;
    /* The room, unknown, is learnt by a full decision now and then (at
     * most one per LEARN permits asked), so that fast_try can start. */
    bool learn = until == 0 && seq >= h->learn_seq;
    if (learn)
        h->learn_seq = seq + LEARN;
    bool light = light_count(f, sl, permits, now);
    if (!full && f->policy == NULL && !learn &&
        (light || (until >= seq && until - seq >= bound + h->light_bound))) {
        out->allowed = shared_try(f, permits, now);
        int rc = out->allowed ? rate__ft_charge(f, sl, permits) : RATE_OK;
        return rc == RATE_OK ? RATE_OK
                             : rate__ft_admitted_fail(f, permits, now, rc);
    }
    int rc = rate__ft_shared_check(f, permits, now, out);
    if (rc != RATE_OK || !out->allowed)
        return rc;
    if (!light && out->reason == RATE_REASON_ALLOWED &&
        out->limit != RATE_NO_LIMIT && !out->shadow) {
        uint64_t need;
        rc = need_of(f, sl, out->limit, now, out->remaining, &need);
        if (rc != RATE_OK)
            return rate__ft_admitted_fail(f, permits, now, rc);
        if (out->remaining < need) {
            rc = shared_refund(f, permits, now);
            if (rc == RATE_OK) {
                fair_deny(f, out, permits, need);
                return RATE_OK;
            }
            /* The refund failed (a store error): the permits stay spent,
             * so the request is admitted; the limit is kept either way. */
        }
    }
    rc = rate__ft_charge(f, sl, permits);
    return rc == RATE_OK ? RATE_OK
                         : rate__ft_admitted_fail(f, permits, now, rc);
}

/* The next waiter's admission (lock held), when its flow is not light,
 * must leave the room the rule keeps (rate__fair_need), as a request
 * that does not wait must: else it is given back and *out says when the
 * room is expected.  A damaged table's walk fails (its permits given
 * back). */
int rate__ft_keep_light_room(rate_fair_t *f, fslot_t *sl, uint64_t permits,
                             uint64_t now, rate_decision_t *out)
{
    uint64_t need;
    if (!out->allowed || out->reason != RATE_REASON_ALLOWED ||
        out->limit == RATE_NO_LIMIT || out->shadow ||
        rate__fair_is_light(&f->shape, recent(sl), sl->lsum, age(sl),
                            sl->weight, f->h->total_w, out->limit))
        return RATE_OK;
    int rc = need_of(f, sl, out->limit, now, out->remaining, &need);
    if (rc != RATE_OK)
        return rate__ft_admitted_fail(f, permits, now, rc);
    if (out->remaining < need && shared_refund(f, permits, now) == RATE_OK)
        fair_deny(f, out, permits, need);
    return RATE_OK;
}

int rate__ft_check_input(const rate_fair_t *f, const char *flow, size_t len,
                         uint32_t weight, uint64_t permits, uint64_t now)
{
    if (f == NULL || weight > RATE_FAIR_WEIGHT_MAX)
        return RATE_EINVAL;
    if (flow == NULL || len == 0 || len > RATE_KEY_MAX)
        return RATE_EKEY;
    if (permits > RATE_TIME_MAX || now > RATE_TIME_MAX)
        return RATE_ERANGE;
    return RATE_OK;
}

/* The flow's entry (*out) brought to now, its request counted as
 * asked. */
int rate__ft_enter(rate_fair_t *f, const char *flow, size_t len,
                   uint32_t weight, uint64_t permits, uint64_t now,
                   fslot_t **out)
{
    uint64_t ep = rate__ft_epoch_at(f, now);
    int rc = rate__ft_expire(f, ep, now);
    if (rc != RATE_OK)
        return rc;
    fslot_t *sl = rate__ft_find_slot(f, flow, len, weight ? weight : 1);
    if ((rc = rate__ft_fold(f, sl)) != RATE_OK ||
        (rc = rate__ft_touch(f, sl, ep)) != RATE_OK)
        return rc;
    sl->asked_cur += permits;
    sl->lsum = rate__fair_long_add(sl->lsum, permits);
    __atomic_add_fetch(&f->h->asked_seq, permits, __ATOMIC_RELAXED);
    *out = sl;
    return RATE_OK;
}

/* A cost fast_try added to a generation of the entry after its own (the
 * entry taken by another flow meanwhile) is taken back, unless the new
 * flow's decision under the lock folded it first (then it stays
 * charged: at most the costs in flight at that moment). */
__attribute__((noinline)) static void pend_undo(fslot_t *sl, uint64_t cost)
{
    uint64_t cur = LD(sl->pend);
    while ((cur & PEND_COST) >= cost &&
           !__atomic_compare_exchange_n(&sl->pend, &cur, cur - cost, true,
                                        __ATOMIC_RELAXED, __ATOMIC_RELAXED))
        ;
}

/* The bool call's path without the table's lock, taken while the shared
 * limit has more room than every permit asked in this period and the
 * last (so no reserve can be at stake), nothing waits, and the flow's
 * entry was brought to this period already: the permits are counted in
 * asked_seq and the shared limit decides alone.  The flow's service is
 * not charged then: it is counted while the limit is contended
 * (docs/fair.md, "The path without the lock").  Returns 1 admitted,
 * 0 denied, -1 when the lock must be taken. */
int rate__ft_fast_try(rate_fair_t *f, const char *flow, size_t len,
                      uint32_t weight, uint64_t permits, uint64_t now)
{
    fhdr_t *h = f->h;
    uint64_t ep = LD(h->epoch), start = LD(h->epoch_start);
    if (f->policy != NULL || LD(h->waiting) != 0 || ep == 0 || now < start ||
        now - start >= f->period_ns)
        return -1;
    uint64_t until = LD(h->room_until), seq = LD(h->asked_seq) + permits;
    uint64_t prev = LD(h->seq_prev);
    if (until < seq || until - seq < seq - prev ||
        until - seq - (seq - prev) < LD(h->light_bound))
        return -1;
    uint64_t hv = XXH3_64bits_withSeed(flow, len, h->seed);
    if (hv == 0)
        hv = 1;
    uint32_t n = f->slots;
    uint32_t k = (uint32_t)(((hv >> 32) * n) >> 32);
    fslot_t *sl = &f->slot[k];
    if (__builtin_expect(LD(sl->hash) != hv, 0)) { /* past its home */
        uint32_t probes = n < PROBES ? n : PROBES;
        for (uint32_t i = 1;; i++) {
            if (i == probes)
                return -1;
            k = k + 1 == n ? 0 : k + 1;
            if (LD(f->slot[k].hash) == hv)
                break;
        }
        sl = &f->slot[k];
    }
    uint32_t w = weight ? weight : 1;
    /* The entry's generation, then its hash again: still the flow's, the
     * generation is the flow's too (find_slot publishes a new one after a
     * new hash).  A cost past what the word holds goes through the lock. */
    uint64_t pw = __atomic_load_n(&sl->pend, __ATOMIC_ACQUIRE);
    uint64_t cost = cost_of(permits, w);
    if (LD(sl->hash) != hv || LD(sl->epoch) != ep || LD(sl->weight) != w ||
        cost > (PEND_COST >> 8) || (pw & PEND_COST) > (PEND_COST >> 1))
        return -1;
    __atomic_add_fetch(&h->asked_seq, permits, __ATOMIC_RELAXED);
    if (rate_try_acquire_len_at(f->limiter, f->key, f->key_len, permits, now)) {
        /* Charged to the generation read: a cost that lands on a later
         * one (the entry taken by another flow meanwhile) is taken back
         * (docs/fair.md, "The path without the lock"). */
        uint64_t old = __atomic_fetch_add(&sl->pend, cost, __ATOMIC_RELAXED);
        if (PEND_GEN(old) != PEND_GEN(pw))
            pend_undo(sl, cost);
        return 1;
    }
    ST(h->room_until, 0);
    return 0;
}

int rate__ft_check(rate_fair_t *f, const char *flow, size_t len,
                   uint32_t weight, uint64_t permits, uint64_t now,
                   bool full, rate_decision_t *out)
{
    fslot_t *sl;
    int rc = rate__ft_lock(f);
    if (rc != RATE_OK)
        return rc;
    rc = rate__ft_enter(f, flow, len, weight, permits, now, &sl);
    if (rc == RATE_OK)
        rc = rate__ft_decide(f, sl, permits, now, full, out);
    /* an admission may have made another queue next */
    if (rc == RATE_OK && LD(f->h->waiting) > 0 &&
        (rc = rate__ft_wake_next(f)) != RATE_OK && out->allowed)
        rc = rate__ft_admitted_fail(f, permits, now, rc);
    rate__ft_unlock(f);
    return rc;
}
