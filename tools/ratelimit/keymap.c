/*
 * See keymap.h.  Open addressing over indices into the record array.
 */
#include "keymap.h"

#include <stdlib.h>
#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

static int grow(keymap_t *m)
{
    size_t ns = m->nslots ? m->nslots * 2 : 64;
    uint32_t *slots = calloc(ns, sizeof *slots);
    if (slots == NULL)
        return -1;
    for (size_t i = 0; i < m->n; i++) {
        size_t j = XXH3_64bits(m->recs[i].key, m->recs[i].len) & (ns - 1);
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
    size_t j = XXH3_64bits(key, len) & (m->nslots - 1);
    while (m->slots[j] != 0) {
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
    m->slots[j] = (uint32_t)(++m->n);
    return r;
}

void keymap_free(keymap_t *m)
{
    for (size_t i = 0; i < m->n; i++) {
        free(m->recs[i].key);
        free(m->recs[i].times);
    }
    free(m->recs);
    free(m->slots);
    memset(m, 0, sizeof *m);
}
