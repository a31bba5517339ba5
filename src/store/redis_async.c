/* SPDX-License-Identifier: MIT */
/*
 * The asynchronous Redis store: the Redis store's part of a decision over
 * hiredis's asynchronous context, driven by the caller's event loop
 * through rate_loop_t (include/ratelimit_loop.h, docs/async.md).
 *
 * It speaks the synchronous store's protocol (src/store/redis.c builds
 * every command and parses every reply: redis_internal.h), over one
 * connection to one server.  A decision (a job) is one command at a time:
 * the step script (EVALSHA; after NOSCRIPT, EVAL once), or, for a request
 * the script declines, HMGET, the C step, and the compare-and-set script,
 * again from HMGET on a conflict.  Jobs in flight sit on a list in the
 * order they started, which is the order of their deadlines (start plus
 * the command timeout): one loop timer is armed for the oldest; when it
 * passes, the connection is dropped, and hiredis hands every command on
 * it back with no reply, which completes its job with RATE_ETIMEDOUT.
 * Every job has exactly one command in hiredis's queue until it
 * completes, so the job is freed only in that command's callback: a job
 * can never complete twice nor be forgotten.
 *
 * Everything else of the store contract (load, cas, decide, now, remove)
 * goes to a synchronous Redis store over the same URL, which this store
 * owns: the limiter's policy records, resets, and the synchronous calls.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <hiredis/async.h>
#include <hiredis/hiredis.h>

#include "ratelimit_loop.h"
#include "redis_internal.h"

#define BACKOFF_MIN_NS (10 * UINT64_C(1000000))
#define BACKOFF_MAX_NS RATE_NS_PER_S
#define CAS_RETRIES 16

typedef struct astore astore_t;

/* One connection: hiredis's context and the loop's watch on its socket.
 * Alive while hiredis may still call its hooks (until cleanup) and while
 * one of its loop callbacks runs (refs). */
typedef struct aconn {
    astore_t *s;
    redisAsyncContext *ac; /* NULL once hiredis has let go of it */
    void *io;              /* the loop's watch; NULL after cleanup */
    unsigned events;       /* watched */
    unsigned refs;         /* 1 for hiredis, 1 per running loop callback */
    bool ready;            /* connected (the connect callback said so) */
} aconn_t;

enum { PH_DECIDE, PH_LOAD, PH_CAS };

/* One decision in flight. */
typedef struct ajob {
    astore_t *s;
    rate_job_t *job;
    struct ajob *prev, *next; /* the store's list, oldest first */
    uint64_t deadline;
    rate__redis_cmd_t cmd;
    int phase;
    bool evalled; /* NOSCRIPT answered once */
    unsigned retries;
    void *state; /* the step's new state, for the compare-and-set */
} ajob_t;

struct astore {
    rate_loop_t loop;
    rate_store_t *sync; /* the synchronous store over the same URL */
    void *sync_self;    /* its back end (redis_store_t) */
    const rate_store_methods_t *sm;
    rate__redis_conf_t conf;
    aconn_t *conn; /* the current connection, or NULL */
    void *timer;
    bool timer_armed;
    ajob_t *head, *tail;
    int drop_rc;   /* what a command handed back without reply fails with */
    bool closing;  /* being freed: no new job */
    bool broken;   /* the loop refused a watch: drop at the timer */
    uint64_t retry_at, backoff;
    unsigned fails; /* jobs failed in a row (the breaker) */
    uint64_t open_until;
    bool probing;
    rate_redis_async_stats_t st;
};

static const rate_store_methods_t async_methods;

static uint64_t now_of(const astore_t *s)
{
    if (s->loop.now != NULL)
        return s->loop.now(s->loop.ud);
    return rate_clock_monotonic_ns();
}

/* ----------------------------------------------------------- the loop */

static void backoff(astore_t *s)
{
    s->backoff = s->backoff == 0 ? BACKOFF_MIN_NS
                 : s->backoff * 2 > BACKOFF_MAX_NS ? BACKOFF_MAX_NS
                                                   : s->backoff * 2;
    s->retry_at = now_of(s) + s->backoff;
}

