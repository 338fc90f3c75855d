/* Interface of the cxlhm native back end; also fed to cffi's cdef. */
struct cxlhm_ring;

struct cxlhm_io {
    void *buf;       /* device-DRAM slot (aligned for O_DIRECT) */
    uint64_t len;    /* bytes */
    uint64_t offset; /* byte offset in the SSD image */
    int32_t write;   /* 1 = slot -> SSD, 0 = SSD -> slot */
};

int cxlhm_uring_load(const char *path, char *err, int errlen);
struct cxlhm_ring *cxlhm_ring_open(unsigned depth, int *err);
struct cxlhm_ring *cxlhm_ring_open_owned(unsigned depth, int *err);
struct cxlhm_ring *cxlhm_ring_open_shared(unsigned depth, int *err);
void cxlhm_ring_submit_batch(struct cxlhm_ring *r, unsigned n);
void cxlhm_ring_close(struct cxlhm_ring *r);
int cxlhm_io_batch(struct cxlhm_ring *r, int fd, const struct cxlhm_io *ops,
                   int n, int64_t *res);
int64_t cxlhm_io_qd(struct cxlhm_ring *r, int fd, const struct cxlhm_io *ops,
                    int64_t n, int qd, int64_t deadline_ns, int serialize_overlap,
                    int64_t *res, int64_t *lat_ns);
int cxlhm_io_queue(struct cxlhm_ring *r, int fd, const struct cxlhm_io *ops, int n,
                   const int64_t *tags);
int cxlhm_io_reap(struct cxlhm_ring *r, int min, int max, int64_t *tags, int64_t *res);
