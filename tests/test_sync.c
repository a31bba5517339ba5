/* SPDX-License-Identifier: MIT */
/*
 * The synced mode on caller-supplied times, over a memory store or the
 * compare-and-set test store as the remote: the leases, the bound P x L
 * measured where it is reached, the undershoot exactly, the give-back,
 * the cached denial, the remote failing and coming back, max_keys, and
 * bad input.  "Processes" here are synced limiters on one remote: each
 * keeps its own leases, as a process does.
 */
#include "lib/helpers.h"
#include "lib/shm_mem.h"
#include "lib/wait.h"

#include <pthread.h>
#include <unistd.h>
#include "ratelimit_synced.h"

static rate_synced_t *synced(const char *text, rate_store_t *remote,
                             rate_synced_config_t c)
{
    rate_policy_t *p = policy_of(text);
    rate_synced_t *s = NULL;
    char err[256] = "";
    c.policy = p;
    c.remote = remote;
    int rc = rate_synced_new(&c, &s, err, sizeof err);
    if (rc != RATE_OK)
        fail_msg("rate_synced_new: %s", err);
    rate_policy_free(p); /* copied */
    return s;
}

static rate_synced_t *synced_l(const char *text, rate_store_t *remote,
                               uint64_t lease)
{
    rate_synced_config_t c = {0};
    c.lease = lease;
    c.lease_ttl_ns = 10 * SEC;
    return synced(text, remote, c);
}

static rate_decision_t sat(rate_synced_t *s, const char *key, uint64_t n,
                           uint64_t t)
{
    rate_decision_t d;
    assert_int_equal(rate_synced_check_at(s, key, strlen(key), n, t, &d),
                     RATE_OK);
    return d;
}

static rate_synced_stats_t stats(rate_synced_t *s)
{
    rate_synced_stats_t st;
    assert_int_equal(rate_synced_stats(s, &st), RATE_OK);
    return st;
}

/* The room the remote has left for key at t (a query). */
static uint64_t room(rate_store_t *remote, const char *text, const char *key,
                     uint64_t t)
{
    rate_limiter_t *l = limiter_of(text, remote);
    rate_decision_t d = at(l, key, t, 0, 0);
    rate_limiter_free(l);
    return d.remaining;
}

/* One round trip per lease: 1000 decisions at L = 10 make 100 borrows,
 * and the remote's room is what was borrowed. */
static void leases_make_the_round_trips(void **state)
{
    (void)state;
    const char *pol = "fixed-window 100000/h";
    rate_store_t *m = NULL;
    assert_int_equal(rate_store_memory_new(NULL, &m), RATE_OK);
    rate_synced_t *s = synced_l(pol, m, 10);
    assert_int_equal(rate_synced_lease(s), 10);
    for (int i = 0; i < 1000; i++)
        assert_true(sat(s, "k", 1, SEC + (uint64_t)i).allowed);
    rate_synced_stats_t st = stats(s);
    assert_int_equal(st.decisions, 1000);
    assert_int_equal(st.allowed, 1000);
    assert_int_equal(st.round_trips, 100);
    assert_int_equal(st.local, 900);
    assert_int_equal(st.borrowed, 1000);
    assert_int_equal(st.held, 0);
    assert_int_equal(room(m, pol, "k", 2 * SEC), 100000 - 1000);
    /* 3 more: one borrow of 10, 7 held; a query reports them */
    for (int i = 0; i < 3; i++)
        assert_true(sat(s, "k", 1, 2 * SEC).allowed);
    assert_int_equal(sat(s, "k", 0, 2 * SEC).remaining, 7);
    /* a request of 7 is covered; one of 8 then tops up to 10 first */
    assert_true(sat(s, "k", 7, 2 * SEC).allowed);
    assert_int_equal(stats(s).held, 0);
    rate_decision_t d = sat(s, "k", 8, 2 * SEC);
    assert_true(d.allowed);
    assert_int_equal(d.remaining, 2);
    /* above the lease: straight to the remote */
    uint64_t rt = stats(s).round_trips;
    assert_true(sat(s, "k", 11, 2 * SEC).allowed);
    assert_int_equal(stats(s).round_trips, rt + 1);
    assert_int_equal(stats(s).held, 2);
    /* the clean exit gives the 2 back */
    rate_synced_free(s);
    assert_int_equal(room(m, pol, "k", 2 * SEC), 100000 - 1000 - 3 - 7 - 8 - 11);
    rate_store_free(m);
}

/* The overshoot bound P x L, reached: P processes each hold L - 1 when a
 * fixed window rolls, and the next window admits N + P(L - 1) while no
 * interval from the cold start admits more than the remote's exact bound. */
