/* SPDX-License-Identifier: MIT */
/*
 * Fair shares of a shared limit: the public calls (ratelimit_fair.h;
 * docs/fair.md has the design and its guarantees).
 *
 * Built only on the public limiter calls: the shared limit is one key of
 * the caller's limiter, asked with rate_limiter_check_at (or the bool
 * call; rate_limiter_check_policy_at under a configured policy) and given
 * back with rate_limiter_refund_at (_policy_at).  What is ours is the
 * table of flows: one flat block without pointers, so that the same code
 * runs on it in a process (calloc) and in a mapped file shared by
 * processes.  Every decision takes the table's one lock around the
 * limiter's call, so that the fair rule is decided on the state it read.
 *
 * The rooms: table.c (the table's layout, lock, making and repair),
 * index.c (its heaps and active list, each read checked), vtime.c
 * (virtual service and periods), rule.c (the fair rule's arithmetic,
 * shared with the fleet's table in step.c), decide.c (the not-waiting
 * decision), wait.c (queues and the blocking waiter), wait_async.c (the
 * waiter on an event loop), fleet.c (a store that decides fairly itself)
 * and this file: configuration, the handle's life, and the calls.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "decide.h"
#include "fleet.h"
#include "index.h"
#include "table.h"
#include "vtime.h"
#include "wait.h"
#include "wait_async.h"

#define SLOTS_DEFAULT 64u
#define QUEUE_DEFAULT 16u

static int config_check(const rate_fair_config_t *c, rate_fair_t **out,
                        char *err, size_t errlen)
{
    if (out != NULL)
        *out = NULL;
    if (c == NULL || out == NULL) {
        set_err(err, errlen, "%s", "no config or out (NULL)");
        return RATE_EINVAL;
    }
    for (size_t i = 0; i < sizeof c->reserved / sizeof c->reserved[0]; i++)
        if (c->reserved[i] != 0) {
            set_err(err, errlen, "%s",
                    "the config's reserved words are not zero (initialize "
                    "it with = {...} or memset)");
            return RATE_EINVAL;
        }
    if (c->limiter == NULL) {
        set_err(err, errlen, "%s", "no limiter (NULL): the shared limit's");
        return RATE_EINVAL;
    }
    if (c->key == NULL || c->key_len == 0 || c->key_len > RATE_KEY_MAX) {
        set_err(err, errlen, "%s",
                "the shared limit's key is NULL, empty or longer than "
                "RATE_KEY_MAX bytes");
        return RATE_EKEY;
    }
    /* The limiter would refuse it at every decision (ratelimit.h). */
    if (c->key_len >= RATE_KEY_RESERVED_LEN &&
        memcmp(c->key, RATE_KEY_RESERVED, RATE_KEY_RESERVED_LEN) == 0) {
        set_err(err, errlen, "%s",
                "the shared limit's key begins with RATE_KEY_RESERVED, "
                "the library's own (in-flight leases' state)");
        return RATE_EKEY;
    }
    if (c->clock != NULL && (c->clock->now_ns == NULL || c->clock->sleep_ns == NULL)) {
        set_err(err, errlen, "%s", "a clock without now_ns or sleep_ns");
        return RATE_EINVAL;
    }
    if (c->slots > RATE_FAIR_SLOTS_MAX) {
        set_err(err, errlen, "%s", "slots above RATE_FAIR_SLOTS_MAX (4096)");
        return RATE_EINVAL;
    }
    if (c->queue_max > RATE_FAIR_QUEUE_MAX) {
        set_err(err, errlen, "%s", "queue_max above RATE_FAIR_QUEUE_MAX (1024)");
        return RATE_EINVAL;
    }
    return RATE_OK;
}

