/*
 * forms/pool_relu.c - the fusion rule "pool-relu" (its row in compile/fuse.c's loom__rules: what it
 * matches, when it applies, the kernel form it makes and the fields that form is run through).
 */
#include "forms.h"

#include <math.h>
#include <string.h>

/* The live readers of node v, the last of them into *only. */
static int32_t readers_of(const loom__program *p, const bool *live, int32_t v, int32_t *only) {
    int32_t n = 0;
    for (int32_t c = v + 1; c < p->n; c++)
        for (int q = 0; q < 3 && live[c]; q++)
            if (p->nodes[c].src[q] == v)
                n++, *only = c;
    return n;
}

/* Whether node id is the constant +0 (through views). */
static bool is_zero(const loom__program *p, int32_t id) {
    while (id >= 0 && loom__is_view(&p->nodes[id]))
        id = p->nodes[id].src[0];
    return id >= 0 && p->nodes[id].op == LOOM_OP_CONST && p->nodes[id].attr.value == 0 &&
           !signbit(p->nodes[id].attr.value);
}

int64_t loom__rule_pool_relu(loom__program *p, const loom__fuse_in *in) {
    const bool *live = in->live, *is_out = in->is_out;
    int64_t n = 0;
    for (int32_t m = 0; m < p->n; m++) {
        loom__pnode *f = &p->nodes[m];
        const loom_window *w = &f->attr.win;
        int32_t r = -1;
        if (!live[m] || f->op != LOOM_OP_POOLMAX || f->dtype != LOOM_F32 ||
            !loom__pool_relu_ok(w, p->nodes[f->src[0]].lay.stride[3]) || is_out[m] ||
            f->lay.base != LOOM_BASE_WS || f->lay.index != m || readers_of(p, live, m, &r) != 1)
            continue;
        loom__pnode *t = &p->nodes[r];
        bool alone = t->fused_into < 0 && t->epi < 0 && t->sink_of < 0; /* a kernel of its own */
        for (int32_t c = 0; alone && p->fused_of && c < r; c++)
            alone = loom__fuse_root_of(p, c) != r || c == r;
        if (t->op != LOOM_OP_RELU || t->src[0] != m || !alone || t->dtype != LOOM_F32 || t->copy ||
            t->lay.base != LOOM_BASE_WS || t->lay.index != r ||
            memcmp(t->shape, f->shape, sizeof t->shape) != 0 ||
            memcmp(t->lay.stride, f->lay.stride, sizeof t->lay.stride) != 0)
            continue;
        f->relu = r, t->sink_of = m;
        n++;
        /* The ReLU's backward, where(relu > 0, x, 0), read only by the pool gradient that reads
         * these codes: that gradient takes x and the mask from the codes (bit 2). */
        for (int32_t L = r + 1; L < p->n; L++) {
            loom__pnode *g = &p->nodes[L];
            int32_t wn = g->src[1], cn = -1, only = -1;
            if (!live[L] || g->op != LOOM_OP_POOLGRAD || g->codes_of != m)
                continue;
            const loom__pnode *wh = &p->nodes[wn];
            if (wh->op != LOOM_OP_WHERE || readers_of(p, live, wn, &only) != 1 || is_out[wn] ||
                (p->fused_of && p->fused_of[wn] >= 0 && p->fused[p->fused_of[wn]].epi_of >= 0) ||
                wh->check || !is_zero(p, wh->src[2]) ||
                memcmp(wh->shape, t->shape, sizeof wh->shape) != 0 ||
                memcmp(p->nodes[wh->src[1]].shape, t->shape, sizeof wh->shape) != 0 ||
                (!loom__pool2x2(w, p->nodes[f->src[0]].lay.stride[3]) &&
                 !loom__contiguous(4, t->shape, p->nodes[wh->src[1]].lay.stride)))
                continue; /* (any window's scatter reading x in another plane order than its own
                           * cost more than the where() saves: bench/RESULTS.md) */
            cn = wh->src[0];
            const loom__pnode *cm = &p->nodes[cn];
            if (cm->op != LOOM_OP_CMPGT || cm->src[0] != r || !is_zero(p, cm->src[1]) ||
                readers_of(p, live, cn, &only) != 1 || is_out[cn] || cm->check)
                continue;
            /* the where() runs nowhere: nothing but its comparison may be computed in its
             * kernel (x must be stored: a gradient computed inside the where() would not be) */
            bool members = false;
            for (int32_t c = 0; c < wn && !members; c++)
                members = c != cn && p->nodes[c].fused_into >= 0 && loom__fuse_root_of(p, c) == wn;
            if (members)
                continue;
            g->relu_dy = wh->src[1];
            p->nodes[wn].sink_of = L, p->nodes[cn].sink_of = L; /* neither runs */
            n++;
        }
    }
    return n;
}
