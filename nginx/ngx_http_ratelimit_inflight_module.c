/* SPDX-License-Identifier: MIT */
/*
 * ngx_http_ratelimit_inflight_module: in-flight limits (docs/leases.md) in
 * nginx: at most N requests of a key at once across the workers, each
 * holding a lease in a shared-memory store kept in an nginx shared zone
 * (or, store=redis://, in Redis, across every nginx that shares it),
 * released when the request's pool is destroyed: however the request
 * ends (answered, failed, the client gone).  A module of its own beside
 * ngx_http_ratelimit_module, in the same .so (docs/nginx.md, "In-flight
 * limits").
 */
#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include <ratelimit.h>
#include <ratelimit_lease.h>
#include <ratelimit_redis.h>
#include <ratelimit_shm.h>

#include "ngx_http_ratelimit_conf.h"

#define NGX_HTTP_INFLIGHT_KEYS_DEFAULT 10000
#define NGX_HTTP_INFLIGHT_KEY_MAX 128

typedef struct {
    ngx_str_t name;
    rate_inflight_policy_t *policy;
    rate_shm_options_t options;
    size_t region_size, zone_size;
    void *region;             /* in the shared zone */
    ngx_shm_zone_t *shm_zone;
    ngx_http_ratelimit_redis_t redis; /* store=redis://; url NULL: shm */
    rate_store_t *store;      /* a worker's, over the region or Redis */
    rate_inflight_t *inflight; /* a worker's */
    time_t error_logged;      /* a worker's last store-error line */
    ngx_uint_t error_quiet;   /* lines left out since */
#if (NGX_THREADS)
    ngx_thread_pool_t *tp;    /* a Redis zone's: where its calls wait */
    pthread_mutex_t attach;   /* its store made by the first call's thread */
#endif
} ngx_http_inflight_zone_t;

typedef struct {
    ngx_array_t zones; /* of ngx_http_inflight_zone_t * */
} ngx_http_inflight_main_conf_t;

typedef struct {
    ngx_http_inflight_zone_t *zone; /* NULL: none here */
    ngx_http_complex_value_t key;
    ngx_http_complex_value_t *critical; /* critical=VALUE, or NULL */
    ngx_uint_t status;
    ngx_uint_t fail_open; /* a store error lets the request through */
} ngx_http_inflight_loc_conf_t;

/* A held lease, released by the request pool's cleanup. */
typedef struct {
    ngx_http_inflight_zone_t *zone;
    rate_lease_t lease;
    ngx_str_t key;
    ngx_log_t *log;
} ngx_http_inflight_held_t;

/* A request's decision, kept while a thread acquires (a Redis zone):
 * the phases rerun the handler, which answers `final` then. */
typedef struct {
    ngx_flag_t pending;
    ngx_int_t final;
    ngx_http_inflight_held_t *h;
    ngx_pool_cleanup_t *cln;
    ngx_uint_t status, fail_open;
    rate_lease_class_t cls;
    rate_decision_t d;
    int rc;
} ngx_http_inflight_ctx_t;

/* A release handed to a thread: it outlives the request's pool. */
typedef struct {
    ngx_http_inflight_zone_t *zone;
    rate_lease_t lease;
    size_t key_len;
    int rc;
    u_char key[1]; /* key_len bytes */
} ngx_http_inflight_release_t;

static ngx_int_t ngx_http_inflight_postconf(ngx_conf_t *cf);
static void *ngx_http_inflight_create_main_conf(ngx_conf_t *cf);
static void *ngx_http_inflight_create_loc_conf(ngx_conf_t *cf);
static char *ngx_http_inflight_merge_loc_conf(ngx_conf_t *cf, void *parent,
                                              void *child);
static char *ngx_http_inflight_zone(ngx_conf_t *cf, ngx_command_t *cmd,
                                    void *conf);
static char *ngx_http_inflight(ngx_conf_t *cf, ngx_command_t *cmd,
                               void *conf);
static ngx_int_t ngx_http_inflight_init_process(ngx_cycle_t *cycle);
static void ngx_http_inflight_exit_process(ngx_cycle_t *cycle);

static ngx_conf_enum_t ngx_http_inflight_fail_modes[] = {
    {ngx_string("closed"), 0}, {ngx_string("open"), 1}, {ngx_null_string, 0}};

