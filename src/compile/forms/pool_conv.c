/*
 * forms/pool_conv.c - the fusion rule "pool-conv" (its row in compile/fuse.c's loom__rules: what it
 * matches, when it applies, the kernel form it makes and what it records of it).
 */
#include "forms.h"

#include <string.h>

/* The live pool gradients reading node x as their input that take POOLMAX f's codes instead. */
static int32_t codes_readers(const loom__program *p, const bool *live, int32_t x, int32_t f) {
    int32_t n = 0;
    for (int32_t c = x + 1; c < p->n; c++)
        n += live[c] && p->nodes[c].op == LOOM_OP_POOLGRAD && p->nodes[c].src[0] == x &&
             loom__pool_codes_of(p, (int32_t)c) == f;
    return n;
}

int64_t loom__rule_pool_conv(loom__program *p, const loom__fuse_in *in) {
    const bool *live = in->live, *is_out = in->is_out;
    const int32_t *readers = in->readers;
    if (!loom__use_own_gemm())
        return 0;
    int64_t n = 0;
    for (int32_t f = 0; f < p->n; f++) {
        loom__pnode *t = &p->nodes[f];
        if (!live[f] || t->op != LOOM_OP_POOLMAX || t->dtype != LOOM_F32 || t->copy ||
            t->lay.base != LOOM_BASE_WS || t->lay.index != f || t->ndim != 4)
            continue;
        /* its input: a contiguous reshape of the product's output or of its epilogue's root */
        int32_t xv = t->src[0], R = loom__fuse_owner(p, xv);
        const loom__pnode *x = &p->nodes[xv];
        if (R < 0 || x->op != LOOM_OP_RESHAPE || !loom__is_view(x) || x->gndim || x->src[0] != R ||
            x->lay.offset != 0 || x->lay.stride[3] != 1 || x->lay.stride[2] != x->shape[3] ||
            x->lay.stride[1] != x->shape[2] * x->shape[3] ||
            x->lay.stride[0] != x->shape[1] * x->lay.stride[1] ||
            readers[xv] - codes_readers(p, live, xv, f) != 1 || is_out[xv])
            continue;
        int32_t M = loom__epilogue_root(p, R) ? p->fused[p->fused_of[R]].epi_of : R;
        loom__pnode *m = &p->nodes[M];
        const loom__pnode *r = &p->nodes[R];
        if (m->op != LOOM_OP_MATMUL || m->ndim != 2 || m->dtype != LOOM_F32 || m->copy ||
            m->check || r->check || is_out[M] || is_out[R] || readers[M] != 1 || readers[R] != 1 ||
            m->fused_into >= 0 || r->ndim != 2 || r->shape[0] != x->shape[0] ||
            r->shape[1] != x->shape[1] * x->lay.stride[1] ||
            loom__fuse_slab_touched_between(p, live, M, f, false, NULL, 0))
            continue;
        loom__gmat ga = {NULL, {0}, {0}}, gb = {NULL, {0}, {0}};
        loom__operand_dims(&p->nodes[m->src[0]], &ga.row, &ga.col);
        loom__operand_dims(&p->nodes[m->src[1]], &gb.row, &gb.col);
        loom__form *c = loom__form_add(p, f, LOOM_FORM_CONV);
        if (!c)
            return -1;
        c->u.product = M; /* (asked of the pooling: by planes, or by windows through the
                           * transpose) */
        if (!loom__conv_planes_ok(m->shape[0], m->shape[1], loom__numel(ga.col.n, ga.col.size), &ga,
                                  &gb, x->lay.stride[1]) &&
            !loom__pool_conv_t_ok(p, f)) {
            loom__form_drop(p, f, LOOM_FORM_CONV);
            continue;
        }
        m->fused_into = f;
        n++;
    }
    return n;
}

/* The product's planes (its own and its epilogue's), aligned. */
static void conv_place(loom__program *p, const loom__form *x, loom__placer *pl) {
    p->nodes[x->u.product].ws_off =
        loom__place(pl, (int64_t)loom__pool_conv_bytes(p, x->node), x->u.product);
}

static void conv_describe(FILE *f, const loom__program *p, const loom__form *x) {
    const loom__pnode *m = &p->nodes[x->u.product];
    fprintf(f, ", its product MATMUL#%d made plane by plane", x->u.product);
    if (m->epi >= 0)
        fprintf(f, " with its epilogue loom_k%d", p->fused[m->epi].root);
}

const loom__form_ops loom__form_conv = {
    .kind = LOOM_FORM_CONV, .place = conv_place, .describe = conv_describe, .run = loom__pool_conv};
