/* SPDX-License-Identifier: MIT */
/*
 * ngx_http_ratelimit_module: libratelimit's limits in nginx, over the
 * shared-memory store kept in an nginx shared zone (docs/nginx.md).
 */
#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>
#include <ngx_sha1.h>

#include <ratelimit.h>
#include <ratelimit_redis.h>
#include <ratelimit_shm.h>
#include <ratelimit_http.h>

#include "ngx_http_ratelimit_conf.h"
#include "ngx_http_ratelimit_fair.h"
#include "ngx_http_ratelimit_loop.h"

#define NGX_HTTP_RATELIMIT_KEYS_DEFAULT 10000
#define NGX_HTTP_RATELIMIT_KEY_MAX_DEFAULT 128
#define NGX_HTTP_RATELIMIT_MAX 8 /* ratelimit directives a location applies */

typedef enum {
    NGX_HTTP_RATELIMIT_NONE = 0, /* no decision (no limit, or empty keys) */
    NGX_HTTP_RATELIMIT_ALLOWED,
    NGX_HTTP_RATELIMIT_LIMITED,
    NGX_HTTP_RATELIMIT_SHADOW,
    NGX_HTTP_RATELIMIT_ERROR
} ngx_http_ratelimit_result_e;

typedef struct {
    ngx_str_t name;
    ngx_str_t policy_text;
    rate_policy_t *policy;
    rate_shm_options_t options;
    size_t region_size;     /* the store's region */
    size_t zone_size;       /* the nginx zone: the region and the slab pool */
    ngx_shm_zone_t *shm_zone;
    void *region;           /* in the zone, set by the zone's init */
    /* store=redis://: the URL (NUL-terminated) and the store's options
     * (lazy_connect, timeout=, prefix=); NULL url: the shared memory. */
    ngx_http_ratelimit_redis_t redis;
    /* Per worker, made at init_process: */
    time_t error_logged;      /* the second of the last store-error line */
    ngx_uint_t error_quiet;   /* store-error lines left out since */
    rate_store_t *store;
    rate_limiter_t *limiter[2][2]; /* [shadow][fail open] */
    /* fair: the zone's one limit divided fairly among the requests'
     * keys (ngx_http_ratelimit_fair.h); its table follows the region. */
    ngx_http_ratelimit_fair_t fair;
} ngx_http_ratelimit_zone_t;

typedef struct {
    ngx_array_t zones; /* of ngx_http_ratelimit_zone_t * */
} ngx_http_ratelimit_main_conf_t;

typedef struct {
    ngx_http_ratelimit_zone_t *zone;
    ngx_http_complex_value_t key;
    uint64_t max_wait_ns; /* wait=: the longest delay a request may wait */
    ngx_http_complex_value_t *weight; /* weight=: a fair zone's; NULL: 1 */
} ngx_http_ratelimit_limit_t;

typedef struct {
    ngx_array_t *limits; /* of ngx_http_ratelimit_limit_t */
    ngx_uint_t status;
    ngx_flag_t shadow;
    ngx_flag_t headers;
    ngx_uint_t fail_open;
    ngx_uint_t log_level;
} ngx_http_ratelimit_loc_conf_t;

typedef struct {
    ngx_http_ratelimit_result_e result;
    ngx_flag_t headers;
    ngx_uint_t n;          /* decisions made */
    ngx_int_t denied;      /* index of the denying decision, or -1 */
    ngx_uint_t next;       /* the location's next limit to decide */
    ngx_uint_t errors;     /* store errors among the decisions */
    uint64_t delay_ns;     /* the longest reservation (wait=) */
    ngx_http_ratelimit_loc_conf_t *rlcf; /* the deciding location's */
    ngx_int_t final;       /* the handler's answer when the phases rerun */
    unsigned pending:1;    /* a Redis decision in flight */
    ngx_http_ratelimit_zone_t *zone[NGX_HTTP_RATELIMIT_MAX];
    ngx_uint_t limit_of[NGX_HTTP_RATELIMIT_MAX]; /* its limit's index */
    rate_decision_t d[]; /* one a limit of the location */
} ngx_http_ratelimit_ctx_t;

static ngx_int_t ngx_http_ratelimit_preconf(ngx_conf_t *cf);
static ngx_int_t ngx_http_ratelimit_postconf(ngx_conf_t *cf);
static void *ngx_http_ratelimit_create_main_conf(ngx_conf_t *cf);
static void *ngx_http_ratelimit_create_loc_conf(ngx_conf_t *cf);
static char *ngx_http_ratelimit_merge_loc_conf(ngx_conf_t *cf, void *parent,
                                               void *child);
static char *ngx_http_ratelimit_zone(ngx_conf_t *cf, ngx_command_t *cmd,
                                     void *conf);
static char *ngx_http_ratelimit(ngx_conf_t *cf, ngx_command_t *cmd,
                                void *conf);
static char *ngx_http_ratelimit_fail(ngx_conf_t *cf, ngx_command_t *cmd,
                                     void *conf);
static ngx_int_t ngx_http_ratelimit_init_process(ngx_cycle_t *cycle);
static void ngx_http_ratelimit_exit_process(ngx_cycle_t *cycle);

static ngx_conf_enum_t ngx_http_ratelimit_log_levels[] = {
    {ngx_string("info"), NGX_LOG_INFO},
    {ngx_string("notice"), NGX_LOG_NOTICE},
    {ngx_string("warn"), NGX_LOG_WARN},
    {ngx_string("error"), NGX_LOG_ERR},
    {ngx_null_string, 0}};

static ngx_command_t ngx_http_ratelimit_commands[] = {
    {ngx_string("ratelimit_zone"), NGX_HTTP_MAIN_CONF | NGX_CONF_2MORE,
     ngx_http_ratelimit_zone, 0, 0, NULL},
    {ngx_string("ratelimit"),
     NGX_HTTP_MAIN_CONF | NGX_HTTP_SRV_CONF | NGX_HTTP_LOC_CONF |
         NGX_CONF_TAKE2 | NGX_CONF_TAKE3 | NGX_CONF_TAKE4,
     ngx_http_ratelimit, NGX_HTTP_LOC_CONF_OFFSET, 0, NULL},
    {ngx_string("ratelimit_status"),
     NGX_HTTP_MAIN_CONF | NGX_HTTP_SRV_CONF | NGX_HTTP_LOC_CONF |
         NGX_CONF_TAKE1,
     ngx_http_ratelimit_status_slot, NGX_HTTP_LOC_CONF_OFFSET,
     offsetof(ngx_http_ratelimit_loc_conf_t, status), NULL},
    {ngx_string("ratelimit_shadow"),
     NGX_HTTP_MAIN_CONF | NGX_HTTP_SRV_CONF | NGX_HTTP_LOC_CONF |
         NGX_CONF_FLAG,
     ngx_conf_set_flag_slot, NGX_HTTP_LOC_CONF_OFFSET,
     offsetof(ngx_http_ratelimit_loc_conf_t, shadow), NULL},
    {ngx_string("ratelimit_headers"),
     NGX_HTTP_MAIN_CONF | NGX_HTTP_SRV_CONF | NGX_HTTP_LOC_CONF |
         NGX_CONF_FLAG,
     ngx_conf_set_flag_slot, NGX_HTTP_LOC_CONF_OFFSET,
     offsetof(ngx_http_ratelimit_loc_conf_t, headers), NULL},
    {ngx_string("ratelimit_fail"),
     NGX_HTTP_MAIN_CONF | NGX_HTTP_SRV_CONF | NGX_HTTP_LOC_CONF |
         NGX_CONF_TAKE1,
     ngx_http_ratelimit_fail, NGX_HTTP_LOC_CONF_OFFSET, 0, NULL},
    {ngx_string("ratelimit_log_level"),
     NGX_HTTP_MAIN_CONF | NGX_HTTP_SRV_CONF | NGX_HTTP_LOC_CONF |
         NGX_CONF_TAKE1,
     ngx_http_ratelimit_enum_slot, NGX_HTTP_LOC_CONF_OFFSET,
     offsetof(ngx_http_ratelimit_loc_conf_t, log_level),
     &ngx_http_ratelimit_log_levels},
    ngx_null_command};

