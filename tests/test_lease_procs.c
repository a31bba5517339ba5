/* SPDX-License-Identifier: MIT */
/*
 * In-flight limits across processes on one shared-memory region
 * (docs/leases.md, "Stores, processes and crashes"):
 *   - forked processes of several threads each acquire and release one
 *     key; every holder counts itself in a shared page while it holds,
 *     and the most ever counted is at most N;
 *   - chaos: holders killed with SIGKILL while holding lose exactly their
 *     leases: an acquire with reap_dead_holders takes back the dead ones'
 *     and no live one's; without reaping, their leases come back when
 *     their TTL runs out.  The count is exact after each;
 *   - a reaper in another PID namespace never takes a live holder's
 *     lease (its pid means another process there, or none).
 * Times: no assertion depends on how fast the machine is; the one wait
 * (a TTL of 300 ms running out) is polled up to 60 s, a slack of 200
 * times the TTL for a loaded machine.
 */
#include <errno.h>
#include <pthread.h>
#include <sched.h> /* unshare (the build defines _GNU_SOURCE) */
#include <signal.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <ratelimit_lease.h>
#include <ratelimit_shm.h>

#include "lib/helpers.h"
#include "lib/lease_holders.h"
#include "lib/wait.h"

static char path[128];

static int setup(void **state)
{
    (void)state;
    snprintf(path, sizeof path, "/dev/shm/rl-test-lease-%ld", (long)getpid());
    unlink(path);
    return 0;
}

/* Holders still alive after a test (one that failed): killed here. */
static pid_t alive[8];
static int n_alive;

static int teardown(void **state)
{
    (void)state;
    for (int i = 0; i < n_alive; i++)
        if (alive[i] > 0 && kill(alive[i], SIGKILL) == 0)
            waitpid(alive[i], NULL, 0);
    n_alive = 0;
    unlink(path);
    return 0;
}

/* The region: sized for the policy's largest lease state. */
static rate_store_t *attach(const rate_inflight_policy_t *p)
{
    rate_shm_options_t o = {
        .max_keys = 256,
        .state_max = (uint32_t)rate_inflight_policy_state_max(p)};
    rate_store_t *s = NULL;
    char err[256] = "";
    if (rate_store_shm_new(path, &o, &s, err, sizeof err) != RATE_OK)
        fail_msg("%s: %s", path, err);
    return s;
}

static rate_inflight_policy_t *ipolicy(const char *text)
{
    rate_inflight_policy_t *p = NULL;
    char err[256] = "";
    if (rate_inflight_policy_parse(text, &p, err, sizeof err) != RATE_OK)
        fail_msg("policy '%s': %s", text, err);
    return p;
}

static rate_inflight_t *inflight(const rate_inflight_policy_t *p,
                                 rate_store_t *s, bool reap)
{
    rate_inflight_config_t cfg = {.policy = p, .store = s,
                                  .reap_dead_holders = reap};
    rate_inflight_t *in = NULL;
    if (rate_inflight_new(&cfg, &in) != RATE_OK)
        return NULL;
    return in;
}

static uint64_t held_of(rate_inflight_t *in, const char *key)
{
    uint64_t n = UINT64_MAX;
    assert_int_equal(rate_inflight_held(in, key, strlen(key), &n), RATE_OK);
    return n;
}

/* ------------------------------------------------ processes x threads */

#define PROCS 4
#define PTHREADS 3
#define ROUNDS 1500
#define CAP 4

typedef lease_tally_t shared_t;

