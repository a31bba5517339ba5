/* SPDX-License-Identifier: MIT */
/*
 * The fake Redis module host of module_host.h.  The keyspace is a list of
 * entries (name, value, expiry); a value is a hash of byte fields or a
 * value of another type (a client's SET).  A key handle records its name,
 * its mode and which value it saw when opened (none: the key was absent),
 * as Redis's RedisModuleKey holds a pointer to that value; every use of a
 * handle checks that value against the keyspace, where Redis would follow
 * the pointer.  Strings handed to the module are tracked until freed, and
 * every reply call is placed in a tree that must be one whole reply when
 * the command returns.  The replica is a second keyspace that receives
 * only RedisModule_Replicate's commands (HSET, PEXPIREAT, PERSIST).
 *
 * Its divisions: faults; the keyspace; the command (its arguments, the
 * handles and strings it holds, its reply); the API by kind (keys,
 * strings, replies, replication, registration); GetApi; the host's own
 * calls (mh_*).
 */
#include "module_host.h"

#include <ctype.h>
#include <stddef.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

/* --------------------------------------------------------------- faults */

__attribute__((noreturn)) static void fault(const char *what)
{
    fprintf(stderr, "module host: %s\n", what);
    abort();
}

static void *xalloc(size_t n)
{
    void *p = calloc(1, n ? n : 1);
    if (p == NULL)
        fault("out of memory");
    return p;
}

static char *xdup(const char *s, size_t n)
{
    char *p = xalloc(n + 1);
    memcpy(p, s, n);
    return p;
}

/* Grows *v (of *cap elements of size sz) to hold n. */
static void grow(void **v, size_t *cap, size_t n, size_t sz)
{
    if (n <= *cap)
        return;
    size_t c = *cap ? *cap * 2 : 8;
    while (c < n)
        c *= 2;
    void *p = realloc(*v, c * sz);
    if (p == NULL)
        fault("out of memory");
    *v = p;
    *cap = c;
}

/* ------------------------------------------------------------ keyspace */

enum { T_HASH = 1, T_OTHER };

typedef struct field {
    char *name, *val;
    size_t nlen, vlen;
} field_t;

typedef struct value {
    int type;
    unsigned long long id; /* never 0, never reused */
    field_t *f;
    size_t nf, cap;
} value_t;

typedef struct entry {
    char *name;
    size_t len;
    value_t *v;
    long long expire_ms; /* -1: none */
} entry_t;

typedef struct db {
    entry_t *e;
    size_t n, cap;
} db_t;

static db_t master, replica;
static unsigned long long next_id = 1;

static entry_t *db_find(db_t *db, const char *name, size_t len)
{
    for (size_t i = 0; i < db->n; i++)
        if (db->e[i].len == len && memcmp(db->e[i].name, name, len) == 0)
            return &db->e[i];
    return NULL;
}

static value_t *value_new(int type)
{
    value_t *v = xalloc(sizeof *v);
    v->type = type;
    v->id = next_id++;
    return v;
}

static void value_free(value_t *v)
{
    for (size_t i = 0; i < v->nf; i++) {
        free(v->f[i].name);
        free(v->f[i].val);
    }
    free(v->f);
    free(v);
}

static entry_t *db_add(db_t *db, const char *name, size_t len, value_t *v)
{
    grow((void **)&db->e, &db->cap, db->n + 1, sizeof *db->e);
    entry_t *e = &db->e[db->n++];
    e->name = xdup(name, len);
    e->len = len;
    e->v = v;
    e->expire_ms = -1;
    return e;
}

static void db_del(db_t *db, const char *name, size_t len)
{
    entry_t *e = db_find(db, name, len);
    if (e == NULL)
        return;
    free(e->name);
    value_free(e->v);
    *e = db->e[--db->n];
}

static void db_empty(db_t *db)
{
    while (db->n > 0)
        db_del(db, db->e[0].name, db->e[0].len);
    free(db->e);
    memset(db, 0, sizeof *db);
}

static field_t *hash_find(value_t *v, const char *name, size_t nlen)
{
    for (size_t i = 0; i < v->nf; i++)
        if (v->f[i].nlen == nlen && memcmp(v->f[i].name, name, nlen) == 0)
            return &v->f[i];
    return NULL;
}

