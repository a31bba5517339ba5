/* SPDX-License-Identifier: MIT */
/*
 * A fake Redis module host, for running ratelimit.so's commands inside a
 * test program (tests/fuzz/fuzz_module.c): the calls redis-module/rm_api.h
 * looks up, over a keyspace of its own and a replica fed only by what the
 * module replicates.  Not thread-safe: one server, one command at a time.
 *
 * It aborts, naming the fault, where redis-server 7.0 would assert or
 * touch freed memory (src/module.c, src/db.c): a write through a handle
 * opened while its key was absent after another handle made the key
 * (dbAdd's 'de != NULL'), a handle used after its key's value was
 * deleted, a key closed twice, a string freed twice or an argument
 * freed.  And where the module breaks its own contract: a key the
 * command does not declare, a handle or a string still open when the
 * command returns, a reply that is not exactly one whole reply, a
 * replica that differs from the master after the command.
 */
#ifndef RATE_TEST_MODULE_HOST_H
#define RATE_TEST_MODULE_HOST_H

#include <stddef.h>

#include "../../redis-module/rm_api.h"

/* A reply, as a client would read it. */
typedef enum mh_kind { MH_INT, MH_STR, MH_ERR, MH_ARRAY } mh_kind_t;

typedef struct mh_reply {
    mh_kind_t kind;
    long long n;             /* MH_INT */
    char *s;                 /* MH_STR, MH_ERR: the bytes, NUL after */
    size_t len;
    size_t count;            /* MH_ARRAY: its elements */
    struct mh_reply **el;
} mh_reply_t;

typedef int (*mh_onload_fn)(RedisModuleCtx *ctx, RedisModuleString **argv,
                            int argc);

/* Loads a module (its RedisModule_OnLoad) into the fake server; aborts
 * when the module refuses to load. */
void mh_load(mh_onload_fn onload);

/* Runs the command argv[0] (its words argv[0..argc), each lens[i] bytes)
 * as the server would, then checks what it left (see above).  Returns its
 * reply, valid until the next call; NULL for a command no module made. */
const mh_reply_t *mh_command(int argc, const char *const *argv,
                             const size_t *lens);

/* A client's commands, on the master and the replica alike: HSET of one
 * field, SET (a key of another type than a hash), DEL. */
void mh_hset(const char *key, size_t klen, const char *field,
             const char *value, size_t vlen);
void mh_set(const char *key, size_t klen);
void mh_del(const char *key, size_t klen);
/* FLUSHALL. */
void mh_flush(void);

#endif
