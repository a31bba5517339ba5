/* SPDX-License-Identifier: MIT */
/*
 * The Redis store: keys shared by every process and machine that talks to
 * the same Redis, a single server or a Redis Cluster (docs/redis.md).
 * This file is the store itself: its URL, its tables (the synchronous
 * store's and, over the asynchronous transport, the event loop's), its
 * constructors and its extras (drop, touch, status).  The parts it is
 * made of: protocol.c (keys, scripts, commands, replies; no I/O),
 * cluster.c (the slot router), node.c (breaker and backoff), sync.c and
 * async.c (the transports).
 *
 * A decision is one round trip: RATELIMIT.STEP when the server has the
 * module (redis-module/, the C step itself), else a lean script (FCALL)
 * or the general step script (EVALSHA of step.lua, a Lua twin of
 * src/step.c over the same state bytes).  The scripts decline whatever
 * they cannot decide exactly in doubles (see docs/algorithms.md,
 * "Stores"), and any state that makes no sense, writing nothing; decide()
 * then returns RATE_ENOTSUP and the limiter runs the C step over the
 * generic contract, which this store also implements: load is one HMGET
 * of the key's version and state, cas one EVALSHA of a short script that
 * replaces the state only if the version is unchanged.  A Redis key of
 * another type than a hash (WRONGTYPE) is RATE_ECORRUPT from load, cas and
 * decide, and is never written over.  A refund or a penalty asked of
 * decide() (store contract version 4) is a lean script's, for the single
 * limits those scripts decide; anything else is declined, and the limiter
 * makes it over load and cas.
 *
 * The store's clock, now(), is Redis's TIME, unless the store was made
 * with client_time: then now() is RATE_ENOTSUP and the limiter keeps to
 * its own clock.  rate_store_redis_touch() refreshes the expiry of every
 * key under the prefix, records too.
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <hiredis/hiredis.h>

#include "async.h"
#include "fair.h"
#include "lease.h"
#include "sync.h"

#define deadline_of rate__rsync_deadline

/* ------------------------------------------------------------------ URL */

static bool copy_part(char *dst, size_t cap, const char *s, size_t n)
{
    if (n >= cap)
        return false;
    memcpy(dst, s, n);
    dst[n] = '\0';
    return true;
}

static bool parse_int(const char *s, size_t n, int max, int *out)
{
    uint64_t v;
    if (!rate__parse_decimal(s, n, (uint64_t)max, &v))
        return false;
    *out = (int)v;
    return true;
}

/* One seed, host[:port] or [v6][:port], from p to end. */
static int parse_seed(rc_addr_t *s, const char *url, const char *p,
                      const char *end, char *err, size_t errlen)
{
    const char *colon = NULL, *hs = p, *he;
    s->port = 6379;
    if (p < end && *p == '[') { /* [IPv6] */
        const char *close = memchr(p, ']', (size_t)(end - p));
        if (close == NULL)
            return rate__fail(err, errlen, RATE_EINVAL,
                              "'%s': unclosed '[' in host", url);
        hs = p + 1;
        he = close;
        if (close + 1 < end) {
            if (close[1] != ':')
                return rate__fail(err, errlen, RATE_EINVAL,
                                  "'%s': text after ']' in host", url);
            colon = close + 1;
        }
    } else {
        colon = memchr(p, ':', (size_t)(end - p));
        he = colon ? colon : end;
    }
    if (he == hs || !copy_part(s->host, sizeof s->host, hs, (size_t)(he - hs)))
        return rate__fail(err, errlen, RATE_EINVAL,
                          "'%s': missing or too long host", url);
    if (colon != NULL &&
        (!parse_int(colon + 1, (size_t)(end - colon - 1), 65535, &s->port) ||
         s->port == 0))
        return rate__fail(err, errlen, RATE_EINVAL,
                          "'%s': port is not a number from 1 to 65535", url);
    return RATE_OK;
}

/* redis://[[user]:password@]host[:port][,host[:port]...][/db]  or
 * unix:///path */
static int parse_url(redis_store_t *r, const char *url, char *err,
                     size_t errlen)
{
    const char *p, *end;

    if (strncmp(url, "unix://", 7) == 0) {
        r->unix_socket = true;
        r->nseeds = 1;
        if (url[7] != '/' || !copy_part(r->seeds[0].host,
                                        sizeof r->seeds[0].host, url + 7,
                                        strlen(url + 7)))
            return rate__fail(err, errlen, RATE_EINVAL,
                              "'%s': unix:// needs an absolute socket path",
                              url);
        return RATE_OK;
    }
    if (strncmp(url, "rediss://", 9) == 0)
        return rate__fail(err, errlen, RATE_EINVAL,
                          "'%s': TLS (rediss://) is not supported "
                          "(Debian 12's hiredis 0.14 has none)", url);
    if (strncmp(url, "redis://", 8) != 0)
        return rate__fail(err, errlen, RATE_EINVAL,
                          "'%s' is not "
                          "redis://[user:password@]host[:port][,host[:port]"
                          "...][/db] or unix:///path", url);
    p = url + 8;
    end = p + strlen(p);
    const char *at = memchr(p, '@', (size_t)(end - p));
    if (at != NULL) {
        const char *colon = memchr(p, ':', (size_t)(at - p));
        if (colon == NULL)
            return rate__fail(
                err, errlen, RATE_EINVAL,
                "'%s': credentials are user:password@ or :password@", url);
        if (!copy_part(r->user, sizeof r->user, p, (size_t)(colon - p)) ||
            !copy_part(r->password, sizeof r->password, colon + 1,
                       (size_t)(at - colon - 1)))
            return rate__fail(err, errlen, RATE_EINVAL,
                              "'%s': credentials too long", url);
        p = at + 1;
    }
    const char *slash = memchr(p, '/', (size_t)(end - p));
    const char *hostend = slash ? slash : end;
    for (;;) {
        const char *comma = memchr(p, ',', (size_t)(hostend - p));
        const char *se = comma ? comma : hostend;
        if (r->nseeds == RATE__REDIS_MAX_SEEDS)
            return rate__fail(err, errlen, RATE_EINVAL,
                              "'%s': more than %d hosts", url,
                              RATE__REDIS_MAX_SEEDS);
        int rc = parse_seed(&r->seeds[r->nseeds++], url, p, se, err, errlen);
        if (rc != RATE_OK)
            return rc;
        if (comma == NULL)
            break;
        p = comma + 1;
    }
    if (slash != NULL && slash + 1 < end &&
        !parse_int(slash + 1, (size_t)(end - slash - 1), 1 << 20, &r->db))
        return rate__fail(err, errlen, RATE_EINVAL,
                          "'%s': database is not a whole number", url);
    return RATE_OK;
}

