/* SPDX-License-Identifier: MIT */
/*
 * The example server's metrics: counters a limiter's listener feeds and a
 * Prometheus text exposition of them (metrics.c).
 */
#ifndef API_METRICS_H
#define API_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include <ratelimit.h>

typedef struct metrics metrics_t;

int metrics_new(metrics_t **out);
void metrics_free(metrics_t *m);

/* The listener (rate_limiter_config_t.listener, ud the metrics). */
void metrics_listen(void *ud, const rate_event_t *ev);

/* One request's decision time, ns (the rules' whole check). */
void metrics_latency(metrics_t *m, uint64_t ns);

/* A reload, and whether it took. */
void metrics_reload(metrics_t *m, int ok);

/* In-flight leases (docs/leases.md, "The rules file"): a request that
 * took leases, one an in-flight policy denied, and a held request's
 * release (ok: 0 for RATE_OK, else the release's error). */
typedef enum { LEASE_GRANTED, LEASE_DENIED } lease_event_t;
void metrics_lease(metrics_t *m, lease_event_t ev);
void metrics_lease_released(metrics_t *m, int rc);

/* Decisions the store failed so far (ratelimit_store_errors_total). */
uint64_t metrics_store_errors(metrics_t *m);

/* Writes the exposition (text format 0.0.4) into buf (len bytes); returns
 * the length, or 0 when it does not fit. */
size_t metrics_format(metrics_t *m, rate_limiter_t *lim, uint64_t generation,
                      char *buf, size_t len);

#endif
