/*
 * train.c - `loom train` and `loom eval`: the training loop on every device. Each step is
 * one lazy graph (forward, cross-entropy, backward, optimizer update) that the library compiles
 * once and replays; evaluation is a second, forward-only program. Test accuracy is counted over
 * every test sample exactly once.
 */
#include "cli.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct {
    loom_graph *g;
    loom_sequential *net;
    bool flatten;
} model_ctx;

/* Records the forward pass of a batch; the input is (B,1,28,28) or (B,784), padded to `rows`
 * rows (-1: none) so that a short last batch runs the full batches' program (the padding weighs
 * nothing). The loader's batch is lent to the step, not copied: it stays unchanged until the second
 * loom_loader_next after it, and each step is waited for before that. */
static loom_tensor *forward(model_ctx *m, const loom_batch *b, int64_t rows, loom_tensor **labels) {
    int64_t flat[2] = {b->n, b->shape[1] * b->shape[2] * b->shape[3]};
    loom_tensor *x = m->flatten
                         ? loom_input_batch_padded(m->g, LOOM_F32, 2, flat, b->x, rows)
                         : loom_input_batch_padded(m->g, LOOM_F32, b->ndim, b->shape, b->x, rows);
    *labels = loom_input_batch_padded(m->g, LOOM_I32, 1, &b->n, b->y, rows);
    loom_input_borrow(x);
    loom_input_borrow(*labels);
    return loom_sequential_forward(m->g, m->net, x);
}

/* Accuracy and mean loss over the whole test set: each sample counted once, whatever the device
 * count. Batches of 250 (the test set is 40 of them, no short one): 1000 made the CNN's conv1
 * output 86 MB, twice the step's peak memory and out of cache (250: peak RSS 172 -> 90 MiB, same
 * accuracy). */
static int evaluate(model_ctx *m, const loom_dataset *test, int64_t limit, double *acc,
                    double *loss) {
    static float z[250 * 10];
    loom_loader *l =
        loom_loader_new(test, &(loom_loader_config){.batch_size = 250, .no_shuffle = true});
    if (!l)
        return cli_fail("evaluation: %s", loom_last_error());
    loom_batch b;
    int64_t correct = 0, seen = 0;
    double sum = 0;
    while ((limit <= 0 || seen < limit) && !cli_stopping() && loom_loader_next(l, &b)) {
        loom_graph_reset(m->g);
        loom_tensor *y, *logits = forward(m, &b, -1, &y);
        loom_output(logits);
        loom_status s = loom_graph_run(m->g);
        if (s || loom_tensor_gather(logits, z) != b.n) {
            loom_loader_free(l);
            return cli_fail("evaluation: %s", loom_last_error());
        }
        int64_t classes = loom_tensor_shape(logits)[1];
        int64_t take = limit > 0 && limit - seen < b.n ? limit - seen : b.n; /* (--limit-eval) */
        correct += loom_count_correct(z, take, classes, b.y);
        sum += loom_cross_entropy_sum(z, take, classes, b.y);
        seen += take;
    }
    loom_loader_free(l);
    *acc = seen ? (double)correct / (double)seen : 0.0;
    *loss = seen ? sum / (double)seen : NAN;
    return 0;
}

typedef struct {
    const train_opts *o;
    model_ctx m;
    loom_optim *opt;
    loom_loader *loader;
    const loom_dataset *test;
    cli_log *log;
    int64_t step;
    double train_seconds, warm_seconds; /* every step's, and those after WARMUP_STEPS */
    int64_t samples, warm_samples;
    double last_acc, last_loss;
    loom_devices *devs;
    loom_model *model;
    cli_items it; /* the configuration: compared across processes, kept in checkpoints */
    /* the position of the next batch (epoch, batches of it done), the best monitored value,
     * the step of the newest checkpoint and its path */
    int64_t at_epoch, at_batch, ckpt_step, best_step;
    double best;
    char ckpt[4200];
    bool writer;                      /* process 0 of the job: prints, logs and saves */
    double started, first_step_at;    /* process start to the end of the first step */
    int64_t step_nodes, step_kernels; /* of a training step (the graph's last run is evaluation) */
    double step_flops;                /* its products' (on one device) */
    cli_progress progress;
} run_state;

