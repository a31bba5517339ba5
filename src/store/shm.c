/* SPDX-License-Identifier: MIT */
/*
 * The shared-memory store: a fixed-size table in a region that several
 * processes map (docs/shm.md has the layout, the locking and the recovery).
 *
 * In short: a header, then the shards (a robust process-shared mutex, the
 * counters, a free list and the bucket heads of a chained hash table),
 * then the slots, then the policy records.  Only offsets and slot indices
 * are stored, never pointers, so every process may map the region at its
 * own address.  Each slot keeps its key and two copies of its state; a
 * decision writes the idle copy and commits it with one 64-bit store of
 * the slot's commit word (length, which copy, generation), so a process
 * killed at any instruction leaves the key as before or after.  A slot is
 * in use by its `used` byte alone: the chains, the free list and the
 * count are an index over the slots, which a process that finds the lock
 * owner dead (EOWNERDEAD) rebuilds from them before it goes on.
 *
 * Uses only the public store contract (ratelimit_store.h).
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "ratelimit_store.h"
#include "ratelimit_shm.h"

#define SHM_MAGIC "RLSHMv1\0"
#define SHM_LAYOUT 1u
#define HDR_BYTES 4096u  /* the header's page */
#define SHARD_HDR 128u   /* a shard's lock and counters, before its buckets */
#define SLOT_HDR 24u
#define REC_TEXT 1024u   /* the registry's longest policy text */
#define REC_HDR 24u
#define STACK_STATE 1024u
#define KEY_MAX_MAX (RATE_KEY_MAX + 64)
#define STATE_MAX_MAX 262144u
#define DEF_KEY_MAX 64u
#define DEF_STATE_MAX 96u
#define DEF_POLICIES 64u
#define DEF_TIMEOUT_NS (2 * RATE_NS_PER_S)
#define MAX_SHARDS 1024u
#define MAX_BYTES (UINT64_C(64) << 30) /* the largest region: 64 GiB */
#define REC_KEY 4u /* a policy record's key (the registry's id) */
#define WAIT_SLICE_NS UINT64_C(10000000) /* 10 ms: see lock() */
#define SPINS 64u /* tries of a busy lock before sleeping (~40 us) */

enum { READY_NONE = 0, READY_INIT = 1, READY_DONE = 2 };

/* A slot's flags byte. */
enum {
    F_SPACE = 0x03,   /* its key's rate_space_t (state or shadow) */
    F_REF = 0x04,     /* used since the CLOCK hand last passed */
    F_HORIZON = 0x08, /* last written by a request with a horizon */
    F_PIN = 0x10,     /* last written with RATE_TTL_FOREVER: never evicted
                         (reclaimed only once cold) */
};

/* The commit word: bits 0..23 the state's length, bit 24 which copy holds
 * it, bits 32..63 a generation (bumped by every commit). */
#define CW_LEN(w) ((uint32_t)((w)&0xffffffu))
#define CW_WHICH(w) ((unsigned)(((w) >> 24) & 1u))
#define CW_GEN(w) ((w) >> 32)
#define CW_MAKE(gen, which, len)                                           \
    (((uint64_t)(gen) << 32) | ((uint64_t)(which) << 24) | (uint64_t)(len))

/* One load of an index, length or count from the region: checked, then
 * used as loaded (a writer of the file may change it in between; the
 * compiler must not load it again). */
#define READ(x) __atomic_load_n(&(x), __ATOMIC_RELAXED)

/* The region's header: everything another process needs to read it. */
typedef struct shm_hdr {
    char magic[8];
    uint32_t layout;      /* SHM_LAYOUT */
    uint32_t mutex_size;  /* sizeof(pthread_mutex_t) of the maker */
    _Atomic uint32_t ready;
    uint32_t nshards;
    uint64_t total;       /* bytes */
    uint64_t max_keys;
    uint32_t shard_cap;   /* slots per shard */
    uint32_t nbuckets;    /* per shard, a power of two */
    uint32_t key_max, state_max, slot_size;
    uint32_t max_policies, rec_size;
    uint32_t shard_size;
    uint64_t seed;
    uint64_t off_shards, off_slots, off_recs;
    uint64_t endian;      /* 0x0102030405060708 as the maker wrote it */
    _Alignas(64) pthread_mutex_t rec_lock;
    uint64_t rec_recoveries, rec_seq;
} shm_hdr_t;

_Static_assert(sizeof(shm_hdr_t) <= HDR_BYTES, "the header fits its page");

typedef struct shm_shard {
    pthread_mutex_t lock;
    uint32_t count, hand, free_head, pad;
    uint64_t evictions, reclaimed, recoveries, repaired;
} shm_shard_t;

_Static_assert(sizeof(shm_shard_t) <= SHARD_HDR, "a shard's header fits");

typedef struct shm_slot {
    uint32_t next;            /* 1-based slot of the chain or free list */
    uint32_t hash;            /* the low 32 bits of the key's hash */
    _Atomic uint64_t cw;      /* the commit word */
    uint16_t key_len;
    _Atomic uint8_t used;     /* 1: holds a key (the truth; the rest is an
                                 index rebuilt from it) */
    uint8_t flags;
    uint32_t prev;            /* free: the previous free slot (0: none) */
} shm_slot_t;

_Static_assert(sizeof(shm_slot_t) == SLOT_HDR, "a slot's header");

typedef struct shm_rec {
    _Atomic uint32_t used;
    uint16_t key_len;
    uint16_t pad;
    uint32_t len;
    uint32_t pad2;
    uint64_t seq; /* a newer copy of a key wins over an older one */
} shm_rec_t;

_Static_assert(sizeof(shm_rec_t) == REC_HDR, "a record's header");

/* A process's handle on a region. */
typedef struct shm {
    uint8_t *base;
    size_t map_len; /* 0: the caller's region (not unmapped) */
    shm_hdr_t *h;
    uint64_t seed;
    uint32_t nshards, shard_cap, nbuckets, key_max, state_max, slot_size;
    uint32_t key_off, state_off, state_stride;
    uint32_t max_policies, rec_size, shard_size;
    /* The header's offsets, as checked at attach: never read again from
     * the region, which anyone who can write it may change. */
    uint64_t off_shards, off_slots, off_recs, total, max_keys;
    int mutex_kind; /* glibc's type word of the region's mutexes */
    uint64_t timeout_ns;
    size_t prefix_len;
    char *prefix;
    bool created;
} shm_t;

/* The layout options make. */
typedef struct layout {
    uint64_t max_keys, total;
    uint32_t nshards, shard_cap, nbuckets, key_max, state_max, slot_size;
    uint32_t max_policies, rec_size, shard_size;
    uint64_t off_shards, off_slots, off_recs;
} layout_t;

static const rate_store_methods_t shm_methods;

/* ------------------------------------------------------------- errors */

