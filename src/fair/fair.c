/* SPDX-License-Identifier: MIT */
/*
 * Fair shares of a shared limit (docs/fair.md has the design and its
 * guarantees).
 *
 * Built only on the public limiter calls: the shared limit is one key of
 * the caller's limiter, asked with rate_limiter_check_at (or the bool
 * call; rate_limiter_check_policy_at under a configured policy) and given
 * back with rate_limiter_refund_at (_policy_at).  What is ours is the
 * table of flows: one flat block without pointers (a header, `slots`
 * entries, then each entry's ring of waiters), so that the same code runs
 * on it in a process (calloc) and in a mapped file shared by processes.
 * Every decision takes the table's one lock around the limiter's call, so
 * that the fair rule is decided on the state it read.
 *
 * Map: the table (layout, lock, open/create); virtual time and the
 * reserve; not waiting; waiting; the public calls.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "ratelimit.h"
#include "ratelimit_fair.h"

#define FAIR_MAGIC UINT64_C(0x3176726961667272) /* "rrfairv1" */
#define FIX 20                                  /* 2^20 per permit */
#define PROBES 8u
#define SLOTS_DEFAULT 64u
#define QUEUE_DEFAULT 16u
#define POLL_NS (1000000u) /* a custom clock's waits: re-read every 1 ms */

/* ------------------------------------------------------------- the table */

typedef struct fwait {
    uint64_t ticket;   /* unique in the table; 0: none */
    uint64_t permits;
    uint64_t deadline; /* the fair limit's clock */
    int64_t pid;       /* the waiting process */
} fwait_t;

typedef struct fslot {
    uint64_t hash;      /* the flow's; 0: free */
    uint64_t s;         /* virtual service: admitted permits / weight, FIX */
    uint64_t epoch;     /* period it last asked in, plus 1; 0: never */
    uint64_t asked_cur; /* permits asked in that period (waiters too) */
    uint64_t asked_prev;/* ... and in the period before it */
    uint32_t weight;
    uint32_t qhead;     /* ring of waiters: first, count */
    uint32_t qlen;
    uint32_t pad_;
} fslot_t;

typedef struct fhdr {
    uint64_t magic; /* written last when a file is made */
    uint32_t slots, queue_max;
    uint64_t size;
    uint64_t seed;
    uint64_t vtime;      /* V: never decreasing */
    /* V is kept between decisions (docs/fair.md, "Internals"): valid in
     * period vtime_epoch while vmin_count active entries hold s == V;
     * charging one of them counts down, and at 0 V is found again. */
    uint64_t vtime_epoch, vmin_count;
    /* Permits asked in the table's period and the one before (every
     * entry's), and queued: a bound of any reserve, which spares the
     * reserve's scan when the shared limit has more room than that. */
    uint64_t epoch, asked_cur, asked_prev, queued;
    uint64_t ticket_seq;
    uint64_t waiting;
    uint64_t shared, fair_denied, queue_full, timed_out;
    pthread_mutex_t mu;
    pthread_cond_t cv;
} fhdr_t;

struct rate_fair {
    fhdr_t *h;
    fslot_t *slot;
    fwait_t *wait; /* slots x queue_max */
    size_t size;
    bool mapped;   /* a file's mapping (shm_path): unmapped when freed */
    bool borrowed; /* the caller's memory (rate_fair_new_in): left as is */
    rate_limiter_t *limiter;
    const rate_policy_t *policy; /* NULL: the limiter's own */
    rate_clock_t clock;
    bool own_clock;
    uint64_t period_ns; /* the shared policy's first limit's */
    uint64_t rate_limit; /* ... and its limit, for retry estimates */
    size_t key_len;
    char key[RATE_KEY_MAX];
};

static void set_err(char *err, size_t errlen, const char *fmt, const char *arg)
{
    if (err != NULL && errlen > 0)
        snprintf(err, errlen, fmt, arg);
}

