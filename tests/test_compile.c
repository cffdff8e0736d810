/*
 * test_compile.c - generated C kernels against the interpreter: every elementwise op of the table
 * (from ops.def), in float and double, inside fused chains with broadcast, permuted and constant
 * leaves, gives bitwise the interpreter's values; whole training steps of both recipes agree after
 * 20 steps; a second graph finds its kernels in the disk cache; a truncated cache entry is rebuilt.
 */
#include "../src/compile/internal.h"
#include "harness.h"

#include <dirent.h>
#include <unistd.h>

static const char *const ew_ops[] = {
#define LOOM_EW(name, arity, expr) #name,
#include "../src/graph/ops.def"
};
static const int ew_arity[] = {
#define LOOM_EW(name, arity, expr) arity,
#include "../src/graph/ops.def"
};

/* op applied to operands through the public builders (the table's names map to them). */
static loom_tensor *apply(loom_graph *g, const char *op, loom_tensor *a, loom_tensor *b,
                          loom_tensor *c) {
    if (!strcmp(op, "NEG"))
        return loom_neg(g, a);
    if (!strcmp(op, "EXP"))
        return loom_exp(g, a);
    if (!strcmp(op, "LOG"))
        return loom_log(g, loom_exp(g, a)); /* a positive operand */
    if (!strcmp(op, "SQRT"))
        return loom_sqrt(g, loom_exp(g, a));
    if (!strcmp(op, "RELU"))
        return loom_relu(g, a);
    if (!strcmp(op, "TANH"))
        return loom_tanh(g, a);
    if (!strcmp(op, "ERF"))
        return loom_erf(g, a);
    if (!strcmp(op, "GELU"))
        return loom_gelu(g, a);
    if (!strcmp(op, "GELUD")) /* no public builder: loom_gelu and autograd make it */
        return loom__gelu_deriv(g, a);
    if (!strcmp(op, "ADD"))
        return loom_add(g, a, b);
    if (!strcmp(op, "SUB"))
        return loom_sub(g, a, b);
    if (!strcmp(op, "MUL"))
        return loom_mul(g, a, b);
    if (!strcmp(op, "DIV"))
        return loom_div(g, a, b);
    if (!strcmp(op, "CMPGT"))
        return loom_cmpgt(g, a, b);
    if (!strcmp(op, "CMPEQ"))
        return loom_cmpeq(g, a, loom_relu(g, b));
    if (!strcmp(op, "WHERE"))
        return loom_where(g, loom_cmpgt(g, a, b), b, c);
    return NULL;
}

/* n values in [-3, 3) from stream `seed` into buf as dt (float or double), a NaN at index nan. */
static void fill(double *buf, int64_t n, loom_dtype dt, uint64_t seed, int64_t nan) {
    for (int64_t i = 0; i < n; i++) {
        double v = i == nan ? NAN : test_rand(seed, (uint64_t)i, -3, 3);
        if (dt == LOOM_F32)
            ((float *)buf)[i] = (float)v;
        else
            buf[i] = v;
    }
}

/* One fused expression around op, on graph g with the given backend; returns its output bytes. */
static void *run_op(const char *op, loom_dtype dt, loom_backend be, size_t *bytes,
                    loom_metrics *m) {
    enum { R = 7, C = 33 };
    static double buf[3][R * C];
    for (int k = 0; k < 3; k++)
        fill(buf[k], R * C, dt, (uint64_t)k, -1);
    loom_graph *g = loom_graph_new(NULL);
    loom_graph_set_backend(g, be);
    int64_t s2[2] = {R, C}, s2t[2] = {C, R}, row[2] = {1, C};
    loom_tensor *a = loom_input(g, dt, 2, s2, buf[0]);
    loom_tensor *bt = loom_transpose(g, loom_input(g, dt, 2, s2t, buf[1])); /* a strided leaf */
    loom_tensor *c = loom_input(g, dt, 2, row, buf[2]);                     /* a broadcast leaf */
    loom_tensor *x = loom_mul(g, loom_add(g, a, loom_scalar(g, 0.25, dt)), loom_exp(g, c));
    loom_tensor *y = apply(g, op, x, loom_sub(g, bt, c), loom_neg(g, a));
    loom_tensor *z = loom_add(g, loom_mul(g, y, c), a); /* the op in the middle of a chain */
    loom_output(z);
    void *out = NULL;
    if (loom_graph_run(g) == LOOM_OK) {
        *bytes = (size_t)loom_tensor_numel(z) * (dt == LOOM_F64 ? 8 : 4);
        out = malloc(*bytes);
        memcpy(out, loom_tensor_data(z), *bytes);
    }
    loom_graph_metrics(g, m);
    loom_graph_free(g);
    return out;
}

TEST(every_elementwise_op_compiles_bitwise) {
    for (size_t i = 0; i < sizeof ew_ops / sizeof *ew_ops; i++) {
        (void)ew_arity;
        for (int d = 0; d < 2; d++) {
            loom_dtype dt = d ? LOOM_F64 : LOOM_F32;
            size_t n1 = 0, n2 = 0;
            loom_metrics mi, mc;
            void *ref = run_op(ew_ops[i], dt, LOOM_BACKEND_INTERP, &n1, &mi);
            void *got = run_op(ew_ops[i], dt, LOOM_BACKEND_CPU, &n2, &mc);
            if (!ref || !got || n1 != n2 || memcmp(ref, got, n1) != 0)
                FAILF("%s (%s): compiled and interpreted values differ", ew_ops[i],
                      d ? "f64" : "f32");
            if (mc.fused_ops < 3 || mc.compiles + mc.disk_hits != 1 || mi.fused_ops != 0)
                FAILF("%s: %lld ops fused, %lld compiles, %lld disk hits", ew_ops[i],
                      (long long)mc.fused_ops, (long long)mc.compiles, (long long)mc.disk_hits);
            free(ref);
            free(got);
        }
    }
}

static const char *const red_ops[] = {
#define LOOM_RED(name, combine, ident) #name,
#include "../src/graph/ops.def"
};

static loom_tensor *reduce(loom_graph *g, const char *op, loom_tensor *x, int axis) {
    return !strcmp(op, "SUM") ? loom_sum(g, x, axis) : loom_max(g, x, axis);
}

/* Reduction patterns the scheduler fuses, on an (R x C) input (C = 100: the 16-lane path along
 * memory; C = 9: sequential; across memory: an accumulator per column): a chain reduced along
 * memory and across it (strided), the middle axis of a 3-D view of it, followed by
 * an elementwise consumer; a leaf reduced with a consumer only (a permuted leaf: strided); two
 * reductions under one consumer (one is fused, the other runs alone: a small reduction alone is
 * a generated kernel too). Returns the outputs. */
static void *run_red(const char *op, int64_t C, loom_dtype dt, loom_backend be, size_t *bytes,
                     loom_metrics *m) {
    enum { R = 6 };
    static double buf[2][R * 100];
    for (int k = 0; k < 2; k++) /* a NaN in a: MAX lets it win, SUM carries it */
        fill(buf[k], R * C, dt, (uint64_t)k + 20, k == 0 ? 7 : -1);
    loom_graph *g = loom_graph_new(NULL);
    loom_graph_set_backend(g, be);
    int64_t s2[2] = {R, C}, s2t[2] = {C, R}, s3[3] = {2, R / 2, C};
    loom_tensor *a = loom_input(g, dt, 2, s2, buf[0]);
    loom_tensor *bt = loom_transpose(g, loom_input(g, dt, 2, s2t, buf[1]));
    loom_tensor *x = loom_mul(g, loom_add(g, a, loom_scalar(g, 0.5, dt)), loom_exp(g, bt));
    loom_tensor *outs[7] = {
        loom_exp(g, reduce(g, op, x, 1)),                                   /* along memory */
        loom_neg(g, reduce(g, op, loom_sub(g, a, bt), 0)),                  /* across memory */
        loom_mul(g, reduce(g, op, bt, 1), loom_scalar(g, 2.0, dt)),         /* a strided leaf */
        loom_add(g, reduce(g, op, loom_neg(g, a), 1), reduce(g, op, x, 1)), /* two */
        reduce(g, op, loom_exp(g, a), 1),                                   /* a reduction root */
        loom_exp(g, reduce(g, op, loom_reshape(g, x, 3, s3), 1)), /* a middle axis: outer, inner */
        loom_exp(g, reduce(g, op, bt, 0)), /* a strided leaf across its rows */
    };
    size_t total = 0;
    for (int i = 0; i < 7; i++) {
        loom_output(outs[i]);
        total += (size_t)loom_tensor_numel(outs[i]);
    }
    void *out = NULL;
    size_t es = dt == LOOM_F64 ? 8 : 4;
    if (loom_graph_run(g) == LOOM_OK) {
        *bytes = total * es;
        out = malloc(*bytes);
        size_t at = 0;
        for (int i = 0; i < 7; i++) {
            size_t n = (size_t)loom_tensor_numel(outs[i]) * es;
            memcpy((char *)out + at, loom_tensor_data(outs[i]), n);
            at += n;
        }
    }
    loom_graph_metrics(g, m);
    loom_graph_free(g);
    return out;
}

/* Bitwise equal, except that any two NaNs are equal: a NaN's sign and payload follow operand
 * order, which C leaves to the compiler for commutative operations. */
static bool same_bits(const void *a, const void *b, size_t bytes, loom_dtype dt) {
    size_t es = dt == LOOM_F64 ? 8 : 4;
    for (size_t i = 0; i < bytes / es; i++) {
        double x = es == 8 ? ((const double *)a)[i] : ((const float *)a)[i];
        double y = es == 8 ? ((const double *)b)[i] : ((const float *)b)[i];
        if (memcmp((const char *)a + i * es, (const char *)b + i * es, es) && !(x != x && y != y))
            return false;
    }
    return true;
}

/* Whether a kept run's, a fused run's and the interpreter's outputs (of n1, n2, n3 bytes) are all
 * there, of one size, and the fused one's bits are both others'. Frees the three. */
static bool three_agree(void *kept, size_t n1, void *fused, size_t n2, void *interp, size_t n3) {
    bool ok = kept && fused && interp && n1 == n2 && n1 == n3 &&
              same_bits(kept, fused, n1, LOOM_F32) && same_bits(interp, fused, n1, LOOM_F32);
    free(kept);
    free(fused);
    free(interp);
    return ok;
}

TEST(reductions_fuse_bitwise) {
    for (size_t i = 0; i < sizeof red_ops / sizeof *red_ops; i++)
        for (int d = 0; d < 2; d++)
            for (int64_t C = 9; C <= 100; C += 91) {
                loom_dtype dt = d ? LOOM_F64 : LOOM_F32;
                size_t n1 = 0, n2 = 0;
                loom_metrics mi, mc;
                void *ref = run_red(red_ops[i], C, dt, LOOM_BACKEND_INTERP, &n1, &mi);
                void *got = run_red(red_ops[i], C, dt, LOOM_BACKEND_CPU, &n2, &mc);
                if (!ref || !got || n1 != n2 || !same_bits(ref, got, n1, dt))
                    FAILF("%s (%s, %lld columns): compiled and interpreted values differ",
                          red_ops[i], d ? "f64" : "f32", (long long)C);
                /* interpreted: 12 elementwise kernels and 8 reductions; compiled: exp(bt) (read
                 * through a transpose, so not fused), x, one kernel per output, and the pair's
                 * second reduction alone */
                if (mc.kernels != 10 || mi.kernels != 20)
                    FAILF("%s: %lld kernels compiled, %lld interpreted (expected 10 and 20)",
                          red_ops[i], (long long)mc.kernels, (long long)mi.kernels);
                free(ref);
                free(got);
            }
}

/* Runs g (which it frees) and returns its n outputs t[i], count[i] floats each, one after another
 * in one malloc'd buffer of *bytes (NULL if the run failed); its metrics into m (if any). */