static ngx_command_t ngx_http_inflight_commands[] = {
    {ngx_string("ratelimit_inflight_zone"),
     NGX_HTTP_MAIN_CONF | NGX_CONF_2MORE, ngx_http_inflight_zone,
     NGX_HTTP_MAIN_CONF_OFFSET, 0, NULL},
    {ngx_string("ratelimit_inflight_fail"),
     NGX_HTTP_MAIN_CONF | NGX_HTTP_SRV_CONF | NGX_HTTP_LOC_CONF |
         NGX_CONF_TAKE1,
     ngx_http_ratelimit_enum_slot, NGX_HTTP_LOC_CONF_OFFSET,
     offsetof(ngx_http_inflight_loc_conf_t, fail_open),
     ngx_http_inflight_fail_modes},
    {ngx_string("ratelimit_inflight"),
     NGX_HTTP_MAIN_CONF | NGX_HTTP_SRV_CONF | NGX_HTTP_LOC_CONF |
         NGX_CONF_TAKE23,
     ngx_http_inflight, NGX_HTTP_LOC_CONF_OFFSET, 0, NULL},
    {ngx_string("ratelimit_inflight_status"),
     NGX_HTTP_MAIN_CONF | NGX_HTTP_SRV_CONF | NGX_HTTP_LOC_CONF |
         NGX_CONF_TAKE1,
     ngx_http_ratelimit_status_slot, NGX_HTTP_LOC_CONF_OFFSET,
     offsetof(ngx_http_inflight_loc_conf_t, status), NULL},
    ngx_null_command};

static ngx_http_module_t ngx_http_inflight_module_ctx = {
    NULL, ngx_http_inflight_postconf,
    ngx_http_inflight_create_main_conf, NULL,
    NULL, NULL,
    ngx_http_inflight_create_loc_conf, ngx_http_inflight_merge_loc_conf};

ngx_module_t ngx_http_ratelimit_inflight_module = {
    NGX_MODULE_V1,
    &ngx_http_inflight_module_ctx,
    ngx_http_inflight_commands,
    NGX_HTTP_MODULE,
    NULL, NULL,
    ngx_http_inflight_init_process, NULL, NULL,
    ngx_http_inflight_exit_process, NULL,
    NGX_MODULE_V1_PADDING};

static void ngx_http_inflight_policy_cleanup(void *data) {
    rate_inflight_policy_free(data);
}

/* The zone's init, in the master: the region is made (or, on a reload
 * that keeps the zone, attached to again). */
static ngx_int_t ngx_http_inflight_init_zone(ngx_shm_zone_t *shm_zone,
                                             void *data) {
    ngx_http_inflight_zone_t *z = shm_zone->data;
    ngx_flag_t made;

    return ngx_http_ratelimit_shm_region(shm_zone, data,
                                         "ratelimit_inflight_zone", &z->name,
                                         &z->options, z->region_size,
                                         z->region_size, &z->region, &made);
}

/* ratelimit_inflight_zone NAME "concurrency N ttl=DUR [reserve=K]"
 * [keys=N] | [store=redis://... [timeout=DUR] [prefix=P]]; */
