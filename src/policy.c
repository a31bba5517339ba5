/* SPDX-License-Identifier: MIT */
/*
 * Policies: validation, the text form, and the fingerprint that tags each
 * stored state with the policy it was made under.
 *
 * Text form (docs/policy.md):
 *
 *   policy := "unlimited" | limit { ";" limit }
 *   limit  := ALGORITHM RATE { OPTION }      words: spaces or tabs
 *   RATE   := COUNT "/" [COUNT] UNIT        10/s  100/1m  3/500ms  1/day
 *   OPTION := the algorithm's option "=" COUNT  (burst=, capacity=), once
 *
 * The algorithms, their names, aliases and options all come from
 * RATE_ALGORITHM_MAP (ratelimit.h).
 *
 * Every bound checked here exists so that the decision path can never
 * overflow: see the comment on rate_policy_new() in ratelimit.h.
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "step.h"

/* What RATE_ALGORITHM_MAP says of each algorithm. */
typedef struct algo_info {
    rate_algorithm_t algorithm;
    const char *name, *alias;
    const char *option; /* "" for a window */
    const char *span;   /* what P is called: "period" or "window" */
    const rate__algo_t *table;
} algo_info_t;

static const algo_info_t algos[] = {
#define RATE__X(id, value, name, alias, option, span, table) \
    {RATE_##id, name, alias, option, span, &rate__##table},
    RATE_ALGORITHM_MAP(RATE__X)
#undef RATE__X
};
#define N_ALGOS (sizeof algos / sizeof algos[0])

/* Units, each with its aliases; the first name is the canonical one. */
static const struct {
    uint64_t ns;
    const char *names[5];
} units[] = {
    {1, {"ns", "nsec", "nsecs", "nanosecond", "nanoseconds"}},
    {1000, {"us", "usec", "usecs", "microsecond", "microseconds"}},
    {1000000, {"ms", "msec", "msecs", "millisecond", "milliseconds"}},
    {UINT64_C(1000000000), {"s", "sec", "secs", "second", "seconds"}},
    {UINT64_C(60000000000), {"m", "min", "mins", "minute", "minutes"}},
    {UINT64_C(3600000000000), {"h", "hr", "hrs", "hour", "hours"}},
    {UINT64_C(86400000000000), {"d", "day", "days", NULL, NULL}},
};
#define N_UNITS (sizeof units / sizeof units[0])

static const algo_info_t *info_of(rate_algorithm_t a)
{
    for (size_t i = 0; i < N_ALGOS; i++)
        if (algos[i].algorithm == a)
            return &algos[i];
    return NULL;
}

/* The algorithm a name or alias of len bytes names, or NULL. */
static const algo_info_t *info_named(const char *s, size_t len)
{
    for (size_t i = 0; i < N_ALGOS; i++)
        if ((strlen(algos[i].name) == len &&
             memcmp(algos[i].name, s, len) == 0) ||
            (algos[i].alias[0] != '\0' && strlen(algos[i].alias) == len &&
             memcmp(algos[i].alias, s, len) == 0))
            return &algos[i];
    return NULL;
}

/* Writes "token-bucket, gcra, leaky-bucket, ..." (every name and alias). */
static const char *algo_names_text(char *buf, size_t len)
{
    size_t used = 0;

    buf[0] = '\0';
    for (size_t i = 0; i < N_ALGOS; i++) {
        const char *w[2] = {algos[i].name, algos[i].alias};
        for (int k = 0; k < 2; k++)
            if (w[k][0] != '\0' && used < len)
                used += (size_t)snprintf(buf + used, len - used, "%s%s",
                                         used ? ", " : "", w[k]);
    }
    return buf;
}

const rate__algo_t *rate__algo(rate_algorithm_t a)
{
    const algo_info_t *i = info_of(a);

    return i != NULL ? i->table : NULL;
}

const char *rate_algorithm_name(rate_algorithm_t a)
{
    const algo_info_t *i = info_of(a);

    return i != NULL ? i->name : NULL;
}

int rate_algorithm_parse(const char *name, rate_algorithm_t *out)
{
    const algo_info_t *i;

    if (name == NULL || out == NULL ||
        (i = info_named(name, strlen(name))) == NULL)
        return RATE_EINVAL;
    *out = i->algorithm;
    return RATE_OK;
}

const rate__algo_t *rate__algo_for(const rate_limit_t *l)
{
    if (l->algorithm == RATE_TOKEN_BUCKET && rate__bucket_wide(l))
        return &rate__token_bucket_wide;
    if (l->algorithm == RATE_LEAKY_BUCKET && rate__bucket_wide(l))
        return &rate__leaky_bucket_wide;
    return rate__algo(l->algorithm);
}

/* Every policy error is RATE_EPOLICY with a message naming the bad part. */
#define fail(err, errlen, ...)                                                \
    rate__fail(err, errlen, RATE_EPOLICY, __VA_ARGS__)

/* A bucket takes an option (burst, capacity); a window takes none. */
static bool is_bucket(rate_algorithm_t a)
{
    const algo_info_t *i = info_of(a);

    return i != NULL && i->option[0] != '\0';
}

static int check_limit(const rate_limit_t *l, size_t i, char *err,
                       size_t errlen)
{
    const algo_info_t *a = info_of(l->algorithm);

    if (a == NULL)
        return fail(err, errlen, "limit %zu: unknown algorithm %d", i + 1,
                    (int)l->algorithm);
    if (!RATE__RESERVED_ZERO(l))
        return fail(err, errlen, "limit %zu: its reserved words are not zero "
                    "(a field of a later version?)", i + 1);
    if (l->limit == 0)
        return fail(err, errlen, "limit %zu (%s): the rate's count is zero",
                    i + 1, a->name);
    if (l->block_ns > RATE__WINDOW_MAX)
        return fail(err, errlen, "limit %zu (%s): block above 2^61 ns (73 "
                    "years)", i + 1, a->name);
    if (l->period_ns == 0)
        return fail(err, errlen, "limit %zu (%s): the %s is zero", i + 1,
                    a->name, a->span);
    if (l->limit > RATE_TIME_MAX || l->period_ns > RATE_TIME_MAX ||
        l->burst > RATE_TIME_MAX)
        return fail(err, errlen,
                    "limit %zu (%s): count, period or burst above 2^63-1",
                    i + 1, a->name);
    if (is_bucket(l->algorithm)) {
        const char *what = a->option;
        if (l->burst == 0)
            return fail(err, errlen, "limit %zu (%s): %s is zero", i + 1,
                        a->name, what);
        /* Any period up to 2^61 (B * P < 2^124, the wide layout); a longer
         * one only with B * P <= 2^62 (the narrow layout, as before). */
        if (l->period_ns > RATE__WINDOW_MAX && rate__bucket_wide(l))
            return fail(err, errlen,
                        "limit %zu (%s): period %llu ns above 2^61 ns (73 "
                        "years) with %s %llu; a longer period needs %s "
                        "times period <= 2^62",
                        i + 1, a->name, (unsigned long long)l->period_ns,
                        what, (unsigned long long)l->burst, what);
    } else {
        if (l->burst != 0)
            return fail(err, errlen,
                        "limit %zu (%s): a window takes no burst or capacity",
                        i + 1, a->name);
        if (l->period_ns > RATE__WINDOW_MAX)
            return fail(err, errlen,
                        "limit %zu (%s): window above 2^61 ns (73 years)",
                        i + 1, a->name);
        if (l->algorithm == RATE_SLIDING_LOG &&
            l->limit > RATE_SLIDING_LOG_MAX)
            return fail(err, errlen,
                        "limit %zu (sliding-log): limit %llu above %u; a log "
                        "keeps one entry per request (use sliding-window)",
                        i + 1, (unsigned long long)l->limit,
                        RATE_SLIDING_LOG_MAX);
    }
    return RATE_OK;
}

static uint32_t fingerprint(const rate_policy_t *p)
{
    uint64_t words[1 + 5 * RATE_MAX_LIMITS];
    size_t n = 0;

    words[n++] = p->count;
    if (p->unlimited) /* no limits; a word no limited policy starts with */
        words[n++] = UINT64_MAX;
    for (size_t i = 0; i < p->count; i++) {
        words[n++] = (uint64_t)p->limits[i].algorithm;
        words[n++] = p->limits[i].limit;
        words[n++] = p->limits[i].period_ns;
        words[n++] = p->limits[i].burst;
    }
    /* Blocks are hashed only when there are any, so that a policy without
     * keeps the first edition's fingerprint. */
    for (size_t i = 0; p->block && i < p->count; i++)
        words[n++] = p->limits[i].block_ns;
    return XXH32(words, n * sizeof words[0], 0x7261u);
}

int rate_policy_new(const rate_limit_t *limits, size_t count,
                    rate_policy_t **out, char *err, size_t errlen)
{
    rate_policy_t *p;
    int rc;

    if (out == NULL)
        return RATE_EINVAL;
    *out = NULL;
    if (limits == NULL || count == 0)
        return fail(err, errlen, "a policy needs at least one limit");
    if (count > RATE_MAX_LIMITS)
        return fail(err, errlen, "%zu limits: at most %d in one policy", count,
                    RATE_MAX_LIMITS);
    for (size_t i = 0; i < count; i++)
        if ((rc = check_limit(&limits[i], i, err, errlen)) != RATE_OK)
            return rc;
    p = calloc(1, sizeof *p);
    if (p == NULL)
        return RATE_ENOMEM;
    p->count = count;
    memcpy(p->limits, limits, count * sizeof *limits);
    p->grow = RATE__HEADER_LEN;
    for (size_t i = 0; i < count; i++) {
        const rate__algo_t *a = rate__algo_for(&limits[i]);
        uint64_t reset = a->max_reset(&limits[i]);
        p->algo[i] = a;
        p->grow += a->fixed + a->grow;
        if (reset > p->max_reset_ns)
            p->max_reset_ns = reset;
        p->block = p->block || limits[i].block_ns != 0;
    }
    if (p->block)
        p->grow += 8; /* the time the key is blocked until */
    if (count == 1 && p->algo[0]->grow == 0 && !p->block)
        p->plain = p->algo[0]->plain;
    p->fingerprint = fingerprint(p);
    *out = p;
    return RATE_OK;
}

/* Checks a policy name (RATE_POLICY_NAME_MAX bytes of [A-Za-z0-9._-]). */
int rate__policy_check_name(const char *name, size_t len, char *err,
                            size_t errlen)
{
    if (len > RATE_POLICY_NAME_MAX)
        return rate__fail(err, errlen, RATE_EINVAL,
                          "policy name '%.*s...' is longer than %d bytes",
                          16, name, RATE_POLICY_NAME_MAX);
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)name[i];
        if (!isalnum(c) && c != '.' && c != '_' && c != '-') {
            char b[16];
            if (isgraph(c))
                snprintf(b, sizeof b, "'%c'", c);
            else
                snprintf(b, sizeof b, "byte 0x%02x", (unsigned)c);
            return rate__fail(err, errlen, RATE_EINVAL,
                              "policy name '%.*s' has %s; a name is letters, "
                              "digits, '.', '_' and '-'",
                              (int)len, name, b);
        }
    }
    return RATE_OK;
}

