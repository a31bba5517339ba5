/* SPDX-License-Identifier: MIT */
/*
 * Waiting on the fair table (wait.c): the queues and the next waiter,
 * shared by the blocking waiter and the asynchronous one
 * (wait_async.c).  Every call but rate__ft_acquire is made with the
 * table's lock held.
 */
#ifndef RATE_FAIR_WAIT_H
#define RATE_FAIR_WAIT_H

#include "table.h"

/* A new waiter's ticket (never 0); a waiter appended to the entry's
 * queue (*out: its seat); the waiter of a ticket taken out (*dropped). */
uint64_t rate__ft_ticket_next(rate_fair_t *f);
int rate__ft_ring_push(rate_fair_t *f, fslot_t *sl, uint64_t ticket,
                       uint64_t permits, uint64_t deadline, fwait_t **out);
int rate__ft_ring_drop(rate_fair_t *f, fslot_t *sl, uint64_t ticket,
                       bool *dropped);
/* Drops the stale waiters at the head of the entry's queue. */
int rate__ft_queue_drop_stale(rate_fair_t *f, fslot_t *sl, uint64_t now);
/* The next waiter (NULL: none), and its wake-up when it is new. */
int rate__ft_next_waiter(rate_fair_t *f, uint64_t now, fwait_t **out);
int rate__ft_wake_next(rate_fair_t *f);
/* The shared limit asked for the next waiter: 1 answered (*rc, *out),
 * or 0 with *until moved to the limit's retry time. */
int rate__ft_ask_next(rate_fair_t *f, fslot_t *sl, uint64_t permits,
                      uint64_t now, uint64_t *until, int *rc,
                      rate_decision_t *out);
/* A denial's decision; a waiter whose lock was not taken; a waiter
 * answered too late (the lock released). */
void rate__ft_denied(rate_decision_t *out, uint64_t retry_ns);
int rate__ft_lock_failed(rate_fair_t *f, int rc, uint64_t deadline,
                         rate_decision_t *out);
int rate__ft_answer_late(rate_fair_t *f, int rc, rate_decision_t *out);
/* rate_fair_acquire's wait (its input checked). */
int rate__ft_acquire(rate_fair_t *f, const char *flow, size_t len,
                     uint32_t weight, uint64_t permits, uint64_t timeout,
                     rate_decision_t *out);

#endif
