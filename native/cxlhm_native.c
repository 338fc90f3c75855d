/*
 * cxlhm native back end: batched io_uring I/O between device-DRAM slots and the
 * SSD image, through the liburing C API that the python-liburing wheel exports.
 *
 * We dlopen() that shared library instead of linking against a system liburing,
 * so nothing has to be installed outside the virtual environment, and so the
 * import can say exactly which symbol is missing when the wheel changes.
 *
 * Only kernel-ABI structures (io_uring_sqe / io_uring_cqe, from <linux/io_uring.h>)
 * are touched directly. `struct io_uring` belongs to liburing; we treat it as an
 * opaque, generously sized buffer and only ever pass its address back to liburing.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/uio.h>
#include <linux/io_uring.h>

#include "cxlhm_native.h"

/* liburing 2.x's struct io_uring is ~216 bytes; 1 KiB leaves room for growth. */
#define RING_OPAQUE_BYTES 1024

#define CXLHM_SETUP_COOP_TASKRUN (1U << 8)
#define CXLHM_SETUP_SINGLE_ISSUER (1U << 12)
#define CXLHM_SETUP_DEFER_TASKRUN (1U << 13)

typedef int (*queue_init_fn)(unsigned, void *, unsigned);
typedef void (*queue_exit_fn)(void *);
typedef struct io_uring_sqe *(*get_sqe_fn)(void *);
typedef void (*prep_rw_fn)(struct io_uring_sqe *, int, void *, unsigned, uint64_t);
typedef int (*submit_fn)(void *);
typedef int (*submit_and_wait_fn)(void *, unsigned);
typedef int (*wait_cqe_fn)(void *, struct io_uring_cqe **);
typedef void (*cqe_seen_fn)(void *, struct io_uring_cqe *);
typedef int (*peek_cqe_fn)(void *, struct io_uring_cqe **);
typedef unsigned (*cq_ready_fn)(const void *);
typedef int (*register_sparse_fn)(void *, unsigned);
typedef int (*register_update_fn)(void *, unsigned, const struct iovec *, const uint64_t *, unsigned);
typedef int (*register_files_fn)(void *, const int *, unsigned);

static struct {
    void *handle;
    queue_init_fn queue_init;
    queue_exit_fn queue_exit;
    get_sqe_fn get_sqe;
    prep_rw_fn prep_read;
    prep_rw_fn prep_write;
    submit_fn submit;
    submit_and_wait_fn submit_and_wait;
    wait_cqe_fn wait_cqe;
    cqe_seen_fn cqe_seen;
    peek_cqe_fn peek_cqe;
    cq_ready_fn cq_ready;
    register_sparse_fn register_buffers_sparse;
    register_update_fn register_buffers_update_tag;
    register_files_fn register_files;
} uring;

/* A ring's share of the registered memory (see cxlhm_ring_use_fixed). */
enum { FIXED_UNSET = 0, FIXED_ON = 1, FIXED_OFF = -1 };
enum { CHUNK_NEW = 0, CHUNK_IN = 1, CHUNK_REFUSED = 2 };

struct cxlhm_ring {
    _Alignas(64) unsigned char opaque[RING_OPAQUE_BYTES];
    unsigned depth;
    unsigned queued; /* SQEs prepared, not yet handed to the kernel */
    unsigned submit_batch; /* hand SQEs over once this many are prepared (1: each at once) */
    const struct cxlhm_fixed *fixed; /* the memory its I/O may use as fixed buffers (NULL: none) */
    int fixed_state; /* FIXED_*: its sparse buffer table is not made yet, made, or refused */
    int file_registered; /* fixed->fd is its registered file 0 */
    unsigned char *chunks; /* CHUNK_* per chunk of fixed's memory */
    int64_t counts[CXLHM_FIXED_COUNTS];
};

/* A completion already in the CQ ring, read from memory: 0 and *cqe, or -EAGAIN. On a
 * DEFER_TASKRUN ring io_uring_peek_cqe enters the kernel whenever the CQ ring is empty
 * (to run deferred completions); the loops below enter it only to submit or to wait,
 * which runs them too. */
