/* SPDX-License-Identifier: MIT */
/*
 * ratelimit bench --rules: a rules check (rate_rules_check on the memory
 * store) by the size of the rules file, 10 to 100,000 API keys, written
 * two ways: a rule per key (the key's own limit), and one tier rule with
 * a match line per key.  Beside them, a file of one rule, the floor.
 * Single thread; each figure is ns per check, the best of 3 rounds of a
 * fixed span (docs/performance.md, "Rules").
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "ratelimit_http.h"

#define SPAN_NS (200 * UINT64_C(1000000))
#define CALLS_MAX 4096u

/* Writes a rules file of n keys to a temporary path: a rule per key
 * (per_key) or one tier rule listing them; then the default rule.  The
 * path is returned in buf; false if it could not be written. */
static bool write_rules(char *buf, size_t len, unsigned n, bool per_key)
{
    snprintf(buf, len, "/tmp/ratelimit-bench-rules-XXXXXX");
    int fd = mkstemp(buf);
    if (fd < 0)
        return false;
    FILE *f = fdopen(fd, "w");
    if (f == NULL) {
        close(fd);
        unlink(buf);
        return false;
    }
    fputs("[policies]\nfree = token-bucket 5/s burst=10\n"
          "pro = token-bucket 1000000/s burst=1000000\n",
          f);
    if (per_key) {
        for (unsigned i = 0; i < n; i++)
            fprintf(f, "[rule k%u]\ngroup = tier\nmatch = api_key=key-%u\n"
                       "policy = pro\n",
                    i, i);
    } else if (n > 0) {
        fputs("[rule pro]\ngroup = tier\n", f);
        for (unsigned i = 0; i < n; i++)
            fprintf(f, "match = api_key=key-%u\n", i);
        fputs("policy = pro\n", f);
    }
    fputs("[rule free]\ngroup = tier\npolicy = free\n", f);
    bool ok = fclose(f) == 0;
    if (!ok)
        unlink(buf);
    return ok;
}

/* ns per check of keys drawn over the n listed (every one a match), the
 * best of 3 rounds; 0 on an error (said on stderr). */
static double measure(unsigned n, bool per_key, double *load_ms)
{
    char path[64], err[256];
    rate_rules_t *rules = NULL;
    rate_limiter_t *lim = NULL;
    rate_policy_t *p = NULL;
    double best = 0;

    if (!write_rules(path, sizeof path, n, per_key)) {
        fprintf(stderr, "bench: cannot write a rules file in /tmp\n");
        return 0;
    }
    uint64_t t0 = rate_clock_monotonic_ns();
    int rc = rate_rules_load(path, &rules, err, sizeof err);
    *load_ms = (double)(rate_clock_monotonic_ns() - t0) / 1e6;
    unlink(path);
    if (rc != RATE_OK) {
        fprintf(stderr, "bench: rules: %s\n", err);
        return 0;
    }
    rc = rate_policy_parse("token-bucket 1000000/s burst=1000000", &p, err,
                           sizeof err);
    rate_limiter_config_t cfg = {.policy = p};
    if (rc == RATE_OK)
        rc = rate_limiter_new(&cfg, &lim);
    if (rc != RATE_OK) {
        fprintf(stderr, "bench: limiter: %s\n", rate_strerror(rc));
        rate_rules_free(rules);
        rate_policy_free(p);
        return 0;
    }
    char (*vals)[16] = malloc(CALLS_MAX * sizeof *vals);
    unsigned m = n == 0 ? 1 : n;
    for (unsigned i = 0; vals != NULL && i < CALLS_MAX; i++)
        snprintf(vals[i], sizeof vals[i], "key-%u",
                 (unsigned)(((uint64_t)i * 2654435761u) % m));
    for (unsigned round = 0; vals != NULL && round < 3; round++) {
        uint64_t calls = 0, start = rate_clock_monotonic_ns(), spent;
        do {
            for (unsigned i = 0; i < 256; i++, calls++) {
                const char *v = vals[calls % CALLS_MAX];
                rate_attr_t a = {"api_key", v};
                rate_outcome_t out;
                if (rate_rules_check(rules, lim, v, strlen(v), &a, 1, 1, 0,
                                     &out) != RATE_OK) {
                    fprintf(stderr, "bench: rules check failed\n");
                    round = 3;
                    best = 0;
                    break;
                }
            }
            spent = rate_clock_monotonic_ns() - start;
        } while (round < 3 && spent < SPAN_NS);
        double ns = (double)spent / (double)calls;
        if (round < 3 && (best == 0 || ns < best))
            best = ns;
    }
    free(vals);
    rate_limiter_free(lim);
    rate_policy_free(p);
    rate_rules_free(rules);
    return best;
}

int bench_rules(void)
{
    static const unsigned sizes[] = {10, 1000, 100000};
    double load_ms, floor = measure(0, true, &load_ms);

    if (floor == 0)
        return 1;
    printf("rules check, memory store, 1 thread (ns per check; x the one-rule "
           "file)\n");
    printf("  %-28s %10.1f ns  %8s\n", "one rule (floor)", floor, "1.00");
    for (unsigned s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
        for (int per_key = 1; per_key >= 0; per_key--) {
            double ns = measure(sizes[s], per_key != 0, &load_ms);
            if (ns == 0)
                return 1;
            char label[64];
            snprintf(label, sizeof label, "%u keys, %s", sizes[s],
                     per_key ? "a rule each" : "one tier rule");
            printf("  %-28s %10.1f ns  %8.2f   (load %.1f ms)\n", label, ns,
                   ns / floor, load_ms);
            fflush(stdout);
        }
    return 0;
}
