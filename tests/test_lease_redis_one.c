/* SPDX-License-Identifier: MIT */
/*
 * Leases on Redis in one round trip (docs/leases.md, "Leases on Redis"):
 * the store contract's lease() by RATELIMIT.LEASE (ratelimit.so loaded)
 * and by the lease script, against the general path (HMGET + the
 * compare-and-set script) and the memory store.  Round trips are counted
 * on the server with MONITOR (the client's commands, not a script's);
 * random sequences of acquire, release, extend, counts and expiry on a
 * virtual clock give the same answers on all four and, on the three
 * Redis paths, the same stored bytes (ids mapped to the order they were
 * granted in: each object draws its own).  Bad states are refused by
 * both one-round-trip paths and never written over.
 */
#include <stdbool.h>

#include <hiredis/hiredis.h>

#include "lib/helpers.h"
#include "lib/redis_cluster.h"
#include "lib/rng.h"

#include <ratelimit_lease.h>
#include <ratelimit_redis.h>

#ifndef RATE_MODULE_PATH
#error "RATE_MODULE_PATH: the path of ratelimit.so"
#endif

static const char *const with_module[] = {"--loadmodule", RATE_MODULE_PATH,
                                         NULL};
REDIS_GROUP_SERVER(with_module)
/* The store's URL and, on a cluster, the cluster (keys read on their
 * slot's master). */
static const char *cur_url = url;
static rcluster_t *cur_cl;

enum { MEM, GENERIC, SCRIPT, MODULE, PATHS };
static const char *const path_name[PATHS] = {"memory", "generic", "script",
                                             "module"};
static const char *const path_prefix[PATHS] = {NULL, "lg:", "ls:", "lm:"};

static redisContext *raw(void)
{
    struct timeval tv = {5, 0};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", port, tv);
    if (c == NULL || c->err)
        fail_msg("cannot connect to port %d", port);
    return c;
}

/* The store of one path (NULL for memory: the object's own). */
static rate_store_t *store_of(int path, bool no_ttl)
{
    if (path == MEM)
        return NULL;
    /* One connection: the warm-up call makes it, no later call does. */
    /* A generous command timeout: nothing here measures one, and a
     * loaded machine (a sanitizer build among other runs) may take more
     * than the default 1 s to answer now and then. */
    rate_redis_options_t o = {.prefix = path_prefix[path], .no_ttl = no_ttl,
                              .pool_size = 1,
                              .command_timeout_ns = 30 * UINT64_C(1000000000)};
    o.module = path == MODULE ? RATE_REDIS_MODULE_ON : RATE_REDIS_MODULE_OFF;
    o.generic_leases = path == GENERIC;
    rate_store_t *s = NULL;
    char err[256] = "";
    if (rate_store_redis_new(cur_url, &o, &s, err, sizeof err) != RATE_OK)
        fail_msg("redis store: %s", err);
    return s;
}

static rate_inflight_t *inflight_of(const char *text, rate_store_t *s)
{
    rate_inflight_policy_t *p = NULL;
    char err[256] = "";
    if (rate_inflight_policy_parse(text, &p, err, sizeof err) != RATE_OK)
        fail_msg("policy '%s': %s", text, err);
    rate_inflight_config_t cfg = {.policy = p, .store = s};
    rate_inflight_t *in = NULL;
    assert_int_equal(rate_inflight_new(&cfg, &in), RATE_OK);
    rate_inflight_policy_free(p);
    return in;
}

/* A connection to the server that holds a key's name: the one server, or
 * its slot's master in a cluster. */
static redisContext *raw_for(const char *name, size_t len)
{
    if (cur_cl == NULL)
        return raw();
    redisContext *c = rcl_connect(cur_cl->port[0]);
    assert_non_null(c);
    redisReply *r = redisCommand(c, "CLUSTER KEYSLOT %b", name, len);
    assert_int_equal(r->type, REDIS_REPLY_INTEGER);
    int m = rcl_master_of(cur_cl, (unsigned)r->integer);
    freeReplyObject(r);
    redisFree(c);
    assert_true(m >= 0);
    struct timeval tv = {5, 0};
    c = redisConnectWithTimeout("127.0.0.1", cur_cl->port[m], tv);
    assert_true(c != NULL && c->err == 0);
    return c;
}

/* The Redis name of a key of a path: the prefix, the mark ("" a rate
 * state, "l" its leases), then the key's own tag (a '}' escaped as "%7d",
 * the name then marked 'e' first). */
static size_t tagged_name(int path, const char *mark, const char *key,
                          char *out, size_t cap)
{
    bool esc = strchr(key, '}') != NULL;
    size_t n = (size_t)snprintf(out, cap, "%s%s%s{", path_prefix[path],
                                esc ? "e" : "", mark);
    for (const char *q = key; *q; q++)
        n += (size_t)snprintf(out + n, cap - n, *q == '}' ? "%%7d" : "%c",
                              *q);
    return n + (size_t)snprintf(out + n, cap - n, "}");
}

/* The Redis name of a key's leases: under the key's own tag. */
static size_t lease_name(int path, const char *key, char *out, size_t cap)
{
    return tagged_name(path, "l", key, out, cap);
}

/* ------------------------------------------------------------ MONITOR */

/* The commands clients send (a script's own commands, "[0 lua]", left
 * out) between two markers, on a MONITOR connection. */
static void mark(redisContext *c, const char *what)
{
    redisReply *r = redisCommand(c, "ECHO %s", what);
    assert_non_null(r);
    freeReplyObject(r);
}

/* Reads the monitor up to the marker `until`, counting the client
 * commands seen after the marker `from` (the first word of the last one
 * into last). */
