/* SPDX-License-Identifier: MIT */
/*
 * In-flight limits on Redis (docs/leases.md, "Stores, processes and
 * crashes"), over the lease script (one round trip) by default: processes, each
 * with its own Redis store (as hosts would be), threads in each, never
 * more than N holders by their own count; holders killed with SIGKILL,
 * their leases back after the TTL, the count exact; Redis stopped and
 * killed: the store's error, nothing granted, the count intact after a
 * restart of a server that kept its data, on each path leases take (the
 * lease script, the general path, the module); a Redis Cluster of 3 masters:
 * threads on keys of every master, each key's bound held.
 * The one wait on time (a 300 ms TTL running out) is polled up to 60 s.
 */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <ratelimit_lease.h>

#include "lib/redis_cluster.h"
#include "lib/lease_holders.h"
#include "lib/redis_fixture.h"

static rate_inflight_policy_t *ipolicy(const char *text)
{
    rate_inflight_policy_t *p = NULL;
    char err[256] = "";
    if (rate_inflight_policy_parse(text, &p, err, sizeof err) != RATE_OK)
        fail_msg("policy '%s': %s", text, err);
    return p;
}

/* A store of the test's own (a child's: made after fork) and an object. */
static rate_store_t *store_of(const char *prefix)
{
    rate_redis_options_t o = {.prefix = prefix};
    rate_store_t *s = NULL;
    if (rate_store_redis_new(url, &o, &s, NULL, 0) != RATE_OK)
        return NULL;
    return s;
}

static rate_inflight_t *inflight(const rate_inflight_policy_t *p,
                                 rate_store_t *s)
{
    rate_inflight_config_t cfg = {.policy = p, .store = s};
    rate_inflight_t *in = NULL;
    return rate_inflight_new(&cfg, &in) == RATE_OK ? in : NULL;
}

static uint64_t held_of(rate_inflight_t *in, const char *key)
{
    uint64_t n = UINT64_MAX;
    assert_int_equal(rate_inflight_held(in, key, strlen(key), &n), RATE_OK);
    return n;
}

typedef lease_tally_t shared_t;

static shared_t *shared_page(void)
{
    shared_t *sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE,
                        MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    assert_true(sh != MAP_FAILED);
    memset(sh, 0, sizeof *sh);
    return sh;
}

/* ------------------------------------------- processes x threads x N */

#define PROCS 3
#define PTHREADS 2
#define ROUNDS 300
#define CAP 3

