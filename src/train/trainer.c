/*
 * trainer.c - the high-level API, after PyTorch Lightning's Trainer.fit: epochs of training steps
 * supplied by the user, run on the devices through the accelerator, validation after each epoch
 * (each sample counted once: logits are gathered across devices without padding), progress
 * through the log hook and metrics kept for the caller; checkpoints of the whole state (Lightning's
 * ModelCheckpoint) and resuming from one exactly where the run was: the step count, the epoch and
 * the batches of it done (the loader's order is keyed by seed and epoch), the optimizer.
 */
#include "internal.h"

#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

struct loom_trainer {
    loom_trainer_config c;
    loom_accelerator *acc;
    loom_trainer_metrics m;
    float *logits;
    int64_t logits_cap;
    volatile sig_atomic_t stop; /* loom_trainer_stop */
    /* the position of the next batch (epoch, batches of it done), the step of the newest
     * checkpoint and its path */
    int64_t at_epoch, at_batch, ckpt_step;
    int64_t val_step; /* the step the last validation followed */
    char ckpt[4200];
    struct {
        loom_trainer_callback fn;
        void *user;
    } cb[16];
    int ncb;
    bool should_stop; /* a callback said so: after this step, or before the next epoch */
    void *owned[4];   /* the built-in callbacks' state, freed with the trainer */
    int nowned;
    loom_tensorboard *tb; /* c.log_dir's, on process 0 */
    double lr;            /* of the last step */
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
    t->m.val_accuracy = t->m.val_loss = t->m.best = NAN;
    t->ckpt_step = t->val_step = -1;
    t->acc =
        loom_accelerator_new(&(loom_accelerator_config){.devices = cfg.devices,
                                                        .cores_per_device = cfg.cores_per_device,
                                                        .timeout_s = cfg.timeout_s,
                                                        .detect_anomaly = cfg.detect_anomaly});
    if (!t->acc) {
        loom__free(t);
        return NULL;
    }
    return t;
}

void loom_trainer_free(loom_trainer *t) {
    if (!t)
        return;
    loom_tensorboard_close(t->tb);
    for (int i = 0; i < t->nowned; i++)
        loom__free(t->owned[i]);
    loom_accelerator_free(t->acc);
    loom__free(t->logits);
    loom__free(t);
}

void loom_trainer_get_metrics(const loom_trainer *t, loom_trainer_metrics *out) {
    *out = t->m;
    out->checkpoint = t->ckpt[0] ? t->ckpt : NULL;
}

void loom_trainer_stop(loom_trainer *t) {
    t->stop = 1;
}

loom_status loom_trainer_add_callback(loom_trainer *t, loom_trainer_callback fn, void *user) {
    if (!t || !fn || t->ncb == (int)(sizeof t->cb / sizeof *t->cb))
        return loom__error(LOOM_EINVAL, "loom_trainer_add_callback: %s",
                           !t || !fn ? "NULL argument" : "16 callbacks already");
    t->cb[t->ncb].fn = fn, t->cb[t->ncb++].user = user;
    return LOOM_OK;
}

void *loom__trainer_own(loom_trainer *t, size_t bytes) {
    void *p = t->nowned < (int)(sizeof t->owned / sizeof *t->owned) ? loom__calloc(1, bytes) : NULL;
    if (p)
        t->owned[t->nowned++] = p;
    return p;
}

/* Calls every callback for `event` (each sees the state; any that returns true stops the run);
 * then, across the processes of an MPI job, whether any of them stops (a collective: every
 * process fires the same events in the same order). */