static void *outputs_of(loom_graph *g, int n, loom_tensor *const *t, const size_t *count,
                        size_t *bytes, loom_metrics *m) {
    size_t total = 0;
    for (int i = 0; i < n; i++)
        loom_output(t[i]), total += count[i];
    char *out = NULL;
    if (loom_graph_run(g) == LOOM_OK && (out = malloc(sizeof(float) * total))) {
        *bytes = sizeof(float) * total;
        for (size_t i = 0, at = 0; i < (size_t)n; at += count[i++])
            memcpy(out + sizeof(float) * at, loom_tensor_data(t[i]), sizeof(float) * count[i]);
    }
    if (m)
        loom_graph_metrics(g, m);
    loom_graph_free(g);
    return out;
}

static void *two_outputs(loom_graph *g, loom_tensor *a, size_t na, loom_tensor *b, size_t nb,
                         size_t *bytes, loom_metrics *m) {
    loom_tensor *t[2] = {a, b};
    size_t count[2] = {na, nb};
    return outputs_of(g, 2, t, count, bytes, m);
}

/* A product read by an elementwise kernel through two reshapes, the first of which something else
 * also reads: no epilogue (the product's whole output is needed), and the values are the
 * interpreter's. */
static void *run_shared_view(loom_backend be, size_t *bytes) {
    enum { M = 16, K = 20, N = 64 };
    static float x[M * K], w[K * N];
    test_fill(x, M * K, 45, -1, 1);
    test_fill(w, K * N, 46, -1, 1);
    loom_graph *g = loom_graph_new(NULL);
    loom_graph_set_backend(g, be);
    int64_t sx[2] = {M, K}, sw[2] = {K, N}, s1[3] = {M, N, 1}, s2[2] = {M, N};
    static const int perm[3] = {0, 2, 1};
    loom_tensor *mm =
        loom_matmul(g, loom_input(g, LOOM_F32, 2, sx, x), loom_input(g, LOOM_F32, 2, sw, w));
    loom_tensor *v1 = loom_reshape(g, mm, 3, s1); /* (M,N,1) -> (M,1,N) -> (M,N): still mm's */
    loom_tensor *y = loom_add(g, loom_reshape(g, loom_permute(g, v1, perm), 2, s2),
                              loom_scalar(g, 0.5, LOOM_F32)); /* binary: not pushed through views */
    loom_tensor *z = loom_exp(g, loom_sum(g, v1, 1));         /* another reader of the first view */
    return two_outputs(g, y, M * N, z, M, bytes, NULL);
}

/* Epilogues: relu(x w + bias) runs inside the product (37 rows: ragged tiles; 300 columns: two
 * column blocks; with `form` 1 to 3, K = 450: three k blocks), done in registers as the product
 * stores (form 1: relu(x w) with a NaN, an infinity and zeros in x, so NaN rows, infinite and
 * zero products meet the ReLU; form 2: x w + bias; form 3: where(h > 0, x w, 0), h with a NaN,
 * zeros of both signs and an infinity), and a ReLU's backward of a pool gradient inside the pool
 * gradient, plane by plane (through a 2-D reshape). Forms 4 and 5 are forms 0 and 1 with K = 450
 * and w read transposed (N > 2 M: the product runs as its transpose, the epilogue applied as C^T
 * is transposed into y). Returns both outputs. */
static void *run_epilogues(loom_backend be, int form, size_t *bytes, loom_metrics *m) {
    enum { M = 37, KMAX = 450, N = 300, B = 2, C = 3, H = 8, W = 10 };
    int64_t K = form ? KMAX : 50;
    bool wt = form >= 4;
    form = wt ? form - 4 : form;
    static float x[M * KMAX], w[KMAX * N], bias[N], img[B * C * H * W], dy[B * C * H / 2 * W / 2];
    test_fill(x, M * K, 40, -1, 1);
    test_fill(w, K * N, 41, -1, 1);
    test_fill(bias, N, 42, -1, 1);
    test_fill(img, B * C * H * W, 43, -1, 1);
    test_fill(dy, B * C * H / 2 * W / 2, 44, -1, 1);
    if (form == 1) {
        x[3 * K + 7] = NAN, x[5 * K + 1] = INFINITY, x[6 * K + 2] = -INFINITY;
        memset(x + 9 * K, 0, sizeof(float) * (size_t)K);
    }
    loom_graph *g = loom_graph_new(NULL);
    loom_graph_set_backend(g, be);
    int64_t sx[2] = {M, K}, sw[2] = {K, N}, swt[2] = {N, K}, sb[1] = {N}, si[4] = {B, C, H, W};
    int64_t sy[4] = {B, C, H / 2, W / 2}, s2[2] = {B * C, H * W};
    loom_tensor *y = loom_matmul(g, loom_input(g, LOOM_F32, 2, sx, x),
                                 wt ? loom_transpose(g, loom_input(g, LOOM_F32, 2, swt, w))
                                    : loom_input(g, LOOM_F32, 2, sw, w));
    static float h[M * N]; /* form 3: a ReLU's backward, where(h > 0, x w, 0) */
    test_fill(h, M * N, 47, -1, 1);
    h[5] = NAN, h[6] = 0, h[7] = -0.0f, h[M * N - 1] = INFINITY;
    int64_t sh[2] = {M, N};
    if (form == 3)
        y = loom_where(
            g, loom_cmpgt(g, loom_input(g, LOOM_F32, 2, sh, h), loom_scalar(g, 0.0, LOOM_F32)), y,
            loom_scalar(g, 0.0, LOOM_F32));
    if (form != 1 && form != 3)
        y = loom_add(g, y, loom_input(g, LOOM_F32, 1, sb, bias));
    if (form != 2 && form != 3)
        y = loom_relu(g, y);
    loom_tensor *ti = loom_input(g, LOOM_F32, 4, si, img);
    loom_tensor *pg = loom_pool_max_grad(g, ti, loom_input(g, LOOM_F32, 4, sy, dy),
                                         (loom_window){2, 2, 2, 2, 0, 0});
    loom_tensor *flat = loom_reshape(g, ti, 2, s2);
    loom_tensor *dx = loom_where(g, loom_cmpgt(g, flat, loom_scalar(g, 0.0, LOOM_F32)),
                                 loom_reshape(g, pg, 2, s2), loom_scalar(g, 0.0, LOOM_F32));
    return two_outputs(g, y, M * N, dx, B * C * H * W, bytes, m);
}

/* Whether products are loom's own (AVX-512, or AVX2 and FMA), which run a product's epilogue on
 * its blocks (BLAS's run apart). */
static bool own_products(void) {
    return loom__use_own_gemm() || loom__use_gemm256();
}

TEST(epilogues_run_inside_library_kernels_bitwise) {
    size_t n1 = 0, n2 = 0;
    loom_metrics mi, mc;
    for (int form = 0; form < 6; form++) {
        void *ref = run_epilogues(LOOM_BACKEND_INTERP, form, &n1, &mi);
        void *got = run_epilogues(LOOM_BACKEND_CPU, form, &n2, &mc);
        ASSERT(ref && got && n1 == n2);
        ASSERT(same_bits(ref, got, n1, LOOM_F32));
        int f = form % 4;
        /* interpreted: matmul, add, relu (not both with form 1 and 2; with form 3 a second
         * cmpgt and where in place of add and relu), pool gradient, cmpgt, where; compiled: the two
         * library kernels, each running its epilogue (with loom's matmul; with BLAS the product's
         * runs apart) */
        ASSERT_EQ(mi.kernels, f == 1 || f == 2 ? 5 : 6);
        ASSERT_EQ(mc.kernels, own_products() ? 2 : 3);
        if (f == 1) { /* the NaN row stays NaN where the ReLU meets it (a max would give 0) */
            int nans = 0;
            for (int j = 0; j < 300; j++)
                nans += ((float *)got)[3 * 300 + j] != ((float *)got)[3 * 300 + j];
            ASSERT_EQ(nans, 300);
        }
        free(ref);
        free(got);
    }
    void *ref, *got;
    ref = run_shared_view(LOOM_BACKEND_INTERP, &n1);
    got = run_shared_view(LOOM_BACKEND_CPU, &n2);
    ASSERT(ref && got && n1 == n2);
    ASSERT(same_bits(ref, got, n1, LOOM_F32));
    free(ref);
    free(got);
}

/* A residual: x w + r (r a matrix of the product's shape, with a NaN, an infinity and -0), added
 * in registers as the product stores. Variant 0: K = 50, r on the right; 1: relu(r + x w), r on
 * the left, K = 450 (three k blocks: the sum is whole before r is added); 2: w read transposed
 * (N > 2 M: the product runs as its transpose, r added as C^T is transposed into y). 37 rows
 * (ragged tiles), 300 columns (two column blocks). Returns y. */
static void *run_residual(loom_backend be, int variant, size_t *bytes, loom_metrics *m) {
    enum { M = 37, KMAX = 450, N = 300 };
    int64_t K = variant ? KMAX : 50;
    static float x[M * KMAX], w[KMAX * N], r[M * N];
    test_fill(x, M * K, 50, -1, 1);
    test_fill(w, K * N, 51, -1, 1);
    test_fill(r, M * N, 52, -2, 2);
    r[3] = NAN, r[4] = INFINITY, r[5] = -0.0f;
    loom_graph *g = loom_graph_new(NULL);
    loom_graph_set_backend(g, be);
    int64_t sx[2] = {M, K}, sw[2] = {K, N}, swt[2] = {N, K}, sr[2] = {M, N};
    loom_tensor *p =
        loom_matmul(g, loom_input(g, LOOM_F32, 2, sx, x),
                    variant == 2 ? loom_transpose(g, loom_input(g, LOOM_F32, 2, swt, w))
                                 : loom_input(g, LOOM_F32, 2, sw, w));
    loom_tensor *res = loom_input(g, LOOM_F32, 2, sr, r);
    loom_tensor *y = variant == 1 ? loom_relu(g, loom_add(g, res, p)) : loom_add(g, p, res);
    return two_outputs(g, y, M * N, loom_sum_all(g, y), 1, bytes, m);
}

/* Case `variant` of run, interpreted and compiled: whether the two steps' values are the same
 * bits, with each one's metrics. */
static bool compiled_as_interpreted(void *(*run)(loom_backend, int, size_t *, loom_metrics *),
                                    int variant, loom_metrics *mi, loom_metrics *mc) {
    size_t n1 = 0, n2 = 0;
    void *ref = run(LOOM_BACKEND_INTERP, variant, &n1, mi);
    void *got = run(LOOM_BACKEND_CPU, variant, &n2, mc);
    bool same = ref && got && n1 == n2 && same_bits(ref, got, n1, LOOM_F32);
    free(ref);
    free(got);
    return same;
}

TEST(a_residual_is_added_in_the_products_registers_bitwise) {
    for (int variant = 0; variant < 3; variant++) {
        loom_metrics mi, mc;
        ASSERT(compiled_as_interpreted(run_residual, variant, &mi, &mc));
        /* interpreted: the product, the add (and the ReLU), the sum; compiled: the product with
         * the add (and the ReLU) inside, the sum (with BLAS the add runs apart). Ops fused: the
         * ADD into the ReLU's kernel (variant 1), that kernel into the product as its epilogue,
         * and the epilogue into its registers (a block epilogue would count one fewer). */
        ASSERT_EQ(mi.kernels, variant == 1 ? 4 : 3);
        ASSERT_EQ(mc.kernels, own_products() ? 2 : 3); /* (AVX2: a block epilogue) */
        if (loom__use_own_gemm())
            ASSERT_EQ(mc.fused_ops, variant == 1 ? 3 : 2);
    }
}

/* A bias gradient made as its product stores: sum(y, 0) of y = where(h > 0, x w, 0) (`relu`
 * 0) or relu(x w + bias): 37 rows (ragged tiles, summed in row order), 300 columns (two
 * column blocks, a ragged panel), K = 450 (three k blocks); h and x with a NaN. Returns y and
 * the sum. */
