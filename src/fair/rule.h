/* SPDX-License-Identifier: MIT */
/*
 * The fair rule's arithmetic, written once for both tables: the process's
 * (decide.c, vtime.c) and the fleet's (step.c, run by the Redis module; its Lua twin
 * is fair_rule.lua).  Pure: no clock, I/O, locks or allocation.
 *
 * A request is *light* when its flow asked, in this period and the last,
 * no more than its share of the shared limit's rate (plus one permit).  A
 * light request is decided by the shared limit as it is; any other must
 * leave room in the shared limit for two kinds of flows
 * (docs/fair.md, "The rule"):
 *  - the light ones, by their measured demand: the light flows' backlog
 *    against the shared rate (what they asked that the rate has not yet
 *    caught up with), its peak over the last 24 to 32 periods, plus an
 *    eighth of the capacity for light flows not seen yet;
 *  - the heavy flows behind it in virtual service (the catch-up terms),
 *    as before.
 * The room is then shaped by what holding it costs the algorithm: nothing
 * in a bucket; in a fixed window or a sliding window counter nothing if
 * it is given back before the window ends (the last slice of each window
 * keeps none for light flows, and a fixed window keeps for a heavy flow
 * behind no more than it asks in the rest of the window); in a sliding
 * log its rate, so a log keeps at most a fiftieth of its limit for light
 * flows, and a log or a counter (whose room comes back as it goes) keeps
 * for a heavy flow behind no more than it asks in one permit's time.
 *
 * Times are microseconds; the period P is the shared policy's first
 * limit's, L its limit.  Every number the fleet's table keeps stays below
 * 2^53, so that the Lua twin computes the same bytes.
 */
#ifndef RATE_FAIR_RULE_H
#define RATE_FAIR_RULE_H

#include <stdbool.h>
#include <stdint.h>

/* The estimator's numbers saturate here (Lua's exact integers). */
#define RATE__FAIR_LIGHT_MAX (UINT64_C(1) << 52)
/* The peak is kept in 4 buckets of this many periods each. */
#define RATE__FAIR_LIGHT_SPAN 8u

/* How the shared limit renews its room: what holding room costs. */
typedef enum rate__fair_kind {
    RATE__FAIR_BUCKET,  /* token bucket: room held costs no rate */
    RATE__FAIR_PACER,   /* leaky bucket: it holds no room to keep for
                           anyone (docs/fair.md): no light reserve */
    RATE__FAIR_FIXED,   /* fixed window: room still held when the window
                           ends is lost; none comes back within it */
    RATE__FAIR_COUNTER, /* sliding window counter: the same at the end,
                           and room comes back all through the window */
    RATE__FAIR_LOG      /* sliding log: room held costs its rate */
} rate__fair_kind_t;

/* The shared limit as the rule sees it. */
typedef struct rate__fair_shape {
    uint64_t limit;     /* L, >= 1 (below 2^50 on the fleet's table) */
    uint64_t period_us; /* P, >= 1 */
    rate__fair_kind_t kind;
} rate__fair_shape_t;

/* The light flows' demand (a table's, one per table).  q and peak are
 * permits times P (so that the drain, dt x L, is exact). */
typedef struct rate__fair_light {
    uint64_t q;        /* the light backlog now (at t_us) */
    uint64_t t_us;     /* the latest time seen */
    uint64_t bucket;   /* the peak's bucket of t_us, plus 1 */
    uint64_t peak[4];  /* the backlog's peak in each of the last buckets */
    uint64_t ep;       /* the period a_cur counts, plus 1 */
    uint64_t a_cur;    /* permits asked of the table in that period */
    uint64_t a_prev;   /* ... and in the one before */
} rate__fair_light_t;

/* The words of rate__fair_light_t, in order, as the fleet's table keeps
 * them. */
#define RATE__FAIR_LIGHT_WORDS 10u

/* The shape of a policy's first limit (its algorithm, limit and period in
 * ns; the period in us is rounded up, at least 1). */
rate__fair_shape_t rate__fair_shape_of(int algorithm, uint64_t limit,
                                       uint64_t period_ns);

/* A flow's long demand: every permit it asked, less an eighth for each
 * period since (about 8 times what it asks a period, over the last 8 or
 * so).  Brought forward `periods` periods. */
uint64_t rate__fair_long_decay(uint64_t sum, uint64_t periods);
/* sum + permits, saturating as the table's numbers do. */
uint64_t rate__fair_long_add(uint64_t sum, uint64_t permits);

/* Whether a flow of weight w is light: it asked lately (the larger of
 * this period's and the last's, this request included) no more than its
 * share of the rate plus one, floor(L w / total_w) + 1; or, seen in
 * three periods or more (`age`: the periods since it first asked,
 * this one included), it asks that little over the long run (its long
 * demand against what that share would have summed to over its age, up
 * to 64) and lately no more than half the capacity cap (0: L): a flow
 * that comes now and then in bursts. */