static ngx_http_module_t ngx_http_ratelimit_module_ctx = {
    ngx_http_ratelimit_preconf,          /* preconfiguration */
    ngx_http_ratelimit_postconf,         /* postconfiguration */
    ngx_http_ratelimit_create_main_conf, /* create main configuration */
    NULL,                                /* init main configuration */
    NULL,                                /* create server configuration */
    NULL,                                /* merge server configuration */
    ngx_http_ratelimit_create_loc_conf,  /* create location configuration */
    ngx_http_ratelimit_merge_loc_conf    /* merge location configuration */
};

ngx_module_t ngx_http_ratelimit_module = {
    NGX_MODULE_V1,
    &ngx_http_ratelimit_module_ctx,  /* module context */
    ngx_http_ratelimit_commands,     /* module directives */
    NGX_HTTP_MODULE,                 /* module type */
    NULL,                            /* init master */
    NULL,                            /* init module */
    ngx_http_ratelimit_init_process, /* init process */
    NULL,                            /* init thread */
    NULL,                            /* exit thread */
    ngx_http_ratelimit_exit_process, /* exit process */
    NULL,                            /* exit master */
    NGX_MODULE_V1_PADDING};

static ngx_http_output_header_filter_pt ngx_http_next_header_filter;

/* The worker's loop, which its Redis stores are driven by, and whether it
 * is exiting (exit_process: callbacks then touch no request). */
static rate_loop_t ngx_http_ratelimit_loop;
static ngx_uint_t ngx_http_ratelimit_exiting;
/* The worker's refunds on its Redis zones (rate_limiter_refund_start):
 * made, failed (the store's error), dropped (still pending at the exit),
 * and the failures' log lines suppressed since the last one (at most one a
 * second). */
static uint64_t ngx_http_ratelimit_refunds_made;
static uint64_t ngx_http_ratelimit_refunds_failed;
static uint64_t ngx_http_ratelimit_refunds_dropped;
static uint64_t ngx_http_ratelimit_refunds_quiet;
static time_t ngx_http_ratelimit_refunds_logged;

static ngx_str_t ngx_http_ratelimit_result_names[] = {
    ngx_null_string, ngx_string("allowed"), ngx_string("limited"),
    ngx_string("shadow"), ngx_string("error")};

/* ------------------------------------------------------------ the zone */

static void ngx_http_ratelimit_policy_cleanup(void *data) {
    rate_policy_free(data);
}

/* The zone's init, in the master (at start and at each reload, before the
 * workers fork): initializes the store's region, or, on a reload that
 * keeps the zone (same name and size), checks that the region attaches. */
static ngx_int_t ngx_http_ratelimit_init_zone(ngx_shm_zone_t *shm_zone,
                                              void *data) {
    ngx_http_ratelimit_zone_t *z = shm_zone->data;
    ngx_flag_t made;

    if (ngx_http_ratelimit_shm_region(shm_zone, data, "ratelimit_zone",
                                      &z->name, &z->options, z->region_size,
                                      ngx_align(z->region_size, 64) +
                                          z->fair.size,
                                      &z->region, &made) != NGX_OK) {
        return NGX_ERROR;
    }
    return ngx_http_ratelimit_fair_init_zone(
        &z->fair, (u_char *)z->region + ngx_align(z->region_size, 64), made,
        &z->name, shm_zone->shm.log);
}

/* A reload cannot resize a zone: nginx would then make a new one, empty,
 * and every key would start afresh.  Refuse it, naming both sizes. */
static char *ngx_http_ratelimit_check_resize(ngx_conf_t *cf,
                                             ngx_http_ratelimit_zone_t *z) {
    ngx_cycle_t *old = cf->cycle->old_cycle;
    ngx_list_part_t *part;
    ngx_shm_zone_t *shm;
    ngx_uint_t i;

    if (old == NULL || old->shared_memory.part.elts == NULL) {
        return NGX_CONF_OK;
    }
    part = &old->shared_memory.part;
    shm = part->elts;
    for (i = 0; /* void */; i++) {
        if (i >= part->nelts) {
            if (part->next == NULL) {
                break;
            }
            part = part->next;
            shm = part->elts;
            i = 0;
        }
        if (i >= part->nelts) {
            continue;
        }
        if (shm[i].tag != &ngx_http_ratelimit_module ||
            shm[i].shm.name.len != z->name.len ||
            ngx_strncmp(shm[i].shm.name.data, z->name.data, z->name.len) !=
                0) {
            continue;
        }
        if (shm[i].shm.size != z->zone_size) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "ratelimit_zone \"%V\": its size would change "
                               "from %uz to %uz bytes (keys=, key_max= or the "
                               "policy's state size changed): a reload cannot "
                               "resize a zone without losing its keys; keep "
                               "the size, or restart nginx",
                               &z->name, shm[i].shm.size, z->zone_size);
            return NGX_CONF_ERROR;
        }
    }
    return NGX_CONF_OK;
}

