/* SPDX-License-Identifier: MIT */
/*
 * SHA-1 (FIPS 180-4), for one thing only: the name Redis gives a script
 * (EVALSHA takes the lowercase hex of its SHA-1), known before any server
 * is asked.  Not for security.
 */
#ifndef RATE_SHA1_H
#define RATE_SHA1_H

#include <stddef.h>

/* hex: 40 lowercase hex digits of the SHA-1 of data[0..len), and a NUL. */
void rate__sha1_hex(const void *data, size_t len, char hex[41]);

#endif
