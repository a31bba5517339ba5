/* SPDX-License-Identifier: MIT */
/*
 * The DynamoDB store: keys shared by every host that reaches one table,
 * through DynamoDB's JSON API (libcurl signs each request with SigV4;
 * jansson reads and writes the JSON).  docs/dynamodb.md is the long form.
 *
 * A key is one item:
 *   k    B  the partition key: PREFIX, one byte of space (rate_space_t),
 *           then the key's bytes
 *   s    B  the state bytes (the library's, docs/algorithms.md)
 *   v    N  the version: random on a new item, +1 on each write
 *   e    N  the expiry, wall-clock ns; absent for a key kept forever and
 *           with no_ttl
 *   ttl  N  e in epoch seconds plus a margin: DynamoDB's own TTL
 *
 * The generic contract only: load() is one consistent GetItem; cas() one
 * PutItem conditioned on `v = :v`, or, for a key that read as absent, on
 * `attribute_not_exists(k) OR e <= :now`.  An item whose e has passed reads
 * as absent, whatever DynamoDB's TTL has done yet (it deletes late).  The
 * store's clock, now(), is CLOCK_REALTIME, one clock for every host
 * (unless client_time).
 *
 * Requests go out on curl easy handles kept in a pool (each keeps its
 * connection alive); a caller takes one for a request and puts it back.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/random.h>
#include <time.h>

#include <curl/curl.h>
#include <jansson.h>

#include "../call.h"
#include "../kit.h"
#include "ratelimit_dynamodb.h"

/* DynamoDB's largest item, bytes (names and values of every attribute). */
#define ITEM_MAX 409600u
/* Seconds the TTL attribute lies past e: DynamoDB's TTL runs on AWS's
 * clock, which may be ahead of the writer's. */
#define TTL_MARGIN_S 3600u
#define PREFIX_MAX 1024u

enum op { OP_GET, OP_PUT, OP_DELETE, OP_DESCRIBE, OP_CREATE, OP_TTL, OP_SCAN,
          OP_COUNT };
static const char *const op_names[OP_COUNT] = {
    "GetItem", "PutItem", "DeleteItem", "DescribeTable", "CreateTable",
    "UpdateTimeToLive", "Scan"};

typedef struct handle {
    CURL *curl;
    struct handle *next;
} handle_t;

typedef struct ddb {
    char table[256];
    char region[64];
    char sigv4[128];
    char *endpoint;
    char *key_id, *secret, *token;
    uint8_t *prefix;
    size_t prefix_len;
    long connect_ms, request_ms;
    uint64_t request_ns; /* request_ms in ns: a call's whole budget */
    bool ttl, wall_clock;
    uint64_t safety_s; /* with no_ttl: the TTL attribute's delay, s */
    size_t state_max; /* the largest state bytes an item can hold */
    struct curl_slist *headers[OP_COUNT];

    pthread_mutex_t lock; /* the pool and last_error */
    handle_t *pool;
    char last_error[512];

    atomic_uint_fast64_t requests, reads, writes, deletes, conflicts,
        throttled, errors;
} ddb_t;

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static CURLcode curl_init_rc;

static void curl_init(void)
{
    curl_init_rc = curl_global_init(CURL_GLOBAL_DEFAULT);
}

/* ---------------------------------------------------------------- base64 */

static const char b64[] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/* Encodes n bytes; the text is NUL-terminated, malloc'd (NULL: no room). */
static char *b64_encode(const uint8_t *p, size_t n, size_t *out_len)
{
    size_t len = (n + 2) / 3 * 4;
    char *s = malloc(len + 1), *o = s;
    if (s == NULL)
        return NULL;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t w = (uint32_t)p[i] << 16;
        if (i + 1 < n)
            w |= (uint32_t)p[i + 1] << 8;
        if (i + 2 < n)
            w |= p[i + 2];
        *o++ = b64[w >> 18 & 63];
        *o++ = b64[w >> 12 & 63];
        *o++ = i + 1 < n ? b64[w >> 6 & 63] : '=';
        *o++ = i + 2 < n ? b64[w & 63] : '=';
    }
    *o = '\0';
    *out_len = len;
    return s;
}

static int b64_value(char c)
{
    if (c >= 'A' && c <= 'Z')
        return c - 'A';
    if (c >= 'a' && c <= 'z')
        return c - 'a' + 26;
    if (c >= '0' && c <= '9')
        return c - '0' + 52;
    if (c == '+')
        return 62;
    if (c == '/')
        return 63;
    return -1;
}

/* Decodes canonical base64 into out (room for n / 4 * 3 bytes); false for
 * anything else. */
static bool b64_decode(const char *s, size_t n, uint8_t *out, size_t *out_len)
{
    size_t o = 0;
    if (n % 4 != 0)
        return false;
    for (size_t i = 0; i < n; i += 4) {
        int v[4];
        int pad = 0;
        for (size_t j = 0; j < 4; j++) {
            if (s[i + j] == '=' && i + 4 == n && j >= 2) {
                v[j] = 0;
                pad++;
            } else if (pad != 0 || (v[j] = b64_value(s[i + j])) < 0) {
                return false;
            }
        }
        uint32_t w = (uint32_t)v[0] << 18 | (uint32_t)v[1] << 12 |
                     (uint32_t)v[2] << 6 | (uint32_t)v[3];
        out[o++] = (uint8_t)(w >> 16);
        if (pad < 2)
            out[o++] = (uint8_t)(w >> 8);
        if (pad < 1)
            out[o++] = (uint8_t)w;
    }
    *out_len = o;
    return true;
}

/* ----------------------------------------------------------- the requests */

static uint64_t wall_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * RATE_NS_PER_S + (uint64_t)ts.tv_nsec;
}

