/*
 * forms/elementwise.c - the fusion rule "elementwise" (its row in compile/fuse.c's loom__rules:
 * what it matches, when it applies, the kernel form it makes and what it records of it).
 */
#include "forms.h"

#include <string.h>

/* Adds the leaves of member or root m to kernel k; false if the kernel has too many. A member
 * of another kernel (stored there: GELU beside its derivative) is a leaf here. */
static bool add_leaves(const loom__program *p, loom__fused *k, int64_t m) {
    const loom__pnode *t = &p->nodes[m];
    for (int s = 0; s < loom__ops[t->op].arity; s++) {
        int32_t id = t->src[s];
        if (p->nodes[id].fused_into >= 0 && loom__fuse_root_of(p, id) == k->root)
            continue;
        bool seen = false;
        for (int a = 1; a < k->nargs && !seen; a++)
            seen = k->args[a] == id;
        if (seen)
            continue;
        if (k->nargs == LOOM_FUSED_MAX_ARGS)
            return false;
        k->args[k->nargs++] = id;
    }
    return true;
}

/* A kernel writing a slab in place may read that slab range only at the index it writes (each
 * element is read before it is written); a leaf reading it through other strides or offsets could
 * see elements the loop already wrote. */
static bool in_place_safe_for(const loom__program *p, const loom__fused *k, int32_t out) {
    const loom__layout *o = &p->nodes[out].lay;
    if (o->base != LOOM_BASE_PERSIST)
        return true;
    const loom__pnode *r = &p->nodes[out];
    int64_t lo = o->offset, hi = o->offset + loom__numel(r->ndim, r->shape);
    for (int a = 1; a < k->nargs; a++) {
        if (loom__fused_out_arg(k, a))
            continue;
        const loom__pnode *l = &p->nodes[k->args[a]];
        int64_t last = l->lay.offset;
        for (int d = 0; d < l->ndim; d++)
            last += (l->shape[d] - 1) * l->lay.stride[d];
        bool overlaps = l->lay.base == LOOM_BASE_PERSIST && l->lay.index == o->index &&
                        l->lay.offset < hi && last >= lo;
        if (overlaps &&
            (l->lay.offset != o->offset || memcmp(l->lay.stride, o->stride, sizeof o->stride) != 0))
            return false;
    }
    return true;
}

/* ... for each slab the kernel writes: its root's and its stored members' */
static bool in_place_safe(const loom__program *p, const loom__fused *k) {
    bool safe = in_place_safe_for(p, k, k->root);
    for (int q = 0; q < k->nout && safe; q++)
        safe = in_place_safe_for(p, k, k->outs[q]);
    return safe;
}

/* Whether a reduction is fused somewhere under node i. */
static bool has_red_below(const loom__program *p, int64_t i) {
    for (int64_t m = 0; m < i; m++)
        if (loom__fuse_is_red(&p->nodes[m]) && p->nodes[m].fused_into >= 0) {
            int64_t r = m;
            while (p->nodes[r].fused_into >= 0 && r != i)
                r = p->nodes[r].fused_into;
            if (r == i)
                return true;
        }
    return false;
}

/* GELU beside the derivative loom_gelu made of the same source (autograd's RULE(GELU) reads it):
 * the later GELUD the kernel's root (kept for the backward instead of GELU's input), GELU a
 * member stored too. One pass over their source instead of two, and the erf they share computed
 * once (the C compiler merges the two inlined loom_erff_sp of the same value: the same operations
 * on the same operands). GELU's readers all run after that kernel (the GELUD a few nodes on,
 * nothing but views of GELU between them); neither is under a reduction. Returns the
 * derivative's node, or -1. */
#define BESIDE_SPAN 4 /* nodes: loom_gelu makes the two at most a view apart */
static int32_t gelu_beside(const loom__program *p, const bool *live, const bool *is_out,
                           int64_t i) {
    const loom__pnode *t = &p->nodes[i];
    if (t->op != LOOM_OP_GELU || !live[i] || is_out[i] || t->check || t->lay.base != LOOM_BASE_WS)
        return -1;
    bool of[BESIDE_SPAN + 1] = {true}; /* node i + q is GELU or a view of it */
    for (int64_t q = 1; q <= BESIDE_SPAN && i + q < p->n; q++) {
        const loom__pnode *u = &p->nodes[i + q];
        bool reads = false;
        for (int k = 0; k < 3; k++)
            reads = reads || (u->src[k] >= i && u->src[k] < i + q && of[u->src[k] - i]);
        if (live[i + q] && reads && !loom__is_view(u)) /* computed from GELU before it */
            return -1;
        of[q] = reads;
        if (live[i + q] && u->op == LOOM_OP_GELUD && u->src[0] == t->src[0] && !is_out[i + q] &&
            !u->check && u->dtype == t->dtype && u->lay.base == LOOM_BASE_WS)
            return (int32_t)(i + q);
    }
    return -1;
}

