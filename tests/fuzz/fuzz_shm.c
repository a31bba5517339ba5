/* SPDX-License-Identifier: MIT */
/*
 * libFuzzer target: the shared-memory store over a damaged region.
 *
 * The input is a region's bytes, laid over a valid region (16 keys of two
 * policies in two shards) while a handle is attached to it, as when a
 * process that can write the file changes it under a running one: the
 * first 256 bytes over the header (its fields and the records' lock), the
 * rest from the shards on (locks, counts, buckets, slots, records).  A
 * short input damages only the start.  Then every call of the store must
 * return: a check, decisions (the full call and the bool one, which takes
 * the store's acquire path), refunds, resets, info, stats and a drop.  The
 * region is allocated at its exact size, so ASan sees any read or write
 * outside it.  A second handle then attaches to the damaged bytes (the
 * header's checks) and, if it is let in, checks and decides too.
 *
 * The template region's hash seed is fixed, so the seed corpus (the
 * template's bytes, tests/fuzz/corpus/shm) holds the same keys as the
 * region it is laid over.  FUZZ_SHM_SEEDS=DIR writes those seeds again.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <ratelimit.h>
#include <ratelimit_shm.h>

#define HDR_BYTES 4096u /* the header's page (src/store/shm.c) */
#define HDR_IN 256u     /* the header's part of an input */
#define HDR_SEED 72u    /* the header's hash seed */
#define HDR_OFF_RECS 96u
#define HDR_MAX_POLICIES 60u
#define HDR_REC_SIZE 64u
#define NOW UINT64_C(2000000000)

static const rate_shm_options_t attach_opts = {.lock_timeout_ns = 1000000};
static uint8_t *template;
static size_t total, used_len; /* the region, and its bytes in use */
static rate_policy_t *pol[2];

static rate_limiter_t *limiter(rate_store_t *s, int which)
{
    rate_limiter_config_t cfg = {0};
    rate_limiter_t *lim = NULL;

    cfg.policy = pol[which];
    cfg.store = s;
    return rate_limiter_new(&cfg, &lim) == RATE_OK ? lim : NULL;
}

static void die(const char *what)
{
    fprintf(stderr, "fuzz_shm: %s\n", what);
    abort();
}

/* An input's bytes: the header's first HDR_IN, then the region's from
 * the header's page on, up to the end of the records. */
static void overlay(uint8_t *region, const uint8_t *data, size_t size)
{
    size_t n = size < HDR_IN ? size : HDR_IN;
    memcpy(region, data, n);
    if (size > HDR_IN) {
        size_t rest = size - HDR_IN;
        if (rest > used_len - HDR_BYTES)
            rest = used_len - HDR_BYTES;
        memcpy(region + HDR_BYTES, data + HDR_IN, rest);
    }
}

static void write_seed(const char *dir, const char *name, const uint8_t *r)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (f == NULL)
        die("cannot write a seed");
    fwrite(r, 1, HDR_IN, f);
    fwrite(r + HDR_BYTES, 1, used_len - HDR_BYTES, f);
    fclose(f);
}

/* The template: a region with a fixed seed, 16 keys of two policies, a
 * few of them reset (holes in the free list). */
