/* SPDX-License-Identifier: MIT */
/*
 * The fleet's path (fleet.c): a limiter whose store decides fairly
 * itself.
 */
#ifndef RATE_FAIR_FLEET_H
#define RATE_FAIR_FLEET_H

#include "table.h"

/* Whether the limiter's store makes fair decisions itself. */
bool rate__ft_fleet_of(rate_limiter_t *limiter);
/* A not-waiting decision by the store's fair(), at now (clock_time: the
 * limiter's clock); RATE_ENOTSUP when there is none or it declines. */
int rate__ft_fleet_check(rate_fair_t *f, const char *flow, size_t len,
                         uint32_t weight, uint64_t permits, uint64_t now,
                         bool clock_time, rate_decision_t *out);

#endif
