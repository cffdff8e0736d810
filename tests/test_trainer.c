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

#define BATCH 2000 /* 30 steps an epoch */

static loom_dataset *train, *test;

typedef struct {
    loom_model *m;
    loom_sequential *net;
    loom_optim *o;
    int64_t recorded; /* training steps recorded */
    int64_t stop_at;  /* loom_trainer_stop once this many steps are recorded (0: never) */
    loom_trainer *t;
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

/* One fit of two epochs (or max_steps) into dir, resumed from `resume` (NULL: new); the final
 * parameters into out (numel floats) and the metrics into *tm. */
static loom_status fit(const char *dir, const char *resume, int64_t max_steps, int64_t stop_at,
                       float *out, loom_trainer_metrics *tm) {
    run r = {.m = loom_model_new(), .stop_at = stop_at};
    r.net = loom_sequential_new(r.m, loom_recipe("fmnist-mlp", NULL));
    loom_sequential_init(r.net, 1);
    r.o = loom_adamw_new(r.m, &(loom_optim_config){.lr = 2e-3, .warmup_steps = 5});
    loom_loader *tl = loom_loader_new(train, &(loom_loader_config){.batch_size = BATCH, .seed = 7});
    loom_loader *vl =
        loom_loader_new(test, &(loom_loader_config){.batch_size = 5000, .no_shuffle = true});
    r.t = loom_trainer_new(&(loom_trainer_config){.max_epochs = 2,
                                                  .max_steps = max_steps,
                                                  .log_every = -1,
                                                  .checkpoint_dir = dir,
                                                  .resume = resume});
    loom_module_fns fns = {training_step, validation_step, &r};
    loom_status s = loom_trainer_fit(r.t, r.m, r.o, &fns, tl, vl);
    loom_trainer_get_metrics(r.t, tm);
    int64_t k = 0;
    for (int i = 0; i < loom_model_count(r.m); i++) {
        loom_param *p = loom_model_at(r.m, i);
        memcpy(out + k, loom_param_data(p), sizeof(float) * (size_t)loom_param_numel(p));
        k += loom_param_numel(p);
    }
    static char last[4200];
    snprintf(last, sizeof last, "%s", tm->checkpoint ? tm->checkpoint : "");
    tm->checkpoint = last;
    loom_trainer_free(r.t);
    loom_loader_free(tl), loom_loader_free(vl);
    loom_optim_free(r.o);
    loom_sequential_free(r.net);
    loom_model_free(r.m);
    return s;
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

int main(void) {
    if (loom_dataset_fmnist(NULL, "train", &train) || loom_dataset_fmnist(NULL, "test", &test)) {
        fprintf(stderr, "%s\n", loom_last_error());
        return 1;
    }
    RUN(a_stopped_or_shortened_fit_resumes_bitwise);
    loom_dataset_free(train);
    loom_dataset_free(test);
    return HARNESS_EXIT();
}
