/* SPDX-License-Identifier: MIT */
/* Which way decisions and leases go (paths.h). */
#include "paths.h"

#include "ratelimit.h"

bool rate__redis_module_try(rate__redis_paths_t *p)
{
    if (p->module_mode == RATE_REDIS_MODULE_OFF)
        return false;
    if (atomic_load_explicit(&p->module_state, memory_order_relaxed) ==
        RATE__MODULE_ON)
        return true;
    /* Not known yet, or off: one decision asks (the first, then one per
     * pause), the others meanwhile go by the scripts. */
    uint64_t now = rate_clock_monotonic_ns();
    uint64_t at = atomic_load(&p->module_retry_at_ns);
    return now >= at &&
           atomic_compare_exchange_strong(&p->module_retry_at_ns, &at,
                                          now + RATE__MODULE_RETRY_NS);
}

void rate__redis_module_seen(rate__redis_paths_t *p, bool answered)
{
    if (answered) {
        if (atomic_load_explicit(&p->module_state, memory_order_relaxed) !=
            RATE__MODULE_ON)
            atomic_store(&p->module_state, RATE__MODULE_ON);
        return;
    }
    atomic_store(&p->module_retry_at_ns,
                 rate_clock_monotonic_ns() + RATE__MODULE_RETRY_NS);
    atomic_store(&p->module_state, RATE__MODULE_OFF);
}

bool rate__redis_fcall_on(rate__redis_paths_t *p)
{
    return atomic_load_explicit(&p->fcall, memory_order_relaxed);
}

void rate__redis_fcall_off(rate__redis_paths_t *p)
{
    atomic_store(&p->fcall, false);
}

bool rate__redis_generic_leases(const rate__redis_paths_t *p)
{
    return p->generic_leases;
}

bool rate__redis_lease_module_ok(rate__redis_paths_t *p)
{
    return !atomic_load_explicit(&p->lease_no_module, memory_order_relaxed);
}

void rate__redis_lease_module_gone(rate__redis_paths_t *p)
{
    atomic_store(&p->lease_no_module, true);
}
