/* SPDX-License-Identifier: MIT */
/*
 * ratelimit bench --redis URL: the Redis store's figures beside the floor
 * measured in the same run, one PING round trip on a fresh connection.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <hiredis/hiredis.h>

#include "cli.h"
#include "redis_step_lua.h" /* assembled from src/store/redis/step.lua */
#include "redis_tb_lua.h"   /* the lean scripts, assembled from */
#include "redis_lb_lua.h"   /* src/store/redis/lean_tb.lua, */
#include "redis_fw_lua.h"   /* lean_lb.lua, lean_fw.lua, */
#include "redis_sw_lua.h"   /* lean_sw.lua, */
#include "redis_sl_lua.h"   /* lean_sl.lua */
#include "ratelimit_redis.h"

/* A plain token bucket of the kind everyone writes (Redis's TIME, two
 * HGET, one HSET, an expiry): the ceiling the lean scripts are held to.
 * ARGV: rate (per second), burst. */
const char bench_plain_tb_lua[] =
    "local t = redis.call('TIME')\n"
    "local now = t[1] * 1000000 + t[2]\n"
    "local tokens = tonumber(redis.call('HGET', KEYS[1], 't'))\n"
    "local last = tonumber(redis.call('HGET', KEYS[1], 'ts'))\n"
    "local rate, burst = tonumber(ARGV[1]), tonumber(ARGV[2])\n"
    "if tokens == nil then tokens = burst; last = now end\n"
    "tokens = math.min(burst, tokens + (now - last) * rate / 1000000)\n"
    "local ok = 0\n"
    "if tokens >= 1 then tokens = tokens - 1; ok = 1 end\n"
    "redis.call('HSET', KEYS[1], 't', tokens, 'ts', now)\n"
    "redis.call('PEXPIRE', KEYS[1], math.ceil(burst / rate * 1000))\n"
    "return ok\n";

#define MS UINT64_C(1000000)

typedef struct rworker {
    rate_limiter_t *lim;
    char key[32];
    uint64_t until_ns, done, errors;
} rworker_t;

static void *run(void *arg)
{
    rworker_t *w = arg;
    while (rate_clock_monotonic_ns() < w->until_ns) {
        rate_decision_t d;
        rate_limiter_check(w->lim, w->key, strlen(w->key), 1, 0, &d);
        w->done++;
        w->errors += d.reason == RATE_REASON_STORE_ERROR;
    }
    return NULL;
}

/* Decisions per second with `n` threads for `ms`, on `nkeys` keys. */
static double throughput(rate_limiter_t *lim, int n, int nkeys, uint64_t ms,
                         uint64_t *errors)
{
    rworker_t *w = calloc((size_t)n, sizeof *w);
    pthread_t *th = calloc((size_t)n, sizeof *th);
    uint64_t t0 = rate_clock_monotonic_ns(), total = 0;
    for (int i = 0; i < n; i++) {
        w[i].lim = lim;
        snprintf(w[i].key, sizeof w[i].key, "bench:%d", i % nkeys);
        w[i].until_ns = t0 + ms * MS;
        pthread_create(&th[i], NULL, run, &w[i]);
    }
    for (int i = 0; i < n; i++) {
        pthread_join(th[i], NULL);
        total += w[i].done;
        *errors += w[i].errors;
    }
    double secs = (double)(rate_clock_monotonic_ns() - t0) / 1e9;
    free(w);
    free(th);
    return (double)total / secs;
}

/* One PING round trip, best of a few thousand. */
static double ping_ns(const char *host, int port)
{
    struct timeval tv = {1, 0};
    redisContext *c = redisConnectWithTimeout(host, port, tv);
    double best = 1e300;
    if (c == NULL || c->err)
        return 0;
    for (int round = 0; round < 5; round++) {
        uint64_t t0 = rate_clock_monotonic_ns();
        for (int i = 0; i < 2000; i++)
            freeReplyObject(redisCommand(c, "PING"));
        double v = (double)(rate_clock_monotonic_ns() - t0) / 2000;
        if (v < best)
            best = v;
    }
    redisFree(c);
    return best;
}

/* Runs redis-benchmark (from redis-tools) on `args`, returns its requests
 * per second, or 0 when it is not there or fails. */
