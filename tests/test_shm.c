/* SPDX-License-Identifier: MIT */
/*
 * The shared-memory store: what only a region does (that it decides as
 * the memory store does is the store matrix's, tests/test_stores.c): its
 * books, bounds, eviction, namespaces, the refusals of a region it cannot
 * read, and a region over the caller's memory.  The processes-and-threads
 * and kill tests are in test_shm_procs.c.
 */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <pthread.h>
#include <pwd.h>
#include <dirent.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <stdatomic.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "lib/helpers.h"
#include "ratelimit_store.h"
#include "../src/internal.h" /* struct rate_store: its methods, to wrap */
#include "ratelimit_shm.h"
#ifdef RATE_WITH_HTTP
#include "ratelimit_http.h"
#endif

static char path[128];

static int setup(void **state)
{
    (void)state;
    snprintf(path, sizeof path, "/dev/shm/rl-test-shm-%ld", (long)getpid());
    unlink(path);
    return 0;
}

static char tmpfs_dir[64]; /* a tmpfs a test mounted, or "" */

static int teardown(void **state)
{
    (void)state;
    unlink(path);
    if (tmpfs_dir[0] != '\0') { /* a test that failed with it mounted */
        umount2(tmpfs_dir, MNT_DETACH);
        rmdir(tmpfs_dir);
        tmpfs_dir[0] = '\0';
    }
    return 0;
}

static rate_store_t *open_shm(const rate_shm_options_t *o)
{
    rate_store_t *s = NULL;
    char err[256] = "";
    int rc = rate_store_shm_new(path, o, &s, err, sizeof err);
    if (rc != RATE_OK)
        fail_msg("rate_store_shm_new(%s): %s: %s", path, rate_err_name(rc),
                 err);
    return s;
}

static void check_region(rate_store_t *s)
{
    char err[256] = "";
    int rc = rate_store_shm_check(s, err, sizeof err);
    if (rc != RATE_OK)
        fail_msg("check: %s: %s", rate_err_name(rc), err);
}

/* ----------------------------------------------- a region's own books */

#define RND_SEED 0x2545f4914f6cdd1du
#include "lib/rng.h"
#include "lib/wait.h"

/* Traffic on `s`: a few policies (a bucket, a window, a log, a composite
 * with a block) over `keys` keys each, at times of the caller's.  (That
 * the region decides as the memory store does, in a file, through a
 * prefix and in the caller's memory, is the store matrix's,
 * tests/test_stores.c.) */
static void traffic(rate_store_t *s, const char *what, int keys)
{
    static const char *policies[] = {
        "token-bucket 5/s burst=3", "fixed-window 4/700ms", "sliding-log 5/s",
        "token-bucket 10/s burst=5; sliding-window 8/2s block=1s"};
    for (size_t p = 0; p < sizeof policies / sizeof policies[0]; p++) {
        rate_limiter_t *l = limiter_of(policies[p], s);
        for (int i = 0; i < 3 * keys; i++) {
            char key[48];
            snprintf(key, sizeof key, "%s-%zu-%d", what, p, i % keys);
            rate_decision_t d = at(l, key, SEC + (uint64_t)i * MS, 1, 0);
            assert_int_not_equal(d.reason, RATE_REASON_STORE_ERROR);
            assert_true(d.allowed || i >= keys);
        }
        rate_limiter_free(l);
    }
}

static void a_region_keeps_its_books(void **state)
{
    (void)state;
    rate_shm_options_t o = {.max_keys = 100000, .state_max = 512,
                           .max_policies = 1024};
    rate_store_t *s = open_shm(&o);
    traffic(s, "file", 200);
    check_region(s);
    rate_shm_info_t info;
    assert_int_equal(rate_store_shm_info(s, &info), RATE_OK);
    assert_int_equal(info.evictions, 0);
    assert_int_equal(info.recoveries, 0);
    assert_int_equal(info.keys, 4 * 200);
    assert_int_equal(info.policies, 4);
    rate_store_free(s);

    /* Attached again, in a namespace of its own: the same. */
    rate_shm_options_t a = {.prefix = "ns1:"};
    s = open_shm(&a);
    traffic(s, "ns", 50);
    check_region(s);
    assert_int_equal(rate_store_shm_drop(s), RATE_OK);
    check_region(s);
    rate_store_free(s);
}

