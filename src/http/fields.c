/* SPDX-License-Identifier: MIT */
/*
 * The HTTP fields of a decision: RateLimit-Policy and RateLimit of
 * draft-ietf-httpapi-ratelimit-headers, and Retry-After.
 *
 * Both RateLimit fields are structured-field lists (RFC 9651) of items
 * whose value is the policy's name as a string and whose parameters are
 * integers: q and w (the quota and its window, in seconds) in
 * RateLimit-Policy, r and t (what remains, and the seconds until the quota
 * is whole again) in RateLimit.  A request decided under several policies
 * (the rules, src/http/rules.c) gets one item per policy in each field.  The
 * mapping from each algorithm to q and w, and the answer in each case
 * (denied, never, store errors, shadow, unlimited), are in ratelimit.h
 * (rate_headers_format) and docs/api-server.md.
 *
 * Every figure is rounded up where a client waits on it (w, t and
 * Retry-After), so that a client that believes it is never early, and
 * capped at the largest integer a structured field holds (15 digits).
 */
#include <string.h>

#include "http.h"
#include "ratelimit_http.h"

#define SF_INT_MAX UINT64_C(999999999999999) /* RFC 9651 sf-integer */

static uint64_t sf_int(uint64_t v)
{
    return v > SF_INT_MAX ? SF_INT_MAX : v;
}

/* ns as whole seconds, rounded up. */
static uint64_t ceil_s(unsigned __int128 ns)
{
    unsigned __int128 s = (ns + RATE_NS_PER_S - 1) / RATE_NS_PER_S;

    return s > SF_INT_MAX ? SF_INT_MAX : (uint64_t)s;
}

/* The quota q and window w (seconds, at least 1) of one limit. */
static void quota_of(const rate_limit_t *l, uint64_t *q, uint64_t *w)
{
    unsigned __int128 span; /* B*P passes 64 bits */

    if (l->algorithm == RATE_TOKEN_BUCKET || l->algorithm == RATE_LEAKY_BUCKET) {
        /* A bucket of B refills (drains) L per P: empty to full in B*P/L. */
        *q = l->burst;
        span = ((unsigned __int128)l->burst * l->period_ns + l->limit - 1) / l->limit;
    } else {
        *q = l->limit;
        span = l->period_ns;
    }
    *q = sf_int(*q);
    *w = ceil_s(span);
    if (*w == 0)
        *w = 1;
}

/* t: until the described limit is whole again. The decision's reset_after
 * is the largest of a composite's limits (an hour's window beside a bucket
 * that refills in a second), so a bucket's own is bounded by its room:
 * with r > 0 permits left and no reservation's delay (no debt) it is full
 * within (B-r)*P/L. A lone bucket's reset_after is already no more; a
 * blocking limit's key stays denied past the refill, so it is kept. */
static uint64_t reset_s(const rate_limit_t *l, uint64_t r,
                        const rate_decision_t *d)
{
    uint64_t t = ceil_s(d->reset_after_ns);

    if (l != NULL && l->block_ns == 0 && d->delay_ns == 0 && r > 0 &&
        r <= l->burst &&
        (l->algorithm == RATE_TOKEN_BUCKET ||
         l->algorithm == RATE_LEAKY_BUCKET)) {
        unsigned __int128 span =
            ((unsigned __int128)(l->burst - r) * l->period_ns + l->limit - 1) /
            l->limit;
        uint64_t b = ceil_s(span);
        if (b < t)
            t = b;
    }
    return t;
}

/* A field being written: plain appends (no snprintf: the fields are
 * made on every request), false once it would not fit. */
typedef struct field {
    char *buf;
    size_t cap; /* bytes of buf, the NUL included */
    size_t used;
    bool ok;
} field_t;

static void put_bytes(field_t *f, const char *s, size_t n)
{
    if (!f->ok || n >= f->cap - f->used) {
        f->ok = false;
        return;
    }
    memcpy(f->buf + f->used, s, n);
    f->used += n;
    f->buf[f->used] = '\0';
}

static void put_u64(field_t *f, uint64_t v)
{
    char d[24];
    size_t i = sizeof d;

    do
        d[--i] = (char)('0' + v % 10);
    while ((v /= 10) != 0);
    put_bytes(f, d + i, sizeof d - i);
}

/* The name as an sf-string: quoted, '"' and '\' escaped (a policy's name
 * has neither, but an outcome's copy is the caller's to fill). */
static void put_name(field_t *f, const char *name)
{
    if (name == NULL || name[0] == '\0')
        name = "default";
    put_bytes(f, "\"", 1);
    for (const char *p = name; *p != '\0';) {
        size_t n = strcspn(p, "\"\\");
        put_bytes(f, p, n);
        p += n;
        if (*p != '\0') {
            char esc[2] = {'\\', *p++};
            put_bytes(f, esc, 2);
        }
    }
    put_bytes(f, "\"", 1);
}

