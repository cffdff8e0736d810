/*
 * interp.c - the reference executor: the definition of every op's semantics. Elementwise and
 * reduction kernels are generated from the expressions of ops.def for float and double (with
 * <tgmath.h>, the same text serves both); library ops (matmul through BLAS, im2col/col2im, one-hot,
 * first-max mask, stores) are written out. Every loop visits elements in a fixed order, so results
 * are bitwise repeatable. Kernels read their inputs through strides and write contiguous output.
 */
#include "internal.h"

#include <cblas.h>
#include <pthread.h>
#include <string.h>
#include <tgmath.h>

#include "../graph/opmath.h"
LOOM_OPMATH(LOOM_OPMATH_EMIT)

#define MAXD LOOM_MAX_DIMS

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

static void contiguous_strides(int nd, const int64_t *shape, int64_t *st) {
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

typedef loom_status (*kernel_fn)(const loom__program *p, const loom__bind *b, int32_t id);

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
        contiguous_strides(t->ndim, t->shape, st);                                         \
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

/* A reduction along contiguous memory keeps RED_LANES partial results (element k goes to lane
 * k % RED_LANES) and combines them in a fixed pairwise tree: independent chains that vectorize,
 * instead of one chain bound by the add latency; the order is fixed, so runs repeat bitwise. */
#define RED_LANES 16
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
        contiguous_strides(t->ndim, t->shape, st);                                         \
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
static void strided_copy(void *dst, const void *src, const loom__layout *l, int nd,
                         const int64_t *shape, size_t elem) {
    if (loom__numel(nd, shape) == 0)
        return;
    int64_t st[MAXD];
    contiguous_strides(nd, shape, st);
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
    strided_copy(loom__addr(p, b, id), loom__lay_addr(p, b, &t->src_lay, elem), &t->src_lay,
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
    strided_copy(dst, loom__addr(p, b, t->src[0]), &s->lay, s->ndim, s->shape, sizeof(float));
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
    contiguous_strides(t->ndim, t->shape, st);
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

/* ---- matmul through BLAS ----------------------------------------------------------------------
 */

bool loom__blas_layout(int64_t rows, int64_t cols, int64_t srow, int64_t scol, bool *trans,
                       int64_t *ld) {
    if (rows == 0 || cols == 0) { /* nothing is read */
        *trans = false, *ld = cols > 1 ? cols : 1;
        return true;
    }
    if (cols <= 1 || scol == 1) {
        int64_t l = rows <= 1 ? (cols > 1 ? cols : 1) : srow;
        if (rows <= 1 || l >= (cols > 1 ? cols : 1)) {
            *trans = false, *ld = l;
            return true;
        }
    }
    if (rows <= 1 || srow == 1) {
        int64_t l = cols <= 1 ? (rows > 1 ? rows : 1) : scol;
        if (cols <= 1 || l >= (rows > 1 ? rows : 1)) {
            *trans = true, *ld = l;
            return true;
        }
    }
    return false;
}

static void blas_once(void) {
    openblas_set_num_threads(1);
}

void loom__blas_init(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, blas_once);
}

const char *loom__blas_name(void) {
    return openblas_get_config();
}

bool loom__use_own_gemm(void) {
    const char *m = loom__getenv()->matmul;
    return loom__gemm_available() && !(m && strcmp(m, "blas") == 0);
}

/* ---- epilogues: a generated kernel run on each block of a library kernel's output ------------
 */

typedef struct {
    const loom__fused *k;
    void *args[LOOM_FUSED_MAX_ARGS];
    int64_t rows, cols;           /* of the epilogue's 2-D root */
    int64_t rows_of, n_of, plane; /* the library kernel's output: a product's rows and columns,
                                   * or a pool gradient's plane size */
    const float *buf;             /* the library kernel's block buffer */
    float *root;                  /* the root's buffer: all of it, or LOOM_SINK_ROWS rows */
    bool sinks, keep; /* keep: the rows are the node's whole output, not LOOM_SINK_ROWS of them */
    float *sum_out;   /* sinks: a sum along the root's rows (or NULL) */
    float *dot_out;   /* a product root x B on the dot-product path (or NULL) */
    int64_t dot_n;    /* ... its columns */
    loom__dot_rows dot;
} epilogue;

/* The epilogue of library node id (its generated kernel, and its sinks); with sinks but no
 * generated kernel the rows are the node's own values, copied into its rows buffer. */
static void epilogue_init(epilogue *e, const loom__program *p, const loom__bind *b, int32_t id) {
    const loom__pnode *t = &p->nodes[id];
    e->k = t->epi >= 0 ? &p->fused[t->epi] : NULL;
    for (int a = 0; e->k && a < e->k->nargs; a++)
        e->args[a] = a == e->k->epi_arg ? NULL : loom__addr(p, b, e->k->args[a]);
    const loom__pnode *r = &p->nodes[t->nsinks ? t->stream : e->k->root];
    e->rows = r->shape[0], e->cols = r->shape[1];
    e->root = e->k      ? e->args[0] /* the pool gradient's plane, dy scratch, then the rows */
              : t->keep ? loom__addr(p, b, id) /* or its own values, whole */
                        : (float *)(b->ws + t->ws_off) + t->shape[2] * t->shape[3] +
                              loom__numel(4, p->nodes[t->src[1]].shape);
    for (int q = 0; q < t->nsinks; q++) {
        int32_t s = t->sinks[q];
        const loom__pnode *sk = &p->nodes[s];
        if (sk->op == LOOM_OP_SUM) {
            e->sum_out = loom__addr(p, b, s);
            continue;
        }
        loom__gmat gb = {loom__addr(p, b, sk->src[1]), {0}, {0}};
        loom__operand_dims(&p->nodes[sk->src[1]], &gb.row, &gb.col);
        e->dot_out = loom__addr(p, b, s), e->dot_n = sk->shape[1];
        loom__dot_rows_begin(&e->dot, &gb, sk->shape[1], e->cols,
                             e->root + LOOM_SINK_ROWS * e->cols);
    }
    e->sinks = t->nsinks > 0, e->keep = t->keep;
}

/* The epilogue over flat elements [lo, hi) of the library kernel's output, values at v. With
 * sinks, each row once complete goes into them while it is still in cache: the sum along it (the
 * reduction kernel's own lanes path) and, LOOM_SINK_ROWS rows at a time, its product rows. */
static void epilogue_range(epilogue *e, int64_t lo, int64_t hi, const float *v) {
    while (lo < hi) {
        int64_t i = lo / e->cols, j0 = lo % e->cols;
        int64_t j1 = hi - lo < e->cols - j0 ? j0 + (hi - lo) : e->cols;
        int64_t held = i % LOOM_SINK_ROWS; /* with sinks, the rows kept */
        float *row = e->root + (e->sinks && !e->keep ? held : i) * e->cols;
        e->args[0] = row + j0;
        if (e->k)
            e->k->part(e->args, i, j0, j1, v);
        else if (v != row + j0) /* (pool_float may have written it there: plane_place) */
            memcpy(row + j0, v, sizeof(float) * (size_t)(j1 - j0));
        if (e->sinks && j1 == e->cols && e->sum_out)
            e->sum_out[i] = red_lanes_SUM_f32(row, e->cols);
        if (e->sinks && j1 == e->cols && e->dot_out &&
            (held == LOOM_SINK_ROWS - 1 || i == e->rows - 1))
            loom__dot_rows_run(&e->dot, e->root, e->cols, held + 1,
                               e->dot_out + (i - held) * e->dot_n);
        v += j1 - j0, lo += j1 - j0;
    }
}

static void product_block_done(void *ctx, int64_t jc, int64_t nc) {
    epilogue *e = ctx;
    for (int64_t i = 0; i < e->rows_of; i++)
        epilogue_range(e, i * e->n_of + jc, i * e->n_of + jc + nc, e->buf + i * LOOM_GEMM_NC);
}

static void plane_done(void *ctx, int64_t plane, const float *v) {
    epilogue *e = ctx;
    epilogue_range(e, plane * e->plane, (plane + 1) * e->plane, v);
}

/* Where a pool gradient with sinks but no generated kernel writes a plane: in place in the rows
 * it keeps (a plane lies within a row there), so that nothing is copied. */
static float *plane_place(void *ctx, int64_t plane) {
    epilogue *e = ctx;
    int64_t lo = plane * e->plane, i = lo / e->cols;
    return e->root + (e->keep ? i : i % LOOM_SINK_ROWS) * e->cols + lo % e->cols;
}

/* Product node id's operands as matrices (their first elements, rows and columns); returns K. */
static int64_t product_operands(const loom__program *p, const loom__bind *b, int32_t id,
                                loom__gmat *ga, loom__gmat *gb) {
    const loom__pnode *t = &p->nodes[id];
    ga->p = loom__addr(p, b, t->src[0]), gb->p = loom__addr(p, b, t->src[1]);
    loom__operand_dims(&p->nodes[t->src[0]], &ga->row, &ga->col);
    loom__operand_dims(&p->nodes[t->src[1]], &gb->row, &gb->col);
    return loom__numel(ga->col.n, ga->col.size);
}

/* The next index over a product's nb batch dims (an odometer) and its operands' offsets. */
static void next_batch(int nb, const int64_t *shape, const int64_t *sa, const int64_t *sb,
                       int64_t *idx, int64_t *oa, int64_t *ob) {
    for (int d = nb - 1; d >= 0; d--) {
        idx[d]++;
        *oa += sa[d], *ob += sb[d];
        if (idx[d] < shape[d])
            return;
        *oa -= sa[d] * shape[d], *ob -= sb[d] * shape[d];
        idx[d] = 0;
    }
}

static loom_status k_MATMUL(const loom__program *p, const loom__bind *b, int32_t id) {
    const loom__pnode *t = &p->nodes[id], *A = &p->nodes[t->src[0]], *B = &p->nodes[t->src[1]];
    int nd = t->ndim;
    if (t->epi >= 0 && t->act) { /* straight into the epilogue's root, done as it stores */
        loom__gmat ga, gb;
        int64_t k = product_operands(p, b, id, &ga, &gb);
        /* the leaf added: a bias row (broadcast down: row stride 0) or a matrix */
        const loom__pnode *v = t->act_add >= 0 ? &p->nodes[t->act_add] : NULL;
        const float *vp = v ? loom__addr(p, b, t->act_add) : NULL;
        bool matrix = v && v->lay.stride[0] != 0;
        loom__gemm_act act = {.bias = v && !matrix ? vp : NULL,
                              .relu = t->act_relu,
                              .mask = t->act_mask >= 0 ? loom__addr(p, b, t->act_mask) : NULL,
                              .ldm = t->act_mask >= 0 ? p->nodes[t->act_mask].lay.stride[0]
                                     : matrix         ? v->lay.stride[0]
                                                      : 0,
                              .colsum = t->act_sum >= 0 ? loom__addr(p, b, t->act_sum) : NULL,
                              .addend = matrix ? vp : NULL};
        loom__sgemm_act(t->shape[0], t->shape[1], k, &ga, &gb,
                        loom__addr(p, b, p->fused[t->epi].root), t->shape[1], &act,
                        b->ws + p->scratch);
        return LOOM_OK;
    }
    if (t->epi >= 0) { /* column blocks into the node's buffer, each then through the epilogue */
        loom__gmat ga, gb;
        int64_t k = product_operands(p, b, id, &ga, &gb);
        epilogue e = {0};
        epilogue_init(&e, p, b, id);
        e.rows_of = t->shape[0], e.n_of = t->shape[1];
        float *buf = (float *)(b->ws + t->ws_off);
        e.buf = buf;
        loom__sgemm_blocks(t->shape[0], t->shape[1], k, &ga, &gb, buf, LOOM_GEMM_NC,
                           product_block_done, &e, b->ws + p->scratch);
        return LOOM_OK;
    }
    if (t->dtype == LOOM_F32 && loom__use_own_gemm()) { /* any strides, grouped views too */
        int64_t batch = loom__numel(nd - 2, t->shape), idx[MAXD] = {0}, oa = 0, ob = 0;
        int64_t m = t->shape[nd - 2], n = t->shape[nd - 1];
        loom__gmat ga, gb;
        int64_t k = product_operands(p, b, id, &ga, &gb);
        float *o = loom__addr(p, b, id);
        loom__gdim crow = {.n = 1, .size = {m}, .stride = {n}},
                   ccol = {.n = 1, .size = {n}, .stride = {1}};
        const float *a0 = ga.p, *b0 = gb.p;
        for (int64_t r = 0; r < batch; r++) {
            ga.p = a0 + oa, gb.p = b0 + ob;
            if (m * n > 0)
                loom__sgemm_g(m, n, k, &ga, &gb, o + r * m * n, crow, ccol, false,
                              b->ws + p->scratch);
            next_batch(nd - 2, t->shape, A->lay.stride, B->lay.stride, idx, &oa, &ob);
        }
        return LOOM_OK;
    }
    int64_t m = t->shape[nd - 2], n = t->shape[nd - 1], k = A->shape[nd - 1];
    bool ta = false, tb = false;
    int64_t lda = 1, ldb = 1;
    bool ok = loom__blas_layout(m, k, A->lay.stride[nd - 2], A->lay.stride[nd - 1], &ta, &lda) &&
              loom__blas_layout(k, n, B->lay.stride[nd - 2], B->lay.stride[nd - 1], &tb, &ldb);
    LOOM_ASSERT(ok); /* the planner materializes other layouts */
    size_t es = loom__dtype_size((loom_dtype)t->dtype);
    unsigned char *o = loom__addr(p, b, id);
    const unsigned char *pa = loom__addr(p, b, t->src[0]), *pb = loom__addr(p, b, t->src[1]);
    int64_t batch = loom__numel(nd - 2, t->shape), idx[MAXD] = {0}, oa = 0, ob = 0;
    for (int64_t r = 0; r < batch; r++) {
        unsigned char *po = o + (size_t)(r * m * n) * es;
        if (k == 0 && m * n > 0) {
            memset(po, 0, (size_t)(m * n) * es);
        } else if (m * n > 0 && t->dtype == LOOM_F64) {
            cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans,
                        tb ? CblasTrans : CblasNoTrans, (int)m, (int)n, (int)k, 1.0,
                        (const double *)(pa + (size_t)oa * es), (int)lda,
                        (const double *)(pb + (size_t)ob * es), (int)ldb, 0.0, (double *)po,
                        (int)(n > 1 ? n : 1));
        } else if (m * n > 0) {
            cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans,
                        tb ? CblasTrans : CblasNoTrans, (int)m, (int)n, (int)k, 1.0f,
                        (const float *)(pa + (size_t)oa * es), (int)lda,
                        (const float *)(pb + (size_t)ob * es), (int)ldb, 0.0f, (float *)po,
                        (int)(n > 1 ? n : 1));
        }
        next_batch(nd - 2, t->shape, A->lay.stride, B->lay.stride, idx, &oa, &ob);
    }
    return LOOM_OK;
}

/* ---- im2col and col2im ------------------------------------------------------------------------
 */

/* UNFOLD: x (N,C,H,W) strided -> out (C,KH,KW,N,OH,OW) contiguous; FOLD is its adjoint: it adds
 * cols (C,KH,KW,N,OH,OW) strided into x (N,C,H,W) contiguous, zeroed first. One walk serves both;
 * each output row splits into a padded head, an inside run and a padded tail. */
