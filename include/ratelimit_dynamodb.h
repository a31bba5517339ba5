/* SPDX-License-Identifier: MIT */
/*
 * ratelimit_dynamodb.h -- the DynamoDB store (docs/dynamodb.md):
 * conditional writes over HTTP.  In the library when it is built with
 * RATE_WITH_DYNAMODB (the default).
 */
#ifndef RATELIMIT_DYNAMODB_H
#define RATELIMIT_DYNAMODB_H

#include "ratelimit.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct rate_dynamodb_options {
    uint64_t connect_timeout_ns; /* 0: 1 s */
    uint64_t request_timeout_ns; /* 0: 2 s: a decision's (a refund's,
                                    a penalty's) requests together, the
                                    GetItem, the PutItem and a conflict's
                                    retries, connecting included: each
                                    gets what is left; past it,
                                    RATE_ETIMEDOUT */
    const char *prefix;          /* bytes before every key's in the
                                    partition key (a namespace); copied */
    size_t prefix_len;           /* 0..1024 */
    bool create_table;           /* create the table when it is missing
                                    (on-demand billing, the key schema of
                                    docs/dynamodb.md, TTL on `ttl`), and
                                    wait until it is ACTIVE */
    bool no_ttl;                 /* write no expiry (replays on a virtual
                                    clock); default: each item expires
                                    after its reset_after, by the wall
                                    clock */
    uint64_t safety_ttl_ns;      /* with no_ttl: 0 (default) writes no
                                    TTL attribute either; else each state
                                    and shadow state written gets the TTL
                                    attribute at the wall clock plus this
                                    (DynamoDB deletes the item some time
                                    after it), but no expiry of the
                                    reading, so answers stay those of the
                                    caller's clock: the clean-up of a
                                    namespace left behind.  Policy records
                                    get none.  Ignored without no_ttl */
    bool client_time;            /* decide on the limiter's clock (by
                                    default CLOCK_MONOTONIC: one host
                                    only); default: on the wall clock
                                    (CLOCK_REALTIME), which hosts share */
    /* Credentials: both NULL: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY
     * and AWS_SESSION_TOKEN, else the profile AWS_PROFILE ("default") of
     * the shared credentials file (AWS_SHARED_CREDENTIALS_FILE, else
     * ~/.aws/credentials).  Copied. */
    const char *access_key_id;
    const char *secret_access_key;
    const char *session_token; /* NULL: none */
    uint64_t reserved[8]; /* zero (= {...} or memset): room for later
                               fields; non-zero is RATE_EINVAL */
} rate_dynamodb_options_t;

/* The DynamoDB store: url is
 *   dynamodb://TABLE?region=REGION[&endpoint=http(s)://HOST[:PORT]]
 * (the endpoint defaults to https://dynamodb.REGION.amazonaws.com/).
 * Each key is one item of TABLE (docs/dynamodb.md: the key schema,
 * consistency, time and skew, TTL, costs).  Decisions are the memory
 * store's, bit for bit, over the generic contract: a consistent GetItem,
 * then a PutItem conditioned on the item's version, retried by the
 * limiter on a conflict.  The store's clock is the wall clock (unless
 * client_time); an item whose expiry has passed reads as absent.  A
 * policy whose states could outgrow an item (long sliding logs) is
 * refused when it is set (RATE_EPOLICY from rate_limiter_new and
 * rate_limiter_set_policy; rate_store_check_policy says why).  Failures
 * (throttling, a 5xx, a timeout, bad credentials) are store errors under
 * the limiter's fail mode; rate_store_dynamodb_last_error gives the
 * service's message.  Checks the table once here (DescribeTable), so that
 * a missing table, a wrong key schema or an unreachable endpoint is
 * reported now.  `options` may be NULL (every option its default).
 *
 * Returns: RATE_OK with the store in *out.
 *
 * Errors (with `err`, if not NULL, errlen bytes with the NUL, saying why;
 * *out is NULL):
 *   RATE_EINVAL    NULL url or out, a malformed URL (not dynamodb://, a
 *                  bad table name, no region, an unknown parameter, an
 *                  endpoint not http(s)://), a bad option (non-zero
 *                  reserved words, a prefix_len above 1024 or with a NULL
 *                  prefix, a timeout or safety_ttl_ns above
 *                  RATE_TIME_MAX, access_key_id without secret_access_key
 *                  or the other way round), no credentials, a table of
 *                  another key schema
 *   RATE_ESTORE    the endpoint unreachable or refusing (the service's
 *                  message: a missing table, bad credentials, ...); libcurl
 *                  that cannot be initialized
 *   RATE_ETIMEDOUT no answer in time, or a new table not ACTIVE in 60 s
 *   RATE_ECORRUPT  an answer that is not JSON
 *   RATE_ENOMEM
 *
 * Ownership: url and options are read during the call; the prefix and the
 * credentials are copied; err is the caller's.  The caller frees *out
 * with rate_store_free.
 *
 * Thread-safe: yes (callers take connections from a pool, one each per
 * request). */
