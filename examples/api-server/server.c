/* SPDX-License-Identifier: MIT */
/*
 * api-server: a small HTTP API on libmicrohttpd, limited by libratelimit.
 *
 *   api-server --listen 127.0.0.1:PORT --config FILE [--store URL]
 *              [--max-conns-per-ip N] [--max-conns N]
 *              [--header-timeout SECONDS] [--no-limit]
 *
 * Every path but /metrics is an API call: its key is the X-API-Key header
 * (or "ip:ADDRESS" without one), its attributes the API key, the route
 * (the path), the method and the client address, and the rules file
 * decides it (rate_rules_acquire).  Allowed: 200 with the RateLimit fields;
 * denied: 429 with them, Retry-After and an RFC 9457 problem body; the
 * store failing under fail-closed: 503 with a problem body.  /metrics is
 * the Prometheus exposition the limiter's listener feeds.  SIGHUP, or a
 * change of the file (checked every 200 ms), reloads the rules on a
 * thread of its own, so that the main loop goes on taking signals and
 * closing slow connections however long the file takes to read; a bad
 * file is reported and the old rules stay.  SIGINT or SIGTERM stops.
 * The log's first line gives the port and the PID.
 * One slow client cannot take the server: each address has at most
 * --max-conns-per-ip connections open (default 32), all at most
 * --max-conns (default 1000), and a request's line and headers must come
 * within --header-timeout seconds (default 10) of the connection's start
 * or of the previous request's end, however slowly they trickle in (the
 * idle timeout, 30 s, is reset by every byte).
 * --no-limit answers every call as allowed without asking the limiter
 * (the bench's baseline).  See docs/api-server.md.
 *
 * In-flight policies in the rules hold leases (rate_rules_acquire) for
 * the request's whole handling, released when libmicrohttpd ends it
 * (NOTIFY_COMPLETED: answered, failed, timed out or its client gone).
 * /slow?ms=N stands for slow upstream work: the connection is suspended
 * for N ms (default 1000) by a sleeper thread that resumes it then, or at
 * once when its client hangs up.
 */
#include <errno.h>
#include <microhttpd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdbool.h>
#include <stdatomic.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <ratelimit.h>
#include <ratelimit_redis.h>
#include <ratelimit_http.h>

#include "metrics.h"

/* A connection, from its start to its close, for the header deadline:
 * `since` is when its current request began (the connection's start, or
 * the previous request's end), `in` whether that request's headers are
 * in (the handler was called). */
typedef struct conn {
    struct conn *prev, *next;
    int fd;
    uint64_t since;
    bool in, cut;
} conn_t;

/* A request, from its headers to its end (libmicrohttpd's con_cls). */
typedef struct req {
    rate_rules_held_t *held; /* its leases, released when it ends */
    rate_headers_t h;        /* the fields of its decision */
    int stage;               /* 0: deciding; 1: suspended on /slow */
    bool gone;               /* its client hung up while it slept */
    struct MHD_Connection *c;
    int fd;
    uint64_t due;            /* when the slow work is over */
    struct req *next;        /* the sleepers */
} req_t;

typedef struct server {
    pthread_mutex_t lock; /* conns */
    conn_t conns;         /* a ring, conns itself its head */
    uint64_t header_timeout_ns;
    uint64_t cut;         /* connections closed by the header deadline */
    rate_rules_t *rules;
    rate_limiter_t *lim;
    rate_store_t *store;
    metrics_t *metrics;
    const char *config;
    int no_limit;
    pthread_mutex_t slow_lock; /* sleepers */
    req_t *sleepers;           /* suspended /slow requests */
    pthread_t sleeper;
    atomic_bool stopping;
} server_t;

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static enum MHD_Result reply(struct MHD_Connection *c, unsigned status,
                             const char *type, const char *body,
                             const rate_headers_t *h)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(
        strlen(body), (void *)body, MHD_RESPMEM_MUST_COPY);
    if (r == NULL)
        return MHD_NO;
    MHD_add_response_header(r, "Content-Type", type);
    if (h != NULL) {
        if (h->policy[0] != '\0')
            MHD_add_response_header(r, "RateLimit-Policy", h->policy);
        if (h->ratelimit[0] != '\0')
            MHD_add_response_header(r, "RateLimit", h->ratelimit);
        if (h->retry_after[0] != '\0')
            MHD_add_response_header(r, "Retry-After", h->retry_after);
    }
    enum MHD_Result rc = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return rc;
}

