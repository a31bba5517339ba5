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

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdatomic.h>
#include <sys/socket.h>
#include <unistd.h>

#include <curl/curl.h>
#include <pthread.h>
#include "ratelimit_dynamodb.h"
#include "ratelimit_synced.h"
#include "lib/sync_deadline.h"

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
    setenv("AWS_ACCESS_KEY_ID", "AKIDTEST", 1);
    setenv("AWS_SECRET_ACCESS_KEY", "test-secret", 1);
    unsetenv("AWS_SESSION_TOKEN");
    port = dynalite_free_port();
    snprintf(url, sizeof url,
             "dynamodb://ratelimit-sync?region=us-east-1&endpoint="
             "http://127.0.0.1:%d", port);
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

/* ------------------------------------------ one deadline per decision */

/* A delay line in front of dynalite: each request (the first bytes a
 * client sends after the last answer, or after it connected) is passed
 * on `delay_ms` late (0: at once), the rest and the answers at once.  A
 * thread per connection. */
typedef struct delay_line {
    int lfd, port;
    atomic_int delay_ms;
} delay_line_t;

typedef struct delay_conn {
    delay_line_t *dl;
    int client, upstream;
    atomic_bool answered; /* an answer came since the last request */
} delay_conn_t;

static void *delay_down(void *arg)
{
    delay_conn_t *dc = arg;
    char buf[65536];
    ssize_t n;
    while ((n = read(dc->upstream, buf, sizeof buf)) > 0) {
        atomic_store(&dc->answered, true);
        if (send(dc->client, buf, (size_t)n, MSG_NOSIGNAL) != n)
            break;
    }
    shutdown(dc->client, SHUT_RDWR);
    return NULL;
}

static void *delay_up(void *arg)
{
    delay_conn_t *dc = arg;
    pthread_t down;
    pthread_create(&down, NULL, delay_down, dc);
    char buf[65536];
    ssize_t n;
    while ((n = read(dc->client, buf, sizeof buf)) > 0) {
        int ms = atomic_load(&dc->dl->delay_ms);
        if (atomic_exchange(&dc->answered, false) && ms > 0)
            usleep((useconds_t)ms * 1000);
        if (send(dc->upstream, buf, (size_t)n, MSG_NOSIGNAL) != n)
            break;
    }
    shutdown(dc->upstream, SHUT_RDWR);
    pthread_join(down, NULL);
    close(dc->upstream);
    close(dc->client);
    free(dc);
    return NULL;
}

static void *delay_accept(void *arg)
{
    delay_line_t *dl = arg;
    for (;;) {
        int c = accept(dl->lfd, NULL, NULL);
        if (c < 0)
            break;
        struct sockaddr_in sa = {0};
        sa.sin_family = AF_INET;
        sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        sa.sin_port = htons((uint16_t)port);
        int u = socket(AF_INET, SOCK_STREAM, 0);
        delay_conn_t *dc = calloc(1, sizeof *dc);
        if (dc == NULL || connect(u, (struct sockaddr *)&sa, sizeof sa) != 0) {
            free(dc);
            close(u);
            close(c);
            continue;
        }
        dc->dl = dl;
        dc->client = c;
        dc->upstream = u;
        atomic_init(&dc->answered, true);
        pthread_t th;
        pthread_create(&th, NULL, delay_up, dc);
        pthread_detach(th);
    }
    return NULL;
}

/* A synced decision that borrows twice (the remote has less than a
 * lease: then what it has) makes a GetItem for the first (a denial writes
 * nothing) and a GetItem and a PutItem for the second; all three share
 * one deadline, the store's request timeout from the decision's start.
 * Each request reaches dynalite 650 ms late here, with a 1.2 s timeout:
 * A holds 16 of the 20 permits; B's decision took 0.65 s plus the second
 * borrow's own 1.2 s when each borrow had its own timeout (the defect);
 * within it, the second borrow's PutItem is cut short and the fail mode
 * decides at 1.2 s.  B must return within the timeout plus 0.5 s of
 * slack (the requests are 650 ms apart: a loaded machine's scheduling is
 * far below it). */
static void synced_decision_within_one_timeout(void **state)
{
    (void)state;
    delay_line_t dl = {0};
    struct sockaddr_in sa = {0};
    socklen_t sl = sizeof sa;
    dl.lfd = socket(AF_INET, SOCK_STREAM, 0);
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(bind(dl.lfd, (struct sockaddr *)&sa, sizeof sa), 0);
    assert_int_equal(listen(dl.lfd, 16), 0);
    assert_int_equal(getsockname(dl.lfd, (struct sockaddr *)&sa, &sl), 0);
    dl.port = ntohs(sa.sin_port);
    pthread_t acc;
    pthread_create(&acc, NULL, delay_accept, &dl);

    const uint64_t timeout = 1200 * MS, slack = 500 * MS;
    char u[200], err[512] = "";
    snprintf(u, sizeof u,
             "dynamodb://ratelimit-sync?region=us-east-1&endpoint="
             "http://127.0.0.1:%d", dl.port);
    rate_store_t *made = ddb_store(true); /* the table, directly */
    rate_store_free(made);
    rate_dynamodb_options_t o = {0};
    o.prefix = "syncdl:";
    o.prefix_len = 7;
    o.request_timeout_ns = timeout;
    o.connect_timeout_ns = timeout;
    rate_store_t *rs = NULL;
    if (rate_store_dynamodb_new(u, &o, &rs, err, sizeof err) != RATE_OK)
        fail_msg("dynamodb through the delay line: %s", err);
    synced_decision_within(rs, &dl.delay_ms, 650, timeout, slack);
    rate_store_free(rs);
    shutdown(dl.lfd, SHUT_RDWR);
    close(dl.lfd);
    pthread_join(acc, NULL);
}

int main(void)
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
    if (dynalite_program() == NULL)
        return dynalite_missing("test_sync_dynamodb");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(synced_over_dynamodb),
        cmocka_unit_test(synced_decision_within_one_timeout),
    };
    int rc = cmocka_run_group_tests(tests, group_setup, group_teardown);
    curl_global_cleanup();
    return rc;
}
