/* SPDX-License-Identifier: MIT */
/*
 * Rules: which named policies a request gets, from a rules file, and how
 * a new file replaces the old one while decisions run.
 *
 * A rules file (INI, read by libinih; docs/api-server.md) names policies
 * in [policies] and lists [rule NAME] sections, each matching request
 * attributes (strings the server passes: tier, route, client address...)
 * to policies and the key each is charged under.  Rules are grouped: in
 * each group the first rule that matches applies, and a request gets the
 * policies of every group's match (a per-route limit beside a per-user
 * one).  What a file holds is parsed whole into one immutable generation
 * (gen_t); a file with any error is reported and thrown away, so a bad
 * file never replaces a good one.
 *
 * Reloading swaps the current generation with one atomic pointer.  A
 * decision holds the generation it read through a hazard pointer: its
 * thread's slot (one per thread and rules object, found through a small
 * thread-local cache, added once under the mutex) publishes the pointer,
 * then reads the current one again to be sure it was not swapped
 * meanwhile; no lock, and nothing shared is written but the thread's own
 * slot.  A reload (serialised by a mutex of its own, the file read before
 * the swap takes the slots' mutex) retires the old generation
 * and frees every retired one no slot points at.  A thread holds at most
 * one generation at a time, so at most one generation per thread stays
 * retired: what is kept is bounded by the threads, never by the number of
 * reloads.
 *
 * Every policy a generation names lives in it, and a decision's outcome
 * copies what it needs (names, limits) before the hold ends, so an
 * outcome outlives any reload.  A key's state carries over between
 * generations as between any two policies (docs/algorithms.md, "Policy
 * changes"): state is keyed by the key, never by the rules.
 */
#include <errno.h>
#include <ini.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <string.h>
#include <sys/stat.h>

#include "http.h"
#include "match.h"
#include "ratelimit_fair.h"
#include "ratelimit_lease.h"