int rate_policy_set_name(rate_policy_t *policy, const char *name, char *err,
                         size_t errlen)
{
    size_t len = name != NULL ? strlen(name) : 0;
    int rc;

    if (policy == NULL)
        return rate__fail(err, errlen, RATE_EINVAL, "no policy (NULL)");
    if ((rc = rate__policy_check_name(name, len, err, errlen)) != RATE_OK)
        return rc;
    memcpy(policy->name, name != NULL ? name : "", len);
    policy->name[len] = '\0';
    return RATE_OK;
}

const char *rate_policy_name(const rate_policy_t *policy)
{
    return policy != NULL ? policy->name : "";
}

int rate_policy_unlimited(rate_policy_t **out)
{
    rate_policy_t *p;

    if (out == NULL)
        return RATE_EINVAL;
    *out = NULL;
    if ((p = calloc(1, sizeof *p)) == NULL)
        return RATE_ENOMEM;
    p->unlimited = true;
    p->fingerprint = fingerprint(p);
    *out = p;
    return RATE_OK;
}

size_t rate_policy_state_max(const rate_policy_t *p)
{
    if (p == NULL || p->unlimited)
        return 0;
    size_t n = RATE__HEADER_LEN + (p->block ? 8 : 0);
    for (size_t i = 0; i < p->count; i++) {
        /* A log holds at most `limit` entries: each is one permit or
         * more, and their sum is at most the limit. */
        n += p->algo[i]->fixed;
        if (p->algo[i]->grow != 0)
            n += (size_t)p->limits[i].limit * p->algo[i]->grow;
    }
    return n;
}

