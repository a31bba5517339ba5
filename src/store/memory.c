/* SPDX-License-Identifier: MIT */
/*
 * The in-memory store: the embedded default.
 *
 * The table is split into a power-of-two number of shards by the key's hash;
 * each shard is an open-addressing table (linear probing, backward-shift
 * deletion, no tombstones) behind its own spin lock.  The lock is held only
 * while the step runs over one key, a few dozen nanoseconds, so threads on
 * different keys almost never meet and no lock covers the whole table.
 *
 * A slot is 40 bytes and holds short keys (<= 16 bytes) and small states
 * (<= 22 bytes: every single-limit bucket or fixed window) inline, so a hit
 * on such a key touches one cache line and allocates nothing.  Longer keys
 * and states (sliding logs, composite policies) live in a heap block that is
 * reused and grown geometrically.
 *
 * Bounded memory.  With max_keys the store holds at most that many keys
 * (one count for the whole store), and a new key past it first takes the
 * place of a key in its shard whose state is back at its cold start (asked
 * of the step, at the request's horizon only: a caller-supplied time with
 * no low-water mark never drops another key), then evicts by CLOCK (second
 * chance), an approximation of least-recently-used that needs one bit per
 * key.  Evictions are counted: they may change later answers.  A key last
 * written with RATE_TTL_FOREVER (a key with leases held) is never evicted,
 * only reclaimed once cold; with nothing else to drop a new key is refused
 * (RATE_EFULL).  Keys whose reset has passed are also dropped when an
 * unbounded shard grows.
 *
 * The bool calls' acquire() decides a key the store holds where its state
 * lies, with rate_state_acquire(); it declines everything else, untouched.
 *
 * Keys of the shadow space share the table, told apart by a bit of the
 * slot and by their hash; the library's policy records (RATE_SPACE_POLICY,
 * kept forever and never evicted) live in a short list of their own.
 *
 * Keys are hashed with XXH3 (libxxhash), seeded per store from getrandom()
 * so that clients cannot aim many keys at one shard.
 *
 * Uses only the public store contract (ratelimit_store.h), as src/store/shm.c
 * does: the decisions, the token bucket's fast pass included, are the
 * library's, reached through rate_state_acquire() and the steps it hands
 * over.
 */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "ratelimit_store.h"

#if defined(__GNUC__)
#define FLATTEN __attribute__((flatten))
#define ALWAYS_INLINE inline __attribute__((always_inline))
#else
#define FLATTEN
#define ALWAYS_INLINE inline
#endif

#define KEY_INLINE 16u
/* A single bucket or fixed window: the 14-byte header and one 8-byte
 * component of the stored format (docs/algorithms.md, "Stored state"). */
#define STATE_INLINE 22u
#define STACK_STATE 512u
/* Grow past 10/11 full: a bounded store sized for a million keys then
 * holds one in 47.3 bytes (a slot and its control byte at 87% load, with
 * the shards' slack; 0.2 more for each shard that outgrows it), at about
 * 4 probes a hit. */
#define LOAD_NUM 10u
#define LOAD_DEN 11u
/* An unbounded shard's first size (it doubles from there): the slots of
 * 8 keys at 7/8 load, as before the load above was raised, so that the
 * sizes it grows through stay as they were. */
#define INITIAL_SLOTS 10u
#define BACKOFF_MIN 128u /* pauses (about 20 ns each on our machines) */
#define BACKOFF_MAX 2048u /* so a waiter looks again at least every ~40 us */

/* A slot's two flag bytes. */
enum {
    KEY_LEN = 0x1f,      /* kf: an inline key's length */
    F_KEY_HEAP = 0x20,   /* kf: the key is in a heap block */
    F_STATE_HEAP = 0x40, /* kf: the state is in a heap block */
    F_HORIZON = 0x80,    /* kf: last written by a request with a horizon
                            (rate_step_t.horizon_ns) */
    STATE_LEN = 0x1f,    /* sr: an inline state's length */
    F_SHADOW = 0x20,     /* sr: a key of the shadow space */
    F_PIN = 0x40,        /* sr: last written with RATE_TTL_FOREVER: never
                            evicted (reclaimed only once cold) */
    F_REF = 0x80,        /* sr: used since the CLOCK hand last passed */
};

/* 40 bytes.  Whether a slot is in use, and 7 bits of its key's hash, are in
 * the shard's control bytes; the hash itself is not kept (it is computed
 * again from the key on the rare paths that need it: a removal's backward
 * shift and a rehash).  A heap state keeps its pointer, length and capacity
 * in the inline bytes, read and written with memcpy. */
typedef struct slot {
    union {
        char inl[KEY_INLINE]; /* zero-padded */
        struct {
            char *ptr;
            uint32_t len;
            char prefix[4];
        } heap;
    } key;
    uint8_t state[STATE_INLINE];
    uint8_t kf, sr;
} slot_t;

_Static_assert(sizeof(slot_t) == 40, "a slot is 40 bytes");

