/* SPDX-License-Identifier: MIT */
/*
 * ratelimit.h -- exact rate limiting for C and C++ servers.
 *
 * A limiter (rate_limiter_t) answers "may KEY spend N permits now?" under a
 * policy (rate_policy_t): one to RATE_MAX_LIMITS limits, each one of five
 * algorithms.  Decisions follow docs/algorithms.md exactly, in integer
 * arithmetic; the state of every key lives in a store (rate_store_t): the
 * in-memory store by default, or any back end written against
 * ratelimit_store.h.
 *
 * Layers.  This header is the core: errors, policies, decisions, the
 * limiter and the memory store; it needs nothing but the C library and
 * pthreads.  Each other part has a header of its own, built on this one,
 * and a program includes only what it uses:
 *   ratelimit_store.h    the contract a store implements
 *   ratelimit_shm.h      the shared-memory store (processes of one host)
 *   ratelimit_redis.h    the Redis and Redis Cluster stores
 *   ratelimit_dynamodb.h the DynamoDB store
 *   ratelimit_synced.h   local decisions over leases of a remote store
 *   ratelimit_http.h     the RateLimit header fields and the rules file
 *   ratelimit_loop.h     event loops (ratelimit_uv.h, ratelimit_event.h)
 * Redis, DynamoDB and the HTTP layer are optional parts of the library
 * (docs/install.md: RATE_WITH_REDIS, RATE_WITH_DYNAMODB, RATE_WITH_HTTP).
 *
 * Conventions.  Each function's comment says what it does, then Returns,
 * Errors, Ownership and Thread-safe.  Errors are negative RATE_E* codes
 * (rate_strerror names them); a denial is no error but RATE_OK with a
 * decision whose `allowed` is false.  Times are nanoseconds up to
 * RATE_TIME_MAX: CLOCK_MONOTONIC by default, the caller's in the *_at
 * calls.  Whoever calls a *_new calls its *_free (NULL: nothing); keys are
 * copied, never kept by reference.  Policies are immutable and limiters
 * and stores thread-safe, but a *_free must not race other calls.
 * Signal handlers: the calls that only read static storage (rate_strerror,
 * rate_err_name, rate_reason_name, rate_algorithm_name) and the clock
 * reads rate_clock_monotonic_ns and rate_clock_coarse_ns are
 * async-signal-safe; no other call is (they may allocate or take a lock
 * that the interrupted thread holds).
 *
 * ABI.  From 0.4 on the soname (libratelimit.so.1) changes only if the
 * ABI must break.  Structs a caller fills in or allocates end with
 * reserved words for later fields: zero them (`= {...}` or memset); a
 * non-zero reserve is refused (docs/design.md, "A stable ABI").
 */
#ifndef RATELIMIT_H
#define RATELIMIT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(RATE_BUILDING) && defined(__GNUC__)
#define RATE_API __attribute__((visibility("default")))
#else
#define RATE_API
#endif

#define RATE_VERSION_MAJOR 0
#define RATE_VERSION_MINOR 4
#define RATE_VERSION_PATCH 0

/* ---------------------------------------------------------------- errors */

#define RATE_ERRNO_MAP(X)                                                   \
    X(EINVAL, -1, "invalid argument")                                       \
    X(ENOMEM, -2, "out of memory")                                          \
    X(EKEY, -3,                                                             \
      "key is NULL, empty, reserved (begins \\xffLEASE\\x01\\0), or longer " \
      "than RATE_KEY_MAX bytes or than the store keeps")                    \
    X(EPOLICY, -4, "invalid policy")                                        \
    X(ERANGE, -5, "time or permits out of range")                           \
    X(ESTORE, -6, "store unavailable")                                      \
    X(ETIMEDOUT, -7, "store did not answer in time")                        \
    X(EFULL, -8, "store has no room for a new key")                         \
    X(ECONFLICT, -9, "too many concurrent updates of one key (CAS retries)") \
    X(ECORRUPT, -10, "stored state is not valid for this library")          \
    X(ENOTSUP, -11, "the store cannot make this decision itself")          \
    X(ECANCELED, -12, "cancelled: its store or fair limit was freed "    \
                      "before it was answered")                           \
    X(ELEASE, -13, "no such lease held: released already")                 \
    X(EEXPIRED, -14, "the lease expired: its slot was given back")

typedef enum rate_status {
    RATE_OK = 0,
#define RATE_X_(name, code, text) RATE_##name = code,
    RATE_ERRNO_MAP(RATE_X_)
#undef RATE_X_
} rate_status_t;

/* rate_strerror: an error code's text; rate_err_name: its name, e.g.
 * "RATE_EKEY" (RATE_OK's and RATE_PENDING's too, which are no errors).
 * Returns: never NULL ("unknown error", "RATE_EUNKNOWN" for a code not in
 * the list).  Errors: none.  Ownership: static storage.  Thread-safe: yes. */
RATE_API const char *rate_strerror(int err);
RATE_API const char *rate_err_name(int err);

/* ----------------------------------------------------------- constants */

#define RATE_NEVER UINT64_MAX          /* retry_after of a request that can never succeed */
#define RATE_TIME_MAX ((uint64_t)INT64_MAX) /* largest time or duration, ns */
#define RATE_KEY_MAX 512               /* longest key, bytes */
/* Keys that begin with these 8 bytes (FF 'LEASE' 01 00) are the library's
 * own (the state of a key's in-flight leases, docs/leases.md): a call
 * given one returns RATE_EKEY (a bool call: false). */
#define RATE_KEY_RESERVED "\xffLEASE\x01"
#define RATE_KEY_RESERVED_LEN 8u       /* its bytes, the NUL included */
#define RATE_MAX_LIMITS 4              /* limits in one policy */
#define RATE_SLIDING_LOG_MAX 10000u    /* largest limit of a sliding log */
#define RATE_NO_LIMIT UINT64_MAX       /* limit and remaining of an unlimited
                                          policy's decision */

#define RATE_NS_PER_S UINT64_C(1000000000)

/* ------------------------------------------------------------- policies */

