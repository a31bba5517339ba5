/* SPDX-License-Identifier: MIT */
/*
 * SHA-1 over a whole message in memory (sha1.h): the message padded
 * to whole 64-byte blocks (a 0x80 byte, zeros, its length in bits as 8
 * big-endian bytes), each block expanded to 80 words and run through the
 * 80 rounds of the standard.
 */
#include "sha1.h"

#include <stdint.h>
#include <string.h>

static uint32_t rol(uint32_t x, unsigned n)
{
    return (x << n) | (x >> (32 - n));
}

static void block(uint32_t h[5], const unsigned char *p)
{
    uint32_t w[80];

    for (int i = 0; i < 16; i++)
        w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 |
               (uint32_t)p[4 * i + 2] << 8 | (uint32_t)p[4 * i + 3];
    for (int i = 16; i < 80; i++)
        w[i] = rol(w[i - 3] ^ w[i - 8] ^ w[i - 14] ^ w[i - 16], 1);
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4];
    for (int i = 0; i < 80; i++) {
        uint32_t f, k;
        if (i < 20)
            f = (b & c) | (~b & d), k = 0x5a827999u;
        else if (i < 40)
            f = b ^ c ^ d, k = 0x6ed9eba1u;
        else if (i < 60)
            f = (b & c) | (b & d) | (c & d), k = 0x8f1bbcdcu;
        else
            f = b ^ c ^ d, k = 0xca62c1d6u;
        uint32_t t = rol(a, 5) + f + e + k + w[i];
        e = d;
        d = c;
        c = rol(b, 30);
        b = a;
        a = t;
    }
    h[0] += a;
    h[1] += b;
    h[2] += c;
    h[3] += d;
    h[4] += e;
}

void rate__sha1_hex(const void *data, size_t len, char hex[41])
{
    static const char digits[] = "0123456789abcdef";
    uint32_t h[5] = {0x67452301u, 0xefcdab89u, 0x98badcfeu, 0x10325476u,
                     0xc3d2e1f0u};
    const unsigned char *p = data;
    size_t whole = len - len % 64;
    unsigned char tail[128];

    for (size_t i = 0; i < whole; i += 64)
        block(h, p + i);
    size_t rest = len - whole;
    memset(tail, 0, sizeof tail);
    if (rest > 0)
        memcpy(tail, p + whole, rest);
    tail[rest] = 0x80;
    size_t tl = rest + 1 + 8 <= 64 ? 64 : 128;
    uint64_t bits = (uint64_t)len * 8;
    for (int i = 0; i < 8; i++)
        tail[tl - 1 - (size_t)i] = (unsigned char)(bits >> (8 * i));
    block(h, tail);
    if (tl == 128)
        block(h, tail + 64);
    for (int i = 0; i < 20; i++) {
        unsigned char byte = (unsigned char)(h[i / 4] >> (24 - 8 * (i % 4)));
        hex[2 * i] = digits[byte >> 4];
        hex[2 * i + 1] = digits[byte & 15];
    }
    hex[40] = '\0';
}
