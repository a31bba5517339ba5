/* SPDX-License-Identifier: MIT */
/*
 * Trace and access-log parsing.  See trace.h.
 */
#include "trace.h"

#include <stdbool.h>
#include <string.h>

#define NS_PER_S UINT64_C(1000000000)
#define MAX63 UINT64_C(9223372036854775807)

static bool blank(char c)
{
    return c == ' ' || c == '\t';
}

static bool digit(char c)
{
    return c >= '0' && c <= '9';
}

int trace_parse_time(const char *s, size_t len, uint64_t *out, const char **err)
{
    size_t i = 0;
    uint64_t sec = 0, frac = 0;

    while (i < len && digit(s[i])) {
        uint64_t d = (uint64_t)(s[i] - '0');
        if (sec > (MAX63 / NS_PER_S - d) / 10 + 1) {
            *err = "TIME above 2^63-1 ns";
            return -1;
        }
        sec = sec * 10 + d;
        i++;
    }
    if (i == 0) {
        *err = "TIME is not a non-negative decimal number of seconds";
        return -1;
    }
    if (i < len) {
        if (s[i] != '.') {
            *err = "TIME is not a non-negative decimal number of seconds";
            return -1;
        }
        size_t start = ++i, n;
        while (i < len && digit(s[i]))
            i++;
        n = i - start;
        if (n == 0 || i < len) {
            *err = n == 0 ? "TIME has a '.' without digits after it"
                          : "TIME is not a non-negative decimal number of seconds";
            return -1;
        }
        if (n > 9) {
            *err = "TIME has more than 9 fractional digits";
            return -1;
        }
        for (size_t k = 0; k < 9; k++)
            frac = frac * 10 + (k < n ? (uint64_t)(s[start + k] - '0') : 0);
    }
    /* sec * 1e9 + frac <= 2^63 - 1, without overflowing on the way. */
    if (sec > MAX63 / NS_PER_S ||
        sec * NS_PER_S > MAX63 - frac) {
        *err = "TIME above 2^63-1 ns";
        return -1;
    }
    *out = sec * NS_PER_S + frac;
    return 0;
}

static int parse_permits(const char *s, size_t len, uint64_t *out,
                         const char **err)
{
    uint64_t v = 0;

    for (size_t i = 0; i < len; i++) {
        if (!digit(s[i])) {
            *err = "PERMITS is not a whole number";
            return -1;
        }
        uint64_t d = (uint64_t)(s[i] - '0');
        if (v > (MAX63 - d) / 10) {
            *err = "PERMITS above 2^63-1";
            return -1;
        }
        v = v * 10 + d;
    }
    *out = v;
    return 0;
}

/* Next run of non-blank bytes at or after *i; false when none is left. */
static bool next_field(const char *s, size_t len, size_t *i, const char **f,
                       size_t *flen)
{
    while (*i < len && blank(s[*i]))
        (*i)++;
    if (*i == len)
        return false;
    *f = s + *i;
    while (*i < len && !blank(s[*i]))
        (*i)++;
    *flen = (size_t)(s + *i - *f);
    return true;
}

int trace_parse_line(const char *s, size_t len, trace_req_t *out,
                     const char **err)
{
    const char *f[4];
    size_t fl[4], i = 0, n = 0;

    if (len > 0 && s[len - 1] == '\r')
        len--;
    while (n < 4 && next_field(s, len, &i, &f[n], &fl[n]))
        n++;
    if (n == 0 || f[0][0] == '#')
        return TRACE_SKIP;
    if (n == 1) {
        *err = "missing KEY (a line is TIME KEY [PERMITS])";
        return TRACE_ERR;
    }
    if (n == 4) {
        *err = "too many fields (a line is TIME KEY [PERMITS])";
        return TRACE_ERR;
    }
    if (trace_parse_time(f[0], fl[0], &out->t_ns, err) != 0)
        return TRACE_ERR;
    out->time_text = f[0];
    out->time_len = fl[0];
    out->key = f[1];
    out->key_len = fl[1];
    out->permits = 1;
    if (n == 3 && parse_permits(f[2], fl[2], &out->permits, err) != 0)
        return TRACE_ERR;
    return TRACE_REQ;
}

/* ----------------------------------------------------------------- CLF */

static const char *const field_names[] = {
    "host", "ident", "user", "request", "method", "path", "status",
    "referer", "agent",
};