/* rate__redis_reply_ok, and an error reply that becomes a store error
 * (NOPERM of an ACL, OOM of a full Redis) or RATE_ECORRUPT (WRONGTYPE: a
 * key of another type) kept as the store's last error. */
static int reply_ok(redis_store_t *r, int rc, const redisReply *rep)
{
    rc = rate__redis_reply_ok(rc, rep);
    if ((rc == RATE_ESTORE || rc == RATE_ECORRUPT) && rep != NULL &&
        rep->type == REDIS_REPLY_ERROR)
        rate__rsync_replied(r, rep->str != NULL ? rep->str : "");
    return rc;
}

static int r_load(void *self, const rate_key_t *key, void *buf, size_t cap,
                  size_t *len, uint64_t *version)
{
    redis_store_t *r = self;
    rate__redis_cmd_t c;
    int rc;

    *len = 0;
    *version = 0;
    if ((rc = rate__redis_load_cmd(&r->proto, key, &c)) != RATE_OK)
        return rc;
    redisReply *rep = NULL;
    rc = rate__rsync_call(r, deadline_of(r), c.k, c.kl, c.argc, c.av, c.al,
                          &rep);
    rc = reply_ok(r, rc, rep);
    if (rc == RATE_OK) {
        const char *st;
        if ((rc = rate__redis_load_parse(rep, &st, len, version)) == RATE_OK &&
            *len > 0) {
            if (*len > cap)
                rc = RATE_EINVAL; /* the limiter retries with more room */
            else
                memcpy(buf, st, *len);
        }
    }
    freeReplyObject(rep);
    rate__redis_cmd_free(&c);
    return rc;
}

static int r_cas(void *self, const rate_key_t *key, uint64_t version,
                 const void *state, size_t len, uint64_t ttl_ns)
{
    redis_store_t *r = self;
    rate__redis_cmd_t c;
    int rc;

    if ((rc = rate__redis_cas_cmd(&r->proto, key, version, state, len,
                                  ttl_ns, &c)) != RATE_OK)
        return rc;
    redisReply *rep = NULL;
    uint64_t dl = deadline_of(r);
    rc = rate__rsync_call(r, dl, c.k, c.kl, c.argc, c.av, c.al, &rep);
    if (rc == RATE_OK && rate__redis_noscript(rep)) {
        /* Redis restarted or SCRIPT FLUSH: send the script itself. */
        freeReplyObject(rep);
        rate__redis_cmd_eval(&c);
        rep = NULL;
        rc = rate__rsync_call(r, dl, c.k, c.kl, c.argc, c.av, c.al, &rep);
    }
    rc = reply_ok(r, rc, rep);
    if (rc == RATE_OK)
        rc = rate__redis_cas_parse(rep);
    freeReplyObject(rep);
    rate__redis_cmd_free(&c);
    return rc;
}

/* Redis's TIME in ns: RATE_ECORRUPT for a reply that is not two numbers
 * (or a time past RATE_TIME_MAX). */
static int redis_now(redis_store_t *r, uint64_t *out)
{
    redisReply *rep = NULL;
    int rc = rate__rsync_call(r, deadline_of(r), NULL, 0, 1,
                              (const char *[]){"TIME"}, (size_t[]){4}, &rep);
    rc = reply_ok(r, rc, rep);
    if (rc == RATE_OK)
        rc = rate__redis_time_parse(rep, out);
    freeReplyObject(rep);
    return rc;
}

/* The store's clock: Redis's TIME, one clock for every client.  With
 * client_time, RATE_ENOTSUP: the limiter keeps to its own clock. */
static int r_now(void *self, uint64_t *now_ns)
{
    redis_store_t *r = self;

    if (!r->proto.redis_time)
        return RATE_ENOTSUP;
    return redis_now(r, now_ns);
}

/* After an FCALL answered "no such function" (a node without the
 * library, loaded on first use: a new node, a restart without
 * persistence, FUNCTION FLUSH): the library loaded there, then c called
 * again into *rep.  A server that will not load it (before Redis 7, or a
 * user without the right) gets c's script by EVAL instead, and this
 * store's scripts from now on (FCALL off). */
static int fcall_again(redis_store_t *r, uint64_t dl, rate__redis_cmd_t *c,
                       redisReply **rep)
{
    int rc = rate__rsync_call(r, dl, c->k, c->kl, 4,
               (const char *[]){"FUNCTION", "LOAD", "REPLACE",
                                r->proto.fn_lib},
               (size_t[]){8, 4, 7, r->proto.fn_lib_len}, rep);
    bool loaded = rc == RATE_OK && (*rep)->type == REDIS_REPLY_STRING;
    /* another caller loaded it first: it is there */
    loaded |= rc == RATE_OK && (*rep)->type == REDIS_REPLY_ERROR &&
              strstr((*rep)->str, "already exists") != NULL;
    freeReplyObject(*rep);
    *rep = NULL;
    if (!loaded && (rc == RATE_OK || rc == RATE_ESTORE)) {
        atomic_store(&r->paths.fcall, false);
        rate__redis_cmd_eval(c);
    }
    if (rc == RATE_OK || rc == RATE_ESTORE)
        rc = rate__rsync_call(r, dl, c->k, c->kl, c->argc, c->av, c->al, rep);
    return rc;
}