static void a_region_in_callers_memory(void **state)
{
    (void)state;
    rate_shm_options_t o = {.max_keys = 20000, .state_max = 512,
                           .max_policies = 256};
    size_t len = rate_store_shm_size(&o);
    assert_true(len > 0 && len % 4096 == 0);
    void *mem = mmap(NULL, len, PROT_READ | PROT_WRITE,
                     MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    assert_true(mem != MAP_FAILED);
    rate_store_t *s = NULL, *s2 = NULL;
    char err[256] = "";
    /* All zero: the first caller initializes it, the next attaches. */
    assert_int_equal(rate_store_shm_new_in(mem, len, &o, &s, err, sizeof err),
                     RATE_OK);
    rate_shm_options_t attach = {0};
    assert_int_equal(
        rate_store_shm_new_in(mem, len, &attach, &s2, err, sizeof err),
        RATE_OK);
    traffic(s, "in", 50);
    /* The second handle sees the first's keys. */
    rate_shm_info_t i1, i2;
    assert_int_equal(rate_store_shm_info(s, &i1), RATE_OK);
    assert_int_equal(rate_store_shm_info(s2, &i2), RATE_OK);
    assert_int_equal(i1.keys, i2.keys);
    check_region(s2);
    rate_store_free(s2);
    /* init: made again, whatever it held. */
    rate_shm_options_t re = {.max_keys = 1000, .init = true};
    rate_store_free(s);
    assert_int_equal(rate_store_shm_new_in(mem, len, &re, &s, err, sizeof err),
                     RATE_OK);
    assert_int_equal(rate_store_shm_info(s, &i1), RATE_OK);
    assert_int_equal(i1.keys, 0);
    assert_int_equal(i1.max_keys, 1000);
    rate_store_free(s);
    /* Refusals of the caller's region. */
    assert_int_equal(rate_store_shm_new_in((char *)mem + 8, len - 64, &o, &s,
                                           err, sizeof err),
                     RATE_EINVAL);
    assert_non_null(strstr(err, "aligned"));
    assert_int_equal(rate_store_shm_new_in(mem, 4096, &re, &s, err,
                                           sizeof err),
                     RATE_EINVAL);
    assert_non_null(strstr(err, "bytes"));
    assert_int_equal(rate_store_shm_new_in(NULL, len, &o, &s, err, sizeof err),
                     RATE_EINVAL);
    munmap(mem, len);
}

/* -------------------------------------------------------------- bounds */

static void evicts_in_a_full_shard_and_counts(void **state)
{
    (void)state;
    rate_shm_options_t o = {.max_keys = 64, .shards = 1};
    rate_store_t *s = open_shm(&o);
    rate_limiter_t *lim = limiter_of("fixed-window 5/s", s);
    char key[32];
    for (int i = 0; i < 200; i++) {
        snprintf(key, sizeof key, "key-%d", i);
        assert_true(rate_try_acquire_at(lim, key, 1, 1000));
    }
    rate_stats_t st;
    assert_int_equal(rate_store_stats(s, &st), RATE_OK);
    assert_int_equal(st.keys, 64);
    assert_int_equal(st.evictions, 200 - 64);
    check_region(s);
    /* A key used twice since the hand last passed survives the next
     * eviction (second chance). */
    assert_true(rate_try_acquire_at(lim, "key-199", 1, 1000));
    assert_true(rate_try_acquire_at(lim, "new", 1, 1000));
    rate_decision_t d = at(lim, "key-199", 1000, 0, 0);
    assert_int_equal(d.remaining, 3);
    rate_limiter_free(lim);
    rate_store_free(s);
}

static void reclaims_cold_keys_first(void **state)
{
    (void)state;
    rate_shm_options_t o = {.max_keys = 32, .shards = 1};
    rate_store_t *s = open_shm(&o);
    rate_limiter_t *lim = limiter_of("token-bucket 1/ms burst=1", s);
    char key[32];
    /* On the library's clock (a horizon): keys refill in 1 ms and are
     * reclaimed, not evicted. */
    for (int i = 0; i < 32; i++) {
        snprintf(key, sizeof key, "k%d", i);
        assert_true(rate_try_acquire(lim, key, 1));
    }
    struct timespec ts = {0, 5000000};
    nanosleep(&ts, NULL);
    for (int i = 32; i < 64; i++) {
        snprintf(key, sizeof key, "k%d", i);
        assert_true(rate_try_acquire(lim, key, 1));
    }
    rate_stats_t st;
    assert_int_equal(rate_store_stats(s, &st), RATE_OK);
    assert_int_equal(st.keys, 32);
    assert_int_equal(st.evictions, 0);
    assert_int_equal(st.reclaimed, 32);
    rate_limiter_free(lim);
    rate_store_free(s);
}

static void no_destroy(void *self)
{
    (void)self;
}

static void refuses_a_state_that_does_not_fit(void **state)
{
    (void)state;
    rate_policy_t *log = policy_of("sliding-log 100/s");
    rate_policy_t *tb = policy_of("token-bucket 10/s burst=10");
    rate_policy_t *all = policy_of(
        "token-bucket 10/s burst=10 block=1s; leaky-bucket 1/s capacity=4; "
        "sliding-window 5/s; fixed-window 9/s");
    assert_int_equal(rate_store_shm_state_size(tb), 22);
    assert_int_equal(rate_store_shm_state_size(log), 14 + 8 + 1600);
    assert_true(rate_store_shm_state_size(all) <= 96);
    assert_int_equal(rate_store_shm_state_size(NULL), 0);

    rate_shm_options_t o = {.max_keys = 100, .state_max = 96};
    rate_store_t *s = open_shm(&o);
    /* Refused when it is set: the store's check_policy names both sizes. */
    char err[256] = "";
    assert_int_equal(rate_store_check_policy(s, log, err, sizeof err),
                     RATE_EPOLICY);
    assert_non_null(strstr(err, "1622 bytes"));
    assert_non_null(strstr(err, "at most 96 (its state_max)"));
    assert_int_equal(rate_store_check_policy(s, tb, NULL, 0), RATE_OK);
    assert_int_equal(rate_store_check_policy(s, all, NULL, 0), RATE_OK);
    rate_limiter_config_t cfg = {.policy = log, .store = s,
                                 .on_store_error = RATE_FAIL_OPEN};
    rate_limiter_t *lim = NULL;
    assert_int_equal(rate_limiter_new(&cfg, &lim), RATE_EPOLICY);
    assert_null(lim);
    lim = limiter_of("token-bucket 10/s burst=10", s);
    assert_int_equal(rate_limiter_set_policy(lim, log), RATE_EPOLICY);
    assert_int_equal(rate_store_shm_state_size(rate_limiter_policy(lim)),
                     22); /* the old one stays */

#ifdef RATE_WITH_HTTP
    /* A rule's policy is checked too, as each decision comes: a store
     * error (under the fail mode), nothing written. */
    char rpath[160];
    snprintf(rpath, sizeof rpath, "%s.rules", path);
    FILE *f = fopen(rpath, "w");
    assert_non_null(f);
    fputs("[policies]\nlog = sliding-log 100/s\n"
          "[rule all]\ngroup = g\npolicy = log\n", f);
    fclose(f);
    rate_rules_t *rules = NULL;
    assert_int_equal(rate_rules_load(rpath, &rules, err, sizeof err),
                     RATE_OK);
    unlink(rpath);
    rate_outcome_t out;
    assert_int_equal(rate_rules_check_at(rules, lim, "k", 1, NULL, 0, 1, 0,
                                         1000, &out),
                     RATE_OK);
    assert_false(out.applied[0].decision.allowed);
    assert_int_equal(out.applied[0].decision.reason,
                     RATE_REASON_STORE_ERROR);
    assert_int_equal(out.applied[0].decision.error, RATE_EPOLICY);
    rate_rules_free(rules);
#endif
    rate_limiter_free(lim);

    /* The write-time refusal stays as the back end's own defence, for a
     * caller of the contract that does not check: the same methods
     * without check_policy (and without destroy: the region stays s's). */
    rate_store_methods_t unchecked = *s->m;
    unchecked.check_policy = NULL;
    unchecked.destroy = no_destroy;
    rate_store_t *w = NULL;
    assert_int_equal(rate_store_new(&unchecked, s->self, &w), RATE_OK);
    lim = limiter_of("sliding-log 100/s", w);
    int admitted = 0, refused = 0;
    for (int i = 0; i < 10; i++) {
        rate_decision_t d;
        assert_int_equal(rate_limiter_check_at(lim, "k", 1, 1, 0,
                                               (uint64_t)i * 1000, &d),
                         RATE_OK);
        if (d.allowed)
            admitted++;
        else if (d.reason == RATE_REASON_STORE_ERROR &&
                 d.error == RATE_EFULL)
            refused++;
    }
    /* (96 - 22) / 16 = 4 entries fit; the rest are refused, and the key
     * keeps its four. */
    assert_int_equal(admitted, 4);
    assert_int_equal(refused, 6);
    rate_decision_t d;
    assert_int_equal(rate_limiter_check_at(lim, "k", 1, 0, 0, 20000, &d),
                     RATE_OK);
    assert_int_equal(d.remaining, 96);
    rate_limiter_free(lim);
    rate_store_free(w);
    check_region(s);
    rate_store_free(s);
    rate_policy_free(log);
    rate_policy_free(tb);
    rate_policy_free(all);
}

static int async_calls;
static void count_async(void *ud, int rc, const rate_decision_t *d)
{
    (void)ud;
    (void)rc;
    (void)d;
    async_calls++;
}

/* A key longer than the region's key_max (with the prefix) is the
 * caller's error, as one longer than RATE_KEY_MAX: the call returns
 * RATE_EKEY whatever the fail mode, and nothing is admitted or stored. */
static void refuses_a_key_too_long_for_key_max(void **state)
{
    (void)state;
    rate_shm_options_t o = {.max_keys = 100};
    rate_store_t *s = open_shm(&o);
    rate_limiter_config_t cfg = {.policy = NULL, .store = s,
                                 .on_store_error = RATE_FAIL_OPEN};
    rate_limiter_t *lim = limiter_cfg("token-bucket 1/s burst=1", cfg);
    char longkey[100];
    memset(longkey, 'x', sizeof longkey);
    rate_decision_t d;
    for (int i = 0; i < 5; i++) {
        assert_int_equal(rate_limiter_check_at(lim, longkey, sizeof longkey,
                                               1, 0, 1, &d),
                         RATE_EKEY);
        assert_false(d.allowed);
        assert_false(rate_try_acquire_len_at(lim, longkey, sizeof longkey, 1,
                                             1));
        assert_false(rate_try_acquire_len(lim, longkey, sizeof longkey, 1));
    }
    async_calls = 0;
    rate_decision_t now_d;
    assert_int_equal(rate_limiter_check_start(lim, longkey, sizeof longkey, 1,
                                              0, &now_d, count_async, NULL),
                     RATE_EKEY);
    assert_int_equal(async_calls, 0);
    assert_int_equal(rate_limiter_refund_at(lim, longkey, sizeof longkey, 1,
                                            1),
                     RATE_EKEY);
    assert_int_equal(rate_limiter_reset(lim, longkey, sizeof longkey),
                     RATE_OK); /* too long to be held: nothing to forget */
    /* Exactly key_max bytes fit. */
    assert_int_equal(rate_limiter_check_at(lim, longkey, 64, 1, 0, 1, &d),
                     RATE_OK);
    assert_true(d.allowed);
    rate_stats_t st;
    assert_int_equal(rate_limiter_stats(lim, &st), RATE_OK);
    assert_int_equal(st.store_errors, 0);
    assert_int_equal(st.allowed, 1);
    assert_int_equal(st.keys, 1);
    rate_limiter_free(lim);

    /* With a prefix, the bound is key_max less the prefix; under the
     * fallback mode too. */
    rate_shm_options_t po = {.prefix = "ns:"};
    rate_store_t *ps = open_shm(&po);
    cfg = (rate_limiter_config_t){.store = ps,
                                  .on_store_error = RATE_FAIL_FALLBACK};
    lim = limiter_cfg("token-bucket 1/s burst=1", cfg);
    assert_int_equal(rate_limiter_check_at(lim, longkey, 62, 1, 0, 1, &d),
                     RATE_EKEY);
    assert_int_equal(rate_limiter_check_at(lim, longkey, 61, 1, 0, 1, &d),
                     RATE_OK);
    assert_true(d.allowed);
    assert_int_equal(d.reason, RATE_REASON_ALLOWED);
    rate_limiter_free(lim);
    rate_store_free(ps);
    rate_store_free(s);
}

static void keeps_namespaces_apart(void **state)
{
    (void)state;
    rate_shm_options_t o = {.max_keys = 1000};
    rate_store_t *a = open_shm(&o);
    rate_shm_options_t no = {.prefix = "other:"};
    rate_store_t *b = open_shm(&no);
    rate_limiter_t *la = limiter_of("fixed-window 1/s", a);
    rate_limiter_t *lb = limiter_of("fixed-window 1/s", b);
    rate_limiter_t *la2 = limiter_of("fixed-window 1/s", a);
    assert_true(rate_try_acquire_at(la, "k", 1, 10));
    assert_true(rate_try_acquire_at(lb, "k", 1, 10));  /* another key */
    assert_false(rate_try_acquire_at(la2, "k", 1, 10)); /* the same key */
    rate_shm_info_t info;
    assert_int_equal(rate_store_shm_info(a, &info), RATE_OK);
    assert_int_equal(info.keys, 2);
    assert_int_equal(info.policies, 2); /* one record per namespace */
    assert_int_equal(rate_store_shm_drop(b), RATE_OK);
    assert_int_equal(rate_store_shm_info(a, &info), RATE_OK);
    assert_int_equal(info.keys, 1);
    assert_int_equal(info.policies, 1);
    assert_false(rate_try_acquire_at(la, "k", 1, 10));
    check_region(a);
    rate_limiter_free(la);
    rate_limiter_free(la2);
    rate_limiter_free(lb);
    rate_store_free(a);
    rate_store_free(b);
    assert_int_equal(rate_store_shm_drop(NULL), RATE_EINVAL);
    rate_store_t *mem;
    assert_int_equal(rate_store_memory_new(NULL, &mem), RATE_OK);
    assert_int_equal(rate_store_shm_drop(mem), RATE_EINVAL);
    assert_int_equal(rate_store_shm_check(mem, NULL, 0), RATE_EINVAL);
    rate_store_free(mem);
}

/* ------------------------------------------------------------ refusals */

static void expect_refusal(const rate_shm_options_t *o, int code,
                           const char *words)
{
    rate_store_t *s = NULL;
    char err[256] = "";
    int rc = rate_store_shm_new(path, o, &s, err, sizeof err);
    if (rc != code || strstr(err, words) == NULL)
        fail_msg("wanted %s with '%s', got %s: '%s'", rate_err_name(code),
                 words, rate_err_name(rc), err);
    assert_null(s);
}

static void patch(off_t at, uint32_t v)
{
    int fd = open(path, O_RDWR);
    assert_true(fd >= 0);
    assert_int_equal(pwrite(fd, &v, sizeof v, at), sizeof v);
    close(fd);
}

static void refuses_what_it_cannot_read(void **state)
{
    (void)state;
    rate_shm_options_t o = {.max_keys = 1000, .mode = 0640};
    rate_store_free(open_shm(&o));
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 07777, 0640);

    /* Options that disagree with the region. */
    rate_shm_options_t other = {.max_keys = 2000};
    expect_refusal(&other, RATE_EINVAL,
                   "max_keys: the region has 1000, the options ask 2000");
    other = (rate_shm_options_t){.state_max = 200};
    expect_refusal(&other, RATE_EINVAL, "state_max: the region has 96");
    other = (rate_shm_options_t){.key_max = 20};
    expect_refusal(&other, RATE_EINVAL, "key_max");

    /* Another layout version. */
    patch(8, 99);
    expect_refusal(NULL, RATE_ESTORE, "layout version 99, this library "
                                      "reads 1");
    patch(8, 1);
    rate_store_free(open_shm(NULL)); /* as it was: attaches */
    /* A ready word that is not "ready": a file is linked only once made,
     * so that is damage, said so. */
    patch(16, 7);
    expect_refusal(NULL, RATE_ESTORE, "the header is damaged: its ready "
                                      "word is 7, not 2");
    patch(16, 2);
    rate_store_free(open_shm(NULL));

    /* Another size than the header says: longer, then truncated. */
    assert_int_equal(truncate(path, st.st_size + 4096), 0);
    expect_refusal(NULL, RATE_ESTORE, "the header says");
    assert_int_equal(truncate(path, st.st_size / 2), 0);
    expect_refusal(NULL, RATE_ESTORE, "truncated");
    assert_int_equal(truncate(path, 100), 0);
    expect_refusal(NULL, RATE_ESTORE, "too short");

    /* Not a store at all. */
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    for (int i = 0; i < 8192; i++)
        fputc("not a store\n"[i % 12], f);
    fclose(f);
    expect_refusal(NULL, RATE_ESTORE, "not a ratelimit shm store");
    unlink(path);

    /* Absent, with no_create; and no max_keys to create one. */
    rate_shm_options_t nc = {.max_keys = 10, .no_create = true};
    expect_refusal(&nc, RATE_ESTORE, "No such file");
    expect_refusal(NULL, RATE_EINVAL, "max_keys is required");
    rate_shm_options_t big = {.max_keys = 10, .state_max = 1u << 20};
    expect_refusal(&big, RATE_EINVAL, "state_max");
    assert_int_equal(rate_store_shm_new(NULL, &o, NULL, NULL, 0), RATE_EINVAL);
    assert_int_equal(access(path, F_OK), -1); /* nothing left behind */
    /* No path, an empty one, no region: named, and *out NULL. */
    char why[128];
    rate_store_t *stale = (rate_store_t *)&o;
    assert_int_equal(rate_store_shm_new(NULL, &o, &stale, why, sizeof why),
                     RATE_EINVAL);
    assert_null(stale);
    assert_string_equal(why, "no path (NULL)");
    stale = (rate_store_t *)&o;
    assert_int_equal(rate_store_shm_new("", &o, &stale, why, sizeof why),
                     RATE_EINVAL);
    assert_null(stale);
    assert_string_equal(why, "an empty path");
    stale = (rate_store_t *)&o;
    assert_int_equal(rate_store_shm_new_in(NULL, 4096, &o, &stale, why,
                                           sizeof why),
                     RATE_EINVAL);
    assert_null(stale);
    assert_string_equal(why, "no region (NULL)");

    /* Every option is checked before anything is made: a prefix as long
     * as key_max, or one that leaves no room for a policy record's 4-byte
     * key, creates no file. */
    rate_shm_options_t pre = {.max_keys = 1000, .key_max = 8,
                              .prefix = "12345678"};
    rate_store_t *none = NULL;
    assert_int_equal(rate_store_shm_new(path, &pre, &none, NULL, 0),
                     RATE_EINVAL);
    assert_null(none);
    assert_int_equal(access(path, F_OK), -1);
    expect_refusal(&pre, RATE_EINVAL, "the prefix (8 bytes) does not fit "
                                      "key_max 8");
    pre.prefix = "12345";
    expect_refusal(&pre, RATE_EINVAL, "the prefix (5 bytes)");
    assert_int_equal(access(path, F_OK), -1);
    pre.prefix = "1234";
    rate_store_t *ok = open_shm(&pre);
    rate_store_free(ok);
    assert_int_equal(unlink(path), 0);
    /* Without a prefix too: a key_max below a record's key would make a
     * region on which every decision fails. */
    rate_shm_options_t tiny = {.max_keys = 1000, .key_max = 3};
    expect_refusal(&tiny, RATE_EINVAL, "key_max 3 is below 4");
    assert_int_equal(rate_store_shm_size(&tiny), 0);
    assert_int_equal(access(path, F_OK), -1);
    tiny.key_max = 4;
    rate_store_free(open_shm(&tiny));
    assert_int_equal(unlink(path), 0);
    /* A region above the bound (64 GiB) is refused before any file. */
    rate_shm_options_t huge = {.max_keys = INT32_MAX};
    expect_refusal(&huge, RATE_EINVAL, "more than a region may");
    assert_int_equal(rate_store_shm_size(&huge), 0);
    assert_int_equal(access(path, F_OK), -1);
}

