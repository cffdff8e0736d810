/*
 * compose.c - operations built from primitives, so that their gradients and (later) fusion come
 * for free: reductions over everything, softmax, log-softmax and cross-entropy (the max shift is
 * detached, as its gradient is zero), linear, conv2d (im2col + one matmul), max-pooling (im2col +
 * max, whose gradient goes to the first maximum of each window, as in PyTorch), flatten and
 * layer normalization.
 */
#include "internal.h"

loom_tensor *loom_sum_all(loom_graph *g, loom_tensor *a) {
    if (!a)
        return loom_reshape(g, a, 0, NULL);
    int64_t n = loom_tensor_numel(a);
    return loom_reshape(g, loom_sum(g, loom_reshape(g, a, 1, &n), 0), 0, NULL);
}

loom_tensor *loom_mean_all(loom_graph *g, loom_tensor *a) {
    loom_tensor *s = loom_sum_all(g, a);
    return s ? loom_div(g, s, loom__scalar_like(g, s, (double)loom_tensor_numel(a))) : NULL;
}

/* x - max(x, axis), with the max detached. */
static loom_tensor *shift_by_max(loom_graph *g, loom_tensor *x, int axis) {
    loom_tensor *m = loom_max(g, x, axis);
    if (!m)
        return NULL;
    m->requires_grad = false;
    return loom_sub(g, x, m);
}

loom_tensor *loom_softmax(loom_graph *g, loom_tensor *x, int axis) {
    if (x && x->ndim > 0 && (axis == -1 || axis == x->ndim - 1) && x->dtype != LOOM_I32 && g &&
        !g->err) /* along the last axis: one row kernel (SOFTMAX) */
        return loom__node(g, LOOM_OP_SOFTMAX, (loom_dtype)x->dtype, x->ndim, x->shape, x, NULL,
                          NULL);
    loom_tensor *e = loom_exp(g, shift_by_max(g, x, axis));
    return loom_div(g, e, loom_sum(g, e, axis));
}

loom_tensor *loom_log_softmax(loom_graph *g, loom_tensor *x, int axis) {
    loom_tensor *s = shift_by_max(g, x, axis);
    return loom_sub(g, s, loom_log(g, loom_sum(g, loom_exp(g, s), axis)));
}

/* Sticky error "<op>: <what> <shape a> and <shape b>, expected <expect>" (NULL shows as NULL). */
static loom_tensor *fail_shapes(loom_graph *g, const char *what, const loom_tensor *a,
                                const char *and_what, const loom_tensor *b, const char *expect) {
    char sa[96], sb[96];
    loom__shape_str(a, sa, sizeof sa);
    loom__shape_str(b, sb, sizeof sb);
    loom__graph_fail(g, LOOM_ESHAPE, "%s %s %s %s, expected %s", what, sa, and_what, sb, expect);
    return NULL;
}

loom_tensor *loom_layer_norm(loom_graph *g, loom_tensor *x, loom_tensor *weight, loom_tensor *bias,
                             double eps) {
    if (!g || g->err)
        return NULL;
    int64_t n = x && x->ndim > 0 ? x->shape[x->ndim - 1] : 0;
    if (n == 0 || !(eps >= 0)) {
        char sx[96];
        loom__shape_str(x, sx, sizeof sx);
        loom__graph_fail(g, LOOM_ESHAPE,
                         "loom_layer_norm: input %s, eps %g; expected a last axis of size > 0 "
                         "and eps >= 0",
                         sx, eps);
        return NULL;
    }
    for (int k = 0; k < 2; k++) {
        loom_tensor *p = k ? bias : weight;
        if (p && (p->ndim != 1 || p->shape[0] != n))
            return fail_shapes(g, "loom_layer_norm: input", x, k ? "and bias" : "and weight", p,
                               "(..., N) and (N)");
    }
    if (x->dtype != LOOM_F32 && x->dtype != LOOM_F64) {
        loom__graph_fail(g, LOOM_ESHAPE, "loom_layer_norm: input dtype %s, expected f32 or f64",
                         loom__dtype_name((loom_dtype)x->dtype));
        return NULL;
    }
    loom_tensor *y = loom__lnorm(g, x, eps); /* one row kernel; weight and bias broadcast */
    if (weight)
        y = loom_mul(g, y, weight);
    return bias ? loom_add(g, y, bias) : y;
}

