/* SPDX-License-Identifier: MIT */
/*
 * The inflight object: leases of keys in a store, through the lease step
 * (step.c) run by the store's update or load + compare-and-set, and the
 * policy's rate limits through a limiter on the same store
 * (docs/leases.md).  The front checks input and reads the clock; the
 * store makes each change atomic; nothing here holds a lock.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "lease.h"
#include "ratelimit_shm.h"

/* Whether the store's lease() takes an acquire's rate limits (version 6,
 * lease_rate; a table before version 6 ends before it). */
static bool lease_rate(const rate_store_t *s)
{
    const rate_store_methods_t *m = rate_store_methods(s);
    return m->version >= 6 && m->lease_rate;
}

/* Lease keys live beside rate states, after a prefix no UTF-8 key has and
 * no caller's key may have (key_reserved). */
static const char PREFIX[RATE_KEY_RESERVED_LEN] = RATE_KEY_RESERVED;

#define SCRATCH_STACK 64u

/* Whether a caller's key lies in the library's own namespace (begins with
 * the lease keys' prefix): refused, so that no call reaches a lease state
 * by its name. */
static bool key_reserved(const char *key, size_t len)
{
    return len >= sizeof PREFIX && memcmp(key, PREFIX, sizeof PREFIX) == 0;
}

struct rate_inflight {
    rate_inflight_policy_t *policy;
    rate_store_t *store, *own_store;
    rate_limiter_t *limiter; /* the rate part's, or NULL */
    rate_clock_t clock;
    bool clock_is_default; /* the library's CLOCK_MONOTONIC */
    bool reap;
    bool pin; /* the store's keys are bounded in number (see pins()) */
    bool host_local; /* a holder's pid can be judged (memory, shm) */
    uint64_t id_base;
    _Atomic uint64_t next_id;
    _Atomic uint64_t reap_after; /* no reaping before (this clock's) time */
};

/* Reaping reads every lease of the key and asks the kernel about each
 * holder: at most once per REAP_EVERY_NS an object, so that a flood of
 * denials (an overloaded server) does not multiply that work. */
#define REAP_EVERY_NS (100 * UINT64_C(1000000))

/* The process's identity, as a lease records it: its pid, its PID
 * namespace (24 bits of the namespace's inode number, 0 when unknown: a
 * pid names a process only there) and a random salt of its lease ids.  A
 * child of fork() gets its own (the atfork handler runs in the child
 * alone, before it has other threads; after unshare(CLONE_NEWPID) the
 * next child is in another namespace), so an object made before fork()
 * gives each process its own pid and ids. */
static _Atomic uint32_t proc_pid;
static _Atomic uint32_t proc_ns;
static _Atomic uint64_t proc_salt;
static pthread_once_t proc_once = PTHREAD_ONCE_INIT;

static uint64_t random64(void)
{
    uint64_t r;
    if (getrandom(&r, sizeof r, GRND_NONBLOCK) != (ssize_t)sizeof r)
        r = rate_clock_monotonic_ns() * UINT64_C(0x9e3779b97f4a7c15) ^
            (uint64_t)getpid() << 32;
    return r;
}

/* This process's PID namespace, as a lease records it: the low 24 bits of
 * the namespace's inode number (0 is taken as 0xffffff), or 0 without
 * /proc (then no lease's pid is judged). */
static uint32_t pid_namespace(void)
{
    struct stat st;
    if (stat("/proc/self/ns/pid", &st) != 0)
        return 0;
    uint32_t ns = (uint32_t)st.st_ino & 0xffffffu;
    return ns != 0 ? ns : 0xffffffu;
}

static void proc_child(void)
{
    atomic_store(&proc_pid, (uint32_t)getpid());
    atomic_store(&proc_ns, pid_namespace());
    atomic_store(&proc_salt, random64());
}

static void proc_init(void)
{
    proc_child();
    (void)pthread_atfork(NULL, NULL, proc_child);
}

static uint32_t my_pid(void)
{
    return atomic_load_explicit(&proc_pid, memory_order_relaxed);
}

/* The PID namespace a lease of this object records: this process's on
 * this host's stores, else 0 (there a pid is never judged). */
static uint32_t my_ns(const rate_inflight_t *in)
{
    return in->host_local
               ? atomic_load_explicit(&proc_ns, memory_order_relaxed)
               : 0;
}

static bool zero_reserve(const uint64_t *r, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (r[i] != 0)
            return false;
    return true;
}

static int make_limiter(rate_inflight_t *in)
{
    rate_limiter_config_t lc = {.policy = in->policy->rate,
                                .store = in->store,
                                .clock = &in->clock};
    return rate_limiter_new(&lc, &in->limiter);
}

/* Whether the store bounds its keys in number, evicting the least used,
 * and keeps no time-to-live (this library's memory and shared-memory
 * stores): there a key with leases held is written with RATE_TTL_FOREVER,
 * a key such a store never evicts, so that it never forgets a held lease.
 * A store that expires keys by their time-to-live (Redis, DynamoDB)
 * keeps a key until its latest lease expires. */
static bool pins(const rate_store_t *s)
{
    const char *name = rate_store_methods(s)->name;
    return name != NULL &&
           (strcmp(name, "memory") == 0 || strcmp(name, "shm") == 0);
}

/* Whether the store keeps a key's states of N leases (14 + 24 N bytes):
 * a shared-memory region keeps at most its state_max, and one too small
 * would refuse a lease past the first few with RATE_EFULL; every other
 * store of the library keeps any. */
