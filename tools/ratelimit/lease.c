/* SPDX-License-Identifier: MIT */
/*
 * ratelimit check with an in-flight policy (docs/leases.md): acquire a
 * lease of the key, run the command, extend the lease while it runs,
 * release it when it ends, however it ends.  For shell jobs: at most N
 * backups at once per host (--store shm:PATH) or per fleet (redis://).
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "ratelimit_lease.h"
#include "ratelimit_shm.h"

/* The bytes a lease's store key adds to the key (RATE_KEY_MAX less
 * RATE_LEASE_KEY_MAX). */
#define LEASE_KEY_EXTRA ((unsigned)(RATE_KEY_MAX - RATE_LEASE_KEY_MAX))

/* The state_max a region needs for the policy: its lease states and
 * those of its rate clauses. */
static size_t shm_need(const rate_inflight_policy_t *p)
{
    size_t need = rate_inflight_policy_state_max(p);
    const rate_policy_t *rate = rate_inflight_policy_rate(p);
    size_t r = rate != NULL ? rate_store_shm_state_size(rate) : 0;
    return r > need ? r : need;
}

/* The store: shm:PATH sized for the policy's lease states, else as every
 * command's --store.  An existing region of other sizes (made by another
 * policy's check) is used as it is when its states are room enough. */
static int lease_store(const char *spec, const rate_inflight_policy_t *p,
                       uint64_t max_keys, rate_store_t **out)
{
    if (strncmp(spec, "shm:", 4) != 0)
        return store_from_opt("check", spec, false, max_keys, out);
    size_t need = shm_need(p);
    rate_shm_options_t o = {
        .max_keys = max_keys != 0 ? max_keys : 65536,
        .key_max = CLI_SHM_KEY_MAX,
        .state_max = (uint32_t)need};
    char err[256];
    if (o.state_max < 96)
        o.state_max = 96; /* room for the rate policies of other calls */
    if (spec[4] == '\0')
        return cli_fail("check: --store shm:PATH needs a PATH "
                        "(shm:/dev/shm/NAME)");
    int rc = rate_store_shm_new(spec + 4, &o, out, err, sizeof err);
    if (rc == RATE_EINVAL && access(spec + 4, F_OK) == 0) {
        rate_shm_options_t as = {.no_create = true, .max_keys = max_keys};
        rate_shm_info_t info;
        rc = rate_store_shm_new(spec + 4, &as, out, err, sizeof err);
        if (rc == RATE_OK && rate_store_shm_info(*out, &info) == RATE_OK &&
            info.state_max < need) {
            rate_store_free(*out);
            *out = NULL;
            return cli_fail("check: --store %s: the region keeps states of "
                            "up to %u bytes, the policy's take %zu (a region "
                            "made for a smaller policy: use another PATH)",
                            spec, (unsigned)info.state_max, need);
        }
    }
    if (rc != RATE_OK)
        return cli_fail("check: --store %s: %s", spec, err);
    return 0;
}

static void print_decision(const rate_decision_t *d)
{
    printf("decision %s\n", d->allowed ? "allow" : "deny");
    printf("reason %s\n", rate_reason_name(d->reason));
    printf("component %d\n", d->component);
    printf("limit %llu\n", (unsigned long long)d->limit);
    printf("remaining %llu\n", (unsigned long long)d->remaining);
    printf("retry_after %.9f\n",
           d->allowed ? 0.0 : (double)d->retry_after_ns / 1e9);
    fflush(stdout);
}

/* Starts the command.  It dies with its holder (PR_SET_PDEATHSIG): a check
 * killed outright must not leave it running while its lease is taken back.
 * The parent check closes the race of a holder dying before the prctl. */
static pid_t spawn(char **cmd, const sigset_t *old)
{
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid == 0) {
        if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent)
            _exit(128 + SIGKILL);
        sigprocmask(SIG_SETMASK, old, NULL);
        execvp(cmd[0], cmd);
        fprintf(stderr, "ratelimit: check: %s: %s\n", cmd[0], strerror(errno));
        _exit(127);
    }
    return pid;
}

/* Waits for the command, extending the lease every third of its TTL and
 * passing SIGINT, SIGTERM and SIGHUP on.  Returns the command's status as
 * a shell would report it. */
static int supervise(rate_inflight_t *in, const char *key, rate_lease_t *lease,
                     uint64_t ttl_ns, pid_t child, const sigset_t *set)
{
    uint64_t every = ttl_ns / 3 > 0 ? ttl_ns / 3 : 1;
    for (;;) {
        int status;
        pid_t r = waitpid(child, &status, WNOHANG);
        if (r == child)
            return WIFEXITED(status) ? WEXITSTATUS(status)
                                     : 128 + WTERMSIG(status);
        struct timespec ts = {(time_t)(every / RATE_NS_PER_S),
                              (long)(every % RATE_NS_PER_S)};
        int sig = sigtimedwait(set, NULL, &ts);
        if (sig == SIGINT || sig == SIGTERM || sig == SIGHUP)
            kill(child, sig);
        else if (sig < 0 && errno == EAGAIN) {
            int rc = rate_inflight_extend(in, key, strlen(key), lease, 0);
            if (rc != RATE_OK)
                fprintf(stderr, "ratelimit: check: extending the lease: %s "
                                "(the command runs on)\n",
                        rate_strerror(rc));
        }
    }
}

