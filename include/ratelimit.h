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
 * Threads.  Policies are immutable once made and may be read from any thread.
 * A limiter and its store may be called from any number of threads at once;
 * rate_limiter_free() and rate_store_free() must not race with other calls on
 * the same object.  Each function below ends with its thread-safety.
 *
 * Errors.  Functions that can fail return an int: RATE_OK (0) or a negative
 * RATE_E* code; rate_strerror() names it.  A denial is not an error: it is
 * RATE_OK with a filled rate_decision_t whose `allowed` is false.
 *
 * Time.  Every time is an unsigned count of nanoseconds, at most
 * RATE_TIME_MAX.  By default the limiter reads CLOCK_MONOTONIC; the *_at calls
 * take the time from the caller (replays, tests, event loops that read the
 * clock once per turn).
 *
 * Ownership.  Whoever calls a *_new function calls the matching *_free, and
 * *_free(NULL) does nothing.  Keys are only read during a call, never kept by
 * reference (stores copy them).
 *
 * Versions.  Before 1.0 each minor version is a soname of its own
 * (libratelimit.so.0.MINOR): the structs a caller fills in (configs,
 * options, decisions, outcomes) may grow between minor versions, so a
 * program is built against the header of the library it runs with.
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
#define RATE_VERSION_MINOR 3
#define RATE_VERSION_PATCH 0

/* ---------------------------------------------------------------- errors */

#define RATE_ERRNO_MAP(X)                                                   \
    X(EINVAL, -1, "invalid argument")                                       \
    X(ENOMEM, -2, "out of memory")                                          \
    X(EKEY, -3,                                                             \
      "key is NULL, empty, or longer than RATE_KEY_MAX bytes or than the "  \
      "store keeps")                                                        \
    X(EPOLICY, -4, "invalid policy")                                        \
    X(ERANGE, -5, "time or permits out of range")                           \
    X(ESTORE, -6, "store unavailable")                                      \
    X(ETIMEDOUT, -7, "store did not answer in time")                        \
    X(EFULL, -8, "store has no room for a new key")                         \
    X(ECONFLICT, -9, "too many concurrent updates of one key (CAS retries)") \
    X(ECORRUPT, -10, "stored state is not valid for this library")          \
    X(ENOTSUP, -11, "the store cannot make this decision itself")          \
    X(ECANCELED, -12, "the store was freed with the decision in flight")

typedef enum rate_status {
    RATE_OK = 0,
#define RATE_X_(name, code, text) RATE_##name = code,
    RATE_ERRNO_MAP(RATE_X_)
#undef RATE_X_
} rate_status_t;

/* Text for an error code ("unknown error" for codes not in the list; also
 * RATE_PENDING's, which is no error).
 * Static storage; never NULL.  Thread-safe: yes. */
RATE_API const char *rate_strerror(int err);
/* The code's name, e.g. "RATE_EKEY".  Thread-safe: yes. */
RATE_API const char *rate_err_name(int err);

/* ----------------------------------------------------------- constants */

#define RATE_NEVER UINT64_MAX          /* retry_after of a request that can never succeed */
#define RATE_TIME_MAX ((uint64_t)INT64_MAX) /* largest time or duration, ns */
#define RATE_KEY_MAX 512               /* longest key, bytes */
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

/* The algorithm's canonical name ("token-bucket"), NULL for a value that
 * is none.  Static storage.  Thread-safe: yes. */
RATE_API const char *rate_algorithm_name(rate_algorithm_t algorithm);

/* The algorithm a name or alias names ("gcra", "sliding-window-log",
 * "sliding-window-counter" too), exactly as the text form spells it:
 * RATE_OK, or RATE_EINVAL for NULL or a name that is none.
 * Thread-safe: yes. */
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
} rate_limit_t;

/* An immutable set of 1..RATE_MAX_LIMITS limits, all applied to one key. */
typedef struct rate_policy rate_policy_t;

/* Makes a policy from `count` limits (copied).  On RATE_EPOLICY, if `err` is
 * not NULL, writes a one-line reason naming the bad part (at most errlen bytes
 * with the NUL).  Bounds, within which every decision is exact (64/128-bit
 * integers, docs/algorithms.md): limit, period and burst (capacity) from 1
 * to 2^63-1 (every count up to 2^53 and beyond); a window, and a bucket's
 * period, up to 2^61 ns (73 years) -- a bucket's period may be longer when
 * burst * period <= 2^62; a window takes no burst (0); a sliding log's
 * limit <= RATE_SLIDING_LOG_MAX.  Durations a decision reports past 2^63-1
 * ns (a huge bucket refilling at 1 per 2^61 ns) read RATE_TIME_MAX.
 * Thread-safe: yes. */
RATE_API int rate_policy_new(const rate_limit_t *limits, size_t count,
                             rate_policy_t **out, char *err, size_t errlen);

/* Parses the policy text form (docs/policy.md), for example
 *   "token-bucket 10/s burst=20"
 *   "name=free token-bucket 10/s burst=20"   (a named policy)
 *   "leaky-bucket 5/s capacity=10"
 *   "sliding-window 100/1m"
 *   "token-bucket 10/s burst=10; sliding-log 1000/1h"
 *   "unlimited"
 * Errors as for rate_policy_new().  Thread-safe: yes. */
RATE_API int rate_policy_parse(const char *text, rate_policy_t **out,
                               char *err, size_t errlen);

/* Writes the policy's canonical text (parsable again) into buf, truncating
 * to len bytes with the NUL; returns the length it needed.  A named
 * policy's text starts with "name=NAME ".  Thread-safe: yes. */
RATE_API size_t rate_policy_format(const rate_policy_t *policy, char *buf,
                                   size_t len);

/* The largest stored state of a key under the policy, in bytes
 * (docs/algorithms.md, "Stored state"): a sliding log's full log
 * included.  0 for the unlimited policy and NULL.  Thread-safe: yes. */
RATE_API size_t rate_policy_state_max(const rate_policy_t *policy);

/* The policy's 32-bit fingerprint: a hash of its limits, which tagged the
 * states of the first edition's format; a store's records start a
 * policy's id from it (docs/algorithms.md, "Stored state").
 * Thread-safe: yes. */
RATE_API uint32_t rate_policy_fingerprint(const rate_policy_t *policy);

/* Longest policy name, bytes. */
#define RATE_POLICY_NAME_MAX 64

/* Names the policy: 1..RATE_POLICY_NAME_MAX bytes of letters, digits, '.',
 * '_' and '-' (so that it is an HTTP structured-field string and a
 * Prometheus label value as it is), or NULL or "" for no name.  The name
 * is what the RateLimit-Policy field (rate_headers_format) and a
 * listener (rate_event_t) call the policy; it is no part of its
 * identity: two policies with the same limits and other names share each
 * key's state, and renaming a policy resets no key.  Copied.  Returns
 * RATE_OK, or RATE_EINVAL for a NULL policy or a bad name, with, if `err`
 * is not NULL, a one-line reason (at most errlen bytes with the NUL).
 * Name a policy before any limiter or other thread uses it (it is then
 * immutable); limiters copy the name with the policy.
 * Thread-safe: no (on the same policy). */
RATE_API int rate_policy_set_name(rate_policy_t *policy, const char *name,
                                  char *err, size_t errlen);

/* The policy's name, "" when it has none (and for NULL).  Borrowed: lives
 * as long as the policy.  Thread-safe: yes. */
RATE_API const char *rate_policy_name(const rate_policy_t *policy);

/* The `unlimited` policy (the text "unlimited"; an enterprise tier): every
 * request is allowed, nothing is written to any store (not even the
 * policy's record), no key is ever charged.  It has no limits
 * (rate_policy_count 0, rate_policy_limit NULL) and stands alone: a
 * composite with it is an error.  Its decisions: allowed, reason
 * RATE_REASON_ALLOWED, component -1, limit and remaining RATE_NO_LIMIT,
 * delay, retry_after and reset_after 0.  An HTTP server should send no
 * RateLimit or X-RateLimit headers for it (test rate_policy_is_unlimited,
 * or limit == RATE_NO_LIMIT).  RATE_EINVAL for NULL, RATE_ENOMEM.
 * Free with rate_policy_free.  Thread-safe: yes. */