static void window_range(int64_t len, int64_t out, int k, int s, int p, int64_t *lo, int64_t *hi) {
    /* o is inside when 0 <= o*s - p + k < len */
    int64_t a = p - k, b = len - 1 + p - k; /* s*o in [a, b] */
    *lo = a <= 0 ? 0 : (a + s - 1) / s;
    *hi = b < 0 ? 0 : b / s + 1;
    *hi = *hi > out ? out : *hi;
    *lo = *lo > *hi ? *hi : *lo;
}

#define WINDOW_ROW(T)                                                                             \
    static inline void window_row_##T(T *xrow, int64_t xs, T *crow, int64_t cs, int64_t ow,       \
                                      int64_t lo, int64_t hi, int64_t first, int sw, bool fold) { \
        T *restrict c = crow;                                                                     \
        T *restrict x = xrow + first * xs;                                                        \
        if (fold && cs == 1 && xs == 1 && sw == 1) {                                              \
            for (int64_t ox = lo; ox < hi; ox++)                                                  \
                x[ox - lo] += c[ox];                                                              \
        } else if (fold) {                                                                        \
            for (int64_t ox = lo; ox < hi; ox++)                                                  \
                x[(ox - lo) * sw * xs] += c[ox * cs];                                             \
        } else if (cs == 1 && xs == 1) { /* the common case: unit strides, inlined */             \
            for (int64_t ox = 0; ox < lo; ox++)                                                   \
                c[ox] = (T)0;                                                                     \
            if (sw == 1)                                                                          \
                for (int64_t ox = lo; ox < hi; ox++)                                              \
                    c[ox] = x[ox - lo];                                                           \
            else                                                                                  \
                for (int64_t ox = lo; ox < hi; ox++)                                              \
                    c[ox] = x[(ox - lo) * sw];                                                    \
            for (int64_t ox = hi; ox < ow; ox++)                                                  \
                c[ox] = (T)0;                                                                     \
        } else {                                                                                  \
            for (int64_t ox = 0; ox < ow; ox++)                                                   \
                c[ox * cs] = ox >= lo && ox < hi ? x[(ox - lo) * sw * xs] : (T)0;                 \
        }                                                                                         \
    }
WINDOW_ROW(float)
WINDOW_ROW(double)

#define WINDOW_KERNEL(T)                                                                         \
    static void window_##T(const loom_window *w, const int64_t *xs, const int64_t *xst,          \
                           const int64_t *cs, const int64_t *cst, T *x, T *cols, bool fold) {    \
        int64_t C = xs[1], H = xs[2], W = xs[3], N = xs[0], OH = cs[4], OW = cs[5];              \
        for (int64_t c = 0; c < C; c++)                                                          \
            for (int64_t i = 0; i < w->kh; i++)                                                  \
                for (int64_t j = 0; j < w->kw; j++) {                                            \
                    int64_t ylo, yhi, xlo, xhi;                                                  \
                    window_range(H, OH, (int)i, w->sh, w->ph, &ylo, &yhi);                       \
                    window_range(W, OW, (int)j, w->sw, w->pw, &xlo, &xhi);                       \
                    int64_t first = xlo * w->sw - w->pw + j;                                     \
                    for (int64_t n = 0; n < N; n++)                                              \
                        for (int64_t oy = 0; oy < OH; oy++) {                                    \
                            T *crow = cols + c * cst[0] + i * cst[1] + j * cst[2] + n * cst[3] + \
                                      oy * cst[4];                                               \
                            if (oy < ylo || oy >= yhi) {                                         \
                                for (int64_t ox = 0; ox < OW && !fold; ox++)                     \
                                    crow[ox * cst[5]] = (T)0;                                    \
                                continue;                                                        \
                            }                                                                    \
                            int64_t iy = oy * w->sh - w->ph + i;                                 \
                            window_row_##T(x + n * xst[0] + c * xst[1] + iy * xst[2], xst[3],    \
                                           crow, cst[5], OW, xlo, xhi, first, w->sw, fold);      \
                        }                                                                        \
                }                                                                                \
    }
WINDOW_KERNEL(float)
WINDOW_KERNEL(double)

/* A fold over columns of contiguous planes, an image plane (n, c) at a time, which stays in L1
 * while its window places add into it: each place (i, j)'s columns row by row into the elements
 * they go to, so that every element takes its window places in the same order as window_T's
 * (the same sums), without walking the whole image once a place. Plain loops, no gather and
 * scatter: Zen 4's slow scatters made that form the slower one (bench/RESULTS.md). The planes'
 * and columns' strides: contiguous_strides' of x (N,C,H,W) and cols (C,KH,KW,N,OH,OW) with the
 * columns' planes (N's stride) cst3 apart. */
enum { FOLD_TAPS = 64 }; /* window places whose ranges fold_planes works out once */
#define FOLD_PLANES(T)                                                                      \
    static void fold_planes_##T(const loom_window *w, const int64_t *xs, const int64_t *cs, \
                                int64_t cst3, T *x, const T *cols) {                        \
        int64_t C = xs[1], H = xs[2], W = xs[3], N = xs[0], OH = cs[4], OW = cs[5];         \
        int64_t taps = (int64_t)w->kh * w->kw, sw = w->sw, rg[FOLD_TAPS][4], g[4];          \
        for (int64_t t = 0; t < taps && t < FOLD_TAPS; t++) {                               \
            window_range(H, OH, (int)(t / w->kw), w->sh, w->ph, &rg[t][0], &rg[t][1]);      \
            window_range(W, OW, (int)(t % w->kw), w->sw, w->pw, &rg[t][2], &rg[t][3]);      \
        }                                                                                   \
        for (int64_t c = 0; c < C; c++)                                                     \
            for (int64_t n = 0; n < N; n++) {                                               \
                T *plane = x + (n * C + c) * H * W;                                         \
                for (int64_t t = 0; t < taps; t++) {                                        \
                    int i = (int)(t / w->kw), j = (int)(t % w->kw);                         \
                    const int64_t *e = t < FOLD_TAPS ? rg[t] : g;                           \
                    if (t >= FOLD_TAPS) {                                                   \
                        window_range(H, OH, i, w->sh, w->ph, &g[0], &g[1]);                 \
                        window_range(W, OW, j, w->sw, w->pw, &g[2], &g[3]);                 \
                    }                                                                       \
                    const T *cp = cols + ((c * taps + t) * N + n) * cst3;                   \
                    for (int64_t oy = e[0]; oy < e[1]; oy++) {                              \
                        T *restrict r =                                                     \
                            plane + (oy * w->sh - w->ph + i) * W + e[2] * sw - w->pw + j;   \
                        const T *restrict v = cp + oy * OW + e[2];                          \
                        if (sw == 1)                                                        \
                            for (int64_t q = 0; q < e[3] - e[2]; q++)                       \
                                r[q] += v[q];                                               \
                        else                                                                \
                            for (int64_t q = 0; q < e[3] - e[2]; q++)                       \
                                r[q * sw] += v[q];                                          \
                    }                                                                       \
                }                                                                           \
            }                                                                               \
    }
FOLD_PLANES(float)
FOLD_PLANES(double)

/* Whether fold_planes can run a fold of columns s: their planes contiguous. */
static bool fold_planes_ok(const loom__pnode *s) {
    const int64_t *cs = s->shape, *st = s->lay.stride;
    return st[5] == 1 && st[4] == cs[5] && st[3] >= cs[4] * cs[5] && st[2] == cs[3] * st[3] &&
           st[1] == cs[2] * st[2] && st[0] == cs[1] * st[1];
}

static loom_status window_kernel(const loom__program *p, const loom__bind *b, int32_t id,
                                 bool fold) {
    const loom__pnode *t = &p->nodes[id], *s = &p->nodes[t->src[0]];
    const loom__pnode *xn = fold ? t : s, *cn = fold ? s : t;
    int64_t xst[MAXD], cst[MAXD];
    if (fold) {
        contiguous_strides(4, t->shape, xst);
        memcpy(cst, s->lay.stride, sizeof cst);
        memset(loom__addr(p, b, id), 0,
               (size_t)loom__numel(4, t->shape) * loom__dtype_size((loom_dtype)t->dtype));
    } else {
        memcpy(xst, s->lay.stride, sizeof xst);
        contiguous_strides(6, t->shape, cst);
    }
    void *x = loom__addr(p, b, fold ? id : t->src[0]);
    void *c = loom__addr(p, b, fold ? t->src[0] : id);
    if (fold && fold_planes_ok(s)) {
        if (t->dtype == LOOM_F64)
            fold_planes_double(&t->attr.win, t->shape, s->shape, cst[3], x, c);
        else
            fold_planes_float(&t->attr.win, t->shape, s->shape, cst[3], x, c);
    } else if (t->dtype == LOOM_F64)
        window_double(&t->attr.win, xn->shape, xst, cn->shape, cst, x, c, fold);
    else
        window_float(&t->attr.win, xn->shape, xst, cn->shape, cst, x, c, fold);
    return LOOM_OK;
}

static loom_status k_UNFOLD(const loom__program *p, const loom__bind *b, int32_t id) {
    return window_kernel(p, b, id, false);
}
/* Where a fold adds its product's (c, i, j), (n, oy, ox) element: x(n, c, oy*sh + i, ox*sw + j). */
static void fold_dims(const loom__pnode *t, loom__gdim *crow, loom__gdim *ccol) {
    const loom_window *w = &t->attr.win;
    int64_t C = t->shape[1], H = t->shape[2], W = t->shape[3];
    int64_t OH = (H - w->kh) / w->sh + 1, OW = (W - w->kw) / w->sw + 1;
    *crow = (loom__gdim){.n = 3, .size = {C, w->kh, w->kw}, .stride = {H * W, W, 1}};
    *ccol = (loom__gdim){
        .n = 3, .size = {t->shape[0], OH, OW}, .stride = {C * H * W, W * w->sh, w->sw}};
}

/* A fold that computes its product (compile/fuse.c): x = 0, then x(c, oy*sh + i, ox*sw + j) +=
 * (A B)((c,i,j), (n,oy,ox)), each result added straight from the product's register tile. */
static loom_status fold_product(const loom__program *p, const loom__bind *b, int32_t id,
                                int32_t mid) {
    const loom__pnode *t = &p->nodes[id], *m = &p->nodes[mid];
    loom__gmat ga, gb;
    int64_t k = product_operands(p, b, mid, &ga, &gb);
    loom__gdim crow, ccol;
    fold_dims(t, &crow, &ccol);
    float *x = loom__addr(p, b, id);
    memset(x, 0, sizeof(float) * (size_t)loom__numel(4, t->shape));
    loom__sgemm_g(m->shape[0], m->shape[1], k, &ga, &gb, x, crow, ccol, true, b->ws + p->scratch);
    return LOOM_OK;
}

static loom_status fold_back(const loom__program *p, const loom__bind *b, int32_t id, int32_t mid);

static loom_status k_FOLD(const loom__program *p, const loom__bind *b, int32_t id) {
    int32_t v = p->nodes[id].src[0], m = p->nodes[v].src[0];
    if (m >= 0 && p->nodes[m].fused_into == id && p->nodes[id].back >= 0)
        return fold_back(p, b, id, m);
    if (m >= 0 && p->nodes[m].fused_into == id)
        return fold_product(p, b, id, m);
    return window_kernel(p, b, id, true);
}

/* ---- max pooling -------------------------------------------------------------------------------
 */

/* POOLMAX: x (N,C,H,W) strided -> y (N,C,OH,OW) contiguous, the first maximum of each window in
 * row-major window order (a NaN wins, as MAX's combine); padded positions are skipped. POOLGRAD
 * finds the same position and adds dy there; dx is contiguous. The 2x2 stride-2 unpadded window
 * on unit-stride rows, the most common, has its own loop. */
/* A pool gradient's plane whose windows fit two registers, from the codes: per element of the
 * plane, its window and its place in the window (0-3; 7 where no window covers it), 16 a group. */
typedef struct {
    int64_t groups, last; /* 16-element groups of the plane; elements in the last */
    int32_t win[16][16], pos[16][16];
} pool_gtab;

#if defined(__x86_64__) && defined(__GNUC__)
#    include <immintrin.h>
#    define HAVE_POOL512 1
/* The 2x2 stride-2 window's rows in AVX-512, 16 windows at a time: the two input rows are loaded
 * 32 floats each and split into even and odd columns (a, b from the upper row, c, d from the
 * lower), and the same rule as the scalar rows picks the first maximum (a NaN wins): bitwise the
 * scalar kernels' results, about ten times fewer instructions. */
static const int32_t pool_even[16] = {0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30};
static const int32_t pool_lo[16] = {0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23};

__attribute__((target("avx512f"))) static inline void pool_split(const float *r, int n,
                                                                 __m512 *even, __m512 *odd) {
    __mmask16 m0 = (__mmask16)(n >= 8 ? 0xffff : (1u << (2 * n)) - 1);
    __mmask16 m1 = (__mmask16)(n <= 8 ? 0 : (1u << (2 * (n - 8))) - 1);
    __m512 lo = _mm512_maskz_loadu_ps(m0, r), hi = _mm512_maskz_loadu_ps(m1, r + 16);
    __m512i ie = _mm512_loadu_si512(pool_even), io = _mm512_add_epi32(ie, _mm512_set1_epi32(1));
    *even = _mm512_permutex2var_ps(lo, ie, hi);
    *odd = _mm512_permutex2var_ps(lo, io, hi);
}

/* where the maximum so far moves to b, c, d (the scalar rows' q1, q2, q3) */
__attribute__((target("avx512f"))) static inline void pool_moves(__m512 a, __m512 b, __m512 c,
                                                                 __m512 d, __mmask16 *q1,
                                                                 __mmask16 *q2, __mmask16 *q3,
                                                                 __m512 *m) {
    *q1 = _mm512_cmp_ps_mask(b, a, _CMP_GT_OQ) | _mm512_cmp_ps_mask(b, b, _CMP_UNORD_Q);
    __m512 x = _mm512_mask_blend_ps(*q1, a, b);
    *q2 = _mm512_cmp_ps_mask(c, x, _CMP_GT_OQ) | _mm512_cmp_ps_mask(c, c, _CMP_UNORD_Q);
    x = _mm512_mask_blend_ps(*q2, x, c);
    *q3 = _mm512_cmp_ps_mask(d, x, _CMP_GT_OQ) | _mm512_cmp_ps_mask(d, d, _CMP_UNORD_Q);
    *m = _mm512_mask_blend_ps(*q3, x, d);
}

/* The window's argmax as a code: 0, 1 (upper row), 2, 3 (lower row), from the moves. */
__attribute__((target("avx512f"))) static inline __m512i pool_code(__mmask16 q1, __mmask16 q2,
                                                                   __mmask16 q3) {
    __m512i v = _mm512_maskz_mov_epi32((__mmask16)(q1 & ~q2 & ~q3), _mm512_set1_epi32(1));
    v = _mm512_mask_mov_epi32(v, (__mmask16)(q2 & ~q3), _mm512_set1_epi32(2));
    return _mm512_mask_mov_epi32(v, q3, _mm512_set1_epi32(3));
}

/* The maxima of windows (a, b | c, d) to o and their codes to codes (or NULL), the n lanes of
 * mn; relu: each maximum's ReLU (the op table's a <= 0 ? 0 : a, so a NaN stays) and bit 2 of the
 * code where it passes (its backward's mask). */
