/* SPDX-License-Identifier: MIT */
/*
 * ratelimit check: one decision for one key, for shell scripts and cron.
 * Exit status 0 allowed, 1 denied, 2 error.
 */
#include <getopt.h>
#include <string.h>

#include "cli.h"

static const char usage[] =
    "usage: ratelimit check --key KEY --algorithm NAME [policy options]\n"
    "                       [--permits N] [--max-wait DUR] [--store STORE]\n"
    "                       [--max-keys N] [--store-timeout DUR]\n"
    "       ratelimit check --key KEY --policy TEXT [--permits N]\n"
    "                       [--max-wait DUR] [--store STORE] [--max-keys N]\n"
    "                       [--store-timeout DUR]\n"
    "       ratelimit check --key KEY --policy 'concurrency N ttl=DUR ...'\n"
    "                       [--critical] [--store STORE] [--store-timeout DUR]\n"
    "                       [-- COMMAND [ARG...]]\n"
    "\n"
    "Asks the store for one decision and prints its fields, one per line.\n"
    "With --store redis://... (keys under 'ratelimit:', expiring after their\n"
    "reset) the decisions add up across calls and machines; so they do with\n"
    "--store dynamodb://TABLE?region=REGION[&endpoint=URL] (the table created\n"
    "if missing, items expiring by the wall clock; credentials from\n"
    "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or ~/.aws/credentials;\n"
    "docs/dynamodb.md).  With --store shm:PATH (a shared-memory region,\n"
    "created if absent, 0600, and kept; docs/shm.md) they add up across the\n"
    "calls on one host; --max-keys N is the capacity of a region the call\n"
    "creates (default 65536 keys).  --store-timeout DUR: how long connecting\n"
    "to a Redis or DynamoDB store and the decision may take (default: the\n"
    "store's own, 1 s for Redis).\n"
    "Exit status: 0 allowed, 1 denied, 2 error.  Policy options as for\n"
    "'ratelimit replay' (--algorithm, --rate, --burst, --capacity, --limit,\n"
    "--window, --policy).  The default store is a fresh memory store, so\n"
    "without --store each call starts cold.\n"
    "\n"
    "With an in-flight policy (docs/leases.md), check takes a lease of the\n"
    "key, runs COMMAND, extends the lease every third of its TTL while it\n"
    "runs, and releases it when it ends (SIGINT, SIGTERM, SIGHUP are passed\n"
    "on to it; a check killed outright leaves a lease that expires after\n"
    "its TTL, or sooner on shm:PATH, where a dead holder's lease is taken\n"
    "back; the command is killed with it).  Exit status: the command's (128+N for a signal); 75 when the\n"
    "lease is denied (the decision printed, the command not run); 2 on an\n"
    "error before it runs.  --critical acquires as critical traffic (the\n"
    "policy's reserve=).  Without a COMMAND it takes and releases a lease:\n"
    "0 allowed, 1 denied.  It needs a store the jobs share: --store\n"
    "shm:PATH (one host) or redis:// (a fleet).\n";

enum { O_STORE = O_POLICY_END, O_KEY, O_PERMITS, O_MAXKEYS, O_STORETIMEOUT,
       O_HELP, O_CRITICAL };

static const struct option longopts[] = {
    POLICY_LONGOPTS,
    {"store", required_argument, NULL, O_STORE},
    {"key", required_argument, NULL, O_KEY},
    {"permits", required_argument, NULL, O_PERMITS},
    {"max-keys", required_argument, NULL, O_MAXKEYS},
    {"store-timeout", required_argument, NULL, O_STORETIMEOUT},
    {"help", no_argument, NULL, O_HELP},
    {"critical", no_argument, NULL, O_CRITICAL},
    {NULL, 0, NULL, 0},
};

static void field_seconds(const char *name, uint64_t ns)
{
    char buf[32], *p = buf;
    if (ns == RATE_NEVER) {
        printf("%s inf\n", name);
        return;
    }
    p = fmt_seconds(p, ns);
    *p = '\0';
    printf("%s %s\n", name, buf);
}

/* Whether the policy text has a `concurrency` clause: a clause whose
 * first word (after the first clause's name=NAME) is that word, as
 * rate_inflight_policy_parse finds it; a rate policy named
 * "concurrency-api" has none. */
