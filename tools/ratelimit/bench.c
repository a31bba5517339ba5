/* SPDX-License-Identifier: MIT */
/*
 * ratelimit bench: ns per decision against floors measured in the same run.
 *
 * Floors:
 *   clock      one CLOCK_MONOTONIC read
 *   hash+cas   one XXH3 hash of a 16-byte key and one uncontended 64-bit
 *              compare-and-swap
 *   fetch+read one key fetched from a 1M-entry key array at random, hashed,
 *              and one 64-byte entry read from a 1M-entry table at that hash:
 *              the misses one decision cannot avoid.  Measured one after
 *              another (the floor the target compares with: a decision
 *              updates its key with an atomic instruction, which on x86
 *              waits for every earlier load and holds back every later
 *              one, so one decision's misses never overlap the next one's)
 *              and as independent iterations, whose misses the CPU
 *              overlaps (shown for reference).
 *   contended  two threads, each on a CPU of its own, adding one to a
 *              shared 64-bit word with a load and a compare-and-swap:
 *              what any exact decision on one shared key pays at least.
 * Every figure is the best of several rounds (the machines are shared and
 * noisy; the best round is the one least disturbed).  One thread's figures
 * are taken pinned to one CPU beside floors taken there, on each of two
 * CPUs (shared cores can differ by half in speed); thread figures pin each
 * thread to a CPU of its own (see threads()).
 */
#include <fcntl.h>
#include <sched.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "cli.h"
#include "ratelimit_shm.h"

#define KEYS (1u << 20)
#define KEYLEN 16

static unsigned rounds = 5;
static uint64_t iters = 2000000;
static bool progress;
static const char *java_peer; /* --java-peer COMMAND, or NULL */

static uint64_t now_ns(void)
{
    return rate_clock_monotonic_ns();
}

static void note(const char *what)
{
    if (progress)
        fprintf(stderr, "\r\033[Kbench: %s ...", what);
}

static uint64_t lcg(uint64_t *s)
{
    *s = *s * 6364136223846793005u + 1442695040888963407u;
    return *s >> 33;
}

static char (*keys)[KEYLEN + 1];

static void make_keys(void)
{
    keys = malloc((size_t)KEYS * sizeof *keys);
    if (keys == NULL)
        exit(cli_fail("bench: out of memory"));
    for (uint32_t i = 0; i < KEYS; i++)
        snprintf(keys[i], KEYLEN + 1, "user:%011u", i);
}

/* ------------------------------------------------------------- floors */

static volatile uint64_t sink;

static double floor_clock_coarse(void)
{
    uint64_t acc = 0, t0 = now_ns();
    for (uint64_t i = 0; i < iters; i++)
        acc += rate_clock_coarse_ns();
    sink = acc;
    return (double)(now_ns() - t0) / (double)iters;
}

static double floor_clock(void)
{
    uint64_t acc = 0, t0 = now_ns();
    for (uint64_t i = 0; i < iters; i++)
        acc += rate_clock_monotonic_ns();
    sink = acc;
    return (double)(now_ns() - t0) / (double)iters;
}

static double floor_hash_cas(void)
{
    _Atomic uint64_t word = 0;
    uint64_t t0 = now_ns();
    for (uint64_t i = 0; i < iters; i++) {
        uint64_t h = XXH3_64bits_withSeed(keys[42], KEYLEN, i & 1);
        uint64_t old = atomic_load_explicit(&word, memory_order_relaxed);
        atomic_compare_exchange_strong(&word, &old, old + h);
    }
    sink = word;
    return (double)(now_ns() - t0) / (double)iters;
}

typedef struct { uint64_t w[8]; } line_t;

static double floor_fetch_read(line_t *table)
{
    uint64_t s = 1, acc = 0, t0 = now_ns();
    for (uint64_t i = 0; i < iters; i++) {
        const char *k = keys[lcg(&s) & (KEYS - 1)];
        uint64_t h = XXH3_64bits_withSeed(k, KEYLEN, 0);
        acc += table[h & (KEYS - 1)].w[0];
    }
    sink = acc;
    return (double)(now_ns() - t0) / (double)iters;
}

/* The same with each iteration waiting for the previous one (its index
 * depends on the value read), as a decision behind an atomic exchange does:
 * the misses can no longer overlap across iterations. */
static double floor_fetch_read_serial(line_t *table)
{
    uint64_t s = 1, acc = 0, t0 = now_ns();
    for (uint64_t i = 0; i < iters; i++) {
        s += acc & 1; /* always 0 here, but the CPU cannot know */
        const char *k = keys[lcg(&s) & (KEYS - 1)];
        uint64_t h = XXH3_64bits_withSeed(k, KEYLEN, 0);
        acc += table[h & (KEYS - 1)].w[0];
    }
    sink = acc;
    return (double)(now_ns() - t0) / (double)iters;
}

/* ---------------------------------------------------------- decisions */

/* A limiter on the library's exact clock, or (coarse) its coarse one. */
static rate_limiter_t *limiter_on(const char *text, rate_store_t *store,
                                  bool coarse)
{
    rate_policy_t *p;
    rate_limiter_t *lim;
    char err[200];
    if (rate_policy_parse(text, &p, err, sizeof err) != RATE_OK)
        exit(cli_fail("bench: %s", err));
    rate_limiter_config_t cfg = {.policy = p, .store = store};
    if (coarse)
        cfg.clock = rate_clock_coarse();
    if (rate_limiter_new(&cfg, &lim) != RATE_OK)
        exit(cli_fail("bench: cannot make a limiter"));
    rate_policy_free(p);
    return lim;
}