/* The entries of directory d other than . and .., or -1. */
static int entries(const char *d)
{
    DIR *dir = opendir(d);
    int n = 0;
    if (dir == NULL)
        return -1;
    for (struct dirent *e; (e = readdir(dir)) != NULL;)
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
            n++;
    closedir(dir);
    return n;
}

/* Makes a region at `at` in a child (a SIGBUS there fails the test, not
 * the suite): its code, and the message in msg. */
static int create_in_child(const char *at, const rate_shm_options_t *o,
                           char *msg, size_t len, rlim_t fsize)
{
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        rate_store_t *s = NULL;
        char err[256] = "";
        signal(SIGBUS, SIG_DFL); /* not cmocka's: the parent sees it */
        signal(SIGSEGV, SIG_DFL);
        if (fsize != 0) { /* files no longer than fsize: EFBIG past it */
            struct rlimit rl = {fsize, fsize};
            signal(SIGXFSZ, SIG_IGN);
            setrlimit(RLIMIT_FSIZE, &rl);
        }
        int rc = rate_store_shm_new(at, o, &s, err, sizeof err);
        rate_store_free(s);
        (void)!write(fds[1], err, strlen(err) + 1);
        _exit(-rc);
    }
    close(fds[1]);
    ssize_t n = read(fds[0], msg, len - 1);
    msg[n > 0 ? n : 0] = '\0';
    close(fds[0]);
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    if (!WIFEXITED(status))
        fail_msg("making %s: killed by signal %d", at, WTERMSIG(status));
    return -WEXITSTATUS(status);
}

