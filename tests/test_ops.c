/*
 * test_ops.c - every op of the table, checked two ways.
 *   gradients: for each differentiable op (and each composition) a case builds
 *     loss = sum(op(inputs) * w) in float64; loom_grad's result is compared with central finite
 *     differences, computed by re-running the same program with perturbed inputs (which must hit
 *     the program cache). Shapes include broadcasting, size-1 and odd sizes.
 *   forward: matmul, conv2d and max-pooling against naive loops, and the non-differentiable ops
 *     against their definitions.
 * The op list comes from ops.def, so an op added without a case fails `every_op_has_a_case`.
 */
#include "harness.h"

#define MAXIN 3

typedef loom_tensor *(*build_fn)(loom_graph *g, loom_tensor **in);

typedef struct {
    const char *op; /* the ops.def name it covers, or a composition's name */
    int nin;
    int ndim[MAXIN];
    int64_t shape[MAXIN][LOOM_MAX_DIMS];
    bool grad[MAXIN];
    double lo, hi; /* input range */
    build_fn build;
} opcase;

static loom_tensor *b_neg(loom_graph *g, loom_tensor **x) {
    return loom_neg(g, x[0]);
}
static loom_tensor *b_exp(loom_graph *g, loom_tensor **x) {
    return loom_exp(g, x[0]);
}
static loom_tensor *b_log(loom_graph *g, loom_tensor **x) {
    return loom_log(g, x[0]);
}
static loom_tensor *b_sqrt(loom_graph *g, loom_tensor **x) {
    return loom_sqrt(g, x[0]);
}
static loom_tensor *b_relu(loom_graph *g, loom_tensor **x) {
    return loom_relu(g, x[0]);
}
static loom_tensor *b_add(loom_graph *g, loom_tensor **x) {
    return loom_add(g, x[0], x[1]);
}
static loom_tensor *b_sub(loom_graph *g, loom_tensor **x) {
    return loom_sub(g, x[0], x[1]);
}
static loom_tensor *b_mul(loom_graph *g, loom_tensor **x) {
    return loom_mul(g, x[0], x[1]);
}
static loom_tensor *b_div(loom_graph *g, loom_tensor **x) {
    return loom_div(g, x[0], x[1]);
}
static loom_tensor *b_where(loom_graph *g, loom_tensor **x) {
    return loom_where(g, loom_cmpgt(g, x[0], loom_scalar(g, 0.0, LOOM_F64)), x[1], x[2]);
}
static loom_tensor *b_sum1(loom_graph *g, loom_tensor **x) {
    return loom_sum(g, x[0], 1);
}
static loom_tensor *b_sum0(loom_graph *g, loom_tensor **x) {
    return loom_sum(g, x[0], -3);
}
static loom_tensor *b_max0(loom_graph *g, loom_tensor **x) {
    return loom_max(g, x[0], 0);
}
static loom_tensor *b_max2(loom_graph *g, loom_tensor **x) {
    return loom_max(g, x[0], 2);
}
static loom_tensor *b_reshape(loom_graph *g, loom_tensor **x) {
    int64_t s[3] = {3, -1, 2};
    return loom_reshape(g, x[0], 3, s);
}
static loom_tensor *b_reshape_perm(loom_graph *g, loom_tensor **x) { /* non-contiguous source */
    int64_t s[2] = {4, 6};
    return loom_reshape(g, loom_transpose(g, x[0]), 2, s);
}
static loom_tensor *b_permute(loom_graph *g, loom_tensor **x) {
    int p[3] = {2, 0, 1};
    return loom_permute(g, x[0], p);
}
static loom_tensor *b_expand(loom_graph *g, loom_tensor **x) {
    int64_t s[3] = {2, 3, 4};
    return loom_expand(g, x[0], 3, s);
}
static loom_tensor *b_matmul(loom_graph *g, loom_tensor **x) {
    return loom_matmul(g, x[0], x[1]);
}
static loom_tensor *b_matmul_t(loom_graph *g, loom_tensor **x) {
    return loom_matmul(g, loom_transpose(g, x[0]), loom_transpose(g, x[1]));
}
static loom_tensor *b_unfold(loom_graph *g, loom_tensor **x) {
    return loom_unfold(g, x[0], (loom_window){3, 2, 2, 1, 1, 0});
}
static loom_tensor *b_fold(loom_graph *g, loom_tensor **x) {
    return loom_fold(g, x[0], (loom_window){3, 2, 2, 1, 1, 0}, 5, 4);
}
static loom_tensor *b_allreduce(loom_graph *g, loom_tensor **x) { /* one device: the identity */
    return loom_allreduce(g, x[0], LOOM_REDUCE_MEAN);
}
static loom_tensor *b_tanh(loom_graph *g, loom_tensor **x) {
    return loom_tanh(g, x[0]);
}
static loom_tensor *b_erf(loom_graph *g, loom_tensor **x) {
    return loom_erf(g, x[0]);
}
static loom_tensor *b_gelu(loom_graph *g, loom_tensor **x) {
    return loom_gelu(g, x[0]);
}
static loom_tensor *b_layer_norm(loom_graph *g, loom_tensor **x) { /* (2, 3, 5) over 5 */
    return loom_layer_norm(g, x[0], x[1], x[2], 1e-5);
}
static loom_tensor *b_layer_norm_bare(loom_graph *g, loom_tensor **x) { /* no weight, no bias */
    return loom_layer_norm(g, x[0], NULL, NULL, 0.1);
}
static loom_tensor *b_pad(loom_graph *g, loom_tensor **x) { /* (2, 3, 4) strided, by 2, 1 */
    return loom_pad2d(g, loom_permute(g, x[0], (const int[]){0, 2, 1}), 2, 1);
}
static loom_tensor *b_crop(loom_graph *g, loom_tensor **x) { /* (2, 5, 6) by 1, 2 */
    return loom_crop2d(g, x[0], 1, 2);
}
static loom_tensor *b_lnorm_strided(loom_graph *g, loom_tensor **x) { /* rows of a transpose */
    return loom_layer_norm(g, loom_transpose(g, x[0]), NULL, NULL, 1e-3);
}
static int32_t gather_idx[6] = {4, 0, 4, 1, 3, 4};             /* repeats, and row 2 never taken */
static loom_tensor *b_gather(loom_graph *g, loom_tensor **x) { /* table (5, 3), indices (2, 3) */
    int64_t s[2] = {2, 3};
    return loom_gather(g, x[0], loom_input(g, LOOM_I32, 2, s, gather_idx));
}
static loom_tensor *b_scatter(loom_graph *g, loom_tensor **x) { /* rows (2, 3, 4) into 5 */
    int64_t s[2] = {2, 3};
    return loom_scatter_add(g, x[0], loom_input(g, LOOM_I32, 2, s, gather_idx), 5);
}
static int32_t dropout_key[4] = {7, 0, 3, 0};
static loom_tensor *b_dropout(loom_graph *g, loom_tensor **x) { /* (4, 5), p 0.3 */
    int64_t s[1] = {4};
    return loom_dropout(g, x[0], 0.3, loom_input(g, LOOM_I32, 1, s, dropout_key));
}
static loom_tensor *b_causal(loom_graph *g, loom_tensor **x) { /* (2, 3, 4): T 3 of S 4 */
    return loom_causal_mask(g, x[0], -1.5);
}
static loom_tensor *b_softmax(loom_graph *g, loom_tensor **x) { /* the last axis: SOFTMAX */
    return loom_softmax(g, x[0], 1);
}
static loom_tensor *b_softmax_t(loom_graph *g, loom_tensor **x) { /* strided rows */
    return loom_softmax(g, loom_transpose(g, x[0]), 1);
}
static loom_tensor *b_softmax_0(loom_graph *g, loom_tensor **x) { /* another axis: composed */
    return loom_softmax(g, x[0], 0);
}
static loom_tensor *b_logsm(loom_graph *g, loom_tensor **x) {
    return loom_log_softmax(g, x[0], -1);
}
static loom_tensor *b_mean(loom_graph *g, loom_tensor **x) {
    return loom_mean_all(g, x[0]);
}
static loom_tensor *b_linear(loom_graph *g, loom_tensor **x) {
    return loom_linear(g, x[0], x[1], x[2]);
}
static loom_tensor *b_conv(loom_graph *g, loom_tensor **x) {
    return loom_conv2d(g, x[0], x[1], x[2], 2, 1);
}
static loom_tensor *b_conv1x1(loom_graph *g, loom_tensor **x) { /* a product, not columns */
    return loom_conv2d(g, x[0], x[1], x[2], 1, 0);
}
static loom_tensor *b_pool(loom_graph *g, loom_tensor **x) {
    return loom_max_pool2d(g, x[0], 2);
}
static loom_tensor *b_poolmax(loom_graph *g, loom_tensor **x) { /* overlapping, padded */
    return loom_pool_max(g, x[0], (loom_window){3, 3, 2, 2, 1, 1});
}
static loom_tensor *b_poolmax2(loom_graph *g, loom_tensor **x) { /* 2x2 in double: the codes */
    return loom_pool_max(g, x[0], (loom_window){2, 2, 2, 2, 0, 0});
}
static loom_tensor *b_flatten(loom_graph *g, loom_tensor **x) {
    return loom_flatten(g, x[0]);
}
static loom_tensor *b_attention(loom_graph *g, loom_tensor **x) { /* causal, T 19: two blocks */
    return loom_attention(g, x[0], true);
}
static loom_tensor *b_attention_full(loom_graph *g, loom_tensor **x) { /* every key */
    return loom_attention(g, x[0], false);
}
static int32_t ce_labels[4] = {2, 0, 4, 4};
static loom_tensor *b_ce(loom_graph *g, loom_tensor **x) {
    int64_t n = 4;
    return loom_cross_entropy(g, x[0], loom_input(g, LOOM_I32, 1, &n, ce_labels));
}

static int32_t ce_seq_labels[6] = {1, 4, 0, 0, 3, 2};
static loom_tensor *b_ce_seq(loom_graph *g, loom_tensor **x) { /* (2, 3, 5) and (2, 3) */
    int64_t s[2] = {2, 3};
    return loom_cross_entropy(g, x[0], loom_input(g, LOOM_I32, 2, s, ce_seq_labels));
}

#define S1(a) \
    { a }
#define S2(a, b) \
    { a, b }
#define S3(a, b, c) \
    { a, b, c }
#define S4(a, b, c, d) \
    { a, b, c, d }

