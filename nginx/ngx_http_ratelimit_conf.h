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
#include <ratelimit_shm.h>

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

/* After a zone directive's parameters: timeout= and prefix= only with a
 * Redis store, and a shared-memory parameter (shm_only, NULL: none) only
 * without one.  NGX_OK, or NGX_ERROR (logged). */
ngx_int_t ngx_http_ratelimit_store_check(ngx_conf_t *cf, const char *directive,
                                         ngx_str_t *name,
                                         ngx_http_ratelimit_store_args_t *a,
                                         ngx_str_t *shm_only);

/* A new shared zone of `size` bytes for a zone directive, its init and
 * data set; a name declared already is refused.  The zone, or NULL
 * (logged). */
ngx_shm_zone_t *ngx_http_ratelimit_shm_add(ngx_conf_t *cf,
                                           const char *directive,
                                           ngx_str_t *name, size_t size,
                                           void *tag, ngx_shm_zone_init_pt init,
                                           void *data);

/* In a shared zone's init (the master's, at start and at each reload):
 * the shared-memory store's region, alloc bytes from the zone's slab
 * pool (the store's region_size first), made and initialized, or, when
 * the zone is kept over a reload (old_data or the memory exists), the one
 * there, attached to and checked.  *region, and *made: whether it is new.
 * NGX_OK, or NGX_ERROR (logged, naming the directive and zone). */
ngx_int_t ngx_http_ratelimit_shm_region(ngx_shm_zone_t *shm_zone,
                                        void *old_data, const char *directive,
                                        ngx_str_t *name,
                                        const rate_shm_options_t *options,
                                        size_t region_size, size_t alloc,
                                        void **region, ngx_flag_t *made);

/* Slots as nginx's ngx_conf_set_num_slot and ngx_conf_set_enum_slot
 * (cmd->offset into conf, an ngx_uint_t left NGX_CONF_UNSET_UINT), whose
 * errors name the directive: nginx's own say only "value must be between
 * 400 and 599" or "invalid value". The status slot takes 400 to 599; the
 * enum slot's cmd->post is its ngx_conf_enum_t list. */
char *ngx_http_ratelimit_status_slot(ngx_conf_t *cf, ngx_command_t *cmd,
                                     void *conf);
char *ngx_http_ratelimit_enum_slot(ngx_conf_t *cf, ngx_command_t *cmd,
                                   void *conf);

#endif /* NGX_HTTP_RATELIMIT_CONF_H */