static char *ngx_http_ratelimit_zone(ngx_conf_t *cf, ngx_command_t *cmd,
                                     void *conf) {
    ngx_http_ratelimit_main_conf_t *rmcf;
    ngx_http_ratelimit_zone_t *z, **zp;
    ngx_str_t *value = cf->args->elts, arg;
    ngx_pool_cleanup_t *cln;
    uint64_t keys = NGX_HTTP_RATELIMIT_KEYS_DEFAULT;
    uint64_t key_max = NGX_HTTP_RATELIMIT_KEY_MAX_DEFAULT;
    ngx_http_ratelimit_store_args_t store;
    ngx_str_t *shm_only = NULL;
    ngx_flag_t fair = 0;
    size_t state;
    char *text, err[256];
    ngx_uint_t i;
    int rc;

    (void)cmd;
    (void)conf;
    ngx_memzero(&store, sizeof(store));
    rmcf = ngx_http_conf_get_module_main_conf(cf, ngx_http_ratelimit_module);

    if (value[1].len == 0) {
        return "needs a zone name";
    }
    zp = rmcf->zones.elts;
    for (i = 0; i < rmcf->zones.nelts; i++) {
        if (zp[i]->name.len == value[1].len &&
            ngx_strncmp(zp[i]->name.data, value[1].data, value[1].len) == 0) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "duplicate ratelimit_zone \"%V\"", &value[1]);
            return NGX_CONF_ERROR;
        }
    }

    for (i = 3; i < cf->args->nelts; i++) {
        arg = value[i];
        if (ngx_http_ratelimit_param_twice(cf, "ratelimit_zone", value, 3, i) !=
            NGX_OK) {
            return NGX_CONF_ERROR;
        }
        rc = ngx_http_ratelimit_store_param(cf, "ratelimit_zone", value, i,
                                            &store);
        if (rc == NGX_ERROR) {
            return NGX_CONF_ERROR;
        }
        if (rc == NGX_OK) {
            continue;
        }
        if (arg.len >= 5 && ngx_strncmp(arg.data, "keys=", 5) == 0) {
            arg.data += 5;
            arg.len -= 5;
            shm_only = &value[i];
            if (ngx_http_ratelimit_parse_uint(&arg, &keys) != NGX_OK) {
                ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                                   "ratelimit_zone \"%V\": \"%V\": keys= "
                                   "takes a positive whole number",
                                   &value[1], &value[i]);
                return NGX_CONF_ERROR;
            }
            continue;
        }
        if (arg.len >= 8 && ngx_strncmp(arg.data, "key_max=", 8) == 0) {
            arg.data += 8;
            arg.len -= 8;
            shm_only = &value[i];
            /* from 4: a policy record's key in the zone takes 4 bytes */
            if (ngx_http_ratelimit_parse_uint(&arg, &key_max) != NGX_OK ||
                key_max < 4 || key_max > RATE_KEY_MAX) {
                ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                                   "ratelimit_zone \"%V\": \"%V\": key_max= "
                                   "takes a whole number from 4 to %d",
                                   &value[1], &value[i], RATE_KEY_MAX);
                return NGX_CONF_ERROR;
            }
            continue;
        }
        if (arg.len == 4 && ngx_strncmp(arg.data, "fair", 4) == 0) {
            fair = 1;
            shm_only = &value[i];
            continue;
        }
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "ratelimit_zone \"%V\": unknown parameter \"%V\" "
                           "(store=, keys=, key_max=, timeout=, prefix=, "
                           "fair)",
                           &value[1], &value[i]);
        return NGX_CONF_ERROR;
    }
    if (ngx_http_ratelimit_store_check(cf, "ratelimit_zone", &value[1],
                                       &store, shm_only) != NGX_OK) {
        return NGX_CONF_ERROR;
    }

    z = ngx_pcalloc(cf->pool, sizeof(*z));
    if (z == NULL) {
        return NGX_CONF_ERROR;
    }
    z->name = value[1];
    z->policy_text = value[2];
    z->fair.on = fair;
    text = ngx_pnalloc(cf->pool, value[2].len + 1);
    if (text == NULL) {
        return NGX_CONF_ERROR;
    }
    ngx_memcpy(text, value[2].data, value[2].len);
    text[value[2].len] = '\0';
    err[0] = '\0';
    rc = rate_policy_parse(text, &z->policy, err, sizeof(err));
    if (rc != RATE_OK) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "ratelimit_zone \"%V\": bad policy \"%V\": %s",
                           &value[1], &value[2],
                           err[0] ? err : rate_err_name(rc));
        return NGX_CONF_ERROR;
    }
    cln = ngx_pool_cleanup_add(cf->pool, 0);
    if (cln == NULL) {
        rate_policy_free(z->policy);
        return NGX_CONF_ERROR;
    }
    cln->handler = ngx_http_ratelimit_policy_cleanup;
    cln->data = z->policy;
    if (rate_policy_name(z->policy)[0] == '\0') {
        /* Unnamed: the RateLimit fields name the zone (when the zone's
         * name is a valid policy name; else they read "default"). */
        char name[RATE_POLICY_NAME_MAX + 1];
        if (z->name.len <= RATE_POLICY_NAME_MAX) {
            ngx_memcpy(name, z->name.data, z->name.len);
            name[z->name.len] = '\0';
            (void)rate_policy_set_name(z->policy, name, NULL, 0);
        }
    }

    if (store.url.len != 0) {
        if (ngx_http_ratelimit_redis_conf(cf, "ratelimit_zone", &z->name,
                                          &store, &z->redis) != NGX_OK) {
            return NGX_CONF_ERROR;
        }
        zp = ngx_array_push(&rmcf->zones);
        if (zp == NULL) {
            return NGX_CONF_ERROR;
        }
        *zp = z;
        return NGX_CONF_OK;
    }

    z->options.max_keys = keys;
    z->options.key_max = (uint32_t)key_max;
    state = rate_store_shm_state_size(z->policy);
    z->options.state_max = state > 96 ? (uint32_t)state : 0;
    z->region_size = rate_store_shm_size(&z->options);
    if (z->region_size == 0) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "ratelimit_zone \"%V\": the shared-memory store "
                           "refuses keys=%uL key_max=%uL with this policy's "
                           "state of %uz bytes",
                           &value[1], keys, key_max, state);
        return NGX_CONF_ERROR;
    }
    /* The slab pool's header and page table (about 1/170 of the zone)
     * before the page-aligned region (and a fair zone's table). */
    z->zone_size = z->region_size + z->region_size / 128 + 16 * ngx_pagesize;
    z->zone_size += ngx_http_ratelimit_fair_zone_size(&z->fair);
    /* Its memory, told at each configuration (nginx -t shows it). */
    ngx_conf_log_error(NGX_LOG_NOTICE, cf, 0,
                       "ratelimit_zone \"%V\": %uz bytes of shared memory "
                       "for keys=%uL key_max=%uL (%uz bytes a key)",
                       &value[1], z->zone_size, keys, key_max,
                       z->zone_size / (size_t)keys);

    if (ngx_http_ratelimit_check_resize(cf, z) != NGX_CONF_OK) {
        return NGX_CONF_ERROR;
    }

    z->shm_zone = ngx_http_ratelimit_shm_add(cf, "ratelimit_zone", &z->name,
                                             z->zone_size,
                                             &ngx_http_ratelimit_module,
                                             ngx_http_ratelimit_init_zone, z);
    if (z->shm_zone == NULL) {
        return NGX_CONF_ERROR;
    }

    zp = ngx_array_push(&rmcf->zones);
    if (zp == NULL) {
        return NGX_CONF_ERROR;
    }
    *zp = z;
    return NGX_CONF_OK;
}

/* ------------------------------------------------- per-location directives */