static bool fire(loom_trainer *t, loom_trainer_event event) {
    loom_trainer_state st = {.event = event,
                             .epoch = t->at_epoch,
                             .step = t->m.steps,
                             .loss = t->m.last_loss,
                             .lr = t->lr,
                             .val_loss = t->m.val_loss,
                             .val_accuracy = t->m.val_accuracy,
                             .best = t->m.best,
                             .world = world(t),
                             .first_process = first_process(t),
                             .tb = t->tb};
    bool stop = false;
    for (int i = 0; i < t->ncb; i++)
        stop = t->cb[i].fn(&st, t->cb[i].user) || stop;
    loom_devices *d = loom__accelerator_devs(t->acc);
    if (event != LOOM_ON_FIT_END && loom_devices_world(d) > loom_devices_count(d))
        stop = loom_devices_any(d, stop || t->stop); /* (a signal may reach one process only) */
    if (stop)
        t->should_stop = true;
    return stop;
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

double loom_cross_entropy_sum(const float *z, int64_t rows, int64_t classes, const int32_t *y) {
    double sum = 0;
    for (int64_t i = 0; i < rows; i++) {
        const float *r = z + i * classes;
        double mx = r[0], e = 0;
        for (int64_t k = 1; k < classes; k++)
            mx = r[k] > mx ? r[k] : mx;
        for (int64_t k = 0; k < classes; k++)
            e += exp((double)r[k] - mx);
        sum += mx + log(e) - (double)r[y[i]];
    }
    return sum;
}

loom_status loom_trainer_validate(loom_trainer *t, const loom_module_fns *fns, loom_loader *val,
                                  double *accuracy) {
    loom_graph *g;
    loom_tensor *x, *y;
    int64_t seen = 0, correct = 0;
    double loss = 0;
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
        const int32_t *labels = loom__accelerator_labels(t->acc);
        correct += loom_count_correct(t->logits, rows, classes, labels);
        loss += loom_cross_entropy_sum(t->logits, rows, classes, labels);
        seen += rows;
    }
    *accuracy = seen ? (double)correct / (double)seen : NAN;
    t->m.val_accuracy = *accuracy;
    t->m.val_loss = seen ? loss / (double)seen : NAN;
    t->val_step = t->m.steps;
    double v = t->c.monitor_accuracy ? t->m.val_accuracy : t->m.val_loss;
    if (!isnan(v) && (isnan(t->m.best) || (t->c.monitor_accuracy ? v > t->m.best : v < t->m.best)))
        t->m.best = v;
    return LOOM_OK;
}

/* A checkpoint after the steps done (none when one is there), by the job's first process, with
 * the monitored value of a validation just made (NaN: none); the run's position in the model's
 * metadata. */
static loom_status checkpoint(loom_trainer *t, loom_model *m, loom_optim *o, double monitored) {
    if (!t->c.checkpoint_dir || t->ckpt_step == t->m.steps)
        return LOOM_OK;
    loom_status s = loom_run_position_set(
        m, &(loom_run_position){.step = t->m.steps,
                                .epoch = t->at_epoch,
                                .batch = t->at_batch,
                                .monitor = t->c.monitor_accuracy ? "val_acc" : "val_loss",
                                .best = t->m.best,
                                .val_loss = t->m.val_loss,
                                .val_accuracy = t->m.val_accuracy,
                                .world = world(t)});
    loom_checkpoint_config cc = {
        .dir = t->c.checkpoint_dir, .keep = t->c.keep, .maximize = t->c.monitor_accuracy};
    if (!s && first_process(t))
        s = loom_checkpoint_write(&cc, m, o, t->m.steps, monitored, t->ckpt, sizeof t->ckpt);
    if (!s)
        t->ckpt_step = t->m.steps;
    return s;
}