bool rate_policy_is_unlimited(const rate_policy_t *policy)
{
    return policy != NULL && policy->unlimited;
}

void rate_policy_free(rate_policy_t *policy)
{
    free(policy);
}

uint32_t rate_policy_fingerprint(const rate_policy_t *policy)
{
    return policy != NULL ? policy->fingerprint : 0;
}

size_t rate_policy_count(const rate_policy_t *policy)
{
    return policy != NULL ? policy->count : 0;
}

const rate_limit_t *rate_policy_limit(const rate_policy_t *policy, size_t i)
{
    return policy != NULL && i < policy->count ? &policy->limits[i] : NULL;
}

/* ------------------------------------------------------------- parsing */

/* The one implementation of each rule of the text: a count, a duration and
 * a rate.  Each takes s[0..len) (a word of policy text, or a whole
 * argument), and on an error writes a message whose subject is the quoted
 * text ("'1.5s' is not a duration: ..."), so that rate_policy_parse can
 * prefix "limit N: rate " and the command "--window ". */

static bool all_digits(const char *s, size_t len)
{
    for (size_t i = 0; i < len; i++)
        if (s[i] < '0' || s[i] > '9')
            return false;
    return len > 0;
}

/* A count in policy text: a whole number up to 2^63-1. */
static bool parse_count(const char *s, size_t len, uint64_t *out)
{
    return rate__parse_decimal(s, len, RATE_TIME_MAX, out);
}