static const opcase cases[] = {
    {"NEG", 1, {2}, {S2(3, 5)}, {1}, -2, 2, b_neg},
    {"EXP", 1, {3}, {S3(2, 1, 3)}, {1}, -2, 2, b_exp},
    {"LOG", 1, {1}, {S1(7)}, {1}, 0.5, 3, b_log},
    {"SQRT", 1, {2}, {S2(1, 5)}, {1}, 0.5, 3, b_sqrt},
    {"RELU", 1, {2}, {S2(4, 5)}, {1}, -2, 2, b_relu},
    {"ADD", 2, {3, 2}, {S3(2, 3, 4), S2(3, 1)}, {1, 1}, -2, 2, b_add},
    {"ADD", 2, {0, 1}, {{0}, S1(5)}, {1, 1}, -2, 2, b_add},
    {"SUB", 2, {2, 2}, {S2(5, 7), S2(5, 7)}, {1, 1}, -2, 2, b_sub},
    {"MUL", 2, {2, 1}, {S2(3, 4), S1(1)}, {1, 1}, -2, 2, b_mul},
    {"DIV", 2, {2, 2}, {S2(3, 1), S2(1, 4)}, {1, 1}, 0.5, 2, b_div},
    {"WHERE", 3, {2, 2, 1}, {S2(3, 4), S2(3, 4), S1(4)}, {0, 1, 1}, -2, 2, b_where},
    {"SUM", 1, {3}, {S3(3, 4, 5)}, {1}, -2, 2, b_sum1},
    {"SUM", 1, {3}, {S3(3, 1, 5)}, {1}, -2, 2, b_sum0},
    {"MAX", 1, {2}, {S2(4, 3)}, {1}, -2, 2, b_max0},
    {"MAX", 1, {3}, {S3(2, 3, 5)}, {1}, -2, 2, b_max2},
    {"RESHAPE", 1, {2}, {S2(4, 6)}, {1}, -2, 2, b_reshape},
    {"RESHAPE", 1, {2}, {S2(6, 4)}, {1}, -2, 2, b_reshape_perm},
    {"PERMUTE", 1, {3}, {S3(2, 3, 4)}, {1}, -2, 2, b_permute},
    {"EXPAND", 1, {2}, {S2(3, 1)}, {1}, -2, 2, b_expand},
    {"MATMUL", 2, {2, 2}, {S2(3, 4), S2(4, 5)}, {1, 1}, -2, 2, b_matmul},
    {"MATMUL", 2, {3, 2}, {S3(2, 3, 4), S2(4, 1)}, {1, 1}, -2, 2, b_matmul},
    {"MATMUL", 2, {2, 2}, {S2(4, 3), S2(5, 4)}, {1, 1}, -2, 2, b_matmul_t},
    {"UNFOLD", 1, {4}, {S4(2, 3, 5, 4)}, {1}, -2, 2, b_unfold},
    {"FOLD", 1, {6}, {{3, 3, 2, 2, 3, 3}}, {1}, -2, 2, b_fold},
    {"POOLMAX", 1, {4}, {S4(2, 3, 5, 6)}, {1}, -2, 2, b_poolmax},
    {"POOLMAX", 1, {4}, {S4(2, 3, 6, 8)}, {1}, -2, 2, b_poolmax2},
    {"ALLREDUCE", 1, {2}, {S2(2, 3)}, {1}, -2, 2, b_allreduce},
    {"GATHER", 1, {2}, {S2(5, 3)}, {1}, -2, 2, b_gather},
    {"SCATTERADD", 1, {3}, {S3(2, 3, 4)}, {1}, -2, 2, b_scatter},
    {"CAUSAL", 1, {3}, {S3(2, 3, 4)}, {1}, -2, 2, b_causal},
    {"ATTENTION", 1, {5}, {{2, 19, 3, 2, 3}}, {1}, -2, 2, b_attention},
    {"ATTENTION", 1, {5}, {{1, 5, 3, 3, 2}}, {1}, -2, 2, b_attention_full},
    {"DROPOUT", 1, {2}, {S2(4, 5)}, {1}, -2, 2, b_dropout},
    {"TANH", 1, {2}, {S2(3, 4)}, {1}, -2, 2, b_tanh},
    {"ERF", 1, {2}, {S2(3, 4)}, {1}, -2, 2, b_erf},
    {"GELU", 1, {2}, {S2(3, 7)}, {1}, -3, 3, b_gelu},
    {"layer_norm", 3, {3, 1, 1}, {S3(2, 3, 5), S1(5), S1(5)}, {1, 1, 1}, -2, 2, b_layer_norm},
    {"layer_norm_bare", 1, {2}, {S2(4, 1)}, {1}, -2, 2, b_layer_norm_bare},
    {"LNORM", 1, {2}, {S2(19, 3)}, {1}, -2, 2, b_lnorm_strided},
    {"PAD", 1, {3}, {S3(2, 4, 3)}, {1}, -2, 2, b_pad},
    {"CROP", 1, {3}, {S3(2, 5, 6)}, {1}, -2, 2, b_crop},
    {"SOFTMAX", 1, {2}, {S2(3, 5)}, {1}, -2, 2, b_softmax},
    {"softmax_strided", 1, {2}, {S2(4, 3)}, {1}, -2, 2, b_softmax_t},
    {"softmax_axis0", 1, {2}, {S2(3, 5)}, {1}, -2, 2, b_softmax_0},
    {"log_softmax", 1, {2}, {S2(3, 5)}, {1}, -2, 2, b_logsm},
    {"mean_all", 1, {3}, {S3(2, 3, 3)}, {1}, -2, 2, b_mean},
    {"linear", 3, {2, 2, 1}, {S2(4, 3), S2(5, 3), S1(5)}, {1, 1, 1}, -2, 2, b_linear},
    {"conv2d", 3, {4, 4, 1}, {S4(2, 3, 5, 6), S4(4, 3, 3, 3), S1(4)}, {1, 1, 1}, -2, 2, b_conv},
    {"conv2d_1x1",
     3,
     {4, 4, 1},
     {S4(2, 3, 5, 6), S4(4, 3, 1, 1), S1(4)},
     {1, 1, 1},
     -2,
     2,
     b_conv1x1},
    {"max_pool2d", 1, {4}, {S4(2, 3, 4, 5)}, {1}, -2, 2, b_pool},
    {"flatten", 1, {3}, {S3(2, 3, 2)}, {1}, -2, 2, b_flatten},
    {"cross_entropy", 1, {2}, {S2(4, 5)}, {1}, -3, 3, b_ce},
    {"cross_entropy_seq", 1, {3}, {S3(2, 3, 5)}, {1}, -3, 3, b_ce_seq},
};
#define NCASES (int)(sizeof cases / sizeof *cases)

/* Ops without a gradient, checked by forward tests below. */
static const char *const forward_only[] = {
    "INPUT", "CONST", "PERSIST",  "CMPGT",     "CMPEQ", "MAXMASK",      "ONEHOT",
    "STORE", "SYNC",  "POOLGRAD", "LNORMGRAD", "GELUD", "ATTENTIONGRAD"};

static const char *const all_ops[] = {
#define LOOM_LEAF(name, attr)          #name,
#define LOOM_EW(name, arity, expr)     #name,
#define LOOM_RED(name, combine, ident) #name,
#define LOOM_MOV(name, attr)           #name,
#define LOOM_OPQ(name, arity, attr)    #name,
#include "../src/graph/ops.def"
};

TEST(every_op_has_a_case) {
    for (size_t i = 0; i < sizeof all_ops / sizeof *all_ops; i++) {
        bool found = false;
        for (int c = 0; c < NCASES && !found; c++)
            found = !strcmp(cases[c].op, all_ops[i]);
        for (size_t k = 0; k < sizeof forward_only / sizeof *forward_only && !found; k++)
            found = !strcmp(forward_only[k], all_ops[i]);
        if (!found)
            FAILF("op %s has no gradient case and is not marked forward-only", all_ops[i]);
    }
}

static int64_t numel(int nd, const int64_t *s) {
    int64_t n = 1;
    for (int i = 0; i < nd; i++)
        n *= s[i];
    return n;
}

/* One gradient case; returns false after reporting. */
static bool check_case(int ci) {
    const opcase *c = &cases[ci];
    loom_graph *g = loom_graph_new(NULL);
    double *buf[MAXIN] = {0}, *w = NULL, *an[MAXIN] = {0};
    loom_tensor *in[MAXIN] = {0}, *gr[MAXIN] = {0};
    bool ok = true;
    for (int i = 0; i < c->nin; i++) {
        int64_t n = numel(c->ndim[i], c->shape[i]);
        buf[i] = malloc(sizeof(double) * (size_t)(n + 1));
        for (int64_t j = 0; j < n; j++)
            buf[i][j] = test_rand((uint64_t)(ci * 8 + i), (uint64_t)j, c->lo, c->hi);
        in[i] = loom_input(g, LOOM_F64, c->ndim[i], c->shape[i], buf[i]);
        if (c->grad[i])
            loom_requires_grad(in[i]);
    }
    loom_tensor *y = c->build(g, in);
    int64_t ny = y ? loom_tensor_numel(y) : 0;
    w = malloc(sizeof(double) * (size_t)(ny + 1));
    for (int64_t j = 0; j < ny; j++)
        w[j] = test_rand(999, (uint64_t)j, -1, 1);
    loom_tensor *wt =
        y ? loom_input(g, LOOM_F64, loom_tensor_ndim(y), loom_tensor_shape(y), w) : NULL;
    loom_tensor *loss = loom_sum_all(g, loom_mul(g, y, wt));
    loom_output(loss);
    for (int i = 0; i < c->nin; i++)
        if (c->grad[i]) {
            gr[i] = loom_grad(g, loss, in[i]);
            loom_output(gr[i]);
        }
    if (loom_graph_run(g)) {
        fprintf(stderr, "case %d (%s): %s\n", ci, c->op, loom_last_error());
        ok = false;
    }
    for (int i = 0; ok && i < c->nin; i++) {
        if (!c->grad[i])
            continue;
        int64_t n = numel(c->ndim[i], c->shape[i]);
        an[i] = malloc(sizeof(double) * (size_t)(n + 1));
        memcpy(an[i], loom_tensor_data(gr[i]), sizeof(double) * (size_t)n);
    }
    const double h = 1e-6;
    for (int i = 0; ok && i < c->nin; i++) {
        if (!c->grad[i])
            continue;
        for (int64_t j = 0; ok && j < numel(c->ndim[i], c->shape[i]); j++) {
            double save = buf[i][j];
            buf[i][j] = save + h;
            ok = loom_graph_run(g) == LOOM_OK;
            double lp = loom_item(loss);
            buf[i][j] = save - h;
            ok = ok && loom_graph_run(g) == LOOM_OK;
            double lm = loom_item(loss);
            buf[i][j] = save;
            double fd = (lp - lm) / (2 * h);
            double tol = 1e-6 * fmax(1.0, fabs(fd));
            if (!ok || !(fabs(fd - an[i][j]) <= tol)) {
                fprintf(stderr,
                        "case %d (%s): d/d input%d[%lld]: autograd %.10g, finite "
                        "difference %.10g\n",
                        ci, c->op, i, (long long)j, an[i][j], fd);
                ok = false;
            }
        }
    }
    loom_metrics m;
    loom_graph_metrics(g, &m);
    if (ok && m.programs_built != 1) {
        fprintf(stderr, "case %d (%s): %lld programs built, expected 1 (cache misses)\n", ci, c->op,
                (long long)m.programs_built);
        ok = false;
    }
    for (int i = 0; i < MAXIN; i++)
        free(buf[i]), free(an[i]);
    free(w);
    loom_graph_free(g);
    return ok;
}

TEST(gradients_match_finite_differences) {
    int bad = 0;
    for (int ci = 0; ci < NCASES; ci++)
        bad += !check_case(ci);
    ASSERT_EQ(bad, 0);
}

/* ---- forward checks against naive loops ---------------------------------------------------- */

/* (m x k) x (k x n) in float32 through the graph, a and/or b read transposed, against a naive loop
 * in double. Shapes cross the blocking of loom's own sgemm (the default; LOOM_MATMUL=blas for
 * BLAS): 8-row and 48-column tiles, 192-deep k blocks, 288-wide column blocks, A read in place
 * or packed, and the dot-product path of small products with a long k. */
static void check_matmul(int64_t m, int64_t k, int64_t n, bool ta, bool tb, int *bad) {
    float *a = malloc(sizeof(float) * (size_t)(m * k + 1)),
          *b = malloc(sizeof(float) * (size_t)(k * n + 1));
    for (int64_t i = 0; i < m * k; i++)
        a[i] = (float)test_rand(1, (uint64_t)i, -1, 1);
    for (int64_t i = 0; i < k * n; i++)
        b[i] = (float)test_rand(2, (uint64_t)i, -1, 1);
    loom_graph *g = loom_graph_new(NULL);
    int64_t sa[2] = {ta ? k : m, ta ? m : k}, sb[2] = {tb ? n : k, tb ? k : n};
    loom_tensor *x = loom_input(g, LOOM_F32, 2, sa, a), *w = loom_input(g, LOOM_F32, 2, sb, b);
    loom_tensor *y = loom_matmul(g, ta ? loom_transpose(g, x) : x, tb ? loom_transpose(g, w) : w);
    loom_output(y);
    if (loom_graph_run(g) != LOOM_OK) {
        (*bad)++;
    } else {
        const float *out = loom_tensor_data(y);
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < n; j++) {
                double ref = 0;
                for (int64_t p = 0; p < k; p++)
                    ref += (double)(ta ? a[p * m + i] : a[i * k + p]) *
                           (tb ? b[j * k + p] : b[p * n + j]);
                if (!(fabs(out[i * n + j] - ref) <= 1e-5 * fmax(1.0, fabs(ref)) * sqrt((double)k)))
                    (*bad)++;
            }
    }
    loom_graph_free(g);
    free(a), free(b);
}

TEST(matmul_matches_naive_loop) {
    /* {37, 1000, 50}: A read in place but for a ragged last panel; {7, 2000, 5}: dot products;
     * {130, 300, 10} and {100, 1100, 3} with B transposed: rows of dot products (narrow: ragged
     * blocks of rows, a ragged last chunk of k, two k blocks); {10, 300, 100}: few rows, B's full
     * panels read in place over two k blocks, its ragged last one packed; {150, 200, 256},
     * {64, 300, 256}, {16, 100, 112}, {9, 50, 100}: panels 48 wide but for two 32 wide last
     * (a block of panels packed, a panel at a time, read in place, the last one ragged) */
    const int64_t shapes[][3] = {{37, 53, 29},   {1, 1, 1},       {12, 256, 32},  {13, 257, 33},
                                 {25, 600, 270}, {150, 7, 300},   {37, 1000, 50}, {7, 2000, 5},
                                 {3, 0, 5},      {0, 4, 4},       {130, 300, 10}, {100, 1100, 3},
                                 {10, 300, 100}, {150, 200, 256}, {64, 300, 256}, {16, 100, 112},
                                 {9, 50, 100}};
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
        for (int t = 0; t < 4; t++) {
            int bad = 0;
            check_matmul(shapes[s][0], shapes[s][1], shapes[s][2], t & 1, t & 2, &bad);
            if (bad)
                FAILF("(%lld x %lld) x (%lld x %lld), transposes %d: %d wrong elements",
                      (long long)shapes[s][0], (long long)shapes[s][1], (long long)shapes[s][1],
                      (long long)shapes[s][2], t, bad);
        }
}

/* Batched products over permuted views, as attention without its fused kernel makes them: q kᵀ
 * and then its product with v, heads of (B, T, H, D) read as (B, H, T, D), large enough that
 * the batch's products are split among a device's cores; every product of the batch against a
 * double-precision naive loop (the second batch item on was once left unwritten). */
