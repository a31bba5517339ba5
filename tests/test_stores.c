/* SPDX-License-Identifier: MIT */
/*
 * The store matrix over every store this build has (tests/lib/
 * store_matrix.h): memory, the compare-and-set test store (public headers
 * only), shared memory (a file, a file through a prefix, the caller's
 * memory; each region checked after each case), Redis through its
 * scripts, Redis through ratelimit.so, a Redis Cluster, the asynchronous
 * Redis store on libuv and on libevent, and DynamoDB (dynalite).  Each server is private, on a free
 * loopback port, stopped by its PID.  `RATE_STORES=shm,redis test_stores`
 * runs some of them.  Each back end's own suite keeps only its own failure
 * modes.
 */
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "lib/store_matrix.h"
#include "ratelimit_shm.h"
#ifdef RATE_WITH_REDIS
#include "ratelimit_redis.h"
#include "lib/redis_cluster.h"
#include "lib/redis_server.h"
#endif
#ifdef RATE_TEST_ASYNC
#include <event2/event.h>
#include <uv.h>

#include <ratelimit_event.h>
#include <ratelimit_uv.h>
#endif
#ifdef RATE_WITH_DYNAMODB
#include "ratelimit_dynamodb.h"
#include "lib/dynalite_server.h"
#endif

static unsigned namespaces; /* a namespace of its own per store made */

#if defined(RATE_WITH_REDIS) || defined(RATE_WITH_DYNAMODB)
static void ns_next(char *buf, size_t len)
{
    snprintf(buf, len, "matrix%u:", namespaces++);
}
#endif

static int make_memory(store_kind_t *k, rate_store_t **out)
{
    (void)k;
    return rate_store_memory_new(NULL, out);
}

static int make_cas(store_kind_t *k, rate_store_t **out)
{
    (void)k;
    return cas_store_new(out, NULL);
}

/* ------------------------------------------------------------- shm */

/* The three ways to hold a region: a file, a file again through a
 * namespace (a prefix), memory of the caller's own. */
typedef enum { SHM_FILE, SHM_PREFIX, SHM_IN } shm_way_t;

typedef struct shm_kind {
    shm_way_t way;
    char path[128];
    void *mem; /* SHM_IN: the caller's region */
    size_t len;
} shm_kind_t;

