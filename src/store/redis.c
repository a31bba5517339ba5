/* SPDX-License-Identifier: MIT */
/*
 * The Redis store: keys shared by every process and machine that talks to
 * the same Redis.
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
 * decide, and is never written over.
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
 * After the prefix comes '{', 's' or 'p', so no two spaces ever share a
 * name.  A new key's version starts from Redis's TIME in microseconds, so
 * a key that expired and came back does not reuse the version a slow
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
 * Connections: a few (pool_size, 2 by default), each shared by all callers
 * and pipelined both ways (see struct conn): commands go out in batches
 * while earlier replies are still being read, the way auto-pipelining
 * clients work, with no I/O thread: the callers themselves take turns
 * writing and reading.  Every command has the configured timeout; a
 * connection that failed is dropped, and reconnecting is tried again no
 * sooner than a backoff that doubles from 10 ms to 1 s, so while Redis is
 * down a call fails at once instead of waiting on a dead host.
 */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <linux/futex.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <unistd.h>

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
    redisReply *reply; /* out, on RATE_OK */
    int status;        /* out */
    /* Bit 0: done (reply and status are set); above it, a count bumped to
     * hand the caller a role.  The caller sleeps on it (a futex). */
    _Atomic uint32_t sig;
    struct mreq *next;
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
    uint64_t retry_at_ns, backoff_ns;
} conn_t;