typedef struct heap_state {
    uint8_t *ptr;
    uint32_t len, cap;
} heap_state_t;

_Static_assert(sizeof(heap_state_t) <= STATE_INLINE, "fits a slot");

static inline heap_state_t heap_get(const slot_t *e)
{
    heap_state_t h;
    memcpy(&h, e->state, sizeof h);
    return h;
}

static inline void heap_put(slot_t *e, heap_state_t h)
{
    memcpy(e->state, &h, sizeof h);
}

typedef struct shard {
    _Alignas(64) atomic_int lock;
    atomic_int starving; /* waiters that waited the longest backoff */
    uint32_t count, cap, hand;
    XXH64_hash_t seed; /* the store's */
    struct memstore *store;
    uint8_t *ctrl; /* one byte per slot: 0 empty, else 0x80 | 7 hash bits */
    slot_t *slots;
    uint8_t *scratch;
    size_t scratch_cap;
    uint64_t heap_bytes;
    uint64_t evictions, reclaimed;
} shard_t;

/* A policy record (RATE_SPACE_POLICY). */
typedef struct record {
    struct record *next;
    size_t key_len, len;
    char key[8];
    uint8_t *bytes;
} record_t;

typedef struct memstore {
    XXH64_hash_t seed;
    unsigned shift; /* 63 - log2(shards): a hash's shard is (h >> 1) >> shift,
                       0 when there is one */
    unsigned nshards;
    shard_t *shards;
    uint64_t max_keys;          /* 0: unbounded */
    atomic_uint_fast64_t nkeys; /* keys held, counted against max_keys */
    pthread_mutex_t records_lock;
    record_t *records;
} memstore_t;

/* --------------------------------------------------------------- bytes */

/* Little-endian loads and stores, whatever the alignment: how a probe packs
 * a short key (see probe_key_init). */
static inline uint64_t le64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, sizeof v);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap64(v);
#endif
    return v;
}

static inline uint32_t le32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, sizeof v);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap32(v);
#endif
    return v;
}

static inline void put_le64(uint8_t *p, uint64_t v)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap64(v);
#endif
    memcpy(p, &v, sizeof v);
}

