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
 * request that needs it asks again: recovery needs nothing else.
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

/* Makes a synced limiter.  Returns RATE_OK, or with `err` (if not NULL,
 * errlen bytes with the NUL) saying why: RATE_EINVAL (NULL config, out,
 * policy or remote; a lease above the policy's capacity), RATE_EPOLICY
 * (the unlimited policy, a block= limit, a policy the remote cannot
 * keep), RATE_ERANGE (lease_ttl_ns, retry_ns, sweep_ns or denial_ttl_ns
 * above RATE_TIME_MAX), RATE_ENOMEM (also: no thread for the sweeper or
 * refiller).
 * Asks the remote nothing yet.  Thread-safe: yes. */
RATE_API int rate_synced_new(const rate_synced_config_t *config,
                             rate_synced_t **out, char *err, size_t errlen);

/* Gives every lease held back to the remote (refunds, one round trip per
 * key held, from up to 8 threads at once; failures count as lost), stops
 * the sweeper, frees it.  The clean exit.  NULL: nothing.  Must not race
 * with other calls on it. */
RATE_API void rate_synced_free(rate_synced_t *s);

/* A decision for `permits` on key[0..key_len).  RATE_OK with *out filled
 * (allowed or not; reason as rate_limiter_check's, RATE_REASON_STORE_ERROR
 * when the remote failed and the fail mode decided; remaining: the
 * permits this process still holds for the key, not the remote's room;
 * retry_after on a denial).  Requests above L go to the remote as they
 * are (one round trip each).  No reservations (no max_wait).  Errors:
 * RATE_EINVAL (NULL s or out), RATE_EKEY, RATE_ERANGE (permits or time
 * above RATE_TIME_MAX), RATE_ENOMEM (no room for the key's entry).
 * Thread-safe: yes. */
RATE_API int rate_synced_check(rate_synced_t *s, const char *key,
                               size_t key_len, uint64_t permits,
                               rate_decision_t *out);
RATE_API int rate_synced_check_at(rate_synced_t *s, const char *key,
                                  size_t key_len, uint64_t permits,
                                  uint64_t now_ns, rate_decision_t *out);

/* The same as a bool (errors are false).  Thread-safe: yes. */
RATE_API bool rate_synced_try_acquire(rate_synced_t *s, const char *key,
                                      size_t key_len, uint64_t permits);

/* Gives back the leases at least lease_ttl_ns old and drops their entries
 * (the *_at form: by the caller's time, for leases taken by *_at calls;
 * the plain one by CLOCK_MONOTONIC, for the clock calls'); all = true
 * gives back every lease whatever its age.  RATE_OK, RATE_EINVAL for
 * NULL, RATE_ERANGE for now_ns above RATE_TIME_MAX, or the first refund's
 * error (the permits are then lost, counted;
 * the rest is still done).  Thread-safe: yes. */
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

/* Fills *out (each shard's figures read together, the shards one after
 * another).  RATE_EINVAL for NULL.  Thread-safe: yes. */
RATE_API int rate_synced_stats(rate_synced_t *s, rate_synced_stats_t *out);

/* The synced limiter's L.  Thread-safe: yes. */
RATE_API uint64_t rate_synced_lease(const rate_synced_t *s);

#ifdef __cplusplus
}
#endif
#endif /* RATELIMIT_SYNCED_H */
