/*
 * loader.c - batches over a dataset. The order of epoch e is a Fisher-Yates permutation whose
 * random numbers come from Philox stream (2, e) of the seed, so any epoch's order can be
 * recomputed without replaying earlier ones (a resumed run gets the same batches). The end of an
 * epoch starts the next one, so no call is needed between epochs. The final short batch is kept
 * (a smaller batch) unless drop_last.
 * Batches are assembled one ahead by a thread of the loader's own, into a buffer the caller is
 * not holding, while the caller trains on the current one (the samples and their order are the
 * same as without it; without the thread the loader assembles each batch when asked). Three
 * buffers: the batch handed out, the one before it (a step submitted with loom_graph_submit may
 * still be reading it while the next is recorded) and the one being assembled.
 */
#define _GNU_SOURCE /* pthread_setname_np */
#include "internal.h"

#include <pthread.h>
#include <string.h>

enum { NBUF = 3 };
static int after(int buf) {
    return (buf + 1) % NBUF;
}

struct loom_loader {
    const loom_dataset *d;
    loom_loader_config c;
    int64_t epoch;
    int64_t *order;
    int64_t pos;
    float *x[NBUF];
    int32_t *y[NBUF];
    int cur; /* the buffer last handed out */
    /* the batch being assembled ahead: rows [job_pos, job_pos + job_take) of epoch job_epoch into
     * buffer after(cur); under mu */
    pthread_t thread;
    bool threaded, pending, ready, quit;
    int64_t job_epoch, job_pos, job_take;
    int job_buf;
    pthread_mutex_t mu;
    pthread_cond_t go, done;
};

static void fill(loom_loader *l, int buf, int64_t pos, int64_t take) {
    const int32_t *y = loom__dataset_y(l->d);
    int64_t sn = loom__dataset_sample_numel(l->d);
    enum { AHEAD = 4 }; /* samples whose lines are on their way while one is converted */
    for (int64_t i = 0; i < take && i < AHEAD; i++)
        loom__dataset_prefetch(l->d, l->order[pos + i]);
    for (int64_t i = 0; i < take; i++) {
        int64_t s = l->order[pos + i];
        if (i + AHEAD < take)
            loom__dataset_prefetch(l->d, l->order[pos + i + AHEAD]);
        loom__dataset_sample(l->d, s, l->x[buf] + i * sn);
        l->y[buf][i] = y[s];
    }
}

static void *assembler(void *arg) {
    loom_loader *l = arg;
    pthread_mutex_lock(&l->mu);
    for (;;) {
        while (!l->pending && !l->quit)
            pthread_cond_wait(&l->go, &l->mu);
        if (l->quit)
            break;
        pthread_mutex_unlock(&l->mu);
        loom__keep_off_held_cpus(); /* never preempt a device's step */
        fill(l, l->job_buf, l->job_pos, l->job_take);
        pthread_mutex_lock(&l->mu);
        l->pending = false, l->ready = true;
        pthread_cond_signal(&l->done);
    }
    pthread_mutex_unlock(&l->mu);
    return NULL;
}

/* Waits for the batch being assembled, if any. */
static void settle(loom_loader *l) {
    if (!l->threaded)
        return;
    pthread_mutex_lock(&l->mu);
    while (l->pending)
        pthread_cond_wait(&l->done, &l->mu);
    pthread_mutex_unlock(&l->mu);
}

/* Rows of the batch starting at pos, 0 when the epoch has no further batch. */
static int64_t batch_rows(const loom_loader *l, int64_t pos) {
    int64_t left = loom_dataset_count(l->d) - pos;
    int64_t take = left < l->c.batch_size ? left : l->c.batch_size;
    return take <= 0 || (l->c.drop_last && take < l->c.batch_size) ? 0 : take;
}

/* Starts assembling the batch at l->pos into the buffer the caller does not hold. */
static void ahead(loom_loader *l) {
    int64_t take = batch_rows(l, l->pos);
    if (!l->threaded || take == 0)
        return;
    pthread_mutex_lock(&l->mu);
    l->job_epoch = l->epoch, l->job_pos = l->pos, l->job_take = take, l->job_buf = after(l->cur);
    l->pending = true, l->ready = false;
    pthread_cond_signal(&l->go);
    pthread_mutex_unlock(&l->mu);
}

