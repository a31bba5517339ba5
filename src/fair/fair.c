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
#include <linux/futex.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "ratelimit.h"
#include "ratelimit_fair.h"
#include "ratelimit_loop.h"
#include "ratelimit_store.h"
#include "rule.h" /* the rule's arithmetic, shared with the fleet's table */
#include "step.h"

#define FAIR_MAGIC UINT64_C(0x3376726961667272) /* "rrfairv3" */
#define FIX 20                                  /* 2^20 per permit */
#define PROBES 8u
#define SLOTS_DEFAULT 64u
#define QUEUE_DEFAULT 16u
#define LEARN 64u /* permits asked between full decisions, room unknown */
#define POLL_NS (1000000u)
/* An asynchronous waiter on a table shared by processes looks again this
 * often: a waiter of another process cannot wake it. */
#define ASYNC_POLL_NS (2000000u) /* a custom clock's waits: re-read every 1 ms */
/* A waiter not next on a table shared by processes looks again this
 * often: the next waiter's process may be killed, and only the next
 * waiter asks the shared limit. */
#define DEAD_POLL_NS (10000000u)

/* ------------------------------------------------------------- the table */

/* A waiter's seat in its entry's array: it stays put while the waiter
 * waits (the order is kept apart, in the entry's ring of seat numbers),
 * so that the waiter can sleep on its own word and be woken alone. */
typedef struct fwait {
    uint64_t ticket;   /* unique in the table; 0: a free seat */
    uint64_t permits;
    uint64_t deadline; /* the fair limit's clock */
    uint64_t arec;     /* an asynchronous waiter's record (in process
                          pid); 0: a thread waits on `wake` */
    int32_t pid;       /* the waiting process */
    uint32_t wake;     /* futex word: bumped to wake this waiter */
} fwait_t;

/* An entry's pend word: the cost fast_try admitted and the lock has not
 * folded into s yet (low bits), and a generation (high bits) bumped when
 * the entry is taken by another flow, so that a cost in flight for the
 * flow before lands on no other flow (fast_try's compare-and-swap). */
#define PEND_BITS 40
#define PEND_COST ((UINT64_C(1) << PEND_BITS) - 1)
#define PEND_GEN(x) ((x) >> PEND_BITS)

/* "None" for the 1-based links and heap positions below. */
#define NIL 0u

typedef struct fslot {
    uint64_t hash;      /* the flow's; 0: free */
    uint64_t s;         /* virtual service: admitted permits / weight, FIX */
    uint64_t epoch;     /* period it last asked in, plus 1; 0: never */
    uint64_t asked_cur; /* permits asked in that period (waiters too) */
    uint64_t asked_prev;/* ... and in the period before it */
    uint64_t ftag;      /* its queue's head's virtual finish time */
    uint64_t qpermits;  /* permits its waiters ask for */
    uint64_t pend;      /* cost admitted by fast_try, not yet in s (the
                           low PEND_BITS), and the entry's generation */
    uint32_t weight;
    uint32_t qhead;     /* ring of seat numbers: first, count */
    uint32_t qlen;
    uint32_t apos;      /* 1 + its place in the heap of active entries */
    uint32_t wpos;      /* 1 + its place in the heap of queues */
    uint32_t lprev, lnext; /* 1 + neighbours in the active list */
    uint32_t lgave;     /* permits it added to the light backlog while
                           light (rule.h), taken back if it turns heavy */
    uint64_t lsum;      /* its long demand (rate__fair_long_decay) */
    uint64_t since;     /* the period it first asked in, plus 1 */
} fslot_t;

typedef struct fhdr {
    uint64_t magic; /* written last when a file is made */
    uint32_t slots, queue_max;
    uint64_t size;
    uint64_t seed;
    uint64_t vtime;      /* V: never decreasing */
    /* The active entries (docs/fair.md, "Internals"): a heap by virtual
     * service (its top is V) and a list by the period they last asked in
     * (its head expires first); their count and total weight. */
    uint32_t nactive, nqueues; /* ... and the heap of queues' size */
    uint32_t lhead, ltail;
    uint64_t total_w;
    /* Permits asked of the table in all (asked_seq) and its value where
     * the table's period began (seq_cur) and the period before it
     * (seq_prev): asked_seq - seq_prev, plus the queued permits, is what
     * was asked in this period and the last, a bound of any reserve,
     * which spares the reserve's scan when the shared limit has more
     * room than that. */
    uint64_t epoch, asked_seq, seq_cur, seq_prev, queued;
    uint64_t epoch_start; /* the clock's time where `epoch` began */
    /* A lower bound of the shared limit's room is room_until - asked_seq:
     * its last full decision's `remaining` less every permit asked since
     * (room only grows with time); 0: unknown.  With more room than any
     * reserve, a decision needs neither the reserve nor (not waiting)
     * the lock: fast_try. */
    uint64_t room_until;
    uint64_t learn_seq; /* room unknown: a full decision from asked_seq */
    uint64_t ticket_seq;
    uint64_t waiting;
    uint64_t top_ticket; /* the next waiter as last woken or seen */
    uint64_t shared, fair_denied, queue_full, timed_out;
    rate__fair_light_t light; /* the light flows' demand (rule.h) */
    uint64_t cap; /* the shared limit's capacity, as last decided */
    /* A bound of the light reserve, for fast_try (read without the
     * lock): rate__fair_light_bound as of the last decision. */
    uint64_t light_bound;
    pthread_mutex_t mu;
} fhdr_t;

struct rate_fair {
    fhdr_t *h;
    fslot_t *slot;
    uint32_t *aheap; /* slots: entry numbers, heap by s */
    uint32_t *wheap; /* slots: entry numbers, heap by ftag */
    uint16_t *ring;  /* slots x queue_max seat numbers */
    fwait_t *wait;   /* slots x queue_max seats */
    size_t size;
    bool mapped;   /* a file's mapping (shm_path): unmapped when freed */
    bool borrowed; /* the caller's memory (rate_fair_new_in): left as is */
    rate_limiter_t *limiter;
    const rate_policy_t *policy; /* NULL: the limiter's own */
    rate_clock_t clock;
    bool own_clock;
    uint64_t period_ns; /* the shared policy's first limit's */
    uint64_t rate_limit; /* ... and its limit, for retry estimates */
    rate__fair_shape_t shape; /* the same limit, as the rule reads it */
    size_t key_len;
    char key[RATE_KEY_MAX];
    struct fasync *as; /* from the first rate_fair_acquire_start */
    /* The limiter's store makes fair decisions itself (its fair(),
     * version 6: a fleet's table on Redis): the not-waiting calls go
     * there; what it declines is decided on this table.  With its
     * counts of fair denials and shared entries. */
    bool fleet;
    _Atomic uint64_t fleet_denied, fleet_shared;
};

/* The asynchronous waiters (rate_fair_acquire_start): their loop, an
 * eventfd watched on it that wakers write to, the records pending (the
 * loop's thread only) and those woken (under mu). */
typedef struct fasync {
    pthread_mutex_t mu;
    rate_loop_t loop;
    void *io;
    int efd;
    struct arec *pending, *ready;
    /* Answered for a lock that could not be taken: their seats may still
     * name them, so they are kept until rate_fair_free (async_fail). */
    struct arec *dead;
} fasync_t;

/* The fields fast_try reads without the lock are written with these (and
 * asked_seq, room_until read with them under the lock too). */
#define LD(x) __atomic_load_n(&(x), __ATOMIC_RELAXED)
#define ST(x, v) __atomic_store_n(&(x), (v), __ATOMIC_RELAXED)

static void set_err(char *err, size_t errlen, const char *fmt, const char *arg)
{
    if (err != NULL && errlen > 0)
        snprintf(err, errlen, fmt, arg);
}

static size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }

