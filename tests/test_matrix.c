/*
 * test_matrix.c - every model of the benchmark's matrix (bench/matrix.h: MLPs 512 to 2048 wide and
 * 6 deep, convolutions 3x3 and 5x5 with and without padding, stride 2 without pooling, three conv
 * layers, overlapping padded pooling windows, batches 32 to 512) trains 10 steps through the
 * low-level API (SGD with momentum, on synthetic data): compiled on 1 device against the
 * interpreter on this thread (the two recipes and the overlapping pooling; the second test compares
 * every model's kernels with the interpreter's), on 1 device of 2 cores against 1 of one (bitwise,
 * a step), and on 2 devices against 1 (within 1e-5; with max pooling, whose
 * argmax can flip on a rounding difference, the first step within 1e-6 and 10 steps within 1e-2, as
 * tests/test_dp.c holds the CNN), on data it can learn: its loss falls. LOOM_TEST_QUICK (the
 * sanitizer builds) runs 2 steps of at most 16 samples, and leaves the comparison with the
 * interpreter to the second test's check executor (which compares every kernel, bit for bit);
 * LOOM_TEST_MODELS=a,b,... (the thread sanitizer's run, where the devices' threads, not the
 * models' kernels, are what is checked) runs the models named only.
 */
#include "../bench/matrix.h"
#include "../src/compile/internal.h"
#include "harness.h"

#include <math.h>

typedef struct {
    float *params; /* after the steps (malloc'd) */
    float *first;  /* after the first step (malloc'd) */
    double first_loss, last_loss;
} result;

/* Step `step`'s batch: each sample its class's fixed pattern plus as much noise (learnable). */
static void batch_data(int64_t rows, int step, float *x, int32_t *y) {
    for (int64_t i = 0; i < rows; i++) {
        y[i] = (int32_t)((i * 7 + step * 3) % 10);
        for (int64_t j = 0; j < 784; j++)
            x[i * 784 + j] =
                (float)(test_rand(900 + (uint64_t)y[i], (uint64_t)j, 0, 0.5) +
                        test_rand(500 + (uint64_t)step, (uint64_t)(i * 784 + j), 0, 0.5));
    }
}

/* The last failure of train(). */
static char train_error[1024];

/* Trains mm for `steps` steps of `rows` samples: on `devices` devices of `cores` cores each
 * (compiled), or with none (devices 0) interpreted on this thread. false on failure (said in
 * train_error). */
static bool try_train(const matrix_model *mm, int devices, int cores, int steps, int64_t rows,
                      result *r) {
    loom_model *m = loom_model_new();
    loom_sequential *net = loom_sequential_new(m, mm->layers);
    if (!net) {
        snprintf(train_error, sizeof train_error, "%s: %s", mm->name, loom_last_error());
        loom_model_free(m);
        return false;
    }
    loom_sequential_init(net, 7);
    loom_optim *o = loom_sgd_new(m, &(loom_optim_config){.lr = 0.01, .momentum = 0.9});
    loom_devices *d =
        devices ? loom_devices_new(&(loom_devices_config){.count = devices, .cores = cores}) : NULL;
    loom_graph *g = loom_graph_new(m);
    if (d)
        loom_graph_set_devices(g, d);
    else
        loom_graph_set_backend(g, LOOM_BACKEND_INTERP);
    float *x = malloc(sizeof(float) * (size_t)(rows * 784));
    int32_t *y = malloc(sizeof(int32_t) * (size_t)rows);
    bool ok = true;
    for (int s = 0; s < steps && ok; s++) {
        batch_data(rows, s, x, y);
        loom_graph_reset(g);
        int64_t shape[4] = {rows, 1, 28, 28}, flat[2] = {rows, 784};
        loom_tensor *in = mm->flat ? loom_input_batch(g, LOOM_F32, 2, flat, x)
                                   : loom_input_batch(g, LOOM_F32, 4, shape, x);
        loom_tensor *lab = loom_input_batch(g, LOOM_I32, 1, &rows, y);
        loom_tensor *loss = loom_cross_entropy(g, loom_sequential_forward(g, net, in), lab);
        loom_backward(g, loss);
        loom_optim_step(g, o);
        if (loom_graph_run(g)) {
            snprintf(train_error, sizeof train_error, "%s, %d devices, step %d: %s", mm->name,
                     devices, s, loom_last_error());
            ok = false;
            break;
        }
        double v = loom_item(loss);
        int64_t n = loom_model_numel(m);
        if (s == 0) {
            r->first_loss = v;
            r->first = malloc(sizeof(float) * (size_t)n);
            memcpy(r->first, loom_param_data(loom_model_at(m, 0)), sizeof(float) * (size_t)n);
        }
        r->last_loss = v;
    }
    int64_t n = loom_model_numel(m);
    r->params = malloc(sizeof(float) * (size_t)n);
    memcpy(r->params, loom_param_data(loom_model_at(m, 0)), sizeof(float) * (size_t)n);
    free(x), free(y);
    loom_graph_free(g);
    loom_devices_free(d);
    loom_optim_free(o);
    loom_sequential_free(net);
    loom_model_free(m);
    return ok;
}

