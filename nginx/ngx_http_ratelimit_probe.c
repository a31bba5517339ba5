/* SPDX-License-Identifier: MIT */
/*
 * The worker's Redis probe thread (ngx_http_ratelimit_probe.h): plain
 * POSIX threads and the library's synchronous Redis store; nothing of
 * nginx's is touched from the thread.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ngx_http_ratelimit_probe.h"

#define PROBE_BACKOFF_MIN_NS 50000000u    /* 50 ms */
#define PROBE_BACKOFF_MAX_NS 1000000000u  /* 1 s */

struct ngx_http_ratelimit_probe_s {
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t cond; /* signalled on a target answering, and on stop */
    bool stop;
    size_t n, left;
    ngx_http_ratelimit_probe_target_t *t;
    bool *done;
};

static void probe_deadline(struct timespec *ts, uint64_t ns) {
    clock_gettime(CLOCK_MONOTONIC, ts);
    ns += (uint64_t)ts->tv_nsec;
    ts->tv_sec += (time_t)(ns / 1000000000u);
    ts->tv_nsec = (long)(ns % 1000000000u);
}

/* One try of target t: whether its Redis answered (its record written). */
static bool probe_try(const ngx_http_ratelimit_probe_target_t *t) {
    rate_redis_options_t o = *t->options;
    rate_limiter_config_t lc;
    rate_limiter_t *lim = NULL;
    rate_store_t *store = NULL;
    bool ok;

    o.lazy_connect = false;
    if (rate_store_redis_new(t->url, &o, &store, NULL, 0) != RATE_OK) {
        return false;
    }
    memset(&lc, 0, sizeof(lc));
    lc.policy = t->policy;
    lc.store = store;
    lc.clock = t->clock;
    ok = rate_limiter_new(&lc, &lim) == RATE_OK;
    rate_limiter_free(lim);
    rate_store_free(store);
    return ok;
}

static void *probe_main(void *arg) {
    ngx_http_ratelimit_probe_t *p = arg;
    uint64_t backoff = PROBE_BACKOFF_MIN_NS;
    struct timespec ts;
    size_t i;
    bool ok;

    pthread_mutex_lock(&p->lock);
    while (!p->stop && p->left > 0) {
        for (i = 0; i < p->n && !p->stop; i++) {
            if (p->done[i]) {
                continue;
            }
            pthread_mutex_unlock(&p->lock);
            ok = probe_try(&p->t[i]);
            pthread_mutex_lock(&p->lock);
            if (ok) {
                p->done[i] = true;
                p->left--;
                pthread_cond_broadcast(&p->cond);
            }
        }
        if (p->stop || p->left == 0) {
            break;
        }
        probe_deadline(&ts, backoff);
        while (!p->stop &&
               pthread_cond_timedwait(&p->cond, &p->lock, &ts) != ETIMEDOUT) {
        }
        backoff = backoff * 2 > PROBE_BACKOFF_MAX_NS ? PROBE_BACKOFF_MAX_NS
                                                     : backoff * 2;
    }
    pthread_mutex_unlock(&p->lock);
    return NULL;
}

ngx_http_ratelimit_probe_t *
ngx_http_ratelimit_probe_start(const ngx_http_ratelimit_probe_target_t *t,
                               size_t n) {
    ngx_http_ratelimit_probe_t *p;
    pthread_condattr_t ca;
    sigset_t all, old;
    int rc;

    p = calloc(1, sizeof(*p));
    if (p == NULL) {
        return NULL;
    }
    p->t = calloc(n ? n : 1, sizeof(*p->t));
    p->done = calloc(n ? n : 1, sizeof(*p->done));
    if (p->t == NULL || p->done == NULL) {
        free(p->t);
        free(p->done);
        free(p);
        return NULL;
    }
    memcpy(p->t, t, n * sizeof(*t));
    p->n = p->left = n;
    pthread_mutex_init(&p->lock, NULL);
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&p->cond, &ca);
    pthread_condattr_destroy(&ca);
    /* Every signal stays the worker's main thread's (nginx's). */
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    rc = pthread_create(&p->thread, NULL, probe_main, p);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        pthread_cond_destroy(&p->cond);
        pthread_mutex_destroy(&p->lock);
        free(p->t);
        free(p->done);
        free(p);
        return NULL;
    }
    return p;
}

int ngx_http_ratelimit_probe_done(ngx_http_ratelimit_probe_t *p, size_t i) {
    int d;

    pthread_mutex_lock(&p->lock);
    d = i < p->n && p->done[i];
    pthread_mutex_unlock(&p->lock);
    return d;
}

int ngx_http_ratelimit_probe_wait(ngx_http_ratelimit_probe_t *p, uint64_t ns) {
    struct timespec ts;
    int all;

    probe_deadline(&ts, ns);
    pthread_mutex_lock(&p->lock);
    while (p->left > 0 &&
           pthread_cond_timedwait(&p->cond, &p->lock, &ts) != ETIMEDOUT) {
    }
    all = p->left == 0;
    pthread_mutex_unlock(&p->lock);
    return all;
}

void ngx_http_ratelimit_probe_stop(ngx_http_ratelimit_probe_t *p) {
    if (p == NULL) {
        return;
    }
    pthread_mutex_lock(&p->lock);
    p->stop = true;
    pthread_cond_broadcast(&p->cond);
    pthread_mutex_unlock(&p->lock);
    pthread_join(p->thread, NULL);
    pthread_cond_destroy(&p->cond);
    pthread_mutex_destroy(&p->lock);
    free(p->t);
    free(p->done);
    free(p);
}
