/* SPDX-License-Identifier: MIT */
/*
 * The store handle: a back end's method table and its own pointer.
 */
#include <stdlib.h>

#include "internal.h"

int rate_store_new(const rate_store_methods_t *m, void *self,
                   rate_store_t **out)
{
    rate_store_t *s;

    if (out == NULL)
        return RATE_EINVAL;
    *out = NULL;
    if (m == NULL || m->version < 2 || m->version > RATE_STORE_VERSION ||
        m->destroy == NULL || m->remove == NULL ||
        (m->update == NULL && (m->load == NULL || m->cas == NULL)))
        return RATE_EINVAL; /* decide() alone is not enough: it may decline */
    s = malloc(sizeof *s);
    if (s == NULL)
        return RATE_ENOMEM;
    s->m = m;
    s->self = self;
    *out = s;
    return RATE_OK;
}

void *rate_store_backend(const rate_store_t *store,
                         const rate_store_methods_t *m)
{
    return store != NULL && store->m == m ? store->self : NULL;
}

const rate_store_methods_t *rate_store_methods(const rate_store_t *store)
{
    return store != NULL ? store->m : NULL;
}

int rate_store_step(const rate_store_t *store, const rate_key_t *key,
                    const rate_step_t *step)
{
    if (store == NULL || key == NULL || step == NULL || step->fn == NULL ||
        (unsigned)key->space >= RATE_SPACES)
        return RATE_EINVAL;
    /* What rate_key_t allows: a store may trust it (the memory store
     * keeps any length). */
    if (key->bytes == NULL || key->len == 0 || key->len > RATE_KEY_MAX)
        return RATE_EKEY;
    return rate__store_step(store, key, step, 64, NULL);
}

int rate_store_stats(rate_store_t *store, rate_stats_t *out)
{
    if (store == NULL || out == NULL)
        return RATE_EINVAL;
    memset(out, 0, sizeof *out);
    return store->m->stats != NULL ? store->m->stats(store->self, out)
                                   : RATE_OK;
}

int rate_store_check_policy(rate_store_t *store, const rate_policy_t *policy,
                            char *err, size_t errlen)
{
    if (store == NULL || policy == NULL)
        return RATE_EINVAL;
    /* A table of version 2 ends before check_policy. */
    if (store->m->version < 3 || store->m->check_policy == NULL ||
        policy->unlimited)
        return RATE_OK;
    return store->m->check_policy(store->self, policy,
                                  rate_policy_state_max(policy), err, errlen);
}

void rate_store_free(rate_store_t *store)
{
    if (store == NULL)
        return;
    store->m->destroy(store->self);
    free(store);
}

/* --------------------------------------------------------- the store's part */

#define STEP_BUF 512u

static void *grow_buf(uint8_t **heap, uint8_t *stack, size_t need)
{
    if (need <= STEP_BUF)
        return stack;
    uint8_t *p = realloc(*heap, need);
    if (p == NULL)
        return NULL;
    *heap = p;
    return p;
}

/* Load, step, compare-and-set; again on a conflict, up to max_retries. */
static int run_generic(const rate_store_t *s, const rate_key_t *key,
                       const rate_step_t *st, unsigned max_retries,
                       unsigned *retries)
{
    uint8_t old_stack[STEP_BUF], new_stack[STEP_BUF];
    uint8_t *old_heap = NULL, *new_heap = NULL, *old = old_stack;
    size_t cap = STEP_BUF;
    int rc = RATE_ECONFLICT;

    /* 64 bits: max_retries may be UINT_MAX, which an unsigned count
     * would never pass */
    for (uint64_t attempt = 0; attempt <= max_retries; attempt++) {
        rate_step_io_t io;
        uint64_t version = 0;
        size_t len = 0;

        memset(&io, 0, sizeof io);
        rc = s->m->load(s->self, key, old, cap, &len, &version);
        if (rc == RATE_EINVAL && len > cap) { /* state longer than buf */
            if ((old = grow_buf(&old_heap, old_stack, len)) == NULL) {
                rc = RATE_ENOMEM;
                break;
            }
            cap = len;
            attempt--;
            continue;
        }
        if (rc != RATE_OK)
            break;
        io.old_state = len > 0 ? old : NULL;
        io.old_len = len;
        io.new_cap = len + st->grow;
        io.new_state = grow_buf(&new_heap, new_stack, io.new_cap);
        if (io.new_state == NULL) {
            rc = RATE_ENOMEM;
            break;
        }
        if ((rc = st->fn(st->arg, &io)) != RATE_OK)
            break;
        if (io.write)
            rc = s->m->cas(s->self, key, version, io.new_state, io.new_len,
                           io.ttl_ns);
        if (rc != RATE_ECONFLICT)
            break;
        if (retries != NULL)
            (*retries)++;
    }
    free(old_heap);
    free(new_heap);
    return rc;
}

int rate__store_step(const rate_store_t *s, const rate_key_t *key,
                     const rate_step_t *st, unsigned max_retries,
                     unsigned *retries)
{
    if (s->m->update != NULL)
        return s->m->update(s->self, key, st);
    return run_generic(s, key, st, max_retries, retries);
}
