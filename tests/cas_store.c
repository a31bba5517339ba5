/* SPDX-License-Identifier: MIT */
/*
 * See cas_store.h.  A mutex and a growing array: simple on purpose.
 */
#include "lib/cas_store.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef struct entry {
    char *key;
    size_t key_len;
    rate_space_t space;
    unsigned char *val;
    size_t len;
    uint64_t version;
    uint64_t ttl_ns;
} entry_t;

struct cas_store {
    pthread_mutex_t lock;
    rate_job_t **jobs; /* queued by start() */
    int declines;      /* decide() declines (the declining variant) */
    unsigned asked[3]; /* the recording variant's requests, by op */
    size_t njobs, jobs_cap;
    entry_t *e;
    size_t n, cap;
    uint64_t next_version;
    unsigned conflicts;
    int down;
};

static entry_t *find(cas_store_t *s, const rate_key_t *k)
{
    for (size_t i = 0; i < s->n; i++)
        if (s->e[i].space == k->space && s->e[i].key_len == k->len &&
            memcmp(s->e[i].key, k->bytes, k->len) == 0)
            return &s->e[i];
    return NULL;
}

static int cs_load(void *self, const rate_key_t *key, void *buf, size_t cap,
                   size_t *len, uint64_t *version)
{
    cas_store_t *s = self;
    int rc = RATE_OK;

    pthread_mutex_lock(&s->lock);
    entry_t *e = find(s, key);
    *len = 0;
    *version = 0;
    if (s->down)
        rc = RATE_ESTORE;
    else if (e != NULL) {
        *len = e->len;
        if (e->len > cap)
            rc = RATE_EINVAL;
        else {
            memcpy(buf, e->val, e->len);
            *version = e->version;
        }
    }
    pthread_mutex_unlock(&s->lock);
    return rc;
}

static int cs_cas(void *self, const rate_key_t *key, uint64_t version,
                  const void *state, size_t len, uint64_t ttl_ns)
{
    cas_store_t *s = self;
    int rc = RATE_OK;

    pthread_mutex_lock(&s->lock);
    entry_t *e = find(s, key);
    if (s->down) {
        rc = RATE_ESTORE;
    } else if (s->conflicts > 0) {
        s->conflicts--;
        rc = RATE_ECONFLICT;
    } else if ((e == NULL && version != 0) ||
               (e != NULL && e->version != version)) {
        rc = RATE_ECONFLICT;
    } else {
        if (e == NULL) {
            if (s->n == s->cap) {
                size_t cap = s->cap ? s->cap * 2 : 16;
                entry_t *ne = realloc(s->e, cap * sizeof *ne);
                if (ne == NULL) {
                    pthread_mutex_unlock(&s->lock);
                    return RATE_ENOMEM;
                }
                s->e = ne;
                s->cap = cap;
            }
            e = &s->e[s->n++];
            memset(e, 0, sizeof *e);
            e->key = malloc(key->len);
            memcpy(e->key, key->bytes, key->len);
            e->key_len = key->len;
            e->space = key->space;
        }
        unsigned char *v = realloc(e->val, len ? len : 1);
        memcpy(v, state, len);
        e->val = v;
        e->len = len;
        e->version = ++s->next_version;
        e->ttl_ns = ttl_ns;
    }
    pthread_mutex_unlock(&s->lock);
    return rc;
}

static int cs_remove(void *self, const rate_key_t *key)
{
    cas_store_t *s = self;
    int rc = RATE_OK;

    pthread_mutex_lock(&s->lock);
    entry_t *e = find(s, key);
    if (s->down) {
        rc = RATE_ESTORE;
    } else if (e != NULL) {
        free(e->key);
        free(e->val);
        *e = s->e[--s->n];
    }
    pthread_mutex_unlock(&s->lock);
    return rc;
}

static int cs_stats(void *self, rate_stats_t *out)
{
    cas_store_t *s = self;

    pthread_mutex_lock(&s->lock);
    for (size_t i = 0; i < s->n; i++)
        out->keys += s->e[i].space != RATE_SPACE_POLICY;
    pthread_mutex_unlock(&s->lock);
    return RATE_OK;
}

static void cs_destroy(void *self)
{
    cas_store_t *s = self;

    for (size_t i = 0; i < s->n; i++) {
        free(s->e[i].key);
        free(s->e[i].val);
    }
    free(s->e);
    free(s->jobs);
    pthread_mutex_destroy(&s->lock);
    free(s);
}

/* start(): the job is queued; cas_store_run_jobs runs its step through
 * load and cas, as the limiter would, and calls done(). */
