/*
 * interp.c - the reference executor: the definition of every op's semantics. Elementwise and
 * reduction kernels are generated from the expressions of ops.def for float and double (with
 * <tgmath.h>, the same text serves both); library ops (matmul through BLAS, im2col/col2im, one-hot,
 * first-max mask, stores) are written out. Every loop visits elements in a fixed order, so results
 * are bitwise repeatable. Kernels read their inputs through strides and write contiguous output.
 */
#include "kernels.h"

#include "../graph/opmath.h"
LOOM_OPMATH(LOOM_OPMATH_EMIT)

/* An index space over up to 4 operands (operand 0 is the output), with adjacent dims merged
 * where every operand allows it. */
typedef struct {
    int nd;
    int nops;
    int64_t shape[MAXD];
    int64_t st[4][MAXD];
} iter;

static void iter_init(iter *it, int nd, const int64_t *shape, int nops,
                      const int64_t *const *strides) {
    it->nops = nops;
    it->nd = 0;
    for (int d = 0; d < nd; d++) {
        if (shape[d] == 1)
            continue;
        int k = it->nd;
        bool merge = k > 0;
        for (int o = 0; o < nops && merge; o++)
            merge = it->st[o][k - 1] == strides[o][d] * shape[d];
        if (merge) {
            it->shape[k - 1] *= shape[d];
            for (int o = 0; o < nops; o++)
                it->st[o][k - 1] = strides[o][d];
            continue;
        }
        it->shape[k] = shape[d];
        for (int o = 0; o < nops; o++)
            it->st[o][k] = strides[o][d];
        it->nd++;
    }
    if (it->nd == 0) { /* a single element */
        it->nd = 1;
        it->shape[0] = 1;
        for (int o = 0; o < nops; o++)
            it->st[o][0] = 0;
    }
}

static int64_t iter_outer(const iter *it) {
    int64_t n = 1;
    for (int d = 0; d < it->nd - 1; d++)
        n *= it->shape[d];
    return n;
}

/* Advances the outer index (all dims but the last) and the operand offsets. */
static void iter_next(const iter *it, int64_t *idx, int64_t *off) {
    for (int d = it->nd - 2; d >= 0; d--) {
        idx[d]++;
        for (int o = 0; o < it->nops; o++)
            off[o] += it->st[o][d];
        if (idx[d] < it->shape[d])
            return;
        for (int o = 0; o < it->nops; o++)
            off[o] -= it->st[o][d] * it->shape[d];
        idx[d] = 0;
    }
}

void loom__contiguous_strides(int nd, const int64_t *shape, int64_t *st) {
    int64_t s = 1;
    for (int d = nd - 1; d >= 0; d--) {
        st[d] = s;
        s *= shape[d];
    }
}

void *loom__lay_addr(const loom__program *p, const loom__bind *b, const loom__layout *l,
                     size_t elem) {
    unsigned char *base = NULL;
    switch ((loom__base)l->base) {
        case LOOM_BASE_NONE:
            return NULL;
        case LOOM_BASE_WS:
            base = b->ws + p->nodes[l->index].ws_off;
            break;
        case LOOM_BASE_INPUT:
            base = (unsigned char *)(uintptr_t)b->inputs[l->index];
            break;
        case LOOM_BASE_CONST:
            base = (unsigned char *)(p->consts + l->index);
            break;
        case LOOM_BASE_PERSIST:
            base = (unsigned char *)b->slab[l->index];
            break;
    }
    return base ? base + (size_t)l->offset * elem : NULL;
}

void *loom__addr(const loom__program *p, const loom__bind *b, int32_t id) {
    const loom__pnode *t = &p->nodes[id];
    return loom__lay_addr(p, b, &t->lay, loom__dtype_size((loom_dtype)t->dtype));
}

/* ---- elementwise: one loop per op and type, from ops.def ------------------------------------ */