static int monitor_count(redisContext *m, const char *from,
                         const char *until, char *last, size_t cap)
{
    bool counting = false;
    int n = 0;
    for (;;) {
        redisReply *r = NULL;
        assert_int_equal(redisGetReply(m, (void **)&r), REDIS_OK);
        assert_true(r->type == REDIS_REPLY_STATUS);
        bool is_from = strstr(r->str, from) != NULL && strstr(r->str, "\"ECHO\"");
        bool is_until = strstr(r->str, until) != NULL && strstr(r->str, "\"ECHO\"");
        if (is_until) {
            freeReplyObject(r);
            return n;
        }
        if (counting && strstr(r->str, "[0 lua]") == NULL) {
            n++;
            const char *q = strchr(r->str, '"');
            snprintf(last, cap, "%s", q != NULL ? q : r->str);
        }
        counting |= is_from;
        freeReplyObject(r);
    }
}

/* ------------------------------------------------------- round trips */

typedef enum { OP_ACQUIRE, OP_EXTEND, OP_RELEASE, OP_HELD, OPS } op_t;
static const char *const op_name[OPS] = {"acquire", "extend", "release",
                                         "held"};

/* The client commands of each operation on one path, after a warm-up
 * (the connection's handshake and the module probe come once). */
static void count_path(int path, int counts[OPS], char first[OPS][64])
{
    char name[64];
    size_t nl = lease_name(path, "rt", name, sizeof name);
    redisContext *c = raw_for(name, nl), *mon = raw_for(name, nl);
    redisReply *mr = redisCommand(mon, "MONITOR");
    assert_non_null(mr);
    freeReplyObject(mr);
    rate_store_t *s = store_of(path, false);
    rate_inflight_t *in = inflight_of("concurrency 2 ttl=1h", s);
    uint64_t held = 0;
    rate_lease_t l;
    rate_decision_t d;
    assert_int_equal(rate_inflight_held(in, "rt", 2, &held), RATE_OK);
    for (int op = 0; op < OPS; op++) {
        char from[32], until[32];
        snprintf(from, sizeof from, "m-%d-%d-a", path, op);
        snprintf(until, sizeof until, "m-%d-%d-b", path, op);
        mark(c, from);
        switch ((op_t)op) {
        case OP_ACQUIRE:
            assert_int_equal(rate_inflight_acquire(in, "rt", 2,
                                                   RATE_LEASE_NORMAL, &l, &d),
                             RATE_OK);
            assert_true(d.allowed);
            break;
        case OP_EXTEND:
            assert_int_equal(rate_inflight_extend(in, "rt", 2, &l, 0),
                             RATE_OK);
            break;
        case OP_RELEASE:
            assert_int_equal(rate_inflight_release(in, "rt", 2, &l), RATE_OK);
            break;
        case OP_HELD:
            assert_int_equal(rate_inflight_held(in, "rt", 2, &held), RATE_OK);
            assert_int_equal(held, 0);
            break;
        case OPS: break;
        }
        mark(c, until);
        counts[op] = monitor_count(mon, from, until, first[op], 64);
    }
    /* The store's own counts: the warm-up and the four operations. */
    rate_redis_status_t st;
    assert_int_equal(rate_store_redis_status(s, &st), RATE_OK);
    assert_int_equal(st.module_leases, path == MODULE ? 5 : 0);
    assert_int_equal(st.script_leases, path == SCRIPT ? 5 : 0);
    rate_inflight_free(in);
    rate_store_redis_drop(s);
    rate_store_free(s);
    redisFree(mon);
    redisFree(c);
}

/* One kind of operation's round trips: each operation's client commands
 * on the three paths, counted by `count`; exactly one command (the script
 * by FCALL, the module's command) on the script and module paths, and
 * `generic` on the general one. */
typedef struct trips {
    void (*count)(int path, int *counts, char (*first)[64]);
    int ops;
    const char *const *name;
    const int *generic;
    const char *const *module_cmd; /* quoted, as MONITOR prints it */
} trips_t;

#define TRIPS_MAX 4

static void check_trips(const trips_t *t)
{
    int counts[PATHS][TRIPS_MAX];
    char first[PATHS][TRIPS_MAX][64];
    assert_true(t->ops <= TRIPS_MAX);
    for (int path = GENERIC; path < PATHS; path++)
        t->count(path, counts[path], first[path]);
    for (int op = 0; op < t->ops; op++) {
        print_message("%-13s generic %d  script %d  module %d  "
                      "(client commands)\n",
                      t->name[op], counts[GENERIC][op], counts[SCRIPT][op],
                      counts[MODULE][op]);
        assert_int_equal(counts[SCRIPT][op], 1);
        assert_int_equal(counts[MODULE][op], 1);
        /* the lease scripts by FCALL (the server has Functions) */
        assert_non_null(strstr(first[SCRIPT][op], "\"FCALL\""));
        assert_non_null(strstr(first[MODULE][op], t->module_cmd[op]));
        assert_int_equal(counts[GENERIC][op], t->generic[op]);
    }
}

/* The general path: a load, then a compare-and-set for a change. */
static const int lease_generic[OPS] = {2, 2, 2, 1};
static const char *const lease_module[OPS] = {
    "\"RATELIMIT.LEASE\"", "\"RATELIMIT.LEASE\"", "\"RATELIMIT.LEASE\"",
    "\"RATELIMIT.LEASE\""};

static void check_round_trips(void)
{
    check_trips(&(trips_t){count_path, OPS, op_name, lease_generic,
                           lease_module});
}

static void test_round_trips(void **state)
{
    (void)state;
    check_round_trips();
}

/* ------------------------------------ acquires with rate limits */

typedef enum { RR_ADMIT, RR_LEASE_DENY, RR_RATE_DENY, RR_RELEASE, RRS } rr_t;
static const char *const rr_name[RRS] = {"admitted", "lease denial",
                                         "rate denial", "release"};

/* The client commands of an acquire admitted, denied by the in-flight
 * limit, denied by the rate limit, and of a release, under "concurrency
 * 2 ttl=1h; fixed-window 2/h", after a warm-up (the connection, the
 * module probe and the policy's record come once). */