TEST(batched_matmul_of_permuted_views_matches_naive_loop) {
    enum { B = 3, T = 40, H = 2, D = 24 };
    static float q[B * T * H * D], k[B * T * H * D];
    test_fill(q, B * T * H * D, 40, -1, 1);
    test_fill(k, B * T * H * D, 41, -1, 1);
    loom_graph *g = loom_graph_new(NULL);
    int64_t s[4] = {B, T, H, D};
    const int perm[4] = {0, 2, 1, 3};
    loom_tensor *qh = loom_permute(g, loom_input(g, LOOM_F32, 4, s, q), perm);
    loom_tensor *kh = loom_permute(g, loom_input(g, LOOM_F32, 4, s, k), perm);
    loom_tensor *sc = loom_matmul(g, qh, loom_transpose(g, kh)); /* (B, H, T, T) */
    loom_tensor *y = loom_matmul(g, sc, kh);                     /* (B, H, T, D) */
    loom_output(sc), loom_output(y);
    ASSERT_EQ(loom_graph_run(g), LOOM_OK);
    const float *ps = loom_tensor_data(sc), *py = loom_tensor_data(y);
    int bad = 0;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            const float *qb = q + (int64_t)b * T * H * D + h * D, *kb = k + (qb - q);
            for (int i = 0; i < T; i++)
                for (int j = 0; j < T; j++) {
                    double r = 0;
                    for (int d = 0; d < D; d++)
                        r += (double)qb[i * H * D + d] * kb[j * H * D + d];
                    bad += !(fabs(ps[((b * H + h) * T + i) * T + j] - r) <= 1e-5);
                }
            for (int i = 0; i < T; i++)
                for (int d = 0; d < D; d++) {
                    double r = 0;
                    for (int j = 0; j < T; j++)
                        r += (double)ps[((b * H + h) * T + i) * T + j] * kb[j * H * D + d];
                    bad += !(fabs(py[((b * H + h) * T + i) * D + d] - r) <= 1e-4);
                }
        }
    loom_graph_free(g);
    ASSERT_EQ(bad, 0);
}

/* A product whose B is strided along k (a stride-2 unfold read in place, transposed: a strided
 * first convolution's weight gradient), on the dot path that copies B a block of k at a time
 * (two blocks and a ragged one), against a double-precision naive loop. */
TEST(matmul_of_a_strided_view_matches_naive_loop) {
    enum { N = 11, H = 29, O = 8, OH = 14, K = N * OH * OH };
    static float x[N * H * H], a[O * K];
    test_fill(x, N * H * H, 30, -1, 1);
    test_fill(a, O * K, 31, -1, 1);
    loom_graph *g = loom_graph_new(NULL);
    int64_t sx[4] = {N, 1, H, H}, sa[2] = {O, K}, s2[2] = {9, K};
    loom_tensor *cols =
        loom_unfold(g, loom_input(g, LOOM_F32, 4, sx, x), (loom_window){3, 3, 2, 2, 0, 0});
    loom_tensor *c = loom_matmul(g, loom_input(g, LOOM_F32, 2, sa, a),
                                 loom_transpose(g, loom_reshape(g, cols, 2, s2)));
    loom_output(c);
    ASSERT_EQ(loom_graph_run(g), LOOM_OK);
    const float *pc = loom_tensor_data(c);
    int bad = 0;
    for (int o = 0; o < O; o++)
        for (int t = 0; t < 9; t++) {
            double ref = 0;
            for (int k = 0; k < K; k++) {
                int n = k / (OH * OH), oy = k / OH % OH, ox = k % OH;
                ref += (double)a[o * K + k] * x[(n * H + 2 * oy + t / 3) * H + 2 * ox + t % 3];
            }
            bad += !(fabs(pc[o * 9 + t] - ref) <= 1e-5 * sqrt((double)K));
        }
    loom_graph_free(g);
    ASSERT_EQ(bad, 0);
}

/* A column of C is the same chain of FMAs whatever panel computes it (48 wide, 32, 16, ragged)
 * and whether the product runs as its transpose (B read transposed and N > 2 M: N >= 80 here):
 * the first N columns of a product, for N across the panel layouts, equal those of the widest
 * bitwise. Two k blocks, ragged rows, B read transposed or not. */
TEST(matmul_columns_do_not_depend_on_their_panels) {
    enum { M = 37, K = 300, W = 256 };
    const char *mm = getenv("LOOM_MATMUL");
    if ((mm && !strcmp(mm, "blas")) || !__builtin_cpu_supports("avx512f")) {
        fprintf(stderr, "skip %s: a property of loom's own sgemm, not BLAS's\n", harness_current);
        return;
    }
    static float a[M * K], b[K * W], bt[W * K], wide[2][M * W];
    for (int64_t i = 0; i < M * K; i++)
        a[i] = (float)test_rand(3, (uint64_t)i, -1, 1);
    for (int64_t i = 0; i < K * W; i++)
        b[i] = (float)test_rand(4, (uint64_t)i, -1, 1), bt[i % W * K + i / W] = b[i];
    const int64_t widths[] = {W, 16, 32, 48, 64, 80, 100, 112, 160, 208, 250};
    for (size_t q = 0; q < sizeof widths / sizeof *widths; q++)
        for (int t = 0; t < 2; t++) {
            int64_t n = widths[q];
            static float bn[K * W];
            for (int64_t p = 0; p < K; p++) /* B's first n columns, as (k x n) or (n x k) */
                for (int64_t j = 0; j < n; j++)
                    bn[t ? j * K + p : p * n + j] = t ? bt[j * K + p] : b[p * W + j];
            loom_graph *g = loom_graph_new(NULL);
            loom_tensor *x = loom_input(g, LOOM_F32, 2, (int64_t[]){M, K}, a);
            loom_tensor *w =
                loom_input(g, LOOM_F32, 2, t ? (int64_t[]){n, K} : (int64_t[]){K, n}, bn);
            loom_tensor *y = loom_matmul(g, x, t ? loom_transpose(g, w) : w);
            loom_output(y);
            ASSERT(loom_graph_run(g) == LOOM_OK);
            const float *out = loom_tensor_data(y);
            int differ = 0;
            for (int64_t i = 0; i < M; i++)
                for (int64_t j = 0; j < n; j++) {
                    if (q == 0)
                        wide[t][i * W + j] = out[i * n + j];
                    differ += memcmp(&wide[t][i * W + j], &out[i * n + j], sizeof(float)) != 0;
                }
            loom_graph_free(g);
            if (differ)
                FAILF("N = %lld (B %s): %d elements differ from N = %d's", (long long)n,
                      t ? "transposed" : "plain", differ, W);
        }
}

/* Whether float32 products run on loom's AVX2 sgemm here (an AVX2 CPU without AVX-512, and not
 * LOOM_MATMUL=blas); if not, says the test is skipped. */
static bool avx2_sgemm_runs(void) {
    const char *mm = getenv("LOOM_MATMUL");
    if ((mm && !strcmp(mm, "blas")) || __builtin_cpu_supports("avx512f") ||
        !__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) {
        fprintf(stderr, "skip %s: a property of loom's AVX2 sgemm\n", harness_current);
        return false;
    }
    return true;
}

/* On a CPU with AVX2 and FMA but not AVX-512, float32 products run through gemm256.c, which sums
 * each element in one documented order: K in equal blocks of at most 256, a chain of FMAs over
 * each block from zero, the blocks' sums added in order. A naive loop in that order gives the same
 * bits for every shape, layout and path (6 x 16 tiles and ragged ones, A read in place or packed,
 * column blocks of 1024, row blocks of 144, C computed as its transpose where it is narrow or A
 * has few rows, a dense layer's forward on at most 128 rows made a few of B's rows at a time
 * against all of A): so its results cannot depend on how a device's cores split the product. */
TEST(matmul_avx2_sums_in_its_documented_order) {
    if (!avx2_sgemm_runs())
        return;
    static const int64_t shapes[][3] = {
        {1, 1, 1},     {5, 7, 3},      {6, 16, 256},   {7, 17, 257},   {13, 10, 300},
        {37, 33, 513}, {150, 40, 100}, {20, 1030, 64}, {64, 5, 700},   {3, 20, 50},
        {8, 20, 1024}, {290, 3, 9},    {12, 40, 4100}, {128, 70, 600}, {100, 1030, 260},
        {17, 9, 2048}, {129, 50, 300}};
    for (size_t q = 0; q < sizeof shapes / sizeof *shapes; q++)
        for (int t = 0; t < 4; t++) {
            int64_t m = shapes[q][0], n = shapes[q][1], k = shapes[q][2];
            bool ta = t & 1, tb = t & 2;
            float *a = malloc(sizeof(float) * (size_t)(m * k)),
                  *b = malloc(sizeof(float) * (size_t)(k * n));
            for (int64_t i = 0; i < m * k; i++)
                a[i] = (float)test_rand(11, (uint64_t)i, -1, 1);
            for (int64_t i = 0; i < k * n; i++)
                b[i] = (float)test_rand(12, (uint64_t)i, -1, 1);
            loom_graph *g = loom_graph_new(NULL);
            int64_t sa[2] = {ta ? k : m, ta ? m : k}, sb[2] = {tb ? n : k, tb ? k : n};
            loom_tensor *x = loom_input(g, LOOM_F32, 2, sa, a),
                        *w = loom_input(g, LOOM_F32, 2, sb, b);
            loom_tensor *y =
                loom_matmul(g, ta ? loom_transpose(g, x) : x, tb ? loom_transpose(g, w) : w);
            loom_output(y);
            ASSERT(loom_graph_run(g) == LOOM_OK);
            const float *out = loom_tensor_data(y);
            int64_t blocks = (k + 255) / 256, step = (k + blocks - 1) / blocks, differ = 0;
            for (int64_t i = 0; i < m; i++)
                for (int64_t j = 0; j < n; j++) {
                    float sum = 0;
                    for (int64_t p0 = 0; p0 < k; p0 += step) {
                        float acc = 0;
                        for (int64_t p = p0; p < k && p < p0 + step; p++)
                            acc = fmaf(ta ? a[p * m + i] : a[i * k + p],
                                       tb ? b[j * k + p] : b[p * n + j], acc);
                        sum = p0 == 0 ? acc : sum + acc;
                    }
                    differ += memcmp(&sum, &out[i * n + j], sizeof sum) != 0;
                }
            if (differ)
                FAILF("%lld x %lld x %lld (A %s, B %s): %lld of %lld elements differ", (long long)m,
                      (long long)n, (long long)k, ta ? "transposed" : "plain",
                      tb ? "transposed" : "plain", (long long)differ, (long long)(m * n));
            loom_graph_free(g);
            free(a), free(b);
        }
}

/* A float sum in loom's AVX2 sgemm's order over k in [0, K): equal blocks of at most 256, an FMA
 * chain over each from zero, the blocks added in order; term(k, ctx) gives the two factors. */
static float documented_sum(int64_t K, void (*term)(int64_t, const void *, float *, float *),
                            const void *ctx) {
    int64_t blocks = (K + 255) / 256, step = (K + blocks - 1) / blocks;
    float sum = 0;
    for (int64_t p0 = 0; p0 < K; p0 += step) {
        float acc = 0, u, v;
        for (int64_t p = p0; p < K && p < p0 + step; p++)
            term(p, ctx, &u, &v), acc = fmaf(u, v, acc);
        sum = p0 == 0 ? acc : sum + acc;
    }
    return sum;
}

typedef struct {
    int N, C, H, W, O, KK, P, OH, OW, n, o, c, kh, kw, oh, ow;
    const float *x, *w, *r;
} conv_at;

/* x at (n, c, y, z) of the image padded by P (0 outside) */
static float conv_x(const conv_at *q, int n, int c, int y, int z) {
    y -= q->P, z -= q->P;
    return y < 0 || z < 0 || y >= q->H || z >= q->W ? 0.0f
                                                    : q->x[((n * q->C + c) * q->H + y) * q->W + z];
}

/* the forward's terms: k over (c, kh, kw) */
static void conv_fwd_term(int64_t k, const void *ctx, float *u, float *v) {
    const conv_at *q = ctx;
    int c = (int)(k / (q->KK * q->KK)), kh = (int)(k / q->KK % q->KK), kw = (int)(k % q->KK);
    *u = q->w[((q->o * q->C + c) * q->KK + kh) * q->KK + kw];
    *v = conv_x(q, q->n, c, q->oh + kh, q->ow + kw);
}

/* the weight gradient's terms: k over the batch's places (n, oh, ow) */
static void conv_wgrad_term(int64_t k, const void *ctx, float *u, float *v) {
    const conv_at *q = ctx;
    int n = (int)(k / (q->OH * q->OW)), oh = (int)(k / q->OW % q->OH), ow = (int)(k % q->OW);
    *u = q->r[((n * q->O + q->o) * q->OH + oh) * q->OW + ow];
    *v = conv_x(q, n, q->c, oh + q->kh, ow + q->kw);
}

/* On a CPU with AVX2 and no AVX-512, a convolution's products read the unfold of its (padded)
 * image in place (memplan's unfold view; loom__sgemm256_view gathers the forward's B from it and
 * reads the weight gradient's A^T through it): each output and each weight gradient element is the
 * sum of its terms in the products' documented order, bit for bit (as the copied unfold gave). */