RATE_API int rate_policy_unlimited(rate_policy_t **out);

/* Whether the policy is the unlimited one (false for NULL).
 * Thread-safe: yes. */
RATE_API bool rate_policy_is_unlimited(const rate_policy_t *policy);

/* Number of limits, and the i-th (borrowed, lives as long as the policy);
 * 0 and NULL for the unlimited policy. */
RATE_API size_t rate_policy_count(const rate_policy_t *policy);
RATE_API const rate_limit_t *rate_policy_limit(const rate_policy_t *policy,
                                               size_t i);

/* The text parsers of the policy text form, each the one that
 * rate_policy_parse uses, for programs that read a count, a duration or a
 * rate on their own (a command's options).  Each returns RATE_OK, or an
 * error code with, if `err` is not NULL, a one-line message (at most
 * errlen bytes with the NUL) whose subject is the quoted text, so that it
 * reads after an option's name: "--window '1.5s' is not a duration: ...".
 * Nothing is written to the outputs on an error.  Thread-safe: yes. */

/* Parses a count: a whole number from 0 to 2^63-1, digits only.
 *   RATE_EINVAL  NULL text or out: "no count (NULL)"
 *   RATE_EINVAL  anything but digits ("", "x", "-1", "1.5", " 1"):
 *                "'x' is not a whole number up to 2^63-1"
 *   RATE_ERANGE  digits above 2^63-1: the same message */
RATE_API int rate_parse_count(const char *text, uint64_t *out, char *err,
                              size_t errlen);

/* Parses a duration "250ms", "1s", "1m", "2hours" ("0" alone is zero) into
 * ns: a whole count, then a unit with no space between:
 *   ns  nsec nsecs nanosecond nanoseconds
 *   us  usec usecs microsecond microseconds
 *   ms  msec msecs millisecond milliseconds
 *   s   sec secs second seconds
 *   m   min mins minute minutes
 *   h   hr hrs hour hours
 *   d   day days
 * Errors:
 *   RATE_EINVAL  NULL text or out_ns: "no duration (NULL)"
 *   RATE_EINVAL  a fraction of a whole number of ns ("1.5s", "0.25h"):
 *                "'1.5s' is not a duration: durations are whole numbers
 *                of a unit; write '1500ms'" (the same time, whole, in the
 *                largest unit that writes it so)
 *   RATE_EINVAL  a fraction of no whole ns ("0.5ns"): "'0.5ns' is not a
 *                duration: durations are whole numbers of a unit (the
 *                smallest is 1ns)"
 *   RATE_EINVAL  anything else ("5", "s", "2fortnights", "1 s", ""):
 *                "'5' is not a duration: COUNTUNIT, units ns us ms s m h d
 *                (or nsec usec msec sec min hr day, singular or plural),
 *                or 0"
 *   RATE_ERANGE  above 2^63-1 ns (a fraction too): "'107000d' is a
 *                duration above 2^63-1 ns" */
RATE_API int rate_parse_duration(const char *text, uint64_t *out_ns,
                                 char *err, size_t errlen);

/* Parses a rate "COUNT/[COUNT]UNIT" ("10/s", "100/1m", "1/day", "10/sec",
 * "3/500ms": the duration's count may be left out) into its count and
 * period, the units as above.  Errors:
 *   RATE_EINVAL  NULL text, count or period_ns: "no rate (NULL)"
 *   RATE_EINVAL  no '/': "'10' is not COUNT/DURATION (e.g. 10/s, 100/1m)"
 *   RATE_EINVAL, RATE_ERANGE  a bad count (as rate_parse_count): "'x/s':
 *                count 'x' is not a whole number up to 2^63-1"
 *   RATE_EINVAL, RATE_ERANGE  a bad duration (as rate_parse_duration, but
 *                with "[COUNT]UNIT" and no "or 0"): "'1/1.5s': '1.5s' is
 *                not a duration: durations are whole numbers of a unit;
 *                write '1500ms'"
 *   RATE_EINVAL  a zero count or period ("0/s", "5/0ms"): "'0/s' is zero:
 *                its count is 0", "'5/0ms' is zero: its period is 0" */
RATE_API int rate_parse_rate(const char *text, uint64_t *count,
                             uint64_t *period_ns, char *err, size_t errlen);

/* A policy may be freed only when no limiter uses it any more (limiters copy
 * their default policy, but borrow what a resolver returns).  NULL: nothing. */
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
} rate_decision_t;

/* Short text for a reason: "allowed", "limited", "never", "store-error". */
RATE_API const char *rate_reason_name(rate_reason_t reason);

/* ----------------------------------------------------- HTTP header fields */

/* The fields an HTTP server sends for one decision (or one request under
 * the rules, rate_outcome_headers): the RateLimit-Policy and RateLimit
 * fields of draft-ietf-httpapi-ratelimit-headers (structured-field lists,
 * RFC 9651; whole seconds) and Retry-After (delay-seconds, RFC 9110).
 * An empty string: send no such field.  See docs/api-server.md for the
 * mapping, case by case. */
#define RATE_HEADER_LEN 1024
typedef struct rate_headers {
    int status;  /* 0: serve the request (after the decision's delay_ns);
                    429: denied by a limit; 503: the store failed and the
                    limiter denied (fail-closed) */
    char policy[RATE_HEADER_LEN];    /* RateLimit-Policy:
                                        "NAME";q=QUOTA;w=WINDOW */
    char ratelimit[RATE_HEADER_LEN]; /* RateLimit: "NAME";r=REMAINING;t=RESET */
    char retry_after[24];            /* Retry-After: seconds, rounded up,
                                        at least 1 */
} rate_headers_t;

/* Formats the fields for decision `d`, made under `policy` (the key's:
 * the limiter's default, or what its resolver returned).  The item's name
 * is the policy's name ("default" when it has none); the limit described
 * is the one the decision names (d->component: the one that denied or
 * constrains most, for a composite):
 *   token bucket  q = burst B, w = B*P/L rounded up (the time to refill
 *                 it from empty); leaky bucket q = capacity C,
 *                 w = C*P/L rounded up; windows q = L, w = W rounded up;
 *   r = d->remaining (at most q), t = d->reset_after_ns rounded up (until
 *   the key is back to a full quota).
 * Cases: allowed (a reservation too): status 0 and both fields; limited:
 * 429, both fields, Retry-After = retry_after_ns rounded up to whole
 * seconds, at least 1, so never earlier than a retry can pass; a request
 * that can never pass (RATE_REASON_NEVER): 429 and both fields, no
 * Retry-After (no wait helps; a server whose permits measure a request's
 * size may answer 413 instead); the unlimited policy: status 0, no field;
 * shadow mode (d->shadow): status 0, no field (the limit is not enforced:
 * r=0 would be false); a store error under fail-open: status 0, no field;
 * under fail-closed: 503, no field (no Retry-After: 0, which would send
 * every client straight back); under the fallback: the fallback's
 * decision, as above.  Returns RATE_OK, or RATE_EINVAL for a NULL policy,
 * decision or out; RATE_ERANGE, *out zeroed, for a field that would pass
 * RATE_HEADER_LEN (no item the library's bounds allow comes near: a
 * guard).  Thread-safe: yes. */
RATE_API int rate_headers_format(const rate_policy_t *policy,
                                 const rate_decision_t *d,
                                 rate_headers_t *out);

/* --------------------------------------------------------------- stores */

/* A store keeps the state of every key.  Opaque; see ratelimit_store.h to
 * write one. */
typedef struct rate_store rate_store_t;

typedef struct rate_memory_options {
    size_t max_keys;  /* 0: unbounded.  Beyond it the least recently used
                         keys are evicted (counted; may change answers). */
    unsigned shards;  /* 0: 256.  Rounded up to a power of two. */
} rate_memory_options_t;

/* The in-memory store: a table split in shards, each behind its own spin
 * lock held only for the step itself.  `options` may be NULL (defaults).
 * Thread-safe: yes. */
RATE_API int rate_store_memory_new(const rate_memory_options_t *options,
                                   rate_store_t **out);

/* How the Redis store uses ratelimit.so, the Redis module whose
 * RATELIMIT.STEP runs the library's own step inside Redis over the same
 * keys as the scripts (docs/redis-module.md).  The decisions are the same
 * either way; only their speed and range differ (the module decides in
 * one round trip what the scripts hand back to compare-and-set). */