static void test_procs(void **state)
{
    (void)state;
    rate_inflight_policy_t *p = ipolicy("concurrency 4 ttl=1h");
    rate_store_free(attach(p)); /* create the region */
    shared_t *sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE,
                        MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    assert_true(sh != MAP_FAILED);
    memset(sh, 0, sizeof *sh);
    pid_t pids[PROCS];
    for (int k = 0; k < PROCS; k++) {
        assert_true((pids[k] = fork()) >= 0);
        if (pids[k] == 0) {
            rate_store_t *s = NULL;
            rate_inflight_t *in;
            if (rate_store_shm_new(path, NULL, &s, NULL, 0) != RATE_OK ||
                (in = inflight(p, s, true)) == NULL)
                _exit(1);
            lease_holder_t w = {in, sh, ROUNDS, 20000};
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
    assert_true(sh->most >= 2); /* they did overlap */
    assert_int_equal(sh->granted + sh->denied, (long)PROCS * PTHREADS * ROUNDS);
    rate_store_t *s = attach(p);
    rate_inflight_t *in = inflight(p, s, false);
    assert_int_equal(held_of(in, "hot"), 0);
    rate_inflight_free(in);
    rate_store_free(s);
    rate_inflight_policy_free(p);
    munmap(sh, sizeof *sh);
}

/* ----------------------------------------------------------------- chaos */

#define HOLDERS 4
#define EACH 2

/* A child that takes `EACH` leases of "k", says so, and sleeps. */
static pid_t holder(const rate_inflight_policy_t *p, shared_t *sh)
{
    pid_t pid = fork();
    if (pid != 0) {
        if (pid > 0 && n_alive < 8)
            alive[n_alive++] = pid;
        return pid;
    }
    /* A failed assertion in the parent leaves no holder behind. */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() == 1)
        _exit(4);
    rate_store_t *s = NULL;
    rate_inflight_t *in;
    if (rate_store_shm_new(path, NULL, &s, NULL, 0) != RATE_OK ||
        (in = inflight(p, s, false)) == NULL)
        _exit(1);
    for (int i = 0; i < EACH; i++) {
        rate_lease_t l;
        rate_decision_t d;
        if (rate_inflight_acquire(in, "k", 1, RATE_LEASE_NORMAL, &l, &d) !=
                RATE_OK ||
            !d.allowed)
            _exit(3);
    }
    sh->ready++;
    for (;;)
        pause();
}

static void wait_ready(shared_t *sh, int n)
{
    WAIT_UNTIL(sh->ready >= n, TEST_WAIT_S);
    assert_int_equal(sh->ready, n);
}

static void kill_and_wait(pid_t pid)
{
    int status;
    for (int i = 0; i < n_alive; i++)
        if (alive[i] == pid)
            alive[i] = 0;
    assert_int_equal(kill(pid, SIGKILL), 0);
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
}

/* Two of four holders killed: reaping takes back exactly their leases. */
static void test_chaos_reap(void **state)
{
    (void)state;
    rate_inflight_policy_t *p = ipolicy("concurrency 8 ttl=1h");
    rate_store_t *s = attach(p);
    shared_t *sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE,
                        MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    assert_true(sh != MAP_FAILED);
    memset(sh, 0, sizeof *sh);
    pid_t pids[HOLDERS];
    for (int k = 0; k < HOLDERS; k++)
        assert_true((pids[k] = holder(p, sh)) > 0);
    wait_ready(sh, HOLDERS);

    rate_inflight_t *plain = inflight(p, s, false);
    rate_inflight_t *reaper = inflight(p, s, true);
    rate_lease_t l[8];
    rate_decision_t d;
    assert_int_equal(held_of(plain, "k"), HOLDERS * EACH);
    kill_and_wait(pids[0]);
    kill_and_wait(pids[2]);
    /* Dead holders' leases still count until someone looks. */
    assert_int_equal(held_of(plain, "k"), HOLDERS * EACH);
    assert_int_equal(rate_inflight_acquire(plain, "k", 1, RATE_LEASE_NORMAL,
                                           &l[0], &d),
                     RATE_OK);
    assert_false(d.allowed);
    /* The reaper takes exactly the dead ones' 4 back, then is full. */
    int got = 0;
    for (int i = 0; i < 8; i++) {
        assert_int_equal(rate_inflight_acquire(reaper, "k", 1,
                                               RATE_LEASE_NORMAL, &l[got], &d),
                         RATE_OK);
        got += d.allowed;
    }
    assert_int_equal(got, 2 * EACH);
    assert_int_equal(held_of(plain, "k"), HOLDERS * EACH);
    for (int i = 0; i < got; i++)
        assert_int_equal(rate_inflight_release(reaper, "k", 1, &l[i]),
                         RATE_OK);
    assert_int_equal(held_of(plain, "k"), (HOLDERS - 2) * EACH);
    kill_and_wait(pids[1]);
    kill_and_wait(pids[3]);
    rate_inflight_free(plain);
    rate_inflight_free(reaper);
    rate_store_free(s);
    rate_inflight_policy_free(p);
    munmap(sh, sizeof *sh);
}

/* Every holder killed, no reaping: the leases come back by expiry. */
static void test_chaos_expiry(void **state)
{
    (void)state;
    rate_inflight_policy_t *p = ipolicy("concurrency 8 ttl=300ms");
    rate_store_t *s = attach(p);
    shared_t *sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE,
                        MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    assert_true(sh != MAP_FAILED);
    memset(sh, 0, sizeof *sh);
    pid_t pids[HOLDERS];
    for (int k = 0; k < HOLDERS; k++)
        assert_true((pids[k] = holder(p, sh)) > 0);
    wait_ready(sh, HOLDERS);
    uint64_t killed_at = rate_clock_monotonic_ns();
    for (int k = 0; k < HOLDERS; k++)
        kill_and_wait(pids[k]);

    rate_inflight_t *in = inflight(p, s, false);
    uint64_t n = held_of(in, "k");
    assert_true(n <= HOLDERS * EACH);
    /* Each lease is gone by its TTL after it was taken (before the kill):
     * the reclaim must come within the TTL (300 ms) plus a slack of 5 s
     * for a loaded machine's polling. */
    WAIT_UNTIL((n = held_of(in, "k")) == 0, TEST_WAIT_S);
    uint64_t gone_at = rate_clock_monotonic_ns();
    assert_int_equal(n, 0);
    assert_true(gone_at - killed_at <= 300 * MS + 5 * SEC);
    /* The whole capacity is back, exactly. */
    rate_lease_t l[9];
    rate_decision_t d;
    int got = 0;
    for (int i = 0; i < 9; i++) {
        assert_int_equal(rate_inflight_acquire(in, "k", 1, RATE_LEASE_NORMAL,
                                               &l[got], &d),
                         RATE_OK);
        got += d.allowed;
    }
    assert_int_equal(got, 8);
    rate_inflight_free(in);
    rate_store_free(s);
    rate_inflight_policy_free(p);
    munmap(sh, sizeof *sh);
}

/* A region too small for the policy's states (14 + 24 N bytes past its
 * state_max): refused when the inflight object is made, not at the lease
 * past the first few (RATE_EFULL, "no room for a new key"); one that
 * holds them takes every lease. */
static void test_small_region(void **state)
{
    (void)state;
    rate_shm_options_t o = {.max_keys = 64}; /* state_max 96: 3 leases */
    rate_store_t *s = NULL;
    assert_int_equal(rate_store_shm_new(path, &o, &s, NULL, 0), RATE_OK);
    rate_inflight_policy_t *p = ipolicy("concurrency 4 ttl=1h");
    rate_inflight_config_t cfg = {.policy = p, .store = s};
    rate_inflight_t *in = NULL;
    assert_int_equal(rate_inflight_new(&cfg, &in), RATE_EPOLICY);
    assert_null(in);
    rate_inflight_policy_free(p);
    p = ipolicy("concurrency 3 ttl=1h");
    in = inflight(p, s, false);
    rate_lease_t l;
    rate_decision_t d;
    for (int i = 0; i < 3; i++) {
        assert_int_equal(rate_inflight_acquire(in, "k", 1, RATE_LEASE_NORMAL,
                                               &l, &d),
                         RATE_OK);
        assert_true(d.allowed);
    }
    assert_int_equal(rate_inflight_acquire(in, "k", 1, RATE_LEASE_NORMAL, &l,
                                           &d),
                     RATE_OK);
    assert_false(d.allowed); /* the limit, not the store */
    assert_int_equal(held_of(in, "k"), 3);
    rate_inflight_free(in);
    rate_inflight_policy_free(p);
    rate_store_free(s);
}

/* An inflight object made before fork() (as an nginx master makes a
 * shared-memory store before its workers): the child's leases carry the
 * child's pid, so a dead child's lease is reaped, and its ids are not the
 * parent's (a release by one never takes the other's lease). */
static void test_fork_after_new(void **state)
{
    (void)state;
    rate_inflight_policy_t *p = ipolicy("concurrency 2 ttl=1h");
    rate_store_t *s = attach(p);
    rate_inflight_t *in = inflight(p, s, true);
    assert_non_null(in);
    int fd[2];
    assert_int_equal(pipe(fd), 0);
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) { /* acquires, tells its id, dies holding it */
        rate_lease_t l;
        rate_decision_t d;
        uint64_t id = 0;
        if (rate_inflight_acquire(in, "f", 1, RATE_LEASE_NORMAL, &l, &d) ==
                RATE_OK &&
            d.allowed)
            id = l.id;
        if (write(fd[1], &id, sizeof id) != (ssize_t)sizeof id)
            _exit(2);
        raise(SIGKILL);
        _exit(3);
    }
    alive[n_alive++] = child;
    uint64_t child_id = 0;
    assert_int_equal(read(fd[0], &child_id, sizeof child_id),
                     (ssize_t)sizeof child_id);
    int st;
    assert_int_equal(waitpid(child, &st, 0), child);
    n_alive = 0;
    assert_true(WIFSIGNALED(st));
    assert_true(child_id != 0);
    close(fd[0]);
    close(fd[1]);

    rate_lease_t mine, more;
    rate_decision_t d;
    assert_int_equal(rate_inflight_acquire(in, "f", 1, RATE_LEASE_NORMAL,
                                           &mine, &d),
                     RATE_OK);
    assert_true(d.allowed);
    if (mine.id == child_id)
        fail_msg("the parent's lease has the child's id %llu",
                 (unsigned long long)child_id);
    /* Full: the dead child's lease is reaped, the acquire granted. */
    assert_int_equal(rate_inflight_acquire(in, "f", 1, RATE_LEASE_NORMAL,
                                           &more, &d),
                     RATE_OK);
    assert_true(d.allowed);
    assert_int_equal(held_of(in, "f"), 2);
    assert_int_equal(rate_inflight_release(in, "f", 1, &mine), RATE_OK);
    assert_int_equal(rate_inflight_release(in, "f", 1, &more), RATE_OK);
    assert_int_equal(held_of(in, "f"), 0);
    rate_inflight_free(in);
    rate_store_free(s);
    rate_inflight_policy_free(p);
}

