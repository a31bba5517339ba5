/*
 * The ratelimit command: one file per subcommand, sharing these helpers.
 * Includes only the public headers.
 */
#ifndef RATE_CLI_H
#define RATE_CLI_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include <ratelimit.h>

int cmd_replay(int argc, char **argv);
int cmd_compare(int argc, char **argv);
int cmd_check(int argc, char **argv);
int cmd_bench(int argc, char **argv);

/* Prints "ratelimit: <msg>" on standard error; returns exit status 2. */
int cli_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* The policy options shared by replay and check (spec/cli-replay.md). */
typedef struct policy_opts {
    const char *cmd; /* for messages */
    const char *algorithm, *rate, *burst, *capacity, *limit, *window;
    const char *max_wait;
} policy_opts_t;

/* Builds the policy and max_wait from the options; on a bad option prints a
 * one-line message and returns 2. */
int policy_from_opts(const policy_opts_t *o, rate_policy_t **out,
                     uint64_t *max_wait_ns);

/* "N/DUR" (the count in DUR may be left out) into (limit, period); 0 or -1
 * with *why set. */
int parse_rate_text(const char *s, uint64_t *limit, uint64_t *period_ns,
                    const char **why);

/* A whole number >= 1 up to 2^63-1; 0 or -1. */
int parse_count_text(const char *s, uint64_t *out);

/* A store for --store: "memory" (or NULL) or a URL this build knows.  On
 * failure prints why and returns 2. */
int store_from_opt(const char *cmd, const char *spec, rate_store_t **out);

/* Opens FILE, "-" or NULL (standard input); prints why and returns NULL on
 * failure. */
FILE *open_input(const char *cmd, const char *path);

/* Writes seconds with exactly 9 fractional digits ("0.000000000"). */
char *fmt_seconds(char *p, uint64_t ns);
char *fmt_u64(char *p, uint64_t v);

/* Whether getopt saw an unknown flag or a missing value: prints the message
 * and returns 2.  `c` is getopt's return; argv/optind as getopt left them. */
int getopt_fail(const char *cmd, int c, char **argv);

#endif
