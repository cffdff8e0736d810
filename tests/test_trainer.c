/*
 * test_trainer.c - checkpoints and resume through loom_trainer_fit: a run stopped after a step
 * (loom_trainer_stop, as a signal handler would call it) or cut short by max_steps, then resumed
 * from its checkpoint directory by a new trainer with a new model and optimizer, must end with
 * bitwise the parameters of the run never interrupted (the MLP with AdamW, two epochs of
 * Fashion-MNIST, on the default devices); the validation loss is the monitored value of the
 * checkpoints written after each validation, and the best is kept.
 */
#include "harness.h"

#include <unistd.h>

/* 30 steps an epoch: batches of 2000 of the training set, or under LOOM_TEST_QUICK (the
 * sanitizer builds) of 200 of its first 6000 samples (validation: 1000 of the test set's) */
static int64_t base_batch = 2000;

static loom_dataset *train, *test;
/* fit()'s devices (0: one per core), accumulation and batch size */
static int fit_devices;
static int64_t fit_accumulate, fit_batch;

typedef struct {
    loom_model *m;
    loom_sequential *net;
    loom_optim *o;
    int64_t recorded; /* training steps recorded */
    int64_t stop_at;  /* loom_trainer_stop once this many steps are recorded (0: never) */
    loom_trainer *t;
    loom_loader *tl, *vl;
} run;

static loom_tensor *flat(loom_graph *g, loom_tensor *x) {
    int64_t shape[2] = {loom_tensor_shape(x)[0], 784};
    return loom_reshape(g, x, 2, shape);
}

static loom_tensor *training_step(void *ctx, loom_graph *g, loom_tensor *x, loom_tensor *y) {
    run *r = ctx;
    if (r->stop_at && ++r->recorded == r->stop_at)
        loom_trainer_stop(r->t); /* (while step stop_at - 1 runs: it ends, and the run with it) */
    return loom_cross_entropy(g, loom_sequential_forward(g, r->net, flat(g, x)), y);
}

static loom_tensor *validation_step(void *ctx, loom_graph *g, loom_tensor *x, loom_tensor *y) {
    (void)y;
    return loom_sequential_forward(g, ((run *)ctx)->net, flat(g, x));
}

/* The MLP, AdamW, the loaders and a trainer of config c. */
static void run_new(run *r, const loom_trainer_config *c) {
    memset(r, 0, sizeof *r);
    r->m = loom_model_new();
    r->net = loom_sequential_new(r->m, loom_recipe("fmnist-mlp", NULL));
    loom_sequential_init(r->net, 1);
    r->o = loom_adamw_new(r->m, &(loom_optim_config){.lr = 2e-3, .warmup_steps = 5});
    r->tl = loom_loader_new(train, &(loom_loader_config){.batch_size = fit_batch, .seed = 7});
    r->vl = loom_loader_new(test, &(loom_loader_config){.batch_size = 500, .no_shuffle = true});
    r->t = loom_trainer_new(c);
}

/* Fits (when s is OK) and frees r: the final parameters into out (NULL: not kept), the metrics
 * into *tm (its checkpoint path copied to stay valid). */
static loom_status run_fit(run *r, loom_status s, float *out, loom_trainer_metrics *tm) {
    loom_module_fns fns = {training_step, validation_step, r};
    if (!s)
        s = loom_trainer_fit(r->t, r->m, r->o, &fns, r->tl, r->vl);
    loom_trainer_get_metrics(r->t, tm);
    for (int i = 0, k = 0; out && i < loom_model_count(r->m); i++) {
        loom_param *p = loom_model_at(r->m, i);
        memcpy(out + k, loom_param_data(p), sizeof(float) * (size_t)loom_param_numel(p));
        k += (int)loom_param_numel(p);
    }
    static char last[4200];
    snprintf(last, sizeof last, "%s", tm->checkpoint ? tm->checkpoint : "");
    tm->checkpoint = last;
    loom_trainer_free(r->t);
    loom_loader_free(r->tl), loom_loader_free(r->vl);
    loom_optim_free(r->o);
    loom_sequential_free(r->net);
    loom_model_free(r->m);
    return s;
}

