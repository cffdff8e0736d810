/*
 * shm.c - memory that the processes of one machine map at once, and the all-reduce that reads
 * it in place. Each process creates a segment: a sparse file in /dev/shm as large as the
 * machine's memory (pages exist only where something was allocated), which every other process
 * maps; once all have, the files are unlinked, so nothing is left behind however the job ends.
 * Buffers allocated in a segment (loom__shm_alloc) are reached by the others at the same
 * offset in their mapping of it. The all-reduce then does what the local group does for the
 * threads of one process: each rank adds its 1/world of the elements over every rank's buffer,
 * in rank order, writing the sum into all of them (loom__reduce_slice), between two barriers
 * kept in rank 0's segment. No copies in or out: MPI's shared-memory transport copies every
 * buffer in and out, which made crossing processes cost a small model a quarter of its step
 * (bench/RESULTS.md).
 *
 * The barrier spins briefly, then sleeps on a futex (the processes may be more than the CPUs).
 * It has no deadline of its own: the caller keeps one (mpi.c's watchdog ends the job).
 */
#define _GNU_SOURCE
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#define MAX_RANKS  256
#define HEAD       65536 /* the start of every segment: rank 0's holds the barrier */
#define NOT_SHARED UINT64_MAX

typedef struct {
    atomic_uint count, gen; /* gen: a 32-bit word, as futexes are */
    atomic_uint sleepers;
    _Alignas(64) uint64_t off[MAX_RANKS]; /* each rank's buffer in its segment, or NOT_SHARED */
} control;

struct loom__shm {
    int rank, size;
    int fd;               /* this process's segment */
    size_t cap;           /* every segment's size */
    size_t used;          /* allocated in this one (a bump: freed ranges return their pages) */
    char name[96];        /* this process's file name, until unlinked */
    char *seg[MAX_RANKS]; /* every rank's segment, mapped here */
    control *ctl;         /* in rank 0's */
};

static void seg_name(char *buf, size_t size, const char *job, int rank) {
    snprintf(buf, size, "/%s-%d", job, rank);
}

loom__shm *loom__shm_new(const char *job, int rank, int size) {
    if (size < 1 || size > MAX_RANKS || rank < 0 || rank >= size)
        return NULL;
    loom__shm *n = loom__calloc(1, sizeof *n);
    if (!n)
        return NULL;
    n->rank = rank, n->size = size;
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    n->cap = pages > 0 && page > 0 ? (size_t)pages * (size_t)page : (size_t)1 << 34;
    n->used = HEAD;
    seg_name(n->name, sizeof n->name, job, rank);
    n->fd = shm_open(n->name, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    if (n->fd < 0 || ftruncate(n->fd, (off_t)n->cap) != 0 ||
        posix_fallocate(n->fd, 0, HEAD) != 0) { /* the head's pages exist: no SIGBUS there */
        loom__shm_free(n);
        return NULL;
    }
    return n;
}

loom_status loom__shm_attach(loom__shm *n, const char *job) {
    for (int r = 0; r < n->size; r++) {
        int fd = n->fd;
        if (r != n->rank) {
            char name[96];
            seg_name(name, sizeof name, job, r);
            if ((fd = shm_open(name, O_RDWR | O_CLOEXEC, 0600)) < 0)
                return LOOM_EIO;
        }
        void *p = mmap(NULL, n->cap, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
        if (fd != n->fd)
            close(fd);
        if (p == MAP_FAILED)
            return LOOM_ENOMEM;
        n->seg[r] = p;
    }
    n->ctl = (control *)(void *)n->seg[0];
    return LOOM_OK;
}

void loom__shm_unlink(loom__shm *n) {
    if (n && n->name[0]) {
        shm_unlink(n->name);
        n->name[0] = 0;
    }
}

void loom__shm_free(loom__shm *n) {
    if (!n)
        return;
    loom__shm_unlink(n);
    for (int r = 0; r < n->size; r++)
        if (n->seg[r])
            munmap(n->seg[r], n->cap);
    if (n->fd >= 0)
        close(n->fd);
    loom__free(n);
}

/* The offset of [p, p + bytes) in this process's segment, or NOT_SHARED. */
static uint64_t offset_of(const loom__shm *n, const void *p, size_t bytes) {
    const char *s = n->seg[n->rank], *c = p;
    if (!s || c < s + HEAD || c > s + n->used || bytes > (size_t)(s + n->used - c))
        return NOT_SHARED;
    return (uint64_t)(c - s);
}

void *loom__shm_alloc(loom__shm *n, size_t bytes) {
    size_t len = (bytes + 4095) & ~(size_t)4095;
    if (!n || !n->seg[n->rank] || len > n->cap - n->used)
        return NULL;
    /* the pages are taken now, so that running out of /dev/shm is this NULL, never a SIGBUS */
    if (posix_fallocate(n->fd, (off_t)n->used, (off_t)len) != 0)
        return NULL;
    void *p = n->seg[n->rank] + n->used;
    n->used += len;
    return p;
}

bool loom__shm_release(loom__shm *n, void *p, size_t bytes) {
    if (!n || !p || offset_of(n, p, bytes) == NOT_SHARED)
        return false;
    size_t len = (bytes + 4095) & ~(size_t)4095;
    (void)fallocate(n->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                    (off_t)((char *)p - n->seg[n->rank]), (off_t)len);
    return true;
}

static void futex(atomic_uint *word, int op, unsigned val) {
    struct timespec ts = {0, 10000000}; /* a wait is re-checked every 10 ms, whatever happens */
    syscall(SYS_futex, (unsigned *)(uintptr_t)word, op, val, op == FUTEX_WAIT ? &ts : NULL, NULL,
            0);
}

static void barrier(loom__shm *n) {
    control *c = n->ctl;
    unsigned gen = atomic_load(&c->gen);
    if (atomic_fetch_add(&c->count, 1) == (unsigned)n->size - 1) {
        atomic_store(&c->count, 0);
        atomic_fetch_add(&c->gen, 1);
        if (atomic_load(&c->sleepers))
            futex(&c->gen, FUTEX_WAKE, INT32_MAX);
        return;
    }
    double end = loom__now() + 100e-6; /* about a step's lateness between processes */
    for (int i = 1; atomic_load(&c->gen) == gen; i++) {
        if (i % 64 == 0 && loom__now() > end)
            break;
#if defined(__x86_64__)
        __builtin_ia32_pause();
#endif
    }
    if (atomic_load(&c->gen) == gen) {
        atomic_fetch_add(&c->sleepers, 1);
        while (atomic_load(&c->gen) == gen)
            futex(&c->gen, FUTEX_WAIT, gen);
        atomic_fetch_sub(&c->sleepers, 1);
    }
}

bool loom__shm_allreduce(loom__shm *n, float *buf, int64_t count, bool mean) {
    control *c = n->ctl;
    c->off[n->rank] = offset_of(n, buf, sizeof(float) * (size_t)count);
    barrier(n);
    float *rows[MAX_RANKS];
    bool shared = true;
    for (int r = 0; r < n->size; r++) {
        shared = shared && c->off[r] != NOT_SHARED;
        rows[r] = shared ? (float *)(void *)(n->seg[r] + c->off[r]) : NULL;
    }
    if (!shared) /* every rank sees the same offsets, so all of them return here */
        return false;
    int64_t lo, hi;
    loom__slice(count, n->size, n->rank, &lo, &hi);
    loom__reduce_slice(rows, n->size, lo, hi, mean);
    barrier(n);
    return true;
}
