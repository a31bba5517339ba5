/* SPDX-License-Identifier: MIT */
/*
 * A Redis node's health, one small state machine that both transports
 * (sync.c, async.c) run: the circuit breaker (after `failures` calls in a
 * row failed, every call fails at once for `cooldown_ns`, then one call
 * goes through as the probe: answered, the breaker closes; not, it opens
 * again), the reconnect backoff (doubling from BACKOFF_MIN_NS to
 * BACKOFF_MAX_NS after each failed connection, so that while Redis is
 * down a call fails at once instead of waiting on a dead host), and when
 * the slot map may be asked for again.  Its fields are atomic, so that
 * the synchronous store's threads share it; the event loop's store runs
 * it on one thread.  No I/O, no clock read: the caller passes the time.
 */
#ifndef RATE_STORE_REDIS_NODE_H
#define RATE_STORE_REDIS_NODE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#define RATE__REDIS_MAX_NODES 255  /* nodes a store ever knows */
#define RATE__REDIS_MAX_REDIRECTS 5 /* MOVED, ASK, TRYAGAIN per command */
#define RATE__REDIS_TRYAGAIN_NS (20 * UINT64_C(1000000))
#define RATE__REDIS_REFRESH_MIN_NS (100 * UINT64_C(1000000))
#define RATE__REDIS_BACKOFF_MIN_NS (10 * UINT64_C(1000000))
#define RATE__REDIS_BACKOFF_MAX_NS UINT64_C(1000000000)
#define RATE__REDIS_BREAKER_FAILURES 5
#define RATE__REDIS_BREAKER_COOLDOWN_NS UINT64_C(1000000000)

/* The breaker's settings (the store's options). */
typedef struct rate__breaker_conf {
    bool on;
    unsigned failures;
    uint64_t cooldown_ns;
} rate__breaker_conf_t;

typedef struct rate__breaker {
    atomic_uint fails;              /* calls failed in a row */
    _Atomic uint64_t open_until_ns; /* 0: closed */
    atomic_bool probing;            /* open, cooled down: a probe is out */
} rate__breaker_t;

typedef enum rate__admit {
    RATE__ADMIT_GO,     /* closed (or no breaker): send */
    RATE__ADMIT_PROBE,  /* cooled down: send, as the one probe */
    RATE__ADMIT_REFUSE, /* open: fail at once */
} rate__admit_t;

typedef enum rate__outcome {
    RATE__OUTCOME_OK,      /* answered */
    RATE__OUTCOME_FAIL,    /* no reply, or none in time */
    RATE__OUTCOME_NEUTRAL, /* says nothing of the server (out of memory) */
} rate__outcome_t;

/* Whether a call may go to the node now. */
rate__admit_t rate__breaker_admit(const rate__breaker_conf_t *cf,
                                  rate__breaker_t *b, uint64_t now);
/* A call's outcome (probe: it was admitted as the probe); now is read
 * for a failure only.  True when this outcome opened the breaker. */
bool rate__breaker_outcome(const rate__breaker_conf_t *cf, rate__breaker_t *b,
                           bool probe, rate__outcome_t o, uint64_t now);
bool rate__breaker_is_open(const rate__breaker_conf_t *cf,
                           const rate__breaker_t *b);

/* The reconnect backoff of a connection (or of finding the topology). */
typedef struct rate__backoff {
    _Atomic uint64_t retry_at_ns; /* no try before; 0: now */
    uint64_t backoff_ns;          /* the last pause; 0 after a success */
} rate__backoff_t;

static inline bool rate__backoff_ready(const rate__backoff_t *b, uint64_t now)
{
    return now >= atomic_load(&b->retry_at_ns);
}
/* A try failed: the next no sooner than twice the last pause. */
void rate__backoff_failed(rate__backoff_t *b, uint64_t now);
/* A try succeeded: the next failure pauses the least. */
static inline void rate__backoff_ok(rate__backoff_t *b) { b->backoff_ns = 0; }
/* Try at once (a breaker's probe). */
static inline void rate__backoff_now(rate__backoff_t *b)
{
    atomic_store(&b->retry_at_ns, 0);
}

/* Whether the slot map may be asked for again: at most once per
 * RATE__REDIS_REFRESH_MIN_NS after the last time, unless forced. */
static inline bool rate__refresh_due(uint64_t last_ns, uint64_t now,
                                     bool force)
{
    return force || now >= last_ns + RATE__REDIS_REFRESH_MIN_NS;
}

#endif