#define EW_KERNEL(T, SFX, NAME, ARITY, EXPR)                                                     \
    static void ew_##NAME##_##SFX(const iter *it, T *o, const T *x0, const T *x1, const T *x2) { \
        int64_t idx[MAXD] = {0}, off[4] = {0, 0, 0, 0}, outer = iter_outer(it);                  \
        int L = it->nd - 1;                                                                      \
        int64_t inner = it->shape[L], so = it->st[0][L], s0 = it->st[1][L];                      \
        int64_t s1 = ARITY > 1 ? it->st[2][L] : 0, s2 = ARITY > 2 ? it->st[3][L] : 0;            \
        for (int64_t r = 0; r < outer; r++, iter_next(it, idx, off)) {                           \
            T *po = o + off[0];                                                                  \
            const T *pa = x0 + off[1];                                                           \
            const T *pb = ARITY > 1 ? x1 + off[2] : pa, *pc = ARITY > 2 ? x2 + off[3] : pa;      \
            if (so == 1 && s0 == 1 && (ARITY < 2 || s1 == 1) && (ARITY < 3 || s2 == 1)) {        \
                for (int64_t i = 0; i < inner; i++) {                                            \
                    T a = pa[i], b = pb[i], c = pc[i];                                           \
                    (void)b, (void)c;                                                            \
                    po[i] = (T)(EXPR);                                                           \
                }                                                                                \
            } else if (so == 1 && (uint64_t)(s0 | s1 | s2) <= 1) {                               \
                /* unit or broadcast operands: the tests are loop-invariant (unswitched) */      \
                for (int64_t i = 0; i < inner; i++) {                                            \
                    T a = s0 ? pa[i] : pa[0], b = s1 ? pb[i] : pb[0], c = s2 ? pc[i] : pc[0];    \
                    (void)b, (void)c;                                                            \
                    po[i] = (T)(EXPR);                                                           \
                }                                                                                \
            } else {                                                                             \
                for (int64_t i = 0; i < inner; i++) {                                            \
                    T a = pa[i * s0], b = pb[i * s1], c = pc[i * s2];                            \
                    (void)b, (void)c;                                                            \
                    po[i * so] = (T)(EXPR);                                                      \
                }                                                                                \
            }                                                                                    \
        }                                                                                        \
    }

#define LOOM_EW(NAME, ARITY, EXPR)                                                         \
    EW_KERNEL(float, f32, NAME, ARITY, EXPR)                                               \
    EW_KERNEL(double, f64, NAME, ARITY, EXPR)                                              \
    static loom_status k_##NAME(const loom__program *p, const loom__bind *b, int32_t id) { \
        const loom__pnode *t = &p->nodes[id];                                              \
        int64_t st[MAXD];                                                                  \
        loom__contiguous_strides(t->ndim, t->shape, st);                                   \
        const int64_t *strides[4] = {st, p->nodes[t->src[0]].lay.stride,                   \
                                     p->nodes[t->src[ARITY > 1 ? 1 : 0]].lay.stride,       \
                                     p->nodes[t->src[ARITY > 2 ? 2 : 0]].lay.stride};      \
        if (loom__numel(t->ndim, t->shape) == 0)                                           \
            return LOOM_OK;                                                                \
        iter it;                                                                           \
        iter_init(&it, t->ndim, t->shape, ARITY + 1, strides);                             \
        void *o = loom__addr(p, b, id), *x0 = loom__addr(p, b, t->src[0]);                 \
        void *x1 = ARITY > 1 ? loom__addr(p, b, t->src[1]) : x0;                           \
        void *x2 = ARITY > 2 ? loom__addr(p, b, t->src[2]) : x0;                           \
        if (t->dtype == LOOM_F64)                                                          \
            ew_##NAME##_f64(&it, o, x0, x1, x2);                                           \
        else                                                                               \
            ew_##NAME##_f32(&it, o, x0, x1, x2);                                           \
        return LOOM_OK;                                                                    \
    }
#include "../graph/ops.def"

/* ---- reductions over one axis: out = combine over k of in[k along axis] -----------------------
 */