static void *run_column_sum(loom_backend be, int relu, size_t *bytes, loom_metrics *m) {
    enum { M = 37, K = 450, N = 300 };
    static float x[M * K], w[K * N], bias[N], h[M * N];
    test_fill(x, M * K, 60, -1, 1);
    test_fill(w, K * N, 61, -1, 1);
    test_fill(bias, N, 62, -1, 1);
    test_fill(h, M * N, 63, -1, 1);
    h[9] = NAN, x[4 * K + 3] = NAN;
    loom_graph *g = loom_graph_new(NULL);
    loom_graph_set_backend(g, be);
    int64_t sx[2] = {M, K}, sw[2] = {K, N}, sb[1] = {N}, sh[2] = {M, N};
    loom_tensor *y =
        loom_matmul(g, loom_input(g, LOOM_F32, 2, sx, x), loom_input(g, LOOM_F32, 2, sw, w));
    if (relu)
        y = loom_relu(g, loom_add(g, y, loom_input(g, LOOM_F32, 1, sb, bias)));
    else
        y = loom_where(
            g, loom_cmpgt(g, loom_input(g, LOOM_F32, 2, sh, h), loom_scalar(g, 0.0, LOOM_F32)), y,
            loom_scalar(g, 0.0, LOOM_F32));
    return two_outputs(g, y, M * N, loom_sum(g, y, 0), N, bytes, m);
}

TEST(products_sum_their_columns_as_they_store_bitwise) {
    for (int relu = 0; relu < 2; relu++) {
        loom_metrics mi, mc;
        ASSERT(compiled_as_interpreted(run_column_sum, relu, &mi, &mc));
        if (loom__use_own_gemm()) /* one kernel: the product, its epilogue and the sum */
            ASSERT_EQ(mc.kernels, 1);
    }
}

/* Sinks: a pool gradient's rows (its epilogue's, a ReLU's backward, with `where`; else its own
 * through a 2-D reshape) read only by a sum along them and a product on the dot-product path are
 * kept two at a time, each going into both (unless `keep` makes them an output). B is a transposed
 * input, so that chunks run across the pool's planes (60 columns each, not a multiple of 16) and
 * across the 1024-column blocks. Returns the sum and the product. */
static void *run_sinks(loom_backend be, bool where, bool keep, size_t *bytes, loom_metrics *m) {
    enum { R = 5, P = 30, H = 6, W = 10, N = 7, K = P * H * W };
    static float img[R * P * H * W], dy[R * P * H / 2 * W / 2], bt[N * K];
    test_fill(img, R * P * H * W, 50, -1, 1);
    test_fill(dy, R * P * H / 2 * W / 2, 51, -1, 1);
    test_fill(bt, N * K, 52, -1, 1);
    loom_graph *g = loom_graph_new(NULL);
    loom_graph_set_backend(g, be);
    int64_t si[4] = {R, P, H, W}, sy[4] = {R, P, H / 2, W / 2}, s2[2] = {R, K}, sb[2] = {N, K};
    loom_tensor *ti = loom_input(g, LOOM_F32, 4, si, img);
    loom_tensor *pg = loom_pool_max_grad(g, ti, loom_input(g, LOOM_F32, 4, sy, dy),
                                         (loom_window){2, 2, 2, 2, 0, 0});
    loom_tensor *dx = loom_reshape(g, pg, 2, s2);
    if (where)
        dx = loom_where(g, loom_cmpgt(g, loom_reshape(g, ti, 2, s2), loom_scalar(g, 0.0, LOOM_F32)),
                        dx, loom_scalar(g, 0.0, LOOM_F32));
    if (keep) /* an output: written whole, so no sinks */
        loom_output(dx);
    loom_tensor *sum = loom_sum(g, dx, 1);
    loom_tensor *prod = loom_matmul(g, dx, loom_transpose(g, loom_input(g, LOOM_F32, 2, sb, bt)));
    return two_outputs(g, sum, R, prod, R * N, bytes, m);
}

/* A pool gradient's rows read by a sum along them and by a product (conv2's bias gradient and
 * its products): the rows are written whole, and the sum is fed each row once complete (planes
 * of 30 in rows of 900). Returns the sum and the product. */
static void *run_side_sum(bool keep, size_t *bytes, loom_metrics *m) {
    enum { R = 5, P = 30, H = 6, W = 10, K = P * H * W, N = 20 };
    static float img[R * P * H * W], dy[R * P * H / 2 * W / 2], b[K * N];
    test_fill(b, K * N, 55, -1, 1);
    test_fill(img, R * P * H * W, 53, -1, 1);
    test_fill(dy, R * P * H / 2 * W / 2, 54, -1, 1);
    loom_graph *g = loom_graph_new(NULL);

    int64_t si[4] = {R, P, H, W}, sy[4] = {R, P, H / 2, W / 2}, s2[2] = {R, K}, sb[2] = {K, N};
    loom_tensor *ti = loom_input(g, LOOM_F32, 4, si, img);
    loom_tensor *pg = loom_pool_max_grad(g, ti, loom_input(g, LOOM_F32, 4, sy, dy),
                                         (loom_window){2, 2, 2, 2, 0, 0});
    loom_tensor *dx = loom_reshape(g, pg, 2, s2);
    if (keep) /* an output: no sinks */
        loom_output(dx);
    loom_tensor *prod = loom_matmul(g, dx, loom_input(g, LOOM_F32, 2, sb, b));
    return two_outputs(g, loom_sum(g, dx, 1), R, prod, R * N, bytes, m);
}

TEST(a_sum_takes_rows_others_read_too) {
    size_t n1 = 0, n2 = 0;
    loom_metrics mi, mc;
    void *ref = run_side_sum(true, &n1, &mi);
    void *got = run_side_sum(false, &n2, &mc);
    ASSERT(ref && got && n1 == n2);
    ASSERT(same_bits(ref, got, n1, LOOM_F32));
    /* kept: pool gradient, sum, product; else the sum inside the pool gradient */
    ASSERT_EQ(mi.kernels, 3);
    ASSERT_EQ(mc.kernels, loom__use_own_gemm() ? 2 : 3);
    free(ref);
    free(got);
}

TEST(epilogue_rows_go_into_sinks_bitwise) {
    size_t n1 = 0, n2 = 0;
    loom_metrics mi, mc;
    void *ref = run_sinks(LOOM_BACKEND_INTERP, true, false, &n1, &mi);
    void *got = run_sinks(LOOM_BACKEND_CPU, true, false, &n2, &mc);
    ASSERT(ref && got && n1 == n2);
    ASSERT(same_bits(ref, got, n1, LOOM_F32));
    /* compiled: the pool gradient alone, computing the sum and the product (loom's matmul) */
    ASSERT_EQ(mc.kernels, loom__use_own_gemm() ? 1 : 3);
    free(ref);
    free(got);
    for (int be = 0; be < 2; be++) { /* no epilogue: the pool gradient's own rows, either way */
        loom_backend b = be ? LOOM_BACKEND_CPU : LOOM_BACKEND_INTERP;
        ref = run_sinks(b, false, true, &n1, &mi);
        got = run_sinks(b, false, false, &n2, &mc);
        ASSERT(ref && got && n1 == n2);
        ASSERT(same_bits(ref, got, n1, LOOM_F32));
        ASSERT_EQ(mi.kernels, 3);
        ASSERT_EQ(mc.kernels, loom__use_own_gemm() ? 1 : 3);
        free(ref);
        free(got);
    }
}

/* A max pooling of a convolution: sum(relu?(pool(conv(x, w, b?))) v) and its gradient with
 * respect to w. The pooling computes the convolution a plane at a time (the product, the bias's
 * epilogue, then the pooling, its ReLU and argmax codes) unless `keep` makes the convolution's
 * output an output. Shapes (mode): 6 output channels (a group of 4 rows and one of 2), 2 input
 * channels and a 3 x 2 kernel (K = 12), planes of 9 x 8 (ragged pooling rows); or (1) stride 2,
 * no bias, no ReLU (columns one apart in no run); or (2) a 3 x 3 kernel on 14 x 14 images,
 * planes of 12 x 12 that the windows tile (made by windows); or (3) 48 output channels (the
 * product runs by its transpose) on 13 x 13 images, planes of 11 x 11 whose last row and column
 * no window covers (made by windows through the transpose, 2 images a block: 3 is ragged); or (4)
 * one input channel and a 5 x 5 kernel on 16 x 16 images, planes of 12 x 12 (made by windows).
 * Returns the pooled values and the gradient. */
static void *run_conv_pool(loom_backend be, bool keep, int mode, size_t *bytes, loom_metrics *m) {
    enum { N = 3, OMAX = 48 };
    bool stride2 = mode == 1;
    int C = mode == 4 ? 1 : 2, KH = mode == 4 ? 5 : 3;
    int H = mode == 4   ? 16
            : mode >= 2 ? 14 - (mode == 3)
                        : 11,
        W = mode == 4   ? 16
            : mode >= 2 ? 14 - (mode == 3)
                        : 9;
    int KW = mode == 4 ? 5 : mode >= 2 ? 3 : 2, O = mode == 3 ? 48 : 6;
    int st = stride2 ? 2 : 1, OH = (H - KH) / st + 1, OW = (W - KW) / st + 1;
    int64_t sx[4] = {N, C, H, W}, sw[4] = {O, C, KH, KW}, sb[1] = {O};
    int64_t sv[4] = {N, O, OH / 2, OW / 2};
    static float x[N * 2 * 14 * 14], w[OMAX * 2 * 3 * 3], bias[OMAX], v[N * OMAX * 7 * 7];
    test_fill(x, N * C * H * W, 60, -1, 1);
    test_fill(w, O * C * KH * KW, 61, -1, 1);
    test_fill(bias, O, 62, -0.5, 0.5);
    test_fill(v, N * O * (OH / 2) * (OW / 2), 63, -1, 1);
    loom_graph *g = loom_graph_new(NULL);
    loom_graph_set_backend(g, be);
    loom_tensor *tw = loom_input(g, LOOM_F32, 4, sw, w);
    loom_requires_grad(tw);
    loom_tensor *y = loom_conv2d(g, loom_input(g, LOOM_F32, 4, sx, x), tw,
                                 stride2 ? NULL : loom_input(g, LOOM_F32, 1, sb, bias), st, 0);
    if (keep)
        loom_output(y);
    loom_tensor *r = loom_pool_max(g, y, (loom_window){2, 2, 2, 2, 0, 0});
    if (!stride2)
        r = loom_relu(g, r);
    loom_tensor *loss = loom_sum_all(g, loom_mul(g, r, loom_input(g, LOOM_F32, 4, sv, v)));
    loom_tensor *gw = loom_grad(g, loss, tw);
    return two_outputs(g, r, (size_t)(N * O * (OH / 2) * (OW / 2)), gw, O * C * KH * KW, bytes, m);
}

TEST(pooling_computes_its_convolution_bitwise) {
    for (int mode = 0; mode < 5; mode++) {
        size_t n1 = 0, n2 = 0, n3 = 0;
        loom_metrics mk, mc;
        void *ref = run_conv_pool(LOOM_BACKEND_CPU, true, mode, &n1, &mk);
        void *got = run_conv_pool(LOOM_BACKEND_CPU, false, mode, &n2, &mc);
        void *interp = run_conv_pool(LOOM_BACKEND_INTERP, false, mode, &n3, NULL);
        ASSERT(three_agree(ref, n1, got, n2, interp, n3));
        /* kept: the product runs (its bias as its epilogue) and its output is copied out as
         * (N,O,OH,OW); fused, only that copy is gone and the product runs inside the pooling
         * (with BLAS it runs on its own either way) */
        ASSERT_EQ(mk.kernels - mc.kernels, loom__use_own_gemm() ? 2 : 1);
    }
}