typedef enum rate_redis_module {
    RATE_REDIS_MODULE_AUTO = 0, /* use it when the server has it: asked at
                                   the first decision (COMMAND INFO); a
                                   decision answered with an error
                                   ("unknown command": the module
                                   unloaded, a failover to a server
                                   without it; an ACL's NOPERM) is made
                                   by the scripts at once, and the
                                   module is tried again no sooner than
                                   5 s later */
    RATE_REDIS_MODULE_ON = 1,   /* use it: creation fails (RATE_ESTORE)
                                   when the server has no RATELIMIT.STEP;
                                   a later "unknown command" falls back
                                   as with AUTO */
    RATE_REDIS_MODULE_OFF = 2   /* never: the scripts only */
} rate_redis_module_t;

typedef struct rate_redis_options {
    /* connect_timeout_ns, command_timeout_ns and breaker_cooldown_ns are
     * at most RATE_TIME_MAX (RATE_EINVAL above, naming the option). */
    uint64_t connect_timeout_ns; /* 0: 1 s.  The TCP connect's bound;
                                    at creation (and a lazy store's
                                    creation try), each seed tried has
                                    connect + command timeout for its
                                    whole connection, the TCP connect and
                                    the handshake together (AUTH, CLUSTER
                                    SLOTS, SELECT, SCRIPT LOAD, the ACL
                                    check), however soon TCP connects:
                                    2 s with the defaults against a server
                                    that accepts and never answers, times
                                    the seeds tried */
    uint64_t command_timeout_ns; /* 0: 1 s.  Every call returns within
                                    this of its start (plus the scheduling
                                    of threads, a few ms): a command not
                                    answered by then fails with every
                                    command in flight on its connection
                                    (RATE_ETIMEDOUT), and a connection
                                    made on a call's behalf (the connect
                                    timeout included) is made within it */
    const char *prefix;          /* key namespace, copied; NULL: "ratelimit:";
                                    at most 256 bytes, no '{' or '}'
                                    (RATE_EINVAL); end it with a separator
                                    (docs/redis.md, "Key names") */
    unsigned pool_size;          /* connections per server (per master in
                                    a cluster), each shared by all callers
                                    (pipelined); 0: 2 */
    bool no_ttl;                 /* keep keys without expiry (replays on a
                                    virtual clock); default: expire each key
                                    after its reset_after by Redis's own
                                    clock (rounded up to ms, plus 1 ms) */
    bool client_time;            /* decide on the limiter's clock; default:
                                    on Redis's TIME, one clock for every
                                    client (times given to the *_at calls
                                    are always used as given) */
    uint64_t safety_ttl_ns;      /* with no_ttl: 0 (default) keeps the keys
                                    written without expiry (PERSIST); else
                                    every state and shadow state written
                                    gets this expiry instead, rounded up to
                                    ms, whatever its reset_after, so that
                                    keys left behind by a process that died
                                    go away (refresh them all with
                                    rate_store_redis_touch while they are
                                    in use).  Policy records are always
                                    kept without expiry when written.
                                    Ignored without no_ttl */
    bool lazy_connect;           /* creation succeeds even when no server
                                    answers (a malformed URL or option is
                                    still RATE_EINVAL): until one does,
                                    every call fails at once (RATE_ESTORE,
                                    so decisions follow the fail mode),
                                    and calls try again, one at a time,
                                    no more often than a backoff from
                                    10 ms doubling to 1 s;
                                    rate_store_redis_last_error says why.
                                    Default: connect at creation */
    unsigned breaker_failures;   /* the circuit breaker of each server: 0:
                                    5 calls in a row on that server that
                                    got no reply (a failed or timed-out
                                    connection; error replies do not
                                    count) open it.  Only the server's own
                                    calls count: not a cluster's slot-map
                                    refreshes, nor a call whose time was
                                    up before it reached the server */
    uint64_t breaker_cooldown_ns;/* 0: 1 s.  While open, every call on
                                    that server fails at once
                                    (RATE_ESTORE); after it, one call goes
                                    through as a probe: answered, the
                                    breaker closes; not, it opens again */
    bool no_breaker;             /* no circuit breaker */
    rate_redis_module_t module;  /* whether decisions go through
                                    ratelimit.so, the Redis module
                                    (docs/redis-module.md), when loaded;
                                    default AUTO */
    bool general_script;         /* decide every policy with the general
                                    script (redis_step.lua), never a lean
                                    one: the same decisions, slower; for
                                    comparison (docs/redis.md) */
} rate_redis_options_t;

/* The Redis store: url is redis://[[user]:password@]host[:port][/db],
 * redis://[[user]:password@]host[:port],host[:port]... (seeds: tried in
 * order until one answers) or unix:///path.  A server that is a Redis
 * Cluster node is found to be one when the store connects: the store then
 * sends each key's commands to the master of its slot and follows the
 * cluster's redirections and failovers (docs/redis.md); a database other
 * than 0 is then RATE_EINVAL.  Each key lives under PREFIX{KEY} (its own
 * Cluster hash tag; a key holding '}' is escaped, docs/redis.md).
 * Connects at creation (unless lazy_connect), so that a bad host,
 * password, database or a user's missing rights (the ACL's NOPERM, for
 * EVALSHA or HMGET on the store's keys) is reported here: RATE_EINVAL for
 * a malformed URL or option (rediss:// included: no TLS) or a database
 * in a cluster, RATE_ESTORE when Redis cannot be reached or refuses,
 * RATE_ETIMEDOUT when it does not answer in time (a server that accepts
 * and never answers: after connect_timeout_ns + command_timeout_ns per
 * seed tried, "HOST:PORT: CLUSTER SLOTS: timed out after N ms"); `err`
 * (if not NULL) then says why, with the server's message.  Decisions are
 * the memory store's, bit for bit, in one round trip (a Lua twin of the
 * step; see docs/algorithms.md, "Stores"; or, with ratelimit.so loaded,
 * the step itself inside Redis: options->module, docs/redis-module.md);
 * with module RATE_REDIS_MODULE_ON and no module on the server,
 * RATE_ESTORE.  `options` may be NULL.  Thread-safe: yes (callers share
 * pipelined connections). */
RATE_API int rate_store_redis_new(const char *url,
                                  const rate_redis_options_t *options,
                                  rate_store_t **out, char *err,
                                  size_t errlen);

/* Deletes every key of the Redis store's namespace: the names it writes
 * under its prefix (PREFIX{...}, PREFIX s{...}, PREFIX p{...},
 * PREFIX e{...}, PREFIX es{...}), never another name that merely starts
 * with the prefix (SCAN + UNLINK; in a cluster, on every master).
 * An asynchronous Redis store (ratelimit_loop.h) is dropped through the
 * synchronous store it owns, blocking as that one does.
 * RATE_EINVAL for a store that is not a Redis store; RATE_ESTORE or
 * RATE_ETIMEDOUT when Redis fails or does not answer; RATE_ECORRUPT for a
 * reply that does not parse: in a cluster, a master that fails ends its
 * own scan only, the other masters' keys are still deleted, and the first
 * failure is returned at the end (the keys deleted stay deleted; drop
 * again once the master is back for the rest); RATE_ENOMEM (stops at
 * once).  Thread-safe: yes. */
RATE_API int rate_store_redis_drop(rate_store_t *store);

/* Copies into buf (cap bytes, cap > 0, NUL-terminated, cut to fit) why
 * the store's last attempt to connect failed, with the server's message:
 * "" when none failed since one succeeded.  An asynchronous Redis store
 * (rate_store_redis_async_new) says the same of its own connections (a
 * connect refused, AUTH or SELECT refused, a node that did not reply
 * within the command timeout), each with the node's address.  Returns
 * RATE_OK; RATE_EINVAL for a store that is not a Redis store, a NULL buf
 * or a cap of 0.  Thread-safe: yes (an asynchronous store: on its loop's
 * thread). */
RATE_API int rate_store_redis_last_error(rate_store_t *store, char *buf,
                                         size_t cap);

