/* SPDX-License-Identifier: MIT */
/*
 * call.h -- the call scope (src/limiter.c): the one deadline a call's
 * store requests share.  Read by the core and by the stores that wait on a
 * network (DynamoDB, Redis).  Never installed.
 */
#ifndef RATE_CALL_H
#define RATE_CALL_H

#include <stdint.h>

#include "kit.h"

/* One deadline per call (docs/redis.md, "Timeouts"): a decision, refund
 * or penalty, or a synced decision, opens a scope on its thread; every
 * request a store makes inside it counts its timeout from the scope's
 * start (rate__call_start_ns), so that the call's requests, retries and
 * reconnects share one deadline instead of getting one each.  Scopes
 * nest: an inner one keeps the outer one's start.  The start is taken at
 * the first request that asks for it (a memory store never reads the
 * clock for it), or earlier by calling rate__call_start_ns (a synced
 * decision does when it begins to wait for another thread's borrow). */
uint64_t rate__call_begin(void);    /* opens one: the token for _end */
void rate__call_end(uint64_t token); /* closes it */
/* The start a request counts its timeout from: its call's start (taken
 * now if not yet), or now outside any call (a store used directly, a
 * drop, a creation). */
uint64_t rate__call_start_ns(void);

/* The deadline of a request with timeout_ns: its call's start plus it. */
static inline uint64_t rate__call_deadline_ns(uint64_t timeout_ns)
{
    return rate__sat_add(rate__call_start_ns(), timeout_ns);
}

#endif /* RATE_CALL_H */
