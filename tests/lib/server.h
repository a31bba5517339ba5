/* SPDX-License-Identifier: MIT */
/*
 * Test servers' common part (header-only, static): a free loopback port,
 * a program started by fork and exec and killed with the test however the
 * test ends (PR_SET_PDEATHSIG), waiting until it is ready or has exited,
 * and stopping it by its PID, never by a name.  lib/redis_server.h,
 * lib/redis_cluster.h and lib/dynalite_server.h are built on it.
 */
#ifndef TEST_LIB_SERVER_H
#define TEST_LIB_SERVER_H

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdbool.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "wait.h"

/* A loopback port free now, chosen by the kernel (0 if none). */
static inline int test_free_port(void)
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

/* Whether something accepts connections on 127.0.0.1:port. */
static inline bool test_port_listening(int port)
{
    struct sockaddr_in a = {0};
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bool ok = fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) == 0;
    if (fd >= 0)
        close(fd);
    return ok;
}

/* Starts argv (argv[0] found on PATH when it has no slash), its output to
 * /dev/null, killed when the test dies.  Its PID, or 0. */
static inline pid_t test_spawn(const char *const *argv)
{
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        int null = open("/dev/null", O_WRONLY);
        dup2(null, 1);
        dup2(null, 2);
        execvp(argv[0], (char *const *)argv);
        _exit(127);
    }
    return pid > 0 ? pid : 0;
}

/* Stops the process *pid (0: none) with SIGKILL, reaps it, clears *pid. */
static inline void test_stop(pid_t *pid)
{
    if (*pid > 0) {
        kill(*pid, SIGKILL);
        waitpid(*pid, NULL, 0);
        *pid = 0;
    }
}

typedef struct test_ready {
    pid_t pid;
    bool (*ready)(int port);
    int port;
    bool exited;
} test_ready_t;

static inline bool test_ready_or_exited(void *ud)
{
    test_ready_t *r = ud;
    if (r->ready(r->port))
        return true;
    if (waitpid(r->pid, NULL, WNOHANG) == r->pid) {
        r->exited = true; /* not installed, or the port was taken */
        return true;
    }
    return false;
}

/* Waits until the server *pid on `port` is ready (true) or has exited or
 * TEST_WAIT_S passed (false: then it is stopped and *pid cleared). */
static inline bool test_wait_ready(pid_t *pid, int port,
                                   bool (*ready)(int port))
{
    test_ready_t r = {*pid, ready, port, false};
    if (*pid > 0 && wait_until(test_ready_or_exited, &r, TEST_WAIT_S) &&
        !r.exited)
        return true;
    if (r.exited)
        *pid = 0;
    test_stop(pid);
    return false;
}

#endif