/* One fit of two epochs (or max_steps) into dir, resumed from `resume` (NULL: new); the final
 * parameters into out (numel floats) and the metrics into *tm. */
static loom_status fit(const char *dir, const char *resume, int64_t max_steps, int64_t stop_at,
                       float *out, loom_trainer_metrics *tm) {
    run r;
    run_new(&r, &(loom_trainer_config){.max_epochs = 2,
                                       .devices = fit_devices,
                                       .accumulate = fit_accumulate,
                                       .max_steps = max_steps,
                                       .log_every = -1,
                                       .checkpoint_dir = dir,
                                       .resume = resume});
    r.stop_at = stop_at;
    return run_fit(&r, LOOM_OK, out, tm);
}

/* Removes the checkpoints a previous run of the test left in dir. */
static void clean(const char *dir) {
    char p[700];
    snprintf(p, sizeof p, "%s/index.tsv", dir);
    unlink(p);
    for (int s = 0; s <= 60; s++)
        snprintf(p, sizeof p, "%s/step-%06d.safetensors", dir, s), unlink(p);
}

TEST(a_stopped_or_shortened_fit_resumes_bitwise) {
    enum { N = 784 * 256 + 256 + 256 * 256 + 256 + 256 * 10 + 10 };
    float *ref = malloc(sizeof(float) * N), *got = malloc(sizeof(float) * N);
    char d1[512], d2[512], d3[512], index[600];
    test_tmp(d1, sizeof d1, "trainer-ref");
    test_tmp(d2, sizeof d2, "trainer-stop");
    test_tmp(d3, sizeof d3, "trainer-short");
    clean(d1), clean(d2), clean(d3);
    loom_trainer_metrics tm;
    ASSERT_EQ(fit(d1, NULL, 0, 0, ref, &tm), LOOM_OK);
    ASSERT_EQ(tm.steps, 60);
    ASSERT(!isnan(tm.val_loss) && tm.val_loss > 0 && tm.val_loss < 2.5);
    ASSERT(strstr(tm.checkpoint, "step-000060.safetensors"));
    ASSERT(tm.best <= tm.val_loss);
    snprintf(index, sizeof index, "%s/index.tsv", d1); /* after each validation: 30 and 60 */
    FILE *f = fopen(index, "r");
    char line[256];
    int rows = 0;
    while (f && fgets(line, sizeof line, f))
        rows += !strncmp(line, "step-0000", 9) && strcmp(line + strlen(line) - 5, "nan\n") != 0;
    if (f)
        fclose(f);
    ASSERT_EQ(rows, 2);

    /* stopped while step 17 runs (the 18th recorded): a checkpoint of step 17, then resumed */
    ASSERT_EQ(fit(d2, NULL, 0, 18, got, &tm), LOOM_OK);
    ASSERT(tm.stopped && tm.steps == 17 && strstr(tm.checkpoint, "step-000017.safetensors"));
    ASSERT_EQ(fit(d2, d2, 0, 0, got, &tm), LOOM_OK);
    ASSERT(!tm.stopped && tm.steps == 60);
    ASSERT(!memcmp(ref, got, sizeof(float) * N));

    /* cut short by max_steps in the second epoch, resumed from that file without the limit */
    ASSERT_EQ(fit(d3, NULL, 41, 0, got, &tm), LOOM_OK);
    ASSERT_EQ(tm.steps, 41);
    char file[700];
    snprintf(file, sizeof file, "%s", tm.checkpoint);
    ASSERT(strstr(file, "step-000041.safetensors"));
    ASSERT_EQ(fit(d3, file, 0, 0, got, &tm), LOOM_OK);
    ASSERT_EQ(tm.steps, 60);
    ASSERT(!memcmp(ref, got, sizeof(float) * N));

    /* nothing to resume from: the reason, no training */
    char none[512];
    test_tmp(none, sizeof none, "trainer-none");
    clean(none);
    ASSERT_EQ(fit(NULL, none, 0, 0, got, &tm), LOOM_ENOTFOUND);
    ASSERT_EQ(tm.steps, 0);
    free(ref), free(got);
}

