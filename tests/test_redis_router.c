/* SPDX-License-Identifier: MIT */
/*
 * The Redis Cluster router on its own, with no server: CRC16 and slots
 * against known vectors (the Cluster specification's, and slots Redis
 * itself gives with CLUSTER KEYSLOT), CLUSTER SLOTS replies recorded from
 * Redis 7.0.15 and a few made by hand (fed through hiredis's reader, as the
 * store gets them), and the
 * MOVED / ASK / TRYAGAIN texts.
 */
#include <hiredis/hiredis.h>

#include "../src/store/redis/cluster.h"
#include "lib/helpers.h"
#include "lib/redis_reply.h"

static void crc16_and_slots(void **state)
{
    (void)state;
    assert_int_equal(rc_crc16("123456789", 9), 0x31C3);
    assert_int_equal(rc_crc16("", 0), 0);
    /* CLUSTER KEYSLOT of Redis 7.0.15 */
    static const struct {
        const char *key;
        unsigned slot;
    } v[] = {
        {"foo", 12182},  {"bar", 5061},           {"hello", 866},
        {"123456789", 12739}, {"{user1000}.following", 3443},
        {"{user1000}.followers", 3443}, {"foo{}{bar}", 8363},
        {"foo{{bar}}zap", 4015}, {"foo{bar}{zap}", 5061},
        {"ratelimit:{victim}", 13218}, {"{", 4092}, {"}", 12090},
        {"{}", 15257},
    };
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++)
        if (rc_key_slot(v[i].key, strlen(v[i].key)) != v[i].slot)
            fail_msg("slot of '%s': %u, not %u", v[i].key,
                     rc_key_slot(v[i].key, strlen(v[i].key)), v[i].slot);
    /* A tag ends at the first '}' after the first '{': bytes after it,
     * another '{' inside, are not the tag's. */
    assert_int_equal(rc_key_slot("x{ab}c", 6), rc_key_slot("ab", 2));
    assert_int_equal(rc_key_slot("x{a{b}c", 7), rc_key_slot("a{b", 3));
    /* NUL bytes are bytes. */
    assert_int_equal(rc_key_slot("{a\0b}", 5), rc_crc16("a\0b", 3) & 16383);
}

/* CLUSTER SLOTS recorded from Redis 7.0.15: a 3-master, 3-replica cluster
 * as `redis-cli --cluster create ... --cluster-replicas 1` left it, and the
 * same after `redis-cli --cluster reshard` moved slots 0-9 to the third
 * master (a master with two ranges). */
static const char three_masters[] =
    "*3\r\n*4\r\n:0\r\n:5460\r\n*4\r\n$9\r\n127.0.0.1\r\n:7101\r\n$40\r\n"
    "07d8a6bd1450674e79de0770ce1c63fbe76fd5fd\r\n*0\r\n*4\r\n$9\r\n"
    "127.0.0.1\r\n:7104\r\n$40\r\n"
    "4d53a01ed51f4182011ff285f52e0203ed30ef91\r\n*0\r\n*4\r\n:5461\r\n"
    ":10922\r\n*4\r\n$9\r\n127.0.0.1\r\n:7102\r\n$40\r\n"
    "0ce5c1bc9a07f3bb5330bd90cf2858a1fba1a095\r\n*0\r\n*4\r\n$9\r\n"
    "127.0.0.1\r\n:7105\r\n$40\r\n"
    "7d0f93c50af10013521b948c44e2b4d70fef6d06\r\n*0\r\n*4\r\n:10923\r\n"
    ":16383\r\n*4\r\n$9\r\n127.0.0.1\r\n:7103\r\n$40\r\n"
    "a6f0bf94b7d241ae588178474a2ec5c3c5702adb\r\n*0\r\n*4\r\n$9\r\n"
    "127.0.0.1\r\n:7106\r\n$40\r\n"
    "bc6e0227ddda717851a682b5b6718ab0c1d24710\r\n*0\r\n";

