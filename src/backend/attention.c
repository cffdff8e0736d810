/*
 * attention.c - multi-head scaled dot-product self-attention (ATTENTION) and its gradient
 * (ATTENTIONGRAD) as one kernel each, a head at a time. A head's query, key and value rows are
 * read in place from the packed qkv (B, T, 3, H, D) (copied where their elements are not
 * contiguous), k and v transposed into scratch, and the queries go in blocks of ATTN_ROWS rows:
 * their scores S = q k^T scaled by 1/sqrt(D), masked (causal: key j > query i takes no part) and
 * softmaxed a row at a time (max, exp(s - max) in float by opmath.h's loom_expf_sp, 1.2 ulp, their
 * sum in lanes, each divided by it), then y = P v. A causal block computes only the keys up to its
 * last query: about half of the T x T work is never done. When the graph takes the gradient, the
 * forward keeps each block's P (rows x its keys) in its own buffer after y, and the backward
 * reads them there (past ATTN_KEEP_MAX bytes it makes them again instead), then per block
 *   dP = dy v^T,   dS = P (dP - sum_j P dP) / sqrt(D)   (a row at a time; 0 where masked),
 *   dq = dS k,     dk += dS^T q,   dv += P^T dy,
 * writing dq, dk and dv into their places of the (B, T, 3, H, D) gradient.
 *
 * The small products run on register tiles (AVX-512 FMA over 4 rows x up to 64 columns, from
 * L1) and the rows on 16 lanes where the CPU has AVX-512; on 8-lane AVX2 FMA tiles (6 or 4 rows x
 * up to 16 columns) where it has AVX2 and FMA only, with the softmax rows and the transposes
 * written out in 8-lane vectors (the plain rows' operations in their order: the same values); plain
 * loops otherwise, for float64 and under LOOM_MATMUL=blas (the same steps: values within rounding
 * of each other). Every element is summed in a fixed order: runs repeat bitwise.
 */
#include "kernels.h"

#include <math.h>
#include <stdint.h>
#include <string.h>
#include <tgmath.h>

#include "../graph/opmath.h"

/* (the attention uses some of the shared math only: clang warns of the others) */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
LOOM_OPMATH(LOOM_OPMATH_EMIT)
#pragma GCC diagnostic pop

#if defined(__x86_64__) && defined(__GNUC__)
#    include <immintrin.h>
#    define ATTN_WIDE 1
#else
#    define ATTN_WIDE 0
#endif

/* Query rows a block: a multiple of the tiles' 4; the causal skip works at this grain. */
#define ATTN_ROWS 16

/* The small products: c (m x n, rows ldc apart) = a b (+ c with acc), a (m x k) at
 * a[i ars + p acs], b (k x n) rows ldb apart. */

#define ATTN_MM(NAME, T)                                                                        \
    static void NAME(int64_t m, int64_t n, int64_t k, const void *av, int64_t ars, int64_t acs, \
                     const void *bv, int64_t ldb, void *cv, int64_t ldc, bool acc) {            \
        const T *a = av, *b = bv;                                                               \
        T *c = cv;                                                                              \
        for (int64_t i = 0; i < m; i++) {                                                       \
            T *ci = c + i * ldc;                                                                \
            if (!acc)                                                                           \
                for (int64_t j = 0; j < n; j++)                                                 \
                    ci[j] = 0;                                                                  \
            for (int64_t p = 0; p < k; p++) {                                                   \
                T x = a[i * ars + p * acs];                                                     \
                const T *bp = b + p * ldb;                                                      \
                for (int64_t j = 0; j < n; j++)                                                 \
                    ci[j] += x * bp[j];                                                         \
            }                                                                                   \
        }                                                                                       \
    }
ATTN_MM(mm_f32, float)
ATTN_MM(mm_f64, double)

#if ATTN_WIDE
/* One register tile: MR rows x NV vectors of 16 columns (the last one's columns `last`). */
__attribute__((target("avx512f"), always_inline)) static inline void
tile512(int MR, int NV, __mmask16 last, int64_t k, const float *a, int64_t ars, int64_t acs,
        const float *b, int64_t ldb, float *c, int64_t ldc, bool acc) {
    __m512 cc[4][4];
    for (int r = 0; r < MR; r++)
        for (int v = 0; v < NV; v++)
            cc[r][v] =
                acc ? _mm512_maskz_loadu_ps(v == NV - 1 ? last : 0xffff, c + r * ldc + 16 * v)
                    : _mm512_setzero_ps();
    for (int64_t p = 0; p < k; p++) {
        __m512 bb[4];
        for (int v = 0; v < NV; v++)
            bb[v] = _mm512_maskz_loadu_ps(v == NV - 1 ? last : 0xffff, b + p * ldb + 16 * v);
        for (int r = 0; r < MR; r++) {
            __m512 x = _mm512_set1_ps(a[r * ars + p * acs]);
            for (int v = 0; v < NV; v++)
                cc[r][v] = _mm512_fmadd_ps(x, bb[v], cc[r][v]);
        }
    }
    for (int r = 0; r < MR; r++)
        for (int v = 0; v < NV; v++)
            _mm512_mask_storeu_ps(c + r * ldc + 16 * v, v == NV - 1 ? last : 0xffff, cc[r][v]);
}