TEST(conv2d_on_avx2_reads_the_unfold_in_the_documented_order) {
    if (!avx2_sgemm_runs())
        return;
    static const int shapes[][7] = {
        /* N, C, H, W, O, K, P */
        {2, 3, 9, 11, 5, 3, 0},   /* rows of 9: runs cut at the panels, a ragged tile */
        {4, 32, 13, 13, 7, 3, 0}, /* K = 288: two k blocks of 144; places 484 */
        {3, 2, 30, 30, 6, 3, 1},  /* padded: the padded copy read in place; 2700 places */
        {2, 4, 12, 20, 13, 5, 2}, /* a 5 x 5 window, 13 output rows of C */
    };
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
        const int *s = shapes[i];
        conv_at q = {.N = s[0], .C = s[1], .H = s[2], .W = s[3], .O = s[4], .KK = s[5], .P = s[6]};
        q.OH = q.H + 2 * q.P - q.KK + 1, q.OW = q.W + 2 * q.P - q.KK + 1;
        int64_t nx = (int64_t)q.N * q.C * q.H * q.W, nw = (int64_t)q.O * q.C * q.KK * q.KK,
                ny = (int64_t)q.N * q.O * q.OH * q.OW;
        float *x = malloc(sizeof(float) * (size_t)nx), *w = malloc(sizeof(float) * (size_t)nw),
              *r = malloc(sizeof(float) * (size_t)ny);
        test_fill(x, nx, 21, -1, 1), test_fill(w, nw, 22, -1, 1), test_fill(r, ny, 23, -1, 1);
        q.x = x, q.w = w, q.r = r;
        loom_graph *g = loom_graph_new(NULL);
        int64_t sx[4] = {q.N, q.C, q.H, q.W}, sw[4] = {q.O, q.C, q.KK, q.KK},
                sr[4] = {q.N, q.O, q.OH, q.OW};
        loom_tensor *wt = loom_input(g, LOOM_F32, 4, sw, w);
        loom_requires_grad(wt);
        loom_tensor *y = loom_conv2d(g, loom_input(g, LOOM_F32, 4, sx, x), wt, NULL, 1, q.P);
        /* the loss's gradient with respect to y is r exactly (1 * r) */
        loom_tensor *loss = loom_sum_all(g, loom_mul(g, y, loom_input(g, LOOM_F32, 4, sr, r)));
        loom_tensor *dw = loom_grad(g, loss, wt);
        loom_output(y), loom_output(dw);
        ASSERT(loom_graph_run(g) == LOOM_OK);
        const float *yo = loom_tensor_data(y), *dwo = loom_tensor_data(dw);
        int64_t bad_y = 0, bad_w = 0;
        for (q.n = 0; q.n < q.N; q.n++)
            for (q.o = 0; q.o < q.O; q.o++)
                for (q.oh = 0; q.oh < q.OH; q.oh++)
                    for (q.ow = 0; q.ow < q.OW; q.ow++) {
                        float want = documented_sum((int64_t)q.C * q.KK * q.KK, conv_fwd_term, &q);
                        bad_y += memcmp(&want, yo++, sizeof want) != 0;
                    }
        for (q.o = 0; q.o < q.O; q.o++)
            for (q.c = 0; q.c < q.C; q.c++)
                for (q.kh = 0; q.kh < q.KK; q.kh++)
                    for (q.kw = 0; q.kw < q.KK; q.kw++) {
                        float want =
                            documented_sum((int64_t)q.N * q.OH * q.OW, conv_wgrad_term, &q);
                        bad_w += memcmp(&want, dwo++, sizeof want) != 0;
                    }
        if (bad_y || bad_w)
            FAILF("conv shape %zu: %lld of %lld outputs, %lld of %lld weight gradients differ", i,
                  (long long)bad_y, (long long)ny, (long long)bad_w, (long long)nw);
        loom_graph_free(g);
        free(x), free(w), free(r);
    }
}

/* A convolution of window K, stride S, padding P against naive loops in double: the largest
 * difference. */
static double conv_error(int K, int S, int P) {
    enum { N = 2, C = 3, H = 7, W = 6, O = 4 };
    int OH = (H + 2 * P - K) / S + 1, OW = (W + 2 * P - K) / S + 1;
    float x[N * C * H * W], w[O * C * 3 * 3], bias[O];
    for (int i = 0; i < N * C * H * W; i++)
        x[i] = (float)test_rand(3, (uint64_t)i, -1, 1);
    for (int i = 0; i < O * C * K * K; i++)
        w[i] = (float)test_rand(4, (uint64_t)i, -1, 1);
    for (int i = 0; i < O; i++)
        bias[i] = (float)test_rand(5, (uint64_t)i, -1, 1);
    loom_graph *g = loom_graph_new(NULL);
    int64_t sx[4] = {N, C, H, W}, sw[4] = {O, C, K, K}, sbias[1] = {O};
    loom_tensor *y =
        loom_conv2d(g, loom_input(g, LOOM_F32, 4, sx, x), loom_input(g, LOOM_F32, 4, sw, w),
                    loom_input(g, LOOM_F32, 1, sbias, bias), S, P);
    loom_output(y);
    double worst = loom_graph_run(g) == LOOM_OK && loom_tensor_shape(y)[2] == OH ? 0 : INFINITY;
    const float *out = loom_tensor_data(y);
    for (int n = 0; n < N && worst < INFINITY; n++)
        for (int o = 0; o < O; o++)
            for (int oy = 0; oy < OH; oy++)
                for (int ox = 0; ox < OW; ox++) {
                    double ref = bias[o];
                    for (int c = 0; c < C; c++)
                        for (int i = 0; i < K; i++)
                            for (int j = 0; j < K; j++) {
                                int iy = oy * S - P + i, ix = ox * S - P + j;
                                if (iy >= 0 && iy < H && ix >= 0 && ix < W)
                                    ref += (double)x[((n * C + c) * H + iy) * W + ix] *
                                           w[((o * C + c) * K + i) * K + j];
                            }
                    double d = fabs(out[((n * O + o) * OH + oy) * OW + ox] - ref);
                    worst = d > worst ? d : worst;
                }
    loom_graph_free(g);
    return worst;
}

TEST(conv2d_and_pool_match_naive_loops) {
    ASSERT(conv_error(3, 2, 1) < 1e-5); /* by columns */
    ASSERT(conv_error(1, 1, 0) < 1e-5); /* 1x1: a product */
    enum { N = 2, C = 3, H = 7, W = 6 };
    float x[N * C * H * W];
    for (int i = 0; i < N * C * H * W; i++)
        x[i] = (float)test_rand(3, (uint64_t)i, -1, 1);
    loom_graph *g = loom_graph_new(NULL);
    int64_t sx[4] = {N, C, H, W};
    loom_tensor *pool = loom_max_pool2d(g, loom_input(g, LOOM_F32, 4, sx, x), 2);
    loom_output(pool);
    ASSERT_EQ(loom_graph_run(g), LOOM_OK);
    const float *po = loom_tensor_data(pool);
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++)
            for (int oy = 0; oy < H / 2; oy++)
                for (int ox = 0; ox < W / 2; ox++) {
                    float ref = -INFINITY;
                    for (int i = 0; i < 2; i++)
                        for (int j = 0; j < 2; j++)
                            ref = fmaxf(ref, x[((n * C + c) * H + oy * 2 + i) * W + ox * 2 + j]);
                    ASSERT(po[((n * C + c) * (H / 2) + oy) * (W / 2) + ox] == ref);
                }
    loom_graph_free(g);
}

/* conv2d without padding in float32 (with loom's matmul: the product reads the input through a
 * grouped view, no im2col buffer, or as its transpose with the image broadcast, and the input
 * gradient is added into the image by the fold that computes its product), forward and both
 * gradients against naive loops in double. Shapes cross the sgemm's tiles and blocks: a ragged
 * column count, stride 2, a non-square kernel, and 300 output channels (the input gradient's
 * product then spans two k blocks, added twice). */
static void check_conv(int N, int C, int H, int W, int O, int KH, int KW, int S, int P, int *bad) {
    int OH = (H + 2 * P - KH) / S + 1, OW = (W + 2 * P - KW) / S + 1;
    int nx = N * C * H * W, nw = O * C * KH * KW, ny = N * O * OH * OW;
    float *x = malloc(sizeof(float) * (size_t)nx), *w = malloc(sizeof(float) * (size_t)nw);
    float *dy = malloc(sizeof(float) * (size_t)ny);
    double *rdx = calloc((size_t)nx, sizeof(double)), *rdw = calloc((size_t)nw, sizeof(double));
    for (int i = 0; i < nx; i++)
        x[i] = (float)test_rand(11, (uint64_t)i, -1, 1);
    for (int i = 0; i < nw; i++)
        w[i] = (float)test_rand(12, (uint64_t)i, -1, 1);
    for (int i = 0; i < ny; i++)
        dy[i] = (float)test_rand(13, (uint64_t)i, -1, 1);
    loom_graph *g = loom_graph_new(NULL);
    int64_t sx[4] = {N, C, H, W}, sw[4] = {O, C, KH, KW}, sy[4] = {N, O, OH, OW};
    loom_tensor *tx = loom_input(g, LOOM_F32, 4, sx, x), *tw = loom_input(g, LOOM_F32, 4, sw, w);
    loom_requires_grad(tx), loom_requires_grad(tw);
    loom_tensor *y = loom_conv2d(g, tx, tw, NULL, S, P);
    loom_tensor *loss = loom_sum_all(g, loom_mul(g, y, loom_input(g, LOOM_F32, 4, sy, dy)));
    loom_tensor *dx = loom_grad(g, loss, tx), *dw = loom_grad(g, loss, tw);
    loom_output(y), loom_output(dx), loom_output(dw);
    if (loom_graph_run(g) != LOOM_OK) {
        fprintf(stderr, "conv: %s\n", loom_last_error());
        (*bad)++;
        goto done;
    }
    const float *py = loom_tensor_data(y), *pdx = loom_tensor_data(dx), *pdw = loom_tensor_data(dw);
    for (int n = 0; n < N; n++)
        for (int o = 0; o < O; o++)
            for (int oy = 0; oy < OH; oy++)
                for (int ox = 0; ox < OW; ox++) {
                    double ref = 0, d = dy[((n * O + o) * OH + oy) * OW + ox];
                    for (int c = 0; c < C; c++)
                        for (int i = 0; i < KH; i++)
                            for (int j = 0; j < KW; j++) {
                                int iy = oy * S + i - P, ix = ox * S + j - P;
                                if (iy < 0 || iy >= H || ix < 0 || ix >= W)
                                    continue; /* the zero padding */
                                int xi = ((n * C + c) * H + iy) * W + ix;
                                int wi = ((o * C + c) * KH + i) * KW + j;
                                ref += (double)x[xi] * w[wi];
                                rdx[xi] += d * w[wi];
                                rdw[wi] += d * x[xi];
                            }
                    *bad += !(fabs(py[((n * O + o) * OH + oy) * OW + ox] - ref) <=
                              1e-5 * fmax(1.0, fabs(ref)) * sqrt(C * KH * KW));
                }
    /* float32 sums: error bounds grow with the square root of the number of terms */
    for (int i = 0; i < nx; i++)
        *bad += !(fabs(pdx[i] - rdx[i]) <= 1e-5 * fmax(1.0, fabs(rdx[i])) * sqrt(O * KH * KW));
    for (int i = 0; i < nw; i++)
        *bad += !(fabs(pdw[i] - rdw[i]) <= 1e-5 * fmax(1.0, fabs(rdw[i])) * sqrt(N * OH * OW));
done:
    loom_graph_free(g);
    free(x), free(w), free(dy), free(rdx), free(rdw);
}

TEST(conv2d_views_match_naive_loops) {
    const int shapes[][8] = {
        {3, 5, 9, 11, 13, 3, 3, 1},   /* N*OH*OW = 189 columns: ragged tiles */
        {2, 4, 12, 10, 7, 3, 2, 2},   /* stride 2, non-square kernel */
        {2, 2, 5, 5, 300, 2, 2, 1},   /* input gradient's product over two k blocks */
        {4, 32, 13, 13, 64, 3, 3, 1}, /* the CNN's conv2 at batch 4 */
        {12, 2, 13, 13, 4, 3, 3, 1},  /* a column block ending one column into a row */
        {8, 1, 28, 28, 32, 3, 3, 1},  /* conv1: its weight gradient by dot products along K */
        {5, 2, 20, 17, 7, 3, 2, 1},   /* the same, with tiles of 4 x 5, 4 x 2 and single rows */
        {3, 16, 9, 9, 100, 3, 3, 1},  /* forward and weight gradient as their transposes: two
                                       * 64-lane panels, a ragged tile, two k blocks of 72 */
        {2, 3, 21, 19, 5, 9, 8, 2},   /* 72 window places, strided: the input gradient's fold
                                       * works out the ranges of those past its 64 itself */
    };
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
        const int *s = shapes[i];
        int bad = 0;
        check_conv(s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7], 0, &bad);
        if (bad)
            FAILF("conv shape %zu: %d wrong elements", i, bad);
    }
}

/* conv2d of randomized shapes (seeded: the same each run), padding 0 to 2 ("same" among them),
 * stride 1 to 3, kernels 1 to 5 and odd sizes, through whichever fast path each takes (the padded
 * copy read in place, a fold computing its product, products as their transposes, dot products
 * along K), forward and both gradients against naive loops. */