static rate_limiter_t *limiter(const char *text, rate_store_t *store)
{
    return limiter_on(text, store, false);
}

/* A policy that admits nearly everything, so each decision writes. */
static const char *const OPEN_TB = "token-bucket 1000000000/s burst=1000000000";

static double hot_clock(rate_limiter_t *lim)
{
    uint64_t ok = 0, t0 = now_ns();
    for (uint64_t i = 0; i < iters; i++)
        ok += rate_try_acquire(lim, keys[42], 1);
    sink = ok;
    return (double)(now_ns() - t0) / (double)iters;
}

static double hot_given(rate_limiter_t *lim, const char *key)
{
    uint64_t ok = 0, t0 = now_ns(), t = t0;
    for (uint64_t i = 0; i < iters; i++)
        ok += rate_try_acquire_at(lim, key, 1, t + i);
    sink = ok;
    return (double)(now_ns() - t0) / (double)iters;
}

/* The same two with the key's length given, as the floor's hash has it
 * (and as a server that holds keys with their lengths calls). */
static double hot_clock_len(rate_limiter_t *lim)
{
    uint64_t ok = 0, t0 = now_ns();
    for (uint64_t i = 0; i < iters; i++)
        ok += rate_try_acquire_len(lim, keys[42], KEYLEN, 1);
    sink = ok;
    return (double)(now_ns() - t0) / (double)iters;
}

static double hot_given_len(rate_limiter_t *lim)
{
    uint64_t ok = 0, t0 = now_ns(), t = t0;
    for (uint64_t i = 0; i < iters; i++)
        ok += rate_try_acquire_len_at(lim, keys[42], KEYLEN, 1, t + i);
    sink = ok;
    return (double)(now_ns() - t0) / (double)iters;
}

/* The full call on the hot key at the caller's time. */
static double hot_check_given(rate_limiter_t *lim)
{
    rate_decision_t d;
    uint64_t ok = 0, t0 = now_ns(), t = t0;
    for (uint64_t i = 0; i < iters; i++) {
        rate_limiter_check_at(lim, keys[42], KEYLEN, 1, 0, t + i, &d);
        ok += d.allowed;
    }
    sink = ok;
    return (double)(now_ns() - t0) / (double)iters;
}

/* A listener as cheap as one can be: a count (the thread's own). */
static void count_event(void *ud, const rate_event_t *ev)
{
    (void)ev;
    ++*(uint64_t *)ud;
}

/* 1M keys at random on the limiter's own clock. */
static double random_keys_clock(rate_limiter_t *lim)
{
    uint64_t s = 7, ok = 0, t0 = now_ns();
    for (uint64_t i = 0; i < iters; i++)
        ok += rate_try_acquire_len(lim, keys[lcg(&s) & (KEYS - 1)], KEYLEN, 1);
    sink = ok;
    return (double)(now_ns() - t0) / (double)iters;
}

static double random_keys(rate_limiter_t *lim)
{
    uint64_t s = 7, ok = 0, t0 = now_ns();
    for (uint64_t i = 0; i < iters; i++)
        ok += rate_try_acquire_at(lim, keys[lcg(&s) & (KEYS - 1)], 1, t0 + i);
    sink = ok;
    return (double)(now_ns() - t0) / (double)iters;
}

/* Threads: each runs for a fixed span on a CPU of its own and counts its
 * decisions, so that throughput is decisions per second of the span.  The
 * two cores of a shared machine can run at quite different speeds, so one
 * thread is measured on each of the two CPUs and "one thread" is the mean
 * of the two: two threads are compared with what their two cores do
 * alone. */
#define SPAN_NS 50000000u /* 50 ms */

typedef struct worker {
    rate_limiter_t *lim;
    const char *key;
    int cpu;
    pthread_barrier_t *start;
    atomic_bool *stop;
    uint64_t count;
} worker_t;

static void pin_thread(int cpu)
{
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET((size_t)cpu, &one);
    pthread_setaffinity_np(pthread_self(), sizeof one, &one);
}

/* The contended floor's word (a line of its own). */
static _Alignas(64) _Atomic uint64_t shared_word;

static void *run_worker(void *arg)
{
    worker_t *w = arg;
    uint64_t ok = 0, i = 0, t = now_ns();
    pin_thread(w->cpu);
    pthread_barrier_wait(w->start);
    while (w->lim == NULL &&
           !atomic_load_explicit(w->stop, memory_order_relaxed)) {
        uint64_t old = atomic_load_explicit(&shared_word, memory_order_relaxed);
        while (!atomic_compare_exchange_weak(&shared_word, &old, old + 1))
            ;
        i++;
    }
    while (w->lim != NULL &&
           !atomic_load_explicit(w->stop, memory_order_relaxed)) {
        ok += rate_try_acquire_at(w->lim, w->key, 1, t + i);
        i++;
    }
    w->count = i;
    sink = ok;
    return NULL;
}

/* Decisions per microsecond of `n` threads at once, on cpus[0..n-1]
 * (lim NULL: the contended floor's compare-and-swaps instead). */
static double threads(rate_limiter_t *lim, int n, const int *cpus,
                      bool same_key)
{
    pthread_t th[2];
    worker_t w[2];
    pthread_barrier_t start;
    atomic_bool stop = false;
    struct timespec span = {0, SPAN_NS};
    pthread_barrier_init(&start, NULL, (unsigned)n + 1);
    for (int i = 0; i < n; i++) {
        w[i] = (worker_t){lim, keys[same_key ? 42 : 42 + i * 1000], cpus[i],
                          &start, &stop, 0};
        pthread_create(&th[i], NULL, run_worker, &w[i]);
    }
    pthread_barrier_wait(&start);
    uint64_t t0 = now_ns();
    nanosleep(&span, NULL);
    atomic_store(&stop, true);
    uint64_t total = 0;
    for (int i = 0; i < n; i++) {
        pthread_join(th[i], NULL);
        total += w[i].count;
    }
    uint64_t dt = now_ns() - t0;
    pthread_barrier_destroy(&start);
    return (double)total * 1000.0 / (double)dt;
}

