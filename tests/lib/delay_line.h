/* SPDX-License-Identifier: MIT */
/*
 * A delay line (header-only, static): a TCP proxy on a free loopback port
 * in front of a server on another (Redis, dynalite), for the tests of
 * deadlines.  Each request, the first bytes a client sends after the last
 * answer or after it connected, is passed on `delay_ms` late (0: at once);
 * the rest of a request and the answers pass at once.  A thread each way
 * per connection.  delay_line_stop() closes every connection and returns
 * once no thread of the line reads it any more.
 */
#ifndef TEST_LIB_DELAY_LINE_H
#define TEST_LIB_DELAY_LINE_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "wait.h"

#define DELAY_LINE_CONNS 64 /* connections over a line's life */

typedef struct delay_line {
    int port;          /* where clients connect */
    int upstream_port; /* the server's */
    atomic_int delay_ms;
    /* the line's own */
    int lfd;
    pthread_t acceptor;
    atomic_bool stop;
    atomic_int live; /* connections whose threads still run */
    pthread_mutex_t lock;
    int fds[2 * DELAY_LINE_CONNS]; /* each connection's two; -1: closed */
    int nfds;
} delay_line_t;

typedef struct delay_conn {
    delay_line_t *dl;
    int client, upstream, slot;
    atomic_bool answered; /* an answer came since the last request */
} delay_conn_t;

static inline void *delay_line_down(void *arg)
{
    delay_conn_t *dc = arg;
    char buf[65536];
    ssize_t n;
    while ((n = read(dc->upstream, buf, sizeof buf)) > 0) {
        atomic_store(&dc->answered, true);
        if (send(dc->client, buf, (size_t)n, MSG_NOSIGNAL) != n)
            break;
    }
    shutdown(dc->client, SHUT_RDWR);
    return NULL;
}

static inline void *delay_line_up(void *arg)
{
    delay_conn_t *dc = arg;
    delay_line_t *dl = dc->dl;
    pthread_t down;
    bool with_down = pthread_create(&down, NULL, delay_line_down, dc) == 0;
    char buf[65536];
    ssize_t n;
    while (with_down && (n = read(dc->client, buf, sizeof buf)) > 0) {
        int ms = atomic_load(&dl->delay_ms);
        if (atomic_exchange(&dc->answered, false) && ms > 0)
            usleep((useconds_t)ms * 1000); /* the delay is the point */
        if (send(dc->upstream, buf, (size_t)n, MSG_NOSIGNAL) != n)
            break;
    }
    shutdown(dc->upstream, SHUT_RDWR);
    if (with_down)
        pthread_join(down, NULL);
    pthread_mutex_lock(&dl->lock); /* not shut by the stop once closed */
    dl->fds[dc->slot] = dl->fds[dc->slot + 1] = -1;
    close(dc->upstream);
    close(dc->client);
    pthread_mutex_unlock(&dl->lock);
    free(dc);
    atomic_fetch_sub(&dl->live, 1); /* dl is not read after this */
    return NULL;
}

static inline int delay_line_connect(int port)
{
    struct sockaddr_in sa = {0};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    sa.sin_port = htons((uint16_t)port);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        close(fd);
        fd = -1;
    }
    return fd;
}

static inline void *delay_line_accept(void *arg)
{
    delay_line_t *dl = arg;
    while (!atomic_load(&dl->stop)) {
        int c = accept(dl->lfd, NULL, NULL);
        if (c < 0)
            break;
        int u = delay_line_connect(dl->upstream_port);
        delay_conn_t *dc = calloc(1, sizeof *dc);
        pthread_mutex_lock(&dl->lock);
        bool room = dl->nfds + 2 <= 2 * DELAY_LINE_CONNS;
        if (u < 0 || dc == NULL || !room) {
            pthread_mutex_unlock(&dl->lock);
            free(dc);
            if (u >= 0)
                close(u);
            close(c);
            continue;
        }
        *dc = (delay_conn_t){.dl = dl, .client = c, .upstream = u,
                             .slot = dl->nfds};
        atomic_init(&dc->answered, true); /* the first request: delayed */
        dl->fds[dl->nfds++] = c;
        dl->fds[dl->nfds++] = u;
        pthread_mutex_unlock(&dl->lock);
        atomic_fetch_add(&dl->live, 1);
        pthread_t th;
        if (pthread_create(&th, NULL, delay_line_up, dc) != 0) {
            pthread_mutex_lock(&dl->lock);
            dl->fds[dc->slot] = dl->fds[dc->slot + 1] = -1;
            pthread_mutex_unlock(&dl->lock);
            close(u);
            close(c);
            free(dc);
            atomic_fetch_sub(&dl->live, 1);
            continue;
        }
        pthread_detach(th);
    }
    return NULL;
}

/* Opens the line on a free loopback port (dl->port) in front of
 * `upstream_port`, passing requests at once: true; false when it could
 * not listen. */
static inline bool delay_line_start(delay_line_t *dl, int upstream_port)
{
    struct sockaddr_in sa = {0};
    socklen_t sl = sizeof sa;
    memset(dl, 0, sizeof *dl);
    dl->upstream_port = upstream_port;
    pthread_mutex_init(&dl->lock, NULL);
    dl->lfd = socket(AF_INET, SOCK_STREAM, 0);
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (dl->lfd < 0 || bind(dl->lfd, (struct sockaddr *)&sa, sizeof sa) != 0 ||
        listen(dl->lfd, 16) != 0 ||
        getsockname(dl->lfd, (struct sockaddr *)&sa, &sl) != 0 ||
        pthread_create(&dl->acceptor, NULL, delay_line_accept, dl) != 0) {
        if (dl->lfd >= 0)
            close(dl->lfd);
        pthread_mutex_destroy(&dl->lock);
        return false;
    }
    dl->port = ntohs(sa.sin_port);
    return true;
}

/* Closes the line and every connection through it; returns once none of
 * its threads runs (TEST_WAIT_S at most: false after that). */
static inline bool delay_line_stop(delay_line_t *dl)
{
    atomic_store(&dl->stop, true);
    shutdown(dl->lfd, SHUT_RDWR);
    pthread_join(dl->acceptor, NULL);
    close(dl->lfd);
    atomic_store(&dl->delay_ms, 0);
    pthread_mutex_lock(&dl->lock);
    for (int i = 0; i < dl->nfds; i++)
        if (dl->fds[i] >= 0)
            shutdown(dl->fds[i], SHUT_RDWR);
    pthread_mutex_unlock(&dl->lock);
    bool done = WAIT_UNTIL(atomic_load(&dl->live) == 0, TEST_WAIT_S);
    if (done)
        pthread_mutex_destroy(&dl->lock);
    return done;
}

#endif