int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    rate_shm_options_t o = {.max_keys = 16, .shards = 2, .key_max = 16,
                            .state_max = 48, .max_policies = 2,
                            .init = true};
    rate_store_t *s = NULL;
    char err[256] = "";

    total = rate_store_shm_size(&o);
    template = aligned_alloc(64, total);
    if (template == NULL)
        die("out of memory");
    memset(template, 0, total);
    if (rate_store_shm_new_in(template, total, &o, &s, err, sizeof err) !=
        RATE_OK)
        die(err);
    rate_store_free(s);
    uint64_t seed = 0x5eed5eed5eed5eedu;
    memcpy(template + HDR_SEED, &seed, sizeof seed);
    if (rate_store_shm_new_in(template, total, &attach_opts, &s, err,
                              sizeof err) != RATE_OK)
        die(err);
    if (rate_policy_parse("token-bucket 10/s burst=5", &pol[0], err,
                          sizeof err) != RATE_OK ||
        rate_policy_parse("sliding-window 4/s", &pol[1], err, sizeof err) !=
            RATE_OK)
        die(err);
    rate_limiter_t *a = limiter(s, 0), *b = limiter(s, 1);
    if (a == NULL || b == NULL)
        die("no limiter on the template");
    char key[16];
    for (int i = 0; i < 16; i++) {
        snprintf(key, sizeof key, "k%d", i);
        (void)rate_try_acquire_at(i % 2 ? b : a, key, 1, NOW - 1000);
        if (i % 5 == 4)
            rate_limiter_reset(a, key, strlen(key));
    }
    rate_limiter_free(a);
    rate_limiter_free(b);
    if (rate_store_shm_check(s, err, sizeof err) != RATE_OK)
        die(err);
    rate_store_free(s);
    uint64_t off_recs;
    uint32_t max_policies, rec_size;
    memcpy(&off_recs, template + HDR_OFF_RECS, 8);
    memcpy(&max_policies, template + HDR_MAX_POLICIES, 4);
    memcpy(&rec_size, template + HDR_REC_SIZE, 4);
    used_len = (size_t)off_recs + (size_t)max_policies * rec_size;

    const char *dir = getenv("FUZZ_SHM_SEEDS");
    if (dir != NULL)
        write_seed(dir, "region", template);
    return 0;
}

/* Every call on the damaged region through handle s: each must return. */
static void use(rate_store_t *s, bool all)
{
    char err[256], key[16];
    rate_decision_t d;
    rate_shm_info_t info;
    rate_stats_t st;

    err[0] = '\0';
    if (rate_store_shm_check(s, err, sizeof err) != RATE_OK && err[0] == '\0')
        die("a check's error without a message");
    rate_limiter_t *a = limiter(s, 0), *b = limiter(s, 1);
    for (int i = 0; i < (all ? 20 : 6); i++) {
        snprintf(key, sizeof key, "k%d", i);
        size_t n = strlen(key);
        if (a != NULL) {
            if (rate_limiter_check_at(a, key, n, 1, 0, NOW, &d) != RATE_OK)
                die("a decision's error");
            (void)rate_try_acquire_at(a, key, 1, NOW);
            if (all && i % 3 == 0)
                (void)rate_limiter_refund_at(a, key, n, 1, NOW);
        }
        if (b != NULL) {
            (void)rate_try_acquire_at(b, key, 1, NOW);
            if (all && i % 4 == 0)
                (void)rate_limiter_reset(b, key, n);
        }
    }
    (void)rate_store_shm_info(s, &info);
    (void)rate_store_stats(s, &st);
    if (all)
        (void)rate_store_shm_drop(s);
    (void)rate_store_shm_check(s, err, sizeof err);
    rate_limiter_free(a);
    rate_limiter_free(b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t *region = aligned_alloc(64, total);
    rate_store_t *s = NULL, *again = NULL;
    char err[256] = "";

    if (region == NULL)
        return 0;
    memcpy(region, template, total);
    if (rate_store_shm_new_in(region, total, &attach_opts, &s, err,
                              sizeof err) != RATE_OK)
        die(err);
    overlay(region, data, size);
    use(s, true);
    /* The damaged header: refused with a message, or attached and used. */
    err[0] = '\0';
    int rc = rate_store_shm_new_in(region, total, &attach_opts, &again, err,
                                   sizeof err);
    if (rc != RATE_OK && err[0] == '\0')
        die("an attach's error without a message");
    if (rc == RATE_OK)
        use(again, false);
    rate_store_free(again);
    rate_store_free(s);
    free(region);
    return 0;
}
