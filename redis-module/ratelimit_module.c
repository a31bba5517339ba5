/* SPDX-License-Identifier: MIT */
/*
 * ratelimit.so: a Redis module whose commands run the library's own step
 * (src/step.c, the rate_step_t.fn every store is handed) inside Redis,
 * over the state the Redis store keeps: a hash with v (the version) and
 * s (the state bytes), as the store's scripts read and write it, so that
 * a key written by either is decided by the other.
 *
 *   RATELIMIT.STEP key now_s now_ns permits max_wait ttl policy_id format
 *                  [algorithm L P B]...
 *       the arguments and replies of src/store/redis/step.lua;
 *   RATELIMIT.LEASE key op now max reserve critical id expires pid ttl
 *       an in-flight limit's lease operation: the lease step
 *       (src/lease/step.c), the arguments and replies of
 *       src/store/redis/lease.lua;
 *   RATELIMIT.LEASESTEP lease_key rate_key [lease arguments] [step
 *       arguments]: an acquire with its rate limits, all or nothing, as
 *       src/store/redis/lease_rate.lua makes it;
 *   RATELIMIT.FAIR key table (RATELIMIT.STEP's arguments) hash weight
 *                  slots period_us period_ns limit
 *       a fair shares' decision (docs/fair.md): the step gated by the
 *       fair rule (src/fair/step.c) over the table, the arguments and
 *       replies of src/store/redis/fair.lua;
 *   CL.THROTTLE key max_burst count_per_period period [quantity]
 *       redis-cell's command and reply.
 *
 * Expiries are set from the server's clock (CLOCK_REALTIME, the clock
 * behind TIME), whatever time the caller decided at, rounded up to the
 * millisecond plus one: never before reset_after by Redis's own clock.
 * Every write is replicated as what was written (HSET of the bytes, then
 * PEXPIREAT of the absolute expiry, or PERSIST), never as the command, so
 * a replica and an AOF replay end with the same bytes and expiry.
 * docs/redis-module.md says more.
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "step.h"
#include "fair/step.h"
#include "lease/lease.h"
#include "rm_api.h"

#define MODULE_NAME "ratelimit"
#define MODULE_VERSION 1
/* A key's version (rate__version_parse) counts up by one per write below
 * VERSION_TOP (docs/redis.md, "Versions"). */
#define VERSION_TOP UINT64_C(9223372036854775807)

/* ------------------------------------------------------ the API lookup */

/* The server's calls (rm_api.h), looked up at load time. */
static rm_api_t rm;

/* Looks up every call of RM_API_MAP and registers the module's name:
 * RM_OK, or RM_ERR when the server lacks a call or the name is taken. */