/* The whole state of the checkpoint at c.resume, and where in its epoch the run was. */
static loom_status resume(loom_trainer *t, loom_model *m, loom_optim *o, loom_loader *train) {
    int64_t steps;
    loom_status s = loom_checkpoint_resume(t->c.resume, m, o, &steps, t->ckpt, sizeof t->ckpt);
    if (s)
        return s;
    loom_run_position at;
    if (loom_run_position_get(m, &at) || at.epoch < 0 || at.batch > loom_loader_batches(train))
        return loom__error(LOOM_EFORMAT,
                           "%s: no position of its run in an epoch (loom.epoch, "
                           "loom.batch)",
                           t->ckpt);
    bool same = at.monitor && !strcmp(at.monitor, t->c.monitor_accuracy ? "val_acc" : "val_loss");
    t->m.best = same ? at.best : NAN;
    int64_t epoch = at.epoch, batch = at.batch;
    t->m.steps = t->ckpt_step = steps, t->at_epoch = epoch, t->at_batch = batch;
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
/* Whether the run stops: loom_trainer_stop, or a callback. */
static bool halted(const loom_trainer *t) {
    return t->stop || t->should_stop;
}

/* An optimizer step of `micro` batches has ended with this loss: counted, logged, and the
 * callbacks told. */
static loom_status step_ended(loom_trainer *t, loom_optim *o, int64_t epoch, double loss,
                              int64_t micro) {
    t->m.last_loss = loss;
    t->m.steps++;
    t->at_epoch = epoch, t->at_batch += micro;
    t->lr = loom_optim_lr_at(o, t->m.steps - 1);
    if (t->c.log_every > 0 && t->m.steps % t->c.log_every == 0 && first_process(t))
        loom__log(LOOM_LOG_INFO, "epoch %lld step %lld loss %.4f", (long long)epoch + 1,
                  (long long)t->m.steps, t->m.last_loss);
    loom_status s = t->tb ? loom_tensorboard_add(t->tb, "train/loss", t->m.steps, loss) : LOOM_OK;
    fire(t, LOOM_ON_TRAIN_BATCH_END);
    return s;
}

/* The micro-batch step in flight, and the optimizer step it belongs to (gradient accumulation:
 * a group of up to c.accumulate loader batches, groups starting with the epoch). */
typedef struct {
    double w, loss; /* its weight (0: none in flight); the weighted losses of its group so far */
    bool last;      /* the last of its group */
    int64_t micro;  /* the batches of the group that ends with it */
} in_flight;

/* Records batch j's backward (weighted by its share of its group's rows) and, when it ends its
 * group, the update into the step's graph; *f describes it once submitted. */
static void record(loom_trainer *t, const loom_module_fns *fns, loom_loader *train, int64_t j,
                   loom_graph *g, loom_tensor *x, loom_tensor *y, int64_t *group_rows,
                   in_flight *next) {
    int64_t A = t->c.accumulate > 1 ? t->c.accumulate : 1, k = j % A,
            nb = loom_loader_batches(train);
    for (int64_t q = j; k == 0 && q < j + A && q < nb; q++)
        *group_rows = (q == j ? 0 : *group_rows) + loom_loader_batch_rows(train, q);
    next->last = k == A - 1 || j == nb - 1;
    next->micro = k + 1;
    next->w = A > 1 ? (double)loom_loader_batch_rows(train, j) / (double)*group_rows : 1;
    loom_tensor *loss = fns->training_step(fns->ctx, g, x, y);
    if (A > 1)
        loom_accelerator_backward_accumulate(t->acc, loss, next->w, k == 0, next->last);
    else
        loom_accelerator_backward(t->acc, loss);
}

/* One epoch (from the batch the run is at: a resumed run's may be past its start); *done when
 * max_steps is reached. Each micro-batch step is submitted, the next recorded while it runs, then
 * it is waited for (the devices do not wait for the host between steps); a checkpoint every
 * checkpoint_every optimizer steps is written between a step's end and the next one's submit,
 * and the run stops (halted) only there, between optimizer steps. */
static loom_status fit_epoch(loom_trainer *t, loom_model *m, loom_optim *o,
                             const loom_module_fns *fns, loom_loader *train, int64_t epoch,
                             bool *done) {
    loom_graph *g = NULL;
    loom_tensor *x, *y;
    int64_t samples = 0, submitted = t->m.steps, every = t->c.checkpoint_every, group_rows = 0;
    int64_t A = t->c.accumulate > 1 ? t->c.accumulate : 1;
    in_flight run = {0}, next;
    double t0 = loom__now(), loss;
    t->at_batch = epoch == t->at_epoch ? t->at_batch : 0;
    t->at_epoch = epoch;
    loom_loader_seek(train, epoch, t->at_batch);
    for (int64_t j = t->at_batch;
         !*done && (j % A != 0 || !halted(t)) && loom_accelerator_next(t->acc, NULL, &g, &x, &y);
         j++) {
        record(t, fns, train, j, g, x, y, &group_rows, &next);
        loom_status s = run.w > 0 ? wait_step(t, g, &loss) : LOOM_OK;
        next.loss = run.last ? 0 : run.loss + (run.w > 0 ? run.w * loss : 0);
        if (!s && run.w > 0 && run.last)
            s = step_ended(t, o, epoch, run.loss + run.w * loss, run.micro);
        if (!s && run.w > 0 && run.last && every > 0 && t->m.steps % every == 0)
            s = checkpoint(t, m, o, NAN);
        if (s || (run.last && halted(t))) /* (a step recorded but stopped before it runs is not
                                           * run) */
            return s;
        if ((s = loom__accelerator_submit(t->acc)))
            return s;
        run = next;
        samples += loom_tensor_shape(y)[0] * world(t);
        *done = run.last && t->c.max_steps > 0 && ++submitted >= t->c.max_steps;
    }
    if (run.w > 0) {
        loom_status s = wait_step(t, g, &loss);
        if (!s && run.last)
            s = step_ended(t, o, epoch, run.loss + run.w * loss, run.micro);
        if (s)
            return s;
    }
    if (!halted(t) && t->at_batch == loom_loader_batches(train)) /* whole: the next starts there */
        t->at_epoch = epoch + 1, t->at_batch = 0;
    t->m.samples_per_s = (double)samples / (loom__now() - t0);
    return LOOM_OK;
}

/* After an epoch: validation (its results logged, the callbacks told), then, when the epoch is
 * whole, its end; its checkpoint. */
static loom_status epoch_end(loom_trainer *t, loom_model *m, loom_optim *o,
                             const loom_module_fns *fns, loom_loader *val, int64_t e) {
    double acc = NAN;
    loom_status s = val && fns->validation_step ? loom_trainer_validate(t, fns, val, &acc) : 0;
    if (!s && t->c.log_every > 0 && first_process(t))
        loom__log(LOOM_LOG_INFO, "epoch %lld: loss %.4f, validation accuracy %.4f, %.0f samples/s",
                  (long long)e + 1, t->m.last_loss, acc, t->m.samples_per_s);
    if (!s && val && fns->validation_step) {
        if (t->tb && ((s = loom_tensorboard_add(t->tb, "val/loss", t->m.steps, t->m.val_loss)) ||
                      (s = loom_tensorboard_add(t->tb, "val/accuracy", t->m.steps, acc)) ||
                      (s = loom_tensorboard_flush(t->tb))))
            return s;
        fire(t, LOOM_ON_VALIDATION_END);
    }
    if (!s && t->at_epoch == e + 1)
        fire(t, LOOM_ON_EPOCH_END);
    double v = t->c.monitor_accuracy ? t->m.val_accuracy : t->m.val_loss;
    int64_t every = t->c.checkpoint_every;
    if (!s && (every <= 0 || t->m.steps % every == 0))
        s = checkpoint(t, m, o, val && fns->validation_step ? v : NAN);
    return s;
}

loom_status loom_trainer_fit(loom_trainer *t, loom_model *m, loom_optim *o,
                             const loom_module_fns *fns, loom_loader *train, loom_loader *val) {
    if (!t || !m || !o || !fns || !fns->training_step || !train)
        return loom__error(LOOM_EINVAL, "loom_trainer_fit: NULL argument (model, optimizer, "
                                        "training_step and loader are required)");
    loom_status s = loom_accelerator_prepare(t->acc, m, o, train);
    if (!s && t->c.resume)
        s = resume(t, m, o, train);
    if (!s && t->c.log_dir && first_process(t) && !t->tb)
        s = loom_tensorboard_open(t->c.log_dir, t->c.resume ? t->m.steps : -1, &t->tb);
    bool done = t->c.max_steps > 0 && t->m.steps >= t->c.max_steps;
    if (!s)
        fire(t, LOOM_ON_FIT_START);
    for (int64_t e = t->at_epoch; !s && e < t->c.max_epochs && !done && !halted(t); e++) {
        s = fit_epoch(t, m, o, fns, train, e, &done);
        t->m.epochs = e + 1;
        if (!s && !halted(t))
            s = epoch_end(t, m, o, fns, val, e);
    }
    t->m.stopped = halted(t);
    double v = t->c.monitor_accuracy ? t->m.val_accuracy : t->m.val_loss;
    if (!s) /* at the end, or where loom_trainer_stop or a callback ended the run */
        s = checkpoint(t, m, o, t->val_step == t->m.steps ? v : NAN);
    if (!s && t->tb)
        s = loom_tensorboard_flush(t->tb);
    fire(t, LOOM_ON_FIT_END);
    return s;
}
