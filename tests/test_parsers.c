/* SPDX-License-Identifier: MIT */
/*
 * The command's input parsers, line by line: trace lines (spec) and access
 * logs in Common / Combined Log Format, well-formed and malformed.
 */
#include "lib/helpers.h"

#include "keymap.h"
#include "trace.h"

#include <xxhash.h> /* the library's XXH3, not inlined */

static int parse(const char *line, trace_req_t *r, const char **err)
{
    return trace_parse_line(line, strlen(line), r, err);
}

static void trace_lines(void **state)
{
    (void)state;
    trace_req_t r;
    const char *err = NULL;
    assert_int_equal(parse("12.000345 user:1 3", &r, &err), TRACE_REQ);
    assert_int_equal(r.t_ns, 12000345000);
    assert_int_equal(r.permits, 3);
    assert_int_equal(r.key_len, 6);
    assert_memory_equal(r.key, "user:1", 6);
    assert_int_equal(parse(" \t0003.50\tk\t007 \r", &r, &err), TRACE_REQ);
    assert_int_equal(r.t_ns, 3500000000);
    assert_int_equal(r.permits, 7);
    assert_int_equal(r.time_len, 7); /* echoed as written */
    assert_int_equal(parse("0 k", &r, &err), TRACE_REQ);
    assert_int_equal(r.permits, 1);
    assert_int_equal(parse("9223372036.854775807 k", &r, &err), TRACE_REQ);
    assert_int_equal(r.t_ns, INT64_MAX);
    assert_int_equal(parse("   ", &r, &err), TRACE_SKIP);
    assert_int_equal(parse("", &r, &err), TRACE_SKIP);
    assert_int_equal(parse("  # 1 k", &r, &err), TRACE_SKIP);
    assert_int_equal(parse("\r", &r, &err), TRACE_SKIP);
    static const char *bad[] = {
        "1. k", ".5 k", "-1 k", "1e3 k", "0x10 k", "1.2.3 k", "5",
        "1 k 2 3", "1 k -1", "1 k 1.5", "1.0000000001 k",
        "9223372036.854775808 k", "99999999999999999999 k",
        "1 k 9223372036854775808",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err = NULL;
        if (parse(bad[i], &r, &err) != TRACE_ERR || err == NULL)
            fail_msg("'%s' should be an error", bad[i]);
    }
    /* Binary bytes in a key are kept as they are. */
    const char nul[] = "1 a\0b 2";
    assert_int_equal(trace_parse_line(nul, sizeof nul - 1, &r, &err), TRACE_REQ);
    assert_int_equal(r.key_len, 3);
}

/* Finer times: nginx's $msec, ISO 8601, JSON lines. */
static void clock_times_and_json(void **state)
{
    (void)state;
    trace_req_t r;
    const char *err = NULL;
    uint64_t t;
    assert_int_equal(trace_parse_clock("1764644400.123", 14, &t, &err), 0);
    assert_int_equal(t, UINT64_C(1764644400123000000));
    const char *iso = "2025-12-02T03:00:00.25+01:00";
    assert_int_equal(trace_parse_clock(iso, strlen(iso), &t, &err), 0);
    assert_int_equal(t, UINT64_C(1764640800250000000));
    iso = "2025-12-02T03:00:00Z";
    assert_int_equal(trace_parse_clock(iso, strlen(iso), &t, &err), 0);
    assert_int_equal(t, UINT64_C(1764644400000000000));
    const char *clf_ts = "02/Dec/2025:03:00:00 +0000";
    assert_int_equal(trace_parse_clock(clf_ts, 26, &t, &err), 0);
    assert_int_equal(t, UINT64_C(1764644400000000000));
    static const char *bad_times[] = {"yesterday", "2025-13-02T03:00:00Z",
                                      "2025-12-02T03:00:00+1", "1.",
                                      "2025-12-02T03:00:00.Z", "-5"};
    for (size_t i = 0; i < sizeof bad_times / sizeof bad_times[0]; i++) {
        err = NULL;
        if (trace_parse_clock(bad_times[i], strlen(bad_times[i]), &t,
                              &err) == 0 || err == NULL)
            fail_msg("'%s' should not be a time", bad_times[i]);
    }
    const char *j = " {\"req\": {\"u\": \"}\\\"\", \"a\": [1, {}]}, \"time\": "
                    "1764644400.5, \"remote_addr\" : \"10.0.0.1\"}\r";
    assert_int_equal(json_parse_line(j, strlen(j), "remote_addr", "time", &r,
                                     &err), TRACE_REQ);
    assert_int_equal(r.t_ns, UINT64_C(1764644400500000000));
    assert_int_equal(r.key_len, 8);
    assert_memory_equal(r.key, "10.0.0.1", 8);
    assert_int_equal(r.time_len, 12);
    assert_int_equal(r.permits, 1);
    /* A nested member of the same name is not the key. */
    j = "{\"x\":{\"ip\":\"no\"},\"ip\":\"yes\",\"t\":\"1\"}";
    assert_int_equal(json_parse_line(j, strlen(j), "ip", "t", &r, &err),
                     TRACE_REQ);
    assert_memory_equal(r.key, "yes", 3);
    assert_int_equal(json_parse_line("  ", 2, "k", "t", &r, &err),
                     TRACE_SKIP);
    static const char *bad[] = {
        "[1]", "{\"t\":\"1\"}", "{\"k\":\"a\"}", "{\"k\":\"a\",\"t\":\"x\"}",
        "{\"k\":\"a\" \"t\":\"1\"}", "{\"k\":\"a\",\"t\":\"1\"", "{\"k\" \"a\"}",
        "{\"k\":\"\",\"t\":\"1\"}", "{\"k\":{\"a\":1},\"t\":\"1\"}", "{k:1}",
        "{\"k\":\"a\",\"t\":\"1\",\"x\":[1,2}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err = NULL;
        if (json_parse_line(bad[i], strlen(bad[i]), "k", "t", &r, &err) !=
                TRACE_ERR || err == NULL)
            fail_msg("'%s' should be an error", bad[i]);
    }
    /* A CLF line with $msec as field 8. */
    const char *l = "10.0.0.1 - - [02/Dec/2025:03:00:00 +0000] \"GET / "
                    "HTTP/1.1\" 200 5 1764644400.125";
    assert_int_equal(clf_parse_line_at(l, strlen(l), CLF_HOST, 7, &r, &err),
                     TRACE_REQ);
    assert_int_equal(r.t_ns, UINT64_C(1764644400125000000));
    assert_int_equal(r.time_len, 14);
    assert_int_equal(clf_parse_line_at(l, strlen(l), CLF_HOST, 8, &r, &err),
                     TRACE_ERR);
}

