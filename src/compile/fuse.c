/*
 * fuse.c - the schedule: which nodes become one kernel. An elementwise node whose only reader is
 * an elementwise consumer of the same shape (reading it directly, not through a view) is computed
 * inside that consumer's loop and never stored; chains and trees of such nodes become one kernel
 * rooted at the node that is stored. A reduction takes in the elementwise chain it reduces (each
 * element computed in its loop, never stored) and goes into an elementwise consumer of its own
 * shape (log(sum(exp(x))) is one kernel); one reduction per kernel. Views, broadcasts and constants
 * feeding a kernel are its leaves, read through their strides. Kernel roots are elementwise nodes
 * that own a workspace buffer, or that write their slab in place. Library kernels fuse too: a fold
 * (col2im) of a product's output computes that product itself and adds each result straight into
 * the image (a convolution's input gradient without its 17.8 MB column buffer), and so on: every
 * fusion is a rule of the table at the end of this file (loom__rules: its pattern, when it
 * applies, the kernel form it makes), applied in order by loom__apply_rules.
 */
#include "internal.h"

#include <math.h>

#include <string.h>

static bool is_ew(const loom__pnode *t) {
    return loom__ops[t->op].kind == LOOM_KIND_EW && !t->copy;
}

static bool is_red(const loom__pnode *t) {
    return loom__ops[t->op].kind == LOOM_KIND_RED;
}

void loom__unfuse(loom__program *p) {
    for (int64_t i = 0; i < p->n; i++)
        p->nodes[i].fused_into = -1, p->nodes[i].epi = -1, p->nodes[i].sink_of = -1;
    loom__free(p->fused);
    loom__free(p->fused_of);
    p->fused = NULL, p->fused_of = NULL, p->nfused = 0;
    for (int r = 0; r < loom__nrules; r++)
        if (loom__rules[r].generated)
            p->rule_hits[r] = 0;
}

