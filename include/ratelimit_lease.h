/* SPDX-License-Identifier: MIT */
/*
 * ratelimit_lease.h -- in-flight limits: at most N requests of a key at
 * once, each holding a lease until it releases it or the lease expires.
 *
 * A layer of the core (it needs only ratelimit.h): an inflight object
 * (rate_inflight_t) keeps each key's leases in a store, any store, so
 * that the limit holds across the threads of a process (the memory
 * store), the processes of a host (shared memory) and whatever shares a
 * remote store (on Redis, one round trip per acquire, release, extend or
 * count: the store contract's lease(), docs/leases.md "Leases on Redis").  Its policy may add rate limits ("concurrency 100
 * ttl=1m; token-bucket 10/s"), decided all-or-nothing with the lease.
 * The user's guide, the stored format and the reasons: docs/leases.md.
 *
 * Conventions as ratelimit.h's.  Times are ns, the caller's in the *_at
 * calls.  A lease's expiry is a time of the clock that granted it, so
 * every holder of a key must read one clock: the default is one per
 * store, whoever calls (the library, the ratelimit command, nginx):
 * CLOCK_MONOTONIC on the memory and shared-memory stores (this host's),
 * CLOCK_REALTIME on any other (Redis, DynamoDB, one's own: a store other
 * hosts may share; their clocks' skew lengthens or shortens a lease by as
 * much).  A clock of one's own must be every holder's of the store.
 */
#ifndef RATELIMIT_LEASE_H
#define RATELIMIT_LEASE_H

#include "ratelimit.h"

