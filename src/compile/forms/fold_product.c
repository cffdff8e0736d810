/*
 * forms/fold_product.c - the fusion rule "fold-product" (its row in compile/fuse.c's loom__rules:
 * what it matches, when it applies, the kernel form it makes and what it records of it).
 */
#include "forms.h"

#include <string.h>

int64_t loom__rule_fold_product(loom__program *p, const loom__fuse_in *in) {
    const bool *live = in->live, *is_out = in->is_out;
    const int32_t *readers = in->readers;
    bool own = loom__use_own_gemm();
    if (!own && !loom__use_gemm256())
        return 0;
    int64_t fused = 0;
    for (int64_t i = 0; i < p->n; i++) {
        loom__pnode *f = &p->nodes[i];
        /* (AVX-512 at stride 1 adds each tile into the image from the registers; a strided fold's
         * scattered adds made its product 6x slower than the product and a fold apart,
         * bench/RESULTS.md, so there, as on AVX2, blocks of it are folded in cache) */
        bool strided = f->attr.win.sh > 1 || f->attr.win.sw > 1;
        if (!live[i] || f->op != LOOM_OP_FOLD || f->dtype != LOOM_F32 || f->attr.win.ph ||
            f->attr.win.pw || f->lay.base != LOOM_BASE_WS)
            continue;
        int32_t m = loom__fuse_folded_product(p, f);
        if (m < 0 || readers[m] != 1 || readers[f->src[0]] != 1 || is_out[m] || is_out[f->src[0]] ||
            p->nodes[m].check || p->nodes[m].fused_into >= 0)
            continue;
        if ((!own || strided) && !loom__fold_blocks_ok(p, (int32_t)i, m))
            continue;
        p->nodes[m].fused_into = (int32_t)i;
        fused++;
    }
    return fused;
}
