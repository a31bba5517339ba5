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

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "server.h"

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
    return test_free_port();
}

static inline bool dynalite_listening(int port)
{
    return test_port_listening(port);
}

/* Starts dynalite on 127.0.0.1:port with tables ACTIVE at once, and waits
 * (up to TEST_WAIT_S: node starting on a loaded machine) until it accepts
 * connections.  Its PID, or 0 when it could not be started. */
static inline pid_t dynalite_start(int port)
{
    const char *prog = dynalite_program();
    char p[16];
    if (prog == NULL)
        return 0;
    snprintf(p, sizeof p, "%d", port);
    const char *argv[] = {prog, "--host", "127.0.0.1", "--port", p,
                          "--createTableMs", "0", "--deleteTableMs", "0",
                          "--updateTableMs", "0", NULL};
    pid_t pid = test_spawn(argv);
    return test_wait_ready(&pid, port, dynalite_listening) ? pid : 0;
}

static inline void dynalite_stop(pid_t *pid)
{
    test_stop(pid);
}

/* The credentials a test's stores sign with (dynalite checks none). */
static inline void dynalite_credentials(void)
{
    setenv("AWS_ACCESS_KEY_ID", "AKIDTEST", 1);
    setenv("AWS_SECRET_ACCESS_KEY", "test-secret", 1);
    unsetenv("AWS_SESSION_TOKEN");
}

/* The store URL of `table` on a dynalite at 127.0.0.1:port. */
static inline void dynalite_url(char *buf, size_t len, const char *table,
                                int port)
{
    snprintf(buf, len,
             "dynamodb://%s?region=us-east-1&endpoint=http://127.0.0.1:%d",
             table, port);
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