/* Runs the Java peer (bench/guava-peer/run.sh) and prints its figures
 * beside ours: each thread's ns per decision with two threads on one
 * limiter (`ours`, of the line above), and the peer's one thread.  The
 * peer prints "one NS" and "two NS" lines. */
static void print_java_peer(double ours)
{
    FILE *f = popen(java_peer, "r");
    double one = 0, two = 0, v;
    char line[256], what[16];

    while (f != NULL && fgets(line, sizeof line, f) != NULL) {
        if (sscanf(line, "%15s %lf", what, &v) != 2)
            continue;
        if (strcmp(what, "one") == 0)
            one = v;
        else if (strcmp(what, "two") == 0)
            two = v;
    }
    if (f == NULL || pclose(f) != 0 || one <= 0 || two <= 0) {
        printf("  java peer: no figures from '%s'\n", java_peer);
        return;
    }
    printf("  %-40s %8.1f %7.2fx  (its ns / ours, 2 threads, one key)\n",
           "Guava RateLimiter, 2 threads, one", two, two / ours);
    printf("  %-40s %8.1f\n", "Guava RateLimiter, 1 thread", one);
}

/* The first two CPUs this process may run on, and all of them (*set);
 * false if it has only one (or cannot tell). */
static bool two_cpus(int cpus[2], cpu_set_t *set)
{
    int n = 0;
    if (sched_getaffinity(0, sizeof *set, set) != 0)
        return false;
    for (int c = 0; c < CPU_SETSIZE && n < 2; c++)
        if (CPU_ISSET((size_t)c, set))
            cpus[n++] = c;
    return n == 2;
}

/* Lets the calling thread run on every CPU it could at the start again. */
static void unpin(const cpu_set_t *all)
{
    pthread_setaffinity_np(pthread_self(), sizeof *all, all);
}

static double lesser(double a, double b)
{
    return a < b ? a : b;
}

/* The hot-key floors and decisions on the calling thread's CPU, round by
 * round so that a slow spell touches each floor and its decisions alike;
 * the best of each. */
typedef struct hot {
    double clock_floor, cas_floor, clock, given, clock_len, given_len;
} hot_t;

static hot_t hot_measures(rate_limiter_t *lim)
{
    hot_t h = {1e300, 1e300, 1e300, 1e300, 1e300, 1e300};
    for (unsigned r = 0; r < rounds; r++) {
        h.clock_floor = lesser(h.clock_floor, floor_clock());
        h.cas_floor = lesser(h.cas_floor, floor_hash_cas());
        h.clock = lesser(h.clock, hot_clock(lim));
        h.given = lesser(h.given, hot_given(lim, keys[42]));
        h.clock_len = lesser(h.clock_len, hot_clock_len(lim));
        h.given_len = lesser(h.given_len, hot_given_len(lim));
    }
    return h;
}

typedef double (*measure_fn)(void *ctx);

static double best(double (*fn)(void *), void *ctx)
{
    double b = 1e300;
    for (unsigned r = 0; r < rounds; r++) {
        double v = fn(ctx);
        if (v < b)
            b = v;
    }
    return b;
}

/* Thin adapters so every measurement goes through best(). */
static double m_fetch(void *c) { return floor_fetch_read(c); }
static double m_fetch_serial(void *c) { return floor_fetch_read_serial(c); }
static double m_hot_given(void *c) { return hot_given(c, keys[42]); }
static double m_random(void *c) { return random_keys(c); }
static double m_random_clock(void *c) { return random_keys_clock(c); }
static double m_hot_clock_len(void *c) { return hot_clock_len(c); }
static double m_coarse_floor(void *c) { (void)c; return floor_clock_coarse(); }

static void populate(rate_limiter_t *lim)
{
    for (uint32_t i = 0; i < KEYS; i++)
        rate_try_acquire_at(lim, keys[i], 1, 1);
}

/* Replay throughput: writes a trace of `lines` requests over `nkeys` keys
 * to a temporary file, then times `ratelimit replay` on it in a child whose
 * standard output goes to /dev/null.  Returns lines per second. */
static double replay_rate(uint64_t lines, uint32_t nkeys)
{
    char path[] = "/tmp/ratelimit-bench-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0)
        return 0;
    FILE *f = fdopen(fd, "w");
    uint64_t s = 3;
    for (uint64_t i = 0; i < lines; i++)
        fprintf(f, "%llu.%09llu %s\n", (unsigned long long)(i / 100000),
                (unsigned long long)(i % 100000) * 10000,
                keys[nkeys == 1 ? 0 : lcg(&s) % nkeys]);
    fclose(f);
    double best_s = 1e300;
    for (unsigned r = 0; r < rounds && r < 3; r++) {
        uint64_t t0 = now_ns();
        pid_t pid = fork();
        if (pid == 0) {
            int null = open("/dev/null", O_WRONLY);
            dup2(null, 1);
            dup2(null, 2);
            char *args[] = {"replay", "--algorithm", "token-bucket", "--rate",
                            "100/s", "--burst", "100", path, NULL};
            _exit(cmd_replay(8, args));
        }
        int st;
        waitpid(pid, &st, 0);
        double secs = (double)(now_ns() - t0) / 1e9;
        if (secs < best_s)
            best_s = secs;
    }
    unlink(path);
    return (double)lines / best_s;
}

