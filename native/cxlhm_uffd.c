/*
 * cxlhm_uffd.c - the load/store window: the HDM range as plain anonymous memory,
 * served by a native userfaultfd fault-service thread.
 *
 * What lives where
 *   window   `capacity` bytes, MAP_NORESERVE, registered MISSING | WP. A block of it
 *            is either absent (no pages) or present whole (installed by one
 *            UFFDIO_COPY). Present pages are the device DRAM the host reads directly.
 *   side     n_slots blocks, registered too but never touched by anyone: the recency
 *            sampler parks a page of a block here (UFFDIO_MOVE, no copy) so that the
 *            next access to it faults and tells the firmware the block is in use.
 *   staging  a few blocks of ordinary (unregistered) memory: SSD reads land here and
 *            UFFDIO_COPY installs them. Reads must never target registered memory:
 *            a missing page there would fault to this very thread, which is busy
 *            waiting for the read - a deadlock.
 *
 * Who does what
 *   One service thread (no Python, no GIL) owns the window's physical state: it
 *   reads fault messages, installs and evicts blocks, runs prefetches, flushes and
 *   the sampler. Decisions (which slot, which victim, hits, hints, background jobs)
 *   come from the compiled firmware - a numba @cfunc over the block table and the
 *   policy state - always called with `lock` held. Python threads only call the
 *   firmware (through cxlhm_window_firmware, which takes the lock itself, so Python
 *   never holds the lock while it could wait for the GIL) and queue requests
 *   (prefetch, flush) that the service thread carries out.
 *
 * Dirty tracking (uffd-wp)
 *   Blocks are installed write-protected. The first store to a granule takes a WP
 *   fault; the service thread records the granule in the slot's bitmap and lifts the
 *   protection of that granule only. Eviction and flush write back exactly the
 *   recorded granules. Every unprotect goes through this thread, so the bitmap is a
 *   complete record of what may have been written.
 *
 * Huge pages
 *   UFFDIO_COPY maps anonymous memory with 4 KiB pages only (its huge-page path is
 *   hugetlbfs'), where ordinary memory gets transparent huge pages. So once a prefetch
 *   has installed every block of a 2 MiB-aligned region, clean, the region is rebuilt
 *   as one huge page with MADV_COLLAPSE (see "huge pages" below). Eviction, a first
 *   store and the sampler split it again: the kernel splits a PMD when part of it is
 *   zapped, unprotected or moved.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <linux/fs.h>
#include <linux/userfaultfd.h>

#include "cxlhm_native.h"
#include "cxlhm_uffd.h"

/* ------------------------------------------------------------------ kernel ABI
 * The installed uapi headers are from Linux 6.1; these arrived later (6.6-6.8).
 * Values are the kernel's ABI, so defining them here is safe; the kernel says at
 * UFFDIO_API time whether it supports them. */
#ifndef UFFD_FEATURE_POISON
#define UFFD_FEATURE_POISON (1 << 14)
#endif
#ifndef UFFD_FEATURE_MOVE
#define UFFD_FEATURE_MOVE (1 << 16)
#endif
#ifndef _UFFDIO_POISON
#define _UFFDIO_POISON (0x08)
struct uffdio_poison {
    struct uffdio_range range;
    __u64 mode;
    __s64 updated;
};
#define UFFDIO_POISON _IOWR(UFFDIO, _UFFDIO_POISON, struct uffdio_poison)
#endif
#ifndef _UFFDIO_MOVE
#define _UFFDIO_MOVE (0x05)
struct uffdio_move {
    __u64 dst;
    __u64 src;
    __u64 len;
    __u64 mode;
    __s64 move;
};
#define UFFDIO_MOVE _IOWR(UFFDIO, _UFFDIO_MOVE, struct uffdio_move)
#define UFFDIO_MOVE_MODE_DONTWAKE ((__u64)1 << 0)
#endif
#ifndef PAGEMAP_SCAN /* Linux 6.7 */
struct page_region {
    __u64 start;
    __u64 end;
    __u64 categories;
};
struct pm_scan_arg {
    __u64 size, flags, start, end, walk_end, vec, vec_len, max_pages;
    __u64 category_inverted, category_mask, category_anyof_mask, return_mask;
};
#define PAGE_IS_PRESENT (1 << 3)
#define PAGEMAP_SCAN _IOWR('f', 16, struct pm_scan_arg)
#endif
#define PAGE_IS_HUGE (1 << 6) /* PAGEMAP_SCAN: mapped by a PMD */
#ifndef MADV_COLLAPSE /* Linux 6.1 */
#define MADV_COLLAPSE 25
#endif
#ifndef USERFAULTFD_IOC_NEW
#define USERFAULTFD_IOC_NEW _IO(0xAA, 0x00)
#endif
#ifndef UFFD_USER_MODE_ONLY
#define UFFD_USER_MODE_ONLY 1
#endif

/* ------------------------------------------------------------------ firmware ABI
 * The operations and answers are declared in cxlhm_uffd.h. */
typedef int64_t (*firmware_fn)(int64_t *ctx, int64_t op, int64_t *args, int64_t *out);

/* ------------------------------------------------------------------ counters */
#define WINDOW_STATS(X)                                                                 \
    X(faults)             /* userfaultfd page-fault messages received */                \
    X(missing_faults)     /* ... on absent pages */                                     \
    X(wp_faults)          /* ... first stores to write-protected (clean) granules */    \
    X(sample_faults)      /* ... on blocks the sampler had parked: an access signal */  \
    X(coalesced_faults)   /* ... on blocks installed meanwhile (served once) */         \
    X(uffdio_copies)      /* UFFDIO_COPY calls that installed a block */                \
    X(bytes_installed)                                                                  \
    X(fills)              /* blocks read from the SSD for a fault */                    \
    X(prefetch_installed) /* blocks installed ahead of use */                           \
    X(prefetch_dropped)   /* prefetch requests given up (no evictable slot) */         \
    X(evictions)                                                                        \
    X(writebacks)         /* dirty blocks written back (eviction or flush) */           \
    X(writeback_bytes)    /* bytes written back: only the written granules */           \
    X(samples)            /* blocks parked by the sampler */                            \
    X(sample_skips)       /* blocks the sampler could not park (pinned pages, ...) */   \
    X(sampler_ns)         /* service-thread time spent parking blocks */                \
    X(sample_restore_ns)  /* ... and bringing parked blocks back */                     \
    X(poisoned)           /* blocks poisoned after an SSD read error */                 \
    X(media_errors)       /* failed SSD I/Os */                                         \
    X(batches)            /* install batches (one io_uring batch of fills each) */   \
    X(huge_collapses)     /* prefetched 2 MiB regions rebuilt as one huge page */      \
    X(collapse_failures)  /* ... the kernel could not (no huge page free, busy) */      \
    X(collapse_races)     /* blocks stored to while their region was being collapsed */ \
    X(collapse_ns)        /* service-thread time spent collapsing regions */

#define AS_ENUM(name) STAT_##name,
#define AS_NAME(name) #name,
enum { WINDOW_STATS(AS_ENUM) STAT_COUNT };
static const char *const stat_names[] = {WINDOW_STATS(AS_NAME)};

#define STAT_ADD(w, name, v) __atomic_fetch_add(&(w)->stats[STAT_##name], (int64_t)(v), __ATOMIC_RELAXED)

/* ------------------------------------------------------------------ block maps
 * block -> uint64, open addressing with linear probing; removal leaves a tombstone.
 * Used by the service thread only. */
#define MAP_EMPTY (-1)
#define MAP_GONE (-2)

struct blockmap {
    int64_t *keys;
    uint64_t *values;
    int64_t cap, used; /* used: live entries and tombstones */
};

static inline int64_t map_home(const struct blockmap *m, int64_t block)
{
    return (int64_t)(((uint64_t)block * 0x9E3779B97F4A7C15ULL >> 17) & (uint64_t)(m->cap - 1));
}

static int64_t map_find(const struct blockmap *m, int64_t block)
{
    if (m->cap == 0)
        return -1;
    for (int64_t i = map_home(m, block);; i = (i + 1) & (m->cap - 1)) {
        if (m->keys[i] == block)
            return i;
        if (m->keys[i] == MAP_EMPTY)
            return -1;
    }
}

static int map_grow(struct blockmap *m, int64_t cap)
{
    struct blockmap n = {calloc((size_t)cap, 8), calloc((size_t)cap, 8), cap, 0};
    if (!n.keys || !n.values) {
        free(n.keys);
        free(n.values);
        return -ENOMEM;
    }
    for (int64_t i = 0; i < cap; i++)
        n.keys[i] = MAP_EMPTY;
    for (int64_t i = 0; i < m->cap; i++) {
        if (m->keys[i] < 0)
            continue;
        int64_t j = map_home(&n, m->keys[i]);
        while (n.keys[j] != MAP_EMPTY)
            j = (j + 1) & (cap - 1);
        n.keys[j] = m->keys[i];
        n.values[j] = m->values[i];
        n.used++;
    }
    free(m->keys);
    free(m->values);
    *m = n;
    return 0;
}

static int map_put(struct blockmap *m, int64_t block, uint64_t value)
{
    int64_t i = map_find(m, block);
    if (i >= 0) {
        m->values[i] = value;
        return 0;
    }
    if (2 * (m->used + 1) > m->cap) {
        int64_t cap = 64;
        while (cap < 4 * (m->used + 1))
            cap *= 2;
        if (map_grow(m, cap) < 0)
            return -ENOMEM;
    }
    for (i = map_home(m, block); m->keys[i] >= 0; i = (i + 1) & (m->cap - 1))
        ;
    if (m->keys[i] == MAP_EMPTY)
        m->used++;
    m->keys[i] = block;
    m->values[i] = value;
    return 0;
}

static void map_drop(struct blockmap *m, int64_t block)
{
    int64_t i = map_find(m, block);
    if (i >= 0)
        m->keys[i] = MAP_GONE;
}

static void map_free(struct blockmap *m)
{
    free(m->keys);
    free(m->values);
}

/* ------------------------------------------------------------------ state */
enum { WHERE_NONE, WHERE_WINDOW, WHERE_SIDE };

#define MAX_MSGS 64
#define MAX_PENDING 1024

struct pending_miss {
    int64_t block;
    uint64_t write_granules; /* granules some faulting thread wants to store to */
};

