/* SPDX-License-Identifier: MIT */
/*
 * The fair table itself (table.h has its layout): its size and the
 * handle's views of its parts; making it in a process, in the caller's
 * memory or in a file shared by processes (under flock, so that one
 * process makes it and the others find it whole); checking a header
 * found there before anything is read through it; the table's one lock,
 * robust on a shared table and waited for a slice at a time; and the
 * repair that rebuilds every index from the entries and seats after a
 * process died holding that lock.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "index.h"
#include "table.h"
#include "vtime.h"

static size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }

size_t rate__ft_size(unsigned slots, unsigned queue_max)
{
    size_t q = (size_t)slots * queue_max;
    return align64(sizeof(fhdr_t)) + align64((size_t)slots * sizeof(fslot_t)) +
           align64((size_t)slots * 2 * sizeof(uint32_t)) +
           align64(q * sizeof(uint16_t)) + q * sizeof(fwait_t);
}

/* The handle's views of the table's parts, from its checked sizes. */
void rate__ft_bind(rate_fair_t *f, unsigned slots, unsigned queue_max)
{
    char *p = (char *)f->h + align64(sizeof(fhdr_t));
    size_t n = slots, q = n * queue_max;
    f->slots = slots;
    f->qmax = queue_max;
    f->slot = (fslot_t *)(void *)p;
    p += align64(n * sizeof(fslot_t));
    f->aheap = (uint32_t *)(void *)p;
    f->wheap = f->aheap + n;
    p += align64(n * 2 * sizeof(uint32_t));
    f->ring = (uint16_t *)(void *)p;
    p += align64(q * sizeof(uint16_t));
    f->wait = (fwait_t *)(void *)p;
}

int rate__ft_init(fhdr_t *h, unsigned slots, unsigned queue_max,
                  size_t size, bool pshared)
{
    pthread_mutexattr_t ma;
    h->slots = slots;
    h->queue_max = queue_max;
    h->size = size;
    if (getrandom(&h->seed, sizeof h->seed, 0) != (ssize_t)sizeof h->seed)
        h->seed = rate_clock_monotonic_ns() ^ (uint64_t)getpid();
    if (pthread_mutexattr_init(&ma) != 0)
        return RATE_ENOMEM;
    if (pshared) { /* a process may die holding it */
        pthread_mutexattr_setrobust(&ma, PTHREAD_MUTEX_ROBUST);
        pthread_mutexattr_setpshared(&ma, PTHREAD_PROCESS_SHARED);
    }
    int rc = pthread_mutex_init(&h->mu, &ma);
    pthread_mutexattr_destroy(&ma);
    return rc != 0 ? RATE_ENOMEM : RATE_OK;
}

#ifdef __GLIBC__
#define LOCK_WORD(mu) ((uint32_t)__atomic_load_n(&(mu)->__data.__lock, \
                                                 __ATOMIC_RELAXED))
#define LOCK_KIND(mu) __atomic_load_n(&(mu)->__data.__kind, __ATOMIC_RELAXED)
#else
#define LOCK_WORD(mu) 0u
#endif

/* The type glibc gives the lock a shared table is made with. */
int rate__ft_lock_kind(void)
{
    int kind = 0;
#ifdef __GLIBC__
    pthread_mutexattr_t ma;
    pthread_mutex_t probe;
    if (pthread_mutexattr_init(&ma) != 0)
        return -1;
    pthread_mutexattr_setrobust(&ma, PTHREAD_MUTEX_ROBUST);
    pthread_mutexattr_setpshared(&ma, PTHREAD_PROCESS_SHARED);
    if (pthread_mutex_init(&probe, &ma) == 0) {
        kind = probe.__data.__kind;
        pthread_mutex_destroy(&probe);
    }
    pthread_mutexattr_destroy(&ma);
#endif
    return kind;
}

/* Whether a shared table's lock looks held by no live thread: its word
 * names no thread, or this one (which never takes it twice), or one that
 * does not exist.  A robust lock's owner that died is marked so by the
 * kernel before its id is gone, and the next try takes it (EOWNERDEAD):
 * a word like this one was written by someone else. */
