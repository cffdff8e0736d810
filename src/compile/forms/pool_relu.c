/*
 * forms/pool_relu.c - the fusion rule "pool-relu" (its row in compile/fuse.c's loom__rules: what it
 * matches, when it applies, the kernel form it makes and what it records of it).
 */
#include "forms.h"

#include <string.h>

int64_t loom__rule_pool_relu(loom__program *p, const loom__fuse_in *in) {
    const bool *live = in->live, *is_out = in->is_out;
    int64_t n = 0;
    for (int32_t m = 0; m < p->n; m++) {
        loom__pnode *f = &p->nodes[m];
        const loom_window *w = &f->attr.win;
        int32_t r = -1;
        if (!live[m] || f->op != LOOM_OP_POOLMAX || f->dtype != LOOM_F32 ||
            !loom__pool_relu_ok(w, p->nodes[f->src[0]].lay.stride[3]) || is_out[m] ||
            f->lay.base != LOOM_BASE_WS || f->lay.index != m ||
            loom__fuse_readers_of(p, live, m, &r) != 1)
            continue;
        loom__pnode *t = &p->nodes[r];
        bool alone = t->fused_into < 0 && t->epi < 0 && t->made_by < 0; /* a kernel of its own */
        for (int32_t c = 0; alone && p->fused_of && c < r; c++)
            alone = loom__fuse_root_of(p, c) != r || c == r;
        if (t->op != LOOM_OP_RELU || t->src[0] != m || !alone || t->dtype != LOOM_F32 || t->copy ||
            t->lay.base != LOOM_BASE_WS || t->lay.index != r ||
            memcmp(t->shape, f->shape, sizeof t->shape) != 0 ||
            memcmp(t->lay.stride, f->lay.stride, sizeof t->lay.stride) != 0)
            continue;
        loom__form *x = loom__form_add(p, m, LOOM_FORM_RELU);
        if (!x)
            return -1;
        x->u.relu = r, t->made_by = m;
        n++;
        /* The ReLU's backward, where(relu > 0, x, 0), read only by the pool gradient that reads
         * these codes: that gradient takes x and the mask from the codes (bit 2). */
        for (int32_t L = r + 1; L < p->n; L++) {
            loom__pnode *g = &p->nodes[L];
            int32_t wn = g->src[1], cn = -1, only = -1;
            if (!live[L] || g->op != LOOM_OP_POOLGRAD || loom__pool_codes_of(p, L) != m)
                continue;
            const loom__pnode *wh = &p->nodes[wn];
            if (wh->op != LOOM_OP_WHERE || loom__fuse_readers_of(p, live, wn, &only) != 1 ||
                is_out[wn] ||
                (p->fused_of && p->fused_of[wn] >= 0 && p->fused[p->fused_of[wn]].epi_of >= 0) ||
                wh->check || !loom__fuse_is_zero(p, wh->src[2]) ||
                memcmp(wh->shape, t->shape, sizeof wh->shape) != 0 ||
                memcmp(p->nodes[wh->src[1]].shape, t->shape, sizeof wh->shape) != 0 ||
                (!loom__pool2x2(w, p->nodes[f->src[0]].lay.stride[3]) &&
                 !loom__contiguous(4, t->shape, p->nodes[wh->src[1]].lay.stride)))
                continue; /* (any window's scatter reading x in another plane order than its own
                           * cost more than the where() saves: bench/RESULTS.md) */
            cn = wh->src[0];
            const loom__pnode *cm = &p->nodes[cn];
            if (cm->op != LOOM_OP_CMPGT || cm->src[0] != r || !loom__fuse_is_zero(p, cm->src[1]) ||
                loom__fuse_readers_of(p, live, cn, &only) != 1 || is_out[cn] || cm->check)
                continue;
            /* the where() runs nowhere: nothing but its comparison may be computed in its
             * kernel (x must be stored: a gradient computed inside the where() would not be) */
            bool members = false;
            for (int32_t c = 0; c < wn && !members; c++)
                members = c != cn && p->nodes[c].fused_into >= 0 && loom__fuse_root_of(p, c) == wn;
            if (members)
                continue;
            loom__form *y = loom__form_add(p, L, LOOM_FORM_RELU_DY);
            if (!y)
                return -1;
            y->reads.operand = 1, y->reads.node = wh->src[1];
            p->nodes[wn].made_by = L, p->nodes[cn].made_by = L; /* neither runs */
            n++;
        }
    }
    return n;
}

/* The POOLMAX writes the ReLU's buffer, not its own (loom__form_no_buffer). */
static void relu_place(loom__program *p, const loom__form *x, loom__placer *pl) {
    loom__place_node(pl, p, x->u.relu);
}

static void relu_describe(FILE *f, const loom__program *p, const loom__form *x) {
    (void)p;
    fprintf(f, ", computing RELU#%d", x->u.relu);
}

/* The ReLU's values, in place of the pooling's own (never written). */
static int relu_values(const loom__program *p, const loom__form *x, loom__value *out, int n) {
    return loom__form_values_into(p, x, x->u.relu, out, n);
}

const loom__form_ops loom__form_relu = {.kind = LOOM_FORM_RELU,
                                        .own_bytes = loom__form_no_buffer,
                                        .place = relu_place,
                                        .describe = relu_describe,
                                        .values = relu_values};

static void dy_describe(FILE *f, const loom__program *p, const loom__form *x) {
    (void)p;
    fprintf(f, " and the ReLU's backward of node %d", x->reads.node);
}

const loom__form_ops loom__form_relu_dy = {.kind = LOOM_FORM_RELU_DY, .describe = dy_describe};