static char *ngx_http_inflight_zone(ngx_conf_t *cf, ngx_command_t *cmd,
                                    void *conf) {
    ngx_http_inflight_main_conf_t *mcf = conf;
    ngx_str_t *value = cf->args->elts;
    ngx_http_inflight_zone_t *z, **zp;
    ngx_pool_cleanup_t *cln;
    uint64_t keys = NGX_HTTP_INFLIGHT_KEYS_DEFAULT;
    ngx_http_ratelimit_store_args_t store;
    ngx_str_t *shm_only = NULL;
    char err[256], *text;
    ngx_uint_t i;
    ngx_int_t prc;
    int rc;

    (void)cmd;
    ngx_memzero(&store, sizeof(store));
    for (i = 3; i < cf->args->nelts; i++) {
        ngx_str_t arg = value[i];
        if (ngx_http_ratelimit_param_twice(cf, "ratelimit_inflight_zone",
                                           value, 3, i) != NGX_OK) {
            return NGX_CONF_ERROR;
        }
        prc = ngx_http_ratelimit_store_param(cf, "ratelimit_inflight_zone",
                                             value, i, &store);
        if (prc == NGX_ERROR) {
            return NGX_CONF_ERROR;
        }
        if (prc == NGX_OK) {
            continue;
        }
        if (value[i].len < 5 || ngx_strncmp(value[i].data, "keys=", 5) != 0) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "ratelimit_inflight_zone \"%V\": unknown "
                               "parameter \"%V\" (keys=N, store=, timeout=, "
                               "prefix=)",
                               &value[1], &value[i]);
            return NGX_CONF_ERROR;
        }
        arg.data += 5;
        arg.len -= 5;
        if (ngx_http_ratelimit_parse_uint(&arg, &keys) != NGX_OK) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "ratelimit_inflight_zone \"%V\": \"%V\": "
                               "keys= takes a positive whole number",
                               &value[1], &value[i]);
            return NGX_CONF_ERROR;
        }
        shm_only = &value[i];
    }
    if (ngx_http_ratelimit_store_check(cf, "ratelimit_inflight_zone",
                                       &value[1], &store, shm_only) != NGX_OK) {
        return NGX_CONF_ERROR;
    }
    z = ngx_pcalloc(cf->pool, sizeof(*z));
    text = ngx_pnalloc(cf->pool, value[2].len + 1);
    if (z == NULL || text == NULL) {
        return NGX_CONF_ERROR;
    }
    z->name = value[1];
    ngx_memcpy(text, value[2].data, value[2].len);
    text[value[2].len] = '\0';
    err[0] = '\0';
    rc = rate_inflight_policy_parse(text, &z->policy, err, sizeof(err));
    if (rc != RATE_OK) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "ratelimit_inflight_zone \"%V\": bad policy "
                           "\"%V\": %s", &value[1], &value[2], err);
        return NGX_CONF_ERROR;
    }
    cln = ngx_pool_cleanup_add(cf->pool, 0);
    if (cln == NULL) {
        rate_inflight_policy_free(z->policy);
        return NGX_CONF_ERROR;
    }
    cln->handler = ngx_http_inflight_policy_cleanup;
    cln->data = z->policy;
    if (rate_inflight_policy_rate(z->policy) != NULL) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "ratelimit_inflight_zone \"%V\": \"%V\": rate "
                           "limits go on a ratelimit_zone (this zone takes "
                           "the concurrency clause alone)",
                           &value[1], &value[2]);
        return NGX_CONF_ERROR;
    }
    for (i = 0; i < mcf->zones.nelts; i++) {
        zp = mcf->zones.elts;
        if (zp[i]->name.len == z->name.len &&
            ngx_strncmp(zp[i]->name.data, z->name.data, z->name.len) == 0) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "ratelimit_inflight_zone \"%V\" is already "
                               "declared", &value[1]);
            return NGX_CONF_ERROR;
        }
    }
    if (store.url.len != 0) { /* Redis: no shared zone, each worker a store */
        if (ngx_http_ratelimit_redis_conf(cf, "ratelimit_inflight_zone",
                                          &z->name, &store,
                                          &z->redis) != NGX_OK) {
            return NGX_CONF_ERROR;
        }
#if (NGX_THREADS)
        /* The lease calls are synchronous: they wait in nginx's thread
         * pool "default" (declared, or made with nginx's defaults), not
         * in the worker's event loop. */
        z->tp = ngx_thread_pool_add(cf, NULL);
        if (z->tp == NULL) {
            return NGX_CONF_ERROR;
        }
#endif
        zp = ngx_array_push(&mcf->zones);
        if (zp == NULL) {
            return NGX_CONF_ERROR;
        }
        *zp = z;
        return NGX_CONF_OK;
    }
    z->options.max_keys = keys;
    z->options.key_max = NGX_HTTP_INFLIGHT_KEY_MAX;
    z->options.state_max =
        (uint32_t)ngx_max(rate_inflight_policy_state_max(z->policy), 96);
    z->region_size = rate_store_shm_size(&z->options);
    if (z->region_size == 0) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "ratelimit_inflight_zone \"%V\": the shared-memory "
                           "store refuses keys=%uL with this policy",
                           &value[1], keys);
        return NGX_CONF_ERROR;
    }
    z->zone_size = z->region_size + z->region_size / 128 + 16 * ngx_pagesize;
    z->shm_zone = ngx_http_ratelimit_shm_add(
        cf, "ratelimit_inflight_zone", &z->name, z->zone_size,
        &ngx_http_ratelimit_inflight_module, ngx_http_inflight_init_zone, z);
    if (z->shm_zone == NULL) {
        return NGX_CONF_ERROR;
    }
    zp = ngx_array_push(&mcf->zones);
    if (zp == NULL) {
        return NGX_CONF_ERROR;
    }
    *zp = z;
    return NGX_CONF_OK;
}

