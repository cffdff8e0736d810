/*
 * test_gpt.c - the GPT (loom_gpt_*) against PyTorch: tests/golden/gpt.safetensors
 * (tests/golden/make_gpt_golden.py, nanoGPT's model written in PyTorch) gives the initial
 * parameters, fixed batches, the float64 model's logits, and the float64 run of 5 steps of
 * nanoGPT's recipe (AdamW, weight decay on matrices only, warm-up and cosine schedule, gradient
 * clipping) with float32 PyTorch's distance from it.
 *   - the logits at the initial parameters match float64 PyTorch's;
 *   - 5 training steps on this thread and on 1 and 2 devices: loom's distance from the float64
 *     run at most MAX_RATIO times float32 PyTorch's, the losses close to float64's;
 *   - 20 steps on 2 devices match 1 device within 1e-5 (normwise), and repeat bitwise;
 *   - under the check executor (src/backend/check.c) every kernel of those steps equals the
 *     reference interpreter's, and the parameters those of the CPU executor's run, bitwise.
 */
#include "../src/compile/internal.h"
#include "harness.h"

#include <math.h>

#define MAX_RATIO 4.0

static loom_tensor_file *ref;
static const loom_gpt_config cfg = {
    .vocab = 13, .context = 8, .layers = 2, .heads = 2, .width = 16};
enum { B = 4, T = 8, STEPS = 5 };

typedef struct {
    loom_model *m;
    loom_gpt *gpt;
    loom_optim *o;
    loom_devices *d;
    loom_graph *g;
} rig;

static const void *get(const char *name) {
    const void *p = loom_tensor_file_get(ref, name, NULL, NULL, NULL);
    if (!p)
        fprintf(stderr, "gpt.safetensors: no tensor %s\n", name);
    return p;
}

/* The GPT from PyTorch's initial parameters and nanoGPT's optimizer, on `devices` (0: none). */
static bool rig_new_dropout(rig *r, int devices, int cores, double dropout) {
    memset(r, 0, sizeof *r);
    r->m = loom_model_new();
    loom_gpt_config c = cfg;
    c.dropout = dropout;
    if (!(r->gpt = loom_gpt_new(r->m, &c)))
        return false;
    for (int i = 0; i < loom_model_count(r->m); i++) {
        loom_param *p = loom_model_at(r->m, i);
        char key[160];
        snprintf(key, sizeof key, "init.%s", loom_param_name(p));
        const float *v = get(key);
        if (!v)
            return false;
        memcpy(loom_param_data(p), v, sizeof(float) * (size_t)loom_param_numel(p));
    }
    loom_model_touch(r->m);
    r->o = loom_adamw_new(r->m, &(loom_optim_config){.lr = 1e-3,
                                                     .beta2 = 0.99,
                                                     .weight_decay = 0.1,
                                                     .warmup_steps = 2,
                                                     .decay_steps = 4,
                                                     .min_lr = 1e-4,
                                                     .clip_norm = 0.5});
    loom_optim_decay_matrices_only(r->o, 0.1);
    r->g = loom_graph_new(r->m);
    if (devices)
        r->d = loom_devices_new(&(loom_devices_config){.count = devices, .cores = cores});
    return r->o && r->g && (!devices || (r->d && !loom_graph_set_devices(r->g, r->d)));
}

static bool rig_new(rig *r, int devices) {
    return rig_new_dropout(r, devices, 1, 0);
}

static void rig_free(rig *r) {
    loom_graph_free(r->g);
    loom_devices_free(r->d);
    loom_optim_free(r->o);
    loom_gpt_free(r->gpt);
    loom_model_free(r->m);
}