bool rate__fair_is_light(const rate__fair_shape_t *sh, uint64_t asked,
                         uint64_t long_sum, uint64_t age, uint64_t w,
                         uint64_t total_w, uint64_t cap);

/* Brings the estimator to now_us and counts `permits` asked of the table
 * (every request, light or not). */
void rate__fair_light_count(rate__fair_light_t *l,
                            const rate__fair_shape_t *sh, uint64_t now_us,
                            uint64_t permits);

/* The periods since a flow first asked (since: that period plus 1, 0
 * never), period ep (plus 1) included. */
uint64_t rate__fair_age(uint64_t since, uint64_t ep);

/* A request counted in the estimator (after _count) for a flow that has
 * given `gave` permits to the backlog while light: a light request's
 * permits are added to the backlog, a heavy one takes back what its flow
 * gave (at most `asked`, what it asked in this period and the last).
 * Returns the flow's new `gave` (saturating at RATE__FAIR_LIGHT_MAX). */
uint64_t rate__fair_light_request(rate__fair_light_t *l,
                                  const rate__fair_shape_t *sh, bool light,
                                  uint64_t permits, uint64_t gave,
                                  uint64_t asked);

/* Adds a light request's permits to the backlog (after _count). */
void rate__fair_light_add(rate__fair_light_t *l, const rate__fair_shape_t *sh,
                          uint64_t permits);

/* Takes back `permits` a flow added while it was light, now that it is
 * not (from the backlog and the current bucket's peak). */
void rate__fair_light_take_back(rate__fair_light_t *l,
                                const rate__fair_shape_t *sh,
                                uint64_t permits);

/* A flow as the rule reads it, on either table. */
typedef struct rate__fair_flow {
    uint64_t cur;   /* permits it asked in the period it last asked in */
    uint64_t prev;  /* ... and in the period before that */
    uint64_t lsum;  /* its long demand (rate__fair_long_add) */
    uint64_t since; /* the period it first asked in, plus 1; 0: never */
} rate__fair_flow_t;

/* The flow brought from the period it last asked in (`last`, plus 1; 0:
 * never) to period ep (plus 1): what it asked rolls over (to `prev` when
 * ep follows `last`, else it is forgotten), its long demand decays, and
 * `since` is set when it is new (or the clock went back). */
void rate__fair_roll(rate__fair_flow_t *fl, uint64_t last, uint64_t ep);

/* A request of `permits` of the flow counted in the estimator at now_us
 * (every request: rate__fair_light_count), then, as light or not
 * (rate__fair_is_light, on `asked`: the larger of the flow's cur and prev,
 * plus what it has waiting; `age`: rate__fair_age), its permits added to
 * the backlog or what it gave taken back (rate__fair_light_request, with
 * *gave).  Returns whether the request is light. */
bool rate__fair_light_note(rate__fair_light_t *l, const rate__fair_shape_t *sh,
                           uint64_t now_us, uint64_t permits,
                           const rate__fair_flow_t *fl, uint64_t asked,
                           uint64_t age, uint64_t w, uint64_t total_w,
                           uint64_t cap, uint64_t *gave);

/* What a flow behind the request's flow by `behind` of virtual service is
 * owed: 0 when it is light, else its catch-up term (rate__fair_term);
 * asked and age as for rate__fair_light_note. */
uint64_t rate__fair_owed(const rate__fair_shape_t *sh, uint64_t now_us,
                         uint64_t cap, const rate__fair_flow_t *fl,
                         uint64_t asked, uint64_t age, uint64_t w,
                         uint64_t total_w, uint64_t behind);

/* One heavy flow's catch-up term (docs/fair.md: the least of its share of
 * the capacity, what it asked lately and what it needs to catch up),
 * for a sum that rate__fair_need finishes: on a sliding log or counter
 * the term is counted in 1/L permits and at most what the flow asks in
 * one permit's time (asked / L permits); on a fixed window at most what
 * it asks, at its recent pace, in the rest of the window. */
uint64_t rate__fair_term(const rate__fair_shape_t *sh, uint64_t now_us,
                         uint64_t cap, uint64_t w, uint64_t total_w,
                         uint64_t behind, uint64_t asked);

/* The room a request that is not light must leave in the shared limit of
 * capacity cap (the denying or constraining limit's `limit`), at now_us:
 * the light flows' reserve plus the catch-up terms' sum (0 when the flow
 * is behind no one), shaped by what holding room costs, at most cap - 1.
 * The estimator must have been brought to now_us (_count). */
uint64_t rate__fair_need(const rate__fair_light_t *l,
                         const rate__fair_shape_t *sh, uint64_t now_us,
                         uint64_t cap, uint64_t terms);

/* A bound of rate__fair_need's light part at any time after now (for a
 * path that reads no table): the peak plus the eighth, at most cap. */
uint64_t rate__fair_light_bound(const rate__fair_light_t *l,
                                const rate__fair_shape_t *sh, uint64_t cap);

#endif