/* try_train(), a failure reported. */
static bool train(const matrix_model *mm, int devices, int cores, int steps, int64_t rows,
                  result *r) {
    bool ok = try_train(mm, devices, cores, steps, rows, r);
    if (!ok)
        fprintf(stderr, "FAIL %s\n", train_error), harness_failed++;
    return ok;
}

/* Whether model i is named in the list s (between commas); a NULL list names every model. */
static bool model_named(int i, const char *s) {
    const char *name = matrix[i].name;
    size_t n = strlen(name);
    for (const char *p = s; p && *p; p += strcspn(p, ","), p += *p == ',')
        if (strcspn(p, ",") == n && !strncmp(p, name, n))
            return true;
    return !s;
}

/* Whether model i runs: LOOM_TEST_MODELS names it, or is unset (all run). */
static bool model_runs(int i) {
    return model_named(i, getenv("LOOM_TEST_MODELS"));
}

/* ||a - b|| / ||b|| over n elements. */
static double normwise(const float *a, const float *b, int64_t n) {
    double e = 0, s = 0;
    for (int64_t i = 0; i < n; i++) {
        e += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        s += (double)b[i] * b[i];
    }
    return sqrt(e / s);
}

TEST(every_model_of_the_matrix_trains_as_interpreted_and_on_2_devices_as_on_1) {
    bool quick = getenv("LOOM_TEST_QUICK") != NULL;
    int steps = quick ? 2 : 10;
    for (int i = 0; i < MATRIX_COUNT; i++) {
        if (!model_runs(i))
            continue;
        const matrix_model *mm = &matrix[i];
        int64_t rows = quick && mm->batch > 16 ? 16 : mm->batch;
        result ref = {0}, one = {0}, two = {0}, wide = {0};
        /* 10 steps interpreted for the two recipes and the overlapping pooling; every model's
         * kernels are compared with the interpreter's bit for bit by the next test */
        bool interp =
            !quick && (!strcmp(mm->name, "fmnist-mlp") || !strcmp(mm->name, "fmnist-cnn") ||
                       !strcmp(mm->name, "cnn-pool3s2"));
        bool ok = (!interp || train(mm, 0, 1, steps, rows, &ref)) &&
                  train(mm, 1, 1, steps, rows, &one) && train(mm, 2, 1, steps, rows, &two) &&
                  train(mm, 1, 2, 1, rows, &wide);
        if (ok) {
            loom_model *m = loom_model_new();
            loom_sequential *net = loom_sequential_new(m, mm->layers);
            int64_t n = loom_model_numel(m);
            loom_sequential_free(net);
            loom_model_free(m);
            double ci = interp ? normwise(one.params, ref.params, n) : 0,
                   dd = normwise(two.params, one.params, n);
            double dd1 = normwise(two.first, one.first, n);
            /* a max pooling's argmax can flip on a rounding difference and part the runs by a
             * jump (tests/test_dp.c): with pooling, the first step's parameters are held to 1e-6
             * and 10 steps to 1e-2 */
            bool pooled = false;
            for (const loom_layer *l = mm->layers; l->kind != LOOM_LAYER_END; l++)
                pooled = pooled || l->kind == LOOM_LAYER_MAXPOOL;
            double tol = pooled ? 1e-2 : 1e-5;
            bool bitwise = interp && !memcmp(one.params, ref.params, sizeof(float) * (size_t)n);
            /* a device's cores split its kernels' outputs: the same bits as one core, after a
             * step (the check executor's test compares every kernel of 2 such steps with the
             * reference's bits; test_cli and test_gpt_cli a CNN's and the GPT's whole runs) */
            if (memcmp(wide.params, one.first, sizeof(float) * (size_t)n) != 0)
                fprintf(stderr, "FAIL %s: a device of 2 cores differs from one of 1 by %.3g\n",
                        mm->name, normwise(wide.params, one.first, n)),
                    harness_failed++;
            fprintf(stderr,
                    "%-15s batch %3lld, %d steps: loss %.4f -> %.4f; compiled vs interpreted "
                    "%.2g (%s), 2 devices vs 1 %.2g (after one step %.2g)\n",
                    mm->name, (long long)rows, steps, one.first_loss, one.last_loss, ci,
                    !interp   ? "not run"
                    : bitwise ? "bitwise"
                              : "not bitwise",
                    dd, dd1);
            if (!(ci <= 1e-6))
                fprintf(stderr, "FAIL %s: compiled differs from interpreted by %.3g\n", mm->name,
                        ci),
                    harness_failed++;
            if (!(dd <= tol) || !(dd1 <= 1e-6))
                fprintf(stderr, "FAIL %s: 2 devices differ from 1 by %.3g (one step: %.3g)\n",
                        mm->name, dd, dd1),
                    harness_failed++;
            if (!quick && !(one.last_loss < one.first_loss))
                fprintf(stderr, "FAIL %s: the loss did not fall (%.4f -> %.4f)\n", mm->name,
                        one.first_loss, one.last_loss),
                    harness_failed++;
        }
        free(ref.params), free(one.params), free(two.params), free(wide.params);
        free(ref.first), free(one.first), free(two.first), free(wide.first);
    }
}

