/* SPDX-License-Identifier: MIT */
/*
 * ratelimit bench --redis URL --workload: issue 27's workload on both Redis
 * stores (docs/performance.md, "Redis throughput"): decisions over 100,000
 * random keys, token-bucket 1000000000/s burst=1000000000 (each decision an
 * admission that writes), the blocking store at 1 and 64 callers and the
 * asynchronous store (libevent, one thread) at 1 and 64 in flight, with
 * ratelimit.so used when the server has it and with the module turned
 * off; beside redis-benchmark's ceilings on the same server and, when
 * asked (--node-peer), a Node.js peer's figure, all in one run.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include <hiredis/hiredis.h>

#include "cli.h"
#include "ratelimit_redis.h"
#ifdef RATE_BENCH_EVENT
#include <event2/event.h>
#include "ratelimit_event.h"
#endif

#define LOAD_KEYS 100000
#define LOAD_POLICY "token-bucket 1000000000/s burst=1000000000"

typedef struct load {
    rate_limiter_t *lim;
    char (*keys)[16];
    uint64_t total;
    atomic_uint_fast64_t next; /* the next decision's index */
    atomic_uint_fast64_t errors, denied;
#ifdef RATE_BENCH_EVENT
    struct event_base *base;
    uint64_t depth, in_flight, done;
#endif
} load_t;

/* What one row measured. */
typedef struct figure {
    double rate;       /* decisions/s */
    double client_us;  /* the process's CPU per decision */
    double server_us;  /* Redis's CPU per decision (INFO cpu) */
    double switches;   /* the process's context switches per decision */
    double per_read;   /* decisions per read of a client by Redis */
    uint64_t errors;
} figure_t;

/* Keys "k0".."k99999" drawn at random (a fixed xorshift, the same for
 * every row and every build). */
static char (*draw_keys(uint64_t n))[16]
{
    char (*k)[16] = malloc(n * sizeof *k);
    uint64_t x = 88172645463325252u;
    for (uint64_t i = 0; k != NULL && i < n; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        snprintf(k[i], sizeof k[i], "k%llu",
                 (unsigned long long)(x % LOAD_KEYS));
    }
    return k;
}

static void tally(load_t *l, const rate_decision_t *d)
{
    if (d->reason == RATE_REASON_STORE_ERROR)
        atomic_fetch_add_explicit(&l->errors, 1, memory_order_relaxed);
    else if (!d->allowed)
        atomic_fetch_add_explicit(&l->denied, 1, memory_order_relaxed);
}

static void *caller(void *arg)
{
    load_t *l = arg;
    for (;;) {
        uint64_t i = atomic_fetch_add_explicit(&l->next, 1,
                                               memory_order_relaxed);
        if (i >= l->total)
            return NULL;
        rate_decision_t d;
        rate_limiter_check(l->lim, l->keys[i], strlen(l->keys[i]), 1, 0, &d);
        tally(l, &d);
    }
}

typedef struct meter {
    double cpu, srv, reads;
    long sw;
    uint64_t t0;
} meter_t;

static void meter_start(meter_t *m, const char *host, int port)
{
    m->srv = bench_server_cpu_s(host, port);
    m->reads = bench_server_reads(host, port);
    m->cpu = bench_self_cpu_s(&m->sw);
    m->t0 = rate_clock_monotonic_ns();
}

static figure_t meter_stop(const meter_t *m, const char *host, int port,
                           uint64_t n, uint64_t errors)
{
    figure_t f = {0};
    long sw;
    double secs = (double)(rate_clock_monotonic_ns() - m->t0) / 1e9;
    double cpu = bench_self_cpu_s(&sw), srv = bench_server_cpu_s(host, port);
    double reads = bench_server_reads(host, port);
    if (n == 0 || secs <= 0)
        return f;
    f.rate = (double)n / secs;
    f.client_us = (cpu - m->cpu) * 1e6 / (double)n;
    f.server_us = m->srv > 0 ? (srv - m->srv) * 1e6 / (double)n : 0;
    f.switches = (double)(sw - m->sw) / (double)n;
    f.per_read = reads > m->reads ? (double)n / (reads - m->reads) : 0;
    f.errors = errors;
    return f;
}