/* A convolution (48 output channels: its weight gradient runs by its transpose), 2 x 2 max pooling
 * and a ReLU; the gradients of the input, the weights and the bias. Fused, the fold makes the
 * pool gradient a run of columns at a time from the codes and computes the weight gradient and
 * the bias's sum from each run (H = 13: 6 x 11 x 11 = 726 positions, a span of 576 and a ragged
 * one, planes straddling them, each plane's 25 windows made at once from a table; H = 24: planes
 * of 22 x 22 and 121 windows, made by rows, a run beginning and ending inside a plane); kept (the
 * gradient of the convolution's output an output too), the pool gradient is written whole and
 * each reader runs on its own. The convolution is loom_conv2d's own composition, pooled before
 * its permute (as loom_pool_max does it), so that its output's gradient is the pool gradient's.
 * Returns the three gradients. */
static void *run_conv_back(loom_backend be, int64_t H, bool keep, bool bias, size_t *bytes,
                           loom_metrics *m) {
    enum { N = 6, C = 4, HMAX = 24, O = 48, KS = 3 };
    int64_t W = H, OH = H - KS + 1, PP = (OH / 2) * (OH / 2);
    int64_t sx[4] = {N, C, H, W}, sw[4] = {O, C, KS, KS}, sb[1] = {O}, sv[2] = {PP, 3};
    int64_t r2[2] = {O * N, PP}, w2[2] = {O, C * KS * KS}, c2[2] = {C * KS * KS, N * OH * OH},
            b2[2] = {O, 1};
    int64_t y4[4] = {O, N, OH, OH};
    static float x[N * C * HMAX * HMAX], w[O * C * KS * KS], b[O], v[HMAX * HMAX / 4 * 3];
    test_fill(x, N * C * H * W, 70, -1, 1);
    test_fill(w, O * C * KS * KS, 71, -0.5, 0.5);
    test_fill(b, O, 72, -0.5, 0.5);
    test_fill(v, PP * 3, 73, -1, 1);
    loom_graph *g = loom_graph_new(NULL);
    loom_graph_set_backend(g, be);
    loom_tensor *tx = loom_input(g, LOOM_F32, 4, sx, x), *tw = loom_input(g, LOOM_F32, 4, sw, w);
    loom_tensor *tb = bias ? loom_input(g, LOOM_F32, 1, sb, b) : NULL;
    loom_requires_grad(tx), loom_requires_grad(tw);
    if (tb)
        loom_requires_grad(tb);
    loom_tensor *cols = loom_unfold(g, tx, (loom_window){KS, KS, 1, 1, 0, 0});
    loom_tensor *y = loom_matmul(g, loom_reshape(g, tw, 2, w2), loom_reshape(g, cols, 2, c2));
    if (tb)
        y = loom_add(g, y, loom_reshape(g, tb, 2, b2));
    y = loom_reshape(g, y, 4, y4);
    loom_tensor *r = loom_relu(g, loom_pool_max(g, y, (loom_window){2, 2, 2, 2, 0, 0}));
    loom_tensor *flat = loom_reshape(g, r, 2, r2);
    loom_tensor *loss = loom_sum_all(g, loom_matmul(g, flat, loom_input(g, LOOM_F32, 2, sv, v)));
    loom_tensor *wrt[4] = {tx, tw, y, tb}, *gr[4] = {NULL, NULL, NULL, NULL};
    loom_grads(g, loss, bias ? 4 : 3, wrt, gr);
    /* the gradients, the loss (its product reads the ReLU, which the pooling then writes), and
     * in the kept run the pool gradient, not compared */
    loom_tensor *t[5] = {gr[0], gr[1], gr[3], loss, gr[2]};
    size_t count[5] = {(size_t)(N * C * H * W), O * C * KS * KS, O, 1, (size_t)(O * N * OH * OH)};
    int n = 4;
    if (!bias)
        t[2] = t[3], t[3] = t[4], count[2] = count[3], count[3] = count[4], n = 3;
    void *out = outputs_of(g, n + keep, t, count, bytes, m);
    if (out && keep)
        *bytes -= sizeof(float) * count[n];
    return out;
}

TEST(a_fold_computes_its_convolutions_backward_bitwise) {
    for (int q = 0; q < 4; q++) {
        int64_t H = q < 2 ? 13 : 24;
        bool bias = q % 2;
        size_t n1 = 0, n2 = 0, n3 = 0;
        loom_metrics mk, mc;
        void *ref = run_conv_back(LOOM_BACKEND_CPU, H, true, bias, &n1, &mk);
        void *got = run_conv_back(LOOM_BACKEND_CPU, H, false, bias, &n2, &mc);
        void *interp = run_conv_back(LOOM_BACKEND_INTERP, H, false, bias, &n3, NULL);
        ASSERT(three_agree(ref, n1, got, n2, interp, n3));
        /* fused, the pool gradient, the weight gradient's product and the bias's sum run in the
         * fold (with BLAS each runs on its own either way) */
        ASSERT_EQ(mk.kernels - mc.kernels, loom__use_own_gemm() ? 2 + bias : 0);
    }
}

/* A first convolution (2 input channels, 7 output channels: a last row alone) with bias, 2 x 2
 * max pooling and a ReLU; the weights' and the bias's gradients and the loss. Fused, the pool
 * gradient's sinks (the bias's sum, the weights' product on the dot-product path) take its
 * windows by their argmax places and its rows are never made; kept (the convolution output's
 * gradient an output too), the rows are written whole and the two run on them. */
static void *run_window_sinks(loom_backend be, bool keep, size_t *bytes, loom_metrics *m) {
    enum { N = 4, C = 2, H = 28, O = 7, KS = 3, OH = 26 };
    int64_t sx[4] = {N, C, H, H}, sw[4] = {O, C, KS, KS}, sb[1] = {O}, sv[2] = {169, 3};
    int64_t r2[2] = {O * N, 169}, w2[2] = {O, C * KS * KS}, c2[2] = {C * KS * KS, N * OH * OH};
    int64_t b2[2] = {O, 1}, y4[4] = {O, N, OH, OH};
    static float x[N * C * H * H], w[O * C * KS * KS], b[O], v[169 * 3];
    test_fill(x, N * C * H * H, 80, -1, 1);
    test_fill(w, O * C * KS * KS, 81, -0.5, 0.5);
    test_fill(b, O, 82, -0.5, 0.5);
    test_fill(v, 169 * 3, 83, -1, 1);
    loom_graph *g = loom_graph_new(NULL);
    loom_graph_set_backend(g, be);
    loom_tensor *tw = loom_input(g, LOOM_F32, 4, sw, w), *tb = loom_input(g, LOOM_F32, 1, sb, b);
    loom_requires_grad(tw), loom_requires_grad(tb);
    loom_tensor *cols =
        loom_unfold(g, loom_input(g, LOOM_F32, 4, sx, x), (loom_window){KS, KS, 1, 1, 0, 0});
    loom_tensor *y = loom_matmul(g, loom_reshape(g, tw, 2, w2), loom_reshape(g, cols, 2, c2));
    y = loom_reshape(g, loom_add(g, y, loom_reshape(g, tb, 2, b2)), 4, y4);
    loom_tensor *r = loom_relu(g, loom_pool_max(g, y, (loom_window){2, 2, 2, 2, 0, 0}));
    loom_tensor *loss = loom_sum_all(
        g, loom_matmul(g, loom_reshape(g, r, 2, r2), loom_input(g, LOOM_F32, 2, sv, v)));
    loom_tensor *wrt[3] = {tw, tb, y}, *gr[3] = {NULL, NULL, NULL};
    loom_grads(g, loss, keep ? 3 : 2, wrt, gr);
    loom_tensor *t[4] = {gr[0], gr[1], loss, gr[2]};
    size_t count[4] = {O * C * KS * KS, O, 1, O * N * OH * OH};
    void *out = outputs_of(g, keep ? 4 : 3, t, count, bytes, m);
    if (out && keep) /* (the kept gradient is not compared) */
        *bytes -= sizeof(float) * count[3];
    return out;
}

TEST(pool_gradient_sinks_take_its_windows) {
    size_t n1 = 0, n2 = 0, n3 = 0;
    loom_metrics mk, mc;
    float *ref = run_window_sinks(LOOM_BACKEND_CPU, true, &n1, &mk);
    float *got = run_window_sinks(LOOM_BACKEND_CPU, false, &n2, &mc);
    float *interp = run_window_sinks(LOOM_BACKEND_INTERP, false, &n3, NULL);
    ASSERT(ref && got && interp && n1 == n2 && n1 == n3);
    ASSERT(same_bits(interp, got, n1, LOOM_F32)); /* the same kernel in both backends */
    /* the same products in another order: within a few ulps of the largest output
     * (bias 7 and weight 126 values: sums over 676 windows) */
    double err = 0, scale = 0;
    for (size_t i = 0; i < n1 / sizeof(float); i++) {
        err = fmax(err, fabs((double)ref[i] - got[i]));
        scale = fmax(scale, fabs(ref[i]));
    }
    ASSERT(scale > 1 && err <= 1e-6 * scale);
    /* fused, the bias's sum and the weights' product run in the pool gradient (with BLAS the
     * rows are written and each runs on its own either way) */
    ASSERT_EQ(mk.kernels - mc.kernels, loom__use_own_gemm() ? 2 : 0);
    free(ref);
    free(got);
    free(interp);
}

/* 20 training steps of a recipe with the given backend; the parameters into *out (malloc'd). */
static float *train(const char *recipe, loom_backend be, loom_metrics *m) {
    static loom_dataset *d;
    if (!d && loom_dataset_fmnist(NULL, "train", &d))
        return NULL;
    loom_model *model = loom_model_new();
    bool flat;
    loom_sequential *net = loom_sequential_new(model, loom_recipe(recipe, &flat));
    loom_sequential_init(net, 1);
    loom_optim *o = loom_sgd_new(model, &(loom_optim_config){.lr = 0.05, .momentum = 0.9});
    loom_graph *g = loom_graph_new(model);
    loom_graph_set_backend(g, be);
    loom_loader *l = loom_loader_new(d, &(loom_loader_config){.batch_size = 64, .seed = 4});
    loom_batch b;
    for (int s = 0; s < 20 && loom_loader_next(l, &b); s++) {
        loom_graph_reset(g);
        int64_t f[2] = {b.n, 784};
        loom_tensor *x = flat ? loom_input(g, LOOM_F32, 2, f, b.x)
                              : loom_input(g, LOOM_F32, b.ndim, b.shape, b.x);
        loom_tensor *y = loom_input(g, LOOM_I32, 1, &b.n, b.y);
        loom_backward(g, loom_cross_entropy(g, loom_sequential_forward(g, net, x), y));
        loom_optim_step(g, o);
        if (loom_graph_run(g))
            return NULL;
    }
    loom_graph_metrics(g, m);
    int64_t n = loom_model_numel(model);
    float *out = malloc(sizeof(float) * (size_t)n);
    memcpy(out, loom_param_data(loom_model_at(model, 0)), sizeof(float) * (size_t)n);
    loom_loader_free(l);
    loom_graph_free(g);
    loom_optim_free(o);
    loom_sequential_free(net);
    loom_model_free(model);
    return out;
}

static void steps_agree(const char *recipe, int64_t n) {
    loom_metrics mi, mc;
    float *ref = train(recipe, LOOM_BACKEND_INTERP, &mi),
          *got = train(recipe, LOOM_BACKEND_CPU, &mc);
    ASSERT(ref && got);
    double err = 0, scale = 0;
    for (int64_t i = 0; i < n; i++) {
        err = fmax(err, fabs((double)ref[i] - got[i]));
        scale = fmax(scale, fabs(ref[i]));
    }
    fprintf(stderr,
            "%s: 20 steps compiled vs interpreted: max difference %.3g (%s), %lld ops "
            "fused, %lld kernels per step (interpreted: %lld)\n",
            recipe, err / scale,
            memcmp(ref, got, sizeof(float) * (size_t)n) ? "not bitwise" : "bitwise",
            (long long)mc.fused_ops, (long long)mc.kernels, (long long)mi.kernels);
    ASSERT(err / scale <= 1e-6);
    ASSERT(mc.fused_ops > 0 && mc.kernels < mi.kernels);
    free(ref);
    free(got);
}