/* MR rows of the block's nv vectors, the widths as constants (each tile's loops unrolled) */
#    define TILES(MR)         \
        do {                  \
            if (nv == 1)      \
                TILE(MR, 1);  \
            else if (nv == 2) \
                TILE(MR, 2);  \
            else if (nv == 3) \
                TILE(MR, 3);  \
            else              \
                TILE(MR, 4);  \
        } while (0)
#    define TILE(MR, NV) \
        tile512(MR, NV, last, k, a + i * ars, ars, acs, b + j, ldb, c + i * ldc + j, ldc, acc)
__attribute__((target("avx512f"))) static void mm_f32_512(int64_t m, int64_t n, int64_t k,
                                                          const void *av, int64_t ars, int64_t acs,
                                                          const void *bv, int64_t ldb, void *cv,
                                                          int64_t ldc, bool acc) {
    const float *a = av, *b = bv;
    float *c = cv;
    for (int64_t j = 0; j < n; j += 64) {
        int64_t w = n - j < 64 ? n - j : 64;
        int nv = (int)((w + 15) / 16);
        __mmask16 last = (__mmask16)((1u << (w - 16 * (nv - 1))) - 1);
        int64_t i = 0;
        for (; i + 4 <= m; i += 4)
            TILES(4);
        for (; i < m; i++)
            TILES(1);
    }
}
#    undef TILE

/* The same tiles on 8 lanes for CPUs with AVX2 and FMA but no AVX-512: MR rows x NV vectors of 8
 * columns (the last one's lanes `last`, or all of them: full), 16 columns a strip (12
 * accumulators at most of the 16 registers). Each element a chain of FMAs over k, as tile512's. */
#    define LOADV(p, v) (full || (v) < NV - 1 ? _mm256_loadu_ps(p) : _mm256_maskload_ps((p), last))
__attribute__((target("avx2,fma"), always_inline)) static inline void
tile256(int MR, int NV, bool full, __m256i last, int64_t k, const float *a, int64_t ars,
        int64_t acs, const float *b, int64_t ldb, float *c, int64_t ldc, bool acc) {
    __m256 cc[6][2];
    for (int r = 0; r < MR; r++)
        for (int v = 0; v < NV; v++)
            cc[r][v] = acc ? LOADV(c + r * ldc + 8 * v, v) : _mm256_setzero_ps();
    for (int64_t p = 0; p < k; p++) {
        __m256 bb[2];
        for (int v = 0; v < NV; v++)
            bb[v] = LOADV(b + p * ldb + 8 * v, v);
        for (int r = 0; r < MR; r++) {
            __m256 x = _mm256_broadcast_ss(a + r * ars + p * acs);
            for (int v = 0; v < NV; v++)
                cc[r][v] = _mm256_fmadd_ps(x, bb[v], cc[r][v]);
        }
    }
    for (int r = 0; r < MR; r++)
        for (int v = 0; v < NV; v++)
            if (full || v < NV - 1)
                _mm256_storeu_ps(c + r * ldc + 8 * v, cc[r][v]);
            else
                _mm256_maskstore_ps(c + r * ldc + 8 * v, last, cc[r][v]);
}
#    undef LOADV
#    define TILE(MR, NV, FULL) \
        tile256(MR, NV, FULL, last, k, a + i * ars, ars, acs, b + j, ldb, c + i * ldc + j, ldc, acc)
