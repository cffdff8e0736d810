/*
 * autograd.c - reverse-mode differentiation that records graph nodes, so that backward is part of
 * the same lazy step graph as forward. One grad rule per op of ops.def (a missing rule is a
 * compile error); each builds the gradients of an op's inputs from the gradient of its output.
 * The walk is an explicit loop over node ids in reverse creation order (a topological order), and
 * contributions to a node used several times are added in a fixed order.
 */
#include "internal.h"

typedef void (*grad_rule)(loom_graph *g, loom_tensor *t, loom_tensor *gy, loom_tensor **gx);

#define RULE(name) \
    static void grad_##name(loom_graph *g, loom_tensor *t, loom_tensor *gy, loom_tensor **gx)
#define LOOM_LEAF(name, attr)          RULE(name);
#define LOOM_EW(name, arity, expr)     RULE(name);
#define LOOM_RED(name, combine, ident) RULE(name);
#define LOOM_MOV(name, attr)           RULE(name);
#define LOOM_OPQ(name, arity, attr)    RULE(name);
#include "ops.def"

static const grad_rule rules[LOOM_OP_COUNT] = {
#define LOOM_LEAF(name, attr)          [LOOM_OP_##name] = grad_##name,
#define LOOM_EW(name, arity, expr)     [LOOM_OP_##name] = grad_##name,
#define LOOM_RED(name, combine, ident) [LOOM_OP_##name] = grad_##name,
#define LOOM_MOV(name, attr)           [LOOM_OP_##name] = grad_##name,
#define LOOM_OPQ(name, arity, attr)    [LOOM_OP_##name] = grad_##name,
#include "ops.def"
};

#define A    (t->src[0])
#define B    (t->src[1])
#define C    (t->src[2])
#define ZERO (loom__scalar_like(g, gy, 0.0))

/* Rules for ops without a gradient (leaves, comparisons, indices, side effects). */
#define NO_GRAD(name)                         \
    RULE(name) {                              \
        (void)g, (void)t, (void)gy, (void)gx; \
    }
/* Rules for gradients loom does not take (second derivatives of library kernels): refused with
 * a clear error, not silently zero. */
#define REFUSED(name, what)                                                                       \
    RULE(name) {                                                                                  \
        (void)t, (void)gy, (void)gx;                                                              \
        loom__graph_fail(g, LOOM_EINVAL, "loom_grad: the gradient of %s is not supported", what); \
    }
NO_GRAD(INPUT)
NO_GRAD(CONST)
NO_GRAD(PERSIST)
NO_GRAD(CMPGT)
NO_GRAD(CMPEQ)
NO_GRAD(MAXMASK)
NO_GRAD(ONEHOT)
RULE(GATHER) { /* the table's rows, summed where an index repeats; none for the indices */
    gx[0] = loom_scatter_add(g, gy, B, A->shape[0]);
}
RULE(SCATTERADD) {
    (void)t;
    gx[0] = loom_gather(g, gy, B);
}
RULE(DROPOUT) { /* the same elements dropped, the same scale: a function of the position */
    gx[0] = loom_dropout(g, gy, t->attr.value, B);
}
RULE(SOFTMAX) { /* y (gy - sum(gy y)) along the last axis */
    loom_tensor *dot = loom_sum(g, loom_mul(g, gy, t), t->ndim - 1);
    gx[0] = loom_mul(g, t, loom_sub(g, gy, dot));
}
RULE(LNORM) { /* a row kernel of x and gy (the statistics recomputed from x) */
    gx[0] = loom__lnorm_grad(g, A, gy, t->attr.value);
}
REFUSED(LNORMGRAD, "layer normalization's input gradient (a second derivative of "
                   "loom_layer_norm)")
RULE(ATTENTION) { /* one kernel of qkv and gy (the forward's probabilities, kept in its buffer) */
    gx[0] = loom__attention_grad(g, A, gy, t, t->attr.value != 0);
}
REFUSED(ATTENTIONGRAD, "attention's input gradient (a second derivative of loom_attention)")
RULE(PAD) {
    gx[0] = loom_crop2d(g, gy, t->attr.win.ph, t->attr.win.pw);
}
RULE(CROP) {
    gx[0] = loom_pad2d(g, gy, t->attr.win.ph, t->attr.win.pw);
}
RULE(CAUSAL) { /* the hidden elements were the fill: no gradient through them */
    (void)t;
    gx[0] = loom_causal_mask(g, gy, 0.0);
}
NO_GRAD(STORE)
NO_GRAD(SYNC)

