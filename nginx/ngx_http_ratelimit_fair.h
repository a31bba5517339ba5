/* SPDX-License-Identifier: MIT */
/*
 * A fair zone of ngx_http_ratelimit_module (ngx_http_ratelimit_fair.c;
 * `ratelimit_zone ... fair`, docs/nginx.md): the zone's one limit, whose
 * key is the zone's name, divided fairly among the requests' keys
 * (docs/fair.md).  Its table follows the store's region in the zone;
 * each worker attaches one fair limit to each of the zone's limiters.
 */
#ifndef NGX_HTTP_RATELIMIT_FAIR_H
#define NGX_HTTP_RATELIMIT_FAIR_H

#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include <ratelimit.h>
#include <ratelimit_fair.h>

typedef struct {
    ngx_flag_t on;            /* the zone is fair */
    size_t size;              /* its table's bytes (0: not fair) */
    void *mem;                /* the table, in the zone */
    rate_fair_t *limit[2][2]; /* per worker: [shadow][fail open] */
} ngx_http_ratelimit_fair_t;

/* The bytes a fair zone adds to its zone (nothing when it is not fair):
 * its table, 64-byte aligned, and the slab pool's pages for it.  Sets
 * fz->size. */
size_t ngx_http_ratelimit_fair_zone_size(ngx_http_ratelimit_fair_t *fz);

/* The zone's init, in the master: the table at mem (after the store's
 * region), made when the zone was just made (made), else kept from
 * before the reload.  NGX_ERROR, logged, when it cannot be made. */
ngx_int_t ngx_http_ratelimit_fair_init_zone(ngx_http_ratelimit_fair_t *fz,
                                            void *mem, ngx_flag_t made,
                                            ngx_str_t *name, ngx_log_t *log);

/* A worker's fair limits, one per limiter (a NULL limiter gets none),
 * the shared limit's key the zone's name; a failure is logged and leaves
 * that fair limit NULL.  And their freeing, at the worker's exit. */
void ngx_http_ratelimit_fair_attach(ngx_http_ratelimit_fair_t *fz,
                                    rate_limiter_t *limiter[2][2],
                                    ngx_str_t *name, ngx_log_t *log);
void ngx_http_ratelimit_fair_detach(ngx_http_ratelimit_fair_t *fz);

/* weight=VALUE of a `ratelimit` directive (w: the value), compiled into
 * *weight.  NGX_CONF_ERROR without memory or for a bad value. */
char *ngx_http_ratelimit_fair_weight_conf(ngx_conf_t *cf, ngx_str_t *w,
                                          ngx_http_complex_value_t **weight);

/* A request's fair decision of one permit for key, of the weight the
 * compiled value gives (NULL: 1), by the fair limit of the location's
 * shadow and fail-open settings: rate_fair_check's status, RATE_ESTORE
 * when that fair limit could not be attached. */
int ngx_http_ratelimit_fair_check(ngx_http_request_t *r,
                                  ngx_http_ratelimit_fair_t *fz,
                                  ngx_flag_t shadow, ngx_uint_t fail_open,
                                  ngx_str_t *key,
                                  ngx_http_complex_value_t *weight,
                                  rate_decision_t *d);

#endif
