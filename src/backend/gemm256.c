/*
 * gemm256.c - loom's float32 product for CPUs with AVX2 and FMA but not AVX-512 (gemm.c's kernels
 * need AVX-512): C = A B for row-major operands, each read as stored or transposed (as
 * cblas_sgemm takes them). BLIS-style, at 8 lanes: B in panels of KC x 16 columns (a block of NC
 * columns at a time), A in panels of 6 rows, and a 6 x 16 register-blocked microkernel (12
 * accumulators, two loads and six broadcasts per k) does the arithmetic with FMA. A contiguous
 * along k has its rows broadcast where they lie (unless they alias in L1); A stored transposed is
 * packed. B is always packed: row by row in memory order where stored (k x n), through 8 x 8
 * register transposes where stored transposed. Ragged edges are padded with zeros. Where C is
 * narrow, or A has few rows and B would be packed transposing (loom__sgemm256), C^T = B^T A^T is
 * computed instead.
 *
 * Every element of C is summed in one order: a chain of FMAs over k ascending from zero within
 * each block of k (K in equal blocks of at most KC), each block's sum added to the blocks' before
 * it. The order depends on K alone, not on M, N, the blocks, the transposition or which part of C
 * a call computes: a product split by rows or columns across a device's cores has the whole
 * product's bits, and so does a row computed in a ragged tile.
 */
#include "internal.h"

#include <string.h>

#define MR 6
#define NR 16
#define KC 256 /* a 16-wide B micro-panel of KC rows (16 KB) and a 6-row A panel fit the L1 */
#define MC 144 /* an A block of MC x KC (147 KB) stays in the L2 */
#define NC 1024

size_t loom__gemm256_scratch_bytes(void) {
    return sizeof(float) * ((size_t)(MC + MR) * KC + (size_t)KC * (NC + NR) + MR * NR) + 64;
}

#if defined(__x86_64__) && defined(__GNUC__)
#    include <immintrin.h>

bool loom__gemm256_available(void) {
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

/* A 6 x 16 tile of C (rows ldc apart) = (or += with accumulate) A's 6 rows x B's 16 columns over
 * kc: A(r, k) at pa[r AS + k AK] (a packed panel: AS 1, AK 6; in place: AS lda, AK 1), B(k, j)
 * packed at pb[k NR + j]. C's rows are prefetched while the chains run. The accumulators are named
 * one by one (FMA2): gcc keeps an array of them in memory, storing after every FMA. */
#    define FMA2(R, AS, AK)                                   \
        av = _mm256_broadcast_ss(pa + (R) * (AS) + k * (AK)); \
        c##R##0 = _mm256_fmadd_ps(av, b0, c##R##0), c##R##1 = _mm256_fmadd_ps(av, b1, c##R##1)
#    define MICRO(SUF, AS, AK)                                                                    \
        __attribute__((target("avx2,fma"))) static void micro##SUF(                               \
            int64_t kc, const float *pa, int64_t lda, const float *pb, float *c, int64_t ldc,     \
            bool accumulate) {                                                                    \
            (void)lda;                                                                            \
            for (int r = 0; r < MR; r++) {                                                        \
                _mm_prefetch((const char *)(c + r * ldc), _MM_HINT_T0);                           \
                _mm_prefetch((const char *)(c + r * ldc + NR - 1), _MM_HINT_T0);                  \
            }                                                                                     \
            __m256 z = _mm256_setzero_ps(), c00 = z, c01 = z, c10 = z, c11 = z, c20 = z, c21 = z, \
                   c30 = z, c31 = z, c40 = z, c41 = z, c50 = z, c51 = z;                          \
            _Pragma("GCC unroll 4") for (int64_t k = 0; k < kc; k++, pb += NR) {                  \
                __m256 b0 = _mm256_loadu_ps(pb), b1 = _mm256_loadu_ps(pb + 8), av;                \
                FMA2(0, AS, AK);                                                                  \
                FMA2(1, AS, AK);                                                                  \
                FMA2(2, AS, AK);                                                                  \
                FMA2(3, AS, AK);                                                                  \
                FMA2(4, AS, AK);                                                                  \
                FMA2(5, AS, AK);                                                                  \
            }                                                                                     \
            __m256 acc[MR * 2] = {c00, c01, c10, c11, c20, c21, c30, c31, c40, c41, c50, c51};    \
            for (int r = 0; r < MR; r++)                                                          \
                for (int v = 0; v < 2; v++) {                                                     \
                    float *d = c + r * ldc + 8 * v;                                               \
                    __m256 x = acc[2 * r + v];                                                    \
                    _mm256_storeu_ps(d, accumulate ? _mm256_add_ps(_mm256_loadu_ps(d), x) : x);   \
                }                                                                                 \
        }
