/*
 * team.c - the cores of one device: the thread that runs its steps and helpers pinned to cores of
 * their own, which split a kernel's outputs with it. loom__team_for hands out ranges of an index
 * space and returns when every range is done; a kernel whose outputs are split so computes each
 * output as it would alone (the same operations in the same order), so that a device's results
 * do not depend on how many cores it has.
 *
 * Between jobs a helper polls for the next one for SPIN_S, then sleeps on a condition variable:
 * a step's kernels follow each other within microseconds, and a wake-up through the scheduler
 * costs tens of them. The caller polls for the helpers' end (it has nothing else to do).
 */
#define _GNU_SOURCE
#include "internal.h"

#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>

#define SPIN_S 0.0005

struct loom__team {
    int size; /* cores: the caller and size - 1 helpers */
    pthread_t *thread;
    int *cpu; /* each helper's CPU (held), -1 unpinned */
    pthread_mutex_t mu;
    pthread_cond_t go;
    /* the job: published by gen (release), read by the helpers after seeing it (acquire) */
    loom__range_fn fn;
    void *ctx;
    int64_t n, align;
    uint64_t gen;    /* atomic: jobs started */
    int64_t pending; /* atomic: helpers not done with the current job */
    int sleepers;    /* atomic: helpers asleep (or about to be) on go */
    bool quit;       /* atomic */
    void **scratch;  /* per helper (index 1..size-1), scratch_bytes each */
    size_t scratch_bytes;
};

/* Worker w's range of [0, n): the w-th of size near-equal parts, each bound a multiple of align
 * (the last n). */
static void range_of(const loom__team *t, int w, int64_t *lo, int64_t *hi) {
    int64_t blocks = (t->n + t->align - 1) / t->align;
    *lo = blocks * w / t->size * t->align;
    *hi = w + 1 == t->size ? t->n : blocks * (w + 1) / t->size * t->align;
    if (*lo > t->n)
        *lo = t->n;
    if (*hi > t->n)
        *hi = t->n;
}

typedef struct {
    loom__team *t;
    int w;
} helper_arg;

static void *helper(void *arg) {
    helper_arg h = *(helper_arg *)arg;
    loom__free(arg);
    loom__team *t = h.t;
    uint64_t seen = 0;
    for (;;) {
        double end = loom__now() + SPIN_S;
        for (int i = 1; __atomic_load_n(&t->gen, __ATOMIC_ACQUIRE) == seen &&
                        !__atomic_load_n(&t->quit, __ATOMIC_ACQUIRE);
             i++) {
            if (i % 64 == 0 && loom__now() > end) {
                pthread_mutex_lock(&t->mu);
                __atomic_fetch_add(&t->sleepers, 1, __ATOMIC_SEQ_CST);
                while (__atomic_load_n(&t->gen, __ATOMIC_SEQ_CST) == seen &&
                       !__atomic_load_n(&t->quit, __ATOMIC_SEQ_CST))
                    pthread_cond_wait(&t->go, &t->mu);
                __atomic_fetch_sub(&t->sleepers, 1, __ATOMIC_SEQ_CST);
                pthread_mutex_unlock(&t->mu);
                break;
            }
#if defined(__x86_64__) || defined(__i386__)
            __builtin_ia32_pause();
#endif
        }
        if (__atomic_load_n(&t->quit, __ATOMIC_ACQUIRE))
            return NULL;
        seen = __atomic_load_n(&t->gen, __ATOMIC_ACQUIRE);
        int64_t lo, hi;
        range_of(t, h.w, &lo, &hi);
        if (lo < hi)
            t->fn(t->ctx, lo, hi, h.w);
        __atomic_fetch_sub(&t->pending, 1, __ATOMIC_RELEASE);
    }
}

static int start_helper(loom__team *t, int w, int cpu) {
    helper_arg *a = loom__malloc(sizeof *a);
    if (!a)
        return -1;
    *a = (helper_arg){t, w};
    pthread_attr_t attr;
    if (pthread_attr_init(&attr) != 0) {
        loom__free(a);
        return -1;
    }
    int rc = 0;
    if (cpu >= 0) {
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(cpu, &set);
        rc = pthread_attr_setaffinity_np(&attr, sizeof set, &set);
    }
    rc = rc ? rc : pthread_create(&t->thread[w - 1], &attr, helper, a);
    pthread_attr_destroy(&attr);
    if (rc != 0 && cpu >= 0) /* not allowed there: unpinned */
        return start_helper(t, w, -1);
    if (rc != 0)
        loom__free(a);
    return rc;
}