typedef struct rate_redis_status {
    bool ready;                /* the server (or cluster) was reached once */
    bool cluster;              /* a Redis Cluster */
    unsigned masters;          /* masters in the slot map (1: one server) */
    unsigned breakers_open;    /* of those, with the breaker open now */
    uint64_t breaker_opened;   /* times a breaker opened */
    uint64_t breaker_rejected; /* calls failed at once by an open breaker */
    uint64_t redirections;     /* MOVED, ASK and TRYAGAIN followed */
    uint64_t map_refreshes;    /* slot maps read from the cluster */
    uint64_t connect_failures; /* connections that could not be made */
    bool module;               /* decisions go through ratelimit.so now */
    uint64_t module_decisions; /* decisions the module made */
    uint64_t module_fallbacks; /* module calls answered with an error,
                                  "unknown command" (then made by the
                                  scripts) */
    uint64_t lean_decisions;   /* decided in one round trip by a lean
                                  script (docs/redis.md) */
    uint64_t general_decisions;/* ... by the general script */
    uint64_t declined;         /* decisions left to the limiter's
                                  compare-and-set path (a policy past the
                                  scripts' exact range, or a state they
                                  would not read): 3 round trips */
    uint64_t lean_adjustments; /* refunds and penalties made in one round
                                  trip by a lean script (docs/redis.md) */
    uint64_t declined_adjustments; /* ... left to the compare-and-set path
                                  (a composite policy, a sliding window or
                                  log, a state the scripts would not read) */
} rate_redis_status_t;

/* Fills *out with the Redis store's state and counts since its creation.
 * Returns RATE_OK; RATE_EINVAL for a store that is not a Redis store or a
 * NULL out.  Thread-safe: yes. */
RATE_API int rate_store_redis_status(rate_store_t *store,
                                     rate_redis_status_t *out);

/* Sets the expiry of every key under the Redis store's prefix -- states,
 * shadow states and policy records alike -- to ttl_ns, rounded up to ms
 * (SCAN + PEXPIRE, a batch at a time): the refresh of a namespace written
 * with no_ttl and safety_ttl_ns, so that keys idle for a while keep their
 * expiry.  Keys written after the SCAN passed them are not touched.
 * An asynchronous Redis store: through the synchronous store it owns.
 * Returns RATE_OK; RATE_EINVAL for a store that is not a Redis store (or
 * NULL) or a ttl_ns of 0; RATE_ESTORE or RATE_ETIMEDOUT when Redis fails or
 * does not answer; RATE_ECORRUPT for a reply that does not parse (as for
 * rate_store_redis_drop, a failing master ends its own scan only, the
 * others are still touched, the first failure is returned at the end,
 * and the keys touched keep their new expiry); RATE_ENOMEM.
 * Thread-safe: yes, alongside decisions on the same store. */
RATE_API int rate_store_redis_touch(rate_store_t *store, uint64_t ttl_ns);

typedef struct rate_dynamodb_options {
    uint64_t connect_timeout_ns; /* 0: 1 s */
    uint64_t request_timeout_ns; /* 0: 2 s: a request (a round trip,
                                    connecting included) that takes
                                    longer is RATE_ETIMEDOUT */
    const char *prefix;          /* bytes before every key's in the
                                    partition key (a namespace); copied */
    size_t prefix_len;           /* 0..1024 */
    bool create_table;           /* create the table when it is missing
                                    (on-demand billing, the key schema of
                                    docs/dynamodb.md, TTL on `ttl`), and
                                    wait until it is ACTIVE */
    bool no_ttl;                 /* write no expiry (replays on a virtual
                                    clock); default: each item expires
                                    after its reset_after, by the wall
                                    clock */
    uint64_t safety_ttl_ns;      /* with no_ttl: 0 (default) writes no
                                    TTL attribute either; else each state
                                    and shadow state written gets the TTL
                                    attribute at the wall clock plus this
                                    (DynamoDB deletes the item some time
                                    after it), but no expiry of the
                                    reading, so answers stay those of the
                                    caller's clock: the clean-up of a
                                    namespace left behind.  Policy records
                                    get none.  Ignored without no_ttl */
    bool client_time;            /* decide on the limiter's clock (by
                                    default CLOCK_MONOTONIC: one host
                                    only); default: on the wall clock
                                    (CLOCK_REALTIME), which hosts share */
    /* Credentials: both NULL: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY
     * and AWS_SESSION_TOKEN, else the profile AWS_PROFILE ("default") of
     * the shared credentials file (AWS_SHARED_CREDENTIALS_FILE, else
     * ~/.aws/credentials).  Copied. */
    const char *access_key_id;
    const char *secret_access_key;
    const char *session_token; /* NULL: none */
} rate_dynamodb_options_t;

/* The DynamoDB store: url is
 *   dynamodb://TABLE?region=REGION[&endpoint=http(s)://HOST[:PORT]]
 * (the endpoint defaults to https://dynamodb.REGION.amazonaws.com/).
 * Each key is one item of TABLE (docs/dynamodb.md: the key schema,
 * consistency, time and skew, TTL, costs).  Decisions are the memory
 * store's, bit for bit, over the generic contract: a consistent GetItem,
 * then a PutItem conditioned on the item's version, retried by the
 * limiter on a conflict.  The store's clock is the wall clock (unless
 * client_time); an item whose expiry has passed reads as absent.  A
 * policy whose states could outgrow an item (long sliding logs) is
 * refused when it is set (RATE_EPOLICY from rate_limiter_new and
 * rate_limiter_set_policy; rate_store_check_policy says why).  Failures
 * (throttling, a 5xx, a timeout, bad credentials) are store errors under
 * the limiter's fail mode; rate_store_dynamodb_last_error gives the
 * service's message.  Checks the table once here (DescribeTable), so that
 * a missing table, a wrong key schema or an unreachable endpoint is
 * reported now.  Returns RATE_OK, or with `err` (if not NULL, errlen bytes
 * with the NUL) saying why:
 *   RATE_EINVAL    NULL url or out, a malformed URL (not dynamodb://, a
 *                  bad table name, no region, an unknown parameter, an
 *                  endpoint not http(s)://), a bad option, no
 *                  credentials, a table of another key schema
 *   RATE_ESTORE    the endpoint unreachable or refusing (the service's
 *                  message: a missing table, bad credentials, ...)
 *   RATE_ETIMEDOUT no answer in time, or a new table not ACTIVE in 60 s
 *   RATE_ECORRUPT  an answer that is not JSON
 *   RATE_ENOMEM
 * `options` may be NULL.  Free with rate_store_free.  Thread-safe: yes
 * (callers take connections from a pool, one each per request). */
RATE_API int rate_store_dynamodb_new(const char *url,
                                     const rate_dynamodb_options_t *options,
                                     rate_store_t **out, char *err,
                                     size_t errlen);

/* Deletes every item of the DynamoDB store's prefix (a Scan of the table,
 * then one DeleteItem each): how a scratch namespace is removed.
 * RATE_EINVAL for a store that is not a DynamoDB store or has no prefix;
 * RATE_ENOMEM; the store's error (RATE_ESTORE, RATE_ETIMEDOUT, RATE_ECORRUPT
 * for an answer that is not the JSON of a Scan) when a request fails (the
 * items deleted so far stay deleted).  Thread-safe: yes. */
RATE_API int rate_store_dynamodb_drop(rate_store_t *store);

/* What a DynamoDB store has sent since rate_store_dynamodb_new returned
 * (the creation's own requests, DescribeTable and CreateTable, are not
 * counted). */
typedef struct rate_dynamodb_counters {
    uint64_t requests;  /* HTTP requests: the round trips */
    uint64_t reads;     /* GetItem (load) */
    uint64_t writes;    /* PutItem (cas) */
    uint64_t deletes;   /* DeleteItem (remove, drop) */
    uint64_t conflicts; /* conditional writes refused
                           (ConditionalCheckFailedException): each one a
                           retry of the limiter's */
    uint64_t throttled; /* throttling errors (ProvisionedThroughputExceeded,
                           Throttling, RequestLimitExceeded) */
    uint64_t errors;    /* other failed requests */
} rate_dynamodb_counters_t;

/* Fills *out.  RATE_EINVAL for NULL out or a store that is not a DynamoDB
 * store.  Thread-safe: yes (each counter is read atomically, not all
 * together). */
