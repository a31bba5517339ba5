/* SPDX-License-Identifier: MIT */
/*
 * Fair shares on a damaged table (docs/fair.md, "A damaged table"): a
 * shared table whose bytes a writer of its memory changed.  Attaching
 * refuses a damaged header with a message naming the fault; each kind of
 * index the table holds, damaged, is RATE_ECORRUPT, never a read or
 * write outside the table; a lock word that names no live thread is
 * RATE_ECORRUPT at once, one held by a live thread that never lets go
 * is waited for a bounded time (a waiter answered at its deadline); an
 * asynchronous seat's damaged name reaches no memory that is no record.
 * White box: this file includes the fair table's private headers to
 * reach the table's fields, and compiles src/fair/wait_async.c itself
 * (its definitions take the place of the library's) to reach the
 * asynchronous waiters' records.
 */
#include "lib/helpers.h"

#include <errno.h>
#include <linux/futex.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include "fair/index.h"
#include "fair/table.h"
#include "fair/wait_async.c"

#include "lib/hand_loop.h"

#define SLOTS 8u
#define QMAX 4u

/* A clock that moves on by `step` at every read (counted). */
typedef struct tick {
    _Atomic uint64_t now, step, reads;
} tick_t;

static uint64_t tick_now(void *ud)
{
    tick_t *t = ud;
    t->reads++;
    return t->now += t->step;
}

static void tick_sleep(void *ud, uint64_t ns)
{
    ((tick_t *)ud)->now += ns;
}

/* A fair limit on memory of the test's (a table shared by processes, as
 * far as the fair limit knows): flows in its active set and, with
 * `waiters`, two asynchronous waiters on the hand-fired loop. */
typedef struct bed {
    void *mem;
    size_t len;
    tick_t clk;
    rate_clock_t ck;
    rate_limiter_t *lim;
    rate_fair_config_t fc;
    rate_fair_t *f;
    tloop_t *l;
    int started, answers; /* asynchronous waiters pending, answered */
} bed_t;

static void on_answer(void *ud, int rc, const rate_decision_t *d)
{
    bed_t *b = ud;
    (void)rc;
    (void)d;
    b->answers++;
}

static const char *const flows[] = {"a", "b", "c", "d", "e", "w", "x"};
#define NFLOWS (sizeof flows / sizeof flows[0])

static void bed_start(bed_t *b, bool waiters)
{
    char err[256] = "";
    memset(b, 0, sizeof *b);
    b->len = rate_fair_size(SLOTS, QMAX);
    b->mem = aligned_alloc(64, b->len);
    assert_non_null(b->mem);
    assert_int_equal(rate_fair_init_in(b->mem, b->len, SLOTS, QMAX, err,
                                       sizeof err), RATE_OK);
    b->clk.now = 10 * SEC;
    b->clk.step = 1000;
    b->ck = (rate_clock_t){.now_ns = tick_now, .sleep_ns = tick_sleep,
                           .ud = &b->clk};
    b->lim = limiter_of("token-bucket 10/s burst=3", NULL);
    b->fc = (rate_fair_config_t){.limiter = b->lim, .key = "shared",
                                 .key_len = 6, .slots = SLOTS,
                                 .queue_max = QMAX, .clock = &b->ck};
    if (rate_fair_new_in(&b->fc, b->mem, b->len, &b->f, err, sizeof err) !=
        RATE_OK)
        fail_msg("rate_fair_new_in: %s", err);
    rate_decision_t d;
    for (size_t i = 0; i < 5; i++)
        assert_int_equal(rate_fair_check(b->f, flows[i], 1, (uint32_t)i + 1,
                                         1, &d), RATE_OK);
    b->l = calloc(1, sizeof *b->l);
    assert_non_null(b->l);
    if (!waiters)
        return;
    rate_loop_t loop = loop_of(b->l);
    for (size_t i = 5; i < NFLOWS; i++)
        assert_int_equal(rate_fair_acquire_start(b->f, &loop, flows[i], 1, 1,
                                                 1, 100 * SEC, &d, on_answer,
                                                 b),
                         RATE_PENDING);
    b->started = 2;
    assert_int_equal(b->f->h->waiting, 2);
}

