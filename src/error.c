/* SPDX-License-Identifier: MIT */
/*
 * Error and reason names, generated from the one list in ratelimit.h, and
 * the writer of the library's error messages.
 */
#include <stdarg.h>
#include <stdio.h>

#include "kit.h"

int rate__fail(char *err, size_t errlen, int rc, const char *fmt, ...)
{
    if (err != NULL && errlen > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return rc;
}

const char *rate_strerror(int err)
{
    switch (err) {
    case RATE_OK:
        return "success";
    case RATE_PENDING:
        return "pending: the decision is under way, its callback will run "
               "(not an error)";
#define RATE_X_(name, code, text)                                           \
    case code:                                                              \
        return text;
        RATE_ERRNO_MAP(RATE_X_)
#undef RATE_X_
    default:
        return "unknown error";
    }
}

const char *rate_err_name(int err)
{
    switch (err) {
    case RATE_OK:
        return "RATE_OK";
    case RATE_PENDING:
        return "RATE_PENDING";
#define RATE_X_(name, code, text)                                           \
    case code:                                                              \
        return "RATE_" #name;
        RATE_ERRNO_MAP(RATE_X_)
#undef RATE_X_
    default:
        return "RATE_EUNKNOWN";
    }
}

const char *rate_reason_name(rate_reason_t reason)
{
    switch (reason) {
    case RATE_REASON_ALLOWED:
        return "allowed";
    case RATE_REASON_LIMITED:
        return "limited";
    case RATE_REASON_NEVER:
        return "never";
    case RATE_REASON_STORE_ERROR:
        return "store-error";
    }
    return "unknown";
}