int cli_check_lease(const char *policy_text, const char *key,
                    const char *store_spec, uint64_t max_keys, bool critical,
                    char **cmd)
{
    rate_inflight_policy_t *p;
    rate_store_t *store = NULL;
    rate_inflight_t *in = NULL;
    char err[256];
    int status = 2;

    if (rate_inflight_policy_parse(policy_text, &p, err, sizeof err) != RATE_OK)
        return cli_fail("check: --policy '%s': %s", policy_text, err);
    if (strlen(key) > RATE_LEASE_KEY_MAX) {
        rate_inflight_policy_free(p);
        return cli_fail("check: --key longer than %d bytes (a lease key's "
                        "bound)", RATE_LEASE_KEY_MAX);
    }
    /* A memory store is this process's own: the leases would bound
     * nothing, each check seeing only its own. */
    if (store_spec == NULL || strcmp(store_spec, "memory") == 0) {
        rate_inflight_policy_free(p);
        return cli_fail("check: an in-flight policy needs a store the jobs "
                        "share: --store shm:PATH (one host) or "
                        "--store redis://HOST:PORT (a fleet)");
    }
    if (lease_store(store_spec, p, max_keys, &store) != 0) {
        rate_inflight_policy_free(p);
        return 2;
    }
    /* A region keeps keys of up to its key_max bytes, and a lease's store
     * key is the key and 8 bytes more (docs/leases.md). */
    rate_shm_info_t info;
    if (rate_store_shm_info(store, &info) == RATE_OK &&
        strlen(key) + LEASE_KEY_EXTRA > info.key_max) {
        cli_fail("check: --key of %zu bytes is longer than --store %s "
                 "keeps for a lease: at most %u bytes (its key_max, %u, "
                 "less the lease key's %u)",
                 strlen(key), store_spec,
                 info.key_max > LEASE_KEY_EXTRA
                     ? info.key_max - LEASE_KEY_EXTRA : 0,
                 info.key_max, LEASE_KEY_EXTRA);
        goto out;
    }
    /* A region is this host's: its dead holders' leases can be taken
     * back at once (a check killed with SIGKILL). */
    rate_inflight_config_t cfg = {
        .policy = p, .store = store,
        .reap_dead_holders = strncmp(store_spec, "shm:", 4) == 0};
    /* The library's clock for the store (the wall clock on redis://,
     * unix://, dynamodb://): the one every other holder of the key reads
     * with the library's default. */
    int rc = rate_inflight_new(&cfg, &in);
    if (rc != RATE_OK) {
        cli_fail("check: %s", rate_strerror(rc));
        goto out;
    }
    rate_lease_t lease;
    rate_decision_t d;
    rc = rate_inflight_acquire(in, key, strlen(key),
                               critical ? RATE_LEASE_CRITICAL
                                        : RATE_LEASE_NORMAL,
                               &lease, &d);
    if (rc != RATE_OK) {
        cli_fail("check: %s: %s", rate_err_name(rc), rate_strerror(rc));
        goto out;
    }
    if (!d.allowed || cmd == NULL || cmd[0] == NULL) {
        print_decision(&d);
        if (d.allowed) /* no command: nothing to hold it for */
            rate_inflight_release(in, key, strlen(key), &lease);
        status = d.allowed ? 0 : (cmd != NULL && cmd[0] != NULL ? 75 : 1);
        goto out;
    }
    sigset_t set, old;
    sigemptyset(&set);
    sigaddset(&set, SIGCHLD);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGHUP);
    sigprocmask(SIG_BLOCK, &set, &old);
    pid_t child = spawn(cmd, &old);
    if (child < 0) {
        cli_fail("check: cannot start '%s': %s", cmd[0], strerror(errno));
    } else {
        status = supervise(in, key, &lease, rate_inflight_policy_ttl_ns(p),
                           child, &set);
    }
    rc = rate_inflight_release(in, key, strlen(key), &lease);
    if (rc != RATE_OK)
        fprintf(stderr, "ratelimit: check: releasing the lease: %s\n",
                rate_strerror(rc));
    sigprocmask(SIG_SETMASK, &old, NULL);
out:
    rate_inflight_free(in);
    rate_store_free(store);
    rate_inflight_policy_free(p);
    return status;
}
