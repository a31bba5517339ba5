/* SPDX-License-Identifier: MIT */
/*
 * Leases on Redis in one round trip (the store contract's lease(),
 * version 5): the command of one lease operation, by the module
 * (RATELIMIT.LEASE, the C lease step inside Redis) or by the lease script
 * (src/store/redis/lease.lua, its Lua twin), both with the same arguments and
 * reply; no I/O (docs/leases.md, "Leases on Redis").
 */
#ifndef RATE_STORE_REDIS_LEASE_H
#define RATE_STORE_REDIS_LEASE_H

#include "protocol.h"

/* The command of one lease operation: RATELIMIT.LEASE with module, else
 * the lease script, by FCALL with fcall (the Functions library of
 * protocol.h), else by EVALSHA.  RATE_EINVAL for a key that is not a
 * state's, RATE_ENOMEM; rate__redis_cmd_free() after. */
int rate__redis_lease_cmd(const rate__redis_proto_t *p, bool module,
                          bool fcall, const rate_key_t *key,
                          const rate_lease_req_t *q, rate__redis_cmd_t *c);

/* Whether c is a lease script's FCALL; then, turn it into its EVALSHA
 * (a server without the library, or that will not load it). */
bool rate__redis_lease_fcall(const rate__redis_cmd_t *c);
void rate__redis_lease_evalsha(rate__redis_cmd_t *c);

/* Its reply (after rate__redis_reply_ok) into q's outputs: RATE_OK,
 * RATE_ELEASE, RATE_EEXPIRED, or RATE_ECORRUPT (a state that is not a
 * lease state, or a reply that does not parse). */
int rate__redis_lease_parse(const redisReply *rep, rate_lease_req_t *q);

#endif
