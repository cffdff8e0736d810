/*
 * forms/product_act.c - the fusion rule "product-act" (its row in compile/fuse.c's loom__rules:
 * what it matches, when it applies, the kernel form it makes and what it records of it).
 */
#include "forms.h"

#include <math.h>
#include <string.h>

/* Whether leaf v of a kernel with a (rows, cols) root is a row broadcast down the rows, its
 * elements contiguous: a bias. */
static bool bias_row(const loom__program *p, int32_t v) {
    const loom__pnode *b = &p->nodes[v];
    return b->dtype == LOOM_F32 && b->ndim == 2 && b->lay.stride[0] == 0 && b->lay.stride[1] == 1 &&
           !b->gndim;
}

/* Whether leaf v is the constant +0.0, broadcast (as loom_scalar(g, 0.0) reads). */
static bool zero_const(const loom__program *p, int32_t v) {
    const loom__pnode *z = &p->nodes[v];
    float f = 1;
    if (z->dtype != LOOM_F32 || z->lay.base != LOOM_BASE_CONST)
        return false;
    for (int d = 0; d < z->ndim; d++)
        if (z->shape[d] != 1 && z->lay.stride[d] != 0)
            return false;
    memcpy(&f, &p->consts[z->lay.index], sizeof f);
    return f == 0 && !signbit(f);
}

/* Whether v is a leaf of a kernel (not computed in it) holding a float matrix of r's shape, its
 * rows contiguous and apart by at least their length. */
static bool matrix_leaf(const loom__program *p, int32_t v, const loom__pnode *r) {
    const loom__pnode *m = &p->nodes[v];
    return m->fused_into < 0 && m->dtype == LOOM_F32 && m->ndim == 2 &&
           m->shape[0] == r->shape[0] && m->shape[1] == r->shape[1] && m->lay.stride[1] == 1 &&
           m->lay.stride[0] >= m->shape[1] && !m->gndim;
}

/* Whether kernel k (root r) is where(h > 0, L, 0) with h a matrix of L's shape, its rows
 * contiguous: the mask leaf h, or -1. */
static int32_t relu_backward(const loom__program *p, const loom__fused *k, int32_t L) {
    const loom__pnode *r = &p->nodes[k->root];
    if (r->op != LOOM_OP_WHERE || r->src[1] != L || !zero_const(p, r->src[2]))
        return -1;
    const loom__pnode *c = &p->nodes[r->src[0]];
    if (c->op != LOOM_OP_CMPGT || c->fused_into != k->root || !zero_const(p, c->src[1]))
        return -1;
    return matrix_leaf(p, c->src[0], r) ? c->src[0] : -1;
}

/* Whether a live node in (lo, hi) writes or reads slab `slab` over [a, b) (a store, a sync, an
 * operand, or a kernel's output in its slab place). */
static bool range_touched(const loom__program *p, const bool *live, int64_t lo, int64_t hi,
                          int32_t slab, int64_t a, int64_t b) {
    for (int64_t c = lo + 1; c < hi; c++) {
        const loom__pnode *t = &p->nodes[c];
        if (live[c] &&
            (loom__slab_accesses(p, t, slab, a, b) ||
             (loom__runs_kernel(t) && loom__slab_touches(&t->lay, t->ndim, t->shape, slab, a, b))))
            return true;
    }
    return false;
}

/* A SUM over axis 0 of root r (rows, cols) that product L's epilogue makes, which can be summed
 * as the product stores its final rows (nothing between L and it touching its output): the SUM,
 * or -1. */
static int32_t column_sum(const loom__program *p, const bool *live, int32_t L, int32_t r) {
    int64_t cols = p->nodes[r].shape[1];
    for (int32_t s = r + 1; s < p->n; s++) {
        const loom__pnode *t = &p->nodes[s];
        if (!live[s] || t->op != LOOM_OP_SUM || t->src[0] != r || t->attr.axis != 0 ||
            t->dtype != LOOM_F32 || t->check || t->copy || t->fused_into >= 0 || t->made_by >= 0 ||
            loom__numel(t->ndim, t->shape) != cols || t->lay.stride[t->ndim - 1] != 1 ||
            (t->lay.base != LOOM_BASE_WS && t->lay.base != LOOM_BASE_PERSIST))
            continue;
        if (t->lay.base == LOOM_BASE_PERSIST &&
            range_touched(p, live, L, s, t->lay.index, t->lay.offset, t->lay.offset + cols))
            continue;
        return s;
    }
    return -1;
}

