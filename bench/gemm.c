/*
 * gemm.c - sgemm microbenchmark at the recipes' and the GPT's shapes: OpenBLAS (as configured by
 * the environment) against loom's own kernel (gemm.c's with AVX-512, else gemm256.c's with AVX2),
 * GFLOP/s of one thread, best of several runs, and loom's as a share of the core's FMA peak
 * (loom_fma_peak_gflops, measured once before the shapes); then
 * loom's kernel in each form that can run the shape (packed, transposed, dot, dot rows: '-'
 * where it cannot), the one loom__gemm_choose takes marked '*' (the data a cost model needs).
 * Transposed operands are passed with the strides the training step uses. Built as
 * build/bench_gemm.
 *   build/bench_gemm            every shape
 *   build/bench_gemm WORD        the shapes whose name has WORD in it ("cnn3", "weight grad")
 *   COLD=1 build/bench_gemm     each run after the caches are emptied (64 MB written): the
 *                               operands come from memory, as a training step finds a layer's
 *                               weights that the last step's update wrote back
 */
#include "../src/backend/internal.h"

#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const char *what;
    int64_t m, n, k;
    bool ta, tb; /* A stored (k x m), B stored (n x k) */
} shape;

static const shape shapes[] = {
    {"mlp fc1 forward", 128, 256, 784, false, true},
    {"mlp fc1 weight grad", 256, 784, 128, true, false},
    {"mlp fc2 forward", 128, 256, 256, false, true},
    {"mlp fc3 forward", 128, 10, 256, false, true},
    {"mlp fc3 input grad", 128, 256, 10, false, false},
    {"mlp fc3 weight grad", 10, 256, 128, true, false},
    {"mlp fc3 weight grad^T", 256, 10, 128, true, false},
    {"cnn fc1 forward", 128, 128, 1600, false, true},
    {"cnn conv2 forward", 64, 15488, 288, false, false},
    {"cnn conv2 weight grad", 64, 288, 15488, false, true},
    {"cnn conv2 input grad", 288, 15488, 64, true, false},
    {"cnn conv1 forward", 32, 86528, 9, false, false},
    {"cnn3 conv2 forward", 32, 100352, 144, false, false},
    {"cnn3 conv2 input grad", 144, 100352, 32, true, false},
    {"cnn3 conv2 weight grad", 32, 144, 100352, false, true},
    {"cnn3 conv3 forward", 64, 25088, 288, false, false},
    {"cnn3 conv3 input grad", 288, 25088, 64, true, false},
    {"cnn3 conv3 weight grad", 64, 288, 25088, false, true},
    {"cnn conv1 weight grad", 32, 9, 86528, false, true},
    {"gpt qkv forward", 768, 384, 128, false, true},
    {"gpt proj forward", 768, 128, 128, false, true},
    {"gpt fc forward", 768, 512, 128, false, true},
    {"gpt fc-proj forward", 768, 128, 512, false, true},
    {"gpt qkv input grad", 768, 128, 384, false, false},
    {"gpt fc-proj input grad", 768, 512, 128, false, false},
    {"gpt fc input grad", 768, 128, 512, false, false},
    {"gpt qkv weight grad", 384, 128, 768, true, false},
    {"gpt fc weight grad", 512, 128, 768, true, false},
    {"gpt fc-proj weight grad", 128, 512, 768, true, false},
    {"mlp2048 fc2 forward", 512, 2048, 2048, false, true},
    {"mlp2048 fc2 input grad", 512, 2048, 2048, false, false},
    {"mlp2048 fc2 weight grad", 2048, 2048, 512, true, false},
    {"mlp2048 fc1 weight grad", 2048, 784, 512, true, false},
    {"mlp1024 fc2 forward", 128, 1024, 1024, false, true},
    {"mlp1024 fc2 weight grad", 1024, 1024, 128, true, false},
    {"mlp1024 fc2 input grad", 128, 1024, 1024, false, false},
    {"mlp512 fc2 input grad", 128, 512, 512, false, false},
    {"gpt attn scores", 64, 64, 32, false, true},
    {"gpt attn values", 64, 32, 64, false, false},
    {"gpt attn dv", 64, 32, 64, true, false},
};

static unsigned char *cold; /* COLD=1: written before each run */
#define COLD_BYTES (64u << 20)

