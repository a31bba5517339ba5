/* SPDX-License-Identifier: MIT */
/*
 * Virtual time on the fair table (vtime.h): a flow's entry found or taken
 * by its hash, its service charged in virtual time (permits over weight)
 * with the indexes kept in order, what fast_try admitted without the lock
 * folded in, a queue's head tagged with its finish time, and the periods
 * rolled: an entry that asked in neither this period nor the last leaves
 * the active set, and a flow back from idle restarts at V.
 */
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "index.h"
#include "table.h"
#include "vtime.h"

/* The period of `now` (plus 1), lock held: the division is done once a
 * period, not once a decision. */
uint64_t rate__ft_epoch_at(rate_fair_t *f, uint64_t now)
{
    fhdr_t *h = f->h;
    if (h->epoch != 0 && now >= h->epoch_start &&
        now - h->epoch_start < f->period_ns)
        return h->epoch;
    return now / f->period_ns + 1;
}

/* The queue's head's finish time, and its place in the heap of queues:
 * F = max(s, V) + n / w (start-time fair queueing's tag, fixed while the
 * head and the flow's service stay). */
int rate__ft_retag(rate_fair_t *f, fslot_t *sl)
{
    const heap_t hp = wheap(f);
    fqueue_t q;
    fwait_t *w;
    int rc = queue_of(f, sl, &q);
    if (rc != RATE_OK)
        return rc;
    if (q.len == 0)
        return LD(sl->wpos) != NIL ? rate__ft_heap_remove(f, &hp, sl) : RATE_OK;
    if ((rc = queue_seat(f, sl, &q, 0, &w)) != RATE_OK)
        return rc;
    uint64_t v = f->h->vtime;
    sl->ftag = (sl->s > v ? sl->s : v) +
               cost_of(LD(w->permits), weight_of(sl));
    return LD(sl->wpos) == NIL ? rate__ft_heap_push(f, &hp, sl)
                               : rate__ft_heap_update(f, &hp, sl);
}

/* Moves every virtual time down by V when V passes LEAD_MAX
 * (differences are all the rules read; the heaps' order stays). */
static void rebase(rate_fair_t *f)
{
    uint64_t v = f->h->vtime;
    for (uint32_t i = 0; i < f->slots; i++) {
        fslot_t *sl = &f->slot[i];
        sl->s = sl->s > v ? sl->s - v : 0;
        sl->ftag = sl->ftag > v ? sl->ftag - v : 0;
    }
    f->h->vtime = 0;
}

/* Adds a cost to s, keeping s at most LEAD_MAX ahead of V (vtime.h). */
static int charge_cost(rate_fair_t *f, fslot_t *sl, uint64_t cost)
{
    uint64_t top = f->h->vtime + LEAD_MAX;
    int rc = RATE_OK;
    sl->s += sl->s >= top ? 0 : cost < top - sl->s ? cost : top - sl->s;
    if (LD(sl->apos) != NIL)
        rc = rate__ft_aheap_down(f, sl);
    if (rc == RATE_OK && LD(sl->qlen) > 0)
        rc = rate__ft_retag(f, sl);
    if (f->h->vtime > LEAD_MAX)
        rebase(f);
    return rc;
}

int rate__ft_charge(rate_fair_t *f, fslot_t *sl, uint64_t permits)
{
    return charge_cost(f, sl, cost_of(permits, weight_of(sl)));
}

/* Takes into s what fast_try admitted for the entry since (lock held);
 * the generation stays. */
int rate__ft_fold(rate_fair_t *f, fslot_t *sl)
{
    if ((LD(sl->pend) & PEND_COST) == 0)
        return RATE_OK;
    return charge_cost(f, sl, __atomic_fetch_and(&sl->pend, ~PEND_COST,
                                                 __ATOMIC_RELAXED) &
                                  PEND_COST);
}

static int activate(rate_fair_t *f, fslot_t *sl)
{
    if (sl->s < f->h->vtime)
        sl->s = f->h->vtime; /* no credit for the idle time */
    const heap_t hp = aheap(f);
    int rc = rate__ft_heap_push(f, &hp, sl);
    if (rc == RATE_OK)
        rc = rate__ft_list_append(f, sl);
    if (rc != RATE_OK)
        return rc;
    f->h->total_w += sl->weight;
    return rate__ft_vtime_update(f);
}

static int deactivate(rate_fair_t *f, fslot_t *sl)
{
    const heap_t hp = aheap(f);
    int rc = rate__ft_list_unlink(f, sl);
    if (rc == RATE_OK)
        rc = rate__ft_heap_remove(f, &hp, sl);
    if (rc != RATE_OK)
        return rc;
    f->h->total_w -= sl->weight;
    return rate__ft_vtime_update(f);
}

