/*
 * The Redis store: keys shared by every process and machine that talks to
 * the same Redis.
 *
 * A decision is one EVALSHA of redis_step.lua, a Lua twin of src/step.c
 * over the same state bytes (the decide() entry of the store contract).
 * The script declines whatever it cannot decide exactly in doubles (see
 * docs/algorithms.md, "Stores"); the limiter then runs the C step over the
 * generic contract, which this store also implements: load is one HMGET of
 * the key's version and state, cas one EVALSHA of a short script that
 * replaces the state only if the version is unchanged.
 *
 * A key is stored as a hash {v: version, s: state bytes} under
 * PREFIX "{" KEY "}": the braces make the key its own Redis Cluster hash
 * tag.  A new key's version starts from Redis's TIME in microseconds, so a
 * key that expired and came back does not reuse the version a slow client
 * may still hold.  Every write sets the key's expiry to its reset_after.
 *
 * Connections: a few (pool_size, 2 by default), each shared by all callers
 * through flat combining (see call()): concurrent callers' commands go out
 * in one write and their replies come back in one read, so they share round
 * trips the way auto-pipelining clients do, with no I/O thread.  Every
 * command has the configured timeout; a connection that failed is dropped,
 * and reconnecting is tried again no sooner than a backoff that doubles
 * from 10 ms to 1 s, so while Redis is down a call fails at once instead of
 * waiting on a dead host.
 */
#include <errno.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/time.h>

#include <hiredis/hiredis.h>

#include "../internal.h"
#include "redis_step_lua.h"

#define BACKOFF_MIN_NS (10 * UINT64_C(1000000))
#define BACKOFF_MAX_NS RATE_NS_PER_S

static const char cas_script[] =
    "local cur = redis.call('HGET', KEYS[1], 'v')\n"
    "if cur == false then cur = '0' end\n"
    "if cur ~= ARGV[1] then return 0 end\n"
    "local nv\n"
    "if cur == '0' then\n"
    "  local t = redis.call('TIME')\n"
    "  nv = redis.call('HINCRBY', KEYS[1], 'v', t[1] * 1000000 + t[2])\n"
    "else\n"
    "  nv = redis.call('HINCRBY', KEYS[1], 'v', 1)\n"
    "end\n"
    "redis.call('HSET', KEYS[1], 's', ARGV[2])\n"
    "local ttl = tonumber(ARGV[3])\n"
    "if ttl > 0 then redis.call('PEXPIRE', KEYS[1], ttl)\n"
    "else redis.call('PERSIST', KEYS[1]) end\n"
    "return nv\n";

/* One caller's command on a shared connection. */
typedef struct mreq {
    int argc;
    const char **argv;
    const size_t *lens;
    redisReply *reply; /* out, on RATE_OK */
    int status;        /* out */
    bool done;
    sem_t wake;        /* posted when done, or to hand over the connection */
    struct mreq *next;
} mreq_t;

/* A connection shared by flat combining: a caller that finds it idle
 * sends every queued command in one write, reads the replies in order and
 * hands them out; callers arriving meanwhile queue for the next batch.  So
 * a lone caller pays one round trip and nothing more, and concurrent
 * callers share round trips (pipelining) without an I/O thread. */
typedef struct conn {
    pthread_mutex_t lock;
    mreq_t *head, *tail; /* queued, not yet sent */
    bool busy;           /* a combiner is on the wire */
    redisContext *ctx;   /* NULL: not connected (only the combiner touches) */
    uint64_t retry_at_ns, backoff_ns;
} conn_t;

typedef struct redis_store {
    char host[256];
    char password[256], user[256];
    int port, db;
    bool unix_socket, ttl, redis_time;
    struct timeval connect_tv, command_tv;
    char *prefix;
    size_t prefix_len;
    char sha[41];      /* the compare-and-set script */
    char step_sha[41]; /* the step (redis_step.lua) */

    conn_t *conns;
    unsigned nconns;
    atomic_uint next_conn; /* round robin over the connections */
} redis_store_t;