/* A handle on no table yet: the limiter, key, clock and policy copied. */
static rate_fair_t *handle_new(const rate_fair_config_t *c)
{
    rate_fair_t *f = calloc(1, sizeof *f);
    if (f == NULL)
        return NULL;
    f->limiter = c->limiter;
    memcpy(f->key, c->key, c->key_len);
    f->key_len = c->key_len;
    if (c->clock != NULL) {
        f->clock = *c->clock;
        f->own_clock = true;
    }
    f->policy = c->policy;
    const rate_policy_t *p =
        c->policy != NULL ? c->policy : rate_limiter_policy(c->limiter);
    const rate_limit_t *l0 = rate_policy_limit(p, 0);
    f->period_ns = l0 != NULL && l0->period_ns > 0 ? l0->period_ns : RATE_NS_PER_S;
    f->rate_limit = l0 != NULL && l0->limit > 0 ? l0->limit : 1;
    f->shape = rate__fair_shape_of(l0 != NULL ? (int)l0->algorithm : 0,
                                   f->rate_limit, f->period_ns);
    f->fleet = rate__ft_fleet_of(c->limiter);
    f->lock_kind = rate__ft_lock_kind();
    return f;
}

int rate_fair_new(const rate_fair_config_t *c, rate_fair_t **out, char *err,
                  size_t errlen)
{
    int rc = config_check(c, out, err, errlen);
    if (rc != RATE_OK)
        return rc;
    unsigned slots = c->slots ? c->slots : SLOTS_DEFAULT;
    unsigned qmax = c->queue_max ? c->queue_max : QUEUE_DEFAULT;
    rate_fair_t *f = handle_new(c);
    if (f == NULL) {
        set_err(err, errlen, "%s", "out of memory");
        return RATE_ENOMEM;
    }
    if (c->shm_path != NULL) {
        rc = rate__ft_open(f, c->shm_path, slots, qmax, err, errlen);
    } else {
        f->size = rate__ft_size(slots, qmax);
        f->h = calloc(1, f->size);
        rc = f->h == NULL ? RATE_ENOMEM
                          : rate__ft_init(f->h, slots, qmax, f->size, false);
        if (rc != RATE_OK)
            set_err(err, errlen, "%s", "out of memory");
    }
    if (rc != RATE_OK) {
        if (!f->mapped)
            free(f->h);
        free(f);
        return rc;
    }
    rate__ft_bind(f, slots, qmax);
    *out = f;
    return RATE_OK;
}

size_t rate_fair_size(unsigned slots, unsigned queue_max)
{
    if (slots > RATE_FAIR_SLOTS_MAX || queue_max > RATE_FAIR_QUEUE_MAX)
        return 0;
    return rate__ft_size(slots ? slots : SLOTS_DEFAULT,
                         queue_max ? queue_max : QUEUE_DEFAULT);
}

int rate_fair_init_in(void *mem, size_t len, unsigned slots,
                      unsigned queue_max, char *err, size_t errlen)
{
    size_t need = rate_fair_size(slots, queue_max);
    if (mem == NULL || ((uintptr_t)mem & 63) != 0) {
        set_err(err, errlen, "%s", "the memory is NULL or not 64-byte aligned");
        return RATE_EINVAL;
    }
    if (need == 0 || len < need) {
        set_err(err, errlen, "%s",
                need == 0 ? "slots or queue_max above their maximum"
                          : "the memory is shorter than rate_fair_size()");
        return RATE_EINVAL;
    }
    fhdr_t *h = mem;
    memset(mem, 0, need);
    int rc = rate__ft_init(h, slots ? slots : SLOTS_DEFAULT,
                           queue_max ? queue_max : QUEUE_DEFAULT, need, true);
    if (rc != RATE_OK) {
        set_err(err, errlen, "%s", "its lock could not be made");
        return rc;
    }
    __atomic_store_n(&h->magic, FAIR_MAGIC, __ATOMIC_RELEASE);
    return RATE_OK;
}