__attribute__((target("avx2,fma"))) static void mm_f32_256(int64_t m, int64_t n, int64_t k,
                                                           const void *av, int64_t ars, int64_t acs,
                                                           const void *bv, int64_t ldb, void *cv,
                                                           int64_t ldc, bool acc) {
    const float *a = av, *b = bv;
    float *c = cv;
    for (int64_t j = 0; j < n; j += 16) {
        int64_t w = n - j < 16 ? n - j : 16;
        int nv = w > 8 ? 2 : 1, tail = (int)(w - 8 * (nv - 1));
        __m256i last =
            _mm256_cmpgt_epi32(_mm256_set1_epi32(tail), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        int64_t i = 0;
        if (w == 16) /* (whole strips: plain loads and stores; 6 rows, 12 accumulators) */
            for (; i + 6 <= m; i += 6)
                TILE(6, 2, true);
        for (; i + 4 <= m; i += 4)
            nv == 1 ? TILE(4, 1, false) : w == 16 ? TILE(4, 2, true) : TILE(4, 2, false);
        for (; i < m; i++)
            nv == 1 ? TILE(1, 1, false) : TILE(1, 2, false);
    }
}
#    undef TILE
#    undef TILES
#endif

/* Where the heads live: qkv (B, T, 3, H, D) by its strides, dy (B, T, H, D) by its. */
typedef struct {
    int64_t B, T, H, D;
    const int64_t *xs, *gs;
    bool causal, f64;
    void *kept; /* the probabilities kept for the backward (after the forward's values), or NULL */
} attn_shape;

/* The most bytes of probabilities an ATTENTION node keeps (those of a batch of 12 and 4 heads at
 * a context of 1024 would be ~100 MB): past it the backward recomputes them, as the forward
 * computed them (the same values). */
#define ATTN_KEEP_MAX ((int64_t)64 << 20)

/* Elements of a head's probabilities as kept: each query block's rows x its keys, block after
 * block. */
static int64_t probs_a_head(int64_t T, bool causal) {
    int64_t n = 0;
    for (int64_t i0 = 0; i0 < T; i0 += ATTN_ROWS) {
        int64_t rows = T - i0 < ATTN_ROWS ? T - i0 : ATTN_ROWS;
        n += rows * (causal ? i0 + rows : T);
    }
    return n;
}

int64_t loom__attention_kept_at(const loom__pnode *t) {
    return (loom__numel(t->ndim, t->shape) * (int64_t)loom__dtype_size((loom_dtype)t->dtype) + 63) /
           64 * 64;
}

int64_t loom__attention_kept_bytes(const loom__pnode *t) {
    return t->shape[0] * t->shape[2] * probs_a_head(t->shape[1], t->attr.value != 0) *
           (int64_t)loom__dtype_size((loom_dtype)t->dtype);
}

bool loom__attention_keeps(const loom__program *p, int32_t id) {
    if (p->nodes[id].op != LOOM_OP_ATTENTION || p->nodes[id].lay.base != LOOM_BASE_WS ||
        loom__attention_kept_bytes(&p->nodes[id]) > ATTN_KEEP_MAX)
        return false;
    for (int64_t j = id + 1; j < p->n; j++)
        if (p->nodes[j].op == LOOM_OP_ATTENTIONGRAD && p->nodes[j].src[2] == id)
            return true;
    return false;
}

#define ATTN_MAX(acc, a) ((a) > (acc) || (a) != (a) ? (a) : (acc)) /* (a NaN kept) */

/* A row of scores (lim of n in play: the rest masked) scaled and softmaxed in place: max,
 * exp(s - max), their sum, each divided by it, as the SOFTMAX op's rows; 0 where masked. */
#define ATTN_SOFTMAX_ROW(NAME, TYPE, EXP, ATTR)                           \
    ATTR static void NAME(TYPE *pr, int64_t lim, int64_t n, TYPE scale) { \
        TYPE mx, sum;                                                     \
        for (int64_t j = 0; j < lim; j++)                                 \
            pr[j] *= scale;                                               \
        LOOM_LANE_REDUCE(TYPE, -INFINITY, ATTN_MAX, pr, lim, mx);         \
        for (int64_t j = 0; j < lim; j++)                                 \
            pr[j] = EXP(pr[j] - mx);                                      \
        LOOM_LANE_REDUCE(TYPE, 0, LOOM_LANE_ADD, pr, lim, sum);           \
        for (int64_t j = 0; j < lim; j++)                                 \
            pr[j] /= sum;                                                 \
        for (int64_t j = lim; j < n; j++)                                 \
            pr[j] = 0;                                                    \
    }
/* A row of dP (n) into dS in place, from its probabilities pr: P (dP - sum P dP) scale. */
#define ATTN_GRAD_ROW(NAME, TYPE, ATTR)                                      \
    ATTR static void NAME(const TYPE *pr, TYPE *sr, int64_t n, TYPE scale) { \
        TYPE dot;                                                            \
        for (int64_t j = 0; j < n; j++)                                      \
            sr[j] *= pr[j];                                                  \
        LOOM_LANE_REDUCE(TYPE, 0, LOOM_LANE_ADD, sr, n, dot);                \
        for (int64_t j = 0; j < n; j++)                                      \
            sr[j] = (sr[j] - pr[j] * dot) * scale;                           \
    }
/* x (T x D, rows rs apart) transposed into xt (D x T, contiguous). */
#define ATTN_TRANSPOSE(NAME, TYPE)                                                \
    static void NAME(const TYPE *x, int64_t rs, int64_t T, int64_t D, TYPE *xt) { \
        for (int64_t t = 0; t < T; t++)                                           \
            for (int64_t d = 0; d < D; d++)                                       \
                xt[d * T + t] = x[t * rs + d];                                    \
    }
ATTN_TRANSPOSE(transpose_f64, double)
ATTN_TRANSPOSE(transpose_f32, float)
ATTN_SOFTMAX_ROW(softmax_row_f64, double, exp, )
ATTN_SOFTMAX_ROW(softmax_row_f32, float, loom_expf_sp, )
ATTN_GRAD_ROW(grad_row_f64, double, )
ATTN_GRAD_ROW(grad_row_f32, float, )
#if ATTN_WIDE /* (built for AVX2: the same operations, 8 lanes) */
ATTN_GRAD_ROW(grad_row_f32a, float, __attribute__((target("avx2,fma"))))
#endif
#if ATTN_WIDE
/* loom_expf_sp (graph/opmath.h) on vectors (V, its integer VI: BITS wide, intrinsics P): the same
 * operations, so the same values; KEEP(y, x): y with x's NaN lanes kept. */
#    define ATTN_EXPV(NAME, ATTR, P, V, VI, BITS, KEEP)                                          \
        ATTR static inline V NAME(V x) {                                                         \
            V d = P##_max_ps(P##_min_ps(x, P##_set1_ps(88.0f)), P##_set1_ps(-87.0f));            \
            V t = P##_add_ps(P##_mul_ps(d, P##_set1_ps(1.44269504f)), P##_set1_ps(12582912.0f)); \
            V k = P##_sub_ps(t, P##_set1_ps(12582912.0f));                                       \
            V r = P##_sub_ps(P##_sub_ps(d, P##_mul_ps(k, P##_set1_ps(0.693145752f))),            \
                             P##_mul_ps(k, P##_set1_ps(1.42860677e-06f)));                       \
            static const float c[8] = {                                                          \
                0.000198412701f, 0.00138888892f, 0.00833333377f, 0.0416666679f,                  \
                0.166666672f,    0.5f,           1.0f,           1.0f};                          \
            V p = P##_set1_ps(c[0]);                                                             \
            for (int i = 1; i < 8; i++)                                                          \
                p = P##_fmadd_ps(r, p, P##_set1_ps(c[i]));                                       \
            VI e = P##_slli_epi32(                                                               \
                P##_add_epi32(P##_sub_epi32(P##_castps_si##BITS(t), P##_set1_epi32(0x4b400000)), \
                              P##_set1_epi32(127)),                                              \
                23);                                                                             \
            return KEEP(P##_mul_ps(p, P##_castsi##BITS##_ps(e)), x);                             \
        }
#    define KEEP8(y, x)  _mm256_blendv_ps((y), (x), _mm256_cmp_ps((x), (x), _CMP_UNORD_Q))
#    define KEEP16(y, x) _mm512_mask_blend_ps(_mm512_cmp_ps_mask((x), (x), _CMP_UNORD_Q), (y), (x))
ATTN_EXPV(exp8, __attribute__((target("avx2,fma"), always_inline)), _mm256, __m256, __m256i, 256,
          KEEP8)
ATTN_EXPV(exp16, __attribute__((target("avx512f"), always_inline)), _mm512, __m512, __m512i, 512,
          KEEP16)

/* The rows for CPUs with AVX2 and FMA but no AVX-512, written out in 8-lane vectors with the
 * operations of the plain rows in their order, so the same values bit for bit: exp8, and each
 * reduction LOOM_LANE_REDUCE's (element j into lane j % 16, two vectors of 8; its tree 8, 4, 2,
 * 1). */
/* ATTN_MAX(acc, a) and LOOM_LANE_ADD on 8 lanes (acc where a lane is not in play: m clear) */
LOOM_A2 __m256 max8(__m256 acc, __m256 a, __m256 m) {
    __m256 take =
        _mm256_or_ps(_mm256_cmp_ps(a, acc, _CMP_GT_OQ), _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
    return _mm256_blendv_ps(acc, a, _mm256_and_ps(take, m));
}
LOOM_A2 __m256 add8(__m256 acc, __m256 a, __m256 m) {
    return _mm256_blendv_ps(acc, _mm256_add_ps(acc, a), m);
}
/* LOOM_LANE_REDUCE's tree over lanes lo (0-7) and hi (8-15): 8, 4, 2, 1 apart */
LOOM_A2 float tree_max(__m256 lo, __m256 hi) {
    __m256 all = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
    __m256 v = max8(lo, hi, all);
    __m256 w = max8(v, _mm256_permute2f128_ps(v, v, 0x01), all);
    w = max8(w, _mm256_permute_ps(w, 0x0e), all); /* lanes 0, 1 with 2, 3 */
    w = max8(w, _mm256_permute_ps(w, 0x01), all); /* lane 0 with 1 */
    return _mm256_cvtss_f32(w);
}
/* Whole vectors of the row (n) by plain loads and stores, those past lim too: their lanes are
 * left out of the max and the sum by mask and made 0 at the end, so each lane in play sees the
 * same operations; only a vector past n's end is masked. */
__attribute__((target("avx2,fma"))) static void softmax_row_f32a(float *pr, int64_t lim, int64_t n,
                                                                 float scale) {
    __m256 sc = _mm256_set1_ps(scale), mlo = _mm256_set1_ps(-INFINITY), mhi = mlo;
    __m256 slo = _mm256_setzero_ps(), shi = slo;
    for (int64_t j = 0; j < lim; j += 16) {
        __m256 v0 = _mm256_mul_ps(loom__load8n(pr + j, n - j), sc),
               v1 = _mm256_mul_ps(loom__load8n(pr + j + 8, n - j - 8), sc);
        loom__store8n(pr + j, n - j, v0), loom__store8n(pr + j + 8, n - j - 8, v1);
        mlo = max8(mlo, v0, loom__in8(lim - j)), mhi = max8(mhi, v1, loom__in8(lim - j - 8));
    }
    __m256 top = _mm256_set1_ps(tree_max(mlo, mhi));
    for (int64_t j = 0; j < lim; j += 16) {
        __m256 e0 = exp8(_mm256_sub_ps(loom__load8n(pr + j, n - j), top)),
               e1 = exp8(_mm256_sub_ps(loom__load8n(pr + j + 8, n - j - 8), top));
        loom__store8n(pr + j, n - j, e0), loom__store8n(pr + j + 8, n - j - 8, e1);
        slo = add8(slo, e0, loom__in8(lim - j)), shi = add8(shi, e1, loom__in8(lim - j - 8));
    }
    __m256 total = _mm256_set1_ps(loom__tree_add8(slo, shi));
    for (int64_t j = 0; j < n; j += 8)
        loom__store8n(
            pr + j, n - j,
            _mm256_and_ps(_mm256_div_ps(loom__load8n(pr + j, n - j), total), loom__in8(lim - j)));
}
/* ATTN_TRANSPOSE's, 8 x 8 blocks through registers (the edges one at a time) */
static void transpose_f32a(const float *x, int64_t rs, int64_t T, int64_t D, float *xt) {
    int64_t T8 = T / 8 * 8, D8 = D / 8 * 8;
    for (int64_t t = 0; t < T8; t += 8)
        for (int64_t d = 0; d < D8; d += 8)
            loom__transpose8x8(x + t * rs + d, rs, xt + d * T + t, T);
    for (int64_t t = 0; t < T; t++)
        for (int64_t d = t < T8 ? D8 : 0; d < D; d++)
            xt[d * T + t] = x[t * rs + d];
}
#endif

#if ATTN_WIDE
/* The lanes of a vector holding the next `left` elements (none for left <= 0). */
static inline __mmask16 lanes(int64_t left) {
    return left >= 16 ? (__mmask16)0xffff : left <= 0 ? 0 : (__mmask16)((1u << left) - 1);
}
__attribute__((target("avx512f"))) static void softmax_row_f32w(float *pr, int64_t lim, int64_t n,
                                                                float scale) {
    __m512 mx = _mm512_set1_ps(-INFINITY), sum = _mm512_setzero_ps(), sc = _mm512_set1_ps(scale);
    for (int64_t j = 0; j < lim; j += 16) {
        __mmask16 m = lanes(lim - j);
        __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, pr + j), sc);
        _mm512_mask_storeu_ps(pr + j, m, v);
        mx = _mm512_mask_max_ps(mx, m, mx, v);
    }
    __m512 top = _mm512_set1_ps(_mm512_reduce_max_ps(mx));
    for (int64_t j = 0; j < lim; j += 16) {
        __mmask16 m = lanes(lim - j);
        __m512 e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, pr + j), top));
        _mm512_mask_storeu_ps(pr + j, m, e);
        sum = _mm512_mask_add_ps(sum, m, sum, e);
    }
    __m512 total = _mm512_set1_ps(_mm512_reduce_add_ps(sum));
    for (int64_t j = 0; j < n; j += 16) {
        __mmask16 m = lanes(n - j), in = lanes(lim - j);
        _mm512_mask_storeu_ps(pr + j, m,
                              _mm512_maskz_div_ps(in, _mm512_maskz_loadu_ps(in, pr + j), total));
    }
}
/* ATTN_TRANSPOSE's, 16 rows of a column at a time by a gather */
__attribute__((target("avx512f"))) static void transpose_f32w(const float *x, int64_t rs, int64_t T,
                                                              int64_t D, float *xt) {
    if (rs > INT32_MAX / 16) { /* (lane offsets in 32 bits) */
        transpose_f32(x, rs, T, D, xt);
        return;
    }
    __m512i at =
        _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                           _mm512_set1_epi32((int)rs));
    for (int64_t t = 0; t < T; t += 16) {
        __mmask16 m = lanes(T - t);
        for (int64_t d = 0; d < D; d++)
            _mm512_mask_storeu_ps(
                xt + d * T + t, m,
                _mm512_mask_i32gather_ps(_mm512_setzero_ps(), m, at, x + t * rs + d, 4));
    }
}
__attribute__((target("avx512f"))) static void grad_row_f32w(const float *pr, float *sr, int64_t n,
                                                             float scale) {
    __m512 dot = _mm512_setzero_ps();
    for (int64_t j = 0; j < n; j += 16) {
        __mmask16 m = lanes(n - j);
        __m512 v =
            _mm512_mul_ps(_mm512_maskz_loadu_ps(m, sr + j), _mm512_maskz_loadu_ps(m, pr + j));
        _mm512_mask_storeu_ps(sr + j, m, v);
        dot = _mm512_add_ps(dot, v);
    }
    __m512 d = _mm512_set1_ps(_mm512_reduce_add_ps(dot)), sc = _mm512_set1_ps(scale);
    for (int64_t j = 0; j < n; j += 16) {
        __mmask16 m = lanes(n - j);
        __m512 v = _mm512_sub_ps(_mm512_maskz_loadu_ps(m, sr + j),
                                 _mm512_mul_ps(_mm512_maskz_loadu_ps(m, pr + j), d));
        _mm512_mask_storeu_ps(sr + j, m, _mm512_mul_ps(v, sc));
    }
}
#endif

