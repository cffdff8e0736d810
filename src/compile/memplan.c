/*
 * memplan.c - where every value of a program lives. In creation order:
 *   layouts: views become strides over their source; a view that BLAS cannot read, a
 *     non-contiguous reshape or output is materialized; other nodes get a buffer of their own.
 *     With loom's own matmul, an unfold without padding is a view too (overlapping strides over
 *     its input) and a product reads it as a matrix through a grouped view (no im2col buffer);
 *     any other reader of such a view gets a copy;
 *   in place: a value that is then stored into a persistent slab is computed in its slab place
 *     when no reader can tell (gradients, optimizer state, parameter updates cost no copy);
 *   buffers: workspace offsets by first fit over the live buffers, each freed after its last
 *     reader, so the workspace is the high-water mark of live intermediates, reused every step.
 */
#include "internal.h"

#include <string.h>

static void contiguous(int nd, const int64_t *shape, int64_t *st) {
    int64_t s = 1;
    for (int d = nd - 1; d >= 0; d--) {
        st[d] = s;
        s *= shape[d];
    }
}

/* The layout of a view node as strides over its source's layout. */
static void view_layout(const loom__pnode *t, const loom__pnode *s, loom__layout *l) {
    *l = s->lay;
    switch ((loom__op)t->op) {
        case LOOM_OP_RESHAPE:
            contiguous(t->ndim, t->shape, l->stride);
            break;
        case LOOM_OP_PERMUTE:
            for (int d = 0; d < t->ndim; d++)
                l->stride[d] = s->lay.stride[t->attr.perm[d]];
            break;
        case LOOM_OP_EXPAND:
            for (int d = 0; d < t->ndim; d++)
                l->stride[d] = s->shape[d] == 1 && t->shape[d] != 1 ? 0 : s->lay.stride[d];
            break;
        default:
            LOOM_ASSERT(0);
    }
}

/* Turns view node `id` into a copy of its elements into a fresh buffer of its own. */
static void materialize(loom__program *p, int64_t id) {
    loom__pnode *t = &p->nodes[id];
    const loom__pnode *s = &p->nodes[t->src[0]];
    t->copy = true;
    t->gndim = 0;
    if (t->op == LOOM_OP_RESHAPE) { /* copy the source in row-major order */
        t->src_lay = s->lay;
        t->copy_ndim = s->ndim;
        memcpy(t->copy_shape, s->shape, sizeof t->copy_shape);
    } else {
        view_layout(t, s, &t->src_lay);
        t->copy_ndim = t->ndim;
        memcpy(t->copy_shape, t->shape, sizeof t->copy_shape);
    }
    memset(&t->lay, 0, sizeof t->lay);
    t->lay.base = LOOM_BASE_WS;
    t->lay.index = (int32_t)id;
    contiguous(t->ndim, t->shape, t->lay.stride);
}

/* Whether loom's products read a grouped view as operand k (0: A, 1: B): the AVX-512 sgemm
 * either, the AVX2 one B (loom__sgemm256_view). */
static bool reads_view(int k) {
    return loom__use_own_gemm() || (loom__use_gemm256() && k == 1);
}

/* An unfold without padding, read by loom's matmul, is a view: (C,KH,KW,N,OH,OW) strides over
 * its (N,C,H,W) input, windows overlapping. The AVX2 sgemm packs a forward's B from the view's
 * runs along a row of the image: not for windows 2 or more apart, whose runs are single floats
 * (cnn-stride2's step 15.7 -> 18.3 ms so). */
static bool unfold_view(loom__pnode *t, const loom__pnode *s) {
    const loom_window *w = &t->attr.win;
    if (t->op != LOOM_OP_UNFOLD || w->ph || w->pw || t->dtype != LOOM_F32 || !reads_view(1) ||
        (!loom__use_own_gemm() && w->sw != 1))
        return false;
    const int64_t *x = s->lay.stride;
    int64_t st[6] = {x[1], x[2], x[3], x[0], x[2] * w->sh, x[3] * w->sw};
    t->lay = s->lay;
    memcpy(t->lay.stride, st, sizeof st);
    t->virt = true;
    return true;
}

/* A 2-D reshape of a view that strides cannot express becomes a grouped view when its two dims
 * are products of consecutive source dims and loom's matmul can read it. */