static size_t table_size(unsigned slots, unsigned queue_max)
{
    size_t q = (size_t)slots * queue_max;
    return align64(sizeof(fhdr_t)) + align64((size_t)slots * sizeof(fslot_t)) +
           align64((size_t)slots * 2 * sizeof(uint32_t)) +
           align64(q * sizeof(uint16_t)) + q * sizeof(fwait_t);
}

static void table_bind(rate_fair_t *f)
{
    char *p = (char *)f->h + align64(sizeof(fhdr_t));
    size_t n = f->h->slots, q = n * f->h->queue_max;
    f->slot = (fslot_t *)(void *)p;
    p += align64(n * sizeof(fslot_t));
    f->aheap = (uint32_t *)(void *)p;
    f->wheap = f->aheap + n;
    p += align64(n * 2 * sizeof(uint32_t));
    f->ring = (uint16_t *)(void *)p;
    p += align64(q * sizeof(uint16_t));
    f->wait = (fwait_t *)(void *)p;
}

static int table_init(fhdr_t *h, unsigned slots, unsigned queue_max,
                      size_t size, bool pshared)
{
    pthread_mutexattr_t ma;
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
    return rc != 0 ? RATE_ENOMEM : RATE_OK;
}


static void table_repair(rate_fair_t *f);

/* Takes the table's lock; a process that died holding it may have left
 * a heap or list half changed, so the lock is made consistent again and
 * the table's indexes are rebuilt from its entries (table_repair). */
