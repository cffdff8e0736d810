/*
 * gemm256.c - loom's float32 product for CPUs with AVX2 and FMA but not AVX-512 (gemm.c's kernels
 * need AVX-512): C = A B for row-major operands, each read as stored or transposed (as
 * cblas_sgemm takes them). BLIS-style, at 8 lanes: B in panels of KC x 16 columns (a block of NC
 * columns at a time), A in panels of 6 rows, and a 6 x 16 register-blocked microkernel (12
 * accumulators, two loads and six broadcasts per k) does the arithmetic with FMA. A contiguous
 * along k has its rows broadcast where they lie (unless they alias in L1); A stored transposed is
 * packed by the microkernel that first reads it (micro_tp). B is always packed: row by row in
 * memory order where stored (k x n), through 8 x 8 register transposes where stored transposed.
 * Ragged edges are padded with zeros. Where C is narrow, or A has few rows and B would be packed
 * transposing (loom__sgemm256), C^T = B^T A^T is computed instead. loom__sgemm256_view reads B
 * through a compound view (a convolution's unfold): B's block gathered row by row from its runs
 * along the image's rows and its panels read where they lie in that block (no second pack), or (its
 * weight gradient, by the transpose) A's rows read where they lie, by their offsets.
 * loom__sgemm256_blocks hands C on a block of columns at a time (a fused fold's product). A dense
 * layer's forward on a batch of at most 128 rows (A B^T, B the weights) packs A^T whole and reads
 * B's rows where they lie (stream_rows): the weights are never packed.
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
#define NC LOOM_GEMM256_NC

size_t loom__gemm256_scratch_bytes(void) {
    return sizeof(float) * ((size_t)(MC + MR) * KC + (size_t)KC * (NC + NR) + MR * NR) + 64;
}

/* loom__sgemm256_view's offsets (int64_t): of a k block, of a column block, the column block's
 * runs (two numbers each), and of a row block */
#define VIEW_WORDS (KC + NC + 2 * NC + MC)

size_t loom__gemm256_view_bytes(void) {
    return sizeof(int64_t) * VIEW_WORDS + 64;
}

float *loom__gemm256_room(void *scratch) {
    uintptr_t at = (uintptr_t)scratch + loom__gemm256_scratch_bytes() + loom__gemm256_view_bytes();
    return (float *)((at + 63) & ~(uintptr_t)63);
}

#if defined(__x86_64__) && defined(__GNUC__)
#    include <immintrin.h>

bool loom__gemm256_available(void) {
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

/* An H x 16 tile of C (H 6, or 4 for the last rows of a block; rows ldc apart) = (or += with
 * accumulate) A's H rows x B's 16 columns over kc: A(r, k) at pa[r AS + k AK] (a packed panel:
 * AS 1, AK H; in place: AS lda, AK 1), B(k, j) at pb[k BS + j] (a packed panel: BS 16; a
 * gathered block: BS its rows' pitch, ldb). C's rows are prefetched while the chains run. The
 * accumulators are named one by one (FMA2): gcc keeps an array of them in memory, storing after
 * every FMA. */
#    define FMA2(R, AS, AK)                                   \
        av = _mm256_broadcast_ss(pa + (R) * (AS) + k * (AK)); \
        c##R##0 = _mm256_fmadd_ps(av, b0, c##R##0), c##R##1 = _mm256_fmadd_ps(av, b1, c##R##1)
#    define MICRO(SUF, AS, AK, BS, H, PACK)                                                       \
        __attribute__((target("avx2,fma"))) static void micro##SUF(                               \
            int64_t kc, const float *pa, int64_t lda, const float *pb, int64_t ldb, float *c,     \
            int64_t ldc, bool accumulate, float *pk) {                                            \
            (void)lda, (void)ldb, (void)pk;                                                       \
            for (int r = 0; r < (H); r++) {                                                       \
                _mm_prefetch((const char *)(c + r * ldc), _MM_HINT_T0);                           \
                _mm_prefetch((const char *)(c + r * ldc + NR - 1), _MM_HINT_T0);                  \
            }                                                                                     \
            __m256 z = _mm256_setzero_ps(), c00 = z, c01 = z, c10 = z, c11 = z, c20 = z, c21 = z, \
                   c30 = z, c31 = z, c40 = z, c41 = z, c50 = z, c51 = z;                          \
            _Pragma("GCC unroll 4") for (int64_t k = 0; k < kc; k++, pb += (BS)) {                \
                __m256 b0 = _mm256_loadu_ps(pb), b1 = _mm256_loadu_ps(pb + 8), av;                \
                PACK;                                                                             \
                FMA2(0, AS, AK);                                                                  \
                FMA2(1, AS, AK);                                                                  \
                FMA2(2, AS, AK);                                                                  \
                FMA2(3, AS, AK);                                                                  \
                if ((H) > 4) {                                                                    \
                    FMA2(4, AS, AK);                                                              \
                    FMA2(5, AS, AK);                                                              \
                }                                                                                 \
            }                                                                                     \
            __m256 acc[MR * 2] = {c00, c01, c10, c11, c20, c21, c30, c31, c40, c41, c50, c51};    \
            for (int r = 0; r < (H); r++)                                                         \
                for (int v = 0; v < 2; v++) {                                                     \
                    float *d = c + r * ldc + 8 * v;                                               \
                    __m256 x = acc[2 * r + v];                                                    \
                    _mm256_storeu_ps(d, accumulate ? _mm256_add_ps(_mm256_loadu_ps(d), x) : x);   \
                }                                                                                 \
        }