static int rm_init(RedisModuleCtx *ctx, const char *name, int version)
{
    /* The documented handshake: the context's first word is GetApi. */
    int (*get_api)(const char *, void *);
    void *first;
    memcpy(&first, (void *)ctx, sizeof first);
    memcpy(&get_api, &first, sizeof get_api);
#define RM_LOOKUP_(fn, ret, args)                                            \
    if (get_api("RedisModule_" #fn, (void *)&rm.fn) != RM_OK)                \
        return RM_ERR;
    RM_API_MAP(RM_LOOKUP_)
#undef RM_LOOKUP_
    if (rm.IsModuleNameBusy(name))
        return RM_ERR;
    rm.SetModuleAttribs(ctx, name, version, RM_APIVER_1);
    return RM_OK;
}

/* ------------------------------------------------------------- helpers */

/* The server's wall clock, in ns, at TIME's resolution (microseconds). */
static uint64_t server_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * RATE_NS_PER_S +
           (uint64_t)(ts.tv_nsec / 1000) * 1000;
}

/* A decimal argument up to max; "" is not one. */
static bool arg_u64(RedisModuleString *s, uint64_t max, uint64_t *out)
{
    size_t n;
    const char *p = rm.StringPtrLen(s, &n);
    uint64_t v = 0;
    if (n == 0 || n > 20)
        return false;
    for (size_t i = 0; i < n; i++) {
        if (p[i] < '0' || p[i] > '9')
            return false;
        unsigned d = (unsigned)(p[i] - '0');
        if (v > (UINT64_MAX - d) / 10)
            return false;
        v = v * 10 + d;
    }
    if (v > max)
        return false;
    *out = v;
    return true;
}

/* Whether two key arguments name one key.  A command of two keys
 * refuses that: it opens both at once, and two handles on one key are
 * two views of it (a handle made while the key was absent, written after
 * the other made it, stops Redis on an assertion). */
static bool same_key(RedisModuleString *a, RedisModuleString *b)
{
    size_t al, bl;
    const char *ap = rm.StringPtrLen(a, &al), *bp = rm.StringPtrLen(b, &bl);
    return al == bl && memcmp(ap, bp, al) == 0;
}

static bool arg_empty(RedisModuleString *s)
{
    size_t n;
    rm.StringPtrLen(s, &n);
    return n == 0;
}

/* A few policies made from the commands' arguments, kept (the server runs
 * commands one at a time: no lock). */
#define CACHE 32
static struct {
    size_t count;
    rate_limit_t limits[RATE_MAX_LIMITS];
    rate_policy_t *policy;
} cache[CACHE];
static unsigned cache_next;

static const rate_policy_t *policy_of(const rate_limit_t *limits, size_t count,
                                      char *err, size_t errlen)
{
    for (unsigned i = 0; i < CACHE; i++)
        if (cache[i].policy != NULL && cache[i].count == count &&
            memcmp(cache[i].limits, limits, count * sizeof *limits) == 0)
            return cache[i].policy;
    rate_policy_t *p = NULL;
    if (rate_policy_new(limits, count, &p, err, errlen) != RATE_OK)
        return NULL;
    unsigned slot = cache_next++ % CACHE;
    rate_policy_free(cache[slot].policy);
    cache[slot].policy = p;
    cache[slot].count = count;
    memset(cache[slot].limits, 0, sizeof cache[slot].limits);
    memcpy(cache[slot].limits, limits, count * sizeof *limits);
    return p;
}

/* Room for a new state, grown as needed (one command at a time). */
static uint8_t *scratch;
static size_t scratch_cap;

static uint8_t *scratch_for(size_t n)
{
    if (n > scratch_cap) {
        size_t cap = n < 4096 ? 4096 : n;
        uint8_t *b = realloc(scratch, cap);
        if (b == NULL)
            return NULL;
        scratch = b, scratch_cap = cap;
    }
    return scratch;
}

/* What one run of the step over an open key did. */
typedef enum run_rc {
    RUN_DECIDED,  /* *d filled (written or not) */
    RUN_DECLINED, /* nothing written: the caller decides another way */
    RUN_WRONGTYPE,
    RUN_NOMEM,
} run_rc_t;

/* How long a written key is kept: ttl_ms 0 forever, -1 the step's ttl
 * (this decision's reset_after), else ttl_ms milliseconds. */
typedef struct expiry {
    long long ttl_ms;
} expiry_t;

static void write_back(RedisModuleCtx *ctx, RedisModuleKey *key,
                       RedisModuleString *name, bool fresh, uint64_t ver,
                       const uint8_t *buf, size_t len, uint64_t ttl_ns);

/* A key opened for a step, with its stored state as the scripts and the
 * client's load read it (one reading for every command). */
typedef struct stored {
    RedisModuleKey *key;
    RedisModuleString *v, *s; /* the hash's fields, or NULL */
    uint64_t ver;
    bool fresh;      /* no version, version 0 or no state: a new key */
    const char *old; /* the state's bytes (NULL when fresh) */
    size_t old_len;
} stored_t;

typedef enum stored_rc {
    STORED_READ,      /* *st filled */
    STORED_WRONGTYPE, /* the key is no hash */
    STORED_NOT_OURS   /* no version of ours (rate__version_parse), or a
                         state of no bytes: declined (the client's load
                         reports it) */
} stored_rc_t;

/* Opens the key and reads its state; stored_close() after, whatever it
 * returned. */
static stored_rc_t stored_open(RedisModuleCtx *ctx, RedisModuleString *name,
                               stored_t *st)
{
    memset(st, 0, sizeof *st);
    st->key = rm.OpenKey(ctx, name, RM_READ | RM_WRITE);
    int type = rm.KeyType(st->key);
    if (type != RM_KEYTYPE_EMPTY && type != RM_KEYTYPE_HASH)
        return STORED_WRONGTYPE;
    if (type == RM_KEYTYPE_HASH)
        rm.HashGet(st->key, RM_HASH_CFIELDS, "v", &st->v, "s", &st->s, NULL);
    if (st->v != NULL) {
        size_t n;
        const char *v = rm.StringPtrLen(st->v, &n);
        if (!rate__version_parse(v, n, &st->ver))
            return STORED_NOT_OURS;
    }
    st->fresh = st->v == NULL || st->ver == 0 || st->s == NULL;
    if (!st->fresh) {
        st->old = rm.StringPtrLen(st->s, &st->old_len);
        if (st->old_len == 0)
            return STORED_NOT_OURS;
    }
    return STORED_READ;
}

static void stored_close(RedisModuleCtx *ctx, stored_t *st)
{
    if (st->v != NULL)
        rm.FreeString(ctx, st->v);
    if (st->s != NULL)
        rm.FreeString(ctx, st->s);
    rm.CloseKey(st->key);
}

/* A look at a decision before its state is written (RATELIMIT.FAIR's
 * rule): false keeps the state as it was (*d may then be changed). */
typedef struct gate {
    bool (*fn)(void *ud, rate_decision_t *d);
    void *ud;
} gate_t;

/* Runs the step (arg filled but for the time) over the key's v/s hash and
 * writes, expires and replicates the new state when the step says so
 * (and the gate, if any, lets it).
 * cold_other: a state made under another policy is read as cold (the
 * step's own rule would need that policy's record) instead of declined. */
static run_rc_t run_step(RedisModuleCtx *ctx, RedisModuleString *name,
                         rate__step_arg_t *arg, expiry_t ex, bool cold_other,
                         const gate_t *gate)
{
    stored_t st;
    run_rc_t out = RUN_DECLINED;
    switch (stored_open(ctx, name, &st)) {
    case STORED_WRONGTYPE: out = RUN_WRONGTYPE; goto done;
    case STORED_NOT_OURS: goto done;
    case STORED_READ: break;
    }
    RedisModuleKey *key = st.key;
    const char *old = st.old;
    size_t old_len = st.old_len;
    uint8_t *buf = scratch_for(old_len + arg->policy->grow + 64);
    if (buf == NULL) {
        out = RUN_NOMEM;
        goto done;
    }
    rate_step_io_t io = {old, old_len, buf, scratch_cap, 0, false, 0};
    int rc = rate__step(arg, &io);
    if (rc == RATE__NEED_POLICY && cold_other) {
        io = (rate_step_io_t){NULL, 0, buf, scratch_cap, 0, false, 0};
        rc = rate__step(arg, &io);
    }
    if (rc != RATE_OK)
        goto done; /* another policy's state, a corrupt one: declined */
    out = RUN_DECIDED;
    if (gate != NULL && !gate->fn(gate->ud, arg->decision))
        goto done;
    if (!io.write)
        goto done;
    uint64_t ttl_ns = ex.ttl_ms == 0    ? RATE_TTL_FOREVER
                      : ex.ttl_ms < 0   ? io.ttl_ns
                                        : (uint64_t)ex.ttl_ms * 1000000;
    write_back(ctx, key, name, st.fresh, st.ver, buf, io.new_len, ttl_ns);
done:
    stored_close(ctx, &st);
    return out;
}

/* Writes a step's new state into the open key's v/s hash, with its
 * expiry, and replicates both as what was written. */
static void write_back(RedisModuleCtx *ctx, RedisModuleKey *key,
                       RedisModuleString *name, bool fresh, uint64_t ver,
                       const uint8_t *buf, size_t len, uint64_t ttl_ns)
{
    /* The version moves on with the state, as the scripts move it: a new
     * key's starts from the server's time in microseconds, and so does
     * one that cannot move on (2^63 - 1 or more, where Redis's HINCRBY
     * stops: a tampered key), keeping its state. */
    uint64_t now = server_now_ns();
    uint64_t nv = !fresh && ver < VERSION_TOP ? ver + 1 : now / 1000;
    char vb[24];
    int vl = snprintf(vb, sizeof vb, "%llu", (unsigned long long)nv);
    RedisModuleString *vs = rm.CreateString(ctx, vb, (size_t)vl);
    RedisModuleString *ss = rm.CreateString(ctx, (const char *)buf, len);
    rm.HashSet(key, RM_HASH_CFIELDS, "v", vs, "s", ss, NULL);
    rm.Replicate(ctx, "HSET", "scscs", name, "v", vs, "s", ss);
    rm.FreeString(ctx, vs);
    rm.FreeString(ctx, ss);
    if (ttl_ns == RATE_TTL_FOREVER || ttl_ns > RATE_TIME_MAX - now) {
        rm.SetExpire(key, RM_NO_EXPIRE);
        rm.Replicate(ctx, "PERSIST", "s", name);
    } else {
        /* Whole ms, rounded up, plus one: Redis counts from its own ms
         * clock, which never runs ahead of this one. */
        uint64_t end = now + ttl_ns;
        long long at = (long long)(end / 1000000 + (end % 1000000 != 0) + 1);
        rm.SetAbsExpire(key, at);
        rm.Replicate(ctx, "PEXPIREAT", "sl", name, at);
    }
}

static long long reply_ll(uint64_t x)
{
    return x == RATE_NEVER ? -1 : x > (uint64_t)INT64_MAX ? INT64_MAX
                                                         : (long long)x;
}

/* ------------------------------------------------------ RATELIMIT.STEP */

static int reply_tag(RedisModuleCtx *ctx, long long tag)
{
    rm.ReplyWithArray(ctx, 1);
    return rm.ReplyWithLongLong(ctx, tag);
}

/* The step's arguments after the key (step.lua's): the time, permits,
 * max_wait, the expiry, the policy's id, the format, then four words a
 * limit. */
typedef struct step_in {
    uint64_t now, permits, max_wait, id, format;
    long long ttl; /* -1, 0 or milliseconds */
    size_t count;
    rate_limit_t limits[RATE_MAX_LIMITS];
} step_in_t;

enum { STEP_PARSED, STEP_BAD, STEP_DECLINE };

/* Reads n arguments av (n - 7 a multiple of 4, checked by the caller):
 * STEP_PARSED, STEP_BAD with *err the error reply, or STEP_DECLINE for
 * what the step would not take as it stands (the scripts decline it: the
 * client decides through compare-and-set and reports what is wrong). */
static int step_parse(RedisModuleString **av, int n, step_in_t *in,
                      const char **err)
{
    uint64_t s, ns, ttl_abs;
    memset(in, 0, sizeof *in);
    if (arg_empty(av[0]) && arg_empty(av[1])) {
        in->now = server_now_ns();
    } else {
        if (!arg_u64(av[0], RATE_TIME_MAX / RATE_NS_PER_S, &s) ||
            !arg_u64(av[1], RATE_NS_PER_S - 1, &ns) ||
            s * RATE_NS_PER_S > RATE_TIME_MAX - ns)
            return *err = "ERR now_s now_ns: not a time", STEP_BAD;
        in->now = s * RATE_NS_PER_S + ns;
    }
    size_t tl;
    const char *tp = rm.StringPtrLen(av[4], &tl);
    if (tl == 2 && tp[0] == '-' && tp[1] == '1')
        in->ttl = -1;
    else if (arg_u64(av[4], (uint64_t)INT64_MAX / 1000000, &ttl_abs))
        in->ttl = (long long)ttl_abs;
    else
        return *err = "ERR ttl: not -1, 0 or milliseconds", STEP_BAD;
    if (!arg_u64(av[2], UINT64_MAX, &in->permits) ||
        !arg_u64(av[3], UINT64_MAX, &in->max_wait))
        return *err = "ERR permits max_wait: not numbers", STEP_BAD;
    if (!arg_u64(av[5], UINT32_MAX, &in->id) ||
        !arg_u64(av[6], 255, &in->format))
        return *err = "ERR policy_id format: not numbers", STEP_BAD;
    in->count = (size_t)(n - 7) / 4;
    for (size_t i = 0; i < in->count; i++) {
        uint64_t a;
        RedisModuleString **l = av + 7 + 4 * i;
        rate_limit_t *lim = &in->limits[i];
        if (!arg_u64(l[0], 255, &a) || !arg_u64(l[1], UINT64_MAX, &lim->limit) ||
            !arg_u64(l[2], UINT64_MAX, &lim->period_ns) ||
            !arg_u64(l[3], UINT64_MAX, &lim->burst))
            return *err = "ERR a limit: not numbers", STEP_BAD;
        lim->algorithm = (rate_algorithm_t)a;
    }
    if ((in->format != RATE__FORMAT && in->format != RATE__FORMAT_V1) ||
        in->permits > RATE_TIME_MAX || in->max_wait > RATE_TIME_MAX)
        return STEP_DECLINE;
    return STEP_PARSED;
}

/* The step of `in` over the key `name` into *d. */
static run_rc_t step_run(RedisModuleCtx *ctx, RedisModuleString *name,
                         const step_in_t *in, rate_decision_t *d)
{
    const rate_policy_t *p = policy_of(in->limits, in->count, NULL, 0);
    if (p == NULL)
        return RUN_DECLINED;
    memset(d, 0, sizeof *d);
    rate__step_arg_t arg = {p,       (uint32_t)in->id, (uint8_t)in->format,
                            NULL,    in->now,          in->permits,
                            in->max_wait, true,        RATE__OP_DECIDE,
                            d,       0,                0};
    return run_step(ctx, name, &arg, (expiry_t){in->ttl}, false, NULL);
}

/* A decision's reply, the first 9 of an array of `words`; the caller
 * adds the rest. */
static void reply_decision(RedisModuleCtx *ctx, const rate_decision_t *d,
                           long long words)
{
    rm.ReplyWithArray(ctx, words);
    rm.ReplyWithLongLong(ctx, 1);
    rm.ReplyWithLongLong(ctx, d->allowed);
    rm.ReplyWithLongLong(ctx, (long long)d->reason);
    rm.ReplyWithLongLong(ctx, d->component);
    rm.ReplyWithLongLong(ctx, reply_ll(d->limit));
    rm.ReplyWithLongLong(ctx, reply_ll(d->remaining));
    rm.ReplyWithLongLong(ctx, reply_ll(d->delay_ns));
    rm.ReplyWithLongLong(ctx, reply_ll(d->retry_after_ns));
    rm.ReplyWithLongLong(ctx, reply_ll(d->reset_after_ns));
}

/* step.lua's reply for a run of the step: {tag} or the decision. */
static int reply_step(RedisModuleCtx *ctx, run_rc_t rc,
                      const rate_decision_t *d)
{
    switch (rc) {
    case RUN_DECLINED: return reply_tag(ctx, 0);
    case RUN_WRONGTYPE: return reply_tag(ctx, 2);
    case RUN_NOMEM: return rm.ReplyWithError(ctx, "ERR out of memory");
    case RUN_DECIDED: break;
    }
    reply_decision(ctx, d, 9);
    return RM_OK;
}

static int cmd_step(RedisModuleCtx *ctx, RedisModuleString **argv, int argc)
{
    if (argc < 13 || (argc - 9) % 4 != 0 || (argc - 9) / 4 > RATE_MAX_LIMITS)
        return rm.WrongArity(ctx);
    step_in_t in;
    const char *err = NULL;
    switch (step_parse(argv + 2, argc - 2, &in, &err)) {
    case STEP_BAD: return rm.ReplyWithError(ctx, err);
    case STEP_DECLINE: return reply_tag(ctx, 0);
    default: break;
    }
    rate_decision_t d;
    return reply_step(ctx, step_run(ctx, argv[1], &in, &d), &d);
}

/* ----------------------------------------------------- RATELIMIT.LEASE */

/* An argument of exactly n little-endian bytes (a time, an id, a pid). */
static bool arg_le(RedisModuleString *s, size_t n, uint64_t *out)
{
    size_t len;
    const char *p = rm.StringPtrLen(s, &len);
    if (len != n)
        return false;
    *out = 0;
    for (size_t i = n; i-- > 0;)
        *out = *out << 8 | (uint8_t)p[i];
    return true;
}

/* The lease reply's five elements, after the array's header. */
static int reply_lease_body(RedisModuleCtx *ctx, long long code,
                            const rate__lease_step_t *a)
{
    char t[2][8];
    uint64_t v[2] = {code == 0 ? a->retry_at : 0, code == 0 ? a->latest : 0};
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < 8; i++)
            t[k][i] = (char)(uint8_t)(v[k] >> (8 * i));
    rm.ReplyWithLongLong(ctx, code);
    rm.ReplyWithLongLong(ctx, code == 0 && a->granted);
    rm.ReplyWithLongLong(ctx, code == 0 ? (long long)a->held : 0);
    rm.ReplyWithStringBuffer(ctx, t[0], 8);
    return rm.ReplyWithStringBuffer(ctx, t[1], 8);
}

