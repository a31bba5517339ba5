/* SPDX-License-Identifier: MIT */
/*
 * In-flight policies in a rules file (rate_rules_acquire and
 * rate_rules_release; docs/leases.md, "The rules file"): the policy text
 * and the class in a rule, errors naming the line, exactly N held per
 * rule key, all-or-nothing beside rate policies, the reserve by class,
 * the HTTP fields, store failures, and reloads that change N while
 * leases are held (they stay valid; their generation is kept until the
 * last is released).
 */
#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>

#include "lib/helpers.h"
#include "http/http.h"
#include "ratelimit_http.h"
#include "ratelimit_lease.h"
#include "lib/sf_check.h"
#include "lib/tmpdir.h"

static fake_clock_t fclock;
static const rate_clock_t clock_fake = {fake_now, fake_sleep, &fclock};
TEST_DIR_SETUP("test_rules_lease")

static rate_rules_t *load(const char *text)
{
    char err[512] = "";
    rate_rules_t *r = NULL;
    int rc = rate_rules_load(test_dir_file("rules.conf", text), &r, err,
                             sizeof err);
    if (rc != RATE_OK)
        fail_msg("load: %s", err);
    return r;
}

static rate_limiter_t *limiter_on(rate_store_t *store)
{
    rate_limiter_config_t cfg = {.clock = &clock_fake, .store = store};
    return limiter_cfg("name=none unlimited", cfg);
}

/* One request: its outcome, and *held what it holds. */
static rate_outcome_t acq(rate_rules_t *r, rate_limiter_t *lim,
                          const char *key, const char *route,
                          const char *prio, rate_rules_held_t **held)
{
    rate_attr_t a[2];
    size_t n = 0;
    if (route != NULL)
        a[n++] = (rate_attr_t){"route", route};
    if (prio != NULL)
        a[n++] = (rate_attr_t){"priority", prio};
    rate_outcome_t o;
    assert_int_equal(rate_rules_acquire(r, lim, key, strlen(key), a, n, 1, 0,
                                        &o, held),
                     RATE_OK);
    if (!o.allowed)
        assert_null(*held);
    return o;
}

static const char *slow_rules =
    "[policies]\n"
    "slots = concurrency 2 ttl=30s\n"
    "open = unlimited\n"
    "[rule slow]\n"
    "group = route\n"
    "match = route=/slow*\n"
    "policy = slots\n"
    "key = shared\n"
    "[rule any]\n"
    "group = route\n"
    "policy = open\n";

