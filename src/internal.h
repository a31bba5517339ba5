/*
 * internal.h -- shared by the library's own files; never installed.
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
#ifndef RATE_INTERNAL_H
#define RATE_INTERNAL_H

#include <stdatomic.h>
#include <string.h>

#include "ratelimit.h"
#include "ratelimit_store.h"

typedef unsigned __int128 rate_u128_t;
typedef __int128 rate_i128_t;

/* Largest debt a token bucket may reserve, in scaled tokens (tokens * P).
 * Keeps the stored state in a signed 64-bit word; see docs/algorithms.md. */
#define RATE__DEBT_MAX (INT64_C(1) << 62)
#define RATE__SCALED_MAX (UINT64_C(1) << 62) /* burst * period bound */
#define RATE__WINDOW_MAX (UINT64_C(1) << 61)

/* ---------------------------------------------------------------- policy */

struct rate_policy {
    size_t count;
    rate_limit_t limits[RATE_MAX_LIMITS];
    const struct rate__algo *algo[RATE_MAX_LIMITS]; /* per limit */
    uint32_t fingerprint;   /* hash of the limits: tags the stored state */
    size_t grow;            /* state bytes one admission may add */
    uint64_t max_reset_ns;  /* bound on reset_after of an admitted
                               try-acquire (no reservation) */
    /* The in-place steps the limiter offers a store (rate_step_t.inplace)
     * for a plain try-acquire and for the full decision; NULL unless the
     * policy is one fixed-size limit. */
    int (*inplace_plain)(void *, void *, size_t, bool *, uint64_t *);
    int (*inplace_full)(void *, void *, size_t, bool *, uint64_t *);
    /* The algorithm's plain pass (rate__algo_t.plain) under the same
     * condition: what a store's lane runs. */
    int (*plain)(const rate_policy_t *, uint8_t *, size_t, uint64_t,
                 uint64_t);
    /* The id of the last limiter that registered it (0: none); an id, not
     * a pointer, because a freed limiter's address comes back. */
    _Atomic uint64_t seen_by;
};

/* ------------------------------------------------------------ algorithms */

/* One limit's state as seen at t_eff, after refill, drain, window roll or
 * pruning.  Which fields mean what is up to each algorithm. */
typedef struct rate__view {
    rate_i128_t x;         /* tokens*P, level*P, count, prev */
    uint64_t y;            /* curr (sliding window) */
    const uint8_t *log;    /* sliding log: first entry inside the window */
    uint32_t log_count;    /* entries from `log` on */
    uint64_t log_sum;      /* their permits */
} rate__view_t;

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
    /* Optional: a plain try-acquire (max_wait 0, no detail) over a whole
     * stored state of one limit of this algorithm, made under the request's
     * policy, decided and rewritten in place: a rate_step_t.inplace, which
     * the limiter offers for such requests (fixed-size components only).
     * Defined by RATE__DEFINE_INPLACE from the functions above, so the
     * decisions are theirs; the compiler folds them into one pass. */
    int (*inplace)(void *arg, void *state, size_t len, bool *allowed,
                   uint64_t *ttl_ns);
    /* The same decision as a store's lane asks for it (see rate__lane_t):
     * st is the key's whole stored state, len its length; returns a
     * RATE__PLAIN_* code and writes nothing else. */
    int (*plain)(const rate_policy_t *p, uint8_t *st, size_t len,
                 uint64_t now, uint64_t n);
} rate__algo_t;

/* What rate__algo_t.plain returns: the request was not this pass's to
 * decide (nothing touched), denied, admitted with the bytes unchanged
 * (zero permits), admitted and rewritten.  Bit 0 is "allowed". */
enum {
    RATE__PLAIN_NO = -1,
    RATE__PLAIN_DENIED = 0,
    RATE__PLAIN_READ = 1,
    RATE__PLAIN_WROTE = 3,
};

/* Defines PREFIX_try and PREFIX_inplace (see rate__algo_t) from an
 * algorithm file's own static load, advance, decide and commit, all
 * inlined into them (flatten), so that the constant max_wait 0 and detail
 * false prune them; RATE__DEFINE_PLAIN below makes PREFIX_plain of
 * PREFIX_try.  FIXED is the component's size.  Anything unexpected
 * about the state (another policy, version or size, a corrupt time) is
 * left to rate__step, which reports it.  Only t_last of the header
 * changes: the rest already says this policy. */
