/*
 * builders.c - the public builders of primitive ops: argument and shape checks (with the op and
 * both shapes in the message), PyTorch broadcasting made explicit as RESHAPE + EXPAND nodes, and
 * the node itself. Builders never run anything.
 */
#include "internal.h"

#include <string.h>

/* Common entry check: graph present, no earlier error, inputs present. */
static bool enter(loom_graph *g, const char *op, int n, loom_tensor *const *in) {
    if (!g || g->err)
        return false;
    for (int i = 0; i < n; i++) {
        if (!in[i]) {
            loom__graph_fail(g, LOOM_EINVAL, "%s: input %d is NULL", op, i);
            return false;
        }
        if (in[i]->g != g) {
            loom__graph_fail(g, LOOM_EINVAL, "%s: input %d belongs to another graph", op, i);
            return false;
        }
    }
    return true;
}

static bool is_float(const loom_tensor *t) {
    return t->dtype == LOOM_F32 || t->dtype == LOOM_F64;
}

static bool check_float(loom_graph *g, const char *op, int n, loom_tensor *const *in) {
    for (int i = 0; i < n; i++) {
        if (!is_float(in[i]) || in[i]->dtype != in[0]->dtype) {
            loom__graph_fail(g, LOOM_ESHAPE, "%s: dtype %s of input %d, expected %s", op,
                             loom__dtype_name((loom_dtype)in[i]->dtype), i,
                             is_float(in[0]) ? loom__dtype_name((loom_dtype)in[0]->dtype)
                                             : "f32 or f64");
            return false;
        }
    }
    return true;
}

static int norm_axis(loom_graph *g, const char *op, const loom_tensor *a, int axis) {
    int ax = axis < 0 ? axis + a->ndim : axis;
    if (ax < 0 || ax >= a->ndim) {
        char s[96];
        loom__shape_str(a, s, sizeof s);
        loom__graph_fail(g, LOOM_ESHAPE, "%s: axis %d out of range for shape %s", op, axis, s);
        return -1;
    }
    return ax;
}

loom_tensor *loom_reshape(loom_graph *g, loom_tensor *a, int ndim, const int64_t *shape) {
    if (!enter(g, "loom_reshape", 1, &a))
        return NULL;
    if (ndim < 0 || ndim > LOOM_MAX_DIMS) {
        loom__graph_fail(g, LOOM_ESHAPE, "loom_reshape: %d dims, expected 0 to %d", ndim,
                         LOOM_MAX_DIMS);
        return NULL;
    }
    int64_t s[LOOM_MAX_DIMS], known = 1;
    int infer = -1;
    for (int i = 0; i < ndim; i++) {
        s[i] = shape[i];
        if (s[i] == -1 && infer < 0)
            infer = i;
        else if (s[i] < 0)
            infer = -2;
        else
            known *= s[i];
    }
    int64_t n = loom_tensor_numel(a);
    if (infer >= 0 && known > 0 && n % known == 0)
        s[infer] = n / known;
    if (infer == -2 || loom__numel(ndim, s) != n || (infer >= 0 && s[infer] < 0)) {
        char sa[96], sb[96];
        loom_tensor tmp = {.ndim = (uint8_t)ndim};
        memcpy(tmp.shape, shape, sizeof(int64_t) * (size_t)ndim);
        loom__shape_str(a, sa, sizeof sa);
        loom__shape_str(&tmp, sb, sizeof sb);
        loom__graph_fail(g, LOOM_ESHAPE, "loom_reshape: %s to %s: element counts differ", sa, sb);
        return NULL;
    }
    if (ndim == a->ndim && memcmp(s, a->shape, sizeof(int64_t) * (size_t)ndim) == 0)
        return a;
    return loom__node(g, LOOM_OP_RESHAPE, (loom_dtype)a->dtype, ndim, s, a, NULL, NULL);
}