RULE(NEG) {
    (void)t;
    gx[0] = loom_neg(g, gy);
}
RULE(EXP) {
    gx[0] = loom_mul(g, gy, t);
}
RULE(LOG) {
    gx[0] = loom_div(g, gy, A);
}
RULE(SQRT) {
    gx[0] = loom_div(g, gy, loom_mul(g, loom__scalar_like(g, gy, 2.0), t));
}
RULE(RELU) {
    gx[0] = loom_where(g, loom_cmpgt(g, t, ZERO), gy, ZERO);
}
RULE(TANH) { /* 1 - tanh^2 */
    gx[0] = loom_mul(g, gy, loom_sub(g, loom__scalar_like(g, gy, 1.0), loom_mul(g, t, t)));
}
RULE(ERF) { /* 2 / sqrt(pi) exp(-a^2) */
    loom_tensor *e = loom_exp(g, loom_neg(g, loom_mul(g, A, A)));
    gx[0] = loom_mul(g, gy, loom_mul(g, loom__scalar_like(g, gy, 1.1283791670955126), e));
}
RULE(GELU) { /* dy times the derivative Phi(a) + a phi(a) that loom_gelu made beside it (a few
              * nodes on: it made it of the same source), or made now */
    loom_tensor *d = NULL;
    for (int64_t i = t->id + 1; i < g->n && i <= t->id + 4 && !d; i++)
        d = g->nodes[i]->op == LOOM_OP_GELUD && g->nodes[i]->src[0] == A ? g->nodes[i] : NULL;
    gx[0] = loom_mul(g, gy, d ? d : loom__gelu_deriv(g, A));
}
REFUSED(GELUD, "GELU's derivative (a second derivative of GELU)")
RULE(ADD) {
    (void)g, (void)t;
    gx[0] = gy;
    gx[1] = gy;
}
RULE(SUB) {
    (void)t;
    gx[0] = gy;
    gx[1] = loom_neg(g, gy);
}
RULE(MUL) {
    gx[0] = loom_mul(g, gy, B);
    gx[1] = loom_mul(g, gy, A);
}
RULE(DIV) {
    gx[0] = loom_div(g, gy, B);
    gx[1] = loom_neg(g, loom_div(g, loom_mul(g, gy, t), B));
}
RULE(WHERE) {
    gx[1] = loom_where(g, A, gy, ZERO);
    gx[2] = loom_where(g, A, ZERO, gy);
}
RULE(SUM) {
    gx[0] = loom_expand(g, gy, A->ndim, A->shape);
}
RULE(MAX) {
    loom_tensor *mask = loom_maxmask(g, A, t->attr.axis);
    gx[0] = loom_where(g, mask, loom_expand(g, gy, A->ndim, A->shape), ZERO);
}
RULE(RESHAPE) {
    gx[0] = loom_reshape(g, gy, A->ndim, A->shape);
}
RULE(PERMUTE) {
    int inv[LOOM_MAX_DIMS];
    for (int i = 0; i < t->ndim; i++)
        inv[t->attr.perm[i]] = i;
    gx[0] = loom_permute(g, gy, inv);
}
RULE(EXPAND) {
    loom_tensor *r = gy;
    for (int d = 0; d < t->ndim; d++)
        if (A->shape[d] == 1 && t->shape[d] != 1)
            r = loom_sum(g, r, d);
    gx[0] = r;
}
RULE(MATMUL) {
    gx[0] = loom_matmul(g, gy, loom_transpose(g, B));
    gx[1] = loom_matmul(g, loom_transpose(g, A), gy);
}
RULE(UNFOLD) {
    gx[0] = loom_fold(g, gy, t->attr.win, A->shape[2], A->shape[3]);
}
RULE(POOLMAX) {
    gx[0] = loom_pool_max_grad(g, A, gy, t->attr.win);
}
REFUSED(POOLGRAD, "loom_pool_max_grad (a second derivative of max pooling)")
RULE(ALLREDUCE) { /* every device's output depends on every device's input */
    gx[0] = loom_allreduce(g, gy, t->attr.reduce);
}
RULE(FOLD) {
    gx[0] = loom_unfold(g, gy, t->attr.win);
}

