/* SPDX-License-Identifier: MIT */
/* Redis Cluster routing: see cluster.h. */
#include <stdlib.h>
#include <string.h>

#include "cluster.h"

uint16_t rc_crc16(const char *buf, size_t len)
{
    uint16_t crc = 0;
    for (size_t i = 0; i < len; i++) {
        crc ^= (uint16_t)((unsigned char)buf[i] << 8);
        for (int b = 0; b < 8; b++) {
            unsigned v = (unsigned)crc << 1;
            crc = (uint16_t)((crc & 0x8000) ? v ^ 0x1021u : v);
        }
    }
    return crc;
}

unsigned rc_key_slot(const char *key, size_t len)
{
    const char *open = memchr(key, '{', len);
    if (open != NULL) {
        size_t rest = len - (size_t)(open + 1 - key);
        const char *close = memchr(open + 1, '}', rest);
        if (close != NULL && close > open + 1)
            return rc_crc16(open + 1, (size_t)(close - open - 1)) &
                   (RC_SLOTS - 1);
    }
    return rc_crc16(key, len) & (RC_SLOTS - 1);
}

static bool set_host(char dst[RC_HOST_MAX], const char *s, size_t n,
                     const char *self_host)
{
    if (n == 0 || (n == 1 && s[0] == '?')) {
        s = self_host;
        n = strlen(self_host);
    }
    if (n == 0 || n >= RC_HOST_MAX || memchr(s, '\0', n) != NULL)
        return false;
    memcpy(dst, s, n);
    dst[n] = '\0';
    return true;
}

bool rc_parse_slots(const redisReply *rep, const char *self_host,
                    rc_range_t *out, size_t cap, size_t *n)
{
    if (rep == NULL || rep->type != REDIS_REPLY_ARRAY || rep->elements > cap)
        return false;
    *n = 0;
    for (size_t i = 0; i < rep->elements; i++) {
        const redisReply *e = rep->element[i];
        if (e->type != REDIS_REPLY_ARRAY || e->elements < 3 ||
            e->element[0]->type != REDIS_REPLY_INTEGER ||
            e->element[1]->type != REDIS_REPLY_INTEGER)
            return false;
        long long a = e->element[0]->integer, b = e->element[1]->integer;
        if (a < 0 || b < a || b >= RC_SLOTS)
            return false;
        const redisReply *m = e->element[2];
        if (m->type != REDIS_REPLY_ARRAY || m->elements < 2 ||
            m->element[0]->type != REDIS_REPLY_STRING ||
            m->element[1]->type != REDIS_REPLY_INTEGER ||
            m->element[1]->integer <= 0 || m->element[1]->integer > 65535)
            return false;
        rc_range_t *r = &out[(*n)++];
        r->first = (unsigned)a;
        r->last = (unsigned)b;
        r->port = (int)m->element[1]->integer;
        if (!set_host(r->host, m->element[0]->str, m->element[0]->len,
                      self_host))
            return false;
    }
    return true;
}

rc_redirect_t rc_parse_redirect(const char *s, size_t len,
                                const char *self_host, unsigned *slot,
                                char host[RC_HOST_MAX], int *port)
{
    rc_redirect_t kind;
    size_t i;

    if (len >= 8 && memcmp(s, "TRYAGAIN", 8) == 0)
        return RC_TRYAGAIN;
    if (len > 6 && memcmp(s, "MOVED ", 6) == 0)
        kind = RC_MOVED, i = 6;
    else if (len > 4 && memcmp(s, "ASK ", 4) == 0)
        kind = RC_ASK, i = 4;
    else
        return RC_NONE;
    unsigned v = 0;
    size_t d0 = i;
    while (i < len && s[i] >= '0' && s[i] <= '9' && i - d0 < 6)
        v = v * 10 + (unsigned)(s[i++] - '0');
    if (i == d0 || v >= RC_SLOTS || i >= len || s[i] != ' ')
        return RC_NONE;
    i++;
    /* host:port, the host perhaps an IPv6 address: up to the last ':' */
    size_t colon = len;
    for (size_t j = i; j < len; j++)
        if (s[j] == ':')
            colon = j;
    if (colon == len || colon + 1 == len)
        return RC_NONE;
    int p = 0;
    for (size_t j = colon + 1; j < len; j++) {
        if (s[j] < '0' || s[j] > '9' || p > 65535)
            return RC_NONE;
        p = p * 10 + (s[j] - '0');
    }
    if (p <= 0 || p > 65535 || !set_host(host, s + i, colon - i, self_host))
        return RC_NONE;
    *slot = v;
    *port = p;
    return kind;
}

bool rc_slot_map(const redisReply *rep, const char *self_host,
                 int (*node_of)(void *ctx, const char *host, int port),
                 void *ctx, uint8_t map[RC_SLOTS])
{
    size_t nr, cap = rep->type == REDIS_REPLY_ARRAY ? rep->elements : 0;
    rc_range_t *ranges = malloc((cap ? cap : 1) * sizeof *ranges);
    bool ok = ranges != NULL &&
              rc_parse_slots(rep, self_host, ranges, cap, &nr);
    if (ok)
        memset(map, 0, RC_SLOTS);
    for (size_t i = 0; ok && i < nr; i++) {
        int idx = node_of(ctx, ranges[i].host, ranges[i].port);
        ok = idx >= 0 && idx < 255;
        for (unsigned s = ranges[i].first; ok && s <= ranges[i].last; s++)
            map[s] = (uint8_t)(idx + 1);
    }
    free(ranges);
    return ok;
}
