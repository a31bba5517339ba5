/* SPDX-License-Identifier: MIT */
/*
 * Runs a libFuzzer target over randomly damaged copies of one input
 * (replay.c's --damage): how many damaged tables or regions crash or
 * hang the process that reads them.
 *
 *   fuzz_NAME --damage COUNT SEED FILE [KEEP_DIR]
 *
 * Each copy of FILE has 1 to 4 changes at random places (a bit flipped,
 * a byte, a 32-bit word set to a random or a small number, a 64-bit word
 * set to a random number) and runs once through LLVMFuzzerTestOneInput
 * in a child process of its own, which must exit within LIMIT_S seconds.
 * Counted: the copies that returned, those that crashed (a sanitizer's
 * report or a signal) and those that hung (killed at the limit).  Copies
 * that crashed or hung are written to KEEP_DIR when one is given.
 * Exits 0 only when every copy returned.  The suite fair_damage runs it
 * on the fair table's seed under ASan and UBSan.
 */
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int rate__fuzz_damage(int argc, char **argv);

#define LIMIT_S 20

static uint64_t rng;

static uint64_t next(void) /* splitmix64 */
{
    uint64_t z = (rng += UINT64_C(0x9e3779b97f4a7c15));
    z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
    return z ^ (z >> 31);
}

static void damage(uint8_t *b, size_t len)
{
    for (uint64_t k = 1 + next() % 4; k > 0; k--) {
        size_t at = (size_t)(next() % len);
        uint64_t v = next();
        switch (next() % 5) {
        case 0:
            b[at] ^= (uint8_t)(1u << (v % 8));
            break;
        case 1:
            b[at] = (uint8_t)v;
            break;
        case 2:
        case 3: {
            uint32_t w = next() % 2 ? (uint32_t)v : (uint32_t)(v % 40);
            at &= ~(size_t)3;
            if (at + 4 <= len)
                memcpy(b + at, &w, 4);
            break;
        }
        default:
            at &= ~(size_t)7;
            if (at + 8 <= len)
                memcpy(b + at, &v, 8);
            break;
        }
    }
}

static uint8_t *read_all(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL || fseek(f, 0, SEEK_END) != 0)
        return NULL;
    long n = ftell(f);
    uint8_t *b = n > 0 ? malloc((size_t)n) : NULL;
    rewind(f);
    if (b == NULL || fread(b, 1, (size_t)n, f) != (size_t)n) {
        free(b);
        b = NULL;
    }
    fclose(f);
    *len = (size_t)n;
    return b;
}

/* 0: returned; 1: crashed; 2: hung. */
static int run_one(const uint8_t *copy, size_t len)
{
    pid_t c = fork();
    if (c < 0) {
        perror("damage: fork");
        exit(2);
    }
    if (c == 0) {
        LLVMFuzzerTestOneInput(copy, len);
        _exit(0);
    }
    int st = 0;
    for (int waited_ms = 0;; waited_ms += 5) {
        pid_t r = waitpid(c, &st, WNOHANG);
        if (r == c)
            break;
        if (r < 0 && errno != EINTR) {
            perror("damage: waitpid");
            exit(2);
        }
        if (waited_ms >= LIMIT_S * 1000) {
            kill(c, SIGKILL);
            waitpid(c, &st, 0);
            return 2;
        }
        struct timespec ts = {0, 5000000};
        nanosleep(&ts, NULL);
    }
    return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : 1;
}

/* argv: COUNT SEED FILE [KEEP_DIR] (the target initialized already). */
int rate__fuzz_damage(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: --damage COUNT SEED FILE [KEEP_DIR]\n");
        return 2;
    }
    size_t len = 0;
    uint8_t *orig = read_all(argv[2], &len);
    if (orig == NULL || len == 0) {
        fprintf(stderr, "damage: cannot read %s\n", argv[2]);
        return 2;
    }
    long count = strtol(argv[0], NULL, 10);
    uint64_t seed = strtoull(argv[1], NULL, 10);
    const char *keep = argc > 3 ? argv[3] : NULL;
    uint8_t *copy = malloc(len);
    if (copy == NULL)
        return 2;
    long n[3] = {0, 0, 0};
    for (long i = 0; i < count; i++) {
        rng = seed * UINT64_C(1000003) + (uint64_t)i;
        memcpy(copy, orig, len);
        damage(copy, len);
        int r = run_one(copy, len);
        n[r]++;
        if (r != 0) {
            fprintf(stderr, "damage: copy %ld %s\n", i,
                    r == 1 ? "crashed" : "hung");
            char path[512];
            FILE *f = NULL;
            if (keep != NULL &&
                snprintf(path, sizeof path, "%s/damage-%llu-%ld", keep,
                         (unsigned long long)seed, i) < (int)sizeof path &&
                (f = fopen(path, "wb")) != NULL) {
                fwrite(copy, 1, len, f);
                fclose(f);
            }
        }
    }
    printf("damage: %ld copies: %ld returned, %ld crashed, %ld hung\n", count,
           n[0], n[1], n[2]);
    free(copy);
    free(orig);
    return n[1] || n[2];
}