__attribute__((target("avx512f"))) static inline void pool_windows(__m512 a, __m512 b, __m512 c,
                                                                   __m512 d, __mmask16 mn,
                                                                   bool relu, float *o,
                                                                   uint8_t *codes) {
    __mmask16 q1, q2, q3;
    __m512 m;
    pool_moves(a, b, c, d, &q1, &q2, &q3, &m);
    __m512i code = pool_code(q1, q2, q3);
    if (relu) {
        __mmask16 pass = _mm512_cmp_ps_mask(m, _mm512_setzero_ps(), _CMP_GT_OQ);
        m = _mm512_mask_mov_ps(m, _mm512_cmp_ps_mask(m, _mm512_setzero_ps(), _CMP_LE_OQ),
                               _mm512_setzero_ps());
        code = _mm512_mask_or_epi32(code, pass, code, _mm512_set1_epi32(4));
    }
    _mm512_mask_storeu_ps(o, mn, m);
    if (codes)
        _mm512_mask_cvtepi32_storeu_epi8(codes, mn, code);
}

/* codes (or NULL): each window's argmax code, a byte each; relu: the ReLU of each maximum */
__attribute__((target("avx512f"))) static void
pool2_row512(const float *r0, const float *r1, int64_t ow, float *o, uint8_t *codes, bool relu) {
    for (int64_t x0 = 0; x0 < ow; x0 += 16) {
        int n = (int)(ow - x0 < 16 ? ow - x0 : 16);
        __m512 a, b, c, d;
        __mmask16 mn = (__mmask16)((1u << n) - 1);
        pool_split(r0 + 2 * x0, n, &a, &b);
        pool_split(r1 + 2 * x0, n, &c, &d);
        pool_windows(a, b, c, d, mn, relu, o + x0, codes ? codes + x0 : NULL);
    }
}

/* Whole contiguous planes of small rows (an 11 x 11 plane pooled to 5 x 5: the row kernel would
 * fill a third of its lanes), 16 windows at a time flattened over planes, rows and columns, their
 * four values gathered; the index vectors repeat every 16 planes. The same rule, so the same bits.
 */
#    define POOL_PLANES_MAX 256 /* windows a plane at most */
__attribute__((target("avx512f"))) static void pool2_planes512(const float *x, int64_t planes,
                                                               int64_t H, int64_t W, int64_t OH,
                                                               int64_t OW, float *o, uint8_t *codes,
                                                               bool relu) {
    int64_t per = OH * OW;
    int32_t idx[16 * POOL_PLANES_MAX]; /* 16 planes of windows: their upper-left inputs */
    for (int64_t f = 0; f < 16 * per; f++)
        idx[f] = (int32_t)(f / per * H * W + 2 * (f % per / OW) * W + 2 * (f % OW));
    for (int64_t p0 = 0; p0 < planes; p0 += 16) {
        const float *xb = x + p0 * H * W;
        int64_t nout = (planes - p0 < 16 ? planes - p0 : 16) * per;
        for (int64_t f0 = 0; f0 < nout; f0 += 16) {
            int n = (int)(nout - f0 < 16 ? nout - f0 : 16);
            __mmask16 mn = (__mmask16)((1u << n) - 1);
            __m512i i0 = _mm512_loadu_si512(idx + f0);
            __m512 z = _mm512_setzero_ps();
            __m512 a = _mm512_mask_i32gather_ps(z, mn, i0, xb, 4);
            __m512 b = _mm512_mask_i32gather_ps(z, mn, i0, xb + 1, 4);
            __m512 c = _mm512_mask_i32gather_ps(z, mn, i0, xb + W, 4);
            __m512 d = _mm512_mask_i32gather_ps(z, mn, i0, xb + W + 1, 4);
            pool_windows(a, b, c, d, mn, relu, o + p0 * per + f0,
                         codes ? codes + p0 * per + f0 : NULL);
        }
    }
}

/* Writes the 2n floats of v (even columns) and w (odd ones) interleaved at o. */
__attribute__((target("avx512f"))) static inline void pool_merge(__m512 v, __m512 w, int n,
                                                                 float *o) {
    __m512i il = _mm512_loadu_si512(pool_lo), ih = _mm512_add_epi32(il, _mm512_set1_epi32(8));
    __mmask16 m0 = (__mmask16)(n >= 8 ? 0xffff : (1u << (2 * n)) - 1);
    __mmask16 m1 = (__mmask16)(n <= 8 ? 0 : (1u << (2 * (n - 8))) - 1);
    _mm512_mask_storeu_ps(o, m0, _mm512_permutex2var_ps(v, il, w));
    _mm512_mask_storeu_ps(o + 16, m1, _mm512_permutex2var_ps(v, ih, w));
}

/* The gradient rows: the winners found again from r0 and r1, or read from codes (POOLMAX's, of
 * the same input; the buffer has 16 bytes to spare past the last row); relu: gy only where bit 2
 * of the code says the ReLU after the pooling passed (where(relu > 0, gy, 0)), else +0. */
__attribute__((target("avx512f"))) static void pool2_grad_row512(const float *r0, const float *r1,
                                                                 int64_t ow, const float *gy,
                                                                 float *o0, float *o1,
                                                                 const uint8_t *codes, bool relu) {
    for (int64_t x0 = 0; x0 < ow; x0 += 16) {
        int n = (int)(ow - x0 < 16 ? ow - x0 : 16);
        __m512 a, b, c, d, m, g = _mm512_maskz_loadu_ps((__mmask16)((1u << n) - 1), gy + x0);
        __mmask16 w0, w1, w2, w3;
        if (codes) {
            __m512i k = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(codes + x0)));
            if (relu)
                g = _mm512_maskz_mov_ps(_mm512_test_epi32_mask(k, _mm512_set1_epi32(4)), g);
            k = _mm512_and_si512(k, _mm512_set1_epi32(3));
            w0 = _mm512_cmpeq_epi32_mask(k, _mm512_setzero_si512());
            w1 = _mm512_cmpeq_epi32_mask(k, _mm512_set1_epi32(1));
            w2 = _mm512_cmpeq_epi32_mask(k, _mm512_set1_epi32(2));
            w3 = _mm512_cmpeq_epi32_mask(k, _mm512_set1_epi32(3));
        } else {
            __mmask16 q1, q2, q3;
            pool_split(r0 + 2 * x0, n, &a, &b);
            pool_split(r1 + 2 * x0, n, &c, &d);
            pool_moves(a, b, c, d, &q1, &q2, &q3, &m);
            w3 = q3, w2 = (__mmask16)(q2 & ~q3), w1 = (__mmask16)(q1 & ~q2 & ~q3);
            w0 = (__mmask16)(~q1 & ~q2 & ~q3);
        }
        pool_merge(_mm512_maskz_mov_ps(w0, g), _mm512_maskz_mov_ps(w1, g), n, o0 + 2 * x0);
        pool_merge(_mm512_maskz_mov_ps(w2, g), _mm512_maskz_mov_ps(w3, g), n, o1 + 2 * x0);
    }
}

/* A pool gradient's plane from its argmax codes when the plane's windows fit two registers
 * (a 5 x 5 plane): each output element picks its window's gradient and code from the registers
 * (a permute) and keeps the gradient where the code names it; the rest, the last row and column a
 * window does not cover included, is +0. The values the rows write, in one pass over the plane. */
__attribute__((target("avx512f"))) static void pool2_grad_plane512(const pool_gtab *t,
                                                                   const float *gy,
                                                                   const uint8_t *codes, bool relu,
                                                                   float *o, int64_t per) {
    int n0 = (int)(per < 16 ? per : 16), n1 = (int)(per - n0);
    __m512 g0 = _mm512_maskz_loadu_ps((__mmask16)((1u << n0) - 1), gy);
    __m512 g1 = _mm512_maskz_loadu_ps((__mmask16)((1u << n1) - 1), gy + 16);
    /* codes 16 at a time: at most 15 bytes past a plane's last, within the 16 the buffer spares */
    __m512i k0 = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)codes));
    __m512i k1 = n1 > 0 ? _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(codes + 16)))
                        : _mm512_setzero_si512();
    if (relu) {
        g0 = _mm512_maskz_mov_ps(_mm512_test_epi32_mask(k0, _mm512_set1_epi32(4)), g0);
        g1 = _mm512_maskz_mov_ps(_mm512_test_epi32_mask(k1, _mm512_set1_epi32(4)), g1);
    }
    k0 = _mm512_and_si512(k0, _mm512_set1_epi32(3)),
    k1 = _mm512_and_si512(k1, _mm512_set1_epi32(3));
    for (int64_t q = 0; q < t->groups; q++) {
        __m512i w = _mm512_loadu_si512(t->win[q]);
        __m512 g = _mm512_permutex2var_ps(g0, w, g1);
        __m512i k = _mm512_permutex2var_epi32(k0, w, k1);
        __mmask16 hit = _mm512_cmpeq_epi32_mask(k, _mm512_loadu_si512(t->pos[q]));
        __mmask16 m = (__mmask16)(q == t->groups - 1 ? (1u << t->last) - 1 : 0xffff);
        _mm512_mask_storeu_ps(o + 16 * q, m, _mm512_maskz_mov_ps(hit, g));
    }
}

/* Bit t of b (t < 8) to bit 2t: the even columns of 16 that lanes t read. */
static inline __mmask16 spread8(unsigned b) {
    b = (b | b << 4) & 0x0f0f;
    b = (b | b << 2) & 0x3333;
    return (__mmask16)((b | b << 1) & 0x5555);
}

/* Max pooling of any window over a plane (rows rs apart, columns cs apart), 16 windows of an
 * output row at a time: each window place (i, j) is a vector of the 16 windows' inputs (a masked
 * load for unit strides, two loads split into even and odd columns for stride 2 over unit
 * columns, a gather otherwise; places in the padding masked off), taken where no place has been
 * yet, where it is greater or where it is a NaN: the scalar rule in the scalar order, so the same
 * maxima and codes (or NULL). */
__attribute__((target("avx512f"))) static void pool_any_plane512(const float *x, int64_t rs,
                                                                 int64_t cs, int64_t H, int64_t W,
                                                                 const loom_window *w, int64_t OH,
                                                                 int64_t OW, float *o,
                                                                 uint8_t *codes, bool relu) {
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i ie = _mm512_loadu_si512(pool_even);
    enum {
        LOAD,
        SPLIT,
        GATHER
    } how = cs != 1      ? GATHER
            : w->sw == 1 ? LOAD
            : w->sw == 2 ? SPLIT
                         : GATHER;
    __mmask16 ok[256], lo[256], hi[256]; /* per window column j: the lanes it reads */
    __m512i off[256];                    /* ... and their offsets in a row, for a gather */
    for (int64_t x0 = 0; x0 < OW; x0 += 16) {
        int n = (int)(OW - x0 < 16 ? OW - x0 : 16);
        __mmask16 mn = (__mmask16)((1u << n) - 1);
        __m512i cx =
            _mm512_sub_epi32(/* each lane's window's first column */
                             _mm512_mullo_epi32(_mm512_add_epi32(lane, _mm512_set1_epi32((int)x0)),
                                                _mm512_set1_epi32(w->sw)),
                             _mm512_set1_epi32(w->pw));
        for (int j = 0; j < w->kw; j++) {
            __m512i ix = _mm512_add_epi32(cx, _mm512_set1_epi32(j));
            ok[j] = mn & _mm512_cmpge_epi32_mask(ix, _mm512_setzero_si512()) &
                    _mm512_cmplt_epi32_mask(ix, _mm512_set1_epi32((int)W));
            lo[j] = spread8((unsigned)ok[j] & 0xff), hi[j] = spread8((unsigned)ok[j] >> 8);
            off[j] = _mm512_mullo_epi32(ix, _mm512_set1_epi32((int)cs));
        }
        for (int64_t oy = 0; oy < OH; oy++) {
            __mmask16 have = 0;
            __m512 acc = _mm512_setzero_ps();
            __m512i code = _mm512_setzero_si512();
            for (int i = 0; i < w->kh; i++) {
                int64_t iy = oy * w->sh - w->ph + i;
                if (iy < 0 || iy >= H)
                    continue;
                const float *row = x + iy * rs;
                for (int j = 0; j < w->kw; j++) {
                    const float *r = row + x0 * w->sw - w->pw + j; /* lane 0's column */
                    __m512 a =
                        how == LOAD ? _mm512_maskz_loadu_ps(ok[j], r)
                        : how == SPLIT
                            ? _mm512_permutex2var_ps(_mm512_maskz_loadu_ps(lo[j], r), ie,
                                                     _mm512_maskz_loadu_ps(hi[j], r + 16))
                            : _mm512_mask_i32gather_ps(_mm512_setzero_ps(), ok[j], off[j], row, 4);
                    __mmask16 take = ok[j] & (~have | _mm512_cmp_ps_mask(a, acc, _CMP_GT_OQ) |
                                              _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q));
                    acc = _mm512_mask_mov_ps(acc, take, a);
                    code = _mm512_mask_mov_epi32(code, take, _mm512_set1_epi32(i * w->kw + j));
                    have |= ok[j];
                }
            }
            if (relu) { /* the ReLU (a NaN stays), bit 7 of the code where it passes */
                __mmask16 pass = _mm512_cmp_ps_mask(acc, _mm512_setzero_ps(), _CMP_GT_OQ);
                acc = _mm512_mask_mov_ps(acc,
                                         _mm512_cmp_ps_mask(acc, _mm512_setzero_ps(), _CMP_LE_OQ),
                                         _mm512_setzero_ps());
                code = _mm512_mask_or_epi32(code, pass, code, _mm512_set1_epi32(0x80));
            }
            _mm512_mask_storeu_ps(o + oy * OW + x0, mn, acc);
            if (codes)
                _mm512_mask_cvtepi32_storeu_epi8(codes + oy * OW + x0, mn, code);
        }
    }
}
#endif

