/* SPDX-License-Identifier: MIT */
/*
 * ratelimit replay: a recorded trace through one policy on a virtual clock,
 * one decision per request (spec/cli-replay.md).  Streams: a line is parsed,
 * decided and written before the next is read, through a buffer of fixed
 * size (lines up to READER_MAX_LINE bytes).  What grows is the store: the
 * memory store keeps every distinct key unless --max-keys bounds it, and
 * --per-key keeps a counter per key.
 */
#include <errno.h>
#include <getopt.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <ratelimit_shm.h>

#include "cli.h"
#include "fair_opts.h"
#include "keymap.h"
#include "trace.h"

static const char usage[] =
    "usage: ratelimit replay --algorithm NAME [policy options] [OPTIONS] [FILE]\n"
    "       ratelimit replay --policy TEXT [OPTIONS] [FILE]\n"
    "\n"
    "Replays a trace (FILE, or standard input when absent or '-') through one\n"
    "policy on the trace's own clock and prints one line per request:\n"
    "  TIME KEY PERMITS allow|deny DELAY REMAINING RETRY_AFTER RESET_AFTER\n"
    "A summary goes to standard error.\n"
    "\n"
    "  --algorithm NAME   the algorithm (the names are listed at the end)\n"
    "  --rate N/DUR       buckets: N per DUR (10/s, 100/1m, 3/500ms, 10/sec)\n"
    "  --burst N          token bucket: burst (required; --policy TEXT's\n"
    "                     burst= defaults to the rate's N)\n"
    "  --capacity N       leaky bucket: capacity (required; --policy TEXT's\n"
    "                     capacity= defaults to the rate's N)\n"
    "  --limit N          windows: limit per window\n"
    "  --window DUR       windows: window length (1s, 250ms, 1m, 2hours)\n"
    "  --policy TEXT      the library's policy text, composites too, in place\n"
    "                     of --algorithm and its options\n"
    "                     (\"token-bucket 10/s burst=20; sliding-log 1000/1h\")\n"
    "  --max-wait DUR     buckets: reserve up to DUR ahead (default 0)\n"
    "  --store STORE      memory (default), or redis://[[user]:password@]host\n"
    "                     [:port][/db] or unix:///path: the trace's time goes\n"
    "                     to the store, in a namespace of the run's own that\n"
    "                     is removed at the end (also on SIGINT, SIGTERM, a\n"
    "                     failure, or SIGKILL; its keys expire 60 s after\n"
    "                     the run otherwise); the output is the same.\n"
    "                     Or dynamodb://TABLE?region=REGION[&endpoint=URL]:\n"
    "                     the table is created if missing (docs/dynamodb.md),\n"
    "                     the run's items (without expiry) are removed at\n"
    "                     the end in the same cases; credentials from\n"
    "                     AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or\n"
    "                     ~/.aws/credentials.\n"
    "                     Or shm:PATH, a shared-memory region (docs/shm.md):\n"
    "                     created if absent, sized for twice the trace's\n"
    "                     distinct keys and 256 more (read ahead; a pipe:\n"
    "                     65536 keys, fewer within 256 MB), and removed at\n"
    "                     the end, also on SIGINT or SIGTERM while it is\n"
    "                     made; if it exists, the run works in a namespace\n"
    "                     of its own, removed at the end; other runs may use\n"
    "                     PATH at once; the output is the same, but for\n"
    "                     evictions by the region's bound (counted on\n"
    "                     standard error)\n"
    "  --per-key[=FILE]   a table per key, tab-separated, most denied first\n"
    "                     (key, requests, admitted, denied, denied_share,\n"
    "                     first_denial_s: seconds from the first request,\n"
    "                     first_denial: its time as written), on standard\n"
    "                     error after the summary or into FILE (memory\n"
    "                     grows with the keys)\n"
    "  --top N            after the summary, the N keys denied most, with\n"
    "                     their share denied and first denial\n"
    "  --max-keys N       memory store: keep at most N keys, evicting the least\n"
    "                     recently used (counted on standard error); an\n"
    "                     evicted key starts cold again: answers may change.\n"
    "                     shm:PATH: the capacity of a region the run creates\n"
    "                     (default: from the trace, above); an existing one\n"
    "                     must match\n"
    "  --store-timeout DUR  a Redis or DynamoDB store: how long connecting\n"
    "                     and each command may take (default: the store's\n"
    "                     own, 1 s for Redis)\n"
    "  --input FORMAT     trace (TIME KEY [PERMITS], default), clf (access\n"
    "                     logs in Common or Combined Log Format, and more\n"
    "                     fields after them) or json (one JSON object a\n"
    "                     line, as nginx's log_format escape=json writes)\n"
    "  --key-field FIELD  clf: host (default), ident, user, request, method,\n"
    "                     path, status, referer, agent, xff (the first\n"
    "                     address of the last quoted field after the agent;\n"
    "                     the host without one), or a field number N (1: host)\n"
    "                     json: a member's name (default remote_addr)\n"
    "  --time-field FIELD clf: the number of a field with a finer time than\n"
    "                     the [timestamp] (nginx's $msec: 1764644400.123);\n"
    "                     json: a member's name (default time).  A time is\n"
    "                     seconds since 1970, YYYY-MM-DDTHH:MM:SS[.fff][Z|\n"
    "                     +hh:mm] or dd/Mon/yyyy:HH:MM:SS +zzzz\n"
    "  --skip-bad         skip bad lines (counted, the first few named on\n"
    "                     standard error) instead of stopping at the first\n"
    "  --fair KEY         one shared limit, the policy on KEY, divided fairly\n"
    "                     among the trace's keys (weighted max-min shares,\n"
    "                     docs/fair.md); each line still names its own key.\n"
    "                     Decides without waiting (no --max-wait)\n"
    "  --weight FLOW=W    with --fair: the key FLOW's weight (1..1048576;\n"
    "                     default 1); repeatable\n"
    "\n"
    "DUR: a whole number and a unit, ns us ms s m h d (or sec, min, hour, day\n"
    "and their plurals).  Lines are at most 65536 bytes.  Errors (bad options,\n"
    "an unreadable FILE, a bad line) print one line on standard error and exit\n"
    "with status 2; stopped by SIGINT or SIGTERM: 130 or 143.  A warning on\n"
    "standard error says when the times are coarser than the policy resolves\n"
    "(whole seconds for 10/s: a second's requests replayed at one instant)\n"
    "and when lines go back in time (decided at their key's latest time).\n";

