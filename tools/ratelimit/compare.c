/* SPDX-License-Identifier: MIT */
/*
 * ratelimit compare: one trace through all five algorithms at the same
 * long-run rate, side by side.  Streams the trace once, feeding each request
 * to five limiters; per key it keeps only the admitted times of the last
 * period, so memory grows with keys and the limit, not with the trace.
 *
 * Columns: admitted, denied; "max/period", the most admitted for one key in
 * any span of one period (burstiness); "edge spike", the same for spans that
 * cross a fixed-window edge (a multiple of the period); the mean delay of
 * admitted requests (non-zero only for bucket reservations, --max-wait).
 */
#include <errno.h>
#include <getopt.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "fair_opts.h"
#include "keymap.h"
#include "trace.h"

#define ALGOS cli_algorithm_count() /* one lane each */
#define MAX_BINS 16384

static const char usage[] =
    "usage: ratelimit compare [--rate N/DUR | --limit N --window DUR]\n"
    "                         [--burst N] [--capacity N] [--policy TEXT]...\n"
    "                         [--max-wait DUR] [--svg FILE] [--series FILE]\n"
    "                         [--input trace|clf|json] [--key-field FIELD]\n"
    "                         [--time-field FIELD]\n"
    "                         [--skip-bad] [FILE]\n"
    "\n"
    "Sends one trace through every algorithm at the same long-run rate:\n"
    "the buckets get --rate with --burst (default: the rate's N) as burst and\n"
    "capacity (--capacity: the leaky bucket's own), the windows N per DUR\n"
    "(--limit N --window DUR is the same as --rate N/DUR).  Each --policy TEXT\n"
    "(the library's policy text, composites too; repeatable) adds a row and a\n"
    "line, beside the algorithms' or, without --rate, alone.  Prints a\n"
    "table; --svg also writes a chart: for the 3 keys denied most (over all\n"
    "policies), a panel per policy with the key's requests in the last\n"
    "period (sent, grey) and those the policy admitted (a line), and the\n"
    "policy's rate (dashed); time in seconds from the start, or UTC clock\n"
    "time for dated logs.  --series writes the totals over all keys as CSV\n"
    "(the requests admitted in the last period, sampled every 1/128 of\n"
    "it).  Input as for 'ratelimit replay' (--input, --key-field,\n"
    "--time-field, --skip-bad).  --fair KEY: each policy is one shared\n"
    "limit on KEY divided fairly among the trace's keys (docs/fair.md),\n"
    "with --weight FLOW=W (repeatable; default 1) as for 'ratelimit\n"
    "replay'; without waiting (no --max-wait).\n";

enum { O_SVG = O_POLICY_END, O_SERIES, O_INPUT, O_KEYFIELD, O_SKIPBAD, O_HELP,
       O_TIMEFIELD, O_FAIR, O_WEIGHT };

static const struct option longopts[] = {
    {"rate", required_argument, NULL, O_RATE},
    {"limit", required_argument, NULL, O_LIMIT},
    {"window", required_argument, NULL, O_WINDOW},
    {"burst", required_argument, NULL, O_BURST},
    {"capacity", required_argument, NULL, O_CAPACITY},
    {"policy", required_argument, NULL, O_POLICY},
    {"max-wait", required_argument, NULL, O_MAXWAIT},
    {"svg", required_argument, NULL, O_SVG},
    {"series", required_argument, NULL, O_SERIES},
    {"input", required_argument, NULL, O_INPUT},
    {"key-field", required_argument, NULL, O_KEYFIELD},
    {"time-field", required_argument, NULL, O_TIMEFIELD},
    {"skip-bad", no_argument, NULL, O_SKIPBAD},
    {"fair", required_argument, NULL, O_FAIR},
    {"weight", required_argument, NULL, O_WEIGHT},
    {"help", no_argument, NULL, O_HELP},
    {NULL, 0, NULL, 0},
};

typedef struct lane {
    rate_limit_t limit;
    rate_policy_t *policy;
    rate_limiter_t *lim;
    rate_fair_t *fair; /* --fair: the limit divided fairly among the keys */
    bool reserves; /* gets --max-wait (buckets only) */
    char text[160];
    keymap_t keys;
    uint64_t admitted, denied, delay_sum_ns, max_window, spike;
    uint64_t *bins; /* MAX_BINS: permits admitted per bin */
} lane_t;

/* The chart: admissions counted in bins of width period/sub, aligned to
 * the period (so to the fixed window's edges).  What is plotted at the end
 * of bin i is the sum of the `sub` bins ending there: the permits admitted
 * in the span of one period ending at that instant, a sliding window
 * sampled every period/sub (sub 128, or the largest power of two dividing
 * the period: halving then keeps whole bins per period for as long as it
 * can).  A span of the period that crosses a window edge is sampled like
 * any other, so the fixed window's edge spike shows, to within one
 * sample.
 * A long trace halves the resolution (bins merged pairwise); once a bin is
 * wider than a period, or the period no longer splits into whole bins,
 * each bin shows its mean per period instead (sub == 0). */
typedef struct chart {
    uint64_t t0, width_ns, period, t_last;
    unsigned sub; /* bins per period; 0: mean per period of each bin */
    size_t nbins;
    keymap_t *keys; /* --svg: each key's own series (NULL: none kept) */
    uint64_t offered[MAX_BINS];
} chart_t;

