/* SPDX-License-Identifier: MIT */
/*
 * The Redis store: keys shared by every process and machine that talks to
 * the same Redis, a single server or a Redis Cluster (docs/redis.md).
 *
 * A decision is one EVALSHA of redis_step.lua, a Lua twin of src/step.c
 * over the same state bytes (the decide() entry of the store contract).
 * The script declines whatever it cannot decide exactly in doubles (see
 * docs/algorithms.md, "Stores"), and any state that makes no sense (it
 * checks every field first, as the C step does), writing nothing; decide()
 * then returns RATE_ENOTSUP and the limiter runs the C step over the
 * generic contract, which this store also implements: load is one HMGET of
 * the key's version and state, cas one EVALSHA of a short script that
 * replaces the state only if the version is unchanged.  A Redis key of
 * another type than a hash (WRONGTYPE) is RATE_ECORRUPT from load, cas and
 * decide, and is never written over.  A refund or a penalty asked of
 * decide() (store contract version 4) is a lean script's, in one EVALSHA
 * or FCALL, for the single limits those scripts decide; anything else is
 * declined, and the limiter makes it over load and cas.
 *
 * A key is stored as a hash {v: version, s: state bytes}, named by its
 * space, always inside the prefix and always its own Redis Cluster hash
 * tag (the braces):
 *
 *   RATE_SPACE_STATE   PREFIX "{" KEY "}"   (the first edition's names)
 *   RATE_SPACE_SHADOW  PREFIX "s{" KEY "}"
 *   RATE_SPACE_POLICY  PREFIX "p{" HEX "}"  HEX: the key's bytes (a 4-byte
 *                      id) in order, two lowercase hex digits each, as in
 *                      "ratelimit:p{0badcafe}"
 *
 * A KEY holding a '}' would end the tag early (Redis takes the bytes up to
 * the first '}'), so such a key is escaped instead, '%' as "%25" and '}'
 * as "%7d", and named PREFIX "e{" ESC "}" (a state) or PREFIX "es{" ESC "}"
 * (a shadow state).  A key without '}' keeps its name; a '{' in a key
 * changes nothing, as Redis reads the tag from the first '{', ours.
 *
 * After the prefix comes '{', 's', 'p' or 'e', so no two spaces ever share
 * a name.  A new key's version starts from Redis's TIME in microseconds,
 * so a key that expired and came back does not reuse the version a slow
 * client may still hold.  Every write sets the key's expiry to its
 * reset_after (never for RATE_TTL_FOREVER, nor with no_ttl).  With no_ttl
 * and safety_ttl_ns, a state (or shadow state) written gets the safety
 * expiry instead of none, both from the step's script and from the
 * compare-and-set script (the policy records, RATE_TTL_FOREVER, still get
 * none); rate_store_redis_touch() refreshes the expiry of every key under
 * the prefix, records too.
 *
 * The store's clock, now(), is Redis's TIME, unless the store was made
 * with client_time: then now() is RATE_ENOTSUP and the limiter keeps to
 * its own clock.
 *
 * Nodes: one for a single server; in a cluster, one per master, found from
 * CLUSTER SLOTS, each key's command sent to the master of its slot
 * (src/store/redis_cluster.c), MOVED followed (the slot map refreshed),
 * ASK followed once with ASKING, at most MAX_REDIRECTS redirections per
 * command.  Each node has a circuit breaker: after breaker_failures calls
 * in a row failed (no reply, or none in time; the node's own calls, map
 * refreshes are outside it), every call on the node
 * fails at once for breaker_cooldown_ns, then one call goes through as a
 * probe: answered, the breaker closes; not, it opens again.
 *
 * Connections: a few per node (pool_size, 2 by default), each shared by
 * all callers and pipelined both ways (see struct conn): commands go out
 * in batches while earlier replies are still being read, the way
 * auto-pipelining clients work, with no I/O thread: the callers
 * themselves take turns writing and reading.  Each command has a deadline,
 * its call's start plus the command timeout (one for a whole library call:
 * a decision's commands, their redirections and a NOSCRIPT's resend share
 * it; internal.h, rate__call_begin): the reader waits (poll) no longer
 * than the earliest deadline of the commands in flight, looked at again
 * every RECHECK_NS (a command sent later may have an earlier deadline),
 * then fails them all; a connection made for queued commands is made
 * within the first one's deadline.  A connection that failed is dropped, and
 * reconnecting is tried again no sooner than a backoff that doubles from
 * 10 ms to 1 s, so while Redis is down a call fails at once instead of
 * waiting on a dead host.
 */
#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <linux/futex.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <unistd.h>

#include <hiredis/hiredis.h>

#include "../internal.h"
#include "../sha1.h"
#include "redis_cluster.h"
#include "redis_internal.h"
#include "ratelimit_redis.h"
#include "redis_step_lua.h"
#include "redis_tb_lua.h"
#include "redis_lb_lua.h"
#include "redis_fw_lua.h"

#define BACKOFF_MIN_NS (10 * UINT64_C(1000000))
#define BACKOFF_MAX_NS RATE_NS_PER_S
#define MAX_NODES 255     /* nodes a store ever knows (masters, past too) */
#define MAX_SEEDS 16
#define MAX_REDIRECTS 5   /* MOVED, ASK, TRYAGAIN followed per command */
#define TRYAGAIN_NS (20 * UINT64_C(1000000))
#define REFRESH_MIN_NS (100 * UINT64_C(1000000)) /* between map refreshes */
#define RECHECK_NS (10 * UINT64_C(1000000)) /* a reader's deadline looked at */
#define BREAKER_FAILURES 5
#define BREAKER_COOLDOWN_NS RATE_NS_PER_S

/* The expiry rule of redis_step.lua's expire_at (see there and
 * docs/redis.md): the key lives at least `us` microseconds by Redis's own
 * clock, PEXPIREAT the end rounded up to whole milliseconds, plus one. */
#define EXPIRE_AT_LUA                                                        \
    "local function expire_at(key, us, tm)\n"                               \
    "  if us > 2251799813685248 then us = 2251799813685248 end\n"           \
    "  local e = tonumber(tm[1]) * 1000000 + tonumber(tm[2]) + us\n"        \
    "  local ms = math.floor(e / 1000)\n"                                   \
    "  if ms * 1000 > e then ms = ms - 1\n"                                 \
    "  elseif (ms + 1) * 1000 <= e then ms = ms + 1 end\n"                  \
    "  if ms * 1000 < e then ms = ms + 1 end\n"                             \
    "  redis.call('PEXPIREAT', key, string.format('%.0f', ms + 1))\n"       \
    "end\n"

/* ARGV: the version expected, the state, the expiry in microseconds from
 * Redis's TIME (0: none). */
static const char cas_script[] =
    EXPIRE_AT_LUA
    "local cur = redis.call('HGET', KEYS[1], 'v')\n"
    "if cur == false then cur = '0' end\n"
    "if cur ~= ARGV[1] then return 0 end\n"
    "local nv\n"
    "local t = redis.call('TIME')\n"
    "if cur == '0' then\n"
    "  nv = redis.call('HINCRBY', KEYS[1], 'v', t[1] * 1000000 + t[2])\n"
    "else\n"
    "  nv = redis.call('HINCRBY', KEYS[1], 'v', 1)\n"
    "end\n"
    "redis.call('HSET', KEYS[1], 's', ARGV[2])\n"
    "local ttl = tonumber(ARGV[3])\n"
    "if ttl > 0 then expire_at(KEYS[1], ttl, t)\n"
    "else redis.call('PERSIST', KEYS[1]) end\n"
    "return nv\n";

/* Run at each connection, with a key of the namespace: whether the user
 * may run EVALSHA on the store's keys (an ACL says NOPERM first). */
static const char probe_script[] = "return 1\n";

/* The lean scripts: one per single-limit algorithm (redis_lean.lua, then
 * redis_tb.lua, redis_lb.lua or redis_fw.lua; see docs/redis.md). */
typedef enum lean { LEAN_TB, LEAN_LB, LEAN_FW, LEAN_COUNT } lean_t;
static const struct {
    const char *src;
    size_t len;
} lean_scripts[LEAN_COUNT] = {
    {redis_tb_lua, sizeof redis_tb_lua - 1},
    {redis_lb_lua, sizeof redis_lb_lua - 1},
    {redis_fw_lua, sizeof redis_fw_lua - 1},
};

/* One caller's command on a shared connection. */
typedef struct mreq {
    redisReply *reply; /* out, on RATE_OK */
    int status;        /* out */
    /* Bit 0: done (reply and status are set); above it, a count bumped to
     * hand the caller a role.  The caller sleeps on it (a futex). */
    _Atomic uint32_t sig;
    struct mreq *next;
    uint64_t deadline_ns; /* the call's start plus the command timeout */
    unsigned skip;        /* replies to drop before its own (ASKING's) */
} mreq_t;

/* A connection shared by every caller, pipelined both ways.  A caller that
 * finds no one writing sends every queued command in one write (it is the
 * writer); a caller that finds no one reading reads the replies in order
 * and hands each to its caller until its own has come (it is the reader).
 * Writing never waits for replies, so commands keep flowing while earlier
 * replies are read and their callers woken: Redis is not left idle while
 * callers wait, and concurrent callers share round trips.  A lone caller
 * writes, then reads its own reply: one round trip, no other thread.
 * Fields are under lock, except that only the writer sends on the socket
 * and only the reader reads from it. */
typedef struct conn {
    pthread_mutex_t lock;
    mreq_t *head, *tail;    /* queued, not yet sent; their bytes in obuf */
    mreq_t *fly, *fly_tail; /* sent, waiting for their replies in order */
    char *obuf, *wbuf;      /* queued bytes; the writer's batch */
    size_t olen, ocap, wcap;
    bool writing, reading;
    bool broken;       /* failed: no more I/O; dropped once no role is on it */
    redisContext *ctx; /* NULL: not connected */
    _Atomic uint64_t retry_at_ns;
    uint64_t backoff_ns;
} conn_t;

/* A server: the single one, or a master of the cluster. */
typedef struct node {
    char host[RC_HOST_MAX];
    int port; /* 0: host is a unix socket's path */
    conn_t *conns;
    unsigned nconns;
    atomic_uint next_conn;  /* round robin over the connections */
    atomic_uint fails;      /* calls failed in a row */
    _Atomic uint64_t open_until_ns; /* the breaker: 0 closed */
    atomic_bool probing;    /* open, cooled down: one call is the probe */
} node_t;

typedef struct seed {
    char host[RC_HOST_MAX];
    int port;
} seed_t;

typedef struct redis_store {
    seed_t seeds[MAX_SEEDS];
    unsigned nseeds;
    char password[256], user[256];
    int db;
    bool unix_socket, ttl, redis_time, lazy, breaker, lean;
    unsigned breaker_failures, pool;
    uint64_t breaker_cooldown_ns;
    uint64_t connect_ns, command_ns;
    uint64_t safety_us; /* with no_ttl: the expiry of a state written, in
                           us; 0: none (PERSIST) */
    char *prefix;
    size_t prefix_len;
    char sha[41];      /* the compare-and-set script */
    char step_sha[41]; /* the step (redis_step.lua) */
    char lean_sha[LEAN_COUNT][41]; /* the lean scripts, by lean_t */
    /* The lean scripts as one Redis 7 Functions library (FCALL, faster
     * than EVALSHA of the same body: docs/redis.md), named after a hash of
     * their text so that two versions of the library never clash. */
    char *fn_lib;
    size_t fn_lib_len;
    char fn_name[LEAN_COUNT][32];
    atomic_bool fcall; /* every node took FUNCTION LOAD: FCALL, else EVALSHA */

    /* The topology: found once (ready), at creation or, lazily, by the
     * first call that reaches a seed; the slot map then follows the
     * cluster.  Discovery and map refreshes under topo_lock, which is held
     * across their I/O; new nodes under node_lock, which never is (a
     * call redirected to a new node must not wait for a refresh made by
     * another call, with that call's deadline). */
    pthread_mutex_t topo_lock;
    pthread_mutex_t node_lock;
    atomic_bool ready;
    bool cluster; /* set before ready */
    uint64_t topo_retry_at_ns, topo_backoff_ns;
    _Atomic uint64_t refreshed_at_ns;
    node_t *_Atomic nodes[MAX_NODES];
    atomic_uint nnodes;
    _Atomic uint8_t slot_node[RC_SLOTS]; /* node index + 1; 0: none known */

    pthread_mutex_t err_lock;
    char last_err[256]; /* the last connection's failure; "" since one
                           succeeded */
    atomic_uint_fast64_t st_lean, st_general, st_declined;
    atomic_uint_fast64_t st_lean_adj, st_adj_declined; /* refunds, penalties */
    atomic_uint_fast64_t st_opened, st_rejected, st_redirects, st_refreshes,
        st_connect_failures;

    /* ratelimit.so (the module section below) */
    rate_redis_module_t module_mode;
    _Atomic int module_state; /* MODULE_UNKNOWN, _ON, _OFF */
    _Atomic uint64_t module_retry_at_ns;
    atomic_uint_fast64_t st_module, st_module_fallbacks;
} redis_store_t;

static int call_node(redis_store_t *r, uint64_t dl, node_t *n, bool asking,
                     int argc, const char **argv, const size_t *lens,
                     redisReply **out);

/* A call's deadline: the command timeout from the start of the library
 * call it serves (a decision, refund or penalty: internal.h,
 * rate__call_begin), so that a module probe, a fallback to the scripts, a
 * reconnect and the policy's record all share it; from now outside one. */
static uint64_t deadline_of(const redis_store_t *r)
{
    return rate__call_deadline_ns(r->command_ns);
}

static void set_err(redis_store_t *r, const char *msg)
{
    pthread_mutex_lock(&r->err_lock);
    snprintf(r->last_err, sizeof r->last_err, "%s", msg);
    pthread_mutex_unlock(&r->err_lock);
}