/* micro_tp's pack: A stored transposed is read where it lies (A(r, k) at pa[r + k lda], six
 * floats of a row of A^T a k) and each k's six are also stored into the packed panel pk
 * (pk[k MR + r]), for the block's other panels of B to read. The pack then costs the kernel two
 * loads and two stores a k, where its ports have room, instead of a pass of its own over A^T's
 * rows (lda apart: a line a k, in a few of the L1's sets): bench_gemm's GPT weight gradients
 * 88-90 -> 91-92.5 GFLOP/s. */
#    define PACK6                                               \
        _mm_storeu_ps(pk + k * MR, _mm_loadu_ps(pa + k * lda)), \
            _mm_storel_epi64((__m128i_u *)(pk + k * MR + 4),    \
                             _mm_loadl_epi64((const __m128i_u *)(pa + k * lda + 4)))
#    define MR4 4 /* the last rows' tiles */
MICRO(_p, 1, MR, NR, MR, )
MICRO(_d, lda, 1, NR, MR, )
MICRO(_tp, 1, lda, NR, MR, PACK6)
MICRO(_pg, 1, MR, ldb, MR, )
MICRO(_dg, lda, 1, ldb, MR, )
MICRO(_p4, 1, MR4, NR, MR4, )
MICRO(_pg4, 1, MR4, ldb, MR4, )
typedef void micro_fn(int64_t kc, const float *pa, int64_t lda, const float *pb, int64_t ldb,
                      float *c, int64_t ldc, bool accumulate, float *pk);

/* micro_d with A's six rows read through a view: A(r, k) at ra[r][ko[k]] (loom__sgemm256_view: a
 * weight gradient's image windows, rows where they lie and k by their offsets, as gemm.c's
 * transposed form reads them), C's tile whole (no accumulation: c is the staging tile). */
#    define FMA2V(R)                         \
        av = _mm256_broadcast_ss(ra[R] + o); \
        c##R##0 = _mm256_fmadd_ps(av, b0, c##R##0), c##R##1 = _mm256_fmadd_ps(av, b1, c##R##1)
