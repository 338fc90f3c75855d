/*
 * The baseline for bench_window.py: the smallest userfaultfd handler that serves a
 * window from an SSD image - one thread; per fault, pread() the whole block with
 * O_DIRECT into a buffer and install it with one UFFDIO_COPY. No firmware, no
 * eviction, no write tracking. Compiled by the bench with the system gcc:
 *   gcc -O2 -shared -fPIC -pthread -o uffd_minimal.so uffd_minimal.c
 * Also holds the reader both handlers are timed with.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <linux/userfaultfd.h>

struct minimal {
    char *base;
    uint64_t capacity, block;
    int uffd, fd, stop_fd;
    char *buf;
    pthread_t thread;
    long faults;
};

static void *serve(void *arg)
{
    struct minimal *m = arg;
    struct uffd_msg msgs[64];
    for (;;) {
        struct pollfd fds[2] = {{m->uffd, POLLIN, 0}, {m->stop_fd, POLLIN, 0}};
        poll(fds, 2, -1);
        if (fds[1].revents)
            return NULL;
        ssize_t r = read(m->uffd, msgs, sizeof msgs);
        for (int i = 0; i < (int)(r > 0 ? r / (ssize_t)sizeof msgs[0] : 0); i++) {
            if (msgs[i].event != UFFD_EVENT_PAGEFAULT)
                continue;
            uint64_t off = (msgs[i].arg.pagefault.address - (uint64_t)m->base) / m->block * m->block;
            if (pread(m->fd, m->buf, m->block, (off_t)off) != (ssize_t)m->block)
                continue;
            struct uffdio_copy c = {.dst = (uint64_t)m->base + off, .src = (uint64_t)m->buf, .len = m->block};
            if (ioctl(m->uffd, UFFDIO_COPY, &c) == 0)
                m->faults++; /* EEXIST: a second fault on a block already installed */
        }
    }
}

void *minimal_open(uint64_t capacity, uint64_t block, int fd)
{
    struct minimal *m = calloc(1, sizeof *m);
    m->capacity = capacity;
    m->block = block;
    m->fd = fd;
    m->uffd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
    struct uffdio_api api = {.api = UFFD_API};
    if (m->uffd < 0 || ioctl(m->uffd, UFFDIO_API, &api))
        return NULL;
    m->base = mmap(NULL, capacity, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    madvise(m->base, capacity, MADV_NOHUGEPAGE);
    struct uffdio_register reg = {.range = {(uint64_t)m->base, capacity}, .mode = UFFDIO_REGISTER_MODE_MISSING};
    if (ioctl(m->uffd, UFFDIO_REGISTER, &reg))
        return NULL;
    if (posix_memalign((void **)&m->buf, 4096, block))
        return NULL;
    memset(m->buf, 0, block);
    m->stop_fd = eventfd(0, EFD_CLOEXEC);
    pthread_create(&m->thread, NULL, serve, m);
    return m;
}

char *minimal_base(struct minimal *m) { return m->base; }

/* Stops the handler; returns the faults it served (counted after the join: the
 * UFFDIO_COPY wakes the reader before the counter moves). */
long minimal_close(struct minimal *m)
{
    uint64_t one = 1;
    if (write(m->stop_fd, &one, sizeof one) < 0) {}
    pthread_join(m->thread, NULL);
    munmap(m->base, m->capacity);
    close(m->uffd);
    close(m->stop_fd);
    free(m->buf);
    long faults = m->faults;
    free(m);
    return faults;
}

/* Read every byte of the blocks in `order` (sum of 64-bit words); returns the sum
 * so the compiler cannot drop the loads. */
uint64_t read_blocks(const char *base, const int64_t *order, int64_t n, uint64_t block)
{
    uint64_t sum = 0;
    for (int64_t i = 0; i < n; i++) {
        const uint64_t *p = (const uint64_t *)(base + (uint64_t)order[i] * block);
        for (uint64_t k = 0; k < block / 8; k++)
            sum += p[k];
    }
    return sum;
}