/* ------------------------------------------------------------------ URL */

static bool copy_part(char *dst, size_t cap, const char *s, size_t n)
{
    if (n >= cap)
        return false;
    memcpy(dst, s, n);
    dst[n] = '\0';
    return true;
}

static bool parse_int(const char *s, size_t n, int max, int *out)
{
    uint64_t v;
    if (!rate__parse_decimal(s, n, (uint64_t)max, &v))
        return false;
    *out = (int)v;
    return true;
}

/* One seed, host[:port] or [v6][:port], from p to end. */
static int parse_seed(seed_t *s, const char *url, const char *p,
                      const char *end, char *err, size_t errlen)
{
    const char *colon = NULL, *hs = p, *he;
    s->port = 6379;
    if (p < end && *p == '[') { /* [IPv6] */
        const char *close = memchr(p, ']', (size_t)(end - p));
        if (close == NULL)
            return rate__fail(err, errlen, RATE_EINVAL,
                              "'%s': unclosed '[' in host", url);
        hs = p + 1;
        he = close;
        if (close + 1 < end) {
            if (close[1] != ':')
                return rate__fail(err, errlen, RATE_EINVAL,
                                  "'%s': text after ']' in host", url);
            colon = close + 1;
        }
    } else {
        colon = memchr(p, ':', (size_t)(end - p));
        he = colon ? colon : end;
    }
    if (he == hs || !copy_part(s->host, sizeof s->host, hs, (size_t)(he - hs)))
        return rate__fail(err, errlen, RATE_EINVAL,
                          "'%s': missing or too long host", url);
    if (colon != NULL &&
        (!parse_int(colon + 1, (size_t)(end - colon - 1), 65535, &s->port) ||
         s->port == 0))
        return rate__fail(err, errlen, RATE_EINVAL,
                          "'%s': port is not a number from 1 to 65535", url);
    return RATE_OK;
}

/* redis://[[user]:password@]host[:port][,host[:port]...][/db]  or
 * unix:///path */
static int parse_url(redis_store_t *r, const char *url, char *err,
                     size_t errlen)
{
    const char *p, *end;

    if (strncmp(url, "unix://", 7) == 0) {
        r->unix_socket = true;
        r->nseeds = 1;
        if (url[7] != '/' || !copy_part(r->seeds[0].host,
                                        sizeof r->seeds[0].host, url + 7,
                                        strlen(url + 7)))
            return rate__fail(err, errlen, RATE_EINVAL,
                              "'%s': unix:// needs an absolute socket path",
                              url);
        return RATE_OK;
    }
    if (strncmp(url, "rediss://", 9) == 0)
        return rate__fail(err, errlen, RATE_EINVAL,
                          "'%s': TLS (rediss://) is not supported "
                          "(Debian 12's hiredis 0.14 has none)", url);
    if (strncmp(url, "redis://", 8) != 0)
        return rate__fail(err, errlen, RATE_EINVAL,
                          "'%s' is not "
                          "redis://[user:password@]host[:port][,host[:port]"
                          "...][/db] or unix:///path", url);
    p = url + 8;
    end = p + strlen(p);
    const char *at = memchr(p, '@', (size_t)(end - p));
    if (at != NULL) {
        const char *colon = memchr(p, ':', (size_t)(at - p));
        if (colon == NULL)
            return rate__fail(
                err, errlen, RATE_EINVAL,
                "'%s': credentials are user:password@ or :password@", url);
        if (!copy_part(r->user, sizeof r->user, p, (size_t)(colon - p)) ||
            !copy_part(r->password, sizeof r->password, colon + 1,
                       (size_t)(at - colon - 1)))
            return rate__fail(err, errlen, RATE_EINVAL,
                              "'%s': credentials too long", url);
        p = at + 1;
    }
    const char *slash = memchr(p, '/', (size_t)(end - p));
    const char *hostend = slash ? slash : end;
    for (;;) {
        const char *comma = memchr(p, ',', (size_t)(hostend - p));
        const char *se = comma ? comma : hostend;
        if (r->nseeds == MAX_SEEDS)
            return rate__fail(err, errlen, RATE_EINVAL,
                              "'%s': more than %d hosts", url, MAX_SEEDS);
        int rc = parse_seed(&r->seeds[r->nseeds++], url, p, se, err, errlen);
        if (rc != RATE_OK)
            return rc;
        if (comma == NULL)
            break;
        p = comma + 1;
    }
    if (slash != NULL && slash + 1 < end &&
        !parse_int(slash + 1, (size_t)(end - slash - 1), 1 << 20, &r->db))
        return rate__fail(err, errlen, RATE_EINVAL,
                          "'%s': database is not a whole number", url);
    return RATE_OK;
}

/* ---------------------------------------------------------- connections */

static struct timeval tv_of(uint64_t ns)
{
    struct timeval tv;
    tv.tv_sec = (time_t)(ns / RATE_NS_PER_S);
    tv.tv_usec = (suseconds_t)(ns % RATE_NS_PER_S / 1000);
    if (tv.tv_sec == 0 && tv.tv_usec == 0)
        tv.tv_usec = 1;
    return tv;
}

/* A reply's error, or the context's, as a status.  Frees nothing. */
static int reply_status(redisContext *c, const redisReply *rep)
{
    if (rep == NULL) {
        if (c->err == REDIS_ERR_IO &&
            (errno == EAGAIN || errno == EWOULDBLOCK || errno == ETIMEDOUT))
            return RATE_ETIMEDOUT;
        return RATE_ESTORE;
    }
    return rep->type == REDIS_REPLY_ERROR ? RATE_ESTORE : RATE_OK;
}

/* One command of a connection's handshake, answered by `deadline` (the
 * socket's timeout set to what is left of it). */
static int hs_command(redisContext *c, uint64_t deadline, int argc,
                      const char **argv, const size_t *lens,
                      redisReply **out)
{
    uint64_t now = rate_clock_monotonic_ns();
    *out = NULL;
    if (now >= deadline)
        return RATE_ETIMEDOUT;
    redisSetTimeout(c, tv_of(deadline - now));
    *out = redisCommandArgv(c, argc, argv, lens);
    return reply_status(c, *out);
}

static const char *rep_text(redisContext *c, const redisReply *rep)
{
    if (rep == NULL)
        return c->errstr[0] ? c->errstr : "no reply in time";
    return rep->str ? rep->str : "unexpected reply";
}

/* A handshake that timed out says so, and how long it had, rather than
 * the socket's EAGAIN ("Resource temporarily unavailable"): the reason at
 * the end of err (after its last ": ") becomes "timed out after N ms". */
static void timeout_reason(char *err, size_t errlen, uint64_t budget_ns)
{
    char *p = NULL;
    if (err == NULL || errlen == 0)
        return;
    for (char *q = strstr(err, ": "); q != NULL; q = strstr(q + 1, ": "))
        p = q;
    size_t at = p ? (size_t)(p - err) : strlen(err);
    if (at < errlen)
        snprintf(err + at, errlen - at, ": timed out after %llu ms",
                 (unsigned long long)((budget_ns + 500000) / 1000000));
}

/* Connects to host:port (port 0: a unix socket), authenticates, asks for
 * the slot map when slots != NULL (*slots: the reply, or NULL for a server
 * that is no cluster), selects the database (no cluster), loads the
 * scripts, and checks that the user may run what the store needs; all of
 * it by `deadline`, the TCP connection within the connect timeout too.
 * The scripts' SHA1 digests are recorded by the first connection (under
 * topo_lock, before the store is ready); later ones load the same
 * scripts, while callers read the digests. */
static int open_conn(redis_store_t *r, const char *host, int port,
                     uint64_t deadline, redisReply **slots,
                     redisContext **out, char *err, size_t errlen)
{
    uint64_t now = rate_clock_monotonic_ns();
    uint64_t budget = deadline > now ? deadline - now : 1;
    struct timeval ctv = tv_of(budget < r->connect_ns ? budget : r->connect_ns);
    redisContext *c = port == 0 ? redisConnectUnixWithTimeout(host, ctv)
                                : redisConnectWithTimeout(host, port, ctv);
    redisReply *rep = NULL;
    char where[RC_HOST_MAX + 16];
    int rc = RATE_OK;

    *out = NULL;
    if (slots != NULL)
        *slots = NULL;
    if (port == 0) /* the socket's path alone: no port */
        snprintf(where, sizeof where, "%s", host);
    else
        snprintf(where, sizeof where, "%s:%d", host, port);
    if (c == NULL)
        return rate__fail(err, errlen, RATE_ENOMEM, "out of memory");
    if (c->err) {
        rc = rate__fail(err, errlen, RATE_ESTORE, "cannot connect to %s: %s",
                        where, c->errstr);
        redisFree(c);
        return rc;
    }
    if (r->password[0] != '\0') {
        const char *av[3] = {"AUTH", r->user, r->password};
        size_t al[3] = {4, strlen(r->user), strlen(r->password)};
        rc = r->user[0] ? hs_command(c, deadline, 3, av, al, &rep)
                        : hs_command(c, deadline, 2,
                                     (const char *[]){"AUTH", r->password},
                                     (size_t[]){4, strlen(r->password)}, &rep);
        if (rc != RATE_OK)
            rate__fail(err, errlen, rc, "%s: authentication failed: %s",
                       where, rep_text(c, rep));
        freeReplyObject(rep);
    }
    bool cluster = r->cluster;
    if (rc == RATE_OK && slots != NULL) {
        rc = hs_command(c, deadline, 2, (const char *[]){"CLUSTER", "SLOTS"},
                        (size_t[]){7, 5}, &rep);
        if (rc == RATE_OK && rep->type == REDIS_REPLY_ARRAY) {
            *slots = rep; /* a cluster */
            cluster = true;
        } else {
            /* "cluster support disabled" (or a user that may not ask):
             * a single server */
            freeReplyObject(rep);
            if (rc == RATE_ESTORE && rep != NULL)
                rc = RATE_OK;
        }
        if (rc != RATE_OK)
            rate__fail(err, errlen, rc, "%s: CLUSTER SLOTS: %s", where,
                       rep_text(c, NULL));
        rep = NULL;
        if (rc == RATE_OK && cluster && r->db != 0)
            rc = rate__fail(err, errlen, RATE_EINVAL,
                            "%s is a Redis Cluster, which has database 0 "
                            "only, not %d", where, r->db);
    }
    if (rc == RATE_OK && !cluster && r->db != 0) {
        char db[16];
        snprintf(db, sizeof db, "%d", r->db);
        rc = hs_command(c, deadline, 2, (const char *[]){"SELECT", db},
                        (size_t[]){6, strlen(db)}, &rep);
        if (rc != RATE_OK)
            rate__fail(err, errlen, rc, "%s: SELECT %s failed: %s", where, db,
                       rep_text(c, rep));
        freeReplyObject(rep);
    }
    char probe_sha[41] = "";
    for (int i = 0; i < 3 + LEAN_COUNT && rc == RATE_OK; i++) {
        const char *src = i == 0   ? cas_script
                          : i == 1 ? redis_step_lua
                          : i == 2 ? probe_script
                                   : lean_scripts[i - 3].src;
        size_t len = i == 0   ? sizeof cas_script - 1
                     : i == 1 ? sizeof redis_step_lua - 1
                     : i == 2 ? sizeof probe_script - 1
                              : lean_scripts[i - 3].len;
        rc = hs_command(c, deadline, 3,
                        (const char *[]){"SCRIPT", "LOAD", src},
                        (size_t[]){6, 4, len}, &rep);
        if (rc == RATE_OK && rep->type == REDIS_REPLY_STRING && rep->len == 40) {
            /* The store's scripts were named at creation (script_names),
             * as Redis names them: loaded, they run under those names. */
            if (i == 2)
                memcpy(probe_sha, rep->str, 41);
        } else {
            rc = rate__fail(err, errlen, rc ? rc : RATE_ESTORE,
                            "%s: SCRIPT LOAD failed: %s", where,
                            rep_text(c, rep));
        }
        freeReplyObject(rep);
        rep = NULL;
    }
    if (rc == RATE_OK) {
        /* What the store will run, on a key of its namespace: an ACL
         * refuses it (NOPERM) before anything runs, and before a cluster
         * node redirects (MOVED: allowed). */
        char key[RATE_KEY_MAX + 300];
        int kl = snprintf(key, sizeof key, "%.*s{}", (int)r->prefix_len,
                          r->prefix);
        for (int i = 0; i < 2 && rc == RATE_OK; i++) {
            if (i == 0)
                rc = hs_command(c, deadline, 4,
                                (const char *[]){"EVALSHA", probe_sha, "1",
                                                 key},
                                (size_t[]){7, 40, 1, (size_t)kl}, &rep);
            else
                rc = hs_command(c, deadline, 4,
                                (const char *[]){"HMGET", key, "v", "s"},
                                (size_t[]){5, (size_t)kl, 1, 1}, &rep);
            if (rc == RATE_ESTORE && rep != NULL &&
                strstr(rep->str, "NOPERM") == NULL)
                rc = RATE_OK; /* MOVED, CLUSTERDOWN: not the user's rights */
            if (rc != RATE_OK)
                rate__fail(err, errlen, rc,
                           "%s: the Redis user may not run %s on the "
                           "store's keys (%.*s...): %s",
                           where, i == 0 ? "EVALSHA" : "HMGET", kl - 2, key,
                           rep_text(c, rep));
            freeReplyObject(rep);
            rep = NULL;
        }
    }
    if (rc == RATE_ETIMEDOUT)
        timeout_reason(err, errlen, budget);
    if (rc != RATE_OK) {
        if (slots != NULL) {
            freeReplyObject(*slots);
            *slots = NULL;
        }
        redisFree(c);
        return rc;
    }
    redisSetTimeout(c, tv_of(r->command_ns));
    *out = c;
    return RATE_OK;
}