static int take_ready(struct cxlhm_ring *r, struct io_uring_cqe **cqe)
{
    if (uring.cq_ready(r->opaque) == 0)
        return -EAGAIN;
    return uring.peek_cqe(r->opaque, cqe);
}

int cxlhm_uring_load(const char *path, char *err, int errlen)
{
    if (uring.handle)
        return 0;
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(err, errlen, "cannot load %s: %s", path, dlerror());
        return -1;
    }
#define LOAD(field, name)                                                        \
    do {                                                                         \
        *(void **)&uring.field = dlsym(h, name);                                 \
        if (!uring.field) {                                                      \
            snprintf(err, errlen, "%s does not export %s (liburing C API)", path, \
                     name);                                                      \
            dlclose(h);                                                          \
            return -1;                                                           \
        }                                                                        \
    } while (0)
    LOAD(queue_init, "io_uring_queue_init");
    LOAD(queue_exit, "io_uring_queue_exit");
    LOAD(get_sqe, "io_uring_get_sqe");
    LOAD(prep_read, "io_uring_prep_read");
    LOAD(prep_write, "io_uring_prep_write");
    LOAD(submit, "io_uring_submit");
    LOAD(submit_and_wait, "io_uring_submit_and_wait");
    LOAD(wait_cqe, "io_uring_wait_cqe");
    LOAD(cqe_seen, "io_uring_cqe_seen");
    LOAD(peek_cqe, "io_uring_peek_cqe");
    LOAD(cq_ready, "io_uring_cq_ready");
    LOAD(register_buffers_sparse, "io_uring_register_buffers_sparse");
    LOAD(register_buffers_update_tag, "io_uring_register_buffers_update_tag");
    LOAD(register_files, "io_uring_register_files");
#undef LOAD
    uring.handle = h;
    return 0;
}

static struct cxlhm_ring *ring_open(unsigned depth, unsigned flags, int *err)
{
    struct cxlhm_ring *r;
    if (!uring.handle) {
        *err = ENOSYS;
        return NULL;
    }
    if (posix_memalign((void **)&r, 64, sizeof(*r))) {
        *err = ENOMEM;
        return NULL;
    }
    /* Kernels that do not know a flag refuse it: fall back flag by flag, as fio does.
     * CXLHM_URING_PLAIN=1 forces the plain ring. */
    const char *plain = getenv("CXLHM_URING_PLAIN");
    if (plain && *plain == '1')
        flags = 0;
    int rc;
    for (;;) {
        memset(r, 0, sizeof(*r));
        rc = uring.queue_init(depth, r->opaque, flags);
        if (rc != -EINVAL || flags == 0)
            break;
        if (flags & CXLHM_SETUP_DEFER_TASKRUN)
            flags &= ~(CXLHM_SETUP_DEFER_TASKRUN | CXLHM_SETUP_SINGLE_ISSUER);
        else
            flags = 0;
    }
    if (rc < 0) {
        *err = -rc;
        free(r);
        return NULL;
    }
    r->depth = depth;
    r->submit_batch = 1;
    *err = 0;
    return r;
}

/* COOP_TASKRUN: a completion is handed to the submitting thread when it next enters the
 * kernel, instead of interrupting it. Not SINGLE_ISSUER: the window's fault service
 * submits on a ring another thread made. */
struct cxlhm_ring *cxlhm_ring_open(unsigned depth, int *err)
{
    return ring_open(depth, CXLHM_SETUP_COOP_TASKRUN, err);
}

/* A ring any thread may submit on and reap from, one at a time (the caller serializes
 * them: the device's lock). No COOP_TASKRUN: a completion of an I/O another thread
 * submitted is then posted without waiting for that thread to enter the kernel again
 * (it is interrupted to post it, or a kernel worker does once it has exited) - so a
 * thread reaping what an idle thread submitted does not wait for that thread. */
struct cxlhm_ring *cxlhm_ring_open_shared(unsigned depth, int *err)
{
    return ring_open(depth, 0, err);
}