#define P 4
#define LEASE 10
#define N 100
static void overshoot_is_at_most_p_times_lease(void **state)
{
    (void)state;
    const char *pol = "fixed-window 100/s";
    rate_store_t *m = NULL;
    assert_int_equal(rate_store_memory_new(NULL, &m), RATE_OK);
    rate_synced_t *s[P];
    for (int p = 0; p < P; p++)
        s[p] = synced_l(pol, m, LEASE);
    uint64_t w0 = 0, w1 = 0, t0 = 900 * MS, t1 = SEC;
    /* window 0, late: process 0 takes N - P*L, then each takes 1 */
    for (int i = 0; i < N - P * LEASE; i++)
        w0 += sat(s[0], "k", 1, t0).allowed;
    for (int p = 0; p < P; p++)
        w0 += sat(s[p], "k", 1, t0).allowed;
    assert_int_equal(w0, N - P * LEASE + P);
    /* window 1: everyone asks until denied */
    for (int p = 0; p < P; p++)
        for (int i = 0; i < 2 * N; i++)
            w1 += sat(s[p], "k", 1, t1).allowed;
    uint64_t bound = N + P * LEASE;
    if (w1 > bound)
        fail_msg("window 1 admitted %llu > N + P*L = %llu",
                 (unsigned long long)w1, (unsigned long long)bound);
    /* measured: exactly what the processes held, P(L - 1) */
    assert_int_equal(w1, N + P * (LEASE - 1));
    /* from the cold start: the remote's exact bound, 2N */
    assert_true(w0 + w1 <= 2 * N);
    for (int p = 0; p < P; p++)
        rate_synced_free(s[p]);
    rate_store_free(m);
}

/* Undershoot, exactly: P - 1 processes hold L - 1 each, so the demand
 * offered to process 0 is admitted N - (P-1)(L-1) - (P-1) ... until they
 * exit cleanly and hand back, when process 0 gets the rest: N in all,
 * what the exact algorithm admits. */
static void undershoot_is_what_others_hold(void **state)
{
    (void)state;
    const char *pol = "fixed-window 100/h";
    rate_store_t *m = NULL;
    assert_int_equal(rate_store_memory_new(NULL, &m), RATE_OK);
    rate_synced_t *s[P];
    for (int p = 0; p < P; p++)
        s[p] = synced_l(pol, m, LEASE);
    uint64_t admitted = 0, t = SEC;
    for (int p = 1; p < P; p++)
        admitted += sat(s[p], "k", 1, t).allowed;
    for (int i = 0; i < 3 * N; i++)
        admitted += sat(s[0], "k", 1, t).allowed;
    uint64_t held = stats(s[1]).held + stats(s[2]).held + stats(s[3]).held;
    assert_int_equal(held, (P - 1) * (LEASE - 1));
    assert_int_equal(admitted, N - held);
    assert_true(N - admitted <= P * LEASE); /* the stated undershoot */
    /* the exact algorithm on the same demand */
    rate_limiter_t *exact = limiter_of(pol, NULL);
    uint64_t x = 0;
    for (int i = 0; i < 3 * N + P - 1; i++)
        x += at(exact, "k", t, 1, 0).allowed;
    rate_limiter_free(exact);
    assert_int_equal(x, N);
    assert_int_equal(x - admitted, held);
    /* the others exit cleanly: process 0 gets what they held */
    for (int p = 1; p < P; p++)
        rate_synced_free(s[p]);
    /* process 0's denial is cached until its retry_after (the window's
     * end): what others handed back meanwhile is missed (the stated
     * undershoot of a cached denial), with no round trip */
    uint64_t rt = stats(s[0]).round_trips;
    assert_false(sat(s[0], "k", 1, t).allowed);
    assert_int_equal(stats(s[0]).round_trips, rt);
    /* dropping it (flush all, or denial_ttl_ns) asks the remote again */
    assert_int_equal(rate_synced_flush_at(s[0], t, true), RATE_OK);
    for (int i = 0; i < 3 * N; i++)
        admitted += sat(s[0], "k", 1, t).allowed;
    assert_int_equal(admitted, N);
    rate_synced_free(s[0]);
    assert_int_equal(room(m, pol, "k", t), 0);
    rate_store_free(m);
}

/* Random demand on a token bucket over time, P processes, several keys:
 * at every step the admitted total over [0, t] stays within the remote's
 * exact bound (B + rate x t per key, from the cold start), and at the end
 * the exact algorithm on the same demand admits at most P x L per key
 * more than the synced processes did, once the leases are handed back and
 * the demand is offered again. */