static void hash_set(value_t *v, const char *name, size_t nlen,
                     const char *val, size_t vlen)
{
    field_t *f = hash_find(v, name, nlen);
    if (f == NULL) {
        grow((void **)&v->f, &v->cap, v->nf + 1, sizeof *v->f);
        f = &v->f[v->nf++];
        f->name = xdup(name, nlen);
        f->nlen = nlen;
    } else {
        free(f->val);
    }
    f->val = xdup(val, vlen);
    f->vlen = vlen;
}

/* Whether two values hold the same type and fields (in any order). */
static bool value_same(value_t *a, value_t *b)
{
    if (a->type != b->type || a->nf != b->nf)
        return false;
    for (size_t i = 0; i < a->nf; i++) {
        field_t *f = hash_find(b, a->f[i].name, a->f[i].nlen);
        if (f == NULL || f->vlen != a->f[i].vlen ||
            memcmp(f->val, a->f[i].val, f->vlen) != 0)
            return false;
    }
    return true;
}

/* After each command: the replica holds what the master holds. */
static void replica_check(void)
{
    if (master.n != replica.n)
        fault("the replica has another number of keys than the master");
    for (size_t i = 0; i < master.n; i++) {
        entry_t *m = &master.e[i];
        entry_t *r = db_find(&replica, m->name, m->len);
        if (r == NULL)
            fault("a key of the master is not on the replica");
        if (!value_same(m->v, r->v))
            fault("a key's value differs on the replica");
        if (m->expire_ms != r->expire_ms)
            fault("a key's expiry differs on the replica");
    }
}

/* --------------------------------------------------------- the command */

struct RedisModuleString {
    char *ptr; /* len bytes, NUL after (as an sds) */
    size_t len;
};

struct RedisModuleKey {
    char *name;
    size_t len;
    int mode;
    unsigned long long seen; /* the value's id when opened; 0: absent */
};

/* The context: GetApi first, as the module reads it. */
struct RedisModuleCtx {
    int (*get_api)(const char *name, void *out);
};

typedef struct command {
    char name[32];
    RedisModuleCmdFunc fn;
    int first, last, step;
} command_t;

static command_t commands[16];
static size_t ncommands;
static bool loading;

/* The command running: its arguments, the strings and keys it holds, its
 * reply. */
static struct {
    const command_t *cmd;
    RedisModuleString **argv;
    int argc;
    RedisModuleString **strings;
    size_t nstrings, capstrings;
    RedisModuleKey **keys;
    size_t nkeys, capkeys;
    mh_reply_t *top;
    mh_reply_t *open[8]; /* arrays being filled, innermost last */
    size_t nopen;
} run;

static RedisModuleCtx the_ctx;

static RedisModuleString *string_new(const char *p, size_t len)
{
    RedisModuleString *s = xalloc(sizeof *s);
    s->ptr = xdup(p, len);
    s->len = len;
    return s;
}

static void string_free(RedisModuleString *s)
{
    free(s->ptr);
    free(s);
}

/* A string the module owns now (it must free it before it returns). */
static RedisModuleString *module_string(const char *p, size_t len)
{
    RedisModuleString *s = string_new(p, len);
    grow((void **)&run.strings, &run.capstrings, run.nstrings + 1,
         sizeof *run.strings);
    run.strings[run.nstrings++] = s;
    return s;
}

static void check_ctx(RedisModuleCtx *ctx)
{
    if (ctx != &the_ctx)
        fault("a call with a context that is not the server's");
}

/* The open handle k (aborts on a handle closed or never opened, whose
 * memory Redis has freed). */
static RedisModuleKey *open_key(RedisModuleKey *k)
{
    for (size_t i = 0; i < run.nkeys; i++)
        if (run.keys[i] == k)
            return k;
    fault("a key handle used after RedisModule_CloseKey (freed)");
}

/* The value handle k points at, as Redis's key->value: NULL when the key
 * was absent at its opening.  Aborts when that value is gone since (Redis
 * would read freed memory). */
static value_t *key_value(RedisModuleKey *k)
{
    open_key(k);
    if (k->seen == 0)
        return NULL;
    entry_t *e = db_find(&master, k->name, k->len);
    if (e == NULL || e->v->id != k->seen)
        fault("a key handle used after its value was deleted or replaced "
              "(freed in Redis)");
    return e->v;
}

/* Whether name is one of the keys the running command declares. */
static bool declared(const RedisModuleString *name)
{
    const command_t *c = run.cmd;
    if (c->first <= 0)
        return false;
    int last = c->last < 0 ? run.argc + c->last : c->last;
    for (int i = c->first; i <= last && i < run.argc; i += c->step) {
        const RedisModuleString *a = run.argv[i];
        if (a->len == name->len && memcmp(a->ptr, name->ptr, a->len) == 0)
            return true;
    }
    return false;
}

