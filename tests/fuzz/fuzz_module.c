/* SPDX-License-Identifier: MIT */
/*
 * libFuzzer target: ratelimit.so's commands (redis-module/) run over a
 * fake Redis host (tests/lib/module_host.c), which aborts where
 * redis-server would assert or touch freed memory, and where the module
 * leaves a key or a string open, a reply unfinished or a replica unlike
 * the master.
 *
 * An input is a sequence of operations, each a byte (its kind: mod 8)
 * then the bytes its words are drawn with: RATELIMIT.STEP, .FAIR, .LEASE,
 * .LEASESTEP, CL.THROTTLE, or a client's HSET, SET or DEL.  Keys come
 * from three names, so that a command's two keys and the keys of
 * successive commands collide.  A command's shape byte gives its number
 * of limits (1 to 4) and, now and then, one word too few or four too
 * many.  Each word is drawn by one byte from its argument's small
 * dictionary (the byte 0, as at the input's end, giving a valid value),
 * or, for a byte from 0xF0, is the input's next bytes (their count
 * first).  Each reply must be an error with a code, or the reply the
 * command documents (docs/redis-module.md), and a command given one key
 * twice must be refused.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../lib/module_host.h"

int RedisModule_OnLoad(RedisModuleCtx *ctx, RedisModuleString **argv,
                       int argc);

/* ------------------------------------------------------------ words */

typedef struct word {
    const char *s;
    size_t n;
    uint64_t le;     /* with le_len: this number, little-endian */
    unsigned le_len; /* 0: s[0..n) */
} word_t;

typedef struct dict {
    const word_t *w;
    size_t n;
} dict_t;

