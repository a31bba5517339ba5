/* SPDX-License-Identifier: MIT */
/*
 * Refunds on a worker's Redis zones, made by a thread of the worker's own
 * (ngx_http_ratelimit_refund.c, docs/nginx.md): a refund is a synchronous
 * call of the library's (a blocking round trip or more), which the
 * worker's event loop must not wait for.  The loop posts it and goes on.
 */
#ifndef NGX_HTTP_RATELIMIT_REFUND_H
#define NGX_HTTP_RATELIMIT_REFUND_H

#include <stddef.h>
#include <stdint.h>

#include <ratelimit.h>

/* Refunds not yet made, past which a post is refused. */
#define NGX_HTTP_RATELIMIT_REFUND_QUEUE 4096

/* A Redis zone, as the refund thread makes its own store and limiters of
 * it. */
typedef struct {
    const char *url;                     /* borrowed: must outlive the thread */
    const rate_redis_options_t *options; /* borrowed; lazy_connect forced */
    const rate_policy_t *policy;         /* borrowed, read only */
    const rate_clock_t *clock;           /* the limiters' clock, or NULL */
} ngx_http_ratelimit_refund_zone_t;

typedef struct ngx_http_ratelimit_refund_s ngx_http_ratelimit_refund_t;

/* Starts the thread for n Redis zones (t: each zone's URL, options,
 * policy and clock, borrowed until stop; zone i of a post is t[i]).  Each
 * zone's synchronous store (lazy_connect) and its two limiters (enforced
 * and shadow state) are the thread's, made at its first refund.  The thread
 * blocks every signal.  NULL when it cannot start.  Thread: the worker's. */
ngx_http_ratelimit_refund_t *
ngx_http_ratelimit_refund_start(const ngx_http_ratelimit_refund_zone_t *t,
                                size_t n);

/* Queues a refund of one permit on zone i's key (copied; at most
 * RATE_KEY_MAX bytes), of the shadow state if shadow.  0, or -1 (refused:
 * the queue is full, no memory, a bad argument): the permit then stays
 * charged.  Thread: the worker's. */
int ngx_http_ratelimit_refund_post(ngx_http_ratelimit_refund_t *rf, size_t i,
                                   int shadow, const void *key, size_t len);

/* Stops the thread: the refund under way is finished (bounded by the
 * zone's timeouts), those still queued are dropped; joins and frees
 * everything, after setting the refunds made, failed (the store's error)
 * and dropped (refused by post, or still queued).  NULL: nothing.
 * Thread: the worker's. */
void ngx_http_ratelimit_refund_stop(ngx_http_ratelimit_refund_t *rf,
                                    uint64_t *made, uint64_t *failed,
                                    uint64_t *dropped);

#endif /* NGX_HTTP_RATELIMIT_REFUND_H */