static int fail(char *err, size_t errlen, int rc, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int fail(char *err, size_t errlen, int rc, const char *fmt, ...)
{
    if (err != NULL && errlen > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return rc;
}

/* ------------------------------------------------------------- layout */

static uint64_t round_up(uint64_t x, uint64_t to)
{
    return (x + to - 1) / to * to;
}

static uint32_t pow2_at_least(uint64_t x)
{
    uint32_t n = 1;
    while (n < x)
        n <<= 1;
    return n;
}

/* The layout of options o; RATE_EINVAL with a message if invalid. */
static int make_layout(const rate_shm_options_t *o, layout_t *l, char *err,
                       size_t errlen)
{
    memset(l, 0, sizeof *l);
    if (o->max_keys == 0)
        return fail(err, errlen, RATE_EINVAL,
                    "max_keys is required to make a region (0 given)");
    if (o->max_keys > (uint64_t)INT32_MAX)
        return fail(err, errlen, RATE_EINVAL,
                    "max_keys %llu is above 2^31-1",
                    (unsigned long long)o->max_keys);
    l->key_max = o->key_max ? o->key_max : DEF_KEY_MAX;
    l->state_max = o->state_max ? o->state_max : DEF_STATE_MAX;
    l->max_policies = o->max_policies ? o->max_policies : DEF_POLICIES;
    if (l->key_max > KEY_MAX_MAX)
        return fail(err, errlen, RATE_EINVAL,
                    "key_max %u is above %u", l->key_max, KEY_MAX_MAX);
    if (l->key_max < REC_KEY) /* no policy record would fit: no decision */
        return fail(err, errlen, RATE_EINVAL,
                    "key_max %u is below %u (policy records' keys take %u "
                    "bytes)", l->key_max, REC_KEY, REC_KEY);
    if (l->state_max > STATE_MAX_MAX)
        return fail(err, errlen, RATE_EINVAL,
                    "state_max %u is above %u", l->state_max, STATE_MAX_MAX);
    if (l->state_max < 22)
        return fail(err, errlen, RATE_EINVAL,
                    "state_max %u is below 22 (a single bucket's state)",
                    l->state_max);
    if (l->max_policies > 65536)
        return fail(err, errlen, RATE_EINVAL,
                    "max_policies %u is above 65536", l->max_policies);
    if (o->shards > MAX_SHARDS)
        return fail(err, errlen, RATE_EINVAL, "shards %u is above %u",
                    o->shards, MAX_SHARDS);
    uint32_t n;
    if (o->shards != 0) {
        n = pow2_at_least(o->shards);
        while (n > 1 && n > o->max_keys)
            n >>= 1;
    } else {
        n = 1;
        while (n < 64 && o->max_keys / ((uint64_t)n * 2) >= 256)
            n <<= 1;
    }
    l->max_keys = o->max_keys;
    l->nshards = n;
    /* A shard's share, and room for keys spread unevenly by their hash
     * (three standard deviations and a few more), so that max_keys keys
     * fit before any shard evicts; one shard holds exactly max_keys. */
    uint64_t share = (o->max_keys + n - 1) / n, slack = 0;
    if (n > 1) {
        uint64_t r = 0;
        while ((r + 1) * (r + 1) <= share)
            r++;
        slack = 3 * r + 8;
    }
    l->shard_cap = (uint32_t)(share + slack);
    l->nbuckets = pow2_at_least(l->shard_cap);
    l->shard_size = (uint32_t)round_up(SHARD_HDR + 4ull * l->nbuckets, 64);
    l->slot_size = (uint32_t)round_up(SLOT_HDR + round_up(l->key_max, 8) +
                                          2 * round_up(l->state_max, 8),
                                      8);
    l->rec_size = (uint32_t)round_up(REC_HDR + round_up(l->key_max, 8) +
                                         REC_TEXT,
                                     8);
    l->off_shards = HDR_BYTES;
    l->off_slots = round_up(l->off_shards + (uint64_t)n * l->shard_size, 64);
    l->off_recs = round_up(l->off_slots + (uint64_t)n * l->shard_cap *
                                              l->slot_size,
                           64);
    l->total = round_up(l->off_recs + (uint64_t)l->max_policies * l->rec_size,
                        4096);
    if (l->total > MAX_BYTES || l->total > (uint64_t)SIZE_MAX / 2)
        return fail(err, errlen, RATE_EINVAL,
                    "the region would take %llu bytes, more than a region "
                    "may (%llu, 64 GiB): fewer max_keys, or a smaller "
                    "key_max or state_max",
                    (unsigned long long)l->total,
                    (unsigned long long)MAX_BYTES);
    if (o->prefix != NULL && strlen(o->prefix) + REC_KEY > l->key_max)
        return fail(err, errlen, RATE_EINVAL,
                    "the prefix (%zu bytes) does not fit key_max %u with "
                    "a key (policy records' keys take %u bytes)",
                    strlen(o->prefix), l->key_max, REC_KEY);
    return RATE_OK;
}

static int check_options(const rate_shm_options_t *o, char *err,
                         size_t errlen);

size_t rate_store_shm_size(const rate_shm_options_t *options)
{
    layout_t l;

    if (options == NULL || check_options(options, NULL, 0) != RATE_OK ||
        make_layout(options, &l, NULL, 0) != RATE_OK)
        return 0;
    return (size_t)l.total;
}

size_t rate_store_shm_state_size(const rate_policy_t *policy)
{
    return rate_policy_state_max(policy);
}

/* ------------------------------------------------------------ access */

static inline shm_shard_t *shard_at(const shm_t *m, uint32_t i)
{
    return (shm_shard_t *)(m->base + m->off_shards +
                           (uint64_t)i * m->shard_size);
}

static inline uint32_t *buckets_of(shm_shard_t *s)
{
    return (uint32_t *)((uint8_t *)s + SHARD_HDR);
}

static inline uint32_t shard_index(const shm_t *m, const shm_shard_t *s)
{
    return (uint32_t)(((const uint8_t *)s - (m->base + m->off_shards)) /
                      m->shard_size);
}

/* Slot i (1-based) of shard si: i must have been checked (1..shard_cap)
 * when it was read from the region. */
static inline shm_slot_t *slot_at(const shm_t *m, uint32_t si, uint32_t i)
{
    return (shm_slot_t *)(m->base + m->off_slots +
                          ((uint64_t)si * m->shard_cap + (i - 1)) *
                              m->slot_size);
}

static inline uint8_t *slot_key(const shm_t *m, shm_slot_t *e)
{
    return (uint8_t *)e + m->key_off;
}

static inline uint8_t *slot_copy(const shm_t *m, shm_slot_t *e,
                                 unsigned which)
{
    return (uint8_t *)e + m->state_off + (size_t)which * m->state_stride;
}

static inline shm_rec_t *rec_at(const shm_t *m, uint32_t i)
{
    return (shm_rec_t *)(m->base + m->off_recs + (uint64_t)i * m->rec_size);
}

static inline uint8_t *rec_key(shm_rec_t *r)
{
    return (uint8_t *)r + REC_HDR;
}

static inline uint8_t *rec_text(const shm_t *m, shm_rec_t *r)
{
    return (uint8_t *)r + REC_HDR + round_up(m->key_max, 8);
}

static inline uint64_t key_hash(const shm_t *m, const void *key, size_t len,
                                unsigned space)
{
    return XXH3_64bits_withSeed(key, len, m->seed + space);
}

static inline uint32_t shard_of_hash(const shm_t *m, uint64_t h)
{
    return (uint32_t)(h >> 32) & (m->nshards - 1);
}

/* ------------------------------------------------------------ locking */

static void repair_shard(shm_t *m, shm_shard_t *s);
static void repair_records(shm_t *m);

/* Takes a robust mutex: at once if free, else waiting at most the
 * timeout (on CLOCK_REALTIME, as pthread_mutex_timedlock measures it).  A
 * mutex whose owner died is taken over: `repair` rebuilds what it guards
 * (s, or the records when NULL), then the mutex is made consistent and
 * the recovery counted. */
/* Whether the mutex looks free (a read, no write: waiters that spin on
 * it leave the holder its cache line).  glibc keeps the owner's thread id
 * in __data.__lock; elsewhere, always "try". */
static inline bool looks_free(pthread_mutex_t *mx)
{
#ifdef __GLIBC__
    return __atomic_load_n(&mx->__data.__lock, __ATOMIC_RELAXED) == 0;
#else
    (void)mx;
    return true;
#endif
}

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static int lock(shm_t *m, pthread_mutex_t *mx, shm_shard_t *s)
{
#ifdef __GLIBC__
    /* A mutex of another type than init_mutex() makes (a damaged region)
     * would take glibc's priority paths, which assert on what they find:
     * refused first. */
    if (__builtin_expect(mx->__data.__kind != m->mutex_kind, 0))
        return RATE_ECORRUPT;
#endif
    int r = pthread_mutex_trylock(mx);

    /* A shard is held for a few dozen ns: spin a little (test, then try)
     * before sleeping in the kernel, which costs two system calls. */
    for (unsigned spin = 0, pause = 8; r == EBUSY && spin < SPINS; spin++) {
        for (unsigned i = 0; i < pause; i++)
            cpu_relax();
        if (pause < 256)
            pause *= 2;
        if (looks_free(mx))
            r = pthread_mutex_trylock(mx);
    }
    /* Then sleep, a slice at a time: a wake-up can be lost when a waiter
     * the kernel woke is killed before it takes the lock (docs/shm.md), and
     * the next slice's try finds the lock free. */
    if (r == EBUSY) {
        struct timespec now;
        clock_gettime(CLOCK_REALTIME, &now);
        uint64_t t = (uint64_t)now.tv_sec * RATE_NS_PER_S +
                     (uint64_t)now.tv_nsec;
        uint64_t end = t + m->timeout_ns; /* the whole wait's */
        do {
            uint64_t until = end - t > WAIT_SLICE_NS ? t + WAIT_SLICE_NS
                                                     : end;
            struct timespec ts = {(time_t)(until / RATE_NS_PER_S),
                                  (long)(until % RATE_NS_PER_S)};
            r = pthread_mutex_timedlock(mx, &ts);
            clock_gettime(CLOCK_REALTIME, &now);
            t = (uint64_t)now.tv_sec * RATE_NS_PER_S + (uint64_t)now.tv_nsec;
        } while (r == ETIMEDOUT && t < end);
    }
    if (__builtin_expect(r == 0, 1))
        return RATE_OK;
    if (r == EOWNERDEAD) {
        if (s != NULL) {
            repair_shard(m, s);
            s->recoveries++;
        } else {
            repair_records(m);
            m->h->rec_recoveries++;
        }
        pthread_mutex_consistent(mx);
        return RATE_OK;
    }
    return r == ETIMEDOUT ? RATE_ETIMEDOUT : RATE_ESTORE;
}

static inline void unlock(pthread_mutex_t *mx)
{
    pthread_mutex_unlock(mx);
}

static int init_mutex(pthread_mutex_t *mx)
{
    pthread_mutexattr_t a;
    int rc = pthread_mutexattr_init(&a);

    if (rc == 0) {
        rc = pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
        if (rc == 0)
            rc = pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
        if (rc == 0)
            rc = pthread_mutex_init(mx, &a);
        pthread_mutexattr_destroy(&a);
    }
    return rc == 0 ? RATE_OK : RATE_ESTORE;
}

/* ------------------------------------------------------------- shards */

/* Whether slot e holds a valid key of shard si (for repair and check). */
static bool slot_valid(const shm_t *m, uint32_t si, shm_slot_t *e)
{
    uint64_t w = atomic_load_explicit(&e->cw, memory_order_relaxed);
    unsigned space = e->flags & F_SPACE;
    uint16_t klen = READ(e->key_len);

    if (klen == 0 || klen > m->key_max || CW_LEN(w) > m->state_max ||
        space > RATE_SPACE_SHADOW)
        return false;
    uint64_t h = key_hash(m, slot_key(m, e), klen, space);
    return (uint32_t)h == e->hash && shard_of_hash(m, h) == si;
}

static bool slot_is(const shm_t *m, shm_slot_t *e, uint32_t hash,
                    const void *key, size_t len, unsigned space)
{
    return e->hash == hash && e->key_len == len &&
           (e->flags & F_SPACE) == space &&
           memcmp(slot_key(m, e), key, len) == 0;
}

/* The free list is doubly linked, so that an insert can take the slot it
 * prefers (its home, or one near it) out of the middle.  free_push puts i
 * before `head`, the list's head as the caller read and checked it
 * (0..shard_cap). */
static inline void free_push(const shm_t *m, shm_shard_t *s, uint32_t si,
                             uint32_t i, uint32_t head)
{
    shm_slot_t *e = slot_at(m, si, i);

    e->prev = 0;
    e->next = head;
    if (head != 0)
        slot_at(m, si, head)->prev = i;
    s->free_head = i;
}

/* Takes free slot i off the list; RATE_ECORRUPT, with nothing written,
 * unless both its links are in the shard and link back to it. */
static inline int free_take(const shm_t *m, shm_shard_t *s, uint32_t si,
                            uint32_t i)
{
    shm_slot_t *e = slot_at(m, si, i);
    uint32_t prev = READ(e->prev), next = READ(e->next);

    if (prev > m->shard_cap || next > m->shard_cap ||
        (prev != 0 ? READ(slot_at(m, si, prev)->next) : READ(s->free_head)) !=
            i ||
        (next != 0 && READ(slot_at(m, si, next)->prev) != i))
        return RATE_ECORRUPT;
    if (prev != 0)
        slot_at(m, si, prev)->next = next;
    else
        s->free_head = next;
    if (next != 0)
        slot_at(m, si, next)->prev = prev;
    return RATE_OK;
}

/* A key's home slot in its shard (1-based): where an insert puts it if it
 * is free, so that a lookup finds the key in the slot it fetched beside
 * the bucket's head (one cache miss, not two in a row). */
static inline uint32_t home_of(const shm_t *m, uint32_t hash)
{
    return (uint32_t)(((uint64_t)(hash * 0x9e3779b9u) * m->shard_cap) >> 32) +
           1;
}

/* Rebuilds shard s's index (chains, free list, count, hand) from its
 * slots' `used` bytes, freeing slots that do not hold a valid key. */
static void repair_shard(shm_t *m, shm_shard_t *s)
{
    uint32_t si = shard_index(m, s), *b = buckets_of(s);

    uint32_t free_head = 0;

    memset(b, 0, (size_t)m->nbuckets * 4);
    s->free_head = 0;
    s->count = 0;
    for (uint32_t i = m->shard_cap; i >= 1; i--) {
        shm_slot_t *e = slot_at(m, si, i);
        if (atomic_load_explicit(&e->used, memory_order_relaxed)) {
            bool ok = slot_valid(m, si, e);
            uint16_t klen = READ(e->key_len);
            /* A key twice (which no crash should make): keep the first.
             * The chains are this walk's own, checked all the same. */
            uint32_t j = READ(b[e->hash & (m->nbuckets - 1)]);
            for (uint32_t n = 0; ok && j != 0 && j <= m->shard_cap &&
                                 klen <= m->key_max && n < m->shard_cap;
                 n++, j = READ(slot_at(m, si, j)->next))
                if (slot_is(m, slot_at(m, si, j), e->hash, slot_key(m, e),
                            klen, e->flags & F_SPACE))
                    ok = false;
            if (ok) {
                uint32_t *head = &b[e->hash & (m->nbuckets - 1)];
                e->next = *head;
                *head = i;
                s->count++;
                continue;
            }
            atomic_store_explicit(&e->used, 0, memory_order_release);
            s->repaired++;
        }
        free_push(m, s, si, i, free_head);
        free_head = i;
    }
    if (s->hand >= m->shard_cap)
        s->hand = 0;
}

/* A read prefetch, written out: GCC 12 drops __builtin_prefetch here. */
static inline void prefetch(const void *p)
{
#if defined(__x86_64__) || defined(__i386__)
    __asm__ volatile("prefetcht0 %0" : : "m"(*(const char *)p));
#else
    __builtin_prefetch(p, 0);
#endif
}

/* Starts the key's home slot's cache misses, so that they overlap the
 * bucket head's.  (Before the lock is taken they were slower: the
 * lock's atomic instruction waits for them.) */
static inline void prefetch_key(const shm_t *m, uint32_t si, uint32_t hash)
{
    uint8_t *home = (uint8_t *)slot_at(m, si, home_of(m, hash));

    prefetch(home);
    prefetch(home + m->slot_size - 1);
}

#define DAMAGED UINT32_MAX /* find(): the chain is damaged */

/* The key's slot in shard si (locked), 0, or DAMAGED for a chain that
 * links out of the shard or to a free slot, or is longer than the shard
 * (a cycle): each link is checked before it is followed. */
static inline uint32_t find(const shm_t *m, shm_shard_t *s, uint32_t si,
                            uint32_t hash, const void *key, size_t len,
                            unsigned space)
{
    prefetch_key(m, si, hash);
    uint32_t i = READ(buckets_of(s)[hash & (m->nbuckets - 1)]);

    for (uint32_t n = 0; i != 0; n++) {
        if (__builtin_expect(i > m->shard_cap || n == m->shard_cap, 0))
            return DAMAGED;
        shm_slot_t *e = slot_at(m, si, i);
        if (__builtin_expect(
                !atomic_load_explicit(&e->used, memory_order_relaxed), 0))
            return DAMAGED;
        if (slot_is(m, e, hash, key, len, space))
            return i;
        i = READ(e->next);
    }
    return 0;
}

/* Unlinks slot i (in use), then frees it (used cleared after the unlink:
 * a crash between the two leaves the key, which a repair links again).
 * RATE_ECORRUPT, with nothing written, when its chain does not reach it
 * through links in the shard, or the count or free list's head is out of
 * bounds. */
static int slot_remove(shm_t *m, shm_shard_t *s, uint32_t si, uint32_t i)
{
    shm_slot_t *e = slot_at(m, si, i);
    uint32_t *link = &buckets_of(s)[e->hash & (m->nbuckets - 1)];

    for (uint32_t n = 0, j; (j = READ(*link)) != i; n++) {
        if (j == 0 || j > m->shard_cap || n == m->shard_cap)
            return RATE_ECORRUPT;
        link = &slot_at(m, si, j)->next;
    }
    uint32_t count = READ(s->count), head = READ(s->free_head);
    if (count == 0 || count > m->shard_cap || head > m->shard_cap)
        return RATE_ECORRUPT;
    *link = e->next;
    atomic_store_explicit(&e->used, 0, memory_order_release);
    free_push(m, s, si, i, head);
    s->count = count - 1;
    return RATE_OK;
}

/* A key that may be dropped without changing any answer (as the memory
 * store's expired()): 1 if so, 0 if not, RATE_ECORRUPT for a state
 * longer than state_max. */
static int expired(const shm_t *m, shm_slot_t *e, const rate_step_t *st)
{
    if (st->horizon_ns == 0 || !(e->flags & F_HORIZON) || st->is_cold == NULL)
        return 0;
    uint64_t w = atomic_load_explicit(&e->cw, memory_order_relaxed);
    if (CW_LEN(w) > m->state_max)
        return RATE_ECORRUPT;
    return st->is_cold(st->arg, slot_copy(m, e, CW_WHICH(w)), CW_LEN(w),
                       st->horizon_ns);
}

/* Frees one slot of a full shard: a cold key if the hand meets one, else
 * the first not used since the hand last passed (CLOCK), never a pinned
 * one.  RATE_EFULL when every key is pinned and none cold, RATE_ECORRUPT
 * for a hand out of the shard or a slot it cannot remove. */
static int make_room(shm_t *m, shm_shard_t *s, uint32_t si,
                     const rate_step_t *st)
{
    uint32_t hand = READ(s->hand);

    if (hand >= m->shard_cap)
        return RATE_ECORRUPT;
    for (uint64_t n = 0; n < 3ull * m->shard_cap; n++) {
        uint32_t i = hand + 1;
        shm_slot_t *e = slot_at(m, si, i);
        hand = i == m->shard_cap ? 0 : i;
        s->hand = hand;
        if (!atomic_load_explicit(&e->used, memory_order_relaxed))
            continue;
        int cold = expired(m, e, st), rc;
        if (cold < 0)
            return cold;
        if (cold) {
            if ((rc = slot_remove(m, s, si, i)) == RATE_OK)
                s->reclaimed++;
            return rc;
        }
        if (!(e->flags & (F_REF | F_PIN))) {
            if ((rc = slot_remove(m, s, si, i)) == RATE_OK)
                s->evictions++;
            return rc;
        }
        e->flags &= (uint8_t)~F_REF;
    }
    return RATE_EFULL;
}

/* Inserts a new key with state st[0..len) into shard si (locked). */
static int insert(shm_t *m, shm_shard_t *s, uint32_t si, uint32_t hash,
                  const void *key, size_t len, unsigned space,
                  const void *state, size_t slen, uint8_t flags,
                  const rate_step_t *st)
{
    uint32_t count = READ(s->count);
    int rc;

    if (count > m->shard_cap)
        return RATE_ECORRUPT;
    if (count == m->shard_cap && (rc = make_room(m, s, si, st)) != RATE_OK)
        return rc;
    if (s->free_head == 0 || s->count >= m->shard_cap) {
        repair_shard(m, s); /* an index that lost a slot: rebuild it */
        if (s->free_head == 0)
            return RATE_EFULL;
    }
    /* The key's home if free, else a free slot just after it, else the
     * free list's first. */
    uint32_t i = READ(s->free_head), h = home_of(m, hash);
    if (i == 0 || i > m->shard_cap) /* changed since the repair */
        return RATE_ECORRUPT;
    for (uint32_t k = 0; k < 4; k++, h = h == m->shard_cap ? 1 : h + 1)
        if (!atomic_load_explicit(&slot_at(m, si, h)->used,
                                  memory_order_relaxed)) {
            i = h;
            break;
        }
    shm_slot_t *e = slot_at(m, si, i);
    uint64_t gen = CW_GEN(atomic_load_explicit(&e->cw, memory_order_relaxed));
    /* The free list's head in use: a damaged list (never take a key's
     * slot). */
    if (atomic_load_explicit(&e->used, memory_order_relaxed) ||
        (rc = free_take(m, s, si, i)) != RATE_OK)
        return RATE_ECORRUPT;
    e->hash = hash;
    e->key_len = (uint16_t)len;
    e->flags = (uint8_t)(space | flags);
    memcpy(slot_key(m, e), key, len);
    memcpy(slot_copy(m, e, 0), state, slen);
    atomic_store_explicit(&e->cw, CW_MAKE(gen + 1, 0, slen),
                          memory_order_release);
    uint32_t *head = &buckets_of(s)[hash & (m->nbuckets - 1)];
    e->next = *head;
    atomic_store_explicit(&e->used, 1, memory_order_release);
    *head = i;
    s->count++;
    return RATE_OK;
}

/* Commits new bytes (already in the idle copy) to slot e. */
static inline void commit(shm_slot_t *e, uint64_t w, size_t len)
{
    atomic_store_explicit(&e->cw, CW_MAKE(CW_GEN(w) + 1, CW_WHICH(w) ^ 1u, len),
                          memory_order_release);
}

/* The stored form of a key: the prefix, then the key, in buf. */
static inline int full_key(const shm_t *m, const char *key, size_t len,
                           char *buf, const char **out, size_t *out_len)
{
    if (key == NULL || len == 0 || len > RATE_KEY_MAX ||
        m->prefix_len + len > m->key_max)
        return RATE_EKEY;
    if (m->prefix_len == 0) {
        *out = key;
        *out_len = len;
        return RATE_OK;
    }
    memcpy(buf, m->prefix, m->prefix_len);
    memcpy(buf + m->prefix_len, key, len);
    *out = buf;
    *out_len = m->prefix_len + len;
    return RATE_OK;
}

/* ------------------------------------------------------ policy records */

static uint32_t rec_find(shm_t *m, const void *key, size_t len)
{
    uint32_t best = UINT32_MAX;
    uint64_t seq = 0;

    for (uint32_t i = 0; i < m->max_policies; i++) {
        shm_rec_t *r = rec_at(m, i);
        if (atomic_load_explicit(&r->used, memory_order_acquire) &&
            r->key_len == len && memcmp(rec_key(r), key, len) == 0 &&
            (best == UINT32_MAX || r->seq > seq)) {
            best = i;
            seq = r->seq;
        }
    }
    return best;
}

/* After a dead owner: drops invalid records and the older copy of a key
 * written twice (a rewrite killed between its two stores). */
static void repair_records(shm_t *m)
{
    for (uint32_t i = 0; i < m->max_policies; i++) {
        shm_rec_t *r = rec_at(m, i);
        uint16_t klen = READ(r->key_len);
        if (!atomic_load_explicit(&r->used, memory_order_relaxed))
            continue;
        if (klen == 0 || klen > m->key_max || READ(r->len) > REC_TEXT ||
            rec_find(m, rec_key(r), klen) != i)
            atomic_store_explicit(&r->used, 0, memory_order_release);
    }
}

static int rec_update(shm_t *m, const char *key, size_t len,
                      const rate_step_t *st)
{
    rate_step_io_t io = {0};
    uint8_t stack[2 * REC_TEXT];
    uint8_t *buf = stack;
    int rc = lock(m, &m->h->rec_lock, NULL);

    if (rc != RATE_OK)
        return rc;
    uint32_t at = rec_find(m, key, len);
    shm_rec_t *r = at != UINT32_MAX ? rec_at(m, at) : NULL;
    if (r != NULL) {
        io.old_len = READ(r->len);
        if (io.old_len > REC_TEXT) { /* a damaged length */
            unlock(&m->h->rec_lock);
            return RATE_ECORRUPT;
        }
        io.old_state = rec_text(m, r);
    }
    io.new_cap = io.old_len + st->grow;
    if (io.new_cap > sizeof stack && (buf = malloc(io.new_cap)) == NULL) {
        unlock(&m->h->rec_lock);
        return RATE_ENOMEM;
    }
    io.new_state = buf;
    rc = st->fn(st->arg, &io);
    if (rc == RATE_OK && io.write) {
        uint32_t f = 0;
        while (f < m->max_policies &&
               atomic_load_explicit(&rec_at(m, f)->used, memory_order_relaxed))
            f++;
        if (io.new_len > REC_TEXT || f == m->max_policies) {
            rc = RATE_EFULL;
        } else {
            /* A new copy, then the old one dropped: a crash between leaves
             * both, and the newer wins (rec_find, repair_records). */
            shm_rec_t *n = rec_at(m, f);
            n->key_len = (uint16_t)len;
            n->len = (uint32_t)io.new_len;
            n->seq = ++m->h->rec_seq;
            memcpy(rec_key(n), key, len);
            memcpy(rec_text(m, n), io.new_state, io.new_len);
            atomic_store_explicit(&n->used, 1, memory_order_release);
            if (r != NULL)
                atomic_store_explicit(&r->used, 0, memory_order_release);
        }
    }
    unlock(&m->h->rec_lock);
    if (buf != stack)
        free(buf);
    return rc;
}

static int rec_remove(shm_t *m, const char *key, size_t len)
{
    int rc = lock(m, &m->h->rec_lock, NULL);

    if (rc != RATE_OK)
        return rc;
    uint32_t at;
    while ((at = rec_find(m, key, len)) != UINT32_MAX)
        atomic_store_explicit(&rec_at(m, at)->used, 0, memory_order_release);
    unlock(&m->h->rec_lock);
    return RATE_OK;
}

/* ------------------------------------------------------------- methods */

static int shm_update(void *self, const rate_key_t *k, const rate_step_t *st)
{
    shm_t *m = self;
    char kbuf[KEY_MAX_MAX];
    const char *key;
    size_t len;
    int rc = full_key(m, k->bytes, k->len, kbuf, &key, &len);

    if (rc != RATE_OK)
        return rc;
    if (k->space == RATE_SPACE_POLICY)
        return rec_update(m, key, len, st);
    unsigned space = (unsigned)k->space;
    uint64_t h = key_hash(m, key, len, space);
    uint32_t si = shard_of_hash(m, h), hash = (uint32_t)h;
    shm_shard_t *s = shard_at(m, si);
    if ((rc = lock(m, &s->lock, s)) != RATE_OK)
        return rc;

    uint8_t stack[STACK_STATE];
    uint8_t *heap = NULL;
    rate_step_io_t io = {0};
    uint32_t i = find(m, s, si, hash, key, len, space);
    shm_slot_t *e = i != 0 && i != DAMAGED ? slot_at(m, si, i) : NULL;
    uint64_t w = 0;
    uint8_t *idle = NULL;
    if (e != NULL)
        w = atomic_load_explicit(&e->cw, memory_order_relaxed);
    if (__builtin_expect(i == DAMAGED || CW_LEN(w) > m->state_max, 0)) {
        unlock(&s->lock);
        return RATE_ECORRUPT;
    }
    if (e != NULL) {
        io.old_state = slot_copy(m, e, CW_WHICH(w));
        io.old_len = CW_LEN(w);
        idle = slot_copy(m, e, CW_WHICH(w) ^ 1u);
        e->flags |= F_REF;
    }
    io.new_cap = io.old_len + st->grow;
    if (idle != NULL && io.new_cap <= m->state_max) {
        io.new_state = idle; /* the step writes the idle copy itself */
    } else if (io.new_cap <= sizeof stack) {
        io.new_state = stack;
    } else if ((heap = malloc(io.new_cap)) != NULL) {
        io.new_state = heap;
    } else {
        unlock(&s->lock);
        return RATE_ENOMEM;
    }
    rc = st->fn(st->arg, &io);
    if (rc == RATE_OK && io.write) {
        uint8_t f = (uint8_t)((st->horizon_ns != 0 ? F_HORIZON : 0) |
                              (io.ttl_ns == RATE_TTL_FOREVER ? F_PIN : 0));
        if (io.new_len > m->state_max) {
            rc = RATE_EFULL; /* refused: the key keeps its bytes */
        } else if (e != NULL) {
            if (io.new_state != idle)
                memcpy(idle, io.new_state, io.new_len);
            commit(e, w, io.new_len);
            e->flags = (uint8_t)((e->flags & ~(F_HORIZON | F_PIN)) | f);
        } else {
            rc = insert(m, s, si, hash, key, len, space, io.new_state,
                        io.new_len, f, st);
        }
    }
    unlock(&s->lock);
    free(heap);
    return rc;
}

static int shm_acquire(void *self, const rate_acquire_t *req,
                       const char *kbytes, size_t klen, uint64_t permits,
                       uint64_t now)
{
    shm_t *m = self;
    char kbuf[KEY_MAX_MAX];
    const char *key;
    size_t len;

    if (req->space == RATE_SPACE_POLICY ||
        full_key(m, kbytes, klen, kbuf, &key, &len) != RATE_OK)
        return RATE_ENOTSUP;
    unsigned space = (unsigned)req->space;
    uint64_t h = key_hash(m, key, len, space);
    uint32_t si = shard_of_hash(m, h), hash = (uint32_t)h;
    shm_shard_t *s = shard_at(m, si);
    if (lock(m, &s->lock, s) != RATE_OK)
        return RATE_ENOTSUP;
    uint32_t i = find(m, s, si, hash, key, len, space);
    if (i == 0 || i == DAMAGED) { /* damaged: update() says so */
        unlock(&s->lock);
        return RATE_ENOTSUP;
    }
    shm_slot_t *e = slot_at(m, si, i);
    uint64_t w = atomic_load_explicit(&e->cw, memory_order_relaxed), ttl;
    size_t n = CW_LEN(w);
    if (__builtin_expect(n > m->state_max, 0)) {
        unlock(&s->lock);
        return RATE_ENOTSUP;
    }
    uint8_t *idle = slot_copy(m, e, CW_WHICH(w) ^ 1u);
    /* Decided on a copy in the idle half, committed only if rewritten. */
    memcpy(idle, slot_copy(m, e, CW_WHICH(w)), n);
    int r = rate_state_acquire(req, permits, now, idle, n, &ttl);
    if (r >= 0) {
        uint8_t f = e->flags | F_REF;
        if (r == RATE_ACQUIRE_WROTE) {
            commit(e, w, n);
            f = (uint8_t)((f & ~F_HORIZON) | (req->horizon ? F_HORIZON : 0));
        }
        e->flags = f;
    }
    unlock(&s->lock);
    return r >= 0 ? r & RATE_ACQUIRE_KEPT : RATE_ENOTSUP;
}

static int shm_remove(void *self, const rate_key_t *k)
{
    shm_t *m = self;
    char kbuf[KEY_MAX_MAX];
    const char *key;
    size_t len;
    int rc = full_key(m, k->bytes, k->len, kbuf, &key, &len);

    if (rc != RATE_OK)
        return rc == RATE_EKEY && k->bytes != NULL && k->len > 0 &&
                       k->len <= RATE_KEY_MAX
                   ? RATE_OK /* too long to be held: nothing to forget */
                   : rc;
    if (k->space == RATE_SPACE_POLICY)
        return rec_remove(m, key, len);
    unsigned space = (unsigned)k->space;
    uint64_t h = key_hash(m, key, len, space);
    uint32_t si = shard_of_hash(m, h);
    shm_shard_t *s = shard_at(m, si);
    if ((rc = lock(m, &s->lock, s)) != RATE_OK)
        return rc;
    uint32_t i = find(m, s, si, (uint32_t)h, key, len, space);
    rc = i == DAMAGED ? RATE_ECORRUPT
         : i != 0     ? slot_remove(m, s, si, i)
                      : RATE_OK;
    unlock(&s->lock);
    return rc;
}

static int gather(shm_t *m, rate_shm_info_t *out)
{
    memset(out, 0, sizeof *out);
    out->max_keys = m->max_keys;
    out->capacity = (uint64_t)m->nshards * m->shard_cap;
    out->bytes = m->total;
    out->slot_bytes = m->slot_size + 4ull * m->nbuckets / m->shard_cap +
                      (SHARD_HDR + m->shard_cap - 1) / m->shard_cap;
    out->shards = m->nshards;
    out->key_max = m->key_max;
    out->state_max = m->state_max;
    out->max_policies = m->max_policies;
    out->created = m->created;
    for (uint32_t i = 0; i < m->nshards; i++) {
        shm_shard_t *s = shard_at(m, i);
        int rc = lock(m, &s->lock, s);
        if (rc != RATE_OK)
            return rc;
        if (s->count > m->shard_cap) { /* a damaged count */
            unlock(&s->lock);
            return RATE_ECORRUPT;
        }
        out->keys += s->count;
        out->evictions += s->evictions;
        out->reclaimed += s->reclaimed;
        out->recoveries += s->recoveries;
        out->repaired += s->repaired;
        unlock(&s->lock);
    }
    int rc = lock(m, &m->h->rec_lock, NULL);
    if (rc != RATE_OK)
        return rc;
    out->recoveries += m->h->rec_recoveries;
    for (uint32_t i = 0; i < m->max_policies; i++)
        out->policies +=
            atomic_load_explicit(&rec_at(m, i)->used, memory_order_relaxed);
    unlock(&m->h->rec_lock);
    return RATE_OK;
}

static int shm_stats(void *self, rate_stats_t *out)
{
    rate_shm_info_t info;
    int rc = gather(self, &info);

    memset(out, 0, sizeof *out);
    if (rc != RATE_OK)
        return rc;
    out->keys = info.keys;
    out->evictions = info.evictions;
    out->reclaimed = info.reclaimed;
    out->bytes = info.bytes;
    return RATE_OK;
}

static void shm_destroy(void *self)
{
    shm_t *m = self;

    if (m->map_len != 0)
        munmap(m->base, m->map_len);
    free(m->prefix);
    free(m);
}

/* A policy whose states may pass the region's state_max is refused when
 * it is set, not at the write that would pass it (which still refuses,
 * with RATE_EFULL: shm_update). */
static int shm_check_policy(void *self, const rate_policy_t *policy,
                            size_t max_state, char *err, size_t errlen)
{
    const shm_t *m = self;

    (void)policy;
    if (max_state <= m->state_max)
        return RATE_OK;
    return fail(err, errlen, RATE_EPOLICY,
                "the policy's states take up to %zu bytes, the "
                "shared-memory region keeps at most %u (its state_max)",
                max_state, m->state_max);
}

static const rate_store_methods_t shm_methods = {
    .version = RATE_STORE_VERSION,
    .name = "shm",
    .update = shm_update,
    .acquire = shm_acquire,
    .remove = shm_remove,
    .stats = shm_stats,
    .destroy = shm_destroy,
    .check_policy = shm_check_policy,
};

/* Whether s is a shared-memory store (declared in src/internal.h: this
 * file is built on the public headers alone). */
bool rate__store_is_shm(const rate_store_t *s);
bool rate__store_is_shm(const rate_store_t *s)
{
    return rate_store_backend(s, &shm_methods) != NULL;
}

/* -------------------------------------------------- the public extras */

int rate_store_shm_info(rate_store_t *store, rate_shm_info_t *out)
{
    shm_t *m = store != NULL ? rate_store_backend(store, &shm_methods) : NULL;

    if (m == NULL || out == NULL)
        return RATE_EINVAL;
    return gather(m, out);
}

static int check_shard(shm_t *m, uint32_t si, char *err, size_t errlen)
{
    shm_shard_t *s = shard_at(m, si);
    uint32_t *b = buckets_of(s), linked = 0, used = 0, free_n = 0;

    if (s->hand >= m->shard_cap)
        return fail(err, errlen, RATE_ECORRUPT, "shard %u: hand %u past %u",
                    si, s->hand, m->shard_cap);
    for (uint32_t i = 1; i <= m->shard_cap; i++) {
        shm_slot_t *e = slot_at(m, si, i);
        if (!atomic_load_explicit(&e->used, memory_order_relaxed))
            continue;
        used++;
        if (!slot_valid(m, si, e))
            return fail(err, errlen, RATE_ECORRUPT,
                        "shard %u slot %u: not a valid key (length %u, "
                        "state %u bytes, or not this shard's hash)",
                        si, i, e->key_len, CW_LEN(atomic_load(&e->cw)));
    }
    for (uint32_t bi = 0; bi < m->nbuckets; bi++) {
        uint32_t steps = 0;
        for (uint32_t i = READ(b[bi]); i != 0;
             i = READ(slot_at(m, si, i)->next)) {
            if (i > m->shard_cap || ++steps > m->shard_cap)
                return fail(err, errlen, RATE_ECORRUPT,
                            "shard %u bucket %u: a bad link or a cycle", si,
                            bi);
            shm_slot_t *e = slot_at(m, si, i);
            if (!atomic_load_explicit(&e->used, memory_order_relaxed))
                return fail(err, errlen, RATE_ECORRUPT,
                            "shard %u bucket %u: links free slot %u", si, bi,
                            i);
            if ((e->hash & (m->nbuckets - 1)) != bi)
                return fail(err, errlen, RATE_ECORRUPT,
                            "shard %u slot %u: in bucket %u, not its own",
                            si, i, bi);
            /* The rest of the chain, for the same key: each link checked,
             * and no more steps than the shard has slots (a cycle behind
             * this slot). */
            uint16_t klen = READ(e->key_len);
            uint32_t rest = 0;
            if (klen > m->key_max)
                return fail(err, errlen, RATE_ECORRUPT,
                            "shard %u slot %u: a key of %u bytes", si, i,
                            klen);
            for (uint32_t j = READ(e->next); j != 0;
                 j = READ(slot_at(m, si, j)->next)) {
                if (j > m->shard_cap || ++rest > m->shard_cap)
                    return fail(err, errlen, RATE_ECORRUPT,
                                "shard %u bucket %u: a bad link or a cycle",
                                si, bi);
                if (slot_is(m, slot_at(m, si, j), e->hash, slot_key(m, e),
                            klen, e->flags & F_SPACE))
                    return fail(err, errlen, RATE_ECORRUPT,
                                "shard %u: a key held twice (slots %u, %u)",
                                si, i, j);
            }
            linked++;
        }
    }
    for (uint32_t i = READ(s->free_head), prev = 0; i != 0;
         prev = i, i = READ(slot_at(m, si, i)->next)) {
        if (i > m->shard_cap || ++free_n > m->shard_cap ||
            slot_at(m, si, i)->prev != prev)
            return fail(err, errlen, RATE_ECORRUPT,
                        "shard %u: a bad link or a cycle in the free list",
                        si);
        if (atomic_load_explicit(&slot_at(m, si, i)->used,
                                 memory_order_relaxed))
            return fail(err, errlen, RATE_ECORRUPT,
                        "shard %u: slot %u in use and on the free list", si,
                        i);
    }
    if (linked != used || used != s->count ||
        free_n != m->shard_cap - s->count)
        return fail(err, errlen, RATE_ECORRUPT,
                    "shard %u: %u slots in use, %u linked, count %u, %u "
                    "free of %u",
                    si, used, linked, s->count, free_n, m->shard_cap);
    return RATE_OK;
}

int rate_store_shm_check(rate_store_t *store, char *err, size_t errlen)
{
    shm_t *m = store != NULL ? rate_store_backend(store, &shm_methods) : NULL;
    int rc;

    if (m == NULL)
        return fail(err, errlen, RATE_EINVAL, "not a shared-memory store");
    for (uint32_t si = 0; si < m->nshards; si++) {
        shm_shard_t *s = shard_at(m, si);
        if ((rc = lock(m, &s->lock, s)) != RATE_OK)
            return fail(err, errlen, rc, "shard %u: cannot take its lock%s",
                        si, rc == RATE_ECORRUPT ? " (damaged)" : "");
        rc = check_shard(m, si, err, errlen);
        unlock(&s->lock);
        if (rc != RATE_OK)
            return rc;
    }
    if ((rc = lock(m, &m->h->rec_lock, NULL)) != RATE_OK)
        return fail(err, errlen, rc, "the records: cannot take their lock%s",
                    rc == RATE_ECORRUPT ? " (damaged)" : "");
    for (uint32_t i = 0; i < m->max_policies && rc == RATE_OK; i++) {
        shm_rec_t *r = rec_at(m, i);
        uint16_t klen = READ(r->key_len);
        if (!atomic_load_explicit(&r->used, memory_order_relaxed))
            continue;
        if (klen == 0 || klen > m->key_max || READ(r->len) > REC_TEXT)
            rc = fail(err, errlen, RATE_ECORRUPT,
                      "policy record %u: bad lengths", i);
        else if (rec_find(m, rec_key(r), klen) != i ||
                 r->seq > m->h->rec_seq)
            for (uint32_t j = 0; j < m->max_policies && rc == RATE_OK; j++)
                if (j != i &&
                    atomic_load_explicit(&rec_at(m, j)->used,
                                         memory_order_relaxed) &&
                    rec_at(m, j)->key_len == klen &&
                    memcmp(rec_key(rec_at(m, j)), rec_key(r), klen) == 0)
                    rc = fail(err, errlen, RATE_ECORRUPT,
                              "policy records %u and %u: one key twice", i,
                              j);
    }
    unlock(&m->h->rec_lock);
    return rc;
}

/* Whether a stored key is under the handle's prefix (any key without
 * one: memcmp is not given the NULL prefix). */
static bool has_prefix(const shm_t *m, const uint8_t *key, size_t len)
{
    return m->prefix_len == 0 ||
           (len >= m->prefix_len &&
            memcmp(key, m->prefix, m->prefix_len) == 0);
}

int rate_store_shm_drop(rate_store_t *store)
{
    shm_t *m = store != NULL ? rate_store_backend(store, &shm_methods) : NULL;
    int rc;

    if (m == NULL)
        return RATE_EINVAL;
    int damaged = RATE_OK;
    for (uint32_t si = 0; si < m->nshards; si++) {
        shm_shard_t *s = shard_at(m, si);
        if ((rc = lock(m, &s->lock, s)) != RATE_OK)
            return rc;
        /* A damaged shard keeps what is left of it; the others go on. */
        for (uint32_t i = 1; i <= m->shard_cap && rc == RATE_OK; i++) {
            shm_slot_t *e = slot_at(m, si, i);
            if (atomic_load_explicit(&e->used, memory_order_relaxed) &&
                has_prefix(m, slot_key(m, e), e->key_len))
                rc = slot_remove(m, s, si, i);
        }
        unlock(&s->lock);
        if (rc != RATE_OK)
            damaged = rc;
    }
    if ((rc = lock(m, &m->h->rec_lock, NULL)) != RATE_OK)
        return rc;
    for (uint32_t i = 0; i < m->max_policies; i++) {
        shm_rec_t *r = rec_at(m, i);
        if (atomic_load_explicit(&r->used, memory_order_relaxed) &&
            has_prefix(m, rec_key(r), r->key_len))
            atomic_store_explicit(&r->used, 0, memory_order_release);
    }
    unlock(&m->h->rec_lock);
    return damaged;
}

/* ------------------------------------------------- making, attaching */

#define ENDIAN_MARK UINT64_C(0x0102030405060708)

/* Writes a fresh region of layout l at base (zeroed by the caller or
 * here); the header's ready word is left to the caller. */
static int init_region(uint8_t *base, const layout_t *l, bool zero)
{
    shm_hdr_t *h = (shm_hdr_t *)base;

    if (zero)
        memset(base + sizeof(uint64_t) * 3, 0, l->total - sizeof(uint64_t) * 3);
    h->layout = SHM_LAYOUT;
    h->mutex_size = (uint32_t)sizeof(pthread_mutex_t);
    h->nshards = l->nshards;
    h->total = l->total;
    h->max_keys = l->max_keys;
    h->shard_cap = l->shard_cap;
    h->nbuckets = l->nbuckets;
    h->key_max = l->key_max;
    h->state_max = l->state_max;
    h->slot_size = l->slot_size;
    h->max_policies = l->max_policies;
    h->rec_size = l->rec_size;
    h->shard_size = l->shard_size;
    h->off_shards = l->off_shards;
    h->off_slots = l->off_slots;
    h->off_recs = l->off_recs;
    h->endian = ENDIAN_MARK;
    h->rec_recoveries = 0;
    h->rec_seq = 0;
    if (getrandom(&h->seed, sizeof h->seed, 0) != sizeof h->seed)
        h->seed = rate_clock_monotonic_ns() ^ (uint64_t)getpid() << 32;
    if (init_mutex(&h->rec_lock) != RATE_OK)
        return RATE_ESTORE;
    for (uint32_t si = 0; si < l->nshards; si++) {
        shm_shard_t *s = (shm_shard_t *)(base + l->off_shards +
                                         (uint64_t)si * l->shard_size);
        if (init_mutex(&s->lock) != RATE_OK)
            return RATE_ESTORE;
        s->count = s->hand = 0;
        s->evictions = s->reclaimed = s->recoveries = s->repaired = 0;
        memset((uint8_t *)s + SHARD_HDR, 0, 4ull * l->nbuckets);
        /* The free list: every slot, in order. */
        s->free_head = 1;
        for (uint32_t i = 1; i <= l->shard_cap; i++) {
            shm_slot_t *e = (shm_slot_t *)(base + l->off_slots +
                                           ((uint64_t)si * l->shard_cap + i -
                                            1) * l->slot_size);
            e->next = i < l->shard_cap ? i + 1 : 0;
            e->prev = i - 1;
            atomic_store_explicit(&e->used, 0, memory_order_relaxed);
        }
    }
    for (uint32_t i = 0; i < l->max_policies; i++)
        atomic_store_explicit(
            &((shm_rec_t *)(base + l->off_recs + (uint64_t)i * l->rec_size))
                 ->used,
            0, memory_order_relaxed);
    memcpy(h->magic, SHM_MAGIC, sizeof h->magic);
    return RATE_OK;
}

/* Checks an initialized region of `len` bytes against this build and the
 * options; RATE_OK or an error naming the mismatch.  The header is copied
 * to *snap once and the copy checked: the handle is made from it, so a
 * writer that changes the header meanwhile cannot get past the check. */
static int check_header(const uint8_t *base, size_t len, shm_hdr_t *snap,
                        const rate_shm_options_t *o, const char *what,
                        char *err, size_t errlen)
{
    const shm_hdr_t *h = snap;
    layout_t l;

    if (len < HDR_BYTES)
        return fail(err, errlen, RATE_ESTORE,
                    "%s: %zu bytes, too short to be a ratelimit shm store "
                    "(truncated?)", what, len);
    memcpy(snap, base, sizeof *snap);
    if (memcmp(h->magic, SHM_MAGIC, 6) != 0)
        return fail(err, errlen, RATE_ESTORE,
                    "%s: not a ratelimit shm store (bad magic)", what);
    if (memcmp(h->magic, SHM_MAGIC, sizeof h->magic) != 0 ||
        h->layout != SHM_LAYOUT)
        return fail(err, errlen, RATE_ESTORE,
                    "%s: layout version %u, this library reads %u", what,
                    h->layout, SHM_LAYOUT);
    if (h->endian != ENDIAN_MARK || h->mutex_size != sizeof(pthread_mutex_t))
        return fail(err, errlen, RATE_ESTORE,
                    "%s: made by another build (byte order or a %u-byte "
                    "lock, this build's is %zu)", what, h->mutex_size,
                    sizeof(pthread_mutex_t));
    if (h->total != len)
        return fail(err, errlen, RATE_ESTORE,
                    "%s: the header says %llu bytes, the region has %zu "
                    "(truncated or resized)", what,
                    (unsigned long long)h->total, len);
    rate_shm_options_t ho = {.max_keys = h->max_keys, .shards = h->nshards,
                             .key_max = h->key_max, .state_max = h->state_max,
                             .max_policies = h->max_policies};
    if (make_layout(&ho, &l, NULL, 0) != RATE_OK || l.total != h->total ||
        l.nshards != h->nshards || l.shard_cap != h->shard_cap ||
        l.nbuckets != h->nbuckets || l.slot_size != h->slot_size ||
        l.rec_size != h->rec_size || l.shard_size != h->shard_size ||
        l.off_shards != h->off_shards || l.off_slots != h->off_slots ||
        l.off_recs != h->off_recs)
        return fail(err, errlen, RATE_ESTORE,
                    "%s: the header's sizes do not add up (damaged)", what);
#define SAME(field, name)                                                   \
    if (o->field != 0 && (uint64_t)o->field != (uint64_t)h->field)          \
        return fail(err, errlen, RATE_EINVAL,                                \
                    "%s: " name ": the region has %llu, the options ask "    \
                    "%llu", what, (unsigned long long)h->field,              \
                    (unsigned long long)o->field);
    SAME(max_keys, "max_keys")
    SAME(key_max, "key_max")
    SAME(state_max, "state_max")
    SAME(max_policies, "max_policies")
#undef SAME
    if (o->shards != 0 && l.nshards != h->nshards) {
        layout_t want;
        rate_shm_options_t wo = ho;
        wo.shards = o->shards;
        if (make_layout(&wo, &want, NULL, 0) == RATE_OK &&
            want.nshards != h->nshards)
            return fail(err, errlen, RATE_EINVAL,
                        "%s: shards: the region has %u, the options ask %u",
                        what, h->nshards, want.nshards);
    }
    return RATE_OK;
}

/* A handle on the region at base, its sizes and offsets from h: a copy
 * of its header that check_header() checked, or that this process made
 * (never the live header, which a writer may change meanwhile). */
static int make_handle(uint8_t *base, size_t map_len, const shm_hdr_t *h,
                       const rate_shm_options_t *o, bool created,
                       rate_store_t **out)
{
    shm_t *m = calloc(1, sizeof *m);

    if (m == NULL)
        return RATE_ENOMEM;
    if (o->prefix != NULL && o->prefix[0] != '\0') {
        m->prefix_len = strlen(o->prefix);
        if (m->prefix_len + REC_KEY > h->key_max) {
            free(m);
            return RATE_EINVAL;
        }
        if ((m->prefix = strdup(o->prefix)) == NULL) {
            free(m);
            return RATE_ENOMEM;
        }
    }
    m->base = base;
    m->map_len = map_len;
    m->h = (shm_hdr_t *)base;
    m->seed = h->seed;
    m->nshards = h->nshards;
    m->shard_cap = h->shard_cap;
    m->nbuckets = h->nbuckets;
    m->key_max = h->key_max;
    m->state_max = h->state_max;
    m->slot_size = h->slot_size;
    m->key_off = SLOT_HDR;
    m->state_off = SLOT_HDR + (uint32_t)round_up(h->key_max, 8);
    m->state_stride = (uint32_t)round_up(h->state_max, 8);
    m->max_policies = h->max_policies;
    m->rec_size = h->rec_size;
    m->shard_size = h->shard_size;
    m->off_shards = h->off_shards;
    m->off_slots = h->off_slots;
    m->off_recs = h->off_recs;
    m->total = h->total;
    m->max_keys = h->max_keys;
#ifdef __GLIBC__
    pthread_mutex_t probe;
    if (init_mutex(&probe) != RATE_OK) {
        free(m->prefix);
        free(m);
        return RATE_ENOMEM;
    }
    m->mutex_kind = probe.__data.__kind;
    pthread_mutex_destroy(&probe);
#endif
    m->timeout_ns = o->lock_timeout_ns ? o->lock_timeout_ns : DEF_TIMEOUT_NS;
    m->created = created;
    int rc = rate_store_new(&shm_methods, m, out);
    if (rc != RATE_OK) {
        free(m->prefix);
        free(m);
    }
    return rc;
}

/* make_handle's error, in words: EINVAL is a prefix too long for the
 * region's key_max. */
static int handle_error(char *err, size_t errlen, int rc, const char *what,
                        const rate_shm_options_t *o, uint32_t key_max)
{
    if (rc != RATE_EINVAL)
        return fail(err, errlen, rc, "%s: out of memory", what);
    return fail(err, errlen, rc,
                "%s: the prefix (%zu bytes) does not fit key_max %u with a "
                "key (policy records' keys take %u bytes)",
                what, strlen(o->prefix), key_max, REC_KEY);
}

static int check_options(const rate_shm_options_t *o, char *err,
                         size_t errlen)
{
    for (size_t i = 0; i < sizeof o->reserved / sizeof o->reserved[0]; i++)
        if (o->reserved[i] != 0)
            return fail(err, errlen, RATE_EINVAL, "the options' reserved "
                        "words are not zero (a field of a later version?)");
    if (o->prefix != NULL && strlen(o->prefix) >= KEY_MAX_MAX)
        return fail(err, errlen, RATE_EINVAL, "the prefix is too long");
    if (o->lock_timeout_ns > RATE_TIME_MAX)
        return fail(err, errlen, RATE_EINVAL,
                    "lock_timeout_ns is above RATE_TIME_MAX");
    if (o->mode > 07777)
        return fail(err, errlen, RATE_EINVAL, "mode %o is not a file mode",
                    o->mode);
    return RATE_OK;
}

/* Maps fd (an existing region, len bytes) and attaches. */
static int attach_fd(int fd, const char *path, const rate_shm_options_t *o,
                     rate_store_t **out, char *err, size_t errlen)
{
    struct stat st;

    if (fstat(fd, &st) != 0)
        return fail(err, errlen, RATE_ESTORE, "%s: %s", path,
                    strerror(errno));
    if (!S_ISREG(st.st_mode))
        return fail(err, errlen, RATE_ESTORE,
                    "%s: not a regular file, so not a ratelimit shm store",
                    path);
    size_t len = (size_t)st.st_size;
    if (len < HDR_BYTES)
        return fail(err, errlen, RATE_ESTORE,
                    "%s: %zu bytes, too short to be a ratelimit shm store "
                    "(truncated?)", path, len);
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED)
        return fail(err, errlen, RATE_ESTORE, "%s: cannot map it: %s", path,
                    strerror(errno));
    shm_hdr_t *h = p, snap;
    /* A file is linked only once made: a ready word not "ready" is damage. */
    uint32_t ready = atomic_load_explicit(&h->ready, memory_order_acquire);
    int rc = ready == READY_DONE
                 ? check_header(p, len, &snap, o, path, err, errlen)
                 : memcmp(h->magic, SHM_MAGIC, 6) != 0
                       ? fail(err, errlen, RATE_ESTORE,
                              "%s: not a ratelimit shm store (bad magic)",
                              path)
                       : fail(err, errlen, RATE_ESTORE,
                              "%s: the header is damaged: its ready word is "
                              "%u, not %u (a region file is linked only once "
                              "made); remove it to start again",
                              path, ready, (unsigned)READY_DONE);
    if (rc == RATE_OK &&
        (rc = make_handle(p, len, &snap, o, false, out)) != RATE_OK)
        handle_error(err, errlen, rc, path, o, snap.key_max);
    if (rc != RATE_OK)
        munmap(p, len);
    return rc;
}

/* Gives the new file fd its `total` bytes, allocated now, so that a file
 * system without room is an error here and not a SIGBUS when the mapping
 * is first written: refused at once when statvfs says there is not room,
 * else posix_fallocate (ENOSPC and the rest are errors); only where the
 * file system cannot allocate (EOPNOTSUPP, EINVAL) a sparse ftruncate. */
static int size_file(int fd, const char *path, uint64_t total, char *err,
                     size_t errlen)
{
    struct statvfs vs;

    if (fstatvfs(fd, &vs) == 0 && vs.f_frsize != 0 &&
        total / vs.f_frsize > (uint64_t)vs.f_bavail)
        return fail(err, errlen, RATE_ESTORE,
                    "%s: cannot allocate its %llu bytes: %s (the file "
                    "system has %llu free)", path, (unsigned long long)total,
                    strerror(ENOSPC),
                    (unsigned long long)vs.f_bavail *
                        (unsigned long long)vs.f_frsize);
    int e = posix_fallocate(fd, 0, (off_t)total);
    if (e == EOPNOTSUPP || e == EINVAL)
        e = ftruncate(fd, (off_t)total) == 0 ? 0 : errno;
    if (e != 0)
        return fail(err, errlen, RATE_ESTORE,
                    "%s: cannot allocate its %llu bytes: %s", path,
                    (unsigned long long)total, strerror(e));
    return RATE_OK;
}

/* Makes the region in a temporary file beside path and links it there.
 * RATE_OK with *out; EEXIST in *raced when another process linked first
 * (then the caller attaches to theirs). */
static int create_file(const char *path, const rate_shm_options_t *o,
                       const layout_t *l, rate_store_t **out, bool *raced,
                       char *err, size_t errlen)
{
    size_t n = strlen(path);
    char *tmp = malloc(n + 8);
    int rc;

    *raced = false;
    if (tmp == NULL)
        return fail(err, errlen, RATE_ENOMEM, "out of memory");
    memcpy(tmp, path, n);
    memcpy(tmp + n, ".XXXXXX", 8);
    int fd = mkostemp(tmp, O_CLOEXEC);
    if (fd < 0) {
        rc = fail(err, errlen, RATE_ESTORE, "%s: cannot create it: %s", path,
                  strerror(errno));
        free(tmp);
        return rc;
    }
    void *p = MAP_FAILED;
    if (fchmod(fd, o->mode ? o->mode : 0600) != 0 ||
        (o->set_group && fchown(fd, (uid_t)-1, (gid_t)o->group) != 0)) {
        rc = fail(err, errlen, RATE_ESTORE, "%s: cannot set its %s: %s",
                  path, o->set_group ? "mode or group" : "mode",
                  strerror(errno));
    } else if ((rc = size_file(fd, path, l->total, err, errlen)) !=
               RATE_OK) {
        /* err says why; the temporary file goes below */
    } else if ((p = mmap(NULL, l->total, PROT_READ | PROT_WRITE, MAP_SHARED,
                         fd, 0)) == MAP_FAILED) {
        rc = fail(err, errlen, RATE_ESTORE, "%s: cannot map it: %s", path,
                  strerror(errno));
    } else if ((rc = init_region(p, l, false)) != RATE_OK) {
        fail(err, errlen, rc, "%s: cannot make its locks", path);
    } else {
        atomic_store_explicit(&((shm_hdr_t *)p)->ready, READY_DONE,
                              memory_order_release);
        shm_hdr_t snap; /* as made, before anyone else can write it */
        memcpy(&snap, p, sizeof snap);
        /* Written to the file before it is published. */
        if (link(tmp, path) != 0) {
            if (errno == EEXIST)
                *raced = true;
            rc = fail(err, errlen, RATE_ESTORE, "%s: cannot create it: %s",
                      path, strerror(errno));
        } else if ((rc = make_handle(p, l->total, &snap, o, true, out)) !=
                   RATE_OK) {
            handle_error(err, errlen, rc, path, o, l->key_max);
        } else {
            p = MAP_FAILED; /* the handle's now */
        }
    }
    if (p != MAP_FAILED)
        munmap(p, l->total);
    close(fd);
    unlink(tmp);
    free(tmp);
    return rc;
}

int rate_store_shm_new(const char *path, const rate_shm_options_t *options,
                       rate_store_t **out, char *err, size_t errlen)
{
    rate_shm_options_t o = {0};
    int rc;

    if (out != NULL)
        *out = NULL;
    if (out == NULL || path == NULL || *path == '\0')
        return fail(err, errlen, RATE_EINVAL, "%s",
                    out == NULL    ? "no out (NULL)"
                    : path == NULL ? "no path (NULL)"
                                   : "an empty path");
    if (options != NULL)
        o = *options;
    if ((rc = check_options(&o, err, errlen)) != RATE_OK)
        return rc;
    /* Each retry follows another process's progress (it linked the region
     * first, or removed it as we came), so a few rounds end the race; two
     * were not always enough for four replays on one path under load. */
    for (int attempt = 0; attempt < 8; attempt++) {
        int fd = open(path, O_RDWR | O_CLOEXEC);
        if (fd >= 0) {
            rc = attach_fd(fd, path, &o, out, err, errlen);
            close(fd);
            return rc;
        }
        if (errno != ENOENT || o.no_create)
            return fail(err, errlen, RATE_ESTORE, "%s: cannot open it: %s",
                        path, strerror(errno));
        layout_t l;
        if ((rc = make_layout(&o, &l, err, errlen)) != RATE_OK)
            return rc;
        bool raced;
        rc = create_file(path, &o, &l, out, &raced, err, errlen);
        if (!raced)
            return rc;
    }
    return rc;
}

int rate_store_shm_new_in(void *mem, size_t len,
                          const rate_shm_options_t *options,
                          rate_store_t **out, char *err, size_t errlen)
{
    rate_shm_options_t o = {0};
    int rc;

    if (out != NULL)
        *out = NULL;
    if (out == NULL || mem == NULL)
        return fail(err, errlen, RATE_EINVAL, "%s",
                    out == NULL ? "no out (NULL)" : "no region (NULL)");
    if ((uintptr_t)mem % 64 != 0)
        return fail(err, errlen, RATE_EINVAL,
                    "the region is not 64-byte aligned");
    if (options != NULL)
        o = *options;
    if ((rc = check_options(&o, err, errlen)) != RATE_OK)
        return rc;
    if (len < HDR_BYTES)
        return fail(err, errlen, RATE_EINVAL,
                    "the region's %zu bytes are too few (at least %u)", len,
                    HDR_BYTES);
    shm_hdr_t *h = mem;
    uint32_t expect = READY_NONE;
    bool zero = !o.init && memcmp(h->magic, "\0\0\0\0\0\0\0\0", 8) == 0;
    if (o.init || (zero && atomic_compare_exchange_strong(&h->ready, &expect,
                                                          READY_INIT))) {
        layout_t l;
        if ((rc = make_layout(&o, &l, err, errlen)) != RATE_OK) {
            if (!o.init)
                atomic_store(&h->ready, READY_NONE);
            return rc;
        }
        if (l.total > len) {
            if (!o.init)
                atomic_store(&h->ready, READY_NONE);
            return fail(err, errlen, RATE_EINVAL,
                        "the options need %llu bytes, the region has %zu",
                        (unsigned long long)l.total, len);
        }
        if (o.init)
            atomic_store(&h->ready, READY_INIT);
        memset(h->magic, 0, sizeof h->magic);
        if ((rc = init_region(mem, &l, true)) != RATE_OK)
            return fail(err, errlen, rc, "cannot make the region's locks");
        /* The region is l.total bytes; any rest of len is not used. */
        shm_hdr_t snap;
        memcpy(&snap, h, sizeof snap);
        atomic_store_explicit(&h->ready, READY_DONE, memory_order_release);
        if ((rc = make_handle(mem, 0, &snap, &o, true, out)) != RATE_OK)
            return handle_error(err, errlen, rc, "the region", &o,
                                l.key_max);
        return RATE_OK;
    }
    /* Another initializes it (or has): wait for it, a bounded time. */
    uint64_t limit = o.lock_timeout_ns ? o.lock_timeout_ns : DEF_TIMEOUT_NS;
    uint64_t start = rate_clock_monotonic_ns();
    while (atomic_load_explicit(&h->ready, memory_order_acquire) ==
           READY_INIT) {
        if (rate_clock_monotonic_ns() - start > limit)
            return fail(err, errlen, RATE_ESTORE,
                        "the region is still being initialized after %llu "
                        "ms (its initializer died? initialize it again)",
                        (unsigned long long)(limit / 1000000));
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    if (atomic_load_explicit(&h->ready, memory_order_acquire) != READY_DONE)
        return fail(err, errlen, RATE_ESTORE,
                    memcmp(h->magic, SHM_MAGIC, 6) != 0
                        ? "not a ratelimit shm store (bad magic)"
                        : "a region never finished initializing");
    /* The region may be longer than the store (the caller's zone). */
    size_t used = len;
    if (h->total <= len)
        used = (size_t)h->total;
    shm_hdr_t snap;
    if ((rc = check_header(mem, used, &snap, &o, "the region", err,
                           errlen)) != RATE_OK)
        return rc;
    if ((rc = make_handle(mem, 0, &snap, &o, false, out)) != RATE_OK)
        return handle_error(err, errlen, rc, "the region", &o, snap.key_max);
    return RATE_OK;
}
