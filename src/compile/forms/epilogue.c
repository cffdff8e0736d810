/*
 * forms/epilogue.c - the fusion rule "epilogue" (its row in compile/fuse.c's loom__rules: what it
 * matches, when it applies, the kernel form it makes and what it records of it).
 */
#include "forms.h"

#include <string.h>

/* How many of the operands of kernel k's root and members are node L. */
static int32_t reads_of(const loom__program *p, const loom__fused *k, int32_t L) {
    int32_t n = 0;
    for (int32_t m = 0; m <= k->root; m++) {
        if (m != k->root && (p->nodes[m].fused_into < 0 || loom__fuse_root_of(p, m) != k->root))
            continue;
        for (int s = 0; s < 3; s++)
            n += p->nodes[m].src[s] == L;
    }
    return n;
}

/* The library node kernel k can run as the epilogue of, with its leaf index, or -1. */

static int32_t epilogue_of(const loom__program *p, const bool *live, const bool *is_out,
                           const int32_t *readers, const loom__fused *k, int *arg) {
    const loom__pnode *r = &p->nodes[k->root];
    bool outs_ws = true; /* members stored in buffers of their own (GELU beside its derivative),
                          * a block at a time like the root; not into slabs */
    for (int q = 0; q < k->nout; q++)
        outs_ws = outs_ws && p->nodes[k->outs[q]].lay.base == LOOM_BASE_WS;
    if (r->ndim != 2 || r->lay.base != LOOM_BASE_WS || r->check || r->dtype != LOOM_F32 || !outs_ws)
        return -1;
    for (int32_t m = 0; m < k->root; m++)
        if (loom__fuse_is_red(&p->nodes[m]) && loom__fuse_root_of(p, m) == k->root)
            return -1;
    for (int a = 1; a < k->nargs; a++) {
        int32_t v = k->args[a], L = loom__fuse_owner(p, v);
        /* the library node itself, or a view of it directly (no other view in between that
         * something else might read) */
        if (L < 0 || (v != L && p->nodes[v].src[0] != L) || p->nodes[L].copy || is_out[L] ||
            p->nodes[L].check)
            continue;
        const loom__pnode *lib = &p->nodes[L], *vn = &p->nodes[v];
        bool mm = lib->op == LOOM_OP_MATMUL && lib->ndim == 2 && lib->shape[1] >= 16 &&
                  p->nodes[lib->src[0]].shape[p->nodes[lib->src[0]].ndim - 1] > 0 &&
                  (loom__use_own_gemm() || loom__product_blocks_ok(p, L, LOOM_GEMM256_NC));
        bool pg = lib->op == LOOM_OP_POOLGRAD;
        /* the whole output, contiguous, read by this kernel alone (by its root, or where it
         * stores members too by those that read it) */
        if (!(mm || pg) || lib->dtype != LOOM_F32 || vn->lay.offset != 0 ||
            loom__numel(vn->ndim, vn->shape) != loom__numel(lib->ndim, lib->shape) ||
            readers[L] != (k->nout > 0 && v == L ? reads_of(p, k, L) : 1) ||
            (v != L && (readers[v] != 1 || is_out[v])))
            continue;
        int64_t s = 1;
        bool contiguous = true;
        for (int d = vn->ndim - 1; d >= 0; d--) {
            contiguous = contiguous && (vn->shape[d] == 1 || vn->lay.stride[d] == s);
            s *= vn->shape[d];
        }
        bool reads_slab = false; /* a slab written in between would change what it reads */
        for (int b = 1; b < k->nargs; b++)
            reads_slab = reads_slab || p->nodes[k->args[b]].lay.base == LOOM_BASE_PERSIST;
        if (!contiguous ||
            (reads_slab && loom__fuse_slab_touched_between(p, live, L, k->root, false, NULL, 0)))
            continue;
        bool ready = true; /* every other leaf is computed before the library kernel runs */
        for (int b = 1; b < k->nargs && ready; b++)
            ready = b == a || loom__fused_out_arg(k, b) || loom__fuse_owner(p, k->args[b]) < L;
        if (!ready)
            continue;
        *arg = a;
        return L;
    }
    return -1;
}

int64_t loom__rule_epilogue(loom__program *p, const loom__fuse_in *in) {
    const bool *live = in->live, *is_out = in->is_out;
    const int32_t *readers = in->readers;
    int64_t n = 0;
    for (int64_t f = 0; f < p->nfused; f++) {
        loom__fused *k = &p->fused[f];
        int arg = 0;
        int32_t L = epilogue_of(p, live, is_out, readers, k, &arg);
        if (L < 0 || p->nodes[L].epi >= 0)
            continue;
        k->epi_of = L, k->epi_arg = arg;
        p->nodes[L].epi = (int32_t)f;
        n++;
    }
    return n;
}