static uint64_t lcg(uint64_t *x)
{
    *x = *x * 6364136223846793005u + 1442695040888963407u;
    return *x >> 33;
}

static void random_demand_within_the_bound(void **state)
{
    (void)state;
    const char *pol = "token-bucket 50/s burst=40";
    rate_store_t *m = NULL;
    assert_int_equal(rate_store_memory_new(NULL, &m), RATE_OK);
    const char *keys[3] = {"a", "b", "c"};
    for (uint64_t seed = 1; seed <= 10; seed++) {
        rate_synced_t *s[P];
        for (int p = 0; p < P; p++) {
            rate_synced_config_t c = {0};
            c.lease = 1 + seed % 8;
            c.lease_ttl_ns = 200 * MS;
            s[p] = synced(pol, m, c);
        }
        rate_limiter_t *exact = limiter_of(pol, NULL);
        uint64_t x = seed, got[3] = {0}, ex[3] = {0}, t = 0;
        static uint64_t times[3][4000], cum[3][4001];
        size_t nt[3] = {0};
        uint64_t base = seed * 1000 * SEC; /* a fresh start for each seed */
        for (int i = 0; i < 4000; i++) {
            t += lcg(&x) % (2 * MS);
            int k = (int)(lcg(&x) % 3), p = (int)(lcg(&x) % P);
            uint64_t n = 1 + lcg(&x) % 3;
            bool ok = sat(s[p], keys[k], n, base + t).allowed;
            got[k] += ok ? n : 0;
            if (ok) {
                times[k][nt[k]] = t;
                cum[k][nt[k] + 1] = cum[k][nt[k]] + n;
                nt[k]++;
            }
            ex[k] += at(exact, keys[k], base + t, n, 0).allowed ? n : 0;
            uint64_t bound = 40 + t * 50 / SEC + 1;
            if (got[k] > bound)
                fail_msg("seed %llu: key %s admitted %llu > %llu",
                         (unsigned long long)seed, keys[k],
                         (unsigned long long)got[k],
                         (unsigned long long)bound);
            if (i % 500 == 0)
                for (int q = 0; q < P; q++)
                    rate_synced_flush_at(s[q], base + t, false);
        }
        uint64_t slack = P * rate_synced_lease(s[0]);
        for (int k = 0; k < 3; k++) {
            if (ex[k] > got[k] + slack || got[k] > ex[k] + slack)
                fail_msg("seed %llu: key %s exact %llu synced %llu, P*L %llu",
                         (unsigned long long)seed, keys[k],
                         (unsigned long long)ex[k],
                         (unsigned long long)got[k],
                         (unsigned long long)slack);
            /* every interval: at most B + rate x D + P x L */
            for (size_t i = 0; i < nt[k]; i++)
                for (size_t j = i; j < nt[k]; j++) {
                    uint64_t d = times[k][j] - times[k][i];
                    uint64_t b = 40 + (d * 50 + SEC - 1) / SEC + slack;
                    if (cum[k][j + 1] - cum[k][i] > b)
                        fail_msg("seed %llu: key %s admitted %llu in %llu "
                                 "ns > %llu", (unsigned long long)seed,
                                 keys[k],
                                 (unsigned long long)(cum[k][j + 1] -
                                                      cum[k][i]),
                                 (unsigned long long)d,
                                 (unsigned long long)b);
                }
        }
        for (int p = 0; p < P; p++)
            rate_synced_free(s[p]);
        rate_limiter_free(exact);
    }
    rate_store_free(m);
}

/* The same on windows of N = 60 per W = 100 ms: a fixed window admits at
 * most N + P x L in each window, a sliding log at most N + P x L in any
 * span shorter than W; and from the cold start, the first window at most
 * N.  (A sliding log's unused permits are dropped, not refunded: its
 * undershoot is not compared with the exact algorithm here.) */
