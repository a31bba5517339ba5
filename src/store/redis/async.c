/* SPDX-License-Identifier: MIT */
/*
 * The asynchronous Redis store: the Redis store's part of a decision over
 * hiredis's asynchronous context, driven by the caller's event loop
 * through rate_loop_t (include/ratelimit_loop.h, docs/async.md).
 *
 * It speaks the synchronous store's protocol (protocol.c builds every
 * command and parses every reply), to a single
 * server or to the masters of a Redis Cluster: both are a list of nodes
 * and a slot map (a single server is one node serving every slot), each
 * node with at most one connection, made on demand without blocking, its
 * own reconnect backoff and its own circuit breaker (node.h, as the
 * synchronous transport's).  A decision (a job)
 * is one command at a time: the step script (EVALSHA; after NOSCRIPT,
 * SCRIPT LOAD on that connection and EVALSHA again, then EVAL), or, for a request the script declines, HMGET, the C step,
 * and the compare-and-set script, again from HMGET on a conflict.  Each
 * command goes to the master of its key's slot; MOVED mends the map (and
 * asks the cluster for the whole map again, CLUSTER SLOTS on a connected
 * node, asynchronously), ASK sends ASKING and the command to the node
 * named, TRYAGAIN parks the job for TRYAGAIN_NS: MAX_REDIRECTS per
 * command, then the error reply stands (a store error).
 *
 * Jobs in flight sit on a list in the order they started, which is the
 * order of their deadlines (start plus the command timeout): one loop
 * timer is armed for the oldest (or for the first parked job's resend,
 * when sooner); when the oldest passes, the connection its command is on
 * is dropped, and hiredis hands every command on it back with no reply,
 * which completes its job with RATE_ETIMEDOUT (a parked job just
 * completes).  Every job not parked, nor waiting for its key's turn (a
 * C-step job: see turn_take), has exactly one command in one
 * connection's queue until it completes, so it is freed only in that
 * command's callback, or by the timer while parked or waiting: a job can
 * never complete twice nor be forgotten.
 *
 * Everything else of the store contract (load, cas, decide, now, remove)
 * goes to a synchronous Redis store over the same URL, which this store
 * owns: the limiter's policy records, resets, and the synchronous calls.
 * Its topology, read once at creation (no I/O), is this store's first
 * slot map.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <hiredis/async.h>
#include <hiredis/hiredis.h>

#include "async.h"
#include "lease.h"
#include "ratelimit_redis.h"

#define CAS_RETRIES 16
#define MAX_NODES RATE__REDIS_MAX_NODES
#define MAX_REDIRECTS RATE__REDIS_MAX_REDIRECTS
#define TRYAGAIN_NS RATE__REDIS_TRYAGAIN_NS
#define SCRIPTS_MAX 8    /* scripts a connection loads (protocol.c has 7) */
/* Commands queued on a connection in one turn of the loop that are
 * written without waiting for the turn's end: a turn that starts many
 * decisions (the replies of a whole batch read at once) then hands Redis
 * the first of them while it makes the others, and Redis, which would
 * wait for the whole batch, works on one part while the next is made
 * (docs/performance.md, "The asynchronous store keeps Redis busy"). */
#define FLUSH_AT 16

typedef struct astore astore_t;
typedef struct anode anode_t;

/* One connection: hiredis's context and the loop's watch on its socket.
 * Alive while hiredis may still call its hooks (until cleanup) and while
 * one of its loop callbacks runs (refs). */
typedef struct aconn {
    anode_t *n;
    redisAsyncContext *ac; /* NULL once hiredis has let go of it */
    void *io;              /* the loop's watch; NULL after cleanup */
    unsigned events;       /* watched */
    unsigned refs;         /* 1 for hiredis, 1 per running loop callback */
    bool ready;            /* connected (the connect callback said so) */
    bool dropped;          /* by drop(), not lost */
    uint64_t last_reply;   /* when a reply last came on it (now_of) */
    int drop_rc; /* what a command handed back without reply fails with */
    /* The scripts this connection was asked to SCRIPT LOAD after a
     * NOSCRIPT (a node that never had them, or flushed them). */
    struct aload {
        const char *src; /* the script (protocol.c's text), NULL: free */
        int state;       /* LOAD_SENT, LOAD_DONE */
    } loads[SCRIPTS_MAX];
    int fn_load; /* the Functions library: LOAD_SENT, LOAD_DONE, or 0 */
    unsigned unsent; /* decisions' commands queued since the last write */
} aconn_t;

enum { LOAD_SENT = 1, LOAD_DONE };

/* A server: the single one, or a master of the cluster. */
struct anode {
    astore_t *s;
    char host[RC_HOST_MAX];
    int port;      /* 0: host is a unix socket's path */
    aconn_t *conn; /* the current connection, or NULL */
    rate__backoff_t bo; /* reconnecting */
    rate__breaker_t brk;
    bool broken; /* the loop refused a watch: drop at the timer */
};

enum { PH_DECIDE, PH_LOAD, PH_CAS, PH_LEASE };

/* One decision in flight. */
typedef struct ajob {
    astore_t *s;
    rate_job_t *job;
    struct ajob *prev, *next;   /* the store's list, oldest first */
    struct ajob *pprev, *pnext; /* the parked list (TRYAGAIN) */
    uint64_t deadline;
    uint64_t resend_at; /* parked: when to send again */
    anode_t *node;      /* where its command is; NULL while parked */
    bool parked;
    bool asking;        /* its command went after ASKING */
    bool probe;         /* its command is its node's breaker probe */
    bool taken;         /* start() said RATE_OK: a refusal is no longer
                           "at once" */
    bool module;        /* its decide is RATELIMIT.STEP */
    bool fcall;         /* its decide is a lean script's FCALL */
    bool abandoned;     /* timed out on a live connection: done() was
                           called; its reply, when it comes, is dropped */
    unsigned no_fn;     /* "no such function" replies to its FCALL */
    int phase;
    unsigned noscripts; /* NOSCRIPT replies to its current command */
    unsigned retries;
    unsigned redirs; /* of the current command */
    void *state; /* the step's new state, for the compare-and-set */
    struct kturn *turn; /* a step job's key: its turn, held or waited for */
    struct ajob *qnext; /* waiting: the next in the turn's queue */
    rate__redis_cmd_t cmd; /* last: a job taken again zeroes what is above */
} ajob_t;

/* A key's turn for the C step (load, step, compare-and-set): held by one
 * job at a time, the others on the key waiting in order, so that this
 * store's own jobs on one key do not make each other's compare-and-set
 * fail (a hot key's refunds, a policy the scripts decline). */
typedef struct kturn {
    struct kturn *next; /* in its bucket */
    ajob_t *holder;     /* NULL while handing over */
    ajob_t *qhead, *qtail;
    rate_space_t space;
    size_t len;
    char bytes[]; /* the key, copied */
} kturn_t;

#define TURN_BUCKETS 1024u
#define SPARE_MAX 256u /* jobs kept for the next decisions */

