/*
 * The policy text form and validation: every bad part gets an error that
 * names it.
 */
#include "helpers.h"

static void parses_each_algorithm(void **state)
{
    (void)state;
    struct {
        const char *text;
        rate_algorithm_t algo;
        uint64_t limit, period, burst;
        const char *canonical;
    } cases[] = {
        {"token-bucket 10/s burst=20", RATE_TOKEN_BUCKET, 10, SEC, 20,
         "token-bucket 10/s burst=20"},
        {"gcra 3/500ms burst=1", RATE_TOKEN_BUCKET, 3, 500 * MS, 1,
         "token-bucket 3/500ms burst=1"},
        {"token-bucket 10/s", RATE_TOKEN_BUCKET, 10, SEC, 10,
         "token-bucket 10/s burst=10"},
        {"  leaky-bucket\t5/2s  capacity=7 ", RATE_LEAKY_BUCKET, 5, 2 * SEC, 7,
         "leaky-bucket 5/2s capacity=7"},
        {"fixed-window 100/1m", RATE_FIXED_WINDOW, 100, 60 * SEC, 0,
         "fixed-window 100/m"},
        {"sliding-log 100/90s", RATE_SLIDING_LOG, 100, 90 * SEC, 0,
         "sliding-log 100/90s"},
        {"sliding-window 1000/1h", RATE_SLIDING_WINDOW, 1000, 3600 * SEC, 0,
         "sliding-window 1000/h"},
        {"sliding-window-counter 5/250us", RATE_SLIDING_WINDOW, 5, 250000, 0,
         "sliding-window 5/250us"},
        {"fixed-window 1/7ns", RATE_FIXED_WINDOW, 1, 7, 0,
         "fixed-window 1/7ns"},
        {"fixed-window 2/d", RATE_FIXED_WINDOW, 2, 86400 * SEC, 0,
         "fixed-window 2/d"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        rate_policy_t *p = policy_of(cases[i].text);
        const rate_limit_t *l = rate_policy_limit(p, 0);
        char buf[128];
        assert_int_equal(rate_policy_count(p), 1);
        assert_int_equal(l->algorithm, cases[i].algo);
        assert_int_equal(l->limit, cases[i].limit);
        assert_int_equal(l->period_ns, cases[i].period);
        assert_int_equal(l->burst, cases[i].burst);
        rate_policy_format(p, buf, sizeof buf);
        assert_string_equal(buf, cases[i].canonical);
        rate_policy_free(p);
    }
}

static void composite_round_trip(void **state)
{
    (void)state;
    rate_policy_t *p =
        policy_of("token-bucket 10/s burst=10; sliding-window 1000/1h");
    char buf[128];
    assert_int_equal(rate_policy_count(p), 2);
    assert_int_equal(rate_policy_limit(p, 1)->algorithm, RATE_SLIDING_WINDOW);
    assert_null(rate_policy_limit(p, 2));
    size_t need = rate_policy_format(p, buf, sizeof buf);
    assert_string_equal(buf, "token-bucket 10/s burst=10; sliding-window 1000/h");
    assert_int_equal(need, strlen(buf));
    /* Truncation still terminates the string and reports the full size. */
    assert_int_equal(rate_policy_format(p, buf, 8), need);
    assert_int_equal(strlen(buf), 7);
    /* The canonical text parses back to the same policy. */
    rate_policy_format(p, buf, sizeof buf);
    rate_policy_t *q = policy_of(buf);
    assert_memory_equal(rate_policy_limit(q, 1), rate_policy_limit(p, 1),
                        sizeof(rate_limit_t));
    rate_policy_free(q);
    rate_policy_free(p);
}

static void errors_name_the_bad_part(void **state)
{
    (void)state;
    struct {
        const char *text;
        const char *needle;
    } cases[] = {
        {"token-bucket 0/s burst=1", "count is zero"},
        {"token-bucket 10/0s burst=1", "period is zero"},
        {"fixed-window 10/0ms", "window is zero"},
        {"token-bucket 10/s burst=0", "burst is zero"},
        {"leaky-bucket 10/s capacity=0", "capacity is zero"},
        {"token-bucket 10/fortnight", "'fortnight'"},
        {"token-bucket 10/3x", "'3x'"},
        {"token-bucket 10 burst=1", "not COUNT/DURATION"},
        {"token-bucket x/s", "count 'x'"},
        {"token-bucket -1/s", "count '-1'"},
        {"token-bucket 99999999999999999999/s", "count"},
        {"token-bucket 1/99999999999d", "above 2^63-1"},
        {"token-bucket 10/s capacity=3", "does not belong to token-bucket"},
        {"leaky-bucket 10/s burst=3", "does not belong to leaky-bucket"},
        {"fixed-window 10/s burst=3", "does not belong to fixed-window"},
        {"token-bucket 10/s speed=3", "unknown option 'speed'"},
        {"token-bucket 10/s burst", "not NAME=VALUE"},
        {"token-bucket 10/s burst=1x", "burst value '1x'"},
        {"token-bucket 10/d burst=99999999", "exceeds 2^62"},
        {"fixed-window 10/36500d", "above 2^61"},
        {"sliding-log 20000/s", "limit 20000 above 10000"},
        {"tocken-bucket 10/s", "unknown algorithm 'tocken-bucket'"},
        {"token-bucket", "needs a rate"},
        {"", "limit 1 is empty"},
        {"fixed-window 1/s;", "limit 2 is empty"},
        {"fixed-window 1/s; fixed-window 1/s; fixed-window 1/s; "
         "fixed-window 1/s; fixed-window 1/s",
         "more than 4 limits"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        rate_policy_t *p = (rate_policy_t *)1;
        char err[256] = "";
        int rc = rate_policy_parse(cases[i].text, &p, err, sizeof err);
        if (rc != RATE_EPOLICY || p != NULL ||
            strstr(err, cases[i].needle) == NULL)
            fail_msg("'%s': rc=%d err='%s', wanted '%s'", cases[i].text, rc,
                     err, cases[i].needle);
    }
    rate_policy_t *p;
    assert_int_equal(rate_policy_parse(NULL, &p, NULL, 0), RATE_EPOLICY);
    assert_int_equal(rate_policy_parse("gcra 1/s", NULL, NULL, 0), RATE_EINVAL);
}

static void from_c(void **state)
{
    (void)state;
    rate_limit_t l[2] = {
        {RATE_TOKEN_BUCKET, 5, SEC, 10},
        {RATE_SLIDING_LOG, 100, 60 * SEC, 0},
    };
    rate_policy_t *p = NULL;
    char err[200];
    assert_int_equal(rate_policy_new(l, 2, &p, err, sizeof err), RATE_OK);
    assert_int_equal(rate_policy_count(p), 2);
    rate_policy_free(p);
    l[1].burst = 3;
    assert_int_equal(rate_policy_new(l, 2, &p, err, sizeof err), RATE_EPOLICY);
    assert_non_null(strstr(err, "limit 2"));
    l[1].burst = 0;
    l[0].algorithm = (rate_algorithm_t)42;
    assert_int_equal(rate_policy_new(l, 2, &p, err, sizeof err), RATE_EPOLICY);
    assert_non_null(strstr(err, "unknown algorithm"));
    assert_int_equal(rate_policy_new(l, 0, &p, err, sizeof err), RATE_EPOLICY);
    assert_int_equal(rate_policy_new(NULL, 1, &p, err, sizeof err),
                     RATE_EPOLICY);
    rate_policy_free(NULL);
}

static void durations(void **state)
{
    (void)state;
    uint64_t ns;
    assert_int_equal(rate_parse_duration("250ms", &ns), RATE_OK);
    assert_int_equal(ns, 250 * MS);
    assert_int_equal(rate_parse_duration("0", &ns), RATE_OK);
    assert_int_equal(ns, 0);
    assert_int_equal(rate_parse_duration("2h", &ns), RATE_OK);
    assert_int_equal(ns, 7200 * SEC);
    assert_int_equal(rate_parse_duration("s", &ns), RATE_EINVAL);
    assert_int_equal(rate_parse_duration("5", &ns), RATE_EINVAL);
    assert_int_equal(rate_parse_duration("1.5s", &ns), RATE_EINVAL);
    assert_int_equal(rate_parse_duration("107000d", &ns), RATE_ERANGE);
    assert_int_equal(rate_parse_duration(NULL, &ns), RATE_EINVAL);
}

static void error_texts(void **state)
{
    (void)state;
    assert_string_equal(rate_strerror(RATE_EKEY),
                        "key is NULL, empty or longer than RATE_KEY_MAX bytes");
    assert_string_equal(rate_err_name(RATE_ECONFLICT), "RATE_ECONFLICT");
    assert_string_equal(rate_strerror(RATE_OK), "success");
    assert_string_equal(rate_strerror(-999), "unknown error");
    assert_string_equal(rate_reason_name(RATE_REASON_NEVER), "never");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(parses_each_algorithm),
        cmocka_unit_test(composite_round_trip),
        cmocka_unit_test(errors_name_the_bad_part),
        cmocka_unit_test(from_c),
        cmocka_unit_test(durations),
        cmocka_unit_test(error_texts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