static void count_rate_path(int path, int counts[RRS], char first[RRS][64])
{
    char name[64];
    size_t nl = lease_name(path, "rr", name, sizeof name);
    redisContext *c = raw_for(name, nl), *mon = raw_for(name, nl);
    freeReplyObject(redisCommand(mon, "MONITOR"));
    rate_store_t *s = store_of(path, false);
    rate_inflight_t *in = inflight_of("concurrency 2 ttl=1h; fixed-window 2/h",
                                      s);
    rate_lease_t w, a, b, l;
    rate_decision_t d;
    assert_int_equal(rate_inflight_acquire(in, "warm", 4, RATE_LEASE_NORMAL,
                                           &w, &d), RATE_OK);
    assert_true(d.allowed);
    assert_int_equal(rate_inflight_release(in, "warm", 4, &w), RATE_OK);
    assert_int_equal(rate_inflight_acquire(in, "rr", 2, RATE_LEASE_NORMAL,
                                           &b, &d), RATE_OK);
    assert_true(d.allowed);
    for (int op = 0; op < RRS; op++) {
        char from[32], until[32];
        snprintf(from, sizeof from, "r-%d-%d-a", path, op);
        snprintf(until, sizeof until, "r-%d-%d-b", path, op);
        mark(c, from);
        switch ((rr_t)op) {
        case RR_ADMIT: /* the second lease, the second permit */
            assert_int_equal(rate_inflight_acquire(in, "rr", 2,
                                                   RATE_LEASE_NORMAL, &a, &d),
                             RATE_OK);
            assert_true(d.allowed);
            break;
        case RR_LEASE_DENY: /* two held */
            assert_int_equal(rate_inflight_acquire(in, "rr", 2,
                                                   RATE_LEASE_NORMAL, &l, &d),
                             RATE_OK);
            assert_false(d.allowed);
            assert_int_equal(d.component, 0);
            break;
        case RR_RELEASE:
            assert_int_equal(rate_inflight_release(in, "rr", 2, &a), RATE_OK);
            break;
        case RR_RATE_DENY: /* room for a lease, no permit left */
            assert_int_equal(rate_inflight_release(in, "rr", 2, &b), RATE_OK);
            mark(c, "r-skip");
            assert_int_equal(rate_inflight_acquire(in, "rr", 2,
                                                   RATE_LEASE_NORMAL, &l, &d),
                             RATE_OK);
            assert_false(d.allowed);
            assert_int_equal(d.component, 1);
            assert_int_equal(l.id, 0);
            break;
        case RRS: break;
        }
        mark(c, until);
        counts[op] = monitor_count(mon, op == RR_RATE_DENY ? "r-skip" : from,
                                   until, first[op], 64);
    }
    /* The rate denial left no lease: the one held is gone too. */
    uint64_t held = 9;
    assert_int_equal(rate_inflight_held(in, "rr", 2, &held), RATE_OK);
    assert_int_equal(held, 0);
    /* The store's counts: warm-up 2, b, a, 2 denials, 2 releases, held */
    rate_redis_status_t st;
    assert_int_equal(rate_store_redis_status(s, &st), RATE_OK);
    assert_int_equal(st.module_leases, path == MODULE ? 9 : 0);
    assert_int_equal(st.script_leases, path == SCRIPT ? 9 : 0);
    /* ... and no decision of the rate limits on its own */
    assert_int_equal(st.module_decisions + st.lean_decisions +
                         st.general_decisions,
                     path == GENERIC ? 4 : 0);
    rate_inflight_free(in);
    rate_store_redis_drop(s);
    rate_store_free(s);
    redisFree(mon);
    redisFree(c);
}

/* The general path: the lease's load and compare-and-set, the rate
 * decision, and for a rate denial the lease given back. */
static const int rate_generic[RRS] = {3, 1, 5, 2};
static const char *const rate_module[RRS] = {
    "\"RATELIMIT.LEASESTEP\"", "\"RATELIMIT.LEASESTEP\"",
    "\"RATELIMIT.LEASESTEP\"", "\"RATELIMIT.LEASE\""};

static void check_rate_round_trips(void)
{
    check_trips(&(trips_t){count_rate_path, RRS, rr_name, rate_generic,
                           rate_module});
}

/* One command per acquire with rate limits, admitted or denied by either
 * limit (store contract version 6: lease() with the rate limits). */
static void test_rate_round_trips(void **state)
{
    (void)state;
    check_rate_round_trips();
}

/* All or nothing on every path: a denial by the in-flight limit charges
 * no permit, a denial by a rate limit holds no lease. */
static void test_all_or_nothing(void **state)
{
    (void)state;
    for (int path = MEM; path < PATHS; path++) {
        rate_store_t *s = store_of(path, false);
        rate_inflight_t *in =
            inflight_of("concurrency 1 ttl=1h; fixed-window 3/h", s);
        rate_lease_t a, l;
        rate_decision_t d;
        uint64_t held = 9;
        assert_int_equal(rate_inflight_acquire(in, "an", 2, RATE_LEASE_NORMAL,
                                               &a, &d), RATE_OK);
        assert_true(d.allowed);
        for (int i = 0; i < 5; i++) { /* denied by the lease: no permit */
            assert_int_equal(rate_inflight_acquire(in, "an", 2,
                                                   RATE_LEASE_NORMAL, &l, &d),
                             RATE_OK);
            assert_false(d.allowed);
            assert_int_equal(d.component, 0);
        }
        for (int i = 0; i < 2; i++) { /* so two permits are left */
            assert_int_equal(rate_inflight_release(in, "an", 2, &a), RATE_OK);
            assert_int_equal(rate_inflight_acquire(in, "an", 2,
                                                   RATE_LEASE_NORMAL, &a, &d),
                             RATE_OK);
            assert_true(d.allowed);
        }
        assert_int_equal(rate_inflight_release(in, "an", 2, &a), RATE_OK);
        assert_int_equal(rate_inflight_acquire(in, "an", 2, RATE_LEASE_NORMAL,
                                               &l, &d), RATE_OK);
        assert_false(d.allowed); /* by the rate limit: no lease held */
        assert_int_equal(d.component, 1);
        assert_int_equal(d.remaining, 0);
        assert_int_equal(rate_inflight_held(in, "an", 2, &held), RATE_OK);
        assert_int_equal(held, 0);
        rate_inflight_free(in);
        if (s != NULL) {
            rate_store_redis_drop(s);
            rate_store_free(s);
        }
    }
}

