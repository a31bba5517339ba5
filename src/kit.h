/* SPDX-License-Identifier: MIT */
/*
 * kit.h -- the algorithm kit: what an algorithm (src/algo/), the step and
 * a store that reads or writes a state's bytes (DynamoDB, Redis) share.
 * Never installed.  Whole numbers in 128 bits, little-endian words, the
 * policy's fields, each algorithm's table (rate__algo_t) and the state's
 * header; no store, clock or lock.
 *
 * The decision path is split in two layers:
 *
 *   src/algo/       one algorithm per file: pure functions over one limit's
 *                  state (view at t_eff, decide, commit, convert);
 *   src/step.c     the key's whole state (a header plus one component per
 *                  limit), the composite rule, and the bytes a store keeps.
 *
 * Every quantity that a rate divides is kept scaled by the period P, so that
 * refills are whole numbers: a token bucket keeps u = tokens * P, and a
 * refill over dt nanoseconds adds dt * L exactly.
 */
#ifndef RATE_KIT_H
#define RATE_KIT_H

#include <string.h>

#include "ratelimit.h"
#include "ratelimit_store.h"

/* Whether a caller's key lies in the library's own namespace (it begins
 * with RATE_KEY_RESERVED, the prefix of the lease states' keys): such a
 * key is refused, so that no call reaches a lease state by its name. */
static inline bool rate__key_reserved(const char *key, size_t len)
{
    return len >= RATE_KEY_RESERVED_LEN && (unsigned char)key[0] == 0xff &&
           memcmp(key, RATE_KEY_RESERVED, RATE_KEY_RESERVED_LEN) == 0;
}

typedef unsigned __int128 rate_u128_t;
typedef __int128 rate_i128_t;

/* Largest debt a token bucket may reserve, in scaled tokens (tokens * P),
 * whatever its layout; see docs/algorithms.md. */
#define RATE__DEBT_MAX (INT64_C(1) << 62)
/* The most permits a policy change charges to a limit of another
 * algorithm (rate__algo_t.charge): more than any capacity, and small
 * enough that u + n never overflows 64 bits. */
#define RATE__CHARGE_MAX (UINT64_C(1) << 63)
/* The largest B * P (C * P) of a bucket kept in one 64-bit word (the
 * narrow layout); above it the component is a signed 128-bit word (the
 * wide layout).  The layout never changes a decision. */
#define RATE__SCALED_MAX (UINT64_C(1) << 62)
/* Longest window, and longest period of a wide bucket (a narrow one's
 * period is bounded by B * P <= 2^62 alone). */
#define RATE__WINDOW_MAX (UINT64_C(1) << 61)

/* Writes a message to err (when err is not NULL and errlen > 0), as
 * snprintf would, and returns rc: how the calls that take an error buffer
 * say what was wrong (src/error.c). */
int rate__fail(char *err, size_t errlen, int rc, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* ---------------------------------------------------------------- helpers */

/* Whether a public struct's reserved words are all zero (docs/design.md,
 * "A stable ABI"): a non-zero one is a later header's field this library
 * does not know. */
#define RATE__RESERVED_ZERO(s) rate__zero_words((s)->reserved, \
                                                sizeof (s)->reserved / 8)
static inline bool rate__zero_words(const uint64_t *w, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (w[i] != 0)
            return false;
    return true;
}

static inline uint64_t rate__ceil_div(rate_u128_t a, uint64_t b)
{
    rate_u128_t q = a / b;
    return (uint64_t)(q + (a % b != 0));
}

/* a / b for a divisor that fits 64 bits and a quotient known to fit. */
static inline uint64_t rate__div64(rate_u128_t a, uint64_t b)
{
    if (a >> 64 == 0)
        return (uint64_t)a / b;
    return (uint64_t)(a / b);
}

static inline uint64_t rate__ceil_div64(rate_u128_t a, uint64_t b)
{
    if (a >> 64 == 0) {
        uint64_t x = (uint64_t)a;
        return x / b + (x % b != 0);
    }
    return rate__ceil_div(a, b);
}

/* ceil(a / b), or RATE_TIME_MAX when that is more: a duration longer
 * than any clock reading (a wide bucket's refill may take 2^124 ns). */
static inline uint64_t rate__ceil_div_sat(rate_u128_t a, uint64_t b)
{
    rate_u128_t q = a / b;

    q += a % b != 0;
    return q > RATE_TIME_MAX ? RATE_TIME_MAX : (uint64_t)q;
}

/* Whether a bucket's B * P (C * P) needs the wide layout. */
static inline bool rate__bucket_wide(const rate_limit_t *l)
{
    return (rate_u128_t)l->burst * l->period_ns > RATE__SCALED_MAX;
}

