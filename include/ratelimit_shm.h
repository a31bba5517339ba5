/* SPDX-License-Identifier: MIT */
/*
 * ratelimit_shm.h -- the shared-memory store (docs/shm.md): the
 * processes of one host share each key's state through a mapped region,
 * with no server.
 *
 * Keys and errors in decisions.  A key longer than the region's key_max
 * (with the prefix) is the caller's error, as one longer than
 * RATE_KEY_MAX: the limiter's calls return RATE_EKEY, whatever the fail
 * mode, and nothing is written.  The store's own errors, which a decision
 * on it reports as a store error (under the limiter's fail mode):
 * RATE_EFULL for a state longer than its state_max, or a new policy record
 * past max_policies; RATE_ETIMEDOUT when a live process held the key's
 * shard for lock_timeout_ns; RATE_ESTORE for a shard lock the system
 * refuses (left unrecoverable); RATE_ECORRUPT for a region damaged by a
 * writer of its file (never a crash: docs/shm.md, "A damaged region");
 * RATE_ENOMEM.  Nothing is written on any of them.
 */
#ifndef RATELIMIT_SHM_H
#define RATELIMIT_SHM_H

#include "ratelimit.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The shared-memory store: one set of keys for every process of a host
 * that maps the same region, with no server (docs/shm.md).  The region is
 * a fixed-size table: max_keys slots in shards, each shard behind a robust
 * process-shared mutex, each slot holding a key of up to key_max bytes and
 * a state of up to state_max bytes (two copies: a decision writes the idle
 * one and commits it with one store, so a process killed anywhere leaves
 * every key as it was before or after its decision).  A process that dies
 * holding a shard's lock is detected by the next locker, which rebuilds
 * and checks that shard and counts the recovery (rate_shm_info_t). */
typedef struct rate_shm_options {
    uint64_t max_keys;      /* keys the region holds: required to create or
                               initialize one (0: an error); 0 to attach
                               takes the region's, else it must match.
                               Split evenly among the shards, each with
                               room for 3 standard deviations more (keys
                               spread by hash: max_keys keys fit); a new
                               key in a full shard evicts that shard's
                               least recently used key (CLOCK), counted in
                               evictions, never a key with in-flight
                               leases held (with only those left a new
                               key is RATE_EFULL).  One shard holds
                               max_keys exactly */
    unsigned shards;        /* 0: up to 64, each of at least 256 keys;
                               rounded up to a power of two, at most 1024
                               and at most max_keys */
    uint32_t key_max;       /* longest key, prefix included: 0 = 64;
                               from 4 (a policy record's key) to
                               RATE_KEY_MAX + 64.  A longer key is the
                               caller's error: the limiter's calls
                               return RATE_EKEY (no fail mode) */
    uint32_t state_max;     /* longest state: 0 = 96 (every policy of
                               buckets and windows, a sliding log of up to
                               4 entries); at most 262144.  See
                               rate_store_shm_state_size() */
    uint32_t max_policies;  /* policy records the region keeps: 0 = 64 */
    unsigned mode;          /* the created file's mode bits: 0 = 0600 */
    bool set_group;         /* give the created file the group `group` */
    uint32_t group;
    bool no_create;         /* rate_store_shm_new: attach only, never
                               create (a missing file is an error) */
    bool init;              /* rate_store_shm_new_in: initialize the region
                               whatever it holds (the first caller); false:
                               attach, or initialize a region that is still
                               all zero (see rate_store_shm_new_in) */
    const char *prefix;     /* a namespace: every key (policy records too)
                               is kept as PREFIX+KEY, and
                               rate_store_shm_drop() removes those; copied.
                               The bytes only: a prefix that begins with
                               another ("app1", "app10") shares its keys
                               ("app1"+"0u" is "app10"+"u"), and the
                               shorter one's drop removes the longer one's
                               keys: end each with a byte no tenant's
                               name holds ("app1:", "app10:"), so that
                               none begins with another.
                               At most key_max - 4 bytes (a policy
                               record's key is 4).  NULL: none */
    uint64_t lock_timeout_ns; /* the longest wait for a shard's lock held
                               by a live process: 0 = 2 s; past it the call
                               fails with RATE_ETIMEDOUT (a lock held by a
                               dead process is taken over at once) */
    uint64_t reserved[8]; /* zero (= {...} or memset): room for later
                               fields; non-zero is RATE_EINVAL */
} rate_shm_options_t;

