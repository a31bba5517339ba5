/* SPDX-License-Identifier: MIT */
/*
 * Helpers shared by the subcommands: policy options, stores, input files,
 * number formatting and getopt messages.
 */
#include <errno.h>
#include <pthread.h>
#include <time.h>
#include <signal.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <getopt.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "trace.h"
#ifdef RATE_WITH_REDIS
#include "ratelimit_redis.h"
#endif
#ifdef RATE_WITH_DYNAMODB
#include "ratelimit_dynamodb.h"
#endif
#include "ratelimit_shm.h"

int cli_fail(const char *fmt, ...)
{
    va_list ap;
    fflush(stdout);
    fputs("ratelimit: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    return 2;
}

int getopt_fail(const char *cmd, int c, char **argv)
{
    const char *arg = argv[optind - 1];
    if (c == ':')
        return cli_fail("%s: option '%s' needs a value", cmd, arg);
    if (optopt != 0)
        return cli_fail("%s: unknown option '-%c'", cmd, optopt);
    return cli_fail("%s: unknown option '%s'", cmd, arg);
}

/* The library's map of the algorithms (ratelimit.h): the command has no
 * list of its own. */
static const struct cli_algo {
    rate_algorithm_t algorithm;
    const char *name, *alias, *option;
} cli_algos[] = {
#define CLI_X_(id, value, name, alias, option, span, table) \
    {RATE_##id, name, alias, option},
    RATE_ALGORITHM_MAP(CLI_X_)
#undef CLI_X_
};

size_t cli_algorithm_count(void)
{
    return sizeof cli_algos / sizeof cli_algos[0];
}

rate_algorithm_t cli_algorithm(size_t i)
{
    return cli_algos[i].algorithm;
}

const char *cli_algorithm_option(rate_algorithm_t a)
{
    for (size_t i = 0; i < cli_algorithm_count(); i++)
        if (cli_algos[i].algorithm == a)
            return cli_algos[i].option;
    return "";
}

static bool is_bucket(rate_algorithm_t a)
{
    return cli_algorithm_option(a)[0] != '\0';
}

const char *cli_algorithm_names(char *buf, size_t len, bool buckets)
{
    size_t used = 0, n = 0, last = 0;

    buf[0] = '\0';
    for (size_t i = 0; i < cli_algorithm_count(); i++)
        if (!buckets || cli_algos[i].option[0] != '\0')
            last = i, n++;
    for (size_t i = 0, k = 0; i < cli_algorithm_count() && used < len; i++) {
        const struct cli_algo *a = &cli_algos[i];
        if (buckets && a->option[0] == '\0')
            continue;
        const char *sep = k == 0 ? "" : !buckets ? ", "
                          : i == last && n == 2 ? " and "
                          : i == last ? ", and " : ", ";
        used += (size_t)snprintf(buf + used, len - used, "%s%s", sep,
                                 a->name);
        if (!buckets && a->alias[0] != '\0' && used < len)
            used += (size_t)snprintf(buf + used, len - used, " (%s)",
                                     a->alias);
        k++;
    }
    return buf;
}

void cli_usage(const char *text)
{
    char names[256];
    const char *p = cli_algorithm_names(names, sizeof names, false);
    int col = 0;

    fputs(text, stdout);
    fputs("\nNAME (--algorithm; aliases in parentheses):\n ", stdout);
    col = 1;
    /* Wrapped at 78 columns, breaking after the commas. */
    while (*p != '\0') {
        const char *end = strchr(p, ',');
        size_t n = end ? (size_t)(end - p) + 1 : strlen(p);
        if (col + 1 + (int)n > 78) {
            fputs("\n ", stdout);
            col = 1;
        }
        printf(" %.*s", (int)n, p);
        col += 1 + (int)n;
        p += n;
        while (*p == ' ')
            p++;
    }
    putchar('\n');
}

/* "--opt" given where it does not belong. */
static int misplaced(const policy_opts_t *o, const char *opt, const char *alg)
{
    return cli_fail("%s: %s does not apply to %s", o->cmd, opt, alg);
}

static int count_opt(const policy_opts_t *o, const char *name, const char *v,
                     uint64_t *out)
{
    char why[160];

    if (v == NULL)
        return cli_fail("%s: %s is required for %s", o->cmd, name,
                        o->algorithm);
    if (rate_parse_count(v, out, why, sizeof why) != RATE_OK)
        return cli_fail("%s: %s %s", o->cmd, name, why);
    if (*out == 0)
        return cli_fail("%s: %s must be at least 1", o->cmd, name);
    return 0;
}

/* --max-wait DUR, 0 without it. */
static int max_wait_opt(const policy_opts_t *o, uint64_t *max_wait)
{
    char why[256];

    *max_wait = 0;
    if (o->max_wait != NULL &&
        rate_parse_duration(o->max_wait, max_wait, why, sizeof why) !=
            RATE_OK)
        return cli_fail("%s: --max-wait %s", o->cmd, why);
    return 0;
}

/* "--max-wait applies only to token-bucket and leaky-bucket" */
static int max_wait_misplaced(const policy_opts_t *o, const char *tail)
{
    char names[128];

    return cli_fail("%s: --max-wait applies only to %s%s", o->cmd,
                    cli_algorithm_names(names, sizeof names, true), tail);
}

/* The value given for a bucket's option (burst, capacity), NULL if none. */
static const char *option_value(const policy_opts_t *o, const char *option)
{
    if (strcmp(option, "burst") == 0)
        return o->burst;
    if (strcmp(option, "capacity") == 0)
        return o->capacity;
    return NULL;
}

int policy_from_text(const char *cmd, const char *text, rate_policy_t **out)
{
    char err[256] = "";
    if (rate_policy_parse(text, out, err, sizeof err) != RATE_OK)
        return cli_fail("%s: --policy '%s': %s", cmd, text,
                        err[0] ? err : "not a policy");
    return 0;
}

bool policy_has_window(const rate_policy_t *p)
{
    for (size_t i = 0; i < rate_policy_count(p); i++)
        if (!is_bucket(rate_policy_limit(p, i)->algorithm))
            return true;
    return false;
}

/* --policy TEXT: the library's text form, composites too. */
static int policy_from_policy_text(const policy_opts_t *o, rate_policy_t **out,
                                   uint64_t *max_wait)
{
    const char *other = o->algorithm ? "--algorithm" : o->rate ? "--rate"
                        : o->burst ? "--burst" : o->capacity ? "--capacity"
                        : o->limit ? "--limit" : o->window ? "--window" : NULL;
    if (other != NULL)
        return cli_fail("%s: --policy replaces --algorithm and its options; "
                        "drop %s", o->cmd, other);
    if (max_wait_opt(o, max_wait) != 0)
        return 2;
    if (policy_from_text(o->cmd, o->policy, out) != 0)
        return 2;
    if (*max_wait != 0 && policy_has_window(*out)) {
        rate_policy_free(*out);
        *out = NULL;
        return max_wait_misplaced(o, " (the policy has a window)");
    }
    return 0;
}

/* An option of another algorithm's (--burst for a leaky bucket, either
 * for a window): its message, or 0. */
static int other_options(const policy_opts_t *o, rate_algorithm_t a)
{
    const char *mine = cli_algorithm_option(a);

    for (size_t i = 0; i < cli_algorithm_count(); i++) {
        const char *opt = cli_algorithm_option(cli_algorithm(i));
        char flag[40];
        if (opt[0] == '\0' || strcmp(opt, mine) == 0 ||
            option_value(o, opt) == NULL)
            continue;
        snprintf(flag, sizeof flag, "--%s", opt);
        return misplaced(o, flag, o->algorithm);
    }
    return 0;
}

int policy_from_opts(const policy_opts_t *o, rate_policy_t **out,
                     uint64_t *max_wait)
{
    rate_limit_t l = {0};
    char err[256], names[256];

    if (o->policy != NULL)
        return policy_from_policy_text(o, out, max_wait);
    if (o->algorithm == NULL)
        return cli_fail("%s: --algorithm or --policy is required (%s)",
                        o->cmd, cli_algorithm_names(names, sizeof names,
                                                    false));
    if (rate_algorithm_parse(o->algorithm, &l.algorithm) != RATE_OK)
        return cli_fail("%s: unknown algorithm '%s' (%s)", o->cmd,
                        o->algorithm,
                        cli_algorithm_names(names, sizeof names, false));
    if (max_wait_opt(o, max_wait) != 0)
        return 2;
    if (is_bucket(l.algorithm)) {
        const char *opt = cli_algorithm_option(l.algorithm);
        char flag[40];
        if (o->limit)
            return misplaced(o, "--limit", o->algorithm);
        if (o->window)
            return misplaced(o, "--window", o->algorithm);
        if (other_options(o, l.algorithm) != 0)
            return 2;
        if (o->rate == NULL)
            return cli_fail("%s: --rate is required for %s", o->cmd,
                            o->algorithm);
        if (rate_parse_rate(o->rate, &l.limit, &l.period_ns, err,
                            sizeof err) != RATE_OK)
            return cli_fail("%s: --rate %s", o->cmd, err);
        snprintf(flag, sizeof flag, "--%s", opt);
        /* Required here (spec/cli-replay.md); the policy text's form
         * defaults it to N, which the message points at. */
        if (option_value(o, opt) == NULL)
            return cli_fail("%s: %s is required for %s (or give the policy "
                            "as --policy '%s %s', whose %s defaults to %llu)",
                            o->cmd, flag, o->algorithm, o->algorithm,
                            o->rate, opt, (unsigned long long)l.limit);
        if (count_opt(o, flag, option_value(o, opt), &l.burst))
            return 2;
    } else {
        if (o->rate)
            return misplaced(o, "--rate", o->algorithm);
        if (other_options(o, l.algorithm) != 0)
            return 2;
        if (*max_wait != 0)
            return max_wait_misplaced(o, "");
        if (count_opt(o, "--limit", o->limit, &l.limit))
            return 2;
        if (o->window == NULL)
            return cli_fail("%s: --window is required for %s", o->cmd,
                            o->algorithm);
        if (rate_parse_duration(o->window, &l.period_ns, err, sizeof err) !=
            RATE_OK)
            return cli_fail("%s: --window %s", o->cmd, err);
        if (l.period_ns == 0)
            return cli_fail("%s: --window '%s' is zero", o->cmd, o->window);
    }
    if (rate_policy_new(&l, 1, out, err, sizeof err) != RATE_OK)
        return cli_fail("%s: %s", o->cmd, err);
    return 0;
}

/* The watchdog of a scratch Redis namespace: a child process that outlives
 * the run if it must.  It waits for the run to end (the pipe's end: also
 * when the run is killed with SIGKILL); unless told that the namespace is
 * gone ('x'), it removes it, retrying for a minute while Redis does not
 * answer.  It ignores the terminal's signals (Ctrl-C reaches the whole
 * process group; the run removes its keys itself then) and holds none of
 * the run's output open. */
static bool is_dynamodb(const char *spec)
{
    return spec != NULL && strncmp(spec, "dynamodb://", 11) == 0;
}

/* The remote stores' calls the command makes, as far as this build has
 * them (RATE_WITH_REDIS, RATE_WITH_DYNAMODB): a store the build lacks is
 * refused when --store names it, so these see only stores it has. */
static int remote_open(const char *url, const char *prefix,
                       rate_store_t **st)
{
#ifdef RATE_WITH_DYNAMODB
    if (is_dynamodb(url)) {
        rate_dynamodb_options_t o = {.prefix = prefix,
                                     .prefix_len = strlen(prefix),
                                     .no_ttl = true};
        return rate_store_dynamodb_new(url, &o, st, NULL, 0);
    }
#endif
#ifdef RATE_WITH_REDIS
    if (!is_dynamodb(url)) {
        rate_redis_options_t o = {.prefix = prefix, .no_ttl = true};
        return rate_store_redis_new(url, &o, st, NULL, 0);
    }
#endif
    (void)url, (void)prefix, (void)st;
    return RATE_ENOTSUP;
}

static int remote_drop(rate_store_t *st, bool ddb)
{
#ifdef RATE_WITH_DYNAMODB
    if (ddb)
        return rate_store_dynamodb_drop(st);
#endif
#ifdef RATE_WITH_REDIS
    if (!ddb)
        return rate_store_redis_drop(st);
#endif
    (void)st, (void)ddb;
    return RATE_ENOTSUP;
}

static int remote_touch(rate_store_t *st)
{
#ifdef RATE_WITH_REDIS
    return rate_store_redis_touch(st, CLI_SAFETY_TTL_NS);
#else
    (void)st;
    return RATE_ENOTSUP;
#endif
}

static int watchdog_fd = -1;
static pid_t watchdog_pid = -1;

static void watchdog(int rfd, const char *url, const char *prefix)
{
    signal(SIGINT, SIG_IGN);
    signal(SIGTERM, SIG_IGN);
    signal(SIGHUP, SIG_IGN);
    signal(SIGPIPE, SIG_IGN);
    int null = open("/dev/null", O_RDWR);
    for (int fd = 0; fd < 3; fd++)
        dup2(null, fd);
    char c = 0;
    ssize_t n;
    do
        n = read(rfd, &c, 1);
    while (n < 0 && errno == EINTR);
    if (n == 1 && c == 'x')
        _exit(0);
    bool ddb = is_dynamodb(url);
    for (int tries = 0; tries < 60; tries++) {
        rate_store_t *st = NULL;
        if (remote_open(url, prefix, &st) == RATE_OK &&
            remote_drop(st, ddb) == RATE_OK) {
            rate_store_free(st);
            _exit(0);
        }
        rate_store_free(st);
        sleep(1);
    }
    _exit(1);
}

/* (Used by the remote stores only: unused in a build with neither.) */
static __attribute__((unused)) int start_watchdog(const char *cmd,
                                                  const char *url,
                                                  const char *prefix)
{
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0)
        return cli_fail("%s: cannot make a pipe: %s", cmd, strerror(errno));
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        close(p[0]);
        close(p[1]);
        return cli_fail("%s: cannot fork: %s", cmd, strerror(errno));
    }
    if (pid == 0) {
        close(p[1]);
        watchdog(p[0], url, prefix);
    }
    close(p[0]);
    watchdog_fd = p[1];
    watchdog_pid = pid;
    return 0;
}