/* A decision answered {2, ...}: the key is no hash (a list, a string,
 * another program's), found by the script or the module.  Named, with the
 * key, as the last error, as an error reply is.  iv: the reply read as
 * integers, else rep. */
static void note_wrongtype(redis_store_t *r, const rate__redis_cmd_t *c,
                           const rate__rsync_ints_t *iv, const redisReply *rep)
{
    bool two = iv != NULL ? iv->n > 0 && iv->v[0] == 2
                          : rep != NULL && rep->type == REDIS_REPLY_ARRAY &&
                                rep->elements > 0 &&
                                rep->element[0]->type == REDIS_REPLY_INTEGER &&
                                rep->element[0]->integer == 2;
    if (!two)
        return;
    char e[200];
    snprintf(e, sizeof e, "WRONGTYPE: '%.*s' is not a hash",
             (int)(c->kl > 120 ? 120 : c->kl), c->k);
    rate__rsync_replied(r, e);
}

/* decide() by the scripts, in one round trip: the lean script's FCALL
 * when the server has the Functions library (loaded on first use), else
 * an EVALSHA.  Returns RATE_ENOTSUP when the script declines (nothing
 * written), RATE_ECORRUPT for a key that is not a hash or a reply that
 * does not parse. */
static int r_decide(void *self, const rate_key_t *key,
                    const rate_decide_req_t *q, rate_decision_t *d)
{
    redis_store_t *r = self;
    rate__redis_cmd_t c;
    int rc;

    bool adjust = q->op != RATE_DECIDE_ACQUIRE;
    bool fcall = atomic_load(&r->paths.fcall);
    if ((rc = rate__redis_decide_cmd(&r->proto, RATE__VIA_SCRIPTS, fcall, key,
                                     q, &c)) != RATE_OK) {
        if (rc == RATE_ENOTSUP)
            atomic_fetch_add(adjust ? &r->st_adj_declined : &r->st_declined,
                             1);
        return rc;
    }
    int lean = c.lean;
    fcall = fcall && lean >= 0;
    redisReply *rep = NULL;
    rate__rsync_ints_t iv;
    uint64_t dl = deadline_of(r);
    rc = rate__rsync_call_ints(r, dl, c.k, c.kl, c.argc, c.av, c.al, &iv,
                               &rep);
    /* the usual reply, read as integers; else a reply object */
    bool ints = rc == RATE_OK && rep == NULL;
    if (!ints && fcall && rc == RATE_OK && rate__redis_no_function(rep)) {
        freeReplyObject(rep);
        rep = NULL;
        rc = fcall_again(r, dl, &c, &rep);
    } else if (!ints && rc == RATE_OK && rate__redis_noscript(rep)) {
        freeReplyObject(rep); /* Redis restarted or SCRIPT FLUSH */
        rate__redis_cmd_eval(&c);
        rep = NULL;
        rc = rate__rsync_call(r, dl, c.k, c.kl, c.argc, c.av, c.al, &rep);
    }
    if (!ints)
        rc = reply_ok(r, rc, rep);
    if (rc == RATE_OK) {
        rc = ints ? rate__redis_decide_ints(iv.v, iv.n, d)
                  : rate__redis_decide_parse(rep, d);
        if (rc == RATE_ECORRUPT)
            note_wrongtype(r, &c, ints ? &iv : NULL, rep);
        if (rc == RATE_ENOTSUP)
            atomic_fetch_add(adjust ? &r->st_adj_declined : &r->st_declined,
                             1);
        else if (rc == RATE_OK)
            atomic_fetch_add(adjust      ? &r->st_lean_adj
                             : lean >= 0 ? &r->st_lean
                                         : &r->st_general,
                             1);
        if (rc == RATE_OK && !adjust && lean >= 0 &&
            !(c.al[0] == 5 && memcmp(c.av[0], "FCALL", 5) == 0))
            atomic_fetch_add(&r->st_lean_evalsha, 1);
    }
    freeReplyObject(rep);
    rate__redis_cmd_free(&c);
    return rc;
}

/* Forgets the key: RATE_OK whether or not it was there. */
static int r_remove(void *self, const rate_key_t *key)
{
    redis_store_t *r = self;
    char kb[RATE_KEY_MAX + 300], *k;
    size_t kl;
    int rc;

    if ((rc = rate__redis_key_name(&r->proto, key, kb, sizeof kb, &k, &kl)) !=
        RATE_OK)
        return rc;
    redisReply *rep = NULL;
    rc = rate__rsync_call(r, deadline_of(r), k, kl, 2,
                          (const char *[]){"UNLINK", k},
               (size_t[]){6, kl}, &rep);
    rc = reply_ok(r, rc, rep);
    if (rc == RATE_OK && rep->type != REDIS_REPLY_INTEGER)
        rc = RATE_ECORRUPT;
    freeReplyObject(rep);
    if (k != kb)
        free(k);
    return rc;
}

static void r_destroy(void *self)
{
    redis_store_t *r = self;

    rate__rsync_fini(r);
    rate__redis_proto_free(&r->proto);
    free(r);
}

/* ------------------------------------------------------ ratelimit.so */

/* The module (redis-module/, docs/redis-module.md): RATELIMIT.STEP takes
 * the step script's arguments and gives its replies, and decides every
 * policy but a blocking one exactly (no 2^50 bound), over the same keys.
 * Whether the server has it is asked once (COMMAND INFO); a decision
 * answered "unknown command" is made by the scripts at once, and the
 * module tried again no sooner than RATE__MODULE_RETRY_NS later. */
#define MODULE_GONE 100 /* module_decide: no module there; not a RATE_E* */