TEST(training_steps_agree_with_the_interpreter) {
    steps_agree("fmnist-mlp", 269322);
    steps_agree("fmnist-cnn", 225034);
}

static int count_entries(const char *dir, const char *suffix, char *last, size_t size) {
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d))) {
        size_t l = strlen(e->d_name), s = strlen(suffix);
        if (l > s && !strcmp(e->d_name + l - s, suffix)) {
            n++;
            snprintf(last, size, "%s/%s", dir, e->d_name);
        }
    }
    if (d)
        closedir(d);
    return n;
}

TEST(disk_cache_is_reused_and_repaired) {
    /* a fresh cache of its own: it damages every entry there, which other tests' processes
     * sharing the suite's cache could be loading */
    char cache[512], dir[600], entry[1200];
    const char *shared = getenv("XDG_CACHE_HOME");
    char *was = shared ? strdup(shared) : NULL;
    test_tmp(cache, sizeof cache, "kernel-cache.XXXXXX");
    ASSERT(mkdtemp(cache) != NULL);
    setenv("XDG_CACHE_HOME", cache, 1);
    snprintf(dir, sizeof dir, "%s/loom", cache);
    size_t n;
    loom_metrics m;
    free(run_op("DIV", LOOM_F32, LOOM_BACKEND_CPU, &n, &m)); /* built or found */
    void *first = run_op("MUL", LOOM_F64, LOOM_BACKEND_CPU, &n, &m);
    void *again = run_op("MUL", LOOM_F64, LOOM_BACKEND_CPU, &n, &m); /* a new graph */
    ASSERT_EQ(m.compiles, 0);
    ASSERT_EQ(m.disk_hits, 1);
    ASSERT(count_entries(dir, ".so", entry, sizeof entry) > 0);
    char key[1200]; /* truncate every entry: each must be rebuilt */
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d)))
        if (strstr(e->d_name, ".so")) {
            snprintf(key, sizeof key, "%s/%s", dir, e->d_name);
            ASSERT(truncate(key, 100) == 0);
        }
    if (d)
        closedir(d);
    void *rebuilt = run_op("MUL", LOOM_F64, LOOM_BACKEND_CPU, &n, &m);
    ASSERT_EQ(m.compiles, 1);
    ASSERT(rebuilt && !memcmp(rebuilt, first, n));
    ASSERT(!memcmp(again, first, n));
    free(first), free(again), free(rebuilt);
    if (was)
        setenv("XDG_CACHE_HOME", was, 1);
    else
        unsetenv("XDG_CACHE_HOME");
    free(was);
}

/* w := 2 * w^T + 1 written in place: the transposed read must not see elements already written. */
static void transpose_update(loom_backend be, float *out) {
    loom_model *m = loom_model_new();
    int64_t s[2] = {5, 5};
    loom_param *p = loom_model_add(m, "w", 2, s);
    for (int i = 0; i < 25; i++)
        loom_param_data(p)[i] = (float)i;
    loom_graph *g = loom_graph_new(m);
    loom_graph_set_backend(g, be);
    loom_tensor *w = loom_parameter(g, p);
    loom_tensor *two = loom_scalar(g, 2.0, LOOM_F32), *one = loom_scalar(g, 1.0, LOOM_F32);
    loom_assign(g, p, loom_add(g, loom_mul(g, loom_transpose(g, w), two), one));
    if (loom_graph_run(g) == LOOM_OK)
        memcpy(out, loom_param_data(p), sizeof(float) * 25);
    loom_graph_free(g);
    loom_model_free(m);
}

TEST(in_place_updates_read_before_they_write) {
    float interp[25] = {0}, cpu[25] = {0};
    transpose_update(LOOM_BACKEND_INTERP, interp);
    transpose_update(LOOM_BACKEND_CPU, cpu);
    for (int r = 0; r < 5; r++)
        for (int c = 0; c < 5; c++) {
            ASSERT(interp[r * 5 + c] == 2.0f * (float)(c * 5 + r) + 1.0f);
            ASSERT(cpu[r * 5 + c] == interp[r * 5 + c]);
        }
}

/* SGD with momentum as the optimizer writes it: v := 0.9 v + g, w := w - 0.1 v, both in place.
 * The momentum is computed and stored by the update's kernel (one kernel, two slabs written);
 * with `transposed` the update also reads the old momentum transposed, which the kernel storing
 * the new one in place could overwrite first, so they stay apart. Returns the kernels a step. */
static int64_t momentum_update(loom_backend be, bool transposed, float *w_out, float *v_out) {
    enum { R = 24, C = 24 };
    loom_model *m = loom_model_new();
    int64_t s[2] = {R, C};
    loom_param *pw = loom_model_add(m, "w", 2, s), *pv = loom_model_add(m, "v", 2, s);
    static float g[R * C];
    for (int i = 0; i < R * C; i++) {
        loom_param_data(pw)[i] = (float)test_rand(70, (uint64_t)i, -1, 1);
        loom_param_data(pv)[i] = (float)test_rand(71, (uint64_t)i, -1, 1);
        g[i] = (float)test_rand(72, (uint64_t)i, -1, 1);
    }
    loom_graph *gr = loom_graph_new(m);
    loom_graph_set_backend(gr, be);
    loom_tensor *w = loom_parameter(gr, pw), *v = loom_parameter(gr, pv);
    loom_tensor *v2 = loom_add(gr, loom_mul(gr, v, loom_scalar(gr, 0.9, LOOM_F32)),
                               loom_input(gr, LOOM_F32, 2, s, g));
    loom_tensor *w2 = loom_sub(gr, w, loom_mul(gr, v2, loom_scalar(gr, 0.1, LOOM_F32)));
    if (transposed)
        w2 = loom_add(gr, w2, loom_transpose(gr, v));
    loom_assign(gr, pv, v2);
    loom_assign(gr, pw, w2);
    loom_metrics mt = {0};
    if (loom_graph_run(gr) == LOOM_OK) {
        memcpy(w_out, loom_param_data(pw), sizeof(float) * R * C);
        memcpy(v_out, loom_param_data(pv), sizeof(float) * R * C);
    }
    loom_graph_metrics(gr, &mt);
    loom_graph_free(gr);
    loom_model_free(m);
    return mt.kernels;
}

/* Three AdamW steps (weight decay on the matrix only, clipping) of a two-parameter model through
 * loom_optim: w, the two moments and the loss; returns the kernels of the last step. */
static int64_t adamw_steps(loom_backend be, float *out) {
    enum { R = 9, C = 40 };
    loom_model *m = loom_model_new();
    int64_t sw[2] = {R, C}, sb[1] = {C}, sx[2] = {3, R};
    loom_param *pw = loom_model_add(m, "w", 2, sw), *pb = loom_model_add(m, "b", 1, sb);
    static float x[3 * R];
    for (int i = 0; i < R * C; i++)
        loom_param_data(pw)[i] = (float)test_rand(80, (uint64_t)i, -1, 1);
    for (int i = 0; i < C; i++)
        loom_param_data(pb)[i] = (float)test_rand(81, (uint64_t)i, -1, 1);
    for (int i = 0; i < 3 * R; i++)
        x[i] = (float)test_rand(82, (uint64_t)i, -1, 1);
    loom_optim_config c = {.lr = 0.05, .beta2 = 0.99, .clip_norm = 0.5};
    loom_optim *o = loom_adamw_new(m, &c);
    loom_optim_decay_matrices_only(o, 0.1);
    loom_metrics mt = {0};
    float loss = 0;
    for (int step = 0; step < 3; step++) {
        loom_graph *g = loom_graph_new(m);
        loom_graph_set_backend(g, be);
        loom_tensor *y =
            loom_add(g, loom_matmul(g, loom_input(g, LOOM_F32, 2, sx, x), loom_parameter(g, pw)),
                     loom_parameter(g, pb));
        loom_tensor *l = loom_mean_all(g, loom_mul(g, loom_tanh(g, y), y));
        loom_output(l);
        loom_backward(g, l);
        loom_optim_step(g, o);
        if (loom_graph_run(g) == LOOM_OK)
            loss = *(const float *)loom_tensor_data(l);
        loom_graph_metrics(g, &mt);
        loom_graph_free(g);
    }
    memcpy(out, loom_param_data(pw), sizeof(float) * R * C);
    out[R * C] = loss;
    loom_optim_free(o);
    loom_model_free(m);
    return mt.kernels;
}

/* An AdamW update computes and stores both moments in the kernel that updates the parameter
 * (several members stored in their slabs), bitwise as the interpreter does. */
TEST(adamw_stores_both_moments_in_its_update_kernel) {
    static float ref[9 * 40 + 1], got[9 * 40 + 1];
    int64_t ki = adamw_steps(LOOM_BACKEND_INTERP, ref);
    int64_t kc = adamw_steps(LOOM_BACKEND_CPU, got);
    ASSERT(same_bits(ref, got, sizeof ref, LOOM_F32));
    ASSERT(ref[0] != 0 && ref[9 * 40] == ref[9 * 40]);
    /* each parameter's update alone would be a dozen interpreted kernels; compiled, the update
     * of each is one kernel, its clipped gradient computed in it */
    fprintf(stderr, "adamw: %lld kernels a step compiled, %lld interpreted\n", (long long)kc,
            (long long)ki);
    ASSERT(kc * 2 < ki);
}

/* c = x s read three times by y = c c + c (all of y's kernel) and, with `summed`, also by a
 * sum: y and (the sum), their kernels' count. */
static int64_t shared_value(loom_backend be, bool summed, float *y_out, float *s_out) {
    enum { R = 7, C = 33 };
    static float x[R * C], sc = 1.7f;
    for (int i = 0; i < R * C; i++)
        x[i] = (float)test_rand(90, (uint64_t)i, -2, 2);
    int64_t sx[2] = {R, C};
    loom_graph *g = loom_graph_new(NULL);
    loom_graph_set_backend(g, be);
    loom_tensor *c =
        loom_mul(g, loom_input(g, LOOM_F32, 2, sx, x), loom_input(g, LOOM_F32, 0, NULL, &sc));
    loom_tensor *y = loom_add(g, loom_mul(g, c, c), c), *s = summed ? loom_sum(g, c, 1) : NULL;
    loom_output(y);
    if (s)
        loom_output(s);
    loom_metrics mt = {0};
    if (loom_graph_run(g) == LOOM_OK) {
        memcpy(y_out, loom_tensor_data(y), sizeof(float) * R * C);
        if (s)
            memcpy(s_out, loom_tensor_data(s), sizeof(float) * R);
    }
    loom_graph_metrics(g, &mt);
    loom_graph_free(g);
    return mt.kernels;
}

/* A value that several members of one kernel read (an update's clipped gradient, read by both
 * moments) is computed once inside that kernel; one that another kernel reads too keeps its own
 * kernel. Bitwise the interpreter's either way. */
TEST(a_value_read_twice_in_one_kernel_is_computed_there_bitwise) {
    for (int summed = 0; summed < 2; summed++) {
        static float yi[7 * 33], yc[7 * 33], si[7], sc[7];
        memset(yc, 0, sizeof yc), memset(sc, 0, sizeof sc);
        int64_t ki = shared_value(LOOM_BACKEND_INTERP, summed, yi, si);
        int64_t kc = shared_value(LOOM_BACKEND_CPU, summed, yc, sc);
        ASSERT(same_bits(yi, yc, sizeof yi, LOOM_F32));
        ASSERT(!summed || same_bits(si, sc, sizeof si, LOOM_F32));
        /* interpreted: mul, mul, add (and the sum); compiled: y's kernel alone, or c's, y's and
         * the sum's */
        ASSERT_EQ(ki, summed ? 4 : 3);
        ASSERT_EQ(kc, summed ? 3 : 1);
    }
}