static int count_rule(const char *s, size_t len, uint64_t *out, char *err,
                      size_t errlen)
{
    if (parse_count(s, len, out))
        return RATE_OK;
    return rate__fail(err, errlen, all_digits(s, len) ? RATE_ERANGE
                                                      : RATE_EINVAL,
                      "'%.*s' is not a whole number up to 2^63-1", (int)len,
                      s);
}

/* The ns of a unit's name or alias s[0..len), 0 if none. */
static uint64_t unit_ns(const char *s, size_t len)
{
    for (size_t u = 0; u < N_UNITS; u++)
        for (size_t k = 0; k < 5 && units[u].names[k] != NULL; k++)
            if (strlen(units[u].names[k]) == len &&
                memcmp(units[u].names[k], s, len) == 0)
                return units[u].ns;
    return 0;
}

/* "[COUNT]UNIT" with the count optional when allow_bare, into ns. */
static int parse_dur(const char *s, size_t len, bool allow_bare,
                     uint64_t *out)
{
    size_t digits = 0;
    uint64_t count = 1, ns;

    while (digits < len && s[digits] >= '0' && s[digits] <= '9')
        digits++;
    if (digits == len && len == 1 && s[0] == '0') {
        *out = 0;
        return RATE_OK;
    }
    if (digits == 0 && !allow_bare)
        return RATE_EINVAL;
    if ((ns = unit_ns(s + digits, len - digits)) == 0)
        return RATE_EINVAL;
    if (digits > 0 && !parse_count(s, digits, &count))
        return RATE_ERANGE;
    if (count > RATE_TIME_MAX / ns)
        return RATE_ERANGE;
    *out = count * ns;
    return RATE_OK;
}

/* "N/DUR" text with the largest unit that divides ns exactly. */
static int format_ns(uint64_t ns, char *buf, size_t len)
{
    size_t u = N_UNITS;

    if (ns == 0)
        return snprintf(buf, len, "0");
    while (u-- > 1)
        if (ns % units[u].ns == 0)
            break;
    uint64_t mult = ns / units[u].ns;
    if (mult == 1)
        return snprintf(buf, len, "%s", units[u].names[0]);
    return snprintf(buf, len, "%llu%s", (unsigned long long)mult,
                    units[u].names[0]);
}

/* What a duration with a fraction ("1.5s", "0.25h") is. */
enum fraction {
    NOT_FRACTION, /* no fraction, or no unit after it */
    FRACTION,     /* a fraction of no whole ns, or too long to tell */
    WHOLE,        /* a whole number of ns: its whole form in buf */
    TOO_LARGE     /* above 2^63-1 ns */
};