/* The key's expiry by both one-round-trip paths: the lease's TTL by
 * Redis's clock (rounded up to ms, plus one), as the general path's. */
static void test_expiry(void **state)
{
    (void)state;
    redisContext *c = raw();
    for (int path = GENERIC; path < PATHS; path++) {
        rate_store_t *s = store_of(path, false);
        rate_inflight_t *in = inflight_of("concurrency 2 ttl=1h", s);
        rate_lease_t l;
        rate_decision_t d;
        assert_int_equal(rate_inflight_acquire(in, "ex", 2, RATE_LEASE_NORMAL,
                                               &l, &d),
                         RATE_OK);
        /* the key's name: prefix, "l{", "ex", '}' */
        char full[64];
        size_t n = lease_name(path, "ex", full, sizeof full);
        redisReply *r = redisCommand(c, "PTTL %b", full, n);
        assert_int_equal(r->type, REDIS_REPLY_INTEGER);
        print_message("%s: PTTL %lld ms\n", path_name[path], r->integer);
        assert_true(r->integer > 3590000 && r->integer <= 3600003);
        freeReplyObject(r);
        /* Released: a bare header, kept at most a few ms. */
        assert_int_equal(rate_inflight_release(in, "ex", 2, &l), RATE_OK);
        r = redisCommand(c, "PTTL %b", full, n);
        assert_int_equal(r->type, REDIS_REPLY_INTEGER);
        assert_true(r->integer <= 3);
        freeReplyObject(r);
        rate_inflight_free(in);
        rate_store_redis_drop(s);
        rate_store_free(s);
    }
    redisFree(c);
}

/* ------------------------------------------------------ differential */

#define KEYS 6
#define STEPS 3000
#define MAXH 64 /* handles kept per path */

typedef struct path_run {
    rate_store_t *store;
    rate_inflight_t *in;
    rate_lease_t held[MAXH]; /* granted handles, live or not */
    int keyof[MAXH];
    size_t n;
    uint64_t order[4 * STEPS]; /* the ids granted, in order */
    size_t granted;
} path_run_t;

/* The key's stored bytes with each id replaced by the order it was
 * granted in (1-based; 0 for an id this object never granted). */
static size_t stored(const path_run_t *p, int path, const char *key,
                     uint8_t *out, size_t cap)
{
    char full[64];
    size_t n = lease_name(path, key, full, sizeof full);
    redisContext *c = raw_for(full, n);
    redisReply *r = redisCommand(c, "HGET %b s", full, n);
    redisFree(c);
    assert_non_null(r);
    size_t len = 0;
    if (r->type == REDIS_REPLY_STRING) {
        assert_true(r->len <= cap);
        len = r->len;
        memcpy(out, r->str, len);
    }
    freeReplyObject(r);
    for (size_t e = 14; e + 24 <= len; e += 24) {
        uint64_t id = 0, ord = 0;
        for (int i = 7; i >= 0; i--)
            id = id << 8 | out[e + (size_t)i];
        for (size_t i = 0; i < p->granted; i++)
            if (p->order[i] == id)
                ord = i + 1;
        for (int i = 0; i < 8; i++)
            out[e + (size_t)i] = (uint8_t)(ord >> (8 * i));
    }
    return len;
}

/* The differential's key number k: one of them holds a '}' (its Redis
 * names escaped). */
static void key_text(char *out, size_t cap, int k)
{
    snprintf(out, cap, k == KEYS - 1 ? "k}%d" : "k%d", k);
}

/* Whether a lease state is a bare header: no lease, no latest expiry. */
static bool bare(const uint8_t *b, size_t len)
{
    static const uint8_t zero[13];
    return len == 14 && memcmp(b, zero, 13) == 0 && b[13] == 'L';
}

/* The key's rate state's bytes (as its limiter names it). */
static size_t rate_stored(int path, const char *key, uint8_t *out, size_t cap)
{
    char full[64];
    size_t n = tagged_name(path, "", key, full, sizeof full);
    redisContext *c = raw_for(full, n);
    redisReply *r = redisCommand(c, "HGET %b s", full, n);
    redisFree(c);
    assert_non_null(r);
    size_t len = 0;
    if (r->type == REDIS_REPLY_STRING) {
        assert_true(r->len <= cap);
        len = r->len;
        memcpy(out, r->str, len);
    }
    freeReplyObject(r);
    return len;
}

