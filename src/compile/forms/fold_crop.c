/*
 * forms/fold_crop.c - the fusion rule "fold-crop" (its row in compile/fuse.c's loom__rules: what it
 * matches, when it applies, the kernel form it makes and what it records of it).
 *
 * A padded convolution's input gradient is the fold of its product cropped: FOLD, CROP, and where
 * the convolution read the permuted output of another (its (C,N) planes), the copy of the crop's
 * permute and the ReLU's backward after it. The fold writes its planes there itself, once.
 */
#include "forms.h"

#include <string.h>

/* Whether node c runs a kernel of its own into its own contiguous float buffer, not an output:
 * a node whose values the fold may write instead. */
static bool own_buffer(const loom__program *p, const bool *is_out, int32_t c) {
    const loom__pnode *t = &p->nodes[c];
    return t->dtype == LOOM_F32 && !is_out[c] && !t->check && t->fused_into < 0 && t->epi < 0 &&
           t->made_by < 0 && !loom__epilogue_root(p, c) && t->lay.base == LOOM_BASE_WS &&
           t->lay.index == c && loom__contiguous(t->ndim, t->shape, t->lay.stride);
}

/* Whether node v swaps a 4-D value's first two axes. */
static bool swaps_nc(const loom__pnode *v) {
    static const int swap01[4] = {1, 0, 2, 3};
    return v->op == LOOM_OP_PERMUTE && loom__is_view(v) && v->ndim == 4 &&
           !memcmp(v->attr.perm, swap01, sizeof swap01);
}

/* The comparison of wh when it is where(mask > 0, x, +0) of x of its shape, the comparison
 * the only other thing in its kernel and read by it alone, the mask laid out as wh in the
 * workspace (no store can write it before the fold reads it); else -1. */
static int32_t relu_back(const loom__program *p, const bool *live, const bool *is_out, int32_t wh,
                         int32_t x) {
    const loom__pnode *t = &p->nodes[wh];
    int32_t cm = t->src[0], only = -1;
    if (t->op != LOOM_OP_WHERE || t->src[1] != x || !loom__fuse_is_zero(p, t->src[2]) ||
        memcmp(t->shape, p->nodes[x].shape, sizeof t->shape) != 0 || !own_buffer(p, is_out, wh))
        return -1;
    const loom__pnode *c = &p->nodes[cm];
    if (c->op != LOOM_OP_CMPGT || !loom__fuse_is_zero(p, c->src[1]) || is_out[cm] || c->check ||
        loom__fuse_readers_of(p, live, cm, &only) != 1)
        return -1;
    const loom__pnode *m = &p->nodes[c->src[0]];
    if (m->dtype != LOOM_F32 || m->ndim != t->ndim || m->lay.base != LOOM_BASE_WS ||
        memcmp(m->shape, t->shape, sizeof t->shape) != 0 ||
        !loom__contiguous(m->ndim, m->shape, m->lay.stride))
        return -1;
    for (int32_t q = 0; q < wh; q++) /* nothing but the comparison computed in its kernel */
        if (q != cm && p->nodes[q].fused_into >= 0 && loom__fuse_root_of(p, q) == wh)
            return -1;
    return cm;
}

int64_t loom__rule_fold_crop(loom__program *p, const loom__fuse_in *in) {
    const bool *live = in->live, *is_out = in->is_out;
    int64_t n = 0;
    for (int32_t f = 0; f < p->n; f++) {
        loom__pnode *t = &p->nodes[f];
        int32_t m = live[f] && t->op == LOOM_OP_FOLD ? loom__fuse_folded_product(p, t) : -1;
        int32_t c = -1, v = -1, r = -1, wh = -1, cm = -1;
        if (m < 0 || p->nodes[m].fused_into != f || t->form >= 0 || is_out[f] || t->check ||
            !loom__fold_crop_ok(t) || loom__fuse_readers_of(p, live, f, &c) != 1 ||
            p->nodes[c].op != LOOM_OP_CROP || p->nodes[c].src[0] != f ||
            !own_buffer(p, is_out, c) || (p->fused_of && p->fused_of[c] >= 0))
            continue;
        int32_t into = c;
        bool cn = false;
        /* the crop read only through its (C,N) permute, whose copy alone reads that */
        if (loom__fuse_readers_of(p, live, c, &v) == 1 && swaps_nc(&p->nodes[v]) && !is_out[v] &&
            loom__fuse_readers_of(p, live, v, &r) == 1 && p->nodes[r].op == LOOM_OP_RESHAPE &&
            p->nodes[r].copy && p->nodes[r].src[0] == v && own_buffer(p, is_out, r) &&
            (p->fused_of == NULL || p->fused_of[r] < 0))
            into = r, cn = true;
        if (loom__fuse_readers_of(p, live, into, &wh) == 1)
            cm = relu_back(p, live, is_out, wh, into);
        loom__form *x = loom__form_add(p, f, LOOM_FORM_CROP);
        if (!x)
            return -1;
        x->u.crop.crop = c, x->u.crop.cn = cn, x->u.crop.mask = -1, x->u.crop.into = into;
        p->nodes[c].made_by = f, n++;
        if (cn)
            p->nodes[r].made_by = f, n++;
        if (cm >= 0) {
            x->u.crop.mask = p->nodes[cm].src[0], x->u.crop.into = wh;
            p->nodes[wh].made_by = f, p->nodes[cm].made_by = f, n += 2;
        }
    }
    return n;
}

/* The fold writes the node it crops into, not a buffer of its own (loom__form_no_buffer). */
static void crop_place(loom__program *p, const loom__form *x, loom__placer *pl) {
    loom__place_node(pl, p, x->u.crop.into);
}

static void crop_describe(FILE *f, const loom__program *p, const loom__form *x) {
    fprintf(f, ", cropped into %s#%d", loom__ops[p->nodes[x->u.crop.into].op].name, x->u.crop.into);
    if (x->u.crop.mask >= 0)
        fprintf(f, " where node %d > 0", x->u.crop.mask);
}

/* The values it writes, in place of the fold's own (never written). */
static int crop_values(const loom__program *p, const loom__form *x, loom__value *out, int n) {
    return loom__form_values_into(p, x, x->u.crop.into, out, n);
}

const loom__form_ops loom__form_crop = {.kind = LOOM_FORM_CROP,
                                        .own_bytes = loom__form_no_buffer,
                                        .place = crop_place,
                                        .describe = crop_describe,
                                        .values = crop_values};