static bool leases_fit(rate_store_t *store, const rate_inflight_policy_t *p)
{
    rate_shm_info_t info;
    if (!rate_store_is_host_local(store) ||
        rate_store_shm_info(store, &info) != RATE_OK)
        return true; /* not a region, or one whose lock says so later */
    return rate_inflight_policy_state_max(p) <= info.state_max;
}

int rate_inflight_new(const rate_inflight_config_t *cfg, rate_inflight_t **out)
{
    rate_inflight_t *in;
    int rc;

    if (out == NULL)
        return RATE_EINVAL;
    *out = NULL;
    if (cfg == NULL || cfg->policy == NULL ||
        !zero_reserve(cfg->reserved, sizeof cfg->reserved /
                                         sizeof cfg->reserved[0]) ||
        (cfg->clock != NULL &&
         (cfg->clock->now_ns == NULL || cfg->clock->sleep_ns == NULL)))
        return RATE_EINVAL;
    /* A holder's PID means something only on this host, in this PID
     * namespace: never on a store other hosts share. */
    if (cfg->reap_dead_holders && cfg->store != NULL &&
        !rate_store_is_host_local(cfg->store))
        return RATE_EINVAL;
    if ((in = calloc(1, sizeof *in)) == NULL)
        return RATE_ENOMEM;
    /* One clock per store, whoever calls: CLOCK_MONOTONIC on this host's
     * stores, the wall clock on one that other hosts may share. */
    bool host_local = cfg->store == NULL ||
                      rate_store_is_host_local(cfg->store);
    /* The library's own clock (a limiter's default, handed on by the
     * rules) is the default too. */
    const rate_clock_t *exact = rate_clock_exact();
    bool own = cfg->clock != NULL && cfg->clock->now_ns != exact->now_ns;
    in->clock_is_default = !own && host_local;
    in->host_local = host_local;
    if (own)
        in->clock = *cfg->clock;
    else
        in->clock = host_local ? *exact : *rate_clock_wall();
    in->reap = cfg->reap_dead_holders;
    pthread_once(&proc_once, proc_init);
    in->id_base = random64();
    rc = rate__inflight_policy_copy(cfg->policy, &in->policy);
    in->store = cfg->store;
    if (rc == RATE_OK && in->store == NULL) {
        rc = rate_store_memory_new(NULL, &in->own_store);
        in->store = in->own_store;
    }
    in->pin = rc == RATE_OK && pins(in->store);
    if (rc == RATE_OK && !leases_fit(in->store, in->policy))
        rc = RATE_EPOLICY;
    if (rc == RATE_OK && in->policy->rate != NULL)
        rc = make_limiter(in);
    if (rc != RATE_OK) {
        rate_inflight_free(in);
        return rc;
    }
    *out = in;
    return RATE_OK;
}

void rate_inflight_free(rate_inflight_t *in)
{
    if (in == NULL)
        return;
    rate_limiter_free(in->limiter);
    rate_store_free(in->own_store);
    rate_inflight_policy_free(in->policy);
    free(in);
}

/* FNV-1a of the key: what a lease remembers of it (never 0). */
static uint64_t key_hash(const char *key, size_t len)
{
    uint64_t h = UINT64_C(0xcbf29ce484222325);
    for (size_t i = 0; i < len; i++)
        h = (h ^ (uint8_t)key[i]) * UINT64_C(0x100000001b3);
    return h != 0 ? h : 1;
}

static int check_input(const char *key, size_t len, uint64_t now)
{
    if (key == NULL || len == 0 || len > RATE_LEASE_KEY_MAX ||
        key_reserved(key, len))
        return RATE_EKEY;
    return now > RATE_TIME_MAX ? RATE_ERANGE : RATE_OK;
}

/* The store's lease() (store contract version 5), or RATE_ENOTSUP without
 * one; an acquire with rate limits only to a table that takes them
 * (version 6, lease_rate). */
static int store_lease(const rate_store_t *s, const rate_key_t *k,
                       rate_lease_req_t *q)
{
    const rate_store_methods_t *m = rate_store_methods(s);
    if (m->version < 5 || m->lease == NULL ||
        (q->rate != NULL && !lease_rate(s)))
        return RATE_ENOTSUP;
    return m->lease(rate_store_backend(s, m), k, q);
}

/* The operation by the store's lease() (store contract version 5: one
 * round trip on Redis), or RATE_ENOTSUP when it has none or declines. */
static int run_whole(rate_inflight_t *in, const rate_key_t *k,
                     rate__lease_step_t *a)
{
    static const rate_lease_op_t ops[] = {
        [LEASE_ACQUIRE] = RATE_LEASE_OP_ACQUIRE,
        [LEASE_RELEASE] = RATE_LEASE_OP_RELEASE,
        [LEASE_EXTEND] = RATE_LEASE_OP_EXTEND,
        [LEASE_COUNT] = RATE_LEASE_OP_COUNT};
    if (a->op > LEASE_COUNT) /* listing and reaping: the step's alone */
        return RATE_ENOTSUP;
    rate_lease_req_t q = {.op = ops[a->op], .now_ns = a->now_ns,
                          .max = a->max, .reserve = a->reserve,
                          .critical = a->cls == RATE_LEASE_CRITICAL,
                          .id = a->id, .expires_ns = a->expires_ns,
                          .pid = a->pid};
    int rc = store_lease(in->store, k, &q);
    if (rc == RATE_OK) {
        a->granted = q.granted;
        a->held = q.held;
        a->retry_at = q.retry_at_ns;
        a->latest = q.latest_ns;
    }
    return rc;
}