struct astore {
    rate_loop_t loop;
    rate_store_t *sync; /* the synchronous store over the same URL */
    void *sync_self;    /* its back end */
    rate__redis_paths_t *paths; /* the synchronous store's (paths.h) */
    const rate_store_methods_t *sm;
    const rate__redis_proto_t *proto; /* the synchronous store's */
    rate__redis_conf_t conf;
    anode_t *nodes[MAX_NODES];
    unsigned nnodes;
    uint8_t slot_node[RC_SLOTS]; /* node index + 1; 0: none known */
    bool cluster;                /* a cluster (else one node, every slot) */
    bool refreshing;             /* a CLUSTER SLOTS is out */
    uintptr_t refresh_gen;       /* of the one out (its callback's priv) */
    uint64_t refresh_dl, refreshed_at;
    void *timer;
    bool timer_armed;
    uint64_t timer_at; /* when it expires, if armed */
    ajob_t *head, *tail;
    ajob_t *phead, *ptail; /* parked, in the order of resend_at */
    kturn_t **turns; /* TURN_BUCKETS, allocated at the first step job */
    ajob_t *spare;   /* completed jobs kept for the next, by next */
    unsigned nspare;
    bool closing; /* being freed: no new job */
    bool broken;  /* some node is */
    rate_redis_async_stats_t st;
    char last_err[RC_HOST_MAX + 320]; /* the last failure of a node's
                           connection (cut to fit); "" since one connected */
    bool err_replied; /* last_err is an error reply's: "" at the next reply */
};

static const rate_store_methods_t async_methods;

static uint64_t now_of(const astore_t *s)
{
    if (s->loop.now != NULL)
        return s->loop.now(s->loop.ud);
    return rate_clock_monotonic_ns();
}

/* ----------------------------------------------------------- the loop */

static void arm_at(astore_t *s, uint64_t at, uint64_t now)
{
    if (s->closing || (s->timer_armed && s->timer_at <= at))
        return;
    if (s->loop.timer_arm(s->loop.ud, s->timer, at > now ? at - now : 0) ==
        0) {
        s->timer_armed = true;
        s->timer_at = at;
    }
}

/* Arms the timer for what comes first: a broken node, a parked job's
 * resend, the oldest deadline. */
static void arm(astore_t *s, uint64_t now)
{
    if (s->broken)
        arm_at(s, now, now);
    if (s->phead != NULL)
        arm_at(s, s->phead->resend_at, now);
    if (s->head != NULL)
        arm_at(s, s->head->deadline, now);
}

static void backoff(anode_t *n)
{
    rate__backoff_failed(&n->bo, now_of(n->s));
}

static void conn_unref(aconn_t *c)
{
    if (--c->refs == 0)
        free(c);
}

/* A connection commands can still be queued on. */
static bool usable(const aconn_t *c)
{
    return c != NULL && c->ac != NULL &&
           !(c->ac->c.flags & (REDIS_DISCONNECTING | REDIS_FREEING));
}

static void watch(aconn_t *c, unsigned on, unsigned off)
{
    unsigned ev = (c->events | on) & ~off;
    anode_t *n = c->n;
    if (c->io == NULL || ev == c->events)
        return;
    c->events = ev;
    if (n->s->loop.io_set(n->s->loop.ud, c->io, ev) != 0 && n->conn == c) {
        /* The loop refused: the connection is dropped from the timer, not
         * from inside hiredis (this runs within its calls). */
        n->broken = true;
        n->s->broken = true;
        arm(n->s, now_of(n->s));
    }
}

static void h_add_read(void *p) { watch(p, RATE_LOOP_READ, 0); }
static void h_del_read(void *p) { watch(p, 0, RATE_LOOP_READ); }
static void h_add_write(void *p) { watch(p, RATE_LOOP_WRITE, 0); }
static void h_del_write(void *p) { watch(p, 0, RATE_LOOP_WRITE); }

/* hiredis lets go of the context (it frees it after this). */
static void h_cleanup(void *p)
{
    aconn_t *c = p;
    anode_t *n = c->n;
    astore_t *s = n->s;

    if (c->io != NULL)
        s->loop.io_free(s->loop.ud, c->io);
    c->io = NULL;
    c->ac = NULL;
    if (n->conn == c) { /* it failed (drop() unsets conn first) */
        n->conn = NULL;
        backoff(n);
    }
    conn_unref(c); /* hiredis calls nothing with c after this */
}

static void on_io(void *arg, unsigned events)
{
    aconn_t *c = arg;

    c->refs++;
    if ((events & RATE_LOOP_READ) && c->ac != NULL)
        redisAsyncHandleRead(c->ac);
    if ((events & RATE_LOOP_WRITE) && c->ac != NULL) {
        c->unsent = 0;
        redisAsyncHandleWrite(c->ac);
    }
    conn_unref(c);
}

/* Drop node n's connection: every command on it comes back without a
 * reply (its job failing with rc), before this returns (it is never
 * called from inside one of hiredis's callbacks). */
static void drop(anode_t *n, int rc)
{
    aconn_t *c = n->conn;

    n->broken = false;
    if (c == NULL)
        return;
    n->conn = NULL;
    backoff(n);
    if (c->ac != NULL) {
        c->drop_rc = rc;
        c->dropped = true;
        redisAsyncFree(c->ac);
    }
}

/* ---------------------------------------------------------- the nodes */

/* The node host:port, made if it is new; NULL when out of memory or
 * MAX_NODES are known. */
static anode_t *node_get(astore_t *s, const char *host, int port)
{
    for (unsigned i = 0; i < s->nnodes; i++)
        if (s->nodes[i]->port == port && strcmp(s->nodes[i]->host, host) == 0)
            return s->nodes[i];
    if (s->nnodes == MAX_NODES || strlen(host) >= RC_HOST_MAX)
        return NULL;
    anode_t *n = calloc(1, sizeof *n);
    if (n == NULL)
        return NULL;
    n->s = s;
    snprintf(n->host, sizeof n->host, "%s", host);
    n->port = port;
    s->nodes[s->nnodes++] = n;
    return n;
}

static unsigned node_index(const astore_t *s, const anode_t *n)
{
    for (unsigned i = 0; i < s->nnodes; i++)
        if (s->nodes[i] == n)
            return i;
    return MAX_NODES;
}

static anode_t *node_of_slot(const astore_t *s, unsigned slot)
{
    unsigned idx = s->slot_node[slot];
    return idx == 0 ? NULL : s->nodes[idx - 1];
}

static bool breaker_open(const astore_t *s, const anode_t *n)
{
    return rate__breaker_is_open(&s->conf.breaker, &n->brk);
}

/* What a command on n came to: answered (ok), or failed with no reply or
 * none in time.  The breaker counts the failures in a row; a probe's
 * outcome closes it or opens it again. */
static void outcome(ajob_t *j, anode_t *n, bool ok)
{
    astore_t *s = j->s;
    bool probe = j->probe;

    j->probe = false;
    if (n == NULL || s->closing)
        return;
    rate__breaker_outcome(&s->conf.breaker, &n->brk, probe,
                          ok ? RATE__OUTCOME_OK : RATE__OUTCOME_FAIL,
                          now_of(s));
}