/* Tells the watchdog the namespace is gone (ok: it exits at once, and is
 * waited for, leaving no zombie) or leaves the removal to it. */
static void stop_watchdog(bool ok)
{
    if (watchdog_fd < 0)
        return;
    bool told = false;
    if (ok)
        told = write(watchdog_fd, "x", 1) == 1;
    close(watchdog_fd);
    watchdog_fd = -1;
    if (told)
        while (waitpid(watchdog_pid, NULL, 0) < 0 && errno == EINTR)
            ;
    watchdog_pid = -1;
}

/* The keeper of a scratch namespace's safety expiry: a thread that sets
 * the expiry of every key in it back to CLI_SAFETY_TTL_NS every third of
 * that (rate_store_redis_touch), whatever the run is doing (deciding, or
 * waiting for its input), so that keys the trace left idle keep theirs;
 * a failed refresh is tried again a second later (the run's own requests
 * report Redis's failures).  It takes no signals: SIGINT and SIGTERM go to
 * the main thread, whose blocked read they interrupt. */
static struct {
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    bool running, stop;
    rate_store_t *store;
} keeper = {.lock = PTHREAD_MUTEX_INITIALIZER};

static void *keeper_main(void *arg)
{
    (void)arg;
    uint64_t period = CLI_SAFETY_TTL_NS / 3;
    pthread_mutex_lock(&keeper.lock);
    while (!keeper.stop) {
        struct timespec until;
        clock_gettime(CLOCK_MONOTONIC, &until);
        until.tv_sec += (time_t)(period / RATE_NS_PER_S);
        until.tv_nsec += (long)(period % RATE_NS_PER_S);
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
        int w = 0;
        while (!keeper.stop && w != ETIMEDOUT)
            w = pthread_cond_timedwait(&keeper.cond, &keeper.lock, &until);
        if (keeper.stop)
            break;
        pthread_mutex_unlock(&keeper.lock);
        int rc = remote_touch(keeper.store);
        pthread_mutex_lock(&keeper.lock);
        period = rc == RATE_OK ? CLI_SAFETY_TTL_NS / 3 : RATE_NS_PER_S;
    }
    pthread_mutex_unlock(&keeper.lock);
    return NULL;
}

