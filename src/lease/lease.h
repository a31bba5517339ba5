/* SPDX-License-Identifier: MIT */
/*
 * Internal declarations of the lease layer (src/lease/): the policy, the
 * stored state's layout and the pure step over it (docs/leases.md,
 * "Internals").
 */
#ifndef RATE_LEASE_INTERNAL_H
#define RATE_LEASE_INTERNAL_H

#include "ratelimit_lease.h"
#include "ratelimit_store.h"

#define RATE__LEASE_HEADER 14u
#define RATE__LEASE_ENTRY 24u
#define RATE__LEASE_FORMAT 0x4cu /* 'L', where a rate state has its format */

struct rate_inflight_policy {
    uint64_t max;         /* N */
    uint64_t ttl_ns;
    uint64_t reserve;     /* leases kept for critical traffic */
    uint64_t reserve_arg; /* as written: a count, or a percentage */
    bool reserve_pct;
    rate_policy_t *rate;  /* the rate clauses, or NULL */
    /* name= before the concurrency clause of a policy without rate
     * clauses ("" none; with them, the rate part carries it) */
    char name[RATE_POLICY_NAME_MAX + 1];
};

/* A copy of p (its rate part parsed again from its text). */
int rate__inflight_policy_copy(const rate_inflight_policy_t *p,
                               rate_inflight_policy_t **out);

typedef enum lease_op {
    LEASE_ACQUIRE,
    LEASE_RELEASE,
    LEASE_EXTEND,
    LEASE_COUNT,
    LEASE_LIST, /* the unexpired leases' ids and pids of the holders in
                   PID namespace ns (none for ns 0), into ids/pids */
    LEASE_REAP  /* remove the leases whose ids are in ids[0..n_ids) */
} lease_op_t;

/* One run of the step: inputs, then outputs.  Pure: runs over bytes. */
typedef struct rate__lease_step {
    lease_op_t op;
    uint64_t now_ns;
    uint64_t max, reserve; /* the policy's N and reserve */
    rate_lease_class_t cls;
    uint64_t id;          /* acquire: the new id; release, extend: the id */
    uint64_t expires_ns;  /* acquire, extend: the new expiry; release and
                             extend: the handle's, to tell expired apart */
    uint32_t pid;         /* acquire: the holder's */
    uint32_t ns;          /* acquire: the holder's PID namespace (24 bits,
                             0: unknown); list: whose holders to list */
    bool pin;             /* write a state with leases held with
                             RATE_TTL_FOREVER (never evicted), not a TTL
                             to its latest expiry */
    uint64_t *ids;        /* list: out (cap entries); reap: in (n_ids) */
    uint32_t *pids;       /* list: out */
    size_t cap, n_ids;
    uint64_t *scratch;    /* acquire: room for scratch_cap expiries, or
                             NULL; the held count may exceed it (another
                             object with a larger N wrote the key) */
    size_t scratch_cap;
    /* out */
    bool granted;
    uint64_t held;        /* unexpired leases after the step */
    uint64_t retry_at;    /* denied: when this class gets a slot back */
    uint64_t latest;      /* the latest expiry held (0: none) */
} rate__lease_step_t;

int rate__lease_step(void *arg, rate_step_io_t *io);
bool rate__lease_is_cold(void *arg, const void *state, size_t len,
                         uint64_t at_ns);

#endif