/* The `limit` a decision reports for one limit: a bucket's burst or
 * capacity (never 0), a window's L (a window has no burst). */
static inline uint64_t rate__shown_limit(const rate_limit_t *l)
{
    return l->burst != 0 ? l->burst : l->limit;
}

/* The decision of the unlimited policy (rate_policy_unlimited), made
 * before any store: allowed, nothing charged, nothing to report. */
static inline void rate__unlimited_decision(rate_decision_t *d)
{
    memset(d, 0, sizeof *d);
    d->allowed = true;
    d->reason = RATE_REASON_ALLOWED;
    d->component = -1;
    d->limit = RATE_NO_LIMIT;
    d->remaining = RATE_NO_LIMIT;
}

/* A whole decimal number in s[0..len) of at most max (>= 9): false on no
 * digits, any other byte, or a value above max.  Policy text, Redis URLs
 * and Redis replies all read their numbers with it. */
static inline bool rate__parse_decimal(const char *s, size_t len, uint64_t max,
                                       uint64_t *out)
{
    uint64_t v = 0;

    if (len == 0)
        return false;
    for (size_t i = 0; i < len; i++) {
        if (s[i] < '0' || s[i] > '9')
            return false;
        uint64_t d = (uint64_t)(s[i] - '0');
        if (v > (max - d) / 10)
            return false;
        v = v * 10 + d;
    }
    *out = v;
    return true;
}

/* A Redis key's version (its hash's field v) as every path reads it:
 * "0", or 1 to 19 digits without a leading zero (docs/redis.md,
 * "Versions").  False for anything else: no version of ours, a corrupt
 * key, never read as a number (05 and 5 would be one version for a
 * reader and two for the compare-and-set script's string compare). */
static inline bool rate__version_parse(const char *s, size_t len,
                                       uint64_t *out)
{
    if (len == 0 || len > 19 || (len > 1 && s[0] == '0'))
        return false;
    return rate__parse_decimal(s, len, UINT64_MAX, out);
}

static inline uint64_t rate__min_u64(uint64_t a, uint64_t b)
{
    return a < b ? a : b;
}

static inline uint64_t rate__sat_add(uint64_t a, uint64_t b)
{
    return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

/* Stored integers are little-endian on every host, so that the Lua step
 * and other machines read the same bytes (a no-op on x86 and arm64). */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
#define RATE__LE64(x) __builtin_bswap64(x)
#define RATE__LE32(x) __builtin_bswap32(x)
#define RATE__LE16(x) ((uint16_t)__builtin_bswap16(x))
#else
#define RATE__LE64(x) (x)
#define RATE__LE32(x) (x)
#define RATE__LE16(x) ((uint16_t)(x))
#endif

static inline uint64_t rate__get64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, sizeof v);
    return RATE__LE64(v);
}

static inline void rate__put64(uint8_t *p, uint64_t v)
{
    v = RATE__LE64(v);
    memcpy(p, &v, sizeof v);
}

/* A signed 128-bit word: two little-endian u64 words, the low one first. */
static inline rate_i128_t rate__get128(const uint8_t *p)
{
    rate_u128_t v = (rate_u128_t)rate__get64(p + 8) << 64 | rate__get64(p);
    return (rate_i128_t)v;
}

static inline void rate__put128(uint8_t *p, rate_i128_t v)
{
    rate__put64(p, (uint64_t)(rate_u128_t)v);
    rate__put64(p + 8, (uint64_t)((rate_u128_t)v >> 64));
}

static inline uint16_t rate__get16(const uint8_t *p)
{
    uint16_t v;
    memcpy(&v, p, sizeof v);
    return RATE__LE16(v);
}

static inline uint32_t rate__get32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, sizeof v);
    return RATE__LE32(v);
}

static inline void rate__put32(uint8_t *p, uint32_t v)
{
    v = RATE__LE32(v);
    memcpy(p, &v, sizeof v);
}

/* ---------------------------------------------------------------- policy */