/* Exactly N per rule key; a release frees a slot; the fields. */
static void exactly_n_held(void **state)
{
    (void)state;
    rate_rules_t *r = load(slow_rules);
    rate_limiter_t *lim = limiter_on(NULL);
    rate_rules_held_t *h[3];
    fclock.now = 1000 * SEC;

    rate_outcome_t o = acq(r, lim, "ann", "/slow", NULL, &h[0]);
    assert_true(o.allowed);
    assert_int_equal(o.count, 1);
    assert_string_equal(o.applied[0].policy_name, "slots");
    assert_false(o.applied[0].unlimited);
    assert_int_equal(o.applied[0].concurrency, 2);
    assert_int_equal(o.applied[0].decision.remaining, 1);
    rate_headers_t hd;
    assert_int_equal(rate_outcome_headers(&o, &hd), RATE_OK);
    assert_int_equal(hd.status, 0);
    assert_string_equal(hd.policy, "\"slots\";q=2");
    assert_string_equal(hd.ratelimit, "\"slots\";r=1;t=30");
    sf_list_t l;
    assert_true(sf_parse_list(hd.policy, &l));
    assert_true(sf_parse_list(hd.ratelimit, &l));

    /* Another user, same rule key (shared): the second and last slot. */
    assert_true(acq(r, lim, "bob", "/slow/x", NULL, &h[1]).allowed);
    fclock.now += 10 * SEC;
    o = acq(r, lim, "cy", "/slow", NULL, &h[2]);
    assert_false(o.allowed);
    assert_null(h[2]);
    assert_int_equal(o.denied_by, 0);
    assert_int_equal(rate_outcome_headers(&o, &hd), RATE_OK);
    assert_int_equal(hd.status, 429);
    /* the earliest lease is due in 20 s */
    assert_string_equal(hd.retry_after, "20");
    assert_string_equal(hd.ratelimit, "\"slots\";r=0;t=20");
    /* Another route holds nothing: no lease, no record. */
    o = acq(r, lim, "cy", "/fast", NULL, &h[2]);
    assert_true(o.allowed);
    assert_null(h[2]);
    /* One released: one more may come in. */
    assert_int_equal(rate_rules_release(h[0]), RATE_OK);
    assert_true(acq(r, lim, "cy", "/slow", NULL, &h[0]).allowed);
    assert_false(acq(r, lim, "dee", "/slow", NULL, &h[2]).allowed);
    /* Expired under its holder: the release says so, the slot is back. */
    fclock.now += 25 * SEC; /* bob's lease (from t0) is past its 30 s */
    assert_int_equal(rate_rules_release(h[1]), RATE_EEXPIRED);
    assert_true(acq(r, lim, "dee", "/slow", NULL, &h[1]).allowed);
    assert_int_equal(rate_rules_release(h[0]), RATE_OK);
    assert_int_equal(rate_rules_release(h[1]), RATE_OK);
    assert_int_equal(rate_rules_release(NULL), RATE_OK);

    /* rate_rules_check cannot hold a lease: it says so, charges nothing. */
    rate_attr_t a = {"route", "/slow"};
    assert_int_equal(rate_rules_check(r, lim, "ann", 3, &a, 1, 1, 0, &o),
                     RATE_EPOLICY);
    assert_int_equal(o.count, 0);
    assert_int_equal(rate_rules_acquire(r, lim, "ann", 3, &a, 1, 1, 0, &o,
                                        NULL),
                     RATE_EINVAL);
    rate_limiter_free(lim);
    rate_rules_free(r);
}

/* Beside a rate policy: a denial by either holds and charges nothing. */
static void all_or_nothing(void **state)
{
    (void)state;
    rate_rules_t *r = load(
        "[policies]\n"
        "one = concurrency 1 ttl=1m\n"
        "twice = fixed-window 2/h\n"
        "capped = concurrency 5 ttl=1m; fixed-window 1/h\n"
        "[rule user]\n"
        "group = tier\n"
        "policy = twice\n"
        "[rule slow]\n"
        "group = route\n"
        "match = route=/slow\n"
        "policy = one\n"
        "key = shared\n"
        "[rule capped]\n"
        "group = route\n"
        "match = route=/capped\n"
        "policy = capped\n"
        "key = route\n");
    rate_limiter_t *lim = limiter_on(NULL);
    rate_rules_held_t *h, *h2;
    fclock.now = 5 * SEC;

    /* ann: her two permits of the hour, each with the one slot. */
    for (int i = 0; i < 2; i++) {
        assert_true(acq(r, lim, "ann", "/slow", NULL, &h).allowed);
        assert_int_equal(rate_rules_release(h), RATE_OK);
    }
    /* Her third: the tier denies; the slot she took is given back. */
    rate_outcome_t o = acq(r, lim, "ann", "/slow", NULL, &h);
    assert_int_equal(o.denied_by, 0);
    assert_true(o.applied[1].decision.allowed);
    assert_true(o.applied[1].refunded);
    rate_headers_t hd;
    assert_int_equal(rate_outcome_headers(&o, &hd), RATE_OK);
    assert_string_equal(hd.ratelimit, "\"twice\";r=0;t=3595, \"one\";r=1;t=60");
    assert_true(acq(r, lim, "bob", "/slow", NULL, &h).allowed); /* free */
    /* The slot held: bob's second is denied by it, his tier refunded. */
    o = acq(r, lim, "bob", "/slow", NULL, &h2);
    assert_int_equal(o.denied_by, 1);
    assert_true(o.applied[0].refunded);
    assert_int_equal(rate_rules_release(h), RATE_OK);
    assert_true(acq(r, lim, "bob", "/slow", NULL, &h).allowed); /* 2nd */
    assert_int_equal(rate_rules_release(h), RATE_OK);

    /* An in-flight policy's own rate clause: its denial names the window
     * and gives the lease back (5 slots, one request an hour). */
    o = acq(r, lim, "cy", "/capped", NULL, &h);
    assert_true(o.allowed);
    assert_int_equal(rate_rules_release(h), RATE_OK);
    o = acq(r, lim, "cy", "/capped", NULL, &h2);
    assert_false(o.allowed);
    assert_int_equal(o.applied[1].concurrency, 0);
    assert_int_equal(o.applied[1].decision.component, 1);
    assert_int_equal(o.applied[1].limit.period_ns, 3600 * SEC);
    assert_int_equal(rate_outcome_headers(&o, &hd), RATE_OK);
    assert_string_equal(hd.policy, "\"twice\";q=2;w=3600, \"capped\";q=1;w=3600");
    rate_limiter_free(lim);
    rate_rules_free(r);
}