/* Says what failed on n, for rate_store_redis_last_error. */
static void note_err(anode_t *n, const char *what, const char *detail)
{
    char where[RC_HOST_MAX + 16];

    if (n->port == 0)
        snprintf(where, sizeof where, "unix:%s", n->host);
    else
        snprintf(where, sizeof where, "%s:%d", n->host, n->port);
    snprintf(n->s->last_err, sizeof n->s->last_err, "%s: %s%s%.200s", where,
             what, detail != NULL ? ": " : "", detail != NULL ? detail : "");
    n->s->err_replied = false;
}

static void on_connect(const redisAsyncContext *ac, int status)
{
    aconn_t *c = ac->data;

    if (status == REDIS_OK) {
        c->ready = true;
        rate__backoff_ok(&c->n->bo);
        c->n->s->last_err[0] = '\0';
    } else { /* hiredis frees the context now: h_cleanup backs off */
        note_err(c->n, "cannot connect", ac->errstr);
    }
}

static void on_setup(redisAsyncContext *ac, void *reply, void *priv)
{
    const redisReply *rep = reply;
    aconn_t *c = ac->data;
    (void)priv;
    if (rep != NULL && rep->type == REDIS_REPLY_ERROR) {
        note_err(c->n, "AUTH or SELECT refused", rep->str);
        redisAsyncDisconnect(ac);
    }
}

/* A new connection to n, made without blocking: RATE_OK with n->conn, or
 * RATE_ESTORE (backing off), RATE_ENOMEM. */
static int connect_node(anode_t *n)
{
    astore_t *s = n->s;
    aconn_t *c = calloc(1, sizeof *c);
    if (c == NULL)
        return RATE_ENOMEM;
    s->st.connects++;
    redisAsyncContext *ac = n->port == 0
                                ? redisAsyncConnectUnix(n->host)
                                : redisAsyncConnect(n->host, n->port);
    if (ac == NULL || ac->err) {
        note_err(n, "cannot connect", ac != NULL ? ac->errstr : "no memory");
        if (ac != NULL)
            redisAsyncFree(ac);
        free(c);
        backoff(n);
        return RATE_ESTORE;
    }
    c->n = n;
    c->ac = ac;
    c->refs = 1;
    c->drop_rc = RATE_ESTORE;
    c->io = s->loop.io_new(s->loop.ud, ac->c.fd, on_io, c);
    if (c->io == NULL) {
        c->ac = NULL;
        redisAsyncFree(ac);
        free(c);
        backoff(n);
        return RATE_ESTORE;
    }
    ac->data = c;
    ac->ev.data = c;
    ac->ev.addRead = h_add_read;
    ac->ev.delRead = h_del_read;
    ac->ev.addWrite = h_add_write;
    ac->ev.delWrite = h_del_write;
    ac->ev.cleanup = h_cleanup;
    redisAsyncSetConnectCallback(ac, on_connect);
    n->conn = c;
    int ok = REDIS_OK;
    if (s->conf.password[0] != '\0') {
        if (s->conf.user[0] != '\0')
            ok = redisAsyncCommand(ac, on_setup, NULL, "AUTH %s %s",
                                   s->conf.user, s->conf.password);
        else
            ok = redisAsyncCommand(ac, on_setup, NULL, "AUTH %s",
                                   s->conf.password);
    }
    if (ok == REDIS_OK && s->conf.db != 0 && !s->cluster)
        ok = redisAsyncCommand(ac, on_setup, NULL, "SELECT %d", s->conf.db);
    if (ok != REDIS_OK) {
        drop(n, RATE_ESTORE);
        return RATE_ESTORE;
    }
    return RATE_OK;
}

/* ------------------------------------------------------ the slot map */

static int node_of(void *ctx, const char *host, int port)
{
    astore_t *s = ctx;
    anode_t *n = node_get(s, host, port);
    unsigned idx = n ? node_index(s, n) : MAX_NODES;
    return idx < MAX_NODES ? (int)idx : -1;
}

static void on_slots(redisAsyncContext *ac, void *reply, void *priv)
{
    aconn_t *c = ac->data;
    astore_t *s = c->n->s;
    const redisReply *rep = reply;

    if ((uintptr_t)priv != s->refresh_gen)
        return; /* an answer given up on */
    s->refreshing = false;
    if (rep == NULL || rep->type != REDIS_REPLY_ARRAY || s->closing)
        return;
    uint8_t *map = malloc(RC_SLOTS);
    if (map != NULL && rc_slot_map(rep, c->n->host, node_of, s, map)) {
        memcpy(s->slot_node, map, RC_SLOTS);
        s->st.refreshes++;
    }
    free(map);
}

/* Asks the cluster for its slot map again (CLUSTER SLOTS on a node that
 * is connected and whose breaker is closed; else one it may connect to),
 * without waiting for the answer: at most one out at a time (given up
 * after the command timeout) and one per REFRESH_MIN_NS. */
static void refresh(astore_t *s)
{
    uint64_t now = now_of(s);

    if (!s->cluster || s->closing ||
        !rate__refresh_due(s->refreshed_at, now, false))
        return;
    if (s->refreshing && now < s->refresh_dl)
        return;
    anode_t *n = NULL;
    for (int pass = 0; pass < 3 && n == NULL; pass++)
        for (unsigned i = 0; i < s->nnodes && n == NULL; i++) {
            anode_t *m = s->nodes[i];
            if (breaker_open(s, m))
                continue;
            if ((pass == 0 && usable(m->conn) && m->conn->ready) ||
                (pass == 1 && usable(m->conn)) ||
                (pass == 2 && m->conn == NULL &&
                 rate__backoff_ready(&m->bo, now) &&
                 connect_node(m) == RATE_OK))
                n = m;
        }
    if (n == NULL)
        return;
    s->refreshed_at = now;
    s->refreshing = true;
    s->refresh_dl = now + s->conf.command_ns;
    s->refresh_gen++;
    if (redisAsyncCommand(n->conn->ac, on_slots, (void *)s->refresh_gen,
                          "CLUSTER SLOTS") != REDIS_OK)
        s->refreshing = false;
}

/* ----------------------------------------------------------- the jobs */

static bool store_failure(int rc)
{
    return rc == RATE_ESTORE || rc == RATE_ETIMEDOUT;
}

static void unpark(ajob_t *j)
{
    astore_t *s = j->s;
    if (j->pprev != NULL)
        j->pprev->pnext = j->pnext;
    else
        s->phead = j->pnext;
    if (j->pnext != NULL)
        j->pnext->pprev = j->pprev;
    else
        s->ptail = j->pprev;
    j->pprev = j->pnext = NULL;
    j->parked = false;
}

static void turn_leave(ajob_t *j);

/* A job to fill, zeroed but for its command (a few KB that every
 * command's builder sets itself): one of the spare ones, else new. */