/* The algorithms, one line each (the library's one map of them: it makes
 * the enum below, the names and aliases the text form takes, the option a
 * bucket takes, and the words every message uses):
 *   X(ID, value, name, alias ("" none), option ("" for a window, which
 *     takes none), what P is called, the table in src/algo/)
 * Adding an algorithm: a line here, its file in src/algo/ (defining
 * rate__<table>), and that file in CMakeLists.txt (docs/design.md).
 *   token-bucket    rate L per P, burst B; "gcra" is the same
 *   leaky-bucket    rate L per P, capacity C
 *   fixed-window    limit L per window W
 *   sliding-log     limit L per window W, exact
 *   sliding-window  limit L per window W, the two-window counter */
#define RATE_ALGORITHM_MAP(X)                                                \
    X(TOKEN_BUCKET, 1, "token-bucket", "gcra", "burst", "period",             \
      token_bucket)                                                          \
    X(LEAKY_BUCKET, 2, "leaky-bucket", "", "capacity", "period",              \
      leaky_bucket)                                                          \
    X(FIXED_WINDOW, 3, "fixed-window", "", "", "window", fixed_window)       \
    X(SLIDING_LOG, 4, "sliding-log", "sliding-window-log", "", "window",      \
      sliding_log)                                                           \
    X(SLIDING_WINDOW, 5, "sliding-window", "sliding-window-counter", "",      \
      "window", sliding_window)

typedef enum rate_algorithm {
#define RATE_X_(id, value, name, alias, option, span, table) \
    RATE_##id = value,
    RATE_ALGORITHM_MAP(RATE_X_)
#undef RATE_X_
} rate_algorithm_t;

/* The algorithm's canonical name ("token-bucket").  Returns: the name (NULL
 * for none).  Errors: none.  Ownership: static storage.  Thread-safe: yes. */
RATE_API const char *rate_algorithm_name(rate_algorithm_t algorithm);

/* The algorithm a name or alias names ("gcra", "sliding-window-log",
 * "sliding-window-counter" too), exactly as the text form spells it.
 * Returns: RATE_OK, *out.  Errors: RATE_EINVAL for a NULL name or out, or
 * a name that is none.  Ownership: nothing is kept.  Thread-safe: yes. */
RATE_API int rate_algorithm_parse(const char *name, rate_algorithm_t *out);

/* One limit: a plain value the caller fills. */
typedef struct rate_limit {
    rate_algorithm_t algorithm;
    uint64_t limit;     /* L: permits per period (buckets) or per window */
    uint64_t period_ns; /* P for the buckets, W for the windows */
    uint64_t burst;     /* B (token bucket) or C (leaky bucket); 0 for windows */
    uint64_t block_ns;  /* 0, or: once this limit denies a request (a
                           "limited", not a "never"), the key stays denied
                           this long (at most 2^61 ns; text: block=DUR) */
    uint64_t reserved[2]; /* zero (= {...} or memset): room for later
                               fields; non-zero is RATE_EPOLICY */
} rate_limit_t;

/* An immutable set of 1..RATE_MAX_LIMITS limits, all applied to one key. */
typedef struct rate_policy rate_policy_t;

/* Makes a policy from `count` limits.  Bounds, within which every decision is
 * exact (64/128-bit integers, docs/algorithms.md): limit, period and burst
 * (capacity) from 1 to 2^63-1 (every count up to 2^53 and beyond); a window,
 * and a bucket's period, up to 2^61 ns (73 years) -- a bucket's period may be
 * longer when burst * period <= 2^62; a window takes no burst (0); a sliding
 * log's limit <= RATE_SLIDING_LOG_MAX.  Durations a decision reports past
 * 2^63-1 ns (a huge bucket refilling at 1 per 2^61 ns) read RATE_TIME_MAX.
 * Returns: RATE_OK, the policy in *out (NULL on an error).  Errors:
 * RATE_EINVAL for a NULL out; RATE_EPOLICY for NULL limits, a count of 0 or
 * above RATE_MAX_LIMITS, or a limit outside these bounds (or with an unknown
 * algorithm, a block above 2^61 ns, a non-zero reserve), with, if `err` is not
 * NULL, a one-line reason naming the bad part (at most errlen bytes with the
 * NUL); RATE_ENOMEM.  Ownership: the limits are copied; the caller frees *out
 * (rate_policy_free).  Thread-safe: yes. */
RATE_API int rate_policy_new(const rate_limit_t *limits, size_t count,
                             rate_policy_t **out, char *err, size_t errlen);

/* Parses the policy text form (docs/policy.md), for example
 *   "token-bucket 10/s burst=20"      "leaky-bucket 5/s capacity=10"
 *   "sliding-window 100/1m"           "unlimited"
 *   "name=free token-bucket 10/s burst=20"   (a named policy)
 *   "token-bucket 10/s burst=10; sliding-log 1000/1h"
 * Returns, Errors: as rate_policy_new; RATE_EPOLICY also for NULL or bad
 * text.  Ownership: the text is only read; the caller frees *out
 * (rate_policy_free).  Thread-safe: yes. */
RATE_API int rate_policy_parse(const char *text, rate_policy_t **out,
                               char *err, size_t errlen);

/* Writes the policy's canonical text (parsable again) into buf, truncating
 * to len bytes with the NUL (buf NULL: only measures, whatever len).  A named
 * policy's text starts with "name=NAME ".  Returns: the length the whole
 * text needs, the NUL not counted (0 for a NULL policy).  Errors: none.
 * Ownership: nothing is kept.  Thread-safe: yes. */
RATE_API size_t rate_policy_format(const rate_policy_t *policy, char *buf,
                                   size_t len);

/* rate_policy_state_max: the largest stored state of a key under the
 * policy, a sliding log's full log included; rate_policy_fingerprint: its
 * 32-bit fingerprint, a hash of its limits, which tagged the states of the
 * first edition's format; a store's records start a policy's id from it
 * (both: docs/algorithms.md, "Stored state").  Returns: the size in bytes
 * (0 for the unlimited policy), the fingerprint; 0 for NULL.
 * Errors: none.  Ownership: nothing is kept.  Thread-safe: yes. */
