/* SPDX-License-Identifier: MIT */
/*
 * ratelimit_http.h -- the HTTP layer: the RateLimit and Retry-After
 * fields of a decision, and rules from a file that pick the policies of a
 * request (docs/api-server.md).  Built on the public API of ratelimit.h;
 * in the library when it is built with RATE_WITH_HTTP (the default).
 */
#ifndef RATELIMIT_HTTP_H
#define RATELIMIT_HTTP_H

#include "ratelimit.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ----------------------------------------------------- HTTP header fields */

/* The fields an HTTP server sends for one decision (or one request under
 * the rules, rate_outcome_headers): the RateLimit-Policy and RateLimit
 * fields of draft-ietf-httpapi-ratelimit-headers (structured-field lists,
 * RFC 9651; whole seconds) and Retry-After (delay-seconds, RFC 9110).
 * An empty string: send no such field.  See docs/api-server.md for the
 * mapping, case by case. */
#define RATE_HEADER_LEN 1024
typedef struct rate_headers {
    int status;  /* 0: serve the request (after the decision's delay_ns);
                    429: denied by a limit; 503: the store failed and the
                    limiter denied (fail-closed) */
    char policy[RATE_HEADER_LEN];    /* RateLimit-Policy:
                                        "NAME";q=QUOTA;w=WINDOW */
    char ratelimit[RATE_HEADER_LEN]; /* RateLimit: "NAME";r=REMAINING;t=RESET */
    char retry_after[24];            /* Retry-After: seconds, rounded up,
                                        at least 1 */
    uint64_t reserved[4]; /* room for later fields; not read */
} rate_headers_t;

/* Formats the fields for decision `d`, made under `policy` (the key's:
 * the limiter's default, or what its resolver returned).  The item's name
 * is the policy's name ("default" when it has none); the limit described
 * is the one the decision names (d->component: the one that denied or
 * constrains most, for a composite):
 *   token bucket  q = burst B, w = B*P/L rounded up (the time to refill
 *                 it from empty); leaky bucket q = capacity C,
 *                 w = C*P/L rounded up; windows q = L, w = W rounded up;
 *   r = d->remaining (at most q), t = d->reset_after_ns rounded up (until
 *   the key is back to a full quota).
 * Cases: allowed (a reservation too): status 0 and both fields; limited:
 * 429, both fields, Retry-After = retry_after_ns rounded up to whole
 * seconds, at least 1, so never earlier than a retry can pass; a request
 * that can never pass (RATE_REASON_NEVER): 429 and both fields, no
 * Retry-After (no wait helps; a server whose permits measure a request's
 * size may answer 413 instead); the unlimited policy: status 0, no field;
 * shadow mode (d->shadow): status 0, no field (the limit is not enforced:
 * r=0 would be false); a store error under fail-open: status 0, no field;
 * under fail-closed: 503, no field (no Retry-After: 0, which would send
 * every client straight back); under the fallback: the fallback's
 * decision, as above.
 *
 * Returns: RATE_OK with *out filled (status and the three fields).
 *
 * Errors: RATE_EINVAL for a NULL policy, decision or out (*out zeroed
 * when it is not NULL); RATE_ERANGE, *out zeroed, for a field that would
 * pass RATE_HEADER_LEN (no item the library's bounds allow comes near: a
 * guard).
 *
 * Ownership: policy and d are read during the call; *out is the
 * caller's; nothing is kept.
 *
 * Thread-safe: yes. */
RATE_API int rate_headers_format(const rate_policy_t *policy,
                                 const rate_decision_t *d,
                                 rate_headers_t *out);

/* ---------------------------------------------------------------- rules */