#define POOL_KERNELS(T, U)                                                                        \
    /* The window's maximum to *best and its place in the window (i kw + j, row-major), the       \
     * argmax code; padded places never win (the padding is at most half a window, so every       \
     * window has a real one). */                                                                 \
    static int pool_argmax_##T(const T *x, const int64_t *xst, int64_t H, int64_t W,              \
                               const loom_window *w, int64_t oy, int64_t ox, T *best) {           \
        int at = -1;                                                                              \
        T acc = (T)0;                                                                             \
        for (int i = 0; i < w->kh; i++) {                                                         \
            int64_t iy = oy * w->sh - w->ph + i;                                                  \
            for (int j = 0; j < w->kw && iy >= 0 && iy < H; j++) {                                \
                int64_t ix = ox * w->sw - w->pw + j;                                              \
                if (ix < 0 || ix >= W)                                                            \
                    continue;                                                                     \
                T a = x[iy * xst[2] + ix * xst[3]];                                               \
                if (at < 0 || a > acc || a != a)                                                  \
                    acc = a, at = i * w->kw + j;                                                  \
            }                                                                                     \
        }                                                                                         \
        *best = acc;                                                                              \
        return at;                                                                                \
    }                                                                                             \
    /* One output row of the 2x2 stride-2 window over input rows r0, r1, branch-free so that it   \
     * vectorizes: q1..q3 are all-ones where b, c, d take over from the maximum so far (the same  \
     * rule as the general path); the gradient goes to the winner as bits masked in U. */         \
    static void pool2_row_##T(const T *restrict r0, const T *restrict r1, int64_t ow,             \
                              T *restrict o) {                                                    \
        for (int64_t ox = 0; ox < ow; ox++) {                                                     \
            T a = r0[2 * ox], b = r0[2 * ox + 1], c = r1[2 * ox], d = r1[2 * ox + 1];             \
            T m = ((b > a) | (b != b)) ? b : a;                                                   \
            m = ((c > m) | (c != c)) ? c : m;                                                     \
            o[ox] = ((d > m) | (d != d)) ? d : m;                                                 \
        }                                                                                         \
    }                                                                                             \
    static void pool2_grad_row_##T(const T *restrict r0, const T *restrict r1, int64_t ow,        \
                                   const T *restrict gy, T *restrict o0, T *restrict o1) {        \
        for (int64_t ox = 0; ox < ow; ox++) {                                                     \
            T a = r0[2 * ox], b = r0[2 * ox + 1], c = r1[2 * ox], d = r1[2 * ox + 1];             \
            U q1 = -(U)((b > a) | (b != b));                                                      \
            T m = q1 ? b : a;                                                                     \
            U q2 = -(U)((c > m) | (c != c));                                                      \
            m = q2 ? c : m;                                                                       \
            U q3 = -(U)((d > m) | (d != d)), g;                                                   \
            memcpy(&g, &gy[ox], sizeof g);                                                        \
            U v3 = g & q3, v2 = g & q2 & ~q3, v1 = g & q1 & ~q2 & ~q3, v0 = g & ~q1 & ~q2 & ~q3;  \
            memcpy(&o1[2 * ox + 1], &v3, sizeof g);                                               \
            memcpy(&o1[2 * ox], &v2, sizeof g);                                                   \
            memcpy(&o0[2 * ox + 1], &v1, sizeof g);                                               \
            memcpy(&o0[2 * ox], &v0, sizeof g);                                                   \
        }                                                                                         \
    }                                                                                             \
    /* With `done`, out is one plane, handed to done(ctx, plane index, out) when written. */      \
    static void pool_##T(const loom_window *w, const int64_t *xs, const int64_t *xst,             \
                         const int64_t *ys, const T *x, const T *dy, const int64_t *dyst, T *out, \
                         bool grad, uint8_t *codes, bool relu,                                    \
                         void (*done)(void *, int64_t, const T *), T *(*place)(void *, int64_t),  \
                         void *ctx) {                                                             \
        int64_t N = xs[0], C = xs[1], H = xs[2], W = xs[3], OH = ys[2], OW = ys[3];               \
        /* pooling contiguous planes: prefetch the input 4 KB on (measured: hardware prefetch     \
         * alone leaves the 11 MB pass 10-15% slower) */                                          \
        int64_t pf = !grad && xst[2] == W && xst[1] == H * W ? 4096 / (int64_t)sizeof(T) : 0;     \
        bool k2 = loom__pool2x2(w, xst[3]) &&                                                     \
                  (!codes || (sizeof(T) == 4 && loom__pool_codes_available()));                   \
        if (grad && !k2 && !done)                                                                 \
            memset(out, 0, sizeof(T) * (size_t)(N * C * H * W));                                  \
        if (!grad && k2 && !done && pool2_planes_##T(x, xs, xst, ys, out, codes, relu))           \
            return;                                                                               \
        int64_t dpos[256]; /* a window place's offset in the plane from the window's corner */    \
        for (int k = 0; grad && k < w->kh * w->kw && k < 256; k++)                                \
            dpos[k] = k / w->kw * W + k % w->kw;                                                  \
        pool_gtab gtab;                                                                           \
        bool planes_g =                                                                           \
            grad && k2 && codes && sizeof(T) == 4 && pool_gtab_init(&gtab, H, W, OH, OW);         \
        for (int64_t n = 0; n < N; n++)                                                           \
            for (int64_t c = 0; c < C; c++) {                                                     \
                const T *xp = x + n * xst[0] + c * xst[1];                                        \
                const T *gp = grad ? dy + n * dyst[0] + c * dyst[1] : NULL; /* a plane */         \
                T *op = !done   ? out + (n * C + c) * (grad ? H * W : OH * OW)                    \
                        : place ? place(ctx, n * C + c)                                           \
                                : out;                                                            \
                if (grad && !k2 && done)                                                          \
                    memset(op, 0, sizeof(T) * (size_t)(H * W));                                   \
                if (planes_g) /* the whole plane from the codes */                                \
                    pool2_grad_plane_##T(&gtab, gp, codes + (n * C + c) * OH * OW, relu, op,      \
                                         OH * OW);                                                \
                else if (k2) { /* every position a window covers is written; the rest zeroed */   \
                    for (int64_t oy = 0; oy < OH; oy++) {                                         \
                        const T *r0 = xp + 2 * oy * xst[2];                                       \
                        T *o0 = grad ? op + 2 * oy * W : op + oy * OW;                            \
                        uint8_t *cr = codes ? codes + ((n * C + c) * OH + oy) * OW : NULL;        \
                        for (int64_t q = 0; pf && q < 2 * W; q += 64 / (int64_t)sizeof(T))        \
                            __builtin_prefetch(r0 + pf + q);                                      \
                        if (grad && !pool2_grad_fast_##T(r0, r0 + xst[2], OW, gp + oy * OW, o0,   \
                                                         o0 + W, cr, relu))                       \
                            pool2_grad_row_##T(r0, r0 + xst[2], OW, gp + oy * OW, o0, o0 + W);    \
                        else if (!grad && !pool2_fast_##T(r0, r0 + xst[2], OW, o0, cr, relu))     \
                            pool2_row_##T(r0, r0 + xst[2], OW, o0);                               \
                        if (grad && W > 2 * OW)                                                   \
                            o0[W - 1] = o0[2 * W - 1] = (T)0;                                     \
                    }                                                                             \
                    if (grad && H > 2 * OH)                                                       \
                        memset(op + (H - 1) * W, 0, sizeof(T) * (size_t)W);                       \
                } else { /* any window: codes (or NULL) hold each one's argmax place, and with    \
                          * relu bit 7 where the ReLU of the maximum passes (its backward's mask) \
                          */                                                                      \
                    uint8_t *cp = codes ? codes + (n * C + c) * OH * OW : NULL;                   \
                    bool fast = !grad && pool_any_##T(xp, xst, H, W, w, OH, OW, op, cp, relu);    \
                    if (grad && cp) { /* the scatter from the codes, a tight loop */              \
                        int keep = w->kh * w->kw <= 128 ? 0x7f : 0xff; /* (bit 7: a mask) */      \
                        for (int64_t oy = 0; oy < OH; oy++) {                                     \
                            int64_t ob = (oy * w->sh - w->ph) * W - w->pw; /* (0, 0) place */     \
                            const uint8_t *crow = cp + oy * OW;                                   \
                            const T *grow = gp + oy * OW;                                         \
                            for (int64_t ox = 0; ox < OW; ox++) {                                 \
                                int at = crow[ox];                                                \
                                T g = relu && !(at & 0x80) ? (T)0 : grow[ox]; /* where() */       \
                                op[ob + ox * w->sw + dpos[at & keep]] += g;                       \
                            }                                                                     \
                        }                                                                         \
                        fast = true;                                                              \
                    }                                                                             \
                    for (int64_t oy = 0; !fast && oy < OH; oy++)                                  \
                        for (int64_t ox = 0; ox < OW; ox++) {                                     \
                            T best = (T)0;                                                        \
                            int at = pool_argmax_##T(xp, xst, H, W, w, oy, ox, &best);            \
                            if (!grad && relu)                                                    \
                                at |= best > 0 ? 0x80 : 0, best = best <= 0 ? (T)0 : best;        \
                            if (!grad && cp)                                                      \
                                cp[oy * OW + ox] = (uint8_t)at;                                   \
                            if (!grad)                                                            \
                                op[oy * OW + ox] = best;                                          \
                            else                                                                  \
                                op[(oy * w->sh - w->ph) * W + ox * w->sw - w->pw +                \
                                   (at < 256 ? dpos[at] : at / w->kw * W + at % w->kw)] +=        \
                                    gp[oy * OW + ox];                                             \
                        }                                                                         \
                }                                                                                 \
                if (done)                                                                         \
                    done(ctx, n *C + c, op);                                                      \
            }                                                                                     \
    }
/* The AVX-512 rows where the CPU has them (float only); false: use the portable rows. */
static bool pool512(void) {
#ifdef HAVE_POOL512
    return __builtin_cpu_supports("avx512f");
#else
    return false;
#endif
}
bool loom__pool_codes_available(void) {
    return pool512();
}
bool loom__pool_codes_ok(const loom_window *w, int64_t row_stride, loom_dtype dt) {
    (void)row_stride, (void)dt;  /* (2x2 windows off the AVX-512 rows: by the general loops) */
    return w->kh * w->kw <= 256; /* a window's place in a byte */
}
bool loom__pool_relu_ok(const loom_window *w, int64_t row_stride) {
    return loom__pool2x2(w, row_stride) ? pool512() : w->kh * w->kw <= 128; /* (bit 7 free) */
}
/* A plane of max pooling over any window by pool_any_plane512; false: by the scalar loops. */
static bool pool_any_float(const float *x, const int64_t *xst, int64_t H, int64_t W,
                           const loom_window *w, int64_t OH, int64_t OW, float *o, uint8_t *codes,
                           bool relu) {
#ifdef HAVE_POOL512
    if (pool512() && w->kw <= 256 && W <= INT32_MAX / 4 && xst[3] * W <= INT32_MAX / 4) {
        pool_any_plane512(x, xst[2], xst[3], H, W, w, OH, OW, o, codes, relu);
        return true;
    }
#endif
    (void)x, (void)xst, (void)H, (void)W, (void)w, (void)OH, (void)OW, (void)o, (void)codes;
    (void)relu;
    return false;
}
static bool pool_any_double(const double *x, const int64_t *xst, int64_t H, int64_t W,
                            const loom_window *w, int64_t OH, int64_t OW, double *o, uint8_t *codes,
                            bool relu) {
    (void)x, (void)xst, (void)H, (void)W, (void)w, (void)OH, (void)OW, (void)o, (void)codes;
    (void)relu;
    return false;
}
/* Whole planes at once (pool2_planes512) where they are contiguous and small; false: by rows. */
static bool pool2_planes_float(const float *x, const int64_t *xs, const int64_t *xst,
                               const int64_t *ys, float *o, uint8_t *codes, bool relu) {
#ifdef HAVE_POOL512
    int64_t H = xs[2], W = xs[3], OH = ys[2], OW = ys[3];
    if (pool512() && OW < 16 && OH * OW <= POOL_PLANES_MAX && xst[3] == 1 && xst[2] == W &&
        xst[1] == H * W && xst[0] == xs[1] * H * W) {
        pool2_planes512(x, xs[0] * xs[1], H, W, OH, OW, o, codes, relu);
        return true;
    }
#endif
    (void)x, (void)xs, (void)xst, (void)ys, (void)o, (void)codes, (void)relu;
    return false;
}
static bool pool2_planes_double(const double *x, const int64_t *xs, const int64_t *xst,
                                const int64_t *ys, double *o, uint8_t *codes, bool relu) {
    (void)x, (void)xs, (void)xst, (void)ys, (void)o, (void)codes, (void)relu;
    return false;
}
static bool pool_gtab_init(pool_gtab *t, int64_t H, int64_t W, int64_t OH, int64_t OW) {
    if (!pool512() || OH * OW > 32 || H * W > 16 * 16)
        return false;
    t->groups = (H * W + 15) / 16, t->last = H * W - 16 * (t->groups - 1);
    for (int64_t e = 0; e < 16 * t->groups; e++) {
        int64_t iy = e / W, ix = e % W;
        bool in = e < H * W && iy < 2 * OH && ix < 2 * OW;
        t->win[e / 16][e % 16] = in ? (int32_t)(iy / 2 * OW + ix / 2) : 0;
        t->pos[e / 16][e % 16] = in ? (int32_t)(iy % 2 * 2 + ix % 2) : 7;
    }
    return true;
}

static void pool2_grad_plane_float(const pool_gtab *t, const float *gy, const uint8_t *codes,
                                   bool relu, float *o, int64_t per) {
#ifdef HAVE_POOL512
    pool2_grad_plane512(t, gy, codes, relu, o, per);
#else
    (void)t, (void)gy, (void)codes, (void)relu, (void)o, (void)per;
#endif
}
static void pool2_grad_plane_double(const pool_gtab *t, const double *gy, const uint8_t *codes,
                                    bool relu, double *o, int64_t per) {
    (void)t, (void)gy, (void)codes, (void)relu, (void)o, (void)per; /* never: float only */
}
static bool pool2_fast_float(const float *r0, const float *r1, int64_t ow, float *o, uint8_t *codes,
                             bool relu) {
#ifdef HAVE_POOL512
    if (pool512()) {
        pool2_row512(r0, r1, ow, o, codes, relu);
        return true;
    }
#endif
    (void)r0, (void)r1, (void)ow, (void)o, (void)codes, (void)relu;
    return false;
}
static bool pool2_grad_fast_float(const float *r0, const float *r1, int64_t ow, const float *gy,
                                  float *o0, float *o1, const uint8_t *codes, bool relu) {
#ifdef HAVE_POOL512
    if (pool512()) {
        pool2_grad_row512(r0, r1, ow, gy, o0, o1, codes, relu);
        return true;
    }
#endif
    (void)r0, (void)r1, (void)ow, (void)gy, (void)o0, (void)o1, (void)codes, (void)relu;
    return false;
}
static bool pool2_fast_double(const double *r0, const double *r1, int64_t ow, double *o,
                              uint8_t *codes, bool relu) {
    (void)r0, (void)r1, (void)ow, (void)o, (void)codes, (void)relu;
    return false;
}
static bool pool2_grad_fast_double(const double *r0, const double *r1, int64_t ow, const double *gy,
                                   double *o0, double *o1, const uint8_t *codes, bool relu) {
    (void)r0, (void)r1, (void)ow, (void)gy, (void)o0, (void)o1, (void)codes, (void)relu;
    return false;
}
POOL_KERNELS(float, uint32_t)
POOL_KERNELS(double, uint64_t)

/* ---- a pool gradient's sinks by windows (loom__pnode.quad) -------------------------------------
 * The rows of a 2 x 2 pool gradient whose windows tile its planes are zero but at each window's
 * argmax, so the sinks take the windows instead, in the order (place in the window, window): the
 * sum of a row is the sum of its windows' gradients, and its product with an unfold's
 * B(k = (n, y, x), j = (c, kh, kw)) = x[n, c, y + kh, x + kw] is, for each place (a, b) in the
 * window, the windows' gradients (kept where the code names that place, +0 elsewhere) times the
 * image subsampled at (2 oy + a + kh, 2 ox + b + kw): one of (KH + 1)(KW + 1) images per input
 * channel, made once, 16 windows of each image side by side. The rows are never made; every
 * product of theirs is one of these (zeros included), summed in another fixed order (runs
 * repeat bitwise, both backends alike). */
#define QUAD_IMGS 16 /* images a channel at most: (KH + 1)(KW + 1) for 3 x 3 */
typedef struct {
    const float *dy, *S;
    const uint8_t *codes;
    int64_t d0, d1, planes, OP, chunks; /* dy's planes: a row's and the next along it; windows a
                                         * plane, and 16 of them a chunk */
    bool relu;
} quad_run;

