/* SPDX-License-Identifier: MIT */
/*
 * One private redis-server for a test program's group (header-only,
 * static): the server (server, port, url), a raw hiredis connection to
 * it, starting and stopping it by PID (the tests that restart it call
 * these), the cmocka group setup and teardown, and a store over it.
 */
#ifndef TEST_REDIS_FIXTURE_H
#define TEST_REDIS_FIXTURE_H

#include "helpers.h"
#include "redis_server.h"
#include "ratelimit_redis.h"

static pid_t server;
static int port;
static char url[64];

static inline redisContext *raw(void)
{
    struct timeval tv = {1, 0};
    return redisConnectWithTimeout("127.0.0.1", port, tv);
}

/* Starts the test's redis-server on `port` (extra: "--requirepass x" or
 * NULL) and waits until it answers. */
static inline void start_server(const char *extra_flag, const char *extra_value)
{
    server = redis_test_start(port, extra_flag, extra_value);
    if (server == 0)
        fail_msg("redis-server did not start on port %d", port);
}

static inline void stop_server(void)
{
    redis_test_stop(&server);
}

static inline int group_setup(void **state)
{
    (void)state;
    port = redis_test_free_port();
    snprintf(url, sizeof url, "redis://127.0.0.1:%d/0", port);
    start_server(NULL, NULL);
    return 0;
}

static inline int group_teardown(void **state)
{
    (void)state;
    stop_server();
    return 0;
}

static inline rate_store_t *redis_store(const char *prefix, bool no_ttl,
                                 uint64_t timeout_ns)
{
    rate_redis_options_t o = {0};
    rate_store_t *s = NULL;
    char err[256] = "";
    o.prefix = prefix;
    o.no_ttl = no_ttl;
    o.command_timeout_ns = timeout_ns;
    o.connect_timeout_ns = timeout_ns;
    o.breaker_cooldown_ns = timeout_ns; /* 0: the default, 1 s */
    if (rate_store_redis_new(url, &o, &s, err, sizeof err) != RATE_OK)
        fail_msg("redis store: %s", err);
    return s;
}

/* Drops a test's namespace from the server and frees its store (after the
 * limiters over it). */
static inline void drop_store(rate_store_t *rs)
{
    rate_store_redis_drop(rs);
    rate_store_free(rs);
}

/* A thread that decides key "hot" on its limiter until stop, counting
 * what it admitted: the scripted decisions of another client on a hot key
 * (docs/async.md), under refunds the test runs meanwhile. */
typedef struct hot {
    rate_limiter_t *l;
    atomic_bool stop;
    _Atomic uint64_t admitted;
} hot_t;

static inline void *hot_hammer(void *arg)
{
    hot_t *h = arg;
    while (!atomic_load(&h->stop)) {
        rate_decision_t d;
        if (rate_limiter_check(h->l, "hot", 3, 1, 0, &d) == RATE_OK &&
            d.allowed)
            h->admitted++;
    }
    return NULL;
}

#endif
