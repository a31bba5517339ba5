/* SPDX-License-Identifier: MIT */
/*
 * shm_keys PATH: prints a shared-memory region's keys and policy records
 * ("KEYS POLICIES") after a full check of it, for shm_cli_test.sh.
 * Exit status 0, or 1 with the reason on standard error.
 */
#include <stdio.h>

#include <ratelimit.h>
#include <ratelimit_shm.h>

int main(int argc, char **argv)
{
    rate_shm_options_t o = {.no_create = true};
    rate_store_t *s = NULL;
    rate_shm_info_t info;
    char err[256] = "";

    if (argc != 2) {
        fprintf(stderr, "usage: shm_keys PATH\n");
        return 1;
    }
    if (rate_store_shm_new(argv[1], &o, &s, err, sizeof err) != RATE_OK ||
        rate_store_shm_check(s, err, sizeof err) != RATE_OK ||
        rate_store_shm_info(s, &info) != RATE_OK) {
        fprintf(stderr, "shm_keys: %s\n", err);
        rate_store_free(s);
        return 1;
    }
    printf("%llu %llu\n", (unsigned long long)info.keys,
           (unsigned long long)info.policies);
    rate_store_free(s);
    return 0;
}