static void set_last_error(ddb_t *d, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void set_last_error(ddb_t *d, const char *fmt, ...)
{
    va_list ap;
    pthread_mutex_lock(&d->lock);
    va_start(ap, fmt);
    vsnprintf(d->last_error, sizeof d->last_error, fmt, ap);
    va_end(ap);
    pthread_mutex_unlock(&d->lock);
}

typedef struct body {
    char *p;
    size_t len, cap;
} body_t;

static size_t on_data(char *data, size_t size, size_t n, void *ud)
{
    body_t *b = ud;
    size_t add = size * n;
    if (b->len + add + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 1024;
        while (cap < b->len + add + 1)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (p == NULL)
            return 0; /* curl fails the transfer */
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, data, add);
    b->len += add;
    b->p[b->len] = '\0';
    return add;
}

static handle_t *take_handle(ddb_t *d)
{
    pthread_mutex_lock(&d->lock);
    handle_t *h = d->pool;
    if (h != NULL)
        d->pool = h->next;
    pthread_mutex_unlock(&d->lock);
    if (h != NULL)
        return h;
    if ((h = calloc(1, sizeof *h)) == NULL)
        return NULL;
    if ((h->curl = curl_easy_init()) == NULL) {
        free(h);
        return NULL;
    }
    CURL *c = h->curl;
    curl_easy_setopt(c, CURLOPT_URL, d->endpoint);
    curl_easy_setopt(c, CURLOPT_POST, 1L);
    curl_easy_setopt(c, CURLOPT_AWS_SIGV4, d->sigv4);
    curl_easy_setopt(c, CURLOPT_USERNAME, d->key_id);
    curl_easy_setopt(c, CURLOPT_PASSWORD, d->secret);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, d->connect_ms);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, d->request_ms);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_TCP_NODELAY, 1L);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_data);
    return h;
}

static void put_handle(ddb_t *d, handle_t *h)
{
    pthread_mutex_lock(&d->lock);
    h->next = d->pool;
    d->pool = h;
    pthread_mutex_unlock(&d->lock);
}

static void free_handle(handle_t *h)
{
    curl_easy_cleanup(h->curl);
    free(h);
}

/* The error's type without its namespace ("...#ResourceNotFoundException"
 * is "ResourceNotFoundException"), and its message. */
static void error_of(json_t *reply, const char **type, const char **msg)
{
    const char *t = json_string_value(json_object_get(reply, "__type"));
    const char *m = json_string_value(json_object_get(reply, "message"));
    if (m == NULL)
        m = json_string_value(json_object_get(reply, "Message"));
    if (t != NULL && strchr(t, '#') != NULL)
        t = strchr(t, '#') + 1;
    *type = t ? t : "";
    *msg = m ? m : "";
}

static bool is_throttle(const char *type)
{
    return strcmp(type, "ProvisionedThroughputExceededException") == 0 ||
           strcmp(type, "ThrottlingException") == 0 ||
           strcmp(type, "RequestLimitExceeded") == 0;
}

/* One round trip: op with the JSON `req` (taken: freed here).  RATE_OK with
 * *reply the answer (the caller frees it); else the error, recorded in
 * last_error with the service's own words, and *type (if not NULL) the
 * error's type ("" for a failure below the service):
 *   RATE_ECONFLICT  ConditionalCheckFailedException (not recorded)
 *   RATE_ETIMEDOUT  no answer within the request timeout
 *   RATE_ESTORE     no connection, an HTTP error (throttling, a 5xx, bad
 *                   credentials, a missing table...)
 *   RATE_ECORRUPT   an answer that is not JSON
 *   RATE_ENOMEM */
static int request(ddb_t *d, enum op op, json_t *req, json_t **reply,
                   char *type, size_t type_len)
{
    body_t b = {0};
    long http = 0;
    int rc = RATE_OK;

    *reply = NULL;
    if (type != NULL && type_len > 0)
        type[0] = '\0';
    char *text = req ? json_dumps(req, JSON_COMPACT) : NULL;
    json_decref(req);
    if (text == NULL)
        return RATE_ENOMEM;
    handle_t *h = take_handle(d);
    if (h == NULL) {
        free(text);
        return RATE_ENOMEM;
    }
    CURL *c = h->curl;
    /* The call's requests share one deadline (call.h,
     * rate__call_begin): a decision's GetItem and PutItem, and the
     * retries of a conflict, all within request_ns of its start.  A
     * request gets what is left of it (curl's whole transfer, connecting
     * included); none is left: not sent. */
    uint64_t now = rate_clock_monotonic_ns();
    uint64_t deadline = rate__call_deadline_ns(d->request_ns);
    if (now >= deadline) {
        put_handle(d, h);
        free(text);
        atomic_fetch_add_explicit(&d->errors, 1, memory_order_relaxed);
        set_last_error(d, "%s on %s: not sent: the call's %ld ms were "
                       "spent on its earlier requests", op_names[op],
                       d->endpoint, d->request_ms);
        return RATE_ETIMEDOUT;
    }
    uint64_t left_ms = (deadline - now + 999999) / 1000000;
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS,
                     left_ms < (uint64_t)d->request_ms ? (long)left_ms
                                                       : d->request_ms);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, d->headers[op]);
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, text);
    curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE, (long)strlen(text));
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &b);
    atomic_fetch_add_explicit(&d->requests, 1, memory_order_relaxed);
    CURLcode cc = curl_easy_perform(c);
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, NULL);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, NULL);
    free(text);
    if (cc == CURLE_OK)
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &http);
    if (cc != CURLE_OK) {
        /* A handle whose transfer failed may hold a dead connection:
         * dropped rather than pooled. */
        free_handle(h);
        atomic_fetch_add_explicit(&d->errors, 1, memory_order_relaxed);
        rc = cc == CURLE_OPERATION_TIMEDOUT ? RATE_ETIMEDOUT
             : cc == CURLE_OUT_OF_MEMORY    ? RATE_ENOMEM
                                            : RATE_ESTORE;
        set_last_error(d, "%s on %s: %s", op_names[op], d->endpoint,
                       curl_easy_strerror(cc));
        free(b.p);
        return rc;
    }
    put_handle(d, h);
    json_error_t je;
    json_t *j = b.p ? json_loadb(b.p, b.len, 0, &je) : NULL;
    if (http == 200 && json_is_object(j)) {
        *reply = j;
        free(b.p);
        return RATE_OK;
    }
    if (j == NULL || !json_is_object(j)) {
        atomic_fetch_add_explicit(&d->errors, 1, memory_order_relaxed);
        set_last_error(d, "%s: HTTP %ld, an answer that is not a JSON "
                       "object: %.200s", op_names[op], http,
                       b.p ? b.p : "");
        rc = http >= 200 && http < 300 ? RATE_ECORRUPT : RATE_ESTORE;
    } else {
        const char *t, *m;
        error_of(j, &t, &m);
        if (type != NULL)
            snprintf(type, type_len, "%s", t);
        if (strcmp(t, "ConditionalCheckFailedException") == 0) {
            atomic_fetch_add_explicit(&d->conflicts, 1, memory_order_relaxed);
            rc = RATE_ECONFLICT;
        } else {
            atomic_fetch_add_explicit(is_throttle(t) ? &d->throttled
                                                     : &d->errors,
                                      1, memory_order_relaxed);
            set_last_error(d, "%s: HTTP %ld %s: %s", op_names[op], http,
                           *t ? t : "error", m);
            rc = RATE_ESTORE;
        }
    }
    json_decref(j);
    free(b.p);
    return rc;
}

