/* SPDX-License-Identifier: MIT */
/*
 * Fair shares on traffic of the shapes users have (docs/fair.md,
 * "Guarantees"): a heavy flow at 50 times the shared limit beside light
 * clients that come rarely at their own moments, page loads (a burst of
 * 10 to 30 requests from one client), cron jobs in step (many clients in
 * the same millisecond), a scraper that comes and goes, a daily ramp of
 * rare clients, and clients joining and leaving.  For each shape and each
 * algorithm that holds room, on the memory store and the shared-memory
 * store (the table in a file), the suite checks:
 *   - work-conserving: the fair limit admits at least 98% of what the
 *     same limit admits as one key, fed the same requests;
 *   - light flows get their demand: at least the share the table below
 *     states (the exceptions are docs/fair.md's: a sliding log keeps
 *     little room; a sliding window counter has none right after a full
 *     window begins, where cron jobs in step come);
 *   - the heavy flow still gets what the light ones leave.
 * Requests are the not-waiting call (rate_fair_check_at) at the trace's
 * times; the limit is 50 a second (a token bucket's burst 50).
 */
#include "lib/helpers.h"
#include "lib/fair_shapes.h"
#include "lib/tmpdir.h"
#include <stdlib.h>
#include <unistd.h>
#include "ratelimit_fair.h"
#include "ratelimit_shm.h"

#define L 50u
#define SPAN (30 * SEC) /* each trace's length */

static shape_trace_t trace;

typedef struct counts {
    uint64_t total, heavy, light, light_asked;
} counts_t;

static rate_store_t *store_of(bool shm)
{
    if (!shm)
        return NULL;
    char region[128], err[256];
    rate_shm_options_t so = {.max_keys = 16, .state_max = 4096};
    rate_store_t *st = NULL;
    snprintf(region, sizeof region, "%s/region", test_dir);
    unlink(region);
    if (rate_store_shm_new(region, &so, &st, err, sizeof err) != RATE_OK)
        fail_msg("shm store: %s", err);
    return st;
}

/* The trace through a fair limit (fair) or as one key (not). */
static counts_t run(const char *policy, bool shm, bool fair)
{
    rate_policy_t *p = policy_of(policy);
    rate_store_t *st = store_of(shm);
    rate_limiter_config_t lc = {.policy = p, .store = st};
    rate_limiter_t *lim = NULL;
    assert_int_equal(rate_limiter_new(&lc, &lim), RATE_OK);
    rate_fair_t *f = NULL;
    char table[128], err[256];
    snprintf(table, sizeof table, "%s/table", test_dir);
    unlink(table);
    rate_fair_config_t fc = {.limiter = lim, .key = "shared", .key_len = 6,
                             .slots = 256, .queue_max = 1,
                             .shm_path = shm ? table : NULL};
    if (fair && rate_fair_new(&fc, &f, err, sizeof err) != RATE_OK)
        fail_msg("rate_fair_new: %s", err);
    counts_t c = {0};
    for (size_t i = 0; i < trace.n; i++) {
        char key[16];
        int n = snprintf(key, sizeof key, "k%u", trace.ev[i].key);
        rate_decision_t d;
        bool ok;
        if (fair) {
            assert_int_equal(rate_fair_check_at(f, key, (size_t)n, 1, 1,
                                                trace.ev[i].t, &d),
                             RATE_OK);
            ok = d.allowed;
        } else {
            ok = rate_try_acquire_len_at(lim, "shared", 6, 1, trace.ev[i].t);
        }
        c.total += ok;
        c.light_asked += trace.ev[i].light;
        if (trace.ev[i].light)
            c.light += ok;
        else
            c.heavy += ok;
    }
    rate_fair_free(f);
    rate_limiter_free(lim);
    rate_store_free(st);
    rate_policy_free(p);
    return c;
}

enum { TB, FW, SW, LOG, ALGOS };
static const char *policy_text[ALGOS] = {"token-bucket 50/s burst=50",
                                         "fixed-window 50/s",
                                         "sliding-window 50/s",
                                         "sliding-log 50/s"};