struct rate_policy {
    /* The `unlimited` policy: count 0, no limits, no state; every request
     * is allowed before any store is asked (rate_policy_unlimited). */
    bool unlimited;
    size_t count;
    rate_limit_t limits[RATE_MAX_LIMITS];
    const struct rate__algo *algo[RATE_MAX_LIMITS]; /* per limit */
    uint32_t fingerprint;   /* hash of the limits: tags the stored state */
    size_t grow;            /* state bytes one admission may add */
    uint64_t max_reset_ns;  /* bound on reset_after of an admitted
                               try-acquire (no reservation) */
    bool block;             /* a limit has block_ns: the state ends with
                               the u64 time its key is blocked until */
    /* The algorithm's plain pass (rate__algo_t.plain) when the policy is
     * one limit of a fixed size (what rate_state_acquire runs), else NULL. */
    int (*plain)(const rate_acquire_t *req, uint64_t n, uint64_t now,
                 uint8_t *st, size_t len, uint64_t *ttl_ns);
    /* The policy's name ("" none): metadata for headers and metrics, not
     * part of the fingerprint or of the store's record (a rename never
     * moves a key to another policy).  Last, so that the fields the
     * decision reads share their cache lines as before. */
    char name[RATE_POLICY_NAME_MAX + 1];
};

/* The policy's canonical text without its name: what a store's record of
 * the policy holds (src/registry.c).  As rate_policy_format otherwise. */
size_t rate__policy_format_limits(const rate_policy_t *p, char *buf,
                                  size_t len);

/* Checks a policy name (rate_policy_set_name's rule): RATE_OK, or
 * RATE_EINVAL with a one-line reason in err. */
int rate__policy_check_name(const char *name, size_t len, char *err,
                            size_t errlen);

/* ------------------------------------------------------------ algorithms */

/* One limit's state as seen at t_eff, after refill, drain, window roll or
 * pruning.  Which fields mean what is up to each algorithm. */
typedef struct rate__view {
    rate_i128_t x;         /* tokens*P, level*P, count, prev */
    uint64_t y;            /* curr (sliding window) */
    const uint8_t *log;    /* sliding log: first entry inside the window */
    uint32_t log_count;    /* entries from `log` on */
    uint64_t log_sum;      /* their permits (less trim) */
    uint64_t trim;         /* sliding log: permits a refund drops from the
                              newest entries when it is written */
    uint8_t entry[16];     /* sliding log: an entry of the view's own */
} rate__view_t;

/* What a step does besides deciding: the calls that change a key's state
 * outside an admission (docs/algorithms.md, "Bounds and policy changes"). */
typedef enum rate__op {
    RATE__OP_DECIDE = 0,
    RATE__OP_REFUND,  /* give `permits` back, no further than cold */
    RATE__OP_PENALTY, /* charge `permits` past what remains, up to the
                         fullest state (a token bucket: into debt) */
} rate__op_t;
/* The store contract's names for them (rate_decide_req_t.op). */
_Static_assert((int)RATE__OP_DECIDE == (int)RATE_DECIDE_ACQUIRE &&
                   (int)RATE__OP_REFUND == (int)RATE_DECIDE_REFUND &&
                   (int)RATE__OP_PENALTY == (int)RATE_DECIDE_PENALTY,
               "one numbering of the operations");

/* One limit's verdict.  *_now describe the state as it is (used when the
 * request is denied by any limit); *_after the state once the request is
 * admitted (valid only when allowed). */
typedef struct rate__verdict {
    bool allowed;
    rate_reason_t reason;
    uint64_t delay_ns;
    uint64_t retry_after_ns;
    uint64_t remaining_now, reset_now_ns;
    uint64_t remaining_after, reset_after_ns;
} rate__verdict_t;