#if defined(__GNUC__)
#define RATE__FLATTEN __attribute__((flatten))
#define RATE__ALWAYS_INLINE inline __attribute__((always_inline))
#else
#define RATE__FLATTEN
#define RATE__ALWAYS_INLINE inline
#endif
#define RATE__DEFINE_INPLACE(prefix, FIXED)                                   \
    static RATE__ALWAYS_INLINE int prefix##_try(const rate_policy_t *p,       \
                                                uint8_t *st, size_t len,      \
                                                uint64_t now, uint64_t n,     \
                                                rate__verdict_t *r)           \
    {                                                                         \
        const rate_limit_t *l = &p->limits[0];                                \
        rate__view_t v;                                                       \
        if (!rate__header_is(p, st, len, FIXED))                              \
            return RATE__PLAIN_NO;                                            \
        uint64_t last = rate__get64(st);                                      \
        uint64_t t = now > last ? now : last;                                 \
        prefix##_load(l, st + RATE__HEADER_LEN, &v);                          \
        prefix##_advance(l, &v, last, t);                                     \
        prefix##_decide(l, &v, t, n, 0, false, r);                            \
        if (!r->allowed)                                                      \
            return RATE__PLAIN_DENIED;                                        \
        if (n == 0)                                                           \
            return RATE__PLAIN_READ;                                          \
        prefix##_commit(l, &v, t, n, st + RATE__HEADER_LEN);                  \
        rate__put64(st, t);                                                   \
        return RATE__PLAIN_WROTE;                                             \
    }                                                                         \
    RATE__FLATTEN static int prefix##_inplace(void *varg, void *state,        \
                                              size_t len, bool *allowed,      \
                                              uint64_t *ttl_ns)               \
    {                                                                         \
        const rate__step_arg_t *arg = varg;                                   \
        rate_decision_t *d = arg->decision;                                   \
        rate__verdict_t r;                                                    \
        int rc = prefix##_try(arg->policy, state, len, arg->now_ns,           \
                              arg->permits, &r);                              \
        if (rc == RATE__PLAIN_NO)                                             \
            return RATE_INPLACE_NO;                                           \
        /* The limiter zeroed d: these are a try-acquire's fields. */         \
        *allowed = d->allowed = r.allowed;                                    \
        d->reason = r.reason;                                                 \
        d->retry_after_ns = r.retry_after_ns;                                 \
        d->limit = rate__shown_limit(&arg->policy->limits[0]);                \
        if (rc != RATE__PLAIN_WROTE)                                          \
            return RATE_INPLACE_READ;                                         \
        *ttl_ns = arg->policy->max_reset_ns;                                  \
        return RATE_INPLACE_WROTE;                                            \
    }

/* Defines PREFIX_plain (rate__algo_t.plain) from PREFIX_try. */
#define RATE__DEFINE_PLAIN(prefix)                                            \
    RATE__FLATTEN static int prefix##_plain(const rate_policy_t *p,           \
                                            uint8_t *st, size_t len,          \
                                            uint64_t now, uint64_t n)         \
    {                                                                         \
        rate__verdict_t r;                                                    \
        return prefix##_try(p, st, len, now, n, &r);                          \
    }

extern const rate__algo_t rate__token_bucket;
extern const rate__algo_t rate__leaky_bucket;
extern const rate__algo_t rate__fixed_window;
extern const rate__algo_t rate__sliding_log;
extern const rate__algo_t rate__sliding_window;

const rate__algo_t *rate__algo(rate_algorithm_t a);

/* Writes a message to err (when err is not NULL and errlen > 0), as
 * snprintf would, and returns rc: how the calls that take an error buffer
 * say what was wrong (src/error.c). */
