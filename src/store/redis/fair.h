/* SPDX-License-Identifier: MIT */
/*
 * Fair shares on Redis in one round trip (the store contract's fair(),
 * version 6): the command of one fair decision, by the module
 * (RATELIMIT.FAIR, src/fair/step.c inside Redis) or by the fair script
 * (src/store/redis/fair.lua, its Lua twin), both with the same arguments and
 * reply; no I/O (docs/fair.md, "Redis (a fleet)").
 */
#ifndef RATE_STORE_REDIS_FAIR_H
#define RATE_STORE_REDIS_FAIR_H

#include "protocol.h"

/* The arguments past the general step's: the table's key, then six. */
#define RATE__FAIR_EXTRA 7

typedef struct rate__redis_fair_cmd {
    rate__redis_cmd_t c; /* the general step's command, and the key */
    int argc;
    const char *av[RATE__REDIS_ARGS_MAX + RATE__FAIR_EXTRA];
    size_t al[RATE__REDIS_ARGS_MAX + RATE__FAIR_EXTRA];
    char tkey[RATE_KEY_MAX * 3 + 300]; /* the table's name when it fits */
    char *tk;
    size_t tkl;
    char hash[8];
    char num[5][24];
    const char *script; /* for EVAL after NOSCRIPT (NULL: the module's) */
    size_t script_len;
} rate__redis_fair_cmd_t;

/* The command of one fair decision: RATELIMIT.FAIR with module, else the
 * EVALSHA of the fair script.  RATE_ENOTSUP for a request the scripts or
 * the module would not decide exactly (a policy past the scripts' range,
 * a block), RATE_EINVAL for a key that is not a state's, RATE_ENOMEM;
 * rate__redis_fair_free() after (once built). */
int rate__redis_fair_cmd(const rate__redis_proto_t *p, bool module,
                         const rate_key_t *key, const rate_decide_req_t *q,
                         const rate_fair_req_t *f, rate__redis_fair_cmd_t *c);
void rate__redis_fair_free(rate__redis_fair_cmd_t *c);
/* The EVALSHA turned into the EVAL of the script (after NOSCRIPT). */
void rate__redis_fair_eval(rate__redis_fair_cmd_t *c);

/* Its reply (after rate__redis_reply_ok): RATE_OK with *d and f's
 * outputs, RATE_ENOTSUP (declined, nothing written), RATE_ECORRUPT (the
 * key is not a hash, the table not a fair table, or a reply that does
 * not parse). */
int rate__redis_fair_parse(const redisReply *rep, rate_decision_t *d,
                           rate_fair_req_t *f);

#endif