loom_tensor *loom_permute(loom_graph *g, loom_tensor *a, const int *perm) {
    if (!enter(g, "loom_permute", 1, &a))
        return NULL;
    int64_t s[LOOM_MAX_DIMS];
    unsigned seen = 0;
    bool identity = true;
    for (int i = 0; i < a->ndim; i++) {
        if (perm[i] < 0 || perm[i] >= a->ndim || (seen >> perm[i]) & 1u) {
            loom__graph_fail(g, LOOM_ESHAPE,
                             "loom_permute: entry %d (%d) is not a permutation of "
                             "0..%d",
                             i, perm[i], a->ndim - 1);
            return NULL;
        }
        seen |= 1u << perm[i];
        s[i] = a->shape[perm[i]];
        identity = identity && perm[i] == i;
    }
    if (identity)
        return a;
    if (a->op == LOOM_OP_MATMUL && a->ndim == 2) /* (A B)^T = B^T A^T: a contiguous result */
        return loom_matmul(g, loom_transpose(g, a->src[1]), loom_transpose(g, a->src[0]));
    loom_tensor *t =
        loom__node(g, LOOM_OP_PERMUTE, (loom_dtype)a->dtype, a->ndim, s, a, NULL, NULL);
    if (t)
        for (int i = 0; i < a->ndim; i++)
            t->attr.perm[i] = perm[i];
    return t;
}

loom_tensor *loom_transpose(loom_graph *g, loom_tensor *a) {
    if (!enter(g, "loom_transpose", 1, &a))
        return NULL;
    if (a->ndim < 2) {
        loom__graph_fail(g, LOOM_ESHAPE, "loom_transpose: %d dims, expected >= 2", a->ndim);
        return NULL;
    }
    int perm[LOOM_MAX_DIMS];
    for (int i = 0; i < a->ndim; i++)
        perm[i] = i;
    perm[a->ndim - 1] = a->ndim - 2;
    perm[a->ndim - 2] = a->ndim - 1;
    return loom_permute(g, a, perm);
}

loom_tensor *loom_expand(loom_graph *g, loom_tensor *a, int ndim, const int64_t *shape) {
    if (!enter(g, "loom_expand", 1, &a))
        return NULL;
    char sa[96], sb[96];
    loom_tensor want = {.ndim = (uint8_t)(ndim > 0 && ndim <= LOOM_MAX_DIMS ? ndim : 0)};
    memcpy(want.shape, shape, sizeof(int64_t) * want.ndim);
    bool ok = ndim >= a->ndim && ndim <= LOOM_MAX_DIMS;
    int64_t s[LOOM_MAX_DIMS];
    for (int i = 0; ok && i < ndim; i++) {
        int j = i - (ndim - a->ndim);
        s[i] = j < 0 ? 1 : a->shape[j];
        ok = s[i] == shape[i] || s[i] == 1;
    }
    if (!ok) {
        loom__shape_str(a, sa, sizeof sa);
        loom__shape_str(&want, sb, sizeof sb);
        loom__graph_fail(g, LOOM_ESHAPE, "loom_expand: %s cannot expand to %s", sa, sb);
        return NULL;
    }
    loom_tensor *r = loom_reshape(g, a, ndim, s);
    if (!r || memcmp(s, shape, sizeof(int64_t) * (size_t)ndim) == 0)
        return r;
    return loom__node(g, LOOM_OP_EXPAND, (loom_dtype)a->dtype, ndim, shape, r, NULL, NULL);
}

/* Broadcasts n tensors against each other by PyTorch's rules; false with a sticky error. */
static bool broadcast(loom_graph *g, const char *op, int n, loom_tensor **in) {
    int nd = 0;
    for (int i = 0; i < n; i++)
        nd = in[i]->ndim > nd ? in[i]->ndim : nd;
    int64_t s[LOOM_MAX_DIMS];
    for (int d = 0; d < nd; d++) {
        s[d] = 1;
        for (int i = 0; i < n; i++) {
            int j = d - (nd - in[i]->ndim);
            int64_t v = j < 0 ? 1 : in[i]->shape[j];
            if (v != 1 && s[d] != 1 && v != s[d]) {
                char sa[96], sb[96];
                loom__shape_str(in[0], sa, sizeof sa);
                loom__shape_str(in[i], sb, sizeof sb);
                loom__graph_fail(g, LOOM_ESHAPE, "%s: shapes %s and %s do not broadcast", op, sa,
                                 sb);
                return false;
            }
            if (v != 1)
                s[d] = v;
        }
    }
    for (int i = 0; i < n; i++) {
        in[i] = loom_expand(g, in[i], nd, s);
        if (!in[i])
            return false;
    }
    return true;
}