int rate__fail(char *err, size_t errlen, int rc, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* ---------------------------------------------------------------- helpers */

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

/* The `limit` a decision reports for one limit: a bucket's burst or
 * capacity (never 0), a window's L (a window has no burst). */
static inline uint64_t rate__shown_limit(const rate_limit_t *l)
{
    return l->burst != 0 ? l->burst : l->limit;
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

/* ------------------------------------------------------------- the step */

/* Looks up a policy this limiter has used, by fingerprint (for a key whose
 * stored state was made under another policy).  Copies it into *out. */
typedef bool (*rate__policy_lookup_fn)(void *ud, uint32_t fingerprint,
                                       rate_policy_t *out);

typedef struct rate__step_arg {
    const rate_policy_t *policy;
    rate__policy_lookup_fn lookup;
    void *lookup_ud;
    uint64_t now_ns;
    uint64_t permits;
    uint64_t max_wait_ns;
    bool detail;
    rate_decision_t *decision; /* out */
} rate__step_arg_t;

/* The rate_step_fn every store runs, and its cold-state test (src/step.c). */
int rate__step(void *arg, rate_step_io_t *io);
bool rate__is_cold(void *arg, const void *state, size_t len, uint64_t now_ns);
int rate__step_inplace(void *arg, void *state, size_t len, bool *allowed,
                       uint64_t *ttl_ns);

#define RATE__HEADER_LEN 14u
#define RATE__STATE_VERSION 2u /* 1: a 16-byte header, 2 bytes of padding */

/* Whether st is a whole state of one component of `fixed` bytes made
 * under p (version and count, read as one 16-bit word, fingerprint,
 * length), with a t_last in range:
 * the state the single-limit fast paths decide over. */
static inline bool rate__header_is(const rate_policy_t *p, const uint8_t *st,
                                   size_t len, size_t fixed)
{
    return len == RATE__HEADER_LEN + fixed &&
           rate__get16(st + 12) == (1u | RATE__STATE_VERSION << 8) &&
           rate__get32(st + 8) == p->fingerprint &&
           rate__get64(st) <= RATE_TIME_MAX;
}

/* The bool API's lane (rate_try_acquire and the calls like it).  Every
 * limiter has one, as its first member.  `fn` holds one function per
 * `how` (below), so that each public call jumps to a function made for
 * it: its store's lanes when the store has them for the policy and every
 * key has the limiter's default policy (no resolver), else the limiter's
 * general path.  A store's lane checks the input as the limiter does
 * (rate__lane_input), decides keys it holds under `policy` in place,
 * counting the verdict, and hands everything else, untouched, to
 * `general`: new keys, states made under another policy, bad input (which
 * `general` reports as false).  No decision record is written: that is
 * what makes the bool API faster.  `how` says whether the time is the
 * library clock's and whether the key is NUL-terminated.  Both are left to
 * the lane, so that the public call stays a jump into it: fn[how] with
 * RATE__LANE_CLOCK is given no time and reads the clock itself
 * (now_ns(clock_ud)), and measures a NUL-terminated key.  What a lane hands
 * on to `general` carries the time read and the length. */
enum {
    RATE__LANE_CLOCK = 1, /* the time is the limiter's clock's */
    RATE__LANE_CSTR = 2,  /* key is NUL-terminated; len is not yet known */
    RATE__LANE_HOWS = 4   /* the number of `how`s: fn's length */
};
typedef struct rate__lane rate__lane_t;
typedef bool (*rate__lane_fn)(const rate__lane_t *lane, const char *key,
                              size_t len, uint64_t permits, uint64_t now,
                              unsigned how);
struct rate__lane {
    rate__lane_fn fn[RATE__LANE_HOWS]; /* fn[how] */
    void *self; /* the store's */
    const rate_policy_t *policy;
    bool shadow;
    rate__lane_fn general; /* takes len and now: never RATE__LANE_CSTR */
    uint64_t (*now_ns)(void *ud); /* the limiter's clock */
    void *clock_ud;
};

/* A lane's key length: len, or measured (up to one byte past
 * RATE_KEY_MAX; 0 for NULL) when `how` says the key is NUL-terminated. */
static inline size_t rate__lane_len(const char *key, size_t len, unsigned how)
{
    if (how & RATE__LANE_CSTR)
        return key != NULL ? strnlen(key, RATE_KEY_MAX + 1) : 0;
    return len;
}

/* The bool API's input check: a key of 1..RATE_KEY_MAX bytes (*len is
 * measured first, rate__lane_len, and is set also when out of range),
 * permits and time in range. */
static inline bool rate__lane_input(const char *key, size_t *len,
                                    uint64_t permits, uint64_t now,
                                    unsigned how)
{
    *len = rate__lane_len(key, *len, how);
    return key != NULL && *len - 1 < RATE_KEY_MAX &&
           permits <= RATE_TIME_MAX && now <= RATE_TIME_MAX;
}

/* Store internals the limiter needs. */
struct rate_store {
    const rate_store_vtable_t *vt;
    void *self;
    /* The library's own stores only (else NULL): sets fn[] to the
     * store's lanes for keys of policy p, or returns false if it has
     * none for it. */
    bool (*lanes)(const rate_policy_t *p, rate__lane_fn fn[RATE__LANE_HOWS]);
};

#endif /* RATE_INTERNAL_H */
