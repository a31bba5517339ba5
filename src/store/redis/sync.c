/* SPDX-License-Identifier: MIT */
/*
 * The synchronous transport of the Redis store (sync.h).
 *
 * Nodes: one for a single server; in a cluster, one per master, found from
 * CLUSTER SLOTS, each key's command sent to the master of its slot
 * (cluster.c), MOVED followed (the slot map refreshed), ASK followed once
 * with ASKING, at most RATE__REDIS_MAX_REDIRECTS redirections per command.
 * Each node has a circuit breaker (node.h): the node's own calls count,
 * map refreshes are outside it.
 *
 * Connections: a few per node (pool_size, 2 by default), each shared by
 * all callers and pipelined both ways (see struct conn): commands go out
 * in batches while earlier replies are still being read, the way
 * auto-pipelining clients work, with no I/O thread: the callers
 * themselves take turns writing and reading.  Each command has a deadline,
 * its call's start plus the command timeout (one for a whole library call:
 * a decision's commands, their redirections and a NOSCRIPT's resend share
 * it; call.h, rate__call_begin): the reader waits (poll) no longer
 * than the earliest deadline of the commands in flight, looked at again
 * every RECHECK_NS (a command sent later may have an earlier deadline),
 * then fails them all; a connection made for queued commands is made
 * within the first one's deadline.  A connection that failed is dropped,
 * and reconnecting waits for the node's backoff (node.h).
 */
#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/futex.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "sha1.h"
#include "sync.h"

#define RECHECK_NS (10 * UINT64_C(1000000)) /* a reader's deadline looked at */
/* A connection's batches written and not answered yet: a caller finding
 * as many out queues its command for the reader to send once one is
 * answered, so that callers who come while Redis works share one write
 * (one send a decision cost the client and Redis a system call and a
 * wake-up each), and Redis still has the next batch when it is done. */
#define MAX_BATCHES 2
#define NBELLS 4 /* a connection's futex words for its callers (struct conn) */

/* One caller's command on a shared connection. */
typedef struct mreq {
    redisReply *reply; /* out, on RATE_OK: NULL when read into ints */
    rate__rsync_ints_t *ints; /* an array of integers is read here (NULL:
                                 every reply is a reply object) */
    int status;        /* out */
    /* Bit 0: done (reply and status are set); above it, a count bumped to
     * hand the caller a role.  The caller sleeps on its connection's bell
     * until this changes. */
    _Atomic uint32_t sig;
    struct mreq *next;
    uint64_t deadline_ns; /* the call's start plus the command timeout */
    unsigned skip;        /* replies to drop before its own (ASKING's) */
    bool last;            /* the last command of its batch */
    unsigned bell;        /* its bell and bit there (queue order) */
    uint32_t bit;
} mreq_t;

/* A connection shared by every caller, pipelined both ways.  A caller that
 * finds no one writing sends every queued command in one write (it is the
 * writer); a caller that finds no one reading reads the replies in order
 * and hands each to its caller until its own has come (it is the reader).
 * Writing never waits for replies, so commands keep flowing while earlier
 * replies are read and their callers woken: Redis is not left idle while
 * callers wait, and concurrent callers share round trips.  With
 * MAX_BATCHES written and unanswered, what comes is queued and the reader
 * sends it when a batch's last reply is read.  A lone caller
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
    unsigned batches;  /* written, their last reply not read yet */
    bool broken;       /* failed: no more I/O; dropped once no role is on it */
    /* Callers sleep on a bell (a futex word, moved on by every wake-up),
     * each with one bit of its 32, given in queue order, so that the
     * reader wakes every caller a read answered in one system call or
     * two.  The callers on a connection are answered in order, so those
     * waiting are consecutive: up to NBELLS * 32 callers share no bit. */
    _Atomic uint32_t bell[NBELLS];
    unsigned nbit; /* the next caller's place */
    redisContext *ctx; /* NULL: not connected */
    rate__backoff_t backoff; /* reconnecting */
} conn_t;

/* A server: the single one, or a master of the cluster. */
struct rate__snode {
    char host[RC_HOST_MAX];
    int port; /* 0: host is a unix socket's path */
    conn_t *conns;
    unsigned nconns;
    atomic_uint next_conn;  /* round robin over the connections */
    rate__breaker_t brk;
};
typedef struct rate__snode node_t;