/* -------------------------------------------------------------- the items */

/* The item's key attribute {"B": base64(PREFIX SPACE KEY)}, or NULL. */
static json_t *key_attr(ddb_t *d, const rate_key_t *key)
{
    uint8_t kb[PREFIX_MAX + 1 + RATE_KEY_MAX];
    size_t n = 0, len;
    if (d->prefix_len > 0)
        memcpy(kb, d->prefix, d->prefix_len);
    n += d->prefix_len;
    kb[n++] = (uint8_t)key->space;
    memcpy(kb + n, key->bytes, key->len);
    n += key->len;
    char *s = b64_encode(kb, n, &len);
    if (s == NULL)
        return NULL;
    json_t *j = json_pack("{s:s%}", "B", s, len);
    free(s);
    return j;
}

static json_t *num_attr(uint64_t v)
{
    char n[24];
    snprintf(n, sizeof n, "%" PRIu64, v);
    return json_pack("{s:s}", "N", n);
}

/* The value of {"N": "digits"} up to UINT64_MAX; false for anything else. */
static bool num_of(json_t *attr, uint64_t *out)
{
    const char *s = json_string_value(json_object_get(attr, "N"));
    return s != NULL && rate__parse_decimal(s, strlen(s), UINT64_MAX, out);
}

static int check_key(const rate_key_t *key)
{
    if (key == NULL || key->bytes == NULL || key->len == 0 ||
        key->len > RATE_KEY_MAX || (unsigned)key->space >= RATE_SPACES)
        return RATE_EKEY;
    return RATE_OK;
}

static int d_load(void *self, const rate_key_t *key, void *buf, size_t cap,
                  size_t *len, uint64_t *version)
{
    ddb_t *d = self;
    json_t *reply, *k;
    int rc;

    *len = 0;
    *version = 0;
    if ((rc = check_key(key)) != RATE_OK)
        return rc;
    if ((k = key_attr(d, key)) == NULL)
        return RATE_ENOMEM;
    json_t *req = json_pack("{s:s,s:{s:o},s:b}", "TableName", d->table, "Key",
                            "k", k, "ConsistentRead", 1);
    atomic_fetch_add_explicit(&d->reads, 1, memory_order_relaxed);
    if ((rc = request(d, OP_GET, req, &reply, NULL, 0)) != RATE_OK)
        return rc == RATE_ECONFLICT ? RATE_ESTORE : rc;
    json_t *item = json_object_get(reply, "Item");
    if (item == NULL) { /* absent */
        json_decref(reply);
        return RATE_OK;
    }
    const char *s = json_string_value(
        json_object_get(json_object_get(item, "s"), "B"));
    uint64_t v, e = 0;
    json_t *ej = json_object_get(item, "e");
    if (!json_is_object(item) || s == NULL ||
        !num_of(json_object_get(item, "v"), &v) || v == 0 ||
        (ej != NULL && !num_of(ej, &e))) {
        set_last_error(d, "GetItem: the item of a key is not this "
                          "library's (k, s: B, v: N, e: N)");
        json_decref(reply);
        return RATE_ECORRUPT;
    }
    if (ej != NULL && e <= wall_ns()) { /* expired: absent, TTL or not */
        json_decref(reply);
        return RATE_OK;
    }
    size_t n = strlen(s), got;
    uint8_t *tmp = malloc(n / 4 * 3 + 1);
    if (tmp == NULL) {
        json_decref(reply);
        return RATE_ENOMEM;
    }
    if (!b64_decode(s, n, tmp, &got)) {
        set_last_error(d, "GetItem: the state of a key is not base64");
        rc = RATE_ECORRUPT;
    } else if (got > cap) {
        *len = got; /* the limiter calls again with room for it */
        rc = RATE_EINVAL;
    } else {
        memcpy(buf, tmp, got);
        *len = got;
        *version = v;
    }
    free(tmp);
    json_decref(reply);
    return rc;
}

