/* SPDX-License-Identifier: MIT */
/*
 * CPU time read for the Redis benches (bench_redis.c, bench_redis_load.c):
 * a Redis server's, by INFO cpu (and its reads of clients, by INFO stats),
 * and this process's, by getrusage.
 */
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include <hiredis/hiredis.h>

#include "cli.h"

/* The sum of the INFO section's numeric fields (names with their ':',
 * NULL-ended) on host:port; 0 if the server or any field is missing. */
static double info_sum(const char *host, int port, const char *section,
                       const char *const *fields)
{
    struct timeval tv = {1, 0};
    redisContext *c = redisConnectWithTimeout(host, port, tv);
    double v = 0;
    if (c != NULL && !c->err) {
        redisReply *r = redisCommand(c, "INFO %s", section);
        if (r != NULL && r->type == REDIS_REPLY_STRING) {
            for (int i = 0; fields[i] != NULL; i++) {
                const char *f = strstr(r->str, fields[i]);
                if (f == NULL) {
                    v = 0;
                    break;
                }
                v += strtod(f + strlen(fields[i]), NULL);
            }
        }
        freeReplyObject(r);
    }
    if (c != NULL)
        redisFree(c);
    return v;
}

double bench_server_cpu_s(const char *host, int port)
{
    static const char *const f[] = {"used_cpu_user:", "used_cpu_sys:", NULL};
    return info_sum(host, port, "cpu", f);
}

double bench_server_reads(const char *host, int port)
{
    static const char *const f[] = {"total_reads_processed:", NULL};
    return info_sum(host, port, "stats", f);
}

double bench_self_cpu_s(long *switches)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    *switches = ru.ru_nvcsw + ru.ru_nivcsw;
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 +
           (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
}
