/*
 * trainer.c - the high-level API, after PyTorch Lightning's Trainer.fit: epochs of training steps
 * supplied by the user, run on the devices through the accelerator, validation after each epoch
 * (each sample counted once: logits are gathered across devices without padding), progress
 * through the log hook and metrics kept for the caller.
 */
#include "internal.h"

#include <math.h>

struct loom_trainer {
    loom_trainer_config c;
    loom_accelerator *acc;
    loom_trainer_metrics m;
    float *logits;
    int64_t logits_cap;
};

/* The devices of every process (the batch is split over them), and whether this process is the
 * MPI job's first (or alone): the one that reports progress. */
static int world(const loom_trainer *t) {
    return loom_devices_world(loom__accelerator_devs(t->acc));
}
static bool first_process(const loom_trainer *t) {
    return loom_devices_process(loom__accelerator_devs(t->acc)) == 0;
}

loom_trainer *loom_trainer_new(const loom_trainer_config *c) {
    loom_trainer_config cfg = c ? *c : (loom_trainer_config){0};
    cfg.max_epochs = cfg.max_epochs > 0 ? cfg.max_epochs : 1;
    cfg.log_every = cfg.log_every == 0 ? 100 : cfg.log_every;
    loom_trainer *t = loom__calloc(1, sizeof *t);
    if (!t)
        return NULL;
    t->c = cfg;
    t->m.val_accuracy = NAN;
    t->acc = loom_accelerator_new(&(loom_accelerator_config){
        .devices = cfg.devices, .timeout_s = cfg.timeout_s, .detect_anomaly = cfg.detect_anomaly});
    if (!t->acc) {
        loom__free(t);
        return NULL;
    }
    return t;
}

void loom_trainer_free(loom_trainer *t) {
    if (!t)
        return;
    loom_accelerator_free(t->acc);
    loom__free(t->logits);
    loom__free(t);
}

void loom_trainer_get_metrics(const loom_trainer *t, loom_trainer_metrics *out) {
    *out = t->m;
}

int64_t loom_count_correct(const float *z, int64_t rows, int64_t classes, const int32_t *y) {
    int64_t correct = 0;
    for (int64_t i = 0; i < rows; i++) {
        int64_t best = 0;
        for (int64_t k = 1; k < classes; k++)
            best = z[i * classes + k] > z[i * classes + best] ? k : best;
        correct += best == y[i];
    }
    return correct;
}

loom_status loom_trainer_validate(loom_trainer *t, const loom_module_fns *fns, loom_loader *val,
                                  double *accuracy) {
    loom_graph *g;
    loom_tensor *x, *y;
    int64_t seen = 0, correct = 0;
    loom_loader_start_epoch(val, 0);
    while (loom_accelerator_next(t->acc, val, &g, &x, &y)) {
        loom_tensor *z = fns->validation_step(fns->ctx, g, x, y);
        loom_output(z);
        loom_status s = loom_accelerator_run(t->acc);
        if (s)
            return s;
        int64_t rows = loom_tensor_shape(y)[0] * world(t);
        int64_t classes = loom_tensor_shape(z)[1];
        if (loom__grow((void **)&t->logits, &t->logits_cap, rows * classes, sizeof(float)))
            return LOOM_ENOMEM;
        rows = loom_tensor_gather(z, t->logits);
        correct += loom_count_correct(t->logits, rows, classes, loom__accelerator_labels(t->acc));
        seen += rows;
    }
    *accuracy = seen ? (double)correct / (double)seen : NAN;
    t->m.val_accuracy = *accuracy;
    return LOOM_OK;
}

/* The wait for the step running, its failure naming the training step (counted from 1): a
 * non-finite loss (ERANGE from the wait) ends the training there. */
static loom_status wait_step(loom_trainer *t, loom_graph *g, double *loss) {
    loom_status s = loom_graph_wait(g, loss);
    if (!s)
        return s;
    char why[1024]; /* (loom__error writes where loom_last_error points) */
    snprintf(why, sizeof why, "%s", loom_last_error());
    return loom__error(s, "step %lld: %s", (long long)t->m.steps + 1, why);
}

/* A step has ended with this loss. */
static void step_ended(loom_trainer *t, int64_t epoch, double loss) {
    t->m.last_loss = loss;
    t->m.steps++;
    if (t->c.log_every > 0 && t->m.steps % t->c.log_every == 0 && first_process(t))
        loom__log(LOOM_LOG_INFO, "epoch %lld step %lld loss %.4f", (long long)epoch + 1,
                  (long long)t->m.steps, t->m.last_loss);
}

/* One epoch; *done when max_steps is reached. Each step is submitted, the next recorded while
 * it runs, then it is waited for (the devices do not wait for the host between steps). */
static loom_status fit_epoch(loom_trainer *t, const loom_module_fns *fns, loom_loader *train,
                             int64_t epoch, bool *done) {
    loom_graph *g = NULL;
    loom_tensor *x, *y;
    int64_t samples = 0, submitted = t->m.steps;
    bool running = false;
    double t0 = loom__now(), loss;
    loom_loader_start_epoch(train, epoch);
    while (!*done && loom_accelerator_next(t->acc, NULL, &g, &x, &y)) {
        loom_accelerator_backward(t->acc, fns->training_step(fns->ctx, g, x, y));
        loom_status s = running ? wait_step(t, g, &loss) : LOOM_OK;
        if (s)
            return s;
        if (running)
            step_ended(t, epoch, loss);
        if ((s = loom__accelerator_submit(t->acc)))
            return s;
        running = true;
        samples += loom_tensor_shape(y)[0] * world(t);
        *done = t->c.max_steps > 0 && ++submitted >= t->c.max_steps;
    }
    if (running) {
        loom_status s = wait_step(t, g, &loss);
        if (s)
            return s;
        step_ended(t, epoch, loss);
    }
    t->m.samples_per_s = (double)samples / (loom__now() - t0);
    return LOOM_OK;
}

loom_status loom_trainer_fit(loom_trainer *t, loom_model *m, loom_optim *o,
                             const loom_module_fns *fns, loom_loader *train, loom_loader *val) {
    if (!t || !m || !o || !fns || !fns->training_step || !train)
        return loom__error(LOOM_EINVAL, "loom_trainer_fit: NULL argument (model, optimizer, "
                                        "training_step and loader are required)");
    loom_status s = loom_accelerator_prepare(t->acc, m, o, train);
    bool done = false;
    for (int64_t e = 0; !s && e < t->c.max_epochs && !done; e++) {
        s = fit_epoch(t, fns, train, e, &done);
        t->m.epochs = e + 1;
        double acc = NAN;
        if (!s && val && fns->validation_step)
            s = loom_trainer_validate(t, fns, val, &acc);
        if (!s && t->c.log_every > 0 && first_process(t))
            loom__log(LOOM_LOG_INFO,
                      "epoch %lld: loss %.4f, validation accuracy %.4f, %.0f "
                      "samples/s",
                      (long long)e + 1, t->m.last_loss, acc, t->m.samples_per_s);
    }
    return s;
}