static loom_tensor *ew(loom_graph *g, loom__op op, const char *name, int n, loom_tensor *a,
                       loom_tensor *b, loom_tensor *c) {
    loom_tensor *in[3] = {a, b, c};
    if (!enter(g, name, n, in) || !check_float(g, name, n, in) || !broadcast(g, name, n, in))
        return NULL;
    /* A unary op of a permuted or reshaped view is that view of the op: computed in the source's
     * order, it fuses with the source's producer (a convolution's bias add and its ReLU). */
    if (n == 1 && a->op == LOOM_OP_PERMUTE) {
        int perm[LOOM_MAX_DIMS];
        memcpy(perm, a->attr.perm, sizeof(int) * (size_t)a->ndim);
        return loom_permute(g, ew(g, op, name, 1, a->src[0], NULL, NULL), perm);
    }
    if (n == 1 && a->op == LOOM_OP_RESHAPE)
        return loom_reshape(g, ew(g, op, name, 1, a->src[0], NULL, NULL), a->ndim, a->shape);
    return loom__node(g, op, (loom_dtype)in[0]->dtype, in[0]->ndim, in[0]->shape, in[0], in[1],
                      in[2]);
}

loom_tensor *loom_add(loom_graph *g, loom_tensor *a, loom_tensor *b) {
    return ew(g, LOOM_OP_ADD, "loom_add", 2, a, b, NULL);
}
loom_tensor *loom_sub(loom_graph *g, loom_tensor *a, loom_tensor *b) {
    return ew(g, LOOM_OP_SUB, "loom_sub", 2, a, b, NULL);
}
loom_tensor *loom_mul(loom_graph *g, loom_tensor *a, loom_tensor *b) {
    return ew(g, LOOM_OP_MUL, "loom_mul", 2, a, b, NULL);
}
loom_tensor *loom_div(loom_graph *g, loom_tensor *a, loom_tensor *b) {
    return ew(g, LOOM_OP_DIV, "loom_div", 2, a, b, NULL);
}
loom_tensor *loom_cmpgt(loom_graph *g, loom_tensor *a, loom_tensor *b) {
    return ew(g, LOOM_OP_CMPGT, "loom_cmpgt", 2, a, b, NULL);
}
loom_tensor *loom_cmpeq(loom_graph *g, loom_tensor *a, loom_tensor *b) {
    return ew(g, LOOM_OP_CMPEQ, "loom_cmpeq", 2, a, b, NULL);
}
loom_tensor *loom_where(loom_graph *g, loom_tensor *c, loom_tensor *a, loom_tensor *b) {
    return ew(g, LOOM_OP_WHERE, "loom_where", 3, c, a, b);
}
loom_tensor *loom_neg(loom_graph *g, loom_tensor *a) {
    return ew(g, LOOM_OP_NEG, "loom_neg", 1, a, NULL, NULL);
}
loom_tensor *loom_exp(loom_graph *g, loom_tensor *a) {
    return ew(g, LOOM_OP_EXP, "loom_exp", 1, a, NULL, NULL);
}
loom_tensor *loom_log(loom_graph *g, loom_tensor *a) {
    return ew(g, LOOM_OP_LOG, "loom_log", 1, a, NULL, NULL);
}
loom_tensor *loom_sqrt(loom_graph *g, loom_tensor *a) {
    return ew(g, LOOM_OP_SQRT, "loom_sqrt", 1, a, NULL, NULL);
}
loom_tensor *loom_relu(loom_graph *g, loom_tensor *a) {
    return ew(g, LOOM_OP_RELU, "loom_relu", 1, a, NULL, NULL);
}
loom_tensor *loom_tanh(loom_graph *g, loom_tensor *a) {
    return ew(g, LOOM_OP_TANH, "loom_tanh", 1, a, NULL, NULL);
}
loom_tensor *loom_erf(loom_graph *g, loom_tensor *a) {
    return ew(g, LOOM_OP_ERF, "loom_erf", 1, a, NULL, NULL);
}
/* Where a gradient may be taken through it, GELU's derivative is made beside it (its gradient
 * rule, RULE(GELU), takes that one): the compiler computes the two in one kernel (the
 * elementwise rule's GELU beside its derivative), so the step keeps the derivative for the
 * backward instead of GELU's input, and
 * evaluates erf once an element instead of twice. A step that takes no gradient never computes
 * it (nothing reads it). */
