/* SPDX-License-Identifier: MIT */
/*
 * A small map from keys (byte strings) to a per-key record, iterated in the
 * order keys were first seen.  For the command's summaries; not for the
 * library's hot path.  Open addressing with a seeded hash (XXH3 with a
 * random seed per map), so that the keys of a trace cannot be chosen to
 * collide.
 */
#ifndef RATE_KEYMAP_H
#define RATE_KEYMAP_H

#include <stddef.h>
#include <stdint.h>

typedef struct keyrec {
    char *key;
    size_t len;
    size_t order;            /* first seen as the order-th key (from 0) */
    uint64_t allowed, denied;
    uint64_t first_deny_ns;  /* replay --per-key: the first denial's time */
    char *first_deny_text;   /* and its text as written (malloc'd) */
    size_t first_deny_len;
    uint64_t *series;        /* compare --svg: the key's chart entries */
    size_t nseries, series_cap;
    uint64_t *times; /* compare: admitted times */
    size_t head, ntimes, cap; /* queue times[head..ntimes) */
} keyrec_t;

typedef struct keymap {
    keyrec_t *recs;   /* in first-seen order */
    size_t n, cap;
    uint32_t *slots;  /* index + 1 into recs; 0 empty */
    size_t nslots;
    uint64_t seed;    /* of the hash, random per map (getrandom): keys
                         crafted to collide cannot make it quadratic */
    uint64_t probes;  /* slots looked at, for the tests */
} keymap_t;

/* The record of key, made on first sight; NULL when out of memory. */
keyrec_t *keymap_get(keymap_t *m, const char *key, size_t len);
void keymap_free(keymap_t *m);

#endif
