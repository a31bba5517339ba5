/* SPDX-License-Identifier: MIT */
/*
 * CPU time read for the Redis benches (bench_redis.c, bench_redis_load.c):
 * a Redis server's, by INFO cpu, and this process's, by getrusage.
 */
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include <hiredis/hiredis.h>

#include "cli.h"

double bench_server_cpu_s(const char *host, int port)
{
    struct timeval tv = {1, 0};
    redisContext *c = redisConnectWithTimeout(host, port, tv);
    double v = 0;
    if (c != NULL && !c->err) {
        redisReply *r = redisCommand(c, "INFO cpu");
        if (r != NULL && r->type == REDIS_REPLY_STRING) {
            const char *u = strstr(r->str, "used_cpu_user:");
            const char *y = strstr(r->str, "used_cpu_sys:");
            if (u != NULL && y != NULL)
                v = strtod(u + 14, NULL) + strtod(y + 13, NULL);
        }
        freeReplyObject(r);
    }
    if (c != NULL)
        redisFree(c);
    return v;
}

double bench_server_reads(const char *host, int port)
{
    struct timeval tv = {1, 0};
    redisContext *c = redisConnectWithTimeout(host, port, tv);
    double v = 0;
    if (c != NULL && !c->err) {
        redisReply *r = redisCommand(c, "INFO stats");
        if (r != NULL && r->type == REDIS_REPLY_STRING) {
            const char *rd = strstr(r->str, "total_reads_processed:");
            if (rd != NULL)
                v = strtod(rd + 22, NULL);
        }
        freeReplyObject(r);
    }
    if (c != NULL)
        redisFree(c);
    return v;
}

double bench_self_cpu_s(long *switches)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    *switches = ru.ru_nvcsw + ru.ru_nivcsw;
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 +
           (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
}
