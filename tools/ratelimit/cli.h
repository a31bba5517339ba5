/* SPDX-License-Identifier: MIT */
/*
 * The ratelimit command: one file per subcommand, sharing these helpers.
 * Includes only the public headers.
 */
#ifndef RATE_CLI_H
#define RATE_CLI_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include <ratelimit.h>

int cmd_replay(int argc, char **argv);
int cmd_compare(int argc, char **argv);
int cmd_check(int argc, char **argv);
int cmd_bench(int argc, char **argv);

/* Prints "ratelimit: <msg>" on standard error; returns exit status 2. */
int cli_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* bench --fair: fair shares beside a plain shared limit (bench_fair.c). */
int bench_fair(unsigned rounds, uint64_t iters);
/* bench --fair --redis URL: a fair decision beside a plain one on Redis,
 * by the script and the module (bench_fair_redis.c). */
int bench_fair_redis(const char *url, unsigned rounds);

/* The bench's remote parts, in a build with the store they measure. */
typedef struct bench_redis_opts {
    bool workload_only; /* --workload: issue 27's table alone */
    uint64_t decisions; /* --decisions: its size (0: the default) */
    const char *peer;   /* --node-peer: the Node peer's command, or NULL */
} bench_redis_opts_t;
#ifdef RATE_WITH_REDIS
int bench_redis(const char *url, const char *cluster_url,
                const bench_redis_opts_t *o); /* bench's Redis part */
/* bench --redis's table of issue 27's workload (bench_redis_load.c). */
int bench_redis_load(const char *url, const char *host, int port,
                     uint64_t decisions, const char *peer);
int bench_sync(const char *url); /* bench --sync URL: the synced mode */
/* A Redis server's CPU time so far (INFO cpu), in seconds; 0 if unknown. */
double bench_server_cpu_s(const char *host, int port);
/* A Redis server's reads of its clients so far (INFO stats); 0 if
 * unknown. */
double bench_server_reads(const char *host, int port);
/* A plain token-bucket script of the kind everyone writes (TIME, two
 * HGET, HSET, an expiry; ARGV rate/s, burst): the Redis benches' ceiling
 * for a script (bench_redis.c). */
extern const char bench_plain_tb_lua[];
/* This process's CPU time so far in seconds; *switches its context switches. */
double bench_self_cpu_s(long *switches);
#else
static inline int bench_redis(const char *url, const char *cluster_url,
                              const bench_redis_opts_t *o)
{
    (void)url, (void)cluster_url, (void)o;
    return cli_fail("bench: --redis: this build has no Redis store (it was "
                    "built with RATE_WITH_REDIS=OFF)");
}
static inline int bench_sync(const char *url)
{
    (void)url;
    return cli_fail("bench: --sync: this build has no Redis store (it was "
                    "built with RATE_WITH_REDIS=OFF)");
}
#endif
#ifdef RATE_WITH_DYNAMODB
int bench_dynamodb(const char *url); /* bench --store dynamodb://... */
#else
static inline int bench_dynamodb(const char *url)
{
    (void)url;
    return cli_fail("bench: --store dynamodb://: this build has no DynamoDB "
                    "store (it was built with RATE_WITH_DYNAMODB=OFF)");
}
#endif

/* The policy options shared by replay and check (spec/cli-replay.md). */
typedef struct policy_opts {
    const char *cmd; /* for messages */
    const char *algorithm, *rate, *burst, *capacity, *limit, *window;
    const char *max_wait;
    const char *policy; /* --policy TEXT, in place of --algorithm etc. */
} policy_opts_t;

/* getopt_long codes of the policy options, and their table entries (for
 * the option arrays of replay and check).  Other options start at
 * O_POLICY_END. */
enum {
    O_ALGO = 256, O_RATE, O_BURST, O_CAPACITY, O_LIMIT, O_WINDOW, O_MAXWAIT,
    O_POLICY,
    O_POLICY_END
};
#define POLICY_LONGOPTS                                                     \
    {"algorithm", required_argument, NULL, O_ALGO},                         \
    {"rate", required_argument, NULL, O_RATE},                              \
    {"burst", required_argument, NULL, O_BURST},                            \
    {"capacity", required_argument, NULL, O_CAPACITY},                      \
    {"limit", required_argument, NULL, O_LIMIT},                            \
    {"window", required_argument, NULL, O_WINDOW},                          \
    {"max-wait", required_argument, NULL, O_MAXWAIT},                     \
    {"policy", required_argument, NULL, O_POLICY}

/* Takes getopt's code `c` if it is a policy option; false otherwise. */
bool policy_opt(policy_opts_t *o, int c, const char *arg);

/* Builds the policy and max_wait from the options; on a bad option prints a
 * one-line message and returns 2. */
int policy_from_opts(const policy_opts_t *o, rate_policy_t **out,
                     uint64_t *max_wait_ns);

/* The policy text form (rate_policy_parse) of --policy TEXT; on an error
 * prints "CMD: --policy 'TEXT': why" and returns 2. */
int policy_from_text(const char *cmd, const char *text, rate_policy_t **out);

