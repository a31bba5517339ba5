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
 * Bounded memory.  With max_keys, each shard holds at most its share, and a
 * new key in a full shard first takes the place of a key whose state is
 * back at its cold start (asked of the step, by the library's own clock
 * only: a caller-supplied time never drops another key), then evicts by
 * CLOCK (second chance), an approximation of least-recently-used that needs
 * one bit per key.  Evictions are counted:
 * they may change later answers.  Keys whose reset has passed are also
 * dropped when an unbounded shard grows.
 *
 * The bool API's lanes (see "lanes" below) decide a key held under the
 * limiter's policy where its state lies, with the algorithm's plain pass
 * (the token bucket's compiled in); they decline everything else,
 * untouched, to the limiter's general path.
 *
 * Keys are hashed with XXH3 (libxxhash), seeded per store from getrandom()
 * so that clients cannot aim many keys at one shard.
 */
#include <errno.h>
#include <sched.h>
#include <stdlib.h>
#include <sys/random.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "../algo/token_bucket.h"
#include "../internal.h"

#define KEY_INLINE 16u
#define STATE_INLINE 22u /* a single bucket or fixed window: 14 + 8 */
_Static_assert(STATE_INLINE == RATE__HEADER_LEN + 8, "see set_state");
#define STACK_STATE 512u
#define LOAD_NUM 7u /* grow past 7/8 full */
#define LOAD_DEN 8u
#define BACKOFF_MIN 128u /* pauses (about 20 ns each on our machines) */
#define BACKOFF_MAX 2048u /* so a waiter looks again at least every ~40 us */

/* A slot's two flag bytes. */
enum {
    KEY_LEN = 0x1f,      /* kf: an inline key's length */
    F_KEY_HEAP = 0x20,   /* kf: the key is in a heap block */
    F_STATE_HEAP = 0x40, /* kf: the state is in a heap block */
    F_CLOCK = 0x80,      /* kf: last written at a time of the library's
                            own clock */
    STATE_LEN = 0x1f,    /* sr: an inline state's length */
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
    uint32_t count, cap, max, hand;
    XXH64_hash_t seed; /* the store's */
    uint8_t *ctrl; /* one byte per slot: 0 empty, else 0x80 | 7 hash bits */
    slot_t *slots;
    uint8_t *scratch;
    size_t scratch_cap;
    uint64_t heap_bytes;
    uint64_t evictions, reclaimed, allowed, denied;
} shard_t;

typedef struct memstore {
    XXH64_hash_t seed;
    unsigned shift; /* 63 - log2(shards): a hash's shard is (h >> 1) >> shift,
                       0 when there is one */
    unsigned nshards;
    shard_t *shards;
} memstore_t;

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
 * one alone (without backoff: a quarter as many).  The price is fairness
 * under such contention: a waiter may sit out several of the holder's
 * decisions, looking again within ~40 us at the longest.  The wait is out
 * of line, so that an uncontended lock costs the hot path one exchange and
 * none of the registers the wait would need. */
static __attribute__((noinline, cold)) void shard_lock_wait(shard_t *s)
{
    unsigned backoff = BACKOFF_MIN;

    do {
        do {
            for (unsigned i = 0; i < backoff; i++)
                cpu_relax();
            if (backoff < BACKOFF_MAX)
                backoff *= 2;
            else
                sched_yield(); /* the holder may have been preempted */
        } while (atomic_load_explicit(&s->lock, memory_order_relaxed));
    } while (atomic_exchange_explicit(&s->lock, 1, memory_order_acquire));
}

/* Takes the lock if it is free, at once; false if it is held. */
static inline bool shard_trylock(shard_t *s)
{
    return !__builtin_expect(
        atomic_exchange_explicit(&s->lock, 1, memory_order_acquire), 0);
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
    char pad[KEY_INLINE];
} probe_key_t;

/* Made of whole-word loads that stay inside the key (overlapping where
 * the key is short), not a memcpy of a variable length: that would be a
 * call, and a call in the lane's hot path costs it its registers. */
static inline void probe_key_init(probe_key_t *k, const char *key, size_t len)
{
    const uint8_t *b = (const uint8_t *)key;
    uint64_t lo, hi = 0;

    k->key = key;
    k->len = len;
    if (len >= KEY_INLINE) { /* the common long-enough key */
        lo = rate__get64(b);
        hi = rate__get64(b + 8);
    } else if (len > 8) { /* the last 8 bytes, shifted down to byte 8 on */
        lo = rate__get64(b);
        hi = rate__get64(b + len - 8) >> (8 * (KEY_INLINE - len));
    } else if (len >= 4) { /* two 4-byte loads, overlapping */
        lo = rate__get32(b) |
             (uint64_t)rate__get32(b + len - 4) << (8 * (len - 4));
    } else if (len > 0) { /* first, middle and last bytes */
        lo = b[0] | (uint64_t)b[len / 2] << (8 * (len / 2)) |
             (uint64_t)b[len - 1] << (8 * (len - 1));
    } else {
        lo = 0;
    }
    rate__put64((uint8_t *)k->pad, lo);
    rate__put64((uint8_t *)k->pad + 8, hi);
}

/* short_key: k is known to be at most KEY_INLINE bytes, so a slot with a
 * heap key (flag bits above any inline length) can never match it and the
 * comparison needs no call. */
static inline bool slot_is(const slot_t *e, const probe_key_t *k,
                           bool short_key)
{
    if (short_key || !(e->kf & F_KEY_HEAP)) /* inline keys: zero-padded */
        return (size_t)(e->kf & (KEY_LEN | F_KEY_HEAP)) == k->len &&
               memcmp(e->key.inl, k->pad, KEY_INLINE) == 0;
    return e->key.heap.len == k->len &&
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

/* After the state is written: whether at a time of the library's own
 * clock (only such a state may be reclaimed, see expired()). */
static inline void mark_written(slot_t *e, bool clock_time)
{
    e->kf = (uint8_t)((e->kf & ~F_CLOCK) | (clock_time ? F_CLOCK : 0));
}

static inline void count_verdict(shard_t *s, bool allowed)
{
    if (allowed)
        s->allowed++;
    else
        s->denied++;
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
}

/* A key may be dropped without changing any answer: its state is back at
 * its cold start by the library's clock (both its last admission and this
 * request on that clock). */
static bool expired(slot_t *e, const rate_step_t *st)
{
    size_t len;

    if (!st->clock_time || !(e->kf & F_CLOCK) || st->is_cold == NULL)
        return false;
    const uint8_t *bytes = slot_state(e, &len);
    return st->is_cold(st->arg, bytes, len, st->now_ns);
}

/* Frees one slot in a full shard: a key past its reset if the hand meets
 * one, else the first key not used since the hand last passed. */
static void make_room(shard_t *s, const rate_step_t *st)
{
    for (;;) {
        slot_t *e = &s->slots[s->hand];
        if (s->ctrl[s->hand] != 0) {
            if (expired(e, st)) {
                slot_remove(s, s->hand);
                s->reclaimed++;
                return;
            }
            if (!(e->sr & F_REF)) {
                slot_remove(s, s->hand);
                s->evictions++;
                return;
            }
            e->sr &= (uint8_t)~F_REF;
        }
        s->hand = next(s, s->hand);
    }
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

/* Ensures room for one more key; may move slots (probe again after). */
static int reserve(shard_t *s, const rate_step_t *st)
{
    if (s->max != 0 && s->count >= s->max) {
        make_room(s, st);
        return RATE_OK;
    }
    if ((uint64_t)(s->count + 1) * LOAD_DEN <= (uint64_t)s->cap * LOAD_NUM)
        return RATE_OK;
    if (s->cap > UINT32_MAX / 2)
        return RATE_EFULL;
    return rehash(s, s->cap * 2, st);
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
        e->sr = (uint8_t)((e->sr & F_REF) | len);
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
    if (len > KEY_INLINE) {
        char *p = malloc(len);
        if (p == NULL)
            return RATE_ENOMEM;
        memcpy(p, key, len);
        e->key.heap.ptr = p;
        e->key.heap.len = (uint32_t)len;
        memcpy(e->key.heap.prefix, key, sizeof e->key.heap.prefix);
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
    io.write = io.allowed = false;
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
            mark_written(e, st->clock_time);
        }
    }
    if (rc == RATE_OK)
        count_verdict(s, io.allowed);
    shard_unlock(s);
    return rc;
}

/* The key's shard, by its hash; *tag is the tag the shard files it by. */
static RATE__ALWAYS_INLINE shard_t *shard_of(const memstore_t *m,
                                             const char *key, size_t len,
                                             uint32_t *tag)
{
    uint64_t h = XXH3_64bits_withSeed(key, len, m->seed);

    *tag = tag_of(h);
    return &m->shards[(h >> 1) >> m->shift];
}

/* Hashes the key, locks its shard and probes.  Returns the shard, locked;
 * *at is the key's slot, or the empty slot that ends its probe. */
static RATE__ALWAYS_INLINE shard_t *locate(memstore_t *m, const char *key,
                                           size_t len, probe_key_t *pk,
                                           uint32_t *tag, uint32_t *at)
{
    shard_t *s = shard_of(m, key, len, tag);

    probe_key_init(pk, key, len);
    shard_lock(s);
    *at = probe(s, *tag, pk, false);
    return s;
}

/* The bookkeeping of a stored key decided where its state lies: used now,
 * written at which clock's time (if written), the verdict counted. */
static inline void decided_in_place(shard_t *s, slot_t *e, bool wrote,
                                    bool allowed, bool clock_time)
{
    e->sr |= F_REF;
    if (wrote)
        mark_written(e, clock_time);
    count_verdict(s, allowed);
}

static int mem_update(void *self, const char *key, size_t len,
                      const rate_step_t *st)
{
    probe_key_t pk;
    uint32_t tag, i;
    shard_t *s = locate(self, key, len, &pk, &tag, &i);
    slot_t *e = s->ctrl[i] != 0 ? &s->slots[i] : NULL;

    /* A plain try-acquire decided where the state lies. */
    if (e != NULL && st->inplace != NULL) {
        bool allowed;
        uint64_t ttl;
        size_t n;
        uint8_t *bytes = slot_state(e, &n);
        int r = st->inplace(st->arg, bytes, n, &allowed, &ttl);
        if (r != RATE_INPLACE_NO) {
            decided_in_place(s, e, r == RATE_INPLACE_WROTE, allowed,
                             st->clock_time);
            shard_unlock(s);
            return RATE_OK;
        }
    }
    return update_copy(s, e, tag, &pk, st);
}

/* ---------------------------------------------------------------- lanes */

/* The lanes (rate__lane_t): the bool API's try-acquire, decided where the
 * state of a key stored under the lane's policy lies (in its slot, or its
 * heap block: a sliding window's 30 bytes); anything else goes, before
 * anything is touched, to the limiter's general path.
 *
 * Each of the four public calls has a lane of its own per kind of policy,
 * made from one template (lane_run) with its `how` a constant, and the
 * token bucket's plain pass is compiled into its lanes rather than called
 * through the policy.  The hot path (a short key, a free lock) then calls
 * nothing, so it keeps its values in registers; a key over KEY_INLINE
 * bytes, bad input and a busy lock go to lane_wait, which does the same
 * for any key and waits for the lock. */

/* The policy's plain pass over a stored key's state: the token bucket's
 * own, inline (tb), or the algorithm's through the policy. */
static RATE__ALWAYS_INLINE int lane_plain(const rate_policy_t *p, slot_t *e,
                                          uint64_t now, uint64_t permits,
                                          bool tb)
{
    size_t n;
    uint8_t *bytes = slot_state(e, &n);

    if (tb)
        return rate__tb_plain(p, bytes, n, now, permits);
    return p->plain(p, bytes, n, now, permits);
}

/* After the plain pass r over the key in slot e of s (locked): the
 * bookkeeping, the lock released, and the answer, or the general path's
 * when the pass was not the lane's to make. */
static RATE__ALWAYS_INLINE bool lane_end(const rate__lane_t *ln, shard_t *s,
                                         slot_t *e, int r, const char *key,
                                         size_t len, uint64_t permits,
                                         uint64_t now, unsigned how)
{
    if (r != RATE__PLAIN_NO)
        decided_in_place(s, e, r == RATE__PLAIN_WROTE, r & RATE__PLAIN_READ,
                         how & RATE__LANE_CLOCK);
    shard_unlock(s);
    if (r == RATE__PLAIN_NO)
        return ln->general(ln, key, len, permits, now, how);
    return (r & RATE__PLAIN_READ) || ln->shadow;
}

/* Any key and any policy with a plain pass; waits for a busy lock. */
static __attribute__((noinline)) bool
lane_wait(const rate__lane_t *ln, const char *key, size_t len,
          uint64_t permits, uint64_t now, unsigned how)
{
    probe_key_t pk;
    uint32_t tag, i;
    int r = RATE__PLAIN_NO;
    bool ok = rate__lane_input(key, &len, permits, now, how);

    how &= ~(unsigned)RATE__LANE_CSTR; /* general is given the length */
    if (!ok)
        return ln->general(ln, key, len, permits, now, how);
    shard_t *s = locate(ln->self, key, len, &pk, &tag, &i);
    slot_t *e = &s->slots[i];
    if (s->ctrl[i] != 0)
        r = lane_plain(ln->policy, e, now, permits, false);
    return lane_end(ln, s, e, r, key, len, permits, now, how);
}

/* A lane: `how` and `tb` are constants of each one made below.  The
 * general path is given the key and length kept in pk, so that the hot
 * path need not keep them in registers of their own. */
static RATE__ALWAYS_INLINE bool lane_run(const rate__lane_t *ln,
                                         const char *key, size_t len,
                                         uint64_t permits, uint64_t now,
                                         unsigned how, bool tb)
{
    probe_key_t pk;
    uint32_t tag;
    int r = RATE__PLAIN_NO;

    if (how & RATE__LANE_CLOCK)
        now = ln->now_ns(ln->clock_ud);
    len = rate__lane_len(key, len, how);
    how &= ~(unsigned)RATE__LANE_CSTR;
    if (key == NULL || len - 1 >= KEY_INLINE ||
        (permits | now) > RATE_TIME_MAX)
        return lane_wait(ln, key, len, permits, now, how);
    shard_t *s = shard_of(ln->self, key, len, &tag);
    probe_key_init(&pk, key, len);
    if (!shard_trylock(s))
        return lane_wait(ln, key, len, permits, now, how);
    uint32_t i = probe(s, tag, &pk, true);
    slot_t *e = &s->slots[i];
    if (s->ctrl[i] != 0)
        r = lane_plain(ln->policy, e, now, permits, tb);
    return lane_end(ln, s, e, r, pk.key, pk.len, permits, now, how);
}

/* The eight lanes: a policy with a plain pass, or a token bucket; each of
 * the four `how`s (the limiter passes the same one it indexes by). */
#define LANE(name, HOW, TB)                                                   \
    RATE__FLATTEN static bool name(const rate__lane_t *ln, const char *key,   \
                                   size_t len, uint64_t permits,              \
                                   uint64_t now, unsigned how)                \
    {                                                                         \
        (void)how;                                                            \
        return lane_run(ln, key, len, permits, now, HOW, TB);                 \
    }
LANE(lane_any_given_len, 0, false)
LANE(lane_any_clock_len, RATE__LANE_CLOCK, false)
LANE(lane_any_given_cstr, RATE__LANE_CSTR, false)
LANE(lane_any_clock_cstr, RATE__LANE_CLOCK | RATE__LANE_CSTR, false)
LANE(lane_tb_given_len, 0, true)
LANE(lane_tb_clock_len, RATE__LANE_CLOCK, true)
LANE(lane_tb_given_cstr, RATE__LANE_CSTR, true)
LANE(lane_tb_clock_cstr, RATE__LANE_CLOCK | RATE__LANE_CSTR, true)
#undef LANE

static bool mem_lanes(const rate_policy_t *p, rate__lane_fn fn[RATE__LANE_HOWS])
{
    static const rate__lane_fn any[RATE__LANE_HOWS] = {
        lane_any_given_len, lane_any_clock_len, lane_any_given_cstr,
        lane_any_clock_cstr};
    static const rate__lane_fn tb[RATE__LANE_HOWS] = {
        lane_tb_given_len, lane_tb_clock_len, lane_tb_given_cstr,
        lane_tb_clock_cstr};

    if (p->plain == NULL)
        return false;
    memcpy(fn, p->count == 1 && p->algo[0] == &rate__token_bucket ? tb : any,
           sizeof any);
    return true;
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
        out->allowed += s->allowed;
        out->denied += s->denied;
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
    free(m);
}

static const rate_store_vtable_t memory_vtable = {
    .version = RATE_STORE_V1,
    .name = "memory",
    .update = mem_update,
    .stats = mem_stats,
    .destroy = mem_destroy,
};

/* Slots for `keys` keys at no more than 7/8 load. */
static uint32_t slots_for(uint64_t keys)
{
    uint64_t cap = keys * LOAD_DEN / LOAD_NUM + 1;
    return cap < 8 ? 8 : (uint32_t)cap;
}

int rate_store_memory_new(const rate_memory_options_t *opt, rate_store_t **out)
{
    rate_memory_options_t o = {0, 0};
    memstore_t *m;
    unsigned n = 1;

    if (out == NULL)
        return RATE_EINVAL;
    *out = NULL;
    if (opt != NULL)
        o = *opt;
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
    m->shift = 63 - (unsigned)__builtin_ctz(n);
    if (getrandom(&m->seed, sizeof m->seed, 0) != sizeof m->seed)
        m->seed = (XXH64_hash_t)(uintptr_t)m ^ rate_clock_monotonic_ns();
    for (unsigned i = 0; i < n; i++) {
        shard_t *s = &m->shards[i];
        atomic_init(&s->lock, 0);
        s->seed = m->seed;
        if (o.max_keys != 0)
            s->max = (uint32_t)(o.max_keys / n + (i < o.max_keys % n));
        uint32_t cap = slots_for(s->max != 0 ? s->max : 8);
        s->slots = calloc(cap, sizeof(slot_t));
        s->ctrl = calloc(cap, 1);
        if (s->slots == NULL || s->ctrl == NULL) {
            mem_destroy(m);
            return RATE_ENOMEM;
        }
        s->cap = cap;
    }
    int rc = rate_store_new(&memory_vtable, m, out);
    if (rc != RATE_OK)
        mem_destroy(m);
    else
        (*out)->lanes = mem_lanes;
    return rc;
}
