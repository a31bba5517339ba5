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
 * A table shared by processes is only as sound as its file (docs/fair.md,
 * "A damaged table"): its sizes are checked when a fair limit attaches
 * and kept in the handle, and every entry number, link, heap position,
 * queue position and seat number read from it is loaded once, checked
 * by its accessor (entry_at, link_at, heap_pos, queue_of, queue_seat)
 * and used as loaded; every walk is bounded by the table's sizes.  What
 * fails a check is RATE_ECORRUPT, never a read or write outside the
 * table or an endless loop.
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
#define MAGIC_STEM UINT64_C(0xffffffffffff)     /* "rrfair": a version apart */
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
    /* Bumped by every taker of a shared table's lock: a waiter sees the
     * lock change hands (table_lock).  After the lock, in its padding,
     * so that the fields before keep their places. */
    uint64_t holds;
} fhdr_t;

_Static_assert(sizeof(fhdr_t) <= 384, "the header keeps within 384 bytes");

struct rate_fair {
    fhdr_t *h;
    fslot_t *slot;
    uint32_t *aheap; /* slots: entry numbers, heap by s */
    uint32_t *wheap; /* slots: entry numbers, heap by ftag */
    uint16_t *ring;  /* slots x queue_max seat numbers */
    fwait_t *wait;   /* slots x queue_max seats */
    size_t size;
    /* The table's sizes, checked when the handle attached: never read
     * from the table again (a writer of its file may change them). */
    uint32_t slots, qmax;
    bool mapped;   /* a file's mapping (shm_path): unmapped when freed */
    bool borrowed; /* the caller's memory (rate_fair_new_in): left as is */
    int lock_kind; /* glibc's type word of a shared table's lock */
    /* A shared table's lock as last seen by a wait that gave up on it
     * (lock_sample): a wait that finds it so again gives up at once. */
    _Atomic uint64_t stuck;
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
    /* The records by number (under mu).  A seat names its record by this
     * handle's tag and the record's number, never by its address: a
     * waker looks the number up here (arec_named), so that a damaged
     * seat cannot send it to memory that is no record. */
    uint32_t tag;
    uint32_t nrecs, nfree, cap; /* numbers given; free ones; room */
    struct arec **recs;         /* by number - 1; NULL: free */
    uint32_t *free_nums;
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

/* The handle's views of the table's parts, from its checked sizes. */
static void table_bind(rate_fair_t *f, unsigned slots, unsigned queue_max)
{
    char *p = (char *)f->h + align64(sizeof(fhdr_t));
    size_t n = slots, q = n * queue_max;
    f->slots = slots;
    f->qmax = queue_max;
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


static int table_repair(rate_fair_t *f);
static uint64_t now_of(const rate_fair_t *f);

/* A shared table's lock is waited for a slice at a time: LOCK_SLICE_NS
 * (POLL_NS with a clock of one's own), and at most LOCK_STALL_NS of the
 * fair clock while it does not change hands. */
#define LOCK_SLICE_NS (10000000u)
#define LOCK_STALL_NS (UINT64_C(5) * RATE_NS_PER_S)

#ifdef __GLIBC__
#define LOCK_WORD(mu) ((uint32_t)__atomic_load_n(&(mu)->__data.__lock, \
                                                 __ATOMIC_RELAXED))
#define LOCK_KIND(mu) __atomic_load_n(&(mu)->__data.__kind, __ATOMIC_RELAXED)
#else
#define LOCK_WORD(mu) 0u
#endif

/* The type glibc gives the lock a shared table is made with. */
static int lock_kind_made(void)
{
    int kind = 0;
#ifdef __GLIBC__
    pthread_mutexattr_t ma;
    pthread_mutex_t probe;
    if (pthread_mutexattr_init(&ma) != 0)
        return -1;
    pthread_mutexattr_setrobust(&ma, PTHREAD_MUTEX_ROBUST);
    pthread_mutexattr_setpshared(&ma, PTHREAD_PROCESS_SHARED);
    if (pthread_mutex_init(&probe, &ma) == 0) {
        kind = probe.__data.__kind;
        pthread_mutex_destroy(&probe);
    }
    pthread_mutexattr_destroy(&ma);
#endif
    return kind;
}

/* Whether a shared table's lock looks held by no live thread: its word
 * names no thread, or this one (which never takes it twice), or one that
 * does not exist.  A robust lock's owner that died is marked so by the
 * kernel before its id is gone, and the next try takes it (EOWNERDEAD):
 * a word like this one was written by someone else. */
static bool lock_orphaned(pthread_mutex_t *mu)
{
    uint32_t word = LOCK_WORD(mu);
    if (word == 0 || (word & FUTEX_OWNER_DIED) != 0)
        return false;
    pid_t tid = (pid_t)(word & FUTEX_TID_MASK);
    return tid == 0 || tid == gettid() || (kill(tid, 0) != 0 && errno == ESRCH);
}

/* The lock's word and how often it was taken: while neither changes,
 * nobody took it. */
static uint64_t lock_sample(rate_fair_t *f)
{
    return (uint64_t)LOCK_WORD(&f->h->mu) << 32 |
           (uint32_t)__atomic_load_n(&f->h->holds, __ATOMIC_RELAXED);
}

/* Waits for a shared table's lock that is held: a pthread result (0,
 * EOWNERDEAD, ...), or RATE_ECORRUPT for a lock held by no live thread,
 * RATE_ETIMEDOUT once the fair clock reads `deadline` or the lock has
 * not changed hands for LOCK_STALL_NS (then remembered: the next wait
 * that finds it so gives up at once). */
static int lock_wait(rate_fair_t *f, uint64_t deadline)
{
    pthread_mutex_t *mu = &f->h->mu;
    uint64_t seen = lock_sample(f), since = now_of(f);
    if (lock_orphaned(mu))
        return RATE_ECORRUPT;
    if (seen >> 32 != 0 && seen == atomic_load(&f->stuck))
        return RATE_ETIMEDOUT;
    uint64_t slice = f->own_clock ? POLL_NS : LOCK_SLICE_NS;
    for (;;) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        uint64_t at = (uint64_t)ts.tv_sec * RATE_NS_PER_S +
                      (uint64_t)ts.tv_nsec + slice;
        ts.tv_sec = (time_t)(at / RATE_NS_PER_S);
        ts.tv_nsec = (long)(at % RATE_NS_PER_S);
        int rc = pthread_mutex_timedlock(mu, &ts);
        if (rc != ETIMEDOUT)
            return rc;
        if (lock_orphaned(mu))
            return RATE_ECORRUPT;
        uint64_t now = now_of(f), cur = lock_sample(f);
        if (now >= deadline)
            return RATE_ETIMEDOUT;
        if (cur != seen) {
            seen = cur;
            since = now;
        } else if (now - since >= LOCK_STALL_NS) {
            atomic_store(&f->stuck, cur);
            return RATE_ETIMEDOUT;
        }
    }
}

/* Takes the table's lock, waiting at most until the fair clock reads
 * `deadline` (a shared table's; UINT64_MAX: no deadline).  A process
 * that died holding it may have left a heap or list half changed, so
 * the lock is made consistent again and the table's indexes are rebuilt
 * from its entries (table_repair).  Returns RATE_OK (held); RATE_ESTORE
 * for a lock the system refuses (unrecoverable); on a shared table,
 * RATE_ECORRUPT for a lock of another type than the one made here
 * (glibc's priority paths would assert on what they find) or held by no
 * live thread, RATE_ETIMEDOUT as lock_wait. */
static int table_lock_by(rate_fair_t *f, uint64_t deadline)
{
    pthread_mutex_t *mu = &f->h->mu;
    bool shared = f->mapped || f->borrowed;
    int rc;
#ifdef __GLIBC__
    if (shared && LOCK_KIND(mu) != f->lock_kind)
        return RATE_ECORRUPT;
#endif
    if (!shared)
        rc = pthread_mutex_lock(mu);
    else if ((rc = pthread_mutex_trylock(mu)) == EBUSY)
        rc = lock_wait(f, deadline);
    if (rc < 0)
        return rc;
    if (rc == EOWNERDEAD) {
        rc = pthread_mutex_consistent(mu);
        if (rc != 0) { /* not held on failure: the lock is unrecoverable */
            pthread_mutex_unlock(mu);
            return RATE_ESTORE;
        }
        if (table_repair(f) != RATE_OK) {
            pthread_mutex_unlock(mu);
            return RATE_ECORRUPT;
        }
    }
    if (rc != 0)
        return RATE_ESTORE;
    if (shared)
        __atomic_store_n(&f->h->holds, f->h->holds + 1, __ATOMIC_RELAXED);
    return RATE_OK;
}