__attribute__((target("avx2,fma"))) static void
micro_v(int64_t kc, const float *const *ra, const int64_t *ko, const float *pb, float *c) {
    __m256 z = _mm256_setzero_ps(), c00 = z, c01 = z, c10 = z, c11 = z, c20 = z, c21 = z, c30 = z,
           c31 = z, c40 = z, c41 = z, c50 = z, c51 = z;
    _Pragma("GCC unroll 4") for (int64_t k = 0; k < kc; k++, pb += NR) {
        __m256 b0 = _mm256_loadu_ps(pb), b1 = _mm256_loadu_ps(pb + 8), av;
        int64_t o = ko[k];
        FMA2V(0);
        FMA2V(1);
        FMA2V(2);
        FMA2V(3);
        FMA2V(4);
        FMA2V(5);
    }
    __m256 acc[MR * 2] = {c00, c01, c10, c11, c20, c21, c30, c31, c40, c41, c50, c51};
    for (int r = 0; r < MR; r++)
        for (int v = 0; v < 2; v++)
            _mm256_storeu_ps(c + r * NR + 8 * v, acc[2 * r + v]);
}

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

__attribute__((target("avx2,fma"))) static void transpose8x8(const float *x, int64_t ldx, float *y,
                                                             int64_t ldy) {
    __m256 r[8];
    for (int i = 0; i < 8; i++)
        r[i] = _mm256_loadu_ps(x + i * ldx);
    transpose8(r);
    for (int i = 0; i < 8; i++)
        _mm256_storeu_ps(y + i * ldy, r[i]);
}

void loom__transpose8x8(const float *x, int64_t ldx, float *y, int64_t ldy) {
    transpose8x8(x, ldx, y, ldy);
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

/* Rows [0, m) (m <= w, padded with zero rows) x k [0, kc) of A (A(i, k) at a[i ars + k aks])
 * as a panel w rows wide (MR, or MR4 for a block's last rows): A(r, k) at pa[k w + r]. Whole
 * panels: w floats a k where A is stored transposed (ars 1), 8 x 8 register transposes of its w
 * rows where A's rows are contiguous. */
__attribute__((target("avx2,fma"))) static void
pack_a(const float *a, int64_t ars, int64_t aks, int64_t m, int64_t w, int64_t kc, float *pa) {
    int64_t k = 0;
    if (m == w && ars == 1)
        for (; k < kc; k++) {
            _mm_storeu_ps(pa + k * w, _mm_loadu_ps(a + k * aks));
            if (w == MR)
                _mm_storel_epi64((__m128i_u *)(pa + k * w + 4),
                                 _mm_loadl_epi64((const __m128i_u *)(a + k * aks + 4)));
        }
    if (m == w && aks == 1)
        for (; k + 8 <= kc; k += 8) {
            __m256 r[8];
            for (int i = 0; i < 8; i++)
                r[i] = i < w ? _mm256_loadu_ps(a + i * ars + k) : _mm256_setzero_ps();
            transpose8(r);
            for (int q = 0; q < 8; q++)
                if (w == MR)
                    store6(pa + (k + q) * w, r[q]);
                else
                    _mm_storeu_ps(pa + (k + q) * w, _mm256_castps256_ps128(r[q]));
        }
    pack_rest(a, ars, aks, m, w, k, kc, pa);
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

/* An operand read through a compound view (loom__sgemm256_view): v(k, j) at p + row(k) + col(j),
 * B (B(k, j) = v(k, from + j)) or, in the transposed form, A (A(i, k) = v(k, from + i)). The
 * offsets of the k block being computed (ko), of B's column block (co; its runs of consecutive
 * offsets: nrun of them, run q from column at[q], len[q] long) and of A's block of rows (ro). */
typedef struct {
    const float *p;
    loom__gdim row, col;
    int64_t from;
    int64_t *ko, *co, *at, *len, *ro, nrun;
} vop;

/* The runs of consecutive offsets in off[0, n): run q from index at[q], len[q] long. Returns how
 * many. */
static int64_t runs_of(const int64_t *off, int64_t n, int64_t *at, int64_t *len) {
    int64_t q = 0;
    for (int64_t i = 0, r; i < n; i += r, q++) {
        for (r = 1; i + r < n && off[i + r] == off[i] + r;)
            r++;
        at[q] = i, len[q] = r;
    }
    return q;
}

/* B's columns [0, nc) x the k block [0, kc) from view v gathered into rows: B(k, j) at
 * g[k ldg + j], a k at a time, its runs of columns (v->at, v->len: v->nrun of them) copied 8
 * floats at a time, a run's rest read through a mask (not past its end) and written whole: it
 * spills into the next run's place, written after it, or past nc; the columns from nc to a
 * multiple of 16 zeros. The micro kernels read its panels of 16 columns where they lie, ldg apart
 * (no second pack). ldg >= nc rounded up to 16, plus 8. */
__attribute__((target("avx2,fma"))) static void gather_b_view(const vop *v, int64_t nc, int64_t kc,
                                                              float *g, int64_t ldg) {
    const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    int64_t end = (nc + NR - 1) / NR * NR;
    for (int64_t k = 0; k < kc; k++) {
        const float *row = v->p + v->ko[k];
        float *d = g + k * ldg;
        for (int64_t q = 0; q < v->nrun; q++) {
            int64_t j = v->at[q], r = v->len[q], x = 0;
            const float *src = row + v->co[j];
            for (; x + 8 <= r; x += 8)
                _mm256_storeu_ps(d + j + x, _mm256_loadu_ps(src + x));
            if (x < r)
                _mm256_storeu_ps(
                    d + j + x,
                    _mm256_maskload_ps(src + x,
                                       _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(r - x)), iota)));
        }
        for (int64_t j = nc; j < end; j += 8)
            _mm256_storeu_ps(d + j, _mm256_setzero_ps());
    }
}