/* Through the check executor (src/backend/check.c, a second implementation of the executor
 * interface), every model's steps on 1 device of 2 cores (its kernels' outputs split between
 * them) and on 2 devices: each value every kernel leaves whole equals the reference interpreter's
 * bit for bit. Quick (the sanitizer builds): three models, an MLP, the CNN and overlapping
 * pooling; the first test runs every model's kernels there, and the full build checks them all
 * here. */
TEST(every_kernel_of_every_model_equals_the_reference_under_a_second_executor) {
    bool quick = getenv("LOOM_TEST_QUICK") != NULL;
    loom__set_executor(&loom__check_executor);
    for (int i = 0; i < MATRIX_COUNT; i++) {
        if (!model_runs(i) || (quick && !model_named(i, "fmnist-mlp,fmnist-cnn,cnn-pool3s2")))
            continue;
        const matrix_model *mm = &matrix[i];
        int64_t rows = quick && mm->batch > 16 ? 16 : mm->batch;
        for (int devices = 1; devices <= 2; devices++) {
            int64_t kernels = loom__check.kernels, values = loom__check.values;
            result r = {0};
            bool ok = train(mm, devices, devices == 1 ? 2 : 1, 2, rows, &r);
            free(r.params), free(r.first);
            fprintf(stderr, "%-15s %s: %lld kernels run, %lld values checked\n", mm->name,
                    devices > 1 ? "2 devices" : "1 device of 2 cores",
                    (long long)(loom__check.kernels - kernels),
                    (long long)(loom__check.values - values));
            if (ok && !(loom__check.values - values >= 2 * devices * 10))
                fprintf(stderr, "FAIL %s: only %lld values checked\n", mm->name,
                        (long long)(loom__check.values - values)),
                    harness_failed++;
        }
    }
    loom__set_executor(NULL);
}

/* The check fails a step whose kernel writes one wrong bit, naming the node (kernels of the
 * forward, the backward and the update among the MLP's 34). */
TEST(the_second_executor_fails_a_step_on_one_wrong_bit) {
    loom__set_executor(&loom__check_executor);
    for (int64_t e = 0; e < 34; e += 11) {
        loom__check.corrupt_entry = e;
        result r = {0};
        bool ok = try_train(&matrix[0], 2, 1, 1, 64, &r);
        free(r.params), free(r.first);
        if (ok)
            FAILF("a bit flipped in kernel #%lld went unnoticed", (long long)e);
        ASSERT_STR_CONTAINS(train_error, "executor check: node ");
        char want[64];
        snprintf(want, sizeof want, "made by kernel #%lld ", (long long)e);
        ASSERT_STR_CONTAINS(train_error, want);
    }
    fprintf(stderr, "e.g. %s\n", train_error);
    loom__check.corrupt_entry = -1;
    loom__set_executor(NULL);
}

int main(void) {
    RUN(every_model_of_the_matrix_trains_as_interpreted_and_on_2_devices_as_on_1);
    RUN(every_kernel_of_every_model_equals_the_reference_under_a_second_executor);
    RUN(the_second_executor_fails_a_step_on_one_wrong_bit);
    return HARNESS_EXIT();
}
