/* SPDX-License-Identifier: MIT */
/*
 * The not-waiting decision on the fair table (decide.c), and the pieces
 * of it a waiter's admission reuses.
 */
#ifndef RATE_FAIR_DECIDE_H
#define RATE_FAIR_DECIDE_H

#include "table.h"

/* A request's input: RATE_EINVAL, RATE_EKEY or RATE_ERANGE for what is
 * wrong. */
int rate__ft_check_input(const rate_fair_t *f, const char *flow, size_t len,
                         uint32_t weight, uint64_t permits, uint64_t now);
/* The flow's entry (*out) brought to now, its request counted as asked
 * (lock held). */
int rate__ft_enter(rate_fair_t *f, const char *flow, size_t len,
                   uint32_t weight, uint64_t permits, uint64_t now,
                   fslot_t **out);
/* Decides a request of the entry (lock held); full: fill *out, else the
 * bool call's path. */
int rate__ft_decide(rate_fair_t *f, fslot_t *sl, uint64_t permits,
                    uint64_t now, bool full, rate_decision_t *out);
/* A not-waiting decision, the lock taken and released here. */
int rate__ft_check(rate_fair_t *f, const char *flow, size_t len,
                   uint32_t weight, uint64_t permits, uint64_t now,
                   bool full, rate_decision_t *out);
/* The bool call without the lock: 1 admitted, 0 denied, -1 when the lock
 * must be taken. */
int rate__ft_fast_try(rate_fair_t *f, const char *flow, size_t len,
                      uint32_t weight, uint64_t permits, uint64_t now);
/* The shared limit's full decision (lock held). */
int rate__ft_shared_check(rate_fair_t *f, uint64_t permits, uint64_t now,
                          rate_decision_t *out);
/* A waiter's admission held to the room the rule keeps (lock held). */
int rate__ft_keep_light_room(rate_fair_t *f, fslot_t *sl, uint64_t permits,
                             uint64_t now, rate_decision_t *out);
/* An admitted request whose table work failed: its permits given back,
 * rc the answer. */
int rate__ft_admitted_fail(rate_fair_t *f, uint64_t permits, uint64_t now,
                           int rc);

#endif
