/*
 * test_graph.c - the lazy step graph: builders record without running, shape and dtype errors are
 * sticky and name the op and both shapes, the program cache is keyed by structure only (a new
 * batch buffer hits, a new shape misses), and a step repeated from the same state gives
 * bitwise-identical parameters.
 */
#include "harness.h"

#include <math.h>

TEST(shape_errors_are_sticky_and_named) {
    float a[64 * 784 / 64], b[4];
    int64_t sa[2] = {64, 784}, sb[2] = {256, 256};
    loom_graph *g = loom_graph_new(NULL);
    loom_tensor *x = loom_input(g, LOOM_F32, 2, sa, a);
    loom_tensor *w = loom_input(g, LOOM_F32, 2, sb, b);
    ASSERT(loom_graph_error(g) == NULL);
    loom_tensor *y = loom_matmul(g, x, w);
    ASSERT(y == NULL);
    ASSERT_STR_CONTAINS(loom_graph_error(g),
                        "loom_matmul: (64,784) x (256,256): inner dims 784 != 256");
    /* later builders return NULL and keep the first message */
    ASSERT(loom_relu(g, loom_add(g, y, x)) == NULL);
    ASSERT(loom_add(g, x, w) == NULL);
    ASSERT_STR_CONTAINS(loom_graph_error(g), "inner dims");
    ASSERT_EQ(loom_graph_run(g), LOOM_ESHAPE);
    ASSERT_STR_CONTAINS(loom_last_error(), "loom_matmul");
    loom_graph_reset(g);
    ASSERT(loom_graph_error(g) == NULL);
    x = loom_input(g, LOOM_F32, 2, sa, a);
    w = loom_input(g, LOOM_F32, 2, sb, b);
    ASSERT(loom_add(g, x, w) == NULL);
    ASSERT_STR_CONTAINS(loom_graph_error(g),
                        "loom_add: shapes (64,784) and (256,256) do not broadcast");
    ASSERT_EQ(loom_graph_submit(g), LOOM_ESHAPE); /* submit returns it too, and starts nothing */
    ASSERT_STR_CONTAINS(loom_last_error(), "do not broadcast");
    double loss = 0;
    ASSERT_EQ(loom_graph_wait(g, &loss), LOOM_OK); /* nothing ran: nothing to wait for */
    ASSERT(isnan(loss));
    loom_graph_free(g);
    ASSERT_EQ(loom_graph_run(NULL), LOOM_EINVAL);
    ASSERT_STR_CONTAINS(loom_last_error(), "loom_graph_run: NULL graph");
    ASSERT_EQ(loom_graph_submit(NULL), LOOM_EINVAL);
    ASSERT_EQ(loom_graph_wait(NULL, NULL), LOOM_EINVAL);
    ASSERT_STR_CONTAINS(loom_last_error(), "loom_graph_wait: NULL graph");
}

TEST(dtype_errors_are_named) {
    float a[3];
    double b[3];
    int32_t c[3];
    int64_t s[1] = {3};
    loom_graph *g = loom_graph_new(NULL);
    loom_tensor *x = loom_input(g, LOOM_F32, 1, s, a), *y = loom_input(g, LOOM_F64, 1, s, b);
    ASSERT(loom_mul(g, x, y) == NULL);
    ASSERT_STR_CONTAINS(loom_graph_error(g), "loom_mul: dtype f64 of input 1, expected f32");
    loom_graph_reset(g);
    loom_tensor *i = loom_input(g, LOOM_I32, 1, s, c);
    ASSERT(loom_exp(g, i) == NULL);
    ASSERT_STR_CONTAINS(loom_graph_error(g), "loom_exp: dtype i32");
    loom_graph_reset(g);
    ASSERT(loom_onehot(g, loom_input(g, LOOM_F32, 1, s, a), 10, LOOM_F32) == NULL);
    ASSERT_STR_CONTAINS(loom_graph_error(g), "expected i32 indices");
    loom_graph_reset(g);
    int64_t img[4] = {2, 1, 28, 28}, wt[4] = {32, 3, 3, 3};
    ASSERT(loom_conv2d(g, loom_input(g, LOOM_F32, 4, img, a), loom_input(g, LOOM_F32, 4, wt, a),
                       NULL, 1, 0) == NULL);
    ASSERT_STR_CONTAINS(loom_graph_error(g),
                        "loom_conv2d: input (2,1,28,28) and weight (32,3,3,3)");
    loom_graph_free(g);
}