static int reply_lease(RedisModuleCtx *ctx, long long code,
                       const rate__lease_step_t *a)
{
    rm.ReplyWithArray(ctx, 5);
    return reply_lease_body(ctx, code, a);
}

/* A lease command's arguments after the key: op now max reserve critical
 * id expires pid ttl, into a (and the expiry: the step's, or ttl_us). */
typedef struct lease_in {
    rate__lease_step_t a;
    bool ttl_step;   /* ttl -1: until the latest expiry */
    uint64_t ttl_us; /* else: microseconds, 0 none */
} lease_in_t;

static const char *lease_parse(RedisModuleString **av, lease_in_t *in)
{
    static const char ops[] = "arec";
    static const lease_op_t op_of[] = {LEASE_ACQUIRE, LEASE_RELEASE,
                                       LEASE_EXTEND, LEASE_COUNT};
    size_t ol, tl;
    const char *o = rm.StringPtrLen(av[0], &ol);
    const char *op = ol == 1 ? strchr(ops, o[0]) : NULL;
    uint64_t now, max, reserve, crit, id, expires, pid;
    const char *tp = rm.StringPtrLen(av[8], &tl);
    memset(in, 0, sizeof *in);
    in->ttl_step = tl == 2 && tp[0] == '-' && tp[1] == '1';
    if (op == NULL || o[0] == '\0')
        return "ERR lease: op is not a, r, e or c";
    if (!arg_le(av[1], 8, &now) || !arg_le(av[5], 8, &id) ||
        !arg_le(av[6], 8, &expires) || !arg_le(av[7], 4, &pid) ||
        !arg_u64(av[2], RATE_LEASE_MAX, &max) || max == 0 ||
        !arg_u64(av[3], max - 1, &reserve) || !arg_u64(av[4], 1, &crit) ||
        (!in->ttl_step && !arg_u64(av[8], UINT64_MAX, &in->ttl_us)))
        return "ERR lease: malformed arguments";
    in->a = (rate__lease_step_t){.op = op_of[op - ops], .now_ns = now,
                                 .max = max, .reserve = reserve,
                                 .cls = crit ? RATE_LEASE_CRITICAL
                                             : RATE_LEASE_NORMAL,
                                 .id = id, .expires_ns = expires,
                                 .pid = (uint32_t)pid};
    return NULL;
}