int rate_fair_new_in(const rate_fair_config_t *c, void *mem, size_t len,
                     rate_fair_t **out, char *err, size_t errlen)
{
    int rc = config_check(c, out, err, errlen);
    if (rc != RATE_OK)
        return rc;
    size_t need = rate_fair_size(c->slots, c->queue_max);
    unsigned slots = c->slots ? c->slots : SLOTS_DEFAULT;
    unsigned qmax = c->queue_max ? c->queue_max : QUEUE_DEFAULT;
    if (c->shm_path != NULL || mem == NULL || ((uintptr_t)mem & 63) != 0 ||
        len < need) {
        set_err(err, errlen, "%s",
                c->shm_path != NULL ? "shm_path and memory of one's own: "
                                      "give one"
                                    : "the memory is NULL, not 64-byte "
                                      "aligned, or shorter than "
                                      "rate_fair_size()");
        return RATE_EINVAL;
    }
    rate_fair_t *f = handle_new(c);
    if (f == NULL) {
        set_err(err, errlen, "%s", "out of memory");
        return RATE_ENOMEM;
    }
    /* the header copied once (after its mark, which init_in writes
     * last): checked, then the handle made from the sizes checked */
    fhdr_t hd;
    char why[200], m[300];
    uint64_t magic = __atomic_load_n(&((const fhdr_t *)mem)->magic,
                                     __ATOMIC_ACQUIRE);
    memcpy(&hd, mem, sizeof hd);
    hd.magic = magic;
    if (rate__ft_header_check(&hd, len, false, slots, qmax, f->lock_kind, why,
                              sizeof why) != RATE_OK) {
        if ((magic & MAGIC_STEM) != (FAIR_MAGIC & MAGIC_STEM))
            snprintf(m, sizeof m, "%s", "the memory holds no fair table "
                                        "(rate_fair_init_in makes one)");
        else
            snprintf(m, sizeof m, "the memory's fair table: %s", why);
        set_err(err, errlen, "%s", m);
        free(f);
        return RATE_EINVAL;
    }
    f->h = mem;
    f->size = need;
    f->borrowed = true;
    rate__ft_bind(f, slots, qmax);
    *out = f;
    return RATE_OK;
}

void rate_fair_free(rate_fair_t *f)
{
    if (f == NULL)
        return;
    rate__ft_async_free(f);
    if (f->borrowed) {
        /* the table stays: it is the caller's, other processes' too */
    } else if (f->mapped) {
        munmap(f->h, f->size);
    } else {
        pthread_mutex_destroy(&f->h->mu);
        free(f->h);
    }
    free(f);
}

int rate_fair_check_at(rate_fair_t *f, const char *flow, size_t flow_len,
                       uint32_t weight, uint64_t permits, uint64_t now_ns,
                       rate_decision_t *out)
{
    if (out == NULL)
        return RATE_EINVAL;
    memset(out, 0, sizeof *out);
    int rc = rate__ft_check_input(f, flow, flow_len, weight, permits, now_ns);
    if (rc != RATE_OK)
        return rc;
    rc = rate__ft_fleet_check(f, flow, flow_len, weight, permits, now_ns,
                              false, out);
    if (rc == RATE_ENOTSUP)
        rc = rate__ft_check(f, flow, flow_len, weight, permits, now_ns, true,
                            out);
    if (rc != RATE_OK)
        memset(out, 0, sizeof *out);
    return rc;
}

int rate_fair_check(rate_fair_t *f, const char *flow, size_t flow_len,
                    uint32_t weight, uint64_t permits, rate_decision_t *out)
{
    if (f == NULL) {
        if (out != NULL)
            memset(out, 0, sizeof *out);
        return RATE_EINVAL;
    }
    if (f->fleet && !f->own_clock && out != NULL &&
        rate__ft_check_input(f, flow, flow_len, weight, permits, 0) ==
            RATE_OK) {
        int rc = rate__ft_fleet_check(f, flow, flow_len, weight, permits, 0,
                                      true, out);
        if (rc != RATE_ENOTSUP)
            return rc;
    }
    return rate_fair_check_at(f, flow, flow_len, weight, permits, now_of(f),
                              out);
}