loom_tensor *loom_gelu(loom_graph *g, loom_tensor *a) {
    loom_tensor *y = ew(g, LOOM_OP_GELU, "loom_gelu", 1, a, NULL, NULL);
    if (y && a->requires_grad && !loom__gelu_deriv(g, a))
        return NULL;
    return y;
}
loom_tensor *loom__gelu_deriv(loom_graph *g, loom_tensor *x) {
    return ew(g, LOOM_OP_GELUD, "loom_gelu's derivative", 1, x, NULL, NULL);
}

static loom_tensor *axis_op(loom_graph *g, loom__op op, const char *name, loom_tensor *a,
                            int axis) {
    if (!enter(g, name, 1, &a) || !check_float(g, name, 1, &a))
        return NULL;
    int ax = norm_axis(g, name, a, axis);
    if (ax < 0)
        return NULL;
    int64_t s[LOOM_MAX_DIMS];
    memcpy(s, a->shape, sizeof s);
    if (op != LOOM_OP_MAXMASK)
        s[ax] = 1;
    if (op == LOOM_OP_MAX && a->shape[ax] == 0) {
        loom__graph_fail(g, LOOM_ESHAPE, "%s: reducing an empty axis %d has no maximum", name, ax);
        return NULL;
    }
    loom_tensor *t = loom__node(g, op, (loom_dtype)a->dtype, a->ndim, s, a, NULL, NULL);
    if (t)
        t->attr.axis = ax;
    return t;
}

loom_tensor *loom_sum(loom_graph *g, loom_tensor *a, int axis) {
    return axis_op(g, LOOM_OP_SUM, "loom_sum", a, axis);
}
loom_tensor *loom_max(loom_graph *g, loom_tensor *a, int axis) {
    return axis_op(g, LOOM_OP_MAX, "loom_max", a, axis);
}
loom_tensor *loom_maxmask(loom_graph *g, loom_tensor *a, int axis) {
    return axis_op(g, LOOM_OP_MAXMASK, "loom_maxmask", a, axis);
}

loom_tensor *loom_matmul(loom_graph *g, loom_tensor *a, loom_tensor *b) {
    loom_tensor *in[2] = {a, b};
    if (!enter(g, "loom_matmul", 2, in) || !check_float(g, "loom_matmul", 2, in))
        return NULL;
    char sa[96], sb[96];
    loom__shape_str(a, sa, sizeof sa);
    loom__shape_str(b, sb, sizeof sb);
    if (a->ndim < 2 || b->ndim < 2) {
        loom__graph_fail(g, LOOM_ESHAPE, "loom_matmul: %s x %s: both need >= 2 dims", sa, sb);
        return NULL;
    }
    int64_t m = a->shape[a->ndim - 2], k = a->shape[a->ndim - 1];
    int64_t k2 = b->shape[b->ndim - 2], n = b->shape[b->ndim - 1];
    if (k != k2) {
        loom__graph_fail(g, LOOM_ESHAPE, "loom_matmul: %s x %s: inner dims %lld != %lld", sa, sb,
                         (long long)k, (long long)k2);
        return NULL;
    }
    int nd = a->ndim > b->ndim ? a->ndim : b->ndim;
    int64_t s[LOOM_MAX_DIMS], sa_[LOOM_MAX_DIMS], sb_[LOOM_MAX_DIMS];
    for (int d = 0; d < nd - 2; d++) {
        int ia = d - (nd - a->ndim), ib = d - (nd - b->ndim);
        int64_t va = ia < 0 ? 1 : a->shape[ia], vb = ib < 0 ? 1 : b->shape[ib];
        if (va != vb && va != 1 && vb != 1) {
            loom__graph_fail(g, LOOM_ESHAPE, "loom_matmul: %s x %s: batch dims do not broadcast",
                             sa, sb);
            return NULL;
        }
        s[d] = sa_[d] = sb_[d] = va == 1 ? vb : va;
    }
    sa_[nd - 2] = m, sa_[nd - 1] = k;
    sb_[nd - 2] = k, sb_[nd - 1] = n;
    s[nd - 2] = m, s[nd - 1] = n;
    a = loom_expand(g, a, nd, sa_);
    b = loom_expand(g, b, nd, sb_);
    if (!a || !b)
        return NULL;
    return loom__node(g, LOOM_OP_MATMUL, (loom_dtype)a->dtype, nd, s, a, b, NULL);
}