static size_t table_size(unsigned slots, unsigned queue_max)
{
    return sizeof(fhdr_t) + (size_t)slots * sizeof(fslot_t) +
           (size_t)slots * queue_max * sizeof(fwait_t);
}

static void table_bind(rate_fair_t *f)
{
    f->slot = (fslot_t *)(void *)((char *)f->h + sizeof(fhdr_t));
    f->wait = (fwait_t *)(void *)(f->slot + f->h->slots);
}

static int table_init(fhdr_t *h, unsigned slots, unsigned queue_max,
                      size_t size, bool pshared)
{
    pthread_mutexattr_t ma;
    pthread_condattr_t ca;
    h->slots = slots;
    h->queue_max = queue_max;
    h->size = size;
    if (getrandom(&h->seed, sizeof h->seed, 0) != (ssize_t)sizeof h->seed)
        h->seed = rate_clock_monotonic_ns() ^ (uint64_t)getpid();
    if (pthread_mutexattr_init(&ma) != 0)
        return RATE_ENOMEM;
    if (pshared) { /* a process may die holding it */
        pthread_mutexattr_setrobust(&ma, PTHREAD_MUTEX_ROBUST);
        pthread_mutexattr_setpshared(&ma, PTHREAD_PROCESS_SHARED);
    }
    int rc = pthread_mutex_init(&h->mu, &ma);
    pthread_mutexattr_destroy(&ma);
    if (rc != 0)
        return RATE_ENOMEM;
    if (pthread_condattr_init(&ca) != 0)
        return RATE_ENOMEM;
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    if (pshared)
        pthread_condattr_setpshared(&ca, PTHREAD_PROCESS_SHARED);
    rc = pthread_cond_init(&h->cv, &ca);
    pthread_condattr_destroy(&ca);
    return rc != 0 ? RATE_ENOMEM : RATE_OK;
}

/* Takes the table's lock; a process that died holding it leaves the
 * table's counters as they were at some step of a decision, which every
 * rule tolerates, so the lock is simply made consistent again. */
static int table_lock(rate_fair_t *f)
{
    int rc = pthread_mutex_lock(&f->h->mu);
    if (rc == EOWNERDEAD)
        rc = pthread_mutex_consistent(&f->h->mu);
    return rc == 0 ? RATE_OK : RATE_ESTORE;
}

static void table_unlock(rate_fair_t *f)
{
    pthread_mutex_unlock(&f->h->mu);
}

/* Opens or makes the shared table at path, under flock so that one
 * process makes it and the others find it whole. */
static int table_open(rate_fair_t *f, const char *path, unsigned slots,
                      unsigned queue_max, char *err, size_t errlen)
{
    size_t size = table_size(slots, queue_max);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) {
        char m[300];
        snprintf(m, sizeof m, "shm_path '%.200s': %s", path, strerror(errno));
        set_err(err, errlen, "%s", m);
        return RATE_ESTORE;
    }
    int rc = RATE_OK;
    struct stat st;
    void *p = MAP_FAILED;
    const char *why = NULL;
    if (flock(fd, LOCK_EX) != 0 || fstat(fd, &st) != 0) {
        why = strerror(errno);
        rc = RATE_ESTORE;
    } else if (st.st_size != 0 && (uint64_t)st.st_size != size) {
        why = "made with other slots or queue_max (or not a fair table)";
        rc = RATE_EINVAL;
    } else if (st.st_size == 0 && ftruncate(fd, (off_t)size) != 0) {
        why = strerror(errno);
        rc = RATE_ESTORE;
    } else {
        p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (p == MAP_FAILED) {
            why = strerror(errno);
            rc = RATE_ESTORE;
        }
    }
    if (rc == RATE_OK) {
        fhdr_t *h = p;
        if (st.st_size == 0 || h->magic == 0) {
            memset(p, 0, size);
            rc = table_init(h, slots, queue_max, size, true);
            if (rc == RATE_OK)
                __atomic_store_n(&h->magic, FAIR_MAGIC, __ATOMIC_RELEASE);
            else
                why = "its lock could not be made";
        } else if (h->magic != FAIR_MAGIC || h->slots != slots ||
                   h->queue_max != queue_max || h->size != size) {
            why = "made with other slots or queue_max (or not a fair table)";
            rc = RATE_EINVAL;
        }
    }
    flock(fd, LOCK_UN);
    close(fd);
    if (rc != RATE_OK) {
        if (p != MAP_FAILED)
            munmap(p, size);
        char m[400];
        snprintf(m, sizeof m, "shm_path '%.200s': %s", path, why);
        set_err(err, errlen, "%s", m);
        return rc;
    }
    f->h = p;
    f->size = size;
    f->mapped = true;
    return RATE_OK;
}