static void run_differential(const char *policy, uint64_t seed, bool deep,
                             int steps)
{
    static path_run_t p[PATHS];
    const uint64_t t0 = UINT64_C(1) << 40, ttl = 100 * UINT64_C(1000000);
    uint64_t now = t0;
    memset(p, 0, sizeof p);
    for (int k = 0; k < PATHS; k++) {
        /* no_ttl: the keys must not expire by Redis's clock under the
         * virtual one (the expiry itself: test_expiry). */
        p[k].store = store_of(k, true);
        p[k].in = inflight_of(policy, p[k].store);
    }
    rnd_seed(seed);
    int ops[7] = {0};
    for (int step = 0; step < steps; step++) {
        now += rnd(16) == 0 ? rnd(2 * ttl) : rnd(ttl / 64);
        int op = (int)rnd(10), key = (int)rnd(KEYS);
        char kb[8];
        key_text(kb, sizeof kb, key);
        size_t h = p[0].n > 0 ? (size_t)rnd(p[0].n) : 0;
        int rc[PATHS];
        rate_decision_t d[PATHS];
        uint64_t held[PATHS];
        if (op < 4 || p[0].n == 0) { /* acquire */
            ops[0]++;
            rate_lease_class_t cls = rnd(4) == 0 ? RATE_LEASE_CRITICAL
                                                 : RATE_LEASE_NORMAL;
            for (int k = 0; k < PATHS; k++) {
                rate_lease_t l;
                rc[k] = rate_inflight_acquire_at(p[k].in, kb, strlen(kb), cls,
                                                 now, &l, &d[k]);
                if (rc[k] == RATE_OK && d[k].allowed) {
                    p[k].order[p[k].granted++] = l.id;
                    if (p[k].n < MAXH) {
                        p[k].keyof[p[k].n] = key;
                        p[k].held[p[k].n++] = l;
                    } else {
                        p[k].keyof[step % MAXH] = key;
                        p[k].held[step % MAXH] = l;
                    }
                }
            }
            /* A normal request denied while critical ones hold more
             * than its limit: it waits for more than one expiry. */
            uint64_t h0 = 0;
            if (rc[0] == RATE_OK && !d[0].allowed &&
                cls == RATE_LEASE_NORMAL &&
                rate_inflight_held_at(p[0].in, kb, strlen(kb), now, &h0) ==
                    RATE_OK &&
                h0 > d[0].limit)
                ops[5]++;
            ops[6] += rc[0] == RATE_OK && !d[0].allowed && d[0].component > 0;
            for (int k = 1; k < PATHS; k++) {
                assert_int_equal(rc[k], rc[0]);
                assert_int_equal(d[k].allowed, d[0].allowed);
                assert_int_equal(d[k].reason, d[0].reason);
                assert_int_equal(d[k].limit, d[0].limit);
                assert_int_equal(d[k].remaining, d[0].remaining);
                assert_int_equal(d[k].retry_after_ns, d[0].retry_after_ns);
                assert_int_equal(d[k].reset_after_ns, d[0].reset_after_ns);
            }
        } else if (op < 7) { /* release (again, maybe; expired, maybe) */
            ops[1]++;
            key_text(kb, sizeof kb, key = p[0].keyof[h]);
            for (int k = 0; k < PATHS; k++)
                rc[k] = rate_inflight_release_at(p[k].in, kb, strlen(kb),
                                                 &p[k].held[h], now);
            for (int k = 1; k < PATHS; k++)
                assert_int_equal(rc[k], rc[0]);
            ops[rc[0] == RATE_OK ? 4 : 3]++;
        } else if (op < 9) { /* extend */
            ops[2]++;
            key_text(kb, sizeof kb, key = p[0].keyof[h]);
            uint64_t t = rnd(3) == 0 ? 0 : rnd(2 * ttl) + 1;
            for (int k = 0; k < PATHS; k++)
                rc[k] = rate_inflight_extend_at(p[k].in, kb, strlen(kb),
                                                &p[k].held[h], t, now);
            for (int k = 1; k < PATHS; k++) {
                assert_int_equal(rc[k], rc[0]);
                assert_int_equal(p[k].held[h].expires_ns,
                                 p[0].held[h].expires_ns);
            }
        } else {
            for (int k = 0; k < PATHS; k++)
                rc[k] = rate_inflight_held_at(p[k].in, kb, strlen(kb), now,
                                              &held[k]);
            for (int k = 1; k < PATHS; k++) {
                assert_int_equal(rc[k], rc[0]);
                assert_int_equal(held[k], held[0]);
            }
        }
        /* The same bytes on the three Redis paths: the script's and the
         * module's exactly; the general path's too, but for a key with
         * no lease, absent where an acquire with rate limits denied by a
         * rate limit only counted, a bare header where the general path
         * took the lease and gave it back. */
        uint8_t b[PATHS][14 + 24 * 64];
        size_t len[PATHS];
        for (int k = GENERIC; k < PATHS; k++)
            len[k] = stored(&p[k], k, kb, b[k], sizeof b[k]);
        if (len[MODULE] != len[SCRIPT] ||
            memcmp(b[MODULE], b[SCRIPT], len[SCRIPT]) != 0)
            fail_msg("step %d: the module's lease bytes (%zu) differ from "
                     "the script's (%zu)", step, len[MODULE], len[SCRIPT]);
        bool rated = strchr(policy, ';') != NULL;
        for (int k = SCRIPT; k < PATHS; k++) {
            if (rated && len[k] == 0 && bare(b[GENERIC], len[GENERIC]))
                continue;
            if (len[k] != len[GENERIC] ||
                memcmp(b[k], b[GENERIC], len[k]) != 0)
                fail_msg("step %d: %s's bytes (%zu) differ from the general "
                         "path's (%zu)", step, path_name[k], len[k],
                         len[GENERIC]);
        }
        /* The rate state's bytes, the same on the three. */
        for (int k = GENERIC; rated && k < PATHS; k++)
            len[k] = rate_stored(k, kb, b[k], sizeof b[k]);
        for (int k = SCRIPT; rated && k < PATHS; k++)
            if (len[k] != len[GENERIC] ||
                memcmp(b[k], b[GENERIC], len[k]) != 0)
                fail_msg("step %d: %s's rate state (%zu bytes) differs from "
                         "the general path's (%zu)", step, path_name[k],
                         len[k], len[GENERIC]);
    }
    print_message("%s: %d acquires (%d denied by a rate limit), %d releases "
                  "(%d refused), %d extends, %d denials behind more than one "
                  "lease\n",
                  policy, ops[0], ops[6], ops[1], ops[3], ops[2], ops[5]);
    assert_true(ops[3] > 0 && ops[4] > 0); /* both kinds of release seen */
    assert_true((ops[6] > 0) == (strchr(policy, ';') != NULL));
    assert_true(!deep || ops[5] > 0);
    for (int k = 0; k < PATHS; k++) {
        rate_inflight_free(p[k].in);
        if (p[k].store != NULL) {
            rate_store_redis_drop(p[k].store);
            rate_store_free(p[k].store);
        }
    }
}

static void test_differential_plain(void **state)
{
    (void)state;
    run_differential("concurrency 3 ttl=100ms", 11, false, STEPS);
}

static void test_differential_reserve(void **state)
{
    (void)state;
    run_differential("concurrency 6 ttl=100ms reserve=50%", 12, true, STEPS);
}

/* A larger N, a reserve of a few. */
static void test_differential_wide(void **state)
{
    (void)state;
    run_differential("concurrency 20 ttl=100ms reserve=3", 13, false, STEPS);
}

/* Objects of different N on one key, every path: a small object without
 * a reserve (and a critical request under one) meeting more leases than
 * its N is told the exact slot-back time, the (held - N + 1)-th earliest
 * expiry, as the memory store tells it; not the earliest. */
