/* SPDX-License-Identifier: MIT */
/*
 * ratelimit_synced.h -- the synced mode (docs/sync.md): local
 * decisions at memory speed over leases of a shared remote store, within
 * a stated bound.
 */
#ifndef RATELIMIT_SYNCED_H
#define RATELIMIT_SYNCED_H

#include "ratelimit.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------- synced: local decisions, shared limits */

/* The synced mode (docs/sync.md): a fleet's processes each decide at
 * memory speed, and agree through a shared store (the remote: any store
 * of the contract, Redis, DynamoDB, ...).  Not a store: its decisions are
 * not the spec's bit for bit; what it promises is the bound below.
 *
 * Leases.  For each key, a process borrows a lease of up to `lease` (L)
 * permits from the remote with one ordinary decision there (exact, under
 * the remote's algorithm and clock), then spends them locally with no
 * round trip.  When a lease runs short it is topped up to L again; a
 * request the remote cannot cover is denied and the denial is cached
 * locally until its retry_after (so a hot denied key costs no round
 * trips).  Unused permits are given back (rate_limiter_refund) when the
 * lease is lease_ttl_ns old (rate_synced_flush, or the background
 * sweeper), when the key is evicted, and when the limiter is freed.
 *
 * The bound, with P processes (synced limiters) on one remote, per key:
 *   overshoot: over ANY interval of time, the permits admitted are at
 *     most what the remote's algorithm admits over that interval plus
 *     P x L (the permits the processes held when it began); over a run
 *     that starts with no lease held (a cold start), not one more;
 *   undershoot: at most P x L permits are held unused at a time (a
 *     request is denied when the remote, short of what others hold,
 *     cannot cover it), each for at most lease_ttl_ns before it is
 *     given back; a cached denial may also miss permits other processes
 *     give back before its retry_after.
 * L is chosen per policy: one synced limiter per policy, each its lease.
 * A process that is killed loses at most its leases (L per key it held:
 * undershoot, never overshoot).  Refunds are exact for token and leaky
 * buckets and fixed windows; a policy with a sliding window or log is
 * never refunded (a refund there drops the log's NEWEST entries, which
 * could over-admit): its unused permits are simply dropped.
 *
 * The remote failing (a store error): held leases are still spent; what
 * they do not cover follows on_store_error: RATE_FAIL_CLOSED denies (no
 * overshoot beyond P x L); RATE_FAIL_OPEN admits all (no bound);
 * RATE_FAIL_FALLBACK decides on a private memory store with the same
 * policy (each process alone: at most P x the exact bound, plus P x L).
 * For retry_ns after a failure the remote is not asked; then the next
 * request that needs it asks again: recovery needs nothing else.  A
 * decision's remote calls (give-backs, one or two borrows) share one
 * remote store timeout from its first call (docs/sync.md, "Time bounds").
 *
 * Clock.  The clock calls decide on the remote limiter's clock: with the
 * Redis store by default Redis's TIME (one clock for every host), with
 * DynamoDB the wall clock; lease ages, cached denials and retry_ns run on
 * the local CLOCK_MONOTONIC (durations only).  The *_at calls use the
 * caller's time for all of it.  Use one kind of call per synced limiter.
 *
 * Memory: one entry per key holding a lease or a cached denial (about
 * 100 bytes plus the key), at most max_keys (split evenly over up to 64
 * shards; past a shard's share, its entry that borrowed longest ago is
 * evicted, its lease given back), dropped once its lease has expired
 * (flush).  Threads: every call but rate_synced_free may be made from any
 * number of threads at once; at most one round trip per key and process
 * is in flight (other threads wanting that key wait for it). */
typedef struct rate_synced rate_synced_t;