/* ------------------------------------------ virtual time and the reserve */

static uint64_t now_of(const rate_fair_t *f)
{
    return f->own_clock ? f->clock.now_ns(f->clock.ud)
                        : rate_clock_monotonic_ns();
}

static uint64_t epoch_of(const rate_fair_t *f, uint64_t now)
{
    return now / f->period_ns + 1;
}

static bool active(const fslot_t *sl, uint64_t ep)
{
    return sl->hash != 0 && (sl->qlen > 0 || sl->epoch + 1 >= ep);
}

/* ceil(permits x 2^FIX / weight), kept far below overflow. */
static uint64_t cost_of(uint64_t permits, uint32_t weight)
{
    unsigned __int128 c = ((unsigned __int128)permits << FIX) + weight - 1;
    c /= weight;
    return c > (UINT64_C(1) << 62) ? UINT64_C(1) << 62 : (uint64_t)c;
}

/* Adds cost to s; when virtual times near 2^63 every one is moved down
 * by V (differences are all the rules read). */
static void charge(rate_fair_t *f, fslot_t *sl, uint64_t permits)
{
    if (sl->s == f->h->vtime && f->h->vmin_count > 0)
        f->h->vmin_count--;
    sl->s += cost_of(permits, sl->weight);
    if (sl->s > (UINT64_C(1) << 63)) {
        uint64_t v = f->h->vtime;
        for (uint32_t i = 0; i < f->h->slots; i++)
            f->slot[i].s = f->slot[i].s > v ? f->slot[i].s - v : 0;
        f->h->vtime = 0;
        f->h->vmin_count = 0;
    }
}

/* V: the smallest virtual service among the active flows, never lower
 * than before. */
static uint64_t vtime(rate_fair_t *f, uint64_t ep)
{
    fhdr_t *h = f->h;
    if (h->vmin_count > 0 && h->vtime_epoch == ep)
        return h->vtime;
    uint64_t m = UINT64_MAX, count = 0;
    for (uint32_t i = 0; i < h->slots; i++) {
        const fslot_t *sl = &f->slot[i];
        if (!active(sl, ep))
            continue;
        if (sl->s < m) {
            m = sl->s;
            count = 0;
        }
        count += sl->s == m;
    }
    if (m != UINT64_MAX && m >= h->vtime) {
        h->vtime = m;
        h->vmin_count = count;
    } else {
        h->vmin_count = 0; /* none active (or all below: never kept) */
    }
    h->vtime_epoch = ep;
    return h->vtime;
}

/* Brings the table's totals of asked permits to period ep. */
static void asked_roll(fhdr_t *h, uint64_t ep, uint64_t permits)
{
    if (h->epoch != ep) {
        h->asked_prev = h->epoch + 1 == ep ? h->asked_cur : 0;
        h->asked_cur = 0;
        h->epoch = ep;
    }
    h->asked_cur += permits;
}

/* Brings the entry to this period: what it asked rolls over, and a flow
 * coming back from idle restarts at V (no credit for the idle time). */