static int cs_start(void *self, rate_job_t *job)
{
    cas_store_t *s = self;
    int rc = RATE_OK;

    pthread_mutex_lock(&s->lock);
    if (s->njobs == s->jobs_cap) {
        size_t cap = s->jobs_cap ? s->jobs_cap * 2 : 16;
        rate_job_t **j = realloc(s->jobs, cap * sizeof *j);
        if (j == NULL)
            rc = RATE_ENOMEM;
        else {
            s->jobs = j;
            s->jobs_cap = cap;
        }
    }
    if (rc == RATE_OK) {
        s->jobs[s->njobs++] = job;
        if (job->req != NULL && (unsigned)job->req->op < 3)
            s->asked[job->req->op]++;
    }
    pthread_mutex_unlock(&s->lock);
    return rc;
}

/* One job's step, retried on a conflict as the limiter's loop does. */
static int run_job(cas_store_t *s, rate_job_t *job)
{
    unsigned char old[4096], neu[4096];
    for (int attempt = 0; attempt < 64; attempt++) {
        rate_step_io_t io;
        size_t len = 0;
        uint64_t version = 0;
        memset(&io, 0, sizeof io);
        int rc = cs_load(s, &job->key, old, sizeof old, &len, &version);
        if (rc != RATE_OK)
            return rc;
        io.old_state = len ? old : NULL;
        io.old_len = len;
        io.new_state = neu;
        io.new_cap = len + job->step->grow;
        if (io.new_cap > sizeof neu)
            return RATE_ENOMEM;
        if ((rc = job->step->fn(job->step->arg, &io)) != RATE_OK)
            return rc;
        if (!io.write)
            return RATE_OK;
        rc = cs_cas(s, &job->key, version, neu, io.new_len, io.ttl_ns);
        if (rc != RATE_ECONFLICT)
            return rc;
    }
    return RATE_ECONFLICT;
}

size_t cas_store_run_jobs(cas_store_t *s)
{
    size_t done = 0;

    for (;;) {
        pthread_mutex_lock(&s->lock);
        rate_job_t *job = NULL;
        if (s->njobs > 0) {
            job = s->jobs[0];
            memmove(s->jobs, s->jobs + 1, (s->njobs - 1) * sizeof *s->jobs);
            s->njobs--;
        }
        pthread_mutex_unlock(&s->lock);
        if (job == NULL)
            return done;
        /* A whole decision asked of a store whose decide() declines
         * everything: declined, as decide() would be. */
        int rc = job->req != NULL && s->declines ? RATE_ENOTSUP
                                                 : run_job(s, job);
        job->done(job, rc); /* may queue it again */
        done++;
    }
}

static int cs_decide_declines(void *self, const rate_key_t *key,
                              const rate_decide_req_t *req,
                              rate_decision_t *out)
{
    (void)self;
    (void)key;
    (void)req;
    (void)out;
    return RATE_ENOTSUP;
}

static const rate_store_methods_t cas_methods = {
    .version = RATE_STORE_VERSION,
    .name = "test-cas",
    .load = cs_load,
    .cas = cs_cas,
    .remove = cs_remove,
    .stats = cs_stats,
    .destroy = cs_destroy,
};

static const rate_store_methods_t cas_async_methods = {
    .version = RATE_STORE_VERSION,
    .name = "test-cas-async",
    .load = cs_load,
    .cas = cs_cas,
    .remove = cs_remove,
    .start = cs_start,
    .stats = cs_stats,
    .destroy = cs_destroy,
};

static int make(const rate_store_methods_t *m, rate_store_t **out,
                cas_store_t **handle)
{
    cas_store_t *s = calloc(1, sizeof *s);

    if (s == NULL)
        return RATE_ENOMEM;
    pthread_mutex_init(&s->lock, NULL);
    int rc = rate_store_new(m, s, out);
    if (rc != RATE_OK) {
        cs_destroy(s);
        return rc;
    }
    if (handle != NULL)
        *handle = s;
    return RATE_OK;
}

int cas_store_new(rate_store_t **out, cas_store_t **handle)
{
    return make(&cas_methods, out, handle);
}

int cas_store_new_async(rate_store_t **out, cas_store_t **handle)
{
    return make(&cas_async_methods, out, handle);
}

static const rate_store_methods_t cas_declining_methods = {
    .version = RATE_STORE_VERSION,
    .name = "test-cas-async-declining",
    .load = cs_load,
    .cas = cs_cas,
    .decide = cs_decide_declines,
    .remove = cs_remove,
    .start = cs_start,
    .stats = cs_stats,
    .destroy = cs_destroy,
};

