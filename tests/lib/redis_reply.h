/* SPDX-License-Identifier: MIT */
/* A Redis reply from its RESP text, through hiredis's reader, as the
 * store gets it (the offline suites: test_redis_router.c,
 * test_redis_protocol.c).  freeReplyObject() it after. */
#ifndef RATE_TEST_REDIS_REPLY_H
#define RATE_TEST_REDIS_REPLY_H

#include <hiredis/hiredis.h>

#include "helpers.h"

static inline redisReply *parse_resp(const char *text)
{
    redisReader *rd = redisReaderCreate();
    void *rep = NULL;
    assert_int_equal(redisReaderFeed(rd, text, strlen(text)), REDIS_OK);
    assert_int_equal(redisReaderGetReply(rd, &rep), REDIS_OK);
    assert_non_null(rep);
    redisReaderFree(rd);
    return rep;
}

#endif