static int table_lock(rate_fair_t *f)
{
    return table_lock_by(f, UINT64_MAX);
}

static void table_unlock(rate_fair_t *f)
{
    pthread_mutex_unlock(&f->h->mu);
}

/* Whether len bytes holding the header copied to *h (taken once: the
 * checks and the handle read the copy, never the table) are a fair table
 * of slots and queue_max, exactly len bytes long (a file) or at most:
 * RATE_OK, or RATE_EINVAL with the reason in why. */
static int header_check(const fhdr_t *h, size_t len, bool exact,
                        unsigned slots, unsigned queue_max, int lock_kind,
                        char *why, size_t whylen)
{
    size_t need = table_size(slots, queue_max);
    if (len < sizeof *h) {
        snprintf(why, whylen, "%zu bytes: too short to be a fair table", len);
        return RATE_EINVAL;
    }
    if ((h->magic & MAGIC_STEM) != (FAIR_MAGIC & MAGIC_STEM)) {
        snprintf(why, whylen, "%s", "not a fair table (no fair table's "
                                    "mark at its start)");
        return RATE_EINVAL;
    }
    if (h->magic != FAIR_MAGIC) {
        char v[9] = "";
        memcpy(v, &h->magic, 8);
        for (int i = 0; i < 8; i++)
            v[i] = v[i] >= 0x20 && v[i] < 0x7f ? v[i] : '?';
        snprintf(why, whylen, "a fair table of another version ('%s'; this "
                 "library reads 'rrfairv2')", v);
        return RATE_EINVAL;
    }
    if (h->slots == 0 || h->slots > RATE_FAIR_SLOTS_MAX || h->queue_max == 0 ||
        h->queue_max > RATE_FAIR_QUEUE_MAX) {
        snprintf(why, whylen, "its header is damaged (slots %u, queue_max %u)",
                 h->slots, h->queue_max);
        return RATE_EINVAL;
    }
    if (h->slots != slots || h->queue_max != queue_max) {
        snprintf(why, whylen, "made with other slots or queue_max (%u and %u; "
                 "this fair limit's are %u and %u)", h->slots, h->queue_max,
                 slots, queue_max);
        return RATE_EINVAL;
    }
    if (h->size != need) {
        snprintf(why, whylen, "its header is damaged (a size of %llu bytes, "
                 "where its slots and queue_max take %zu)",
                 (unsigned long long)h->size, need);
        return RATE_EINVAL;
    }
    if (exact ? len != need : len < need) {
        snprintf(why, whylen, "%zu bytes, where its table takes %zu "
                 "(truncated?)", len, need);
        return RATE_EINVAL;
    }
#ifdef __GLIBC__
    if (h->mu.__data.__kind != lock_kind) {
        snprintf(why, whylen, "%s", "its lock is damaged (not of the type "
                                    "this library makes)");
        return RATE_EINVAL;
    }
#else
    (void)lock_kind;
#endif
    return RATE_OK;
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
    char why[200] = "";
    bool make = false;
    if (flock(fd, LOCK_EX) != 0 || fstat(fd, &st) != 0) {
        snprintf(why, sizeof why, "%s", strerror(errno));
        rc = RATE_ESTORE;
    } else if (st.st_size == 0) {
        make = true;
        if (ftruncate(fd, (off_t)size) != 0) {
            snprintf(why, sizeof why, "%s", strerror(errno));
            rc = RATE_ESTORE;
        }
    } else {
        fhdr_t hd;
        memset(&hd, 0, sizeof hd);
        ssize_t n = pread(fd, &hd, sizeof hd, 0);
        /* all zero where its mark goes: a maker died before writing it */
        make = n == (ssize_t)sizeof hd && hd.magic == 0 &&
               (uint64_t)st.st_size == size;
        if (!make)
            rc = header_check(&hd, (size_t)st.st_size, true, slots, queue_max,
                              f->lock_kind, why, sizeof why);
    }
    if (rc == RATE_OK) {
        p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (p == MAP_FAILED) {
            snprintf(why, sizeof why, "%s", strerror(errno));
            rc = RATE_ESTORE;
        }
    }
    if (rc == RATE_OK && make) {
        fhdr_t *h = p;
        memset(p, 0, size);
        rc = table_init(h, slots, queue_max, size, true);
        if (rc == RATE_OK)
            __atomic_store_n(&h->magic, FAIR_MAGIC, __ATOMIC_RELEASE);
        else
            snprintf(why, sizeof why, "%s", "its lock could not be made");
    }
    flock(fd, LOCK_UN);
    close(fd);
    if (rc != RATE_OK) {
        if (p != MAP_FAILED)
            munmap(p, size);
        char m[500];
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

/* The checked accessors (docs/fair.md, "A damaged table"): an index the
 * table holds is loaded once, checked against the handle's sizes by one
 * of these, and used as loaded. */

/* An entry by its number (a heap's element, 0-based); NULL past the
 * table. */
static fslot_t *entry_at(const rate_fair_t *f, uint32_t e)
{
    return e < f->slots ? &f->slot[e] : NULL;
}

/* An entry by a link of the active list (1-based; *out NULL for NIL):
 * RATE_ECORRUPT past the table. */
static int link_at(const rate_fair_t *f, uint32_t link, fslot_t **out)
{
    if (link > f->slots)
        return RATE_ECORRUPT;
    *out = link == NIL ? NULL : &f->slot[link - 1];
    return RATE_OK;
}

/* An entry's weight, 1..RATE_FAIR_WEIGHT_MAX: a damaged one counts as 1
 * (it divides a cost). */
static uint32_t weight_of(const fslot_t *sl)
{
    uint32_t w = LD(sl->weight);
    return w - 1 < RATE_FAIR_WEIGHT_MAX ? w : 1;
}

/* An entry's queue as loaded once: where its ring starts, how many
 * wait. */
typedef struct fqueue {
    uint32_t head, len;
} fqueue_t;

static size_t base_of(const rate_fair_t *f, const fslot_t *sl)
{
    return (size_t)idx_of(f, sl) * f->qmax;
}

/* The entry's queue: RATE_ECORRUPT for a start or count past
 * queue_max. */
static int queue_of(const rate_fair_t *f, const fslot_t *sl, fqueue_t *q)
{
    q->head = LD(sl->qhead);
    q->len = LD(sl->qlen);
    return q->head < f->qmax && q->len <= f->qmax ? RATE_OK : RATE_ECORRUPT;
}

/* The seat of the queue's k-th waiter (k < q->len; 0: its head):
 * RATE_ECORRUPT for a seat number past queue_max. */
static int queue_seat(const rate_fair_t *f, const fslot_t *sl,
                      const fqueue_t *q, uint32_t k, fwait_t **out)
{
    size_t b = base_of(f, sl);
    uint32_t seat = LD(f->ring[b + (q->head + k) % f->qmax]);
    if (seat >= f->qmax)
        return RATE_ECORRUPT;
    *out = &f->wait[b + seat];
    return RATE_OK;
}

/* Two binary min-heaps of entry numbers, each entry knowing its place
 * (apos, wpos: 1-based, 0 when out): the active entries by virtual
 * service (the top's is V) and the queues by their head's finish time
 * (the top's head is the next waiter).  O(log n) a change.  A size, an
 * element and a place are each checked as read (heap_len, heap_at,
 * heap_pos); the sifts end by themselves (a place only moves up, or
 * only down). */
typedef struct heap {
    uint32_t *a;
    uint32_t *n;
    bool by_tag;
} heap_t;

static heap_t aheap(rate_fair_t *f) { return (heap_t){f->aheap, &f->h->nactive, false}; }
static heap_t wheap(rate_fair_t *f) { return (heap_t){f->wheap, &f->h->nqueues, true}; }

static uint64_t hkey(const heap_t *hp, const fslot_t *sl)
{
    return hp->by_tag ? sl->ftag : sl->s;
}

static void hset(rate_fair_t *f, const heap_t *hp, uint32_t i, uint32_t e)
{
    hp->a[i] = e;
    if (hp->by_tag)
        f->slot[e].wpos = i + 1;
    else
        f->slot[e].apos = i + 1;
}

/* The heap's size: RATE_ECORRUPT past the table. */
static int heap_len(const rate_fair_t *f, const heap_t *hp, uint32_t *n)
{
    *n = LD(*hp->n);
    return *n <= f->slots ? RATE_OK : RATE_ECORRUPT;
}

/* The element at place i (below the size): its entry (number in *e), or
 * NULL past the table. */
static fslot_t *heap_at(const rate_fair_t *f, const heap_t *hp, uint32_t i,
                        uint32_t *e)
{
    *e = LD(hp->a[i]);
    return entry_at(f, *e);
}

/* The entry's place in the heap of n: RATE_ECORRUPT unless its position
 * is in the heap and the heap has it there. */
static int heap_pos(const rate_fair_t *f, const heap_t *hp,
                    const fslot_t *sl, uint32_t n, uint32_t *i)
{
    uint32_t pos = hp->by_tag ? LD(sl->wpos) : LD(sl->apos);
    if (pos == NIL || pos > n || LD(hp->a[pos - 1]) != idx_of(f, sl))
        return RATE_ECORRUPT;
    *i = pos - 1;
    return RATE_OK;
}

/* Entry e, at hole i of the heap of n, moved down to its place. */
static int heap_down(rate_fair_t *f, const heap_t *hp, uint32_t n,
                     uint32_t i, uint32_t e)
{
    uint64_t k = hkey(hp, &f->slot[e]);
    for (;;) {
        uint32_t c = 2 * i + 1, ce, de;
        if (c >= n)
            break;
        const fslot_t *cs = heap_at(f, hp, c, &ce), *ds;
        if (cs == NULL)
            return RATE_ECORRUPT;
        if (c + 1 < n) {
            if ((ds = heap_at(f, hp, c + 1, &de)) == NULL)
                return RATE_ECORRUPT;
            if (hkey(hp, ds) < hkey(hp, cs)) {
                c++;
                ce = de;
                cs = ds;
            }
        }
        if (hkey(hp, cs) >= k)
            break;
        hset(f, hp, i, ce);
        i = c;
    }
    hset(f, hp, i, e);
    return RATE_OK;
}

/* Entry e, at hole i of the heap of n, moved up or down to its place. */
static int heap_sift(rate_fair_t *f, const heap_t *hp, uint32_t n,
                     uint32_t i, uint32_t e)
{
    uint64_t k = hkey(hp, &f->slot[e]);
    while (i > 0) {
        uint32_t p = (i - 1) / 2, pe;
        const fslot_t *ps = heap_at(f, hp, p, &pe);
        if (ps == NULL)
            return RATE_ECORRUPT;
        if (hkey(hp, ps) <= k)
            break;
        hset(f, hp, i, pe);
        i = p;
    }
    return heap_down(f, hp, n, i, e);
}

/* Adds the entry (not in the heap): a heap already of the table's size
 * is damaged. */
static int heap_push(rate_fair_t *f, const heap_t *hp, fslot_t *sl)
{
    uint32_t n;
    if (heap_len(f, hp, &n) != RATE_OK || n == f->slots)
        return RATE_ECORRUPT;
    *hp->n = n + 1;
    return heap_sift(f, hp, n + 1, n, idx_of(f, sl));
}

static int heap_remove(rate_fair_t *f, const heap_t *hp, fslot_t *sl)
{
    uint32_t n, i, last_e = 0;
    int rc = heap_len(f, hp, &n);
    if (rc == RATE_OK)
        rc = heap_pos(f, hp, sl, n, &i);
    if (rc == RATE_OK && i != n - 1 && heap_at(f, hp, n - 1, &last_e) == NULL)
        rc = RATE_ECORRUPT;
    if (rc != RATE_OK)
        return rc;
    *hp->n = n - 1;
    if (hp->by_tag)
        sl->wpos = NIL;
    else
        sl->apos = NIL;
    return i == n - 1 ? RATE_OK : heap_sift(f, hp, n - 1, i, last_e);
}

/* The entry (in the heap) moved to its place after its key changed. */
static int heap_update(rate_fair_t *f, const heap_t *hp, fslot_t *sl)
{
    uint32_t n, i;
    int rc = heap_len(f, hp, &n);
    if (rc == RATE_OK)
        rc = heap_pos(f, hp, sl, n, &i);
    return rc != RATE_OK ? rc : heap_sift(f, hp, n, i, idx_of(f, sl));
}

/* The heap's top entry, NULL when it is empty. */
static int heap_top(const rate_fair_t *f, const heap_t *hp, fslot_t **out)
{
    uint32_t n, e;
    *out = NULL;
    if (heap_len(f, hp, &n) != RATE_OK)
        return RATE_ECORRUPT;
    if (n > 0 && (*out = heap_at(f, hp, 0, &e)) == NULL)
        return RATE_ECORRUPT;
    return RATE_OK;
}

/* V follows the active heap's top; it never decreases. */
static int vtime_update(rate_fair_t *f)
{
    const heap_t hp = aheap(f);
    fslot_t *top;
    int rc = heap_top(f, &hp, &top);
    if (rc == RATE_OK && top != NULL && top->s > f->h->vtime)
        f->h->vtime = top->s;
    return rc;
}

/* Takes the entry off the active list: RATE_ECORRUPT, with nothing
 * written, unless both its neighbours are in the table and link back to
 * it. */
static int list_unlink(rate_fair_t *f, fslot_t *sl)
{
    fhdr_t *h = f->h;
    uint32_t me = idx_of(f, sl) + 1, prev = LD(sl->lprev),
             next = LD(sl->lnext);
    fslot_t *p, *n;
    if (link_at(f, prev, &p) != RATE_OK || link_at(f, next, &n) != RATE_OK)
        return RATE_ECORRUPT;
    uint32_t *to_me = p != NULL ? &p->lnext : &h->lhead;
    uint32_t *from_me = n != NULL ? &n->lprev : &h->ltail;
    if (LD(*to_me) != me || LD(*from_me) != me)
        return RATE_ECORRUPT;
    *to_me = next;
    *from_me = prev;
    sl->lprev = sl->lnext = NIL;
    return RATE_OK;
}

/* Puts the entry (not on the list) at its tail: RATE_ECORRUPT, with
 * nothing written, unless the tail is in the table and ends the list. */
static int list_append(rate_fair_t *f, fslot_t *sl)
{
    fhdr_t *h = f->h;
    uint32_t me = idx_of(f, sl) + 1, tail = LD(h->ltail);
    fslot_t *t;
    if (link_at(f, tail, &t) != RATE_OK)
        return RATE_ECORRUPT;
    uint32_t *end = t != NULL ? &t->lnext : &h->lhead;
    if (LD(*end) != NIL)
        return RATE_ECORRUPT;
    sl->lnext = NIL;
    sl->lprev = tail;
    *end = me;
    h->ltail = me;
    return RATE_OK;
}

static int list_to_tail(rate_fair_t *f, fslot_t *sl)
{
    int rc = list_unlink(f, sl);
    return rc != RATE_OK ? rc : list_append(f, sl);
}

/* A walk of the active list from its head: at most `slots` steps. */
typedef struct lwalk {
    uint32_t link, steps;
} lwalk_t;

static lwalk_t lwalk_start(const rate_fair_t *f)
{
    return (lwalk_t){LD(f->h->lhead), 0};
}

/* The walk's next entry (*sl NULL at the list's end): RATE_ECORRUPT for
 * a link past the table, or a walk longer than the table (a cycle). */
static int lwalk_next(const rate_fair_t *f, lwalk_t *w, fslot_t **sl)
{
    if (w->link != NIL && w->steps++ == f->slots)
        return RATE_ECORRUPT;
    int rc = link_at(f, w->link, sl);
    if (rc == RATE_OK && *sl != NULL)
        w->link = LD((*sl)->lnext);
    return rc;
}

/* The queue's head's finish time, and its place in the heap of queues:
 * F = max(s, V) + n / w (start-time fair queueing's tag, fixed while the
 * head and the flow's service stay). */
static int retag(rate_fair_t *f, fslot_t *sl)
{
    const heap_t hp = wheap(f);
    fqueue_t q;
    fwait_t *w;
    int rc = queue_of(f, sl, &q);
    if (rc != RATE_OK)
        return rc;
    if (q.len == 0)
        return LD(sl->wpos) != NIL ? heap_remove(f, &hp, sl) : RATE_OK;
    if ((rc = queue_seat(f, sl, &q, 0, &w)) != RATE_OK)
        return rc;
    uint64_t v = f->h->vtime;
    sl->ftag = (sl->s > v ? sl->s : v) +
               cost_of(LD(w->permits), weight_of(sl));
    return LD(sl->wpos) == NIL ? heap_push(f, &hp, sl)
                               : heap_update(f, &hp, sl);
}

/* Moves every virtual time down by V when V passes LEAD_MAX
 * (differences are all the rules read; the heaps' order stays). */
static void rebase(rate_fair_t *f)
{
    uint64_t v = f->h->vtime;
    for (uint32_t i = 0; i < f->slots; i++) {
        fslot_t *sl = &f->slot[i];
        sl->s = sl->s > v ? sl->s - v : 0;
        sl->ftag = sl->ftag > v ? sl->ftag - v : 0;
    }
    f->h->vtime = 0;
}

/* The active heap after an entry's s grew: down only (the hot path's
 * one heap step; nothing to do for a leaf), then V from its top. */
static int aheap_down(rate_fair_t *f, fslot_t *sl)
{
    const heap_t hp = aheap(f);
    uint32_t n, i, e;
    int rc = heap_len(f, &hp, &n);
    if (rc == RATE_OK)
        rc = heap_pos(f, &hp, sl, n, &i);
    if (rc == RATE_OK)
        rc = heap_down(f, &hp, n, i, idx_of(f, sl));
    if (rc != RATE_OK)
        return rc;
    const fslot_t *top = heap_at(f, &hp, 0, &e);
    if (top == NULL)
        return RATE_ECORRUPT;
    if (top->s > f->h->vtime)
        f->h->vtime = top->s;
    return RATE_OK;
}

/* Adds a cost to s, keeping s at most LEAD_MAX ahead of V, and V at
 * most LEAD_MAX (rebased past it): every s, and a finish time (s plus a
 * cost of at most 2^62), then stays below 2^64 however long the run.  A
 * flow 2^41 permits ahead of the slowest is as far ahead as any. */
#define LEAD_MAX (UINT64_C(1) << 61)
static int charge_cost(rate_fair_t *f, fslot_t *sl, uint64_t cost)
{
    uint64_t top = f->h->vtime + LEAD_MAX;
    int rc = RATE_OK;
    sl->s += sl->s >= top ? 0 : cost < top - sl->s ? cost : top - sl->s;
    if (LD(sl->apos) != NIL)
        rc = aheap_down(f, sl);
    if (rc == RATE_OK && LD(sl->qlen) > 0)
        rc = retag(f, sl);
    if (f->h->vtime > LEAD_MAX)
        rebase(f);
    return rc;
}

static int charge(rate_fair_t *f, fslot_t *sl, uint64_t permits)
{
    return charge_cost(f, sl, cost_of(permits, weight_of(sl)));
}

/* Takes into s what fast_try admitted for the entry since (lock held);
 * the generation stays. */
static int fold(rate_fair_t *f, fslot_t *sl)
{
    if ((LD(sl->pend) & PEND_COST) == 0)
        return RATE_OK;
    return charge_cost(f, sl, __atomic_fetch_and(&sl->pend, ~PEND_COST,
                                                 __ATOMIC_RELAXED) &
                                  PEND_COST);
}

static int activate(rate_fair_t *f, fslot_t *sl)
{
    if (sl->s < f->h->vtime)
        sl->s = f->h->vtime; /* no credit for the idle time */
    const heap_t hp = aheap(f);
    int rc = heap_push(f, &hp, sl);
    if (rc == RATE_OK)
        rc = list_append(f, sl);
    if (rc != RATE_OK)
        return rc;
    f->h->total_w += sl->weight;
    return vtime_update(f);
}

static int deactivate(rate_fair_t *f, fslot_t *sl)
{
    const heap_t hp = aheap(f);
    int rc = list_unlink(f, sl);
    if (rc == RATE_OK)
        rc = heap_remove(f, &hp, sl);
    if (rc != RATE_OK)
        return rc;
    f->h->total_w -= sl->weight;
    return vtime_update(f);
}

/* Brings the table to period ep: the totals of asked permits roll, and
 * the entries that asked in neither this period nor the one before leave
 * the active set, from the list's head (oldest first).  An entry with
 * waiters stays: it goes to the list's tail.  At most every active entry
 * once. */
static int expire(rate_fair_t *f, uint64_t ep, uint64_t now)
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
    uint32_t n = LD(h->nactive);
    if (n > f->slots)
        return RATE_ECORRUPT;
    for (; n > 0; n--) {
        fslot_t *sl;
        int rc = link_at(f, LD(h->lhead), &sl);
        if (rc != RATE_OK)
            return rc;
        if (sl == NULL || sl->epoch + 1 >= ep)
            break;
        rc = LD(sl->qlen) > 0 ? list_to_tail(f, sl) : deactivate(f, sl);
        if (rc != RATE_OK)
            return rc;
    }
    return RATE_OK;
}

/* Brings the entry to this period: what it asked rolls over, and a flow
 * coming back from idle restarts at V (no credit for the idle time). */
static int touch(rate_fair_t *f, fslot_t *sl, uint64_t ep)
{
    if (sl->epoch == ep)
        return RATE_OK;
    sl->asked_prev = sl->epoch + 1 == ep ? sl->asked_cur : 0;
    sl->asked_cur = 0;
    sl->lsum = sl->epoch == 0 || ep < sl->epoch
                   ? 0
                   : rate__fair_long_decay(sl->lsum, ep - sl->epoch);
    if (sl->since == 0 || ep < sl->since)
        sl->since = ep;
    ST(sl->epoch, ep);
    /* the list stays in the order of the last period asked */
    return LD(sl->apos) == NIL ? activate(f, sl) : list_to_tail(f, sl);
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
    uint32_t n = f->slots;
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
 * "The rule"): for each, rate__fair_term, summed for rate__fair_need into
 * *terms.  A walk of the active list (RATE_ECORRUPT when it is damaged). */
static uint64_t recent(const fslot_t *sl)
{
    return (sl->asked_cur > sl->asked_prev ? sl->asked_cur : sl->asked_prev) +
           sl->qpermits;
}

/* The periods since the flow first asked, this one included (rule.h). */
static uint64_t age(const fslot_t *sl)
{
    return rate__fair_age(sl->since, sl->epoch);
}

static int terms_for(rate_fair_t *f, const fslot_t *me, uint64_t cap,
                     uint64_t now, uint64_t *terms)
{
    uint64_t total_w = f->h->total_w;
    unsigned __int128 r = 0;
    *terms = 0;
    if (total_w == 0 || me->s <= f->h->vtime)
        return RATE_OK;
    lwalk_t w = lwalk_start(f);
    for (;;) {
        fslot_t *sl;
        int rc = lwalk_next(f, &w, &sl);
        if (rc != RATE_OK)
            return rc;
        if (sl == NULL)
            break;
        uint64_t asked = recent(sl);
        if (sl == me || sl->s >= me->s ||
            rate__fair_is_light(&f->shape, asked, sl->lsum, age(sl),
                                sl->weight, total_w, cap))
            continue;
        r += rate__fair_term(&f->shape, now / 1000, cap, sl->weight, total_w,
                             me->s - sl->s, asked);
    }
    *terms = r > RATE__FAIR_LIGHT_MAX ? RATE__FAIR_LIGHT_MAX : (uint64_t)r;
    return RATE_OK;
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
    uint64_t g = rate__fair_light_request(l, &f->shape, light, permits,
                                          sl->lgave,
                                          sl->asked_cur + sl->asked_prev);
    sl->lgave = g > UINT32_MAX ? UINT32_MAX : (uint32_t)g;
    ST(f->h->light_bound, rate__fair_light_bound(l, &f->shape, f->h->cap));
    return light;
}

/* The room a request of the entry that is not light must leave in the
 * shared limit of capacity cap, whose room after the request is
 * `remaining` (lock held), into *need.  The walk for the catch-up terms
 * is spared when the room exceeds the light part plus every permit asked
 * in this period and the last (and queued), a bound of any terms' sum. */
static int need_of(rate_fair_t *f, const fslot_t *sl, uint64_t cap,
                   uint64_t now, uint64_t remaining, uint64_t *need)
{
    fhdr_t *h = f->h;
    uint64_t light = rate__fair_need(&h->light, &f->shape, now / 1000, cap, 0);
    uint64_t bound = LD(h->asked_seq) - h->seq_prev + h->queued, terms;
    *need = light;
    if (remaining >= light && remaining - light >= bound)
        return RATE_OK;
    int rc = terms_for(f, sl, cap, now, &terms);
    if (rc == RATE_OK)
        *need = rate__fair_need(&h->light, &f->shape, now / 1000, cap, terms);
    return rc;
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

/* A request the shared limit admitted whose table work then failed
 * (RATE_ECORRUPT): its permits are given back, and the failure is the
 * answer (the permits stay spent if the refund fails: the limit is kept
 * either way). */
static int admitted_fail(rate_fair_t *f, uint64_t permits, uint64_t now,
                         int rc)
{
    (void)shared_refund(f, permits, now);
    return rc;
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
        int rc = out->allowed ? charge(f, sl, permits) : RATE_OK;
        return rc == RATE_OK ? RATE_OK : admitted_fail(f, permits, now, rc);
    }
    int rc = shared_check(f, permits, now, out);
    if (rc != RATE_OK || !out->allowed)
        return rc;
    if (!light && out->reason == RATE_REASON_ALLOWED &&
        out->limit != RATE_NO_LIMIT && !out->shadow) {
        uint64_t need;
        rc = need_of(f, sl, out->limit, now, out->remaining, &need);
        if (rc != RATE_OK)
            return admitted_fail(f, permits, now, rc);
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
    rc = charge(f, sl, permits);
    return rc == RATE_OK ? RATE_OK : admitted_fail(f, permits, now, rc);
}

/* The next waiter's admission (lock held), when its flow is not light,
 * must leave the room the rule keeps (rate__fair_need), as a request
 * that does not wait must: else it is given back and *out says when the
 * room is expected.  A damaged table's walk fails (its permits given
 * back). */
static int keep_light_room(rate_fair_t *f, fslot_t *sl, uint64_t permits,
                           uint64_t now, rate_decision_t *out)
{
    uint64_t need;
    if (!out->allowed || out->reason != RATE_REASON_ALLOWED ||
        out->limit == RATE_NO_LIMIT || out->shadow ||
        rate__fair_is_light(&f->shape, recent(sl), sl->lsum, age(sl),
                            sl->weight, f->h->total_w, out->limit))
        return RATE_OK;
    int rc = need_of(f, sl, out->limit, now, out->remaining, &need);
    if (rc != RATE_OK)
        return admitted_fail(f, permits, now, rc);
    if (out->remaining < need && shared_refund(f, permits, now) == RATE_OK)
        fair_deny(f, out, permits, need);
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

static int wake_next(rate_fair_t *f);

/* The flow's entry (*out) brought to now, its request counted as
 * asked. */
static int enter(rate_fair_t *f, const char *flow, size_t len,
                 uint32_t weight, uint64_t permits, uint64_t now,
                 fslot_t **out)
{
    uint64_t ep = epoch_at(f, now);
    int rc = expire(f, ep, now);
    if (rc != RATE_OK)
        return rc;
    fslot_t *sl = find_slot(f, flow, len, weight ? weight : 1);
    if ((rc = fold(f, sl)) != RATE_OK || (rc = touch(f, sl, ep)) != RATE_OK)
        return rc;
    sl->asked_cur += permits;
    sl->lsum = rate__fair_long_add(sl->lsum, permits);
    __atomic_add_fetch(&f->h->asked_seq, permits, __ATOMIC_RELAXED);
    *out = sl;
    return RATE_OK;
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
    uint32_t n = f->slots;
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
    fslot_t *sl;
    int rc = table_lock(f);
    if (rc != RATE_OK)
        return rc;
    rc = enter(f, flow, len, weight, permits, now, &sl);
    if (rc == RATE_OK)
        rc = decide(f, sl, permits, now, full, out);
    /* an admission may have made another queue next */
    if (rc == RATE_OK && LD(f->h->waiting) > 0 &&
        (rc = wake_next(f)) != RATE_OK && out->allowed)
        rc = admitted_fail(f, permits, now, rc);
    table_unlock(f);
    return rc;
}

/* ---------------------------------------------------------------- waiting */

/* Removes the k-th waiter of the entry's queue (0: its head), keeping
 * the order; its seat is free again. */
static int ring_remove(rate_fair_t *f, fslot_t *sl, uint32_t k)
{
    size_t b = base_of(f, sl);
    uint32_t qm = f->qmax;
    fqueue_t q;
    fwait_t *w;
    int rc = queue_of(f, sl, &q);
    if (rc == RATE_OK && k >= q.len)
        rc = RATE_ECORRUPT;
    if (rc == RATE_OK)
        rc = queue_seat(f, sl, &q, k, &w);
    if (rc != RATE_OK)
        return rc;
    uint64_t permits = LD(w->permits);
    f->h->queued -= permits;
    sl->qpermits -= permits;
    w->ticket = 0;
    w->arec = 0;
    if (k == 0) {
        sl->qhead = (q.head + 1) % qm;
    } else {
        for (uint32_t j = k; j + 1 < q.len; j++)
            f->ring[b + (q.head + j) % qm] =
                f->ring[b + (q.head + j + 1) % qm];
    }
    sl->qlen = q.len - 1;
    ST(f->h->waiting, f->h->waiting - 1);
    return k == 0 ? retag(f, sl) : RATE_OK;
}

/* A new waiter's ticket: never 0, which marks a free seat. */
static uint64_t ticket_next(rate_fair_t *f)
{
    uint64_t t = f->h->ticket_seq + 1;
    if (t == 0)
        t = 1;
    f->h->ticket_seq = t;
    return t;
}

/* Appends a waiter to the entry's queue (*out: the seat it took):
 * RATE_ECORRUPT when the queue is full or none of its seats is free. */
static int ring_push(rate_fair_t *f, fslot_t *sl, uint64_t ticket,
                     uint64_t permits, uint64_t deadline, fwait_t **out)
{
    size_t b = base_of(f, sl);
    uint32_t qm = f->qmax, seat = 0;
    fqueue_t q;
    if (queue_of(f, sl, &q) != RATE_OK || q.len == qm)
        return RATE_ECORRUPT;
    while (seat < qm && LD(f->wait[b + seat].ticket) != 0)
        seat++; /* one is free while the queue is not full */
    if (seat == qm)
        return RATE_ECORRUPT;
    fwait_t *w = &f->wait[b + seat];
    w->ticket = ticket;
    w->permits = permits;
    w->deadline = deadline;
    w->pid = (int32_t)getpid();
    w->arec = 0;
    f->ring[b + (q.head + q.len) % qm] = (uint16_t)seat;
    sl->qlen = q.len + 1;
    sl->qpermits += permits;
    f->h->queued += permits;
    ST(f->h->waiting, f->h->waiting + 1);
    *out = w;
    return q.len == 0 ? retag(f, sl) : RATE_OK;
}

/* Takes the waiter with this ticket out of the entry's queue, if it is
 * there (*dropped). */
static int ring_drop(rate_fair_t *f, fslot_t *sl, uint64_t ticket,
                     bool *dropped)
{
    fqueue_t q;
    int rc = queue_of(f, sl, &q);
    *dropped = false;
    for (uint32_t j = 0; rc == RATE_OK && j < q.len; j++) {
        fwait_t *w;
        rc = queue_seat(f, sl, &q, j, &w);
        if (rc == RATE_OK && LD(w->ticket) == ticket) {
            *dropped = true;
            return ring_remove(f, sl, j);
        }
    }
    return rc;
}

/* A waiter whose own thread can no longer answer it: past its deadline
 * (its owner is late or gone) or, on a shared table, of a process that
 * no longer exists (or of none: a damaged seat). */
static bool stale(rate_fair_t *f, const fwait_t *w, uint64_t now)
{
    if (LD(w->deadline) < now)
        return true;
    if (!f->mapped && !f->borrowed)
        return false;
    int32_t pid = LD(w->pid);
    return pid <= 0 || (pid != (int32_t)getpid() && kill((pid_t)pid, 0) != 0 &&
                        errno == ESRCH);
}

static long futex(uint32_t *word, int op, uint32_t val,
                  const struct timespec *ts, uint32_t val3)
{
    return syscall(SYS_futex, word, op, val, ts, NULL, val3);
}

static bool async_wake(rate_fair_t *f, uint64_t name);

/* Wakes the waiter: an asynchronous one of this fair limit through its
 * loop, else every thread on its seat's word (a seat freed and taken
 * again may still have its former owner asleep on it). */
static void wake_seat(rate_fair_t *f, fwait_t *w)
{
    uint64_t name = LD(w->arec);
    if (name != 0 && LD(w->pid) == (int32_t)getpid() && async_wake(f, name))
        return;
    __atomic_add_fetch(&w->wake, 1, __ATOMIC_RELEASE);
    int op = FUTEX_WAKE | (f->mapped || f->borrowed ? 0 : FUTEX_PRIVATE_FLAG);
    futex(&w->wake, op, INT32_MAX, NULL, 0);
}

/* Drops the waiter at the head of the entry's queue if it is stale:
 * counted as timed out, its owner, if alive, woken to answer itself
 * (too late).  *dropped: whether it was. */
static int head_drop_stale(rate_fair_t *f, fslot_t *sl, uint64_t now,
                           bool *dropped)
{
    fqueue_t q;
    fwait_t *w;
    int rc = queue_of(f, sl, &q);
    *dropped = false;
    if (rc != RATE_OK || q.len == 0)
        return q.len == 0 && rc == RATE_OK ? RATE_ECORRUPT : rc;
    if ((rc = queue_seat(f, sl, &q, 0, &w)) != RATE_OK || !stale(f, w, now))
        return rc;
    if ((rc = ring_remove(f, sl, 0)) != RATE_OK)
        return rc;
    f->h->timed_out++;
    wake_seat(f, w);
    *dropped = true;
    return RATE_OK;
}

/* The next waiter (*out: the head of the queue with the smallest finish
 * time, stale heads dropped on the way), or NULL.  Every seat is
 * dropped at most once. */
static int next_waiter(rate_fair_t *f, uint64_t now, fwait_t **out)
{
    const heap_t hp = wheap(f);
    size_t seats = (size_t)f->slots * f->qmax;
    *out = NULL;
    for (size_t n = 0; n <= seats; n++) {
        fslot_t *sl;
        fqueue_t q;
        bool dropped;
        int rc = heap_top(f, &hp, &sl);
        if (rc != RATE_OK || sl == NULL)
            return rc;
        if ((rc = head_drop_stale(f, sl, now, &dropped)) != RATE_OK)
            return rc;
        if (!dropped) /* a queue in the heap has a head */
            return queue_of(f, sl, &q) == RATE_OK
                       ? queue_seat(f, sl, &q, 0, out)
                       : RATE_ECORRUPT;
    }
    return RATE_ECORRUPT;
}

/* Drops the stale waiters at the head of the entry's queue (a new
 * waiter of its flow arrives). */
static int queue_drop_stale(rate_fair_t *f, fslot_t *sl, uint64_t now)
{
    bool dropped = true;
    int rc = RATE_OK;
    for (uint32_t n = 0; rc == RATE_OK && dropped && n < f->qmax; n++)
        rc = LD(sl->qlen) == 0 ? RATE_OK
                               : head_drop_stale(f, sl, now, &dropped);
    return rc;
}

/* Wakes the next waiter when it is not the one last woken or seen (the
 * only waiter that asks the shared limit). */
static int wake_next(rate_fair_t *f)
{
    fwait_t *w;
    int rc = next_waiter(f, now_of(f), &w);
    if (rc == RATE_OK && w != NULL && LD(w->ticket) != f->h->top_ticket) {
        f->h->top_ticket = LD(w->ticket);
        wake_seat(f, w);
    }
    return rc;
}

/* Sleeps on the seat's word (lock released meanwhile) until the fair
 * clock reads `until` or the seat is woken; the lock is then taken
 * again, waited for until `deadline` at most. */
static int wait_until(rate_fair_t *f, fwait_t *w, uint64_t now, uint64_t until,
                      uint64_t deadline)
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
    return table_lock_by(f, deadline);
}

static void denied(rate_decision_t *out, uint64_t retry_ns)
{
    memset(out, 0, sizeof *out);
    out->allowed = false;
    out->reason = RATE_REASON_LIMITED;
    out->component = 0;
    out->retry_after_ns = retry_ns;
}

static int unlock_with(rate_fair_t *f, int rc)
{
    table_unlock(f);
    return rc;
}

/* A waiter whose lock could not be taken: at its deadline it is denied,
 * as any waiter answered then (its seat, if it has one, stays to
 * expire); before it, the failure is the answer. */
static int lock_failed(rate_fair_t *f, int rc, uint64_t deadline,
                       rate_decision_t *out)
{
    if (rc == RATE_ETIMEDOUT && now_of(f) >= deadline) {
        denied(out, 0);
        return RATE_OK;
    }
    return rc;
}

/* A waiter answered too late (lock held, released here): denied, the
 * next waiter woken; or rc, the table's failure. */
static int answer_late(rate_fair_t *f, int rc, rate_decision_t *out)
{
    if (rc == RATE_OK)
        rc = wake_next(f);
    table_unlock(f);
    denied(out, 0);
    return rc;
}

/* The next waiter answered by the shared limit (its decision d, or its
 * error rc; lock held): its seat leaves the queue, an admission is
 * charged, the waiter after it woken.  A table that fails meanwhile
 * gives an admission's permits back and is the answer. */
static int served(rate_fair_t *f, fslot_t *sl, uint64_t permits, uint64_t now,
                  int rc, const rate_decision_t *d)
{
    bool admitted = rc == RATE_OK && d->allowed;
    int trc = ring_remove(f, sl, 0);
    if (trc == RATE_OK && admitted)
        trc = charge(f, sl, permits);
    if (trc == RATE_OK)
        trc = wake_next(f);
    if (trc != RATE_OK)
        return admitted ? admitted_fail(f, permits, now, trc) : trc;
    return rc;
}

/* The shared limit asked for the next waiter (lock held): its answer
 * (1, in *rc and *out), or 0 with *until moved to the limit's retry
 * time when that comes before it. */
static int ask_next(rate_fair_t *f, fslot_t *sl, uint64_t permits,
                    uint64_t now, uint64_t *until, int *rc,
                    rate_decision_t *out)
{
    if ((*rc = touch(f, sl, epoch_at(f, now))) != RATE_OK)
        return 1;
    *rc = shared_check(f, permits, now, out);
    if (*rc == RATE_OK)
        *rc = keep_light_room(f, sl, permits, now, out);
    if (*rc != RATE_OK || out->allowed || out->reason != RATE_REASON_LIMITED) {
        *rc = served(f, sl, permits, now, *rc, out);
        return 1;
    }
    if (out->retry_after_ns < *until - now)
        *until = now + (out->retry_after_ns ? out->retry_after_ns : 1);
    return 0;
}

static int fair_acquire(rate_fair_t *f, const char *flow, size_t len,
                        uint32_t weight, uint64_t permits, uint64_t timeout,
                        rate_decision_t *out)
{
    uint64_t now = now_of(f);
    uint64_t deadline = timeout > RATE_TIME_MAX - now ? RATE_TIME_MAX
                                                      : now + timeout;
    fslot_t *sl;
    fwait_t *me, *next;
    int rc = table_lock_by(f, deadline);
    if (rc != RATE_OK)
        return lock_failed(f, rc, deadline, out);
    if ((rc = enter(f, flow, len, weight, permits, now, &sl)) != RATE_OK)
        return unlock_with(f, rc);
    if (LD(f->h->waiting) == 0) {
        rc = decide(f, sl, permits, now, true, out);
        if (rc != RATE_OK || out->allowed ||
            out->reason != RATE_REASON_LIMITED || timeout == 0 ||
            out->retry_after_ns > deadline - now)
            return unlock_with(f, rc);
    }
    if ((rc = queue_drop_stale(f, sl, now)) != RATE_OK)
        return unlock_with(f, rc);
    if (LD(sl->qlen) >= f->qmax) {
        f->h->queue_full++;
        table_unlock(f);
        denied(out, f->period_ns);
        return RATE_OK;
    }
    uint64_t ticket = ticket_next(f);
    if ((rc = ring_push(f, sl, ticket, permits, deadline, &me)) != RATE_OK)
        return unlock_with(f, rc);
    for (;;) {
        if (LD(me->ticket) != ticket) /* dropped as stale: too late */
            return answer_late(f, RATE_OK, out);
        if (now >= deadline) {
            bool gone;
            rc = ring_drop(f, sl, ticket, &gone);
            f->h->timed_out++;
            return answer_late(f, rc, out);
        }
        uint64_t until = deadline;
        if ((rc = next_waiter(f, now, &next)) != RATE_OK)
            return unlock_with(f, rc);
        if (next == me) {
            f->h->top_ticket = ticket;
            if (ask_next(f, sl, permits, now, &until, &rc, out))
                return unlock_with(f, rc);
        } else {
            /* The next waiter may be new (one dropped as stale): woken.
             * On a shared table, look again now and then: the process
             * of the next waiter may be killed, and nothing else wakes
             * the waiters behind it. */
            if ((rc = wake_next(f)) != RATE_OK)
                return unlock_with(f, rc);
            if ((f->mapped || f->borrowed) && until - now > DEAD_POLL_NS)
                until = now + DEAD_POLL_NS;
        }
        rc = wait_until(f, me, now, until, deadline);
        if (rc != RATE_OK) /* the lock not taken: the seat stays to expire */
            return lock_failed(f, rc, deadline, out);
        now = now_of(f);
        if ((rc = expire(f, epoch_at(f, now), now)) != RATE_OK)
            return unlock_with(f, rc);
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
    uint32_t num;             /* its number (fasync_t's recs); 0: none */
    bool ready;
    bool dead; /* answered by async_fail: its seat may still name it */
} arec_t;

/* The record's name in its seat: the handle's tag and its number. */
static uint64_t arec_name(const fasync_t *as, const arec_t *r)
{
    return (uint64_t)as->tag << 32 | r->num;
}

/* The record a seat's name gives (as->mu held), or NULL: another
 * handle's, a record gone, or a damaged seat. */
static arec_t *arec_named(const fasync_t *as, uint64_t name)
{
    uint32_t num = (uint32_t)name;
    if ((uint32_t)(name >> 32) != as->tag || num == 0 || num > as->nrecs)
        return NULL;
    return as->recs[num - 1];
}

/* Makes room for one more number (the loop's thread, before the
 * table's lock is taken): RATE_ENOMEM when the numbers cannot grow. */
static int arec_reserve(fasync_t *as)
{
    int rc = RATE_OK;
    pthread_mutex_lock(&as->mu);
    if (as->nfree == 0 && as->nrecs == as->cap) {
        uint32_t cap = as->cap ? as->cap * 2 : 16;
        arec_t **recs = cap > UINT32_MAX / 2
                            ? NULL
                            : realloc(as->recs, cap * sizeof *recs);
        uint32_t *nums = NULL;
        if (recs != NULL) {
            as->recs = recs;
            nums = realloc(as->free_nums, cap * sizeof *nums);
        }
        if (nums != NULL) {
            as->free_nums = nums;
            as->cap = cap;
        } else {
            rc = RATE_ENOMEM;
        }
    }
    pthread_mutex_unlock(&as->mu);
    return rc;
}

/* Gives the record a number, a free one first (room reserved), when its
 * seat is taken: under the table's lock, which every waker holds, so
 * that no seat names it before it is pending. */
static void arec_number(fasync_t *as, arec_t *r)
{
    pthread_mutex_lock(&as->mu);
    r->num = as->nfree > 0 ? as->free_nums[--as->nfree] : ++as->nrecs;
    as->recs[r->num - 1] = r;
    pthread_mutex_unlock(&as->mu);
}

/* Takes the record's number back (as->mu held): no seat reaches it. */
static void arec_unnumber(fasync_t *as, arec_t *r)
{
    if (r->num == 0)
        return;
    as->recs[r->num - 1] = NULL;
    as->free_nums[as->nfree++] = r->num;
    r->num = 0;
}

/* Called by a waker (table lock held, any thread of the process) for a
 * seat that names `name`: when that is a record of this fair limit,
 * queues it as woken and pokes the loop's eventfd.  false when it names
 * none (a waiter of another fair limit of this process on the same
 * table: it looks again by itself, ASYNC_POLL_NS). */
static bool async_wake(rate_fair_t *f, uint64_t name)
{
    fasync_t *as = __atomic_load_n(&f->as, __ATOMIC_ACQUIRE);
    if (as == NULL)
        return false;
    pthread_mutex_lock(&as->mu);
    arec_t *r = arec_named(as, name);
    if (r != NULL && !r->ready && !r->dead) {
        r->ready = true;
        r->rnext = as->ready;
        as->ready = r;
    }
    pthread_mutex_unlock(&as->mu);
    if (r == NULL)
        return false;
    uint64_t one = 1;
    ssize_t n = write(as->efd, &one, sizeof one);
    (void)n; /* a full counter is still readable: the loop wakes */
    return true;
}

/* Takes the waiter off the ready and pending lists and frees its timer;
 * dead: marked so under the lock, so that no waker readies it again
 * (else its number is taken back: no seat reaches it). */
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
    else
        arec_unnumber(f->as, r);
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

/* Answers the waiter (its seat already gone, or left to expire; lock
 * released): unlinked, its timer freed, then its callback (a zeroed
 * decision with an error), then the record freed. */
static void async_finish(arec_t *r, int rc, rate_decision_t *d)
{
    if (rc != RATE_OK)
        memset(d, 0, sizeof *d);
    async_unlink(r, false);
    r->cb(r->ud, rc, d);
    free(r);
}

/* Answers the waiter (rc and d) when the table's lock cannot be taken:
 * its seat cannot be removed then and still names the record, which a
 * waker reaches (async_wake) if the lock is ever taken again, so the
 * record is kept, dead, until rate_fair_free (async_bury). */
static void async_fail(arec_t *r, int rc, rate_decision_t *d)
{
    rate_fair_t *f = r->f;
    if (rc != RATE_OK)
        memset(d, 0, sizeof *d);
    async_unlink(r, true);
    r->cb(r->ud, rc, d);
    r->next = f->as->dead;
    f->as->dead = r;
}

/* Frees the dead records (rate_fair_free): each seat still theirs is
 * removed under the lock, or, when it still cannot be taken (nobody
 * holds it then), unmarked; their numbers are taken back, so that no
 * waker reaches a freed record. */
static void async_bury(rate_fair_t *f)
{
    while (f->as->dead != NULL) {
        arec_t *r = f->as->dead;
        f->as->dead = r->next;
        bool gone;
        if (table_lock(f) == RATE_OK) {
            if (LD(r->seat->ticket) == r->ticket)
                (void)ring_drop(f, r->sl, r->ticket, &gone);
            table_unlock(f);
        } else if (LD(r->seat->ticket) == r->ticket) {
            __atomic_store_n(&r->seat->arec, 0, __ATOMIC_RELAXED);
        }
        pthread_mutex_lock(&f->as->mu);
        arec_unnumber(f->as, r);
        pthread_mutex_unlock(&f->as->mu);
        free(r);
    }
}

/* One look at the waiter, as the thread waiter's loop does once a wake:
 * answered (too late, admitted, the shared limit's other answer, or the
 * table's failure), or its timer armed for its deadline or the limit's
 * retry time. */
static void async_step(arec_t *r)
{
    rate_fair_t *f = r->f;
    rate_decision_t d;
    fwait_t *next;
    memset(&d, 0, sizeof d);
    int rc = table_lock_by(f, r->deadline);
    if (rc != RATE_OK) {
        async_fail(r, lock_failed(f, rc, r->deadline, &d), &d);
        return;
    }
    uint64_t now = now_of(f);
    if ((rc = expire(f, epoch_at(f, now), now)) != RATE_OK) {
        table_unlock(f);
        async_finish(r, rc, &d);
        return;
    }
    if (LD(r->seat->ticket) != r->ticket || now >= r->deadline) {
        bool gone = false; /* (a seat dropped as stale was counted then) */
        if (LD(r->seat->ticket) == r->ticket &&
            (rc = ring_drop(f, r->sl, r->ticket, &gone)) == RATE_OK && gone)
            f->h->timed_out++;
        async_finish(r, answer_late(f, rc, &d), &d);
        return;
    }
    uint64_t until = r->deadline;
    if ((rc = next_waiter(f, now, &next)) != RATE_OK) {
        table_unlock(f);
        async_finish(r, rc, &d);
        return;
    }
    if (next == r->seat) {
        f->h->top_ticket = r->ticket;
        if (ask_next(f, r->sl, r->permits, now, &until, &rc, &d)) {
            table_unlock(f);
            async_finish(r, rc, &d);
            return;
        }
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

/* rate_fair_acquire_start's decision (lock held): answered now (*out),
 * or the record queued in its flow's queue and the handle's pending
 * list (*queued), its seat named after it. */
static int start_locked(arec_t *r, const char *flow, size_t len,
                        uint32_t weight, uint64_t max_wait_ns, uint64_t now,
                        rate_decision_t *out, bool *queued)
{
    rate_fair_t *f = r->f;
    fslot_t *sl;
    int rc = enter(f, flow, len, weight, r->permits, now, &sl);
    if (rc != RATE_OK)
        return rc;
    if (LD(f->h->waiting) == 0) {
        rc = decide(f, sl, r->permits, now, true, out);
        if (rc != RATE_OK || out->allowed ||
            out->reason != RATE_REASON_LIMITED || max_wait_ns == 0 ||
            out->retry_after_ns > r->deadline - now)
            return rc;
    }
    if ((rc = queue_drop_stale(f, sl, now)) != RATE_OK)
        return rc;
    if (LD(sl->qlen) >= f->qmax) {
        f->h->queue_full++;
        denied(out, f->period_ns);
        return RATE_OK;
    }
    r->sl = sl;
    r->ticket = ticket_next(f);
    rc = ring_push(f, sl, r->ticket, r->permits, r->deadline, &r->seat);
    if (rc != RATE_OK)
        return rc;
    arec_number(f->as, r);
    r->seat->arec = arec_name(f->as, r);
    r->next = f->as->pending;
    if (f->as->pending != NULL)
        f->as->pending->prev = r;
    f->as->pending = r;
    *queued = true;
    return RATE_OK;
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
    if (getrandom(&as->tag, sizeof as->tag, GRND_NONBLOCK) !=
        (ssize_t)sizeof as->tag)
        as->tag = (uint32_t)rate_clock_monotonic_ns() ^ (uint32_t)(uintptr_t)as;
    if (as->tag == 0)
        as->tag = 1;
    /* published after it is whole: wakers of other threads read it */
    __atomic_store_n(&f->as, as, __ATOMIC_RELEASE);
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
    if (r->timer == NULL || arec_reserve(f->as) != RATE_OK) {
        if (r->timer != NULL)
            loop->timer_free(loop->ud, r->timer);
        free(r);
        return RATE_ENOMEM;
    }
    *r = (arec_t){.f = f, .timer = r->timer, .cb = cb, .ud = ud,
                  .permits = permits};
    uint64_t now = now_of(f);
    r->deadline = max_wait_ns > RATE_TIME_MAX - now ? RATE_TIME_MAX
                                                    : now + max_wait_ns;
    bool queued = false;
    rc = table_lock_by(f, r->deadline);
    if (rc != RATE_OK) {
        rc = lock_failed(f, rc, r->deadline, out);
    } else {
        rc = start_locked(r, flow, flow_len, weight, max_wait_ns, now, out,
                          &queued);
        table_unlock(f);
    }
    if (!queued) {
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

/* A seat taken, by its ticket (table_repair's sort). */
typedef struct seat_order {
    uint64_t ticket;
    uint32_t seat;
} seat_order_t;

static int seat_order_cmp(const void *a, const void *b)
{
    uint64_t x = ((const seat_order_t *)a)->ticket;
    uint64_t y = ((const seat_order_t *)b)->ticket;
    return x < y ? -1 : x > y;
}

/* Rebuilds the table's indexes from its entries and seats, after a
 * process died holding the lock (a scan of the table, that once): each
 * queue in ticket order (its arrival order), the active set as the
 * entries that asked in this period or the one before or have waiters.
 * Each queue is sorted apart from the table, then written to it. */
static int table_repair(rate_fair_t *f)
{
    fhdr_t *h = f->h;
    uint32_t n = f->slots, q = f->qmax;
    uint64_t epoch = LD(h->epoch);
    seat_order_t order[RATE_FAIR_QUEUE_MAX];
    int rc = RATE_OK;
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
            uint64_t ticket = LD(w->ticket);
            if (ticket == 0)
                continue;
            order[cnt++] = (seat_order_t){ticket, seat};
            sl->qpermits += LD(w->permits);
        }
        qsort(order, cnt, sizeof order[0], seat_order_cmp);
        for (uint32_t j = 0; j < cnt; j++)
            f->ring[b + j] = (uint16_t)order[j].seat;
        sl->qhead = 0;
        sl->qlen = cnt;
        h->queued += sl->qpermits;
        ST(h->waiting, h->waiting + cnt);
    }
    const heap_t hp = aheap(f);
    for (uint32_t i = 0; i < n && rc == RATE_OK; i++) {
        fslot_t *sl = &f->slot[i];
        if (sl->hash == 0 || (sl->epoch + 1 < epoch && sl->qlen == 0))
            continue;
        if ((rc = heap_push(f, &hp, sl)) == RATE_OK)
            rc = list_append(f, sl);
        h->total_w += sl->weight;
    }
    if (rc == RATE_OK)
        rc = vtime_update(f);
    for (uint32_t i = 0; i < n && rc == RATE_OK; i++)
        if (f->slot[i].qlen > 0)
            rc = retag(f, &f->slot[i]);
    return rc;
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
    table_bind(f, slots, qmax);
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
    if (header_check(&hd, len, false, slots, qmax, f->lock_kind, why,
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
    table_bind(f, slots, qmax);
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
    f->lock_kind = lock_kind_made();
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
                         .slots = f->slots};
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
            /* its seat stays: buried below */
            async_fail(r, RATE_ECANCELED, &d);
            continue;
        }
        /* a damaged table leaves the seat to expire: it names a number
         * no longer given */
        bool gone;
        if (LD(r->seat->ticket) != r->ticket ||
            ring_drop(f, r->sl, r->ticket, &gone) == RATE_OK)
            (void)wake_next(f);
        table_unlock(f);
        async_finish(r, RATE_ECANCELED, &d);
    }
    if (f->as != NULL) {
        async_bury(f);
        f->as->loop.io_free(f->as->loop.ud, f->as->io);
        close(f->as->efd);
        pthread_mutex_destroy(&f->as->mu);
        free(f->as->recs);
        free(f->as->free_nums);
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
    int rc = table_lock(f);
    if (rc != RATE_OK)
        return rc;
    /* the active entries at the fair clock's now, counted without
     * expiring any: a look changes nothing */
    uint64_t ep = epoch_at(f, now_of(f));
    lwalk_t w = lwalk_start(f);
    for (fslot_t *sl; (rc = lwalk_next(f, &w, &sl)) == RATE_OK && sl != NULL;)
        out->flows += sl->epoch + 1 >= ep || LD(sl->qlen) > 0;
    if (rc != RATE_OK) {
        table_unlock(f);
        memset(out, 0, sizeof *out);
        return rc;
    }
    out->slots = f->slots;
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