/* Writes a one-line reason into err (when there is room) and returns rc. */
static int fail(char *err, size_t errlen, int rc, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int fail(char *err, size_t errlen, int rc, const char *fmt, ...)
{
    if (err != NULL && errlen > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return rc;
}

#define SLOT_CACHE 4u
#define ERR_MAX 512u
#define DEFAULT_GROUP "default"

typedef struct rule {
    char *name;
    char *group;
    unsigned line;
    rate__alt_t *alt; /* none: matches every request */
    size_t nalt;
    const rate_policy_t *policy[RATE_RULES_MAX_APPLY];
    size_t npolicy;
    unsigned policy_line;
    char **key_attr; /* none: the request's own key (or, shared, none) */
    size_t nkey;
    bool shared;     /* one key for every request the rule matches */
    bool fair;       /* key = fair: that key divided fairly among the
                        requests' own keys (docs/fair.md) */
    uint32_t weight; /* weight = N: a matching request's weight; 0: none */
    uint32_t slots;  /* slots = N: the fair tables' flows; 0: their default */
    unsigned slots_line;
    struct fair_cell *_Atomic fairs; /* key = fair: per limiter, made at
                                        its first decision */
    bool has_group, has_key;
    /* In-flight policies (docs/leases.md, "The rules file"): the i-th
     * policy's, or NULL for a rate policy; their inflight objects per
     * limiter, made at its first decision. */
    const rate_inflight_policy_t *inflight[RATE_RULES_MAX_APPLY];
    struct lease_cell *_Atomic leases;
    int cls;        /* class =: CLS_NONE, CLS_NORMAL, CLS_CRITICAL, CLS_ATTR */
    char *cls_attr; /* CLS_ATTR: the attribute naming the class */
} rule_t;

enum { CLS_NONE, CLS_NORMAL, CLS_CRITICAL, CLS_ATTR };

/* An in-flight rule's inflight objects on one limiter (its store and
 * clock), one per in-flight policy; found by the limiter's id as fair
 * cells are, pushed under fair_lock, freed with the generation (never
 * before every lease taken through them is released). */
typedef struct lease_cell {
    uint64_t lim_id;
    rate_inflight_t *in[RATE_RULES_MAX_APPLY];
    int rc[RATE_RULES_MAX_APPLY]; /* rate_inflight_new's, for a NULL in */
    struct lease_cell *next;
} lease_cell_t;

/* A fair rule's fair limits on one limiter, one per policy; cells are
 * only pushed (under fair_lock) and freed with the generation.  A cell is
 * found by the limiter's id, not its address: a limiter made where a
 * freed one was must not inherit its fair state (or its clock). */
typedef struct fair_cell {
    uint64_t lim_id;
    rate_fair_t *fair[RATE_RULES_MAX_APPLY];
    int rc[RATE_RULES_MAX_APPLY]; /* rate_fair_new's, for a NULL fair */
    struct fair_cell *next;
} fair_cell_t;
static pthread_mutex_t fair_lock = PTHREAD_MUTEX_INITIALIZER;

typedef struct named {
    rate_policy_t *policy; /* its name is the [policies] entry's (an
                              in-flight one's: the unlimited policy) */
    rate_inflight_policy_t *inflight; /* or NULL: a rate policy */
} named_t;

typedef struct gen {
    named_t *named;
    size_t nnamed;
    rule_t *rule; /* in file order */
    size_t nrule;
    size_t *order; /* the rules by group, then file order */
    size_t ngroup;
    size_t *group_start; /* ngroup + 1 offsets into order */
    rate__match_ix_t *ix; /* each group's index of its rules' match lines */
    uint64_t number;
    struct gen *next_retired;
    _Atomic size_t held; /* requests holding leases through it: kept until
                            they are released, even retired */
} gen_t;

typedef struct slot {
    _Atomic(gen_t *) hp;
    pthread_t owner;
    struct slot *next;
} slot_t;
#define SLOT_SIZE ((sizeof(slot_t) + 63) / 64 * 64)

struct rate_rules {
    _Atomic(gen_t *) current;
    slot_t *_Atomic slots;
    pthread_mutex_t lock; /* a reload's swap, adding a slot, reclaiming */
    pthread_mutex_t reload_lock; /* one reload at a time: the path, and
                                    files swapped in the order read */
    gen_t *retired;
    char *path;
    uint64_t id;
    _Atomic uint64_t generation;
    _Atomic size_t live; /* generations made and not yet freed */
};

static _Atomic uint64_t next_rules_id = 1;
static _Thread_local struct {
    uint64_t id[SLOT_CACHE];
    slot_t *slot[SLOT_CACHE];
} tls_slots;

/* ------------------------------------------------------------ generations */

static void gen_free(gen_t *g)
{
    if (g == NULL)
        return;
    for (size_t i = 0; i < g->nnamed; i++) {
        rate_policy_free(g->named[i].policy);
        rate_inflight_policy_free(g->named[i].inflight);
    }
    for (size_t i = 0; i < g->nrule; i++) {
        rule_t *r = &g->rule[i];
        for (size_t a = 0; a < r->nalt; a++) {
            for (size_t c = 0; c < r->alt[a].count; c++) {
                free(r->alt[a].cond[c].attr);
                free(r->alt[a].cond[c].value);
            }
            free(r->alt[a].cond);
        }
        for (size_t k = 0; k < r->nkey; k++)
            free(r->key_attr[k]);
        free(r->key_attr);
        for (fair_cell_t *c = r->fairs, *next; c != NULL; c = next) {
            next = c->next;
            for (size_t p = 0; p < RATE_RULES_MAX_APPLY; p++)
                rate_fair_free(c->fair[p]);
            free(c);
        }
        for (lease_cell_t *c = r->leases, *next; c != NULL; c = next) {
            next = c->next;
            for (size_t p = 0; p < RATE_RULES_MAX_APPLY; p++)
                rate_inflight_free(c->in[p]);
            free(c);
        }
        free(r->cls_attr);
        free(r->alt);
        free(r->name);
        free(r->group);
    }
    for (size_t k = 0; g->ix != NULL && k < g->ngroup; k++)
        rate__match_free(&g->ix[k]);
    free(g->ix);
    free(g->named);
    free(g->rule);
    free(g->order);
    free(g->group_start);
    free(g);
}

/* -------------------------------------------------------------- parsing */

/* Grows an array of n elements of `size` bytes that is about to get its
 * (n+1)-th: to double its size when n is 0 or a power of two, which is
 * when it is full (each array grows only by this).  A reading is linear
 * in the file however many elements one array gets.  False: no memory
 * (*arr unchanged). */
static bool grow(void *arr, size_t n, size_t size)
{
    if ((n & (n - 1)) != 0)
        return true;
    size_t cap = n == 0 ? 1 : 2 * n;
    if (cap > SIZE_MAX / size)
        return false;
    void *p = realloc(*(void **)arr, cap * size);
    if (p == NULL)
        return false;
    *(void **)arr = p;
    return true;
}

/* A set of names, each an index into an array that holds the name (the
 * named policies, the rules): open addressing, kept at most half full,
 * so that finding a name is as quick with 100,000 names as with ten. */
typedef struct names {
    size_t *slot; /* index + 1; 0: empty */
    size_t cap;   /* a power of two, or 0 */
    size_t count;
} names_t;

/* The index whose name (by name_of) is s[0..n), or SIZE_MAX. */
static size_t names_find(const names_t *t, const char *s, size_t n,
                         const char *(*name_of)(const void *, size_t),
                         const void *arr)
{
    if (t->cap == 0)
        return SIZE_MAX;
    for (size_t i = rate__str_hash(s, n) & (t->cap - 1);; i = (i + 1) & (t->cap - 1)) {
        if (t->slot[i] == 0)
            return SIZE_MAX;
        const char *name = name_of(arr, t->slot[i] - 1);
        if (strncmp(name, s, n) == 0 && name[n] == '\0')
            return t->slot[i] - 1;
    }
}

/* Adds index idx, whose name is not in t yet.  False: no memory. */
static bool names_add(names_t *t, size_t idx,
                      const char *(*name_of)(const void *, size_t),
                      const void *arr)
{
    if (2 * (t->count + 1) > t->cap) {
        size_t cap = t->cap == 0 ? 16 : 2 * t->cap;
        size_t *slot = calloc(cap, sizeof *slot);
        if (slot == NULL)
            return false;
        for (size_t i = 0; i < t->cap; i++) {
            if (t->slot[i] == 0)
                continue;
            const char *name = name_of(arr, t->slot[i] - 1);
            size_t j = rate__str_hash(name, strlen(name)) & (cap - 1);
            while (slot[j] != 0)
                j = (j + 1) & (cap - 1);
            slot[j] = t->slot[i];
        }
        free(t->slot);
        t->slot = slot;
        t->cap = cap;
    }
    const char *name = name_of(arr, idx);
    size_t j = rate__str_hash(name, strlen(name)) & (t->cap - 1);
    while (t->slot[j] != 0)
        j = (j + 1) & (t->cap - 1);
    t->slot[j] = idx + 1;
    t->count++;
    return true;
}

static const char *policy_name_at(const void *arr, size_t i)
{
    return rate_policy_name(((const named_t *)arr)[i].policy);
}

static const char *rule_name_at(const void *arr, size_t i)
{
    return ((const rule_t *)arr)[i].name;
}

static const char *rule_group_at(const void *arr, size_t i)
{
    return ((const rule_t *)arr)[i].group;
}

typedef struct load {
    gen_t *g;
    const char *path;
    FILE *file;
    unsigned line;     /* of the line inih is on */
    unsigned section_line; /* of the last [section] line read */
    char header[200];  /* that line's section name, "" if it has no ']' */
    bool refused;      /* the reader refused a line: too long for inih,
                          or with a NUL byte */
    bool ended;        /* the last line read ended with its newline */
    int read_errno;    /* why a read failed (a directory: EISDIR) */
    char err[ERR_MAX]; /* the first error, "" none */
    unsigned err_line;
    rule_t *cur;       /* the [rule] being read */
    char section[256];
    unsigned cur_section_line; /* where `section` began */
    names_t policies;  /* the named policies' indexes, by name */
    names_t rules;     /* the rules' indexes, by name */
    names_t groups;    /* the groups' first rules' indexes, by name */
} load_t;

static bool lfail(load_t *l, unsigned line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static bool lfail(load_t *l, unsigned line, const char *fmt, ...)
{
    if (l->err[0] == '\0') {
        int n = snprintf(l->err, sizeof l->err, "%s:%u: ", l->path, line);
        va_list ap;
        va_start(ap, fmt);
        if (n >= 0 && (size_t)n < sizeof l->err)
            vsnprintf(l->err + n, sizeof l->err - (size_t)n, fmt, ap);
        va_end(ap);
        l->err_line = line;
    }
    return false;
}

/* inih calls nothing for a section with no settings, so the reader tells
 * one when the next section, or the end of the file, comes: a rule cut
 * short after its header (a torn file) is refused, not skipped. An empty
 * [policies] defines nothing, which is harmless. */
static void empty_section(load_t *l)
{
    const char *h = l->header;

    if (l->section_line == 0 || l->section_line == l->cur_section_line ||
        h[0] == '\0' || strcmp(h, "policies") == 0)
        return;
    if (strncmp(h, "rule", 4) == 0 && (h[4] == ' ' || h[4] == '\t')) {
        h += 4 + strspn(h + 4, " \t");
        lfail(l, l->section_line, "[rule %s] has no 'policy =' line", h);
    } else {
        lfail(l, l->section_line, "unknown section [%s] ([policies] or "
              "[rule NAME])", h);
    }
}

/* inih's reader: a line at a time, counting lines, and refusing a line
 * longer than inih's buffer (which it would otherwise read as two) or one
 * with a NUL byte (which would end it there, the rest unread). */
static char *read_line(char *str, int num, void *stream)
{
    load_t *l = stream;
    size_t n = 0, max = num > 1 ? (size_t)num - 1 : 0;
    int c;

    if (l->refused)
        return NULL;
    while (n < max && (c = getc_unlocked(l->file)) != EOF) {
        if (c == '\0') {
            l->refused = true;
            lfail(l, l->line + 1, "a NUL byte in the line (not a text "
                  "file?)");
            return NULL;
        }
        str[n++] = (char)c;
        if (c == '\n')
            break;
    }
    if (n == 0) {
        if (ferror(l->file))
            l->read_errno = errno;
        return NULL;
    }
    str[n] = '\0';
    l->line++;
    l->ended = str[n - 1] == '\n';
    const char *open = str;
    if (l->line == 1 && n >= 3 && memcmp(open, "\xEF\xBB\xBF", 3) == 0)
        open += 3; /* a UTF-8 BOM, which the INI reader skips too */
    open += strspn(open, " \t");
    if (*open == '[') {
        empty_section(l);
        const char *close = strchr(open, ']');
        size_t hn = close == NULL ? 0 : (size_t)(close - open - 1);
        if (hn >= sizeof l->header)
            hn = 0;
        memcpy(l->header, open + 1, hn);
        l->header[hn] = '\0';
        l->section_line = l->line;
    }
    if (n == max && !l->ended && (c = getc_unlocked(l->file)) != EOF) {
        ungetc(c, l->file);
        l->refused = true;
        lfail(l, l->line, "line longer than %d bytes", num - 3);
        return NULL;
    }
    return str;
}

static bool is_attr_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
           (c >= '0' && c <= '9') || c == '_' || c == '-' || c == '.';
}

static bool is_attr_name(const char *s, size_t n)
{
    if (n == 0)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!is_attr_char(s[i]))
            return false;
    return true;
}

/* Splits value into words (spaces or tabs); calls fn on each. */
static bool each_word(load_t *l, const char *value,
                      bool (*fn)(load_t *, const char *, size_t, void *),
                      void *arg)
{
    const char *p = value;
    bool any = false;

    for (;;) {
        while (*p == ' ' || *p == '\t')
            p++;
        if (*p == '\0')
            return any;
        size_t n = strcspn(p, " \t");
        if (!fn(l, p, n, arg))
            return false;
        any = true;
        p += n;
    }
}

static char *dup_n(const char *s, size_t n)
{
    char *d = malloc(n + 1);
    if (d != NULL) {
        memcpy(d, s, n);
        d[n] = '\0';
    }
    return d;
}

static bool add_cond(load_t *l, const char *w, size_t n, void *arg)
{
    rate__alt_t *a = arg;
    const char *eq = memchr(w, '=', n);

    if (eq == NULL || !is_attr_name(w, (size_t)(eq - w)))
        return lfail(l, l->line,
                     "match: '%.*s' is not ATTRIBUTE=VALUE (attribute names "
                     "are letters, digits, '_', '-' and '.')",
                     (int)n, w);
    size_t vlen = n - (size_t)(eq - w) - 1;
    if (vlen == 0)
        return lfail(l, l->line,
                     "match: '%.*s' has no value (write ATTRIBUTE=* for any "
                     "value)",
                     (int)n, w);
    if (!grow(&a->cond, a->count, sizeof *a->cond))
        return lfail(l, l->line, "out of memory");
    rate__cond_t *c = &a->cond[a->count];
    c->prefix = eq[vlen] == '*';
    c->attr = dup_n(w, (size_t)(eq - w));
    c->value = dup_n(eq + 1, vlen - c->prefix);
    a->count++;
    if (c->attr == NULL || c->value == NULL)
        return lfail(l, l->line, "out of memory");
    return true;
}

/* The named policy called s[0..n), or NULL. */
static const named_t *named_policy(const load_t *l, const char *s, size_t n)
{
    size_t i = names_find(&l->policies, s, n, policy_name_at, l->g->named);
    return i == SIZE_MAX ? NULL : &l->g->named[i];
}

static bool add_policy(load_t *l, const char *w, size_t n, void *arg)
{
    rule_t *r = arg;
    const named_t *np = named_policy(l, w, n);

    if (np == NULL)
        return lfail(l, l->line,
                     "policy '%.*s' is not defined (name it in [policies], "
                     "above the rules)",
                     (int)n, w);
    const rate_policy_t *p = np->policy;
    for (size_t i = 0; i < r->npolicy; i++)
        if (r->policy[i] == p)
            return lfail(l, l->line, "policy '%.*s' given twice", (int)n, w);
    if (r->npolicy == RATE_RULES_MAX_APPLY)
        return lfail(l, l->line, "more than %d policies in one rule",
                     RATE_RULES_MAX_APPLY);
    r->inflight[r->npolicy] = np->inflight;
    r->policy[r->npolicy++] = p;
    return true;
}

static bool add_key(load_t *l, const char *w, size_t n, void *arg)
{
    rule_t *r = arg;

    if (!is_attr_name(w, n))
        return lfail(l, l->line,
                     "key: '%.*s' is not an attribute name (letters, digits, "
                     "'_', '-' and '.'; 'key' is the request's key, 'shared' one "
                     "key for the rule, 'fair' that key shared fairly)",
                     (int)n, w);
    if (!grow(&r->key_attr, r->nkey, sizeof *r->key_attr))
        return lfail(l, l->line, "out of memory");
    if ((r->key_attr[r->nkey] = dup_n(w, n)) == NULL)
        return lfail(l, l->line, "out of memory");
    r->nkey++;
    return true;
}

/* Whether a policy's text has a `concurrency` clause: an in-flight one. */
static bool is_inflight_text(const char *v)
{
    for (const char *p = v; (p = strstr(p, "concurrency")) != NULL; p++) {
        char after = p[sizeof "concurrency" - 1];
        bool starts = p == v || p[-1] == ' ' || p[-1] == '\t' || p[-1] == ';';
        if (starts && (after == ' ' || after == '\t' || after == '\0'))
            return true;
    }
    return false;
}

static bool on_policy(load_t *l, const char *name, const char *value)
{
    rate_policy_t *p = NULL;
    rate_inflight_policy_t *ip = NULL;
    char why[300];

    if (named_policy(l, name, strlen(name)) != NULL)
        return lfail(l, l->line, "policy '%s' defined twice", name);
    if (is_inflight_text(value)) {
        /* The in-flight policy; its name is carried by an unlimited
         * policy of that name, which every lookup by name finds. */
        if (rate_inflight_policy_parse(value, &ip, why, sizeof why) !=
            RATE_OK)
            return lfail(l, l->line, "policy '%s': %s", name, why);
        if (rate_policy_unlimited(&p) != RATE_OK) {
            rate_inflight_policy_free(ip);
            return lfail(l, l->line, "out of memory");
        }
    } else if (rate_policy_parse(value, &p, why, sizeof why) != RATE_OK)
        return lfail(l, l->line, "policy '%s': %s", name, why);
    const char *own = rate_policy_name(p);
    if (own[0] != '\0' && strcmp(own, name) != 0) {
        lfail(l, l->line, "policy '%s': its text names it '%s'", name, own);
        rate_policy_free(p);
        return false;
    }
    if (rate_policy_set_name(p, name, why, sizeof why) != RATE_OK) {
        lfail(l, l->line, "%s", why);
        rate_policy_free(p);
        rate_inflight_policy_free(ip);
        return false;
    }
    if (!grow(&l->g->named, l->g->nnamed, sizeof *l->g->named)) {
        rate_policy_free(p);
        rate_inflight_policy_free(ip);
        return lfail(l, l->line, "out of memory");
    }
    named_t *nn = l->g->named;
    nn[l->g->nnamed].policy = p;
    nn[l->g->nnamed++].inflight = ip;
    if (!names_add(&l->policies, l->g->nnamed - 1, policy_name_at, nn))
        return lfail(l, l->line, "out of memory");
    return true;
}

/* A new [rule NAME] section. */
static bool start_rule(load_t *l, const char *section)
{
    const char *name = section + 4;
    gen_t *g = l->g;

    while (*name == ' ' || *name == '\t')
        name++;
    if (!is_attr_name(name, strlen(name)))
        return lfail(l, l->section_line,
                     "[%s]: a rule's name is letters, digits, '_', '-' and "
                     "'.' ([rule NAME])",
                     section);
    size_t first = names_find(&l->rules, name, strlen(name), rule_name_at,
                              g->rule);
    if (first != SIZE_MAX)
        return lfail(l, l->section_line, "[rule %s] given twice (first "
                     "at line %u)", name, g->rule[first].line);
    if (!grow(&g->rule, g->nrule, sizeof *g->rule))
        return lfail(l, l->line, "out of memory");
    rule_t *r = &g->rule[g->nrule++];
    memset(r, 0, sizeof *r);
    r->line = l->section_line;
    r->name = dup_n(name, strlen(name));
    if (r->name == NULL ||
        !names_add(&l->rules, g->nrule - 1, rule_name_at, g->rule))
        return lfail(l, l->line, "out of memory");
    l->cur = r;
    return true;
}

/* A rule's setting NAME = N, 1..max, given once, into *out (0 until
 * given); `what` says what N is. */
static bool rule_count(load_t *l, const rule_t *r, const char *name,
                       const char *value, uint32_t max, const char *what,
                       uint32_t *out)
{
    uint64_t n;
    if (*out != 0)
        return lfail(l, l->line, "%s given twice in [rule %s]", name,
                     r->name);
    if (rate_parse_count(value, &n, NULL, 0) != RATE_OK || n == 0 || n > max)
        return lfail(l, l->line, "%s '%s' is not a whole number from 1 to "
                     "%u (%s)", name, value, max, what);
    *out = (uint32_t)n;
    return true;
}

static bool on_rule(load_t *l, const char *name, const char *value)
{
    rule_t *r = l->cur;

    if (strcmp(name, "match") == 0) {
        if (!grow(&r->alt, r->nalt, sizeof *r->alt))
            return lfail(l, l->line, "out of memory");
        rate__alt_t *a = &r->alt[r->nalt++];
        memset(a, 0, sizeof *a);
        if (!each_word(l, value, add_cond, a))
            return l->err[0] != '\0'
                       ? false
                       : lfail(l, l->line, "match is empty (leave it out "
                               "to match every request)");
        return true;
    }
    if (strcmp(name, "policy") == 0) {
        if (r->npolicy > 0)
            return lfail(l, l->line, "policy given twice in [rule %s] "
                         "(list every policy on one line)", r->name);
        r->policy_line = l->line;
        if (!each_word(l, value, add_policy, r))
            return l->err[0] != '\0' ? false
                                     : lfail(l, l->line, "policy is empty");
        return true;
    }
    if (strcmp(name, "key") == 0) {
        if (r->has_key)
            return lfail(l, l->line, "key given twice in [rule %s]", r->name);
        r->has_key = true;
        if (!each_word(l, value, add_key, r))
            return l->err[0] != '\0' ? false
                                     : lfail(l, l->line, "key is empty");
        /* "key" alone is the request's key: the default; "shared" alone
         * is one key for the rule; "fair" alone, that key shared fairly
         * among the requests' own keys. */
        bool shared = false, fair = false;
        for (size_t k = 0; k < r->nkey; k++) {
            shared = shared || strcmp(r->key_attr[k], "shared") == 0;
            fair = fair || strcmp(r->key_attr[k], "fair") == 0;
        }
        if ((shared || fair) && r->nkey > 1)
            return lfail(l, l->line, "key: '%s' stands alone (one key "
                         "for every request of [rule %s])",
                         shared ? "shared" : "fair", r->name);
        if (r->nkey == 1 &&
            (shared || fair || strcmp(r->key_attr[0], "key") == 0)) {
            free(r->key_attr[0]);
            r->nkey = 0;
            r->shared = shared || fair;
            r->fair = fair;
        }
        return true;
    }
    if (strcmp(name, "weight") == 0)
        return rule_count(l, r, name, value, RATE_FAIR_WEIGHT_MAX,
                          "a request's share of a fair rule's limit",
                          &r->weight);
    if (strcmp(name, "slots") == 0) {
        r->slots_line = l->line;
        return rule_count(l, r, name, value, RATE_FAIR_SLOTS_MAX,
                          "the flows a fair rule's table keeps apart",
                          &r->slots);
    }
    if (strcmp(name, "class") == 0) {
        if (r->cls != CLS_NONE)
            return lfail(l, l->line, "class given twice in [rule %s]",
                         r->name);
        if (strcmp(value, "critical") == 0)
            r->cls = CLS_CRITICAL;
        else if (strcmp(value, "normal") == 0)
            r->cls = CLS_NORMAL;
        else if (is_attr_name(value, strlen(value))) {
            r->cls = CLS_ATTR;
            if ((r->cls_attr = dup_n(value, strlen(value))) == NULL)
                return lfail(l, l->line, "out of memory");
        } else
            return lfail(l, l->line, "class '%s' is not 'critical', "
                         "'normal' or an attribute name (letters, digits, "
                         "'_', '-' and '.')", value);
        return true;
    }
    if (strcmp(name, "group") == 0) {
        if (r->has_group)
            return lfail(l, l->line, "group given twice in [rule %s]",
                         r->name);
        if (!is_attr_name(value, strlen(value)))
            return lfail(l, l->line, "group '%s' is not a name (letters, "
                         "digits, '_', '-' and '.')", value);
        r->has_group = true;
        r->group = dup_n(value, strlen(value));
        return r->group != NULL ? true : lfail(l, l->line, "out of memory");
    }
    return lfail(l, l->line,
                 "unknown setting '%s' in [rule %s] (match, policy, key, "
                 "group, weight, class, slots)",
                 name, r->name);
}

static int on_line(void *user, const char *section, const char *name,
                   const char *value)
{
    load_t *l = user;

    if (l->err[0] != '\0')
        return 0; /* only the first error is told */
    /* A new section (the same name again is a new one, then). */
    if (strcmp(section, l->section) != 0 ||
        l->section_line != l->cur_section_line) {
        snprintf(l->section, sizeof l->section, "%s", section);
        l->cur_section_line = l->section_line;
        l->cur = NULL;
        if (strncmp(section, "rule", 4) == 0 &&
            (section[4] == ' ' || section[4] == '\t') && !start_rule(l, section))
            return 0;
    }
    if (strcmp(section, "policies") == 0)
        return on_policy(l, name, value);
    if (l->cur != NULL)
        return on_rule(l, name, value);
    if (section[0] == '\0')
        return lfail(l, l->line, "'%s' is outside any section ([policies] "
                     "or [rule NAME])", name);
    return lfail(l, l->line, "unknown section [%s] ([policies] or [rule "
                 "NAME])", section);
}

/* Each group's index of its rules' match lines (match.c). */
static bool index_groups(load_t *l)
{
    gen_t *g = l->g;
    rate__match_rule_t *mr = calloc(g->nrule + 1, sizeof *mr);

    g->ix = calloc(g->ngroup + 1, sizeof *g->ix);
    bool ok = mr != NULL && g->ix != NULL;
    for (size_t k = 0; ok && k < g->ngroup; k++) {
        size_t first = g->group_start[k], n = g->group_start[k + 1] - first;
        for (size_t j = 0; j < n; j++) {
            const rule_t *r = &g->rule[g->order[first + j]];
            mr[j] = (rate__match_rule_t){r->alt, r->nalt};
        }
        ok = rate__match_build(&g->ix[k], mr, n);
    }
    free(mr);
    return ok ? true : lfail(l, 1, "out of memory");
}

/* One key keeps one state, so no request may charge two rate policies to
 * one key (each decision would read the state as the other policy's and
 * reset it): a rule applies at most one rate policy (in-flight and
 * unlimited ones keep no rate state), and the rules charging the
 * request's own key are all in one group (only one of a group applies). */
static bool one_policy_a_key(load_t *l)
{
    const gen_t *g = l->g;
    const rule_t *own = NULL; /* the first charging the request's key */

    for (size_t i = 0; i < g->nrule; i++) {
        const rule_t *r = &g->rule[i];
        const rate_policy_t *rate[2] = {NULL, NULL};
        size_t n = 0;
        for (size_t p = 0; p < r->npolicy; p++)
            if (r->inflight[p] == NULL &&
                !rate_policy_is_unlimited(r->policy[p])) {
                if (n < 2)
                    rate[n] = r->policy[p];
                n++;
            }
        if (n > 1)
            return lfail(l, r->policy_line,
                         "[rule %s] charges rate policies '%s' and '%s' to "
                         "one key, whose one state each would reset: write "
                         "their limits as one policy (a = token-bucket "
                         "10/s; fixed-window 1000/h) or give each a rule "
                         "with a key of its own",
                         r->name, rate_policy_name(rate[0]),
                         rate_policy_name(rate[1]));
        if (n == 0 || r->nkey > 0 || r->shared)
            continue;
        if (own == NULL)
            own = r;
        else if (strcmp(own->group, r->group) != 0)
            return lfail(l, r->line,
                         "[rule %s] (group '%s') and [rule %s] (line %u, "
                         "group '%s') both charge a rate policy to the "
                         "request's own key, whose one state a request "
                         "both match would have decided by two policies: "
                         "give one of them a key of its own (key = shared, "
                         "or key = ATTRIBUTE...)",
                         r->name, r->group, own->name, own->line, own->group);
    }
    return true;
}

/* After the whole file: every rule complete, none unreachable, and the
 * rules ordered by group (the groups in the order they first appear, each
 * in file order: a counting sort). */
static bool finish_load(load_t *l)
{
    gen_t *g = l->g;
    size_t first[64]; /* each group's first rule */
    size_t ng = 0, apply = 0;
    size_t *gidx = malloc((g->nrule + 1) * sizeof *gidx); /* rule's group */

    if (gidx == NULL)
        return lfail(l, 1, "out of memory");
    for (size_t i = 0; i < g->nrule; i++) {
        rule_t *r = &g->rule[i];
        bool ok = false;
        if (r->npolicy == 0)
            lfail(l, r->line, "[rule %s] has no 'policy =' line", r->name);
        else if (r->group == NULL &&
                 (r->group = dup_n(DEFAULT_GROUP, strlen(DEFAULT_GROUP))) ==
                     NULL)
            lfail(l, r->line, "out of memory");
        else if (r->slots != 0 && !r->fair)
            lfail(l, r->slots_line, "[rule %s]: slots = N sizes the table of "
                  "a key = fair rule; this rule has none", r->name);
        else
            ok = true;
        for (size_t p = 0; ok && p < r->npolicy && r->fair; p++)
            if (r->inflight[p] != NULL)
                ok = lfail(l, r->policy_line, "[rule %s]: key = fair "
                           "divides a rate, not in-flight policy '%s' "
                           "(give it key = shared for one limit of the "
                           "rule)", r->name, rate_policy_name(r->policy[p]));
        if (!ok) {
            free(gidx);
            return false;
        }
        size_t f = names_find(&l->groups, r->group, strlen(r->group),
                              rule_group_at, g->rule);
        size_t k;
        for (k = 0; f != SIZE_MAX && first[k] != f; k++)
            ;
        if (f == SIZE_MAX) {
            if (ng == sizeof first / sizeof first[0] ||
                !names_add(&l->groups, i, rule_group_at, g->rule)) {
                free(gidx);
                return ng == sizeof first / sizeof first[0]
                           ? lfail(l, r->line, "more than 64 groups")
                           : lfail(l, r->line, "out of memory");
            }
            first[ng] = i;
            k = ng++;
        }
        gidx[i] = k;
    }
    g->ngroup = ng;
    g->order = malloc((g->nrule + 1) * sizeof *g->order);
    g->group_start = calloc(ng + 1, sizeof *g->group_start);
    size_t most[64] = {0};   /* the most policies of a rule, per group */
    size_t every[64];        /* a rule of the group with no match, or none */
    if (g->order == NULL || g->group_start == NULL) {
        free(gidx);
        return lfail(l, 1, "out of memory");
    }
    for (size_t i = 0; i < g->nrule; i++)
        g->group_start[gidx[i] + 1]++;
    for (size_t k = 0; k < ng; k++) {
        g->group_start[k + 1] += g->group_start[k];
        every[k] = SIZE_MAX;
    }
    size_t next[64];
    memcpy(next, g->group_start, ng * sizeof next[0]);
    for (size_t i = 0; i < g->nrule; i++) {
        const rule_t *r = &g->rule[i];
        size_t k = gidx[i];
        if (every[k] != SIZE_MAX) {
            const rule_t *e = &g->rule[every[k]];
            free(gidx);
            return lfail(l, r->line,
                         "[rule %s] can never apply: [rule %s] (line %u) "
                         "above it in group '%s' matches every request",
                         r->name, e->name, e->line, r->group);
        }
        if (r->nalt == 0)
            every[k] = i;
        if (r->npolicy > most[k])
            most[k] = r->npolicy;
        g->order[next[k]++] = i;
    }
    free(gidx);
    for (size_t k = 0; k < ng; k++)
        apply += most[k];
    if (apply > RATE_RULES_MAX_APPLY)
        return lfail(l, g->nrule ? g->rule[g->nrule - 1].line : 1,
                     "the rules can apply %zu policies to one request (the "
                     "most of each group); at most %d",
                     apply, RATE_RULES_MAX_APPLY);
    return one_policy_a_key(l) && index_groups(l);
}

static int load_file(const char *path, gen_t **out, char *err, size_t errlen)
{
    load_t l;

    *out = NULL;
    memset(&l, 0, sizeof l);
    l.path = path;
    if ((l.file = fopen(path, "r")) == NULL)
        return fail(err, errlen, RATE_EINVAL, "%s: cannot read: %s",
                          path, strerror(errno));
    struct stat st; /* a directory opens, then fails every read */
    if (fstat(fileno(l.file), &st) == 0 && S_ISDIR(st.st_mode)) {
        fclose(l.file);
        return fail(err, errlen, RATE_EINVAL, "%s: cannot read: %s", path,
                    strerror(EISDIR));
    }
    if ((l.g = calloc(1, sizeof *l.g)) == NULL) {
        fclose(l.file);
        return RATE_ENOMEM;
    }
    int at = ini_parse_stream(read_line, &l, on_line, &l);
    bool read_error = ferror(l.file) != 0;
    if (at == 0 && l.err[0] == '\0')
        empty_section(&l);
    fclose(l.file);
    if (at > 0 && (l.err[0] == '\0' || (unsigned)at < l.err_line)) {
        l.err[0] = '\0';
        lfail(&l, (unsigned)at,
              "not a [section], a 'name = value' line or a comment");
    } else if (at < 0 && l.err[0] == '\0') {
        lfail(&l, l.line, "out of memory");
    } else if (read_error && l.err[0] == '\0') {
        lfail(&l, l.line + 1, "cannot read: %s",
              l.read_errno != 0 ? strerror(l.read_errno) : "read error");
    }
    /* A file being written in place, or cut short, is not read as a
     * smaller set of rules (that would widen every limit it no longer
     * names): empty, cut inside a line, or without a rule, it is refused
     * whatever else it holds. */
    if (!read_error && !l.refused && l.line == 0) {
        l.err[0] = '\0';
        lfail(&l, 1, "the file is empty (a file being written, or cut "
              "short?): no rules, every request would be unlimited");
    } else if (!read_error && !l.refused && !l.ended) {
        l.err[0] = '\0';
        lfail(&l, l.line, "the file ends inside this line, without its "
              "newline (a file being written, or cut short?)");
    }
    if (l.err[0] == '\0')
        finish_load(&l);
    if (l.err[0] == '\0' && l.g->nrule == 0)
        lfail(&l, l.line, "no [rule NAME] section: every request would be "
              "unlimited (to limit nothing on purpose, write a rule whose "
              "policy is 'unlimited')");
    free(l.policies.slot);
    free(l.rules.slot);
    free(l.groups.slot);
    if (l.err[0] != '\0') {
        gen_free(l.g);
        return fail(err, errlen, RATE_EPOLICY, "%s", l.err);
    }
    *out = l.g;
    return RATE_OK;
}

/* ------------------------------------------------------------ the handle */

int rate_rules_load(const char *path, rate_rules_t **out, char *err,
                    size_t errlen)
{
    gen_t *g;
    int rc;

    if (out != NULL)
        *out = NULL;
    if (path == NULL || out == NULL)
        return fail(err, errlen, RATE_EINVAL, "no rules file (NULL)");
    if ((rc = load_file(path, &g, err, errlen)) != RATE_OK)
        return rc;
    rate_rules_t *r = calloc(1, sizeof *r);
    char *p = dup_n(path, strlen(path));
    if (r == NULL || p == NULL) {
        free(r);
        free(p);
        gen_free(g);
        return RATE_ENOMEM;
    }
    pthread_mutex_init(&r->lock, NULL);
    pthread_mutex_init(&r->reload_lock, NULL);
    r->path = p;
    r->id = atomic_fetch_add(&next_rules_id, 1);
    g->number = 1;
    atomic_init(&r->generation, 1);
    atomic_init(&r->live, 1);
    atomic_init(&r->current, g);
    atomic_init(&r->slots, NULL);
    *out = r;
    return RATE_OK;
}

/* Frees every retired generation no slot points at (the lock held). */
static void reclaim(rate_rules_t *r)
{
    gen_t **link = &r->retired;

    while (*link != NULL) {
        gen_t *g = *link;
        /* The callers' hazard slots first, then the leases: a caller adds
         * its lease (keep_leases) before it clears its slot, so one seen
         * with its slot clear has its lease counted by then.  (The other
         * order could read no lease yet, then a slot just cleared, and
         * free g under a lease: a crash in rules_lease_threads.) */
        bool held = false;
        for (slot_t *s = atomic_load(&r->slots); s != NULL && !held;
             s = s->next)
            held = atomic_load(&s->hp) == g;
        if (!held)
            held = atomic_load(&g->held) > 0; /* leases taken through it */
        if (held) {
            link = &g->next_retired;
        } else {
            *link = g->next_retired;
            gen_free(g);
            atomic_fetch_sub(&r->live, 1);
        }
    }
}

int rate_rules_reload(rate_rules_t *r, const char *path, char *err,
                      size_t errlen)
{
    gen_t *g;
    int rc;

    if (r == NULL)
        return fail(err, errlen, RATE_EINVAL, "no rules (NULL)");
    /* The file is read outside r->lock: a long read never holds up a
     * thread's first decision (slot_find) or a lease's release. */
    pthread_mutex_lock(&r->reload_lock);
    const char *from = path != NULL ? path : r->path;
    char *keep = path != NULL ? dup_n(path, strlen(path)) : NULL;
    if (path != NULL && keep == NULL) {
        pthread_mutex_unlock(&r->reload_lock);
        return RATE_ENOMEM;
    }
    if ((rc = load_file(from, &g, err, errlen)) != RATE_OK) {
        pthread_mutex_unlock(&r->reload_lock);
        free(keep);
        return rc; /* the rules in use stay */
    }
    pthread_mutex_lock(&r->lock);
    atomic_fetch_add(&r->live, 1);
    g->number = atomic_load(&r->generation) + 1;
    gen_t *old = atomic_exchange(&r->current, g);
    atomic_store(&r->generation, g->number);
    old->next_retired = r->retired;
    r->retired = old;
    reclaim(r);
    pthread_mutex_unlock(&r->lock);
    if (keep != NULL) {
        free(r->path);
        r->path = keep;
    }
    pthread_mutex_unlock(&r->reload_lock);
    return RATE_OK;
}

uint64_t rate_rules_generation(const rate_rules_t *r)
{
    return r != NULL ? atomic_load(&((rate_rules_t *)r)->generation) : 0;
}

size_t rate__rules_live(rate_rules_t *r)
{
    return atomic_load(&r->live);
}

void rate_rules_free(rate_rules_t *r)
{
    if (r == NULL)
        return;
    gen_free(atomic_load(&r->current));
    while (r->retired != NULL) {
        gen_t *next = r->retired->next_retired;
        gen_free(r->retired);
        r->retired = next;
    }
    for (slot_t *s = atomic_load(&r->slots); s != NULL;) {
        slot_t *next = s->next;
        free(s);
        s = next;
    }
    pthread_mutex_destroy(&r->lock);
    pthread_mutex_destroy(&r->reload_lock);
    free(r->path);
    free(r);
}

/* The calling thread's slot for r: the cache, else the list, else new. */
static __attribute__((noinline)) slot_t *slot_find(rate_rules_t *r)
{
    pthread_t me = pthread_self();
    slot_t *s;

    for (s = atomic_load_explicit(&r->slots, memory_order_acquire);
         s != NULL && !pthread_equal(s->owner, me); s = s->next)
        ;
    /* A slot of its own cache line: a decision writes its thread's slot
     * twice, and must not bounce a line another thread writes. */
    if (s == NULL && (s = aligned_alloc(64, SLOT_SIZE)) != NULL) {
        memset(s, 0, SLOT_SIZE);
        s->owner = me;
        atomic_init(&s->hp, NULL);
        pthread_mutex_lock(&r->lock);
        s->next = atomic_load_explicit(&r->slots, memory_order_relaxed);
        atomic_store_explicit(&r->slots, s, memory_order_release);
        pthread_mutex_unlock(&r->lock);
    }
    if (s != NULL) {
        memmove(&tls_slots.id[1], &tls_slots.id[0],
                (SLOT_CACHE - 1) * sizeof tls_slots.id[0]);
        memmove(&tls_slots.slot[1], &tls_slots.slot[0],
                (SLOT_CACHE - 1) * sizeof tls_slots.slot[0]);
        tls_slots.id[0] = r->id;
        tls_slots.slot[0] = s;
    }
    return s;
}

static inline slot_t *slot_of(rate_rules_t *r)
{
    for (unsigned i = 0; i < SLOT_CACHE; i++)
        if (tls_slots.id[i] == r->id)
            return tls_slots.slot[i];
    return slot_find(r);
}

/* Holds the current generation: published in the thread's slot, then
 * checked to be still current (else a reload may have missed the slot). */
static gen_t *hold(rate_rules_t *r, slot_t *s)
{
    gen_t *g = atomic_load(&r->current);

    for (;;) {
        atomic_store(&s->hp, g);
        gen_t *again = atomic_load(&r->current);
        if (again == g)
            return g;
        g = again;
    }
}

static void release(slot_t *s)
{
    atomic_store_explicit(&s->hp, NULL, memory_order_release);
}

/* ------------------------------------------------------------ decisions */

/* The store key of a request's own key: the key itself, or, when it
 * begins with '@', one more '@' before it, so that no request's key is a
 * rule's "@RULE..." key (a rule's name never begins with '@'): a client
 * whose key is "@search" must not spend the search route's shared limit.
 * RATE_EKEY when too long. */
static int own_key(const char *key, size_t key_len, char *buf, size_t *len)
{
    size_t at = key[0] == '@';
    if (key_len + at > RATE_KEY_MAX)
        return RATE_EKEY;
    buf[0] = '@';
    memcpy(buf + at, key, key_len);
    *len = key_len + at;
    return RATE_OK;
}

/* The key a rule charges: the request's (own_key), "@RULE" (shared), or
 * "@RULE:V1|V2..." of its key attributes (a missing attribute is empty).
 * RATE_EKEY when too long. */
static int rule_key(const rule_t *r, const char *key, size_t key_len,
                    const rate_attr_t *attrs, size_t n, char *buf,
                    size_t *len)
{
    if (r->nkey == 0 && !r->shared)
        return own_key(key, key_len, buf, len);
    size_t o = 0;
    int w = snprintf(buf, RATE_KEY_MAX + 1, r->shared ? "@%s" : "@%s:",
                     r->name);
    if (w < 0 || (size_t)w > RATE_KEY_MAX)
        return RATE_EKEY;
    o = (size_t)w;
    for (size_t k = 0; k < r->nkey; k++) {
        const char *v;
        size_t vl;
        if (strcmp(r->key_attr[k], "key") == 0) {
            v = key;
            vl = key_len;
        } else {
            v = rate__attr_value(attrs, n, r->key_attr[k]);
            v = v != NULL ? v : "";
            vl = strlen(v);
        }
        if (o + vl + (k > 0) > RATE_KEY_MAX)
            return RATE_EKEY;
        if (k > 0)
            buf[o++] = '|';
        memcpy(buf + o, v, vl);
        o += vl;
    }
    *len = o;
    return RATE_OK;
}

typedef struct pick {
    const rate_policy_t *policy;
    rate_fair_t *fair; /* a fair rule's: decides instead of the limiter */
    rate_inflight_t *in; /* an in-flight policy's: a lease instead */
    const rate_inflight_policy_t *ip;
    rate_lease_t lease;  /* in: the lease held (id 0: none) */
    char key[RATE_KEY_MAX + 1];
    size_t key_len;
} pick_t;

/* A request's leases, held from rate_rules_acquire to rate_rules_release
 * through the generation that granted them (kept until then). */
struct rate_rules_held {
    rate_rules_t *rules;
    gen_t *gen;
    size_t n;
    struct {
        rate_inflight_t *in;
        rate_lease_t lease;
        size_t key_len;
        char key[RATE_KEY_MAX];
    } l[RATE_RULES_MAX_APPLY];
};

/* Gives back what the picks admitted (a later one denied). */
static void refund_admitted(rate_limiter_t *lim, pick_t *pick,
                            rate_outcome_t *out, uint64_t permits,
                            uint64_t now, bool clock_time, size_t upto)
{
    for (size_t i = 0; i < upto; i++) {
        rate_applied_t *a = &out->applied[i];
        if (pick[i].in != NULL) { /* a lease: given back, by its id */
            if (pick[i].lease.id != 0) {
                (void)(clock_time
                           ? rate_inflight_release(pick[i].in, pick[i].key,
                                                   pick[i].key_len,
                                                   &pick[i].lease)
                           : rate_inflight_release_at(pick[i].in, pick[i].key,
                                                      pick[i].key_len,
                                                      &pick[i].lease, now));
                pick[i].lease.id = 0;
                a->refunded = true;
            }
            continue;
        }
        if (!a->decision.allowed || a->decision.shadow || a->unlimited ||
            a->decision.reason == RATE_REASON_STORE_ERROR || permits == 0)
            continue;
        /* A refund that fails leaves the permits charged: the store is
         * failing, and its next decision is the fail mode's anyway. */
        if (clock_time)
            (void)rate_limiter_refund_policy(lim, pick[i].policy, pick[i].key,
                                             pick[i].key_len, permits);
        else
            (void)rate_limiter_refund_policy_at(lim, pick[i].policy,
                                                pick[i].key, pick[i].key_len,
                                                permits, now);
        a->refunded = true;
    }
}

static void fill_applied(rate_applied_t *a, const rate_policy_t *p,
                         uint64_t permits)
{
    const char *name = rate_policy_name(p);
    size_t n = strlen(name); /* at most RATE_POLICY_NAME_MAX */
    memcpy(a->policy_name, name, n + 1);
    a->unlimited = rate_policy_is_unlimited(p);
    a->permits = permits;
    const rate_limit_t *l = rate__http_limit_of(p, &a->decision);
    if (l != NULL)
        a->limit = *l;
}

/* The fair limit of a fair rule's i-th policy on this limiter, made at
 * its first decision on the limiter's clock.  Returns RATE_OK and *out,
 * or why it cannot be made (RATE_ENOMEM; RATE_EKEY for a rule name too
 * long for the shared key "@NAME"). */
static int fair_of(rule_t *r, size_t i, rate_limiter_t *lim,
                   rate_fair_t **out)
{
    uint64_t id = rate_limiter_id(lim);
    fair_cell_t *c = atomic_load(&r->fairs);
    while (c != NULL && c->lim_id != id)
        c = c->next;
    if (c == NULL) {
        pthread_mutex_lock(&fair_lock);
        c = atomic_load(&r->fairs);
        while (c != NULL && c->lim_id != id)
            c = c->next;
        if (c == NULL && (c = calloc(1, sizeof *c)) != NULL) {
            c->lim_id = id;
            char key[RATE_KEY_MAX + 1];
            int n = snprintf(key, sizeof key, "@%s", r->name);
            const rate_clock_t *clk = rate_limiter_clock(lim);
            for (size_t p = 0; p < r->npolicy; p++) {
                rate_fair_config_t fc = {
                    .limiter = lim, .key = key, .key_len = (size_t)n,
                    .policy = r->policy[p], .clock = clk, .slots = r->slots};
                c->rc[p] = rate_fair_new(&fc, &c->fair[p], NULL, 0);
            }
            c->next = atomic_load(&r->fairs);
            atomic_store(&r->fairs, c);
        }
        pthread_mutex_unlock(&fair_lock);
        if (c == NULL)
            return RATE_ENOMEM;
    }
    *out = c->fair[i];
    return c->fair[i] != NULL ? RATE_OK : c->rc[i];
}

/* The inflight object of a rule's i-th policy (an in-flight one) on this
 * limiter's store and clock, made at its first decision there. */
static int lease_of(rule_t *r, size_t i, rate_limiter_t *lim,
                    rate_inflight_t **out)
{
    uint64_t id = rate_limiter_id(lim);
    lease_cell_t *c = atomic_load(&r->leases);
    while (c != NULL && c->lim_id != id)
        c = c->next;
    if (c == NULL) {
        pthread_mutex_lock(&fair_lock);
        c = atomic_load(&r->leases);
        while (c != NULL && c->lim_id != id)
            c = c->next;
        if (c == NULL && (c = calloc(1, sizeof *c)) != NULL) {
            c->lim_id = id;
            for (size_t p = 0; p < r->npolicy; p++) {
                if (r->inflight[p] == NULL)
                    continue;
                rate_inflight_config_t ic = {
                    .policy = r->inflight[p], .store = rate_limiter_store(lim),
                    .clock = rate_limiter_clock(lim)};
                c->rc[p] = rate_inflight_new(&ic, &c->in[p]);
            }
            c->next = atomic_load(&r->leases);
            atomic_store(&r->leases, c);
        }
        pthread_mutex_unlock(&fair_lock);
        if (c == NULL)
            return RATE_ENOMEM;
    }
    *out = c->in[i];
    return c->in[i] != NULL ? RATE_OK : c->rc[i];
}

/* The class of a request: the first matching rule's with a class. */
static rate_lease_class_t class_of(const rule_t *r, const rate_attr_t *attrs,
                                   size_t n)
{
    if (r->cls == CLS_CRITICAL)
        return RATE_LEASE_CRITICAL;
    if (r->cls == CLS_ATTR) {
        const char *v = rate__attr_value(attrs, n, r->cls_attr);
        return v != NULL && strcmp(v, "critical") == 0 ? RATE_LEASE_CRITICAL
                                                       : RATE_LEASE_NORMAL;
    }
    return RATE_LEASE_NORMAL;
}

/* An in-flight pick's decision: a lease, its store failure a fail-closed
 * denial (no lease is held), the rate part named as its component. */
static int decide_lease(pick_t *pk, rate_lease_class_t cls, uint64_t now,
                        bool clock_time, rate_applied_t *a)
{
    int rc = clock_time
                 ? rate_inflight_acquire(pk->in, pk->key, pk->key_len, cls,
                                         &pk->lease, &a->decision)
                 : rate_inflight_acquire_at(pk->in, pk->key, pk->key_len, cls,
                                            now, &pk->lease, &a->decision);
    if (rc != RATE_OK && a->decision.reason == RATE_REASON_STORE_ERROR) {
        a->decision.component = -1;
        rc = RATE_OK;
    }
    if (rc != RATE_OK)
        return rc;
    a->permits = 1;
    if (a->decision.reason == RATE_REASON_STORE_ERROR)
        return RATE_OK;
    if (a->decision.component == 0) {
        a->concurrency = a->decision.limit;
    } else {
        const rate_policy_t *rp = rate_inflight_policy_rate(pk->ip);
        size_t c = (size_t)a->decision.component - 1;
        if (rp != NULL && c < rate_policy_count(rp))
            a->limit = *rate_policy_limit(rp, c);
    }
    return RATE_OK;
}

/* The leases an allowed request holds, kept in a record of their own
 * that keeps the generation (and so their inflight objects) alive. */
static int keep_leases(rate_rules_t *rules, gen_t *g, pick_t *pick, size_t n,
                       rate_rules_held_t **held)
{
    rate_rules_held_t *h = malloc(sizeof *h);
    if (h == NULL)
        return RATE_ENOMEM;
    h->rules = rules;
    h->gen = g;
    h->n = 0;
    for (size_t i = 0; i < n; i++) {
        if (pick[i].in == NULL || pick[i].lease.id == 0)
            continue;
        h->l[h->n].in = pick[i].in;
        h->l[h->n].lease = pick[i].lease;
        h->l[h->n].key_len = pick[i].key_len;
        memcpy(h->l[h->n].key, pick[i].key, pick[i].key_len);
        h->n++;
    }
    if (h->n == 0) { /* shadow or fail-open leases: none to give back */
        free(h);
        return RATE_OK;
    }
    atomic_fetch_add(&g->held, 1); /* g is held by the slot meanwhile */
    *held = h;
    return RATE_OK;
}

static int check(rate_rules_t *rules, rate_limiter_t *lim, const char *key,
                 size_t key_len, const rate_attr_t *attrs, size_t nattrs,
                 uint64_t permits, uint64_t max_wait_ns, uint64_t now_ns,
                 bool clock_time, rate_outcome_t *out,
                 rate_rules_held_t **held)
{
    pick_t pick[RATE_RULES_MAX_APPLY];
    size_t n = 0;
    int rc = RATE_OK;

    if (out == NULL)
        return RATE_EINVAL;
    memset(out, 0, offsetof(rate_outcome_t, applied));
    out->denied_by = -1;
    if (rules == NULL || lim == NULL || (attrs == NULL && nattrs > 0))
        return RATE_EINVAL;
    if (key == NULL || key_len == 0 || key_len > RATE_KEY_MAX)
        return RATE_EKEY;
    slot_t *s = slot_of(rules);
    if (s == NULL)
        return RATE_ENOMEM;
    gen_t *g = hold(rules, s);
    out->generation = g->number;
    uint32_t weight = 0; /* the first matching rule's with a weight */
    int cls = CLS_NONE;  /* the first matching rule's with a class */
    rate_lease_class_t lease_cls = RATE_LEASE_NORMAL;
    bool leases = false;
    for (size_t k = 0; k < g->ngroup && rc == RATE_OK; k++) {
        /* the group's first rule that matches (match.c) */
        size_t j = rate__match_first(&g->ix[k], attrs, nattrs);
        if (j == SIZE_MAX)
            continue;
        rule_t *r = &g->rule[g->order[g->group_start[k] + j]];
        if (weight == 0)
            weight = r->weight;
        if (cls == CLS_NONE && r->cls != CLS_NONE) {
            cls = r->cls;
            lease_cls = class_of(r, attrs, nattrs);
        }
        for (size_t i = 0; i < r->npolicy && rc == RATE_OK; i++) {
            pick[n].policy = r->policy[i];
            pick[n].fair = NULL;
            pick[n].in = NULL;
            pick[n].ip = r->inflight[i];
            pick[n].lease.id = 0;
            if (r->inflight[i] != NULL) {
                leases = true;
                rc = held == NULL ? RATE_EPOLICY
                                  : lease_of(r, i, lim, &pick[n].in);
            } else if (r->fair && !rate_policy_is_unlimited(r->policy[i]))
                rc = fair_of(r, i, lim, &pick[n].fair);
            if (rc == RATE_OK)
                rc = rule_key(r, key, key_len, attrs, nattrs,
                              pick[n].key, &pick[n].key_len);
            if (rc == RATE_OK && pick[n].in != NULL &&
                pick[n].key_len > RATE_LEASE_KEY_MAX)
                rc = RATE_EKEY;
            n++;
        }
    }
    if (rc == RATE_OK && n == 0) { /* no rule: the limiter's default */
        pick[0].policy = rate_limiter_policy(lim);
        pick[0].fair = NULL;
        pick[0].in = NULL;
        pick[0].ip = NULL;
        pick[0].lease.id = 0;
        rc = own_key(key, key_len, pick[0].key, &pick[0].key_len);
        n = 1;
    }
    if (rc != RATE_OK)
        n = 0; /* nothing was decided */
    uint64_t now = now_ns; /* with clock_time, each call reads the clock */
    size_t done = 0;
    for (; rc == RATE_OK && done < n; done++) {
        rate_applied_t *a = &out->applied[done];
        memset(a, 0, sizeof *a);
        if (pick[done].in != NULL) {
            rc = decide_lease(&pick[done], lease_cls, now, clock_time, a);
            if (rc != RATE_OK)
                break;
            uint64_t one = a->permits;
            fill_applied(a, pick[done].policy, one);
            a->unlimited = false; /* its name's carrier is unlimited */
            if (!a->decision.allowed && out->denied_by < 0)
                out->denied_by = (int)done;
            continue;
        }
        if (pick[done].fair != NULL) /* the request's own key is its flow */
            rc = clock_time
                     ? rate_fair_check(pick[done].fair, key, key_len,
                                       weight, permits, &a->decision)
                     : rate_fair_check_at(pick[done].fair, key, key_len,
                                          weight, permits, now,
                                          &a->decision);
        else if (clock_time)
            rc = rate_limiter_check_policy(lim, pick[done].policy,
                                           pick[done].key, pick[done].key_len,
                                           permits, max_wait_ns,
                                           &a->decision);
        else
            rc = rate_limiter_check_policy_at(lim, pick[done].policy,
                                              pick[done].key,
                                              pick[done].key_len, permits,
                                              max_wait_ns, now, &a->decision);
        if (rc != RATE_OK)
            break;
        fill_applied(a, pick[done].policy, permits);
        if (!a->decision.allowed && out->denied_by < 0)
            out->denied_by = (int)done;
        if (a->decision.delay_ns > out->delay_ns)
            out->delay_ns = a->decision.delay_ns;
    }
    if (rc != RATE_OK) { /* bad permits or time: undo what was admitted */
        refund_admitted(lim, pick, out, permits, now, clock_time, done);
        memset(out, 0, offsetof(rate_outcome_t, applied));
        out->denied_by = -1;
    } else {
        out->count = n;
        out->allowed = out->denied_by < 0;
        if (!out->allowed) {
            out->delay_ns = 0;
            refund_admitted(lim, pick, out, permits, now, clock_time, n);
        } else if (leases) {
            rc = keep_leases(rules, g, pick, n, held);
            if (rc != RATE_OK) { /* no room for the record: hold nothing */
                refund_admitted(lim, pick, out, permits, now, clock_time, n);
                memset(out, 0, offsetof(rate_outcome_t, applied));
                out->denied_by = -1;
            }
        }
    }
    release(s);
    return rc;
}

int rate_rules_release(rate_rules_held_t *h)
{
    int first = RATE_OK;

    if (h == NULL)
        return RATE_OK;
    for (size_t i = 0; i < h->n; i++) {
        int rc = rate_inflight_release(h->l[i].in, h->l[i].key,
                                       h->l[i].key_len, &h->l[i].lease);
        if (rc != RATE_OK && first == RATE_OK)
            first = rc;
    }
    rate_rules_t *r = h->rules;
    gen_t *g = h->gen;
    free(h);
    /* The last lease of a retired generation: it may go now.  Only the
     * pointer is compared after the count drops: g may be freed by a
     * reload's reclaim from then on. */
    if (atomic_fetch_sub(&g->held, 1) == 1 && atomic_load(&r->current) != g) {
        pthread_mutex_lock(&r->lock);
        reclaim(r);
        pthread_mutex_unlock(&r->lock);
    }
    return first;
}

int rate_rules_acquire(rate_rules_t *rules, rate_limiter_t *lim,
                       const char *key, size_t key_len,
                       const rate_attr_t *attrs, size_t nattrs,
                       uint64_t permits, uint64_t max_wait_ns,
                       rate_outcome_t *out, rate_rules_held_t **held)
{
    if (held == NULL) {
        if (out != NULL) {
            memset(out, 0, offsetof(rate_outcome_t, applied));
            out->denied_by = -1;
        }
        return RATE_EINVAL;
    }
    *held = NULL;
    uint64_t scope = rate_deadline_begin();
    int rc = check(rules, lim, key, key_len, attrs, nattrs, permits,
                   max_wait_ns, 0, true, out, held);
    rate_deadline_end(scope);
    return rc;
}

int rate_rules_check(rate_rules_t *rules, rate_limiter_t *lim,
                     const char *key, size_t key_len, const rate_attr_t *attrs,
                     size_t nattrs, uint64_t permits, uint64_t max_wait_ns,
                     rate_outcome_t *out)
{
    /* One deadline for the request's decisions and refunds. */
    uint64_t scope = rate_deadline_begin();
    int rc = check(rules, lim, key, key_len, attrs, nattrs, permits,
                   max_wait_ns, 0, true, out, NULL);
    rate_deadline_end(scope);
    return rc;
}

int rate_rules_check_at(rate_rules_t *rules, rate_limiter_t *lim,
                        const char *key, size_t key_len,
                        const rate_attr_t *attrs, size_t nattrs,
                        uint64_t permits, uint64_t max_wait_ns,
                        uint64_t now_ns, rate_outcome_t *out)
{
    if (now_ns > RATE_TIME_MAX) {
        if (out != NULL) {
            memset(out, 0, offsetof(rate_outcome_t, applied));
            out->denied_by = -1;
        }
        return out == NULL ? RATE_EINVAL : RATE_ERANGE;
    }
    uint64_t scope = rate_deadline_begin();
    int rc = check(rules, lim, key, key_len, attrs, nattrs, permits,
                   max_wait_ns, now_ns, false, out, NULL);
    rate_deadline_end(scope);
    return rc;
}

int rate_outcome_headers(const rate_outcome_t *o, rate_headers_t *out)
{
    rate__hitem_t items[RATE_RULES_MAX_APPLY];

    if (o == NULL || out == NULL || o->count > RATE_RULES_MAX_APPLY) {
        if (out != NULL)
            memset(out, 0, sizeof *out);
        return RATE_EINVAL;
    }
    for (size_t i = 0; i < o->count; i++) {
        const rate_applied_t *a = &o->applied[i];
        /* a name filled by hand must end within its array */
        if (memchr(a->policy_name, '\0', sizeof a->policy_name) == NULL) {
            memset(out, 0, sizeof *out);
            return RATE_EINVAL;
        }
        items[i] = (rate__hitem_t){
            a->policy_name, a->unlimited,
            a->unlimited || a->concurrency > 0 ? NULL : &a->limit,
            &a->decision, a->refunded ? a->permits : 0, a->concurrency};
    }
    return rate__headers_items(items, o->count, out);
}
