/* SPDX-License-Identifier: MIT */
/*
 * The fair table's indexes over its entries (index.h): the heap of active
 * entries by virtual service, whose top gives V, the heap of queues by
 * their head's finish time, whose top is the next waiter, and the active
 * list in the order of the period each entry last asked in.  Every size,
 * element, place and link is read once and checked as read (a damaged
 * table is RATE_ECORRUPT, never a step outside it), and every walk is
 * bounded by the table's size.
 */
#include "index.h"

static uint64_t hkey(const heap_t *hp, const fslot_t *sl)
{
    return hp->by_tag ? sl->ftag : sl->s;
}

static void hset(rate_fair_t *f, const heap_t *hp, uint32_t i, uint32_t e)
{
    hp->a[i] = e;
    if (hp->by_tag)
        f->slot[e].wpos = i + 1;
    else
        f->slot[e].apos = i + 1;
}

/* The heap's size: RATE_ECORRUPT past the table. */
static int heap_len(const rate_fair_t *f, const heap_t *hp, uint32_t *n)
{
    *n = LD(*hp->n);
    return *n <= f->slots ? RATE_OK : RATE_ECORRUPT;
}

/* The element at place i (below the size): its entry (number in *e), or
 * NULL past the table. */
static fslot_t *heap_at(const rate_fair_t *f, const heap_t *hp, uint32_t i,
                        uint32_t *e)
{
    *e = LD(hp->a[i]);
    return entry_at(f, *e);
}

/* The entry's place in the heap of n: RATE_ECORRUPT unless its position
 * is in the heap and the heap has it there. */
static int heap_pos(const rate_fair_t *f, const heap_t *hp,
                    const fslot_t *sl, uint32_t n, uint32_t *i)
{
    uint32_t pos = hp->by_tag ? LD(sl->wpos) : LD(sl->apos);
    if (pos == NIL || pos > n || LD(hp->a[pos - 1]) != idx_of(f, sl))
        return RATE_ECORRUPT;
    *i = pos - 1;
    return RATE_OK;
}

/* Entry e, at hole i of the heap of n, moved down to its place. */
static int heap_down(rate_fair_t *f, const heap_t *hp, uint32_t n,
                     uint32_t i, uint32_t e)
{
    uint64_t k = hkey(hp, &f->slot[e]);
    for (;;) {
        uint32_t c = 2 * i + 1, ce, de;
        if (c >= n)
            break;
        const fslot_t *cs = heap_at(f, hp, c, &ce), *ds;
        if (cs == NULL)
            return RATE_ECORRUPT;
        if (c + 1 < n) {
            if ((ds = heap_at(f, hp, c + 1, &de)) == NULL)
                return RATE_ECORRUPT;
            if (hkey(hp, ds) < hkey(hp, cs)) {
                c++;
                ce = de;
                cs = ds;
            }
        }
        if (hkey(hp, cs) >= k)
            break;
        hset(f, hp, i, ce);
        i = c;
    }
    hset(f, hp, i, e);
    return RATE_OK;
}

/* Entry e, at hole i of the heap of n, moved up or down to its place. */
static int heap_sift(rate_fair_t *f, const heap_t *hp, uint32_t n,
                     uint32_t i, uint32_t e)
{
    uint64_t k = hkey(hp, &f->slot[e]);
    while (i > 0) {
        uint32_t p = (i - 1) / 2, pe;
        const fslot_t *ps = heap_at(f, hp, p, &pe);
        if (ps == NULL)
            return RATE_ECORRUPT;
        if (hkey(hp, ps) <= k)
            break;
        hset(f, hp, i, pe);
        i = p;
    }
    return heap_down(f, hp, n, i, e);
}

/* Adds the entry (not in the heap): a heap already of the table's size
 * is damaged. */
int rate__ft_heap_push(rate_fair_t *f, const heap_t *hp, fslot_t *sl)
{
    uint32_t n;
    if (heap_len(f, hp, &n) != RATE_OK || n == f->slots)
        return RATE_ECORRUPT;
    *hp->n = n + 1;
    return heap_sift(f, hp, n + 1, n, idx_of(f, sl));
}

int rate__ft_heap_remove(rate_fair_t *f, const heap_t *hp, fslot_t *sl)
{
    uint32_t n, i, last_e = 0;
    int rc = heap_len(f, hp, &n);
    if (rc == RATE_OK)
        rc = heap_pos(f, hp, sl, n, &i);
    if (rc == RATE_OK && i != n - 1 && heap_at(f, hp, n - 1, &last_e) == NULL)
        rc = RATE_ECORRUPT;
    if (rc != RATE_OK)
        return rc;
    *hp->n = n - 1;
    if (hp->by_tag)
        sl->wpos = NIL;
    else
        sl->apos = NIL;
    return i == n - 1 ? RATE_OK : heap_sift(f, hp, n - 1, i, last_e);
}

