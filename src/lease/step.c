/* SPDX-License-Identifier: MIT */
/*
 * The lease step: one pure function over a key's lease state (a 14-byte
 * header, then 24 bytes per lease; docs/leases.md, "Internals").  Every
 * operation first drops the leases expired at the request's time, so an
 * expired lease never counts, whoever last wrote the key.  No clock, no
 * lock, no allocation: a store runs it under its own atomicity, as often
 * as it likes.
 */
#include <string.h>

#include "lease.h"

static uint64_t get64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

static uint32_t get32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
           (uint32_t)p[3] << 24;
}

static void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++, v >>= 8)
        p[i] = (uint8_t)v;
}

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++, v >>= 8)
        p[i] = (uint8_t)v;
}

typedef struct entry {
    uint64_t id, expires;
    uint32_t pid;
    uint8_t cls;
    uint32_t ns; /* the holder's PID namespace, 24 bits (0: unknown) */
} entry_t;

static entry_t entry_at(const uint8_t *state, size_t i)
{
    const uint8_t *e = state + RATE__LEASE_HEADER + i * RATE__LEASE_ENTRY;
    return (entry_t){get64(e), get64(e + 8), get32(e + 16), e[20],
                     get32(e + 20) >> 8};
}

/* The number of entries of a state this library wrote, or -1. */
static long parse(const uint8_t *s, size_t len)
{
    if (len < RATE__LEASE_HEADER || s[13] != RATE__LEASE_FORMAT || s[12] != 0)
        return -1;
    uint32_t n = get32(s + 8);
    if (n > RATE_LEASE_MAX || len != RATE__LEASE_HEADER + (size_t)n * RATE__LEASE_ENTRY)
        return -1;
    for (uint32_t i = 0; i < n; i++) {
        entry_t e = entry_at(s, i);
        if (e.id == 0 || e.cls > RATE_LEASE_CRITICAL)
            return -1;
    }
    return (long)n;
}

static void write_entry(uint8_t *out, size_t i, const entry_t *e)
{
    uint8_t *p = out + RATE__LEASE_HEADER + i * RATE__LEASE_ENTRY;
    put64(p, e->id);
    put64(p + 8, e->expires);
    put32(p + 16, e->pid);
    put32(p + 20, e->ns << 8 | e->cls);
}

/* Restores the min-heap h[0..n) after h[i] grew. */
static void sift_down(uint64_t *h, size_t n, size_t i)
{
    for (;;) {
        size_t l = 2 * i + 1, m = i;
        if (l < n && h[l] < h[m])
            m = l;
        if (l + 1 < n && h[l + 1] < h[m])
            m = l + 1;
        if (m == i)
            return;
        uint64_t t = h[i];
        h[i] = h[m];
        h[m] = t;
        i = m;
    }
}

/* When a class limited to `limit` gets a slot back: the k-th earliest
 * expiry of the held leases, k = held - limit + 1, which is the limit-th
 * latest.  The `limit` latest are kept in a min-heap in scratch, so the
 * room needed is this policy's limit, never the held count (another
 * object with a larger N may have filled the key). */
static uint64_t slot_back(const rate__lease_step_t *a, const uint8_t *out,
                          size_t held, uint64_t limit)
{
    size_t k = held - (size_t)limit + 1;
    uint64_t min = UINT64_MAX;

    if (k == 1 || a->scratch == NULL || a->scratch_cap < limit) {
        for (size_t i = 0; i < held; i++) {
            uint64_t t = entry_at(out, i).expires;
            min = t < min ? t : min;
        }
        return min; /* without room: the earliest, a lower bound */
    }
    uint64_t *h = a->scratch;
    size_t m = (size_t)limit;
    for (size_t i = 0; i < m; i++)
        h[i] = entry_at(out, i).expires;
    for (size_t i = m / 2; i-- > 0;)
        sift_down(h, m, i);
    for (size_t i = m; i < held; i++) {
        uint64_t t = entry_at(out, i).expires;
        if (t > h[0]) {
            h[0] = t;
            sift_down(h, m, 0);
        }
    }
    return h[0];
}

