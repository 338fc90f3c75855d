/* The device's copy engine: copies out of device DRAM and block checksums, run by the
 * calling thread and a helper thread together. Also fed to cffi's cdef. */

/* Runs below this many bytes (copies plus checksums) stay on the calling thread: waking
 * the helper costs ~10-30 us in a VM. */
#define CXLHM_COPY_HELPER_MIN_BYTES 196608

/* How long the helper polls for the next run before it sleeps (environment variable
 * CXLHM_COPY_LINGER_US overrides; 0: it sleeps at once). */
#define CXLHM_COPY_LINGER_US 2000

/* One job, laid out as six int64 (numba fills them as an (n, 6) array). */
struct cxlhm_copy {
    int64_t src;      /* bytes to copy (device DRAM) */
    int64_t dst;      /* where to (the host's buffer); 0: nothing to copy */
    int64_t len;      /* bytes to copy */
    int64_t hash_at;  /* a block to checksum after the copy (its slot); 0: none */
    int64_t hash_len; /* its bytes */
    int64_t hash;     /* out: xxh3-64 of the block (as set by cxlhm_copy_set_hash) */
};

/* Copies of at least this many bytes out to the host's buffer (cxlhm_copy_out_many)
 * bypass the CPU's caches. */
#define CXLHM_COPY_STREAMING_MIN_BYTES 65536

void cxlhm_copy_set_hash(void *xxh3_64bits);
int64_t cxlhm_copy_many(struct cxlhm_copy *jobs, int64_t n);
/* The same, for the copies out of device DRAM into the host's buffer of a transfer too
 * large for the CPU's caches: those of CXLHM_COPY_STREAMING_MIN_BYTES or more bypass them. */
int64_t cxlhm_copy_out_many(struct cxlhm_copy *jobs, int64_t n);
/* How long a helper started now polls after a run, in us (the environment, the default,
 * or 0 for a process confined to one CPU). */
int64_t cxlhm_copy_linger_us(void);