/* ratelimit_inflight NAME KEY [critical=VALUE]; */
static char *ngx_http_inflight(ngx_conf_t *cf, ngx_command_t *cmd,
                               void *conf) {
    ngx_http_inflight_loc_conf_t *lcf = conf;
    ngx_http_inflight_main_conf_t *mcf;
    ngx_http_compile_complex_value_t ccv;
    ngx_str_t *value = cf->args->elts;
    ngx_http_inflight_zone_t **zp;
    ngx_uint_t i;

    (void)cmd;
    if (lcf->zone != NULL) {
        return "is duplicate (one in-flight limit a location)";
    }
    mcf = ngx_http_conf_get_module_main_conf(cf,
                                             ngx_http_ratelimit_inflight_module);
    zp = mcf->zones.elts;
    for (i = 0; i < mcf->zones.nelts; i++) {
        if (zp[i]->name.len == value[1].len &&
            ngx_strncmp(zp[i]->name.data, value[1].data, value[1].len) == 0) {
            lcf->zone = zp[i];
        }
    }
    if (lcf->zone == NULL) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "ratelimit_inflight: no ratelimit_inflight_zone "
                           "\"%V\" (declare it above, in http)", &value[1]);
        return NGX_CONF_ERROR;
    }
    if (value[2].len == 0) {
        return "has an empty key: it would limit nothing";
    }
    ngx_memzero(&ccv, sizeof(ccv));
    ccv.cf = cf;
    ccv.value = &value[2];
    ccv.complex_value = &lcf->key;
    if (ngx_http_compile_complex_value(&ccv) != NGX_OK) {
        return NGX_CONF_ERROR;
    }
    if (cf->args->nelts == 4) {
        ngx_str_t v = value[3];
        if (v.len == 9 && ngx_strncmp(v.data, "critical=", 9) == 0) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "ratelimit_inflight: \"critical=\" needs a "
                               "value (critical=VALUE)");
            return NGX_CONF_ERROR;
        }
        if (v.len < 10 || ngx_strncmp(v.data, "critical=", 9) != 0) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "ratelimit_inflight: unknown parameter "
                               "\"%V\" (critical=VALUE)", &value[3]);
            return NGX_CONF_ERROR;
        }
        v.data += 9;
        v.len -= 9;
        lcf->critical = ngx_palloc(cf->pool, sizeof(*lcf->critical));
        if (lcf->critical == NULL) {
            return NGX_CONF_ERROR;
        }
        ngx_memzero(&ccv, sizeof(ccv));
        ccv.cf = cf;
        ccv.value = &v;
        ccv.complex_value = lcf->critical;
        if (ngx_http_compile_complex_value(&ccv) != NGX_OK) {
            return NGX_CONF_ERROR;
        }
    }
    return NGX_CONF_OK;
}

static void *ngx_http_inflight_create_main_conf(ngx_conf_t *cf) {
    ngx_http_inflight_main_conf_t *mcf = ngx_pcalloc(cf->pool, sizeof(*mcf));
    if (mcf == NULL ||
        ngx_array_init(&mcf->zones, cf->pool, 4, sizeof(void *)) != NGX_OK) {
        return NULL;
    }
    return mcf;
}

static void *ngx_http_inflight_create_loc_conf(ngx_conf_t *cf) {
    ngx_http_inflight_loc_conf_t *lcf = ngx_pcalloc(cf->pool, sizeof(*lcf));
    if (lcf == NULL) {
        return NULL;
    }
    lcf->status = NGX_CONF_UNSET_UINT;
    lcf->fail_open = NGX_CONF_UNSET_UINT;
    return lcf;
}