/* A new item's version: random, never 0, far from any other item's. */
static uint64_t new_version(void)
{
    uint64_t v = 0;
    while (v == 0) {
        if (getrandom(&v, sizeof v, 0) != (ssize_t)sizeof v)
            v = wall_ns() ^ (uint64_t)(uintptr_t)&v;
        v >>= 2; /* below 2^62: +1 never wraps in practice */
    }
    return v;
}

static int d_cas(void *self, const rate_key_t *key, uint64_t version,
                 const void *state, size_t len, uint64_t ttl_ns)
{
    ddb_t *d = self;
    json_t *reply, *k, *item;
    int rc;
    size_t slen;

    if ((rc = check_key(key)) != RATE_OK)
        return rc;
    if (len > d->state_max) {
        set_last_error(d, "PutItem: a state of %zu bytes does not fit in a "
                          "DynamoDB item (at most %zu here)",
                       len, d->state_max);
        return RATE_EFULL;
    }
    char *s = b64_encode(state, len, &slen);
    if (s == NULL || (k = key_attr(d, key)) == NULL) {
        free(s);
        return RATE_ENOMEM;
    }
    uint64_t now = wall_ns();
    uint64_t nv = version == 0 ? new_version() : version + 1;
    item = json_pack("{s:o,s:{s:s%},s:o}", "k", k, "s", "B", s, slen, "v",
                     num_attr(nv));
    free(s);
    if (item != NULL && d->ttl && ttl_ns != RATE_TTL_FOREVER) {
        uint64_t e = rate__sat_add(now, ttl_ns);
        json_object_set_new(item, "e", num_attr(e));
        json_object_set_new(item, "ttl",
                            num_attr(e / RATE_NS_PER_S + 1 + TTL_MARGIN_S));
    } else if (item != NULL && d->safety_s != 0 &&
               ttl_ns != RATE_TTL_FOREVER) {
        /* DynamoDB's deletion only: the reading never expires it. */
        json_object_set_new(item, "ttl",
                            num_attr(now / RATE_NS_PER_S + d->safety_s));
    }
    json_t *req;
    if (version == 0)
        req = json_pack("{s:s,s:o,s:s,s:{s:o}}", "TableName", d->table,
                        "Item", item, "ConditionExpression",
                        "attribute_not_exists(k) OR e <= :now",
                        "ExpressionAttributeValues", ":now", num_attr(now));
    else
        req = json_pack("{s:s,s:o,s:s,s:{s:o}}", "TableName", d->table,
                        "Item", item, "ConditionExpression", "v = :v",
                        "ExpressionAttributeValues", ":v",
                        num_attr(version));
    atomic_fetch_add_explicit(&d->writes, 1, memory_order_relaxed);
    if ((rc = request(d, OP_PUT, req, &reply, NULL, 0)) != RATE_OK)
        return rc;
    json_decref(reply);
    return RATE_OK;
}

static int d_remove(void *self, const rate_key_t *key)
{
    ddb_t *d = self;
    json_t *reply, *k;
    int rc;

    if ((rc = check_key(key)) != RATE_OK)
        return rc;
    if ((k = key_attr(d, key)) == NULL)
        return RATE_ENOMEM;
    json_t *req = json_pack("{s:s,s:{s:o}}", "TableName", d->table, "Key",
                            "k", k);
    atomic_fetch_add_explicit(&d->deletes, 1, memory_order_relaxed);
    if ((rc = request(d, OP_DELETE, req, &reply, NULL, 0)) != RATE_OK)
        return rc == RATE_ECONFLICT ? RATE_ESTORE : rc;
    json_decref(reply);
    return RATE_OK;
}

/* The wall clock: hosts sharing a table share no other clock. */
static int d_now(void *self, uint64_t *now_ns)
{
    ddb_t *d = self;
    if (!d->wall_clock)
        return RATE_ENOTSUP;
    *now_ns = wall_ns();
    return RATE_OK;
}

static int d_check_policy(void *self, const rate_policy_t *policy,
                          size_t max_state, char *err, size_t errlen)
{
    ddb_t *d = self;
    (void)policy;
    if (max_state <= d->state_max)
        return RATE_OK;
    return rate__fail(err, errlen, RATE_EPOLICY,
                      "a key's state under this policy may reach %zu bytes, "
                      "more than one DynamoDB item holds (400 KB: at most "
                      "%zu bytes of state with this key prefix); shorten "
                      "its sliding logs",
                      max_state, d->state_max);
}

static void d_destroy(void *self)
{
    ddb_t *d = self;
    for (handle_t *h = d->pool; h != NULL;) {
        handle_t *next = h->next;
        free_handle(h);
        h = next;
    }
    for (int i = 0; i < OP_COUNT; i++)
        curl_slist_free_all(d->headers[i]);
    free(d->endpoint);
    free(d->key_id);
    free(d->secret);
    free(d->token);
    free(d->prefix);
    pthread_mutex_destroy(&d->lock);
    free(d);
}

static const rate_store_methods_t ddb_methods = {
    .version = RATE_STORE_VERSION,
    .name = "dynamodb",
    .load = d_load,
    .cas = d_cas,
    .now = d_now,
    .remove = d_remove,
    .destroy = d_destroy,
    .check_policy = d_check_policy,
};

/* ------------------------------------------------------- the constructor */

static bool query_value(const char *q, const char *name, const char **v,
                        size_t *vlen)
{
    size_t nl = strlen(name);
    for (const char *p = q; p != NULL && *p;) {
        const char *amp = strchr(p, '&');
        size_t l = amp ? (size_t)(amp - p) : strlen(p);
        if (l > nl && strncmp(p, name, nl) == 0 && p[nl] == '=') {
            *v = p + nl + 1;
            *vlen = l - nl - 1;
            return true;
        }
        p = amp ? amp + 1 : NULL;
    }
    return false;
}

