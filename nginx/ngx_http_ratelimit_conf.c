/* SPDX-License-Identifier: MIT */
/*
 * The zone directives' shared parts (ngx_http_ratelimit_conf.h): both
 * ratelimit_zone (ngx_http_ratelimit_module.c) and ratelimit_inflight_zone
 * (ngx_http_ratelimit_inflight_module.c) take a store=redis:// URL with
 * timeout= and prefix=, checked here the same way for both.
 */
#include <ngx_config.h>
#include <ngx_core.h>

#include <ratelimit.h>
#include <ratelimit_redis.h>
#include <ratelimit_shm.h>

#include "ngx_http_ratelimit_conf.h"

ngx_int_t ngx_http_ratelimit_parse_uint(ngx_str_t *v, uint64_t *out) {
    ngx_int_t n;

    if (v->len == 0) {
        return NGX_ERROR;
    }
    n = ngx_atoi(v->data, v->len);
    if (n == NGX_ERROR || n <= 0) {
        return NGX_ERROR;
    }
    *out = (uint64_t)n;
    return NGX_OK;
}

char *ngx_http_ratelimit_status_slot(ngx_conf_t *cf, ngx_command_t *cmd,
                                     void *conf) {
    ngx_uint_t *field = (ngx_uint_t *)((char *)conf + cmd->offset);
    ngx_str_t *value = cf->args->elts;
    ngx_int_t n;

    if (*field != NGX_CONF_UNSET_UINT) {
        return "is duplicate";
    }
    n = ngx_atoi(value[1].data, value[1].len);
    if (n < 400 || n > 599) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "%V: \"%V\" is not a status from 400 to 599",
                           &cmd->name, &value[1]);
        return NGX_CONF_ERROR;
    }
    *field = (ngx_uint_t)n;
    return NGX_CONF_OK;
}

char *ngx_http_ratelimit_enum_slot(ngx_conf_t *cf, ngx_command_t *cmd,
                                   void *conf) {
    ngx_uint_t *field = (ngx_uint_t *)((char *)conf + cmd->offset);
    ngx_conf_enum_t *e = cmd->post;
    ngx_str_t *value = cf->args->elts;
    u_char names[128], *p = names, *end = names + sizeof(names);
    ngx_uint_t i;

    if (*field != NGX_CONF_UNSET_UINT) {
        return "is duplicate";
    }
    for (i = 0; e[i].name.len != 0; i++) {
        if (e[i].name.len == value[1].len &&
            ngx_strncasecmp(e[i].name.data, value[1].data, value[1].len) ==
                0) {
            *field = e[i].value;
            return NGX_CONF_OK;
        }
        p = ngx_slprintf(p, end, "%s%V", i == 0 ? "" : ", ", &e[i].name);
    }
    ngx_conf_log_error(NGX_LOG_EMERG, cf, 0, "%V: \"%V\" is none of %*s",
                       &cmd->name, &value[1], (size_t)(p - names), names);
    return NGX_CONF_ERROR;
}

/* url (len bytes) as it may be logged: a password in it ("user:pw@" or
 * ":pw@" after "://", before the host) masked as "***" ("user:***@"), and
 * credentials without a colon masked whole; NUL-terminated, in the pool.
 * NULL: no memory. */
