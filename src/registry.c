/* SPDX-License-Identifier: MIT */
/*
 * The policies a limiter knows, and the records that give each policy its
 * id in a store.
 *
 * A state is tagged with the policy it was made under, so that whoever
 * reads it next -- this limiter under another policy, another limiter,
 * another process or host -- can carry it over (docs/algorithms.md,
 * "Policy changes").  The tag is an id the store itself allots: the first
 * limiter to write under a policy records the policy's canonical text in
 * the store (RATE_SPACE_POLICY, key the id, 4 bytes little-endian), trying
 * the policy's fingerprint first and the next ids after it while they hold
 * another policy's text.  Records are written only where absent (a
 * compare-and-set on "absent", or the store's update), and never change,
 * so two policies never share an id, whatever their fingerprints, and a
 * state's tag names its policy for every reader of the store.
 *
 * Known policies are kept in an append-only list (step.h): readers
 * take no lock, so the step may read it under a store's lock; adding takes
 * the book's mutex, and never happens under a store's lock (the step asks
 * for a policy by returning RATE__NEED_POLICY instead).
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "registry.h"

#define ID_PROBES 64u /* ids tried after the fingerprint before giving up */
#define TEXT_MAX 1024u

const rate_policy_t *rate__known_find(const rate__registry_t *r,
                                      uint8_t format, uint32_t tag)
{
    size_t n = atomic_load_explicit(&r->count, memory_order_acquire);
    const rate_policy_t *unknown = NULL;

    for (size_t i = 0; i < n; i++) {
        const rate__known_t *k = rate__known_at(r, i);
        if (format == RATE__FORMAT) {
            if (!k->legacy && k->id == tag)
                return &k->policy;
        } else if (k->policy.fingerprint == tag) {
            if (k->policy.count > 0)
                return &k->policy;
            unknown = &k->policy;
        }
    }
    return unknown;
}

static bool same_policy(const rate_policy_t *a, const rate_policy_t *b)
{
    return a->fingerprint == b->fingerprint && a->count == b->count &&
           memcmp(a->limits, b->limits, a->count * sizeof a->limits[0]) == 0;
}

/* The registered entry of p, or NULL. */
static const rate__known_t *find_policy(const rate__registry_t *r,
                                        const rate_policy_t *p)
{
    size_t n = atomic_load_explicit(&r->count, memory_order_acquire);

    for (size_t i = 0; i < n; i++) {
        const rate__known_t *k = rate__known_at(r, i);
        if (!k->legacy && k->id != 0 && same_policy(&k->policy, p))
            return k;
    }
    return NULL;
}

/* Appends an entry (the book's lock held). */
static int add_known(rate__registry_t *r, const rate_policy_t *p, uint32_t id,
                     bool legacy, uint64_t recheck_at)
{
    size_t n = atomic_load_explicit(&r->count, memory_order_relaxed);
    size_t c = n / RATE__KNOWN_CHUNK;
    rate__known_t *chunk;

    if (c >= RATE__KNOWN_CHUNKS)
        return RATE_ENOMEM;
    chunk = atomic_load_explicit(&r->chunk[c], memory_order_relaxed);
    if (chunk == NULL) {
        chunk = calloc(RATE__KNOWN_CHUNK, sizeof *chunk);
        if (chunk == NULL)
            return RATE_ENOMEM;
        atomic_store_explicit(&r->chunk[c], chunk, memory_order_release);
    }
    rate__known_t *k = &chunk[n % RATE__KNOWN_CHUNK];
    memcpy(&k->policy, p, sizeof *p);
    k->id = id;
    k->legacy = legacy;
    atomic_init(&k->recheck_at, recheck_at);
    atomic_store_explicit(&r->count, n + 1, memory_order_release);
    return RATE_OK;
}

int rate__book_init(rate__book_t *b, rate_store_t *store, unsigned retries)
{
    memset(b, 0, sizeof *b);
    b->store = store;
    b->max_retries = retries;
    atomic_init(&b->known.count, 0);
    for (size_t i = 0; i < RATE__KNOWN_CHUNKS; i++)
        atomic_init(&b->known.chunk[i], NULL);
    return pthread_mutex_init(&b->lock, NULL) == 0 ? RATE_OK : RATE_ENOMEM;
}

void rate__book_free(rate__book_t *b)
{
    for (size_t i = 0; i < RATE__KNOWN_CHUNKS; i++)
        free(atomic_load_explicit(&b->known.chunk[i], memory_order_relaxed));
    pthread_mutex_destroy(&b->lock);
}

/* ------------------------------------------------------------- records */

static rate_key_t record_key(uint32_t id, char buf[4])
{
    rate__put32((uint8_t *)buf, id);
    return (rate_key_t){buf, 4, RATE_SPACE_POLICY};
}