/* The kernels of one element type, built with attribute ATTR (an instruction set) on the
 * products of MM and exp EXP. A head's q, k, v and dy are read in place where their elements are
 * contiguous (else copied), k (forward) and v (backward) transposed into scratch:
 *   probs:    query rows [i0, i0 + rows) of a head: the scores of keys [0, n) scaled, masked and
 *             softmaxed into P (rows x n, contiguous): max, exp(s - max), their sum, each
 *             divided by it, as the SOFTMAX op's rows (0 where masked);
 *   forward:  every head into y (B, T, H, D), contiguous, its probabilities into s->kept too
 *             (where kept);
 *   backward: every head's gradient into gx (B, T, 3, H, D), contiguous, from s->kept (or the
 *             probabilities made again, where not kept).
 * Scratch: ATTN_BUF elements. */
#define ATTN_BUF(T, D) (6 * (T) * (D) + 2 * ATTN_ROWS * (T))
#define ATTN_KERNELS(SFX, TYPE, ATTR, MM, SOFTMAX_ROW, GRAD_ROW, TRANSPOSE)                       \
    typedef struct {                                                                              \
        const TYPE *m[4]; /* q, k, v, dy: rows rs[.] apart, elements contiguous */                \
        int64_t rs[4];                                                                            \
        TYPE *kt, *vt; /* k and v transposed (D x T, contiguous) */                               \
    } head_##SFX;                                                                                 \
    ATTR static void gather_##SFX(const attn_shape *s, const TYPE *x, const TYPE *gy, int64_t b,  \
                                  int64_t h, head_##SFX *a, TYPE *buf) {                          \
        int64_t T = s->T, D = s->D;                                                               \
        const int64_t *xs = s->xs, *gs = s->gs;                                                   \
        const TYPE *e = x + b * xs[0] + h * xs[3];                                                \
        const TYPE *src[4] = {e, e + xs[2], e + 2 * xs[2], gy ? gy + b * gs[0] + h * gs[2] : e};  \
        int64_t rs[4] = {xs[1], xs[1], xs[1], gy ? gs[1] : 0};                                    \
        int64_t cs[4] = {xs[4], xs[4], xs[4], gy ? gs[3] : 1};                                    \
        for (int m = 0; m < 4; m++) {                                                             \
            a->m[m] = src[m], a->rs[m] = rs[m];                                                   \
            if (cs[m] == 1)                                                                       \
                continue;                                                                         \
            TYPE *c = buf + m * T * D; /* elements apart: copied, contiguous */                   \
            for (int64_t t = 0; t < T; t++)                                                       \
                for (int64_t d = 0; d < D; d++)                                                   \
                    c[t * D + d] = src[m][t * rs[m] + d * cs[m]];                                 \
            a->m[m] = c, a->rs[m] = D;                                                            \
        }                                                                                         \
        a->kt = buf + 4 * T * D, a->vt = a->kt + T * D;                                           \
        if (!gy ||                                                                                \
            !s->kept) /* the scores' keys (not where the forward's probabilities are kept) */     \
            TRANSPOSE(a->m[1], a->rs[1], T, D, a->kt);                                            \
        if (gy)                                                                                   \
            TRANSPOSE(a->m[2], a->rs[2], T, D, a->vt);                                            \
    }                                                                                             \
    ATTR static void probs_##SFX(const attn_shape *s, const head_##SFX *a, int64_t i0,            \
                                 int64_t rows, int64_t n, TYPE *P) {                              \
        TYPE scale = (TYPE)(1.0 / sqrt((double)s->D));                                            \
        MM(rows, n, s->D, a->m[0] + i0 * a->rs[0], a->rs[0], 1, a->kt, s->T, P, n, false);        \
        for (int64_t r = 0; r < rows; r++)                                                        \
            SOFTMAX_ROW(P + r * n, s->causal ? i0 + r + 1 : n, n, scale);                         \
    }                                                                                             \
    ATTR static void forward_##SFX(const attn_shape *s, const TYPE *x, TYPE *y, TYPE *buf,        \
                                   int64_t lo, int64_t hi) {                                      \
        int64_t T = s->T, D = s->D, H = s->H, ph = probs_a_head(T, s->causal);                    \
        head_##SFX a;                                                                             \
        for (int64_t bh = lo, b = lo / H, h = lo % H; bh < hi; bh++, b = bh / H, h = bh % H) {    \
            gather_##SFX(s, x, NULL, b, h, &a, buf);                                              \
            TYPE *P = s->kept ? (TYPE *)s->kept + (b * H + h) * ph : buf + 6 * T * D;             \
            for (int64_t i0 = 0; i0 < T; i0 += ATTN_ROWS) {                                       \
                int64_t rows = T - i0 < ATTN_ROWS ? T - i0 : ATTN_ROWS;                           \
                int64_t n = s->causal ? i0 + rows : T;                                            \
                probs_##SFX(s, &a, i0, rows, n, P);                                               \
                MM(rows, D, n, P, n, 1, a.m[2], a.rs[2], y + ((b * T + i0) * H + h) * D, H * D,   \
                   false);                                                                        \
                P += s->kept ? rows * n : 0;                                                      \
            }                                                                                     \
        }                                                                                         \
    }                                                                                             \
    ATTR static void backward_##SFX(const attn_shape *s, const TYPE *x, const TYPE *gy, TYPE *gx, \
                                    TYPE *buf, int64_t lo, int64_t hi) {                          \
        int64_t T = s->T, D = s->D, H = s->H, ld = 3 * H * D, ph = probs_a_head(T, s->causal);    \
        TYPE scale = (TYPE)(1.0 / sqrt((double)D));                                               \
        TYPE *Pm = buf + 6 * T * D, *dS = Pm + ATTN_ROWS * T;                                     \
        head_##SFX a;                                                                             \
        for (int64_t bh = lo, b = lo / H, h = lo % H; bh < hi; bh++, b = bh / H, h = bh % H) {    \
            gather_##SFX(s, x, gy, b, h, &a, buf);                                                \
            const TYPE *q = a.m[0], *k = a.m[1], *dy = a.m[3];                                    \
            const TYPE *kept = s->kept ? (const TYPE *)s->kept + (b * H + h) * ph : NULL;         \
            TYPE *gq = gx + (b * T * 3 * H + h) * D, *gk = gq + H * D, *gv = gk + H * D;          \
            /* dk and dv go where they belong in gx: keys a block before reached (seen) add       \
             * to what is there, the others start from zero (as from a zeroed buffer) */          \
            for (int64_t i0 = 0, seen = 0; i0 < T; i0 += ATTN_ROWS) {                             \
                int64_t rows = T - i0 < ATTN_ROWS ? T - i0 : ATTN_ROWS;                           \
                int64_t n = s->causal ? i0 + rows : T;                                            \
                const TYPE *qb = q + i0 * a.rs[0], *dyb = dy + i0 * a.rs[3];                      \
                TYPE *P = Pm; /* the forward's, or made again as it made them */                  \
                if (kept)                                                                         \
                    P = (TYPE *)(uintptr_t)kept, kept += rows * n;                                \
                else                                                                              \
                    probs_##SFX(s, &a, i0, rows, n, P);                                           \
                MM(rows, n, D, dyb, a.rs[3], 1, a.vt, T, dS, n, false); /* dP */                  \
                for (int64_t r = 0; r < rows; r++)                                                \
                    GRAD_ROW(P + r * n, dS + r * n, n, scale);                                    \
                MM(rows, D, n, dS, n, 1, k, a.rs[1], gq + i0 * ld, ld, false); /* dq */           \
                MM(seen, D, rows, dS, 1, n, qb, a.rs[0], gk, ld, true);        /* dk */           \
                MM(n - seen, D, rows, dS + seen, 1, n, qb, a.rs[0], gk + seen * ld, ld, false);   \
                MM(seen, D, rows, P, 1, n, dyb, a.rs[3], gv, ld, true); /* dv */                  \
                MM(n - seen, D, rows, P + seen, 1, n, dyb, a.rs[3], gv + seen * ld, ld, false);   \
                seen = n;                                                                         \
            }                                                                                     \
        }                                                                                         \
    }