static bool lock_orphaned(pthread_mutex_t *mu)
{
    uint32_t word = LOCK_WORD(mu);
    if (word == 0 || (word & FUTEX_OWNER_DIED) != 0)
        return false;
    pid_t tid = (pid_t)(word & FUTEX_TID_MASK);
    return tid == 0 || tid == gettid() || (kill(tid, 0) != 0 && errno == ESRCH);
}

/* The lock's word and how often it was taken: while neither changes,
 * nobody took it. */
static uint64_t lock_sample(rate_fair_t *f)
{
    return (uint64_t)LOCK_WORD(&f->h->mu) << 32 |
           (uint32_t)__atomic_load_n(&f->h->holds, __ATOMIC_RELAXED);
}

/* Waits for a shared table's lock that is held: a pthread result (0,
 * EOWNERDEAD, ...), or RATE_ECORRUPT for a lock held by no live thread,
 * RATE_ETIMEDOUT once the fair clock reads `deadline` or the lock has
 * not changed hands for LOCK_STALL_NS (then remembered: the next wait
 * that finds it so gives up at once). */
static int lock_wait(rate_fair_t *f, uint64_t deadline)
{
    pthread_mutex_t *mu = &f->h->mu;
    uint64_t seen = lock_sample(f), since = now_of(f);
    if (lock_orphaned(mu))
        return RATE_ECORRUPT;
    if (seen >> 32 != 0 && seen == atomic_load(&f->stuck))
        return RATE_ETIMEDOUT;
    uint64_t slice = f->own_clock ? POLL_NS : LOCK_SLICE_NS;
    for (;;) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        uint64_t at = (uint64_t)ts.tv_sec * RATE_NS_PER_S +
                      (uint64_t)ts.tv_nsec + slice;
        ts.tv_sec = (time_t)(at / RATE_NS_PER_S);
        ts.tv_nsec = (long)(at % RATE_NS_PER_S);
        int rc = pthread_mutex_timedlock(mu, &ts);
        if (rc != ETIMEDOUT)
            return rc;
        if (lock_orphaned(mu))
            return RATE_ECORRUPT;
        uint64_t now = now_of(f), cur = lock_sample(f);
        if (now >= deadline)
            return RATE_ETIMEDOUT;
        if (cur != seen) {
            seen = cur;
            since = now;
        } else if (now - since >= LOCK_STALL_NS) {
            atomic_store(&f->stuck, cur);
            return RATE_ETIMEDOUT;
        }
    }
}

/* Takes the table's lock, waiting at most until the fair clock reads
 * `deadline` (a shared table's; UINT64_MAX: no deadline).  A process
 * that died holding it may have left a heap or list half changed, so
 * the lock is made consistent again and the table's indexes are rebuilt
 * from its entries (table_repair).  Returns RATE_OK (held); RATE_ESTORE
 * for a lock the system refuses (unrecoverable); on a shared table,
 * RATE_ECORRUPT for a lock of another type than the one made here
 * (glibc's priority paths would assert on what they find) or held by no
 * live thread, RATE_ETIMEDOUT as lock_wait. */
int rate__ft_lock_by(rate_fair_t *f, uint64_t deadline)
{
    pthread_mutex_t *mu = &f->h->mu;
    bool shared = f->mapped || f->borrowed;
    int rc;
#ifdef __GLIBC__
    if (shared && LOCK_KIND(mu) != f->lock_kind)
        return RATE_ECORRUPT;
#endif
    if (!shared)
        rc = pthread_mutex_lock(mu);
    else if ((rc = pthread_mutex_trylock(mu)) == EBUSY)
        rc = lock_wait(f, deadline);
    if (rc < 0)
        return rc;
    if (rc == EOWNERDEAD) {
        rc = pthread_mutex_consistent(mu);
        if (rc != 0) { /* not held on failure: the lock is unrecoverable */
            pthread_mutex_unlock(mu);
            return RATE_ESTORE;
        }
        if (rate__ft_repair(f) != RATE_OK) {
            pthread_mutex_unlock(mu);
            return RATE_ECORRUPT;
        }
    }
    if (rc != 0)
        return RATE_ESTORE;
    if (shared)
        __atomic_store_n(&f->h->holds, f->h->holds + 1, __ATOMIC_RELAXED);
    return RATE_OK;
}

int rate__ft_lock(rate_fair_t *f)
{
    return rate__ft_lock_by(f, UINT64_MAX);
}

