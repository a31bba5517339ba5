/* SPDX-License-Identifier: MIT */
/*
 * A group's first matching rule, found through an index (match.h).
 *
 * Trying each rule of a group in order costs a check as many string
 * comparisons as the group has match lines: 100,000 API keys, each a
 * rule or a match line of a tier rule, made a check 5,000 times slower
 * than one rule.  The index keeps, per value of one attribute, the lines
 * that test that exact value; a request tries those of its own value and
 * the lines that test no exact value of it, merged in file order, so the
 * first line that holds is the one the scan in order would have found.
 */
#include <stdlib.h>
#include <string.h>

#include "match.h"

const char *rate__attr_value(const rate_attr_t *attrs, size_t n,
                             const char *name)
{
    for (size_t i = 0; i < n; i++)
        if (attrs[i].name != NULL && strcmp(attrs[i].name, name) == 0)
            return attrs[i].value != NULL ? attrs[i].value : "";
    return NULL;
}

bool rate__alt_matches(const rate__alt_t *a, const rate_attr_t *attrs,
                       size_t n)
{
    for (size_t c = 0; c < a->count; c++) {
        const rate__cond_t *k = &a->cond[c];
        const char *v = rate__attr_value(attrs, n, k->attr);
        if (v == NULL ||
            (k->prefix ? strncmp(v, k->value, strlen(k->value)) != 0
                       : strcmp(v, k->value) != 0))
            return false;
    }
    return true;
}

static int by_name(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static int by_value_then_pos(const void *a, const void *b)
{
    const rate__match_cand_t *x = a, *y = b;
    int c = strcmp(x->value, y->value);
    return c != 0 ? c : (x->pos > y->pos) - (x->pos < y->pos);
}

/* The attribute most exact conditions of the rules test, or NULL when
 * none does.  False: no memory. */
static bool pick_attr(const rate__match_rule_t *rules, size_t n,
                      const char **attr)
{
    size_t total = 0, k = 0, best = 0;

    *attr = NULL;
    for (size_t i = 0; i < n; i++)
        for (size_t a = 0; a < rules[i].nalt; a++)
            total += rules[i].alt[a].count;
    if (total == 0)
        return true;
    const char **names = calloc(total, sizeof *names);
    if (names == NULL)
        return false;
    for (size_t i = 0; i < n; i++)
        for (size_t a = 0; a < rules[i].nalt; a++)
            for (size_t c = 0; c < rules[i].alt[a].count; c++)
                if (!rules[i].alt[a].cond[c].prefix)
                    names[k++] = rules[i].alt[a].cond[c].attr;
    qsort(names, k, sizeof *names, by_name);
    for (size_t i = 0, run; i < k; i += run) {
        for (run = 1; i + run < k && strcmp(names[i], names[i + run]) == 0;
             run++)
            ;
        if (run > best) {
            best = run;
            *attr = names[i];
        }
    }
    free(names);
    return true;
}

/* The line's exact value of attr, or NULL when it tests none. */
static const char *exact_value(const rate__alt_t *a, const char *attr)
{
    for (size_t c = 0; c < a->count; c++)
        if (!a->cond[c].prefix && strcmp(a->cond[c].attr, attr) == 0)
            return a->cond[c].value;
    return NULL;
}

bool rate__match_build(rate__match_ix_t *ix, const rate__match_rule_t *rules,
                       size_t n)
{
    size_t lines = 0, ncand = 0, distinct = 0;

    memset(ix, 0, sizeof *ix);
    if (!pick_attr(rules, n, &ix->attr))
        return false;
    for (size_t i = 0; i < n; i++)
        lines += rules[i].nalt > 0 ? rules[i].nalt : 1;
    ix->cand = calloc(lines + 1, sizeof *ix->cand);
    ix->scan = calloc(lines + 1, sizeof *ix->scan);
    if (ix->cand == NULL || ix->scan == NULL)
        goto oom;
    for (size_t i = 0; i < n; i++) {
        if (rules[i].nalt == 0)
            ix->scan[ix->nscan++] = (rate__match_cand_t){i, NULL, NULL};
        for (size_t a = 0; a < rules[i].nalt; a++) {
            const rate__alt_t *alt = &rules[i].alt[a];
            const char *v = ix->attr ? exact_value(alt, ix->attr) : NULL;
            if (v != NULL)
                ix->cand[ncand++] = (rate__match_cand_t){i, alt, v};
            else
                ix->scan[ix->nscan++] = (rate__match_cand_t){i, alt, NULL};
        }
    }
    if (ncand == 0)
        return true;
    qsort(ix->cand, ncand, sizeof *ix->cand, by_value_then_pos);
    for (size_t i = 0; i < ncand; i++)
        distinct += i == 0 || strcmp(ix->cand[i].value, ix->cand[i - 1].value);
    for (ix->cap = 16; ix->cap < 2 * distinct; ix->cap *= 2)
        ;
    if ((ix->slot = calloc(ix->cap, sizeof *ix->slot)) == NULL)
        goto oom;
    for (size_t i = 0, end; i < ncand; i = end) {
        const char *v = ix->cand[i].value;
        for (end = i + 1; end < ncand && strcmp(ix->cand[end].value, v) == 0;
             end++)
            ;
        size_t s = rate__str_hash(v, strlen(v)) & (ix->cap - 1);
        while (ix->slot[s].end != 0)
            s = (s + 1) & (ix->cap - 1);
        ix->slot[s] = (struct rate__match_run){i, end};
    }
    return true;
oom:
    rate__match_free(ix);
    return false;
}

size_t rate__match_first(const rate__match_ix_t *ix, const rate_attr_t *attrs,
                         size_t n)
{
    const rate__match_cand_t *c = NULL, *ce = NULL;
    const rate__match_cand_t *s = ix->scan, *se = ix->scan + ix->nscan;

    const char *v = ix->cap ? rate__attr_value(attrs, n, ix->attr) : NULL;
    if (v != NULL)
        for (size_t i = rate__str_hash(v, strlen(v)) & (ix->cap - 1);
             ix->slot[i].end != 0; i = (i + 1) & (ix->cap - 1))
            if (strcmp(ix->cand[ix->slot[i].start].value, v) == 0) {
                c = ix->cand + ix->slot[i].start;
                ce = ix->cand + ix->slot[i].end;
                break;
            }
    /* Both lists in file order: the lower position is tried first. */
    while (c != ce || s != se) {
        const rate__match_cand_t *t =
            s == se || (c != ce && c->pos <= s->pos) ? c++ : s++;
        if (t->alt == NULL || rate__alt_matches(t->alt, attrs, n))
            return t->pos;
    }
    return SIZE_MAX;
}

void rate__match_free(rate__match_ix_t *ix)
{
    free(ix->cand);
    free(ix->slot);
    free(ix->scan);
    memset(ix, 0, sizeof *ix);
}
