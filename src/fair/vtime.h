/* SPDX-License-Identifier: MIT */
/*
 * Virtual time on the fair table (vtime.c): entries found, service
 * charged, periods rolled.  Every call is made with the table's lock held.
 */
#ifndef RATE_FAIR_VTIME_H
#define RATE_FAIR_VTIME_H

#include "table.h"

/* A cost added to s keeps s at most LEAD_MAX ahead of V, and V at
 * most LEAD_MAX (rebased past it): every s, and a finish time (s plus a
 * cost of at most 2^62), then stays below 2^64 however long the run.  A
 * flow 2^41 permits ahead of the slowest is as far ahead as any. */
#define LEAD_MAX (UINT64_C(1) << 61)

/* The period of `now` (plus 1). */
uint64_t rate__ft_epoch_at(rate_fair_t *f, uint64_t now);
/* The flow's entry: its own near its home, else a free one, else its
 * home shared. */
fslot_t *rate__ft_find_slot(rate_fair_t *f, const char *flow, size_t len,
                            uint32_t weight);
/* Brings the table, then the entry, to period ep. */
int rate__ft_expire(rate_fair_t *f, uint64_t ep, uint64_t now);
int rate__ft_touch(rate_fair_t *f, fslot_t *sl, uint64_t ep);
/* Charges admitted permits to the entry's service; folds in the cost
 * fast_try admitted for it since. */
int rate__ft_charge(rate_fair_t *f, fslot_t *sl, uint64_t permits);
int rate__ft_fold(rate_fair_t *f, fslot_t *sl);
/* The queue's head's finish time and its place in the heap of queues. */
int rate__ft_retag(rate_fair_t *f, fslot_t *sl);

#endif