/* A rate state the one command cannot decide (written under another
 * policy: a tier change) is declined by the script and the module alike,
 * with no lease taken and nothing charged; the acquire then goes in two
 * steps, whose limiter carries the state over: the memory store's
 * answers, one lease held. */
static void test_declined_rate(void **state)
{
    (void)state;
    rate_decision_t want[3];
    for (int path = MEM; path < PATHS; path++) {
        rate_store_t *s = store_of(path, false);
        rate_store_t *mem = NULL;
        if (s == NULL)
            assert_int_equal(rate_store_memory_new(NULL, &mem), RATE_OK);
        rate_policy_t *old = NULL;
        char err[128];
        assert_int_equal(rate_policy_parse("token-bucket 5/h burst=2", &old,
                                           err, sizeof err), RATE_OK);
        rate_limiter_config_t lc = {.policy = old, .store = s ? s : mem};
        rate_limiter_t *lim = NULL;
        assert_int_equal(rate_limiter_new(&lc, &lim), RATE_OK);
        rate_decision_t d;
        assert_int_equal(rate_limiter_check(lim, "tc", 2, 1, 0, &d), RATE_OK);
        assert_true(d.allowed); /* the old tier's state: one token left */
        rate_inflight_t *in =
            inflight_of("concurrency 2 ttl=1h; token-bucket 5/h burst=3",
                        s ? s : mem);
        rate_redis_status_t st0, st;
        if (s != NULL)
            assert_int_equal(rate_store_redis_status(s, &st0), RATE_OK);
        for (int i = 0; i < 3; i++) {
            rate_lease_t l;
            assert_int_equal(rate_inflight_acquire(in, "tc", 2,
                                                   RATE_LEASE_NORMAL, &l, &d),
                             RATE_OK);
            if (path == MEM) {
                want[i] = d;
                print_message("memory: acquire %d: allowed %d component %d "
                              "remaining %llu\n", i, d.allowed, d.component,
                              (unsigned long long)d.remaining);
            }
            assert_int_equal(d.allowed, want[i].allowed);
            assert_int_equal(d.component, want[i].component);
            assert_int_equal(d.remaining, want[i].remaining);
            assert_int_equal(d.retry_after_ns != 0,
                             want[i].retry_after_ns != 0);
        }
        /* carried over: the token left, then denials */
        assert_true(want[0].allowed && !want[1].allowed && !want[2].allowed);
        assert_int_equal(want[1].component, 1);
        uint64_t held = 0;
        assert_int_equal(rate_inflight_held(in, "tc", 2, &held), RATE_OK);
        assert_int_equal(held, 1);
        if (s != NULL && path != GENERIC) {
            /* each declined by the one command, then the two steps */
            assert_int_equal(rate_store_redis_status(s, &st), RATE_OK);
            uint64_t leases = path == MODULE
                                  ? st.module_leases - st0.module_leases
                                  : st.script_leases - st0.script_leases;
            uint64_t decided = st.module_decisions + st.lean_decisions +
                               st.general_decisions + st.declined -
                               (st0.module_decisions + st0.lean_decisions +
                                st0.general_decisions + st0.declined);
            print_message("%s: %llu lease commands, %llu rate decisions of "
                          "their own\n", path_name[path],
                          (unsigned long long)leases,
                          (unsigned long long)decided);
            /* The first acquire declined (not counted), then its lease
             * and its rate decision apart; the limiter rewrote the state
             * under the new tier: the next two in one command each. */
            assert_int_equal(leases, 4); /* 3 acquires, the count */
            /* (the script's is the lean script's decline, counted; the
             * module's RATELIMIT.STEP declines uncounted) */
            assert_int_equal(decided, path == SCRIPT ? 1 : 0);
        }
        rate_inflight_free(in);
        rate_limiter_free(lim);
        rate_policy_free(old);
        if (s != NULL) {
            rate_store_redis_drop(s);
            rate_store_free(s);
        }
        rate_store_free(mem);
    }
}

/* The lease scripts go by FCALL (the Functions library, loaded on first
 * use); after FUNCTION FLUSH the store loads it again and the operation
 * is made, plain or with rate limits, exactly once. */
static void test_function_flush(void **state)
{
    (void)state;
    redisContext *c = raw();
    rate_store_t *s = store_of(SCRIPT, false);
    rate_inflight_t *in =
        inflight_of("concurrency 3 ttl=1h; fixed-window 2/h", s);
    rate_lease_t l[3];
    rate_decision_t d;
    uint64_t held = 0;
    for (int i = 0; i < 3; i++) {
        freeReplyObject(redisCommand(c, "FUNCTION FLUSH"));
        assert_int_equal(rate_inflight_acquire(in, "ff", 2, RATE_LEASE_NORMAL,
                                               &l[i], &d), RATE_OK);
        assert_int_equal(d.allowed, i < 2); /* the third: the rate limit */
        assert_int_equal(d.component, 1);   /* (the tighter, admitted) */
    }
    freeReplyObject(redisCommand(c, "FUNCTION FLUSH"));
    assert_int_equal(rate_inflight_release(in, "ff", 2, &l[0]), RATE_OK);
    freeReplyObject(redisCommand(c, "FUNCTION FLUSH"));
    assert_int_equal(rate_inflight_held(in, "ff", 2, &held), RATE_OK);
    assert_int_equal(held, 1);
    rate_redis_status_t st;
    assert_int_equal(rate_store_redis_status(s, &st), RATE_OK);
    assert_int_equal(st.script_leases, 5);
    rate_inflight_free(in);
    rate_store_redis_drop(s);
    rate_store_free(s);
    redisFree(c);
}

/* With rate limits: the lease and the rate decision in one command, the
 * same answers as the memory store and the general path, the same bytes
 * (the leases' and the rate state's) on the script and the module. */