/* Rules from a file (docs/api-server.md): which named policies a request
 * gets, from attributes the server passes beside the key (an API key's
 * tier, the route, the client address: any strings), and what key each is
 * charged under.  The file is INI:
 *
 *   [policies]
 *   free = token-bucket 10/s burst=20
 *   pro = token-bucket 100/s burst=200
 *   enterprise = unlimited
 *   search = sliding-window 50/s
 *
 *   [rule pro]              ; rules are tried in order, in groups
 *   group = tier
 *   match = tier=pro        ; ATTR=VALUE ..., all on a line; more lines: any
 *   policy = pro
 *   [rule free]             ; no match: every request (the group's default)
 *   group = tier
 *   policy = free
 *   [rule search]
 *   group = route
 *   match = route=/search*  ; VALUE* matches a prefix
 *   policy = search
 *   key = route             ; one key for the route ("@search:/search")
 *
 * In each group the first rule that matches applies; a request gets the
 * policies of every group's match (at most RATE_RULES_MAX_APPLY), or, when
 * no rule matches, the limiter's default policy.  A request's own key is
 * stored as it is, or, when it begins with '@', with one more '@' before
 * it ("@@search"), so that no client's key is a rule's "@RULE..." key;
 * such a key may then be at most RATE_KEY_MAX - 1 bytes.  A request
 * passes only if every policy allows it; when one denies, what the others
 * admitted is refunded (rate_limiter_refund), so a denial charges
 * nothing.  A refund is not atomic with the decisions: a concurrent
 * request on the same key may see the permit spent for that moment.
 *
 * Fair shares (docs/fair.md): `key = fair` charges the rule's one key
 * ("@RULE") as `shared` does, divided fairly among the requests' own keys
 * (rate_fair_t, one per rule, policy and limiter, made at the limiter's
 * first decision there, on the limiter's clock, and kept in memory until
 * the rules are replaced: a reload starts the division afresh; it decides
 * without waiting, max_wait aside).  Each limiter ever passed to the
 * rules keeps its fair tables (rate_fair_memory: about 50 KB per policy
 * of a fair rule, a table of 64 flows; `slots = N` in the rule, 1 to
 * RATE_FAIR_SLOTS_MAX, sizes it for N flows, about 0.8 KB each: give it
 * twice the clients active at once, docs/fair.md) until a reload or
 * rate_rules_free, even after the limiter is freed: pass the rules a few
 * long-lived limiters, not one per request.  A limiter made at a freed one's address starts afresh (the
 * tables are the limiter's, not the address's).  `weight = N` (1..RATE_FAIR_WEIGHT_MAX)
 * in a rule gives the requests it matches that weight there: the first
 * matching rule with a weight, in group order (a tier's rule), else 1. */
#define RATE_RULES_MAX_APPLY 4

typedef struct rate_rules rate_rules_t;

/* A request's attribute: both NUL-terminated, borrowed for the call. */
typedef struct rate_attr {
    const char *name;
    const char *value;
} rate_attr_t;

/* One policy's part of a request's outcome.  A plain value: copies, so an
 * outcome outlives any reload of the rules. */
typedef struct rate_applied {
    char policy_name[RATE_POLICY_NAME_MAX + 1];
    bool unlimited;
    rate_limit_t limit;        /* the limit the decision names (a copy);
                                  zero for the unlimited policy */
    uint64_t permits;
    bool refunded;             /* admitted, then given back: another
                                  policy denied the request */
    rate_decision_t decision;
    uint64_t concurrency;      /* an in-flight policy's decision on its
                                  concurrency limit: the leases this
                                  request's class may hold (N, or N-K
                                  under a reserve); else 0 (then `limit`
                                  is the limit named) */
    uint64_t reserved[1];      /* room for later fields; not read */
} rate_applied_t;

typedef struct rate_outcome {
    bool allowed;        /* every policy allowed the request */
    int denied_by;       /* the first applied policy that denied, or -1 */
    uint64_t delay_ns;   /* allowed: the longest wait of a reservation */
    uint64_t generation; /* the rules that decided (rate_rules_generation) */
    size_t count;
    rate_applied_t applied[RATE_RULES_MAX_APPLY];
    uint64_t reserved[4]; /* room for later fields; not read */
} rate_outcome_t;

/* Reads a rules file and makes the rules of its generation 1.
 *
 * Returns: RATE_OK with the rules in *out.
 *
 * Errors, each with a one-line message in err (at most errlen bytes with
 * the NUL) naming the file, the line and what is wrong ("rules.conf:7:
 * policy 'gold' is not defined ..."); *out is NULL when out is not:
 * RATE_EINVAL for a NULL path or out, or a file that cannot be opened
 * (or is a directory: "PATH: cannot read: Is a directory");
 * RATE_EPOLICY for anything wrong in it (a policy's text, an unknown
 * section or setting, a rule that can never apply, a line longer than
 * libinih reads; an empty file, a last line without its newline, no
 * [rule NAME]: torn or would leave every request unlimited), and for a
 * read error (its reason in err) or a parser out of memory midway;
 * RATE_ENOMEM.
 *
 * Ownership: path is copied (a reload without a path reads it again);
 * err is the caller's.  The caller frees *out with rate_rules_free.
 *
 * Thread-safe: yes. */
