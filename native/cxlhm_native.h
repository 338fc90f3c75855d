/* Interface of the cxlhm native back end; also fed to cffi's cdef. */
struct cxlhm_ring;

struct cxlhm_io {
    void *buf;       /* device-DRAM slot (aligned for O_DIRECT) */
    uint64_t len;    /* bytes */
    uint64_t offset; /* byte offset in the SSD image */
    int32_t write;   /* 1 = slot -> SSD, 0 = SSD -> slot */
};

/* Memory a ring's I/O may use as registered (fixed) buffers, and the file it may
 * register: the device's DRAM arena and its image. `chunk` (a power of two) is the
 * unit registered on first use; len 0: none. */
struct cxlhm_fixed {
    const char *base;
    uint64_t len;
    uint64_t chunk;
    int fd;
};

/* cxlhm_ring_fixed_counts adds a ring's counts to out[CXLHM_FIXED_COUNTS]: */
#define CXLHM_FIXED_OPS 0     /* I/Os sent on a registered buffer */
#define CXLHM_FIXED_PLAIN 1   /* I/Os sent as ordinary ones */
#define CXLHM_FIXED_CHUNKS 2  /* chunks registered */
#define CXLHM_FIXED_REFUSED 3 /* registrations the kernel refused (its I/O went as an ordinary one) */
#define CXLHM_FIXED_COUNTS 4

int cxlhm_uring_load(const char *path, char *err, int errlen);
struct cxlhm_ring *cxlhm_ring_open(unsigned depth, int *err);
struct cxlhm_ring *cxlhm_ring_open_owned(unsigned depth, int *err);
struct cxlhm_ring *cxlhm_ring_open_shared(unsigned depth, int *err);
void cxlhm_ring_submit_batch(struct cxlhm_ring *r, unsigned n);
void cxlhm_ring_close(struct cxlhm_ring *r);
void cxlhm_ring_use_fixed(struct cxlhm_ring *r, const struct cxlhm_fixed *f);
void cxlhm_ring_fixed_counts(const struct cxlhm_ring *r, int64_t *out);
int cxlhm_io_batch(struct cxlhm_ring *r, int fd, const struct cxlhm_io *ops,
                   int n, int64_t *res);
int64_t cxlhm_io_qd(struct cxlhm_ring *r, int fd, const struct cxlhm_io *ops,
                    int64_t n, int qd, int64_t deadline_ns, int serialize_overlap,
                    int64_t *res, int64_t *lat_ns);
int cxlhm_io_queue(struct cxlhm_ring *r, int fd, const struct cxlhm_io *ops, int n,
                   const int64_t *tags);
int cxlhm_io_reap(struct cxlhm_ring *r, int min, int max, int64_t *tags, int64_t *res);