/* The class: from the rule, or a request attribute; the reserve. */
static void class_from_rule_or_attribute(void **state)
{
    (void)state;
    rate_rules_t *r = load(
        "[policies]\n"
        "global = concurrency 3 ttl=1m reserve=1\n"
        "open = unlimited\n"
        "[rule health]\n"
        "group = class\n"
        "match = route=/healthz\n"
        "class = critical\n"
        "policy = open\n"
        "[rule rest]\n"
        "group = class\n"
        "class = priority\n"
        "policy = open\n"
        "[rule global]\n"
        "group = limit\n"
        "policy = global\n"
        "key = shared\n");
    rate_limiter_t *lim = limiter_on(NULL);
    rate_rules_held_t *h[5];
    fclock.now = SEC;
    /* Two normal requests fill what normal traffic may use. */
    assert_true(acq(r, lim, "a", "/x", NULL, &h[0]).allowed);
    assert_true(acq(r, lim, "b", "/x", "low", &h[1]).allowed);
    rate_outcome_t o = acq(r, lim, "c", "/x", NULL, &h[2]);
    assert_false(o.allowed);
    assert_int_equal(o.applied[1].concurrency, 2); /* N - K for normal */
    /* The health check's rule says critical: the reserved slot. */
    o = acq(r, lim, "c", "/healthz", NULL, &h[2]);
    assert_true(o.allowed);
    assert_int_equal(o.applied[1].concurrency, 3);
    assert_false(acq(r, lim, "d", "/healthz", NULL, &h[3]).allowed);
    /* The attribute's "critical": the same slot (now taken) */
    assert_int_equal(rate_rules_release(h[2]), RATE_OK);
    assert_true(acq(r, lim, "d", "/x", "critical", &h[3]).allowed);
    assert_false(acq(r, lim, "e", "/x", "critical", &h[4]).allowed);
    for (int i = 0; i < 2; i++)
        assert_int_equal(rate_rules_release(h[i]), RATE_OK);
    assert_int_equal(rate_rules_release(h[3]), RATE_OK);
    rate_limiter_free(lim);
    rate_rules_free(r);
}