static char *ngx_http_inflight_merge_loc_conf(ngx_conf_t *cf, void *parent,
                                              void *child) {
    ngx_http_inflight_loc_conf_t *prev = parent, *conf = child;
    (void)cf;
    if (conf->zone == NULL) {
        conf->zone = prev->zone;
        conf->key = prev->key;
        conf->critical = prev->critical;
    }
    ngx_conf_merge_uint_value(conf->status, prev->status, 503);
    ngx_conf_merge_uint_value(conf->fail_open, prev->fail_open, 0);
    return NGX_CONF_OK;
}

/* ------------------------------------------------------------ workers */

static ngx_http_inflight_main_conf_t *
ngx_http_inflight_main(ngx_cycle_t *cycle) {
    ngx_http_conf_ctx_t *ctx =
        (ngx_http_conf_ctx_t *)ngx_get_conf(cycle->conf_ctx, ngx_http_module);
    return ctx == NULL
               ? NULL
               : ctx->main_conf[ngx_http_ratelimit_inflight_module.ctx_index];
}

/* A Redis zone's store and inflight object, for this worker.  Even lazy,
 * the store tries Redis once as it is made (up to twice timeout= against
 * a server that never answers): with threads, the first acquire's thread
 * makes it, so that the worker never waits for Redis. */
static int ngx_http_inflight_attach_redis(ngx_http_inflight_zone_t *z,
                                          char *err, size_t errlen) {
    int rc = rate_store_redis_new(z->redis.url, &z->redis.options, &z->store,
                                  err, errlen);
    if (rc == RATE_OK) {
        /* Leases are granted and checked by every host that shares the
         * zone: one clock, the wall's (NTP's skew between hosts lengthens
         * or shortens a lease by as much: docs/leases.md). */
        rate_inflight_config_t cfg = {.policy = z->policy,
                                      .store = z->store,
                                      .clock = rate_clock_wall()};
        rc = rate_inflight_new(&cfg, &z->inflight);
    }
    if (rc != RATE_OK) {
        rate_store_free(z->store);
        z->store = NULL;
        z->inflight = NULL;
    }
    return rc;
}

static ngx_int_t ngx_http_inflight_init_process(ngx_cycle_t *cycle) {
    ngx_http_inflight_main_conf_t *mcf = ngx_http_inflight_main(cycle);
    ngx_http_inflight_zone_t **zp;
    char err[256];
    ngx_uint_t i;

    if (mcf == NULL) {
        return NGX_OK;
    }
    zp = mcf->zones.elts;
    for (i = 0; i < mcf->zones.nelts; i++) {
        ngx_http_inflight_zone_t *z = zp[i];
        rate_shm_options_t opt = z->options;
        int rc;
        err[0] = '\0';
#if (NGX_THREADS)
        if (z->tp != NULL) { /* made by the first acquire's thread */
            pthread_mutex_init(&z->attach, NULL);
            continue;
        }
#endif
        if (z->redis.url != NULL) {
            rc = ngx_http_inflight_attach_redis(z, err, sizeof(err));
        } else {
            rc = rate_store_shm_new_in(z->region, z->region_size, &opt,
                                       &z->store, err, sizeof(err));
            if (rc == RATE_OK) {
                /* Workers are processes of this host: a crashed one's
                 * leases are taken back at the next denied acquire. */
                rate_inflight_config_t cfg = {.policy = z->policy,
                                              .store = z->store,
                                              .reap_dead_holders = 1};
                rc = rate_inflight_new(&cfg, &z->inflight);
            }
        }
        if (rc != RATE_OK) {
            char msg[sizeof(err) + 64];
            if (z->redis.url != NULL) {
                ngx_http_ratelimit_mask_msg(&z->redis, err, msg, sizeof(msg));
            } else {
                ngx_cpystrn((u_char *)msg, (u_char *)err, sizeof(msg));
            }
            ngx_log_error(NGX_LOG_ALERT, cycle->log, 0,
                          "ratelimit_inflight_zone \"%V\": cannot attach: "
                          "%s: %s", &z->name, rate_err_name(rc), msg);
            rate_store_free(z->store);
            z->store = NULL;
            z->inflight = NULL;
        }
    }
    return NGX_OK;
}