TEST(conv2d_of_random_shapes_matches_naive_loops) {
    for (int i = 0; i < 24; i++) {
        int K = 1 + (int)(test_rand(90, (uint64_t)i, 0, 5)),
            S = 1 + (int)(test_rand(91, (uint64_t)i, 0, 3));
        int P = (int)test_rand(92, (uint64_t)i, 0, 3), KW = i % 3 ? K : 1 + K % 3;
        int N = 1 + (int)test_rand(93, (uint64_t)i, 0, 5),
            C = 1 + (int)test_rand(94, (uint64_t)i, 0, 20);
        int O = 1 + (int)test_rand(95, (uint64_t)i, 0, 70);
        int H = K + (int)test_rand(96, (uint64_t)i, 0, 16),
            W = KW + (int)test_rand(97, (uint64_t)i, 0, 16);
        if (i == 0) /* "same": 3x3, stride 1, padding 1 */
            K = KW = 3, S = 1, P = 1;
        if (i == 1) /* a strided first layer: its weight gradient on the dot path, B copied */
            N = 6, C = 1, H = W = 28, O = 8, K = KW = 3, S = 2, P = 1;
        int bad = 0;
        check_conv(N, C, H, W, O, K, KW, S, P, &bad);
        if (bad)
            FAILF("conv %d: N %d C %d H %d W %d O %d kernel %dx%d stride %d padding %d: %d wrong "
                  "elements",
                  i, N, C, H, W, O, K, KW, S, P, bad);
    }
}

/* pool_max and pool_max_grad against naive loops, with many ties (values from 4 levels, so that
 * "first maximum in row-major window order" decides) and a NaN, over a strided (permuted) input
 * and a plain one (where the gradient reads the forward's argmax codes), for the specialised 2x2
 * window and the general path (overlapping, padded, odd sizes). */
/* d/dx sum(relu(pool_max(x - 1.5)) v) for x (N,C,H,W) = xn and v (OW x 1) from dy against naive
 * loops: v[ox] at each window's first maximum where that maximum is above 1.5 (a NaN's ReLU is
 * NaN, not > 0). A product reads the ReLU, so that it is a kernel of its own, which the pooling
 * computes, and its backward is read by the pool gradient through the codes. */
enum { PN = 2, PC = 3, PH = 7, PW = 39 };
static void check_relu_pool_grad(const float *xn, const float *dy, loom_window w, int *bad) {
    int OH = (PH + 2 * w.ph - w.kh) / w.sh + 1, OW = (PW + 2 * w.pw - w.kw) / w.sw + 1;
    loom_graph *g = loom_graph_new(NULL);
    int64_t sn[4] = {PN, PC, PH, PW}, s2[2] = {PN * PC * OH, OW}, sv[2] = {OW, 1};
    loom_tensor *x = loom_input(g, LOOM_F32, 4, sn, xn);
    loom_requires_grad(x);
    loom_tensor *r =
        loom_relu(g, loom_pool_max(g, loom_sub(g, x, loom_scalar(g, 1.5, LOOM_F32)), w));
    loom_tensor *loss = loom_sum_all(
        g, loom_matmul(g, loom_reshape(g, r, 2, s2), loom_input(g, LOOM_F32, 2, sv, dy)));
    loom_tensor *gx = loom_grad(g, loss, x);
    loom_output(gx), loom_output(loss); /* the forward product too: the ReLU is read twice */
    if (loom_graph_run(g) != LOOM_OK) {
        (*bad)++;
        loom_graph_free(g);
        return;
    }
    const float *pg = loom_tensor_data(gx);
    float ref[PN * PC * PH * PW] = {0};
    for (int pl = 0; pl < PN * PC; pl++)
        for (int oy = 0; oy < OH; oy++)
            for (int ox = 0; ox < OW; ox++) {
                int at = -1;
                float best = 0;
                for (int i = 0; i < w.kh; i++)
                    for (int j = 0; j < w.kw; j++) {
                        int iy = oy * w.sh - w.ph + i, ix = ox * w.sw - w.pw + j;
                        if (iy < 0 || iy >= PH || ix < 0 || ix >= PW)
                            continue;
                        float v = xn[(pl * PH + iy) * PW + ix] - 1.5f;
                        if (at < 0 || v > best || isnan(v))
                            best = v, at = iy * PW + ix;
                    }
                if (best > 0)
                    ref[pl * PH * PW + at] += dy[ox];
            }
    for (int i = 0; i < PN * PC * PH * PW; i++)
        *bad += pg[i] != ref[i];
    loom_graph_free(g);
}

TEST(pool_matches_naive_loops) {
    enum { N = PN, C = PC, H = PH, W = PW }; /* 19 windows a row: 16 + 3 on the AVX-512 path */
    /* (stride 1, 2 and 3 along the rows: the vector kernel's load, split and gather; 7 x 37:
     * 259 places, more than codes hold) */
    const loom_window wins[] = {{2, 2, 2, 2, 0, 0}, {3, 3, 2, 2, 1, 1}, {3, 2, 1, 2, 1, 0},
                                {2, 3, 2, 1, 1, 1}, {3, 3, 3, 3, 1, 1}, {7, 37, 1, 2, 3, 0}};
    enum { NW = sizeof wins / sizeof *wins };
    float x[C * N * H * W], xn[N * C * H * W], dy[N * C * H * W];
    for (int i = 0; i < C * N * H * W; i++)
        x[i] = (float)(int)test_rand(6, (uint64_t)i, 0, 4);
    x[17] = x[100] = x[2 * W + 33] = NAN;
    for (int i = 0; i < C * N * H * W; i++) /* x as (N,C,H,W) */
        xn[i] = x[((i / (H * W) % C) * N + i / (C * H * W)) * H * W + i % (H * W)];
    for (int i = 0; i < N * C * H * W; i++)
        dy[i] = (float)(int)test_rand(7, (uint64_t)i, -8, 8) / 8; /* sums are exact */
    for (size_t wi = 0; wi < 3 * NW; wi++) {
        const loom_window w = wins[wi % NW];
        bool hw = wi >= NW && wi < 2 * NW; /* stored (N,C,W,H): strided rows */
        bool plain = wi >= 2 * NW;         /* stored (N,C,H,W) */
        int bad_relu = 0;
        int OH = (H + 2 * w.ph - w.kh) / w.sh + 1, OW = (W + 2 * w.pw - w.kw) / w.sw + 1;
        loom_graph *g = loom_graph_new(NULL);
        int64_t sx[4] = {C, N, H, W}, sy[4] = {N, C, OH, OW}, sxt[4] = {N, C, W, H};
        static const int perm[4] = {1, 0, 2, 3}; /* x stored (C,N,H,W), used as (N,C,H,W) */
        static const int perm_hw[4] = {0, 1, 3, 2};
        int64_t sn[4] = {N, C, H, W};
        loom_tensor *tx = plain ? loom_input(g, LOOM_F32, 4, sn, xn)
                          : hw  ? loom_permute(g, loom_input(g, LOOM_F32, 4, sxt, x), perm_hw)
                                : loom_permute(g, loom_input(g, LOOM_F32, 4, sx, x), perm);
        loom_tensor *y = loom_pool_max(g, tx, w);
        loom_tensor *dx = loom_pool_max_grad(g, tx, loom_input(g, LOOM_F32, 4, sy, dy), w);
        /* a ReLU of a pooling, which the pooling computes itself (over x - 1.5: negatives) */
        loom_tensor *ry =
            loom_relu(g, loom_pool_max(g, loom_sub(g, tx, loom_scalar(g, 1.5, LOOM_F32)), w));
        loom_output(y), loom_output(dx), loom_output(ry);
        ASSERT_EQ(loom_graph_run(g), LOOM_OK);
        const float *py = loom_tensor_data(y), *pdx = loom_tensor_data(dx);
        const float *pry = loom_tensor_data(ry);
        float ref_dx[N * C * H * W] = {0};
        for (int n = 0; n < N; n++)
            for (int c = 0; c < C; c++)
                for (int oy = 0; oy < OH; oy++)
                    for (int ox = 0; ox < OW; ox++) {
                        int at = -1;
                        float best = 0;
                        for (int i = 0; i < w.kh; i++)
                            for (int j = 0; j < w.kw; j++) {
                                int iy = oy * w.sh - w.ph + i, ix = ox * w.sw - w.pw + j;
                                if (iy < 0 || iy >= H || ix < 0 || ix >= W)
                                    continue;
                                float v = hw ? x[((n * C + c) * W + ix) * H + iy]
                                             : x[((c * N + n) * H + iy) * W + ix];
                                if (at < 0 || v > best || isnan(v))
                                    best = v, at = iy * W + ix;
                            }
                        int o = ((n * C + c) * OH + oy) * OW + ox;
                        float got = py[o];
                        if (!(got == best || (isnan(got) && isnan(best))))
                            FAILF("window %zu: y[%d] = %g, expected %g", wi, o, got, best);
                        float rb = best - 1.5f <= 0 ? 0 : best - 1.5f; /* NaN stays NaN */
                        if (!(pry[o] == rb || (isnan(pry[o]) && isnan(rb))))
                            FAILF("window %zu: relu(y - 1.5)[%d] = %g, expected %g", wi, o, pry[o],
                                  rb);
                        ref_dx[(n * C + c) * H * W + at] += dy[o];
                    }
        for (int i = 0; i < N * C * H * W; i++)
            if (pdx[i] != ref_dx[i])
                FAILF("window %zu: dx[%d] = %g, expected %g", wi, i, pdx[i], ref_dx[i]);
        if (plain) /* the ReLU's backward through the pooling's codes */
            check_relu_pool_grad(xn, dy, w, &bad_relu);
        if (bad_relu)
            FAILF("relu(pool_max(x - 1.5)): %d wrong gradient elements", bad_relu);
        int64_t sx2[4] = {N, C, H, W};
        loom_tensor *x2 = loom_input(g, LOOM_F32, 4, sx2, x);
        loom_requires_grad(x2);
        loom_tensor *dy2 = loom_input(g, LOOM_F32, 4, sy, dy);
        loom_tensor *twice = loom_sum_all(g, loom_pool_max_grad(g, x2, dy2, w));
        ASSERT(loom_grad(g, twice, x2) == NULL);
        ASSERT_STR_CONTAINS(loom_graph_error(g), "second derivative of max pooling");
        loom_graph_free(g);
    }
}

/* A window of more places than the codes hold (7 x 37 = 259) over values rising along the
 * rows, so that its last places win: the maxima and the gradient against naive loops. */
TEST(pool_of_a_large_window_matches_naive_loops) {
    enum { H = 9, W = 40, OH = (H + 6 - 7) / 1 + 1, OW = (W - 37) / 2 + 1 };
    const loom_window w = {7, 37, 1, 2, 3, 0};
    float x[H * W], dy[OH * OW];
    for (int i = 0; i < H * W; i++)
        x[i] = (float)i;
    for (int i = 0; i < OH * OW; i++)
        dy[i] = (float)(i + 1);
    loom_graph *g = loom_graph_new(NULL);
    int64_t sx[4] = {1, 1, H, W}, sy[4] = {1, 1, OH, OW};
    loom_tensor *tx = loom_input(g, LOOM_F32, 4, sx, x);
    loom_tensor *y = loom_pool_max(g, tx, w);
    loom_tensor *dx = loom_pool_max_grad(g, tx, loom_input(g, LOOM_F32, 4, sy, dy), w);
    loom_output(y), loom_output(dx);
    ASSERT_EQ(loom_graph_run(g), LOOM_OK);
    const float *py = loom_tensor_data(y), *pdx = loom_tensor_data(dx);
    float ref[H * W] = {0};
    int bad = 0;
    for (int oy = 0; oy < OH; oy++)
        for (int ox = 0; ox < OW; ox++) {
            int iy = oy + 3 < H - 1 ? oy + 3 : H - 1, ix = 2 * ox + 36; /* the last real place */
            bad += py[oy * OW + ox] != x[iy * W + ix];
            ref[iy * W + ix] += dy[oy * OW + ox];
        }
    for (int i = 0; i < H * W; i++)
        bad += pdx[i] != ref[i];
    loom_graph_free(g);
    ASSERT_EQ(bad, 0);
}

/* Small contiguous planes (conv2's 11 x 11; here 21 of them, a block of 16 and a ragged one),
 * pooled 16 windows at a time across planes, and their gradient a plane at a time from the codes:
 * relu(pool_max(x - 1.5)) and d/dx sum(relu(...) v) (v by window column; through a product, so
 * that the pool gradient takes the ReLU's mask from the codes too; with a product of v itself,
 * the where() computes the incoming gradient and is kept) against naive loops, ties and NaNs. */