int clf_field_from_name(const char *name)
{
    for (size_t i = 0; i < sizeof field_names / sizeof field_names[0]; i++)
        if (strcmp(name, field_names[i]) == 0)
            return (int)i;
    if (strcmp(name, "xff") == 0)
        return CLF_XFF;
    unsigned v = 0;
    size_t n = strlen(name);
    if (n == 0 || n > 2 || name[0] == '0')
        return -1;
    for (size_t i = 0; i < n; i++) {
        if (!digit(name[i]))
            return -1;
        v = v * 10 + (unsigned)(name[i] - '0');
    }
    return v >= 1 && v <= CLF_MAX_FIELDS ? CLF_FIELD_1 + (int)v - 1 : -1;
}

/* Days from 1970-01-01 to y-m-d (proleptic Gregorian). */
static int64_t days_from_civil(int64_t y, unsigned m, unsigned d)
{
    y -= m <= 2;
    int64_t era = (y >= 0 ? y : y - 399) / 400;
    unsigned yoe = (unsigned)(y - era * 400);
    unsigned doy = (153 * (m + (m > 2 ? (unsigned)-3 : 9)) + 2) / 5 + d - 1;
    unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + (int64_t)doe - 719468;
}

static bool num(const char *s, size_t n, unsigned *out)
{
    unsigned v = 0;
    for (size_t i = 0; i < n; i++) {
        if (!digit(s[i]))
            return false;
        v = v * 10 + (unsigned)(s[i] - '0');
    }
    *out = v;
    return true;
}

/* "10/Oct/2000:13:55:36 -0700" into ns since the epoch. */
static int clf_time(const char *s, size_t n, uint64_t *out, const char **err)
{
    static const char months[] = "JanFebMarAprMayJunJulAugSepOctNovDec";
    unsigned d, y, hh, mm, ss, zh, zm, mon = 0;

    *err = "timestamp is not dd/Mon/yyyy:HH:MM:SS +zzzz (from 1970)";
    if (n != 26 || s[2] != '/' || s[6] != '/' || s[11] != ':' ||
        s[14] != ':' || s[17] != ':' || s[20] != ' ' ||
        (s[21] != '+' && s[21] != '-'))
        return -1;
    for (unsigned i = 0; i < 12; i++)
        if (memcmp(s + 3, months + 3 * i, 3) == 0)
            mon = i + 1;
    if (mon == 0 || !num(s, 2, &d) || !num(s + 7, 4, &y) ||
        !num(s + 12, 2, &hh) || !num(s + 15, 2, &mm) ||
        !num(s + 18, 2, &ss) || !num(s + 22, 2, &zh) || !num(s + 24, 2, &zm))
        return -1;
    static const unsigned mdays[12] = {31, 29, 31, 30, 31, 30,
                                       31, 31, 30, 31, 30, 31};
    bool leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    if (hh > 23 || mm > 59 || ss > 60 || zm > 59 || y < 1970)
        return -1;
    if (d < 1 || d > mdays[mon - 1] || (mon == 2 && d == 29 && !leap)) {
        *err = "timestamp has a day its month does not have (such as 31/Feb, "
               "or 29/Feb outside a leap year)";
        return -1;
    }
    if (zh > 14) {
        *err = "timestamp's zone is more than 14 hours from UTC";
        return -1;
    }
    int64_t secs = days_from_civil(y, mon, d) * 86400 + hh * 3600 + mm * 60 +
                   ss;
    int64_t zone = (int64_t)(zh * 3600 + zm * 60);
    secs += s[21] == '+' ? -zone : zone; /* local = UTC + zone */
    if (secs < 0) {
        *err = "timestamp before 1970-01-01 00:00:00 UTC";
        return -1;
    }
    if ((uint64_t)secs > MAX63 / NS_PER_S) {
        *err = "timestamp after 2262-04-11 23:47:16 UTC (2^63-1 ns from "
               "1970, the largest time)";
        return -1;
    }
    *out = (uint64_t)secs * NS_PER_S;
    return 0;
}

/* The next field at or after *i: a run of non-blanks, "[...]" or "\"...\""
 * (with \" escapes); *f and *flen its text without the brackets or quotes,
 * *kind its opening character (0 for a bare field).  1 for a field, 0 at
 * the end of the line, -1 for an unclosed bracket or quote. */
