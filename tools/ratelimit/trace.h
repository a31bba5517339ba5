/* SPDX-License-Identifier: MIT */
/*
 * Trace input: the spec's "TIME KEY [PERMITS]" lines and web server access
 * logs in Common / Combined Log Format.  Pure functions over one line (no
 * I/O, no allocation), so the fuzz targets can call them directly.
 */
#ifndef RATE_TRACE_H
#define RATE_TRACE_H

#include <stddef.h>
#include <stdint.h>

typedef struct trace_req {
    const char *time_text; /* as written, for echoing */
    size_t time_len;
    uint64_t t_ns;
    const char *key;
    size_t key_len;
    uint64_t permits;
} trace_req_t;

enum { TRACE_SKIP = 0, TRACE_REQ = 1, TRACE_ERR = -1 };

/* One line without its newline (a trailing '\r' is ignored).  Returns
 * TRACE_REQ with *out filled (pointers into line), TRACE_SKIP for a blank or
 * comment line, or TRACE_ERR with *err set to what is wrong. */
int trace_parse_line(const char *line, size_t len, trace_req_t *out,
                     const char **err);

/* Seconds as a non-negative decimal with at most 9 fractional digits, into
 * ns, exactly.  0 on success, -1 with *err set. */
int trace_parse_time(const char *s, size_t len, uint64_t *out_ns,
                     const char **err);

typedef enum clf_field {
    CLF_HOST = 0, /* client address (the default key) */
    CLF_IDENT,
    CLF_USER,
    CLF_REQUEST, /* the whole request line */
    CLF_METHOD,
    CLF_PATH,
    CLF_STATUS,
    CLF_REFERER, /* Combined format only */
    CLF_AGENT,   /* Combined format only */
    CLF_XFF,     /* the first address of the last quoted field after the
                    agent (nginx's "$http_x_forwarded_for"); the host when
                    there is none, or it is empty or "-" */
    CLF_FIELD_1 = 100, /* CLF_FIELD_1 + i: field i + 1, as numbered below */
} clf_field_t;

#define CLF_MAX_FIELDS 64 /* fields read from one line; more is an error */

/* Parses "--key-field NAME": one of the names above (host ... agent, xff)
 * or a field number N from 1 to CLF_MAX_FIELDS; -1 if neither. */
int clf_field_from_name(const char *name);

/* One access-log line: host ident user [dd/Mon/yyyy:HH:MM:SS +zzzz]
 * "request" status bytes, then any further fields (Combined Log Format's
 * "referer" "agent", nginx's "$http_x_forwarded_for", anything else).
 * A field is a run of non-blanks, a [bracketed] or a "quoted" text (with \"
 * escapes); they are numbered from 1 (host) and the key is their text
 * without the brackets or quotes.  method and path are the request's first
 * and second words (the whole request when it has no space, as nginx's "-"
 * for a request it could not read).  The time is the bracketed timestamp
 * in ns since the epoch (UTC); time_text is the text inside the brackets.
 * Permits are 1.  Same returns as trace_parse_line. */
int clf_parse_line(const char *line, size_t len, clf_field_t key_field,
                   trace_req_t *out, const char **err);

/* clf_parse_line with the time from field time_field + 1 (0: host)
 * instead of the bracketed timestamp, in any form trace_parse_clock
 * reads (nginx's $msec: "1764644400.123"); -1: the bracketed one. */
int clf_parse_line_at(const char *line, size_t len, clf_field_t key_field,
                      int time_field, trace_req_t *out, const char **err);

/* A clock time: seconds since 1970 as trace_parse_time reads them
 * (nginx's $msec), ISO 8601 "YYYY-MM-DDTHH:MM:SS[.fff][Z|+hh:mm]"
 * (nginx's $time_iso8601) or CLF's "dd/Mon/yyyy:HH:MM:SS +zzzz".  0 on
 * success, -1 with *err set. */
int trace_parse_clock(const char *s, size_t len, uint64_t *out_ns,
                      const char **err);

/* One JSON object a line (nginx's log_format escape=json): the key is the
 * member named key_name, the time the member named time_name (a string
 * or a number, as trace_parse_clock reads it); both top-level scalars,
 * their text as written (a string without its quotes, escapes kept).
 * Other members, nested ones too, are skipped.  Permits are 1.  Same
 * returns as trace_parse_line. */
int json_parse_line(const char *line, size_t len, const char *key_name,
                    const char *time_name, trace_req_t *out,
                    const char **err);

#endif
