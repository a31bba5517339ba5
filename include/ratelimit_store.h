/* SPDX-License-Identifier: MIT */
/*
 * ratelimit_store.h -- for people writing a store (a back end).
 *
 * A store keeps one opaque byte string per key: the key's state.  The
 * library owns the meaning of those bytes; a store only keeps them, makes
 * each update atomic, and drops a key no sooner than its time-to-live.  A
 * back end is a method table (rate_store_methods_t, usually `static const`)
 * and a pointer of its own (`self`), handed to rate_store_new() by one
 * exported constructor of the back end's.  Two back ends written on this
 * header alone are the ones to copy: src/store/shm.c (update(), acquire()
 * and a bounded store's check_policy()) and tests/cas_store.c (load() and
 * cas() over a compare-and-set map, and start()).
 *
 * How a decision reaches a store.  The limiter checks the input, picks the
 * key's policy and reads the clock (before the store); then it calls ONE of
 * the entries below for the store's part; then it applies the fail mode,
 * shadow mode and its counters (after the store).  The store's part is,
 * in the order the limiter tries them:
 *
 *   acquire()  optional, the bool calls only: a plain try-acquire over a
 *              state the store already holds, answered in place with
 *              rate_state_acquire(); "not mine" sends the request on.
 *   decide()   optional: the whole decision made in the store (a server
 *              script); it may decline a request it cannot decide exactly.
 *              A table that sets decide_changes (version 4) is asked
 *              for refunds and penalties first too (rate_decide_req_t.op).
 *   update()   the store runs the library's step atomically itself (under
 *              its own lock), or
 *   load() + cas()  the generic pair for any compare-and-set store: the
 *              limiter runs the step between them and retries a conflict.
 *
 * A store provides update(), or load() and cas(), or all three; remove()
 * and destroy() always.  Everything else is optional (NULL).  start() is
 * the asynchronous form of the store's part, for event loops.
 *
 * Keys.  A key is 1..RATE_KEY_MAX bytes (any bytes, NUL too) in one of the
 * spaces of rate_space_t; two keys are the same key only when their space,
 * length and bytes are the same.  A store copies what it keeps.  A store
 * whose keys have a shorter bound (a shared-memory region's key_max)
 * returns RATE_EKEY from a method for a key past it: RATE_EKEY from a
 * store method means the key is invalid for this store, and the call
 * returns RATE_EKEY (as for a key longer than RATE_KEY_MAX), without the
 * fail mode; a store returns it for nothing else.  (The library's own
 * policy-space keys are 4 bytes: a store refusing one is a store error.)
 *
 * Threads.  Every method but destroy() may be called from any number of
 * threads at once, for the same key too: making that safe is the store's
 * job.  A method must never call back into the limiter or the store handle
 * (rate_limiter_* or rate_store_*); it may call the rate_state_* and
 * rate_policy_* functions.  The step functions the limiter hands a store
 * are pure (no lock, no I/O, no allocation): a store may run them under its
 * own lock, as often as it likes.
 *
 * Versions.  `version` is RATE_STORE_VERSION of the header the store was
 * built with; later versions only append members to the table, and the
 * library reads no member past the version's own.  Version 3 appended
 * check_policy(); a table of version 2 is still accepted (it has none).
 * Version 4 appended decide_changes (and rate_decide_req_t.op): the
 * decide() of a table that sets it is asked for refunds and penalties too.
 * Any other table's decide() (one of version 2 or 3, or of version 4 that
 * leaves it false, as a store rebuilt against this header without a word
 * about it does) is only ever asked for admissions (op
 * RATE_DECIDE_ACQUIRE): its refunds and penalties take update() or load()
 * and cas(), as before.  Version 5 appended lease(): an in-flight limit's
 * acquire, release, extend or count made whole in the store (a server
 * command or script, one round trip); a table of an earlier version has
 * none, and its leases take update() or load() and cas().  Version 6
 * appended lease_rate (and rate_lease_req_t's rate members): the lease()
 * of a table that sets it is asked an acquire together with the rate
 * limits of its policy, all or nothing, in one operation; any other
 * table's lease() is never handed rate limits (the library asks them of
 * decide() or the step after the lease, as before).  Version 6 also
 * appended fair(): a fair shares' decision (docs/fair.md) made whole in
 * the store, the shared limit and the fair table of its flows together
 * (one round trip on Redis); a table without it has none, and a fair
 * limit on it keeps its table in the process (or its shm_path file), as
 * before.
 */