/* The attention's gradient from the probabilities its forward kept (through loom_grad) and from
 * probabilities made again (its third operand not an ATTENTION node, as past the most bytes it
 * keeps): bitwise the same, causal and not, float and double. */
TEST(attention_gradient_is_the_same_kept_or_made_again) {
    enum { B = 2, T = 37, H = 2, D = 12, N = B * T * 3 * H * D, NY = B * T * H * D };
    for (int c = 0; c < 4; c++) {
        bool causal = c & 1;
        loom_dtype dt = c & 2 ? LOOM_F64 : LOOM_F32;
        size_t es = dt == LOOM_F64 ? 8 : 4;
        static double x[N], w[NY];
        for (int i = 0; i < N; i++)
            x[i] = test_rand(95, (uint64_t)i, -2, 2);
        for (int i = 0; i < NY; i++)
            w[i] = test_rand(96, (uint64_t)i, -1, 1);
        static float xf[N], wf[NY];
        for (int i = 0; i < N; i++)
            xf[i] = (float)x[i];
        for (int i = 0; i < NY; i++)
            wf[i] = (float)w[i];
        int64_t sx[5] = {B, T, 3, H, D}, sy[4] = {B, T, H, D};
        loom_graph *g = loom_graph_new(NULL);
        loom_tensor *in = loom_input(g, dt, 5, sx, dt == LOOM_F64 ? (void *)x : (void *)xf);
        loom_tensor *gy = loom_input(g, dt, 4, sy, dt == LOOM_F64 ? (void *)w : (void *)wf);
        loom_requires_grad(in);
        loom_tensor *y = loom_attention(g, in, causal);
        loom_tensor *kept = loom_grad(g, loom_sum_all(g, loom_mul(g, y, gy)), in);
        loom_tensor *again = loom__attention_grad(g, in, gy, in, causal);
        loom_output(kept), loom_output(again);
        ASSERT_EQ(loom_graph_run(g), LOOM_OK);
        ASSERT(same_bits(loom_tensor_data(kept), loom_tensor_data(again), es * N, dt));
        double nz = 0;
        for (int i = 0; i < N; i++)
            nz += fabs(dt == LOOM_F64 ? ((const double *)loom_tensor_data(again))[i]
                                      : ((const float *)loom_tensor_data(again))[i]);
        ASSERT(nz > 0);
        loom_graph_free(g);
    }
}

TEST(an_update_stores_its_momentum_too) {
    for (int transposed = 0; transposed < 2; transposed++) {
        static float wi[576], vi[576], wc[576], vc[576];
        memset(wc, 0, sizeof wc);
        int64_t ki = momentum_update(LOOM_BACKEND_INTERP, transposed, wi, vi);
        int64_t kc = momentum_update(LOOM_BACKEND_CPU, transposed, wc, vc);
        ASSERT(same_bits(wi, wc, sizeof wi, LOOM_F32) && same_bits(vi, vc, sizeof vi, LOOM_F32));
        /* interpreted: mul, add, mul, sub (transposed: an add and w's store, not in place);
         * compiled: one kernel, or the momentum's, the update's and the store */
        ASSERT_EQ(ki, transposed ? 6 : 4);
        ASSERT_EQ(kc, transposed ? 3 : 1);
    }
}

/* GELU of a product and into another, z = gelu(x w) v, as a GPT's MLP: 37 rows (ragged tiles),
 * 300 columns (two column blocks); x holds a NaN, an infinity and -0. With `grad`, the loss
 * sum(z c) and its gradient for w (so loom_gelu makes its derivative beside GELU); returns z and
 * the gradient, else z and its sum. */
static void *run_gelu(loom_backend be, int grad, size_t *bytes, loom_metrics *m) {
    enum { M = 37, K = 50, N = 300, O = 20 };
    static float x[M * K], w[K * N], v[N * O], c[M * O];
    test_fill(x, M * K, 80, -2, 2);
    test_fill(w, K * N, 81, -0.5, 0.5);
    test_fill(v, N * O, 82, -0.5, 0.5);
    test_fill(c, M * O, 83, -1, 1);
    x[3] = NAN, x[K + 4] = INFINITY, x[2 * K + 5] = -0.0f;
    loom_graph *g = loom_graph_new(NULL);
    loom_graph_set_backend(g, be);
    int64_t sx[2] = {M, K}, sw[2] = {K, N}, sv[2] = {N, O}, sz[2] = {M, O};
    loom_tensor *tw = loom_input(g, LOOM_F32, 2, sw, w);
    if (grad)
        loom_requires_grad(tw);
    loom_tensor *y = loom_gelu(g, loom_matmul(g, loom_input(g, LOOM_F32, 2, sx, x), tw));
    loom_tensor *z = loom_matmul(g, y, loom_input(g, LOOM_F32, 2, sv, v));
    if (!grad)
        return two_outputs(g, z, M * O, loom_sum_all(g, z), 1, bytes, m);
    loom_tensor *gw =
        loom_grad(g, loom_sum_all(g, loom_mul(g, z, loom_input(g, LOOM_F32, 2, sz, c))), tw);
    return two_outputs(g, z, M * O, gw, K * N, bytes, m);
}

/* GELU and the derivative loom_gelu makes beside it run in one kernel, GELU stored too (the first
 * product's epilogue, where loom's products run), which the backward reads instead of GELU's
 * input: the same bits as the interpreter's GELU and dy times its derivative, in one kernel
 * fewer than GELU's kernel and the derivative's apart. */
TEST(gelu_is_computed_beside_its_derivative_bitwise) {
    loom_metrics mi, mc;
    for (int grad = 0; grad < 2; grad++) {
        ASSERT(compiled_as_interpreted(run_gelu, grad, &mi, &mc));
        /* interpreted: the two products, GELU and the sum (with grad: the derivative, the loss's
         * mul, the ones, dy times the derivative and the backward's two products); compiled with
         * loom's products: each product with its epilogue (GELU and the derivative in the
         * first's, GELU stored too) and the sum (with grad: the loss's kernels, the backward's
         * products, dy times the derivative in the first's epilogue). GELU's kernel apart from
         * the derivative's would be one more. */
        ASSERT_EQ(mi.kernels, grad ? 9 : 4);
        ASSERT_EQ(mc.kernels, own_products() ? (grad ? 6 : 3) : (grad ? 8 : 4));
    }
}

/* ---- every fusion rule on shapes drawn at random ------------------------------------------------
 * Each case builds, from a seed, a model of random sizes (odd, 1, and the recipes' among them) on
 * which rules of the table (compile/fuse.c) fire; two steps of it run under the check executor,
 * which compares every value each kernel leaves whole with the reference interpreter's (bit for
 * bit; within its stated bound for a fold's or a sink's other order of sums). Every rule of the
 * table must name a case and fire in one of its runs: a rule added without a case fails here. */

/* An integer in [lo, hi] drawn from (seed, k). */
static int draw(uint64_t seed, uint64_t k, int lo, int hi) {
    return lo + (int)test_rand(1000 + seed, k, 0, hi - lo + 1 - 1e-9);
}

/* p := p - 0.05 (0.9 v + g), v := 0.9 v + g: an update with its momentum, as an optimizer's. */
static void momentum(loom_graph *g, loom_param *p, loom_param *v, loom_tensor *grad) {
    loom_tensor *v2 =
        loom_add(g, loom_mul(g, loom_parameter(g, v), loom_scalar(g, 0.9, LOOM_F32)), grad);
    loom_assign(g, v, v2);
    loom_assign(g, p,
                loom_sub(g, loom_parameter(g, p), loom_mul(g, v2, loom_scalar(g, 0.05, LOOM_F32))));
}

/* A parameter of the given shape with values in [-a, a) and its momentum (zero). */
static loom_param *param(loom_model *m, const char *name, int nd, const int64_t *shape, double a,
                         uint64_t stream, loom_param **v) {
    char vn[64];
    snprintf(vn, sizeof vn, "%s.v", name);
    loom_param *p = loom_model_add(m, name, nd, shape);
    *v = loom_model_add(m, vn, nd, shape);
    int64_t n = 1;
    for (int d = 0; d < nd; d++)
        n *= shape[d];
    test_fill(loom_param_data(p), n, stream, -a, a);
    return p;
}

enum { CASE_PARAMS = 8 };
typedef struct {
    loom_model *m;
    float *x;
    int32_t *labels;
    int np;
    loom_param *p[CASE_PARAMS], *v[CASE_PARAMS];
} rule_case;

/* The step of case c: cross-entropy of logits against the labels, every parameter updated. */
static void case_step(loom_graph *g, rule_case *c, loom_tensor *logits, int64_t rows) {
    loom_tensor *labels = loom_input(g, LOOM_I32, 1, (int64_t[1]){rows}, c->labels);
    loom_tensor *loss = loom_cross_entropy(g, logits, labels);
    loom_tensor *wrt[CASE_PARAMS], *gr[CASE_PARAMS];
    for (int i = 0; i < c->np; i++)
        wrt[i] = loom_parameter(g, c->p[i]);
    loom_grads(g, loss, c->np, wrt, gr);
    for (int i = 0; i < c->np; i++)
        momentum(g, c->p[i], c->v[i], gr[i]);
    loom_output(loss);
}

static loom_tensor *case_linear(loom_graph *g, rule_case *c, loom_tensor *x, int64_t in,
                                int64_t out, bool bias, uint64_t seed) {
    char name[32];
    snprintf(name, sizeof name, "w%d", c->np);
    int64_t sw[2] = {out, in}, sb[1] = {out};
    loom_param *w =
        param(c->m, name, 2, sw, 1 / sqrt((double)in), seed * 16 + (uint64_t)c->np, &c->v[c->np]);
    c->p[c->np++] = w;
    loom_param *b = NULL;
    if (bias) {
        snprintf(name, sizeof name, "b%d", c->np);
        b = param(c->m, name, 1, sb, 0.1, seed * 16 + (uint64_t)c->np, &c->v[c->np]);
        c->p[c->np++] = b;
    }
    return loom_linear(g, x, loom_parameter(g, w), b ? loom_parameter(g, b) : NULL);
}

/* An MLP: widths drawn (one of them the residual's), ReLU, tanh or GELU between, a residual. */
static loom_tensor *case_mlp(loom_graph *g, rule_case *c, uint64_t seed, int64_t *rows) {
    int64_t B = draw(seed, 0, 1, 70), I = draw(seed, 1, 1, 90), H = draw(seed, 2, 1, 90);
    int act = draw(seed, 3, 0, 2);
    if (seed == 0) /* the recipe's sizes */
        B = 64, I = 784, H = 256, act = 0;
    c->x = malloc(sizeof(float) * (size_t)(B * I));
    test_fill(c->x, B * I, seed, -1, 1);
    loom_tensor *x = loom_input(g, LOOM_F32, 2, (int64_t[2]){B, I}, c->x);
    loom_tensor *h = case_linear(g, c, x, I, H, true, seed);
    h = act == 0 ? loom_relu(g, h) : act == 1 ? loom_tanh(g, h) : loom_gelu(g, h);
    loom_tensor *r = loom_relu(g, case_linear(g, c, h, H, H, draw(seed, 4, 0, 1), seed));
    h = loom_add(g, h, r); /* a residual */
    *rows = B;
    return case_linear(g, c, h, H, 10, true, seed);
}

/* The input (N, C, H, W) drawn from seed, the weights and biases of two convolutions (O channels of
 * a k x k kernel, O2 of k2 x k2: c->p[0 .. 4)), and the first one of stride st and padding pad. */
