/*
 * The device's copy engine. A streamed read whose blocks land together (the block
 * layer merges adjacent reads, so the blocks of a wide read often complete at once)
 * leaves the reaping thread a run of copies out of device DRAM and checksums to do
 * before the read completes: ~15 us per 64 KiB block on the development machine. A
 * real device's controller has DMA engines for this; here a second thread takes a
 * share of such a run.
 *
 *   cxlhm_copy_many(jobs, n)  runs the jobs (copy, then checksum) and returns once all
 *                             are done; a helper thread (started on first use) takes
 *                             jobs from the same counter, so whichever thread is free
 *                             does the next one, and a helper that wakes late takes
 *                             none. Small runs, and calls while another thread has the
 *                             helper, run on the calling thread alone. Returns how
 *                             many jobs the helper ran.
 *   cxlhm_copy_out_many(jobs, n)  the same for the copies out of device DRAM into the
 *                             host's buffer of a transfer too large for the caches:
 *                             those of 64 KiB or more bypass them.
 *
 * After a run the helper polls for the next one for CXLHM_COPY_LINGER_US (default
 * 2000 us; 0: never), then sleeps on a condition variable. In a VM a sleeping thread's
 * idle vCPU takes hundreds of microseconds to wake: with the helper asleep, a 2 MiB
 * read's copy-out and checksums after its blocks landed took 530-550 us on the
 * development machine, longer than the calling thread alone (400-470), and 305-310 us
 * with it polling through the ~1 ms the next read was on the SSD. A controller's DMA
 * engine polls its queue too; the cost is one core kept busy for at most the linger
 * after the last long run (short runs never wake the helper). A process confined to
 * one CPU does not poll unless told to.
 *
 * A call publishes itself under the pool's lock and withdraws under it;
 * the helper joins a call only while it is published, and the caller waits for a helper
 * that joined to leave before the jobs (on the caller's stack) go away. After fork() the
 * child has no helper thread: the child handler resets the pool, and it starts afresh.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#if defined(__x86_64__)
#include <emmintrin.h>
#endif

#include "cxlhm_copy.h"


#if defined(__x86_64__) || defined(__i386__)
#define cpu_relax() __builtin_ia32_pause()
#else
#define cpu_relax() atomic_signal_fence(memory_order_seq_cst)
#endif

typedef uint64_t (*hash_fn)(const void *, size_t);
static hash_fn copy_hash;

struct call {
    struct cxlhm_copy *jobs;
    int64_t n;
    int to_host; /* copies out to the host's buffer: large ones bypass the caches */
    _Atomic int64_t next;
};

static struct {
    pthread_mutex_t busy; /* held by the one caller that has the helper */
    pthread_mutex_t lock;
    pthread_cond_t wake;
    int started;
    _Atomic uint64_t generation; /* written under the lock; the polling helper reads it without */
    struct call *current; /* the published call, or NULL */
    _Atomic int helper_in; /* the helper is running jobs of a call */
} pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0, NULL, 0};

void cxlhm_copy_set_hash(void *xxh3_64bits)
{
    copy_hash = (hash_fn)xxh3_64bits;
}

/* Copy with stores that bypass the CPU's caches (x86-64's SSE2 streaming stores; a plain
 * memcpy elsewhere). A copy out to the host's buffer is not read again by this thread,
 * and a large transfer's worth of them evicts everything else: a 32 MiB transfer in 64 KiB
 * pieces out of a cold arena ran at 4.2-5.4 GB/s with memcpy and 7.2-9.1 GB/s with
 * these on the development machine. A transfer that fits the caches is faster copied
 * into them (a 2 MiB one: 23-27 GB/s against 14-15 streamed, another day), so the caller
 * picks this call only for large transfers (cxlhm/device/stream/copyengine.py, bypasses_caches). */
static void copy_streaming(char *dst, const char *src, size_t len)
{
#if defined(__x86_64__)
    size_t head = (16 - ((uintptr_t)dst & 15)) & 15;
    if (head > len)
        head = len;
    memcpy(dst, src, head);
    dst += head, src += head, len -= head;
    size_t body = len & ~(size_t)63;
    for (size_t i = 0; i < body; i += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)(src + i));
        __m128i b = _mm_loadu_si128((const __m128i *)(src + i + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(src + i + 32));
        __m128i d = _mm_loadu_si128((const __m128i *)(src + i + 48));
        _mm_stream_si128((__m128i *)(dst + i), a);
        _mm_stream_si128((__m128i *)(dst + i + 16), b);
        _mm_stream_si128((__m128i *)(dst + i + 32), c);
        _mm_stream_si128((__m128i *)(dst + i + 48), d);
    }
    memcpy(dst + body, src + body, len - body);
    _mm_sfence(); /* the stores are weakly ordered: done before the caller hears of it */
#else
    memcpy(dst, src, len);
#endif
}

static void run_job(struct cxlhm_copy *j, int to_host)
{
    if (j->dst && j->len > 0) {
        if (to_host && j->len >= CXLHM_COPY_STREAMING_MIN_BYTES)
            copy_streaming((char *)(intptr_t)j->dst, (const char *)(intptr_t)j->src, (size_t)j->len);
        else
            memcpy((void *)(intptr_t)j->dst, (const void *)(intptr_t)j->src, (size_t)j->len);
    }
    if (j->hash_at && copy_hash)
        j->hash = (int64_t)copy_hash((const void *)(intptr_t)j->hash_at, (size_t)j->hash_len);
}