/* A holder's pid is judged only in its own PID namespace: a process in
 * a new one (where the holder's pid is no process) that reaps dead
 * holders does not take this live holder's lease.  Skipped where this
 * process may not make a PID namespace. */
static void test_pid_namespaces(void **state)
{
    (void)state;
    rate_inflight_policy_t *p = ipolicy("concurrency 1 ttl=1h");
    rate_store_t *s = attach(p);
    rate_inflight_t *in = inflight(p, s, true);
    rate_lease_t mine;
    rate_decision_t d;
    assert_int_equal(rate_inflight_acquire(in, "ns", 2, RATE_LEASE_NORMAL,
                                           &mine, &d),
                     RATE_OK);
    assert_true(d.allowed);
    int fd[2];
    assert_int_equal(pipe(fd), 0);
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) { /* its next child is pid 1 of a new namespace */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (unshare(CLONE_NEWPID) != 0)
            _exit(errno == EPERM || errno == EINVAL ? 77 : 2);
        pid_t inner = fork();
        if (inner == 0) { /* reaps, then acquires: 1 granted, 0 not */
            rate_store_t *cs = NULL;
            rate_inflight_t *ci;
            rate_lease_t l;
            int32_t got = -1;
            if (rate_store_shm_new(path, NULL, &cs, NULL, 0) == RATE_OK &&
                (ci = inflight(p, cs, true)) != NULL &&
                rate_inflight_acquire(ci, "ns", 2, RATE_LEASE_NORMAL, &l,
                                      &d) == RATE_OK)
                got = d.allowed;
            _exit(write(fd[1], &got, sizeof got) == (ssize_t)sizeof got
                      ? 0
                      : 3);
        }
        int st = 0;
        if (inner < 0 || waitpid(inner, &st, 0) != inner)
            _exit(4);
        _exit(WIFEXITED(st) ? WEXITSTATUS(st) : 5);
    }
    alive[n_alive++] = child;
    int st;
    assert_int_equal(waitpid(child, &st, 0), child);
    n_alive = 0;
    close(fd[1]);
    assert_true(WIFEXITED(st));
    if (WEXITSTATUS(st) == 77) {
        close(fd[0]);
        rate_inflight_free(in);
        rate_store_free(s);
        rate_inflight_policy_free(p);
        skip();
    }
    assert_int_equal(WEXITSTATUS(st), 0);
    int32_t got = -1;
    assert_int_equal(read(fd[0], &got, sizeof got), (ssize_t)sizeof got);
    close(fd[0]);
    assert_int_equal(got, 0); /* denied: this live holder kept its lease */
    assert_int_equal(held_of(in, "ns"), 1);
    assert_int_equal(rate_inflight_release(in, "ns", 2, &mine), RATE_OK);
    rate_inflight_free(in);
    rate_store_free(s);
    rate_inflight_policy_free(p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_procs, setup, teardown),
        cmocka_unit_test_setup_teardown(test_chaos_reap, setup, teardown),
        cmocka_unit_test_setup_teardown(test_chaos_expiry, setup, teardown),
        cmocka_unit_test_setup_teardown(test_small_region, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fork_after_new, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pid_namespaces, setup,
                                        teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
