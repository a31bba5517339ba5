/* SPDX-License-Identifier: MIT */
/*
 * step.h -- the step: a key's whole state decided under a policy
 * (src/step.c), over the policies a limiter has met (known.h) for a state
 * made under another.  Read by the core and by the Redis module, which
 * runs the same step inside the server.  Never installed.
 */
#ifndef RATE_STEP_H
#define RATE_STEP_H

#include "kit.h"
#include "known.h"

/* ------------------------------------------------------------- the step */

typedef struct rate__step_arg {
    const rate_policy_t *policy;
    uint32_t policy_id;
    uint8_t format;
    const rate__registry_t *known; /* for states of other policies */
    uint64_t now_ns;
    uint64_t permits;
    uint64_t max_wait_ns;
    bool detail;
    rate__op_t op;
    rate_decision_t *decision; /* out */
    /* out, with RATE__NEED_POLICY: the state's tag and format */
    uint32_t need_tag;
    uint8_t need_format;
} rate__step_arg_t;

/* What rate__step returns (through the store) for a state whose policy is
 * not yet known to the limiter: it fetches the store's record and runs the
 * step again.  Positive, so never a RATE_E* code. */
#define RATE__NEED_POLICY 1

/* The rate_step_t.fn every store runs, and its cold-state test. */
int rate__step(void *arg, rate_step_io_t *io);
bool rate__is_cold(void *arg, const void *state, size_t len, uint64_t now_ns);

#endif /* RATE_STEP_H */