ATTN_KERNELS(f64, double, , mm_f64, softmax_row_f64, grad_row_f64, transpose_f64)
ATTN_KERNELS(f32, float, , mm_f32, softmax_row_f32, grad_row_f32, transpose_f32)
#if ATTN_WIDE
ATTN_KERNELS(f32w, float, __attribute__((target("avx512f"))), mm_f32_512, softmax_row_f32w,
             grad_row_f32w, transpose_f32w)
ATTN_KERNELS(f32a, float, __attribute__((target("avx2,fma"))), mm_f32_256, softmax_row_f32a,
             grad_row_f32a, transpose_f32a)
#endif

size_t loom__attention_scratch_bytes(const loom__program *p, int32_t id) {
    const loom__pnode *x = &p->nodes[p->nodes[id].src[0]]; /* qkv (B, T, 3, H, D) */
    return loom__dtype_size((loom_dtype)x->dtype) * (size_t)ATTN_BUF(x->shape[1], x->shape[4]);
}

/* Whether the 8-lane tiles run: AVX2 and FMA without AVX-512 (where loom's AVX-512 products are
 * off by LOOM_MATMUL=blas, the plain loops, as before). */
static bool attn_avx2(void) {
#if ATTN_WIDE
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
           !__builtin_cpu_supports("avx512f");
#else
    return false;
#endif
}