static void touch(rate_fair_t *f, fslot_t *sl, uint64_t ep)
{
    if (sl->epoch == ep)
        return;
    bool was_active = active(sl, ep);
    sl->asked_prev = sl->epoch + 1 == ep ? sl->asked_cur : 0;
    sl->asked_cur = 0;
    sl->epoch = ep;
    if (!was_active && sl->s <= f->h->vtime) {
        sl->s = f->h->vtime;
        if (f->h->vmin_count > 0)
            f->h->vmin_count++;
    }
}

/* The flow's entry: its own within PROBES of its home, else a free one
 * there, else its home entry shared (counted). */
static fslot_t *find_slot(rate_fair_t *f, const char *flow, size_t len,
                          uint32_t weight, uint64_t ep)
{
    uint64_t h = XXH3_64bits_withSeed(flow, len, f->h->seed);
    if (h == 0)
        h = 1;
    uint32_t n = f->h->slots;
    uint32_t home = (uint32_t)(h % n);
    fslot_t *free_sl = NULL;
    uint32_t probes = n < PROBES ? n : PROBES;
    for (uint32_t i = 0; i < probes; i++) {
        fslot_t *sl = &f->slot[(home + i) % n];
        if (sl->hash == h) {
            sl->weight = weight;
            return sl;
        }
        if (free_sl == NULL && !active(sl, ep))
            free_sl = sl;
    }
    if (free_sl != NULL) {
        uint64_t v = vtime(f, ep);
        free_sl->hash = h;
        free_sl->s = v; /* inactive until touched, which counts it at V */
        free_sl->epoch = 0;
        free_sl->asked_cur = free_sl->asked_prev = 0;
        free_sl->weight = weight;
        free_sl->qhead = free_sl->qlen = 0;
        return free_sl;
    }
    f->h->shared++;
    return &f->slot[home];
}

static uint64_t queued(const rate_fair_t *f, const fslot_t *sl)
{
    uint64_t q = 0;
    size_t base = (size_t)(sl - f->slot) * f->h->queue_max;
    for (uint32_t k = 0; k < sl->qlen; k++)
        q += f->wait[base + (sl->qhead + k) % f->h->queue_max].permits;
    return q;
}

static uint64_t min3(uint64_t a, uint64_t b, uint64_t c)
{
    uint64_t m = a < b ? a : b;
    return m < c ? m : c;
}

/* What the active flows behind `me` are owed (docs/fair.md, "the rule"):
 * for each, the least of its share of the capacity, what it asked lately
 * and what it needs to catch up with me. */
static uint64_t reserve_for(rate_fair_t *f, const fslot_t *me, uint64_t cap,
                            uint64_t ep)
{
    uint64_t total_w = 0;
    for (uint32_t i = 0; i < f->h->slots; i++)
        if (active(&f->slot[i], ep))
            total_w += f->slot[i].weight;
    if (total_w == 0)
        return 0;
    unsigned __int128 r = 0;
    for (uint32_t i = 0; i < f->h->slots; i++) {
        const fslot_t *sl = &f->slot[i];
        if (sl == me || !active(sl, ep) || sl->s >= me->s)
            continue;
        unsigned __int128 share =
            (unsigned __int128)cap * sl->weight / total_w;
        unsigned __int128 catch_up =
            (((unsigned __int128)(me->s - sl->s) * sl->weight) +
             ((UINT64_C(1) << FIX) - 1)) >> FIX;
        uint64_t asked = (sl->asked_cur > sl->asked_prev ? sl->asked_cur
                                                          : sl->asked_prev) +
                         queued(f, sl);
        r += min3(share > UINT64_MAX ? UINT64_MAX : (uint64_t)share, asked,
                  catch_up > UINT64_MAX ? UINT64_MAX : (uint64_t)catch_up);
    }
    return r > RATE_TIME_MAX ? RATE_TIME_MAX : (uint64_t)r;
}