static bool group(loom__pnode *t, const loom__pnode *s) {
    if (t->ndim != 2 || s->gndim || t->dtype != LOOM_F32 || !reads_view(1))
        return false;
    int64_t rows = 1;
    int q = 0;
    while (q < s->ndim && rows < t->shape[0])
        rows *= s->shape[q++];
    if (rows != t->shape[0] || q == 0 || q > LOOM_GDIM_MAX || s->ndim - q > LOOM_GDIM_MAX ||
        q == s->ndim)
        return false;
    t->lay = s->lay;
    t->gndim = (int8_t)s->ndim, t->gsplit = (int8_t)q, t->gtrans = false;
    memcpy(t->gshape, s->shape, sizeof t->gshape);
    return true;
}

/* Whether node t reads its grouped source as such: a 2-D product or a 2-D permute of it. */
static bool reads_grouped(const loom__pnode *t) {
    return t->ndim == 2 && (t->op == LOOM_OP_PERMUTE || t->op == LOOM_OP_MATMUL);
}

/* Turns grouped view id into a value plain readers can read (a copy, or a permute's strides over
 * its copied source). */
static void ungroup(loom__program *p, int64_t id) {
    loom__pnode *t = &p->nodes[id];
    if (!t->gndim)
        return;
    t->gndim = 0;
    if (t->op == LOOM_OP_PERMUTE) {
        ungroup(p, t->src[0]);
        view_layout(t, &p->nodes[t->src[0]], &t->lay);
    } else {
        materialize(p, id);
    }
}

static bool blas_ok(const loom__pnode *t) {
    bool tr;
    int64_t ld;
    int nd = t->ndim;
    return loom__blas_layout(t->shape[nd - 2], t->shape[nd - 1], t->lay.stride[nd - 2],
                             t->lay.stride[nd - 1], &tr, &ld);
}

/* Step 2: layouts, in creation order. A workspace layout names the node owning the buffer. */
void loom__assign_layouts(loom__program *p, const bool *live, const bool *is_out) {
    for (int64_t i = 0; i < p->n; i++) {
        loom__pnode *t = &p->nodes[i];
        if (!live[i])
            continue;
        for (int k = 0; k < 3; k++)
            if (t->src[k] >= 0 && !reads_grouped(t))
                ungroup(p, t->src[k]);
        loom__layout *l = &t->lay;
        memset(l, 0, sizeof *l);
        contiguous(t->ndim, t->shape, l->stride);
        switch (loom__ops[t->op].kind) {
            case LOOM_KIND_LEAF:
                if (t->op == LOOM_OP_INPUT) {
                    l->base = LOOM_BASE_INPUT, l->index = t->attr.input;
                } else if (t->op == LOOM_OP_CONST) {
                    l->base = LOOM_BASE_CONST, l->index = (int32_t)p->nconsts;
                    if (t->dtype == LOOM_F32) {
                        float f = (float)t->attr.value;
                        memcpy(&p->consts[p->nconsts++], &f, sizeof f);
                    } else {
                        p->consts[p->nconsts++] = t->attr.value;
                    }
                } else {
                    l->base = LOOM_BASE_PERSIST, l->index = t->attr.persist.slab;
                    l->offset = t->attr.persist.offset;
                }
                break;
            case LOOM_KIND_MOV: {
                const loom__pnode *s = &p->nodes[t->src[0]];
                if (s->gndim) { /* a 2-D permute of a grouped view: rows and columns swap */
                    t->lay = s->lay;
                    t->gndim = s->gndim, t->gsplit = s->gsplit;
                    t->gtrans = s->gtrans ^ (t->attr.perm[0] == 1);
                    memcpy(t->gshape, s->gshape, sizeof t->gshape);
                    if (is_out[i])
                        ungroup(p, i);
                    break;
                }
                bool reshape_ok = t->op != LOOM_OP_RESHAPE ||
                                  (!s->virt && loom__contiguous(s->ndim, s->shape, s->lay.stride));
                if (reshape_ok)
                    view_layout(t, s, l);
                else if (!is_out[i] && group(t, s))
                    break;
                if (!reshape_ok || (is_out[i] && !loom__contiguous(t->ndim, t->shape, l->stride)))
                    materialize(p, i);
                break;
            }
            default:
                if (!is_out[i] && unfold_view(t, &p->nodes[t->src[0]]))
                    break;
                l->base =
                    t->op == LOOM_OP_STORE || t->op == LOOM_OP_SYNC ? LOOM_BASE_NONE : LOOM_BASE_WS;
                l->index = (int32_t)i;
                break;
        }
        if (t->check && loom__is_view(t) &&
            l->base == LOOM_BASE_WS) /* a checked view: check the node that computes it */
            p->nodes[l->index].check = true;
        for (int k = 0; k < 2 && t->op == LOOM_OP_MATMUL; k++) {
            loom__pnode *s = &p->nodes[t->src[k]];
            if (t->ndim != 2 || s->dtype != LOOM_F32 || !reads_view(k))
                ungroup(p, t->src[k]);
            if (!s->gndim && !blas_ok(s)) /* BLAS cannot read this view: copy it */
                materialize(p, t->src[k]);
        }
    }
}