/* One block being installed in a batch, and the victim its slot came from. */
struct install {
    int64_t block, slot, owner;
    uint64_t write_granules;
    int prefetch;
    int64_t victim;          /* block evicted to make room, or -1 */
    uint8_t victim_where;    /* WHERE_WINDOW or WHERE_SIDE */
    uint64_t victim_dirty, victim_park_off;
    int64_t op_first, op_count; /* the victim's write-back ops in w->ops */
    int protect_errno;
    int fill_ok;
};

struct cxlhm_window {
    struct cxlhm_window_params p;
    firmware_fn firmware;
    char *base, *side;
    uint64_t side_bytes;
    int uffd, pagemap_fd, wake_fd;
    uint64_t features;
    int user_mode_only, can_move, can_poison;
    struct cxlhm_ring *ring;
    int64_t t0_ns;
    int n_granules;
    uint64_t all_granules;

    /* per slot, service thread only: where the slot's block physically is */
    uint8_t *where;
    uint64_t *dirty;       /* written granules since the last write-back */
    int64_t *block_of;
    int64_t *signal_ns;    /* last access signal: install, first write, sampled access */
    int64_t *installed_ns;
    uint64_t *park_off;    /* the parked part of a WHERE_SIDE slot's block */
    int64_t sample_hand, next_sample_ns;
    uint64_t park_seq;

    /* service thread scratch */
    struct uffd_msg msgs[MAX_MSGS];
    struct pending_miss pending[MAX_PENDING];
    int n_pending;
    struct install *batch;
    struct cxlhm_io *ops;
    int64_t *res;
    int64_t ops_cap;
    int64_t *sample_slots;
    uint8_t *flushing;
    int64_t *stranded;     /* blocks kept in memory because their write-back failed */
    int64_t n_stranded, stranded_cap;

    /* huge pages, service thread only (huge is read by any thread) */
    int huge;              /* 1: collapse prefetched regions; 0: off; -errno: the kernel refused */
    int collapsed_once;
    char *region_ref;      /* a region's bytes before its collapse */
    int64_t *region_slots; /* slots of the blocks of the region being collapsed */
    uint64_t *promote_q;   /* regions (HPA) whose blocks a prefetch installed: collapse candidates */
    int64_t pq_head, pq_tail;

    /* crash consistency, service thread only (see "integrity log" below) */
    struct blockmap sums;    /* block -> xxh3-64 of its bytes on the SSD */
    struct blockmap poisoned; /* blocks whose bytes are lost (value unused) */
    uint8_t *log_buf;        /* frame header + records of the batch being logged */
    size_t log_len, log_cap;

    /* shared with Python threads: guarded by lock */
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int64_t *q_block, *q_owner, *q_ticket;
    int64_t q_head, q_tail, q_cap;
    int64_t next_ticket, done_ticket;
    int64_t flush_seq, flush_done_seq, flush_result;
    int background_pending; /* a hint arrived: ask the policy for jobs */
    int idle, stopping, stopped, failed_errno;
    char last_error[256];
    int64_t stats[STAT_COUNT];
    pthread_t thread;
    int thread_started;
};

static inline int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void set_error(struct cxlhm_window *w, int err, const char *fmt, ...)
{
    char text[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&w->lock);
    snprintf(w->last_error, sizeof w->last_error, "%s: %s", text, strerror(err));
    pthread_mutex_unlock(&w->lock);
}

/* ------------------------------------------------------------------ integrity log
 * The window keeps the explicit mode's crash guarantee by writing the same log
 * (cxlhm/integrity.py has the format and the replay): a frame is a uint32 payload
 * length, the payload's CRC-32 and records of (kind, block, value), little-endian,
 * written with one write(2) - durable across a kill -9 once it returned.
 *   DIRTY b    before a store to a clean block b can land (WP fault or write miss):
 *              device DRAM is about to hold bytes of b newer than the SSD's
 *   SUM b s    before a write-back of b is submitted: the SSD is about to hold s
 *   POISON b r a fill of b did not match its checksum
 * After a crash, the replay poisons every block whose last record is DIRTY. */
typedef uint64_t (*hash_fn)(const void *data, size_t len);

static uint32_t crc_table[256];
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;

static void crc_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_table[i] = c;
    }
}

static uint32_t crc32_of(const uint8_t *p, size_t n)
{
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++)
        c = crc_table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
    return c ^ 0xFFFFFFFFu;
}

#define LOG_HEADER 8
#define LOG_RECORD 17

static inline int logging(struct cxlhm_window *w) { return w->p.log_fd > 0; }

/* Add one record to the frame being built; log_commit() writes it. */
static void log_add(struct cxlhm_window *w, char kind, int64_t block, uint64_t value, const char *text)
{
    if (!logging(w))
        return;
    size_t text_len = text ? strlen(text) : 0, need = w->log_len + LOG_RECORD + text_len;
    if (need > w->log_cap) {
        size_t cap = w->log_cap ? w->log_cap : 4096;
        while (cap < need)
            cap *= 2;
        uint8_t *b = realloc(w->log_buf, cap);
        if (!b)
            return; /* log_commit reports the record as lost */
        w->log_buf = b;
        w->log_cap = cap;
    }
    uint8_t *r = w->log_buf + w->log_len;
    r[0] = (uint8_t)kind;
    if (text)
        value = text_len;
    memcpy(r + 1, &block, 8);
    memcpy(r + 9, &value, 8);
    memcpy(r + LOG_RECORD, text, text_len);
    w->log_len = need;
}

/* Write the frame built so far, before the caller lets the event it records happen. A
 * log that cannot be written means the crash guarantee is gone: the window stops
 * evicting, like after a lost write-back. */
static void log_commit(struct cxlhm_window *w)
{
    if (!logging(w) || w->log_len <= LOG_HEADER)
        return;
    uint32_t len = (uint32_t)(w->log_len - LOG_HEADER), crc = crc32_of(w->log_buf + LOG_HEADER, len);
    memcpy(w->log_buf, &len, 4);
    memcpy(w->log_buf + 4, &crc, 4);
    ssize_t done = write(w->p.log_fd, w->log_buf, w->log_len);
    if (done != (ssize_t)w->log_len) {
        int err = done < 0 ? errno : ENOSPC;
        set_error(w, err, "appending to the integrity log failed; the window stops evicting");
        pthread_mutex_lock(&w->lock);
        w->failed_errno = err;
        pthread_mutex_unlock(&w->lock);
    }
    w->log_len = LOG_HEADER;
}

static void log_dirty_now(struct cxlhm_window *w, int64_t block)
{
    log_add(w, 'D', block, 0, NULL);
    log_commit(w);
}

/* Before a write-back of `block`, whose whole bytes are present (and write-protected)
 * at `addr`: a SUM record, and the checksum explicit mode and later fills verify. */
static void log_sum(struct cxlhm_window *w, int64_t block, uint64_t addr)
{
    if (!w->p.hash) {
        map_drop(&w->sums, block); /* no checksum: the block is not verified from now on */
        return;
    }
    uint64_t sum = ((hash_fn)w->p.hash)((const void *)addr, w->p.block_size);
    log_add(w, 'S', block, sum, NULL);
    if (map_put(&w->sums, block, sum) < 0)
        map_drop(&w->sums, block);
}

/* A write-back that did not complete: the SSD holds neither the old nor the new bytes,
 * and the newest are in memory only. */
static void log_lost_writeback(struct cxlhm_window *w, int64_t block)
{
    map_drop(&w->sums, block);
    log_dirty_now(w, block);
}

static inline uint64_t block_addr(struct cxlhm_window *w, int64_t block)
{
    return (uint64_t)w->base + (uint64_t)block * w->p.block_size;
}

static inline uint64_t side_addr(struct cxlhm_window *w, int64_t slot)
{
    return (uint64_t)w->side + (uint64_t)slot * w->p.block_size;
}

/* The device time policies read from bt.scalars (deadlines, pauses). Lock held. */
static inline void set_device_time(struct cxlhm_window *w)
{
    w->p.bt_scalars[w->p.now_index] = now_ns() - w->t0_ns;
}

/* Call the firmware with the lock held. */
static inline int64_t fw(struct cxlhm_window *w, int64_t op, int64_t a0, int64_t a1, int64_t a2, int64_t *out)
{
    int64_t args[8] = {a0, a1, a2, 0, 0, 0, 0, 0};
    int64_t scratch[8];
    return w->firmware(w->p.firmware_ctx, op, args, out ? out : scratch);
}

static int64_t fw_locked(struct cxlhm_window *w, int64_t op, int64_t a0, int64_t a1, int64_t a2)
{
    pthread_mutex_lock(&w->lock);
    set_device_time(w);
    int64_t r = fw(w, op, a0, a1, a2, NULL);
    pthread_mutex_unlock(&w->lock);
    return r;
}

/* ------------------------------------------------------------------ uffd helpers */

/* UFFDIO_COPY may copy part of the range and fail with EAGAIN (the address space
 * changed under it); the kernel reports the progress in .copy, so continue from there. */
static int uffd_copy(struct cxlhm_window *w, uint64_t dst, uint64_t src, uint64_t len, uint64_t mode)
{
    uint64_t done = 0;
    while (done < len) {
        struct uffdio_copy c = {.dst = dst + done, .src = src + done, .len = len - done, .mode = mode};
        if (ioctl(w->uffd, UFFDIO_COPY, &c) == 0)
            return 0;
        int err = errno;
        if (c.copy > 0)
            done += (uint64_t)c.copy;
        if (err != EAGAIN)
            return -err;
    }
    return 0;
}

/* Protecting never wakes anyone, and the kernel rejects WP together with DONTWAKE
 * (EINVAL): DONTWAKE only qualifies an unprotect. */
static int uffd_protect(struct cxlhm_window *w, uint64_t addr, uint64_t len, int protect, int wake)
{
    struct uffdio_writeprotect wp = {
        .range = {addr, len},
        .mode = protect ? UFFDIO_WRITEPROTECT_MODE_WP : (wake ? 0 : UFFDIO_WRITEPROTECT_MODE_DONTWAKE),
    };
    while (ioctl(w->uffd, UFFDIO_WRITEPROTECT, &wp) != 0) {
        if (errno != EAGAIN)
            return -errno;
    }
    return 0;
}

static void uffd_wake(struct cxlhm_window *w, uint64_t addr, uint64_t len)
{
    struct uffdio_range r = {addr, len};
    ioctl(w->uffd, UFFDIO_WAKE, &r);
}