/* Connects for c (the writer's job, with nothing in flight) by the
 * deadline of the first queued command, unless still backing off. */
static int ensure_conn(redis_store_t *r, node_t *n, conn_t *c,
                       uint64_t deadline, redisContext **out)
{
    uint64_t now = rate_clock_monotonic_ns();
    char err[256];
    if (now < atomic_load(&c->retry_at_ns))
        return RATE_ESTORE; /* still backing off: fail at once */
    int rc = open_conn(r, n->host, n->port, deadline, NULL, out, err,
                       sizeof err);
    if (rc != RATE_OK) {
        atomic_fetch_add(&r->st_connect_failures, 1);
        set_err(r, err);
        c->backoff_ns = c->backoff_ns ? c->backoff_ns * 2 : BACKOFF_MIN_NS;
        if (c->backoff_ns > BACKOFF_MAX_NS)
            c->backoff_ns = BACKOFF_MAX_NS;
        atomic_store(&c->retry_at_ns, now + c->backoff_ns);
    } else {
        c->backoff_ns = 0;
        set_err(r, "");
    }
    return rc;
}

/* Waking a caller.  Marking one done may be its last touch by another
 * thread: the caller may return (its mreq_t is on its stack) as soon as it
 * sees the bit, and the futex wake that follows only names the address. */
#define SIG_DONE 1u
#define SIG_TURN 2u

static void sig_wake(_Atomic uint32_t *w)
{
    syscall(SYS_futex, w, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}

static void mark_done(mreq_t *q)
{
    atomic_fetch_or_explicit(&q->sig, SIG_DONE, memory_order_release);
    sig_wake(&q->sig);
}

/* Hands q's caller a role: it is in a queue, so not done, so alive. */
static void give_turn(mreq_t *q)
{
    atomic_fetch_add_explicit(&q->sig, SIG_TURN, memory_order_relaxed);
    sig_wake(&q->sig);
}

static bool is_done(mreq_t *q)
{
    return atomic_load_explicit(&q->sig, memory_order_acquire) & SIG_DONE;
}

/* Ends every request of a list with the status rc.  Under c->lock. */
static void fail_all(mreq_t *q, int rc)
{
    for (mreq_t *nx; q != NULL; q = nx) {
        nx = q->next; /* q may be gone once it is done and woken */
        q->status = rc;
        q->reply = NULL;
        mark_done(q);
    }
}

/* The earliest deadline of a list.  Under c->lock. */
static uint64_t first_deadline(const mreq_t *q)
{
    uint64_t d = UINT64_MAX;
    for (; q != NULL; q = q->next)
        if (q->deadline_ns < d)
            d = q->deadline_ns;
    return d;
}

/* Fails every command sent and not yet answered (a reply can no longer be
 * matched to its command), and stops the I/O of whichever role is blocked
 * on the socket.  Under c->lock. */
static void conn_break(conn_t *c, int rc)
{
    if (!c->broken && c->ctx != NULL)
        shutdown(c->ctx->fd, SHUT_RDWR);
    c->broken = true;
    fail_all(c->fly, rc);
    c->fly = c->fly_tail = NULL;
}

/* Drops a broken connection once no role is on it, and hands whatever is
 * still queued to its first caller, to reconnect.  Under c->lock. */
static void conn_settle(conn_t *c)
{
    if (!c->broken || c->writing || c->reading)
        return;
    redisFree(c->ctx);
    c->ctx = NULL;
    c->broken = false;
    atomic_store(&c->retry_at_ns, 0); /* reconnect at once, then back off */
    if (c->head != NULL)
        give_turn(c->head);
}

/* Fails every queued command.  Under c->lock. */
static void fail_queued(conn_t *c, int rc)
{
    fail_all(c->head, rc);
    c->head = c->tail = NULL;
    c->olen = 0;
}

/* Waits until fd is ready for `events`, no later than deadline:
 * RATE_OK, RATE_ETIMEDOUT, or RATE_ESTORE (the socket failed). */
static int wait_fd(int fd, short events, uint64_t deadline)
{
    for (;;) {
        uint64_t now = rate_clock_monotonic_ns();
        if (now >= deadline)
            return RATE_ETIMEDOUT;
        uint64_t left = deadline - now;
        int ms = left / 1000000 > INT_MAX ? INT_MAX
                                          : (int)((left + 999999) / 1000000);
        struct pollfd p = {fd, events, 0};
        int n = poll(&p, 1, ms);
        if (n > 0)
            return RATE_OK; /* readable, writable, or an error to read */
        if (n < 0 && errno != EINTR)
            return RATE_ESTORE;
    }
}

/* The reader's wait for a reply: until fd is readable, no later than the
 * earliest deadline in flight, looked at again every RECHECK_NS: a
 * command sent after the wait began may have an earlier deadline than
 * any before it (its call began earlier: the second command of a
 * decision).  Called without c->lock; *deadline is updated. */
static int wait_reply(conn_t *c, int fd, uint64_t *deadline)
{
    for (;;) {
        uint64_t now = rate_clock_monotonic_ns();
        uint64_t until = now < *deadline && *deadline - now > RECHECK_NS
                             ? now + RECHECK_NS
                             : *deadline;
        int rc = wait_fd(fd, POLLIN, until);
        if (rc != RATE_ETIMEDOUT || until == *deadline)
            return rc;
        pthread_mutex_lock(&c->lock);
        bool broken = c->broken;
        uint64_t d = first_deadline(c->fly);
        pthread_mutex_unlock(&c->lock);
        if (broken)
            return RATE_ESTORE; /* the writer failed: its error stands */
        if (d < *deadline)
            *deadline = d;
    }
}

static int send_all(int fd, const char *p, size_t n, uint64_t deadline)
{
    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            int rc = wait_fd(fd, POLLOUT, deadline);
            if (rc != RATE_OK)
                return rc;
            continue;
        }
        if (w < 0)
            return RATE_ESTORE;
        p += w;
        n -= (size_t)w;
    }
    return RATE_OK;
}

/* The writer: sends what is queued, a batch per write, until nothing is.
 * Connects first if need be (nothing is in flight then), by the first
 * queued command's deadline.  Called and returns with c->lock held. */
static void write_queued(redis_store_t *r, node_t *n, conn_t *c)
{
    c->writing = true;
    while (c->head != NULL && !c->broken) {
        if (c->ctx == NULL) {
            redisContext *ctx = NULL;
            uint64_t deadline = first_deadline(c->head);
            pthread_mutex_unlock(&c->lock);
            int rc = ensure_conn(r, n, c, deadline, &ctx);
            pthread_mutex_lock(&c->lock);
            c->ctx = ctx;
            if (rc != RATE_OK) {
                fail_queued(c, rc);
                break;
            }
        }
        char *buf = c->obuf; /* the queued bytes become the batch */
        size_t len = c->olen, cap = c->ocap;
        c->obuf = c->wbuf;
        c->ocap = c->wcap;
        c->olen = 0;
        c->wbuf = buf;
        c->wcap = cap;
        if (c->fly_tail != NULL)
            c->fly_tail->next = c->head;
        else
            c->fly = c->head;
        c->fly_tail = c->tail;
        c->head = c->tail = NULL;
        int fd = c->ctx->fd;
        uint64_t deadline = first_deadline(c->fly);
        pthread_mutex_unlock(&c->lock);
        int rc = send_all(fd, buf, len, deadline);
        pthread_mutex_lock(&c->lock);
        if (rc != RATE_OK)
            conn_break(c, rc);
    }
    c->writing = false;
    conn_settle(c);
}

/* The reader: reads replies in order and hands each to its caller, until
 * me's own has come or nothing is in flight; it waits no later than the
 * earliest deadline in flight, then fails them all.  A caller is told its
 * reply is there after the lock is let go, so that waking it (a system
 * call) never holds up the others.  Called and returns with c->lock
 * held. */
static void read_replies(conn_t *c, mreq_t *me)
{
    redisContext *ctx = c->ctx;
    mreq_t *answered = NULL; /* its reply is set; it is not told yet */

    c->reading = true;
    while (!is_done(me) && c->fly != NULL && !c->broken) {
        void *rep = NULL;
        int rc = RATE_OK;
        uint64_t deadline = first_deadline(c->fly);
        pthread_mutex_unlock(&c->lock);
        if (answered != NULL)
            mark_done(answered);
        answered = NULL;
        while (rc == RATE_OK && rep == NULL) {
            if (redisGetReplyFromReader(ctx, &rep) != REDIS_OK)
                rc = RATE_ESTORE; /* not the protocol: give up on it */
            else if (rep == NULL &&
                     (rc = wait_reply(c, ctx->fd, &deadline)) == RATE_OK &&
                     redisBufferRead(ctx) != REDIS_OK)
                rc = reply_status(ctx, NULL);
        }
        pthread_mutex_lock(&c->lock);
        if (c->broken) { /* the writer failed meanwhile */
            freeReplyObject(rep);
            break;
        }
        if (rc != RATE_OK) {
            conn_break(c, rc);
            break;
        }
        mreq_t *q = c->fly;
        if (q->skip > 0) { /* ASKING's +OK, before q's own reply */
            q->skip--;
            freeReplyObject(rep);
            continue;
        }
        if ((c->fly = q->next) == NULL)
            c->fly_tail = NULL;
        q->reply = rep;
        q->status = RATE_OK;
        if (q == me)
            atomic_fetch_or_explicit(&me->sig, SIG_DONE, memory_order_relaxed);
        else
            answered = q;
    }
    c->reading = false;
    conn_settle(c);
    if (answered != NULL) {
        pthread_mutex_unlock(&c->lock);
        mark_done(answered);
        pthread_mutex_lock(&c->lock);
    }
}

/* One command on one connection: *out is the reply (perhaps an error
 * reply) on RATE_OK; otherwise the connection failed (RATE_ESTORE,
 * RATE_ETIMEDOUT).  With asking, ASKING goes first, on the same
 * connection, and its reply is dropped. */
static int conn_call(redis_store_t *r, uint64_t dl, node_t *n, conn_t *c,
                     bool asking, int argc, const char **argv,
                     const size_t *lens, redisReply **out)
{
    mreq_t me = {NULL, RATE_OK, 0, NULL, 0, asking ? 1 : 0};
    char *cmd;
    static const char ask[] = "*1\r\n$6\r\nASKING\r\n";
    size_t pre = asking ? sizeof ask - 1 : 0;
    int len = redisFormatCommandArgv(&cmd, argc, argv, lens);

    *out = NULL;
    if (len < 0)
        return RATE_ENOMEM;
    if (rate_clock_monotonic_ns() >= dl) {
        redisFreeCommand(cmd);
        return RATE_ETIMEDOUT; /* its call's time is up (redirections) */
    }
    pthread_mutex_lock(&c->lock);
    me.deadline_ns = dl;
    if (c->olen + pre + (size_t)len > c->ocap) {
        size_t cap = c->ocap ? c->ocap : 4096;
        while (cap < c->olen + pre + (size_t)len)
            cap *= 2;
        char *p = realloc(c->obuf, cap);
        if (p == NULL) {
            pthread_mutex_unlock(&c->lock);
            redisFreeCommand(cmd);
            return RATE_ENOMEM;
        }
        c->obuf = p;
        c->ocap = cap;
    }
    memcpy(c->obuf + c->olen, ask, pre);
    memcpy(c->obuf + c->olen + pre, cmd, (size_t)len);
    c->olen += pre + (size_t)len;
    redisFreeCommand(cmd);
    if (c->tail != NULL)
        c->tail->next = &me;
    else
        c->head = &me;
    c->tail = &me;
    for (;;) {
        if (!c->writing && c->head != NULL && !c->broken) {
            write_queued(r, n, c);
            continue;
        }
        if (!c->reading && c->fly != NULL && !c->broken) {
            if (!is_done(&me)) {
                read_replies(c, &me);
                continue;
            }
            give_turn(c->fly); /* hand the reading on */
        }
        uint32_t seen = atomic_load_explicit(&me.sig, memory_order_acquire);
        if (seen & SIG_DONE)
            break;
        pthread_mutex_unlock(&c->lock);
        uint32_t now;
        while ((now = atomic_load_explicit(&me.sig, memory_order_acquire)) ==
               seen)
            syscall(SYS_futex, &me.sig, FUTEX_WAIT_PRIVATE, seen, NULL, NULL,
                    0);
        if (now & SIG_DONE) { /* answered: no role to look after */
            *out = me.reply;
            return me.status;
        }
        pthread_mutex_lock(&c->lock);
    }
    pthread_mutex_unlock(&c->lock);
    *out = me.reply;
    return me.status;
}

/* ---------------------------------------------------------------- nodes */

/* One command on node n, through its breaker: open, the call fails at once
 * (RATE_ESTORE); cooled down, one call at a time is let through as the
 * probe, and reconnects at once. */