/* The pitch of a gathered block of nc columns: past nc rounded up to 16 by 8 or more, and not a
 * multiple of 1 KB (rows 4 KB apart would share the L1's sets). */
static int64_t gather_pitch(int64_t nc) {
    int64_t ldg = (nc + NR - 1) / NR * NR + NR;
    return ldg % 256 ? ldg : ldg + NR;
}

/* The rows of a block of mc that go in tiles of 6 (the last of them ragged where 5 are left);
 * the rest go in tiles of 4: one where 4 or fewer are left, two where 6 and 1 or 2 would end it
 * (a block of 32 rows: 6, 6, 6, 6, 4, 4 instead of five 6s and a 6 with 2). A tile's rows cost
 * the same either way, not its padding. */
static int64_t six_rows(int64_t mc) {
    int64_t rem = mc % MR, n6 = mc / MR;
    return rem == 5 ? mc : (rem == 1 || rem == 2) && n6 > 0 ? (n6 - 1) * MR : n6 * MR;
}

/* Rows [0, mc) of C (its columns [0, nc)) for a k block of kc: B's panels packed at pb (or its
 * block gathered there, rows ldg apart), A in place or packed into pa. A tile that C's layout does
 * not take whole (ragged, or C stored transposed) goes through tile and is then added or copied
 * element by element. */
