/* SPDX-License-Identifier: MIT */
/*
 * The worker's refund thread (ngx_http_ratelimit_refund.h): a queue under
 * a mutex, plain POSIX threads and the library's synchronous Redis store;
 * nothing of nginx's is touched from the thread.
 */
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "ngx_http_ratelimit_refund.h"

typedef struct refund_item {
    struct refund_item *next;
    size_t zone;
    int shadow;
    size_t len;
    char key[];
} refund_item_t;

typedef struct {
    ngx_http_ratelimit_refund_zone_t t;
    rate_store_t *store;
    rate_limiter_t *lim[2]; /* [shadow] */
    bool made;              /* tried to make them */
} refund_zone_t;

struct ngx_http_ratelimit_refund_s {
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    bool stop;
    refund_item_t *head, *tail;
    size_t queued;
    uint64_t made, failed, dropped;
    size_t n;
    refund_zone_t *z;
};

static void refund_make(refund_zone_t *z) {
    rate_redis_options_t o = *z->t.options;
    rate_limiter_config_t lc;
    int s;

    z->made = true;
    o.lazy_connect = true;
    if (rate_store_redis_new(z->t.url, &o, &z->store, NULL, 0) != RATE_OK) {
        z->store = NULL;
        return;
    }
    for (s = 0; s < 2; s++) {
        memset(&lc, 0, sizeof(lc));
        lc.policy = z->t.policy;
        lc.store = z->store;
        lc.clock = z->t.clock;
        lc.shadow = s != 0;
        if (rate_limiter_new(&lc, &z->lim[s]) != RATE_OK) {
            z->lim[s] = NULL;
        }
    }
}

static void *refund_main(void *arg) {
    ngx_http_ratelimit_refund_t *rf = arg;
    refund_item_t *it;
    refund_zone_t *z;
    int rc;

    pthread_mutex_lock(&rf->lock);
    for (;;) {
        while (!rf->stop && rf->head == NULL) {
            pthread_cond_wait(&rf->cond, &rf->lock);
        }
        if (rf->stop) {
            break;
        }
        it = rf->head;
        rf->head = it->next;
        if (rf->head == NULL) {
            rf->tail = NULL;
        }
        rf->queued--;
        pthread_mutex_unlock(&rf->lock);

        z = &rf->z[it->zone];
        if (!z->made) {
            refund_make(z);
        }
        rc = z->lim[it->shadow ? 1 : 0] == NULL
                 ? RATE_ESTORE
                 : rate_limiter_refund(z->lim[it->shadow ? 1 : 0], it->key,
                                       it->len, 1);
        free(it);

        pthread_mutex_lock(&rf->lock);
        if (rc == RATE_OK) {
            rf->made++;
        } else {
            rf->failed++;
        }
    }
    pthread_mutex_unlock(&rf->lock);
    return NULL;
}

ngx_http_ratelimit_refund_t *
ngx_http_ratelimit_refund_start(const ngx_http_ratelimit_refund_zone_t *t,
                                size_t n) {
    ngx_http_ratelimit_refund_t *rf;
    sigset_t all, old;
    size_t i;
    int rc;

    rf = calloc(1, sizeof(*rf));
    if (rf == NULL) {
        return NULL;
    }
    rf->z = calloc(n ? n : 1, sizeof(*rf->z));
    if (rf->z == NULL) {
        free(rf);
        return NULL;
    }
    for (i = 0; i < n; i++) {
        rf->z[i].t = t[i];
    }
    rf->n = n;
    pthread_mutex_init(&rf->lock, NULL);
    pthread_cond_init(&rf->cond, NULL);
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    rc = pthread_create(&rf->thread, NULL, refund_main, rf);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        pthread_cond_destroy(&rf->cond);
        pthread_mutex_destroy(&rf->lock);
        free(rf->z);
        free(rf);
        return NULL;
    }
    return rf;
}

int ngx_http_ratelimit_refund_post(ngx_http_ratelimit_refund_t *rf, size_t i,
                                   int shadow, const void *key, size_t len) {
    refund_item_t *it;

    if (rf == NULL || i >= rf->n || len > RATE_KEY_MAX) {
        return -1;
    }
    pthread_mutex_lock(&rf->lock);
    if (rf->queued >= NGX_HTTP_RATELIMIT_REFUND_QUEUE) {
        rf->dropped++;
        pthread_mutex_unlock(&rf->lock);
        return -1;
    }
    pthread_mutex_unlock(&rf->lock);
    it = malloc(sizeof(*it) + len + 1);
    if (it == NULL) {
        pthread_mutex_lock(&rf->lock);
        rf->dropped++;
        pthread_mutex_unlock(&rf->lock);
        return -1;
    }
    it->next = NULL;
    it->zone = i;
    it->shadow = shadow;
    it->len = len;
    memcpy(it->key, key, len);
    it->key[len] = '\0';
    pthread_mutex_lock(&rf->lock);
    if (rf->tail != NULL) {
        rf->tail->next = it;
    } else {
        rf->head = it;
    }
    rf->tail = it;
    rf->queued++;
    pthread_cond_signal(&rf->cond);
    pthread_mutex_unlock(&rf->lock);
    return 0;
}

void ngx_http_ratelimit_refund_stop(ngx_http_ratelimit_refund_t *rf,
                                    uint64_t *made, uint64_t *failed,
                                    uint64_t *dropped) {
    refund_item_t *it;
    size_t i;

    if (rf == NULL) {
        return;
    }
    pthread_mutex_lock(&rf->lock);
    rf->stop = true;
    pthread_cond_signal(&rf->cond);
    pthread_mutex_unlock(&rf->lock);
    pthread_join(rf->thread, NULL);
    while ((it = rf->head) != NULL) {
        rf->head = it->next;
        rf->dropped++;
        free(it);
    }
    *made = rf->made;
    *failed = rf->failed;
    *dropped = rf->dropped;
    for (i = 0; i < rf->n; i++) {
        rate_limiter_free(rf->z[i].lim[0]);
        rate_limiter_free(rf->z[i].lim[1]);
        rate_store_free(rf->z[i].store);
    }
    pthread_cond_destroy(&rf->cond);
    pthread_mutex_destroy(&rf->lock);
    free(rf->z);
    free(rf);
}
