/* SPDX-License-Identifier: MIT */
/*
 * The fair table's layout and its checked accessors, for the rooms of
 * src/fair/ (fair.c has the map).  The table is one flat block without
 * pointers (a header, `slots` entries, two heaps of entry numbers, then
 * each entry's ring of seat numbers and its seats), so that the same code
 * runs on it in a process (calloc) and in a mapped file shared by
 * processes.
 *
 * A table shared by processes is only as sound as its file (docs/fair.md,
 * "A damaged table"): its sizes are checked when a fair limit attaches
 * and kept in the handle, and every entry number, link, heap position,
 * queue position and seat number read from it is loaded once, checked
 * by its accessor (entry_at, link_at, heap_pos, queue_of, queue_seat)
 * and used as loaded; every walk is bounded by the table's sizes.  What
 * fails a check is RATE_ECORRUPT, never a read or write outside the
 * table or an endless loop.
 */
#ifndef RATE_FAIR_TABLE_H
#define RATE_FAIR_TABLE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "ratelimit.h"
#include "ratelimit_fair.h"
#include "rule.h" /* the rule's arithmetic, shared with the fleet's table */
#include "step.h"

#define FAIR_MAGIC UINT64_C(0x3376726961667272) /* "rrfairv3" */
#define MAGIC_STEM UINT64_C(0xffffffffffff)     /* "rrfair": a version apart */
#define FIX 20                                  /* 2^20 per permit */
#define PROBES 8u
#define POLL_NS (1000000u) /* a custom clock's waits: re-read every 1 ms */

_Static_assert(FIX == RATE__FAIR_FIX, "one fixed point for both tables");

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

/* The fields fast_try reads without the lock are written with these (and
 * asked_seq, room_until read with them under the lock too). */
#define LD(x) __atomic_load_n(&(x), __ATOMIC_RELAXED)
#define ST(x, v) __atomic_store_n(&(x), (v), __ATOMIC_RELAXED)

static inline uint64_t now_of(const rate_fair_t *f)
{
    return f->own_clock ? f->clock.now_ns(f->clock.ud)
                        : rate_clock_monotonic_ns();
}

/* ceil(permits x 2^FIX / weight), kept far below overflow. */
static inline uint64_t cost_of(uint64_t permits, uint32_t weight)
{
    if (weight == 1 && permits < (UINT64_C(1) << 42))
        return permits << FIX;
    unsigned __int128 c = ((unsigned __int128)permits << FIX) + weight - 1;
    c /= weight;
    return c > (UINT64_C(1) << 62) ? UINT64_C(1) << 62 : (uint64_t)c;
}

static inline uint32_t idx_of(const rate_fair_t *f, const fslot_t *sl)
{
    return (uint32_t)(sl - f->slot);
}

/* An entry by its number (a heap's element, 0-based); NULL past the
 * table. */
static inline fslot_t *entry_at(const rate_fair_t *f, uint32_t e)
{
    return e < f->slots ? &f->slot[e] : NULL;
}

/* An entry by a link of the active list (1-based; *out NULL for NIL):
 * RATE_ECORRUPT past the table. */
static inline int link_at(const rate_fair_t *f, uint32_t link, fslot_t **out)
{
    if (link > f->slots)
        return RATE_ECORRUPT;
    *out = link == NIL ? NULL : &f->slot[link - 1];
    return RATE_OK;
}

/* An entry's weight, 1..RATE_FAIR_WEIGHT_MAX: a damaged one counts as 1
 * (it divides a cost). */
static inline uint32_t weight_of(const fslot_t *sl)
{
    uint32_t w = LD(sl->weight);
    return w - 1 < RATE_FAIR_WEIGHT_MAX ? w : 1;
}

/* An entry's queue as loaded once: where its ring starts, how many
 * wait. */
typedef struct fqueue {
    uint32_t head, len;
} fqueue_t;

static inline size_t base_of(const rate_fair_t *f, const fslot_t *sl)
{
    return (size_t)idx_of(f, sl) * f->qmax;
}

/* The entry's queue: RATE_ECORRUPT for a start or count past
 * queue_max. */
static inline int queue_of(const rate_fair_t *f, const fslot_t *sl, fqueue_t *q)
{
    q->head = LD(sl->qhead);
    q->len = LD(sl->qlen);
    return q->head < f->qmax && q->len <= f->qmax ? RATE_OK : RATE_ECORRUPT;
}

/* The seat of the queue's k-th waiter (k < q->len; 0: its head):
 * RATE_ECORRUPT for a seat number past queue_max. */
static inline int queue_seat(const rate_fair_t *f, const fslot_t *sl,
                             const fqueue_t *q, uint32_t k, fwait_t **out)
{
    size_t b = base_of(f, sl);
    uint32_t seat = LD(f->ring[b + (q->head + k) % f->qmax]);
    if (seat >= f->qmax)
        return RATE_ECORRUPT;
    *out = &f->wait[b + seat];
    return RATE_OK;
}

static inline void set_err(char *err, size_t errlen, const char *fmt,
                           const char *arg)
{
    if (err != NULL && errlen > 0)
        snprintf(err, errlen, fmt, arg);
}

/* table.c: the table's size for slots and queue_max, and the handle's
 * views of its parts from its checked sizes. */
size_t rate__ft_size(unsigned slots, unsigned queue_max);
void rate__ft_bind(rate_fair_t *f, unsigned slots, unsigned queue_max);
/* A new table's header and lock (pshared: a lock for processes). */
int rate__ft_init(fhdr_t *h, unsigned slots, unsigned queue_max,
                  size_t size, bool pshared);
/* The type glibc gives the lock a shared table is made with. */
int rate__ft_lock_kind(void);
/* Whether len bytes holding the header copied to *h are a fair table of
 * slots and queue_max: RATE_OK, or RATE_EINVAL with the reason in why. */
int rate__ft_header_check(const fhdr_t *h, size_t len, bool exact,
                          unsigned slots, unsigned queue_max, int lock_kind,
                          char *why, size_t whylen);
/* Opens or makes the shared table at path (a file). */
int rate__ft_open(rate_fair_t *f, const char *path, unsigned slots,
                  unsigned queue_max, char *err, size_t errlen);
/* A shared table's lock is waited for a slice at a time: LOCK_SLICE_NS
 * (POLL_NS with a clock of one's own), and at most LOCK_STALL_NS of the
 * fair clock while it does not change hands. */
#define LOCK_SLICE_NS (10000000u)
#define LOCK_STALL_NS (UINT64_C(5) * RATE_NS_PER_S)
/* The table's lock, waited for until the fair clock reads deadline (a
 * shared table's; UINT64_MAX: none); repaired when its holder died. */
int rate__ft_lock_by(rate_fair_t *f, uint64_t deadline);
int rate__ft_lock(rate_fair_t *f);
void rate__ft_unlock(rate_fair_t *f);
/* Rebuilds the table's indexes from its entries and seats. */
int rate__ft_repair(rate_fair_t *f);

#endif