/* Whether a running node writes a buffer of its own (stores and syncs write persistent slabs). */
static bool l_owns(const loom__pnode *t) {
    return t->op != LOOM_OP_STORE && t->op != LOOM_OP_SYNC;
}

/* The layout a kernel node reads for its input k (a materialized view reads src_lay). */
static const loom__layout *read_layout(const loom__program *p, const loom__pnode *t, int k) {
    return t->copy          ? (k == 0 ? &t->src_lay : NULL)
           : t->src[k] >= 0 ? &p->nodes[t->src[k]].lay
                            : NULL;
}

/* The dims a kernel node reads its input k over (a materialized view its copy's; a grouped view
 * its source dims); returns their count, *shape them. */
static int read_dims(const loom__program *p, const loom__pnode *t, int k, const int64_t **shape) {
    const loom__pnode *s = &p->nodes[t->src[k]];
    *shape = t->copy ? t->copy_shape : s->gndim ? s->gshape : s->shape;
    return t->copy ? t->copy_ndim : s->gndim ? s->gndim : s->ndim;
}

bool loom__slab_touches(const loom__layout *l, int nd, const int64_t *shape, int32_t slab,
                        int64_t lo, int64_t hi) {
    if (!l || l->base != LOOM_BASE_PERSIST || l->index != slab)
        return false;
    int64_t last = l->offset;
    for (int d = 0; d < nd; d++)
        last += (shape[d] - 1) * l->stride[d];
    return l->offset < hi && last >= lo;
}

bool loom__slab_accesses(const loom__program *p, const loom__pnode *c, int32_t slab, int64_t lo,
                         int64_t hi) {
    if ((c->op == LOOM_OP_STORE || c->op == LOOM_OP_SYNC) && c->attr.persist.slab == slab) {
        int64_t n = c->op == LOOM_OP_SYNC ? c->shape[0] : loom__numel(c->ndim, c->shape);
        if (c->attr.persist.offset < hi && c->attr.persist.offset + n > lo)
            return true;
    }
    for (int k = 0; k < 3; k++) {
        const loom__layout *l = read_layout(p, c, k);
        if (!l || c->src[k] < 0)
            continue;
        const int64_t *shape;
        int nd = read_dims(p, c, k, &shape);
        if (loom__slab_touches(l, nd, shape, slab, lo, hi))
            return true;
    }
    return false;
}

/* Whether store t of kernel s (ids si < ti) can write its slab range when s runs instead of
 * copying at t: nothing between them reads or writes the range (s itself only elementwise, in
 * place), and every reader of s runs before the next write to the range. */
