/* SPDX-License-Identifier: MIT */
/*
 * The suites' one random generator (header-only, static): xorshift64, the
 * same sequence for the same seed on every machine, so that a failing trace
 * is the same trace when run again.  A file picks its seed by defining
 * RND_SEED before including this header; rnd_seed() starts the sequence
 * again (a test that must see the same traces whatever ran before it).
 */
#ifndef TEST_LIB_RNG_H
#define TEST_LIB_RNG_H

#include <stdint.h>

#ifndef RND_SEED
#define RND_SEED 0x9E3779B97F4A7C15ull
#endif

static uint64_t rnd_state = RND_SEED;

/* Starts the sequence again from `seed` (0, which xorshift cannot leave:
 * RND_SEED). */
static inline void rnd_seed(uint64_t seed)
{
    rnd_state = seed != 0 ? seed : RND_SEED;
}

/* A number in [0, n), 0 when n is 0. */
static inline uint64_t rnd(uint64_t n)
{
    rnd_state ^= rnd_state << 13;
    rnd_state ^= rnd_state >> 7;
    rnd_state ^= rnd_state << 17;
    return n ? rnd_state % n : 0;
}

#endif