RATE_API int rate_store_dynamodb_counters(rate_store_t *store,
                                          rate_dynamodb_counters_t *out);

/* The last failure of a request of the store, as one line naming the
 * operation and carrying the service's own type and message
 * ("GetItem: HTTP 400 ResourceNotFoundException: Requested resource not
 * found"), or the transport's ("GetItem on http://...: Timeout was
 * reached"); "" if none.  Written into buf (len bytes with the NUL, may
 * be 0); returns the text's whole length.  The store's last, whichever
 * thread it failed on.  Thread-safe: yes. */
RATE_API size_t rate_store_dynamodb_last_error(rate_store_t *store,
                                               char *buf, size_t len);

/* Whether the store can keep every state of `policy` (the store
 * contract's check_policy; a store without one keeps any): RATE_OK, or
 * RATE_EPOLICY with `err` (if not NULL) saying why; RATE_EINVAL for NULL.
 * Thread-safe: yes. */
RATE_API int rate_store_check_policy(rate_store_t *store,
                                     const rate_policy_t *policy, char *err,
                                     size_t errlen);

/* The shared-memory store: one set of keys for every process of a host
 * that maps the same region, with no server (docs/shm.md).  The region is
 * a fixed-size table: max_keys slots in shards, each shard behind a robust
 * process-shared mutex, each slot holding a key of up to key_max bytes and
 * a state of up to state_max bytes (two copies: a decision writes the idle
 * one and commits it with one store, so a process killed anywhere leaves
 * every key as it was before or after its decision).  A process that dies
 * holding a shard's lock is detected by the next locker, which rebuilds
 * and checks that shard and counts the recovery (rate_shm_info_t). */
typedef struct rate_shm_options {
    uint64_t max_keys;      /* keys the region holds: required to create or
                               initialize one (0: an error); 0 to attach
                               takes the region's, else it must match.
                               Split evenly among the shards, each with
                               room for 3 standard deviations more (keys
                               spread by hash: max_keys keys fit); a new
                               key in a full shard evicts that shard's
                               least recently used key (CLOCK), counted in
                               evictions.  One shard holds max_keys
                               exactly */
    unsigned shards;        /* 0: up to 64, each of at least 256 keys;
                               rounded up to a power of two, at most 1024
                               and at most max_keys */
    uint32_t key_max;       /* longest key, prefix included: 0 = 64; at
                               most RATE_KEY_MAX + 64.  A longer key is
                               the caller's error: the limiter's calls
                               return RATE_EKEY (no fail mode) */
    uint32_t state_max;     /* longest state: 0 = 96 (every policy of
                               buckets and windows, a sliding log of up to
                               4 entries); at most 262144.  See
                               rate_store_shm_state_size() */
    uint32_t max_policies;  /* policy records the region keeps: 0 = 64 */
    unsigned mode;          /* the created file's mode bits: 0 = 0600 */
    bool set_group;         /* give the created file the group `group` */
    uint32_t group;
    bool no_create;         /* rate_store_shm_new: attach only, never
                               create (a missing file is an error) */
    bool init;              /* rate_store_shm_new_in: initialize the region
                               whatever it holds (the first caller); false:
                               attach, or initialize a region that is still
                               all zero (see rate_store_shm_new_in) */
    const char *prefix;     /* a namespace: every key (policy records too)
                               is kept as PREFIX+KEY, and
                               rate_store_shm_drop() removes those; copied.
                               At most key_max - 4 bytes (a policy
                               record's key is 4).  NULL: none */
    uint64_t lock_timeout_ns; /* the longest wait for a shard's lock held
                               by a live process: 0 = 2 s; past it the call
                               fails with RATE_ETIMEDOUT (a lock held by a
                               dead process is taken over at once) */
} rate_shm_options_t;

/* Opens the region in the file at `path` (e.g. /dev/shm/myapp.rl), mapped
 * MAP_SHARED: attaches if the file exists, else creates it -- every option
 * checked first, then a temporary file beside it allocated in full
 * (refused at once when statvfs shows less room; posix_fallocate, or a
 * sparse ftruncate only on a file system that cannot allocate: see
 * docs/shm.md), initialized, given `mode` (and `group`), then linked into
 * place, so that no process ever sees half a region (two creators at
 * once: one wins, the other attaches); on any error the temporary file is
 * removed and nothing is left at path.  Attaching
 * checks the header (magic, layout version, this build's lock size, the
 * sizes) and refuses, with `err` (if not NULL, errlen bytes with the NUL)
 * naming the mismatch, anything else.  Returns RATE_OK and *out (free it
 * with rate_store_free: that unmaps, and never removes the file), or
 *   RATE_EINVAL  NULL path or out; a bad option (max_keys 0 when creating,
 *                key_max, state_max or shards out of range, a region of
 *                more than 64 GiB, a prefix longer than key_max - 4); an
 *                option that disagrees with an
 *                existing region ("max_keys: the region has 1000, the
 *                options ask 2000")
 *   RATE_ESTORE  the file cannot be opened, created or mapped (errno's
 *                text: no permission, no such directory, no_create and
 *                absent); no room for it ("cannot allocate its N bytes:
 *                No space left on device", from statvfs or the
 *                allocation); it is not a store (bad magic), of another layout
 *                version or build, truncated or of another size than its
 *                header says
 *   RATE_ENOMEM
 * Thread-safe: yes. */
RATE_API int rate_store_shm_new(const char *path,
                                const rate_shm_options_t *options,
                                rate_store_t **out, char *err, size_t errlen);

/* The same store over a region the caller provides (mem, len bytes, at
 * least 64-byte aligned, shared between the processes by the caller, e.g.
 * an nginx shared zone or its own MAP_SHARED mapping), which stays the
 * caller's (rate_store_free does not unmap it).  Who initializes: the
 * caller that passes options->init (once, before any other attaches); or,
 * without init, the first caller to find the region all zero (a fresh
 * anonymous or ftruncated mapping), by a compare-and-set on its header:
 * the others wait for it (at most lock_timeout_ns).  rate_store_shm_size()
 * tells the bytes needed.  Errors as rate_store_shm_new, and RATE_EINVAL
 * for a NULL or misaligned mem or a len below what the options need;
 * RATE_ESTORE for a region being initialized for longer than
 * lock_timeout_ns (its initializer died: initialize it again with init).
 * Thread-safe: yes. */
RATE_API int rate_store_shm_new_in(void *mem, size_t len,
                                   const rate_shm_options_t *options,
                                   rate_store_t **out, char *err,
                                   size_t errlen);

/* The bytes a region made with these options takes (a multiple of 4096,
 * at most 64 GiB); 0 for options that are not valid.  Thread-safe: yes. */
RATE_API size_t rate_store_shm_size(const rate_shm_options_t *options);

/* The most bytes a state of the policy can take (docs/algorithms.md,
 * "Stored state"): a region whose state_max is at least this keeps every
 * key of the policy.  A policy with a larger one is refused when it is
 * set: rate_store_check_policy, rate_limiter_new and
 * rate_limiter_set_policy return RATE_EPOLICY ("the policy's states take
 * up to 1622 bytes, the shared-memory region keeps at most 96 (its
 * state_max)"), and a resolver's or a rule's such policy is a store error
 * (RATE_EPOLICY) at each decision.  A longer state that still reaches the
 * region (through a caller of the store contract that does not check) is
 * refused when written: RATE_EFULL, and the key keeps its bytes.  The
 * same figure as rate_policy_state_max().  0 for NULL or the unlimited
 * policy.  Thread-safe: yes.
 *
 * A key longer than the region's key_max (with the prefix) is the
 * caller's error, as one longer than RATE_KEY_MAX: the limiter's calls
 * return RATE_EKEY, whatever the fail mode, and nothing is written.  The
 * store's own errors, which a decision on it reports as a store error
 * (under the limiter's fail mode): RATE_EFULL for a state longer than
 * its state_max, or a new policy record past max_policies; RATE_ETIMEDOUT
 * when a live process held the key's shard for lock_timeout_ns;
 * RATE_ESTORE for a shard lock the system refuses (left unrecoverable);
 * RATE_ECORRUPT for a region damaged by a writer of its file (never a
 * crash: docs/shm.md, "A damaged region"); RATE_ENOMEM.  Nothing is
 * written on any of them. */