/* What a callback saw, and when it stops the run. */
typedef struct {
    int counts[5];
    loom_trainer_event first, last;
    int64_t stop_at; /* true at this step's TRAIN_BATCH_END (0: never) */
    double lr_at_1;  /* the learning rate the first step reported */
    bool ordered;    /* steps came 1, 2, 3 ... */
    int64_t last_step;
} seen;

static bool watch(const loom_trainer_state *s, void *user) {
    seen *w = user;
    if (w->counts[0] + w->counts[1] + w->counts[2] + w->counts[3] + w->counts[4] == 0)
        w->first = s->event;
    w->counts[s->event]++;
    w->last = s->event;
    if (s->event == LOOM_ON_TRAIN_BATCH_END) {
        w->ordered = w->ordered && s->step == w->last_step + 1 && !isnan(s->loss);
        w->last_step = s->step;
        if (s->step == 1)
            w->lr_at_1 = s->lr;
    }
    return s->event == LOOM_ON_TRAIN_BATCH_END && s->step == w->stop_at;
}

/* A fit of `epochs` with the callbacks: watch (and early stopping with patience, unless 0; the LR
 * monitor into log_dir, unless NULL). */
static loom_status fit_cb(seen *w, int64_t epochs, int64_t patience, const char *log_dir,
                          const char *ckdir, loom_trainer_metrics *tm) {
    run r;
    run_new(&r, &(loom_trainer_config){.max_epochs = epochs,
                                       .log_every = -1,
                                       .log_dir = log_dir,
                                       .checkpoint_dir = ckdir});
    loom_status s = loom_trainer_add_callback(r.t, watch, w);
    if (!s && patience)
        s = loom_trainer_early_stopping(
            r.t, &(loom_early_stopping_config){.patience = patience, .min_delta = 1e9});
    if (!s && log_dir)
        s = loom_trainer_lr_monitor(r.t, 0);
    return run_fit(&r, s, NULL, tm);
}

/* The number of times `what` occurs in file path. */
static int occurrences(const char *path, const char *what) {
    FILE *f = fopen(path, "rb");
    static char buf[1 << 20];
    size_t n = f ? fread(buf, 1, sizeof buf, f) : 0, k = strlen(what);
    if (f)
        fclose(f);
    int count = 0;
    for (size_t i = 0; i + k <= n; i++)
        count += !memcmp(buf + i, what, k);
    return count;
}