static void random_demand_on_windows(void **state)
{
    (void)state;
    const char *pols[2] = {"fixed-window 60/100ms", "sliding-log 60/100ms"};
    const uint64_t W = 100 * MS, WN = 60;
    static uint64_t times[4000], cum[4001];
    for (int pi = 0; pi < 2; pi++)
        for (uint64_t seed = 1; seed <= 6; seed++) {
            rate_store_t *m = NULL;
            assert_int_equal(rate_store_memory_new(NULL, &m), RATE_OK);
            rate_synced_t *s[P];
            for (int p = 0; p < P; p++) {
                rate_synced_config_t c = {0};
                c.lease = 1 + seed % 6;
                c.lease_ttl_ns = 30 * MS;
                s[p] = synced(pols[pi], m, c);
            }
            uint64_t x = seed, t = 0, slack = P * rate_synced_lease(s[0]);
            size_t nt = 0;
            for (int i = 0; i < 4000; i++) {
                t += lcg(&x) % (MS / 2);
                int p = (int)(lcg(&x) % P);
                uint64_t n = 1 + lcg(&x) % 2;
                if (sat(s[p], "k", n, W + t).allowed) {
                    times[nt] = t;
                    cum[nt + 1] = cum[nt] + n;
                    nt++;
                }
            }
            for (size_t i = 0; i < nt; i++)
                for (size_t j = i; j < nt; j++) {
                    uint64_t got = cum[j + 1] - cum[i];
                    bool same = pi == 0 ? (W + times[i]) / W ==
                                              (W + times[j]) / W
                                        : times[j] - times[i] < W;
                    if (same && got > WN + slack)
                        fail_msg("%s seed %llu: %llu admitted in one "
                                 "window > WN + P*L = %llu", pols[pi],
                                 (unsigned long long)seed,
                                 (unsigned long long)got,
                                 (unsigned long long)(WN + slack));
                    if (same && i == 0 && got > WN) /* the cold start */
                        fail_msg("%s seed %llu: %llu admitted in the first "
                                 "window > WN", pols[pi],
                                 (unsigned long long)seed,
                                 (unsigned long long)got);
                }
            assert_true(nt > 100); /* the demand was served at all */
            for (int p = 0; p < P; p++)
                rate_synced_free(s[p]);
            rate_store_free(m);
        }
}

/* A hot denied key costs no round trips until its retry_after, which is
 * exact: retrying then succeeds. */
static void denial_cached_until_retry_after(void **state)
{
    (void)state;
    rate_store_t *m = NULL;
    assert_int_equal(rate_store_memory_new(NULL, &m), RATE_OK);
    rate_synced_t *s = synced_l("token-bucket 10/s burst=10", m, 5);
    for (int i = 0; i < 10; i++)
        assert_true(sat(s, "k", 1, SEC).allowed);
    rate_decision_t d = sat(s, "k", 1, SEC);
    assert_false(d.allowed);
    assert_int_equal(d.reason, RATE_REASON_LIMITED);
    assert_int_equal(d.retry_after_ns, 100 * MS); /* one token: exact */
    uint64_t rt = stats(s).round_trips;
    for (int i = 0; i < 1000; i++) {
        d = sat(s, "k", 1, SEC + 50 * MS);
        assert_false(d.allowed);
        assert_int_equal(d.retry_after_ns, 50 * MS);
    }
    assert_int_equal(stats(s).round_trips, rt); /* all local */
    d = sat(s, "k", 1, SEC + 100 * MS);
    assert_true(d.allowed);
    /* denial_ttl_ns caps how long a denial is cached */
    rate_synced_config_t c = {0};
    c.lease = 5;
    c.denial_ttl_ns = 10 * MS;
    rate_synced_t *s2 = synced("token-bucket 10/s burst=10", m, c);
    d = sat(s2, "k", 1, SEC + 100 * MS); /* the bucket is empty */
    assert_false(d.allowed);
    assert_int_equal(d.retry_after_ns, 100 * MS);
    rt = stats(s2).round_trips;
    assert_false(sat(s2, "k", 1, SEC + 109 * MS).allowed);
    assert_int_equal(stats(s2).round_trips, rt);
    assert_false(sat(s2, "k", 1, SEC + 110 * MS).allowed);
    assert_true(stats(s2).round_trips > rt); /* asked again */
    rate_synced_free(s2);
    /* short of a lease, it borrows what the remote has (1 token) */
    assert_int_equal(stats(s).held, 0);
    /* 400 ms later: 4 tokens, a lease of 5 is short: takes the 4 */
    assert_true(sat(s, "k", 1, SEC + 500 * MS).allowed);
    assert_int_equal(stats(s).held, 3);
    rate_synced_free(s);
    rate_store_free(m);
}

/* Leases older than lease_ttl are handed back by flush, and by the next
 * decision on the key; the remote's room is then what was spent. */
