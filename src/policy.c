/*
 * Policies: validation, the text form, and the fingerprint that tags each
 * stored state with the policy it was made under.
 *
 * Text form (docs/policy.md):
 *
 *   policy := limit { ";" limit }
 *   limit  := ALGORITHM RATE { OPTION }
 *   RATE   := [COUNT] "/" [COUNT] UNIT        10/s  100/1m  3/500ms
 *   OPTION := "burst=" COUNT | "capacity=" COUNT
 *
 * Every bound checked here exists so that the decision path can never
 * overflow: see the comment on rate_policy_new() in ratelimit.h.
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "internal.h"

static const struct {
    const char *name;
    rate_algorithm_t algorithm;
} algo_names[] = {
    {"token-bucket", RATE_TOKEN_BUCKET},
    {"gcra", RATE_TOKEN_BUCKET},
    {"leaky-bucket", RATE_LEAKY_BUCKET},
    {"fixed-window", RATE_FIXED_WINDOW},
    {"sliding-log", RATE_SLIDING_LOG},
    {"sliding-window-log", RATE_SLIDING_LOG},
    {"sliding-window", RATE_SLIDING_WINDOW},
    {"sliding-window-counter", RATE_SLIDING_WINDOW},
};

static const struct {
    const char *name;
    uint64_t ns;
} units[] = {
    {"ns", 1},
    {"us", 1000},
    {"ms", 1000000},
    {"s", UINT64_C(1000000000)},
    {"m", UINT64_C(60000000000)},
    {"h", UINT64_C(3600000000000)},
    {"d", UINT64_C(86400000000000)},
};

const rate__algo_t *rate__algo(rate_algorithm_t a)
{
    switch (a) {
    case RATE_TOKEN_BUCKET:
        return &rate__token_bucket;
    case RATE_LEAKY_BUCKET:
        return &rate__leaky_bucket;
    case RATE_FIXED_WINDOW:
        return &rate__fixed_window;
    case RATE_SLIDING_LOG:
        return &rate__sliding_log;
    case RATE_SLIDING_WINDOW:
        return &rate__sliding_window;
    }
    return NULL;
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

static bool is_bucket(rate_algorithm_t a)
{
    return a == RATE_TOKEN_BUCKET || a == RATE_LEAKY_BUCKET;
}

static int check_limit(const rate_limit_t *l, size_t i, char *err,
                       size_t errlen)
{
    const rate__algo_t *a = rate__algo(l->algorithm);

    if (a == NULL)
        return fail(err, errlen, "limit %zu: unknown algorithm %d", i + 1,
                    (int)l->algorithm);
    if (l->limit == 0)
        return fail(err, errlen, "limit %zu (%s): the rate's count is zero",
                    i + 1, a->name);
    if (l->period_ns == 0)
        return fail(err, errlen, "limit %zu (%s): the %s is zero", i + 1,
                    a->name, is_bucket(l->algorithm) ? "period" : "window");
    if (l->limit > RATE_TIME_MAX || l->period_ns > RATE_TIME_MAX ||
        l->burst > RATE_TIME_MAX)
        return fail(err, errlen,
                    "limit %zu (%s): count, period or burst above 2^63-1",
                    i + 1, a->name);
    if (is_bucket(l->algorithm)) {
        const char *what =
            l->algorithm == RATE_TOKEN_BUCKET ? "burst" : "capacity";
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
    uint64_t words[1 + 4 * RATE_MAX_LIMITS];
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
    }
    if (count == 1 && p->algo[0]->grow == 0)
        p->plain = p->algo[0]->plain;
    p->fingerprint = fingerprint(p);
    *out = p;
    return RATE_OK;
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

/* A count in policy text: a whole number up to 2^63-1. */
static bool parse_count(const char *s, size_t len, uint64_t *out)
{
    return rate__parse_decimal(s, len, RATE_TIME_MAX, out);
}

/* "[COUNT]UNIT" with the count optional when allow_bare, into ns. */
static int parse_dur(const char *s, size_t len, bool allow_bare,
                     uint64_t *out)
{
    size_t digits = 0;
    uint64_t count = 1;

    while (digits < len && s[digits] >= '0' && s[digits] <= '9')
        digits++;
    if (digits == len && len == 1 && s[0] == '0') {
        *out = 0;
        return RATE_OK;
    }
    if (digits == 0 && !allow_bare)
        return RATE_EINVAL;
    if (digits > 0 && !parse_count(s, digits, &count))
        return RATE_ERANGE;
    for (size_t u = 0; u < sizeof units / sizeof units[0]; u++) {
        if (strlen(units[u].name) == len - digits &&
            memcmp(units[u].name, s + digits, len - digits) == 0) {
            if (count > RATE_TIME_MAX / units[u].ns)
                return RATE_ERANGE;
            *out = count * units[u].ns;
            return RATE_OK;
        }
    }
    return RATE_EINVAL;
}

int rate_parse_duration(const char *text, uint64_t *out_ns)
{
    if (text == NULL || out_ns == NULL)
        return RATE_EINVAL;
    return parse_dur(text, strlen(text), false, out_ns);
}

typedef struct token {
    const char *s;
    size_t len;
} token_t;