enum { O_STORE = O_POLICY_END, O_PERKEY, O_INPUT, O_KEYFIELD, O_SKIPBAD, O_MAXKEYS,
       O_STORETIMEOUT, O_HELP, O_TIMEFIELD, O_TOP, O_FAIR, O_WEIGHT };

static const struct option longopts[] = {
    POLICY_LONGOPTS,
    {"store", required_argument, NULL, O_STORE},
    {"per-key", optional_argument, NULL, O_PERKEY},
    {"top", required_argument, NULL, O_TOP},
    {"time-field", required_argument, NULL, O_TIMEFIELD},
    {"input", required_argument, NULL, O_INPUT},
    {"key-field", required_argument, NULL, O_KEYFIELD},
    {"skip-bad", no_argument, NULL, O_SKIPBAD},
    {"max-keys", required_argument, NULL, O_MAXKEYS},
    {"fair", required_argument, NULL, O_FAIR},
    {"weight", required_argument, NULL, O_WEIGHT},
    {"store-timeout", required_argument, NULL, O_STORETIMEOUT},
    {"help", no_argument, NULL, O_HELP},
    {NULL, 0, NULL, 0},
};

/* TIME KEY PERMITS DECISION DELAY REMAINING RETRY_AFTER RESET_AFTER */
static void write_line(const trace_req_t *r, const rate_decision_t *d)
{
    char buf[160], *p = buf;
    fwrite(r->time_text, 1, r->time_len, stdout);
    putchar('\t');
    fwrite(r->key, 1, r->key_len, stdout);
    *p++ = '\t';
    p = fmt_u64(p, r->permits);
    memcpy(p, d->allowed ? "\tallow\t" : "\tdeny\t", d->allowed ? 7 : 6);
    p += d->allowed ? 7 : 6;
    p = fmt_seconds(p, d->delay_ns);
    *p++ = '\t';
    p = fmt_u64(p, d->remaining);
    *p++ = '\t';
    if (d->retry_after_ns == RATE_NEVER) {
        memcpy(p, "inf", 3);
        p += 3;
    } else {
        p = fmt_seconds(p, d->allowed ? 0 : d->retry_after_ns);
    }
    *p++ = '\t';
    p = fmt_seconds(p, d->reset_after_ns);
    *p++ = '\n';
    fwrite(buf, 1, (size_t)(p - buf), stdout);
}

