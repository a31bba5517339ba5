/*
 * The store handle: a method table and the back end's own pointer.
 */
#include <stdlib.h>

#include "internal.h"

int rate_store_new(const rate_store_vtable_t *vt, void *self,
                   rate_store_t **out)
{
    rate_store_t *s;

    if (out == NULL)
        return RATE_EINVAL;
    *out = NULL;
    if (vt == NULL || vt->version < RATE_STORE_V1 || vt->destroy == NULL ||
        (vt->update == NULL && (vt->load == NULL || vt->cas == NULL)))
        return RATE_EINVAL; /* decide() alone is not enough: it may decline */
    s = malloc(sizeof *s);
    if (s == NULL)
        return RATE_ENOMEM;
    s->vt = vt;
    s->self = self;
    s->lanes = NULL;
    *out = s;
    return RATE_OK;
}

int rate_store_stats(rate_store_t *store, rate_stats_t *out)
{
    if (store == NULL || out == NULL)
        return RATE_EINVAL;
    memset(out, 0, sizeof *out);
    return store->vt->stats != NULL ? store->vt->stats(store->self, out)
                                    : RATE_OK;
}

void rate_store_free(rate_store_t *store)
{
    if (store == NULL)
        return;
    store->vt->destroy(store->self);
    free(store);
}