/* A ring only its creating thread submits on (the SSD back end's rings are per thread):
 * also SINGLE_ISSUER | DEFER_TASKRUN, fio's io_uring engine's setup. Completions are then
 * posted only while that thread waits in io_uring_enter(GETEVENTS), in one batch, instead
 * of as task work run whenever the kernel gets to it. 4 KiB random reads at QD32 in the
 * closed loop (cxlhm_io_qd) on the development machine's virtio disk: 79.0k IOPS vs 75.9k
 * with COOP_TASKRUN alone (medians of 4 alternating 4 s runs; fio 3.33: 88.0k). */
struct cxlhm_ring *cxlhm_ring_open_owned(unsigned depth, int *err)
{
    return ring_open(depth, CXLHM_SETUP_COOP_TASKRUN | CXLHM_SETUP_SINGLE_ISSUER | CXLHM_SETUP_DEFER_TASKRUN, err);
}

/*
 * How many prepared SQEs wait before one io_uring_enter() hands them to the kernel,
 * fio's iodepth_batch_submit. 1 (the default, as in fio) submits each I/O the moment it
 * is prepared: all the SQEs of one cxlhm_io_queue() call (one I/O's fills, which the
 * block layer may merge), each op of cxlhm_io_qd(). On the development machine's virtio
 * disk that matters more than the enter it costs: bench/bench_fio.py's run of this closed
 * loop (4 KiB random reads at QD32) went from 0.80x of fio's IOPS, submitting each
 * round's replacements together, to 0.98-1.00x. cxlhm_io_batch() hands its whole batch
 * over at once: adjacent reads merge.
 */
void cxlhm_ring_submit_batch(struct cxlhm_ring *r, unsigned n)
{
    r->submit_batch = n ? n : 1;
}

/* An enter took `rc` of the prepared SQEs (the kernel may take fewer; the rest go with
 * the next enter). */
static void handed_over(struct cxlhm_ring *r, int rc)
{
    r->queued = (unsigned)rc >= r->queued ? 0 : r->queued - (unsigned)rc;
}

/* One I/O's SQEs are prepared: submit what is prepared once the batch is full. A failed
 * submit (-EINTR, -EAGAIN, -EBUSY) leaves the SQEs prepared: the next enter takes them.
 * fio's engine also asks for events at each submit (on a DEFER_TASKRUN ring that posts
 * what completed meanwhile); here that measured 0.97x-1.00x (A/B runs of the device's
 * stream and of bench_device.py), so completions are posted when a loop waits. */
static void io_prepared(struct cxlhm_ring *r)
{
    if (r->queued < r->submit_batch)
        return;
    int rc = uring.submit(r->opaque);
    if (rc > 0)
        handed_over(r, rc);
}

void cxlhm_ring_close(struct cxlhm_ring *r)
{
    if (!r)
        return;
    uring.queue_exit(r->opaque);
    free(r->chunks);
    free(r);
}

/*
 * Registered memory. An O_DIRECT read or write into ordinary memory pins the buffer's
 * pages for the I/O's duration and marks them dirty after a read: get_user_pages and
 * the folio bookkeeping took ~6% of a 4 KiB random read stream's CPU on the development
 * machine's virtio disk, and fget/fput on the image another 1%. The device's DRAM is one
 * arena that every fill lands in and every write-back leaves from, as a controller's
 * DMA engine maps its DRAM once: a ring that is told of it (cxlhm_ring_use_fixed) sends
 * the I/O inside it as READ_FIXED / WRITE_FIXED on a registered file, and fio's job
 * option fixedbufs=1 is the same thing.
 *
 * The memory is registered in chunks, each the first time an I/O lands in it, into a
 * sparse table made on the ring's first such I/O: a registered buffer is pinned - its
 * pages faulted in and locked - so a large arena of which only a little is in use must
 * not be pinned whole. Where the kernel refuses (an old kernel, RLIMIT_MEMLOCK without
 * CAP_IPC_LOCK) the I/O goes out as an ordinary one: registration is a speed-up, never
 * a condition. The region must stay mapped while rings use it (the device unmaps its
 * DRAM only after closing its back end).
 */
void cxlhm_ring_use_fixed(struct cxlhm_ring *r, const struct cxlhm_fixed *f)
{
    r->fixed = f;
}