static int clf_next(const char *s, size_t len, size_t *i, const char **f,
                    size_t *flen, char *kind)
{
    while (*i < len && blank(s[*i]))
        (*i)++;
    if (*i == len)
        return 0;
    char open = s[*i];
    if (open != '[' && open != '"') {
        *kind = 0;
        *f = s + *i;
        while (*i < len && !blank(s[*i]))
            (*i)++;
        *flen = (size_t)(s + *i - *f);
        return 1;
    }
    char close = open == '[' ? ']' : '"';
    *kind = open;
    *f = s + ++(*i);
    while (*i < len && s[*i] != close) {
        if (open == '"' && s[*i] == '\\' && *i + 1 < len)
            (*i)++;
        (*i)++;
    }
    if (*i == len)
        return -1;
    *flen = (size_t)(s + *i - *f);
    (*i)++;
    return 1;
}

int clf_parse_line(const char *s, size_t len, clf_field_t key_field,
                   trace_req_t *out, const char **err)
{
    return clf_parse_line_at(s, len, key_field, -1, out, err);
}

int clf_parse_line_at(const char *s, size_t len, clf_field_t key_field,
                      int time_field, trace_req_t *out, const char **err)
{
    const char *f[CLF_MAX_FIELDS];
    size_t fl[CLF_MAX_FIELDS], i = 0, n = 0;
    char kind[CLF_MAX_FIELDS];
    static const char shape[7] = {0, 0, 0, '[', '"', 0, 0};
    static const char *const what[7] = {
        "missing host", "missing ident", "missing user",
        "missing or unclosed [timestamp]", "missing or unclosed \"request\"",
        "missing status", "missing bytes"};

    if (len > 0 && s[len - 1] == '\r')
        len--;
    size_t j = 0;
    while (j < len && blank(s[j]))
        j++;
    if (j == len || s[j] == '#')
        return TRACE_SKIP;
    for (;;) {
        const char *fp;
        size_t flen;
        char k;
        int rc = clf_next(s, len, &i, &fp, &flen, &k);
        if (rc == 0)
            break;
        if (rc < 0 || (n < 7 && k != shape[n])) {
            *err = n < 7 ? what[n] : "unclosed quote or bracket in a field "
                                     "after bytes";
            return TRACE_ERR;
        }
        if (n == CLF_MAX_FIELDS) {
            *err = "more than 64 fields";
            return TRACE_ERR;
        }
        f[n] = fp;
        fl[n] = flen;
        kind[n] = k;
        n++;
    }
    if (n < 7) {
        *err = what[n];
        return TRACE_ERR;
    }
    if (time_field < 0 && clf_time(f[3], fl[3], &out->t_ns, err) != 0)
        return TRACE_ERR;
    unsigned status;
    if (fl[5] != 3 || !num(f[5], 3, &status)) {
        *err = "status is not a 3-digit number";
        return TRACE_ERR;
    }
    out->time_text = f[3];
    out->time_len = fl[3];
    if (time_field >= 0) { /* --time-field N: a finer time, e.g. $msec */
        if ((size_t)time_field >= n) {
            *err = n <= 9 ? "the time field (--time-field) is absent on this "
                            "line: a combined log has 9 fields; --time-field "
                            "names one logged after them, such as nginx's "
                            "$msec as field 10 (without it, leave "
                            "--time-field out: the [time] field is read)"
                          : "the time field (--time-field) is absent on this "
                            "line: it has fewer fields";
            return TRACE_ERR;
        }
        if (trace_parse_clock(f[time_field], fl[time_field], &out->t_ns,
                              err) != 0)
            return TRACE_ERR;
        out->time_text = f[time_field];
        out->time_len = fl[time_field];
    }
    out->permits = 1;
    const char *k = NULL;
    size_t kl = 0;
    switch ((int)key_field) {
    case CLF_HOST: case CLF_IDENT: case CLF_USER:
        k = f[key_field];
        kl = fl[key_field];
        break;
    case CLF_REQUEST:
        k = f[4];
        kl = fl[4];
        break;
    case CLF_METHOD:
    case CLF_PATH: {
        /* A request without a space ("-": nginx could not read one) is
         * its own method and path. */
        const char *sp = memchr(f[4], ' ', fl[4]);
        if (key_field == CLF_METHOD || sp == NULL) {
            k = f[4];
            kl = sp ? (size_t)(sp - f[4]) : fl[4];
        } else {
            k = sp + 1;
            const char *end = memchr(k, ' ', fl[4] - (size_t)(k - f[4]));
            kl = end ? (size_t)(end - k) : fl[4] - (size_t)(k - f[4]);
        }
        break;
    }
    case CLF_STATUS:
        k = f[5];
        kl = fl[5];
        break;
    case CLF_REFERER:
    case CLF_AGENT: {
        size_t at = key_field == CLF_REFERER ? 7 : 8;
        if (n > at && kind[at] == '"') {
            k = f[at];
            kl = fl[at];
        }
        break;
    }
    case CLF_XFF: {
        k = f[0];
        kl = fl[0];
        for (size_t q = n; q-- > 9;) {
            if (kind[q] != '"')
                continue;
            /* The first address of the list: up to a comma, blanks off. */
            const char *a = f[q], *e = f[q] + fl[q];
            const char *comma = memchr(a, ',', fl[q]);
            if (comma != NULL)
                e = comma;
            while (a < e && blank(*a))
                a++;
            while (e > a && blank(e[-1]))
                e--;
            if (e > a && !(e - a == 1 && *a == '-')) {
                k = a;
                kl = (size_t)(e - a);
            }
            break;
        }
        break;
    }
    default: {
        size_t at = (size_t)key_field - CLF_FIELD_1;
        if (at < n) {
            k = f[at];
            kl = fl[at];
        }
        break;
    }
    }
    if (k == NULL || kl == 0) {
        *err = "the key field is empty or absent on this line";
        return TRACE_ERR;
    }
    out->key = k;
    out->key_len = kl;
    return TRACE_REQ;
}