enum { LEASE_NOMEM = -1, LEASE_WRONGTYPE = -2 };

/* The lease step in->a (of the op `op`) over the key's v/s hash, written
 * back when it says so: the reply's code (0 done, 1 not held, 2 expired,
 * 3 not a lease state), LEASE_NOMEM or LEASE_WRONGTYPE. */
static long long lease_run(RedisModuleCtx *ctx, RedisModuleString *name,
                           lease_in_t *in, lease_op_t op)
{
    rate__lease_step_t *a = &in->a;
    stored_t st;
    uint64_t *heap = NULL;
    long long code = 3; /* not a lease state, as the script says */
    int r;

    a->op = op;
    a->scratch = NULL;
    a->scratch_cap = 0;
    a->granted = false;
    a->held = a->retry_at = a->latest = 0;
    switch (stored_open(ctx, name, &st)) {
    case STORED_WRONGTYPE: code = LEASE_WRONGTYPE; goto done;
    case STORED_NOT_OURS: goto done;
    case STORED_READ: break;
    }
    /* As the inflight object: a denial is told when its class gets a
     * slot back, which needs N expiries' room. */
    if (a->op == LEASE_ACQUIRE &&
        (heap = malloc(a->max * sizeof *heap)) != NULL) {
        a->scratch = heap;
        a->scratch_cap = (size_t)a->max;
    }
    uint8_t *buf = scratch_for(st.old_len + RATE__LEASE_ENTRY + 64);
    if (buf == NULL) {
        code = LEASE_NOMEM;
        goto done;
    }
    rate_step_io_t io = {st.old, st.old_len, buf, scratch_cap, 0, false, 0};
    r = rate__lease_step(a, &io);
    code = r == RATE_OK        ? 0
           : r == RATE_ELEASE  ? 1
           : r == RATE_EEXPIRED ? 2
                                : 3;
    if (r == RATE_OK && io.write)
        write_back(ctx, st.key, name, st.fresh, st.ver, buf, io.new_len,
                   in->ttl_step    ? io.ttl_ns
                   : in->ttl_us == 0 ? RATE_TTL_FOREVER
                   : in->ttl_us > RATE_TIME_MAX / 1000 ? RATE_TIME_MAX
                                                       : in->ttl_us * 1000);
done:
    free(heap);
    a->scratch = NULL;
    stored_close(ctx, &st);
    return code;
}

