/* SPDX-License-Identifier: MIT */
/*
 * Fair shares (docs/fair.md, "Internals"): the table's invariants, checked
 * by walking its structures after every step of random operations, and
 * after processes are SIGKILLed while deciding on a shared table (the
 * robust lock's repair).  White box: this file includes the fair table's
 * private headers (src/fair/table.h) to read the table.
 */
#include "lib/helpers.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fair/index.h"
#include "fair/table.h"
#include "fair/vtime.h"

#include "lib/hand_loop.h"
#include "lib/rng.h"

/* Every invariant of the table (lock held or no other user). */
static void table_check(rate_fair_t *f)
{
    fhdr_t *h = f->h;
    uint32_t n = f->slots, q = f->qmax;
    uint64_t total_w = 0, queued = 0, waiting = 0;
    uint32_t active = 0, queues = 0;
    assert_true(h->nactive <= n && h->nqueues <= n);
    for (uint32_t i = 0; i < h->nactive; i++) { /* heap by s */
        uint32_t e = f->aheap[i];
        assert_true(e < n);
        assert_int_equal(f->slot[e].apos, i + 1);
        if (i > 0)
            assert_true(f->slot[f->aheap[(i - 1) / 2]].s <= f->slot[e].s);
        assert_true(f->slot[e].s >= h->vtime);
        assert_true(f->slot[e].s - h->vtime <= LEAD_MAX);
    }
    if (h->nactive > 0)
        assert_true(f->slot[f->aheap[0]].s <= h->vtime ||
                    h->vtime == f->slot[f->aheap[0]].s);
    for (uint32_t i = 0; i < h->nqueues; i++) { /* heap by finish tag */
        uint32_t e = f->wheap[i];
        assert_true(e < n);
        assert_int_equal(f->slot[e].wpos, i + 1);
        assert_true(f->slot[e].qlen > 0);
        if (i > 0)
            assert_true(f->slot[f->wheap[(i - 1) / 2]].ftag <=
                        f->slot[e].ftag);
    }
    uint32_t prev = NIL; /* the active list, both ways */
    for (uint32_t i = h->lhead; i != NIL; i = f->slot[i - 1].lnext) {
        assert_true(i <= n);
        assert_int_equal(f->slot[i - 1].lprev, prev);
        assert_true(f->slot[i - 1].apos != NIL);
        prev = i;
        active++;
        assert_true(active <= h->nactive);
    }
    assert_int_equal(h->ltail, prev);
    assert_int_equal(active, h->nactive);
    for (uint32_t i = 0; i < n; i++) {
        const fslot_t *sl = &f->slot[i];
        if (sl->apos != NIL) {
            total_w += sl->weight;
            assert_true(sl->hash != 0);
        } else {
            assert_int_equal(sl->lprev, NIL);
            assert_int_equal(sl->lnext, NIL);
        }
        assert_true(sl->weight <= RATE_FAIR_WEIGHT_MAX);
        assert_true(sl->qlen <= q);
        /* a queue: distinct seats, tickets rising, the seats' sums */
        uint64_t qp = 0, last = 0, seats = 0;
        fqueue_t fq;
        assert_int_equal(queue_of(f, sl, &fq), RATE_OK);
        for (uint32_t k = 0; k < fq.len; k++) {
            fwait_t *w = NULL;
            assert_int_equal(queue_seat(f, sl, &fq, k, &w), RATE_OK);
            assert_true(w->ticket > last);
            last = w->ticket;
            qp += w->permits;
        }
        for (uint32_t k = 0; k < q; k++)
            seats += f->wait[(size_t)i * q + k].ticket != 0;
        assert_int_equal(seats, sl->qlen);
        assert_int_equal(qp, sl->qpermits);
        queued += qp;
        waiting += sl->qlen;
        if (sl->qlen > 0) {
            queues++;
            assert_true(sl->wpos != NIL);
            assert_true(sl->apos != NIL); /* a queue keeps its entry */
        } else {
            assert_int_equal(sl->wpos, NIL);
        }
    }
    assert_int_equal(total_w, h->total_w);
    assert_int_equal(queued, h->queued);
    assert_int_equal(waiting, h->waiting);
    assert_int_equal(queues, h->nqueues);
}

static void checked(rate_fair_t *f)
{
    assert_int_equal(rate__ft_lock(f), RATE_OK);
    table_check(f);
    rate__ft_unlock(f);
}

static uint64_t ck_now;
static uint64_t clock_now(void *ud) { (void)ud; return ck_now; }
static void clock_sleep(void *ud, uint64_t ns) { (void)ud; ck_now += ns; }

static int answered;
static void done_cb(void *ud, int rc, const rate_decision_t *d)
{
    (void)ud;
    (void)d;
    assert_true(rc == RATE_OK || rc == RATE_ECANCELED);
    answered++;
}

/* Random decisions, weights (0, 1, up to the maximum), permits, flows
 * past the table's capacity, times (jumps of several periods), and
 * asynchronous waiters answered in random order: after each step, every
 * invariant holds. */