/* ------------------------------------------------------------ not waiting */

/* The shared limit's decision and refund, under the configured policy
 * or the limiter's own. */
static int shared_check(rate_fair_t *f, uint64_t permits, uint64_t now,
                        rate_decision_t *out)
{
    if (f->policy != NULL)
        return rate_limiter_check_policy_at(f->limiter, f->policy, f->key,
                                            f->key_len, permits, 0, now, out);
    return rate_limiter_check_at(f->limiter, f->key, f->key_len, permits, 0,
                                 now, out);
}

static int shared_refund(rate_fair_t *f, uint64_t permits, uint64_t now)
{
    if (f->policy != NULL)
        return rate_limiter_refund_policy_at(f->limiter, f->policy, f->key,
                                             f->key_len, permits, now);
    return rate_limiter_refund_at(f->limiter, f->key, f->key_len, permits,
                                  now);
}

/* Decides a request of the entry (lock held) at now.  full: fill *out
 * (else the bool call's fast path when the flow is within its share). */
static int decide(rate_fair_t *f, fslot_t *sl, uint64_t permits, uint64_t now,
                  uint64_t ep, bool full, rate_decision_t *out)
{
    uint64_t v = vtime(f, ep);
    if (sl->s <= v) {
        if (!full && f->policy == NULL) {
            bool ok = rate_try_acquire_len_at(f->limiter, f->key, f->key_len,
                                              permits, now);
            out->allowed = ok;
            if (ok)
                charge(f, sl, permits);
            return RATE_OK;
        }
        int rc = shared_check(f, permits, now, out);
        if (rc == RATE_OK && out->allowed)
            charge(f, sl, permits);
        return rc;
    }
    int rc = shared_check(f, permits, now, out);
    if (rc != RATE_OK || !out->allowed)
        return rc;
    fhdr_t *h = f->h;
    uint64_t bound = h->asked_cur + h->asked_prev + h->queued;
    if (out->reason == RATE_REASON_ALLOWED && out->limit != RATE_NO_LIMIT &&
        !out->shadow && out->remaining < bound) {
        uint64_t need = reserve_for(f, sl, out->limit, ep);
        if (out->remaining < need) {
            rc = shared_refund(f, permits, now);
            if (rc == RATE_OK) {
                uint64_t missing = need - out->remaining;
                unsigned __int128 t = (unsigned __int128)missing *
                                          f->period_ns +
                                      f->rate_limit - 1;
                t /= f->rate_limit;
                out->allowed = false;
                out->reason = RATE_REASON_LIMITED;
                out->remaining += permits;
                out->delay_ns = 0;
                out->retry_after_ns =
                    t > RATE_TIME_MAX ? RATE_TIME_MAX : (uint64_t)t;
                f->h->fair_denied++;
                return RATE_OK;
            }
            /* The refund failed (a store error): the permits stay spent,
             * so the request is admitted; the limit is kept either way. */
        }
    }
    charge(f, sl, permits);
    return RATE_OK;
}

static int check_input(const rate_fair_t *f, const char *flow, size_t len,
                       uint32_t weight, uint64_t permits, uint64_t now)
{
    if (f == NULL || weight > RATE_FAIR_WEIGHT_MAX)
        return RATE_EINVAL;
    if (flow == NULL || len == 0 || len > RATE_KEY_MAX)
        return RATE_EKEY;
    if (permits > RATE_TIME_MAX || now > RATE_TIME_MAX)
        return RATE_ERANGE;
    return RATE_OK;
}