RATE_API size_t rate_policy_state_max(const rate_policy_t *policy);
RATE_API uint32_t rate_policy_fingerprint(const rate_policy_t *policy);

/* Longest policy name, bytes. */
#define RATE_POLICY_NAME_MAX 64

/* Names the policy: 1..RATE_POLICY_NAME_MAX bytes of letters, digits, '.', '_'
 * and '-' (so that it is an HTTP structured-field string and a Prometheus
 * label value as it is), or NULL or "" for no name.  The name is what the
 * RateLimit-Policy field (rate_headers_format) and a listener (rate_event_t)
 * call the policy; it is no part of its identity: two policies with the same
 * limits and other names share each key's state, and renaming a policy resets
 * no key.  Name a policy before any limiter or other thread uses it (it is
 * then immutable).  rate_policy_name reads it.
 * Returns: RATE_OK; the name, "" when it has none (and for NULL).  Errors:
 * RATE_EINVAL for a NULL policy or a bad name (the name then unchanged), with,
 * if `err` is not NULL, a one-line reason (at most errlen bytes with the NUL);
 * reading: none.  Ownership: the name is copied (limiters copy it with the
 * policy); the one read is borrowed: lives as long as the policy.
 * Thread-safe: naming: no (on the same policy); reading: yes. */
RATE_API int rate_policy_set_name(rate_policy_t *policy, const char *name,
                                  char *err, size_t errlen);
RATE_API const char *rate_policy_name(const rate_policy_t *policy);

/* Makes the `unlimited` policy (the text "unlimited"; an enterprise tier;
 * rate_policy_is_unlimited tells it): every request is allowed, nothing is
 * written to any store, no key is charged.  It has no limits and stands
 * alone (a composite with it is an error).  Its decisions: allowed,
 * component -1, limit and remaining RATE_NO_LIMIT, the durations 0; an
 * HTTP server sends no RateLimit fields for them.
 * Returns: RATE_OK, the policy in *out; true or false (false for NULL).
 * Errors: RATE_EINVAL for a NULL out; RATE_ENOMEM (*out NULL); testing: none.
 * Ownership: the caller frees *out (rate_policy_free).  Thread-safe: yes. */
RATE_API int rate_policy_unlimited(rate_policy_t **out);
RATE_API bool rate_policy_is_unlimited(const rate_policy_t *policy);

/* The number of limits, and the i-th.  Returns: the count, and the limit
 * (NULL for i >= the count); 0 and NULL for the unlimited policy and NULL.
 * Errors: none.  Ownership: the limit is borrowed: lives as long as the
 * policy.  Thread-safe: yes. */
RATE_API size_t rate_policy_count(const rate_policy_t *policy);
RATE_API const rate_limit_t *rate_policy_limit(const rate_policy_t *policy,
                                               size_t i);

/* The text parsers of the policy text form, each the one that
 * rate_policy_parse uses, for programs that read a count, a duration or a
 * rate on their own (a command's options).  For each: Returns: RATE_OK and
 * the value (nothing is written to the outputs on an error).  Errors: as
 * listed below, each with, if `err` is not NULL, a one-line message (at
 * most errlen bytes with the NUL) whose subject is the quoted text, so
 * that it reads after an option's name: "--window '1.5s' is not a
 * duration: ...".  Ownership: nothing is kept.  Thread-safe: yes. */

/* Parses a count: a whole number from 0 to 2^63-1, digits only.
 * Returns: RATE_OK, the count in *out.  Errors: RATE_EINVAL for NULL text
 * or out, or anything but digits ("", "-1", "1.5", " 1"); RATE_ERANGE for
 * digits above 2^63-1. */
RATE_API int rate_parse_count(const char *text, uint64_t *out, char *err,
                              size_t errlen);

/* Parses a duration "250ms", "1s", "1m", "2hours" ("0" alone is zero) into
 * ns: a whole count, then a unit with no space between (ns us ms s m h d,
 * or nsec usec msec sec min hr day and their long forms, singular or
 * plural; docs/policy.md).  Returns: RATE_OK, the duration in *out_ns.
 * Errors: RATE_EINVAL for NULL text or out_ns, a fraction ("1.5s": the
 * message suggests '1500ms'), or anything else ("5", "1 s", ""); RATE_ERANGE
 * above 2^63-1 ns. */
RATE_API int rate_parse_duration(const char *text, uint64_t *out_ns,
                                 char *err, size_t errlen);

/* Parses a rate "COUNT/[COUNT]UNIT" ("10/s", "100/1m", "3/500ms": the
 * duration's count may be left out) into its count and period.
 * Returns: RATE_OK, *count and *period_ns.  Errors: RATE_EINVAL for NULL
 * text, count or period_ns, no '/', or a zero count or period; a bad count
 * or duration as rate_parse_count and rate_parse_duration (RATE_EINVAL or
 * RATE_ERANGE). */
RATE_API int rate_parse_rate(const char *text, uint64_t *count,
                             uint64_t *period_ns, char *err, size_t errlen);

/* Frees the policy (NULL: nothing).  Returns: nothing.  Errors: none.
 * Ownership: free a policy only when no limiter uses it any more (limiters
 * copy their default policy, but borrow what a resolver returns).
 * Thread-safe: yes, once no other call uses the policy. */
RATE_API void rate_policy_free(rate_policy_t *policy);

/* ------------------------------------------------------------ decisions */

typedef enum rate_reason {
    RATE_REASON_ALLOWED = 0,
    RATE_REASON_LIMITED = 1,     /* over the limit now; retry_after says when */
    RATE_REASON_NEVER = 2,       /* permits above capacity: retry_after RATE_NEVER */
    RATE_REASON_STORE_ERROR = 3  /* the store failed; the limiter's fail mode decided */
} rate_reason_t;