static ajob_t *job_get(astore_t *s)
{
    ajob_t *j = s->spare;
    if (j != NULL) {
        s->spare = j->next;
        s->nspare--;
    } else if ((j = malloc(sizeof *j)) == NULL) {
        return NULL;
    }
    memset(j, 0, offsetof(ajob_t, cmd));
    j->cmd.k = NULL;
    j->cmd.k2 = NULL;
    j->cmd.lean = -1;
    j->cmd.script = NULL;
    return j;
}

/* A job done with, kept for the next decision unless SPARE_MAX are. */
static void job_put(astore_t *s, ajob_t *j)
{
    if (s->nspare >= SPARE_MAX || s->closing) {
        free(j);
        return;
    }
    j->next = s->spare;
    s->spare = j;
    s->nspare++;
}

/* Completes j with rc (its command's outcome already counted): off the
 * store's lists, back to the spares unless it waits for its reply
 * (abandoned), and then its job answered. */
static void finish(ajob_t *j, int rc)
{
    astore_t *s = j->s;
    rate_job_t *job = j->job;

    if (j->parked)
        unpark(j);
    if (j->turn != NULL)
        turn_leave(j);
    if (j->prev != NULL)
        j->prev->next = j->next;
    else
        s->head = j->next;
    if (j->next != NULL)
        j->next->prev = j->prev;
    else
        s->tail = j->prev;
    rate__redis_cmd_free(&j->cmd);
    free(j->state);
    j->state = NULL;
    j->job = NULL;
    if (!j->abandoned)
        job_put(s, j);
    s->st.completed++;
    s->st.in_flight--;
    if (rc == RATE_ETIMEDOUT)
        s->st.timed_out++;
    if (s->head == NULL && s->timer_armed && !s->broken) {
        s->loop.timer_cancel(s->loop.ud, s->timer);
        s->timer_armed = false;
    }
    job->done(job, rc);
}

/* Times j out while its command stays on a live connection: the caller
 * has its answer by the deadline, and the reply is dropped when it comes
 * (on_reply), so the other commands on that connection go on. */
static void abandon(ajob_t *j)
{
    j->abandoned = true;
    finish(j, RATE_ETIMEDOUT);
}

static void on_reply(redisAsyncContext *ac, void *reply, void *priv);

/* Queue j's command on n's connection (ASKING first if asking), which must
 * be there: RATE_OK or RATE_ESTORE. */
static int send_on(ajob_t *j, anode_t *n, bool asking)
{
    if (!usable(n->conn))
        return RATE_ESTORE;
    redisAsyncContext *ac = n->conn->ac;
    if (asking && redisAsyncCommand(ac, NULL, NULL, "ASKING") != REDIS_OK)
        return RATE_ESTORE;
    char buf[1024]; /* the command's bytes when they fit (protocol.h) */
    size_t len = rate__redis_resp(buf, sizeof buf, j->cmd.argc, j->cmd.av,
                                  j->cmd.al);
    if ((len <= sizeof buf
             ? redisAsyncFormattedCommand(ac, on_reply, j, buf, len)
             : redisAsyncCommandArgv(ac, on_reply, j, j->cmd.argc, j->cmd.av,
                                     j->cmd.al)) != REDIS_OK)
        return RATE_ESTORE;
    j->node = n;
    j->asking = asking;
    /* Every FLUSH_AT commands queued in one turn of the loop are written
     * at once (a failed write is hiredis's to find at its next read or
     * write): Redis starts on them while the rest are made. */
    aconn_t *c = n->conn;
    if (++c->unsent >= FLUSH_AT && c->ready) {
        int done;
        c->unsent = 0;
        (void)redisBufferWrite(&ac->c, &done);
    }
    return RATE_OK;
}

/* Send j's command to node n (NULL: no master known for its slot) through
 * n's breaker and backoff, connecting on demand: RATE_OK, or RATE_ESTORE
 * when refused at once (nothing sent), RATE_ENOMEM. */
static int dispatch(ajob_t *j, anode_t *n, bool asking)
{
    astore_t *s = j->s;
    uint64_t now = now_of(s);
    bool probe = false;
    int rc;

    j->node = NULL;
    if (n == NULL) {
        refresh(s);
        s->st.refused += !j->taken;
        return RATE_ESTORE;
    }
    rate__admit_t a = rate__breaker_admit(&s->conf.breaker, &n->brk, now);
    if (a == RATE__ADMIT_REFUSE) {
        s->st.refused += !j->taken;
        refresh(s); /* a master gone: its replica may serve it now */
        return RATE_ESTORE; /* open: fail at once */
    }
    if (a == RATE__ADMIT_PROBE) {
        probe = true; /* cooled down: this one is the probe, at once */
        rate__backoff_now(&n->bo);
    }
    if (n->conn == NULL) {
        if (!rate__backoff_ready(&n->bo, now)) {
            s->st.refused += !j->taken;
            rc = RATE_ESTORE; /* backing off a failed connection */
        } else {
            rc = connect_node(n);
        }
    } else {
        rc = RATE_OK;
    }
    if (rc == RATE_OK)
        rc = send_on(j, n, asking);
    if (rc != RATE_OK) { /* nothing sent: the probe's turn is free again */
        if (probe)
            rate__breaker_outcome(&s->conf.breaker, &n->brk, true,
                                  RATE__OUTCOME_NEUTRAL, now);
        return rc;
    }
    j->probe = probe;
    return RATE_OK;
}

/* Send j's (new) command to the master of its key's slot. */
static int route(ajob_t *j)
{
    j->redirs = 0;
    return dispatch(j, node_of_slot(j->s, rc_key_slot(j->cmd.k, j->cmd.kl)),
                    false);
}

/* ---------------------------------------------------------- key turns */

/* Whether j has half its command timeout left: enough for a C step's
 * next round trip, unless Redis is slow (sent later, a command's wait on
 * the wire would pass its deadline and take the connection down with
 * every decision on it). */
static bool time_left(const ajob_t *j)
{
    uint64_t now = now_of(j->s);
    return j->deadline > now && j->deadline - now > j->s->conf.command_ns / 2;
}

static size_t turn_bucket(const rate_key_t *k)
{
    uint64_t h = 1469598103934665603u ^ (uint64_t)k->space;
    for (size_t i = 0; i < k->len; i++)
        h = (h ^ (unsigned char)k->bytes[i]) * 1099511628211u;
    return (size_t)(h % TURN_BUCKETS);
}

/* Sends C-step job j (its load built, after a lost compare-and-set) in
 * its key's turn: now if the turn is free, else queued behind the jobs on
 * the key that lost theirs.  RATE_OK, or the error of a send refused at
 * once (the turn left free again).  A job's first try goes without a turn
 * (route): a denial that writes nothing, the common case on a hot key,
 * is one load that waits for no one. */