/* Frees the fair limit: every waiter it started answered, once. */
static void bed_end(bed_t *b)
{
    rate_fair_free(b->f);
    assert_int_equal(b->answers, b->started);
    free(b->l);
    free(b->mem);
    rate_limiter_free(b->lim);
}

/* An entry with waiters (the top of the heap of queues). */
static fslot_t *queued_entry(bed_t *b)
{
    assert_true(b->f->h->nqueues > 0);
    return &b->f->slot[b->f->wheap[0]];
}

/* Every call on the damaged table returns; RATE_ECORRUPT is seen at
 * least once when `corrupt`, never when not.  The clock moves on 20 ms a
 * read meanwhile: the shared limit admits, periods end. */
static void calls(bed_t *b, bool corrupt)
{
    int seen = 0;
    rate_decision_t d;
    rate_fair_stats_t st;
    uint64_t step = b->clk.step;
    b->clk.step = 20 * MS;
    for (int round = 0; round < 3; round++)
        for (size_t i = 0; i < NFLOWS; i++) {
            int rc = rate_fair_check(b->f, flows[i], 1, 2, 1, &d);
            assert_true(rc == RATE_OK || rc == RATE_ECORRUPT);
            seen += rc == RATE_ECORRUPT;
            (void)rate_fair_try_acquire(b->f, flows[i], 1, 1, 1);
        }
    int rc = rate_fair_acquire(b->f, "y", 1, 1, 1, 0, &d);
    assert_true(rc == RATE_OK || rc == RATE_ECORRUPT);
    seen += rc == RATE_ECORRUPT;
    rc = rate_fair_stats(b->f, &st);
    assert_true(rc == RATE_OK || rc == RATE_ECORRUPT);
    seen += rc == RATE_ECORRUPT;
    b->clk.step = step;
    if (corrupt)
        assert_true(seen > 0);
    else
        assert_int_equal(seen, 0);
}

/* A header damaged under one fair limit: another refuses to attach, with
 * the fault named; the sizes the first one checked are the ones it
 * keeps using. */
static void refuse(bed_t *b, const char *why)
{
    char err[256] = "";
    rate_fair_t *g = NULL;
    assert_int_equal(rate_fair_new_in(&b->fc, b->mem, b->len, &g, err,
                                      sizeof err), RATE_EINVAL);
    assert_null(g);
    if (strstr(err, why) == NULL)
        fail_msg("'%s' not in '%s'", why, err);
}

static void attach_memory(void **s)
{
    (void)s;
    bed_t b;
    bed_start(&b, false);
    fhdr_t *h = b.f->h, keep = *h;
    memcpy(&h->magic, "rrfairv1", 8);
    refuse(&b, "another version ('rrfairv1'");
    memcpy(&h->magic, "pngpngpn", 8);
    refuse(&b, "holds no fair table");
    h->magic = keep.magic;
    h->slots = 0;
    refuse(&b, "its header is damaged (slots 0, queue_max 4)");
    h->slots = RATE_FAIR_SLOTS_MAX * 4;
    refuse(&b, "header is damaged");
    h->slots = 16;
    refuse(&b, "made with other slots or queue_max (16 and 4; this fair "
               "limit's are 8 and 4)");
    h->slots = keep.slots;
    h->size = keep.size * 1000;
    refuse(&b, "a size of");
    h->size = keep.size;
#ifdef __GLIBC__
    h->mu.__data.__kind |= 32; /* glibc's priority-inheriting bit */
    refuse(&b, "its lock is damaged");
    /* the attached fair limit refuses that lock too */
    calls(&b, true);
#endif
    *h = keep;
    calls(&b, false); /* whole again */
    bed_end(&b);
}