static int check_small_planes(bool product) {
    enum { N = 3, C = 7, H = 11, W = 11, OH = 5, OW = 5 };
    static float x[N * C * H * W], v[OW], ry[N * C * OH * OW], rdx[N * C * H * W];
    memset(rdx, 0, sizeof rdx);
    for (int i = 0; i < N * C * H * W; i++)
        x[i] = (float)(int)test_rand(21, (uint64_t)i, 0, 4);
    x[5] = x[400] = x[H * W * 20 + 3] = NAN;
    for (int i = 0; i < OW; i++)
        v[i] = (float)(int)test_rand(22, (uint64_t)i, -8, 8) / 8;
    loom_graph *g = loom_graph_new(NULL);
    int64_t sx[4] = {N, C, H, W}, sv[2] = {OW, 1}, s2[2] = {N * C * OH, OW}, sb[4] = {N, C, OH, OW};
    loom_tensor *tx = loom_input(g, LOOM_F32, 4, sx, x);
    loom_requires_grad(tx);
    loom_tensor *r = loom_relu(g, loom_pool_max(g, loom_sub(g, tx, loom_scalar(g, 1.5, LOOM_F32)),
                                                (loom_window){2, 2, 2, 2, 0, 0}));
    loom_tensor *tv = loom_input(g, LOOM_F32, 2, sv, v);
    loom_tensor *loss =
        loom_sum_all(g, product ? loom_matmul(g, loom_reshape(g, r, 2, s2), tv)
                                : loom_mul(g, r,
                                           loom_expand(g,
                                                       loom_reshape(g, loom_transpose(g, tv), 4,
                                                                    (int64_t[4]){1, 1, 1, OW}),
                                                       4, sb)));
    loom_tensor *gx = loom_grad(g, loss, tx);
    loom_output(r), loom_output(gx);
    if (loom_graph_run(g) != LOOM_OK) {
        loom_graph_free(g);
        return 1;
    }
    for (int pl = 0; pl < N * C; pl++)
        for (int oy = 0; oy < OH; oy++)
            for (int ox = 0; ox < OW; ox++) {
                int at = -1, o = (pl * OH + oy) * OW + ox;
                float best = 0;
                for (int i = 0; i < 2; i++)
                    for (int j = 0; j < 2; j++) {
                        int k = (pl * H + 2 * oy + i) * W + 2 * ox + j;
                        float e = x[k] - 1.5f;
                        if (at < 0 || e > best || isnan(e))
                            best = e, at = k;
                    }
                ry[o] = best <= 0 ? 0 : best;
                if (best > 0)
                    rdx[at] += v[ox];
            }
    const float *py = loom_tensor_data(r), *pdx = loom_tensor_data(gx);
    int bad = 0;
    for (int i = 0; i < N * C * OH * OW; i++)
        bad += !(py[i] == ry[i] || (isnan(py[i]) && isnan(ry[i])));
    for (int i = 0; i < N * C * H * W; i++)
        bad += pdx[i] != rdx[i];
    loom_graph_free(g);
    return bad;
}

TEST(pool_small_planes_match_naive_loops) {
    ASSERT_EQ(check_small_planes(true), 0);
    ASSERT_EQ(check_small_planes(false), 0);
}

/* Reductions along long contiguous rows (the lanes-and-tree path, with a ragged tail) against a
 * double-precision sum and an exact max; a NaN anywhere in a row wins its max. */
TEST(long_reductions_match_naive) {
    enum { R = 3, L = 1000 + 7 };
    static float x[R * L];
    for (int i = 0; i < R * L; i++)
        x[i] = (float)test_rand(8, (uint64_t)i, -1, 1);
    x[L + 500] = NAN;
    int64_t s[2] = {R, L};
    loom_graph *g = loom_graph_new(NULL);
    loom_tensor *tx = loom_input(g, LOOM_F32, 2, s, x);
    loom_tensor *sum = loom_sum(g, tx, 1), *max = loom_max(g, tx, 1);
    loom_output(sum), loom_output(max);
    ASSERT_EQ(loom_graph_run(g), LOOM_OK);
    const float *ps = loom_tensor_data(sum), *pm = loom_tensor_data(max);
    for (int r = 0; r < R; r++) {
        double ref = 0, abs = 0;
        float mx = -INFINITY;
        for (int k = 0; k < L; k++)
            ref += x[r * L + k], abs += fabs(x[r * L + k]), mx = fmaxf(mx, x[r * L + k]);
        if (r != 1)
            ASSERT_NEAR(ps[r], ref, 1e-6 * abs);
        if (r == 1)
            ASSERT(isnan(ps[r]) && isnan(pm[r]));
        else
            ASSERT(pm[r] == mx);
    }
    loom_graph_free(g);
}

TEST(forward_only_ops) {
    float a[6] = {1, 5, 5, -2, 3, 3}, b[6] = {1, 4, 6, -2, 3, 4};
    int32_t idx[3] = {2, 0, 1};
    int64_t s[2] = {2, 3}, si[1] = {3};
    loom_graph *g = loom_graph_new(NULL);
    loom_tensor *ta = loom_input(g, LOOM_F32, 2, s, a), *tb = loom_input(g, LOOM_F32, 2, s, b);
    loom_tensor *gt = loom_cmpgt(g, ta, tb), *eq = loom_cmpeq(g, ta, tb);
    loom_tensor *mm = loom_maxmask(g, ta, 1),
                *oh = loom_onehot(g, loom_input(g, LOOM_I32, 1, si, idx), 3, LOOM_F32);
    loom_tensor *k = loom_add(g, ta, loom_scalar(g, 0.5, LOOM_F32));
    loom_output(gt), loom_output(eq), loom_output(mm), loom_output(oh), loom_output(k);
    ASSERT_EQ(loom_graph_run(g), LOOM_OK);
    const float *pg = loom_tensor_data(gt), *pe = loom_tensor_data(eq), *pm = loom_tensor_data(mm);
    const float *po = loom_tensor_data(oh), *pk = loom_tensor_data(k);
    for (int i = 0; i < 6; i++) {
        ASSERT(pg[i] == (a[i] > b[i] ? 1.0f : 0.0f));
        ASSERT(pe[i] == (a[i] == b[i] ? 1.0f : 0.0f));
        ASSERT(pk[i] == a[i] + 0.5f);
    }
    const float mask[6] = {0, 1, 0, 0, 1, 0}; /* first maximum of each row */
    for (int i = 0; i < 6; i++)
        ASSERT(pm[i] == mask[i]);
    for (int r = 0; r < 3; r++)
        for (int c = 0; c < 3; c++)
            ASSERT(po[r * 3 + c] == (c == idx[r] ? 1.0f : 0.0f));
    idx[1] = 7; /* out of range: the run fails with a clear message */
    ASSERT_EQ(loom_graph_run(g), LOOM_ERANGE);
    ASSERT_STR_CONTAINS(loom_last_error(), "index 7 at position 1");
    loom_graph_free(g);
}

/* The worst distance in ulp of op over x[0, n) (float32, graph/opmath.h's) from ref in double,
 * its values into y (n + extra of them: x's extra values after n). */
static double worst_ulp(loom_tensor *(*op)(loom_graph *, loom_tensor *), double (*ref)(double),
                        const float *x, int n, int extra, float *y) {
    int64_t s[1] = {n + extra};
    loom_graph *g = loom_graph_new(NULL);
    loom_tensor *t = op(g, loom_input(g, LOOM_F32, 1, s, x));
    loom_output(t);
    if (loom_graph_run(g) != LOOM_OK) {
        loom_graph_free(g);
        return INFINITY;
    }
    memcpy(y, loom_tensor_data(t), sizeof(float) * (size_t)(n + extra));
    loom_graph_free(g);
    double worst = 0;
    for (int i = 0; i < n; i++) {
        double r = ref((double)x[i]);
        float f = (float)r;
        double ulp = nextafterf(fabsf(f), INFINITY) - fabsf(f);
        worst = fmax(worst, fabs(y[i] - r) / ulp);
    }
    return worst;
}

/* erf in float32 (graph/opmath.h's rational function, not libm's) within one ulp of the double
 * erf over [-6, 6] and tiny values, exactly +-1 beyond 4, NaN for NaN. */
TEST(float_erf_is_faithful) {
    enum { N = 240001 };
    static float x[N + 8], y[N + 8];
    for (int i = 0; i < N; i++)
        x[i] = (float)(-6.0 + 12.0 * i / (N - 1));
    float extra[8] = {1e-30f, -1e-20f, 1e-7f, 3e-4f, 4.0f, 17.0f, -INFINITY, NAN};
    memcpy(x + N, extra, sizeof extra);
    double worst = worst_ulp(loom_erf, erf, x, N + 7, 1, y);
    fprintf(stderr, "float erf: at most %.3f ulp from erf\n", worst);
    ASSERT(worst <= 1.0);
    ASSERT(y[N + 5] == 1.0f && y[N + 6] == -1.0f && isnan(y[N + 7]));
}

/* tanh in float32 (graph/opmath.h's, not libm's) within one ulp of the double tanh over [-12,
 * 12] (both sides of 0.625, where it changes method) and tiny values, exactly +-1 beyond 10, -0 for
 * -0, NaN for NaN. */
TEST(float_tanh_is_faithful) {
    enum { N = 480001 };
    static float x[N + 9], y[N + 9];
    for (int i = 0; i < N; i++)
        x[i] = (float)(-12.0 + 24.0 * i / (N - 1));
    float extra[9] = {1e-30f, -1e-20f, 1e-7f, 3e-4f, 0.625f, 10.0f, -INFINITY, -0.0f, NAN};
    memcpy(x + N, extra, sizeof extra);
    double worst = worst_ulp(loom_tanh, tanh, x, N + 7, 2, y);
    fprintf(stderr, "float tanh: at most %.3f ulp from tanh\n", worst);
    ASSERT(worst <= 1.0);
    ASSERT(y[N + 5] == 1.0f && y[N + 6] == -1.0f && y[N + 7] == 0.0f && signbit(y[N + 7]) &&
           isnan(y[N + 8]));
}

/* exp in float32 (graph/opmath.h's, not libm's) within one ulp of the double exp from -104 to
 * 88.7 (denormal results too), exactly 1 at 0, 0 and infinity beyond, NaN for NaN. */
TEST(float_exp_is_faithful) {
    enum { N = 400001 };
    static float x[N + 6], y[N + 6];
    for (int i = 0; i < N; i++)
        x[i] = (float)(-104.0 + 192.7 * i / (N - 1));
    float extra[6] = {0.0f, -200.0f, 200.0f, -INFINITY, INFINITY, NAN};
    memcpy(x + N, extra, sizeof extra);
    double worst = worst_ulp(loom_exp, exp, x, N, 6, y);
    fprintf(stderr, "float exp: at most %.3f ulp from exp\n", worst);
    ASSERT(worst <= 1.0);
    ASSERT(y[N] == 1.0f && y[N + 1] == 0.0f && isinf(y[N + 2]) && y[N + 3] == 0.0f &&
           isinf(y[N + 4]) && isnan(y[N + 5]));
}

/* GELU against its definition and layer normalization against naive loops, in float32 (the
 * reference in double), odd sizes; bad shapes are one clear error. */
TEST(gelu_and_layer_norm_match_naive) {
    enum { R = 5, N = 37 };
    static float x[R * N], w[N], bias[N];
    for (int i = 0; i < R * N; i++)
        x[i] = (float)test_rand(61, (uint64_t)i, -4, 4);
    for (int i = 0; i < N; i++)
        w[i] = (float)test_rand(62, (uint64_t)i, 0.5, 2),
        bias[i] = (float)test_rand(63, (uint64_t)i, -1, 1);
    int64_t s[2] = {R, N}, sn[1] = {N};
    loom_graph *g = loom_graph_new(NULL);
    loom_tensor *tx = loom_input(g, LOOM_F32, 2, s, x);
    loom_tensor *ge = loom_gelu(g, tx);
    loom_tensor *ln = loom_layer_norm(g, tx, loom_input(g, LOOM_F32, 1, sn, w),
                                      loom_input(g, LOOM_F32, 1, sn, bias), 1e-5);
    loom_output(ge), loom_output(ln);
    ASSERT_EQ(loom_graph_run(g), LOOM_OK);
    const float *pg = loom_tensor_data(ge), *pl = loom_tensor_data(ln);
    for (int r = 0; r < R; r++) {
        double mean = 0, var = 0;
        for (int i = 0; i < N; i++)
            mean += x[r * N + i] / (double)N;
        for (int i = 0; i < N; i++)
            var += (x[r * N + i] - mean) * (x[r * N + i] - mean) / N;
        for (int i = 0; i < N; i++) {
            double v = x[r * N + i];
            ASSERT_NEAR(pg[r * N + i], 0.5 * v * (1 + erf(v / sqrt(2.0))), 1e-6 * (1 + fabs(v)));
            double ref = (v - mean) / sqrt(var + 1e-5) * w[i] + bias[i];
            ASSERT_NEAR(pl[r * N + i], ref, 1e-5 * (1 + fabs(ref)));
        }
    }
    loom_graph_free(g);
    g = loom_graph_new(NULL);
    int64_t s4[1] = {4};
    ASSERT(!loom_layer_norm(g, tx = loom_input(g, LOOM_F32, 2, s, x),
                            loom_input(g, LOOM_F32, 1, s4, w), NULL, 1e-5));
    ASSERT_EQ(loom_graph_run(g), LOOM_ESHAPE);
    ASSERT_STR_CONTAINS(loom_last_error(),
                        "loom_layer_norm: input (5,37) and weight (4), expected (..., N) and (N)");
    loom_graph_free(g);
    g = loom_graph_new(NULL);
    int32_t ix[4] = {0};
    ASSERT(!loom_layer_norm(g, loom_input(g, LOOM_I32, 1, s4, ix), NULL, NULL, 1e-5));
    ASSERT_STR_CONTAINS(loom_graph_error(g),
                        "loom_layer_norm: input dtype i32, expected f32 or f64");
    loom_graph_free(g);
}