/* Whether a policy has a window component (no reservations: --max-wait). */
bool policy_has_window(const rate_policy_t *p);

/* The algorithms of the library's map (RATE_ALGORITHM_MAP), in its
 * order: how many, the i-th, and the option a bucket takes ("burst",
 * "capacity"; "" for a window). */
size_t cli_algorithm_count(void);
rate_algorithm_t cli_algorithm(size_t i);
const char *cli_algorithm_option(rate_algorithm_t a);

/* The map's names for a message, in buf: every algorithm with its alias
 * ("token-bucket (gcra), leaky-bucket, ..."), or with `buckets` those
 * that take an option ("token-bucket and leaky-bucket").  Returns buf. */
const char *cli_algorithm_names(char *buf, size_t len, bool buckets);

/* Prints a subcommand's usage text, then the algorithms NAME may be. */
void cli_usage(const char *text);

/* A limiter made from the policy options and --store, and what it owns. */
typedef struct cli_limiter {
    const char *cmd;
    bool scratch; /* a Redis or DynamoDB namespace of this run's own,
                     dropped at close */
    bool dynamodb; /* the store is a DynamoDB store */
    bool shm_scratch; /* a namespace of this run's own in an existing
                         shared-memory region, dropped at close */
    size_t shm_prefix_len; /* that namespace's length (0: none) */
    char *shm_unlink; /* a region file this run created: removed at close */
    uint64_t shm_keys, shm_bytes; /* that region's capacity and size */
    uint64_t shm_evictions0; /* the region's evictions when opened */
    char why[320];    /* cli_store_error's text */
    rate_policy_t *policy;
    rate_store_t *store;
    rate_limiter_t *lim;
    uint64_t max_wait_ns;
} cli_limiter_t;

/* Returns 0, or 2 after printing why (nothing is left to free then).
 * scratch: a Redis store works in a fresh namespace that
 * cli_limiter_close() removes (replays on a virtual clock): its keys do
 * not expire by their resets, but by a safety expiry of CLI_SAFETY_TTL_NS,
 * refreshed by a thread every third of that until the close, for a run
 * killed together with its watchdog.  trace_keys: a replay's count of
 * the trace's distinct keys, which sizes a shm:PATH region it creates
 * without --max-keys (CLI_TRACE_KEYS_UNKNOWN: not counted). */
int cli_limiter_open(cli_limiter_t *cl, const policy_opts_t *o,
                     const char *store_spec, bool scratch, uint64_t max_keys,
                     uint64_t trace_keys);
#define CLI_TRACE_KEYS_UNKNOWN UINT64_MAX
/* --store shm:PATH: the capacity (keys) of a region `check` creates
 * without --max-keys, and of one `replay` creates for a trace it cannot
 * read ahead (a pipe), as long as that region stays within
 * CLI_SHM_BUDGET bytes (else fewer keys, at least 1024); and the longest
 * key (namespace included) of a region the command creates.  A replay of
 * a file sizes its region from the trace's distinct keys, twice over, and
 * 256 more. */
#define CLI_SHM_KEYS 65536u
#define CLI_SHM_BUDGET ((size_t)256 << 20)
#define CLI_SHM_KEY_MAX 160u
/* The reason of a failed decision on key (key_len bytes), in words that
 * name the store's bound when the store is a shared-memory region (the
 * key's length and the region's key_max), with the service's message
 * when it is DynamoDB, and with the store's last error when it is Redis,
 * RATE_ECORRUPT naming the key and whether its Redis key is of another
 * type or its bytes are not a state (kept in cl->why). */
const char *cli_store_error(cli_limiter_t *cl, int rc, const char *key,
                            size_t key_len);
/* Parses --max-keys for `cmd` with the store `store_spec` (NULL: the
 * memory store): a whole number from 1 to 2147483647 for a shm:PATH
 * region, to 4294967295 for the memory store.  0 with *out, or 2 after
 * printing why. */
int cli_max_keys(const char *cmd, const char *text, const char *store_spec,
                 uint64_t *out);
/* --store-timeout DUR (replay, check): the Redis or DynamoDB store's
 * connect and command (request) timeout, 0 without it (the store's own
 * default: 1 s for Redis).  cli_store_timeout parses it for `cmd` with the
 * store `store_spec`: 0, or 2 after printing why (not a duration, 0, or a
 * store without a network timeout). */
extern uint64_t cli_store_timeout_ns;
int cli_store_timeout(const char *cmd, const char *text,
                      const char *store_spec);
#define CLI_SAFETY_TTL_NS (60 * RATE_NS_PER_S)
/* A DynamoDB scratch namespace's TTL attribute: a week, never refreshed
 * (DynamoDB's deletion is days late anyway; the reading ignores it). */
#define CLI_DYNAMODB_SAFETY_TTL_NS (7 * 86400 * RATE_NS_PER_S)
/* Sets the safety expiry of every key of a scratch namespace now (after
 * the first decision: the record of the policy is written without one). */