/* One training step on batch s of the fixture; its loss, NaN on failure. */
static double step(rig *r, int s) {
    const int32_t *idx = get("idx"), *tg = get("targets");
    int64_t shape[2] = {B, T};
    loom_graph_reset(r->g);
    loom_gpt_set_train(r->gpt, true, 5, s);
    loom_tensor *x = loom_input_batch(r->g, LOOM_I32, 2, shape, idx + s * B * T);
    loom_tensor *y = loom_input_batch(r->g, LOOM_I32, 2, shape, tg + s * B * T);
    loom_tensor *loss = loom_cross_entropy(r->g, loom_gpt_forward(r->g, r->gpt, x), y);
    loom_backward(r->g, loss);
    loom_optim_step(r->g, r->o);
    if (loom_graph_run(r->g)) {
        fprintf(stderr, "step %d: %s\n", s, loom_last_error());
        return NAN;
    }
    return loom_item(loss);
}

TEST(logits_match_pytorch) {
    rig r;
    ASSERT(rig_new(&r, 0));
    int64_t shape[2] = {B, T};
    loom_tensor *x = loom_input(r.g, LOOM_I32, 2, shape, get("idx"));
    loom_tensor *logits = loom_gpt_forward(r.g, r.gpt, x);
    loom_output(logits);
    ASSERT_EQ(loom_graph_run(r.g), LOOM_OK);
    ASSERT_EQ(loom_tensor_numel(logits), B * T * 13);
    const float *got = loom_tensor_data(logits), *want = get("logits64");
    double err = 0, scale = 0;
    for (int i = 0; i < B * T * 13; i++)
        err = fmax(err, fabs((double)got[i] - want[i])), scale = fmax(scale, fabs(want[i]));
    fprintf(stderr, "logits at PyTorch's initial parameters: max difference %.3g (largest %.3g)\n",
            err, scale);
    ASSERT(err <= 1e-5 * scale);
    rig_free(&r);
}

/* loom's distance from the float64 run after the fixture's steps. */
static double distance(loom_model *m) {
    double sq = 0;
    for (int i = 0; i < loom_model_count(m); i++) {
        loom_param *p = loom_model_at(m, i);
        char key[160];
        snprintf(key, sizeof key, "delta64.%s", loom_param_name(p));
        const float *delta = get(key);
        snprintf(key, sizeof key, "init.%s", loom_param_name(p));
        const float *w0 = get(key), *w = loom_param_data(p);
        if (!delta || !w0)
            return INFINITY;
        for (int64_t e = 0; e < loom_param_numel(p); e++) {
            double d = ((double)w[e] - w0[e]) - delta[e];
            sq += d * d;
        }
    }
    return sqrt(sq);
}

TEST(training_steps_match_pytorch) {
    const float *d32 = get("dist32"), *loss64 = get("loss64");
    ASSERT(d32 && loss64);
    for (int devices = 0; devices <= 2; devices++) {
        rig r;
        ASSERT(rig_new(&r, devices));
        double worst = 0;
        for (int s = 0; s < STEPS; s++)
            worst = fmax(worst, fabs(step(&r, s) - loss64[s]));
        double d = distance(r.m);
        fprintf(stderr,
                "%d device(s): %d steps %.3g from float64 (float32 PyTorch %.3g; ratio %.2f), "
                "losses within %.2g\n",
                devices, STEPS, d, d32[0], d / d32[0], worst);
        ASSERT(d <= MAX_RATIO * d32[0]);
        ASSERT(worst <= 1e-5);
        rig_free(&r);
    }
}

/* The parameters of the test's GPT. */
static int64_t gpt_numel(void) {
    loom_model *m = loom_model_new();
    loom_gpt *gpt = loom_gpt_new(m, &cfg);
    int64_t n = loom_model_numel(m);
    loom_gpt_free(gpt);
    loom_model_free(m);
    return n;
}

/* 20 steps over the fixture's batches again and again on `devices` of `cores` cores each; the
 * parameters into out. */
static bool train20(int devices, int cores, double dropout, float *out, int64_t n) {
    rig r;
    bool ok = rig_new_dropout(&r, devices, cores, dropout);
    for (int s = 0; ok && s < 20; s++)
        ok = !isnan(step(&r, s % STEPS));
    if (ok)
        memcpy(out, loom_param_data(loom_model_at(r.m, 0)), sizeof(float) * (size_t)n);
    rig_free(&r);
    return ok;
}