static void expired_leases_go_back(void **state)
{
    (void)state;
    const char *pol = "token-bucket 1/h burst=100";
    rate_store_t *m = NULL;
    assert_int_equal(rate_store_memory_new(NULL, &m), RATE_OK);
    rate_synced_config_t c = {0};
    c.lease = 20;
    c.lease_ttl_ns = SEC;
    rate_synced_t *s = synced(pol, m, c);
    assert_true(sat(s, "a", 1, SEC).allowed);
    assert_true(sat(s, "b", 1, SEC).allowed);
    assert_int_equal(room(m, pol, "a", SEC), 80);
    assert_int_equal(rate_synced_flush_at(s, SEC + SEC / 2, false), RATE_OK);
    assert_int_equal(stats(s).keys, 2); /* not yet due */
    assert_int_equal(rate_synced_flush_at(s, 2 * SEC, false), RATE_OK);
    assert_int_equal(stats(s).keys, 0);
    assert_int_equal(stats(s).returned, 38);
    assert_int_equal(room(m, pol, "a", 2 * SEC), 99);
    assert_int_equal(room(m, pol, "b", 2 * SEC), 99);
    /* at a decision: the old lease's 19 go back before a new one */
    assert_true(sat(s, "a", 1, 3 * SEC).allowed);
    assert_true(sat(s, "a", 1, 5 * SEC).allowed);
    assert_int_equal(room(m, pol, "a", 5 * SEC), 78);
    rate_synced_free(s);
    assert_int_equal(room(m, pol, "a", 5 * SEC), 97);
    rate_store_free(m);
}

/* Sliding policies are never refunded: their unused permits are lost
 * (counted), never over-admitted. */
static void sliding_leases_are_dropped(void **state)
{
    (void)state;
    const char *pol = "sliding-log 50/h";
    rate_store_t *m = NULL;
    assert_int_equal(rate_store_memory_new(NULL, &m), RATE_OK);
    rate_synced_t *s = synced_l(pol, m, 10);
    assert_true(sat(s, "k", 1, SEC).allowed);
    rate_synced_free(s);
    assert_int_equal(room(m, pol, "k", SEC), 40);
    s = synced_l(pol, m, 10);
    assert_true(sat(s, "k", 1, SEC).allowed);
    assert_int_equal(rate_synced_flush_at(s, SEC, true), RATE_OK);
    rate_synced_stats_t st = stats(s);
    assert_int_equal(st.lost, 9);
    assert_int_equal(st.returned, 0);
    rate_synced_free(s);
    rate_store_free(m);
}

/* The remote down: leases held are still spent, the rest follows the
 * fail mode, the remote is not asked for retry_ns, and it is asked again
 * after: recovery by itself. */
static void remote_down_then_back(void **state)
{
    (void)state;
    const char *pol = "fixed-window 1000/h";
    rate_fail_mode_t modes[3] = {RATE_FAIL_CLOSED, RATE_FAIL_OPEN,
                                 RATE_FAIL_FALLBACK};
    for (int mi = 0; mi < 3; mi++) {
        rate_store_t *cs = NULL;
        cas_store_t *h = NULL;
        assert_int_equal(cas_store_new(&cs, &h), RATE_OK);
        rate_synced_config_t c = {0};
        c.lease = 10;
        c.lease_ttl_ns = 100 * SEC;
        c.retry_ns = SEC;
        c.on_store_error = modes[mi];
        rate_synced_t *s = synced(pol, cs, c);
        assert_true(sat(s, "k", 1, SEC).allowed); /* 9 held */
        cas_store_set_down(h, 1);
        for (int i = 0; i < 9; i++)
            assert_true(sat(s, "k", 1, SEC).allowed);
        uint64_t rt = stats(s).round_trips;
        rate_decision_t d = sat(s, "k", 1, SEC);
        assert_int_equal(d.reason, RATE_REASON_STORE_ERROR);
        assert_int_equal(d.allowed, modes[mi] != RATE_FAIL_CLOSED);
        assert_int_equal(stats(s).round_trips, rt + 1);
        assert_int_equal(stats(s).remote_errors, 1);
        /* within retry_ns: not asked */
        for (int i = 0; i < 100; i++) {
            d = sat(s, "k", 1, SEC + 500 * MS);
            assert_int_equal(d.reason, RATE_REASON_STORE_ERROR);
        }
        assert_int_equal(stats(s).round_trips, rt + 1);
        assert_int_equal(stats(s).fail_mode, 101);
        cas_store_set_down(h, 0);
        d = sat(s, "k", 1, 2 * SEC + 1);
        assert_true(d.allowed);
        assert_int_equal(d.reason, RATE_REASON_ALLOWED);
        assert_int_equal(stats(s).round_trips, rt + 2);
        rate_synced_free(s);
        rate_store_free(cs);
    }
}