static int make_shm(store_kind_t *k, rate_store_t **out)
{
    shm_kind_t *h = k->ud;
    rate_shm_options_t o = {0};
    char err[256] = "";
    o.max_keys = 256;
    o.key_max = RATE_KEY_MAX + 64; /* the longest key and its prefix */
    o.state_max = 65536;           /* a sliding log of 3000 entries */
    o.max_policies = 256;          /* the random policies of a case */
    int rc;
    if (h->way == SHM_IN) {
        h->len = rate_store_shm_size(&o);
        h->mem = mmap(NULL, h->len, PROT_READ | PROT_WRITE,
                      MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        assert_true(h->mem != MAP_FAILED);
        rc = rate_store_shm_new_in(h->mem, h->len, &o, out, err, sizeof err);
    } else {
        snprintf(h->path, sizeof h->path, "/dev/shm/rl-test-stores-%ld-%u",
                 (long)getpid(), namespaces++);
        unlink(h->path);
        if (h->way == SHM_PREFIX)
            o.prefix = "ns1:";
        rc = rate_store_shm_new(h->path, &o, out, err, sizeof err);
    }
    return sm_made(k, rc, err);
}

/* The region still whole after the case (rate_store_shm_check), then
 * gone. */
static void drop_shm(store_kind_t *k, rate_store_t *s)
{
    shm_kind_t *h = k->ud;
    char err[256] = "";
    int rc = rate_store_shm_check(s, err, sizeof err);
    if (rc != RATE_OK)
        fail_msg("%s: the region's check: %s: %s", k->name, rate_err_name(rc),
                 err);
    if (h->way == SHM_PREFIX)
        assert_int_equal(rate_store_shm_drop(s), RATE_OK);
    rate_store_free(s);
    if (h->way == SHM_IN)
        munmap(h->mem, h->len);
    else
        unlink(h->path);
}

static shm_kind_t shm_file = {.way = SHM_FILE};
static shm_kind_t shm_prefix = {.way = SHM_PREFIX};
static shm_kind_t shm_in = {.way = SHM_IN};

#ifdef RATE_WITH_REDIS
/* ----------------------------------------------------------- Redis */

typedef struct redis_kind {
    pid_t pid;
    char url[128];
    rate_redis_module_t module;
    const char *const *args; /* more redis-server options */
    rcluster_t cl;           /* the cluster kind */
    bool cluster;
#ifdef RATE_TEST_ASYNC
    bool uv; /* an asynchronous kind: its loop */
    uv_loop_t uvl;
    struct event_base *base;
    rate_loop_t loop;
#endif
} redis_kind_t;

static int start_redis(store_kind_t *k, char *why, size_t len)
{
    redis_kind_t *r = k->ud;
    if (r->cluster) {
        if (!rcl_start(&r->cl)) {
            snprintf(why, len, "no Redis Cluster could start");
            return 1;
        }
        rcl_url(&r->cl, r->url, sizeof r->url);
    } else {
        int port = redis_test_free_port();
        if ((r->pid = redis_test_start_args(port, r->args)) == 0) {
            snprintf(why, len, "no redis-server could start%s",
                     r->args ? " with ratelimit.so" : "");
            return 1;
        }
        snprintf(r->url, sizeof r->url, "redis://127.0.0.1:%d/0", port);
    }
#ifdef RATE_TEST_ASYNC
    if (k->turn != NULL) {
        if (r->uv) {
            assert_int_equal(uv_loop_init(&r->uvl), 0);
            rate_loop_uv(&r->loop, &r->uvl);
        } else {
            r->base = event_base_new();
            assert_non_null(r->base);
            rate_loop_event(&r->loop, r->base);
        }
    }
#endif
    return 0;
}

static void stop_redis(store_kind_t *k)
{
    redis_kind_t *r = k->ud;
#ifdef RATE_TEST_ASYNC
    if (k->turn != NULL) {
        if (r->uv) {
            uv_run(&r->uvl, UV_RUN_NOWAIT); /* the closed handles' */
            uv_loop_close(&r->uvl);
        } else {
            event_base_free(r->base);
        }
    }
#endif
    if (r->cluster)
        rcl_stop(&r->cl);
    else
        redis_test_stop(&r->pid);
}

static int make_redis(store_kind_t *k, rate_store_t **out)
{
    redis_kind_t *r = k->ud;
    rate_redis_options_t o = {0};
    char prefix[32], err[256] = "";
    ns_next(prefix, sizeof prefix);
    o.prefix = prefix;
    o.no_ttl = true; /* the tests' times are their own, not the server's */
    o.module = r->module;
    /* Generous: a loaded machine must not turn a slow answer into a
     * store error (the timeouts have suites of their own). */
    o.command_timeout_ns = 30 * SEC;
    o.connect_timeout_ns = 30 * SEC;
    int rc;
#ifdef RATE_TEST_ASYNC
    if (k->turn != NULL)
        rc = rate_store_redis_async_new(r->url, &o, &r->loop, out, err,
                                        sizeof err);
    else
#endif
        rc = rate_store_redis_new(r->url, &o, out, err, sizeof err);
    return sm_made(k, rc, err);
}

static void drop_redis(store_kind_t *k, rate_store_t *s)
{
    (void)k;
    assert_int_equal(rate_store_redis_drop(s), RATE_OK);
    rate_store_free(s);
}

#ifdef RATE_TEST_ASYNC
static void turn_redis(store_kind_t *k)
{
    redis_kind_t *r = k->ud;
    if (r->uv)
        uv_run(&r->uvl, UV_RUN_ONCE);
    else
        event_base_loop(r->base, EVLOOP_ONCE);
}
#endif

#ifdef RATE_MODULE_PATH
static const char *const module_args[] = {"--loadmodule", RATE_MODULE_PATH,
                                          NULL};
#endif
static redis_kind_t redis_scripts = {.module = RATE_REDIS_MODULE_OFF};
#ifdef RATE_MODULE_PATH
static redis_kind_t redis_module = {.module = RATE_REDIS_MODULE_ON,
                                    .args = module_args};
#endif
static redis_kind_t redis_cluster = {.module = RATE_REDIS_MODULE_OFF,
                                     .cluster = true};
#ifdef RATE_TEST_ASYNC
static redis_kind_t redis_uv = {.module = RATE_REDIS_MODULE_OFF, .uv = true};
static redis_kind_t redis_event = {.module = RATE_REDIS_MODULE_OFF};
#endif
#endif /* RATE_WITH_REDIS */

#ifdef RATE_WITH_DYNAMODB
/* -------------------------------------------------------- DynamoDB */

static pid_t dynalite_pid;
static char ddb_url[160];

static int start_dynamodb(store_kind_t *k, char *why, size_t len)
{
    (void)k;
    dynalite_credentials();
    int port = dynalite_free_port();
    if (dynalite_program() == NULL) {
        snprintf(why, len, "no dynalite (make deps installs it: "
                           "scripts/dynalite.sh)");
        return 1;
    }
    if ((dynalite_pid = dynalite_start(port)) == 0) {
        snprintf(why, len, "dynalite could not start");
        return 1;
    }
    dynalite_url(ddb_url, sizeof ddb_url, "ratelimit-matrix", port);
    return 0;
}

static void stop_dynamodb(store_kind_t *k)
{
    (void)k;
    dynalite_stop(&dynalite_pid);
}

static int make_dynamodb(store_kind_t *k, rate_store_t **out)
{
    rate_dynamodb_options_t o = {0};
    char prefix[32], err[512] = "";
    ns_next(prefix, sizeof prefix);
    o.prefix = prefix;
    o.prefix_len = strlen(prefix);
    o.no_ttl = true;
    o.create_table = true;
    o.request_timeout_ns = 30 * SEC; /* generous, as for Redis */
    o.connect_timeout_ns = 30 * SEC;
    int rc = rate_store_dynamodb_new(ddb_url, &o, out, err, sizeof err);
    return sm_made(k, rc, err);
}

static void drop_dynamodb(store_kind_t *k, rate_store_t *s)
{
    (void)k;
    assert_int_equal(rate_store_dynamodb_drop(s), RATE_OK);
    rate_store_free(s);
}
#endif /* RATE_WITH_DYNAMODB */

int main(void)
{
    store_kind_t kinds[] = {
        {.name = "memory", .make = make_memory},
        {.name = "cas", .make = make_cas},
        {.name = "shm", .make = make_shm, .drop = drop_shm, .ud = &shm_file},
        {.name = "shm_prefix", .make = make_shm, .drop = drop_shm,
         .ud = &shm_prefix},
        {.name = "shm_in", .make = make_shm, .drop = drop_shm, .ud = &shm_in},
#ifdef RATE_WITH_REDIS
        {.name = "redis", .start = start_redis, .stop = stop_redis,
         .make = make_redis, .drop = drop_redis, .ud = &redis_scripts},
#ifdef RATE_MODULE_PATH
        {.name = "redis_module", .start = start_redis, .stop = stop_redis,
         .make = make_redis, .drop = drop_redis, .ud = &redis_module},
#endif
        {.name = "redis_cluster", .start = start_redis, .stop = stop_redis,
         .make = make_redis, .drop = drop_redis, .ud = &redis_cluster},
#ifdef RATE_TEST_ASYNC
        {.name = "redis_async_uv", .start = start_redis, .stop = stop_redis,
         .make = make_redis, .drop = drop_redis, .turn = turn_redis,
         .ud = &redis_uv},
        {.name = "redis_async_event", .start = start_redis,
         .stop = stop_redis, .make = make_redis, .drop = drop_redis,
         .turn = turn_redis, .ud = &redis_event},
#endif
#endif
#ifdef RATE_WITH_DYNAMODB
        {.name = "dynamodb", .start = start_dynamodb, .stop = stop_dynamodb,
         .make = make_dynamodb, .drop = drop_dynamodb},
#endif
    };
    return store_matrix_main(kinds, sizeof kinds / sizeof kinds[0]);
}