/* The least share of their demand the light flows get (percent), by
 * shape and algorithm: docs/fair.md's table, each a few points under
 * what the suite measures.  Pages on the two windows vary with the
 * table's random hash seed (over 60 tables: 62-74% and 42-51%), so their
 * bounds sit under the lowest seen.  A sliding log keeps at most L/50 permits of
 * room (one here); a sliding window counter has little room early in a
 * window after a full one, where a page's burst may come.  SHAPES_SURVEY=1
 * prints the table without failing. */
static const unsigned light_min[SHAPES][ALGOS] = {
    [SHAPE_RARE] = {95, 93, 92, 45},
    [SHAPE_PAGES] = {78, 55, 35, 8},
    [SHAPE_CRON] = {85, 85, 85, 8},
    [SHAPE_SCRAPER] = {95, 90, 90, 75},
    [SHAPE_DIURNAL] = {95, 95, 95, 50},
    [SHAPE_CHURN] = {95, 95, 94, 50},
};

static void shapes_on(bool shm)
{
    for (int s = 0; s < SHAPES; s++) {
        shape_make(&trace, (shape_t)s, L, SPAN);
        for (int a = 0; a < ALGOS; a++) {
            counts_t one = run(policy_text[a], shm, false);
            counts_t fr = run(policy_text[a], shm, true);
            unsigned pct = fr.light_asked
                               ? (unsigned)(100 * fr.light / fr.light_asked)
                               : 100;
            print_message("%s %-8s %-26s fair %5llu one key %5llu (%.3f); "
                          "light %llu of %llu (%u%%), heavy %llu\n",
                          shm ? "shm   " : "memory", shape_name[s],
                          policy_text[a], (unsigned long long)fr.total,
                          (unsigned long long)one.total,
                          (double)fr.total / (double)one.total,
                          (unsigned long long)fr.light,
                          (unsigned long long)fr.light_asked, pct,
                          (unsigned long long)fr.heavy);
            if (getenv("SHAPES_SURVEY") == NULL && fr.total * 100 < one.total * 98)
                fail_msg("%s %s: the fair limit admitted %llu, under 98%% "
                         "of one key's %llu", shape_name[s], policy_text[a],
                         (unsigned long long)fr.total,
                         (unsigned long long)one.total);
            if (getenv("SHAPES_SURVEY") == NULL && pct < light_min[s][a])
                fail_msg("%s %s: light flows got %u%% of their demand, "
                         "under %u%%", shape_name[s], policy_text[a], pct,
                         light_min[s][a]);
            /* what the light flows leave goes to the heavy one */
            if (fr.heavy + fr.light + L < one.total * 98 / 100)
                fail_msg("%s %s: the heavy flow got %llu", shape_name[s],
                         policy_text[a], (unsigned long long)fr.heavy);
        }
    }
}

static void memory_store(void **state)
{
    (void)state;
    shapes_on(false);
}

static void shm_store(void **state)
{
    (void)state;
    shapes_on(true);
}

/* A lone heavy flow gets the whole rate: the room kept for light flows
 * that never come costs a bucket its burst once, a window nothing. */
static void lone_heavy(void **state)
{
    (void)state;
    trace.n = 0;
    trace.span = SPAN;
    shape_heavy(&trace, L, 0, SPAN);
    for (int a = 0; a < ALGOS; a++) {
        counts_t one = run(policy_text[a], false, false);
        counts_t fr = run(policy_text[a], false, true);
        uint64_t slack = a == TB ? L : 0; /* the burst, once */
        if (fr.total + slack < one.total)
            fail_msg("%s: a lone flow got %llu of %llu", policy_text[a],
                     (unsigned long long)fr.total,
                     (unsigned long long)one.total);
    }
}

TEST_DIR_SETUP("test_fair_shapes")

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(lone_heavy),
        cmocka_unit_test(memory_store),
        cmocka_unit_test(shm_store),
    };
    return cmocka_run_group_tests(tests, test_dir_setup, test_dir_teardown);
}