/* The store key of a key's leases, in buf. */
static rate_key_t lease_key(char buf[sizeof PREFIX + RATE_LEASE_KEY_MAX],
                            const char *key, size_t len)
{
    memcpy(buf, PREFIX, sizeof PREFIX);
    memcpy(buf + sizeof PREFIX, key, len);
    return (rate_key_t){buf, sizeof PREFIX + len, RATE_SPACE_STATE};
}

/* Runs one lease step on the key's lease state. */
static int run(rate_inflight_t *in, const char *key, size_t len,
               rate__lease_step_t *a, bool clock_time)
{
    char buf[sizeof PREFIX + RATE_LEASE_KEY_MAX];
    rate_key_t k = lease_key(buf, key, len);
    rate_step_t st = {rate__lease_step, a,
                      RATE__LEASE_HEADER + RATE__LEASE_ENTRY, a->now_ns,
                      clock_time ? a->now_ns : 0, rate__lease_is_cold};
    a->max = in->policy->max;
    a->reserve = in->policy->reserve;
    a->pin = in->pin;
    int rc = run_whole(in, &k, a);
    if (rc != RATE_ENOTSUP)
        return rc;
    return rate_store_step(in->store, &k, &st);
}

static uint64_t new_id(rate_inflight_t *in)
{
    uint64_t id;
    do
        id = (in->id_base ^ atomic_load_explicit(&proc_salt,
                                                 memory_order_relaxed)) +
             atomic_fetch_add(&in->next_id, 1);
    while (id == 0);
    return id;
}

static bool pid_dead(uint32_t pid)
{
    return pid != 0 && kill((pid_t)pid, 0) != 0 && errno == ESRCH;
}

/* Releases the leases of the key's holders that have died; true when it
 * released any (the caller then acquires again). */
static bool reap(rate_inflight_t *in, const char *key, size_t len,
                 uint64_t now, bool clock_time)
{
    size_t cap = (size_t)in->policy->max;
    uint64_t *ids = malloc(cap * sizeof *ids);
    uint32_t *pids = malloc(cap * sizeof *pids);
    bool any = false;
    rate__lease_step_t a = {.op = LEASE_LIST, .now_ns = now, .ids = ids,
                            .pids = pids, .cap = cap, .ns = my_ns(in)};

    /* Only the holders of this process's PID namespace: elsewhere their
     * pids name other processes here, or none. */
    if (ids != NULL && pids != NULL && a.ns != 0 &&
        run(in, key, len, &a, clock_time) == RATE_OK) {
        size_t dead = 0;
        for (size_t i = 0; i < a.n_ids; i++)
            if (pids[i] != my_pid() && pid_dead(pids[i]))
                ids[dead++] = ids[i];
        rate__lease_step_t r = {.op = LEASE_REAP, .now_ns = now, .ids = ids,
                                .n_ids = dead};
        any = dead > 0 && run(in, key, len, &r, clock_time) == RATE_OK;
    }
    free(ids);
    free(pids);
    return any;
}

static void fill_lease_decision(const rate_inflight_t *in,
                                const rate__lease_step_t *a, uint64_t now,
                                rate_decision_t *out)
{
    uint64_t limit = a->cls == RATE_LEASE_CRITICAL
                         ? in->policy->max
                         : in->policy->max - in->policy->reserve;
    memset(out, 0, sizeof *out);
    out->allowed = a->granted;
    out->reason = a->granted ? RATE_REASON_ALLOWED : RATE_REASON_LIMITED;
    out->component = 0;
    out->limit = limit;
    out->remaining = a->held < limit ? limit - a->held : 0;
    out->retry_after_ns = a->granted ? 0 : a->retry_at - now;
    out->reset_after_ns = a->latest > now ? a->latest - now : 0;
}

/* Whether this object may reap now (and then not for REAP_EVERY_NS). */
static bool reap_due(rate_inflight_t *in, uint64_t now)
{
    uint64_t after = atomic_load(&in->reap_after);
    return now >= after &&
           atomic_compare_exchange_strong(&in->reap_after, &after,
                                          now + REAP_EVERY_NS);
}

/* The lease step of an acquire, with a retry after reaping dead holders. */
static int acquire_lease(rate_inflight_t *in, const char *key, size_t len,
                         rate__lease_step_t *a, bool clock_time)
{
    uint64_t stack[SCRATCH_STACK], *heap = NULL;
    int rc;

    /* A denial names when this class gets a slot back, which may take
     * more than one lease to expire (a reserve, or more leases held than
     * this N by an object of a larger N): room for the limit's expiries. */
    a->scratch = in->policy->max <= SCRATCH_STACK
                     ? stack
                     : (heap = malloc(in->policy->max * sizeof *heap));
    a->scratch_cap = a->scratch != NULL ? (size_t)in->policy->max : 0;
    rc = run(in, key, len, a, clock_time);
    if (rc == RATE_OK && !a->granted && in->reap && reap_due(in, a->now_ns) &&
        reap(in, key, len, a->now_ns, clock_time))
        rc = run(in, key, len, a, clock_time);
    free(heap);
    return rc;
}