static void random_ops(void **s)
{
    (void)s;
    rnd_seed(0);
    rate_limiter_t *lim = limiter_of("token-bucket 50/s burst=20", NULL);
    rate_clock_t clk = {.now_ns = clock_now, .sleep_ns = clock_sleep};
    rate_fair_config_t fc = {.limiter = lim, .key = "shared", .key_len = 6,
                             .slots = 16, .queue_max = 4, .clock = &clk};
    rate_fair_t *f = NULL;
    ck_now = SEC;
    assert_int_equal(rate_fair_new(&fc, &f, NULL, 0), RATE_OK);
    tloop_t *l = calloc(1, sizeof *l);
    rate_loop_t loop = loop_of(l);
    int started = 0;
    answered = 0;
    for (int step = 0; step < 20000; step++) {
        char key[16];
        int kn = snprintf(key, sizeof key, "f%u", (unsigned)rnd(40));
        uint32_t wsel = (uint32_t)rnd(4);
        uint32_t w = wsel == 0 ? 0 : wsel == 1 ? 1 : wsel == 2
                         ? (uint32_t)rnd(8) + 1 : RATE_FAIR_WEIGHT_MAX;
        uint64_t p = rnd(10) == 0 ? 25 : rnd(4);
        rate_decision_t d;
        switch (rnd(5)) {
        case 0:
            assert_int_equal(rate_fair_check_at(f, key, (size_t)kn, w, p,
                                                ck_now, &d), RATE_OK);
            break;
        case 1:
            (void)rate_fair_try_acquire_at(f, key, (size_t)kn, w, p, ck_now);
            break;
        case 2: {
            int rc = rate_fair_acquire_start(f, &loop, key, (size_t)kn, w, p,
                                             rnd(3) * SEC, &d,
                                             done_cb, NULL);
            assert_true(rc == RATE_OK || rc == RATE_PENDING);
            started += rc == RATE_PENDING;
            break;
        }
        case 3: { /* a loop turn: the watch, then some armed timers */
            if (l->io_fn != NULL)
                l->io_fn(l->io_arg, RATE_LOOP_READ);
            for (int i = 0; i < HAND_LOOP_TIMERS; i++)
                if (l->t[i].used && l->t[i].armed && rnd(2) == 0) {
                    l->t[i].armed = false;
                    l->t[i].fn(l->t[i].arg);
                }
            break;
        }
        default: /* time goes on: a little, or periods */
            ck_now += rnd(8) == 0 ? rnd(5) * SEC
                                              : rnd(100000000);
            break;
        }
        checked(f);
    }
    rate_fair_free(f); /* answers the waiters left */
    assert_int_equal(answered, started);
    free(l);
    rate_limiter_free(lim);
}

/* Children decide (and wait) on one shared table and are SIGKILLed at
 * random moments, some while holding its lock: the next call repairs the
 * table, which must then hold every invariant, and keep deciding. */
#define ROUNDS 100
static void killed_holders(void **s)
{
    (void)s;
    rnd_seed(0);
    char path[] = "/tmp/rate-fair-check-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    unlink(path);
    rate_limiter_t *lim = limiter_of("token-bucket 1000/s burst=50", NULL);
    rate_fair_config_t fc = {.limiter = lim, .key = "shared", .key_len = 6,
                             .slots = 16, .queue_max = 4, .shm_path = path};
    rate_fair_t *f = NULL;
    assert_int_equal(rate_fair_new(&fc, &f, NULL, 0), RATE_OK);
    for (int round = 0; round < ROUNDS; round++) {
        int pp[2];
        assert_int_equal(pipe(pp), 0);
        pid_t c = fork();
        assert_true(c >= 0);
        if (c == 0) {
            rate_fair_t *g = NULL;
            if (rate_fair_new(&fc, &g, NULL, 0) != RATE_OK)
                _exit(1);
            for (unsigned i = 0;; i++) {
                if (i == 1 && write(pp[1], "x", 1) != 1)
                    _exit(1);
                char key[16];
                int kn = snprintf(key, sizeof key, "f%u", (i * 7u) % 40u);
                rate_decision_t d;
                if (i % 4000 == 0)
                    rate_fair_acquire(g, key, (size_t)kn, i % 5, 2, 2000000,
                                      &d);
                else
                    rate_fair_check(g, key, (size_t)kn, i % 5, 1, &d);
            }
        }
        char x;
        close(pp[1]);
        assert_int_equal(read(pp[0], &x, 1), 1); /* deciding */
        close(pp[0]);
        usleep((useconds_t)rnd(5000));
        kill(c, SIGKILL);
        assert_int_equal(waitpid(c, NULL, 0), c);
        checked(f); /* table_lock repairs (about 1 round in 5) */
        rate_decision_t d;
        assert_int_equal(rate_fair_check(f, "p", 1, 1, 1, &d), RATE_OK);
        checked(f);
    }
    rate_fair_free(f);
    unlink(path);
    rate_limiter_free(lim);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(random_ops),
        cmocka_unit_test(killed_holders),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