/* ------------------------------------------------- clock times, JSON */

/* "2026-12-02T03:00:00[.fff][Z|+hh:mm|+hhmm]" (a space for the T too). */
static int iso_time(const char *s, size_t n, uint64_t *out, const char **err)
{
    unsigned y, mo, d, hh, mm, ss, zh = 0, zm = 0;
    uint64_t frac = 0;

    *err = "time is not YYYY-MM-DDTHH:MM:SS[.fraction][Z|+hh:mm] (from 1970)";
    if (n < 19 || s[4] != '-' || s[7] != '-' || (s[10] != 'T' &&
        s[10] != ' ') || s[13] != ':' || s[16] != ':' || !num(s, 4, &y) ||
        !num(s + 5, 2, &mo) || !num(s + 8, 2, &d) || !num(s + 11, 2, &hh) ||
        !num(s + 14, 2, &mm) || !num(s + 17, 2, &ss))
        return -1;
    size_t i = 19;
    if (i < n && (s[i] == '.' || s[i] == ',')) {
        size_t start = ++i;
        while (i < n && digit(s[i]))
            i++;
        if (i == start || i - start > 9) {
            *err = i == start ? "time has a '.' without digits after it"
                              : "time has more than 9 fractional digits";
            return -1;
        }
        for (size_t k = 0; k < 9; k++)
            frac = frac * 10 +
                   (start + k < i ? (uint64_t)(s[start + k] - '0') : 0);
    }
    int sign = 0;
    if (i < n && s[i] == 'Z') {
        i++;
    } else if (i < n && (s[i] == '+' || s[i] == '-')) {
        sign = s[i] == '+' ? 1 : -1;
        if (n - i == 6 && s[i + 3] == ':' && num(s + i + 1, 2, &zh) &&
            num(s + i + 4, 2, &zm))
            i += 6;
        else if (n - i == 5 && num(s + i + 1, 2, &zh) &&
                 num(s + i + 3, 2, &zm))
            i += 5;
        else
            return -1;
    }
    if (i != n || y < 1970 || mo < 1 || mo > 12 || d < 1 || d > 31 ||
        hh > 23 || mm > 59 || ss > 60 || zh > 14 || zm > 59)
        return -1;
    int64_t secs = days_from_civil(y, mo, d) * 86400 + hh * 3600 + mm * 60 +
                   ss - sign * (int64_t)(zh * 3600 + zm * 60);
    if (secs < 0 || (uint64_t)secs >= MAX63 / NS_PER_S) {
        *err = "time outside 1970 to 2262";
        return -1;
    }
    *out = (uint64_t)secs * NS_PER_S + frac;
    return 0;
}

int trace_parse_clock(const char *s, size_t n, uint64_t *out_ns,
                      const char **err)
{
    if (n == 26 && s[2] == '/')
        return clf_time(s, n, out_ns, err);
    if (n >= 19 && s[4] == '-')
        return iso_time(s, n, out_ns, err);
    if (trace_parse_time(s, n, out_ns, err) == 0)
        return 0;
    *err = "time is neither seconds since 1970 (1764644400.123, nginx's "
           "$msec), YYYY-MM-DDTHH:MM:SS[.fff][Z|+hh:mm] nor "
           "dd/Mon/yyyy:HH:MM:SS +zzzz";
    return -1;
}

