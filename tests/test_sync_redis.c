/* SPDX-License-Identifier: MIT */
/*
 * The synced mode across processes, against a private redis-server: K
 * processes x M threads on one key and on many keys (the admitted total
 * never above the remote's exact bound from a cold start, and the
 * remote's room after the clean exits exactly what was not admitted), a
 * process killed mid-run (it loses at most its lease), and Redis killed
 * and restarted mid-run (decisions go on under the fail mode and the
 * leases come back by themselves).  Each count is an atomic in memory
 * shared by the processes, added to as each decision is made.
 */
#include "lib/redis_fixture.h"

#include <pthread.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include "ratelimit_redis.h"
#include "ratelimit_synced.h"
#include "lib/wait.h"

#define PROCS 3
#define THREADS 3
#define LEASE 10
#define BURST 300
/* a bucket that refills 1 per hour: over a run of seconds, its exact
 * bound from a cold start is BURST + 1 per key */
#define POLICY "token-bucket 1/h burst=300"
/* one that keeps asking Redis (a denial's retry_after is a millisecond) */
#define FAST "token-bucket 1000/s burst=300"

typedef struct shared {
    _Atomic uint64_t admitted[PROCS];
    _Atomic uint64_t store_errors;
    _Atomic int stop;
    _Atomic int restarted;
    _Atomic uint64_t admitted_after; /* admitted once restarted was set */
} shared_t;

static shared_t *sh;

typedef struct run {
    const char *prefix;
    int keys;          /* keys k0..k{keys-1} */
    int attempts;      /* per thread; 0: until sh->stop */
    int proc;
    rate_synced_t *s;
    const char *policy; /* NULL: POLICY */
    bool linger;        /* after its attempts, wait to be killed */
    uint64_t lease;     /* 0: LEASE */
    bool prefetch;
} run_t;

static uint64_t lcg(uint64_t *x)
{
    *x = *x * 6364136223846793005u + 1442695040888963407u;
    return *x >> 33;
}

typedef struct thr {
    run_t *r;
    int id;
} thr_t;

static void *thread_main(void *arg)
{
    thr_t *t = arg;
    run_t *r = t->r;
    uint64_t x = (uint64_t)(r->proc * 100 + t->id + 1);
    char key[16];
    for (int i = 0; r->attempts == 0 ? !atomic_load(&sh->stop)
                                      : i < r->attempts;
         i++) {
        snprintf(key, sizeof key, "k%d", (int)(lcg(&x) % (uint64_t)r->keys));
        rate_decision_t d;
        if (rate_synced_check(r->s, key, strlen(key), 1, &d) != RATE_OK)
            continue;
        if (d.allowed) {
            atomic_fetch_add(&sh->admitted[r->proc], 1);
            if (atomic_load(&sh->restarted))
                atomic_fetch_add(&sh->admitted_after, 1);
        }
        if (d.reason == RATE_REASON_STORE_ERROR)
            atomic_fetch_add(&sh->store_errors, 1);
        if (r->attempts == 0 && !d.allowed)
            usleep(100); /* a client backing off */
    }
    return NULL;
}

/* A process of the fleet: its own store and synced limiter, THREADS
 * threads, then the clean exit (the leases handed back). */
static void child(run_t r)
{
    rate_redis_options_t o = {0};
    rate_store_t *rs = NULL;
    o.prefix = r.prefix;
    /* 1 s: a loaded machine's slowest answer is not an outage (a killed
     * Redis fails at once: connection refused) */
    o.command_timeout_ns = SEC;
    o.connect_timeout_ns = SEC;
    if (rate_store_redis_new(url, &o, &rs, NULL, 0) != RATE_OK)
        _exit(3);
    rate_policy_t *p = NULL;
    rate_policy_parse(r.policy != NULL ? r.policy : POLICY, &p, NULL, 0);
    rate_synced_config_t c = {0};
    c.policy = p;
    c.remote = rs;
    c.lease = r.lease != 0 ? r.lease : LEASE;
    c.prefetch = r.prefetch;
    c.lease_ttl_ns = 60 * SEC;
    c.retry_ns = 50 * MS;
    if (rate_synced_new(&c, &r.s, NULL, 0) != RATE_OK)
        _exit(4);
    pthread_t th[THREADS];
    thr_t t[THREADS];
    for (int i = 0; i < THREADS; i++) {
        t[i] = (thr_t){&r, i};
        pthread_create(&th[i], NULL, thread_main, &t[i]);
    }
    for (int i = 0; i < THREADS; i++)
        pthread_join(th[i], NULL);
    while (r.linger)
        pause();
    rate_synced_free(r.s);
    rate_policy_free(p);
    rate_store_free(rs);
    _exit(0);
}