static int turn_take(ajob_t *j)
{
    astore_t *s = j->s;
    const rate_key_t *k = &j->job->key;

    if (s->turns == NULL &&
        (s->turns = calloc(TURN_BUCKETS, sizeof *s->turns)) == NULL)
        return RATE_ENOMEM;
    kturn_t **b = &s->turns[turn_bucket(k)], *t;
    for (t = *b; t != NULL; t = t->next)
        if (t->len == k->len && t->space == k->space &&
            memcmp(t->bytes, k->bytes, k->len) == 0)
            break;
    if (t != NULL) { /* held, or being handed over (turn_leave's loop) */
        j->turn = t; /* waits: its deadline runs meanwhile (on_timer) */
        if (t->qtail != NULL)
            t->qtail->qnext = j;
        else
            t->qhead = j;
        t->qtail = j;
        return RATE_OK;
    }
    if ((t = calloc(1, sizeof *t + k->len)) == NULL)
        return RATE_ENOMEM;
    memcpy(t->bytes, k->bytes, k->len);
    t->len = k->len;
    t->space = k->space;
    t->next = *b;
    *b = t;
    t->holder = j;
    j->turn = t;
    int rc = route(j);
    if (rc != RATE_OK)
        turn_leave(j);
    return rc;
}

/* j leaves its turn (completed, or refused at once): out of the queue if
 * it waited; if it held it, the next waiter is sent (one past its
 * deadline, or any while the store closes, completes instead); a turn
 * nobody holds or waits for goes. */
static void turn_leave(ajob_t *j)
{
    astore_t *s = j->s;
    kturn_t *t = j->turn;

    j->turn = NULL;
    if (t->holder == j) {
        t->holder = NULL;
    } else { /* a waiter */
        ajob_t *p = NULL, *q = t->qhead;
        while (q != NULL && q != j) {
            p = q;
            q = q->qnext;
        }
        if (q == NULL)
            return; /* cannot be: a job with a turn holds it or waits */
        if (p != NULL)
            p->qnext = j->qnext;
        else
            t->qhead = j->qnext;
        if (t->qtail == j)
            t->qtail = p;
        j->qnext = NULL;
    }
    while (t->holder == NULL && t->qhead != NULL) {
        ajob_t *w = t->qhead;
        t->qhead = w->qnext;
        if (t->qhead == NULL)
            t->qtail = NULL;
        w->qnext = NULL;
        int rc = RATE_ECANCELED;
        if (!s->closing) {
            /* lost, and no time left to try again */
            rc = w->deadline <= now_of(s) ? RATE_ETIMEDOUT : RATE_ECONFLICT;
            if (time_left(w)) {
                t->holder = w;
                if ((rc = route(w)) == RATE_OK)
                    return;
                t->holder = NULL;
            }
        }
        w->turn = NULL; /* completed outside the turn: no recursion */
        finish(w, rc);  /* its callback may take the turn: then it ends */
    }
    if (t->holder != NULL || t->qhead != NULL)
        return;
    kturn_t **b = &s->turns[turn_bucket(&(rate_key_t){t->bytes, t->len,
                                                      t->space})];
    while (*b != t)
        b = &(*b)->next;
    *b = t->next;
    free(t);
}

/* The next command of j, built into j->cmd: the load. */
static int load_cmd(ajob_t *j)
{
    rate__redis_cmd_free(&j->cmd);
    j->phase = PH_LOAD;
    j->noscripts = 0;
    return rate__redis_load_cmd(j->s->proto, &j->job->key, &j->cmd);
}

/* The command of j's decide(), as the synchronous store chooses it: the
 * module's RATELIMIT.STEP when the server has it (or may: asked by the
 * command itself) and the module makes this request, else a lean script
 * by FCALL (EVALSHA where the server has no Functions), else the general
 * script; a request no script decides exactly goes to the C step (the
 * load).  module false: not the module (it just failed). */
static int decide_cmd(ajob_t *j, bool module)
{
    astore_t *s = j->s;
    const rate_decide_req_t *q = j->job->req;
    int rc;

    rate__redis_cmd_free(&j->cmd);
    j->phase = PH_DECIDE;
    j->noscripts = 0;
    j->no_fn = 0;
    j->module = j->fcall = false;
    if (module && q->op == RATE_DECIDE_ACQUIRE &&
        rate__redis_module_try(s->paths)) {
        rc = rate__redis_decide_cmd(s->proto, RATE__VIA_MODULE, false,
                                    &j->job->key, q, &j->cmd);
        if (rc != RATE_ENOTSUP) {
            j->module = rc == RATE_OK;
            return rc;
        }
        rate__redis_cmd_free(&j->cmd);
    }
    bool fcall = rate__redis_fcall_on(s->paths);
    rc = rate__redis_decide_cmd(s->proto, RATE__VIA_SCRIPTS, fcall,
                                &j->job->key, q, &j->cmd);
    if (rc == RATE_ENOTSUP) { /* outside the scripts' range: the step */
        if (q->op != RATE_DECIDE_ACQUIRE)
            s->st.declined_adjustments++;
        else
            s->st.declined++;
        return load_cmd(j);
    }
    j->fcall = rc == RATE_OK && fcall && j->cmd.lean >= 0;
    return rc;
}

/* The command of j's lease operation (lease.h), as the synchronous store
 * chooses it: RATELIMIT.LEASE when the server has the module (or may),
 * else the lease script; with generic_leases, the step's load.  module
 * false: not the module (it just answered it lacks the command). */
static int lease_cmd(ajob_t *j, bool module)
{
    astore_t *s = j->s;

    rate__redis_cmd_free(&j->cmd);
    if (rate__redis_generic_leases(s->paths))
        return load_cmd(j);
    j->phase = PH_LEASE;
    j->noscripts = 0;
    j->no_fn = 0;
    j->module = module && rate__redis_lease_module_ok(s->paths) &&
                rate__redis_module_try(s->paths);
    int rc = rate__redis_lease_cmd(s->proto, j->module,
                                   !j->module && rate__redis_fcall_on(s->paths),
                                   &j->job->key, j->job->lease, &j->cmd);
    j->fcall = rc == RATE_OK && rate__redis_lease_fcall(&j->cmd);
    return rc;
}

/* A load's reply: run the step over it; the compare-and-set, or done. */
static int after_load(ajob_t *j, const redisReply *rep, bool *more)
{
    const rate_step_t *st = j->job->step;
    const char *old;
    size_t len;
    uint64_t version;
    int rc = rate__redis_load_parse(rep, &old, &len, &version);

    *more = false;
    if (rc != RATE_OK)
        return rc;
    rate_step_io_t io;
    memset(&io, 0, sizeof io);
    io.old_state = len > 0 ? old : NULL;
    io.old_len = len;
    io.new_cap = len + st->grow;
    free(j->state);
    if ((j->state = malloc(io.new_cap ? io.new_cap : 1)) == NULL)
        return RATE_ENOMEM;
    io.new_state = j->state;
    if ((rc = st->fn(st->arg, &io)) != RATE_OK || !io.write)
        return rc;
    rate__redis_cmd_free(&j->cmd);
    j->phase = PH_CAS;
    j->noscripts = 0;
    rc = rate__redis_cas_cmd(j->s->proto, &j->job->key, version,
                             j->state, io.new_len, io.ttl_ns, &j->cmd);
    *more = rc == RATE_OK;
    return rc;
}

