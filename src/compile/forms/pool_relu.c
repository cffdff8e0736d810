/*
 * forms/pool_relu.c - the fusion rule "pool-relu" (its row in compile/fuse.c's loom__rules: what it
 * matches, when it applies, the kernel form it makes and what it records of it).
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

/* The POOLMAX writes the ReLU's buffer, not its own. */
static int64_t relu_bytes(const loom__program *p, const loom__form *x, int64_t bytes) {
    (void)p, (void)x, (void)bytes;
    return 0;
}

static void relu_place(loom__program *p, const loom__form *x, loom__placer *pl) {
    loom__place_node(pl, p, x->u.relu);
}

static void relu_describe(FILE *f, const loom__program *p, const loom__form *x) {
    (void)p;
    fprintf(f, ", computing RELU#%d", x->u.relu);
}

/* The ReLU's values, in place of the pooling's own (never written). */
static int relu_values(const loom__program *p, const loom__form *x, loom__value *out, int n) {
    int w = 0;
    for (int k = 0; k < n; k++)
        if (out[k].id != x->node)
            out[w++] = out[k];
    out[w++] = loom__value_of(p, x->u.relu);
    return w;
}

const loom__form_ops loom__form_relu = {.kind = LOOM_FORM_RELU,
                                        .own_bytes = relu_bytes,
                                        .place = relu_place,
                                        .describe = relu_describe,
                                        .values = relu_values};

static void dy_describe(FILE *f, const loom__program *p, const loom__form *x) {
    (void)p;
    fprintf(f, " and the ReLU's backward of node %d", x->reads.node);
}

const loom__form_ops loom__form_relu_dy = {.kind = LOOM_FORM_RELU_DY, .describe = dy_describe};