static int call_node(redis_store_t *r, uint64_t dl, node_t *n, bool asking,
                     int argc, const char **argv, const size_t *lens,
                     rate__rsync_ints_t *ints, redisReply **out);

#define deadline_of rate__rsync_deadline

void rate__rsync_set_err(redis_store_t *r, const char *msg)
{
    pthread_mutex_lock(&r->err_lock);
    snprintf(r->last_err, sizeof r->last_err, "%s", msg);
    atomic_store(&r->err_call, false);
    pthread_mutex_unlock(&r->err_lock);
}

/* A call's failure on node n ("HOST:PORT: WHY"), kept until a later
 * reply is no error (call_node). */
static void note_call_err(redis_store_t *r, const node_t *n, const char *why)
{
    pthread_mutex_lock(&r->err_lock);
    /* cut to fit last_err: the host, then the server's text */
    if (n == NULL)
        snprintf(r->last_err, sizeof r->last_err, "%s", why);
    else if (n->port == 0)
        snprintf(r->last_err, sizeof r->last_err, "%.64s: %.180s", n->host,
                 why);
    else
        snprintf(r->last_err, sizeof r->last_err, "%.64s:%d: %.180s",
                 n->host, n->port, why);
    atomic_store(&r->err_call, true);
    pthread_mutex_unlock(&r->err_lock);
}

/* The node of this thread's last reply (call_node), for
 * rate__rsync_replied: nodes live as long as their store. */
static _Thread_local const node_t *replied_by;

static unsigned node_index(redis_store_t *r, const node_t *n);

void rate__rsync_replied(redis_store_t *r, const char *text)
{
    const node_t *n = replied_by;
    char why[192];
    if (n != NULL && node_index(r, n) == RATE__REDIS_MAX_NODES)
        n = NULL; /* another store's */
    snprintf(why, sizeof why, "replied: %.170s", text);
    note_call_err(r, n, why);
}