/* At most max_keys entries; an evicted key's lease goes back. */
static void max_keys_bounds_memory(void **state)
{
    (void)state;
    const char *pol = "fixed-window 100/h";
    rate_store_t *m = NULL;
    assert_int_equal(rate_store_memory_new(NULL, &m), RATE_OK);
    rate_synced_config_t c = {0};
    c.lease = 10;
    c.lease_ttl_ns = 100 * SEC;
    c.max_keys = 8;
    rate_synced_t *s = synced(pol, m, c);
    char key[16];
    for (int i = 0; i < 100; i++) {
        snprintf(key, sizeof key, "k%d", i);
        assert_true(sat(s, key, 1, SEC).allowed);
        assert_true(stats(s).keys <= 8);
    }
    rate_synced_stats_t st = stats(s);
    assert_int_equal(st.evictions, 100 - st.keys);
    assert_int_equal(st.returned, 9 * st.evictions);
    uint64_t left = 0;
    for (int i = 0; i < 100; i++) {
        snprintf(key, sizeof key, "k%d", i);
        left += room(m, pol, key, SEC);
    }
    assert_int_equal(left, 100 * 99 - 9 * st.keys); /* the held: 9 each */
    rate_synced_free(s);
    left = 0;
    for (int i = 0; i < 100; i++) {
        snprintf(key, sizeof key, "k%d", i);
        left += room(m, pol, key, SEC);
    }
    assert_int_equal(left, 100 * 99);
    rate_store_free(m);
}

static void bad_input_named(void **state)
{
    (void)state;
    rate_store_t *m = NULL;
    assert_int_equal(rate_store_memory_new(NULL, &m), RATE_OK);
    rate_synced_config_t c = {0};
    rate_synced_t *s = NULL;
    char err[256];
    assert_int_equal(rate_synced_new(NULL, &s, err, sizeof err), RATE_EINVAL);
    assert_int_equal(rate_synced_new(&c, &s, err, sizeof err), RATE_EINVAL);
    assert_non_null(strstr(err, "policy"));
    rate_policy_t *p = policy_of("token-bucket 10/s burst=5");
    c.policy = p;
    assert_int_equal(rate_synced_new(&c, &s, err, sizeof err), RATE_EINVAL);
    assert_non_null(strstr(err, "remote"));
    c.remote = m;
    c.lease = 6;
    assert_int_equal(rate_synced_new(&c, &s, err, sizeof err), RATE_EINVAL);
    assert_non_null(strstr(err, "lease 6 is above the policy's capacity 5"));
    assert_null(s);
    c.lease = 0; /* the default: min(16, 5) */
    assert_int_equal(rate_synced_new(&c, &s, err, sizeof err), RATE_OK);
    assert_int_equal(rate_synced_lease(s), 5);
    rate_decision_t d;
    assert_int_equal(rate_synced_check(s, NULL, 1, 1, &d), RATE_EKEY);
    assert_int_equal(rate_synced_check(s, "k", 0, 1, &d), RATE_EKEY);
    assert_int_equal(rate_synced_check(s, "k", RATE_KEY_MAX + 1, 1, &d),
                     RATE_EKEY);
    assert_int_equal(rate_synced_check(s, "k", 1, RATE_TIME_MAX + 1, &d),
                     RATE_ERANGE);
    assert_int_equal(rate_synced_check_at(s, "k", 1, 1, RATE_TIME_MAX + 1, &d),
                     RATE_ERANGE);
    assert_int_equal(rate_synced_check(s, "k", 1, 1, NULL), RATE_EINVAL);
    assert_int_equal(rate_synced_check(NULL, "k", 1, 1, &d), RATE_EINVAL);
    assert_false(rate_synced_try_acquire(NULL, "k", 1, 1));
    assert_int_equal(rate_synced_flush(NULL, true), RATE_EINVAL);
    assert_int_equal(rate_synced_stats(s, NULL), RATE_EINVAL);
    rate_synced_free(s);
    rate_synced_free(NULL);
    rate_policy_free(p);
    c.policy = p = policy_of("fixed-window 10/s block=1m");
    assert_int_equal(rate_synced_new(&c, &s, err, sizeof err), RATE_EPOLICY);
    assert_non_null(strstr(err, "block="));
    rate_policy_free(p);
    assert_int_equal(rate_policy_unlimited(&p), RATE_OK);
    c.policy = p;
    assert_int_equal(rate_synced_new(&c, &s, err, sizeof err), RATE_EPOLICY);
    assert_non_null(strstr(err, "unlimited"));
    rate_policy_free(p);
    rate_store_free(m);
}