#ifdef __cplusplus
extern "C" {
#endif

#define RATE_LEASE_MAX 10000u  /* largest N of `concurrency N` */
#define RATE_LEASE_KEY_MAX (RATE_KEY_MAX - 8) /* longest key with leases */

/* Who asks: a reserve (reserve=K) is kept for critical traffic. */
typedef enum rate_lease_class {
    RATE_LEASE_NORMAL = 0,
    RATE_LEASE_CRITICAL = 1
} rate_lease_class_t;

/* A lease: a plain value the acquire fills and the caller keeps until it
 * releases it.  Copying it is fine; it points at nothing. */
typedef struct rate_lease {
    uint64_t id;          /* never 0 for a lease granted */
    uint64_t expires_ns;  /* when it lapses unless extended (set by
                             acquire and extend) */
    uint64_t key_hash;    /* a fingerprint of the key it was granted for */
    uint64_t reserved[3]; /* written 0 by the library; not read */
} rate_lease_t;

/* An in-flight policy: one `concurrency` limit and up to RATE_MAX_LIMITS
 * rate limits.  Immutable once made. */
typedef struct rate_inflight_policy rate_inflight_policy_t;

/* Parses "concurrency N ttl=DUR [reserve=K|reserve=P%]", alone or among
 * rate clauses separated by ';', after an optional "name=NAME " first
 * (the rate part's name when it has one; docs/leases.md): N from 1 to
 * RATE_LEASE_MAX, the TTL from 1 ms to 2^61 ns, the reserve below N.
 * Returns: RATE_OK, *out.  Errors: RATE_EINVAL for a NULL out;
 * RATE_EPOLICY for NULL text, no concurrency clause or two, a bad count,
 * TTL, reserve or option, a bad rate clause (rate_policy_parse's
 * message) or 'unlimited' (which stands alone), with, if err is not NULL, a one-line reason naming the bad
 * part (at most errlen bytes with the NUL); RATE_ENOMEM.  *out is NULL
 * on an error.  Ownership: the text is only read; the caller frees *out
 * (rate_inflight_policy_free).  Thread-safe: yes. */
RATE_API int rate_inflight_policy_parse(const char *text,
                                        rate_inflight_policy_t **out,
                                        char *err, size_t errlen);

/* Writes the policy's canonical text (parsable again) into buf, truncating
 * to len bytes with the NUL (buf NULL: only measures, whatever len).
 * Returns: the length the whole text needs, the NUL not counted (0 for
 * NULL).  Errors: none.  Ownership: nothing is kept.  Thread-safe: yes. */
RATE_API size_t rate_inflight_policy_format(
    const rate_inflight_policy_t *policy, char *buf, size_t len);

/* The in-flight limit's numbers: N, the TTL, the reserve (0: none), and
 * the rate part (NULL when the policy has none; borrowed, lives as long
 * as the policy).  rate_inflight_policy_state_max: the largest stored
 * lease state of a key (14 + 24 N bytes: a shared-memory region's
 * state_max must be at least this).  Returns: the values; 0 and NULL for
 * a NULL policy.  Errors: none.  Ownership: nothing is kept.
 * Thread-safe: yes. */
RATE_API uint64_t rate_inflight_policy_max(const rate_inflight_policy_t *p);
RATE_API uint64_t rate_inflight_policy_ttl_ns(const rate_inflight_policy_t *p);
RATE_API uint64_t rate_inflight_policy_reserve(const rate_inflight_policy_t *p);
RATE_API const rate_policy_t *rate_inflight_policy_rate(
    const rate_inflight_policy_t *p);
RATE_API size_t rate_inflight_policy_state_max(
    const rate_inflight_policy_t *p);

/* Frees the policy (NULL: nothing).  Returns: nothing.  Errors: none.
 * Ownership: inflight objects copy theirs.  Thread-safe: yes, once no
 * other call uses it. */
RATE_API void rate_inflight_policy_free(rate_inflight_policy_t *policy);

typedef struct rate_inflight rate_inflight_t;

typedef struct rate_inflight_config {
    const rate_inflight_policy_t *policy; /* required; copied */
    rate_store_t *store;       /* NULL: a private in-memory store; else
                                  borrowed: free it after the object */
    const rate_clock_t *clock; /* NULL: the store's default (above):
                                  CLOCK_MONOTONIC on memory and shared
                                  memory, else CLOCK_REALTIME (the
                                  library's default clock, a limiter's
                                  rate_limiter_clock, is taken so too);
                                  copied */
    /* An acquire the in-flight limit would deny first releases the
     * leases of holders that have died (docs/leases.md, "Crashed
     * holders"), judged by kill(pid, 0).  Only for the library's memory
     * store (store NULL or rate_store_memory_new) and shared-memory store
     * (ratelimit_shm.h).  A lease records its holder's PID namespace, and
     * only holders of this process's namespace are judged (a PID of
     * another names another process here, or none): processes of several
     * namespaces (containers) may share a region.  Set with any other
     * store (Redis, DynamoDB, a store of one's own), whose holders may be
     * on other hosts, it is RATE_EINVAL. */
    bool reap_dead_holders;
    uint64_t reserved[6]; /* zero (= {...} or memset); non-zero is
                             RATE_EINVAL */
} rate_inflight_config_t;

/* Makes an inflight object.  With rate limits in its policy, it makes a
 * limiter over the same store and clock for them (the key's rate state is
 * the one a limiter of the same store keeps for the key).
 * Returns: RATE_OK, *out (NULL on an error).  Errors: RATE_EINVAL for a
 * NULL out, config or policy, a non-zero reserve, a clock without now_ns
 * or sleep_ns, reap_dead_holders with a store other than the library's
 * memory or shared-memory store; RATE_EPOLICY when the store cannot keep the rate part's
 * states, or a key's leases (a shared-memory region whose state_max is
 * below rate_inflight_policy_state_max); RATE_ENOMEM.  Ownership: config, policy and clock copied, the
 * store borrowed; the caller frees *out (rate_inflight_free).
 * Thread-safe: yes. */
RATE_API int rate_inflight_new(const rate_inflight_config_t *config,
                               rate_inflight_t **out);

/* Frees the object (NULL: nothing); leases still held stay in the store
 * until released by another object on it or until they expire.
 * Returns: nothing.  Errors: none.  Ownership: its private store and
 * limiter are freed; a store passed in stays the caller's (free it
 * after).  Thread-safe: no (must not race with other calls on it). */
RATE_API void rate_inflight_free(rate_inflight_t *inflight);

/* Acquires a lease of key[0..key_len) for a request of class `cls`, at the
 * object's clock (rate_inflight_acquire_at: at now_ns).  Allowed: *lease
 * holds it (release it exactly once) and *out says how much room is left.
 * Denied: nothing is held or charged, *lease is zeroed, *out says which
 * limit denied and when to retry (docs/leases.md, "The decision").
 * Returns: RATE_OK with *out filled (allowed or not).  Errors (*lease
 * zeroed, *out denied with reason RATE_REASON_STORE_ERROR and `error` set
 * for a store's, else zeroed): RATE_EINVAL for a NULL inflight, lease or
 * out, or a class that is none; RATE_EKEY for a NULL or empty key or one
 * longer than RATE_LEASE_KEY_MAX or than the store keeps; RATE_ERANGE for
 * now_ns above RATE_TIME_MAX; RATE_ECORRUPT for a stored lease state that
 * is not one (not written back); the store's own error as is (RATE_EFULL
 * for a state longer than the store keeps, or a new key in a store full
 * of keys with leases held, which it never evicts; RATE_ESTORE, RATE_ETIMEDOUT,
 * RATE_ECONFLICT); RATE_ENOMEM.  A rate limit's store failure follows
 * that limiter's fail mode (closed: denied, the lease given back).
 * Ownership: the key is only read.  Thread-safe: yes. */
RATE_API int rate_inflight_acquire(rate_inflight_t *inflight, const char *key,
                                   size_t key_len, rate_lease_class_t cls,
                                   rate_lease_t *lease, rate_decision_t *out);
RATE_API int rate_inflight_acquire_at(rate_inflight_t *inflight,
                                      const char *key, size_t key_len,
                                      rate_lease_class_t cls, uint64_t now_ns,
                                      rate_lease_t *lease,
                                      rate_decision_t *out);

/* Releases a lease of key[0..key_len): its slot is free at once.  On a
 * store without its own lease call (load and compare-and-set), a release
 * that keeps conflicting with other holders' changes is tried again,
 * after growing, jittered pauses, for as long as the lease lives: it is
 * never lost to contention (it may wait meanwhile).
 * Returns: RATE_OK.  Errors (nothing changed by any of them):
 * RATE_EINVAL for a NULL inflight or lease, a lease with id 0, or one
 * granted for another key; RATE_EKEY, RATE_ERANGE as acquire's;
 * RATE_ELEASE when the key holds no lease of that id (released already);
 * RATE_EEXPIRED when it expired before this call, or while it was tried
 * again (its slot was given back then); RATE_ECORRUPT and the store's
 * errors as acquire's but RATE_ECONFLICT.
 * Ownership: the key and lease are only read.  Thread-safe: yes. */
RATE_API int rate_inflight_release(rate_inflight_t *inflight, const char *key,
                                   size_t key_len, const rate_lease_t *lease);
RATE_API int rate_inflight_release_at(rate_inflight_t *inflight,
                                      const char *key, size_t key_len,
                                      const rate_lease_t *lease,
                                      uint64_t now_ns);

/* Extends a held lease: it now expires ttl_ns from now (0: the policy's
 * TTL; a shorter TTL than it had is allowed: it moves the expiry either
 * way), written back into lease->expires_ns; tried again under
 * contention as a release is.
 * Returns: RATE_OK.  Errors (nothing changed): as rate_inflight_release,
 * and RATE_ERANGE for ttl_ns above 2^61 ns.  Ownership: the key is only
 * read; *lease is updated.  Thread-safe: yes (one thread per lease). */
RATE_API int rate_inflight_extend(rate_inflight_t *inflight, const char *key,
                                  size_t key_len, rate_lease_t *lease,
                                  uint64_t ttl_ns);
RATE_API int rate_inflight_extend_at(rate_inflight_t *inflight,
                                     const char *key, size_t key_len,
                                     rate_lease_t *lease, uint64_t ttl_ns,
                                     uint64_t now_ns);

/* How many leases of key[0..key_len) are held now (expired ones not
 * counted).  Returns: RATE_OK, *held.  Errors: RATE_EINVAL for a NULL
 * inflight or held; RATE_EKEY, RATE_ERANGE, RATE_ECORRUPT and the store's
 * errors as acquire's.  Ownership: the key is only read.
 * Thread-safe: yes. */
RATE_API int rate_inflight_held(rate_inflight_t *inflight, const char *key,
                                size_t key_len, uint64_t *held);
RATE_API int rate_inflight_held_at(rate_inflight_t *inflight, const char *key,
                                   size_t key_len, uint64_t now_ns,
                                   uint64_t *held);

/* ------------------------------------------------- on an event loop */

/* Called once when an asynchronous lease call completes: rc is the
 * synchronous call's code (RATE_OK, RATE_ELEASE, RATE_EEXPIRED, a store
 * error, RATE_ECANCELED when the store was freed first).  lease: acquire:
 * the lease granted (zeroed when not granted or on an error); extend: the
 * handle with its new expires_ns (store it: the caller's handle was not
 * written); release: the handle released.  decision: acquire's (as
 * rate_inflight_acquire fills it), NULL for release and extend.  Both are
 * valid during the call only. */
typedef void (*rate_lease_fn)(void *ud, int rc, const rate_lease_t *lease,
                              const rate_decision_t *decision);

/* The asynchronous forms of acquire, release and extend, for an object
 * whose store is an event loop's (rate_store_redis_async_new: one round
 * trip each, docs/leases.md "On an event loop"), which answer at once
 * when they can.  Returns:
 *   RATE_OK, or the call's own error, when answered at once: exactly as
 *     the synchronous call (acquire fills *lease and *out; extend writes
 *     *lease), and cb is NOT called.  A store without an asynchronous
 *     entry (memory, shared memory) answers so; so does a lease that the
 *     handle says has expired (extend: RATE_EEXPIRED).
 *   RATE_PENDING  under way: cb runs exactly once, later, never before
 *     this returns, on the thread that drives the store (an event loop's
 *     store: the loop's thread); *lease and *out are zeroed and not
 *     written again.
 * Errors at once (no callback): those of the synchronous call's input
 * checks (RATE_EINVAL also for a NULL cb; RATE_EKEY, RATE_ERANGE); the
 * store's refusal to start (RATE_ESTORE: a breaker open, a reconnect
 * backing off), with acquire's *out denied with reason
 * RATE_REASON_STORE_ERROR; RATE_ENOMEM.  With rate limits in the policy,
 * a granted lease is followed by the rate part through
 * rate_limiter_check_start, and a denial gives the lease back (a release
 * through the loop) before cb runs, as the synchronous call does.  No
 * lease is reaped of dead holders (reap_dead_holders is for the local
 * stores, which answer at once through the synchronous calls).  A release
 * or an extend that the store gives up on for other holders' changes
 * (RATE_ECONFLICT) is started again at once (the synchronous call pauses
 * between rounds; these calls have no timer), for as long as the lease
 * lives (then RATE_EEXPIRED): cb never sees RATE_ECONFLICT for them.
 * Ownership: the key and handle are copied; ud is the caller's, only
 * passed back.  The object and its store must outlive every pending call
 * (freeing the store first runs each pending cb with RATE_ECANCELED).
 * Thread-safe: as the store's entries (an event loop's store: start its
 * calls on the loop's thread). */
RATE_API int rate_inflight_acquire_start(rate_inflight_t *inflight,
                                         const char *key, size_t key_len,
                                         rate_lease_class_t cls,
                                         rate_lease_t *lease,
                                         rate_decision_t *out,
                                         rate_lease_fn cb, void *ud);
RATE_API int rate_inflight_release_start(rate_inflight_t *inflight,
                                         const char *key, size_t key_len,
                                         const rate_lease_t *lease,
                                         rate_lease_fn cb, void *ud);
RATE_API int rate_inflight_extend_start(rate_inflight_t *inflight,
                                        const char *key, size_t key_len,
                                        rate_lease_t *lease, uint64_t ttl_ns,
                                        rate_lease_fn cb, void *ud);

#ifdef __cplusplus
}
#endif
#endif /* RATELIMIT_LEASE_H */