static void test_differential_rated(void **state)
{
    (void)state;
    run_differential("concurrency 3 ttl=100ms; token-bucket 20/s burst=2",
                     31, false, STEPS);
    run_differential("concurrency 4 ttl=100ms reserve=1; fixed-window "
                     "2/50ms; sliding-window 8/1s", 32, false, STEPS);
}

static void test_mixed_n(void **state)
{
    (void)state;
    static const struct { const char *text; rate_lease_class_t cls;
                          int limit; } small[] = {
        {"concurrency 3 ttl=1h", RATE_LEASE_NORMAL, 3},
        {"concurrency 3 ttl=1h reserve=1", RATE_LEASE_CRITICAL, 3},
        {"concurrency 3 ttl=1h reserve=1", RATE_LEASE_NORMAL, 2},
    };
    /* (memory: test_lease's test_mixed_n, on one shared store) */
    for (int path = GENERIC; path < PATHS; path++) {
        for (size_t i = 0; i < sizeof small / sizeof small[0]; i++) {
            rate_store_t *s = store_of(path, false);
            rate_inflight_t *big = inflight_of("concurrency 8 ttl=1h", s);
            rate_inflight_t *in = inflight_of(small[i].text, s);
            uint64_t now = UINT64_C(1000000000);
            rate_lease_t l[8], x;
            rate_decision_t d;
            char key[32];
            snprintf(key, sizeof key, "mixed%zu", i);
            for (int j = 0; j < 8; j++, now += 1000000)
                assert_int_equal(rate_inflight_acquire_at(big, key,
                                     strlen(key), RATE_LEASE_NORMAL, now,
                                     &l[j], &d),
                                 RATE_OK);
            assert_int_equal(rate_inflight_acquire_at(in, key, strlen(key),
                                                      small[i].cls, now, &x,
                                                      &d),
                             RATE_OK);
            assert_false(d.allowed);
            uint64_t want = l[8 - small[i].limit].expires_ns - now;
            if (d.retry_after_ns != want)
                fail_msg("%s, '%s' (%s): retry after %llu ns, not %llu",
                         path_name[path], small[i].text,
                         small[i].cls == RATE_LEASE_CRITICAL ? "critical"
                                                             : "normal",
                         (unsigned long long)d.retry_after_ns,
                         (unsigned long long)want);
            rate_inflight_free(in);
            rate_inflight_free(big);
            rate_store_redis_drop(s);
            rate_store_free(s);
        }
    }
}

/* ------------------------------------------------------------ bad bytes */

/* Bytes that are not a lease state, and a key of another type: both one-
 * round-trip paths answer RATE_ECORRUPT and write nothing. */
static void test_bad_state(void **state)
{
    (void)state;
    redisContext *c = raw();
    static const struct {
        const char *s;
        size_t len;
    } bad[] = {
        {"xyz", 3},
        /* a header announcing one entry, with none */
        {"\0\0\0\0\0\0\0\0\1\0\0\0\0L", 14},
        /* a header with a wrong format byte */
        {"\0\0\0\0\0\0\0\0\0\0\0\0\0R", 14},
        /* one entry with id 0 */
        {"\0\0\0\0\0\0\0\1\1\0\0\0\0L" "\0\0\0\0\0\0\0\0"
         "\0\0\0\0\0\0\0\1" "\0\0\0\0" "\0\0\0\0", 38},
        /* one entry of class 2 */
        {"\0\0\0\0\0\0\0\1\1\0\0\0\0L" "\1\0\0\0\0\0\0\0"
         "\0\0\0\0\0\0\0\1" "\0\0\0\0" "\2\0\0\0", 38},
    };
    for (int path = SCRIPT; path < PATHS; path++) {
        rate_store_t *s = store_of(path, false);
        rate_inflight_t *in = inflight_of("concurrency 2 ttl=1h", s);
        char full[64];
        size_t n = lease_name(path, "bad", full, sizeof full);
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
            redisReply *r = redisCommand(c, "HSET %b v 7 s %b", full, n,
                                         bad[i].s, bad[i].len);
            freeReplyObject(r);
            rate_lease_t l = {.id = 5, .expires_ns = UINT64_MAX / 4};
            rate_decision_t d;
            uint64_t held;
            assert_int_equal(rate_inflight_acquire(in, "bad", 3,
                                                   RATE_LEASE_NORMAL, &l, &d),
                             RATE_ECORRUPT);
            assert_int_equal(d.reason, RATE_REASON_STORE_ERROR);
            assert_int_equal(rate_inflight_held(in, "bad", 3, &held),
                             RATE_ECORRUPT);
            r = redisCommand(c, "HGET %b s", full, n);
            assert_int_equal(r->type, REDIS_REPLY_STRING);
            assert_int_equal(r->len, bad[i].len);
            assert_memory_equal(r->str, bad[i].s, bad[i].len);
            freeReplyObject(r);
            r = redisCommand(c, "HGET %b v", full, n);
            assert_string_equal(r->str, "7");
            freeReplyObject(r);
        }
        redisReply *r = redisCommand(c, "DEL %b", full, n);
        freeReplyObject(r);
        r = redisCommand(c, "SET %b text", full, n);
        freeReplyObject(r);
        rate_lease_t l;
        rate_decision_t d;
        assert_int_equal(rate_inflight_acquire(in, "bad", 3, RATE_LEASE_NORMAL,
                                               &l, &d),
                         RATE_ECORRUPT);
        r = redisCommand(c, "GET %b", full, n);
        assert_string_equal(r->str, "text");
        freeReplyObject(r);
        rate_inflight_free(in);
        rate_store_redis_drop(s);
        rate_store_free(s);
    }
    redisFree(c);
}

/* A path's end: its key removed, its objects freed. */
static void path_done(redisContext *c, const char *full, size_t n,
                      rate_inflight_t *in, rate_store_t *s)
{
    freeReplyObject(redisCommand(c, "DEL %b", full, n));
    rate_inflight_free(in);
    rate_store_redis_drop(s);
    rate_store_free(s);
}

/* The versions of test_bad_version on one path's lease key `full`, by
 * the in-flight object in (RATE_ECORRUPT, nothing written). */