static size_t split_words(const char *s, size_t len, token_t *w, size_t max)
{
    size_t n = 0, i = 0;

    while (i < len) {
        while (i < len && isspace((unsigned char)s[i]))
            i++;
        if (i == len)
            break;
        size_t start = i;
        while (i < len && !isspace((unsigned char)s[i]))
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
    const char *slash = memchr(t.s, '/', t.len);
    size_t left;
    int rc;

    if (slash == NULL)
        return fail(err, errlen,
                    "limit %zu: rate '%.*s' is not COUNT/DURATION (e.g. 10/s)",
                    idx + 1, (int)t.len, t.s);
    left = (size_t)(slash - t.s);
    if (!parse_count(t.s, left, &l->limit))
        return fail(err, errlen,
                    "limit %zu: count '%.*s' in rate '%.*s' is not a whole "
                    "number up to 2^63-1",
                    idx + 1, (int)left, t.s, (int)t.len, t.s);
    rc = parse_dur(slash + 1, t.len - left - 1, true, &l->period_ns);
    if (rc != RATE_OK)
        return fail(err, errlen,
                    "limit %zu: duration '%.*s' in rate '%.*s' %s", idx + 1,
                    (int)(t.len - left - 1), slash + 1, (int)t.len, t.s,
                    rc == RATE_ERANGE ? "is above 2^63-1 ns"
                                      : "is not [COUNT]UNIT, units ns us ms "
                                        "s m h d");
    return RATE_OK;
}

static int parse_option(token_t t, size_t idx, rate_limit_t *l, char *err,
                        size_t errlen)
{
    const char *eq = memchr(t.s, '=', t.len);
    size_t klen = eq ? (size_t)(eq - t.s) : t.len;
    const char *want = l->algorithm == RATE_TOKEN_BUCKET   ? "burst"
                       : l->algorithm == RATE_LEAKY_BUCKET ? "capacity"
                                                           : NULL;
    uint64_t v;

    if (eq == NULL)
        return fail(err, errlen, "limit %zu: '%.*s' is not NAME=VALUE",
                    idx + 1, (int)t.len, t.s);
    bool known = (klen == 5 && memcmp(t.s, "burst", 5) == 0) ||
                 (klen == 8 && memcmp(t.s, "capacity", 8) == 0);
    if (!known)
        return fail(err, errlen,
                    "limit %zu: unknown option '%.*s' (burst= for "
                    "token-bucket, capacity= for leaky-bucket)",
                    idx + 1, (int)klen, t.s);
    if (want == NULL || strlen(want) != klen || memcmp(want, t.s, klen) != 0)
        return fail(err, errlen, "limit %zu: option '%.*s' does not belong to "
                    "%s", idx + 1, (int)klen, t.s,
                    rate__algo(l->algorithm)->name);
    if (!parse_count(eq + 1, t.len - klen - 1, &v))
        return fail(err, errlen,
                    "limit %zu: %.*s value '%.*s' is not a whole number up "
                    "to 2^63-1",
                    idx + 1, (int)klen, t.s, (int)(t.len - klen - 1), eq + 1);
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

/* One limit's text; *unlimited set (and l untouched) for "unlimited". */
static int parse_limit(const char *s, size_t len, size_t idx, rate_limit_t *l,
                       bool *unlimited, char *err, size_t errlen)
{
    token_t w[8];
    size_t n = split_words(s, len, w, 8);
    size_t a;
    int rc;

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
    for (a = 0; a < sizeof algo_names / sizeof algo_names[0]; a++)
        if (strlen(algo_names[a].name) == w[0].len &&
            memcmp(algo_names[a].name, w[0].s, w[0].len) == 0)
            break;
    if (a == sizeof algo_names / sizeof algo_names[0])
        return fail(err, errlen,
                    "limit %zu: unknown algorithm '%.*s' (token-bucket, gcra, "
                    "leaky-bucket, fixed-window, sliding-log, sliding-window)",
                    idx + 1, (int)w[0].len, w[0].s);
    memset(l, 0, sizeof *l);
    l->algorithm = algo_names[a].algorithm;
    if (n < 2)
        return fail(err, errlen, "limit %zu: %s needs a rate such as 10/s",
                    idx + 1, algo_names[a].name);
    if ((rc = parse_rate(w[1], idx, l, err, errlen)) != RATE_OK)
        return rc;
    for (size_t i = 2; i < n; i++)
        if ((rc = parse_option(w[i], idx, l, err, errlen)) != RATE_OK)
            return rc;
    /* A bucket without burst/capacity holds one period's worth. */
    if (is_bucket(l->algorithm) && l->burst == 0)
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
    if (unlimited)
        return rate_policy_unlimited(out);
    return rate_policy_new(limits, count, out, err, errlen);
}

/* "N/DUR" with the largest unit that divides the period exactly. */
static int format_rate(const rate_limit_t *l, char *buf, size_t len)
{
    size_t u = sizeof units / sizeof units[0];

    while (u-- > 1)
        if (l->period_ns % units[u].ns == 0)
            break;
    uint64_t mult = l->period_ns / units[u].ns;
    if (mult == 1)
        return snprintf(buf, len, "%llu/%s", (unsigned long long)l->limit,
                        units[u].name);
    return snprintf(buf, len, "%llu/%llu%s", (unsigned long long)l->limit,
                    (unsigned long long)mult, units[u].name);
}

size_t rate_policy_format(const rate_policy_t *p, char *buf, size_t len)
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
        char rate[64];
        format_rate(l, rate, sizeof rate);
        int n;
        if (is_bucket(l->algorithm))
            n = snprintf(tmp, sizeof tmp, "%s%s %s %s=%llu", i ? "; " : "",
                         rate__algo(l->algorithm)->name, rate,
                         l->algorithm == RATE_TOKEN_BUCKET ? "burst"
                                                           : "capacity",
                         (unsigned long long)l->burst);
        else
            n = snprintf(tmp, sizeof tmp, "%s%s %s", i ? "; " : "",
                         rate__algo(l->algorithm)->name, rate);
        if (buf != NULL && used + 1 < len)
            snprintf(buf + used, len - used, "%s", tmp);
        used += (size_t)n;
    }
    return used;
}
