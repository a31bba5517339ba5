/*
 * The ratelimit command: one file per subcommand, sharing these helpers.
 * Includes only the public headers (and libxxhash for the bench's floor).
 */
#ifndef RATE_CLI_H
#define RATE_CLI_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include <ratelimit.h>

int cmd_demo(int argc, char **argv);
int cmd_bench(int argc, char **argv);

/* Prints "ratelimit: <msg>" on standard error and returns exit status 2. */
int cli_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