#define W(lit) {lit, sizeof lit - 1, 0, 0}
#define LE(v, n) {NULL, 0, v, n}
#define DICT(name, ...)                                                      \
    static const word_t name##_w[] = {__VA_ARGS__};                          \
    static const dict_t name = {name##_w, sizeof name##_w / sizeof name##_w[0]}

/* Fair tables for HSET: one of a slot, the same with V = 2^53 - 1, and
 * with its entry's s at 2^53 - 1 (filled at start). */
#define TABLE_LEN 80
static char tables[3][TABLE_LEN];

/* RATELIMIT.STEP's words (and the step's part of FAIR and LEASESTEP). */
DICT(d_sec, W("1000"), W(""), W("0"), W("1"), W("1700000000"),
     W("9223372036"), W("9223372037"), W("05"), W("x"));
DICT(d_ns, W("0"), W(""), W("1"), W("500000000"), W("999999999"),
     W("1000000000"));
DICT(d_permits, W("1"), W("0"), W("2"), W("7"), W("1000"),
     W("1125899906842623"), W("1125899906842624"),
     W("9223372036854775807"), W("9223372036854775808"),
     W("18446744073709551615"), W("18446744073709551616"));
DICT(d_wait, W("0"), W("1000000000"), W("1"), W("9223372036854775807"),
     W("9223372036854775808"));
DICT(d_ttl, W("-1"), W("0"), W("1000"), W("9223372036854"),
     W("9223372036855"), W("-2"), W("x"));
DICT(d_id, W("1"), W("0"), W("2"), W("4294967295"), W("4294967296"));
DICT(d_format, W("3"), W("2"), W("1"), W("4"), W("255"), W("256"));
DICT(d_algo, W("1"), W("2"), W("3"), W("4"), W("5"), W("0"), W("6"));
DICT(d_limit, W("10"), W("1"), W("0"), W("3"), W("1000"),
     W("1125899906842624"), W("18446744073709551615"));
DICT(d_period, W("1000000000"), W("1"), W("0"), W("1000"),
     W("60000000000"), W("9223372036854775807"), W("18446744073709551615"));
DICT(d_burst, W("10"), W("0"), W("1"), W("5"), W("10000"),
     W("18446744073709551615"));
/* RATELIMIT.LEASE's */
DICT(d_op, W("a"), W("r"), W("e"), W("c"), W("x"), W(""));
DICT(d_now, LE(UINT64_C(1000000000000), 8), LE(UINT64_C(1001000000000), 8),
     LE(UINT64_C(1000000000001), 8), LE(0, 8), LE(UINT64_MAX, 8),
     W("short"));
DICT(d_max, W("3"), W("1"), W("2"), W("10000"), W("10001"), W("0"));
DICT(d_reserve, W("0"), W("1"), W("2"), W("3"));
DICT(d_crit, W("0"), W("1"), W("2"));
DICT(d_lid, LE(1, 8), LE(2, 8), LE(3, 8), LE(0, 8));
DICT(d_expires, LE(UINT64_C(1010000000000), 8),
     LE(UINT64_C(1000500000000), 8), LE(0, 8), LE(UINT64_MAX, 8));
DICT(d_pid, LE(42, 4), LE(7, 4), W("abc"));
DICT(d_lttl, W("-1"), W("0"), W("1000000"), W("18446744073709551615"),
     W("x"));
/* RATELIMIT.FAIR's */
DICT(d_hash, LE(UINT64_C(0x1234567890abcdef), 8),
     LE(UINT64_C(0xfedcba0987654321), 8), LE(UINT64_C(0x1234567800000001), 8),
     LE(0, 8), W("short"));
DICT(d_weight, W("1"), W("2"), W("1048576"), W("1048577"), W("0"));
DICT(d_slots, W("4"), W("1"), W("4096"), W("4097"), W("0"));
DICT(d_period_us, W("1000000"), W("1"), W("9007199254740991"),
     W("9007199254740992"), W("0"));
/* CL.THROTTLE's */
DICT(d_tburst, W("15"), W("0"), W("2"), W("9223372036854775806"),
     W("9223372036854775807"));
DICT(d_tcount, W("30"), W("1"), W("0"), W("9223372036854775807"));
DICT(d_tperiod, W("60"), W("1"), W("0"), W("9223372036"), W("9223372037"));
DICT(d_tqty, W("1"), W("0"), W("5"), W("9223372036854775807"));
/* A client's HSET */
DICT(d_field, W("v"), W("s"), W("t"), W("x"));
DICT(d_value, W("1"), W("0"), W("05"), W("00"), W("9223372036854775806"),
     W("9223372036854775807"), W("9999999999999999999"),
     W("01234567890123456789"), W("18446744073709551614"), W(""),
     W("abc"), W("\0\0\0\0\0\0\0\0\0\0\0\0\0L"), {tables[0], TABLE_LEN, 0, 0},
     {tables[1], TABLE_LEN, 0, 0}, {tables[2], TABLE_LEN, 0, 0});

static const char *const key_names[] = {"a", "b", "c"};

/* ------------------------------------------------------ an input */

typedef struct in {
    const uint8_t *p;
    size_t n;
} in_t;

/* The next byte, 0 past the end. */
static uint8_t next(in_t *in)
{
    if (in->n == 0)
        return 0;
    in->n--;
    return *in->p++;
}

#define ARGS_MAX 48

/* A command's words. */
typedef struct cmd {
    int argc;
    const char *av[ARGS_MAX];
    size_t al[ARGS_MAX];
    char le[ARGS_MAX][8];
} cmd_t;

static void push(cmd_t *c, const char *s, size_t n)
{
    if (c->argc == ARGS_MAX)
        return;
    c->av[c->argc] = s;
    c->al[c->argc++] = n;
}

/* One word from d, or the input's raw bytes. */
static void arg(cmd_t *c, in_t *in, const dict_t *d)
{
    uint8_t sel = next(in);
    if (sel >= 0xF0) {
        size_t n = next(in);
        if (n > in->n)
            n = in->n;
        push(c, (const char *)in->p, n);
        in->p += n, in->n -= n;
        return;
    }
    const word_t *w = &d->w[sel % d->n];
    if (w->le_len == 0) {
        push(c, w->s, w->n);
        return;
    }
    if (c->argc == ARGS_MAX)
        return;
    for (unsigned i = 0; i < w->le_len; i++)
        c->le[c->argc][i] = (char)(uint8_t)(w->le >> (8 * i));
    push(c, c->le[c->argc], w->le_len);
}

static void key(cmd_t *c, in_t *in)
{
    const char *k = key_names[next(in) % 3];
    push(c, k, strlen(k));
}

static void limits(cmd_t *c, in_t *in, unsigned n)
{
    for (unsigned i = 0; i < n; i++) {
        arg(c, in, &d_algo);
        arg(c, in, &d_limit);
        arg(c, in, &d_period);
        arg(c, in, &d_burst);
    }
}

/* RATELIMIT.STEP's words after its key. */
static void step_args(cmd_t *c, in_t *in, unsigned nlim)
{
    static const dict_t *const head[] = {&d_sec, &d_ns, &d_permits, &d_wait,
                                         &d_ttl, &d_id, &d_format};
    for (size_t i = 0; i < sizeof head / sizeof head[0]; i++)
        arg(c, in, head[i]);
    limits(c, in, nlim);
}

/* RATELIMIT.LEASE's words after its key. */
static void lease_args(cmd_t *c, in_t *in)
{
    static const dict_t *const w[] = {&d_op,  &d_now,     &d_max,
                                      &d_reserve, &d_crit, &d_lid,
                                      &d_expires, &d_pid, &d_lttl};
    for (size_t i = 0; i < sizeof w / sizeof w[0]; i++)
        arg(c, in, w[i]);
}

static void fair_args(cmd_t *c, in_t *in)
{
    static const dict_t *const w[] = {&d_hash,      &d_weight, &d_slots,
                                      &d_period_us, &d_period, &d_limit};
    for (size_t i = 0; i < sizeof w / sizeof w[0]; i++)
        arg(c, in, w[i]);
}

/* -------------------------------------------------------- replies */

static void bad(const cmd_t *c, const char *what)
{
    fprintf(stderr, "fuzz_module: %.*s: %s\n", (int)c->al[0], c->av[0], what);
    abort();
}

static bool is_int(const mh_reply_t *r, long long lo, long long hi)
{
    return r->kind == MH_INT && r->n >= lo && r->n <= hi;
}

/* An error reply: a code in capitals, a space, a message; one line. */
static bool good_error(const mh_reply_t *r)
{
    size_t i = 0;
    while (i < r->len && r->s[i] >= 'A' && r->s[i] <= 'Z')
        i++;
    return i > 0 && i + 1 < r->len && r->s[i] == ' ' &&
           memchr(r->s, '\r', r->len) == NULL &&
           memchr(r->s, '\n', r->len) == NULL;
}

/* RATELIMIT.STEP's reply: {tag} or the nine words of a decision;
 * `tags` the one-word replies allowed. */
static bool good_decision(const mh_reply_t *r, size_t words, const char *tags)
{
    if (r->kind != MH_ARRAY)
        return false;
    if (r->count == 1)
        return r->el[0]->kind == MH_INT && r->el[0]->n >= 0 &&
               r->el[0]->n <= 9 && strchr(tags, (char)('0' + r->el[0]->n));
    if (r->count != words)
        return false;
    for (size_t i = 0; i < words; i++)
        if (r->el[i]->kind != MH_INT)
            return false;
    long long ll_max = INT64_MAX;
    bool ok = is_int(r->el[0], 1, 1) && is_int(r->el[1], 0, 1) &&
              is_int(r->el[2], 0, 2) && is_int(r->el[3], -1, 3) &&
              is_int(r->el[4], 0, ll_max) && is_int(r->el[5], 0, ll_max) &&
              is_int(r->el[6], 0, ll_max) && is_int(r->el[7], -1, ll_max) &&
              is_int(r->el[8], 0, ll_max);
    for (size_t i = 9; i < words; i++)
        ok = ok && is_int(r->el[i], 0, 1);
    return ok;
}

/* RATELIMIT.LEASE's five words, the first five of r. */
static bool good_lease(const mh_reply_t *r)
{
    return r->count >= 5 && is_int(r->el[0], 0, 3) &&
           is_int(r->el[1], 0, 1) && is_int(r->el[2], 0, 10000) &&
           r->el[3]->kind == MH_STR && r->el[3]->len == 8 &&
           r->el[4]->kind == MH_STR && r->el[4]->len == 8;
}

static bool good_reply(int kind, const mh_reply_t *r)
{
    if (r->kind == MH_ERR)
        return good_error(r);
    switch (kind) {
    case 0: return good_decision(r, 9, "02");
    case 1: return good_decision(r, 11, "023");
    case 2: return r->kind == MH_ARRAY && r->count == 5 && good_lease(r);
    case 3:
        return r->kind == MH_ARRAY && r->count == 6 && good_lease(r) &&
               (is_int(r->el[5], 0, 0) || good_decision(r->el[5], 9, "02"));
    default:
        return r->kind == MH_ARRAY && r->count == 5 &&
               is_int(r->el[0], 0, 1) && is_int(r->el[1], 1, INT64_MAX) &&
               is_int(r->el[2], 0, INT64_MAX) &&
               is_int(r->el[3], -1, INT64_MAX) &&
               is_int(r->el[4], 0, INT64_MAX);
    }
}

/* ------------------------------------------------------ operations */

/* One operation of the input. */
static void operation(in_t *in)
{
    static const char *const names[] = {"RATELIMIT.STEP", "RATELIMIT.FAIR",
                                        "RATELIMIT.LEASE",
                                        "RATELIMIT.LEASESTEP", "CL.THROTTLE"};
    cmd_t c;
    c.argc = 0;
    int kind = next(in) % 8;
    if (kind >= 5) { /* a client's command */
        const char *k = key_names[next(in) % 3];
        if (kind == 5) {
            arg(&c, in, &d_field);
            arg(&c, in, &d_value);
            char field[32];
            snprintf(field, sizeof field, "%.*s", (int)c.al[0], c.av[0]);
            mh_hset(k, strlen(k), field, c.av[1], c.al[1]);
        } else if (kind == 6) {
            mh_set(k, strlen(k));
        } else {
            mh_del(k, strlen(k));
        }
        return;
    }
    push(&c, names[kind], strlen(names[kind]));
    key(&c, in);
    if (kind == 1 || kind == 3)
        key(&c, in);
    uint8_t shape = next(in);
    unsigned nlim = 1 + (shape & 3u);
    switch (kind) {
    case 0: step_args(&c, in, nlim); break;
    case 1: step_args(&c, in, nlim), fair_args(&c, in); break;
    case 2: lease_args(&c, in); break;
    case 3: lease_args(&c, in), step_args(&c, in, nlim); break;
    default:
        arg(&c, in, &d_tburst);
        arg(&c, in, &d_tcount);
        arg(&c, in, &d_tperiod);
        if (shape & 4u)
            arg(&c, in, &d_tqty);
        break;
    }
    unsigned change = (shape >> 3) & 7u;
    if (change == 6)
        c.argc--; /* one word too few */
    else if (change == 7)
        limits(&c, in, 1); /* four too many */
    const mh_reply_t *r = mh_command(c.argc, c.av, c.al);
    if (r == NULL)
        bad(&c, "no such command");
    if (!good_reply(kind, r))
        bad(&c, "a reply that is not the command's");
    bool two_keys = kind == 1 || kind == 3;
    if (two_keys && c.al[1] == c.al[2] &&
        memcmp(c.av[1], c.av[2], c.al[1]) == 0 && r->kind != MH_ERR)
        bad(&c, "one key given twice, and no error");
}

static void put64(char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++, v >>= 8)
        p[i] = (char)(uint8_t)v;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    for (int i = 0; i < 3; i++) {
        memcpy(tables[i], "rfair\1\0\0", 8);
        put64(tables[i] + 8, 1); /* slots */
    }
    put64(tables[1] + 16, (UINT64_C(1) << 53) - 1); /* V */
    put64(tables[2] + 32, UINT64_C(0x1234567890abcdef)); /* an entry */
    put64(tables[2] + 40, (UINT64_C(1) << 53) - 1);      /* its s */
    put64(tables[2] + 48, 1);                            /* its period */
    put64(tables[2] + 72, 1);                            /* its weight */
    mh_load(RedisModule_OnLoad);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    in_t in = {data, size};
    for (int ops = 0; in.n > 0 && ops < 64; ops++)
        operation(&in);
    mh_flush();
    return 0;
}