typedef struct rate_synced_config {
    const rate_policy_t *policy; /* required (copied); not the unlimited
                                    one, no block= limit (a lease's denial
                                    would block the key) */
    rate_store_t *remote;        /* required; borrowed: free it after */
    uint64_t lease;              /* L, 1..the policy's smallest burst,
                                    capacity or window limit; 0: the
                                    smaller of 16 and that */
    uint64_t lease_ttl_ns;       /* 0: 1 s */
    size_t max_keys;             /* 0: unbounded (as the memory store) */
    rate_fail_mode_t on_store_error;
    uint64_t retry_ns;           /* 0: 100 ms */
    uint64_t denial_ttl_ns;      /* 0: a denial is cached until its
                                    retry_after; else at most this long
                                    (bounds what a cached denial misses
                                    of permits others give back) */
    bool prefetch;               /* top a lease up to L from a
                                    background thread once it falls below
                                    L/2, so that a key spending less than
                                    L/2 per round trip never waits for
                                    one (held + in flight stay <= L: the
                                    bound is the same) */
    uint64_t sweep_ns;           /* 0: no thread; else a background
                                    thread calls rate_synced_flush this
                                    often (clock calls only) */
    uint64_t reserved[8]; /* zero (= {...} or memset): room for later
                               fields; non-zero is RATE_EINVAL */
} rate_synced_config_t;

/* Makes a synced limiter over config->remote.  Asks the remote for no
 * decision yet: only the policy's record is written there now, when the
 * remote answers, as rate_limiter_new does for the limiter it makes over
 * it.  Starts the sweeper thread (sweep_ns) and the refiller thread
 * (prefetch, with an L of 2 or more) when asked.
 *
 * Returns: RATE_OK with the synced limiter in *out.
 *
 * Errors (with `err`, if not NULL, errlen bytes with the NUL, saying why;
 * *out is NULL when out is not):
 *   RATE_EINVAL   NULL config, out, policy or remote; non-zero reserved
 *                 words; an on_store_error that is not a fail mode; a
 *                 lease above the policy's capacity (the smallest burst,
 *                 capacity or window limit)
 *   RATE_EPOLICY  the unlimited policy, a block= limit, a policy the
 *                 remote cannot keep
 *   RATE_ERANGE   lease_ttl_ns, retry_ns, sweep_ns or denial_ttl_ns above
 *                 RATE_TIME_MAX
 *   RATE_ENOMEM   also: no thread for the sweeper or refiller
 * or another error of rate_limiter_new over the remote (its text in err).
 *
 * Ownership: the policy is copied; the remote is borrowed: free it after
 * the synced limiter.  The caller frees *out with rate_synced_free.
 *
 * Thread-safe: yes. */
RATE_API int rate_synced_new(const rate_synced_config_t *config,
                             rate_synced_t **out, char *err, size_t errlen);

/* The clean exit: stops the sweeper and the refiller, gives every lease
 * held back to the remote (refunds, one round trip per key held, from up
 * to 8 threads at once), and frees the synced limiter.  NULL: nothing.
 *
 * Returns: nothing.
 *
 * Errors: none; a refund that fails counts its permits as lost.
 *
 * Ownership: s is freed; the remote store stays the caller's (free it
 * after this).
 *
 * Thread-safe: no: must not race with other calls on s. */
RATE_API void rate_synced_free(rate_synced_t *s);

/* A decision for `permits` on key[0..key_len), from the key's lease when
 * it covers them, else after a round trip to the remote.  Requests above
 * L go to the remote as they are (one round trip each).  No reservations
 * (no max_wait).  rate_synced_check goes by the clocks of this header's
 * opening comment; rate_synced_check_at by the caller's now_ns for all
 * of it.
 *
 * Returns: RATE_OK with *out filled (allowed or not; reason as
 * rate_limiter_check's, RATE_REASON_STORE_ERROR when the remote failed
 * and the fail mode decided; remaining: the permits this process still
 * holds for the key, not the remote's room; retry_after on a denial).
 * The remote failing is no error here: the fail mode decides.
 *
 * Errors (*out zeroed): RATE_EINVAL (NULL s or out), RATE_EKEY (a NULL,
 * empty or reserved key, one longer than RATE_KEY_MAX, or one longer than
 * the remote keeps: no remote failure, no fail mode), RATE_ERANGE (permits
 * or time above RATE_TIME_MAX), RATE_ENOMEM (no room for the key's entry:
 * out of memory, or a full shard whose every entry is borrowing).
 *
 * Ownership: the key is copied when the limiter keeps an entry for it;
 * *out is the caller's.
 *
 * Thread-safe: yes. */