static void block(int64_t mc, int64_t nc, int64_t kc, const float *a, const vop *va, int64_t i0,
                  const strides *s, const float *pb, int64_t ldg, float *pa, float *tile, float *c,
                  bool accumulate) {
    /* in place unless transposed, or its rows a multiple of 4 KB apart and read for more than
     * two panels of B: the same lines of six rows would then share an L1 set with the B panel's
     * (8 ways), and evict each other before the next panel reads them. Through view va, A's rows
     * i0 on are read where they lie, by their offsets. The tiles of 4 rows are packed. */
    bool a_in_place = !va && s->aks == 1 && (s->ars % 1024 != 0 || nc <= 2 * NR);
    /* A stored transposed: its whole panels packed by micro_tp as the first panel of B reads
     * them */
    bool a_tp = !a_in_place && !va && !ldg && s->ars == 1;
    int64_t h6 = va ? mc : six_rows(mc);
    if (va)
        loom__gd_offsets(&va->col, va->from + i0, mc, va->ro);
    for (int64_t ir = 0, h; ir < mc && !va; ir += h) {
        h = ir < h6 ? MR : MR4;
        int64_t m = mc - ir < h ? mc - ir : h;
        if (!(a_in_place || a_tp) || m < MR)
            pack_a(a + ir * s->ars, s->ars, s->aks, m, h, kc, pa + ir * kc);
    }
    for (int64_t jr = 0; jr < nc; jr += NR) {
        int64_t n = nc - jr < NR ? nc - jr : NR;
        const float *bp = ldg ? pb + jr : pb + jr * kc; /* gathered rows, or packed panels */
        for (int64_t ir = 0, h; ir < mc; ir += h) {
            h = ir < h6 ? MR : MR4;
            int64_t m = mc - ir < h ? mc - ir : h;
            float *cp = c + ir * s->crs + jr * s->ccs;
            bool direct = a_in_place && m == MR, tp = a_tp && m == MR && jr == 0;
            const float *ap = direct || tp ? a + ir * s->ars : pa + ir * kc;
            bool whole = !va && m == h && n == NR && s->ccs == 1; /* else through the tile */
            if (va) { /* A's rows where they lie (the missing ones of a ragged tile: row 0's) */
                const float *ra[MR];
                for (int r = 0; r < MR; r++)
                    ra[r] = va->p + va->ro[ir + (r < m ? r : 0)];
                micro_v(kc, ra, va->ko, bp, tile);
            } else {
                micro_fn *f = h == MR4 ? (ldg ? micro_pg4 : micro_p4)
                              : ldg    ? (direct ? micro_dg : micro_pg)
                              : tp     ? micro_tp
                                       : (direct ? micro_d : micro_p);
                f(kc, ap, tp ? s->aks : s->ars, bp, ldg, whole ? cp : tile, whole ? s->crs : NR,
                  whole && accumulate, pa + ir * kc);
            }
            for (int64_t r = 0; !whole && r < m; r++)
                for (int64_t j = 0; j < n; j++) {
                    float *d = cp + r * s->crs + j * s->ccs;
                    *d = accumulate ? *d + tile[r * NR + j] : tile[r * NR + j];
                }
        }
    }
}

/* Column blocks handed on as made (loom__sgemm256_blocks): nc columns at a time (at most NC), C's
 * block written at c (its rows as many apart as it has columns) and then handed to
 * done(ctx, jc, nc). */
typedef struct {
    int64_t nc, j0; /* (done is handed C's columns from j0) */
    void (*done)(void *ctx, int64_t jc, int64_t nc);
    void *ctx;
} blocks;

/* The staging tile's m rows x n columns stored transposed: tile(r, j) to c[j ldc + r]. Whole
 * (6 x 16) through two 8 x 8 register transposes (rows 6 and 7 of each padding, never stored). */
__attribute__((target("avx2,fma"))) static void store_tile_t(const float *tile, int64_t m,
                                                             int64_t n, float *c, int64_t ldc) {
    if (m == MR && n == NR) {
        for (int h = 0; h < 2; h++) {
            __m256 r[8];
            for (int i = 0; i < 8; i++)
                r[i] = i < MR ? _mm256_loadu_ps(tile + i * NR + 8 * h) : _mm256_setzero_ps();
            transpose8(r);
            for (int j = 0; j < 8; j++)
                store6(c + (8 * h + j) * ldc, r[j]);
        }
        return;
    }
    for (int64_t j = 0; j < n; j++)
        for (int64_t r = 0; r < m; r++)
            c[j * ldc + r] = tile[r * NR + j];
}

/* Whether C = A B^T runs by stream_rows: A few rows (a dense layer's forward on a batch of at most
 * STREAM_M), B stored transposed (its rows the layer's weights, contiguous along k), K at least a
 * block, A^T's panels over all of K fitting in B's block's room and B's rows in A's. */
#    define STREAM_M 128
static bool streams(bool ta, bool tb, int64_t M, int64_t K) {
    return !ta && tb && M <= STREAM_M && K >= KC &&
           (M + NR - 1) / NR * NR * K <= (int64_t)KC * (NC + NR) && MR * K <= (MC + MR) * KC;
}