int64_t loom__rule_product_act(loom__program *p, const loom__fuse_in *in) {
    const bool *live = in->live;
    int64_t n = 0;
    if (!loom__use_own_gemm()) /* (its epilogue in registers is gemm.c's, AVX-512) */
        return 0;
    for (int32_t L = 0; L < p->n; L++) {
        loom__pnode *t = &p->nodes[L];
        if (!live[L] || t->op != LOOM_OP_MATMUL || t->epi < 0 || t->fused_into >= 0 || t->ndim != 2)
            continue;
        const loom__fused *k = &p->fused[t->epi];
        const loom__pnode *r = &p->nodes[k->root];
        if (k->args[k->epi_arg] != L || k->nout > 0 || r->ndim != 2 ||
            r->lay.base != LOOM_BASE_WS || r->lay.stride[0] != r->shape[1] ||
            (r->lay.stride[1] != 1 && r->shape[1] > 1))
            continue;
        int32_t mask = relu_backward(p, k, L), members = 0, add = -1, relu = -1;
        for (int32_t m = 0; m <= k->root; m++)
            if (m == k->root ||
                (p->nodes[m].fused_into >= 0 && loom__fuse_root_of(p, m) == k->root)) {
                members++;
                add = p->nodes[m].op == LOOM_OP_ADD ? m : add;
                relu = p->nodes[m].op == LOOM_OP_RELU ? m : relu;
            }
        /* RELU(L), ADD(L, v) or RELU(ADD(L, v)), v a bias row or a matrix (a residual), either
         * side of the ADD (a float addition's operands commute exactly) */
        const loom__pnode *ad = add >= 0 ? &p->nodes[add] : NULL;
        int32_t v = !ad ? -1 : ad->src[0] == L ? ad->src[1] : ad->src[0];
        bool ok = members == (add >= 0) + (relu >= 0) && (relu < 0 || relu == k->root) &&
                  (add < 0 || add == (relu >= 0 ? p->nodes[relu].src[0] : k->root)) &&
                  (relu < 0 || p->nodes[relu].src[0] == (add >= 0 ? add : L)) &&
                  (add < 0 || ((ad->src[0] == L) != (ad->src[1] == L) &&
                               (bias_row(p, v) || matrix_leaf(p, v, r))));
        bool where = mask >= 0 && members == 2; /* the WHERE and its CMPGT */
        if (!where && !ok)
            continue;
        int32_t sum = column_sum(p, live, L, k->root);
        loom__form *x = loom__form_add(p, L, LOOM_FORM_ACT);
        if (!x)
            return -1;
        x->u.act.relu = !where && relu >= 0;
        x->u.act.add = where ? -1 : v;
        x->u.act.mask = where ? mask : -1;
        x->u.act.sum = sum;
        if (sum >= 0) /* it runs no kernel of its own */
            p->nodes[sum].made_by = L, n++;
        n++;
    }
    return n;
}

/* The product writes its epilogue's root directly: no block of its own. */
static int64_t act_bytes(const loom__program *p, const loom__form *x, int64_t bytes) {
    (void)p, (void)x, (void)bytes;
    return 0;
}

static void act_place(loom__program *p, const loom__form *x, loom__placer *pl) {
    if (x->u.act.sum >= 0)
        loom__place_node(pl, p, x->u.act.sum);
}

static void act_describe(FILE *f, const loom__program *p, const loom__form *x) {
    int32_t add = x->u.act.add;
    fprintf(f, " as it stores (");
    if (x->u.act.mask >= 0)
        fprintf(f, "where node %d > 0", x->u.act.mask);
    else
        fprintf(f, "%s%s",
                add < 0                            ? ""
                : p->nodes[add].lay.stride[0] == 0 ? "bias"
                                                   : "a matrix added",
                add >= 0 && x->u.act.relu ? ", ReLU"
                : x->u.act.relu           ? "ReLU"
                                          : "");
    fprintf(f, " in registers)");
    if (x->u.act.sum >= 0)
        fprintf(f, ", summing its columns into SUM#%d", x->u.act.sum);
}

static int act_values(const loom__program *p, const loom__form *x, loom__value *out, int n) {
    if (x->u.act.sum >= 0)
        out[n++] = loom__value_of(p, x->u.act.sum);
    return n;
}

const loom__form_ops loom__form_act = {.kind = LOOM_FORM_ACT,
                                       .own_bytes = act_bytes,
                                       .place = act_place,
                                       .describe = act_describe,
                                       .values = act_values};