static char *ngx_http_ratelimit(ngx_conf_t *cf, ngx_command_t *cmd,
                                void *conf) {
    ngx_http_ratelimit_loc_conf_t *rlcf = conf;
    ngx_http_ratelimit_main_conf_t *rmcf;
    ngx_http_ratelimit_zone_t **zp, *z = NULL;
    ngx_http_ratelimit_limit_t *limit;
    ngx_http_compile_complex_value_t ccv;
    ngx_str_t *value = cf->args->elts;
    ngx_uint_t i;

    (void)cmd;
    rmcf = ngx_http_conf_get_module_main_conf(cf, ngx_http_ratelimit_module);
    zp = rmcf->zones.elts;
    for (i = 0; i < rmcf->zones.nelts; i++) {
        if (zp[i]->name.len == value[1].len &&
            ngx_strncmp(zp[i]->name.data, value[1].data, value[1].len) == 0) {
            z = zp[i];
            break;
        }
    }
    if (z == NULL) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "ratelimit: no ratelimit_zone \"%V\" (declare it "
                           "before, in the http block)",
                           &value[1]);
        return NGX_CONF_ERROR;
    }
    if (rlcf->limits == NGX_CONF_UNSET_PTR) {
        rlcf->limits = ngx_array_create(cf->pool, 2, sizeof(*limit));
        if (rlcf->limits == NULL) {
            return NGX_CONF_ERROR;
        }
    }
    limit = rlcf->limits->elts;
    for (i = 0; i < rlcf->limits->nelts; i++) {
        if (limit[i].zone == z) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "ratelimit: zone \"%V\" is applied twice here",
                               &value[1]);
            return NGX_CONF_ERROR;
        }
    }
    if (rlcf->limits->nelts >= NGX_HTTP_RATELIMIT_MAX) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "ratelimit: at most %d limits a location",
                           NGX_HTTP_RATELIMIT_MAX);
        return NGX_CONF_ERROR;
    }
    limit = ngx_array_push(rlcf->limits);
    if (limit == NULL) {
        return NGX_CONF_ERROR;
    }
    ngx_memzero(limit, sizeof(*limit));
    limit->zone = z;
    if (value[2].len == 0) {
        /* An empty key is not limited: this one never would be. */
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "ratelimit: zone \"%V\": the key is \"\", which "
                           "limits no request (give a variable, such as "
                           "$binary_remote_addr, or a constant for one limit "
                           "for all)",
                           &value[1]);
        return NGX_CONF_ERROR;
    }
    ngx_memzero(&ccv, sizeof(ccv));
    ccv.cf = cf;
    ccv.value = &value[2];
    ccv.complex_value = &limit->key;
    if (ngx_http_compile_complex_value(&ccv) != NGX_OK) {
        return NGX_CONF_ERROR;
    }
    for (i = 3; i < cf->args->nelts; i++) {
        char text[64], err[256];
        ngx_str_t w = value[i];
        int rc;

        /* each parameter once: a second would silently win */
        if (ngx_http_ratelimit_param_twice(cf, "ratelimit", value, 3, i) !=
            NGX_OK) {
            return NGX_CONF_ERROR;
        }
        if (w.len == 7 && ngx_strncmp(w.data, "weight=", 7) == 0) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "ratelimit: \"weight=\" needs a value "
                               "(weight=VALUE)");
            return NGX_CONF_ERROR;
        }
        if (w.len > 7 && ngx_strncmp(w.data, "weight=", 7) == 0) {
            if (!z->fair.on) {
                ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                                   "ratelimit: \"%V\": zone \"%V\" is not "
                                   "fair (ratelimit_zone ... fair)",
                                   &w, &value[1]);
                return NGX_CONF_ERROR;
            }
            w.data += 7;
            w.len -= 7;
            if (ngx_http_ratelimit_fair_weight_conf(cf, &w, &limit->weight) !=
                NGX_CONF_OK) {
                return NGX_CONF_ERROR;
            }
            continue;
        }
        if (w.len < 5 || ngx_strncmp(w.data, "wait=", 5) != 0 ||
            w.len - 5 >= sizeof(text)) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "ratelimit: unknown parameter \"%V\" "
                               "(wait=DURATION, weight=VALUE)",
                               &w);
            return NGX_CONF_ERROR;
        }
        if (z->fair.on) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "ratelimit: \"%V\": zone \"%V\" is fair: "
                               "its decisions do not wait",
                               &w, &value[1]);
            return NGX_CONF_ERROR;
        }
        ngx_memcpy(text, w.data + 5, w.len - 5);
        text[w.len - 5] = '\0';
        err[0] = '\0';
        rc = rate_parse_duration(text, &limit->max_wait_ns, err, sizeof(err));
        if (rc != RATE_OK || limit->max_wait_ns > (uint64_t)86400000000000) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "ratelimit: \"%V\": %s", &w,
                               rc != RATE_OK ? err : "at most 1d");
            return NGX_CONF_ERROR;
        }
    }
    /* Shared-memory zones are decided before Redis zones (each kind in
     * the order written): a local denial then asks Redis nothing, and a
     * Redis denial gives back local charges, at once (docs/nginx.md). */
    if (z->redis.url == NULL) {
        ngx_http_ratelimit_limit_t tmp = *limit;

        limit = rlcf->limits->elts;
        for (i = rlcf->limits->nelts - 1;
             i > 0 && limit[i - 1].zone->redis.url != NULL; i--) {
            limit[i] = limit[i - 1];
        }
        limit[i] = tmp;
    }
    return NGX_CONF_OK;
}

static char *ngx_http_ratelimit_fail(ngx_conf_t *cf, ngx_command_t *cmd,
                                     void *conf) {
    ngx_http_ratelimit_loc_conf_t *rlcf = conf;
    ngx_str_t *value = cf->args->elts;

    (void)cmd;
    if (rlcf->fail_open != NGX_CONF_UNSET_UINT) {
        return "is duplicate";
    }
    if (value[1].len == 4 && ngx_strncmp(value[1].data, "open", 4) == 0) {
        rlcf->fail_open = 1;
    } else if (value[1].len == 6 &&
               ngx_strncmp(value[1].data, "closed", 6) == 0) {
        rlcf->fail_open = 0;
    } else {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "ratelimit_fail: \"%V\" is neither open nor closed",
                           &value[1]);
        return NGX_CONF_ERROR;
    }
    return NGX_CONF_OK;
}

static void *ngx_http_ratelimit_create_main_conf(ngx_conf_t *cf) {
    ngx_http_ratelimit_main_conf_t *rmcf;

    rmcf = ngx_pcalloc(cf->pool, sizeof(*rmcf));
    if (rmcf == NULL) {
        return NULL;
    }
    if (ngx_array_init(&rmcf->zones, cf->pool, 4,
                       sizeof(ngx_http_ratelimit_zone_t *)) != NGX_OK) {
        return NULL;
    }
    return rmcf;
}

static void *ngx_http_ratelimit_create_loc_conf(ngx_conf_t *cf) {
    ngx_http_ratelimit_loc_conf_t *rlcf;

    rlcf = ngx_pcalloc(cf->pool, sizeof(*rlcf));
    if (rlcf == NULL) {
        return NULL;
    }
    rlcf->limits = NGX_CONF_UNSET_PTR;
    rlcf->status = NGX_CONF_UNSET_UINT;
    rlcf->shadow = NGX_CONF_UNSET;
    rlcf->headers = NGX_CONF_UNSET;
    rlcf->fail_open = NGX_CONF_UNSET_UINT;
    rlcf->log_level = NGX_CONF_UNSET_UINT;
    return rlcf;
}

static char *ngx_http_ratelimit_merge_loc_conf(ngx_conf_t *cf, void *parent,
                                               void *child) {
    ngx_http_ratelimit_loc_conf_t *prev = parent;
    ngx_http_ratelimit_loc_conf_t *conf = child;

    (void)cf;
    ngx_conf_merge_ptr_value(conf->limits, prev->limits, NULL);
    ngx_conf_merge_uint_value(conf->status, prev->status,
                              NGX_HTTP_TOO_MANY_REQUESTS);
    ngx_conf_merge_value(conf->shadow, prev->shadow, 0);
    ngx_conf_merge_value(conf->headers, prev->headers, 0);
    ngx_conf_merge_uint_value(conf->fail_open, prev->fail_open, 0);
    ngx_conf_merge_uint_value(conf->log_level, prev->log_level, NGX_LOG_ERR);
    return NGX_CONF_OK;
}

/* ------------------------------------------------------------ workers */

static ngx_http_ratelimit_main_conf_t *
ngx_http_ratelimit_main(ngx_cycle_t *cycle) {
    if (cycle->conf_ctx == NULL ||
        cycle->conf_ctx[ngx_http_module.index] == NULL) {
        return NULL;
    }
    return ngx_http_cycle_get_module_main_conf(cycle,
                                               ngx_http_ratelimit_module);
}

/* The zone's four limiters ([shadow][fail open]) on its store. */
static void ngx_http_ratelimit_limiters(ngx_log_t *log,
                                        ngx_http_ratelimit_zone_t *z) {
    rate_limiter_config_t lc;
    ngx_uint_t s, f;
    int rc;

    for (s = 0; s < 2; s++) {
        for (f = 0; f < 2; f++) {
            ngx_memzero(&lc, sizeof(lc));
            lc.policy = z->policy;
            lc.store = z->store;
            /* A Redis zone's limiters go by the wall clock: the scripts
             * go by Redis's TIME (a wall clock too), and a decision they
             * decline (the C step over HMGET and compare-and-set, at the
             * limiter's clock) must be on the same time line, in every
             * instance. */
            lc.clock = z->redis.url != NULL ? rate_clock_wall() : NULL;
            lc.shadow = s != 0;
            lc.on_store_error = f ? RATE_FAIL_OPEN : RATE_FAIL_CLOSED;
            rc = rate_limiter_new(&lc, &z->limiter[s][f]);
            if (rc != RATE_OK) {
                ngx_log_error(NGX_LOG_ALERT, log, 0,
                              "ratelimit_zone \"%V\": cannot make a "
                              "limiter: %s",
                              &z->name, rate_err_name(rc));
                z->limiter[s][f] = NULL;
            }
        }
    }
}