static void conn_unref(aconn_t *c)
{
    if (--c->refs == 0)
        free(c);
}

static void watch(aconn_t *c, unsigned on, unsigned off)
{
    unsigned ev = (c->events | on) & ~off;
    if (c->io == NULL || ev == c->events)
        return;
    c->events = ev;
    if (c->s->loop.io_set(c->s->loop.ud, c->io, ev) != 0 && c->s->conn == c) {
        /* The loop refused: the connection is dropped from the timer, not
         * from inside hiredis (this runs within its calls). */
        c->s->broken = true;
        if (c->s->loop.timer_arm(c->s->loop.ud, c->s->timer, 0) == 0)
            c->s->timer_armed = true;
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
    astore_t *s = c->s;

    if (c->io != NULL)
        s->loop.io_free(s->loop.ud, c->io);
    c->io = NULL;
    c->ac = NULL;
    if (s->conn == c) { /* it failed (drop() unsets conn first) */
        s->conn = NULL;
        backoff(s);
    }
    conn_unref(c); /* hiredis calls nothing with c after this */
}

static void on_io(void *arg, unsigned events)
{
    aconn_t *c = arg;

    c->refs++;
    if ((events & RATE_LOOP_READ) && c->ac != NULL)
        redisAsyncHandleRead(c->ac);
    if ((events & RATE_LOOP_WRITE) && c->ac != NULL)
        redisAsyncHandleWrite(c->ac);
    conn_unref(c);
}


/* Drop the connection: every command on it comes back without a reply
 * (its job failing with rc), before this returns unless called from
 * inside one of hiredis's callbacks (then right after it). */
static void drop(astore_t *s, int rc)
{
    aconn_t *c = s->conn;

    if (c == NULL)
        return;
    s->conn = NULL;
    backoff(s);
    if (c->ac != NULL) {
        int was = s->drop_rc;
        s->drop_rc = rc;
        redisAsyncFree(c->ac);
        s->drop_rc = was;
    }
}

static void arm(astore_t *s, uint64_t now)
{
    if (s->head == NULL || s->closing)
        return;
    uint64_t after = s->head->deadline > now ? s->head->deadline - now : 0;
    if (s->loop.timer_arm(s->loop.ud, s->timer, after) == 0)
        s->timer_armed = true;
}

static void on_timer(void *arg)
{
    astore_t *s = arg;
    uint64_t now = now_of(s);

    s->timer_armed = false;
    if (s->broken) { /* the loop refused to watch the socket */
        s->broken = false;
        drop(s, RATE_ESTORE);
    }
    if (s->head != NULL && s->head->deadline <= now) {
        /* Redis did not answer the oldest in time: the connection goes,
         * and with it every command on it (the synchronous store's reader
         * fails all it waits for too). */
        drop(s, RATE_ETIMEDOUT);
    }
    if (!s->timer_armed)
        arm(s, now_of(s));
}

/* ----------------------------------------------------------- the jobs */

static bool store_failure(int rc)
{
    return rc == RATE_ESTORE || rc == RATE_ETIMEDOUT;
}

static void finish(ajob_t *j, int rc)
{
    astore_t *s = j->s;
    rate_job_t *job = j->job;

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
    free(j);
    if (s->conf.breaker && !s->closing) {
        if (store_failure(rc)) {
            if (++s->fails >= s->conf.breaker_failures || s->probing)
                s->open_until = now_of(s) + s->conf.breaker_cooldown_ns;
        } else {
            s->fails = 0;
            s->open_until = 0;
        }
        s->probing = false;
    }
    s->st.completed++;
    s->st.in_flight--;
    if (rc == RATE_ETIMEDOUT)
        s->st.timed_out++;
    if (s->head == NULL && s->timer_armed) {
        s->loop.timer_cancel(s->loop.ud, s->timer);
        s->timer_armed = false;
    }
    job->done(job, rc);
}

static void on_reply(redisAsyncContext *ac, void *reply, void *priv);

/* Queue j's command on the current connection: RATE_OK or RATE_ESTORE. */
static int send_cmd(ajob_t *j)
{
    astore_t *s = j->s;

    if (s->conn == NULL || s->conn->ac == NULL)
        return RATE_ESTORE;
    if (redisAsyncCommandArgv(s->conn->ac, on_reply, j, j->cmd.argc,
                              j->cmd.av, j->cmd.al) != REDIS_OK)
        return RATE_ESTORE;
    return RATE_OK;
}

/* The next command of j, built into j->cmd: the load. */
static int load_cmd(ajob_t *j)
{
    rate__redis_cmd_free(&j->cmd);
    j->phase = PH_LOAD;
    j->evalled = false;
    return rate__redis_load_cmd(j->s->sync_self, &j->job->key, &j->cmd);
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
    j->evalled = false;
    rc = rate__redis_cas_cmd(j->s->sync_self, &j->job->key, version,
                             j->state, io.new_len, io.ttl_ns, &j->cmd);
    *more = rc == RATE_OK;
    return rc;
}

static void on_reply(redisAsyncContext *ac, void *reply, void *priv)
{
    ajob_t *j = priv;
    astore_t *s = j->s;
    const redisReply *rep = reply;
    bool more = false;
    int rc;

    (void)ac;
    if (rep == NULL) { /* the connection went */
        finish(j, s->drop_rc);
        return;
    }
    if (rate__redis_noscript(rep) && !j->evalled) {
        j->evalled = true; /* Redis restarted, or SCRIPT FLUSH */
        s->st.noscript++;
        rate__redis_cmd_eval(&j->cmd);
        if ((rc = send_cmd(j)) != RATE_OK)
            finish(j, rc);
        return;
    }
    rc = rate__redis_reply_ok(RATE_OK, rep);
    if (rc == RATE_OK) {
        switch (j->phase) {
        case PH_DECIDE:
            rc = rate__redis_decide_parse(rep, j->job->out);
            break;
        case PH_LOAD:
            rc = after_load(j, rep, &more);
            break;
        default:
            rc = rate__redis_cas_parse(rep);
            if (rc == RATE_ECONFLICT && j->retries++ < CAS_RETRIES)
                more = (rc = load_cmd(j)) == RATE_OK;
            break;
        }
    }
    if (more && (rc = send_cmd(j)) == RATE_OK)
        return;
    finish(j, rc);
}

/* --------------------------------------------------------- connection */

static void on_setup(redisAsyncContext *ac, void *reply, void *priv)
{
    const redisReply *rep = reply;
    (void)priv;
    if (rep != NULL && rep->type == REDIS_REPLY_ERROR)
        redisAsyncDisconnect(ac); /* AUTH or SELECT refused */
}

static void on_connect(const redisAsyncContext *ac, int status)
{
    aconn_t *c = ac->data;

    if (status == REDIS_OK) {
        c->ready = true;
        c->s->backoff = 0;
    } /* else hiredis frees the context now: h_cleanup backs off */
}

/* A new connection, made without blocking: RATE_OK with s->conn, or
 * RATE_ESTORE. */
static int connect_now(astore_t *s)
{
    aconn_t *c = calloc(1, sizeof *c);
    if (c == NULL)
        return RATE_ENOMEM;
    s->st.connects++;
    redisAsyncContext *ac =
        s->conf.port == 0 ? redisAsyncConnectUnix(s->conf.host)
                          : redisAsyncConnect(s->conf.host, s->conf.port);
    if (ac == NULL || ac->err) {
        if (ac != NULL)
            redisAsyncFree(ac);
        free(c);
        backoff(s);
        return RATE_ESTORE;
    }
    c->s = s;
    c->ac = ac;
    c->refs = 1;
    c->io = s->loop.io_new(s->loop.ud, ac->c.fd, on_io, c);
    if (c->io == NULL) {
        c->ac = NULL;
        redisAsyncFree(ac);
        free(c);
        backoff(s);
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
    s->conn = c;
    int ok = REDIS_OK;
    if (s->conf.password[0] != '\0') {
        if (s->conf.user[0] != '\0')
            ok = redisAsyncCommand(ac, on_setup, NULL, "AUTH %s %s",
                                   s->conf.user, s->conf.password);
        else
            ok = redisAsyncCommand(ac, on_setup, NULL, "AUTH %s",
                                   s->conf.password);
    }
    if (ok == REDIS_OK && s->conf.db != 0)
        ok = redisAsyncCommand(ac, on_setup, NULL, "SELECT %d", s->conf.db);
    if (ok != REDIS_OK) {
        drop(s, RATE_ESTORE);
        return RATE_ESTORE;
    }
    return RATE_OK;
}

/* ----------------------------------------------------------- contract */

static int a_start(void *self, rate_job_t *job)
{
    astore_t *s = self;
    uint64_t now = now_of(s);
    int rc;

    if (s->closing)
        return RATE_ECANCELED;
    if (s->conf.breaker && s->open_until != 0) {
        if (now < s->open_until || s->probing) {
            s->st.refused++;
            return RATE_ESTORE; /* open: fail at once */
        }
        s->probing = true; /* cooled down: this one is the probe */
    }
    if (s->conn == NULL) {
        if (now < s->retry_at) {
            s->st.refused++;
            s->probing = false;
            return RATE_ESTORE; /* backing off a failed connection */
        }
        if ((rc = connect_now(s)) != RATE_OK) {
            s->probing = false;
            return rc;
        }
    }
    ajob_t *j = calloc(1, sizeof *j);
    if (j == NULL) {
        s->probing = false;
        return RATE_ENOMEM;
    }
    j->s = s;
    j->job = job;
    j->deadline = now + s->conf.command_ns;
    if (job->req != NULL) {
        j->phase = PH_DECIDE;
        rc = rate__redis_decide_cmd(s->sync_self, &job->key, job->req,
                                    &j->cmd);
        if (rc == RATE_ENOTSUP) /* outside the script's range: the step */
            rc = load_cmd(j);
    } else {
        rc = load_cmd(j);
    }
    if (rc == RATE_OK)
        rc = send_cmd(j);
    if (rc != RATE_OK) {
        rate__redis_cmd_free(&j->cmd);
        free(j);
        s->probing = false;
        return rc;
    }
    j->prev = s->tail;
    if (s->tail != NULL)
        s->tail->next = j;
    else
        s->head = j;
    s->tail = j;
    s->st.started++;
    s->st.in_flight++;
    if (!s->timer_armed)
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

    /* Every job in flight completes now, with RATE_ECANCELED (none is
     * left: each has its command on the connection). */
    s->closing = true;
    drop(s, RATE_ECANCELED);
    if (s->timer != NULL)
        s->loop.timer_free(s->loop.ud, s->timer);
    rate_store_free(s->sync);
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
};

int rate_store_redis_async_new(const char *url,
                               const rate_redis_options_t *options,
                               const rate_loop_t *loop, rate_store_t **out,
                               char *err, size_t errlen)
{
    int rc;

    if (out == NULL)
        return RATE_EINVAL;
    *out = NULL;
    if (loop == NULL || loop->io_new == NULL || loop->io_set == NULL ||
        loop->io_free == NULL || loop->timer_new == NULL ||
        loop->timer_arm == NULL || loop->timer_cancel == NULL ||
        loop->timer_free == NULL)
        return rate__fail(err, errlen, RATE_EINVAL,
                          "the loop is NULL or misses a function");
    astore_t *s = calloc(1, sizeof *s);
    if (s == NULL)
        return RATE_ENOMEM;
    s->loop = *loop;
    s->drop_rc = RATE_ESTORE;
    if ((rc = rate_store_redis_new(url, options, &s->sync, err, errlen)) !=
        RATE_OK) {
        free(s);
        return rc;
    }
    s->sm = rate__redis_methods();
    s->sync_self = rate_store_backend(s->sync, s->sm);
    rate__redis_conf(s->sync_self, &s->conf);
    if (s->conf.cluster) {
        rate_store_free(s->sync);
        free(s);
        return rate__fail(err, errlen, RATE_ENOTSUP,
                          "a Redis Cluster: the asynchronous store speaks "
                          "to one server");
    }
    if ((s->timer = loop->timer_new(loop->ud, on_timer, s)) == NULL) {
        rate_store_free(s->sync);
        free(s);
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