/* A key the remote refuses as the caller's (reserved, or longer than a
 * shared-memory remote's key_max) is RATE_EKEY, *out zeroed, and never a
 * remote failure: the next key is decided by the remote as usual, not by
 * the fail mode for retry_ns. */
static void bad_key_is_no_remote_failure(void **state)
{
    (void)state;
    rate_shm_options_t o = {.max_keys = 64, .key_max = 16};
    void *mem = NULL;
    rate_store_t *shm = shm_mem_new(&o, &mem);
    rate_synced_t *s = synced_l("token-bucket 10/s burst=10", shm, 4);
    static const char reserved[] = RATE_KEY_RESERVED "\0k"; /* 8 + 1 */
    const char *longkey = "a key longer than sixteen bytes";
    rate_decision_t d;
    for (int i = 0; i < 2; i++) {
        uint64_t n = i == 0 ? 1 : 8; /* from a lease; then direct (> L) */
        memset(&d, 0xff, sizeof d);
        assert_int_equal(rate_synced_check_at(s, reserved, sizeof reserved - 1,
                                              n, SEC, &d),
                         RATE_EKEY);
        assert_false(d.allowed);
        assert_int_equal(d.error, 0);
        assert_int_equal(rate_synced_check_at(s, longkey, strlen(longkey), n,
                                              SEC, &d),
                         RATE_EKEY);
        assert_false(d.allowed);
        d = sat(s, i == 0 ? "k1" : "k2", n, SEC);
        assert_true(d.allowed);
        assert_int_equal(d.reason, RATE_REASON_ALLOWED);
    }
    rate_synced_stats_t st = stats(s);
    assert_int_equal(st.remote_errors, 0);
    assert_int_equal(st.fail_mode, 0);
    assert_int_equal(st.decisions, 2);
    assert_int_equal(st.keys, 1); /* k1's lease; no entry for a bad key */
    rate_synced_free(s);
    rate_store_free(shm);
    free(mem);
}

/* Threads on one synced limiter (the concurrency label): on one key and
 * on many, the admitted total is the remote's exact count, and the clean
 * exit leaves the remote's room exactly N - admitted. */
#define THREADS 4
typedef struct worker {
    rate_synced_t *s;
    int id, keys;
    uint64_t admitted;
} worker_t;

static void *work(void *arg)
{
    worker_t *w = arg;
    char key[16];
    uint64_t x = (uint64_t)w->id + 1;
    for (int i = 0; i < 20000; i++) {
        snprintf(key, sizeof key, "k%d", (int)(lcg(&x) % (uint64_t)w->keys));
        rate_decision_t d;
        if (rate_synced_check_at(w->s, key, strlen(key), 1, SEC, &d) ==
                RATE_OK &&
            d.allowed)
            w->admitted++;
    }
    return NULL;
}

static void threads_share_one_limiter(void **state)
{
    (void)state;
    const char *pol = "fixed-window 3000/h";
    for (int keys = 1; keys <= 16; keys += 15) {
        rate_store_t *m = NULL;
        assert_int_equal(rate_store_memory_new(NULL, &m), RATE_OK);
        rate_synced_t *s[2];
        for (int p = 0; p < 2; p++) {
            rate_synced_config_t c = {0};
            c.lease = 25;
            c.lease_ttl_ns = 100 * SEC;
            c.sweep_ns = 5 * MS; /* a sweeper racing the decisions */
            s[p] = synced(pol, m, c);
        }
        pthread_t th[THREADS];
        worker_t w[THREADS];
        for (int i = 0; i < THREADS; i++) {
            w[i] = (worker_t){s[i % 2], i, keys, 0};
            pthread_create(&th[i], NULL, work, &w[i]);
        }
        uint64_t admitted = 0;
        for (int i = 0; i < THREADS; i++) {
            pthread_join(th[i], NULL);
            admitted += w[i].admitted;
        }
        uint64_t exact = 3000 * (uint64_t)keys;
        assert_true(admitted <= exact);
        uint64_t held = stats(s[0]).held + stats(s[1]).held;
        assert_int_equal(admitted + held, exact); /* all borrowed */
        rate_synced_free(s[0]);
        rate_synced_free(s[1]);
        uint64_t left = 0;
        char key[16];
        for (int k = 0; k < keys; k++) {
            snprintf(key, sizeof key, "k%d", k);
            left += room(m, pol, key, SEC);
        }
        assert_int_equal(left, exact - admitted);
        rate_store_free(m);
    }
}

/* prefetch: leases topped up by the refiller before they run out; on a
 * roomy policy, every decision local but the first (no waits is not
 * asserted: a loaded machine may starve the refiller), the round trips
 * about one per L/2; on a tight one, the exact count kept. */
