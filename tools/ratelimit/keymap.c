/* SPDX-License-Identifier: MIT */
/*
 * See keymap.h.  Open addressing over indices into the record array.
 */
#include "keymap.h"

#include <stdlib.h>
#include <string.h>

#include <sys/random.h>
#include <time.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

static size_t hash(const keymap_t *m, const char *key, size_t len)
{
    return (size_t)XXH3_64bits_withSeed(key, len, m->seed);
}

static uint64_t random_seed(const void *salt)
{
    uint64_t seed;
    if (getrandom(&seed, sizeof seed, GRND_NONBLOCK) == (ssize_t)sizeof seed)
        return seed;
    /* No entropy yet (early boot): the clock and an address, still not
     * something a trace can be made for. */
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return XXH3_64bits_withSeed(&ts, sizeof ts, (uint64_t)(uintptr_t)salt);
}

static int grow(keymap_t *m)
{
    size_t ns = m->nslots ? m->nslots * 2 : 64;
    uint32_t *slots = calloc(ns, sizeof *slots);
    if (slots == NULL)
        return -1;
    if (m->nslots == 0 && m->seed == 0)
        m->seed = random_seed(m);
    for (size_t i = 0; i < m->n; i++) {
        size_t j = hash(m, m->recs[i].key, m->recs[i].len) & (ns - 1);
        while (slots[j] != 0)
            j = (j + 1) & (ns - 1);
        slots[j] = (uint32_t)(i + 1);
    }
    free(m->slots);
    m->slots = slots;
    m->nslots = ns;
    return 0;
}

keyrec_t *keymap_get(keymap_t *m, const char *key, size_t len)
{
    if ((m->n + 1) * 2 > m->nslots && grow(m) != 0)
        return NULL;
    size_t j = hash(m, key, len) & (m->nslots - 1);
    while (m->slots[j] != 0) {
        m->probes++;
        keyrec_t *r = &m->recs[m->slots[j] - 1];
        if (r->len == len && memcmp(r->key, key, len) == 0)
            return r;
        j = (j + 1) & (m->nslots - 1);
    }
    if (m->n == m->cap) {
        size_t cap = m->cap ? m->cap * 2 : 64;
        keyrec_t *recs = realloc(m->recs, cap * sizeof *recs);
        if (recs == NULL)
            return NULL;
        m->recs = recs;
        m->cap = cap;
    }
    keyrec_t *r = &m->recs[m->n];
    memset(r, 0, sizeof *r);
    r->key = malloc(len ? len : 1);
    if (r->key == NULL)
        return NULL;
    memcpy(r->key, key, len);
    r->len = len;
    r->order = m->n;
    m->slots[j] = (uint32_t)(++m->n);
    return r;
}

void keymap_free(keymap_t *m)
{
    for (size_t i = 0; i < m->n; i++) {
        free(m->recs[i].key);
        free(m->recs[i].times);
        free(m->recs[i].first_deny_text);
        free(m->recs[i].series);
    }
    free(m->recs);
    free(m->slots);
    memset(m, 0, sizeof *m);
}
