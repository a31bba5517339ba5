/*
 * ratelimit_store.h -- for people writing a store (a back end).
 *
 * A store keeps one opaque byte string per key: the key's state.  The
 * limiter owns the meaning of those bytes; a store only keeps them, makes
 * each update atomic, and drops a key no sooner than its time-to-live.
 *
 * Two ways to make an update atomic, and a store provides at least one:
 *
 *  1. The generic contract, for any key-value store with compare-and-set:
 *     load() returns the key's bytes and a version; cas() replaces them only
 *     if the version is unchanged.  The limiter runs the step in between and
 *     retries on a conflict, at most max_retries times (RATE_ECONFLICT then).
 *
 *  2. update(): the store runs the step itself, atomically (the memory store
 *     under a shard lock).  Faster: no retry.  The limiter prefers it.
 *
 *  3. decide(), optional on top: the store makes the whole decision itself
 *     (Redis: a Lua twin of the step, one round trip), and may decline a
 *     request it cannot decide exactly; the limiter then uses 2 or 1.
 *
 * Nothing in the limiter depends on which store it talks to.  (Entries are
 * only ever appended to the table; RATE_STORE_V1 stores leave new ones
 * NULL.)
 */
#ifndef RATELIMIT_STORE_H
#define RATELIMIT_STORE_H

#include "ratelimit.h"

#ifdef __cplusplus
extern "C" {
#endif

#define RATE_STORE_V1 1

/* One step, as the store sees it.  The store fills the inputs; the step
 * fills the outputs.  A step is pure: it may run more than once. */
typedef struct rate_step_io {
    const void *old_state; /* in: the key's bytes; NULL when absent */
    size_t old_len;        /* in: their length (0 when absent) */
    void *new_state;       /* in: where to write the new bytes */
    size_t new_cap;        /* in: room there, >= old_len + rate_step_t.grow */
    size_t new_len;        /* out: length written */
    bool write;            /* out: store new_state; false: keep the old bytes */
    bool allowed;          /* out: the verdict, for statistics */
    uint64_t ttl_ns;       /* out: keep the key at least this long after now */
} rate_step_io_t;

typedef int (*rate_step_fn)(void *arg, rate_step_io_t *io);

typedef struct rate_step {
    rate_step_fn fn;
    void *arg;
    size_t grow;       /* the new state is at most old_len + grow bytes */
    uint64_t now_ns;   /* the request's time */
    bool clock_time;   /* now_ns came from the limiter's own monotonic clock */
    /* Whether a stored state (of any key) is back at its cold start at
     * now_ns, so that dropping it changes no answer.  For stores that
     * reclaim keys; call it only when clock_time is true and the state was
     * itself written at a clock time (with caller-supplied times another
     * key's time says nothing about this one).  Pass arg. */
    bool (*is_cold)(void *arg, const void *state, size_t len, uint64_t now_ns);
    /* Optional (NULL when not offered): the same step, in place.  A store
     * that holds the key's bytes contiguous and writable may call it, under
     * the lock that makes its updates atomic, before fn: it returns
     * RATE_INPLACE_NO when it cannot decide this one (nothing was touched:
     * run fn as usual), RATE_INPLACE_READ when it decided and the bytes
     * stay as they were, RATE_INPLACE_WROTE when it decided and rewrote
     * them in place, at the same length (keep them at least *ttl_ns then).
     * *allowed is the verdict, for statistics.  Pass arg.  The limiter
     * offers it for policies of one fixed-size limit: the hot path,
     * without copying the state out and back. */
    int (*inplace)(void *arg, void *state, size_t len, bool *allowed,
                   uint64_t *ttl_ns);
} rate_step_t;

enum { RATE_INPLACE_NO, RATE_INPLACE_READ, RATE_INPLACE_WROTE };

/* A whole decision for the optional decide() entry. */
typedef struct rate_decide_req {
    const rate_policy_t *policy; /* read it with rate_policy_count/limit/
                                    fingerprint */
    uint64_t now_ns;  /* in: the request's time.  A store that keeps its own
                         clock (Redis TIME) uses that instead when
                         clock_time, and writes the time it used back here,
                         also when it declines, for the limiter's own path */
    bool clock_time;  /* now_ns is the limiter's clock, not the caller's */
    uint64_t permits;
    uint64_t max_wait_ns;
    bool detail;          /* false: only allowed/reason/delay are read */
    uint64_t max_reset_ns; /* a bound on reset_after when !detail */
} rate_decide_req_t;

typedef struct rate_store_vtable {
    int version;      /* RATE_STORE_V1; later versions only append fields */
    const char *name; /* "memory", "redis", ... */

    /* Generic contract.  load: copy the key's bytes into buf (cap bytes),
     * set *len and *version (version 0 and *len 0 when absent).  If the state
     * is longer than cap, set *len to its length and return RATE_EINVAL
     * without copying; the limiter calls again with a larger buffer. */
    int (*load)(void *self, const char *key, size_t key_len, void *buf,
                size_t cap, size_t *len, uint64_t *version);
    /* Replace the key's bytes if its version is still `version` (0: only if
     * absent), and keep them at least ttl_ns.  Returns RATE_OK, RATE_ECONFLICT
     * when the version moved, or another error. */
    int (*cas)(void *self, const char *key, size_t key_len, uint64_t version,
               const void *state, size_t len, uint64_t ttl_ns);

    /* Optional fast path (NULL if absent): run step->fn atomically over the
     * key's bytes and store io->new_state when io->write. */
    int (*update)(void *self, const char *key, size_t key_len,
                  const rate_step_t *step);

    /* Optional fastest path (NULL if absent): make the whole decision in
     * the store, atomically, over the state format of docs/algorithms.md
     * ("Stored state"), e.g. with a server-side script.  Returns RATE_OK
     * with *out filled, RATE_ENOTSUP when it cannot for this request (the
     * limiter then uses update, or load and cas), or another error. */
    int (*decide)(void *self, const char *key, size_t key_len,
                  rate_decide_req_t *req, rate_decision_t *out);

    /* Optional: fill what the store knows (NULL if absent). */
    int (*stats)(void *self, rate_stats_t *out);

    /* Free everything; self is not used again. */
    void (*destroy)(void *self);
} rate_store_vtable_t;

/* Wraps a back end into a store.  vtable is borrowed (usually static const);
 * self is owned by the store from now on: rate_store_free() calls destroy.
 * Needs load+cas or update.  Thread-safe: yes. */
RATE_API int rate_store_new(const rate_store_vtable_t *vtable, void *self,
                            rate_store_t **out);

#ifdef __cplusplus
}
#endif
#endif /* RATELIMIT_STORE_H */
