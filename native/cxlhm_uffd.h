/* Interface of the load/store window's native fault service (native/cxlhm_uffd.c);
 * also fed to cffi's cdef, so: plain declarations only, no macros with values. */
struct cxlhm_window;

/* The compiled firmware, one numba @cfunc per policy (cxlhm/window/firmware_cfuncs.py):
 *   int64_t firmware(int64_t *ctx, int64_t op, int64_t *args, int64_t *out)
 * Every call is made with the window's mutex held. Python reads these enums through
 * cffi (cxlhm/firmware.py): this is their only definition. */
enum cxlhm_op {
    CXLHM_OP_PLACE = 0,       /* (block, mode, owner) -> cxlhm_place; out: slot, victim block, victim flags */
    CXLHM_OP_HIT = 1,         /* (slot, is_write) -> 1, or 0 when the slot holds no block */
    CXLHM_OP_INVALIDATE = 2,  /* (slot): forget its block without a write-back */
    CXLHM_OP_LOOKUP = 3,      /* (block) -> slot or -1 */
    CXLHM_OP_HINT = 4,        /* (kind, session, first block, n blocks, arg) */
    CXLHM_OP_BACKGROUND = 5,  /* (budget, jobs address) -> jobs written */
    CXLHM_OP_PIN = 6,         /* (first block, n blocks, pin) -> blocks of the range not resident */
    CXLHM_OP_FINISH = 7,      /* (slot): placed block installed, no longer busy */
    CXLHM_OP_DIRTY = 8        /* (slot, dirty) */
};
enum cxlhm_place { CXLHM_PLACE_NO_SLOT = -1, CXLHM_PLACE_RESIDENT = 0, CXLHM_PLACE_PLACED = 1 };
enum cxlhm_place_mode { CXLHM_MODE_WRITE = 1, CXLHM_MODE_PREFETCH = 2 };
struct cxlhm_window_params {
    uint64_t capacity;        /* bytes of the window (multiple of block_size) */
    uint64_t block_size;      /* device block: unit of fill, eviction and sampling */
    uint64_t granule;         /* dirty-tracking granule: divides block_size, <= 64 per block */
    int64_t n_slots;          /* device-DRAM slots: at most this many blocks are resident */
    void *staging;            /* n_staging x block_size bytes, page aligned, NOT registered */
    int64_t n_staging;        /* blocks filled (or prefetched) per batch */
    int32_t ssd_fd;           /* the SSD image, opened O_DIRECT */
    uint32_t queue_depth;     /* io_uring entries of the service thread's own ring */
    void *firmware;           /* the cfunc's address */
    int64_t *firmware_ctx;    /* raw pointers + shapes of the firmware arrays (see the cfunc) */
    uint8_t *bt_flags;        /* block-table flags, read by the sampler under the mutex */
    int64_t *bt_scalars;      /* block-table scalars; [now_index] receives the device time (ns) */
    int64_t now_index;
    int64_t has_background;   /* the policy hands out background jobs */
    int64_t *jobs;            /* background job rows (kind, block, session), jobs_cap of them */
    int64_t jobs_cap;
    int64_t job_prefetch, job_flush;
    uint8_t flag_busy, flag_pinned, flag_prefetched;
    int64_t sample_interval_ns;   /* recency sampler period; 0 switches it off */
    int64_t sample_blocks;        /* blocks sampled per period */
    uint64_t sample_bytes;        /* bytes of a sampled block parked (a rotating part of it) */
    int64_t sample_min_age_ns;    /* blocks with an access signal this recent are left alone */
    int64_t prefetch_grace_ns;    /* prefetched blocks are left alone this long after install */
    int64_t huge_pages;           /* map prefetched 2 MiB-aligned regions with transparent huge pages */
    /* Crash consistency, in the explicit mode's integrity-log format (cxlhm/integrity.py) */
    int32_t log_fd;               /* the integrity log, opened O_APPEND; 0 or less: record nothing */
    void *hash;                   /* uint64_t (*)(const void *, size_t): xxh3-64; NULL: no checksums */
    const int64_t *sum_blocks;    /* checksums of the blocks on the SSD at open: verified on fill */
    const uint64_t *sum_values;
    int64_t n_sums;
    const int64_t *poison_blocks; /* blocks whose bytes are lost: a load from them raises SIGBUS */
    int64_t n_poison;
};

/* Opening: 0, or -errno with a message in err. `stage` says which step failed:
 * 1 creating the userfaultfd, 2 the UFFDIO_API handshake / features,
 * 3 mapping or registering the window, 4 everything else. */
struct cxlhm_window *cxlhm_window_open(const struct cxlhm_window_params *p, int *stage, int *err_no,
                                       char *err, int errlen);
int cxlhm_window_start(struct cxlhm_window *w);
void *cxlhm_window_base(struct cxlhm_window *w);
uint64_t cxlhm_window_features(struct cxlhm_window *w);
int cxlhm_window_user_mode_only(struct cxlhm_window *w);

/* Firmware call from a foreign (Python) thread: takes the mutex, sets the device
 * time, calls the cfunc, releases. A hint also wakes the service thread. */
int64_t cxlhm_window_firmware(struct cxlhm_window *w, int64_t op, int64_t *args, int64_t *out);

/* Queue blocks for installation ahead of use; with wait, return when all are done
 * (installed or dropped). Returns the number queued, or -errno. */
int64_t cxlhm_window_prefetch(struct cxlhm_window *w, const int64_t *blocks, const int64_t *owners,
                              int64_t n, int wait);
/* Write every dirty block back (blocks stay resident); returns blocks written or -errno. */
int64_t cxlhm_window_flush(struct cxlhm_window *w);
/* Wait until the service thread has nothing queued (timeout_ns <= 0: forever); 1 idle, 0 timed out. */
int cxlhm_window_wait_idle(struct cxlhm_window *w, int64_t timeout_ns);
/* Bytes of device DRAM in use: present pages of the window plus the sampler's side area. */
int64_t cxlhm_window_resident_bytes(struct cxlhm_window *w);
/* Bytes of [offset, offset+len) of the window mapped by 2 MiB (PMD) pages, or -errno. */
int64_t cxlhm_window_huge_bytes(struct cxlhm_window *w, uint64_t offset, uint64_t len);
/* 1: prefetched regions are collapsed into huge pages; 0: switched off by the caller;
 * -errno: the kernel refused (no MADV_COLLAPSE, THP disabled), see cxlhm_window_error. */
int cxlhm_window_huge_pages(struct cxlhm_window *w);

int cxlhm_window_stat_count(void);
const char *cxlhm_window_stat_name(int i);
void cxlhm_window_stats(struct cxlhm_window *w, int64_t *out, int n);
int cxlhm_window_error(struct cxlhm_window *w, char *buf, int len);

/* Stop the service (final flush first), drop the userfaultfd. keep_reserved: leave
 * the address range mapped PROT_NONE (views still exist: a stale access faults
 * instead of reading wrong bytes), else unmap it. The final counters go to
 * final_stats[0, n). Returns 0 or -errno of the flush. */
int cxlhm_window_close(struct cxlhm_window *w, int keep_reserved, int64_t *final_stats, int n);

/* memcpy between a user buffer and the window, with the GIL released by cffi. */
void cxlhm_window_copy(void *dst, const void *src, uint64_t n);