/* The step over a record: writes the text where there is none, and tells
 * what it found. */
enum { REC_WROTE, REC_SAME, REC_OTHER };
typedef struct rec_arg {
    const char *text;
    size_t len;
    int found;
} rec_arg_t;

static int rec_step(void *varg, rate_step_io_t *io)
{
    rec_arg_t *a = varg;

    io->write = false;
    io->new_len = 0;
    if (io->old_state == NULL) {
        memcpy(io->new_state, a->text, a->len);
        io->new_len = a->len;
        io->write = true;
        io->ttl_ns = RATE_TTL_FOREVER;
        a->found = REC_WROTE;
    } else {
        a->found = io->old_len == a->len &&
                           memcmp(io->old_state, a->text, a->len) == 0
                       ? REC_SAME
                       : REC_OTHER;
    }
    return RATE_OK;
}

/* Adds p with its id, once, whoever found it first; its record checked
 * again from now + RATE__RECHECK_NS. */
static int book_add(rate__book_t *b, const rate_policy_t *p, uint32_t id,
                    uint64_t now)
{
    int rc = RATE_OK;

    pthread_mutex_lock(&b->lock);
    if (find_policy(&b->known, p) == NULL)
        rc = add_known(&b->known, p, id, false, rate__recheck_next(now));
    pthread_mutex_unlock(&b->lock);
    return rc;
}

/* The first id to try for p's record, and the next after `try`. */
static uint32_t first_id(const rate_policy_t *p)
{
    return p->fingerprint != 0 ? p->fingerprint : 1;
}

static uint32_t next_id(uint32_t try)
{
    return try == UINT32_MAX ? 1 : try + 1;
}

/* Finds or makes p's record in the store: its id in *id. */
static int register_policy(rate__book_t *b, const rate_policy_t *p,
                           uint32_t *id)
{
    char text[TEXT_MAX], kb[4];
    size_t len = rate__policy_format_limits(p, text, sizeof text);
    uint32_t try = first_id(p);

    if (len >= sizeof text)
        return RATE_EPOLICY;
    for (unsigned i = 0; i < ID_PROBES; i++) {
        rec_arg_t arg = {text, len, REC_OTHER};
        rate_step_t st = {rec_step, &arg, len, 0, 0, NULL};
        rate_key_t k = record_key(try, kb);
        int rc = rate__store_step(b->store, &k, &st, b->max_retries, NULL);
        if (rc != RATE_OK)
            return rc;
        if (arg.found != REC_OTHER) {
            *id = try;
            return RATE_OK;
        }
        try = next_id(try);
    }
    return RATE_ECONFLICT;
}

/* Whether k's record is due to be checked again at `now`: claimed by this
 * caller. */
static bool recheck_due(const rate__known_t *k, uint64_t now)
{
    rate__known_t *w = (rate__known_t *)k; /* its one mutable field */
    return rate__recheck_claim(&w->recheck_at, now);
}

int rate__book_rewrite(rate__book_t *b, const rate_policy_t *p)
{
    uint32_t id;
    return register_policy(b, p, &id);
}

bool rate__book_known_id(rate__book_t *b, const rate_policy_t *p,
                         uint32_t *id, uint64_t now)
{
    const rate__known_t *k = find_policy(&b->known, p);

    if (k == NULL)
        return false;
    *id = k->id;
    return !recheck_due(k, now);
}

int rate__book_id(rate__book_t *b, const rate_policy_t *p, uint32_t *id,
                  uint64_t now)
{
    const rate__known_t *k = find_policy(&b->known, p);
    int rc;

    if (k != NULL) {
        *id = k->id;
        /* Due: the record written again where the store lost it (found
         * as it is otherwise); a store that fails now fails the decision
         * anyway, and the next check is due later. */
        if (recheck_due(k, now))
            (void)rate__book_rewrite(b, p);
        return RATE_OK;
    }
    /* The store's I/O is made outside the lock; a race registers the same
     * record twice, which finds it the second time. */
    if ((rc = register_policy(b, p, id)) != RATE_OK)
        return rc;
    return book_add(b, p, *id, now);
}

typedef struct copy_arg {
    char *buf;
    size_t cap, len;
} copy_arg_t;

static int copy_step(void *varg, rate_step_io_t *io)
{
    copy_arg_t *a = varg;

    io->write = false;
    io->new_len = 0;
    if (io->old_len > a->cap)
        return RATE_ECORRUPT;
    if (io->old_len > 0)
        memcpy(a->buf, io->old_state, io->old_len);
    a->len = io->old_len;
    return RATE_OK;
}

