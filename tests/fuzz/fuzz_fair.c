/* SPDX-License-Identifier: MIT */
/*
 * libFuzzer target: a fair limit's table (src/fair/fair.c) over damaged
 * bytes.
 *
 * The input is a table's bytes, laid from its first byte over a valid
 * table while a fair limit is attached to it, as when a process that can
 * write a shm_path file changes it under a running one.  The template
 * (16 entries, 4 seats each) holds 24 flows of several weights and
 * periods (both heaps and the active list populated, entries shared) and
 * 8 waiters in 5 queues, made by asynchronous waiters of a template
 * handle that stays attached to it (so their seats name live records).
 * A short input damages only the start.  Then every call must return:
 * stats, asynchronous waiters started and stepped, not-waiting
 * decisions (the full call and both bool calls), a waiting call with a
 * short deadline, and freeing (which removes the asynchronous seats).  A
 * second fair limit then attaches to the damaged bytes (the header's
 * checks) and, if it is let in, decides too.  The table is allocated at
 * its exact size, so ASan sees any read or write outside it; the
 * admissions of both are counted against the shared limit's own bound.
 *
 * The template's hash seed is fixed, so that its flows take the same
 * entries in every run (and the seed corpus holds the same flows as the
 * table it is laid over).
 * The fair limit's clock stands still while the template is made, then
 * runs SPEED times faster than real time, from the same start for every
 * input, so that a lock that looks held (it is
 * waited for by that clock) costs milliseconds, not seconds.
 * FUZZ_FAIR_SEEDS=DIR writes the template's bytes there
 * (tests/fuzz/corpus/fair/table).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <ratelimit.h>
#include <ratelimit_fair.h>

#include "../lib/hand_loop.h"

#define SLOTS 16u
#define QMAX 4u
#define HDR_SEED 24u /* the header's hash seed (src/fair/table.h) */
#define NOW (UINT64_C(1000) * RATE_NS_PER_S)
#define SPEED 64u
#define HOUR (UINT64_C(3600) * RATE_NS_PER_S)
#define MS UINT64_C(1000000)
#define POLICY "token-bucket 10/s burst=5"

static uint8_t *template;
static size_t total;
static rate_policy_t *policy;
static uint64_t t0; /* the real time the fair clock reads NOW at */
static bool frozen; /* making the template: the clock stays at NOW */
/* The template's fair limit, its limiter and loop: kept for the run, so
 * that the seats of its waiters name records that exist. */
static rate_fair_t *tmpl;
static rate_limiter_t *tmpl_lim;
static tloop_t tmpl_loop;

static void die(const char *what)
{
    fprintf(stderr, "fuzz_fair: %s\n", what);
    abort();
}

static uint64_t fast_now(void *ud)
{
    (void)ud;
    return frozen ? NOW : NOW + (rate_clock_monotonic_ns() - t0) * SPEED;
}

static void fast_sleep(void *ud, uint64_t ns)
{
    (void)ud;
    ns /= SPEED;
    struct timespec ts = {(time_t)(ns / RATE_NS_PER_S),
                          (long)(ns % RATE_NS_PER_S)};
    nanosleep(&ts, NULL);
}

static const rate_clock_t fast_clock = {.now_ns = fast_now,
                                        .sleep_ns = fast_sleep};

static rate_fair_config_t config_of(rate_limiter_t *lim)
{
    return (rate_fair_config_t){.limiter = lim, .key = "shared", .key_len = 6,
                                .slots = SLOTS, .queue_max = QMAX,
                                .clock = &fast_clock};
}

static rate_limiter_t *limiter(void)
{
    rate_limiter_config_t cfg = {0};
    rate_limiter_t *lim = NULL;
    cfg.policy = policy;
    if (rate_limiter_new(&cfg, &lim) != RATE_OK)
        die("no limiter");
    return lim;
}

/* An asynchronous answer: admissions are counted. */
static void answered(void *ud, int rc, const rate_decision_t *d)
{
    uint64_t *admitted = ud;
    if (admitted != NULL && rc == RATE_OK && d->allowed)
        (*admitted)++;
}

static void start(rate_fair_t *f, rate_loop_t *loop, const char *flow,
                  uint32_t weight, uint64_t *admitted)
{
    rate_decision_t d;
    int rc = rate_fair_acquire_start(f, loop, flow, strlen(flow), weight, 1,
                                     HOUR, &d, answered, admitted);
    if (rc == RATE_OK && d.allowed && admitted != NULL)
        (*admitted)++;
}

/* The template: flows in two periods, more of them than entries, then
 * waiters behind a shared limit left empty. */
