/* SPDX-License-Identifier: MIT */
/*
 * Whether each Redis of a worker's store=redis:// zones answers, found out
 * by a thread of the worker's own (ngx_http_ratelimit_probe.c,
 * docs/nginx.md), so that the worker's event loop never waits for a Redis
 * that does not answer: the loop makes a zone's asynchronous store and
 * limiters (whose creation and first lookup of the policy's record are
 * synchronous) only once its Redis has answered the thread.
 */
#ifndef NGX_HTTP_RATELIMIT_PROBE_H
#define NGX_HTTP_RATELIMIT_PROBE_H

#include <stddef.h>
#include <stdint.h>

#include <ratelimit.h>

typedef struct {
    const char *url;                     /* borrowed: must outlive the probe */
    const rate_redis_options_t *options; /* borrowed; lazy_connect ignored */
    const rate_policy_t *policy;         /* borrowed, read only */
    const rate_clock_t *clock;           /* the limiters' clock, or NULL */
} ngx_http_ratelimit_probe_target_t;

typedef struct ngx_http_ratelimit_probe_s ngx_http_ratelimit_probe_t;

/* Starts the thread: for each target until it answers, a synchronous
 * Redis store made connecting (rate_store_redis_new without lazy_connect)
 * and a limiter of the policy on it (which writes the policy's record),
 * then both freed; tried again no more often than a backoff from 50 ms
 * doubling to 1 s.  The thread blocks no signal of the worker's (it blocks
 * them all).  NULL when it cannot start (no memory, no thread).
 * Thread: the worker's. */
ngx_http_ratelimit_probe_t *
ngx_http_ratelimit_probe_start(const ngx_http_ratelimit_probe_target_t *t,
                               size_t n);

/* Whether target i has answered (once it has, always).  Thread-safe. */
int ngx_http_ratelimit_probe_done(ngx_http_ratelimit_probe_t *p, size_t i);

/* Waits until every target has answered, or ns passed: whether all have.
 * Thread: the worker's. */
int ngx_http_ratelimit_probe_wait(ngx_http_ratelimit_probe_t *p, uint64_t ns);

/* Stops the thread (it finishes the try under way, bounded by that
 * target's timeouts), joins and frees it.  NULL: nothing.
 * Thread: the worker's. */
void ngx_http_ratelimit_probe_stop(ngx_http_ratelimit_probe_t *p);

#endif /* NGX_HTTP_RATELIMIT_PROBE_H */