/* dynamodb://TABLE?region=REGION[&endpoint=http(s)://HOST[:PORT]] */
static int parse_url(ddb_t *d, const char *url, char *err, size_t errlen)
{
    static const char form[] =
        "dynamodb://TABLE?region=REGION[&endpoint=http://HOST:PORT]";
    if (strncmp(url, "dynamodb://", 11) != 0)
        return rate__fail(err, errlen, RATE_EINVAL, "'%s' is not %s", url,
                          form);
    const char *t = url + 11, *q = strchr(t, '?');
    size_t tl = q ? (size_t)(q - t) : strlen(t);
    if (tl < 3 || tl > 255)
        return rate__fail(err, errlen, RATE_EINVAL,
                          "'%s': a table name is 3 to 255 characters (%s)",
                          url, form);
    for (size_t i = 0; i < tl; i++) {
        char c = t[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
              (c >= '0' && c <= '9') || c == '_' || c == '-' || c == '.'))
            return rate__fail(err, errlen, RATE_EINVAL,
                              "'%s': a table name has only letters, digits, "
                              "'_', '-' and '.'", url);
    }
    memcpy(d->table, t, tl);
    d->table[tl] = '\0';
    q = q ? q + 1 : "";
    bool seen[2] = {false, false}; /* region, endpoint */
    for (const char *p = q; *p;) { /* every parameter known, once, valued */
        const char *amp = strchr(p, '&');
        size_t l = amp ? (size_t)(amp - p) : strlen(p);
        int which = l >= 7 && strncmp(p, "region=", 7) == 0     ? 0
                    : l >= 9 && strncmp(p, "endpoint=", 9) == 0 ? 1
                                                                : -1;
        if (l == 0)
            return rate__fail(err, errlen, RATE_EINVAL,
                              "'%s': an empty parameter (a stray '&') (%s)",
                              url, form);
        if (which < 0)
            return rate__fail(err, errlen, RATE_EINVAL,
                              "'%s': unknown parameter '%.*s' (%s)", url,
                              (int)l, p, form);
        const char *name = which == 0 ? "region" : "endpoint";
        if (l == strlen(name) + 1)
            return rate__fail(err, errlen, RATE_EINVAL,
                              "'%s': parameter '%s' has no value (%s)", url,
                              name, form);
        if (seen[which])
            return rate__fail(err, errlen, RATE_EINVAL,
                              "'%s': parameter '%s' given twice", url, name);
        seen[which] = true;
        if (amp != NULL && amp[1] == '\0')
            return rate__fail(err, errlen, RATE_EINVAL,
                              "'%s': an empty parameter (a stray '&') (%s)",
                              url, form);
        p = amp ? amp + 1 : p + l;
    }
    const char *v;
    size_t vl;
    if (!query_value(q, "region", &v, &vl))
        return rate__fail(err, errlen, RATE_EINVAL,
                          "'%s': no region (%s)", url, form);
    for (size_t i = 0; i < vl; i++)
        if (!((v[i] >= 'a' && v[i] <= 'z') || (v[i] >= '0' && v[i] <= '9') ||
              v[i] == '-'))
            return rate__fail(err, errlen, RATE_EINVAL,
                              "'%s': region '%.*s' is not a region name "
                              "(us-east-1)", url, (int)vl, v);
    if (vl >= sizeof d->region)
        return rate__fail(err, errlen, RATE_EINVAL, "'%s': region too long",
                          url);
    memcpy(d->region, v, vl);
    d->region[vl] = '\0';
    char ep[512];
    if (query_value(q, "endpoint", &v, &vl)) {
        size_t scheme = vl > 7 && strncmp(v, "http://", 7) == 0    ? 7
                        : vl > 8 && strncmp(v, "https://", 8) == 0 ? 8
                                                                   : 0;
        /* HOST[:PORT] and at most a final '/': no path, no query. */
        bool host_only = scheme != 0 && vl < sizeof ep - 2;
        for (size_t i = scheme; host_only && i < vl; i++) {
            char c = v[i];
            host_only = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                        (c >= '0' && c <= '9') || c == '.' || c == '-' ||
                        c == ':' || c == '[' || c == ']' ||
                        (c == '/' && i == vl - 1 && i > scheme);
        }
        if (!host_only)
            return rate__fail(err, errlen, RATE_EINVAL,
                              "'%s': endpoint '%.*s' is not "
                              "http(s)://HOST[:PORT]", url, (int)vl, v);
        snprintf(ep, sizeof ep, "%.*s%s", (int)vl, v,
                 v[vl - 1] == '/' ? "" : "/");
    } else {
        snprintf(ep, sizeof ep, "https://dynamodb.%s.amazonaws.com/",
                 d->region);
    }
    if ((d->endpoint = strdup(ep)) == NULL)
        return RATE_ENOMEM;
    snprintf(d->sigv4, sizeof d->sigv4, "aws:amz:%s:dynamodb", d->region);
    return RATE_OK;
}

static char *trim(char *s)
{
    while (*s == ' ' || *s == '\t')
        s++;
    size_t n = strlen(s);
    while (n > 0 && (s[n - 1] == ' ' || s[n - 1] == '\t' ||
                     s[n - 1] == '\n' || s[n - 1] == '\r'))
        s[--n] = '\0';
    return s;
}

/* The shared credentials file's profile: RATE_OK with both keys found,
 * RATE_ENOTSUP when there is no such file or profile or key, with `why`
 * saying which. */