/* Steps before the steady-state rate is counted (as the PyTorch peer in bench/ does): the first
 * builds the program, the next ones warm the caches and the allocator. */
#define WARMUP_STEPS 20

/* An epoch's progress: steps ended, its batches, the current 100 steps' start and samples. */
typedef struct {
    int64_t epoch, i, nb, tick_samples;
    double tick, last;
} epoch_state;

/* Accounts for an optimizer step that has ended: n samples in `micro` batches, its loss, dt
 * seconds since the step before it ended (the steps overlap: the next one was recorded while it
 * ran). */
static int step_ended(run_state *r, epoch_state *e, int64_t n, double loss, double dt,
                      int64_t micro) {
    const train_opts *o = r->o;
    e->last = loss;
    r->train_seconds += dt;
    r->samples += n, e->tick_samples += n;
    r->step++, e->i += micro;
    r->at_epoch = e->epoch, r->at_batch = e->i;
    if (r->step > WARMUP_STEPS)
        r->warm_seconds += dt, r->warm_samples += n;
    if (o->trial && r->step <= CLI_TRIAL_MAX)
        o->trial[r->step - 1] = dt;
    if (r->step == 1) {
        r->first_step_at = now() - r->started;
        loom_metrics sm; /* every step runs the same graph */
        loom_graph_metrics(r->m.g, &sm);
        r->step_nodes = sm.nodes, r->step_kernels = sm.kernels, r->step_flops = sm.flops;
    }
    double rate = e->tick_samples / (now() - e->tick + 1e-12),
           lr = loom_optim_lr_at(r->opt, r->step - 1);
    if (cli_log_row(r->log, "%lld,%lld,%.6f,%g,%.1f,,\n", (long long)r->step,
                    (long long)e->epoch + 1, loss, lr, rate) ||
        cli_log_scalar(r->log, "train/loss", r->step, loss) ||
        cli_log_scalar(r->log, "train/lr", r->step, lr) ||
        cli_log_scalar(r->log, "train/samples_per_s", r->step, rate))
        return 1;
    char label[64];
    snprintf(label, sizeof label, "epoch %lld/%lld", (long long)e->epoch + 1, (long long)o->epochs);
    int64_t total = o->epochs * e->nb;
    cli_progress_step(&r->progress, &(cli_step){label, e->i, e->nb, r->step,
                                                o->steps && o->steps < total ? o->steps : total,
                                                loss, rate, r->step_flops, dt});
    if (r->step % 100 == 0) /* the rate: over the last 100 steps */
        e->tick = now(), e->tick_samples = 0;
    return 0;
}

/* The options that may differ when a run is resumed: the rest shape it. */
static const char *const may_change[] = {
    "--epochs", "--steps", "--timeout", "--detect-anomaly", "--init", "--limit-eval", NULL};

/* An evaluation's results: the last ones, and the best of the monitored one. */
static double note_eval(run_state *r, double acc, double loss) {
    bool by_acc = r->o->ck.monitor_acc;
    double v = by_acc ? acc : loss;
    r->last_acc = acc, r->last_loss = loss;
    if (!isnan(v) && (isnan(r->best) || (by_acc ? v > r->best : v < r->best)))
        r->best = v, r->best_step = r->step;
    return v;
}

/* A checkpoint after the step that ended last (none when one was written there), with the
 * monitored value of an evaluation just made (NaN: none); its state in the model's metadata. */
