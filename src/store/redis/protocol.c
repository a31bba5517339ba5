/* SPDX-License-Identifier: MIT */
/*
 * The Redis stores' protocol (protocol.h): no I/O, so that the rules of
 * the keys, the scripts and their replies are written once for both
 * transports and tested without a server.
 *
 * A key is stored as a hash {v: version, s: state bytes}, named by its
 * space, always inside the prefix and always its own Redis Cluster hash
 * tag (the braces):
 *
 *   RATE_SPACE_STATE   PREFIX "{" KEY "}"   (the first edition's names)
 *   RATE_SPACE_SHADOW  PREFIX "s{" KEY "}"
 *   RATE_SPACE_POLICY  PREFIX "p{" HEX "}"  HEX: the key's bytes (a 4-byte
 *                      id) in order, two lowercase hex digits each, as in
 *                      "ratelimit:p{0badcafe}"
 *
 * A KEY holding a '}' would end the tag early (Redis takes the bytes up to
 * the first '}'), so such a key is escaped instead, '%' as "%25" and '}'
 * as "%7d", and named PREFIX "e{" ESC "}" (a state) or PREFIX "es{" ESC "}"
 * (a shadow state).  A key without '}' keeps its name; a '{' in a key
 * changes nothing, as Redis reads the tag from the first '{', ours.
 *
 * A key's leases (src/lease/: a state key of the bytes "\xffLEASE\x01\0"
 * then the key's) are named by the key's own tag, so that one command
 * may touch both the key's rate state and its leases on a Redis Cluster:
 *
 *   leases of KEY      PREFIX "l{" KEY "}", or PREFIX "el{" ESC "}"
 *
 * (Earlier builds, before any release had leases, named them as any
 * state key, PREFIX "{" "\xffLEASE"... "}": docs/leases.md, "Leases on
 * Redis", says what mixing builds means.)
 *
 * After the prefix comes '{', 's', 'p', 'l' or 'e', so no two spaces ever
 * share a name.  A new key's version starts from Redis's TIME in microseconds,
 * so a key that expired and came back does not reuse the version a slow
 * client may still hold.  Every write sets the key's expiry to its
 * reset_after (never for RATE_TTL_FOREVER, nor with no_ttl).  With no_ttl
 * and safety_ttl_ns, a state (or shadow state) written gets the safety
 * expiry instead of none, both from the step's script and from the
 * compare-and-set script (the policy records, RATE_TTL_FOREVER, still get
 * none).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sha1.h"
#include "lease_lua.h"
#include "lease_rate_lua.h"
#include "protocol.h"
#include "redis_step_lua.h"
#include "redis_tb_lua.h"
#include "redis_lb_lua.h"
#include "redis_fw_lua.h"
#include "redis_sw_lua.h"
#include "redis_sl_lua.h"

#define LEAN_TB RATE__LEAN_TB
#define LEAN_LB RATE__LEAN_LB
#define LEAN_FW RATE__LEAN_FW
#define LEAN_SW RATE__LEAN_SW
#define LEAN_SL RATE__LEAN_SL
#define LEAN_COUNT RATE__LEAN_COUNT

/* The expiry rule of step.lua's expire_at (see there and
 * docs/redis.md): the key lives at least `us` microseconds by Redis's own
 * clock, PEXPIREAT the end rounded up to whole milliseconds, plus one. */
#define EXPIRE_AT_LUA                                                        \
    "local function expire_at(key, us, tm)\n"                               \
    "  if us > 2251799813685248 then us = 2251799813685248 end\n"           \
    "  local e = tonumber(tm[1]) * 1000000 + tonumber(tm[2]) + us\n"        \
    "  local ms = math.floor(e / 1000)\n"                                   \
    "  if ms * 1000 > e then ms = ms - 1\n"                                 \
    "  elseif (ms + 1) * 1000 <= e then ms = ms + 1 end\n"                  \
    "  if ms * 1000 < e then ms = ms + 1 end\n"                             \
    "  redis.call('PEXPIREAT', key, string.format('%.0f', ms + 1))\n"       \
    "end\n"

/* ARGV: the version expected, the state, the expiry in microseconds from
 * Redis's TIME (0: none). */
static const char cas_script[] =
    EXPIRE_AT_LUA
    "local cur = redis.call('HGET', KEYS[1], 'v')\n"
    "if cur == false then cur = '0' end\n"
    "if cur ~= ARGV[1] then return 0 end\n"
    "local nv\n"
    "local t = redis.call('TIME')\n"
    "if cur == '0' then\n"
    "  nv = redis.call('HINCRBY', KEYS[1], 'v', t[1] * 1000000 + t[2])\n"
    "elseif #cur == 19 and cur >= '9223372036854775807' then\n"
    "  nv = t[1] * 1000000 + t[2]\n" /* past HINCRBY's end: from TIME */
    "  redis.call('HSET', KEYS[1], 'v', string.format('%.0f', nv))\n"
    "else\n"
    "  nv = redis.call('HINCRBY', KEYS[1], 'v', 1)\n"
    "end\n"
    "redis.call('HSET', KEYS[1], 's', ARGV[2])\n"
    "local ttl = tonumber(ARGV[3])\n"
    "if ttl > 0 then expire_at(KEYS[1], ttl, t)\n"
    "else redis.call('PERSIST', KEYS[1]) end\n"
    "return nv\n";

/* Run at each connection, with a key of the namespace: whether the user
 * may run EVALSHA on the store's keys (an ACL says NOPERM first). */
static const char probe_script[] = "return 1\n";

