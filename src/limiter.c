/*
 * The limiter: the strategy front over a store.
 *
 * A decision is: validate the input, pick the key's policy (the resolver or
 * the default), read the clock once (unless the caller gave the time), and
 * hand the pure step of src/step.c to the store, on its atomic fast path
 * when it has one, else in a bounded compare-and-set loop.  The limiter
 * itself holds no lock on that path.
 *
 * The bool API (rate_try_acquire and its _at and _len forms) goes through the
 * limiter's lane (rate__lane_t in internal.h): each call jumps to the
 * lane's function for it.  With no resolver, a policy of one fixed-size
 * limit and the memory store, that is the store's: it reads the clock,
 * checks the input, decides a key it already holds in place and returns
 * the verdict, with no decision record to fill; anything else comes back
 * to the general path here.
 *
 * Every policy the limiter has used is remembered by fingerprint, so that a
 * key whose state was made under an earlier policy (a tier upgrade) can be
 * read under that policy and carried over.  The registry is touched only
 * the first time a policy object is seen, and on such a carry-over.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

#include "internal.h"

#define DEFAULT_RETRIES 64u
#define GENERIC_BUF 512u

struct rate_limiter {
    rate__lane_t lane; /* first: the bool API's path (internal.h) */
    rate_policy_t *policy; /* owned copy of the default */
    rate_store_t *store;
    bool own_store;
    rate_store_t *fallback; /* RATE_FAIL_FALLBACK: the insurance store */
    rate_resolve_fn resolve;
    void *resolve_ud;
    rate_clock_t clock;
    bool shadow;
    rate_fail_mode_t fail_mode;
    unsigned max_retries;

    uint64_t id; /* never reused, unlike the address (see reg_note) */
    pthread_mutex_t reg_lock;
    rate_policy_t *reg; /* copies of every policy used */
    size_t reg_len, reg_cap;

    /* Counted here only off the store's fast path (a store that runs the
     * step itself counts its own allowed/denied). */
    atomic_uint_fast64_t allowed, denied, retries, store_errors;
};

static bool try_general(const rate__lane_t *lane, const char *key, size_t len,
                        uint64_t permits, uint64_t now, unsigned how);
static bool general_lane(const rate__lane_t *lane, const char *key,
                         size_t len, uint64_t permits, uint64_t now,
                         unsigned how);

/* ---------------------------------------------------------------- clock */

uint64_t rate_clock_monotonic_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * RATE_NS_PER_S + (uint64_t)ts.tv_nsec;
}

static uint64_t mono_now(void *ud)
{
    (void)ud;
    return rate_clock_monotonic_ns();
}

/* The limiter's clock; the default one read without the indirect call. */
static inline uint64_t clock_now(const rate_limiter_t *lim)
{
    if (lim->clock.now_ns == mono_now)
        return rate_clock_monotonic_ns();
    return lim->clock.now_ns(lim->clock.ud);
}

static void mono_sleep(void *ud, uint64_t ns)
{
    struct timespec req, rem;

    (void)ud;
    req.tv_sec = (time_t)(ns / RATE_NS_PER_S);
    req.tv_nsec = (long)(ns % RATE_NS_PER_S);
    while (clock_nanosleep(CLOCK_MONOTONIC, 0, &req, &rem) == EINTR)
        req = rem;
}

/* ------------------------------------------------------------- registry */

static int reg_add(rate_limiter_t *lim, const rate_policy_t *p)
{
    int rc = RATE_OK;

    pthread_mutex_lock(&lim->reg_lock);
    size_t i;
    for (i = 0; i < lim->reg_len; i++)
        if (lim->reg[i].fingerprint == p->fingerprint)
            break;
    if (i == lim->reg_len) {
        if (lim->reg_len == lim->reg_cap) {
            size_t cap = lim->reg_cap ? lim->reg_cap * 2 : 4;
            rate_policy_t *r = realloc(lim->reg, cap * sizeof *r);
            if (r == NULL)
                rc = RATE_ENOMEM;
            else {
                lim->reg = r;
                lim->reg_cap = cap;
            }
        }
        if (rc == RATE_OK) {
            memcpy(&lim->reg[lim->reg_len], p, sizeof *p);
            atomic_init(&lim->reg[lim->reg_len].seen_by, 0);
            lim->reg_len++;
        }
    }
    pthread_mutex_unlock(&lim->reg_lock);
    return rc;
}