void cxlhm_ring_fixed_counts(const struct cxlhm_ring *r, int64_t *out)
{
    for (int i = 0; i < CXLHM_FIXED_COUNTS; i++)
        out[i] += r->counts[i];
}

static int fixed_setup(struct cxlhm_ring *r, const struct cxlhm_fixed *f)
{
    uint64_t n = (f->len + f->chunk - 1) / f->chunk;
    r->chunks = calloc(n, 1);
    if (!r->chunks || uring.register_buffers_sparse(r->opaque, (unsigned)n) < 0) {
        r->counts[CXLHM_FIXED_REFUSED]++;
        return FIXED_OFF;
    }
    r->file_registered = uring.register_files(r->opaque, &f->fd, 1) == 0;
    return FIXED_ON;
}

/* The registered buffer an I/O of [buf, buf+len) can use, registering its chunk if
 * needed, or -1: outside the memory, across two chunks, or refused. */
static int fixed_index(struct cxlhm_ring *r, const void *buf, uint64_t len)
{
    const struct cxlhm_fixed *f = r->fixed;
    if (!f || f->len == 0 || r->fixed_state == FIXED_OFF)
        return -1;
    const char *p = buf;
    if (p < f->base || (uint64_t)(p - f->base) + len > f->len || len == 0)
        return -1;
    /* (a chunk is a power of two: a shift, not a division per I/O) */
    unsigned shift = (unsigned)__builtin_ctzll(f->chunk);
    uint64_t off = (uint64_t)(p - f->base), c = off >> shift;
    if ((off + len - 1) >> shift != c)
        return -1;
    if (r->fixed_state == FIXED_UNSET && (r->fixed_state = fixed_setup(r, f)) == FIXED_OFF)
        return -1;
    if (r->chunks[c] == CHUNK_NEW) {
        uint64_t start = c * f->chunk;
        struct iovec iov = {(void *)(f->base + start), f->len - start < f->chunk ? f->len - start : f->chunk};
        int rc = uring.register_buffers_update_tag(r->opaque, (unsigned)c, &iov, NULL, 1);
        r->chunks[c] = rc == 1 ? CHUNK_IN : CHUNK_REFUSED;
        r->counts[rc == 1 ? CXLHM_FIXED_CHUNKS : CXLHM_FIXED_REFUSED]++;
    }
    return r->chunks[c] == CHUNK_IN ? (int)c : -1;
}

/* Prepare one read or write, as a fixed-buffer one where the ring can. */
static void prep_io(struct cxlhm_ring *r, struct io_uring_sqe *sqe, int fd, void *buf, unsigned len,
                    uint64_t off, int write)
{
    int index = fixed_index(r, buf, len);
    if (write)
        uring.prep_write(sqe, fd, buf, len, off);
    else
        uring.prep_read(sqe, fd, buf, len, off);
    if (index < 0) {
        r->counts[CXLHM_FIXED_PLAIN]++;
        return;
    }
    sqe->opcode = write ? IORING_OP_WRITE_FIXED : IORING_OP_READ_FIXED;
    sqe->buf_index = (uint16_t)index;
    if (r->file_registered && fd == r->fixed->fd) {
        sqe->fd = 0;
        sqe->flags |= IOSQE_FIXED_FILE;
    }
    r->counts[CXLHM_FIXED_OPS]++;
}

/*
 * One kernel entry per round: submit what was queued and wait for a completion in
 * the same io_uring_enter() (io_uring_submit + io_uring_wait_cqe took two: at QD1
 * that is 10.4k vs 17.8k IOPS). With nothing queued, a completion already in the
 * CQ ring is taken without entering the kernel at all.
 * Returns 0 with *cqe set, or -errno (-EINTR: call again).
 */
static int submit_and_get_cqe(struct cxlhm_ring *r, struct io_uring_cqe **cqe)
{
    if (r->queued) {
        int rc;
        /* -EINTR before anything reached the kernel: the SQEs are still in the SQ
         * ring, and only a submitting call would hand them over, so retry here */
        do
            rc = uring.submit_and_wait(r->opaque, 1);
        while (rc == -EINTR);
        if (rc < 0)
            return rc;
        handed_over(r, rc);
    }
    if (take_ready(r, cqe) == 0)
        return 0;
    return uring.wait_cqe(r->opaque, cqe);
}