/* An admission by the rate limits d beside the lease's decision out: the
 * tighter limit speaks. */
static void merge_rate(rate_decision_t *out, const rate_decision_t *d)
{
    if (d->remaining < out->remaining) {
        out->component = d->component + 1;
        out->limit = d->limit;
        out->remaining = d->remaining;
    }
    if (d->reset_after_ns > out->reset_after_ns)
        out->reset_after_ns = d->reset_after_ns;
}

/* A denial by the rate limits d: the acquire's answer. */
static void rate_denial(rate_decision_t *out, const rate_decision_t *d)
{
    *out = *d;
    out->component = d->component + 1;
}

/* The rate part after a lease was granted; a denial gives the lease back. */
static int rate_part(rate_inflight_t *in, const char *key, size_t len,
                     uint64_t now, bool clock_time, rate_lease_t *lease,
                     rate_decision_t *out)
{
    rate_decision_t d;
    int rc = clock_time ? rate_limiter_check(in->limiter, key, len, 1, 0, &d)
                        : rate_limiter_check_at(in->limiter, key, len, 1, 0,
                                                now, &d);
    if (rc == RATE_OK && d.allowed) {
        merge_rate(out, &d);
        return RATE_OK;
    }
    rate__lease_step_t r = {.op = LEASE_RELEASE, .now_ns = now,
                            .id = lease->id, .expires_ns = lease->expires_ns};
    int rel = run(in, key, len, &r, clock_time);
    memset(lease, 0, sizeof *lease);
    if (rc != RATE_OK)
        return rc;
    rate_denial(out, &d);
    return rel == RATE_OK || rel == RATE_EEXPIRED ? RATE_OK : rel;
}

/* The lease and the rate limits in one operation of the store (lease()
 * with the rate limits, store contract version 6: one round trip on
 * Redis), all or nothing; RATE_ENOTSUP when the store cannot (the lease
 * alone, then the rate limits, make the acquire). */
static int acquire_whole(rate_inflight_t *in, const char *key, size_t len,
                         rate__lease_step_t *a, bool clock_time,
                         rate_lease_t *lease, rate_decision_t *out)
{
    rate_decide_req_t rq;
    rate_decision_t d;
    char buf[sizeof PREFIX + RATE_LEASE_KEY_MAX];

    if (!lease_rate(in->store) ||
        rate_limiter_decide_req(in->limiter, key, len, a->now_ns,
                                clock_time, true, &rq) != RATE_OK)
        return RATE_ENOTSUP;
    rate_key_t lk = lease_key(buf, key, len);
    rate_key_t rk = {key, len, RATE_SPACE_STATE};
    memset(&d, 0, sizeof d);
    rate_lease_req_t q = {.op = RATE_LEASE_OP_ACQUIRE, .now_ns = a->now_ns,
                          .max = in->policy->max,
                          .reserve = in->policy->reserve,
                          .critical = a->cls == RATE_LEASE_CRITICAL,
                          .id = a->id, .expires_ns = a->expires_ns,
                          .pid = a->pid, .rate = &rq, .rate_key = &rk,
                          .rate_out = &d};
    int rc = store_lease(in->store, &lk, &q);
    if (rc != RATE_OK)
        return rc;
    /* Denied by the in-flight limit: dead holders are looked for by the
     * lease alone (acquire_lease), which then decides again. */
    if (!q.granted && !q.rate_decided && in->reap)
        return RATE_ENOTSUP;
    a->granted = q.granted;
    a->held = q.held;
    a->retry_at = q.retry_at_ns;
    a->latest = q.latest_ns;
    fill_lease_decision(in, a, a->now_ns, out);
    if (q.rate_decided && !q.granted)
        rate_denial(out, &d);
    else if (q.granted) {
        *lease = (rate_lease_t){.id = a->id, .expires_ns = a->expires_ns,
                                .key_hash = key_hash(key, len)};
        merge_rate(out, &d);
    }
    return RATE_OK;
}

/* An acquire's failure in *out: a store's error is a denial that names
 * it; a key the store refuses as too long is the caller's, *out zeroed. */
static int acquire_failed(int rc, rate_decision_t *out)
{
    memset(out, 0, sizeof *out);
    if (rc != RATE_EKEY) {
        out->reason = RATE_REASON_STORE_ERROR;
        out->error = rc;
    }
    return rc;
}

static int acquire(rate_inflight_t *in, const char *key, size_t len,
                   rate_lease_class_t cls, uint64_t now, bool clock_time,
                   rate_lease_t *lease, rate_decision_t *out)
{
    int rc;

    if (lease != NULL)
        memset(lease, 0, sizeof *lease);
    if (out != NULL)
        memset(out, 0, sizeof *out);
    if (in == NULL || lease == NULL || out == NULL ||
        (cls != RATE_LEASE_NORMAL && cls != RATE_LEASE_CRITICAL))
        return RATE_EINVAL;
    if ((rc = check_input(key, len, now)) != RATE_OK)
        return rc;
    uint64_t expires = now + in->policy->ttl_ns; /* both below 2^63 */
    rate__lease_step_t a = {.op = LEASE_ACQUIRE, .now_ns = now, .cls = cls,
                            .id = new_id(in), .expires_ns = expires,
                            .pid = my_pid(), .ns = my_ns(in)};
    if (in->limiter != NULL &&
        (rc = acquire_whole(in, key, len, &a, clock_time, lease, out)) !=
            RATE_ENOTSUP)
        return rc != RATE_OK ? acquire_failed(rc, out) : rc;
    if ((rc = acquire_lease(in, key, len, &a, clock_time)) != RATE_OK)
        return acquire_failed(rc, out);
    fill_lease_decision(in, &a, now, out);
    if (!a.granted)
        return RATE_OK;
    *lease = (rate_lease_t){.id = a.id, .expires_ns = expires,
                            .key_hash = key_hash(key, len)};
    return in->limiter != NULL
               ? rate_part(in, key, len, now, clock_time, lease, out)
               : RATE_OK;
}

