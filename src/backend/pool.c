/*
 * pool.c - max pooling (POOLMAX) and its gradient (POOLGRAD): the general window loops for float
 * and double, the 2x2 stride-2 rows in AVX-512, argmax codes, the ReLU written with the maxima.
 */
#include "kernels.h"

/* ---- max pooling -------------------------------------------------------------------------------
 */

/* POOLMAX: x (N,C,H,W) strided -> y (N,C,OH,OW) contiguous, the first maximum of each window in
 * row-major window order (a NaN wins, as MAX's combine); padded positions are skipped. POOLGRAD
 * finds the same position and adds dy there; dx is contiguous. The 2x2 stride-2 unpadded window
 * on unit-stride rows, the most common, has its own loop. */

#ifdef HAVE_POOL512
/* The 2x2 stride-2 window's rows in AVX-512, 16 windows at a time: the two input rows are loaded
 * 32 floats each and split into even and odd columns (a, b from the upper row, c, d from the
 * lower), and the same rule as the scalar rows picks the first maximum (a NaN wins): bitwise the
 * scalar kernels' results, about ten times fewer instructions. */
const int32_t loom__pool_even[16] = {0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30};
static const int32_t pool_lo[16] = {0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23};

__attribute__((target("avx512f"))) static inline void pool_split(const float *r, int n,
                                                                 __m512 *even, __m512 *odd) {
    __mmask16 m0 = (__mmask16)(n >= 8 ? 0xffff : (1u << (2 * n)) - 1);
    __mmask16 m1 = (__mmask16)(n <= 8 ? 0 : (1u << (2 * (n - 8))) - 1);
    __m512 lo = _mm512_maskz_loadu_ps(m0, r), hi = _mm512_maskz_loadu_ps(m1, r + 16);
    __m512i ie = _mm512_loadu_si512(loom__pool_even),
            io = _mm512_add_epi32(ie, _mm512_set1_epi32(1));
    *even = _mm512_permutex2var_ps(lo, ie, hi);
    *odd = _mm512_permutex2var_ps(lo, io, hi);
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

/* How the any-window forms read a window place's inputs for a vector of windows: one load for
 * unit strides, two split into even and odd columns for stride 2 over unit columns, a gather. */
typedef enum { POOL_LOAD, POOL_SPLIT, POOL_GATHER } pool_load;
static inline pool_load pool_load_of(int64_t cs, const loom_window *w) {
    return cs != 1 ? POOL_GATHER : w->sw == 1 ? POOL_LOAD : w->sw == 2 ? POOL_SPLIT : POOL_GATHER;
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
    const __m512i ie = _mm512_loadu_si512(loom__pool_even);
    pool_load how = pool_load_of(cs, w);
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
                        how == POOL_LOAD ? _mm512_maskz_loadu_ps(ok[j], r)
                        : how == POOL_SPLIT
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

#ifdef HAVE_POOL512
/* The 2x2 stride-2 rows keeping codes in AVX2, 8 windows at a time (the last ones masked): the
 * two input rows are loaded 16 floats each and split into even and odd columns (a, b above, c,
 * d below), and the scalar rule in its order picks the first maximum (a NaN wins) and its place:
 * the scalar rows' maxima and codes. For CPUs with AVX2 but not AVX-512, where the scalar rows
 * branch on every comparison (about a misprediction a window on real data). */
__attribute__((target("avx2"))) static inline void pool2_split8(const float *r, int n, __m256 *even,
                                                                __m256 *odd) {
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    __m256i m0 = _mm256_cmpgt_epi32(_mm256_set1_epi32(2 * n), lane); /* floats 0-7 */
    __m256i m1 = _mm256_cmpgt_epi32(_mm256_set1_epi32(2 * n - 8), lane);
    __m256 lo = _mm256_maskload_ps(r, m0), hi = _mm256_maskload_ps(r + 8, m1);
    const __m256i ev = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
    lo = _mm256_permutevar8x32_ps(lo, ev), hi = _mm256_permutevar8x32_ps(hi, ev);
    *even = _mm256_permute2f128_ps(lo, hi, 0x20), *odd = _mm256_permute2f128_ps(lo, hi, 0x31);
}
__attribute__((target("avx2"))) static void pool2_codes_avx2(const float *r0, const float *r1,
                                                             int64_t ow, float *o, uint8_t *cr) {
    for (int64_t x0 = 0; x0 < ow; x0 += 8) {
        int n = (int)(ow - x0 < 8 ? ow - x0 : 8);
        __m256 a, b, c, d;
        pool2_split8(r0 + 2 * x0, n, &a, &b);
        pool2_split8(r1 + 2 * x0, n, &c, &d);
        __m256 q1 =
            _mm256_or_ps(_mm256_cmp_ps(b, a, _CMP_GT_OQ), _mm256_cmp_ps(b, b, _CMP_UNORD_Q));
        __m256 m = _mm256_blendv_ps(a, b, q1);
        __m256 q2 =
            _mm256_or_ps(_mm256_cmp_ps(c, m, _CMP_GT_OQ), _mm256_cmp_ps(c, c, _CMP_UNORD_Q));
        m = _mm256_blendv_ps(m, c, q2);
        __m256 q3 =
            _mm256_or_ps(_mm256_cmp_ps(d, m, _CMP_GT_OQ), _mm256_cmp_ps(d, d, _CMP_UNORD_Q));
        m = _mm256_blendv_ps(m, d, q3);
        __m256i code = _mm256_and_si256(_mm256_castps_si256(q1), _mm256_set1_epi32(1));
        code = _mm256_blendv_epi8(code, _mm256_set1_epi32(2), _mm256_castps_si256(q2));
        code = _mm256_blendv_epi8(code, _mm256_set1_epi32(3), _mm256_castps_si256(q3));
        int32_t c8[8];
        _mm256_storeu_si256((__m256i *)(void *)c8, code);
        if (n == 8)
            _mm256_storeu_ps(o + x0, m);
        else
            _mm256_maskstore_ps(
                o + x0,
                _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)),
                m);
        for (int k = 0; k < n; k++)
            cr[x0 + k] = (uint8_t)c8[k];
    }
}
#endif
static void pool2_row_codes_float(const float *restrict r0, const float *restrict r1, int64_t ow,
                                  float *restrict o, uint8_t *restrict cr);