/* C = A B^T where streams(): A^T packed once, whole (its panels of 16 of A's rows over all of K),
 * then B's rows taken 6 (or 4) at a time where they lie, against every panel of A^T, each 6 x 16
 * tile of C^T summed over the k blocks in turn in the staging tile and stored transposed. The
 * weights are read once and never packed (the blocked form packs all of B, transposing, for a
 * few rows of A: a tenth of a 128 x 1024 x 1024 forward's time). Each element is the same chain
 * as in gemm256 (a product's factors commute): the same bits. C in blocks of columns where bl
 * (B's rows jc on; each block's rows nc apart), then handed on. */
static void stream_rows(int64_t M, int64_t N, int64_t K, const float *a, int64_t lda,
                        const float *b, int64_t ldb, float *c, int64_t ldc, const blocks *bl,
                        float *pa, float *pb, float *tile) {
    int64_t np = (M + NR - 1) / NR, kb = (K + KC - 1) / KC, kstep = (K + kb - 1) / kb;
    for (int64_t q = 0; q < np; q++)
        pack_b(a + q * NR * lda, 1, lda, M - q * NR < NR ? M - q * NR : NR, K, pb + q * NR * K);
    int64_t ncb = bl ? bl->nc : N;
    for (int64_t jc = 0; jc < N; jc += ncb) {
        int64_t nc = N - jc < ncb ? N - jc : ncb, h6 = six_rows(nc);
        float *cb = bl ? c : c + jc;
        int64_t ldcb = bl ? nc : ldc;
        for (int64_t ir = 0, h; ir < nc; ir += h) {
            h = ir < h6 ? MR : MR4;
            int64_t m = nc - ir < h ? nc - ir : h;
            const float *br = b + (jc + ir) * ldb;
            bool direct = m == MR;
            if (!direct)
                pack_a(br, ldb, 1, m, h, K, pa);
            micro_fn *f = h == MR4 ? micro_p4 : direct ? micro_d : micro_p;
            for (int64_t q = 0; q < np; q++) {
                for (int64_t pc = 0; pc < K; pc += kstep)
                    f(K - pc < kstep ? K - pc : kstep, direct ? br + pc : pa + pc * h, ldb,
                      pb + q * NR * K + pc * NR, 0, tile, NR, pc > 0, NULL);
                store_tile_t(tile, m, M - q * NR < NR ? M - q * NR : NR, cb + q * NR * ldcb + ir,
                             ldcb);
            }
        }
        if (bl)
            bl->done(bl->ctx, bl->j0 + jc, nc);
    }
}

/* loom__sgemm256 (v, bl NULL), or loom__sgemm256_view with B read through view v (by
 * C^T = B^T A^T, A^T then read through it, where vt), or loom__sgemm256_blocks (bl; never
 * transposed). */