int rate_inflight_acquire(rate_inflight_t *in, const char *key, size_t len,
                          rate_lease_class_t cls, rate_lease_t *lease,
                          rate_decision_t *out)
{
    uint64_t now = in != NULL ? in->clock.now_ns(in->clock.ud) : 0;
    return acquire(in, key, len, cls, now, in != NULL && in->clock_is_default,
                   lease, out);
}

int rate_inflight_acquire_at(rate_inflight_t *in, const char *key, size_t len,
                             rate_lease_class_t cls, uint64_t now_ns,
                             rate_lease_t *lease, rate_decision_t *out)
{
    return acquire(in, key, len, cls, now_ns, false, lease, out);
}

/* The pauses between a release's or an extend's rounds of conflicts. */
#define CHANGE_PAUSE_MIN_NS UINT64_C(20000)    /* 20 us */
#define CHANGE_PAUSE_MAX_NS UINT64_C(5000000)  /* 5 ms */

/* A release or an extend whose compare-and-sets keep conflicting with
 * other holders' changes (a store without lease()) tries again after a
 * growing, jittered pause, for as long as the lease lives (life_ns from
 * now, measured on CLOCK_MONOTONIC): contention never loses it.  Then
 * RATE_EEXPIRED: its slot came back by its expiry. */
static int run_change(rate_inflight_t *in, const char *key, size_t len,
                      rate__lease_step_t *a, bool clock_time,
                      uint64_t life_ns)
{
    uint64_t start = rate_clock_monotonic_ns(), pause = CHANGE_PAUSE_MIN_NS;
    uint64_t seed = a->id;
    for (;;) {
        int rc = run(in, key, len, a, clock_time);
        if (rc != RATE_ECONFLICT)
            return rc;
        uint64_t spent = rate_clock_monotonic_ns() - start;
        if (spent >= life_ns)
            return RATE_EEXPIRED;
        /* Half the pause, and a random part of the other half, so that
         * the threads that conflicted come back at different times. */
        seed = seed * UINT64_C(6364136223846793005) +
               UINT64_C(1442695040888963407);
        uint64_t wait = pause / 2 + (seed >> 33) % (pause / 2 + 1);
        rate_clock_exact()->sleep_ns(NULL, wait < life_ns - spent
                                               ? wait
                                               : life_ns - spent);
        if (pause < CHANGE_PAUSE_MAX_NS)
            pause *= 2;
    }
}

/* Release or extend: the handle checked, then its step. */
static int change(rate_inflight_t *in, const char *key, size_t len,
                  const rate_lease_t *lease, lease_op_t op, uint64_t expires,
                  uint64_t now, bool clock_time)
{
    int rc;

    if (in == NULL || lease == NULL || lease->id == 0)
        return RATE_EINVAL;
    if ((rc = check_input(key, len, now)) != RATE_OK)
        return rc;
    if (lease->key_hash != key_hash(key, len))
        return RATE_EINVAL; /* granted for another key */
    rate__lease_step_t a = {.op = LEASE_RELEASE, .now_ns = now,
                            .id = lease->id, .expires_ns = lease->expires_ns};
    if (op == LEASE_EXTEND) {
        /* Expired by the handle's own time: no need to ask the store. */
        if (lease->expires_ns <= now)
            return RATE_EEXPIRED;
        a.op = LEASE_EXTEND;
        a.expires_ns = expires;
    }
    return run_change(in, key, len, &a, clock_time,
                      lease->expires_ns > now ? lease->expires_ns - now : 0);
}

static uint64_t now_of(rate_inflight_t *in)
{
    return in != NULL ? in->clock.now_ns(in->clock.ud) : 0;
}

int rate_inflight_release(rate_inflight_t *in, const char *key, size_t len,
                          const rate_lease_t *lease)
{
    return change(in, key, len, lease, LEASE_RELEASE, 0, now_of(in),
                  in != NULL && in->clock_is_default);
}

int rate_inflight_release_at(rate_inflight_t *in, const char *key, size_t len,
                             const rate_lease_t *lease, uint64_t now_ns)
{
    return change(in, key, len, lease, LEASE_RELEASE, 0, now_ns, false);
}

static int extend(rate_inflight_t *in, const char *key, size_t len,
                  rate_lease_t *lease, uint64_t ttl_ns, uint64_t now,
                  bool clock_time)
{
    if (in == NULL || lease == NULL)
        return RATE_EINVAL;
    if (ttl_ns > (UINT64_C(1) << 61) || now > RATE_TIME_MAX)
        return RATE_ERANGE;
    uint64_t expires = now + (ttl_ns != 0 ? ttl_ns : in->policy->ttl_ns);
    int rc = change(in, key, len, lease, LEASE_EXTEND, expires, now,
                    clock_time);
    if (rc == RATE_OK)
        lease->expires_ns = expires;
    return rc;
}

