/*
 * ratelimit -- the command-line face of libratelimit.
 */
#include <stdarg.h>
#include <string.h>

#include "cli.h"

static const char usage[] =
    "usage: ratelimit COMMAND [OPTIONS]\n"
    "\n"
    "Commands:\n"
    "  demo     send bursty traffic through each algorithm, print what each admitted\n"
    "  bench    measure ns per decision against the machine's floors\n"
    "\n"
    "Run 'ratelimit COMMAND --help' for a command's options.\n";

int cli_fail(const char *fmt, ...)
{
    va_list ap;
    fputs("ratelimit: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    return 2;
}

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
    if (strcmp(cmd, "demo") == 0)
        return cmd_demo(argc - 1, argv + 1);
    if (strcmp(cmd, "bench") == 0)
        return cmd_bench(argc - 1, argv + 1);
    return cli_fail("unknown command '%s' (try 'ratelimit --help')", cmd);
}
