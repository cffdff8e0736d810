/*
 * accelerator.c - the mid-level API, after Hugging Face Accelerate: devices, one step graph set to
 * run on them, and the prepared model/optimizer/loader. Each batch becomes sharded batch inputs of
 * a fresh step; backward and step record the gradient averaging and the update into that step.
 */
#include "internal.h"

struct loom_accelerator {
    loom_devices *devs;
    loom_graph *g;
    loom_model *m;
    loom_optim *o;
    loom_loader *train;
    loom_batch batch;
    int64_t flat[2];
    bool micro; /* the step's backward is a micro-batch's that is not the last of its step */
};

loom_accelerator *loom_accelerator_new(const loom_accelerator_config *c) {
    loom_accelerator_config cfg = c ? *c : (loom_accelerator_config){0};
    loom_accelerator *a = loom__calloc(1, sizeof *a);
    if (!a)
        return NULL;
    a->devs = loom_devices_new(&(loom_devices_config){.count = cfg.devices,
                                                      .cores = cfg.cores_per_device,
                                                      .timeout_s = cfg.timeout_s,
                                                      .detect_anomaly = cfg.detect_anomaly});
    if (!a->devs) {
        loom__free(a);
        return NULL;
    }
    return a;
}

void loom_accelerator_free(loom_accelerator *a) {
    if (!a)
        return;
    loom_graph_free(a->g);
    loom_devices_free(a->devs);
    loom__free(a);
}

int loom_accelerator_devices(const loom_accelerator *a) {
    return loom_devices_count(a->devs);
}

loom_status loom_accelerator_prepare(loom_accelerator *a, loom_model *m, loom_optim *o,
                                     loom_loader *train) {
    if (!a || !m)
        return loom__error(LOOM_EINVAL, "loom_accelerator_prepare: NULL accelerator or model");
    loom_graph_free(a->g);
    a->g = loom_graph_new(m);
    if (!a->g)
        return LOOM_ENOMEM;
    a->m = m, a->o = o, a->train = train;
    return loom_graph_set_devices(a->g, a->devs);
}

bool loom_accelerator_next(loom_accelerator *a, loom_loader *l, loom_graph **g, loom_tensor **x,
                           loom_tensor **y) {
    l = l ? l : a->train;
    if (!a->g || !l || !loom_loader_next(l, &a->batch))
        return false;
    loom_graph_reset(a->g);
    *g = a->g;
    int64_t rows = loom_loader_batch_size(l); /* a short last batch padded: the same program */
    *x = loom_input_batch_padded(a->g, LOOM_F32, a->batch.ndim, a->batch.shape, a->batch.x, rows);
    *y = loom_input_batch_padded(a->g, LOOM_I32, 1, &a->batch.n, a->batch.y, rows);
    /* lent, not copied: the loader keeps a batch until the second next() after it, and a step
     * on it (run, or submitted by the trainer) has ended before that */
    loom_input_borrow(*x);
    loom_input_borrow(*y);
    return true;
}

void loom_accelerator_backward(loom_accelerator *a, loom_tensor *loss) {
    a->micro = false;
    loom_backward(a->g, loss);
}

void loom_accelerator_backward_accumulate(loom_accelerator *a, loom_tensor *loss, double weight,
                                          bool first, bool last) {
    a->micro = !last;
    loom_backward_accumulate(a->g, loss, weight, first, last);
}

loom_status loom_accelerator_step(loom_accelerator *a) {
    if (a->o && !a->micro)
        loom_optim_step(a->g, a->o);
    return loom_graph_run(a->g);
}

loom_status loom__accelerator_submit(loom_accelerator *a) {
    if (a->o && !a->micro)
        loom_optim_step(a->g, a->o);
    return loom_graph_submit(a->g);
}

loom_status loom_accelerator_run(loom_accelerator *a) {
    return loom_graph_run(a->g);
}

loom_devices *loom__accelerator_devs(const loom_accelerator *a) {
    return a->devs;
}

const int32_t *loom__accelerator_labels(const loom_accelerator *a) {
    return a->batch.y;
}
