/* SPDX-License-Identifier: MIT */
/*
 * The shared-memory store under many callers: threads of one process on
 * two handles of one region ("threads", run under ThreadSanitizer too);
 * processes times threads, and worker processes killed with SIGKILL at
 * random moments while others run ("procs": fork and a shared mapping are
 * outside what ThreadSanitizer follows).
 *
 *   test_shm_procs [threads|procs]      (default: both)
 *   RATE_SHM_CHAOS_KILLS=N              kills in the chaos test (200)
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "lib/helpers.h"
#include "lib/rng.h"
#include "ratelimit_store.h"
#include "ratelimit_shm.h"

static char path[128];

static int setup(void **state)
{
    (void)state;
    snprintf(path, sizeof path, "/dev/shm/rl-test-procs-%ld", (long)getpid());
    unlink(path);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    unlink(path);
    return 0;
}

static rate_store_t *attach(const rate_shm_options_t *o)
{
    rate_store_t *s = NULL;
    char err[256] = "";
    if (rate_store_shm_new(path, o, &s, err, sizeof err) != RATE_OK)
        fail_msg("%s: %s", path, err);
    return s;
}

static void check_region(rate_store_t *s)
{
    char err[256] = "";
    int rc = rate_store_shm_check(s, err, sizeof err);
    if (rc != RATE_OK)
        fail_msg("check: %s: %s", rate_err_name(rc), err);
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * SEC + (uint64_t)ts.tv_nsec;
}

/* Permits admitted so far on a fixed window of `limit` at t=1 (one
 * window): limit - remaining. */
static uint64_t used_of(rate_store_t *s, const char *policy, uint64_t limit,
                        const char *key)
{
    rate_limiter_t *l = limiter_of(policy, s);
    rate_decision_t d = at(l, key, 1, 0, 0);
    rate_limiter_free(l);
    return limit - d.remaining;
}

/* ------------------------------------------------------------- threads */

enum { THREADS = 4, PER_THREAD = 600, EXACT_LIMIT = 1000 };

typedef struct thread_arg {
    rate_store_t *store;
    int id;
    unsigned admitted, errors;
} thread_arg_t;

static void *thread_main(void *varg)
{
    thread_arg_t *a = varg;
    rate_limiter_t *l = limiter_of("fixed-window 1000/10000d", a->store);
    rate_limiter_t *own = limiter_of("token-bucket 1/100ns burst=3", a->store);
    rate_store_t *mem = NULL;
    rate_limiter_t *ref = NULL;
    char key[32];

    if (rate_store_memory_new(NULL, &mem) != RATE_OK)
        a->errors++;
    ref = limiter_of("token-bucket 1/100ns burst=3", mem);
    snprintf(key, sizeof key, "own-%d", a->id);
    for (int i = 0; i < PER_THREAD; i++) {
        rate_decision_t d;
        if (rate_limiter_check_at(l, "exact", 5, 1, 0, 1, &d) != RATE_OK ||
            d.reason == RATE_REASON_STORE_ERROR)
            a->errors++;
        a->admitted += d.allowed;
        /* A key of the thread's own: the memory store's answers. */
        uint64_t t = (uint64_t)i * 37;
        if (rate_try_acquire_at(own, key, 1, t) !=
            rate_try_acquire_at(ref, key, 1, t))
            a->errors++;
    }
    rate_limiter_free(l);
    rate_limiter_free(own);
    rate_limiter_free(ref);
    rate_store_free(mem);
    return NULL;
}

