/* SPDX-License-Identifier: MIT */
/*
 * The SHA-1 that names the Redis store's scripts (src/store/redis/sha1.c): the
 * standard's test vectors, the padding's edges (55, 56, 63, 64 and 65
 * bytes: one block or two for the tail), and a long message.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "../src/store/redis/sha1.h"

static void check(const char *msg, size_t len, const char *want)
{
    char hex[41];
    rate__sha1_hex(msg, len, hex);
    assert_string_equal(hex, want);
}

static void vectors(void **state)
{
    (void)state;
    check("", 0, "da39a3ee5e6b4b0d3255bfef95601890afd80709");
    check("abc", 3, "a9993e364706816aba3e25717850c26c9cd0d89d");
    const char *two =
        "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"; /* 56 */
    check(two, strlen(two), "84983e441c3bd26ebaae4aa1f95129e5e54670f1");
    const char *four = "abcdefghbcdefghicdefghijdefghijkefghijklfghijklm"
                       "ghijklmnhijklmnoijklmnopjklmnopqklmnopqrlmnopqrs"
                       "mnopqrstnopqrstu"; /* 112 */
    check(four, strlen(four), "a49b2446a02c645bf419f995b67091253a04a259");
    static char million[1000000];
    memset(million, 'a', sizeof million);
    check(million, sizeof million, "34aa973cd4c4daa4f61eeb2bdbad27316534016f");
}

/* Around the block's edge: 55 bytes still pad into one block, 56 need a
 * second; 64 fill one. */
static void edges(void **state)
{
    (void)state;
    char a[65];
    memset(a, 'a', sizeof a);
    check(a, 55, "c1c8bbdc22796e28c0e15163d20899b65621d65a");
    check(a, 56, "c2db330f6083854c99d4b5bfb6e8f29f201be699");
    check(a, 63, "03f09f5b158a7a8cdad920bddc29b81c18a551f5");
    check(a, 64, "0098ba824b5c16427bd7a1122a5a442a25ec644d");
    check(a, 65, "11655326c708d70319be2610e8a57d9a5b959d3b");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(vectors),
        cmocka_unit_test(edges),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