static bool reg_lookup(void *ud, uint32_t fingerprint, rate_policy_t *out)
{
    rate_limiter_t *lim = ud;
    bool found = false;

    pthread_mutex_lock(&lim->reg_lock);
    for (size_t i = 0; i < lim->reg_len && !found; i++) {
        if (lim->reg[i].fingerprint == fingerprint) {
            memcpy(out, &lim->reg[i], sizeof *out);
            found = true;
        }
    }
    pthread_mutex_unlock(&lim->reg_lock);
    return found;
}

/* Remembers a resolver's policy the first time this limiter meets it. */
static int reg_note(rate_limiter_t *lim, const rate_policy_t *p)
{
    rate_policy_t *mp = (rate_policy_t *)p; /* seen_by is a cache only */
    int rc;

    if (atomic_load_explicit(&mp->seen_by, memory_order_acquire) == lim->id)
        return RATE_OK;
    if ((rc = reg_add(lim, p)) == RATE_OK)
        atomic_store_explicit(&mp->seen_by, lim->id, memory_order_release);
    return rc;
}

/* ------------------------------------------------------------ lifecycle */

static atomic_uint_fast64_t next_id = 1;

int rate_limiter_new(const rate_limiter_config_t *cfg, rate_limiter_t **out)
{
    rate_limiter_t *lim;
    int rc;

    if (out == NULL)
        return RATE_EINVAL;
    *out = NULL;
    if (cfg == NULL || cfg->policy == NULL)
        return RATE_EINVAL;
    if (cfg->on_store_error != RATE_FAIL_CLOSED &&
        cfg->on_store_error != RATE_FAIL_OPEN &&
        cfg->on_store_error != RATE_FAIL_FALLBACK)
        return RATE_EINVAL;
    if (cfg->clock != NULL &&
        (cfg->clock->now_ns == NULL || cfg->clock->sleep_ns == NULL))
        return RATE_EINVAL;
    lim = calloc(1, sizeof *lim);
    if (lim == NULL)
        return RATE_ENOMEM;
    lim->id = atomic_fetch_add_explicit(&next_id, 1, memory_order_relaxed);
    pthread_mutex_init(&lim->reg_lock, NULL);
    lim->policy = malloc(sizeof *lim->policy);
    if (lim->policy == NULL) {
        rate_limiter_free(lim);
        return RATE_ENOMEM;
    }
    memcpy(lim->policy, cfg->policy, sizeof *lim->policy);
    atomic_init(&lim->policy->seen_by, 0);
    lim->resolve = cfg->resolve;
    lim->resolve_ud = cfg->resolve_ud;
    lim->clock = cfg->clock != NULL
                     ? *cfg->clock
                     : (rate_clock_t){mono_now, mono_sleep, NULL};
    lim->shadow = cfg->shadow;
    lim->fail_mode = cfg->on_store_error;
    lim->max_retries = cfg->max_retries ? cfg->max_retries : DEFAULT_RETRIES;
    lim->store = cfg->store;
    if (lim->store == NULL) {
        lim->own_store = true;
        if ((rc = rate_store_memory_new(NULL, &lim->store)) != RATE_OK) {
            rate_limiter_free(lim);
            return rc;
        }
    }
    if (lim->fail_mode == RATE_FAIL_FALLBACK &&
        (rc = rate_store_memory_new(NULL, &lim->fallback)) != RATE_OK) {
        rate_limiter_free(lim);
        return rc;
    }
    if ((rc = reg_note(lim, lim->policy)) != RATE_OK) {
        rate_limiter_free(lim);
        return rc;
    }
    /* Without a resolver every key has the default policy, so the policy
     * a store's lane decides under is known here. */
    lim->lane = (rate__lane_t){.self = lim->store->self,
                               .policy = lim->policy,
                               .shadow = lim->shadow,
                               .general = try_general,
                               .now_ns = lim->clock.now_ns,
                               .clock_ud = lim->clock.ud};
    if (lim->resolve != NULL || lim->policy->plain == NULL ||
        lim->store->lanes == NULL ||
        !lim->store->lanes(lim->policy, lim->lane.fn))
        for (unsigned how = 0; how < RATE__LANE_HOWS; how++)
            lim->lane.fn[how] = general_lane;
    *out = lim;
    return RATE_OK;
}