int rate_inflight_extend(rate_inflight_t *in, const char *key, size_t len,
                         rate_lease_t *lease, uint64_t ttl_ns)
{
    return extend(in, key, len, lease, ttl_ns, now_of(in),
                  in != NULL && in->clock_is_default);
}

int rate_inflight_extend_at(rate_inflight_t *in, const char *key, size_t len,
                            rate_lease_t *lease, uint64_t ttl_ns,
                            uint64_t now_ns)
{
    return extend(in, key, len, lease, ttl_ns, now_ns, false);
}

static int held(rate_inflight_t *in, const char *key, size_t len,
                uint64_t now, bool clock_time, uint64_t *out)
{
    int rc;

    if (in == NULL || out == NULL)
        return RATE_EINVAL;
    *out = 0;
    if ((rc = check_input(key, len, now)) != RATE_OK)
        return rc;
    rate__lease_step_t a = {.op = LEASE_COUNT, .now_ns = now};
    if ((rc = run(in, key, len, &a, clock_time)) == RATE_OK)
        *out = a.held;
    return rc;
}

int rate_inflight_held(rate_inflight_t *in, const char *key, size_t len,
                       uint64_t *out)
{
    return held(in, key, len, now_of(in), in != NULL && in->clock_is_default,
                out);
}

int rate_inflight_held_at(rate_inflight_t *in, const char *key, size_t len,
                          uint64_t now_ns, uint64_t *out)
{
    return held(in, key, len, now_ns, false, out);
}

/* ------------------------------------------------ on an event loop */

/* One lease operation through the store's start(): the job first (the
 * store's done() hands it back), then what the operation needs until the
 * callback has run. */
typedef struct lease_job {
    rate_job_t job;
    rate_inflight_t *in;
    rate__lease_step_t a; /* the step (the store's fallback) */
    rate_lease_req_t q;   /* the whole operation (lease()) */
    rate_decide_req_t rq; /* acquire: its rate limits, when q.rate */
    rate_key_t rk;        /* their key (the key's bytes in `key`) */
    rate_decision_t rd;   /* their decision, when q.rate_decided */
    rate_step_t st;
    rate_lease_t lease;   /* acquire: the one granted; else the handle */
    rate_lease_fn cb;
    void *ud;
    bool clock_time;
    rate_decision_t d;    /* acquire: the decision so far */
    int rate_rc;          /* the rate part's code, while giving back */
    char key[sizeof PREFIX + RATE_LEASE_KEY_MAX];
} lease_job_t;

static int start_job(rate_inflight_t *in, const char *key, size_t len,
                     const rate__lease_step_t *a, bool clock_time,
                     const rate_lease_t *lease, rate_lease_fn cb, void *ud,
                     bool whole);

static void job_free(lease_job_t *x)
{
    free(x->a.scratch);
    free(x);
}

/* The lease given back after the rate part denied (or failed): the
 * acquire's answer is the rate part's, as rate_part() makes it. */
static void given_back(void *ud, int rc, const rate_lease_t *lease,
                       const rate_decision_t *unused)
{
    lease_job_t *x = ud;
    (void)lease;
    (void)unused;
    memset(&x->lease, 0, sizeof x->lease);
    if (x->rate_rc == RATE_OK && rc != RATE_OK && rc != RATE_EEXPIRED)
        x->rate_rc = rc; /* the release's own failure is the call's */
    x->cb(x->ud, x->rate_rc, &x->lease, &x->d);
    job_free(x);
}

/* The rate part's decision for a granted lease (rate_part(), through the
 * loop): allowed, the answer; else the lease is released first. */
static void rated(void *ud, int rc, const rate_decision_t *d)
{
    lease_job_t *x = ud;
    if (rc == RATE_OK && d->allowed) {
        merge_rate(&x->d, d);
        x->cb(x->ud, RATE_OK, &x->lease, &x->d);
        job_free(x);
        return;
    }
    x->rate_rc = rc;
    if (rc == RATE_OK) {
        rate_denial(&x->d, d);
    } else {
        memset(&x->d, 0, sizeof x->d);
        x->d.reason = RATE_REASON_STORE_ERROR;
        x->d.error = rc;
    }
    size_t len = x->job.key.len - sizeof PREFIX;
    rate__lease_step_t r = {.op = LEASE_RELEASE, .now_ns = x->a.now_ns,
                            .id = x->lease.id,
                            .expires_ns = x->lease.expires_ns};
    int grc = start_job(x->in, x->key + sizeof PREFIX, len, &r,
                        x->clock_time, &x->lease, given_back, x, false);
    if (grc != RATE_PENDING)
        given_back(x, grc, NULL, NULL);
}

/* After the lease was granted: the rate part, through the limiter's
 * asynchronous call. */
static void rate_part_start(lease_job_t *x)
{
    rate_decision_t d;
    const char *key = x->key + sizeof PREFIX;
    size_t len = x->job.key.len - sizeof PREFIX;
    int rc = x->clock_time
                 ? rate_limiter_check_start(x->in->limiter, key, len, 1, 0,
                                            &d, rated, x)
                 : rate_limiter_check_start_at(x->in->limiter, key, len, 1,
                                               0, x->a.now_ns, &d, rated, x);
    if (rc != RATE_PENDING)
        rated(x, rc, &d); /* answered at once, or refused */
}