static loom_tensor *zeros_like(loom_graph *g, loom_tensor *x) {
    return loom_expand(g, loom__scalar_like(g, x, 0.0), x->ndim, x->shape);
}

void loom__grads(loom_graph *g, loom_tensor *loss, int n, loom_tensor *const *wrt,
                 loom_tensor **out, loom__grad_ready ready, void *ctx) {
    for (int k = 0; k < n; k++)
        out[k] = NULL;
    if (g->err)
        return;
    int64_t top = loss->id + 1;
    loom_tensor **grads = loom__arena_alloc(&g->arena, sizeof(loom_tensor *) * (size_t)top);
    int32_t *which = loom__arena_alloc(&g->arena, sizeof(int32_t) * (size_t)top);
    if (!grads || !which) {
        loom__graph_fail(g, LOOM_ENOMEM, "loom_grad: out of memory");
        return;
    }
    for (int k = 0; k < n; k++) /* node id -> 1 + index in wrt */
        if (wrt[k] && wrt[k]->id < top)
            which[wrt[k]->id] = k + 1;
    grads[loss->id] = loom_expand(g, loom__scalar_like(g, loss, 1.0), loss->ndim, loss->shape);
    for (int64_t id = top - 1; id >= 0 && !g->err; id--) {
        loom_tensor *t = g->nodes[id], *gy = grads[id];
        if (which[id]) { /* every consumer has a larger id: this gradient is final */
            out[which[id] - 1] = gy;
            if (ready)
                ready(ctx, which[id] - 1, gy);
        }
        if (!gy || !t->requires_grad || loom__ops[t->op].kind == LOOM_KIND_LEAF)
            continue;
        loom_tensor *gx[3] = {NULL, NULL, NULL};
        rules[t->op](g, t, gy, gx);
        for (int i = 0; i < 3; i++) {
            loom_tensor *s = t->src[i];
            if (!s || !gx[i] || !s->requires_grad)
                continue;
            grads[s->id] = grads[s->id] ? loom_add(g, grads[s->id], gx[i]) : gx[i];
        }
    }
}

void loom_grads(loom_graph *g, loom_tensor *loss, int n, loom_tensor *const *wrt,
                loom_tensor **out) {
    for (int k = 0; k < n && out; k++)
        out[k] = NULL;
    if (!g || g->err)
        return;
    bool bad = !loss || !wrt || !out || n < 0;
    for (int k = 0; k < n && !bad; k++)
        bad = !wrt[k];
    if (bad || loom_tensor_numel(loss) != 1) {
        loom__graph_fail(g, LOOM_EINVAL, "loom_grad: %s",
                         bad ? "NULL argument" : "loss must have one element");
        return;
    }
    loom__grads(g, loss, n, wrt, out, NULL, NULL);
    for (int k = 0; k < n; k++)
        if (!out[k])
            out[k] = zeros_like(g, wrt[k]);
}

loom_tensor *loom_grad(loom_graph *g, loom_tensor *loss, loom_tensor *wrt) {
    loom_tensor *r = NULL;
    loom_grads(g, loss, 1, &wrt, &r);
    return r;
}

/* Records the all-reduce (mean) of the gradient slab range [lo, hi) across devices. */
static void sync_range(loom_graph *g, int64_t lo, int64_t hi) {
    int64_t n = hi - lo;
    loom_tensor *t = loom__node(g, LOOM_OP_SYNC, LOOM_F32, 1, &n, NULL, NULL, NULL);
    if (t) {
        t->attr.persist.slab = LOOM_SLAB_GRAD;
        t->attr.persist.offset = lo;
    }
}

/* The gradients of a backward pass, stored as each becomes final and all-reduced in buckets: a
 * bucket is a contiguous range of the gradient slab of about bucket_bytes. */