/* ------------------------------------------------------------- locking */

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* Test-and-test-and-set with exponential backoff: a thread that finds the
 * lock taken waits a while without touching its cache line, so the holder
 * keeps the line (and the key's slot) in its own cache for its next
 * decisions instead of losing it to every spinning reader.  Two threads
 * hammering one key then decide about as many times a second together as
 * one alone (without backoff: a quarter as many).  The price would be
 * fairness: a waiter may sit out several of the holder's decisions.  So a
 * waiter that has backed off to the longest wait (~40 us) declares itself
 * starving; while any thread is, no one takes the lock but the starving
 * (trylock fails at once), so the holder cannot keep taking it back and
 * every waiter gets it within a bounded number of hand-overs.  The wait is
 * out of line, so that an uncontended lock costs the hot path one load and
 * one exchange and none of the registers the wait would need. */
static bool take(shard_t *s)
{
    return !atomic_load_explicit(&s->lock, memory_order_relaxed) &&
           !atomic_exchange_explicit(&s->lock, 1, memory_order_acquire);
}

static __attribute__((noinline, cold)) void shard_lock_wait(shard_t *s)
{
    unsigned backoff = BACKOFF_MIN;

    for (;;) {
        for (unsigned i = 0; i < backoff; i++)
            cpu_relax();
        if (atomic_load_explicit(&s->starving, memory_order_relaxed) == 0 &&
            take(s))
            return;
        if (backoff < BACKOFF_MAX)
            backoff *= 2;
        else
            break;
    }
    atomic_fetch_add_explicit(&s->starving, 1, memory_order_relaxed);
    for (unsigned spins = 0; !take(s); spins++) {
        cpu_relax();
        if (spins % 1024 == 1023)
            sched_yield(); /* the holder may have been preempted */
    }
    atomic_fetch_sub_explicit(&s->starving, 1, memory_order_relaxed);
}

/* Takes the lock if it is free and no waiter is starving, at once; false
 * otherwise.  Looks before it exchanges, as take() does: a failed exchange
 * would take the line (and with it the lock) from the holder. */
static inline bool shard_trylock(shard_t *s)
{
    return __builtin_expect(
        atomic_load_explicit(&s->starving, memory_order_relaxed) == 0 &&
            take(s),
        1);
}

static inline void shard_lock(shard_t *s)
{
    if (!shard_trylock(s))
        shard_lock_wait(s);
}

static inline void shard_unlock(shard_t *s)
{
    atomic_store_explicit(&s->lock, 0, memory_order_release);
}

/* --------------------------------------------------------------- slots */

static inline uint32_t tag_of(uint64_t h)
{
    return (uint32_t)h | 1u;
}

static inline uint32_t home(const shard_t *s, uint32_t tag)
{
    return (uint32_t)(((uint64_t)tag * s->cap) >> 32);
}

static inline uint32_t next(const shard_t *s, uint32_t i)
{
    return i + 1 == s->cap ? 0 : i + 1;
}

/* The control byte: 7 bits of the tag that the home slot does not use
 * (home takes the high bits), so a probe reads one byte per slot and
 * touches a slot's cache line only on a likely match. */
static inline uint8_t ctrl_of(uint32_t tag)
{
    return (uint8_t)(0x80u | ((tag >> 1) & 0x7fu));
}

static inline size_t key_len(const slot_t *e)
{
    return e->kf & F_KEY_HEAP ? e->key.heap.len : (size_t)(e->kf & KEY_LEN);
}

static inline const char *key_bytes(const slot_t *e)
{
    return e->kf & F_KEY_HEAP ? e->key.heap.ptr : e->key.inl;
}

/* The tag of a stored key, computed again (slots do not keep it). */
static inline uint32_t slot_tag(const shard_t *s, const slot_t *e)
{
    return tag_of(XXH3_64bits_withSeed(key_bytes(e), key_len(e), s->seed));
}

/* A key as the probe compares it: short keys zero-padded to the inline
 * size, so that a comparison is two fixed-size loads, not a memcmp call. */
typedef struct probe_key {
    const char *key;
    size_t len;
    size_t inl_len; /* what an inline key of the slot must match: len, or
                       never for a shadow key (those are all kept on the
                       heap, flagged F_SHADOW) */
    uint8_t shadow; /* F_SHADOW or 0 */
    char pad[KEY_INLINE];
} probe_key_t;

/* Made of whole-word loads that stay inside the key (overlapping where
 * the key is short), not a memcpy of a variable length: that would be a
 * call, and a call in the lane's hot path costs it its registers. */
static inline void probe_key_init(probe_key_t *k, const char *key, size_t len,
                                  bool shadow)
{
    const uint8_t *b = (const uint8_t *)key;
    uint64_t lo, hi = 0;

    k->key = key;
    k->len = len;
    k->inl_len = shadow ? SIZE_MAX : len;
    k->shadow = shadow ? F_SHADOW : 0;
    if (len >= KEY_INLINE) { /* the common long-enough key */
        lo = le64(b);
        hi = le64(b + 8);
    } else if (len > 8) { /* the last 8 bytes, shifted down to byte 8 on */
        lo = le64(b);
        hi = le64(b + len - 8) >> (8 * (KEY_INLINE - len));
    } else if (len >= 4) { /* two 4-byte loads, overlapping */
        lo = le32(b) | (uint64_t)le32(b + len - 4) << (8 * (len - 4));
    } else if (len > 0) { /* first, middle and last bytes */
        lo = b[0] | (uint64_t)b[len / 2] << (8 * (len / 2)) |
             (uint64_t)b[len - 1] << (8 * (len - 1));
    } else {
        lo = 0;
    }
    put_le64((uint8_t *)k->pad, lo);
    put_le64((uint8_t *)k->pad + 8, hi);
}

/* short_key: k is a key of the state space known to be at most KEY_INLINE
 * bytes, so a slot with a heap key (flag bits above any inline length) can
 * never match it and the comparison needs no call. */
static inline bool slot_is(const slot_t *e, const probe_key_t *k,
                           bool short_key)
{
    if (short_key || !(e->kf & F_KEY_HEAP)) /* inline keys: zero-padded */
        return (size_t)(e->kf & (KEY_LEN | F_KEY_HEAP)) == k->inl_len &&
               memcmp(e->key.inl, k->pad, KEY_INLINE) == 0;
    return e->key.heap.len == k->len && (e->sr & F_SHADOW) == k->shadow &&
           memcmp(e->key.heap.prefix, k->pad, sizeof e->key.heap.prefix) ==
               0 &&
           memcmp(e->key.heap.ptr, k->key, k->len) == 0;
}

/* Index of the key's slot, or of the empty slot that ends its probe. */
static inline uint32_t probe(const shard_t *s, uint32_t tag,
                             const probe_key_t *k, bool short_key)
{
    uint32_t i = home(s, tag);
    uint8_t c = ctrl_of(tag);

    /* Start the slot's cache misses now, beside the control byte's, rather
     * than after it: at a million keys all are misses.  A 40-byte slot may
     * straddle two cache lines: ask for both. */
    __builtin_prefetch(&s->slots[i], 1);
    __builtin_prefetch((const char *)&s->slots[i] + sizeof(slot_t) - 1, 1);
    for (;;) {
        uint8_t x = s->ctrl[i];
        if (__builtin_expect(x == 0 || (x == c && slot_is(&s->slots[i], k,
                                                           short_key)),
                             1))
            return i;
        i = next(s, i);
    }
}

static void slot_release(shard_t *s, slot_t *e)
{
    if (e->kf & F_KEY_HEAP) {
        free(e->key.heap.ptr);
        s->heap_bytes -= e->key.heap.len;
    }
    if (e->kf & F_STATE_HEAP) {
        heap_state_t h = heap_get(e);
        free(h.ptr);
        s->heap_bytes -= h.cap;
    }
}

/* A stored key's state bytes, in the slot or in their heap block. */
static inline uint8_t *slot_state(slot_t *e, size_t *len)
{
    if (e->kf & F_STATE_HEAP) {
        heap_state_t h = heap_get(e);
        *len = h.len;
        return h.ptr;
    }
    *len = e->sr & STATE_LEN;
    return e->state;
}

/* After the state is written: whether by a request with a horizon (only
 * such a state may be reclaimed, see expired()). */
static inline void mark_written(slot_t *e, bool horizon)
{
    e->kf = (uint8_t)((e->kf & ~F_HORIZON) | (horizon ? F_HORIZON : 0));
}

/* After the step wrote: whether the key is kept from eviction. */
static inline void mark_pinned(slot_t *e, uint64_t ttl_ns)
{
    e->sr = (uint8_t)((e->sr & ~F_PIN) |
                      (ttl_ns == RATE_TTL_FOREVER ? F_PIN : 0));
}

/* Backward-shift deletion: later entries of the same run move up so every
 * probe still reaches its key without tombstones. */
static void slot_remove(shard_t *s, uint32_t i)
{
    uint32_t j = i;

    slot_release(s, &s->slots[i]);
    for (;;) {
        j = next(s, j);
        if (s->ctrl[j] == 0)
            break;
        uint32_t h = home(s, slot_tag(s, &s->slots[j]));
        /* Move j into the hole at i unless j's home lies in (i, j]. */
        bool stays = i <= j ? (i < h && h <= j) : (i < h || h <= j);
        if (stays)
            continue;
        s->slots[i] = s->slots[j];
        s->ctrl[i] = s->ctrl[j];
        i = j;
    }
    memset(&s->slots[i], 0, sizeof s->slots[i]);
    s->ctrl[i] = 0;
    s->count--;
    atomic_fetch_sub_explicit(&s->store->nkeys, 1, memory_order_relaxed);
}

/* A key may be dropped without changing any answer: its state is back at
 * its cold start at the request's horizon, and its last write came with a
 * horizon too. */
static bool expired(slot_t *e, const rate_step_t *st)
{
    size_t len;

    if (st->horizon_ns == 0 || !(e->kf & F_HORIZON) || st->is_cold == NULL)
        return false;
    const uint8_t *bytes = slot_state(e, &len);
    return st->is_cold(st->arg, bytes, len, st->horizon_ns);
}

/* Frees one slot in a full shard: a key past its reset if the hand meets
 * one, else the first key not used since the hand last passed; never a
 * pinned key that is not cold.  False when every key is pinned (two turns
 * of the hand: the first may only clear reference bits). */
static bool make_room(shard_t *s, const rate_step_t *st)
{
    for (uint64_t n = 0; n < 2ull * s->cap + 1; n++) {
        slot_t *e = &s->slots[s->hand];
        if (s->ctrl[s->hand] != 0) {
            if (expired(e, st)) {
                slot_remove(s, s->hand);
                s->reclaimed++;
                return true;
            }
            if (!(e->sr & (F_REF | F_PIN))) {
                slot_remove(s, s->hand);
                s->evictions++;
                return true;
            }
            e->sr &= (uint8_t)~F_REF;
        }
        s->hand = next(s, s->hand);
    }
    return false;
}

static int rehash(shard_t *s, uint32_t cap, const rate_step_t *st)
{
    slot_t *old = s->slots;
    uint8_t *old_ctrl = s->ctrl;
    uint32_t old_cap = s->cap;
    slot_t *fresh = calloc(cap, sizeof *fresh);
    uint8_t *ctrl = calloc(cap, 1);

    if (fresh == NULL || ctrl == NULL) {
        free(fresh);
        free(ctrl);
        return RATE_ENOMEM;
    }
    s->slots = fresh;
    s->ctrl = ctrl;
    s->cap = cap;
    s->count = 0;
    s->hand = 0;
    for (uint32_t i = 0; i < old_cap; i++) {
        slot_t *e = &old[i];
        if (old_ctrl[i] == 0)
            continue;
        if (expired(e, st)) {
            slot_release(s, e);
            s->reclaimed++;
            atomic_fetch_sub_explicit(&s->store->nkeys, 1,
                                      memory_order_relaxed);
            continue;
        }
        uint32_t tag = slot_tag(s, e);
        uint32_t j = home(s, tag);
        while (ctrl[j] != 0)
            j = next(s, j);
        fresh[j] = *e;
        ctrl[j] = ctrl_of(tag);
        s->count++;
    }
    free(old);
    free(old_ctrl);
    return RATE_OK;
}

/* With the store at max_keys: frees one key, in s (locked) if it can,
 * else in another shard that is free at once (never waiting for a lock
 * while holding one); RATE_EFULL when none can (every key pinned). */
static int make_room_somewhere(shard_t *s, const rate_step_t *st)
{
    memstore_t *m = s->store;

    if (s->count > 0 && make_room(s, st))
        return RATE_OK;
    for (unsigned i = 0; i < m->nshards; i++) {
        shard_t *o = &m->shards[i];
        if (o == s || !take(o))
            continue;
        bool done = o->count > 0 && make_room(o, st);
        shard_unlock(o);
        if (done)
            return RATE_OK;
    }
    return RATE_EFULL;
}

/* Ensures room for one more key, and counts it; may move slots (probe
 * again after).  The caller uncounts it if it does not insert after all. */
static int reserve(shard_t *s, const rate_step_t *st)
{
    memstore_t *m = s->store;

    if (m->max_keys == 0) {
        atomic_fetch_add_explicit(&m->nkeys, 1, memory_order_relaxed);
    } else {
        /* Counted only below the bound (a compare-and-set), so that keys
         * inserted at once in other shards cannot pass it together. */
        uint_fast64_t cur =
            atomic_load_explicit(&m->nkeys, memory_order_relaxed);
        while (cur >= m->max_keys ||
               !atomic_compare_exchange_weak_explicit(
                   &m->nkeys, &cur, cur + 1, memory_order_relaxed,
                   memory_order_relaxed)) {
            if (cur < m->max_keys)
                continue; /* cur was reloaded: try again */
            int rc = make_room_somewhere(s, st);
            if (rc != RATE_OK)
                return rc;
            cur = atomic_load_explicit(&m->nkeys, memory_order_relaxed);
        }
    }
    if ((uint64_t)(s->count + 1) * LOAD_DEN <= (uint64_t)s->cap * LOAD_NUM)
        return RATE_OK;
    int rc = s->cap > UINT32_MAX / 2 ? RATE_EFULL : rehash(s, s->cap * 2, st);
    if (rc != RATE_OK)
        atomic_fetch_sub_explicit(&m->nkeys, 1, memory_order_relaxed);
    return rc;
}

static int set_state(shard_t *s, slot_t *e, const uint8_t *st, size_t len)
{
    if (len <= STATE_INLINE && !(e->kf & F_STATE_HEAP)) {
        /* A fixed-size copy: the source buffer always holds at least
         * STATE_INLINE bytes (every policy's cold state is that big).  In
         * pieces that match how the step has just written them (header
         * u64, u32, two bytes, then u64 words): a wider load over several
         * narrower stores cannot be forwarded from them and stalls. */
        memcpy(e->state, st, 8);
        memcpy(e->state + 8, st + 8, 4);
        e->state[12] = st[12];
        e->state[13] = st[13];
        memcpy(e->state + 14, st + 14, 8);
        e->sr = (uint8_t)((e->sr & (F_REF | F_SHADOW | F_PIN)) | len);
        return RATE_OK;
    }
    if (len > UINT32_MAX / 2)
        return RATE_ENOMEM;
    heap_state_t h = {NULL, 0, 0};
    if (e->kf & F_STATE_HEAP)
        h = heap_get(e);
    if (h.cap < len) {
        uint32_t cap = h.cap ? h.cap * 2 : 64;
        if (cap < len)
            cap = (uint32_t)len;
        uint8_t *p = realloc(h.ptr, cap);
        if (p == NULL)
            return RATE_ENOMEM;
        s->heap_bytes += cap - h.cap;
        h.ptr = p;
        h.cap = cap;
        e->kf |= F_STATE_HEAP;
    }
    memcpy(h.ptr, st, len);
    h.len = (uint32_t)len;
    heap_put(e, h);
    return RATE_OK;
}

static int insert(shard_t *s, uint32_t tag, const probe_key_t *k,
                  const rate_step_io_t *io, const rate_step_t *st)
{
    const char *key = k->key;
    size_t len = k->len;
    int rc = reserve(s, st);
    if (rc != RATE_OK)
        return rc;
    uint32_t i = probe(s, tag, k, false);
    slot_t *e = &s->slots[i];
    memset(e, 0, sizeof *e);
    e->sr = k->shadow; /* a shadow key is always on the heap */
    if (len > KEY_INLINE || k->shadow) {
        char *p = malloc(len);
        if (p == NULL) {
            atomic_fetch_sub_explicit(&s->store->nkeys, 1,
                                      memory_order_relaxed);
            return RATE_ENOMEM;
        }
        memcpy(p, key, len);
        e->key.heap.ptr = p;
        e->key.heap.len = (uint32_t)len;
        memcpy(e->key.heap.prefix, k->pad, sizeof e->key.heap.prefix);
        e->kf = F_KEY_HEAP;
        s->heap_bytes += len;
    } else {
        memcpy(e->key.inl, key, len);
        e->kf = (uint8_t)len;
    }
    rc = set_state(s, e, io->new_state, io->new_len);
    if (rc != RATE_OK) {
        if (e->kf & F_KEY_HEAP) {
            free(e->key.heap.ptr);
            s->heap_bytes -= len;
        }
        memset(e, 0, sizeof *e);
        atomic_fetch_sub_explicit(&s->store->nkeys, 1, memory_order_relaxed);
        return rc;
    }
    s->ctrl[i] = ctrl_of(tag);
    s->count++;
    return RATE_OK;
}

/* Scratch space for the new state: the stack for small states, else a
 * per-shard buffer that only grows (so a hit allocates nothing). */
static uint8_t *scratch(shard_t *s, size_t need, uint8_t *stack)
{
    if (need <= STACK_STATE)
        return stack;
    if (s->scratch_cap < need) {
        uint8_t *p = realloc(s->scratch, need);
        if (p == NULL)
            return NULL;
        s->heap_bytes += need - s->scratch_cap;
        s->scratch = p;
        s->scratch_cap = need;
    }
    return s->scratch;
}

/* The general update, with the shard locked and the key probed (e is its
 * slot, NULL when absent): the step over a copy of the state, then the
 * copy stored (or the key inserted).  Unlocks. */
static __attribute__((noinline)) int
update_copy(shard_t *s, slot_t *e, uint32_t tag, const probe_key_t *pk,
            const rate_step_t *st)
{
    uint8_t stack[STACK_STATE];
    rate_step_io_t io;
    int rc;

    io.old_state = NULL;
    io.old_len = 0;
    io.write = false;
    if (e != NULL) {
        e->sr |= F_REF;
        io.old_state = slot_state(e, &io.old_len);
    }
    io.new_cap = io.old_len + st->grow;
    io.new_state = scratch(s, io.new_cap, stack);
    if (io.new_state == NULL) {
        shard_unlock(s);
        return RATE_ENOMEM;
    }
    rc = st->fn(st->arg, &io);
    if (rc == RATE_OK && io.write) {
        if (e != NULL)
            rc = set_state(s, e, io.new_state, io.new_len);
        else
            rc = insert(s, tag, pk, &io, st);
        if (rc == RATE_OK) {
            if (e == NULL) /* inserting may have moved slots */
                e = &s->slots[probe(s, tag, pk, false)];
            /* A new key earns its reference bit on its second use. */
            mark_written(e, st->horizon_ns != 0);
            mark_pinned(e, io.ttl_ns);
        }
    }
    shard_unlock(s);
    return rc;
}

/* The key's shard, by its hash; *tag is the tag the shard files it by. */
static ALWAYS_INLINE shard_t *shard_of(const memstore_t *m,
                                       const char *key, size_t len,
                                       uint32_t *tag)
{
    uint64_t h = XXH3_64bits_withSeed(key, len, m->seed);

    *tag = tag_of(h);
    return &m->shards[(h >> 1) >> m->shift];
}

/* Hashes the key, locks its shard and probes.  Returns the shard, locked;
 * *at is the key's slot, or the empty slot that ends its probe. */
static ALWAYS_INLINE shard_t *locate(memstore_t *m, const char *key,
                                     size_t len, bool shadow,
                                     probe_key_t *pk, uint32_t *tag,
                                     uint32_t *at)
{
    shard_t *s = shard_of(m, key, len, tag);

    probe_key_init(pk, key, len, shadow);
    shard_lock(s);
    *at = probe(s, *tag, pk, false);
    return s;
}

/* ------------------------------------------------------ policy records */

/* The records: a short list under a mutex of its own, never taken with a
 * shard's lock held. */
static record_t **record_find(memstore_t *m, const rate_key_t *k)
{
    record_t **r = &m->records;

    while (*r != NULL && ((*r)->key_len != k->len ||
                          memcmp((*r)->key, k->bytes, k->len) != 0))
        r = &(*r)->next;
    return r;
}

static int record_update(memstore_t *m, const rate_key_t *k,
                         const rate_step_t *st)
{
    rate_step_io_t io = {0};
    uint8_t *buf;
    int rc;

    if (k->len > sizeof ((record_t *)0)->key)
        return RATE_EKEY;
    pthread_mutex_lock(&m->records_lock);
    record_t **at = record_find(m, k), *r = *at;
    if (r != NULL) {
        io.old_state = r->bytes;
        io.old_len = r->len;
    }
    io.new_cap = io.old_len + st->grow;
    buf = malloc(io.new_cap > 0 ? io.new_cap : 1);
    rc = buf == NULL ? RATE_ENOMEM : RATE_OK;
    if (rc == RATE_OK)
        io.new_state = buf;
    if (rc == RATE_OK && (rc = st->fn(st->arg, &io)) == RATE_OK && io.write) {
        if (r == NULL && (r = calloc(1, sizeof *r)) == NULL) {
            rc = RATE_ENOMEM;
        } else {
            if (*at == NULL) {
                memcpy(r->key, k->bytes, k->len);
                r->key_len = k->len;
                *at = r;
            }
            free(r->bytes);
            r->bytes = buf;
            r->len = io.new_len;
            buf = NULL;
        }
    }
    pthread_mutex_unlock(&m->records_lock);
    free(buf);
    return rc;
}

static int record_remove(memstore_t *m, const rate_key_t *k)
{
    pthread_mutex_lock(&m->records_lock);
    record_t **at = record_find(m, k), *r = *at;
    if (r != NULL)
        *at = r->next;
    pthread_mutex_unlock(&m->records_lock);
    if (r != NULL)
        free(r->bytes);
    free(r);
    return RATE_OK;
}

/* ------------------------------------------------------------- methods */

static int mem_update(void *self, const rate_key_t *k, const rate_step_t *st)
{
    probe_key_t pk;
    uint32_t tag, i;

    if (k->space == RATE_SPACE_POLICY)
        return record_update(self, k, st);
    shard_t *s = locate(self, k->bytes, k->len, k->space == RATE_SPACE_SHADOW,
                        &pk, &tag, &i);
    return update_copy(s, s->ctrl[i] != 0 ? &s->slots[i] : NULL, tag, &pk, st);
}

/* The bool calls' pass over a key's slot e in s (locked), and the
 * bookkeeping; unlocks.  0 denied, 1 allowed, RATE_ENOTSUP. */
static ALWAYS_INLINE int acquire_at(shard_t *s, slot_t *e,
                                    const rate_acquire_t *req,
                                    uint64_t permits, uint64_t now)
{
    uint64_t ttl;
    size_t n;
    uint8_t *bytes = slot_state(e, &n);
    int r = rate_state_acquire(req, permits, now, bytes, n, &ttl);

    if (r >= 0) {
        e->sr |= F_REF;
        if (r == RATE_ACQUIRE_WROTE)
            mark_written(e, req->horizon);
    }
    shard_unlock(s);
    return r >= 0 ? r & RATE_ACQUIRE_KEPT : RATE_ENOTSUP;
}

/* acquire() for any key: waits for the lock. */
static __attribute__((noinline)) int
acquire_any(memstore_t *m, const rate_acquire_t *req, const char *key,
            size_t len, uint64_t permits, uint64_t now)
{
    probe_key_t pk;
    uint32_t tag, i;
    shard_t *s = locate(m, key, len, req->space == RATE_SPACE_SHADOW, &pk,
                        &tag, &i);

    if (s->ctrl[i] == 0) {
        shard_unlock(s);
        return RATE_ENOTSUP;
    }
    return acquire_at(s, &s->slots[i], req, permits, now);
}

/* acquire() for a short key of the state space in s (locked): probed,
 * then decided by acquire_at; unlocks. */
static ALWAYS_INLINE int acquire_short(shard_t *s, uint32_t tag,
                                       const probe_key_t *pk,
                                       const rate_acquire_t *req,
                                       uint64_t permits, uint64_t now)
{
    uint32_t i = probe(s, tag, pk, true);

    if (s->ctrl[i] == 0) {
        shard_unlock(s);
        return RATE_ENOTSUP;
    }
    return acquire_at(s, &s->slots[i], req, permits, now);
}

/* The same when the shard was busy: waits for the lock (the key is hashed
 * already, and trying again at once would only take the lock's line from
 * the holder). */
static __attribute__((noinline)) int
acquire_busy(shard_t *s, uint32_t tag, const probe_key_t *pk,
             const rate_acquire_t *req, uint64_t permits, uint64_t now)
{
    shard_lock_wait(s);
    return acquire_short(s, tag, pk, req, permits, now);
}

/* The bool calls: a key the store holds, decided where its state lies by
 * the library's pass.  The hot path (a short key of the state space, a
 * free lock) is hashed, probed and decided with one call, the pass's;
 * flattened, so that the hash and the probe are inlined.  A busy lock
 * takes acquire_busy, anything else acquire_any. */
FLATTEN static int mem_acquire(void *self, const rate_acquire_t *req,
                               const char *key, size_t len,
                               uint64_t permits, uint64_t now)
{
    memstore_t *m = self;
    probe_key_t pk;
    uint32_t tag;

    if (len > KEY_INLINE || req->space != RATE_SPACE_STATE)
        return acquire_any(m, req, key, len, permits, now);
    shard_t *s = shard_of(m, key, len, &tag);
    probe_key_init(&pk, key, len, false);
    if (!shard_trylock(s))
        return acquire_busy(s, tag, &pk, req, permits, now);
    return acquire_short(s, tag, &pk, req, permits, now);
}

static int mem_remove(void *self, const rate_key_t *k)
{
    probe_key_t pk;
    uint32_t tag, i;

    if (k->space == RATE_SPACE_POLICY)
        return record_remove(self, k);
    shard_t *s = locate(self, k->bytes, k->len, k->space == RATE_SPACE_SHADOW,
                        &pk, &tag, &i);
    if (s->ctrl[i] != 0)
        slot_remove(s, i);
    shard_unlock(s);
    return RATE_OK;
}

static int mem_stats(void *self, rate_stats_t *out)
{
    memstore_t *m = self;

    memset(out, 0, sizeof *out);
    out->bytes = sizeof *m + (uint64_t)m->nshards * sizeof(shard_t);
    for (unsigned i = 0; i < m->nshards; i++) {
        shard_t *s = &m->shards[i];
        shard_lock(s);
        out->keys += s->count;
        out->evictions += s->evictions;
        out->reclaimed += s->reclaimed;
        out->bytes += (uint64_t)s->cap * (sizeof(slot_t) + 1) + s->heap_bytes;
        shard_unlock(s);
    }
    return RATE_OK;
}

static void mem_destroy(void *self)
{
    memstore_t *m = self;

    for (unsigned i = 0; i < m->nshards; i++) {
        shard_t *s = &m->shards[i];
        for (uint32_t j = 0; s->slots != NULL && s->ctrl != NULL && j < s->cap;
             j++)
            if (s->ctrl[j] != 0)
                slot_release(s, &s->slots[j]);
        free(s->slots);
        free(s->ctrl);
        free(s->scratch);
    }
    free(m->shards);
    while (m->records != NULL) {
        record_t *r = m->records;
        m->records = r->next;
        free(r->bytes);
        free(r);
    }
    pthread_mutex_destroy(&m->records_lock);
    free(m);
}

static const rate_store_methods_t memory_methods = {
    .version = RATE_STORE_VERSION,
    .name = "memory",
    .update = mem_update,
    .acquire = mem_acquire,
    .remove = mem_remove,
    .stats = mem_stats,
    .destroy = mem_destroy,
};

/* Whether s is a memory store (declared in src/internal.h: this file is
 * built on the public headers alone). */
bool rate__store_is_memory(const rate_store_t *s);
bool rate__store_is_memory(const rate_store_t *s)
{
    return rate_store_backend(s, &memory_methods) != NULL;
}

static uint64_t isqrt(uint64_t x)
{
    uint64_t r = 0;

    while ((r + 1) * (r + 1) <= x)
        r++;
    return r;
}

/* Slots for `keys` keys at no more than LOAD_NUM/LOAD_DEN load. */
static uint32_t slots_for(uint64_t keys)
{
    uint64_t cap = keys * LOAD_DEN / LOAD_NUM + 1;
    return cap < 8 ? 8 : (uint32_t)cap;
}

int rate_store_memory_new(const rate_memory_options_t *opt, rate_store_t **out)
{
    rate_memory_options_t o = {0};
    memstore_t *m;
    unsigned n = 1;

    if (out == NULL)
        return RATE_EINVAL;
    *out = NULL;
    if (opt != NULL)
        o = *opt;
    for (size_t i = 0; i < sizeof o.reserved / sizeof o.reserved[0]; i++)
        if (o.reserved[i] != 0) /* a later version's option */
            return RATE_EINVAL;
    if (o.shards == 0)
        o.shards = 256;
    if (o.shards > 65536 || o.max_keys > (uint64_t)UINT32_MAX)
        return RATE_EINVAL;
    while (n < o.shards)
        n <<= 1;
    /* Keep a bounded shard big enough for its LRU to mean something. */
    while (o.max_keys != 0 && n > 1 && o.max_keys / n < 64)
        n >>= 1;
    m = calloc(1, sizeof *m);
    if (m == NULL)
        return RATE_ENOMEM;
    m->shards = aligned_alloc(64, n * sizeof(shard_t));
    if (m->shards == NULL) {
        free(m);
        return RATE_ENOMEM;
    }
    memset(m->shards, 0, n * sizeof(shard_t));
    m->nshards = n;
    m->max_keys = o.max_keys;
    atomic_init(&m->nkeys, 0);
    pthread_mutex_init(&m->records_lock, NULL);
    m->shift = 63 - (unsigned)__builtin_ctz(n);
    if (getrandom(&m->seed, sizeof m->seed, 0) != sizeof m->seed)
        m->seed = (XXH64_hash_t)(uintptr_t)m ^ rate_clock_monotonic_ns();
    for (unsigned i = 0; i < n; i++) {
        shard_t *s = &m->shards[i];
        atomic_init(&s->lock, 0);
        atomic_init(&s->starving, 0);
        s->seed = m->seed;
        s->store = m;
        /* Room for the shard's share of max_keys and three standard
         * deviations more (the keys of a full store are spread by their
         * hash, not evenly), so that few bounded shards ever grow.  An
         * unbounded shard starts at INITIAL_SLOTS and doubles. */
        uint64_t share = o.max_keys / n;
        uint32_t cap = o.max_keys != 0
                           ? slots_for(share + 3 * isqrt(share) + 8)
                           : INITIAL_SLOTS;
        s->slots = calloc(cap, sizeof(slot_t));
        s->ctrl = calloc(cap, 1);
        if (s->slots == NULL || s->ctrl == NULL) {
            mem_destroy(m);
            return RATE_ENOMEM;
        }
        s->cap = cap;
    }
    int rc = rate_store_new(&memory_methods, m, out);
    if (rc != RATE_OK)
        mem_destroy(m);
    return rc;
}