/* The lean scripts: one per single-limit algorithm (lean_tb.lua,
 * lean_lb.lua, lean_fw.lua, lean_sw.lua, lean_sl.lua here, each with lean.lua and its algorithm's
 * src/algo/NAME.lua, assembled by the build; see docs/redis.md). */
static const struct {
    const char *src;
    size_t len;
} lean_scripts[LEAN_COUNT] = {
    {redis_tb_lua, sizeof redis_tb_lua - 1},
    {redis_lb_lua, sizeof redis_lb_lua - 1},
    {redis_fw_lua, sizeof redis_fw_lua - 1},
    {redis_sw_lua, sizeof redis_sw_lua - 1},
    {redis_sl_lua, sizeof redis_sl_lua - 1},
};

const char *rate__redis_lease_script(size_t *len)
{
    *len = sizeof lease_lua - 1;
    return lease_lua;
}

const char *rate__redis_lease_rate_script(size_t *len)
{
    *len = sizeof lease_rate_lua - 1;
    return lease_rate_lua;
}

bool rate__redis_script(unsigned i, const char **src, size_t *len)
{
    if (i == 3 + LEAN_COUNT) { /* then the lease scripts (lease.c) */
        *src = rate__redis_lease_script(len);
        return true;
    }
    if (i == 4 + LEAN_COUNT) {
        *src = rate__redis_lease_rate_script(len);
        return true;
    }
    if (i >= 4 + LEAN_COUNT)
        return false;
    *src = i == 0   ? cas_script
           : i == 1 ? redis_step_lua
           : i == 2 ? probe_script
                    : lean_scripts[i - 3].src;
    *len = i == 0   ? sizeof cas_script - 1
           : i == 1 ? sizeof redis_step_lua - 1
           : i == 2 ? sizeof probe_script - 1
                    : lean_scripts[i - 3].len;
    return true;
}

uint64_t rate__redis_ttl_us(uint64_t ns)
{
    uint64_t us = ns / 1000 + (ns % 1000 != 0);
    return us ? us : 1;
}

/* A call's status, with an error reply counted as a store error, but
 * WRONGTYPE (the key is no hash: not a state of ours) as a corrupt one.
 * From a script, Redis 7 starts the message with it; older ones put it
 * after "ERR Error running script ...": look for it anywhere. */
int rate__redis_reply_ok(int rc, const redisReply *rep)
{
    if (rc != RATE_OK)
        return rc;
    if (rep->type != REDIS_REPLY_ERROR)
        return RATE_OK;
    return rep->str != NULL && strstr(rep->str, "WRONGTYPE") != NULL
               ? RATE_ECORRUPT
               : RATE_ESTORE;
}

/* ----------------------------------------------------------------- keys */

/* The bytes before a key's own in the store key of its leases
 * (src/lease/inflight.c, docs/leases.md). */
static const char LEASE_PREFIX[8] = {'\xff', 'L', 'E', 'A', 'S', 'E', '\x01', 0};

/* The Redis name of a key (see the top of the file) into buf, or the heap
 * if it does not fit (free it when *out != buf).  RATE_EINVAL for no bytes
 * or an unknown space. */
int rate__redis_key_name(const rate__redis_proto_t *pr, const rate_key_t *key,
                         char *buf, size_t cap, char **out, size_t *out_len)
{
    static const char hex[] = "0123456789abcdef";
    size_t body = 0, open;
    bool esc = false;

    *out = NULL;
    if (key == NULL || key->bytes == NULL || key->len == 0)
        return RATE_EINVAL;
    /* A key's leases: under the key's own tag (see the top). */
    rate_key_t lk;
    bool lease = key->space == RATE_SPACE_STATE &&
                 key->len > sizeof LEASE_PREFIX &&
                 memcmp(key->bytes, LEASE_PREFIX, sizeof LEASE_PREFIX) == 0;
    if (lease) {
        lk = (rate_key_t){key->bytes + sizeof LEASE_PREFIX,
                          key->len - sizeof LEASE_PREFIX, RATE_SPACE_STATE};
        key = &lk;
    }
    switch (key->space) {
    case RATE_SPACE_STATE:
    case RATE_SPACE_SHADOW:
        esc = memchr(key->bytes, '}', key->len) != NULL;
        for (size_t i = 0; i < key->len; i++) {
            char ch = ((const char *)key->bytes)[i];
            body += esc && (ch == '}' || ch == '%') ? 3 : 1;
        }
        open = (size_t)1 + (key->space == RATE_SPACE_SHADOW) + esc + lease;
        break;
    case RATE_SPACE_POLICY: open = 2, body = key->len * 2; break;
    default: return RATE_EINVAL;
    }
    size_t n = pr->prefix_len + open + body + 1;
    char *k = n <= cap ? buf : malloc(n);
    if (k == NULL)
        return RATE_ENOMEM;
    memcpy(k, pr->prefix, pr->prefix_len);
    char *p = k + pr->prefix_len;
    if (esc)
        *p++ = 'e';
    if (key->space == RATE_SPACE_SHADOW)
        *p++ = 's';
    else if (lease)
        *p++ = 'l';
    else if (key->space == RATE_SPACE_POLICY)
        *p++ = 'p';
    *p++ = '{';
    if (key->space == RATE_SPACE_POLICY) {
        for (size_t i = 0; i < key->len; i++) {
            unsigned char b = (unsigned char)key->bytes[i];
            *p++ = hex[b >> 4];
            *p++ = hex[b & 15];
        }
    } else if (esc) {
        for (size_t i = 0; i < key->len; i++) {
            char ch = ((const char *)key->bytes)[i];
            if (ch == '}' || ch == '%') {
                *p++ = '%';
                *p++ = ch == '%' ? '2' : '7';
                *p++ = ch == '%' ? '5' : 'd';
            } else {
                *p++ = ch;
            }
        }
    } else {
        memcpy(p, key->bytes, key->len);
        p += key->len;
    }
    *p = '}';
    *out = k;
    *out_len = n;
    return RATE_OK;
}