/* A 2-layer MLP step on (batch, 6) inputs; returns the loss. */
static double mlp_step(loom_graph *g, loom_sequential *s, loom_optim *o, const float *x,
                       const int32_t *y, int64_t batch) {
    int64_t sx[2] = {batch, 6};
    loom_graph_reset(g);
    loom_tensor *logits = loom_sequential_forward(g, s, loom_input(g, LOOM_F32, 2, sx, x));
    loom_tensor *loss = loom_cross_entropy(g, logits, loom_input(g, LOOM_I32, 1, &batch, y));
    loom_backward(g, loss);
    loom_optim_step(g, o);
    if (loom_graph_run(g))
        return NAN;
    return loom_item(loss);
}

typedef struct {
    loom_model *m;
    loom_sequential *s;
    loom_optim *o;
    loom_graph *g;
} rig;

static void rig_new(rig *r, bool adamw) {
    r->m = loom_model_new();
    loom_layer layers[] = {LOOM_LINEAR(6, 5), LOOM_RELU, LOOM_LINEAR(5, 3), LOOM_END};
    r->s = loom_sequential_new(r->m, layers);
    loom_sequential_init(r->s, 42);
    loom_optim_config c = {.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01};
    r->o = adamw ? loom_adamw_new(r->m, &c) : loom_sgd_new(r->m, &c);
    r->g = loom_graph_new(r->m);
}

static void rig_free(rig *r) {
    loom_graph_free(r->g);
    loom_optim_free(r->o);
    loom_sequential_free(r->s);
    loom_model_free(r->m);
}

static char logged[1024];
static void capture_log(loom_log_level level, const char *msg, void *ud) {
    (void)ud;
    if (level >= LOOM_LOG_WARN)
        snprintf(logged + strlen(logged), sizeof logged - strlen(logged), "%s\n", msg);
}

TEST(cache_keyed_by_structure_not_data) {
    rig r;
    rig_new(&r, false);
    float x1[8 * 6], x2[8 * 6];
    int32_t y[8];
    for (int i = 0; i < 48; i++)
        x1[i] = (float)test_rand(1, (uint64_t)i, -1, 1),
        x2[i] = (float)test_rand(2, (uint64_t)i, -1, 1);
    for (int i = 0; i < 8; i++)
        y[i] = i % 3;
    double l1 = mlp_step(r.g, r.s, r.o, x1, y, 8);
    double l2 = mlp_step(r.g, r.s, r.o, x2, y, 8); /* other buffer, same structure */
    loom_metrics m;
    loom_graph_metrics(r.g, &m);
    ASSERT(isfinite(l1) && isfinite(l2) && l1 != l2);
    ASSERT_EQ(m.graphs_built, 2);
    ASSERT_EQ(m.programs_built, 1);
    ASSERT_EQ(m.cache_hits, 1);
    logged[0] = 0;
    loom_set_log_hook(capture_log, NULL);
    mlp_step(r.g, r.s, r.o, x1, y, 5); /* a short batch: a new program, and one warning */
    mlp_step(r.g, r.s, r.o, x1, y, 5);
    mlp_step(r.g, r.s, r.o, x1, y, 4);
    loom_set_log_hook(NULL, NULL);
    loom_graph_metrics(r.g, &m);
    ASSERT_EQ(m.programs_built, 3);
    ASSERT_EQ(m.cache_hits, 2);
    ASSERT_STR_CONTAINS(logged, "step 3 built a new program: input 0 is (5,6) where the cached "
                                "program has (8,6)");
    const char *first = strstr(logged, "built a new program");
    ASSERT(first && !strstr(first + 1, "built a new program")); /* said once */
    rig_free(&r);
}

TEST(repeated_steps_are_bitwise_identical) {
    for (int adamw = 0; adamw < 2; adamw++) {
        float x[8 * 6];
        int32_t y[8];
        for (int i = 0; i < 48; i++)
            x[i] = (float)test_rand(3, (uint64_t)i, -1, 1);
        for (int i = 0; i < 8; i++)
            y[i] = (i * 7) % 3;
        rig a, b;
        rig_new(&a, adamw);
        rig_new(&b, adamw);
        for (int step = 0; step < 5; step++) {
            mlp_step(a.g, a.s, a.o, x, y, 8);
            mlp_step(b.g, b.s, b.o, x, y, 8);
        }
        int64_t n = loom_model_numel(a.m);
        ASSERT(n == 6 * 5 + 5 + 5 * 3 + 3);
        ASSERT(!memcmp(loom_param_data(loom_model_at(a.m, 0)),
                       loom_param_data(loom_model_at(b.m, 0)), sizeof(float) * (size_t)n));
        loom_metrics m;
        loom_graph_metrics(a.g, &m);
        ASSERT_EQ(m.programs_built, 1);
        ASSERT_EQ(m.cache_hits, 4);
        rig_free(&a);
        rig_free(&b);
    }
}