static loom_tensor *case_convs(loom_graph *g, rule_case *c, uint64_t seed, const int64_t *nchw,
                               int64_t O, int k, int64_t O2, int k2, int st, int pad) {
    int64_t n = nchw[0] * nchw[1] * nchw[2] * nchw[3];
    const int64_t sw[4] = {O, nchw[1], k, k}, sw2[4] = {O2, O, k2, k2};
    c->x = malloc(sizeof(float) * (size_t)n);
    test_fill(c->x, n, seed, -1, 1);
    loom_tensor *x = loom_input(g, LOOM_F32, 4, nchw, c->x);
    for (int i = 0; i < 4; i++) {
        const int64_t *shape = i == 0 ? sw : i == 1 ? &O : i == 2 ? sw2 : &O2;
        char name[8] = {'c', (char)('0' + i), 0};
        c->p[c->np] =
            param(c->m, name, i % 2 ? 1 : 4, shape, 0.3, seed * 16 + (uint64_t)i, &c->v[c->np]);
        c->np++;
    }
    return loom_conv2d(g, x, loom_parameter(g, c->p[0]), loom_parameter(g, c->p[1]), st, pad);
}

/* A CNN: a convolution (channels, kernel, stride and padding drawn), ReLU, max pooling of a
 * window drawn (2x2 among them), a second convolution and pooling, a linear layer; seeds 0-4 the
 * recipe's sizes, 5-9 wider and odd planes, kernels of 3 x 3 and 5 x 5; from 10 on the second
 * convolution of stride 1 or 2. */
static loom_tensor *case_cnn(loom_graph *g, rule_case *c, uint64_t seed, int64_t *rows) {
    static const loom_window wins[] = {{2, 2, 2, 2, 0, 0},
                                       {3, 3, 2, 2, 1, 1},
                                       {2, 2, 1, 1, 0, 0},
                                       {3, 2, 1, 2, 1, 0},
                                       {5, 5, 3, 3, 2, 2}};
    int64_t N = draw(seed, 0, 1, 6), C = draw(seed, 1, 1, 3), H = draw(seed, 2, 6, 20);
    int64_t W = draw(seed, 3, 6, 20), O = draw(seed, 4, 1, 40), O2 = draw(seed, 5, 1, 24);
    int k = draw(seed, 6, 1, 5), st = draw(seed, 7, 1, 2), pad = draw(seed, 8, 0, k / 2);
    int k2 = draw(seed, 9, 1, 3);
    loom_window w1 = wins[draw(seed, 10, 0, 4)], w2 = wins[draw(seed, 11, 0, 4)];
    if (seed < 5) /* the recipe's sizes, where the fast kernels' conditions hold, each window */
        N = 8, C = 1, H = W = 28, O = 32, O2 = 64, k = 3, st = 1, pad = seed > 0, k2 = 3,
        w1 = w2 = wins[seed];
    if (seed >= 5 &&
        seed < 10) /* wider planes: 30 x 30 pooled 3x3 stride 2, 64 x 64 pooled
                    * 5x5 stride 3, odd 29 x 31 pooled 2x2, 36 x 40 pooled 2x2 (rows
                    * of 20 windows); a 5 x 5 kernel on 28 x 28 pooled 2x2 (pool-quad's) */
        N = 2, C = 1, O = 16, O2 = 8, st = 1, k2 = 3, k = seed == 9 ? 5 : 3, pad = seed != 9,
        H = (int64_t[]){30, 64, 29, 36, 28}[seed - 5],
        W = (int64_t[]){30, 64, 31, 40, 28}[seed - 5], w1 = wins[(int[]){1, 4, 0, 0, 0}[seed - 5]],
        w2 = wins[0];
    if (seed == 9) /* (16 images: the first weight gradient's long K takes the windows, two
                    * blocks of planes of them) */
        N = 16;
    if (seed == 10) /* cnn-stride2's layers, 3x3 kernels of stride 2, padded (rows over 32) */
        N = 4, C = 1, H = 28, W = 72, O = 16, O2 = 32, k = 3, st = 2, pad = 1, k2 = 3, w1 = wins[2];
    loom_tensor *y = case_convs(g, c, seed, (int64_t[4]){N, C, H, W}, O, k, O2, k2, st, pad);
    if (y && y->shape[2] >= w1.kh && y->shape[3] >= w1.kw && seed >= 5 && seed != 9 &&
        draw(seed, 13, 0, 1))
        y = loom_pool_max(g, loom_relu(g, y), w1);
    else if (y && y->shape[2] >= w1.kh && y->shape[3] >= w1.kw) /* as loom_sequential has it */
        y = loom_relu(g, loom_pool_max(g, y, w1));
    else
        y = loom_relu(g, y);
    if (y && y->shape[2] >= k2 && y->shape[3] >= k2) {
        /* (drawn seeds: sometimes of stride 2 and padded, its input gradient a strided fold) */
        int st2 = seed >= 10 ? (int)draw(seed, 14, 1, 2) : 1;
        int pad2 = seed >= 10 ? (int)draw(seed, 15, 0, k2 / 2) : 0;
        if (seed == 10)
            st2 = 2, pad2 = 1;
        y = loom_conv2d(g, y, loom_parameter(g, c->p[2]), loom_parameter(g, c->p[3]), st2, pad2);
        if (y->shape[2] >= w2.kh && y->shape[3] >= w2.kw && draw(seed, 12, 0, 3))
            y = loom_relu(g, loom_pool_max(g, y, w2));
    } else {
        c->np = 2; /* the second layer's parameters unused */
    }
    y = loom_flatten(g, y);
    *rows = N;
    return y ? case_linear(g, c, y, y->shape[1], 10, true, seed) : NULL;
}

/* A CNN of padded convolutions without pooling, the second of stride 2, as cnn-stride2: its input
 * gradient a fold cropped, whose (C,N) copy the first one's ReLU backward reads (fold-crop). Seed
 * 0 its layers (28 x 28 images, 3x3 kernels of stride 2 and padding 1), seed 1 rows of the
 * second's input over 64 places and a 5x5 kernel, seed 2 no ReLU between, the others drawn. */
static loom_tensor *case_strided(loom_graph *g, rule_case *c, uint64_t seed, int64_t *rows) {
    int64_t N = draw(seed, 0, 1, 6), C = draw(seed, 1, 1, 3), H = draw(seed, 2, 6, 30);
    int64_t W = draw(seed, 3, 6, 70), O = draw(seed, 4, 1, 24), O2 = draw(seed, 5, 1, 24);
    int k = draw(seed, 6, 1, 5), st = draw(seed, 7, 1, 2), pad = draw(seed, 8, 0, k / 2);
    int k2 = draw(seed, 9, 1, 5), pad2 = draw(seed, 10, 1, 1 + k2 / 2);
    if (seed == 0)
        N = 8, C = 1, H = W = 28, O = 32, O2 = 64, k = k2 = 3, st = 2, pad = pad2 = 1;
    if (seed == 1)
        N = 2, C = 2, H = 12, W = 90, O = 8, O2 = 16, k = 3, st = 1, pad = 1, k2 = 5, pad2 = 2;
    loom_tensor *y = case_convs(g, c, seed, (int64_t[4]){N, C, H, W}, O, k, O2, k2, st, pad);
    if (seed != 2) /* (seed 2: no ReLU between, the crop's copy read as it is) */
        y = loom_relu(g, y);
    if (y && y->shape[2] + 2 * pad2 >= k2 && y->shape[3] + 2 * pad2 >= k2)
        y = loom_relu(
            g, loom_conv2d(g, y, loom_parameter(g, c->p[2]), loom_parameter(g, c->p[3]), 2, pad2));
    else
        c->np = 2; /* the second layer's parameters unused */
    *rows = N;
    y = loom_flatten(g, y);
    return y ? case_linear(g, c, y, y->shape[1], 10, true, seed) : NULL;
}

/* A transformer block's MLP with LayerNorm (as the GPT's): widths drawn, LayerNorm with its
 * weight and bias before GELU and without them after a residual; sometimes the first over the
 * transposed activations (its rows strided, its weight as wide as the batch). */
static loom_tensor *case_norm(loom_graph *g, rule_case *c, uint64_t seed, int64_t *rows) {
    int64_t B = draw(seed, 0, 1, 40), I = draw(seed, 1, 1, 70), H = draw(seed, 2, 1, 150);
    bool across = draw(seed, 3, 0, 3) == 0;
    if (seed == 0) /* the GPT's sizes: 12 x 64 rows of 128 */
        B = 768, I = 128, H = 128, across = false;
    c->x = malloc(sizeof(float) * (size_t)(B * I));
    test_fill(c->x, B * I, seed, -1, 1);
    loom_tensor *x = loom_input(g, LOOM_F32, 2, (int64_t[2]){B, I}, c->x);
    loom_tensor *h = case_linear(g, c, x, I, H, true, seed);
    int64_t n = across ? B : H, sn[1] = {n};
    for (int i = 0; i < 2; i++) {
        char name[8] = {'n', (char)('0' + i), 0};
        c->p[c->np] = param(c->m, name, 1, sn, 1, seed * 16 + 8 + (uint64_t)i, &c->v[c->np]);
        c->np++;
    }
    loom_tensor *in = across ? loom_transpose(g, h) : h;
    in = loom_layer_norm(g, in, loom_parameter(g, c->p[c->np - 2]),
                         loom_parameter(g, c->p[c->np - 1]), 1e-5);
    h = loom_gelu(g, across ? loom_transpose(g, in) : in);
    h = loom_add(g, h, case_linear(g, c, h, H, H, draw(seed, 4, 0, 1), seed)); /* a residual */
    h = loom_layer_norm(g, h, NULL, NULL, 1e-5);
    *rows = B;
    return case_linear(g, c, h, H, 10, true, seed);
}

static const struct {
    const char *rule;
    loom_tensor *(*build)(loom_graph *g, rule_case *c, uint64_t seed, int64_t *rows);
} rule_cases[] = {
    {"elementwise", case_mlp},  {"epilogue", case_mlp},      {"product-act", case_mlp},
    {"fold-product", case_cnn}, {"pool-sinks", case_cnn},    {"pool-codes", case_cnn},
    {"pool-relu", case_cnn},    {"pool-conv", case_cnn},     {"conv-back", case_cnn},
    {"pool-quad", case_cnn},    {"fold-crop", case_strided}, {"lnorm-keep", case_norm},
};

/* Whether fusion rule `rule`'s forms run only on loom's own products and pooling rows (AVX-512;
 * fold-product and epilogue also on loom's AVX2 products): on other CPUs it may not fire, and
 * every other rule must. */
static bool own_gemm_rule(const char *rule) {
    if (!strcmp(rule, "fold-product") || !strcmp(rule, "epilogue"))
        return !loom__use_gemm256();
    static const char *const own[] = {"pool-sinks", "pool-conv",   "conv-back",
                                      "pool-quad",  "product-act", "fold-crop"};
    for (size_t q = 0; q < sizeof own / sizeof *own; q++)
        if (!strcmp(own[q], rule))
            return true;
    return false;
}

/* Two steps of case `build` from seed under the check executor; false (with a line) on a
 * difference or an error. */
static bool run_case(loom_tensor *(*build)(loom_graph *, rule_case *, uint64_t, int64_t *),
                     uint64_t seed) {
    rule_case c = {.m = loom_model_new()};
    loom_graph *g = loom_graph_new(c.m);
    int64_t rows = 0;
    loom_tensor *logits = build(g, &c, seed, &rows);
    c.labels = malloc(sizeof(int32_t) * (size_t)(rows ? rows : 1));
    for (int64_t i = 0; i < rows; i++)
        c.labels[i] = (int32_t)draw(seed, 100 + (uint64_t)i, 0, 9);
    if (logits)
        case_step(g, &c, logits, rows);
    bool ok = logits && loom_graph_run(g) == LOOM_OK && loom_graph_run(g) == LOOM_OK;
    if (!ok)
        fprintf(stderr, "seed %llu: %s\n", (unsigned long long)seed,
                loom_graph_error(g) ? loom_graph_error(g) : loom_last_error());
    loom_graph_free(g);
    loom_model_free(c.m);
    free(c.x), free(c.labels);
    return ok;
}