static int call_node(redis_store_t *r, uint64_t dl, node_t *n, bool asking,
                     int argc, const char **argv, const size_t *lens,
                     redisReply **out)
{
    bool probe = false;
    *out = NULL;
    if (rate_clock_monotonic_ns() >= dl)
        return RATE_ETIMEDOUT; /* the call's time is up before this command
                                  was sent: nothing of the node's doing */
    if (r->breaker) {
        uint64_t until = atomic_load(&n->open_until_ns);
        if (until != 0) {
            bool f = false;
            if (rate_clock_monotonic_ns() < until ||
                !atomic_compare_exchange_strong(&n->probing, &f, true)) {
                atomic_fetch_add(&r->st_rejected, 1);
                return RATE_ESTORE;
            }
            probe = true;
            for (unsigned i = 0; i < n->nconns; i++)
                atomic_store(&n->conns[i].retry_at_ns, 0);
        }
    }
    unsigned i = atomic_fetch_add_explicit(&n->next_conn, 1,
                                           memory_order_relaxed);
    int rc = conn_call(r, dl, n, &n->conns[i % n->nconns], asking, argc,
                       argv, lens, out);
    if (!r->breaker)
        return rc;
    if (rc == RATE_ENOMEM) { /* says nothing of the server */
        if (probe)
            atomic_store(&n->probing, false);
        return rc;
    }
    if (rc == RATE_OK) {
        atomic_store(&n->fails, 0);
        if (probe) {
            atomic_store(&n->open_until_ns, 0);
            atomic_store(&n->probing, false);
        }
    } else if (probe) {
        atomic_store(&n->open_until_ns,
                     rate_clock_monotonic_ns() + r->breaker_cooldown_ns);
        atomic_store(&n->probing, false);
        atomic_fetch_add(&r->st_opened, 1);
    } else if (atomic_fetch_add(&n->fails, 1) + 1 >= r->breaker_failures) {
        uint64_t zero = 0;
        if (atomic_compare_exchange_strong(
                &n->open_until_ns, &zero,
                rate_clock_monotonic_ns() + r->breaker_cooldown_ns))
            atomic_fetch_add(&r->st_opened, 1);
        atomic_store(&n->fails, 0);
    }
    return rc;
}

static void node_free(node_t *n)
{
    if (n == NULL)
        return;
    for (unsigned i = 0; n->conns != NULL && i < n->nconns; i++) {
        if (n->conns[i].ctx != NULL)
            redisFree(n->conns[i].ctx);
        free(n->conns[i].obuf);
        free(n->conns[i].wbuf);
        pthread_mutex_destroy(&n->conns[i].lock);
    }
    free(n->conns);
    free(n);
}

/* The node host:port, made if it is new (under node_lock, taken here).
 * NULL when out of memory or MAX_NODES are known. */
static node_t *node_get_in(redis_store_t *r, const char *host, int port)
{
    unsigned k = atomic_load(&r->nnodes);
    for (unsigned i = 0; i < k; i++) {
        node_t *n = atomic_load(&r->nodes[i]);
        if (n->port == port && strcmp(n->host, host) == 0)
            return n;
    }
    if (k == MAX_NODES || strlen(host) >= RC_HOST_MAX)
        return NULL;
    node_t *n = calloc(1, sizeof *n);
    if (n == NULL || (n->conns = calloc(r->pool, sizeof *n->conns)) == NULL) {
        free(n);
        return NULL;
    }
    snprintf(n->host, sizeof n->host, "%s", host);
    n->port = port;
    n->nconns = r->pool;
    for (unsigned i = 0; i < n->nconns; i++)
        pthread_mutex_init(&n->conns[i].lock, NULL);
    atomic_store(&r->nodes[k], n);
    atomic_store(&r->nnodes, k + 1);
    return n;
}

static node_t *node_get(redis_store_t *r, const char *host, int port)
{
    pthread_mutex_lock(&r->node_lock);
    node_t *n = node_get_in(r, host, port);
    pthread_mutex_unlock(&r->node_lock);
    return n;
}

/* The node host:port if known, without the lock. */
static node_t *node_find(redis_store_t *r, const char *host, int port)
{
    unsigned k = atomic_load(&r->nnodes);
    for (unsigned i = 0; i < k; i++) {
        node_t *n = atomic_load(&r->nodes[i]);
        if (n->port == port && strcmp(n->host, host) == 0)
            return n;
    }
    return NULL;
}

static unsigned node_index(redis_store_t *r, const node_t *n)
{
    unsigned k = atomic_load(&r->nnodes);
    for (unsigned i = 0; i < k; i++)
        if (atomic_load(&r->nodes[i]) == n)
            return i;
    return MAX_NODES;
}

/* Puts a CLUSTER SLOTS reply in the map (slots it does not name: none
 * known).  Under topo_lock.  False for a reply that does not parse. */
static bool apply_slots(redis_store_t *r, const redisReply *rep,
                        const char *self_host)
{
    size_t nr, cap = rep->type == REDIS_REPLY_ARRAY ? rep->elements : 0;
    rc_range_t *ranges = malloc((cap ? cap : 1) * sizeof *ranges);
    uint8_t *map = calloc(RC_SLOTS, 1);
    bool ok = ranges != NULL && map != NULL &&
              rc_parse_slots(rep, self_host, ranges, cap, &nr);
    for (size_t i = 0; ok && i < nr; i++) {
        node_t *n = node_get(r, ranges[i].host, ranges[i].port);
        unsigned idx = n ? node_index(r, n) : MAX_NODES;
        ok = idx < MAX_NODES;
        for (unsigned s = ranges[i].first; ok && s <= ranges[i].last; s++)
            map[s] = (uint8_t)(idx + 1);
    }
    for (unsigned s = 0; ok && s < RC_SLOTS; s++)
        atomic_store_explicit(&r->slot_node[s], map[s], memory_order_relaxed);
    if (ok)
        atomic_fetch_add(&r->st_refreshes, 1);
    free(ranges);
    free(map);
    return ok;
}

/* CLUSTER SLOTS on node n for a map refresh: outside the node's breaker,
 * which counts the calls made on the node for keys alone (the refresh of a
 * call that failed on another node, with that call's deadline, is no
 * failure of this one); a node whose breaker is open is skipped at once. */
static int refresh_call(redis_store_t *r, uint64_t dl, node_t *n,
                        redisReply **out)
{
    *out = NULL;
    if (r->breaker && atomic_load(&n->open_until_ns) != 0)
        return RATE_ESTORE;
    unsigned i = atomic_fetch_add_explicit(&n->next_conn, 1,
                                           memory_order_relaxed);
    return conn_call(r, dl, n, &n->conns[i % n->nconns], false, 2,
                     (const char *[]){"CLUSTER", "SLOTS"}, (size_t[]){7, 5},
                     out);
}

/* Reads the slot map again from the first node that answers (the masters
 * known, then the seeds not among them), at most once per REFRESH_MIN_NS
 * unless forced.  Whoever finds another thread refreshing goes on without
 * waiting. */
static void refresh_map(redis_store_t *r, uint64_t dl, bool force)
{
    uint64_t now = rate_clock_monotonic_ns();
    if (!r->cluster ||
        (!force && now < atomic_load(&r->refreshed_at_ns) + REFRESH_MIN_NS))
        return;
    if (pthread_mutex_trylock(&r->topo_lock) != 0)
        return;
    atomic_store(&r->refreshed_at_ns, now);
    unsigned k = atomic_load(&r->nnodes);
    bool done = false;
    for (unsigned j = 0; j < k + r->nseeds && !done; j++) {
        node_t *n = NULL;
        if (j < k)
            n = atomic_load(&r->nodes[j]);
        else if (node_find(r, r->seeds[j - k].host, r->seeds[j - k].port) ==
                 NULL) /* a known node is not asked twice */
            n = node_get(r, r->seeds[j - k].host,
                                r->seeds[j - k].port);
        redisReply *rep = NULL;
        if (n == NULL || rate_clock_monotonic_ns() >= dl)
            continue;
        int rc = refresh_call(r, dl, n, &rep);
        done = rc == RATE_OK && rep->type == REDIS_REPLY_ARRAY &&
               apply_slots(r, rep, n->host);
        freeReplyObject(rep);
    }
    pthread_mutex_unlock(&r->topo_lock);
}

/* Finds the topology from the seeds: the first that answers tells whether
 * it is a cluster (its slot map) or a single server (kept as the one
 * node, its connection the node's first).  With wait false (a call on a
 * lazy store) it does nothing while another thread tries, or before the
 * backoff since the last failed try is over: RATE_ESTORE at once. */
static int discover(redis_store_t *r, uint64_t dl, bool wait, char *err,
                    size_t errlen)
{
    char e[256] = "";
    int rc = RATE_ESTORE;

    if (wait)
        pthread_mutex_lock(&r->topo_lock);
    else if (pthread_mutex_trylock(&r->topo_lock) != 0)
        return RATE_ESTORE;
    uint64_t now = rate_clock_monotonic_ns();
    if (atomic_load(&r->ready)) {
        pthread_mutex_unlock(&r->topo_lock);
        return RATE_OK;
    }
    if (!wait && now < r->topo_retry_at_ns) {
        pthread_mutex_unlock(&r->topo_lock);
        return RATE_ESTORE;
    }
    for (unsigned i = 0; i < r->nseeds && rc != RATE_OK; i++) {
        redisContext *ctx = NULL;
        redisReply *slots = NULL;
        uint64_t deadline = wait ? rate_clock_monotonic_ns() +
                                       r->connect_ns + r->command_ns
                                 : dl;
        rc = open_conn(r, r->seeds[i].host, r->unix_socket ? 0 : r->seeds[i].port,
                       deadline, r->unix_socket ? NULL : &slots, &ctx, e,
                       sizeof e);
        if (rc == RATE_EINVAL)
            break; /* a database in a cluster: no other seed will do */
        if (rc != RATE_OK) {
            atomic_fetch_add(&r->st_connect_failures, 1);
            continue;
        }
        node_t *n = NULL;
        if (slots != NULL) {
            r->cluster = true;
            if (!apply_slots(r, slots, r->seeds[i].host)) {
                rc = RATE_ESTORE;
                snprintf(e, sizeof e, "%.200s:%d: CLUSTER SLOTS: a reply that "
                         "does not parse", r->seeds[i].host, r->seeds[i].port);
                r->cluster = false;
            }
            redisFree(ctx); /* the masters get their own */
        } else if ((n = node_get(r, r->seeds[i].host,
                                        r->unix_socket ? 0
                                                       : r->seeds[i].port)) ==
                   NULL) {
            redisFree(ctx);
            rc = RATE_ENOMEM;
            snprintf(e, sizeof e, "out of memory");
        } else {
            n->conns[0].ctx = ctx;
        }
        freeReplyObject(slots);
    }
    if (rc == RATE_OK) {
        atomic_store(&r->refreshed_at_ns, rate_clock_monotonic_ns());
        atomic_store(&r->ready, true);
        set_err(r, "");
    } else {
        r->topo_backoff_ns = r->topo_backoff_ns ? r->topo_backoff_ns * 2
                                                : BACKOFF_MIN_NS;
        if (r->topo_backoff_ns > BACKOFF_MAX_NS)
            r->topo_backoff_ns = BACKOFF_MAX_NS;
        r->topo_retry_at_ns = rate_clock_monotonic_ns() + r->topo_backoff_ns;
        set_err(r, e);
        rate__fail(err, errlen, rc, "%s", e);
    }
    pthread_mutex_unlock(&r->topo_lock);
    return rc;
}

