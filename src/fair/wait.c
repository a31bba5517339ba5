/* SPDX-License-Identifier: MIT */
/*
 * Waiting on the fair table (wait.h): each entry's queue of waiters (a
 * ring of seat numbers over seats that stay put), the next waiter (the
 * head with the smallest finish time, stale heads dropped on the way),
 * its wake-up (a futex word per seat, or an asynchronous waiter's loop),
 * and the blocking waiter of rate_fair_acquire, which sleeps on its seat
 * until it is next and the shared limit admits it, or its deadline
 * passes.  Only the next waiter asks the shared limit.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <linux/futex.h>
#include <signal.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "decide.h"
#include "index.h"
#include "table.h"
#include "vtime.h"
#include "wait.h"
#include "wait_async.h"

/* A waiter not next on a table shared by processes looks again this
 * often: the next waiter's process may be killed, and only the next
 * waiter asks the shared limit. */
#define DEAD_POLL_NS (10000000u)

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
    return k == 0 ? rate__ft_retag(f, sl) : RATE_OK;
}

/* A new waiter's ticket: never 0, which marks a free seat. */
uint64_t rate__ft_ticket_next(rate_fair_t *f)
{
    uint64_t t = f->h->ticket_seq + 1;
    if (t == 0)
        t = 1;
    f->h->ticket_seq = t;
    return t;
}

/* Appends a waiter to the entry's queue (*out: the seat it took):
 * RATE_ECORRUPT when the queue is full or none of its seats is free. */
int rate__ft_ring_push(rate_fair_t *f, fslot_t *sl, uint64_t ticket,
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
    return q.len == 0 ? rate__ft_retag(f, sl) : RATE_OK;
}

/* Takes the waiter with this ticket out of the entry's queue, if it is
 * there (*dropped). */