/* JSON string contents: quotes, backslashes and control bytes escaped. */
static void json_escape(const char *s, char *out, size_t len)
{
    size_t o = 0;
    for (; *s != '\0' && o + 7 < len; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\') {
            out[o++] = '\\';
            out[o++] = (char)ch;
        } else if (ch < 0x20) {
            o += (size_t)snprintf(out + o, len - o, "\\u%04x", ch);
        } else {
            out[o++] = (char)ch;
        }
    }
    out[o] = '\0';
}

/* The RFC 9457 problem body of a denial (429) or a store failure (503). */
static void problem(const rate_outcome_t *o, const rate_headers_t *h,
                    const char *path, char *body, size_t len)
{
    char inst[512];
    json_escape(path, inst, sizeof inst);
    if (h->status == 503) {
        snprintf(body, len,
                 "{\"type\":\"about:blank\",\"title\":\"Service "
                 "Unavailable\",\"status\":503,\"detail\":\"The rate "
                 "limiter's store is not answering.\",\"instance\":\"%s\"}\n",
                 inst);
        return;
    }
    const char *name = o->denied_by >= 0
                           ? o->applied[o->denied_by].policy_name
                           : "";
    uint64_t at_once = o->denied_by >= 0
                           ? o->applied[o->denied_by].concurrency
                           : 0;
    if (at_once > 0 && h->retry_after[0] != '\0')
        snprintf(body, len,
                 "{\"type\":\"about:blank\",\"title\":\"Too Many "
                 "Requests\",\"status\":429,\"detail\":\"Policy '%s' "
                 "has its %llu requests in flight; retry after %s s.\","
                 "\"instance\":\"%s\",\"policy\":\"%s\",\"retry_after\":%s}\n",
                 name, (unsigned long long)at_once, h->retry_after, inst,
                 name, h->retry_after);
    else if (h->retry_after[0] != '\0')
        snprintf(body, len,
                 "{\"type\":\"about:blank\",\"title\":\"Too Many "
                 "Requests\",\"status\":429,\"detail\":\"Policy '%s' "
                 "allows no more requests now; retry after %s s.\","
                 "\"instance\":\"%s\",\"policy\":\"%s\",\"retry_after\":%s}\n",
                 name, h->retry_after, inst, name, h->retry_after);
    else
        snprintf(body, len,
                 "{\"type\":\"about:blank\",\"title\":\"Too Many "
                 "Requests\",\"status\":429,\"detail\":\"Policy '%s' can "
                 "never allow this request.\",\"instance\":\"%s\","
                 "\"policy\":\"%s\"}\n",
                 name, inst, name);
}

static enum MHD_Result serve_metrics(server_t *s, struct MHD_Connection *c)
{
    static _Thread_local char buf[65536];
    size_t n = metrics_format(s->metrics, s->lim,
                              rate_rules_generation(s->rules), buf,
                              sizeof buf);
    if (n == 0)
        return reply(c, 500, "text/plain", "metrics too large\n", NULL);
    return reply(c, 200, "text/plain; version=0.0.4", buf, NULL);
}

/* Writes v (0..255) in decimal; returns the bytes written. */
static size_t put_octet(char *out, unsigned v)
{
    size_t n = 0;
    if (v >= 100)
        out[n++] = (char)('0' + v / 100);
    if (v >= 10)
        out[n++] = (char)('0' + v / 10 % 10);
    out[n++] = (char)('0' + v % 10);
    return n;
}

/* The peer's address as text (an IPv4 address by hand: inet_ntop goes
 * through snprintf, a good part of a request's cost here). */