TEST(two_devices_match_one_and_repeat_bitwise) {
    int64_t n = gpt_numel();
    float *one = malloc(sizeof(float) * (size_t)n), *two = malloc(sizeof(float) * (size_t)n),
          *again = malloc(sizeof(float) * (size_t)n), *plain = malloc(sizeof(float) * (size_t)n);
    for (int k = 0; k < 2; k++) { /* without dropout, then with 0.2 */
        double dropout = k ? 0.2 : 0;
        ASSERT(train20(1, 1, dropout, one, n) && train20(2, 1, dropout, two, n) &&
               train20(2, 1, dropout, again, n));
        double e = 0, s = 0;
        for (int64_t i = 0; i < n; i++)
            e += ((double)two[i] - one[i]) * ((double)two[i] - one[i]),
                s += (double)one[i] * one[i];
        fprintf(stderr,
                "20 steps, dropout %.1f: 2 devices differ from 1 by %.3g (normwise); a repeat %s\n",
                dropout, sqrt(e / s),
                memcmp(two, again, sizeof(float) * (size_t)n) ? "differs" : "is bitwise");
        ASSERT(sqrt(e / s) <= 1e-5);
        ASSERT(memcmp(two, again, sizeof(float) * (size_t)n) == 0);
        if (k == 0)
            memcpy(plain, one, sizeof(float) * (size_t)n); /* (dropout must change the run) */
        else
            ASSERT(memcmp(one, plain, sizeof(float) * (size_t)n) != 0);
    }
    free(one), free(two), free(again), free(plain);
}

TEST(every_kernel_equals_the_reference_under_a_second_executor) {
    int64_t n = gpt_numel();
    float *cpu = malloc(sizeof(float) * (size_t)n), *checked = malloc(sizeof(float) * (size_t)n);
    for (int devices = 1; devices <= 2; devices++) {
        bool ok = train20(devices, 1, 0.2, cpu, n);
        loom__set_executor(&loom__check_executor);
        int64_t values = loom__check.values;
        /* (one device of 2 cores: its split kernels checked, and its bits those of one core) */
        ok = ok && train20(devices, devices == 1 ? 2 : 1, 0.2, checked, n);
        loom__set_executor(NULL);
        fprintf(stderr, "%s, 20 steps: %lld values checked against the reference\n",
                devices == 1 ? "1 device of 2 cores" : "2 devices",
                (long long)(loom__check.values - values));
        ASSERT(ok);
        ASSERT(loom__check.values - values >= 20 * devices * 100);
        ASSERT(memcmp(cpu, checked, sizeof(float) * (size_t)n) == 0);
    }
    free(cpu), free(checked);
}

TEST(bad_shapes_are_one_line) {
    loom_model *m = loom_model_new();
    ASSERT(!loom_gpt_new(
        m, &(loom_gpt_config){.vocab = 13, .context = 8, .layers = 1, .heads = 3, .width = 16}));
    ASSERT_STR_CONTAINS(loom_last_error(), "a width that the heads divide");
    loom_gpt *gpt = loom_gpt_new(m, &cfg);
    loom_graph *g = loom_graph_new(m);
    int64_t shape[2] = {1, 9};
    int32_t toks[9] = {0};
    ASSERT(!loom_gpt_forward(g, gpt, loom_input(g, LOOM_I32, 2, shape, toks)));
    ASSERT_EQ(loom_graph_run(g), LOOM_ESHAPE);
    ASSERT_STR_CONTAINS(loom_last_error(), "tokens (1,9), expected i32 (B, T) with 1 <= T <= the "
                                           "context, 8");
    loom_graph_free(g);
    loom_gpt_free(gpt);
    loom_model_free(m);
}