RATE_API int rate_synced_check(rate_synced_t *s, const char *key,
                               size_t key_len, uint64_t permits,
                               rate_decision_t *out);
RATE_API int rate_synced_check_at(rate_synced_t *s, const char *key,
                                  size_t key_len, uint64_t permits,
                                  uint64_t now_ns, rate_decision_t *out);

/* The same as rate_synced_check, as a bool.
 *
 * Returns: true when the permits are admitted.
 *
 * Errors: none reported: every error of rate_synced_check is false.
 *
 * Ownership: as rate_synced_check.
 *
 * Thread-safe: yes. */
RATE_API bool rate_synced_try_acquire(rate_synced_t *s, const char *key,
                                      size_t key_len, uint64_t permits);

/* Gives back the leases at least lease_ttl_ns old and drops their entries
 * (the *_at form: by the caller's time, for leases taken by *_at calls;
 * the plain one by CLOCK_MONOTONIC, for the clock calls'); all = true
 * gives back every lease whatever its age.  A key whose denial is cached
 * and still due keeps its entry (unless all), and so does one with a
 * round trip in flight.
 *
 * Returns: RATE_OK once every due lease is given back.
 *
 * Errors: RATE_EINVAL for a NULL s; RATE_ERANGE for now_ns above
 * RATE_TIME_MAX; or the first refund's error (rate_limiter_refund's, a
 * store error of the remote): the permits are then lost, counted; the
 * rest is still done.
 *
 * Ownership: s is borrowed; nothing is kept.
 *
 * Thread-safe: yes. */
RATE_API int rate_synced_flush(rate_synced_t *s, bool all);
RATE_API int rate_synced_flush_at(rate_synced_t *s, uint64_t now_ns,
                                  bool all);

typedef struct rate_synced_stats {
    uint64_t decisions;     /* every decision made */
    uint64_t local;         /* of which decided with no round trip (a
                               lease or a cached denial) */
    uint64_t allowed, denied;
    uint64_t round_trips;   /* remote calls: borrows, direct decisions,
                               refunds */
    uint64_t remote_errors; /* remote calls that failed */
    uint64_t fail_mode;     /* decisions the fail mode made */
    uint64_t borrowed;      /* permits borrowed */
    uint64_t returned;      /* permits given back */
    uint64_t lost;          /* permits dropped without giving back (a
                               sliding policy's, a failed refund) */
    uint64_t held;          /* permits held now */
    uint64_t keys;          /* entries now */
    uint64_t evictions;     /* entries evicted by max_keys */
    uint64_t reserved[8]; /* room for later fields; not read */
} rate_synced_stats_t;

/* Reads the synced limiter's figures (rate_synced_stats_t).
 *
 * Returns: RATE_OK with *out filled (zeroed first; each shard's figures
 * read together, the shards one after another).
 *
 * Errors: RATE_EINVAL for a NULL s or out.
 *
 * Ownership: s is borrowed; *out is the caller's; nothing is kept.
 *
 * Thread-safe: yes. */
RATE_API int rate_synced_stats(rate_synced_t *s, rate_synced_stats_t *out);

/* Tells the synced limiter's lease size.
 *
 * Returns: its L (config's lease, or the default chosen for the policy);
 * 0 for NULL.
 *
 * Errors: none.
 *
 * Ownership: s is borrowed; nothing is kept.
 *
 * Thread-safe: yes. */
RATE_API uint64_t rate_synced_lease(const rate_synced_t *s);

#ifdef __cplusplus
}
#endif
#endif /* RATELIMIT_SYNCED_H */
