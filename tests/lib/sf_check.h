/* SPDX-License-Identifier: MIT */
/*
 * A small parser of HTTP structured-field lists (RFC 9651, section 4.2),
 * for checking what rate_headers_format writes: a list of items, each a
 * bare item (integer, string or token) with parameters whose values are
 * bare items (or true when the value is left out).  Inner lists, decimals,
 * byte sequences, dates and display strings are not accepted: the library
 * writes none, so one of them in its output is an error too.  Written
 * from the RFC's parsing algorithms; header-only, for the tests.
 */
#ifndef TEST_SF_CHECK_H
#define TEST_SF_CHECK_H

#include <ctype.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define SF_MAX_ITEMS 8
#define SF_MAX_PARAMS 8
#define SF_STR_MAX 128

typedef enum { SF_INTEGER, SF_STRING, SF_TOKEN, SF_BOOLEAN } sf_type_t;

typedef struct sf_bare {
    sf_type_t type;
    int64_t integer;          /* SF_INTEGER, SF_BOOLEAN (0 or 1) */
    char text[SF_STR_MAX];    /* SF_STRING (unescaped), SF_TOKEN */
} sf_bare_t;

typedef struct sf_item {
    sf_bare_t value;
    size_t nparams;
    char key[SF_MAX_PARAMS][SF_STR_MAX];
    sf_bare_t param[SF_MAX_PARAMS];
} sf_item_t;

typedef struct sf_list {
    size_t count;
    sf_item_t item[SF_MAX_ITEMS];
    char error[128]; /* why parsing failed */
} sf_list_t;

static bool sf__fail(sf_list_t *l, const char *why, const char *at)
{
    snprintf(l->error, sizeof l->error, "%s at '%.20s'", why, at);
    return false;
}

static bool sf__bare(sf_list_t *l, const char **pp, sf_bare_t *b)
{
    const char *p = *pp;

    memset(b, 0, sizeof *b);
    if (*p == '-' || isdigit((unsigned char)*p)) { /* sf-integer */
        bool neg = *p == '-';
        int digits = 0;
        int64_t v = 0;
        if (neg)
            p++;
        if (!isdigit((unsigned char)*p))
            return sf__fail(l, "'-' without a digit", p);
        while (isdigit((unsigned char)*p)) {
            if (++digits > 15)
                return sf__fail(l, "integer of more than 15 digits", *pp);
            v = v * 10 + (*p++ - '0');
        }
        if (*p == '.')
            return sf__fail(l, "a decimal (not written by the library)", p);
        b->type = SF_INTEGER;
        b->integer = neg ? -v : v;
    } else if (*p == '"') { /* sf-string */
        size_t o = 0;
        p++;
        for (;;) {
            char c = *p++;
            if (c == '\0')
                return sf__fail(l, "string without its closing quote", *pp);
            if (c == '"')
                break;
            if (c == '\\') {
                c = *p++;
                if (c != '"' && c != '\\')
                    return sf__fail(l, "bad escape in a string", p - 2);
            } else if ((unsigned char)c < 0x20 || (unsigned char)c > 0x7e) {
                return sf__fail(l, "string byte out of %x20-7E", p - 1);
            }
            if (o + 1 >= SF_STR_MAX)
                return sf__fail(l, "string too long for the checker", *pp);
            b->text[o++] = c;
        }
        b->type = SF_STRING;
    } else if (isalpha((unsigned char)*p) || *p == '*') { /* sf-token */
        size_t o = 0;
        while (isalnum((unsigned char)*p) || strchr("!#$%&'*+-.^_`|~:/", *p)) {
            if (*p == '\0')
                break;
            if (o + 1 >= SF_STR_MAX)
                return sf__fail(l, "token too long for the checker", *pp);
            b->text[o++] = *p++;
        }
        b->type = SF_TOKEN;
    } else if (*p == '?') { /* sf-boolean */
        if (p[1] != '0' && p[1] != '1')
            return sf__fail(l, "bad boolean", p);
        b->type = SF_BOOLEAN;
        b->integer = p[1] == '1';
        p += 2;
    } else {
        return sf__fail(l, "not a bare item this checker knows", p);
    }
    *pp = p;
    return true;
}

static bool sf__params(sf_list_t *l, const char **pp, sf_item_t *it)
{
    const char *p = *pp;

    while (*p == ';') {
        p++;
        while (*p == ' ')
            p++;
        if (!(islower((unsigned char)*p) || *p == '*'))
            return sf__fail(l, "parameter key must start with a-z or *", p);
        if (it->nparams == SF_MAX_PARAMS)
            return sf__fail(l, "too many parameters for the checker", p);
        size_t o = 0;
        char *key = it->key[it->nparams];
        while (islower((unsigned char)*p) || isdigit((unsigned char)*p) ||
               (*p != '\0' && strchr("_-.*", *p)))
            key[o++] = *p++;
        key[o] = '\0';
        for (size_t i = 0; i < it->nparams; i++)
            if (strcmp(it->key[i], key) == 0)
                return sf__fail(l, "a parameter given twice", p);
        sf_bare_t *v = &it->param[it->nparams];
        if (*p == '=') {
            p++;
            if (!sf__bare(l, &p, v))
                return false;
        } else {
            memset(v, 0, sizeof *v);
            v->type = SF_BOOLEAN;
            v->integer = 1;
        }
        it->nparams++;
    }
    *pp = p;
    return true;
}

/* Parses a whole field value as a list; false (l->error says why) if it
 * is not one. */
static inline bool sf_parse_list(const char *text, sf_list_t *l)
{
    const char *p = text;

    memset(l, 0, sizeof *l);
    while (*p == ' ')
        p++;
    while (*p != '\0') {
        if (l->count == SF_MAX_ITEMS)
            return sf__fail(l, "too many items for the checker", p);
        if (*p == '(')
            return sf__fail(l, "an inner list (not written by the library)",
                            p);
        sf_item_t *it = &l->item[l->count];
        if (!sf__bare(l, &p, &it->value) || !sf__params(l, &p, it))
            return false;
        l->count++;
        while (*p == ' ' || *p == '\t')
            p++;
        if (*p == '\0')
            break;
        if (*p != ',')
            return sf__fail(l, "expected ',' between members", p);
        p++;
        while (*p == ' ' || *p == '\t')
            p++;
        if (*p == '\0')
            return sf__fail(l, "trailing ','", p);
    }
    if (l->count == 0)
        return sf__fail(l, "an empty list", text);
    return true;
}

/* The integer parameter `key` of an item, or -1 when it has none (or it is
 * not an integer). */
static inline int64_t sf_param_int(const sf_item_t *it, const char *key)
{
    for (size_t i = 0; i < it->nparams; i++)
        if (strcmp(it->key[i], key) == 0)
            return it->param[i].type == SF_INTEGER ? it->param[i].integer
                                                    : -1;
    return -1;
}

#endif