static int checkpoint(run_state *r, double monitored) {
    const train_opts *o = r->o;
    loom_model *m = r->model;
    if (!o->ck.dir || r->ckpt_step == r->step)
        return 0;
    if (loom_run_position_set(
            m, &(loom_run_position){.step = r->step,
                                    .epoch = r->at_epoch,
                                    .batch = r->at_batch,
                                    .monitor = o->ck.monitor_acc ? "val_acc" : "val_loss",
                                    .best = r->best,
                                    .val_loss = r->last_loss,
                                    .val_accuracy = r->last_acc,
                                    .world = loom_devices_world(r->devs)}))
        return cli_fail("%s", loom_last_error());
    if (cli_ckpt_write(&o->ck, m, r->opt, r->step, monitored, r->writer, r->ckpt, sizeof r->ckpt))
        return 1;
    r->ckpt_step = r->step;
    return 0;
}

/* --resume: the checkpoint's weights, optimizer state and position, after its configuration is
 * found to be this run's. */
static int resume(run_state *r) {
    const train_opts *o = r->o;
    loom_model *m = r->model;
    int64_t steps;
    if (loom_checkpoint_resume(o->ck.resume, m, r->opt, &steps, r->ckpt, sizeof r->ckpt))
        return cli_fail("--resume: %s", loom_last_error());
    int bad = cli_resume_check(m, &r->it, r->ckpt, may_change);
    if (bad)
        return bad;
    loom_run_position at;
    if (loom_run_position_get(m, &at) || at.epoch < 0 || at.batch > loom_loader_batches(r->loader))
        return cli_fail("--resume: %s does not record where in its epoch the run was", r->ckpt);
    bool same = at.monitor && !strcmp(at.monitor, o->ck.monitor_acc ? "val_acc" : "val_loss");
    r->best = same ? at.best : NAN;
    r->last_acc = isnan(at.val_accuracy) ? 0 : at.val_accuracy, r->last_loss = at.val_loss;
    int64_t epoch = at.epoch, batch = at.batch;
    r->step = r->ckpt_step = steps, r->at_epoch = epoch, r->at_batch = batch;
    printf("loom: resuming from %s: step %lld, epoch %lld, batch %lld of %lld\n", r->ckpt,
           (long long)steps, (long long)epoch + 1, (long long)batch,
           (long long)loom_loader_batches(r->loader));
    return 0;
}

/* A step that failed (its wait or submit), named by its training step. */
static int step_failed(const run_state *r) {
    return cli_fail("step %lld: %s", (long long)r->step + 1, loom_last_error());
}

/* One epoch of training; returns non-zero on error, sets *done when --steps is reached. Each
 * step is submitted, and the next one is recorded (and its batch taken) while it runs; then it
 * is waited for and the next submitted, so that the devices do not wait for the host. */