/* A parameter added to the model while a step is being recorded (after the step took another)
 * joins it: both read their values and loom_backward stores both gradients. */
TEST(a_parameter_added_while_recording_joins_the_step) {
    loom_model *m = loom_model_new();
    int64_t s[1] = {3};
    loom_param *a = loom_model_add(m, "a", 1, s);
    for (int i = 0; i < 3; i++)
        loom_param_data(a)[i] = (float)(i + 1);
    loom_graph *g = loom_graph_new(m);
    loom_tensor *ta = loom_parameter(g, a);
    loom_param *b = NULL;
    for (int k = 0; k < 40; k++) { /* past any room the step made for the first */
        char name[16];
        snprintf(name, sizeof name, "b%d", k);
        b = loom_model_add(m, name, 1, s);
    }
    for (int i = 0; i < 3; i++)
        loom_param_data(b)[i] = (float)(10 * (i + 1));
    loom_tensor *loss = loom_sum_all(g, loom_mul(g, ta, loom_parameter(g, b)));
    loom_backward(g, loss);
    ASSERT_EQ(loom_graph_run(g), LOOM_OK);
    ASSERT_NEAR(loom_item(loss), 10 + 40 + 90, 1e-4);
    for (int i = 0; i < 3; i++) {
        ASSERT_NEAR(loom_param_grad(loom_model_find(m, "a"))[i], 10 * (i + 1), 1e-5);
        ASSERT_NEAR(loom_param_grad(loom_model_find(m, "b39"))[i], i + 1, 1e-5);
    }
    loom_graph_free(g);
    loom_model_free(m);
}

/* loom_sequential's max pooling with a stride and padding (torch.nn.MaxPool2d(3, 2, 1)) against
 * naive loops; padding over half the window is refused at build, naming the layer. */
TEST(sequential_max_pooling_takes_stride_and_padding) {
    enum { H = 7, W = 6, OH = 4, OW = 3 };
    float x[H * W];
    for (int i = 0; i < H * W; i++)
        x[i] = (float)test_rand(9, (uint64_t)i, -1, 1);
    loom_model *m = loom_model_new();
    loom_layer layers[] = {LOOM_MAXPOOL2D_STRIDED(3, 2, 1), LOOM_END};
    loom_sequential *s = loom_sequential_new(m, layers);
    ASSERT(s != NULL);
    loom_graph *g = loom_graph_new(m);
    int64_t sx[4] = {1, 1, H, W};
    loom_tensor *y = loom_sequential_forward(g, s, loom_input(g, LOOM_F32, 4, sx, x));
    loom_output(y);
    ASSERT_EQ(loom_graph_run(g), LOOM_OK);
    const int64_t *ys = loom_tensor_shape(y);
    const float *py = loom_tensor_data(y);
    ASSERT(ys[2] == OH && ys[3] == OW);
    for (int oy = 0; oy < OH; oy++)
        for (int ox = 0; ox < OW; ox++) {
            float best = -INFINITY;
            for (int iy = 2 * oy - 1; iy <= 2 * oy + 1; iy++)
                for (int ix = 2 * ox - 1; ix <= 2 * ox + 1; ix++)
                    if (iy >= 0 && iy < H && ix >= 0 && ix < W && x[iy * W + ix] > best)
                        best = x[iy * W + ix];
            ASSERT(py[oy * OW + ox] == best);
        }
    loom_graph_free(g);
    loom_sequential_free(s);
    loom_layer bad[] = {LOOM_LINEAR(4, 4), LOOM_MAXPOOL2D_STRIDED(3, 1, 2), LOOM_END};
    ASSERT(loom_sequential_new(m, bad) == NULL);
    ASSERT_STR_CONTAINS(loom_last_error(),
                        "layer 1: max pooling padding 2, expected at most half its window 3");
    loom_model_free(m);
}

TEST(training_reduces_the_loss) {
    rig r;
    rig_new(&r, false);
    float x[16 * 6];
    int32_t y[16];
    for (int i = 0; i < 16; i++) {
        y[i] = i % 3;
        for (int k = 0; k < 6; k++)
            x[i * 6 + k] = (float)(k == y[i] ? 1.0 : 0.0) +
                           (float)test_rand(4, (uint64_t)(i * 6 + k), -0.2, 0.2);
    }
    double first = mlp_step(r.g, r.s, r.o, x, y, 16), last = first;
    for (int step = 0; step < 50; step++)
        last = mlp_step(r.g, r.s, r.o, x, y, 16);
    ASSERT(last < 0.2 * first);
    rig_free(&r);
}