static enum fraction whole_form(const char *s, size_t len, char *buf,
                                size_t buflen)
{
    size_t i = 0, dot;
    uint64_t ns;
    rate_u128_t v = 0, scale = 1;

    while (i < len && s[i] >= '0' && s[i] <= '9')
        i++;
    if (i == 0 || i == len || s[i] != '.')
        return NOT_FRACTION;
    dot = i++;
    while (i < len && s[i] >= '0' && s[i] <= '9')
        i++;
    if (i == dot + 1 || (ns = unit_ns(s + i, len - i)) == 0)
        return NOT_FRACTION;
    if (i - 1 > 20) /* 20 digits: v * ns stays below 2^128 */
        return FRACTION;
    for (size_t k = 0; k < i; k++) {
        if (k == dot)
            continue;
        v = v * 10 + (unsigned)(s[k] - '0');
        if (k > dot)
            scale *= 10;
    }
    v *= ns;
    if (v / scale > RATE_TIME_MAX)
        return TOO_LARGE;
    if (v % scale != 0)
        return FRACTION;
    format_ns((uint64_t)(v / scale), buf, buflen);
    return WHOLE;
}

/* A duration, "[COUNT]UNIT" (in a rate, in_rate: the count may be left
 * out) or "0". */
static int dur_rule(const char *s, size_t len, bool in_rate, uint64_t *out,
                    char *err, size_t errlen)
{
    char whole[48];
    int rc = parse_dur(s, len, in_rate, out);

    if (rc == RATE_OK)
        return RATE_OK;
    if (rc == RATE_EINVAL) {
        enum fraction f = whole_form(s, len, whole, sizeof whole);
        char tail[64] = " (the smallest is 1ns)";
        if (f == WHOLE)
            snprintf(tail, sizeof tail, "; write '%s'", whole);
        if (f == WHOLE || f == FRACTION)
            return rate__fail(err, errlen, RATE_EINVAL,
                              "'%.*s' is not a duration: durations are "
                              "whole numbers of a unit%s", (int)len, s, tail);
        if (f == NOT_FRACTION)
            return rate__fail(err, errlen, RATE_EINVAL,
                              "'%.*s' is not a duration: %s, units ns us "
                              "ms s m h d (or nsec usec msec sec min hr "
                              "day, singular or plural)%s", (int)len, s,
                              in_rate ? "[COUNT]UNIT" : "COUNTUNIT",
                              in_rate ? "" : ", or 0");
        rc = RATE_ERANGE; /* TOO_LARGE */
    }
    return rate__fail(err, errlen, rc, "'%.*s' is a duration above 2^63-1 ns",
                      (int)len, s);
}

/* A rate, "COUNT/[COUNT]UNIT"; a zero count or period is the caller's to
 * refuse (rate_policy_new names the limit's algorithm). */
static int rate_rule(const char *s, size_t len, uint64_t *count,
                     uint64_t *period, char *err, size_t errlen)
{
    const char *slash = memchr(s, '/', len);
    char why[200];
    size_t left;
    int rc;

    if (slash == NULL)
        return rate__fail(err, errlen, RATE_EINVAL,
                          "'%.*s' is not COUNT/DURATION (e.g. 10/s, 100/1m)",
                          (int)len, s);
    left = (size_t)(slash - s);
    if ((rc = count_rule(s, left, count, why, sizeof why)) != RATE_OK)
        return rate__fail(err, errlen, rc, "'%.*s': count %s", (int)len, s,
                          why);
    rc = dur_rule(slash + 1, len - left - 1, true, period, why, sizeof why);
    if (rc != RATE_OK)
        return rate__fail(err, errlen, rc, "'%.*s': %s", (int)len, s, why);
    return RATE_OK;
}

int rate_parse_count(const char *text, uint64_t *out, char *err,
                     size_t errlen)
{
    if (text == NULL || out == NULL)
        return rate__fail(err, errlen, RATE_EINVAL, "no count (NULL)");
    return count_rule(text, strlen(text), out, err, errlen);
}

int rate_parse_duration(const char *text, uint64_t *out_ns, char *err,
                        size_t errlen)
{
    if (text == NULL || out_ns == NULL)
        return rate__fail(err, errlen, RATE_EINVAL, "no duration (NULL)");
    return dur_rule(text, strlen(text), false, out_ns, err, errlen);
}