static double best_of(int reps,
                      void (*fn)(const shape *, const float *, const float *, float *, void *),
                      const shape *s, const float *a, const float *b, float *c, void *scratch) {
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        if (cold)
            memset(cold, r, COLD_BYTES);
        double t0 = loom__now();
        fn(s, a, b, c, scratch);
        double t = loom__now() - t0;
        best = t < best ? t : best;
    }
    return best;
}

static void run_blas(const shape *s, const float *a, const float *b, float *c, void *scratch) {
    (void)scratch;
    cblas_sgemm(CblasRowMajor, s->ta ? CblasTrans : CblasNoTrans, s->tb ? CblasTrans : CblasNoTrans,
                (int)s->m, (int)s->n, (int)s->k, 1.0f, a, (int)(s->ta ? s->m : s->k), b,
                (int)(s->tb ? s->k : s->n), 0.0f, c, (int)s->n);
}

static void run_loom(const shape *s, const float *a, const float *b, float *c, void *scratch) {
    if (!loom__gemm_available()) { /* AVX2's */
        loom__sgemm256(s->ta, s->tb, s->m, s->n, s->k, a, s->ta ? s->m : s->k, b,
                       s->tb ? s->k : s->n, c, s->n, scratch);
        return;
    }
    loom__sgemm(s->m, s->n, s->k, a, s->ta ? 1 : s->k, s->ta ? s->m : 1, b, s->tb ? 1 : s->n,
                s->tb ? s->k : 1, c, s->n, scratch);
}

/* The shape's operands as loom's matrices. */
static void operands(const shape *s, const float *a, const float *b, loom__gmat *ga,
                     loom__gmat *gb) {
    *ga = (loom__gmat){a, {1, {s->m}, {s->ta ? 1 : s->k}}, {1, {s->k}, {s->ta ? s->m : 1}}};
    *gb = (loom__gmat){b, {1, {s->k}, {s->tb ? 1 : s->n}}, {1, {s->n}, {s->tb ? s->k : 1}}};
}

static loom__gemm_form form_now; /* the form run_form runs */

static void run_form(const shape *s, const float *a, const float *b, float *c, void *scratch) {
    loom__gmat ga, gb;
    operands(s, a, b, &ga, &gb);
    loom__sgemm_form(form_now, s->m, s->n, s->k, &ga, &gb, c, (loom__gdim){1, {s->m}, {s->n}},
                     (loom__gdim){1, {s->n}, {1}}, false, scratch);
}

/* The CNN's conv2 products as the training step runs them: reading the (N,C,H,W) image through
 * the unfold's grouped view (no im2col buffer), and the input gradient added into the image. */
static void conv_views(void *scratch) {
    enum { N = 128, C = 32, H = 13, W = 13, O = 64, KK = 3, OH = H - 2, OW = W - 2 };
    int64_t cols = (int64_t)N * OH * OW, ckk = C * KK * KK;
    float *x = malloc(sizeof(float) * N * C * H * W), *w = malloc(sizeof(float) * O * C * KK * KK);
    float *dy = malloc(sizeof(float) * (size_t)(O * cols)),
          *out = malloc(sizeof(float) * N * C * H * W);
    float *y = malloc(sizeof(float) * (size_t)(O * cols));
    for (int64_t j = 0; j < N * C * H * W; j++)
        x[j] = (float)(j % 7) - 3;
    for (int64_t j = 0; j < O * C * KK * KK; j++)
        w[j] = (float)(j % 5) - 2;
    for (int64_t j = 0; j < O * cols; j++)
        dy[j] = (float)(j % 3) - 1;
    loom__gdim ckk_dim = {3, {C, KK, KK}, {H * W, W, 1}};
    loom__gdim col_dim = {3, {N, OH, OW}, {C * H * W, W, 1}};
    loom__gmat gw = {w, {1, {O}, {ckk}}, {1, {ckk}, {1}}};     /* (O x CKK) */
    loom__gmat gwt = {w, {1, {ckk}, {1}}, {1, {O}, {ckk}}};    /* its transpose */
    loom__gmat gx = {x, ckk_dim, col_dim};                     /* unfold(x): CKK x cols */
    loom__gmat gxt = {x, col_dim, ckk_dim};                    /* cols x CKK */
    loom__gmat gdy = {dy, {1, {O}, {cols}}, {1, {cols}, {1}}}; /* (O x cols) */
    loom__gdim orow = {1, {O}, {cols}}, ocol = {1, {cols}, {1}};
    loom__gdim wrow = {1, {O}, {ckk}}, wcol = {1, {ckk}, {1}};
    double flop = 2.0 * (double)O * (double)cols * (double)ckk;
    printf("conv2 through the unfold's view (no im2col buffer), GFLOP/s:\n");
    for (int which = 0; which < 3; which++) {
        double best = 1e30;
        for (int r = 0; r < 10; r++) {
            double t0 = loom__now();
            if (which == 0)
                loom__sgemm_g(O, cols, ckk, &gw, &gx, y, orow, ocol, false, scratch);
            else if (which == 1)
                loom__sgemm_g(O, ckk, cols, &gdy, &gxt, w, wrow, wcol, false, scratch);
            else {
                memset(out, 0, sizeof(float) * N * C * H * W);
                loom__sgemm_g(ckk, cols, O, &gwt, &gdy, out, ckk_dim, col_dim, true, scratch);
            }
            double t = loom__now() - t0;
            best = t < best ? t : best;
        }
        static const char *const what[] = {"forward (image read in place)", "weight grad",
                                           "input grad (added into the image)"};
        printf("%-40s %10.1f\n", what[which], flop / best * 1e-9);
    }
    free(x), free(w), free(dy), free(out), free(y);
}