static void keys_coarsen(keymap_t *keys, size_t nlanes);

static void chart_start(chart_t *c, uint64_t t, uint64_t period)
{
    static const unsigned subs[] = {128, 64, 32, 16, 8, 4, 2, 1};
    c->period = period;
    c->t0 = t - t % period;
    c->sub = 1;
    for (size_t i = 0; i < sizeof subs / sizeof subs[0]; i++)
        if (period % subs[i] == 0) {
            c->sub = subs[i];
            break;
        }
    c->width_ns = period / c->sub;
}

/* Halves the resolution: merges bins pairwise, doubling their width. */
static void coarsen(chart_t *c, lane_t *lanes, size_t nlanes)
{
    for (size_t i = 0; i < MAX_BINS / 2; i++) {
        c->offered[i] = c->offered[2 * i] + c->offered[2 * i + 1];
        for (size_t a = 0; a < nlanes; a++)
            lanes[a].bins[i] = lanes[a].bins[2 * i] + lanes[a].bins[2 * i + 1];
    }
    memset(c->offered + MAX_BINS / 2, 0, sizeof c->offered / 2);
    for (size_t a = 0; a < nlanes; a++)
        memset(lanes[a].bins + MAX_BINS / 2, 0,
               MAX_BINS / 2 * sizeof *lanes[a].bins);
    if (c->keys != NULL)
        keys_coarsen(c->keys, nlanes);
    c->width_ns *= 2;
    c->nbins = (c->nbins + 1) / 2;
    c->sub = c->sub % 2 == 0 ? c->sub / 2 : 0;
}

static size_t bin_of(chart_t *c, lane_t *lanes, size_t nlanes, uint64_t t)
{
    uint64_t off = t > c->t0 ? t - c->t0 : 0;
    while (off / c->width_ns >= MAX_BINS)
        coarsen(c, lanes, nlanes);
    size_t b = (size_t)(off / c->width_ns);
    if (b + 1 > c->nbins)
        c->nbins = b + 1;
    if (t > c->t_last)
        c->t_last = t;
    return b;
}

/* The number of samples drawn: every bin in sliding mode (the last
 * window ends with the bin of the last request: a span of a whole period,
 * the trace's last one); in mean mode a last bin the trace does not cover
 * to its end is left out rather than drawn as a drop (unless it is the
 * only one). */
static size_t chart_points(const chart_t *c)
{
    if (c->sub == 0 && c->nbins > 1 &&
        c->t_last - c->t0 + 1 < c->nbins * c->width_ns)
        return c->nbins - 1;
    return c->nbins;
}

/* The value plotted at sample i of series v. */
static double chart_value(const chart_t *c, const uint64_t *v, size_t i)
{
    if (c->sub == 0)
        return (double)v[i] * (double)c->period / (double)c->width_ns;
    uint64_t sum = 0;
    for (size_t k = 0; k < c->sub && k <= i; k++)
        sum += v[i - k];
    return (double)sum;
}

/* The time of sample i, ns: the end of its window. */
static uint64_t chart_time(const chart_t *c, size_t i)
{
    return c->t0 + (c->sub == 0 ? i * c->width_ns + c->width_ns / 2
                                : (i + 1) * c->width_ns);
}

/* Records an admission of key at t for the burstiness columns. */
static int note_admitted(lane_t *ln, const trace_req_t *r, uint64_t period)
{
    keyrec_t *k = keymap_get(&ln->keys, r->key, r->key_len);
    if (k == NULL)
        return -1;
    while (k->head < k->ntimes && k->times[k->head] + period <= r->t_ns)
        k->head++;
    if (k->ntimes == k->cap) {
        if (k->head > 0) { /* slide the live part to the front */
            memmove(k->times, k->times + k->head,
                    (k->ntimes - k->head) * sizeof *k->times);
            k->ntimes -= k->head;
            k->head = 0;
        }
        if (k->ntimes == k->cap) {
            size_t cap = k->cap ? k->cap * 2 : 16;
            uint64_t *t = realloc(k->times, cap * sizeof *t);
            if (t == NULL)
                return -1;
            k->times = t;
            k->cap = cap;
        }
    }
    k->times[k->ntimes++] = r->t_ns;
    uint64_t count = k->ntimes - k->head;
    if (count > ln->max_window)
        ln->max_window = count;
    /* The span (t - period, t] crosses an edge if its oldest admission lies
     * in an earlier fixed window than t. */
    if (k->times[k->head] / period != r->t_ns / period && count > ln->spike)
        ln->spike = count;
    return 0;
}

static void xml_text(FILE *f, const char *s)
{
    for (; *s; s++) {
        switch (*s) {
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '&': fputs("&amp;", f); break;
        case '"': fputs("&quot;", f); break;
        default: fputc(*s, f);
        }
    }
}

/* A round step (1, 2 or 5 times a power of ten) giving about `n` ticks. */
static double nice_step(double range, int n)
{
    if (!(range > 0))
        return 1; /* no range (an empty chart): any step ends the loops */
    double raw = range / n, p = 1;
    while (p * 10 <= raw)
        p *= 10;
    while (p > raw)
        p /= 10;
    return raw <= p ? p : raw <= 2 * p ? 2 * p : raw <= 5 * p ? 5 * p : 10 * p;
}

