/* SPDX-License-Identifier: MIT */
/*
 * ratelimit_fair.h -- fair shares of a shared limit (docs/fair.md): the
 * keys (flows) sharing one limit are admitted by weighted max-min
 * fairness, so that one flow cannot starve the others.
 */
#ifndef RATELIMIT_FAIR_H
#define RATELIMIT_FAIR_H

#include "ratelimit.h"
#include "ratelimit_loop.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A shared limit with fair shares (docs/fair.md).  The shared limit is one
 * key of a limiter (any policy, any store); the fair limit decides which
 * flow may spend it.  Not waiting (rate_fair_try_acquire, rate_fair_check):
 * admitted when the shared limit has room and the flow is the one most
 * owed (its service per weight is the smallest among the active flows), or
 * when the room left keeps the reserve of the flows behind it.  Waiting
 * (rate_fair_acquire): in weighted fair order (virtual finish times),
 * oldest first within a flow, at most queue_max waiters per queue, every
 * waiter answered by its deadline.
 *
 * Memory: one table of `slots` entries, fixed at creation
 * (rate_fair_memory); flows past what the table tracks one per entry
 * share an entry (docs/fair.md, "Bounded memory").  The table is in the
 * process (shm_path NULL: its threads share it) or in a file mapped by
 * every process opening the same path (the processes of a host).
 *
 * A fleet: when the limiter's store makes fair decisions itself (the
 * store contract's fair(), version 6: the Redis store), the not-waiting
 * calls go there by themselves, one round trip each, over a table kept
 * beside the shared key (112 + 72 x slots bytes) that every fair limit
 * of that key on that Redis shares; rate_fair_check and
 * rate_fair_try_acquire then go by the limiter's clock (Redis TIME)
 * unless the config gives a clock.  The waiting calls stay on the local
 * table (docs/fair.md, "Redis (a fleet)"). */
typedef struct rate_fair rate_fair_t;

#define RATE_FAIR_WEIGHT_MAX (1u << 20) /* largest weight of a flow */
/* Largest table (docs/fair.md, "Bounded memory"; no decision scans the
 * table, whatever its size). */
#define RATE_FAIR_SLOTS_MAX 4096u
#define RATE_FAIR_QUEUE_MAX 1024u       /* largest queue_max */

typedef struct rate_fair_config {
    rate_limiter_t *limiter; /* required; borrowed: free it after */
    const char *key;         /* required: the shared limit's key, */
    size_t key_len;          /* 1..RATE_KEY_MAX bytes; copied */
    unsigned slots;          /* table entries; 0: 64 */
    unsigned queue_max;      /* waiters per entry; 0: 16 */
    /* NULL: the table in this process.  Else a file (created if missing,
     * mode 0600) shared by every process that opens it with the same
     * slots and queue_max; a file made with others is refused. */
    const char *shm_path;
    /* NULL: CLOCK_MONOTONIC.  The times the fair limit passes to the
     * limiter (its *_at calls) and waits by; copied. */
    const rate_clock_t *clock;
    /* NULL: the limiter's policy (at rate_fair_new).  Else the shared
     * limit's policy, applied with rate_limiter_check_policy_at (how a
     * rules file's rule shares its policy fairly); borrowed: it must
     * outlive the fair limit. */
    const rate_policy_t *policy;
    uint64_t reserved[5]; /* zero (= {...} or memset): room for later
                             fields; non-zero is RATE_EINVAL */
} rate_fair_config_t;

/* Makes a fair limit.  Returns: RATE_OK, *out (NULL on an error).
 * Errors, each with, if `err` is not NULL, a one-line reason naming what
 * is wrong (at most errlen bytes with the NUL): RATE_EINVAL for a NULL out,
 * config or limiter, a non-zero reserve, a clock without now_ns or
 * sleep_ns, slots above RATE_FAIR_SLOTS_MAX, queue_max above
 * RATE_FAIR_QUEUE_MAX, or a shm_path file that is not a fair table of
 * these slots and queue_max (err says which: made with others, not a
 * fair table, of another version, of another size, a damaged header or
 * lock; docs/fair.md, "A damaged table"); RATE_EKEY for a NULL, empty,
 * too long or reserved (RATE_KEY_RESERVED) key; RATE_ESTORE for a shm_path that cannot be opened,
 * sized or mapped (the system's reason in err); RATE_ENOMEM.
 * Ownership: the config, key and clock are copied; the limiter is
 * borrowed: free the fair limit first.  Thread-safe: yes. */
RATE_API int rate_fair_new(const rate_fair_config_t *config,
                           rate_fair_t **out, char *err, size_t errlen);