int64_t loom__rule_elementwise(loom__program *p, const loom__fuse_in *in) {
    const bool *live = in->live, *is_out = in->is_out;
    int64_t n = p->n, fused = 0;
    int32_t *readers = loom__calloc((size_t)n + 1, sizeof(int32_t));
    int32_t *reader = loom__calloc((size_t)n + 1, sizeof(int32_t));
    bool *beside = loom__calloc((size_t)n + 1, sizeof(bool)); /* a member stored, or its root */
    p->fused_of = loom__malloc(sizeof(int32_t) * (size_t)(n + 1));
    p->fused = loom__calloc((size_t)n + 1, sizeof(loom__fused));
    if (!readers || !reader || !beside || !p->fused_of || !p->fused) {
        loom__free(readers), loom__free(reader), loom__free(beside);
        loom__unfuse(p);
        return -1;
    }
    for (int64_t i = 0; i < n; i++) {
        p->nodes[i].fused_into = -1;
        p->nodes[i].epi = -1;
        p->fused_of[i] = -1;
        /* a store done in place (its source writes the slab) is not a reader here */
        bool stored = p->nodes[i].op == LOOM_OP_STORE && p->nodes[i].elided;
        for (int k = 0; k < 3 && live[i] && !stored; k++)
            if (p->nodes[i].src[k] >= 0)
                readers[p->nodes[i].src[k]]++, reader[p->nodes[i].src[k]] = (int32_t)i;
    }
    for (int64_t i = 0; i < n; i++) { /* GELU beside its derivative */
        int32_t d = gelu_beside(p, live, is_out, i);
        if (d >= 0)
            p->nodes[i].fused_into = d, beside[i] = beside[d] = true, fused++;
    }
    for (int64_t i = 0; i < n; i++) { /* members */
        const loom__pnode *t = &p->nodes[i], *c = &p->nodes[reader[i]];
        if (beside[i]) /* (placed above) */
            continue;
        bool same = c->ndim == t->ndim && !memcmp(c->shape, t->shape, sizeof(int64_t) * t->ndim);
        /* an elementwise value stored in its slab place (an optimizer's momentum) and read by one
         * elementwise consumer of its shape (the update): computed and stored in that kernel */
        bool slab = t->lay.base == LOOM_BASE_PERSIST && loom__fuse_is_ew(t) &&
                    loom__fuse_is_ew(c) && same &&
                    loom__contiguous(t->ndim, t->shape, t->lay.stride);
        if (!live[i] || is_out[i] || t->check || readers[i] != 1 ||
            (t->lay.base != LOOM_BASE_WS && !slab) || c->dtype != t->dtype)
            continue;
        /* elementwise into elementwise; a reduction's input into it, computed in its loop (unless
         * a reduction is already under it: one per kernel); a reduction into an elementwise
         * consumer of its own shape */
        bool ok = (loom__fuse_is_ew(t) && loom__fuse_is_ew(c) && same) ||
                  (loom__fuse_is_red(t) && loom__fuse_is_ew(c) && same) ||
                  (loom__fuse_is_ew(t) && loom__fuse_is_red(c) && !has_red_below(p, i));
        if (!ok)
            continue;
        p->nodes[i].fused_into = reader[i];
        fused++;
    }
    for (int64_t i = 0; i < n; i++) { /* at most one reduction per kernel */
        if (!live[i] || !loom__fuse_is_red(&p->nodes[i]) || p->nodes[i].fused_into < 0)
            continue;
        int32_t r = loom__fuse_root_of(p, i);
        if (loom__fuse_is_red(&p->nodes[r]) || reader[r] == -2) {
            p->nodes[i].fused_into = -1, fused--;
            continue;
        }
        reader[r] = -2; /* reader[] is no longer needed: marks "kernel r has a reduction" */
    }
    /* An elementwise value read several times, every reader a member or the root of one kernel
     * of its shape without a reduction (a clipped gradient, read by both moments of an update):
     * computed once in that kernel, each reader taking its register (members are computed in
     * creation order). Consumers first, so that such values may feed each other. */
    for (int64_t i = n - 1; i >= 0; i--) {
        const loom__pnode *t = &p->nodes[i];
        if (!live[i] || is_out[i] || t->check || readers[i] < 2 || t->fused_into >= 0 ||
            !loom__fuse_is_ew(t) || t->lay.base != LOOM_BASE_WS)
            continue;
        int32_t root = -1, first = -1;
        bool ok = true;
        for (int64_t c = i + 1; c < n && ok; c++) {
            const loom__pnode *u = &p->nodes[c];
            bool reads = false;
            for (int k = 0; k < 3; k++)
                reads = reads || u->src[k] == i;
            if (!live[c] || !reads || (u->op == LOOM_OP_STORE && u->elided))
                continue;
            int32_t r = loom__fuse_root_of(p, c);
            ok = loom__fuse_is_ew(u) && u->dtype == t->dtype && u->ndim == t->ndim &&
                 !memcmp(u->shape, t->shape, sizeof(int64_t) * t->ndim) &&
                 (root < 0 || r == root) && loom__fuse_is_ew(&p->nodes[r]) && !has_red_below(p, r);
            root = r, first = first < 0 ? (int32_t)c : first;
        }
        if (ok && first >= 0)
            p->nodes[i].fused_into = first, fused++;
    }
restart:
    p->nfused = 0;
    for (int64_t i = 0; i < n; i++)
        p->fused_of[i] = -1;
    for (int64_t i = 0; i < n; i++) { /* kernels: roots with their leaves */
        const loom__pnode *t = &p->nodes[i];
        bool members = false;
        for (int64_t m = 0; m < i && !members && loom__fuse_is_red(t); m++)
            members = p->nodes[m].fused_into == i;
        /* a reduction alone: generated when small (the interpreter's generic loop costs more
         * than the arithmetic there: a softmax's max over 10 logits); a large one is left to the
         * interpreter's lanes, where a library kernel may take it as a sink */
        bool small = loom__fuse_is_red(t) && !members &&
                     loom__numel(p->nodes[t->src[0]].ndim, p->nodes[t->src[0]].shape) <= 4096;
        if (!live[i] || !(loom__fuse_is_ew(t) || (loom__fuse_is_red(t) && (members || small))) ||
            t->fused_into >= 0 || (t->lay.base != LOOM_BASE_WS && t->lay.base != LOOM_BASE_PERSIST))
            continue;
        loom__fused *k = &p->fused[p->nfused];
        *k = (loom__fused){
            .root = (int32_t)i, .nargs = 1, .args = {(int32_t)i}, .epi_of = -1, .nout = 0};
        bool ok = add_leaves(p, k, i);
        for (int64_t m = 0; m < i && ok; m++)
            if (p->nodes[m].fused_into >= 0 && loom__fuse_root_of(p, m) == i)
                ok = add_leaves(p, k, m);
        bool has_members = false;
        for (int64_t m = 0; m < i && !has_members; m++)
            has_members = p->nodes[m].fused_into >= 0 && loom__fuse_root_of(p, m) == i;
        for (int64_t m = 0; m < i && ok; m++) { /* members stored in their slabs or (beside)
                                                 * their buffers: no reduction */
            if (p->nodes[m].fused_into < 0 || loom__fuse_root_of(p, m) != i ||
                (p->nodes[m].lay.base != LOOM_BASE_PERSIST && !beside[m]))
                continue;
            ok = k->nout < LOOM_FUSED_MAX_OUTS && !loom__fuse_is_red(t) && !has_red_below(p, i) &&
                 k->nargs < LOOM_FUSED_MAX_ARGS;
            if (ok)
                k->outs[k->nout] = (int32_t)m, k->out_args[k->nout++] = k->nargs,
                k->args[k->nargs++] = (int32_t)m;
        }
        ok = ok && (!has_members || in_place_safe(p, k));
        if (!ok) { /* too many leaves, or unsafe in place: the members run on their own */
            for (int64_t m = 0; m < i; m++)
                if (p->nodes[m].fused_into >= 0 && loom__fuse_root_of(p, m) == i)
                    p->nodes[m].fused_into = -1, fused--;
            goto restart;
        }
        p->fused_of[i] = (int32_t)p->nfused++;
    }
    loom__free(readers);
    loom__free(reader);
    loom__free(beside);
    return fused;
}