static bool can_store_in_place(const loom__program *p, const bool *live, const bool *is_out,
                               int64_t si, int64_t ti) {
    const loom__pnode *s = &p->nodes[si], *t = &p->nodes[ti];
    int32_t slab = t->attr.persist.slab;
    int64_t lo = t->attr.persist.offset, hi = lo + loom__numel(t->ndim, t->shape);
    if (!loom__runs_kernel(s) || !l_owns(s) || s->dtype != LOOM_F32 ||
        s->lay.base != LOOM_BASE_WS ||
        s->op == LOOM_OP_POOLGRAD) /* its workspace buffer also holds scratch */
        return false;
    for (int k = 0; k < 3 && s->src[k] >= 0; k++) { /* s may read the range only in place */
        const loom__layout *l = read_layout(p, s, k);
        const loom__pnode *in = &p->nodes[s->src[k]];
        bool same = l->offset == lo && !memcmp(l->stride, s->lay.stride, sizeof l->stride) &&
                    !memcmp(in->shape, s->shape, sizeof in->shape);
        if (loom__slab_touches(l, in->gndim ? in->gndim : in->ndim,
                               in->gndim ? in->gshape : in->shape, slab, lo, hi) &&
            (loom__ops[s->op].kind != LOOM_KIND_EW || !same))
            return false;
    }
    int64_t next_write = INT64_MAX;
    for (int64_t c = si + 1; c < p->n; c++) {
        const loom__pnode *n = &p->nodes[c];
        if (!live[c] || c == ti || !loom__runs_kernel(n))
            continue;
        if (c < ti && loom__slab_accesses(p, n, slab, lo, hi))
            return false;
        if (c > ti && (n->op == LOOM_OP_STORE || n->op == LOOM_OP_SYNC) &&
            loom__slab_accesses(p, n, slab, lo, hi) && c < next_write)
            next_write = c;
    }
    for (int64_t c = si; c < p->n; c++) { /* readers of s (or of its views) */
        const loom__pnode *n = &p->nodes[c];
        if (!live[c])
            continue;
        if (n->lay.base == LOOM_BASE_WS && n->lay.index == si && is_out[c])
            return false;
        for (int k = 0; k < 3 && loom__runs_kernel(n) && c != si; k++) {
            const loom__layout *l = read_layout(p, n, k);
            if (l && l->base == LOOM_BASE_WS && l->index == si && c > next_write)
                return false;
        }
    }
    return true;
}

/* A value computed by a kernel and then stored into a persistent slab is computed in its slab place
 * when that is safe (can_store_in_place): gradients, optimizer state and parameter updates then
 * cost no copy. Elided stores stay in the program, as no-ops. */
/* The kernel node whose buffer a store reads: its source, or the node under a contiguous view that
 * covers that node's whole buffer (a reshape of a reduction, say). */
static int32_t stored_kernel(const loom__program *p, int32_t src) {
    const loom__pnode *v = &p->nodes[src];
    if (!loom__is_view(v) || v->lay.base != LOOM_BASE_WS || v->lay.offset != 0 ||
        !loom__contiguous(v->ndim, v->shape, v->lay.stride))
        return src;
    const loom__pnode *r = &p->nodes[v->lay.index];
    return loom__numel(r->ndim, r->shape) == loom__numel(v->ndim, v->shape) ? v->lay.index : src;
}

void loom__store_in_place(loom__program *p, const bool *live, const bool *is_out) {
    for (int64_t i = 0; i < p->n; i++) {
        loom__pnode *t = &p->nodes[i];
        if (!live[i] || t->op != LOOM_OP_STORE)
            continue;
        int32_t si = stored_kernel(p, t->src[0]);
        if (!can_store_in_place(p, live, is_out, si, i))
            continue;
        for (int64_t c = si; c < p->n; c++) { /* s and its views now live in the slab */
            loom__layout *ls[2] = {&p->nodes[c].lay,
                                   p->nodes[c].copy ? &p->nodes[c].src_lay : NULL};
            for (int k = 0; k < 2; k++) {
                if (!ls[k] || ls[k]->base != LOOM_BASE_WS || ls[k]->index != si)
                    continue;
                ls[k]->base = LOOM_BASE_PERSIST;
                ls[k]->index = t->attr.persist.slab;
                ls[k]->offset += t->attr.persist.offset;
            }
        }
        t->elided = true;
    }
}

typedef struct {
    int64_t off, size, owner;
} block;

/* The node whose kernel computes node i, and so reads its operands: a fused member's kernel, a
 * sink's feeder, an epilogue's library kernel (which may itself be computed by another: a
 * pooling's product); i itself for any other. */
static int64_t runner_of(const loom__program *p, int64_t i) {
    int64_t at = i;
    for (bool moved = true; moved;) {
        const loom__pnode *a = &p->nodes[at];
        int64_t next = a->fused_into >= 0           ? a->fused_into
                       : a->made_by >= 0            ? a->made_by
                       : loom__epilogue_root(p, at) ? p->fused[p->fused_of[at]].epi_of
                                                    : at;
        moved = next != at, at = next;
    }
    return at;
}

