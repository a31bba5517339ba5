/* SPDX-License-Identifier: MIT */
/*
 * Leases on Redis in one round trip (lease.h).  The arguments, after the
 * key: the operation (a, r, e, c), now, N, the reserve, critical (0/1),
 * the id, the expiry, the holder's pid, the key's time-to-live (-1: until
 * its latest expiry, 0: none, else microseconds).  Times and ids go as
 * 8 little-endian bytes (the pid as 4): Lua's doubles could not carry
 * them.  The reply: {code, granted, held, retry_at, latest}, code 0 done,
 * 1 not held, 2 expired, 3 not a lease state; the two times as 8 bytes.
 *
 * An acquire with rate limits (store contract version 6) is one command
 * over two keys, the leases' and the rate state's (on one tag): the lease
 * arguments, then the step's (step.lua's, RATELIMIT.STEP's), by
 * RATELIMIT.LEASESTEP or the EVALSHA of lease_rate.lua; the reply is the
 * lease's five, then the step's reply, or 0 when the class had no room
 * and the rate limits were not asked.
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "sha1.h"
#include "lease.h"

static char script_sha[41], rate_sha[41];
static pthread_once_t sha_once = PTHREAD_ONCE_INIT;

static void sha_init(void)
{
    size_t len;
    const char *src = rate__redis_lease_script(&len);
    rate__sha1_hex(src, len, script_sha);
    src = rate__redis_lease_rate_script(&len);
    rate__sha1_hex(src, len, rate_sha);
}

static void le(char *out, uint64_t v, size_t n)
{
    for (size_t i = 0; i < n; i++, v >>= 8)
        out[i] = (char)(uint8_t)v;
}

static uint64_t get_le(const char *s)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | (uint8_t)s[i];
    return v;
}

int rate__redis_lease_cmd(const rate__redis_proto_t *p, bool module,
                          bool fcall, const rate_key_t *key,
                          const rate_lease_req_t *q, rate__redis_cmd_t *c)
{
    static const char *const ops[] = {"a", "r", "e", "c"};
    int rc;

    if (key->space != RATE_SPACE_STATE || (unsigned)q->op > 3)
        return RATE_EINVAL;
    c->argc = 0;
    c->lean = -1;
    c->module = module;
    c->k = c->k2 = NULL;
    bool with_rate = q->rate != NULL;
    int rn = 7; /* the step's arguments from num[7] on */
    if (with_rate) {
        char *k2 = NULL;
        if (q->op != RATE_LEASE_OP_ACQUIRE || q->rate_key == NULL ||
            q->rate_out == NULL || q->rate_key->space != RATE_SPACE_STATE)
            return RATE_EINVAL;
        if ((rc = rate__redis_step_args(p, module, q->rate, c->num, &rn)) !=
            RATE_OK)
            return rc;
        if ((rc = rate__redis_key_name(p, q->rate_key, NULL, 0, &k2,
                                       &c->kl2)) != RATE_OK)
            return rc;
        c->k2 = k2;
    }
    if ((rc = rate__redis_key_name(p, key, c->kb, sizeof c->kb, &c->k,
                                   &c->kl)) != RATE_OK) {
        rate__redis_cmd_free(c);
        return rc;
    }
    pthread_once(&sha_once, sha_init);
    le(c->num[0], q->now_ns, 8);
    le(c->num[1], q->id, 8);
    le(c->num[2], q->expires_ns, 8);
    le(c->num[3], q->pid, 4);
    snprintf(c->num[4], sizeof c->num[4], "%llu", (unsigned long long)q->max);
    snprintf(c->num[5], sizeof c->num[5], "%llu",
             (unsigned long long)q->reserve);
    /* As a compare-and-set would keep the step's bytes: until the latest
     * expiry; with no_ttl, the safety expiry or none. */
    if (p->ttl)
        strcpy(c->num[6], "-1");
    else
        snprintf(c->num[6], sizeof c->num[6], "%llu",
                 (unsigned long long)p->safety_us);
    const char *args[] = {ops[q->op], c->num[0], c->num[4], c->num[5],
                          q->critical ? "1" : "0", c->num[1], c->num[2],
                          c->num[3], c->num[6]};
    size_t lens[] = {1, 8, strlen(c->num[4]), strlen(c->num[5]), 1, 8, 8, 4,
                     strlen(c->num[6])};
    int n = 0;
    if (module && with_rate) {
        c->av[n] = "RATELIMIT.LEASESTEP", c->al[n++] = 19;
    } else if (module) {
        c->av[n] = "RATELIMIT.LEASE", c->al[n++] = 15;
    } else if (fcall && p->fn_lib != NULL) {
        const char *fn = with_rate ? p->fn_lease_rate : p->fn_lease;
        c->av[n] = "FCALL", c->al[n++] = 5;
        c->av[n] = fn, c->al[n++] = strlen(fn);
        c->av[n] = with_rate ? "2" : "1", c->al[n++] = 1;
    } else {
        c->av[n] = "EVALSHA", c->al[n++] = 7;
        c->av[n] = with_rate ? rate_sha : script_sha, c->al[n++] = 40;
        c->av[n] = with_rate ? "2" : "1", c->al[n++] = 1;
    }
    c->av[n] = c->k, c->al[n++] = c->kl;
    if (with_rate)
        c->av[n] = c->k2, c->al[n++] = c->kl2;
    for (size_t i = 0; i < sizeof args / sizeof args[0]; i++)
        c->av[n] = args[i], c->al[n++] = lens[i];
    for (int i = 7; i < rn; i++)
        c->av[n] = c->num[i], c->al[n++] = strlen(c->num[i]);
    c->argc = n;
    size_t len;
    const char *src = with_rate ? rate__redis_lease_rate_script(&len)
                                : rate__redis_lease_script(&len);
    c->script = module ? NULL : src;
    c->script_len = module ? 0 : len;
    return RATE_OK;
}