typedef struct pworker {
    rate_synced_t *s;
    int attempts;
    uint64_t admitted;
} pworker_t;

static void *pwork(void *arg)
{
    pworker_t *w = arg;
    for (int i = 0; i < w->attempts; i++)
        w->admitted += rate_synced_try_acquire(w->s, "hot", 3, 1);
    return NULL;
}

static void prefetch_tops_leases_up(void **state)
{
    (void)state;
    struct {
        const char *pol;
        uint64_t exact, lease;
        int attempts;
    } cases[2] = {{"token-bucket 1/h burst=1000000000", 1000000000, 1000, 50000},
                  {"token-bucket 1/h burst=5000", 5000, 100, 5000}};
    for (int ci = 0; ci < 2; ci++) {
        rate_store_t *m = NULL;
        assert_int_equal(rate_store_memory_new(NULL, &m), RATE_OK);
        rate_synced_config_t c = {0};
        c.lease = cases[ci].lease;
        c.lease_ttl_ns = 3600 * SEC;
        c.prefetch = true;
        rate_synced_t *s = synced(cases[ci].pol, m, c);
        pthread_t th[2];
        pworker_t w[2];
        for (int i = 0; i < 2; i++) {
            w[i] = (pworker_t){s, cases[ci].attempts, 0};
            pthread_create(&th[i], NULL, pwork, &w[i]);
        }
        for (int i = 0; i < 2; i++)
            pthread_join(th[i], NULL);
        uint64_t admitted = w[0].admitted + w[1].admitted;
        rate_synced_stats_t st = stats(s);
        assert_int_equal(st.allowed, admitted);
        assert_true(st.held <= cases[ci].lease);
        if (ci == 0) {
            assert_int_equal(admitted, 2 * (uint64_t)cases[ci].attempts);
            /* a top-up each L/2, and the first borrow */
            assert_true(st.round_trips <=
                        2 * (uint64_t)cases[ci].attempts * 2 /
                                cases[ci].lease + 2);
        } else {
            assert_true(admitted <= cases[ci].exact);
        }
        rate_synced_free(s);
        /* the exit handed everything back: the remote counts exactly */
        assert_int_equal(room(m, cases[ci].pol, "hot",
                              rate_clock_monotonic_ns()),
                         cases[ci].exact - admitted);
        rate_store_free(m);
    }
}

/* The sweeper gives back leases of the clock calls once they are
 * lease_ttl old, with no call made (waits up to 5 s for it: a loaded
 * machine may be slow to run the thread, never faster than the ttl). */
static void sweeper_gives_back(void **state)
{
    (void)state;
    const char *pol = "token-bucket 1/h burst=100";
    rate_store_t *m = NULL;
    assert_int_equal(rate_store_memory_new(NULL, &m), RATE_OK);
    rate_synced_config_t c = {0};
    c.lease = 10;
    c.lease_ttl_ns = 20 * MS;
    c.sweep_ns = 5 * MS;
    rate_synced_t *s = synced(pol, m, c);
    uint64_t t0 = rate_clock_monotonic_ns();
    assert_true(rate_synced_try_acquire(s, "k", 1, 1));
    /* the entry leaves the table before its refund is counted */
    WAIT_UNTIL(stats(s).returned == 9, TEST_WAIT_S);
    rate_synced_stats_t st = stats(s);
    assert_int_equal(st.keys, 0);
    assert_int_equal(st.returned, 9);
    assert_true(rate_clock_monotonic_ns() - t0 >= 20 * MS);
    assert_int_equal(room(m, pol, "k", rate_clock_monotonic_ns()), 99);
    rate_synced_free(s);
    rate_store_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(leases_make_the_round_trips),
        cmocka_unit_test(overshoot_is_at_most_p_times_lease),
        cmocka_unit_test(undershoot_is_what_others_hold),
        cmocka_unit_test(random_demand_within_the_bound),
        cmocka_unit_test(random_demand_on_windows),
        cmocka_unit_test(denial_cached_until_retry_after),
        cmocka_unit_test(expired_leases_go_back),
        cmocka_unit_test(sliding_leases_are_dropped),
        cmocka_unit_test(remote_down_then_back),
        cmocka_unit_test(max_keys_bounds_memory),
        cmocka_unit_test(bad_input_named),
        cmocka_unit_test(bad_key_is_no_remote_failure),
        cmocka_unit_test(threads_share_one_limiter),
        cmocka_unit_test(prefetch_tops_leases_up),
        cmocka_unit_test(sweeper_gives_back),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