int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    char err[256] = "", flow[16];
    frozen = true;
    total = rate_fair_size(SLOTS, QMAX);
    template = aligned_alloc(64, total);
    uint8_t *mem = aligned_alloc(64, total);
    if (template == NULL || mem == NULL)
        die("out of memory");
    if (rate_policy_parse(POLICY, &policy, err, sizeof err) != RATE_OK ||
        rate_fair_init_in(mem, total, SLOTS, QMAX, err, sizeof err) !=
            RATE_OK)
        die(err);
    uint64_t seed = 0x5eed5eed5eed5eedu; /* the flows' entries, every run */
    memcpy(mem + HDR_SEED, &seed, sizeof seed);
    tmpl_lim = limiter();
    rate_fair_config_t fc = config_of(tmpl_lim);
    if (rate_fair_new_in(&fc, mem, total, &tmpl, err, sizeof err) != RATE_OK)
        die(err);
    rate_decision_t d;
    for (int i = 0; i < 24; i++) {
        snprintf(flow, sizeof flow, "f%d", i);
        uint64_t at = i < 8 ? NOW - 2 * RATE_NS_PER_S : NOW;
        if (rate_fair_check_at(tmpl, flow, strlen(flow), (uint32_t)(i % 4),
                               (uint64_t)(1 + i % 3), at, &d) != RATE_OK)
            die("a template decision failed");
    }
    rate_loop_t loop = loop_of(&tmpl_loop);
    for (int i = 0; i < 8; i++) {
        snprintf(flow, sizeof flow, "w%d", i % 5);
        start(tmpl, &loop, flow, (uint32_t)(1 + i % 3), NULL);
    }
    rate_fair_stats_t st;
    if (rate_fair_stats(tmpl, &st) != RATE_OK || st.waiting != 8)
        die("the template's waiters are not waiting");
    memcpy(template, mem, total);
    frozen = false;
    const char *dir = getenv("FUZZ_FAIR_SEEDS");
    if (dir != NULL) {
        char path[512];
        snprintf(path, sizeof path, "%s/table", dir);
        FILE *out = fopen(path, "wb");
        if (out == NULL || fwrite(template, 1, total, out) != total)
            die("cannot write the seed");
        fclose(out);
    }
    return 0;
}

/* Fires what the loop has: the watch, then each armed timer once. */
static void turn(tloop_t *l)
{
    if (l->io_fn != NULL)
        l->io_fn(l->io_arg, RATE_LOOP_READ);
    for (int i = 0; i < HAND_LOOP_TIMERS; i++)
        if (l->t[i].used && l->t[i].armed) {
            l->t[i].armed = false;
            l->t[i].fn(l->t[i].arg);
        }
}

static void expect(int rc, const char *what)
{
    if (rc != RATE_OK && rc != RATE_PENDING && rc != RATE_ECORRUPT &&
        rc != RATE_ETIMEDOUT && rc != RATE_ESTORE) {
        fprintf(stderr, "fuzz_fair: %s: %s\n", what, rate_err_name(rc));
        abort();
    }
}

/* Every call on the damaged table through f: each must return. */
static void use(rate_fair_t *f, tloop_t *l, bool all, uint64_t *admitted)
{
    rate_loop_t loop = loop_of(l);
    rate_fair_stats_t st;
    rate_decision_t d;
    char flow[16];

    expect(rate_fair_stats(f, &st), "stats");
    for (int i = 0; i < (all ? 3 : 1); i++) {
        snprintf(flow, sizeof flow, "w%d", i);
        start(f, &loop, flow, (uint32_t)(i + 1), admitted);
    }
    turn(l);
    for (int i = 0; i < (all ? 14 : 5); i++) {
        snprintf(flow, sizeof flow, "f%d", i * 3);
        size_t n = strlen(flow);
        int rc = rate_fair_check_at(f, flow, n, (uint32_t)(i % 5),
                                    (uint64_t)(1 + i % 3),
                                    fast_now(NULL), &d);
        expect(rc, "check");
        *admitted += rc == RATE_OK && d.allowed;
        *admitted += rate_fair_try_acquire(f, flow, n, 1, 1);
        *admitted += rate_fair_try_acquire_at(f, flow, n, 2, 1,
                                              fast_now(NULL));
    }
    if (all) {
        int rc = rate_fair_acquire(f, "w1", 2, 2, 1, 20 * MS, &d);
        expect(rc, "acquire");
        *admitted += rc == RATE_OK && d.allowed;
    }
    turn(l);
    expect(rate_fair_stats(f, &st), "stats");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t *region = aligned_alloc(64, total);
    tloop_t *l = calloc(2, sizeof *l);
    rate_fair_t *f = NULL, *again = NULL;
    char err[256] = "";
    uint64_t admitted = 0;

    if (region == NULL || l == NULL)
        die("out of memory");
    t0 = rate_clock_monotonic_ns();
    memcpy(region, template, total);
    rate_limiter_t *lim = limiter();
    rate_fair_config_t fc = config_of(lim);
    if (rate_fair_new_in(&fc, region, total, &f, err, sizeof err) != RATE_OK)
        die(err);
    memcpy(region, data, size < total ? size : total);
    use(f, &l[0], true, &admitted);
    /* The damaged header: refused with a message, or attached and used. */
    err[0] = '\0';
    int rc = rate_fair_new_in(&fc, region, total, &again, err, sizeof err);
    if (rc != RATE_OK && err[0] == '\0')
        die("an attach's error without a message");
    if (rc == RATE_OK)
        use(again, &l[1], false, &admitted);
    rate_fair_free(again);
    rate_fair_free(f);
    /* Never more than the shared limit: its burst and its refill over the
     * fair clock's time (every admission is the shared limiter's). */
    uint64_t elapsed = fast_now(NULL) - NOW;
    if (admitted > 5 + 10 * (elapsed / RATE_NS_PER_S + 1))
        die("more admitted than the shared limit holds");
    rate_limiter_free(lim);
    free(l);
    free(region);
    return 0;
}