/* Adds the leaves of member or root m to kernel k; false if the kernel has too many. */
static bool add_leaves(const loom__program *p, loom__fused *k, int64_t m) {
    const loom__pnode *t = &p->nodes[m];
    for (int s = 0; s < loom__ops[t->op].arity; s++) {
        int32_t id = t->src[s];
        if (p->nodes[id].fused_into >= 0)
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

static int32_t root_of(const loom__program *p, int64_t i) {
    while (p->nodes[i].fused_into >= 0)
        i = p->nodes[i].fused_into;
    return (int32_t)i;
}

/* Whether a reduction is fused somewhere under node i. */
static bool has_red_below(const loom__program *p, int64_t i) {
    for (int64_t m = 0; m < i; m++)
        if (is_red(&p->nodes[m]) && p->nodes[m].fused_into >= 0) {
            int64_t r = m;
            while (p->nodes[r].fused_into >= 0 && r != i)
                r = p->nodes[r].fused_into;
            if (r == i)
                return true;
        }
    return false;
}

static int64_t rule_elementwise(loom__program *p, const loom__fuse_in *in) {
    const bool *live = in->live, *is_out = in->is_out;
    int64_t n = p->n, fused = 0;
    int32_t *readers = loom__calloc((size_t)n + 1, sizeof(int32_t));
    int32_t *reader = loom__calloc((size_t)n + 1, sizeof(int32_t));
    p->fused_of = loom__malloc(sizeof(int32_t) * (size_t)(n + 1));
    p->fused = loom__calloc((size_t)n + 1, sizeof(loom__fused));
    if (!readers || !reader || !p->fused_of || !p->fused) {
        loom__free(readers), loom__free(reader);
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
    for (int64_t i = 0; i < n; i++) { /* members */
        const loom__pnode *t = &p->nodes[i], *c = &p->nodes[reader[i]];
        bool same = c->ndim == t->ndim && !memcmp(c->shape, t->shape, sizeof(int64_t) * t->ndim);
        /* an elementwise value stored in its slab place (an optimizer's momentum) and read by one
         * elementwise consumer of its shape (the update): computed and stored in that kernel */
        bool slab = t->lay.base == LOOM_BASE_PERSIST && is_ew(t) && is_ew(c) && same &&
                    loom__contiguous(t->ndim, t->shape, t->lay.stride);
        if (!live[i] || is_out[i] || t->check || readers[i] != 1 ||
            (t->lay.base != LOOM_BASE_WS && !slab) || c->dtype != t->dtype)
            continue;
        /* elementwise into elementwise; a reduction's input into it, computed in its loop (unless
         * a reduction is already under it: one per kernel); a reduction into an elementwise
         * consumer of its own shape */
        bool ok = (is_ew(t) && is_ew(c) && same) || (is_red(t) && is_ew(c) && same) ||
                  (is_ew(t) && is_red(c) && !has_red_below(p, i));
        if (!ok)
            continue;
        p->nodes[i].fused_into = reader[i];
        fused++;
    }
    for (int64_t i = 0; i < n; i++) { /* at most one reduction per kernel */
        if (!live[i] || !is_red(&p->nodes[i]) || p->nodes[i].fused_into < 0)
            continue;
        int32_t r = root_of(p, i);
        if (is_red(&p->nodes[r]) || reader[r] == -2) {
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
            !is_ew(t) || t->lay.base != LOOM_BASE_WS)
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
            int32_t r = root_of(p, c);
            ok = is_ew(u) && u->dtype == t->dtype && u->ndim == t->ndim &&
                 !memcmp(u->shape, t->shape, sizeof(int64_t) * t->ndim) &&
                 (root < 0 || r == root) && is_ew(&p->nodes[r]) && !has_red_below(p, r);
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
        for (int64_t m = 0; m < i && !members && is_red(t); m++)
            members = p->nodes[m].fused_into == i;
        /* a reduction alone: generated when small (the interpreter's generic loop costs more
         * than the arithmetic there: a softmax's max over 10 logits); a large one is left to the
         * interpreter's lanes, where a library kernel may take it as a sink */
        bool small = is_red(t) && !members &&
                     loom__numel(p->nodes[t->src[0]].ndim, p->nodes[t->src[0]].shape) <= 4096;
        if (!live[i] || !(is_ew(t) || (is_red(t) && (members || small))) || t->fused_into >= 0 ||
            (t->lay.base != LOOM_BASE_WS && t->lay.base != LOOM_BASE_PERSIST))
            continue;
        loom__fused *k = &p->fused[p->nfused];
        *k = (loom__fused){
            .root = (int32_t)i, .nargs = 1, .args = {(int32_t)i}, .epi_of = -1, .nout = 0};
        bool ok = add_leaves(p, k, i);
        for (int64_t m = 0; m < i && ok; m++)
            if (p->nodes[m].fused_into >= 0 && root_of(p, m) == i)
                ok = add_leaves(p, k, m);
        bool has_members = false;
        for (int64_t m = 0; m < i && !has_members; m++)
            has_members = p->nodes[m].fused_into >= 0 && root_of(p, m) == i;
        for (int64_t m = 0; m < i && ok; m++) { /* members stored in their slabs: no reduction */
            if (p->nodes[m].fused_into < 0 || root_of(p, m) != i ||
                p->nodes[m].lay.base != LOOM_BASE_PERSIST)
                continue;
            ok = k->nout < LOOM_FUSED_MAX_OUTS && !is_red(t) && !has_red_below(p, i) &&
                 k->nargs < LOOM_FUSED_MAX_ARGS;
            if (ok)
                k->outs[k->nout] = (int32_t)m, k->out_args[k->nout++] = k->nargs,
                k->args[k->nargs++] = (int32_t)m;
        }
        ok = ok && (!has_members || in_place_safe(p, k));
        if (!ok) { /* too many leaves, or unsafe in place: the members run on their own */
            for (int64_t m = 0; m < i; m++)
                if (p->nodes[m].fused_into >= 0 && root_of(p, m) == i)
                    p->nodes[m].fused_into = -1, fused--;
            goto restart;
        }
        p->fused_of[i] = (int32_t)p->nfused++;
    }
    loom__free(readers);
    loom__free(reader);
    return fused;
}

int32_t *loom__count_readers(const loom__program *p, const bool *live) {
    int32_t *readers = loom__calloc((size_t)p->n + 1, sizeof(int32_t));
    for (int64_t i = 0; readers && i < p->n; i++)
        for (int k = 0; k < 3 && live[i]; k++)
            if (p->nodes[i].src[k] >= 0)
                readers[p->nodes[i].src[k]]++;
    return readers;
}

/* The product a fold reads through a contiguous reshape, or -1. */
static int32_t folded_product(const loom__program *p, const loom__pnode *f) {
    const loom__pnode *v = &p->nodes[f->src[0]];
    if (v->op != LOOM_OP_RESHAPE || v->copy || v->lay.base != LOOM_BASE_WS || v->lay.offset != 0)
        return -1;
    const loom__pnode *m = &p->nodes[v->src[0]];
    return m->op == LOOM_OP_MATMUL && m->ndim == 2 && v->lay.index == v->src[0] ? v->src[0] : -1;
}

static int64_t rule_fold_product(loom__program *p, const loom__fuse_in *in) {
    const bool *live = in->live, *is_out = in->is_out;
    const int32_t *readers = in->readers;
    if (!loom__use_own_gemm())
        return 0;
    int64_t fused = 0;
    for (int64_t i = 0; i < p->n; i++) {
        loom__pnode *f = &p->nodes[i];
        /* (stride 1: a strided fold's scattered adds made its product 6x slower than the
         * product and a fold apart, bench/RESULTS.md) */
        if (!live[i] || f->op != LOOM_OP_FOLD || f->dtype != LOOM_F32 || f->attr.win.ph ||
            f->attr.win.pw || f->attr.win.sh > 1 || f->attr.win.sw > 1 ||
            f->lay.base != LOOM_BASE_WS)
            continue;
        int32_t m = folded_product(p, f);
        if (m < 0 || readers[m] != 1 || readers[f->src[0]] != 1 || is_out[m] || is_out[f->src[0]] ||
            p->nodes[m].check || p->nodes[m].fused_into >= 0)
            continue;
        p->nodes[m].fused_into = (int32_t)i;
        fused++;
    }
    return fused;
}

/* The node whose workspace buffer holds view or node id's data, or -1. */
static int32_t owner(const loom__program *p, int32_t id) {
    const loom__layout *l = &p->nodes[id].lay;
    return l->base == LOOM_BASE_WS ? l->index : -1;
}

/* Whether a node in (lo, hi), other than skip[0 .. nskip), writes a persistent slab (a store, a
 * sync, or a kernel computing into its slab place) or, with `reads`, reads one. */
static bool slab_touched_between(const loom__program *p, const bool *live, int64_t lo, int64_t hi,
                                 bool reads, const int32_t *skip, int nskip) {
    for (int64_t c = lo + 1; c < hi; c++) {
        const loom__pnode *t = &p->nodes[c];
        bool skipped = false;
        for (int q = 0; q < nskip; q++)
            skipped = skipped || skip[q] == c;
        if (!live[c] || skipped)
            continue;
        if ((t->op == LOOM_OP_STORE && !t->elided) || t->op == LOOM_OP_SYNC)
            return true;
        if (!loom__runs_kernel(t))
            continue;
        if (t->lay.base == LOOM_BASE_PERSIST)
            return true;
        if (reads && t->copy && t->src_lay.base == LOOM_BASE_PERSIST)
            return true;
        for (int k = 0; k < 3 && reads; k++)
            if (t->src[k] >= 0 && p->nodes[t->src[k]].lay.base == LOOM_BASE_PERSIST)
                return true;
    }
    return false;
}

/* The library node kernel k can run as the epilogue of, with its leaf index, or -1. */
static int32_t epilogue_of(const loom__program *p, const bool *live, const bool *is_out,
                           const int32_t *readers, const loom__fused *k, int *arg) {
    const loom__pnode *r = &p->nodes[k->root];
    if (r->ndim != 2 || r->lay.base != LOOM_BASE_WS || r->check || r->dtype != LOOM_F32 ||
        k->nout > 0)
        return -1;
    for (int32_t m = 0; m < k->root; m++)
        if (is_red(&p->nodes[m]) && root_of(p, m) == k->root)
            return -1;
    for (int a = 1; a < k->nargs; a++) {
        int32_t v = k->args[a], L = owner(p, v);
        /* the library node itself, or a view of it directly (no other view in between that
         * something else might read) */
        if (L < 0 || (v != L && p->nodes[v].src[0] != L) || p->nodes[L].copy || is_out[L] ||
            p->nodes[L].check)
            continue;
        const loom__pnode *lib = &p->nodes[L], *vn = &p->nodes[v];
        bool mm = lib->op == LOOM_OP_MATMUL && loom__use_own_gemm() && lib->ndim == 2 &&
                  lib->shape[1] >= 16 &&
                  p->nodes[lib->src[0]].shape[p->nodes[lib->src[0]].ndim - 1] > 0;
        bool pg = lib->op == LOOM_OP_POOLGRAD;
        /* the whole output, contiguous, read by this kernel alone */
        if (!(mm || pg) || lib->dtype != LOOM_F32 || vn->lay.offset != 0 ||
            loom__numel(vn->ndim, vn->shape) != loom__numel(lib->ndim, lib->shape) ||
            readers[L] != 1 || (v != L && (readers[v] != 1 || is_out[v])))
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
            (reads_slab && slab_touched_between(p, live, L, k->root, false, NULL, 0)))
            continue;
        bool ready = true; /* every other leaf is computed before the library kernel runs */
        for (int b = 1; b < k->nargs && ready; b++)
            ready = b == a || owner(p, k->args[b]) < L;
        if (!ready)
            continue;
        *arg = a;
        return L;
    }
    return -1;
}

static int64_t rule_epilogue(loom__program *p, const loom__fuse_in *in) {
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

/* Whether node s can take root r a row at a time: a sum along its rows (on the lanes path) or a
 * product r B on the dot-product path, its output contiguous, B ready before library node L. */
static bool sinkable(const loom__program *p, int32_t s, int32_t r, int32_t L) {
    const loom__pnode *t = &p->nodes[s], *root = &p->nodes[r];
    int64_t rows = root->shape[0], cols = root->shape[1];
    if (t->dtype != LOOM_F32 || t->check || t->copy || t->src[0] != r ||
        !((t->lay.base == LOOM_BASE_WS && t->lay.index == s) || t->lay.base == LOOM_BASE_PERSIST))
        return false;
    if (t->op == LOOM_OP_SUM) /* (rows, 1) or (rows): one value a row */
        return t->attr.axis == 1 && cols >= 64 && loom__numel(t->ndim, t->shape) == rows &&
               (rows == 1 || t->lay.stride[0] == 1);
    if (t->op != LOOM_OP_MATMUL || t->ndim != 2 || t->lay.stride[0] != t->shape[1] ||
        t->lay.stride[1] != 1)
        return false;
    const loom__pnode *b = &p->nodes[t->src[1]];
    int32_t bo = b->lay.base == LOOM_BASE_WS ? b->lay.index : -1;
    if (bo >= L || b->dtype != LOOM_F32)
        return false;
    loom__gmat ga = {NULL, {1, {rows}, {cols}}, {1, {cols}, {1}}}, gb = {NULL, {0}, {0}};
    loom__operand_dims(b, &gb.row, &gb.col);
    return loom__dot_rows_ok(rows, t->shape[1], cols, &ga, &gb);
}

/* The node whose 2-D rows pool gradient L makes (its epilogue's root, or the one 2-D view of its
 * output), if sinks may read them: contiguous, in the workspace, not an output; or -1. */
static int32_t stream_of(const loom__program *p, const bool *live, const bool *is_out,
                         const int32_t *readers, int32_t L) {
    const loom__pnode *t = &p->nodes[L];
    int32_t s = t->epi >= 0 ? p->fused[t->epi].root : -1;
    for (int64_t c = L + 1; s < 0 && readers[L] == 1 && c < p->n; c++)
        if (live[c] && p->nodes[c].src[0] == L)
            s = p->nodes[c].op == LOOM_OP_RESHAPE && loom__is_view(&p->nodes[c]) &&
                        !p->nodes[c].gndim && p->nodes[c].lay.offset == 0
                    ? (int32_t)c
                    : -2;
    if (s < 0)
        return -1;
    const loom__pnode *r = &p->nodes[s];
    bool own = r->lay.index == (t->epi >= 0 ? s : L); /* its own buffer, or L's */
    return r->ndim == 2 && !is_out[s] && !r->check && r->lay.base == LOOM_BASE_WS && own &&
                   r->lay.stride[0] == r->shape[1] && r->lay.stride[1] == 1
               ? s
               : -1;
}

static int64_t rule_pool_sinks(loom__program *p, const loom__fuse_in *in) {
    const bool *live = in->live, *is_out = in->is_out;
    const int32_t *readers = in->readers;
    if (!loom__use_own_gemm())
        return 0;
    int64_t n = 0;
    for (int32_t L = 0; L < p->n; L++) {
        loom__pnode *t = &p->nodes[L];
        if (!live[L] || t->op != LOOM_OP_POOLGRAD || t->dtype != LOOM_F32 ||
            t->lay.base != LOOM_BASE_WS || t->lay.index != L || is_out[L])
            continue;
        int32_t r = stream_of(p, live, is_out, readers, L), sk[2];
        int ns = 0, others = 0;
        bool sums = true; /* every sink a sum (then other readers may take the rows too) */
        for (int64_t c = r + 1; r >= 0 && c < p->n; c++)
            for (int q = 0; q < 3 && live[c]; q++)
                if (p->nodes[c].src[q] == r) {
                    if (q == 0 && ns < 2 && sinkable(p, (int32_t)c, r, L) &&
                        p->nodes[c].fused_into < 0 && p->nodes[c].epi < 0 &&
                        (p->fused_of == NULL || p->fused_of[c] < 0)) {
                        sk[ns++] = (int32_t)c;
                        sums = sums && p->nodes[c].op == LOOM_OP_SUM;
                    } else
                        others++;
                }
        /* with other readers the rows are written whole (and planes must tile the rows) */
        bool keep = others > 0;
        if (ns == 0 ||
            (keep &&
             (!sums || t->epi >= 0 || p->nodes[r].shape[1] % (t->shape[2] * t->shape[3]) != 0)) ||
            slab_touched_between(p, live, L, sk[ns - 1], true, sk, ns))
            continue;
        for (int q = 0; q < ns; q++)
            t->sinks[q] = sk[q], p->nodes[sk[q]].sink_of = L;
        t->nsinks = ns, t->stream = r, t->keep = keep;
        n += ns;
    }
    return n;
}

static int64_t rule_pool_codes(loom__program *p, const loom__fuse_in *in) {
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

static int64_t rule_pool_relu(loom__program *p, const loom__fuse_in *in) {
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
            alone = root_of(p, c) != r || c == r;
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
                members = c != cn && p->nodes[c].fused_into >= 0 && root_of(p, c) == wn;
            if (members)
                continue;
            g->relu_dy = wh->src[1];
            p->nodes[wn].sink_of = L, p->nodes[cn].sink_of = L; /* neither runs */
            n++;
        }
    }
    return n;
}

/* The live pool gradients reading node x as their input that take POOLMAX f's codes instead. */
static int32_t codes_readers(const loom__program *p, const bool *live, int32_t x, int32_t f) {
    int32_t n = 0;
    for (int32_t c = x + 1; c < p->n; c++)
        n += live[c] && p->nodes[c].op == LOOM_OP_POOLGRAD && p->nodes[c].src[0] == x &&
             p->nodes[c].codes_of == f;
    return n;
}

static int64_t rule_pool_conv(loom__program *p, const loom__fuse_in *in) {
    const bool *live = in->live, *is_out = in->is_out;
    const int32_t *readers = in->readers;
    if (!loom__use_own_gemm())
        return 0;
    int64_t n = 0;
    for (int32_t f = 0; f < p->n; f++) {
        loom__pnode *t = &p->nodes[f];
        if (!live[f] || t->op != LOOM_OP_POOLMAX || t->dtype != LOOM_F32 || t->copy ||
            t->lay.base != LOOM_BASE_WS || t->lay.index != f || t->ndim != 4)
            continue;
        /* its input: a contiguous reshape of the product's output or of its epilogue's root */
        int32_t xv = t->src[0], R = owner(p, xv);
        const loom__pnode *x = &p->nodes[xv];
        if (R < 0 || x->op != LOOM_OP_RESHAPE || !loom__is_view(x) || x->gndim || x->src[0] != R ||
            x->lay.offset != 0 || x->lay.stride[3] != 1 || x->lay.stride[2] != x->shape[3] ||
            x->lay.stride[1] != x->shape[2] * x->shape[3] ||
            x->lay.stride[0] != x->shape[1] * x->lay.stride[1] ||
            readers[xv] - codes_readers(p, live, xv, f) != 1 || is_out[xv])
            continue;
        int32_t M = loom__epilogue_root(p, R) ? p->fused[p->fused_of[R]].epi_of : R;
        loom__pnode *m = &p->nodes[M];
        const loom__pnode *r = &p->nodes[R];
        if (m->op != LOOM_OP_MATMUL || m->ndim != 2 || m->dtype != LOOM_F32 || m->copy ||
            m->check || r->check || is_out[M] || is_out[R] || readers[M] != 1 || readers[R] != 1 ||
            m->fused_into >= 0 || r->ndim != 2 || r->shape[0] != x->shape[0] ||
            r->shape[1] != x->shape[1] * x->lay.stride[1] ||
            slab_touched_between(p, live, M, f, false, NULL, 0))
            continue;
        loom__gmat ga = {NULL, {0}, {0}}, gb = {NULL, {0}, {0}};
        loom__operand_dims(&p->nodes[m->src[0]], &ga.row, &ga.col);
        loom__operand_dims(&p->nodes[m->src[1]], &gb.row, &gb.col);
        t->conv = M; /* (asked of the pooling: by planes, or by windows through the transpose) */
        if (!loom__conv_planes_ok(m->shape[0], m->shape[1], loom__numel(ga.col.n, ga.col.size), &ga,
                                  &gb, x->lay.stride[1]) &&
            !loom__pool_conv_t_ok(p, f)) {
            t->conv = -1;
            continue;
        }
        m->fused_into = f;
        n++;
    }
    return n;
}

/* Whether a node after x and before f reads x (through views): x cannot move to f. */
static bool read_before(const loom__program *p, const bool *live, int32_t x, int32_t f) {
    bool *seen = loom__calloc((size_t)f + 1, sizeof(bool));
    bool read = !seen;
    if (seen)
        seen[x] = true;
    for (int32_t c = x + 1; !read && c < f; c++)
        for (int q = 0; q < 3 && live[c]; q++)
            if (p->nodes[c].src[q] >= 0 && seen[p->nodes[c].src[q]]) {
                if (!loom__is_view(&p->nodes[c]))
                    read = true;
                seen[c] = true;
            }
    loom__free(seen);
    return read;
}

/* Whether node c, a reader of the rows, can be computed by the fold: a kernel of the
 * interpreter's writing its own row-major buffer or its slab place, not yet fused anywhere. */
static bool movable(const loom__program *p, int32_t c) {
    const loom__pnode *t = &p->nodes[c];
    return t->dtype == LOOM_F32 && !t->check && !t->copy && t->fused_into < 0 && t->epi < 0 &&
           (p->fused_of == NULL || p->fused_of[c] < 0) && t->ndim == 2 &&
           t->lay.stride[0] == t->shape[1] && t->lay.stride[1] == 1 &&
           ((t->lay.base == LOOM_BASE_WS && t->lay.index == c) || t->lay.base == LOOM_BASE_PERSIST);
}

static int64_t rule_conv_back(loom__program *p, const loom__fuse_in *in) {
    const bool *live = in->live, *is_out = in->is_out;
    const int32_t *readers = in->readers;
    if (!loom__use_own_gemm() || !loom__pool_codes_available())
        return 0;
    int64_t n = 0;
    for (int32_t f = 0; f < p->n; f++) {
        loom__pnode *t = &p->nodes[f];
        int32_t m = live[f] && t->op == LOOM_OP_FOLD ? folded_product(p, t) : -1;
        if (m < 0 || p->nodes[m].fused_into != f)
            continue;
        /* the product's B: a row-major 2-D view of a pool gradient read from its codes */
        int32_t R = p->nodes[m].src[1];
        const loom__pnode *r = &p->nodes[R];
        int32_t P = r->op == LOOM_OP_RESHAPE ? r->src[0] : -1;
        if (P < 0)
            continue;
        const loom__pnode *g = &p->nodes[P];
        if (!loom__is_view(r) || r->gndim || r->ndim != 2 || owner(p, R) != P ||
            r->lay.offset != 0 || r->lay.stride[0] != r->shape[1] || r->lay.stride[1] != 1 ||
            is_out[R] || g->op != LOOM_OP_POOLGRAD || g->dtype != LOOM_F32 || g->codes_of < 0 ||
            !loom__pool2x2(&g->attr.win, 1) || g->epi >= 0 || g->check || is_out[P] ||
            readers[P] != 1 || owner(p, P) != P || g->ndim != 4 ||
            !loom__contiguous(4, g->shape, g->lay.stride) || g->shape[0] != r->shape[0])
            continue;
        const loom__pnode *d = &p->nodes[g->relu_dy >= 0 ? g->relu_dy : g->src[1]];
        if (d->lay.stride[3] != 1 || d->lay.stride[2] != d->shape[3] ||
            !loom__pool_grad_by_codes(g->shape[2], g->shape[3], d->shape[2], d->shape[3]))
            continue;
        /* the rows' other readers: the weight gradient (rows x an unfold), a sum along them */
        int32_t w = -1, s = -1;
        bool ok = true;
        for (int32_t c = R + 1; c < p->n && ok; c++)
            for (int q = 0; q < 3 && live[c]; q++) {
                const loom__pnode *x = &p->nodes[c];
                if (x->src[q] != R || (c == m && q == 1))
                    continue;
                if (q == 0 && w < 0 && x->op == LOOM_OP_MATMUL && x->sink_of < 0 && movable(p, c))
                    w = c;
                else if (q == 0 && s < 0 && x->op == LOOM_OP_SUM &&
                         (x->sink_of == P || x->sink_of < 0) && sinkable(p, c, R, P) &&
                         movable(p, c))
                    s = c;
                else
                    ok = false;
            }
        int32_t skip[3] = {m, w, s}; /* (the product runs in the fold already) */
        if (!ok || w < 0 || w > f || s > f || read_before(p, live, w, f) ||
            (s >= 0 && read_before(p, live, s, f)) ||
            slab_touched_between(p, live, P, f, true, skip, s >= 0 ? 3 : 2))
            continue;
        const loom__pnode *mw = &p->nodes[w];
        loom__gmat ga = {NULL, {0}, {0}}, gb = {NULL, {0}, {0}};
        loom__operand_dims(&p->nodes[p->nodes[m].src[0]], &ga.row, &ga.col);
        loom__operand_dims(&p->nodes[mw->src[1]], &gb.row, &gb.col);
        if (owner(p, mw->src[1]) >= f ||
            !loom__conv_back_ok(p->nodes[m].shape[0], p->nodes[m].shape[1], r->shape[0], &ga,
                                mw->shape[1], &gb))
            continue;
        for (int q = 0; q < g->nsinks; q++)
            p->nodes[g->sinks[q]].sink_of = -1;
        p->nodes[P].nsinks = 0, p->nodes[P].keep = false;
        p->nodes[P].fused_into = p->nodes[w].fused_into = f;
        if (s >= 0)
            p->nodes[s].fused_into = f;
        t->back = P, t->back_w = w, t->back_sum = s;
        n++;
    }
    return n;
}

static int64_t rule_pool_quad(loom__program *p, const loom__fuse_in *in) {
    const bool *live = in->live;
    int64_t n = 0;
    for (int32_t L = 0; L < p->n; L++)
        if (live[L] && p->nodes[L].op == LOOM_OP_POOLGRAD && loom__pool_quad_ok(p, L))
            p->nodes[L].quad = true, n++;
    return n;
}

/* Whether leaf v of a kernel with a (rows, cols) root is a row broadcast down the rows, its
 * elements contiguous: a bias. */
static bool bias_row(const loom__program *p, int32_t v) {
    const loom__pnode *b = &p->nodes[v];
    return b->dtype == LOOM_F32 && b->ndim == 2 && b->lay.stride[0] == 0 && b->lay.stride[1] == 1 &&
           !b->gndim;
}

/* Whether leaf v is the constant +0.0, broadcast (as loom_scalar(g, 0.0) reads). */
static bool zero_const(const loom__program *p, int32_t v) {
    const loom__pnode *z = &p->nodes[v];
    float f = 1;
    if (z->dtype != LOOM_F32 || z->lay.base != LOOM_BASE_CONST)
        return false;
    for (int d = 0; d < z->ndim; d++)
        if (z->shape[d] != 1 && z->lay.stride[d] != 0)
            return false;
    memcpy(&f, &p->consts[z->lay.index], sizeof f);
    return f == 0 && !signbit(f);
}

/* Whether v is a leaf of a kernel (not computed in it) holding a float matrix of r's shape, its
 * rows contiguous and apart by at least their length. */
static bool matrix_leaf(const loom__program *p, int32_t v, const loom__pnode *r) {
    const loom__pnode *m = &p->nodes[v];
    return m->fused_into < 0 && m->dtype == LOOM_F32 && m->ndim == 2 &&
           m->shape[0] == r->shape[0] && m->shape[1] == r->shape[1] && m->lay.stride[1] == 1 &&
           m->lay.stride[0] >= m->shape[1] && !m->gndim;
}

/* Whether kernel k (root r) is where(h > 0, L, 0) with h a matrix of L's shape, its rows
 * contiguous: the mask leaf h, or -1. */
static int32_t relu_backward(const loom__program *p, const loom__fused *k, int32_t L) {
    const loom__pnode *r = &p->nodes[k->root];
    if (r->op != LOOM_OP_WHERE || r->src[1] != L || !zero_const(p, r->src[2]))
        return -1;
    const loom__pnode *c = &p->nodes[r->src[0]];
    if (c->op != LOOM_OP_CMPGT || c->fused_into != k->root || !zero_const(p, c->src[1]))
        return -1;
    return matrix_leaf(p, c->src[0], r) ? c->src[0] : -1;
}

/* Whether a live node in (lo, hi) writes or reads slab `slab` over [a, b) (a store, a sync, an
 * operand, or a kernel's output in its slab place). */
static bool range_touched(const loom__program *p, const bool *live, int64_t lo, int64_t hi,
                          int32_t slab, int64_t a, int64_t b) {
    for (int64_t c = lo + 1; c < hi; c++) {
        const loom__pnode *t = &p->nodes[c];
        if (live[c] &&
            (loom__slab_accesses(p, t, slab, a, b) ||
             (loom__runs_kernel(t) && loom__slab_touches(&t->lay, t->ndim, t->shape, slab, a, b))))
            return true;
    }
    return false;
}

/* A SUM over axis 0 of root r (rows, cols) that product L's epilogue makes, which can be summed
 * as the product stores its final rows (nothing between L and it touching its output): the SUM,
 * or -1. */
static int32_t column_sum(const loom__program *p, const bool *live, int32_t L, int32_t r) {
    int64_t cols = p->nodes[r].shape[1];
    for (int32_t s = r + 1; s < p->n; s++) {
        const loom__pnode *t = &p->nodes[s];
        if (!live[s] || t->op != LOOM_OP_SUM || t->src[0] != r || t->attr.axis != 0 ||
            t->dtype != LOOM_F32 || t->check || t->copy || t->fused_into >= 0 || t->sink_of >= 0 ||
            loom__numel(t->ndim, t->shape) != cols || t->lay.stride[t->ndim - 1] != 1 ||
            (t->lay.base != LOOM_BASE_WS && t->lay.base != LOOM_BASE_PERSIST))
            continue;
        if (t->lay.base == LOOM_BASE_PERSIST &&
            range_touched(p, live, L, s, t->lay.index, t->lay.offset, t->lay.offset + cols))
            continue;
        return s;
    }
    return -1;
}

static int64_t rule_product_act(loom__program *p, const loom__fuse_in *in) {
    const bool *live = in->live;
    int64_t n = 0;
    for (int32_t L = 0; L < p->n; L++) {
        loom__pnode *t = &p->nodes[L];
        if (!live[L] || t->op != LOOM_OP_MATMUL || t->epi < 0 || t->fused_into >= 0 || t->nsinks ||
            t->ndim != 2)
            continue;
        const loom__fused *k = &p->fused[t->epi];
        const loom__pnode *r = &p->nodes[k->root];
        if (k->args[k->epi_arg] != L || k->nout > 0 || r->ndim != 2 ||
            r->lay.base != LOOM_BASE_WS || r->lay.stride[0] != r->shape[1] ||
            (r->lay.stride[1] != 1 && r->shape[1] > 1))
            continue;
        int32_t mask = relu_backward(p, k, L), members = 0, add = -1, relu = -1;
        for (int32_t m = 0; m <= k->root; m++)
            if (m == k->root || (p->nodes[m].fused_into >= 0 && root_of(p, m) == k->root)) {
                members++;
                add = p->nodes[m].op == LOOM_OP_ADD ? m : add;
                relu = p->nodes[m].op == LOOM_OP_RELU ? m : relu;
            }
        /* RELU(L), ADD(L, v) or RELU(ADD(L, v)), v a bias row or a matrix (a residual), either
         * side of the ADD (a float addition's operands commute exactly) */
        const loom__pnode *ad = add >= 0 ? &p->nodes[add] : NULL;
        int32_t v = !ad ? -1 : ad->src[0] == L ? ad->src[1] : ad->src[0];
        bool ok = members == (add >= 0) + (relu >= 0) && (relu < 0 || relu == k->root) &&
                  (add < 0 || add == (relu >= 0 ? p->nodes[relu].src[0] : k->root)) &&
                  (relu < 0 || p->nodes[relu].src[0] == (add >= 0 ? add : L)) &&
                  (add < 0 || ((ad->src[0] == L) != (ad->src[1] == L) &&
                               (bias_row(p, v) || matrix_leaf(p, v, r))));
        if (mask >= 0 && members == 2) { /* the WHERE and its CMPGT */
            t->act = true, t->act_mask = mask;
        } else if (ok) {
            t->act = true, t->act_relu = relu >= 0, t->act_add = v;
        } else {
            continue;
        }
        t->act_sum = column_sum(p, live, L, k->root);
        if (t->act_sum >= 0) /* it runs no kernel of its own */
            p->nodes[t->act_sum].sink_of = L, n++;
        n++;
    }
    return n;
}

/* The rules, in the order the planner applies them (each may rely on those above it). */
const loom__rule loom__rules[] = {
    {"elementwise", "elementwise ops (and at most one reduction) feeding each other",
     "a value read by one consumer of its shape (or by every reader inside one kernel), not an "
     "output, in the workspace or its slab place; a kernel's leaves at most 16, in-place writes "
     "read only where written",
     "a generated kernel (p->fused) rooted at the value stored; members stored into their slabs",
     "fused_into, fused_of", true, rule_elementwise},
    {"epilogue", "a generated kernel reading the whole output of a product or a pool gradient",
     "float, a 2-D root, no reduction or stored member, the output contiguous and read by that "
     "kernel alone, every other leaf ready before the library kernel, no slab it reads written "
     "in between",
     "the kernel's part() run on each block of the library kernel's output while in cache",
     "epi, loom__fused.epi_of", true, rule_epilogue},
    {"fold-product", "FOLD (col2im) of a product's output through a contiguous reshape",
     "float, stride 1, no padding, loom's own products, the product and its reshape read by the "
     "fold alone",
     "the product adding each result straight into the image (no column buffer)", "fused_into",
     false, rule_fold_product},
    {"pool-sinks",
     "a pool gradient whose 2-D rows only a sum along them and a dot-path product read",
     "after epilogue; its rows (its epilogue's root or a 2-D view of it) read by nothing else, "
     "or by others too (then written whole, keep)",
     "the pool gradient feeding each row to its sinks while in cache",
     "sinks, nsinks, stream, keep, sink_of", false, rule_pool_sinks},
    {"pool-codes", "POOLGRAD(x, dy) and a POOLMAX(x) of the same window and dtype",
     "the window's places fit a byte (loom__pool_codes_ok: up to 256), the POOLMAX's own "
     "workspace buffer",
     "the POOLMAX keeping each window's argmax place, the gradient reading it instead of x",
     "codes, codes_of", false, rule_pool_codes},
    {"pool-relu", "RELU(POOLMAX(x)), the ReLU the pooling's only reader",
     "after pool-codes; float, a window of up to 128 places or 2x2 on the AVX-512 rows "
     "(loom__pool_relu_ok), neither an output, the ReLU a kernel of its own; with the ReLU's "
     "backward where(relu > 0, d, 0) read only by the pool gradient reading these codes (and, "
     "but for 2x2 windows, d in its planes' order), that too",
     "the pooling writing the ReLU (codes carrying its mask); the gradient reading d",
     "relu, relu_dy, sink_of", false, rule_pool_relu},
    {"pool-conv", "POOLMAX of a product's output (or its epilogue's root), read by it alone",
     "after pool-relu; the reshape contiguous and read by no one else (but gradients taking "
     "this pooling's codes), the product made a plane at a time (loom__conv_planes_ok) or "
     "window by window by its transpose (loom__pool_conv_t_ok), no slab written in between",
     "the pooling computing the product plane by plane, each pooled while in L1",
     "conv, fused_into", false, rule_pool_conv},
    {"conv-back", "FOLD of a product whose B is a 2-D view of a POOLGRAD with codes",
     "after fold-product (which runs that product), pool-codes and pool-sinks (whose sinks it "
     "takes over); 2x2 windows; the rows read only by the product, a weight gradient (rows x an "
     "unfold) and a sum along them, none read before the fold, planes made from the codes "
     "(loom__pool_grad_by_codes), loom__conv_back_ok",
     "the fold making the pool gradient a block of columns at a time into its product, the "
     "weight gradient and the bias sum",
     "back, back_w, back_sum, fused_into", false, rule_conv_back},
    {"pool-quad", "a pool gradient with sinks whose windows tile its planes",
     "after conv-back; 2x2 windows, codes read, a product sink a 3x3 convolution's weight "
     "gradient (loom__pool_quad_ok)",
     "the sinks taking the windows; the rows never made", "quad", false, rule_pool_quad},
    {"product-act",
     "a product's epilogue: RELU, ADD of a bias row or a matrix, both, or "
     "where(h > 0, product, 0)",
     "after the others; the epilogue's root 2-D and contiguous, nothing else in the kernel",
     "the epilogue done in registers as the product stores (loom__sgemm_act), a SUM over axis 0 "
     "of it too",
     "act, act_relu, act_add, act_mask, act_sum", false, rule_product_act},
};
const int loom__nrules = (int)(sizeof loom__rules / sizeof *loom__rules);
_Static_assert(sizeof loom__rules / sizeof *loom__rules <= LOOM_RULES_MAX, "LOOM_RULES_MAX");

int64_t loom__rule_fired[LOOM_RULES_MAX];

int64_t loom__apply_rules(loom__program *p, const loom__fuse_in *in, bool generated) {
    int64_t total = 0;
    for (int r = 0; r < loom__nrules; r++) {
        if (loom__rules[r].generated != generated ||
            !loom__executor_runs(p->x, loom__rules[r].name))
            continue;
        int64_t n = loom__rules[r].apply(p, in);
        if (n < 0)
            return -1;
        p->rule_hits[r] += (int32_t)n;
        total += n;
    }
    return total;
}