static void sleep_ns(uint64_t ns)
{
    struct timespec ts = {(time_t)(ns / RATE_NS_PER_S),
                          (long)(ns % RATE_NS_PER_S)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

/* One command about the key name (NULL: any node will do): on the single
 * server, or on the master of the key's slot, following MOVED (the map
 * mended and refreshed), ASK (ASKING there, once) and TRYAGAIN (after a
 * pause), MAX_REDIRECTS of them at most, after which the last
 * redirection's error reply is the answer.  Same results as conn_call. */
static int kcall(redis_store_t *r, uint64_t dl, const char *key, size_t klen,
                 int argc, const char **argv, const size_t *lens,
                 redisReply **out)
{
    int rc;
    *out = NULL;
    if (!atomic_load_explicit(&r->ready, memory_order_acquire) &&
        (rc = discover(r, dl, false, NULL, 0)) != RATE_OK)
        return rc;
    if (!r->cluster)
        return call_node(r, dl, atomic_load(&r->nodes[0]), false, argc, argv,
                         lens, out);
    unsigned slot = key ? rc_key_slot(key, klen) : 0;
    node_t *n = NULL;
    bool asking = false;
    for (unsigned redirs = 0;; redirs++) {
        if (!asking) {
            unsigned idx = atomic_load_explicit(&r->slot_node[slot],
                                                memory_order_relaxed);
            if (idx == 0) { /* no master known: ask the cluster */
                refresh_map(r, dl, false);
                idx = atomic_load_explicit(&r->slot_node[slot],
                                           memory_order_relaxed);
            }
            if (idx == 0) {
                char e[64];
                snprintf(e, sizeof e, "no master serves slot %u", slot);
                set_err(r, e);
                return RATE_ESTORE;
            }
            n = atomic_load(&r->nodes[idx - 1]);
        }
        rc = call_node(r, dl, n, asking, argc, argv, lens, out);
        asking = false;
        if (rc != RATE_OK) {
            refresh_map(r, dl, false); /* a master gone: its replica, later */
            return rc;
        }
        redisReply *rep = *out;
        if (rep->type != REDIS_REPLY_ERROR || redirs == MAX_REDIRECTS)
            return RATE_OK;
        char host[RC_HOST_MAX];
        unsigned s;
        int port;
        rc_redirect_t kind = rc_parse_redirect(rep->str, rep->len, n->host,
                                               &s, host, &port);
        if (kind == RC_NONE) {
            if (strncmp(rep->str, "CLUSTERDOWN", 11) == 0) {
                /* The node refuses until its cluster state is ok again
                 * (a new cluster's masters: about the node timeout after
                 * creation): a store error, which last_error explains. */
                char e[240];
                snprintf(e, sizeof e, "%.100s:%d: %.120s", n->host, n->port,
                         rep->str);
                set_err(r, e);
                refresh_map(r, dl, false);
            }
            return RATE_OK;
        }
        node_t *to = NULL;
        if (kind != RC_TRYAGAIN) {
            if ((to = node_find(r, host, port)) == NULL) {
                to = node_get(r, host, port); /* a node new to us */
            }
            unsigned idx = to ? node_index(r, to) : MAX_NODES;
            if (kind == RC_MOVED && idx < MAX_NODES)
                atomic_store(&r->slot_node[s], (uint8_t)(idx + 1));
            if (to == NULL)
                return RATE_OK; /* no room for the node: the error stands */
        }
        freeReplyObject(rep);
        *out = NULL;
        atomic_fetch_add(&r->st_redirects, 1);
        if (kind == RC_MOVED)
            refresh_map(r, dl, false);
        else if (kind == RC_ASK)
            n = to, asking = true;
        else if (rate_clock_monotonic_ns() + TRYAGAIN_NS < dl)
            sleep_ns(TRYAGAIN_NS);
        else
            return RATE_ETIMEDOUT;
    }
}

/* A key's expiry in whole microseconds, rounded up (never less than
 * reset_after) and at least 1 (0 says none): the scripts count it from
 * Redis's TIME and set the key's end with PEXPIREAT (EXPIRE_AT_LUA). */
static uint64_t ttl_us(uint64_t ns)
{
    uint64_t us = ns / 1000 + (ns % 1000 != 0);
    return us ? us : 1;
}

/* A call's status, with an error reply counted as a store error, but
 * WRONGTYPE (the key is no hash: not a state of ours) as a corrupt one.
 * From a script, Redis 7 starts the message with it; older ones put it
 * after "ERR Error running script ...": look for it anywhere. */
static int reply_ok(int rc, const redisReply *rep)
{
    if (rc != RATE_OK)
        return rc;
    if (rep->type != REDIS_REPLY_ERROR)
        return RATE_OK;
    return rep->str != NULL && strstr(rep->str, "WRONGTYPE") != NULL
               ? RATE_ECORRUPT
               : RATE_ESTORE;
}

/* ----------------------------------------------------------------- keys */

/* The Redis name of a key (see the top of the file) into buf, or the heap
 * if it does not fit (free it when *out != buf).  RATE_EINVAL for no bytes
 * or an unknown space. */
static int full_key(const redis_store_t *r, const rate_key_t *key, char *buf,
                    size_t cap, char **out, size_t *out_len)
{
    static const char hex[] = "0123456789abcdef";
    size_t body = 0, open;
    bool esc = false;

    *out = NULL;
    if (key == NULL || key->bytes == NULL || key->len == 0)
        return RATE_EINVAL;
    switch (key->space) {
    case RATE_SPACE_STATE:
    case RATE_SPACE_SHADOW:
        esc = memchr(key->bytes, '}', key->len) != NULL;
        for (size_t i = 0; i < key->len; i++) {
            char ch = ((const char *)key->bytes)[i];
            body += esc && (ch == '}' || ch == '%') ? 3 : 1;
        }
        open = (size_t)1 + (key->space == RATE_SPACE_SHADOW) + esc;
        break;
    case RATE_SPACE_POLICY: open = 2, body = key->len * 2; break;
    default: return RATE_EINVAL;
    }
    size_t n = r->prefix_len + open + body + 1;
    char *k = n <= cap ? buf : malloc(n);
    if (k == NULL)
        return RATE_ENOMEM;
    memcpy(k, r->prefix, r->prefix_len);
    char *p = k + r->prefix_len;
    if (esc)
        *p++ = 'e';
    if (key->space == RATE_SPACE_SHADOW)
        *p++ = 's';
    else if (key->space == RATE_SPACE_POLICY)
        *p++ = 'p';
    *p++ = '{';
    if (key->space == RATE_SPACE_POLICY) {
        for (size_t i = 0; i < key->len; i++) {
            unsigned char b = (unsigned char)key->bytes[i];
            *p++ = hex[b >> 4];
            *p++ = hex[b & 15];
        }
    } else if (esc) {
        for (size_t i = 0; i < key->len; i++) {
            char ch = ((const char *)key->bytes)[i];
            if (ch == '}' || ch == '%') {
                *p++ = '%';
                *p++ = ch == '%' ? '2' : '7';
                *p++ = ch == '%' ? '5' : 'd';
            } else {
                *p++ = ch;
            }
        }
    } else {
        memcpy(p, key->bytes, key->len);
        p += key->len;
    }
    *p = '}';
    *out = k;
    *out_len = n;
    return RATE_OK;
}

/* Whether a name is one the store writes under its prefix (see the top of
 * the file): PREFIX, then "", "s", "p", "e" or "es", then "{", a body of at
 * least one byte with no '}', and "}" to end it. */
static bool own_name(const redis_store_t *r, const char *s, size_t len)
{
    if (len < r->prefix_len + 3 || memcmp(s, r->prefix, r->prefix_len) != 0 ||
        s[len - 1] != '}')
        return false;
    const char *p = s + r->prefix_len, *end = s + len - 1;
    if (*p == 'e')
        p++;
    if (*p == 's' || (*p == 'p' && p == s + r->prefix_len))
        p++;
    if (p >= end || *p != '{' || p + 1 == end)
        return false;
    return memchr(p + 1, '}', (size_t)(end - p - 1)) == NULL;
}
/* ------------------------------------------------------------- contract */

static int parse_version(const redisReply *v, uint64_t *out)
{
    if (v->type == REDIS_REPLY_NIL) {
        *out = 0;
        return RATE_OK;
    }
    if (v->type != REDIS_REPLY_STRING || v->len > 19 ||
        !rate__parse_decimal(v->str, v->len, UINT64_MAX, out))
        return RATE_ECORRUPT;
    return RATE_OK;
}

int rate__redis_reply_ok(int rc, const redisReply *rep)
{
    return reply_ok(rc, rep);
}

void rate__redis_cmd_free(rate__redis_cmd_t *c)
{
    if (c->k != NULL && c->k != c->kb)
        free(c->k);
    c->k = NULL;
}

/* Whether a reply is NOSCRIPT (Redis restarted, or SCRIPT FLUSH). */
bool rate__redis_noscript(const redisReply *rep)
{
    return rep != NULL && rep->type == REDIS_REPLY_ERROR && rep->str != NULL &&
           strncmp(rep->str, "NOSCRIPT", 8) == 0;
}

/* Turns an EVALSHA (or FCALL) command into the EVAL of its script. */
void rate__redis_cmd_eval(rate__redis_cmd_t *c)
{
    c->av[0] = "EVAL", c->al[0] = 4;
    c->av[1] = c->script, c->al[1] = c->script_len;
}

/* A command's start: empty, and the key's name in it. */
static int cmd_key(const redis_store_t *r, const rate_key_t *key,
                   rate__redis_cmd_t *c)
{
    c->argc = 0;
    c->lean = -1;
    c->k = NULL;
    return full_key(r, key, c->kb, sizeof c->kb, &c->k, &c->kl);
}

/* The command of a load (HMGET of the version and the state). */
int rate__redis_load_cmd(const redis_store_t *r, const rate_key_t *key,
                         rate__redis_cmd_t *c)
{
    int rc;

    if ((rc = cmd_key(r, key, c)) != RATE_OK)
        return rc;
    c->argc = 4;
    c->av[0] = "HMGET", c->al[0] = 5;
    c->av[1] = c->k, c->al[1] = c->kl;
    c->av[2] = "v", c->al[2] = 1;
    c->av[3] = "s", c->al[3] = 1;
    c->script = NULL;
    c->script_len = 0;
    return RATE_OK;
}

/* A load's reply (after reply_ok): *state points into rep (NULL and 0
 * with *version 0 when absent). */
int rate__redis_load_parse(const redisReply *rep, const char **state,
                           size_t *len, uint64_t *version)
{
    int rc;

    *state = NULL;
    *len = 0;
    *version = 0;
    if (rep->type != REDIS_REPLY_ARRAY || rep->elements != 2)
        return RATE_ECORRUPT;
    if ((rc = parse_version(rep->element[0], version)) != RATE_OK)
        return rc;
    redisReply *e = rep->element[1];
    if (*version == 0 || e->type == REDIS_REPLY_NIL) {
        *version = 0; /* absent (or half-written: treat as absent) */
        return RATE_OK;
    }
    if (e->type != REDIS_REPLY_STRING || e->len == 0)
        return RATE_ECORRUPT; /* present, but no state: truncated */
    *state = e->str;
    *len = e->len;
    return RATE_OK;
}

static int r_load(void *self, const rate_key_t *key, void *buf, size_t cap,
                  size_t *len, uint64_t *version)
{
    redis_store_t *r = self;
    rate__redis_cmd_t c;
    int rc;

    *len = 0;
    *version = 0;
    if ((rc = rate__redis_load_cmd(r, key, &c)) != RATE_OK)
        return rc;
    redisReply *rep = NULL;
    rc = kcall(r, deadline_of(r), c.k, c.kl, c.argc, c.av, c.al, &rep);
    rc = reply_ok(rc, rep);
    if (rc == RATE_OK) {
        const char *st;
        if ((rc = rate__redis_load_parse(rep, &st, len, version)) == RATE_OK &&
            *len > 0) {
            if (*len > cap)
                rc = RATE_EINVAL; /* the limiter retries with more room */
            else
                memcpy(buf, st, *len);
        }
    }
    freeReplyObject(rep);
    rate__redis_cmd_free(&c);
    return rc;
}

/* The command of a compare-and-set (EVALSHA of cas_script); the state's
 * bytes stay the caller's. */
int rate__redis_cas_cmd(const redis_store_t *r, const rate_key_t *key,
                        uint64_t version, const void *state, size_t len,
                        uint64_t ttl_ns, rate__redis_cmd_t *c)
{
    int rc;

    if ((rc = cmd_key(r, key, c)) != RATE_OK)
        return rc;
    snprintf(c->num[0], sizeof c->num[0], "%llu", (unsigned long long)version);
    /* 0: no expiry (the script PERSISTs the key): for RATE_TTL_FOREVER
     * (the policy records) whatever the options, and for everything else
     * with no_ttl, unless it has a safety expiry. */
    uint64_t us = ttl_ns == RATE_TTL_FOREVER ? 0
                  : !r->ttl                  ? r->safety_us
                                             : ttl_us(ttl_ns);
    snprintf(c->num[1], sizeof c->num[1], "%llu", (unsigned long long)us);
    const char *av[7] = {"EVALSHA", r->sha, "1", c->k, c->num[0], state,
                         c->num[1]};
    size_t al[7] = {7, 40, 1, c->kl, strlen(c->num[0]), len,
                    strlen(c->num[1])};
    memcpy(c->av, av, sizeof av);
    memcpy(c->al, al, sizeof al);
    c->argc = 7;
    c->script = cas_script;
    c->script_len = sizeof cas_script - 1;
    return RATE_OK;
}

/* A compare-and-set's reply (after reply_ok). */
int rate__redis_cas_parse(const redisReply *rep)
{
    return rep->type != REDIS_REPLY_INTEGER ? RATE_ECORRUPT
           : rep->integer == 0              ? RATE_ECONFLICT
                                            : RATE_OK;
}

static int r_cas(void *self, const rate_key_t *key, uint64_t version,
                 const void *state, size_t len, uint64_t ttl_ns)
{
    redis_store_t *r = self;
    rate__redis_cmd_t c;
    int rc;

    if ((rc = rate__redis_cas_cmd(r, key, version, state, len, ttl_ns, &c)) !=
        RATE_OK)
        return rc;
    redisReply *rep = NULL;
    uint64_t dl = deadline_of(r);
    rc = kcall(r, dl, c.k, c.kl, c.argc, c.av, c.al, &rep);
    if (rc == RATE_OK && rate__redis_noscript(rep)) {
        /* Redis restarted or SCRIPT FLUSH: send the script itself. */
        freeReplyObject(rep);
        rate__redis_cmd_eval(&c);
        rep = NULL;
        rc = kcall(r, dl, c.k, c.kl, c.argc, c.av, c.al, &rep);
    }
    rc = reply_ok(rc, rep);
    if (rc == RATE_OK)
        rc = rate__redis_cas_parse(rep);
    freeReplyObject(rep);
    rate__redis_cmd_free(&c);
    return rc;
}

/* Whether every number the Lua step meets stays below 2^50, where doubles
 * are exact with room for the products it forms. */
#define LUA_EXACT (UINT64_C(1) << 50)

static bool lua_can(const rate_decide_req_t *q)
{
    const rate_policy_t *p = q->policy;
    size_t count = rate_policy_count(p);
    if (q->permits >= LUA_EXACT || q->max_wait_ns >= LUA_EXACT ||
        count == 0 || count > RATE_MAX_LIMITS)
        return false;
    for (size_t i = 0; i < count; i++) {
        const rate_limit_t *l = rate_policy_limit(p, i);
        if (l == NULL)
            return false;
        rate_u128_t prod = (rate_u128_t)l->period_ns *
                           (l->burst ? l->burst : l->limit);
        if (l->limit >= LUA_EXACT || l->period_ns >= LUA_EXACT ||
            prod * 2 >= LUA_EXACT)
            return false;
        if (l->block_ns != 0) /* a block's state is the C step's alone */
            return false;
    }
    return true;
}

static uint64_t gcd64(uint64_t a, uint64_t b)
{
    while (b != 0) {
        uint64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

/* Whether a lean script decides the request exactly (docs/redis.md, "Lean
 * scripts"), and if so which, with its own arguments (after the seven
 * every step script takes: the word's width, the operation, then the
 * algorithm's) in num.  A bucket's word is sent in units of g,
 * a common divisor of L and P below 2^36, so that B * P / g <= 2^51; a
 * window of at most 2^52 ns and a count of at most 2^52. */
#define LEAN_WORD (UINT64_C(1) << 51)
#define LEAN_G UINT64_C(10000000000) /* 10^10: g divides it, so g < 2^36 */

static int lean_of(const rate_decide_req_t *q, char num[][24], int *nn)
{
    const rate_policy_t *p = q->policy;
    if (rate_policy_count(p) != 1)
        return -1;
    const rate_limit_t *l = rate_policy_limit(p, 0);
    if (l == NULL || l->block_ns != 0 || l->limit == 0 || l->period_ns == 0)
        return -1;
    if (l->algorithm == RATE_TOKEN_BUCKET ||
        l->algorithm == RATE_LEAKY_BUCKET) {
        rate_u128_t full = (rate_u128_t)l->burst * l->period_ns;
        uint64_t g = gcd64(gcd64(l->limit, l->period_ns), LEAN_G);
        if (l->burst == 0 || full / g > LEAN_WORD)
            return -1; /* past exact doubles */
        /* the word's width: 16 bytes for a wide bucket (B * P > 2^62) */
        snprintf(num[(*nn)++], 24, "%d", full > (rate_u128_t)1 << 62 ? 16 : 8);
        snprintf(num[(*nn)++], 24, "%d", (int)q->op);
        snprintf(num[(*nn)++], 24, "%llu", (unsigned long long)(l->limit / g));
        snprintf(num[(*nn)++], 24, "%llu",
                 (unsigned long long)(l->period_ns / g));
        snprintf(num[(*nn)++], 24, "%llu", (unsigned long long)l->burst);
        snprintf(num[(*nn)++], 24, "%llu", (unsigned long long)g);
        if (l->algorithm == RATE_LEAKY_BUCKET)
            return LEAN_LB;
        snprintf(num[(*nn)++], 24, "%llu",
                 (unsigned long long)((UINT64_C(1) << 62) / g));
        return LEAN_TB;
    }
    if (l->algorithm == RATE_FIXED_WINDOW) {
        if (l->limit > (UINT64_C(1) << 52) ||
            l->period_ns >= (UINT64_C(1) << 52))
            return -1;
        snprintf(num[(*nn)++], 24, "8");
        snprintf(num[(*nn)++], 24, "%d", (int)q->op);
        snprintf(num[(*nn)++], 24, "%llu", (unsigned long long)l->limit);
        snprintf(num[(*nn)++], 24, "%llu", (unsigned long long)l->period_ns);
        return LEAN_FW;
    }
    return -1;
}

static uint64_t reply_u64(const redisReply *e, bool *ok)
{
    if (e->type != REDIS_REPLY_INTEGER || e->integer < -1) {
        *ok = false;
        return 0;
    }
    return e->integer == -1 ? RATE_NEVER : (uint64_t)e->integer;
}

/* Redis's TIME in ns: RATE_ECORRUPT for a reply that is not two numbers
 * (or a time past RATE_TIME_MAX). */
static int redis_now(redis_store_t *r, uint64_t *out)
{
    redisReply *rep = NULL;
    uint64_t s, us;
    int rc = kcall(r, deadline_of(r), NULL, 0, 1, (const char *[]){"TIME"},
                   (size_t[]){4}, &rep);
    rc = reply_ok(rc, rep);
    if (rc == RATE_OK) {
        if (rep->type != REDIS_REPLY_ARRAY || rep->elements != 2 ||
            rep->element[0]->type != REDIS_REPLY_STRING ||
            rep->element[1]->type != REDIS_REPLY_STRING ||
            !rate__parse_decimal(rep->element[0]->str, rep->element[0]->len,
                                 RATE_TIME_MAX / RATE_NS_PER_S - 1, &s) ||
            !rate__parse_decimal(rep->element[1]->str, rep->element[1]->len,
                                 999999, &us))
            rc = RATE_ECORRUPT;
        else
            *out = s * RATE_NS_PER_S + us * 1000;
    }
    freeReplyObject(rep);
    return rc;
}

/* The store's clock: Redis's TIME, one clock for every client.  With
 * client_time, RATE_ENOTSUP: the limiter keeps to its own clock. */
static int r_now(void *self, uint64_t *now_ns)
{
    redis_store_t *r = self;

    if (!r->redis_time)
        return RATE_ENOTSUP;
    return redis_now(r, now_ns);
}

/* The step's first seven arguments (see redis_step.lua), which the lean
 * scripts and RATELIMIT.STEP take too: the time ("" "": Redis's TIME),
 * permits, max_wait, the expiry (0 none, -1 the decision's reset_after,
 * else microseconds, or milliseconds for the module: rounded up), the
 * policy's id and the state's format.  Returns how many it wrote. */
static int step_head(const redis_store_t *r, const rate_decide_req_t *q,
                     bool ms, char (*num)[24])
{
    int nn = 0;
    uint64_t ttl = !r->ttl ? r->safety_us /* 0: none */
                           : ttl_us(q->max_reset_ns);
    if (ms)
        ttl = (ttl + 999) / 1000;
    if (r->redis_time && q->clock_time) {
        num[nn++][0] = '\0';
        num[nn++][0] = '\0';
    } else {
        snprintf(num[nn++], 24, "%llu",
                 (unsigned long long)(q->now_ns / RATE_NS_PER_S));
        snprintf(num[nn++], 24, "%llu",
                 (unsigned long long)(q->now_ns % RATE_NS_PER_S));
    }
    snprintf(num[nn++], 24, "%llu", (unsigned long long)q->permits);
    snprintf(num[nn++], 24, "%llu", (unsigned long long)q->max_wait_ns);
    /* the step uses the exact reset: a detailed decision's, a change's */
    if (r->ttl && (q->detail || q->op != RATE_DECIDE_ACQUIRE))
        snprintf(num[nn++], 24, "-1");
    else
        snprintf(num[nn++], 24, "%llu", (unsigned long long)ttl);
    snprintf(num[nn++], 24, "%lu", (unsigned long)q->policy_id);
    snprintf(num[nn++], 24, "%u", (unsigned)q->format);
    return nn;
}

/* The general step's four arguments per limit, after the head. */
static int step_limits(const rate_policy_t *p, char (*num)[24], int nn)
{
    for (size_t i = 0; i < rate_policy_count(p); i++) {
        const rate_limit_t *l = rate_policy_limit(p, i);
        snprintf(num[nn++], 24, "%d", (int)l->algorithm);
        snprintf(num[nn++], 24, "%llu", (unsigned long long)l->limit);
        snprintf(num[nn++], 24, "%llu", (unsigned long long)l->period_ns);
        snprintf(num[nn++], 24, "%llu", (unsigned long long)l->burst);
    }
    return nn;
}

/* The command of a decide(): EVALSHA of a lean script when one decides
 * the request exactly (c->lean its index), else of the general step (see
 * redis_step.lua for the arguments and replies).  RATE_ENOTSUP when no
 * script can decide it exactly (the limiter then decides itself, and
 * reads now() itself if it goes by Redis's clock); RATE_EINVAL for a key
 * of the policy space. */
int rate__redis_decide_cmd(const redis_store_t *r, const rate_key_t *key,
                           const rate_decide_req_t *q, rate__redis_cmd_t *c)
{
    int rc;

    c->argc = 0;
    c->lean = -1;
    c->k = NULL; /* nothing to free before cmd_key */
    if (key != NULL && key->space == RATE_SPACE_POLICY)
        return RATE_EINVAL; /* records are no states to decide over */
    if (q->format != RATE__FORMAT_V1 && q->format != RATE__FORMAT)
        return RATE_ENOTSUP; /* the limiter decides, exactly */
    bool adjust = q->op != RATE_DECIDE_ACQUIRE;
    if (adjust && q->op != RATE_DECIDE_REFUND && q->op != RATE_DECIDE_PENALTY)
        return RATE_ENOTSUP; /* an operation this store does not know */
    int nn = step_head(r, q, false, c->num);
    int lean = r->lean ? lean_of(q, c->num, &nn) : -1;
    if (lean < 0) {
        /* Refunds and penalties only in the lean scripts: the general
         * script has no such branch (the C step then makes them). */
        if (adjust || !lua_can(q))
            return RATE_ENOTSUP; /* the limiter decides, exactly */
        nn = step_limits(q->policy, c->num, nn);
    }
    if ((rc = cmd_key(r, key, c)) != RATE_OK)
        return rc;
    int argc = 0;
    c->av[argc] = "EVALSHA", c->al[argc++] = 7;
    c->av[argc] = lean >= 0 ? r->lean_sha[lean] : r->step_sha,
    c->al[argc++] = 40;
    c->av[argc] = "1", c->al[argc++] = 1;
    c->av[argc] = c->k, c->al[argc++] = c->kl;
    for (int i = 0; i < nn; i++)
        c->av[argc] = c->num[i], c->al[argc++] = strlen(c->num[i]);
    c->argc = argc;
    c->lean = lean;
    if (lean >= 0) {
        c->script = lean_scripts[lean].src;
        c->script_len = lean_scripts[lean].len;
    } else {
        c->script = redis_step_lua;
        c->script_len = sizeof redis_step_lua - 1;
    }
    return RATE_OK;
}

/* A step's reply, the scripts' and the module's (after reply_ok): RATE_OK
 * with *d, or RATE_ENOTSUP (declined: nothing written, the limiter
 * decides), RATE_ECORRUPT (the key is not a hash, or a reply that does
 * not parse). */
int rate__redis_decide_parse(const redisReply *rep, rate_decision_t *d)
{
    bool ok = rep->type == REDIS_REPLY_ARRAY && rep->elements >= 1 &&
              rep->element[0]->type == REDIS_REPLY_INTEGER;
    long long tag = ok ? rep->element[0]->integer : -1;
    if (tag == 0 && rep->elements == 1)
        return RATE_ENOTSUP;
    if (tag != 1 || rep->elements != 9)
        return RATE_ECORRUPT; /* tag 2: the key is not a hash */
    redisReply **e = rep->element;
    memset(d, 0, sizeof *d);
    d->allowed = reply_u64(e[1], &ok) == 1;
    d->reason = (rate_reason_t)reply_u64(e[2], &ok);
    d->component = e[3]->type == REDIS_REPLY_INTEGER ? (int)e[3]->integer : 0;
    d->limit = reply_u64(e[4], &ok);
    d->remaining = reply_u64(e[5], &ok);
    d->delay_ns = reply_u64(e[6], &ok);
    d->retry_after_ns = reply_u64(e[7], &ok);
    d->reset_after_ns = reply_u64(e[8], &ok);
    return ok && d->reason <= RATE_REASON_NEVER ? RATE_OK : RATE_ECORRUPT;
}

/* One round trip: the command of rate__redis_decide_cmd, as an FCALL of
 * the Functions library when the server has it.  Returns as that, or
 * RATE_ENOTSUP when the script declines (nothing written), RATE_ECORRUPT
 * for a key that is not a hash or a reply that does not parse. */
static int r_decide(void *self, const rate_key_t *key,
                    const rate_decide_req_t *q, rate_decision_t *d)
{
    redis_store_t *r = self;
    rate__redis_cmd_t c;
    int rc;

    bool adjust = q->op != RATE_DECIDE_ACQUIRE;
    if ((rc = rate__redis_decide_cmd(r, key, q, &c)) != RATE_OK) {
        if (rc == RATE_ENOTSUP)
            atomic_fetch_add(adjust ? &r->st_adj_declined : &r->st_declined,
                             1);
        return rc;
    }
    int lean = c.lean;
    bool fcall = lean >= 0 && atomic_load(&r->fcall);
    if (fcall) {
        c.av[0] = "FCALL", c.al[0] = 5;
        c.av[1] = r->fn_name[lean], c.al[1] = strlen(r->fn_name[lean]);
    }
    redisReply *rep = NULL;
    uint64_t dl = deadline_of(r);
    rc = kcall(r, dl, c.k, c.kl, c.argc, c.av, c.al, &rep);
    if (fcall && rc == RATE_OK && rep->type == REDIS_REPLY_ERROR &&
        (strstr(rep->str, "Function not found") != NULL ||
         strstr(rep->str, "unknown command") != NULL)) {
        /* A node without the library (loaded on first use: a new node, a
         * restart without persistence, FUNCTION FLUSH): load it there,
         * then call again.  A server that will not (before Redis 7, or a
         * user without the right) gets the script instead, from now on. */
        freeReplyObject(rep);
        rep = NULL;
        rc = kcall(r, dl, c.k, c.kl, 4,
                   (const char *[]){"FUNCTION", "LOAD", "REPLACE", r->fn_lib},
                   (size_t[]){8, 4, 7, r->fn_lib_len}, &rep);
        bool loaded = rc == RATE_OK && rep->type == REDIS_REPLY_STRING;
        /* another caller loaded it first: it is there */
        loaded |= rc == RATE_OK && rep->type == REDIS_REPLY_ERROR &&
                  strstr(rep->str, "already exists") != NULL;
        freeReplyObject(rep);
        rep = NULL;
        if (!loaded && (rc == RATE_OK || rc == RATE_ESTORE)) {
            atomic_store(&r->fcall, false);
            rate__redis_cmd_eval(&c);
        }
        if (rc == RATE_OK || rc == RATE_ESTORE)
            rc = kcall(r, dl, c.k, c.kl, c.argc, c.av, c.al, &rep);
    } else if (rc == RATE_OK && rate__redis_noscript(rep)) {
        freeReplyObject(rep); /* Redis restarted or SCRIPT FLUSH */
        rate__redis_cmd_eval(&c);
        rep = NULL;
        rc = kcall(r, dl, c.k, c.kl, c.argc, c.av, c.al, &rep);
    }
    rc = reply_ok(rc, rep);
    if (rc == RATE_OK) {
        rc = rate__redis_decide_parse(rep, d);
        if (rc == RATE_ENOTSUP)
            atomic_fetch_add(adjust ? &r->st_adj_declined : &r->st_declined,
                             1);
        else if (rc == RATE_OK)
            atomic_fetch_add(adjust      ? &r->st_lean_adj
                             : lean >= 0 ? &r->st_lean
                                         : &r->st_general,
                             1);
    }
    freeReplyObject(rep);
    rate__redis_cmd_free(&c);
    return rc;
}

/* Forgets the key: RATE_OK whether or not it was there. */
static int r_remove(void *self, const rate_key_t *key)
{
    redis_store_t *r = self;
    char kb[RATE_KEY_MAX + 300], *k;
    size_t kl;
    int rc;

    if ((rc = full_key(r, key, kb, sizeof kb, &k, &kl)) != RATE_OK)
        return rc;
    redisReply *rep = NULL;
    rc = kcall(r, deadline_of(r), k, kl, 2, (const char *[]){"UNLINK", k},
               (size_t[]){6, kl}, &rep);
    rc = reply_ok(rc, rep);
    if (rc == RATE_OK && rep->type != REDIS_REPLY_INTEGER)
        rc = RATE_ECORRUPT;
    freeReplyObject(rep);
    if (k != kb)
        free(k);
    return rc;
}

static void r_destroy(void *self)
{
    redis_store_t *r = self;

    for (unsigned i = 0; i < atomic_load(&r->nnodes); i++)
        node_free(atomic_load(&r->nodes[i]));
    pthread_mutex_destroy(&r->topo_lock);
    pthread_mutex_destroy(&r->node_lock);
    pthread_mutex_destroy(&r->err_lock);
    free(r->prefix);
    free(r->fn_lib);
    free(r);
}

/* ------------------------------------------------------ ratelimit.so */

/* The module (redis-module/, docs/redis-module.md): RATELIMIT.STEP takes
 * the step script's arguments and gives its replies, and decides every
 * policy but a blocking one exactly (no 2^50 bound), over the same keys.
 * Whether the server has it is asked once (COMMAND INFO); a decision
 * answered "unknown command" is made by the scripts at once, and the
 * module tried again no sooner than MODULE_RETRY_NS later. */
enum { MODULE_UNKNOWN = 0, MODULE_ON = 1, MODULE_OFF = 2 };
#define MODULE_RETRY_NS (5 * RATE_NS_PER_S)
#define MODULE_GONE 100 /* module_decide: no module there; not a RATE_E* */

/* Whether the server has RATELIMIT.STEP: RATE_OK with *has, or the
 * store's error. */
static int module_probe(redis_store_t *r, bool *has)
{
    redisReply *rep = NULL;
    int rc = kcall(r, deadline_of(r), NULL, 0, 3,
                   (const char *[]){"COMMAND", "INFO", "ratelimit.step"},
                   (size_t[]){7, 4, 14}, &rep);
    /* An error reply (an ACL without COMMAND) counts as no module: the
     * retry after MODULE_RETRY_NS tries the command itself. */
    if (rc == RATE_OK)
        *has = rep->type == REDIS_REPLY_ARRAY && rep->elements == 1 &&
               rep->element[0]->type == REDIS_REPLY_ARRAY;
    freeReplyObject(rep);
    return rc;
}

/* Whether to try the module for this decision (probing it if need be);
 * *rc the probe's failure (RATE_OK when none), which is the decision's:
 * one call never waits for more than one command's timeout. */
static bool module_wanted(redis_store_t *r, int *rc)
{
    *rc = RATE_OK;
    if (r->module_mode == RATE_REDIS_MODULE_OFF)
        return false;
    int st = atomic_load_explicit(&r->module_state, memory_order_relaxed);
    if (st == MODULE_ON)
        return true;
    if (st == MODULE_OFF) {
        uint64_t now = rate_clock_monotonic_ns();
        uint64_t at = atomic_load(&r->module_retry_at_ns);
        /* One caller tries again once the pause is over. */
        return now >= at &&
               atomic_compare_exchange_strong(&r->module_retry_at_ns, &at,
                                              now + MODULE_RETRY_NS);
    }
    bool has = false;
    if ((*rc = module_probe(r, &has)) != RATE_OK)
        return false; /* asked again at the next decision */
    atomic_store(&r->module_retry_at_ns,
                 rate_clock_monotonic_ns() + MODULE_RETRY_NS);
    atomic_store(&r->module_state, has ? MODULE_ON : MODULE_OFF);
    return has;
}

/* One round trip: RATELIMIT.STEP.  As r_decide, or MODULE_GONE for an
 * error reply ("unknown command": nothing was written). */
static int module_decide(redis_store_t *r, const rate_key_t *key,
                         const rate_decide_req_t *q, rate_decision_t *d)
{
    const rate_policy_t *p = q->policy;
    size_t count = rate_policy_count(p);
    char kb[RATE_KEY_MAX + 300], num[7 + 4 * RATE_MAX_LIMITS][24], *k;
    const char *av[2 + 7 + 4 * RATE_MAX_LIMITS];
    size_t al[2 + 7 + 4 * RATE_MAX_LIMITS], kl;
    int argc = 0, nn = 0, rc;

    if (count == 0 || count > RATE_MAX_LIMITS ||
        (q->format != RATE__FORMAT_V1 && q->format != RATE__FORMAT))
        return RATE_ENOTSUP;
    for (size_t i = 0; i < count; i++)
        if (rate_policy_limit(p, i)->block_ns != 0)
            return RATE_ENOTSUP; /* a block: the compare-and-set path's */
    if ((rc = full_key(r, key, kb, sizeof kb, &k, &kl)) != RATE_OK)
        return rc;
    nn = step_limits(p, num, step_head(r, q, true, num));
    av[argc] = "RATELIMIT.STEP", al[argc++] = 14;
    av[argc] = k, al[argc++] = kl;
    for (int i = 0; i < nn; i++)
        av[argc] = num[i], al[argc++] = strlen(num[i]);
    redisReply *rep = NULL;
    rc = kcall(r, deadline_of(r), k, kl, argc, av, al, &rep);
    if (rc == RATE_OK && rep->type == REDIS_REPLY_ERROR) {
        /* "unknown command" (unloaded, a server without it), NOPERM, or
         * anything else the module itself never answers to the store's
         * requests: the scripts decide, and report what they meet. */
        rc = MODULE_GONE;
    } else if ((rc = reply_ok(rc, rep)) == RATE_OK) {
        rc = rate__redis_decide_parse(rep, d);
    }
    freeReplyObject(rep);
    if (k != kb)
        free(k);
    return rc;
}

/* decide(): the module when the server has it, else the scripts. */
static int r_decide_any(void *self, const rate_key_t *key,
                        const rate_decide_req_t *q, rate_decision_t *d)
{
    redis_store_t *r = self;
    int probe_rc = RATE_OK;

    /* Refunds and penalties: the lean scripts' alone (RATELIMIT.STEP
     * makes admissions only), over the same bytes as the module's. */
    if (key != NULL && key->space != RATE_SPACE_POLICY &&
        q->op == RATE_DECIDE_ACQUIRE && module_wanted(r, &probe_rc)) {
        int rc = module_decide(r, key, q, d);
        if (rc != MODULE_GONE) {
            if (rc == RATE_OK)
                atomic_fetch_add_explicit(&r->st_module, 1,
                                          memory_order_relaxed);
            /* The module answered (a retry after a fallback found it
             * back): use it from now on. */
            if ((rc == RATE_OK || rc == RATE_ENOTSUP ||
                 rc == RATE_ECORRUPT) &&
                atomic_load_explicit(&r->module_state,
                                     memory_order_relaxed) != MODULE_ON)
                atomic_store(&r->module_state, MODULE_ON);
            return rc;
        }
        atomic_fetch_add(&r->st_module_fallbacks, 1);
        atomic_store(&r->module_retry_at_ns,
                     rate_clock_monotonic_ns() + MODULE_RETRY_NS);
        atomic_store(&r->module_state, MODULE_OFF);
    }
    if (probe_rc != RATE_OK)
        return probe_rc; /* Redis did not answer: nor would the script */
    return r_decide(self, key, q, d);
}

/* The Functions library of the lean scripts (see the struct): each
 * script's text as a function's body, FNV-1a of the three the version. */
static int make_fn_lib(redis_store_t *r)
{
    static const char *tag[LEAN_COUNT] = {"tb", "lb", "fw"};
    uint32_t h = 2166136261u;
    size_t len = 64;
    for (int i = 0; i < LEAN_COUNT; i++) {
        for (size_t j = 0; j < lean_scripts[i].len; j++)
            h = (h ^ (unsigned char)lean_scripts[i].src[j]) * 16777619u;
        len += lean_scripts[i].len + 96;
    }
    if ((r->fn_lib = malloc(len)) == NULL)
        return RATE_ENOMEM;
    size_t n = (size_t)snprintf(r->fn_lib, len,
                                "#!lua name=ratelimit_%08x\n", (unsigned)h);
    for (int i = 0; i < LEAN_COUNT; i++) {
        snprintf(r->fn_name[i], sizeof r->fn_name[i], "ratelimit_%s_%08x",
                 tag[i], (unsigned)h);
        n += (size_t)snprintf(r->fn_lib + n, len - n,
                              "redis.register_function('%s', "
                              "function(KEYS, ARGV)\n%s\nend)\n",
                              r->fn_name[i], lean_scripts[i].src);
    }
    r->fn_lib_len = n;
    return RATE_OK;
}

static const rate_store_methods_t redis_methods = {
    .version = RATE_STORE_VERSION,
    .name = "redis",
    .load = r_load,
    .cas = r_cas,
    .decide = r_decide_any,
    .now = r_now,
    .remove = r_remove,
    .destroy = r_destroy,
    .decide_changes = true, /* the lean scripts' refunds and penalties */
};

const rate_store_methods_t *rate__redis_methods(void)
{
    return &redis_methods;
}

void rate__redis_conf(const redis_store_t *r, rate__redis_conf_t *out)
{
    memset(out, 0, sizeof *out);
    out->host = r->seeds[0].host;
    out->port = r->unix_socket ? 0 : r->seeds[0].port;
    out->user = r->user;
    out->password = r->password;
    out->db = r->db;
    out->cluster = r->cluster;
    out->command_ns = r->command_ns;
    out->connect_ns = r->connect_ns;
    out->breaker = r->breaker;
    out->breaker_failures = r->breaker_failures;
    out->breaker_cooldown_ns = r->breaker_cooldown_ns;
}

bool rate__redis_topology(redis_store_t *r, rate__redis_addr_t *nodes,
                          unsigned cap, unsigned *n, uint8_t map[RC_SLOTS])
{
    if (!atomic_load_explicit(&r->ready, memory_order_acquire) || !r->cluster)
        return false;
    unsigned k = atomic_load(&r->nnodes);
    if (k > cap)
        k = cap;
    for (unsigned i = 0; i < k; i++) {
        node_t *nd = atomic_load(&r->nodes[i]);
        snprintf(nodes[i].host, sizeof nodes[i].host, "%s", nd->host);
        nodes[i].port = nd->port;
    }
    for (unsigned s = 0; s < RC_SLOTS; s++) {
        uint8_t v = atomic_load_explicit(&r->slot_node[s],
                                         memory_order_relaxed);
        map[s] = v <= k ? v : 0;
    }
    *n = k;
    return true;
}

/* The scripts' names (EVALSHA's SHA-1), known before any server is
 * asked, so that a store that has not connected yet (a lazy one, an event
 * loop's) sends the right EVALSHA from its first command. */
static void script_names(redis_store_t *r)
{
    rate__sha1_hex(cas_script, sizeof cas_script - 1, r->sha);
    rate__sha1_hex(redis_step_lua, sizeof redis_step_lua - 1, r->step_sha);
    for (int i = 0; i < LEAN_COUNT; i++)
        rate__sha1_hex(lean_scripts[i].src, lean_scripts[i].len,
                       r->lean_sha[i]);
}

int rate_store_redis_new(const char *url, const rate_redis_options_t *opt,
                         rate_store_t **out, char *err, size_t errlen)
{
    return rate__redis_new(url, opt, true, out, err, errlen);
}

int rate__redis_new(const char *url, const rate_redis_options_t *opt,
                    bool try_now, rate_store_t **out, char *err,
                    size_t errlen)
{
    rate_redis_options_t o = {0};
    redis_store_t *r;
    int rc;

    if (out == NULL)
        return rate__fail(err, errlen, RATE_EINVAL, "out is NULL");
    *out = NULL;
    if (url == NULL)
        return rate__fail(err, errlen, RATE_EINVAL, "the Redis URL is NULL");
    if (opt != NULL)
        o = *opt;
    if (!RATE__RESERVED_ZERO(&o))
        return rate__fail(err, errlen, RATE_EINVAL, "the options' reserved "
                          "words are not zero (a field of a later version?)");
    if (o.pool_size > 1024)
        return rate__fail(err, errlen, RATE_EINVAL, "pool_size %u above 1024",
                          o.pool_size);
    /* each is added to a clock reading: above RATE_TIME_MAX it could wrap */
    const struct {
        const char *name;
        uint64_t ns;
    } spans[] = {{"connect_timeout_ns", o.connect_timeout_ns},
                 {"command_timeout_ns", o.command_timeout_ns},
                 {"breaker_cooldown_ns", o.breaker_cooldown_ns}};
    for (size_t i = 0; i < sizeof spans / sizeof spans[0]; i++)
        if (spans[i].ns > RATE_TIME_MAX)
            return rate__fail(err, errlen, RATE_EINVAL,
                              "%s of %llu ns, above RATE_TIME_MAX",
                              spans[i].name, (unsigned long long)spans[i].ns);
    r = calloc(1, sizeof *r);
    if (r == NULL)
        return RATE_ENOMEM;
    pthread_mutex_init(&r->topo_lock, NULL);
    pthread_mutex_init(&r->node_lock, NULL);
    pthread_mutex_init(&r->err_lock, NULL);
    if ((rc = parse_url(r, url, err, errlen)) != RATE_OK) {
        r_destroy(r);
        return rc;
    }
    r->connect_ns = o.connect_timeout_ns ? o.connect_timeout_ns : RATE_NS_PER_S;
    r->command_ns = o.command_timeout_ns ? o.command_timeout_ns : RATE_NS_PER_S;
    r->ttl = !o.no_ttl;
    r->safety_us = o.no_ttl && o.safety_ttl_ns != 0 ? ttl_us(o.safety_ttl_ns)
                                                    : 0;
    r->redis_time = !o.client_time;
    r->lean = !o.general_script;
    atomic_store(&r->fcall, r->lean);
    if (r->lean && make_fn_lib(r) != RATE_OK) {
        r_destroy(r);
        return RATE_ENOMEM;
    }
    r->lazy = o.lazy_connect;
    r->breaker = !o.no_breaker;
    r->breaker_failures = o.breaker_failures ? o.breaker_failures
                                             : BREAKER_FAILURES;
    r->breaker_cooldown_ns = o.breaker_cooldown_ns ? o.breaker_cooldown_ns
                                                   : BREAKER_COOLDOWN_NS;
    const char *prefix = o.prefix ? o.prefix : "ratelimit:";
    r->prefix_len = strlen(prefix);
    if (r->prefix_len > 256) {
        r_destroy(r);
        return rate__fail(err, errlen, RATE_EINVAL,
                          "prefix of %zu bytes, above 256", strlen(prefix));
    }
    if (strpbrk(prefix, "{}") != NULL) { /* its own hash tag: see the top */
        r_destroy(r);
        return rate__fail(err, errlen, RATE_EINVAL,
                          "prefix '%s' holds a brace: each key's '{' must be "
                          "the first, for its Cluster hash tag", prefix);
    }
    r->prefix = malloc(r->prefix_len + 1);
    r->pool = o.pool_size ? o.pool_size : 2;
    r->module_mode = o.module;
    if (r->prefix == NULL) {
        r_destroy(r);
        return RATE_ENOMEM;
    }
    memcpy(r->prefix, prefix, r->prefix_len + 1);
    script_names(r);
    /* Connect now, so that a wrong host or password is reported here; a
     * lazy store connects at its first calls instead if it cannot (and
     * does not even try now without try_now: an event loop's store). */
    char e[256] = "";
    rc = try_now || !r->lazy ? discover(r, 0, true, e, sizeof e)
                             : RATE_ESTORE;
    if (rc != RATE_OK && (!r->lazy || rc == RATE_EINVAL)) {
        rate__fail(err, errlen, rc, "%s", e);
        r_destroy(r);
        return rc;
    }
    if (rc == RATE_OK && r->module_mode == RATE_REDIS_MODULE_ON) {
        bool has = false; /* forced: the server must have it */
        if ((rc = module_probe(r, &has)) == RATE_OK && !has)
            rc = RATE_ESTORE;
        if (rc != RATE_OK) {
            rate__fail(err, errlen, rc, "the module was asked for (module "
                       "on) but the server has no RATELIMIT.STEP: load "
                       "ratelimit.so");
            r_destroy(r);
            return rc;
        }
        atomic_store(&r->module_state, MODULE_ON);
    }
    if ((rc = rate_store_new(&redis_methods, r, out)) != RATE_OK)
        r_destroy(r);
    return rc;
}

/* The masters now in the slot map (the single server: it), at most cap. */
static size_t masters(redis_store_t *r, node_t **out, size_t cap)
{
    size_t n = 0;
    if (!r->cluster) {
        out[0] = atomic_load(&r->nodes[0]);
        return 1;
    }
    bool seen[MAX_NODES + 1] = {false};
    for (unsigned s = 0; s < RC_SLOTS && n < cap; s++) {
        unsigned idx = atomic_load_explicit(&r->slot_node[s],
                                            memory_order_relaxed);
        if (idx != 0 && !seen[idx]) {
            seen[idx] = true;
            out[n++] = atomic_load(&r->nodes[idx - 1]);
        }
    }
    return n;
}

/* Calls batch() with each batch of the store's own keys (SCAN ... MATCH
 * PREFIX* COUNT 1000, a batch per reply, the prefix's glob characters escaped; of what it
 * finds, the names the store writes, see own_name) on every master, until
 * the scans end.  A call that fails ends that master's scan, and the
 * others still go on (in a cluster with a master down, the keys of the
 * healthy ones are still reached); the first failure is returned at the
 * end.  Out of memory stops at once.  A batch is a single server's or one
 * master's. */
static int scan_prefix(redis_store_t *r,
                       int (*batch)(redis_store_t *r, const char **keys,
                                    const size_t *lens, size_t n, void *arg),
                       void *arg)
{
    int rc;
    if (!atomic_load(&r->ready) &&
        (rc = discover(r, deadline_of(r), false, NULL, 0)) != RATE_OK)
        return rc;
    char *pattern = malloc(r->prefix_len * 2 + 2);
    const char **kv = NULL;
    size_t *kl = NULL, kcap = 0;
    node_t **nodes = malloc(MAX_NODES * sizeof *nodes);
    if (pattern == NULL || nodes == NULL) {
        free(pattern), free(kv), free(kl), free(nodes);
        return RATE_ENOMEM;
    }
    size_t pl = 0;
    for (size_t i = 0; i < r->prefix_len; i++) { /* escape glob chars */
        char ch = r->prefix[i];
        if (ch == '*' || ch == '?' || ch == '[' || ch == ']' || ch == '\\')
            pattern[pl++] = '\\';
        pattern[pl++] = ch;
    }
    pattern[pl++] = '*';
    size_t nn = masters(r, nodes, MAX_NODES);
    int first = RATE_OK;
    rc = RATE_OK;
    for (size_t m = 0; m < nn && rc != RATE_ENOMEM; m++) {
        char cursor[32] = "0";
        rc = RATE_OK;
        do {
            redisReply *rep = NULL;
            rc = call_node(r, deadline_of(r), nodes[m], false, 6,
                           (const char *[]){"SCAN", cursor, "MATCH", pattern,
                                            "COUNT", "1000"},
                           (size_t[]){4, strlen(cursor), 5, pl, 5, 4}, &rep);
            rc = reply_ok(rc, rep);
            if (rc == RATE_OK && (rep->type != REDIS_REPLY_ARRAY ||
                                  rep->elements != 2 ||
                                  rep->element[0]->type != REDIS_REPLY_STRING ||
                                  rep->element[0]->len >= sizeof cursor ||
                                  rep->element[1]->type != REDIS_REPLY_ARRAY))
                rc = RATE_ECORRUPT;
            if (rc == RATE_OK) {
                const redisReply *keys = rep->element[1];
                size_t n = 0;
                snprintf(cursor, sizeof cursor, "%s", rep->element[0]->str);
                if (keys->elements > kcap) { /* SCAN may return more */
                    const char **nv = realloc(kv, keys->elements * sizeof *kv);
                    if (nv != NULL)
                        kv = nv;
                    size_t *nl = realloc(kl, keys->elements * sizeof *kl);
                    if (nl != NULL)
                        kl = nl;
                    if (nv == NULL || nl == NULL)
                        rc = RATE_ENOMEM;
                    else
                        kcap = keys->elements;
                }
                for (size_t i = 0; i < keys->elements && rc == RATE_OK; i++) {
                    const redisReply *e = keys->element[i];
                    if (e->type != REDIS_REPLY_STRING)
                        rc = RATE_ECORRUPT;
                    else if (own_name(r, e->str, e->len)) {
                        kv[n] = e->str;
                        kl[n++] = e->len;
                    }
                }
                if (rc == RATE_OK && n > 0)
                    rc = batch(r, kv, kl, n, arg);
            }
            freeReplyObject(rep);
        } while (rc == RATE_OK && strcmp(cursor, "0") != 0);
        if (first == RATE_OK || rc == RATE_ENOMEM)
            first = rc;
    }
    free(pattern), free(kv), free(kl), free(nodes);
    return first;
}

/* One command over a batch of keys: the head's words, the keys, then the
 * tail's word (if not NULL); its reply must be an integer.  In a cluster,
 * one command per key instead (keys of one batch may lie in many slots),
 * each routed to its slot's master. */
static int keys_command(redis_store_t *r, size_t head, const char **hv,
                        const size_t *hl, const char **keys,
                        const size_t *lens, size_t nkeys, const char *tail,
                        const char *one_tail)
{
    size_t per = r->cluster ? 1 : nkeys;
    size_t n = head + per + (tail != NULL);
    const char **av = malloc(n * sizeof *av);
    size_t *al = malloc(n * sizeof *al);
    int rc = RATE_OK;

    if (av == NULL || al == NULL || n > INT_MAX) {
        free(av);
        free(al);
        return RATE_ENOMEM;
    }
    for (size_t i = 0; i < head; i++) {
        av[i] = hv[i];
        al[i] = hl[i];
    }
    if (r->cluster && one_tail != NULL && head == 3) {
        av[2] = one_tail; /* the script's number of keys: one */
        al[2] = strlen(one_tail);
    }
    for (size_t at = 0; at < nkeys && rc == RATE_OK; at += per) {
        for (size_t i = 0; i < per; i++) {
            av[head + i] = keys[at + i];
            al[head + i] = lens[at + i];
        }
        if (tail != NULL) {
            av[n - 1] = tail;
            al[n - 1] = strlen(tail);
        }
        redisReply *rep = NULL;
        rc = kcall(r, deadline_of(r), keys[at], lens[at], (int)n, av, al,
                   &rep);
        rc = reply_ok(rc, rep);
        if (rc == RATE_OK && rep->type != REDIS_REPLY_INTEGER)
            rc = RATE_ECORRUPT;
        freeReplyObject(rep);
    }
    free(av);
    free(al);
    return rc;
}

static int unlink_batch(redis_store_t *r, const char **keys,
                        const size_t *lens, size_t n, void *arg)
{
    (void)arg;
    return keys_command(r, 1, (const char *[]){"UNLINK"}, (size_t[]){6},
                        keys, lens, n, NULL, NULL);
}

/* The synchronous store behind a Redis store: itself, or the one an
 * asynchronous Redis store owns; NULL for another store. */
static redis_store_t *sync_of(rate_store_t *store)
{
    redis_store_t *r = rate_store_backend(store, &redis_methods);
    return r != NULL ? r : rate__redis_async_sync(store);
}

int rate_store_redis_drop(rate_store_t *store)
{
    redis_store_t *r;

    if ((r = sync_of(store)) == NULL)
        return RATE_EINVAL;
    /* The states, shadow states and policy records alike. */
    return scan_prefix(r, unlink_batch, NULL);
}

/* The expiry of each of KEYS (expire_at), in one call for a batch (a key gone meanwhile
 * is left gone). */
static const char touch_script[] =
    EXPIRE_AT_LUA
    "local t = redis.call('TIME')\n"
    "local us = tonumber(ARGV[1])\n"
    "for _, k in ipairs(KEYS) do expire_at(k, us, t) end\n"
    "return #KEYS\n";

typedef struct touch_arg {
    char ms[24];
} touch_arg_t;

static int touch_batch(redis_store_t *r, const char **keys,
                       const size_t *lens, size_t n, void *varg)
{
    touch_arg_t *a = varg;
    char num[24];

    /* EVAL SCRIPT NUMKEYS KEY... US */
    snprintf(num, sizeof num, "%zu", n);
    return keys_command(r, 3,
                        (const char *[]){"EVAL", touch_script, num},
                        (size_t[]){4, sizeof touch_script - 1, strlen(num)},
                        keys, lens, n, a->ms, "1");
}

int rate_store_redis_touch(rate_store_t *store, uint64_t ttl_ns)
{
    redis_store_t *r;
    touch_arg_t a;

    if ((r = sync_of(store)) == NULL || ttl_ns == 0)
        return RATE_EINVAL;
    snprintf(a.ms, sizeof a.ms, "%llu", (unsigned long long)ttl_us(ttl_ns));
    return scan_prefix(r, touch_batch, &a);
}

int rate_store_redis_last_error(rate_store_t *store, char *buf, size_t cap)
{
    redis_store_t *r;

    if ((r = rate_store_backend(store, &redis_methods)) == NULL)
        return rate__redis_async_last_error(store, buf, cap);
    if (buf == NULL || cap == 0)
        return RATE_EINVAL;
    pthread_mutex_lock(&r->err_lock);
    snprintf(buf, cap, "%s", r->last_err);
    pthread_mutex_unlock(&r->err_lock);
    return RATE_OK;
}

int rate_store_redis_status(rate_store_t *store, rate_redis_status_t *out)
{
    redis_store_t *r;

    if ((r = rate_store_backend(store, &redis_methods)) == NULL ||
        out == NULL)
        return RATE_EINVAL;
    memset(out, 0, sizeof *out);
    out->ready = atomic_load(&r->ready);
    if (out->ready) {
        node_t *nodes[MAX_NODES];
        out->cluster = r->cluster;
        out->masters = (unsigned)masters(r, nodes, MAX_NODES);
        for (unsigned i = 0; i < out->masters; i++)
            out->breakers_open += atomic_load(&nodes[i]->open_until_ns) != 0;
    }
    out->breaker_opened = atomic_load(&r->st_opened);
    out->breaker_rejected = atomic_load(&r->st_rejected);
    out->redirections = atomic_load(&r->st_redirects);
    out->map_refreshes = atomic_load(&r->st_refreshes);
    out->connect_failures = atomic_load(&r->st_connect_failures);
    out->module = atomic_load(&r->module_state) == MODULE_ON;
    out->module_decisions = atomic_load(&r->st_module);
    out->module_fallbacks = atomic_load(&r->st_module_fallbacks);
    out->lean_decisions = atomic_load(&r->st_lean);
    out->general_decisions = atomic_load(&r->st_general);
    out->declined = atomic_load(&r->st_declined);
    out->lean_adjustments = atomic_load(&r->st_lean_adj);
    out->declined_adjustments = atomic_load(&r->st_adj_declined);
    return RATE_OK;
}