RATE_API int rate_store_dynamodb_new(const char *url,
                                     const rate_dynamodb_options_t *options,
                                     rate_store_t **out, char *err,
                                     size_t errlen);

/* Deletes every item of the DynamoDB store's prefix (a Scan of the table,
 * then one DeleteItem each): how a scratch namespace is removed.
 *
 * Returns: RATE_OK once every page of the Scan is deleted.
 *
 * Errors: RATE_EINVAL for a NULL store, one that is not a DynamoDB store,
 * or one with no prefix (the whole table is not this call's to drop);
 * RATE_ENOMEM; the store's error (RATE_ESTORE, RATE_ETIMEDOUT,
 * RATE_ECORRUPT for an answer that is not the JSON of a Scan) when a
 * request fails (the items deleted so far stay deleted).
 *
 * Ownership: store is borrowed; nothing is kept.
 *
 * Thread-safe: yes. */
RATE_API int rate_store_dynamodb_drop(rate_store_t *store);

/* What a DynamoDB store has sent since rate_store_dynamodb_new returned
 * (the creation's own requests, DescribeTable and CreateTable, are not
 * counted). */
typedef struct rate_dynamodb_counters {
    uint64_t requests;  /* HTTP requests: the round trips */
    uint64_t reads;     /* GetItem (load) */
    uint64_t writes;    /* PutItem (cas) */
    uint64_t deletes;   /* DeleteItem (remove, drop) */
    uint64_t conflicts; /* conditional writes refused
                           (ConditionalCheckFailedException): each one a
                           retry of the limiter's */
    uint64_t throttled; /* throttling errors (ProvisionedThroughputExceeded,
                           Throttling, RequestLimitExceeded) */
    uint64_t errors;    /* other failed requests */
    uint64_t reserved[8]; /* room for later fields; not read */
} rate_dynamodb_counters_t;

/* Reads what a DynamoDB store has sent (rate_dynamodb_counters_t).
 *
 * Returns: RATE_OK with *out's counters filled (its reserved words are
 * not written).
 *
 * Errors: RATE_EINVAL for a NULL out, or a NULL store or one that is not
 * a DynamoDB store.
 *
 * Ownership: store is borrowed; *out is the caller's; nothing is kept.
 *
 * Thread-safe: yes (each counter is read atomically, not all together). */
RATE_API int rate_store_dynamodb_counters(rate_store_t *store,
                                          rate_dynamodb_counters_t *out);

/* Tells the last failure of a request of the store (the store's last,
 * whichever thread it failed on), as one line naming the operation and
 * carrying the service's own type and message ("GetItem: HTTP 400
 * ResourceNotFoundException: Requested resource not found"), or the
 * transport's ("GetItem on http://...: Timeout was reached"); "" if none.
 *
 * Returns: the text's whole length (as snprintf, so a result >= len means
 * it was cut), with the text written into buf (len bytes with the NUL,
 * cut to fit; len may be 0, or buf NULL: then nothing is written).
 *
 * Errors: none; a NULL store or one that is not a DynamoDB store gives ""
 * and 0.
 *
 * Ownership: store is borrowed; buf is the caller's; nothing is kept.
 *
 * Thread-safe: yes. */
RATE_API size_t rate_store_dynamodb_last_error(rate_store_t *store,
                                               char *buf, size_t len);

#ifdef __cplusplus
}
#endif
#endif /* RATELIMIT_DYNAMODB_H */