typedef struct {
    const loom__program *p;
    const loom__bind *b;
    attn_shape s;
    const void *xs, *gs;
    void *o;
    bool grad, avx2;
} attn_job;

/* Heads [lo, hi) (of batch row lo / H, head lo % H on) of an attention or its gradient, in worker
 * w's scratch (loom__attention_scratch_bytes). */
static void attention_heads(void *ctx, int64_t lo, int64_t hi, int w) {
    const attn_job *j = ctx;
    const attn_shape *s = &j->s;
    void *buf = loom__scratch_of(j->p, j->b, w);
    bool grad = j->grad;
    if (s->f64)
        grad ? backward_f64(s, j->xs, j->gs, j->o, buf, lo, hi)
             : forward_f64(s, j->xs, j->o, buf, lo, hi);
#if ATTN_WIDE
    else if (loom__use_own_gemm()) /* (loom's AVX-512 products, not LOOM_MATMUL=blas) */
        grad ? backward_f32w(s, j->xs, j->gs, j->o, buf, lo, hi)
             : forward_f32w(s, j->xs, j->o, buf, lo, hi);
    else if (j->avx2) /* (no AVX-512: the 8-lane tiles) */
        grad ? backward_f32a(s, j->xs, j->gs, j->o, buf, lo, hi)
             : forward_f32a(s, j->xs, j->o, buf, lo, hi);
#endif
    else
        grad ? backward_f32(s, j->xs, j->gs, j->o, buf, lo, hi)
             : forward_f32(s, j->xs, j->o, buf, lo, hi);
}