loom__team *loom__team_new(int size, const int *cpus, const char *name) {
    loom__team *t = loom__calloc(1, sizeof *t);
    if (!t)
        return NULL;
    t->size = 1;
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->go, NULL);
    int want = size > 1 ? size : 1;
    t->thread = loom__calloc((size_t)want, sizeof *t->thread);
    t->cpu = loom__calloc((size_t)want, sizeof *t->cpu);
    t->scratch = loom__calloc((size_t)want, sizeof *t->scratch);
    if (!t->thread || !t->cpu || !t->scratch) {
        loom__team_free(t);
        return NULL;
    }
    for (int w = 1; w < want; w++) {
        int cpu = cpus ? cpus[w - 1] : -1;
        if (start_helper(t, w, cpu) != 0) {
            loom__error(LOOM_EINTERNAL, "%s: cannot start core %d's helper thread", name, w);
            loom__team_free(t);
            return NULL;
        }
        t->cpu[w - 1] = cpu;
        loom__cpu_hold(cpu, true);
        t->size = w + 1;
        char tn[16];
        snprintf(tn, sizeof tn, "%.9s.%d", name, w % 100);
        pthread_setname_np(t->thread[w - 1], tn);
    }
    return t;
}

void loom__team_free(loom__team *t) {
    if (!t)
        return;
    pthread_mutex_lock(&t->mu);
    __atomic_store_n(&t->quit, true, __ATOMIC_SEQ_CST);
    pthread_cond_broadcast(&t->go);
    pthread_mutex_unlock(&t->mu);
    for (int w = 1; w < t->size; w++) {
        pthread_join(t->thread[w - 1], NULL);
        loom__cpu_hold(t->cpu[w - 1], false);
    }
    for (int w = 0; t->scratch && w < t->size; w++)
        loom__free(t->scratch[w]);
    pthread_mutex_destroy(&t->mu);
    pthread_cond_destroy(&t->go);
    loom__free(t->scratch);
    loom__free(t->cpu);
    loom__free(t->thread);
    loom__free(t);
}

int loom__team_size(const loom__team *t) {
    return t ? t->size : 1;
}

bool loom__team_reserve(loom__team *t, size_t bytes) {
    if (!t || bytes <= t->scratch_bytes)
        return true;
    for (int w = 1; w < t->size; w++) {
        loom__free(t->scratch[w]); /* (nothing in it outlives a kernel) */
        if (!(t->scratch[w] = loom__malloc(bytes))) {
            for (int v = 1; v < t->size; v++)
                loom__free(t->scratch[v]), t->scratch[v] = NULL;
            t->scratch_bytes = 0;
            return false;
        }
    }
    t->scratch_bytes = bytes;
    return true;
}

void *loom__team_scratch(const loom__team *t, int w) {
    return t && w > 0 ? t->scratch[w] : NULL;
}

void loom__team_for(loom__team *t, int64_t n, int64_t align, loom__range_fn fn, void *ctx) {
    align = align > 0 ? align : 1;
    if (!t || t->size == 1 || n <= align) {
        if (n > 0)
            fn(ctx, 0, n, 0);
        return;
    }
    t->fn = fn, t->ctx = ctx, t->n = n, t->align = align;
    __atomic_store_n(&t->pending, (int64_t)(t->size - 1), __ATOMIC_RELAXED);
    __atomic_fetch_add(&t->gen, 1, __ATOMIC_SEQ_CST); /* publishes the job */
    if (__atomic_load_n(&t->sleepers, __ATOMIC_SEQ_CST) > 0) {
        pthread_mutex_lock(&t->mu);
        pthread_cond_broadcast(&t->go);
        pthread_mutex_unlock(&t->mu);
    }
    int64_t lo, hi;
    range_of(t, 0, &lo, &hi);
    if (lo < hi)
        fn(ctx, lo, hi, 0);
    for (int i = 1; __atomic_load_n(&t->pending, __ATOMIC_ACQUIRE) > 0; i++) {
        if (i % 4096 == 0) /* (more threads than CPUs: let the helper run) */
            sched_yield();
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
    }
}