/* ----------------------------------------------------- the API: keys */

static RedisModuleKey *h_OpenKey(RedisModuleCtx *ctx, RedisModuleString *name,
                                 int mode)
{
    check_ctx(ctx);
    if (!declared(name))
        fault("RedisModule_OpenKey of a key the command does not declare");
    entry_t *e = db_find(&master, name->ptr, name->len);
    if (e == NULL && !(mode & RM_WRITE))
        return NULL;
    RedisModuleKey *k = xalloc(sizeof *k);
    k->name = xdup(name->ptr, name->len);
    k->len = name->len;
    k->mode = mode;
    k->seen = e != NULL ? e->v->id : 0;
    grow((void **)&run.keys, &run.capkeys, run.nkeys + 1, sizeof *run.keys);
    run.keys[run.nkeys++] = k;
    return k;
}

static void h_CloseKey(RedisModuleKey *k)
{
    if (k == NULL)
        return;
    for (size_t i = 0; i < run.nkeys; i++) {
        if (run.keys[i] == k) {
            run.keys[i] = run.keys[--run.nkeys];
            free(k->name);
            free(k);
            return;
        }
    }
    fault("RedisModule_CloseKey of a key handle closed already (a double "
          "free)");
}

static int h_KeyType(RedisModuleKey *k)
{
    if (k == NULL)
        return RM_KEYTYPE_EMPTY;
    value_t *v = key_value(k);
    return v == NULL ? RM_KEYTYPE_EMPTY
           : v->type == T_HASH ? RM_KEYTYPE_HASH
                               : 1; /* REDISMODULE_KEYTYPE_STRING */
}

static int h_HashGet(RedisModuleKey *k, int flags, ...)
{
    if (flags != RM_HASH_CFIELDS)
        fault("RedisModule_HashGet: flags the fake does not model");
    value_t *v = key_value(k);
    if (v != NULL && v->type != T_HASH)
        return RM_ERR;
    va_list ap;
    va_start(ap, flags);
    for (const char *f; (f = va_arg(ap, const char *)) != NULL;) {
        RedisModuleString **out = va_arg(ap, RedisModuleString **);
        field_t *fv = v != NULL ? hash_find(v, f, strlen(f)) : NULL;
        *out = fv != NULL ? module_string(fv->val, fv->vlen) : NULL;
    }
    va_end(ap);
    return RM_OK;
}

/* Redis's moduleCreateEmptyKey: the handle's key made now, an assertion
 * in dbAdd when another handle has made it meanwhile. */
static value_t *create_empty(RedisModuleKey *k)
{
    if (db_find(&master, k->name, k->len) != NULL)
        fault("db.c dbAdd: 'de != NULL' is not true: a write through a "
              "handle opened while its key was absent, after another "
              "handle made the key");
    value_t *v = value_new(T_HASH);
    db_add(&master, k->name, k->len, v);
    k->seen = v->id;
    return v;
}

static int h_HashSet(RedisModuleKey *k, int flags, ...)
{
    if (k == NULL)
        return 0;
    if (flags != RM_HASH_CFIELDS)
        fault("RedisModule_HashSet: flags the fake does not model");
    value_t *v = key_value(k);
    if (v != NULL && v->type != T_HASH)
        return 0;
    if (!(k->mode & RM_WRITE))
        return 0;
    if (v == NULL)
        v = create_empty(k);
    int updated = 0;
    va_list ap;
    va_start(ap, flags);
    for (const char *f; (f = va_arg(ap, const char *)) != NULL;) {
        RedisModuleString *val = va_arg(ap, RedisModuleString *);
        if (val == NULL)
            fault("RedisModule_HashSet: a NULL value");
        updated += hash_find(v, f, strlen(f)) != NULL;
        hash_set(v, f, strlen(f), val->ptr, val->len);
    }
    va_end(ap);
    return updated;
}

static long long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int set_expire(RedisModuleKey *k, long long at, bool none)
{
    value_t *v = key_value(k);
    if (!(k->mode & RM_WRITE) || v == NULL)
        return RM_ERR;
    entry_t *e = db_find(&master, k->name, k->len);
    e->expire_ms = none ? -1 : at;
    return RM_OK;
}