static void client_address(struct MHD_Connection *c, char *out, size_t len)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    snprintf(out, len, "unknown");
    if (ci == NULL || ci->client_addr == NULL)
        return;
    const struct sockaddr *sa = ci->client_addr;
    if (sa->sa_family == AF_INET && len >= INET_ADDRSTRLEN) {
        const uint8_t *b =
            (const uint8_t *)&((const struct sockaddr_in *)sa)->sin_addr;
        size_t n = 0;
        for (int i = 0; i < 4; i++) {
            if (i > 0)
                out[n++] = '.';
            n += put_octet(out + n, b[i]);
        }
        out[n] = '\0';
    } else if (sa->sa_family == AF_INET6) {
        inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)sa)->sin6_addr,
                  out, (socklen_t)len);
    }
}

/* ------------------------------------------------- slow clients */

/* MHD_OPTION_NOTIFY_CONNECTION: a connection joins the ring when it
 * starts and leaves it when it closes (before MHD closes its socket, so
 * that the reaper never shuts down a socket number reused since). */
static void on_connection(void *cls, struct MHD_Connection *c,
                          void **socket_context,
                          enum MHD_ConnectionNotificationCode toe)
{
    server_t *s = cls;
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        conn_t *k = calloc(1, sizeof *k);
        *socket_context = k;
        if (k == NULL || ci == NULL)
            return; /* no deadline for it: the idle timeout still holds */
        k->fd = ci->connect_fd;
        k->since = now_ns();
        pthread_mutex_lock(&s->lock);
        k->next = s->conns.next;
        k->prev = &s->conns;
        s->conns.next->prev = k;
        s->conns.next = k;
        pthread_mutex_unlock(&s->lock);
    } else if (toe == MHD_CONNECTION_NOTIFY_CLOSED) {
        conn_t *k = *socket_context;
        *socket_context = NULL;
        if (k == NULL)
            return;
        pthread_mutex_lock(&s->lock);
        if (k->next != NULL) {
            k->prev->next = k->next;
            k->next->prev = k->prev;
        }
        pthread_mutex_unlock(&s->lock);
        free(k);
    }
}

static conn_t *conn_of(struct MHD_Connection *c)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci != NULL ? ci->socket_context : NULL;
}

/* The request's headers are in: no deadline until it ends. */
static void headers_in(server_t *s, struct MHD_Connection *c)
{
    conn_t *k = conn_of(c);
    if (k == NULL)
        return;
    pthread_mutex_lock(&s->lock);
    k->in = true;
    pthread_mutex_unlock(&s->lock);
}

/* MHD_OPTION_NOTIFY_COMPLETED: the next request on a kept-alive
 * connection has its own deadline, from now. */
static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    server_t *s = cls;
    (void)toe;
    req_t *q = *con_cls;
    if (q != NULL) { /* however the request ended: its leases go back */
        if (q->held != NULL)
            metrics_lease_released(s->metrics, rate_rules_release(q->held));
        free(q);
        *con_cls = NULL;
    }
    conn_t *k = conn_of(c);
    if (k == NULL)
        return;
    pthread_mutex_lock(&s->lock);
    k->in = false;
    k->since = now_ns();
    pthread_mutex_unlock(&s->lock);
}

/* Every connection whose request's line and headers are not in
 * header_timeout_ns after it began is shut down (MHD then sees it end
 * and closes it), however often its client sends a byte.  Called by the
 * main loop, every 200 ms. */
static void reap_slow(server_t *s)
{
    uint64_t now = now_ns();
    pthread_mutex_lock(&s->lock);
    for (conn_t *k = s->conns.next; k != &s->conns; k = k->next) {
        if (!k->in && !k->cut && now - k->since > s->header_timeout_ns) {
            shutdown(k->fd, SHUT_RDWR);
            k->cut = true;
            s->cut++;
        }
    }
    pthread_mutex_unlock(&s->lock);
}

/* ------------------------------------------------- slow requests */

/* Whether the client of a suspended request has hung up (read EOF or an
 * error; a pipelined request's bytes are left for libmicrohttpd). */