static void ngx_http_inflight_exit_process(ngx_cycle_t *cycle) {
    ngx_http_inflight_main_conf_t *mcf = ngx_http_inflight_main(cycle);
    ngx_http_inflight_zone_t **zp;
    ngx_uint_t i;

    if (mcf == NULL) {
        return;
    }
    zp = mcf->zones.elts;
    for (i = 0; i < mcf->zones.nelts; i++) {
        rate_inflight_free(zp[i]->inflight);
        rate_store_free(zp[i]->store);
        zp[i]->inflight = NULL;
        zp[i]->store = NULL;
    }
}

/* ------------------------------------------------------------ requests */

/* The request's pool is being destroyed: the request is over, however it
 * ended.  Its lease goes back. */
static void ngx_http_inflight_release_failed(ngx_http_inflight_zone_t *z,
                                             ngx_log_t *log, int rc) {
    ngx_uint_t level = rc == RATE_EEXPIRED ? NGX_LOG_WARN : NGX_LOG_ERR;
    ngx_log_error(level, log, 0,
                  "ratelimit_inflight: zone \"%V\": releasing a lease: %s",
                  &z->name, rate_strerror(rc));
}

#if (NGX_THREADS)
/* In a pool thread: the release. */
static void ngx_http_inflight_release_thread(void *data, ngx_log_t *log) {
    ngx_http_inflight_release_t *t = data;
    (void)log;
    t->rc = rate_inflight_release(t->zone->inflight, (const char *)t->key,
                                  t->key_len, &t->lease);
}

/* Back in the worker: logged if it failed, and freed. */
static void ngx_http_inflight_release_done(ngx_event_t *ev) {
    ngx_thread_task_t *task = ev->data;
    ngx_http_inflight_release_t *t = task->ctx;

    if (t->rc != RATE_OK) {
        ngx_http_inflight_release_failed(t->zone, ev->log, t->rc);
    }
    ngx_free(task);
}
#endif

static void ngx_http_inflight_release(void *data) {
    ngx_http_inflight_held_t *h = data;
    int rc;

    if (h->zone->inflight == NULL) {
        return;
    }
#if (NGX_THREADS)
    if (h->zone->tp != NULL) {
        /* The request is over: its pool goes now, the release may wait
         * on Redis in a thread, with copies of its own. */
        size_t size = sizeof(ngx_thread_task_t) +
                      sizeof(ngx_http_inflight_release_t) + h->key.len;
        ngx_thread_task_t *task = ngx_calloc(size, ngx_cycle->log);
        if (task != NULL) {
            ngx_http_inflight_release_t *t = (void *)(task + 1);
            t->zone = h->zone;
            t->lease = h->lease;
            t->key_len = h->key.len;
            ngx_memcpy(t->key, h->key.data, h->key.len);
            task->ctx = t;
            task->handler = ngx_http_inflight_release_thread;
            task->event.data = task;
            task->event.handler = ngx_http_inflight_release_done;
            task->event.log = ngx_cycle->log;
            if (ngx_thread_task_post(h->zone->tp, task) == NGX_OK) {
                return;
            }
            ngx_free(task);
        }
        /* no memory or no thread: released here, waiting */
    }
#endif
    rc = rate_inflight_release(h->zone->inflight, (const char *)h->key.data,
                               h->key.len, &h->lease);
    if (rc != RATE_OK) {
        ngx_http_inflight_release_failed(h->zone, h->log, rc);
    }
}

/* A failed acquire: one line a second per zone and worker at most (an
 * outage would write one a request), naming the store's last failure. */
static void ngx_http_inflight_store_error(ngx_http_request_t *r,
                                          ngx_http_inflight_zone_t *z, int rc,
                                          ngx_uint_t fail_open) {
    char why[300], msg[360];

    if (z->error_logged == ngx_time()) {
        z->error_quiet++;
        return;
    }
    why[0] = msg[0] = '\0';
    if (z->redis.url != NULL &&
        rate_store_redis_last_error(z->store, msg, sizeof(msg)) == RATE_OK &&
        msg[0] != '\0') {
        why[0] = ' ';
        why[1] = '(';
        ngx_http_ratelimit_mask_msg(&z->redis, msg, why + 2, sizeof(why) - 3);
        ngx_cpystrn((u_char *)why + ngx_strlen(why), (u_char *)")", 2);
    }
    ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                  "ratelimit_inflight: zone \"%V\": store error %s%s, %s "
                  "(ratelimit_inflight_fail %s) (%ui more since)",
                  &z->name, rate_err_name(rc), why,
                  fail_open ? "let through" : "denied",
                  fail_open ? "open" : "closed", z->error_quiet);
    z->error_logged = ngx_time();
    z->error_quiet = 0;
}