/* 128 + the signal that stopped the run after `line`, said on standard
 * error with what became of the run's store (`fate`). */
static int stopped(uint64_t line, const char *fate)
{
    int sig = cli_signal;
    cli_fail("replay: stopped by %s after line %llu%s",
             sig == SIGINT ? "SIGINT" : "SIGTERM", (unsigned long long)line,
             fate);
    return 128 + sig;
}

/* With a trace in a regular file (FILE, or standard input redirected from
 * one): its distinct keys in *out, read ahead, then the file rewound and
 * rd as opened.  Bad lines are passed over here; the replay reports them.
 * A pipe or a terminal is not read ahead (*out left as it is).  0; 1 when
 * stopped by a signal; 2 after printing why. */
static int count_keys(reader_t *rd, uint64_t *out)
{
    struct stat st;
    off_t start = lseek(rd->fd, 0, SEEK_CUR);
    if (fstat(rd->fd, &st) != 0 || !S_ISREG(st.st_mode) || start < 0)
        return 0;
    bool skip = rd->skip_bad;
    keymap_t keys = {0};
    trace_req_t r;
    int more;
    rd->skip_bad = true;
    while ((more = reader_next(rd, &r)) == 1) {
        if (keymap_get(&keys, r.key, r.key_len) == NULL) {
            more = 2;
            break;
        }
    }
    *out = keys.n;
    keymap_free(&keys);
    /* As reader_open left it: the same file, from the same offset. */
    if (lseek(rd->fd, start, SEEK_SET) != start) {
        more = 2;
    }
    rd->start = rd->end = 0;
    rd->eof = false;
    rd->lineno = 0;
    rd->nbad = 0;
    rd->skip_bad = skip;
    memset(rd->first_bad, 0, sizeof rd->first_bad);
    if (more == 3)
        return 1;
    /* A read error, or no memory to count: the region gets the size of
     * an uncounted trace. */
    if (more == 2)
        *out = CLI_TRACE_KEYS_UNKNOWN;
    return 0;
}

/* Most denied first; then most requests; then first seen (stable). */
static int by_denials(const void *a, const void *b)
{
    const keyrec_t *x = a, *y = b;
    if (x->denied != y->denied)
        return x->denied < y->denied ? 1 : -1;
    uint64_t nx = x->allowed + x->denied, ny = y->allowed + y->denied;
    if (nx != ny)
        return nx < ny ? 1 : -1;
    return x->order < y->order ? -1 : x->order > y->order;
}

/* The share of a key's requests denied, "0.250". */
static double share(const keyrec_t *k)
{
    uint64_t n = k->allowed + k->denied;
    return n ? (double)k->denied / (double)n : 0;
}