static bool peer_gone(int fd)
{
    char b;
    ssize_t n = recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK &&
                      errno != EINTR);
}

/* Resumes each sleeping request when its work is over or its client is
 * gone (then it is closed at once, and its leases released), every 5 ms;
 * at the end, every one still asleep (as gone). */
static void *sleeper_main(void *arg)
{
    server_t *s = arg;
    for (;;) {
        bool stop = atomic_load(&s->stopping);
        uint64_t now = now_ns();
        pthread_mutex_lock(&s->slow_lock);
        for (req_t **link = &s->sleepers; *link != NULL;) {
            req_t *q = *link;
            bool gone = stop || peer_gone(q->fd);
            if (gone || now >= q->due) {
                *link = q->next;
                q->gone = gone;
                MHD_resume_connection(q->c);
            } else {
                link = &q->next;
            }
        }
        pthread_mutex_unlock(&s->slow_lock);
        if (stop)
            return NULL;
        struct timespec tick = {0, 5000000};
        nanosleep(&tick, NULL);
    }
}

/* /slow?ms=N: suspends the request for N ms (1..600000, default 1000),
 * holding whatever it took; the answer comes when it is resumed. */
static enum MHD_Result start_slow(server_t *s, struct MHD_Connection *c,
                                  req_t *q)
{
    const char *ms = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND,
                                                 "ms");
    unsigned long v = 1000;
    if (ms != NULL) {
        char *end;
        errno = 0;
        v = strtoul(ms, &end, 10);
        if (ms[0] < '0' || ms[0] > '9' || *end != '\0' || errno != 0 ||
            v == 0 || v > 600000)
            return reply(c, 400, "application/problem+json",
                         "{\"type\":\"about:blank\",\"title\":\"Bad "
                         "Request\",\"status\":400,\"detail\":\"ms is a "
                         "whole number from 1 to 600000.\"}\n",
                         NULL);
    }
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (ci == NULL)
        return reply(c, 500, "text/plain", "no socket\n", NULL);
    q->fd = ci->connect_fd;
    q->c = c;
    q->due = now_ns() + (uint64_t)v * 1000000u;
    q->stage = 1;
    pthread_mutex_lock(&s->slow_lock);
    MHD_suspend_connection(c);
    q->next = s->sleepers;
    s->sleepers = q;
    pthread_mutex_unlock(&s->slow_lock);
    return MHD_YES;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c,
                                  const char *url, const char *method,
                                  const char *version, const char *upload,
                                  size_t *upload_size, void **con_cls)
{
    server_t *s = cls;
    (void)version;
    (void)upload;

    if (*con_cls == NULL) { /* the headers are in; the body (if any) next */
        if ((*con_cls = calloc(1, sizeof(req_t))) == NULL)
            return MHD_NO;
        headers_in(s, c);
        return MHD_YES;
    }
    req_t *q = *con_cls;
    if (*upload_size != 0) { /* a body is ignored */
        *upload_size = 0;
        return MHD_YES;
    }
    if (q->stage == 1) /* a slow request resumed: done, or its client gone */
        return q->gone ? MHD_NO
                       : reply(c, 200, "application/json",
                               "{\"status\":\"ok\"}\n", &q->h);
    if (strcmp(url, "/metrics") == 0)
        return serve_metrics(s, c);
    if (s->no_limit)
        return reply(c, 200, "application/json", "{\"status\":\"ok\"}\n",
                     NULL);

    char addr[64], key[RATE_KEY_MAX + 1];
    client_address(c, addr, sizeof addr);
    const char *api_key =
        MHD_lookup_connection_value(c, MHD_HEADER_KIND, "X-API-Key");
    const char *prefix = "key:", *id = api_key;
    if (api_key == NULL || api_key[0] == '\0') {
        prefix = "ip:";
        id = addr;
    }
    size_t plen = strlen(prefix), idlen = strlen(id);
    if (idlen > RATE_KEY_MAX - plen) /* too long: rate_rules_acquire says so */
        idlen = RATE_KEY_MAX - plen + 1;
    memcpy(key, prefix, plen);
    memcpy(key + plen, id, idlen);
    size_t key_len = plen + idlen;
    rate_attr_t attrs[] = {{"api_key", api_key != NULL ? api_key : ""},
                           {"route", url},
                           {"method", method},
                           {"client", addr}};
    rate_outcome_t o;
    rate_headers_t h;
    uint64_t t0 = now_ns();
    int rc = rate_rules_acquire(s->rules, s->lim, key, key_len, attrs,
                                sizeof attrs / sizeof attrs[0], 1, 0, &o,
                                &q->held);
    metrics_latency(s->metrics, now_ns() - t0);
    if (q->held != NULL)
        metrics_lease(s->metrics, LEASE_GRANTED);
    else if (rc == RATE_OK && o.denied_by >= 0 &&
             o.applied[o.denied_by].concurrency > 0)
        metrics_lease(s->metrics, LEASE_DENIED);
    if (rc != RATE_OK) /* a key too long for the store */
        return reply(c, 400, "application/problem+json",
                     "{\"type\":\"about:blank\",\"title\":\"Bad Request\","
                     "\"status\":400,\"detail\":\"The API key is too "
                     "long.\"}\n",
                     NULL);
    rate_outcome_headers(&o, &h);
    if (h.status == 0 && strncmp(url, "/slow", 5) == 0) {
        q->h = h;
        return start_slow(s, c, q);
    }
    if (h.status == 0)
        return reply(c, 200, "application/json", "{\"status\":\"ok\"}\n", &h);
    char body[1024];
    problem(&o, &h, url, body, sizeof body);
    return reply(c, (unsigned)h.status, "application/problem+json", body, &h);
}