/* A Redis zone's asynchronous store and limiters, made at once: with
 * lazy_connect the store makes no connection at its creation, and a
 * limiter on it writes its policy's record through the store, at its first
 * decision (pending, as the decision is), so nothing here waits for Redis
 * (docs/nginx.md, docs/async.md). */
static void ngx_http_ratelimit_redis_setup(ngx_log_t *log,
                                           ngx_http_ratelimit_zone_t *z) {
    char err[256];
    int rc;

    err[0] = '\0';
    rc = rate_store_redis_async_new(z->redis.url, &z->redis.options,
                                    &ngx_http_ratelimit_loop, &z->store, err,
                                    sizeof(err));
    if (rc != RATE_OK) {
        char msg[sizeof(err) + 64];

        ngx_http_ratelimit_mask_msg(&z->redis, err, msg, sizeof(msg));
        ngx_log_error(NGX_LOG_ALERT, log, 0,
                      "ratelimit_zone \"%V\": cannot make the Redis store "
                      "for %s: %s: %s",
                      &z->name, z->redis.url_log, rate_err_name(rc), msg);
        z->store = NULL;
        return;
    }
    ngx_http_ratelimit_limiters(log, z);
}

/* Each worker attaches its own handle to each shared-memory zone's region
 * (made by the master before the fork) and makes its limiters on it, and
 * makes each Redis zone's asynchronous store and limiters on its loop,
 * never waiting for Redis (a Redis down or not answering is met by the
 * first decisions: store errors under the location's ratelimit_fail until
 * it answers).  A zone that fails is logged and answers every request as a
 * store error. */
static ngx_int_t ngx_http_ratelimit_init_process(ngx_cycle_t *cycle) {
    ngx_http_ratelimit_main_conf_t *rmcf = ngx_http_ratelimit_main(cycle);
    ngx_http_ratelimit_zone_t **zp, *z;
    rate_shm_options_t opt;
    char err[256];
    ngx_uint_t i;
    int rc;

    if (rmcf == NULL) {
        return NGX_OK;
    }
    ngx_http_ratelimit_exiting = 0;
    ngx_http_ratelimit_loop_init(&ngx_http_ratelimit_loop, cycle->log);
    zp = rmcf->zones.elts;
    for (i = 0; i < rmcf->zones.nelts; i++) {
        z = zp[i];
        if (z->redis.url != NULL) {
            ngx_http_ratelimit_redis_setup(cycle->log, z);
            continue;
        }
        err[0] = '\0';
        opt = z->options;
        opt.init = false;
        rc = rate_store_shm_new_in(z->region, z->region_size, &opt, &z->store,
                                   err, sizeof(err));
        if (rc != RATE_OK) {
            ngx_log_error(NGX_LOG_ALERT, cycle->log, 0,
                          "ratelimit_zone \"%V\": cannot attach to the "
                          "shared-memory store: %s: %s",
                          &z->name, rate_err_name(rc), err);
            z->store = NULL;
            continue;
        }
        ngx_http_ratelimit_limiters(cycle->log, z);
        if (z->fair.on) {
            ngx_http_ratelimit_fair_attach(&z->fair, z->limiter, &z->name,
                                           cycle->log);
        }
    }
    return NGX_OK;
}

static void ngx_http_ratelimit_exit_process(ngx_cycle_t *cycle) {
    ngx_http_ratelimit_main_conf_t *rmcf = ngx_http_ratelimit_main(cycle);
    ngx_http_ratelimit_zone_t **zp;
    ngx_uint_t i, s, f;

    if (rmcf == NULL) {
        return;
    }
    /* Freeing a Redis store completes its decisions in flight
     * (RATE_ECANCELED): their callbacks then only let go of their
     * requests.  The store first, then its limiters. */
    ngx_http_ratelimit_exiting = 1;
    zp = rmcf->zones.elts;
    for (i = 0; i < rmcf->zones.nelts; i++) {
        rate_store_free(zp[i]->store);
        zp[i]->store = NULL;
        ngx_http_ratelimit_fair_detach(&zp[i]->fair);
        for (s = 0; s < 2; s++) {
            for (f = 0; f < 2; f++) {
                rate_limiter_free(zp[i]->limiter[s][f]);
                zp[i]->limiter[s][f] = NULL;
            }
        }
    }
    /* (after the stores: a refund still pending was completed by its
     * store's freeing, as dropped) */
    if (ngx_http_ratelimit_refunds_made + ngx_http_ratelimit_refunds_failed +
            ngx_http_ratelimit_refunds_dropped >
        0) {
        ngx_log_error(NGX_LOG_NOTICE, cycle->log, 0,
                      "ratelimit: refunds on Redis zones: %uL made, "
                      "%uL failed, %uL dropped",
                      ngx_http_ratelimit_refunds_made,
                      ngx_http_ratelimit_refunds_failed,
                      ngx_http_ratelimit_refunds_dropped);
    }
}

/* ------------------------------------------------------------ requests */

/* The request's decisions hang on a pool cleanup of the main request as
 * well as its module context: the context is wiped by an internal
 * redirect, the cleanup is not, so a request is decided once. */
static void ngx_http_ratelimit_marker(void *data) { (void)data; }

static ngx_http_ratelimit_ctx_t *
ngx_http_ratelimit_find_ctx(ngx_http_request_t *r) {
    ngx_http_ratelimit_ctx_t *ctx;
    ngx_pool_cleanup_t *c;

    r = r->main;
    ctx = ngx_http_get_module_ctx(r, ngx_http_ratelimit_module);
    if (ctx != NULL) {
        return ctx;
    }
    for (c = r->pool->cleanup; c != NULL; c = c->next) {
        if (c->handler == ngx_http_ratelimit_marker) {
            ngx_http_set_ctx(r, c->data, ngx_http_ratelimit_module);
            return c->data;
        }
    }
    return NULL;
}

/* The write event of a request that waits for its reservation: runs the
 * phases again once the timer fired (the limits are not decided again: the
 * request's context is there). */
static void ngx_http_ratelimit_delay(ngx_http_request_t *r) {
    ngx_event_t *wev = r->connection->write;

    if (wev->delayed && !wev->timedout) {
        if (ngx_handle_write_event(wev, 0) != NGX_OK) {
            ngx_http_finalize_request(r, NGX_HTTP_INTERNAL_SERVER_ERROR);
        }
        return;
    }
    wev->delayed = 0;
    wev->timedout = 0;
    if (ngx_handle_read_event(r->connection->read, 0) != NGX_OK) {
        ngx_http_finalize_request(r, NGX_HTTP_INTERNAL_SERVER_ERROR);
        return;
    }
    r->read_event_handler = ngx_http_block_reading;
    r->write_event_handler = ngx_http_core_run_phases;
    ngx_http_core_run_phases(r);
}

/* A decision that failed to be made (no store in this worker, a key past
 * the store's limit): the location's fail mode, as a store error. */
static void ngx_http_ratelimit_store_error(rate_decision_t *d, int rc,
                                           ngx_uint_t fail_open) {
    ngx_memzero(d, sizeof(*d));
    d->reason = RATE_REASON_STORE_ERROR;
    d->error = rc;
    d->allowed = fail_open != 0;
    d->component = -1;
}

/* The request's key for limit l: its value, or for a value longer than
 * the zone keeps (key_max= on shared memory, RATE_KEY_MAX on Redis) its
 * SHA-1 digest, cut to that length, so that a client cannot pick a key
 * too long to limit (docs/nginx.md).  NGX_ERROR on a failed evaluation. */