static loom_tensor *lnorm_node(loom_graph *g, loom__op op, loom_tensor *x, loom_tensor *gy,
                               double eps) {
    loom_tensor *t = loom__node(g, op, (loom_dtype)x->dtype, x->ndim, x->shape, x, gy, NULL);
    if (t)
        t->attr.value = eps;
    return t;
}

loom_tensor *loom__lnorm(loom_graph *g, loom_tensor *x, double eps) {
    return lnorm_node(g, LOOM_OP_LNORM, x, NULL, eps);
}

loom_tensor *loom__lnorm_grad(loom_graph *g, loom_tensor *x, loom_tensor *gy, double eps) {
    return lnorm_node(g, LOOM_OP_LNORMGRAD, x, gy, eps);
}

loom_tensor *loom_cross_entropy(loom_graph *g, loom_tensor *logits, loom_tensor *labels) {
    if (!g || g->err)
        return NULL;
    bool ok = logits && labels && logits->ndim >= 2 && labels->ndim == logits->ndim - 1;
    for (int d = 0; ok && d < labels->ndim; d++)
        ok = labels->shape[d] == logits->shape[d];
    if (!ok)
        return fail_shapes(g, "loom_cross_entropy: logits", logits, "and labels", labels,
                           "(..., C) and (...)");
    int ax = logits->ndim - 1;
    loom_tensor *lsm = loom_log_softmax(g, logits, ax);
    loom_tensor *oh = loom_onehot(g, labels, logits->shape[ax], (loom_dtype)logits->dtype);
    loom_tensor *picked = loom_sum(g, loom_mul(g, lsm, oh), ax); /* (..., 1) */
    if (labels->op != LOOM_OP_INPUT || labels->role != LOOM_ROLE_BATCH)
        return loom_neg(g, loom_mean_all(g, picked));
    /* A batch shard: padded rows weigh 0; dividing by (global real rows / devices) times the
     * positions of a row makes the mean over devices the global mean (and the averaged gradient
     * the global gradient). */
    int64_t col[LOOM_MAX_DIMS] = {picked->shape[0]}, per_row = loom_tensor_numel(picked) / col[0];
    for (int d = 1; d < picked->ndim; d++)
        col[d] = 1;
    loom_tensor *w = loom_reshape(g, loom__batch_mask(g), picked->ndim, col);
    loom_tensor *n = loom__batch_count(g);
    if (per_row != 1)
        n = loom_mul(g, n, loom__scalar_like(g, n, (double)per_row));
    return loom_neg(g, loom_div(g, loom_sum_all(g, loom_mul(g, picked, w)), n));
}

/* tanh(sqrt(2 / pi) (x + 0.044715 x^3)), halved and applied to x: GPT-2's gelu_new. Its
 * gradient comes from the primitives. */
loom_tensor *loom_gelu_tanh(loom_graph *g, loom_tensor *x) {
    if (!g || g->err || !x)
        return NULL;
    loom_dtype dt = x->dtype;
    loom_tensor *x3 = loom_mul(g, loom_mul(g, x, x), x);
    loom_tensor *in = loom_mul(g, loom_add(g, x, loom_mul(g, x3, loom_scalar(g, 0.044715, dt))),
                               loom_scalar(g, 0.7978845608028654, dt));
    loom_tensor *half = loom_mul(g, x, loom_scalar(g, 0.5, dt));
    return loom_mul(g, half, loom_add(g, loom_tanh(g, in), loom_scalar(g, 1.0, dt)));
}