static int reply_lease_error(RedisModuleCtx *ctx, long long code)
{
    return code == LEASE_WRONGTYPE
               ? rm.ReplyWithError(ctx, "WRONGTYPE Operation against a key "
                                        "holding the wrong kind of value")
               : rm.ReplyWithError(ctx, "ERR out of memory");
}

/* RATELIMIT.LEASE key op now max reserve critical id expires pid ttl: the
 * lease step (src/lease/step.c) over the key's v/s hash, with the lease
 * script's arguments and reply (src/store/redis/lease.c). */
static int cmd_lease(RedisModuleCtx *ctx, RedisModuleString **argv, int argc)
{
    if (argc != 11)
        return rm.WrongArity(ctx);
    lease_in_t in;
    const char *err = lease_parse(argv + 2, &in);
    if (err != NULL)
        return rm.ReplyWithError(ctx, err);
    long long code = lease_run(ctx, argv[1], &in, in.a.op);
    if (code < 0)
        return reply_lease_error(ctx, code);
    return reply_lease(ctx, code, &in.a);
}

/* RATELIMIT.LEASESTEP lease_key rate_key op now max reserve critical id
 * expires pid ttl now_s now_ns permits max_wait ttl policy_id format
 * [algorithm L P B]...: an acquire with its rate limits, all or nothing,
 * as src/store/redis/lease_rate.lua makes it (the same steps, arguments,
 * reply and bytes): the leases counted; no room for the class: the
 * acquire, denied; else the rate step, and the acquire only if it
 * admits.  The reply: the lease's five, then the step's reply (0: not
 * asked). */