/* A redirection (MOVED, ASK, TRYAGAIN) of j's command by node n, followed:
 * true when j was sent on, parked, or completed; false when the error
 * reply stands (not one, MAX_REDIRECTS reached, no room for the node). */
static bool redirect(ajob_t *j, anode_t *n, const redisReply *rep)
{
    astore_t *s = j->s;
    char host[RC_HOST_MAX];
    unsigned slot;
    int port, rc;

    rc_redirect_t kind = rc_parse_redirect(rep->str, rep->len, n->host,
                                           &slot, host, &port);
    if (kind == RC_NONE) {
        if (strncmp(rep->str, "CLUSTERDOWN", 11) == 0)
            refresh(s);
        return false;
    }
    if (j->redirs >= MAX_REDIRECTS)
        return false;
    anode_t *to = NULL;
    if (kind != RC_TRYAGAIN && (to = node_get(s, host, port)) == NULL)
        return false;
    j->redirs++;
    if (kind == RC_MOVED) {
        s->st.moved++;
        s->cluster = true; /* a "single server" that is a cluster's node */
        s->slot_node[slot] = (uint8_t)(node_index(s, to) + 1);
        refresh(s);
        rc = dispatch(j, to, false);
    } else if (kind == RC_ASK) {
        s->st.asked++;
        rc = dispatch(j, to, true);
    } else {
        s->st.tryagain++;
        uint64_t now = now_of(s);
        if (now + TRYAGAIN_NS >= j->deadline) {
            finish(j, RATE_ETIMEDOUT);
            return true;
        }
        j->node = NULL;
        j->parked = true;
        j->resend_at = now + TRYAGAIN_NS;
        j->pprev = s->ptail;
        if (s->ptail != NULL)
            s->ptail->pnext = j;
        else
            s->phead = j;
        s->ptail = j;
        arm(s, now);
        return true;
    }
    if (rc != RATE_OK)
        finish(j, rc);
    return true;
}

static void on_loaded(redisAsyncContext *ac, void *reply, void *priv)
{
    struct aload *l = priv;
    const redisReply *rep = reply;
    (void)ac;
    l->state = rep != NULL && rep->type == REDIS_REPLY_STRING ? LOAD_DONE
                                                               : 0;
}

/* After a NOSCRIPT on c for cmd's script: SCRIPT LOAD it there, ahead of
 * the EVALSHA sent again, unless a load is on its way already (the
 * NOSCRIPT is of a command sent before it).  One NOSCRIPT after the load
 * was answered says the script went again: loaded again.  So a burst of
 * commands that meet a node without the script costs one load and one
 * more EVALSHA each, not the script's text each. */
static void script_load(aconn_t *c, const rate__redis_cmd_t *cmd)
{
    struct aload *l = NULL;

    if (cmd->script == NULL || !usable(c))
        return;
    for (unsigned i = 0; i < SCRIPTS_MAX && l == NULL; i++)
        if (c->loads[i].src == cmd->script || c->loads[i].src == NULL)
            l = &c->loads[i];
    if (l == NULL || l->state == LOAD_SENT)
        return;
    if (redisAsyncCommandArgv(c->ac, on_loaded, l, 3,
                              (const char *[]){"SCRIPT", "LOAD", cmd->script},
                              (size_t[]){6, 4, cmd->script_len}) ==
        REDIS_OK) {
        l->src = cmd->script;
        l->state = LOAD_SENT;
    }
}

static void on_fn_loaded(redisAsyncContext *ac, void *reply, void *priv)
{
    aconn_t *c = ac->data;
    const redisReply *rep = reply;
    (void)priv;
    if (rep == NULL) {
        c->fn_load = 0;
        return;
    }
    bool ok = rep->type == REDIS_REPLY_STRING ||
              (rep->type == REDIS_REPLY_ERROR &&
               strstr(rep->str, "already exists") != NULL);
    c->fn_load = ok ? LOAD_DONE : 0;
    if (!ok) /* before Redis 7, or a user without the right: EVALSHA */
        rate__redis_fcall_off(c->n->s->paths);
}

/* After "no such function" on c: FUNCTION LOAD of the lean scripts'
 * library there, ahead of the FCALL sent again, unless one is on its way
 * (the reply is of an FCALL sent before it); true when the FCALL may go
 * again. */
static bool fn_load(aconn_t *c)
{
    const char *lib;
    size_t len;

    if (!usable(c))
        return false;
    if (c->fn_load == LOAD_SENT)
        return true;
    lib = c->n->s->proto->fn_lib;
    len = c->n->s->proto->fn_lib_len;
    if (redisAsyncCommandArgv(c->ac, on_fn_loaded, NULL, 4,
                              (const char *[]){"FUNCTION", "LOAD", "REPLACE",
                                               lib},
                              (size_t[]){8, 4, 7, len}) != REDIS_OK)
        return false;
    c->fn_load = LOAD_SENT;
    return true;
}