/* A plain value the limiter fills. */
typedef struct rate_decision {
    bool allowed;          /* act on the request (after delay_ns) */
    bool shadow;           /* shadow mode let through a request it would deny */
    rate_reason_t reason;  /* why; RATE_REASON_ALLOWED when really allowed */
    int component;         /* index of the limit that denied or constrains most */
    int error;             /* with RATE_REASON_STORE_ERROR: the store's code */
    uint64_t limit;        /* L of that limit (burst/capacity for the buckets);
                              RATE_NO_LIMIT for the unlimited policy */
    uint64_t remaining;    /* room left right after this decision */
    uint64_t delay_ns;     /* wait before acting (reservations only) */
    uint64_t retry_after_ns; /* on a denial; RATE_NEVER if it can never pass */
    uint64_t reset_after_ns; /* until the key is back to its cold start */
    uint64_t reserved[4]; /* room for later fields; not read */
} rate_decision_t;

/* Short text for a reason: "allowed", "limited", "never", "store-error".
 * Returns: never NULL ("unknown" for a value that is none).  Errors: none.
 * Ownership: static storage.  Thread-safe: yes. */
RATE_API const char *rate_reason_name(rate_reason_t reason);

/* --------------------------------------------------------------- stores */

/* A store keeps the state of every key.  Opaque; see ratelimit_store.h to
 * write one. */
typedef struct rate_store rate_store_t;

typedef struct rate_memory_options {
    size_t max_keys;  /* 0: unbounded.  Beyond it the least recently used
                         keys are evicted (counted; may change answers),
                         never a key with in-flight leases held: with
                         only those left a new key is RATE_EFULL. */
    unsigned shards;  /* 0: 256.  Rounded up to a power of two. */
    uint64_t reserved[6]; /* zero (= {...} or memset): room for later
                               fields; non-zero is RATE_EINVAL */
} rate_memory_options_t;

/* Makes the in-memory store: a table split in shards, each behind its own
 * spin lock held only for the step itself.  `options` may be NULL
 * (defaults); a bounded store has fewer shards, at least 64 keys each.
 * Returns: RATE_OK, the store in *out.  Errors: RATE_EINVAL for a NULL out,
 * a non-zero reserve, shards above 65536 or max_keys above 2^32-1;
 * RATE_ENOMEM.  Ownership: options are copied; the caller frees *out
 * (rate_store_free).  Thread-safe: yes. */
RATE_API int rate_store_memory_new(const rate_memory_options_t *options,
                                   rate_store_t **out);

/* Whether the store can keep every state of `policy` (the store
 * contract's check_policy; a store without one keeps any, and every store
 * keeps the unlimited policy).  Returns: RATE_OK when it can.
 * Errors: RATE_EINVAL for a NULL store or policy; RATE_EPOLICY when it
 * cannot, with `err` (if not NULL, at most errlen bytes with the NUL)
 * saying why.  Ownership: nothing is kept.  Thread-safe: yes. */
RATE_API int rate_store_check_policy(rate_store_t *store,
                                     const rate_policy_t *policy, char *err,
                                     size_t errlen);

typedef struct rate_stats {
    uint64_t keys;       /* keys held now */
    uint64_t evictions;  /* keys dropped by the max_keys bound */
    uint64_t reclaimed;  /* keys dropped after their reset (no answer changed) */
    uint64_t allowed;    /* decisions that admitted, fail-open and
                            fallback ones included (by the limiter) */
    uint64_t denied;     /* decisions that denied, shadowed ones included */
    uint64_t retries;    /* compare-and-set retries on the generic store path */
    uint64_t store_errors;
    uint64_t bytes;      /* memory the store holds, when it knows */
    uint64_t reserved[8]; /* room for later fields; not read */
} rate_stats_t;

/* Fills what the store knows (keys, evictions, reclaimed, bytes; the verdicts
 * are counted by each limiter, rate_limiter_stats).  Returns: RATE_OK, *out
 * zeroed, then filled.  Errors: RATE_EINVAL for a NULL store or out; the
 * store's own error as is (none from the memory store).  Ownership: nothing is
 * kept.  Thread-safe: yes. */
RATE_API int rate_store_stats(rate_store_t *store, rate_stats_t *out);

/* Frees the store (NULL: nothing); no limiter may use it any more (the
 * order with rate_limiter_free: rate_limiter_new, rate_limiter_check_start).
 * Returns: nothing.  Errors: none.  Ownership: the caller's store, freed.
 * Thread-safe: no (must not race with other calls on the store). */
RATE_API void rate_store_free(rate_store_t *store);

/* -------------------------------------------------------------- limiter */

typedef struct rate_limiter rate_limiter_t;

/* The clock: now_ns must be monotonic; sleep_ns sleeps at least ns. */
typedef struct rate_clock {
    uint64_t (*now_ns)(void *ud);
    void (*sleep_ns)(void *ud, uint64_t ns);
    void *ud;
} rate_clock_t;

/* Picks the policy of a key (tiers: free / pro / enterprise).  Returns a
 * borrowed policy that must outlive the limiter, or NULL for the default.
 * Called on every decision, from any thread: it must be thread-safe. */
typedef const rate_policy_t *(*rate_resolve_fn)(void *ud, const char *key,
                                                size_t key_len);

/* What a listener hears of one decision (rate_limiter_config_t.listener):
 * every decision of the limiter, the bool calls' included, once the fail
 * mode and shadow mode have had their say.  Everything is borrowed for the
 * call only. */
typedef struct rate_event {
    const char *key;              /* key[0..key_len), not NUL-terminated */
    size_t key_len;
    const rate_policy_t *policy;  /* the policy that decided (the key's) */
    const char *policy_name;      /* rate_policy_name(policy): "" unnamed */
    bool allowed;                 /* what the caller was told */
    bool shadow;                  /* a shadow limiter let a denial through */
    rate_reason_t reason;         /* as the decision's; a bool call denied
                                     in the store's acquire() (the fast
                                     path) reads RATE_REASON_LIMITED */
    int error;                    /* with RATE_REASON_STORE_ERROR: the
                                     store's code; else 0 */
    const rate_decision_t *decision; /* the full record, or NULL for a
                                        bool call's fast path */
} rate_event_t;