static int credentials_file(ddb_t *d, char *path, size_t plen,
                            const char **profile, char *why, size_t wl)
{
    const char *f = getenv("AWS_SHARED_CREDENTIALS_FILE");
    const char *home = getenv("HOME");
    *profile = getenv("AWS_PROFILE");
    if (*profile == NULL || **profile == '\0')
        *profile = "default";
    if (f != NULL && *f)
        snprintf(path, plen, "%s", f);
    else if (home != NULL && *home)
        snprintf(path, plen, "%s/.aws/credentials", home);
    else
        snprintf(path, plen, "~/.aws/credentials");
    FILE *fp = fopen(path, "r");
    if (fp == NULL) {
        snprintf(why, wl, "%s: %s", path, strerror(errno));
        return RATE_ENOTSUP;
    }
    char line[2048];
    bool in = false, found = false;
    while (fgets(line, sizeof line, fp) != NULL) {
        char *s = trim(line);
        if (*s == '#' || *s == ';' || *s == '\0')
            continue;
        if (*s == '[') {
            char *close = strchr(s, ']');
            if (close != NULL)
                *close = '\0';
            in = strcmp(trim(s + 1), *profile) == 0;
            found = found || in;
            continue;
        }
        char *eq = strchr(s, '=');
        if (!in || eq == NULL)
            continue;
        *eq = '\0';
        char *name = trim(s), *val = trim(eq + 1);
        char **dst = strcmp(name, "aws_access_key_id") == 0       ? &d->key_id
                     : strcmp(name, "aws_secret_access_key") == 0 ? &d->secret
                     : strcmp(name, "aws_session_token") == 0     ? &d->token
                                                                  : NULL;
        if (dst != NULL && *val) {
            free(*dst);
            *dst = strdup(val);
        }
    }
    bool failed = ferror(fp) != 0;
    int e = errno;
    fclose(fp);
    if (failed)
        snprintf(why, wl, "%s: %s", path, strerror(e));
    else if (!found)
        snprintf(why, wl, "%s has no profile [%s]", path, *profile);
    else if (d->key_id == NULL || d->secret == NULL)
        snprintf(why, wl, "profile [%s] of %s has no %s", *profile, path,
                 d->key_id == NULL ? "aws_access_key_id"
                                   : "aws_secret_access_key");
    return !failed && d->key_id != NULL && d->secret != NULL ? RATE_OK
                                                             : RATE_ENOTSUP;
}

static int credentials(ddb_t *d, const rate_dynamodb_options_t *o, char *err,
                       size_t errlen)
{
    const char *id = o->access_key_id, *secret = o->secret_access_key,
               *token = o->session_token;
    char env_half[96] = "", why[1200] = "";
    if (id == NULL && secret == NULL) {
        id = getenv("AWS_ACCESS_KEY_ID");
        secret = getenv("AWS_SECRET_ACCESS_KEY");
        token = getenv("AWS_SESSION_TOKEN");
        bool has_id = id != NULL && *id, has_secret = secret != NULL && *secret;
        if (has_id != has_secret) /* half a pair: said if the file fails */
            snprintf(env_half, sizeof env_half, "%s is set but %s is not; ",
                     has_id ? "AWS_ACCESS_KEY_ID" : "AWS_SECRET_ACCESS_KEY",
                     has_id ? "AWS_SECRET_ACCESS_KEY" : "AWS_ACCESS_KEY_ID");
        if (!has_id || !has_secret)
            id = secret = token = NULL;
    }
    if (id != NULL && secret != NULL && *id && *secret) {
        d->key_id = strdup(id);
        d->secret = strdup(secret);
        if (token != NULL && *token)
            d->token = strdup(token);
        if (d->key_id == NULL || d->secret == NULL ||
            (token != NULL && *token && d->token == NULL))
            return RATE_ENOMEM;
        return RATE_OK;
    }
    if (id != NULL || secret != NULL)
        return rate__fail(err, errlen, RATE_EINVAL,
                          "access_key_id and secret_access_key go together");
    char path[1024];
    const char *profile;
    if (credentials_file(d, path, sizeof path, &profile, why, sizeof why) ==
        RATE_OK)
        return RATE_OK;
    return rate__fail(err, errlen, RATE_EINVAL,
                      "no AWS credentials (%s%s): set AWS_ACCESS_KEY_ID and "
                      "AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN for "
                      "temporary ones), or give aws_access_key_id and "
                      "aws_secret_access_key in profile [%s] of %s "
                      "(AWS_SHARED_CREDENTIALS_FILE, AWS_PROFILE)",
                      env_half, why, profile, path);
}

static int make_headers(ddb_t *d)
{
    for (int i = 0; i < OP_COUNT; i++) {
        char target[96], tok[4096];
        struct curl_slist *l = NULL, *n;
        snprintf(target, sizeof target, "X-Amz-Target: DynamoDB_20120810.%s",
                 op_names[i]);
        n = curl_slist_append(l, "Content-Type: application/x-amz-json-1.0");
        if (n != NULL && (n = curl_slist_append(l = n, target)) != NULL)
            l = n;
        /* No "Expect:" to turn 100-continue off: curl 7.88 would sign
         * the header it then does not send (test_dynamodb catches it).
         * Its threshold is 1 MB, above any request of this store. */
        if (n != NULL && d->token != NULL) {
            if (strlen(d->token) > sizeof tok - 32)
                n = NULL;
            else {
                snprintf(tok, sizeof tok, "X-Amz-Security-Token: %s",
                         d->token);
                if ((n = curl_slist_append(l, tok)) != NULL)
                    l = n;
            }
        }
        if (n == NULL) {
            curl_slist_free_all(l);
            return RATE_ENOMEM;
        }
        d->headers[i] = l;
    }
    return RATE_OK;
}