static bool quad_plan(const loom__program *p, int32_t id, int32_t *sum, int32_t *dot) {
    const loom__pnode *t = &p->nodes[id];
    if (t->op != LOOM_OP_POOLGRAD || t->dtype != LOOM_F32 || t->codes_of < 0 || t->epi >= 0 ||
        !t->nsinks || t->keep || !pool512() || !loom__pool2x2(&t->attr.win, 1))
        return false;
    const loom__pnode *d = &p->nodes[t->relu_dy >= 0 ? t->relu_dy : t->src[1]];
    int64_t H = t->shape[2], W = t->shape[3], OH = d->shape[2], OW = d->shape[3];
    const loom__pnode *r = &p->nodes[t->stream];
    if (H != 2 * OH || W != 2 * OW || OW > 16 || d->lay.stride[3] != 1 || d->lay.stride[2] != OW ||
        r->shape[0] != t->shape[0] || r->shape[1] != t->shape[1] * H * W)
        return false;
    *sum = *dot = -1;
    for (int q = 0; q < t->nsinks; q++) {
        const loom__pnode *k = &p->nodes[t->sinks[q]];
        if (k->op == LOOM_OP_SUM && *sum < 0) {
            *sum = t->sinks[q];
            continue;
        }
        loom__gdim br, bc;
        loom__operand_dims(&p->nodes[k->src[1]], &br, &bc);
        if (k->op != LOOM_OP_MATMUL || *dot >= 0 || br.n != 3 || bc.n != 3 ||
            br.size[0] != t->shape[1] || br.size[1] != H || br.size[2] != W ||
            br.stride[1] != bc.stride[1] || br.stride[2] != bc.stride[2] || bc.size[1] != 3 ||
            bc.size[2] != 3) /* (the kernel's window: 3 x 3) */
            return false;
        *dot = t->sinks[q];
    }
    return true;
}

bool loom__pool_quad_ok(const loom__program *p, int32_t id) {
    int32_t sum, dot;
    return quad_plan(p, id, &sum, &dot);
}

/* A channel's images: planes x chunks x QUAD_IMGS x 16 floats. */
static int64_t quad_image_floats(const loom__program *p, int32_t id) {
    const loom__pnode *t = &p->nodes[id];
    return t->shape[1] * ((t->shape[2] * t->shape[3] / 4 + 15) / 16) * QUAD_IMGS * 16;
}

size_t loom__pool_quad_bytes(const loom__program *p, int32_t id) {
    int32_t sum = -1, dot = -1;
    quad_plan(p, id, &sum, &dot);
    int64_t C = 1;
    if (dot >= 0) {
        loom__gdim br, bc;
        loom__operand_dims(&p->nodes[p->nodes[dot].src[1]], &br, &bc);
        C = bc.size[0];
    }
    const loom__pnode *t = &p->nodes[id]; /* and a plane of an image (quad_images) */
    return sizeof(float) *
               (size_t)(C * quad_image_floats(p, id) + t->shape[2] * t->shape[3] / 4 + 16) +
           64;
}

#ifdef HAVE_POOL512
/* Input channel c's images (a', b') = x[n, c, 2 oy + a', 2 ox + b'] for a', b' in 0..3 (strides of
 * the unfold's B: rows (n, y, x), columns (c, kh, kw)), each plane's windows 16 a chunk: image i
 * of chunk q of plane n at S + ((n chunks + q) QUAD_IMGS + i) 16, zeros past the windows. A
 * plane of each image at a time through tmp (QUAD_IMGS planes of OH x OW, zeros to the chunk),
 * all of them written before any is read back (a load of what masked stores just wrote waits). */
__attribute__((target("avx512f"))) static void quad_images(float *S, float *tmp, const float *x,
                                                           const loom__gdim *br, int64_t sc,
                                                           int64_t OH, int64_t OW, int64_t chunks) {
    int64_t sy = br->stride[1], sx = br->stride[2], cp = 16 * chunks;
    __m512i ie = _mm512_loadu_si512(pool_even);
    __mmask16 lo = (__mmask16)(2 * OW - 1 >= 16 ? 0xffff : (1u << (2 * OW - 1)) - 1);
    __mmask16 hi = (__mmask16)(2 * OW - 1 <= 16 ? 0 : (1u << (2 * OW - 1 - 16)) - 1);
    __mmask16 mo = (__mmask16)((1u << OW) - 1);
    memset(tmp, 0, sizeof(float) * (size_t)(QUAD_IMGS * cp)); /* (the rows leave the pads) */
    for (int64_t n = 0; n < br->size[0]; n++) {
        for (int i = 0; i < QUAD_IMGS; i++) {
            float *t = tmp + i * cp;
            /* rows i, i + 16, ... of the next image: its first reads miss otherwise */
            for (int64_t y = i; sx == 1 && y < 2 * OH + 2; y += QUAD_IMGS)
                for (int64_t o = 0; o < 2 * OW + 2; o += 16)
                    _mm_prefetch((const char *)(x + (n + 1) * br->stride[0] + sc + y * sy + o),
                                 _MM_HINT_T0);
            for (int64_t oy = 0; oy < OH; oy++) {
                const float *r = x + n * br->stride[0] + sc + (2 * oy + i / 4) * sy + i % 4 * sx;
                if (sx == 1) { /* the even ones of 2 OW - 1 floats (nothing read past) */
                    __m512 v0 = _mm512_maskz_loadu_ps(lo, r),
                           v1 = _mm512_maskz_loadu_ps(hi, r + 16);
                    _mm512_mask_storeu_ps(t + oy * OW, mo, _mm512_permutex2var_ps(v0, ie, v1));
                } else {
                    for (int64_t ox = 0; ox < OW; ox++)
                        t[oy * OW + ox] = r[2 * ox * sx];
                }
            }
        }
        for (int64_t q = 0; q < chunks; q++)
            for (int i = 0; i < QUAD_IMGS; i++)
                _mm512_store_ps(S + ((n * chunks + q) * QUAD_IMGS + i) * 16,
                                _mm512_loadu_ps(tmp + i * cp + 16 * q));
    }
}

/* Two rows (channels c and c + dc) against a 3 x 3 kernel's nine columns of one input channel:
 * every window's gradient, masked to its code's place (a, b) and to the ReLU's, times image
 * (a + kh, b + kw); 16 lanes per element; the sums of the windows' gradients too. */
__attribute__((target("avx512f"))) static void quad_tile(const quad_run *s, int64_t c, int64_t dc,
                                                         float *dot, float *sum) {
    __m512 acc[2][9], bs[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
#    pragma GCC unroll 2
    for (int i = 0; i < 2; i++)
#    pragma GCC unroll 9
        for (int j = 0; j < 9; j++)
            acc[i][j] = _mm512_setzero_ps();
    const float *g0 = s->dy + c * s->d0, *g1 = s->dy + (c + dc) * s->d0;
    const uint8_t *k0 = s->codes + c * s->planes * s->OP;
    const uint8_t *k1 = s->codes + (c + dc) * s->planes * s->OP;
    const float *sp = s->S;
    for (int64_t n = 0; n < s->planes; n++)
        for (int64_t w = 0; w < s->OP; w += 16, sp += QUAD_IMGS * 16) {
            __mmask16 m = (__mmask16)(s->OP - w >= 16 ? 0xffff : (1u << (s->OP - w)) - 1);
            __m512 a0 = _mm512_maskz_loadu_ps(m, g0 + n * s->d1 + w);
            __m512 a1 = _mm512_maskz_loadu_ps(m, g1 + n * s->d1 + w);
            /* the planes two on (a row's planes lie far apart: no hardware prefetch) */
            _mm_prefetch((const char *)(g0 + (n + 2) * s->d1 + w), _MM_HINT_T0);
            _mm_prefetch((const char *)(g1 + (n + 2) * s->d1 + w), _MM_HINT_T0);
            /* 16 codes: past a plane's last, within the 16 the buffer spares */
            __m512i q0 =
                _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(k0 + n * s->OP + w)));
            __m512i q1 =
                _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(k1 + n * s->OP + w)));
            if (s->relu) {
                a0 = _mm512_maskz_mov_ps(_mm512_test_epi32_mask(q0, _mm512_set1_epi32(4)), a0);
                a1 = _mm512_maskz_mov_ps(_mm512_test_epi32_mask(q1, _mm512_set1_epi32(4)), a1);
            }
            bs[0] = _mm512_add_ps(bs[0], a0), bs[1] = _mm512_add_ps(bs[1], a1);
            q0 = _mm512_and_si512(q0, _mm512_set1_epi32(3));
            q1 = _mm512_and_si512(q1, _mm512_set1_epi32(3));
            __m512 p0[4], p1[4]; /* the gradients at each place */
#    pragma GCC unroll 4
            for (int q = 0; q < 4; q++) {
                p0[q] = _mm512_maskz_mov_ps(_mm512_cmpeq_epi32_mask(q0, _mm512_set1_epi32(q)), a0);
                p1[q] = _mm512_maskz_mov_ps(_mm512_cmpeq_epi32_mask(q1, _mm512_set1_epi32(q)), a1);
            }
#    pragma GCC unroll 16
            for (int i = 0; i < QUAD_IMGS;
                 i++) { /* image (a', b'): places (a, b), taps (a' - a, b' - b) */
                __m512 v = _mm512_load_ps(sp + 16 * i);
#    pragma GCC unroll 4
                for (int q = 0; q < 4; q++) {
                    int kh = i / 4 - q / 2, kw = i % 4 - q % 2;
                    if (kh < 0 || kh > 2 || kw < 0 || kw > 2)
                        continue;
                    acc[0][kh * 3 + kw] = _mm512_fmadd_ps(p0[q], v, acc[0][kh * 3 + kw]);
                    acc[1][kh * 3 + kw] = _mm512_fmadd_ps(p1[q], v, acc[1][kh * 3 + kw]);
                }
            }
        }
#    pragma GCC unroll 2
    for (int i = 0; i < 2; i++) {
        _mm512_storeu_ps(sum + 16 * i, bs[i]);
#    pragma GCC unroll 9
        for (int j = 0; j < 9; j++)
            _mm512_storeu_ps(dot + 16 * (i * 9 + j), acc[i][j]);
    }
}
#endif

/* red_lanes_SUM_f32's tree over 16 lanes. */
static float lanes_tree(float *l) {
    for (int w = RED_LANES / 2; w >= 1; w /= 2)
        for (int j = 0; j < w; j++)
            l[j] += l[j + w];
    return l[0];
}

static loom_status pool_quad(const loom__program *p, const loom__bind *b, int32_t id) {
#ifdef HAVE_POOL512
    const loom__pnode *t = &p->nodes[id];
    int32_t sum = -1, dot = -1;
    quad_plan(p, id, &sum, &dot);
    int32_t dn = t->relu_dy >= 0 ? t->relu_dy : t->src[1];
    const loom__pnode *d = &p->nodes[dn];
    int64_t OP = d->shape[2] * d->shape[3], chunks = (OP + 15) / 16;
    quad_run s = {.dy = loom__addr(p, b, dn),
                  .codes = loom__pool_codes(p, b, t->codes_of),
                  .d0 = d->lay.stride[0],
                  .d1 = d->lay.stride[1],
                  .planes = t->shape[1],
                  .OP = OP,
                  .chunks = chunks,
                  .relu = t->relu >= 0 || t->relu_dy >= 0};
    float *S = (float *)(((uintptr_t)(b->ws + t->ws_off) + 63) & ~(uintptr_t)63);
    loom__gdim br = {0}, bc = {0};
    int64_t C = 1, per = quad_image_floats(p, id);
    const float *x = NULL;
    if (dot >= 0) {
        loom__operand_dims(&p->nodes[p->nodes[dot].src[1]], &br, &bc);
        x = loom__addr(p, b, p->nodes[dot].src[1]), C = bc.size[0];
        for (int64_t ci = 0; ci < C; ci++)
            quad_images(S + ci * per, S + C * per, x, &br, ci * bc.stride[0], d->shape[2],
                        d->shape[3], chunks);
    } else { /* a sum alone: images of zeros, products not stored */
        memset(S, 0, sizeof(float) * (size_t)per);
    }
    float *so = sum >= 0 ? loom__addr(p, b, sum) : NULL;
    float *po = dot >= 0 ? loom__addr(p, b, dot) : NULL;
    float lanes[2 * 16 * 9], bl[2 * 16];
    for (int64_t c = 0; c < t->shape[0]; c += 2) {
        int64_t dc = c + 1 < t->shape[0] ? 1 : 0; /* a last row alone: itself again */
        for (int64_t ci = 0; ci < C; ci++) {
            s.S = S + ci * per;
            quad_tile(&s, c, dc, lanes, bl);
            for (int64_t i = 0; i <= dc; i++) {
                if (so && ci == 0)
                    so[c + i] = lanes_tree(bl + 16 * i);
                for (int64_t j = 0; po && j < 9; j++)
                    po[(c + i) * 9 * C + ci * 9 + j] = lanes_tree(lanes + 16 * (i * 9 + j));
            }
        }
    }
    return LOOM_OK;
#else
    (void)p, (void)b, (void)id;
    return LOOM_OK;
#endif
}

static loom_status pool_kernel(const loom__program *p, const loom__bind *b, int32_t id, bool grad) {
    const loom__pnode *t = &p->nodes[id], *x = &p->nodes[t->src[0]];
    int32_t dn = t->relu_dy >= 0 ? t->relu_dy : t->src[1]; /* the gradient read */
    const loom__pnode *y = grad ? &p->nodes[dn] : t;
    const void *dy = NULL;
    int64_t dyst[MAXD] = {0};
    if (grad) { /* planes of dy contiguous, any order (else made contiguous in the scratch) */
        const loom__pnode *d = &p->nodes[dn];
        contiguous_strides(4, d->shape, dyst);
        dy = loom__addr(p, b, dn);
        if (d->lay.stride[3] == 1 && d->lay.stride[2] == d->shape[3])
            memcpy(dyst, d->lay.stride, sizeof(int64_t) * 4);
        else {
            int64_t own =
                loom__pool_by_plane(t) ? t->shape[2] * t->shape[3] : loom__numel(4, t->shape);
            void *tmp = b->ws + t->ws_off + (size_t)own * loom__dtype_size((loom_dtype)t->dtype);
            strided_copy(tmp, dy, &d->lay, 4, d->shape, loom__dtype_size((loom_dtype)t->dtype));
            dy = tmp;
        }
    }
    const void *xv = loom__addr(p, b, t->src[0]);
    void *o = loom__addr(p, b, id);
    epilogue e = {0};
    if (t->epi >= 0 || t->nsinks) { /* a plane at a time, each then through the epilogue */
        epilogue_init(&e, p, b, id);
        e.plane = t->shape[2] * t->shape[3];
        o = b->ws + t->ws_off;
    }
    uint8_t *codes = t->codes           ? loom__pool_codes(p, b, id)
                     : t->codes_of >= 0 ? loom__pool_codes(p, b, t->codes_of)
                                        : NULL;
    if (t->relu >= 0) /* the ReLU's output, not its own */
        o = loom__addr(p, b, t->relu);
    if (t->dtype == LOOM_F64)
        pool_double(&t->attr.win, x->shape, x->lay.stride, y->shape, xv, dy, dyst, o, grad, codes,
                    false, NULL, NULL, NULL);
    else
        pool_float(&t->attr.win, x->shape, x->lay.stride, y->shape, xv, dy, dyst, o, grad, codes,
                   t->relu >= 0 || t->relu_dy >= 0, t->epi >= 0 || t->nsinks ? plane_done : NULL,
                   t->epi < 0 && t->nsinks && e.cols % e.plane == 0 ? plane_place : NULL, &e);
    return LOOM_OK;
}

