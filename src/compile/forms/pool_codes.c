/*
 * forms/pool_codes.c - the fusion rule "pool-codes" (its row in compile/fuse.c's loom__rules: what
 * it matches, when it applies, the kernel form it makes and what it records of it).
 */
#include "forms.h"

#include <string.h>

int64_t loom__rule_pool_codes(loom__program *p, const loom__fuse_in *in) {
    const bool *live = in->live;
    int64_t n = 0;
    for (int32_t L = 0; L < p->n; L++) {
        loom__pnode *g = &p->nodes[L];
        const loom_window *w = &g->attr.win;
        if (!live[L] || g->op != LOOM_OP_POOLGRAD ||
            !loom__pool_codes_ok(w, p->nodes[g->src[0]].lay.stride[3], (loom_dtype)g->dtype))
            continue;
        for (int32_t m = 0; m < L; m++) {
            loom__pnode *f = &p->nodes[m];
            if (live[m] && f->op == LOOM_OP_POOLMAX && f->src[0] == g->src[0] &&
                !memcmp(&f->attr.win, w, sizeof *w) && f->dtype == g->dtype &&
                f->lay.base == LOOM_BASE_WS && f->lay.index == m && !f->copy) {
                if (!loom__pool_keeps_codes(p, m) && !loom__form_add(p, m, LOOM_FORM_CODES))
                    return -1;
                loom__form *x = loom__form_add(p, L, LOOM_FORM_CODES_READ);
                if (!x)
                    return -1;
                x->reads.operand = 0, x->reads.node = m; /* (the codes, not x) */
                n++;
                break;
            }
        }
    }
    return n;
}

/* The POOLMAX: its codes after its values, with 16 bytes to spare. */
static int64_t codes_bytes(const loom__program *p, const loom__form *x, int64_t bytes) {
    const loom__pnode *t = &p->nodes[x->node];
    return bytes + loom__numel(t->ndim, t->shape) + 16;
}

static void codes_describe(FILE *f, const loom__program *p, const loom__form *x) {
    (void)p, (void)x;
    fprintf(f, ", keeping argmax codes");
}

const loom__form_ops loom__form_codes = {
    .kind = LOOM_FORM_CODES, .own_bytes = codes_bytes, .describe = codes_describe};

static void read_describe(FILE *f, const loom__program *p, const loom__form *x) {
    (void)p;
    fprintf(f, ", reading the argmax codes of POOLMAX#%d", x->reads.node);
}

const loom__form_ops loom__form_codes_read = {.kind = LOOM_FORM_CODES_READ,
                                              .describe = read_describe};
