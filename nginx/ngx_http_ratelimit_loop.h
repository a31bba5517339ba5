/* SPDX-License-Identifier: MIT */
/*
 * The worker's rate_loop_t over nginx's event loop (ngx_event), which the
 * asynchronous Redis store of a store=redis:// zone is driven by
 * (ngx_http_ratelimit_loop.c, docs/nginx.md).
 */
#ifndef NGX_HTTP_RATELIMIT_LOOP_H
#define NGX_HTTP_RATELIMIT_LOOP_H

#include <ngx_config.h>
#include <ngx_core.h>

#include <ratelimit_loop.h>

/* Fills *loop for the calling worker's event loop; log is the one its
 * watches and timers log to (the cycle's), and must outlive every store
 * made over the loop.  Thread: the worker's (its only one). */
void ngx_http_ratelimit_loop_init(rate_loop_t *loop, ngx_log_t *log);

#endif /* NGX_HTTP_RATELIMIT_LOOP_H */