/* The policy of a record's text (len bytes of text, which has room for
 * one more): RATE_OK with *out, RATE_ECORRUPT when there is no record
 * (len 0) or it does not parse (a state whose policy is lost cannot be
 * read). */
static int parse_record(char *text, size_t len, rate_policy_t **out)
{
    *out = NULL;
    if (len == 0)
        return RATE_ECORRUPT;
    text[len] = '\0';
    return rate_policy_parse(text, out, NULL, 0) == RATE_OK ? RATE_OK
                                                            : RATE_ECORRUPT;
}

/* The policy of record id: as parse_record, or the store's error. */
static int fetch_policy(rate__book_t *b, uint32_t id, rate_policy_t **out)
{
    char text[TEXT_MAX + 1], kb[4];
    rate_key_t k = record_key(id, kb);
    size_t len = 0;
    uint64_t version = 0;
    int rc;

    *out = NULL;
    if (b->store->m->load != NULL) {
        rc = b->store->m->load(b->store->self, &k, text, TEXT_MAX, &len,
                               &version);
        if (rc == RATE_EINVAL && len > TEXT_MAX)
            return RATE_ECORRUPT;
    } else { /* an update-only store: a step that copies the record out */
        copy_arg_t arg = {text, TEXT_MAX, 0};
        rate_step_t st = {copy_step, &arg, 0, 0, 0, NULL};
        rc = b->store->m->update(b->store->self, &k, &st);
        len = arg.len;
    }
    if (rc != RATE_OK)
        return rc;
    return parse_record(text, len, out);
}

/* The record a state's (format, tag) is read by. */
static uint32_t learn_id(uint8_t format, uint32_t tag)
{
    return format == RATE__FORMAT_V1 && tag == 0 ? 1 : tag;
}

/* What learning (format, tag) makes known, given the fetch of its record
 * (rc, and p when RATE_OK, which this frees). */
static int learn_with(rate__book_t *b, uint8_t format, uint32_t tag, int rc,
                      rate_policy_t *p)
{
    rate_policy_t unknown;
    uint32_t id = tag;

    if (format == RATE__FORMAT_V1) {
        /* A first-edition state: tagged by its policy's fingerprint.  The
         * record at that id names it if its policy has that fingerprint;
         * else no reader here knows the policy, and the state reads as the
         * first edition read it: as a cold key. */
        if (rc != RATE_OK && rc != RATE_ECORRUPT)
            return rc;
        if (p != NULL && p->fingerprint != tag) {
            rate_policy_free(p);
            p = NULL;
        }
        if (p == NULL) {
            memset(&unknown, 0, sizeof unknown);
            unknown.fingerprint = tag;
        }
        rc = RATE_OK; /* no record (0.1 writes none) is an answer too */
    } else if (rc != RATE_OK) {
        return rc;
    } else if (p == NULL) {
        return RATE_ECORRUPT;
    }
    /* Added once, whoever learnt it first (another thread may have): a
     * real policy also where only the unknown marker of its fingerprint
     * is. */
    pthread_mutex_lock(&b->lock);
    const rate_policy_t *k = rate__known_find(&b->known, format, tag);
    if (k == NULL || (p != NULL && k->count == 0))
        rc = add_known(&b->known, p != NULL ? p : &unknown, id,
                       format == RATE__FORMAT_V1 && p == NULL, 0);
    pthread_mutex_unlock(&b->lock);
    rate_policy_free(p);
    return rc;
}

int rate__book_learn(rate__book_t *b, uint8_t format, uint32_t tag)
{
    rate_policy_t *p = NULL;
    int rc = fetch_policy(b, learn_id(format, tag), &p);

    return learn_with(b, format, tag, rc, p);
}

/* ------------------------------------------ through an asynchronous store */

/* One record operation in flight through the store's start(): a
 * registration (a record step per id tried) or a learning (a step that
 * copies the record out).  Callers that ask for the same one while it is
 * in flight wait on it (its waiters) instead of starting another: a burst
 * of first decisions writes one record. */
typedef struct waiter {
    void (*done)(void *ud, int rc);
    void *ud;
    struct waiter *next;
} waiter_t;

struct rate__book_op {
    rate_job_t job; /* first: the store's done() hands it back */
    rate__book_t *book;
    rate__book_op_t *next; /* the book's ops in flight */
    const rate_policy_t *policy; /* registering it; NULL: learning */
    uint64_t now;                /* the limiter's time of the registration */
    uint8_t format;
    uint32_t tag, try;
    unsigned probes;
    char kb[4];
    char text[TEXT_MAX + 1];
    size_t len;
    rec_arg_t rec;
    copy_arg_t copy;
    rate_step_t st;
    waiter_t *waiters; /* the first caller's last */
};

static void op_done(rate_job_t *job, int rc);