#define RED_KERNEL(T, SFX, NAME, COMBINE, IDENT)                                                 \
    static T red_lanes_##NAME##_##SFX(const T *x, int64_t len) {                                 \
        T lane[RED_LANES];                                                                       \
        for (int j = 0; j < RED_LANES; j++)                                                      \
            lane[j] = (T)(IDENT);                                                                \
        int64_t k = 0;                                                                           \
        for (; k + RED_LANES <= len; k += RED_LANES)                                             \
            for (int j = 0; j < RED_LANES; j++) {                                                \
                T acc = lane[j], a = x[k + j];                                                   \
                lane[j] = (T)(COMBINE);                                                          \
            }                                                                                    \
        for (int j = 0; k + j < len; j++) {                                                      \
            T acc = lane[j], a = x[k + j];                                                       \
            lane[j] = (T)(COMBINE);                                                              \
        }                                                                                        \
        for (int w = RED_LANES / 2; w >= 1; w /= 2)                                              \
            for (int j = 0; j < w; j++) {                                                        \
                T acc = lane[j], a = lane[j + w];                                                \
                lane[j] = (T)(COMBINE);                                                          \
            }                                                                                    \
        return lane[0];                                                                          \
    }                                                                                            \
    static void red_##NAME##_##SFX(const iter *it, T *o, const T *x, int64_t len, int64_t sax) { \
        int L = it->nd - 1;                                                                      \
        int64_t outer = iter_outer(it), inner = it->shape[L];                                    \
        int64_t so = it->st[0][L], sx = it->st[1][L];                                            \
        if (sax == 1 && len >= 4 * RED_LANES) { /* along memory: lanes, then a fixed tree */     \
            int64_t idx[MAXD] = {0}, off[4] = {0, 0, 0, 0};                                      \
            for (int64_t r = 0; r < outer; r++, iter_next(it, idx, off))                         \
                for (int64_t i = 0; i < inner; i++)                                              \
                    o[off[0] + i * so] = red_lanes_##NAME##_##SFX(x + off[1] + i * sx, len);     \
            return;                                                                              \
        }                                                                                        \
        {                                                                                        \
            int64_t idx[MAXD] = {0}, off[4] = {0, 0, 0, 0};                                      \
            for (int64_t r = 0; r < outer; r++, iter_next(it, idx, off))                         \
                for (int64_t i = 0; i < inner; i++)                                              \
                    o[off[0] + i * so] = (T)(IDENT);                                             \
        }                                                                                        \
        for (int64_t k = 0; k < len; k++) {                                                      \
            int64_t idx[MAXD] = {0}, off[4] = {0, 0, 0, 0};                                      \
            const T *xk = x + k * sax;                                                           \
            for (int64_t r = 0; r < outer; r++, iter_next(it, idx, off)) {                       \
                T *po = o + off[0];                                                              \
                const T *px = xk + off[1];                                                       \
                for (int64_t i = 0; i < inner; i++) {                                            \
                    T acc = po[i * so], a = px[i * sx];                                          \
                    po[i * so] = (T)(COMBINE);                                                   \
                }                                                                                \
            }                                                                                    \
        }                                                                                        \
    }

#define LOOM_RED(NAME, COMBINE, IDENT)                                                     \
    RED_KERNEL(float, f32, NAME, COMBINE, IDENT)                                           \
    RED_KERNEL(double, f64, NAME, COMBINE, IDENT)                                          \
    static loom_status k_##NAME(const loom__program *p, const loom__bind *b, int32_t id) { \
        const loom__pnode *t = &p->nodes[id], *s = &p->nodes[t->src[0]];                   \
        int ax = t->attr.axis;                                                             \
        int64_t st[MAXD];                                                                  \
        loom__contiguous_strides(t->ndim, t->shape, st);                                   \
        const int64_t *strides[2] = {st, s->lay.stride};                                   \
        if (loom__numel(t->ndim, t->shape) == 0)                                           \
            return LOOM_OK;                                                                \
        iter it;                                                                           \
        iter_init(&it, t->ndim, t->shape, 2, strides);                                     \
        void *o = loom__addr(p, b, id), *x = loom__addr(p, b, t->src[0]);                  \
        if (t->dtype == LOOM_F64)                                                          \
            red_##NAME##_f64(&it, o, x, s->shape[ax], s->lay.stride[ax]);                  \
        else                                                                               \
            red_##NAME##_f32(&it, o, x, s->shape[ax], s->lay.stride[ax]);                  \
        return LOOM_OK;                                                                    \
    }
#include "../graph/ops.def"

/* ---- movement: views have no kernel; a materialized view is a strided copy --------------------
 */

#define COPY_KERNEL(T)                                                          \
    static void copy_##T(const iter *it, T *o, const T *x) {                    \
        int64_t idx[MAXD] = {0}, off[4] = {0, 0, 0, 0}, outer = iter_outer(it); \
        int L = it->nd - 1;                                                     \
        int64_t inner = it->shape[L], so = it->st[0][L], sx = it->st[1][L];     \
        for (int64_t r = 0; r < outer; r++, iter_next(it, idx, off))            \
            for (int64_t i = 0; i < inner; i++)                                 \
                o[off[0] + i * so] = x[off[1] + i * sx];                        \
    }
COPY_KERNEL(uint32_t)
COPY_KERNEL(uint64_t)

