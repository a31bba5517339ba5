/* SPDX-License-Identifier: MIT */
/*
 * What the two modules' zone directives share (ngx_http_ratelimit_conf.c):
 * the store parameters of a zone (store=, timeout=, prefix=) and a Redis
 * store's URL and options, checked at configuration; a URL's password
 * masked for logs; a parameter given twice; whole numbers.
 */
#ifndef NGX_HTTP_RATELIMIT_CONF_H
#define NGX_HTTP_RATELIMIT_CONF_H

#include <ngx_config.h>
#include <ngx_core.h>

#include <ratelimit_redis.h>

/* A zone's Redis store: its URL (NUL-terminated; NULL: the zone is in
 * shared memory), the same with its password masked, for logs, and the
 * options every worker's store is made with. */
typedef struct {
    char *url;
    char *url_log;
    rate_redis_options_t options;
} ngx_http_ratelimit_redis_t;

/* A zone directive's store parameters, as given. */
typedef struct {
    ngx_str_t url;       /* store=redis://...; empty: shared memory */
    ngx_str_t prefix;    /* prefix=; empty: "ratelimit:NAME:" */
    uint64_t timeout_ns; /* timeout=; 0: 100 ms */
} ngx_http_ratelimit_store_args_t;

ngx_int_t ngx_http_ratelimit_parse_uint(ngx_str_t *v, uint64_t *out);

/* url as it may be logged: a password masked as "***"; in the pool, NULL
 * without memory. */
char *ngx_http_ratelimit_mask_url(ngx_pool_t *pool, const u_char *url,
                                  size_t len);

/* Copies msg into buf (cap bytes), the store's URL in it masked. */
void ngx_http_ratelimit_mask_msg(const ngx_http_ratelimit_redis_t *r,
                                 const char *msg, char *buf, size_t cap);

/* Whether value[i] names a parameter (NAME=) already given among
 * value[first..i): then logged, naming the directive and the zone, and
 * NGX_ERROR; else NGX_OK. */
ngx_int_t ngx_http_ratelimit_param_twice(ngx_conf_t *cf, const char *directive,
                                         ngx_str_t *value, ngx_uint_t first,
                                         ngx_uint_t i);

/* Takes value[i] into *a if it is store=, timeout= or prefix=: NGX_OK;
 * NGX_DECLINED when it is none of them; NGX_ERROR (logged) when it is a
 * bad one.  value[1] is the zone's name. */
ngx_int_t ngx_http_ratelimit_store_param(ngx_conf_t *cf, const char *directive,
                                         ngx_str_t *value, ngx_uint_t i,
                                         ngx_http_ratelimit_store_args_t *a);

/* A Redis zone's URL and options from *a, checked now (by a store made
 * lazily, which does not connect) so that nginx -t names a bad URL; the
 * store itself is each worker's.  NGX_OK, or NGX_ERROR (logged). */
ngx_int_t ngx_http_ratelimit_redis_conf(ngx_conf_t *cf, const char *directive,
                                        ngx_str_t *name,
                                        ngx_http_ratelimit_store_args_t *a,
                                        ngx_http_ratelimit_redis_t *out);

#endif /* NGX_HTTP_RATELIMIT_CONF_H */
