/*
 * forms/conv_back.c - the fusion rule "conv-back" (its row in compile/fuse.c's loom__rules: what it
 * matches, when it applies, the kernel form it makes and what it records of it).
 */
#include "forms.h"

#include <string.h>

/* Whether a node after x and before f reads x (through views): x cannot move to f. */
static bool read_before(const loom__program *p, const bool *live, int32_t x, int32_t f) {
    bool *seen = loom__calloc((size_t)f + 1, sizeof(bool));
    bool read = !seen;
    if (seen)
        seen[x] = true;
    for (int32_t c = x + 1; !read && c < f; c++)
        for (int q = 0; q < 3 && live[c]; q++)
            if (p->nodes[c].src[q] >= 0 && seen[p->nodes[c].src[q]]) {
                if (!loom__is_view(&p->nodes[c]))
                    read = true;
                seen[c] = true;
            }
    loom__free(seen);
    return read;
}

/* Whether node c, a reader of the rows, can be computed by the fold: a kernel of the
 * interpreter's writing its own row-major buffer or its slab place, not yet fused anywhere. */
static bool movable(const loom__program *p, int32_t c) {
    const loom__pnode *t = &p->nodes[c];
    return t->dtype == LOOM_F32 && !t->check && !t->copy && t->fused_into < 0 && t->epi < 0 &&
           (p->fused_of == NULL || p->fused_of[c] < 0) && t->ndim == 2 &&
           t->lay.stride[0] == t->shape[1] && t->lay.stride[1] == 1 &&
           ((t->lay.base == LOOM_BASE_WS && t->lay.index == c) || t->lay.base == LOOM_BASE_PERSIST);
}

int64_t loom__rule_conv_back(loom__program *p, const loom__fuse_in *in) {
    const bool *live = in->live, *is_out = in->is_out;
    const int32_t *readers = in->readers;
    if (!loom__use_own_gemm() || !loom__pool_codes_available())
        return 0;
    int64_t n = 0;
    for (int32_t f = 0; f < p->n; f++) {
        loom__pnode *t = &p->nodes[f];
        int32_t m = live[f] && t->op == LOOM_OP_FOLD ? loom__fuse_folded_product(p, t) : -1;
        if (m < 0 || p->nodes[m].fused_into != f)
            continue;
        /* the product's B: a row-major 2-D view of a pool gradient read from its codes */
        int32_t R = p->nodes[m].src[1];
        const loom__pnode *r = &p->nodes[R];
        int32_t P = r->op == LOOM_OP_RESHAPE ? r->src[0] : -1;
        if (P < 0)
            continue;
        const loom__pnode *g = &p->nodes[P];
        if (!loom__is_view(r) || r->gndim || r->ndim != 2 || loom__fuse_owner(p, R) != P ||
            r->lay.offset != 0 || r->lay.stride[0] != r->shape[1] || r->lay.stride[1] != 1 ||
            is_out[R] || g->op != LOOM_OP_POOLGRAD || g->dtype != LOOM_F32 ||
            loom__pool_codes_of(p, P) < 0 || !loom__pool2x2(&g->attr.win, 1) || g->epi >= 0 ||
            g->check || is_out[P] || readers[P] != 1 || loom__fuse_owner(p, P) != P ||
            g->ndim != 4 || !loom__contiguous(4, g->shape, g->lay.stride) ||
            g->shape[0] != r->shape[0])
            continue;
        const loom__pnode *d = &p->nodes[loom__pool_dy(p, P)];
        if (d->lay.stride[3] != 1 || d->lay.stride[2] != d->shape[3]) /* (planes of any size) */
            continue;
        /* the rows' other readers: the weight gradient (rows x an unfold), a sum along them */
        int32_t w = -1, s = -1;
        bool ok = true;
        for (int32_t c = R + 1; c < p->n && ok; c++)
            for (int q = 0; q < 3 && live[c]; q++) {
                const loom__pnode *x = &p->nodes[c];
                if (x->src[q] != R || (c == m && q == 1))
                    continue;
                if (q == 0 && w < 0 && x->op == LOOM_OP_MATMUL && x->made_by < 0 && movable(p, c))
                    w = c;
                else if (q == 0 && s < 0 && x->op == LOOM_OP_SUM &&
                         (x->made_by == P || x->made_by < 0) && loom__fuse_sinkable(p, c, R, P) &&
                         movable(p, c))
                    s = c;
                else
                    ok = false;
            }
        int32_t skip[3] = {m, w, s}; /* (the product runs in the fold already) */
        if (!ok || w < 0 || w > f || s > f || read_before(p, live, w, f) ||
            (s >= 0 && read_before(p, live, s, f)) ||
            loom__fuse_slab_touched_between(p, live, P, f, true, skip, s >= 0 ? 3 : 2))
            continue;
        const loom__pnode *mw = &p->nodes[w];
        loom__gmat ga = {NULL, {0}, {0}}, gb = {NULL, {0}, {0}};
        loom__operand_dims(&p->nodes[p->nodes[m].src[0]], &ga.row, &ga.col);
        loom__operand_dims(&p->nodes[mw->src[1]], &gb.row, &gb.col);
        if (loom__fuse_owner(p, mw->src[1]) >= f ||
            !loom__conv_back_ok(p->nodes[m].shape[0], p->nodes[m].shape[1], r->shape[0], &ga,
                                mw->shape[1], &gb))
            continue;
        loom__form *x = loom__form_add(p, f, LOOM_FORM_BACK);
        if (!x)
            return -1;
        const loom__form *sk = loom__sinks_of(p, P); /* its sinks are the fold's now */
        for (int q = 0; sk && q < sk->u.sinks.n; q++)
            p->nodes[sk->u.sinks.sink[q]].made_by = -1;
        loom__form_drop(p, P, LOOM_FORM_SINKS);
        p->nodes[P].fused_into = p->nodes[w].fused_into = f;
        if (s >= 0)
            p->nodes[s].fused_into = f;
        x->u.back.grad = P, x->u.back.w = w, x->u.back.sum = s;
        n++;
    }
    return n;
}

/* The blocks' scratch (at the fold's product), and what the fold computes besides. */
static void back_place(loom__program *p, const loom__form *x, loom__placer *pl) {
    int32_t m = p->nodes[p->nodes[x->node].src[0]].src[0];
    p->nodes[m].ws_off = loom__place(pl, (int64_t)loom__fold_back_bytes(p, x->node), m);
    loom__place_node(pl, p, x->u.back.w);
    if (x->u.back.sum >= 0)
        loom__place_node(pl, p, x->u.back.sum);
}

/* (the gradient's own codes and ReLU lines name the same nodes) */
static void back_describe(FILE *f, const loom__program *p, const loom__form *x) {
    int32_t g = x->u.back.grad;
    fprintf(f, ", making POOLGRAD#%d's rows a block at a time from the argmax codes of POOLMAX#%d",
            g, loom__pool_codes_of(p, g));
    if (loom__form_get(p, g, LOOM_FORM_RELU_DY))
        fprintf(f, " and the ReLU's backward of node %d", loom__pool_dy(p, g));
}

static int back_values(const loom__program *p, const loom__form *x, loom__value *out, int n) {
    int32_t also[2] = {x->u.back.w, x->u.back.sum};
    for (int q = 0; q < 2; q++)
        if (also[q] >= 0)
            out[n++] = loom__value_of(p, also[q]);
    return n;
}

const loom__form_ops loom__form_back = {.kind = LOOM_FORM_BACK,
                                        .place = back_place,
                                        .describe = back_describe,
                                        .values = back_values,
                                        .run = loom__fold_back};