bool rate__redis_lease_fcall(const rate__redis_cmd_t *c)
{
    return c->argc > 0 && c->al[0] == 5 && memcmp(c->av[0], "FCALL", 5) == 0;
}

void rate__redis_lease_evalsha(rate__redis_cmd_t *c)
{
    if (!rate__redis_lease_fcall(c))
        return;
    pthread_once(&sha_once, sha_init);
    c->av[0] = "EVALSHA", c->al[0] = 7;
    /* the rate key after the key: an acquire with rate limits */
    c->av[1] = c->k2 != NULL ? rate_sha : script_sha, c->al[1] = 40;
}

int rate__redis_lease_parse(const redisReply *rep, rate_lease_req_t *q)
{
    bool with_rate = q->rate != NULL;
    if (rep->type != REDIS_REPLY_ARRAY ||
        rep->elements != (with_rate ? 6u : 5u))
        return RATE_ECORRUPT;
    redisReply *const *e = rep->element;
    for (int i = 0; i < 3; i++)
        if (e[i]->type != REDIS_REPLY_INTEGER || e[i]->integer < 0)
            return RATE_ECORRUPT;
    for (int i = 3; i < 5; i++)
        if (e[i]->type != REDIS_REPLY_STRING || e[i]->len != 8)
            return RATE_ECORRUPT;
    switch (e[0]->integer) {
    case 0: break;
    case 1: return RATE_ELEASE;
    case 2: return RATE_EEXPIRED;
    default: return RATE_ECORRUPT;
    }
    q->granted = e[1]->integer != 0;
    q->held = (uint64_t)e[2]->integer;
    q->retry_at_ns = get_le(e[3]->str);
    q->latest_ns = get_le(e[4]->str);
    q->rate_decided = false;
    if (!with_rate)
        return RATE_OK;
    if (e[5]->type == REDIS_REPLY_INTEGER && e[5]->integer == 0) {
        /* no room for the lease: the rate limits were not asked */
        return q->granted ? RATE_ECORRUPT : RATE_OK;
    }
    /* The step's reply: declined ({0}: nothing charged, no lease), a key
     * that is no hash, or the decision (the lease granted with it). */
    int rc = rate__redis_decide_parse(e[5], q->rate_out);
    if (rc != RATE_OK)
        return rc;
    if (q->granted != q->rate_out->allowed)
        return RATE_ECORRUPT;
    q->rate_decided = true;
    return RATE_OK;
}