/* UFFDIO_MOVE remaps the pages themselves (no copy). Returns bytes moved or -errno. */
static int64_t uffd_move(struct cxlhm_window *w, uint64_t dst, uint64_t src, uint64_t len)
{
    uint64_t done = 0;
    while (done < len) {
        struct uffdio_move m = {.dst = dst + done, .src = src + done, .len = len - done,
                                .mode = UFFDIO_MOVE_MODE_DONTWAKE};
        if (ioctl(w->uffd, UFFDIO_MOVE, &m) == 0)
            return (int64_t)len;
        int err = errno;
        if (m.move > 0)
            done += (uint64_t)m.move;
        if (err != EAGAIN)
            return done ? (int64_t)done : -err;
    }
    return (int64_t)len;
}

/* Give the faulting threads of a block an error instead of wrong bytes: their
 * access raises SIGBUS, like a load from poisoned device memory. */
static void poison(struct cxlhm_window *w, int64_t block)
{
    if (!w->can_poison)
        return; /* the faulting thread stays blocked; last_error says why */
    struct uffdio_poison p = {.range = {block_addr(w, block), w->p.block_size}, .mode = 0};
    ioctl(w->uffd, UFFDIO_POISON, &p);
    STAT_ADD(w, poisoned, 1);
}

/* Iterate maximal runs of granules whose bit in `mask` equals `want`. */
static int next_run(uint64_t mask, int n, int from, int want, int *start, int *len)
{
    int g = from;
    while (g < n && (int)((mask >> g) & 1) != want)
        g++;
    if (g >= n)
        return 0;
    int e = g;
    while (e < n && (int)((mask >> e) & 1) == want)
        e++;
    *start = g;
    *len = e - g;
    return 1;
}

/* Append write-back ops for the dirty granules of `block` whose bytes are at `src`. */
static int64_t add_writeback_ops(struct cxlhm_window *w, int64_t n_ops, uint64_t src, int64_t block, uint64_t dirty)
{
    uint64_t gran = w->p.granule;
    int g = 0, s, len;
    while (next_run(dirty, w->n_granules, g, 1, &s, &len)) {
        struct cxlhm_io *op = &w->ops[n_ops++];
        op->buf = (void *)(src + (uint64_t)s * gran);
        op->len = (uint64_t)len * gran;
        op->offset = (uint64_t)block * w->p.block_size + (uint64_t)s * gran;
        op->write = 1;
        g = s + len;
    }
    return n_ops;
}

/* Run ops[first, first+n) as one io_uring batch. */
static void run_io(struct cxlhm_window *w, int64_t first, int64_t n)
{
    if (n <= 0)
        return;
    int rc = cxlhm_io_batch(w->ring, w->p.ssd_fd, &w->ops[first], (int)n, &w->res[first]);
    if (rc < 0) /* the ring itself failed: report every op as failed */
        for (int64_t i = first; i < first + n; i++)
            w->res[i] = rc;
}

static int ops_ok(struct cxlhm_window *w, int64_t first, int64_t n, int *err)
{
    for (int64_t i = first; i < first + n; i++) {
        if (w->res[i] != (int64_t)w->ops[i].len) {
            *err = w->res[i] < 0 ? (int)-w->res[i] : EIO;
            STAT_ADD(w, media_errors, 1);
            return 0;
        }
    }
    return 1;
}

/* ------------------------------------------------------------------ parked blocks */

/* Bring the parked part [off, off+len) of a block back from the side area. Written
 * granules are moved back (their pages were writable anyway); clean granules are
 * copied back write-protected, because UFFDIO_MOVE does not carry the uffd-wp bit: a
 * moved-back clean page would be writable at once, and a store landing before we
 * re-protected it would never be written back. Parking one page per sample keeps
 * that copy small. Waiters are woken once the block is whole again. The caller
 * updates where[]. */
static void restore_parked(struct cxlhm_window *w, int64_t slot, int64_t block, uint64_t dirty,
                           uint64_t off, uint64_t len)
{
    uint64_t gran = w->p.granule, win = block_addr(w, block), side = side_addr(w, slot);
    int64_t t = now_ns();
    for (uint64_t pos = off; pos < off + len;) {
        int written = (int)((dirty >> (pos / gran)) & 1);
        uint64_t end = (pos / gran + 1) * gran; /* extend over granules of the same kind */
        while (end < off + len && (int)((dirty >> (end / gran)) & 1) == written)
            end += gran;
        if (end > off + len)
            end = off + len;
        uint64_t n = end - pos;
        if (written) {
            int64_t moved = uffd_move(w, win + pos, side + pos, n);
            /* a page that cannot move (pinned) is copied instead, writable like the rest */
            for (uint64_t p = moved > 0 ? (uint64_t)moved : 0; p < n; p += 4096)
                uffd_copy(w, win + pos + p, side + pos + p, 4096, UFFDIO_COPY_MODE_DONTWAKE);
        } else {
            int rc = uffd_copy(w, win + pos, side + pos, n, UFFDIO_COPY_MODE_WP | UFFDIO_COPY_MODE_DONTWAKE);
            if (rc < 0)
                set_error(w, -rc, "restoring clean pages of parked block %lld", (long long)block);
        }
        pos = end;
    }
    madvise((void *)(side + off), len, MADV_DONTNEED); /* copied pages stay behind; drop them */
    uffd_wake(w, win, w->p.block_size);
    STAT_ADD(w, sample_restore_ns, now_ns() - t);
}

/* The slot's own block, parked: make it whole in the window again. */
static void unpark(struct cxlhm_window *w, int64_t slot)
{
    restore_parked(w, slot, w->block_of[slot], w->dirty[slot], w->park_off[slot], w->p.sample_bytes);
    w->where[slot] = WHERE_WINDOW;
}

/* ------------------------------------------------------------------ install batch */

static void strand(struct cxlhm_window *w, int64_t block)
{
    if (w->n_stranded == w->stranded_cap) {
        int64_t cap = w->stranded_cap ? 2 * w->stranded_cap : 16;
        int64_t *p = realloc(w->stranded, (size_t)cap * sizeof *p);
        if (!p)
            return;
        w->stranded = p;
        w->stranded_cap = cap;
    }
    w->stranded[w->n_stranded++] = block;
}

/* Do the bytes a fill read for `block` (at `addr`) match the checksum of its last
 * write-back? A mismatch poisons the block for good (logged, like explicit mode's). */
static int verified(struct cxlhm_window *w, int64_t block, uint64_t addr)
{
    int64_t i = map_find(&w->sums, block);
    if (i < 0 || !w->p.hash)
        return 1;
    if (((hash_fn)w->p.hash)((const void *)addr, w->p.block_size) == w->sums.values[i])
        return 1;
    map_put(&w->poisoned, block, 0);
    log_add(w, 'P', block, 0, "checksum mismatch on SSD read");
    log_commit(w);
    return 0;
}

/*
 * Install the blocks of w->batch[0, n), already placed by the firmware (their
 * slots are BUSY, victims unmapped from the block table):
 *   1. victims: write-protect (stores now wait in a WP fault), write back the
 *      written granules, then drop the pages - so resident bytes never exceed
 *      the DRAM budget, even inside a batch;
 *   2. fills: one io_uring batch SSD -> staging;
 *   3. one UFFDIO_COPY per block, write-protected (clean) except the granules a
 *      faulting thread is about to store to; then wake the block's waiters.
 */
