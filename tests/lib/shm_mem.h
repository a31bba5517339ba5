/* SPDX-License-Identifier: MIT */
/*
 * A shared-memory store over a zeroed region of this process's heap, for
 * the tests of a region's bounds (key_max, state_max) that need no file.
 */
#ifndef TEST_SHM_MEM_H
#define TEST_SHM_MEM_H

#include <stdlib.h>
#include <string.h>

#include <ratelimit_shm.h>

#include "helpers.h"

/* The store made with `o` in a fresh region; *mem is the region, for
 * free() after rate_store_free. */
static inline rate_store_t *shm_mem_new(const rate_shm_options_t *o,
                                        void **mem)
{
    size_t len = rate_store_shm_size(o);
    rate_store_t *store = NULL;
    assert_int_not_equal(len, 0);
    assert_int_equal(posix_memalign(mem, 4096, len), 0);
    memset(*mem, 0, len);
    assert_int_equal(rate_store_shm_new_in(*mem, len, o, &store, NULL, 0),
                     RATE_OK);
    return store;
}

#endif /* TEST_SHM_MEM_H */