static int clf(const char *line, clf_field_t f, trace_req_t *r,
               const char **err)
{
    return clf_parse_line(line, strlen(line), f, r, err);
}

static void access_logs(void **state)
{
    (void)state;
    trace_req_t r;
    const char *err = NULL;
    const char *common =
        "127.0.0.1 - frank [10/Oct/2000:13:55:36 -0700] \"GET /apache_pb.gif "
        "HTTP/1.0\" 200 2326";
    assert_int_equal(clf(common, CLF_HOST, &r, &err), TRACE_REQ);
    assert_int_equal(r.t_ns, UINT64_C(971211336) * SEC); /* 20:55:36 UTC */
    assert_memory_equal(r.key, "127.0.0.1", r.key_len);
    assert_int_equal(r.time_len, 26);
    assert_int_equal(clf(common, CLF_USER, &r, &err), TRACE_REQ);
    assert_memory_equal(r.key, "frank", 5);
    assert_int_equal(clf(common, CLF_PATH, &r, &err), TRACE_REQ);
    assert_int_equal(r.key_len, 14);
    assert_memory_equal(r.key, "/apache_pb.gif", 14);
    assert_int_equal(clf(common, CLF_METHOD, &r, &err), TRACE_REQ);
    assert_memory_equal(r.key, "GET", 3);
    assert_int_equal(clf(common, CLF_STATUS, &r, &err), TRACE_REQ);
    assert_memory_equal(r.key, "200", 3);
    assert_int_equal(clf(common, CLF_AGENT, &r, &err), TRACE_ERR);

    const char *combined =
        "2001:db8::1 - - [01/Jan/2024:00:00:00 +0100] \"POST /api/v1/items "
        "HTTP/2.0\" 429 0 \"https://example.com/\" \"Mozilla/5.0 (X11; "
        "Linux) \\\"quoted\\\"\"";
    assert_int_equal(clf(combined, CLF_AGENT, &r, &err), TRACE_REQ);
    assert_int_equal(r.key_len, 35); /* escapes kept as written */
    assert_int_equal(clf(combined, CLF_HOST, &r, &err), TRACE_REQ);
    assert_int_equal(r.t_ns, UINT64_C(1704063600) * SEC); /* 23:00 UTC */
    assert_int_equal(clf(combined, CLF_REFERER, &r, &err), TRACE_REQ);
    assert_memory_equal(r.key, "https://example.com/", r.key_len);

    static const char *bad[] = {
        "",
        "1.2.3.4",
        "1.2.3.4 - - [10/Oct/2000:13:55:36 -0700]",
        "1.2.3.4 - - [10/Oct/2000:13:55:36 -0700 \"GET /\" 200 1",
        "1.2.3.4 - - [10/Oct/2000:13:55:36] \"GET /\" 200 1",
        "1.2.3.4 - - [32/Oct/2000:13:55:36 -0700] \"GET /\" 200 1",
        "1.2.3.4 - - [10/Oct/1969:13:55:36 -0700] \"GET /\" 200 1",
        "1.2.3.4 - - [10/Oct/2000:25:55:36 -0700] \"GET /\" 200 1",
        "1.2.3.4 - - [10/Oct/2000:13:55:36 -0700] \"GET /\" OK 1",
        "1.2.3.4 - - [10/Oct/2000:13:55:36 -0700] \"GET /\" 200 1 \"a\" \"b",
        "1.2.3.4 - - [10/Oct/2000:13:55:36 -0700] \"GET /\" 200 1 [x",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int rc = clf(bad[i], CLF_HOST, &r, &err);
        if (i == 0 ? rc != TRACE_SKIP : rc != TRACE_ERR)
            fail_msg("'%s': rc %d", bad[i], rc);
    }
    assert_int_equal(clf_field_from_name("agent"), CLF_AGENT);
    assert_int_equal(clf_field_from_name("size"), -1);
}