int rate__ft_ring_drop(rate_fair_t *f, fslot_t *sl, uint64_t ticket,
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

/* Wakes the waiter: an asynchronous one of this fair limit through its
 * loop, else every thread on its seat's word (a seat freed and taken
 * again may still have its former owner asleep on it). */
static void wake_seat(rate_fair_t *f, fwait_t *w)
{
    uint64_t name = LD(w->arec);
    if (name != 0 && LD(w->pid) == (int32_t)getpid() &&
        rate__ft_async_wake(f, name))
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
int rate__ft_next_waiter(rate_fair_t *f, uint64_t now, fwait_t **out)
{
    const heap_t hp = wheap(f);
    size_t seats = (size_t)f->slots * f->qmax;
    *out = NULL;
    for (size_t n = 0; n <= seats; n++) {
        fslot_t *sl;
        fqueue_t q;
        bool dropped;
        int rc = rate__ft_heap_top(f, &hp, &sl);
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
int rate__ft_queue_drop_stale(rate_fair_t *f, fslot_t *sl, uint64_t now)
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
int rate__ft_wake_next(rate_fair_t *f)
{
    fwait_t *w;
    int rc = rate__ft_next_waiter(f, now_of(f), &w);
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
    rate__ft_unlock(f);
    int op = FUTEX_WAIT_BITSET |
             (f->mapped || f->borrowed ? 0 : FUTEX_PRIVATE_FLAG);
    futex(&w->wake, op, seen, &ts, FUTEX_BITSET_MATCH_ANY);
    return rate__ft_lock_by(f, deadline);
}

void rate__ft_denied(rate_decision_t *out, uint64_t retry_ns)
{
    memset(out, 0, sizeof *out);
    out->allowed = false;
    out->reason = RATE_REASON_LIMITED;
    out->component = 0;
    out->retry_after_ns = retry_ns;
}

static int unlock_with(rate_fair_t *f, int rc)
{
    rate__ft_unlock(f);
    return rc;
}

/* A waiter whose lock could not be taken: at its deadline it is denied,
 * as any waiter answered then (its seat, if it has one, stays to
 * expire); before it, the failure is the answer. */
int rate__ft_lock_failed(rate_fair_t *f, int rc, uint64_t deadline,
                         rate_decision_t *out)
{
    if (rc == RATE_ETIMEDOUT && now_of(f) >= deadline) {
        rate__ft_denied(out, 0);
        return RATE_OK;
    }
    return rc;
}

/* A waiter answered too late (lock held, released here): denied, the
 * next waiter woken; or rc, the table's failure. */
int rate__ft_answer_late(rate_fair_t *f, int rc, rate_decision_t *out)
{
    if (rc == RATE_OK)
        rc = rate__ft_wake_next(f);
    rate__ft_unlock(f);
    rate__ft_denied(out, 0);
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
        trc = rate__ft_charge(f, sl, permits);
    if (trc == RATE_OK)
        trc = rate__ft_wake_next(f);
    if (trc != RATE_OK)
        return admitted ? rate__ft_admitted_fail(f, permits, now, trc) : trc;
    return rc;
}

/* The shared limit asked for the next waiter (lock held): its answer
 * (1, in *rc and *out), or 0 with *until moved to the limit's retry
 * time when that comes before it. */
int rate__ft_ask_next(rate_fair_t *f, fslot_t *sl, uint64_t permits,
                      uint64_t now, uint64_t *until, int *rc,
                      rate_decision_t *out)
{
    if ((*rc = rate__ft_touch(f, sl, rate__ft_epoch_at(f, now))) != RATE_OK)
        return 1;
    *rc = rate__ft_shared_check(f, permits, now, out);
    if (*rc == RATE_OK)
        *rc = rate__ft_keep_light_room(f, sl, permits, now, out);
    if (*rc != RATE_OK || out->allowed || out->reason != RATE_REASON_LIMITED) {
        *rc = served(f, sl, permits, now, *rc, out);
        return 1;
    }
    if (out->retry_after_ns < *until - now)
        *until = now + (out->retry_after_ns ? out->retry_after_ns : 1);
    return 0;
}

int rate__ft_acquire(rate_fair_t *f, const char *flow, size_t len,
                     uint32_t weight, uint64_t permits, uint64_t timeout,
                     rate_decision_t *out)
{
    uint64_t now = now_of(f);
    uint64_t deadline = timeout > RATE_TIME_MAX - now ? RATE_TIME_MAX
                                                      : now + timeout;
    fslot_t *sl;
    fwait_t *me, *next;
    int rc = rate__ft_lock_by(f, deadline);
    if (rc != RATE_OK)
        return rate__ft_lock_failed(f, rc, deadline, out);
    rc = rate__ft_enter(f, flow, len, weight, permits, now, &sl);
    if (rc != RATE_OK)
        return unlock_with(f, rc);
    if (LD(f->h->waiting) == 0) {
        rc = rate__ft_decide(f, sl, permits, now, true, out);
        if (rc != RATE_OK || out->allowed ||
            out->reason != RATE_REASON_LIMITED || timeout == 0 ||
            out->retry_after_ns > deadline - now)
            return unlock_with(f, rc);
    }
    if ((rc = rate__ft_queue_drop_stale(f, sl, now)) != RATE_OK)
        return unlock_with(f, rc);
    if (LD(sl->qlen) >= f->qmax) {
        f->h->queue_full++;
        rate__ft_unlock(f);
        rate__ft_denied(out, f->period_ns);
        return RATE_OK;
    }
    uint64_t ticket = rate__ft_ticket_next(f);
    rc = rate__ft_ring_push(f, sl, ticket, permits, deadline, &me);
    if (rc != RATE_OK)
        return unlock_with(f, rc);
    for (;;) {
        if (LD(me->ticket) != ticket) /* dropped as stale: too late */
            return rate__ft_answer_late(f, RATE_OK, out);
        if (now >= deadline) {
            bool gone;
            rc = rate__ft_ring_drop(f, sl, ticket, &gone);
            f->h->timed_out++;
            return rate__ft_answer_late(f, rc, out);
        }
        uint64_t until = deadline;
        if ((rc = rate__ft_next_waiter(f, now, &next)) != RATE_OK)
            return unlock_with(f, rc);
        if (next == me) {
            f->h->top_ticket = ticket;
            if (rate__ft_ask_next(f, sl, permits, now, &until, &rc, out))
                return unlock_with(f, rc);
        } else {
            /* The next waiter may be new (one dropped as stale): woken.
             * On a shared table, look again now and then: the process
             * of the next waiter may be killed, and nothing else wakes
             * the waiters behind it. */
            if ((rc = rate__ft_wake_next(f)) != RATE_OK)
                return unlock_with(f, rc);
            if ((f->mapped || f->borrowed) && until - now > DEAD_POLL_NS)
                until = now + DEAD_POLL_NS;
        }
        rc = wait_until(f, me, now, until, deadline);
        if (rc != RATE_OK) /* the lock not taken: the seat stays to expire */
            return rate__ft_lock_failed(f, rc, deadline, out);
        now = now_of(f);
        rc = rate__ft_expire(f, rate__ft_epoch_at(f, now), now);
        if (rc != RATE_OK)
            return unlock_with(f, rc);
    }
}