static void threads_on_two_handles(void **state)
{
    (void)state;
    rate_shm_options_t o = {.max_keys = 1000, .shards = 2};
    rate_store_t *s1 = attach(&o), *s2 = attach(NULL);
    pthread_t th[THREADS];
    thread_arg_t args[THREADS];
    for (int i = 0; i < THREADS; i++) {
        args[i] = (thread_arg_t){i % 2 ? s2 : s1, i, 0, 0};
        assert_int_equal(pthread_create(&th[i], NULL, thread_main, &args[i]),
                         0);
    }
    unsigned admitted = 0;
    for (int i = 0; i < THREADS; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(args[i].errors, 0);
        admitted += args[i].admitted;
    }
    /* THREADS * PER_THREAD > EXACT_LIMIT requests in one window. */
    assert_int_equal(admitted, EXACT_LIMIT);
    assert_int_equal(used_of(s1, "fixed-window 1000/10000d", EXACT_LIMIT,
                             "exact"),
                     EXACT_LIMIT);
    check_region(s2);
    rate_store_free(s1);
    rate_store_free(s2);
}

/* ----------------------------------------------- processes x threads */

enum { PROCS = 3, PTHREADS = 3, ITER = 1500, SPAN_WINDOWS = 50 };
#define WINDOW_NS 1000u
#define FW_LIMIT 20u
#define TB_PERIOD 100u
#define TB_BURST 5u

typedef struct proc_counts {
    _Atomic unsigned exact, fw, tb, total, errors, mismatches;
} proc_counts_t;

typedef struct proc_thread {
    rate_store_t *store;
    proc_counts_t *c;
    int proc, thread;
} proc_thread_t;

static void *proc_thread_main(void *varg)
{
    proc_thread_t *a = varg;
    rate_limiter_t *exact = limiter_of("fixed-window 1000/10000d", a->store);
    rate_limiter_t *fw = limiter_of("fixed-window 20/1000ns", a->store);
    rate_limiter_t *tb = limiter_of("token-bucket 1/100ns burst=5", a->store);
    rate_store_t *mem = NULL;
    if (rate_store_memory_new(NULL, &mem) != RATE_OK)
        atomic_fetch_add(&a->c->errors, 1);
    rate_limiter_t *ref = limiter_of("fixed-window 20/1000ns", mem);
    char own[32];
    snprintf(own, sizeof own, "own-%d-%d", a->proc, a->thread);
    for (unsigned i = 0; i < ITER; i++) {
        /* Times spread over SPAN_WINDOWS windows, in an order of each
         * thread's own (so they go back and forth between callers). */
        uint64_t t = ((uint64_t)i * 7919u + (uint64_t)a->thread * 131u +
                      (uint64_t)a->proc * 1009u) %
                     (SPAN_WINDOWS * WINDOW_NS);
        rate_decision_t d;
        int rc = rate_limiter_check_at(fw, "shared-fw", 9, 1, 0, t, &d);
        if (rc != RATE_OK || d.reason == RATE_REASON_STORE_ERROR)
            atomic_fetch_add(&a->c->errors, 1);
        if (d.allowed)
            atomic_fetch_add(&a->c->fw, 1);
        if (rate_try_acquire_at(tb, "shared-tb", 1, t))
            atomic_fetch_add(&a->c->tb, 1);
        if (rate_try_acquire_at(exact, "exact", 1, 1))
            atomic_fetch_add(&a->c->exact, 1);
        /* The thread's own key: the memory store's decisions exactly. */
        rate_decision_t x, y;
        rate_limiter_check_at(fw, own, strlen(own), 1, 0, i * 97u, &x);
        rate_limiter_check_at(ref, own, strlen(own), 1, 0, i * 97u, &y);
        if (x.allowed != y.allowed || x.remaining != y.remaining ||
            x.retry_after_ns != y.retry_after_ns ||
            x.reset_after_ns != y.reset_after_ns)
            atomic_fetch_add(&a->c->mismatches, 1);
        atomic_fetch_add(&a->c->total, 1);
    }
    rate_limiter_free(exact);
    rate_limiter_free(fw);
    rate_limiter_free(tb);
    rate_limiter_free(ref);
    rate_store_free(mem);
    return NULL;
}