/* The plotted numbers: one row per sample, the time (s) at the end of its
 * window, then the offered load and each lane. */
static int write_series(FILE *f, const chart_t *c, const lane_t *lanes,
                        size_t nlanes)
{
    fputs("time,offered", f);
    for (size_t a = 0; a < nlanes; a++)
        fprintf(f, ",\"%s\"", lanes[a].text);
    fputc('\n', f);
    size_t np = chart_points(c);
    for (size_t i = 0; i < np; i++) {
        char buf[32];
        *fmt_seconds(buf, chart_time(c, i)) = '\0';
        fputs(buf, f);
        fprintf(f, ",%.10g", chart_value(c, c->offered, i));
        for (size_t a = 0; a < nlanes; a++)
            fprintf(f, ",%.10g", chart_value(c, lanes[a].bins, i));
        fputc('\n', f);
    }
    return fflush(f) == 0 && !ferror(f) ? 0 : -1;
}

/* ---- per-key series, for the chart's per-key panels ----
 * Each key keeps a list of entries, one per bin in which it sent requests,
 * in bin order: {bin, offered, admitted by lane 0, 1, ...}.  Memory grows
 * with the (key, bin) pairs that had traffic, at most one per request. */

static size_t stride(size_t nlanes)
{
    return 2 + nlanes;
}

/* The entry of key k for bin b, made if missing; NULL when out of memory. */
static uint64_t *key_entry(keyrec_t *k, size_t nlanes, uint64_t b)
{
    size_t e = stride(nlanes), n = k->nseries;
    size_t at = n; /* insert here, keeping bin order */
    while (at > 0 && k->series[(at - 1) * e] >= b) {
        if (k->series[(at - 1) * e] == b)
            return &k->series[(at - 1) * e];
        at--; /* only an out-of-order line looks further back */
    }
    if (n == k->series_cap) {
        size_t cap = k->series_cap ? k->series_cap * 2 : 8;
        uint64_t *ns = realloc(k->series, cap * e * sizeof *ns);
        if (ns == NULL)
            return NULL;
        k->series = ns;
        k->series_cap = cap;
    }
    memmove(&k->series[(at + 1) * e], &k->series[at * e],
            (n - at) * e * sizeof *k->series);
    memset(&k->series[at * e], 0, e * sizeof *k->series);
    k->series[at * e] = b;
    k->nseries++;
    return &k->series[at * e];
}

/* The chart halved its resolution: every key's bins too. */
static void keys_coarsen(keymap_t *keys, size_t nlanes)
{
    size_t e = stride(nlanes);
    for (size_t i = 0; i < keys->n; i++) {
        keyrec_t *k = &keys->recs[i];
        size_t out = 0;
        for (size_t j = 0; j < k->nseries; j++) {
            uint64_t *src = &k->series[j * e];
            src[0] /= 2;
            if (out > 0 && k->series[(out - 1) * e] == src[0]) {
                for (size_t x = 1; x < e; x++)
                    k->series[(out - 1) * e + x] += src[x];
                continue;
            }
            if (out != j)
                memmove(&k->series[out * e], src, e * sizeof *src);
            out++;
        }
        k->nseries = out;
    }
}

/* Most denied (over all policies) first, then most requests, then first
 * seen. */
static int by_denials(const void *a, const void *b)
{
    const keyrec_t *x = *(const keyrec_t *const *)a;
    const keyrec_t *y = *(const keyrec_t *const *)b;
    if (x->denied != y->denied)
        return x->denied < y->denied ? 1 : -1;
    if (x->allowed != y->allowed)
        return x->allowed < y->allowed ? 1 : -1;
    return x->order < y->order ? -1 : x->order > y->order;
}

/* A policy's long-run rate in permits per chart period: the lowest of its
 * limits' N per period, scaled to the chart's period. */
static double lane_rate(const lane_t *ln, uint64_t period)
{
    double r = -1;
    for (size_t i = 0; i < rate_policy_count(ln->policy); i++) {
        const rate_limit_t *l = rate_policy_limit(ln->policy, i);
        double v = (double)l->limit * (double)period / (double)l->period_ns;
        if (r < 0 || v < r)
            r = v;
    }
    return r;
}

/* A duration for a title: "1 s", "500 ms", "2 min". */
static const char *dur_words(char *buf, size_t len, uint64_t ns)
{
    if (ns % (3600 * RATE_NS_PER_S) == 0)
        snprintf(buf, len, "%llu h", (unsigned long long)(ns / 3600 / RATE_NS_PER_S));
    else if (ns % (60 * RATE_NS_PER_S) == 0)
        snprintf(buf, len, "%llu min", (unsigned long long)(ns / 60 / RATE_NS_PER_S));
    else if (ns >= RATE_NS_PER_S)
        snprintf(buf, len, "%g s", (double)ns / 1e9);
    else
        snprintf(buf, len, "%g ms", (double)ns / 1e6);
    return buf;
}

#define TOP_KEYS 3 /* the chart's columns: the keys denied most */

/* note: the input's warning on its times (NULL: none), a line under the
 * chart, so that a saved chart carries it. */