static void install_batch(struct cxlhm_window *w, int n)
{
    uint64_t bs = w->p.block_size;
    int64_t n_ops = 0;
    STAT_ADD(w, batches, 1);

    /* 1. evictions. A store racing with the eviction of a written block blocks in
     * its WP fault from the moment uffd_protect() returns (the ioctl flushes the
     * TLB); everything stored before that is in the pages we write back. The
     * message is served after the drop: the block is absent by then, so the
     * thread is woken, faults again as MISSING and reads the written-back bytes. */
    for (int i = 0; i < n; i++) {
        struct install *in = &w->batch[i];
        in->op_first = n_ops;
        in->op_count = 0;
        in->protect_errno = 0;
        if (in->victim >= 0 && in->victim_where == WHERE_SIDE) /* parked: make it whole first */
            restore_parked(w, in->slot, in->victim, in->victim_dirty, in->victim_park_off, w->p.sample_bytes);
        if (in->victim < 0 || !in->victim_dirty)
            continue;
        uint64_t src = block_addr(w, in->victim);
        int rc = uffd_protect(w, src, bs, 1, 0);
        if (rc < 0) { /* stores would race the write-back: treat it as a failed one */
            in->protect_errno = -rc;
            continue;
        }
        log_sum(w, in->victim, src);
        n_ops = add_writeback_ops(w, n_ops, src, in->victim, in->victim_dirty);
        in->op_count = n_ops - in->op_first;
    }
    log_commit(w);
    run_io(w, 0, n_ops);
    for (int i = 0; i < n; i++) {
        struct install *in = &w->batch[i];
        if (in->victim < 0)
            continue;
        int err = in->protect_errno;
        int64_t first = in->op_first, count = in->op_count;
        uint64_t where = block_addr(w, in->victim);
        if (err || (count && !ops_ok(w, first, count, &err))) {
            /* The bytes exist only in memory now: keep the pages where they are, let
             * stores through again (else a writer would fault forever), and refuse
             * every later eviction - the device has failed, no data is dropped. */
            set_error(w, err, "write-back of block %lld failed; it stays in memory, the window stops evicting",
                      (long long)in->victim);
            log_lost_writeback(w, in->victim);
            pthread_mutex_lock(&w->lock);
            w->failed_errno = err;
            pthread_mutex_unlock(&w->lock);
            uffd_protect(w, where, bs, 0, 1);
            strand(w, in->victim);
            continue;
        }
        if (count) {
            STAT_ADD(w, writebacks, 1);
            for (int64_t k = first; k < first + count; k++)
                STAT_ADD(w, writeback_bytes, w->ops[k].len);
        }
        /* MADV_DONTNEED on anonymous memory drops pages and their uffd-wp bits
         * alike: the range faults as MISSING from now on. */
        madvise((void *)where, bs, MADV_DONTNEED);
        STAT_ADD(w, evictions, 1);
    }

    /* 2. fills: SSD -> staging, one batch */
    n_ops = 0;
    for (int i = 0; i < n; i++) {
        struct cxlhm_io *op = &w->ops[n_ops++];
        op->buf = (char *)w->p.staging + (uint64_t)i * bs;
        op->len = bs;
        op->offset = (uint64_t)w->batch[i].block * bs;
        op->write = 0;
    }
    run_io(w, 0, n_ops);

    /* 3. install; a store that faulted on a missing block lands right after: log it first */
    for (int i = 0; i < n; i++)
        if (w->batch[i].write_granules)
            log_add(w, 'D', w->batch[i].block, 0, NULL);
    log_commit(w);
    for (int i = 0; i < n; i++) {
        struct install *in = &w->batch[i];
        int err = 0;
        in->fill_ok = ops_ok(w, i, 1, &err);
        uint64_t dst = block_addr(w, in->block);
        if (in->fill_ok && !verified(w, in->block, (uint64_t)w->p.staging + (uint64_t)i * bs)) {
            in->fill_ok = 0;
            err = EIO;
        }
        if (!in->fill_ok) {
            set_error(w, err, "SSD read of block %lld failed; the block is poisoned", (long long)in->block);
            if (!in->prefetch)
                poison(w, in->block);
            continue;
        }
        /* DONTWAKE: the waiters are woken in step 4, once the counters and the
         * firmware say the block is in, so whatever a woken thread observes is final. */
        uint64_t mode = UFFDIO_COPY_MODE_WP | UFFDIO_COPY_MODE_DONTWAKE;
        int rc = uffd_copy(w, dst, (uint64_t)w->p.staging + (uint64_t)i * bs, bs, mode);
        if (rc == -EEXIST) {
            /* Leftovers in the range (a poison marker of an earlier failed read):
             * the block is absent as far as the firmware knows, so drop them. */
            madvise((void *)dst, bs, MADV_DONTNEED);
            rc = uffd_copy(w, dst, (uint64_t)w->p.staging + (uint64_t)i * bs, bs, mode);
        }
        if (rc < 0) {
            in->fill_ok = 0;
            set_error(w, -rc, "UFFDIO_COPY of block %lld failed", (long long)in->block);
            if (!in->prefetch)
                poison(w, in->block);
            continue;
        }
        if (in->write_granules) {
            /* The faulting thread wants to store: lift the protection of its
             * granules now instead of letting it take a WP fault right after. */
            int g = 0, s, len;
            while (next_run(in->write_granules, w->n_granules, g, 1, &s, &len)) {
                uffd_protect(w, dst + (uint64_t)s * w->p.granule, (uint64_t)len * w->p.granule, 0, 0);
                g = s + len;
            }
        }
        STAT_ADD(w, uffdio_copies, 1);
        STAT_ADD(w, bytes_installed, bs);
        if (in->prefetch)
            STAT_ADD(w, prefetch_installed, 1);
        else
            STAT_ADD(w, fills, 1);
    }

    /* 4. tell the firmware; failed fills give their slot back */
    int64_t t = now_ns();
    pthread_mutex_lock(&w->lock);
    set_device_time(w);
    for (int i = 0; i < n; i++) {
        struct install *in = &w->batch[i];
        if (!in->fill_ok) {
            fw(w, CXLHM_OP_FINISH, in->slot, 0, 0, NULL);
            fw(w, CXLHM_OP_INVALIDATE, in->slot, 0, 0, NULL);
            w->where[in->slot] = WHERE_NONE;
            continue;
        }
        w->where[in->slot] = WHERE_WINDOW;
        w->block_of[in->slot] = in->block;
        w->dirty[in->slot] = in->write_granules;
        w->signal_ns[in->slot] = w->installed_ns[in->slot] = t;
        fw(w, CXLHM_OP_FINISH, in->slot, 0, 0, NULL);
        if (in->write_granules)
            fw(w, CXLHM_OP_DIRTY, in->slot, 1, 0, NULL);
    }
    pthread_mutex_unlock(&w->lock);
    for (int i = 0; i < n; i++)
        if (w->batch[i].fill_ok)
            uffd_wake(w, block_addr(w, w->batch[i].block), bs);
}

/* Ask the firmware for a slot for `block`; fills w->batch[*n] when one is placed.
 * Lock held. Returns the firmware's status. */
static int64_t place(struct cxlhm_window *w, int64_t block, int64_t owner, uint64_t write_granules,
                     int prefetch, int *n)
{
    int64_t out[8];
    int64_t mode = (write_granules ? CXLHM_MODE_WRITE : 0) | (prefetch ? CXLHM_MODE_PREFETCH : 0);
    int64_t st = fw(w, CXLHM_OP_PLACE, block, mode, owner, out);
    if (st != CXLHM_PLACE_PLACED)
        return st;
    struct install *in = &w->batch[(*n)++];
    in->block = block;
    in->slot = out[0];
    in->owner = owner;
    in->write_granules = write_granules;
    in->prefetch = prefetch;
    in->victim = out[1];
    /* The slot's physical state still describes the victim until install_batch()
     * has written it back and dropped it. */
    in->victim_where = in->victim >= 0 ? w->where[in->slot] : WHERE_NONE;
    in->victim_dirty = in->victim >= 0 ? w->dirty[in->slot] : 0;
    in->victim_park_off = w->park_off[in->slot];
    w->where[in->slot] = WHERE_NONE;
    w->dirty[in->slot] = 0;
    w->block_of[in->slot] = block;
    return st;
}

static int failed(struct cxlhm_window *w)
{
    return __atomic_load_n(&w->failed_errno, __ATOMIC_RELAXED) != 0;
}

/* ------------------------------------------------------------------ huge pages
 * A region is collapsed once every block overlapping it is resident, whole and clean.
 * The kernel does not collapse PTEs that carry the uffd-wp bit, so the region is
 * unprotected for the collapse and protected again right after it (one PMD keeps the
 * protection). A store landing in between takes no fault; it is found by comparing the
 * region with its bytes from before, and recorded like a first store. For the crash
 * guarantee, each block's DIRTY record is written before the protection is lifted (a
 * store may land from then on), and a SUM record after, for each block that did not
 * change, makes it clean again. */
#define HUGE_PAGE (2ULL << 20)
#define REGION_BLOCKS_MAX (HUGE_PAGE / 4096 + 1)
#define PROMOTE_QUEUE 4096 /* regions waiting for their collapse: 8 GiB of prefetches */

/* PAGEMAP_SCAN walks only populated page tables, so this is cheap even for a TB window.
 * Bytes of [start, end) whose pages are in `category`, or -errno. */
static int64_t mapped_bytes(struct cxlhm_window *w, uint64_t start, uint64_t end, uint64_t category)
{
    struct page_region regions[64];
    int64_t total = 0;
    while (start < end) {
        struct pm_scan_arg a = {.size = sizeof a, .start = start, .end = end, .vec = (uint64_t)regions,
                                .vec_len = 64, .category_mask = category, .return_mask = category};
        int n = ioctl(w->pagemap_fd, PAGEMAP_SCAN, &a);
        if (n < 0)
            return -errno;
        for (int i = 0; i < n; i++)
            total += (int64_t)(regions[i].end - regions[i].start);
        if (a.walk_end <= start || a.walk_end >= end)
            break;
        start = a.walk_end;
    }
    return total;
}

/* Are the blocks b0..b1 overlapping region r all resident, whole and clean? Their
 * slots go to w->region_slots. */
static int region_ready(struct cxlhm_window *w, uint64_t r, int64_t *b0, int64_t *b1)
{
    uint64_t bs = w->p.block_size;
    *b0 = (int64_t)(r / bs);
    *b1 = (int64_t)((r + HUGE_PAGE - 1) / bs);
    int ok = 1;
    pthread_mutex_lock(&w->lock);
    for (int64_t b = *b0; b <= *b1 && ok; b++) {
        int64_t s = fw(w, CXLHM_OP_LOOKUP, b, 0, 0, NULL);
        ok = s >= 0 && w->where[s] == WHERE_WINDOW && w->block_of[s] == b && !w->dirty[s] &&
             !(w->p.bt_flags[s] & w->p.flag_busy);
        if (ok)
            w->region_slots[b - *b0] = s;
    }
    pthread_mutex_unlock(&w->lock);
    return ok;
}

/* Granules of `block` inside region r whose bytes differ from `ref` (the region's). */
static uint64_t changed_granules(struct cxlhm_window *w, int64_t block, uint64_t r, const char *ref)
{
    uint64_t bs = w->p.block_size, gran = w->p.granule, start = (uint64_t)block * bs, bits = 0;
    uint64_t lo = start > r ? start : r, hi = start + bs < r + HUGE_PAGE ? start + bs : r + HUGE_PAGE;
    for (uint64_t pos = lo; pos < hi;) {
        uint64_t g = (pos - start) / gran, end = start + (g + 1) * gran;
        if (end > hi)
            end = hi;
        if (memcmp(w->base + pos, ref + (pos - r), end - pos) != 0)
            bits |= 1ULL << g;
        pos = end;
    }
    return bits;
}

/* Rebuild region r as one huge page if it is ready. Returns 1 if it tried. */
static int promote_region(struct cxlhm_window *w, uint64_t r)
{
    uint64_t addr = (uint64_t)w->base + r;
    int64_t b0, b1;
    if (r + HUGE_PAGE > w->p.capacity || (logging(w) && !w->p.hash) || failed(w))
        return 0; /* (without a hash no SUM record could make the blocks clean again) */
    if (mapped_bytes(w, addr, addr + HUGE_PAGE, PAGE_IS_HUGE) != 0 || !region_ready(w, r, &b0, &b1))
        return 0;
    int64_t t = now_ns();
    const char *ref = w->region_ref;
    memcpy(w->region_ref, (const void *)addr, HUGE_PAGE);
    for (int64_t b = b0; b <= b1; b++)
        log_add(w, 'D', b, 0, NULL);
    log_commit(w);
    if (failed(w))
        return 1;
    /* The window is MADV_NOHUGEPAGE (see cxlhm_window_open), which MADV_COLLAPSE
     * respects: lift it for this region, all of whose pages are present, and put it
     * back after (the kernel merges the region's VMA back into the window's). */
    int err = 0;
    madvise((void *)addr, HUGE_PAGE, MADV_HUGEPAGE);
    if (uffd_protect(w, addr, HUGE_PAGE, 0, 0) == 0 && madvise((void *)addr, HUGE_PAGE, MADV_COLLAPSE) != 0)
        err = errno;
    int lost = uffd_protect(w, addr, HUGE_PAGE, 1, 0) < 0; /* stores cannot be tracked: all dirty */
    madvise((void *)addr, HUGE_PAGE, MADV_NOHUGEPAGE);
    for (int64_t b = b0; b <= b1; b++) {
        int64_t s = w->region_slots[b - b0];
        uint64_t bits = lost ? w->all_granules : changed_granules(w, b, r, ref);
        if (bits) {
            STAT_ADD(w, collapse_races, 1);
            w->dirty[s] |= bits;
            w->signal_ns[s] = now_ns();
            pthread_mutex_lock(&w->lock);
            set_device_time(w);
            fw(w, CXLHM_OP_DIRTY, s, 1, 0, NULL);
            fw(w, CXLHM_OP_HIT, s, 1, 0, NULL);
            pthread_mutex_unlock(&w->lock);
        } else if (logging(w)) {
            int64_t i = map_find(&w->sums, b);
            uint64_t sum = i >= 0 ? w->sums.values[i]
                                  : ((hash_fn)w->p.hash)((const void *)block_addr(w, b), w->p.block_size);
            if (i < 0 && map_put(&w->sums, b, sum) < 0)
                continue; /* no memory: the block stays logged dirty, poisoned after a crash */
            log_add(w, 'S', b, sum, NULL);
        }
    }
    log_commit(w);
    if (!err) {
        w->collapsed_once = 1;
        STAT_ADD(w, huge_collapses, 1);
    } else if (err == EINVAL && !w->collapsed_once) {
        set_error(w, err, "MADV_COLLAPSE of the window (Linux 6.1+ with transparent huge pages); "
                          "prefetched ranges keep 4 KiB pages");
        __atomic_store_n(&w->huge, -err, __ATOMIC_RELAXED);
    } else {
        STAT_ADD(w, collapse_failures, 1);
    }
    STAT_ADD(w, collapse_ns, now_ns() - t);
    return 1;
}