/* Marks that node i reads layout l (extending its buffer's life to i). */
static void use(int64_t *last, const loom__layout *l, int64_t i) {
    if (l->base == LOOM_BASE_WS && last[l->index] < i)
        last[l->index] = i;
}

/* The bytes of node t's values. */
static int64_t bytes_of(const loom__pnode *t) {
    return loom__numel(t->ndim, t->shape) * (int64_t)loom__dtype_size(t->dtype);
}

/* First fit of `size` bytes (rounded to 64) among the blocks sorted by offset; returns where. */
static int64_t place(block *blocks, int64_t *nblocks, int64_t *end, int64_t size, int64_t owner) {
    size = (size + 63) & ~(int64_t)63;
    int64_t off = 0, at = 0;
    for (; at < *nblocks; at++) {
        if (blocks[at].off - off >= size)
            break;
        off = blocks[at].off + blocks[at].size;
    }
    memmove(blocks + at + 1, blocks + at, sizeof(block) * (size_t)(*nblocks - at));
    blocks[at] = (block){off, size, owner};
    (*nblocks)++;
    *end = off + size > *end ? off + size : *end;
    return off;
}

struct loom__placer {
    block *blocks;
    int64_t nblocks, end;
};

int64_t loom__place(loom__placer *pl, int64_t bytes, int32_t owner) {
    return place(pl->blocks, &pl->nblocks, &pl->end, bytes, owner);
}

void loom__place_node(loom__placer *pl, loom__program *p, int32_t id) {
    loom__pnode *t = &p->nodes[id];
    if (t->lay.base == LOOM_BASE_WS)
        t->ws_off = loom__place(pl, bytes_of(t), id);
}

/* Whether a live buffer of pl is node owner's. */
static bool placed(const loom__placer *pl, int64_t owner) {
    for (int64_t b = 0; b < pl->nblocks; b++)
        if (pl->blocks[b].owner == owner)
            return true;
    return false;
}

/* Step 3: buffers placed by first fit over the live ones (sorted by offset), each freed after its
 * last reader; the exec list. Liveness follows the layouts that kernels actually read. */