int main(int argc, char **argv) {
    const char *only = argc > 1 ? argv[1] : NULL;
    const char *env = getenv("COLD");
    cold = env && *env && strcmp(env, "0") ? malloc(COLD_BYTES) : NULL;
    loom__blas_init();
    bool own = loom__gemm_available(), own256 = !own && loom__gemm256_available();
    size_t bytes = loom__gemm_scratch_bytes(), b256 = loom__gemm256_scratch_bytes();
    void *scratch = malloc(bytes > b256 ? bytes : b256);
    double peak = loom_fma_peak_gflops();
    printf("%-24s %6s %6s %6s %10s %10s %7s %9s %9s %9s %9s\n", "shape", "M", "N", "K", "openblas",
           "loom", "of peak", "packed", "transp", "dot", "dot-rows");
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
        const shape *s = &shapes[i];
        if (only && !strstr(s->what, only))
            continue;
        float *a = malloc(sizeof(float) * (size_t)(s->m * s->k));
        float *b = malloc(sizeof(float) * (size_t)(s->k * s->n));
        float *c = malloc(sizeof(float) * (size_t)(s->m * s->n));
        for (int64_t j = 0; j < s->m * s->k; j++)
            a[j] = (float)(j % 7) - 3;
        for (int64_t j = 0; j < s->k * s->n; j++)
            b[j] = (float)(j % 5) - 2;
        double flop = 2.0 * (double)s->m * (double)s->n * (double)s->k;
        int reps = flop > 1e9 ? 5 : 20;
        double tb = best_of(reps, run_blas, s, a, b, c, scratch);
        double tl = own || own256 ? best_of(reps, run_loom, s, a, b, c, scratch) : 0;
        double gl = own || own256 ? flop / tl * 1e-9 : 0.0;
        printf("%-24s %6lld %6lld %6lld %10.1f %10.1f %6.1f%%", s->what, (long long)s->m,
               (long long)s->n, (long long)s->k, flop / tb * 1e-9, gl,
               peak > 0 ? 100 * gl / peak : 0.0);
        loom__gmat ga, gb; /* every form that can run it; * the one loom__gemm_choose takes */
        operands(s, a, b, &ga, &gb);
        for (int f = 0; own && f < LOOM_GEMM_FORMS; f++) {
            form_now = (loom__gemm_form)f;
            if (!loom__gemm_form_ok(form_now, s->m, s->n, s->k, &ga, &gb)) {
                printf(" %9s", "-");
                continue;
            }
            double t = best_of(reps, run_form, s, a, b, c, scratch);
            printf(" %8.1f%c", flop / t * 1e-9,
                   loom__gemm_choose(s->m, s->n, s->k, &ga, &gb) == form_now ? '*' : ' ');
        }
        printf("\n");
        free(a), free(b), free(c);
    }
    if (own && !only)
        conv_views(scratch);
    printf("FMA peak %.1f GFLOP/s a core (the shares' base)\n", peak);
    free(scratch), free(cold);
    return 0;
}