static bool has_concurrency(const char *text)
{
    for (const char *c = text; c != NULL; c = strchr(c, ';')) {
        c += c == text ? 0 : 1;
        c += strspn(c, " \t");
        if (c == text + strspn(text, " \t") && strncmp(c, "name=", 5) == 0) {
            c += strcspn(c, " \t;");
            c += strspn(c, " \t");
        }
        if (strncmp(c, "concurrency", 11) == 0 &&
            (c[11] == '\0' || c[11] == ' ' || c[11] == '\t' || c[11] == ';'))
            return true;
    }
    return false;
}

int cmd_check(int argc, char **argv)
{
    policy_opts_t po = {.cmd = "check"};
    const char *store_spec = NULL, *key = NULL, *permits_text = "1";
    bool permits_given = false;
    const char *max_keys_text = NULL, *store_timeout_text = NULL;
    uint64_t max_keys = 0;
    bool critical = false;
    int c;

    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "+:", longopts, NULL)) != -1) {
        if (policy_opt(&po, c, optarg))
            continue;
        switch (c) {
        case O_STORE: store_spec = optarg; break;
        case O_KEY: key = optarg; break;
        case O_PERMITS:
            permits_text = optarg;
            permits_given = true;
            break;
        case O_MAXKEYS: max_keys_text = optarg; break;
        case O_STORETIMEOUT: store_timeout_text = optarg; break;
        case O_HELP: cli_usage(usage); return 0;
        case O_CRITICAL: critical = true; break;
        default: return getopt_fail("check", c, argv);
        }
    }
    bool inflight = po.policy != NULL && has_concurrency(po.policy);
    if (optind < argc && !inflight)
        return cli_fail("check: unexpected argument '%s' (a command runs "
                        "under an in-flight policy only: --policy "
                        "'concurrency N ttl=DUR')", argv[optind]);
    if (key == NULL || *key == '\0')
        return cli_fail("check: --key is required (a non-empty key)");
    if (critical && !inflight)
        return cli_fail("check: --critical needs an in-flight policy");
    if (inflight && (permits_given || po.max_wait != NULL))
        return cli_fail("check: %s does not apply to an in-flight policy (a "
                        "lease is one request, taken now or denied)",
                        permits_given ? "--permits" : "--max-wait");
    if (store_timeout_text != NULL &&
        cli_store_timeout("check", store_timeout_text, store_spec) != 0)
        return 2;
    if (inflight) {
        if (max_keys_text != NULL &&
            cli_max_keys("check", max_keys_text, store_spec, &max_keys) != 0)
            return 2;
        return cli_check_lease(po.policy, key, store_spec, max_keys,
                               critical, argv + optind);
    }
    if (strlen(key) > RATE_KEY_MAX)
        return cli_fail("check: --key longer than %d bytes", RATE_KEY_MAX);
    uint64_t permits;
    if (rate_parse_count(permits_text, &permits, NULL, 0) != RATE_OK)
        return cli_fail("check: --permits '%s' is not a whole number up to "
                        "2^63-1", permits_text);
    if (max_keys_text != NULL &&
        cli_max_keys("check", max_keys_text, store_spec, &max_keys) != 0)
        return 2;
    if (max_keys != 0 &&
        (store_spec == NULL || strncmp(store_spec, "shm:", 4) != 0))
        return cli_fail("check: --max-keys sizes a shm:PATH region only");
    cli_limiter_t cl;
    if (cli_limiter_open(&cl, &po, store_spec, false, max_keys,
                         CLI_TRACE_KEYS_UNKNOWN) != 0)
        return 2;
    if (store_spec == NULL)
        fprintf(stderr, "check: note: no --store, so a fresh memory store "
                "that forgets this call when the command ends: each run "
                "starts cold (--store shm:PATH or redis://... keeps the "
                "state between runs)\n");
    rate_decision_t d;
    int rc = rate_limiter_check(cl.lim, key, strlen(key), permits,
                                cl.max_wait_ns, &d);
    if (rc == RATE_OK && d.reason == RATE_REASON_STORE_ERROR)
        rc = d.error;
    int status;
    if (rc != RATE_OK) {
        status = cli_fail("check: %s",
                          cli_store_error(&cl, rc, key, strlen(key)));
    } else {
        printf("decision %s\n", d.allowed ? "allow" : "deny");
        printf("reason %s\n", rate_reason_name(d.reason));
        printf("limit %llu\n", (unsigned long long)d.limit);
        printf("remaining %llu\n", (unsigned long long)d.remaining);
        field_seconds("delay", d.delay_ns);
        field_seconds("retry_after", d.allowed ? 0 : d.retry_after_ns);
        field_seconds("reset_after", d.reset_after_ns);
        status = d.allowed ? 0 : 1;
    }
    cli_limiter_close(&cl);
    return status;
}