/* On a file system without room for the region (an 8 MB tmpfs): a clear
 * error naming the bytes and the reason, never a SIGBUS, and no temporary
 * file left behind; the same when the allocation itself fails. */
static void refuses_a_region_without_room(void **state)
{
    (void)state;
    char dir[] = "/tmp/rl-shm-tmpfs-XXXXXX", at[64], msg[256];
    assert_non_null(mkdtemp(dir));
    if (mount("tmpfs", dir, "tmpfs", 0, "size=8m") != 0) {
        print_message("skipped: cannot mount a tmpfs on %s (%s; needs "
                      "root)\n", dir, strerror(errno));
        rmdir(dir);
        skip();
    }
    snprintf(tmpfs_dir, sizeof tmpfs_dir, "%s", dir);
    snprintf(at, sizeof at, "%s/big.rl", dir);
    rate_shm_options_t big = {.max_keys = 100000}; /* about 28 MB */
    size_t need = rate_store_shm_size(&big);
    assert_true(need > 8u << 20);
    int rc = create_in_child(at, &big, msg, sizeof msg, 0);
    char words[64];
    snprintf(words, sizeof words, "cannot allocate its %zu bytes", need);
    if (rc != RATE_ESTORE || strstr(msg, words) == NULL ||
        strstr(msg, strerror(ENOSPC)) == NULL)
        fail_msg("wanted RATE_ESTORE with '%s', got %s: '%s'", words,
                 rate_err_name(rc), msg);
    assert_int_equal(entries(dir), 0); /* no temporary file */
    /* A region that fits is made, and allocated in full. */
    rate_shm_options_t small = {.max_keys = 1000};
    assert_int_equal(create_in_child(at, &small, msg, sizeof msg, 0),
                     RATE_OK);
    struct stat st;
    assert_int_equal(stat(at, &st), 0);
    assert_true((uint64_t)st.st_blocks * 512 >= (uint64_t)st.st_size);
    assert_int_equal(unlink(at), 0);

    /* When the allocation itself fails (here: past RLIMIT_FSIZE, while
     * statvfs sees room): its reason, and no temporary file either. */
    rate_shm_options_t mid = {.max_keys = 10000}; /* about 3 MB */
    rc = create_in_child(at, &mid, msg, sizeof msg, 1u << 20);
    if (rc != RATE_ESTORE || strstr(msg, "cannot allocate its") == NULL ||
        strstr(msg, strerror(EFBIG)) == NULL)
        fail_msg("wanted RATE_ESTORE with 'cannot allocate its' and '%s', "
                 "got %s: '%s'", strerror(EFBIG), rate_err_name(rc), msg);
    assert_int_equal(entries(dir), 0);
    assert_int_equal(umount(dir), 0);
    assert_int_equal(rmdir(dir), 0);
    tmpfs_dir[0] = '\0';
}

/* The file is the creator's (mode 0600): another user is refused with
 * the system's reason; a mode and group the creator chose let it in. */
static void refuses_without_permission(void **state)
{
    (void)state;
    struct passwd *pw = getpwnam("nobody");
    if (getuid() != 0 || pw == NULL) {
        print_message("skipped: needs root and a user 'nobody'\n");
        skip();
    }
    uid_t uid = pw->pw_uid;
    gid_t gid = pw->pw_gid;
    for (int round = 0; round < 2; round++) {
        unlink(path);
        rate_shm_options_t o = {.max_keys = 100};
        if (round == 1) {
            o.mode = 0660;
            o.set_group = true;
            o.group = (uint32_t)gid;
        }
        rate_store_t *s = open_shm(&o);
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
            rate_store_free(s); /* the parent's, copied by fork */
            if (setgroups(0, NULL) != 0 || setgid(gid) != 0 ||
                setuid(uid) != 0)
                _exit(10);
            rate_store_t *c = NULL;
            char err[256] = "";
            int rc = rate_store_shm_new(path, NULL, &c, err, sizeof err);
            if (round == 0)
                _exit(rc == RATE_ESTORE && strstr(err, "Permission denied")
                          ? 0
                          : 11);
            if (rc != RATE_OK)
                _exit(12);
            rate_limiter_t *l = limiter_of("fixed-window 1/s", c);
            bool ok = rate_try_acquire_at(l, "k", 1, 5);
            rate_limiter_free(l);
            rate_store_free(c);
            _exit(ok ? 0 : 13);
        }
        int st = 0;
        assert_int_equal(waitpid(pid, &st, 0), pid);
        assert_true(WIFEXITED(st));
        assert_int_equal(WEXITSTATUS(st), 0);
        if (round == 1) { /* the other user's admission counted here */
            rate_limiter_t *l = limiter_of("fixed-window 1/s", s);
            assert_false(rate_try_acquire_at(l, "k", 1, 5));
            rate_limiter_free(l);
        }
        rate_store_free(s);
    }
}

static void two_creators_at_once_share_one_region(void **state)
{
    (void)state;
    enum { N = 4 };
    pid_t pids[N];
    for (int i = 0; i < N; i++) {
        pids[i] = fork();
        assert_true(pids[i] >= 0);
        if (pids[i] == 0) {
            rate_shm_options_t o = {.max_keys = 5000};
            rate_store_t *s = NULL;
            if (rate_store_shm_new(path, &o, &s, NULL, 0) != RATE_OK)
                _exit(1);
            rate_limiter_t *l = limiter_of("fixed-window 2/s", s);
            int got = rate_try_acquire_at(l, "k", 1, 5);
            rate_limiter_free(l);
            rate_store_free(s);
            _exit(got ? 2 : 3);
        }
    }
    int admitted = 0;
    for (int i = 0; i < N; i++) {
        int st = 0;
        assert_int_equal(waitpid(pids[i], &st, 0), pids[i]);
        assert_true(WIFEXITED(st));
        assert_true(WEXITSTATUS(st) == 2 || WEXITSTATUS(st) == 3);
        admitted += WEXITSTATUS(st) == 2;
    }
    assert_int_equal(admitted, 2); /* one region, one limit */
    rate_store_t *s = open_shm(NULL);
    check_region(s);
    rate_store_free(s);
}