/* ------------------------------------------------ shared-memory store */

/* Decisions per us of `procs` processes, each pinned to a CPU of its own,
 * on region `path` for SPAN_NS: on one key, or on a key each. */
static double shm_procs(const char *path, int procs, const int *cpus,
                        bool same_key)
{
    typedef struct {
        _Atomic int ready, go;
        _Atomic uint64_t count[2];
    } shared_t;
    shared_t *sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE,
                        MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (sh == MAP_FAILED)
        return 0;
    memset(sh, 0, sizeof *sh);
    pid_t pids[2];
    for (int p = 0; p < procs; p++) {
        pids[p] = fork();
        if (pids[p] == 0) {
            pin_thread(cpus[p]);
            rate_shm_options_t o = {.no_create = true};
            rate_store_t *st = NULL;
            if (rate_store_shm_new(path, &o, &st, NULL, 0) != RATE_OK)
                _exit(1);
            rate_limiter_t *l = limiter(OPEN_TB, st);
            const char *key = keys[same_key ? 42 : 42 + p];
            rate_try_acquire_len(l, key, KEYLEN, 1);
            atomic_fetch_add(&sh->ready, 1);
            while (!atomic_load(&sh->go))
                ;
            uint64_t n = 0, t0 = now_ns(), t = t0;
            while (now_ns() - t0 < SPAN_NS) {
                for (int i = 0; i < 64; i++, n++)
                    (void)rate_try_acquire_len_at(l, key, KEYLEN, 1, t++);
            }
            atomic_store(&sh->count[p], n);
            rate_limiter_free(l);
            rate_store_free(st);
            _exit(0);
        }
    }
    while (atomic_load(&sh->ready) < procs)
        sched_yield();
    atomic_store(&sh->go, 1);
    uint64_t total = 0;
    for (int p = 0; p < procs; p++) {
        int status;
        waitpid(pids[p], &status, 0);
        total += atomic_load(&sh->count[p]);
    }
    munmap(sh, sizeof *sh);
    return (double)total / (SPAN_NS / 1000.0);
}

/* The shared-memory store beside the memory store, round by round. */
static int bench_shm(void)
{
    char path[64];
    snprintf(path, sizeof path, "/dev/shm/rl-bench-%ld", (long)getpid());
    unlink(path);
    int cpus[2];
    cpu_set_t all;
    bool have_two = two_cpus(cpus, &all);
    if (have_two)
        pin_thread(cpus[0]);

    note("shm: hot key");
    rate_shm_options_t so = {.max_keys = KEYS, .key_max = KEYLEN,
                             .state_max = 24};
    rate_store_t *shm = NULL, *mem = NULL;
    char err[256];
    if (rate_store_shm_new(path, &so, &shm, err, sizeof err) != RATE_OK)
        return cli_fail("bench: %s", err);
    rate_memory_options_t mo = {.max_keys = KEYS};
    if (rate_store_memory_new(&mo, &mem) != RATE_OK)
        return cli_fail("bench: cannot make a store");
    rate_limiter_t *lm = limiter(OPEN_TB, mem), *ls = limiter(OPEN_TB, shm);
    double m_hot = 1e300, s_hot = 1e300, m_clk = 1e300, s_clk = 1e300;
    for (unsigned r = 0; r < rounds; r++) {
        m_hot = lesser(m_hot, hot_given_len(lm));
        s_hot = lesser(s_hot, hot_given_len(ls));
        m_clk = lesser(m_clk, hot_clock_len(lm));
        s_clk = lesser(s_clk, hot_clock_len(ls));
    }
    rate_limiter_free(lm);
    rate_limiter_free(ls);
    note("shm: 1M keys");
    lm = limiter("token-bucket 1000/s burst=1000000", mem);
    ls = limiter("token-bucket 1000/s burst=1000000", shm);
    populate(lm);
    populate(ls);
    double m_rnd = 1e300, s_rnd = 1e300;
    for (unsigned r = 0; r < rounds; r++) {
        m_rnd = lesser(m_rnd, random_keys(lm));
        s_rnd = lesser(s_rnd, random_keys(ls));
    }
    rate_stats_t mst;
    rate_shm_info_t info;
    rate_limiter_stats(lm, &mst);
    rate_store_shm_info(shm, &info);
    rate_limiter_free(lm);
    rate_limiter_free(ls);
    rate_store_free(mem);
    rate_store_free(shm);
    if (info.evictions != 0 || info.keys != KEYS)
        fprintf(stderr, "bench: the region evicted %llu keys\n",
                (unsigned long long)info.evictions);
    if (have_two)
        unpin(&all);

    double one = 0, two_same = 0, two_own = 0;
    if (have_two) {
        note("shm: two processes");
        so = (rate_shm_options_t){.max_keys = 65536};
        unlink(path);
        if (rate_store_shm_new(path, &so, &shm, err, sizeof err) != RATE_OK)
            return cli_fail("bench: %s", err);
        rate_store_free(shm);
        for (unsigned r = 0; r < rounds; r++) {
            double solo = (shm_procs(path, 1, &cpus[0], true) +
                           shm_procs(path, 1, &cpus[1], true)) / 2;
            one = solo > one ? solo : one;
            double v = shm_procs(path, 2, cpus, true);
            two_same = v > two_same ? v : two_same;
            v = shm_procs(path, 2, cpus, false);
            two_own = v > two_own ? v : two_own;
        }
    }
    unlink(path);
    if (progress)
        fputs("\r\033[K", stderr);

    printf("token bucket, shared-memory store beside memory   memory      "
           "shm   ratio  target\n");
    printf("  %-44s %8.1f %8.1f %6.2fx  <= 1.3x\n",
           "hot key, caller's time (ns/decision)", m_hot, s_hot,
           s_hot / m_hot);
    printf("  %-44s %8.1f %8.1f %6.2fx  <= 1.3x\n",
           "hot key, library clock (ns/decision)", m_clk, s_clk,
           s_clk / m_clk);
    printf("  %-44s %8.1f %8.1f %6.2fx  <= 1.3x\n",
           "1M keys at random, caller's time", m_rnd, s_rnd, s_rnd / m_rnd);
    printf("  %-44s %8.1f %8.1f %6.2fx\n",
           "bytes per key at 1M keys of 16 bytes",
           (double)mst.bytes / (double)mst.keys,
           (double)info.bytes / (double)info.max_keys,
           ((double)info.bytes / (double)info.max_keys) /
               ((double)mst.bytes / (double)mst.keys));
    if (have_two) {
        printf("  %-44s %8.1f\n", "1 process (decisions/us)", one);
        printf("  %-44s %8.1f %15.2fx of one\n",
               "2 processes, one key (decisions/us)", two_same,
               two_same / one);
        printf("  %-44s %8.1f %15.2fx of one\n",
               "2 processes, a key each (decisions/us)", two_own,
               two_own / one);
    } else {
        printf("  2 processes: this process has one CPU\n");
    }
    free(keys);
    return 0;
}