int rate_parse_rate(const char *text, uint64_t *count, uint64_t *period_ns,
                    char *err, size_t errlen)
{
    uint64_t c, p;
    int rc;

    if (text == NULL || count == NULL || period_ns == NULL)
        return rate__fail(err, errlen, RATE_EINVAL, "no rate (NULL)");
    rc = rate_rule(text, strlen(text), &c, &p, err, errlen);
    if (rc != RATE_OK)
        return rc;
    if (c == 0 || p == 0)
        return rate__fail(err, errlen, RATE_EINVAL,
                          "'%s' is zero: its %s is 0", text,
                          c == 0 ? "count" : "period");
    *count = c;
    *period_ns = p;
    return RATE_OK;
}

typedef struct token {
    const char *s;
    size_t len;
} token_t;

static bool is_sep(char c)
{
    return c == ' ' || c == '\t';
}

/* Words separated by spaces or tabs; any other control byte or space
 * (a newline, \v, \f, \r) is an error: *bad points at it. */
static size_t split_words(const char *s, size_t len, token_t *w, size_t max,
                          const char **bad)
{
    size_t n = 0, i = 0;

    *bad = NULL;
    for (size_t k = 0; k < len; k++)
        if (!is_sep(s[k]) && (isspace((unsigned char)s[k]) ||
                              iscntrl((unsigned char)s[k]))) {
            *bad = s + k;
            return 0;
        }
    while (i < len) {
        while (i < len && is_sep(s[i]))
            i++;
        if (i == len)
            break;
        size_t start = i;
        while (i < len && !is_sep(s[i]))
            i++;
        if (n < max)
            w[n] = (token_t){s + start, i - start};
        n++;
    }
    return n;
}

static int parse_rate(token_t t, size_t idx, rate_limit_t *l, char *err,
                      size_t errlen)
{
    char why[256];

    if (rate_rule(t.s, t.len, &l->limit, &l->period_ns, why, sizeof why) !=
        RATE_OK) {
        /* nginx's limit_req spells a rate 10r/s or 10r/m. */
        const char *slash = memchr(t.s, '/', t.len);
        if (slash != NULL && slash > t.s && slash[-1] == 'r')
            return fail(err, errlen, "limit %zu: rate %s (write %.*s/%.*s: "
                        "no 'r' before the '/', as nginx's limit_req has)",
                        idx + 1, why, (int)(slash - 1 - t.s), t.s,
                        (int)(t.s + t.len - slash - 1), slash + 1);
        return fail(err, errlen, "limit %zu: rate %s", idx + 1, why);
    }
    return RATE_OK;
}

static int parse_option(token_t t, size_t idx, const algo_info_t *a,
                        rate_limit_t *l, char *err, size_t errlen)
{
    const char *eq = memchr(t.s, '=', t.len);
    size_t klen = eq ? (size_t)(eq - t.s) : t.len;
    const algo_info_t *owner = NULL;
    char why[200];
    uint64_t v;

    if (eq == NULL)
        return fail(err, errlen, "limit %zu: '%.*s' is not NAME=VALUE",
                    idx + 1, (int)t.len, t.s);
    if (klen == 5 && memcmp(t.s, "block", 5) == 0) { /* any algorithm's */
        if (l->block_ns != 0)
            return fail(err, errlen, "limit %zu: block= given twice",
                        idx + 1);
        if (dur_rule(eq + 1, t.len - klen - 1, false, &v, why, sizeof why) !=
            RATE_OK)
            return fail(err, errlen, "limit %zu: block value %s", idx + 1,
                        why);
        if (v == 0)
            return fail(err, errlen, "limit %zu: block is zero; it must be "
                        "at least 1ns (or left out)", idx + 1);
        l->block_ns = v;
        return RATE_OK;
    }
    for (size_t i = 0; i < N_ALGOS && owner == NULL; i++)
        if (algos[i].option[0] != '\0' && strlen(algos[i].option) == klen &&
            memcmp(algos[i].option, t.s, klen) == 0)
            owner = &algos[i];
    if (owner == NULL) {
        char known[160] = "";
        size_t used = 0;
        for (size_t i = 0; i < N_ALGOS; i++)
            if (algos[i].option[0] != '\0' && used < sizeof known)
                used += (size_t)snprintf(known + used, sizeof known - used,
                                         "%s%s= for %s", used ? ", " : "",
                                         algos[i].option, algos[i].name);
        return fail(err, errlen, "limit %zu: unknown option '%.*s' (%s)",
                    idx + 1, (int)klen, t.s, known);
    }
    if (owner != a)
        return fail(err, errlen, "limit %zu: option '%.*s' does not belong to "
                    "%s", idx + 1, (int)klen, t.s, a->name);
    if (l->burst != 0)
        return fail(err, errlen, "limit %zu: %s= given twice", idx + 1,
                    a->option);
    if (count_rule(eq + 1, t.len - klen - 1, &v, why, sizeof why) != RATE_OK)
        return fail(err, errlen, "limit %zu: %.*s value %s", idx + 1,
                    (int)klen, t.s, why);
    if (v == 0)
        return fail(err, errlen, "limit %zu: %.*s is zero; it must be at "
                    "least 1", idx + 1, (int)klen, t.s);
    l->burst = v;
    return RATE_OK;
}