/* Whether a name is one the store writes under its prefix (see the top of
 * the file): PREFIX, then "", "s", "f", "l", "p", "e", "es", "ef" or "el",
 * then "{", a body of at least one byte with no '}', and "}" to end it.
 * (f: a shared limit's fair table, src/store/redis/fair.c; l: a key's
 * leases.) */
bool rate__redis_own_name(const rate__redis_proto_t *pr, const char *s,
                          size_t len)
{
    if (len < pr->prefix_len + 3 ||
        memcmp(s, pr->prefix, pr->prefix_len) != 0 || s[len - 1] != '}')
        return false;
    const char *p = s + pr->prefix_len, *end = s + len - 1;
    if (*p == 'e')
        p++;
    if (*p == 's' || *p == 'f' || *p == 'l' ||
        (*p == 'p' && p == s + pr->prefix_len))
        p++;
    if (p >= end || *p != '{' || p + 1 == end)
        return false;
    return memchr(p + 1, '}', (size_t)(end - p - 1)) == NULL;
}

/* ------------------------------------------------------------- contract */

static int parse_version(const redisReply *v, uint64_t *out)
{
    if (v->type == REDIS_REPLY_NIL) {
        *out = 0;
        return RATE_OK;
    }
    if (v->type != REDIS_REPLY_STRING ||
        !rate__version_parse(v->str, v->len, out))
        return RATE_ECORRUPT;
    return RATE_OK;
}

void rate__redis_cmd_free(rate__redis_cmd_t *c)
{
    if (c->k != NULL && c->k != c->kb)
        free(c->k);
    c->k = NULL;
    free(c->k2);
    c->k2 = NULL;
}

/* Whether a reply is NOSCRIPT (Redis restarted, or SCRIPT FLUSH). */
bool rate__redis_noscript(const redisReply *rep)
{
    return rep != NULL && rep->type == REDIS_REPLY_ERROR && rep->str != NULL &&
           strncmp(rep->str, "NOSCRIPT", 8) == 0;
}

/* The decimal digits of v. */
static size_t dec_digits(uint64_t v)
{
    size_t k = 1;
    for (; v >= 10000; v /= 10000)
        k += 4;
    return k + (v >= 10) + (v >= 100) + (v >= 1000);
}

/* v's k decimal digits, a prefix c before them and CRLF after, at p:
 * the end. */
static char *resp_line(char *p, char c, uint64_t v, size_t k)
{
    *p = c;
    for (size_t j = k; j > 0; j--, v /= 10)
        p[j] = (char)('0' + v % 10);
    p[k + 1] = '\r';
    p[k + 2] = '\n';
    return p + k + 3;
}

size_t rate__redis_resp(char *buf, size_t cap, int argc,
                        const char *const *av, const size_t *al)
{
    /* measured first (a dozen short arguments: cheaper than writing and
     * measuring at once), then written when it fits */
    size_t hk = dec_digits((uint64_t)argc), n = hk + 3;
    for (int i = 0; i < argc; i++)
        n += dec_digits(al[i]) + al[i] + 5;
    if (n > cap)
        return n;
    char *p = resp_line(buf, '*', (uint64_t)argc, hk);
    for (int i = 0; i < argc; i++) {
        p = resp_line(p, '$', al[i], dec_digits(al[i]));
        memcpy(p, av[i], al[i]);
        p += al[i];
        *p++ = '\r';
        *p++ = '\n';
    }
    return n;
}

/* Turns an EVALSHA (or FCALL) command into the EVAL of its script. */
void rate__redis_cmd_eval(rate__redis_cmd_t *c)
{
    c->av[0] = "EVAL", c->al[0] = 4;
    c->av[1] = c->script, c->al[1] = c->script_len;
}

/* A command's start: empty, and the key's name in it. */
static int cmd_key(const rate__redis_proto_t *p, const rate_key_t *key,
                   rate__redis_cmd_t *c)
{
    c->argc = 0;
    c->lean = -1;
    c->k = NULL;
    c->k2 = NULL;
    return rate__redis_key_name(p, key, c->kb, sizeof c->kb, &c->k, &c->kl);
}

/* The command of a load (HMGET of the version and the state). */
int rate__redis_load_cmd(const rate__redis_proto_t *p, const rate_key_t *key,
                         rate__redis_cmd_t *c)
{
    int rc;

    if ((rc = cmd_key(p, key, c)) != RATE_OK)
        return rc;
    c->argc = 4;
    c->av[0] = "HMGET", c->al[0] = 5;
    c->av[1] = c->k, c->al[1] = c->kl;
    c->av[2] = "v", c->al[2] = 1;
    c->av[3] = "s", c->al[3] = 1;
    c->script = NULL;
    c->script_len = 0;
    return RATE_OK;
}

/* A load's reply (after reply_ok): *state points into rep (NULL and 0
 * with *version 0 when absent). */