/* Called on the deciding thread, after the decision and before the call
 * returns it: it must be thread-safe, quick, and must not call the same
 * limiter.  Unset (NULL), the limiter does nothing for it. */
typedef void (*rate_listen_fn)(void *ud, const rate_event_t *event);

/* What a decision does when the store fails (it then has reason
 * RATE_REASON_STORE_ERROR and the store's code in `error`). */
typedef enum rate_fail_mode {
    RATE_FAIL_CLOSED = 0,  /* deny (the default) */
    RATE_FAIL_OPEN = 1,    /* allow */
    RATE_FAIL_FALLBACK = 2 /* decide on a private in-memory store with the
                              same policies (an insurance limiter): each
                              process then enforces the limits on its own */
} rate_fail_mode_t;

typedef struct rate_limiter_config {
    const rate_policy_t *policy; /* required; copied */
    rate_store_t *store;         /* NULL: a private in-memory store */
    rate_resolve_fn resolve;     /* optional per-key policy */
    void *resolve_ud;
    const rate_clock_t *clock;   /* NULL: CLOCK_MONOTONIC and nanosleep; copied */
    bool shadow;                 /* dry run: let everything through, report */
    rate_fail_mode_t on_store_error;
    unsigned max_retries;        /* generic CAS path; 0: 64 */
    /* A shadow limiter keeps its own state of each key by default (the
     * store's shadow space), so that trying a limit never charges the one
     * enforced on the same store; true: it shares the enforced state. */
    bool shadow_shares_state;
    /* Write states in the first edition's format (0.1), which a 0.1
     * binary on the same store can read: for a rolling upgrade, until
     * every process runs this version.  Meanwhile a policy change may
     * still reset a key whose state another policy wrote, as in 0.1
     * (docs/algorithms.md, "Policy changes"). */
    bool first_edition_format;
    /* Optional: hears every decision (rate_event_t), for metrics and logs.
     * One indirect call a decision when set; nothing when NULL. */
    rate_listen_fn listener;
    void *listener_ud;
    uint64_t reserved[8]; /* zero (= {...} or memset): room for later
                               fields; non-zero is RATE_EINVAL */
} rate_limiter_config_t;

/* Makes a limiter.  Limiters on one store share each key's state (a shadow
 * one keeps its own unless shadow_shares_state): whichever policy each
 * uses, a key's state carries over between them as docs/algorithms.md
 * ("Policy changes") says, also between processes and hosts on one Redis.
 * The limiter records its policy in the store now (the policy's id there,
 * see ratelimit_store.h), or at its first decision if the store does not
 * answer now; on a store that completes later (an event loop's, with an
 * asynchronous entry), always at the first decision, through the store:
 * neither this call nor rate_limiter_check_start waits for it.
 * Returns: RATE_OK, *out (NULL on an error).  Errors: RATE_EINVAL for a
 * NULL out, config or policy, a non-zero reserve, an unknown fail mode, a
 * clock without now_ns or sleep_ns; RATE_EPOLICY when the store cannot
 * keep the policy's states (rate_store_check_policy: a DynamoDB item's
 * 400 KB, a shared-memory region's state_max); RATE_ENOMEM.  Ownership:
 * config, policy and clock are copied; a store passed in is borrowed (as
 * the ud pointers): free it after the limiter (either order is safe with
 * nothing in flight; an asynchronous store with decisions in flight is
 * freed first: see rate_limiter_check_start).  Thread-safe: yes. */
RATE_API int rate_limiter_new(const rate_limiter_config_t *config,
                              rate_limiter_t **out);

/* Frees the limiter (and its private and fallback stores; NULL: nothing).
 * Returns: nothing.  Errors: none.  Ownership: a store passed in stays the
 * caller's.  Thread-safe: no (must not race with other calls on it). */
RATE_API void rate_limiter_free(rate_limiter_t *limiter);

/* The limiter's id: a number no other limiter of this process has had or
 * will have (an address can be reused after a free), for a layer that keeps
 * state per limiter.  Returns: the id (never 0); 0 for a NULL limiter.
 * Errors: none.  Ownership: nothing kept.  Thread-safe: yes. */
RATE_API uint64_t rate_limiter_id(const rate_limiter_t *limiter);

/* The limiter's clock (the config's, or the library's): for a layer that
 * must read the time the limiter reads.  Returns: a pointer valid until
 * rate_limiter_free; NULL for a NULL limiter.  Errors: none.  Ownership:
 * the limiter's.  Thread-safe: yes. */
RATE_API const rate_clock_t *rate_limiter_clock(const rate_limiter_t *limiter);

/* The limiter's store (the config's, or its private memory store): for a
 * layer that keeps state of its own beside the limiter's (the rules'
 * in-flight leases).  Returns: a pointer valid until rate_limiter_free (a
 * store the caller gave stays the caller's); NULL for a NULL limiter.
 * Errors: none.  Ownership: borrowed.  Thread-safe: yes. */
RATE_API rate_store_t *rate_limiter_store(const rate_limiter_t *limiter);

/* The seed interface: whether `permits` may be spent now on the NUL-terminated
 * key; rate_try_acquire_at: at a caller-supplied time, for servers that read
 * the clock once per request or per event-loop turn.  rate_try_acquire_len and
 * _len_at: the same two calls for the key key[0..key_len), any bytes (a NUL
 * byte too: a raw IPv6 address, a string with a length such as nginx's), of
 * 1..RATE_KEY_MAX bytes; a caller that knows the length saves measuring it,
 * and these are the fastest calls of all.  A fast call: on the memory store,
 * with no resolver and a policy of one limit other than a sliding log, a key
 * already stored is decided in place with no decision record.
 * Returns: true when allowed (and a shadow limiter's let-through), else false.
 * Errors: none reported: bad input (NULL limiter, NULL, empty, reserved or
 * over-long key -- past RATE_KEY_MAX, or past what the store keeps -- permits
 * above 2^63-1, now_ns above RATE_TIME_MAX) is false; a store failure follows
 * the fail mode.
 * Ownership: the key is only read.  Thread-safe: yes. */