/* Store errors, logged by the main loop at most once a second with the
 * store's reason, so that an outage shows in the log and not only in
 * /metrics. */
typedef struct {
    uint64_t logged; /* store errors told so far */
    uint64_t at_ns;  /* when last told */
} error_log_t;

static void log_store_errors(server_t *s, error_log_t *el)
{
    uint64_t n = metrics_store_errors(s->metrics), now = now_ns();
    if (n == el->logged || (el->at_ns != 0 && now - el->at_ns < 1000000000u))
        return;
    char why[256] = "";
    if (s->store != NULL)
        (void)rate_store_redis_last_error(s->store, why, sizeof why);
    fprintf(stderr, "api-server: %llu decision%s failed on the store%s%s%s, "
                    "answered 503\n",
            (unsigned long long)(n - el->logged), n - el->logged == 1 ? "" : "s",
            why[0] != '\0' ? " (" : "", why, why[0] != '\0' ? ")" : "");
    el->logged = n;
    el->at_ns = now;
}

/* ------------------------------------------------------------- reloads */

typedef struct stamp {
    dev_t dev;
    ino_t ino;
    off_t size;
    struct timespec mtime;
} stamp_t;

static stamp_t stamp_of(const char *path)
{
    struct stat st;
    stamp_t s = {0};
    if (stat(path, &st) == 0)
        s = (stamp_t){st.st_dev, st.st_ino, st.st_size, st.st_mtim};
    return s;
}

static int same_stamp(stamp_t a, stamp_t b)
{
    return a.dev == b.dev && a.ino == b.ino && a.size == b.size &&
           a.mtime.tv_sec == b.mtime.tv_sec &&
           a.mtime.tv_nsec == b.mtime.tv_nsec;
}

/* A reload runs on a thread of its own (rate_rules_reload reads the file,
 * and only if it is good swaps it in); the main loop starts it, and logs
 * its result once it is over. */
typedef struct reloader {
    server_t *s;
    pthread_t thread;
    bool running;     /* started and not yet collected (the loop's) */
    bool threaded;    /* on its thread (else it ran on the loop) */
    atomic_bool done; /* the thread's work is over */
    const char *why;
    int rc;
    uint64_t generation;
    char err[512];
} reloader_t;

static void *reload_main(void *arg)
{
    reloader_t *rl = arg;
    rl->rc = rate_rules_reload(rl->s->rules, NULL, rl->err, sizeof rl->err);
    rl->generation = rate_rules_generation(rl->s->rules);
    atomic_store(&rl->done, true);
    return NULL;
}