/* ------------------------------------------------------------ recovery */

/* The header's fields this test reaches into (layout version 1, see
 * docs/shm.md): the offset of the shards, and of the records' lock. */
#define HDR_LAYOUT 8
#define HDR_OFF_SHARDS 80
#define HDR_REC_LOCK 128
#define SHARD_COUNT 40   /* after the shard's mutex: count, hand, free head */
#define SHARD_BUCKETS 128

/* A child maps the region, takes a lock itself, scribbles over what that
 * lock guards as a process killed mid-update could (the shard's index:
 * its buckets, free list and count), and dies holding it.  The next
 * decision must take the lock over, rebuild the index from the slots and
 * count the recovery: every key as it was, the region consistent. */
static void die_holding(off_t lock_at, bool scribble)
{
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int fd = open(path, O_RDWR);
        struct stat st;
        if (fd < 0 || fstat(fd, &st) != 0)
            _exit(1);
        uint8_t *p = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE,
                          MAP_SHARED, fd, 0);
        if (p == MAP_FAILED)
            _exit(2);
        uint32_t layout;
        memcpy(&layout, p + HDR_LAYOUT, 4);
        if (layout != 1)
            _exit(3);
        if (pthread_mutex_lock((pthread_mutex_t *)(p + lock_at)) != 0)
            _exit(4);
        if (scribble) {
            uint8_t *shard = p + lock_at;
            uint32_t junk[3] = {12345, 7, 0}; /* count, hand, free head */
            memcpy(shard + SHARD_COUNT, junk, sizeof junk);
            memset(shard + SHARD_BUCKETS, 0xee, 64); /* bucket heads */
        }
        _exit(0); /* holding it */
    }
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
}

static void takes_over_a_dead_owners_lock(void **state)
{
    (void)state;
    rate_shm_options_t o = {.max_keys = 100, .shards = 1};
    rate_store_t *s = open_shm(&o);
    rate_limiter_t *lim = limiter_of("fixed-window 5/s", s);
    char key[16];
    for (int i = 0; i < 10; i++) {
        snprintf(key, sizeof key, "k%d", i);
        for (int n = 0; n <= i % 5; n++)
            assert_true(rate_try_acquire_at(lim, key, 1, 100));
    }
    uint64_t off_shards;
    int fd = open(path, O_RDONLY);
    assert_true(fd >= 0);
    assert_int_equal(pread(fd, &off_shards, 8, HDR_OFF_SHARDS), 8);
    close(fd);

    die_holding((off_t)off_shards, true);
    /* Answered at once, from the repaired index: each key as it was. */
    for (int i = 0; i < 10; i++) {
        snprintf(key, sizeof key, "k%d", i);
        rate_decision_t d = at(lim, key, 100, 0, 0);
        assert_int_equal(d.remaining, 5 - (i % 5 + 1));
    }
    check_region(s);
    rate_shm_info_t info;
    assert_int_equal(rate_store_shm_info(s, &info), RATE_OK);
    assert_int_equal(info.recoveries, 1);
    assert_int_equal(info.keys, 10);

    /* The records' lock: a new policy's record is written after the
     * takeover, and both limiters agree on the key. */
    die_holding(HDR_REC_LOCK, false);
    rate_limiter_t *other = limiter_of("fixed-window 9/s", s);
    rate_decision_t d = at(other, "k4", 100, 0, 0);
    assert_int_equal(d.remaining, 9 - 5); /* k4's five carried over */
    assert_int_equal(rate_store_shm_info(s, &info), RATE_OK);
    assert_int_equal(info.recoveries, 2);
    assert_int_equal(info.policies, 2);
    check_region(s);
    rate_limiter_free(other);
    rate_limiter_free(lim);
    rate_store_free(s);
}

/* A wake-up the kernel lost costs a sleeper one slice of its wait, not
 * the lock timeout.  The lost wake-up is made by hand: this thread holds
 * the shard's lock, a decision sleeps on it, and the lock word's "waiters"
 * bit is cleared before the unlock, which then wakes nobody (as when the
 * waiter a wake went to is killed before it takes the lock).  With one
 * sleep to the timeout, the decision would wait all 10 s and fail. */
#define FUTEX_WAITERS_BIT 0x80000000u

typedef struct sleeper {
    rate_limiter_t *lim;
    int rc;
    rate_decision_t d;
    _Atomic long tid; /* the deciding thread's, once it runs */
} sleeper_t;

static void *decide_once(void *arg)
{
    sleeper_t *w = arg;
    atomic_store(&w->tid, (long)syscall(SYS_gettid));
    w->rc = rate_limiter_check_at(w->lim, "k", 1, 1, 0, 200, &w->d);
    return NULL;
}

/* Whether thread tid of this process is asleep (state S in its stat). */
static bool thread_sleeps(long tid)
{
    char stat_path[64], buf[256];
    snprintf(stat_path, sizeof stat_path, "/proc/self/task/%ld/stat", tid);
    FILE *f = fopen(stat_path, "r");
    if (f == NULL)
        return false;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *end = strrchr(buf, ')'); /* after the command's name */
    return end != NULL && end[1] == ' ' && end[2] == 'S';
}

static void a_lost_wakeup_costs_a_slice(void **state)
{
    (void)state;
    rate_shm_options_t o = {.max_keys = 100, .shards = 1,
                            .lock_timeout_ns = 10 * SEC};
    rate_store_t *s = open_shm(&o);
    sleeper_t w = {.lim = limiter_of("fixed-window 5/s", s)};
    assert_true(rate_try_acquire_at(w.lim, "k", 1, 100)); /* the record */
    uint64_t off_shards;
    int fd = open(path, O_RDWR);
    struct stat st;
    assert_true(fd >= 0 && fstat(fd, &st) == 0);
    assert_int_equal(pread(fd, &off_shards, 8, HDR_OFF_SHARDS), 8);
    uint8_t *p = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE,
                      MAP_SHARED, fd, 0);
    assert_true(p != MAP_FAILED);
    close(fd);
    pthread_mutex_t *mx = (pthread_mutex_t *)(p + off_shards);
    unsigned *word = (unsigned *)&mx->__data.__lock; /* glibc's lock word */

    assert_int_equal(pthread_mutex_lock(mx), 0);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, decide_once, &w), 0);
    /* Until the decision sleeps in the kernel (it sets the bit first). */
    assert_true(WAIT_UNTIL(__atomic_load_n(word, __ATOMIC_ACQUIRE) &
                               FUTEX_WAITERS_BIT,
                           TEST_WAIT_S));
    /* (the bit is set just before the sleep: until it has fallen asleep,
     * its state in /proc 'S') */
    assert_true(WAIT_UNTIL(thread_sleeps(atomic_load(&w.tid)), TEST_WAIT_S));
    __atomic_fetch_and(word, ~FUTEX_WAITERS_BIT, __ATOMIC_ACQ_REL);
    uint64_t t0 = rate_clock_monotonic_ns();
    assert_int_equal(pthread_mutex_unlock(mx), 0);
    assert_int_equal(pthread_join(th, NULL), 0);
    /* A slice (10 ms) and scheduling, with 5 s of slack: not the 10 s. */
    assert_true(rate_clock_monotonic_ns() - t0 < 5 * SEC);
    assert_int_equal(w.rc, RATE_OK);
    assert_int_not_equal(w.d.reason, RATE_REASON_STORE_ERROR);
    assert_true(w.d.allowed);
    assert_int_equal(w.d.remaining, 3);
    munmap(p, (size_t)st.st_size);
    rate_limiter_free(w.lim);
    rate_store_free(s);
}

/* ---------------------------------------------------- a corrupt region */

/* More of the layout (version 1), for damaging a region by hand: the
 * header's sizes and offsets, a shard's index, a slot's and a record's
 * header fields. */
