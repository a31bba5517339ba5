/* SPDX-License-Identifier: MIT */
/*
 * lease_hold URL KEY POLICY GO: a program on the library's defaults (a
 * Redis store of the default prefix, the inflight object's default
 * clock) acquires a lease of KEY, prints "allow" or "deny", and, when
 * allowed, holds it until the file GO exists (polled every 20 ms), then
 * releases it; for lease_cli_test.sh, whose `ratelimit check` shares the
 * key.  Exit status 0 allowed (and released), 1 denied, 2 an error.
 */
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <ratelimit_lease.h>
#include <ratelimit_redis.h>

int main(int argc, char **argv)
{
    rate_inflight_policy_t *p = NULL;
    rate_store_t *store = NULL;
    rate_inflight_t *in = NULL;
    char err[256] = "";
    int status = 2;

    if (argc != 5) {
        fprintf(stderr, "usage: lease_hold URL KEY POLICY GO\n");
        return 2;
    }
    const char *key = argv[2];
    if (rate_inflight_policy_parse(argv[3], &p, err, sizeof err) != RATE_OK ||
        rate_store_redis_new(argv[1], NULL, &store, err, sizeof err) !=
            RATE_OK) {
        fprintf(stderr, "lease_hold: %s\n", err);
        goto out;
    }
    rate_inflight_config_t cfg = {.policy = p, .store = store};
    rate_lease_t lease;
    rate_decision_t d;
    int rc = rate_inflight_new(&cfg, &in);
    if (rc == RATE_OK)
        rc = rate_inflight_acquire(in, key, strlen(key), RATE_LEASE_NORMAL,
                                   &lease, &d);
    if (rc != RATE_OK) {
        fprintf(stderr, "lease_hold: %s\n", rate_strerror(rc));
        goto out;
    }
    printf("%s\n", d.allowed ? "allow" : "deny");
    fflush(stdout);
    status = 1;
    if (d.allowed) {
        struct timespec ts = {0, 20 * 1000 * 1000};
        while (access(argv[4], F_OK) != 0)
            nanosleep(&ts, NULL);
        rc = rate_inflight_release(in, key, strlen(key), &lease);
        if (rc != RATE_OK)
            fprintf(stderr, "lease_hold: release: %s\n", rate_strerror(rc));
        status = rc == RATE_OK ? 0 : 2;
    }
out:
    rate_inflight_free(in);
    rate_store_free(store);
    rate_inflight_policy_free(p);
    return status;
}
