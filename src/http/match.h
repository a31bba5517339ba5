/* SPDX-License-Identifier: MIT */
/*
 * match.h -- private to the HTTP layer (rules.c): a rule's match lines,
 * and the index that finds a group's first matching rule without trying
 * every rule of the group (match.c; docs/api-server.md, "The rules
 * file").
 */
#ifndef RATE_HTTP_MATCH_H
#define RATE_HTTP_MATCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ratelimit_http.h"

/* One condition of a match line: ATTR=VALUE, or ATTR=VALUE* (prefix). */
typedef struct rate__cond {
    char *attr;
    char *value; /* without the '*' of a prefix */
    bool prefix; /* VALUE*: any value starting so ("*" alone: any value) */
} rate__cond_t;

/* One match line: all its conditions hold. */
typedef struct rate__alt {
    rate__cond_t *cond;
    size_t count;
} rate__alt_t;

/* A rule's match lines, as the index reads them (nalt 0: every request). */
typedef struct rate__match_rule {
    const rate__alt_t *alt;
    size_t nalt;
} rate__match_rule_t;

/* One match line the index may try: of the rule at position pos of its
 * group (alt NULL: a rule without match lines). */
typedef struct rate__match_cand {
    size_t pos;
    const rate__alt_t *alt;
    const char *value; /* its exact value of the indexed attribute */
} rate__match_cand_t;

/* A group's rules, indexed by one attribute: the one most of its
 * conditions test for an exact value (api_key=..., say).  A request's
 * value of it picks the few lines that can match; the lines without an
 * exact condition on it are tried beside them, in file order. */
typedef struct rate__match_ix {
    const char *attr;          /* borrowed from a condition; NULL: none */
    rate__match_cand_t *cand;  /* by value, then position */
    struct rate__match_run {   /* a value's cand[start, end); end 0: empty */
        size_t start, end;
    } *slot;
    size_t cap;                /* slots: a power of two, or 0 */
    rate__match_cand_t *scan;  /* the other lines, by position */
    size_t nscan;
} rate__match_ix_t;

/* FNV-1a of s[0..n): the layer's one string hash. */
static inline size_t rate__str_hash(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603u;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)s[i]) * 1099511628211u;
    return (size_t)(h ^ (h >> 29));
}

/* The value of the first attribute called name ("" for a NULL value), or
 * NULL when the request has none. */
const char *rate__attr_value(const rate_attr_t *attrs, size_t n,
                             const char *name);

/* Whether every condition of the line holds for the request. */
bool rate__alt_matches(const rate__alt_t *a, const rate_attr_t *attrs,
                       size_t n);

/* Indexes a group's n rules (in the group's order) into *ix, which
 * borrows their lines and must be freed before them.  False: no memory
 * (*ix then holds nothing to free). */
bool rate__match_build(rate__match_ix_t *ix, const rate__match_rule_t *rules,
                       size_t n);

/* The position of the group's first rule that matches the request, or
 * SIZE_MAX: what trying each rule in order would find. */
size_t rate__match_first(const rate__match_ix_t *ix, const rate_attr_t *attrs,
                         size_t n);

void rate__match_free(rate__match_ix_t *ix);

#endif