/* n decisions from `callers` threads on the blocking store's limiter. */
static figure_t run_blocking(rate_limiter_t *lim, char (*keys)[16], uint64_t n,
                             int callers, const char *host, int port)
{
    load_t l = {.lim = lim, .keys = keys, .total = n};
    pthread_t th[64];
    meter_t m;
    int started = 0;
    meter_start(&m, host, port);
    if (callers == 1) {
        caller(&l);
    } else {
        for (; started < callers && started < 64; started++)
            if (pthread_create(&th[started], NULL, caller, &l) != 0)
                break;
        for (int i = 0; i < started; i++)
            pthread_join(th[i], NULL);
    }
    return meter_stop(&m, host, port, n, atomic_load(&l.errors));
}

#ifdef RATE_BENCH_EVENT
static void start_more(load_t *l);

static void on_decided(void *ud, int rc, const rate_decision_t *d)
{
    load_t *l = ud;
    l->in_flight--;
    l->done++;
    if (rc == RATE_OK)
        tally(l, d);
    else
        atomic_fetch_add_explicit(&l->errors, 1, memory_order_relaxed);
    start_more(l);
}

/* Keeps `depth` decisions in flight until all are started; the loop ends
 * when the last is done. */
static void start_more(load_t *l)
{
    while (l->in_flight < l->depth && l->next < l->total) {
        const char *k = l->keys[l->next++];
        rate_decision_t d;
        int rc = rate_limiter_check_start(l->lim, k, strlen(k), 1, 0, &d,
                                          on_decided, l);
        if (rc == RATE_PENDING) {
            l->in_flight++;
        } else {
            l->done++;
            if (rc == RATE_OK)
                tally(l, &d);
            else
                atomic_fetch_add_explicit(&l->errors, 1,
                                          memory_order_relaxed);
        }
    }
    if (l->done == l->total)
        event_base_loopbreak(l->base);
}

/* n decisions with `depth` in flight on the asynchronous store's limiter,
 * driven by its libevent loop on this thread. */
static figure_t run_async(rate_limiter_t *lim, struct event_base *base,
                          char (*keys)[16], uint64_t n, uint64_t depth,
                          const char *host, int port)
{
    load_t l = {.lim = lim, .keys = keys, .total = n, .base = base,
                .depth = depth};
    meter_t m;
    meter_start(&m, host, port);
    start_more(&l);
    while (l.done < l.total)
        if (event_base_loop(base, 0) < 0)
            break;
    return meter_stop(&m, host, port, l.done, atomic_load(&l.errors));
}
#endif

/* Runs `cmd` (a shell command line) and reads its last line of the form
 * "decisions/s R client_us C": the Node peer's answer. */
static figure_t run_peer(const char *cmd, const char *host, int port,
                         uint64_t n)
{
    figure_t f = {0};
    char line[512];
    meter_t m;
    meter_start(&m, host, port);
    FILE *p = popen(cmd, "r");
    if (p == NULL)
        return f;
    while (fgets(line, sizeof line, p) != NULL) {
        double r, c;
        if (sscanf(line, "decisions/s %lf client_us %lf", &r, &c) == 2) {
            f.rate = r;
            f.client_us = c;
        }
    }
    if (pclose(p) != 0)
        f.rate = 0;
    double srv = bench_server_cpu_s(host, port);
    if (f.rate > 0 && m.srv > 0)
        f.server_us = (srv - m.srv) * 1e6 / (double)n;
    double reads = bench_server_reads(host, port);
    if (reads > m.reads)
        f.per_read = (double)n / (reads - m.reads);
    return f;
}