/* The text dataset: the vocabulary is the sorted distinct characters (UTF-8 decoded), the split
 * 90/10, encode and decode invert each other, --no-shuffle batches are the windows at
 * (s batch + r) context, shuffled ones a function of (seed, step). */
TEST(text_dataset) {
    char path[512];
    test_tmp(path, sizeof path, "gpt-text.txt");
    FILE *f = fopen(path, "wb");
    const char *unit = "caf\xc3\xa9 b\xc3\xa9"
                       "b\xc3\xa9\n"; /* 10 characters, 13 bytes */
    for (int i = 0; i < 30; i++)
        fputs(unit, f);
    fclose(f);
    loom_text *t;
    ASSERT_EQ(loom_text_load(path, &t), LOOM_OK);
    ASSERT_EQ(loom_text_vocab(t), 7); /* \n ' ' a b c f U+00E9 */
    int64_t ntrain = loom_text_count(t, false), nval = loom_text_count(t, true);
    ASSERT_EQ(ntrain, 270);
    ASSERT_EQ(nval, 30);
    int32_t tr[270], va[30];
    ASSERT_EQ(loom_text_tokens(t, false, 0, 270, tr), LOOM_OK);
    ASSERT_EQ(loom_text_tokens(t, true, 0, 30, va), LOOM_OK);
    ASSERT_EQ(loom_text_tokens(t, true, 1, 30, va), LOOM_EINVAL);
    ASSERT(tr[0] == 4 && tr[10] == 4 && va[0] == 4 && va[9] == 0); /* 'c' ... '\n' */
    int32_t tok[16];
    int64_t n;
    ASSERT_EQ(loom_text_encode(t, "caf\xc3\xa9 b", tok, &n), LOOM_OK);
    ASSERT_EQ(n, 6);
    ASSERT(tok[0] == 4 && tok[1] == 2 && tok[2] == 5 && tok[3] == 6 && tok[4] == 1); /* sorted */
    char back[32];
    loom_text_decode(t, tok, n, back, sizeof back);
    ASSERT(!strcmp(back, "caf\xc3\xa9 b"));
    ASSERT_EQ(loom_text_encode(t, "x", tok, &n), LOOM_EINVAL);
    int32_t x[3 * 4], y[3 * 4], x2[3 * 4], y2[3 * 4];
    ASSERT_EQ(loom_text_batch(t, 5, 3, 4, 0, false, x, y), LOOM_OK);
    for (int r = 0; r < 3; r++)
        for (int k = 0; k < 4; k++) {
            int64_t at = ((5 * 3 + r) * 4) % (270 - 4);
            ASSERT(x[r * 4 + k] == tr[at + k] && y[r * 4 + k] == tr[at + k + 1]);
        }
    ASSERT_EQ(loom_text_batch(t, 7, 3, 4, 9, true, x, y), LOOM_OK);
    ASSERT_EQ(loom_text_batch(t, 7, 3, 4, 9, true, x2, y2), LOOM_OK);
    ASSERT(!memcmp(x, x2, sizeof x) && !memcmp(y, y2, sizeof y));
    ASSERT_EQ(loom_text_batch(t, 8, 3, 4, 9, true, x2, y2), LOOM_OK);
    ASSERT(memcmp(x, x2, sizeof x) != 0);
    ASSERT_EQ(loom_text_batch(t, 0, 3, 270, 0, false, x, y), LOOM_EINVAL);
    loom_text_free(t);
}

int main(void) {
    if (loom_tensor_file_read("golden/gpt.safetensors", &ref)) {
        fprintf(stderr, "%s\n", loom_last_error());
        return 1;
    }
    RUN(text_dataset);
    RUN(logits_match_pytorch);
    RUN(training_steps_match_pytorch);
    RUN(two_devices_match_one_and_repeat_bitwise);
    RUN(every_kernel_equals_the_reference_under_a_second_executor);
    RUN(bad_shapes_are_one_line);
    loom_tensor_file_free(ref);
    return HARNESS_EXIT();
}