static int usage(FILE *f)
{
    fputs("usage: ratelimit bench [--rounds N] [--iterations N] [--redis URL]\n"
          "                       [--redis-cluster URL] [--java-peer COMMAND]\n"
          "       ratelimit bench --redis URL --workload [--decisions N]\n"
          "                       [--node-peer COMMAND]\n"
          "       ratelimit bench --store dynamodb://TABLE?region=R[&endpoint=URL]\n"
          "       ratelimit bench --shm [--rounds N] [--iterations N]\n"
          "       ratelimit bench --sync redis://HOST[:PORT]\n"
          "       ratelimit bench --fair [--rounds N] [--iterations N]\n"
          "       ratelimit bench --fair --redis URL [--rounds N]\n"
          "       ratelimit bench --leases [--redis URL]\n"
          "       ratelimit bench --rules\n\n"
          "Measures the floors (clock read; hash + CAS; key fetch + random\n"
          "table read) and ns per decision on the in-memory store, and\n"
          "prints them with their ratios.  Best of N rounds (default 5).\n"
          "--java-peer COMMAND also runs a Java peer for two threads on\n"
          "one key (bench/guava-peer/run.sh: Guava's RateLimiter; prints\n"
          "\"one NS\" and \"two NS\" lines).\n"
          "With --redis, also the Redis store at that URL: latency against\n"
          "a PING round trip, and throughput with 1 to 64 callers.  With\n"
          "--redis-cluster too, the same decisions at 1 and 64 callers on\n"
          "the single server and on that Redis Cluster, in turns.\n"
          "Last, issue 27's workload (N decisions over 100,000 random keys,\n"
          "every one an admission that writes; N from --decisions, default\n"
          "40000, the issue's 200000): the blocking store at 1 and 64\n"
          "callers and the asynchronous store at 1 and 64 in flight, with\n"
          "the Redis module when the server has it and without, beside\n"
          "redis-benchmark's ceilings; --workload runs that table alone;\n"
          "--node-peer COMMAND also runs a peer client in turn with it\n"
          "(bench/node-peer/run.sh: COMMAND HOST PORT N KEYS IN-FLIGHT\n"
          "prints \"decisions/s R client_us C\").\n"
          "With --store dynamodb://..., only the DynamoDB store (the table\n"
          "created if missing, the bench's items removed at the end):\n"
          "decisions/s and round trips per decision with 1 and 16 callers,\n"
          "and the conditional writes' conflicts on one key.\n"
          "With --shm, instead: the shared-memory store (a region in\n"
          "/dev/shm, removed after) beside the memory store, hot key and\n"
          "1M keys, bytes per key, and two processes on one key and on a\n"
          "key each.\n"
          "With --sync URL, only the synced mode over the Redis store at\n"
          "URL beside the memory and Redis stores: decisions/s at a hot key\n"
          "and at 1M keys at random, and round trips per 1000 decisions.\n"
          "With --fair, only fair shares (docs/fair.md): a fair decision\n"
          "beside a plain one on one shared limit (memory and shm, 1 to 64\n"
          "flows), then by table size (64, 1024, 4096 slots) a saturated\n"
          "decision's cost and the permits/s that 4 threads waiting on a\n"
          "limit of 2000/s are admitted, and the waiting call's CPU time\n"
          "per request with 1 to 4096 active flows.  With --fair --redis\n"
          "URL, instead: a fair decision on Redis (the fair script, and\n"
          "RATELIMIT.FAIR when the server has ratelimit.so) beside a plain\n"
          "decision of the same limit, 1 caller.\n"
          "With --leases, instead: an in-flight lease (acquire + release)\n"
          "beside one rate decision, on memory, shm and (with --redis) Redis,\n"
          "with 1 and 64 callers on one key; on Redis, leases by the general\n"
          "path (HMGET + compare-and-set), the lease script and the module\n"
          "(when loaded), one row each; then a combined policy's acquire +\n"
          "release as two steps (lease, then rate) and as one command.\n"
          "With --rules, instead: a rules check by the size of the rules\n"
          "file (10 to 100,000 API keys, a rule per key and one tier rule\n"
          "listing them) beside a file of one rule.\n",
          f);
    return f == stdout ? 0 : 2;
}