static ngx_int_t ngx_http_ratelimit_key(ngx_http_request_t *r,
                                        ngx_http_ratelimit_limit_t *l,
                                        ngx_str_t *key) {
    ngx_http_ratelimit_zone_t *z = l->zone;
    size_t max = z->redis.url != NULL ? RATE_KEY_MAX : z->options.key_max;
    u_char digest[20];
    ngx_sha1_t sha1;

    if (ngx_http_complex_value(r, &l->key, key) != NGX_OK) {
        return NGX_ERROR;
    }
    if (key->len <= max) {
        return NGX_OK;
    }
    ngx_sha1_init(&sha1);
    ngx_sha1_update(&sha1, key->data, key->len);
    ngx_sha1_final(digest, &sha1);
    key->len = ngx_min(max, sizeof(digest));
    key->data = ngx_pnalloc(r->pool, key->len);
    if (key->data == NULL) {
        return NGX_ERROR;
    }
    ngx_memcpy(key->data, digest, key->len);
    return NGX_OK;
}

/* A store error's line: at most one a second for each zone in a worker
 * (an outage would write one a request), with the count of those left out
 * since the last one, and why when the store knows (a Redis zone: its last
 * connection's failure, rate_store_redis_last_error; a zone's policy
 * records used up). */
static void ngx_http_ratelimit_log_store_error(ngx_http_request_t *r,
                                               ngx_http_ratelimit_zone_t *z,
                                               const rate_decision_t *d) {
    char why[256], quiet[64];

    if (z->error_logged == ngx_time()) {
        z->error_quiet++;
        return;
    }
    why[0] = '\0';
    if (d->error == RATE_EFULL && z->redis.url == NULL) {
        /* (a state always fits: state_max follows from the policy) */
        ngx_snprintf((u_char *)why, sizeof(why) - 1,
                     " (the zone's %uD policy records are used: each policy "
                     "text it had since nginx started takes one; restart "
                     "nginx)%Z",
                     z->options.max_policies != 0 ? z->options.max_policies
                                                  : (uint32_t)64);
    } else if (z->redis.url != NULL && z->store != NULL) {
        char err[200];

        err[0] = '\0';
        if (rate_store_redis_last_error(z->store, err, sizeof(err)) ==
                RATE_OK &&
            err[0] != '\0') {
            ngx_http_ratelimit_mask_msg(&z->redis, err, why + 2,
                                        sizeof(why) - 3);
            why[0] = ' ';
            why[1] = '(';
            ngx_cpystrn((u_char *)why + ngx_strlen(why), (u_char *)")", 2);
        }
    }
    quiet[0] = '\0';
    if (z->error_quiet > 0) {
        ngx_snprintf((u_char *)quiet, sizeof(quiet) - 1, " (%ui more since)%Z",
                     z->error_quiet);
    }
    z->error_logged = ngx_time();
    z->error_quiet = 0;
    ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                  "ratelimit: zone \"%V\": store error %s%s, %s%s", &z->name,
                  rate_err_name(d->error), why,
                  d->allowed ? "let through (ratelimit_fail open)"
                             : "denied (ratelimit_fail closed)",
                  quiet);
}

/* Takes the decision just made, ctx->d[ctx->n], into account. */
static void ngx_http_ratelimit_account(ngx_http_request_t *r,
                                       ngx_http_ratelimit_ctx_t *ctx) {
    rate_decision_t *d = &ctx->d[ctx->n];

    ctx->n++;
    if (d->reason == RATE_REASON_STORE_ERROR) {
        ctx->errors++;
        ngx_http_ratelimit_log_store_error(r, ctx->zone[ctx->n - 1], d);
    }
    if (!d->allowed || d->shadow) {
        ctx->denied = (ngx_int_t)(ctx->n - 1);
    } else if (d->delay_ns > ctx->delay_ns) {
        ctx->delay_ns = d->delay_ns;
    }
}

/* A refund's end on a Redis zone (rate_limiter_refund_start), on the
 * worker's loop: counted; a failure logged, at most one line a second. */
static void ngx_http_ratelimit_refunded(void *ud, int rc) {
    ngx_http_ratelimit_zone_t *z = ud;

    if (rc == RATE_OK) {
        ngx_http_ratelimit_refunds_made++;
        return;
    }
    if (rc == RATE_ECANCELED) { /* the store freed first: the exit */
        ngx_http_ratelimit_refunds_dropped++;
        return;
    }
    ngx_http_ratelimit_refunds_failed++;
    if (ngx_time() == ngx_http_ratelimit_refunds_logged) {
        ngx_http_ratelimit_refunds_quiet++;
        return;
    }
    ngx_http_ratelimit_refunds_logged = ngx_time();
    ngx_log_error(NGX_LOG_WARN, ngx_cycle->log, 0,
                  "ratelimit: zone \"%V\": a refund failed: %s: the permit "
                  "stays charged (%uL more since)",
                  &z->name, rate_err_name(rc),
                  ngx_http_ratelimit_refunds_quiet);
    ngx_http_ratelimit_refunds_quiet = 0;
}

/* Gives back one permit of key on zone z: at once on a shared-memory zone
 * (local); on a Redis zone without waiting (rate_limiter_refund_start:
 * its end comes to ngx_http_ratelimit_refunded), the request going on. */
static void ngx_http_ratelimit_refund(ngx_http_ratelimit_zone_t *z,
                                      rate_limiter_t *lim, ngx_str_t *key) {
    int rc;

    if (z->fair.on) { /* the zone's one key, whichever key asked */
        (void)rate_limiter_refund(lim, (const char *)z->name.data,
                                  z->name.len, 1);
        return;
    }
    if (z->redis.url == NULL) {
        (void)rate_limiter_refund(lim, (const char *)key->data, key->len, 1);
        return;
    }
    rc = rate_limiter_refund_start(lim, (const char *)key->data, key->len, 1,
                                   ngx_http_ratelimit_refunded, z);
    if (rc != RATE_PENDING) {
        ngx_http_ratelimit_refunded(z, rc);
    }
}

/* Every limit decided (or one denied): the request's outcome, which the
 * access-phase handler returns. */
static ngx_int_t ngx_http_ratelimit_finish(ngx_http_request_t *r,
                                           ngx_http_ratelimit_ctx_t *ctx) {
    ngx_http_ratelimit_loc_conf_t *rlcf = ctx->rlcf;
    ngx_http_ratelimit_limit_t *limit = rlcf->limits->elts, *l;
    rate_limiter_t *lim;
    rate_decision_t *d;
    ngx_str_t key;
    ngx_uint_t j;

    if (ctx->denied >= 0) {
        d = &ctx->d[ctx->denied];
        /* Nothing is charged on a denial: give back what the limits
         * before the denying one admitted (under shadow, the shadow
         * state's, as enforcing would): ngx_http_ratelimit_refund. */
        for (j = 0; j < (ngx_uint_t)ctx->denied; j++) {
            if (ctx->d[j].reason != RATE_REASON_ALLOWED) {
                continue;
            }
            l = &limit[ctx->limit_of[j]];
            lim = ctx->zone[j]->limiter[rlcf->shadow ? 1 : 0]
                                       [rlcf->fail_open];
            if (lim == NULL ||
                ngx_http_ratelimit_key(r, l, &key) != NGX_OK) {
                continue;
            }
            ngx_http_ratelimit_refund(ctx->zone[j], lim, &key);
        }
        if (d->reason == RATE_REASON_STORE_ERROR) {
            ctx->result = NGX_HTTP_RATELIMIT_ERROR;
            return NGX_HTTP_SERVICE_UNAVAILABLE;
        }
        if (d->shadow) {
            /* (the library gives a shadow decision no retry_after) */
            ngx_log_error(rlcf->log_level, r->connection->log, 0,
                          "ratelimit: would limit (shadow) requests by "
                          "zone \"%V\"",
                          &ctx->zone[ctx->denied]->name);
        } else if (d->retry_after_ns == RATE_NEVER) {
            ngx_log_error(rlcf->log_level, r->connection->log, 0,
                          "ratelimit: limiting requests by zone \"%V\", "
                          "never admitted (more than the limit holds)",
                          &ctx->zone[ctx->denied]->name);
        } else {
            /* in whole ms rounded up, as Retry-After's seconds are */
            ngx_log_error(rlcf->log_level, r->connection->log, 0,
                          "ratelimit: limiting requests by zone \"%V\", "
                          "retry after %uL ms",
                          &ctx->zone[ctx->denied]->name,
                          (d->retry_after_ns + 999999) / 1000000);
        }
        if (d->shadow) {
            ctx->result = NGX_HTTP_RATELIMIT_SHADOW;
            return NGX_DECLINED;
        }
        ctx->result = NGX_HTTP_RATELIMIT_LIMITED;
        return (ngx_int_t)rlcf->status;
    }
    if (ctx->n > 0) {
        ctx->result =
            ctx->errors ? NGX_HTTP_RATELIMIT_ERROR : NGX_HTTP_RATELIMIT_ALLOWED;
    }
    if (ctx->delay_ns > 0 && !rlcf->shadow) {
        /* A reservation (wait=): the request waits on a timer of the
         * worker's loop, then goes on through the phases (not under
         * shadow, which enforces nothing). */
        ngx_msec_t ms = (ngx_msec_t)((ctx->delay_ns + 999999) / 1000000);

        r->read_event_handler = ngx_http_test_reading;
        r->write_event_handler = ngx_http_ratelimit_delay;
        r->connection->write->delayed = 1;
        ngx_add_timer(r->connection->write, ms);
        return NGX_AGAIN;
    }
    return NGX_DECLINED;
}