static int table_lock(rate_fair_t *f)
{
    int rc = pthread_mutex_lock(&f->h->mu);
    if (rc == EOWNERDEAD) {
        rc = pthread_mutex_consistent(&f->h->mu);
        if (rc == 0)
            table_repair(f);
        else /* not held on failure: the lock is then unrecoverable */
            pthread_mutex_unlock(&f->h->mu);
    }
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

/* The period of `now` (plus 1), lock held: the division is done once a
 * period, not once a decision. */
static uint64_t epoch_at(rate_fair_t *f, uint64_t now)
{
    fhdr_t *h = f->h;
    if (h->epoch != 0 && now >= h->epoch_start &&
        now - h->epoch_start < f->period_ns)
        return h->epoch;
    return now / f->period_ns + 1;
}

/* ceil(permits x 2^FIX / weight), kept far below overflow. */
static uint64_t cost_of(uint64_t permits, uint32_t weight)
{
    if (weight == 1 && permits < (UINT64_C(1) << 42))
        return permits << FIX;
    unsigned __int128 c = ((unsigned __int128)permits << FIX) + weight - 1;
    c /= weight;
    return c > (UINT64_C(1) << 62) ? UINT64_C(1) << 62 : (uint64_t)c;
}

static uint32_t idx_of(const rate_fair_t *f, const fslot_t *sl)
{
    return (uint32_t)(sl - f->slot);
}

/* Two binary min-heaps of entry numbers, each entry knowing its place
 * (apos, wpos: 1-based, 0 when out): the active entries by virtual
 * service (the top's is V) and the queues by their head's finish time
 * (the top's head is the next waiter).  O(log n) a change. */
typedef struct heap {
    uint32_t *a;
    uint32_t *n;
    bool by_tag;
} heap_t;

static heap_t aheap(rate_fair_t *f) { return (heap_t){f->aheap, &f->h->nactive, false}; }
static heap_t wheap(rate_fair_t *f) { return (heap_t){f->wheap, &f->h->nqueues, true}; }

static uint64_t hkey(const rate_fair_t *f, const heap_t *hp, uint32_t e)
{
    return hp->by_tag ? f->slot[e].ftag : f->slot[e].s;
}

static void hset(rate_fair_t *f, const heap_t *hp, uint32_t i, uint32_t e)
{
    hp->a[i] = e;
    if (hp->by_tag)
        f->slot[e].wpos = i + 1;
    else
        f->slot[e].apos = i + 1;
}

static void heap_fix(rate_fair_t *f, const heap_t *hp, uint32_t i)
{
    uint32_t n = *hp->n, e = hp->a[i];
    uint64_t k = hkey(f, hp, e);
    while (i > 0) { /* up */
        uint32_t p = (i - 1) / 2;
        if (hkey(f, hp, hp->a[p]) <= k)
            break;
        hset(f, hp, i, hp->a[p]);
        i = p;
    }
    for (;;) { /* down */
        uint32_t c = 2 * i + 1;
        if (c >= n)
            break;
        if (c + 1 < n && hkey(f, hp, hp->a[c + 1]) < hkey(f, hp, hp->a[c]))
            c++;
        if (hkey(f, hp, hp->a[c]) >= k)
            break;
        hset(f, hp, i, hp->a[c]);
        i = c;
    }
    hset(f, hp, i, e);
}

static void heap_push(rate_fair_t *f, const heap_t *hp, uint32_t e)
{
    uint32_t i = (*hp->n)++;
    hset(f, hp, i, e);
    heap_fix(f, hp, i);
}

static void heap_remove(rate_fair_t *f, const heap_t *hp, uint32_t pos1)
{
    uint32_t i = pos1 - 1, e = hp->a[i], last = --(*hp->n);
    if (hp->by_tag)
        f->slot[e].wpos = NIL;
    else
        f->slot[e].apos = NIL;
    if (i != last) {
        hset(f, hp, i, hp->a[last]);
        heap_fix(f, hp, i);
    }
}

/* V follows the active heap's top; it never decreases. */
static void vtime_update(rate_fair_t *f)
{
    fhdr_t *h = f->h;
    if (h->nactive > 0 && f->slot[f->aheap[0]].s > h->vtime)
        h->vtime = f->slot[f->aheap[0]].s;
}

static void list_unlink(rate_fair_t *f, fslot_t *sl)
{
    fhdr_t *h = f->h;
    if (sl->lprev != NIL)
        f->slot[sl->lprev - 1].lnext = sl->lnext;
    else
        h->lhead = sl->lnext;
    if (sl->lnext != NIL)
        f->slot[sl->lnext - 1].lprev = sl->lprev;
    else
        h->ltail = sl->lprev;
    sl->lprev = sl->lnext = NIL;
}

static void list_append(rate_fair_t *f, fslot_t *sl)
{
    fhdr_t *h = f->h;
    uint32_t me = idx_of(f, sl) + 1;
    sl->lnext = NIL;
    sl->lprev = h->ltail;
    if (h->ltail != NIL)
        f->slot[h->ltail - 1].lnext = me;
    else
        h->lhead = me;
    h->ltail = me;
}

/* The queue's head's finish time, and its place in the heap of queues:
 * F = max(s, V) + n / w (start-time fair queueing's tag, fixed while the
 * head and the flow's service stay). */
static void retag(rate_fair_t *f, fslot_t *sl)
{
    const heap_t hp = wheap(f);
    if (sl->qlen == 0) {
        if (sl->wpos != NIL)
            heap_remove(f, &hp, sl->wpos);
        return;
    }
    uint32_t seat = f->ring[(size_t)idx_of(f, sl) * f->h->queue_max + sl->qhead];
    const fwait_t *w = &f->wait[(size_t)idx_of(f, sl) * f->h->queue_max + seat];
    uint64_t v = f->h->vtime;
    sl->ftag = (sl->s > v ? sl->s : v) + cost_of(w->permits, sl->weight);
    if (sl->wpos == NIL)
        heap_push(f, &hp, idx_of(f, sl));
    else
        heap_fix(f, &hp, sl->wpos - 1);
}

/* Moves every virtual time down by V when V passes LEAD_MAX
 * (differences are all the rules read; the heaps' order stays). */
static void rebase(rate_fair_t *f)
{
    uint64_t v = f->h->vtime;
    for (uint32_t i = 0; i < f->h->slots; i++) {
        fslot_t *sl = &f->slot[i];
        sl->s = sl->s > v ? sl->s - v : 0;
        sl->ftag = sl->ftag > v ? sl->ftag - v : 0;
    }
    f->h->vtime = 0;
}

/* The active heap after an entry's s grew: down only (the hot path's
 * one heap step; nothing to do for a leaf). */
static void aheap_down(rate_fair_t *f, uint32_t i)
{
    uint32_t n = f->h->nactive, *a = f->aheap, e = a[i];
    uint64_t k = f->slot[e].s;
    for (;;) {
        uint32_t c = 2 * i + 1;
        if (c >= n)
            break;
        if (c + 1 < n && f->slot[a[c + 1]].s < f->slot[a[c]].s)
            c++;
        if (f->slot[a[c]].s >= k)
            break;
        a[i] = a[c];
        f->slot[a[i]].apos = i + 1;
        i = c;
    }
    a[i] = e;
    f->slot[e].apos = i + 1;
    uint64_t top = f->slot[a[0]].s;
    if (top > f->h->vtime)
        f->h->vtime = top;
}

/* Adds a cost to s, keeping s at most LEAD_MAX ahead of V, and V at
 * most LEAD_MAX (rebased past it): every s, and a finish time (s plus a
 * cost of at most 2^62), then stays below 2^64 however long the run.  A
 * flow 2^41 permits ahead of the slowest is as far ahead as any. */
#define LEAD_MAX (UINT64_C(1) << 61)
static void charge_cost(rate_fair_t *f, fslot_t *sl, uint64_t cost)
{
    uint64_t top = f->h->vtime + LEAD_MAX;
    sl->s += sl->s >= top ? 0 : cost < top - sl->s ? cost : top - sl->s;
    if (sl->apos != NIL)
        aheap_down(f, sl->apos - 1);
    if (sl->qlen > 0)
        retag(f, sl);
    if (f->h->vtime > LEAD_MAX)
        rebase(f);
}

static void charge(rate_fair_t *f, fslot_t *sl, uint64_t permits)
{
    charge_cost(f, sl, cost_of(permits, sl->weight));
}

/* Takes into s what fast_try admitted for the entry since (lock held);
 * the generation stays. */
static void fold(rate_fair_t *f, fslot_t *sl)
{
    if ((LD(sl->pend) & PEND_COST) != 0)
        charge_cost(f, sl, __atomic_fetch_and(&sl->pend, ~PEND_COST,
                                              __ATOMIC_RELAXED) &
                               PEND_COST);
}

static void activate(rate_fair_t *f, fslot_t *sl)
{
    if (sl->s < f->h->vtime)
        sl->s = f->h->vtime; /* no credit for the idle time */
    const heap_t hp = aheap(f);
    heap_push(f, &hp, idx_of(f, sl));
    f->h->total_w += sl->weight;
    list_append(f, sl);
    vtime_update(f);
}

static void deactivate(rate_fair_t *f, fslot_t *sl)
{
    const heap_t hp = aheap(f);
    heap_remove(f, &hp, sl->apos);
    f->h->total_w -= sl->weight;
    list_unlink(f, sl);
    vtime_update(f);
}

/* Brings the table to period ep: the totals of asked permits roll, and
 * the entries that asked in neither this period nor the one before leave
 * the active set, from the list's head (oldest first).  An entry with
 * waiters stays: it goes to the list's tail. */
static void expire(rate_fair_t *f, uint64_t ep, uint64_t now)
{
    fhdr_t *h = f->h;
    if (h->epoch != ep) {
        uint64_t seq = LD(h->asked_seq);
        ST(h->seq_prev, h->epoch + 1 == ep ? h->seq_cur : seq);
        ST(h->seq_cur, seq);
        uint64_t start = (ep - 1) * f->period_ns;
        ST(h->epoch_start, start > now ? now : start); /* a clock gone back */
        ST(h->epoch, ep);
    }
    for (uint32_t n = h->nactive; n > 0 && h->lhead != NIL; n--) {
        fslot_t *sl = &f->slot[h->lhead - 1];
        if (sl->epoch + 1 >= ep)
            break;
        if (sl->qlen > 0) {
            list_unlink(f, sl);
            list_append(f, sl);
        } else {
            deactivate(f, sl);
        }
    }
}

/* Brings the entry to this period: what it asked rolls over, and a flow
 * coming back from idle restarts at V (no credit for the idle time). */
static void touch(rate_fair_t *f, fslot_t *sl, uint64_t ep)
{
    if (sl->epoch == ep)
        return;
    sl->asked_prev = sl->epoch + 1 == ep ? sl->asked_cur : 0;
    sl->asked_cur = 0;
    sl->lsum = sl->epoch == 0 || ep < sl->epoch
                   ? 0
                   : rate__fair_long_decay(sl->lsum, ep - sl->epoch);
    if (sl->since == 0 || ep < sl->since)
        sl->since = ep;
    ST(sl->epoch, ep);
    if (sl->apos == NIL) {
        activate(f, sl);
    } else { /* the list stays in the order of the last period asked */
        list_unlink(f, sl);
        list_append(f, sl);
    }
}

static void set_weight(rate_fair_t *f, fslot_t *sl, uint32_t weight)
{
    if (sl->weight == weight)
        return;
    if (sl->apos != NIL)
        f->h->total_w = f->h->total_w - sl->weight + weight;
    ST(sl->weight, weight);
}

/* The flow's entry: its own within PROBES of its home, else a free one
 * there, else its home entry shared (counted).  A free entry is one out
 * of the active set. */
static fslot_t *find_slot(rate_fair_t *f, const char *flow, size_t len,
                          uint32_t weight)
{
    uint64_t h = XXH3_64bits_withSeed(flow, len, f->h->seed);
    if (h == 0)
        h = 1;
    uint32_t n = f->h->slots;
    uint32_t home = (uint32_t)(((h >> 32) * n) >> 32);
    fslot_t *free_sl = NULL;
    uint32_t probes = n < PROBES ? n : PROBES;
    for (uint32_t i = 0, k = home; i < probes; i++, k = k + 1 == n ? 0 : k + 1) {
        fslot_t *sl = &f->slot[k];
        if (sl->hash == h) {
            set_weight(f, sl, weight);
            return sl;
        }
        if (free_sl == NULL && sl->apos == NIL && sl->qlen == 0)
            free_sl = sl;
    }
    if (free_sl != NULL) {
        ST(free_sl->hash, h);
        free_sl->s = f->h->vtime;
        ST(free_sl->epoch, 0);
        free_sl->asked_cur = free_sl->asked_prev = 0;
        ST(free_sl->weight, weight);
        /* The former flow's cost not yet folded goes with its record
         * (it was idle two periods); the new generation, published after
         * the hash, turns away a cost still in flight for it. */
        __atomic_store_n(&free_sl->pend,
                         (PEND_GEN(LD(free_sl->pend)) + 1) << PEND_BITS,
                         __ATOMIC_RELEASE);
        free_sl->qhead = free_sl->qlen = 0;
        free_sl->qpermits = 0;
        free_sl->lgave = 0;
        free_sl->lsum = 0;
        free_sl->since = 0;
        return free_sl;
    }
    f->h->shared++;
    return &f->slot[home];
}

_Static_assert(FIX == RATE__FAIR_FIX, "one fixed point for both tables");

/* What the flows behind `me` that are not light are owed (docs/fair.md,
 * "The rule"): for each, rate__fair_term, summed for rate__fair_need.  A
 * walk of the active list. */
static uint64_t recent(const fslot_t *sl)
{
    return (sl->asked_cur > sl->asked_prev ? sl->asked_cur : sl->asked_prev) +
           sl->qpermits;
}

/* The periods since the flow first asked, this one included (rule.h). */
static uint64_t age(const fslot_t *sl)
{
    return sl->since != 0 && sl->epoch >= sl->since ? sl->epoch - sl->since + 1
                                                     : 0;
}

static uint64_t terms_for(rate_fair_t *f, const fslot_t *me, uint64_t cap,
                          uint64_t now)
{
    uint64_t total_w = f->h->total_w;
    if (total_w == 0 || me->s <= f->h->vtime)
        return 0;
    unsigned __int128 r = 0;
    for (uint32_t i = f->h->lhead; i != NIL; i = f->slot[i - 1].lnext) {
        const fslot_t *sl = &f->slot[i - 1];
        uint64_t asked = recent(sl);
        if (sl == me || sl->s >= me->s ||
            rate__fair_is_light(&f->shape, asked, sl->lsum, age(sl),
                                sl->weight, total_w, cap))
            continue;
        r += rate__fair_term(&f->shape, now / 1000, cap, sl->weight, total_w,
                             me->s - sl->s, asked);
    }
    return r > RATE__FAIR_LIGHT_MAX ? RATE__FAIR_LIGHT_MAX : (uint64_t)r;
}

/* Counts a request of the entry in the light estimator (lock held): its
 * permits go to the light backlog while the flow is light; a flow that
 * is no longer light takes back what it gave.  Returns whether it is
 * light. */
static bool light_count(rate_fair_t *f, fslot_t *sl, uint64_t permits,
                        uint64_t now)
{
    rate__fair_light_t *l = &f->h->light;
    rate__fair_light_count(l, &f->shape, now / 1000, permits);
    bool light = rate__fair_is_light(&f->shape, recent(sl), sl->lsum,
                                     age(sl), sl->weight, f->h->total_w,
                                     f->h->cap);
    if (light) {
        rate__fair_light_add(l, &f->shape, permits);
        uint64_t g = (uint64_t)sl->lgave + permits;
        sl->lgave = g > UINT32_MAX ? UINT32_MAX : (uint32_t)g;
    } else if (sl->lgave > 0) {
        uint64_t back = sl->asked_cur + sl->asked_prev;
        rate__fair_light_take_back(l, &f->shape,
                                   sl->lgave < back ? sl->lgave : back);
        sl->lgave = 0;
    }
    ST(f->h->light_bound, rate__fair_light_bound(l, &f->shape, f->h->cap));
    return light;
}

/* The room a request of the entry that is not light must leave in the
 * shared limit of capacity cap, whose room after the request is
 * `remaining` (lock held).  The walk for the catch-up terms is spared
 * when the room exceeds the light part plus every permit asked in this
 * period and the last (and queued), a bound of any terms' sum. */
static uint64_t need_of(rate_fair_t *f, const fslot_t *sl, uint64_t cap,
                        uint64_t now, uint64_t remaining)
{
    fhdr_t *h = f->h;
    uint64_t light = rate__fair_need(&h->light, &f->shape, now / 1000, cap, 0);
    uint64_t bound = LD(h->asked_seq) - h->seq_prev + h->queued;
    if (remaining >= light && remaining - light >= bound)
        return light;
    return rate__fair_need(&h->light, &f->shape, now / 1000, cap,
                           terms_for(f, sl, cap, now));
}

/* ------------------------------------------------------------ not waiting */

/* The shared limit's decision and refund, under the configured policy
 * or the limiter's own. */
static int shared_check(rate_fair_t *f, uint64_t permits, uint64_t now,
                        rate_decision_t *out)
{
    int rc;
    if (f->policy != NULL)
        rc = rate_limiter_check_policy_at(f->limiter, f->policy, f->key,
                                          f->key_len, permits, 0, now, out);
    else
        rc = rate_limiter_check_at(f->limiter, f->key, f->key_len, permits, 0,
                                   now, out);
    if (rc == RATE_OK && out->limit != RATE_NO_LIMIT && out->limit > 0)
        f->h->cap = out->limit;
    uint64_t seq = LD(f->h->asked_seq);
    ST(f->h->room_until,
       rc == RATE_OK && out->reason == RATE_REASON_ALLOWED &&
               out->limit != RATE_NO_LIMIT && !out->shadow &&
               out->remaining > 0 && out->remaining <= UINT64_MAX - seq
           ? seq + out->remaining
           : 0);
    return rc;
}

static int shared_refund(rate_fair_t *f, uint64_t permits, uint64_t now)
{
    if (f->policy != NULL)
        return rate_limiter_refund_policy_at(f->limiter, f->policy, f->key,
                                             f->key_len, permits, now);
    return rate_limiter_refund_at(f->limiter, f->key, f->key_len, permits,
                                  now);
}

/* The bool call on the shared limit (the limiter's own policy); a denial
 * leaves the room unknown. */
static bool shared_try(rate_fair_t *f, uint64_t permits, uint64_t now)
{
    bool ok = rate_try_acquire_len_at(f->limiter, f->key, f->key_len, permits,
                                      now);
    if (!ok)
        ST(f->h->room_until, 0);
    return ok;
}

/* A fair denial into *out (the shared limit's permits already given
 * back): the room missing to `need`, refilled at the shared policy's
 * rate, as the retry estimate. */
static void fair_deny(rate_fair_t *f, rate_decision_t *out, uint64_t permits,
                      uint64_t need)
{
    uint64_t missing = need - out->remaining;
    unsigned __int128 t =
        ((unsigned __int128)missing * f->period_ns + f->rate_limit - 1) /
        f->rate_limit;
    out->allowed = false;
    out->reason = RATE_REASON_LIMITED;
    out->remaining += permits;
    out->delay_ns = 0;
    out->retry_after_ns = t > RATE_TIME_MAX ? RATE_TIME_MAX : (uint64_t)t;
    f->h->fair_denied++;
    ST(f->h->room_until, LD(f->h->asked_seq) + out->remaining);
}

/* Decides a request of the entry (lock held) at now.  full: fill *out
 * (else the bool call's fast path: when the flow is within its share, or
 * when the shared limit's room, known from its last full decision, keeps
 * more than any reserve after the request). */
static int decide(rate_fair_t *f, fslot_t *sl, uint64_t permits, uint64_t now,
                  bool full, rate_decision_t *out)
{
    fhdr_t *h = f->h;
    uint64_t seq = LD(h->asked_seq), until = LD(h->room_until);
    uint64_t bound = seq - h->seq_prev + h->queued;
    /* The room, unknown, is learnt by a full decision now and then (at
     * most one per LEARN permits asked), so that fast_try can start. */
    bool learn = until == 0 && seq >= h->learn_seq;
    if (learn)
        h->learn_seq = seq + LEARN;
    bool light = light_count(f, sl, permits, now);
    if (!full && f->policy == NULL && !learn &&
        (light || (until >= seq && until - seq >= bound + h->light_bound))) {
        out->allowed = shared_try(f, permits, now);
        if (out->allowed)
            charge(f, sl, permits);
        return RATE_OK;
    }
    int rc = shared_check(f, permits, now, out);
    if (rc != RATE_OK || !out->allowed)
        return rc;
    if (!light && out->reason == RATE_REASON_ALLOWED &&
        out->limit != RATE_NO_LIMIT && !out->shadow) {
        uint64_t need = need_of(f, sl, out->limit, now, out->remaining);
        if (out->remaining < need) {
            rc = shared_refund(f, permits, now);
            if (rc == RATE_OK) {
                fair_deny(f, out, permits, need);
                return RATE_OK;
            }
            /* The refund failed (a store error): the permits stay spent,
             * so the request is admitted; the limit is kept either way. */
        }
    }
    charge(f, sl, permits);
    return RATE_OK;
}

/* The next waiter's admission (lock held), when its flow is not light,
 * must leave the room the rule keeps (rate__fair_need), as a request
 * that does not wait must: else it is given back and *out says when the
 * room is expected. */
static void keep_light_room(rate_fair_t *f, fslot_t *sl, uint64_t permits,
                            uint64_t now, rate_decision_t *out)
{
    if (!out->allowed || out->reason != RATE_REASON_ALLOWED ||
        out->limit == RATE_NO_LIMIT || out->shadow ||
        rate__fair_is_light(&f->shape, recent(sl), sl->lsum, age(sl),
                            sl->weight, f->h->total_w, out->limit))
        return;
    uint64_t need = need_of(f, sl, out->limit, now, out->remaining);
    if (out->remaining < need && shared_refund(f, permits, now) == RATE_OK)
        fair_deny(f, out, permits, need);
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

static void wake_next(rate_fair_t *f);

/* The flow's entry brought to now, its request counted as asked. */
static fslot_t *enter(rate_fair_t *f, const char *flow, size_t len,
                      uint32_t weight, uint64_t permits, uint64_t now)
{
    uint64_t ep = epoch_at(f, now);
    expire(f, ep, now);
    fslot_t *sl = find_slot(f, flow, len, weight ? weight : 1);
    fold(f, sl);
    touch(f, sl, ep);
    sl->asked_cur += permits;
    sl->lsum = rate__fair_long_add(sl->lsum, permits);
    __atomic_add_fetch(&f->h->asked_seq, permits, __ATOMIC_RELAXED);
    return sl;
}

/* A cost fast_try added to a generation of the entry after its own (the
 * entry taken by another flow meanwhile) is taken back, unless the new
 * flow's decision under the lock folded it first (then it stays
 * charged: at most the costs in flight at that moment). */
__attribute__((noinline)) static void pend_undo(fslot_t *sl, uint64_t cost)
{
    uint64_t cur = LD(sl->pend);
    while ((cur & PEND_COST) >= cost &&
           !__atomic_compare_exchange_n(&sl->pend, &cur, cur - cost, true,
                                        __ATOMIC_RELAXED, __ATOMIC_RELAXED))
        ;
}

/* The bool call's path without the table's lock, taken while the shared
 * limit has more room than every permit asked in this period and the
 * last (so no reserve can be at stake), nothing waits, and the flow's
 * entry was brought to this period already: the permits are counted in
 * asked_seq and the shared limit decides alone.  The flow's service is
 * not charged then: it is counted while the limit is contended
 * (docs/fair.md, "The path without the lock").  Returns 1 admitted,
 * 0 denied, -1 when the lock must be taken. */
static int fast_try(rate_fair_t *f, const char *flow, size_t len,
                    uint32_t weight, uint64_t permits, uint64_t now)
{
    fhdr_t *h = f->h;
    uint64_t ep = LD(h->epoch), start = LD(h->epoch_start);
    if (f->policy != NULL || LD(h->waiting) != 0 || ep == 0 || now < start ||
        now - start >= f->period_ns)
        return -1;
    uint64_t until = LD(h->room_until), seq = LD(h->asked_seq) + permits;
    uint64_t prev = LD(h->seq_prev);
    if (until < seq || until - seq < seq - prev ||
        until - seq - (seq - prev) < LD(h->light_bound))
        return -1;
    uint64_t hv = XXH3_64bits_withSeed(flow, len, h->seed);
    if (hv == 0)
        hv = 1;
    uint32_t n = h->slots;
    uint32_t k = (uint32_t)(((hv >> 32) * n) >> 32);
    fslot_t *sl = &f->slot[k];
    if (__builtin_expect(LD(sl->hash) != hv, 0)) { /* past its home */
        uint32_t probes = n < PROBES ? n : PROBES;
        for (uint32_t i = 1;; i++) {
            if (i == probes)
                return -1;
            k = k + 1 == n ? 0 : k + 1;
            if (LD(f->slot[k].hash) == hv)
                break;
        }
        sl = &f->slot[k];
    }
    uint32_t w = weight ? weight : 1;
    /* The entry's generation, then its hash again: still the flow's, the
     * generation is the flow's too (find_slot publishes a new one after a
     * new hash).  A cost past what the word holds goes through the lock. */
    uint64_t pw = __atomic_load_n(&sl->pend, __ATOMIC_ACQUIRE);
    uint64_t cost = cost_of(permits, w);
    if (LD(sl->hash) != hv || LD(sl->epoch) != ep || LD(sl->weight) != w ||
        cost > (PEND_COST >> 8) || (pw & PEND_COST) > (PEND_COST >> 1))
        return -1;
    __atomic_add_fetch(&h->asked_seq, permits, __ATOMIC_RELAXED);
    if (rate_try_acquire_len_at(f->limiter, f->key, f->key_len, permits, now)) {
        /* Charged to the generation read: a cost that lands on a later
         * one (the entry taken by another flow meanwhile) is taken back
         * (docs/fair.md, "The path without the lock"). */
        uint64_t old = __atomic_fetch_add(&sl->pend, cost, __ATOMIC_RELAXED);
        if (PEND_GEN(old) != PEND_GEN(pw))
            pend_undo(sl, cost);
        return 1;
    }
    ST(h->room_until, 0);
    return 0;
}

static int fair_check(rate_fair_t *f, const char *flow, size_t len,
                      uint32_t weight, uint64_t permits, uint64_t now,
                      bool full, rate_decision_t *out)
{
    int rc = table_lock(f);
    if (rc != RATE_OK)
        return rc;
    fslot_t *sl = enter(f, flow, len, weight, permits, now);
    rc = decide(f, sl, permits, now, full, out);
    if (f->h->waiting > 0)
        wake_next(f); /* an admission may have made another queue next */
    table_unlock(f);
    return rc;
}

/* ---------------------------------------------------------------- waiting */

static size_t base_of(const rate_fair_t *f, const fslot_t *sl)
{
    return (size_t)idx_of(f, sl) * f->h->queue_max;
}

/* The k-th waiter of the entry's queue (0: its head). */
static fwait_t *ring_at(rate_fair_t *f, const fslot_t *sl, uint32_t k)
{
    size_t b = base_of(f, sl);
    return &f->wait[b + f->ring[b + (sl->qhead + k) % f->h->queue_max]];
}

/* Removes the k-th waiter of the entry's queue, keeping the order; its
 * seat is free again. */
static void ring_remove(rate_fair_t *f, fslot_t *sl, uint32_t k)
{
    size_t b = base_of(f, sl);
    uint32_t q = f->h->queue_max;
    fwait_t *w = ring_at(f, sl, k);
    f->h->queued -= w->permits;
    sl->qpermits -= w->permits;
    w->ticket = 0;
    w->arec = 0;
    if (k == 0) {
        sl->qhead = (sl->qhead + 1) % q;
    } else {
        for (uint32_t j = k; j + 1 < sl->qlen; j++)
            f->ring[b + (sl->qhead + j) % q] =
                f->ring[b + (sl->qhead + j + 1) % q];
    }
    sl->qlen--;
    ST(f->h->waiting, f->h->waiting - 1);
    if (k == 0)
        retag(f, sl);
}

/* Appends a waiter to the entry's queue (not full): the seat it took. */
static fwait_t *ring_push(rate_fair_t *f, fslot_t *sl, uint64_t ticket,
                          uint64_t permits, uint64_t deadline)
{
    size_t b = base_of(f, sl);
    uint32_t q = f->h->queue_max, seat = 0;
    while (f->wait[b + seat].ticket != 0) /* a free one exists: qlen < q */
        seat++;
    fwait_t *w = &f->wait[b + seat];
    w->ticket = ticket;
    w->permits = permits;
    w->deadline = deadline;
    w->pid = (int32_t)getpid();
    w->arec = 0;
    f->ring[b + (sl->qhead + sl->qlen) % q] = (uint16_t)seat;
    sl->qlen++;
    sl->qpermits += permits;
    f->h->queued += permits;
    ST(f->h->waiting, f->h->waiting + 1);
    if (sl->qlen == 1)
        retag(f, sl);
    return w;
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
    return (f->mapped || f->borrowed) && w->pid != (int32_t)getpid() &&
           kill((pid_t)w->pid, 0) != 0 && errno == ESRCH;
}

static long futex(uint32_t *word, int op, uint32_t val,
                  const struct timespec *ts, uint32_t val3)
{
    return syscall(SYS_futex, word, op, val, ts, NULL, val3);
}

/* Wakes the waiter's thread (every thread on its seat's word: a seat
 * freed and taken again may still have its former owner asleep on it). */
static void async_wake(uint64_t arec);

static void wake_seat(rate_fair_t *f, fwait_t *w)
{
    uint64_t arec = __atomic_load_n(&w->arec, __ATOMIC_RELAXED);
    if (arec != 0 && w->pid == (int32_t)getpid()) {
        async_wake(arec);
        return;
    }
    __atomic_add_fetch(&w->wake, 1, __ATOMIC_RELEASE);
    int op = FUTEX_WAKE | (f->mapped || f->borrowed ? 0 : FUTEX_PRIVATE_FLAG);
    futex(&w->wake, op, INT32_MAX, NULL, 0);
}

/* The next waiter (the head of the queue with the smallest finish time,
 * stale heads dropped on the way), or NULL. */
static fwait_t *next_waiter(rate_fair_t *f, uint64_t now)
{
    while (f->h->nqueues > 0) {
        fslot_t *sl = &f->slot[f->wheap[0]];
        fwait_t *w = ring_at(f, sl, 0);
        if (!stale(f, w, now))
            return w;
        ring_remove(f, sl, 0);
        f->h->timed_out++;
        wake_seat(f, w); /* its owner, if alive, answers itself: too late */
    }
    return NULL;
}

/* Wakes the next waiter when it is not the one last woken or seen (the
 * only waiter that asks the shared limit). */
static void wake_next(rate_fair_t *f)
{
    fwait_t *w = next_waiter(f, now_of(f));
    if (w != NULL && w->ticket != f->h->top_ticket) {
        f->h->top_ticket = w->ticket;
        wake_seat(f, w);
    }
}

/* Sleeps on the seat's word (lock released meanwhile) until the fair
 * clock reads `until` or the seat is woken. */
static int wait_until(rate_fair_t *f, fwait_t *w, uint64_t now, uint64_t until)
{
    uint64_t d = until > now ? until - now : 0;
    if (f->own_clock && d > POLL_NS)
        d = POLL_NS;
    uint64_t real = rate_clock_monotonic_ns();
    uint64_t at = real + d > RATE_TIME_MAX ? RATE_TIME_MAX : real + d;
    struct timespec ts = {.tv_sec = (time_t)(at / RATE_NS_PER_S),
                          .tv_nsec = (long)(at % RATE_NS_PER_S)};
    uint32_t seen = __atomic_load_n(&w->wake, __ATOMIC_ACQUIRE);
    table_unlock(f);
    int op = FUTEX_WAIT_BITSET |
             (f->mapped || f->borrowed ? 0 : FUTEX_PRIVATE_FLAG);
    futex(&w->wake, op, seen, &ts, FUTEX_BITSET_MATCH_ANY);
    return table_lock(f);
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
    int rc = table_lock(f);
    if (rc != RATE_OK)
        return rc;
    fslot_t *sl = enter(f, flow, len, weight, permits, now);
    if (f->h->waiting == 0) {
        rc = decide(f, sl, permits, now, true, out);
        if (rc != RATE_OK || out->allowed ||
            out->reason != RATE_REASON_LIMITED || timeout == 0 ||
            out->retry_after_ns > deadline - now) {
            table_unlock(f);
            return rc;
        }
    }
    while (sl->qlen > 0 && stale(f, ring_at(f, sl, 0), now)) {
        fwait_t *old = ring_at(f, sl, 0);
        ring_remove(f, sl, 0);
        f->h->timed_out++;
        wake_seat(f, old);
    }
    if (sl->qlen >= f->h->queue_max) {
        f->h->queue_full++;
        table_unlock(f);
        denied(out, f->period_ns);
        return RATE_OK;
    }
    uint64_t ticket = ++f->h->ticket_seq;
    fwait_t *me = ring_push(f, sl, ticket, permits, deadline);
    for (;;) {
        uint32_t k;
        if (me->ticket != ticket) { /* dropped as stale: too late */
            wake_next(f);
            table_unlock(f);
            denied(out, 0);
            return RATE_OK;
        }
        if (now >= deadline) {
            if (ring_find(f, sl, ticket, &k))
                ring_remove(f, sl, k);
            f->h->timed_out++;
            wake_next(f);
            table_unlock(f);
            denied(out, 0);
            return RATE_OK;
        }
        uint64_t until = deadline;
        if (next_waiter(f, now) == me) {
            f->h->top_ticket = ticket;
            touch(f, sl, epoch_at(f, now));
            rc = shared_check(f, permits, now, out);
            if (rc == RATE_OK)
                keep_light_room(f, sl, permits, now, out);
            if (rc != RATE_OK || out->allowed ||
                out->reason != RATE_REASON_LIMITED) {
                ring_remove(f, sl, 0);
                if (rc == RATE_OK && out->allowed)
                    charge(f, sl, permits);
                wake_next(f);
                table_unlock(f);
                return rc;
            }
            if (out->retry_after_ns < deadline - now)
                until = now + (out->retry_after_ns ? out->retry_after_ns : 1);
        } else {
            /* The next waiter may be new (one dropped as stale): woken.
             * On a shared table, look again now and then: the process
             * of the next waiter may be killed, and nothing else wakes
             * the waiters behind it. */
            wake_next(f);
            if ((f->mapped || f->borrowed) && until - now > DEAD_POLL_NS)
                until = now + DEAD_POLL_NS;
        }
        rc = wait_until(f, me, now, until);
        if (rc != RATE_OK) { /* the lock is lost: the seat stays to expire */
            memset(out, 0, sizeof *out);
            return rc;
        }
        now = now_of(f);
        expire(f, epoch_at(f, now), now);
    }
}


/* ------------------------------------------------- waiting, asynchronous */

/* An asynchronous waiter: its seat in the table, its timer on the loop,
 * its callback.  Freed on the loop's thread once answered. */
typedef struct arec {
    rate_fair_t *f;
    void *timer;
    rate_check_fn cb;
    void *ud;
    fslot_t *sl;
    fwait_t *seat;
    uint64_t ticket, permits, deadline;
    struct arec *next, *prev; /* the handle's pending list */
    struct arec *rnext;       /* the handle's woken list */
    bool ready;
    bool dead; /* answered by async_fail: its seat may still name it */
} arec_t;

/* Called by a waker (table lock held, any thread of the process): queues
 * the record as woken and pokes the loop's eventfd. */
static void async_wake(uint64_t arec)
{
    arec_t *r = (arec_t *)(uintptr_t)arec;
    rate_fair_t *f = r->f;
    pthread_mutex_lock(&f->as->mu);
    if (!r->ready && !r->dead) {
        r->ready = true;
        r->rnext = f->as->ready;
        f->as->ready = r;
    }
    pthread_mutex_unlock(&f->as->mu);
    uint64_t one = 1;
    ssize_t n = write(f->as->efd, &one, sizeof one);
    (void)n; /* a full counter is still readable: the loop wakes */
}

/* Takes the waiter off the ready and pending lists and frees its timer;
 * dead: marked so under the lock, so that no waker readies it again. */
static void async_unlink(arec_t *r, bool dead)
{
    rate_fair_t *f = r->f;
    pthread_mutex_lock(&f->as->mu);
    if (r->ready) {
        arec_t **pp = &f->as->ready;
        while (*pp != r)
            pp = &(*pp)->rnext;
        *pp = r->rnext;
        r->ready = false;
    }
    if (dead)
        r->dead = true;
    pthread_mutex_unlock(&f->as->mu);
    if (r->prev != NULL)
        r->prev->next = r->next;
    else
        f->as->pending = r->next;
    if (r->next != NULL)
        r->next->prev = r->prev;
    f->as->loop.timer_free(f->as->loop.ud, r->timer);
    r->timer = NULL;
}

/* Answers the waiter (its seat already gone, lock released): unlinked,
 * its timer freed, then its callback, then the record freed. */
static void async_finish(arec_t *r, int rc, const rate_decision_t *d)
{
    async_unlink(r, false);
    r->cb(r->ud, rc, d);
    free(r);
}

/* Answers the waiter with rc when the table's lock cannot be taken: its
 * seat cannot be removed then and still names the record, which a waker
 * reaches (async_wake) if the lock is ever made whole again, so the
 * record is kept, dead, until rate_fair_free (async_bury). */
static void async_fail(arec_t *r, int rc)
{
    rate_fair_t *f = r->f;
    rate_decision_t d;
    memset(&d, 0, sizeof d);
    async_unlink(r, true);
    r->cb(r->ud, rc, &d);
    r->next = f->as->dead;
    f->as->dead = r;
}

/* Frees the dead records (rate_fair_free): each seat still theirs is
 * removed under the lock, or, when it still cannot be taken (nobody
 * holds it then), unmarked, so that no waker reaches a freed record. */
static void async_bury(rate_fair_t *f)
{
    while (f->as->dead != NULL) {
        arec_t *r = f->as->dead;
        f->as->dead = r->next;
        if (table_lock(f) == RATE_OK) {
            uint32_t k;
            if (r->seat->ticket == r->ticket &&
                ring_find(f, r->sl, r->ticket, &k))
                ring_remove(f, r->sl, k);
            table_unlock(f);
        } else if (__atomic_load_n(&r->seat->ticket, __ATOMIC_RELAXED) ==
                   r->ticket) {
            __atomic_store_n(&r->seat->arec, 0, __ATOMIC_RELAXED);
        }
        free(r);
    }
}

/* One look at the waiter, as the thread waiter's loop does once a wake:
 * answered (too late, admitted, or the shared limit's other answer), or
 * its timer armed for its deadline or the limit's retry time. */
static void async_step(arec_t *r)
{
    rate_fair_t *f = r->f;
    rate_decision_t d;
    memset(&d, 0, sizeof d);
    int rc = table_lock(f);
    if (rc != RATE_OK) {
        async_fail(r, rc);
        return;
    }
    uint64_t now = now_of(f);
    expire(f, epoch_at(f, now), now);
    if (r->seat->ticket != r->ticket || now >= r->deadline) {
        uint32_t k; /* (a seat dropped as stale was counted then) */
        if (r->seat->ticket == r->ticket && ring_find(f, r->sl, r->ticket, &k)) {
            ring_remove(f, r->sl, k);
            f->h->timed_out++;
        }
        wake_next(f);
        table_unlock(f);
        denied(&d, 0);
        async_finish(r, RATE_OK, &d);
        return;
    }
    uint64_t until = r->deadline;
    if (next_waiter(f, now) == r->seat) {
        f->h->top_ticket = r->ticket;
        touch(f, r->sl, epoch_at(f, now));
        rc = shared_check(f, r->permits, now, &d);
        if (rc != RATE_OK || d.allowed || d.reason != RATE_REASON_LIMITED) {
            ring_remove(f, r->sl, 0);
            if (rc == RATE_OK && d.allowed)
                charge(f, r->sl, r->permits);
            wake_next(f);
            table_unlock(f);
            if (rc != RATE_OK)
                memset(&d, 0, sizeof d);
            async_finish(r, rc, &d);
            return;
        }
        if (d.retry_after_ns < r->deadline - now)
            until = now + (d.retry_after_ns ? d.retry_after_ns : 1);
    } else if ((f->mapped || f->borrowed) && until - now > ASYNC_POLL_NS) {
        until = now + ASYNC_POLL_NS;
    }
    table_unlock(f);
    uint64_t after = until - now;
    if (f->own_clock && after > POLL_NS)
        after = POLL_NS;
    f->as->loop.timer_arm(f->as->loop.ud, r->timer, after);
}

static void async_timer_cb(void *arg)
{
    async_step(arg);
}

/* The eventfd is readable: every woken waiter takes a step. */
static void async_io_cb(void *arg, unsigned events)
{
    rate_fair_t *f = arg;
    uint64_t v;
    (void)events;
    while (read(f->as->efd, &v, sizeof v) > 0)
        ;
    for (;;) {
        pthread_mutex_lock(&f->as->mu);
        arec_t *r = f->as->ready;
        if (r != NULL) {
            f->as->ready = r->rnext;
            r->ready = false;
        }
        pthread_mutex_unlock(&f->as->mu);
        if (r == NULL)
            break;
        async_step(r);
    }
}

/* One loop is told from another by its whole table: the adapter's ud
 * and every function (two adapters may share a ud). */
static bool loop_same(const rate_loop_t *a, const rate_loop_t *b)
{
    return a->ud == b->ud && a->io_new == b->io_new &&
           a->io_set == b->io_set && a->io_free == b->io_free &&
           a->timer_new == b->timer_new && a->timer_arm == b->timer_arm &&
           a->timer_cancel == b->timer_cancel &&
           a->timer_free == b->timer_free && a->now == b->now;
}

/* The handle's first asynchronous call binds it to the loop. */
static int async_bind(rate_fair_t *f, const rate_loop_t *loop)
{
    if (f->as != NULL)
        return loop_same(&f->as->loop, loop) ? RATE_OK : RATE_EINVAL;
    fasync_t *as = calloc(1, sizeof *as);
    if (as == NULL)
        return RATE_ENOMEM;
    as->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    as->loop = *loop;
    as->io = as->efd < 0 ? NULL
                         : loop->io_new(loop->ud, as->efd, async_io_cb, f);
    if (as->io == NULL || loop->io_set(loop->ud, as->io, RATE_LOOP_READ) != 0) {
        if (as->io != NULL)
            loop->io_free(loop->ud, as->io);
        if (as->efd >= 0)
            close(as->efd);
        free(as);
        return RATE_ENOMEM;
    }
    pthread_mutex_init(&as->mu, NULL);
    f->as = as;
    return RATE_OK;
}

int rate_fair_acquire_start(rate_fair_t *f, const rate_loop_t *loop,
                            const char *flow, size_t flow_len,
                            uint32_t weight, uint64_t permits,
                            uint64_t max_wait_ns, rate_decision_t *out,
                            rate_check_fn cb, void *ud)
{
    if (out == NULL)
        return RATE_EINVAL;
    memset(out, 0, sizeof *out);
    if (loop == NULL || cb == NULL || loop->io_new == NULL ||
        loop->io_set == NULL || loop->io_free == NULL ||
        loop->timer_new == NULL || loop->timer_arm == NULL ||
        loop->timer_free == NULL)
        return RATE_EINVAL;
    int rc = check_input(f, flow, flow_len, weight, permits, 0);
    if (rc == RATE_OK && max_wait_ns > RATE_TIME_MAX)
        rc = RATE_ERANGE;
    if (rc == RATE_OK)
        rc = async_bind(f, loop);
    if (rc != RATE_OK)
        return rc;
    arec_t *r = calloc(1, sizeof *r);
    if (r == NULL)
        return RATE_ENOMEM;
    r->timer = loop->timer_new(loop->ud, async_timer_cb, r);
    if (r->timer == NULL) {
        free(r);
        return RATE_ENOMEM;
    }
    uint64_t now = now_of(f);
    uint64_t deadline = max_wait_ns > RATE_TIME_MAX - now ? RATE_TIME_MAX
                                                          : now + max_wait_ns;
    rc = table_lock(f);
    bool queue = false;
    if (rc == RATE_OK) {
        fslot_t *sl = enter(f, flow, flow_len, weight, permits, now);
        queue = true;
        if (f->h->waiting == 0) {
            rc = decide(f, sl, permits, now, true, out);
            queue = !(rc != RATE_OK || out->allowed ||
                      out->reason != RATE_REASON_LIMITED || max_wait_ns == 0 ||
                      out->retry_after_ns > deadline - now);
        }
        while (queue && sl->qlen > 0 && stale(f, ring_at(f, sl, 0), now)) {
            fwait_t *old = ring_at(f, sl, 0);
            ring_remove(f, sl, 0);
            f->h->timed_out++;
            wake_seat(f, old);
        }
        if (queue && sl->qlen >= f->h->queue_max) {
            f->h->queue_full++;
            denied(out, f->period_ns);
            queue = false;
        }
        if (queue) {
            *r = (arec_t){.f = f, .timer = r->timer, .cb = cb, .ud = ud,
                          .sl = sl, .ticket = ++f->h->ticket_seq,
                          .permits = permits, .deadline = deadline};
            r->seat = ring_push(f, sl, r->ticket, permits, deadline);
            r->seat->arec = (uint64_t)(uintptr_t)r;
            r->next = f->as->pending;
            if (f->as->pending != NULL)
                f->as->pending->prev = r;
            f->as->pending = r;
        }
        table_unlock(f);
    }
    if (!queue) {
        loop->timer_free(loop->ud, r->timer);
        free(r);
        if (rc != RATE_OK)
            memset(out, 0, sizeof *out);
        return rc;
    }
    memset(out, 0, sizeof *out);
    /* Its first look on the loop's next turn: the callback never runs
     * before this returns. */
    loop->timer_arm(loop->ud, r->timer, 0);
    return RATE_PENDING;
}

/* Rebuilds the table's indexes from its entries and seats, after a
 * process died holding the lock (a scan of the table, that once): each
 * queue in ticket order (its arrival order), the active set as the
 * entries that asked in this period or the one before or have waiters. */
static void table_repair(rate_fair_t *f)
{
    fhdr_t *h = f->h;
    uint32_t n = h->slots, q = h->queue_max;
    h->nactive = h->nqueues = 0;
    h->lhead = h->ltail = NIL;
    h->total_w = h->queued = h->top_ticket = 0;
    ST(h->waiting, 0);
    ST(h->room_until, 0);
    for (uint32_t i = 0; i < n; i++) {
        fslot_t *sl = &f->slot[i];
        size_t b = (size_t)i * q;
        uint32_t cnt = 0;
        sl->apos = sl->wpos = sl->lprev = sl->lnext = NIL;
        sl->qpermits = 0;
        for (uint32_t seat = 0; seat < q; seat++) {
            const fwait_t *w = &f->wait[b + seat];
            if (w->ticket == 0)
                continue;
            uint32_t j = cnt++;
            while (j > 0 && f->wait[b + f->ring[b + j - 1]].ticket > w->ticket) {
                f->ring[b + j] = f->ring[b + j - 1];
                j--;
            }
            f->ring[b + j] = (uint16_t)seat;
            sl->qpermits += w->permits;
        }
        sl->qhead = 0;
        sl->qlen = cnt;
        h->queued += sl->qpermits;
        ST(h->waiting, h->waiting + cnt);
    }
    const heap_t hp = aheap(f);
    for (uint32_t i = 0; i < n; i++) {
        fslot_t *sl = &f->slot[i];
        if (sl->hash == 0 || (sl->epoch + 1 < h->epoch && sl->qlen == 0))
            continue;
        heap_push(f, &hp, i);
        h->total_w += sl->weight;
        list_append(f, sl);
    }
    vtime_update(f);
    for (uint32_t i = 0; i < n; i++)
        if (f->slot[i].qlen > 0)
            retag(f, &f->slot[i]);
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
    f->shape = rate__fair_shape_of(l0 != NULL ? (int)l0->algorithm : 0,
                                   f->rate_limit, f->period_ns);
    f->fleet = rate_limiter_check_fair_at(c->limiter, NULL, NULL, 0, NULL, 0,
                                          0, NULL) == RATE_OK;
    return f;
}

/* A not-waiting decision by the store's fair() (docs/fair.md, "Redis (a
 * fleet)"), at now (clock_time: the limiter's clock, e.g. Redis TIME, so
 * that every host goes by one); RATE_ENOTSUP when there is none or it
 * declines (then this table decides). */
static int fleet_check(rate_fair_t *f, const char *flow, size_t len,
                       uint32_t weight, uint64_t permits, uint64_t now,
                       bool clock_time, rate_decision_t *out)
{
    if (!f->fleet)
        return RATE_ENOTSUP;
    uint64_t h = XXH3_64bits(flow, len);
    rate_fair_req_t q = {.flow_hash = h ? h : 1, .weight = weight ? weight : 1,
                         .slots = f->h->slots};
    int rc = clock_time
                 ? rate_limiter_check_fair(f->limiter, f->policy, f->key,
                                           f->key_len, &q, permits, out)
                 : rate_limiter_check_fair_at(f->limiter, f->policy, f->key,
                                              f->key_len, &q, permits, now,
                                              out);
    if (rc == RATE_OK && q.fair_denied)
        atomic_fetch_add_explicit(&f->fleet_denied, 1, memory_order_relaxed);
    if (rc == RATE_OK && q.shared)
        atomic_fetch_add_explicit(&f->fleet_shared, 1, memory_order_relaxed);
    return rc;
}

void rate_fair_free(rate_fair_t *f)
{
    if (f == NULL)
        return;
    while (f->as != NULL && f->as->pending != NULL) { /* answered now */
        arec_t *r = f->as->pending;
        rate_decision_t d;
        memset(&d, 0, sizeof d);
        if (table_lock(f) != RATE_OK) {
            async_fail(r, RATE_ECANCELED); /* its seat stays: buried below */
            continue;
        }
        uint32_t k;
        if (r->seat->ticket == r->ticket && ring_find(f, r->sl, r->ticket, &k))
            ring_remove(f, r->sl, k);
        wake_next(f);
        table_unlock(f);
        async_finish(r, RATE_ECANCELED, &d);
    }
    if (f->as != NULL) {
        async_bury(f);
        f->as->loop.io_free(f->as->loop.ud, f->as->io);
        close(f->as->efd);
        pthread_mutex_destroy(&f->as->mu);
        free(f->as);
    }
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
    int rc = check_input(f, flow, flow_len, weight, permits, now_ns);
    if (rc != RATE_OK)
        return rc;
    rc = fleet_check(f, flow, flow_len, weight, permits, now_ns, false, out);
    if (rc == RATE_ENOTSUP)
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
    if (f->fleet && !f->own_clock && out != NULL &&
        check_input(f, flow, flow_len, weight, permits, 0) == RATE_OK) {
        int rc = fleet_check(f, flow, flow_len, weight, permits, 0, true, out);
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
    if (check_input(f, flow, flow_len, weight, permits, now_ns) != RATE_OK)
        return false;
    if (f->fleet) {
        rate_decision_t fd;
        int rc = fleet_check(f, flow, flow_len, weight, permits, now_ns, false,
                             &fd);
        if (rc != RATE_ENOTSUP)
            return rc == RATE_OK && fd.allowed;
    }
    int fast = fast_try(f, flow, flow_len, weight, permits, now_ns);
    if (fast >= 0)
        return fast == 1;
    rate_decision_t d;
    d.allowed = false;
    return fair_check(f, flow, flow_len, weight, permits, now_ns, false, &d) ==
               RATE_OK &&
           d.allowed;
}

bool rate_fair_try_acquire(rate_fair_t *f, const char *flow, size_t flow_len,
                           uint32_t weight, uint64_t permits)
{
    if (f != NULL && f->fleet && !f->own_clock &&
        check_input(f, flow, flow_len, weight, permits, 0) == RATE_OK) {
        rate_decision_t fd;
        int rc = fleet_check(f, flow, flow_len, weight, permits, 0, true, &fd);
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
    /* the active entries at the fair clock's now, counted without
     * expiring any: a look changes nothing */
    uint64_t ep = epoch_at(f, now_of(f));
    for (uint32_t i = f->h->lhead; i != NIL; i = f->slot[i - 1].lnext)
        out->flows += f->slot[i - 1].epoch + 1 >= ep || f->slot[i - 1].qlen > 0;
    out->slots = f->h->slots;
    out->shared = f->h->shared + atomic_load(&f->fleet_shared);
    out->fair_denied = f->h->fair_denied + atomic_load(&f->fleet_denied);
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