static void sleep_ms(unsigned ms)
{
    struct timespec ts = {0, (long)ms * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

/* The table: DescribeTable, checked for the key schema (k, B, HASH);
 * created when missing and `create`, then waited for until ACTIVE and its
 * TTL set on `ttl`. */
static int open_table(ddb_t *d, bool create, char *err, size_t errlen)
{
    char type[96];
    json_t *reply = NULL;
    bool created = false;
    int rc;

    for (unsigned round = 0;; round++) {
        json_t *req = json_pack("{s:s}", "TableName", d->table);
        rc = request(d, OP_DESCRIBE, req, &reply, type, sizeof type);
        if (rc == RATE_ESTORE && strcmp(type, "ResourceNotFoundException") == 0 &&
            create && !created) {
            req = json_pack(
                "{s:s,s:[{s:s,s:s}],s:[{s:s,s:s}],s:s}", "TableName",
                d->table, "AttributeDefinitions", "AttributeName", "k",
                "AttributeType", "B", "KeySchema", "AttributeName", "k",
                "KeyType", "HASH", "BillingMode", "PAY_PER_REQUEST");
            rc = request(d, OP_CREATE, req, &reply, type, sizeof type);
            if (rc != RATE_OK && strcmp(type, "ResourceInUseException") != 0)
                break; /* another host creating it at once is fine */
            json_decref(reply);
            reply = NULL;
            created = true;
            continue;
        }
        if (rc != RATE_OK)
            break;
        json_t *t = json_object_get(reply, "Table");
        const char *status =
            json_string_value(json_object_get(t, "TableStatus"));
        json_t *ks = json_object_get(t, "KeySchema");
        json_t *ad = json_object_get(t, "AttributeDefinitions");
        const char *kname = json_string_value(
            json_object_get(json_array_get(ks, 0), "AttributeName"));
        const char *ktype = NULL;
        for (size_t i = 0; i < json_array_size(ad); i++) {
            json_t *a = json_array_get(ad, i);
            const char *n = json_string_value(json_object_get(a, "AttributeName"));
            if (n != NULL && kname != NULL && strcmp(n, kname) == 0)
                ktype = json_string_value(json_object_get(a, "AttributeType"));
        }
        if (json_array_size(ks) != 1 || kname == NULL ||
            strcmp(kname, "k") != 0 || ktype == NULL ||
            strcmp(ktype, "B") != 0) {
            json_decref(reply);
            return rate__fail(err, errlen, RATE_EINVAL,
                              "table '%s' has another key schema than this "
                              "store's (one partition key 'k' of type B, "
                              "no sort key): docs/dynamodb.md",
                              d->table);
        }
        bool active = status != NULL && strcmp(status, "ACTIVE") == 0;
        json_decref(reply);
        reply = NULL;
        if (active)
            break;
        if (round >= 1200) { /* 60 s */
            return rate__fail(err, errlen, RATE_ETIMEDOUT,
                              "table '%s' is still %s after 60 s", d->table,
                              status ? status : "not ACTIVE");
        }
        sleep_ms(50);
    }
    json_decref(reply);
    if (rc != RATE_OK) {
        char text[512];
        pthread_mutex_lock(&d->lock);
        snprintf(text, sizeof text, "%s", d->last_error);
        pthread_mutex_unlock(&d->lock);
        if (strcmp(type, "ResourceNotFoundException") == 0)
            return rate__fail(err, errlen, rc,
                              "table '%s' does not exist in %s (create it, "
                              "or ask the store to: create_table): %s",
                              d->table, d->region, text);
        return rate__fail(err, errlen, rc, "table '%s': %s", d->table, text);
    }
    if (created) {
        /* DynamoDB's TTL on the ttl attribute.  An implementation without
         * it (dynalite) loses nothing but the clean-up: expiry is in the
         * reading and in the condition. */
        json_t *req = json_pack("{s:s,s:{s:b,s:s}}", "TableName", d->table,
                                "TimeToLiveSpecification", "Enabled", 1,
                                "AttributeName", "ttl");
        rc = request(d, OP_TTL, req, &reply, type, sizeof type);
        json_decref(reply);
        if (rc != RATE_OK && strcmp(type, "UnknownOperationException") != 0 &&
            strcmp(type, "ValidationException") != 0)
            return rate__fail(err, errlen, rc,
                              "table '%s' created, but setting its TTL "
                              "failed: %s", d->table, d->last_error);
        if (rc != RATE_OK) /* tolerated: no failure of the store's to show */
            set_last_error(d, "%s", "");
    }
    return RATE_OK;
}

int rate_store_dynamodb_new(const char *url,
                            const rate_dynamodb_options_t *opt,
                            rate_store_t **out, char *err, size_t errlen)
{
    rate_dynamodb_options_t o = {0};
    ddb_t *d;
    int rc;

    if (out == NULL)
        return rate__fail(err, errlen, RATE_EINVAL, "out is NULL");
    *out = NULL;
    if (url == NULL)
        return rate__fail(err, errlen, RATE_EINVAL,
                          "the DynamoDB URL is NULL");
    if (opt != NULL)
        o = *opt;
    if (!RATE__RESERVED_ZERO(&o))
        return rate__fail(err, errlen, RATE_EINVAL, "the options' reserved "
                          "words are not zero (a field of a later version?)");
    if (o.prefix_len > PREFIX_MAX || (o.prefix_len > 0 && o.prefix == NULL))
        return rate__fail(err, errlen, RATE_EINVAL,
                          "prefix: at most %u bytes, not NULL with a length",
                          PREFIX_MAX);
    if (o.connect_timeout_ns > RATE_TIME_MAX ||
        o.request_timeout_ns > RATE_TIME_MAX ||
        o.safety_ttl_ns > RATE_TIME_MAX)
        return rate__fail(err, errlen, RATE_EINVAL,
                          "a timeout or safety_ttl_ns above 2^63-1 ns");
    pthread_once(&curl_once, curl_init);
    if (curl_init_rc != CURLE_OK)
        return rate__fail(err, errlen, RATE_ESTORE,
                          "curl_global_init failed: %s",
                          curl_easy_strerror(curl_init_rc));
    if ((d = calloc(1, sizeof *d)) == NULL)
        return RATE_ENOMEM;
    pthread_mutex_init(&d->lock, NULL);
    if ((rc = parse_url(d, url, err, errlen)) != RATE_OK ||
        (rc = credentials(d, &o, err, errlen)) != RATE_OK ||
        (rc = make_headers(d)) != RATE_OK) {
        d_destroy(d);
        return rc;
    }
    if (o.prefix_len > 0) {
        if ((d->prefix = malloc(o.prefix_len)) == NULL) {
            d_destroy(d);
            return RATE_ENOMEM;
        }
        memcpy(d->prefix, o.prefix, o.prefix_len);
        d->prefix_len = o.prefix_len;
    }
    uint64_t cms = o.connect_timeout_ns ? (o.connect_timeout_ns + 999999) / 1000000 : 1000;
    uint64_t rms = o.request_timeout_ns ? (o.request_timeout_ns + 999999) / 1000000 : 2000;
    d->connect_ms = cms > 86400000 ? 86400000L : (long)cms;
    d->request_ms = rms > 86400000 ? 86400000L : (long)rms;
    d->request_ns = (uint64_t)d->request_ms * 1000000;
    d->ttl = !o.no_ttl;
    if (o.no_ttl && o.safety_ttl_ns != 0)
        d->safety_s = (o.safety_ttl_ns + RATE_NS_PER_S - 1) / RATE_NS_PER_S;
    d->wall_clock = !o.client_time;
    /* What the item holds besides the state: the names (k s v e ttl), the
     * key (prefix, space, key bytes) and three numbers of up to 21
     * digits, with room to spare. */
    d->state_max = ITEM_MAX - (d->prefix_len + 1 + RATE_KEY_MAX) - 9 - 3 * 21 -
                   64;
    atomic_init(&d->requests, 0);
    if ((rc = open_table(d, o.create_table, err, errlen)) != RATE_OK) {
        d_destroy(d);
        return rc;
    }
    atomic_store(&d->requests, 0);
    atomic_store(&d->errors, 0);
    atomic_store(&d->throttled, 0);
    if ((rc = rate_store_new(&ddb_methods, d, out)) != RATE_OK)
        d_destroy(d);
    return rc;
}

int rate_store_dynamodb_counters(rate_store_t *store,
                                 rate_dynamodb_counters_t *out)
{
    ddb_t *d = rate_store_backend(store, &ddb_methods);
    if (d == NULL || out == NULL)
        return RATE_EINVAL;
    out->requests = atomic_load(&d->requests);
    out->reads = atomic_load(&d->reads);
    out->writes = atomic_load(&d->writes);
    out->deletes = atomic_load(&d->deletes);
    out->conflicts = atomic_load(&d->conflicts);
    out->throttled = atomic_load(&d->throttled);
    out->errors = atomic_load(&d->errors);
    return RATE_OK;
}

size_t rate_store_dynamodb_last_error(rate_store_t *store, char *buf,
                                      size_t len)
{
    ddb_t *d = rate_store_backend(store, &ddb_methods);
    if (d == NULL) {
        if (buf != NULL && len > 0)
            buf[0] = '\0';
        return 0;
    }
    pthread_mutex_lock(&d->lock);
    size_t n = strlen(d->last_error);
    if (buf != NULL && len > 0)
        snprintf(buf, len, "%s", d->last_error);
    pthread_mutex_unlock(&d->lock);
    return n;
}

/* Deletes every item whose k starts with the prefix: a Scan, page by page,
 * and one DeleteItem for each. */
int rate_store_dynamodb_drop(rate_store_t *store)
{
    ddb_t *d = rate_store_backend(store, &ddb_methods);
    json_t *start = NULL;
    int rc = RATE_OK;

    if (d == NULL)
        return RATE_EINVAL;
    if (d->prefix_len == 0)
        return RATE_EINVAL; /* the whole table: not this call's to drop */
    size_t plen;
    char *p = b64_encode(d->prefix, d->prefix_len, &plen);
    if (p == NULL)
        return RATE_ENOMEM;
    do {
        json_t *reply = NULL;
        json_t *req = json_pack("{s:s,s:s,s:s,s:{s:{s:s%}},s:b}", "TableName",
                                d->table, "ProjectionExpression", "k",
                                "FilterExpression", "begins_with(k, :p)",
                                "ExpressionAttributeValues", ":p", "B", p,
                                plen, "ConsistentRead", 1);
        if (req != NULL && start != NULL)
            json_object_set_new(req, "ExclusiveStartKey", start);
        else
            json_decref(start);
        start = NULL;
        if ((rc = request(d, OP_SCAN, req, &reply, NULL, 0)) != RATE_OK)
            break;
        json_t *items = json_object_get(reply, "Items");
        for (size_t i = 0; i < json_array_size(items) && rc == RATE_OK; i++) {
            json_t *k = json_object_get(json_array_get(items, i), "k");
            json_t *del = json_pack("{s:s,s:{s:O}}", "TableName", d->table,
                                    "Key", "k", k);
            json_t *r2 = NULL;
            if (k == NULL)
                continue;
            rc = request(d, OP_DELETE, del, &r2, NULL, 0);
            json_decref(r2);
        }
        json_t *last = json_object_get(reply, "LastEvaluatedKey");
        if (last != NULL)
            start = json_incref(last);
        json_decref(reply);
    } while (rc == RATE_OK && start != NULL);
    json_decref(start);
    free(p);
    return rc;
}