static int write_svg(FILE *f, const chart_t *c, const lane_t *lanes,
                     size_t nlanes, uint64_t period, keymap_t *keys,
                     const char *note)
{
    static const char *colors[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd",
                                   "#8c564b", "#e377c2", "#17becf", "#bcbd22",
                                   "#7f7f7f", "#d62728"};
    const size_t ncolors = sizeof colors / sizeof colors[0];
    size_t np = chart_points(c), e = stride(nlanes);
    /* the columns: up to TOP_KEYS keys, most denied first */
    keyrec_t *top[TOP_KEYS];
    size_t nk = 0;
    {
        keyrec_t **all = malloc((keys->n ? keys->n : 1) * sizeof *all);
        if (all == NULL)
            return -1;
        for (size_t i = 0; i < keys->n; i++)
            all[i] = &keys->recs[i];
        qsort(all, keys->n, sizeof *all, by_denials);
        nk = keys->n < TOP_KEYS ? keys->n : TOP_KEYS;
        for (size_t i = 0; i < nk; i++)
            top[i] = all[i];
        free(all);
    }
    if (np == 0)
        nk = 0;
    /* dense[k][s * np + i]: series s (0 offered, 1 + a lane a) of column
     * k's key at bin i */
    size_t nbins = c->nbins;
    uint64_t *dense = calloc((nk ? nk : 1) * (1 + nlanes) * (nbins ? nbins : 1),
                             sizeof *dense);
    if (dense == NULL)
        return -1;
    for (size_t k = 0; k < nk; k++)
        for (size_t j = 0; j < top[k]->nseries; j++) {
            const uint64_t *en = &top[k]->series[j * e];
            if (en[0] >= nbins)
                continue;
            for (size_t sidx = 0; sidx <= nlanes; sidx++)
                dense[(k * (1 + nlanes) + sidx) * nbins + en[0]] = en[1 + sidx];
        }
#define SERIES(k, sidx) (dense + ((k) * (1 + nlanes) + (sidx)) * nbins)
    /* geometry: a panel per (policy, key); columns the keys, rows the
     * policies */
    const double W = 980, X0 = 64, XR = 20, GAP = 44, TOPY = 96;
    const double PH = nlanes > 6 ? 60 : 84, PITCH = PH + 40;
    size_t ncol = nk ? nk : 1;
    double pw = (W - X0 - XR - GAP * (double)(ncol - 1)) / (double)ncol;
    double H = TOPY + PITCH * (double)nlanes + 30;
    double H_all = H + (note != NULL ? 22 : 0);
    /* Under --fair the rate is the shared limit's, of all keys together:
     * not drawn in a key's panel as if it were the key's own. */
    bool fair = nlanes > 0 && lanes[0].fair != NULL;
    double span = np > 0 ? (double)(chart_time(c, np - 1) - c->t0) / 1e9
                         : (double)period / 1e9;
    if (!(span > 0))
        span = (double)period / 1e9;
    char pw_text[32], bin_text[32];
    dur_words(pw_text, sizeof pw_text, period);
    dur_words(bin_text, sizeof bin_text, c->width_ns);
    /* clock time when the trace's times are dates (after 2000), seconds
     * from the start otherwise */
    bool clock = c->t0 >= UINT64_C(946684800) * RATE_NS_PER_S;
    double t0s = (double)(c->t0 / RATE_NS_PER_S) +
                 (double)(c->t0 % RATE_NS_PER_S) / 1e9;

    fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
               "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" "
               "height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" "
               "font-family=\"sans-serif\" font-size=\"11\">\n"
               "<rect width=\"%.0f\" height=\"%.0f\" fill=\"white\"/>\n",
            W, H_all, W, H_all, W, H_all);
    if (nk < keys->n)
        fprintf(f, "<text x=\"%.0f\" y=\"22\" font-size=\"15\" "
                   "font-weight=\"bold\">Requests per %s of the %zu keys "
                   "denied most (of %zu), and what each policy admits"
                   "</text>\n", X0, pw_text, nk, keys->n);
    else
        fprintf(f, "<text x=\"%.0f\" y=\"22\" font-size=\"15\" "
                   "font-weight=\"bold\">Requests per %s of %s, and what "
                   "each policy admits</text>\n", X0, pw_text,
                nk == 1 ? "the key" : "each key");
    if (c->sub != 0 || np == 0)
        fprintf(f, "<text x=\"%.0f\" y=\"40\">Each point counts one "
                   "key's requests in the %s before it; the table has every "
                   "key.</text>\n", X0, pw_text);
    else
        fprintf(f, "<text x=\"%.0f\" y=\"40\">Each point is one key's "
                   "mean per %s over %s (a long trace); the table has every "
                   "key.</text>\n", X0, pw_text, bin_text);
    /* the legend: one line above the panels, not beside them */
    fprintf(f, "<rect x=\"%.0f\" y=\"50\" width=\"22\" height=\"10\" "
               "fill=\"#ddd\" stroke=\"#aaa\"/><text x=\"%.0f\" y=\"59\">"
               "sent (offered load)</text>\n"
               "<line x1=\"%.0f\" y1=\"55\" x2=\"%.0f\" y2=\"55\" "
               "stroke=\"#333\" stroke-width=\"2\"/><text x=\"%.0f\" "
               "y=\"59\">admitted (one colour per policy)</text>\n",
            X0, X0 + 28, X0 + 170, X0 + 192, X0 + 198);
    if (fair)
        fprintf(f, "<text x=\"%.0f\" y=\"59\">each policy is one limit "
                   "shared fairly by all the keys (its rate is theirs "
                   "together)</text>\n", X0 + 420);
    else
        fprintf(f, "<line x1=\"%.0f\" y1=\"55\" x2=\"%.0f\" y2=\"55\" "
                   "stroke=\"#d62728\" stroke-width=\"1.5\" "
                   "stroke-dasharray=\"5 3\"/><text x=\"%.0f\" y=\"59\">"
                   "the policy's rate per %s</text>\n",
                X0 + 420, X0 + 442, X0 + 448, pw_text);
    if (np == 0)
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">"
                   "no requests in the trace</text>\n", W / 2, TOPY + 40);
    /* x ticks: seconds from the start, or clock times on round steps */
    double xstep;
    if (clock) {
        static const double steps[] = {1, 2, 5, 10, 15, 30, 60, 120, 300,
                                       600, 900, 1800, 3600, 7200, 21600,
                                       43200, 86400};
        xstep = 86400;
        for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++)
            if (span / steps[i] <= 6 * (pw > 400 ? 2 : 1) / (nk > 1 ? 1.5 : 1)) {
                xstep = steps[i];
                break;
            }
    } else {
        xstep = nice_step(span, pw > 400 ? 8 : 4);
    }
    double xfirst = clock ? xstep * (double)(long long)((t0s + xstep - 1e-3) /
                                                        xstep) - t0s
                          : 0;
    for (size_t k = 0; k < nk; k++) {
        double px0 = X0 + (double)k * (pw + GAP);
        /* the column's scale: its key's largest offered load or rate */
        double ymax = 1;
        for (size_t i = 0; i < np; i++)
            for (size_t sidx = 0; sidx <= nlanes; sidx++)
                if (chart_value(c, SERIES(k, sidx), i) > ymax)
                    ymax = chart_value(c, SERIES(k, sidx), i);
        for (size_t a = 0; a < nlanes && !fair; a++)
            if (lane_rate(&lanes[a], period) > ymax)
                ymax = lane_rate(&lanes[a], period);
        double ystep = nice_step(ymax, 2);
        ymax = ystep * (double)(long)(ymax / ystep + 0.999);
        /* the column's head: the key */
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"12\" "
                   "font-weight=\"bold\">", px0, TOPY - 16);
        char kt[64];
        size_t kl = top[k]->len < 40 ? top[k]->len : 40;
        memcpy(kt, top[k]->key, kl);
        kt[kl] = '\0';
        for (size_t i = 0; i < kl; i++)
            if ((unsigned char)kt[i] < 32)
                kt[i] = '?';
        xml_text(f, kt);
        fprintf(f, "%s</text>\n<text x=\"%.1f\" y=\"%.1f\" "
                   "text-anchor=\"end\" fill=\"#555\">%llu requests</text>\n",
                top[k]->len > 40 ? "..." : "", px0 + pw, TOPY - 16,
                (unsigned long long)top[k]->allowed);
        for (size_t a = 0; a < nlanes; a++) {
            const char *col = colors[a % ncolors];
            double py0 = TOPY + (double)a * PITCH, pyb = py0 + PH;
            uint64_t adm = 0;
            for (size_t i = 0; i < nbins; i++)
                adm += SERIES(k, 1 + a)[i];
            /* the panel's title: the policy, and what it admitted */
            fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" fill=\"%s\">", px0,
                    py0 - 4, col);
            xml_text(f, lanes[a].text);
            fprintf(f, "</text>\n<text x=\"%.1f\" y=\"%.1f\" "
                       "text-anchor=\"end\" fill=\"#555\">%llu admitted"
                       "</text>\n", px0 + pw, py0 - 4,
                    (unsigned long long)adm);
            fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" "
                       "height=\"%.1f\" fill=\"none\" stroke=\"#999\"/>\n",
                    px0, py0, pw, PH);
            for (double y = ystep; y <= ymax + 1e-9; y += ystep) {
                double py = pyb - y / ymax * PH;
                fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" "
                           "y2=\"%.1f\" stroke=\"#eee\"/>\n", px0, py,
                        px0 + pw, py);
            }
            for (double y = 0; y <= ymax + 1e-9; y += ystep)
                fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\" "
                           "fill=\"#555\">%g</text>\n", px0 - 4,
                        pyb - y / ymax * PH + 4, y);
            for (double x = xfirst; x <= span + 1e-9; x += xstep) {
                double px = px0 + x / span * pw;
                fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" "
                           "y2=\"%.1f\" stroke=\"#999\"/>\n", px, pyb, px,
                        pyb + 4);
                char lab[32];
                if (clock) {
                    time_t tt = (time_t)(t0s + x + 0.5);
                    struct tm tm;
                    gmtime_r(&tt, &tm);
                    strftime(lab, sizeof lab, xstep >= 60 ? "%H:%M"
                                                          : "%H:%M:%S", &tm);
                } else {
                    snprintf(lab, sizeof lab, "%g", x);
                }
                fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" "
                           "text-anchor=\"middle\" fill=\"#555\">%s</text>\n",
                        px, pyb + 15, lab);
            }
            /* sent: a grey area; admitted: the policy's line; the rate:
             * dashed */
            fprintf(f, "<polygon fill=\"#ddd\" stroke=\"#aaa\" "
                       "stroke-width=\"0.5\" points=\"%.1f,%.1f", px0, pyb);
            for (size_t i = 0; i < np; i++) {
                double t = (double)(chart_time(c, i) - c->t0) / 1e9;
                fprintf(f, " %.1f,%.1f", px0 + t / span * pw,
                        pyb - chart_value(c, SERIES(k, 0), i) / ymax * PH);
            }
            fprintf(f, " %.1f,%.1f\"/>\n", px0 + (double)(chart_time(c, np - 1) - c->t0) / 1e9 / span * pw, pyb);
            fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" "
                       "stroke-width=\"1.6\" points=\"", col);
            for (size_t i = 0; i < np; i++) {
                double t = (double)(chart_time(c, i) - c->t0) / 1e9;
                fprintf(f, "%s%.1f,%.1f", i ? " " : "", px0 + t / span * pw,
                        pyb - chart_value(c, SERIES(k, 1 + a), i) / ymax *
                                  PH);
            }
            fputs("\"/>\n", f);
            if (fair)
                continue;
            double ry = pyb - lane_rate(&lanes[a], period) / ymax * PH;
            fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" "
                       "y2=\"%.1f\" stroke=\"#d62728\" stroke-width=\"1.5\" "
                       "stroke-dasharray=\"5 3\"/>\n", px0, ry, px0 + pw, ry);
        }
    }
    /* the x axis's name, under the last row */
    char axis[96];
    if (clock) {
        time_t tt = (time_t)t0s;
        struct tm tm;
        gmtime_r(&tt, &tm);
        strftime(axis, sizeof axis, "time (UTC) on %Y-%m-%d", &tm);
    } else {
        snprintf(axis, sizeof axis, "seconds from the start of the trace");
    }
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s"
               "</text>\n", X0 + (W - X0 - XR) / 2, H - 8, axis);
    fprintf(f, "<text x=\"14\" y=\"%.1f\" text-anchor=\"middle\" "
               "transform=\"rotate(-90 14 %.1f)\">requests in the last %s"
               "</text>\n", TOPY + PITCH * (double)nlanes / 2,
            TOPY + PITCH * (double)nlanes / 2, pw_text);
    if (note != NULL) {
        fprintf(f, "<text x=\"%.0f\" y=\"%.1f\" fill=\"#d62728\">", X0,
                H + 12);
        xml_text(f, note);
        fputs("</text>\n", f);
    }
    fputs("</svg>\n", f);
