/*
 * comm.c - the collective interface's public functions (each dispatches to its group's
 * implementation, dist/internal.h), and the local implementation: ranks are threads of one
 * process, collectives run in shared memory. Every collective is built from one primitive, a
 * barrier that (a) spins briefly, then blocks on a condition variable, (b) gives up at the group's
 * deadline, naming the ranks that did not arrive (the watchdog), and (c) returns at once for
 * everyone when any rank aborts the group. Invariants: a rank publishes its buffer pointer before
 * the first barrier of a collective and does not touch another rank's buffer after the last one;
 * the reduction of element i always adds ranks 0..world-1 in order, so results are bitwise
 * repeatable.
 */
#include "internal.h"

#include <errno.h>
#include <pthread.h>
#include <string.h>
#include <time.h>

#define MAX_RANKS 256

static const loom__group_ops local_ops;

struct loom_group {
    loom__group_head h; /* h.ops is local_ops: this struct is the local group */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    atomic_int count;
    atomic_uint_fast64_t gen;
    atomic_int aborted;
    loom_status abort_status;
    char reason[512];
    const void *ptr[MAX_RANKS];
    loom_comm comms[MAX_RANKS];
};

/* The head of any group (local or not): the first member of each implementation's struct. */
static const loom__group_head *head(const loom_group *g) {
    return (const loom__group_head *)(const void *)g;
}

loom_group *loom_group_local_new(int world, double timeout_s) {
    if (world < 1 || world > MAX_RANKS || !(timeout_s >= 0 && timeout_s <= LOOM_MAX_TIMEOUT)) {
        loom__error(
            LOOM_EINVAL,
            "loom_group_local_new: world %d (expected 1 to %d), timeout %g (expected 0 to %g s)",
            world, MAX_RANKS, timeout_s, LOOM_MAX_TIMEOUT);
        return NULL;
    }
    loom_group *g = loom__calloc(1, sizeof *g);
    if (!g)
        return NULL;
    g->h = (loom__group_head){&local_ops, world, timeout_s > 0 ? timeout_s : 60.0};
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    for (int r = 0; r < world; r++) {
        g->comms[r].g = g, g->comms[r].rank = r;
        atomic_init(&g->comms[r].seq, 0);
    }
    return g;
}

static void local_free(loom_group *g) {
    pthread_mutex_destroy(&g->mu);
    pthread_cond_destroy(&g->cv);
    loom__free(g);
}

/* ---- the interface: every group's operations ------------------------------------------------ */

void loom_group_free(loom_group *g) {
    if (g)
        head(g)->ops->free(g);
}

loom_comm *loom_group_comm(loom_group *g, int rank) {
    if (!g || rank < 0 || rank >= head(g)->world)
        return NULL;
    if (head(g)->ops == &local_ops)
        return &g->comms[rank];
    return loom__mpi_comm(g, rank);
}
int loom_comm_rank(const loom_comm *c) {
    return c->rank;
}
int loom_comm_world(const loom_comm *c) {
    return head(c->g)->world;
}
uint64_t loom_comm_seq(const loom_comm *c) {
    return atomic_load(&c->seq);
}
loom_status loom_comm_allreduce(loom_comm *c, float *buf, int64_t n, loom_reduce_op op) {
    return head(c->g)->ops->allreduce(c, buf, n, op);
}
loom_status loom_comm_broadcast(loom_comm *c, float *buf, int64_t n, int root) {
    if (root < 0 || root >= head(c->g)->world)
        return loom__error(LOOM_EINVAL, "loom_comm_broadcast: root %d of %d ranks", root,
                           head(c->g)->world);
    return head(c->g)->ops->broadcast(c, buf, n, root);
}
loom_status loom_comm_allgather(loom_comm *c, const float *in, int64_t n, float *out) {
    return head(c->g)->ops->allgather(c, in, n, out);
}
loom_status loom_comm_barrier(loom_comm *c) {
    return head(c->g)->ops->barrier(c);
}
void loom_comm_abort(loom_comm *c, const char *reason) {
    head(c->g)->ops->abort(c, reason);
}
void *loom__group_shared(loom_group *g, size_t bytes) {
    return head(g)->ops->shared ? head(g)->ops->shared(g, bytes) : NULL;
}
/* (the implementation's release tells its own memory from ordinary memory) */
bool loom__group_unshare(loom_group *g, void *p, size_t bytes) {
    return p && head(g)->ops->unshare && head(g)->ops->unshare(g, p, bytes);
}
void *loom_group_alloc(loom_group *g, size_t bytes) {
    void *p = g ? loom__group_shared(g, bytes) : NULL;
    return p ? p : loom__malloc(bytes ? bytes : 1);
}
void loom_group_release(loom_group *g, void *p, size_t bytes) {
    if (!g || !loom__group_unshare(g, p, bytes))
        loom__free(p);
}