static pid_t spawn(run_t r)
{
    pid_t pid = fork();
    if (pid == 0)
        child(r);
    assert_true(pid > 0);
    return pid;
}

static void reap(pid_t pid, bool killed)
{
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    if (killed)
        assert_true(WIFSIGNALED(status));
    else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fail_msg("process %d ended with status %d", (int)pid, status);
}

static void reset_shared(void)
{
    if (sh == NULL) {
        sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE,
                  MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        assert_true(sh != MAP_FAILED);
    }
    memset(sh, 0, sizeof *sh);
}

static uint64_t total(void)
{
    uint64_t n = 0;
    for (int p = 0; p < PROCS; p++)
        n += atomic_load(&sh->admitted[p]);
    return n;
}

/* Whether every process has admitted n or more. */
static bool each_admitted(uint64_t n)
{
    for (int p = 0; p < PROCS; p++)
        if (atomic_load(&sh->admitted[p]) < n)
            return false;
    return true;
}

/* The room Redis has left over keys k0..k{keys-1} (queries, on its TIME). */
static uint64_t room(rate_store_t *rs, int keys, const char *policy)
{
    rate_limiter_t *l = limiter_of(policy, rs);
    uint64_t left = 0;
    char key[16];
    for (int k = 0; k < keys; k++) {
        rate_decision_t d;
        snprintf(key, sizeof key, "k%d", k);
        assert_int_equal(rate_limiter_check(l, key, strlen(key), 0, 0, &d),
                         RATE_OK);
        assert_int_not_equal(d.reason, RATE_REASON_STORE_ERROR);
        left += d.remaining;
    }
    rate_limiter_free(l);
    return left;
}

static void fleet(const char *prefix, int keys, int attempts, uint64_t lease,
                  bool prefetch)
{
    reset_shared();
    pid_t pid[PROCS];
    for (int p = 0; p < PROCS; p++)
        pid[p] = spawn((run_t){prefix, keys, attempts, p, NULL, NULL, false,
                               lease, prefetch});
    for (int p = 0; p < PROCS; p++)
        reap(pid[p], false);
    uint64_t admitted = total(), exact = (uint64_t)keys * BURST;
    rate_store_t *rs = redis_store(prefix, false, 0);
    uint64_t left = room(rs, keys, POLICY);
    drop_store(rs);
    print_message("%d keys, L %llu%s: admitted %llu of exact %llu, left "
                  "%llu\n", keys, (unsigned long long)lease,
                  prefetch ? " prefetch" : "", (unsigned long long)admitted,
                  (unsigned long long)exact, (unsigned long long)left);
    if (admitted > exact + (uint64_t)keys) /* + the hour's refill */
        fail_msg("%d keys: admitted %llu > exact bound %llu", keys,
                 (unsigned long long)admitted, (unsigned long long)exact);
    /* every lease handed back: the remote's room is what was not admitted */
    assert_int_equal(left + admitted, exact);
    /* the demand (twice the bound) drained each key: what is left is at
     * most what the processes handed back as they ended, P x L a key */
    if (left > (uint64_t)keys * PROCS * lease)
        fail_msg("%d keys: %llu left unadmitted > P x L x keys", keys,
                 (unsigned long long)left);
    assert_int_equal(atomic_load(&sh->store_errors), 0);
}

static void fleet_on_one_key(void **state)
{
    (void)state;
    /* 3 x 3 threads x 70 = 630 asks of one key of 300 */
    static const uint64_t leases[] = {1, 10, 50};
    for (int i = 0; i < 3; i++)
        fleet("sync1:", 1, 70, leases[i], false);
    fleet("sync1:", 1, 70, 50, true);
}

static void fleet_on_many_keys(void **state)
{
    (void)state;
    /* 20 keys of 300: 6000; 9 threads x 1500 = 13500 asks */
    fleet("syncn:", 20, 1500, 10, false);
    fleet("syncn:", 20, 1500, 50, true);
}

/* A process killed mid-run loses at most its lease, exactly what it held:
 * process 0 makes 15 decisions (two leases of 10 borrowed, 5 held) and is
 * killed while the others drain the key; the remote's room afterwards is
 * exact - admitted - 5. */
