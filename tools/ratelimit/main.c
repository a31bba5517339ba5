/* SPDX-License-Identifier: MIT */
/*
 * ratelimit -- the command-line face of libratelimit.
 */
#include <string.h>

#include "cli.h"

static const char usage[] =
    "usage: ratelimit COMMAND [OPTIONS]\n"
    "\n"
    "Commands:\n"
    "  replay   replay a trace through one policy, one decision per request\n"
    "  compare  one trace through every algorithm: a table and a chart\n"
    "  check    one decision for one key (exit 0 allowed, 1 denied, 2 error)\n"
    "  bench    ns per decision against the machine's floors\n"
    "\n"
    "Run 'ratelimit COMMAND --help' for a command's options.\n";

int main(int argc, char **argv)
{
    if (argc < 2)
        return fputs(usage, stderr), 2;
    const char *cmd = argv[1];
    if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 ||
        strcmp(cmd, "help") == 0)
        return fputs(usage, stdout), 0;
    if (strcmp(cmd, "--version") == 0)
        return printf("ratelimit %d.%d.%d\n", RATE_VERSION_MAJOR,
                      RATE_VERSION_MINOR, RATE_VERSION_PATCH),
               0;
    if (strcmp(cmd, "replay") == 0)
        return cmd_replay(argc - 1, argv + 1);
    if (strcmp(cmd, "compare") == 0)
        return cmd_compare(argc - 1, argv + 1);
    if (strcmp(cmd, "check") == 0)
        return cmd_check(argc - 1, argv + 1);
    if (strcmp(cmd, "bench") == 0)
        return cmd_bench(argc - 1, argv + 1);
    return cli_fail("unknown command '%s' (try 'ratelimit --help')", cmd);
}