loom_loader *loom_loader_new(const loom_dataset *d, const loom_loader_config *c) {
    loom_loader_config cfg = c ? *c : (loom_loader_config){0};
    if (cfg.batch_size == 0)
        cfg.batch_size = 128;
    if (!d || cfg.batch_size < 1) {
        loom__error(LOOM_EINVAL, "loom_loader_new: %s",
                    d ? "batch size must be >= 1" : "NULL dataset");
        return NULL;
    }
    int64_t n = loom_dataset_count(d), sn = loom__dataset_sample_numel(d);
    loom_loader *l = loom__calloc(1, sizeof *l);
    if (!l)
        return NULL;
    l->d = d, l->c = cfg;
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->go, NULL);
    pthread_cond_init(&l->done, NULL);
    l->order = loom__malloc(sizeof(int64_t) * (size_t)(n + 1));
    bool ok = l->order != NULL;
    for (int b = 0; b < NBUF; b++) {
        l->x[b] = loom__malloc(sizeof(float) * (size_t)(cfg.batch_size * sn));
        l->y[b] = loom__malloc(sizeof(int32_t) * (size_t)cfg.batch_size);
        ok = ok && l->x[b] && l->y[b];
    }
    if (!ok) {
        loom_loader_free(l);
        return NULL;
    }
    l->threaded = pthread_create(&l->thread, NULL, assembler, l) == 0; /* else: when asked */
    if (l->threaded) /* named here, so that it has its name before this returns */
        pthread_setname_np(l->thread, "loom-loader");
    loom_loader_start_epoch(l, 0);
    return l;
}

void loom_loader_free(loom_loader *l) {
    if (!l)
        return;
    if (l->threaded) {
        pthread_mutex_lock(&l->mu);
        l->quit = true;
        pthread_cond_signal(&l->go);
        pthread_mutex_unlock(&l->mu);
        pthread_join(l->thread, NULL);
    }
    pthread_mutex_destroy(&l->mu);
    pthread_cond_destroy(&l->go);
    pthread_cond_destroy(&l->done);
    loom__free(l->order);
    for (int b = 0; b < NBUF; b++)
        loom__free(l->x[b]), loom__free(l->y[b]);
    loom__free(l);
}

void loom_loader_start_epoch(loom_loader *l, int64_t epoch) {
    settle(l); /* the thread reads the order */
    int64_t n = loom_dataset_count(l->d);
    l->epoch = epoch;
    for (int64_t i = 0; i < n; i++)
        l->order[i] = i;
    l->pos = 0;
    if (!l->c.no_shuffle) {
        uint64_t stream = (2ull << 32) | (uint32_t)epoch;
        uint32_t w[4];
        for (int64_t i = n - 1; i > 0; i--) {
            uint64_t k = (uint64_t)(n - 1 - i);
            if (k % 4 == 0)
                loom_philox(l->c.seed, stream, k / 4, w);
            int64_t j = (int64_t)(((uint64_t)w[k % 4] * (uint64_t)(i + 1)) >> 32);
            int64_t t = l->order[i];
            l->order[i] = l->order[j];
            l->order[j] = t;
        }
    }
    ahead(l);
}

void loom_loader_seek(loom_loader *l, int64_t epoch, int64_t batch) {
    loom_loader_start_epoch(l, epoch);
    if (batch <= 0)
        return;
    settle(l); /* the batch at 0 was being assembled */
    int64_t n = loom_dataset_count(l->d);
    l->pos = batch < (n + l->c.batch_size - 1) / l->c.batch_size ? batch * l->c.batch_size : n;
    ahead(l);
}

bool loom_loader_next(loom_loader *l, loom_batch *b) {
    int64_t take = batch_rows(l, l->pos);
    if (take == 0) {
        loom_loader_start_epoch(l, l->epoch + 1); /* the next loop gets the next epoch */
        return false;
    }
    settle(l);
    if (!(l->ready && l->job_epoch == l->epoch && l->job_pos == l->pos && l->job_take == take))
        fill(l, after(l->cur), l->pos, take);
    l->ready = false;
    l->cur = after(l->cur);
    l->pos += take;
    b->x = l->x[l->cur], b->y = l->y[l->cur], b->n = take;
    b->ndim = loom_dataset_sample_ndim(l->d) + 1;
    b->shape[0] = take;
    for (int i = 1; i < b->ndim; i++)
        b->shape[i] = loom_dataset_sample_shape(l->d)[i - 1];
    ahead(l);
    return true;
}

int64_t loom_loader_batches(const loom_loader *l) {
    int64_t n = loom_dataset_count(l->d), bs = l->c.batch_size;
    return l->c.drop_last ? n / bs : (n + bs - 1) / bs;
}

int64_t loom_loader_batch_rows(const loom_loader *l, int64_t j) {
    return j < 0 || j >= loom_loader_batches(l) ? 0 : batch_rows(l, j * l->c.batch_size);
}

int64_t loom_loader_batch_size(const loom_loader *l) {
    return l->c.batch_size;
}

int64_t loom_loader_epoch(const loom_loader *l) {
    return l->epoch;
}