static int cmd_leasestep(RedisModuleCtx *ctx, RedisModuleString **argv,
                         int argc)
{
    if (argc < 23 || (argc - 19) % 4 != 0 ||
        (argc - 19) / 4 > RATE_MAX_LIMITS)
        return rm.WrongArity(ctx);
    if (same_key(argv[1], argv[2]))
        return rm.ReplyWithError(ctx, "ERR lease: lease_key and rate_key "
                                      "are the same key");
    lease_in_t in;
    step_in_t rs;
    const char *err = lease_parse(argv + 3, &in);
    if (err == NULL && in.a.op != LEASE_ACQUIRE)
        err = "ERR lease: an acquire with rate limits only";
    if (err != NULL)
        return rm.ReplyWithError(ctx, err);
    int parsed = step_parse(argv + 12, argc - 12, &rs, &err);
    if (parsed == STEP_BAD)
        return rm.ReplyWithError(ctx, err);
    long long code = lease_run(ctx, argv[1], &in, LEASE_COUNT);
    uint64_t limit = in.a.cls == RATE_LEASE_CRITICAL ? in.a.max
                                                     : in.a.max - in.a.reserve;
    if (code == 0 && in.a.held >= limit) /* no room: denied, when back */
        code = lease_run(ctx, argv[1], &in, LEASE_ACQUIRE);
    if (code < 0)
        return reply_lease_error(ctx, code);
    if (code != 0 || in.a.held >= limit) { /* the rate limits not asked */
        rm.ReplyWithArray(ctx, 6);
        reply_lease_body(ctx, code, &in.a);
        return rm.ReplyWithLongLong(ctx, 0);
    }
    rate_decision_t d;
    memset(&d, 0, sizeof d);
    run_rc_t rrc = parsed == STEP_DECLINE ? RUN_DECLINED
                                          : step_run(ctx, argv[2], &rs, &d);
    if (rrc == RUN_NOMEM)
        return rm.ReplyWithError(ctx, "ERR out of memory");
    if (rrc == RUN_DECIDED && d.allowed) {
        code = lease_run(ctx, argv[1], &in, LEASE_ACQUIRE);
        if (code < 0)
            return reply_lease_error(ctx, code);
    }
    rm.ReplyWithArray(ctx, 6);
    reply_lease_body(ctx, code, &in.a);
    return reply_step(ctx, rrc, &d);
}

/* ------------------------------------------------------ RATELIMIT.FAIR */

/* One fair decision's table, open while the step runs. */
typedef struct fair_run {
    RedisModuleCtx *ctx;
    RedisModuleString *name; /* the table's key */
    rate__fair_step_t a;
    uint64_t period_ns, limit;
    bool forever; /* the step's ttl 0: no expiry */
    bool corrupt, denied;
} fair_run_t;

/* Writes the table into its key's field t, kept three fair periods (at
 * least a second) of the server's clock, or for good with the shared
 * key (ttl 0), as the script keeps it. */
static void fair_write(fair_run_t *fr, RedisModuleKey *key, const uint8_t *t,
                       size_t len)
{
    RedisModuleString *ts = rm.CreateString(fr->ctx, (const char *)t, len);
    rm.HashSet(key, RM_HASH_CFIELDS, "t", ts, NULL);
    rm.Replicate(fr->ctx, "HSET", "scs", fr->name, "t", ts);
    rm.FreeString(fr->ctx, ts);
    if (fr->forever) { /* as the shared limit's key (the store's no_ttl) */
        rm.SetExpire(key, RM_NO_EXPIRE);
        rm.Replicate(fr->ctx, "PERSIST", "s", fr->name);
        return;
    }
    uint64_t ms = (3 * fr->a.period_us + 999) / 1000;
    ms = ms < 1000 ? 1000 : ms > (UINT64_C(1) << 40) ? UINT64_C(1) << 40 : ms;
    long long at = (long long)(server_now_ns() / 1000000 + ms);
    rm.SetAbsExpire(key, at);
    rm.Replicate(fr->ctx, "PEXPIREAT", "sl", fr->name, at);
}

/* The gate of RATELIMIT.FAIR: the fair rule (src/fair/step.c) over the
 * table, after the shared limit's verdict and before its write. */