#define HDR_SHARD_CAP 40
#define HDR_NBUCKETS 44
#define HDR_STATE_MAX 52
#define HDR_SLOT_SIZE 56
#define HDR_MAX_POLICIES 60
#define HDR_REC_SIZE 64
#define HDR_SHARD_SIZE 68
#define HDR_NSHARDS 20
#define HDR_OFF_SLOTS 88
#define HDR_OFF_RECS 96
#define MUTEX_BYTES 40 /* sizeof(pthread_mutex_t) here: the locks' bytes */
#define SHARD_HAND 44
#define SHARD_FREE 48
#define SLOT_NEXT 0
#define SLOT_CW 8
#define SLOT_KEY_LEN 16
#define SLOT_USED 18
#define SLOT_PREV 20
#define REC_KEY_LEN 4
#define REC_LEN 8
#define GUARD 4096u

/* A region in the caller's memory between two guard pages of 0xa5 (a
 * write past either end shows there, in any build), and where its parts
 * are. */
typedef struct region {
    uint8_t *mem, *base;
    size_t len;
    uint32_t nshards, cap, nbuckets, state_max, slot_size, shard_size;
    uint32_t max_policies, rec_size;
    uint64_t off_shards, off_slots, off_recs;
} region_t;

static uint32_t rd32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static uint64_t rd64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

static void wr32(uint8_t *p, uint32_t v)
{
    memcpy(p, &v, 4);
}

static uint8_t *shard_p(const region_t *r, uint32_t si)
{
    return r->base + r->off_shards + (uint64_t)si * r->shard_size;
}

static uint8_t *slot_p(const region_t *r, uint32_t si, uint32_t i)
{
    return r->base + r->off_slots +
           ((uint64_t)si * r->cap + (i - 1)) * r->slot_size;
}

static uint8_t *rec_p(const region_t *r, uint32_t i)
{
    return r->base + r->off_recs + (uint64_t)i * r->rec_size;
}

static void guards_intact(const region_t *r)
{
    for (size_t i = 0; i < GUARD; i++)
        if (r->mem[i] != 0xa5 || r->base[r->len + i] != 0xa5)
            fail_msg("a write outside the region (guard byte %zu)", i);
}

/* Whether byte `at` of the region belongs to a lock (never damaged here:
 * those are glibc's; see docs/shm.md). */
static bool in_a_lock(const region_t *r, uint64_t at)
{
    if (at >= HDR_REC_LOCK && at < HDR_REC_LOCK + MUTEX_BYTES)
        return true;
    if (at < r->off_shards || at >= r->off_slots)
        return false;
    return (at - r->off_shards) % r->shard_size < MUTEX_BYTES;
}

/* A damaged index: none, a valid slot (a cycle, or a wrong link), the
 * last, one past it, all ones, anything. */
static uint32_t bad_index(const region_t *r)
{
    switch (rnd(6)) {
    case 0: return 0;
    case 1: return 1 + (uint32_t)rnd(r->cap);
    case 2: return r->cap;
    case 3: return r->cap + 1;
    case 4: return UINT32_MAX;
    default: return (uint32_t)rnd(UINT64_C(1) << 32);
    }
}

/* Damages one thing of the region; says what in `what`. */
static void damage(region_t *r, char *what, size_t len)
{
    uint32_t si = (uint32_t)rnd(r->nshards), i = 1 + (uint32_t)rnd(r->cap);
    uint8_t *sh = shard_p(r, si), *e = slot_p(r, si, i);
    uint32_t v = bad_index(r);
    unsigned kind = (unsigned)rnd(11);

    switch (kind) {
    case 0: { /* a bucket head, one in use if the shard has any */
        uint32_t b = (uint32_t)rnd(r->nbuckets);
        for (uint32_t k = 0; k < r->nbuckets; k++)
            if (rd32(sh + SHARD_BUCKETS + 4 * ((b + k) % r->nbuckets))) {
                b = (b + k) % r->nbuckets;
                break;
            }
        wr32(sh + SHARD_BUCKETS + 4 * b, v);
        snprintf(what, len, "shard %u bucket %u = %u", si, b, v);
        break;
    }
    case 1: wr32(e + SLOT_NEXT, v);
        snprintf(what, len, "shard %u slot %u next = %u", si, i, v);
        break;
    case 2: wr32(e + SLOT_PREV, v);
        snprintf(what, len, "shard %u slot %u prev = %u", si, i, v);
        break;
    case 3: wr32(sh + SHARD_FREE, v);
        snprintf(what, len, "shard %u free head = %u", si, v);
        break;
    case 4: wr32(sh + SHARD_COUNT, v);
        snprintf(what, len, "shard %u count = %u", si, v);
        break;
    case 5: wr32(sh + SHARD_HAND, v);
        snprintf(what, len, "shard %u hand = %u", si, v);
        break;
    case 6: { /* the commit word's length */
        uint32_t n = rnd(2) ? r->state_max + 1 + (uint32_t)rnd(64)
                            : (uint32_t)rnd(1u << 24);
        wr32(e + SLOT_CW, (rd32(e + SLOT_CW) & 0xff000000u) | n);
        snprintf(what, len, "shard %u slot %u state length = %u", si, i, n);
        break;
    }
    case 7: {
        uint16_t n = (uint16_t)rnd(65536);
        memcpy(e + SLOT_KEY_LEN, &n, 2);
        snprintf(what, len, "shard %u slot %u key length = %u", si, i, n);
        break;
    }
    case 8: e[SLOT_USED] ^= 1;
        snprintf(what, len, "shard %u slot %u used = %u", si, i,
                 e[SLOT_USED]);
        break;
    case 9: { /* a policy record's lengths */
        uint8_t *rec = rec_p(r, (uint32_t)rnd(r->max_policies));
        wr32(rec + (rnd(2) ? REC_LEN : REC_KEY_LEN), v);
        snprintf(what, len, "a record's length = %u", v);
        break;
    }
    default: { /* a bit anywhere but in a lock */
        uint64_t at;
        do
            at = rnd(r->len);
        while (in_a_lock(r, at));
        unsigned bit = (unsigned)rnd(8);
        r->base[at] ^= (uint8_t)(1u << bit);
        snprintf(what, len, "byte %llu bit %u", (unsigned long long)at, bit);
        break;
    }
    }
}

/* A store call on a damaged region: OK, or an error that says so. */
static void expect_ok_or_corrupt(int rc, const char *call, const char *what)
{
    if (rc != RATE_OK && rc != RATE_ECORRUPT && rc != RATE_EFULL)
        fail_msg("%s after %s: %s", call, what, rate_err_name(rc));
}

/* Every call on a damaged region: a check, decisions (the full call and
 * the bool one) on its keys and new ones, resets, the counters, and a
 * drop when `drop`.  Each must return (no crash, no endless walk), with
 * RATE_OK or an error; returns how many decisions had RATE_ECORRUPT. */
static int use_damaged(rate_store_t *s, rate_limiter_t *lim, uint64_t t,
                       bool drop, const char *what)
{
    char err[256] = "", key[16];
    int rc = rate_store_shm_check(s, err, sizeof err), corrupt = 0;
    if (rc != RATE_OK && rc != RATE_ECORRUPT)
        fail_msg("check after %s: %s: %s", what, rate_err_name(rc), err);
    if (rc == RATE_ECORRUPT && err[0] == '\0')
        fail_msg("check after %s: RATE_ECORRUPT without a message", what);
    for (int i = 0; i < 60; i++) {
        snprintf(key, sizeof key, "k%d", i);
        rate_decision_t d;
        assert_int_equal(rate_limiter_check_at(lim, key, strlen(key), 1, 0,
                                               t, &d),
                         RATE_OK);
        expect_ok_or_corrupt(d.error, "a decision", what);
        corrupt += d.error == RATE_ECORRUPT;
        (void)rate_try_acquire_at(lim, key, 1, t);
        if (i % 9 == 0)
            expect_ok_or_corrupt(rate_limiter_reset(lim, key, strlen(key)),
                                 "a reset", what);
    }
    rate_shm_info_t info;
    rate_stats_t st;
    expect_ok_or_corrupt(rate_store_shm_info(s, &info), "info", what);
    expect_ok_or_corrupt(rate_store_stats(s, &st), "stats", what);
    rc = rate_store_shm_check(s, err, sizeof err);
    if (rc != RATE_OK && rc != RATE_ECORRUPT)
        fail_msg("check after %s: %s: %s", what, rate_err_name(rc), err);
    if (drop)
        expect_ok_or_corrupt(rate_store_shm_drop(s), "drop", what);
    return corrupt;
}