/* A release or an extend that the store gave up on for other holders'
 * changes (RATE_ECONFLICT: its compare-and-sets kept losing) is started
 * again at once (no timer to pause on, unlike run_change), for as long as
 * the lease lives: true when it is under way again (x freed); else *rc
 * is the answer, RATE_EEXPIRED once the lease has expired. */
static bool change_again(lease_job_t *x, int *rc)
{
    uint64_t now = x->in->clock.now_ns(x->in->clock.ud);
    if (x->lease.expires_ns <= now) {
        *rc = RATE_EEXPIRED;
        return false;
    }
    rate__lease_step_t a = {.op = x->a.op, .now_ns = now, .id = x->a.id,
                            .expires_ns = x->a.expires_ns};
    int src = start_job(x->in, x->key + sizeof PREFIX,
                        x->job.key.len - sizeof PREFIX, &a, x->clock_time,
                        &x->lease, x->cb, x->ud, false);
    if (src != RATE_PENDING) {
        *rc = src;
        return false;
    }
    job_free(x);
    return true;
}

static void lease_job_done(rate_job_t *job, int rc)
{
    lease_job_t *x = (lease_job_t *)job;
    rate__lease_step_t *a = &x->a;
    rate_decision_t d;

    if (rc == RATE_ENOTSUP && x->q.rate != NULL) {
        /* The store could not decide the rate limits with the lease: the
         * lease alone, then the rate limits, as for a store without. */
        rate__lease_step_t again = *a;
        again.scratch = NULL; /* start_job gives it its own */
        again.scratch_cap = 0;
        rc = start_job(x->in, x->key + sizeof PREFIX,
                       x->job.key.len - sizeof PREFIX, &again, x->clock_time,
                       &x->lease, x->cb, x->ud, false);
        if (rc != RATE_PENDING) {
            memset(&d, 0, sizeof d);
            d.reason = RATE_REASON_STORE_ERROR;
            d.error = rc;
            memset(&x->lease, 0, sizeof x->lease);
            x->cb(x->ud, rc, &x->lease, &d);
        }
        job_free(x);
        return;
    }
    if (rc == RATE_OK && job->lease_made) { /* made whole by the store */
        a->granted = x->q.granted;
        a->held = x->q.held;
        a->retry_at = x->q.retry_at_ns;
        a->latest = x->q.latest_ns;
    }
    memset(&d, 0, sizeof d);
    if (a->op == LEASE_ACQUIRE) {
        if (rc == RATE_OK) {
            fill_lease_decision(x->in, a, a->now_ns, &d);
        } else {
            d.reason = RATE_REASON_STORE_ERROR;
            d.error = rc;
        }
        if (rc == RATE_OK && job->lease_made && x->q.rate_decided) {
            /* the rate limits decided with the lease, all or nothing */
            if (a->granted)
                merge_rate(&d, &x->rd);
            else
                rate_denial(&d, &x->rd);
        }
        if (rc != RATE_OK || !a->granted)
            memset(&x->lease, 0, sizeof x->lease);
        if (rc == RATE_OK && a->granted && x->in->limiter != NULL &&
            !(job->lease_made && x->q.rate_decided)) {
            x->d = d;
            rate_part_start(x);
            return;
        }
        x->cb(x->ud, rc, &x->lease, &d);
    } else {
        if (rc == RATE_ECONFLICT && change_again(x, &rc))
            return;
        if (rc == RATE_OK && a->op == LEASE_EXTEND)
            x->lease.expires_ns = a->expires_ns;
        x->cb(x->ud, rc, &x->lease, NULL);
    }
    job_free(x);
}

/* Starts the step a on the key through the store's start(): RATE_PENDING,
 * or the store's refusal (nothing started).  whole: an acquire asks the
 * store for the rate limits too, when it takes them (lease_rate). */