static int h_SetExpire(RedisModuleKey *k, mstime_t ms)
{
    if (ms < 0 && ms != RM_NO_EXPIRE)
        return RM_ERR;
    return set_expire(k, now_ms() + (ms < 0 ? 0 : ms), ms == RM_NO_EXPIRE);
}

static int h_SetAbsExpire(RedisModuleKey *k, mstime_t ms)
{
    if (ms < 0 && ms != RM_NO_EXPIRE)
        return RM_ERR;
    return set_expire(k, ms, ms == RM_NO_EXPIRE);
}

/* -------------------------------------------------- the API: strings */

static RedisModuleString *h_CreateString(RedisModuleCtx *ctx, const char *p,
                                         size_t len)
{
    check_ctx(ctx);
    return module_string(p, len);
}

static void h_FreeString(RedisModuleCtx *ctx, RedisModuleString *s)
{
    check_ctx(ctx);
    for (size_t i = 0; i < run.nstrings; i++) {
        if (run.strings[i] == s) {
            run.strings[i] = run.strings[--run.nstrings];
            string_free(s);
            return;
        }
    }
    for (int i = 0; i < run.argc; i++)
        if (run.argv[i] == s)
            fault("RedisModule_FreeString of a command argument (the "
                  "server's, freed under it)");
    fault("RedisModule_FreeString of a string freed already");
}

static const char *h_StringPtrLen(const RedisModuleString *s, size_t *len)
{
    if (s == NULL) { /* as Redis answers it */
        static const char msg[] = "(NULL string reply referenced in module)";
        if (len != NULL)
            *len = sizeof msg - 1;
        return msg;
    }
    if (len != NULL)
        *len = s->len;
    return s->ptr;
}

/* -------------------------------------------------- the API: replies */

static mh_reply_t *reply_new(mh_kind_t kind)
{
    mh_reply_t *r = xalloc(sizeof *r);
    r->kind = kind;
    return r;
}

static void reply_free(mh_reply_t *r)
{
    if (r == NULL)
        return;
    for (size_t i = 0; i < r->count; i++)
        reply_free(r->el[i]);
    free(r->el);
    free(r->s);
    free(r);
}

/* Places a reply: the command's one reply, or the next element of the
 * innermost array being filled. */
static int reply_add(RedisModuleCtx *ctx, mh_reply_t *r)
{
    check_ctx(ctx);
    if (run.nopen == 0) {
        if (run.top != NULL)
            fault("a second reply to one command");
        run.top = r;
    } else {
        mh_reply_t *a = run.open[run.nopen - 1];
        size_t filled = 0;
        while (filled < a->count && a->el[filled] != NULL)
            filled++;
        a->el[filled++] = r;
        if (filled == a->count) /* whole: the array it is in goes on */
            run.nopen--;
    }
    if (r->kind == MH_ARRAY && r->count > 0) {
        if (run.nopen == sizeof run.open / sizeof run.open[0])
            fault("replies nested deeper than the fake models");
        run.open[run.nopen++] = r;
    }
    return RM_OK;
}

static int h_ReplyWithArray(RedisModuleCtx *ctx, long n)
{
    if (n < 0)
        fault("RedisModule_ReplyWithArray: a postponed length (not modelled)");
    mh_reply_t *r = reply_new(MH_ARRAY);
    r->count = (size_t)n;
    r->el = xalloc((size_t)n * sizeof *r->el);
    return reply_add(ctx, r);
}

static int h_ReplyWithLongLong(RedisModuleCtx *ctx, long long n)
{
    mh_reply_t *r = reply_new(MH_INT);
    r->n = n;
    return reply_add(ctx, r);
}

static int h_ReplyWithStringBuffer(RedisModuleCtx *ctx, const char *p,
                                   size_t len)
{
    mh_reply_t *r = reply_new(MH_STR);
    r->s = xdup(p, len);
    r->len = len;
    return reply_add(ctx, r);
}

static int h_ReplyWithError(RedisModuleCtx *ctx, const char *err)
{
    mh_reply_t *r = reply_new(MH_ERR);
    r->len = strlen(err);
    r->s = xdup(err, r->len);
    return reply_add(ctx, r);
}

static int h_WrongArity(RedisModuleCtx *ctx)
{
    char msg[96];
    snprintf(msg, sizeof msg, "ERR wrong number of arguments for '%s' "
                              "command", run.cmd->name);
    return h_ReplyWithError(ctx, msg);
}

