/* SPDX-License-Identifier: MIT */
/*
 * fail.h -- how the calls that take an error buffer say what was wrong:
 * one writer (src/error.c) for every layer, including those built on the
 * public headers alone (the stores, leases, the rules file).  Never
 * installed.
 */
#ifndef RATE_FAIL_H
#define RATE_FAIL_H

#include <stddef.h>

/* Writes a message to err (when err is not NULL and errlen > 0), as
 * snprintf would, and returns rc. */
int rate__fail(char *err, size_t errlen, int rc, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#endif
