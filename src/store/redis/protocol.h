/* SPDX-License-Identifier: MIT */
/*
 * The Redis stores' protocol, with no I/O: the names of keys, the scripts
 * and their names, the choice of the command that decides a request
 * (RATELIMIT.STEP, a lean script by FCALL or EVALSHA, the general script)
 * with the gates that say what Lua decides exactly, the arguments, and
 * the parsing of every reply.  Both transports (sync.c, async.c) speak
 * it; tests/test_redis_protocol.c checks it without a server.
 */
#ifndef RATE_STORE_REDIS_PROTOCOL_H
#define RATE_STORE_REDIS_PROTOCOL_H

#include <hiredis/hiredis.h>

#include "../../call.h"
#include "../../kit.h"

/* The lean scripts, one per single-limit algorithm (docs/redis.md). */
typedef enum rate__lean {
    RATE__LEAN_TB,
    RATE__LEAN_LB,
    RATE__LEAN_FW,
    RATE__LEAN_SW,
    RATE__LEAN_SL,
    RATE__LEAN_COUNT
} rate__lean_t;

/* What the protocol needs of a store's settings, and the names of its
 * scripts (set by rate__redis_proto_init). */
typedef struct rate__redis_proto {
    char *prefix;
    size_t prefix_len;
    bool ttl;           /* keys expire (not no_ttl) */
    bool redis_time;    /* Redis's TIME is the clock (not client_time) */
    bool lean;          /* the lean scripts (not general_script) */
    uint64_t safety_us; /* with no_ttl: a state's expiry in us; 0 none */
    char sha[41];       /* the compare-and-set script */
    char step_sha[41];  /* the general step (step.lua) */
    char lean_sha[RATE__LEAN_COUNT][41];
    /* The lean scripts as one Redis 7 Functions library (FCALL, faster
     * than EVALSHA of the same body: docs/redis.md), named after a hash of
     * their text so that two versions of the library never clash. */
    char *fn_lib;
    size_t fn_lib_len;
    char fn_name[RATE__LEAN_COUNT][32];
    /* ... and the lease scripts in it (lease.lua, lease_rate.lua) */
    char fn_lease[32], fn_lease_rate[32];
} rate__redis_proto_t;

/* Copies the prefix, names the scripts and builds the Functions library
 * (with lean).  RATE_ENOMEM, or RATE_OK; rate__redis_proto_free after. */
int rate__redis_proto_init(rate__redis_proto_t *p, const char *prefix,
                           bool ttl, uint64_t safety_ttl_ns, bool redis_time,
                           bool lean);
void rate__redis_proto_free(rate__redis_proto_t *p);

/* The scripts a connection loads (SCRIPT LOAD), i from 0 while it
 * returns true: the compare-and-set, the general step, the probe, the
 * lean scripts, then the lease script.  The probe's index is
 * RATE__REDIS_PROBE_SCRIPT. */
bool rate__redis_script(unsigned i, const char **src, size_t *len);

/* The lease script's text (src/store/redis/lease.lua, assembled; with its
 * length), for SCRIPT LOAD and for EVAL after NOSCRIPT (lease.c). */
const char *rate__redis_lease_script(size_t *len);
#define RATE__REDIS_PROBE_SCRIPT 2u

/* The script that sets the expiry of each of KEYS to ARGV[1] us. */
extern const char rate__redis_touch_script[];
extern const size_t rate__redis_touch_script_len;

/* The longest command: an acquire with rate limits (lease.c), the
 * EVALSHA's 5 words, the lease's 9 arguments and the step's. */
#define RATE__REDIS_ARGS_MAX (5 + 9 + 7 + 4 * RATE_MAX_LIMITS)

/* One command: argc, av, al for hiredis's argv calls; the bytes it points
 * to live in it (or in the caller's state for a compare-and-set).
 * rate__redis_cmd_free() after use (once built). */
typedef struct rate__redis_cmd {
    int argc;
    const char *av[RATE__REDIS_ARGS_MAX];
    size_t al[RATE__REDIS_ARGS_MAX];
    char num[7 + 7 + 4 * RATE_MAX_LIMITS][24];
    char pk[10 * 24]; /* a lean script's policy numbers, in one argument */
    char kb[RATE_KEY_MAX * 3 + 300]; /* the key's name when it fits */
    char *k;                         /* the key's name (kb or the heap) */
    size_t kl;
    char *k2;  /* an acquire with rate limits: the rate key's name (heap) */
    size_t kl2;
    int lean;           /* a decide's lean script (its index), or -1 */
    bool module;        /* a decide's RATELIMIT.STEP */
    const char *script; /* the script of an EVALSHA, for NOSCRIPT */
    size_t script_len;
} rate__redis_cmd_t;

/* How a decide() goes: the module's command, or the scripts (a lean one
 * by FCALL when fcall, by EVALSHA otherwise; the general one by
 * EVALSHA). */