#ifndef RATELIMIT_STORE_H
#define RATELIMIT_STORE_H

#include "ratelimit.h"

#ifdef __cplusplus
extern "C" {
#endif

#define RATE_STORE_VERSION 6

/* The spaces of keys a store keeps apart. */
typedef enum rate_space {
    RATE_SPACE_STATE = 0,  /* a key's state, as limiters enforce it */
    RATE_SPACE_SHADOW = 1, /* the state a shadow limiter keeps for a key */
    RATE_SPACE_POLICY = 2  /* the library's record of a policy that wrote
                              states into this store: key a 4-byte id,
                              bytes its text; written with RATE_TTL_FOREVER */
} rate_space_t;
#define RATE_SPACES 3

typedef struct rate_key {
    const char *bytes;  /* borrowed for the call */
    size_t len;         /* 1..RATE_KEY_MAX */
    rate_space_t space;
} rate_key_t;

/* A time-to-live that never ends: the key is kept until removed, and never
 * evicted by a bound on the store's size. */
#define RATE_TTL_FOREVER UINT64_MAX

/* ------------------------------------------------------------- the step */

/* One run of the step over a key's bytes.  The store fills the inputs; the
 * step fills the outputs. */
typedef struct rate_step_io {
    const void *old_state; /* in: the key's bytes; NULL when absent */
    size_t old_len;        /* in: their length (0 when absent) */
    void *new_state;       /* in: where to write the new bytes */
    size_t new_cap;        /* in: room there, >= old_len + rate_step_t.grow */
    size_t new_len;        /* out: length written */
    bool write;            /* out: store new_state; false: keep the bytes */
    uint64_t ttl_ns;       /* out: keep the key at least this long after
                              now_ns (RATE_TTL_FOREVER: always) */
} rate_step_io_t;

typedef struct rate_step {
    /* The step: reads io's inputs, writes its outputs.  RATE_OK, or a code
     * the store returns unchanged (without storing anything).  Pure: it
     * may run more than once (a store that retries). */
    int (*fn)(void *arg, rate_step_io_t *io);
    void *arg;         /* pass it to fn and is_cold */
    size_t grow;       /* the new state is at most old_len + grow bytes */
    uint64_t now_ns;   /* the request's time, for a store's expiries */
    /* 0, or a time that no later request on this store will carry a time
     * below (the library's clock now, or the caller's low-water mark).
     * A store that reclaims room may drop any key whose last write came
     * with a horizon and which is_cold() at this one: no answer changes.
     * (A key last written without a horizon, by a caller's own time, is
     * dropped only by a bound on the store's size, which is counted.) */
    uint64_t horizon_ns;
    /* Whether stored bytes (of any key of the space) are back at their
     * cold start at at_ns, so that dropping them changes no answer.  False
     * for bytes it cannot tell about (keep them). */
    bool (*is_cold)(void *arg, const void *state, size_t len, uint64_t at_ns);
} rate_step_t;

/* ------------------------------------------------------- the bool calls */

/* What a limiter's bool calls ask of acquire(), besides the key, the
 * permits and the time: made once per policy, so that a call passes only
 * its own values.  The store passes it on to rate_state_acquire(). */
typedef struct rate_acquire {
    const rate_policy_t *policy;
    uint32_t policy_id; /* the tag states made under policy carry */
    uint8_t format;     /* the state format written (docs/algorithms.md) */
    rate_space_t space; /* the key's space */
    bool horizon;       /* the request comes with a horizon: mark the key's
                           write as one (rate_step_t.horizon_ns) */
} rate_acquire_t;

/* What rate_state_acquire() returns (or RATE_ENOTSUP). */
enum {
    RATE_ACQUIRE_DENIED = 0, /* denied; the bytes are as they were */
    RATE_ACQUIRE_KEPT = 1,   /* allowed; the bytes are as they were */
    RATE_ACQUIRE_WROTE = 3   /* allowed; rewritten in place, same length:
                                keep the key at least *ttl_ns */
};

/* Decides a plain try-acquire of `permits` at now_ns over a key's whole
 * stored state[0..len), in place, when the state is one this pass can
 * decide (made under req->policy, one limit of a fixed size).  Call it
 * with the key locked as for an update.
 *
 * Returns: RATE_ACQUIRE_DENIED (the bytes are as they were),
 * RATE_ACQUIRE_KEPT (allowed, bytes as they were: permits 0) or
 * RATE_ACQUIRE_WROTE (allowed, state rewritten in place with the same
 * length, and *ttl_ns set: keep the key at least that long).  *ttl_ns is
 * written only for RATE_ACQUIRE_WROTE.
 *
 * Errors: RATE_ENOTSUP, with nothing touched, for anything else: a policy
 * of more than one limit or whose algorithm has no plain pass, a state of
 * another policy, format or size, or a corrupt time; the store's acquire()
 * then answers RATE_ENOTSUP too.  req and ttl_ns must not be NULL (not
 * checked).
 *
 * Ownership: req and state are borrowed for the call; state is changed in
 * place; nothing is kept.
 *
 * Thread-safe: yes (on distinct bytes); the caller holds the key's lock. */
RATE_API int rate_state_acquire(const rate_acquire_t *req, uint64_t permits,
                                uint64_t now_ns, void *state, size_t len,
                                uint64_t *ttl_ns);

/* --------------------------------------------------- whole decisions */

/* What decide() is asked to do (rate_decide_req_t.op). */
typedef enum rate_decide_op {
    /* An admission: decide `permits` at now_ns and fill *out. */
    RATE_DECIDE_ACQUIRE = 0,
    /* A refund (rate_limiter_refund): give `permits` back.  A key with no
     * state has nothing to give back: RATE_OK, nothing written. */
    RATE_DECIDE_REFUND = 1,
    /* A penalty (rate_limiter_penalize): charge `permits` whatever
     * remains; on a key with no state, charged from its cold start. */
    RATE_DECIDE_PENALTY = 2
} rate_decide_op_t;

/* A whole decision, or a whole refund or penalty, for decide(). */
typedef struct rate_decide_req {
    const rate_policy_t *policy; /* read it with rate_policy_count/limit */
    uint32_t policy_id;  /* the tag of states made under policy */
    uint8_t format;      /* the state format to write */
    uint64_t now_ns;     /* the request's time */
    bool clock_time;     /* now_ns is the limiter's clock's: a store with a
                            clock of its own (Redis TIME) may use that */
    uint64_t permits;
    uint64_t max_wait_ns;
    bool detail;         /* false: only allowed/reason/delay are read */
    uint64_t max_reset_ns; /* a bound on reset_after when !detail */
    uint64_t horizon_ns; /* as rate_step_t.horizon_ns */
    /* Version 4: what is asked (always RATE_DECIDE_ACQUIRE for a table
     * without decide_changes).  For a refund or a
     * penalty, max_wait_ns is 0, detail false, and *out is scratch: the
     * limiter reads nothing of it. */
    rate_decide_op_t op;
} rate_decide_req_t;

/* ----------------------------------------------------------- leases */

/* What lease() is asked (rate_lease_req_t.op). */
typedef enum rate_lease_op {
    RATE_LEASE_OP_ACQUIRE = 0, /* add a lease if the class has room */
    RATE_LEASE_OP_RELEASE = 1, /* remove the lease `id` */
    RATE_LEASE_OP_EXTEND = 2,  /* move the lease `id`'s expiry */
    RATE_LEASE_OP_COUNT = 3    /* only count (writes only expired ones out) */
} rate_lease_op_t;

/* One lease operation for lease(): the request, then what it found.  The
 * library fills the inputs; the store fills the outputs.  The state it
 * works on is the lease state of docs/leases.md ("Internals"): a 14-byte
 * header and 24 bytes per lease, little-endian. */
typedef struct rate_lease_req {
    rate_lease_op_t op;
    uint64_t now_ns;     /* the request's time: leases expired by then
                            (expires_ns <= now_ns) are dropped first */
    uint64_t max;        /* the policy's N, 1..10000 */
    uint64_t reserve;    /* leases kept for critical requests, below max */
    bool critical;       /* acquire: the request's class is critical */
    uint64_t id;         /* acquire: the new lease's id (never 0);
                            release, extend: the lease's */
    uint64_t expires_ns; /* acquire, extend: the new expiry; release: the
                            handle's, to tell expired from released */
    uint32_t pid;        /* acquire: the holder's process (0: unknown) */
    /* out */
    bool granted;         /* acquire: the lease was added */
    uint64_t held;        /* unexpired leases after the operation */
    uint64_t retry_at_ns; /* acquire denied: when the class gets a slot
                             back (see lease()) */
    uint64_t latest_ns;   /* the latest expiry held after it (0: none) */
    /* Version 6, only for a table that sets lease_rate, only with
     * RATE_LEASE_OP_ACQUIRE: the rate limits decided with the lease, all
     * or nothing (see lease()); rate NULL: the lease alone. */
    const rate_decide_req_t *rate; /* in: as decide() would be asked it */
    const rate_key_t *rate_key;    /* in: the rate state's key */
    rate_decision_t *rate_out;     /* out: the rate decision, when made */
    bool rate_decided;             /* out: *rate_out was made (the class
                                      had room for the lease) */
} rate_lease_req_t;

/* ------------------------------------------------------ fair shares */

/* The flow of one fair decision for fair() (version 6): the request, then
 * what it found.  The library fills the inputs; the store fills the
 * outputs. */
typedef struct rate_fair_req {
    uint64_t flow_hash; /* the flow's 64-bit hash (XXH3 of its bytes, seed
                           0; never 0): equal on every host */
    uint32_t weight;    /* 1..2^20 (RATE_FAIR_WEIGHT_MAX) */
    uint32_t slots;     /* a new table's entries, 1..4096; a table made
                           already keeps its own */
    /* out */
    bool fair_denied;   /* denied by the fair rule: the room left would not
                           keep the reserve of the flows behind */
    bool shared;        /* the flow found no entry of its own (it shares
                           its home entry) */
    uint64_t reserved[4]; /* zero: room for later fields */
} rate_fair_req_t;

/* ---------------------------------------------------- asynchronous part */

/* The store's part of one decision, run later.  The limiter fills it and
 * keeps it alive until done() has been called; the store must not touch it
 * after calling done(). */
typedef struct rate_job rate_job_t;
struct rate_job {
    rate_key_t key;
    const rate_step_t *step;       /* what update() would run */
    const rate_decide_req_t *req;  /* what decide() would be asked, or NULL
                                      (then: the step); a refund's or a
                                      penalty's only for a table that sets
                                      decide_changes */
    rate_decision_t *out;          /* decide()'s out */
    /* Called exactly once, with the code update() (what step->fn
     * returned) or, when req is not NULL and the store made the whole
     * decision, decide() would have returned (RATE_ENOTSUP too: the
     * limiter then starts the job again with req NULL); never from inside
     * start().  On which thread: the store's documentation says (an event
     * loop's store calls it on the loop's thread).  A store destroyed with
     * jobs in flight calls each one's done() with RATE_ECANCELED before
     * destroy() returns (the asynchronous Redis store does). */
    void (*done)(rate_job_t *job, int rc);
    void *ud; /* the limiter's */
    /* Version 5: a lease operation (see lease()), or NULL.  A store that
     * makes it whole, as lease() would, fills its outputs and sets
     * lease_made before done(job, RATE_OK); a store that does not (one
     * that does not know this member, or declines) runs `step`, which is
     * then the lease step, as for update(): the same answer. */
    rate_lease_req_t *lease;
    bool lease_made;
};

/* ------------------------------------------------------------ the table */

typedef struct rate_store_methods {
    int version;      /* RATE_STORE_VERSION */
    const char *name; /* "memory", "redis", ... */

    /* Copy the key's bytes into buf (cap bytes), set *len and *version
     * (both 0 when absent).  If they are longer than cap, set *len to their
     * length and return RATE_EINVAL without copying: the limiter calls
     * again with a larger buffer.  A version is never 0 for a present key
     * and never comes back for the same key after a change. */
    int (*load)(void *self, const rate_key_t *key, void *buf, size_t cap,
                size_t *len, uint64_t *version);
    /* Replace the key's bytes if its version is still `version` (0: only
     * if absent), and keep them at least ttl_ns.  RATE_OK, RATE_ECONFLICT
     * when the version moved (nothing written), or another error. */
    int (*cas)(void *self, const rate_key_t *key, uint64_t version,
               const void *state, size_t len, uint64_t ttl_ns);

    /* Run step->fn once over the key's bytes, atomically with respect to
     * every other call on the key, and store io.new_state when io.write.
     * Returns what step->fn returned, or the store's own error. */
    int (*update)(void *self, const rate_key_t *key, const rate_step_t *step);

    /* Optional.  For a key of req->space the store holds: lock it as
     * update() would and return rate_state_acquire()'s verdict (0 denied,
     * 1 allowed); never called for the policy space.  For a
     * key it does not hold, or RATE_ENOTSUP from rate_state_acquire(), or
     * any trouble: RATE_ENOTSUP, with nothing changed (the limiter then
     * takes the general path, which reports any error). */
    int (*acquire)(void *self, const rate_acquire_t *req, const char *key,
                   size_t key_len, uint64_t permits, uint64_t now_ns);

    /* Optional: make the whole decision in the store, atomically, over the
     * state format of docs/algorithms.md ("Stored state"), e.g. with a
     * server-side script.  RATE_OK with *out filled, RATE_ENOTSUP when it
     * cannot for this request (the limiter then uses update or load and
     * cas: nothing may have been written), or another error.
     *
     * With decide_changes (version 4): req->op RATE_DECIDE_REFUND or
     * RATE_DECIDE_PENALTY asks
     * for the whole change, atomically, exactly as the library's step
     * makes it (docs/algorithms.md, "Changes outside an admission"): the
     * state read under req->policy at t_eff = max(now_ns, t_last),
     * changed by each limit's rule, and written back as of t_eff (t_last
     * becomes t_eff) with the same bytes the step would write, kept at
     * least as long as the step's expiry says (rate_step_io_t.ttl_ns); a
     * refund of a key with no state writes nothing.  RATE_OK once done
     * (*out unread); RATE_ENOTSUP, with nothing written, for any change it
     * cannot make exactly (a state of another policy or format, a
     * composite policy, an op it does not know...): the limiter then runs
     * the step through update or load and cas.  Other errors are the
     * call's (a refund or a penalty has no fail mode). */
    int (*decide)(void *self, const rate_key_t *key,
                  const rate_decide_req_t *req, rate_decision_t *out);

    /* Optional: the store's own clock, in ns, when it keeps one (Redis
     * TIME); used for decisions on the library's clock that decide()
     * declined, so that every client goes by one clock. */
    int (*now)(void *self, uint64_t *now_ns);

    /* Forget the key (nothing to forget is RATE_OK too). */
    int (*remove)(void *self, const rate_key_t *key);

    /* Optional: begin the store's part of a decision and finish it later
     * through job->done.  RATE_OK once begun; any other code means it did
     * not begin and done() will not be called.  A store without it is
     * called synchronously (update or load/cas) by the asynchronous
     * calls. */
    int (*start)(void *self, rate_job_t *job);

    /* Optional: fill what the store knows (keys, evictions, reclaimed,
     * bytes); out is zeroed first. */
    int (*stats)(void *self, rate_stats_t *out);

    /* Free everything; self is not used again. */
    void (*destroy)(void *self);

    /* Version 3.  Optional: whether the store can keep every state of
     * `policy`, whose states are at most max_state bytes
     * (rate_policy_state_max), for a store whose values have a bound (a
     * DynamoDB item holds 400 KB, a shared-memory region keeps state_max
     * bytes).  RATE_OK, or RATE_EPOLICY with, when
     * err is not NULL, a one-line message (errlen bytes with the NUL)
     * saying why.  Called by rate_store_check_policy(): by the limiter
     * when a policy is set (rate_limiter_new, rate_limiter_set_policy),
     * and for a resolver's or a rule's policy before each decision under it (then a
     * refusal is that decision's store error).  Thread-safe, pure: no
     * I/O. */
    int (*check_policy)(void *self, const rate_policy_t *policy,
                        size_t max_state, char *err, size_t errlen);

    /* Version 4.  Whether decide() makes refunds and penalties too
     * (rate_decide_req_t.op, see decide()).  False, the value of a table
     * that does not name it: decide() is asked for admissions only, as
     * before version 4, whatever version the table says. */
    bool decide_changes;

    /* Version 5.  Optional: one lease operation made whole in the store,
     * atomically with respect to every other call on the key (a server
     * command or script: one round trip).  Exactly the lease step
     * (src/lease/step.c), over the key's bytes, so that a key written by
     * it and one written by update() or load() and cas() are the same
     * bytes: the entries expired at now_ns are dropped in order, then
     * ACQUIRE appends {id, expires_ns, pid, class} when fewer than the
     * class's limit are held (max, or max - reserve for a normal
     * request), RELEASE moves the last entry into the released one's
     * place, EXTEND rewrites the entry's expiry, COUNT changes nothing;
     * the state is written back (header: latest expiry, count) only when
     * an entry was dropped, added, removed or moved, kept at least until
     * its latest expiry (a bare header: expiry 0).  A denied acquire's
     * retry_at_ns is the earliest expiry held, or, for a normal request
     * under a reserve, the (held - limit + 1)-th earliest.
     * Returns: RATE_OK with req's outputs; RATE_ELEASE (release or
     * extend of an id the key does not hold, and which was not expired:
     * not in the state read and expires_ns > now_ns) or RATE_EEXPIRED
     * (the id was there but expired, or expires_ns <= now_ns), nothing
     * written; RATE_ECORRUPT for bytes that are not a lease state (not
     * written over); RATE_ENOTSUP, with nothing written, when it cannot
     * make this one (the library then runs the step through update() or
     * load() and cas()); or the store's own error.
     *
     * With lease_rate (version 6), an acquire may come with req->rate:
     * the policy's rate limits, to be decided in the same atomic
     * operation, over the state of req->rate_key, exactly as decide()
     * would decide req->rate there.  First the entries expired at now_ns
     * are dropped, as a COUNT drops them; then, if the class has no room,
     * the acquire is denied as above and the rate limits are not asked
     * (nothing charged, rate_decided false); else the rate decision is
     * made into *req->rate_out (rate_decided true), and only if it admits
     * is the lease appended (granted).  A rate denial leaves the lease
     * state as the COUNT left it.  RATE_ENOTSUP when the store cannot
     * decide these rate limits exactly: no lease added, nothing charged
     * (expired leases may have been dropped, as a COUNT drops them); the
     * library then acquires the lease alone and decides the rate limits
     * after it. */
    int (*lease)(void *self, const rate_key_t *key, rate_lease_req_t *req);

    /* Version 6.  Whether lease() takes an acquire's rate limits too
     * (rate_lease_req_t.rate, see lease()).  False, the value of a table
     * that does not name it: lease() is never handed rate limits. */
    bool lease_rate;

    /* Version 6 too.  Optional: one not-waiting decision of a shared limit
     * with fair shares (docs/fair.md), made whole in the store,
     * atomically with respect to every other call on the key and on its
     * fair table (a server command or script: one round trip).  `key` is
     * the shared limit's; the store keeps the fair table beside it (on
     * Redis: on the key's hash tag, docs/fair.md).  req is the
     * shared limit's admission as decide() gets it (op
     * RATE_DECIDE_ACQUIRE, max_wait_ns 0).  The rule, exactly as
     * src/fair/step.c makes it: the flow is counted in its entry of the
     * table (a bounded table of req->slots entries, 8 probes, a flow
     * past them sharing its home entry); the shared limit decides the
     * request as decide() would; an admission of a flow ahead of the
     * least served active one stands only if the shared limit's
     * remaining after it keeps the reserve of the flows behind (else
     * nothing of the shared limit is written, *out is a denial with
     * reason RATE_REASON_LIMITED, remaining + permits and an estimated
     * retry_after, and fair->fair_denied is set); an admission is charged
     * to the flow's service.  The table is written whatever the answer.
     * Returns: RATE_OK with *out and fair's outputs; RATE_ENOTSUP, with
     * nothing written, when it cannot decide this one exactly (the fair
     * limit then decides it on its table in the process, as for a store
     * without fair()); RATE_ECORRUPT for a fair table (or a state) whose
     * bytes are not one (left as they are); or the store's own error
     * (then the limiter's fail mode decides). */
    int (*fair)(void *self, const rate_key_t *key,
                const rate_decide_req_t *req, rate_fair_req_t *fair,
                rate_decision_t *out);
} rate_store_methods_t;

/* Wraps a back end (a method table and its own pointer) into a store.
 *
 * Returns: RATE_OK with the new store in *out.
 *
 * Errors: RATE_EINVAL for a NULL out or methods, a version other than 2 to
 * 6, or a table without destroy, remove, and update or load+cas
 * (decide() alone is not enough: it may decline); RATE_ENOMEM.  *out is
 * NULL on an error (when out is not NULL).
 *
 * Ownership: methods is borrowed (usually static const) and must outlive
 * the store; on RATE_OK self is owned by the store (rate_store_free()
 * calls destroy), else it stays the caller's.  The caller frees the store
 * with rate_store_free().
 *
 * Thread-safe: yes. */
RATE_API int rate_store_new(const rate_store_methods_t *methods, void *self,
                            rate_store_t **out);

/* Finds a store's back end: how a back end's own public calls find
 * themselves (rate_store_redis_drop).
 *
 * Returns: the back end's pointer (self) when `store` was made with
 * `methods`, else NULL (a NULL store too).
 *
 * Errors: none.
 *
 * Ownership: store and methods are borrowed for the call; the pointer
 * returned stays the store's (valid until rate_store_free()).
 *
 * Thread-safe: yes. */
RATE_API void *rate_store_backend(const rate_store_t *store,
                                  const rate_store_methods_t *methods);

/* A fair decision made whole in the limiter's store (its fair(), version
 * 6): the shared limit `key` under `policy` (NULL: the limiter's own, or
 * its resolver's), the flow in *fair, `permits` at the limiter's clock
 * (rate_limiter_check_fair: a store with a clock of its own, Redis TIME,
 * may use it) or at now_ns (_at).  How the fair layer reaches a fleet's
 * table (docs/fair.md); a program has little reason to call it itself.
 * Returns: RATE_OK with *out (the limiter's fail mode, shadow mode and
 * counters applied, as rate_limiter_check) and fair's outputs;
 * RATE_ENOTSUP, with nothing counted or written, when the store has no
 * fair() or declines this request (the caller decides another way).
 * Errors (*out zeroed): RATE_EINVAL for a NULL limiter, fair or out, a
 * zero flow_hash, a weight of 0 or above 2^20, slots of 0 or above 4096,
 * or non-zero reserved words; RATE_EKEY for a NULL, empty or too long
 * key; RATE_ERANGE for permits or now_ns above RATE_TIME_MAX.
 * Called with key, fair and out all NULL, it only asks: RATE_OK when the
 * limiter's store has fair(), else RATE_ENOTSUP (a NULL limiter too).
 * Ownership: nothing kept.  Thread-safe: yes. */
RATE_API int rate_limiter_check_fair(rate_limiter_t *lim,
                                     const rate_policy_t *policy,
                                     const char *key, size_t key_len,
                                     rate_fair_req_t *fair, uint64_t permits,
                                     rate_decision_t *out);
RATE_API int rate_limiter_check_fair_at(rate_limiter_t *lim,
                                        const rate_policy_t *policy,
                                        const char *key, size_t key_len,
                                        rate_fair_req_t *fair,
                                        uint64_t permits, uint64_t now_ns,
                                        rate_decision_t *out);

/* ------------------------------------- operations beside the limiter */

/* For a layer above the limiter that has the store decide the limiter's
 * rate limits inside another operation of its own (an inflight object's
 * acquire, its lease and its rate limits in one lease(), docs/leases.md):
 * the decide() request of one permit on `key` at now_ns, exactly as the
 * limiter would ask it (the key's policy, its tag in the store, the state
 * format, the horizon).  clock_time: now_ns is the limiter's clock's.
 * wait: may write the policy's record in the store first (a store call);
 * false: never does, and answers RATE_ENOTSUP until the limiter's own
 * calls have written it (for an event loop's thread).
 * Returns: RATE_OK with *req.  RATE_ENOTSUP, *req untouched, for anything
 * the caller should instead leave to the limiter's own calls: a NULL
 * limiter, a shadow limiter with a space of its own, an unlimited policy,
 * a bad key or time, the policy's record not (yet) written, or a store
 * error (the limiter's own call then reports it).
 * Errors: RATE_EINVAL for a NULL req.
 * Ownership: req->policy is the limiter's, valid while the limiter lives
 * and its policy is not replaced (use it within the operation); nothing
 * else is kept.  Thread-safe: yes. */
RATE_API int rate_limiter_decide_req(rate_limiter_t *lim, const char *key,
                                     size_t key_len, uint64_t now_ns,
                                     bool clock_time, bool wait,
                                     rate_decide_req_t *req);

/* The store's table, for a layer that calls a method the limiter has no
 * call for (lease(), start(); its version, name and lease_rate): call a
 * method with rate_store_backend(store, table) as its self, and read no
 * member past table->version's own (see "Versions" above).
 * Returns: the table the store was made with; NULL for a NULL store.
 * Errors: none.  Ownership: the table is the back end's (borrowed; valid
 * until rate_store_free()).  Thread-safe: yes. */
RATE_API const rate_store_methods_t *
rate_store_methods(const rate_store_t *store);

/* Runs `step` over `key` through the store, as the limiter runs its own:
 * update(), or load() and cas() with the step between them, retried on a
 * conflict (up to 64 times).
 * Returns: what step->fn returned (RATE_OK or the step's own code).
 * Errors: RATE_ECONFLICT when the retries ran out (nothing written by
 * this call); RATE_EINVAL for a NULL store, key, step or step->fn, or a
 * key whose space is none; RATE_EKEY for a key with NULL or no bytes, or
 * longer than RATE_KEY_MAX (or than the store keeps); the store's own
 * errors.  Ownership: key and step are borrowed for the call; nothing is
 * kept.  Thread-safe: yes (the store makes each run atomic). */
RATE_API int rate_store_step(const rate_store_t *store, const rate_key_t *key,
                             const rate_step_t *step);

/* Whether the store is one of this library's stores whose holders live on
 * this host: its memory store (this process's) or its shared-memory store
 * (this host's), where a process id names a process and kill() can judge
 * it (rate_inflight_config_t.reap_dead_holders).
 * Returns: true for those two; false for any other store and for NULL.
 * Errors: none.  Ownership: nothing kept.  Thread-safe: yes. */
RATE_API bool rate_store_is_host_local(const rate_store_t *store);

#ifdef __cplusplus
}
#endif
#endif /* RATELIMIT_STORE_H */