typedef struct redis_store {
    char host[256];
    char password[256], user[256];
    int port, db;
    bool unix_socket, ttl, redis_time;
    uint64_t safety_ms; /* with no_ttl: the expiry of a state written, in
                           ms; 0: none (PERSIST) */
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
            return rate__fail(err, errlen, RATE_EINVAL,
                              "'%s': unix:// needs an absolute socket path",
                              url);
        return RATE_OK;
    }
    if (strncmp(url, "redis://", 8) != 0)
        return rate__fail(err, errlen, RATE_EINVAL,
                          "'%s' is not "
                          "redis://[user:password@]host[:port][/db] "
                          "or unix:///path", url);
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
    const char *colon = NULL;
    const char *hs = p, *he;
    if (*p == '[') { /* [IPv6] */
        const char *close = memchr(p, ']', (size_t)(hostend - p));
        if (close == NULL)
            return rate__fail(err, errlen, RATE_EINVAL,
                              "'%s': unclosed '[' in host", url);
        hs = p + 1;
        he = close;
        if (close + 1 < hostend) {
            if (close[1] != ':')
                return rate__fail(err, errlen, RATE_EINVAL,
                                  "'%s': text after ']' in host", url);
            colon = close + 1;
        }
    } else {
        colon = memchr(p, ':', (size_t)(hostend - p));
        he = colon ? colon : hostend;
    }
    if (he == hs || !copy_part(r->host, sizeof r->host, hs, (size_t)(he - hs)))
        return rate__fail(err, errlen, RATE_EINVAL,
                          "'%s': missing or too long host", url);
    if (colon != NULL &&
        (!parse_int(colon + 1, (size_t)(hostend - colon - 1), 65535, &r->port) ||
         r->port == 0))
        return rate__fail(err, errlen, RATE_EINVAL,
                          "'%s': port is not a number from 1 to 65535", url);
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
        return rate__fail(err, errlen, RATE_ENOMEM, "out of memory");
    if (c->err) {
        if (r->unix_socket) /* the socket's path alone: no port */
            rc = rate__fail(err, errlen, RATE_ESTORE,
                            "cannot connect to %s: %s", r->host, c->errstr);
        else
            rc = rate__fail(err, errlen, RATE_ESTORE,
                            "cannot connect to %s:%d: %s", r->host, r->port,
                            c->errstr);
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
            rate__fail(err, errlen, rc, "authentication failed: %s",
                       rep ? rep->str : c->errstr);
        freeReplyObject(rep);
    }
    if (rc == RATE_OK && r->db != 0) {
        char db[16];
        snprintf(db, sizeof db, "%d", r->db);
        rep = command(c, 2, (const char *[]){"SELECT", db},
                      (size_t[]){6, strlen(db)});
        if ((rc = reply_status(c, rep)) != RATE_OK)
            rate__fail(err, errlen, rc, "SELECT %s failed: %s", db,
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
            rc = rate__fail(err, errlen, rc ? rc : RATE_ESTORE,
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

/* Connects for c (the writer's job, with nothing in flight), unless still
 * backing off. */
static int ensure_conn(redis_store_t *r, conn_t *c, redisContext **out)
{
    uint64_t now = rate_clock_monotonic_ns();
    if (now < c->retry_at_ns)
        return RATE_ESTORE; /* still backing off: fail at once */
    int rc = open_conn(r, out, false, NULL, 0);
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
    c->retry_at_ns = 0; /* reconnect at once, then back off */
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

static int send_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0)
            return errno == EAGAIN || errno == EWOULDBLOCK ? RATE_ETIMEDOUT
                                                           : RATE_ESTORE;
        p += w;
        n -= (size_t)w;
    }
    return RATE_OK;
}

/* The writer: sends what is queued, a batch per write, until nothing is.
 * Connects first if need be (nothing is in flight then).  Called and
 * returns with c->lock held. */
static void write_queued(redis_store_t *r, conn_t *c)
{
    c->writing = true;
    while (c->head != NULL && !c->broken) {
        if (c->ctx == NULL) {
            redisContext *ctx = NULL;
            pthread_mutex_unlock(&c->lock);
            int rc = ensure_conn(r, c, &ctx);
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
        pthread_mutex_unlock(&c->lock);
        int rc = send_all(fd, buf, len);
        pthread_mutex_lock(&c->lock);
        if (rc != RATE_OK)
            conn_break(c, rc);
    }
    c->writing = false;
    conn_settle(c);
}

/* The reader: reads replies in order and hands each to its caller, until
 * me's own has come or nothing is in flight.  A caller is told its reply
 * is there after the lock is let go, so that waking it (a system call)
 * never holds up the others.  Called and returns with c->lock held. */
static void read_replies(conn_t *c, mreq_t *me)
{
    redisContext *ctx = c->ctx;
    mreq_t *answered = NULL; /* its reply is set; it is not told yet */

    c->reading = true;
    while (!is_done(me) && c->fly != NULL && !c->broken) {
        void *rep = NULL;
        int rc = RATE_OK;
        pthread_mutex_unlock(&c->lock);
        if (answered != NULL)
            mark_done(answered);
        answered = NULL;
        while (rc == RATE_OK && rep == NULL) {
            if (redisGetReplyFromReader(ctx, &rep) != REDIS_OK)
                rc = RATE_ESTORE; /* not the protocol: give up on it */
            else if (rep == NULL && redisBufferRead(ctx) != REDIS_OK)
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

/* One command: *out is the reply (perhaps an error reply) on RATE_OK;
 * otherwise the connection failed (RATE_ESTORE, RATE_ETIMEDOUT). */
static int call(redis_store_t *r, int argc, const char **argv,
                const size_t *lens, redisReply **out)
{
    unsigned i = atomic_fetch_add_explicit(&r->next_conn, 1,
                                           memory_order_relaxed);
    conn_t *c = &r->conns[i % r->nconns];
    mreq_t me = {NULL, RATE_OK, 0, NULL};
    char *cmd;
    int len = redisFormatCommandArgv(&cmd, argc, argv, lens);

    *out = NULL;
    if (len < 0)
        return RATE_ENOMEM;
    pthread_mutex_lock(&c->lock);
    if (c->olen + (size_t)len > c->ocap) {
        size_t cap = c->ocap ? c->ocap : 4096;
        while (cap < c->olen + (size_t)len)
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
    memcpy(c->obuf + c->olen, cmd, (size_t)len);
    c->olen += (size_t)len;
    redisFreeCommand(cmd);
    if (c->tail != NULL)
        c->tail->next = &me;
    else
        c->head = &me;
    c->tail = &me;
    for (;;) {
        if (!c->writing && c->head != NULL && !c->broken) {
            write_queued(r, c);
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

/* A key's expiry in whole milliseconds, rounded up (never less than
 * reset_after) and at least 1: PEXPIRE takes no zero. */
static uint64_t ttl_ms(uint64_t ns)
{
    uint64_t ms = ns / 1000000 + (ns % 1000000 != 0);
    return ms ? ms : 1;
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

/* The Redis name of a key (see the top of the file) into buf, or the heap
 * if it does not fit (free it when *out != buf).  RATE_EINVAL for no bytes
 * or an unknown space. */
static int full_key(const redis_store_t *r, const rate_key_t *key, char *buf,
                    size_t cap, char **out, size_t *out_len)
{
    static const char hex[] = "0123456789abcdef";
    size_t body, open;

    *out = NULL;
    if (key == NULL || key->bytes == NULL || key->len == 0)
        return RATE_EINVAL;
    switch (key->space) {
    case RATE_SPACE_STATE: open = 1, body = key->len; break;
    case RATE_SPACE_SHADOW: open = 2, body = key->len; break;
    case RATE_SPACE_POLICY: open = 2, body = key->len * 2; break;
    default: return RATE_EINVAL;
    }
    size_t n = r->prefix_len + open + body + 1;
    char *k = n <= cap ? buf : malloc(n);
    if (k == NULL)
        return RATE_ENOMEM;
    memcpy(k, r->prefix, r->prefix_len);
    char *p = k + r->prefix_len;
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
    } else {
        memcpy(p, key->bytes, key->len);
        p += key->len;
    }
    *p = '}';
    *out = k;
    *out_len = n;
    return RATE_OK;
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

static int r_load(void *self, const rate_key_t *key, void *buf, size_t cap,
                  size_t *len, uint64_t *version)
{
    redis_store_t *r = self;
    char kb[RATE_KEY_MAX + 300], *k;
    size_t kl;
    int rc;

    *len = 0;
    *version = 0;
    if ((rc = full_key(r, key, kb, sizeof kb, &k, &kl)) != RATE_OK)
        return rc;
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
            } else if (s->type != REDIS_REPLY_STRING || s->len == 0) {
                rc = RATE_ECORRUPT; /* present, but no state: truncated */
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

static int r_cas(void *self, const rate_key_t *key, uint64_t version,
                 const void *state, size_t len, uint64_t ttl_ns)
{
    redis_store_t *r = self;
    char kb[RATE_KEY_MAX + 300], vbuf[24], tbuf[24], *k;
    size_t kl;
    int rc;

    if ((rc = full_key(r, key, kb, sizeof kb, &k, &kl)) != RATE_OK)
        return rc;
    snprintf(vbuf, sizeof vbuf, "%llu", (unsigned long long)version);
    /* 0: no expiry (the script PERSISTs the key): for RATE_TTL_FOREVER
     * (the policy records) whatever the options, and for everything else
     * with no_ttl, unless it has a safety expiry. */
    uint64_t ms = ttl_ns == RATE_TTL_FOREVER ? 0
                  : !r->ttl                  ? r->safety_ms
                                             : ttl_ms(ttl_ns);
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
    int rc = call(r, 1, (const char *[]){"TIME"}, (size_t[]){4}, &rep);
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

/* One round trip: EVALSHA of the Lua step (see redis_step.lua for its
 * arguments and replies).  RATE_ENOTSUP, with nothing written, when the
 * request is outside the script's exact range or the script declines (the
 * limiter then decides itself, and reads now() itself if it goes by
 * Redis's clock); RATE_ECORRUPT for a key that is not a hash or a reply
 * that does not parse; RATE_EINVAL for a key of the policy space. */
static int r_decide(void *self, const rate_key_t *key,
                    const rate_decide_req_t *q, rate_decision_t *d)
{
    redis_store_t *r = self;
    const rate_policy_t *p = q->policy;
    char kb[RATE_KEY_MAX + 300], num[7 + 4 * RATE_MAX_LIMITS][24], *k;
    const char *av[4 + 7 + 4 * RATE_MAX_LIMITS];
    size_t al[4 + 7 + 4 * RATE_MAX_LIMITS], kl;
    int argc = 0, rc;

    if (key != NULL && key->space == RATE_SPACE_POLICY)
        return RATE_EINVAL; /* records are no states to decide over */
    bool use_time = r->redis_time && q->clock_time;
    if ((q->format != RATE__FORMAT_V1 && q->format != RATE__FORMAT) ||
        !lua_can(q))
        return RATE_ENOTSUP; /* the limiter decides, exactly */
    if ((rc = full_key(r, key, kb, sizeof kb, &k, &kl)) != RATE_OK)
        return rc;
    long long ttl = !r->ttl     ? (long long)r->safety_ms /* 0: none */
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
    snprintf(num[nn++], 24, "%lu", (unsigned long)q->policy_id);
    snprintf(num[nn++], 24, "%u", (unsigned)q->format);
    for (size_t i = 0; i < rate_policy_count(p); i++) {
        const rate_limit_t *l = rate_policy_limit(p, i);
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
        long long tag = ok ? rep->element[0]->integer : -1;
        if (tag == 0 && rep->elements == 1) {
            /* Declined (out of the script's exact range, or a state it
             * would not read): nothing written; the client decides. */
            rc = RATE_ENOTSUP;
        } else if (tag == 2 && rep->elements == 1) {
            rc = RATE_ECORRUPT; /* the key is not a hash */
        } else if (tag == 1 && rep->elements == 9) {
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
    rc = call(r, 2, (const char *[]){"UNLINK", k}, (size_t[]){6, kl}, &rep);
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

    for (unsigned i = 0; r->conns != NULL && i < r->nconns; i++) {
        if (r->conns[i].ctx != NULL)
            redisFree(r->conns[i].ctx);
        free(r->conns[i].obuf);
        free(r->conns[i].wbuf);
        pthread_mutex_destroy(&r->conns[i].lock);
    }
    free(r->conns);
    free(r->prefix);
    free(r);
}

static const rate_store_methods_t redis_methods = {
    .version = RATE_STORE_VERSION,
    .name = "redis",
    .load = r_load,
    .cas = r_cas,
    .decide = r_decide,
    .now = r_now,
    .remove = r_remove,
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
        return rate__fail(err, errlen, RATE_EINVAL, "the Redis URL is NULL");
    if (opt != NULL)
        o = *opt;
    if (o.pool_size > 1024)
        return rate__fail(err, errlen, RATE_EINVAL, "pool_size %u above 1024",
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
    r->safety_ms = o.no_ttl && o.safety_ttl_ns != 0 ? ttl_ms(o.safety_ttl_ns)
                                                    : 0;
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
    if ((rc = rate_store_new(&redis_methods, r, out)) != RATE_OK)
        r_destroy(r);
    return rc;
}

/* Calls batch() with each batch of the keys under the prefix (SCAN ...
 * MATCH PREFIX* COUNT 1000, the prefix's glob characters escaped) until
 * the scan ends or a call fails. */
static int scan_prefix(redis_store_t *r,
                       int (*batch)(redis_store_t *r, const redisReply *keys,
                                    void *arg),
                       void *arg)
{
    int rc;
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
                              rep->element[0]->len >= sizeof cursor ||
                              rep->element[1]->type != REDIS_REPLY_ARRAY))
            rc = RATE_ECORRUPT;
        if (rc == RATE_OK) {
            const redisReply *keys = rep->element[1];
            snprintf(cursor, sizeof cursor, "%s", rep->element[0]->str);
            for (size_t i = 0; i < keys->elements && rc == RATE_OK; i++)
                if (keys->element[i]->type != REDIS_REPLY_STRING)
                    rc = RATE_ECORRUPT;
            if (rc == RATE_OK && keys->elements > 0)
                rc = batch(r, keys, arg);
        }
        freeReplyObject(rep);
    } while (rc == RATE_OK && strcmp(cursor, "0") != 0);
    free(pattern);
    return rc;
}

/* One command over a batch of keys: the head's words, the keys, then the
 * tail's word (if not NULL); its reply must be an integer. */
static int keys_command(redis_store_t *r, size_t head, const char **hv,
                        const size_t *hl, const redisReply *keys,
                        const char *tail)
{
    size_t n = head + keys->elements + (tail != NULL);
    const char **av = malloc(n * sizeof *av);
    size_t *al = malloc(n * sizeof *al);
    int rc;

    if (av == NULL || al == NULL || n > INT_MAX) {
        free(av);
        free(al);
        return RATE_ENOMEM;
    }
    for (size_t i = 0; i < head; i++) {
        av[i] = hv[i];
        al[i] = hl[i];
    }
    for (size_t i = 0; i < keys->elements; i++) {
        av[head + i] = keys->element[i]->str;
        al[head + i] = keys->element[i]->len;
    }
    if (tail != NULL) {
        av[n - 1] = tail;
        al[n - 1] = strlen(tail);
    }
    redisReply *rep = NULL;
    rc = call(r, (int)n, av, al, &rep);
    rc = reply_ok(rc, rep);
    if (rc == RATE_OK && rep->type != REDIS_REPLY_INTEGER)
        rc = RATE_ECORRUPT;
    freeReplyObject(rep);
    free(av);
    free(al);
    return rc;
}

static int unlink_batch(redis_store_t *r, const redisReply *keys, void *arg)
{
    (void)arg;
    return keys_command(r, 1, (const char *[]){"UNLINK"}, (size_t[]){6},
                        keys, NULL);
}

int rate_store_redis_drop(rate_store_t *store)
{
    redis_store_t *r;

    if ((r = rate_store_backend(store, &redis_methods)) == NULL)
        return RATE_EINVAL;
    /* The states, shadow states and policy records alike. */
    return scan_prefix(r, unlink_batch, NULL);
}

/* PEXPIRE of each of KEYS, in one call for a batch (a key gone meanwhile
 * is left gone). */
static const char touch_script[] =
    "for _, k in ipairs(KEYS) do redis.call('PEXPIRE', k, ARGV[1]) end\n"
    "return #KEYS\n";

typedef struct touch_arg {
    char ms[24];
} touch_arg_t;

static int touch_batch(redis_store_t *r, const redisReply *keys, void *varg)
{
    touch_arg_t *a = varg;
    char num[24];

    /* EVAL SCRIPT NUMKEYS KEY... MS */
    snprintf(num, sizeof num, "%zu", keys->elements);
    return keys_command(r, 3,
                        (const char *[]){"EVAL", touch_script, num},
                        (size_t[]){4, sizeof touch_script - 1, strlen(num)},
                        keys, a->ms);
}

int rate_store_redis_touch(rate_store_t *store, uint64_t ttl_ns)
{
    redis_store_t *r;
    touch_arg_t a;

    if ((r = rate_store_backend(store, &redis_methods)) == NULL ||
        ttl_ns == 0)
        return RATE_EINVAL;
    snprintf(a.ms, sizeof a.ms, "%llu", (unsigned long long)ttl_ms(ttl_ns));
    return scan_prefix(r, touch_batch, &a);
}