/* Remember the regions of the blocks prefetched in w->batch[0, n): once the prefetch
 * queue is drained, promote_next() collapses those that are whole. A full queue drops
 * regions (huge pages are an optimisation). */
static void queue_regions(struct cxlhm_window *w, int n)
{
    uint64_t bs = w->p.block_size;
    for (int i = 0; i < n && w->huge > 0; i++) {
        struct install *in = &w->batch[i];
        if (!in->prefetch || !in->fill_ok)
            continue;
        uint64_t a = (uint64_t)in->block * bs;
        for (uint64_t r = a & ~(HUGE_PAGE - 1); r < a + bs; r += HUGE_PAGE) {
            if (w->pq_tail > w->pq_head && w->promote_q[(w->pq_tail - 1) % PROMOTE_QUEUE] == r)
                continue;
            if (w->pq_tail - w->pq_head == PROMOTE_QUEUE)
                return;
            w->promote_q[w->pq_tail++ % PROMOTE_QUEUE] = r;
        }
    }
}

/* Collapse queued regions until one was tried (a few ms at most, so faults wait little).
 * Returns 1 if there may be more to do. */
static int promote_next(struct cxlhm_window *w)
{
    while (w->pq_head < w->pq_tail) {
        uint64_t r = w->promote_q[w->pq_head++ % PROMOTE_QUEUE];
        if (w->huge > 0 && promote_region(w, r))
            return 1;
    }
    return 0;
}

/* ------------------------------------------------------------------ faults */

static void add_pending(struct cxlhm_window *w, int64_t block, uint64_t write_granules)
{
    for (int i = 0; i < w->n_pending; i++) {
        if (w->pending[i].block == block) { /* concurrent faults on one block: served once */
            w->pending[i].write_granules |= write_granules;
            STAT_ADD(w, coalesced_faults, 1);
            return;
        }
    }
    w->pending[w->n_pending].block = block;
    w->pending[w->n_pending].write_granules = write_granules;
    w->n_pending++;
}

/* Slot of `block` if its pages are where the service thread put them, else -1. */
static int64_t slot_of(struct cxlhm_window *w, int64_t block)
{
    int64_t slot = fw_locked(w, CXLHM_OP_LOOKUP, block, 0, 0);
    if (slot >= 0 && (w->where[slot] == WHERE_NONE || w->block_of[slot] != block))
        return -1;
    return slot;
}

static void serve_wp_fault(struct cxlhm_window *w, uint64_t addr)
{
    uint64_t off = addr - (uint64_t)w->base;
    int64_t block = (int64_t)(off / w->p.block_size);
    int64_t slot = slot_of(w, block);
    if (slot < 0) {
        /* Stale: the block was evicted after this store faulted. Its pages are gone,
         * so the woken thread faults again as MISSING and gets the written-back bytes. */
        uffd_wake(w, addr & ~4095ULL, 4096);
        return;
    }
    /* Resident, maybe with a page parked by the sampler: the other pages are present
     * and protected, so this is a first store like any other. (If the store was to
     * the page parked since, unprotecting is a no-op there; the woken thread faults
     * MISSING and unpark() brings the page back writable, its granule being dirty.) */
    int g = (int)((off % w->p.block_size) / w->p.granule);
    uint64_t start = block_addr(w, block) + (uint64_t)g * w->p.granule;
    int was_clean = w->dirty[slot] == 0;
    if (was_clean)
        log_dirty_now(w, block); /* before the store can land */
    w->dirty[slot] |= 1ULL << g;
    w->signal_ns[slot] = now_ns();
    if (was_clean) {
        pthread_mutex_lock(&w->lock);
        set_device_time(w);
        fw(w, CXLHM_OP_DIRTY, slot, 1, 0, NULL);
        fw(w, CXLHM_OP_HIT, slot, 1, 0, NULL); /* a store is an access the policy should see */
        pthread_mutex_unlock(&w->lock);
    }
    /* Unprotect (and wake) even if the bitmap already had the granule: a second
     * writer's stale message must not leave anyone blocked, and after a failed
     * write-back the granule is dirty but protected again. */
    uffd_protect(w, start, w->p.granule, 0, 1);
}

static void serve_missing_fault(struct cxlhm_window *w, uint64_t addr, int is_write)
{
    uint64_t off = addr - (uint64_t)w->base;
    int64_t block = (int64_t)(off / w->p.block_size);
    int64_t slot = slot_of(w, block);
    if (slot >= 0 && w->where[slot] == WHERE_SIDE) { /* the sampler's signal */
        STAT_ADD(w, sample_faults, 1);
        unpark(w, slot);
        w->signal_ns[slot] = now_ns();
        fw_locked(w, CXLHM_OP_HIT, slot, is_write, 0);
        return;
    }
    if (slot >= 0) { /* installed since this fault was raised: UFFDIO_COPY woke it already */
        STAT_ADD(w, coalesced_faults, 1);
        uffd_wake(w, block_addr(w, block), w->p.block_size);
        return;
    }
    uint64_t wants = is_write ? 1ULL << ((off % w->p.block_size) / w->p.granule) : 0;
    add_pending(w, block, wants);
}

/* Drain the fault messages the kernel has queued (non-blocking). */
static int read_faults(struct cxlhm_window *w)
{
    int got = 0;
    while (w->n_pending < MAX_PENDING - MAX_MSGS) {
        ssize_t r = read(w->uffd, w->msgs, sizeof w->msgs);
        if (r <= 0)
            break; /* EAGAIN: nothing queued */
        int n = (int)(r / (ssize_t)sizeof(struct uffd_msg));
        got += n;
        for (int i = 0; i < n; i++) {
            struct uffd_msg *m = &w->msgs[i];
            if (m->event != UFFD_EVENT_PAGEFAULT)
                continue;
            uint64_t addr = m->arg.pagefault.address;
            STAT_ADD(w, faults, 1);
            if (addr < (uint64_t)w->base || addr >= (uint64_t)w->base + w->p.capacity) {
                uffd_wake(w, addr & ~4095ULL, 4096); /* the side area: never touched; be safe */
                continue;
            }
            if (m->arg.pagefault.flags & UFFD_PAGEFAULT_FLAG_WP) {
                STAT_ADD(w, wp_faults, 1);
                serve_wp_fault(w, addr);
            } else {
                STAT_ADD(w, missing_faults, 1);
                serve_missing_fault(w, addr, !!(m->arg.pagefault.flags & UFFD_PAGEFAULT_FLAG_WRITE));
            }
        }
        if (n < MAX_MSGS)
            break;
    }
    return got;
}

/* Serve the pending misses, a batch of up to n_staging blocks at a time.
 * Returns 1 when something was left for lack of an evictable slot. */
static int serve_misses(struct cxlhm_window *w)
{
    while (w->n_pending > 0) {
        if (failed(w)) { /* no more evictions after a lost write-back: answer with poison */
            for (int i = 0; i < w->n_pending; i++)
                poison(w, w->pending[i].block);
            w->n_pending = 0;
            return 0;
        }
        int n = 0, taken = 0, no_slot = 0;
        pthread_mutex_lock(&w->lock);
        set_device_time(w);
        while (taken < w->n_pending && n < w->p.n_staging) {
            struct pending_miss *pm = &w->pending[taken];
            if (map_find(&w->poisoned, pm->block) >= 0) { /* its bytes are lost: an error, not old bytes */
                poison(w, pm->block);
                taken++;
                continue;
            }
            int64_t st = place(w, pm->block, 0, pm->write_granules, 0, &n);
            if (st == CXLHM_PLACE_NO_SLOT) {
                no_slot = 1;
                break;
            }
            taken++; /* CXLHM_PLACE_RESIDENT cannot happen: slot_of() said absent, and only we install */
        }
        pthread_mutex_unlock(&w->lock);
        if (n)
            install_batch(w, n);
        memmove(w->pending, w->pending + taken, (size_t)(w->n_pending - taken) * sizeof *w->pending);
        w->n_pending -= taken;
        if (no_slot && n == 0)
            return 1; /* every slot pinned: retry when something changes */
    }
    return 0;
}

/* ------------------------------------------------------------------ prefetch */

/* Install up to n_staging queued prefetch blocks. Returns 1 if it did anything. */
static int serve_prefetch_queue(struct cxlhm_window *w)
{
    int n = 0;
    int64_t last_ticket = -1;
    pthread_mutex_lock(&w->lock);
    if (w->q_head == w->q_tail) {
        pthread_mutex_unlock(&w->lock);
        return 0;
    }
    set_device_time(w);
    while (w->q_head < w->q_tail && n < w->p.n_staging) {
        int64_t i = w->q_head % w->q_cap;
        int64_t st = failed(w) || map_find(&w->poisoned, w->q_block[i]) >= 0
                         ? CXLHM_PLACE_NO_SLOT
                         : place(w, w->q_block[i], w->q_owner[i], 0, 1, &n);
        if (st == CXLHM_PLACE_NO_SLOT)
            STAT_ADD(w, prefetch_dropped, 1); /* prefetches are advisory */
        if (w->q_ticket[i] > last_ticket)
            last_ticket = w->q_ticket[i];
        w->q_head++;
    }
    pthread_mutex_unlock(&w->lock);
    if (n) {
        install_batch(w, n);
        queue_regions(w, n);
    }
    pthread_mutex_lock(&w->lock);
    /* Only a request's last block carries its ticket: the request is done with it. */
    if (last_ticket > w->done_ticket)
        w->done_ticket = last_ticket;
    pthread_cond_broadcast(&w->cond);
    pthread_mutex_unlock(&w->lock);
    return 1;
}

