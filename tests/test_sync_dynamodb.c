/* SPDX-License-Identifier: MIT */
/*
 * The synced mode over a DynamoDB store (a private dynalite), the generic
 * compare-and-set contract across the network: three synced limiters (as
 * three processes) with two threads each on one key; the admitted total
 * within the exact bound, the table's room after the clean exits exactly
 * what was not admitted, and far fewer requests than decisions.  Skipped
 * (77) without dynalite, failed under CI=true.
 */
#include "lib/helpers.h"
#include "lib/dynalite_server.h"

#include <stdatomic.h>
#include <unistd.h>

#include <curl/curl.h>
#include <pthread.h>
#include "ratelimit_dynamodb.h"
#include "ratelimit_synced.h"

static pid_t server;
static int port;
static char url[160];
#define POLICY "token-bucket 1/h burst=100"
#define PROCS 3
#define THREADS 2

static rate_store_t *ddb_store(bool create)
{
    rate_dynamodb_options_t o = {0};
    rate_store_t *s = NULL;
    char err[512] = "";
    o.create_table = create;
    o.prefix = "sync:";
    o.prefix_len = 5;
    if (rate_store_dynamodb_new(url, &o, &s, err, sizeof err) != RATE_OK)
        fail_msg("dynamodb store: %s", err);
    return s;
}

static int group_setup(void **state)
{
    (void)state;
    dynalite_credentials();
    port = dynalite_free_port();
    dynalite_url(url, sizeof url, "ratelimit-sync", port);
    server = dynalite_start(port);
    return server == 0 ? -1 : 0;
}

static int group_teardown(void **state)
{
    (void)state;
    dynalite_stop(&server);
    return 0;
}

typedef struct worker {
    rate_synced_t *s;
    uint64_t admitted;
} worker_t;

static void *work(void *arg)
{
    worker_t *w = arg;
    for (int i = 0; i < 40; i++)
        w->admitted += rate_synced_try_acquire(w->s, "k", 1, 1);
    return NULL;
}

static void synced_over_dynamodb(void **state)
{
    (void)state;
    rate_store_t *store[PROCS];
    rate_synced_t *s[PROCS];
    rate_policy_t *p = policy_of(POLICY);
    for (int i = 0; i < PROCS; i++) {
        store[i] = ddb_store(i == 0);
        rate_synced_config_t c = {0};
        c.policy = p;
        c.remote = store[i];
        c.lease = 5;
        c.lease_ttl_ns = 60 * SEC;
        char err[256] = "";
        if (rate_synced_new(&c, &s[i], err, sizeof err) != RATE_OK)
            fail_msg("rate_synced_new: %s", err);
    }
    pthread_t th[PROCS * THREADS];
    worker_t w[PROCS * THREADS];
    for (int i = 0; i < PROCS * THREADS; i++) {
        w[i] = (worker_t){s[i % PROCS], 0};
        pthread_create(&th[i], NULL, work, &w[i]);
    }
    uint64_t admitted = 0, decisions = 0, trips = 0;
    for (int i = 0; i < PROCS * THREADS; i++) {
        pthread_join(th[i], NULL);
        admitted += w[i].admitted;
    }
    for (int i = 0; i < PROCS; i++) {
        rate_synced_stats_t st;
        assert_int_equal(rate_synced_stats(s[i], &st), RATE_OK);
        decisions += st.decisions;
        trips += st.round_trips;
        assert_int_equal(st.remote_errors, 0);
        rate_synced_free(s[i]); /* hands its lease back */
    }
    assert_int_equal(decisions, PROCS * THREADS * 40);
    assert_true(admitted <= 100);
    /* the demand (240) drained the key: what is left is what the
     * limiters handed back as they ended, at most P x L */
    rate_limiter_t *l = limiter_of(POLICY, store[0]);
    rate_decision_t d;
    assert_int_equal(rate_limiter_check(l, "k", 1, 0, 0, &d), RATE_OK);
    assert_int_not_equal(d.reason, RATE_REASON_STORE_ERROR);
    assert_int_equal(d.remaining + admitted, 100);
    assert_true(d.remaining <= PROCS * 5);
    print_message("dynamodb: admitted %llu, %llu round trips for %llu "
                  "decisions\n", (unsigned long long)admitted,
                  (unsigned long long)trips, (unsigned long long)decisions);
    assert_true(trips * 2 < decisions);
    rate_limiter_free(l);
    rate_store_dynamodb_drop(store[0]);
    for (int i = 0; i < PROCS; i++)
        rate_store_free(store[i]);
    rate_policy_free(p);
}

int main(void)
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
    if (dynalite_program() == NULL)
        return dynalite_missing("test_sync_dynamodb");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(synced_over_dynamodb),
    };
    int rc = cmocka_run_group_tests(tests, group_setup, group_teardown);
    curl_global_cleanup();
    return rc;
}