/* ---------------------------------------------- the API: replication */

/* One replicated command, applied to the replica. */
static void replica_apply(const char *cmd, char **w, size_t *wl, int n)
{
    if (strcasecmp(cmd, "HSET") == 0) {
        if (n < 3 || n % 2 == 0)
            fault("replicated HSET: wrong number of arguments");
        entry_t *e = db_find(&replica, w[0], wl[0]);
        if (e == NULL)
            e = db_add(&replica, w[0], wl[0], value_new(T_HASH));
        if (e->v->type != T_HASH)
            fault("replicated HSET on a key that is not a hash");
        for (int i = 1; i < n; i += 2)
            hash_set(e->v, w[i], wl[i], w[i + 1], wl[i + 1]);
    } else if (strcasecmp(cmd, "PEXPIREAT") == 0 ||
               strcasecmp(cmd, "PERSIST") == 0) {
        bool at = strcasecmp(cmd, "PEXPIREAT") == 0;
        if (n != (at ? 2 : 1))
            fault("replicated PEXPIREAT/PERSIST: wrong number of arguments");
        entry_t *e = db_find(&replica, w[0], wl[0]);
        if (e == NULL)
            return; /* as Redis: no key, nothing to do */
        e->expire_ms = at ? strtoll(w[1], NULL, 10) : -1;
    } else {
        fault("RedisModule_Replicate of a command the fake does not model");
    }
}

static int h_Replicate(RedisModuleCtx *ctx, const char *cmd, const char *fmt,
                       ...)
{
    check_ctx(ctx);
    char *w[16];
    size_t wl[16];
    int n = 0;
    va_list ap;
    va_start(ap, fmt);
    for (const char *f = fmt; *f; f++) {
        if (n == 16)
            fault("RedisModule_Replicate: more arguments than modelled");
        char num[24];
        switch (*f) {
        case 's': {
            RedisModuleString *s = va_arg(ap, RedisModuleString *);
            w[n] = xdup(s->ptr, s->len), wl[n] = s->len;
            break;
        }
        case 'c': {
            const char *c = va_arg(ap, const char *);
            w[n] = xdup(c, strlen(c)), wl[n] = strlen(c);
            break;
        }
        case 'l': {
            int len = snprintf(num, sizeof num, "%lld", va_arg(ap, long long));
            w[n] = xdup(num, (size_t)len), wl[n] = (size_t)len;
            break;
        }
        case 'b': {
            const char *b = va_arg(ap, const char *);
            size_t len = va_arg(ap, size_t);
            w[n] = xdup(b, len), wl[n] = len;
            break;
        }
        default:
            fault("RedisModule_Replicate: a format the fake does not model");
        }
        n++;
    }
    va_end(ap);
    replica_apply(cmd, w, wl, n);
    for (int i = 0; i < n; i++)
        free(w[i]);
    return RM_OK;
}

/* ---------------------------------------------- the API: registration */

static void h_SetModuleAttribs(RedisModuleCtx *ctx, const char *name, int ver,
                               int apiver)
{
    check_ctx(ctx);
    (void)name;
    (void)ver;
    if (apiver != RM_APIVER_1)
        fault("RedisModule_SetModuleAttribs: an API version not modelled");
}

static int h_IsModuleNameBusy(const char *name)
{
    (void)name;
    return 0;
}

/* Whether flags are all words Redis 7.0 knows for a command. */
static bool known_flags(const char *flags)
{
    static const char *const words[] = {
        "write", "readonly", "admin", "deny-oom", "deny-script",
        "allow-loading", "pubsub", "random", "allow-stale", "no-monitor",
        "no-slowlog", "fast", "getkeys-api", "no-cluster", "no-auth",
        "may-replicate", "no-mandatory-keys", "blocking", "allow-busy",
        "getchannels-api"};
    char buf[256];
    snprintf(buf, sizeof buf, "%s", flags);
    for (char *save = NULL, *w = strtok_r(buf, " ", &save); w != NULL;
         w = strtok_r(NULL, " ", &save)) {
        bool ok = false;
        for (size_t i = 0; i < sizeof words / sizeof words[0]; i++)
            ok |= strcasecmp(w, words[i]) == 0;
        if (!ok)
            return false;
    }
    return true;
}