static bool check_window(loom_graph *g, const char *op, loom_window *w) {
    if (w->sh == 0)
        w->sh = 1;
    if (w->sw == 0)
        w->sw = 1;
    if (w->kh < 1 || w->kw < 1 || w->sh < 1 || w->sw < 1 || w->ph < 0 || w->pw < 0) {
        loom__graph_fail(g, LOOM_EINVAL, "%s: window %dx%d stride %dx%d padding %dx%d is invalid",
                         op, w->kh, w->kw, w->sh, w->sw, w->ph, w->pw);
        return false;
    }
    return true;
}

static int64_t out_size(int64_t in, int k, int s, int p) {
    return in + 2 * p < k ? -1 : (in + 2 * p - k) / s + 1;
}

/* PAD (crop false) or CROP of x's last two axes by ph, pw. */
static loom_tensor *pad_or_crop(loom_graph *g, const char *name, loom_tensor *x, int ph, int pw,
                                bool crop) {
    if (!enter(g, name, 1, &x) || !check_float(g, name, 1, &x))
        return NULL;
    int64_t s[LOOM_MAX_DIMS];
    bool ok = x->ndim >= 2 && ph >= 0 && pw >= 0;
    for (int d = 0; ok && d < x->ndim; d++) {
        int64_t by = d == x->ndim - 2 ? ph : d == x->ndim - 1 ? pw : 0;
        s[d] = x->shape[d] + (crop ? -2 : 2) * by;
        ok = s[d] >= 0;
    }
    if (!ok) {
        char sx[96];
        loom__shape_str(x, sx, sizeof sx);
        loom__graph_fail(g, LOOM_ESHAPE, "%s: input %s by %d, %d; expected (..., H, W) and %s",
                         name, sx, ph, pw,
                         crop ? "H >= 2 ph, W >= 2 pw, both >= 0" : "paddings >= 0");
        return NULL;
    }
    loom_tensor *t = loom__node(g, crop ? LOOM_OP_CROP : LOOM_OP_PAD, (loom_dtype)x->dtype, x->ndim,
                                s, x, NULL, NULL);
    if (t)
        t->attr.win = (loom_window){1, 1, 1, 1, ph, pw};
    return t;
}

loom_tensor *loom_pad2d(loom_graph *g, loom_tensor *x, int ph, int pw) {
    return pad_or_crop(g, "loom_pad2d", x, ph, pw, false);
}

loom_tensor *loom_crop2d(loom_graph *g, loom_tensor *x, int ph, int pw) {
    return pad_or_crop(g, "loom_crop2d", x, ph, pw, true);
}

loom_tensor *loom_unfold(loom_graph *g, loom_tensor *x, loom_window w) {
    if (!enter(g, "loom_unfold", 1, &x) || !check_float(g, "loom_unfold", 1, &x) ||
        !check_window(g, "loom_unfold", &w))
        return NULL;
    char sx[96];
    loom__shape_str(x, sx, sizeof sx);
    int64_t oh = x->ndim == 4 ? out_size(x->shape[2], w.kh, w.sh, w.ph) : -1;
    int64_t ow = x->ndim == 4 ? out_size(x->shape[3], w.kw, w.sw, w.pw) : -1;
    if (oh < 0 || ow < 0) {
        loom__graph_fail(g, LOOM_ESHAPE,
                         "loom_unfold: input %s, expected (N,C,H,W) with H,W >= "
                         "the %dx%d window",
                         sx, w.kh, w.kw);
        return NULL;
    }
    int64_t s[6] = {x->shape[1], w.kh, w.kw, x->shape[0], oh, ow};
    loom_tensor *t = loom__node(g, LOOM_OP_UNFOLD, (loom_dtype)x->dtype, 6, s, x, NULL, NULL);
    if (t)
        t->attr.win = w;
    return t;
}