/* Copies a strided view (shape nd/shape, layout src) into contiguous dst of element size elem. */
void loom__strided_copy(void *dst, const void *src, const loom__layout *l, int nd,
                        const int64_t *shape, size_t elem) {
    if (loom__numel(nd, shape) == 0)
        return;
    int64_t st[MAXD];
    loom__contiguous_strides(nd, shape, st);
    const int64_t *strides[2] = {st, l->stride};
    iter it;
    iter_init(&it, nd, shape, 2, strides);
    if (elem == 8)
        copy_uint64_t(&it, dst, src);
    else
        copy_uint32_t(&it, dst, src);
}

static loom_status k_view(const loom__program *p, const loom__bind *b, int32_t id) {
    const loom__pnode *t = &p->nodes[id];
    size_t elem = loom__dtype_size((loom_dtype)t->dtype);
    LOOM_ASSERT(t->copy);
    loom__strided_copy(loom__addr(p, b, id), loom__lay_addr(p, b, &t->src_lay, elem), &t->src_lay,
                       t->copy_ndim, t->copy_shape, elem);
    return LOOM_OK;
}
#define k_RESHAPE k_view
#define k_PERMUTE k_view
#define k_EXPAND  k_view

static loom_status k_leaf(const loom__program *p, const loom__bind *b, int32_t id) {
    (void)p, (void)b, (void)id;
    return LOOM_OK; /* leaves are never scheduled */
}
#define k_INPUT   k_leaf
#define k_CONST   k_leaf
#define k_PERSIST k_leaf

static loom_status k_STORE(const loom__program *p, const loom__bind *b, int32_t id) {
    const loom__pnode *t = &p->nodes[id], *s = &p->nodes[t->src[0]];
    LOOM_ASSERT(t->dtype == LOOM_F32);
    float *dst = b->slab[t->attr.persist.slab] + t->attr.persist.offset;
    loom__strided_copy(dst, loom__addr(p, b, t->src[0]), &s->lay, s->ndim, s->shape, sizeof(float));
    return LOOM_OK;
}

/* ---- first-max mask along an axis ----------------------------------------------------------- */

#define MAXMASK_KERNEL(T)                                                               \
    static void maxmask_##T(const iter *it, T *o, const T *x, int64_t len, int64_t sax, \
                            int64_t oax) {                                              \
        int64_t idx[MAXD] = {0}, off[4] = {0, 0, 0, 0}, outer = iter_outer(it);         \
        int L = it->nd - 1;                                                             \
        int64_t inner = it->shape[L], so = it->st[0][L], sx = it->st[1][L];             \
        for (int64_t r = 0; r < outer; r++, iter_next(it, idx, off)) {                  \
            for (int64_t i = 0; i < inner; i++) {                                       \
                const T *px = x + off[1] + i * sx;                                      \
                T *po = o + off[0] + i * so;                                            \
                int64_t best = 0;                                                       \
                T acc = px[0];                                                          \
                for (int64_t k = 1; k < len; k++) {                                     \
                    T a = px[k * sax];                                                  \
                    if (a > acc || a != a)                                              \
                        acc = a, best = k;                                              \
                }                                                                       \
                for (int64_t k = 0; k < len; k++)                                       \
                    po[k * oax] = k == best ? (T)1 : (T)0;                              \
            }                                                                           \
        }                                                                               \
    }
MAXMASK_KERNEL(float)
MAXMASK_KERNEL(double)

static loom_status k_MAXMASK(const loom__program *p, const loom__bind *b, int32_t id) {
    const loom__pnode *t = &p->nodes[id], *s = &p->nodes[t->src[0]];
    int ax = t->attr.axis;
    int64_t st[MAXD], shape[MAXD];
    loom__contiguous_strides(t->ndim, t->shape, st);
    memcpy(shape, t->shape, sizeof shape);
    int64_t len = shape[ax];
    if (loom__numel(t->ndim, t->shape) == 0)
        return LOOM_OK;
    shape[ax] = 1;
    const int64_t *strides[2] = {st, s->lay.stride};
    iter it;
    iter_init(&it, t->ndim, shape, 2, strides);
    void *o = loom__addr(p, b, id), *x = loom__addr(p, b, t->src[0]);
    if (t->dtype == LOOM_F64)
        maxmask_double(&it, o, x, len, s->lay.stride[ax], st[ax]);
    else
        maxmask_float(&it, o, x, len, s->lay.stride[ax], st[ax]);
    return LOOM_OK;
}

/* ---- one-hot ----------------------------------------------------------------------------------
 */

