/*
 * backend/kernels.h - what the CPU's kernel files share: the interpreter's dispatch (interp.c, the
 * reference: every op's meaning) calls the kernels of the op families in their own files -
 * products (product.c), windows (window.c: unfold and fold), max pooling (pool.c) and its fused
 * forms (pool_quad.c, pool_conv.c, pool_back.c), row kernels (rows.c: softmax, LayerNorm),
 * attention (attention.c) and loom's sgemm (gemm.c). Never installed.
 */
#ifndef LOOM_BACKEND_KERNELS_H
#define LOOM_BACKEND_KERNELS_H

#include "internal.h"

#include <cblas.h>
#include <pthread.h>
#include <string.h>
#include <tgmath.h>

#if defined(__x86_64__) && defined(__GNUC__)
#    include <immintrin.h>
#    define HAVE_POOL512 1 /* AVX-512 kernels built (run where the CPU has it) */
/* The AVX2 rows' 8-lane helpers (attention.c, rows.c). A reduction's RED_LANES lanes are held as
 * two vectors, lanes 0-7 and 8-15. loom__in8: lanes [0, left) of 8 set (none for left <= 0);
 * loom__load8n / loom__store8n: the next `left` floats of a row, a whole vector by a plain load
 * or store, a row's ragged end by a masked one (AMD's masked loads and stores cost several times
 * as much: only where needed), lanes past the end read as +0.0; loom__tree_add8: the sum of the
 * 16 lanes in LOOM_LANE_REDUCE's tree (8, 4, 2, 1 apart). */
#    define LOOM_A2      __attribute__((target("avx2,fma"), always_inline)) static inline
LOOM_A2 __m256 loom__in8(int64_t left) {
    return _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(left < 8 ? (int)left : 8),
                                                  _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)));
}
LOOM_A2 __m256 loom__load8n(const float *p, int64_t left) {
    return left >= 8 ? _mm256_loadu_ps(p)
                     : _mm256_maskload_ps(p, _mm256_castps_si256(loom__in8(left)));
}
LOOM_A2 void loom__store8n(float *p, int64_t left, __m256 v) {
    if (left >= 8)
        _mm256_storeu_ps(p, v);
    else
        _mm256_maskstore_ps(p, _mm256_castps_si256(loom__in8(left)), v);
}
LOOM_A2 float loom__tree_add8(__m256 lo, __m256 hi) {
    __m256 v = _mm256_add_ps(lo, hi);
    __m256 w = _mm256_add_ps(v, _mm256_permute2f128_ps(v, v, 0x01));
    w = _mm256_add_ps(w, _mm256_permute_ps(w, 0x0e)); /* lanes 0, 1 with 2, 3 */
    w = _mm256_add_ps(w, _mm256_permute_ps(w, 0x01)); /* lane 0 with 1 */
    return _mm256_cvtss_f32(w);
}
#endif

#define MAXD      LOOM_MAX_DIMS
/* A reduction along contiguous memory keeps RED_LANES partial results (element k goes to lane
 * k % RED_LANES) and combines them in a fixed pairwise tree: independent chains that vectorize,
 * instead of one chain bound by the add latency; the order is fixed, so runs repeat bitwise. */
#define RED_LANES 16

/* interp.c: helpers of every kernel file. Row-major strides of a shape; a copy of the strided
 * elements at l (shape nd, shape) into contiguous dst; the next element of strided node s in
 * row-major order (index ix, offset off in elements); the error of an index out of range; the
 * offset of row r of x (rows along its last axis). */
void loom__contiguous_strides(int nd, const int64_t *shape, int64_t *st);
void loom__strided_copy(void *dst, const void *src, const loom__layout *l, int nd,
                        const int64_t *shape, size_t es);
void loom__next_strided(const loom__pnode *s, int64_t *ix, int64_t *off);
loom_status loom__bad_index(const char *op, int32_t v, int64_t r, int64_t n);
int64_t loom__row_offset(const loom__pnode *x, int64_t r);

/* The kernels of the families, by op (interp.c's table). */
loom_status loom__k_matmul(const loom__program *p, const loom__bind *b, int32_t id);
loom_status loom__k_unfold(const loom__program *p, const loom__bind *b, int32_t id);
loom_status loom__k_fold(const loom__program *p, const loom__bind *b, int32_t id);
/* window.c: PAD node id on AVX-512, its planes split across the device's cores; false where it
 * cannot (not float, not AVX-512, rows strided): the plain loops. */