loom_tensor *loom_fold(loom_graph *g, loom_tensor *cols, loom_window w, int64_t h, int64_t wd) {
    if (!enter(g, "loom_fold", 1, &cols) || !check_float(g, "loom_fold", 1, &cols) ||
        !check_window(g, "loom_fold", &w))
        return NULL;
    const int64_t *c = cols->shape;
    if (cols->ndim != 6 || c[1] != w.kh || c[2] != w.kw || out_size(h, w.kh, w.sh, w.ph) != c[4] ||
        out_size(wd, w.kw, w.sw, w.pw) != c[5]) {
        char sc[96];
        loom__shape_str(cols, sc, sizeof sc);
        loom__graph_fail(g, LOOM_ESHAPE,
                         "loom_fold: input %s does not match window %dx%d into "
                         "%lldx%lld",
                         sc, w.kh, w.kw, (long long)h, (long long)wd);
        return NULL;
    }
    int64_t s[4] = {c[3], c[0], h, wd};
    loom_tensor *t = loom__node(g, LOOM_OP_FOLD, (loom_dtype)cols->dtype, 4, s, cols, NULL, NULL);
    if (t)
        t->attr.win = w;
    return t;
}

/* The pooled shape of x under window w, or false after failing the graph. A padding must leave
 * every window at least one real position (PyTorch's rule: padding <= half the window). */
static bool pool_shape(loom_graph *g, const char *op, const loom_tensor *x, const loom_window *w,
                       int64_t *s) {
    int64_t oh = x->ndim == 4 ? out_size(x->shape[2], w->kh, w->sh, w->ph) : -1;
    int64_t ow = x->ndim == 4 ? out_size(x->shape[3], w->kw, w->sw, w->pw) : -1;
    if (oh < 0 || ow < 0 || 2 * w->ph > w->kh || 2 * w->pw > w->kw) {
        char sx[96];
        loom__shape_str(x, sx, sizeof sx);
        loom__graph_fail(g, LOOM_ESHAPE,
                         "%s: input %s with window %dx%d padding %dx%d, expected (N,C,H,W) with "
                         "H,W >= the window and padding <= half the window",
                         op, sx, w->kh, w->kw, w->ph, w->pw);
        return false;
    }
    s[0] = x->shape[0], s[1] = x->shape[1], s[2] = oh, s[3] = ow;
    return true;
}

loom_tensor *loom_pool_max(loom_graph *g, loom_tensor *x, loom_window w) {
    int64_t s[4];
    if (!enter(g, "loom_pool_max", 1, &x) || !check_float(g, "loom_pool_max", 1, &x) ||
        !check_window(g, "loom_pool_max", &w) || !pool_shape(g, "loom_pool_max", x, &w, s))
        return NULL;
    /* Pooling treats N and C alike: a (C,N,H,W) tensor viewed as (N,C,H,W), a convolution's
     * output, is pooled in its own order, so that the gradient comes back in the order the
     * convolution's backward reads without a copy. */
    static const int swap01[4] = {1, 0, 2, 3};
    if (x->op == LOOM_OP_PERMUTE && !memcmp(x->attr.perm, swap01, sizeof swap01))
        return loom_permute(g, loom_pool_max(g, x->src[0], w), swap01);
    loom_tensor *t = loom__node(g, LOOM_OP_POOLMAX, (loom_dtype)x->dtype, 4, s, x, NULL, NULL);
    if (t)
        t->attr.win = w;
    return t;
}