static bool is_word(token_t w, const char *word)
{
    return w.len == strlen(word) && memcmp(w.s, word, w.len) == 0;
}

/* A byte of policy text for a message: 'x', or its name. */
static const char *byte_name(char c, char *buf, size_t len)
{
    switch (c) {
    case '\n':
        return "a newline";
    case '\r':
        return "a carriage return (\\r)";
    case '\v':
        return "a vertical tab (\\v)";
    case '\f':
        return "a form feed (\\f)";
    default:
        snprintf(buf, len, "byte 0x%02x", (unsigned)(unsigned char)c);
        return buf;
    }
}

/* One limit's text; *unlimited set (and l untouched) for "unlimited". */
static int parse_limit(const char *s, size_t len, size_t idx, rate_limit_t *l,
                       bool *unlimited, char *err, size_t errlen)
{
    token_t w[8];
    const char *bad;
    size_t n = split_words(s, len, w, 8, &bad);
    const algo_info_t *a;
    int rc;

    if (bad != NULL) {
        char b[16];
        return fail(err, errlen,
                    "limit %zu: %s in the text; words are separated by "
                    "spaces or tabs, limits by ';'",
                    idx + 1, byte_name(*bad, b, sizeof b));
    }
    if (n == 0)
        return fail(err, errlen, "limit %zu is empty", idx + 1);
    if (n > 8)
        return fail(err, errlen, "limit %zu: too many words", idx + 1);
    if (is_word(w[0], "unlimited")) {
        if (n > 1)
            return fail(err, errlen,
                        "limit %zu: 'unlimited' takes no rate or option",
                        idx + 1);
        *unlimited = true;
        return RATE_OK;
    }
    if ((a = info_named(w[0].s, w[0].len)) == NULL) {
        char names[256];
        return fail(err, errlen, "limit %zu: unknown algorithm '%.*s' (%s)",
                    idx + 1, (int)w[0].len, w[0].s,
                    algo_names_text(names, sizeof names));
    }
    memset(l, 0, sizeof *l);
    l->algorithm = a->algorithm;
    if (n < 2)
        return fail(err, errlen, "limit %zu: %.*s needs a rate such as 10/s",
                    idx + 1, (int)w[0].len, w[0].s);
    if ((rc = parse_rate(w[1], idx, l, err, errlen)) != RATE_OK)
        return rc;
    for (size_t i = 2; i < n; i++)
        if ((rc = parse_option(w[i], idx, a, l, err, errlen)) != RATE_OK)
            return rc;
    /* A bucket without burst/capacity holds one period's worth. */
    if (a->option[0] != '\0' && l->burst == 0)
        l->burst = l->limit;
    return RATE_OK;
}