/* bench's options: those after a mode's name pick the bench; each option
 * is taken by the benches whose bits it lists (B_DEFAULT: no mode). */
enum {
    B_DEFAULT = 1, B_SHM = 2, B_FAIR = 4, B_LEASES = 8, B_RULES = 16,
    B_SYNC = 32, B_STORE = 64
};
static const struct bench_opt {
    const char *name;
    bool value;   /* takes a value */
    unsigned mode; /* the bench it picks, or 0 */
    unsigned in;   /* the benches that take it */
} bench_opts[] = {
    {"--rounds", true, 0, B_DEFAULT | B_SHM | B_FAIR},
    {"--iterations", true, 0, B_DEFAULT | B_SHM | B_FAIR},
    {"--redis", true, 0, B_DEFAULT | B_FAIR | B_LEASES},
    {"--redis-cluster", true, 0, B_DEFAULT},
    {"--java-peer", true, 0, B_DEFAULT},
    {"--workload", false, 0, B_DEFAULT},
    {"--node-peer", true, 0, B_DEFAULT},
    {"--decisions", true, 0, B_DEFAULT},
    {"--shm", false, B_SHM, B_SHM},
    {"--fair", false, B_FAIR, B_FAIR},
    {"--leases", false, B_LEASES, B_LEASES},
    {"--rules", false, B_RULES, B_RULES},
    {"--sync", true, B_SYNC, B_SYNC},
    {"--store", true, B_STORE, B_STORE},
};

int cmd_bench(int argc, char **argv)
{
    const char *redis_url = NULL, *cluster_url = NULL, *sync_url = NULL;
    const char *store_url = NULL;
    bench_redis_opts_t ro = {0};
    const struct bench_opt *mode = NULL;
    unsigned given = 0; /* a bit per bench_opts entry */
    const size_t nopts = sizeof bench_opts / sizeof bench_opts[0];

    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0)
            return usage(stdout);
        const struct bench_opt *o = NULL;
        for (size_t k = 0; k < nopts; k++)
            if (strcmp(argv[i], bench_opts[k].name) == 0)
                o = &bench_opts[k];
        if (o == NULL)
            return cli_fail("bench: unknown option '%s'", argv[i]);
        if (o->value && i + 1 >= argc)
            return cli_fail("bench: option '%s' needs a value", argv[i]);
        if (o->mode != 0 && mode != NULL && mode != o)
            return cli_fail("bench: %s and %s are two benches: run one at a "
                            "time", mode->name, o->name);
        if (o->mode != 0)
            mode = o;
        given |= 1u << (o - bench_opts);
        const char *v = o->value ? argv[++i] : NULL;
        char *end;
        if (strcmp(o->name, "--rounds") == 0 ||
            strcmp(o->name, "--iterations") == 0) {
            unsigned long long n = strtoull(v, &end, 10);
            if (*end != '\0' || n == 0 || n > 1000000000ull)
                return cli_fail("bench: %s wants a whole number from 1, not "
                                "'%s'", o->name, v);
            if (o->name[2] == 'r')
                rounds = (unsigned)n;
            else
                iters = n;
        } else if (strcmp(o->name, "--decisions") == 0) {
            unsigned long long n = strtoull(v, &end, 10);
            if (*end != '\0' || n < 64 || n > 100000000ull)
                return cli_fail("bench: --decisions wants a whole number "
                                "from 64 to 100000000, not '%s'", v);
            ro.decisions = n;
        } else if (strcmp(o->name, "--redis") == 0)
            redis_url = v;
        else if (strcmp(o->name, "--workload") == 0)
            ro.workload_only = true;
        else if (strcmp(o->name, "--java-peer") == 0)
            java_peer = v;
        else if (strcmp(o->name, "--node-peer") == 0)
            ro.peer = v;
        else if (strcmp(o->name, "--redis-cluster") == 0)
            cluster_url = v;
        else if (strcmp(o->name, "--sync") == 0)
            sync_url = v;
        else if (strcmp(o->name, "--store") == 0)
            store_url = v;
    }
    /* An option the chosen bench does not take would be ignored: say so. */
    unsigned bench = mode != NULL ? mode->mode : B_DEFAULT;
    bool shm = bench == B_SHM, fair = bench == B_FAIR;
    for (size_t k = 0; k < nopts; k++) {
        if (!(given & 1u << k))
            continue;
        bool fair_redis = bench == B_FAIR && redis_url != NULL &&
                          strcmp(bench_opts[k].name, "--iterations") == 0;
        if (!(bench_opts[k].in & bench) || fair_redis)
            return cli_fail("bench: %s does not apply to %s",
                            bench_opts[k].name,
                            fair_redis ? "--fair --redis"
                            : mode != NULL ? mode->name
                                           : "the memory bench");
    }
    if (bench == B_RULES)
        return bench_rules();
    if (sync_url != NULL)
        return bench_sync(sync_url);
    if (store_url != NULL) {
        if (strncmp(store_url, "dynamodb://", 11) != 0)
            return cli_fail("bench: --store takes a dynamodb:// URL "
                            "(--redis URL for Redis, --shm for a "
                            "shared-memory region), not '%s'",
                            store_url);
        return bench_dynamodb(store_url);
    }
    if (bench == B_LEASES)
        return bench_leases(redis_url);
    if (cluster_url != NULL && redis_url == NULL)
        return cli_fail("bench: --redis-cluster compares with --redis URL");
    if ((ro.workload_only || ro.peer != NULL || ro.decisions != 0) &&
        redis_url == NULL)
        return cli_fail("bench: --workload, --decisions and --node-peer "
                        "measure the Redis store: give --redis URL");
