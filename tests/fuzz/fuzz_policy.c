/* SPDX-License-Identifier: MIT */
/* libFuzzer target: the policy text parser, and the round trip through its
 * canonical form (format, parse again, same limits); the count, duration
 * and rate parsers on the same text, which name every error and agree
 * with the policy text (the same rules). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <ratelimit.h>

/* The exported parsers on text: each error has a message; a good rate is
 * the rate the policy text reads from "fixed-window TEXT". */
static void parsers(const char *text)
{
    char err[256] = "", pol[300];
    uint64_t c, per, ns;
    rate_policy_t *p = NULL;

    if (rate_parse_count(text, &c, err, sizeof err) != RATE_OK &&
        strlen(err) == 0)
        abort();
    err[0] = '\0';
    if (rate_parse_duration(text, &ns, err, sizeof err) != RATE_OK &&
        strlen(err) == 0)
        abort();
    err[0] = '\0';
    if (rate_parse_rate(text, &c, &per, err, sizeof err) != RATE_OK) {
        if (strlen(err) == 0)
            abort();
        return;
    }
    if (strlen(text) + 14 > sizeof pol || strchr(text, ';') != NULL)
        return;
    snprintf(pol, sizeof pol, "fixed-window %s", text);
    if (rate_policy_parse(pol, &p, err, sizeof err) == RATE_OK &&
        (rate_policy_limit(p, 0)->limit != c ||
         rate_policy_limit(p, 0)->period_ns != per))
        abort();
    rate_policy_free(p);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1);
    rate_policy_t *p = NULL, *q = NULL;
    char err[256], canon[512];

    if (text == NULL)
        return 0;
    memcpy(text, data, size);
    text[size] = '\0';
    if (rate_policy_parse(text, &p, err, sizeof err) == RATE_OK) {
        size_t need = rate_policy_format(p, canon, sizeof canon);
        if (need < sizeof canon) {
            if (rate_policy_parse(canon, &q, err, sizeof err) != RATE_OK)
                abort(); /* the canonical form must parse */
            if (rate_policy_count(p) != rate_policy_count(q) ||
                strcmp(rate_policy_name(p), rate_policy_name(q)) != 0)
                abort(); /* limits and name survive the round trip */
            for (size_t i = 0; i < rate_policy_count(p); i++)
                if (memcmp(rate_policy_limit(p, i), rate_policy_limit(q, i),
                           sizeof(rate_limit_t)) != 0)
                    abort();
        }
    } else if (strlen(err) == 0) {
        abort(); /* every error names what is wrong */
    }
    parsers(text);
    rate_policy_free(q);
    rate_policy_free(p);
    free(text);
    return 0;
}