static int start_keeper(const char *cmd, rate_store_t *store)
{
    pthread_condattr_t ca;
    sigset_t block, old;
    int rc;

    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    rc = pthread_cond_init(&keeper.cond, &ca);
    pthread_condattr_destroy(&ca);
    if (rc != 0)
        return cli_fail("%s: cannot start a thread: %s", cmd, strerror(rc));
    keeper.store = store;
    keeper.stop = false;
    sigemptyset(&block);
    sigaddset(&block, SIGINT);
    sigaddset(&block, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &block, &old); /* the thread inherits it */
    rc = pthread_create(&keeper.thread, NULL, keeper_main, NULL);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        pthread_cond_destroy(&keeper.cond);
        return cli_fail("%s: cannot start a thread: %s", cmd, strerror(rc));
    }
    keeper.running = true;
    return 0;
}

static void stop_keeper(void)
{
    if (!keeper.running)
        return;
    pthread_mutex_lock(&keeper.lock);
    keeper.stop = true;
    pthread_cond_signal(&keeper.cond);
    pthread_mutex_unlock(&keeper.lock);
    pthread_join(keeper.thread, NULL);
    pthread_cond_destroy(&keeper.cond);
    keeper.running = false;
    keeper.store = NULL;
}

void cli_limiter_touch(cli_limiter_t *cl)
{
    if (cl->scratch && !cl->dynamodb && cl->store != NULL)
        (void)remote_touch(cl->store);
}

volatile sig_atomic_t cli_signal;

static void on_signal(int sig)
{
    cli_signal = sig;
}

void cli_catch_signals(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal; /* no SA_RESTART: a blocked read returns */
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
}

#ifdef RATE_WITH_DYNAMODB
/* --store dynamodb://TABLE?region=...: the table created if missing; a
 * scratch run in a namespace (key prefix) of its own, its items written
 * without expiry (the trace's clock is not the wall clock), removed at
 * the close or by the watchdog. */
static int dynamodb_from_opt(const char *cmd, const char *spec, bool scratch,
                             rate_store_t **out)
{
    rate_dynamodb_options_t o = {.create_table = true};
    char prefix[96], err[768];
    o.request_timeout_ns = cli_store_timeout_ns; /* 0: the store's own */
    o.connect_timeout_ns = cli_store_timeout_ns;
    if (scratch) {
        snprintf(prefix, sizeof prefix, "ratelimit:%s:%ld:%llu:", cmd,
                 (long)getpid(),
                 (unsigned long long)rate_clock_monotonic_ns());
        o.prefix = prefix;
        o.prefix_len = strlen(prefix);
        o.no_ttl = true;
        /* For a run killed together with its watchdog: DynamoDB's TTL
         * deletes its items once a week has passed (no refresh needed:
         * the reading ignores it). */
        o.safety_ttl_ns = CLI_DYNAMODB_SAFETY_TTL_NS;
        if (start_watchdog(cmd, spec, prefix) != 0)
            return 2;
    }
    if (rate_store_dynamodb_new(spec, &o, out, err, sizeof err) != RATE_OK) {
        stop_watchdog(true); /* nothing was written */
        return cli_fail("%s: --store: %s", cmd, err);
    }
    return 0;
}
#endif