int rate__redis_load_parse(const redisReply *rep, const char **state,
                           size_t *len, uint64_t *version)
{
    int rc;

    *state = NULL;
    *len = 0;
    *version = 0;
    if (rep->type != REDIS_REPLY_ARRAY || rep->elements != 2)
        return RATE_ECORRUPT;
    if ((rc = parse_version(rep->element[0], version)) != RATE_OK)
        return rc;
    redisReply *e = rep->element[1];
    if (*version == 0 || e->type == REDIS_REPLY_NIL) {
        *version = 0; /* absent (or half-written: treat as absent) */
        return RATE_OK;
    }
    if (e->type != REDIS_REPLY_STRING || e->len == 0)
        return RATE_ECORRUPT; /* present, but no state: truncated */
    *state = e->str;
    *len = e->len;
    return RATE_OK;
}

/* v in decimal into out (at least 21 bytes), NUL-terminated: snprintf's
 * "%llu" without its cost (a decision's command has a dozen numbers). */
static void dec_u64(char *out, uint64_t v)
{
    static const char pairs[] = "00010203040506070809101112131415161718192021"
                                "22232425262728293031323334353637383940414243"
                                "44454647484950515253545556575859606162636465"
                                "66676869707172737475767778798081828384858687"
                                "888990919293949596979899";
    char *p = out + dec_digits(v);
    *p = '\0';
    for (; v >= 100; v /= 100) { /* two digits a division */
        unsigned r = (unsigned)(v % 100);
        *--p = pairs[2 * r + 1];
        *--p = pairs[2 * r];
    }
    if (v >= 10) {
        *--p = pairs[2 * v + 1];
        *--p = pairs[2 * v];
    } else {
        *--p = (char)('0' + v);
    }
}

/* The command of a compare-and-set (EVALSHA of cas_script); the state's
 * bytes stay the caller's. */
int rate__redis_cas_cmd(const rate__redis_proto_t *p, const rate_key_t *key,
                        uint64_t version, const void *state, size_t len,
                        uint64_t ttl_ns, rate__redis_cmd_t *c)
{
    int rc;

    if ((rc = cmd_key(p, key, c)) != RATE_OK)
        return rc;
    dec_u64(c->num[0], version);
    /* 0: no expiry (the script PERSISTs the key): for RATE_TTL_FOREVER
     * (the policy records) whatever the options, and for everything else
     * with no_ttl, unless it has a safety expiry. */
    uint64_t us = ttl_ns == RATE_TTL_FOREVER ? 0
                  : !p->ttl                  ? p->safety_us
                                             : rate__redis_ttl_us(ttl_ns);
    dec_u64(c->num[1], us);
    const char *av[7] = {"EVALSHA", p->sha, "1", c->k, c->num[0], state,
                         c->num[1]};
    size_t al[7] = {7, 40, 1, c->kl, strlen(c->num[0]), len,
                    strlen(c->num[1])};
    memcpy(c->av, av, sizeof av);
    memcpy(c->al, al, sizeof al);
    c->argc = 7;
    c->script = cas_script;
    c->script_len = sizeof cas_script - 1;
    return RATE_OK;
}

/* A compare-and-set's reply (after reply_ok). */
int rate__redis_cas_parse(const redisReply *rep)
{
    return rep->type != REDIS_REPLY_INTEGER ? RATE_ECORRUPT
           : rep->integer == 0              ? RATE_ECONFLICT
                                            : RATE_OK;
}

/* Whether every number the general Lua step meets stays below each
 * limit's algorithm's lua_step (2^50), where doubles are exact with room
 * for the products it forms; the script checks what it reads from the
 * state against the same bound (cmake/lua_range.cmake). */
static bool lua_can(const rate_decide_req_t *q)
{
    const rate_policy_t *p = q->policy;
    size_t count = rate_policy_count(p);
    if (count == 0 || count > RATE_MAX_LIMITS)
        return false;
    for (size_t i = 0; i < count; i++) {
        const rate_limit_t *l = rate_policy_limit(p, i);
        const rate__algo_t *a = l != NULL ? rate__algo_for(l) : NULL;
        if (a == NULL)
            return false;
        uint64_t exact = a->lua_step;
        /* B * P, C * P, L * W: the products the buckets' and the
         * sliding window's rules form.  The sliding log's forms none (its
         * counts stay within RATE_SLIDING_LOG_MAX): only 2 * W bounds it,
         * which keeps its entries' ages below the 2^20 s the script's
         * time differences reach.  So 10000/1m is the script's. */
        rate_u128_t prod = (rate_u128_t)l->period_ns *
                           (l->algorithm == RATE_SLIDING_LOG ? 1
                            : l->burst                       ? l->burst
                                                             : l->limit);
        if (q->permits >= exact || q->max_wait_ns >= exact ||
            l->limit >= exact || l->period_ns >= exact || prod * 2 >= exact)
            return false;
        if (l->block_ns != 0) /* a block's state is the C step's alone */
            return false;
    }
    return true;
}