char *ngx_http_ratelimit_mask_url(ngx_pool_t *pool, const u_char *url,
                                  size_t len) {
    const u_char *creds, *end, *at = NULL, *colon = NULL, *p;
    char *out, *o;

    out = ngx_pnalloc(pool, len + sizeof("***"));
    if (out == NULL) {
        return NULL;
    }
    creds = ngx_strlcasestrn((u_char *)url, (u_char *)url + len,
                             (u_char *)"://", 3 - 1);
    if (creds != NULL) {
        creds += 3;
        /* the authority ends at the first '/' after the scheme */
        for (end = creds; end < url + len && *end != '/'; end++) {
        }
        for (p = creds; p < end; p++) {
            if (*p == '@') {
                at = p; /* the last '@' of the authority */
            }
        }
        if (at != NULL) {
            for (p = creds; p < at; p++) {
                if (*p == ':') {
                    colon = p;
                    break;
                }
            }
        }
    }
    if (at == NULL) {
        ngx_memcpy(out, url, len);
        out[len] = '\0';
        return out;
    }
    p = colon != NULL ? colon + 1 : creds;
    o = (char *)ngx_cpymem(out, url, (size_t)(p - url));
    o = (char *)ngx_cpymem(o, "***", 3);
    o = (char *)ngx_cpymem(o, at, (size_t)(url + len - at));
    *o = '\0';
    return out;
}

/* Copies msg into buf (cap bytes, NUL-terminated, cut to fit), each
 * occurrence of the zone's URL in it (the store's messages quote it)
 * replaced by its masked form, so that no password reaches a log. */
void ngx_http_ratelimit_mask_msg(const ngx_http_ratelimit_redis_t *r,
                                 const char *msg, char *buf, size_t cap) {
    size_t n = ngx_strlen(r->url), k;
    const char *hit;
    char *o = buf, *end = buf + cap - 1;

    while (*msg != '\0' && o < end) {
        hit = n > 0 ? strstr(msg, r->url) : NULL;
        if (hit == msg) {
            for (k = 0; r->url_log[k] != '\0' && o < end; k++) {
                *o++ = r->url_log[k];
            }
            msg += n;
            continue;
        }
        *o++ = *msg++;
    }
    *o = '\0';
}

/* A parameter given twice is refused: taking the last one would, e.g.,
 * turn "store=redis://... store=shm" silently into a zone of this host
 * only. */
ngx_int_t ngx_http_ratelimit_param_twice(ngx_conf_t *cf, const char *directive,
                                         ngx_str_t *value, ngx_uint_t first,
                                         ngx_uint_t i) {
    ngx_str_t arg = value[i];
    u_char *eq = ngx_strlchr(arg.data, arg.data + arg.len, '=');
    size_t plen = eq != NULL ? (size_t)(eq - arg.data) + 1 : 0;
    ngx_uint_t j;

    for (j = first; j < i && plen != 0; j++) {
        if (value[j].len >= plen &&
            ngx_strncmp(value[j].data, arg.data, plen) == 0) {
            char *shown = ngx_http_ratelimit_mask_url(cf->pool, arg.data,
                                                      arg.len);
            char *was = ngx_http_ratelimit_mask_url(cf->pool, value[j].data,
                                                    value[j].len);

            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "%s \"%V\": \"%s\": %*s is given twice "
                               "(first as \"%s\")",
                               directive, &value[1],
                               shown != NULL ? shown : "", plen, arg.data,
                               was != NULL ? was : "");
            return NGX_ERROR;
        }
    }
    return NGX_OK;
}