static void process_killed_mid_run(void **state)
{
    (void)state;
    reset_shared();
    const char *prefix = "synck:";
    pid_t pid[PROCS];
    pid[0] = spawn((run_t){prefix, 1, 5, 0, NULL, NULL, true, 0, false});
    WAIT_UNTIL(atomic_load(&sh->admitted[0]) >= 15, TEST_WAIT_S);
    assert_int_equal(atomic_load(&sh->admitted[0]), 15);
    for (int p = 1; p < PROCS; p++)
        pid[p] = spawn((run_t){prefix, 1, 0, p, NULL, NULL, false, 0, false});
    /* the others admitted some (a count, not a time) */
    assert_true(WAIT_UNTIL(total() >= 15 + 2 * (PROCS - 1), TEST_WAIT_S));
    kill(pid[0], SIGKILL); /* mid-run: the others are deciding */
    reap(pid[0], true);
    /* (the others go on a while: what follows holds however far they got) */
    usleep(200000);
    atomic_store(&sh->stop, 1);
    for (int p = 1; p < PROCS; p++)
        reap(pid[p], false);
    uint64_t admitted = total();
    rate_store_t *rs = redis_store(prefix, false, 0);
    uint64_t left = room(rs, 1, POLICY);
    drop_store(rs);
    assert_true(admitted <= BURST + 1);
    assert_true(left + admitted <= BURST);
    uint64_t lost = BURST - admitted - left;
    print_message("killed: admitted %llu, left %llu, lost %llu\n",
                  (unsigned long long)admitted, (unsigned long long)left,
                  (unsigned long long)lost);
    if (lost > LEASE)
        fail_msg("lost %llu > the lease %d", (unsigned long long)lost, LEASE);
    assert_int_equal(lost, 2 * LEASE - 15); /* what it held */
}

/* Redis killed and restarted mid-run: decisions go on (fail closed past
 * the leases held), the synced limiters borrow from the new Redis by
 * themselves, and the total stays within two cold starts' bounds (a
 * Redis that comes back empty starts the key anew). */
static void remote_killed_and_restarted(void **state)
{
    (void)state;
    reset_shared();
    const char *prefix = "syncr:";
    pid_t pid[PROCS];
    for (int p = 0; p < PROCS; p++)
        pid[p] = spawn((run_t){prefix, 1, 0, p, NULL, FAST, false, 0, false});
    uint64_t t0 = rate_clock_monotonic_ns();
    /* Counts, not times: every process at work (each admitted some: a
     * process not yet connected when Redis stops cannot make its store),
     * then the outage seen, then (past the store's reconnect backoff) more
     * admitted after the restart than all the leases held before it. */
    WAIT_UNTIL(each_admitted(LEASE), TEST_WAIT_S);
    uint64_t before = total();
    stop_server();
    WAIT_UNTIL(atomic_load(&sh->store_errors) >= PROCS, TEST_WAIT_S);
    start_server(NULL, NULL);
    atomic_store(&sh->restarted, 1);
    WAIT_UNTIL(atomic_load(&sh->admitted_after) > 2 * PROCS * LEASE,
               TEST_WAIT_S);
    atomic_store(&sh->stop, 1);
    for (int p = 0; p < PROCS; p++)
        reap(pid[p], false);
    uint64_t elapsed = rate_clock_monotonic_ns() - t0;
    uint64_t admitted = total();
    rate_store_t *rs = redis_store(prefix, false, 0);
    drop_store(rs);
    assert_true(before > 0);
    assert_true(atomic_load(&sh->store_errors) > 0); /* the outage seen */
    print_message("restart: admitted %llu (%llu before, %llu after), %llu "
                  "store errors, %.2f s\n", (unsigned long long)admitted,
                  (unsigned long long)before,
                  (unsigned long long)atomic_load(&sh->admitted_after),
                  (unsigned long long)atomic_load(&sh->store_errors),
                  (double)elapsed / 1e9);
    /* two cold starts (Redis comes back empty), plus the refill */
    uint64_t bound = 2 * BURST + 1000 * elapsed / SEC + 2;
    if (admitted > bound)
        fail_msg("admitted %llu > two cold starts' bound %llu",
                 (unsigned long long)admitted, (unsigned long long)bound);
    /* the new Redis lent leases: recovery by itself (more admitted after
     * the restart than all the leases held before it) */
    if (atomic_load(&sh->admitted_after) <= PROCS * LEASE)
        fail_msg("admitted after the restart: %llu",
                 (unsigned long long)atomic_load(&sh->admitted_after));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(fleet_on_one_key),
        cmocka_unit_test(fleet_on_many_keys),
        cmocka_unit_test(process_killed_mid_run),
        cmocka_unit_test(remote_killed_and_restarted),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
