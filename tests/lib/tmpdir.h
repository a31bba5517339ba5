/* SPDX-License-Identifier: MIT */
/* A suite's own directory under /tmp: made by the group's set-up, removed
 * with what is in it by its tear-down, and files written into it. */
#ifndef RATE_TEST_TMPDIR_H
#define RATE_TEST_TMPDIR_H

#include <stdio.h>
#include <stdlib.h>

static char test_dir[64];

/* Group set-up (cmocka): makes /tmp/<name>.XXXXXX. */
#define TEST_DIR_SETUP(name)                                                \
    static int test_dir_setup(void **state)                                 \
    {                                                                       \
        (void)state;                                                        \
        snprintf(test_dir, sizeof test_dir, "/tmp/" name ".XXXXXX");       \
        return mkdtemp(test_dir) != NULL ? 0 : -1;                          \
    }

/* Group tear-down (cmocka): removes the directory and its files. */
static inline int test_dir_teardown(void **state)
{
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", test_dir);
    return system(cmd) == 0 ? 0 : -1;
}

/* Writes `text` to the file `name` of the directory; its path, valid
 * until the fourth call after this one. */
static inline const char *test_dir_file(const char *name, const char *text)
{
    static char path[4][128];
    static int next;
    char *p = path[next++ % 4];
    snprintf(p, 128, "%s/%s", test_dir, name);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    return p;
}

#endif