static loom_status attention(const loom__program *p, const loom__bind *b, int32_t id, bool grad) {
    const loom__pnode *t = &p->nodes[id], *x = &p->nodes[t->src[0]];
    const loom__pnode *gy = grad ? &p->nodes[t->src[1]] : NULL;
    attn_job j = {.p = p,
                  .b = b,
                  .s = {.B = x->shape[0],
                        .T = x->shape[1],
                        .H = x->shape[3],
                        .D = x->shape[4],
                        .xs = x->lay.stride,
                        .gs = grad ? gy->lay.stride : NULL,
                        .causal = t->attr.value != 0,
                        .f64 = t->dtype == LOOM_F64},
                  .xs = loom__addr(p, b, t->src[0]),
                  .gs = grad ? loom__addr(p, b, t->src[1]) : NULL,
                  .o = loom__addr(p, b, id),
                  .grad = grad,
                  .avx2 = attn_avx2()};
    int32_t fwd = grad ? t->src[2] : id; /* whose buffer keeps the probabilities, if it does */
    if (loom__attention_keeps(p, fwd))
        j.s.kept = (char *)loom__addr(p, b, fwd) + loom__attention_kept_at(&p->nodes[fwd]);
    /* the heads split across the device's cores, each computed as alone */
    loom__team_for(b->team, j.s.B * j.s.H, 1, attention_heads, &j);
    return LOOM_OK;
}

loom_status loom__k_attention(const loom__program *p, const loom__bind *b, int32_t id) {
    return attention(p, b, id, false);
}

loom_status loom__k_attention_grad(const loom__program *p, const loom__bind *b, int32_t id) {
    return attention(p, b, id, true);
}