static const char resharded[] =
    "*4\r\n*4\r\n:0\r\n:9\r\n*4\r\n$9\r\n127.0.0.1\r\n:7103\r\n$40\r\n"
    "a6f0bf94b7d241ae588178474a2ec5c3c5702adb\r\n*0\r\n*4\r\n$9\r\n"
    "127.0.0.1\r\n:7106\r\n$40\r\n"
    "bc6e0227ddda717851a682b5b6718ab0c1d24710\r\n*0\r\n*4\r\n:10\r\n"
    ":5460\r\n*4\r\n$9\r\n127.0.0.1\r\n:7101\r\n$40\r\n"
    "07d8a6bd1450674e79de0770ce1c63fbe76fd5fd\r\n*0\r\n*4\r\n$9\r\n"
    "127.0.0.1\r\n:7104\r\n$40\r\n"
    "4d53a01ed51f4182011ff285f52e0203ed30ef91\r\n*0\r\n*4\r\n:5461\r\n"
    ":10922\r\n*4\r\n$9\r\n127.0.0.1\r\n:7102\r\n$40\r\n"
    "0ce5c1bc9a07f3bb5330bd90cf2858a1fba1a095\r\n*0\r\n*4\r\n$9\r\n"
    "127.0.0.1\r\n:7105\r\n$40\r\n"
    "7d0f93c50af10013521b948c44e2b4d70fef6d06\r\n*0\r\n*4\r\n:10923\r\n"
    ":16383\r\n*4\r\n$9\r\n127.0.0.1\r\n:7103\r\n$40\r\n"
    "a6f0bf94b7d241ae588178474a2ec5c3c5702adb\r\n*0\r\n*4\r\n$9\r\n"
    "127.0.0.1\r\n:7106\r\n$40\r\n"
    "bc6e0227ddda717851a682b5b6718ab0c1d24710\r\n*0\r\n";

static void slots_reply_parsed(void **state)
{
    (void)state;
    rc_range_t r[8];
    size_t n = 0;
    redisReply *rep = parse_resp(three_masters);
    assert_true(rc_parse_slots(rep, "seed", r, 8, &n));
    assert_int_equal(n, 3);
    assert_int_equal(r[0].first, 0);
    assert_int_equal(r[0].last, 5460);
    assert_string_equal(r[0].host, "127.0.0.1");
    assert_int_equal(r[0].port, 7101);
    assert_int_equal(r[1].first, 5461);
    assert_int_equal(r[1].port, 7102);
    assert_int_equal(r[2].last, 16383);
    assert_int_equal(r[2].port, 7103);
    assert_false(rc_parse_slots(rep, "seed", r, 2, &n)); /* no room */
    freeReplyObject(rep);

    rep = parse_resp(resharded);
    assert_true(rc_parse_slots(rep, "seed", r, 8, &n));
    assert_int_equal(n, 4);
    assert_int_equal(r[0].first, 0);
    assert_int_equal(r[0].last, 9);
    assert_int_equal(r[0].port, 7103);
    assert_int_equal(r[1].first, 10);
    assert_int_equal(r[1].last, 5460);
    assert_int_equal(r[1].port, 7101);
    assert_int_equal(r[3].first, 10923);
    assert_int_equal(r[3].port, 7103);
    freeReplyObject(rep);

    /* After a reshard: a master with two ranges; one that does not know
     * its address (""), which is the host the reply came from; an old
     * reply's master with two fields only (Redis 3). */
    rep = parse_resp("*3\r\n"
                     "*3\r\n:0\r\n:99\r\n*2\r\n$0\r\n\r\n:7000\r\n"
                     "*3\r\n:100\r\n:200\r\n*2\r\n$3\r\n::1\r\n:7001\r\n"
                     "*3\r\n:201\r\n:16383\r\n*2\r\n$1\r\n?\r\n:7000\r\n");
    assert_true(rc_parse_slots(rep, "10.0.0.9", r, 8, &n));
    assert_int_equal(n, 3);
    assert_string_equal(r[0].host, "10.0.0.9");
    assert_string_equal(r[1].host, "::1");
    assert_string_equal(r[2].host, "10.0.0.9");
    freeReplyObject(rep);

    /* An empty map (a node before `cluster create`): no ranges. */
    rep = parse_resp("*0\r\n");
    assert_true(rc_parse_slots(rep, "h", r, 8, &n));
    assert_int_equal(n, 0);
    freeReplyObject(rep);

    static const char *bad[] = {
        "-ERR This instance has cluster support disabled\r\n",
        ":1\r\n",
        "*1\r\n*2\r\n:0\r\n:1\r\n",                      /* no master */
        "*1\r\n*3\r\n:5\r\n:4\r\n*2\r\n$1\r\nh\r\n:1\r\n", /* backwards */
        "*1\r\n*3\r\n:0\r\n:16384\r\n*2\r\n$1\r\nh\r\n:1\r\n", /* past */
        "*1\r\n*3\r\n:-1\r\n:3\r\n*2\r\n$1\r\nh\r\n:1\r\n",
        "*1\r\n*3\r\n:0\r\n:3\r\n*2\r\n$1\r\nh\r\n:0\r\n",    /* port 0 */
        "*1\r\n*3\r\n:0\r\n:3\r\n*2\r\n$1\r\nh\r\n:65536\r\n",
        "*1\r\n*3\r\n:0\r\n:3\r\n*2\r\n:1\r\n:1\r\n",         /* host */
        "*1\r\n*3\r\n$1\r\n0\r\n:3\r\n*2\r\n$1\r\nh\r\n:1\r\n",
        "*1\r\n*3\r\n:0\r\n:3\r\n*1\r\n$1\r\nh\r\n",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        rep = parse_resp(bad[i]);
        if (rc_parse_slots(rep, "", r, 8, &n))
            fail_msg("bad reply %zu parsed", i);
        freeReplyObject(rep);
    }
    assert_false(rc_parse_slots(NULL, "", r, 8, &n));
}