int rate_policy_parse(const char *text, rate_policy_t **out, char *err,
                      size_t errlen)
{
    rate_limit_t limits[RATE_MAX_LIMITS];
    size_t count = 0;
    const char *s = text;
    bool unlimited = false;
    int rc;

    if (out == NULL)
        return RATE_EINVAL;
    *out = NULL;
    if (text == NULL)
        return fail(err, errlen, "policy text is NULL");
    /* An optional first word name=NAME. */
    const char *name = NULL;
    size_t name_len = 0;
    while (is_sep(*s))
        s++;
    if (strncmp(s, "name=", 5) == 0) {
        name = s + 5;
        while (s[name_len + 5] != '\0' && s[name_len + 5] != ';' &&
               !isspace((unsigned char)s[name_len + 5]))
            name_len++;
        if (name_len == 0)
            return fail(err, errlen, "name= is empty; write name=NAME before "
                        "the first limit, or leave it out");
        char why[200];
        if (rate__policy_check_name(name, name_len, why, sizeof why) !=
            RATE_OK)
            return fail(err, errlen, "%s", why);
        s = name + name_len;
        if (*s == ';')
            return fail(err, errlen, "name=%.*s is followed by ';'; the "
                        "name comes before the first limit, with a space",
                        (int)name_len, name);
        if (*s == '\0' || strspn(s, " \t") == strlen(s))
            return fail(err, errlen, "name=%.*s names no limit; a policy "
                        "needs at least one limit (or 'unlimited')",
                        (int)name_len, name);
        const char *next = s + strspn(s, " \t");
        if (strncmp(next, "name=", 5) == 0)
            return fail(err, errlen, "name= given twice; a policy has one "
                        "name, before its first limit");
    }
    for (;;) {
        const char *end = strchr(s, ';');
        size_t len = end ? (size_t)(end - s) : strlen(s);
        if (count == RATE_MAX_LIMITS)
            return fail(err, errlen, "more than %d limits in one policy",
                        RATE_MAX_LIMITS);
        bool unl = false;
        rc = parse_limit(s, len, count, &limits[count], &unl, err, errlen);
        if (rc != RATE_OK)
            return rc;
        if (unlimited || (unl && count > 0))
            /* A composite's limits all apply: one with no limit would be
             * only its others, which is better written so. */
            return fail(err, errlen,
                        "limit %zu: 'unlimited' stands alone; a policy with "
                        "other limits is limited by them (drop 'unlimited')",
                        count + 1);
        unlimited = unl;
        count++;
        if (end == NULL)
            break;
        s = end + 1;
    }
    rc = unlimited ? rate_policy_unlimited(out)
                   : rate_policy_new(limits, count, out, err, errlen);
    if (rc == RATE_OK && name != NULL) {
        memcpy((*out)->name, name, name_len);
        (*out)->name[name_len] = '\0';
    }
    return rc;
}

size_t rate_policy_format(const rate_policy_t *p, char *buf, size_t len)
{
    size_t used = 0;

    if (p == NULL)
        return 0;
    if (buf != NULL && len > 0)
        buf[0] = '\0';
    if (p->name[0] != '\0') {
        used = strlen(p->name) + 6; /* "name=" NAME " " */
        if (buf != NULL && len > 0)
            snprintf(buf, len, "name=%s ", p->name);
    }
    if (buf != NULL && used < len)
        return used + rate__policy_format_limits(p, buf + used, len - used);
    return used + rate__policy_format_limits(p, NULL, 0);
}

size_t rate__policy_format_limits(const rate_policy_t *p, char *buf,
                                  size_t len)
{
    size_t used = 0;
    char tmp[160];

    if (p == NULL)
        return 0;
    if (buf != NULL && len > 0)
        buf[0] = '\0';
    if (p->unlimited) {
        if (buf != NULL && len > 0)
            snprintf(buf, len, "unlimited");
        return strlen("unlimited");
    }
    for (size_t i = 0; i < p->count; i++) {
        const rate_limit_t *l = &p->limits[i];
        const algo_info_t *a = info_of(l->algorithm);
        char dur[48];
        format_ns(l->period_ns, dur, sizeof dur);
        int n;
        if (a->option[0] != '\0')
            n = snprintf(tmp, sizeof tmp, "%s%s %llu/%s %s=%llu",
                         i ? "; " : "", a->name,
                         (unsigned long long)l->limit, dur, a->option,
                         (unsigned long long)l->burst);
        else
            n = snprintf(tmp, sizeof tmp, "%s%s %llu/%s", i ? "; " : "",
                         a->name, (unsigned long long)l->limit, dur);
        if (l->block_ns != 0 && n >= 0 && (size_t)n < sizeof tmp) {
            format_ns(l->block_ns, dur, sizeof dur);
            n += snprintf(tmp + n, sizeof tmp - (size_t)n, " block=%s%s",
                          dur[0] >= '0' && dur[0] <= '9' ? "" : "1", dur);
        }
        if (buf != NULL && used + 1 < len)
            snprintf(buf + used, len - used, "%s", tmp);
        used += (size_t)n;
    }
    return used;
}