/* pool2_row_codes_float, in AVX2 where the CPU has it */
static void pool2_codes_float(const float *r0, const float *r1, int64_t ow, float *o, uint8_t *cr) {
#ifdef HAVE_POOL512
    if (__builtin_cpu_supports("avx2")) {
        pool2_codes_avx2(r0, r1, ow, o, cr);
        return;
    }
#endif
    pool2_row_codes_float(r0, r1, ow, o, cr);
}

#define PLANE_float  loom__pool2_grad_plane_float
#define PLANE_double pool2_grad_plane_double
#define CODES_float  pool2_codes_float
#define CODES_double pool2_row_codes_double
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
    /* ... and its argmax codes (a window's place, 0-3, as pool_argmax gives them) too: the 2x2   \
     * windows' codes where the AVX-512 rows are not there to keep them. */                       \
    static void pool2_row_codes_##T(const T *restrict r0, const T *restrict r1, int64_t ow,       \
                                    T *restrict o, uint8_t *restrict cr) {                        \
        for (int64_t ox = 0; ox < ow; ox++) {                                                     \
            T a = r0[2 * ox], b = r0[2 * ox + 1], c = r1[2 * ox], d = r1[2 * ox + 1];             \
            int q1 = (b > a) | (b != b);                                                          \
            T m = q1 ? b : a;                                                                     \
            int q2 = (c > m) | (c != c);                                                          \
            m = q2 ? c : m;                                                                       \
            int q3 = (d > m) | (d != d);                                                          \
            o[ox] = q3 ? d : m;                                                                   \
            cr[ox] = (uint8_t)(q3 ? 3 : q2 ? 2 : q1);                                             \
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
    void loom__pool_##T(const loom_window *w, const int64_t *xs, const int64_t *xst,              \
                        const int64_t *ys, const T *x, const T *dy, const int64_t *dyst, T *out,  \
                        bool grad, uint8_t *codes, bool relu,                                     \
                        void (*done)(void *, int64_t, const T *), T *(*place)(void *, int64_t),   \
                        void *ctx) {                                                              \
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
            grad && k2 && codes && sizeof(T) == 4 && loom__pool_gtab_init(&gtab, H, W, OH, OW);   \
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
                    PLANE_##T(&gtab, gp, codes + (n * C + c) * OH * OW, relu, op, OH * OW);       \
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
                    bool fast = false;                                                            \
                    if (!grad && cp && !relu && loom__pool2x2(w, xst[3])) {                       \
                        for (int64_t oy = 0; oy < OH; oy++) /* 2x2 rows keeping codes */          \
                            CODES_##T(xp + 2 * oy * xst[2], xp + (2 * oy + 1) * xst[2], OW,       \
                                      op + oy * OW, cp + oy * OW);                                \
                        fast = true;                                                              \
                    }                                                                             \
                    fast =                                                                        \
                        fast || (!grad && pool_any_##T(xp, xst, H, W, w, OH, OW, op, cp, relu));  \
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
bool loom__pool512(void) {
#ifdef HAVE_POOL512
    return __builtin_cpu_supports("avx512f");
#else
    return false;
#endif
}
bool loom__pool_codes_available(void) {
    return loom__pool512();
}
bool loom__pool_codes_ok(const loom_window *w, int64_t row_stride, loom_dtype dt) {
    (void)row_stride, (void)dt;  /* (2x2 windows off the AVX-512 rows: by the general loops) */
    return w->kh * w->kw <= 256; /* a window's place in a byte */
}
bool loom__pool_relu_ok(const loom_window *w, int64_t row_stride) {
    return loom__pool2x2(w, row_stride) ? loom__pool512() : w->kh * w->kw <= 128; /* (bit 7 free) */
}
#ifdef HAVE_POOL512
/* pool_any_plane512 in AVX2, 8 windows of a row at a time: each window place (i, j) a vector of
 * the 8 windows' inputs (a masked load for unit strides, two masked loads of the even columns
 * split for stride 2 over unit columns, a gather otherwise; places in the padding masked off),
 * taken where no place has been yet, where it is greater or where it is a NaN: the scalar rule
 * in the scalar order, so the same maxima and codes (or NULL). */
__attribute__((target("avx2"))) static void pool_any_plane256(const float *x, int64_t rs,
                                                              int64_t cs, int64_t H, int64_t W,
                                                              const loom_window *w, int64_t OH,
                                                              int64_t OW, float *o, uint8_t *codes,
                                                              bool relu) {
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i ev = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
    const __m256i even = _mm256_setr_epi32(-1, 0, -1, 0, -1, 0, -1, 0);
    pool_load how = pool_load_of(cs, w);
    __m256i ok[256], lo[256], hi[256], off[256]; /* per window column j: the lanes it reads,
                                                  * as floats 0-7 and 8-15 of a split, the
                                                  * offsets of a gather */
    for (int64_t x0 = 0; x0 < OW; x0 += 8) {
        int n = (int)(OW - x0 < 8 ? OW - x0 : 8);
        __m256i mn = _mm256_cmpgt_epi32(_mm256_set1_epi32(n), lane);
        __m256i cx =
            _mm256_sub_epi32(/* each lane's window's first column */
                             _mm256_mullo_epi32(_mm256_add_epi32(lane, _mm256_set1_epi32((int)x0)),
                                                _mm256_set1_epi32(w->sw)),
                             _mm256_set1_epi32(w->pw));
        for (int j = 0; j < w->kw; j++) {
            __m256i ix = _mm256_add_epi32(cx, _mm256_set1_epi32(j));
            ok[j] = _mm256_and_si256(
                mn, _mm256_andnot_si256(_mm256_cmpgt_epi32(_mm256_setzero_si256(), ix),
                                        _mm256_cmpgt_epi32(_mm256_set1_epi32((int)W), ix)));
            /* float 2k of the split reads lane k: lanes 0-3 in floats 0-7, 4-7 in 8-15 */
            __m256i l =
                _mm256_permutevar8x32_epi32(ok[j], _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3));
            __m256i h =
                _mm256_permutevar8x32_epi32(ok[j], _mm256_setr_epi32(4, 4, 5, 5, 6, 6, 7, 7));
            lo[j] = _mm256_and_si256(l, even), hi[j] = _mm256_and_si256(h, even);
            off[j] = _mm256_mullo_epi32(ix, _mm256_set1_epi32((int)cs));
        }
        for (int64_t oy = 0; oy < OH; oy++) {
            __m256 have = _mm256_setzero_ps(), acc = _mm256_setzero_ps();
            __m256i code = _mm256_setzero_si256();
            for (int i = 0; i < w->kh; i++) {
                int64_t iy = oy * w->sh - w->ph + i;
                if (iy < 0 || iy >= H)
                    continue;
                const float *row = x + iy * rs;
                for (int j = 0; j < w->kw; j++) {
                    __m256 a, okf = _mm256_castsi256_ps(ok[j]);
                    if (how == POOL_LOAD)
                        a = _mm256_maskload_ps(row + x0 - w->pw + j, ok[j]);
                    else if (how == POOL_SPLIT) {
                        const float *r = row + 2 * x0 - w->pw + j; /* lane 0's column */
                        __m256 l8 = _mm256_permutevar8x32_ps(_mm256_maskload_ps(r, lo[j]), ev);
                        __m256 h8 = _mm256_permutevar8x32_ps(_mm256_maskload_ps(r + 8, hi[j]), ev);
                        a = _mm256_permute2f128_ps(l8, h8, 0x20);
                    } else
                        a = _mm256_mask_i32gather_ps(_mm256_setzero_ps(), row, off[j], okf, 4);
                    __m256 take = _mm256_and_ps(
                        okf, _mm256_or_ps(_mm256_andnot_ps(have, okf),
                                          _mm256_or_ps(_mm256_cmp_ps(a, acc, _CMP_GT_OQ),
                                                       _mm256_cmp_ps(a, a, _CMP_UNORD_Q))));
                    acc = _mm256_blendv_ps(acc, a, take);
                    code = _mm256_blendv_epi8(code, _mm256_set1_epi32(i * w->kw + j),
                                              _mm256_castps_si256(take));
                    have = _mm256_or_ps(have, okf);
                }
            }
            if (relu) { /* the ReLU (a NaN stays), bit 7 of the code where it passes */
                __m256 pass = _mm256_cmp_ps(acc, _mm256_setzero_ps(), _CMP_GT_OQ);
                acc = _mm256_blendv_ps(acc, _mm256_setzero_ps(),
                                       _mm256_cmp_ps(acc, _mm256_setzero_ps(), _CMP_LE_OQ));
                code = _mm256_or_si256(
                    code, _mm256_and_si256(_mm256_castps_si256(pass), _mm256_set1_epi32(0x80)));
            }
            _mm256_maskstore_ps(o + oy * OW + x0, mn, acc);
            int32_t c8[8];
            _mm256_storeu_si256((__m256i *)(void *)c8, code);
            for (int k = 0; codes && k < n; k++)
                codes[oy * OW + x0 + k] = (uint8_t)c8[k];
        }
    }
}
#endif

/* A plane of max pooling over any window by pool_any_plane512 (AVX-512) or pool_any_plane256
 * (AVX2); false: by the scalar loops. */
static bool pool_any_float(const float *x, const int64_t *xst, int64_t H, int64_t W,
                           const loom_window *w, int64_t OH, int64_t OW, float *o, uint8_t *codes,
                           bool relu) {
#ifdef HAVE_POOL512
    if (loom__pool512() && w->kw <= 256 && W <= INT32_MAX / 4 && xst[3] * W <= INT32_MAX / 4) {
        pool_any_plane512(x, xst[2], xst[3], H, W, w, OH, OW, o, codes, relu);
        return true;
    }
    if (__builtin_cpu_supports("avx2") && w->kw <= 256 && W <= INT32_MAX / 4 &&
        xst[3] * W <= INT32_MAX / 4) {
        pool_any_plane256(x, xst[2], xst[3], H, W, w, OH, OW, o, codes, relu);
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
    if (loom__pool512() && OW < 16 && OH * OW <= POOL_PLANES_MAX && xst[3] == 1 && xst[2] == W &&
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
bool loom__pool_gtab_init(pool_gtab *t, int64_t H, int64_t W, int64_t OH, int64_t OW) {
    if (!loom__pool512() || OH * OW > 32 || H * W > 16 * 16)
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

void loom__pool2_grad_rows_float(const float *gy, const uint8_t *codes, bool relu, int64_t H,
                                 int64_t W, int64_t OH, int64_t OW, int64_t y0, int64_t y1,
                                 bool last, float *o) {
#ifdef HAVE_POOL512
    for (int64_t oy = y0; oy < y1; oy++) { /* as pool_kernel's rows write them */
        float *o0 = o + 2 * oy * W;
        pool2_grad_row512(NULL, NULL, OW, gy + oy * OW, o0, o0 + W, codes + oy * OW, relu);
        if (W > 2 * OW)
            o0[W - 1] = o0[2 * W - 1] = 0.0f;
    }
    if (last && H > 2 * OH)
        memset(o + (H - 1) * W, 0, sizeof(float) * (size_t)W);
#else
    (void)gy, (void)codes, (void)relu, (void)H, (void)W, (void)OH, (void)OW, (void)y0, (void)y1;
    (void)last, (void)o;
#endif
}

void loom__pool2_grad_plane_float(const pool_gtab *t, const float *gy, const uint8_t *codes,
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
    if (loom__pool512()) {
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
    if (loom__pool512()) {
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

/* A max pooling or its gradient: what pool_kernel hands pool_images. */
typedef struct {
    const loom__pnode *t, *x;
    const int64_t *ys, *dyst;
    const void *xv, *dy;
    void *o;
    bool grad, relu, epi, place;
    uint8_t *codes;
    epilogue *e;
} pool_job;

/* Images [n0, n1) of the batch: their planes' maxima (or gradients) and codes, each image's its
 * own. */
static void pool_images(void *ctx, int64_t n0, int64_t n1, int w) {
    const pool_job *j = ctx;
    const loom__pnode *t = j->t, *x = j->x;
    const int64_t *xst = x->lay.stride, *ys = j->ys;
    int64_t xs[4] = {n1 - n0, x->shape[1], x->shape[2], x->shape[3]}, C = xs[1];
    int64_t oplane = j->grad ? xs[2] * xs[3] : ys[2] * ys[3];
    size_t es = loom__dtype_size((loom_dtype)t->dtype);
    const char *xv = (const char *)j->xv + (size_t)(n0 * xst[0]) * es;
    const char *dy = j->dy ? (const char *)j->dy + (size_t)(n0 * j->dyst[0]) * es : NULL;
    char *o = (char *)j->o + (j->epi ? 0 : (size_t)(n0 * C * oplane) * es);
    uint8_t *codes = j->codes ? j->codes + n0 * C * ys[2] * ys[3] : NULL;
    (void)w;
    if (t->dtype == LOOM_F64)
        loom__pool_double(&t->attr.win, xs, xst, ys, (const double *)(const void *)xv,
                          (const double *)(const void *)dy, j->dyst, (double *)(void *)o, j->grad,
                          codes, false, NULL, NULL, NULL);
    else
        loom__pool_float(&t->attr.win, xs, xst, ys, (const float *)(const void *)xv,
                         (const float *)(const void *)dy, j->dyst, (float *)(void *)o, j->grad,
                         codes, j->relu, j->epi ? loom__plane_done : NULL,
                         j->place ? loom__plane_place : NULL, j->e);
}

static loom_status pool_kernel(const loom__program *p, const loom__bind *b, int32_t id, bool grad) {
    const loom__pnode *t = &p->nodes[id], *x = &p->nodes[t->src[0]];
    int32_t dn = grad ? loom__pool_dy(p, id) : -1; /* the gradient read */
    int32_t relu = loom__pool_relu_of(p, id), codes_of = loom__pool_codes_of(p, id);
    const loom__form *sk = loom__sinks_of(p, id);
    const loom__pnode *y = grad ? &p->nodes[dn] : t;
    const void *dy = NULL;
    int64_t dyst[MAXD] = {0};
    if (grad) { /* planes of dy contiguous, any order (else made contiguous in the scratch) */
        const loom__pnode *d = &p->nodes[dn];
        loom__contiguous_strides(4, d->shape, dyst);
        dy = loom__addr(p, b, dn);
        if (d->lay.stride[3] == 1 && d->lay.stride[2] == d->shape[3])
            memcpy(dyst, d->lay.stride, sizeof(int64_t) * 4);
        else {
            int64_t own =
                loom__pool_by_plane(p, id) ? t->shape[2] * t->shape[3] : loom__numel(4, t->shape);
            void *tmp = b->ws + t->ws_off + (size_t)own * loom__dtype_size((loom_dtype)t->dtype);
            loom__strided_copy(tmp, dy, &d->lay, 4, d->shape,
                               loom__dtype_size((loom_dtype)t->dtype));
            dy = tmp;
        }
    }
    const void *xv = loom__addr(p, b, t->src[0]);
    void *o = loom__addr(p, b, id);
    epilogue e = {0};
    if (t->epi >= 0 || sk) { /* a plane at a time, each then through the epilogue */
        loom__epilogue_init(&e, p, b, id);
        e.plane = t->shape[2] * t->shape[3];
        o = b->ws + t->ws_off;
    }
    uint8_t *codes = loom__pool_keeps_codes(p, id) ? loom__pool_codes(p, b, id)
                     : codes_of >= 0               ? loom__pool_codes(p, b, codes_of)
                                                   : NULL;
    if (relu >= 0) /* the ReLU's output, not its own */
        o = loom__addr(p, b, relu);
    pool_job j = {.t = t,
                  .x = x,
                  .ys = y->shape,
                  .xv = xv,
                  .dy = dy,
                  .dyst = dyst,
                  .o = o,
                  .grad = grad,
                  .codes = codes,
                  .relu = relu >= 0 || loom__form_get(p, id, LOOM_FORM_RELU_DY),
                  .e = &e,
                  .epi = t->epi >= 0 || sk,
                  .place = t->epi < 0 && sk && e.cols % e.plane == 0};
    /* the batch's images split across the device's cores (not with an epilogue, which takes the
     * planes in order, nor on the AVX-512 rows, which take 16 planes at a time: not yet) */
    bool split = !j.epi && !loom__pool512() &&
                 (double)loom__numel(4, x->shape) * (grad ? 2 : 1) >= LOOM_SPLIT_MIN;
    loom__team_for(split ? b->team : NULL, x->shape[0], 1, pool_images, &j);
    return LOOM_OK;
}

loom_status loom__k_poolmax(const loom__program *p, const loom__bind *b, int32_t id) {
    return pool_kernel(p, b, id, false);
}
loom_status loom__k_poolgrad(const loom__program *p, const loom__bind *b, int32_t id) {
    return pool_kernel(p, b, id, true);
}