/* redis-benchmark's requests/s for `args` on host:port; 0 when absent. */
static double rb(const char *host, int port, const char *args)
{
    char cmd[1024], line[512];
    double rps = 0;
    int n = snprintf(cmd, sizeof cmd,
                     "redis-benchmark -h %s -p %d %s 2>/dev/null | "
                     "tr '\\r' '\\n'",
                     host, port, args);
    if (n < 0 || (size_t)n >= sizeof cmd)
        return 0;
    FILE *f = popen(cmd, "r");
    if (f == NULL)
        return 0;
    while (fgets(line, sizeof line, f) != NULL) {
        const char *t = strstr(line, "throughput summary:");
        if (t != NULL)
            rps = strtod(t + 19, NULL);
    }
    pclose(f);
    return rps;
}

static bool sha_of(const char *host, int port, const char *src, char *sha)
{
    struct timeval tv = {1, 0};
    redisContext *c = redisConnectWithTimeout(host, port, tv);
    bool ok = false;
    if (c != NULL && !c->err) {
        redisReply *r = redisCommand(c, "SCRIPT LOAD %s", src);
        ok = r != NULL && r->type == REDIS_REPLY_STRING && r->len == 40;
        if (ok)
            memcpy(sha, r->str, 41);
        freeReplyObject(r);
    }
    if (c != NULL)
        redisFree(c);
    return ok;
}

enum { ROW_B1, ROW_B64, ROW_A1, ROW_A64, ROWS };
static const char *row_name[ROWS] = {
    "blocking store, 1 caller", "blocking store, 64 callers",
    "async store (libevent), 1 in flight",
    "async store (libevent), 64 in flight"};

static void print_fig(const char *name, const figure_t *f, double ref)
{
    printf("  %-40s %10.0f %7.2f %7.2f %7.2f %7.2f %6.2f %6.1f", name,
           f->rate, ref > 0 ? f->rate / ref : 0, f->client_us, f->server_us,
           f->switches, f->rate * f->server_us / 1e6, f->per_read);
    if (f->errors)
        printf("  (%llu errors)", (unsigned long long)f->errors);
    putchar('\n');
}