/* One item: "NAME";A=a;B=b, after ", " when not the first. */
static void put_item(field_t *f, const char *name, const char *ka,
                     uint64_t a, const char *kb, uint64_t b)
{
    if (f->used > 0)
        put_bytes(f, ", ", 2);
    put_name(f, name);
    put_bytes(f, ka, 3);
    put_u64(f, a);
    put_bytes(f, kb, 3);
    put_u64(f, b);
}

int rate__headers_items(const rate__hitem_t *items, size_t n,
                        rate_headers_t *out)
{
    bool limited = false, never = false, failed = false;
    uint64_t retry_ns = 0;

    if (out == NULL)
        return RATE_EINVAL;
    out->status = 0;
    out->policy[0] = out->ratelimit[0] = out->retry_after[0] = '\0';
    field_t pf = {out->policy, sizeof out->policy, 0, true};
    field_t rf = {out->ratelimit, sizeof out->ratelimit, 0, true};
    for (size_t i = 0; i < n; i++) {
        const rate_decision_t *d = items[i].d;
        const rate_limit_t *l = items[i].limit;
        if (d == NULL) {
            memset(out, 0, sizeof *out);
            return RATE_EINVAL;
        }
        bool no_info = items[i].unlimited || d->limit == RATE_NO_LIMIT ||
                       d->shadow || (l == NULL && items[i].concurrency == 0) ||
                       (d->reason == RATE_REASON_STORE_ERROR &&
                        d->component < 0);
        if (!d->allowed) {
            if (d->reason == RATE_REASON_STORE_ERROR && d->component < 0)
                failed = true; /* fail-closed: nothing is known */
            else if (d->reason == RATE_REASON_NEVER ||
                     d->retry_after_ns == RATE_NEVER)
                never = true;
            else {
                limited = true;
                if (d->retry_after_ns > retry_ns)
                    retry_ns = d->retry_after_ns;
            }
        }
        if (no_info)
            continue;
        uint64_t q, w;
        if (l != NULL) {
            /* An outcome is a plain value a caller may fill: a limit that
             * is none would be divided by (a bucket's rate of 0). */
            if (l->limit == 0 || rate_algorithm_name(l->algorithm) == NULL) {
                memset(out, 0, sizeof *out);
                return RATE_EINVAL;
            }
            quota_of(l, &q, &w);
            put_item(&pf, items[i].name, ";q=", q, ";w=", w);
        } else { /* in flight at once: a quota without a window */
            q = sf_int(items[i].concurrency);
            if (pf.used > 0)
                put_bytes(&pf, ", ", 2);
            put_name(&pf, items[i].name);
            put_bytes(&pf, ";q=", 3);
            put_u64(&pf, q);
        }
        uint64_t r = d->remaining;
        if (items[i].room > 0) /* admitted, then given back */
            r = r > UINT64_MAX - items[i].room ? UINT64_MAX : r + items[i].room;
        if (r > q)
            r = q;
        put_item(&rf, items[i].name, ";r=", r, ";t=", reset_s(l, r, d));
    }
    if (!pf.ok || !rf.ok) {
        memset(out, 0, sizeof *out);
        return RATE_ERANGE;
    }
    if (limited || never) {
        out->status = 429;
        if (!never) { /* a retry passes no earlier than every limit allows */
            uint64_t s = ceil_s(retry_ns);
            field_t ra = {out->retry_after, sizeof out->retry_after, 0, true};
            put_u64(&ra, s < 1 ? 1 : s); /* at most 15 digits: it fits */
        }
    } else if (failed) {
        out->status = 503;
    }
    return RATE_OK;
}

const rate_limit_t *rate__http_limit_of(const rate_policy_t *policy,
                                        const rate_decision_t *d)
{
    size_t n = rate_policy_count(policy); /* 0 for the unlimited policy */
    if (n == 0)
        return NULL;
    int c = d->component;
    return rate_policy_limit(policy, c >= 0 && (size_t)c < n ? (size_t)c : 0);
}

int rate_headers_format(const rate_policy_t *policy, const rate_decision_t *d,
                        rate_headers_t *out)
{
    if (policy == NULL || d == NULL || out == NULL) {
        if (out != NULL)
            memset(out, 0, sizeof *out);
        return RATE_EINVAL;
    }
    rate__hitem_t item = {rate_policy_name(policy),
                          rate_policy_is_unlimited(policy),
                          rate__http_limit_of(policy, d), d, 0, 0};
    return rate__headers_items(&item, 1, out);
}