/* ------------------------------------------------------------------ flush */

/* Write back the written granules of the given slots; the blocks stay resident and
 * become clean. Returns blocks written, or -errno of the first failure. */
static int64_t flush_slots(struct cxlhm_window *w, const int64_t *slots, int64_t n)
{
    int64_t written = 0, first_err = 0;
    uint8_t *flushing = w->flushing; /* per entry of slots[]: its ops are in this round */
    int64_t i = 0;
    while (i < n) {
        int64_t n_ops = 0, start = i;
        /* as many blocks as fit the ops array (each needs at most n_granules/2+1 ops) */
        while (i < n && n_ops + w->n_granules / 2 + 1 <= w->ops_cap) {
            int64_t s = slots[i++];
            if (w->where[s] == WHERE_SIDE)
                unpark(w, s);
            uint64_t src = block_addr(w, w->block_of[s]);
            /* stores from here on fault and re-dirty the block */
            int rc = uffd_protect(w, src, w->p.block_size, 1, 0);
            if (rc < 0) {
                set_error(w, -rc, "write-protecting block %lld for a flush", (long long)w->block_of[s]);
                if (!first_err)
                    first_err = rc;
                flushing[i - 1] = 0;
                continue;
            }
            flushing[i - 1] = 1;
            log_sum(w, w->block_of[s], src);
            n_ops = add_writeback_ops(w, n_ops, src, w->block_of[s], w->dirty[s]);
        }
        log_commit(w);
        run_io(w, 0, n_ops);
        int64_t k = 0;
        for (int64_t j = start; j < i; j++) {
            int64_t s = slots[j];
            if (!flushing[j])
                continue;
            int64_t count = 0;
            int g = 0, st, len;
            while (next_run(w->dirty[s], w->n_granules, g, 1, &st, &len)) {
                count++;
                g = st + len;
            }
            int err = 0;
            if (!ops_ok(w, k, count, &err)) {
                set_error(w, err, "write-back of block %lld failed", (long long)w->block_of[s]);
                log_lost_writeback(w, w->block_of[s]);
                if (!first_err)
                    first_err = -err;
            } else {
                for (int64_t q = k; q < k + count; q++)
                    STAT_ADD(w, writeback_bytes, w->ops[q].len);
                STAT_ADD(w, writebacks, 1);
                w->dirty[s] = 0;
                fw_locked(w, CXLHM_OP_DIRTY, s, 0, 0);
                written++;
            }
            k += count;
        }
    }
    return first_err ? first_err : written;
}

static int64_t flush_all(struct cxlhm_window *w)
{
    int64_t n = 0;
    for (int64_t s = 0; s < w->p.n_slots; s++)
        if (w->where[s] != WHERE_NONE && w->dirty[s])
            w->sample_slots[n++] = s; /* reuse the sampler's scratch */
    int64_t r = flush_slots(w, w->sample_slots, n);
    if (r >= 0 && w->n_stranded) { /* blocks kept after a failed write-back: try again */
        int64_t still = 0;
        for (int64_t i = 0; i < w->n_stranded; i++) {
            int64_t b = w->stranded[i];
            w->ops[0] = (struct cxlhm_io){(void *)block_addr(w, b), w->p.block_size,
                                          (uint64_t)b * w->p.block_size, 1};
            log_sum(w, b, block_addr(w, b));
            log_commit(w);
            run_io(w, 0, 1);
            int err;
            if (!ops_ok(w, 0, 1, &err)) {
                log_lost_writeback(w, b);
                w->stranded[still++] = b;
                r = -err;
            }
        }
        w->n_stranded = still;
    }
    return r;
}

/* ------------------------------------------------------------------ background */

/* Run one round of the policy's background work (hint-driven prefetch, write
 * buffering). Returns the number of jobs that did something. */
static int run_background(struct cxlhm_window *w)
{
    int64_t budget = w->p.jobs_cap < w->p.n_staging ? w->p.jobs_cap : w->p.n_staging;
    pthread_mutex_lock(&w->lock);
    set_device_time(w);
    int64_t args[8] = {budget, (int64_t)w->p.jobs};
    int64_t out[8];
    int64_t n = w->firmware(w->p.firmware_ctx, CXLHM_OP_BACKGROUND, args, out);
    int placed = 0;
    int64_t flushes = 0;
    for (int64_t j = 0; j < n; j++) {
        int64_t kind = w->p.jobs[3 * j], block = w->p.jobs[3 * j + 1], session = w->p.jobs[3 * j + 2];
        if (kind == w->p.job_prefetch && !failed(w) && map_find(&w->poisoned, block) < 0) {
            if (place(w, block, session, 0, 1, &placed) == CXLHM_PLACE_NO_SLOT)
                STAT_ADD(w, prefetch_dropped, 1);
        } else if (kind == w->p.job_flush) {
            int64_t s = fw(w, CXLHM_OP_LOOKUP, block, 0, 0, NULL);
            if (s >= 0 && w->where[s] != WHERE_NONE && w->dirty[s] && !(w->p.bt_flags[s] & w->p.flag_busy))
                w->sample_slots[flushes++] = s;
        }
    }
    pthread_mutex_unlock(&w->lock);
    if (placed) {
        install_batch(w, placed);
        queue_regions(w, placed);
    }
    if (flushes)
        flush_slots(w, w->sample_slots, flushes);
    return placed + (int)flushes;
}

/* ------------------------------------------------------------------ recency sampler */

/* The device cannot see loads to resident pages. Every sample_interval the sampler
 * parks a few blocks that have shown no access for sample_min_age: UFFDIO_MOVE takes
 * their pages out of the window (no copy), so the next access faults and the
 * firmware gets an on_hit, like NUMA balancing's hinting faults. Untouched parked
 * blocks stay parked (and cost nothing) until evicted. */
static void sample(struct cxlhm_window *w)
{
    int64_t t = now_ns();
    if (!w->can_move || w->p.sample_interval_ns <= 0 || t < w->next_sample_ns)
        return;
    w->next_sample_ns = t + w->p.sample_interval_ns;
    int64_t n = 0, scan = w->p.n_slots < 16 * w->p.sample_blocks ? w->p.n_slots : 16 * w->p.sample_blocks;
    uint8_t skip = w->p.flag_busy | w->p.flag_pinned;
    pthread_mutex_lock(&w->lock);
    for (int64_t k = 0; k < scan && n < w->p.sample_blocks; k++) {
        int64_t s = w->sample_hand;
        w->sample_hand = (w->sample_hand + 1) % w->p.n_slots;
        if (w->where[s] != WHERE_WINDOW || (w->p.bt_flags[s] & skip))
            continue;
        if (t - w->signal_ns[s] < w->p.sample_min_age_ns)
            continue;
        if ((w->p.bt_flags[s] & w->p.flag_prefetched) && t - w->installed_ns[s] < w->p.prefetch_grace_ns)
            continue; /* a prefetched block is meant to be read without any fault */
        w->sample_slots[n++] = s;
    }
    pthread_mutex_unlock(&w->lock);
    uint64_t parts = w->p.block_size / w->p.sample_bytes;
    for (int64_t i = 0; i < n; i++) {
        int64_t s = w->sample_slots[i], block = w->block_of[s];
        /* Park one part of the block, a different one each time, so an access to
         * any part of it is caught sooner or later. Atomic per page: a store before
         * the move is in the moved page, an access after it faults MISSING and
         * waits for unpark(). */
        uint64_t off = (w->park_seq++ % parts) * w->p.sample_bytes;
        int64_t moved = uffd_move(w, side_addr(w, s) + off, block_addr(w, block) + off, w->p.sample_bytes);
        w->park_off[s] = off;
        if (moved == (int64_t)w->p.sample_bytes) {
            w->where[s] = WHERE_SIDE;
            STAT_ADD(w, samples, 1);
            continue;
        }
        /* EBUSY: pages pinned (O_DIRECT, RDMA, a GPU mapping) cannot move. Put back
         * whatever moved and leave the block alone for a while. */
        if (moved > 0)
            restore_parked(w, s, block, w->dirty[s], off, (uint64_t)moved);
        w->signal_ns[s] = t;
        STAT_ADD(w, sample_skips, 1);
    }
    STAT_ADD(w, sampler_ns, now_ns() - t);
}

/* ------------------------------------------------------------------ service thread */

static void *service(void *arg)
{
    struct cxlhm_window *w = arg;
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL); /* signals belong to the Python main thread */
    int stalled = 0, backoff = 0;
    for (;;) {
        read_faults(w);
        stalled = serve_misses(w);

        pthread_mutex_lock(&w->lock);
        int stopping = w->stopping;
        int flush_wanted = w->flush_seq > w->flush_done_seq;
        int64_t flush_seq = w->flush_seq;
        int queued = w->q_head < w->q_tail;
        int bg = w->p.has_background && (w->background_pending || !backoff);
        w->background_pending = 0;
        pthread_mutex_unlock(&w->lock);

        int busy = w->n_pending > 0 && !stalled;
        if (!busy && queued)
            busy = serve_prefetch_queue(w);
        if (flush_wanted) {
            int64_t r = flush_all(w);
            pthread_mutex_lock(&w->lock);
            w->flush_result = r;
            w->flush_done_seq = flush_seq;
            pthread_cond_broadcast(&w->cond);
            pthread_mutex_unlock(&w->lock);
        }
        if (!busy && bg) {
            int did = run_background(w);
            backoff = did == 0; /* nothing doable: wait for a hint or the next tick */
            busy = did > 0;
        }
        if (!busy && !stopping)
            busy = promote_next(w);
        if (!busy)
            sample(w);
        if (stopping && (w->n_pending == 0 || stalled) && !busy) {
            int64_t r = flush_all(w); /* like a Global Persistent Flush on power-down */
            pthread_mutex_lock(&w->lock);
            w->flush_result = r;
            w->stopped = 1;
            pthread_cond_broadcast(&w->cond);
            pthread_mutex_unlock(&w->lock);
            return NULL;
        }
        if (busy)
            continue;

        pthread_mutex_lock(&w->lock);
        if (!w->stopping && w->q_head == w->q_tail && w->flush_seq == w->flush_done_seq && w->n_pending == 0 &&
            w->pq_head == w->pq_tail) {
            w->idle = 1;
            pthread_cond_broadcast(&w->cond);
        }
        pthread_mutex_unlock(&w->lock);

        int timeout = -1;
        if (w->can_move && w->p.sample_interval_ns > 0) {
            int64_t left = w->next_sample_ns - now_ns();
            timeout = left <= 0 ? 0 : (int)(left / 1000000) + 1;
        }
        if (stalled || (w->p.has_background && backoff))
            timeout = timeout < 0 || timeout > 10 ? 10 : timeout;
        struct pollfd fds[2] = {{w->uffd, POLLIN, 0}, {w->wake_fd, POLLIN, 0}};
        if (poll(fds, 2, timeout) > 0 && (fds[1].revents & POLLIN)) {
            uint64_t v;
            if (read(w->wake_fd, &v, sizeof v) < 0) { /* EAGAIN: another reader got it */ }
        }
        if (w->p.has_background && backoff && timeout != 0)
            backoff = 0; /* a tick passed: ask the policy again */
    }
}