/* The table in memory the caller shares between its processes (an nginx
 * shared zone, its own MAP_SHARED mapping), as rate_store_shm_new_in does
 * for the shared-memory store.  rate_fair_size: the bytes a table of
 * `slots` and `queue_max` needs (0 defaults as in the config), or 0 when
 * one is above its maximum.  rate_fair_init_in: makes the table in
 * mem[0..len) (at least 64-byte aligned), once, before any process
 * attaches (nginx: the master, in the zone's init).  rate_fair_new_in: a
 * fair limit on the table there, with the config's slots and queue_max
 * (shm_path must be NULL).  Returns: the size; RATE_OK and *out.  Errors
 * (with err as for rate_fair_new): RATE_EINVAL for NULL or misaligned
 * memory, a len below rate_fair_size, sizes above their maximum, or (new_in)
 * memory that holds no table of these sizes (err says why, as for a
 * shm_path file); rate_fair_new's errors of the
 * config; RATE_ENOMEM.  Ownership: the memory stays the caller's and must
 * outlive every fair limit on it; rate_fair_free leaves it as it is.
 * Thread-safe: rate_fair_init_in: no (no other process may use the
 * memory meanwhile); the others: yes. */
RATE_API size_t rate_fair_size(unsigned slots, unsigned queue_max);
RATE_API int rate_fair_init_in(void *mem, size_t len, unsigned slots,
                               unsigned queue_max, char *err, size_t errlen);
RATE_API int rate_fair_new_in(const rate_fair_config_t *config, void *mem,
                              size_t len, rate_fair_t **out, char *err,
                              size_t errlen);

/* Frees the fair limit (NULL: nothing); the shm_path file stays.
 * Returns: nothing.  Errors: none.  Ownership: the limiter stays the
 * caller's.  Thread-safe: no: no other call on it may run or wait. */
RATE_API void rate_fair_free(rate_fair_t *fair);

/* Not waiting: one decision for `permits` of flow flow[0..flow_len)
 * (any bytes, 1..RATE_KEY_MAX) with weight `weight` (1..
 * RATE_FAIR_WEIGHT_MAX; 0 means 1) on the shared limit, at the fair
 * limit's clock (rate_fair_check_at: at now_ns).  A denial by the fair
 * rule (the room left would not keep the reserve of the flows behind) has
 * reason RATE_REASON_LIMITED and an estimated retry_after; a denial by the
 * shared limit, its decision as is.
 * Returns: RATE_OK with *out filled (allowed or not; a store failure is a
 * decision under the limiter's fail mode).  Errors (*out zeroed, nothing
 * counted): RATE_EINVAL for a NULL fair or out, or a weight above
 * RATE_FAIR_WEIGHT_MAX; RATE_EKEY for a NULL, empty or too long flow;
 * RATE_ERANGE for permits or now_ns above RATE_TIME_MAX; the limiter's
 * errors as rate_limiter_check_at.  A table shared by processes
 * (shm_path, rate_fair_new_in) adds its own (docs/fair.md, "A damaged
 * table"): RATE_ECORRUPT for a table damaged by a writer of its memory
 * (permits the shared limit admitted meanwhile are given back);
 * RATE_ETIMEDOUT when its lock stayed held, by one holder, for 5 s of
 * the fair clock (a damaged lock word that looks held: later calls that
 * find it so fail at once); RATE_ESTORE when the system refuses the
 * lock (unrecoverable).  Ownership: the flow is only read.
 * Thread-safe: yes. */
RATE_API int rate_fair_check(rate_fair_t *fair, const char *flow,
                             size_t flow_len, uint32_t weight,
                             uint64_t permits, rate_decision_t *out);
RATE_API int rate_fair_check_at(rate_fair_t *fair, const char *flow,
                                size_t flow_len, uint32_t weight,
                                uint64_t permits, uint64_t now_ns,
                                rate_decision_t *out);

/* As rate_fair_check and _at, telling only whether the permits may be
 * spent.  Returns: true when admitted.  Errors: none reported: bad input
 * is false.  Ownership, Thread-safe: as rate_fair_check. */
RATE_API bool rate_fair_try_acquire(rate_fair_t *fair, const char *flow,
                                    size_t flow_len, uint32_t weight,
                                    uint64_t permits);
RATE_API bool rate_fair_try_acquire_at(rate_fair_t *fair, const char *flow,
                                       size_t flow_len, uint32_t weight,
                                       uint64_t permits, uint64_t now_ns);