typedef struct rate__algo {
    const char *name;
    size_t fixed; /* bytes of stored state before any log entries */
    size_t grow;  /* bytes more per admission */
    /* Where the Redis scripts decide this algorithm exactly (docs/redis.md,
     * "Where the scripts are exact"): every number the general step meets
     * stays below lua_step; a lean script's numbers (a bucket's word in
     * units of g, a window's count and length) below lua_lean, 0: no lean
     * script.  Set by RATE__LUA_RANGE, which the build also reads into the
     * scripts as constants (cmake/lua_range.cmake): one gate, one place. */
    uint64_t lua_step;
    uint64_t lua_lean;
    /* Bytes the stored component at st takes, 0 if `avail` is too short;
     * NULL for a component of always `fixed` bytes. */
    size_t (*size)(const uint8_t *st, size_t avail);
    /* Reads the stored component as of the key's t_last (st NULL: cold). */
    void (*load)(const rate_limit_t *l, const uint8_t *st, rate__view_t *v);
    /* Moves a view from t_last to t >= t_last: refill, drain, window roll,
     * pruning. */
    void (*advance)(const rate_limit_t *l, rate__view_t *v, uint64_t last,
                    uint64_t t);
    /* detail false: only allowed/reason/delay are needed (try-acquire). */
    void (*decide)(const rate_limit_t *l, const rate__view_t *v, uint64_t t,
                   uint64_t n, uint64_t max_wait, bool detail,
                   rate__verdict_t *out);
    /* Writes the state after admitting n at t; returns its length. */
    size_t (*commit)(const rate_limit_t *l, const rate__view_t *v, uint64_t t,
                     uint64_t n, uint8_t *out);
    /* Whether the view is the algorithm's cold start (full bucket, empty
     * bucket, empty windows). */
    bool (*is_cold)(const rate_limit_t *l, const rate__view_t *v);
    /* Re-reads a view made under `from` as one under `to` (same
     * algorithm), both at time t (the key's t_last). */
    void (*convert)(const rate_limit_t *from, const rate_limit_t *to,
                    uint64_t t, rate__view_t *v);
    uint64_t (*max_reset)(const rate_limit_t *l);
    /* Whether a stored component (of its whole size, checked before) can
     * have been written under l by this library at t_last or before: a
     * state that fails it is RATE_ECORRUPT, never decided (a token bucket
     * fuller than its burst, a window counting past its limit, a log out
     * of order). */
    bool (*valid)(const rate_limit_t *l, const uint8_t *st, uint64_t t_last);
    /* Optional: what `valid` leaves to the admission, checked on the view
     * before it is written back (a log's entries: linear in the log, which
     * the admission copies anyway). */
    bool (*view_ok)(const rate_limit_t *l, const rate__view_t *v,
                    uint64_t t_last);
    /* A refund or a penalty of n permits on the view at t: changes the view
     * and returns the permits commit() is then to admit (a log's penalty
     * is an entry), else 0. */
    uint64_t (*adjust)(const rate_limit_t *l, rate__view_t *v, rate__op_t op,
                       uint64_t n, uint64_t t);
    /* The permits a view advanced to t still counts against its limit,
     * by the algorithm's own rule, rounded up: a token bucket's missing
     * tokens (its debt included), a leaky bucket's level, a window's
     * count, a log's sum, a counter's weighted estimate.  What a policy
     * change carries to a limit of another algorithm (docs/algorithms.md,
     * "Policy changes"). */
    uint64_t (*held)(const rate_limit_t *l, const rate__view_t *v,
                     uint64_t t);
    /* At most how many permits this limit admitted from a to last
     * (a <= last), given its view as of last (not advanced): what it
     * holds plus what its own rule let it recover since a, or what its
     * windows can count there (saturated at UINT64_MAX). */
    uint64_t (*since)(const rate_limit_t *l, const rate__view_t *v,
                      uint64_t last, uint64_t a);
    /* Makes a cold view one that holds u permits (at most 2^63) admitted
     * at t: the other side of held().  u may pass the limit's capacity (a
     * view that denies until it has recovered from all of them); only an
     * admission, which needs u + n within it, is ever written. */
    void (*charge)(const rate_limit_t *l, rate__view_t *v, uint64_t t,
                   uint64_t u);
    /* Optional: a plain try-acquire (max_wait 0, no detail) over a whole
     * stored state of one limit of this algorithm, decided and rewritten in
     * place: what rate_state_acquire() runs (fixed-size components only).
     * Defined by RATE__DEFINE_PLAIN from the functions above, so the
     * decisions are theirs; the compiler folds them into one pass.  Returns
     * a RATE_ACQUIRE_* code, or RATE_ENOTSUP for a state made under
     * anything but req's policy and format (nothing touched). */
    int (*plain)(const rate_acquire_t *req, uint64_t n, uint64_t now,
                 uint8_t *st, size_t len, uint64_t *ttl_ns);
} rate__algo_t;

/* Defines PREFIX_plain_inline and PREFIX_plain (rate__algo_t.plain) from
 * an algorithm file's own static valid, load, advance, decide and commit,
 * all inlined into it, so that the constant max_wait 0 and detail false
 * prune them; an algorithm whose functions are in its header (the token
 * bucket's) is inlined into rate_state_acquire itself (src/step.c).  FIXED is
 * the component's size.  Anything unexpected about the state (another
 * policy, format or size, a corrupt time) is left to rate__step, which
 * reports it.  Only t_last of the header changes: the rest already says
 * this policy. */