/* A JSON string at s[*i] == '"': its raw text (escapes kept) in *f, *fl;
 * *i past the closing quote.  false if unclosed. */
static bool json_string(const char *s, size_t len, size_t *i, const char **f,
                        size_t *fl)
{
    size_t j = *i + 1;
    while (j < len && s[j] != '"')
        j += s[j] == '\\' && j + 1 < len ? 2 : 1;
    if (j >= len)
        return false;
    *f = s + *i + 1;
    *fl = j - *i - 1;
    *i = j + 1;
    return true;
}

static void json_blanks(const char *s, size_t len, size_t *i)
{
    while (*i < len && (blank(s[*i]) || s[*i] == '\n'))
        (*i)++;
}

/* Skips one value at s[*i]: its text in *f, *fl (a string without its
 * quotes; an object or array whole); *quoted whether it was a string.
 * false on a malformed value. */
static bool json_value(const char *s, size_t len, size_t *i, const char **f,
                       size_t *fl, bool *quoted)
{
    *quoted = false;
    if (*i >= len)
        return false;
    if (s[*i] == '"') {
        *quoted = true;
        return json_string(s, len, i, f, fl);
    }
    size_t start = *i;
    if (s[*i] == '{' || s[*i] == '[') {
        unsigned depth = 0;
        while (*i < len) {
            char c = s[*i];
            if (c == '"') {
                const char *x;
                size_t xl;
                if (!json_string(s, len, i, &x, &xl))
                    return false;
                continue;
            }
            (*i)++;
            if (c == '{' || c == '[')
                depth++;
            else if ((c == '}' || c == ']') && --depth == 0)
                break;
        }
        if (depth != 0)
            return false;
    } else {
        while (*i < len && s[*i] != ',' && s[*i] != '}' && !blank(s[*i]))
            (*i)++;
        if (*i == start)
            return false;
    }
    *f = s + start;
    *fl = *i - start;
    return true;
}

int json_parse_line(const char *s, size_t len, const char *key_name,
                    const char *time_name, trace_req_t *out, const char **err)
{
    const char *key = NULL, *time = NULL;
    size_t key_len = 0, time_len = 0, i = 0;
    size_t kn = strlen(key_name), tn = strlen(time_name);

    if (len > 0 && s[len - 1] == '\r')
        len--;
    json_blanks(s, len, &i);
    if (i == len || s[i] == '#')
        return TRACE_SKIP;
    if (s[i] != '{') {
        *err = "not a JSON object (a line is {\"name\": value, ...})";
        return TRACE_ERR;
    }
    i++;
    for (;;) {
        json_blanks(s, len, &i);
        if (i < len && s[i] == '}')
            break;
        const char *name, *v;
        size_t nl, vl;
        bool quoted;
        if (i >= len || s[i] != '"' || !json_string(s, len, &i, &name, &nl)) {
            *err = "malformed JSON object: a member name is not a string";
            return TRACE_ERR;
        }
        json_blanks(s, len, &i);
        if (i >= len || s[i] != ':') {
            *err = "malformed JSON object: no ':' after a member name";
            return TRACE_ERR;
        }
        i++;
        json_blanks(s, len, &i);
        if (!json_value(s, len, &i, &v, &vl, &quoted)) {
            *err = "malformed JSON value (unclosed string, object or array)";
            return TRACE_ERR;
        }
        bool scalar = quoted || (v[0] != '{' && v[0] != '[');
        if (key == NULL && scalar && nl == kn && memcmp(name, key_name, kn) == 0) {
            key = v;
            key_len = vl;
        }
        if (time == NULL && scalar && nl == tn &&
            memcmp(name, time_name, tn) == 0) {
            time = v;
            time_len = vl;
        }
        json_blanks(s, len, &i);
        if (i < len && s[i] == ',') {
            i++;
            continue;
        }
        if (i < len && s[i] == '}')
            break;
        *err = "malformed JSON object: no ',' or '}' after a value";
        return TRACE_ERR;
    }
    if (time == NULL) {
        *err = "no time member (name it with --time-field NAME; default "
               "\"time\")";
        return TRACE_ERR;
    }
    if (key == NULL || key_len == 0) {
        *err = "no key member, or it is empty (name it with --key-field "
               "NAME; default \"remote_addr\")";
        return TRACE_ERR;
    }
    if (trace_parse_clock(time, time_len, &out->t_ns, err) != 0)
        return TRACE_ERR;
    out->time_text = time;
    out->time_len = time_len;
    out->key = key;
    out->key_len = key_len;
    out->permits = 1;
    return TRACE_REQ;
}