static void processes_times_threads(void **state)
{
    (void)state;
    rate_shm_options_t o = {.max_keys = 4096};
    rate_store_free(attach(&o));
    proc_counts_t *c = mmap(NULL, sizeof *c, PROT_READ | PROT_WRITE,
                            MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    assert_true(c != MAP_FAILED);
    memset(c, 0, sizeof *c);
    pid_t pids[PROCS];
    for (int p = 0; p < PROCS; p++) {
        pids[p] = fork();
        assert_true(pids[p] >= 0);
        if (pids[p] == 0) {
            rate_store_t *s = NULL;
            if (rate_store_shm_new(path, NULL, &s, NULL, 0) != RATE_OK)
                _exit(1);
            pthread_t th[PTHREADS];
            proc_thread_t args[PTHREADS];
            for (int t = 0; t < PTHREADS; t++) {
                args[t] = (proc_thread_t){s, c, p, t};
                if (pthread_create(&th[t], NULL, proc_thread_main, &args[t]))
                    _exit(2);
            }
            for (int t = 0; t < PTHREADS; t++)
                pthread_join(th[t], NULL);
            rate_store_free(s);
            _exit(0);
        }
    }
    for (int p = 0; p < PROCS; p++) {
        int st = 0;
        assert_int_equal(waitpid(pids[p], &st, 0), pids[p]);
        assert_true(WIFEXITED(st));
        assert_int_equal(WEXITSTATUS(st), 0);
    }
    unsigned requests = PROCS * PTHREADS * ITER;
    assert_int_equal(c->total, requests);
    assert_int_equal(c->errors, 0);
    assert_int_equal(c->mismatches, 0);
    /* One window for every request: exactly its limit, no more. */
    assert_int_equal(c->exact, EXACT_LIMIT);
    /* Every admission falls in one of the span's windows (a time behind
     * the key's last counts at the last's), so at most L per window. */
    assert_true(c->fw <= FW_LIMIT * SPAN_WINDOWS);
    assert_true(c->fw >= FW_LIMIT); /* and the first window's were all */
    /* A bucket: its burst plus what it refills over the span. */
    assert_true(c->tb <= TB_BURST + SPAN_WINDOWS * WINDOW_NS / TB_PERIOD);
    rate_store_t *s = attach(NULL);
    assert_int_equal(used_of(s, "fixed-window 1000/10000d", EXACT_LIMIT,
                             "exact"),
                     EXACT_LIMIT);
    check_region(s);
    rate_shm_info_t info;
    assert_int_equal(rate_store_shm_info(s, &info), RATE_OK);
    assert_int_equal(info.recoveries, 0);
    assert_int_equal(info.keys, 3 + PROCS * PTHREADS);
    rate_store_free(s);
    munmap(c, sizeof *c);
}

/* --------------------------------------------------------------- chaos */

enum { WORKERS = 4, SLOTS = 64 };
#define BIG_LIMIT UINT64_C(1000000000000)
#define SMALL_LIMIT 3000u
#define BIG_POLICY "fixed-window 1000000000000/10000d"
#define SMALL_POLICY "fixed-window 3000/10000d"
/* A survivor never waits its lock timeout: a dead holder's lock is taken
 * over at once, and a wake-up lost with a killed waiter costs a slice of
 * the wait.  Counted as failed calls (RATE_ETIMEDOUT), not timed. */
#define WORKER_LOCK_TIMEOUT_NS (5 * SEC)

/* What workers tell the parent, in a shared anonymous mapping; a slot
 * per worker incarnation. */
typedef struct chaos {
    _Atomic int stop;
    struct {
        _Atomic uint64_t big, small, decisions;
        _Atomic int in_big, in_small; /* a decision on the key under way */
        _Atomic uint64_t max_ns, errors;
    } w[SLOTS];
} chaos_t;

static void chaos_worker(chaos_t *c, int slot)
{
    rate_store_t *s = NULL;
    uint64_t x = (uint64_t)getpid() * 0x9e3779b97f4a7c15u | 1;
    rate_shm_options_t o = {.lock_timeout_ns = WORKER_LOCK_TIMEOUT_NS};
    if (rate_store_shm_new(path, &o, &s, NULL, 0) != RATE_OK) {
        atomic_fetch_add(&c->w[slot].errors, 1);
        _exit(1);
    }
    rate_limiter_t *big = limiter_of(BIG_POLICY, s);
    rate_limiter_t *small = limiter_of(SMALL_POLICY, s);
    rate_limiter_t *churn = limiter_of("token-bucket 1/ms burst=2", s);
    while (!atomic_load(&c->stop)) {
        uint64_t t0 = now_ns();
        rate_decision_t d;
        atomic_store(&c->w[slot].in_big, 1);
        int rc = rate_limiter_check_at(big, "big", 3, 1, 0, 1, &d);
        if (d.allowed)
            atomic_fetch_add(&c->w[slot].big, 1);
        atomic_store(&c->w[slot].in_big, 0);
        if (rc != RATE_OK || d.reason == RATE_REASON_STORE_ERROR)
            atomic_fetch_add(&c->w[slot].errors, 1);
        atomic_store(&c->w[slot].in_small, 1);
        bool ok = rate_try_acquire_at(small, "small", 1, 1);
        if (ok)
            atomic_fetch_add(&c->w[slot].small, 1);
        atomic_store(&c->w[slot].in_small, 0);
        /* Keys coming and going: inserts, evictions, removals. */
        char key[16];
        rnd_next(&x);
        snprintf(key, sizeof key, "r%u", (unsigned)(x % 1000));
        if (x % 16 == 0) {
            if (rate_limiter_reset(churn, key, strlen(key)) != RATE_OK)
                atomic_fetch_add(&c->w[slot].errors, 1);
        } else if (rate_limiter_check(churn, key, strlen(key), 1, 0, &d) !=
                       RATE_OK ||
                   d.reason == RATE_REASON_STORE_ERROR) {
            atomic_fetch_add(&c->w[slot].errors, 1);
        }
        uint64_t took = now_ns() - t0;
        if (took > atomic_load(&c->w[slot].max_ns))
            atomic_store(&c->w[slot].max_ns, took);
        atomic_fetch_add(&c->w[slot].decisions, 1);
    }
    rate_limiter_free(big);
    rate_limiter_free(small);
    rate_limiter_free(churn);
    rate_store_free(s);
    _exit(0);
}

static pid_t spawn(chaos_t *c, int slot)
{
    pid_t pid = fork();
    if (pid == 0)
        chaos_worker(c, slot);
    return pid;
}

static void workers_killed_at_random(void **state)
{
    (void)state;
    const char *env = getenv("RATE_SHM_CHAOS_KILLS");
    unsigned kills = env != NULL && atoi(env) > 0 ? (unsigned)atoi(env) : 200;
    rate_shm_options_t o = {.max_keys = 256, .shards = 4};
    rate_store_free(attach(&o));
    chaos_t *c = mmap(NULL, sizeof *c, PROT_READ | PROT_WRITE,
                      MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    assert_true(c != MAP_FAILED);
    memset(c, 0, sizeof *c);
    pid_t pids[WORKERS];
    int slots[WORKERS], next_slot = 0;
    uint64_t lost_big = 0, lost_small = 0, x = 0x1234567u;
    for (int i = 0; i < WORKERS; i++) {
        slots[i] = next_slot++ % SLOTS;
        pids[i] = spawn(c, slots[i]);
        assert_true(pids[i] > 0);
    }
    uint64_t start = now_ns();
    for (unsigned k = 0; k < kills; k++) {
        rnd_next(&x);
        struct timespec ts = {0, (long)(x % 2000000)}; /* up to 2 ms */
        nanosleep(&ts, NULL);
        int v = (int)((x >> 24) % WORKERS);
        kill(pids[v], SIGKILL);
        int st = 0;
        assert_int_equal(waitpid(pids[v], &st, 0), pids[v]);
        /* A decision it was making may have been admitted, uncounted. */
        lost_big += (uint64_t)atomic_load(&c->w[slots[v]].in_big);
        lost_small += (uint64_t)atomic_load(&c->w[slots[v]].in_small);
        atomic_store(&c->w[slots[v]].in_big, 0);
        atomic_store(&c->w[slots[v]].in_small, 0);
        slots[v] = next_slot++ % SLOTS;
        pids[v] = spawn(c, slots[v]);
        assert_true(pids[v] > 0);
    }
    atomic_store(&c->stop, 1);
    for (int i = 0; i < WORKERS; i++) {
        int st = 0;
        assert_int_equal(waitpid(pids[i], &st, 0), pids[i]);
        assert_true(WIFEXITED(st));
        assert_int_equal(WEXITSTATUS(st), 0);
    }
    uint64_t big = 0, small = 0, decisions = 0, max_ns = 0, errors = 0;
    for (int i = 0; i < SLOTS; i++) {
        big += c->w[i].big;
        small += c->w[i].small;
        decisions += c->w[i].decisions;
        errors += c->w[i].errors;
        if (c->w[i].max_ns > max_ns)
            max_ns = c->w[i].max_ns;
    }
    rate_store_t *s = attach(NULL);
    check_region(s);
    rate_shm_info_t info;
    assert_int_equal(rate_store_shm_info(s, &info), RATE_OK);
    uint64_t big_store = used_of(s, BIG_POLICY, BIG_LIMIT, "big");
    uint64_t small_store = used_of(s, SMALL_POLICY, SMALL_LIMIT, "small");
    print_message("chaos: %u kills in %.1f s, %llu decisions, %llu "
                  "recoveries, %llu slots repaired, slowest survivor %.1f "
                  "ms; big: %llu counted, %llu in the store, %llu in "
                  "flight at a kill; small: %llu counted, %llu stored\n",
                  kills, (double)(now_ns() - start) / 1e9,
                  (unsigned long long)decisions,
                  (unsigned long long)info.recoveries,
                  (unsigned long long)info.repaired, (double)max_ns / 1e6,
                  (unsigned long long)big, (unsigned long long)big_store,
                  (unsigned long long)lost_big, (unsigned long long)small,
                  (unsigned long long)small_store);
    assert_int_equal(errors, 0);
    /* Never torn, never lost: the store holds exactly what was admitted,
     * give or take the decisions under way in the killed workers. */
    assert_true(big <= big_store);
    assert_true(big_store <= big + lost_big);
    assert_true(small <= small_store);
    assert_true(small_store <= SMALL_LIMIT);
    assert_true(small_store <= small + lost_small);
    assert_true(info.keys <= info.capacity);
    /* Hundreds of kills of processes that hold a lock most of the time
     * find some of them holding one. */
    assert_true(info.recoveries > 0);
    rate_store_free(s);
    munmap(c, sizeof *c);
}

int main(int argc, char **argv)
{
    const char *which = argc > 1 ? argv[1] : "";
    const struct CMUnitTest threads[] = {
        cmocka_unit_test_setup_teardown(threads_on_two_handles, setup,
                                        teardown),
    };
    const struct CMUnitTest procs[] = {
        cmocka_unit_test_setup_teardown(processes_times_threads, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(workers_killed_at_random, setup,
                                        teardown),
    };
    int rc = 0;
    if (strcmp(which, "procs") != 0)
        rc |= cmocka_run_group_tests_name("shm_threads", threads, NULL, NULL);
    if (strcmp(which, "threads") != 0)
        rc |= cmocka_run_group_tests_name("shm_procs", procs, NULL, NULL);
    return rc;
}