static void wake_service(struct cxlhm_window *w)
{
    uint64_t one = 1;
    if (write(w->wake_fd, &one, sizeof one) < 0) { /* counter saturated: it is awake anyway */ }
}

/* ------------------------------------------------------------------ open / close */

static int create_uffd(int *user_mode_only, int *err_no)
{
    int fd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
    if (fd >= 0)
        return fd;
    int first = errno;
    /* /dev/userfaultfd (Linux 6.1+) hands out the same object under file permissions,
     * and seccomp filters on the syscall do not apply to it. */
    int dev = open("/dev/userfaultfd", O_RDWR | O_CLOEXEC);
    if (dev >= 0) {
        fd = ioctl(dev, USERFAULTFD_IOC_NEW, O_CLOEXEC | O_NONBLOCK);
        close(dev);
        if (fd >= 0)
            return fd;
    }
    /* vm.unprivileged_userfaultfd=0 still allows faults from user mode only: plain
     * loads and stores work; a syscall handed a non-resident window address fails
     * with EFAULT instead of waiting for the fill. */
    if (first == EPERM) {
        fd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK | UFFD_USER_MODE_ONLY);
        if (fd >= 0) {
            *user_mode_only = 1;
            return fd;
        }
    }
    *err_no = first;
    return -1;
}

static void free_window(struct cxlhm_window *w)
{
    if (w->ring)
        cxlhm_ring_close(w->ring);
    if (w->uffd >= 0)
        close(w->uffd);
    if (w->wake_fd >= 0)
        close(w->wake_fd);
    if (w->pagemap_fd >= 0)
        close(w->pagemap_fd);
    free(w->where);
    free(w->dirty);
    free(w->block_of);
    free(w->signal_ns);
    free(w->installed_ns);
    free(w->park_off);
    free(w->batch);
    free(w->ops);
    free(w->res);
    free(w->sample_slots);
    free(w->flushing);
    free(w->stranded);
    free(w->region_slots);
    free(w->region_ref);
    free(w->promote_q);
    map_free(&w->sums);
    map_free(&w->poisoned);
    free(w->log_buf);
    free(w->q_block);
    free(w->q_owner);
    free(w->q_ticket);
    pthread_mutex_destroy(&w->lock);
    pthread_cond_destroy(&w->cond);
    free(w);
}