/*
 * Run `n` independent I/Os and wait for all of them. Submission is batched: as
 * many SQEs as the ring holds go out with one io_uring_submit_and_wait(), which
 * also waits for the first completion; every completion already there is reaped
 * before the next round. Short transfers (legal for regular files) are resubmitted
 * for the remainder. res[i] receives the bytes transferred or -errno for the first
 * failure of op i. Returns the number of ops that failed.
 */
int cxlhm_io_batch(struct cxlhm_ring *r, int fd, const struct cxlhm_io *ops,
                   int n, int64_t *res)
{
    int next = 0, inflight = 0, failed = 0;
    /* res[i] doubles as the progress of op i across short transfers */
    for (int i = 0; i < n; i++)
        res[i] = 0;
    int *pending = NULL; /* ops needing a resubmit after a short transfer */
    int npending = 0;
    if (n > 0) {
        pending = malloc(sizeof(int) * (size_t)n);
        if (!pending)
            return -ENOMEM;
    }
    while (next < n || inflight > 0 || npending > 0) {
        while (inflight < (int)r->depth && (npending > 0 || next < n)) {
            int i = npending > 0 ? pending[--npending] : next++;
            struct io_uring_sqe *sqe = uring.get_sqe(r->opaque);
            if (!sqe) { /* SQ full: retry this op after the next submit */
                pending[npending++] = i;
                break;
            }
            uint64_t done = (uint64_t)res[i];
            void *buf = (char *)ops[i].buf + done;
            unsigned len = (unsigned)(ops[i].len - done);
            uint64_t off = ops[i].offset + done;
            prep_io(r, sqe, fd, buf, len, off, ops[i].write);
            sqe->user_data = (uint64_t)i;
            inflight++;
            r->queued++;
        }
        if (inflight == 0) { /* nothing queued although work is left: never spin */
            free(pending);
            return next < n || npending > 0 ? -EBUSY : failed;
        }
        struct io_uring_cqe *cqe;
        int rc = submit_and_get_cqe(r, &cqe);
        if (rc < 0) {
            if (rc == -EINTR)
                continue;
            free(pending);
            return rc;
        }
        do {
            int i = (int)cqe->user_data;
            int32_t got = cqe->res;
            uring.cqe_seen(r->opaque, cqe);
            inflight--;
            if (got < 0) {
                res[i] = got;
                failed++;
            } else if (got == 0) {
                res[i] = -EIO; /* no progress: treat as an I/O error, never as data */
                failed++;
            } else {
                res[i] += got;
                if ((uint64_t)res[i] < ops[i].len)
                    pending[npending++] = i;
            }
        } while (take_ready(r, &cqe) == 0);
    }
    free(pending);
    return failed;
}

static inline int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/*
 * Closed-loop load generator: keep `qd` I/Os in flight (as fio's io_uring engine
 * does at iodepth=qd) until all `n` ops completed or, when deadline_ns > 0, until
 * CLOCK_MONOTONIC passes it (in-flight ops are still reaped). res[i] gets bytes
 * or -errno, lat_ns[i] submission-to-completion latency (-1 if never issued).
 * Returns the number of ops issued, or -errno if the ring itself failed.
 */
static int overlaps_in_flight(const struct cxlhm_io *ops, const int64_t *res, int64_t from,
                              int64_t to, const struct cxlhm_io *op)
{
    /* ops[from, to) were issued; the ones in flight still hold the marker in res */
    for (int64_t j = from; j < to; j++)
        if (res[j] == INT64_MIN &&
            ops[j].offset < op->offset + (int64_t)op->len &&
            op->offset < ops[j].offset + (int64_t)ops[j].len)
            return 1;
    return 0;
}