int store_from_opt(const char *cmd, const char *spec, bool scratch,
                   uint64_t max_keys, rate_store_t **out)
{
    *out = NULL;
    if (spec == NULL || strcmp(spec, "memory") == 0) {
        /* One shard with a bound: the bound is then exact, and evicts the
         * least recently used keys (a replay runs on one thread). */
        rate_memory_options_t mo = {.max_keys = (size_t)max_keys,
                                    .shards = max_keys ? 1 : 0};
        if (rate_store_memory_new(&mo, out) != RATE_OK)
            return cli_fail("%s: cannot make the memory store", cmd);
        return 0;
    }
    if (max_keys != 0)
        return cli_fail("%s: --max-keys bounds the memory store and a "
                        "shared-memory region the command creates only", cmd);
    if (strncmp(spec, "unix://", 7) == 0) {
        /* Say plainly what is wrong with the socket's path. */
        const char *path = spec + 7;
        struct stat st;
        if (*path != '/')
            return cli_fail("%s: --store '%s': a unix:// URL needs an "
                            "absolute path (unix:///run/redis.sock)", cmd,
                            spec);
        if (stat(path, &st) != 0)
            return cli_fail("%s: --store '%s': %s: %s", cmd, spec, path,
                            strerror(errno));
        if (!S_ISSOCK(st.st_mode))
            return cli_fail("%s: --store '%s': %s is not a socket", cmd,
                            spec, path);
    }
    if (is_dynamodb(spec))
#ifdef RATE_WITH_DYNAMODB
        return dynamodb_from_opt(cmd, spec, scratch, out);
#else
        return cli_fail("%s: --store '%s': this build has no DynamoDB store "
                        "(it was built with RATE_WITH_DYNAMODB=OFF)", cmd,
                        spec);
#endif
    /* rediss:// goes on to the library, which says why it is refused. */
    if (strncmp(spec, "redis://", 8) != 0 &&
        strncmp(spec, "rediss://", 9) != 0 &&
        strncmp(spec, "unix://", 7) != 0)
        return cli_fail("%s: --store '%s' is neither 'memory', shm:PATH, "
                        "nor a redis://, unix:// or dynamodb:// URL", cmd,
                        spec);
#ifndef RATE_WITH_REDIS
    (void)scratch;
    return cli_fail("%s: --store '%s': this build has no Redis store (it "
                    "was built with RATE_WITH_REDIS=OFF)", cmd, spec);
#else
    rate_redis_options_t o = {0};
    char prefix[96], err[256];
    o.command_timeout_ns = cli_store_timeout_ns; /* 0: the store's 1 s */
    o.connect_timeout_ns = cli_store_timeout_ns;
    if (scratch) {
        /* A namespace of this run's own, dropped at the end; its keys do
         * not expire by the trace's resets (the trace's clock is not
         * Redis's) but by a safety expiry, refreshed while the run lasts
         * (see the keeper), for a run killed with its watchdog. */
        snprintf(prefix, sizeof prefix, "ratelimit:%s:%ld:%llu:", cmd,
                 (long)getpid(),
                 (unsigned long long)rate_clock_monotonic_ns());
        o.prefix = prefix;
        o.no_ttl = true;
        o.safety_ttl_ns = CLI_SAFETY_TTL_NS;
        if (start_watchdog(cmd, spec, prefix) != 0)
            return 2;
    }
    if (rate_store_redis_new(spec, &o, out, err, sizeof err) != RATE_OK) {
        stop_watchdog(true); /* nothing was written */
        return cli_fail("%s: --store: %s", cmd, err);
    }
    return 0;
#endif
}

/* The capacity of a region a replay creates without --max-keys: room for
 * the trace's distinct keys twice over (a second run of the same size in
 * its namespace fits too) and 256 more; for a trace that cannot be read
 * ahead (a pipe: trace_keys CLI_TRACE_KEYS_UNKNOWN), CLI_SHM_KEYS, halved
 * while the region would pass CLI_SHM_BUDGET bytes (a policy of long
 * states), down to 1024 keys. */
static uint64_t shm_new_keys(const rate_shm_options_t *so, uint64_t trace_keys)
{
    if (trace_keys != CLI_TRACE_KEYS_UNKNOWN) {
        uint64_t keys = trace_keys * 2 + 256;
        return keys > INT32_MAX ? INT32_MAX : keys;
    }
    rate_shm_options_t o = *so;
    o.max_keys = CLI_SHM_KEYS;
    while (o.max_keys > 1024 && rate_store_shm_size(&o) > CLI_SHM_BUDGET)
        o.max_keys /= 2;
    return o.max_keys;
}

/* Whether PATH names a file now (for a retry after a race). */
static bool path_exists(const char *path)
{
    return access(path, F_OK) == 0;
}

/* A shm_attached() error already printed. */
#define SHM_REPORTED (-1000)

/* After cl->store attached to or created the region at path: checks that
 * it keeps the policy's states, and for a replay (scratch) notes a region
 * it created, or reopens one that existed in a namespace of the run's own.
 * RATE_OK; SHM_REPORTED after printing why; or the reopening's error in
 * err (the file removed meanwhile, say). */
static int shm_attached(cli_limiter_t *cl, const char *cmd, const char *path,
                        bool scratch, size_t need, char *err, size_t errlen)
{
    rate_shm_info_t info;
    char prefix[96];

    if (rate_store_shm_info(cl->store, &info) != RATE_OK) {
        cli_fail("%s: --store shm:%s: cannot read the region", cmd, path);
        return SHM_REPORTED;
    }
    if (need > info.state_max) {
        cli_fail("%s: --store shm:%s: the policy's states take up to %zu "
                 "bytes, the region keeps at most %u (its state_max): it was "
                 "made for other policies (by another process or run); use "
                 "another PATH, or remove %s once no process uses it", cmd,
                 path, need, info.state_max, path);
        return SHM_REPORTED;
    }
    cl->shm_evictions0 = info.evictions;
    if (!scratch)
        return RATE_OK;
    if (info.created) {
        if ((cl->shm_unlink = strdup(path)) == NULL) {
            cli_fail("%s: out of memory", cmd);
            return SHM_REPORTED;
        }
        cl->shm_keys = info.max_keys;
        cl->shm_bytes = info.bytes;
        return RATE_OK;
    }
    /* A namespace of the run's own in a region others may use. */
    snprintf(prefix, sizeof prefix, "%s:%ld:%llu:", cmd, (long)getpid(),
             (unsigned long long)rate_clock_monotonic_ns());
    if (strlen(prefix) + 4 > info.key_max) {
        cli_fail("%s: --store shm:%s: its key_max leaves no room for a "
                 "namespace", cmd, path);
        return SHM_REPORTED;
    }
    rate_shm_options_t ns = {.no_create = true, .prefix = prefix};
    rate_store_t *mine = NULL;
    int rc = rate_store_shm_new(path, &ns, &mine, err, errlen);
    if (rc != RATE_OK)
        return rc;
    rate_store_free(cl->store);
    cl->store = mine;
    cl->shm_scratch = true;
    cl->shm_prefix_len = strlen(prefix);
    /* The evictions counted from here: the namespace's region may be
     * another file than the first attach's, if the file was replaced. */
    if (rate_store_shm_info(cl->store, &info) == RATE_OK)
        cl->shm_evictions0 = info.evictions;
    return RATE_OK;
}

