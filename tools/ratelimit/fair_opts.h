/* SPDX-License-Identifier: MIT */
/*
 * --fair KEY and --weight FLOW=W of replay and compare: a trace through
 * one shared limit divided fairly among its keys (docs/fair.md).
 */
#ifndef RATE_CLI_FAIR_OPTS_H
#define RATE_CLI_FAIR_OPTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <ratelimit_fair.h>

#define FAIR_WEIGHTS_MAX 256

typedef struct fair_opts {
    const char *key; /* --fair KEY: the shared limit's key; NULL: off */
    size_t n;        /* --weight FLOW=W, in the order given */
    const char *flow[FAIR_WEIGHTS_MAX];
    size_t flow_len[FAIR_WEIGHTS_MAX];
    uint32_t weight[FAIR_WEIGHTS_MAX];
} fair_opts_t;

/* --weight FLOW=W: the flow's weight (1..RATE_FAIR_WEIGHT_MAX; the last
 * '=' splits, so a flow may hold '=').  Returns 0, or 2 after printing
 * "CMD: --weight 'TEXT': why". */
int fair_opt_weight(fair_opts_t *o, const char *cmd, const char *text);

/* Checks the options together: --weight needs --fair, a key 1..
 * RATE_KEY_MAX bytes.  Returns 0, or 2 after printing why. */
int fair_opts_check(const fair_opts_t *o, const char *cmd);

/* The flow's weight: its --weight, else 1. */
uint32_t fair_weight_of(const fair_opts_t *o, const char *flow, size_t len);

/* A fair limit over the limiter on --fair's key (memory table).  Returns 0,
 * or 2 after printing why. */
int fair_open(const fair_opts_t *o, const char *cmd, rate_limiter_t *lim,
              rate_fair_t **out);

#endif