RATE_API size_t rate_store_shm_state_size(const rate_policy_t *policy);

typedef struct rate_shm_info {
    uint64_t max_keys;     /* as made */
    uint64_t capacity;     /* slots, max_keys and the shards' slack */
    uint64_t keys;         /* held now (states and shadow states) */
    uint64_t evictions;    /* as rate_stats_t */
    uint64_t reclaimed;
    uint64_t recoveries;   /* locks taken over from a dead process */
    uint64_t repaired;     /* slots a recovery found invalid and freed */
    uint64_t policies;     /* policy records held */
    uint64_t bytes;        /* the region's size */
    uint64_t slot_bytes;   /* bytes per key: a slot and its index share */
    uint32_t shards, key_max, state_max, max_policies;
    bool created;          /* this handle created the file (or initialized
                              the caller's region); false: attached */
} rate_shm_info_t;

/* The region's sizes and counters (of every process that used it).
 * RATE_EINVAL for NULL or a store that is not a shared-memory store;
 * RATE_ETIMEDOUT as for a decision; RATE_ECORRUPT for a key count past
 * a shard's slots (a damaged region).  Thread-safe: yes. */
RATE_API int rate_store_shm_info(rate_store_t *store, rate_shm_info_t *out);

/* A full check of the region's invariants, shard by shard under its lock
 * (recovering one a dead process left): every chain and the free list
 * well formed, each key once, in its own shard and bucket, counts that
 * add up, lengths within the region's bounds, policy records unique.
 * RATE_OK; RATE_ECORRUPT with `err` saying what is wrong; RATE_EINVAL
 * for a store that is not a shared-memory store; RATE_ETIMEDOUT.
 * Thread-safe: yes, alongside decisions. */
RATE_API int rate_store_shm_check(rate_store_t *store, char *err,
                                  size_t errlen);

/* Removes every key and policy record under the store's prefix (all of
 * them without one), shard by shard.  RATE_OK, RATE_EINVAL for a store
 * that is not a shared-memory store, RATE_ETIMEDOUT; RATE_ECORRUPT for a
 * damaged shard, after dropping what it can of the others.
 * Thread-safe: yes. */
RATE_API int rate_store_shm_drop(rate_store_t *store);

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
} rate_stats_t;

/* Fills what the store knows (keys, evictions, reclaimed, bytes; the
 * verdicts are counted by each limiter, rate_limiter_stats).
 * Thread-safe: yes. */
RATE_API int rate_store_stats(rate_store_t *store, rate_stats_t *out);

/* Frees the store; no limiter may use it any more.  NULL: nothing. */
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
} rate_limiter_config_t;

/* Makes a limiter.  A store passed in is borrowed: free it after the
 * limiter (either order is safe with nothing in flight; an asynchronous
 * store with decisions in flight is freed first: see
 * rate_limiter_check_start).  Limiters on one store share each key's state (a shadow one
 * keeps its own unless shadow_shares_state): whichever policy each uses,
 * a key's state carries over between them as docs/algorithms.md ("Policy
 * changes") says, also between processes and hosts on one Redis.
 * The limiter records its policy in the store now (the policy's id there,
 * see ratelimit_store.h), or at its first decision if the store does not
 * answer now; on a store that completes later (an event loop's, with an
 * asynchronous entry), always at the first decision, through the store:
 * neither this call nor rate_limiter_check_start waits for it.  RATE_EPOLICY when the store cannot keep the policy's
 * states (rate_store_check_policy: a DynamoDB item's 400 KB, a
 * shared-memory region's state_max).
 * Thread-safe: yes. */
RATE_API int rate_limiter_new(const rate_limiter_config_t *config,
                              rate_limiter_t **out);

/* Frees the limiter (and its private store).  NULL: nothing. */
RATE_API void rate_limiter_free(rate_limiter_t *limiter);

/* The seed interface: true when `permits` may be spent now on the
 * NUL-terminated key.  Bad input (NULL limiter, NULL, empty or over-long
 * key -- past RATE_KEY_MAX, or past what the store keeps -- permits above
 * 2^63-1) is false; a store failure follows the fail
 * mode.  A fast call: on the memory store, with no resolver and a
 * policy of one limit other than a sliding log, a key already stored is
 * decided in place with no decision record.  Thread-safe: yes. */
RATE_API bool rate_try_acquire(rate_limiter_t *limiter, const char *key,
                               uint64_t permits);
#define rate_try_acquire1(limiter, key) rate_try_acquire((limiter), (key), 1)

/* The seed call at a caller-supplied time (<= RATE_TIME_MAX, else false),
 * for servers that read the clock once per request or per event-loop turn.
 * Thread-safe: yes. */
RATE_API bool rate_try_acquire_at(rate_limiter_t *limiter, const char *key,
                                  uint64_t permits, uint64_t now_ns);

/* The same two calls for the key key[0..key_len), any bytes (a NUL byte
 * too: a raw IPv6 address, a string with a length such as nginx's), of
 * 1..RATE_KEY_MAX bytes.  A caller that knows the length saves measuring
 * it, and these are the fastest calls of all.  Thread-safe: yes. */
RATE_API bool rate_try_acquire_len(rate_limiter_t *limiter, const char *key,
                                   size_t key_len, uint64_t permits);
RATE_API bool rate_try_acquire_len_at(rate_limiter_t *limiter,
                                      const char *key, size_t key_len,
                                      uint64_t permits, uint64_t now_ns);

/* The full call: one decision for key[0..key_len) with max_wait_ns of
 * reservation (buckets only; see docs/algorithms.md), at the limiter's clock.
 * Returns RATE_OK with *out filled (allowed or not), or an error code:
 * RATE_EINVAL (NULL limiter or out), RATE_EKEY (NULL, empty, longer than
 * RATE_KEY_MAX, or longer than the store keeps: a shared-memory region's
 * key_max; never under the fail mode), RATE_ERANGE; store failures
 * return RATE_OK with reason RATE_REASON_STORE_ERROR and the fail mode's
 * verdict.  Thread-safe: yes. */
RATE_API int rate_limiter_check(rate_limiter_t *limiter, const char *key,
                                size_t key_len, uint64_t permits,
                                uint64_t max_wait_ns, rate_decision_t *out);

/* The same at a caller-supplied time now_ns (<= RATE_TIME_MAX).  A time
 * before the key's last admitted request counts as that time.
 * Thread-safe: yes. */
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

/* The full call, made asynchronously, at the limiter's clock: for event
 * loops, whose thread must not wait for a store's round trip.  Returns
 * RATE_OK once the decision is under way, and `cb` is then called exactly
 * once: before this returns when the store answers at once (the memory
 * store, and any store without an asynchronous entry: ratelimit_store.h,
 * start()), else later, on the thread the store completes on (an event
 * loop's store: the loop's).  The key is copied; nothing else need stay
 * alive but the limiter, which must not be freed before the callbacks of
 * its decisions have run.  Learning a policy that another limiter wrote
 * into the store (once per policy) is synchronous.  Errors, with no
 * callback: RATE_EINVAL (NULL limiter or cb), RATE_EKEY, RATE_ERANGE,
 * RATE_ENOMEM.  Thread-safe: yes. */
RATE_API int rate_limiter_check_async(rate_limiter_t *limiter,
                                      const char *key, size_t key_len,
                                      uint64_t permits, uint64_t max_wait_ns,
                                      rate_check_fn cb, void *ud);

/* Returned by rate_limiter_check_start when the decision is under way:
 * not an error (positive); the callback will run. */
#define RATE_PENDING 1