/* --store shm:PATH.  A region PATH names is attached to; one that is
 * absent is created, with max_keys keys (without --max-keys: CLI_SHM_KEYS
 * for check, shm_new_keys() of trace_keys for a replay) and room for the
 * policy's states.  scratch (a replay): a region the run created is
 * removed at the end (cl->shm_unlink); in one that existed the run works
 * in a namespace of its own, dropped at the end (cl->shm_scratch).
 * Another run may create or remove the file at PATH meanwhile (two
 * replays at once): a create that finds the file made, or an attach that
 * finds it gone, starts again, a bounded number of times. */
static int shm_from_opt(cli_limiter_t *cl, const char *cmd, const char *path,
                        bool scratch, uint64_t max_keys, uint64_t trace_keys)
{
    char err[320];
    size_t need = rate_store_shm_state_size(cl->policy);
    rate_shm_options_t so = {.key_max = CLI_SHM_KEY_MAX,
                             .state_max = need > 96 ? (uint32_t)need : 0,
                             .mode = 0600};

    if (*path == '\0')
        return cli_fail("%s: --store shm:PATH needs a PATH (shm:/dev/shm/"
                        "NAME)", cmd);
    if (need > 262144)
        return cli_fail("%s: --store '%s': the policy's states take up to "
                        "%zu bytes, more than a region keeps (262144)", cmd,
                        path, need);
    so.max_keys = max_keys      ? max_keys
                  : scratch     ? shm_new_keys(&so, trace_keys)
                                : CLI_SHM_KEYS;
    int rc = RATE_ESTORE;
    for (int attempt = 0; attempt < 20 && cli_signal == 0; attempt++) {
        bool existed = path_exists(path), attach_only = false;
        rc = rate_store_shm_new(path, &so, &cl->store, err, sizeof err);
        if (rc == RATE_EINVAL && path_exists(path)) {
            /* An existing region of other sizes: attach to it as it is
             * (of the capacity --max-keys asks, if given). */
            rate_shm_options_t as = {.no_create = true,
                                     .max_keys = max_keys};
            attach_only = true;
            rc = rate_store_shm_new(path, &as, &cl->store, err, sizeof err);
        }
        if (rc == RATE_OK) {
            attach_only = true; /* the namespace's reopening */
            rc = shm_attached(cl, cmd, path, scratch, need, err, sizeof err);
        }
        if (rc == RATE_OK || rc == SHM_REPORTED)
            break;
        rate_store_free(cl->store);
        cl->store = NULL;
        /* Made or removed by another run meanwhile (an attach that found
         * no file, a create that found one, a region of other sizes gone
         * before it could be attached to, or made and removed again while
         * this attempt looked at it): try again.  (Options refused with no
         * region there are refused again, at once, each time.) */
        bool there = path_exists(path), moved = existed != there;
        if ((rc == RATE_ESTORE && (attach_only || moved)) ||
            (rc == RATE_EINVAL && (moved || !there)))
            continue;
        break;
    }
    if (rc == SHM_REPORTED)
        return 2;
    /* Else the first error: why the region could not be made (no room,
     * too big) or read. */
    if (rc != RATE_OK)
        return cli_fail("%s: --store shm:%s", cmd, err);
    return 0;
}

int cli_max_keys(const char *cmd, const char *text, const char *store_spec,
                 uint64_t *out)
{
    bool shm = store_spec != NULL && strncmp(store_spec, "shm:", 4) == 0;
    uint64_t most = shm ? INT32_MAX : UINT32_MAX;

    if (rate_parse_count(text, out, NULL, 0) != RATE_OK || *out == 0 ||
        *out > most)
        return cli_fail("%s: --max-keys '%s' is not a whole number from 1 "
                        "to %llu%s", cmd, text, (unsigned long long)most,
                        shm ? " (a shm:PATH region's bound)" : "");
    return 0;
}

uint64_t cli_store_timeout_ns;

int cli_store_timeout(const char *cmd, const char *text,
                      const char *store_spec)
{
    char why[256];
    uint64_t ns;

    if (rate_parse_duration(text, &ns, why, sizeof why) != RATE_OK)
        return cli_fail("%s: --store-timeout %s", cmd, why);
    if (ns == 0)
        return cli_fail("%s: --store-timeout '%s': must be more than 0", cmd,
                        text);
    if (store_spec == NULL || strcmp(store_spec, "memory") == 0 ||
        strncmp(store_spec, "shm:", 4) == 0)
        return cli_fail("%s: --store-timeout applies to a redis://, "
                        "unix:// or dynamodb:// store only", cmd);
    cli_store_timeout_ns = ns;
    return 0;
}