RATE_API bool rate_try_acquire(rate_limiter_t *limiter, const char *key,
                               uint64_t permits);
#define rate_try_acquire1(limiter, key) rate_try_acquire((limiter), (key), 1)
RATE_API bool rate_try_acquire_at(rate_limiter_t *limiter, const char *key,
                                  uint64_t permits, uint64_t now_ns);
RATE_API bool rate_try_acquire_len(rate_limiter_t *limiter, const char *key,
                                   size_t key_len, uint64_t permits);
RATE_API bool rate_try_acquire_len_at(rate_limiter_t *limiter,
                                      const char *key, size_t key_len,
                                      uint64_t permits, uint64_t now_ns);

/* The full call: one decision for key[0..key_len) with max_wait_ns of
 * reservation (buckets only; see docs/algorithms.md), at the limiter's clock;
 * rate_limiter_check_at: at a caller-supplied time now_ns (a time before the
 * key's last admitted request counts as that time).
 * Returns: RATE_OK with *out filled (allowed or not); a store failure too (a
 * resolver's policy the store cannot keep included), with reason
 * RATE_REASON_STORE_ERROR, its code in `error` and the fail mode's verdict.
 * Errors (*out zeroed): RATE_EINVAL for a NULL limiter or out; RATE_EKEY for a
 * NULL, empty or reserved (RATE_KEY_RESERVED) key, or one longer than
 * RATE_KEY_MAX or than the store keeps (a shared-memory region's key_max;
 * never under the fail mode); RATE_ERANGE
 * for permits, max_wait_ns or now_ns above 2^63-1.  Ownership: the key is only
 * read (stores copy it).  Thread-safe: yes. */
RATE_API int rate_limiter_check(rate_limiter_t *limiter, const char *key,
                                size_t key_len, uint64_t permits,
                                uint64_t max_wait_ns, rate_decision_t *out);
RATE_API int rate_limiter_check_at(rate_limiter_t *limiter, const char *key,
                                   size_t key_len, uint64_t permits,
                                   uint64_t max_wait_ns, uint64_t now_ns,
                                   rate_decision_t *out);

/* Called once when an asynchronous decision is made: rc is RATE_OK and
 * decision the full call's record (store failures are decisions, under the
 * fail mode, as for rate_limiter_check); or rc is RATE_EKEY, decision
 * zeroed and nothing counted, when a store with an asynchronous entry
 * refused the key as too long for it (a store that answers at once makes
 * that the call's own RATE_EKEY instead).  decision is valid during the
 * call only. */
typedef void (*rate_check_fn)(void *ud, int rc,
                              const rate_decision_t *decision);

/* Returned by rate_limiter_check_start when the decision is under way:
 * not an error (positive); the callback will run. */
#define RATE_PENDING 1

/* The asynchronous full call for event loops, which answers at once when it
 * can (docs/async.md).  rate_limiter_check_start_at: the same at a
 * caller-supplied time now_ns, as rate_limiter_check_at, for a loop that reads
 * its clock once per turn (the store's script then goes by now_ns, not Redis's
 * TIME).  Returns:
 *   RATE_OK       the decision is made: *out is filled, exactly as
 *     rate_limiter_check would fill it (store failures are decisions under the
 *     fail mode), and cb is NOT called.  The memory and shared-memory stores,
 *     any store without an asynchronous entry, an unlimited policy, and a
 *     store that refuses at once (an asynchronous Redis store whose breaker is
 *     open or whose reconnect backs off) answer so: no allocation survives the
 *     call.
 *   RATE_PENDING  the store took the decision: cb(ud, RATE_OK, decision) runs
 *     exactly once, later, never before this returns, on the thread that
 *     drives the store (an event loop's store: inside the loop's callbacks, on
 *     the loop's thread); *out is zeroed and not written again (rate_check_fn:
 *     a key the store then refuses as too long comes as RATE_EKEY).
 * Errors (no decision, no callback, *out zeroed): RATE_EINVAL for a NULL
 * limiter, out or cb; RATE_EKEY, RATE_ERANGE as rate_limiter_check (and
 * rate_limiter_check_at); RATE_ENOMEM.
 * Ownership: the key is copied; ud is the caller's and is only passed back;
 * the decision handed to cb is valid during the call only.  Until cb has run,
 * the limiter and the store must stay alive; freeing the store first runs
 * each pending cb with error RATE_ECANCELED under the fail mode, and a
 * limiter with decisions in flight must not be freed, nor the store from
 * inside one of its own callbacks (docs/async.md, "Freeing").  A callback may start new decisions; the listener hears a
 * pending decision just before cb.
 * Thread-safe: as the store's entries (an event loop's store is driven by one
 * thread: start its decisions on that thread). */
RATE_API int rate_limiter_check_start(rate_limiter_t *limiter,
                                      const char *key, size_t key_len,
                                      uint64_t permits, uint64_t max_wait_ns,
                                      rate_decision_t *out, rate_check_fn cb,
                                      void *ud);
RATE_API int rate_limiter_check_start_at(rate_limiter_t *limiter,
                                         const char *key, size_t key_len,
                                         uint64_t permits,
                                         uint64_t max_wait_ns, uint64_t now_ns,
                                         rate_decision_t *out,
                                         rate_check_fn cb, void *ud);

/* Blocking acquire: waits (with the clock's sleep) until the permits are
 * granted or the timeout would pass.  It never sleeps past now + timeout_ns
 * (at most RATE_TIME_MAX) and returns at once when the wait alone would
 * pass it.  Returns: RATE_OK with out->allowed true once granted (delay
 * already slept), RATE_OK with out->allowed false when the deadline does
 * not allow it (or never will, or the store failed under a denying fail
 * mode).  Errors: as rate_limiter_check.  Ownership: the key is only read.
 * Thread-safe: yes. */
RATE_API int rate_limiter_acquire(rate_limiter_t *limiter, const char *key,
                                  size_t key_len, uint64_t permits,
                                  uint64_t timeout_ns, rate_decision_t *out);