/* A region whose bytes anyone who can write it may change (a file under
 * /dev/shm): every index read from it is checked before it is used, so a
 * damaged region is RATE_ECORRUPT for the calls that meet the damage,
 * never a crash, a write outside the region or an endless walk, also
 * after the check has reported it.  (Seen before: 11 of 450 random
 * damages crashed the process.) */
static void survives_a_corrupt_region(void **state)
{
    (void)state;
    alarm(300); /* an endless walk fails the test, not the run */
    rate_shm_options_t o = {.max_keys = 64, .shards = 2, .max_policies = 4};
    region_t r = {.len = rate_store_shm_size(&o)};
    assert_true(r.len > 0);
    r.mem = aligned_alloc(GUARD, r.len + 2 * GUARD);
    assert_non_null(r.mem);
    memset(r.mem, 0xa5, r.len + 2 * GUARD);
    r.base = r.mem + GUARD;
    memset(r.base, 0, r.len);
    rate_store_t *s = NULL;
    char err[256] = "";
    o.init = true;
    assert_int_equal(rate_store_shm_new_in(r.base, r.len, &o, &s, err,
                                           sizeof err),
                     RATE_OK);
    r.nshards = rd32(r.base + HDR_NSHARDS);
    r.cap = rd32(r.base + HDR_SHARD_CAP);
    r.nbuckets = rd32(r.base + HDR_NBUCKETS);
    r.state_max = rd32(r.base + HDR_STATE_MAX);
    r.slot_size = rd32(r.base + HDR_SLOT_SIZE);
    r.max_policies = rd32(r.base + HDR_MAX_POLICIES);
    r.rec_size = rd32(r.base + HDR_REC_SIZE);
    r.shard_size = rd32(r.base + HDR_SHARD_SIZE);
    r.off_shards = rd64(r.base + HDR_OFF_SHARDS);
    r.off_slots = rd64(r.base + HDR_OFF_SLOTS);
    r.off_recs = rd64(r.base + HDR_OFF_RECS);
    assert_int_equal(r.nshards, 2);
    assert_int_equal(rd32(r.base + 12), MUTEX_BYTES);

    /* 40 keys, every fifth forgotten again (holes in the free list). */
    rate_limiter_t *lim = limiter_of("token-bucket 10/s burst=5", s);
    char key[16];
    for (int i = 0; i < 40; i++) {
        snprintf(key, sizeof key, "k%d", i);
        assert_true(rate_try_acquire_at(lim, key, 1, SEC));
        if (i % 5 == 4)
            assert_int_equal(rate_limiter_reset(lim, key, strlen(key)),
                             RATE_OK);
    }
    check_region(s);
    uint8_t *clean = malloc(r.len);
    assert_non_null(clean);
    memcpy(clean, r.base, r.len);

    /* Every bucket head out of bounds: each decision is RATE_ECORRUPT,
     * and the check names the bucket. */
    for (uint32_t si = 0; si < r.nshards; si++)
        memset(shard_p(&r, si) + SHARD_BUCKETS, 0xff, 4ull * r.nbuckets);
    rate_decision_t d;
    assert_int_equal(rate_limiter_check_at(lim, "k0", 2, 1, 0, 2 * SEC, &d),
                     RATE_OK);
    assert_int_equal(d.error, RATE_ECORRUPT);
    assert_int_equal(d.reason, RATE_REASON_STORE_ERROR);
    assert_false(d.allowed); /* fail closed, the default */
    assert_false(rate_try_acquire_at(lim, "k1", 1, 2 * SEC));
    assert_int_equal(rate_store_shm_check(s, err, sizeof err), RATE_ECORRUPT);
    assert_non_null(strstr(err, "bucket"));
    assert_int_equal(use_damaged(s, lim, 2 * SEC, true, "bad buckets"), 60);
    guards_intact(&r);

    /* Every chain a cycle (each slot in use links itself): a lookup of a
     * key the chain does not hold ends, with RATE_ECORRUPT. */
    memcpy(r.base, clean, r.len);
    for (uint32_t si = 0; si < r.nshards; si++)
        for (uint32_t i = 1; i <= r.cap; i++)
            if (slot_p(&r, si, i)[SLOT_USED])
                wr32(slot_p(&r, si, i) + SLOT_NEXT, i);
    int corrupt = 0;
    for (int i = 0; i < 100; i++) {
        snprintf(key, sizeof key, "new%d", i);
        assert_int_equal(rate_limiter_check_at(lim, key, strlen(key), 1, 0,
                                               2 * SEC, &d),
                         RATE_OK);
        assert_true(d.error == RATE_OK || d.error == RATE_ECORRUPT);
        corrupt += d.error == RATE_ECORRUPT;
    }
    assert_true(corrupt > 0); /* 20 keys in 64 buckets: some of 100 meet one */
    assert_int_equal(rate_store_shm_check(s, err, sizeof err), RATE_ECORRUPT);
    guards_intact(&r);

    /* Each shard's lock made a priority-inheriting mutex (glibc's type
     * bit 0x20) held by a thread that does not exist: glibc's timed lock
     * then asserts (the kernel answers ESRCH for a robust mutex); the
     * store refuses a mutex of another type than its own first. */
    memcpy(r.base, clean, r.len);
    size_t kind_at = offsetof(pthread_mutex_t, __data.__kind);
    for (uint32_t si = 0; si < r.nshards; si++) {
        int kind;
        memcpy(&kind, shard_p(&r, si) + kind_at, sizeof kind);
        kind |= 0x20;
        memcpy(shard_p(&r, si) + kind_at, &kind, sizeof kind);
        wr32(shard_p(&r, si) + offsetof(pthread_mutex_t, __data.__lock),
             4194000);
    }
    assert_int_equal(rate_limiter_check_at(lim, "k0", 2, 1, 0, 2 * SEC, &d),
                     RATE_OK);
    assert_int_equal(d.error, RATE_ECORRUPT);
    assert_int_equal(rate_store_shm_check(s, err, sizeof err), RATE_ECORRUPT);
    assert_non_null(strstr(err, "lock (damaged)"));
    assert_int_equal(rate_store_shm_info(s, &(rate_shm_info_t){0}),
                     RATE_ECORRUPT);
    guards_intact(&r);

    /* Then random damage, one to three things at a time, each round on
     * the clean region again. */
    int rounds = 3000, with_error = 0;
    for (int round = 0; round < rounds; round++) {
        memcpy(r.base, clean, r.len);
        char what[512] = "", one[128];
        for (unsigned n = 1 + (unsigned)rnd(3); n > 0; n--) {
            damage(&r, one, sizeof one);
            snprintf(what + strlen(what), sizeof what - strlen(what),
                     "%s%s", what[0] ? ", " : "", one);
        }
        with_error += use_damaged(s, lim, 2 * SEC + (uint64_t)round * MS,
                                  round % 3 == 0, what) > 0;
        guards_intact(&r);
    }
    print_message("%d of %d damaged regions gave RATE_ECORRUPT to a "
                  "decision\n", with_error, rounds);
    assert_true(with_error > 0);
    memcpy(r.base, clean, r.len);
    check_region(s);
    rate_limiter_free(lim);
    rate_store_free(s);
    free(clean);
    free(r.mem);
    alarm(0);
}

/* A writer of the file that keeps damaging the region's indices while a
 * process uses it (its own random numbers: rnd() is this thread's). */
typedef struct scribbler {
    region_t *r;
    atomic_bool stop;
    uint64_t writes;
} scribbler_t;