static void on_reply(redisAsyncContext *ac, void *reply, void *priv)
{
    ajob_t *j = priv;
    aconn_t *c = ac->data;
    anode_t *n = j->node;
    const redisReply *rep = reply;
    bool more = false;
    int rc;

    if (rep != NULL)
        c->last_reply = now_of(j->s);
    if (j->abandoned) { /* its caller was answered at its deadline */
        outcome(j, n, rep != NULL || !store_failure(c->drop_rc));
        job_put(j->s, j);
        return;
    }
    if (rep == NULL) { /* the connection went */
        rc = c->drop_rc;
        if (n != NULL && !c->dropped && c->ready && ac->err != 0)
            note_err(n, "connection lost", ac->errstr); /* once up */
        outcome(j, n, !store_failure(rc));
        if (store_failure(rc))
            refresh(j->s); /* a master gone: its replica, later */
        finish(j, rc);
        return;
    }
    outcome(j, n, true);
    if (rep->type == REDIS_REPLY_ERROR && redirect(j, n, rep))
        return;
    if (j->phase == PH_LEASE && j->module &&
        rep->type == REDIS_REPLY_ERROR && rep->str != NULL &&
        strstr(rep->str, "unknown command") != NULL) {
        /* A module without RATELIMIT.LEASE (or none any more): the lease
         * script, now and for this store's later leases. */
        rate__redis_lease_module_gone(j->s->paths);
        if ((rc = lease_cmd(j, false)) == RATE_OK &&
            (rc = route(j)) == RATE_OK)
            return;
        finish(j, rc);
        return;
    }
    if (j->phase == PH_DECIDE && j->module) {
        rate__redis_module_seen(j->s->paths,
                                rep->type != REDIS_REPLY_ERROR);
        if (rep->type == REDIS_REPLY_ERROR) {
            /* "unknown command" (unloaded, a failover to a server without
             * it), NOPERM: nothing was written; the scripts decide now */
            j->s->st.module_fallbacks++;
            if ((rc = decide_cmd(j, false)) == RATE_OK &&
                (rc = route(j)) == RATE_OK)
                return;
            finish(j, rc);
            return;
        }
    }
    if ((j->phase == PH_DECIDE || j->phase == PH_LEASE) && j->fcall &&
        rate__redis_no_function(rep)) {
        /* A node without the library (a new node, a restart, FUNCTION
         * FLUSH): loaded on this connection, then called again; once
         * more, or a server that will not load it: the EVALSHA. */
        if (j->no_fn++ > 0 || !fn_load(c)) {
            if (j->phase == PH_LEASE)
                rate__redis_lease_evalsha(&j->cmd);
            else
                rate__redis_cmd_evalsha(j->s->proto, &j->cmd);
            j->fcall = false;
        }
        if ((rc = send_on(j, n, j->asking)) != RATE_OK)
            finish(j, rc);
        return;
    }
    if (rate__redis_noscript(rep) && j->noscripts < 2) {
        /* A node that never had the script, restarted, or SCRIPT FLUSH */
        j->s->st.noscript++;
        if (j->noscripts++ == 0)
            script_load(c, &j->cmd);
        else
            rate__redis_cmd_eval(&j->cmd); /* the second: the script */
        if ((rc = send_on(j, n, j->asking)) != RATE_OK)
            finish(j, rc);
        return;
    }
    rc = rate__redis_reply_ok(RATE_OK, rep);
    /* An error reply (NOPERM from an ACL, OOM at maxmemory) is the
     * operator's clue: kept for rate_store_redis_last_error until a reply
     * succeeds. */
    if (rc == RATE_ESTORE && rep->str != NULL) {
        note_err(n, "replied", rep->str);
        j->s->err_replied = true;
    } else if (rc == RATE_OK && j->s->err_replied) {
        j->s->last_err[0] = '\0';
        j->s->err_replied = false;
    }
    if (rc == RATE_OK) {
        switch (j->phase) {
        case PH_DECIDE: {
            rate_redis_async_stats_t *st = &j->s->st;
            bool adjust = j->job->req->op != RATE_DECIDE_ACQUIRE;
            rc = rate__redis_decide_parse(rep, j->job->out);
            if (rc == RATE_OK) {
                (*(adjust         ? &st->lean_adjustments /* a lean one's */
                   : j->module    ? &st->module_decisions
                   : j->cmd.lean >= 0 ? &st->lean_decisions
                                      : &st->general_decisions))++;
                if (!adjust && !j->module && j->cmd.lean >= 0 && !j->fcall)
                    st->lean_evalsha++;
            } else if (rc == RATE_ENOTSUP) /* the step makes it */
                (*(adjust ? &st->declined_adjustments : &st->declined))++;
            else if (rc == RATE_ECORRUPT && rep->type == REDIS_REPLY_ARRAY &&
                     rep->elements > 0 &&
                     rep->element[0]->type == REDIS_REPLY_INTEGER &&
                     rep->element[0]->integer == 2) {
                /* the script found a key of another type (tag 2): named
                 * as the blocking store names it */
                char e[200];
                snprintf(e, sizeof e, "WRONGTYPE: '%.*s' is not a hash",
                         (int)(j->cmd.kl > 120 ? 120 : j->cmd.kl), j->cmd.k);
                note_err(n, "replied", e);
                j->s->err_replied = true;
            }
            break;
        }
        case PH_LOAD:
            rc = after_load(j, rep, &more);
            break;
        case PH_LEASE:
            rc = rate__redis_lease_parse(rep, j->job->lease);
            j->job->lease_made = rc == RATE_OK;
            if (j->module) /* answered: the module is there */
                rate__redis_module_seen(j->s->paths, true);
            if (rc == RATE_OK || rc == RATE_ELEASE || rc == RATE_EEXPIRED)
                (*(j->module ? &j->s->st.module_leases
                             : &j->s->st.script_leases))++;
            break;
        default:
            rc = rate__redis_cas_parse(rep);
            if (rc != RATE_ECONFLICT || j->retries++ >= CAS_RETRIES)
                break;
            /* Lost it: again from the load, in the key's turn (taken
             * now: queued behind the others that lost it), while half the
             * timeout is left for the round trips. */
            if (!time_left(j))
                break;
            if ((rc = load_cmd(j)) != RATE_OK)
                break;
            if (j->turn != NULL) {
                more = true;
                break;
            }
            if ((rc = turn_take(j)) == RATE_OK)
                return;
            break;
        }
    }
    if (more && (rc = route(j)) == RATE_OK)
        return;
    finish(j, rc);
}

/* The timer: broken nodes dropped, parked jobs sent again, and the
 * connection of the oldest job dropped when its deadline has passed. */
static void on_timer(void *arg)
{
    astore_t *s = arg;
    uint64_t now = now_of(s);

    s->timer_armed = false;
    if (s->broken) { /* the loop refused to watch a socket */
        s->broken = false;
        for (unsigned i = 0; i < s->nnodes; i++)
            if (s->nodes[i]->broken)
                drop(s->nodes[i], RATE_ESTORE);
    }
    while (s->phead != NULL && s->phead->resend_at <= now) {
        ajob_t *j = s->phead;
        int rc;
        unpark(j);
        if ((rc = dispatch(j, node_of_slot(s, rc_key_slot(j->cmd.k,
                                                          j->cmd.kl)),
                           false)) != RATE_OK)
            finish(j, rc);
    }
    anode_t *drained = NULL;
    while (s->head != NULL && s->head->deadline <= now) {
        ajob_t *j = s->head;
        if (j->parked || (j->turn != NULL && j->turn->holder != j)) {
            finish(j, RATE_ETIMEDOUT); /* parked, or waiting its turn */
            continue;
        }
        if (j->node == NULL || j->node->conn == NULL)
            break; /* cannot be: a job not parked is on a connection */
        /* A loop that ran late (a loaded machine) may run this timer
         * before reading the socket (libuv runs timers first): the reply
         * may be there already.  Read what has come, once per node, and
         * look at the oldest job again. */
        if (j->node != drained) {
            aconn_t *c = j->node->conn;
            drained = j->node;
            c->refs++;
            if (c->ac != NULL)
                redisAsyncHandleRead(c->ac);
            conn_unref(c);
            continue;
        }
        /* No reply in time.  A connection that answered anything since
         * the job began, or a timer that ran late by half the timeout
         * (this process was held off its core, not Redis), is alive: the
         * job alone times out and the commands behind it go on.  One
         * silent for the whole timeout hangs: it goes, and with it every
         * command on it (the synchronous store's reader fails all it
         * waits for too). */
        uint64_t began = j->deadline - s->conf.command_ns;
        if (j->node->conn->last_reply > began ||
            (now > s->timer_at &&
             now - s->timer_at >= s->conf.command_ns / 2)) {
            abandon(j);
            continue;
        }
        note_err(j->node, "no reply within the command timeout", NULL);
        drop(j->node, RATE_ETIMEDOUT);
        if (s->head == j)
            break;
    }
    arm(s, now_of(s));
}

/* ----------------------------------------------------------- contract */