static void gemm256(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float *a, int64_t lda,
                    const float *b, int64_t ldb, float *c, int64_t ldc, void *scratch, vop *v,
                    bool vt, const blocks *bl) {
    float *pa = (float *)(((uintptr_t)scratch + 63) & ~(uintptr_t)63);
    float *pb = pa + (size_t)(MC + MR) * KC, *tile = pb + (size_t)KC * (NC + NR);
    strides s = {ta ? 1 : lda, ta ? lda : 1, tb ? 1 : ldb, tb ? ldb : 1, ldc, 1};
    int64_t ncb = bl ? bl->nc : NC; /* a block's columns */
    if (K == 0) {
        for (int64_t jc = 0; jc < N; jc += ncb) {
            int64_t nc = N - jc < ncb ? N - jc : ncb;
            for (int64_t i = 0; i < M; i++)
                memset(c + i * (bl ? nc : ldc) + (bl ? 0 : jc), 0, sizeof(float) * (size_t)nc);
            if (bl)
                bl->done(bl->ctx, bl->j0 + jc, nc);
        }
        return;
    }
    if (!v && streams(ta, tb, M, K)) {
        stream_rows(M, N, K, a, lda, b, ldb, c, ldc, bl, pa, pb, tile);
        return;
    }
    /* C^T = B^T A^T (each element the same chain: a product's factors commute) where C is
     * narrower than a panel on more rows (the transpose fills the panels), or where both operands
     * are contiguous along k, A has few rows and K is long (a convolution's weight gradient, K
     * every place of the batch) or C is small (at most 64 KB: a dense layer's forward on 32
     * rows): B would be packed, transposing, for a few rows of C; B^T is read in place and the
     * few rows of A packed instead, and C is stored through the tile. (A dense layer's forward
     * of 64 x 1024 ran at half the speed so, 32 x 1024 at 0.8.) */
    if (!bl && (v ? vt
                  : (N < NR && M > N) || (!ta && tb && M <= 64 && N > M && M * N <= 65536 &&
                                          (K >= 4096 || M * N <= 16384)))) {
        const float *t = a;
        int64_t m = M;
        s = (strides){s.bjs, s.bks, s.aks, s.ars, 1, ldc};
        a = b, b = t, M = N, N = m;
    }
    vop *va = v && vt ? v : NULL, *vb = v && !vt ? v : NULL;
    int64_t kb = (K + KC - 1) / KC, kstep = (K + kb - 1) / kb; /* equal blocks: 288 = 144 + 144 */
    for (int64_t jc = 0; jc < N; jc += ncb) {
        int64_t nc = N - jc < ncb ? N - jc : ncb;
        s.crs = bl ? nc : s.crs; /* (a block's rows nc apart) */
        if (vb) {                /* the block's columns and their runs */
            loom__gd_offsets(&vb->col, vb->from + jc, nc, vb->co);
            vb->nrun = runs_of(vb->co, nc, vb->at, vb->len);
        }
        for (int64_t pc = 0; pc < K; pc += kstep) {
            int64_t kc = K - pc < kstep ? K - pc : kstep;
            if (v)
                loom__gd_offsets(&v->row, pc, kc, v->ko);
            const float *bb = vb ? NULL : b + pc * s.bks + jc * s.bjs;
            int64_t ldg = vb ? gather_pitch(nc) : 0;
            if (vb)
                gather_b_view(vb, nc, kc, pb, ldg);
            else if (s.bjs == 1)
                pack_b_rows(bb, s.bks, nc, kc, pb);
            else
                for (int64_t jr = 0; jr < nc; jr += NR)
                    pack_b(bb + jr * s.bjs, s.bks, s.bjs, nc - jr < NR ? nc - jr : NR, kc,
                           pb + jr * kc);
            for (int64_t ic = 0; ic < M; ic += MC)
                block(M - ic < MC ? M - ic : MC, nc, kc, va ? NULL : a + ic * s.ars + pc * s.aks,
                      va, ic, &s, pb, ldg, pa, tile, c + ic * s.crs + (bl ? 0 : jc) * s.ccs,
                      pc > 0);
        }
        if (bl)
            bl->done(bl->ctx, bl->j0 + jc, nc);
    }
}

void loom__sgemm256(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float *a, int64_t lda,
                    const float *b, int64_t ldb, float *c, int64_t ldc, void *scratch) {
    gemm256(ta, tb, M, N, K, a, lda, b, ldb, c, ldc, scratch, NULL, false, NULL);
}

/* Whether a product reads view b by C^T = B^T A^T: where B's runs are longer along k than along
 * its columns (a convolution's weight gradient: A^T's rows, the image's windows, read where they
 * lie, micro_v), else B is gathered by its runs of columns (a forward, gather_b_view). */
static bool view_transposed(const loom__gmat *b) {
    int kl = b->row.n - 1, jl = b->col.n - 1;
    int64_t krun = b->row.stride[kl] == 1 ? b->row.size[kl] : 1,
            jrun = b->col.stride[jl] == 1 ? b->col.size[jl] : 1;
    return krun > jrun;
}

/* View b from its column j0, its offsets in the scratch after loom__sgemm256's. */
static vop view_of(const loom__gmat *b, int64_t j0, void *scratch) {
    int64_t *w =
        (int64_t *)(((uintptr_t)scratch + loom__gemm256_scratch_bytes() + 63) & ~(uintptr_t)63);
    vop v = {.p = b->p, .row = b->row, .col = b->col, .from = j0, .ko = w, .co = w + KC};
    v.at = v.co + NC, v.len = v.at + NC, v.ro = v.len + NC;
    return v;
}