static int fair_check(rate_fair_t *f, const char *flow, size_t len,
                      uint32_t weight, uint64_t permits, uint64_t now,
                      bool full, rate_decision_t *out)
{
    uint64_t ep = epoch_of(f, now);
    int rc = table_lock(f);
    if (rc != RATE_OK)
        return rc;
    fslot_t *sl = find_slot(f, flow, len, weight ? weight : 1, ep);
    touch(f, sl, ep);
    sl->asked_cur += permits;
    asked_roll(f->h, ep, permits);
    rc = decide(f, sl, permits, now, ep, full, out);
    if (f->h->waiting > 0 && out->allowed)
        pthread_cond_broadcast(&f->h->cv);
    table_unlock(f);
    return rc;
}

/* ---------------------------------------------------------------- waiting */

static fwait_t *ring_at(rate_fair_t *f, const fslot_t *sl, uint32_t k)
{
    size_t base = (size_t)(sl - f->slot) * f->h->queue_max;
    return &f->wait[base + (sl->qhead + k) % f->h->queue_max];
}

/* Removes the k-th waiter of the entry's ring, keeping the order. */
static void ring_remove(rate_fair_t *f, fslot_t *sl, uint32_t k)
{
    f->h->queued -= ring_at(f, sl, k)->permits;
    for (uint32_t j = k; j + 1 < sl->qlen; j++)
        *ring_at(f, sl, j) = *ring_at(f, sl, j + 1);
    ring_at(f, sl, sl->qlen - 1)->ticket = 0;
    sl->qlen--;
    f->h->waiting--;
    f->h->vmin_count = 0; /* an entry may have left the active set */
}

static bool ring_find(rate_fair_t *f, fslot_t *sl, uint64_t ticket,
                      uint32_t *k)
{
    for (uint32_t j = 0; j < sl->qlen; j++)
        if (ring_at(f, sl, j)->ticket == ticket) {
            *k = j;
            return true;
        }
    return false;
}

/* A waiter whose own thread can no longer answer it: past its deadline
 * (its owner is late or gone) or of a process that no longer exists. */
static bool stale(rate_fair_t *f, const fwait_t *w, uint64_t now)
{
    if (w->deadline < now)
        return true;
    return (f->mapped || f->borrowed) && w->pid != (int64_t)getpid() &&
           kill((pid_t)w->pid, 0) != 0 && errno == ESRCH;
}

/* The ticket of the waiter served next: the queue head with the smallest
 * virtual finish time (ties: the older ticket); 0 when none.  Stale heads
 * are dropped on the way. */
static uint64_t next_ticket(rate_fair_t *f, uint64_t now, uint64_t ep)
{
    uint64_t v = vtime(f, ep);
    uint64_t best = 0, best_f = UINT64_MAX;
    for (uint32_t i = 0; i < f->h->slots; i++) {
        fslot_t *sl = &f->slot[i];
        while (sl->qlen > 0 && stale(f, ring_at(f, sl, 0), now)) {
            ring_remove(f, sl, 0);
            f->h->timed_out++;
        }
        if (sl->qlen == 0)
            continue;
        const fwait_t *w = ring_at(f, sl, 0);
        uint64_t fin = (sl->s > v ? sl->s : v) + cost_of(w->permits, sl->weight);
        if (fin < best_f || (fin == best_f && w->ticket < best)) {
            best_f = fin;
            best = w->ticket;
        }
    }
    return best;
}

/* Waits on the table's condition until the fair clock reads `until` or
 * the condition is signalled (lock held). */
static void wait_until(rate_fair_t *f, uint64_t now, uint64_t until)
{
    uint64_t d = until > now ? until - now : 0;
    if (f->own_clock && d > POLL_NS)
        d = POLL_NS;
    uint64_t real = rate_clock_monotonic_ns();
    uint64_t at = real + d > RATE_TIME_MAX ? RATE_TIME_MAX : real + d;
    struct timespec ts = {.tv_sec = (time_t)(at / RATE_NS_PER_S),
                          .tv_nsec = (long)(at % RATE_NS_PER_S)};
    int rc = pthread_cond_timedwait(&f->h->cv, &f->h->mu, &ts);
    if (rc == EOWNERDEAD)
        pthread_mutex_consistent(&f->h->mu);
}

