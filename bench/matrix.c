/*
 * matrix.c - loom's training rate on the model matrix (bench/matrix.h), through the trainer (the
 * high-level API) on synthetic data of Fashion-MNIST's shape, SGD lr 0.01 momentum 0.9. Built as
 * build/bench_matrix; bench/matrix.sh runs it beside PyTorch (bench/torch_matrix.py).
 *   bench_matrix --list                 the models, one a line, as torch_matrix.py reads them
 *   bench_matrix MODEL DEVICES STEPS    "samples/s R": STEPS steps after 20 warm-up steps (timed
 *                                       from the first step's end to the last's)
 *                                       (DEVICES: D, or DxC for D devices of C cores each)
 *   bench_matrix MODEL DEVICES STEPS --digest   ... and "params H": a hash (FNV-1a) of every
 *                                       parameter's bits after them (bench/bitwise.sh compares
 *                                       builds by it)
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include "matrix.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void list(void) {
    for (int i = 0; i < MATRIX_COUNT; i++) {
        const matrix_model *m = &matrix[i];
        printf("%s %lld %d %.0f", m->name, (long long)m->batch, m->flat, matrix_flop(m));
        for (const loom_layer *l = m->layers; l->kind != LOOM_LAYER_END; l++) {
            if (l->kind == LOOM_LAYER_LINEAR)
                printf(" linear:%lld:%lld", (long long)l->in, (long long)l->out);
            else if (l->kind == LOOM_LAYER_CONV2D)
                printf(" conv:%lld:%lld:%d:%d:%d", (long long)l->in, (long long)l->out, l->kernel,
                       l->stride, l->padding);
            else if (l->kind == LOOM_LAYER_MAXPOOL)
                printf(" pool:%d:%d:%d", l->kernel, l->stride ? l->stride : l->kernel, l->padding);
            else if (l->kind == LOOM_LAYER_RELU)
                printf(" relu");
            else if (l->kind == LOOM_LAYER_FLATTEN)
                printf(" flatten");
        }
        printf("\n");
    }
}

typedef struct {
    loom_sequential *net;
    bool flat;
} model_ctx;

static loom_tensor *training_step(void *ctx, loom_graph *g, loom_tensor *x, loom_tensor *y) {
    model_ctx *c = ctx;
    if (c->flat)
        x = loom_flatten(g, x);
    return loom_cross_entropy(g, loom_sequential_forward(g, c->net, x), y);
}

/* When the first and the last step of a run ended, and how many ended. */
typedef struct {
    double first, last;
    int64_t ended;
} step_times;

static bool step_ended(const loom_trainer_state *s, void *user) {
    step_times *st = user;
    if (s->event == LOOM_ON_TRAIN_BATCH_END) {
        st->last = now();
        st->first = st->ended++ ? st->first : st->last;
    }
    return false;
}

/* Runs `steps` steps of m on `devices`; samples/s over the run's steps after its first (each its
 * batch of mm->batch samples, from the first step's end to the last's: the trainer's steady state,
 * epochs' starts included, as torch_matrix.py times its loop), or a negative number. (The
 * trainer's own samples_per_s is its last epoch's: here 8 batches, or fewer where STEPS ends
 * within one.) */
static double fit(const matrix_model *mm, loom_model *m, loom_optim *o, model_ctx *ctx,
                  loom_loader *l, int devices, int cores, int64_t steps) {
    loom_trainer *t = loom_trainer_new(&(loom_trainer_config){.max_epochs = 1000000,
                                                              .max_steps = steps,
                                                              .devices = devices,
                                                              .cores_per_device = cores,
                                                              .log_every = -1});
    loom_module_fns fns = {training_step, NULL, ctx};
    step_times st = {0, 0, 0};
    if (!t || loom_trainer_add_callback(t, step_ended, &st) ||
        loom_trainer_fit(t, m, o, &fns, l, NULL)) {
        fprintf(stderr, "%s: %s\n", mm->name, loom_last_error());
        loom_trainer_free(t);
        return -1;
    }
    loom_trainer_free(t);
    return st.ended > 1 && st.last > st.first
               ? (double)(st.ended - 1) * (double)mm->batch / (st.last - st.first)
               : -1;
}

/* FNV-1a over the bits of every parameter of m, in order. */
static uint64_t params_digest(loom_model *m) {
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < loom_model_count(m); i++) {
        loom_param *p = loom_model_at(m, i);
        const unsigned char *b = (const unsigned char *)loom_param_data(p);
        for (size_t k = 0; k < sizeof(float) * (size_t)loom_param_numel(p); k++)
            h = (h ^ b[k]) * 1099511628211ull;
    }
    return h;
}

int main(int argc, char **argv) {
    if (argc == 2 && !strcmp(argv[1], "--list")) {
        list();
        return 0;
    }
    bool digest = argc == 5 && !strcmp(argv[4], "--digest");
    const matrix_model *mm = argc == 4 || digest ? matrix_find(argv[1]) : NULL;
    if (!mm) {
        fprintf(
            stderr,
            "usage: bench_matrix --list | MODEL DEVICES STEPS [--digest] (MODEL from --list)\n");
        return 2;
    }
    int devices = 0, cores = 1;
    if (sscanf(argv[2], "%dx%d", &devices, &cores) < 1)
        devices = 0;
    int64_t steps = atoll(argv[3]), n = 8 * mm->batch; /* eight batches, over and over */
    if (devices < 1 || cores < 1 || steps < 1) {
        fprintf(stderr, "bench_matrix: DEVICES and STEPS must be at least 1 (got '%s', '%s')\n",
                argv[2], argv[3]);
        return 2;
    }
    float *x = malloc(sizeof(float) * (size_t)(n * 784));
    int32_t *y = malloc(sizeof(int32_t) * (size_t)n);
    uint64_t s = 88172645463325252ull;
    for (int64_t i = 0; i < n * 784; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        x[i] = (float)(s >> 40) / (float)(1 << 24);
    }
    for (int64_t i = 0; i < n; i++)
        y[i] = (int32_t)(i * 7 % 10);
    loom_dataset *d = loom_dataset_from_arrays(n, 3, (int64_t[]){1, 28, 28}, x, y);
    loom_model *m = loom_model_new();
    loom_sequential *net = loom_sequential_new(m, mm->layers);
    if (!d || !net) {
        fprintf(stderr, "%s: %s\n", mm->name, loom_last_error());
        return 1;
    }
    loom_sequential_init(net, 0);
    loom_optim *o = loom_sgd_new(m, &(loom_optim_config){.lr = 0.01, .momentum = 0.9});
    loom_loader *l = loom_loader_new(d, &(loom_loader_config){.batch_size = mm->batch});
    model_ctx ctx = {net, mm->flat};
    double warm = fit(mm, m, o, &ctx, l, devices, cores, 20), rate = 0;
    if (warm > 0)
        rate = fit(mm, m, o, &ctx, l, devices, cores, steps);
    if (rate > 0)
        printf("samples/s %.0f\n", rate);
    if (rate > 0 && digest)
        printf("params %016llx\n", (unsigned long long)params_digest(m));
    loom_loader_free(l);
    loom_optim_free(o);
    loom_sequential_free(net);
    loom_model_free(m);
    loom_dataset_free(d);
    free(x), free(y);
    return rate > 0 ? 0 : 1;
}