struct cxlhm_window *cxlhm_window_open(const struct cxlhm_window_params *p, int *stage, int *err_no,
                                       char *err, int errlen)
{
    *stage = 4;
    *err_no = 0;
    if (p->block_size % 4096 || p->granule % 4096 || p->granule == 0 || p->block_size % p->granule ||
        p->block_size / p->granule > 64 || p->capacity % p->block_size || p->n_slots < 1 || p->n_staging < 1 ||
        p->sample_bytes == 0 || p->sample_bytes % 4096 || p->block_size % p->sample_bytes) {
        *err_no = EINVAL;
        snprintf(err, errlen, "invalid window geometry (block %llu, granule %llu, capacity %llu)",
                 (unsigned long long)p->block_size, (unsigned long long)p->granule,
                 (unsigned long long)p->capacity);
        return NULL;
    }
    struct cxlhm_window *w = calloc(1, sizeof *w);
    if (!w) {
        *err_no = ENOMEM;
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    w->p = *p;
    w->firmware = (firmware_fn)p->firmware;
    w->uffd = w->wake_fd = w->pagemap_fd = -1;
    w->base = w->side = MAP_FAILED;
    pthread_mutex_init(&w->lock, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&w->cond, &ca);
    pthread_condattr_destroy(&ca);
    w->n_granules = (int)(p->block_size / p->granule);
    w->all_granules = w->n_granules == 64 ? ~0ULL : (1ULL << w->n_granules) - 1;
    w->t0_ns = now_ns();
    w->idle = 1;

#define FAIL(st, e, ...)                         \
    do {                                         \
        *stage = (st);                           \
        *err_no = (e);                           \
        snprintf(err, errlen, __VA_ARGS__);      \
        goto fail;                               \
    } while (0)

    /* 1. the userfaultfd */
    int e = 0;
    w->uffd = create_uffd(&w->user_mode_only, &e);
    if (w->uffd < 0)
        FAIL(1, e, "userfaultfd: %s", strerror(e));

    /* 2. the API handshake: ask for what this kernel has of what we use */
    struct uffdio_api api = {.api = UFFD_API, .features = 0};
    if (ioctl(w->uffd, UFFDIO_API, &api) != 0)
        FAIL(2, errno, "UFFDIO_API: %s", strerror(errno));
    uint64_t offered = api.features;
    if (!(offered & UFFD_FEATURE_PAGEFAULT_FLAG_WP))
        FAIL(2, ENOTSUP, "this kernel's userfaultfd has no write-protect mode (needs Linux 5.7+)");
    /* the first UFFDIO_API fixed the features: a second handshake needs a new fd */
    close(w->uffd);
    w->uffd = create_uffd(&w->user_mode_only, &e);
    if (w->uffd < 0)
        FAIL(1, e, "userfaultfd: %s", strerror(e));
    api = (struct uffdio_api){.api = UFFD_API,
                              .features = UFFD_FEATURE_PAGEFAULT_FLAG_WP |
                                          (offered & (UFFD_FEATURE_MOVE | UFFD_FEATURE_POISON))};
    if (ioctl(w->uffd, UFFDIO_API, &api) != 0)
        FAIL(2, errno, "UFFDIO_API with features %#llx: %s", (unsigned long long)api.features, strerror(errno));
    w->features = api.features;
    w->can_move = !!(api.features & UFFD_FEATURE_MOVE);
    w->can_poison = !!(api.features & UFFD_FEATURE_POISON);

    /* 3. the window and the side area: address space only (MAP_NORESERVE); the window
     * 2 MiB-aligned for huge pages, so HPA regions and huge pages coincide */
    uint64_t slack = p->huge_pages ? HUGE_PAGE : 0;
    char *raw = mmap(NULL, p->capacity + slack, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                     -1, 0);
    if (raw == MAP_FAILED)
        FAIL(3, errno, "mmap of a %llu-byte window: %s", (unsigned long long)p->capacity, strerror(errno));
    uint64_t head = slack ? (HUGE_PAGE - (uint64_t)raw % HUGE_PAGE) % HUGE_PAGE : 0;
    if (head)
        munmap(raw, head);
    if (slack > head)
        munmap(raw + head + p->capacity, slack - head);
    w->base = raw + head;
    w->side_bytes = (uint64_t)p->n_slots * p->block_size;
    w->side = mmap(NULL, w->side_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (w->side == MAP_FAILED)
        FAIL(3, errno, "mmap of the sampler's side area: %s", strerror(errno));
    /* Huge pages only where promote_region() makes them: with MADV_HUGEPAGE (or THP
     * "always") the kernel allocates and clears a 2 MiB page on a write fault to an
     * empty 2 MiB range before it hands the fault to userfaultfd, then frees it -
     * measured 160 us instead of 33 per first write fault of a range. Children of
     * fork() must not share the pages (COW would defeat MOVE and write tracking). */
    w->huge = p->huge_pages ? 1 : 0;
    if (madvise(w->base, p->capacity, MADV_NOHUGEPAGE) != 0 && p->huge_pages) {
        w->huge = -errno; /* no transparent huge pages in this kernel */
        snprintf(w->last_error, sizeof w->last_error, "MADV_NOHUGEPAGE on the window: %s", strerror(errno));
    }
    madvise(w->base, p->capacity, MADV_DONTFORK);
    madvise(w->side, w->side_bytes, MADV_NOHUGEPAGE);
    madvise(w->side, w->side_bytes, MADV_DONTFORK);
    struct uffdio_register reg = {.range = {(uint64_t)w->base, p->capacity},
                                  .mode = UFFDIO_REGISTER_MODE_MISSING | UFFDIO_REGISTER_MODE_WP};
    if (ioctl(w->uffd, UFFDIO_REGISTER, &reg) != 0)
        FAIL(3, errno, "UFFDIO_REGISTER (missing + write-protect) of the window: %s", strerror(errno));
    if (!(reg.ioctls & (1ULL << _UFFDIO_WRITEPROTECT)) || !(reg.ioctls & (1ULL << _UFFDIO_COPY)))
        FAIL(3, ENOTSUP, "the window's registration lacks UFFDIO_COPY/UFFDIO_WRITEPROTECT");
    /* UFFDIO_MOVE needs its destination registered with the same userfaultfd */
    reg = (struct uffdio_register){.range = {(uint64_t)w->side, w->side_bytes},
                                   .mode = UFFDIO_REGISTER_MODE_MISSING | UFFDIO_REGISTER_MODE_WP};
    if (ioctl(w->uffd, UFFDIO_REGISTER, &reg) != 0)
        w->can_move = 0; /* no sampler then; the window still works */

    /* 4. the rest */
    w->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    w->pagemap_fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
    int rerr = 0;
    w->ring = cxlhm_ring_open(p->queue_depth, &rerr);
    if (!w->ring)
        FAIL(4, rerr, "io_uring setup for the fault service: %s", strerror(rerr));
    size_t n = (size_t)p->n_slots;
    w->where = calloc(n, 1);
    w->dirty = calloc(n, sizeof *w->dirty);
    w->block_of = malloc(n * sizeof *w->block_of);
    w->signal_ns = calloc(n, sizeof *w->signal_ns);
    w->installed_ns = calloc(n, sizeof *w->installed_ns);
    w->park_off = calloc(n, sizeof *w->park_off);
    w->sample_slots = malloc(n * sizeof *w->sample_slots);
    w->flushing = malloc(n);
    w->batch = calloc((size_t)p->n_staging, sizeof *w->batch);
    w->ops_cap = p->n_staging * (w->n_granules / 2 + 1) + 1;
    w->ops = calloc((size_t)w->ops_cap, sizeof *w->ops);
    w->res = calloc((size_t)w->ops_cap, sizeof *w->res);
    w->region_slots = malloc(REGION_BLOCKS_MAX * sizeof *w->region_slots);
    w->region_ref = w->huge > 0 ? malloc(HUGE_PAGE) : NULL;
    w->promote_q = w->huge > 0 ? malloc(PROMOTE_QUEUE * sizeof *w->promote_q) : NULL;
    if (!w->region_slots || (w->huge > 0 && (!w->region_ref || !w->promote_q)))
        FAIL(4, ENOMEM, "out of memory for the huge-page scratch");
    w->q_cap = 1024;
    w->q_block = malloc((size_t)w->q_cap * sizeof(int64_t));
    w->q_owner = malloc((size_t)w->q_cap * sizeof(int64_t));
    w->q_ticket = malloc((size_t)w->q_cap * sizeof(int64_t));
    if (w->wake_fd < 0 || !w->where || !w->dirty || !w->block_of || !w->signal_ns || !w->installed_ns || !w->park_off ||
        !w->sample_slots || !w->flushing || !w->batch || !w->ops || !w->res || !w->q_block || !w->q_owner || !w->q_ticket)
        FAIL(4, ENOMEM, "out of memory for the window's tables");
    for (size_t i = 0; i < n; i++)
        w->block_of[i] = -1;
    pthread_once(&crc_once, crc_init);
    w->log_len = LOG_HEADER;
    w->log_cap = 4096;
    w->log_buf = malloc(w->log_cap);
    if (!w->log_buf)
        FAIL(4, ENOMEM, "out of memory for the integrity log's buffer");
    for (int64_t i = 0; i < p->n_sums; i++)
        if (map_put(&w->sums, p->sum_blocks[i], p->sum_values[i]) < 0)
            FAIL(4, ENOMEM, "out of memory for the block checksums");
    for (int64_t i = 0; i < p->n_poison; i++)
        if (map_put(&w->poisoned, p->poison_blocks[i], 0) < 0)
            FAIL(4, ENOMEM, "out of memory for the poison list");
    return w;
#undef FAIL

fail:
    if (w->base != MAP_FAILED)
        munmap(w->base, p->capacity);
    if (w->side != MAP_FAILED)
        munmap(w->side, w->side_bytes);
    free_window(w);
    return NULL;
}

int cxlhm_window_start(struct cxlhm_window *w)
{
    int rc = pthread_create(&w->thread, NULL, service, w);
    if (rc == 0)
        w->thread_started = 1;
    return -rc;
}

void *cxlhm_window_base(struct cxlhm_window *w) { return w->base; }
uint64_t cxlhm_window_features(struct cxlhm_window *w) { return w->features; }
int cxlhm_window_user_mode_only(struct cxlhm_window *w) { return w->user_mode_only; }

int64_t cxlhm_window_firmware(struct cxlhm_window *w, int64_t op, int64_t *args, int64_t *out)
{
    pthread_mutex_lock(&w->lock);
    set_device_time(w);
    int64_t r = w->firmware(w->p.firmware_ctx, op, args, out);
    if (op == CXLHM_OP_HINT) {
        w->background_pending = 1;
        w->idle = 0;
    }
    pthread_mutex_unlock(&w->lock);
    if (op == CXLHM_OP_HINT)
        wake_service(w);
    return r;
}

int64_t cxlhm_window_prefetch(struct cxlhm_window *w, const int64_t *blocks, const int64_t *owners,
                              int64_t n, int wait)
{
    if (n <= 0)
        return 0;
    pthread_mutex_lock(&w->lock);
    if (w->stopping) {
        pthread_mutex_unlock(&w->lock);
        return -ESHUTDOWN;
    }
    if (w->q_tail - w->q_head + n > w->q_cap) { /* grow the ring, keeping its order */
        int64_t cap = w->q_cap;
        while (w->q_tail - w->q_head + n > cap)
            cap *= 2;
        int64_t *b = malloc((size_t)cap * 8), *o = malloc((size_t)cap * 8), *t = malloc((size_t)cap * 8);
        if (!b || !o || !t) {
            free(b); free(o); free(t);
            pthread_mutex_unlock(&w->lock);
            return -ENOMEM;
        }
        int64_t len = w->q_tail - w->q_head;
        for (int64_t i = 0; i < len; i++) {
            int64_t j = (w->q_head + i) % w->q_cap;
            b[i] = w->q_block[j];
            o[i] = w->q_owner[j];
            t[i] = w->q_ticket[j];
        }
        free(w->q_block); free(w->q_owner); free(w->q_ticket);
        w->q_block = b; w->q_owner = o; w->q_ticket = t;
        w->q_head = 0;
        w->q_tail = len;
        w->q_cap = cap;
    }
    int64_t ticket = ++w->next_ticket;
    for (int64_t i = 0; i < n; i++) {
        int64_t j = w->q_tail++ % w->q_cap;
        w->q_block[j] = blocks[i];
        w->q_owner[j] = owners ? owners[i] : 0;
        w->q_ticket[j] = i == n - 1 ? ticket : -1; /* done when its last block is */
    }
    w->idle = 0;
    pthread_mutex_unlock(&w->lock);
    wake_service(w);
    if (wait) {
        pthread_mutex_lock(&w->lock);
        while (w->done_ticket < ticket && !w->stopped)
            pthread_cond_wait(&w->cond, &w->lock);
        pthread_mutex_unlock(&w->lock);
    }
    return n;
}

int64_t cxlhm_window_flush(struct cxlhm_window *w)
{
    pthread_mutex_lock(&w->lock);
    if (w->stopping) {
        pthread_mutex_unlock(&w->lock);
        return -ESHUTDOWN;
    }
    int64_t seq = ++w->flush_seq;
    w->idle = 0;
    pthread_mutex_unlock(&w->lock);
    wake_service(w);
    pthread_mutex_lock(&w->lock);
    while (w->flush_done_seq < seq && !w->stopped)
        pthread_cond_wait(&w->cond, &w->lock);
    int64_t r = w->flush_result;
    pthread_mutex_unlock(&w->lock);
    return r;
}

int cxlhm_window_wait_idle(struct cxlhm_window *w, int64_t timeout_ns)
{
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    int64_t t = (int64_t)until.tv_sec * 1000000000LL + until.tv_nsec + (timeout_ns > 0 ? timeout_ns : 0);
    until.tv_sec = t / 1000000000LL;
    until.tv_nsec = t % 1000000000LL;
    pthread_mutex_lock(&w->lock);
    int ok = 1;
    while (!w->idle && !w->stopped) {
        if (timeout_ns > 0) {
            if (pthread_cond_timedwait(&w->cond, &w->lock, &until) == ETIMEDOUT) {
                ok = w->idle;
                break;
            }
        } else {
            pthread_cond_wait(&w->cond, &w->lock);
        }
    }
    pthread_mutex_unlock(&w->lock);
    return ok;
}

int64_t cxlhm_window_resident_bytes(struct cxlhm_window *w)
{
    int64_t a = mapped_bytes(w, (uint64_t)w->base, (uint64_t)w->base + w->p.capacity, PAGE_IS_PRESENT);
    int64_t b = mapped_bytes(w, (uint64_t)w->side, (uint64_t)w->side + w->side_bytes, PAGE_IS_PRESENT);
    return a < 0 ? a : b < 0 ? b : a + b;
}

int64_t cxlhm_window_huge_bytes(struct cxlhm_window *w, uint64_t offset, uint64_t len)
{
    if (offset > w->p.capacity || len > w->p.capacity - offset)
        return -EINVAL;
    return mapped_bytes(w, (uint64_t)w->base + offset, (uint64_t)w->base + offset + len, PAGE_IS_HUGE);
}

int cxlhm_window_huge_pages(struct cxlhm_window *w) { return __atomic_load_n(&w->huge, __ATOMIC_RELAXED); }

int cxlhm_window_stat_count(void) { return STAT_COUNT; }
const char *cxlhm_window_stat_name(int i) { return i >= 0 && i < STAT_COUNT ? stat_names[i] : ""; }

void cxlhm_window_stats(struct cxlhm_window *w, int64_t *out, int n)
{
    for (int i = 0; i < n && i < STAT_COUNT; i++)
        out[i] = __atomic_load_n(&w->stats[i], __ATOMIC_RELAXED);
}

int cxlhm_window_error(struct cxlhm_window *w, char *buf, int len)
{
    pthread_mutex_lock(&w->lock);
    snprintf(buf, len, "%s", w->last_error);
    int e = w->failed_errno;
    pthread_mutex_unlock(&w->lock);
    return e;
}

int cxlhm_window_close(struct cxlhm_window *w, int keep_reserved, int64_t *final_stats, int n)
{
    int64_t r = 0;
    if (w->thread_started) {
        pthread_mutex_lock(&w->lock);
        w->stopping = 1;
        pthread_cond_broadcast(&w->cond);
        pthread_mutex_unlock(&w->lock);
        wake_service(w);
        pthread_join(w->thread, NULL);
        r = w->flush_result;
    }
    if (final_stats)
        cxlhm_window_stats(w, final_stats, n);
    /* Replace the window before closing the userfaultfd: closing it wakes any thread
     * still blocked in a fault, and an unregistered range would hand that thread
     * zero-filled pages - wrong bytes. A PROT_NONE range makes it fault instead. */
    if (keep_reserved) {
        mmap(w->base, w->p.capacity, PROT_NONE, MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    } else {
        munmap(w->base, w->p.capacity);
    }
    munmap(w->side, w->side_bytes);
    free_window(w);
    return r < 0 ? (int)r : 0;
}

void cxlhm_window_copy(void *dst, const void *src, uint64_t n)
{
    memcpy(dst, src, n);
}