loom_tensor *loom_linear(loom_graph *g, loom_tensor *x, loom_tensor *w, loom_tensor *b) {
    loom_tensor *y = loom_matmul(g, x, loom_transpose(g, w));
    return b ? loom_add(g, y, b) : y;
}

loom_tensor *loom_conv2d(loom_graph *g, loom_tensor *x, loom_tensor *w, loom_tensor *b, int stride,
                         int padding) {
    if (!g || g->err)
        return NULL;
    if (!x || !w || x->ndim != 4 || w->ndim != 4 || x->shape[1] != w->shape[1] ||
        (b && (b->ndim != 1 || b->shape[0] != w->shape[0])))
        return fail_shapes(g, "loom_conv2d: input", x, "and weight", w,
                           "(N,C,H,W) and (O,C,KH,KW) with the same C, bias (O)");
    int64_t o = w->shape[0];
    if (w->shape[2] == 1 && w->shape[3] == 1 && stride == 1 && padding == 0) {
        /* 1x1: W (O,C) times x seen as (C, N H W), which the unfold of a 1x1 window only
         * permutes: no columns (a view where x is the permuted output of a product, as a
         * convolution's is) and no fold in the backward */
        static const int cn[4] = {1, 0, 2, 3};
        int64_t n = x->shape[0], h = x->shape[2], wd = x->shape[3];
        int64_t xs[2] = {x->shape[1], n * h * wd}, ws[2] = {o, x->shape[1]}, bs[2] = {o, 1},
                ys[4] = {o, n, h, wd};
        loom_tensor *y = loom_matmul(g, loom_reshape(g, w, 2, ws),
                                     loom_reshape(g, loom_permute(g, x, cn), 2, xs));
        if (b)
            y = loom_add(g, y, loom_reshape(g, b, 2, bs));
        return loom_permute(g, loom_reshape(g, y, 4, ys), cn);
    }
    /* padding as its own zero-padded copy of x: the unfold of the copy has none, and loom's
     * matmul reads such an unfold in place (no im2col buffer, KH KW times the image) */
    if (padding > 0)
        x = loom_pad2d(g, x, padding, padding);
    loom_window win = {(int)w->shape[2], (int)w->shape[3],          stride,
                       stride,           padding < 0 ? padding : 0, padding < 0 ? padding : 0};
    loom_tensor *cols = loom_unfold(g, x, win); /* (C,KH,KW,N,OH,OW) */
    if (!cols)
        return NULL;
    int64_t ckk = cols->shape[0] * cols->shape[1] * cols->shape[2];
    int64_t n = cols->shape[3], oh = cols->shape[4], ow = cols->shape[5];
    int64_t s2[2] = {ckk, n * oh * ow}, ws[2] = {o, ckk}, bs[2] = {o, 1}, s4[4] = {o, n, oh, ow};
    loom_tensor *y = loom_matmul(g, loom_reshape(g, w, 2, ws), loom_reshape(g, cols, 2, s2));
    if (b)
        y = loom_add(g, y, loom_reshape(g, b, 2, bs));
    static const int perm[4] = {1, 0, 2, 3};
    return loom_permute(g, loom_reshape(g, y, 4, s4), perm);
}

loom_tensor *loom_max_pool2d(loom_graph *g, loom_tensor *x, int k) {
    return loom_pool_max(g, x, (loom_window){k, k, k, k, 0, 0});
}

loom_tensor *loom_flatten(loom_graph *g, loom_tensor *x) {
    if (!g || g->err)
        return NULL;
    if (!x || x->ndim < 1) {
        loom__graph_fail(g, LOOM_ESHAPE, "loom_flatten: expected a tensor with a batch dim");
        return NULL;
    }
    int64_t s[2] = {x->shape[0], -1};
    if (x->shape[0] == 0)
        s[1] = loom_tensor_numel(x) == 0 ? 0 : 1;
    return loom_reshape(g, x, 2, s);
}
