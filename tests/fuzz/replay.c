/* SPDX-License-Identifier: MIT */
/* Runs a libFuzzer target without libFuzzer: each file named, or each file
 * in each directory named, through LLVMFuzzerTestOneInput once.  The
 * suites fuzz_NAME replay the seed corpus this way under ASan and UBSan;
 * `make fuzz` searches with the real libFuzzer (clang).  With --damage
 * COUNT SEED FILE [KEEP_DIR], randomly damaged copies of FILE instead,
 * each in a process of its own (damage.c). */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
/* Optional in a target (fuzz_shm has one): weak, so null when absent. */
__attribute__((weak)) int LLVMFuzzerInitialize(int *argc, char ***argv);
int rate__fuzz_damage(int argc, char **argv);

static int run_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        fprintf(stderr, "replay: cannot open %s\n", path);
        return 1;
    }
    uint8_t *buf = NULL;
    size_t len = 0, cap = 0, n;
    do {
        if (len == cap) {
            cap = cap ? cap * 2 : 4096;
            uint8_t *nb = realloc(buf, cap);
            if (nb == NULL) {
                fprintf(stderr, "replay: out of memory reading %s\n", path);
                free(buf);
                fclose(f);
                return 1;
            }
            buf = nb;
        }
        n = fread(buf + len, 1, cap - len, f);
        len += n;
    } while (n > 0);
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        fprintf(stderr, "replay: cannot read %s\n", path);
        free(buf);
        return 1;
    }
    /* An exact-size copy, so a read past the input is caught by ASan. */
    uint8_t *exact = malloc(len ? len : 1);
    if (exact == NULL) {
        fprintf(stderr, "replay: out of memory reading %s\n", path);
        free(buf);
        return 1;
    }
    if (len > 0)
        memcpy(exact, buf, len);
    free(buf);
    LLVMFuzzerTestOneInput(exact, len);
    free(exact);
    return 0;
}

int main(int argc, char **argv)
{
    int failed = 0, runs = 0;

    if (argc < 2) {
        fprintf(stderr, "usage: %s FILE|DIR...\n", argv[0]);
        return 2;
    }
    if (LLVMFuzzerInitialize != NULL)
        LLVMFuzzerInitialize(&argc, &argv);
    if (strcmp(argv[1], "--damage") == 0)
        return rate__fuzz_damage(argc - 2, argv + 2);
    for (int i = 1; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st) != 0) {
            fprintf(stderr, "replay: no such file or directory: %s\n", argv[i]);
            failed = 1;
            continue;
        }
        if (!S_ISDIR(st.st_mode)) {
            failed |= run_file(argv[i]);
            runs++;
            continue;
        }
        struct dirent **names;
        int n = scandir(argv[i], &names, NULL, alphasort);
        if (n < 0) {
            fprintf(stderr, "replay: cannot list %s\n", argv[i]);
            failed = 1;
            continue;
        }
        for (int k = 0; k < n; k++) {
            char path[4096];
            if (names[k]->d_name[0] != '.' &&
                snprintf(path, sizeof path, "%s/%s", argv[i],
                         names[k]->d_name) < (int)sizeof path) {
                failed |= run_file(path);
                runs++;
            }
            free(names[k]);
        }
        free(names);
    }
    printf("replay: %d inputs%s\n", runs, failed ? ", some unreadable" : "");
    /* No input at all is a failure too: a corpus moved away would pass. */
    return failed || runs == 0;
}
