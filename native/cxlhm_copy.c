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
 *
 * The helper sleeps on a condition variable between runs (no spinning: the machine may
 * have two cores). A call publishes itself under the pool's lock and withdraws under it;
 * the helper joins a call only while it is published, and the caller waits for a helper
 * that joined to leave before the jobs (on the caller's stack) go away. After fork() the
 * child has no helper thread: the child handler resets the pool, and it starts afresh.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#include "cxlhm_copy.h"

/* Runs below this many bytes (copies plus checksums) stay on the calling thread: waking
 * the helper costs ~10-30 us in a VM. */
#define HELPER_MIN_BYTES (192 * 1024)

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
    _Atomic int64_t next;
};

static struct {
    pthread_mutex_t busy; /* held by the one caller that has the helper */
    pthread_mutex_t lock;
    pthread_cond_t wake;
    int started;
    uint64_t generation;
    struct call *current; /* the published call, or NULL */
    _Atomic int helper_in; /* the helper is running jobs of a call */
} pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0, NULL, 0};

void cxlhm_copy_set_hash(void *xxh3_64bits)
{
    copy_hash = (hash_fn)xxh3_64bits;
}

static void run_job(struct cxlhm_copy *j)
{
    if (j->dst && j->len > 0)
        memcpy((void *)(intptr_t)j->dst, (const void *)(intptr_t)j->src, (size_t)j->len);
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
        run_job(&c->jobs[i]);
        ran++;
    }
}

static _Atomic int64_t helper_ran_total; /* jobs the helper ran, for the caller's return */

static void *helper_main(void *unused)
{
    (void)unused;
    uint64_t seen = 0;
    pthread_mutex_lock(&pool.lock);
    for (;;) {
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

int64_t cxlhm_copy_many(struct cxlhm_copy *jobs, int64_t n)
{
    struct call c = {jobs, n, 0};
    int64_t bytes = 0;
    for (int64_t i = 0; i < n; i++)
        bytes += jobs[i].len + (jobs[i].hash_at ? jobs[i].hash_len : 0);
    if (n < 2 || bytes < HELPER_MIN_BYTES || pthread_mutex_trylock(&pool.busy) != 0) {
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