#if defined(__GNUC__)
#define RATE__FLATTEN __attribute__((flatten))
#define RATE__ALWAYS_INLINE inline __attribute__((always_inline))
#else
#define RATE__FLATTEN
#define RATE__ALWAYS_INLINE inline
#endif
#define RATE__DEFINE_PLAIN_INLINE(prefix, FIXED)                              \
    static RATE__ALWAYS_INLINE int prefix##_plain_inline(                     \
        const rate_acquire_t *req, uint64_t n, uint64_t now, uint8_t *st,     \
        size_t len, uint64_t *ttl_ns)                                         \
    {                                                                         \
        const rate_policy_t *p = req->policy;                                 \
        const rate_limit_t *l = &p->limits[0];                                \
        rate__view_t v;                                                       \
        rate__verdict_t r;                                                    \
        if (!rate__header_is(req, st, len, FIXED) ||                          \
            !prefix##_valid(l, st + RATE__HEADER_LEN, rate__get64(st)))       \
            return RATE_ENOTSUP;                                              \
        uint64_t last = rate__get64(st);                                      \
        uint64_t t = now > last ? now : last;                                 \
        prefix##_load(l, st + RATE__HEADER_LEN, &v);                          \
        prefix##_advance(l, &v, last, t);                                     \
        prefix##_decide(l, &v, t, n, 0, false, &r);                           \
        if (!r.allowed)                                                       \
            return RATE_ACQUIRE_DENIED;                                       \
        if (n == 0)                                                           \
            return RATE_ACQUIRE_KEPT;                                         \
        prefix##_commit(l, &v, t, n, st + RATE__HEADER_LEN);                  \
        rate__put64(st, t);                                                   \
        *ttl_ns = p->max_reset_ns;                                            \
        return RATE_ACQUIRE_WROTE;                                            \
    }
/* PREFIX_plain, the function of rate__algo_t.plain, of PREFIX_plain_inline. */
#define RATE__DEFINE_PLAIN_FN(prefix)                                         \
    RATE__FLATTEN static int prefix##_plain(const rate_acquire_t *req,        \
                                            uint64_t n, uint64_t now,         \
                                            uint8_t *st, size_t len,          \
                                            uint64_t *ttl_ns)                 \
    {                                                                         \
        return prefix##_plain_inline(req, n, now, st, len, ttl_ns);           \
    }
#define RATE__DEFINE_PLAIN(prefix, FIXED)                                     \
    RATE__DEFINE_PLAIN_INLINE(prefix, FIXED)                                  \
    RATE__DEFINE_PLAIN_FN(prefix)

/* An algorithm table's exact range in the Redis scripts, as powers of
 * two (rate__algo_t.lua_step, lua_lean; lean 0: none).  Written with
 * literal numbers: cmake/lua_range.cmake reads them from the table's file
 * into the scripts' constants. */
#define RATE__LUA_RANGE(step_bits, lean_bits)                                  \
    .lua_step = UINT64_C(1) << (step_bits),                                   \
    .lua_lean = (lean_bits) == 0 ? 0 : UINT64_C(1) << (lean_bits)

/* Each algorithm's table, rate__<table> of RATE_ALGORITHM_MAP. */
#define RATE__X(id, value, name, alias, option, span, table) \
    extern const rate__algo_t rate__##table;
RATE_ALGORITHM_MAP(RATE__X)
#undef RATE__X
/* The buckets' wide layout (a 16-byte component): the same algorithm,
 * another table, so that a table's `fixed` stays one number.  A limit's
 * table is rate__algo_for(limit); every function of either table reads a
 * stored component by the layout of the limit it is given (load() of a
 * carried-over state gets the old limit), and works on a view in 128
 * bits, so a state carries over between the layouts. */
extern const rate__algo_t rate__token_bucket_wide;
extern const rate__algo_t rate__leaky_bucket_wide;

/* The algorithm's table (the narrow one for the buckets), NULL if none. */
const rate__algo_t *rate__algo(rate_algorithm_t a);
/* The table a (valid) limit's component is kept by. */
const rate__algo_t *rate__algo_for(const rate_limit_t *l);

/* ---------------------------------------------------- the state header */

/* Stored formats: version 2 is the first edition's (the 32-bit tag is the
 * policy's fingerprint), 3 the second's (the tag is the policy's id in the
 * store's records).  The layout is otherwise the same. */
#define RATE__FORMAT_V1 2u
#define RATE__FORMAT 3u

#define RATE__HEADER_LEN 14u

/* Whether st is a whole state of one component of `fixed` bytes made
 * under req's policy in req's format (version and count, read as one
 * 16-bit word, tag, length), with a t_last in range: the state the
 * single-limit fast paths decide over. */
static inline bool rate__header_is(const rate_acquire_t *req,
                                   const uint8_t *st, size_t len, size_t fixed)
{
    return len == RATE__HEADER_LEN + fixed &&
           rate__get16(st + 12) == (1u | (unsigned)req->format << 8) &&
           rate__get32(st + 8) == req->policy_id &&
           rate__get64(st) <= RATE_TIME_MAX;
}

#endif /* RATE_KIT_H */