/* Starts the op's next record step: RATE_OK, or the store's refusal. */
static int op_send(rate__book_op_t *op)
{
    uint32_t id = op->policy != NULL ? op->try : learn_id(op->format, op->tag);

    if (op->policy != NULL) {
        op->rec = (rec_arg_t){op->text, op->len, REC_OTHER};
        op->st = (rate_step_t){rec_step, &op->rec, op->len, 0, 0, NULL};
    } else {
        op->copy = (copy_arg_t){op->text, TEXT_MAX, 0};
        op->st = (rate_step_t){copy_step, &op->copy, 0, 0, 0, NULL};
    }
    op->job = (rate_job_t){record_key(id, op->kb), &op->st, NULL, NULL,
                           op_done, op, NULL, false};
    return op->book->store->m->start(op->book->store->self, &op->job);
}

/* The op leaves the book's list; its waiters are called with rc (but the
 * first caller's, who is told by its return, when `first` is false). */
static void op_end(rate__book_op_t *op, int rc, bool first)
{
    rate__book_t *b = op->book;

    pthread_mutex_lock(&b->lock);
    rate__book_op_t **pp = &b->ops;
    while (*pp != op)
        pp = &(*pp)->next;
    *pp = op->next;
    waiter_t *w = op->waiters;
    pthread_mutex_unlock(&b->lock);
    free(op);
    while (w != NULL) {
        waiter_t *next = w->next;
        if (next != NULL || first)
            w->done(w->ud, rc);
        free(w);
        w = next;
    }
}

static void op_done(rate_job_t *job, int rc)
{
    rate__book_op_t *op = (rate__book_op_t *)job;
    rate__book_t *b = op->book;

    if (op->policy == NULL) { /* learnt: its text is in op->text */
        rate_policy_t *p = NULL;
        if (rc == RATE_OK)
            rc = parse_record(op->text, op->copy.len, &p);
        op_end(op, learn_with(b, op->format, op->tag, rc, p), true);
        return;
    }
    if (rc == RATE_OK && op->rec.found != REC_OTHER) {
        op_end(op, book_add(b, op->policy, op->try, op->now), true);
        return;
    }
    if (rc == RATE_OK && ++op->probes < ID_PROBES) {
        op->try = next_id(op->try);
        if ((rc = op_send(op)) == RATE_OK)
            return;
    } else if (rc == RATE_OK) {
        rc = RATE_ECONFLICT;
    }
    op_end(op, rc, true);
}

/* Waits on the book's op for the same record, or starts one: RATE_OK (done
 * will be called), or the error at once. */
static int op_join(rate__book_t *b, const rate_policy_t *p, uint64_t now,
                   uint8_t format, uint32_t tag, void (*done)(void *, int),
                   void *ud)
{
    waiter_t *w = calloc(1, sizeof *w);
    if (w == NULL)
        return RATE_ENOMEM;
    w->done = done;
    w->ud = ud;
    pthread_mutex_lock(&b->lock);
    rate__book_op_t *op = b->ops;
    while (op != NULL &&
           (p != NULL ? op->policy == NULL || !same_policy(op->policy, p)
                      : op->policy != NULL || op->format != format ||
                            op->tag != tag))
        op = op->next;
    if (op != NULL) {
        w->next = op->waiters;
        op->waiters = w;
        pthread_mutex_unlock(&b->lock);
        return RATE_OK;
    }
    if ((op = calloc(1, sizeof *op)) == NULL) {
        pthread_mutex_unlock(&b->lock);
        free(w);
        return RATE_ENOMEM;
    }
    op->book = b;
    op->policy = p;
    op->now = now;
    op->format = format;
    op->tag = tag;
    if (p != NULL) {
        op->len = rate__policy_format_limits(p, op->text, TEXT_MAX);
        op->try = first_id(p);
    }
    if (p != NULL && op->len >= TEXT_MAX) {
        pthread_mutex_unlock(&b->lock);
        free(op);
        free(w);
        return RATE_EPOLICY;
    }
    op->waiters = w;
    op->next = b->ops;
    b->ops = op;
    pthread_mutex_unlock(&b->lock);
    int rc = op_send(op);
    if (rc != RATE_OK)
        op_end(op, rc, false); /* others who joined meanwhile hear it */
    return rc;
}

int rate__book_id_start(rate__book_t *b, const rate_policy_t *p,
                        uint64_t now, void (*done)(void *ud, int rc),
                        void *ud)
{
    return op_join(b, p, now, 0, 0, done, ud);
}

int rate__book_learn_start(rate__book_t *b, uint8_t format, uint32_t tag,
                           void (*done)(void *ud, int rc), void *ud)
{
    return op_join(b, NULL, 0, format, tag, done, ud);
}