#undef SERIES
    free(dense);
    return fflush(f) == 0 && !ferror(f) ? 0 : -1;
}

/* Makes lane ln's limiter for policy (taken over). */
static int lane_init(lane_t *ln, rate_policy_t *policy)
{
    ln->policy = policy;
    rate_policy_format(policy, ln->text, sizeof ln->text);
    ln->bins = calloc(MAX_BINS, sizeof *ln->bins);
    rate_limiter_config_t cfg = {.policy = policy};
    if (ln->bins == NULL || rate_limiter_new(&cfg, &ln->lim) != RATE_OK)
        return cli_fail("compare: cannot make a limiter");
    return 0;
}

static int setup_lanes(lane_t *lanes, uint64_t limit, uint64_t period,
                       uint64_t burst, uint64_t capacity)
{
    char err[256];
    for (size_t a = 0; a < ALGOS; a++) {
        lane_t *ln = &lanes[a];
        const char *opt = cli_algorithm_option(cli_algorithm(a));
        bool bucket = opt[0] != '\0';
        rate_policy_t *p;
        ln->limit = (rate_limit_t){
            .algorithm = cli_algorithm(a), .limit = limit, .period_ns = period,
            .burst = !bucket ? 0
                     : strcmp(opt, "capacity") == 0 ? capacity
                                                    : burst};
        ln->reserves = bucket;
        if (rate_policy_new(&ln->limit, 1, &p, err, sizeof err) != 0)
            return cli_fail("compare: %s", err);
        if (lane_init(ln, p) != 0)
            return 2;
    }
    return 0;
}