TEST(callbacks_see_every_event_and_can_stop) {
    loom_trainer_metrics tm;
    seen w = {.ordered = true};
    ASSERT_EQ(fit_cb(&w, 2, 0, NULL, NULL, &tm), LOOM_OK);
    ASSERT(w.first == LOOM_ON_FIT_START && w.last == LOOM_ON_FIT_END && w.ordered);
    ASSERT_EQ(w.counts[LOOM_ON_FIT_START], 1);
    ASSERT_EQ(w.counts[LOOM_ON_TRAIN_BATCH_END], 60);
    ASSERT_EQ(w.counts[LOOM_ON_VALIDATION_END], 2);
    ASSERT_EQ(w.counts[LOOM_ON_EPOCH_END], 2);
    ASSERT_NEAR(w.lr_at_1, 2e-3 / 6, 1e-12); /* the warm-up's first step */
    ASSERT(!tm.stopped);

    /* a callback that says stop at step 10: the run ends there, with a checkpoint */
    char dir[512];
    test_tmp(dir, sizeof dir, "trainer-cb");
    clean(dir);
    seen w2 = {.ordered = true, .stop_at = 10};
    ASSERT_EQ(fit_cb(&w2, 2, 0, NULL, dir, &tm), LOOM_OK);
    ASSERT(tm.stopped && tm.steps == 10 && w2.counts[LOOM_ON_TRAIN_BATCH_END] == 10);
    ASSERT(strstr(tm.checkpoint, "step-000010.safetensors"));
    ASSERT_EQ(w2.counts[LOOM_ON_VALIDATION_END], 0);

    /* early stopping, patience 2, min_delta 1e9 (nothing improves by that much): the first
     * validation sets the best, the next two do not improve it: three epochs of five */
    char logs[512], events[700];
    test_tmp(logs, sizeof logs, "trainer-logs");
    seen w3 = {.ordered = true};
    ASSERT_EQ(fit_cb(&w3, 5, 2, logs, NULL, &tm), LOOM_OK);
    ASSERT(tm.stopped && tm.epochs == 3 && tm.steps == 90);
    ASSERT_EQ(w3.counts[LOOM_ON_VALIDATION_END], 3);
    /* the LR monitor's and the trainer's scalars in the TensorBoard file */
    char cmd[700];
    snprintf(cmd, sizeof cmd, "ls -t %s/events.out.tfevents.* | head -1", logs);
    FILE *p = popen(cmd, "r");
    ASSERT(p && fgets(events, sizeof events, p));
    pclose(p);
    events[strcspn(events, "\n")] = 0;
    ASSERT_EQ(occurrences(events, "train/lr"), 90);
    ASSERT_EQ(occurrences(events, "train/loss"), 90);
    ASSERT_EQ(occurrences(events, "val/accuracy"), 3);
}

/* accumulate = 2 micro-batches of 1000 on one device: bitwise the batch of 2000 on two devices
 * (the same sums), the steps counted in optimizer steps, and a shortened run resumed to it. */
TEST(accumulated_batches_match_the_larger_batch) {
    enum { N = 784 * 256 + 256 + 256 * 256 + 256 + 256 * 10 + 10 };
    float *ref = malloc(sizeof(float) * N), *got = malloc(sizeof(float) * N);
    loom_trainer_metrics tm;
    char dir[512];
    test_tmp(dir, sizeof dir, "trainer-acc");
    clean(dir);
    fit_devices = 2;
    ASSERT_EQ(fit(NULL, NULL, 25, 0, ref, &tm), LOOM_OK);
    fit_devices = 1, fit_accumulate = 2, fit_batch = base_batch / 2;
    loom_status s1 = fit(NULL, NULL, 25, 0, got, &tm);
    int64_t steps = tm.steps;
    bool same = !memcmp(ref, got, sizeof(float) * N);
    loom_status s2 = fit(dir, NULL, 11, 0, got, &tm); /* cut short at step 11, resumed */
    loom_status s3 = fit(dir, dir, 25, 0, got, &tm);
    fit_devices = 0, fit_accumulate = 0, fit_batch = base_batch;
    ASSERT(s1 == LOOM_OK && s2 == LOOM_OK && s3 == LOOM_OK);
    ASSERT_EQ(steps, 25);
    ASSERT(same);
    ASSERT(!memcmp(ref, got, sizeof(float) * N));
    free(ref), free(got);
}

/* The first n samples of d as a dataset of their own (d freed). */
static loom_dataset *first(loom_dataset *d, int64_t n) {
    loom_loader *l = loom_loader_new(d, &(loom_loader_config){.batch_size = n, .no_shuffle = true});
    loom_batch b;
    loom_dataset *out = l && loom_loader_next(l, &b)
                            ? loom_dataset_from_arrays(n, b.ndim - 1, b.shape + 1, b.x, b.y)
                            : NULL;
    loom_loader_free(l);
    loom_dataset_free(d);
    return out;
}