/* The slot map both transports keep, from a reply: each master placed by
 * the caller's node_of (here: by port, 7103 refused in one run). */
static int port_index(void *ctx, const char *host, int port)
{
    (void)host;
    int refuse = *(int *)ctx;
    return port == refuse ? -1 : port - 7101;
}

static void slot_map_built(void **state)
{
    (void)state;
    uint8_t map[RC_SLOTS];
    int refuse = 0;
    redisReply *rep = parse_resp(resharded);
    assert_true(rc_slot_map(rep, "seed", port_index, &refuse, map));
    assert_int_equal(map[0], 3); /* 7103: index 2, stored + 1 */
    assert_int_equal(map[9], 3);
    assert_int_equal(map[10], 1);
    assert_int_equal(map[5460], 1);
    assert_int_equal(map[5461], 2);
    assert_int_equal(map[16383], 3);
    refuse = 7103; /* a master the caller cannot place */
    assert_false(rc_slot_map(rep, "seed", port_index, &refuse, map));
    freeReplyObject(rep);
    rep = parse_resp("*1\r\n:5\r\n"); /* no CLUSTER SLOTS reply */
    refuse = 0;
    assert_false(rc_slot_map(rep, "seed", port_index, &refuse, map));
    freeReplyObject(rep);
}

static void redirections_parsed(void **state)
{
    (void)state;
    char host[RC_HOST_MAX];
    unsigned slot = 0;
    int port = 0;
#define RD(s) rc_parse_redirect(s, strlen(s), "self", &slot, host, &port)
    assert_int_equal(RD("MOVED 3999 127.0.0.1:6381"), RC_MOVED);
    assert_int_equal(slot, 3999);
    assert_string_equal(host, "127.0.0.1");
    assert_int_equal(port, 6381);
    assert_int_equal(RD("ASK 16383 ::1:7002"), RC_ASK);
    assert_int_equal(slot, 16383);
    assert_string_equal(host, "::1");
    assert_int_equal(port, 7002);
    assert_int_equal(RD("MOVED 0 :7003"), RC_MOVED); /* no host: ours */
    assert_string_equal(host, "self");
    assert_int_equal(RD("TRYAGAIN Multiple keys request during rehashing "
                        "of slot"), RC_TRYAGAIN);
    static const char *no[] = {
        "ERR unknown", "MOVED", "MOVED 3999", "MOVED 16384 h:1",
        "MOVED x h:1", "MOVED 1 h", "MOVED 1 h:", "MOVED 1 h:0",
        "MOVED 1 h:65536", "MOVED 1 h:12a", "ASK 1  ", "MOVED 1234567 h:1",
        "CLUSTERDOWN The cluster is down", "NOSCRIPT No matching script",
    };
    for (size_t i = 0; i < sizeof no / sizeof no[0]; i++)
        if (RD(no[i]) != RC_NONE)
            fail_msg("'%s' parsed as a redirection", no[i]);
#undef RD
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(crc16_and_slots),
        cmocka_unit_test(slots_reply_parsed),
        cmocka_unit_test(slot_map_built),
        cmocka_unit_test(redirections_parsed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