/* Marks a request the handler has seen, in its pool: an internal
 * redirect clears the module's context, not the pool's cleanups. */
static void ngx_http_inflight_seen(void *data) { (void)data; }

static ngx_int_t ngx_http_inflight_decided(ngx_http_request_t *r) {
    for (ngx_pool_cleanup_t *c = r->pool->cleanup; c != NULL; c = c->next) {
        if (c->handler == ngx_http_inflight_seen ||
            c->handler == ngx_http_inflight_release) {
            return 1;
        }
    }
    return 0;
}

/* The answer to an acquire's result (rc, ctx->d): the lease kept for the
 * pool's cleanup, or the status (a store error under the fail mode). */
static ngx_int_t ngx_http_inflight_decide(ngx_http_request_t *r,
                                          ngx_http_inflight_ctx_t *ctx) {
    ngx_http_inflight_held_t *h = ctx->h;

    if (ctx->rc != RATE_OK) {
        ngx_http_inflight_store_error(r, h->zone, ctx->rc, ctx->fail_open);
        /* Fail open: served without a lease (none to release). */
        return ctx->fail_open ? NGX_DECLINED : (ngx_int_t)ctx->status;
    }
    if (!ctx->d.allowed) {
        ngx_log_error(NGX_LOG_INFO, r->connection->log, 0,
                      "ratelimit_inflight: limiting requests by zone \"%V\": "
                      "%uL in flight", &h->zone->name, ctx->d.limit);
        return (ngx_int_t)ctx->status;
    }
    ctx->cln->handler = ngx_http_inflight_release;
    return NGX_DECLINED;
}

#if (NGX_THREADS)
/* In a pool thread: the acquire. */
static void ngx_http_inflight_acquire_thread(void *data, ngx_log_t *log) {
    ngx_http_inflight_ctx_t *ctx = data;
    ngx_http_inflight_held_t *h = ctx->h;
    ngx_http_inflight_zone_t *z = h->zone;
    char err[256];
    int rc = RATE_OK;

    pthread_mutex_lock(&z->attach);
    if (z->inflight == NULL) {
        err[0] = '\0';
        rc = ngx_http_inflight_attach_redis(z, err, sizeof(err));
        if (rc != RATE_OK) { /* a store error: the fail mode's */
            char msg[sizeof(err) + 64];
            ngx_http_ratelimit_mask_msg(&z->redis, err, msg, sizeof(msg));
            ngx_log_error(NGX_LOG_ALERT, log, 0,
                          "ratelimit_inflight_zone \"%V\": cannot attach: "
                          "%s: %s", &z->name, rate_err_name(rc), msg);
        }
    }
    pthread_mutex_unlock(&z->attach);
    if (rc != RATE_OK) {
        ctx->rc = rc;
        return;
    }
    ctx->rc = rate_inflight_acquire(z->inflight, (const char *)h->key.data,
                                    h->key.len, ctx->cls, &h->lease, &ctx->d);
}

/* Back in the worker: the decision, and the phases run on (the handler
 * answers ctx->final), as nginx's own thread tasks resume a request. */
static void ngx_http_inflight_acquire_done(ngx_event_t *ev) {
    ngx_http_request_t *r = ev->data;
    ngx_connection_t *c = r->connection;
    ngx_http_inflight_ctx_t *ctx =
        ngx_http_get_module_ctx(r, ngx_http_ratelimit_inflight_module);

    ngx_http_set_log_request(c->log, r);
    r->main->blocked--;
    r->aio = 0;
    ctx->final = ngx_http_inflight_decide(r, ctx);
    ctx->pending = 0;
    if (r->done) {
        c->write->handler(c->write);
    } else {
        r->write_event_handler(r);
        ngx_http_run_posted_requests(c);
    }
}
#endif