static double redis_benchmark(const char *host, int port, const char *args)
{
    char cmd[1024], line[512];
    double rps = 0;
    int n = snprintf(cmd, sizeof cmd,
                     "redis-benchmark -h %s -p %d %s 2>/dev/null | "
                     "tr '\\r' '\\n'",
                     host, port, args);
    if (n < 0 || (size_t)n >= sizeof cmd)
        return 0; /* a command cut short would run something else */
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

/* Whether one call of a redis-benchmark row (its words from EVALSHA or
 * FCALL on, a '...' word as redis-benchmark reads it: one argument, ''
 * an empty one; its key's {__rand_int__} as {check}) writes its key:
 * that the row measures decisions, not an early return on arguments the
 * script reads another way. */
static bool row_decides(const char *host, int port, const char *row)
{
    const char *from = strstr(row, "EVALSHA ");
    if (from == NULL)
        from = strstr(row, "FCALL ");
    char buf[640], *words[32];
    size_t lens[32];
    int n = 0;
    if (from == NULL || strlen(from) >= sizeof buf)
        return false;
    strcpy(buf, from);
    for (char *w = buf; *w != '\0' && n < 32;) {
        if (*w == ' ') {
            w++;
            continue;
        }
        char *end;
        if (*w == '\'') { /* quoted: to the closing quote */
            w++;
            end = strchr(w, '\'');
            if (end == NULL)
                return false;
        } else {
            end = w + strcspn(w, " ");
        }
        char *next = *end != '\0' ? end + 1 : end;
        *end = '\0';
        char *r = strstr(w, "{__rand_int__}");
        if (r != NULL)
            memmove(r, "{check}", sizeof "{check}");
        words[n] = w;
        lens[n] = strlen(w);
        n++;
        w = next;
    }
    struct timeval tv = {2, 0};
    redisContext *c = redisConnectWithTimeout(host, port, tv);
    bool ok = false;
    if (c != NULL && !c->err && n > 3) {
        freeReplyObject(redisCommandArgv(c, n, (const char **)words, lens));
        redisReply *r = redisCommand(c, "EXISTS %s", words[3]);
        ok = r != NULL && r->type == REDIS_REPLY_INTEGER && r->integer == 1;
        freeReplyObject(r);
        freeReplyObject(redisCommand(c, "DEL %s", words[3]));
    }
    if (c != NULL)
        redisFree(c);
    return ok;
}

/* SCRIPT LOAD of a script on a fresh connection; sha must hold 41 bytes. */
static bool load_script(const char *host, int port, const char *src,
                        char *sha)
{
    struct timeval tv = {1, 0};
    redisContext *c = redisConnectWithTimeout(host, port, tv);
    bool ok = false;
    if (c != NULL && !c->err) {
        redisReply *r = redisCommand(c, "SCRIPT LOAD %s", src);
        if (r != NULL && r->type == REDIS_REPLY_STRING && r->len == 40) {
            memcpy(sha, r->str, 41);
            ok = true;
        }
        freeReplyObject(r);
    }
    if (c != NULL)
        redisFree(c);
    return ok;
}

/* 64 callers for 1 s: where a decision's time goes, client CPU, server
 * CPU and the callers' context switches, each per decision. */
static void where_time_goes(rate_limiter_t *lim, const char *what,
                            const char *host, int port)
{
    uint64_t errors = 0;
    long sw0, sw1;
    double srv0 = bench_server_cpu_s(host, port);
    double cli0 = bench_self_cpu_s(&sw0);
    uint64_t t0 = rate_clock_monotonic_ns();
    double rate = throughput(lim, 64, 64, 1000, &errors);
    double secs = (double)(rate_clock_monotonic_ns() - t0) / 1e9;
    double cli1 = bench_self_cpu_s(&sw1);
    double srv1 = bench_server_cpu_s(host, port);
    double n = rate * secs;
    if (n <= 0)
        return;
    printf("  %-40s %8.2f %8.2f %8.2f\n", what, (cli1 - cli0) * 1e6 / n,
           srv0 > 0 ? (srv1 - srv0) * 1e6 / n : 0, (double)(sw1 - sw0) / n);
}

/* ratelimit.so's rows (docs/redis-module.md), when the server has it:
 * the pipelined ceiling of RATELIMIT.STEP (redis-benchmark, the store's
 * arguments) beside EVALSHA of 'return 1', and the store over the module
 * against the store over the scripts (module off) at 1 and 64 callers,
 * alternating for a few rounds, the best of each.  The store's choice of
 * path is printed.  0, or 1 when the stores cannot be made. */
static int bench_module(const char *url, const char *host, int port,
                        const char *prefix, const rate_policy_t *p,
                        bool ceilings, const char *one_args)
{
    rate_store_t *sm, *ss;
    rate_redis_options_t o = {0};
    char err[256];
    o.prefix = prefix;
    if (rate_store_redis_new(url, &o, &sm, err, sizeof err) != RATE_OK)
        return cli_fail("bench: --redis: %s", err);
    o.module = RATE_REDIS_MODULE_OFF;
    if (rate_store_redis_new(url, &o, &ss, err, sizeof err) != RATE_OK) {
        rate_store_free(sm);
        return cli_fail("bench: --redis: %s", err);
    }
    rate_limiter_config_t cfg = {.policy = p, .store = sm};
    rate_limiter_t *lm, *ls;
    rate_limiter_new(&cfg, &lm);
    cfg.store = ss;
    rate_limiter_new(&cfg, &ls);
    uint64_t errors = 0;
    rate_decision_t d;
    rate_limiter_check(lm, "probe", 5, 1, 0, &d); /* the store asks */
    rate_redis_status_t st;
    rate_store_redis_status(sm, &st);
    printf("\nratelimit.so (the Redis module): %s\n",
           st.module ? "loaded, the store decides through RATELIMIT.STEP"
                     : "not loaded on this server, the store uses the "
                       "scripts");
    if (st.module) {
        char mod_args[512];
        snprintf(mod_args, sizeof mod_args,
                 "-n 200000 -r 64 -c 50 -P 16 RATELIMIT.STEP "
                 "%sceil{__rand_int__} '' '' 1 0 -1 %u 3 1 100000 "
                 "1000000000 1000",
                 prefix, (unsigned)rate_policy_fingerprint(p));
        double ceil_mod = 0, ceil_one = 0, m1 = 0, s1 = 0, m64 = 0, s64 = 0;
        for (int r = 0; r < 3; r++) {
            double v;
            if (ceilings) {
                v = redis_benchmark(host, port, mod_args);
                ceil_mod = v > ceil_mod ? v : ceil_mod;
                v = redis_benchmark(host, port, one_args);
                ceil_one = v > ceil_one ? v : ceil_one;
            }
            v = throughput(lm, 1, 1, 300, &errors);
            m1 = v > m1 ? v : m1;
            v = throughput(ls, 1, 1, 300, &errors);
            s1 = v > s1 ? v : s1;
            v = throughput(lm, 64, 64, 500, &errors);
            m64 = v > m64 ? v : m64;
            v = throughput(ls, 64, 64, 500, &errors);
            s64 = v > s64 ? v : s64;
        }
        if (ceil_mod > 0 && ceil_one > 0) {
            printf("  %-40s %12.0f\n", "-c 50 -P 16, RATELIMIT.STEP", ceil_mod);
            printf("  %-40s %12.0f   module: %.2fx of it\n",
                   "-c 50 -P 16, EVALSHA of 'return 1'", ceil_one,
                   ceil_mod / ceil_one);
        }
        printf("  %-40s %12s %12s %8s\n", "store, decisions/s", "module",
               "scripts", "ratio");
        printf("  %-40s %12.0f %12.0f %8.2f\n", "1 caller", m1, s1, m1 / s1);
        printf("  %-40s %12.0f %12.0f %8.2f\n", "64 callers (distinct keys)",
               m64, s64, m64 / s64);
        printf("  %-40s %8s %8s %8s\n", "64 callers, per decision",
               "client", "server", "switch");
        printf("  %-40s %8s %8s %8s\n", "", "CPU us", "CPU us", "es");
        where_time_goes(lm, "store over the module", host, port);
        where_time_goes(ls, "store over the scripts", host, port);
    }
    if (errors)
        printf("  store errors: %llu\n", (unsigned long long)errors);
    rate_limiter_free(lm);
    rate_limiter_free(ls);
    rate_store_free(sm);
    rate_store_free(ss);
    return 0;
}

/* The same decisions at 1 and 64 callers on the single server's limiter
 * and on a cluster's, in turns for a few rounds, the best of each. */
static int bench_cluster(rate_limiter_t *single, const char *url,
                         const rate_policy_t *p, const char *prefix)
{
    rate_redis_options_t o = {.prefix = prefix};
    rate_store_t *store;
    rate_limiter_t *lim;
    rate_redis_status_t st;
    char err[256];

    if (rate_store_redis_new(url, &o, &store, err, sizeof err) != RATE_OK)
        return cli_fail("bench: --redis-cluster: %s", err);
    rate_store_redis_status(store, &st);
    if (!st.cluster) {
        rate_store_free(store);
        return cli_fail("bench: --redis-cluster: %s is no Redis Cluster", url);
    }
    rate_limiter_config_t cfg = {.policy = p, .store = store};
    if (rate_limiter_new(&cfg, &lim) != RATE_OK) {
        rate_store_free(store);
        return cli_fail("bench: cannot make the limiter");
    }
    static const int callers[] = {1, 64};
    double one[2] = {0}, many[2] = {0};
    uint64_t errors = 0;
    for (int r = 0; r < 3; r++) {
        for (int i = 0; i < 2; i++) {
            rate_limiter_t *l = i == 0 ? single : lim;
            double v = throughput(l, callers[0], 1, 300, &errors);
            one[i] = v > one[i] ? v : one[i];
            v = throughput(l, callers[1], callers[1], 500, &errors);
            many[i] = v > many[i] ? v : many[i];
        }
    }
    printf("\nRedis Cluster (%s): %u masters, same decisions, same run\n",
           url, st.masters);
    printf("  %-40s %12s %12s %8s\n", "callers (distinct keys)", "one server",
           "cluster", "ratio");
    printf("  %-40d %12.0f %12.0f %8.2f\n", 1, one[0], one[1],
           one[1] / one[0]);
    printf("  %-40d %12.0f %12.0f %8.2f\n", 64, many[0], many[1],
           many[1] / many[0]);
    rate_store_redis_status(store, &st);
    printf("  %-40s %12llu\n", "cluster redirections",
           (unsigned long long)st.redirections);
    if (errors)
        printf("  store errors: %llu\n", (unsigned long long)errors);
    rate_store_redis_drop(store);
    rate_limiter_free(lim);
    rate_store_free(store);
    return 0;
}

/* The lean scripts beside the ceilings, pipelined (redis-benchmark -c 50
 * -P 16, over 64 keys, the arguments the store sends, admissions that
 * write), and the store over them against the store over the general
 * script (general_script) at 1 to 64 callers, in turns for a few rounds,
 * the best of each; with how many decisions each path took. */
static void bench_lean(const char *url, const char *host, int port,
                       const char *prefix, const rate_policy_t *p,
                       const rate_redis_options_t *base)
{
    /* rows: EVALSHA of 'return 1', the plain script, the general script
     * (a token bucket, a sliding window, a sliding log), the NL lean
     * scripts by EVALSHA from row LEAN0, then by FCALL */
    enum { NL = 5, LEAN0 = 5, ROWS = LEAN0 + 2 * NL };
    char sha[LEAN0 + NL][41], args[ROWS][640];
    static const char *names[ROWS] = {
        "EVALSHA of 'return 1'", "plain token-bucket script",
        "general script (redis_step.lua)", "general script, sliding window",
        "general script, sliding log",
        "lean token bucket, EVALSHA", "lean leaky bucket, EVALSHA",
        "lean fixed window, EVALSHA", "lean sliding window, EVALSHA",
        "lean sliding log, EVALSHA",
        "lean token bucket, FCALL (the store's)",
        "lean leaky bucket, FCALL (the store's)",
        "lean fixed window, FCALL (the store's)",
        "lean sliding window, FCALL (the store's)",
        "lean sliding log, FCALL (the store's)"};
    const char *src[LEAN0 + NL] = {
        "return 1",     bench_plain_tb_lua, redis_step_lua, redis_step_lua,
        redis_step_lua, redis_tb_lua,       redis_lb_lua,   redis_fw_lua,
        redis_sw_lua,   redis_sl_lua};
    for (int i = 0; i < LEAN0 + NL; i++)
        if (!load_script(host, port, src[i], sha[i]))
            return;
    unsigned id = (unsigned)rate_policy_fingerprint(p);
    const char *head = "-n 60000 -r 64 -c 50 -P 16 EVALSHA";
    snprintf(args[0], sizeof args[0], "-n 200000 -c 50 -P 16 EVALSHA %s 0",
             sha[0]);
    snprintf(args[1], sizeof args[1], "%s %s 1 %splain{__rand_int__} 100000 1000",
             head, sha[1], prefix);
    snprintf(args[2], sizeof args[2],
             "%s %s 1 %sgen{__rand_int__} '' '' 1 0 -1 %u 3 1 100000 "
             "1000000000 1000", head, sha[2], prefix, id);
    /* sliding-window 100000/s (algorithm 5), within the general
     * script's range and the lean one's */
    snprintf(args[3], sizeof args[3],
             "%s %s 1 %sgensw{__rand_int__} '' '' 1 0 -1 %u 3 5 100000 "
             "1000000000 0", head, sha[3], prefix, id);
    /* sliding-log 1000/10ms (algorithm 4): at the bench's rate a key logs
     * a few entries a window, each call an admission that writes them */
    snprintf(args[4], sizeof args[4],
             "%s %s 1 %sgensl{__rand_int__} '' '' 1 0 -1 %u 3 4 1000 "
             "10000000 0", head, sha[4], prefix, id);
    /* The lean scripts: time, permits, max_wait, the operation (0, an
     * admission), then the policy's numbers in one argument (lean.lua):
     * the expiry, id, format, the word's width and the algorithm's.
     * token-bucket 100000/s burst=1000: g = 10^5, L/g = 1, P/g = 10^4 */
    snprintf(args[5], sizeof args[5],
             "%s %s 1 %stb{__rand_int__} '' '' 1 0 0 '-1 %u 3 8 1 10000 "
             "1000 100000 46116860184273'", head, sha[5], prefix, id);
    snprintf(args[6], sizeof args[6],
             "%s %s 1 %slb{__rand_int__} '' '' 1 0 0 '-1 %u 3 8 1 10000 "
             "1000 100000'", head, sha[6], prefix, id);
    /* fixed-window 100000000/1h */
    snprintf(args[7], sizeof args[7],
             "%s %s 1 %sfw{__rand_int__} '' '' 1 0 0 '-1 %u 3 8 100000000 "
             "3600000000000'", head, sha[7], prefix, id);
    /* sliding-window 100000/s: the two counts, 16 bytes */
    snprintf(args[8], sizeof args[8],
             "%s %s 1 %ssw{__rand_int__} '' '' 1 0 0 '-1 %u 3 16 100000 "
             "1000000000'", head, sha[8], prefix, id);
    /* sliding-log 1000/10ms: count, sum, then the entries (width 0) */
    snprintf(args[9], sizeof args[9],
             "%s %s 1 %ssl{__rand_int__} '' '' 1 0 0 '-1 %u 3 0 1000 "
             "10000000'", head, sha[9], prefix, id);
    /* The same as a Functions library of the bench's own, as the store
     * sends them (docs/redis.md), deleted at the end. */
    int rows = LEAN0 + NL;
    size_t liblen = 64 + NL * 128;
    for (int i = 0; i < NL; i++)
        liblen += strlen(src[LEAN0 + i]) + 1;
    char *lib = malloc(liblen);
    struct timeval tv = {2, 0};
    redisContext *fc = redisConnectWithTimeout(host, port, tv);
    if (lib != NULL && fc != NULL && !fc->err) {
        size_t n = (size_t)snprintf(lib, liblen,
                                    "#!lua name=ratelimit_bench\n");
        for (int i = 0; i < NL; i++) {
            /* the part before "--@call" at load, as the store's library */
            const char *s = src[LEAN0 + i];
            const char *call = strstr(s, "\n--@call\n");
            int pre = call != NULL ? (int)(call - s) : 0;
            n += (size_t)snprintf(lib + n, liblen - n,
                                  "do\n%.*s\nredis.register_function("
                                  "'rlbench_%d', function(KEYS, ARGV)\n%s"
                                  "\nend)\nend\n",
                                  pre, s, i, call != NULL ? call : s);
        }
        redisReply *fr = redisCommand(fc, "FUNCTION LOAD REPLACE %b", lib, n);
        if (fr != NULL && fr->type == REDIS_REPLY_STRING) {
            for (int i = 0; i < NL; i++) {
                /* args[LEAN0 + i] with FCALL rlbench_i for EVALSHA sha */
                char line[640];
                snprintf(line, sizeof line,
                         "-n 60000 -r 64 -c 50 -P 16 FCALL rlbench_%d%s", i,
                         args[LEAN0 + i] + strlen(head) + 1 + 40);
                memcpy(args[LEAN0 + NL + i], line, sizeof line);
            }
            rows = ROWS;
        }
        freeReplyObject(fr);
    }
    /* (the lean rows: ARGV[5] is the operation, 0 an admission) */
    for (int i = 1; i < rows; i++)
        if (!row_decides(host, port, args[i])) {
            fprintf(stderr, "ratelimit: bench: the row '%s' does not write "
                            "its key: its arguments are not a decision\n",
                    names[i]);
            if (rows == ROWS)
                freeReplyObject(
                    redisCommand(fc, "FUNCTION DELETE ratelimit_bench"));
            if (fc != NULL)
                redisFree(fc);
            free(lib);
            return;
        }
    /* calls/s, and Redis's CPU per call (INFO cpu: all its threads,
     * the protocol's share too), the least of the rounds */
    double best[ROWS] = {0}, cpu[ROWS] = {0};
    for (int r = 0; r < 3; r++)
        for (int i = 0; i < rows; i++) {
            double c0 = bench_server_cpu_s(host, port);
            double v = redis_benchmark(host, port, args[i]);
            double c = (bench_server_cpu_s(host, port) - c0) * 1e6 /
                       (i == 0 ? 200000.0 : 60000.0);
            best[i] = v > best[i] ? v : best[i];
            if (v > 0 && c0 > 0 && (cpu[i] == 0 || c < cpu[i]))
                cpu[i] = c;
        }
    printf("\nScripts, pipelined (redis-benchmark -c 50 -P 16, 64 keys, "
           "best of 3):\n");
    printf("  %-40s %12s %10s %12s %10s\n", "script", "calls/s", "x plain",
           "Redis us", "x plain");
    for (int i = 0; i < rows; i++)
        printf("  %-40s %12.0f %10.2f %12.2f %10.2f\n", names[i], best[i],
               best[1] > 0 ? best[i] / best[1] : 0, cpu[i],
               cpu[1] > 0 ? cpu[i] / cpu[1] : 0);
    if (rows == ROWS)
        freeReplyObject(redisCommand(fc, "FUNCTION DELETE ratelimit_bench"));
    if (fc != NULL)
        redisFree(fc);
    free(lib);

    rate_store_t *st[2];
    rate_limiter_t *lim[2];
    for (int i = 0; i < 2; i++) {
        rate_redis_options_t o = *base;
        char err[256];
        o.general_script = i == 1;
        if (rate_store_redis_new(url, &o, &st[i], err, sizeof err) != RATE_OK) {
            if (i == 1) {
                rate_limiter_free(lim[0]);
                rate_store_free(st[0]);
            }
            return;
        }
        rate_limiter_config_t cfg = {.policy = p, .store = st[i]};
        if (rate_limiter_new(&cfg, &lim[i]) != RATE_OK)
            lim[i] = NULL;
    }
    static const int callers[] = {1, 2, 8, 32, 64};
    double at[2][5] = {{0}};
    uint64_t errors = 0;
    for (int r = 0; r < 3; r++)
        for (size_t c = 0; c < 5; c++)
            for (int i = 0; i < 2 && lim[0] && lim[1]; i++) {
                if (r > 0 && callers[c] < 32)
                    continue;
                double v = throughput(lim[i], callers[c], callers[c],
                                      callers[c] == 1 ? 300 : 500, &errors);
                at[i][c] = v > at[i][c] ? v : at[i][c];
            }
    printf("\nThe store (token-bucket 100000/s burst=1000), lean script vs "
           "general, same run:\n");
    printf("  %-40s %12s %12s %8s\n", "callers (distinct keys)", "lean",
           "general", "ratio");
    for (size_t c = 0; c < 5; c++)
        printf("  %-40d %12.0f %12.0f %8.2f\n", callers[c], at[0][c],
               at[1][c], at[1][c] > 0 ? at[0][c] / at[1][c] : 0);
    for (int i = 0; i < 2; i++) {
        rate_redis_status_t rs;
        rate_store_redis_status(st[i], &rs);
        printf("  %-40s lean %llu, general %llu, compare-and-set %llu\n",
               i == 0 ? "decisions by path (lean store)"
                      : "decisions by path (general store)",
               (unsigned long long)rs.lean_decisions,
               (unsigned long long)rs.general_decisions,
               (unsigned long long)rs.declined);
        rate_limiter_free(lim[i]);
        rate_store_free(st[i]);
    }
    if (errors)
        printf("  store errors: %llu\n", (unsigned long long)errors);
}

int bench_redis(const char *url, const char *cluster_url,
                const bench_redis_opts_t *bo)
{
    rate_redis_options_t o = {0};
    rate_store_t *store;
    char err[256], prefix[64], host[256] = "127.0.0.1";
    int port = 6379;

    snprintf(prefix, sizeof prefix, "ratelimit:bench:%llu:",
             (unsigned long long)rate_clock_monotonic_ns());
    o.prefix = prefix;
    o.module = RATE_REDIS_MODULE_OFF; /* the scripts; the module's rows
                                         are bench_module's */
    if (rate_store_redis_new(url, &o, &store, err, sizeof err) != RATE_OK)
        return cli_fail("bench: --redis: %s", err);
    /* host:port for the floor's own connection (TCP URLs only). */
    if (strncmp(url, "redis://", 8) == 0) {
        const char *h = strchr(url + 8, '@');
        h = h ? h + 1 : url + 8;
        size_t n = strcspn(h, ":/");
        if (n > 0 && n < sizeof host) {
            memcpy(host, h, n);
            host[n] = '\0';
        }
        if (h[n] == ':')
            port = atoi(h + n + 1);
    }
    uint64_t decisions = bo->decisions ? bo->decisions : 40000;
    if (bo->workload_only) {
        rate_store_free(store);
        return bench_redis_load(url, host, port, decisions, bo->peer);
    }
    rate_policy_t *p;
    rate_policy_parse("token-bucket 100000/s burst=1000", &p, NULL, 0);
    rate_limiter_config_t cfg = {.policy = p, .store = store};
    rate_limiter_t *lim;
    if (rate_limiter_new(&cfg, &lim) != RATE_OK)
        return cli_fail("bench: cannot make the limiter");

    /* The ceilings: redis-benchmark against the same server, on the same
     * Lua step with the arguments the store sends for these decisions
     * (Redis's TIME, one permit, the exact expiry, this token bucket), over
     * 64 keys so that most requests are admitted and write, as ours are;
     * and on a script that does nothing.  The machine is shared, so each
     * comparison alternates ours and the ceiling for a few rounds and keeps
     * the best of each: a slow spell then hurts neither side alone. */
    char step_sha[41], one_sha[41], seq_args[512], par_args[512],
        one_args[512] = "";
    bool ceilings = strncmp(url, "redis://", 8) == 0 &&
                    load_script(host, port, redis_step_lua, step_sha) &&
                    load_script(host, port, "return 1", one_sha);
    if (ceilings) {
        char tail[160];
        /* The policy's id in a store is its fingerprint unless another
         * policy took that first (not in a namespace of the bench's own);
         * 3: the state format. */
        snprintf(tail, sizeof tail,
                 "1 %sceil{__rand_int__} '' '' 1 0 -1 %u 3 1 100000 "
                 "1000000000 1000",
                 prefix, (unsigned)rate_policy_fingerprint(p));
        snprintf(seq_args, sizeof seq_args,
                 "-n 10000 -r 1 -c 1 -P 1 EVALSHA %s %s", step_sha, tail);
        snprintf(par_args, sizeof par_args,
                 "-n 100000 -r 64 -c 50 -P 16 EVALSHA %s %s", step_sha, tail);
        snprintf(one_args, sizeof one_args,
                 "-n 200000 -c 50 -P 16 EVALSHA %s 0", one_sha);
    }
    double rtt = ping_ns(host, port);
    uint64_t errors = 0;
    double one = 0, seq = 0;
    for (int r = 0; r < 3; r++) {
        double v = throughput(lim, 1, 1, 300, &errors);
        one = v > one ? v : one;
        v = ceilings ? redis_benchmark(host, port, seq_args) : 0;
        seq = v > seq ? v : seq;
    }
    printf("\nRedis store (%s): one decision = one script call (FCALL of a\n"
           "  lean script, or EVALSHA of the general one)\n",
           url);
    printf("  %-40s %10.0f ns\n", "floor: one PING round trip", rtt);
    printf("  %-40s %10.0f ns  %5.2fx the round trip\n",
           "1 caller, one key: per decision", 1e9 / one,
           rtt > 0 ? 1e9 / one / rtt : 0);
    static const int callers[] = {2, 8, 32, 64};
    double at[4] = {0}, ceil_step = 0;
    for (int r = 0; r < 3; r++) {
        for (size_t i = 0; i < 4; i++) {
            if (r > 0 && callers[i] < 32)
                continue; /* the rounds are for the comparison */
            double v = throughput(lim, callers[i], callers[i], 500, &errors);
            at[i] = v > at[i] ? v : at[i];
        }
        double v = ceilings ? redis_benchmark(host, port, par_args) : 0;
        ceil_step = v > ceil_step ? v : ceil_step;
    }
    printf("  %-40s %12s %8s\n", "concurrent callers (distinct keys)",
           "decisions/s", "x one");
    printf("  %-40d %12.0f %8.2f\n", 1, one, 1.0);
    for (size_t i = 0; i < 4; i++)
        printf("  %-40d %12.0f %8.2f\n", callers[i], at[i], at[i] / one);
    double same = throughput(lim, 8, 1, 500, &errors);
    printf("  %-40s %12.0f %8.2f\n", "8 callers on one key (CAS retries)", same,
           same / one);
    double ceil_one = ceilings ? redis_benchmark(host, port, one_args) : 0;
    if (seq > 0 && ceil_step > 0 && ceil_one > 0) {
        printf("  redis-benchmark, same server, same step script:\n");
        printf("  %-40s %12.0f   ours: %.2fx its latency\n",
               "-c 1 -P 1 (sequential)", seq, seq / one);
        printf("  %-40s %12.0f   ours at 32: %.0f%%, at 64: %.0f%%\n",
               "-c 50 -P 16 (pipelined ceiling)", ceil_step,
               100.0 * at[2] / ceil_step, 100.0 * at[3] / ceil_step);
        printf("  %-40s %12.0f   step: %.2fx of it\n",
               "-c 50 -P 16, EVALSHA of 'return 1'", ceil_one,
               ceil_step / ceil_one);
    } else {
        printf("  (redis-benchmark comparisons: TCP URLs and redis-benchmark "
               "only)\n");
    }
    rate_stats_t st;
    rate_limiter_stats(lim, &st);
    printf("  %-40s %12llu\n", "CAS retries in all", (unsigned long long)st.retries);
    if (errors)
        printf("  store errors: %llu\n", (unsigned long long)errors);
    if (ceilings)
        bench_lean(url, host, port, prefix, p, &o);
    int rc = cluster_url ? bench_cluster(lim, cluster_url, p, prefix) : 0;
    if (rc == 0)
        rc = bench_module(url, host, port, prefix, p, ceilings, one_args);
    if (rc == 0)
        rc = bench_redis_load(url, host, port, decisions, bo->peer);
    rate_store_redis_drop(store);
    rate_limiter_free(lim);
    rate_store_free(store);
    rate_policy_free(p);
    return rc;
}