RATE_API int rate_rules_load(const char *path, rate_rules_t **out,
                             char *err, size_t errlen);

/* Reads the file again (path NULL: the one it was loaded from; else this
 * one, which later reloads then read) and, only if all of it is good,
 * makes it the rules of every later decision, atomically: a decision sees
 * the old rules or the new, never a mix; decisions running keep theirs.
 * A bad file changes nothing (errors as for rate_rules_load).  Old rules
 * are freed once no decision can use them: what is kept does not grow
 * with the number of reloads (at most one old set per thread that is
 * deciding at that moment).  Each key's state carries over to the new
 * policies (docs/algorithms.md, "Policy changes").
 *
 * Returns: RATE_OK once the new rules are in use (rate_rules_generation
 * one more).
 *
 * Errors: as for rate_rules_load, with err, and RATE_EINVAL for NULL
 * rules; the rules in use then stay, and so does the path.
 *
 * Ownership: rules is borrowed; a path given is copied (on success) and
 * replaces the one kept; err is the caller's.
 *
 * Thread-safe: yes, alongside rate_rules_check.  Reloads are serialised;
 * decisions take no lock. */
RATE_API int rate_rules_reload(rate_rules_t *rules, const char *path,
                               char *err, size_t errlen);

/* Tells which rules are in use (what rate_outcome_t.generation names).
 *
 * Returns: the number of the rules in use: 1 after rate_rules_load, one
 * more after each successful reload; 0 for NULL.
 *
 * Errors: none.
 *
 * Ownership: rules is borrowed; nothing is kept.
 *
 * Thread-safe: yes. */
RATE_API uint64_t rate_rules_generation(const rate_rules_t *rules);

/* Frees the rules, every generation of them kept.  NULL: nothing.
 *
 * Returns: nothing.
 *
 * Errors: none.
 *
 * Ownership: rules is freed; outcomes made under them stay valid (they
 * are copies).
 *
 * Thread-safe: no: no call may be using them (no check or reload may run
 * on them). */
RATE_API void rate_rules_free(rate_rules_t *rules);

/* Decides a request on `limiter` under the rules: the key (the user's, an
 * API key, an address; 1..RATE_KEY_MAX bytes) and its attributes pick the
 * policies, each is decided (its reservation up to max_wait_ns; at the
 * limiter's clock, read for each, or at now_ns for rate_rules_check_at),
 * all the request's store requests within one store timeout
 * (rate_deadline_begin), and *out says what each decided.  The limiter's store,
 * fail mode, shadow mode and listener apply to each decision (the
 * listener hears each, a refunded one too).  The limiter's listener must
 * not call rate_rules_check on the same rules (the thread's hold on them
 * is one slot).
 *
 * Returns: RATE_OK with *out filled (allowed or not; a store error is a
 * decision under the fail mode, as for rate_limiter_check).
 *
 * Errors (then nothing is charged, and *out, when not NULL, says no
 * policy applied: count 0, denied_by -1): RATE_EINVAL (NULL rules,
 * limiter or out, NULL attrs with nattrs > 0), RATE_EKEY (a bad key, a
 * key of RATE_KEY_MAX bytes that begins with '@', or a rule's key made
 * from attributes longer than RATE_KEY_MAX, or than the store keeps), RATE_ERANGE (permits or max_wait above
 * RATE_TIME_MAX), RATE_ENOMEM (a thread's first call; a fair rule's
 * first decision on this limiter: its fair table), RATE_EPOLICY (an
 * in-flight policy applies: only rate_rules_acquire holds leases); any
 * other error of rate_limiter_check_policy.
 *
 * Ownership: key, attrs and their strings are read during the call; the
 * outcome is a copy that outlives any reload; the limiter and the rules
 * are borrowed.
 *
 * Thread-safe: yes; no lock (the thread's first call on these rules takes
 * one, once). */
RATE_API int rate_rules_check(rate_rules_t *rules, rate_limiter_t *limiter,
                              const char *key, size_t key_len,
                              const rate_attr_t *attrs, size_t nattrs,
                              uint64_t permits, uint64_t max_wait_ns,
                              rate_outcome_t *out);

/* The same at a caller-supplied time now_ns, as rate_limiter_check_at:
 * every policy is decided, and refunded, at that time.
 *
 * Returns: as rate_rules_check.
 *
 * Errors: as rate_rules_check, and RATE_ERANGE for now_ns above
 * RATE_TIME_MAX.
 *
 * Ownership: as rate_rules_check.
 *
 * Thread-safe: yes. */