/* The next element of strided node s in row-major order: index ix, offset off (elements). */
void loom__next_strided(const loom__pnode *s, int64_t *ix, int64_t *off) {
    for (int d = s->ndim - 1; d >= 0; d--) {
        ix[d]++;
        *off += s->lay.stride[d];
        if (ix[d] < s->shape[d])
            return;
        *off -= s->lay.stride[d] * s->shape[d];
        ix[d] = 0;
    }
}

loom_status loom__bad_index(const char *op, int32_t v, int64_t r, int64_t n) {
    return loom__error(LOOM_ERANGE, "%s: index %d at position %lld is outside [0, %lld)", op, v,
                       (long long)r, (long long)n);
}

/* Rows of a table (V, D) at integer indices (...): out (..., D), row-major. */
static loom_status k_GATHER(const loom__program *p, const loom__bind *b, int32_t id) {
    const loom__pnode *t = &p->nodes[id], *tab = &p->nodes[t->src[0]], *s = &p->nodes[t->src[1]];
    int64_t rows = loom__numel(s->ndim, s->shape), V = tab->shape[0], D = tab->shape[1];
    const int32_t *idx = loom__addr(p, b, t->src[1]);
    const char *src = loom__addr(p, b, t->src[0]);
    char *o = loom__addr(p, b, id);
    size_t es = loom__dtype_size((loom_dtype)t->dtype);
    int64_t ix[MAXD] = {0}, off = 0, rs = tab->lay.stride[0], cs = tab->lay.stride[1];
    for (int64_t r = 0; r < rows; r++, loom__next_strided(s, ix, &off)) {
        int32_t v = idx[off];
        if (v < 0 || v >= V)
            return loom__bad_index("loom_gather", v, r, V);
        const char *row = src + (size_t)(v * rs) * es;
        if (cs == 1)
            memcpy(o + (size_t)(r * D) * es, row, (size_t)D * es);
        else
            for (int64_t j = 0; j < D; j++)
                memcpy(o + (size_t)(r * D + j) * es, row + (size_t)(j * cs) * es, es);
    }
    return LOOM_OK;
}

/* The gather's transpose: out (V, D) = the sum of the rows of src (..., D) at each index, added in
 * row order (a fixed order: bitwise repeatable). */
static loom_status k_SCATTERADD(const loom__program *p, const loom__bind *b, int32_t id) {
    const loom__pnode *t = &p->nodes[id], *x = &p->nodes[t->src[0]], *s = &p->nodes[t->src[1]];
    int64_t rows = loom__numel(s->ndim, s->shape), V = t->attr.classes, D = t->shape[1];
    const int32_t *idx = loom__addr(p, b, t->src[1]);
    const void *src = loom__addr(p, b, t->src[0]);
    void *o = loom__addr(p, b, id);
    bool f64 = t->dtype == LOOM_F64;
    memset(o, 0, (size_t)(V * D) * loom__dtype_size((loom_dtype)t->dtype));
    int64_t ix[MAXD] = {0}, off = 0, xi[MAXD] = {0}, xoff = 0; /* x as (rows, D), strided */
    bool contiguous = x->lay.stride[x->ndim - 1] == 1;         /* x's rows: a row at a time */
    for (int64_t r = 0; r < rows; r++, loom__next_strided(s, ix, &off)) {
        int32_t v = idx[off];
        if (v < 0 || v >= V)
            return loom__bad_index("loom_scatter_add", v, r, V);
        if (contiguous) { /* (the same additions in the same order: an element's rows ascending) */
            int64_t at = loom__row_offset(x, r);
            for (int64_t j = 0; j < D; j++)
                if (f64)
                    ((double *)o)[v * D + j] += ((const double *)src)[at + j];
                else
                    ((float *)o)[v * D + j] += ((const float *)src)[at + j];
            continue;
        }
        for (int64_t j = 0; j < D; j++, loom__next_strided(x, xi, &xoff)) {
            if (f64)
                ((double *)o)[v * D + j] += ((const double *)src)[xoff];
            else
                ((float *)o)[v * D + j] += ((const float *)src)[xoff];
        }
    }
    return LOOM_OK;
}

/* x (..., T, S) with the elements after each row's diagonal (column j > i + S - T, the keys a
 * query may not see) set to the fill value. */
