/*
 * test_paths.c - the optimizers through the paths users take, against PyTorch: AdamW,
 * SGD-nesterov with weight decay, and AdamW as nanoGPT trains (parameter groups for the weight
 * decay, warm-up and cosine learning-rate schedule, gradient clipping: "adamwx") on both
 * recipes, 12 steps on batches of 32 Fashion-MNIST training
 * images in file order, from PyTorch's initialisation, through the `loom train` command, through
 * loom_trainer_fit and through the accelerator's loop, on 1 and 2 devices. Each of these submits
 * steps the way a user's program does (the command and the trainer record the next step while one
 * runs), so a step that read a later step's inputs would show here.
 *
 * The reference is tests/golden/<recipe>.long.safetensors (tests/golden/make_golden.py): the same
 * steps in float64, the near-exact answer, and the distance of PyTorch's own float32 run from it.
 * A loom run's distance from the float64 run (the Euclidean norm of the parameter difference,
 * over the fixture's elements) must be at most MAX_RATIO times float32 PyTorch's. Parameters are
 * compared as vectors, not element by element: AdamW divides by sqrt(v) + eps, so an element whose
 * gradient is at the rounding level moves by up to lr either way and single elements are noise.
 *
 * A diverging trainer run stops at its first non-finite loss, and its weights are not saved.
 *
 * Usage: test_paths LOOM_BINARY (ctest passes the command's path).
 */
#include "harness.h"

#include <sys/wait.h>

#define STEPS     12
#define BATCH     32
/* Measured: loom at 0.03-1.05 times float32 PyTorch's distance on every path, optimizer and
 * device count (the CNN's AdamW float32 run parts from float64 by a jump, 7.6e-5, that loom on one
 * device repeats and on two does not); before submitted steps read their inputs as at submit, the
 * command's AdamW runs were 2000-180000 times. */
#define MAX_RATIO 4.0

static const char *loom_bin;
static loom_dataset *train;
static const loom_tensor_file *init_file, *ref_file;
static const char *recipe, *opt;
static double worst_ratio;

typedef struct {
    loom_model *m;
    loom_sequential *net;
    loom_optim *o;
    bool flatten;
} net;

/* The recipe with PyTorch's initialisation from the 3-step fixture, and the optimizer. */
static bool net_new(net *n) {
    memset(n, 0, sizeof *n);
    n->m = loom_model_new();
    n->net = loom_sequential_new(n->m, loom_recipe(recipe, &n->flatten));
    if (!n->net)
        return false;
    for (int i = 0; i < loom_model_count(n->m); i++) {
        loom_param *p = loom_model_at(n->m, i);
        char key[128];
        snprintf(key, sizeof key, "init.%s", loom_param_name(p));
        int nd;
        const int64_t *shape;
        const float *v = loom_tensor_file_get(init_file, key, NULL, &nd, &shape);
        if (!v)
            return false;
        memcpy(loom_param_data(p), v, sizeof(float) * (size_t)loom_param_numel(p));
    }
    loom_model_touch(n->m);
    loom_optim_config c = {.lr = 1e-3, .weight_decay = 1e-2};
    if (!strcmp(opt, "sgdn"))
        c = (loom_optim_config){
            .lr = 0.05, .momentum = 0.9, .nesterov = true, .weight_decay = 5e-4};
    if (!strcmp(opt, "adamwx")) /* nanoGPT's recipe in small: make_golden.py's adamwx */
        c = (loom_optim_config){.lr = 1e-3,
                                .beta2 = 0.99,
                                .weight_decay = 0.1,
                                .warmup_steps = 3,
                                .decay_steps = 10,
                                .min_lr = 1e-4,
                                .clip_norm = 0.5};
    n->o = strcmp(opt, "sgdn") ? loom_adamw_new(n->m, &c) : loom_sgd_new(n->m, &c);
    if (n->o && !strcmp(opt, "adamwx"))
        loom_optim_decay_matrices_only(n->o, 0.1);
    return n->o != NULL;
}

static void net_free(net *n) {
    loom_optim_free(n->o);
    loom_sequential_free(n->net);
    loom_model_free(n->m);
}

/* The distance of m's parameters from the float64 run's, over the fixture's elements; the float64
 * run's own displacement from the initial parameters through *moved. */