/* A decision for key[0..key_len) under `policy` instead of the key's own
 * (the limiter's default, or what its resolver returns): how a layer above
 * the limiter applies a policy it chose itself (the rules file of
 * ratelimit_http.h applies each policy a request's rules pick).  Otherwise
 * exactly rate_limiter_check (at the limiter's clock) and
 * rate_limiter_check_at (at now_ns).  Returns, Errors: as those, and
 * RATE_EINVAL (*out zeroed) for a NULL policy.  Ownership: `policy` is
 * borrowed for the call; the state it writes carries over as every
 * policy's does (docs/algorithms.md).  Thread-safe: yes. */
RATE_API int rate_limiter_check_policy(rate_limiter_t *limiter,
                                       const rate_policy_t *policy,
                                       const char *key, size_t key_len,
                                       uint64_t permits, uint64_t max_wait_ns,
                                       rate_decision_t *out);
RATE_API int rate_limiter_check_policy_at(rate_limiter_t *limiter,
                                          const rate_policy_t *policy,
                                          const char *key, size_t key_len,
                                          uint64_t permits,
                                          uint64_t max_wait_ns,
                                          uint64_t now_ns,
                                          rate_decision_t *out);

/* Opens a deadline scope on the calling thread: until the matching
 * rate_deadline_end, every store request of every limiter call on this
 * thread counts its timeout (command_timeout_ns, request_timeout_ns) from
 * the scope's start, so that the calls made for one request (decisions
 * under several policies, the synced mode's borrows) share one deadline.
 * Each decision, refund and penalty is a scope of its own.  The start is
 * the scope's first store request's, or rate_deadline_start's; an inner
 * scope keeps the outer one's.
 * Close every scope: one left open makes every later store request on
 * the thread count from its stale start, and so time out.
 * Returns: a token for rate_deadline_end.  Errors: none.
 * Ownership: nothing is allocated.  Thread-safe: yes (the scope is the
 * calling thread's); a scope is closed on the thread that opened it. */
RATE_API uint64_t rate_deadline_begin(void);
/* Closes the scope rate_deadline_begin returned `token` for.
 * Returns: nothing.  Errors: none.  Ownership: none.
 * Thread-safe: as rate_deadline_begin. */
RATE_API void rate_deadline_end(uint64_t token);
/* Starts the open scope's deadline now, if no store request has yet (a
 * caller about to wait counts the wait in; nothing outside a scope).
 * Returns: nothing.  Errors: none.  Ownership: none.
 * Thread-safe: as rate_deadline_begin. */
RATE_API void rate_deadline_start(void);

/* ------------------------------------------ changes outside admissions */

/* These change a key's state outside an admission (docs/algorithms.md, "Bounds
 * and policy changes"), under the key's policy, at the limiter's clock (the
 * *_at forms: at now_ns, which counts as a request's time: the state is read
 * at max(now_ns, t_last) and written with that t_last).  A shadow limiter
 * changes its own state (unless it shares the enforced one).  A change goes
 * through the store as a decision does (its decide() when the store makes
 * changes itself, as Redis's scripts mostly do: docs/redis.md, "Refunds and
 * penalties"), else over load and compare-and-set.  For each of them:
 * Returns: RATE_OK (an unlimited key's: nothing to change).  Errors:
 * RATE_EINVAL (NULL limiter), RATE_EKEY (as rate_limiter_check), RATE_ERANGE
 * (permits or time above RATE_TIME_MAX), RATE_EPOLICY (a resolver's policy the
 * store cannot keep), or the store's error as is (RATE_ECONFLICT when the key
 * kept changing under the step max_retries times): the fail mode decides
 * admissions only.  Ownership: the key is only read.  Thread-safe: yes. */

/* Forgets the key: its next request is a new key's.  (With
 * RATE_FAIL_FALLBACK the insurance store forgets it too.)  Takes no time
 * and no permits: never RATE_ERANGE.  A key longer than the store keeps
 * (a shared-memory region's key_max) was never held: RATE_OK, nothing to
 * forget; RATE_EKEY is for a NULL, empty or reserved key, or one past
 * RATE_KEY_MAX. */
RATE_API int rate_limiter_reset(rate_limiter_t *limiter, const char *key,
                                size_t key_len);

/* Gives `permits` back: a token bucket gets its tokens back (up to its burst),
 * a leaky bucket drains them, a window uncounts them from the current window
 * (then a sliding counter from the previous one; nothing once the window they
 * were counted in has rolled), a sliding log drops them from its newest
 * entries.  How a server returns a permit that a later check denied (a
 * per-route limit admitted, the user's limit then denied), or cancels a
 * reservation: a reservation is identified by its key and permits, and
 * cancelling it is refunding them (the debt it left is paid back; any delay
 * already waited is not).  A key with no state has nothing to give back:
 * nothing is written.  rate_limiter_refund_policy and _policy_at: a refund
 * under `policy` instead of the key's own, as rate_limiter_check_policy is a
 * decision under it: gives back what a decision under that policy admitted
 * (RATE_EINVAL also for a NULL policy; `policy` is borrowed for the call). */
RATE_API int rate_limiter_refund(rate_limiter_t *limiter, const char *key,
                                 size_t key_len, uint64_t permits);
RATE_API int rate_limiter_refund_at(rate_limiter_t *limiter, const char *key,
                                    size_t key_len, uint64_t permits,
                                    uint64_t now_ns);
RATE_API int rate_limiter_refund_policy(rate_limiter_t *limiter,
                                        const rate_policy_t *policy,
                                        const char *key, size_t key_len,
                                        uint64_t permits);
RATE_API int rate_limiter_refund_policy_at(rate_limiter_t *limiter,
                                           const rate_policy_t *policy,
                                           const char *key, size_t key_len,
                                           uint64_t permits, uint64_t now_ns);

/* Charges `permits` whatever remains: a token bucket goes into debt (as
 * far as a reservation may, 2^62 scaled tokens), a leaky bucket fills up
 * to its capacity, a window counts up to its limit, a sliding log logs as
 * many as its limit still holds.  Later requests are denied until the
 * charge has drained, refilled or left the window. */