static loom_status k_CAUSAL(const loom__program *p, const loom__bind *b, int32_t id) {
    const loom__pnode *t = &p->nodes[id], *x = &p->nodes[t->src[0]];
    int64_t n = loom__numel(t->ndim, t->shape), T = t->shape[t->ndim - 2],
            S = t->shape[t->ndim - 1];
    const void *src = loom__addr(p, b, t->src[0]);
    void *o = loom__addr(p, b, id);
    double fill = t->attr.value;
    size_t es = loom__dtype_size((loom_dtype)t->dtype);
    bool rows_contiguous = x->lay.stride[x->ndim - 1] == 1;
    int64_t ix[MAXD] = {0}, off = 0, cs = x->lay.stride[x->ndim - 1];
    for (int64_t e = 0; e < n; e += S) { /* a row at a time: its visible part, then the fill */
        int64_t i = (e / S) % T, seen = i + S - T + 1;
        seen = seen < 0 ? 0 : seen > S ? S : seen;
        char *orow = (char *)o + (size_t)e * es;
        const char *srow = (const char *)src + (size_t)off * es;
        if (rows_contiguous)
            memcpy(orow, srow, (size_t)seen * es);
        else
            for (int64_t j = 0; j < seen; j++)
                memcpy(orow + (size_t)j * es, srow + (size_t)(j * cs) * es, es);
        for (int64_t j = seen; j < S; j++) {
            if (t->dtype == LOOM_F64)
                ((double *)(void *)orow)[j] = fill;
            else
                ((float *)(void *)orow)[j] = (float)fill;
        }
        off += (S - 1) * cs, ix[x->ndim - 1] = S - 1; /* to the row's last element, then on */
        loom__next_strided(x, ix, &off);
    }
    return LOOM_OK;
}

/* Dropout: element j of local row r kept, times 1 / (1 - p), unless the uniform at counter
 * (row0 + r) row + j of Philox stream (5, step) of seed is below p (loom_dropout). */
static loom_status k_DROPOUT(const loom__program *p, const loom__bind *b, int32_t id) {
    const loom__pnode *t = &p->nodes[id], *x = &p->nodes[t->src[0]];
    const int32_t *key = loom__addr(p, b, t->src[1]), *row0 = loom__addr(p, b, t->src[2]);
    uint64_t seed = (uint32_t)key[0] | (uint64_t)(uint32_t)key[1] << 32;
    uint64_t stream = 5ull << 32 | (uint32_t)key[2] | (uint64_t)(uint32_t)key[3] << 32;
    int64_t n = loom__numel(t->ndim, t->shape), per = n / (t->shape[0] ? t->shape[0] : 1);
    uint64_t base = (uint64_t)row0[0] * (uint64_t)per;
    const void *src = loom__addr(p, b, t->src[0]);
    void *o = loom__addr(p, b, id);
    double rate = t->attr.value, scale = 1.0 / (1.0 - rate);
    int64_t ix[MAXD] = {0}, off = 0;
    uint32_t w[4];
    for (int64_t e = 0; e < n; e++, loom__next_strided(x, ix, &off)) {
        uint64_t c = base + (uint64_t)e;
        if (e == 0 || c % 4 == 0)
            loom_philox(seed, stream, c / 4, w);
        bool drop = (double)(w[c % 4] >> 8) * (1.0 / 16777216.0) < rate;
        if (t->dtype == LOOM_F64)
            ((double *)o)[e] = drop ? 0.0 : ((const double *)src)[off] * scale;
        else
            ((float *)o)[e] = drop ? 0.0f : ((const float *)src)[off] * (float)scale;
    }
    return LOOM_OK;
}

/* PAD and CROP, a plane at a time: each row of the smaller (PAD's input, CROP's output) copied
 * to or from its place in the larger; PAD writes zeros around them (the rows above and below, and
 * each row's two ends), nothing twice. */