/* The per-key table (--per-key), tab-separated with a header line. */
/* The first denial's time as written, except a bare number from a log
 * (nginx's $msec, a JSON time in seconds since 1970): that is shown as
 * the UTC date and time it stands for, to the millisecond. */
static void when_text(const keyrec_t *k, bool log_input, char *buf,
                      size_t cap, const char **text, int *len)
{
    *text = k->first_deny_text;
    *len = (int)k->first_deny_len;
    if (!log_input || k->first_deny_len == 0)
        return;
    for (size_t i = 0; i < k->first_deny_len; i++)
        if ((k->first_deny_text[i] < '0' || k->first_deny_text[i] > '9') &&
            k->first_deny_text[i] != '.')
            return;
    time_t secs = (time_t)(k->first_deny_ns / RATE_NS_PER_S);
    struct tm tm;
    if (gmtime_r(&secs, &tm) == NULL)
        return;
    size_t n = strftime(buf, cap, "%Y-%m-%dT%H:%M:%S", &tm);
    if (n == 0)
        return;
    int m = snprintf(buf + n, cap - n, ".%03uZ",
                     (unsigned)(k->first_deny_ns % RATE_NS_PER_S / 1000000));
    if (m < 0 || (size_t)m >= cap - n)
        return;
    *text = buf;
    *len = (int)(n + (size_t)m);
}

static int write_per_key(FILE *f, const keymap_t *keys, uint64_t t0,
                         bool log_input)
{
    fputs("key\trequests\tadmitted\tdenied\tdenied_share\t"
          "first_denial_s\tfirst_denial\n", f);
    for (size_t i = 0; i < keys->n; i++) {
        const keyrec_t *k = &keys->recs[i];
        char buf[32];
        fwrite(k->key, 1, k->len, f);
        fprintf(f, "\t%llu\t%llu\t%llu\t%.3f\t",
                (unsigned long long)(k->allowed + k->denied),
                (unsigned long long)k->allowed, (unsigned long long)k->denied,
                share(k));
        if (k->denied == 0) {
            fputs("-\t-\n", f);
            continue;
        }
        char when[40];
        const char *wt;
        int wl;
        *fmt_seconds(buf, k->first_deny_ns > t0 ? k->first_deny_ns - t0 : 0) = '\0';
        fprintf(f, "%s\t", buf);
        when_text(k, log_input, when, sizeof when, &wt, &wl);
        fwrite(wt, 1, (size_t)wl, f);
        fputc('\n', f);
    }
    return fflush(f) == 0 && !ferror(f) ? 0 : -1;
}

/* The --top N summary on standard error. */
static void write_top(const keymap_t *keys, uint64_t top, uint64_t t0,
                      bool log_input)
{
    size_t n = keys->n < top ? keys->n : (size_t)top, w = 3;
    size_t denied_keys = 0;
    for (size_t i = 0; i < keys->n; i++)
        denied_keys += keys->recs[i].denied > 0;
    fprintf(stderr, "%zu of %zu keys had a request denied", denied_keys,
            keys->n);
    if (n == 0 || denied_keys == 0) {
        fputc('\n', stderr);
        return;
    }
    if (n > denied_keys)
        n = denied_keys;
    fprintf(stderr, "; the %zu denied most:\n", n);
    for (size_t i = 0; i < n; i++)
        if (keys->recs[i].len > w)
            w = keys->recs[i].len > 40 ? 40 : keys->recs[i].len;
    fprintf(stderr, "  %-*s %9s %9s %7s  %s\n", (int)w, "key", "requests",
            "denied", "share", "first denial (s from the start: as written)");
    for (size_t i = 0; i < n; i++) {
        const keyrec_t *k = &keys->recs[i];
        char buf[32], when[40];
        const char *wt;
        int wl;
        *fmt_seconds(buf, k->first_deny_ns > t0 ? k->first_deny_ns - t0 : 0) = '\0';
        when_text(k, log_input, when, sizeof when, &wt, &wl);
        fprintf(stderr, "  %-*.*s %9llu %9llu %6.1f%%  %.*s: %.*s\n", (int)w,
                (int)k->len, k->key,
                (unsigned long long)(k->allowed + k->denied),
                (unsigned long long)k->denied, 100 * share(k),
                (int)(strchr(buf, '.') - buf + 4), buf, wl, wt);
    }
}

