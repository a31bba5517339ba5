/* SPDX-License-Identifier: MIT */
/*
 * The synced mode over each remote this build has, as the store matrix is
 * over each store (tests/lib/store_matrix.h runs both): Redis and
 * DynamoDB (dynalite), each a private server on a free loopback port
 * behind a delay line (tests/lib/delay_line.h), stopped by its PID.
 * `RATE_STORES=redis test_sync_remotes` runs some of them; without
 * dynalite its kind is skipped (failed under CI=true).
 *
 * One deadline per decision: a synced decision may make two borrows (the
 * remote has less than a lease: then what it has); they share one
 * deadline, the remote store's timeout from the decision's start.  Here
 * every request reaches the remote late (each kind says how late: its
 * borrows take a different number of requests), with a 1.2 s timeout: A
 * holds 16 of the 20 permits, B's decision needs two borrows, which took
 * a delay each plus the second borrow's own timeout when each borrow had
 * its own (the defect); within it, B's second borrow is cut short and the
 * fail mode decides at 1.2 s.  B must return within the timeout plus
 * 0.5 s of slack (the requests are 650 ms and more apart: a loaded
 * machine's scheduling is far below it).
 */
#include "lib/delay_line.h"
#include "lib/store_matrix.h"
#include "ratelimit_synced.h"
#ifdef RATE_WITH_REDIS
#include "ratelimit_redis.h"
#include "lib/redis_server.h"
#endif
#ifdef RATE_WITH_DYNAMODB
#include <curl/curl.h>

#include "ratelimit_dynamodb.h"
#include "lib/dynalite_server.h"
#endif

#define TIMEOUT_NS (1200 * MS)
#define SLACK_NS (500 * MS)

/* A remote kind: its server, the delay line in front of it, how late
 * each request goes through it for the deadline case. */
typedef struct remote {
    pid_t pid;
    int port;
    delay_line_t dl;
    int delay_ms;
} remote_t;

static unsigned namespaces; /* a namespace of its own per store made */

/* The delay line in front of the kind's server, just started: 0; else
 * the server is stopped again, and 1 with the reason in why. */
static int line_up(remote_t *r, char *why, size_t len)
{
    if (delay_line_start(&r->dl, r->port))
        return 0;
    test_stop(&r->pid);
    snprintf(why, len, "no delay line could listen");
    return 1;
}

static void stop_remote(store_kind_t *k)
{
    remote_t *r = k->ud;
    assert_true(delay_line_stop(&r->dl));
    test_stop(&r->pid);
}

#ifdef RATE_WITH_REDIS
static int start_redis(store_kind_t *k, char *why, size_t len)
{
    remote_t *r = k->ud;
    r->port = redis_test_free_port();
    if ((r->pid = redis_test_start_args(r->port, NULL)) == 0) {
        snprintf(why, len, "no redis-server could start");
        return 1;
    }
    return line_up(r, why, len);
}

/* Through the delay line, a pool of one connection, no breaker. */
static int make_redis(store_kind_t *k, rate_store_t **out)
{
    remote_t *r = k->ud;
    char url[64], prefix[32], err[256] = "";
    snprintf(url, sizeof url, "redis://127.0.0.1:%d", r->dl.port);
    snprintf(prefix, sizeof prefix, "remote%u:", namespaces++);
    rate_redis_options_t o = {.prefix = prefix, .pool_size = 1};
    o.command_timeout_ns = TIMEOUT_NS;
    o.connect_timeout_ns = TIMEOUT_NS;
    o.no_breaker = true;
    o.module = RATE_REDIS_MODULE_OFF;
    int rc = rate_store_redis_new(url, &o, out, err, sizeof err);
    return sm_made(k, rc, err);
}

static void drop_redis(store_kind_t *k, rate_store_t *s)
{
    (void)k;
    assert_int_equal(rate_store_redis_drop(s), RATE_OK);
    rate_store_free(s);
}

static remote_t redis_remote = {.delay_ms = 1000};
#endif

#ifdef RATE_WITH_DYNAMODB
static int start_dynamodb(store_kind_t *k, char *why, size_t len)
{
    remote_t *r = k->ud;
    if (dynalite_program() == NULL) {
        snprintf(why, len, "no dynalite (`make deps`, or set DYNALITE)");
        return 1;
    }
    dynalite_credentials();
    r->port = dynalite_free_port();
    if ((r->pid = dynalite_start(r->port)) == 0) {
        snprintf(why, len, "dynalite could not start");
        return 1;
    }
    /* The table, made directly (not through the line). */
    char url[160], err[512] = "";
    dynalite_url(url, sizeof url, "ratelimit-remotes", r->port);
    rate_dynamodb_options_t o = {.create_table = true};
    rate_store_t *s = NULL;
    if (rate_store_dynamodb_new(url, &o, &s, err, sizeof err) != RATE_OK) {
        snprintf(why, len, "the table: %s", err);
        dynalite_stop(&r->pid);
        return 1;
    }
    rate_store_free(s);
    return line_up(r, why, len);
}