void rate_limiter_free(rate_limiter_t *lim)
{
    if (lim == NULL)
        return;
    if (lim->own_store)
        rate_store_free(lim->store);
    rate_store_free(lim->fallback);
    pthread_mutex_destroy(&lim->reg_lock);
    free(lim->reg);
    free(lim->policy);
    free(lim);
}

const rate_policy_t *rate_limiter_policy(const rate_limiter_t *lim)
{
    return lim != NULL ? lim->policy : NULL;
}

/* --------------------------------------------------------- the generic path */

static void *grow_buf(uint8_t **heap, uint8_t *stack, size_t need)
{
    if (need <= GENERIC_BUF)
        return stack;
    uint8_t *p = realloc(*heap, need);
    if (p == NULL)
        return NULL;
    *heap = p;
    return p;
}

/* Load, step, compare-and-set; again on a conflict, up to max_retries. */
static int run_generic(rate_limiter_t *lim, const char *key, size_t key_len,
                       const rate_step_t *st)
{
    const rate_store_vtable_t *vt = lim->store->vt;
    void *self = lim->store->self;
    uint8_t old_stack[GENERIC_BUF], new_stack[GENERIC_BUF];
    uint8_t *old_heap = NULL, *new_heap = NULL, *old = old_stack;
    size_t cap = GENERIC_BUF;
    int rc = RATE_ECONFLICT;

    for (unsigned attempt = 0; attempt <= lim->max_retries; attempt++) {
        rate_step_io_t io;
        uint64_t version = 0;
        size_t len = 0;

        memset(&io, 0, sizeof io);
        rc = vt->load(self, key, key_len, old, cap, &len, &version);
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
            rc = vt->cas(self, key, key_len, version, io.new_state,
                         io.new_len, io.ttl_ns);
        if (rc == RATE_OK) {
            atomic_fetch_add_explicit(io.allowed ? &lim->allowed
                                                 : &lim->denied,
                                      1, memory_order_relaxed);
            break;
        }
        if (rc != RATE_ECONFLICT)
            break;
        atomic_fetch_add_explicit(&lim->retries, 1, memory_order_relaxed);
    }
    free(old_heap);
    free(new_heap);
    return rc;
}

/* ------------------------------------------------------------ decisions */