int cmd_replay(int argc, char **argv)
{
    policy_opts_t po = {.cmd = "replay"};
    const char *store_spec = NULL, *input = "trace", *field = NULL;
    const char *time_field = NULL, *per_key_path = NULL;
    uint64_t top = 0;
    char perr[160]; /* a parser's message */
    bool per_key = false;
    bool skip_bad = false;
    const char *max_keys_text = NULL, *store_timeout_text = NULL;
    uint64_t max_keys = 0;
    static fair_opts_t fo;
    memset(&fo, 0, sizeof fo);
    int c;

    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":", longopts, NULL)) != -1) {
        if (policy_opt(&po, c, optarg))
            continue;
        switch (c) {
        case O_STORE: store_spec = optarg; break;
        case O_PERKEY:
            per_key = true;
            per_key_path = optarg;
            break;
        case O_TOP:
            if (rate_parse_count(optarg, &top, perr, sizeof perr) != RATE_OK)
                return cli_fail("replay: --top %s", perr);
            break;
        case O_TIMEFIELD: time_field = optarg; break;
        case O_INPUT: input = optarg; break;
        case O_KEYFIELD: field = optarg; break;
        case O_SKIPBAD: skip_bad = true; break;
        case O_MAXKEYS: max_keys_text = optarg; break;
        case O_FAIR: fo.key = optarg; break;
        case O_WEIGHT:
            if (fair_opt_weight(&fo, "replay", optarg) != 0)
                return 2;
            break;
        case O_STORETIMEOUT: store_timeout_text = optarg; break;
        case O_HELP: cli_usage(usage); return 0;
        default: return getopt_fail("replay", c, argv);
        }
    }
    if (argc - optind > 1)
        return cli_fail("replay: more than one FILE ('%s', '%s')",
                        argv[optind], argv[optind + 1]);
    if (max_keys_text != NULL &&
        cli_max_keys("replay", max_keys_text, store_spec, &max_keys) != 0)
        return 2;
    if (fair_opts_check(&fo, "replay") != 0)
        return 2;
    if (fo.key != NULL && po.max_wait != NULL)
        return cli_fail("replay: --fair decides without waiting: it takes "
                        "no --max-wait");
    if (store_timeout_text != NULL &&
        cli_store_timeout("replay", store_timeout_text, store_spec) != 0)
        return 2;
    FILE *per_key_file = NULL;
    if (per_key_path != NULL && (per_key_path[0] == '\0' ||
        (per_key_file = fopen(per_key_path, "w")) == NULL))
        return cli_fail("replay: cannot write --per-key '%s': %s",
                        per_key_path, per_key_path[0] ? strerror(errno)
                                                       : "no file name");
    bool shm = store_spec != NULL && strncmp(store_spec, "shm:", 4) == 0;
    /* On a region: SIGINT and SIGTERM caught from here on, so that one
     * that comes while the region is made (or the trace read ahead) stops
     * the run with nothing left behind, not even a temporary file. */
    if (shm)
        cli_catch_signals();
    reader_t rd;
    if (reader_open(&rd, "replay", input, field, time_field,
                    argc > optind ? argv[optind] : NULL) != 0) {
        reader_close(&rd);
        if (per_key_file != NULL)
            fclose(per_key_file);
        return 2;
    }
    rd.skip_bad = skip_bad;
    uint64_t trace_keys = CLI_TRACE_KEYS_UNKNOWN;
    if (shm && max_keys == 0 && count_keys(&rd, &trace_keys) != 0) {
        reader_close(&rd);
        if (per_key_file != NULL)
            fclose(per_key_file);
        return stopped(0, "");
    }
    cli_limiter_t cl;
    if (cli_limiter_open(&cl, &po, store_spec, true, max_keys,
                         trace_keys) != 0) {
        reader_close(&rd);
        if (per_key_file != NULL)
            fclose(per_key_file);
        return cli_signal != 0 ? 128 + cli_signal : 2;
    }
    /* With a Redis namespace of the run's own: SIGINT and SIGTERM stop the
     * run between two requests, so that it removes its keys. */
    if (cl.scratch || cl.shm_scratch || cl.shm_unlink != NULL)
        cli_catch_signals();
    int status = 0;
    char failure[640] = ""; /* printed after the namespace is removed */
    rate_fair_t *fair = NULL;
    if (fo.key != NULL && fair_open(&fo, "replay", cl.lim, &fair) != 0)
        status = 2;

    static char outbuf[1 << 16];
    setvbuf(stdout, outbuf, _IOFBF, sizeof outbuf);
    keymap_t keys = {0};
    uint64_t allowed = 0, denied = 0, t0 = 0;
    trace_req_t r;
    int more;
    while (status == 0 && (more = reader_next(&rd, &r)) != 0) {
        if (more == 2) {
            status = 2;
            break;
        }
        if (more == 3)
            break;
        rate_decision_t d;
        int rc = fair != NULL
                     ? rate_fair_check_at(fair, r.key, r.key_len,
                                          fair_weight_of(&fo, r.key,
                                                         r.key_len),
                                          r.permits, r.t_ns, &d)
                     : rate_limiter_check_at(cl.lim, r.key, r.key_len,
                                             r.permits, cl.max_wait_ns,
                                             r.t_ns, &d);
        if (rc == RATE_OK && d.reason == RATE_REASON_STORE_ERROR)
            rc = d.error;
        if (cli_signal != 0)
            break;
        if (rc != RATE_OK) {
            snprintf(failure, sizeof failure, "replay: line %llu: %s",
                     (unsigned long long)rd.lineno,
                     cli_store_error(&cl, rc, r.key, r.key_len));
            status = 2;
            break;
        }
        write_line(&r, &d);
        if (allowed + denied == 0)
            cli_limiter_touch(&cl); /* the policy's record has no expiry */
        if (allowed + denied == 0)
            t0 = r.t_ns;
        d.allowed ? allowed++ : denied++;
        if (per_key || top > 0) {
            keyrec_t *k = keymap_get(&keys, r.key, r.key_len);
            if (k == NULL) {
                status = cli_fail("replay: out of memory");
                break;
            }
            if (!d.allowed && k->denied == 0) {
                k->first_deny_ns = r.t_ns;
                k->first_deny_text = malloc(r.time_len ? r.time_len : 1);
                if (k->first_deny_text == NULL) {
                    status = cli_fail("replay: out of memory");
                    break;
                }
                memcpy(k->first_deny_text, r.time_text, r.time_len);
                k->first_deny_len = r.time_len;
            }
            d.allowed ? k->allowed++ : k->denied++;
        }
    }
    int sig = cli_signal;
    if (sig != 0 && status == 0) {
        snprintf(failure, sizeof failure, "replay: stopped by %s after line "
                 "%llu", sig == SIGINT ? "SIGINT" : "SIGTERM",
                 (unsigned long long)rd.lineno);
        status = 128 + sig;
    }
    if (fflush(stdout) != 0 && status == 0)
        status = cli_fail("replay: cannot write the output: %s",
                          strerror(errno));
    if (status == 0) {
        reader_report(&rd);
        rate_stats_t st;
        if (max_keys != 0 && !shm &&
            rate_store_stats(cl.store, &st) == RATE_OK &&
            st.evictions > 0)
            fprintf(stderr, "replay: --max-keys %llu evicted %llu keys (an "
                    "evicted key that comes back starts cold: answers may "
                    "differ from an unbounded replay)\n",
                    (unsigned long long)max_keys,
                    (unsigned long long)st.evictions);
        rate_shm_info_t si;
        if (shm && rate_store_shm_info(cl.store, &si) == RATE_OK &&
            si.evictions > cl.shm_evictions0)
            fprintf(stderr, "replay: the region %s evicted %llu keys during "
                    "the run (its capacity is %llu keys, shared with any "
                    "other process using it; an evicted key that comes "
                    "back starts cold: answers may differ from --store "
                    "memory)\n", store_spec + 4,
                    (unsigned long long)(si.evictions - cl.shm_evictions0),
                    (unsigned long long)si.max_keys);
        if (cl.shm_unlink != NULL)
            fprintf(stderr, "replay: made the region %s for %llu keys (%llu "
                    "bytes), removed at the end\n", cl.shm_unlink,
                    (unsigned long long)cl.shm_keys,
                    (unsigned long long)cl.shm_bytes);
        const rate_policy_t *pol = cl.policy;
        reader_warn_time(&rd, &pol, 1);
        fprintf(stderr, "summary: %llu requests, %llu allowed, %llu denied\n",
                (unsigned long long)(allowed + denied),
                (unsigned long long)allowed, (unsigned long long)denied);
        if (keys.n > 1)
            qsort(keys.recs, keys.n, sizeof *keys.recs, by_denials);
        bool log_input = strcmp(input, "trace") != 0;
        if (top > 0)
            write_top(&keys, top, t0, log_input);
        if (per_key && write_per_key(per_key_file ? per_key_file : stderr,
                                     &keys, t0, log_input) != 0)
            status = cli_fail("replay: cannot write --per-key '%s': %s",
                              per_key_path ? per_key_path : "(stderr)",
                              strerror(errno));
    }
    if (per_key_file != NULL && fclose(per_key_file) != 0 && status == 0)
        status = cli_fail("replay: cannot write --per-key '%s': %s",
                          per_key_path, strerror(errno));
    keymap_free(&keys);
    reader_close(&rd);
    rate_fair_free(fair);
    /* One line of error in all: a failure says whether the run's Redis
     * keys are gone; a failed removal alone says so. */
    bool scratch = cl.scratch;
    shm = cl.shm_scratch || cl.shm_unlink != NULL;
    const char *shm_what = cl.shm_unlink != NULL ? "region file" : "namespace";
    const char *sn = cl.dynamodb ? "DynamoDB" : "Redis";
    int drop = cli_limiter_close(&cl);
    if (shm) { /* nothing left behind: the namespace or the file is gone */
        if (failure[0] != '\0' && drop == RATE_OK)
            cli_fail("%s; the run's %s was removed", failure, shm_what);
        else if (failure[0] != '\0')
            cli_fail("%s; the run's %s could not be removed (%s)", failure,
                     shm_what, rate_strerror(drop));
        else if (drop != RATE_OK && status == 0)
            status = cli_fail("replay: could not remove the run's %s (%s)",
                              shm_what, rate_strerror(drop));
        return status;
    }
    char keys_fate[200];
    if (drop == RATE_OK)
        snprintf(keys_fate, sizeof keys_fate, "; the run's %s keys were "
                 "removed", sn);
    else
        snprintf(keys_fate, sizeof keys_fate, "; the run's %s keys will be "
                 "removed by a background process once %s answers (it "
                 "tries for a minute)", sn, sn);
    if (failure[0] != '\0')
        cli_fail("%s%s", failure, scratch ? keys_fate : "");
    else if (drop != RATE_OK && status == 0)
        status = cli_fail("replay: could not remove the run's %s keys "
                          "now (%s); a background process removes them once "
                          "%s answers (it tries for a minute)", sn,
                          rate_strerror(drop), sn);
    return status;
}