/* Real logs: fields after the Combined format's (nginx's
 * "$http_x_forwarded_for", a request time), the key from any field, the
 * forwarded-for address, and nginx's "-" for a request it could not read. */
static void access_log_fields(void **state)
{
    (void)state;
    trace_req_t r;
    const char *err = NULL;
    const char *xff =
        "10.0.0.1 - - [01/Jan/2024:00:00:00 +0000] \"GET /a?b HTTP/1.1\" 200 "
        "5 \"-\" \"curl/8\" \" 203.0.113.7 , 10.0.0.9\" 0.004";
    assert_int_equal(clf(xff, CLF_HOST, &r, &err), TRACE_REQ);
    assert_memory_equal(r.key, "10.0.0.1", r.key_len);
    assert_int_equal(clf(xff, CLF_XFF, &r, &err), TRACE_REQ);
    assert_int_equal(r.key_len, 11);
    assert_memory_equal(r.key, "203.0.113.7", 11);
    assert_int_equal(clf(xff, CLF_AGENT, &r, &err), TRACE_REQ);
    assert_memory_equal(r.key, "curl/8", r.key_len);
    assert_int_equal(clf(xff, (clf_field_t)clf_field_from_name("11"), &r,
                         &err), TRACE_REQ);
    assert_int_equal(r.key_len, 5);
    assert_memory_equal(r.key, "0.004", 5);
    assert_int_equal(clf(xff, (clf_field_t)clf_field_from_name("4"), &r,
                         &err), TRACE_REQ);
    assert_int_equal(r.key_len, 26); /* the time, without its brackets */
    assert_int_equal(clf(xff, (clf_field_t)clf_field_from_name("12"), &r,
                         &err), TRACE_ERR);
    /* No forwarded-for field, or "-": the host. */
    const char *dash =
        "10.0.0.2 - - [01/Jan/2024:00:00:00 +0000] \"-\" 400 0 \"-\" \"-\" "
        "\"-\"";
    assert_int_equal(clf(dash, CLF_XFF, &r, &err), TRACE_REQ);
    assert_memory_equal(r.key, "10.0.0.2", r.key_len);
    assert_int_equal(clf(dash, CLF_PATH, &r, &err), TRACE_REQ);
    assert_int_equal(r.key_len, 1);
    assert_memory_equal(r.key, "-", 1);
    assert_int_equal(clf(dash, CLF_METHOD, &r, &err), TRACE_REQ);
    assert_memory_equal(r.key, "-", 1);
    const char *common =
        "10.0.0.3 - - [01/Jan/2024:00:00:00 +0000] \"GET / HTTP/1.0\" 200 1";
    assert_int_equal(clf(common, CLF_XFF, &r, &err), TRACE_REQ);
    assert_memory_equal(r.key, "10.0.0.3", r.key_len);
    /* One trailing field after the Common format is fine too. */
    const char *one = "1.2.3.4 - - [10/Oct/2000:13:55:36 -0700] \"GET /\" 200 1 "
                      "\"ref\"";
    assert_int_equal(clf(one, CLF_REFERER, &r, &err), TRACE_REQ);
    assert_memory_equal(r.key, "ref", 3);
    assert_int_equal(clf(one, CLF_AGENT, &r, &err), TRACE_ERR);
    assert_int_equal(clf_field_from_name("xff"), CLF_XFF);
    assert_int_equal(clf_field_from_name("1"), CLF_FIELD_1);
    assert_int_equal(clf_field_from_name("64"), CLF_FIELD_1 + 63);
    assert_int_equal(clf_field_from_name("0"), -1);
    assert_int_equal(clf_field_from_name("65"), -1);
    assert_int_equal(clf_field_from_name("01"), -1);
    assert_int_equal(clf_field_from_name(""), -1);
}