/* A store of table m whose decide() declines (h->declines). */
static int make_declining(const rate_store_methods_t *m, rate_store_t **out,
                          cas_store_t **handle)
{
    cas_store_t *h;
    int rc = make(m, out, &h);
    if (rc == RATE_OK) {
        h->declines = 1;
        if (handle != NULL)
            *handle = h;
    }
    return rc;
}

int cas_store_new_async_declining(rate_store_t **out, cas_store_t **handle)
{
    return make_declining(&cas_declining_methods, out, handle);
}

void cas_store_inject_conflicts(cas_store_t *s, unsigned n)
{
    pthread_mutex_lock(&s->lock);
    s->conflicts = n;
    pthread_mutex_unlock(&s->lock);
}

void cas_store_set_down(cas_store_t *s, int down)
{
    pthread_mutex_lock(&s->lock);
    s->down = down;
    pthread_mutex_unlock(&s->lock);
}

uint64_t cas_store_ttl(cas_store_t *s, const char *key)
{
    pthread_mutex_lock(&s->lock);
    rate_key_t k = {key, strlen(key), RATE_SPACE_STATE};
    entry_t *e = find(s, &k);
    uint64_t ttl = e ? e->ttl_ns : 0;
    pthread_mutex_unlock(&s->lock);
    return ttl;
}

void cas_store_poke(cas_store_t *s, const char *key, const void *bytes,
                    size_t len)
{
    cas_store_poke_len(s, key, strlen(key), bytes, len);
}

void cas_store_poke_len(cas_store_t *s, const char *key, size_t key_len,
                        const void *bytes, size_t len)
{
    pthread_mutex_lock(&s->lock);
    rate_key_t k = {key, key_len, RATE_SPACE_STATE};
    entry_t *e = find(s, &k);
    if (e != NULL) {
        unsigned char *v = realloc(e->val, len ? len : 1);
        memcpy(v, bytes, len);
        e->val = v;
        e->len = len;
        e->version = ++s->next_version;
    }
    pthread_mutex_unlock(&s->lock);
}

/* decide() of the recording variant: counted, declined. */
static int cs_decide_records(void *self, const rate_key_t *key,
                             const rate_decide_req_t *req,
                             rate_decision_t *out)
{
    cas_store_t *s = self;

    (void)key;
    (void)out;
    pthread_mutex_lock(&s->lock);
    if ((unsigned)req->op < 3)
        s->asked[req->op]++;
    pthread_mutex_unlock(&s->lock);
    return RATE_ENOTSUP;
}

static const rate_store_methods_t cas_recording_v3 = {
    .version = 3,
    .name = "test-cas-recording-v3",
    .load = cs_load,
    .cas = cs_cas,
    .decide = cs_decide_records,
    .remove = cs_remove,
    .start = cs_start,
    .stats = cs_stats,
    .destroy = cs_destroy,
};

static const rate_store_methods_t cas_recording_v4 = {
    .version = 4,
    .name = "test-cas-recording-v4",
    .load = cs_load,
    .cas = cs_cas,
    .decide = cs_decide_records,
    .remove = cs_remove,
    .start = cs_start,
    .stats = cs_stats,
    .destroy = cs_destroy,
};

static const rate_store_methods_t cas_recording_v4_changes = {
    .version = 4,
    .name = "test-cas-recording-v4-changes",
    .load = cs_load,
    .cas = cs_cas,
    .decide = cs_decide_records,
    .remove = cs_remove,
    .start = cs_start,
    .stats = cs_stats,
    .destroy = cs_destroy,
    .decide_changes = true,
};

int cas_store_new_recording(rate_store_t **out, cas_store_t **handle,
                            int version, bool changes)
{
    return make_declining(version == 3 ? &cas_recording_v3
                          : changes    ? &cas_recording_v4_changes
                                       : &cas_recording_v4,
                          out, handle);
}

unsigned cas_store_asked(cas_store_t *s, int op)
{
    pthread_mutex_lock(&s->lock);
    unsigned n = op >= 0 && op < 3 ? s->asked[op] : 0;
    pthread_mutex_unlock(&s->lock);
    return n;
}

size_t cas_store_peek(cas_store_t *s, const char *key, void *buf, size_t cap)
{
    return cas_store_peek_len(s, key, strlen(key), buf, cap);
}

size_t cas_store_peek_len(cas_store_t *s, const char *key, size_t key_len,
                          void *buf, size_t cap)
{
    pthread_mutex_lock(&s->lock);
    rate_key_t k = {key, key_len, RATE_SPACE_STATE};
    entry_t *e = find(s, &k);
    size_t len = e ? e->len : 0;
    if (e != NULL)
        memcpy(buf, e->val, len < cap ? len : cap);
    pthread_mutex_unlock(&s->lock);
    return len;
}