loom_tensor *loom_pool_max_grad(loom_graph *g, loom_tensor *x, loom_tensor *dy, loom_window w) {
    loom_tensor *in[2] = {x, dy};
    int64_t s[4];
    if (!enter(g, "loom_pool_max_grad", 2, in) || !check_float(g, "loom_pool_max_grad", 2, in) ||
        !check_window(g, "loom_pool_max_grad", &w) ||
        !pool_shape(g, "loom_pool_max_grad", x, &w, s))
        return NULL;
    if (dy->ndim != 4 || memcmp(dy->shape, s, sizeof s) != 0) {
        char sd[96];
        loom__shape_str(dy, sd, sizeof sd);
        loom__graph_fail(g, LOOM_ESHAPE,
                         "loom_pool_max_grad: gradient %s, expected the pooled shape "
                         "(%lld,%lld,%lld,%lld)",
                         sd, (long long)s[0], (long long)s[1], (long long)s[2], (long long)s[3]);
        return NULL;
    }
    loom_tensor *t =
        loom__node(g, LOOM_OP_POOLGRAD, (loom_dtype)x->dtype, 4, x->shape, x, dy, NULL);
    if (t)
        t->attr.win = w;
    return t;
}

loom_tensor *loom_onehot(loom_graph *g, loom_tensor *idx, int64_t n, loom_dtype dt) {
    if (!enter(g, "loom_onehot", 1, &idx))
        return NULL;
    if (idx->dtype != LOOM_I32 || idx->ndim >= LOOM_MAX_DIMS || n < 1 || dt == LOOM_I32) {
        char s[96];
        loom__shape_str(idx, s, sizeof s);
        loom__graph_fail(g, LOOM_ESHAPE,
                         "loom_onehot: indices %s %s into %lld classes of %s, "
                         "expected i32 indices, >= 1 class, a float dtype",
                         s, loom__dtype_name((loom_dtype)idx->dtype), (long long)n,
                         loom__dtype_name(dt));
        return NULL;
    }
    int64_t s[LOOM_MAX_DIMS];
    memcpy(s, idx->shape, sizeof(int64_t) * idx->ndim);
    s[idx->ndim] = n;
    loom_tensor *t = loom__node(g, LOOM_OP_ONEHOT, dt, idx->ndim + 1, s, idx, NULL, NULL);
    if (t)
        t->attr.classes = n;
    return t;
}

/* "op: <a> <dtype a> and indices <b> <dtype b>, expected <what>" as the graph's error. */
static loom_tensor *index_error(loom_graph *g, const char *op, const loom_tensor *a,
                                const loom_tensor *idx, const char *what) {
    char sa[96], si[96];
    loom__shape_str(a, sa, sizeof sa);
    loom__shape_str(idx, si, sizeof si);
    loom__graph_fail(g, LOOM_ESHAPE, "%s: %s %s and indices %s %s, expected %s", op, sa,
                     loom__dtype_name((loom_dtype)a->dtype), si,
                     loom__dtype_name((loom_dtype)idx->dtype), what);
    return NULL;
}

loom_tensor *loom_gather(loom_graph *g, loom_tensor *table, loom_tensor *idx) {
    loom_tensor *in[2] = {table, idx};
    if (!enter(g, "loom_gather", 2, in))
        return NULL;
    if (table->ndim != 2 || table->dtype == LOOM_I32 || idx->dtype != LOOM_I32 ||
        idx->ndim >= LOOM_MAX_DIMS)
        return index_error(g, "loom_gather", table, idx,
                           "a float table (V, D) and i32 indices of fewer dims than the most");
    int64_t s[LOOM_MAX_DIMS];
    memcpy(s, idx->shape, sizeof(int64_t) * idx->ndim);
    s[idx->ndim] = table->shape[1];
    return loom__node(g, LOOM_OP_GATHER, (loom_dtype)table->dtype, idx->ndim + 1, s, table, idx,
                      NULL);
}

loom_tensor *loom_scatter_add(loom_graph *g, loom_tensor *src, loom_tensor *idx, int64_t rows) {
    loom_tensor *in[2] = {src, idx};
    if (!enter(g, "loom_scatter_add", 2, in))
        return NULL;
    bool same = src->ndim == idx->ndim + 1 && src->dtype != LOOM_I32 && idx->dtype == LOOM_I32;
    for (int d = 0; same && d < idx->ndim; d++)
        same = src->shape[d] == idx->shape[d];
    if (!same || rows < 1)
        return index_error(g, "loom_scatter_add", src, idx,
                           "float rows (..., D) and i32 indices (...), into >= 1 rows");
    int64_t s[2] = {rows, src->shape[src->ndim - 1]};
    loom_tensor *t =
        loom__node(g, LOOM_OP_SCATTERADD, (loom_dtype)src->dtype, 2, s, src, idx, NULL);
    if (t)
        t->attr.classes = rows;
    return t;
}

