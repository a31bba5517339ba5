/* SPDX-License-Identifier: MIT */
/*
 * http.h -- private to the HTTP layer (fields.c, rules.c): built on the
 * public headers only, like any program using the library.
 */
#ifndef RATE_HTTP_PRIVATE_H
#define RATE_HTTP_PRIVATE_H

#include "ratelimit.h"
#include "ratelimit_http.h"

/* One item of the RateLimit fields: a policy's name, the limit its
 * decision names (NULL: none to describe), the decision, and permits
 * given back after it (a rules request another policy denied). */
typedef struct rate__hitem {
    const char *name;
    bool unlimited;
    const rate_limit_t *limit;
    const rate_decision_t *d;
    uint64_t room;
    uint64_t concurrency; /* an in-flight limit's N for the request (then
                             limit is NULL): q=N, no w */
} rate__hitem_t;
int rate__headers_items(const rate__hitem_t *items, size_t n,
                        rate_headers_t *out);

/* The limit a decision under `policy` names (its component), NULL for the
 * unlimited policy. */
const rate_limit_t *rate__http_limit_of(const rate_policy_t *policy,
                                        const rate_decision_t *d);

/* Generations of a rules object not yet freed (the current one
 * included): for the tests' count. */
size_t rate__rules_live(rate_rules_t *rules);

#endif