/* GELU's gradient in float32 (dy GELUD: erf and exp evaluated in float, graph/opmath.h) against
 * its definition in double over [-6, 6] and 0, within 4 units of 2^-24 (|x| + 1) |dy|; its own
 * gradient (a second derivative) is refused with a clear error. */
TEST(gelu_gradient_in_float_matches_its_definition) {
    enum { N = 4801 };
    static float x[N], dy[N];
    for (int i = 0; i < N; i++)
        x[i] = (float)(-6.0 + 12.0 * i / (N - 1)), dy[i] = (float)test_rand(65, (uint64_t)i, -2, 2);
    int64_t s[1] = {N};
    loom_graph *g = loom_graph_new(NULL);
    loom_tensor *tx = loom_input(g, LOOM_F32, 1, s, x);
    loom_requires_grad(tx);
    loom_tensor *loss =
        loom_sum_all(g, loom_mul(g, loom_gelu(g, tx), loom_input(g, LOOM_F32, 1, s, dy)));
    loom_tensor *gx = loom_grad(g, loss, tx);
    loom_output(gx);
    ASSERT_EQ(loom_graph_run(g), LOOM_OK);
    const float *pg = loom_tensor_data(gx);
    double worst = 0;
    for (int i = 0; i < N; i++) {
        double v = x[i];
        double ref =
            dy[i] * (0.5 * (1 + erf(v / sqrt(2.0))) + v * exp(-0.5 * v * v) * 0.39894228040143268);
        worst = fmax(worst, fabs(pg[i] - ref) / (0x1p-24 * (1 + fabs(v)) * fabs(dy[i])));
    }
    fprintf(stderr, "float GELU gradient: within %.2f units of 2^-24 (1 + |x|) |dy|\n", worst);
    ASSERT(worst <= 4.0);
    ASSERT(loom_grad(g, loom_sum_all(g, gx), tx) == NULL);
    ASSERT_STR_CONTAINS(loom_graph_error(g), "the gradient of GELU's derivative (a second "
                                             "derivative of GELU) is not supported");
    loom_graph_free(g);
}

/* Layer normalization of rows that are not contiguous (a transpose's, 37 rows of 5, strided
 * 37 apart) against naive loops; its second derivative is refused with a clear error. */
TEST(layer_norm_of_strided_rows_and_its_second_derivative) {
    enum { R = 5, N = 37 };
    static float x[R * N];
    for (int i = 0; i < R * N; i++)
        x[i] = (float)test_rand(64, (uint64_t)i, -3, 3);
    int64_t s[2] = {R, N};
    loom_graph *g = loom_graph_new(NULL);
    loom_tensor *tx = loom_input(g, LOOM_F32, 2, s, x);
    loom_tensor *ln = loom_layer_norm(g, loom_transpose(g, tx), NULL, NULL, 1e-5); /* (N, R) */
    loom_output(ln);
    ASSERT_EQ(loom_graph_run(g), LOOM_OK);
    const float *pl = loom_tensor_data(ln);
    for (int r = 0; r < N; r++) {
        double mean = 0, var = 0;
        for (int i = 0; i < R; i++)
            mean += x[i * N + r] / (double)R;
        for (int i = 0; i < R; i++)
            var += (x[i * N + r] - mean) * (x[i * N + r] - mean) / R;
        for (int i = 0; i < R; i++)
            ASSERT_NEAR(pl[r * R + i], (x[i * N + r] - mean) / sqrt(var + 1e-5), 1e-5);
    }
    loom_graph_free(g);
    g = loom_graph_new(NULL);
    tx = loom_input(g, LOOM_F32, 2, s, x);
    loom_requires_grad(tx);
    loom_tensor *gx = loom_grad(
        g, loom_sum_all(g, loom_mul(g, loom_layer_norm(g, tx, NULL, NULL, 1e-5), tx)), tx);
    ASSERT(gx != NULL);
    ASSERT(loom_grad(g, loom_sum_all(g, gx), tx) == NULL);
    ASSERT_STR_CONTAINS(loom_graph_error(g), "second derivative of loom_layer_norm");
    loom_graph_free(g);
}

/* A float sum in the row kernels' documented order: element j into lane j % 16, the lanes
 * folded 8, 4, 2 and 1 apart. */
static float lane16_sum(const float *x, int n) {
    float l[16] = {0};
    for (int j = 0; j < n; j++)
        l[j % 16] += x[j];
    for (int w = 8; w >= 1; w /= 2)
        for (int j = 0; j < w; j++)
            l[j] += l[j + w];
    return l[0];
}

/* LayerNorm's forward and gradient, bit for bit, against naive loops in the documented order
 * (sums in 16 lanes; rstd = 1 / sqrt(var + eps); gx = rstd ((gy - mean gy) - xhat mean(gy
 * xhat))): the same values from every build of the rows (plain, AVX2, AVX-512), rows of any
 * length. */
TEST(layer_norm_rows_in_their_documented_order) {
    enum { R = 6, NMAX = 130 };
    static const int ns[] = {5, 16, 37, 128, 130};
    static float x[R * NMAX], c[R * NMAX], d[NMAX], t[NMAX];
    for (size_t q = 0; q < sizeof ns / sizeof *ns; q++) {
        int n = ns[q];
        for (int i = 0; i < R * n; i++)
            x[i] = (float)test_rand(66, (uint64_t)i, -3, 5),
            c[i] = (float)test_rand(67, (uint64_t)i, -1, 1);
        int64_t s[2] = {R, n};
        loom_graph *g = loom_graph_new(NULL);
        loom_tensor *tx = loom_input(g, LOOM_F32, 2, s, x);
        loom_requires_grad(tx);
        loom_tensor *y = loom_layer_norm(g, tx, NULL, NULL, 1e-5);
        loom_tensor *gx =
            loom_grad(g, loom_sum_all(g, loom_mul(g, y, loom_input(g, LOOM_F32, 2, s, c))), tx);
        loom_output(y), loom_output(gx);
        ASSERT_EQ(loom_graph_run(g), LOOM_OK);
        const float *py = loom_tensor_data(y), *pg = loom_tensor_data(gx);
        int wrong = 0;
        for (int r = 0; r < R; r++) {
            const float *xr = x + r * n, *cr = c + r * n;
            float mean = lane16_sum(xr, n) / (float)n;
            for (int j = 0; j < n; j++)
                d[j] = xr[j] - mean, t[j] = d[j] * d[j];
            float rstd = 1.0f / sqrtf(lane16_sum(t, n) / (float)n + (float)1e-5);
            for (int j = 0; j < n; j++)
                d[j] *= rstd, wrong += py[r * n + j] != d[j];
            float gm = lane16_sum(cr, n) / (float)n;
            for (int j = 0; j < n; j++)
                t[j] = cr[j] * d[j];
            float dm = lane16_sum(t, n) / (float)n;
            for (int j = 0; j < n; j++)
                wrong += pg[r * n + j] != rstd * (cr[j] - gm - d[j] * dm);
        }
        if (wrong)
            FAILF("rows of %d: %d of %d values differ from the documented order", n, wrong,
                  2 * R * n);
        loom_graph_free(g);
    }
}

/* Zero padding of a strided input against its definition, cropping it back, and bad sizes. */
TEST(pad2d_and_crop2d_match_naive) {
    enum { A = 2, H = 3, W = 4, YP = 1, XP = 2 };
    static float x[A * W * H];
    for (int i = 0; i < A * W * H; i++)
        x[i] = (float)test_rand(65, (uint64_t)i, -1, 1);
    int64_t s[3] = {A, W, H};
    loom_graph *g = loom_graph_new(NULL);
    loom_tensor *xt = loom_transpose(g, loom_input(g, LOOM_F32, 3, s, x)); /* (A, H, W) */
    loom_tensor *pd = loom_pad2d(g, xt, YP, XP), *back = loom_crop2d(g, pd, YP, XP);
    loom_output(pd), loom_output(back);
    ASSERT_EQ(loom_graph_run(g), LOOM_OK);
    ASSERT(loom_tensor_shape(pd)[1] == H + 2 * YP && loom_tensor_shape(pd)[2] == W + 2 * XP);
    const float *pp = loom_tensor_data(pd), *pb = loom_tensor_data(back);
    for (int a = 0; a < A; a++)
        for (int i = 0; i < H + 2 * YP; i++)
            for (int j = 0; j < W + 2 * XP; j++) {
                bool in = i >= YP && i < H + YP && j >= XP && j < W + XP;
                float want = in ? x[(a * W + j - XP) * H + i - YP] : 0.0f;
                ASSERT(pp[(a * (H + 2 * YP) + i) * (W + 2 * XP) + j] == want);
            }
    for (int a = 0; a < A; a++)
        for (int i = 0; i < H; i++)
            for (int j = 0; j < W; j++)
                ASSERT(pb[(a * H + i) * W + j] == x[(a * W + j) * H + i]);
    loom_graph_free(g);
    g = loom_graph_new(NULL);
    xt = loom_input(g, LOOM_F32, 3, s, x);
    ASSERT(!loom_crop2d(g, xt, 3, 1));
    ASSERT_STR_CONTAINS(loom_graph_error(g), "loom_crop2d: input (2,4,3) by 3, 1; expected");
    loom_graph_free(g);
    g = loom_graph_new(NULL);
    ASSERT(!loom_pad2d(g, loom_input(g, LOOM_F32, 3, s, x), -1, 0));
    ASSERT_STR_CONTAINS(loom_graph_error(g), "loom_pad2d: input (2,4,3) by -1, 0; expected");
    loom_graph_free(g);
}

/* Gather and scatter-add against naive loops (a transposed table: strided rows), a causal
 * mask under a softmax (rows sum to 1, nothing after the diagonal), and an index out of range
 * failing the step with its position. */
TEST(gather_scatter_and_causal_mask_match_naive) {
    enum { V = 7, D = 5, N = 11, T = 4 };
    static float tab[D * V], rows[N * D], rows_t[D * N], sc[T * T];
    static int32_t idx[N];
    for (int i = 0; i < D * V; i++)
        tab[i] = (float)test_rand(71, (uint64_t)i, -1, 1);
    for (int i = 0; i < N * D; i++)
        rows[i] = (float)test_rand(72, (uint64_t)i, -1, 1), rows_t[i % D * N + i / D] = rows[i];
    for (int i = 0; i < T * T; i++)
        sc[i] = (float)test_rand(73, (uint64_t)i, -3, 3);
    for (int i = 0; i < N; i++)
        idx[i] = (int32_t)((i * 5 + 2) % V);
    int64_t st[2] = {D, V}, sr[2] = {N, D}, srt[2] = {D, N}, si[1] = {N}, ss[2] = {T, T};
    loom_graph *g = loom_graph_new(NULL);
    loom_tensor *ti = loom_input(g, LOOM_I32, 1, si, idx);
    loom_tensor *ga = loom_gather(g, loom_transpose(g, loom_input(g, LOOM_F32, 2, st, tab)), ti);
    loom_tensor *sa = loom_scatter_add(g, loom_input(g, LOOM_F32, 2, sr, rows), ti, V);
    /* the same rows read through a transpose (strided: element by element) */
    loom_tensor *st2 =
        loom_scatter_add(g, loom_transpose(g, loom_input(g, LOOM_F32, 2, srt, rows_t)), ti, V);
    loom_tensor *sm =
        loom_softmax(g, loom_causal_mask(g, loom_input(g, LOOM_F32, 2, ss, sc), -INFINITY), 1);
    loom_output(ga), loom_output(sa), loom_output(st2), loom_output(sm);
    ASSERT_EQ(loom_graph_run(g), LOOM_OK);
    const float *pg = loom_tensor_data(ga), *ps = loom_tensor_data(sa), *pm = loom_tensor_data(sm);
    const float *ps2 = loom_tensor_data(st2);
    for (int r = 0; r < N; r++)
        for (int j = 0; j < D; j++)
            ASSERT(pg[r * D + j] == tab[j * V + idx[r]]);
    for (int v = 0; v < V; v++)
        for (int j = 0; j < D; j++) {
            float want = 0;
            for (int r = 0; r < N; r++)
                if (idx[r] == v)
                    want += rows[r * D + j];
            ASSERT(ps[v * D + j] == want && ps2[v * D + j] == want);
        }
    for (int i = 0; i < T; i++) {
        double sum = 0;
        for (int j = 0; j < T; j++) {
            sum += pm[i * T + j];
            if (j > i)
                ASSERT(pm[i * T + j] == 0.0f);
        }
        ASSERT_NEAR(sum, 1.0, 1e-6);
    }
    idx[3] = V; /* out of range: the step fails naming the position */
    ASSERT_EQ(loom_graph_run(g), LOOM_ERANGE);
    ASSERT_STR_CONTAINS(loom_last_error(), "index 7 at position 3 is outside [0, 7)");
    loom_graph_free(g);
}

/* Naive attention of head (b, h) in double: y (T x D) and, for the output gradient gy, the
 * gradient gx (T x 3 x D: dq, dk, dv) from the definition. x(t, c, d) at x[t * xt + c * xc + d]. */