/* Whether the server has RATELIMIT.STEP: RATE_OK with *has, or the
 * store's error. */
static int module_probe(redis_store_t *r, bool *has)
{
    redisReply *rep = NULL;
    int rc = rate__rsync_call(r, deadline_of(r), NULL, 0, 3,
                   (const char *[]){"COMMAND", "INFO", "ratelimit.step"},
                   (size_t[]){7, 4, 14}, &rep);
    /* An error reply (an ACL without COMMAND) counts as no module: the
     * retry after RATE__MODULE_RETRY_NS tries the command itself. */
    if (rc == RATE_OK)
        *has = rate__redis_has_module(rep);
    freeReplyObject(rep);
    return rc;
}

/* Whether to try the module for this decision (probing it if need be);
 * *rc the probe's failure (RATE_OK when none), which is the decision's:
 * one call never waits for more than one command's timeout. */
static bool module_wanted(redis_store_t *r, int *rc)
{
    *rc = RATE_OK;
    if (r->paths.module_mode == RATE_REDIS_MODULE_OFF)
        return false;
    int st = atomic_load_explicit(&r->paths.module_state, memory_order_relaxed);
    if (st == RATE__MODULE_ON)
        return true;
    if (st == RATE__MODULE_OFF) {
        uint64_t now = rate_clock_monotonic_ns();
        uint64_t at = atomic_load(&r->paths.module_retry_at_ns);
        /* One caller tries again once the pause is over. */
        return now >= at &&
               atomic_compare_exchange_strong(&r->paths.module_retry_at_ns, &at,
                                              now + RATE__MODULE_RETRY_NS);
    }
    bool has = false;
    if ((*rc = module_probe(r, &has)) != RATE_OK)
        return false; /* asked again at the next decision */
    atomic_store(&r->paths.module_retry_at_ns,
                 rate_clock_monotonic_ns() + RATE__MODULE_RETRY_NS);
    atomic_store(&r->paths.module_state, has ? RATE__MODULE_ON : RATE__MODULE_OFF);
    return has;
}

/* One round trip: RATELIMIT.STEP.  As r_decide, or MODULE_GONE for an
 * error reply ("unknown command": nothing was written). */
static int module_decide(redis_store_t *r, const rate_key_t *key,
                         const rate_decide_req_t *q, rate_decision_t *d)
{
    rate__redis_cmd_t c;
    int rc = rate__redis_decide_cmd(&r->proto, RATE__VIA_MODULE, false, key,
                                    q, &c);
    if (rc != RATE_OK)
        return rc;
    redisReply *rep = NULL;
    rate__rsync_ints_t iv;
    rc = rate__rsync_call_ints(r, deadline_of(r), c.k, c.kl, c.argc, c.av,
                               c.al, &iv, &rep);
    if (rc == RATE_OK && rep == NULL) {
        if ((rc = rate__redis_decide_ints(iv.v, iv.n, d)) == RATE_ECORRUPT)
            note_wrongtype(r, &c, &iv, NULL);
    } else if (rc == RATE_OK && rep->type == REDIS_REPLY_ERROR) {
        /* "unknown command" (unloaded, a server without it), NOPERM, or
         * anything else the module itself never answers to the store's
         * requests: the scripts decide, and report what they meet. */
        rc = MODULE_GONE;
    } else if ((rc = reply_ok(r, rc, rep)) == RATE_OK) {
        if ((rc = rate__redis_decide_parse(rep, d)) == RATE_ECORRUPT)
            note_wrongtype(r, &c, NULL, rep);
    }
    freeReplyObject(rep);
    rate__redis_cmd_free(&c);
    return rc;
}

/* decide(): the module when the server has it, else the scripts. */
static int r_decide_any(void *self, const rate_key_t *key,
                        const rate_decide_req_t *q, rate_decision_t *d)
{
    redis_store_t *r = self;
    int probe_rc = RATE_OK;

    /* Refunds and penalties: the lean scripts' alone (RATELIMIT.STEP
     * makes admissions only), over the same bytes as the module's. */
    if (key != NULL && key->space != RATE_SPACE_POLICY &&
        q->op == RATE_DECIDE_ACQUIRE && module_wanted(r, &probe_rc)) {
        int rc = module_decide(r, key, q, d);
        if (rc != MODULE_GONE) {
            if (rc == RATE_OK)
                atomic_fetch_add_explicit(&r->st_module, 1,
                                          memory_order_relaxed);
            /* The module answered (a retry after a fallback found it
             * back): use it from now on. */
            if ((rc == RATE_OK || rc == RATE_ENOTSUP ||
                 rc == RATE_ECORRUPT) &&
                atomic_load_explicit(&r->paths.module_state,
                                     memory_order_relaxed) != RATE__MODULE_ON)
                atomic_store(&r->paths.module_state, RATE__MODULE_ON);
            return rc;
        }
        atomic_fetch_add(&r->st_module_fallbacks, 1);
        atomic_store(&r->paths.module_retry_at_ns,
                     rate_clock_monotonic_ns() + RATE__MODULE_RETRY_NS);
        atomic_store(&r->paths.module_state, RATE__MODULE_OFF);
    }
    if (probe_rc != RATE_OK)
        return probe_rc; /* Redis did not answer: nor would the script */
    return r_decide(self, key, q, d);
}