const char *cli_store_error(cli_limiter_t *cl, int rc, const char *key,
                            size_t key_len)
{
    rate_shm_info_t info;

    (void)key; /* named by the Redis store's messages alone */
    (void)key_len;
#ifdef RATE_WITH_DYNAMODB
    if (cl->store != NULL && cl->dynamodb) {
        /* The service's own words, after the error's. */
        int n = snprintf(cl->why, sizeof cl->why, "%s: ", rate_strerror(rc));
        if (n > 0 && (size_t)n < sizeof cl->why &&
            rate_store_dynamodb_last_error(cl->store, cl->why + n,
                                           sizeof cl->why - (size_t)n) > 0)
            return cl->why;
        return rate_strerror(rc);
    }
#endif
    if (cl->store == NULL)
        return rate_strerror(rc);
#ifdef RATE_WITH_REDIS
    char last[256] = "";
    if (rate_store_redis_last_error(cl->store, last, sizeof last) == RATE_OK) {
        /* A Redis store: the key, and which of the two RATE_ECORRUPT
         * means (the reply WRONGTYPE is kept as the last error); else
         * the store's reason after the error's. */
        int kl = key_len > 64 ? 64 : (int)key_len;
        if (rc == RATE_ECORRUPT && strstr(last, "WRONGTYPE") != NULL)
            snprintf(cl->why, sizeof cl->why,
                     "key '%.*s': the Redis key of its state is not a "
                     "hash but another type (%.150s); it was left as it is",
                     kl, key, last);
        else if (rc == RATE_ECORRUPT)
            snprintf(cl->why, sizeof cl->why,
                     "key '%.*s': its state in Redis is a hash whose bytes "
                     "are not a valid state for this library (damaged, or "
                     "another program's); delete the key to start again",
                     kl, key);
        else if (last[0] != '\0')
            snprintf(cl->why, sizeof cl->why, "%.60s: %.250s",
                     rate_strerror(rc), last);
        else
            return rate_strerror(rc);
        return cl->why;
    }
#endif
    int irc = rate_store_shm_info(cl->store, &info);
    if (rc == RATE_ECORRUPT && irc != RATE_EINVAL) {
        /* A damaged region: what its check finds, if anything (else the
         * key's state bytes themselves do not parse). */
        char what[200] = "";
        if (rate_store_shm_check(cl->store, what, sizeof what) != RATE_OK &&
            what[0] != '\0')
            snprintf(cl->why, sizeof cl->why,
                     "the shared-memory region is damaged (%s); remove it "
                     "to start again", what);
        else
            snprintf(cl->why, sizeof cl->why,
                     "the shared-memory region is damaged (the key's state "
                     "does not parse); remove it to start again");
        return cl->why;
    }
    if (irc != RATE_OK)
        return rate_strerror(rc);
    if (rc == RATE_EKEY && cl->shm_prefix_len != 0) {
        snprintf(cl->why, sizeof cl->why,
                 "the key's %zu bytes and the run's namespace's %zu are "
                 "longer than the shared-memory region's key_max (%u "
                 "bytes)", key_len, cl->shm_prefix_len, info.key_max);
        return cl->why;
    }
    if (rc == RATE_EKEY) {
        snprintf(cl->why, sizeof cl->why,
                 "the key's %zu bytes are longer than the shared-memory "
                 "region's key_max (%u bytes)", key_len, info.key_max);
        return cl->why;
    }
    if (rc == RATE_EFULL)
        return "the shared-memory region has no room: a state longer than "
               "its state_max, or its policy records are all taken";
    if (rc == RATE_ETIMEDOUT)
        return "a shard of the shared-memory region stayed locked by a "
               "live process for longer than the lock timeout";
    return rate_strerror(rc);
}

int cli_limiter_open(cli_limiter_t *cl, const policy_opts_t *o,
                     const char *store_spec, bool scratch, uint64_t max_keys,
                     uint64_t trace_keys)
{
    memset(cl, 0, sizeof *cl);
    if (policy_from_opts(o, &cl->policy, &cl->max_wait_ns) != 0)
        return 2;
    if (store_spec != NULL && strncmp(store_spec, "shm:", 4) == 0) {
        if (shm_from_opt(cl, o->cmd, store_spec + 4, scratch, max_keys,
                         trace_keys) != 0) {
            cli_limiter_close(cl);
            return 2;
        }
    } else if (store_from_opt(o->cmd, store_spec, scratch, max_keys,
                              &cl->store) != 0) {
        cli_limiter_close(cl);
        return 2;
    }
    cl->cmd = o->cmd;
    cl->scratch = scratch && store_spec != NULL &&
                  strcmp(store_spec, "memory") != 0 &&
                  strncmp(store_spec, "shm:", 4) != 0;
    cl->dynamodb = is_dynamodb(store_spec);
    char why[512] = "";
    if (rate_store_check_policy(cl->store, cl->policy, why, sizeof why) !=
        RATE_OK) {
        cli_limiter_close(cl);
        return cli_fail("%s: --store '%s' cannot keep this policy: %s",
                        o->cmd, store_spec, why);
    }
    rate_limiter_config_t cfg = {.policy = cl->policy, .store = cl->store};
    if (rate_limiter_new(&cfg, &cl->lim) != RATE_OK) {
        cli_limiter_close(cl);
        return cli_fail("%s: cannot make the limiter", o->cmd);
    }
    /* The keeper refreshes Redis expiries; DynamoDB scratch items carry
     * none. */
    if (cl->scratch && !cl->dynamodb && start_keeper(o->cmd, cl->store) != 0) {
        cli_limiter_close(cl);
        return 2;
    }
    return 0;
}

int cli_limiter_close(cli_limiter_t *cl)
{
    int rc = 0;
    stop_keeper(); /* no refresh once the removal starts */
    if (cl->scratch && cl->store != NULL) {
        rc = remote_drop(cl->store, cl->dynamodb);
        stop_watchdog(rc == RATE_OK);
    }
    if (cl->shm_scratch && cl->store != NULL)
        rc = rate_store_shm_drop(cl->store);
    rate_limiter_free(cl->lim);
    rate_store_free(cl->store);
    if (cl->shm_unlink != NULL && unlink(cl->shm_unlink) != 0 &&
        errno != ENOENT)
        rc = RATE_ESTORE;
    free(cl->shm_unlink);
    rate_policy_free(cl->policy);
    memset(cl, 0, sizeof *cl);
    return rc;
}

bool policy_opt(policy_opts_t *o, int c, const char *arg)
{
    switch (c) {
    case O_ALGO: o->algorithm = arg; return true;
    case O_RATE: o->rate = arg; return true;
    case O_BURST: o->burst = arg; return true;
    case O_CAPACITY: o->capacity = arg; return true;
    case O_LIMIT: o->limit = arg; return true;
    case O_WINDOW: o->window = arg; return true;
    case O_MAXWAIT: o->max_wait = arg; return true;
    case O_POLICY: o->policy = arg; return true;
    default: return false;
    }
}

#define READER_BUF (2 * READER_MAX_LINE + 2)