static int train_epoch(run_state *r, int64_t epoch, bool *done) {
    const train_opts *o = r->o;
    loom_batch b;
    double t0 = now(), ended_at = t0;
    int64_t skip = epoch == r->at_epoch ? r->at_batch : 0; /* (a resumed run's, in its epoch) */
    epoch_state e = {epoch, skip, loom_loader_batches(r->loader), 0, t0, 0};
    int64_t submitted = r->step, A = o->accumulate > 1 ? o->accumulate : 1;
    /* the micro-batch step running (none: its weight 0) and the optimizer step it is part of */
    double run_w = 0, run_loss = 0;
    bool run_last = false;
    int64_t group_rows = 0, rec_samples = 0, done_samples = 0, done_micro = 0;
    bool every = o->ck.every > 0;
    loom_loader_seek(r->loader, epoch, skip);
    for (int64_t j = skip;
         !*done && (j % A != 0 || !cli_stopping()) && loom_loader_next(r->loader, &b); j++) {
        int64_t k = j % A; /* (micro-batch groups start with the epoch) */
        bool last = k == A - 1 || j == e.nb - 1;
        for (int64_t q = j; k == 0 && q < j + A && q < e.nb; q++)
            group_rows = (q == j ? 0 : group_rows) + loom_loader_batch_rows(r->loader, q);
        loom_graph_reset(r->m.g);
        loom_tensor *y, *logits = forward(&r->m, &b, o->drop_last ? -1 : o->batch, &y);
        loom_tensor *loss = loom_cross_entropy(r->m.g, logits, y);
        double w = A > 1 ? (double)b.n / (double)group_rows : 1;
        if (A > 1)
            loom_backward_accumulate(r->m.g, loss, w, k == 0, last);
        else
            loom_backward(r->m.g, loss);
        if (last)
            loom_optim_step(r->m.g, r->opt);
        double value;
        if (run_w > 0) {
            if (loom_graph_wait(r->m.g, &value))
                return step_failed(r);
            run_loss += run_w * value;
            double at = now();
            if (run_last && (step_ended(r, &e, done_samples, run_loss, at - ended_at, done_micro) ||
                             (every && r->step % o->ck.every == 0 && checkpoint(r, NAN))))
                return 1;
            if (run_last)
                ended_at = at, run_loss = 0;
        }
        if (loom_graph_submit(r->m.g))
            return step_failed(r);
        rec_samples = (k == 0 ? 0 : rec_samples) + b.n;
        if (last) /* the optimizer step this micro-batch ends: its samples and micro-batches */
            done_samples = rec_samples, done_micro = k + 1;
        run_w = w, run_last = last;
        *done = last && ((o->steps && ++submitted >= o->steps) ||
                         (o->trial && !cli_trial_more(o->trial, r->step + 1)));
    }
    if (run_w > 0) {
        double value;
        if (loom_graph_wait(r->m.g, &value))
            return step_failed(r);
        run_loss += run_w * value;
        if (run_last && step_ended(r, &e, done_samples, run_loss, now() - ended_at, done_micro))
            return 1; /* (its checkpoint follows the evaluation, with the monitored value) */
    }
    if (cli_stop_signal() || o->trial) /* the step that ran has ended and is logged, or a trial's:
                                        * no evaluation */
        return 0;
    double last = e.last;
    double acc = 0, loss = NAN;
    if (evaluate(&r->m, r->test, o->limit_eval, &acc, &loss))
        return 1;
    if (cli_stop_signal()) /* the evaluation was cut short: no accuracy of part of the test set */
        return 0;
    cli_progress_line(
        &r->progress,
        "epoch %lld done: last loss %.4f, test accuracy %.4f, test loss %.4f, %.1f s\n",
        (long long)epoch + 1, last, acc, loss, now() - t0);
    if (cli_log_row(r->log, "%lld,%lld,%.6f,%g,,%.6f,%.6f\n", (long long)r->step,
                    (long long)epoch + 1, last, loom_optim_lr_at(r->opt, r->step - 1), acc, loss) ||
        cli_log_scalar(r->log, "val/accuracy", r->step, acc) ||
        cli_log_scalar(r->log, "val/loss", r->step, loss) || cli_log_flush(r->log))
        return 1;
    double monitored = note_eval(r, acc, loss);
    if (e.i == e.nb) /* the epoch is whole: a run resumed from here starts the next one */
        r->at_epoch = epoch + 1, r->at_batch = 0;
    return every && r->step % o->ck.every != 0 ? 0 : checkpoint(r, monitored);
}

/* Whether every process of an MPI job runs this configuration (paths may differ between
 * machines: the data are compared by their sizes instead). 0, or 2 after process 0's line. */