/* Brings the table to period ep: the totals of asked permits roll, and
 * the entries that asked in neither this period nor the one before leave
 * the active set, from the list's head (oldest first).  An entry with
 * waiters stays: it goes to the list's tail.  At most every active entry
 * once. */
int rate__ft_expire(rate_fair_t *f, uint64_t ep, uint64_t now)
{
    fhdr_t *h = f->h;
    if (h->epoch != ep) {
        uint64_t seq = LD(h->asked_seq);
        ST(h->seq_prev, h->epoch + 1 == ep ? h->seq_cur : seq);
        ST(h->seq_cur, seq);
        uint64_t start = (ep - 1) * f->period_ns;
        ST(h->epoch_start, start > now ? now : start); /* a clock gone back */
        ST(h->epoch, ep);
    }
    uint32_t n = LD(h->nactive);
    if (n > f->slots)
        return RATE_ECORRUPT;
    for (; n > 0; n--) {
        fslot_t *sl;
        int rc = link_at(f, LD(h->lhead), &sl);
        if (rc != RATE_OK)
            return rc;
        if (sl == NULL || sl->epoch + 1 >= ep)
            break;
        rc = LD(sl->qlen) > 0 ? rate__ft_list_to_tail(f, sl)
                              : deactivate(f, sl);
        if (rc != RATE_OK)
            return rc;
    }
    return RATE_OK;
}

/* Brings the entry to this period: what it asked rolls over, and a flow
 * coming back from idle restarts at V (no credit for the idle time). */
int rate__ft_touch(rate_fair_t *f, fslot_t *sl, uint64_t ep)
{
    if (sl->epoch == ep)
        return RATE_OK;
    rate__fair_flow_t fl = {sl->asked_cur, sl->asked_prev, sl->lsum,
                            sl->since};
    rate__fair_roll(&fl, sl->epoch, ep);
    sl->asked_cur = fl.cur;
    sl->asked_prev = fl.prev;
    sl->lsum = fl.lsum;
    sl->since = fl.since;
    ST(sl->epoch, ep);
    /* the list stays in the order of the last period asked */
    return LD(sl->apos) == NIL ? activate(f, sl) : rate__ft_list_to_tail(f, sl);
}

static void set_weight(rate_fair_t *f, fslot_t *sl, uint32_t weight)
{
    if (sl->weight == weight)
        return;
    if (sl->apos != NIL)
        f->h->total_w = f->h->total_w - sl->weight + weight;
    ST(sl->weight, weight);
}

/* The flow's entry: its own within PROBES of its home, else a free one
 * there, else its home entry shared (counted).  A free entry is one out
 * of the active set. */
fslot_t *rate__ft_find_slot(rate_fair_t *f, const char *flow, size_t len,
                            uint32_t weight)
{
    uint64_t h = XXH3_64bits_withSeed(flow, len, f->h->seed);
    if (h == 0)
        h = 1;
    uint32_t n = f->slots;
    uint32_t home = (uint32_t)(((h >> 32) * n) >> 32);
    fslot_t *free_sl = NULL;
    uint32_t probes = n < PROBES ? n : PROBES;
    for (uint32_t i = 0, k = home; i < probes; i++, k = k + 1 == n ? 0 : k + 1) {
        fslot_t *sl = &f->slot[k];
        if (sl->hash == h) {
            set_weight(f, sl, weight);
            return sl;
        }
        if (free_sl == NULL && sl->apos == NIL && sl->qlen == 0)
            free_sl = sl;
    }
    if (free_sl != NULL) {
        ST(free_sl->hash, h);
        free_sl->s = f->h->vtime;
        ST(free_sl->epoch, 0);
        free_sl->asked_cur = free_sl->asked_prev = 0;
        ST(free_sl->weight, weight);
        /* The former flow's cost not yet folded goes with its record
         * (it was idle two periods); the new generation, published after
         * the hash, turns away a cost still in flight for it. */
        __atomic_store_n(&free_sl->pend,
                         (PEND_GEN(LD(free_sl->pend)) + 1) << PEND_BITS,
                         __ATOMIC_RELEASE);
        free_sl->qhead = free_sl->qlen = 0;
        free_sl->qpermits = 0;
        free_sl->lgave = 0;
        free_sl->lsum = 0;
        free_sl->since = 0;
        return free_sl;
    }
    f->h->shared++;
    return &f->slot[home];
}