static void *scribble(void *arg)
{
    scribbler_t *w = arg;
    region_t *r = w->r;
    uint64_t x = 0x9e3779b97f4a7c15u;
    while (!atomic_load(&w->stop)) {
        rnd_next(&x);
        uint32_t si = (uint32_t)(x % r->nshards);
        uint32_t i = 1 + (uint32_t)((x >> 8) % r->cap);
        uint32_t v = (x >> 40) & 1 ? (uint32_t)(x >> 20) % (r->cap + 2)
                                   : (uint32_t)(x >> 32);
        uint8_t *at;
        switch ((x >> 56) % 7) {
        case 0: at = shard_p(r, si) + SHARD_BUCKETS +
                     4 * ((x >> 24) % r->nbuckets); break;
        case 1: at = slot_p(r, si, i) + SLOT_NEXT; break;
        case 2: at = slot_p(r, si, i) + SLOT_PREV; break;
        case 3: at = shard_p(r, si) + SHARD_FREE; break;
        case 4: at = shard_p(r, si) + SHARD_HAND; break;
        case 5: at = shard_p(r, si) + SHARD_COUNT; break;
        default: at = slot_p(r, si, i) + SLOT_KEY_LEN; break;
        }
        __atomic_store_n((uint32_t *)(void *)at, v, __ATOMIC_RELAXED);
        w->writes++;
    }
    return NULL;
}

/* The same calls while another thread keeps writing bad indices into the
 * region (a writer of the file does not take the locks): each value is
 * checked as it is used, not only when first read. */
static void survives_a_region_damaged_while_in_use(void **state)
{
    (void)state;
    alarm(300);
    rate_shm_options_t o = {.max_keys = 64, .shards = 2, .max_policies = 4,
                            .init = true};
    region_t r = {.len = rate_store_shm_size(&o)};
    r.mem = aligned_alloc(GUARD, r.len + 2 * GUARD);
    assert_non_null(r.mem);
    memset(r.mem, 0xa5, r.len + 2 * GUARD);
    r.base = r.mem + GUARD;
    memset(r.base, 0, r.len);
    rate_store_t *s = NULL;
    char err[256] = "";
    assert_int_equal(rate_store_shm_new_in(r.base, r.len, &o, &s, err,
                                           sizeof err),
                     RATE_OK);
    r.nshards = rd32(r.base + HDR_NSHARDS);
    r.cap = rd32(r.base + HDR_SHARD_CAP);
    r.nbuckets = rd32(r.base + HDR_NBUCKETS);
    r.slot_size = rd32(r.base + HDR_SLOT_SIZE);
    r.shard_size = rd32(r.base + HDR_SHARD_SIZE);
    r.off_shards = rd64(r.base + HDR_OFF_SHARDS);
    r.off_slots = rd64(r.base + HDR_OFF_SLOTS);
    rate_limiter_t *lim = limiter_of("token-bucket 10/s burst=5", s);
    char key[16];
    for (int i = 0; i < 40; i++) {
        snprintf(key, sizeof key, "k%d", i);
        assert_true(rate_try_acquire_at(lim, key, 1, SEC));
    }
    uint8_t *clean = malloc(r.len);
    assert_non_null(clean);
    memcpy(clean, r.base, r.len);

    scribbler_t w = {.r = &r};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, scribble, &w), 0);
    int corrupt = 0;
    for (int round = 0; round < 2000; round++) {
        /* The index made whole again now and then, so that calls get
         * past the first damage (a race with the writer, as wanted). */
        if (round % 4 == 0)
            for (uint32_t si = 0; si < r.nshards; si++)
                memcpy(shard_p(&r, si) + SHARD_COUNT,
                       clean + (shard_p(&r, si) - r.base) + SHARD_COUNT,
                       r.shard_size - SHARD_COUNT);
        corrupt += use_damaged(s, lim, 2 * SEC + (uint64_t)round * MS,
                               round % 5 == 0, "a writer at work") > 0;
        guards_intact(&r);
    }
    atomic_store(&w.stop, true);
    assert_int_equal(pthread_join(th, NULL), 0);
    print_message("%d of 2000 rounds met the damage; %llu writes\n", corrupt,
                  (unsigned long long)w.writes);
    assert_true(corrupt > 0);
    rate_limiter_free(lim);
    rate_store_free(s);
    free(clean);
    free(r.mem);
    alarm(0);
}

/* A writer that flips the header's slots per shard between the region's
 * own and a number far past it, while others attach. */
typedef struct flipper {
    uint8_t *at;
    uint32_t good, bad;
    atomic_bool stop;
} flipper_t;

static void *flip(void *arg)
{
    flipper_t *f = arg;
    while (!atomic_load(&f->stop)) {
        __atomic_store_n((uint32_t *)(void *)f->at, f->bad, __ATOMIC_RELAXED);
        __atomic_store_n((uint32_t *)(void *)f->at, f->good, __ATOMIC_RELAXED);
    }
    return NULL;
}

/* Attaching checks a copy of the header and makes the handle from that
 * copy: a header changed between the check and the handle (shard_cap
 * flipped to a value past the region) is refused or never seen, and each
 * handle let in works within the region. */
static void attaches_to_the_header_it_checked(void **state)
{
    (void)state;
    alarm(300);
    rate_shm_options_t o = {.max_keys = 64, .shards = 1, .init = true};
    region_t r = {.len = rate_store_shm_size(&o)};
    r.mem = aligned_alloc(GUARD, r.len + 2 * GUARD);
    assert_non_null(r.mem);
    memset(r.mem, 0xa5, r.len + 2 * GUARD);
    r.base = r.mem + GUARD;
    memset(r.base, 0, r.len);
    rate_store_t *s = NULL;
    char err[256] = "";
    assert_int_equal(rate_store_shm_new_in(r.base, r.len, &o, &s, err,
                                           sizeof err),
                     RATE_OK);
    rate_store_free(s);
    flipper_t f = {.at = r.base + HDR_SHARD_CAP,
                   .good = rd32(r.base + HDR_SHARD_CAP), .bad = 1u << 30};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, flip, &f), 0);
    rate_shm_options_t attach = {0};
    int in = 0, refused = 0;
    for (int i = 0; i < 20000; i++) {
        s = NULL;
        if (rate_store_shm_new_in(r.base, r.len, &attach, &s, err,
                                  sizeof err) != RATE_OK) {
            refused++;
            continue;
        }
        in++;
        /* A drop walks every slot the handle thinks the shard has. */
        assert_int_equal(rate_store_shm_drop(s), RATE_OK);
        rate_shm_info_t info;
        assert_int_equal(rate_store_shm_info(s, &info), RATE_OK);
        assert_true(info.capacity == f.good);
        rate_store_free(s);
    }
    atomic_store(&f.stop, true);
    assert_int_equal(pthread_join(th, NULL), 0);
    guards_intact(&r);
    print_message("%d attached, %d refused\n", in, refused);
    /* Whether an attach met either value depends on the threads' timing
     * (a loaded machine may preempt the flipper while the bad one is in
     * place, for every attach): every handle let in worked, and with the
     * good value back (the flipper's last store) an attach is let in. */
    s = NULL;
    assert_int_equal(rate_store_shm_new_in(r.base, r.len, &attach, &s, err,
                                           sizeof err),
                     RATE_OK);
    rate_shm_info_t info;
    assert_int_equal(rate_store_shm_info(s, &info), RATE_OK);
    assert_true(info.capacity == f.good);
    rate_store_free(s);
    free(r.mem);
    alarm(0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(a_region_keeps_its_books, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(a_region_in_callers_memory,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(evicts_in_a_full_shard_and_counts,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(reclaims_cold_keys_first, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(refuses_a_state_that_does_not_fit,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(refuses_a_key_too_long_for_key_max,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(keeps_namespaces_apart, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(refuses_what_it_cannot_read, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(refuses_a_region_without_room, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(refuses_without_permission, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(two_creators_at_once_share_one_region,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(a_lost_wakeup_costs_a_slice, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(takes_over_a_dead_owners_lock, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(survives_a_corrupt_region, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(
            survives_a_region_damaged_while_in_use, setup, teardown),
        cmocka_unit_test_setup_teardown(attaches_to_the_header_it_checked,
                                        setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