/* The asynchronous full call for event loops, which answers at once when
 * it can (docs/async.md).  Returns:
 *   RATE_OK       the decision is made: *out is filled, exactly as
 *                 rate_limiter_check would fill it (store failures are
 *                 decisions under the fail mode), and cb is NOT called.
 *                 The memory and shared-memory stores, any store without
 *                 an asynchronous entry, an unlimited policy, and a store
 *                 that refuses at once (an asynchronous Redis store whose
 *                 breaker is open or whose reconnect backs off) answer so:
 *                 no allocation survives the call.
 *   RATE_PENDING  the store took the decision: cb(ud, RATE_OK, decision)
 *                 runs exactly once, later, never before this returns, on
 *                 the thread that drives the store (an event loop's store:
 *                 inside the loop's callbacks, on the loop's thread); *out
 *                 is zeroed and not written again.
 *   RATE_EINVAL (NULL limiter, out or cb), RATE_EKEY, RATE_ERANGE,
 *   RATE_ENOMEM: no decision, no callback.
 * Ownership: the key is copied; ud is the caller's and is only passed
 * back; the decision handed to cb is valid during the call only.  Until
 * cb has run, the limiter and the store must stay alive.  Freeing the
 * store (rate_store_free) with decisions in flight is defined: each
 * pending cb runs before rate_store_free returns, with a decision of
 * reason RATE_REASON_STORE_ERROR, error RATE_ECANCELED and the fail
 * mode's verdict (the fallback store's, with RATE_FAIL_FALLBACK); one
 * whose command was already sent may still have been applied.  Free
 * the store first, then the limiter: freeing a limiter with decisions in
 * flight is not allowed.  rate_store_free must not be called from inside
 * one of its own callbacks; a callback may start new decisions.  The
 * limiter's listener (rate_limiter_config_t) hears a pending decision on
 * the thread that completes it, just before cb.
 * Thread-safe: as the store's entries (an event loop's store is driven by
 * one thread: start its decisions on that thread). */
RATE_API int rate_limiter_check_start(rate_limiter_t *limiter,
                                      const char *key, size_t key_len,
                                      uint64_t permits, uint64_t max_wait_ns,
                                      rate_decision_t *out, rate_check_fn cb,
                                      void *ud);

/* The same at a caller-supplied time now_ns (<= RATE_TIME_MAX; RATE_ERANGE
 * above), as rate_limiter_check_at: for a loop that reads its clock once
 * per turn.  The store's script then goes by now_ns, not Redis's TIME.
 * Thread-safe: as rate_limiter_check_start. */
RATE_API int rate_limiter_check_start_at(rate_limiter_t *limiter,
                                         const char *key, size_t key_len,
                                         uint64_t permits,
                                         uint64_t max_wait_ns, uint64_t now_ns,
                                         rate_decision_t *out,
                                         rate_check_fn cb, void *ud);

/* Blocking acquire: waits (with the clock's sleep) until the permits are
 * granted or the timeout would pass.  It never sleeps past now + timeout_ns
 * and returns at once when the wait alone would pass it.  Returns RATE_OK
 * with out->allowed true once granted (delay already slept), RATE_OK with
 * out->allowed false when the deadline does not allow it (or never will), or
 * an error as rate_limiter_check.  Thread-safe: yes. */
RATE_API int rate_limiter_acquire(rate_limiter_t *limiter, const char *key,
                                  size_t key_len, uint64_t permits,
                                  uint64_t timeout_ns, rate_decision_t *out);

/* ------------------------------------------ changes outside admissions */

/* These change a key's state outside an admission (docs/algorithms.md,
 * "Bounds and policy changes"), under the key's policy, at the limiter's
 * clock (the *_at forms: at now_ns, which counts as a request's time: the
 * state is read at max(now_ns, t_last) and written with that t_last).
 * They return RATE_OK, or RATE_EINVAL (NULL limiter), RATE_EKEY,
 * RATE_ERANGE (permits or time above RATE_TIME_MAX), or the store's error
 * as is: the fail mode decides admissions only.  A shadow limiter changes
 * its own state (unless it shares the enforced one).  A refund or a
 * penalty goes through the store as a decision does: on Redis, that of a
 * single token bucket, leaky bucket or fixed window within the lean
 * scripts' range is one atomic script (docs/redis.md, "Refunds and
 * penalties", says which they decline: block=, a state of another policy,
 * a penalty past a token bucket's debt bound...); any other, and on any
 * store over load and compare-and-set, the step between them, which
 * returns RATE_ECONFLICT when the key kept changing under it max_retries
 * times.
 * Thread-safe: yes. */

/* Forgets the key: its next request is a new key's.  (With
 * RATE_FAIL_FALLBACK the insurance store forgets it too.) */
RATE_API int rate_limiter_reset(rate_limiter_t *limiter, const char *key,
                                size_t key_len);

/* Gives `permits` back: a token bucket gets its tokens back (up to its
 * burst), a leaky bucket drains them, a window uncounts them from the
 * current window (then a sliding counter from the previous one; nothing
 * once the window they were counted in has rolled), a sliding log drops
 * them from its newest entries.  How a server returns a permit that a
 * later check denied (a per-route limit admitted, the user's limit then
 * denied), or cancels a reservation: a reservation is identified by its
 * key and permits, and cancelling it is refunding them (the debt it left
 * is paid back; any delay already waited is not).  A key with no state
 * has nothing to give back: nothing is written. */
RATE_API int rate_limiter_refund(rate_limiter_t *limiter, const char *key,
                                 size_t key_len, uint64_t permits);