/* The reload over, if it is: its result logged and counted. */
static void reload_collect(reloader_t *rl)
{
    if (!rl->running || !atomic_load(&rl->done))
        return;
    if (rl->threaded)
        pthread_join(rl->thread, NULL);
    rl->running = false;
    metrics_reload(rl->s->metrics, rl->rc == RATE_OK);
    if (rl->rc == RATE_OK)
        fprintf(stderr, "api-server: %s: rules reloaded (generation %llu)\n",
                rl->why, (unsigned long long)rl->generation);
    else
        fprintf(stderr, "api-server: %s: %s; the rules in use stay\n",
                rl->why, rl->err);
}

static void reload_start(reloader_t *rl, const char *why)
{
    rl->why = why;
    atomic_store(&rl->done, false);
    fprintf(stderr, "api-server: %s: reading %s\n", why, rl->s->config);
    rl->running = true;
    rl->threaded = pthread_create(&rl->thread, NULL, reload_main, rl) == 0;
    if (!rl->threaded)
        reload_main(rl); /* no thread: read here, the loop waiting */
}

/* ---------------------------------------------------------------- main */


static const char usage_text[] =
    "usage: api-server --listen IPV4:PORT --config FILE "
    "[--store memory|redis://...]\n"
    "                  [--max-conns-per-ip N] [--max-conns N] "
    "[--header-timeout SECONDS] [--no-limit]\n"
    "\n"
    "An HTTP API server limited by a rules file (docs/api-server.md): each\n"
    "request's X-API-Key, route, method and address pick its policies; a\n"
    "denial is a 429 with Retry-After, the RateLimit fields and a problem\n"
    "body.  GET /metrics: Prometheus counters.  SIGHUP, or a change to FILE,\n"
    "reloads the rules.\n"
    "\n"
    "  --listen IPV4:PORT  where to listen (port 0: any free port, logged)\n"
    "  --config FILE       the rules file (examples/api-server/example.conf)\n"
    "  --store URL         memory (default) or redis://host[:port][/db]: one\n"
    "                      limit for every server on that Redis\n"
    "  --max-conns-per-ip N  connections one address may hold open (default\n"
    "                      32; 0: no cap)\n"
    "  --max-conns N       connections open in all (default 1000)\n"
    "  --header-timeout S  a request's line and headers must come within S\n"
    "                      seconds (default 10), or the connection is closed\n"
    "  --no-limit          answer without deciding (the bench's baseline)\n"
    "  --help              this text\n";

/* A command-line error: what is wrong, then the usage, on standard error. */
static int usage(const char *what, const char *arg)
{
    if (what != NULL)
        fprintf(stderr, "api-server: %s%s%s%s\n", what, arg ? " '" : "",
                arg ? arg : "", arg ? "'" : "");
    fputs(usage_text, stderr);
    return 2;
}

static int parse_listen(const char *text, struct sockaddr_in *sa)
{
    char host[64];
    const char *colon = strrchr(text, ':');
    if (colon == NULL || (size_t)(colon - text) >= sizeof host)
        return -1;
    memcpy(host, text, (size_t)(colon - text));
    host[colon - text] = '\0';
    char *end;
    long port = strtol(colon + 1, &end, 10);
    if (*end != '\0' || colon[1] == '\0' || port < 0 || port > 65535)
        return -1;
    memset(sa, 0, sizeof *sa);
    sa->sin_family = AF_INET;
    sa->sin_port = htons((uint16_t)port);
    return inet_pton(AF_INET, host, &sa->sin_addr) == 1 ? 0 : -1;
}

/* A whole number from lo to hi for option `name`: 0, or -1 after saying
 * what is wrong. */