/* ------------------------------------------------------------------ URL */

static int fail(char *err, size_t errlen, int rc, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int fail(char *err, size_t errlen, int rc, const char *fmt, ...)
{
    if (err != NULL && errlen > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return rc;
}

static bool copy_part(char *dst, size_t cap, const char *s, size_t n)
{
    if (n >= cap)
        return false;
    memcpy(dst, s, n);
    dst[n] = '\0';
    return true;
}

static bool parse_int(const char *s, size_t n, long max, int *out)
{
    long v = 0;
    if (n == 0)
        return false;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return false;
        v = v * 10 + (s[i] - '0');
        if (v > max)
            return false;
    }
    *out = (int)v;
    return true;
}

/* redis://[[user]:password@]host[:port][/db]  or  unix:///path */
static int parse_url(redis_store_t *r, const char *url, char *err,
                     size_t errlen)
{
    const char *p, *end;

    r->port = 6379;
    if (strncmp(url, "unix://", 7) == 0) {
        r->unix_socket = true;
        if (url[7] != '/' || !copy_part(r->host, sizeof r->host, url + 7,
                                        strlen(url + 7)))
            return fail(err, errlen, RATE_EINVAL,
                        "'%s': unix:// needs an absolute socket path", url);
        return RATE_OK;
    }
    if (strncmp(url, "redis://", 8) != 0)
        return fail(err, errlen, RATE_EINVAL,
                    "'%s' is not redis://[user:password@]host[:port][/db] "
                    "or unix:///path", url);
    p = url + 8;
    end = p + strlen(p);
    const char *at = memchr(p, '@', (size_t)(end - p));
    if (at != NULL) {
        const char *colon = memchr(p, ':', (size_t)(at - p));
        if (colon == NULL)
            return fail(err, errlen, RATE_EINVAL,
                        "'%s': credentials are user:password@ or :password@",
                        url);
        if (!copy_part(r->user, sizeof r->user, p, (size_t)(colon - p)) ||
            !copy_part(r->password, sizeof r->password, colon + 1,
                       (size_t)(at - colon - 1)))
            return fail(err, errlen, RATE_EINVAL, "'%s': credentials too long",
                        url);
        p = at + 1;
    }
    const char *slash = memchr(p, '/', (size_t)(end - p));
    const char *hostend = slash ? slash : end;
    const char *colon = NULL;
    const char *hs = p, *he;
    if (*p == '[') { /* [IPv6] */
        const char *close = memchr(p, ']', (size_t)(hostend - p));
        if (close == NULL)
            return fail(err, errlen, RATE_EINVAL, "'%s': unclosed '[' in host",
                        url);
        hs = p + 1;
        he = close;
        if (close + 1 < hostend) {
            if (close[1] != ':')
                return fail(err, errlen, RATE_EINVAL,
                            "'%s': text after ']' in host", url);
            colon = close + 1;
        }
    } else {
        colon = memchr(p, ':', (size_t)(hostend - p));
        he = colon ? colon : hostend;
    }
    if (he == hs || !copy_part(r->host, sizeof r->host, hs, (size_t)(he - hs)))
        return fail(err, errlen, RATE_EINVAL, "'%s': missing or too long host",
                    url);
    if (colon != NULL &&
        (!parse_int(colon + 1, (size_t)(hostend - colon - 1), 65535, &r->port) ||
         r->port == 0))
        return fail(err, errlen, RATE_EINVAL,
                    "'%s': port is not a number from 1 to 65535", url);
    if (slash != NULL && slash + 1 < end &&
        !parse_int(slash + 1, (size_t)(end - slash - 1), 1 << 20, &r->db))
        return fail(err, errlen, RATE_EINVAL,
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

static redisReply *command(redisContext *c, int argc, const char **argv,
                           const size_t *lens)
{
    return redisCommandArgv(c, argc, argv, lens);
}

/* Connects, authenticates, selects the database and loads the scripts.
 * Their SHA1 digests are recorded at the store's creation (first) only:
 * later connections load the same scripts, while other callers read the
 * digests. */
static int open_conn(redis_store_t *r, redisContext **out, bool first,
                     char *err, size_t errlen)
{
    redisContext *c = r->unix_socket
                          ? redisConnectUnixWithTimeout(r->host, r->connect_tv)
                          : redisConnectWithTimeout(r->host, r->port,
                                                    r->connect_tv);
    redisReply *rep;
    int rc = RATE_OK;

    *out = NULL;
    if (c == NULL)
        return fail(err, errlen, RATE_ENOMEM, "out of memory");
    if (c->err) {
        rc = fail(err, errlen, RATE_ESTORE, "cannot connect to %s%s%d: %s",
                  r->host, r->unix_socket ? "" : ":",
                  r->unix_socket ? 0 : r->port, c->errstr);
        redisFree(c);
        return rc;
    }
    redisSetTimeout(c, r->command_tv);
    if (r->password[0] != '\0') {
        const char *av[3] = {"AUTH", r->user, r->password};
        size_t al[3] = {4, strlen(r->user), strlen(r->password)};
        rep = r->user[0] ? command(c, 3, av, al)
                         : command(c, 2, (const char *[]){"AUTH", r->password},
                                   (size_t[]){4, strlen(r->password)});
        if ((rc = reply_status(c, rep)) != RATE_OK)
            fail(err, errlen, rc, "authentication failed: %s",
                 rep ? rep->str : c->errstr);
        freeReplyObject(rep);
    }
    if (rc == RATE_OK && r->db != 0) {
        char db[16];
        snprintf(db, sizeof db, "%d", r->db);
        rep = command(c, 2, (const char *[]){"SELECT", db},
                      (size_t[]){6, strlen(db)});
        if ((rc = reply_status(c, rep)) != RATE_OK)
            fail(err, errlen, rc, "SELECT %s failed: %s", db,
                 rep ? rep->str : c->errstr);
        freeReplyObject(rep);
    }
    for (int i = 0; i < 2 && rc == RATE_OK; i++) {
        const char *src = i == 0 ? cas_script : redis_step_lua;
        size_t len = i == 0 ? sizeof cas_script - 1 : sizeof redis_step_lua - 1;
        rep = command(c, 3, (const char *[]){"SCRIPT", "LOAD", src},
                      (size_t[]){6, 4, len});
        rc = reply_status(c, rep);
        if (rc == RATE_OK && rep->type == REDIS_REPLY_STRING && rep->len == 40) {
            if (first)
                memcpy(i == 0 ? r->sha : r->step_sha, rep->str, 41);
        }
        else
            rc = fail(err, errlen, rc ? rc : RATE_ESTORE,
                      "SCRIPT LOAD failed: %s",
                      rep && rep->str ? rep->str : c->errstr);
        freeReplyObject(rep);
    }
    if (rc != RATE_OK) {
        redisFree(c);
        return rc;
    }
    *out = c;
    return RATE_OK;
}

/* Connects c (the combiner's job), unless still backing off. */
static int ensure_conn(redis_store_t *r, conn_t *c)
{
    if (c->ctx != NULL)
        return RATE_OK;
    uint64_t now = rate_clock_monotonic_ns();
    if (now < c->retry_at_ns)
        return RATE_ESTORE; /* still backing off: fail at once */
    int rc = open_conn(r, &c->ctx, false, NULL, 0);
    if (rc != RATE_OK) {
        c->backoff_ns = c->backoff_ns ? c->backoff_ns * 2 : BACKOFF_MIN_NS;
        if (c->backoff_ns > BACKOFF_MAX_NS)
            c->backoff_ns = BACKOFF_MAX_NS;
        c->retry_at_ns = now + c->backoff_ns;
    } else {
        c->backoff_ns = 0;
    }
    return rc;
}

/* Sends a batch in one write and reads its replies in order.  On a broken
 * connection every command not yet answered fails with the same status,
 * and the connection is dropped (the next batch reconnects). */
static void run_batch(redis_store_t *r, conn_t *c, mreq_t *batch)
{
    int rc = ensure_conn(r, c);
    mreq_t *q;

    for (q = batch; rc == RATE_OK && q != NULL; q = q->next)
        if (redisAppendCommandArgv(c->ctx, q->argc, q->argv, q->lens) !=
            REDIS_OK)
            rc = RATE_ENOMEM;
    for (q = batch; q != NULL; q = q->next) {
        void *rep = NULL;
        if (rc == RATE_OK && redisGetReply(c->ctx, &rep) != REDIS_OK)
            rc = reply_status(c->ctx, NULL);
        q->status = rc;
        q->reply = rc == RATE_OK ? rep : NULL;
    }
    if (rc != RATE_OK && c->ctx != NULL) {
        redisFree(c->ctx);
        c->ctx = NULL;
        c->retry_at_ns = 0; /* reconnect at once, then back off */
    }
}

/* One command: *out is the reply (perhaps an error reply) on RATE_OK;
 * otherwise the connection failed (RATE_ESTORE, RATE_ETIMEDOUT). */
static int call(redis_store_t *r, int argc, const char **argv,
                const size_t *lens, redisReply **out)
{
    unsigned i = atomic_fetch_add_explicit(&r->next_conn, 1,
                                           memory_order_relaxed);
    conn_t *c = &r->conns[i % r->nconns];
    mreq_t me = {argc, argv, lens, NULL, RATE_OK, false, {{0}}, NULL};

    sem_init(&me.wake, 0, 0);
    pthread_mutex_lock(&c->lock);
    if (c->tail != NULL)
        c->tail->next = &me;
    else
        c->head = &me;
    c->tail = &me;
    while (!me.done) {
        if (c->busy) { /* wait for our reply, or for our turn to combine */
            pthread_mutex_unlock(&c->lock);
            sem_wait(&me.wake);
            pthread_mutex_lock(&c->lock);
            continue;
        }
        /* Combine: send what is queued, and keep going for a few rounds
         * while more arrives (waking a sleeper to do it would leave the
         * connection idle meanwhile). */
        c->busy = true;
        for (int round = 0; round < 16 && c->head != NULL; round++) {
            mreq_t *batch = c->head;
            c->head = c->tail = NULL;
            pthread_mutex_unlock(&c->lock);
            run_batch(r, c, batch);
            pthread_mutex_lock(&c->lock);
            for (mreq_t *q = batch, *nx; q != NULL; q = nx) {
                nx = q->next; /* q may be gone once it is done and woken */
                q->done = true;
                if (q != &me)
                    sem_post(&q->wake);
            }
        }
        c->busy = false;
        if (c->head != NULL) /* hand the connection to the next in line */
            sem_post(&c->head->wake);
    }
    pthread_mutex_unlock(&c->lock);
    sem_destroy(&me.wake);
    *out = me.reply;
    return me.status;
}

/* A key's expiry in whole milliseconds, rounded up (never less than
 * reset_after) and at least 1: PEXPIRE takes no zero. */
static uint64_t ttl_ms(uint64_t ns)
{
    uint64_t ms = ns / 1000000 + (ns % 1000000 != 0);
    return ms ? ms : 1;
}

/* A call's status, with an error reply counted as a store error. */
static int reply_ok(int rc, const redisReply *rep)
{
    if (rc != RATE_OK)
        return rc;
    return rep->type == REDIS_REPLY_ERROR ? RATE_ESTORE : RATE_OK;
}

/* PREFIX "{" key "}" into buf (heap if large); returns its length. */
static char *full_key(const redis_store_t *r, const char *key, size_t len,
                      char *buf, size_t cap, size_t *out_len)
{
    size_t n = r->prefix_len + len + 2;
    char *k = n <= cap ? buf : malloc(n);
    if (k == NULL)
        return NULL;
    memcpy(k, r->prefix, r->prefix_len);
    k[r->prefix_len] = '{';
    memcpy(k + r->prefix_len + 1, key, len);
    k[n - 1] = '}';
    *out_len = n;
    return k;
}

/* ------------------------------------------------------------- contract */

static int parse_version(const redisReply *v, uint64_t *out)
{
    uint64_t x = 0;
    if (v->type == REDIS_REPLY_NIL) {
        *out = 0;
        return RATE_OK;
    }
    if (v->type != REDIS_REPLY_STRING || v->len == 0 || v->len > 19)
        return RATE_ECORRUPT;
    for (size_t i = 0; i < v->len; i++) {
        if (v->str[i] < '0' || v->str[i] > '9')
            return RATE_ECORRUPT;
        x = x * 10 + (uint64_t)(v->str[i] - '0');
    }
    *out = x;
    return RATE_OK;
}

static int r_load(void *self, const char *key, size_t key_len, void *buf,
                  size_t cap, size_t *len, uint64_t *version)
{
    redis_store_t *r = self;
    char kb[RATE_KEY_MAX + 300];
    size_t kl;
    int rc;

    *len = 0;
    *version = 0;
    char *k = full_key(r, key, key_len, kb, sizeof kb, &kl);
    if (k == NULL)
        return RATE_ENOMEM;
    redisReply *rep = NULL;
    rc = call(r, 4, (const char *[]){"HMGET", k, "v", "s"},
              (size_t[]){5, kl, 1, 1}, &rep);
    rc = reply_ok(rc, rep);
    if (rc == RATE_OK) {
        if (rep->type != REDIS_REPLY_ARRAY || rep->elements != 2)
            rc = RATE_ECORRUPT;
        else if ((rc = parse_version(rep->element[0], version)) == RATE_OK) {
            redisReply *s = rep->element[1];
            if (*version == 0 || s->type == REDIS_REPLY_NIL) {
                *version = 0; /* absent (or half-written: treat as absent) */
            } else if (s->type != REDIS_REPLY_STRING) {
                rc = RATE_ECORRUPT;
            } else {
                *len = s->len;
                if (s->len > cap)
                    rc = RATE_EINVAL; /* the limiter retries with more room */
                else
                    memcpy(buf, s->str, s->len);
            }
        }
    }
    freeReplyObject(rep);
    if (k != kb)
        free(k);
    return rc;
}

static int r_cas(void *self, const char *key, size_t key_len,
                 uint64_t version, const void *state, size_t len,
                 uint64_t ttl_ns)
{
    redis_store_t *r = self;
    char kb[RATE_KEY_MAX + 300], vbuf[24], tbuf[24];
    size_t kl;
    int rc;

    char *k = full_key(r, key, key_len, kb, sizeof kb, &kl);
    if (k == NULL)
        return RATE_ENOMEM;
    snprintf(vbuf, sizeof vbuf, "%llu", (unsigned long long)version);
    uint64_t ms = r->ttl ? ttl_ms(ttl_ns) : 0; /* 0: no expiry */
    snprintf(tbuf, sizeof tbuf, "%llu", (unsigned long long)ms);
    const char *av[7] = {"EVALSHA", r->sha, "1", k, vbuf, state, tbuf};
    size_t al[7] = {7, 40, 1, kl, strlen(vbuf), len, strlen(tbuf)};
    redisReply *rep = NULL;
    rc = call(r, 7, av, al, &rep);
    if (rc == RATE_OK && rep->type == REDIS_REPLY_ERROR &&
        strncmp(rep->str, "NOSCRIPT", 8) == 0) {
        /* Redis restarted or SCRIPT FLUSH: send the script itself. */
        freeReplyObject(rep);
        av[0] = "EVAL";
        al[0] = 4;
        av[1] = cas_script;
        al[1] = sizeof cas_script - 1;
        rep = NULL;
        rc = call(r, 7, av, al, &rep);
    }
    rc = reply_ok(rc, rep);
    if (rc == RATE_OK)
        rc = rep->type != REDIS_REPLY_INTEGER ? RATE_ECORRUPT
             : rep->integer == 0              ? RATE_ECONFLICT
                                              : RATE_OK;
    freeReplyObject(rep);
    if (k != kb)
        free(k);
    return rc;
}

/* Whether every number the Lua step meets stays below 2^50, where doubles
 * are exact with room for the products it forms. */
#define LUA_EXACT (UINT64_C(1) << 50)

static bool lua_can(const rate_decide_req_t *q)
{
    const rate_policy_t *p = q->policy;
    if (q->permits >= LUA_EXACT || q->max_wait_ns >= LUA_EXACT)
        return false;
    for (size_t i = 0; i < p->count; i++) {
        const rate_limit_t *l = &p->limits[i];
        rate_u128_t prod = (rate_u128_t)l->period_ns *
                           (l->burst ? l->burst : l->limit);
        if (l->limit >= LUA_EXACT || l->period_ns >= LUA_EXACT ||
            prod * 2 >= LUA_EXACT)
            return false;
    }
    return true;
}

static uint64_t reply_u64(const redisReply *e, bool *ok)
{
    if (e->type != REDIS_REPLY_INTEGER || e->integer < -1) {
        *ok = false;
        return 0;
    }
    return e->integer == -1 ? RATE_NEVER : (uint64_t)e->integer;
}

/* One round trip: EVALSHA of the Lua step (see redis_step.lua). */
/* Redis's TIME in ns, for a decision the client makes itself. */
static int redis_now(redis_store_t *r, uint64_t *out)
{
    redisReply *rep = NULL;
    int rc = call(r, 1, (const char *[]){"TIME"}, (size_t[]){4}, &rep);
    rc = reply_ok(rc, rep);
    if (rc == RATE_OK) {
        if (rep->type != REDIS_REPLY_ARRAY || rep->elements != 2)
            rc = RATE_ECORRUPT;
        else
            *out = strtoull(rep->element[0]->str, NULL, 10) * RATE_NS_PER_S +
                   strtoull(rep->element[1]->str, NULL, 10) * 1000;
    }
    freeReplyObject(rep);
    return rc;
}

static int r_decide(void *self, const char *key, size_t key_len,
                    rate_decide_req_t *q, rate_decision_t *d)
{
    redis_store_t *r = self;
    const rate_policy_t *p = q->policy;
    char kb[RATE_KEY_MAX + 300], num[6 + 4 * RATE_MAX_LIMITS][24];
    const char *av[4 + 6 + 4 * RATE_MAX_LIMITS];
    size_t al[4 + 6 + 4 * RATE_MAX_LIMITS], kl;
    int argc = 0, rc;

    bool use_time = r->redis_time && q->clock_time;
    if (!lua_can(q)) {
        /* The client decides; on Redis's clock all the same. */
        if (use_time && (rc = redis_now(r, &q->now_ns)) != RATE_OK)
            return rc;
        return RATE_ENOTSUP;
    }
    char *k = full_key(r, key, key_len, kb, sizeof kb, &kl);
    if (k == NULL)
        return RATE_ENOMEM;
    long long ttl = !r->ttl     ? 0
                    : q->detail ? -1 /* the script uses the exact reset */
                                : (long long)ttl_ms(q->max_reset_ns);
    int nn = 0;
    if (use_time) { /* "" "": the script reads Redis's TIME */
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
    snprintf(num[nn++], 24, "%lld", ttl);
    snprintf(num[nn++], 24, "%lu", (unsigned long)p->fingerprint);
    for (size_t i = 0; i < p->count; i++) {
        const rate_limit_t *l = &p->limits[i];
        snprintf(num[nn++], 24, "%d", (int)l->algorithm);
        snprintf(num[nn++], 24, "%llu", (unsigned long long)l->limit);
        snprintf(num[nn++], 24, "%llu", (unsigned long long)l->period_ns);
        snprintf(num[nn++], 24, "%llu", (unsigned long long)l->burst);
    }
    av[argc] = "EVALSHA", al[argc++] = 7;
    av[argc] = r->step_sha, al[argc++] = 40;
    av[argc] = "1", al[argc++] = 1;
    av[argc] = k, al[argc++] = kl;
    for (int i = 0; i < nn; i++)
        av[argc] = num[i], al[argc++] = strlen(num[i]);
    redisReply *rep = NULL;
    rc = call(r, argc, av, al, &rep);
    if (rc == RATE_OK && rep->type == REDIS_REPLY_ERROR &&
        strncmp(rep->str, "NOSCRIPT", 8) == 0) {
        freeReplyObject(rep); /* Redis restarted or SCRIPT FLUSH */
        av[0] = "EVAL", al[0] = 4;
        av[1] = redis_step_lua, al[1] = sizeof redis_step_lua - 1;
        rep = NULL;
        rc = call(r, argc, av, al, &rep);
    }
    rc = reply_ok(rc, rep);
    if (rc == RATE_OK) {
        bool ok = rep->type == REDIS_REPLY_ARRAY && rep->elements >= 1 &&
                  rep->element[0]->type == REDIS_REPLY_INTEGER;
        if (ok && rep->element[0]->integer == 0 && rep->elements == 3 &&
            rep->element[1]->type == REDIS_REPLY_INTEGER &&
            rep->element[2]->type == REDIS_REPLY_INTEGER) {
            /* Declined (out of the script's exact range): the client
             * decides, at the time the script went by. */
            q->now_ns = (uint64_t)rep->element[1]->integer * RATE_NS_PER_S +
                        (uint64_t)rep->element[2]->integer;
            rc = RATE_ENOTSUP;
        } else if (ok && rep->elements == 9) {
            redisReply **e = rep->element;
            memset(d, 0, sizeof *d);
            d->allowed = reply_u64(e[1], &ok) == 1;
            d->reason = (rate_reason_t)reply_u64(e[2], &ok);
            d->component = e[3]->type == REDIS_REPLY_INTEGER
                               ? (int)e[3]->integer : 0;
            d->limit = reply_u64(e[4], &ok);
            d->remaining = reply_u64(e[5], &ok);
            d->delay_ns = reply_u64(e[6], &ok);
            d->retry_after_ns = reply_u64(e[7], &ok);
            d->reset_after_ns = reply_u64(e[8], &ok);
            if (!ok || d->reason > RATE_REASON_NEVER)
                rc = RATE_ECORRUPT;
        } else {
            rc = RATE_ECORRUPT;
        }
    }
    freeReplyObject(rep);
    if (k != kb)
        free(k);
    return rc;
}

static void r_destroy(void *self)
{
    redis_store_t *r = self;

    for (unsigned i = 0; r->conns != NULL && i < r->nconns; i++) {
        if (r->conns[i].ctx != NULL)
            redisFree(r->conns[i].ctx);
        pthread_mutex_destroy(&r->conns[i].lock);
    }
    free(r->conns);
    free(r->prefix);
    free(r);
}

static const rate_store_vtable_t redis_vtable = {
    .version = RATE_STORE_V1,
    .name = "redis",
    .load = r_load,
    .cas = r_cas,
    .decide = r_decide,
    .destroy = r_destroy,
};

int rate_store_redis_new(const char *url, const rate_redis_options_t *opt,
                         rate_store_t **out, char *err, size_t errlen)
{
    rate_redis_options_t o = {0};
    redis_store_t *r;
    int rc;

    if (out == NULL)
        return RATE_EINVAL;
    *out = NULL;
    if (url == NULL)
        return fail(err, errlen, RATE_EINVAL, "the Redis URL is NULL");
    if (opt != NULL)
        o = *opt;
    if (o.pool_size > 1024)
        return fail(err, errlen, RATE_EINVAL, "pool_size %u above 1024",
                    o.pool_size);
    r = calloc(1, sizeof *r);
    if (r == NULL)
        return RATE_ENOMEM;
    if ((rc = parse_url(r, url, err, errlen)) != RATE_OK) {
        r_destroy(r);
        return rc;
    }
    r->connect_tv = tv_of(o.connect_timeout_ns ? o.connect_timeout_ns
                                               : RATE_NS_PER_S);
    r->command_tv = tv_of(o.command_timeout_ns ? o.command_timeout_ns
                                               : RATE_NS_PER_S);
    r->ttl = !o.no_ttl;
    r->redis_time = !o.client_time;
    const char *prefix = o.prefix ? o.prefix : "ratelimit:";
    r->prefix_len = strlen(prefix);
    r->prefix = malloc(r->prefix_len + 1);
    r->nconns = o.pool_size ? o.pool_size : 2;
    r->conns = calloc(r->nconns, sizeof *r->conns);
    if (r->prefix == NULL || r->conns == NULL) {
        r_destroy(r);
        return RATE_ENOMEM;
    }
    memcpy(r->prefix, prefix, r->prefix_len + 1);
    for (unsigned i = 0; i < r->nconns; i++)
        pthread_mutex_init(&r->conns[i].lock, NULL);
    atomic_init(&r->next_conn, 0);
    /* Connect one now, so that a wrong host or password is reported here. */
    if ((rc = open_conn(r, &r->conns[0].ctx, true, err, errlen)) != RATE_OK) {
        r_destroy(r);
        return rc;
    }
    if ((rc = rate_store_new(&redis_vtable, r, out)) != RATE_OK)
        r_destroy(r);
    return rc;
}

int rate_store_redis_drop(rate_store_t *store)
{
    redis_store_t *r;
    int rc;

    if (store == NULL || store->vt != &redis_vtable)
        return RATE_EINVAL;
    r = store->self;
    /* SCAN the namespace and UNLINK what it holds, a batch at a time. */
    char *pattern = malloc(r->prefix_len * 2 + 2);
    if (pattern == NULL)
        return RATE_ENOMEM;
    size_t pl = 0;
    for (size_t i = 0; i < r->prefix_len; i++) { /* escape glob chars */
        char ch = r->prefix[i];
        if (ch == '*' || ch == '?' || ch == '[' || ch == ']' || ch == '\\')
            pattern[pl++] = '\\';
        pattern[pl++] = ch;
    }
    pattern[pl++] = '*';
    char cursor[32] = "0";
    do {
        redisReply *rep = NULL;
        rc = call(r, 6,
                  (const char *[]){"SCAN", cursor, "MATCH", pattern, "COUNT",
                                   "1000"},
                  (size_t[]){4, strlen(cursor), 5, pl, 5, 4}, &rep);
        rc = reply_ok(rc, rep);
        if (rc == RATE_OK && (rep->type != REDIS_REPLY_ARRAY ||
                              rep->elements != 2 ||
                              rep->element[0]->type != REDIS_REPLY_STRING ||
                              rep->element[1]->type != REDIS_REPLY_ARRAY))
            rc = RATE_ECORRUPT;
        if (rc == RATE_OK) {
            redisReply *keys = rep->element[1];
            snprintf(cursor, sizeof cursor, "%s", rep->element[0]->str);
            if (keys->elements > 0) {
                size_t n = keys->elements + 1;
                const char **av = malloc(n * sizeof *av);
                size_t *al = malloc(n * sizeof *al);
                if (av == NULL || al == NULL)
                    rc = RATE_ENOMEM;
                else {
                    av[0] = "UNLINK";
                    al[0] = 6;
                    for (size_t i = 0; i < keys->elements; i++) {
                        av[i + 1] = keys->element[i]->str;
                        al[i + 1] = keys->element[i]->len;
                    }
                    redisReply *del = NULL;
                    rc = call(r, (int)n, av, al, &del);
                    rc = reply_ok(rc, del);
                    freeReplyObject(del);
                }
                free(av);
                free(al);
            }
        }
        freeReplyObject(rep);
    } while (rc == RATE_OK && strcmp(cursor, "0") != 0);
    free(pattern);
    return rc;
}