static void denied(rate_decision_t *out, uint64_t retry_ns)
{
    memset(out, 0, sizeof *out);
    out->allowed = false;
    out->reason = RATE_REASON_LIMITED;
    out->component = 0;
    out->retry_after_ns = retry_ns;
}

static int fair_acquire(rate_fair_t *f, const char *flow, size_t len,
                        uint32_t weight, uint64_t permits, uint64_t timeout,
                        rate_decision_t *out)
{
    uint64_t now = now_of(f);
    uint64_t deadline = timeout > RATE_TIME_MAX - now ? RATE_TIME_MAX
                                                      : now + timeout;
    uint64_t ep = epoch_of(f, now);
    int rc = table_lock(f);
    if (rc != RATE_OK)
        return rc;
    fslot_t *sl = find_slot(f, flow, len, weight ? weight : 1, ep);
    touch(f, sl, ep);
    sl->asked_cur += permits;
    asked_roll(f->h, ep, permits);
    if (f->h->waiting == 0) {
        rc = decide(f, sl, permits, now, ep, true, out);
        if (rc != RATE_OK || out->allowed ||
            out->reason != RATE_REASON_LIMITED || timeout == 0 ||
            out->retry_after_ns > deadline - now) {
            table_unlock(f);
            return rc;
        }
    }
    if (sl->qlen >= f->h->queue_max) {
        f->h->queue_full++;
        table_unlock(f);
        denied(out, f->period_ns);
        return RATE_OK;
    }
    uint64_t ticket = ++f->h->ticket_seq;
    sl->qlen++;
    *ring_at(f, sl, sl->qlen - 1) = (fwait_t){.ticket = ticket,
                                              .permits = permits,
                                              .deadline = deadline,
                                              .pid = (int64_t)getpid()};
    f->h->waiting++;
    f->h->queued += permits;
    pthread_cond_broadcast(&f->h->cv);
    for (;;) {
        now = now_of(f);
        ep = epoch_of(f, now);
        uint32_t k;
        if (!ring_find(f, sl, ticket, &k)) { /* dropped as stale: too late */
            table_unlock(f);
            denied(out, 0);
            return RATE_OK;
        }
        if (now >= deadline) {
            ring_remove(f, sl, k);
            f->h->timed_out++;
            pthread_cond_broadcast(&f->h->cv);
            table_unlock(f);
            denied(out, 0);
            return RATE_OK;
        }
        uint64_t until = deadline;
        if (next_ticket(f, now, ep) == ticket) {
            touch(f, sl, ep);
            rc = shared_check(f, permits, now, out);
            if (rc != RATE_OK || out->allowed ||
                out->reason != RATE_REASON_LIMITED) {
                if (ring_find(f, sl, ticket, &k))
                    ring_remove(f, sl, k);
                if (rc == RATE_OK && out->allowed)
                    charge(f, sl, permits);
                pthread_cond_broadcast(&f->h->cv);
                table_unlock(f);
                return rc;
            }
            if (out->retry_after_ns < deadline - now)
                until = now + (out->retry_after_ns ? out->retry_after_ns : 1);
        }
        wait_until(f, now, until);
    }
}

/* ------------------------------------------------------------- public */

static int config_check(const rate_fair_config_t *c, rate_fair_t **out,
                        char *err, size_t errlen);
static rate_fair_t *handle_new(const rate_fair_config_t *c);

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
        rc = table_open(f, c->shm_path, slots, qmax, err, errlen);
    } else {
        f->size = table_size(slots, qmax);
        f->h = calloc(1, f->size);
        rc = f->h == NULL ? RATE_ENOMEM
                          : table_init(f->h, slots, qmax, f->size, false);
        if (rc != RATE_OK)
            set_err(err, errlen, "%s", "out of memory");
    }
    if (rc != RATE_OK) {
        if (!f->mapped)
            free(f->h);
        free(f);
        return rc;
    }
    table_bind(f);
    *out = f;
    return RATE_OK;
}