int64_t cxlhm_io_qd(struct cxlhm_ring *r, int fd, const struct cxlhm_io *ops,
                    int64_t n, int qd, int64_t deadline_ns, int serialize_overlap,
                    int64_t *res, int64_t *lat_ns)
{
    int64_t next = 0;
    int inflight = 0;
    if (qd > (int)r->depth)
        qd = (int)r->depth;
    int64_t oldest = 0; /* ops before it have all completed (kept for serialize_overlap) */
    for (int64_t i = 0; i < n; i++) {
        lat_ns[i] = -1;
        res[i] = INT64_MIN;
    }
    while (inflight > 0 || next < n) {
        int stop = deadline_ns > 0 && now_ns() >= deadline_ns;
        int64_t t = now_ns();
        while (!stop && inflight < qd && next < n) {
            const struct cxlhm_io *op = &ops[next];
            /* fio's serialize_overlap: an I/O overlapping one in flight waits for it,
             * since the device may complete the two in either order */
            if (serialize_overlap && inflight > 0) {
                while (oldest < next && res[oldest] != INT64_MIN)
                    oldest++;
                if (overlaps_in_flight(ops, res, oldest, next, op))
                    break;
            }
            struct io_uring_sqe *sqe = uring.get_sqe(r->opaque);
            if (!sqe)
                break;
            prep_io(r, sqe, fd, op->buf, (unsigned)op->len, op->offset, op->write);
            sqe->user_data = (uint64_t)next;
            lat_ns[next] = t; /* issue time until completion */
            next++;
            inflight++;
            r->queued++;
            io_prepared(r);
        }
        if (inflight == 0)
            break;
        struct io_uring_cqe *cqe;
        int rc = submit_and_get_cqe(r, &cqe);
        if (rc < 0) {
            if (rc == -EINTR)
                continue;
            return rc;
        }
        int64_t done = now_ns();
        do {
            int64_t i = (int64_t)cqe->user_data;
            res[i] = cqe->res;
            lat_ns[i] = done - lat_ns[i];
            uring.cqe_seen(r->opaque, cqe);
            inflight--;
        } while (take_ready(r, &cqe) == 0);
    }
    return next;
}

/*
 * Split-phase I/O, for a caller that keeps many I/Os of its own in flight on one
 * ring (and must not block on all of them at once):
 *
 *   cxlhm_io_queue  prepares SQEs for `n` ops (user_data = tags[i]) without entering
 *                   the kernel; returns how many fit in the SQ (the rest: after a reap).
 *   cxlhm_io_reap   hands what is queued to the kernel and waits until at least `min`
 *                   completions are in - one io_uring_enter(), none when nothing is
 *                   queued and a completion is already there - then takes up to `max`
 *                   of them: tags[i] = user_data, res[i] = bytes or -errno (a short
 *                   transfer is reported as such; the caller retries it).
 *                   Returns the number taken, or -errno.
 *
 * A ring used this way must not also run cxlhm_io_batch (it would take these CQEs).
 */
int cxlhm_io_queue(struct cxlhm_ring *r, int fd, const struct cxlhm_io *ops, int n,
                   const int64_t *tags)
{
    int i;
    for (i = 0; i < n; i++) {
        struct io_uring_sqe *sqe = uring.get_sqe(r->opaque);
        if (!sqe)
            break;
        prep_io(r, sqe, fd, ops[i].buf, (unsigned)ops[i].len, ops[i].offset, ops[i].write);
        sqe->user_data = (uint64_t)tags[i];
        r->queued++;
    }
    io_prepared(r);
    return i;
}

int cxlhm_io_reap(struct cxlhm_ring *r, int min, int max, int64_t *tags, int64_t *res)
{
    struct io_uring_cqe *cqe;
    int got = 0;
    if (r->queued || (min > 0 && uring.cq_ready(r->opaque) == 0)) {
        int rc;
        do
            rc = uring.submit_and_wait(r->opaque, (unsigned)(min > 0 ? 1 : 0));
        while (rc == -EINTR && r->queued);
        if (rc >= 0)
            handed_over(r, rc);
        else if (rc != -EINTR)
            return rc;
    }
    while (got < max) {
        if (take_ready(r, &cqe) != 0) {
            if (got >= min)
                break;
            int rc = uring.wait_cqe(r->opaque, &cqe);
            if (rc == -EINTR)
                continue;
            if (rc < 0)
                return rc;
        }
        tags[got] = (int64_t)cqe->user_data;
        res[got] = cqe->res;
        uring.cqe_seen(r->opaque, cqe);
        got++;
    }
    return got;
}
