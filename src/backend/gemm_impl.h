/*
 * backend/gemm_impl.h - what loom's sgemm files share (gemm.c, gemm_dot.c, gemm_planes.c): the
 * blocking, the packing of panels and the register transpose. Never installed.
 */
#ifndef LOOM_BACKEND_GEMM_IMPL_H
#define LOOM_BACKEND_GEMM_IMPL_H

#include "internal.h"

#define MR      8
#define NR      48  /* the widest panel (panel_at) */
#define KC      192 /* a 48-wide B micro-panel of KC rows, 36 KB, stays in the 48 KB L1 */
#define MC      144
#define NC      LOOM_GEMM_NC
/* floats of packed A: a block, or all of A packed once (up to PA_ONCE where A could be read in
 * place, else up to PA: a transposed A, a weight gradient's, is then packed once for every column
 * block instead of once for each; bench/RESULTS.md) */
#define PA_ONCE (2 * (MC + MR) * KC)
#define PA      (8 * (MC + MR) * KC)

#if defined(__x86_64__) && defined(__GNUC__)
#    include <immintrin.h>
#    define LOOM_GEMM512 1 /* the AVX-512 kernels are built (and run where the CPU has them) */

/* gemm_pack.c: an operand packed into panels (and loom__gd_offsets, internal.h). */
/* lanes lanes of kc k each (lane i, k at src + i rs + k ks) packed into panels w lanes wide. */
void loom__gemm_pack(int64_t lanes, int64_t kc, const float *src, int64_t rs, int64_t ks, int64_t w,
                     float *dst);
/* The dot form's blocks of k, tiles, the most elements of C it takes, and where its packs start
 * in the scratch (and how many columns of B fit there, for a B not contiguous along k). */
#    define SK_KB      1024
#    define SK_MI      4
#    define SK_NJ      5   /* 20 accumulators: no register spills */
#    define SK_MAX     512 /* M x N at most (lane buffer 32 KB) */
#    define SK_PACK_AT (sizeof(float) * (MC + MR) * KC + 64)
#    define SK_PACK_N                                                                   \
        ((int64_t)((loom__gemm_scratch_bytes() - SK_PACK_AT - sizeof(int64_t) * SK_KB - \
                    sizeof(float *) * SK_MAX - 64) /                                    \
                   (sizeof(float) * SK_KB)))
/* Packs lanes [i0, i0 + lanes) x k [k0, k0 + kc) of operand x (lanes along dimension ld, k along
 * kd) into panels of w lanes; koff and loff are scratch. */
void loom__gemm_pack_g(const float *x, const loom__gdim *ld, int64_t i0, int64_t lanes,
                       const loom__gdim *kd, int64_t k0, int64_t kc, int64_t w, float *dst,
                       int64_t *koff, int64_t *loff);
/* gemm_dot.c: the dot form (C's elements as dot products along K) and the dot-rows form (the same,
 * a few rows of A at a time), C at c + crow(i) + ccol(j). */
void loom__skinny_gemm(int64_t M, int64_t N, int64_t K, const loom__gmat *a, const loom__gmat *b,
                       float *c, const loom__gdim *crow, const loom__gdim *ccol, bool accumulate,
                       void *scratch);
void loom__narrow_gemm(int64_t M, int64_t N, int64_t K, const loom__gmat *a, const loom__gmat *b,
                       float *c, const loom__gdim *crow, const loom__gdim *ccol, bool accumulate,
                       void *scratch);
/* The 16 x 16 transpose in registers: unpacks, then 128-bit lane shuffles. */
__attribute__((target("avx512f"))) static inline void loom__transpose16(__m512 *r) {
    __m512 t[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        __m512d a = _mm512_castps_pd(t[i]), b = _mm512_castps_pd(t[i + 1]);
        __m512d c = _mm512_castps_pd(t[i + 2]), d = _mm512_castps_pd(t[i + 3]);
        r[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
        r[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
        r[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
        r[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
    }
    for (int i = 0; i < 4; i++) {
        t[i] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0x88);
        t[i + 4] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0xdd);
        t[i + 8] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0x88);
        t[i + 12] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0xdd);
    }
    for (int i = 0; i < 8; i++) {
        r[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
        r[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xdd);
    }
}

#endif
#endif
