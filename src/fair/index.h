/* SPDX-License-Identifier: MIT */
/*
 * The fair table's indexes (index.c): two binary min-heaps of entry
 * numbers, the active entries by virtual service and the queues by their
 * head's finish time, and the active list; each read checked.
 */
#ifndef RATE_FAIR_INDEX_H
#define RATE_FAIR_INDEX_H

#include "table.h"

/* Two binary min-heaps of entry numbers, each entry knowing its place
 * (apos, wpos: 1-based, 0 when out): the active entries by virtual
 * service (the top's is V) and the queues by their head's finish time
 * (the top's head is the next waiter).  O(log n) a change.  A size, an
 * element and a place are each checked as read (heap_len, heap_at,
 * heap_pos); the sifts end by themselves (a place only moves up, or
 * only down). */
typedef struct heap {
    uint32_t *a;
    uint32_t *n;
    bool by_tag;
} heap_t;

static inline heap_t aheap(rate_fair_t *f)
{
    return (heap_t){f->aheap, &f->h->nactive, false};
}

static inline heap_t wheap(rate_fair_t *f)
{
    return (heap_t){f->wheap, &f->h->nqueues, true};
}

/* A walk of the active list from its head: at most `slots` steps. */
typedef struct lwalk {
    uint32_t link, steps;
} lwalk_t;

static inline lwalk_t lwalk_start(const rate_fair_t *f)
{
    return (lwalk_t){LD(f->h->lhead), 0};
}

/* Adds the entry (not in the heap); takes it out; moves it to its place
 * after its key changed; the heap's top entry (NULL: empty). */
int rate__ft_heap_push(rate_fair_t *f, const heap_t *hp, fslot_t *sl);
int rate__ft_heap_remove(rate_fair_t *f, const heap_t *hp, fslot_t *sl);
int rate__ft_heap_update(rate_fair_t *f, const heap_t *hp, fslot_t *sl);
int rate__ft_heap_top(const rate_fair_t *f, const heap_t *hp, fslot_t **out);
/* The active heap after an entry's s grew (down only), then V. */
int rate__ft_aheap_down(rate_fair_t *f, fslot_t *sl);
/* V from the active heap's top; it never decreases. */
int rate__ft_vtime_update(rate_fair_t *f);
/* The active list: an entry taken off, put at the tail, moved there. */
int rate__ft_list_unlink(rate_fair_t *f, fslot_t *sl);
int rate__ft_list_append(rate_fair_t *f, fslot_t *sl);
int rate__ft_list_to_tail(rate_fair_t *f, fslot_t *sl);
/* A walk's next entry (*sl NULL at the list's end). */
int rate__ft_lwalk_next(const rate_fair_t *f, lwalk_t *w, fslot_t **sl);

#endif