static uint64_t gcd64(uint64_t a, uint64_t b)
{
    while (b != 0) {
        uint64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

/* Whether a lean script decides the request exactly (docs/redis.md, "Lean
 * scripts"), and if so which, with its own arguments (after the seven
 * every step script takes: the word's width, the operation, then the
 * algorithm's) in num.  The bounds are the algorithm's lua_lean (the lean
 * script reads the same as a constant): a bucket's word is sent in units
 * of g, a common divisor of L and P below 2^36, so that B * P / g <=
 * lua_lean (2^51); a fixed window's count at most lua_lean and its length
 * below it (2^52 ns); a sliding window's L * W at most lua_lean (2^52) and its length at
 * most half of it (2^51 ns, 26 days); a sliding log's length at most
 * lua_lean (2^51 ns). */
#define LEAN_G UINT64_C(10000000000) /* 10^10: g divides it, so g < 2^36 */

static int lean_of(const rate_decide_req_t *q, char num[][24], int *nn)
{
    const rate_policy_t *p = q->policy;
    if (rate_policy_count(p) != 1)
        return -1;
    const rate_limit_t *l = rate_policy_limit(p, 0);
    if (l == NULL || l->block_ns != 0 || l->limit == 0 || l->period_ns == 0)
        return -1;
    const rate__algo_t *a = rate__algo_for(l);
    if (a == NULL || a->lua_lean == 0)
        return -1;
    if (l->algorithm == RATE_TOKEN_BUCKET ||
        l->algorithm == RATE_LEAKY_BUCKET) {
        rate_u128_t full = (rate_u128_t)l->burst * l->period_ns;
        uint64_t g = gcd64(gcd64(l->limit, l->period_ns), LEAN_G);
        if (l->burst == 0 || full / g > a->lua_lean)
            return -1; /* past exact doubles */
        /* the word's width: 16 bytes for a wide bucket (B * P > 2^62) */
        dec_u64(num[(*nn)++], full > (rate_u128_t)1 << 62 ? 16u : 8u);
        dec_u64(num[(*nn)++], (uint64_t)q->op);
        dec_u64(num[(*nn)++], (l->limit / g));
        dec_u64(num[(*nn)++], (l->period_ns / g));
        dec_u64(num[(*nn)++], l->burst);
        dec_u64(num[(*nn)++], g);
        if (l->algorithm == RATE_LEAKY_BUCKET)
            return LEAN_LB;
        dec_u64(num[(*nn)++], ((UINT64_C(1) << 62) / g));
        return LEAN_TB;
    }
    if (l->algorithm == RATE_FIXED_WINDOW) {
        if (l->limit > a->lua_lean || l->period_ns >= a->lua_lean)
            return -1;
        dec_u64(num[(*nn)++], 8u);
        dec_u64(num[(*nn)++], (uint64_t)q->op);
        dec_u64(num[(*nn)++], l->limit);
        dec_u64(num[(*nn)++], l->period_ns);
        return LEAN_FW;
    }
    if (l->algorithm == RATE_SLIDING_WINDOW) {
        /* W at most half of it: an idle gap past 2^52 ns (dt's bound in
         * the script) then leaves no window of t_last's pair */
        if ((rate_u128_t)l->limit * l->period_ns > a->lua_lean ||
            l->period_ns > a->lua_lean / 2)
            return -1;
        dec_u64(num[(*nn)++], 16u); /* the two counts, 8 bytes each */
        dec_u64(num[(*nn)++], (uint64_t)q->op);
        dec_u64(num[(*nn)++], l->limit);
        dec_u64(num[(*nn)++], l->period_ns);
        return LEAN_SW;
    }
    if (l->algorithm == RATE_SLIDING_LOG) {
        if (l->period_ns > a->lua_lean)
            return -1;
        dec_u64(num[(*nn)++], 0u); /* the width: count, sum, then entries */
        dec_u64(num[(*nn)++], (uint64_t)q->op);
        dec_u64(num[(*nn)++], l->limit);
        dec_u64(num[(*nn)++], l->period_ns);
        return LEAN_SL;
    }
    return -1;
}

static uint64_t int_u64(long long v, bool *ok)
{
    if (v < -1) {
        *ok = false;
        return 0;
    }
    return v == -1 ? RATE_NEVER : (uint64_t)v;
}

/* The step's first seven arguments (see step.lua), which the lean
 * scripts and RATELIMIT.STEP take too: the time ("" "": Redis's TIME),
 * permits, max_wait, the expiry (0 none, -1 the decision's reset_after,
 * else microseconds, or milliseconds for the module: rounded up), the
 * policy's id and the state's format.  Returns how many it wrote. */
static int step_head(const rate__redis_proto_t *p, const rate_decide_req_t *q,
                     bool ms, char (*num)[24])
{
    int nn = 0;
    uint64_t ttl = !p->ttl ? p->safety_us /* 0: none */
                           : rate__redis_ttl_us(q->max_reset_ns);
    if (ms)
        ttl = (ttl + 999) / 1000;
    if (p->redis_time && q->clock_time) {
        num[nn++][0] = '\0';
        num[nn++][0] = '\0';
    } else {
        dec_u64(num[nn++], (q->now_ns / RATE_NS_PER_S));
        dec_u64(num[nn++], (q->now_ns % RATE_NS_PER_S));
    }
    dec_u64(num[nn++], q->permits);
    dec_u64(num[nn++], q->max_wait_ns);
    /* the step uses the exact reset: a detailed decision's, a change's */
    if (p->ttl && (q->detail || q->op != RATE_DECIDE_ACQUIRE))
        memcpy(num[nn++], "-1", 3);
    else
        dec_u64(num[nn++], ttl);
    dec_u64(num[nn++], q->policy_id);
    dec_u64(num[nn++], q->format);
    return nn;
}

/* The general step's four arguments per limit, after the head. */
static int step_limits(const rate_policy_t *p, char (*num)[24], int nn)
{
    for (size_t i = 0; i < rate_policy_count(p); i++) {
        const rate_limit_t *l = rate_policy_limit(p, i);
        dec_u64(num[nn++], (uint64_t)l->algorithm);
        dec_u64(num[nn++], l->limit);
        dec_u64(num[nn++], l->period_ns);
        dec_u64(num[nn++], l->burst);
    }
    return nn;
}

int rate__redis_step_args(const rate__redis_proto_t *p, bool module,
                          const rate_decide_req_t *q, char (*num)[24],
                          int *nn)
{
    const rate_policy_t *pol = q->policy;
    size_t count = rate_policy_count(pol);

    if (q->op != RATE_DECIDE_ACQUIRE || count == 0 ||
        count > RATE_MAX_LIMITS ||
        (q->format != RATE__FORMAT_V1 && q->format != RATE__FORMAT))
        return RATE_ENOTSUP;
    for (size_t i = 0; i < count; i++)
        if (rate_policy_limit(pol, i)->block_ns != 0)
            return RATE_ENOTSUP; /* a block: the compare-and-set path's */
    if (!module && !lua_can(q))
        return RATE_ENOTSUP;
    *nn += step_head(p, q, module, num + *nn);
    *nn = step_limits(pol, num, *nn);
    return RATE_OK;
}

/* The command of RATELIMIT.STEP (redis-module/): the general step's
 * arguments, the expiry in milliseconds.  RATE_ENOTSUP for what the
 * module does not decide: a block, a refund or a penalty. */
static int module_cmd(const rate__redis_proto_t *p, const rate_key_t *key,
                      const rate_decide_req_t *q, rate__redis_cmd_t *c)
{
    const rate_policy_t *pol = q->policy;
    size_t count = rate_policy_count(pol);
    int rc;

    if (q->op != RATE_DECIDE_ACQUIRE || count == 0 ||
        count > RATE_MAX_LIMITS)
        return RATE_ENOTSUP;
    for (size_t i = 0; i < count; i++)
        if (rate_policy_limit(pol, i)->block_ns != 0)
            return RATE_ENOTSUP; /* a block: the compare-and-set path's */
    if ((rc = cmd_key(p, key, c)) != RATE_OK)
        return rc;
    int nn = step_limits(pol, c->num, step_head(p, q, true, c->num));
    int argc = 0;
    c->av[argc] = "RATELIMIT.STEP", c->al[argc++] = 14;
    c->av[argc] = c->k, c->al[argc++] = c->kl;
    for (int i = 0; i < nn; i++)
        c->av[argc] = c->num[i], c->al[argc++] = strlen(c->num[i]);
    c->argc = argc;
    c->module = true;
    return RATE_OK;
}

/* The command of a decide() (protocol.h): via the module, RATELIMIT.STEP;
 * via the scripts, a lean script when one decides the request exactly
 * (c->lean its index; an FCALL with fcall), else the general step (see
 * step.lua for the arguments and replies).  RATE_ENOTSUP when it
 * cannot decide the request exactly (the limiter then decides itself,
 * and reads now() itself if it goes by Redis's clock); RATE_EINVAL for a
 * key of the policy space. */
int rate__redis_decide_cmd(const rate__redis_proto_t *p, rate__redis_via_t via,
                           bool fcall, const rate_key_t *key,
                           const rate_decide_req_t *q, rate__redis_cmd_t *c)
{
    int rc;

    c->argc = 0;
    c->lean = -1;
    c->module = false;
    c->script = NULL;
    c->script_len = 0;
    c->k = NULL; /* nothing to free before cmd_key */
    c->k2 = NULL;
    if (key != NULL && key->space == RATE_SPACE_POLICY)
        return RATE_EINVAL; /* records are no states to decide over */
    if (q->format != RATE__FORMAT_V1 && q->format != RATE__FORMAT)
        return RATE_ENOTSUP; /* the limiter decides, exactly */
    if (via == RATE__VIA_MODULE)
        return module_cmd(p, key, q, c);
    bool adjust = q->op != RATE_DECIDE_ACQUIRE;
    if (adjust && q->op != RATE_DECIDE_REFUND && q->op != RATE_DECIDE_PENALTY)
        return RATE_ENOTSUP; /* an operation this store does not know */
    int nn = step_head(p, q, false, c->num);
    int lean = p->lean ? lean_of(q, c->num, &nn) : -1;
    if (lean < 0) {
        /* Refunds and penalties only in the lean scripts: the general
         * script has no such branch (the C step then makes them). */
        if (adjust || !lua_can(q))
            return RATE_ENOTSUP; /* the limiter decides, exactly */
        nn = step_limits(q->policy, c->num, nn);
    }
    if ((rc = cmd_key(p, key, c)) != RATE_OK)
        return rc;
    int argc = 0;
    c->av[argc] = "EVALSHA", c->al[argc++] = 7;
    c->av[argc] = lean >= 0 ? p->lean_sha[lean] : p->step_sha,
    c->al[argc++] = 40;
    c->av[argc] = "1", c->al[argc++] = 1;
    c->av[argc] = c->k, c->al[argc++] = c->kl;
    if (lean >= 0) {
        /* the time, permits, max_wait, the operation (num[8]), then the
         * policy's numbers as one argument (lean.lua): the expiry, id,
         * format, the word's width (num[4..7]) and the algorithm's */
        for (int i = 0; i < 4; i++)
            c->av[argc] = c->num[i], c->al[argc++] = strlen(c->num[i]);
        c->av[argc] = c->num[8], c->al[argc++] = strlen(c->num[8]);
        size_t n = 0;
        for (int i = 4; i < nn; i++) {
            if (i == 8)
                continue;
            size_t l = strlen(c->num[i]);
            if (n > 0)
                c->pk[n++] = ' ';
            memcpy(c->pk + n, c->num[i], l);
            n += l;
        }
        c->av[argc] = c->pk, c->al[argc++] = n;
    } else {
        for (int i = 0; i < nn; i++)
            c->av[argc] = c->num[i], c->al[argc++] = strlen(c->num[i]);
    }
    c->argc = argc;
    c->lean = lean;
    if (lean >= 0) {
        c->script = lean_scripts[lean].src;
        c->script_len = lean_scripts[lean].len;
        if (fcall) {
            c->av[0] = "FCALL", c->al[0] = 5;
            c->av[1] = p->fn_name[lean], c->al[1] = strlen(p->fn_name[lean]);
        }
    } else {
        c->script = redis_step_lua;
        c->script_len = sizeof redis_step_lua - 1;
    }
    return RATE_OK;
}

/* Turns an FCALL of a lean script into its EVALSHA. */
void rate__redis_cmd_evalsha(const rate__redis_proto_t *p,
                             rate__redis_cmd_t *c)
{
    if (c->lean < 0)
        return;
    c->av[0] = "EVALSHA", c->al[0] = 7;
    c->av[1] = p->lean_sha[c->lean], c->al[1] = 40;
}

/* A step's reply whose elements are the integers v[0..n) (the reader's
 * own parse, rate__redis_ints_parse, or a reply object's): RATE_OK with
 * *d, or RATE_ENOTSUP (declined: nothing written, the limiter decides),
 * RATE_ECORRUPT (tag 2: the key is not a hash; or numbers out of range). */
int rate__redis_decide_ints(const long long *v, size_t n, rate_decision_t *d)
{
    long long tag = n >= 1 ? v[0] : -1;
    if (tag == 0 && n == 1)
        return RATE_ENOTSUP;
    if (tag != 1 || n != 9)
        return RATE_ECORRUPT;
    bool ok = true;
    memset(d, 0, sizeof *d);
    d->allowed = int_u64(v[1], &ok) == 1;
    /* checked before they are narrowed: 2^32 + 1 is no reason 1 */
    uint64_t reason = int_u64(v[2], &ok);
    ok = ok && reason <= RATE_REASON_NEVER && v[3] >= 0 &&
         v[3] < RATE_MAX_LIMITS;
    d->reason = ok ? (rate_reason_t)reason : RATE_REASON_ALLOWED;
    d->component = ok ? (int)v[3] : 0;
    d->limit = int_u64(v[4], &ok);
    d->remaining = int_u64(v[5], &ok);
    d->delay_ns = int_u64(v[6], &ok);
    d->retry_after_ns = int_u64(v[7], &ok);
    d->reset_after_ns = int_u64(v[8], &ok);
    return ok ? RATE_OK : RATE_ECORRUPT;
}

/* A step's reply, the scripts' and the module's (after reply_ok), as
 * rate__redis_decide_ints; an element that is no integer makes it
 * RATE_ECORRUPT, but for the component's (read as 0). */
int rate__redis_decide_parse(const redisReply *rep, rate_decision_t *d)
{
    long long v[9];
    if (rep->type != REDIS_REPLY_ARRAY || rep->elements < 1 ||
        rep->element[0]->type != REDIS_REPLY_INTEGER)
        return RATE_ECORRUPT;
    v[0] = rep->element[0]->integer;
    for (size_t i = 1; rep->elements == 9 && i < 9; i++) {
        const redisReply *e = rep->element[i];
        if (e->type == REDIS_REPLY_INTEGER)
            v[i] = e->integer;
        else if (i == 3)
            v[i] = 0;
        else
            return RATE_ECORRUPT;
    }
    return rate__redis_decide_ints(v, rep->elements, d);
}

/* One integer's line of a reply, ":[-]digits\r\n" at p[*i..len) as Redis
 * writes it: 1 with *out (*i past it), 0 when p ends before it does, -1
 * for anything else (more than 18 digits, a leading zero: hiredis's
 * reader has the last word). */
static int int_line(const char *p, size_t len, size_t *i, long long *out)
{
    size_t j = *i, d = 0;
    bool neg = false;
    long long x = 0;
    if (j == len)
        return 0;
    if (p[j++] != ':')
        return -1;
    if (j < len && p[j] == '-')
        neg = true, j++;
    for (; j < len && p[j] >= '0' && p[j] <= '9'; j++) {
        if (++d > 18)
            return -1;
        x = x * 10 + (p[j] - '0');
    }
    if (j == len || (p[j] == '\r' && j + 1 == len && d > 0))
        return 0;
    if (d == 0 || p[j] != '\r' || p[j + 1] != '\n')
        return -1;
    if (p[j - d] == '0' && (d > 1 || neg))
        return -1; /* "007", "-0": not Redis's, and readers differ on them */
    *i = j + 2;
    *out = neg ? -x : x;
    return 1;
}

long rate__redis_ints_parse(const char *p, size_t len, long long *v,
                            size_t cap, size_t *n)
{
    size_t i = 1, count = 0, d = 0;
    if (len == 0)
        return 0;
    if (p[0] != '*' || (len > 1 && p[1] == '0'))
        return -1;
    for (; i < len && p[i] >= '0' && p[i] <= '9'; i++) {
        if (++d > 4)
            return -1;
        count = count * 10 + (size_t)(p[i] - '0');
    }
    if (i == len || (p[i] == '\r' && i + 1 == len && d > 0))
        return 0;
    if (d == 0 || p[i] != '\r' || p[i + 1] != '\n' || count == 0 ||
        count > cap)
        return -1;
    i += 2;
    for (size_t e = 0; e < count; e++) {
        int k = int_line(p, len, &i, &v[e]);
        if (k <= 0)
            return k;
    }
    *n = count;
    return (long)i;
}

/* The Functions library of the lean scripts and the lease scripts (see
 * the struct): each script's text as a function's body, FNV-1a of their
 * texts the version. */
#define LEAN_CALL_MARK "\n--@call\n"

static int make_fn_lib(rate__redis_proto_t *p)
{
    /* the lean scripts, then the lease scripts (lease.c) */
    enum { FNS = LEAN_COUNT + 2 };
    static const char *tag[FNS] = {"tb", "lb", "fw", "sw", "sl", "lease",
                                   "leaserate"};
    const char *src[FNS];
    char *name[FNS];
    uint32_t h = 2166136261u;
    size_t len = 64;
    for (int i = 0; i < FNS; i++) {
        size_t sl = i < LEAN_COUNT ? lean_scripts[i].len : 0;
        src[i] = i < LEAN_COUNT    ? lean_scripts[i].src
                 : i == LEAN_COUNT ? rate__redis_lease_script(&sl)
                                   : rate__redis_lease_rate_script(&sl);
        name[i] = i < LEAN_COUNT    ? p->fn_name[i]
                  : i == LEAN_COUNT ? p->fn_lease
                                    : p->fn_lease_rate;
        for (size_t j = 0; j < sl; j++)
            h = (h ^ (unsigned char)src[i][j]) * 16777619u;
        len += sl + 128;
    }
    if ((p->fn_lib = malloc(len)) == NULL)
        return RATE_ENOMEM;
    size_t n = (size_t)snprintf(p->fn_lib, len,
                                "#!lua name=ratelimit_%08x\n", (unsigned)h);
    for (int i = 0; i < FNS; i++) {
        /* A lean script's part before its "--@call" line (lean_lib.lua)
         * runs once, at the library's load; the rest at each call. */
        const char *call = strstr(src[i], LEAN_CALL_MARK);
        int pre = call != NULL ? (int)(call - src[i]) : 0;
        const char *body = call != NULL ? call : src[i];
        snprintf(name[i], 32, "ratelimit_%s_%08x", tag[i], (unsigned)h);
        n += (size_t)snprintf(p->fn_lib + n, len - n,
                              "do\n%.*s\nredis.register_function('%s', "
                              "function(KEYS, ARGV)\n%s\nend)\nend\n",
                              pre, src[i], name[i], body);
    }
    p->fn_lib_len = n;
    return RATE_OK;
}

/* The scripts' names (EVALSHA's SHA-1), known before any server is
 * asked, so that a store that has not connected yet (a lazy one, an event
 * loop's) sends the right EVALSHA from its first command. */
static void script_names(rate__redis_proto_t *p)
{
    rate__sha1_hex(cas_script, sizeof cas_script - 1, p->sha);
    rate__sha1_hex(redis_step_lua, sizeof redis_step_lua - 1, p->step_sha);
    for (int i = 0; i < LEAN_COUNT; i++)
        rate__sha1_hex(lean_scripts[i].src, lean_scripts[i].len,
                       p->lean_sha[i]);
}

/* The expiry of each of KEYS (expire_at), in one call for a batch (a key
 * gone meanwhile is left gone). */
const char rate__redis_touch_script[] =
    EXPIRE_AT_LUA
    "local t = redis.call('TIME')\n"
    "local us = tonumber(ARGV[1])\n"
    "for _, k in ipairs(KEYS) do expire_at(k, us, t) end\n"
    "return #KEYS\n";
const size_t rate__redis_touch_script_len =
    sizeof rate__redis_touch_script - 1;

int rate__redis_proto_init(rate__redis_proto_t *p, const char *prefix,
                           bool ttl, uint64_t safety_ttl_ns, bool redis_time,
                           bool lean)
{
    memset(p, 0, sizeof *p);
    p->ttl = ttl;
    p->safety_us = !ttl && safety_ttl_ns != 0
                       ? rate__redis_ttl_us(safety_ttl_ns)
                       : 0;
    p->redis_time = redis_time;
    p->lean = lean;
    p->prefix_len = strlen(prefix);
    if ((p->prefix = malloc(p->prefix_len + 1)) == NULL)
        return RATE_ENOMEM;
    memcpy(p->prefix, prefix, p->prefix_len + 1);
    if (lean && make_fn_lib(p) != RATE_OK)
        return RATE_ENOMEM;
    script_names(p);
    return RATE_OK;
}

void rate__redis_proto_free(rate__redis_proto_t *p)
{
    free(p->prefix);
    free(p->fn_lib);
    p->prefix = p->fn_lib = NULL;
}

bool rate__redis_no_function(const redisReply *rep)
{
    return rep != NULL && rep->type == REDIS_REPLY_ERROR && rep->str != NULL &&
           (strstr(rep->str, "Function not found") != NULL ||
            strstr(rep->str, "unknown command") != NULL);
}

int rate__redis_time_parse(const redisReply *rep, uint64_t *ns)
{
    uint64_t s, us;
    if (rep->type != REDIS_REPLY_ARRAY || rep->elements != 2 ||
        rep->element[0]->type != REDIS_REPLY_STRING ||
        rep->element[1]->type != REDIS_REPLY_STRING ||
        !rate__parse_decimal(rep->element[0]->str, rep->element[0]->len,
                             RATE_TIME_MAX / RATE_NS_PER_S - 1, &s) ||
        !rate__parse_decimal(rep->element[1]->str, rep->element[1]->len,
                             999999, &us))
        return RATE_ECORRUPT;
    *ns = s * RATE_NS_PER_S + us * 1000;
    return RATE_OK;
}

bool rate__redis_has_module(const redisReply *rep)
{
    return rep->type == REDIS_REPLY_ARRAY && rep->elements == 1 &&
           rep->element[0]->type == REDIS_REPLY_ARRAY;
}