ngx_int_t ngx_http_ratelimit_store_param(ngx_conf_t *cf, const char *directive,
                                         ngx_str_t *value, ngx_uint_t i,
                                         ngx_http_ratelimit_store_args_t *a) {
    ngx_str_t arg = value[i];

    if (arg.len >= 6 && ngx_strncmp(arg.data, "store=", 6) == 0) {
        char *shown;

        arg.data += 6;
        arg.len -= 6;
        if (arg.len == 3 && ngx_strncmp(arg.data, "shm", 3) == 0) {
            return NGX_OK;
        }
        if ((arg.len >= 8 && ngx_strncmp(arg.data, "redis://", 8) == 0) ||
            (arg.len >= 8 && ngx_strncmp(arg.data, "unix:///", 8) == 0) ||
            (arg.len >= 9 && ngx_strncmp(arg.data, "rediss://", 9) == 0)) {
            a->url = arg; /* checked by the store: redis_conf */
            return NGX_OK;
        }
        shown = ngx_http_ratelimit_mask_url(cf->pool, arg.data, arg.len);
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "%s \"%V\": unknown store \"%s\" (store=shm, "
                           "store=redis://HOST:PORT[/DB] or "
                           "store=unix:///PATH)",
                           directive, &value[1], shown != NULL ? shown : "");
        return NGX_ERROR;
    }
    if (arg.len >= 8 && ngx_strncmp(arg.data, "timeout=", 8) == 0) {
        char text[64], e[256];
        int trc;

        if (arg.len - 8 >= sizeof(text)) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "%s \"%V\": \"%V\": too long", directive,
                               &value[1], &value[i]);
            return NGX_ERROR;
        }
        ngx_memcpy(text, arg.data + 8, arg.len - 8);
        text[arg.len - 8] = '\0';
        e[0] = '\0';
        trc = rate_parse_duration(text, &a->timeout_ns, e, sizeof(e));
        if (trc != RATE_OK || a->timeout_ns == 0 ||
            a->timeout_ns > (uint64_t)60000000000) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "%s \"%V\": \"%V\": %s", directive, &value[1],
                               &value[i],
                               trc != RATE_OK ? e
                                              : "takes a duration from 1ms "
                                                "to 60s");
            return NGX_ERROR;
        }
        return NGX_OK;
    }
    if (arg.len >= 7 && ngx_strncmp(arg.data, "prefix=", 7) == 0) {
        a->prefix.data = arg.data + 7;
        a->prefix.len = arg.len - 7;
        if (a->prefix.len == 0) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "%s \"%V\": prefix= takes a Redis key prefix",
                               directive, &value[1]);
            return NGX_ERROR;
        }
        return NGX_OK;
    }
    return NGX_DECLINED;
}

ngx_int_t ngx_http_ratelimit_redis_conf(ngx_conf_t *cf, const char *directive,
                                        ngx_str_t *name,
                                        ngx_http_ratelimit_store_args_t *a,
                                        ngx_http_ratelimit_redis_t *out) {
    rate_redis_options_t *o = &out->options, po;
    rate_store_t *check = NULL;
    ngx_str_t *url = &a->url, *prefix = &a->prefix;
    char *p, err[256];
    int rc;

    out->url = ngx_pnalloc(cf->pool, url->len + 1);
    if (out->url == NULL) {
        return NGX_ERROR;
    }
    ngx_memcpy(out->url, url->data, url->len);
    out->url[url->len] = '\0';
    out->url_log = ngx_http_ratelimit_mask_url(cf->pool, url->data, url->len);
    if (out->url_log == NULL) {
        return NGX_ERROR;
    }
    ngx_memzero(o, sizeof(*o));
    o->lazy_connect = true;
    o->command_timeout_ns = a->timeout_ns ? a->timeout_ns : 100000000;
    o->connect_timeout_ns = o->command_timeout_ns;
    /* Each zone its own namespace (two zones may limit the same key),
     * the same in every instance that declares it. */
    if (prefix->len == 0) {
        p = ngx_pnalloc(cf->pool, sizeof("ratelimit:") + name->len + 1);
        if (p == NULL) {
            return NGX_ERROR;
        }
        ngx_sprintf((u_char *)p, "ratelimit:%V:%Z", name);
    } else {
        p = ngx_pnalloc(cf->pool, prefix->len + 1);
        if (p == NULL) {
            return NGX_ERROR;
        }
        ngx_memcpy(p, prefix->data, prefix->len);
        p[prefix->len] = '\0';
    }
    o->prefix = p;

    /* The URL and options, checked as the worker will take them, by a
     * synchronous store made lazily with timeouts of 1 ns: it fails only
     * on what is malformed, and its one try at connecting gives up at
     * once (nginx -t and a reload do not wait for Redis). */
    po = *o;
    po.connect_timeout_ns = 1;
    po.command_timeout_ns = 1;
    err[0] = '\0';
    rc = rate_store_redis_new(out->url, &po, &check, err, sizeof(err));
    if (rc != RATE_OK && rc != RATE_ESTORE && rc != RATE_ETIMEDOUT) {
        char msg[sizeof(err) + 64];

        ngx_http_ratelimit_mask_msg(out, err[0] ? err : "refused", msg,
                                    sizeof(msg));
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0, "%s \"%V\": store=%s: %s: %s",
                           directive, name, out->url_log, rate_err_name(rc),
                           msg);
        return NGX_ERROR;
    }
    rate_store_free(check);
    return NGX_OK;
}

