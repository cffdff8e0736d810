/*
 * loader.c - batches over a dataset. The order of epoch e is a Fisher-Yates permutation whose
 * random numbers come from Philox stream (2, e) of the seed, so any epoch's order can be
 * recomputed without replaying earlier ones (a resumed run gets the same batches). The end of an
 * epoch starts the next one, so no call is needed between epochs. The final short batch is kept
 * (a smaller batch) unless drop_last.
 */
#include "internal.h"

#include <string.h>

struct loom_loader {
    const loom_dataset *d;
    loom_loader_config c;
    int64_t epoch;
    int64_t *order;
    int64_t pos;
    float *x;
    int32_t *y;
};

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
    l->order = loom__malloc(sizeof(int64_t) * (size_t)(n + 1));
    l->x = loom__malloc(sizeof(float) * (size_t)(cfg.batch_size * sn));
    l->y = loom__malloc(sizeof(int32_t) * (size_t)cfg.batch_size);
    if (!l->order || !l->x || !l->y) {
        loom_loader_free(l);
        return NULL;
    }
    loom_loader_start_epoch(l, 0);
    return l;
}

void loom_loader_free(loom_loader *l) {
    if (!l)
        return;
    loom__free(l->order);
    loom__free(l->x);
    loom__free(l->y);
    loom__free(l);
}

void loom_loader_start_epoch(loom_loader *l, int64_t epoch) {
    int64_t n = loom_dataset_count(l->d);
    l->epoch = epoch;
    for (int64_t i = 0; i < n; i++)
        l->order[i] = i;
    l->pos = 0;
    if (l->c.no_shuffle)
        return;
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

bool loom_loader_next(loom_loader *l, loom_batch *b) {
    int64_t n = loom_dataset_count(l->d), left = n - l->pos, sn;
    int64_t take = left < l->c.batch_size ? left : l->c.batch_size;
    if (take <= 0 || (l->c.drop_last && take < l->c.batch_size)) {
        loom_loader_start_epoch(l, l->epoch + 1); /* the next loop gets the next epoch */
        return false;
    }
    const int32_t *y = loom__dataset_y(l->d);
    sn = loom__dataset_sample_numel(l->d);
    for (int64_t i = 0; i < take; i++) {
        int64_t s = l->order[l->pos + i];
        loom__dataset_sample(l->d, s, l->x + i * sn);
        l->y[i] = y[s];
    }
    l->pos += take;
    b->x = l->x, b->y = l->y, b->n = take;
    b->ndim = loom_dataset_sample_ndim(l->d) + 1;
    b->shape[0] = take;
    for (int i = 1; i < b->ndim; i++)
        b->shape[i] = loom_dataset_sample_shape(l->d)[i - 1];
    return true;
}

int64_t loom_loader_batches(const loom_loader *l) {
    int64_t n = loom_dataset_count(l->d), bs = l->c.batch_size;
    return l->c.drop_last ? n / bs : (n + bs - 1) / bs;
}

int64_t loom_loader_epoch(const loom_loader *l) {
    return l->epoch;
}
