/* SPDX-License-Identifier: MIT */
/*
 * A private redis-server for a test (header-only, static): on a free
 * loopback port, never someone else's server; started by fork and exec,
 * stopped by its PID, and killed with the test however the test ends
 * (PR_SET_PDEATHSIG).
 */
#ifndef TEST_REDIS_SERVER_H
#define TEST_REDIS_SERVER_H

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <hiredis/hiredis.h>

/* A loopback port free now (0 if none). */
static inline int redis_test_free_port(void)
{
    struct sockaddr_in a = {0};
    socklen_t len = sizeof a;
    int fd = socket(AF_INET, SOCK_STREAM, 0), p = 0;
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        p = ntohs(a.sin_port);
    if (fd >= 0)
        close(fd);
    return p;
}

/* Starts redis-server on `port`, with more options after the defaults
 * (a NULL-terminated list of words, "--loadmodule", "/x/ratelimit.so",
 * ...; at most 16; NULL: none), and waits until it answers PING (a NOAUTH
 * answer counts).  Its PID, or 0 when it could not be started (no
 * redis-server here, or it never answered). */
static inline pid_t redis_test_start_args(int port, const char *const *extra)
{
    char p[16];
    snprintf(p, sizeof p, "%d", port);
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        int null = open("/dev/null", O_WRONLY);
        dup2(null, 1);
        dup2(null, 2);
        const char *argv[32] = {"redis-server", "--port", p, "--bind",
                                "127.0.0.1", "--save", "", "--appendonly",
                                "no", "--loglevel", "warning"};
        int n = 11;
        for (int i = 0; extra != NULL && extra[i] != NULL && n < 31; i++)
            argv[n++] = extra[i];
        argv[n] = NULL;
        execvp("redis-server", (char *const *)argv);
        _exit(127);
    }
    struct timeval tv = {1, 0};
    for (int i = 0; pid > 0 && i < 500; i++) {
        redisContext *c = redisConnectWithTimeout("127.0.0.1", port, tv);
        bool ok = false;
        if (c != NULL && !c->err) {
            redisReply *r = redisCommand(c, "PING");
            ok = r != NULL;
            freeReplyObject(r);
        }
        if (c != NULL)
            redisFree(c);
        if (ok)
            return pid;
        if (waitpid(pid, NULL, WNOHANG) == pid)
            return 0; /* it exited: not installed, or the port was taken */
        usleep(10000);
    }
    if (pid > 0) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
    }
    return 0;
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
    if (*pid > 0) {
        kill(*pid, SIGKILL);
        waitpid(*pid, NULL, 0);
        *pid = 0;
    }
}

#endif
