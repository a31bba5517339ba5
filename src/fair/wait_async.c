/* SPDX-License-Identifier: MIT */
/*
 * Waiting on the fair table without blocking (rate_fair_acquire_start;
 * wait_async.h): a waiter takes a seat as a blocking one does, and each
 * look at it runs on the caller's event loop, from a timer or when a
 * waker writes to the handle's eventfd.  A seat names its record by the
 * handle's tag and the record's number, never its address, so that a
 * damaged seat cannot send a waker to memory that is no record.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <unistd.h>

#include "ratelimit_loop.h"

#include "decide.h"
#include "table.h"
#include "vtime.h"
#include "wait.h"
#include "wait_async.h"

/* An asynchronous waiter on a table shared by processes looks again this
 * often: a waiter of another process cannot wake it. */
#define ASYNC_POLL_NS (2000000u)

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
bool rate__ft_async_wake(rate_fair_t *f, uint64_t name)
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
        if (rate__ft_lock(f) == RATE_OK) {
            if (LD(r->seat->ticket) == r->ticket)
                (void)rate__ft_ring_drop(f, r->sl, r->ticket, &gone);
            rate__ft_unlock(f);
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
    int rc = rate__ft_lock_by(f, r->deadline);
    if (rc != RATE_OK) {
        async_fail(r, rate__ft_lock_failed(f, rc, r->deadline, &d), &d);
        return;
    }
    uint64_t now = now_of(f);
    if ((rc = rate__ft_expire(f, rate__ft_epoch_at(f, now), now)) != RATE_OK) {
        rate__ft_unlock(f);
        async_finish(r, rc, &d);
        return;
    }
    if (LD(r->seat->ticket) != r->ticket || now >= r->deadline) {
        bool gone = false; /* (a seat dropped as stale was counted then) */
        if (LD(r->seat->ticket) == r->ticket &&
            (rc = rate__ft_ring_drop(f, r->sl, r->ticket, &gone)) == RATE_OK &&
            gone)
            f->h->timed_out++;
        async_finish(r, rate__ft_answer_late(f, rc, &d), &d);
        return;
    }
    uint64_t until = r->deadline;
    if ((rc = rate__ft_next_waiter(f, now, &next)) != RATE_OK) {
        rate__ft_unlock(f);
        async_finish(r, rc, &d);
        return;
    }
    if (next == r->seat) {
        f->h->top_ticket = r->ticket;
        if (rate__ft_ask_next(f, r->sl, r->permits, now, &until, &rc, &d)) {
            rate__ft_unlock(f);
            async_finish(r, rc, &d);
            return;
        }
    } else if ((f->mapped || f->borrowed) && until - now > ASYNC_POLL_NS) {
        until = now + ASYNC_POLL_NS;
    }
    rate__ft_unlock(f);
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
    int rc = rate__ft_enter(f, flow, len, weight, r->permits, now, &sl);
    if (rc != RATE_OK)
        return rc;
    if (LD(f->h->waiting) == 0) {
        rc = rate__ft_decide(f, sl, r->permits, now, true, out);
        if (rc != RATE_OK || out->allowed ||
            out->reason != RATE_REASON_LIMITED || max_wait_ns == 0 ||
            out->retry_after_ns > r->deadline - now)
            return rc;
    }
    if ((rc = rate__ft_queue_drop_stale(f, sl, now)) != RATE_OK)
        return rc;
    if (LD(sl->qlen) >= f->qmax) {
        f->h->queue_full++;
        rate__ft_denied(out, f->period_ns);
        return RATE_OK;
    }
    r->sl = sl;
    r->ticket = rate__ft_ticket_next(f);
    rc = rate__ft_ring_push(f, sl, r->ticket, r->permits, r->deadline,
                            &r->seat);
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
    for (size_t i = 0; i < sizeof loop->reserved / sizeof loop->reserved[0];
         i++)
        if (loop->reserved[i] != NULL) /* ratelimit_loop.h: refused */
            return RATE_EINVAL;
    int rc = rate__ft_check_input(f, flow, flow_len, weight, permits, 0);
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
    rc = rate__ft_lock_by(f, r->deadline);
    if (rc != RATE_OK) {
        rc = rate__ft_lock_failed(f, rc, r->deadline, out);
    } else {
        rc = start_locked(r, flow, flow_len, weight, max_wait_ns, now, out,
                          &queued);
        rate__ft_unlock(f);
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

void rate__ft_async_free(rate_fair_t *f)
{
    if (f->as == NULL)
        return;
    while (f->as->pending != NULL) { /* answered now */
        arec_t *r = f->as->pending;
        rate_decision_t d;
        memset(&d, 0, sizeof d);
        if (rate__ft_lock(f) != RATE_OK) {
            /* its seat stays: buried below */
            async_fail(r, RATE_ECANCELED, &d);
            continue;
        }
        /* a damaged table leaves the seat to expire: it names a number
         * no longer given */
        bool gone;
        if (LD(r->seat->ticket) != r->ticket ||
            rate__ft_ring_drop(f, r->sl, r->ticket, &gone) == RATE_OK)
            (void)rate__ft_wake_next(f);
        rate__ft_unlock(f);
        async_finish(r, RATE_ECANCELED, &d);
    }
    async_bury(f);
    f->as->loop.io_free(f->as->loop.ud, f->as->io);
    close(f->as->efd);
    pthread_mutex_destroy(&f->as->mu);
    free(f->as->recs);
    free(f->as->free_nums);
    free(f->as);
    f->as = NULL;
}