/* A max pooling computing its product (loom__pnode.conv): the product's epilogue (or NULL) with
 * its operands (args[0]: root, where it writes), the argmax codes it keeps (or NULL) and where
 * its values go (its ReLU's buffer when it computes that). */
typedef struct {
    const loom__fused *k;
    void *args[LOOM_FUSED_MAX_ARGS];
    uint8_t *codes;
    float *o;
} pool_out;

static void pool_out_init(pool_out *po, const loom__program *p, const loom__bind *b, int32_t id,
                          float *root) {
    const loom__pnode *t = &p->nodes[id], *m = &p->nodes[t->conv];
    po->k = m->epi >= 0 ? &p->fused[m->epi] : NULL;
    po->args[0] = root;
    for (int a = 1; po->k && a < po->k->nargs; a++)
        po->args[a] = a == po->k->epi_arg ? NULL : loom__addr(p, b, po->k->args[a]);
    po->codes = t->codes ? loom__pool_codes(p, b, id) : NULL;
    po->o = loom__addr(p, b, t->relu >= 0 ? t->relu : id);
}

/* ---- a pooling computing its convolution by windows ------------------------------------------
 * A 3 x 3 convolution of stride 1 whose 2 x 2 pooling tiles its output planes is made by windows:
 * the output at place (a, b) of window (oy, ox) is the sum over taps of w[c, ci, kh, kw] times
 * image (ci, a + kh, b + kw) of quad_images at (oy, ox), so 16 windows of all four places come
 * from 16 aligned loads shared by four channels, and the pooling is four vectors' maximum (no
 * shuffles, no gathers). Each output is the same chain of FMAs from zero, taps ascending, as
 * loom__conv_planes_run's, and the maximum the same rule: the same bits. The epilogue runs on a
 * plane of values in window order, so its other operands must not vary along the columns. */
typedef struct {
    int64_t Cin, OH, OW, chunks, N;
    loom__gdim br; /* the unfold's rows (n, y, x), for quad_images */
    int64_t sc;    /* its input channels' stride */
} conv_quad;

/* Whether epilogue k's operands (but the product's) are the same all along a row. */
static bool epilogue_by_rows(const loom__program *p, const loom__fused *k) {
    const loom__pnode *root = &p->nodes[k->root];
    for (int a = 1; a < k->nargs; a++) {
        const loom__pnode *l = &p->nodes[k->args[a]];
        bool one = loom__numel(l->ndim, l->shape) == 1;
        bool col = l->ndim == 2 && l->shape[0] == root->shape[0] &&
                   (l->shape[1] == 1 || l->lay.stride[1] == 0);
        if (a != k->epi_arg && !one && !col)
            return false;
    }
    return true;
}

static bool conv_quad_of(const loom__program *p, int32_t id, conv_quad *q) {
    const loom__pnode *t = &p->nodes[id], *x = &p->nodes[t->src[0]], *m = &p->nodes[t->conv];
    loom__gdim br, bc;
    loom__operand_dims(&p->nodes[m->src[1]], &bc, &br); /* B: rows (ci, kh, kw), cols (n, y, x) */
    int64_t OH = t->shape[2], OW = t->shape[3];
    if (!pool512() || !loom__pool2x2(&t->attr.win, 1) || bc.n != 3 || br.n != 3 ||
        bc.size[1] != 3 || bc.size[2] != 3 || bc.size[0] * 9 > LOOM_CONV_MAX_K ||
        br.size[1] != 2 * OH || br.size[2] != 2 * OW || x->shape[2] != 2 * OH ||
        x->shape[3] != 2 * OW || OW > 16 || br.stride[1] != bc.stride[1] ||
        br.stride[2] != bc.stride[2] || (m->epi >= 0 && !epilogue_by_rows(p, &p->fused[m->epi])))
        return false;
    *q = (conv_quad){.Cin = bc.size[0],
                     .OH = OH,
                     .OW = OW,
                     .chunks = (OH * OW + 15) / 16,
                     .N = br.size[0],
                     .br = br,
                     .sc = bc.stride[0]};
    q->br.size[0] = 1; /* (one image at a time) */
    return true;
}

/* Floats of a pooling's scratch by windows: the images of one input image, a plane of each (for
 * quad_images), four channels' products and their epilogue's, all by windows. */
static int64_t conv_quad_floats(const conv_quad *q) {
    return 16 * q->chunks * (q->Cin * QUAD_IMGS + QUAD_IMGS + 4 * 4 + 4 * 4);
}

/* ---- a pooling computing a convolution that runs by its transpose, by windows ----------------
 * a convolution's forward inside its 2 x 2 pooling: the product's columns are taken in window order
 * (per image, the four places of the pooling windows, each over all windows) through
 * loom__gemm_t_cols, a few images at a time, so the positions no window covers (an odd plane's last
 * row and column) are never computed and the pooling is four vectors' maximum. Each value is the
 * product's own (the same k blocks and order), its epilogue the same function on the same value
 * (its other operands constant along a row): the same bits as the product, its epilogue and the
 * pooling run one after the other. */
typedef struct {
    int64_t N, PP, G; /* images, windows an image, images a block */
    int64_t sn, sy, sx;
} conv_t;

static bool conv_t_of(const loom__program *p, int32_t id, conv_t *q) {
    const loom__pnode *t = &p->nodes[id], *x = &p->nodes[t->src[0]], *m = &p->nodes[t->conv];
    loom__gmat ga = {NULL, {0}, {0}}, gb = {NULL, {0}, {0}};
    loom__operand_dims(&p->nodes[m->src[0]], &ga.row, &ga.col);
    loom__operand_dims(&p->nodes[m->src[1]], &gb.row, &gb.col);
    int64_t PH = t->shape[2], PW = t->shape[3], PP = PH * PW;
    if (!pool512() || !loom__pool2x2(&t->attr.win, 1) || gb.col.n != 3 ||
        gb.col.size[1] != x->shape[2] || gb.col.size[2] != x->shape[3] || PP < 1 ||
        4 * PP > LOOM_GEMM_NC ||
        !loom__gemm_t_ok(m->shape[0], m->shape[1], loom__numel(ga.col.n, ga.col.size), &ga, &gb) ||
        (m->epi >= 0 && !epilogue_by_rows(p, &p->fused[m->epi])))
        return false;
    *q = (conv_t){.N = gb.col.size[0],
                  .PP = PP,
                  .G = LOOM_GEMM_NC / (4 * PP),
                  .sn = gb.col.stride[0],
                  .sy = gb.col.stride[1],
                  .sx = gb.col.stride[2]};
    return true;
}

/* Bytes of its scratch: the columns' offsets, a block of the product and of its epilogue (each
 * with 16 floats to spare: a window chunk's loads run past the last place). */
static size_t conv_t_bytes(const loom__program *p, int32_t id, const conv_t *q) {
    int64_t cols = q->G * 4 * q->PP, M = p->nodes[p->nodes[id].conv].shape[0];
    return sizeof(int64_t) * (size_t)cols + 2 * sizeof(float) * (size_t)(M * cols + 16) + 128;
}

size_t loom__pool_conv_bytes(const loom__program *p, int32_t f) {
    int64_t plane = p->nodes[p->nodes[f].src[0]].lay.stride[1];
    size_t rows = 64 + (LOOM_CONV_ROWS + 1) * (size_t)(plane + 16) * sizeof(float) +
                  loom__conv_planes_bytes(plane);
    conv_quad q;
    conv_t ct;
    size_t quad = conv_quad_of(p, f, &q) ? 64 + sizeof(float) * (size_t)conv_quad_floats(&q) : 0;
    size_t cols = conv_t_of(p, f, &ct) ? conv_t_bytes(p, f, &ct) : 0;
    size_t most = quad > rows ? quad : rows;
    return cols > most ? cols : most;
}

bool loom__pool_conv_t_ok(const loom__program *p, int32_t f) {
    conv_t q;
    return conv_t_of(p, f, &q);
}

#ifdef HAVE_POOL512
/* Four channels (rows a[r] of A) of image S's windows, chunk by chunk: out + (r 4 + place) cp. */
__attribute__((target("avx512f"))) static void conv_quad_rows(const float *const *a, int64_t acs,
                                                              int64_t Cin, const float *S,
                                                              int64_t chunks, float *out,
                                                              int64_t cp) {
    for (int64_t ch = 0; ch < chunks; ch++) {
        __m512 acc[4][4];
#    pragma GCC unroll 4
        for (int r = 0; r < 4; r++)
#    pragma GCC unroll 4
            for (int pl = 0; pl < 4; pl++)
                acc[r][pl] = _mm512_setzero_ps();
        for (int64_t ci = 0; ci < Cin; ci++) {
            const float *sp = S + (ci * chunks + ch) * QUAD_IMGS * 16;
#    pragma GCC unroll 9
            for (int k = 0; k < 9; k++) { /* taps ascending: (ci, kh, kw) */
                int kh = k / 3, kw = k % 3;
                int64_t at = (ci * 9 + k) * acs;
                __m512 w[4] = {_mm512_set1_ps(a[0][at]), _mm512_set1_ps(a[1][at]),
                               _mm512_set1_ps(a[2][at]), _mm512_set1_ps(a[3][at])};
#    pragma GCC unroll 4
                for (int pl = 0; pl < 4; pl++) {
                    __m512 v = _mm512_load_ps(sp + ((pl / 2 + kh) * 4 + pl % 2 + kw) * 16);
#    pragma GCC unroll 4
                    for (int r = 0; r < 4; r++)
                        acc[r][pl] = _mm512_fmadd_ps(w[r], v, acc[r][pl]);
                }
            }
        }
#    pragma GCC unroll 4
        for (int r = 0; r < 4; r++)
#    pragma GCC unroll 4
            for (int pl = 0; pl < 4; pl++)
                _mm512_store_ps(out + (r * 4 + pl) * cp + 16 * ch, acc[r][pl]);
    }
}

/* The pooling of one channel's plane by windows: place pl's values at v + pl cp (the last
 * chunk's loads run up to 15 floats past a place). */
__attribute__((target("avx512f"))) static void
pool_quad_plane(const float *v, int64_t cp, int64_t OP, bool relu, float *o, uint8_t *codes) {
    for (int64_t w = 0; w < OP; w += 16) {
        __mmask16 mn = (__mmask16)(OP - w >= 16 ? 0xffff : (1u << (OP - w)) - 1);
        pool_windows(_mm512_loadu_ps(v + w), _mm512_loadu_ps(v + cp + w),
                     _mm512_loadu_ps(v + 2 * cp + w), _mm512_loadu_ps(v + 3 * cp + w), mn, relu,
                     o + w, codes ? codes + w : NULL);
    }
}

static loom_status pool_conv_quad(const loom__program *p, const loom__bind *b, int32_t id,
                                  const conv_quad *q) {
    const loom__pnode *t = &p->nodes[id], *m = &p->nodes[t->conv];
    loom__gmat ga, gb;
    product_operands(p, b, t->conv, &ga, &gb);
    int64_t cp = 16 * q->chunks, OP = q->OH * q->OW, O = m->shape[0];
    float *S = (float *)(((uintptr_t)(b->ws + m->ws_off) + 63) & ~(uintptr_t)63);
    float *tmp = S + q->Cin * QUAD_IMGS * cp, *prod = tmp + QUAD_IMGS * cp, *root = prod + 16 * cp;
    pool_out po;
    pool_out_init(&po, p, b, id, root);
    for (int64_t n = 0; n < q->N; n++) {
        for (int64_t ci = 0; ci < q->Cin; ci++)
            quad_images(S + ci * QUAD_IMGS * cp, tmp, gb.p + n * gb.col.stride[0], &q->br,
                        ci * q->sc, q->OH, q->OW, q->chunks);
        for (int64_t c = 0; c < O; c += 4) {
            int64_t rows = O - c < 4 ? O - c : 4;
            const float *a[4]; /* a missing channel computes the last one again, not kept */
            for (int64_t r = 0; r < 4; r++)
                a[r] = ga.p + (c + (r < rows ? r : rows - 1)) * ga.row.stride[0];
            conv_quad_rows(a, ga.col.stride[0], q->Cin, S, q->chunks, prod, cp);
            /* the epilogue on each channel (its operands the same along the row: columns 0..
             * will do), then the poolings (their loads well after the epilogue's stores) */
            for (int64_t r = 0; po.k && r < rows; r++)
                po.args[0] = root + r * 4 * cp,
                po.k->part(po.args, c + r, 0, 4 * cp, prod + r * 4 * cp);
            for (int64_t r = 0; r < rows; r++) {
                int64_t pl = (c + r) * q->N + n;
                pool_quad_plane((po.k ? root : prod) + r * 4 * cp, cp, OP, t->relu >= 0,
                                po.o + pl * OP, po.codes ? po.codes + pl * OP : NULL);
            }
        }
    }
    return LOOM_OK;
}
#endif

/* A max pooling computing its input (loom__pnode.conv): each plane of the product made from the
 * image, through the product's epilogue (conv bias), then pooled (with its ReLU and codes) while
 * it is in L1; the product's output is never written. The same values as the product, its
 * epilogue and the pooling run one after the other. */
#ifdef HAVE_POOL512
static loom_status pool_conv_t(const loom__program *p, const loom__bind *b, int32_t id,
                               const conv_t *q) {
    const loom__pnode *t = &p->nodes[id], *m = &p->nodes[t->conv];
    loom__gmat ga, gb;
    int64_t K = product_operands(p, b, t->conv, &ga, &gb), M = m->shape[0];
    int64_t PP = q->PP, PW = t->shape[3], cols = q->G * 4 * PP;
    int64_t *coff = (int64_t *)(((uintptr_t)(b->ws + m->ws_off) + 63) & ~(uintptr_t)63);
    float *prod = (float *)(coff + cols), *root = prod + M * cols + 16;
    for (int64_t j = 0; j < q->G; j++) /* image j of a block: place (a, b) of each window */
        for (int64_t pl = 0; pl < 4; pl++)
            for (int64_t w = 0; w < PP; w++)
                coff[(j * 4 + pl) * PP + w] =
                    j * q->sn + (2 * (w / PW) + pl / 2) * q->sy + (2 * (w % PW) + pl % 2) * q->sx;
    pool_out po;
    pool_out_init(&po, p, b, id, root);
    const float *b0 = gb.p;
    for (int64_t n0 = 0; n0 < q->N; n0 += q->G) {
        int64_t g = q->N - n0 < q->G ? q->N - n0 : q->G;
        gb.p = b0 + n0 * q->sn;
        loom__gemm_t_cols(M, K, &ga, &gb, coff, g * 4 * PP, prod, cols, n0 > 0, b->ws + p->scratch);
        /* the epilogue on every row (its operands the same along a row: columns 0.. will do),
         * then the poolings (their loads well after the epilogue's stores) */
        for (int64_t r = 0; po.k && r < M; r++)
            po.args[0] = root + r * cols, po.k->part(po.args, r, 0, g * 4 * PP, prod + r * cols);
        for (int64_t r = 0; r < M; r++)
            for (int64_t j = 0; j < g; j++) {
                int64_t pl = r * q->N + n0 + j;
                pool_quad_plane((po.k ? root : prod) + r * cols + j * 4 * PP, PP, PP, t->relu >= 0,
                                po.o + pl * PP, po.codes ? po.codes + pl * PP : NULL);
            }
    }
    return LOOM_OK;
}
#endif