/* Waiting: waits in the flow's queue, in weighted fair order, until the
 * permits are admitted or timeout_ns (at most RATE_TIME_MAX) has passed.
 * Returns: RATE_OK with out->allowed true once admitted; RATE_OK with
 * out->allowed false and reason RATE_REASON_LIMITED when the deadline
 * came first (answered at the deadline, whatever else happens), or at
 * once when the flow's queue already holds queue_max waiters; reason
 * RATE_REASON_NEVER when the shared limit can never admit the permits.
 * On a table shared by processes, a lock still held by another at the
 * deadline is that too: a denial at the deadline.
 * Errors: as rate_fair_check (*out zeroed), and RATE_ERANGE for
 * timeout_ns above RATE_TIME_MAX: RATE_ECORRUPT, RATE_ETIMEDOUT (the lock
 * held by one holder for 5 s before the deadline), RATE_ESTORE (a lock
 * the system refuses).
 * Ownership: the flow is only read.  Thread-safe: yes (any number of
 * threads and, with shm_path, processes wait at once). */
RATE_API int rate_fair_acquire(rate_fair_t *fair, const char *flow,
                               size_t flow_len, uint32_t weight,
                               uint64_t permits, uint64_t timeout_ns,
                               rate_decision_t *out);

/* Waiting, for event loops: as rate_fair_acquire (the same queues, order
 * and bound; max_wait_ns as its timeout_ns), without blocking the
 * caller.  Returns RATE_OK with *out filled when the answer is known at
 * once (admitted; denied with no wait possible or wanted; the flow's
 * queue full), and cb is NOT called; or RATE_PENDING (positive, not an
 * error): the request waits in its flow's queue, *out is zeroed, and
 * cb(ud, rc, decision) runs exactly once, later, inside the loop's
 * callbacks on its thread, never before this returns: rc RATE_OK with
 * the decision (admitted, or denied at the deadline with reason
 * RATE_REASON_LIMITED: every waiter is answered at its deadline by a
 * timer of the loop, whatever else happens), rate_fair_acquire's errors
 * (zeroed: a damaged table, its lock held or refused), RATE_ECANCELED
 * (zeroed) when the fair limit is freed first.  Woken waiters are told
 * through an eventfd watched on the loop; on a table shared by
 * processes (shm_path, rate_fair_new_in) a waiter also looks every 2 ms,
 * since a waiter of another process (or of another fair limit of this
 * process) cannot wake it.
 * Errors (no callback, *out zeroed): as rate_fair_acquire; RATE_EINVAL
 * for a NULL loop or cb, a loop without io or timer functions or with a
 * reserved one set (ratelimit_loop.h), or a loop
 * other than the one of this fair limit's first asynchronous call (one
 * fair limit, one loop: the same ud and functions); RATE_ENOMEM.
 * Ownership: the flow is only read; the loop table is copied at the first
 * call, and its loop must outlive the fair limit; ud is the caller's.
 * Thread-safe: call it on the loop's thread (other threads may use the
 * fair limit's other calls meanwhile); rate_fair_free answers pending
 * waiters (RATE_ECANCELED) and must run on that thread too. */
RATE_API int rate_fair_acquire_start(rate_fair_t *fair, const rate_loop_t *loop,
                                     const char *flow, size_t flow_len,
                                     uint32_t weight, uint64_t permits,
                                     uint64_t max_wait_ns,
                                     rate_decision_t *out, rate_check_fn cb,
                                     void *ud);

/* What the fair limit has done (with shm_path: every process's). */
typedef struct rate_fair_stats {
    uint64_t flows;          /* table entries in use now */
    uint64_t slots;          /* table entries in all */
    uint64_t shared;         /* decisions of a flow that found no entry of
                                its own (it shared its home entry) */
    uint64_t fair_denied;    /* denials by the fair rule (a reserve kept) */
    uint64_t waiting;        /* waiters now */
    uint64_t queue_full;     /* waiters turned away by a full queue */
    uint64_t timed_out;      /* waiters answered at their deadline */
    uint64_t reserved[5];
} rate_fair_stats_t;

/* Returns: RATE_OK, *out filled.  Errors (*out zeroed): RATE_EINVAL for a
 * NULL fair or out; a shared table's RATE_ECORRUPT, RATE_ETIMEDOUT or
 * RATE_ESTORE, as rate_fair_check.  Ownership: nothing kept.
 * Thread-safe: yes. */
RATE_API int rate_fair_stats(rate_fair_t *fair, rate_fair_stats_t *out);

/* The bytes of the fair limit's table: fixed at creation, whatever the
 * number of flows.  Returns: the size (0 for NULL).  Errors: none.
 * Ownership: none.  Thread-safe: yes. */
RATE_API size_t rate_fair_memory(const rate_fair_t *fair);

#ifdef __cplusplus
}
#endif
#endif /* RATELIMIT_FAIR_H */