static int h_CreateCommand(RedisModuleCtx *ctx, const char *name,
                           RedisModuleCmdFunc fn, const char *flags, int first,
                           int last, int step)
{
    check_ctx(ctx);
    if (!loading)
        fault("RedisModule_CreateCommand outside RedisModule_OnLoad");
    if (!known_flags(flags) || strlen(name) >= sizeof commands[0].name ||
        ncommands == sizeof commands / sizeof commands[0])
        return RM_ERR;
    if (first < 0 || (first > 0 && (step < 1 || (last > 0 && last < first))))
        return RM_ERR;
    command_t *c = &commands[ncommands++];
    for (size_t i = 0; name[i]; i++)
        c->name[i] = (char)tolower((unsigned char)name[i]);
    c->fn = fn;
    c->first = first, c->last = last, c->step = step;
    return RM_OK;
}

/* ------------------------------------------------------------- GetApi */

/* The calls by name: each h_ function is checked against its type in
 * rm_api.h as it fills the table. */
#define H_FILL_(fn, ret, args) .fn = h_##fn,
static const rm_api_t host_api = {RM_API_MAP(H_FILL_)};
#undef H_FILL_

static int get_api(const char *name, void *out)
{
#define H_NAME_(fn, ret, args)                                               \
    {"RedisModule_" #fn, offsetof(rm_api_t, fn), sizeof host_api.fn},
    static const struct {
        const char *name;
        size_t off, size;
    } api[] = {RM_API_MAP(H_NAME_)};
#undef H_NAME_
    for (size_t i = 0; i < sizeof api / sizeof api[0]; i++) {
        if (strcmp(api[i].name, name) == 0) {
            memcpy(out, (const char *)&host_api + api[i].off, api[i].size);
            return RM_OK;
        }
    }
    return RM_ERR;
}

/* ------------------------------------------------------------ the host */

void mh_load(mh_onload_fn onload)
{
    the_ctx.get_api = get_api;
    loading = true;
    ncommands = 0;
    int rc = onload(&the_ctx, NULL, 0);
    loading = false;
    if (rc != RM_OK)
        fault("the module refused to load");
}

/* What the command left: one whole reply; no key, no string open. */
static void after_command(void)
{
    if (run.top == NULL)
        fault("a command returned without a reply");
    if (run.nopen > 0)
        fault("a command returned with an array reply not filled");
    if (run.nkeys > 0)
        fault("a command returned with a key handle open");
    if (run.nstrings > 0)
        fault("a command returned with a string not freed");
    replica_check();
}

const mh_reply_t *mh_command(int argc, const char *const *argv,
                             const size_t *lens)
{
    reply_free(run.top);
    run.top = NULL;
    run.nopen = 0;
    run.cmd = NULL;
    for (size_t i = 0; i < ncommands && argc > 0; i++)
        if (strlen(commands[i].name) == lens[0] &&
            strncasecmp(commands[i].name, argv[0], lens[0]) == 0)
            run.cmd = &commands[i];
    if (run.cmd == NULL)
        return NULL;
    run.argc = argc;
    run.argv = xalloc((size_t)argc * sizeof *run.argv);
    for (int i = 0; i < argc; i++)
        run.argv[i] = string_new(argv[i], lens[i]);
    run.cmd->fn(&the_ctx, run.argv, argc);
    after_command();
    for (int i = 0; i < argc; i++)
        string_free(run.argv[i]);
    free(run.argv);
    run.argv = NULL;
    run.argc = 0;
    return run.top;
}

void mh_hset(const char *key, size_t klen, const char *field,
             const char *value, size_t vlen)
{
    db_t *dbs[2] = {&master, &replica};
    for (int i = 0; i < 2; i++) {
        entry_t *e = db_find(dbs[i], key, klen);
        if (e != NULL && e->v->type != T_HASH) {
            db_del(dbs[i], key, klen); /* as DEL, then HSET */
            e = NULL;
        }
        if (e == NULL)
            e = db_add(dbs[i], key, klen, value_new(T_HASH));
        hash_set(e->v, field, strlen(field), value, vlen);
    }
}

void mh_set(const char *key, size_t klen)
{
    db_t *dbs[2] = {&master, &replica};
    for (int i = 0; i < 2; i++) {
        db_del(dbs[i], key, klen);
        db_add(dbs[i], key, klen, value_new(T_OTHER));
    }
}

void mh_del(const char *key, size_t klen)
{
    db_del(&master, key, klen);
    db_del(&replica, key, klen);
}

void mh_flush(void)
{
    db_empty(&master);
    db_empty(&replica);
}