/* Runs seeds [0, seeds) of every case builder (only the one rule `rule` names, where not NULL)
 * under executor x, each builder once (rules may share one); fired[r]: what rule r fused in
 * them, *models: how many ran. Returns how many failed their check (each with a line). */
static int run_cases_under(const loom__executor *x, const char *rule, int seeds, int64_t *fired,
                           int *models) {
    enum { NCASES = sizeof rule_cases / sizeof *rule_cases };
    loom_tensor *(*only)(loom_graph *, rule_case *, uint64_t, int64_t *) = NULL;
    for (int q = 0; q < NCASES && rule; q++)
        if (!strcmp(rule_cases[q].rule, rule))
            only = rule_cases[q].build;
    int64_t before[LOOM_RULES_MAX];
    memcpy(before, loom__rule_fired, sizeof before);
    loom__set_executor(x);
    int bad = 0;
    *models = 0;
    for (int q = 0; q < NCASES; q++) {
        bool seen = false;
        for (int e = 0; e < q; e++)
            seen = seen || rule_cases[e].build == rule_cases[q].build;
        for (int s = 0; !seen && (!only || rule_cases[q].build == only) && s < seeds; s++)
            bad += !run_case(rule_cases[q].build, (uint64_t)s), ++*models;
    }
    loom__set_executor(NULL);
    for (int r = 0; r < loom__nrules; r++)
        fired[r] = loom__rule_fired[r] - before[r];
    return bad;
}

TEST(every_fusion_rule_matches_the_reference_on_random_shapes) {
    enum { NCASES = sizeof rule_cases / sizeof *rule_cases };
    int seeds = getenv("LOOM_TEST_QUICK") ? 8 : 16, models = 0;
    int64_t fired[LOOM_RULES_MAX];
    ASSERT_EQ(run_cases_under(&loom__check_executor, NULL, seeds, fired, &models), 0);
    for (int r = 0; r < loom__nrules; r++) {
        int q = 0;
        while (q < NCASES && strcmp(rule_cases[q].rule, loom__rules[r].name))
            q++;
        if (q == NCASES)
            FAILF("fusion rule %s has no case", loom__rules[r].name);
        fprintf(stderr, "rule %-12s fired %5lld times in %d random models\n", loom__rules[r].name,
                (long long)fired[r], models);
        if (fired[r] == 0 && (loom__use_own_gemm() || !own_gemm_rule(loom__rules[r].name)))
            FAILF("fusion rule %s never fired in %d random models", loom__rules[r].name, models);
    }
}

/* An executor for another target runs the kernel forms it implements and no other: the planner
 * asks it (loom__executor.forms). Here the check executor, which compares every kernel's values
 * with the reference interpreter's, takes every rule but one in turn: that rule never fires on
 * its cases, where it fired with all of them, and the programs planned without it still agree
 * with the reference; taking none, nothing is fused at all. */
/* A CNN's weight gradient in dt under executor x (NULL: the default): a K x K convolution of O
 * channels over N images of C x H x H, 2x2 max pooling and a ReLU, a linear layer to 3 outputs
 * summed (inputs drawn from streams seed, seed + 1, seed + 2); its first n elements into gw, and
 * its schedule's lines (LOOM_DUMP's). */
static char *conv_grad(loom_dtype dt, const loom__executor *x, int64_t N, int64_t C, int64_t H,
                       int64_t O, int64_t K, uint64_t seed, double *gw, int n) {
    int64_t P = O * ((H - K + 1) / 2) * ((H - K + 1) / 2);
    double *in = malloc(sizeof(double) * (size_t)(N * C * H * H));
    double *w = malloc(sizeof(double) * (size_t)(O * C * K * K));
    double *v = malloc(sizeof(double) * (size_t)(P * 3));
    fill(in, N * C * H * H, dt, seed, -1);
    fill(w, O * C * K * K, dt, seed + 1, -1);
    fill(v, P * 3, dt, seed + 2, -1);
    loom__set_executor(x);
    loom_graph *g = loom_graph_new(NULL);
    loom_tensor *tw = loom_input(g, dt, 4, (int64_t[4]){O, C, K, K}, w);
    loom_requires_grad(tw);
    loom_tensor *y =
        loom_conv2d(g, loom_input(g, dt, 4, (int64_t[4]){N, C, H, H}, in), tw, NULL, 1, 0);
    y = loom_relu(g, loom_pool_max(g, y, (loom_window){2, 2, 2, 2, 0, 0}));
    loom_tensor *loss = loom_sum_all(
        g, loom_matmul(g, loom_flatten(g, y), loom_input(g, dt, 2, (int64_t[2]){P, 3}, v)));
    loom_tensor *t = NULL;
    loom_grads(g, loss, 1, &tw, &t);
    loom_output(t);
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (loom_graph_run(g) == LOOM_OK && f) {
        const loom__program *p = loom__graph_last(g);
        for (int64_t e = 0; p && e < p->nexec; e++)
            loom__kernel_line(f, p, p->exec[e]);
        for (int i = 0; i < n; i++)
            gw[i] = dt == LOOM_F64 ? ((const double *)loom_tensor_data(t))[i]
                                   : ((const float *)loom_tensor_data(t))[i];
    }
    if (f)
        fclose(f);
    loom_graph_free(g);
    loom__set_executor(NULL);
    free(in), free(w), free(v);
    return text;
}

/* pool-quad's 5x5 form sums a weight gradient by windows, in another order than the rows' (its
 * bits differ): its distance from float64 is within 4x the rows' (the form left out). */
TEST(a_5x5_weight_gradient_by_windows_is_as_close_to_float64_as_by_rows) {
    if (!loom__use_own_gemm() || !loom__pool_codes_available())
        return; /* (the form runs on AVX-512 only) */
    static double g64[400], gq[400], gr[400];
    const char *none[] = {NULL};
    loom__executor rows = loom__check_executor;
    rows.forms = none;
    /* (16 images of 28 x 28, 16 channels: the first weight gradient's K long enough for a sink) */
    char *s64 = conv_grad(LOOM_F64, NULL, 16, 1, 28, 16, 5, 93, g64, 400),
         *sq = conv_grad(LOOM_F32, NULL, 16, 1, 28, 16, 5, 93, gq, 400),
         *sr = conv_grad(LOOM_F32, &rows, 16, 1, 28, 16, 5, 93, gr, 400);
    ASSERT(s64 && sq && sr);
    ASSERT(strstr(sq, "windows into")); /* the form ran */
    ASSERT(!strstr(sr, "windows into"));
    double dq = 0, dr = 0, n64 = 0;
    for (int i = 0; i < 400; i++)
        dq += (gq[i] - g64[i]) * (gq[i] - g64[i]), dr += (gr[i] - g64[i]) * (gr[i] - g64[i]),
            n64 += g64[i] * g64[i];
    printf(
        "5x5 weight gradient's distance from float64: by windows %.3g, by rows %.3g (norm %.3g)\n",
        sqrt(dq), sqrt(dr), sqrt(n64));
    ASSERT(sqrt(dq) <= 4 * sqrt(dr) + 1e-7 * sqrt(n64));
    ASSERT(sqrt(dq) <= 1e-5 * sqrt(n64));
    free(s64), free(sq), free(sr);
}

/* In float64 the library kernels with float32 forms only run their portable loops (products:
 * BLAS's dgemm), and the schedule says so on their lines; float32's lines never do. */
TEST(a_float64_step_names_the_kernels_it_runs_without_float32_forms) {
    double g64 = NAN, g32 = NAN;
    char *s64 = conv_grad(LOOM_F64, NULL, 4, 2, 12, 8, 3, 90, &g64, 1),
         *s32 = conv_grad(LOOM_F32, NULL, 4, 2, 12, 8, 3, 90, &g32, 1);
    ASSERT(s64 && s32);
    ASSERT(strstr(s64, "MATMUL") && strstr(s64, "float64: BLAS's dgemm"));
    ASSERT(strstr(s64, "POOLMAX") && strstr(s64, "POOLGRAD") &&
           strstr(s64, "float64: portable loops"));
    for (char *l = s64, *end; *l; l = end + 1) { /* every such kernel's own line */
        end = strchr(l, '\n');
        *end = 0;
        char op[32] = "";
        sscanf(l, "node %*d %31s", op);
        bool own = !strcmp(op, "MATMUL") || !strcmp(op, "POOLMAX") || !strcmp(op, "POOLGRAD") ||
                   !strcmp(op, "FOLD") || !strcmp(op, "UNFOLD");
        if (own && strstr(l, "interpreted") && !strstr(l, "float64: "))
            FAILF("a float64 kernel's line without its fallback: %s", l);
    }
    ASSERT(!strstr(s32, "float64"));
    ASSERT(fabs(g64 - g32) <= 1e-4 * (1 + fabs(g64))); /* the same step */
    free(s64), free(s32);
}

TEST(an_executor_is_planned_only_the_kernel_forms_it_runs) {
    int seeds = getenv("LOOM_TEST_QUICK") ? 2 : 4, models = 0;
    const char *forms[LOOM_RULES_MAX + 1];
    int64_t fired[LOOM_RULES_MAX];
    loom__executor x = loom__check_executor;
    for (int out = -1; out < loom__nrules; out++) { /* -1: all of them */
        int k = 0;
        for (int r = 0; r < loom__nrules; r++)
            if (r != out)
                forms[k++] = loom__rules[r].name;
        forms[k] = NULL;
        x.forms = forms;
        const char *rule = out < 0 ? NULL : loom__rules[out].name;
        ASSERT_EQ(run_cases_under(&x, rule, seeds, fired, &models), 0);
        for (int r = 0; r < loom__nrules && out < 0; r++)
            if (fired[r] == 0 && (loom__use_own_gemm() || !own_gemm_rule(loom__rules[r].name)))
                FAILF("rule %s did not fire in seeds 0-%d of its case", loom__rules[r].name,
                      seeds - 1);
        if (out >= 0 && fired[out] != 0)
            FAILF("rule %s fired %lld times for an executor that does not run it", rule,
                  (long long)fired[out]);
    }
    forms[0] = NULL; /* no kernel form at all */
    ASSERT_EQ(run_cases_under(&x, NULL, seeds, fired, &models), 0);
    for (int r = 0; r < loom__nrules; r++)
        ASSERT_EQ(fired[r], 0);
}

int main(void) {
    RUN(every_elementwise_op_compiles_bitwise);
    RUN(reductions_fuse_bitwise);
    RUN(epilogues_run_inside_library_kernels_bitwise);
    RUN(a_residual_is_added_in_the_products_registers_bitwise);
    RUN(products_sum_their_columns_as_they_store_bitwise);
    RUN(epilogue_rows_go_into_sinks_bitwise);
    RUN(a_sum_takes_rows_others_read_too);
    RUN(pooling_computes_its_convolution_bitwise);
    RUN(a_fold_computes_its_convolutions_backward_bitwise);
    RUN(pool_gradient_sinks_take_its_windows);
    RUN(an_update_stores_its_momentum_too);
    RUN(gelu_is_computed_beside_its_derivative_bitwise);
    RUN(adamw_stores_both_moments_in_its_update_kernel);
    RUN(a_value_read_twice_in_one_kernel_is_computed_there_bitwise);
    RUN(attention_gradient_is_the_same_kept_or_made_again);
    RUN(training_steps_agree_with_the_interpreter);
    RUN(disk_cache_is_reused_and_repaired);
    RUN(in_place_updates_read_before_they_write);
    RUN(every_fusion_rule_matches_the_reference_on_random_shapes);
    RUN(an_executor_is_planned_only_the_kernel_forms_it_runs);
    RUN(a_float64_step_names_the_kernels_it_runs_without_float32_forms);
    RUN(a_5x5_weight_gradient_by_windows_is_as_close_to_float64_as_by_rows);
    return HARNESS_EXIT();
}