static int a_start(void *self, rate_job_t *job)
{
    astore_t *s = self;
    uint64_t now = now_of(s);
    int rc;

    if (s->closing)
        return RATE_ECANCELED;
    ajob_t *j = job_get(s);
    if (j == NULL)
        return RATE_ENOMEM;
    j->s = s;
    j->job = job;
    j->deadline = now + s->conf.command_ns;
    if (job->lease != NULL) {
        rc = lease_cmd(j, true);
    } else if (job->req != NULL) {
        rc = decide_cmd(j, true);
    } else {
        rc = load_cmd(j);
    }
    if (rc == RATE_OK)
        rc = route(j); /* refused at once: nothing sent */
    if (rc != RATE_OK) {
        rate__redis_cmd_free(&j->cmd);
        job_put(s, j);
        return rc;
    }
    j->taken = true;
    j->prev = s->tail;
    if (s->tail != NULL)
        s->tail->next = j;
    else
        s->head = j;
    s->tail = j;
    s->st.started++;
    s->st.in_flight++;
    arm(s, now);
    return RATE_OK;
}

static int a_load(void *self, const rate_key_t *key, void *buf, size_t cap,
                  size_t *len, uint64_t *version)
{
    astore_t *s = self;
    return s->sm->load(s->sync_self, key, buf, cap, len, version);
}

static int a_cas(void *self, const rate_key_t *key, uint64_t version,
                 const void *state, size_t len, uint64_t ttl_ns)
{
    astore_t *s = self;
    return s->sm->cas(s->sync_self, key, version, state, len, ttl_ns);
}

static int a_decide(void *self, const rate_key_t *key,
                    const rate_decide_req_t *req, rate_decision_t *out)
{
    astore_t *s = self;
    return s->sm->decide(s->sync_self, key, req, out);
}

static int a_now(void *self, uint64_t *now_ns)
{
    astore_t *s = self;
    return s->sm->now(s->sync_self, now_ns);
}

static int a_remove(void *self, const rate_key_t *key)
{
    astore_t *s = self;
    return s->sm->remove(s->sync_self, key);
}

static void a_destroy(void *self)
{
    astore_t *s = self;

    /* Every job in flight completes now, with RATE_ECANCELED: those on a
     * connection when it goes, the parked ones here. */
    s->closing = true;
    for (unsigned i = 0; i < s->nnodes; i++)
        drop(s->nodes[i], RATE_ECANCELED);
    while (s->phead != NULL)
        finish(s->phead, RATE_ECANCELED);
    /* The jobs waiting for a key's turn went with its holder (each job
     * held is on a connection or parked): no turn is left. */
    free(s->turns);
    while (s->spare != NULL) {
        ajob_t *j = s->spare;
        s->spare = j->next;
        free(j);
    }
    if (s->timer != NULL)
        s->loop.timer_free(s->loop.ud, s->timer);
    rate_store_free(s->sync);
    for (unsigned i = 0; i < s->nnodes; i++)
        free(s->nodes[i]);
    free(s);
}

static const rate_store_methods_t async_methods = {
    .version = RATE_STORE_VERSION,
    .name = "redis-async",
    .load = a_load,
    .cas = a_cas,
    .decide = a_decide,
    .now = a_now,
    .remove = a_remove,
    .start = a_start,
    .destroy = a_destroy,
    .decide_changes = true, /* the lean scripts' refunds and penalties */
    .lease_rate = true, /* start(): an acquire with its rate limits */
};

/* The first topology (rate__rasync_new). */
static int init_nodes(astore_t *s, const rc_addr_t *addr, unsigned n,
                      const uint8_t *map)
{
    if (map != NULL) {
        s->cluster = true;
        for (unsigned i = 0; i < n; i++)
            if (node_get(s, addr[i].host, addr[i].port) == NULL)
                return RATE_ENOMEM;
        /* both lists in the same order: the map's indices hold */
        memcpy(s->slot_node, map, RC_SLOTS);
        s->refreshed_at = now_of(s);
    } else if (node_get(s, s->conf.host, s->conf.port) == NULL) {
        return RATE_ENOMEM;
    } else {
        memset(s->slot_node, 1, RC_SLOTS);
    }
    return RATE_OK;
}

int rate__rasync_loop_ok(const rate_loop_t *loop, char *err, size_t errlen)
{
    if (loop == NULL || loop->io_new == NULL || loop->io_set == NULL ||
        loop->io_free == NULL || loop->timer_new == NULL ||
        loop->timer_arm == NULL || loop->timer_cancel == NULL ||
        loop->timer_free == NULL)
        return rate__fail(err, errlen, RATE_EINVAL,
                          "the loop is NULL or misses a function");
    for (size_t i = 0; i < sizeof loop->reserved / sizeof loop->reserved[0];
         i++)
        if (loop->reserved[i] != NULL)
            return rate__fail(err, errlen, RATE_EINVAL,
                              "the loop's reserved functions are not NULL "
                              "(a field of a later version?)");
    return RATE_OK;
}

int rate__rasync_new(const rate_loop_t *loop, rate_store_t *sync,
                     const rate_store_methods_t *sm, void *sync_self,
                     rate__redis_paths_t *paths,
                     const rate__redis_proto_t *proto,
                     const rate__redis_conf_t *conf, const rc_addr_t *nodes,
                     unsigned nnodes, const uint8_t *map, rate_store_t **out)
{
    int rc;
    astore_t *s = calloc(1, sizeof *s);
    if (s == NULL) {
        rate_store_free(sync);
        return RATE_ENOMEM;
    }
    s->loop = *loop;
    s->sync = sync;
    s->sm = sm;
    s->sync_self = sync_self;
    s->paths = paths;
    s->proto = proto;
    s->conf = *conf;
    if (init_nodes(s, nodes, nnodes, map) != RATE_OK) {
        a_destroy(s);
        return RATE_ENOMEM;
    }
    if ((s->timer = loop->timer_new(loop->ud, on_timer, s)) == NULL) {
        a_destroy(s);
        return RATE_ENOMEM;
    }
    if ((rc = rate_store_new(&async_methods, s, out)) != RATE_OK)
        a_destroy(s);
    return rc;
}

int rate_store_redis_async_stats(rate_store_t *store,
                                 rate_redis_async_stats_t *out)
{
    astore_t *s = store != NULL ? rate_store_backend(store, &async_methods)
                                : NULL;
    if (s == NULL || out == NULL)
        return RATE_EINVAL;
    *out = s->st;
    return RATE_OK;
}

int rate__rasync_last_error(rate_store_t *store, char *buf, size_t cap)
{
    astore_t *s = store != NULL ? rate_store_backend(store, &async_methods)
                                : NULL;
    if (s == NULL || buf == NULL || cap == 0)
        return RATE_EINVAL;
    snprintf(buf, cap, "%s", s->last_err);
    return RATE_OK;
}

void *rate__rasync_sync(rate_store_t *store)
{
    astore_t *s = store != NULL ? rate_store_backend(store, &async_methods)
                                : NULL;
    return s != NULL ? s->sync_self : NULL;
}
