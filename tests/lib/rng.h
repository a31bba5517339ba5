/* SPDX-License-Identifier: MIT */
/*
 * The suites' one random generator (header-only, static): xorshift64, the
 * same sequence for the same seed on every machine, so that a failing trace
 * is the same trace when run again.  A file picks its seed by defining
 * RND_SEED before including this header; rnd_seed() starts the sequence
 * again (a test that must see the same traces whatever ran before it).
 * A thread or process that draws on its own keeps its own state and calls
 * rnd_next() or rnd_from() on it.
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

/* One step of the generator on a state of the caller's own (a thread's or
 * a process's, never 0): the new state, which is the number drawn. */
static inline uint64_t rnd_next(uint64_t *state)
{
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    return *state;
}

/* A number in [0, n) from a state of the caller's own, 0 when n is 0. */
static inline uint64_t rnd_from(uint64_t *state, uint64_t n)
{
    uint64_t x = rnd_next(state);
    return n ? x % n : 0;
}

/* A number in [0, n) from the file's sequence, 0 when n is 0. */
static inline uint64_t rnd(uint64_t n)
{
    return rnd_from(&rnd_state, n);
}

#endif