static int64_t take_jobs(struct call *c)
{
    int64_t ran = 0;
    for (;;) {
        int64_t i = atomic_fetch_add(&c->next, 1);
        if (i >= c->n)
            return ran;
        run_job(&c->jobs[i], c->to_host);
        ran++;
    }
}

static _Atomic int64_t helper_ran_total; /* jobs the helper ran, for the caller's return */

static int64_t monotonic_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* The helper's polling time: the environment's, else the default - but none when the
 * process may run on one CPU only, where polling would take the core from the caller. */
static int64_t linger_ns(void)
{
    const char *us = getenv("CXLHM_COPY_LINGER_US");
    int given = us && *us;
    cpu_set_t cpus;
    if (!given && sched_getaffinity(0, sizeof cpus, &cpus) == 0 && CPU_COUNT(&cpus) < 2)
        return 0;
    long long v = given ? atoll(us) : CXLHM_COPY_LINGER_US; /* not a number: 0 */
    if (v > 10000000) /* at most 10 s (and no overflow below) */
        v = 10000000;
    return v > 0 ? (int64_t)v * 1000 : 0;
}

int64_t cxlhm_copy_linger_us(void)
{
    return linger_ns() / 1000;
}

/* Poll for a call after generation `seen` for at most `ns`. */
static void linger(uint64_t seen, int64_t ns)
{
    if (ns <= 0)
        return;
    int64_t until = monotonic_ns() + ns;
    for (unsigned spins = 1; atomic_load(&pool.generation) == seen; spins++) {
        cpu_relax();
        if (!(spins & 255) && monotonic_ns() > until)
            return;
    }
}

static void *helper_main(void *unused)
{
    (void)unused;
    const int64_t ns = linger_ns();
    uint64_t seen = 0;
    pthread_mutex_lock(&pool.lock);
    for (;;) {
        if (pool.current == NULL || pool.generation == seen) {
            pthread_mutex_unlock(&pool.lock);
            linger(seen, ns);
            pthread_mutex_lock(&pool.lock);
        }
        while (pool.current == NULL || pool.generation == seen)
            pthread_cond_wait(&pool.wake, &pool.lock);
        seen = pool.generation;
        struct call *c = pool.current;
        atomic_store(&pool.helper_in, 1);
        pthread_mutex_unlock(&pool.lock);
        atomic_fetch_add(&helper_ran_total, take_jobs(c));
        atomic_store(&pool.helper_in, 0);
        pthread_mutex_lock(&pool.lock);
    }
    return NULL;
}

static void reset_in_child(void)
{
    pthread_mutex_init(&pool.busy, NULL);
    pthread_mutex_init(&pool.lock, NULL);
    pthread_cond_init(&pool.wake, NULL);
    pool.started = 0;
    pool.current = NULL;
    atomic_store(&pool.helper_in, 0);
}

static int helper_running(void)
{
    if (pool.started)
        return pool.started > 0;
    static int atfork_done;
    if (!atfork_done && pthread_atfork(NULL, NULL, reset_in_child) == 0)
        atfork_done = 1;
    pthread_t t;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pool.started = pthread_create(&t, &attr, helper_main, NULL) == 0 ? 1 : -1;
    pthread_attr_destroy(&attr);
    return pool.started > 0;
}

static int64_t copy_many(struct cxlhm_copy *jobs, int64_t n, int to_host)
{
    struct call c = {jobs, n, to_host, 0};
    int64_t bytes = 0;
    for (int64_t i = 0; i < n; i++)
        bytes += jobs[i].len + (jobs[i].hash_at ? jobs[i].hash_len : 0);
    if (n < 2 || bytes < CXLHM_COPY_HELPER_MIN_BYTES || pthread_mutex_trylock(&pool.busy) != 0) {
        take_jobs(&c);
        return 0;
    }
    if (!helper_running()) {
        pthread_mutex_unlock(&pool.busy);
        take_jobs(&c);
        return 0;
    }
    int64_t before = atomic_load(&helper_ran_total);
    pthread_mutex_lock(&pool.lock);
    pool.current = &c;
    pool.generation++;
    pthread_cond_signal(&pool.wake);
    pthread_mutex_unlock(&pool.lock);
    take_jobs(&c);
    pthread_mutex_lock(&pool.lock);
    pool.current = NULL; /* from here the helper joins no more */
    pthread_mutex_unlock(&pool.lock);
    /* it runs its last job, at most one: spin a little, then yield (on a busy machine
     * the helper may have lost its core, maybe to this thread) */
    for (int spins = 0; atomic_load(&pool.helper_in); spins++) {
        if (spins < 4096)
            cpu_relax();
        else
            sched_yield();
    }
    int64_t helper_ran = atomic_load(&helper_ran_total) - before;
    pthread_mutex_unlock(&pool.busy);
    return helper_ran;
}

int64_t cxlhm_copy_many(struct cxlhm_copy *jobs, int64_t n)
{
    return copy_many(jobs, n, 0);
}

int64_t cxlhm_copy_out_many(struct cxlhm_copy *jobs, int64_t n)
{
    return copy_many(jobs, n, 1);
}