bool loom__pad_planes(const loom__program *p, const loom__bind *b, int32_t id);
loom_status loom__k_poolmax(const loom__program *p, const loom__bind *b, int32_t id);
loom_status loom__k_poolgrad(const loom__program *p, const loom__bind *b, int32_t id);
loom_status loom__k_softmax(const loom__program *p, const loom__bind *b, int32_t id);
loom_status loom__k_lnorm(const loom__program *p, const loom__bind *b, int32_t id);
loom_status loom__k_lnormgrad(const loom__program *p, const loom__bind *b, int32_t id);

/* product.c: an epilogue, a generated kernel run on each block of a library kernel's output
 * (a product's, a pool gradient's planes) while in cache. */
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
void loom__epilogue_init(epilogue *e, const loom__program *p, const loom__bind *b, int32_t id);
/* A plane of the library kernel's values v done (loom__plane_done), and where the next goes. */
void loom__plane_done(void *ctx, int64_t plane, const float *v);
float *loom__plane_place(void *ctx, int64_t plane);
/* The operands of product id as loom__gmat (a, b), its batch count returned. */
int64_t loom__product_operands(const loom__program *p, const loom__bind *b, int32_t id,
                               loom__gmat *a, loom__gmat *bm);

/* window.c: the compound rows and columns of fold t's image (its product's C). */
void loom__fold_dims(const loom__pnode *t, loom__gdim *crow, loom__gdim *ccol);

/* pool.c: the 2x2 rows' AVX-512 kernels (where the CPU has them), and the table of a pool
 * gradient's plane made from its codes. */
bool loom__pool512(void);
/* A pool gradient's plane whose windows fit two registers, from the codes: per element of the
 * plane, its window and its place in the window (0-3; 7 where no window covers it), 16 a group. */
typedef struct {
    int64_t groups, last; /* 16-element groups of the plane; elements in the last */
    int32_t win[16][16], pos[16][16];
} pool_gtab;
bool loom__pool_gtab_init(pool_gtab *t, int64_t H, int64_t W, int64_t OH, int64_t OW);
void loom__pool2_grad_plane_float(const pool_gtab *t, const float *gy, const uint8_t *codes,
                                  bool relu, float *o, int64_t per);
/* ... and of any plane (H x W, OH x OW 2x2 windows; o its first element), its window rows
 * [y0, y1) by rows, their uncovered last column +0, and with `last` the uncovered last row: the
 * values pool_kernel writes. */
void loom__pool2_grad_rows_float(const float *gy, const uint8_t *codes, bool relu, int64_t H,
                                 int64_t W, int64_t OH, int64_t OW, int64_t y0, int64_t y1,
                                 bool last, float *o);
/* The general window loops of max pooling (and its gradient, grad) over x (N, C, H, W: xs, strides
 * xst) into out (ys: the output's shape), with argmax codes, the ReLU, and with `done` a plane at
 * a time (into place(ctx, plane) when given), handed to done(ctx, plane, values). */
#define LOOM_POOL_DECL(T)                                                                        \
    void loom__pool_##T(const loom_window *w, const int64_t *xs, const int64_t *xst,             \
                        const int64_t *ys, const T *x, const T *dy, const int64_t *dyst, T *out, \
                        bool grad, uint8_t *codes, bool relu,                                    \
                        void (*done)(void *, int64_t, const T *), T *(*place)(void *, int64_t),  \
                        void *ctx);
LOOM_POOL_DECL(float)
LOOM_POOL_DECL(double)
#ifdef HAVE_POOL512
extern const int32_t loom__pool_even[16];
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
#endif

/* pool_quad.c: a pool gradient's sinks by windows (its QUAD form), and the subsampled images
 * it shares with pool_conv.c. */
#define QUAD_MAX_K 7 /* the window-by-window forms' largest (square) kernel */
#ifdef HAVE_POOL512
/* side: K + 1 for a K x K kernel, side * side images */
void loom__quad_images(float *S, float *tmp, const float *x, const loom__gdim *br, int64_t sc,
                       int64_t OH, int64_t OW, int64_t chunks, int side);
#endif

#endif