/* One lease command (lease.h): RATE_OK once answered, with *rep. */
static int lease_call(redis_store_t *r, bool module, const rate_key_t *key,
                      const rate_lease_req_t *q, uint64_t dl,
                      redisReply **rep)
{
    rate__redis_cmd_t c;
    bool fcall = !module && atomic_load(&r->paths.fcall);
    int rc = rate__redis_lease_cmd(&r->proto, module, fcall, key, q, &c);
    if (rc != RATE_OK)
        return rc;
    rc = rate__rsync_call(r, dl, c.k, c.kl, c.argc, c.av, c.al, rep);
    if (fcall && rc == RATE_OK && rate__redis_no_function(*rep)) {
        freeReplyObject(*rep);
        *rep = NULL;
        rc = fcall_again(r, dl, &c, rep);
    } else if (!module && rc == RATE_OK && rate__redis_noscript(*rep)) {
        freeReplyObject(*rep); /* Redis restarted or SCRIPT FLUSH */
        *rep = NULL;
        rate__redis_cmd_eval(&c);
        rc = rate__rsync_call(r, dl, c.k, c.kl, c.argc, c.av, c.al, rep);
    }
    rate__redis_cmd_free(&c);
    return rc;
}

/* lease() (store contract version 5): one round trip, RATELIMIT.LEASE
 * when the server has the module, else the lease script.  A module
 * without RATELIMIT.LEASE (an older ratelimit.so) answers an error: the
 * script makes this one and every later lease of this store. */
static int r_lease(void *self, const rate_key_t *key, rate_lease_req_t *q)
{
    redis_store_t *r = self;
    int probe_rc = RATE_OK, rc;
    redisReply *rep = NULL;
    uint64_t dl = deadline_of(r);

    if (r->paths.generic_leases)
        return RATE_ENOTSUP;
    bool module = !atomic_load_explicit(&r->paths.lease_no_module,
                                        memory_order_relaxed) &&
                  module_wanted(r, &probe_rc);
    if (probe_rc != RATE_OK)
        return probe_rc; /* Redis did not answer */
    rc = lease_call(r, module, key, q, dl, &rep);
    if (module && rc == RATE_OK && rep->type == REDIS_REPLY_ERROR &&
        rep->str != NULL && strstr(rep->str, "unknown command") != NULL) {
        freeReplyObject(rep);
        rep = NULL;
        atomic_store(&r->paths.lease_no_module, true);
        module = false;
        rc = lease_call(r, false, key, q, dl, &rep);
    }
    rc = reply_ok(r, rc, rep);
    if (rc == RATE_OK)
        rc = rate__redis_lease_parse(rep, q);
    if (rc == RATE_OK || rc == RATE_ELEASE || rc == RATE_EEXPIRED)
        atomic_fetch_add_explicit(module ? &r->st_module_leases
                                         : &r->st_script_leases,
                                  1, memory_order_relaxed);
    freeReplyObject(rep);
    return rc;
}

/* One fair command (fair.h): RATE_OK once answered, with *rep. */
static int fair_call(redis_store_t *r, bool module, const rate_key_t *key,
                     const rate_decide_req_t *q, const rate_fair_req_t *f,
                     uint64_t dl, redisReply **rep)
{
    rate__redis_fair_cmd_t c;
    int rc = rate__redis_fair_cmd(&r->proto, module, key, q, f, &c);
    if (rc == RATE_OK) {
        rc = rate__rsync_call(r, dl, c.c.k, c.c.kl, c.argc, c.av, c.al, rep);
        if (!module && rc == RATE_OK && rate__redis_noscript(*rep)) {
            freeReplyObject(*rep); /* Redis restarted or SCRIPT FLUSH */
            *rep = NULL;
            rate__redis_fair_eval(&c);
            rc = rate__rsync_call(r, dl, c.c.k, c.c.kl, c.argc, c.av, c.al,
                                  rep);
        }
    }
    rate__redis_fair_free(&c);
    return rc;
}

/* fair() (store contract version 6): one round trip, RATELIMIT.FAIR when
 * the server has the module, else the fair script.  A module without
 * RATELIMIT.FAIR (an older ratelimit.so) answers an error: the script
 * makes this one and every later fair decision of this store. */
static int r_fair(void *self, const rate_key_t *key,
                  const rate_decide_req_t *q, rate_fair_req_t *f,
                  rate_decision_t *d)
{
    redis_store_t *r = self;
    int probe_rc = RATE_OK, rc;
    redisReply *rep = NULL;
    uint64_t dl = deadline_of(r);

    bool module = !atomic_load_explicit(&r->paths.fair_no_module,
                                        memory_order_relaxed) &&
                  module_wanted(r, &probe_rc);
    if (probe_rc != RATE_OK)
        return probe_rc; /* Redis did not answer */
    rc = fair_call(r, module, key, q, f, dl, &rep);
    if (module && rc == RATE_OK && rep->type == REDIS_REPLY_ERROR &&
        rep->str != NULL && strstr(rep->str, "unknown command") != NULL) {
        freeReplyObject(rep);
        rep = NULL;
        atomic_store(&r->paths.fair_no_module, true);
        module = false;
        rc = fair_call(r, false, key, q, f, dl, &rep);
    }
    if (rc == RATE_OK)
        rc = reply_ok(r, rc, rep);
    if (rc == RATE_OK)
        rc = rate__redis_fair_parse(rep, d, f);
    if (rc == RATE_OK)
        atomic_fetch_add_explicit(module ? &r->st_module_fair
                                         : &r->st_script_fair,
                                  1, memory_order_relaxed);
    freeReplyObject(rep);
    return rc;
}

static const rate_store_methods_t redis_methods = {
    .version = RATE_STORE_VERSION,
    .name = "redis",
    .load = r_load,
    .cas = r_cas,
    .decide = r_decide_any,
    .now = r_now,
    .remove = r_remove,
    .destroy = r_destroy,
    .decide_changes = true, /* the lean scripts' refunds and penalties */
    .lease = r_lease,
    .lease_rate = true, /* an acquire with its rate limits, one command */
    .fair = r_fair,
};

/* What the asynchronous transport needs of the store's settings. */
static void async_conf(const redis_store_t *r, rate__redis_conf_t *out)
{
    memset(out, 0, sizeof *out);
    out->host = r->seeds[0].host;
    out->port = r->unix_socket ? 0 : r->seeds[0].port;
    out->user = r->user;
    out->password = r->password;
    out->db = r->db;
    out->cluster = r->cluster;
    out->command_ns = r->command_ns;
    out->connect_ns = r->connect_ns;
    out->breaker = r->breaker;
}