static void attach_file(void **s)
{
    (void)s;
    char path[] = "/tmp/rate-fair-corrupt-XXXXXX", err[512] = "";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    rate_limiter_t *lim = limiter_of("token-bucket 10/s burst=3", NULL);
    rate_fair_config_t fc = {.limiter = lim, .key = "k", .key_len = 1,
                             .slots = SLOTS, .queue_max = QMAX};
    rate_fair_t *f = NULL, *g = NULL;
    /* a file that is something else: refused, and left as it was */
    assert_int_equal(write(fd, "hello", 5), 5);
    fc.shm_path = path;
    assert_int_equal(rate_fair_new(&fc, &g, err, sizeof err), RATE_EINVAL);
    assert_non_null(strstr(err, "5 bytes: too short to be a fair table"));
    assert_int_equal(ftruncate(fd, 0), 0);
    assert_int_equal(rate_fair_new(&fc, &f, err, sizeof err), RATE_OK);
    fhdr_t *h = f->h, keep = *h;
    memcpy(&h->magic, "rrfairv1", 8);
    assert_int_equal(rate_fair_new(&fc, &g, err, sizeof err), RATE_EINVAL);
    assert_non_null(strstr(err, path));
    assert_non_null(strstr(err, "another version ('rrfairv1'"));
    memcpy(&h->magic, "\x7f" "ELF\2\1\1\0", 8);
    assert_int_equal(rate_fair_new(&fc, &g, err, sizeof err), RATE_EINVAL);
    assert_non_null(strstr(err, "not a fair table"));
    h->magic = keep.magic;
    h->queue_max = RATE_FAIR_QUEUE_MAX + 1;
    assert_int_equal(rate_fair_new(&fc, &g, err, sizeof err), RATE_EINVAL);
    assert_non_null(strstr(err, "its header is damaged (slots 8, queue_max "
                                "1025)"));
    h->queue_max = keep.queue_max;
    h->size = 12;
    assert_int_equal(rate_fair_new(&fc, &g, err, sizeof err), RATE_EINVAL);
    assert_non_null(strstr(err, "a size of 12 bytes"));
    h->size = keep.size;
    /* a file longer than its table (made by a writer, or cut short and
     * grown again) */
    assert_int_equal(ftruncate(fd, (off_t)keep.size + 4096), 0);
    assert_int_equal(rate_fair_new(&fc, &g, err, sizeof err), RATE_EINVAL);
    assert_non_null(strstr(err, "where its table takes"));
    assert_int_equal(ftruncate(fd, (off_t)keep.size), 0);
#ifdef __GLIBC__
    h->mu.__data.__kind |= 64; /* glibc's priority-protecting bit */
    assert_int_equal(rate_fair_new(&fc, &g, err, sizeof err), RATE_EINVAL);
    assert_non_null(strstr(err, "its lock is damaged"));
#endif
    *h = keep;
    assert_int_equal(rate_fair_new(&fc, &g, err, sizeof err), RATE_OK);
    rate_fair_free(g);
    rate_fair_free(f);
    close(fd);
    unlink(path);
    rate_limiter_free(lim);
}

/* Each kind of index the table holds, damaged: RATE_ECORRUPT from the
 * calls that read it, nothing read or written outside the table. */
typedef void (*damage_fn)(bed_t *b);

static void d_aheap_entry(bed_t *b) { b->f->aheap[0] = 1000; }
static void d_aheap_size(bed_t *b) { b->f->h->nactive = SLOTS + 3; }
static void d_wheap_entry(bed_t *b) { b->f->wheap[0] = 77; }
static void d_wheap_size(bed_t *b) { b->f->h->nqueues = 4000; }
static void d_heap_place(bed_t *b)
{
    for (uint32_t i = 0; i < SLOTS; i++)
        if (b->f->slot[i].apos != NIL)
            b->f->slot[i].apos = SLOTS; /* past the heap, or not its own */
}
static void d_list_head(bed_t *b) { b->f->h->lhead = SLOTS + 1; }
static void d_list_cycle(bed_t *b)
{
    fslot_t *tail = &b->f->slot[b->f->h->ltail - 1];
    tail->lnext = b->f->h->lhead; /* a walk would never end */
}
static void d_queue_head(bed_t *b) { queued_entry(b)->qhead = 4096; }
static void d_queue_len(bed_t *b) { queued_entry(b)->qlen = 300; }
static void d_ring_seat(bed_t *b)
{
    fslot_t *sl = queued_entry(b);
    b->f->ring[base_of(b->f, sl) + sl->qhead] = 60000;
}
static void d_seats_taken(bed_t *b)
{
    fslot_t *sl = queued_entry(b);
    for (uint32_t k = 0; k < QMAX; k++) /* no seat free for a new waiter */
        if (b->f->wait[base_of(b->f, sl) + k].ticket == 0)
            b->f->wait[base_of(b->f, sl) + k].ticket = 1000 + k;
    sl->qlen = 1;
}