typedef enum rate__redis_via {
    RATE__VIA_MODULE,
    RATE__VIA_SCRIPTS,
} rate__redis_via_t;

/* The Redis name of a key into buf, or the heap if it does not fit (free
 * it when *out != buf).  RATE_EINVAL for no bytes or an unknown space. */
int rate__redis_key_name(const rate__redis_proto_t *p, const rate_key_t *key,
                         char *buf, size_t cap, char **out, size_t *out_len);
/* The step's arguments for q after the key (step.lua's, or with module
 * RATELIMIT.STEP's, whose expiry is in ms) into num, from num[*nn] on:
 * RATE_OK, or RATE_ENOTSUP when neither decides q exactly (a block, a
 * refund or penalty, another format, and for the script its 2^50
 * bound). */
int rate__redis_step_args(const rate__redis_proto_t *p, bool module,
                          const rate_decide_req_t *q, char (*num)[24],
                          int *nn);
/* The lease-and-rate script's text (lease_rate.lua: an acquire with the
 * rate limits, all or nothing; lease.c). */
const char *rate__redis_lease_rate_script(size_t *len);
/* Whether a name is one the store writes under its prefix. */
bool rate__redis_own_name(const rate__redis_proto_t *p, const char *s,
                          size_t len);
/* A span in whole microseconds, rounded up, at least 1. */
uint64_t rate__redis_ttl_us(uint64_t ns);

/* Build the command of a decide(), of a load() and of a cas().  The
 * decide: via the module, RATELIMIT.STEP (RATE_ENOTSUP for a block, or a
 * refund or penalty: the module makes admissions only); via the scripts,
 * the lean script that decides the request exactly (an FCALL of the
 * library with fcall), else the general step (RATE_ENOTSUP: no script
 * decides it exactly, or a refund or a penalty no lean script makes).
 * RATE_EINVAL: a policy record's key. */
int rate__redis_decide_cmd(const rate__redis_proto_t *p, rate__redis_via_t via,
                           bool fcall, const rate_key_t *key,
                           const rate_decide_req_t *q, rate__redis_cmd_t *c);
int rate__redis_load_cmd(const rate__redis_proto_t *p, const rate_key_t *key,
                         rate__redis_cmd_t *c);
int rate__redis_cas_cmd(const rate__redis_proto_t *p, const rate_key_t *key,
                        uint64_t version, const void *state, size_t len,
                        uint64_t ttl_ns, rate__redis_cmd_t *c);
void rate__redis_cmd_free(rate__redis_cmd_t *c);
/* A command in Redis's protocol: its length, the bytes written into buf
 * only when that is at most cap (as snprintf measures).  Cheaper than
 * hiredis's formatting, which prints each argument's length with a
 * printf of its own and allocates. */
size_t rate__redis_resp(char *buf, size_t cap, int argc,
                        const char *const *av, const size_t *al);
/* Turn an EVALSHA (or FCALL) into the EVAL of its script (after
 * NOSCRIPT), and an FCALL into the EVALSHA of its script. */
void rate__redis_cmd_eval(rate__redis_cmd_t *c);
void rate__redis_cmd_evalsha(const rate__redis_proto_t *p,
                             rate__redis_cmd_t *c);

/* Replies.  reply_ok: rc, or for an error reply RATE_ESTORE (RATE_ECORRUPT
 * for WRONGTYPE).  The parsers take a reply that passed it. */
int rate__redis_reply_ok(int rc, const redisReply *rep);
bool rate__redis_noscript(const redisReply *rep);
/* An FCALL's error reply that says the server has no such function (a
 * node without the library, or a server without Functions). */
bool rate__redis_no_function(const redisReply *rep);
int rate__redis_decide_parse(const redisReply *rep, rate_decision_t *d);
int rate__redis_decide_ints(const long long *v, size_t n, rate_decision_t *d);
/* A reply that is an array of 1 to cap integers (a step's), read without
 * a reply object from p[0..len): its length in bytes, v[0..*n) its
 * integers; 0 when p holds no more than a beginning of such a reply (more
 * bytes may finish it); -1 for any other reply (hiredis's reader's). */
long rate__redis_ints_parse(const char *p, size_t len, long long *v,
                            size_t cap, size_t *n);
int rate__redis_load_parse(const redisReply *rep, const char **state,
                           size_t *len, uint64_t *version);
int rate__redis_cas_parse(const redisReply *rep);
/* TIME's reply in ns: RATE_ECORRUPT for one that is not two numbers (or
 * a time past RATE_TIME_MAX). */
int rate__redis_time_parse(const redisReply *rep, uint64_t *ns);
/* COMMAND INFO ratelimit.step's reply: whether the server has it. */
bool rate__redis_has_module(const redisReply *rep);

#endif