/* A Redis decision in flight: its callback's user data, outside the
 * request's pool, so that a request finalized meanwhile (the client went
 * away) is let go by its pool's cleanup and never touched again. */
typedef struct {
    ngx_http_request_t *r; /* NULL once the request is gone */
    ngx_http_ratelimit_ctx_t *ctx;
    ngx_pool_cleanup_t *cln; /* the pool's: when the request is freed */
    ngx_http_cleanup_t *hcln; /* the request's: when it is terminated */
} ngx_http_ratelimit_pending_t;

static void ngx_http_ratelimit_pending_cleanup(void *data) {
    ngx_http_ratelimit_pending_t *p = data;

    p->r = NULL;
}

static ngx_int_t ngx_http_ratelimit_run(ngx_http_request_t *r,
                                        ngx_http_ratelimit_ctx_t *ctx);

/* The write event of a request whose Redis decision came back: decides
 * the location's next limits, then runs the phases again (the handler
 * then returns the outcome). */
static void ngx_http_ratelimit_resume(ngx_http_request_t *r) {
    ngx_http_ratelimit_ctx_t *ctx = ngx_http_ratelimit_find_ctx(r);
    ngx_int_t rc;

    if (ctx == NULL) { /* not ours: cannot be, but do not hang */
        ngx_http_finalize_request(r, NGX_HTTP_INTERNAL_SERVER_ERROR);
        return;
    }
    rc = ngx_http_ratelimit_run(r, ctx);
    if (rc == NGX_AGAIN) {
        return; /* the next Redis decision, or a wait= reservation */
    }
    ctx->final = rc;
    r->read_event_handler = ngx_http_block_reading;
    r->write_event_handler = ngx_http_core_run_phases;
    ngx_http_core_run_phases(r);
}

/* A Redis decision's callback, on the worker's loop: the decision goes
 * into the request's context and the request is resumed from a posted
 * event (outside the store's and hiredis's calls). */
static void ngx_http_ratelimit_decided(void *ud, int rc,
                                       const rate_decision_t *decision) {
    ngx_http_ratelimit_pending_t *p = ud;
    ngx_http_request_t *r = p->r;
    ngx_http_ratelimit_ctx_t *ctx = p->ctx;

    if (r == NULL) { /* the request went while Redis decided */
        ngx_free(p);
        return;
    }
    p->cln->handler = NULL;
    p->hcln->handler = NULL;
    ngx_free(p);
    if (ngx_http_ratelimit_exiting) {
        return; /* the worker is exiting: the store is being freed */
    }
    ctx->pending = 0;
    if (rc == RATE_OK) {
        ctx->d[ctx->n] = *decision;
    } else {
        ngx_http_ratelimit_store_error(&ctx->d[ctx->n], rc,
                                       ctx->rlcf->fail_open);
    }
    ngx_http_ratelimit_account(r, ctx);
    ctx->next++;
    r->write_event_handler = ngx_http_ratelimit_resume;
    ngx_post_event(r->connection->write, &ngx_posted_events);
}

/* Decides the location's limits in turn from ctx->next, until one denies
 * or all passed (then the outcome: ngx_http_ratelimit_finish), or one is
 * a Redis decision under way (NGX_AGAIN: its callback resumes). */
static ngx_int_t ngx_http_ratelimit_run(ngx_http_request_t *r,
                                        ngx_http_ratelimit_ctx_t *ctx) {
    ngx_http_ratelimit_loc_conf_t *rlcf = ctx->rlcf;
    ngx_http_ratelimit_limit_t *limit = rlcf->limits->elts;
    ngx_http_ratelimit_pending_t *p;
    ngx_http_ratelimit_zone_t *z;
    rate_limiter_t *lim;
    rate_decision_t *d;
    ngx_str_t key;
    ngx_uint_t i;
    int rc;

    while (ctx->next < rlcf->limits->nelts && ctx->denied < 0) {
        i = ctx->next;
        if (ngx_http_ratelimit_key(r, &limit[i], &key) != NGX_OK) {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }
        if (key.len == 0) {
            ctx->next++;
            continue; /* an empty key is not limited */
        }
        z = limit[i].zone;
        d = &ctx->d[ctx->n];
        ctx->zone[ctx->n] = z;
        ctx->limit_of[ctx->n] = i;
        lim = z->limiter[rlcf->shadow ? 1 : 0][rlcf->fail_open];
        if (lim == NULL) {
            rc = RATE_ESTORE;
        } else if (z->redis.url != NULL) {
            p = ngx_alloc(sizeof(*p), r->connection->log);
            if (p == NULL) {
                return NGX_HTTP_INTERNAL_SERVER_ERROR;
            }
            p->r = r;
            p->ctx = ctx;
            p->cln = NULL;
            p->hcln = NULL;
            rc = rate_limiter_check_start(lim, (const char *)key.data,
                                          key.len, 1, limit[i].max_wait_ns,
                                          d, ngx_http_ratelimit_decided, p);
            if (rc == RATE_PENDING) {
                /* Let go of the request when it is terminated (a client
                 * gone, an error) and, in any case, when its pool goes. */
                p->cln = ngx_pool_cleanup_add(r->pool, 0);
                p->hcln = p->cln != NULL ? ngx_http_cleanup_add(r, 0) : NULL;
                if (p->hcln == NULL) {
                    if (p->cln != NULL) {
                        p->cln->handler = NULL;
                    }
                    p->r = NULL; /* the callback lets go of it */
                    return NGX_HTTP_INTERNAL_SERVER_ERROR;
                }
                p->cln->handler = ngx_http_ratelimit_pending_cleanup;
                p->cln->data = p;
                p->hcln->handler = ngx_http_ratelimit_pending_cleanup;
                p->hcln->data = p;
                ctx->pending = 1;
                /* Meanwhile a client that goes away finalizes the
                 * request (the cleanup lets go of it). */
                r->read_event_handler = ngx_http_test_reading;
                r->write_event_handler = ngx_http_request_empty_handler;
                return NGX_AGAIN;
            }
            ngx_free(p); /* decided at once (or no decision) */
        } else if (z->fair.on) {
            rc = ngx_http_ratelimit_fair_check(r, &z->fair, rlcf->shadow,
                                               rlcf->fail_open, &key,
                                               limit[i].weight, d);
        } else {
            rc = rate_limiter_check(lim, (const char *)key.data, key.len, 1,
                                    limit[i].max_wait_ns, d);
        }
        if (rc != RATE_OK) {
            ngx_http_ratelimit_store_error(d, rc, rlcf->fail_open);
        }
        ngx_http_ratelimit_account(r, ctx);
        ctx->next++;
    }
    return ngx_http_ratelimit_finish(r, ctx);
}