static bool fair_gate(void *ud, rate_decision_t *d)
{
    fair_run_t *fr = ud;
    RedisModuleKey *key = rm.OpenKey(fr->ctx, fr->name, RM_READ | RM_WRITE);
    int type = rm.KeyType(key);
    RedisModuleString *ts = NULL;
    uint8_t *t = NULL;
    size_t len = rate__fair_table_len(fr->a.slots);
    if (type != RM_KEYTYPE_EMPTY && type != RM_KEYTYPE_HASH)
        goto corrupt;
    if (type == RM_KEYTYPE_HASH)
        rm.HashGet(key, RM_HASH_CFIELDS, "t", &ts, NULL);
    if (ts != NULL) {
        const char *old = rm.StringPtrLen(ts, &len);
        if ((t = malloc(len ? len : 1)) == NULL)
            goto corrupt;
        memcpy(t, old, len);
        if (!rate__fair_valid(t, len)) { /* the first format's, read anew */
            uint64_t slots = len >= 16 ? (uint64_t)t[8] | (uint64_t)t[9] << 8
                                       : 0;
            size_t nlen = slots ? rate__fair_table_len(slots) : 0;
            uint8_t *n = nlen ? malloc(nlen) : NULL;
            if (n == NULL || rate__fair_import(t, len, n, nlen) == 0) {
                free(n);
                goto corrupt;
            }
            free(t);
            t = n, len = nlen;
        }
    } else {
        if ((t = malloc(len)) == NULL)
            goto corrupt;
        rate__fair_init(t, fr->a.slots);
    }
    fr->a.cap = d->limit;
    rate__fair_enter(&fr->a, t);
    bool ok = d->allowed;
    if (ok && d->reason == RATE_REASON_ALLOWED) {
        uint64_t need = rate__fair_reserve(&fr->a, t);
        if (d->remaining < need) {
            d->retry_after_ns = rate__fair_retry_ns(need - d->remaining,
                                                    fr->period_ns, fr->limit);
            d->allowed = ok = false;
            d->reason = RATE_REASON_LIMITED;
            d->remaining += fr->a.permits;
            d->delay_ns = 0;
            fr->denied = true;
        }
    }
    if (ok && fr->a.permits > 0)
        rate__fair_charge(&fr->a, t);
    fair_write(fr, key, t, len);
    free(t);
    if (ts != NULL)
        rm.FreeString(fr->ctx, ts);
    rm.CloseKey(key);
    return ok;
corrupt:
    fr->corrupt = true;
    free(t);
    if (ts != NULL)
        rm.FreeString(fr->ctx, ts);
    rm.CloseKey(key);
    return false;
}

/* RATELIMIT.FAIR key table now_s now_ns permits max_wait ttl policy_id
 * format [algorithm L P B]... hash weight slots period_us period_ns limit:
 * the shared limit's step gated by the fair rule, with the fair script's
 * arguments and reply (src/store/redis/fair.lua, src/store/redis/fair.c). */
static int cmd_fair(RedisModuleCtx *ctx, RedisModuleString **argv, int argc)
{
    if (argc < 20 || (argc - 16) % 4 != 0 || (argc - 16) / 4 > RATE_MAX_LIMITS)
        return rm.WrongArity(ctx);
    if (same_key(argv[1], argv[2]))
        return rm.ReplyWithError(ctx, "ERR fair: key and table are the same "
                                      "key");
    step_in_t sa;
    const char *err = NULL;
    switch (step_parse(argv + 3, argc - 9, &sa, &err)) {
    case STEP_BAD: return rm.ReplyWithError(ctx, err);
    case STEP_DECLINE: return reply_tag(ctx, 0);
    default: break;
    }
    RedisModuleString **f = argv + argc - 6;
    fair_run_t fr = {.ctx = ctx, .name = argv[2]};
    if (!arg_le(f[0], 8, &fr.a.hash) || fr.a.hash == 0 ||
        !arg_u64(f[1], RATE__FAIR_WEIGHT_MAX, &fr.a.weight) ||
        fr.a.weight == 0 ||
        !arg_u64(f[2], RATE__FAIR_SLOTS_MAX, &fr.a.slots) || fr.a.slots == 0 ||
        !arg_u64(f[3], (UINT64_C(1) << 53) - 1, &fr.a.period_us) ||
        fr.a.period_us == 0 || !arg_u64(f[4], UINT64_MAX, &fr.period_ns) ||
        !arg_u64(f[5], UINT64_MAX, &fr.limit))
        return rm.ReplyWithError(ctx, "ERR fair: malformed arguments");
    const rate_policy_t *p = policy_of(sa.limits, sa.count, NULL, 0);
    /* Past Lua's exact integers the script declines: so does this. */
    if (p == NULL || sa.now / 1000 >= (UINT64_C(1) << 53) ||
        sa.permits >= RATE__FAIR_ASKED_MAX || fr.limit >= RATE__FAIR_ASKED_MAX)
        return reply_tag(ctx, 0);
    for (size_t i = 0; i < sa.count; i++)
        if (sa.limits[i].limit >= RATE__FAIR_ASKED_MAX)
            return reply_tag(ctx, 0);
    /* The rule's view of the shared limit: its first limit's algorithm,
     * the limit and the fair period given (rule.h). */
    fr.a.shape = rate__fair_shape_of((int)sa.limits[0].algorithm, fr.limit,
                                     fr.period_ns);
    fr.a.shape.period_us = fr.a.period_us;
    fr.a.now_us = sa.now / 1000;
    fr.forever = sa.ttl == 0;
    fr.a.permits = sa.permits;
    rate_decision_t d;
    memset(&d, 0, sizeof d);
    rate__step_arg_t arg = {p,           (uint32_t)sa.id, (uint8_t)sa.format,
                            NULL,        sa.now,          sa.permits,
                            sa.max_wait, true,            RATE__OP_DECIDE,
                            &d,          0,               0};
    gate_t gate = {fair_gate, &fr};
    switch (run_step(ctx, argv[1], &arg, (expiry_t){sa.ttl}, false, &gate)) {
    case RUN_DECLINED: return reply_tag(ctx, 0);
    case RUN_WRONGTYPE: return reply_tag(ctx, 2);
    case RUN_NOMEM: return rm.ReplyWithError(ctx, "ERR out of memory");
    case RUN_DECIDED: break;
    }
    if (fr.corrupt)
        return reply_tag(ctx, 3);
    reply_decision(ctx, &d, 11);
    rm.ReplyWithLongLong(ctx, fr.denied);
    return rm.ReplyWithLongLong(ctx, fr.a.shared);
}

/* --------------------------------------------------------- CL.THROTTLE */