int bench_redis_load(const char *url, const char *host, int port,
                     uint64_t decisions, const char *peer)
{
    char prefix[64], err[256];
    uint64_t n64 = decisions, n1 = decisions / 5 ? decisions / 5 : 1;
    char (*keys)[16] = draw_keys(n64);
    rate_policy_t *p;
    if (keys == NULL)
        return cli_fail("bench: out of memory");
    rate_policy_parse(LOAD_POLICY, &p, NULL, 0);
    snprintf(prefix, sizeof prefix, "ratelimit:load:%llu:",
             (unsigned long long)rate_clock_monotonic_ns());
#ifdef RATE_BENCH_EVENT
    struct event_base *base = event_base_new();
    rate_loop_t loop;
    rate_loop_event(&loop, base);
#endif

    /* Two settings: the module when the server has it (AUTO), and off. */
    rate_store_t *st[2][2] = {{NULL}};
    rate_limiter_t *lim[2][2] = {{NULL}};
    bool module = false;
    int nset = 1;
    for (int m = 0; m < 2; m++) {
        rate_redis_options_t o = {.prefix = prefix};
        o.module = m == 0 ? RATE_REDIS_MODULE_AUTO : RATE_REDIS_MODULE_OFF;
        for (int a = 0; a < 2; a++) {
            int rc;
#ifdef RATE_BENCH_EVENT
            rc = a == 0 ? rate_store_redis_new(url, &o, &st[m][a], err,
                                               sizeof err)
                        : rate_store_redis_async_new(url, &o, &loop,
                                                     &st[m][a], err,
                                                     sizeof err);
#else
            rc = a == 0 ? rate_store_redis_new(url, &o, &st[m][a], err,
                                               sizeof err)
                        : RATE_ENOTSUP;
#endif
            if (rc != RATE_OK && a == 0)
                return cli_fail("bench: --redis: %s", err);
            if (rc != RATE_OK)
                continue;
            rate_limiter_config_t cfg = {.policy = p, .store = st[m][a]};
            if (rate_limiter_new(&cfg, &lim[m][a]) != RATE_OK)
                return cli_fail("bench: cannot make the limiter");
        }
        if (m == 0) {
            rate_decision_t d;
            rate_redis_status_t rs;
            rate_limiter_check(lim[0][0], "probe", 5, 1, 0, &d);
            rate_store_redis_status(st[0][0], &rs);
            module = rs.module;
        }
    }
    nset = module ? 2 : 1;

    /* The ceilings, with the store's own arguments for this policy. */
    char one_sha[41], plain_sha[41], args[4][640];
    unsigned id = (unsigned)rate_policy_fingerprint(p);
    bool tcp = strncmp(url, "redis://", 8) == 0;
    bool ceil = tcp && sha_of(host, port, "return 1", one_sha);
    bool plain = ceil && sha_of(host, port, bench_plain_tb_lua, plain_sha);
    if (ceil) {
        snprintf(args[0], sizeof args[0],
                 "-n %llu -c 50 -P 16 EVALSHA %s 0",
                 (unsigned long long)(4 * n64), one_sha);
        snprintf(args[1], sizeof args[1],
                 "-n %llu -r %d -c 50 -P 16 RATELIMIT.STEP "
                 "%sceil{__rand_int__} '' '' 1 0 -1 %u 3 1 1000000000 "
                 "1000000000 1000000000",
                 (unsigned long long)n64, LOAD_KEYS, prefix, id);
        snprintf(args[2], sizeof args[2],
                 "-n %llu -r %d -c 1 -P 1 RATELIMIT.STEP "
                 "%sceil{__rand_int__} '' '' 1 0 -1 %u 3 1 1000000000 "
                 "1000000000 1000000000",
                 (unsigned long long)n1, LOAD_KEYS, prefix, id);
    }
    /* the minimal token-bucket script everyone writes, the same rate and
     * burst, over the same number of keys: the ceiling for a script */
    if (plain)
        snprintf(args[3], sizeof args[3],
                 "-n %llu -r %d -c 50 -P 16 EVALSHA %s 1 "
                 "%splain{__rand_int__} 1000000000 1000000000",
                 (unsigned long long)n64, LOAD_KEYS, plain_sha, prefix);
    char peer_cmd[1024] = "";
    if (peer != NULL)
        snprintf(peer_cmd, sizeof peer_cmd, "%s %s %d %llu %d 64", peer,
                 host, port, (unsigned long long)n64, LOAD_KEYS);

    /* Two rounds, every row in turn in each, the best of each kept: a
     * slow spell of the shared machine then falls on every row alike. */
    figure_t best[2][ROWS] = {{{0}}}, peer_best = {0};
    double c_one = 0, c_step = 0, c_seq = 0, c_plain = 0, plain_us = 0;
    for (int r = 0; r < 2; r++) {
        if (peer != NULL) {
            figure_t f = run_peer(peer_cmd, host, port, n64);
            if (f.rate > peer_best.rate)
                peer_best = f;
        }
        if (ceil) {
            double v = rb(host, port, args[0]);
            c_one = v > c_one ? v : c_one;
            if (plain) {
                double c0 = bench_server_cpu_s(host, port);
                v = rb(host, port, args[3]);
                double us = (bench_server_cpu_s(host, port) - c0) * 1e6 /
                            (double)n64;
                if (v > c_plain) {
                    c_plain = v;
                    plain_us = c0 > 0 ? us : 0;
                }
            }
            if (module) {
                v = rb(host, port, args[1]);
                c_step = v > c_step ? v : c_step;
                v = rb(host, port, args[2]);
                c_seq = v > c_seq ? v : c_seq;
            }
        }
        for (int m = 0; m < nset; m++)
            for (int row = 0; row < ROWS; row++) {
                figure_t f = {0};
                bool async = row == ROW_A1 || row == ROW_A64;
                bool many = row == ROW_B64 || row == ROW_A64;
                rate_limiter_t *l = lim[m][async];
                if (l == NULL)
                    continue;
#ifdef RATE_BENCH_EVENT
                if (async)
                    f = run_async(l, base, keys, many ? n64 : n1,
                                  many ? 64 : 1, host, port);
                else
#endif
                    f = run_blocking(l, keys, many ? n64 : n1,
                                     many ? 64 : 1, host, port);
                if (f.rate > best[m][row].rate)
                    best[m][row] = f;
            }
    }

    printf("\nRedis throughput (issue 27's workload, %s): %llu decisions "
           "(%llu at 1 in flight) over %d random keys,\n  %s, every "
           "decision an admission that writes; best of 2 rounds in turn\n",
           url, (unsigned long long)n64, (unsigned long long)n1, LOAD_KEYS,
           LOAD_POLICY);
    double ref = peer_best.rate > 0 ? peer_best.rate : 0;
    printf("  %-40s %10s %7s %7s %7s %7s %6s %6s\n", "", "decisions",
           ref > 0 ? "x peer" : "", "client", "server", "ctx", "Redis",
           "dec.");
    printf("  %-40s %10s %7s %7s %7s %7s %6s %6s\n", "", "/s", "", "CPU us",
           "CPU us", "sw", "busy", "/read");
    if (peer != NULL)
        print_fig("Node peer (rate-limiter-flexible), 64", &peer_best, ref);
    for (int m = 0; m < nset; m++) {
        printf("  %s\n", m == 0 && module ? "module loaded (RATELIMIT.STEP):"
                         : "scripts (module off, or not on the server):");
        for (int row = 0; row < ROWS; row++)
            if (lim[m][row >= ROW_A1] != NULL)
                print_fig(row_name[row], &best[m][row], ref);
    }
#ifndef RATE_BENCH_EVENT
    printf("  (the asynchronous rows need libevent: this build has none)\n");
#endif
    if (ceil) {
        printf("  redis-benchmark, same server, same run:\n");
        printf("  %-40s %10.0f\n", "EVALSHA 'return 1', -c 50 -P 16", c_one);
        if (plain) {
            int s = nset - 1; /* the scripts' rows */
            printf("  %-40s %10.0f %7s %7s %7.2f\n",
                   "plain token-bucket script, -c 50 -P 16", c_plain, "", "",
                   plain_us);
            printf("  %-40s async 64: %.2fx, blocking 64: %.2fx\n",
                   "  scripts against it",
                   c_plain > 0 ? best[s][ROW_A64].rate / c_plain : 0,
                   c_plain > 0 ? best[s][ROW_B64].rate / c_plain : 0);
        }
        if (module) {
            printf("  %-40s %10.0f   async+module 64: %.2fx, blocking+module "
                   "64: %.2fx\n",
                   "RATELIMIT.STEP, -c 50 -P 16", c_step,
                   c_step > 0 ? best[0][ROW_A64].rate / c_step : 0,
                   c_step > 0 ? best[0][ROW_B64].rate / c_step : 0);
            printf("  %-40s %10.0f   blocking 1: %.2fx its latency, async "
                   "1: %.2fx\n",
                   "RATELIMIT.STEP, -c 1 -P 1", c_seq,
                   best[0][ROW_B1].rate > 0 ? c_seq / best[0][ROW_B1].rate
                                            : 0,
                   best[0][ROW_A1].rate > 0 ? c_seq / best[0][ROW_A1].rate
                                            : 0);
        }
    }
    /* Which path each store took. */
    for (int m = 0; m < nset; m++) {
        rate_redis_status_t rs;
        if (rate_store_redis_status(st[m][0], &rs) == RATE_OK)
            printf("  %-40s module %llu, lean %llu, general %llu, "
                   "compare-and-set %llu\n",
                   m == 0 && module ? "blocking store's paths, module"
                                    : "blocking store's paths, scripts",
                   (unsigned long long)rs.module_decisions,
                   (unsigned long long)rs.lean_decisions,
                   (unsigned long long)rs.general_decisions,
                   (unsigned long long)rs.declined);
    }

    rate_store_redis_drop(st[0][0]);
    for (int m = 0; m < 2; m++)
        for (int a = 0; a < 2; a++) {
            rate_limiter_free(lim[m][a]);
            rate_store_free(st[m][a]);
        }
#ifdef RATE_BENCH_EVENT
    event_base_free(base);
#endif
    rate_policy_free(p);
    free(keys);
    return 0;
}