size_t rate_fair_size(unsigned slots, unsigned queue_max)
{
    if (slots > RATE_FAIR_SLOTS_MAX || queue_max > RATE_FAIR_QUEUE_MAX)
        return 0;
    return table_size(slots ? slots : SLOTS_DEFAULT,
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
    int rc = table_init(h, slots ? slots : SLOTS_DEFAULT,
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
    const fhdr_t *h = mem;
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
    if (__atomic_load_n(&h->magic, __ATOMIC_ACQUIRE) != FAIR_MAGIC ||
        h->size != need) {
        set_err(err, errlen, "%s", "the memory holds no fair table of these "
                "slots and queue_max (rate_fair_init_in makes one)");
        return RATE_EINVAL;
    }
    rate_fair_t *f = handle_new(c);
    if (f == NULL) {
        set_err(err, errlen, "%s", "out of memory");
        return RATE_ENOMEM;
    }
    f->h = mem;
    f->size = need;
    f->borrowed = true;
    table_bind(f);
    *out = f;
    return RATE_OK;
}

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
    return f;
}

void rate_fair_free(rate_fair_t *f)
{
    if (f == NULL)
        return;
    if (f->borrowed) {
        /* the table stays: it is the caller's, other processes' too */
    } else if (f->mapped) {
        munmap(f->h, f->size);
    } else {
        pthread_cond_destroy(&f->h->cv);
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
    int rc = check_input(f, flow, flow_len, weight, permits, now_ns);
    if (rc != RATE_OK)
        return rc;
    rc = fair_check(f, flow, flow_len, weight, permits, now_ns, true, out);
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
    return rate_fair_check_at(f, flow, flow_len, weight, permits, now_of(f),
                              out);
}

bool rate_fair_try_acquire_at(rate_fair_t *f, const char *flow,
                              size_t flow_len, uint32_t weight,
                              uint64_t permits, uint64_t now_ns)
{
    if (check_input(f, flow, flow_len, weight, permits, now_ns) != RATE_OK)
        return false;
    rate_decision_t d;
    d.allowed = false;
    return fair_check(f, flow, flow_len, weight, permits, now_ns, false, &d) ==
               RATE_OK &&
           d.allowed;
}

bool rate_fair_try_acquire(rate_fair_t *f, const char *flow, size_t flow_len,
                           uint32_t weight, uint64_t permits)
{
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
    int rc = check_input(f, flow, flow_len, weight, permits, 0);
    if (rc == RATE_OK && timeout_ns > RATE_TIME_MAX)
        rc = RATE_ERANGE;
    if (rc != RATE_OK)
        return rc;
    rc = fair_acquire(f, flow, flow_len, weight, permits, timeout_ns, out);
    if (rc != RATE_OK)
        memset(out, 0, sizeof *out);
    return rc;
}

int rate_fair_stats(rate_fair_t *f, rate_fair_stats_t *out)
{
    if (f == NULL || out == NULL)
        return RATE_EINVAL;
    memset(out, 0, sizeof *out);
    if (table_lock(f) != RATE_OK)
        return RATE_ESTORE;
    uint64_t ep = epoch_of(f, now_of(f));
    for (uint32_t i = 0; i < f->h->slots; i++)
        if (active(&f->slot[i], ep))
            out->flows++;
    out->slots = f->h->slots;
    out->shared = f->h->shared;
    out->fair_denied = f->h->fair_denied;
    out->waiting = f->h->waiting;
    out->queue_full = f->h->queue_full;
    out->timed_out = f->h->timed_out;
    table_unlock(f);
    return RATE_OK;
}

size_t rate_fair_memory(const rate_fair_t *f)
{
    return f == NULL ? 0 : sizeof *f + f->size;
}