/* Whole seconds, rounded up. */
static long long ceil_s(uint64_t ns)
{
    return (long long)(ns / RATE_NS_PER_S + (ns % RATE_NS_PER_S != 0));
}

static int cmd_throttle(RedisModuleCtx *ctx, RedisModuleString **argv,
                        int argc)
{
    if (argc != 5 && argc != 6)
        return rm.WrongArity(ctx);
    uint64_t burst, count, period, quantity = 1;
    if (!arg_u64(argv[2], (uint64_t)INT64_MAX - 1, &burst))
        return rm.ReplyWithError(ctx, "ERR max_burst: not a whole number");
    if (!arg_u64(argv[3], (uint64_t)INT64_MAX, &count) || count == 0)
        return rm.ReplyWithError(ctx,
                                 "ERR count_per_period: not a whole number "
                                 "from 1");
    if (!arg_u64(argv[4], RATE_TIME_MAX / RATE_NS_PER_S, &period) ||
        period == 0)
        return rm.ReplyWithError(ctx,
                                 "ERR period: not a whole number of seconds "
                                 "from 1");
    if (argc == 6 && !arg_u64(argv[5], RATE_TIME_MAX, &quantity))
        return rm.ReplyWithError(ctx, "ERR quantity: not a whole number");
    /* redis-cell's GCRA: max_burst + 1 at once, count_per_period per
     * period: our token bucket of that burst and rate. */
    rate_limit_t l = {.algorithm = RATE_TOKEN_BUCKET,
                      .limit = count,
                      .period_ns = period * RATE_NS_PER_S,
                      .burst = burst + 1};
    char err[160], msg[200];
    const rate_policy_t *p = policy_of(&l, 1, err, sizeof err);
    if (p == NULL) {
        snprintf(msg, sizeof msg, "ERR %s", err);
        return rm.ReplyWithError(ctx, msg);
    }
    rate_decision_t d;
    memset(&d, 0, sizeof d);
    /* The first edition's format: tagged by the policy's fingerprint,
     * which needs no record; a key made under other arguments starts
     * cold. */
    rate__step_arg_t arg = {p,
                            rate_policy_fingerprint(p),
                            RATE__FORMAT_V1,
                            NULL,
                            server_now_ns(),
                            quantity,
                            0,
                            true,
                            RATE__OP_DECIDE,
                            &d,
                            0,
                            0};
    switch (run_step(ctx, argv[1], &arg, (expiry_t){-1}, true, NULL)) {
    case RUN_WRONGTYPE:
        return rm.ReplyWithError(ctx, "WRONGTYPE Operation against a key "
                                      "holding the wrong kind of value");
    case RUN_NOMEM: return rm.ReplyWithError(ctx, "ERR out of memory");
    case RUN_DECLINED:
        return rm.ReplyWithError(ctx, "ERR the key's state does not parse");
    case RUN_DECIDED: break;
    }
    rm.ReplyWithArray(ctx, 5);
    rm.ReplyWithLongLong(ctx, !d.allowed);
    rm.ReplyWithLongLong(ctx, (long long)(burst + 1));
    rm.ReplyWithLongLong(ctx, reply_ll(d.remaining));
    rm.ReplyWithLongLong(ctx, d.allowed || d.retry_after_ns == RATE_NEVER
                                  ? -1
                                  : ceil_s(d.retry_after_ns));
    return rm.ReplyWithLongLong(ctx, ceil_s(d.reset_after_ns));
}

/* ------------------------------------------------------------- loading */

__attribute__((visibility("default"))) int
RedisModule_OnUnload(RedisModuleCtx *ctx);

/* MODULE UNLOAD: the policies and the scratch room go. */
int RedisModule_OnUnload(RedisModuleCtx *ctx)
{
    (void)ctx;
    for (unsigned i = 0; i < CACHE; i++) {
        rate_policy_free(cache[i].policy);
        cache[i].policy = NULL;
    }
    free(scratch);
    scratch = NULL;
    scratch_cap = 0;
    return RM_OK;
}

__attribute__((visibility("default"))) int
RedisModule_OnLoad(RedisModuleCtx *ctx, RedisModuleString **argv, int argc);

int RedisModule_OnLoad(RedisModuleCtx *ctx, RedisModuleString **argv, int argc)
{
    (void)argv;
    (void)argc;
    if (rm_init(ctx, MODULE_NAME, MODULE_VERSION) != RM_OK)
        return RM_ERR;
    /* Each writes one key, the first argument: a cluster routes them by
     * it (the store's keys carry their hash tag).  RATELIMIT.STEP is not
     * "fast": a full sliding log of 10,000 entries takes milliseconds;
     * CL.THROTTLE is one token bucket, constant time. */
    if (rm.CreateCommand(ctx, "ratelimit.step", cmd_step, "write deny-oom",
                         1, 1, 1) != RM_OK ||
        rm.CreateCommand(ctx, "cl.throttle", cmd_throttle,
                         "write deny-oom fast", 1, 1, 1) != RM_OK ||
        rm.CreateCommand(ctx, "ratelimit.lease", cmd_lease, "write deny-oom",
                         1, 1, 1) != RM_OK ||
        /* two keys, the leases' and the rate state's (one hash tag) */
        rm.CreateCommand(ctx, "ratelimit.leasestep", cmd_leasestep,
                         "write deny-oom", 1, 2, 1) != RM_OK ||
        /* two keys, the shared limit's and its fair table (one hash tag) */
        rm.CreateCommand(ctx, "ratelimit.fair", cmd_fair, "write deny-oom",
                         1, 2, 1) != RM_OK)
        return RM_ERR;
    return RM_OK;
}