typedef struct {
    loom_graph *g;
    bool *stored;
    int64_t lo, hi; /* the open bucket, empty when lo == hi */
    double weight;  /* gradient accumulation: the gradients' weight (1: none) */
    bool add, sync; /* added to the slab's (not the first micro-batch); all-reduced (the last) */
} backward_ctx;

static void flush(backward_ctx *b) {
    if (b->hi > b->lo && b->g->ndev > 1 && b->sync)
        sync_range(b->g, b->lo, b->hi);
    b->lo = b->hi = 0;
}

static void store_grad(void *ctx, int i, loom_tensor *grad) {
    backward_ctx *b = ctx;
    loom_graph *g = b->g;
    loom_param *p = g->model->params[i];
    if (!grad)
        grad = loom_expand(g, loom_scalar(g, 0.0, LOOM_F32), p->ndim, p->shape);
    if (b->weight != 1)
        grad = loom_mul(g, grad, loom_scalar(g, b->weight, LOOM_F32));
    if (b->add) /* this device's sum of the micro-batches before (all-reduced with the last) */
        grad = loom_add(g, loom__persist(g, LOOM_SLAB_GRAD, p->offset, p->ndim, p->shape), grad);
    loom__store(g, grad, LOOM_SLAB_GRAD, p->offset);
    b->stored[i] = true;
    int64_t lo = p->offset, hi = p->offset + p->numel;
    if (b->hi > b->lo && hi != b->lo && lo != b->hi)
        flush(b);        /* not adjacent: close the open bucket */
    if (b->hi > b->lo) { /* adjacent: extend the open bucket */
        b->lo = lo < b->lo ? lo : b->lo;
        b->hi = hi > b->hi ? hi : b->hi;
    } else {
        b->lo = lo, b->hi = hi;
    }
    int64_t limit = g->bucket_bytes > 0 ? g->bucket_bytes : 1 << 20;
    if ((b->hi - b->lo) * (int64_t)sizeof(float) >= limit)
        flush(b);
}

static void backward(loom_graph *g, loom_tensor *loss, double weight, bool add, bool sync);

void loom_backward(loom_graph *g, loom_tensor *loss) {
    backward(g, loss, 1.0, false, true);
}

void loom_backward_accumulate(loom_graph *g, loom_tensor *loss, double weight, bool first,
                              bool last) {
    if (g && !g->err && !(weight > 0 && weight <= 1)) {
        loom__graph_fail(g, LOOM_EINVAL,
                         "loom_backward_accumulate: weight %g, expected a share in (0, 1]", weight);
        return;
    }
    backward(g, loss, weight, !first, last);
}

static void backward(loom_graph *g, loom_tensor *loss, double weight, bool add, bool sync) {
    if (!g || g->err)
        return;
    if (!loss || loom_tensor_numel(loss) != 1 || loss->dtype != LOOM_F32 || !g->model) {
        loom__graph_fail(g, LOOM_EINVAL, "loom_backward: %s",
                         !loss       ? "NULL loss"
                         : !g->model ? "the graph has no model"
                                     : "loss must be one f32 element");
        return;
    }
    loom_model *m = g->model;
    loom_tensor **wrt =
        loom__arena_alloc(&g->arena, sizeof(loom_tensor *) * (size_t)(2 * m->n + 1));
    bool *stored = loom__arena_alloc(&g->arena, sizeof(bool) * (size_t)(m->n + 1));
    if (!wrt || !stored) {
        loom__graph_fail(g, LOOM_ENOMEM, "loom_backward: out of memory");
        return;
    }
    for (int64_t i = 0; i < m->n; i++)
        wrt[i] = i < g->npersist ? g->persist_nodes[i] : NULL;
    loom_output(loss);
    loss->is_loss = true;
    /* Stores (and all-reduces, on several devices) are recorded as each gradient becomes final,
     * last layers first, so that they run while the rest of backward is still ahead. */
    backward_ctx b = {g, stored, 0, 0, weight, add, sync};
    loom__grads(g, loss, (int)m->n, wrt, wrt + m->n, store_grad, &b);
    for (int64_t i = m->n - 1; i >= 0 && !g->err; i--)
        if (!stored[i]) /* not used by this loss: a zero gradient */
            store_grad(&b, (int)i, NULL);
    flush(&b);
}
