/*
 * forms/pool_codes.c - the fusion rule "pool-codes" (its row in compile/fuse.c's loom__rules: what
 * it matches, when it applies, the kernel form it makes and the fields that form is run through).
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
                f->codes = true, g->codes_of = m;
                n++;
                break;
            }
        }
    }
    return n;
}
