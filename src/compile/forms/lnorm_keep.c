/*
 * forms/lnorm_keep.c - the fusion rule "lnorm-keep" (its row in compile/fuse.c's loom__rules: what
 * it matches, when it applies, the kernel form it makes and what it records of it).
 *
 * Layer normalization's gradient needs each row's xhat = (x - mean) rstd and rstd, which it
 * otherwise makes again from x (two passes over the row for the statistics, one for xhat). The
 * forward's output is xhat, computed by the same operations; so the forward writes each row's rstd
 * after its values (LNORM_KEEP) and the gradient reads that output and rstd instead of x
 * (LNORM_READ): two of its four passes gone, and x free once the forward has run (a GPT's
 * residual stream, held to the backward for nothing else). The same values, bit for bit.
 */
#include "forms.h"

int64_t loom__rule_lnorm_keep(loom__program *p, const loom__fuse_in *in) {
    const bool *live = in->live;
    int64_t n = 0;
    for (int32_t L = 0; L < p->n; L++) {
        const loom__pnode *g = &p->nodes[L];
        if (!live[L] || g->op != LOOM_OP_LNORMGRAD || g->copy)
            continue;
        for (int32_t m = 0; m < L; m++) { /* the forward of the same x, eps and dtype */
            const loom__pnode *f = &p->nodes[m];
            if (!live[m] || f->op != LOOM_OP_LNORM || f->src[0] != g->src[0] ||
                f->attr.value != g->attr.value || f->dtype != g->dtype || f->copy ||
                f->lay.base != LOOM_BASE_WS || f->lay.index != m)
                continue;
            if (!loom__form_get(p, m, LOOM_FORM_LNORM_KEEP) &&
                !loom__form_add(p, m, LOOM_FORM_LNORM_KEEP))
                return -1;
            loom__form *x = loom__form_add(p, L, LOOM_FORM_LNORM_READ);
            if (!x)
                return -1;
            x->reads.operand = 0, x->reads.node = m; /* (its output and rstd, not x) */
            n++;
            break;
        }
    }
    return n;
}

/* The forward: a row's rstd after its values. */
static int64_t keep_bytes(const loom__program *p, const loom__form *x, int64_t bytes) {
    const loom__pnode *t = &p->nodes[x->node];
    int64_t rows =
        t->shape[t->ndim - 1] ? loom__numel(t->ndim, t->shape) / t->shape[t->ndim - 1] : 0;
    return bytes + rows * (int64_t)loom__dtype_size((loom_dtype)t->dtype);
}

static void keep_describe(FILE *f, const loom__program *p, const loom__form *x) {
    (void)p, (void)x;
    fprintf(f, ", keeping each row's rstd");
}

const loom__form_ops loom__form_lnorm_keep = {
    .kind = LOOM_FORM_LNORM_KEEP, .own_bytes = keep_bytes, .describe = keep_describe};

static void read_describe(FILE *f, const loom__program *p, const loom__form *x) {
    (void)p;
    fprintf(f, ", reading LNORM#%d's output and rstd instead of x", x->reads.node);
}

const loom__form_ops loom__form_lnorm_read = {.kind = LOOM_FORM_LNORM_READ,
                                              .describe = read_describe};
