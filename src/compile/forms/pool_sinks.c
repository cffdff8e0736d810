/*
 * forms/pool_sinks.c - the fusion rule "pool-sinks" (its row in compile/fuse.c's loom__rules: what
 * it matches, when it applies, the kernel form it makes and what it records of it).
 */
#include "forms.h"

#include <string.h>

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

int64_t loom__rule_pool_sinks(loom__program *p, const loom__fuse_in *in) {
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
                    if (q == 0 && ns < 2 && loom__fuse_sinkable(p, (int32_t)c, r, L) &&
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
            loom__fuse_slab_touched_between(p, live, L, sk[ns - 1], true, sk, ns))
            continue;
        loom__form *x = loom__form_add(p, L, LOOM_FORM_SINKS);
        if (!x)
            return -1;
        for (int q = 0; q < ns; q++)
            x->u.sinks.sink[q] = sk[q], p->nodes[sk[q]].made_by = L;
        x->u.sinks.n = ns, x->u.sinks.stream = r, x->u.sinks.keep = keep;
        n += ns;
    }
    return n;
}

/* The rows the sinks read, held LOOM_SINK_ROWS at a time, and B's chunks; none where the rows are
 * kept whole. */
static int64_t rows_bytes(const loom__program *p, const loom__form *x) {
    int64_t cols = x->u.sinks.keep ? 0 : p->nodes[x->u.sinks.stream].shape[1];
    size_t es = loom__dtype_size((loom_dtype)p->nodes[x->node].dtype);
    return cols ? LOOM_SINK_ROWS * cols * (int64_t)es + (int64_t)loom__dot_rows_bytes(cols) : 0;
}

/* In the gradient's own buffer, but for an epilogue's: its root holds them. Rows two at a time
 * (not kept): the gradient itself is then made a plane at a time, not whole (with an epilogue the
 * planner counted a plane already). */
static int64_t sinks_bytes(const loom__program *p, const loom__form *x, int64_t bytes) {
    const loom__pnode *t = &p->nodes[x->node];
    if (t->epi >= 0)
        return bytes;
    if (!x->u.sinks.keep)
        bytes -= (loom__numel(t->ndim, t->shape) - t->shape[2] * t->shape[3]) *
                 (int64_t)loom__dtype_size((loom_dtype)t->dtype);
    return bytes + rows_bytes(p, x);
}

static void sinks_place(loom__program *p, const loom__form *x, loom__placer *pl) {
    const loom__pnode *t = &p->nodes[x->node];
    int32_t r = t->epi >= 0 ? p->fused[t->epi].root : -1;
    if (r >= 0 && !x->u.sinks.keep && p->nodes[r].lay.base == LOOM_BASE_WS)
        p->nodes[r].ws_off = loom__place(pl, rows_bytes(p, x), r);
    for (int q = 0; q < x->u.sinks.n; q++)
        loom__place_node(pl, p, x->u.sinks.sink[q]);
}

static void sinks_describe(FILE *f, const loom__program *p, const loom__form *x) {
    bool quad = loom__form_get(p, x->node, LOOM_FORM_QUAD) != NULL;
    for (int q = 0; q < x->u.sinks.n; q++)
        fprintf(f, "%s%s#%d",
                q      ? " "
                : quad ? ", windows into "
                       : ", rows into ",
                loom__ops[p->nodes[x->u.sinks.sink[q]].op].name, x->u.sinks.sink[q]);
}

/* By windows (pool-quad) the products and sums come in another order. */
static int sinks_values(const loom__program *p, const loom__form *x, loom__value *out, int n) {
    bool quad = loom__form_get(p, x->node, LOOM_FORM_QUAD) != NULL;
    for (int q = 0; q < x->u.sinks.n; q++) {
        out[n] = loom__value_of(p, x->u.sinks.sink[q]);
        out[n++].exact = !quad;
    }
    return n;
}

const loom__form_ops loom__form_sinks = {.kind = LOOM_FORM_SINKS,
                                         .own_bytes = sinks_bytes,
                                         .place = sinks_place,
                                         .describe = sinks_describe,
                                         .values = sinks_values};