static loom_status pool_conv(const loom__program *p, const loom__bind *b, int32_t id) {
#ifdef HAVE_POOL512
    conv_quad cq;
    if (conv_quad_of(p, id, &cq))
        return pool_conv_quad(p, b, id, &cq);
    conv_t ct;
    if (conv_t_of(p, id, &ct))
        return pool_conv_t(p, b, id, &ct);
#endif
    const loom__pnode *t = &p->nodes[id], *x = &p->nodes[t->src[0]], *m = &p->nodes[t->conv];
    loom__gmat ga, gb;
    int64_t K = product_operands(p, b, t->conv, &ga, &gb), P = x->lay.stride[1];
    int64_t per_row = m->shape[1] / P, OP = t->shape[2] * t->shape[3];
    float *prod = (float *)(((uintptr_t)(b->ws + m->ws_off) + 63) & ~(uintptr_t)63);
    int64_t pitch = (P + 15) / 16 * 16; /* LOOM_CONV_ROWS planes of the product, one of the root */
    float *root = prod + LOOM_CONV_ROWS * pitch;
    loom__conv_planes cp;
    loom__conv_planes_begin(&cp, &ga, &gb, K, P, root + pitch);
    pool_out po;
    pool_out_init(&po, p, b, id, root);
    /* one plane as an image of its own; its strides leave the pooling's prefetch off */
    int64_t xs[4] = {1, 1, x->shape[2], x->shape[3]}, xst[4] = {0, 0, x->shape[3], 1};
    int64_t ys[4] = {1, 1, t->shape[2], t->shape[3]};
    for (int64_t i0 = 0; i0 < x->shape[0]; i0 += LOOM_CONV_ROWS) /* rows of the product */
        for (int64_t q = 0; q < per_row; q++) {
            int rows = (int)(x->shape[0] - i0 < LOOM_CONV_ROWS ? x->shape[0] - i0 : LOOM_CONV_ROWS);
            loom__conv_planes_run(&cp, i0, rows, q, prod, pitch);
            for (int r = 0; r < rows; r++) {
                int64_t pl = (i0 + r) * per_row + q;
                if (po.k)
                    po.k->part(po.args, i0 + r, q * P, (q + 1) * P, prod + r * pitch);
                pool_float(&t->attr.win, xs, xst, ys, po.k ? root : prod + r * pitch, NULL, NULL,
                           po.o + pl * OP, false, po.codes ? po.codes + pl * OP : NULL,
                           t->relu >= 0, NULL, NULL, NULL);
            }
        }
    return LOOM_OK;
}

bool loom__pool_grad_by_codes(int64_t H, int64_t W, int64_t OH, int64_t OW) {
    pool_gtab t;
    return pool_gtab_init(&t, H, W, OH, OW);
}

/* Elements x[0 .. len) added into RED_LANES lanes as red_lanes_SUM_f32 adds them (x[k] into lane
 * k % RED_LANES), 16 at a time where the CPU has AVX-512. */
#ifdef HAVE_POOL512
__attribute__((target("avx512f")))
#endif
static void
sum_lanes(float *lane, const float *x, int64_t len) {
    int64_t k = 0;
#ifdef HAVE_POOL512
    _Static_assert(RED_LANES == 16, "a vector of lanes");
    __m512 l = _mm512_loadu_ps(lane);
    for (; k + 16 <= len; k += 16)
        l = _mm512_add_ps(l, _mm512_loadu_ps(x + k));
    _mm512_storeu_ps(lane, l);
#endif
    for (; k + RED_LANES <= len; k += RED_LANES)
        for (int j = 0; j < RED_LANES; j++)
            lane[j] += x[k + j];
    for (int j = 0; k + j < len; j++)
        lane[j] += x[k + j];
}

/* A fold computing its convolution's backward from a pool gradient (loom__pnode.back): the fold's
 * product A, the weight gradient's B (an unfold), and the room made on either side of a row (a
 * plane: planes straddle the runs). */
typedef struct {
    const loom__pnode *fold, *prod, *pg, *w;
    loom__gmat a, b;
    int64_t K, pad;
} back_plan;

static back_plan back_plan_of(const loom__program *p, int32_t f) {
    back_plan q = {.fold = &p->nodes[f], .pg = &p->nodes[p->nodes[f].back]};
    q.prod = &p->nodes[p->nodes[q.fold->src[0]].src[0]], q.w = &p->nodes[q.fold->back_w];
    loom__operand_dims(&p->nodes[q.prod->src[0]], &q.a.row, &q.a.col);
    loom__operand_dims(&p->nodes[q.w->src[1]], &q.b.row, &q.b.col);
    q.K = loom__numel(q.a.col.n, q.a.col.size);
    q.pad = (q.pg->shape[2] * q.pg->shape[3] + 15) / 16 * 16;
    return q;
}

size_t loom__fold_back_bytes(const loom__program *p, int32_t f) {
    back_plan q = back_plan_of(p, f);
    return sizeof(float) * (size_t)(q.K * RED_LANES) +
           loom__conv_back_bytes(q.prod->shape[1], q.K, q.w->shape[1], q.pad);
}

/* The pool gradient's rows (a row per channel, its planes one after another) made from the
 * argmax codes, and summed into the lanes of red_lanes_SUM_f32 (each column once: runs overlap). */
typedef struct {
    const float *dy;
    int64_t dys0, dys1; /* dy's planes: a row's, and the next along it */
    const uint8_t *codes;
    int64_t rows, planes, P, OP, summed;
    bool relu;
    pool_gtab gt;
    float *lanes; /* RED_LANES a row, or NULL */
} back_rows;

static void back_rows_make(void *ctx, int64_t j0, int64_t n, float *r, int64_t ld) {
    back_rows *s = ctx;
    int64_t from = s->summed > j0 ? s->summed : j0; /* a multiple of the lanes, or the end */
    for (int64_t k = 0; k < s->rows; k++) {
        float *row = r + k * ld - j0; /* column j at row + j; whole planes spill into the pad */
        for (int64_t pl = j0 / s->P; pl * s->P < j0 + n; pl++)
            pool2_grad_plane_float(&s->gt, s->dy + k * s->dys0 + pl * s->dys1,
                                   s->codes + (k * s->planes + pl) * s->OP, s->relu,
                                   row + pl * s->P, s->OP);
        if (s->lanes && from < j0 + n)
            sum_lanes(s->lanes + k * RED_LANES, row + from, j0 + n - from);
    }
    s->summed = j0 + n > s->summed ? j0 + n : s->summed;
}

/* The fold's product reads the pool gradient's rows; here they are made a run of columns at a
 * time from the codes and go, while in cache, into the fold's product, the weight gradient and
 * the bias gradient's sum (its lanes carried from run to run, then red_lanes_SUM_f32's tree): the
 * pool gradient is never written, and each value is the one the three nodes compute alone. */
static loom_status fold_back(const loom__program *p, const loom__bind *b, int32_t id, int32_t mid) {
    back_plan q = back_plan_of(p, id);
    const loom__pnode *g = q.pg, *t = q.fold;
    q.a.p = loom__addr(p, b, q.prod->src[0]), q.b.p = loom__addr(p, b, q.w->src[1]);
    int32_t dn = g->relu_dy >= 0 ? g->relu_dy : g->src[1];
    const loom__pnode *d = &p->nodes[dn];
    float *lanes = (float *)(b->ws + p->nodes[mid].ws_off);
    float *sum = t->back_sum >= 0 ? loom__addr(p, b, t->back_sum) : NULL;
    back_rows s = {.dy = loom__addr(p, b, dn),
                   .dys0 = d->lay.stride[0],
                   .dys1 = d->lay.stride[1],
                   .codes = loom__pool_codes(p, b, g->codes_of),
                   .rows = q.K,
                   .planes = g->shape[1],
                   .P = g->shape[2] * g->shape[3],
                   .OP = d->shape[2] * d->shape[3],
                   .relu = g->relu >= 0 || g->relu_dy >= 0,
                   .lanes = sum ? lanes : NULL};
    pool_gtab_init(&s.gt, g->shape[2], g->shape[3], d->shape[2], d->shape[3]);
    memset(lanes, 0, sizeof(float) * (size_t)(q.K * RED_LANES));
    loom__gdim crow, ccol;
    fold_dims(t, &crow, &ccol);
    float *x = loom__addr(p, b, id);
    memset(x, 0, sizeof(float) * (size_t)loom__numel(4, t->shape));
    loom__conv_back(q.prod->shape[0], q.prod->shape[1], q.K, &q.a, crow, ccol, x, q.w->shape[1],
                    &q.b, loom__addr(p, b, t->back_w), q.w->lay.stride[0], back_rows_make, &s,
                    q.pad, lanes + q.K * RED_LANES, b->ws + p->scratch);
    for (int64_t r = 0; sum && r < q.K; r++) {
        float *l = lanes + r * RED_LANES;
        for (int w = RED_LANES / 2; w >= 1; w /= 2)
            for (int j = 0; j < w; j++)
                l[j] += l[j + w];
        sum[r] = l[0];
    }
    return LOOM_OK;
}

static loom_status k_POOLMAX(const loom__program *p, const loom__bind *b, int32_t id) {
    if (p->nodes[id].conv >= 0)
        return pool_conv(p, b, id);
    return pool_kernel(p, b, id, false);
}
static loom_status k_POOLGRAD(const loom__program *p, const loom__bind *b, int32_t id) {
    if (p->nodes[id].quad)
        return pool_quad(p, b, id);
    return pool_kernel(p, b, id, true);
}

/* ---- one-hot ----------------------------------------------------------------------------------
 */

/* The next element of strided node s in row-major order: index ix, offset off (elements). */
static void next_strided(const loom__pnode *s, int64_t *ix, int64_t *off) {
    for (int d = s->ndim - 1; d >= 0; d--) {
        ix[d]++;
        *off += s->lay.stride[d];
        if (ix[d] < s->shape[d])
            return;
        *off -= s->lay.stride[d] * s->shape[d];
        ix[d] = 0;
    }
}

static loom_status bad_index(const char *op, int32_t v, int64_t r, int64_t n) {
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
    for (int64_t r = 0; r < rows; r++, next_strided(s, ix, &off)) {
        int32_t v = idx[off];
        if (v < 0 || v >= V)
            return bad_index("loom_gather", v, r, V);
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
    for (int64_t r = 0; r < rows; r++, next_strided(s, ix, &off)) {
        int32_t v = idx[off];
        if (v < 0 || v >= V)
            return bad_index("loom_scatter_add", v, r, V);
        for (int64_t j = 0; j < D; j++, next_strided(x, xi, &xoff)) {
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
        next_strided(x, ix, &off);
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
    for (int64_t e = 0; e < n; e++, next_strided(x, ix, &off)) {
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

/* out = the sum of x[0 .. n) in lanes and a fixed tree (internal.h), as red_lanes_SUM sums. */
_Static_assert(RED_LANES == LOOM_LANES, "the row kernels' sums are the reductions'");
#define LANE_SUM(T, x, n, out) LOOM_LANE_REDUCE(T, 0, LOOM_LANE_ADD, x, n, out)

/* Softmax along the last axis, a row at a time: its max (in RED_LANES lanes: exact in any
 * order, a NaN kept), exp(x - max) (a -inf, as a causal mask leaves, is 0 without calling exp),
 * their sum in RED_LANES lanes and a fixed tree (LANE_SUM's order; this one loop with the ragged
 * end inside measured faster here than LANE_SUM's two), each exp divided by it. Each loop
 * vectorizes; built twice, the second for AVX-512, chosen when the CPU has it (the same
 * operations in the same order: the same values). */
#define SOFTMAX_ROWS(NAME, T, EXP, ATTR)                                                        \
    ATTR static void NAME(const T *x, int64_t rs, int64_t cs, T *y, int64_t rows, int64_t n) {  \
        int64_t full = n / RED_LANES * RED_LANES;                                               \
        for (int64_t r = 0; r < rows; r++) {                                                    \
            const T *xr = x + r * rs;                                                           \
            T *yr = y + r * n, lane[RED_LANES];                                                 \
            for (int64_t j = 0; j < n; j++) /* the row, contiguous */                           \
                yr[j] = xr[j * cs];                                                             \
            for (int j = 0; j < RED_LANES; j++)                                                 \
                lane[j] = -INFINITY;                                                            \
            for (int64_t q = 0; q < n; q += RED_LANES)                                          \
                for (int j = 0; j < RED_LANES && (q < full || q + j < n); j++) {                \
                    T a = yr[q + j];                                                            \
                    lane[j] = a > lane[j] || a != a ? a : lane[j];                              \
                }                                                                               \
            for (int w = RED_LANES / 2; w >= 1; w /= 2)                                         \
                for (int j = 0; j < w; j++)                                                     \
                    lane[j] = lane[j + w] > lane[j] || lane[j + w] != lane[j + w] ? lane[j + w] \
                                                                                  : lane[j];    \
            T mx = lane[0];                                                                     \
            for (int64_t j = 0; j < n; j++) {                                                   \
                T a = yr[j], e = EXP(a - mx);                                                   \
                yr[j] = a == -INFINITY ? (T)0 : e;                                              \
            }                                                                                   \
            for (int j = 0; j < RED_LANES; j++)                                                 \
                lane[j] = 0;                                                                    \
            for (int64_t q = 0; q < n; q += RED_LANES)                                          \
                for (int j = 0; j < RED_LANES && (q < full || q + j < n); j++)                  \
                    lane[j] += yr[q + j];                                                       \
            for (int w = RED_LANES / 2; w >= 1; w /= 2)                                         \
                for (int j = 0; j < w; j++)                                                     \
                    lane[j] += lane[j + w];                                                     \
            T sum = lane[0];                                                                    \
            for (int64_t j = 0; j < n; j++)                                                     \
                yr[j] /= sum;                                                                   \
        }                                                                                       \
    }
SOFTMAX_ROWS(softmax_rows_float, float, loom_expf, )
SOFTMAX_ROWS(softmax_rows_double, double, exp, )
#if defined(__x86_64__) && defined(__GNUC__)
SOFTMAX_ROWS(softmax_rows_float512, float, loom_expf, __attribute__((target("avx512f"))))
#endif

static void softmax_rows_f32(const float *x, int64_t rs, int64_t cs, float *y, int64_t rows,
                             int64_t n) {
#if defined(__x86_64__) && defined(__GNUC__)
    if (__builtin_cpu_supports("avx512f")) {
        softmax_rows_float512(x, rs, cs, y, rows, n);
        return;
    }
#endif
    softmax_rows_float(x, rs, cs, y, rows, n);
}

/* Layer normalization along the last axis, a row at a time (rows gathered into contiguous
 * scratch first where strided; the AVX-512 row reads contiguous ones in place): the mean (a sum
 * in RED_LANES lanes and a fixed tree, over n), the biased variance of x - mean the same way,
 * rstd = 1 / sqrt(var + eps);
 *   forward:  y = (x - mean) rstd
 *   gradient: gx = rstd (gy - mean(gy) - xhat mean(gy xhat)), xhat = (x - mean) rstd
 * the statistics recomputed from x exactly as the forward computes them. Built twice like the
 * softmax rows (AVX-512 chosen when the CPU has it; the same operations in the same order). */
#define LNORM_ROW(NAME, T, ATTR)                                                           \
    /* xr: the row (n), centred in place; gr: its gradient (NULL: forward), tmp: n more */ \
    ATTR static void NAME(T *xr, const T *gr, T *tmp, T *o, int64_t n, T eps) {            \
        T sum, sq, mean, rstd;                                                             \
        LANE_SUM(T, xr, n, sum);                                                           \
        mean = sum / (T)n;                                                                 \
        for (int64_t j = 0; j < n; j++)                                                    \
            xr[j] -= mean, tmp[j] = xr[j] * xr[j];                                         \
        LANE_SUM(T, tmp, n, sq);                                                           \
        rstd = (T)1 / sqrt(sq / (T)n + eps);                                               \
        if (!gr) {                                                                         \
            for (int64_t j = 0; j < n; j++)                                                \
                o[j] = xr[j] * rstd;                                                       \
            return;                                                                        \
        }                                                                                  \
        T gsum, gdot;                                                                      \
        LANE_SUM(T, gr, n, gsum);                                                          \
        for (int64_t j = 0; j < n; j++)                                                    \
            xr[j] *= rstd, tmp[j] = gr[j] * xr[j]; /* xhat, gy xhat */                     \
        LANE_SUM(T, tmp, n, gdot);                                                         \
        T gm = gsum / (T)n, dm = gdot / (T)n;                                              \
        for (int64_t j = 0; j < n; j++)                                                    \
            o[j] = rstd * (gr[j] - gm - xr[j] * dm);                                       \
    }
LNORM_ROW(lnorm_row_float, float, )
LNORM_ROW(lnorm_row_double, double, )
#if defined(__x86_64__) && defined(__GNUC__)
/* The float row in AVX-512 intrinsics, read in place (x and g, n contiguous each; o n more):
 * LANE_SUM's lanes are a vector's (the ragged end added into the first lanes), its tree the
 * halves folded in (lane j + 8, + 4, + 2, + 1 into lane j), x - mean and xhat recomputed where
 * the macro keeps them: the same operations in the same order as lnorm_row_float, so the same
 * values, without the copies and the scalar loops' overhead (a GPT's rows are 128). */
__attribute__((target("avx512f"), always_inline)) static inline float lane_tree(__m512 v) {
    v = _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, _MM_SHUFFLE(3, 2, 3, 2)));
    v = _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, _MM_SHUFFLE(1, 1, 1, 1)));
    v = _mm512_add_ps(v, _mm512_permute_ps(v, _MM_SHUFFLE(3, 2, 3, 2)));
    v = _mm512_add_ps(v, _mm512_permute_ps(v, _MM_SHUFFLE(1, 1, 1, 1)));
    return _mm512_cvtss_f32(v);
}
#    define ROW_LANES(q, n) \
        ((q) + 16 <= (n) ? (__mmask16)0xffff : (__mmask16)((1u << ((n) - (q))) - 1))
__attribute__((target("avx512f"))) static void lnorm_row_float512(const float *x, const float *g,
                                                                  float *o, int64_t n, float eps) {
    __m512 acc = _mm512_setzero_ps();
    for (int64_t q = 0; q < n; q += 16) {
        __mmask16 m = ROW_LANES(q, n);
        acc = _mm512_mask_add_ps(acc, m, acc, _mm512_maskz_loadu_ps(m, x + q));
    }
    __m512 mean = _mm512_set1_ps(lane_tree(acc) / (float)n);
    acc = _mm512_setzero_ps();
    for (int64_t q = 0; q < n; q += 16) {
        __mmask16 m = ROW_LANES(q, n);
        __m512 d = _mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + q), mean);
        acc = _mm512_mask_add_ps(acc, m, acc, _mm512_mul_ps(d, d));
    }
    __m512 rstd = _mm512_set1_ps(1.0f / sqrtf(lane_tree(acc) / (float)n + eps));