/* rate_store_redis_new, which with try_now false and lazy_connect does
 * not try to connect at all (the asynchronous store's, whose creation
 * must not wait for a Redis that accepts and never answers). */
static int redis_new(const char *url, const rate_redis_options_t *opt,
                     bool try_now, rate_store_t **out, char *err,
                    size_t errlen)
{
    rate_redis_options_t o = {0};
    redis_store_t *r;
    int rc;

    if (out == NULL)
        return rate__fail(err, errlen, RATE_EINVAL, "out is NULL");
    *out = NULL;
    if (url == NULL)
        return rate__fail(err, errlen, RATE_EINVAL, "the Redis URL is NULL");
    if (opt != NULL)
        o = *opt;
    if (!RATE__RESERVED_ZERO(&o))
        return rate__fail(err, errlen, RATE_EINVAL, "the options' reserved "
                          "words are not zero (a field of a later version?)");
    if (o.pool_size > 1024)
        return rate__fail(err, errlen, RATE_EINVAL, "pool_size %u above 1024",
                          o.pool_size);
    if (o.module != RATE_REDIS_MODULE_AUTO && o.module != RATE_REDIS_MODULE_ON &&
        o.module != RATE_REDIS_MODULE_OFF)
        return rate__fail(err, errlen, RATE_EINVAL,
                          "module %d is none of RATE_REDIS_MODULE_AUTO, _ON "
                          "and _OFF", (int)o.module);
    /* each is added to a clock reading: above RATE_TIME_MAX it could wrap */
    const struct {
        const char *name;
        uint64_t ns;
    } spans[] = {{"connect_timeout_ns", o.connect_timeout_ns},
                 {"command_timeout_ns", o.command_timeout_ns},
                 {"breaker_cooldown_ns", o.breaker_cooldown_ns}};
    for (size_t i = 0; i < sizeof spans / sizeof spans[0]; i++)
        if (spans[i].ns > RATE_TIME_MAX)
            return rate__fail(err, errlen, RATE_EINVAL,
                              "%s of %llu ns, above RATE_TIME_MAX",
                              spans[i].name, (unsigned long long)spans[i].ns);
    r = calloc(1, sizeof *r);
    if (r == NULL)
        return RATE_ENOMEM;
    rate__rsync_init(r);
    if ((rc = parse_url(r, url, err, errlen)) != RATE_OK) {
        r_destroy(r);
        return rc;
    }
    r->connect_ns = o.connect_timeout_ns ? o.connect_timeout_ns : RATE_NS_PER_S;
    r->command_ns = o.command_timeout_ns ? o.command_timeout_ns : RATE_NS_PER_S;
    r->lazy = o.lazy_connect;
    r->breaker.on = !o.no_breaker;
    r->breaker.failures = o.breaker_failures ? o.breaker_failures
                                             : RATE__REDIS_BREAKER_FAILURES;
    r->breaker.cooldown_ns = o.breaker_cooldown_ns
                                 ? o.breaker_cooldown_ns
                                 : RATE__REDIS_BREAKER_COOLDOWN_NS;
    r->pool = o.pool_size ? o.pool_size : 2;
    r->paths.module_mode = o.module;
    r->paths.generic_leases = o.generic_leases != 0;
    const char *prefix = o.prefix ? o.prefix : "ratelimit:";
    if (strlen(prefix) > 256) {
        r_destroy(r);
        return rate__fail(err, errlen, RATE_EINVAL,
                          "prefix of %zu bytes, above 256", strlen(prefix));
    }
    if (strpbrk(prefix, "{}") != NULL) { /* its own hash tag: protocol.c */
        r_destroy(r);
        return rate__fail(err, errlen, RATE_EINVAL,
                          "prefix '%s' holds a brace: each key's '{' must be "
                          "the first, for its Cluster hash tag", prefix);
    }
    if (rate__redis_proto_init(&r->proto, prefix, !o.no_ttl, o.safety_ttl_ns,
                               !o.client_time, !o.general_script) !=
        RATE_OK) {
        r_destroy(r);
        return RATE_ENOMEM;
    }
    atomic_store(&r->paths.fcall, r->proto.lean);
    /* Connect now, so that a wrong host or password is reported here; a
     * lazy store connects at its first calls instead if it cannot (and
     * does not even try now without try_now: an event loop's store). */
    char e[256] = "";
    rc = try_now || !r->lazy ? rate__rsync_discover(r, 0, true, e, sizeof e)
                             : RATE_ESTORE;
    if (rc != RATE_OK && (!r->lazy || rc == RATE_EINVAL)) {
        rate__fail(err, errlen, rc, "%s", e);
        r_destroy(r);
        return rc;
    }
    if (rc == RATE_OK && r->paths.module_mode == RATE_REDIS_MODULE_ON) {
        bool has = false; /* forced: the server must have it */
        if ((rc = module_probe(r, &has)) == RATE_OK && !has)
            rc = RATE_ESTORE;
        if (rc != RATE_OK) {
            rate__fail(err, errlen, rc, "the module was asked for (module "
                       "on) but the server has no RATELIMIT.STEP: load "
                       "ratelimit.so");
            r_destroy(r);
            return rc;
        }
        atomic_store(&r->paths.module_state, RATE__MODULE_ON);
    }
    if ((rc = rate_store_new(&redis_methods, r, out)) != RATE_OK)
        r_destroy(r);
    return rc;
}

int rate_store_redis_new(const char *url, const rate_redis_options_t *opt,
                         rate_store_t **out, char *err, size_t errlen)
{
    return redis_new(url, opt, true, out, err, errlen);
}


