/* SPDX-License-Identifier: MIT */
/* A Redis node's breaker and backoff (node.h). */
#include "node.h"

rate__admit_t rate__breaker_admit(const rate__breaker_conf_t *cf,
                                  rate__breaker_t *b, uint64_t now)
{
    if (!cf->on)
        return RATE__ADMIT_GO;
    uint64_t until = atomic_load(&b->open_until_ns);
    if (until == 0)
        return RATE__ADMIT_GO;
    bool f = false;
    if (now < until || !atomic_compare_exchange_strong(&b->probing, &f, true))
        return RATE__ADMIT_REFUSE;
    return RATE__ADMIT_PROBE;
}

bool rate__breaker_outcome(const rate__breaker_conf_t *cf, rate__breaker_t *b,
                           bool probe, rate__outcome_t o, uint64_t now)
{
    if (!cf->on)
        return false;
    if (o == RATE__OUTCOME_NEUTRAL) {
        if (probe)
            atomic_store(&b->probing, false);
        return false;
    }
    if (o == RATE__OUTCOME_OK) {
        atomic_store(&b->fails, 0);
        if (probe) {
            atomic_store(&b->open_until_ns, 0);
            atomic_store(&b->probing, false);
        }
        return false;
    }
    if (probe) {
        atomic_store(&b->open_until_ns, now + cf->cooldown_ns);
        atomic_store(&b->probing, false);
        return true;
    }
    if (atomic_fetch_add(&b->fails, 1) + 1 >= cf->failures) {
        uint64_t zero = 0;
        bool opened = atomic_compare_exchange_strong(&b->open_until_ns, &zero,
                                                     now + cf->cooldown_ns);
        atomic_store(&b->fails, 0);
        return opened;
    }
    return false;
}

bool rate__breaker_is_open(const rate__breaker_conf_t *cf,
                           const rate__breaker_t *b)
{
    return cf->on && atomic_load(&b->open_until_ns) != 0;
}

void rate__backoff_failed(rate__backoff_t *b, uint64_t now)
{
    b->backoff_ns = b->backoff_ns == 0 ? RATE__REDIS_BACKOFF_MIN_NS
                    : b->backoff_ns > RATE__REDIS_BACKOFF_MAX_NS / 2
                        ? RATE__REDIS_BACKOFF_MAX_NS
                        : b->backoff_ns * 2;
    atomic_store(&b->retry_at_ns, now + b->backoff_ns);
}