static void print_table(const lane_t *lanes, size_t nlanes)
{
    int w = 34;
    for (size_t a = 0; a < nlanes; a++)
        if ((int)strlen(lanes[a].text) > w)
            w = (int)strlen(lanes[a].text);
    printf("%-*s %9s %9s %10s %10s %11s\n", w, "policy", "admitted", "denied",
           "max/period", "edge spike", "mean delay");
    for (size_t a = 0; a < nlanes; a++) {
        const lane_t *ln = &lanes[a];
        double mean = ln->admitted ? (double)ln->delay_sum_ns /
                                         (double)ln->admitted / 1e6 : 0;
        printf("%-*s %9llu %9llu %10llu %10llu %8.3f ms\n", w, ln->text,
               (unsigned long long)ln->admitted,
               (unsigned long long)ln->denied,
               (unsigned long long)ln->max_window,
               (unsigned long long)ln->spike, mean);
    }
}

/* Opens an output file before any output, so that an unwritable path is a
 * command-line error. */
static int open_out(const char *path, FILE **f)
{
    *f = NULL;
    if (path != NULL && (*f = fopen(path, "w")) == NULL)
        return cli_fail("compare: cannot write '%s': %s", path,
                        strerror(errno));
    return 0;
}

int cmd_compare(int argc, char **argv)
{
    const char *rate = NULL, *burst_text = NULL, *max_wait_text = NULL;
    const char *svg = NULL, *series = NULL, *input = "trace", *field = NULL;
    const char *time_field = NULL;
    const char *limit_text = NULL, *window_text = NULL, *cap_text = NULL;
    const char *policies[16];
    size_t npolicies = 0;
    bool skip_bad = false;
    static fair_opts_t fo;
    memset(&fo, 0, sizeof fo);
    int c;

    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":", longopts, NULL)) != -1) {
        switch (c) {
        case O_RATE: rate = optarg; break;
        case O_BURST: burst_text = optarg; break;
        case O_CAPACITY: cap_text = optarg; break;
        case O_LIMIT: limit_text = optarg; break;
        case O_WINDOW: window_text = optarg; break;
        case O_POLICY:
            if (npolicies == sizeof policies / sizeof policies[0])
                return cli_fail("compare: more than %zu --policy options",
                                sizeof policies / sizeof policies[0]);
            policies[npolicies++] = optarg;
            break;
        case O_MAXWAIT: max_wait_text = optarg; break;
        case O_SVG: svg = optarg; break;
        case O_SERIES: series = optarg; break;
        case O_INPUT: input = optarg; break;
        case O_KEYFIELD: field = optarg; break;
        case O_TIMEFIELD: time_field = optarg; break;
        case O_SKIPBAD: skip_bad = true; break;
        case O_FAIR: fo.key = optarg; break;
        case O_WEIGHT:
            if (fair_opt_weight(&fo, "compare", optarg) != 0)
                return 2;
            break;
        case O_HELP: fputs(usage, stdout); return 0;
        default: return getopt_fail("compare", c, argv);
        }
    }
    if (argc - optind > 1)
        return cli_fail("compare: more than one FILE ('%s', '%s')",
                        argv[optind], argv[optind + 1]);
    if (fair_opts_check(&fo, "compare") != 0)
        return 2;
    if (fo.key != NULL && max_wait_text != NULL)
        return cli_fail("compare: --fair decides without waiting: it takes "
                        "no --max-wait");
    uint64_t limit = 0, period = 0, burst, capacity, max_wait = 0;
    char why[256];
    bool five = rate != NULL || limit_text != NULL || window_text != NULL;
    if (rate != NULL && (limit_text != NULL || window_text != NULL))
        return cli_fail("compare: --rate N/DUR and --limit N --window DUR "
                        "say the same thing; give one");
    if (!five && npolicies == 0)
        return cli_fail("compare: --rate is required (e.g. --rate 100/s; or "
                        "--limit N --window DUR, or --policy TEXT)");
    if (rate != NULL) {
        if (rate_parse_rate(rate, &limit, &period, why, sizeof why) !=
            RATE_OK)
            return cli_fail("compare: --rate %s", why);
    } else if (five) {
        if (limit_text == NULL || window_text == NULL)
            return cli_fail("compare: --%s needs --%s", limit_text ? "limit"
                            : "window", limit_text ? "window" : "limit");
        if (rate_parse_count(limit_text, &limit, NULL, 0) != RATE_OK ||
            limit == 0)
            return cli_fail("compare: --limit '%s' is not a whole number "
                            "from 1", limit_text);
        if (rate_parse_duration(window_text, &period, why, sizeof why) !=
            RATE_OK)
            return cli_fail("compare: --window %s", why);
        if (period == 0)
            return cli_fail("compare: --window '%s' is zero", window_text);
    } else if (burst_text != NULL || cap_text != NULL) {
        return cli_fail("compare: --%s sizes the buckets of --rate; with "
                        "--policy alone it has nothing to size (write "
                        "burst= or capacity= in the policy)",
                        burst_text ? "burst" : "capacity");
    }
    burst = limit;
    if (burst_text != NULL &&
        (rate_parse_count(burst_text, &burst, NULL, 0) != RATE_OK ||
         burst == 0))
        return cli_fail("compare: --burst '%s' is not a whole number from 1",
                        burst_text);
    capacity = burst;
    if (cap_text != NULL &&
        (rate_parse_count(cap_text, &capacity, NULL, 0) != RATE_OK ||
         capacity == 0))
        return cli_fail("compare: --capacity '%s' is not a whole number "
                        "from 1", cap_text);
    if (max_wait_text != NULL &&
        rate_parse_duration(max_wait_text, &max_wait, why, sizeof why) !=
            RATE_OK)
        return cli_fail("compare: --max-wait %s", why);
    FILE *svg_file = NULL, *series_file = NULL;
    if (open_out(svg, &svg_file) != 0)
        return 2;
    if (open_out(series, &series_file) != 0) {
        if (svg_file != NULL)
            fclose(svg_file);
        return 2;
    }
    size_t nlanes = (five ? ALGOS : 0) + npolicies;
    lane_t *lanes = calloc(nlanes, sizeof *lanes);
    chart_t *chart = calloc(1, sizeof *chart);
    int status = lanes && chart ? 0 : cli_fail("compare: out of memory");
    if (status == 0 && five)
        status = setup_lanes(lanes, limit, period, burst, capacity);
    for (size_t i = 0; status == 0 && i < npolicies; i++) {
        lane_t *ln = &lanes[(five ? ALGOS : 0) + i];
        rate_policy_t *p;
        if (policy_from_text("compare", policies[i], &p) != 0) {
            status = 2;
            break;
        }
        ln->reserves = !policy_has_window(p);
        status = lane_init(ln, p);
        /* Without --rate, the first policy's first limit sets the period
         * of the burstiness columns and of the chart. */
        if (status == 0 && period == 0)
            period = rate_policy_limit(p, 0)->period_ns;
    }
    for (size_t a = 0; status == 0 && fo.key != NULL && a < nlanes; a++)
        status = fair_open(&fo, "compare", lanes[a].lim, &lanes[a].fair);
    keymap_t svg_keys = {0};
    if (status == 0 && svg_file != NULL)
        chart->keys = &svg_keys;
    reader_t rd = {0};
    if (status == 0)
        status = reader_open(&rd, "compare", input, field, time_field,
                             argc > optind ? argv[optind] : NULL);
    rd.skip_bad = skip_bad;
    trace_req_t r;
    bool first = true;
    int more;
    while (status == 0 && (more = reader_next(&rd, &r)) != 0) {
        if (more == 2) {
            status = 2;
            break;
        }
        if (first) {
            chart_start(chart, r.t_ns, period);
            first = false;
        }
        size_t bin = bin_of(chart, lanes, nlanes, r.t_ns);
        chart->offered[bin] += r.permits;
        uint64_t *entry = NULL; /* the key's series at this bin (--svg) */
        keyrec_t *kr = NULL;
        if (chart->keys != NULL) {
            kr = keymap_get(chart->keys, r.key, r.key_len);
            entry = kr ? key_entry(kr, nlanes, bin) : NULL;
            if (entry == NULL) {
                status = cli_fail("compare: out of memory");
                break;
            }
            entry[1] += r.permits;
            kr->allowed++; /* here: the key's requests */
        }
        for (size_t a = 0; a < nlanes && status == 0; a++) {
            lane_t *ln = &lanes[a];
            rate_decision_t d;
            uint64_t mw = ln->reserves ? max_wait : 0;
            int rc = ln->fair != NULL
                         ? rate_fair_check_at(ln->fair, r.key, r.key_len,
                                              fair_weight_of(&fo, r.key,
                                                             r.key_len),
                                              r.permits, r.t_ns, &d)
                         : rate_limiter_check_at(ln->lim, r.key, r.key_len,
                                                 r.permits, mw, r.t_ns, &d);
            if (rc != RATE_OK) {
                status = cli_fail("compare: line %llu: a value is out of "
                                  "range", (unsigned long long)rd.lineno);
                break;
            }
            if (!d.allowed) {
                ln->denied++;
                if (kr != NULL)
                    kr->denied++; /* over all policies */
                continue;
            }
            ln->admitted++;
            ln->delay_sum_ns += d.delay_ns;
            ln->bins[bin] += r.permits;
            if (entry != NULL)
                entry[2 + a] += r.permits;
            if (r.permits > 0 && note_admitted(ln, &r, period) != 0)
                status = cli_fail("compare: out of memory");
        }
    }
    if (status == 0) {
        reader_report(&rd);
        const rate_policy_t *pols[32];
        size_t np = 0;
        for (size_t a = 0; a < nlanes && np < 32; a++)
            pols[np++] = lanes[a].policy;
        reader_warn_time(&rd, pols, np);
        char note[200];
        bool coarse = reader_coarse_note(&rd, pols, np, note, sizeof note);
        print_table(lanes, nlanes);
        if (svg_file != NULL &&
            write_svg(svg_file, chart, lanes, nlanes, period, &svg_keys,
                      coarse ? note : NULL) != 0)
            status = cli_fail("compare: cannot write '%s': %s", svg,
                              strerror(errno));
        if (status == 0 && series_file != NULL &&
            write_series(series_file, chart, lanes, nlanes) != 0)
            status = cli_fail("compare: cannot write '%s': %s", series,
                              strerror(errno));
    }
    if (svg_file != NULL && fclose(svg_file) != 0 && status == 0)
        status = cli_fail("compare: cannot write '%s': %s", svg,
                              strerror(errno));
    if (series_file != NULL && fclose(series_file) != 0 && status == 0)
        status = cli_fail("compare: cannot write '%s': %s", series,
                              strerror(errno));
    reader_close(&rd);
    for (size_t a = 0; lanes && a < nlanes; a++) {
        rate_fair_free(lanes[a].fair);
        rate_limiter_free(lanes[a].lim);
        rate_policy_free(lanes[a].policy);
        keymap_free(&lanes[a].keys);
        free(lanes[a].bins);
    }
    free(lanes);
    free(chart);
    keymap_free(&svg_keys);
    return status;
}