static void index_kinds(void **s)
{
    (void)s;
    static const struct {
        const char *name;
        damage_fn fn;
    } kinds[] = {
        {"a heap's element", d_aheap_entry},
        {"the active heap's size", d_aheap_size},
        {"the queues' heap's element", d_wheap_entry},
        {"the queues' heap's size", d_wheap_size},
        {"an entry's place in the heap", d_heap_place},
        {"the active list's head", d_list_head},
        {"a cycle in the active list", d_list_cycle},
        {"a queue's start", d_queue_head},
        {"a queue's count", d_queue_len},
        {"a seat number", d_ring_seat},
        {"every seat taken", d_seats_taken},
    };
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        bed_t b;
        bed_start(&b, true);
        print_message("damaged: %s\n", kinds[k].name);
        kinds[k].fn(&b);
        if (kinds[k].fn == d_seats_taken) { /* met by a new waiter */
            rate_decision_t d;
            rate_loop_t loop = loop_of(b.l);
            int rc = RATE_OK;
            for (size_t i = 5; i < NFLOWS && rc != RATE_ECORRUPT; i++) {
                rc = rate_fair_acquire_start(b.f, &loop, flows[i], 1, 1, 1,
                                             SEC, &d, on_answer, &b);
                b.started += rc == RATE_PENDING;
            }
            assert_int_equal(rc, RATE_ECORRUPT);
        } else {
            calls(&b, true);
        }
        bed_end(&b);
    }
}

/* Values that are no index: a weight of 0 (it divides a cost: a queue's
 * head's finish time once its stale head is dropped), a ticket about to
 * wrap to 0 (a free seat's mark), a seat of no process, a deadline far
 * away: the calls go on. */
static void other_values(void **s)
{
    (void)s;
    bed_t b;
    rate_decision_t d;
    bed_start(&b, true);
    rate_loop_t loop = loop_of(b.l);
    for (size_t i = 5; i < NFLOWS; i++) { /* two waiters a queue */
        assert_int_equal(rate_fair_acquire_start(b.f, &loop, flows[i], 1, 1,
                                                 1, 100 * SEC, &d, on_answer,
                                                 &b),
                         RATE_PENDING);
        b.started++;
    }
    for (uint32_t i = 0; i < SLOTS; i++)
        b.f->slot[i].weight = 0;
    /* a seat of no process (a pid of 0 or less) is dropped as gone */
    fslot_t *sl = queued_entry(&b);
    fqueue_t q;
    fwait_t *w = NULL;
    assert_int_equal(queue_of(b.f, sl, &q), RATE_OK);
    assert_int_equal(queue_seat(b.f, sl, &q, 0, &w), RATE_OK);
    w->pid = -1;
    assert_int_equal(rate_fair_check(b.f, "a", 1, 1, 1, &d), RATE_OK);
    assert_int_equal(b.f->h->waiting, 3);
    for (uint32_t i = 0; i < SLOTS * QMAX; i++)
        if (b.f->wait[i].ticket != 0)
            b.f->wait[i].deadline = UINT64_MAX;
    calls(&b, false);
    /* a new waiter's ticket is 1, not 0 */
    b.f->h->ticket_seq = UINT64_MAX;
    assert_int_equal(rate_fair_acquire_start(b.f, &loop, "z", 1, 1, 1, SEC,
                                             &d, on_answer, &b),
                     RATE_PENDING);
    b.started++;
    assert_int_equal(b.f->h->ticket_seq, 1);
    bed_end(&b);
}

/* A helper thread that exists and holds nothing: its id in a lock word
 * makes the lock look held by a live thread. */
static int hold_pipe[2];
static _Atomic pid_t helper_tid;

static void *helper(void *arg)
{
    char c;
    (void)arg;
    helper_tid = gettid();
    assert_int_equal(read(hold_pipe[0], &c, 1), 1);
    return NULL;
}

