/* SPDX-License-Identifier: MIT */
/*
 * The fair zones of ngx_http_ratelimit_module (ngx_http_ratelimit_fair.h):
 * their table's room in the zone, its making in the master, the workers'
 * fair limits on it, a request's weight and its decision.  The rate
 * module keeps the zone and its limiters; this file only what a fair
 * zone adds to them.
 */
#include "ngx_http_ratelimit_fair.h"

size_t ngx_http_ratelimit_fair_zone_size(ngx_http_ratelimit_fair_t *fz) {
    fz->size = fz->on ? rate_fair_size(0, 0) : 0;
    return fz->size + fz->size / 128 + (fz->on ? 64 : 0);
}

ngx_int_t ngx_http_ratelimit_fair_init_zone(ngx_http_ratelimit_fair_t *fz,
                                            void *mem, ngx_flag_t made,
                                            ngx_str_t *name, ngx_log_t *log) {
    char err[256];
    int rc;

    if (!fz->on) {
        return NGX_OK;
    }
    fz->mem = mem;
    if (!made) {
        return NGX_OK; /* the table kept from before the reload */
    }
    rc = rate_fair_init_in(fz->mem, fz->size, 0, 0, err, sizeof(err));
    if (rc != RATE_OK) {
        ngx_log_error(NGX_LOG_EMERG, log, 0,
                      "ratelimit_zone \"%V\": the fair table: %s: %s", name,
                      rate_err_name(rc), err);
        return NGX_ERROR;
    }
    return NGX_OK;
}

void ngx_http_ratelimit_fair_attach(ngx_http_ratelimit_fair_t *fz,
                                    rate_limiter_t *limiter[2][2],
                                    ngx_str_t *name, ngx_log_t *log) {
    rate_fair_config_t fc;
    char err[256];
    ngx_uint_t s, f;
    int rc;

    for (s = 0; s < 2; s++) {
        for (f = 0; f < 2; f++) {
            fz->limit[s][f] = NULL;
            if (limiter[s][f] == NULL) {
                continue;
            }
            ngx_memzero(&fc, sizeof(fc));
            fc.limiter = limiter[s][f];
            fc.key = (const char *)name->data;
            fc.key_len = name->len;
            err[0] = '\0';
            rc = rate_fair_new_in(&fc, fz->mem, fz->size, &fz->limit[s][f],
                                  err, sizeof(err));
            if (rc != RATE_OK) {
                ngx_log_error(NGX_LOG_ALERT, log, 0,
                              "ratelimit_zone \"%V\": cannot attach to the "
                              "fair table: %s: %s",
                              name, rate_err_name(rc), err);
            }
        }
    }
}

void ngx_http_ratelimit_fair_detach(ngx_http_ratelimit_fair_t *fz) {
    ngx_uint_t s, f;

    for (s = 0; s < 2; s++) {
        for (f = 0; f < 2; f++) {
            rate_fair_free(fz->limit[s][f]);
            fz->limit[s][f] = NULL;
        }
    }
}

char *ngx_http_ratelimit_fair_weight_conf(ngx_conf_t *cf, ngx_str_t *w,
                                          ngx_http_complex_value_t **weight) {
    ngx_http_compile_complex_value_t ccv;

    *weight = ngx_pcalloc(cf->pool, sizeof(**weight));
    if (*weight == NULL) {
        return NGX_CONF_ERROR;
    }
    ngx_memzero(&ccv, sizeof(ccv));
    ccv.cf = cf;
    ccv.value = w;
    ccv.complex_value = *weight;
    if (ngx_http_compile_complex_value(&ccv) != NGX_OK) {
        return NGX_CONF_ERROR;
    }
    return NGX_CONF_OK;
}

/* A request's weight: the value's, a whole number from 1 to
 * RATE_FAIR_WEIGHT_MAX; empty, missing or anything else weighs 1. */
static uint32_t ngx_http_ratelimit_fair_weight(ngx_http_request_t *r,
                                               ngx_http_complex_value_t *cv) {
    ngx_str_t v;
    ngx_int_t n;

    if (cv == NULL || ngx_http_complex_value(r, cv, &v) != NGX_OK ||
        v.len == 0) {
        return 1;
    }
    n = ngx_atoi(v.data, v.len);
    return n >= 1 && n <= (ngx_int_t)RATE_FAIR_WEIGHT_MAX ? (uint32_t)n : 1;
}

int ngx_http_ratelimit_fair_check(ngx_http_request_t *r,
                                  ngx_http_ratelimit_fair_t *fz,
                                  ngx_flag_t shadow, ngx_uint_t fail_open,
                                  ngx_str_t *key,
                                  ngx_http_complex_value_t *weight,
                                  rate_decision_t *d) {
    rate_fair_t *fl = fz->limit[shadow ? 1 : 0][fail_open];

    if (fl == NULL) {
        return RATE_ESTORE;
    }
    return rate_fair_check(fl, (const char *)key->data, key->len,
                           ngx_http_ratelimit_fair_weight(r, weight), 1, d);
}