static void bad_versions_on(redisContext *c, int path, rate_inflight_t *in,
                            const char *full, size_t n)
{
    static const char *const vers[] = {"05", "00", "01234567890123456789",
                                       "18446744073709551614", "x1"};
    for (size_t i = 0; i < sizeof vers / sizeof vers[0]; i++) {
        for (int with_state = 0; with_state < 2; with_state++) {
            redisReply *r = redisCommand(c, "DEL %b", full, n);
            freeReplyObject(r);
            rate_lease_t l;
            rate_decision_t d;
            uint64_t held;
            if (with_state) /* a lease state, as the path wrote it */
                assert_int_equal(rate_inflight_acquire(in, "bv", 2,
                                                       RATE_LEASE_NORMAL, &l,
                                                       &d),
                                 RATE_OK);
            r = redisCommand(c, "HSET %b v %s", full, n, vers[i]);
            freeReplyObject(r);
            r = redisCommand(c, "DUMP %b", full, n);
            int rc = rate_inflight_acquire(in, "bv", 2, RATE_LEASE_NORMAL,
                                           &l, &d);
            if (rc != RATE_ECORRUPT)
                fail_msg("%s: version %s%s: %s, not RATE_ECORRUPT",
                         path_name[path], vers[i],
                         with_state ? " with a state" : "",
                         rate_err_name(rc));
            assert_int_equal(d.reason, RATE_REASON_STORE_ERROR);
            assert_int_equal(rate_inflight_held(in, "bv", 2, &held),
                             RATE_ECORRUPT);
            redisReply *a = redisCommand(c, "DUMP %b", full, n);
            assert_true(a->len == r->len &&
                        memcmp(a->str, r->str, a->len) == 0);
            freeReplyObject(a);
            freeReplyObject(r);
        }
    }
}

/* A version that is no version of ours (docs/redis.md, "Versions": a
 * leading zero, 20 characters, not digits) on a key's leases, with a
 * lease state or without, and with rate limits or without (an acquire
 * with them is RATELIMIT.LEASESTEP's or the lease-rate script's): the
 * general path (HMGET and compare-and-set), the script and the module
 * alike answer RATE_ECORRUPT and write nothing. */
static void test_bad_version(void **state)
{
    (void)state;
    redisContext *c = raw();
    static const char *const policies[] = {
        "concurrency 2 ttl=1h", "concurrency 2 ttl=1h; fixed-window 5/h"};
    for (int path = GENERIC; path < PATHS; path++) {
        rate_store_t *s = store_of(path, false);
        char full[64];
        size_t n = lease_name(path, "bv", full, sizeof full);
        for (size_t p = 0; p < sizeof policies / sizeof policies[0]; p++) {
            rate_inflight_t *in = inflight_of(policies[p], s);
            bad_versions_on(c, path, in, full, n);
            rate_inflight_free(in);
        }
        path_done(c, full, n, NULL, s);
    }
    redisFree(c);
}

/* A key with a version but no state is a new key: the script and the
 * module alike start its version from the server's TIME in
 * microseconds, as the rate step's script does, never from the stale
 * number plus one (which a compare-and-set client may have seen before:
 * an ABA). */
static void test_fresh_version(void **state)
{
    (void)state;
    redisContext *c = raw();
    for (int path = SCRIPT; path < PATHS; path++) {
        rate_store_t *s = store_of(path, false);
        rate_inflight_t *in = inflight_of("concurrency 2 ttl=1h", s);
        char full[64];
        size_t n = lease_name(path, "fv", full, sizeof full);
        redisReply *r = redisCommand(c, "HSET %b v 5", full, n);
        freeReplyObject(r);
        rate_lease_t l;
        rate_decision_t d;
        assert_int_equal(rate_inflight_acquire(in, "fv", 2, RATE_LEASE_NORMAL,
                                               &l, &d),
                         RATE_OK);
        assert_true(d.allowed);
        r = redisCommand(c, "HGET %b v", full, n);
        assert_int_equal(r->type, REDIS_REPLY_STRING);
        unsigned long long v = strtoull(r->str, NULL, 10);
        if (v < UINT64_C(1000000000000000)) /* 2001 in microseconds */
            fail_msg("%s: version 5 then '%s', not the server's time",
                     path_name[path], r->str);
        freeReplyObject(r);
        uint64_t held;
        assert_int_equal(rate_inflight_held(in, "fv", 2, &held), RATE_OK);
        assert_int_equal(held, 1);
        path_done(c, full, n, in, s);
    }
    redisFree(c);
}

/* ------------------------------------------------------------- cluster */

/* A Redis Cluster of 3 masters, each with the module: one round trip per
 * operation on the key's master, by the script and by the module, and
 * the differential over keys of every master. */
static void test_cluster(void **state)
{
    (void)state;
    rcluster_t cl;
    rcl_module = RATE_MODULE_PATH;
    if (!rcl_start(&cl))
        fail_msg("the cluster did not start");
    char curl[512];
    rcl_url(&cl, curl, sizeof curl);
    cur_url = curl;
    cur_cl = &cl;
    check_round_trips();
    run_differential("concurrency 4 ttl=100ms reserve=1", 21, false, 600);
    /* a key's leases and its rate state on one slot: one command */
    check_rate_round_trips();
    run_differential("concurrency 3 ttl=100ms; token-bucket 40/s burst=3",
                     22, false, 600);
    cur_url = url;
    cur_cl = NULL;
    rcl_stop(&cl);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trips),
        cmocka_unit_test(test_rate_round_trips),
        cmocka_unit_test(test_all_or_nothing),
        cmocka_unit_test(test_declined_rate),
        cmocka_unit_test(test_function_flush),
        cmocka_unit_test(test_expiry),
        cmocka_unit_test(test_differential_plain),
        cmocka_unit_test(test_differential_reserve),
        cmocka_unit_test(test_differential_wide),
        cmocka_unit_test(test_differential_rated),
        cmocka_unit_test(test_bad_state),
        cmocka_unit_test(test_bad_version),
        cmocka_unit_test(test_fresh_version),
        cmocka_unit_test(test_mixed_n),
        cmocka_unit_test(test_cluster),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