static void lock_word(void **s)
{
    (void)s;
#ifdef __GLIBC__
    bed_t b;
    rate_decision_t d;
    bed_start(&b, false);
    pthread_mutex_t *mu = &b.f->h->mu;
    /* held by no thread: a word with no id, this thread's own, an id
     * that does not exist */
    pid_t gone = 0x3ffffff0;
    while (kill(gone, 0) == 0 || errno != ESRCH)
        gone--;
    const uint32_t words[] = {FUTEX_WAITERS, (uint32_t)gettid(),
                              (uint32_t)gone, (uint32_t)gone | FUTEX_WAITERS};
    for (size_t i = 0; i < sizeof words / sizeof words[0]; i++) {
        mu->__data.__lock = (int)words[i];
        b.clk.reads = 0;
        assert_int_equal(rate_fair_check(b.f, "a", 1, 1, 1, &d),
                         RATE_ECORRUPT);
        assert_true(b.clk.reads < 10); /* at once, not after a wait */
    }
    /* held by a live thread that never lets go: a waiter is answered at
     * its deadline; a decision gives up once the lock has not changed
     * hands for 5 s of the fair clock, and the next at once */
    pthread_t th;
    assert_int_equal(pipe(hold_pipe), 0);
    assert_int_equal(pthread_create(&th, NULL, helper, NULL), 0);
    while (helper_tid == 0)
        usleep(1000);
    mu->__data.__lock = (int)helper_tid;
    b.clk.step = 50 * MS;
    assert_int_equal(rate_fair_acquire(b.f, "a", 1, 1, 1, 300 * MS, &d),
                     RATE_OK);
    assert_false(d.allowed);
    assert_int_equal(d.reason, RATE_REASON_LIMITED);
    b.clk.reads = 0;
    assert_int_equal(rate_fair_check(b.f, "a", 1, 1, 1, &d), RATE_ETIMEDOUT);
    assert_true(b.clk.reads >= LOCK_STALL_NS / (50 * MS));
    b.clk.reads = 0;
    assert_int_equal(rate_fair_check(b.f, "a", 1, 1, 1, &d), RATE_ETIMEDOUT);
    assert_true(b.clk.reads < 10);
    rate_fair_stats_t st;
    assert_int_equal(rate_fair_stats(b.f, &st), RATE_ETIMEDOUT);
    /* let go (the word whole again): the calls go on */
    mu->__data.__lock = 0;
    assert_int_equal(rate_fair_check(b.f, "a", 1, 1, 1, &d), RATE_OK);
    assert_int_equal(write(hold_pipe[1], "x", 1), 1);
    pthread_join(th, NULL);
    close(hold_pipe[0]);
    close(hold_pipe[1]);
    bed_end(&b);
#else
    skip();
#endif
}

/* An asynchronous waiter's seat whose name was changed: a waker that
 * reaches it (the seat next) wakes nothing, or the one record of this
 * fair limit with that number, never memory that is no record.  The
 * waiter is still answered, once. */
static void async_names(void **s)
{
    (void)s;
    const uint64_t names[] = {UINT64_C(0x00007f0012345670), 999, 0};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        bed_t b;
        rate_decision_t d;
        bed_start(&b, true);
        uint64_t tag = (uint64_t)b.f->as->tag << 32;
        for (uint32_t k = 0; k < SLOTS * QMAX; k++)
            if (b.f->wait[k].ticket != 0)
                b.f->wait[k].arec = names[i] != 0 ? names[i]
                                                  : tag | (b.f->as->nrecs + 5);
        b.f->h->top_ticket = 0; /* the next waiter is woken again */
        for (size_t j = 0; j < 5; j++)
            assert_int_equal(rate_fair_check(b.f, flows[j], 1, 1, 1, &d),
                             RATE_OK);
        for (int turn = 0; turn < 3; turn++) {
            if (b.l->io_fn != NULL)
                b.l->io_fn(b.l->io_arg, RATE_LOOP_READ);
            for (int t = 0; t < HAND_LOOP_TIMERS; t++)
                if (b.l->t[t].used && b.l->t[t].armed) {
                    b.l->t[t].armed = false;
                    b.l->t[t].fn(b.l->t[t].arg);
                }
        }
        bed_end(&b);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(attach_memory), cmocka_unit_test(attach_file),
        cmocka_unit_test(index_kinds),   cmocka_unit_test(other_values),
        cmocka_unit_test(lock_word),     cmocka_unit_test(async_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