RATE_API int rate_limiter_penalize(rate_limiter_t *limiter, const char *key,
                                   size_t key_len, uint64_t permits);
RATE_API int rate_limiter_penalize_at(rate_limiter_t *limiter,
                                      const char *key, size_t key_len,
                                      uint64_t permits, uint64_t now_ns);

/* A refund or a penalty that does not wait, for event loops: as
 * rate_limiter_refund / rate_limiter_penalize at the limiter's clock, on a
 * store with an asynchronous entry (rate_store_redis_async_new) through that
 * entry (on Redis, which clock a change goes by: docs/async.md).
 * Returns: RATE_PENDING when the store took it: done(ud, rc) then runs exactly
 * once, later, on the thread that drives the store (an event loop's: the
 * loop's), with what the synchronous call would have returned (RATE_OK, or the
 * store's error as is: no fail mode; RATE_ECANCELED when the store is freed
 * first, which runs every pending done before rate_store_free returns).  Else
 * the result at once, and no callback: RATE_OK (done now: a store without an
 * asynchronous entry, or an unlimited key).  Errors (at once, no callback): as
 * the synchronous call's; RATE_EINVAL also for a NULL done; RATE_ENOMEM.
 * Ownership: the key is copied; ud is the caller's.  Thread-safe: as
 * rate_limiter_check_start. */
typedef void (*rate_done_fn)(void *ud, int rc);
RATE_API int rate_limiter_refund_start(rate_limiter_t *limiter,
                                       const char *key, size_t key_len,
                                       uint64_t permits, rate_done_fn done,
                                       void *ud);
RATE_API int rate_limiter_penalize_start(rate_limiter_t *limiter,
                                         const char *key, size_t key_len,
                                         uint64_t permits, rate_done_fn done,
                                         void *ud);

/* Statistics: the store's figures (rate_store_stats) plus the limiter's
 * own (verdicts, retries, store errors).  Returns: RATE_OK, *out filled.
 * Errors: RATE_EINVAL for a NULL limiter or out; the store's stats error.
 * Ownership: nothing is kept.  Thread-safe: yes. */
RATE_API int rate_limiter_stats(rate_limiter_t *limiter, rate_stats_t *out);

/* rate_limiter_policy: the limiter's default policy; rate_limiter_set_policy
 * replaces it for every later decision, decisions already running finishing
 * under the old one.  Each key's state carries over (docs/algorithms.md,
 * "Policy changes").  Returns: the policy (NULL for a NULL limiter); RATE_OK.
 * Errors: reading: none; setting: RATE_EINVAL for a NULL limiter or policy,
 * RATE_EPOLICY when the store cannot keep the policy's states
 * (rate_store_check_policy), the old policy then staying, RATE_ENOMEM.
 * Ownership: the policy read is borrowed and the one set is copied: after
 * rate_limiter_set_policy the pointer returned before still points at the
 * old policy, whose copy is kept until the limiter is freed.
 * Thread-safe: yes. */
RATE_API const rate_policy_t *rate_limiter_policy(const rate_limiter_t *limiter);
RATE_API int rate_limiter_set_policy(rate_limiter_t *limiter,
                                     const rate_policy_t *policy);

/* For callers who pass their own times (the *_at calls): a promise that no
 * later call on this limiter, from any thread, carries a time below t_ns
 * (an event loop calls it once per turn with the oldest time any of its
 * threads may still pass).  Keys written under the promise whose state is
 * back at its cold start by the mark may then be dropped by the store, as
 * keys are on the library's clock: no answer changes.  Limiters sharing a
 * store should then read one clock (CLOCK_MONOTONIC, as the library does).
 * Returns: RATE_OK (the mark only rises: a lower one is ignored).
 * Errors: RATE_EINVAL for a NULL limiter, RATE_ERANGE for t_ns above
 * RATE_TIME_MAX.  Ownership: nothing is kept.  Thread-safe: yes. */
RATE_API int rate_limiter_set_low_water(rate_limiter_t *limiter,
                                        uint64_t t_ns);

/* Read CLOCK_MONOTONIC, and CLOCK_MONOTONIC_COARSE: the same origin, updated
 * once per kernel tick (a few ms), several times cheaper to read.  Returns:
 * the time in ns.  Errors: none.  Ownership: nothing.  Thread-safe: yes. */
RATE_API uint64_t rate_clock_monotonic_ns(void);
RATE_API uint64_t rate_clock_coarse_ns(void);

/* The coarse clock as a limiter's clock (rate_limiter_config_t.clock):
 * servers that accept a time a tick old save most of the clock read.
 * retry_after then holds by that clock: a retry exactly then may still be
 * up to one tick early by the exact one.  Returns: the clock, never NULL.
 * Errors: none.  Ownership: static: never freed.  Thread-safe: yes. */
RATE_API const rate_clock_t *rate_clock_coarse(void);

/* The library's own clock, the default of a limiter
 * (rate_limiter_config_t.clock NULL): CLOCK_MONOTONIC, and a sleep of
 * clock_nanosleep on it.  A layer can tell it from a caller's clock by its
 * now_ns.  Returns: the clock, never NULL.  Errors: none.
 * Ownership: static: never freed.  Thread-safe: yes. */
RATE_API const rate_clock_t *rate_clock_exact(void);

/* The wall clock, CLOCK_REALTIME (ns since the Unix epoch), and the
 * library's sleep: the one clock hosts that share a store have in common,
 * for what more than one host times (leases on Redis or DynamoDB, a
 * decision the Redis scripts decline, which they would take at Redis's
 * TIME).  NTP's steps move it, and NTP's skew between hosts lengthens or
 * shortens what it times by as much.  Returns: the clock, never NULL.
 * Errors: none.  Ownership: static: never freed.  Thread-safe: yes. */
RATE_API const rate_clock_t *rate_clock_wall(void);

#ifdef __cplusplus
}
#endif
#endif /* RATELIMIT_H */