RATE_API int rate_rules_check_at(rate_rules_t *rules, rate_limiter_t *limiter,
                                 const char *key, size_t key_len,
                                 const rate_attr_t *attrs, size_t nattrs,
                                 uint64_t permits, uint64_t max_wait_ns,
                                 uint64_t now_ns, rate_outcome_t *out);

/* ------------------------------------------------- in-flight rules */

/* In-flight policies in a rules file (docs/leases.md, "The rules file"):
 * a [policies] entry whose text has a `concurrency N ttl=DUR` clause
 * (rate_inflight_policy_parse's text, rate clauses allowed) holds, for
 * each request a rule gives it to, a lease of the rule's key from the
 * decision until rate_rules_release.  `class = critical`, `class =
 * normal` or `class = ATTRIBUTE` (the request's attribute: "critical"
 * makes it critical, anything else or none normal) in a rule gives the
 * class that may use the policy's reserve=: the first matching rule with
 * a class, in group order, else normal.
 *
 * A held request: what rate_rules_acquire leaves held, for
 * rate_rules_release. */
typedef struct rate_rules_held rate_rules_held_t;

/* Decides a request as rate_rules_check does and, when it is allowed and
 * in-flight policies apply, holds one lease of each (one lease whatever
 * `permits`; an in-flight policy's rate clauses are charged one permit).
 * The leases are kept by the limiter's store (rate_limiter_store) under
 * its clock; a denial by any policy holds nothing and charges nothing.
 * A lease's store failure denies the request (status 503, as a
 * fail-closed store error), whatever the limiter's fail mode.  A reload
 * leaves the leases held valid: each is released where it was taken,
 * and counts against the key's limit of the new rules (a smaller N
 * denies until fewer are held).
 *
 * Returns: RATE_OK with *out filled and *held the leases to release
 * (NULL when none is held: denied, or no in-flight policy applied).
 *
 * Errors: as rate_rules_check (*held NULL); RATE_EINVAL also for a NULL
 * held; RATE_EKEY also for a rule's key longer than RATE_LEASE_KEY_MAX
 * (504) bytes under an in-flight policy; RATE_ENOMEM.
 *
 * Ownership: as rate_rules_check; the caller releases *held exactly once
 * (rate_rules_release), before freeing the rules or the limiter.
 *
 * Thread-safe: yes. */
RATE_API int rate_rules_acquire(rate_rules_t *rules, rate_limiter_t *limiter,
                                const char *key, size_t key_len,
                                const rate_attr_t *attrs, size_t nattrs,
                                uint64_t permits, uint64_t max_wait_ns,
                                rate_outcome_t *out, rate_rules_held_t **held);

/* Releases every lease of a held request and frees it (NULL: nothing),
 * however the request ended.
 *
 * Returns: RATE_OK (NULL: nothing done).
 *
 * Errors: the first lease's error (RATE_EEXPIRED: it expired before the
 * release, its slot given back then; a store's error): the other leases
 * are released all the same, and held is freed in every case.
 *
 * Ownership: held is freed.
 *
 * Thread-safe: yes (any thread; once per held). */
RATE_API int rate_rules_release(rate_rules_held_t *held);

/* The HTTP fields for an outcome, as rate_headers_format for one
 * decision, with one item per policy applied in each RateLimit field
 * (an in-flight policy's concurrency limit: q=N without w, r the leases
 * left, t until the last lease held expires)
 * (a refunded policy's r counts its permits back), status 429 if any
 * denied (503 if the only denials are fail-closed store errors), and
 * Retry-After the longest wait of the denials (none if one can never
 * pass).
 *
 * Returns: RATE_OK with *out filled.
 *
 * Errors: RATE_EINVAL for a NULL outcome or out, an outcome whose count
 * is above RATE_RULES_MAX_APPLY, or (an outcome filled by hand) a
 * policy_name without its NUL or an applied limit the fields would
 * describe that is none (an unknown algorithm or a limit of 0);
 * RATE_ERANGE for fields too long for *out.  *out is zeroed on either (when it is not NULL).
 *
 * Ownership: outcome is read during the call; *out is the caller's;
 * nothing is kept.
 *
 * Thread-safe: yes. */
RATE_API int rate_outcome_headers(const rate_outcome_t *outcome,
                                  rate_headers_t *out);

#ifdef __cplusplus
}
#endif
#endif /* RATELIMIT_HTTP_H */