/* Calls batch() with each batch of the store's own keys (SCAN ... MATCH
 * PREFIX* COUNT 1000, a batch per reply, the prefix's glob characters escaped; of what it
 * finds, the names the store writes, see own_name) on every master, until
 * the scans end.  A call that fails ends that master's scan, and the
 * others still go on (in a cluster with a master down, the keys of the
 * healthy ones are still reached); the first failure is returned at the
 * end.  Out of memory stops at once.  A batch is a single server's or one
 * master's. */
static int scan_prefix(redis_store_t *r,
                       int (*batch)(redis_store_t *r, const char **keys,
                                    const size_t *lens, size_t n, void *arg),
                       void *arg)
{
    int rc;
    if (!atomic_load(&r->ready) &&
        (rc = rate__rsync_discover(r, deadline_of(r), false, NULL, 0)) != RATE_OK)
        return rc;
    char *pattern = malloc(r->proto.prefix_len * 2 + 2);
    const char **kv = NULL;
    size_t *kl = NULL, kcap = 0;
    rate__snode_t **nodes = malloc(RATE__REDIS_MAX_NODES * sizeof *nodes);
    if (pattern == NULL || nodes == NULL) {
        free(pattern), free(kv), free(kl), free(nodes);
        return RATE_ENOMEM;
    }
    size_t pl = 0;
    for (size_t i = 0; i < r->proto.prefix_len; i++) { /* glob chars */
        char ch = r->proto.prefix[i];
        if (ch == '*' || ch == '?' || ch == '[' || ch == ']' || ch == '\\')
            pattern[pl++] = '\\';
        pattern[pl++] = ch;
    }
    pattern[pl++] = '*';
    size_t nn = rate__rsync_masters(r, nodes, RATE__REDIS_MAX_NODES);
    int first = RATE_OK;
    rc = RATE_OK;
    for (size_t m = 0; m < nn && rc != RATE_ENOMEM; m++) {
        char cursor[32] = "0";
        rc = RATE_OK;
        do {
            redisReply *rep = NULL;
            rc = rate__rsync_call_node(r, deadline_of(r), nodes[m], 6,
                           (const char *[]){"SCAN", cursor, "MATCH", pattern,
                                            "COUNT", "1000"},
                           (size_t[]){4, strlen(cursor), 5, pl, 5, 4}, &rep);
            rc = reply_ok(r, rc, rep);
            if (rc == RATE_OK && (rep->type != REDIS_REPLY_ARRAY ||
                                  rep->elements != 2 ||
                                  rep->element[0]->type != REDIS_REPLY_STRING ||
                                  rep->element[0]->len >= sizeof cursor ||
                                  rep->element[1]->type != REDIS_REPLY_ARRAY))
                rc = RATE_ECORRUPT;
            if (rc == RATE_OK) {
                const redisReply *keys = rep->element[1];
                size_t n = 0;
                snprintf(cursor, sizeof cursor, "%s", rep->element[0]->str);
                if (keys->elements > kcap) { /* SCAN may return more */
                    const char **nv = realloc(kv, keys->elements * sizeof *kv);
                    if (nv != NULL)
                        kv = nv;
                    size_t *nl = realloc(kl, keys->elements * sizeof *kl);
                    if (nl != NULL)
                        kl = nl;
                    if (nv == NULL || nl == NULL)
                        rc = RATE_ENOMEM;
                    else
                        kcap = keys->elements;
                }
                for (size_t i = 0; i < keys->elements && rc == RATE_OK; i++) {
                    const redisReply *e = keys->element[i];
                    if (e->type != REDIS_REPLY_STRING)
                        rc = RATE_ECORRUPT;
                    else if (rate__redis_own_name(&r->proto, e->str, e->len)) {
                        kv[n] = e->str;
                        kl[n++] = e->len;
                    }
                }
                if (rc == RATE_OK && n > 0)
                    rc = batch(r, kv, kl, n, arg);
            }
            freeReplyObject(rep);
        } while (rc == RATE_OK && strcmp(cursor, "0") != 0);
        if (first == RATE_OK || rc == RATE_ENOMEM)
            first = rc;
    }
    free(pattern), free(kv), free(kl), free(nodes);
    return first;
}

/* One command over a batch of keys: the head's words, the keys, then the
 * tail's word (if not NULL); its reply must be an integer.  In a cluster,
 * one command per key instead (keys of one batch may lie in many slots),
 * each routed to its slot's master. */
static int keys_command(redis_store_t *r, size_t head, const char **hv,
                        const size_t *hl, const char **keys,
                        const size_t *lens, size_t nkeys, const char *tail,
                        const char *one_tail)
{
    size_t per = r->cluster ? 1 : nkeys;
    size_t n = head + per + (tail != NULL);
    const char **av = malloc(n * sizeof *av);
    size_t *al = malloc(n * sizeof *al);
    int rc = RATE_OK;

    if (av == NULL || al == NULL || n > INT_MAX) {
        free(av);
        free(al);
        return RATE_ENOMEM;
    }
    for (size_t i = 0; i < head; i++) {
        av[i] = hv[i];
        al[i] = hl[i];
    }
    if (r->cluster && one_tail != NULL && head == 3) {
        av[2] = one_tail; /* the script's number of keys: one */
        al[2] = strlen(one_tail);
    }
    for (size_t at = 0; at < nkeys && rc == RATE_OK; at += per) {
        for (size_t i = 0; i < per; i++) {
            av[head + i] = keys[at + i];
            al[head + i] = lens[at + i];
        }
        if (tail != NULL) {
            av[n - 1] = tail;
            al[n - 1] = strlen(tail);
        }
        redisReply *rep = NULL;
        rc = rate__rsync_call(r, deadline_of(r), keys[at], lens[at], (int)n, av, al,
                   &rep);
        rc = reply_ok(r, rc, rep);
        if (rc == RATE_OK && rep->type != REDIS_REPLY_INTEGER)
            rc = RATE_ECORRUPT;
        freeReplyObject(rep);
    }
    free(av);
    free(al);
    return rc;
}