void cli_limiter_touch(cli_limiter_t *cl);
/* Removes a scratch namespace (a watchdog process removes it if the run
 * ends without doing so, even killed with SIGKILL), frees everything.
 * Returns RATE_OK, or the code of the failed removal (nothing printed: the
 * watchdog retries it for a minute). */
int cli_limiter_close(cli_limiter_t *cl);

/* SIGINT and SIGTERM set cli_signal (and interrupt a blocked read) instead
 * of killing the process, so that a replay can remove its keys. */
#include <signal.h>
extern volatile sig_atomic_t cli_signal;
void cli_catch_signals(void);

/* A store for --store: "memory" (or NULL), redis://..., unix://... or
 * dynamodb://TABLE?region=R[&endpoint=URL] (the table created if missing)
 * (scratch as for cli_limiter_open).  max_keys (0: unbounded) bounds the
 * memory store (one shard: least recently used keys evicted first); it is
 * an error with another store.  On failure prints why, returns 2. */
int store_from_opt(const char *cmd, const char *spec, bool scratch,
                   uint64_t max_keys, rate_store_t **out);

/* The longest input line, in bytes without its newline: a longer one is an
 * error naming it (or skipped with --skip-bad), read in constant memory. */
#define READER_MAX_LINE 65536

/* Reads requests from a trace or an access log, a line at a time, through
 * a buffer of fixed size (about twice READER_MAX_LINE). */
typedef struct reader {
    const char *cmd;
    const char *name; /* FILE, or "standard input", for messages */
    int fd;
    bool clf;
    bool json;             /* --input json: one JSON object a line */
    int field; /* clf_field_t */
    int time_field;        /* clf: --time-field N - 1, or -1 */
    const char *json_key, *json_time; /* json: the members' names */
    char *buf;
    size_t start, end; /* unread bytes buf[start..end) */
    bool eof;
    uint64_t lineno;
    bool skip_bad;         /* --skip-bad: skip and count bad lines */
    uint64_t nbad;         /* lines skipped */
    uint64_t first_bad[5]; /* the first few of their numbers */
    /* What the times were like, for reader_warn_time(): */
    uint64_t nreq;         /* requests read */
    uint64_t res_ns;       /* the largest power of ten (ns, at most 1 s)
                              dividing every time: their resolution */
    uint64_t t_max;        /* the latest time so far */
    uint64_t same_instant; /* requests at the time of the one before */
    uint64_t nearlier;     /* requests earlier than one before them */
    uint64_t first_earlier, most_back_ns; /* the first one's line, and
                                             the most any lay back */
} reader_t;

/* Checks --input, --key-field and --time-field (NULL: each format's
 * default) and opens FILE ("-" or NULL: standard input).  Returns 0, or 2
 * after printing why. */
int reader_open(reader_t *r, const char *cmd, const char *input,
                const char *key_field, const char *time_field,
                const char *path);

struct trace_req;
/* The next request: 1, or 0 at the end, or 2 after printing what is wrong
 * with which line, or 3 (nothing printed) when cli_signal was set. */
int reader_next(reader_t *r, struct trace_req *req);
void reader_close(reader_t *r);
/* With --skip-bad, after the input: one line on standard error saying how
 * many bad lines were skipped and the first few line numbers (nothing when
 * there were none). */
void reader_report(const reader_t *r);
/* After the input: one warning line on standard error, if any, when the
 * input's times are coarser than one of `policy`'s limits can resolve
 * (a bucket's emission interval, a window's length) while some requests
 * shared an instant, and one when lines went back in time. */
void reader_warn_time(const reader_t *r, const rate_policy_t *const *policies,
                      size_t npolicies);
/* The coarse-time warning of reader_warn_time as one short sentence for a
 * chart, into buf: false (buf untouched) when there is none. */
bool reader_coarse_note(const reader_t *r, const rate_policy_t *const *policies,
                        size_t npolicies, char *buf, size_t len);

/* Writes seconds with exactly 9 fractional digits ("0.000000000"). */
char *fmt_seconds(char *p, uint64_t ns);
char *fmt_u64(char *p, uint64_t v);

/* Whether getopt saw an unknown flag or a missing value: prints the message
 * and returns 2.  `c` is getopt's return; argv/optind as getopt left them. */
int getopt_fail(const char *cmd, int c, char **argv);

/* check under an in-flight policy (lease.c): a lease of key held while
 * cmd (NULL-terminated; empty: none) runs.  Returns the exit status. */
int cli_check_lease(const char *policy_text, const char *key,
                    const char *store_spec, uint64_t max_keys, bool critical,
                    char **cmd);

/* bench --leases (bench_lease.c): leases beside decisions; redis_url may
 * be NULL.  Returns the exit status. */
int bench_leases(const char *redis_url);

/* bench --rules (bench_rules.c): a rules check by the rules file's size. */
#ifdef RATE_WITH_HTTP
int bench_rules(void);
#else
static inline int bench_rules(void)
{
    return cli_fail("bench: --rules: this build has no rules (it was built "
                    "with RATE_WITH_HTTP=OFF)");
}
#endif

#endif