/* Opens the region in the file at `path` (e.g. /dev/shm/myapp.rl), mapped
 * MAP_SHARED: attaches if the file exists, else creates it -- every option
 * checked first, then a temporary file beside it allocated in full
 * (refused at once when statvfs shows less room; posix_fallocate, or a
 * sparse ftruncate only on a file system that cannot allocate: see
 * docs/shm.md), initialized, given `mode` (and `group`), then linked into
 * place, so that no process ever sees half a region (two creators at
 * once: one wins, the other attaches); on any error the temporary file is
 * removed and nothing is left at path.  Attaching checks the header
 * (magic, layout version, this build's lock size, the sizes) and refuses
 * anything else.  options NULL: every option its default (which cannot
 * create: max_keys is required).
 *
 * Returns: RATE_OK with the store in *out.
 *
 * Errors (each with `err`, if not NULL, errlen bytes with the NUL, naming
 * the cause or the mismatch; *out is NULL):
 *   RATE_EINVAL  NULL or empty path, NULL out; a bad option (non-zero
 *                reserved words, max_keys 0 when creating or above
 *                2^31-1, key_max (4..RATE_KEY_MAX + 64), state_max
 *                (22..262144), max_policies
 *                or shards out of range, a lock_timeout_ns above
 *                RATE_TIME_MAX, a mode that is not a file mode, a region
 *                of more than 64 GiB, a prefix longer than key_max - 4);
 *                an option that disagrees with an existing region
 *                ("max_keys: the region has 1000, the options ask 2000")
 *   RATE_ESTORE  the file cannot be opened, created, given its mode or
 *                group, or mapped (errno's text: no permission, no such
 *                directory, no_create and absent); no room for it
 *                ("cannot allocate its N bytes: No space left on
 *                device", from statvfs or the allocation); its locks
 *                cannot be made; it is not a store (bad magic), of
 *                another layout version or build, truncated or of another
 *                size than its header says, or its header's ready word
 *                damaged ("the header is damaged: its ready word is ...")
 *   RATE_ENOMEM
 *
 * Ownership: path, options and options->prefix are read during the call
 * (the prefix is copied); err is the caller's.  The caller frees *out with
 * rate_store_free: that unmaps, and never removes the file.
 *
 * Thread-safe: yes. */
RATE_API int rate_store_shm_new(const char *path,
                                const rate_shm_options_t *options,
                                rate_store_t **out, char *err, size_t errlen);

/* The same store over a region the caller provides (mem, len bytes, at
 * least 64-byte aligned, shared between the processes by the caller, e.g.
 * an nginx shared zone or its own MAP_SHARED mapping).  Who initializes:
 * the caller that passes options->init (once, before any other attaches);
 * or, without init, the first caller to find the region all zero (a fresh
 * anonymous or ftruncated mapping), by a compare-and-set on its header:
 * the others wait for it (at most lock_timeout_ns).  rate_store_shm_size()
 * tells the bytes needed; a region longer than the store leaves the rest
 * unused.
 *
 * Returns: RATE_OK with the store in *out.
 *
 * Errors (with `err` as for rate_store_shm_new; *out is NULL): those of
 * rate_store_shm_new that are not about the file, and RATE_EINVAL for a
 * NULL out, a NULL or misaligned mem, or a len below what the options
 * need; RATE_ESTORE for a region being initialized for longer than
 * lock_timeout_ns (its initializer died: initialize it again with init),
 * one whose initialization never finished, or whose locks cannot be made.
 *
 * Ownership: the region stays the caller's (rate_store_free does not
 * unmap it) and must outlive the store; options as for
 * rate_store_shm_new.  The caller frees *out with rate_store_free.
 *
 * Thread-safe: yes. */
RATE_API int rate_store_shm_new_in(void *mem, size_t len,
                                   const rate_shm_options_t *options,
                                   rate_store_t **out, char *err,
                                   size_t errlen);

/* Computes the size of the region these options make, for a caller of
 * rate_store_shm_new_in.
 *
 * Returns: the bytes a region made with these options takes (a multiple
 * of 4096, at most 64 GiB).
 *
 * Errors: none; 0 for NULL or options that are not valid (as
 * rate_store_shm_new would refuse; max_keys 0 too).
 *
 * Ownership: options is read during the call; nothing is kept.
 *
 * Thread-safe: yes. */
RATE_API size_t rate_store_shm_size(const rate_shm_options_t *options);