static RATE__ALWAYS_INLINE int decide(rate_limiter_t *lim, const char *key,
                                      size_t key_len, uint64_t permits,
                                      uint64_t max_wait, uint64_t now,
                                      bool clock_time, bool detail,
                                      rate_decision_t *d)
{
    const rate_policy_t *p = NULL;
    rate__step_arg_t arg;
    rate_step_t st;
    int rc;

    if (lim == NULL || d == NULL) {
        if (d != NULL)
            memset(d, 0, sizeof *d);
        return RATE_EINVAL;
    }
    memset(d, 0, sizeof *d);
    if (key == NULL || key_len == 0 || key_len > RATE_KEY_MAX)
        return RATE_EKEY;
    if (permits > RATE_TIME_MAX || max_wait > RATE_TIME_MAX ||
        now > RATE_TIME_MAX)
        return RATE_ERANGE;
    if (lim->resolve != NULL &&
        (p = lim->resolve(lim->resolve_ud, key, key_len)) != NULL &&
        (rc = reg_note(lim, p)) != RATE_OK)
        return rc;
    if (p == NULL)
        p = lim->policy;
    arg = (rate__step_arg_t){p, reg_lookup, lim, now, permits, max_wait,
                             detail, d};
    st = (rate_step_t){rate__step, &arg, p->grow, now, clock_time,
                       rate__is_cold,
                       !detail && max_wait == 0 ? p->inplace_plain
                                                : p->inplace_full};
    rc = RATE_ENOTSUP;
    if (lim->store->vt->decide != NULL) {
        rate_decide_req_t req = {p, now, clock_time, permits, max_wait,
                                 detail, p->max_reset_ns};
        rc = lim->store->vt->decide(lim->store->self, key, key_len, &req, d);
        if (rc == RATE_OK)
            atomic_fetch_add_explicit(d->allowed ? &lim->allowed
                                                 : &lim->denied,
                                      1, memory_order_relaxed);
        /* Declined: decide here, at the time the store went by. */
        arg.now_ns = st.now_ns = req.now_ns;
    }
    if (rc == RATE_ENOTSUP) {
        if (lim->store->vt->update != NULL)
            rc = lim->store->vt->update(lim->store->self, key, key_len, &st);
        else
            rc = run_generic(lim, key, key_len, &st);
    }
    if (rc != RATE_OK) {
        atomic_fetch_add_explicit(&lim->store_errors, 1, memory_order_relaxed);
        arg.now_ns = st.now_ns = now; /* the fallback keeps our own clock */
        memset(d, 0, sizeof *d); /* the failed store may have filled part */
        if (lim->fallback == NULL ||
            lim->fallback->vt->update(lim->fallback->self, key, key_len,
                                      &st) != RATE_OK) {
            memset(d, 0, sizeof *d);
            d->allowed = lim->fail_mode == RATE_FAIL_OPEN;
            d->component = -1;
        }
        d->reason = RATE_REASON_STORE_ERROR; /* the verdict is the fallback's */
        d->error = rc;
    }
    if (!d->allowed && lim->shadow) {
        d->allowed = true;
        d->shadow = true;
        d->retry_after_ns = d->reason == RATE_REASON_NEVER ? RATE_NEVER : 0;
    }
    return RATE_OK;
}

/* The bool API's general path (rate__lane_t.general); len is the key's
 * length, measured. */
static bool try_general(const rate__lane_t *lane, const char *key, size_t len,
                        uint64_t permits, uint64_t now, unsigned how)
{
    rate_limiter_t *lim = (rate_limiter_t *)lane; /* lane is its first */
    rate_decision_t d;

    /* An error here is bad input: store failures come back as decisions. */
    return decide(lim, key, len, permits, 0, now, how & RATE__LANE_CLOCK,
                  false, &d) == RATE_OK &&
           d.allowed;
}

/* A limiter's lane when its store has none (or may not take it). */
static bool general_lane(const rate__lane_t *lane, const char *key,
                         size_t len, uint64_t permits, uint64_t now,
                         unsigned how)
{
    if (how & RATE__LANE_CLOCK)
        now = clock_now((const rate_limiter_t *)lane); /* lane is its first */
    /* For a C string's length; decide() says what is wrong, if anything. */
    (void)rate__lane_input(key, &len, permits, now, how);
    return try_general(lane, key, len, permits, now,
                       how & ~(unsigned)RATE__LANE_CSTR);
}

bool rate_try_acquire(rate_limiter_t *lim, const char *key, uint64_t permits)
{
    return lim != NULL &&
           lim->lane.fn[RATE__LANE_CLOCK | RATE__LANE_CSTR](
               &lim->lane, key, 0, permits, 0,
               RATE__LANE_CLOCK | RATE__LANE_CSTR);
}