void rate__ft_unlock(rate_fair_t *f)
{
    pthread_mutex_unlock(&f->h->mu);
}

/* Whether len bytes holding the header copied to *h (taken once: the
 * checks and the handle read the copy, never the table) are a fair table
 * of slots and queue_max, exactly len bytes long (a file) or at most:
 * RATE_OK, or RATE_EINVAL with the reason in why. */
int rate__ft_header_check(const fhdr_t *h, size_t len, bool exact,
                          unsigned slots, unsigned queue_max, int lock_kind,
                          char *why, size_t whylen)
{
    size_t need = rate__ft_size(slots, queue_max);
    if (len < sizeof *h) {
        snprintf(why, whylen, "%zu bytes: too short to be a fair table", len);
        return RATE_EINVAL;
    }
    if ((h->magic & MAGIC_STEM) != (FAIR_MAGIC & MAGIC_STEM)) {
        snprintf(why, whylen, "%s", "not a fair table (no fair table's "
                                    "mark at its start)");
        return RATE_EINVAL;
    }
    if (h->magic != FAIR_MAGIC) {
        char v[9] = "";
        memcpy(v, &h->magic, 8);
        for (int i = 0; i < 8; i++)
            v[i] = v[i] >= 0x20 && v[i] < 0x7f ? v[i] : '?';
        snprintf(why, whylen, "a fair table of another version ('%s'; this "
                 "library reads 'rrfairv2')", v);
        return RATE_EINVAL;
    }
    if (h->slots == 0 || h->slots > RATE_FAIR_SLOTS_MAX || h->queue_max == 0 ||
        h->queue_max > RATE_FAIR_QUEUE_MAX) {
        snprintf(why, whylen, "its header is damaged (slots %u, queue_max %u)",
                 h->slots, h->queue_max);
        return RATE_EINVAL;
    }
    if (h->slots != slots || h->queue_max != queue_max) {
        snprintf(why, whylen, "made with other slots or queue_max (%u and %u; "
                 "this fair limit's are %u and %u)", h->slots, h->queue_max,
                 slots, queue_max);
        return RATE_EINVAL;
    }
    if (h->size != need) {
        snprintf(why, whylen, "its header is damaged (a size of %llu bytes, "
                 "where its slots and queue_max take %zu)",
                 (unsigned long long)h->size, need);
        return RATE_EINVAL;
    }
    if (exact ? len != need : len < need) {
        snprintf(why, whylen, "%zu bytes, where its table takes %zu "
                 "(truncated?)", len, need);
        return RATE_EINVAL;
    }
#ifdef __GLIBC__
    if (h->mu.__data.__kind != lock_kind) {
        snprintf(why, whylen, "%s", "its lock is damaged (not of the type "
                                    "this library makes)");
        return RATE_EINVAL;
    }
#else
    (void)lock_kind;
#endif
    return RATE_OK;
}

/* Opens or makes the shared table at path, under flock so that one
 * process makes it and the others find it whole. */