static loom_status k_pad_crop(const loom__program *p, const loom__bind *b, int32_t id, bool crop) {
    if (!crop && loom__pad_planes(p, b, id))
        return LOOM_OK;
    const loom__pnode *t = &p->nodes[id], *x = &p->nodes[t->src[0]];
    int nd = t->ndim;
    const int64_t *small = crop ? t->shape : x->shape;
    int64_t ph = t->attr.win.ph, pw = t->attr.win.pw, H = small[nd - 2], W = small[nd - 1];
    int64_t planes = H && W ? loom__numel(nd, small) / (H * W) : 0, BW = W + 2 * pw;
    int64_t rs = x->lay.stride[nd - 2], cs = x->lay.stride[nd - 1];
    size_t es = loom__dtype_size((loom_dtype)t->dtype), row = es * (size_t)W;
    char *o = loom__addr(p, b, id);
    const char *src = loom__addr(p, b, t->src[0]);
    for (int64_t q = 0; q < planes; q++) {
        const char *xs = /* (row ph, column pw of the plane for a crop) */
            src + es * (size_t)(loom__row_offset(x, q * x->shape[nd - 2] + (crop ? ph : 0)) +
                                (crop ? pw * cs : 0));
        char *dst = o + es * (size_t)(q * (crop ? H * W : (H + 2 * ph) * BW));
        if (!crop) {
            memset(dst, 0, es * (size_t)(ph * BW)); /* the rows above */
            dst += es * (size_t)(ph * BW);
        }
        for (int64_t i = 0; i < H; i++, xs += es * (size_t)rs) {
            char *d = crop ? dst + row * (size_t)i : dst + es * (size_t)(i * BW);
            if (!crop) /* the row's ends */
                memset(d, 0, es * (size_t)pw),
                    memset(d + es * (size_t)(pw + W), 0, es * (size_t)pw);
            if (!crop)
                d += es * (size_t)pw;
            if (cs == 1)
                memcpy(d, xs, row);
            else
                for (int64_t j = 0; j < W; j++)
                    memcpy(d + (size_t)j * es, xs + (size_t)(j * cs) * es, es);
        }
        if (!crop) /* the rows below */
            memset(dst + es * (size_t)(H * BW), 0, es * (size_t)(ph * BW));
    }
    return LOOM_OK;
}

static loom_status k_PAD(const loom__program *p, const loom__bind *b, int32_t id) {
    return k_pad_crop(p, b, id, false);
}

static loom_status k_CROP(const loom__program *p, const loom__bind *b, int32_t id) {
    return k_pad_crop(p, b, id, true);
}

static loom_status k_ONEHOT(const loom__program *p, const loom__bind *b, int32_t id) {
    const loom__pnode *t = &p->nodes[id], *s = &p->nodes[t->src[0]];
    int64_t n = t->attr.classes, rows = loom__numel(s->ndim, s->shape);
    int32_t *idx = loom__addr(p, b, t->src[0]);
    void *o = loom__addr(p, b, id);
    size_t es = loom__dtype_size((loom_dtype)t->dtype);
    if (rows == 0)
        return LOOM_OK;
    memset(o, 0, (size_t)(rows * n) * es);
    int64_t ix[MAXD] = {0}, off = 0;
    for (int64_t r = 0; r < rows; r++) {
        int32_t v = idx[off];
        if (v < 0 || v >= n)
            return loom__bad_index("loom_onehot", v, r, n);
        if (t->dtype == LOOM_F64)
            ((double *)o)[r * n + v] = 1.0;
        else
            ((float *)o)[r * n + v] = 1.0f;
        loom__next_strided(s, ix, &off);
    }
    return LOOM_OK;
}

/* ---- collectives ----------------------------------------------------------------------------- */

static loom_status k_ALLREDUCE(const loom__program *p, const loom__bind *b, int32_t id) {
    const loom__pnode *t = &p->nodes[id], *s = &p->nodes[t->src[0]];
    size_t es = loom__dtype_size((loom_dtype)t->dtype);
    void *o = loom__addr(p, b, id);
    int64_t n = loom__numel(t->ndim, t->shape);
    loom__strided_copy(o, loom__addr(p, b, t->src[0]), &s->lay, s->ndim, s->shape, es);
    if (!b->allreduce)
        return LOOM_OK;
    if (t->dtype != LOOM_F32)
        return loom__error(LOOM_EUNSUPPORTED,
                           "loom_allreduce: %s across devices is not supported, "
                           "only f32",
                           loom__dtype_name((loom_dtype)t->dtype));
    return b->allreduce(b->comm, o, n, t->attr.reduce);
}

static loom_status k_SYNC(const loom__program *p, const loom__bind *b, int32_t id) {
    const loom__pnode *t = &p->nodes[id];
    if (!b->allreduce)
        return LOOM_OK;
    return b->allreduce(b->comm, b->slab[t->attr.persist.slab] + t->attr.persist.offset,
                        t->shape[0], LOOM_REDUCE_MEAN);
}