MICRO(_p, 1, MR)
MICRO(_d, lda, 1)

/* The 8 x 8 transpose of r's rows, in registers. */
__attribute__((target("avx2,fma"))) static inline void transpose8(__m256 *r) {
    __m256 t[8], u[8];
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
        u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
        u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xee);
        u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xee);
    }
    for (int i = 0; i < 4; i++) {
        r[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
        r[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
    }
}

/* k [k0, kc) of a panel w lanes wide, one element at a time: lane r's element k (r < lanes) from
 * x[r ls + k ks] to dst[k w + r], the lanes past `lanes` zeros (a pack's edges and rests). */
static void pack_rest(const float *x, int64_t ls, int64_t ks, int64_t lanes, int64_t w, int64_t k0,
                      int64_t kc, float *dst) {
    for (int64_t k = k0; k < kc; k++) {
        int64_t r = 0;
        for (; r < lanes; r++)
            dst[k * w + r] = x[r * ls + k * ks];
        for (; r < w; r++)
            dst[k * w + r] = 0;
    }
}

/* Six floats at p: the low four of v, then its fifth and sixth (as 64 bits: p need not be
 * aligned to a double, so not _mm_store_sd). */
__attribute__((target("avx2,fma"))) static inline void store6(float *p, __m256 v) {
    _mm_storeu_ps(p, _mm256_castps256_ps128(v));
    _mm_storel_epi64((__m128i_u *)(p + 4), _mm_castps_si128(_mm256_extractf128_ps(v, 1)));
}

/* Rows [0, m) (m <= MR, padded with zero rows) x k [0, kc) of A (A(i, k) at a[i ars + k aks])
 * as a panel: A(r, k) at pa[k MR + r]. Whole panels: six floats a k where A is stored
 * transposed (ars 1), 8 x 8 register transposes of its six rows where A's rows are contiguous. */
__attribute__((target("avx2,fma"))) static void pack_a(const float *a, int64_t ars, int64_t aks,
                                                       int64_t m, int64_t kc, float *pa) {
    int64_t k = 0;
    if (m == MR && ars == 1)
        for (; k < kc; k++)
            _mm_storeu_ps(pa + k * MR, _mm_loadu_ps(a + k * aks)),
                _mm_storel_epi64((__m128i_u *)(pa + k * MR + 4),
                                 _mm_loadl_epi64((const __m128i_u *)(a + k * aks + 4)));
    if (m == MR && aks == 1)
        for (; k + 8 <= kc; k += 8) {
            __m256 r[8];
            for (int i = 0; i < 8; i++)
                r[i] = i < MR ? _mm256_loadu_ps(a + i * ars + k) : _mm256_setzero_ps();
            transpose8(r);
            for (int q = 0; q < 8; q++)
                store6(pa + (k + q) * MR, r[q]);
        }
    pack_rest(a, ars, aks, m, MR, k, kc, pa);
}

/* Columns [0, n) (n <= NR, padded with zero columns) x k [0, kc) of B (B(k, j) at
 * b[k bks + j bjs]) as a panel: B(k, j) at pb[k NR + j]. A whole panel of B stored transposed
 * (bks 1) goes 8 x 8 through registers. */
__attribute__((target("avx2,fma"))) static void pack_b(const float *b, int64_t bks, int64_t bjs,
                                                       int64_t n, int64_t kc, float *pb) {
    int64_t k = 0;
    if (bks == 1 && n == NR)
        for (; k + 8 <= kc; k += 8)
            for (int h = 0; h < 2; h++) {
                __m256 r[8];
                for (int j = 0; j < 8; j++)
                    r[j] = _mm256_loadu_ps(b + (8 * h + j) * bjs + k);
                transpose8(r);
                for (int q = 0; q < 8; q++)
                    _mm256_storeu_ps(pb + (k + q) * NR + 8 * h, r[q]);
            }
    pack_rest(b, bjs, bks, n, NR, k, kc, pb);
}

/* Columns [0, nc) x k [0, kc) of B stored (k x n) (B(k, j) at b[k ldb + j]) as panels of NR
 * (panel q's B(k, j) at pb[q NR kc + k NR + j]): a row of B at a time, so that B is read in order
 * (a panel at a time, each k would be a new page the prefetchers do not reach), and the row
 * PF_ROWS below prefetched as it goes, a line a panel: each row is a new stream, whose first lines
 * the prefetchers miss (a convolution's forward, 32 x 100352 x 144: 60 -> 64 GFLOP/s, bench_gemm
 * alternating). */
#    define PF_ROWS 2
__attribute__((target("avx2,fma"))) static void pack_b_rows(const float *b, int64_t ldb, int64_t nc,
                                                            int64_t kc, float *pb) {
    int64_t full = nc / NR * NR;
    for (int64_t k = 0; k < kc; k++) {
        const float *row = b + k * ldb;
        float *d = pb + k * NR;
        const float *ahead = row + PF_ROWS * ldb;
        bool pf = k + PF_ROWS < kc;
        for (int64_t j = 0; j < full; j += NR, d += NR * kc) {
            if (pf)
                _mm_prefetch((const char *)(ahead + j), _MM_HINT_T0);
            _mm256_storeu_ps(d, _mm256_loadu_ps(row + j)),
                _mm256_storeu_ps(d + 8, _mm256_loadu_ps(row + j + 8));
        }
    }
    if (full < nc) /* the ragged last panel, padded */
        pack_b(b + full, ldb, 1, nc - full, kc, pb + full * kc);
}

typedef struct {
    int64_t ars, aks, bks, bjs, crs, ccs; /* A(i, k) at a[i ars + k aks]; B's, C's likewise */
} strides;

/* Rows [0, mc) of C (its columns [0, nc)) for a k block of kc: B's panels packed at pb, A in
 * place or packed into pa. A tile that C's layout does not take whole (ragged, or C stored
 * transposed) goes through tile and is then added or copied element by element. */
static void block(int64_t mc, int64_t nc, int64_t kc, const float *a, const strides *s,
                  const float *pb, float *pa, float *tile, float *c, bool accumulate) {
    /* in place unless transposed, or its rows a multiple of 4 KB apart and read for more than
     * two panels of B: the same lines of six rows would then share an L1 set with the B panel's
     * (8 ways), and evict each other before the next panel reads them */
    bool a_in_place = s->aks == 1 && (s->ars % 1024 != 0 || nc <= 2 * NR);
    int64_t full = mc / MR * MR;
    if (!a_in_place)
        for (int64_t ir = 0; ir < mc; ir += MR)
            pack_a(a + ir * s->ars, s->ars, s->aks, mc - ir < MR ? mc - ir : MR, kc, pa + ir * kc);
    else if (full < mc) /* the ragged last rows, padded */
        pack_a(a + full * s->ars, s->ars, 1, mc - full, kc, pa + full * kc);
    for (int64_t jr = 0; jr < nc; jr += NR) {
        int64_t n = nc - jr < NR ? nc - jr : NR;
        const float *bp = pb + jr * kc;
        for (int64_t ir = 0; ir < mc; ir += MR) {
            int64_t m = mc - ir < MR ? mc - ir : MR;
            float *cp = c + ir * s->crs + jr * s->ccs;
            bool direct = a_in_place && m == MR;
            const float *ap = direct ? a + ir * s->ars : pa + ir * kc;
            bool whole = m == MR && n == NR && s->ccs == 1; /* else through the tile */
            (direct ? micro_d : micro_p)(kc, ap, s->ars, bp, whole ? cp : tile, whole ? s->crs : NR,
                                         whole && accumulate);
            for (int64_t r = 0; !whole && r < m; r++)
                for (int64_t j = 0; j < n; j++) {
                    float *d = cp + r * s->crs + j * s->ccs;
                    *d = accumulate ? *d + tile[r * NR + j] : tile[r * NR + j];
                }
        }
    }
}

void loom__sgemm256(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float *a, int64_t lda,
                    const float *b, int64_t ldb, float *c, int64_t ldc, void *scratch) {
    float *pa = (float *)(((uintptr_t)scratch + 63) & ~(uintptr_t)63);
    float *pb = pa + (size_t)(MC + MR) * KC, *tile = pb + (size_t)KC * (NC + NR);
    strides s = {ta ? 1 : lda, ta ? lda : 1, tb ? 1 : ldb, tb ? ldb : 1, ldc, 1};
    if (K == 0) {
        for (int64_t i = 0; i < M; i++)
            memset(c + i * ldc, 0, sizeof(float) * (size_t)N);
        return;
    }
    /* C^T = B^T A^T (each element the same chain: a product's factors commute) where C is
     * narrower than a panel on more rows (the transpose fills the panels), or where both operands
     * are contiguous along k, A has few rows and K is long (a convolution's weight gradient, K
     * every place of the batch) or C is small (at most 64 KB: a dense layer's forward on 32
     * rows): B would be packed, transposing, for a few rows of C; B^T is read in place and the
     * few rows of A packed instead, and C is stored through the tile. (A dense layer's forward
     * of 64 x 1024 ran at half the speed so, 32 x 1024 at 0.8.) */
    if ((N < NR && M > N) ||
        (!ta && tb && M <= 64 && N > M && M * N <= 65536 && (K >= 4096 || M * N <= 16384))) {
        const float *t = a;
        int64_t m = M;
        s = (strides){s.bjs, s.bks, s.aks, s.ars, 1, ldc};
        a = b, b = t, M = N, N = m;
    }
    int64_t kb = (K + KC - 1) / KC, kstep = (K + kb - 1) / kb; /* equal blocks: 288 = 144 + 144 */
    for (int64_t jc = 0; jc < N; jc += NC) {
        int64_t nc = N - jc < NC ? N - jc : NC;
        for (int64_t pc = 0; pc < K; pc += kstep) {
            int64_t kc = K - pc < kstep ? K - pc : kstep;
            const float *bb = b + pc * s.bks + jc * s.bjs;
            if (s.bjs == 1)
                pack_b_rows(bb, s.bks, nc, kc, pb);
            else
                for (int64_t jr = 0; jr < nc; jr += NR)
                    pack_b(bb + jr * s.bjs, s.bks, s.bjs, nc - jr < NR ? nc - jr : NR, kc,
                           pb + jr * kc);
            for (int64_t ic = 0; ic < M; ic += MC)
                block(M - ic < MC ? M - ic : MC, nc, kc, a + ic * s.ars + pc * s.aks, &s, pb, pa,
                      tile, c + ic * s.crs + jc * s.ccs, pc > 0);
        }
    }
}
#else
bool loom__gemm256_available(void) {
    return false;
}
void loom__sgemm256(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float *a, int64_t lda,
                    const float *b, int64_t ldb, float *c, int64_t ldc, void *scratch) {
    (void)ta, (void)tb, (void)M, (void)N, (void)K, (void)a, (void)lda, (void)b, (void)ldb;
    (void)c, (void)ldc, (void)scratch;
    LOOM_ASSERT(!"loom__sgemm256 without AVX2");
}
#endif