/* PyTorch's defaults: weight and bias uniform in +-1/sqrt(fan_in); fan_in = in * kh * kw. */
TEST(init_follows_pytorch_distributions) {
    loom_model *m = loom_model_new();
    loom_layer layers[] = {LOOM_CONV2D(3, 64, 5, 1, 0), LOOM_FLATTEN, LOOM_LINEAR(300, 400),
                           LOOM_END};
    loom_sequential *s = loom_sequential_new(m, layers);
    loom_sequential_init(s, 9);
    const double fan[4] = {75, 75, 300, 300};
    for (int i = 0; i < 4; i++) {
        loom_param *p = loom_model_at(m, i);
        const float *d = loom_param_data(p);
        double bound = 1 / sqrt(fan[i]), sum = 0, sq = 0, n = (double)loom_param_numel(p);
        for (int64_t k = 0; k < loom_param_numel(p); k++) {
            ASSERT(fabs(d[k]) <= bound);
            sum += d[k], sq += (double)d[k] * d[k];
        }
        if (n > 1000) { /* mean 0, variance bound^2 / 3 */
            ASSERT_NEAR(sum / n / bound, 0.0, 0.02);
            ASSERT_NEAR(sq / n / (bound * bound / 3), 1.0, 0.03);
        }
    }
    float first = loom_param_data(loom_model_at(m, 0))[0];
    loom_sequential_init(s, 9);
    ASSERT(loom_param_data(loom_model_at(m, 0))[0] == first); /* seeded */
    loom_sequential_init(s, 10);
    ASSERT(loom_param_data(loom_model_at(m, 0))[0] != first);
    loom_sequential_free(s);
    loom_model_free(m);
}

/* The learning-rate schedule step by step against nanoGPT's get_lr written out here, and
 * configurations that cannot work refused with one clear message. */
TEST(optimizer_schedule_and_bad_configs) {
    loom_model *m = loom_model_new(), *other = loom_model_new();
    int64_t s2[2] = {3, 4}, s1[1] = {4};
    loom_param *w = loom_model_add(m, "w", 2, s2), *b = loom_model_add(m, "b", 1, s1);
    loom_param *q = loom_model_add(other, "q", 1, s1);
    loom_optim *o = loom_adamw_new(
        m, &(loom_optim_config){.lr = 6e-4, .warmup_steps = 5, .decay_steps = 20, .min_lr = 6e-5});
    ASSERT(o && w && b && q);
    loom_graph *g = loom_graph_new(m);
    for (int t = 0; t < 25; t++) {
        double want = t < 5    ? 6e-4 * (t + 1) / 6.0
                      : t > 20 ? 6e-5
                               : 6e-5 + 0.5 * (1 + cos(3.14159265358979323846 * (t - 5) / 15.0)) *
                                            (6e-4 - 6e-5);
        loom_graph_reset(g);
        loom_optim_step(g, o);
        ASSERT_NEAR(loom_optim_lr(o), want, 1e-15);
    }
    ASSERT_EQ(loom_optim_set_weight_decay(o, q, 0.1), LOOM_EINVAL);
    ASSERT_STR_CONTAINS(loom_last_error(), "a parameter of another model");
    ASSERT_EQ(loom_optim_set_weight_decay(o, b, -1), LOOM_EINVAL);
    ASSERT_EQ(loom_optim_set_weight_decay(o, b, 0), LOOM_OK);
    loom_graph_free(g);
    loom_optim_free(o);
    ASSERT(!loom_adamw_new(m, &(loom_optim_config){.warmup_steps = 10, .decay_steps = 5}));
    ASSERT_STR_CONTAINS(loom_last_error(), "expected decay_steps > warmup_steps >= 0");
    ASSERT(!loom_sgd_new(m, &(loom_optim_config){.clip_norm = -1}));
    ASSERT_STR_CONTAINS(loom_last_error(), "clip norm -1");
    loom_model_free(m);
    loom_model_free(other);
}

int main(void) {
    RUN(optimizer_schedule_and_bad_configs);
    RUN(init_follows_pytorch_distributions);
    RUN(shape_errors_are_sticky_and_named);
    RUN(dtype_errors_are_named);
    RUN(cache_keyed_by_structure_not_data);
    RUN(repeated_steps_are_bitwise_identical);
    RUN(a_parameter_added_while_recording_joins_the_step);
    RUN(sequential_max_pooling_takes_stride_and_padding);
    RUN(training_reduces_the_loss);
    return HARNESS_EXIT();
}