static ngx_int_t ngx_http_ratelimit_handler(ngx_http_request_t *r) {
    ngx_http_ratelimit_loc_conf_t *rlcf;
    ngx_http_ratelimit_ctx_t *ctx;
    ngx_pool_cleanup_t *cln;
    ngx_int_t rc;

    if (r != r->main) {
        return NGX_DECLINED;
    }
    ctx = ngx_http_ratelimit_find_ctx(r);
    if (ctx != NULL) {
        /* Decided (or deciding): a Redis decision in flight waits; the
         * phases run again after the last one return its outcome, once;
         * then (an internal redirect) the request is not decided again. */
        if (ctx->pending) {
            return NGX_AGAIN;
        }
        rc = ctx->final;
        ctx->final = NGX_DECLINED;
        return rc;
    }
    rlcf = ngx_http_get_module_loc_conf(r, ngx_http_ratelimit_module);
    if (rlcf->limits == NULL) {
        return NGX_DECLINED;
    }
    ctx = ngx_pcalloc(r->pool, sizeof(*ctx) + rlcf->limits->nelts *
                                                    sizeof(rate_decision_t));
    cln = ngx_pool_cleanup_add(r->pool, 0);
    if (ctx == NULL || cln == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }
    ctx->result = NGX_HTTP_RATELIMIT_NONE;
    ctx->denied = -1;
    /* Shadow mode sends no field: the limit is not enforced. */
    ctx->headers = rlcf->headers && !rlcf->shadow;
    ctx->rlcf = rlcf;
    ctx->final = NGX_DECLINED;
    cln->handler = ngx_http_ratelimit_marker;
    cln->data = ctx;
    ngx_http_set_ctx(r, ctx, ngx_http_ratelimit_module);
    return ngx_http_ratelimit_run(r, ctx);
}

/* ------------------------------------------------------------ headers */

static ngx_int_t ngx_http_ratelimit_add_header(ngx_http_request_t *r,
                                               const char *name, u_char *v,
                                               size_t len) {
    ngx_table_elt_t *h;

    h = ngx_list_push(&r->headers_out.headers);
    if (h == NULL) {
        return NGX_ERROR;
    }
    h->hash = 1;
    h->key.data = (u_char *)name;
    h->key.len = ngx_strlen(name);
    h->value.data = v;
    h->value.len = len;
    h->lowcase_key = NULL;
    return NGX_OK;
}

/* Appends `s` to the list field `*f` (", " between items), in r's pool. */
static ngx_int_t ngx_http_ratelimit_append(ngx_http_request_t *r,
                                           ngx_str_t *f, const char *s) {
    size_t n = ngx_strlen(s);
    u_char *p;

    if (n == 0) {
        return NGX_OK;
    }
    p = ngx_pnalloc(r->pool, f->len + 2 + n);
    if (p == NULL) {
        return NGX_ERROR;
    }
    if (f->len) {
        ngx_memcpy(p, f->data, f->len);
        p[f->len] = ',';
        p[f->len + 1] = ' ';
        ngx_memcpy(p + f->len + 2, s, n);
        f->len += 2 + n;
    } else {
        ngx_memcpy(p, s, n);
        f->len = n;
    }
    f->data = p;
    return NGX_OK;
}

static ngx_int_t ngx_http_ratelimit_header_filter(ngx_http_request_t *r) {
    ngx_http_ratelimit_ctx_t *ctx;
    ngx_str_t pol = ngx_null_string, rl = ngx_null_string, ra;
    rate_headers_t h;
    ngx_uint_t i, from, to;

    if (r != r->main) {
        return ngx_http_next_header_filter(r);
    }
    ctx = ngx_http_ratelimit_find_ctx(r);
    if (ctx == NULL || !ctx->headers || ctx->n == 0) {
        return ngx_http_next_header_filter(r);
    }
    ctx->headers = 0; /* once */
    ra.len = 0;
    ra.data = NULL;
    /* Allowed: every limit's fields; denied: the denying limit's (the
     * others were refunded). */
    from = ctx->denied >= 0 ? (ngx_uint_t)ctx->denied : 0;
    to = ctx->denied >= 0 ? from + 1 : ctx->n;
    for (i = from; i < to; i++) {
        if (rate_headers_format(ctx->zone[i]->policy, &ctx->d[i], &h) !=
            RATE_OK) {
            continue;
        }
        if (ngx_http_ratelimit_append(r, &pol, h.policy) != NGX_OK ||
            ngx_http_ratelimit_append(r, &rl, h.ratelimit) != NGX_OK) {
            return NGX_ERROR;
        }
        if (h.retry_after[0] != '\0' && ra.len == 0) {
            ra.len = ngx_strlen(h.retry_after);
            ra.data = ngx_pnalloc(r->pool, ra.len);
            if (ra.data == NULL) {
                return NGX_ERROR;
            }
            ngx_memcpy(ra.data, h.retry_after, ra.len);
        }
    }
    if ((pol.len && ngx_http_ratelimit_add_header(r, "RateLimit-Policy",
                                                  pol.data, pol.len) !=
                        NGX_OK) ||
        (rl.len && ngx_http_ratelimit_add_header(r, "RateLimit", rl.data,
                                                 rl.len) != NGX_OK) ||
        (ra.len && ngx_http_ratelimit_add_header(r, "Retry-After", ra.data,
                                                 ra.len) != NGX_OK)) {
        return NGX_ERROR;
    }
    return ngx_http_next_header_filter(r);
}

/* ------------------------------------------------------------ variable */

static ngx_int_t ngx_http_ratelimit_result_variable(ngx_http_request_t *r,
                                                    ngx_http_variable_value_t *v,
                                                    uintptr_t data) {
    ngx_http_ratelimit_ctx_t *ctx = ngx_http_ratelimit_find_ctx(r);

    (void)data;
    if (ctx == NULL || ctx->result == NGX_HTTP_RATELIMIT_NONE) {
        v->not_found = 1;
        return NGX_OK;
    }
    v->data = ngx_http_ratelimit_result_names[ctx->result].data;
    v->len = (unsigned)ngx_http_ratelimit_result_names[ctx->result].len;
    v->valid = 1;
    v->no_cacheable = 1;
    v->not_found = 0;
    return NGX_OK;
}

static ngx_int_t ngx_http_ratelimit_preconf(ngx_conf_t *cf) {
    ngx_str_t name = ngx_string("ratelimit_result");
    ngx_http_variable_t *var;

    var = ngx_http_add_variable(cf, &name, NGX_HTTP_VAR_NOCACHEABLE);
    if (var == NULL) {
        return NGX_ERROR;
    }
    var->get_handler = ngx_http_ratelimit_result_variable;
    return NGX_OK;
}

static ngx_int_t ngx_http_ratelimit_postconf(ngx_conf_t *cf) {
    ngx_http_core_main_conf_t *cmcf;
    ngx_http_handler_pt *h;

    cmcf = ngx_http_conf_get_module_main_conf(cf, ngx_http_core_module);
    h = ngx_array_push(&cmcf->phases[NGX_HTTP_PREACCESS_PHASE].handlers);
    if (h == NULL) {
        return NGX_ERROR;
    }
    *h = ngx_http_ratelimit_handler;

    ngx_http_next_header_filter = ngx_http_top_header_filter;
    ngx_http_top_header_filter = ngx_http_ratelimit_header_filter;
    return NGX_OK;
}
