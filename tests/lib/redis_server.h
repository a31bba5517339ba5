/* SPDX-License-Identifier: MIT */
/*
 * A private redis-server for a test (header-only, static): on a free
 * loopback port, never someone else's server; started by fork and exec,
 * stopped by its PID, and killed with the test however the test ends
 * (PR_SET_PDEATHSIG).
 */
#ifndef TEST_REDIS_SERVER_H
#define TEST_REDIS_SERVER_H

#include <stdbool.h>
#include <stdio.h>

#include <hiredis/hiredis.h>

#include "server.h"

/* A loopback port free now (0 if none). */
static inline int redis_test_free_port(void)
{
    return test_free_port();
}

/* Whether the server on `port` answers PING (a NOAUTH answer counts). */
static inline bool redis_test_answers(int port)
{
    struct timeval tv = {1, 0};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", port, tv);
    bool ok = false;
    if (c != NULL && !c->err) {
        redisReply *r = redisCommand(c, "PING");
        ok = r != NULL;
        freeReplyObject(r);
    }
    if (c != NULL)
        redisFree(c);
    return ok;
}

/* Starts redis-server on `port`, with more options after the defaults
 * (a NULL-terminated list of words, "--loadmodule", "/x/ratelimit.so",
 * ...; at most 16; NULL: none), and waits until it answers PING or exits
 * (up to TEST_WAIT_S).  Its PID, or 0 when it could not be started (no
 * redis-server here, the port taken, or it never answered). */
static inline pid_t redis_test_start_args(int port, const char *const *extra)
{
    char p[16];
    snprintf(p, sizeof p, "%d", port);
    const char *argv[32] = {"redis-server", "--port", p, "--bind",
                            "127.0.0.1", "--save", "", "--appendonly",
                            "no", "--loglevel", "warning"};
    int n = 11;
    for (int i = 0; extra != NULL && extra[i] != NULL && n < 31; i++)
        argv[n++] = extra[i];
    argv[n] = NULL;
    pid_t pid = test_spawn(argv);
    return test_wait_ready(&pid, port, redis_test_answers) ? pid : 0;
}

/* Starts redis-server on `port` with one more option and its value
 * ("--requirepass", "x"; NULL: none), as redis_test_start_args. */
static inline pid_t redis_test_start(int port, const char *flag,
                                     const char *value)
{
    const char *extra[] = {flag, value, NULL};
    return redis_test_start_args(port, flag ? extra : NULL);
}

/* Stops the server *pid (0: none) and clears it. */
static inline void redis_test_stop(pid_t *pid)
{
    test_stop(pid);
}

/* A suite's one private server: `server` (its PID), `port` and `url`
 * (redis://127.0.0.1:PORT/0), started by the cmocka group set-up
 * group_setup with the options `extra` (as redis_test_start_args) and
 * stopped by group_teardown. */
#define REDIS_GROUP_SERVER(extra)                                           \
    static pid_t server;                                                    \
    static int port;                                                        \
    static char url[64];                                                    \
    static int group_setup(void **state)                                    \
    {                                                                       \
        (void)state;                                                        \
        port = redis_test_free_port();                                      \
        snprintf(url, sizeof url, "redis://127.0.0.1:%d/0", port);          \
        if ((server = redis_test_start_args(port, (extra))) == 0)           \
            fail_msg("redis-server did not start on port %d", port);        \
        return 0;                                                           \
    }                                                                       \
    static int group_teardown(void **state)                                 \
    {                                                                       \
        (void)state;                                                        \
        redis_test_stop(&server);                                           \
        return 0;                                                           \
    }

#endif