/* Why a connection failed under calls (conn_break), for the last error. */
static void note_broken(redis_store_t *r, const node_t *n, int rc,
                        const redisContext *ctx)
{
    char why[192];
    if (rc == RATE_ETIMEDOUT)
        snprintf(why, sizeof why,
                 "no reply within the command timeout (%llu ms)",
                 (unsigned long long)((r->command_ns + 500000) / 1000000));
    else
        snprintf(why, sizeof why, "connection lost: %.150s",
                 ctx != NULL && ctx->err ? ctx->errstr
                 : errno != 0            ? strerror(errno)
                                         : "the socket failed");
    note_call_err(r, n, why);
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
 * scripts (unless SCRIPT LOAD is refused: EVAL after NOSCRIPT), and
 * checks that the user may run what the store needs; all of it by
 * `deadline`, the TCP connection within the connect timeout too.  The
 * scripts' names are known before (protocol.c, script_names). */
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
    char probe_sha[41];
    const char *src;
    size_t len;
    rate__redis_script(RATE__REDIS_PROBE_SCRIPT, &src, &len);
    rate__sha1_hex(src, len, probe_sha);
    for (unsigned i = 0; rc == RATE_OK && rate__redis_script(i, &src, &len);
         i++) {
        rc = hs_command(c, deadline, 3,
                        (const char *[]){"SCRIPT", "LOAD", src},
                        (size_t[]){6, 4, len}, &rep);
        if (rc == RATE_ESTORE && rep != NULL) {
            /* Refused (an ACL without SCRIPT LOAD, a managed Redis that
             * renamed it): a call's NOSCRIPT sends the script with EVAL,
             * which caches it, as on a node that lost its scripts. */
            rc = RATE_OK;
            freeReplyObject(rep);
            rep = NULL;
            break;
        }
        /* The store's scripts were named at creation (script_names), as
         * Redis names them: loaded, they run under those names. */
        if (rc != RATE_OK || rep->type != REDIS_REPLY_STRING || rep->len != 40)
            rc = rate__fail(err, errlen, rc ? rc : RATE_ESTORE,
                            "%s: SCRIPT LOAD failed: %s", where,
                            rep_text(c, rep));
        freeReplyObject(rep);
        rep = NULL;
    }
    if (rc == RATE_OK) {
        /* What the store will run, on a key of its namespace: an ACL
         * refuses it (NOPERM) before anything runs, and before a cluster
         * node redirects (MOVED: allowed). */
        char key[RATE_KEY_MAX + 300];
        int kl = snprintf(key, sizeof key, "%.*s{}", (int)r->proto.prefix_len,
                          r->proto.prefix);
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
    if (!rate__backoff_ready(&c->backoff, now))
        return RATE_ESTORE; /* still backing off: fail at once */
    int rc = open_conn(r, n->host, n->port, deadline, NULL, out, err,
                       sizeof err);
    if (rc != RATE_OK) {
        atomic_fetch_add(&r->st_connect_failures, 1);
        rate__rsync_set_err(r, err);
        rate__backoff_failed(&c->backoff, now);
    } else {
        rate__backoff_ok(&c->backoff);
        rate__rsync_set_err(r, "");
    }
    return rc;
}

/* Waking callers.  Marking one done may be its last touch by another
 * thread: the caller may return (its mreq_t is on its stack) as soon as it
 * sees the bit, so its bell bit is read first, and the wake-up names only
 * the connection's bell.  A caller woken for another's bit (NBELLS * 32
 * places apart in the queue) finds its sig unchanged and sleeps again. */
#define SIG_DONE 1u
#define SIG_TURN 2u

/* The callers to wake: a mask of bits for each bell. */
typedef struct peal {
    uint32_t bits[NBELLS];
} peal_t;

/* Wakes the callers sleeping with any of p's bits, after their sig changed,
 * and clears p. */
static void ring(conn_t *c, peal_t *p)
{
    for (unsigned b = 0; b < NBELLS; b++)
        if (p->bits[b] != 0) {
            atomic_fetch_add_explicit(&c->bell[b], 1, memory_order_release);
            syscall(SYS_futex, &c->bell[b], FUTEX_WAKE_BITSET_PRIVATE,
                    INT_MAX, NULL, NULL, p->bits[b]);
            p->bits[b] = 0;
        }
}

static bool peal_empty(const peal_t *p)
{
    uint32_t any = 0;
    for (unsigned b = 0; b < NBELLS; b++)
        any |= p->bits[b];
    return any == 0;
}

/* Marks q done, its bit added to p, to be rung. */
static void set_done(mreq_t *q, peal_t *p)
{
    p->bits[q->bell] |= q->bit;
    atomic_fetch_or_explicit(&q->sig, SIG_DONE, memory_order_release);
}

/* Hands q's caller a role: it is in a queue, so not done, so alive. */
static void give_turn(conn_t *c, mreq_t *q)
{
    peal_t p = {{0}};
    p.bits[q->bell] = q->bit;
    atomic_fetch_add_explicit(&q->sig, SIG_TURN, memory_order_release);
    ring(c, &p);
}

static bool is_done(mreq_t *q)
{
    return atomic_load_explicit(&q->sig, memory_order_acquire) & SIG_DONE;
}

/* Ends every request of a list with the status rc.  Under c->lock. */
static void fail_all(conn_t *c, mreq_t *q, int rc)
{
    peal_t p = {{0}};
    for (mreq_t *nx; q != NULL; q = nx) {
        nx = q->next; /* q may be gone once it is done */
        q->status = rc;
        q->reply = NULL;
        set_done(q, &p);
    }
    ring(c, &p);
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
    fail_all(c, c->fly, rc);
    c->fly = c->fly_tail = NULL;
    c->batches = 0;
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
    rate__backoff_now(&c->backoff); /* reconnect at once, then back off */
    if (c->head != NULL)
        give_turn(c, c->head);
}

/* Fails every queued command.  Under c->lock. */
static void fail_queued(conn_t *c, int rc)
{
    fail_all(c, c->head, rc);
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
    while (c->head != NULL && !c->broken && c->batches < MAX_BATCHES) {
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
        c->tail->last = true;
        c->batches++;
        c->head = c->tail = NULL;
        int fd = c->ctx->fd;
        uint64_t deadline = first_deadline(c->fly);
        pthread_mutex_unlock(&c->lock);
        int rc = send_all(fd, buf, len, deadline);
        pthread_mutex_lock(&c->lock);
        if (rc != RATE_OK && !c->broken)
            note_broken(r, n, rc, NULL);
        if (rc != RATE_OK)
            conn_break(c, rc);
    }
    c->writing = false;
    conn_settle(c);
}

/* The next reply, when it is an array of integers read whole from the
 * reader's buffer (rate__redis_ints_parse): taken from the buffer into
 * *iv.  As that parse: its length, 0 for a beginning of one (wait for
 * more), -1 for another reply or one hiredis's reader has begun. */
static long ints_take(redisReader *rd, rate__rsync_ints_t *iv)
{
    if (rd->err || rd->ridx != -1)
        return -1;
    long k = rate__redis_ints_parse(rd->buf + rd->pos, rd->len - rd->pos,
                                    iv->v, RATE__RSYNC_INTS, &iv->n);
    if (k > 0) {
        rd->pos += (size_t)k;
        if (rd->pos >= 1024) { /* the reader's own rule */
            sdsrange(rd->buf, (int)rd->pos, -1);
            rd->pos = 0;
            rd->len = sdslen(rd->buf);
        }
    }
    return k;
}

/* Hands q its reply: rep, or the integers *iv (rep NULL). */
static void hand_over(mreq_t *q, redisReply *rep, const rate__rsync_ints_t *iv)
{
    q->reply = rep;
    q->status = RATE_OK;
    if (iv != NULL)
        *q->ints = *iv;
}

/* The reader: reads replies in order and hands each to its caller, until
 * me's own has come or nothing is in flight; it waits no later than the
 * earliest deadline in flight, then fails them all.  The callers answered
 * are woken together (one ring) once no whole reply is left to read, and
 * after the lock is let go, so that waking them (a system call) never
 * holds up the others.  Called and returns with c->lock held. */
static void read_replies(redis_store_t *r, node_t *n, conn_t *c, mreq_t *me)
{
    redisContext *ctx = c->ctx;
    peal_t answered = {{0}}; /* callers done and not woken yet */

    c->reading = true;
    while (!is_done(me) && c->fly != NULL && !c->broken) {
        void *rep = NULL;
        int rc = RATE_OK;
        uint64_t deadline = first_deadline(c->fly);
        /* q (c->fly) stays first until this reply is handed over: only
         * the reader takes from fly, and a writer that fails ends the
         * loop (broken). */
        bool ints = c->fly->ints != NULL && c->fly->skip == 0;
        rate__rsync_ints_t iv;
        long took = -1;
        pthread_mutex_unlock(&c->lock);
        while (rc == RATE_OK && rep == NULL) {
            took = ints ? ints_take(ctx->reader, &iv) : -1;
            if (took > 0)
                break;
            if (took < 0) { /* another reply, or hiredis's reader's */
                ints = false;
                if (redisGetReplyFromReader(ctx, &rep) != REDIS_OK) {
                    rc = RATE_ESTORE; /* not the protocol: give up on it */
                    break;
                }
                if (rep != NULL)
                    break;
            }
            ring(c, &answered);
            if ((rc = wait_reply(c, ctx->fd, &deadline)) == RATE_OK &&
                redisBufferRead(ctx) != REDIS_OK)
                rc = reply_status(ctx, NULL);
        }
        pthread_mutex_lock(&c->lock);
        if (c->broken) { /* the writer failed meanwhile */
            freeReplyObject(rep);
            break;
        }
        if (rc != RATE_OK) {
            note_broken(r, n, rc, ctx);
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
        if (q->last && c->batches > 0 && --c->batches < MAX_BATCHES &&
            c->head != NULL && !c->writing) {
            write_queued(r, n, c); /* the reader keeps the connection */
            if (c->broken) { /* q's reply is still good: hand it over */
                hand_over(q, rep, took > 0 ? &iv : NULL);
                if (q == me)
                    atomic_fetch_or_explicit(&me->sig, SIG_DONE,
                                             memory_order_relaxed);
                else
                    set_done(q, &answered);
                break;
            }
        }
        hand_over(q, rep, took > 0 ? &iv : NULL);
        if (q == me)
            atomic_fetch_or_explicit(&me->sig, SIG_DONE, memory_order_relaxed);
        else
            set_done(q, &answered);
    }
    c->reading = false;
    conn_settle(c);
    if (!peal_empty(&answered)) {
        pthread_mutex_unlock(&c->lock);
        ring(c, &answered);
        pthread_mutex_lock(&c->lock);
    }
}

/* One command on one connection: *out is the reply (perhaps an error
 * reply) on RATE_OK; otherwise the connection failed (RATE_ESTORE,
 * RATE_ETIMEDOUT).  With asking, ASKING goes first, on the same
 * connection, and its reply is dropped. */
static int conn_call(redis_store_t *r, uint64_t dl, node_t *n, conn_t *c,
                     bool asking, int argc, const char **argv,
                     const size_t *lens, rate__rsync_ints_t *ints,
                     redisReply **out)
{
    mreq_t me = {NULL, ints, RATE_OK, 0, NULL, 0, asking ? 1 : 0, false, 0, 0};
    static const char ask[] = "*1\r\n$6\r\nASKING\r\n";
    size_t pre = asking ? sizeof ask - 1 : 0;
    /* A command is written here once, before the lock is taken; a
     * longer one (a script's text) is written into the queue under it. */
    char small[512];
    size_t len = rate__redis_resp(small, sizeof small, argc, argv, lens);

    *out = NULL;
    if (rate_clock_monotonic_ns() >= dl)
        return RATE_ETIMEDOUT; /* its call's time is up (redirections) */
    pthread_mutex_lock(&c->lock);
    if (c->olen + pre + len > c->ocap) {
        size_t cap = c->ocap ? c->ocap : 4096;
        while (cap < c->olen + pre + len)
            cap *= 2;
        char *p = realloc(c->obuf, cap);
        if (p == NULL) {
            pthread_mutex_unlock(&c->lock);
            return RATE_ENOMEM;
        }
        c->obuf = p;
        c->ocap = cap;
    }
    memcpy(c->obuf + c->olen, ask, pre);
    if (len <= sizeof small)
        memcpy(c->obuf + c->olen + pre, small, len);
    else
        rate__redis_resp(c->obuf + c->olen + pre, len, argc, argv, lens);
    c->olen += pre + len;
    me.deadline_ns = dl;
    me.bell = c->nbit / 32 % NBELLS;
    me.bit = 1u << (c->nbit % 32);
    c->nbit++;
    if (c->tail != NULL)
        c->tail->next = &me;
    else
        c->head = &me;
    c->tail = &me;
    for (;;) {
        if (!c->writing && c->head != NULL && !c->broken &&
            c->batches < MAX_BATCHES) {
            write_queued(r, n, c);
            continue;
        }
        if (!c->reading && c->fly != NULL && !c->broken) {
            if (!is_done(&me)) {
                read_replies(r, n, c, &me);
                continue;
            }
            give_turn(c, c->fly); /* hand the reading on */
        }
        uint32_t seen = atomic_load_explicit(&me.sig, memory_order_acquire);
        if (seen & SIG_DONE)
            break;
        pthread_mutex_unlock(&c->lock);
        uint32_t now;
        for (;;) { /* the bell read first: a ring after it fails the wait */
            uint32_t bell = atomic_load_explicit(&c->bell[me.bell],
                                                 memory_order_acquire);
            if ((now = atomic_load_explicit(&me.sig, memory_order_acquire)) !=
                seen)
                break;
            syscall(SYS_futex, &c->bell[me.bell], FUTEX_WAIT_BITSET_PRIVATE, bell,
                    NULL, NULL, me.bit);
        }
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

/* One command on node n, through its breaker (node.h): open, the call
 * fails at once (RATE_ESTORE); cooled down, one call at a time is let
 * through as the probe, and reconnects at once. */
static int call_node(redis_store_t *r, uint64_t dl, node_t *n, bool asking,
                     int argc, const char **argv, const size_t *lens,
                     rate__rsync_ints_t *ints, redisReply **out)
{
    *out = NULL;
    if (rate_clock_monotonic_ns() >= dl)
        return RATE_ETIMEDOUT; /* the call's time is up before this command
                                  was sent: nothing of the node's doing */
    /* The clock is read only when the breaker has something to time. */
    rate__admit_t a = RATE__ADMIT_GO;
    if (rate__breaker_is_open(&r->breaker, &n->brk))
        a = rate__breaker_admit(&r->breaker, &n->brk,
                                rate_clock_monotonic_ns());
    if (a == RATE__ADMIT_REFUSE) {
        atomic_fetch_add(&r->st_rejected, 1);
        return RATE_ESTORE;
    }
    bool probe = a == RATE__ADMIT_PROBE;
    if (probe)
        for (unsigned i = 0; i < n->nconns; i++)
            rate__backoff_now(&n->conns[i].backoff);
    unsigned i = atomic_fetch_add_explicit(&n->next_conn, 1,
                                           memory_order_relaxed);
    int rc = conn_call(r, dl, n, &n->conns[i % n->nconns], asking, argc,
                       argv, lens, ints, out);
    if (rc == RATE_OK)
        replied_by = n;
    if (rc == RATE_OK &&
        (*out == NULL || (*out)->type != REDIS_REPLY_ERROR) &&
        atomic_load_explicit(&r->err_call, memory_order_relaxed)) {
        /* a call's failure is forgotten at the next reply that is none */
        pthread_mutex_lock(&r->err_lock);
        if (atomic_load(&r->err_call))
            r->last_err[0] = '\0';
        atomic_store(&r->err_call, false);
        pthread_mutex_unlock(&r->err_lock);
    }
    rate__outcome_t o = rc == RATE_OK       ? RATE__OUTCOME_OK
                        : rc == RATE_ENOMEM ? RATE__OUTCOME_NEUTRAL
                                            : RATE__OUTCOME_FAIL;
    if (rate__breaker_outcome(&r->breaker, &n->brk, probe, o,
                              o == RATE__OUTCOME_FAIL
                                  ? rate_clock_monotonic_ns()
                                  : 0))
        atomic_fetch_add(&r->st_opened, 1);
    return rc;
}

int rate__rsync_call_node(redis_store_t *r, uint64_t dl, rate__snode_t *n,
                          int argc, const char **argv, const size_t *lens,
                          redisReply **out)
{
    return call_node(r, dl, n, false, argc, argv, lens, NULL, out);
}

bool rate__rsync_node_open(const redis_store_t *r, const rate__snode_t *n)
{
    return rate__breaker_is_open(&r->breaker, &n->brk);
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
 * NULL when out of memory or RATE__REDIS_MAX_NODES are known. */
static node_t *node_get_in(redis_store_t *r, const char *host, int port)
{
    unsigned k = atomic_load(&r->nnodes);
    for (unsigned i = 0; i < k; i++) {
        node_t *n = atomic_load(&r->nodes[i]);
        if (n->port == port && strcmp(n->host, host) == 0)
            return n;
    }
    if (k == RATE__REDIS_MAX_NODES || strlen(host) >= RC_HOST_MAX)
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
    return RATE__REDIS_MAX_NODES;
}

/* The index of the node host:port, made if new (rc_slot_map's node_of). */
static int node_of(void *ctx, const char *host, int port)
{
    redis_store_t *r = ctx;
    node_t *n = node_get(r, host, port);
    unsigned idx = n ? node_index(r, n) : RATE__REDIS_MAX_NODES;
    return idx < RATE__REDIS_MAX_NODES ? (int)idx : -1;
}

/* Puts a CLUSTER SLOTS reply in the map (slots it does not name: none
 * known).  Under topo_lock.  False for a reply that does not parse. */
static bool apply_slots(redis_store_t *r, const redisReply *rep,
                        const char *self_host)
{
    uint8_t *map = malloc(RC_SLOTS);
    bool ok = map != NULL && rc_slot_map(rep, self_host, node_of, r, map);
    for (unsigned s = 0; ok && s < RC_SLOTS; s++)
        atomic_store_explicit(&r->slot_node[s], map[s], memory_order_relaxed);
    if (ok)
        atomic_fetch_add(&r->st_refreshes, 1);
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
    if (rate__breaker_is_open(&r->breaker, &n->brk))
        return RATE_ESTORE;
    unsigned i = atomic_fetch_add_explicit(&n->next_conn, 1,
                                           memory_order_relaxed);
    return conn_call(r, dl, n, &n->conns[i % n->nconns], false, 2,
                     (const char *[]){"CLUSTER", "SLOTS"}, (size_t[]){7, 5},
                     NULL, out);
}

/* Reads the slot map again from the first node that answers (the masters
 * known, then the seeds not among them), at most once per RATE__REDIS_REFRESH_MIN_NS
 * unless forced.  Whoever finds another thread refreshing goes on without
 * waiting. */
static void refresh_map(redis_store_t *r, uint64_t dl, bool force)
{
    uint64_t now = rate_clock_monotonic_ns();
    if (!r->cluster ||
        !rate__refresh_due(atomic_load(&r->refreshed_at_ns), now, force))
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
int rate__rsync_discover(redis_store_t *r, uint64_t dl, bool wait, char *err,
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
    if (!wait && !rate__backoff_ready(&r->topo_backoff, now)) {
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
        rate__rsync_set_err(r, "");
    } else {
        rate__backoff_failed(&r->topo_backoff, rate_clock_monotonic_ns());
        rate__rsync_set_err(r, e);
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
 * pause), RATE__REDIS_MAX_REDIRECTS of them at most, after which the last
 * redirection's error reply is the answer.  Same results as conn_call. */
int rate__rsync_call(redis_store_t *r, uint64_t dl, const char *key, size_t klen,
                 int argc, const char **argv, const size_t *lens,
                 redisReply **out)
{
    return rate__rsync_call_ints(r, dl, key, klen, argc, argv, lens, NULL,
                                 out);
}

int rate__rsync_call_ints(redis_store_t *r, uint64_t dl, const char *key,
                          size_t klen, int argc, const char **argv,
                          const size_t *lens, rate__rsync_ints_t *ints,
                          redisReply **out)
{
    int rc;
    *out = NULL;
    if (!atomic_load_explicit(&r->ready, memory_order_acquire) &&
        (rc = rate__rsync_discover(r, dl, false, NULL, 0)) != RATE_OK)
        return rc;
    if (!r->cluster)
        return call_node(r, dl, atomic_load(&r->nodes[0]), false, argc, argv,
                         lens, ints, out);
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
                rate__rsync_set_err(r, e);
                return RATE_ESTORE;
            }
            n = atomic_load(&r->nodes[idx - 1]);
        }
        rc = call_node(r, dl, n, asking, argc, argv, lens, ints, out);
        asking = false;
        if (rc != RATE_OK) {
            refresh_map(r, dl, false); /* a master gone: its replica, later */
            return rc;
        }
        redisReply *rep = *out;
        if (rep == NULL || rep->type != REDIS_REPLY_ERROR || redirs == RATE__REDIS_MAX_REDIRECTS)
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
                 * creation): a store error, which last_error explains
                 * (store.c, reply_ok). */
                refresh_map(r, dl, false);
            }
            return RATE_OK;
        }
        node_t *to = NULL;
        if (kind != RC_TRYAGAIN) {
            if ((to = node_find(r, host, port)) == NULL) {
                to = node_get(r, host, port); /* a node new to us */
            }
            unsigned idx = to ? node_index(r, to) : RATE__REDIS_MAX_NODES;
            if (kind == RC_MOVED && idx < RATE__REDIS_MAX_NODES)
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
        else if (rate_clock_monotonic_ns() + RATE__REDIS_TRYAGAIN_NS < dl)
            sleep_ns(RATE__REDIS_TRYAGAIN_NS);
        else
            return RATE_ETIMEDOUT;
    }
}


bool rate__rsync_topology(redis_store_t *r, rc_addr_t *nodes,
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

/* The masters now in the slot map (the single server: it), at most cap. */
size_t rate__rsync_masters(redis_store_t *r, rate__snode_t **out, size_t cap)
{
    size_t n = 0;
    if (!r->cluster) {
        out[0] = atomic_load(&r->nodes[0]);
        return 1;
    }
    bool seen[RATE__REDIS_MAX_NODES + 1] = {false};
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

void rate__rsync_init(redis_store_t *r)
{
    pthread_mutex_init(&r->topo_lock, NULL);
    pthread_mutex_init(&r->node_lock, NULL);
    pthread_mutex_init(&r->err_lock, NULL);
}

void rate__rsync_fini(redis_store_t *r)
{
    for (unsigned i = 0; i < atomic_load(&r->nnodes); i++)
        node_free(atomic_load(&r->nodes[i]));
    pthread_mutex_destroy(&r->topo_lock);
    pthread_mutex_destroy(&r->node_lock);
    pthread_mutex_destroy(&r->err_lock);
}

void rate__rsync_last_error(redis_store_t *r, char *buf, size_t cap)
{
    pthread_mutex_lock(&r->err_lock);
    snprintf(buf, cap, "%s", r->last_err);
    pthread_mutex_unlock(&r->err_lock);
}