int rate__ft_open(rate_fair_t *f, const char *path, unsigned slots,
                  unsigned queue_max, char *err, size_t errlen)
{
    size_t size = rate__ft_size(slots, queue_max);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) {
        char m[300];
        snprintf(m, sizeof m, "shm_path '%.200s': %s", path, strerror(errno));
        set_err(err, errlen, "%s", m);
        return RATE_ESTORE;
    }
    int rc = RATE_OK;
    struct stat st;
    void *p = MAP_FAILED;
    char why[200] = "";
    bool make = false;
    if (flock(fd, LOCK_EX) != 0 || fstat(fd, &st) != 0) {
        snprintf(why, sizeof why, "%s", strerror(errno));
        rc = RATE_ESTORE;
    } else if (st.st_size == 0) {
        make = true;
        if (ftruncate(fd, (off_t)size) != 0) {
            snprintf(why, sizeof why, "%s", strerror(errno));
            rc = RATE_ESTORE;
        }
    } else {
        fhdr_t hd;
        memset(&hd, 0, sizeof hd);
        ssize_t n = pread(fd, &hd, sizeof hd, 0);
        /* all zero where its mark goes: a maker died before writing it */
        make = n == (ssize_t)sizeof hd && hd.magic == 0 &&
               (uint64_t)st.st_size == size;
        if (!make)
            rc = rate__ft_header_check(&hd, (size_t)st.st_size, true, slots,
                                       queue_max, f->lock_kind, why,
                                       sizeof why);
    }
    if (rc == RATE_OK) {
        p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (p == MAP_FAILED) {
            snprintf(why, sizeof why, "%s", strerror(errno));
            rc = RATE_ESTORE;
        }
    }
    if (rc == RATE_OK && make) {
        fhdr_t *h = p;
        memset(p, 0, size);
        rc = rate__ft_init(h, slots, queue_max, size, true);
        if (rc == RATE_OK)
            __atomic_store_n(&h->magic, FAIR_MAGIC, __ATOMIC_RELEASE);
        else
            snprintf(why, sizeof why, "%s", "its lock could not be made");
    }
    flock(fd, LOCK_UN);
    close(fd);
    if (rc != RATE_OK) {
        if (p != MAP_FAILED)
            munmap(p, size);
        char m[500];
        snprintf(m, sizeof m, "shm_path '%.200s': %s", path, why);
        set_err(err, errlen, "%s", m);
        return rc;
    }
    f->h = p;
    f->size = size;
    f->mapped = true;
    return RATE_OK;
}

/* A seat taken, by its ticket (table_repair's sort). */
typedef struct seat_order {
    uint64_t ticket;
    uint32_t seat;
} seat_order_t;

static int seat_order_cmp(const void *a, const void *b)
{
    uint64_t x = ((const seat_order_t *)a)->ticket;
    uint64_t y = ((const seat_order_t *)b)->ticket;
    return x < y ? -1 : x > y;
}

/* Rebuilds the table's indexes from its entries and seats, after a
 * process died holding the lock (a scan of the table, that once): each
 * queue in ticket order (its arrival order), the active set as the
 * entries that asked in this period or the one before or have waiters.
 * Each queue is sorted apart from the table, then written to it. */
int rate__ft_repair(rate_fair_t *f)
{
    fhdr_t *h = f->h;
    uint32_t n = f->slots, q = f->qmax;
    uint64_t epoch = LD(h->epoch);
    seat_order_t order[RATE_FAIR_QUEUE_MAX];
    int rc = RATE_OK;
    h->nactive = h->nqueues = 0;
    h->lhead = h->ltail = NIL;
    h->total_w = h->queued = h->top_ticket = 0;
    ST(h->waiting, 0);
    ST(h->room_until, 0);
    for (uint32_t i = 0; i < n; i++) {
        fslot_t *sl = &f->slot[i];
        size_t b = (size_t)i * q;
        uint32_t cnt = 0;
        sl->apos = sl->wpos = sl->lprev = sl->lnext = NIL;
        sl->qpermits = 0;
        for (uint32_t seat = 0; seat < q; seat++) {
            const fwait_t *w = &f->wait[b + seat];
            uint64_t ticket = LD(w->ticket);
            if (ticket == 0)
                continue;
            order[cnt++] = (seat_order_t){ticket, seat};
            sl->qpermits += LD(w->permits);
        }
        qsort(order, cnt, sizeof order[0], seat_order_cmp);
        for (uint32_t j = 0; j < cnt; j++)
            f->ring[b + j] = (uint16_t)order[j].seat;
        sl->qhead = 0;
        sl->qlen = cnt;
        h->queued += sl->qpermits;
        ST(h->waiting, h->waiting + cnt);
    }
    const heap_t hp = aheap(f);
    for (uint32_t i = 0; i < n && rc == RATE_OK; i++) {
        fslot_t *sl = &f->slot[i];
        if (sl->hash == 0 || (sl->epoch + 1 < epoch && sl->qlen == 0))
            continue;
        if ((rc = rate__ft_heap_push(f, &hp, sl)) == RATE_OK)
            rc = rate__ft_list_append(f, sl);
        h->total_w += sl->weight;
    }
    if (rc == RATE_OK)
        rc = rate__ft_vtime_update(f);
    for (uint32_t i = 0; i < n && rc == RATE_OK; i++)
        if (f->slot[i].qlen > 0)
            rc = rate__ft_retag(f, &f->slot[i]);
    return rc;
}