int reader_open(reader_t *r, const char *cmd, const char *input,
                const char *key_field, const char *time_field,
                const char *path)
{
    memset(r, 0, sizeof *r);
    r->cmd = cmd;
    r->fd = -1;
    r->time_field = -1;
    r->res_ns = RATE_NS_PER_S;
    r->clf = strcmp(input, "clf") == 0;
    r->json = strcmp(input, "json") == 0;
    if (!r->clf && !r->json && strcmp(input, "trace") != 0)
        return cli_fail("%s: --input '%s' is not 'trace', 'clf' or 'json'",
                        cmd, input);
    if (r->json) {
        r->json_key = key_field ? key_field : "remote_addr";
        r->json_time = time_field ? time_field : "time";
        if (r->json_key[0] == '\0' || r->json_time[0] == '\0')
            return cli_fail("%s: --%s-field is empty (the name of a JSON "
                            "member)", cmd, r->json_key[0] ? "time" : "key");
    } else if (!r->clf && (key_field != NULL || time_field != NULL)) {
        return cli_fail("%s: --%s-field applies to --input clf or json (a "
                        "trace line is TIME KEY [PERMITS])", cmd,
                        key_field ? "key" : "time");
    } else if (r->clf) {
        if (key_field == NULL)
            key_field = "host";
        r->field = clf_field_from_name(key_field);
        if (r->field < 0)
            return cli_fail("%s: --key-field '%s' is not one of host, ident, "
                            "user, request, method, path, status, referer, "
                            "agent, xff, or a field number from 1 to %d", cmd,
                            key_field, CLF_MAX_FIELDS);
        if (time_field != NULL) {
            int tf = clf_field_from_name(time_field);
            if (tf < CLF_FIELD_1)
                return cli_fail("%s: --time-field '%s' is not a field number "
                                "from 1 to %d (the field holding, e.g., "
                                "nginx's $msec)", cmd, time_field,
                                CLF_MAX_FIELDS);
            r->time_field = tf - CLF_FIELD_1;
        }
    }
    r->buf = malloc(READER_BUF);
    if (r->buf == NULL)
        return cli_fail("%s: out of memory", cmd);
    if (path == NULL || strcmp(path, "-") == 0) {
        r->fd = 0;
        r->name = "standard input";
        return 0;
    }
    r->name = path;
    r->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (r->fd < 0)
        return cli_fail("%s: cannot read '%s': %s", cmd, path,
                        strerror(errno));
    struct stat st;
    if (fstat(r->fd, &st) == 0 && S_ISDIR(st.st_mode))
        return cli_fail("%s: '%s' is a directory, not a trace or log file",
                        cmd, path);
    return 0;
}

/* The next line of input, without its newline, in *line and *len: 1; 0 at
 * the end; -1 for a read error (errno set); -2 for a line longer than
 * READER_MAX_LINE (its number counted; the rest of it is read past, in
 * constant memory, only when skipped: `skip`). */
static int next_line(reader_t *r, bool skip, char **line, size_t *len)
{
    size_t scanned = 0;
    bool toolong = false;
    for (;;) {
        char *nl = memchr(r->buf + r->start + scanned, '\n',
                          r->end - r->start - scanned);
        if (nl != NULL) {
            *line = r->buf + r->start;
            *len = (size_t)(nl - *line);
            r->start += *len + 1;
            r->lineno++;
            if (toolong || *len > READER_MAX_LINE)
                return -2;
            return 1;
        }
        scanned = r->end - r->start;
        if (scanned > READER_MAX_LINE) {
            if (!toolong && !skip) {
                r->lineno++;
                return -2;
            }
            /* Read past the rest of the line, keeping nothing of it. */
            toolong = true;
            r->start = r->end = 0;
            scanned = 0;
        }
        if (r->eof) {
            if (r->end == r->start && !toolong)
                return 0;
            *line = r->buf + r->start;
            *len = r->end - r->start;
            r->start = r->end;
            r->lineno++;
            return toolong ? -2 : 1;
        }
        if (r->start > 0) {
            memmove(r->buf, r->buf + r->start, r->end - r->start);
            r->end -= r->start;
            r->start = 0;
        }
        ssize_t n = read(r->fd, r->buf + r->end, READER_BUF - r->end);
        if (n < 0 && errno == EINTR && cli_signal != 0)
            return -3;
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -1;
        if (n == 0)
            r->eof = true;
        r->end += (size_t)n;
    }
}

static const char *input_hint(const char *line, size_t len, const char *err);
static void note_time(reader_t *r, uint64_t t);

int reader_next(reader_t *r, trace_req_t *req)
{
    char *line;
    size_t len;
    int got;

    while ((got = next_line(r, r->skip_bad, &line, &len)) != 0) {
        const char *err = NULL;
        int rc;
        if (got == -3 || cli_signal != 0)
            return 3;
        if (got == -1)
            return cli_fail("%s: cannot read '%s' after line %llu: %s",
                            r->cmd, r->name, (unsigned long long)r->lineno,
                            strerror(errno));
        if (got == -2) {
            static char msg[64];
            snprintf(msg, sizeof msg, "longer than the maximum of %d bytes",
                     READER_MAX_LINE);
            rc = TRACE_ERR;
            err = msg;
        } else if (r->clf) {
            rc = clf_parse_line_at(line, len, (clf_field_t)r->field,
                                   r->time_field, req, &err);
        } else if (r->json) {
            rc = json_parse_line(line, len, r->json_key, r->json_time, req,
                                 &err);
        } else {
            rc = trace_parse_line(line, len, req, &err);
            if (rc == TRACE_ERR)
                err = input_hint(line, len, err);
        }
        if (rc == TRACE_SKIP)
            continue;
        if (rc == TRACE_REQ && req->key_len > RATE_KEY_MAX) {
            rc = TRACE_ERR;
            err = "KEY longer than 512 bytes";
        } else if (rc == TRACE_REQ && req->key_len >= RATE_KEY_RESERVED_LEN &&
                   memcmp(req->key, RATE_KEY_RESERVED,
                          RATE_KEY_RESERVED_LEN) == 0) {
            rc = TRACE_ERR; /* else the library's RATE_EKEY, said vaguely */
            err = "KEY begins with the library's reserved bytes "
                  "\\xffLEASE\\x01\\0 (a key's in-flight leases)";
        }
        if (rc == TRACE_ERR && r->skip_bad) {
            if (r->nbad < sizeof r->first_bad / sizeof r->first_bad[0])
                r->first_bad[r->nbad] = r->lineno;
            r->nbad++;
            continue;
        }
        if (rc == TRACE_ERR)
            return cli_fail("%s: line %llu: %s", r->cmd,
                            (unsigned long long)r->lineno, err);
        note_time(r, req->t_ns);
        return 1;
    }
    return 0;
}

/* A trace line's error, with a hint when the line is an access log's or
 * JSON (read without --input clf or json). */