static ngx_int_t ngx_http_inflight_handler(ngx_http_request_t *r) {
    ngx_http_inflight_loc_conf_t *lcf;
    ngx_http_inflight_held_t *h;
    ngx_http_inflight_ctx_t *ctx;
    ngx_pool_cleanup_t *cln;
    rate_lease_class_t cls = RATE_LEASE_NORMAL;
    ngx_str_t key, crit;

    ctx = ngx_http_get_module_ctx(r, ngx_http_ratelimit_inflight_module);
    if (ctx != NULL) { /* decided in a thread: its answer */
        return ctx->pending ? NGX_AGAIN : ctx->final;
    }
    if (r->main != r || ngx_http_inflight_decided(r)) {
        return NGX_DECLINED; /* a subrequest, or decided before a redirect */
    }
    lcf = ngx_http_get_module_loc_conf(r, ngx_http_ratelimit_inflight_module);
    if (lcf->zone == NULL) {
        return NGX_DECLINED;
    }
    if (ngx_http_complex_value(r, &lcf->key, &key) != NGX_OK) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }
    if (key.len == 0) {
        return NGX_DECLINED; /* as limit_conn: an empty key is not limited */
    }
    if (lcf->critical != NULL) { /* critical: a value, and not "0" */
        if (ngx_http_complex_value(r, lcf->critical, &crit) != NGX_OK) {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }
        if (crit.len > 0 && !(crit.len == 1 && crit.data[0] == '0')) {
            cls = RATE_LEASE_CRITICAL;
        }
    }
    cln = ngx_pool_cleanup_add(r->pool, sizeof(*h));
    ctx = ngx_pcalloc(r->pool, sizeof(*ctx));
    if (cln == NULL || ctx == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }
    h = cln->data;
    ngx_memzero(h, sizeof(*h));
    cln->handler = ngx_http_inflight_seen; /* release, once one is held */
    h->zone = lcf->zone;
    if (h->zone->inflight == NULL
#if (NGX_THREADS)
        && h->zone->tp == NULL /* else made by the first acquire's thread */
#endif
    ) {
        return lcf->status; /* the worker could not attach: logged then */
    }
    /* The key's bytes may be a header buffer's, reused before the pool
     * goes: a copy of the pool's own outlives the cleanup. */
    h->key.data = ngx_pnalloc(r->pool, key.len);
    if (h->key.data == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }
    ngx_memcpy(h->key.data, key.data, key.len);
    h->key.len = key.len;
    h->log = r->connection->log;
    ctx->h = h;
    ctx->cln = cln;
    ctx->cls = cls;
    ctx->status = lcf->status;
    ctx->fail_open = lcf->fail_open;
#if (NGX_THREADS)
    if (h->zone->tp != NULL) {
        ngx_thread_task_t *task = ngx_thread_task_alloc(r->pool, 0);
        if (task == NULL) {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }
        task->ctx = ctx;
        task->handler = ngx_http_inflight_acquire_thread;
        task->event.data = r;
        task->event.handler = ngx_http_inflight_acquire_done;
        if (ngx_thread_task_post(h->zone->tp, task) != NGX_OK) {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }
        ctx->pending = 1;
        ngx_http_set_ctx(r, ctx, ngx_http_ratelimit_inflight_module);
        r->main->blocked++;
        r->aio = 1;
        return NGX_AGAIN;
    }
#endif
    ctx->rc = rate_inflight_acquire(h->zone->inflight,
                                    (const char *)h->key.data, h->key.len,
                                    cls, &h->lease, &ctx->d);
    return ngx_http_inflight_decide(r, ctx);
}

static ngx_int_t ngx_http_inflight_postconf(ngx_conf_t *cf) {
    ngx_http_core_main_conf_t *cmcf =
        ngx_http_conf_get_module_main_conf(cf, ngx_http_core_module);
    ngx_http_handler_pt *h =
        ngx_array_push(&cmcf->phases[NGX_HTTP_PREACCESS_PHASE].handlers);
    if (h == NULL) {
        return NGX_ERROR;
    }
    *h = ngx_http_inflight_handler;
    return NGX_OK;
}
