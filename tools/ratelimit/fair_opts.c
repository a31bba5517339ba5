/* SPDX-License-Identifier: MIT */
/*
 * --fair KEY and --weight FLOW=W (fair_opts.h).
 */
#include <string.h>

#include "cli.h"
#include "fair_opts.h"

#include <ratelimit_store.h>

int fair_opt_weight(fair_opts_t *o, const char *cmd, const char *text)
{
    const char *eq = strrchr(text, '=');
    if (eq == NULL || eq == text)
        return cli_fail("%s: --weight '%s' is not FLOW=WEIGHT (e.g. "
                        "--weight alice=4)", cmd, text);
    uint64_t w;
    if (rate_parse_count(eq + 1, &w, NULL, 0) != RATE_OK || w == 0 ||
        w > RATE_FAIR_WEIGHT_MAX)
        return cli_fail("%s: --weight '%s': the weight '%s' is not a whole "
                        "number from 1 to %u", cmd, text, eq + 1,
                        RATE_FAIR_WEIGHT_MAX);
    size_t len = (size_t)(eq - text);
    if (len > RATE_KEY_MAX)
        return cli_fail("%s: --weight '%.40s...': the flow is longer than "
                        "%d bytes", cmd, text, RATE_KEY_MAX);
    for (size_t i = 0; i < o->n; i++)
        if (o->flow_len[i] == len && memcmp(o->flow[i], text, len) == 0) {
            o->weight[i] = (uint32_t)w; /* the last one given wins */
            return 0;
        }
    if (o->n == FAIR_WEIGHTS_MAX)
        return cli_fail("%s: more than %d --weight options", cmd,
                        FAIR_WEIGHTS_MAX);
    o->flow[o->n] = text;
    o->flow_len[o->n] = len;
    o->weight[o->n] = (uint32_t)w;
    o->n++;
    return 0;
}

int fair_opts_check(const fair_opts_t *o, const char *cmd)
{
    if (o->key == NULL)
        return o->n > 0 ? cli_fail("%s: --weight needs --fair KEY (the "
                                   "shared limit the weights divide)", cmd)
                        : 0;
    size_t len = strlen(o->key);
    if (len == 0 || len > RATE_KEY_MAX)
        return cli_fail("%s: --fair '%.40s': the shared limit's key must be "
                        "1 to %d bytes", cmd, o->key, RATE_KEY_MAX);
    return 0;
}

uint32_t fair_weight_of(const fair_opts_t *o, const char *flow, size_t len)
{
    for (size_t i = 0; i < o->n; i++)
        if (o->flow_len[i] == len && memcmp(o->flow[i], flow, len) == 0)
            return o->weight[i];
    return 1;
}

int fair_open(const fair_opts_t *o, const char *cmd, rate_limiter_t *lim,
              rate_fair_t **out)
{
    /* In the process, the largest table: a replay's flows are tracked
     * one an entry however many there are (up to 4096 active at once), so
     * that what it shows is the rule's, not the table's sharing.  A store
     * that keeps the table itself (Redis: read and written whole at each
     * decision) keeps its default. */
    bool fleet = rate_limiter_check_fair_at(lim, NULL, NULL, 0, NULL, 0, 0,
                                            NULL) == RATE_OK;
    rate_fair_config_t c = {.limiter = lim, .key = o->key,
                            .key_len = strlen(o->key),
                            .slots = fleet ? 0 : RATE_FAIR_SLOTS_MAX,
                            .queue_max = fleet ? 0 : 1};
    char why[256];
    if (rate_fair_new(&c, out, why, sizeof why) != RATE_OK)
        return cli_fail("%s: --fair: %s", cmd, why);
    return 0;
}