/* Acquire, release or extend over the live entries out[0..n). */
static int apply(rate__lease_step_t *a, uint8_t *out, size_t *n,
                 bool *changed, const uint8_t *old, long old_n)
{
    size_t i;

    switch (a->op) {
    case LEASE_ACQUIRE: {
        uint64_t limit = a->cls == RATE_LEASE_CRITICAL ? a->max
                                                       : a->max - a->reserve;
        if (*n >= limit) {
            a->retry_at = slot_back(a, out, *n, limit);
            return RATE_OK;
        }
        entry_t e = {a->id, a->expires_ns, a->pid, (uint8_t)a->cls,
                     a->ns & 0xffffffu};
        write_entry(out, (*n)++, &e);
        a->granted = *changed = true;
        return RATE_OK;
    }
    case LEASE_RELEASE:
    case LEASE_EXTEND:
        for (i = 0; i < *n && entry_at(out, i).id != a->id; i++)
            ;
        if (i == *n) {
            /* Not live: expired (now or before) or released already. */
            bool was_there = false;
            for (long j = 0; j < old_n; j++)
                was_there |= entry_at(old, (size_t)j).id == a->id;
            return was_there || a->expires_ns <= a->now_ns ? RATE_EEXPIRED
                                                           : RATE_ELEASE;
        }
        if (a->op == LEASE_RELEASE) {
            if (i != *n - 1) /* the last entry takes its place */
                memmove(out + RATE__LEASE_HEADER + i * RATE__LEASE_ENTRY,
                        out + RATE__LEASE_HEADER + (*n - 1) * RATE__LEASE_ENTRY,
                        RATE__LEASE_ENTRY);
            (*n)--;
        } else {
            entry_t e = entry_at(out, i);
            e.expires = a->expires_ns;
            write_entry(out, i, &e);
        }
        *changed = true;
        return RATE_OK;
    case LEASE_REAP:
        for (i = 0; i < *n;) {
            uint64_t id = entry_at(out, i).id;
            bool dead = false;
            for (size_t j = 0; j < a->n_ids; j++)
                dead |= a->ids[j] == id;
            if (!dead) {
                i++;
                continue;
            }
            memmove(out + RATE__LEASE_HEADER + i * RATE__LEASE_ENTRY,
                    out + RATE__LEASE_HEADER + (*n - 1) * RATE__LEASE_ENTRY,
                    RATE__LEASE_ENTRY);
            (*n)--;
            *changed = true;
        }
        return RATE_OK;
    case LEASE_LIST:
        a->n_ids = 0;
        for (i = 0; i < *n && a->n_ids < a->cap; i++) {
            entry_t e = entry_at(out, i);
            if (a->ns == 0 || e.ns != a->ns)
                continue; /* a pid of another namespace, or unknown */
            a->ids[a->n_ids] = e.id;
            a->pids[a->n_ids++] = e.pid;
        }
        return RATE_OK;
    case LEASE_COUNT:
        return RATE_OK;
    }
    return RATE_EINVAL;
}

int rate__lease_step(void *varg, rate_step_io_t *io)
{
    rate__lease_step_t *a = varg;
    const uint8_t *old = io->old_state;
    uint8_t *out = io->new_state;
    long old_n = 0;
    size_t n = 0;
    bool changed = false;
    int rc;

    a->granted = false;
    a->held = a->latest = a->retry_at = 0;
    io->write = false;
    if (old != NULL && (old_n = parse(old, io->old_len)) < 0)
        return RATE_ECORRUPT;
    /* The live entries, copied; an expired one is dropped for good. */
    for (long i = 0; i < old_n; i++) {
        entry_t e = entry_at(old, (size_t)i);
        if (e.expires > a->now_ns)
            write_entry(out, n++, &e);
        else
            changed = true;
    }
    if ((rc = apply(a, out, &n, &changed, old, old_n)) != RATE_OK)
        return rc;
    a->held = n;
    for (size_t i = 0; i < n; i++) {
        uint64_t t = entry_at(out, i).expires;
        a->latest = t > a->latest ? t : a->latest;
    }
    if (!changed)
        return RATE_OK;
    put64(out, a->latest);
    put32(out + 8, (uint32_t)n);
    out[12] = 0;
    out[13] = RATE__LEASE_FORMAT;
    io->new_len = RATE__LEASE_HEADER + n * RATE__LEASE_ENTRY;
    io->write = true;
    io->ttl_ns = a->pin && n > 0           ? RATE_TTL_FOREVER
                 : a->latest > a->now_ns ? a->latest - a->now_ns
                                         : 0;
    return RATE_OK;
}

bool rate__lease_is_cold(void *varg, const void *state, size_t len,
                         uint64_t at_ns)
{
    (void)varg;
    long n = parse(state, len);

    if (n < 0)
        return false; /* not a lease state, or another N's: keep */
    for (long i = 0; i < n; i++)
        if (entry_at(state, (size_t)i).expires > at_ns)
            return false;
    return true;
}