static int unlink_batch(redis_store_t *r, const char **keys,
                        const size_t *lens, size_t n, void *arg)
{
    (void)arg;
    return keys_command(r, 1, (const char *[]){"UNLINK"}, (size_t[]){6},
                        keys, lens, n, NULL, NULL);
}

/* The synchronous store behind a Redis store: itself, or the one an
 * asynchronous Redis store owns; NULL for another store. */
static redis_store_t *sync_of(rate_store_t *store)
{
    redis_store_t *r = rate_store_backend(store, &redis_methods);
    return r != NULL ? r : rate__rasync_sync(store);
}

int rate_store_redis_drop(rate_store_t *store)
{
    redis_store_t *r;

    if ((r = sync_of(store)) == NULL)
        return RATE_EINVAL;
    /* The states, shadow states and policy records alike. */
    return scan_prefix(r, unlink_batch, NULL);
}

typedef struct touch_arg {
    char ms[24];
} touch_arg_t;

static int touch_batch(redis_store_t *r, const char **keys,
                       const size_t *lens, size_t n, void *varg)
{
    touch_arg_t *a = varg;
    char num[24];

    /* EVAL SCRIPT NUMKEYS KEY... US */
    snprintf(num, sizeof num, "%zu", n);
    return keys_command(r, 3,
                        (const char *[]){"EVAL", rate__redis_touch_script, num},
                        (size_t[]){4, rate__redis_touch_script_len,
                                   strlen(num)},
                        keys, lens, n, a->ms, "1");
}

int rate_store_redis_touch(rate_store_t *store, uint64_t ttl_ns)
{
    redis_store_t *r;
    touch_arg_t a;

    if ((r = sync_of(store)) == NULL || ttl_ns == 0)
        return RATE_EINVAL;
    snprintf(a.ms, sizeof a.ms, "%llu", (unsigned long long)rate__redis_ttl_us(ttl_ns));
    return scan_prefix(r, touch_batch, &a);
}

int rate_store_redis_last_error(rate_store_t *store, char *buf, size_t cap)
{
    redis_store_t *r;

    if ((r = rate_store_backend(store, &redis_methods)) == NULL)
        return rate__rasync_last_error(store, buf, cap);
    if (buf == NULL || cap == 0)
        return RATE_EINVAL;
    rate__rsync_last_error(r, buf, cap);
    return RATE_OK;
}

int rate_store_redis_status(rate_store_t *store, rate_redis_status_t *out)
{
    redis_store_t *r;

    if ((r = rate_store_backend(store, &redis_methods)) == NULL ||
        out == NULL)
        return RATE_EINVAL;
    memset(out, 0, sizeof *out);
    out->ready = atomic_load(&r->ready);
    if (out->ready) {
        rate__snode_t *nodes[RATE__REDIS_MAX_NODES];
        out->cluster = r->cluster;
        out->masters = (unsigned)rate__rsync_masters(r, nodes, RATE__REDIS_MAX_NODES);
        for (unsigned i = 0; i < out->masters; i++)
            out->breakers_open += rate__rsync_node_open(r, nodes[i]);
    }
    out->breaker_opened = atomic_load(&r->st_opened);
    out->breaker_rejected = atomic_load(&r->st_rejected);
    out->redirections = atomic_load(&r->st_redirects);
    out->map_refreshes = atomic_load(&r->st_refreshes);
    out->connect_failures = atomic_load(&r->st_connect_failures);
    out->module = atomic_load(&r->paths.module_state) == RATE__MODULE_ON;
    out->module_decisions = atomic_load(&r->st_module);
    out->module_fallbacks = atomic_load(&r->st_module_fallbacks);
    out->lean_decisions = atomic_load(&r->st_lean);
    out->lean_evalsha = atomic_load(&r->st_lean_evalsha);
    out->general_decisions = atomic_load(&r->st_general);
    out->declined = atomic_load(&r->st_declined);
    out->lean_adjustments = atomic_load(&r->st_lean_adj);
    out->declined_adjustments = atomic_load(&r->st_adj_declined);
    out->module_leases = atomic_load(&r->st_module_leases);
    out->script_leases = atomic_load(&r->st_script_leases);
    out->module_fair = atomic_load(&r->st_module_fair);
    out->script_fair = atomic_load(&r->st_script_fair);
    return RATE_OK;
}

int rate_store_redis_async_new(const char *url,
                               const rate_redis_options_t *options,
                               const rate_loop_t *loop, rate_store_t **out,
                               char *err, size_t errlen)
{
    rate_store_t *sync;
    rate__redis_conf_t conf;
    int rc;

    if (out == NULL)
        return rate__fail(err, errlen, RATE_EINVAL, "out is NULL");
    *out = NULL;
    if ((rc = rate__rasync_loop_ok(loop, err, errlen)) != RATE_OK)
        return rc;
    /* Its creation must not wait for a Redis that accepts and never
     * answers: a lazy store does not try to connect at all. */
    if ((rc = redis_new(url, options, false, &sync, err, errlen)) != RATE_OK)
        return rc;
    redis_store_t *r = rate_store_backend(sync, &redis_methods);
    async_conf(r, &conf);
    rc_addr_t *addr = malloc(RATE__REDIS_MAX_NODES * sizeof *addr);
    uint8_t *map = malloc(RC_SLOTS);
    unsigned n = 0;
    if (addr == NULL || map == NULL) {
        free(addr);
        free(map);
        rate_store_free(sync);
        return RATE_ENOMEM;
    }
    bool cluster = rate__rsync_topology(r, addr, RATE__REDIS_MAX_NODES, &n,
                                        map);
    rc = rate__rasync_new(loop, sync, &redis_methods, r, &r->paths, &r->proto, &conf,
                          addr, n, cluster ? map : NULL, out);
    free(addr);
    free(map);
    return rc;
}