/* The entry (in the heap) moved to its place after its key changed. */
int rate__ft_heap_update(rate_fair_t *f, const heap_t *hp, fslot_t *sl)
{
    uint32_t n, i;
    int rc = heap_len(f, hp, &n);
    if (rc == RATE_OK)
        rc = heap_pos(f, hp, sl, n, &i);
    return rc != RATE_OK ? rc : heap_sift(f, hp, n, i, idx_of(f, sl));
}

/* The heap's top entry, NULL when it is empty. */
int rate__ft_heap_top(const rate_fair_t *f, const heap_t *hp, fslot_t **out)
{
    uint32_t n, e;
    *out = NULL;
    if (heap_len(f, hp, &n) != RATE_OK)
        return RATE_ECORRUPT;
    if (n > 0 && (*out = heap_at(f, hp, 0, &e)) == NULL)
        return RATE_ECORRUPT;
    return RATE_OK;
}

/* V follows the active heap's top; it never decreases. */
int rate__ft_vtime_update(rate_fair_t *f)
{
    const heap_t hp = aheap(f);
    fslot_t *top;
    int rc = rate__ft_heap_top(f, &hp, &top);
    if (rc == RATE_OK && top != NULL && top->s > f->h->vtime)
        f->h->vtime = top->s;
    return rc;
}

/* Takes the entry off the active list: RATE_ECORRUPT, with nothing
 * written, unless both its neighbours are in the table and link back to
 * it. */
int rate__ft_list_unlink(rate_fair_t *f, fslot_t *sl)
{
    fhdr_t *h = f->h;
    uint32_t me = idx_of(f, sl) + 1, prev = LD(sl->lprev),
             next = LD(sl->lnext);
    fslot_t *p, *n;
    if (link_at(f, prev, &p) != RATE_OK || link_at(f, next, &n) != RATE_OK)
        return RATE_ECORRUPT;
    uint32_t *to_me = p != NULL ? &p->lnext : &h->lhead;
    uint32_t *from_me = n != NULL ? &n->lprev : &h->ltail;
    if (LD(*to_me) != me || LD(*from_me) != me)
        return RATE_ECORRUPT;
    *to_me = next;
    *from_me = prev;
    sl->lprev = sl->lnext = NIL;
    return RATE_OK;
}

/* Puts the entry (not on the list) at its tail: RATE_ECORRUPT, with
 * nothing written, unless the tail is in the table and ends the list. */
int rate__ft_list_append(rate_fair_t *f, fslot_t *sl)
{
    fhdr_t *h = f->h;
    uint32_t me = idx_of(f, sl) + 1, tail = LD(h->ltail);
    fslot_t *t;
    if (link_at(f, tail, &t) != RATE_OK)
        return RATE_ECORRUPT;
    uint32_t *end = t != NULL ? &t->lnext : &h->lhead;
    if (LD(*end) != NIL)
        return RATE_ECORRUPT;
    sl->lnext = NIL;
    sl->lprev = tail;
    *end = me;
    h->ltail = me;
    return RATE_OK;
}

int rate__ft_list_to_tail(rate_fair_t *f, fslot_t *sl)
{
    int rc = rate__ft_list_unlink(f, sl);
    return rc != RATE_OK ? rc : rate__ft_list_append(f, sl);
}

/* The walk's next entry (*sl NULL at the list's end): RATE_ECORRUPT for
 * a link past the table, or a walk longer than the table (a cycle). */
int rate__ft_lwalk_next(const rate_fair_t *f, lwalk_t *w, fslot_t **sl)
{
    if (w->link != NIL && w->steps++ == f->slots)
        return RATE_ECORRUPT;
    int rc = link_at(f, w->link, sl);
    if (rc == RATE_OK && *sl != NULL)
        w->link = LD((*sl)->lnext);
    return rc;
}

/* The active heap after an entry's s grew: down only (the hot path's
 * one heap step; nothing to do for a leaf), then V from its top. */
int rate__ft_aheap_down(rate_fair_t *f, fslot_t *sl)
{
    const heap_t hp = aheap(f);
    uint32_t n, i, e;
    int rc = heap_len(f, &hp, &n);
    if (rc == RATE_OK)
        rc = heap_pos(f, &hp, sl, n, &i);
    if (rc == RATE_OK)
        rc = heap_down(f, &hp, n, i, idx_of(f, sl));
    if (rc != RATE_OK)
        return rc;
    const fslot_t *top = heap_at(f, &hp, 0, &e);
    if (top == NULL)
        return RATE_ECORRUPT;
    if (top->s > f->h->vtime)
        f->h->vtime = top->s;
    return RATE_OK;
}