/* Bad in-flight text, class and combinations: the file and the line. */
static void errors_name_the_line(void **state)
{
    (void)state;
    static const struct {
        const char *text, *msg;
    } cases[] = {
        {"[policies]\nslow = concurrency 0 ttl=1s\n",
         "2: policy 'slow': concurrency: '0' is not a count from 1 to 10000"},
        {"[policies]\nslow = concurrency 5\n",
         "2: policy 'slow': concurrency: missing ttl=DURATION (a lease must "
         "expire)"},
        {"[policies]\nslow = concurrency 5 ttl=1s; concurrency 2 ttl=1s\n",
         "2: policy 'slow': two concurrency clauses"},
        {"[policies]\nslow = concurrency 5 ttl=1s\n[rule a]\n"
         "class = crit*cal\npolicy = slow\n",
         "4: class 'crit*cal' is not 'critical', 'normal' or an attribute "
         "name (letters, digits, '_', '-' and '.')"},
        {"[policies]\nslow = concurrency 5 ttl=1s\n[rule a]\n"
         "class = critical\nclass = normal\npolicy = slow\n",
         "5: class given twice in [rule a]"},
        {"[policies]\nslow = concurrency 5 ttl=1s\n[rule a]\n"
         "key = fair\npolicy = slow\n",
         "5: [rule a]: key = fair divides a rate, not in-flight policy 'slow' "
         "(give it key = shared for one limit of the rule)"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char err[512] = "", want[512];
        rate_rules_t *r = (rate_rules_t *)1;
        const char *path = test_dir_file("bad.conf", cases[i].text);
        assert_int_equal(rate_rules_load(path, &r, err, sizeof err),
                         RATE_EPOLICY);
        assert_null(r);
        snprintf(want, sizeof want, "%s:%s", path, cases[i].msg);
        if (strncmp(err, want, strlen(want)) != 0)
            fail_msg("case %zu: got '%s', want '%s'", i, err, want);
    }
}

/* A lease's store failing: denied as fail-closed (503), nothing held. */
static void store_failure_denies(void **state)
{
    (void)state;
    rate_rules_t *r = load(slow_rules);
    rate_store_t *store;
    cas_store_t *cs;
    assert_int_equal(cas_store_new(&store, &cs), RATE_OK);
    rate_limiter_t *lim = limiter_on(store);
    rate_rules_held_t *h;
    cas_store_set_down(cs, 1);
    rate_outcome_t o = acq(r, lim, "ann", "/slow", NULL, &h);
    assert_false(o.allowed);
    assert_int_equal(o.applied[0].decision.reason, RATE_REASON_STORE_ERROR);
    rate_headers_t hd;
    assert_int_equal(rate_outcome_headers(&o, &hd), RATE_OK);
    assert_int_equal(hd.status, 503);
    assert_string_equal(hd.retry_after, "");
    cas_store_set_down(cs, 0);
    rate_rules_held_t *k[3]; /* nothing was left held: both slots */
    for (int i = 0; i < 3; i++)
        assert_int_equal(acq(r, lim, "ann", "/slow", NULL, &k[i]).allowed,
                         i < 2);
    for (int i = 0; i < 2; i++)
        assert_int_equal(rate_rules_release(k[i]), RATE_OK);
    rate_limiter_free(lim);
    rate_store_free(store);
    rate_rules_free(r);
}

/* A reload changing N while leases are held: they stay valid, are
 * released through their own generation (kept until then), and count
 * against the new N. */
static void reload_keeps_leases_held(void **state)
{
    (void)state;
    char err[512];
    rate_rules_t *r = load(slow_rules); /* N = 2 */
    rate_limiter_t *lim = limiter_on(NULL);
    rate_rules_held_t *h[3];
    fclock.now = SEC;
    assert_true(acq(r, lim, "a", "/slow", NULL, &h[0]).allowed);
    assert_true(acq(r, lim, "b", "/slow", NULL, &h[1]).allowed);

    char *text = strdup(slow_rules);
    char *two = strstr(text, "concurrency 2");
    two[sizeof "concurrency " - 1] = '1'; /* N = 1 */
    assert_int_equal(rate_rules_reload(r, test_dir_file("rules.conf", text),
                                       err, sizeof err),
                     RATE_OK);
    free(text);
    /* The old generation is kept for its leases. */
    assert_int_equal(rate__rules_live(r), 2);
    rate_outcome_t o = acq(r, lim, "c", "/slow", NULL, &h[2]);
    assert_false(o.allowed);
    assert_int_equal(o.generation, 2);
    assert_int_equal(o.applied[0].concurrency, 1);
    assert_int_equal(rate_rules_release(h[0]), RATE_OK);
    assert_false(acq(r, lim, "c", "/slow", NULL, &h[2]).allowed); /* 1 held */
    assert_int_equal(rate__rules_live(r), 2);
    assert_int_equal(rate_rules_release(h[1]), RATE_OK);
    /* The last lease of the old rules released: they are freed. */
    assert_int_equal(rate__rules_live(r), 1);
    assert_true(acq(r, lim, "c", "/slow", NULL, &h[2]).allowed);
    assert_false(acq(r, lim, "d", "/slow", NULL, &h[0]).allowed);
    assert_int_equal(rate_rules_release(h[2]), RATE_OK);
    rate_limiter_free(lim);
    rate_rules_free(r);
}

#define HOLDERS 8
#define ROUNDS 400

typedef struct holder {
    rate_rules_t *r;
    rate_limiter_t *lim;
    _Atomic int *in;   /* holders holding now */
    _Atomic int *most; /* the most seen at once */
    _Atomic int *done; /* holders finished */
    unsigned granted, errors;
} holder_t;

static void *hold_loop(void *arg)
{
    holder_t *h = arg;
    rate_attr_t a = {"route", "/slow"};
    for (int i = 0; i < ROUNDS; i++) {
        rate_outcome_t o;
        rate_rules_held_t *held;
        if (rate_rules_acquire(h->r, h->lim, "k", 1, &a, 1, 1, 0, &o,
                               &held) != RATE_OK) {
            h->errors++;
            continue;
        }
        if (held == NULL)
            continue;
        h->granted++;
        int now = atomic_fetch_add(h->in, 1) + 1;
        int seen = atomic_load(h->most);
        while (now > seen && !atomic_compare_exchange_weak(h->most, &seen, now))
            ;
        sched_yield();
        atomic_fetch_sub(h->in, 1);
        if (rate_rules_release(held) != RATE_OK)
            h->errors++;
    }
    atomic_fetch_add(h->done, 1);
    return NULL;
}

/* Threads hold leases while the file flips between N = 4 and N = 2. */
static void holders_across_reloads(void **state)
{
    (void)state;
    char err[512];
    char *four = strdup(slow_rules), *two = strdup(slow_rules);
    strstr(four, "concurrency 2")[sizeof "concurrency " - 1] = '4';
    rate_rules_t *r = load(four);
    const char *pa = test_dir_file("four.conf", four);
    const char *pb = test_dir_file("two.conf", two);
    rate_limiter_config_t cfg = {0}; /* the library's clock: real leases */
    rate_limiter_t *lim = limiter_cfg("name=none unlimited", cfg);
    _Atomic int in = 0, most = 0, done = 0;
    holder_t h[HOLDERS];
    pthread_t t[HOLDERS];
    for (int i = 0; i < HOLDERS; i++) {
        h[i] = (holder_t){r, lim, &in, &most, &done, 0, 0};
        assert_int_equal(pthread_create(&t[i], NULL, hold_loop, &h[i]), 0);
    }
    unsigned reloads = 0; /* while the holders run: at least 20 */
    for (; atomic_load(&done) < HOLDERS || reloads < 20; reloads++)
        assert_int_equal(rate_rules_reload(r, reloads % 2 ? pa : pb, err,
                                           sizeof err),
                         RATE_OK);
    unsigned granted = 0;
    for (int i = 0; i < HOLDERS; i++) {
        pthread_join(t[i], NULL);
        assert_int_equal(h[i].errors, 0);
        granted += h[i].granted;
    }
    assert_true(atomic_load(&most) <= 4);
    assert_true(granted > 0);
    /* Every lease back: the current N (2, the last file) exactly. */
    assert_int_equal(rate_rules_reload(r, pb, err, sizeof err), RATE_OK);
    assert_int_equal(rate__rules_live(r), 1);
    rate_rules_held_t *k[3];
    rate_attr_t a = {"route", "/slow"};
    rate_outcome_t o;
    for (int i = 0; i < 3; i++)
        assert_int_equal(rate_rules_acquire(r, lim, "k", 1, &a, 1, 1, 0, &o,
                                            &k[i]),
                         RATE_OK);
    assert_non_null(k[0]);
    assert_non_null(k[1]);
    assert_null(k[2]);
    rate_rules_release(k[0]);
    rate_rules_release(k[1]);
    print_message("%u reloads, %u leases granted, at most %d held at once\n",
                  reloads, granted, atomic_load(&most));
    free(four);
    free(two);
    rate_limiter_free(lim);
    rate_rules_free(r);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(exactly_n_held),
        cmocka_unit_test(all_or_nothing),
        cmocka_unit_test(class_from_rule_or_attribute),
        cmocka_unit_test(errors_name_the_line),
        cmocka_unit_test(store_failure_denies),
        cmocka_unit_test(reload_keeps_leases_held),
    };
    const struct CMUnitTest threads[] = {
        cmocka_unit_test(holders_across_reloads),
    };
    /* --threads: the concurrency part (its own ctest, label concurrency). */
    if (argc > 1 && strcmp(argv[1], "--threads") == 0)
        return cmocka_run_group_tests(threads, test_dir_setup, test_dir_teardown);
    return cmocka_run_group_tests(tests, test_dir_setup, test_dir_teardown);
}
