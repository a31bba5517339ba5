/* SPDX-License-Identifier: MIT */
/*
 * Fair shares on Redis in one round trip (fair.h).  The command is the
 * general step's (protocol.c: the script's arguments, or RATELIMIT.STEP's
 * with the expiry in milliseconds) with the table's key after the shared
 * limit's and six arguments after the limits: the flow's hash (8 bytes,
 * little-endian), its weight, a new table's slots, the fair period in
 * microseconds, and the first limit's period (ns) and limit (a fair
 * denial's retry estimate).  The table's name is the shared key's with
 * "f" before its '{': the same hash tag, so one slot of a Cluster.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sha1.h"
#include "fair.h"
#include "fair_lua.h"

static char script_sha[41];
static pthread_once_t sha_once = PTHREAD_ONCE_INIT;

static void sha_init(void)
{
    rate__sha1_hex(fair_lua, sizeof fair_lua - 1, script_sha);
}

/* The table's name: the shared key's with 'f' before its '{'. */
static int table_name(const rate__redis_proto_t *p, rate__redis_fair_cmd_t *c)
{
    const char *k = c->c.k;
    size_t kl = c->c.kl;
    const char *brace = memchr(k + p->prefix_len, '{', kl - p->prefix_len);
    if (brace == NULL)
        return RATE_EINVAL;
    size_t at = (size_t)(brace - k);
    c->tkl = kl + 1;
    c->tk = c->tkl <= sizeof c->tkey ? c->tkey : malloc(c->tkl);
    if (c->tk == NULL)
        return RATE_ENOMEM;
    memcpy(c->tk, k, at);
    c->tk[at] = 'f';
    memcpy(c->tk + at + 1, k + at, kl - at);
    return RATE_OK;
}

int rate__redis_fair_cmd(const rate__redis_proto_t *p, bool module,
                         const rate_key_t *key, const rate_decide_req_t *q,
                         const rate_fair_req_t *f, rate__redis_fair_cmd_t *c)
{
    rate__redis_proto_t general = *p;
    general.lean = false; /* the general step's arguments, always */
    c->tk = NULL;
    c->c.k = NULL;
    c->argc = 0;
    if (key->space != RATE_SPACE_STATE)
        return RATE_EINVAL;
    int rc = rate__redis_decide_cmd(&general,
                                    module ? RATE__VIA_MODULE
                                           : RATE__VIA_SCRIPTS,
                                    false, key, q, &c->c);
    if (rc != RATE_OK)
        return rc;
    if ((rc = table_name(p, c)) != RATE_OK)
        return rc;
    const rate_limit_t *l0 = rate_policy_limit(q->policy, 0);
    uint64_t period = l0->period_ns ? l0->period_ns : RATE_NS_PER_S;
    uint64_t period_us = period / 1000 ? period / 1000 : 1;
    if (period_us >= (UINT64_C(1) << 53))
        return RATE_ENOTSUP; /* past Lua's exact integers */
    for (int i = 0; i < 8; i++)
        c->hash[i] = (char)(uint8_t)(f->flow_hash >> (8 * i));
    snprintf(c->num[0], 24, "%u", f->weight);
    snprintf(c->num[1], 24, "%u", f->slots);
    snprintf(c->num[2], 24, "%llu", (unsigned long long)period_us);
    snprintf(c->num[3], 24, "%llu", (unsigned long long)period);
    snprintf(c->num[4], 24, "%llu",
             (unsigned long long)(l0->limit ? l0->limit : 1));
    /* The step's command: [EVALSHA sha 1 | RATELIMIT.STEP] key args... */
    int n = 0, first = module ? 1 : 3;
    if (module) {
        c->av[n] = "RATELIMIT.FAIR", c->al[n++] = 14;
    } else {
        pthread_once(&sha_once, sha_init);
        c->av[n] = "EVALSHA", c->al[n++] = 7;
        c->av[n] = script_sha, c->al[n++] = 40;
        c->av[n] = "2", c->al[n++] = 1;
    }
    c->av[n] = c->c.k, c->al[n++] = c->c.kl;
    c->av[n] = c->tk, c->al[n++] = c->tkl;
    for (int i = first + 1; i < c->c.argc; i++)
        c->av[n] = c->c.av[i], c->al[n++] = c->c.al[i];
    c->av[n] = c->hash, c->al[n++] = 8;
    for (int i = 0; i < 5; i++)
        c->av[n] = c->num[i], c->al[n++] = strlen(c->num[i]);
    c->argc = n;
    c->script = module ? NULL : fair_lua;
    c->script_len = module ? 0 : sizeof fair_lua - 1;
    return RATE_OK;
}

void rate__redis_fair_free(rate__redis_fair_cmd_t *c)
{
    if (c->tk != NULL && c->tk != c->tkey)
        free(c->tk);
    c->tk = NULL;
    rate__redis_cmd_free(&c->c);
}

void rate__redis_fair_eval(rate__redis_fair_cmd_t *c)
{
    if (c->script == NULL)
        return;
    c->av[0] = "EVAL", c->al[0] = 4;
    c->av[1] = c->script, c->al[1] = c->script_len;
}

int rate__redis_fair_parse(const redisReply *rep, rate_decision_t *d,
                           rate_fair_req_t *f)
{
    if (rep->type != REDIS_REPLY_ARRAY || rep->elements < 1 ||
        rep->element[0]->type != REDIS_REPLY_INTEGER)
        return RATE_ECORRUPT;
    long long tag = rep->element[0]->integer;
    if (tag == 0 && rep->elements == 1)
        return RATE_ENOTSUP;
    if (tag != 1 || rep->elements != 11)
        return RATE_ECORRUPT; /* 2: the key is no hash; 3: no fair table */
    for (size_t i = 9; i < 11; i++)
        if (rep->element[i]->type != REDIS_REPLY_INTEGER)
            return RATE_ECORRUPT;
    /* The step's nine words, as a decision's reply. */
    redisReply head = *rep;
    head.elements = 9;
    int rc = rate__redis_decide_parse(&head, d);
    if (rc != RATE_OK)
        return rc;
    f->fair_denied = rep->element[9]->integer != 0;
    f->shared = rep->element[10]->integer != 0;
    return RATE_OK;
}