static double distance(loom_model *m, double *moved) {
    double sq = 0, mv = 0;
    *moved = NAN;
    for (int i = 0; i < loom_model_count(m); i++) {
        loom_param *p = loom_model_at(m, i);
        char key[128];
        snprintf(key, sizeof key, "stride.%s", loom_param_name(p));
        const int32_t *stride = loom_tensor_file_get(ref_file, key, NULL, NULL, NULL);
        snprintf(key, sizeof key, "%s.delta64.%s", opt, loom_param_name(p));
        int nd;
        const int64_t *shape;
        const float *delta = loom_tensor_file_get(ref_file, key, NULL, &nd, &shape);
        snprintf(key, sizeof key, "init.%s", loom_param_name(p));
        const float *w0 = loom_tensor_file_get(init_file, key, NULL, NULL, NULL);
        if (!stride || !delta || !w0)
            return INFINITY;
        const float *w = loom_param_data(p);
        for (int64_t k = 0; k < shape[0]; k++) {
            int64_t e = k * stride[0];
            double d = ((double)w[e] - w0[e]) - delta[k]; /* the difference of floats is exact */
            sq += d * d, mv += (double)delta[k] * delta[k];
        }
    }
    *moved = sqrt(mv);
    return sqrt(sq);
}

/* Judges a trained model against the reference; false (after printing) beyond MAX_RATIO. */
static bool judge(const char *path, int ndev, loom_model *m) {
    char key[64];
    snprintf(key, sizeof key, "%s.dist32", opt);
    const float *d32 = loom_tensor_file_get(ref_file, key, NULL, NULL, NULL);
    double moved = NAN, d = distance(m, &moved), ratio = d32 ? d / d32[0] : INFINITY;
    worst_ratio = fmax(worst_ratio, ratio);
    fprintf(stderr,
            "%-11s %-5s %-11s %d device%s: %.3g from float64 (float32 PyTorch %.3g; ratio %.2f; "
            "the run moved the parameters by %.3g)\n",
            recipe, opt, path, ndev, ndev > 1 ? "s" : " ", d, d32 ? d32[0] : NAN, ratio, moved);
    return ratio <= MAX_RATIO;
}

static loom_tensor *training_step(void *ctx, loom_graph *g, loom_tensor *x, loom_tensor *y) {
    net *n = ctx;
    return loom_cross_entropy(
        g, loom_sequential_forward(g, n->net, n->flatten ? loom_flatten(g, x) : x), y);
}

static loom_loader *file_order(void) {
    return loom_loader_new(train, &(loom_loader_config){.batch_size = BATCH, .no_shuffle = true});
}

static bool via_trainer(int ndev) {
    net n;
    loom_loader *l = file_order();
    loom_trainer *t = loom_trainer_new(
        &(loom_trainer_config){.max_steps = STEPS, .devices = ndev, .log_every = -1});
    loom_module_fns fns = {.training_step = training_step, .ctx = &n};
    bool ok = net_new(&n) && l && t && loom_trainer_fit(t, n.m, n.o, &fns, l, NULL) == LOOM_OK;
    loom_trainer_metrics tm;
    if (t)
        loom_trainer_get_metrics(t, &tm);
    ok = ok && tm.steps == STEPS && judge("trainer", ndev, n.m);
    loom_trainer_free(t);
    loom_loader_free(l);
    net_free(&n);
    return ok;
}

static bool via_accelerator(int ndev) {
    net n;
    loom_loader *l = file_order();
    loom_accelerator *a = loom_accelerator_new(&(loom_accelerator_config){.devices = ndev});
    bool ok = net_new(&n) && l && a && loom_accelerator_prepare(a, n.m, n.o, l) == LOOM_OK;
    loom_graph *g;
    loom_tensor *x, *y;
    for (int s = 0; ok && s < STEPS; s++) {
        ok = loom_accelerator_next(a, NULL, &g, &x, &y);
        loom_accelerator_backward(a, training_step(&n, g, x, y));
        ok = ok && loom_accelerator_step(a) == LOOM_OK;
    }
    ok = ok && judge("accelerator", ndev, n.m);
    loom_accelerator_free(a);
    loom_loader_free(l);
    net_free(&n);
    return ok;
}

/* `loom train` from the initial parameters (saved for --init), its --save read back. */
static bool via_command(int ndev) {
    net n;
    char init_path[512], out_path[512], log_path[512], cmd[4096];
    test_tmp(init_path, sizeof init_path, "paths-init.safetensors");
    test_tmp(out_path, sizeof out_path, "paths-out.safetensors");
    test_tmp(log_path, sizeof log_path, "paths-train.log");
    bool ok = net_new(&n) && loom_model_save(n.m, init_path) == LOOM_OK;
    snprintf(cmd, sizeof cmd,
             "'%s' train %s --init '%s' --save '%s' --no-shuffle --batch %d --steps %d "
             "--devices %d --optimizer %s %s > '%s' 2>&1",
             loom_bin, recipe, init_path, out_path, BATCH, STEPS, ndev,
             strcmp(opt, "sgdn") ? "adamw" : "sgd",
             !strcmp(opt, "sgdn")    ? "--lr 0.05 --momentum 0.9 --nesterov --weight-decay 5e-4"
             : !strcmp(opt, "adamw") ? "--lr 0.001 --weight-decay 0.01"
                                     : "--lr 0.001 --beta2 0.99 --weight-decay 0.1 "
                                       "--decay-matrices-only --warmup-steps 3 --decay-steps 10 "
                                       "--min-lr 1e-4 --clip-norm 0.5",
             log_path);
    remove(out_path);
    int rc = ok ? system(cmd) : -1;
    if (ok && !(WIFEXITED(rc) && WEXITSTATUS(rc) == 0)) {
        fprintf(stderr, "%s failed (%d); its output is in %s\n", cmd, rc, log_path);
        ok = false;
    }
    if (ok && loom_model_load(n.m, out_path) != LOOM_OK) {
        fprintf(stderr, "%s: %s\n", out_path, loom_last_error());
        ok = false;
    }
    ok = ok && judge("loom train", ndev, n.m);
    net_free(&n);
    return ok;
}