static int agree(run_state *r, const loom_dataset *train, const loom_dataset *test) {
    const train_opts *o = r->o;
    cli_items *it = &r->it;
    it->n = 0;
    cli_item(it, "recipe", "%s", o->recipe);
    cli_item(it, "--epochs", "%lld", (long long)o->epochs);
    cli_item(it, "--steps", "%lld", (long long)o->steps);
    cli_item(it, "--batch", "%lld", (long long)o->batch);
    cli_item(it, "--accumulate", "%lld", (long long)(o->accumulate > 1 ? o->accumulate : 1));
    cli_item(it, "--optimizer", "%s", o->optimizer);
    cli_item(it, "--lr", "%.17g", o->lr);
    cli_item(it, "--momentum", "%.17g", o->momentum);
    cli_item(it, "--nesterov", "%d", o->nesterov);
    cli_item(it, "--weight-decay", "%.17g", o->weight_decay);
    cli_item(it, "--decay-matrices-only", "%d", o->decay_matrices_only);
    cli_item(it, "--beta1", "%.17g", o->beta1);
    cli_item(it, "--beta2", "%.17g", o->beta2);
    cli_item(it, "--warmup-steps", "%lld", (long long)o->warmup_steps);
    cli_item(it, "--decay-steps", "%lld", (long long)o->decay_steps);
    cli_item(it, "--min-lr", "%.17g", o->min_lr);
    cli_item(it, "--clip-norm", "%.17g", o->clip_norm);
    cli_item(it, "--seed", "%llu", (unsigned long long)o->seed);
    cli_item(it, "--no-shuffle", "%d", o->no_shuffle);
    cli_item(it, "--drop-last", "%d", o->drop_last);
    cli_item(it, "--detect-anomaly", "%d", o->detect_anomaly);
    cli_item(it, "--limit-eval", "%lld", (long long)o->limit_eval);
    cli_item(it, "--timeout", "%.17g", o->timeout);
    cli_item(it, "--init", "%s", o->init ? "given" : "none");
    cli_item(it, "--data", "%lld training and %lld test samples",
             train ? (long long)loom_dataset_count(train) : 0LL,
             test ? (long long)loom_dataset_count(test) : 0LL);
    return cli_agree(r->devs, it);
}

static int setup(run_state *r, loom_model *model, loom_dataset **train, loom_dataset **test) {
    const train_opts *o = r->o;
    r->model = model;
    const loom_layer *layers = loom_recipe(o->recipe, &r->m.flatten);
    if (!layers)
        return cli_fail("train: %s", loom_last_error());
    /* the devices first (across the processes of an MPI job: only process 0 writes), then the
     * outputs: a path that cannot be written fails now, not after the training */
    r->devs = loom_devices_new(&(loom_devices_config){.count = (int)o->devices,
                                                      .cores = (int)o->cores,
                                                      .timeout_s = o->timeout,
                                                      .detect_anomaly = o->detect_anomaly,
                                                      .dist = (loom_dist)o->dist});
    if (!r->devs)
        return cli_fail("%s", loom_last_error());
    r->writer = loom_devices_process(r->devs) == 0;
    cli_stop_agree(r->devs);
    if (loom_devices_world(r->devs) > loom_devices_count(r->devs))
        cli_hold_errors(); /* one line for the job, from the process that failed, as it ends it */
    if (!r->writer && !freopen("/dev/null", "w", stdout)) /* progress: process 0's */
        return cli_fail("cannot quiet the output of process %d", loom_devices_process(r->devs));
    if (r->writer && !o->eval_only && o->save && cli_check_save(o->save))
        return 1;
    loom_status s = o->eval_only ? LOOM_OK : loom_dataset_fmnist(o->data, "train", train);
    if (!s)
        s = loom_dataset_fmnist(o->data, "test", test);
    if (s)
        return cli_fail("%s", loom_last_error());
    r->m.net = loom_sequential_new(model, layers);
    if (!r->m.net)
        return cli_fail("%s", loom_last_error());
    loom_sequential_init(r->m.net, o->seed);
    if (o->init && loom_model_load(model, o->init))
        return cli_fail("--init: %s", loom_last_error());
    int disagree = agree(r, *train, *test);
    if (disagree)
        return disagree;
    r->test = *test;
    r->m.g = loom_graph_new(model);
    if (!r->m.g || loom_graph_set_devices(r->m.g, r->devs))
        return cli_fail("%s", loom_last_error());
    if (o->eval_only)
        return 0;
    loom_optim_config oc = {.lr = o->lr,
                            .momentum = o->momentum,
                            .weight_decay = o->weight_decay,
                            .nesterov = o->nesterov,
                            .beta1 = o->beta1,
                            .beta2 = o->beta2,
                            .warmup_steps = o->warmup_steps,
                            .decay_steps = o->decay_steps,
                            .min_lr = o->min_lr,
                            .clip_norm = o->clip_norm};
    r->opt = !strcmp(o->optimizer, "adamw") ? loom_adamw_new(model, &oc) : loom_sgd_new(model, &oc);
    if (!r->opt)
        return cli_fail("%s", loom_last_error());
    if (o->decay_matrices_only)
        loom_optim_decay_matrices_only(r->opt, o->weight_decay);
    r->loader = loom_loader_new(*train, &(loom_loader_config){.batch_size = o->batch,
                                                              .seed = o->seed,
                                                              .no_shuffle = o->no_shuffle,
                                                              .drop_last = o->drop_last});
    if (!r->loader)
        return cli_fail("%s", loom_last_error());
    int bad = o->ck.resume ? resume(r) : 0;
    if (bad || cli_config_meta(model, &r->it))
        return bad ? bad : 1;
    if (r->writer && o->log_dir &&
        !(r->log =
              cli_log_open(o->log_dir, "step,epoch,loss,lr,samples_per_s,test_accuracy,test_loss\n",
                           o->log_warn, o->ck.resume ? r->step : -1)))
        return 1;
    return 0;
}

