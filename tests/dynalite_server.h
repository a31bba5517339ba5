/* SPDX-License-Identifier: MIT */
/*
 * A private dynalite (DynamoDB's API in Node, in memory) for a test
 * (header-only, static): on a free loopback port, started by fork and
 * exec, stopped by its PID, and killed with the test however the test ends
 * (PR_SET_PDEATHSIG).  The program is $DYNALITE, else the one `make deps`
 * installs (scripts/dynalite.sh: build/npm under the source tree).
 */
#ifndef TEST_DYNALITE_SERVER_H
#define TEST_DYNALITE_SERVER_H

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef DYNALITE_DEFAULT
#define DYNALITE_DEFAULT "dynalite"
#endif

/* The dynalite program, or NULL when there is none to run. */
static inline const char *dynalite_program(void)
{
    const char *p = getenv("DYNALITE");
    if (p != NULL && *p)
        return access(p, X_OK) == 0 ? p : NULL;
    return access(DYNALITE_DEFAULT, X_OK) == 0 ? DYNALITE_DEFAULT : NULL;
}

/* A loopback port free now (0 if none). */
static inline int dynalite_free_port(void)
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

static inline bool dynalite_listening(int port)
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

/* Starts dynalite on 127.0.0.1:port with tables ACTIVE at once, and waits
 * (up to 30 s: node starting on a loaded machine) until it accepts
 * connections.  Its PID, or 0 when it could not be started. */
static inline pid_t dynalite_start(int port)
{
    const char *prog = dynalite_program();
    char p[16];
    if (prog == NULL)
        return 0;
    snprintf(p, sizeof p, "%d", port);
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        int null = open("/dev/null", O_WRONLY);
        dup2(null, 1);
        dup2(null, 2);
        execl(prog, prog, "--host", "127.0.0.1", "--port", p,
              "--createTableMs", "0", "--deleteTableMs", "0",
              "--updateTableMs", "0", (char *)NULL);
        _exit(127);
    }
    for (int i = 0; pid > 0 && i < 3000; i++) {
        if (dynalite_listening(port))
            return pid;
        if (waitpid(pid, NULL, WNOHANG) == pid)
            return 0;
        usleep(10000);
    }
    if (pid > 0) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
    }
    return 0;
}

static inline void dynalite_stop(pid_t *pid)
{
    if (*pid > 0) {
        kill(*pid, SIGKILL);
        waitpid(*pid, NULL, 0);
        *pid = 0;
    }
}

/* What a test program does when there is no dynalite: under CI=true it
 * fails (exit 1), else it is skipped (77, ctest's SKIP_RETURN_CODE). */
static inline int dynalite_missing(const char *test)
{
    const char *ci = getenv("CI");
    if (ci != NULL && strcmp(ci, "true") == 0) {
        fprintf(stderr, "%s: FAILED: no dynalite to run (CI=true): run "
                "`make deps` (scripts/dynalite.sh) or set DYNALITE\n", test);
        return 1;
    }
    fprintf(stderr, "%s: SKIPPED: no dynalite (npm package) here: `make "
            "deps` installs it (scripts/dynalite.sh), or set DYNALITE to "
            "its program\n", test);
    return 77;
}

#endif
