/* SPDX-License-Identifier: MIT */
/*
 * rm_api.h -- the few Redis module API calls ratelimit.so uses, declared
 * by hand from the module API's reference documentation (Debian ships no
 * module header, and none is copied here).  The server passes the module
 * context to RedisModule_OnLoad; the context's first member is the
 * server's GetApi function, which hands out every other call by its name
 * ("RedisModule_OpenKey", ...).  The module looks each one up once, at
 * load time, into a table of its own (rm_api_t), and fails the load when
 * the server lacks one.  Which calls and why: docs/redis-module.md, "The
 * declarations".
 *
 * The table is a struct, not one global per call: redis-server exports
 * its own functions under names like RM_OpenKey, and a module global of
 * that name, built without hidden visibility, would be bound to the
 * server's function (the load then writes into the server's code).
 */
#ifndef RATELIMIT_RM_API_H
#define RATELIMIT_RM_API_H

#include <stddef.h>
#include <stdint.h>

/* Opaque types of the server's. */
typedef struct RedisModuleCtx RedisModuleCtx;
typedef struct RedisModuleKey RedisModuleKey;
typedef struct RedisModuleString RedisModuleString;
typedef long long mstime_t;

typedef int (*RedisModuleCmdFunc)(RedisModuleCtx *ctx,
                                  RedisModuleString **argv, int argc);

/* Constants, as the reference documents them. */
#define RM_OK 0
#define RM_ERR 1
#define RM_APIVER_1 1
#define RM_READ (1 << 0)
#define RM_WRITE (1 << 1)
#define RM_KEYTYPE_EMPTY 0
#define RM_KEYTYPE_HASH 3
#define RM_HASH_CFIELDS (1 << 2) /* field names are C strings */
#define RM_NO_EXPIRE (-1LL)

/* Every call looked up, one line each: X(name, return type, arguments). */
#define RM_API_MAP(X)                                                        \
    X(SetModuleAttribs, void, (RedisModuleCtx *, const char *, int, int))   \
    X(IsModuleNameBusy, int, (const char *))                                 \
    X(CreateCommand, int,                                                    \
      (RedisModuleCtx *, const char *, RedisModuleCmdFunc, const char *,    \
       int, int, int))                                                       \
    X(OpenKey, RedisModuleKey *, (RedisModuleCtx *, RedisModuleString *, int))        \
    X(CloseKey, void, (RedisModuleKey *))                                    \
    X(KeyType, int, (RedisModuleKey *))                                      \
    X(HashGet, int, (RedisModuleKey *, int, ...))                            \
    X(HashSet, int, (RedisModuleKey *, int, ...))                            \
    X(SetAbsExpire, int, (RedisModuleKey *, mstime_t))                       \
    X(SetExpire, int, (RedisModuleKey *, mstime_t))                          \
    X(CreateString, RedisModuleString *,                                     \
      (RedisModuleCtx *, const char *, size_t))                              \
    X(FreeString, void, (RedisModuleCtx *, RedisModuleString *))             \
    X(StringPtrLen, const char *, (const RedisModuleString *, size_t *))     \
    X(ReplyWithArray, int, (RedisModuleCtx *, long))                         \
    X(ReplyWithLongLong, int, (RedisModuleCtx *, long long))                 \
    X(ReplyWithStringBuffer, int, (RedisModuleCtx *, const char *, size_t))   \
    X(ReplyWithError, int, (RedisModuleCtx *, const char *))                 \
    X(WrongArity, int, (RedisModuleCtx *))                                   \
    X(Replicate, int, (RedisModuleCtx *, const char *, const char *, ...))

/* The table of the calls, one member each, named as in RM_API_MAP. */
#define RM_MEMBER_(name, ret, args) ret(*name) args;
typedef struct rm_api {
    RM_API_MAP(RM_MEMBER_)
} rm_api_t;
#undef RM_MEMBER_

#endif