loom_status loom__place_buffers(loom__program *p, const bool *live, const bool *is_out,
                                bool keep_all, int64_t *last) {
    int64_t n = p->n;
    loom__placer pl = {loom__malloc(sizeof(block) * (size_t)(n + 1)), 0, 0};
    if (!pl.blocks)
        return LOOM_ENOMEM;
    for (int64_t i = 0; i < n; i++)
        last[i] = -1;
    for (int64_t i = 0; i < n; i++) {
        const loom__pnode *t = &p->nodes[i];
        if (!live[i])
            continue;
        int64_t at = runner_of(p, i);
        if (t->copy)
            use(last, &t->src_lay, at);
        else if (!loom__is_view(t))
            for (int k = 0; k < 3; k++) { /* (its forms may read another node instead) */
                int32_t s = loom__forms_source(p, (int32_t)i, k);
                if (s >= 0)
                    use(last, &p->nodes[s].lay, at);
            }
        if (is_out[i])
            use(last, &t->lay, INT64_MAX);
    }
    for (int64_t i = 0; i < n; i++) {
        loom__pnode *t = &p->nodes[i];
        if (!live[i])
            continue;
        bool runs = loom__runs_kernel(t) && !t->elided && t->fused_into < 0 && t->made_by < 0 &&
                    !loom__epilogue_root(p, i);
        if (runs)
            p->exec[p->nexec++] = (int32_t)i;
        if (runs && l_owns(t) && t->lay.base == LOOM_BASE_WS) {
            size_t es = loom__dtype_size(t->dtype);
            int64_t size = bytes_of(t);
            if (t->epi >= 0 && t->op == LOOM_OP_MATMUL) /* a column block at a time */
                size = t->shape[0] * loom__epilogue_buffer_cols() * (int64_t)es;
            if (t->op == LOOM_OP_POOLGRAD && t->epi >= 0) /* a plane (its forms' may be) */
                size = t->shape[2] * t->shape[3] * (int64_t)es;
            if (loom__attention_keeps(p, (int32_t)i)) /* its probabilities, for its gradient */
                size = loom__attention_kept_at(t) + loom__attention_kept_bytes(t);
            if (t->op == LOOM_OP_POOLGRAD) /* room to make a strided dy contiguous */
                size += loom__numel(4, p->nodes[t->src[1]].shape) * (int64_t)es;
            size = loom__forms_own_bytes(p, (int32_t)i, size);
            t->ws_off = loom__place(&pl, size, (int32_t)i);
            const loom__fused *k = t->epi >= 0 ? &p->fused[t->epi] : NULL;
            loom__forms_place(p, (int32_t)i, &pl);
            if (k && !placed(&pl, k->root)) /* its epilogue writes now (where no form placed
                                             * its root: sinks hold rows two at a time there) */
                loom__place_node(&pl, p, k->root);
            /* a kernel's members stored in buffers of their own (GELU beside its derivative),
             * this node's or its epilogue's: written now too */
            const loom__fused *f = k                                    ? k
                                   : p->fused_of && p->fused_of[i] >= 0 ? &p->fused[p->fused_of[i]]
                                                                        : NULL;
            for (int q = 0; f && q < f->nout; q++)
                if (p->nodes[f->outs[q]].lay.base == LOOM_BASE_WS)
                    loom__place_node(&pl, p, f->outs[q]);
        }
        int64_t w = 0; /* free the blocks whose last reader is this node */
        for (int64_t b = 0; b < pl.nblocks; b++)
            if (keep_all || last[pl.blocks[b].owner] > i)
                pl.blocks[w++] = pl.blocks[b];
        pl.nblocks = w;
    }
    p->ws_bytes = (size_t)pl.end;
    size_t scratch = 0; /* the library kernels' scratch, after the buffers: the most any needs */
    for (int64_t i = 0; i < n; i++) {
        uint8_t op = p->nodes[i].op;
        size_t need = !live[i]               ? 0
                      : op == LOOM_OP_MATMUL ? loom__product_scratch_bytes(p, (int32_t)i)
                      : op == LOOM_OP_ATTENTION || op == LOOM_OP_ATTENTIONGRAD
                          ? loom__attention_scratch_bytes(p, (int32_t)i)
                      : op == LOOM_OP_LNORM || op == LOOM_OP_LNORMGRAD
                          ? loom__lnorm_scratch_bytes(&p->nodes[i])
                          : 0;
        scratch = need > scratch ? need : scratch;
    }
    if (scratch > 0) {
        p->scratch = (p->ws_bytes + 63) / 64 * 64;
        p->ws_bytes = p->scratch + scratch;
    }
    loom__free(pl.blocks);
    return LOOM_OK;
}

/* ---- entries that one of a process's devices runs for all of them -------------------------- */

typedef struct {
    int32_t slab;
    int64_t lo, hi;
} span;

/* The range a layout over a node of (nd, shape) spans in the slabs a process's devices share
 * (PARAM, STATE); false for any other place, or no elements. */
static bool shared_span(const loom__layout *l, int nd, const int64_t *shape, span *out) {
    if (!l || l->base != LOOM_BASE_PERSIST ||
        (l->index != LOOM_SLAB_PARAM && l->index != LOOM_SLAB_STATE))
        return false;
    int64_t last = l->offset;
    for (int d = 0; d < nd; d++) {
        if (shape[d] == 0)
            return false;
        last += (shape[d] - 1) * l->stride[d];
    }
    *out = (span){l->index, l->offset, last + 1};
    return true;
}

static bool within(const span *a, const span *b) {
    return a->slab == b->slab && a->lo >= b->lo && a->hi <= b->hi;
}