static void naive_attention(const float *x, int64_t xt, int64_t xc, const float *gy, int64_t gt,
                            int64_t T, int64_t D, bool causal, double *y, double *gx) {
    double *P = calloc((size_t)(T * T), sizeof(double)), *dS = calloc((size_t)(T * T), 8);
    double sc = 1 / sqrt((double)D);
    for (int64_t i = 0; i < T; i++) {
        double mx = -INFINITY, sum = 0;
        int64_t lim = causal ? i + 1 : T;
        for (int64_t j = 0; j < lim; j++) {
            double d = 0;
            for (int64_t e = 0; e < D; e++)
                d += (double)x[i * xt + e] * x[j * xt + xc + e];
            P[i * T + j] = d * sc, mx = fmax(mx, d * sc);
        }
        for (int64_t j = 0; j < lim; j++)
            sum += P[i * T + j] = exp(P[i * T + j] - mx);
        for (int64_t j = 0; j < lim; j++)
            P[i * T + j] /= sum;
        for (int64_t e = 0; e < D; e++) {
            double a = 0;
            for (int64_t j = 0; j < lim; j++)
                a += P[i * T + j] * x[j * xt + 2 * xc + e];
            y[i * D + e] = a;
        }
        double dot = 0;
        for (int64_t j = 0; j < lim; j++) {
            double d = 0;
            for (int64_t e = 0; e < D; e++)
                d += (double)gy[i * gt + e] * x[j * xt + 2 * xc + e];
            dS[i * T + j] = d, dot += d * P[i * T + j];
        }
        for (int64_t j = 0; j < lim; j++)
            dS[i * T + j] = P[i * T + j] * (dS[i * T + j] - dot) * sc;
    }
    memset(gx, 0, sizeof(double) * (size_t)(T * 3 * D));
    for (int64_t i = 0; i < T; i++)
        for (int64_t j = 0; j < T; j++)
            for (int64_t e = 0; e < D; e++) {
                gx[i * 3 * D + e] += dS[i * T + j] * x[j * xt + xc + e];
                gx[j * 3 * D + D + e] += dS[i * T + j] * x[i * xt + e];
                gx[j * 3 * D + 2 * D + e] += P[i * T + j] * gy[i * gt + e];
            }
    free(P), free(dS);
}

/* loom_attention in float32 and its gradient (loom_grad of sum(y w)) against the naive loops:
 * causal and not; T across the 16-row blocks and the 64-column tiles, D across the 16-lane
 * vectors (1, odd, 16, 33, 70); qkv contiguous, as a projection gives it, and as a permuted view
 * of (3, B, T, H, D) (other strides). */
TEST(attention_matches_naive_loops) {
    const int64_t shapes[][4] = {{1, 1, 1, 1},   {2, 3, 2, 5},   {1, 16, 1, 16}, {1, 17, 3, 33},
                                 {2, 64, 2, 32}, {1, 70, 1, 70}, {1, 130, 2, 8}};
    for (size_t c = 0; c < sizeof shapes / sizeof *shapes * 4; c++) {
        int64_t B = shapes[c / 4][0], T = shapes[c / 4][1], H = shapes[c / 4][2],
                D = shapes[c / 4][3];
        bool causal = c & 1, permuted = c & 2;
        int64_t n = B * T * 3 * H * D, ny = B * T * H * D;
        float *x = malloc(sizeof(float) * (size_t)n), *w = malloc(sizeof(float) * (size_t)ny);
        double *y = malloc(sizeof(double) * (size_t)(T * D)),
               *gx = malloc(sizeof(double) * (size_t)(T * 3 * D));
        test_fill(x, n, 90 + c, -2, 2);
        test_fill(w, ny, 91, -1, 1);
        loom_graph *g = loom_graph_new(NULL);
        int64_t sx[5] = {B, T, 3, H, D}, sp[5] = {3, B, T, H, D}, sy[4] = {B, T, H, D};
        loom_tensor *in = loom_input(g, LOOM_F32, 5, permuted ? sp : sx, x);
        loom_requires_grad(in);
        loom_tensor *qkv = permuted ? loom_permute(g, in, (int[]){1, 2, 0, 3, 4}) : in;
        loom_tensor *out = loom_attention(g, qkv, causal);
        loom_tensor *loss = loom_sum_all(g, loom_mul(g, out, loom_input(g, LOOM_F32, 4, sy, w)));
        loom_tensor *grad = loom_grad(g, loss, in);
        loom_output(out), loom_output(grad);
        ASSERT_EQ(loom_graph_run(g), LOOM_OK);
        const float *po = loom_tensor_data(out), *pg = loom_tensor_data(grad);
        /* element (b, t, c, h, d) of qkv, and of its gradient (laid out as the input) */
        int64_t st = permuted ? H * D : 3 * H * D, scs = permuted ? B * T * H * D : H * D;
        int64_t sb = T * st;
        int bad = 0;
        for (int64_t b = 0; b < B; b++)
            for (int64_t h = 0; h < H; h++) {
                const float *xh = x + b * sb + h * D, *gh = w + (b * T * H + h) * D;
                naive_attention(xh, st, scs, gh, H * D, T, D, causal, y, gx);
                double tol = 2e-6 * sqrt((double)(T + D));
                for (int64_t t = 0; t < T; t++)
                    for (int64_t e = 0; e < D; e++) {
                        bad += !(fabs(po[((b * T + t) * H + h) * D + e] - y[t * D + e]) <=
                                 tol * fmax(1, fabs(y[t * D + e])));
                        for (int k = 0; k < 3; k++) {
                            double want = gx[t * 3 * D + k * D + e];
                            bad += !(fabs(pg[b * sb + t * st + k * scs + h * D + e] - want) <=
                                     tol * fmax(1, fabs(want)));
                        }
                    }
            }
        if (bad)
            FAILF("B %lld T %lld H %lld D %lld, causal %d, permuted %d: %d wrong elements",
                  (long long)B, (long long)T, (long long)H, (long long)D, causal, permuted, bad);
        loom_graph_free(g);
        free(x), free(w), free(y), free(gx);
    }
}

/* Bad input: qkv of another rank, a middle axis other than 3, an integer dtype, an empty head;
 * a second derivative is refused. */
TEST(attention_refuses_bad_input) {
    static float x[2 * 3 * 3 * 2 * 4];
    int64_t s4[4] = {2, 3, 6, 4}, s5[5] = {2, 3, 2, 3, 4}, s0[5] = {2, 3, 3, 2, 0};
    loom_graph *g = loom_graph_new(NULL);
    ASSERT(!loom_attention(g, loom_input(g, LOOM_F32, 4, s4, x), true));
    ASSERT_STR_CONTAINS(loom_graph_error(g),
                        "loom_attention: qkv (2,3,6,4), expected (B, T, 3, H, D) of sizes >= 1");
    loom_graph_free(g);
    g = loom_graph_new(NULL);
    ASSERT(!loom_attention(g, loom_input(g, LOOM_F32, 5, s5, x), true));
    ASSERT_STR_CONTAINS(loom_graph_error(g), "qkv (2,3,2,3,4), expected (B, T, 3, H, D)");
    loom_graph_free(g);
    g = loom_graph_new(NULL);
    ASSERT(!loom_attention(g, loom_input(g, LOOM_F32, 5, s0, x), false));
    ASSERT_STR_CONTAINS(loom_graph_error(g), "qkv (2,3,3,2,0), expected");
    loom_graph_free(g);
    g = loom_graph_new(NULL);
    int64_t s[5] = {2, 3, 3, 2, 4};
    ASSERT(!loom_attention(g, loom_input(g, LOOM_I32, 5, s, x), true));
    ASSERT_STR_CONTAINS(loom_graph_error(g), "loom_attention: dtype i32 of input 0");
    loom_graph_free(g);
    g = loom_graph_new(NULL);
    loom_tensor *tx = loom_input(g, LOOM_F32, 5, s, x);
    loom_requires_grad(tx);
    loom_tensor *gx = loom_grad(g, loom_sum_all(g, loom_attention(g, tx, true)), tx);
    ASSERT(gx != NULL);
    ASSERT(loom_grad(g, loom_sum_all(g, loom_mul(g, gx, gx)), tx) == NULL);
    ASSERT_STR_CONTAINS(loom_graph_error(g), "second derivative of loom_attention");
    loom_graph_free(g);
}

/* Dropout drops about p of the elements, scales the others by 1 / (1 - p) exactly, repeats for
 * the same key and changes with the step; on 2 devices each shard draws its own global rows, so
 * the batch's result is the one device's. */
TEST(dropout_is_keyed_by_position) {
    enum { R = 64, N = 100 };
    static float x[R * N], out1[R * N], out2[R * N];
    int32_t key[4] = {11, 0, 5, 0};
    for (int i = 0; i < R * N; i++)
        x[i] = (float)test_rand(81, (uint64_t)i, 0.5, 1);
    int64_t s[2] = {R, N}, sk[1] = {4};
    for (int dev = 0; dev <= 2; dev += 2) {
        loom_devices *d = dev ? loom_devices_new(&(loom_devices_config){.count = 2}) : NULL;
        loom_graph *g = loom_graph_new(NULL);
        if (d)
            ASSERT_EQ(loom_graph_set_devices(g, d), LOOM_OK);
        loom_tensor *y = loom_dropout(g, loom_input_batch(g, LOOM_F32, 2, s, x), 0.25,
                                      loom_input(g, LOOM_I32, 1, sk, key));
        loom_output(y);
        ASSERT_EQ(loom_graph_run(g), LOOM_OK);
        ASSERT_EQ(loom_tensor_gather(y, dev ? out2 : out1), R);
        loom_graph_free(g);
        loom_devices_free(d);
    }
    int64_t dropped = 0;
    for (int i = 0; i < R * N; i++) {
        dropped += out1[i] == 0;
        ASSERT(out1[i] == 0 || out1[i] == x[i] * (float)(1.0 / 0.75));
    }
    ASSERT(dropped > 0.22 * R * N && dropped < 0.28 * R * N);
    ASSERT(!memcmp(out1, out2, sizeof out1)); /* 2 devices: the same elements */
    key[2] = 6;                               /* the next step: other elements */
    loom_graph *g = loom_graph_new(NULL);
    loom_tensor *y = loom_dropout(g, loom_input(g, LOOM_F32, 2, s, x), 0.25,
                                  loom_input(g, LOOM_I32, 1, sk, key));
    loom_output(y);
    ASSERT_EQ(loom_graph_run(g), LOOM_OK);
    ASSERT(memcmp(loom_tensor_data(y), out1, sizeof out1) != 0);
    ASSERT(!loom_dropout(g, y, 1.0, loom_input(g, LOOM_I32, 1, sk, key)));
    ASSERT_EQ(loom_graph_run(g), LOOM_EINVAL);
    ASSERT_STR_CONTAINS(loom_last_error(), "expected rows, 0 <= p < 1");
    loom_graph_free(g);
}

TEST(empty_tensors) {
    int64_t s[2] = {0, 3};
    float dummy = 0;
    loom_graph *g = loom_graph_new(NULL);
    loom_tensor *a = loom_input(g, LOOM_F32, 2, s, &dummy);
    loom_tensor *y = loom_sum(g, loom_exp(g, loom_add(g, a, a)), 0);
    loom_output(y);
    ASSERT_EQ(loom_graph_run(g), LOOM_OK);
    const float *p = loom_tensor_data(y);
    for (int i = 0; i < 3; i++)
        ASSERT(p[i] == 0.0f);
    loom_graph_free(g);
}

int main(void) {
    RUN(every_op_has_a_case);
    RUN(float_erf_is_faithful);
    RUN(float_exp_is_faithful);
    RUN(float_tanh_is_faithful);
    RUN(gelu_and_layer_norm_match_naive);
    RUN(gelu_gradient_in_float_matches_its_definition);
    RUN(layer_norm_of_strided_rows_and_its_second_derivative);
    RUN(layer_norm_rows_in_their_documented_order);
    RUN(pad2d_and_crop2d_match_naive);
    RUN(gather_scatter_and_causal_mask_match_naive);
    RUN(attention_matches_naive_loops);
    RUN(attention_refuses_bad_input);
    RUN(dropout_is_keyed_by_position);
    RUN(gradients_match_finite_differences);
    RUN(matmul_matches_naive_loop);
    RUN(matmul_of_a_strided_view_matches_naive_loop);
    RUN(batched_matmul_of_permuted_views_matches_naive_loop);
    RUN(matmul_columns_do_not_depend_on_their_panels);
    RUN(matmul_avx2_sums_in_its_documented_order);
    RUN(conv2d_on_avx2_reads_the_unfold_in_the_documented_order);
    RUN(conv2d_and_pool_match_naive_loops);
    RUN(conv2d_views_match_naive_loops);
    RUN(conv2d_of_random_shapes_matches_naive_loops);
    RUN(pool_matches_naive_loops);
    RUN(pool_of_a_large_window_matches_naive_loops);
    RUN(pool_small_planes_match_naive_loops);
    RUN(long_reductions_match_naive);
    RUN(forward_only_ops);
    RUN(empty_tensors);
    return HARNESS_EXIT();
}