void loom__sgemm256_view(bool ta, int64_t M, int64_t N, int64_t K, const float *a, int64_t lda,
                         const loom__gmat *b, int64_t j0, float *c, int64_t ldc, void *scratch) {
    vop v = view_of(b, j0, scratch);
    gemm256(ta, false, M, N, K, a, lda, NULL, 0, c, ldc, scratch, &v, view_transposed(b), NULL);
}

/* A plain operand's transposition and leading dimension as cblas_sgemm takes them, where it is
 * one (one sub-dimension each way, one of them of stride 1). */
static bool plain(const loom__gmat *x, bool *t, int64_t *ld) {
    if (x->row.n != 1 || x->col.n != 1 || (x->col.stride[0] != 1 && x->row.stride[0] != 1))
        return false;
    *t = x->col.stride[0] != 1;
    *ld = *t ? x->col.stride[0] : x->row.stride[0];
    return true;
}

bool loom__gemm256_blocks_ok(const loom__gmat *a, const loom__gmat *b, int64_t nc) {
    bool t;
    int64_t ld;
    return loom__gemm256_available() && nc >= 1 && nc <= NC && plain(a, &t, &ld) &&
           (plain(b, &t, &ld) || !view_transposed(b));
}

void loom__sgemm256_blocks(int64_t M, int64_t N, int64_t K, const loom__gmat *a,
                           const loom__gmat *b, int64_t j0, float *c, int64_t nc,
                           void (*done)(void *ctx, int64_t jc, int64_t nc), void *ctx,
                           void *scratch) {
    bool ta = false, tb = false;
    int64_t lda = 0, ldb = 0;
    bool bv = !plain(b, &tb, &ldb), ok = plain(a, &ta, &lda);
    LOOM_ASSERT(ok && nc <= NC && !(bv && view_transposed(b)));
    vop v = view_of(b, j0, scratch);
    blocks bl = {nc, j0, done, ctx};
    gemm256(ta, tb, M, N, K, a->p, lda, bv ? NULL : b->p + j0 * (tb ? ldb : 1), ldb, c, nc, scratch,
            bv ? &v : NULL, false, &bl);
}
#else
bool loom__gemm256_available(void) {
    return false;
}
void loom__transpose8x8(const float *x, int64_t ldx, float *y, int64_t ldy) {
    (void)x, (void)ldx, (void)y, (void)ldy;
    LOOM_ASSERT(!"loom__transpose8x8 without AVX2");
}
void loom__sgemm256(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float *a, int64_t lda,
                    const float *b, int64_t ldb, float *c, int64_t ldc, void *scratch) {
    (void)ta, (void)tb, (void)M, (void)N, (void)K, (void)a, (void)lda, (void)b, (void)ldb;
    (void)c, (void)ldc, (void)scratch;
    LOOM_ASSERT(!"loom__sgemm256 without AVX2");
}
void loom__sgemm256_view(bool ta, int64_t M, int64_t N, int64_t K, const float *a, int64_t lda,
                         const loom__gmat *b, int64_t j0, float *c, int64_t ldc, void *scratch) {
    (void)ta, (void)M, (void)N, (void)K, (void)a, (void)lda, (void)b, (void)j0, (void)c, (void)ldc;
    (void)scratch;
    LOOM_ASSERT(!"loom__sgemm256_view without AVX2");
}
bool loom__gemm256_blocks_ok(const loom__gmat *a, const loom__gmat *b, int64_t nc) {
    (void)a, (void)b, (void)nc;
    return false;
}
void loom__sgemm256_blocks(int64_t M, int64_t N, int64_t K, const loom__gmat *a,
                           const loom__gmat *b, int64_t j0, float *c, int64_t nc,
                           void (*done)(void *ctx, int64_t jc, int64_t nc), void *ctx,
                           void *scratch) {
    (void)M, (void)N, (void)K, (void)a, (void)b, (void)j0, (void)c, (void)nc, (void)done;
    (void)ctx;
    (void)scratch;
    LOOM_ASSERT(!"loom__sgemm256_blocks without AVX2");
}
#endif