/* Access-log times: impossible dates and zones, and the largest time
 * (2^63-1 ns) are errors with a message, never a wrong time. */
static void access_log_times(void **state)
{
    (void)state;
    static const struct {
        const char *ts;
        uint64_t secs; /* 0: an error */
    } cases[] = {
        {"29/Feb/2024:00:00:00 +0000", 1709164800},
        {"29/Feb/2000:00:00:00 +0000", 951782400},
        {"29/Feb/2021:00:00:00 +0000", 0},
        {"29/Feb/1900:00:00:00 +0000", 0}, /* and before 1970 anyway */
        {"29/Feb/2100:00:00:00 +0000", 0},
        {"31/Feb/2024:00:00:00 +0000", 0},
        {"30/Feb/2024:00:00:00 +0000", 0},
        {"31/Apr/2024:00:00:00 +0000", 0},
        {"30/Apr/2024:00:00:00 +0000", 1714435200},
        {"31/Dec/2024:23:59:59 +0000", 1735689599},
        {"00/Jan/2024:00:00:00 +0000", 0},
        {"01/Jan/2024:00:00:00 +1400", 1704016800},
        {"01/Jan/2024:00:00:00 -1200", 1704110400},
        {"01/Jan/2024:00:00:00 +1500", 0},
        {"01/Jan/2024:00:00:00 +9900", 0},
        {"01/Jan/2024:00:00:00 -9959", 0},
        {"11/Apr/2262:23:47:16 +0000", UINT64_C(9223372036)},
        {"11/Apr/2262:23:47:17 +0000", 0},
        {"12/Apr/2262:00:47:16 +0100", UINT64_C(9223372036)},
        {"01/Jan/2263:00:00:00 +0000", 0},
        {"01/Jan/2600:00:00:00 +0000", 0},
        {"01/Jan/9999:00:00:00 +0000", 0},
        {"01/Jan/1970:00:00:00 +0100", 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char line[160];
        trace_req_t r;
        const char *err = NULL;
        snprintf(line, sizeof line, "1.2.3.4 - - [%s] \"GET /\" 200 1",
                 cases[i].ts);
        int rc = clf(line, CLF_HOST, &r, &err);
        if (cases[i].secs == 0) {
            if (rc != TRACE_ERR || err == NULL ||
                strncmp(err, "timestamp", 9) != 0)
                fail_msg("'%s' should be a timestamp error (rc %d, t %llu)",
                         cases[i].ts, rc, (unsigned long long)r.t_ns);
        } else if (rc != TRACE_REQ || r.t_ns != cases[i].secs * SEC) {
            fail_msg("'%s': rc %d, t %llu s", cases[i].ts, rc,
                     (unsigned long long)(r.t_ns / SEC));
        }
    }
}

/* --per-key's key table: 3000 keys crafted to collide in the low 13 bits
 * of the unseeded hash (all in slot 0 of every table up to 8192 slots)
 * still cost a few probes each, not a scan of all the keys before them
 * (20,000 such keys took 0.45 s against 0.03 s). */
static void keymap_crafted_keys(void **state)
{
    (void)state;
    enum { N = 3000 };
    static char keys[N][16];
    size_t n = 0;
    for (uint32_t i = 0; n < N; i++) {
        char k[16];
        int len = snprintf(k, sizeof k, "k%u", i);
        if ((XXH3_64bits(k, (size_t)len) & 8191) == 0)
            memcpy(keys[n++], k, sizeof k);
    }
    keymap_t m = {0};
    for (size_t i = 0; i < N; i++)
        assert_non_null(keymap_get(&m, keys[i], strlen(keys[i])));
    for (size_t i = 0; i < N; i++) /* found again, not added */
        assert_non_null(keymap_get(&m, keys[i], strlen(keys[i])));
    assert_int_equal(m.n, N);
    if (m.probes > 20 * (uint64_t)N)
        fail_msg("%llu probes for %d keys", (unsigned long long)m.probes, N);
    /* in first-seen order */
    assert_memory_equal(m.recs[0].key, keys[0], m.recs[0].len);
    assert_memory_equal(m.recs[N - 1].key, keys[N - 1], m.recs[N - 1].len);
    keymap_free(&m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(trace_lines),
        cmocka_unit_test(clock_times_and_json),
        cmocka_unit_test(access_logs),
        cmocka_unit_test(access_log_fields),
        cmocka_unit_test(access_log_times),
        cmocka_unit_test(keymap_crafted_keys),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