/* Tells the state_max a region needs for a policy (docs/algorithms.md,
 * "Stored state"): a region whose state_max is at least this keeps every
 * key of the policy.  A policy with a larger one is refused when it is
 * set: rate_store_check_policy, rate_limiter_new and
 * rate_limiter_set_policy return RATE_EPOLICY ("the policy's states take
 * up to 1622 bytes, the shared-memory region keeps at most 96 (its
 * state_max)"), and a resolver's or a rule's such policy is a store error
 * (RATE_EPOLICY) at each decision.  A longer state that still reaches the
 * region (through a caller of the store contract that does not check) is
 * refused when written: RATE_EFULL, and the key keeps its bytes.  (The
 * store's other errors are in this header's opening comment.)
 *
 * Returns: the most bytes a state of the policy can take; the same figure
 * as rate_policy_state_max().
 *
 * Errors: none; 0 for NULL or the unlimited policy.
 *
 * Ownership: policy is read during the call; nothing is kept.
 *
 * Thread-safe: yes. */
RATE_API size_t rate_store_shm_state_size(const rate_policy_t *policy);

typedef struct rate_shm_info {
    uint64_t max_keys;     /* as made */
    uint64_t capacity;     /* slots, max_keys and the shards' slack */
    uint64_t keys;         /* held now (states and shadow states) */
    uint64_t evictions;    /* as rate_stats_t */
    uint64_t reclaimed;
    uint64_t recoveries;   /* locks taken over from a dead process */
    uint64_t repaired;     /* slots a recovery found invalid and freed */
    uint64_t policies;     /* policy records held */
    uint64_t bytes;        /* the region's size */
    uint64_t slot_bytes;   /* bytes per key: a slot and its index share */
    uint32_t shards, key_max, state_max, max_policies;
    bool created;          /* this handle created the file (or initialized
                              the caller's region); false: attached */
    uint64_t reserved[8]; /* room for later fields; not read */
} rate_shm_info_t;

/* Reads the region's sizes and counters (of every process that used it),
 * taking each shard's lock in turn (recovering one a dead process left).
 *
 * Returns: RATE_OK with *out filled (zeroed first).
 *
 * Errors: RATE_EINVAL for a NULL store or out, or a store that is not a
 * shared-memory store; RATE_ETIMEDOUT as for a decision (a live process
 * held a lock for lock_timeout_ns); RATE_ESTORE for a lock the system
 * refuses; RATE_ECORRUPT for a key count past a shard's slots (a damaged
 * region).  *out may then be partly filled.
 *
 * Ownership: store is borrowed; *out is the caller's; nothing is kept.
 *
 * Thread-safe: yes. */
RATE_API int rate_store_shm_info(rate_store_t *store, rate_shm_info_t *out);

/* A full check of the region's invariants, shard by shard under its lock
 * (recovering one a dead process left): every chain and the free list
 * well formed, each key once, in its own shard and bucket, counts that
 * add up, lengths within the region's bounds, policy records unique.
 *
 * Returns: RATE_OK when every invariant holds.
 *
 * Errors (with `err`, if not NULL, errlen bytes with the NUL, saying what
 * is wrong): RATE_ECORRUPT (the shard, slot or record and the broken
 * invariant); RATE_EINVAL for a NULL store or one that is not a
 * shared-memory store; RATE_ETIMEDOUT, or RATE_ESTORE, when a shard's or
 * the records' lock cannot be taken.
 *
 * Ownership: store is borrowed; err is the caller's; nothing is kept.
 *
 * Thread-safe: yes, alongside decisions. */
RATE_API int rate_store_shm_check(rate_store_t *store, char *err,
                                  size_t errlen);

/* Removes every key and policy record under the store's prefix (all of
 * them without one), shard by shard: every stored key that begins with
 * the prefix's bytes, so also those of a namespace whose prefix begins
 * with this one's (see rate_shm_options_t.prefix).
 *
 * Returns: RATE_OK once all are removed.
 *
 * Errors: RATE_EINVAL for a NULL store or one that is not a shared-memory
 * store; RATE_ETIMEDOUT, or RATE_ESTORE, when a shard's or the records'
 * lock cannot be taken (the shards before it are already emptied);
 * RATE_ECORRUPT for a damaged shard, after dropping what it can of the
 * others.
 *
 * Ownership: store is borrowed; nothing is kept.
 *
 * Thread-safe: yes. */
RATE_API int rate_store_shm_drop(rate_store_t *store);

#ifdef __cplusplus
}
#endif
#endif /* RATELIMIT_SHM_H */