static int start_job(rate_inflight_t *in, const char *key, size_t len,
                     const rate__lease_step_t *a, bool clock_time,
                     const rate_lease_t *lease, rate_lease_fn cb, void *ud,
                     bool whole)
{
    static const rate_lease_op_t ops[] = {
        [LEASE_ACQUIRE] = RATE_LEASE_OP_ACQUIRE,
        [LEASE_RELEASE] = RATE_LEASE_OP_RELEASE,
        [LEASE_EXTEND] = RATE_LEASE_OP_EXTEND,
        [LEASE_COUNT] = RATE_LEASE_OP_COUNT};
    lease_job_t *x = calloc(1, sizeof *x);
    if (x == NULL)
        return RATE_ENOMEM;
    x->in = in;
    x->cb = cb;
    x->ud = ud;
    x->clock_time = clock_time;
    x->lease = *lease;
    x->a = *a;
    x->a.max = in->policy->max;
    x->a.reserve = in->policy->reserve;
    x->a.pin = in->pin;
    /* The step's fallback needs room for the limit's expiries, as
     * acquire_lease gives it. */
    if (a->op == LEASE_ACQUIRE &&
        (x->a.scratch = malloc(in->policy->max * sizeof *x->a.scratch)) !=
            NULL)
        x->a.scratch_cap = (size_t)in->policy->max;
    x->q = (rate_lease_req_t){.op = ops[a->op], .now_ns = a->now_ns,
                              .max = x->a.max, .reserve = x->a.reserve,
                              .critical = a->cls == RATE_LEASE_CRITICAL,
                              .id = a->id, .expires_ns = a->expires_ns,
                              .pid = a->pid};
    x->st = (rate_step_t){rate__lease_step, &x->a,
                          RATE__LEASE_HEADER + RATE__LEASE_ENTRY, a->now_ns,
                          clock_time ? a->now_ns : 0, rate__lease_is_cold};
    memcpy(x->key, PREFIX, sizeof PREFIX);
    memcpy(x->key + sizeof PREFIX, key, len);
    x->rk = (rate_key_t){x->key + sizeof PREFIX, len, RATE_SPACE_STATE};
    if (whole && a->op == LEASE_ACQUIRE && in->limiter != NULL &&
        lease_rate(in->store) &&
        /* never waiting on the loop for the policy's record: until the
         * limiter has written it (through the loop), the two steps */
        rate_limiter_decide_req(in->limiter, key, len, a->now_ns,
                                clock_time, false, &x->rq) == RATE_OK) {
        x->q.rate = &x->rq;
        x->q.rate_key = &x->rk;
        x->q.rate_out = &x->rd;
    }
    const rate_store_methods_t *m = rate_store_methods(in->store);
    void *self = rate_store_backend(in->store, m);
    x->job = (rate_job_t){{x->key, sizeof PREFIX + len, RATE_SPACE_STATE},
                          &x->st, NULL, NULL, lease_job_done, x,
                          m->version >= 5 ? &x->q : NULL, false};
    int rc = m->start(self, &x->job);
    if (rc == RATE_ENOTSUP && x->q.rate != NULL) {
        /* not for these rate limits: the lease alone */
        x->q.rate = NULL;
        x->q.rate_key = NULL;
        x->q.rate_out = NULL;
        rc = m->start(self, &x->job);
    }
    if (rc != RATE_OK) {
        free(x->a.scratch);
        free(x);
        return rc;
    }
    return RATE_PENDING;
}

int rate_inflight_acquire_start(rate_inflight_t *in, const char *key,
                                size_t len, rate_lease_class_t cls,
                                rate_lease_t *lease, rate_decision_t *out,
                                rate_lease_fn cb, void *ud)
{
    int rc;

    if (lease != NULL)
        memset(lease, 0, sizeof *lease);
    if (out != NULL)
        memset(out, 0, sizeof *out);
    if (in == NULL || lease == NULL || out == NULL || cb == NULL ||
        (cls != RATE_LEASE_NORMAL && cls != RATE_LEASE_CRITICAL))
        return RATE_EINVAL;
    if (rate_store_methods(in->store)->start == NULL) /* a store that answers at once */
        return rate_inflight_acquire(in, key, len, cls, lease, out);
    uint64_t now = in->clock.now_ns(in->clock.ud);
    if ((rc = check_input(key, len, now)) != RATE_OK)
        return rc;
    rate__lease_step_t a = {.op = LEASE_ACQUIRE, .now_ns = now, .cls = cls,
                            .id = new_id(in),
                            .expires_ns = now + in->policy->ttl_ns,
                            .pid = my_pid(), .ns = my_ns(in)};
    rate_lease_t granted = {.id = a.id, .expires_ns = a.expires_ns,
                            .key_hash = key_hash(key, len)};
    rc = start_job(in, key, len, &a, in->clock_is_default, &granted, cb, ud,
                   true);
    return rc != RATE_PENDING ? acquire_failed(rc, out) : rc;
}

/* Release or extend: the handle checked as change() checks it. */
static int change_start(rate_inflight_t *in, const char *key, size_t len,
                        const rate_lease_t *lease, lease_op_t op,
                        uint64_t ttl_ns, rate_lease_fn cb, void *ud)
{
    int rc;

    if (in == NULL || lease == NULL || lease->id == 0 || cb == NULL)
        return RATE_EINVAL;
    uint64_t now = in->clock.now_ns(in->clock.ud);
    if (op == LEASE_EXTEND && ttl_ns > (UINT64_C(1) << 61))
        return RATE_ERANGE;
    if ((rc = check_input(key, len, now)) != RATE_OK)
        return rc;
    if (lease->key_hash != key_hash(key, len))
        return RATE_EINVAL; /* granted for another key */
    rate__lease_step_t a = {.op = op, .now_ns = now, .id = lease->id,
                            .expires_ns = lease->expires_ns};
    if (op == LEASE_EXTEND) {
        if (lease->expires_ns <= now)
            return RATE_EEXPIRED; /* by the handle's own time */
        a.expires_ns = now + (ttl_ns != 0 ? ttl_ns : in->policy->ttl_ns);
    }
    return start_job(in, key, len, &a, in->clock_is_default, lease, cb, ud,
                     false);
}

int rate_inflight_release_start(rate_inflight_t *in, const char *key,
                                size_t len, const rate_lease_t *lease,
                                rate_lease_fn cb, void *ud)
{
    if (in != NULL && cb != NULL && rate_store_methods(in->store)->start == NULL)
        return rate_inflight_release(in, key, len, lease);
    return change_start(in, key, len, lease, LEASE_RELEASE, 0, cb, ud);
}

int rate_inflight_extend_start(rate_inflight_t *in, const char *key,
                               size_t len, rate_lease_t *lease,
                               uint64_t ttl_ns, rate_lease_fn cb, void *ud)
{
    if (in != NULL && cb != NULL && rate_store_methods(in->store)->start == NULL)
        return rate_inflight_extend(in, key, len, lease, ttl_ns);
    return change_start(in, key, len, lease, LEASE_EXTEND, ttl_ns, cb, ud);
}