ngx_int_t ngx_http_ratelimit_store_check(ngx_conf_t *cf, const char *directive,
                                         ngx_str_t *name,
                                         ngx_http_ratelimit_store_args_t *a,
                                         ngx_str_t *shm_only) {
    if (a->url.len == 0 && (a->timeout_ns != 0 || a->prefix.len != 0)) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "%s \"%V\": timeout= and prefix= are for a Redis "
                           "store (store=redis://...)",
                           directive, name);
        return NGX_ERROR;
    }
    if (a->url.len != 0 && shm_only != NULL) {
        /* keys= and key_max= size the shared zone; fair is this host's */
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "%s \"%V\": \"%V\" is for the shared-memory "
                           "store (store=shm): %s",
                           directive, name, shm_only,
                           shm_only->len == 4 &&
                                   ngx_strncmp(shm_only->data, "fair", 4) == 0
                               ? "fair shares across nginx instances are "
                                 "not built"
                               : "Redis keeps every key");
        return NGX_ERROR;
    }
    return NGX_OK;
}

ngx_shm_zone_t *ngx_http_ratelimit_shm_add(ngx_conf_t *cf,
                                           const char *directive,
                                           ngx_str_t *name, size_t size,
                                           void *tag, ngx_shm_zone_init_pt init,
                                           void *data) {
    ngx_shm_zone_t *zone = ngx_shared_memory_add(cf, name, size, tag);

    if (zone == NULL) {
        return NULL;
    }
    if (zone->data != NULL) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "%s \"%V\" is already declared", directive, name);
        return NULL;
    }
    zone->init = init;
    zone->data = data;
    return zone;
}

ngx_int_t ngx_http_ratelimit_shm_region(ngx_shm_zone_t *shm_zone,
                                        void *old_data, const char *directive,
                                        ngx_str_t *name,
                                        const rate_shm_options_t *options,
                                        size_t region_size, size_t alloc,
                                        void **region, ngx_flag_t *made) {
    ngx_slab_pool_t *shpool = (ngx_slab_pool_t *)shm_zone->shm.addr;
    rate_shm_options_t opt = *options;
    rate_store_t *store = NULL;
    char err[256];
    int rc;

    if (old_data != NULL || shm_zone->shm.exists) {
        *region = shpool->data;
        opt.init = false;
    } else {
        *region = ngx_slab_alloc(shpool, alloc);
        if (*region == NULL) {
            ngx_log_error(NGX_LOG_EMERG, shm_zone->shm.log, 0,
                          "%s \"%V\": no room for its %uz bytes in the "
                          "shared zone of %uz",
                          directive, name, alloc, shm_zone->shm.size);
            return NGX_ERROR;
        }
        shpool->data = *region;
        opt.init = true;
    }
    *made = opt.init;
    err[0] = '\0';
    rc = rate_store_shm_new_in(*region, region_size, &opt, &store, err,
                               sizeof(err));
    if (rc != RATE_OK) {
        ngx_log_error(NGX_LOG_EMERG, shm_zone->shm.log, 0,
                      "%s \"%V\": the shared-memory store refuses the "
                      "zone: %s: %s",
                      directive, name, rate_err_name(rc), err);
        return NGX_ERROR;
    }
    rate_store_free(store); /* the region stays: it is the zone's */
    return NGX_OK;
}