static void test_procs(void **state)
{
    (void)state;
    rate_inflight_policy_t *p = ipolicy("concurrency 3 ttl=1h");
    shared_t *sh = shared_page();
    pid_t pids[PROCS];
    for (int k = 0; k < PROCS; k++) {
        assert_true((pids[k] = fork()) >= 0);
        if (pids[k] == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            rate_store_t *s = store_of("lease-procs:");
            rate_inflight_t *in = s != NULL ? inflight(p, s) : NULL;
            if (in == NULL)
                _exit(1);
            lease_holder_t w = {in, sh, ROUNDS, 200000};
            if (lease_holders_run(&w, PTHREADS) != 0)
                _exit(2);
            rate_inflight_free(in);
            rate_store_free(s);
            _exit(0);
        }
    }
    for (int k = 0; k < PROCS; k++) {
        int status;
        assert_int_equal(waitpid(pids[k], &status, 0), pids[k]);
        assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    assert_int_equal(sh->errors, 0);
    assert_true(sh->most <= CAP);
    assert_true(sh->most >= 2);
    assert_int_equal(sh->granted + sh->denied, (long)PROCS * PTHREADS * ROUNDS);
    rate_store_t *s = store_of("lease-procs:");
    rate_inflight_t *in = inflight(p, s);
    assert_int_equal(held_of(in, "hot"), 0);
    rate_inflight_free(in);
    drop_store(s);
    rate_inflight_policy_free(p);
    munmap(sh, sizeof *sh);
}

/* ----------------------------------------------------------------- chaos */

#define HOLDERS 3
#define EACH 2

static void test_chaos(void **state)
{
    (void)state;
    rate_inflight_policy_t *p = ipolicy("concurrency 6 ttl=300ms");
    shared_t *sh = shared_page();
    pid_t pids[HOLDERS];
    for (int k = 0; k < HOLDERS; k++) {
        assert_true((pids[k] = fork()) >= 0);
        if (pids[k] == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            rate_store_t *s = store_of("lease-chaos:");
            rate_inflight_t *in = s != NULL ? inflight(p, s) : NULL;
            if (in == NULL)
                _exit(1);
            for (int i = 0; i < EACH; i++) {
                rate_lease_t l;
                rate_decision_t d;
                if (rate_inflight_acquire(in, "k", 1, RATE_LEASE_NORMAL, &l,
                                          &d) != RATE_OK || !d.allowed)
                    _exit(3);
            }
            sh->ready++;
            for (;;)
                pause();
        }
    }
    WAIT_UNTIL(sh->ready >= HOLDERS, TEST_WAIT_S);
    assert_int_equal(sh->ready, HOLDERS);
    for (int k = 0; k < HOLDERS; k++) {
        int status;
        kill(pids[k], SIGKILL);
        assert_int_equal(waitpid(pids[k], &status, 0), pids[k]);
    }
    rate_store_t *s = store_of("lease-chaos:");
    rate_inflight_t *in = inflight(p, s);
    uint64_t n = held_of(in, "k");
    assert_true(n <= HOLDERS * EACH);
    WAIT_UNTIL((n = held_of(in, "k")) == 0, TEST_WAIT_S);
    assert_int_equal(n, 0);
    rate_lease_t l[7];
    rate_decision_t d;
    int got = 0;
    for (int i = 0; i < 7; i++) {
        assert_int_equal(rate_inflight_acquire(in, "k", 1, RATE_LEASE_NORMAL,
                                               &l[got], &d),
                         RATE_OK);
        got += d.allowed;
    }
    assert_int_equal(got, 6);
    rate_inflight_free(in);
    drop_store(s);
    rate_inflight_policy_free(p);
    munmap(sh, sizeof *sh);
}

/* ------------------------------------------------------------ one clock */

/* Leases on Redis go by one clock whoever takes them: the library's
 * default (no clock given) is the wall clock, the one a host sharing the
 * store with others reads; and reaping dead holders, which judges a pid
 * by this host's kernel, is refused. */
static void test_one_clock(void **state)
{
    (void)state;
    rate_store_t *s = store_of("lease-clock:");
    char why[256];
    const char *fail = lease_one_clock(s, "clk", why, sizeof why);
    if (fail != NULL)
        fail_msg("%s", fail);
    rate_inflight_policy_t *p = ipolicy("concurrency 1 ttl=1s");
    rate_inflight_config_t cfg = {.policy = p, .store = s,
                                  .reap_dead_holders = true};
    rate_inflight_t *in = (void *)1;
    assert_int_equal(rate_inflight_new(&cfg, &in), RATE_EINVAL);
    assert_null(in);
    rate_inflight_policy_free(p);
    drop_store(s);
}

/* ---------------------------------------------------------------- faults */

/* How a store makes leases (docs/leases.md, "Leases on Redis"). */
typedef enum { BY_SCRIPT, BY_GENERIC, BY_MODULE } lease_path_t;

/* The server's extra flag for a path: the module loaded, or none. */
static void restart_for(lease_path_t path)
{
#ifdef RATE_MODULE_PATH
    if (path == BY_MODULE) {
        start_server("--loadmodule", RATE_MODULE_PATH);
        return;
    }
#endif
    start_server(NULL, NULL);
}

/* Redis stopped: every call is the store's error, nothing granted; once
 * it runs again (with its data: stopped by SIGSTOP, then killed and
 * restarted empty), the count is what the server holds.  The same on
 * each path leases take: the lease script, the general path (load and
 * compare-and-set), the module's RATELIMIT.LEASE. */
static void run_faults(lease_path_t path)
{
    rate_inflight_policy_t *p = ipolicy("concurrency 2 ttl=1h");
    rate_redis_options_t o = {.prefix = "lease-faults:",
                              .command_timeout_ns = 200 * MS,
                              .connect_timeout_ns = 200 * MS,
                              .breaker_cooldown_ns = 200 * MS,
                              .generic_leases = path == BY_GENERIC,
                              .module = path == BY_MODULE
                                            ? RATE_REDIS_MODULE_ON
                                            : RATE_REDIS_MODULE_OFF};
    rate_store_t *s = NULL;
    char err[256] = "";
    if (path == BY_MODULE) {
        stop_server();
        restart_for(path);
    }
    if (rate_store_redis_new(url, &o, &s, err, sizeof err) != RATE_OK)
        fail_msg("redis store: %s", err);
    rate_inflight_policy_t *brief = ipolicy("concurrency 2 ttl=1s");
    rate_inflight_t *in = inflight(brief, s);
    rate_lease_t a, b;
    rate_decision_t d;

    assert_int_equal(rate_inflight_acquire(in, "f", 1, RATE_LEASE_NORMAL, &a,
                                           &d),
                     RATE_OK);
    assert_true(d.allowed);
    /* Frozen: no answer within the command timeout. */
    kill(server, SIGSTOP);
    int rc = rate_inflight_acquire(in, "f", 1, RATE_LEASE_NORMAL, &b, &d);
    assert_true(rc == RATE_ETIMEDOUT || rc == RATE_ESTORE);
    assert_false(d.allowed);
    assert_int_equal(d.reason, RATE_REASON_STORE_ERROR);
    assert_int_equal(d.error, rc);
    assert_int_equal(b.id, 0);
    rc = rate_inflight_release(in, "f", 1, &a);
    assert_true(rc == RATE_ETIMEDOUT || rc == RATE_ESTORE);
    kill(server, SIGCONT);
    /* Back (after the breaker's cool-down, polled).  A command that timed
     * out may still have run once the server went on (a one-round-trip
     * acquire or release is one command): b may be held, a released. */
    uint64_t n = UINT64_MAX;
    WAIT_UNTIL(rate_inflight_held(in, "f", 1, &n) == RATE_OK, TEST_WAIT_S);
    assert_true(n <= 2);
    rc = rate_inflight_release(in, "f", 1, &a);
    assert_true(rc == RATE_OK || rc == RATE_ELEASE || rc == RATE_EEXPIRED);
    /* Whatever ran, nothing leaks past the TTL: the count comes back to 0
     * (waited for up to TEST_WAIT_S for a 1 s TTL). */
    WAIT_UNTIL((n = held_of(in, "f")) == 0, TEST_WAIT_S);
    assert_int_equal(n, 0);
    rate_inflight_free(in);
    rate_inflight_policy_free(brief);
    in = inflight(p, s);
    /* Killed: errors while down; a restarted empty server holds none. */
    assert_int_equal(rate_inflight_acquire(in, "k", 1, RATE_LEASE_NORMAL, &a,
                                           &d),
                     RATE_OK);
    kill(server, SIGKILL);
    waitpid(server, NULL, 0);
    server = 0;
    rc = rate_inflight_acquire(in, "k", 1, RATE_LEASE_NORMAL, &b, &d);
    assert_true(rc == RATE_ESTORE || rc == RATE_ETIMEDOUT);
    assert_false(d.allowed);
    assert_int_equal(d.reason, RATE_REASON_STORE_ERROR);
    rc = rate_inflight_extend(in, "k", 1, &a, 0);
    assert_true(rc == RATE_ESTORE || rc == RATE_ETIMEDOUT);
    restart_for(path);
    n = UINT64_MAX;
    WAIT_UNTIL(rate_inflight_held(in, "k", 1, &n) == RATE_OK, TEST_WAIT_S);
    assert_int_equal(n, 0); /* lost with the server's data */
    assert_int_equal(rate_inflight_release(in, "k", 1, &a), RATE_ELEASE);
    assert_int_equal(rate_inflight_extend(in, "k", 1, &a, 0), RATE_ELEASE);
    /* Exact again: N granted, then denied, on the restarted server. */
    rate_lease_t two[3];
    for (int i = 0; i < 3; i++) {
        assert_int_equal(rate_inflight_acquire(in, "k", 1, RATE_LEASE_NORMAL,
                                               &two[i], &d),
                         RATE_OK);
        assert_int_equal(d.allowed, i < 2);
    }
    assert_int_equal(held_of(in, "k"), 2);
    for (int i = 0; i < 2; i++)
        assert_int_equal(rate_inflight_release(in, "k", 1, &two[i]), RATE_OK);
    assert_int_equal(held_of(in, "k"), 0);
    rate_inflight_free(in);
    drop_store(s);
    rate_inflight_policy_free(p);
    if (path == BY_MODULE) { /* the other tests' server: no module */
        stop_server();
        start_server(NULL, NULL);
    }
}

static void test_faults(void **state)
{
    (void)state;
    run_faults(BY_SCRIPT);
}

static void test_faults_generic(void **state)
{
    (void)state;
    run_faults(BY_GENERIC);
}

static void test_faults_module(void **state)
{
    (void)state;
#ifdef RATE_MODULE_PATH
    run_faults(BY_MODULE);
#else
    skip(); /* a build without the module (sanitizers) */
#endif
}

/* ------------------------------------------------------------- cluster */

#define CL_KEYS 12
#define CL_THREADS 4
#define CL_ROUNDS 200

typedef struct cl_run {
    rate_inflight_t *in;
    _Atomic int inside[CL_KEYS], most[CL_KEYS];
    _Atomic long errors, granted;
} cl_run_t;

static void *cl_work(void *arg)
{
    cl_run_t *r = arg;
    for (int i = 0; i < CL_ROUNDS; i++) {
        int k = i % CL_KEYS;
        char key[16];
        snprintf(key, sizeof key, "key-%d", k);
        rate_lease_t l;
        rate_decision_t d;
        if (rate_inflight_acquire(r->in, key, strlen(key), RATE_LEASE_NORMAL,
                                  &l, &d) != RATE_OK) {
            r->errors++;
            continue;
        }
        if (!d.allowed)
            continue;
        int now = ++r->inside[k];
        for (int m = r->most[k]; now > m;)
            if (atomic_compare_exchange_weak(&r->most[k], &m, now))
                break;
        r->granted++;
        struct timespec ts = {0, 100000};
        nanosleep(&ts, NULL);
        r->inside[k]--;
        if (rate_inflight_release(r->in, key, strlen(key), &l) != RATE_OK)
            r->errors++;
    }
    return NULL;
}

static void test_cluster(void **state)
{
    (void)state;
    rcluster_t cl;
    if (!rcl_start(&cl))
        skip(); /* no redis-cli --cluster here */
    char curl[512];
    rcl_url(&cl, curl, sizeof curl);
    rate_store_t *s = NULL;
    char err[256] = "";
    if (rate_store_redis_new(curl, NULL, &s, err, sizeof err) != RATE_OK) {
        rcl_stop(&cl);
        fail_msg("cluster store: %s", err);
    }
    rate_inflight_policy_t *p = ipolicy("concurrency 2 ttl=1h");
    cl_run_t r = {.in = inflight(p, s)};
    assert_non_null(r.in);
    pthread_t th[CL_THREADS];
    for (int t = 0; t < CL_THREADS; t++)
        assert_int_equal(pthread_create(&th[t], NULL, cl_work, &r), 0);
    for (int t = 0; t < CL_THREADS; t++)
        pthread_join(th[t], NULL);
    assert_int_equal(r.errors, 0);
    assert_true(r.granted >= CL_ROUNDS);
    rate_lease_t one[CL_KEYS];
    for (int k = 0; k < CL_KEYS; k++) {
        char key[16];
        rate_decision_t d;
        snprintf(key, sizeof key, "key-%d", k);
        assert_true(r.most[k] <= 2);
        assert_int_equal(held_of(r.in, key), 0);
        assert_int_equal(rate_inflight_acquire(r.in, key, strlen(key),
                                               RATE_LEASE_NORMAL, &one[k], &d),
                         RATE_OK);
        assert_true(d.allowed);
    }
    /* Held now, the keys are on more than one master. */
    int masters = 0;
    for (int i = 0; i < RCL_NODES; i++)
        masters += rcl_is_master(&cl, i) && rcl_keys_on(&cl, i, "") > 0;
    assert_true(masters >= 2);
    for (int k = 0; k < CL_KEYS; k++) {
        char key[16];
        snprintf(key, sizeof key, "key-%d", k);
        assert_int_equal(rate_inflight_release(r.in, key, strlen(key),
                                               &one[k]),
                         RATE_OK);
        assert_int_equal(held_of(r.in, key), 0);
    }
    rate_inflight_free(r.in);
    rate_inflight_policy_free(p);
    rate_store_free(s);
    rcl_stop(&cl);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_procs),
        cmocka_unit_test(test_chaos),
        cmocka_unit_test(test_one_clock),
        cmocka_unit_test(test_faults),
        cmocka_unit_test(test_faults_generic),
        cmocka_unit_test(test_faults_module),
        cmocka_unit_test(test_cluster),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