static int parse_uint(const char *name, const char *text, unsigned lo,
                      unsigned hi, unsigned *out)
{
    char *end;
    errno = 0;
    unsigned long v = strtoul(text, &end, 10);
    if (text[0] < '0' || text[0] > '9' || *end != '\0' || errno != 0 ||
        v < lo || v > hi) {
        fprintf(stderr, "api-server: %s '%s' is not a whole number from %u "
                        "to %u\n", name, text, lo, hi);
        return -1;
    }
    *out = (unsigned)v;
    return 0;
}

int main(int argc, char **argv)
{
    const char *listen = NULL, *store_url = "memory";
    /* Static: a reload still reading at the end keeps it in use. */
    static server_t s;
    char err[512];
    unsigned per_ip = 32, max_conns = 1000, header_timeout = 10;

    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--max-conns-per-ip") == 0 && i + 1 < argc) {
            if (parse_uint("--max-conns-per-ip", argv[++i], 0, 1000000,
                           &per_ip) != 0)
                return 2;
        } else if (strcmp(argv[i], "--max-conns") == 0 && i + 1 < argc) {
            if (parse_uint("--max-conns", argv[++i], 1, 1000000,
                           &max_conns) != 0)
                return 2;
        } else if (strcmp(argv[i], "--header-timeout") == 0 && i + 1 < argc) {
            if (parse_uint("--header-timeout", argv[++i], 1, 3600,
                           &header_timeout) != 0)
                return 2;
        } else if (strcmp(argv[i], "--listen") == 0 && i + 1 < argc)
            listen = argv[++i];
        else if (strcmp(argv[i], "--config") == 0 && i + 1 < argc)
            s.config = argv[++i];
        else if (strcmp(argv[i], "--store") == 0 && i + 1 < argc)
            store_url = argv[++i];
        else if (strcmp(argv[i], "--no-limit") == 0)
            s.no_limit = 1;
        else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0)
            return fputs(usage_text, stdout) == EOF ? 2 : 0;
        else if (strncmp(argv[i], "--", 2) == 0 && i + 1 == argc &&
                 (strcmp(argv[i], "--listen") == 0 ||
                  strcmp(argv[i], "--config") == 0 ||
                  strcmp(argv[i], "--store") == 0 ||
                  strcmp(argv[i], "--max-conns-per-ip") == 0 ||
                  strcmp(argv[i], "--max-conns") == 0 ||
                  strcmp(argv[i], "--header-timeout") == 0))
            return usage("option needs a value:", argv[i]);
        else
            return usage("unknown argument", argv[i]);
    }
    struct sockaddr_in sa;
    if (listen == NULL || s.config == NULL)
        return usage(listen == NULL ? "--listen is required"
                                    : "--config is required", NULL);
    if (parse_listen(listen, &sa) != 0) {
        fprintf(stderr, "api-server: --listen '%s' is not IPV4:PORT\n",
                listen);
        return 2;
    }
    if (rate_rules_load(s.config, &s.rules, err, sizeof err) != RATE_OK) {
        fprintf(stderr, "api-server: %s\n", err);
        return 2;
    }
    if (strcmp(store_url, "memory") != 0 &&
        rate_store_redis_new(store_url, NULL, &s.store, err, sizeof err) !=
            RATE_OK) {
        fprintf(stderr, "api-server: --store %s: %s\n", store_url, err);
        return 2;
    }
    if (metrics_new(&s.metrics) != 0)
        return 1;
    /* Requests no rule matches are unlimited. */
    rate_policy_t *none;
    if (rate_policy_parse("name=none unlimited", &none, err, sizeof err) !=
        RATE_OK)
        return 1;
    /* With --store redis://, servers on several hosts share the leases of
     * the rules' in-flight policies, timed by the limiter's clock: the
     * wall's, one clock for every host (rate decisions are on Redis's own
     * TIME). */
    rate_limiter_config_t cfg = {.policy = none,
                                 .store = s.store,
                                 .clock = s.store != NULL ? rate_clock_wall()
                                                          : NULL,
                                 .listener = metrics_listen,
                                 .listener_ud = s.metrics};
    if (rate_limiter_new(&cfg, &s.lim) != RATE_OK)
        return 1;
    rate_policy_free(none);

    /* Signals are taken by sigtimedwait below: blocked in every thread. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGHUP);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);

    pthread_mutex_init(&s.lock, NULL);
    s.conns.next = s.conns.prev = &s.conns;
    s.header_timeout_ns = (uint64_t)header_timeout * 1000000000u;
    /* The idle timeout alone does not stop a client that sends a byte
     * now and then: the per-address cap (0: none) and the header
     * deadline (reap_slow) do. */
    pthread_mutex_init(&s.slow_lock, NULL);
    if (pthread_create(&s.sleeper, NULL, sleeper_main, &s) != 0)
        return 1;
    struct MHD_Daemon *d = MHD_start_daemon(
        MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_USE_ERROR_LOG |
            MHD_ALLOW_SUSPEND_RESUME,
        0, NULL, NULL, on_request, &s, MHD_OPTION_SOCK_ADDR,
        (struct sockaddr *)&sa, MHD_OPTION_THREAD_POOL_SIZE, 2u,
        MHD_OPTION_CONNECTION_TIMEOUT, 30u,
        MHD_OPTION_PER_IP_CONNECTION_LIMIT, per_ip,
        MHD_OPTION_CONNECTION_LIMIT, max_conns,
        MHD_OPTION_NOTIFY_CONNECTION, on_connection, &s,
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, &s, MHD_OPTION_END);
    if (d == NULL) {
        fprintf(stderr, "api-server: cannot listen on %s: %s\n", listen,
                strerror(errno));
        return 1;
    }
    const union MHD_DaemonInfo *di =
        MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    char ip[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &sa.sin_addr, ip, sizeof ip);
    /* The first line: where, and which process (to signal this one). */
    fprintf(stderr, "api-server: listening on %s:%u (pid %ld, store %s%s)\n",
            ip, di != NULL ? di->port : ntohs(sa.sin_port), (long)getpid(),
            store_url, s.no_limit ? ", limiter off" : "");
    fprintf(stderr, "api-server: at most %u connections, %u per address "
                    "(0: no cap), headers within %u s\n",
            max_conns, per_ip, header_timeout);

    /* Static: a reload still reading at the end keeps using it. */
    static reloader_t rl;
    rl.s = &s;
    const char *pending = NULL; /* a reload asked for, and why */
    stamp_t seen = stamp_of(s.config), changing = seen;
    error_log_t errors = {0, 0};
    for (;;) {
        struct timespec tick = {0, 200000000};
        int sig = sigtimedwait(&sigs, NULL, &tick);
        reap_slow(&s);
        log_store_errors(&s, &errors);
        if (sig == SIGINT || sig == SIGTERM)
            break;
        if (sig == SIGHUP) {
            seen = stamp_of(s.config);
            pending = "SIGHUP";
        } else {
            /* A changed file is read once it has stayed the same for a
             * tick (200 ms), not while it is being written; what is read
             * half way all the same is refused (rate_rules_reload). */
            stamp_t now = stamp_of(s.config);
            if (!same_stamp(now, seen) && same_stamp(now, changing)) {
                seen = now;
                pending = "file changed";
            }
            changing = now;
        }
        /* One reload at a time; one asked for meanwhile (a change made
         * while the file was read) starts when it is over. */
        reload_collect(&rl);
        if (pending != NULL && !rl.running) {
            reload_start(&rl, pending);
            pending = NULL;
        }
    }
    atomic_store(&s.stopping, true); /* the sleepers resumed, as gone */
    pthread_join(s.sleeper, NULL);
    MHD_stop_daemon(d);
    reload_collect(&rl);
    rate_limiter_free(s.lim);
    rate_store_free(s.store);
    /* A reload still reading keeps the rules (and s): the process ends
     * without waiting for it. */
    if (rl.running)
        fprintf(stderr, "api-server: stopping during a reload of %s: the "
                        "reload is dropped\n", s.config);
    else
        rate_rules_free(s.rules);
    metrics_free(s.metrics);
    fprintf(stderr, "api-server: stopped (%llu connections closed by the "
                    "header deadline)\n", (unsigned long long)s.cut);
    return 0;
}