static int make_dynamodb(store_kind_t *k, rate_store_t **out)
{
    remote_t *r = k->ud;
    char url[160], prefix[32], err[512] = "";
    dynalite_url(url, sizeof url, "ratelimit-remotes", r->dl.port);
    snprintf(prefix, sizeof prefix, "remote%u:", namespaces++);
    rate_dynamodb_options_t o = {0};
    o.prefix = prefix;
    o.prefix_len = strlen(prefix);
    o.request_timeout_ns = TIMEOUT_NS;
    o.connect_timeout_ns = TIMEOUT_NS;
    int rc = rate_store_dynamodb_new(url, &o, out, err, sizeof err);
    return sm_made(k, rc, err);
}

/* A borrow is a GetItem and a PutItem (a denial writes nothing). */
static remote_t dynamodb_remote = {.delay_ms = 650};
#endif

/* ------------------------------------------------------------- cases */

/* Two synced limiters on the case's remote: A borrows first (16 of a
 * burst of 20); then, with every request late by the kind's delay, B
 * needs two borrows (the 4 left, then more) and must return within the
 * remote's timeout plus SLACK_NS, as a store error RATE_ETIMEDOUT. */
static void synced_decision_within_one_timeout(void **state)
{
    sm_case_t *sc = *state;
    remote_t *r = sc->kind->ud;
    rate_policy_t *p = policy_of("token-bucket 1/h burst=20");
    rate_synced_config_t c = {0};
    c.policy = p;
    c.remote = sc->store;
    c.lease = 16;
    c.lease_ttl_ns = 60 * SEC;
    c.on_store_error = RATE_FAIL_CLOSED;
    rate_synced_t *a = NULL, *b = NULL;
    assert_int_equal(rate_synced_new(&c, &a, NULL, 0), RATE_OK);
    assert_int_equal(rate_synced_new(&c, &b, NULL, 0), RATE_OK);
    rate_decision_t d;
    assert_int_equal(rate_synced_check(a, "k", 1, 1, &d), RATE_OK);
    assert_true(d.allowed); /* A borrowed 16: 4 are left */

    atomic_store(&r->dl.delay_ms, r->delay_ms);
    uint64_t t0 = rate_clock_monotonic_ns();
    assert_int_equal(rate_synced_check(b, "k", 1, 1, &d), RATE_OK);
    uint64_t took = rate_clock_monotonic_ns() - t0;
    atomic_store(&r->dl.delay_ms, 0);
    print_message("%s: B's decision: %llu ms (%s) against a %llu ms "
                  "timeout\n", sc->kind->name,
                  (unsigned long long)(took / MS),
                  d.reason == RATE_REASON_STORE_ERROR ? rate_err_name(d.error)
                  : d.allowed                          ? "allowed"
                                                       : "denied",
                  (unsigned long long)(TIMEOUT_NS / MS));
    if (took > TIMEOUT_NS + SLACK_NS)
        fail_msg("%s: B's decision took %llu ms, the timeout is %llu ms",
                 sc->kind->name, (unsigned long long)(took / MS),
                 (unsigned long long)(TIMEOUT_NS / MS));
    assert_int_equal(d.reason, RATE_REASON_STORE_ERROR);
    assert_int_equal(d.error, RATE_ETIMEDOUT);
    rate_synced_free(a);
    rate_synced_free(b);
    rate_policy_free(p);
}

static const sm_case_def_t remote_cases[] = {
    {"synced_decision_within_one_timeout",
     synced_decision_within_one_timeout},
};

int main(void)
{
#ifdef RATE_WITH_DYNAMODB
    curl_global_init(CURL_GLOBAL_DEFAULT);
#endif
    store_kind_t kinds[] = {
#ifdef RATE_WITH_REDIS
        {.name = "redis", .start = start_redis, .stop = stop_remote,
         .make = make_redis, .drop = drop_redis, .ud = &redis_remote},
#endif
#ifdef RATE_WITH_DYNAMODB
        {.name = "dynamodb", .start = start_dynamodb, .stop = stop_remote,
         .make = make_dynamodb, .ud = &dynamodb_remote},
#endif
    };
    int rc = store_matrix_run(kinds, sizeof kinds / sizeof kinds[0],
                              remote_cases,
                              sizeof remote_cases / sizeof remote_cases[0]);
#ifdef RATE_WITH_DYNAMODB
    curl_global_cleanup();
#endif
    return rc;
}