/* Seconds since this process started (from /proc/self/stat), or since main when unknown. */
static double process_start(void) {
    FILE *f = fopen("/proc/self/stat", "r");
    char buf[1024];
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f)
        fclose(f);
    buf[n] = 0;
    const char *p = strrchr(buf, ')');
    unsigned long long start = 0;
    for (int field = 2; p && *p && field < 22; p++) /* field 22: start time in clock ticks */
        if (*p == ' ')
            field++;
    FILE *u = fopen("/proc/uptime", "r");
    double up = 0;
    bool ok = p && sscanf(p, "%llu", &start) == 1 && u && fscanf(u, "%lf", &up) == 1;
    if (u)
        fclose(u);
    long hz = sysconf(_SC_CLK_TCK);
    return ok && hz > 0 ? now() - (up - (double)start / (double)hz) : now();
}

/* --devices auto's trial (cli_choose_split): the run's first steps on D devices of C cores. */
static int trial(void *ctx, int D, int C, double *dt) {
    train_opts t = *(const train_opts *)ctx;
    t.devices = D, t.cores = C, t.trial = dt;
    t.steps = CLI_TRIAL_MAX, t.epochs = CLI_MAX_COUNT; /* (as many epochs as those take) */
    t.quiet = true, t.save = NULL, t.log_dir = NULL, t.ck = (ckpt_opts){0};
    return cli_train(&t);
}