/* Anomaly detection: the first non-finite value of a checked node fails the run. */
static loom_status check_finite(const loom__program *p, const loom__bind *b, int32_t id) {
    const loom__pnode *t = &p->nodes[id];
    const void *v = loom__addr(p, b, id);
    for (int64_t i = 0; i < loom__numel(t->ndim, t->shape); i++) {
        double x = t->dtype == LOOM_F64 ? ((const double *)v)[i] : ((const float *)v)[i];
        if (!isfinite(x))
            return loom__error(LOOM_ERANGE, "the loss is %s (anomaly detection)",
                               isnan(x) ? "NaN" : "infinite");
    }
    return LOOM_OK;
}

/* ---- the dispatch table, from ops.def ---------------------------------------------------------
 */

/* The ops whose kernels live in the family files (kernels.h). */
#define k_MATMUL        loom__k_matmul
#define k_UNFOLD        loom__k_unfold
#define k_FOLD          loom__k_fold
#define k_POOLMAX       loom__k_poolmax
#define k_POOLGRAD      loom__k_poolgrad
#define k_SOFTMAX       loom__k_softmax
#define k_LNORM         loom__k_lnorm
#define k_LNORMGRAD     loom__k_lnormgrad
#define k_ATTENTION     loom__k_attention
#define k_ATTENTIONGRAD loom__k_attention_grad
static const loom__kernel_fn kernels[LOOM_OP_COUNT] = {
#define LOOM_LEAF(name, attr)          [LOOM_OP_##name] = k_##name,
#define LOOM_EW(name, arity, expr)     [LOOM_OP_##name] = k_##name,
#define LOOM_RED(name, combine, ident) [LOOM_OP_##name] = k_##name,
#define LOOM_MOV(name, attr)           [LOOM_OP_##name] = k_##name,
#define LOOM_OPQ(name, arity, attr)    [LOOM_OP_##name] = k_##name,
#include "../graph/ops.def"
};

typedef struct {
    const loom__fused *k;
    void *args[LOOM_FUSED_MAX_ARGS];
} split_kernel;

static void kernel_range(void *ctx, int64_t lo, int64_t hi, int w) {
    split_kernel *sk = ctx;
    (void)w;
    sk->k->fn(sk->args, lo, hi);
}

loom_status loom__interp_entry(const loom__program *p, const loom__bind *b, int64_t e) {
    int32_t id = p->exec[e];
    loom_status s = LOOM_OK;
    /* the device's other cores: scratch as large as the program's own (a no-op once it is) */
    if (p->scratch > 0 && !loom__team_reserve(b->team, p->ws_bytes - p->scratch))
        return LOOM_ENOMEM;
    if (p->fused_of && p->fused_of[id] >= 0) { /* a generated kernel */
        const loom__fused *k = &p->fused[p->fused_of[id]];
        split_kernel sk = {.k = k};
        for (int a = 0; a < k->nargs; a++)
            sk.args[a] = loom__addr(p, b, k->args[a]);
        if (k->work >= LOOM_SPLIT_MIN)
            loom__team_for(b->team, k->extent, 1, kernel_range, &sk);
        else
            k->fn(sk.args, 0, k->extent);
    } else { /* its op's kernel, or the one a form of it makes its whole kernel */
        loom__kernel_fn run = loom__form_kernel(p, id);
        s = run ? run(p, b, id) : kernels[p->nodes[id].op](p, b, id);
    }
    if (!s && p->nodes[id].check)
        s = check_finite(p, b, id);
    return s;
}

loom_status loom__interp_run(const loom__program *p, const loom__bind *b) {
    loom__blas_init();
    if (p->prof_ns)
        __atomic_fetch_add(&p->prof_ns[p->nexec], 1, __ATOMIC_RELAXED);
    for (int64_t i = 0; i < p->nexec; i++) {
        if (!loom__runs_here(b, i)) /* another device's */
            continue;
        double t0 = p->prof_ns ? loom__now() : 0;
        loom_status s = loom__interp_entry(p, b, i);
        if (p->prof_ns) {
            uint64_t ns = (uint64_t)((loom__now() - t0) * 1e9);
            uint64_t slot = __atomic_fetch_add(&p->prof_seen[i], 1, __ATOMIC_RELAXED);
            __atomic_fetch_add(&p->prof_ns[i], ns, __ATOMIC_RELAXED);
            __atomic_store_n(&p->prof_keep[i * LOOM_PROF_KEEP + (int64_t)(slot % LOOM_PROF_KEEP)],
                             (uint32_t)(ns < UINT32_MAX ? ns : UINT32_MAX), __ATOMIC_RELAXED);
        }
        if (s)
            return s;
    }
    return LOOM_OK;
}