#ifndef RATE_WITH_REDIS
    if (redis_url != NULL) /* refused before the memory figures, not after */
        return bench_redis(redis_url, cluster_url, &ro);
#endif
#ifdef RATE_WITH_REDIS
    if (fair && redis_url != NULL)
        return bench_fair_redis(redis_url, rounds);
#endif
    if (fair)
        return bench_fair(rounds, iters);
    if (ro.workload_only)
        return bench_redis(redis_url, cluster_url, &ro);
    progress = isatty(2);
    make_keys();
    if (shm)
        return bench_shm();
    line_t *table = calloc(KEYS, sizeof *table);
    if (table == NULL)
        return cli_fail("bench: out of memory");

    /* One thread's measures run on one CPU, so that each is compared with
     * floors taken on the same core: the two cores of a shared machine may
     * run at quite different speeds (one measured 45% slower than the
     * other here, its sibling busy with another tenant), and the longer
     * path of a decision suffers more from that than a floor does.  The
     * hot-key figures are taken on each of the first two CPUs; the table
     * shows the less disturbed one (the faster decisions), and the other's
     * ratios beside it. */
    int cpus[2];
    cpu_set_t all;
    bool have_two = two_cpus(cpus, &all);

    note("hot key");
    rate_limiter_t *lim = limiter(OPEN_TB, NULL);
    hot_t hot[2];
    int ncpu = have_two ? 2 : 1;
    for (int c = 0; c < ncpu; c++) {
        if (have_two)
            pin_thread(cpus[c]);
        hot[c] = hot_measures(lim);
    }
    int fast = ncpu == 2 && hot[1].given < hot[0].given ? 1 : 0;
    double f_clock = hot[fast].clock_floor, f_cas = hot[fast].cas_floor;
    const hot_t *hf = &hot[fast], *ho = &hot[!fast];
    if (have_two)
        unpin(&all); /* the threads pin themselves */
    note("two threads");
    /* Round by round, so that a slow spell of the shared machine hurts
     * one thread and two alike; the best of each (in decisions/us). */
    double one_t = 0, two_d = 0, two_s = 0, two_cas = 0;
    for (unsigned r = 0; have_two && r < rounds; r++) {
        double c = threads(NULL, 2, cpus, true);
        two_cas = c > two_cas ? c : two_cas;
        double solo = (threads(lim, 1, &cpus[0], false) +
                       threads(lim, 1, &cpus[1], false)) / 2;
        one_t = solo > one_t ? solo : one_t;
        double v = threads(lim, 2, cpus, false);
        two_d = v > two_d ? v : two_d;
        v = threads(lim, 2, cpus, true);
        two_s = v > two_s ? v : two_s;
    }
    rate_limiter_free(lim);

    note("1M keys"); /* on the less disturbed CPU, floors and decisions */
    if (have_two)
        pin_thread(cpus[fast]);
    double f_fetch = best(m_fetch, table);
    double f_serial = best(m_fetch_serial, table);
    free(table);
    rate_memory_options_t sized = {.max_keys = KEYS};
    rate_store_t *store;
    if (rate_store_memory_new(&sized, &store) != RATE_OK)
        return cli_fail("bench: cannot make a store");
    lim = limiter("token-bucket 1000/s burst=1000000", store);
    populate(lim);
    double rnd = best(m_random, lim);
    double rnd_clock = best(m_random_clock, lim);
    rate_stats_t st;
    rate_limiter_stats(lim, &st);
    double bytes_sized = (double)st.bytes / (double)st.keys;
    rate_limiter_free(lim);
    lim = limiter_on("token-bucket 1000/s burst=1000000", store, true);
    double rnd_coarse = best(m_random_clock, lim);
    rate_limiter_free(lim);
    rate_store_free(store);
    note("coarse clock");
    lim = limiter_on(OPEN_TB, NULL, true);
    double f_coarse = best(m_coarse_floor, NULL);
    double hot_coarse = best(m_hot_clock_len, lim);
    rate_limiter_free(lim);
    lim = limiter("token-bucket 1000/s burst=1000000", NULL);
    populate(lim);
    rate_limiter_stats(lim, &st);
    double bytes_grown = (double)st.bytes / (double)st.keys;
    rate_limiter_free(lim);

    static const char *algos[] = {
        "token-bucket 1000000000/s burst=1000000000",
        "leaky-bucket 1000000000/s capacity=1000000000",
        "fixed-window 1000000000/s", "sliding-log 1000/s",
        "sliding-window 1000000000/s"};
    double per_algo[5];
    for (int a = 0; a < 5; a++) {
        note(algos[a]);
        lim = limiter(algos[a], NULL);
        per_algo[a] = best(m_hot_given, lim);
        rate_limiter_free(lim);
    }
    /* A listener: none (every figure above) against one set, the bool
     * call and the full call, the four measured in turn each round. */
    note("listener");
    static uint64_t heard;
    rate_limiter_t *quiet = limiter(OPEN_TB, NULL), *loud;
    {
        rate_policy_t *p;
        if (rate_policy_parse(OPEN_TB, &p, NULL, 0) != RATE_OK)
            exit(cli_fail("bench: policy"));
        rate_limiter_config_t cfg = {.policy = p, .listener = count_event,
                                     .listener_ud = &heard};
        if (rate_limiter_new(&cfg, &loud) != RATE_OK)
            exit(cli_fail("bench: cannot make a limiter"));
        rate_policy_free(p);
    }
    double l_bool[2] = {1e300, 1e300}, l_check[2] = {1e300, 1e300};
    for (unsigned r = 0; r < rounds; r++) {
        l_bool[0] = lesser(l_bool[0], hot_given_len(quiet));
        l_bool[1] = lesser(l_bool[1], hot_given_len(loud));
        l_check[0] = lesser(l_check[0], hot_check_given(quiet));
        l_check[1] = lesser(l_check[1], hot_check_given(loud));
    }
    rate_limiter_free(quiet);
    rate_limiter_free(loud);
    if (have_two)
        unpin(&all);
    note("replay");
    double replay_one = replay_rate(2000000, 1);
    double replay_many = replay_rate(2000000, 100000);
    if (progress)
        fputs("\r\033[K", stderr);

    printf("floors (ns)\n");
    printf("  %-44s %8.1f\n", "clock read (CLOCK_MONOTONIC)", f_clock);
    printf("  %-44s %8.1f\n", "clock read (CLOCK_MONOTONIC_COARSE)", f_coarse);
    printf("  %-44s %8.1f\n", "hash + uncontended CAS", f_cas);
    printf("  %-44s %8.1f\n", "key fetch + random read, 1M entries,",
           f_serial);
    printf("  %-44s\n", "  one after another (a decision's own misses)");
    printf("  %-44s %8.1f\n", "  the same, independent iterations", f_fetch);
    printf("\ntoken bucket, memory store (ns/decision)        ns    ratio  target\n");
    printf("  %-40s %8.1f %7.2fx  <= 1.2x (clock+hash+CAS)\n",
           "hot key, library clock (key, length)", hf->clock_len,
           hf->clock_len / (f_clock + f_cas));
    printf("  %-40s %8.1f %7.2fx\n", "hot key, library clock (C string)",
           hf->clock, hf->clock / (f_clock + f_cas));
    printf("  %-40s %8.1f %7.2fx  <= 2x (hash+CAS)\n",
           "hot key, caller's time (key, length)", hf->given_len,
           hf->given_len / f_cas);
    printf("  %-40s %8.1f %7.2fx\n", "hot key, caller's time (C string)",
           hf->given, hf->given / f_cas);
    if (ncpu == 2) {
        double of = ho->clock_floor + ho->cas_floor;
        printf("  %-40s %8s %.2fx %.2fx %.2fx %.2fx  (the same four on the "
               "other CPU)\n",
               "", "", ho->clock_len / of, ho->clock / of,
               ho->given_len / ho->cas_floor, ho->given / ho->cas_floor);
    }
    printf("  %-40s %8.1f %7.2fx  (coarse clock+hash+CAS)\n",
           "hot key, coarse clock (key, length)", hot_coarse,
           hot_coarse / (f_coarse + f_cas));
    printf("  %-40s %8.1f %7.2fx  <= 1.5x (fetch+read, one after another)\n",
           "1M keys at random, caller's time", rnd, rnd / f_serial);
    printf("  %-40s %8s %7.2fx  (against independent iterations)\n", "", "",
           rnd / f_fetch);
    printf("  %-40s %8.1f\n", "1M keys at random, library clock", rnd_clock);
    printf("  %-40s %8.1f\n", "1M keys at random, coarse clock", rnd_coarse);
    if (have_two) {
        /* ns per decision: of the pair's wall time for distinct keys; of
         * each thread for one key (two take turns), against one thread. */
        printf("  %-40s %8.1f %7.2fx  >= 1.8x throughput of one\n",
               "2 threads, distinct keys (wall/decision)", 1000.0 / two_d,
               two_d / one_t);
        printf("  %-40s %8.1f %7.2fx  <= 2x ns of one thread\n",
               "2 threads, one key (ns per decision)", 2000.0 / two_s,
               2 * one_t / two_s);
        printf("  %-40s %8.1f\n", "1 thread (mean of the two CPUs)",
               1000.0 / one_t);
        printf("  %-40s %8.1f %7.2fx  (each thread's ns, load + CAS)\n",
               "floor: 2 threads, one word contended", 2000.0 / two_cas,
               two_cas / two_s);
        if (java_peer != NULL)
            print_java_peer(2000.0 / two_s);
    } else {
        printf("  2 threads: this process has one CPU\n");
    }
    printf("\nmemory at 1M keys of 16 bytes (bytes/key)\n");
    printf("  %-40s %8.1f  target <= 48\n", "store sized by max_keys=1M",
           bytes_sized);
    printf("  %-40s %8.1f\n", "store grown from empty", bytes_grown);
    printf("\neach algorithm, hot key, caller's time      ns   x hash+CAS\n");
    for (int a = 0; a < 5; a++)
        printf("  %-40s %8.1f %7.2fx\n", algos[a], per_algo[a],
               per_algo[a] / f_cas);
    printf("\na listener, hot key, caller's time   ns none    ns set   set/none\n");
    printf("  %-32s %8.1f %9.1f %9.2fx\n", "bool call (key, length)",
           l_bool[0], l_bool[1], l_bool[1] / l_bool[0]);
    printf("  %-32s %8.1f %9.1f %9.2fx\n", "full call (rate_limiter_check_at)",
           l_check[0], l_check[1], l_check[1] / l_check[0]);
    printf("\nreplay, memory store, token bucket (2M lines)   lines/s\n");
    printf("  %-40s %12.0f\n", "one key", replay_one);
    printf("  %-40s %12.0f\n", "100k keys", replay_many);
    free(keys);
    fflush(stdout);
    if (redis_url != NULL) {
        note("redis");
        int rc = bench_redis(redis_url, cluster_url, &ro);
        if (progress)
            fputs("\r\033[K", stderr);
        return rc;
    }
    return 0;
}