int cli_train(const train_opts *given) {
    train_opts split = *given;
    const train_opts *o = &split;
    if (given->eval_only && split.devices == CLI_DEVICES_AUTO)
        split.devices = 0; /* (evaluation: one device a core) */
    int timed = cli_choose_split(trial, &split, &split.devices, &split.cores);
    if (timed)
        return timed;
    run_state r = {
        .o = o, .started = process_start(), .best = NAN, .last_loss = NAN, .ckpt_step = -1};
    cli_catch_stop();
    loom_model *model = loom_model_new();
    loom_dataset *train = NULL, *test = NULL;
    double t0 = now();
    int rc = model ? setup(&r, model, &train, &test) : cli_fail("out of memory");
    if (!rc && o->eval_only &&
        !(rc = evaluate(&r.m, test, o->limit_eval, &r.last_acc, &r.last_loss)) &&
        !cli_stop_signal())
        printf("test accuracy: %.4f\n", r.last_acc);
    if (!rc && !o->eval_only) {
        int world = loom_devices_world(r.devs), here = loom_devices_count(r.devs);
        char procs[64] = "", cores[32] = "";
        if (world > here)
            snprintf(procs, sizeof procs, " (%d in each of %d processes)", here, world / here);
        if (loom_devices_cores(r.devs) > 1)
            snprintf(cores, sizeof cores, " of %d cores", loom_devices_cores(r.devs));
        printf("loom: training %s on %d device%s%s%s, %lld samples, batch %lld, %s lr %g\n",
               o->recipe, world, world > 1 ? "s" : "", cores, procs,
               (long long)loom_dataset_count(train), (long long)o->batch, o->optimizer, o->lr);
    }
    bool done = false;
    if (!rc && !o->eval_only)
        cli_progress_init(&r.progress, o->quiet || !r.writer, "samples", 100);
    for (int64_t e = r.at_epoch;
         !rc && !o->eval_only && e < o->epochs && !done && !cli_stop_signal(); e++)
        rc = train_epoch(&r, e, &done);
    cli_progress_end(&r.progress);
    if (!rc && !o->eval_only && o->ck.dir) /* at the end, or where a signal stopped the run */
        rc = checkpoint(&r, cli_stop_signal() ? NAN : o->ck.monitor_acc ? r.last_acc : r.last_loss);
    if (!rc && cli_stop_signal()) { /* (process 0's line: across processes, all stopped here) */
        char files[128];
        snprintf(files, sizeof files, "%s%s", r.log ? "metrics.csv ends with that step; " : "",
                 o->save ? "no weights saved" : "nothing else written");
        rc = cli_stop_report(r.writer, r.step, r.ckpt, o->ck.dir, files);
    }
    if (!rc && !o->eval_only) {
        printf("test accuracy: %.4f\n", r.last_acc);
        char warm[64] = "";
        if (r.warm_samples)
            snprintf(warm, sizeof warm, ", %.0f after %d warm-up steps",
                     r.warm_samples / (r.warm_seconds + 1e-12), WARMUP_STEPS);
        printf("trained %lld steps in %.1f s (%.0f samples/s training%s, %.1f s in all)\n",
               (long long)r.step, r.train_seconds, r.samples / (r.train_seconds + 1e-12), warm,
               now() - t0);
        struct rusage ru;
        getrusage(RUSAGE_SELF, &ru);
        printf("start-up to the end of the first step %.3f s; peak RSS %.0f MiB\n", r.first_step_at,
               (double)ru.ru_maxrss / 1024.0);
        loom_metrics mt;
        char buf[1024];
        loom_graph_metrics(r.m.g, &mt);
        mt.nodes = r.step_nodes, mt.kernels = r.step_kernels; /* a training step's, not eval's */
        loom_metrics_format(&mt, buf, sizeof buf);
        printf("%s\n", buf);
        const char *by = o->ck.monitor_acc ? "test accuracy" : "test loss";
        printf("summary: %lld steps in %.1f s; best %s %.4f (after step %lld); %s%s\n",
               (long long)r.step, now() - t0, by, r.best, (long long)r.best_step,
               o->ck.dir ? "checkpoint " : "no checkpoint (--checkpoint-dir)",
               o->ck.dir ? r.ckpt : "");
    }
    if (!rc && o->save && r.writer) {
        if (loom_model_save(model, o->save))
            rc = cli_fail("--save: %s", loom_last_error());
        else
            printf("saved %s\n", o->save);
    }
    if (cli_log_close(r.log) && !rc)
        rc = 1;
    if (rc && cli_held_error()) /* across processes: this one failed, the job ends with it */
        loom_devices_abort(r.devs, cli_held_error());
    loom_graph_free(r.m.g);
    cli_stop_agree(NULL);
    loom_devices_free(r.devs);
    loom_loader_free(r.loader);
    loom_optim_free(r.opt);
    loom_sequential_free(r.m.net);
    loom_dataset_free(train);
    loom_dataset_free(test);
    loom_model_free(model);
    return rc;
}