bool rate_try_acquire_at(rate_limiter_t *lim, const char *key,
                         uint64_t permits, uint64_t now_ns)
{
    return lim != NULL &&
           lim->lane.fn[RATE__LANE_CSTR](&lim->lane, key, 0, permits, now_ns,
                                         RATE__LANE_CSTR);
}

bool rate_try_acquire_len(rate_limiter_t *lim, const char *key,
                          size_t key_len, uint64_t permits)
{
    return lim != NULL &&
           lim->lane.fn[RATE__LANE_CLOCK](&lim->lane, key, key_len, permits,
                                          0, RATE__LANE_CLOCK);
}

bool rate_try_acquire_len_at(rate_limiter_t *lim, const char *key,
                             size_t key_len, uint64_t permits,
                             uint64_t now_ns)
{
    return lim != NULL &&
           lim->lane.fn[0](&lim->lane, key, key_len, permits, now_ns, 0);
}

int rate_limiter_check(rate_limiter_t *lim, const char *key, size_t key_len,
                       uint64_t permits, uint64_t max_wait_ns,
                       rate_decision_t *out)
{
    if (lim == NULL)
        return decide(NULL, key, key_len, permits, max_wait_ns, 0, true,
                      true, out);
    return decide(lim, key, key_len, permits, max_wait_ns,
                  clock_now(lim), true, true, out);
}

int rate_limiter_check_at(rate_limiter_t *lim, const char *key,
                          size_t key_len, uint64_t permits,
                          uint64_t max_wait_ns, uint64_t now_ns,
                          rate_decision_t *out)
{
    return decide(lim, key, key_len, permits, max_wait_ns, now_ns, false, true,
                  out);
}

int rate_limiter_acquire(rate_limiter_t *lim, const char *key, size_t key_len,
                         uint64_t permits, uint64_t timeout_ns,
                         rate_decision_t *out)
{
    uint64_t deadline;
    int rc;

    if (lim == NULL)
        return decide(NULL, key, key_len, permits, 0, 0, true, true, out);
    if (timeout_ns > RATE_TIME_MAX)
        timeout_ns = RATE_TIME_MAX;
    deadline = rate__sat_add(clock_now(lim), timeout_ns);
    for (;;) {
        uint64_t now = clock_now(lim);
        uint64_t left = deadline > now ? deadline - now : 0;
        /* Buckets reserve up to the deadline; windows ignore max_wait. */
        rc = decide(lim, key, key_len, permits, left, now, true, true, out);
        if (rc != RATE_OK)
            return rc;
        if (out->allowed) {
            if (out->delay_ns > 0)
                lim->clock.sleep_ns(lim->clock.ud, out->delay_ns);
            return RATE_OK;
        }
        if (out->reason != RATE_REASON_LIMITED || out->retry_after_ns > left)
            return RATE_OK; /* never, a store error, or past the deadline */
        lim->clock.sleep_ns(lim->clock.ud, out->retry_after_ns);
    }
}

int rate_limiter_stats(rate_limiter_t *lim, rate_stats_t *out)
{
    int rc;

    if (lim == NULL || out == NULL)
        return RATE_EINVAL;
    if ((rc = rate_store_stats(lim->store, out)) != RATE_OK)
        return rc;
    if (lim->fallback != NULL) { /* decisions made while the store failed */
        rate_stats_t fb;
        if (rate_store_stats(lim->fallback, &fb) == RATE_OK) {
            out->allowed += fb.allowed;
            out->denied += fb.denied;
        }
    }
    out->allowed += atomic_load_explicit(&lim->allowed, memory_order_relaxed);
    out->denied += atomic_load_explicit(&lim->denied, memory_order_relaxed);
    out->retries += atomic_load_explicit(&lim->retries, memory_order_relaxed);
    out->store_errors +=
        atomic_load_explicit(&lim->store_errors, memory_order_relaxed);
    return RATE_OK;
}