#    define XHAT(q, m) _mm512_mul_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + (q)), mean), rstd)
    if (!g) {
        for (int64_t q = 0; q < n; q += 16) {
            __mmask16 m = ROW_LANES(q, n);
            _mm512_mask_storeu_ps(o + q, m, XHAT(q, m));
        }
        return;
    }
    __m512 gs = _mm512_setzero_ps(), gd = _mm512_setzero_ps();
    for (int64_t q = 0; q < n; q += 16) {
        __mmask16 m = ROW_LANES(q, n);
        __m512 gq = _mm512_maskz_loadu_ps(m, g + q);
        gs = _mm512_mask_add_ps(gs, m, gs, gq);
        gd = _mm512_mask_add_ps(gd, m, gd, _mm512_mul_ps(gq, XHAT(q, m)));
    }
    __m512 gm = _mm512_set1_ps(lane_tree(gs) / (float)n);
    __m512 dm = _mm512_set1_ps(lane_tree(gd) / (float)n);
    for (int64_t q = 0; q < n; q += 16) {
        __mmask16 m = ROW_LANES(q, n);
        __m512 v = _mm512_sub_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, g + q), gm),
                                 _mm512_mul_ps(XHAT(q, m), dm));
        _mm512_mask_storeu_ps(o + q, m, _mm512_mul_ps(rstd, v));
    }
#    undef XHAT
}
#    undef ROW_LANES
#endif

/* Offset of row r (its first element along the last axis) of node x. */
static int64_t row_offset(const loom__pnode *x, int64_t r) {
    int64_t off = 0;
    for (int d = x->ndim - 2; d >= 0; d--) {
        off += r % x->shape[d] * x->lay.stride[d];
        r /= x->shape[d];
    }
    return off;
}

/* Row r of node x (n elements along the last axis) into dst, contiguous. */
#define GATHER_ROW(T, src, x, r, n, dst)                   \
    do {                                                   \
        const T *s_ = (const T *)(src) + row_offset(x, r); \
        int64_t cs_ = (x)->lay.stride[(x)->ndim - 1];      \
        for (int64_t j_ = 0; j_ < (n); j_++)               \
            (dst)[j_] = s_[j_ * cs_];                      \
    } while (0)

size_t loom__lnorm_scratch_bytes(const loom__pnode *t) {
    return loom__dtype_size((loom_dtype)t->dtype) * (size_t)(3 * t->shape[t->ndim - 1]);
}

static loom_status k_lnorm(const loom__program *p, const loom__bind *b, int32_t id, bool grad) {
    const loom__pnode *t = &p->nodes[id], *x = &p->nodes[t->src[0]];
    const loom__pnode *gy = grad ? &p->nodes[t->src[1]] : NULL;
    int64_t n = t->shape[t->ndim - 1], rows = n ? loom__numel(t->ndim, t->shape) / n : 0;
    const void *xs = loom__addr(p, b, t->src[0]), *gs = grad ? loom__addr(p, b, t->src[1]) : NULL;
    void *o = loom__addr(p, b, id);
    unsigned char *tmp = b->ws + p->scratch; /* loom__lnorm_scratch_bytes: a row's copies */
#if defined(__x86_64__) && defined(__GNUC__)
    bool wide = __builtin_cpu_supports("avx512f");
#else
    bool wide = false;
#endif
    for (int64_t r = 0; r < rows; r++) {
        if (t->dtype == LOOM_F64) {
            double *xr = (double *)(void *)tmp, *gr = grad ? xr + n : NULL,
                   *o_r = (double *)o + r * n;
            GATHER_ROW(double, xs, x, r, n, xr);
            if (grad)
                GATHER_ROW(double, gs, gy, r, n, gr);
            lnorm_row_double(xr, gr, xr + 2 * n, o_r, n, t->attr.value);
        } else {
            float *xr = (float *)(void *)tmp, *gr = grad ? xr + n : NULL, *o_r = (float *)o + r * n;
#if defined(__x86_64__) && defined(__GNUC__)
            if (wide) { /* rows read in place where their elements are contiguous */
                const float *xw = (const float *)xs + row_offset(x, r), *gw = NULL;
                if (x->lay.stride[x->ndim - 1] != 1) {
                    GATHER_ROW(float, xs, x, r, n, xr);
                    xw = xr;
                }
                if (grad)
                    gw = (const float *)gs + row_offset(gy, r);
                if (grad && gy->lay.stride[gy->ndim - 1] != 1) {
                    GATHER_ROW(float, gs, gy, r, n, gr);
                    gw = gr;
                }
                lnorm_row_float512(xw, gw, o_r, n, (float)t->attr.value);
                continue;
            }
#endif
            GATHER_ROW(float, xs, x, r, n, xr);
            if (grad)
                GATHER_ROW(float, gs, gy, r, n, gr);
            (void)wide;
            lnorm_row_float(xr, gr, xr + 2 * n, o_r, n, (float)t->attr.value);
        }
    }
    return LOOM_OK;
}

/* PAD and CROP, a plane at a time: each row of the smaller (PAD's input, CROP's output) copied
 * to or from its place in the larger; PAD writes zeros around them (the rows above and below, and
 * each row's two ends), nothing twice. */
static loom_status k_pad_crop(const loom__program *p, const loom__bind *b, int32_t id, bool crop) {
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
            src + es * (size_t)(row_offset(x, q * x->shape[nd - 2] + (crop ? ph : 0)) +
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

static loom_status k_LNORM(const loom__program *p, const loom__bind *b, int32_t id) {
    return k_lnorm(p, b, id, false);
}

static loom_status k_LNORMGRAD(const loom__program *p, const loom__bind *b, int32_t id) {
    return k_lnorm(p, b, id, true);
}

static loom_status k_SOFTMAX(const loom__program *p, const loom__bind *b, int32_t id) {
    const loom__pnode *t = &p->nodes[id], *x = &p->nodes[t->src[0]];
    int64_t n = t->shape[t->ndim - 1], rows = n ? loom__numel(t->ndim, t->shape) / n : 0;
    const void *src = loom__addr(p, b, t->src[0]);
    void *o = loom__addr(p, b, id);
    int64_t cs = x->lay.stride[x->ndim - 1], rs = n;
    /* rows evenly spaced (contiguous, or any layout whose leading dims merge) take one loop;
     * others go a row at a time */
    bool even = true;
    for (int d = x->ndim - 3; d >= 0 && even; d--)
        even = x->shape[d] == 1 || x->lay.stride[d] == x->lay.stride[d + 1] * x->shape[d + 1];
    if (x->ndim >= 2)
        rs = x->lay.stride[x->ndim - 2];
    size_t es = loom__dtype_size((loom_dtype)t->dtype);
    int64_t ix[MAXD] = {0}, off = 0;
    for (int64_t r = 0; r < rows; r += even ? rows : 1) {
        int64_t m = even ? rows : 1;
        const char *xr = (const char *)src + (size_t)off * es;
        char *yr = (char *)o + (size_t)(r * n) * es;
        if (t->dtype == LOOM_F64)
            softmax_rows_double((const double *)(const void *)xr, rs, cs, (double *)(void *)yr, m,
                                n);
        else
            softmax_rows_f32((const float *)(const void *)xr, rs, cs, (float *)(void *)yr, m, n);
        if (!even) { /* to the next row's first element */
            off += (n - 1) * cs, ix[x->ndim - 1] = n - 1;
            next_strided(x, ix, &off);
        }
    }
    return LOOM_OK;
}

static loom_status k_ATTENTION(const loom__program *p, const loom__bind *b, int32_t id) {
    return loom__k_attention(p, b, id);
}

static loom_status k_ATTENTIONGRAD(const loom__program *p, const loom__bind *b, int32_t id) {
    return loom__k_attention_grad(p, b, id);
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
            return bad_index("loom_onehot", v, r, n);
        if (t->dtype == LOOM_F64)
            ((double *)o)[r * n + v] = 1.0;
        else
            ((float *)o)[r * n + v] = 1.0f;
        next_strided(s, ix, &off);
    }
    return LOOM_OK;
}

/* ---- collectives ----------------------------------------------------------------------------- */

static loom_status k_ALLREDUCE(const loom__program *p, const loom__bind *b, int32_t id) {
    const loom__pnode *t = &p->nodes[id], *s = &p->nodes[t->src[0]];
    size_t es = loom__dtype_size((loom_dtype)t->dtype);
    void *o = loom__addr(p, b, id);
    int64_t n = loom__numel(t->ndim, t->shape);
    strided_copy(o, loom__addr(p, b, t->src[0]), &s->lay, s->ndim, s->shape, es);
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

static const kernel_fn kernels[LOOM_OP_COUNT] = {
#define LOOM_LEAF(name, attr)          [LOOM_OP_##name] = k_##name,
#define LOOM_EW(name, arity, expr)     [LOOM_OP_##name] = k_##name,
#define LOOM_RED(name, combine, ident) [LOOM_OP_##name] = k_##name,
#define LOOM_MOV(name, attr)           [LOOM_OP_##name] = k_##name,
#define LOOM_OPQ(name, arity, attr)    [LOOM_OP_##name] = k_##name,
#include "../graph/ops.def"
};

loom_status loom__interp_entry(const loom__program *p, const loom__bind *b, int64_t e) {
    int32_t id = p->exec[e];
    loom_status s = LOOM_OK;
    if (p->fused_of && p->fused_of[id] >= 0) { /* a generated kernel */
        const loom__fused *k = &p->fused[p->fused_of[id]];
        void *args[LOOM_FUSED_MAX_ARGS];
        for (int a = 0; a < k->nargs; a++)
            args[a] = loom__addr(p, b, k->args[a]);
        k->fn(args);
    } else {
        s = kernels[p->nodes[id].op](p, b, id);
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

/* A slab range as a value: node id's shape, contiguous from the slab's offset. */
static loom__value slab_value(const loom__pnode *t, int32_t id) {
    loom__value v = {.id = id,
                     .exact = true,
                     .lay = {.base = LOOM_BASE_PERSIST,
                             .index = t->attr.persist.slab,
                             .offset = t->attr.persist.offset}};
    for (int64_t d = t->ndim - 1, s = 1; d >= 0; d--)
        v.lay.stride[d] = s, s *= t->shape[d];
    return v;
}

int loom__entry_values(const loom__program *p, int64_t e, loom__value *out) {
    int32_t id = p->exec[e];
    const loom__pnode *t = &p->nodes[id];
    int n = 0;
#define VALUE(node) \
    (out[n++] = (loom__value){.id = (node), .exact = true, .lay = p->nodes[node].lay})
    if (p->fused_of && p->fused_of[id] >= 0) { /* a generated kernel: its root and stores */
        const loom__fused *k = &p->fused[p->fused_of[id]];
        VALUE(id);
        for (int q = 0; q < k->nout; q++)
            VALUE(k->outs[q]);
        return n;
    }
    if (t->op == LOOM_OP_STORE || t->op == LOOM_OP_SYNC) {
        out[n++] = slab_value(t, id);
        return n;
    }
    /* a library kernel's own buffer holds blocks or planes of its values where an epilogue or
     * sinks take them, and nothing where it writes a ReLU instead */
    if (!loom__pool_by_plane(t) && t->relu < 0 && t->epi < 0)
        VALUE(id);
    int32_t m = t->op == LOOM_OP_FOLD ? p->nodes[t->src[0]].src[0] : -1;
    if (n > 0 && m >= 0 && p->nodes[m].fused_into == id)
        out[0].exact = false; /* (its product's columns added in the product's order) */
    if (t->epi >= 0 && !(t->nsinks && !t->keep))
        VALUE(p->fused[t->epi].root);
    if (t->relu >= 0)
        VALUE(t->relu);
    for (int q = 0; q < t->nsinks; q++) {
        VALUE(t->sinks[q]);
        out[n - 1].exact = !t->quad; /* (by windows: the products and sums in another order) */
    }
    if (t->act_sum >= 0)
        VALUE(t->act_sum);
    if (t->back >= 0)
        VALUE(t->back_w);
    if (t->back >= 0 && t->back_sum >= 0)
        VALUE(t->back_sum);
#undef VALUE
    return n;
}