static const char *input_hint(const char *line, size_t len, const char *err)
{
    static char msg[200];
    size_t i = 0;
    while (i < len && (line[i] == ' ' || line[i] == '\t'))
        i++;
    const char *input = NULL;
    if (i < len && line[i] == '{')
        input = "json";
    else if (memchr(line, '[', len) != NULL && memchr(line, '"', len) != NULL)
        input = "clf";
    if (input == NULL)
        return err;
    snprintf(msg, sizeof msg, "%s; the line looks like %s: read it with "
             "--input %s", err, input[0] == 'j' ? "JSON" : "an access log "
             "(Common or Combined Log Format)", input);
    return msg;
}

/* Notes what the times are like: their resolution, shared instants, lines
 * that go back in time. */
static void note_time(reader_t *r, uint64_t t)
{
    while (r->res_ns > 1 && t % r->res_ns != 0)
        r->res_ns /= 10;
    if (r->nreq > 0 && t < r->t_max) {
        if (r->nearlier++ == 0)
            r->first_earlier = r->lineno;
        if (r->t_max - t > r->most_back_ns)
            r->most_back_ns = r->t_max - t;
    } else if (r->nreq > 0 && t == r->t_max) {
        r->same_instant++;
    }
    if (r->nreq == 0 || t > r->t_max)
        r->t_max = t;
    r->nreq++;
}

/* A duration in words: "1 s", "100 ms", "2.5 us". */
static const char *words(char *buf, size_t len, uint64_t ns)
{
    if (ns >= RATE_NS_PER_S)
        snprintf(buf, len, "%g s", (double)ns / 1e9);
    else if (ns >= 1000000)
        snprintf(buf, len, "%g ms", (double)ns / 1e6);
    else if (ns >= 1000)
        snprintf(buf, len, "%g us", (double)ns / 1e3);
    else
        snprintf(buf, len, "%llu ns", (unsigned long long)ns);
    return buf;
}

/* The first limit of the policies whose resolution the input's times are
 * coarser than, while some requests shared an instant (that matters only
 * where some did); its policy's index into *pi.  NULL: none. */
static const rate_limit_t *coarse_limit(const reader_t *r,
                                        const rate_policy_t *const *policies,
                                        size_t npolicies, size_t *pi)
{
    if (r->same_instant == 0 || r->nreq < 2)
        return NULL;
    for (size_t p = 0; p < npolicies; p++)
        for (size_t i = 0; i < rate_policy_count(policies[p]); i++) {
            const rate_limit_t *l = rate_policy_limit(policies[p], i);
            uint64_t need = is_bucket(l->algorithm) ? l->period_ns / l->limit
                                                    : l->period_ns;
            if (r->res_ns > need) {
                *pi = p;
                return l;
            }
        }
    return NULL;
}

void reader_warn_time(const reader_t *r, const rate_policy_t *const *policies,
                      size_t npolicies)
{
    char a[32], b[32], text[200];
    size_t p;
    if (r->nearlier > 0)
        fprintf(stderr, "%s: warning: %llu request%s earlier than a line "
                "before %s (first at line %llu, at most %s back); a key's "
                "clock never runs backwards, so such a request is decided "
                "at the latest time its key has seen: sort the input by "
                "time for answers at the times written\n", r->cmd,
                (unsigned long long)r->nearlier, r->nearlier == 1 ? " is"
                : "s are", r->nearlier == 1 ? "it" : "them",
                (unsigned long long)r->first_earlier,
                words(a, sizeof a, r->most_back_ns));
    const rate_limit_t *l = coarse_limit(r, policies, npolicies, &p);
    if (l == NULL)
        return;
    bool bucket = is_bucket(l->algorithm);
    uint64_t need = bucket ? l->period_ns / l->limit : l->period_ns;
    rate_policy_format(policies[p], text, sizeof text);
    fprintf(stderr, "%s: warning: the input's times are %s%s, "
            "coarser than '%s' resolves (%s%s), and %llu requests "
            "shared an instant with the one before: the requests of "
            "one step are replayed at one instant, which changes what a "
            "policy admits, either way: a token bucket admits at most its "
            "burst of them, a leaky bucket about one, a fixed window at "
            "most its limit, and a sliding window about half its rate "
            "(each step finds only the room the step before left).  Give "
            "finer times (nginx's $msec: --input clf --time-field N; JSON "
            "lines: --input json)\n", r->cmd,
            r->res_ns == RATE_NS_PER_S ? "whole seconds" : "in steps of ",
            r->res_ns == RATE_NS_PER_S ? "" : words(a, sizeof a, r->res_ns),
            text, bucket ? "a permit every " : "a window of ",
            words(b, sizeof b, need), (unsigned long long)r->same_instant);
}

bool reader_coarse_note(const reader_t *r, const rate_policy_t *const *policies,
                        size_t npolicies, char *buf, size_t len)
{
    size_t p;
    char a[32];
    if (coarse_limit(r, policies, npolicies, &p) == NULL)
        return false;
    snprintf(buf, len, "Warning: the input's times are %s%s, coarser than "
             "the policies resolve: each step's requests were replayed at "
             "one instant, so what is admitted differs from real, "
             "spread-out traffic.",
             r->res_ns == RATE_NS_PER_S ? "whole seconds" : "in steps of ",
             r->res_ns == RATE_NS_PER_S ? "" : words(a, sizeof a, r->res_ns));
    return true;
}

void reader_report(const reader_t *r)
{
    size_t shown = sizeof r->first_bad / sizeof r->first_bad[0];
    if (r->nbad == 0)
        return;
    fprintf(stderr, "%s: skipped %llu bad line%s (line%s", r->cmd,
            (unsigned long long)r->nbad, r->nbad == 1 ? "" : "s",
            r->nbad == 1 ? "" : "s");
    for (size_t i = 0; i < shown && i < r->nbad; i++)
        fprintf(stderr, "%s %llu", i ? "," : "",
                (unsigned long long)r->first_bad[i]);
    fprintf(stderr, "%s)\n", r->nbad > shown ? ", ..." : "");
}

void reader_close(reader_t *r)
{
    free(r->buf);
    if (r->fd > 0)
        close(r->fd);
    memset(r, 0, sizeof *r);
}

char *fmt_u64(char *p, uint64_t v)
{
    char tmp[20];
    int n = 0;
    do {
        tmp[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v != 0);
    while (n > 0)
        *p++ = tmp[--n];
    return p;
}

char *fmt_seconds(char *p, uint64_t ns)
{
    uint64_t frac = ns % RATE_NS_PER_S;
    p = fmt_u64(p, ns / RATE_NS_PER_S);
    *p++ = '.';
    for (uint64_t d = RATE_NS_PER_S / 10; d > 0; d /= 10) {
        *p++ = (char)('0' + frac / d);
        frac %= d;
    }
    return p;
}