/* ---- local: threads in shared memory ------------------------------------------------------------
 */

static void fail_group(loom_group *g, loom_status s, const char *reason) {
    pthread_mutex_lock(&g->mu);
    if (!atomic_load(&g->aborted)) {
        snprintf(g->reason, sizeof g->reason, "%s", reason);
        g->abort_status = s;
        atomic_store(&g->aborted, 1);
    }
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

static void local_abort(loom_comm *c, const char *reason) {
    fail_group(c->g, LOOM_EABORTED, reason);
}

/* The status and reason of an aborted group, on this thread. */
static loom_status aborted(loom_group *g) {
    pthread_mutex_lock(&g->mu);
    loom_status s = loom__error(g->abort_status, "%s", g->reason);
    pthread_mutex_unlock(&g->mu);
    return s;
}

/* The watchdog's message: which ranks have not reached this rank's collective. */
static void name_missing(loom_comm *c, char *buf, size_t size) {
    loom_group *g = c->g;
    size_t k = (size_t)snprintf(buf, size,
                                "watchdog: device %d waited %.1f s in collective #%llu "
                                "for device(s)",
                                c->rank, g->h.timeout, (unsigned long long)atomic_load(&c->seq));
    for (int r = 0; r < g->h.world && k < size; r++) {
        uint64_t s = atomic_load(&g->comms[r].seq);
        if (s < atomic_load(&c->seq))
            k += (size_t)snprintf(buf + k, size - k, " %d (at #%llu)", r, (unsigned long long)s);
    }
}

static loom_status barrier(loom_comm *c) {
    loom_group *g = c->g;
    if (atomic_load(&g->aborted))
        return aborted(g);
    if (g->h.world == 1)
        return LOOM_OK;
    uint64_t gen = atomic_load(&g->gen);
    if (atomic_fetch_add(&g->count, 1) == g->h.world - 1) {
        atomic_store(&g->count, 0);
        pthread_mutex_lock(&g->mu);
        atomic_fetch_add(&g->gen, 1);
        pthread_cond_broadcast(&g->cv);
        pthread_mutex_unlock(&g->mu);
        return LOOM_OK;
    }
    for (int i = 0; i < 20000; i++) {
        if (atomic_load(&g->gen) != gen)
            return LOOM_OK;
        if (atomic_load(&g->aborted))
            return aborted(g);
#if defined(__x86_64__)
        __builtin_ia32_pause();
#endif
    }
    struct timespec dl;
    loom__deadline_in(&dl, g->h.timeout);
    pthread_mutex_lock(&g->mu);
    int rc = 0;
    while (atomic_load(&g->gen) == gen && !atomic_load(&g->aborted) && rc == 0)
        rc = pthread_cond_timedwait(&g->cv, &g->mu, &dl); /* (any error ends the wait) */
    bool passed = atomic_load(&g->gen) != gen;
    pthread_mutex_unlock(&g->mu);
    if (passed)
        return LOOM_OK;
    if (rc != 0 && !atomic_load(&g->aborted)) {
        char msg[512];
        name_missing(c, msg, sizeof msg);
        fail_group(g, LOOM_ETIMEDOUT, msg);
        return loom__error(LOOM_ETIMEDOUT, "%s", msg);
    }
    return aborted(g);
}

/* Starts a collective: counts it and publishes this rank's buffer. */
static loom_status enter(loom_comm *c, const void *buf) {
    atomic_fetch_add(&c->seq, 1);
    c->g->ptr[c->rank] = buf;
    return barrier(c);
}

void loom__slice(int64_t n, int world, int rank, int64_t *lo, int64_t *hi) {
    int64_t per = n / world, extra = n % world;
    *lo = rank * per + (rank < extra ? rank : extra);
    *hi = *lo + per + (rank < extra ? 1 : 0);
}

/* Elements [lo, hi) of every rank's buffer p[0..w) set to their sum over ranks 0..w-1 in order
 * (then divided by w: mean), CH at a time in loops of a fixed length that the compiler turns into
 * vector instructions (AVX-512 where the CPU has it; an element at a time took 1.7 times as long,
 * bench/RESULTS.md). The same operations on each element either way.
 */
#define REDUCE_SLICE(NAME, ATTR)                                                       \
    ATTR static void NAME(float *const *p, int w, int64_t lo, int64_t hi, bool mean) { \
        enum { CH = 16 };                                                              \
        for (int64_t i = lo; i < hi; i += CH) {                                        \
            int64_t m = hi - i < CH ? hi - i : CH;                                     \
            float v[CH];                                                               \
            if (m < CH) { /* the slice's ragged end */                                 \
                for (int64_t l = 0; l < m; l++) {                                      \
                    v[l] = p[0][i + l];                                                \
                    for (int r = 1; r < w; r++)                                        \
                        v[l] += p[r][i + l];                                           \
                    if (mean)                                                          \
                        v[l] /= (float)w;                                              \
                    for (int r = 0; r < w; r++)                                        \
                        p[r][i + l] = v[l];                                            \
                }                                                                      \
                break;                                                                 \
            }                                                                          \
            for (int l = 0; l < CH; l++)                                               \
                v[l] = p[0][i + l];                                                    \
            for (int r = 1; r < w; r++)                                                \
                for (int l = 0; l < CH; l++)                                           \
                    v[l] += p[r][i + l];                                               \
            if (mean)                                                                  \
                for (int l = 0; l < CH; l++)                                           \
                    v[l] /= (float)w;                                                  \
            for (int r = 0; r < w; r++)                                                \
                for (int l = 0; l < CH; l++)                                           \
                    p[r][i + l] = v[l];                                                \
        }                                                                              \
    }
REDUCE_SLICE(reduce_slice, )
#if defined(__x86_64__) && defined(__GNUC__)
REDUCE_SLICE(reduce_slice512, __attribute__((target("avx512f"))))
#endif

void loom__reduce_slice(float *const *p, int w, int64_t lo, int64_t hi, bool mean) {
#if defined(__x86_64__) && defined(__GNUC__)
    if (__builtin_cpu_supports("avx512f")) {
        reduce_slice512(p, w, lo, hi, mean);
        return;
    }
#endif
    reduce_slice(p, w, lo, hi, mean);
}

static loom_status local_allreduce(loom_comm *c, float *buf, int64_t n, loom_reduce_op op) {
    loom_status s = enter(c, buf);
    if (s)
        return s;
    loom_group *g = c->g;
    int w = g->h.world;
    int64_t lo, hi;
    loom__slice(n, w, c->rank, &lo, &hi);
    loom__reduce_slice((float *const *)(uintptr_t)g->ptr, w, lo, hi, op == LOOM_REDUCE_MEAN);
    return barrier(c);
}

static loom_status local_broadcast(loom_comm *c, float *buf, int64_t n, int root) {
    loom_status s = enter(c, buf);
    if (s)
        return s;
    if (c->rank != root && n > 0)
        memcpy(buf, c->g->ptr[root], sizeof(float) * (size_t)n);
    return barrier(c);
}

static loom_status local_allgather(loom_comm *c, const float *in, int64_t n, float *out) {
    loom_status s = enter(c, in);
    if (s)
        return s;
    for (int r = 0; r < c->g->h.world && n > 0; r++)
        memcpy(out + (size_t)r * (size_t)n, c->g->ptr[r], sizeof(float) * (size_t)n);
    return barrier(c);
}

static loom_status local_barrier(loom_comm *c) {
    return enter(c, NULL);
}

/* (threads share all memory: nothing to allocate specially) */
static const loom__group_ops local_ops = {
    "local",       local_allreduce, local_broadcast, local_allgather,
    local_barrier, local_abort,     local_free,      NULL,
    NULL};
