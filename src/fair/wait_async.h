/* SPDX-License-Identifier: MIT */
/*
 * The asynchronous waiters (wait_async.c), as the other rooms see them.
 */
#ifndef RATE_FAIR_WAIT_ASYNC_H
#define RATE_FAIR_WAIT_ASYNC_H

#include "table.h"

/* A waker's call (lock held) for a seat naming `name`: false when that is
 * no record of this fair limit. */
bool rate__ft_async_wake(rate_fair_t *f, uint64_t name);
/* rate_fair_free's part: every pending waiter answered RATE_ECANCELED,
 * the records and the handle's eventfd freed. */
void rate__ft_async_free(rate_fair_t *f);

#endif