loom_status loom__plan_owners(loom__program *p, const bool *live) {
    int64_t n = p->n, ne = p->nexec, first = ne, last_read = -1;
    p->share = false, p->own = NULL;
    int64_t *entry = loom__malloc(sizeof(int64_t) * (size_t)(n + 1));
    int64_t *own = loom__calloc((size_t)ne + 1, sizeof(int64_t));
    span *w = loom__malloc(sizeof(span) * (size_t)(ne * LOOM_ENTRY_VALUES_MAX + 1));
    int *nw = loom__calloc((size_t)ne + 1, sizeof(int));
    if (!entry || !own || !w || !nw) {
        loom__free(entry), loom__free(own), loom__free(w), loom__free(nw);
        return LOOM_ENOMEM;
    }
    bool ok = true;
    for (int64_t i = 0; i < n; i++)
        entry[i] = -1;
    for (int64_t e = 0; e < ne; e++) { /* what each entry writes */
        entry[p->exec[e]] = e;
        loom__value v[LOOM_ENTRY_VALUES_MAX];
        int nv = loom__entry_values(p, e, v);
        int64_t elems = 0;
        for (int k = 0; k < nv; k++) {
            const loom__pnode *t = &p->nodes[v[k].id];
            span *s = &w[e * LOOM_ENTRY_VALUES_MAX + nw[e]];
            if (shared_span(&v[k].lay, t->ndim, t->shape, s))
                nw[e]++, elems += loom__numel(t->ndim, t->shape);
        }
        if (nv > 0 && nw[e] == nv) /* all its values go into the shared slabs */
            own[e] = elems, first = e < first ? e : first;
        else if (nw[e] > 0) /* and some elsewhere too: every device needs those */
            ok = false;
    }
    for (int64_t i = 0; i < n; i++) { /* what each entry reads */
        const loom__pnode *t = &p->nodes[i];
        int64_t e = live[i] && loom__runs_kernel(t) ? entry[runner_of(p, i)] : -1;
        for (int k = 0; k < 3 && e >= 0; k++) {
            const loom__layout *l = read_layout(p, t, k);
            if (t->src[k] < 0)
                continue;
            const int64_t *shape;
            int nd = read_dims(p, t, k, &shape);
            span r;
            if (!shared_span(l, nd, shape, &r))
                continue;
            bool mine = false; /* an owned entry reads only what it writes */
            for (int q = 0; q < nw[e]; q++)
                mine = mine || within(&r, &w[e * LOOM_ENTRY_VALUES_MAX + q]);
            if (own[e] && !mine)
                ok = false;
            if (!own[e])
                last_read = e > last_read ? e : last_read;
        }
    }
    if (first < ne) { /* every device past a collective between the last read and the first write */
        bool barrier = last_read < 0; /* (nothing else reads them: none needed) */
        for (int64_t e = last_read + 1; e < first; e++)
            barrier = barrier || p->nodes[p->exec[e]].op == LOOM_OP_SYNC;
        ok = ok && barrier && last_read < first;
        for (int64_t a = 0; ok && a < ne; a++) /* and no element written by two entries */
            for (int64_t b = a + 1; own[a] && b < ne; b++)
                for (int x = 0; own[b] && x < nw[a] * nw[b]; x++) {
                    const span *sa = &w[a * LOOM_ENTRY_VALUES_MAX + x / nw[b]],
                               *sb = &w[b * LOOM_ENTRY_VALUES_MAX + x % nw[b]];
                    ok = ok && !(sa->slab == sb->slab && sa->lo < sb->hi && sb->lo < sa->hi);
                }
    }
    p->share = ok;
    if (ok && first < ne)
        p->own = own, own = NULL;
    loom__free(entry), loom__free(own), loom__free(w), loom__free(nw);
    return LOOM_OK;
}

int64_t loom__owners(const loom__program *p, int n, int32_t *owner) {
    int64_t ne = p->nexec, m = 0;
    int64_t *order = loom__malloc(sizeof(int64_t) * (size_t)(ne + 1));
    int64_t *load = loom__calloc((size_t)n + 1, sizeof(int64_t));
    if (!order || !load) {
        loom__free(order), loom__free(load);
        return -1;
    }
    for (int64_t e = 0; e < ne; e++) {
        owner[e] = -1;
        if (!p->own || !p->own[e])
            continue;
        int64_t j = m++; /* insertion by size, largest first; ties in exec order */
        for (; j > 0 && p->own[order[j - 1]] < p->own[e]; j--)
            order[j] = order[j - 1];
        order[j] = e;
    }
    for (int64_t q = 0; q < m; q++) { /* each onto the least loaded device (the lowest on ties) */
        int best = 0;
        for (int k = 1; k < n; k++)
            best = load[k] < load[best] ? k : best;
        load[best] += p->own[order[q]];
        owner[order[q]] = best;
    }
    loom__free(order), loom__free(load);
    return m;
}