bool rate_fair_try_acquire_at(rate_fair_t *f, const char *flow,
                              size_t flow_len, uint32_t weight,
                              uint64_t permits, uint64_t now_ns)
{
    if (rate__ft_check_input(f, flow, flow_len, weight, permits, now_ns) !=
        RATE_OK)
        return false;
    if (f->fleet) {
        rate_decision_t fd;
        int rc = rate__ft_fleet_check(f, flow, flow_len, weight, permits,
                                      now_ns, false, &fd);
        if (rc != RATE_ENOTSUP)
            return rc == RATE_OK && fd.allowed;
    }
    int fast = rate__ft_fast_try(f, flow, flow_len, weight, permits, now_ns);
    if (fast >= 0)
        return fast == 1;
    rate_decision_t d;
    d.allowed = false;
    return rate__ft_check(f, flow, flow_len, weight, permits, now_ns, false,
                          &d) ==
               RATE_OK &&
           d.allowed;
}

bool rate_fair_try_acquire(rate_fair_t *f, const char *flow, size_t flow_len,
                           uint32_t weight, uint64_t permits)
{
    if (f != NULL && f->fleet && !f->own_clock &&
        rate__ft_check_input(f, flow, flow_len, weight, permits, 0) ==
            RATE_OK) {
        rate_decision_t fd;
        int rc = rate__ft_fleet_check(f, flow, flow_len, weight, permits, 0,
                                      true, &fd);
        if (rc != RATE_ENOTSUP)
            return rc == RATE_OK && fd.allowed;
    }
    return f != NULL && rate_fair_try_acquire_at(f, flow, flow_len, weight,
                                                 permits, now_of(f));
}

int rate_fair_acquire(rate_fair_t *f, const char *flow, size_t flow_len,
                      uint32_t weight, uint64_t permits, uint64_t timeout_ns,
                      rate_decision_t *out)
{
    if (out == NULL)
        return RATE_EINVAL;
    memset(out, 0, sizeof *out);
    int rc = rate__ft_check_input(f, flow, flow_len, weight, permits, 0);
    if (rc == RATE_OK && timeout_ns > RATE_TIME_MAX)
        rc = RATE_ERANGE;
    if (rc != RATE_OK)
        return rc;
    rc = rate__ft_acquire(f, flow, flow_len, weight, permits, timeout_ns, out);
    if (rc != RATE_OK)
        memset(out, 0, sizeof *out);
    return rc;
}

int rate_fair_stats(rate_fair_t *f, rate_fair_stats_t *out)
{
    if (f == NULL || out == NULL)
        return RATE_EINVAL;
    memset(out, 0, sizeof *out);
    int rc = rate__ft_lock(f);
    if (rc != RATE_OK)
        return rc;
    /* the active entries at the fair clock's now, counted without
     * expiring any: a look changes nothing */
    uint64_t ep = rate__ft_epoch_at(f, now_of(f));
    lwalk_t w = lwalk_start(f);
    for (fslot_t *sl;
         (rc = rate__ft_lwalk_next(f, &w, &sl)) == RATE_OK && sl != NULL;)
        out->flows += sl->epoch + 1 >= ep || LD(sl->qlen) > 0;
    if (rc != RATE_OK) {
        rate__ft_unlock(f);
        memset(out, 0, sizeof *out);
        return rc;
    }
    out->slots = f->slots;
    out->shared = f->h->shared + atomic_load(&f->fleet_shared);
    out->fair_denied = f->h->fair_denied + atomic_load(&f->fleet_denied);
    out->waiting = f->h->waiting;
    out->queue_full = f->h->queue_full;
    out->timed_out = f->h->timed_out;
    rate__ft_unlock(f);
    return RATE_OK;
}

size_t rate_fair_memory(const rate_fair_t *f)
{
    return f == NULL ? 0 : sizeof *f + f->size;
}