RATE_API int rate_limiter_refund_at(rate_limiter_t *limiter, const char *key,
                                    size_t key_len, uint64_t permits,
                                    uint64_t now_ns);

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
 * rate_limiter_refund / rate_limiter_penalize at the limiter's clock, on
 * a store with an asynchronous entry (rate_store_redis_async_new) through
 * that entry.  Returns RATE_PENDING when the store took it: done(ud, rc)
 * then runs exactly once, later, on the thread that drives the store (an
 * event loop's: the loop's), with what the synchronous call would have
 * returned (RATE_OK, or the store's error as is: no fail mode;
 * RATE_ECANCELED when the store is freed first, which runs every pending
 * done before rate_store_free returns).  Else the result at once, and no
 * callback: RATE_OK (done now: a store without an asynchronous entry, or
 * an unlimited key), or an error as the synchronous call's, RATE_EINVAL
 * also for a NULL done.  The key is copied; ud is the caller's.  A change
 * a lean script makes goes by the clock the scripts' decisions go by
 * (Redis's TIME, unless client_time); one the C step makes, by the
 * limiter's clock, never Redis's TIME (no extra round trip): on Redis,
 * give the limiter a wall clock, or the store client_time, so that the
 * two agree (docs/async.md).
 * Thread-safe: as rate_limiter_check_start. */
typedef void (*rate_done_fn)(void *ud, int rc);
RATE_API int rate_limiter_refund_start(rate_limiter_t *limiter,
                                       const char *key, size_t key_len,
                                       uint64_t permits, rate_done_fn done,
                                       void *ud);
RATE_API int rate_limiter_penalize_start(rate_limiter_t *limiter,
                                         const char *key, size_t key_len,
                                         uint64_t permits, rate_done_fn done,
                                         void *ud);

/* Statistics: the store's figures plus the limiter's own.  Thread-safe: yes. */
RATE_API int rate_limiter_stats(rate_limiter_t *limiter, rate_stats_t *out);

/* The limiter's default policy (borrowed).  After rate_limiter_set_policy
 * the pointer returned before still points at the old policy, valid until
 * the limiter is freed.  Thread-safe: yes. */
RATE_API const rate_policy_t *rate_limiter_policy(const rate_limiter_t *limiter);

/* Replaces the default policy (copied) for every later decision; decisions
 * already running finish under the old one.  Each key's state carries over
 * (docs/algorithms.md, "Policy changes").  The old policy's copy is kept
 * until the limiter is freed.  RATE_EINVAL for NULL; RATE_EPOLICY when the
 * store cannot keep the policy's states (rate_store_check_policy), the
 * old policy then staying; RATE_ENOMEM.
 * Thread-safe: yes. */
RATE_API int rate_limiter_set_policy(rate_limiter_t *limiter,
                                     const rate_policy_t *policy);

/* For callers who pass their own times (the *_at calls): a promise that no
 * later call on this limiter, from any thread, carries a time below t_ns
 * (an event loop calls it once per turn with the oldest time any of its
 * threads may still pass).  Keys written under the promise whose state is
 * back at its cold start by the mark may then be dropped by the store, as
 * keys are on the library's clock: no answer changes.  The mark only
 * rises (a lower one is ignored).  Limiters sharing a store should then
 * read one clock (CLOCK_MONOTONIC, as the library does).  RATE_EINVAL for
 * NULL, RATE_ERANGE above RATE_TIME_MAX.  Thread-safe: yes. */
RATE_API int rate_limiter_set_low_water(rate_limiter_t *limiter,
                                        uint64_t t_ns);

/* ---------------------------------------------------------------- rules */

/* Rules from a file (docs/api-server.md): which named policies a request
 * gets, from attributes the server passes beside the key (an API key's
 * tier, the route, the client address: any strings), and what key each is
 * charged under.  The file is INI:
 *
 *   [policies]
 *   free = token-bucket 10/s burst=20
 *   pro = token-bucket 100/s burst=200
 *   enterprise = unlimited
 *   search = sliding-window 50/s
 *
 *   [rule pro]              ; rules are tried in order, in groups
 *   group = tier
 *   match = tier=pro        ; ATTR=VALUE ..., all on a line; more lines: any
 *   policy = pro
 *   [rule free]             ; no match: every request (the group's default)
 *   group = tier
 *   policy = free
 *   [rule search]
 *   group = route
 *   match = route=/search*  ; VALUE* matches a prefix
 *   policy = search
 *   key = route             ; one key for the route ("@search:/search")
 *
 * In each group the first rule that matches applies; a request gets the
 * policies of every group's match (at most RATE_RULES_MAX_APPLY), or, when
 * no rule matches, the limiter's default policy.  It passes only if every
 * one allows it; when one denies, what the others admitted is refunded
 * (rate_limiter_refund), so a denial charges nothing.  A refund is not
 * atomic with the decisions: a concurrent request on the same key may see
 * the permit spent for that moment. */
#define RATE_RULES_MAX_APPLY 4

typedef struct rate_rules rate_rules_t;

/* A request's attribute: both NUL-terminated, borrowed for the call. */
typedef struct rate_attr {
    const char *name;
    const char *value;
} rate_attr_t;

/* One policy's part of a request's outcome.  A plain value: copies, so an
 * outcome outlives any reload of the rules. */
typedef struct rate_applied {
    char policy_name[RATE_POLICY_NAME_MAX + 1];
    bool unlimited;
    rate_limit_t limit;        /* the limit the decision names (a copy);
                                  zero for the unlimited policy */
    uint64_t permits;
    bool refunded;             /* admitted, then given back: another
                                  policy denied the request */
    rate_decision_t decision;
} rate_applied_t;

typedef struct rate_outcome {
    bool allowed;        /* every policy allowed the request */
    int denied_by;       /* the first applied policy that denied, or -1 */
    uint64_t delay_ns;   /* allowed: the longest wait of a reservation */
    uint64_t generation; /* the rules that decided (rate_rules_generation) */
    size_t count;
    rate_applied_t applied[RATE_RULES_MAX_APPLY];
} rate_outcome_t;

/* Reads a rules file into *out.  Errors, each with a one-line message in
 * err (at most errlen bytes with the NUL) naming the file, the line and
 * what is wrong ("rules.conf:7: policy 'gold' is not defined ..."):
 * RATE_EINVAL for a NULL argument or a file that cannot be read,
 * RATE_EPOLICY for anything wrong in it (a policy's text, an unknown
 * section or setting, a rule that can never apply, a line longer than
 * libinih reads), RATE_ENOMEM.  Free with rate_rules_free.
 * Thread-safe: yes. */
RATE_API int rate_rules_load(const char *path, rate_rules_t **out,
                             char *err, size_t errlen);

/* Reads the file again (path NULL: the one it was loaded from; else this
 * one, which later reloads then read) and, only if all of it is good,
 * makes it the rules of every later decision, atomically: a decision sees
 * the old rules or the new, never a mix; decisions running keep theirs.
 * A bad file changes nothing (errors as for rate_rules_load).  Old rules
 * are freed once no decision can use them: what is kept does not grow
 * with the number of reloads (at most one old set per thread that is
 * deciding at that moment).  Each key's state carries over to the new
 * policies (docs/algorithms.md, "Policy changes").  Reloads are
 * serialised; decisions take no lock.  Thread-safe: yes, alongside
 * rate_rules_check. */
RATE_API int rate_rules_reload(rate_rules_t *rules, const char *path,
                               char *err, size_t errlen);

/* The number of the rules in use: 1 after rate_rules_load, one more after
 * each successful reload; 0 for NULL.  Thread-safe: yes. */
RATE_API uint64_t rate_rules_generation(const rate_rules_t *rules);

/* Frees the rules; no call may be using them.  NULL: nothing.
 * Thread-safe: no (no check or reload may run on them). */
RATE_API void rate_rules_free(rate_rules_t *rules);

/* Decides a request on `limiter` under the rules: the key (the user's, an
 * API key, an address; 1..RATE_KEY_MAX bytes) and its attributes pick the
 * policies, each is decided at one time read once (its reservation up to
 * max_wait_ns), and *out says what each decided.  The limiter's store,
 * fail mode, shadow mode and listener apply to each decision (the
 * listener hears each, a refunded one too).  Returns RATE_OK with *out
 * filled, or: RATE_EINVAL (NULL rules, limiter or out, NULL attrs with
 * nattrs > 0), RATE_EKEY (a bad key, or a rule's key made from
 * attributes longer than RATE_KEY_MAX, or than the store keeps),
 * RATE_ERANGE (permits or max_wait above RATE_TIME_MAX), RATE_ENOMEM (a
 * thread's first call); then nothing is charged.  The limiter's listener
 * must not call rate_rules_check on the same rules (the thread's hold on
 * them is one slot).  Thread-safe: yes; no lock (the thread's first call on these rules takes one, once). */
RATE_API int rate_rules_check(rate_rules_t *rules, rate_limiter_t *limiter,
                              const char *key, size_t key_len,
                              const rate_attr_t *attrs, size_t nattrs,
                              uint64_t permits, uint64_t max_wait_ns,
                              rate_outcome_t *out);

/* The same at a caller-supplied time now_ns (<= RATE_TIME_MAX, else
 * RATE_ERANGE), as rate_limiter_check_at: every policy is decided, and
 * refunded, at that time.  Thread-safe: yes. */
RATE_API int rate_rules_check_at(rate_rules_t *rules, rate_limiter_t *limiter,
                                 const char *key, size_t key_len,
                                 const rate_attr_t *attrs, size_t nattrs,
                                 uint64_t permits, uint64_t max_wait_ns,
                                 uint64_t now_ns, rate_outcome_t *out);

/* The HTTP fields for an outcome, as rate_headers_format for one
 * decision, with one item per policy applied in each RateLimit field
 * (a refunded policy's r counts its permits back), status 429 if any
 * denied (503 if the only denials are fail-closed store errors), and
 * Retry-After the longest wait of the denials (none if one can never
 * pass).  RATE_EINVAL for NULL, RATE_ERANGE for fields too long for
 * *out (zeroed then).  Thread-safe: yes. */
RATE_API int rate_outcome_headers(const rate_outcome_t *outcome,
                                  rate_headers_t *out);

/* Reads CLOCK_MONOTONIC in ns.  Thread-safe: yes. */
RATE_API uint64_t rate_clock_monotonic_ns(void);

/* Reads CLOCK_MONOTONIC_COARSE in ns: the same origin, updated once per
 * kernel tick (a few ms), several times cheaper to read.  Thread-safe: yes. */
RATE_API uint64_t rate_clock_coarse_ns(void);

/* The coarse clock as a limiter's clock (rate_limiter_config_t.clock):
 * servers that accept a time a tick old save most of the clock read.
 * retry_after then holds by that clock: a retry exactly then may still be
 * up to one tick early by the exact one.  Static; never NULL.
 * Thread-safe: yes. */
RATE_API const rate_clock_t *rate_clock_coarse(void);

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
} rate_synced_stats_t;

/* Fills *out (each shard's figures read together, the shards one after
 * another).  RATE_EINVAL for NULL.  Thread-safe: yes. */
RATE_API int rate_synced_stats(rate_synced_t *s, rate_synced_stats_t *out);

/* The synced limiter's L.  Thread-safe: yes. */
RATE_API uint64_t rate_synced_lease(const rate_synced_t *s);

#ifdef __cplusplus
}
#endif
#endif /* RATELIMIT_H */
