/* SPDX-License-Identifier: MIT */
/*
 * In-flight policies: the `concurrency N ttl=DUR [reserve=K|P%]` clause
 * among a policy's ';'-separated clauses; the other clauses are handed,
 * joined, to rate_policy_parse (docs/leases.md, "Policy text").  Built on
 * ratelimit.h's public parsers alone.
 */
#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lease.h"

#define TTL_MIN_NS UINT64_C(1000000)         /* 1 ms */
#define TTL_MAX_NS (UINT64_C(1) << 61)

/* Writes a message to err (when err is not NULL and errlen > 0), as
 * snprintf would, and returns rc. */
static int fail(char *err, size_t errlen, int rc, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int fail(char *err, size_t errlen, int rc, const char *fmt, ...)
{
    if (err != NULL && errlen > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return rc;
}

/* Checks a policy name by rate_policy_set_name's rule (on a policy of
 * no use but that): RATE_OK, or the rule's reason in why. */
static int check_name(const char *name, size_t n, char *why, size_t whylen)
{
    /* a name past the bound is refused whatever its bytes after it */
    char copy[RATE_POLICY_NAME_MAX + 2];
    size_t m = n < sizeof copy - 1 ? n : sizeof copy - 1;
    rate_policy_t *scratch;
    memcpy(copy, name, m);
    copy[m] = '\0';
    if (rate_policy_unlimited(&scratch) != RATE_OK)
        return fail(why, whylen, RATE_ENOMEM, "out of memory");
    int rc = rate_policy_set_name(scratch, copy, why, whylen);
    rate_policy_free(scratch);
    return rc;
}

/* Parses one value with a public parser, its message after `what`. */
static int sub(int rc, char *err, size_t errlen, const char *what,
               const char *msg)
{
    return rc == RATE_OK ? RATE_OK
                         : fail(err, errlen, RATE_EPOLICY,
                                      "concurrency: %s: %s", what, msg);
}

/* The concurrency clause's words, `text` a private copy (cut in place). */
static int parse_clause(char *text, rate_inflight_policy_t *p, char *err,
                        size_t errlen)
{
    char msg[160];
    bool have_n = false, have_ttl = false, have_reserve = false;
    char *save = NULL;

    strtok_r(text, " \t", &save); /* "concurrency" itself */
    for (char *w; (w = strtok_r(NULL, " \t", &save)) != NULL;) {
        if (!have_n) {
            if (rate_parse_count(w, &p->max, msg, sizeof msg) != RATE_OK ||
                p->max == 0 || p->max > RATE_LEASE_MAX)
                return fail(err, errlen, RATE_EPOLICY,
                            "concurrency: '%s' is not a count from 1 to %u",
                            w, RATE_LEASE_MAX);
            have_n = true;
        } else if (strncmp(w, "ttl=", 4) == 0) {
            if (have_ttl)
                return fail(err, errlen, RATE_EPOLICY,
                                  "concurrency: ttl= given twice");
            int rc = rate_parse_duration(w + 4, &p->ttl_ns, msg, sizeof msg);
            if (rc != RATE_OK)
                return sub(rc, err, errlen, "ttl", msg);
            if (p->ttl_ns < TTL_MIN_NS || p->ttl_ns > TTL_MAX_NS)
                return fail(err, errlen, RATE_EPOLICY,
                            "concurrency: ttl=%s is not from 1ms to 2^61ns",
                            w + 4);
            have_ttl = true;
        } else if (strncmp(w, "reserve=", 8) == 0) {
            if (have_reserve)
                return fail(err, errlen, RATE_EPOLICY,
                                  "concurrency: reserve= given twice");
            have_reserve = true;
            char *v = w + 8;
            size_t n = strlen(v);
            uint64_t k;
            p->reserve_pct = n > 0 && v[n - 1] == '%';
            if (p->reserve_pct)
                v[n - 1] = '\0';
            if (rate_parse_count(v, &k, msg, sizeof msg) != RATE_OK ||
                (p->reserve_pct && k > 100))
                return fail(err, errlen, RATE_EPOLICY,
                            "concurrency: reserve=%s%s is not a count or a "
                            "percentage",
                            v, p->reserve_pct ? "%" : "");
            p->reserve_arg = k;
        } else {
            return fail(err, errlen, RATE_EPOLICY,
                        "concurrency: unknown option '%s' (ttl=, reserve=)",
                        w);
        }
    }
    if (!have_n)
        return fail(err, errlen, RATE_EPOLICY,
                          "concurrency: missing the count N");
    if (!have_ttl)
        return fail(err, errlen, RATE_EPOLICY,
                    "concurrency: missing ttl=DURATION (a lease must expire)");
    p->reserve = p->reserve_pct ? p->max * p->reserve_arg / 100
                                : p->reserve_arg;
    if (p->reserve >= p->max)
        return fail(err, errlen, RATE_EPOLICY,
                    "concurrency: reserve=%llu%s leaves normal traffic "
                    "nothing (N is %llu)",
                    (unsigned long long)p->reserve_arg,
                    p->reserve_pct ? "%" : "", (unsigned long long)p->max);
    return RATE_OK;
}

static bool is_concurrency(const char *clause)
{
    while (isspace((unsigned char)*clause))
        clause++;
    return strncmp(clause, "concurrency", 11) == 0 &&
           (clause[11] == '\0' || isspace((unsigned char)clause[11]));
}

/* A first clause "name=NAME concurrency ...": the name checked and kept
 * in p, *clause moved past it.  A name before a rate clause is left to
 * rate_policy_parse. */
static int take_name(char **clause, rate_inflight_policy_t *p, char *err,
                     size_t errlen)
{
    char *c = *clause + strspn(*clause, " \t"), why[200];
    if (strncmp(c, "name=", 5) != 0)
        return RATE_OK;
    size_t n = strcspn(c + 5, " \t");
    if (c[5 + n] == '\0' || !is_concurrency(c + 5 + n))
        return RATE_OK;
    int rc = n == 0 ? RATE_EINVAL : check_name(c + 5, n, why, sizeof why);
    if (rc == RATE_ENOMEM)
        return rc;
    if (rc != RATE_OK)
        return fail(err, errlen, RATE_EPOLICY, "%s",
                    n == 0 ? "name= is empty; write name=NAME before the "
                             "first clause, or leave it out"
                           : why);
    memcpy(p->name, c + 5, n);
    p->name[n] = '\0';
    *clause = c + 5 + n;
    return RATE_OK;
}

/* Splits the text: the concurrency clause into p, the rest into rate (a
 * name= before the concurrency clause first, when there is a rest). */
static int split(const char *text, rate_inflight_policy_t *p, char *rate,
                 char *err, size_t errlen)
{
    size_t len = strlen(text);
    char *copy = malloc(len + 1);
    int rc = RATE_OK, found = 0;
    bool any_rate = false;

    if (copy == NULL)
        return RATE_ENOMEM;
    memcpy(copy, text, len + 1);
    rate[0] = '\0';
    /* Clause by clause; an empty one is refused, as rate_policy_parse
     * refuses an empty limit (an empty text: no concurrency clause). */
    size_t idx = 0;
    for (char *c = copy, *next; c != NULL && rc == RATE_OK && len > 0;
         c = next) {
        if ((next = strchr(c, ';')) != NULL)
            *next++ = '\0';
        idx++;
        if (idx == 1 && (rc = take_name(&c, p, err, errlen)) != RATE_OK)
            break;
        if (p->name[0] != '\0' && idx == 1)
            snprintf(rate, len + 1, "name=%s ", p->name);
        if (strspn(c, " \t") == strlen(c)) {
            rc = fail(err, errlen, RATE_EPOLICY, "clause %zu is empty",
                            idx);
        } else if (is_concurrency(c)) {
            rc = found++ ? fail(err, errlen, RATE_EPOLICY,
                                      "two concurrency clauses")
                         : parse_clause(c, p, err, errlen);
        } else {
            if (any_rate)
                strcat(rate, ";");
            strcat(rate, c);
            any_rate = true;
        }
    }
    if (!any_rate)
        rate[0] = '\0'; /* the name, if any, stays the policy's own */
    else
        p->name[0] = '\0'; /* the rate part's */
    if (rc == RATE_OK && !found)
        rc = fail(err, errlen, RATE_EPOLICY,
                  "no concurrency clause ('concurrency N ttl=DURATION')");
    free(copy);
    return rc;
}

int rate_inflight_policy_parse(const char *text, rate_inflight_policy_t **out,
                               char *err, size_t errlen)
{
    rate_inflight_policy_t *p;
    char *rate;
    int rc;

    if (out == NULL)
        return RATE_EINVAL;
    *out = NULL;
    if (text == NULL)
        return fail(err, errlen, RATE_EPOLICY, "no policy text");
    if ((p = calloc(1, sizeof *p)) == NULL ||
        (rate = malloc(strlen(text) + 1)) == NULL) {
        free(p);
        return RATE_ENOMEM;
    }
    rc = split(text, p, rate, err, errlen);
    if (rc == RATE_OK && rate[0] != '\0')
        rc = rate_policy_parse(rate, &p->rate, err, errlen);
    if (rc == RATE_OK && rate_policy_is_unlimited(p->rate))
        rc = fail(err, errlen, RATE_EPOLICY,
                  "'unlimited' stands alone; a policy with a concurrency "
                  "clause is limited by it (drop 'unlimited')");
    free(rate);
    if (rc != RATE_OK) {
        rate_inflight_policy_free(p);
        return rc;
    }
    *out = p;
    return RATE_OK;
}

/* A duration in the largest unit that divides it exactly. */
static int format_duration(uint64_t ns, char *buf, size_t len)
{
    static const struct { uint64_t ns; const char *unit; } units[] = {
        {UINT64_C(86400000000000), "d"}, {UINT64_C(3600000000000), "h"},
        {UINT64_C(60000000000), "m"},    {UINT64_C(1000000000), "s"},
        {UINT64_C(1000000), "ms"},       {UINT64_C(1000), "us"}};
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
        if (ns % units[i].ns == 0)
            return snprintf(buf, len, "%llu%s",
                            (unsigned long long)(ns / units[i].ns),
                            units[i].unit);
    return snprintf(buf, len, "%lluns", (unsigned long long)ns);
}

size_t rate_inflight_policy_format(const rate_inflight_policy_t *p, char *buf,
                                   size_t len)
{
    char ttl[32], reserve[48] = "";
    int n;

    if (buf == NULL) /* only measures, whatever len says */
        len = 0;
    if (p == NULL) {
        if (len > 0)
            buf[0] = '\0';
        return 0;
    }
    format_duration(p->ttl_ns, ttl, sizeof ttl);
    if (p->reserve_arg > 0)
        snprintf(reserve, sizeof reserve, " reserve=%llu%s",
                 (unsigned long long)p->reserve_arg,
                 p->reserve_pct ? "%" : "");
    n = snprintf(buf, len, "%s%s%sconcurrency %llu ttl=%s%s%s",
                 p->name[0] != '\0' ? "name=" : "", p->name,
                 p->name[0] != '\0' ? " " : "",
                 (unsigned long long)p->max, ttl, reserve,
                 p->rate != NULL ? "; " : "");
    if (n < 0)
        return 0;
    size_t used = (size_t)n;
    if (p->rate != NULL) {
        size_t at = used < len ? used : (len > 0 ? len - 1 : 0);
        used += rate_policy_format(p->rate, buf != NULL ? buf + at : NULL,
                                   buf != NULL && len > at ? len - at : 0);
    }
    return used;
}

uint64_t rate_inflight_policy_max(const rate_inflight_policy_t *p)
{
    return p != NULL ? p->max : 0;
}

uint64_t rate_inflight_policy_ttl_ns(const rate_inflight_policy_t *p)
{
    return p != NULL ? p->ttl_ns : 0;
}

uint64_t rate_inflight_policy_reserve(const rate_inflight_policy_t *p)
{
    return p != NULL ? p->reserve : 0;
}

const rate_policy_t *rate_inflight_policy_rate(const rate_inflight_policy_t *p)
{
    return p != NULL ? p->rate : NULL;
}

size_t rate_inflight_policy_state_max(const rate_inflight_policy_t *p)
{
    return p != NULL ? RATE__LEASE_HEADER + RATE__LEASE_ENTRY * (size_t)p->max
                     : 0;
}

void rate_inflight_policy_free(rate_inflight_policy_t *p)
{
    if (p == NULL)
        return;
    rate_policy_free(p->rate);
    free(p);
}

int rate__inflight_policy_copy(const rate_inflight_policy_t *p,
                               rate_inflight_policy_t **out)
{
    rate_inflight_policy_t *c = malloc(sizeof *c);
    char *text;
    size_t n;
    int rc = RATE_OK;

    if (c == NULL)
        return RATE_ENOMEM;
    *c = *p;
    c->rate = NULL;
    if (p->rate != NULL) {
        /* A policy is immutable and has no copy call: its text is one. */
        n = rate_policy_format(p->rate, NULL, 0);
        if ((text = malloc(n + 1)) == NULL) {
            free(c);
            return RATE_ENOMEM;
        }
        rate_policy_format(p->rate, text, n + 1);
        rc = rate_policy_parse(text, &c->rate, NULL, 0);
        free(text);
    }
    if (rc != RATE_OK) {
        free(c);
        return rc;
    }
    *out = c;
    return RATE_OK;
}