/* The accelerator's loop (the user's own): `steps` optimizer steps of two accumulated batches
 * each, from step `from` of checkpoint `resume` (NULL: new), a checkpoint of the whole state
 * after step `save_at` into save (0: none); the parameters into out. */
static bool accelerator_loop(int64_t steps, const char *resume, int64_t save_at, const char *save,
                             float *out) {
    run r;
    run_new(&r, &(loom_trainer_config){.log_every = -1});
    loom_accelerator *a = loom_accelerator_new(&(loom_accelerator_config){.devices = 2});
    int64_t done = 0;
    bool ok = a && loom_accelerator_prepare(a, r.m, r.o, r.tl) == LOOM_OK &&
              (!resume || loom_checkpoint_load(resume, r.m, r.o, &done) == LOOM_OK);
    loom_loader_seek(r.tl, 0, 2 * done); /* (steps of two batches, in the first epoch) */
    for (int64_t s = done; ok && s < steps; s++) {
        for (int k = 0; ok && k < 2; k++) {
            loom_graph *g;
            loom_tensor *x, *y;
            ok = loom_accelerator_next(a, NULL, &g, &x, &y);
            loom_accelerator_backward_accumulate(a, training_step(&r, g, x, y), 0.5, k == 0,
                                                 k == 1);
            ok = ok && loom_accelerator_step(a) == LOOM_OK;
        }
        if (ok && s + 1 == save_at)
            ok = loom_checkpoint_save(save, r.m, r.o, s + 1) == LOOM_OK;
    }
    for (int i = 0, k = 0; ok && i < loom_model_count(r.m); i++) {
        loom_param *p = loom_model_at(r.m, i);
        memcpy(out + k, loom_param_data(p), sizeof(float) * (size_t)loom_param_numel(p));
        k += (int)loom_param_numel(p);
    }
    loom_accelerator_free(a);
    loom_trainer_metrics tm;
    run_fit(&r, LOOM_EINVAL, NULL, &tm); /* (frees r; nothing fitted) */
    return ok;
}

/* The accelerator's user checkpoints the whole state (loom_checkpoint_save), and a new process
 * continues from it (loom_checkpoint_load, loom_loader_seek) to bitwise the parameters of the
 * loop never interrupted. */
TEST(an_accelerator_loop_resumes_from_its_checkpoint_bitwise) {
    enum { N = 784 * 256 + 256 + 256 * 256 + 256 + 256 * 10 + 10 };
    float *ref = malloc(sizeof(float) * N), *got = malloc(sizeof(float) * N);
    char ck[512];
    test_tmp(ck, sizeof ck, "accelerator.safetensors");
    ASSERT(accelerator_loop(12, NULL, 5, ck, ref));
    ASSERT(accelerator_loop(12, ck, 0, NULL, got));
    ASSERT(!memcmp(ref, got, sizeof(float) * N));
    free(ref), free(got);
}

int main(void) {
    if (loom_dataset_fmnist(NULL, "train", &train) || loom_dataset_fmnist(NULL, "test", &test)) {
        fprintf(stderr, "%s\n", loom_last_error());
        return 1;
    }
    if (getenv("LOOM_TEST_QUICK"))
        train = first(train, 6000), test = first(test, 1000), base_batch = 200;
    fit_batch = base_batch;
    if (!train || !test) {
        fprintf(stderr, "the quick datasets: %s\n", loom_last_error());
        return 1;
    }
    RUN(a_stopped_or_shortened_fit_resumes_bitwise);
    RUN(callbacks_see_every_event_and_can_stop);
    RUN(accumulated_batches_match_the_larger_batch);
    RUN(an_accelerator_loop_resumes_from_its_checkpoint_bitwise);
    loom_dataset_free(train);
    loom_dataset_free(test);
    return HARNESS_EXIT();
}