loom_tensor *loom_causal_mask(loom_graph *g, loom_tensor *x, double fill) {
    if (!enter(g, "loom_causal_mask", 1, &x) || !check_float(g, "loom_causal_mask", 1, &x))
        return NULL;
    if (x->ndim < 2) {
        char sx[96];
        loom__shape_str(x, sx, sizeof sx);
        loom__graph_fail(g, LOOM_ESHAPE, "loom_causal_mask: %s, expected (..., T, S)", sx);
        return NULL;
    }
    loom_tensor *t =
        loom__node(g, LOOM_OP_CAUSAL, (loom_dtype)x->dtype, x->ndim, x->shape, x, NULL, NULL);
    if (t)
        t->attr.value = fill;
    return t;
}

loom_tensor *loom_attention(loom_graph *g, loom_tensor *qkv, bool causal) {
    if (!enter(g, "loom_attention", 1, &qkv) || !check_float(g, "loom_attention", 1, &qkv))
        return NULL;
    if (qkv->ndim != 5 || qkv->shape[2] != 3 || loom_tensor_numel(qkv) == 0) {
        char sx[96];
        loom__shape_str(qkv, sx, sizeof sx);
        loom__graph_fail(g, LOOM_ESHAPE,
                         "loom_attention: qkv %s, expected (B, T, 3, H, D) of sizes >= 1", sx);
        return NULL;
    }
    const int64_t *s = qkv->shape;
    int64_t out[4] = {s[0], s[1], s[3], s[4]};
    loom_tensor *t =
        loom__node(g, LOOM_OP_ATTENTION, (loom_dtype)qkv->dtype, 4, out, qkv, NULL, NULL);
    if (t)
        t->attr.value = causal;
    return t;
}

loom_tensor *loom__attention_grad(loom_graph *g, loom_tensor *qkv, loom_tensor *gy, loom_tensor *y,
                                  bool causal) {
    loom_tensor *t = loom__node(g, LOOM_OP_ATTENTIONGRAD, (loom_dtype)qkv->dtype, qkv->ndim,
                                qkv->shape, qkv, gy, y);
    if (t)
        t->attr.value = causal;
    return t;
}

loom_tensor *loom_dropout(loom_graph *g, loom_tensor *x, double p, loom_tensor *key) {
    loom_tensor *in[2] = {x, key};
    if (!enter(g, "loom_dropout", 2, in) || !check_float(g, "loom_dropout", 1, &x))
        return NULL;
    if (!(p >= 0 && p < 1) || x->ndim < 1 || key->dtype != LOOM_I32 ||
        loom_tensor_numel(key) != 4) {
        char sx[96], sk[96];
        loom__shape_str(x, sx, sizeof sx);
        loom__shape_str(key, sk, sizeof sk);
        loom__graph_fail(g, LOOM_EINVAL,
                         "loom_dropout: input %s, p %g, key %s %s; expected rows, 0 <= p < 1 and "
                         "an i32 key of 4 elements",
                         sx, p, sk, loom__dtype_name((loom_dtype)key->dtype));
        return NULL;
    }
    if (p == 0)
        return x;
    loom_tensor *t = loom__node(g, LOOM_OP_DROPOUT, (loom_dtype)x->dtype, x->ndim, x->shape, x, key,
                                loom__batch_row0(g));
    if (t)
        t->attr.value = p;
    return t;
}

loom_tensor *loom_allreduce(loom_graph *g, loom_tensor *t, loom_reduce_op op) {
    if (!enter(g, "loom_allreduce", 1, &t) || !check_float(g, "loom_allreduce", 1, &t))
        return NULL;
    if (op != LOOM_REDUCE_SUM && op != LOOM_REDUCE_MEAN) {
        loom__graph_fail(g, LOOM_EINVAL, "loom_allreduce: unknown reduction %d", (int)op);
        return NULL;
    }
    loom_tensor *r =
        loom__node(g, LOOM_OP_ALLREDUCE, (loom_dtype)t->dtype, t->ndim, t->shape, t, NULL, NULL);
    if (r)
        r->attr.reduce = op;
    return r;
}