/* Every path on 1 and 2 devices for the current recipe and optimizer; failures counted. */
static int all_paths(void) {
    int bad = 0;
    for (int ndev = 1; ndev <= 2; ndev++)
        bad += !via_command(ndev) + !via_trainer(ndev) + !via_accelerator(ndev);
    return bad;
}

static void against_pytorch(const char *r) {
    char path[256];
    loom_tensor_file *fi, *fr;
    recipe = r;
    snprintf(path, sizeof path, "golden/%s.safetensors", r);
    ASSERT_EQ(loom_tensor_file_read(path, &fi), LOOM_OK);
    snprintf(path, sizeof path, "golden/%s.long.safetensors", r);
    ASSERT_EQ(loom_tensor_file_read(path, &fr), LOOM_OK);
    init_file = fi, ref_file = fr;
    int bad = 0;
    const char *opts[3] = {"adamw", "sgdn", "adamwx"};
    for (int i = 0; i < 3; i++) {
        opt = opts[i];
        bad += all_paths();
    }
    loom_tensor_file_free(fi);
    loom_tensor_file_free(fr);
    ASSERT_EQ(bad, 0);
}

TEST(mlp_optimizers_on_every_path_match_pytorch) {
    against_pytorch("fmnist-mlp");
}

TEST(cnn_optimizers_on_every_path_match_pytorch) {
    against_pytorch("fmnist-cnn");
}

/* Diverging (lr 1e6): loom_trainer_fit stops at the first step whose loss is not finite, naming
 * the step and the device, and the weights it left (NaN) are refused by loom_model_save, which
 * writes nothing. */
TEST(a_diverging_trainer_stops_and_saves_nothing) {
    loom_model *m = loom_model_new();
    bool flatten;
    loom_sequential *s = loom_sequential_new(m, loom_recipe("fmnist-mlp", &flatten));
    loom_sequential_init(s, 1);
    loom_optim *o = loom_sgd_new(m, &(loom_optim_config){.lr = 1e6, .momentum = 0.9});
    net n = {.m = m, .net = s, .o = o, .flatten = flatten};
    loom_loader *l = file_order();
    loom_trainer *t = loom_trainer_new(&(loom_trainer_config){.devices = 2, .log_every = -1});
    loom_module_fns fns = {.training_step = training_step, .ctx = &n};
    ASSERT_EQ(loom_trainer_fit(t, m, o, &fns, l, NULL), LOOM_ERANGE);
    ASSERT_STR_CONTAINS(loom_last_error(), ": the loss is NaN on device ");
    loom_trainer_metrics tm;
    loom_trainer_get_metrics(t, &tm);
    char want[64];
    snprintf(want, sizeof want, "step %lld: ", (long long)tm.steps + 1);
    ASSERT_STR_CONTAINS(loom_last_error(), want);
    char path[512];
    test_tmp(path, sizeof path, "diverged.safetensors");
    remove(path);
    ASSERT_EQ(loom_model_save(m, path), LOOM_ERANGE);
    ASSERT_STR_CONTAINS(loom_last_error(), "NaN or infinite values");
    FILE *f = fopen(path, "rb");
    ASSERT(f == NULL);
    loom_trainer_free(t);
    loom_loader_free(l);
    net_free(&n);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s LOOM_BINARY\n", argv[0]);
        return 2;
    }
    loom_bin = argv[1];
    if (loom_dataset_fmnist(NULL, "train", &train)) {
        fprintf(stderr, "%s\n", loom_last_error());
        return 1;
    }
    RUN(mlp_optimizers_on_every_path_match_pytorch);
    RUN(cnn_optimizers_on_every_path_match_pytorch);
    RUN(a_diverging_trainer_stops_and_saves_nothing);
    fprintf(stderr,
            "largest distance from float64 PyTorch: %.2f times float32 PyTorch's (at most "
            "%.0f)\n",
            worst_ratio, MAX_RATIO);
    loom_dataset_free(train);
    return HARNESS_EXIT();
}
