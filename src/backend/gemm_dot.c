/*
 * gemm_dot.c - products as dot products along K (gemm.c's dot forms): a small C with a long K
 * (a convolution's weight gradient with few input channels), and rows of them a few at a time
 * (loom__dot_rows: a pool gradient's sinks).
 */
#include "gemm_impl.h"

#include <string.h>

#ifdef LOOM_GEMM512
/* Products with a small C and a long K whose operands both run contiguously along k (a
 * convolution's weight gradient with few input channels: Cout x Cin KH KW over every position of
 * the batch, A the output gradient, B the image through the unfold's view). Panels would be mostly
 * padding and the packs would cost more than the arithmetic, so each C element is a dot product
 * along K instead: 16 lanes of k per FMA, a tile of up to 4 x 5 elements in registers over a block
 * of SK_KB k at a time (A's block read from memory once, the tiles then sweep it in cache), the
 * block's lanes added into a buffer, and the 16 lanes summed at the end. A fixed order, so runs
 * repeat bitwise. */

typedef struct { /* 16 (or fewer, masked) consecutive k where both operands are contiguous */
    int64_t ka, kb;
    uint32_t mask;
} kchunk;
_Static_assert(sizeof(float) * 16 * SK_MAX + sizeof(int64_t) * 2 * SK_MAX + sizeof(kchunk) * SK_KB +
                       sizeof(float *) * 2 * SK_MAX + 64 <=
                   sizeof(float) * (MC + MR) * KC,
               "the dot-product path's buffers fit the scratch");

/* The chunks of k in [k0, k1) (one block): greedily from k0, up to 16 consecutive k over which
 * both operands are contiguous. A's k is one dim of stride 1 (skinny), so that is where B's k
 * offsets (d: runs along its innermost sub-dim, of stride 1) go on by one. Returns how many. */
static int64_t chunks(const loom__gdim *d, int64_t k0, int64_t k1, kchunk *ch) {
    int last = d->n - 1;
    int64_t dig[LOOM_GDIM_MAX], off = 0, x = k0, n = 0, clen = 0, lastkb = 0;
    for (int q = last; q >= 0; q--) {
        dig[q] = x % d->size[q];
        x /= d->size[q];
        off += dig[q] * d->stride[q];
    }
    for (int64_t k = k0; k < k1;) {
        int64_t run = d->size[last] - dig[last] < k1 - k ? d->size[last] - dig[last] : k1 - k;
        int64_t at = 0;
        if (clen > 0 && clen < 16 && off == lastkb + 1) { /* the last chunk goes on */
            int64_t more = 16 - clen < run ? 16 - clen : run;
            ch[n - 1].mask = (1u << (clen + more)) - 1;
            clen += more, at = more;
        }
        for (; at < run; at += clen) {
            clen = 16 < run - at ? 16 : run - at;
            ch[n++] = (kchunk){k + at, off + at, (1u << clen) - 1};
        }
        lastkb = off + run - 1;
        k += run, dig[last] += run, off += run;
        if (dig[last] < d->size[last])
            continue;
        off -= d->size[last], dig[last] = 0; /* carry into the outer sub-dims */
        for (int q = last - 1; q >= 0; q--) {
            off += d->stride[q];
            if (++dig[q] < d->size[q])
                break;
            off -= d->stride[q] * d->size[q], dig[q] = 0;
        }
    }
    return n;
}

/* The 16 lanes' sum, pairwise in a fixed order. */
static float lane_sum(const float *l) {
    float t[8];
    for (int w = 8; w >= 1; w /= 2)
        for (int i = 0; i < w; i++)
            t[i] = (w == 8 ? l[i] + l[i + 8] : t[i] + t[i + w]);
    return t[0];
}

/* lane_sum() of n lane vectors (16 floats each, at l) into out: 16 at a time by a register
 * transpose, the same pairs added in the same order, so the same bits. */
__attribute__((target("avx512f"))) static void lane_sums(const float *l, int64_t n, float *out) {
    for (int64_t q0 = 0; q0 < n; q0 += 16) {
        int cnt = (int)(n - q0 < 16 ? n - q0 : 16);
        __m512 r[16];
        for (int t = 0; t < 16; t++)
            r[t] = t < cnt ? _mm512_loadu_ps(l + 16 * (q0 + t)) : _mm512_setzero_ps();
        loom__transpose16(r); /* r[i]: lane i of each */
        for (int w = 8; w >= 1; w /= 2)
            for (int i = 0; i < w; i++)
                r[i] = _mm512_add_ps(r[i], r[i + w]);
        _mm512_mask_storeu_ps(out + q0, (__mmask16)((1u << cnt) - 1), r[0]);
    }
}

/* A tile of MI rows of A (ar) by NJ columns of B (bc) over one block's chunks: the lanes of
 * each C element accumulated in a register from zero, then added to its lanes in memory (n
 * columns a row). B is loaded a column at a time, so that MI x NJ accumulators fit. */
#    define DOT_TILE(MI, NJ)                                                               \
        __attribute__((target("avx512f"))) static void dot_##MI##_##NJ(                    \
            const float *const *ar, const float *const *bc, const kchunk *ch, int64_t nch, \
            float *lanes, int64_t n) {                                                     \
            __m512 acc[MI][NJ];                                                            \
            _Pragma("GCC unroll 4") for (int i = 0; i < MI; i++)                           \
                _Pragma("GCC unroll 9") for (int j = 0; j < NJ; j++) acc[i][j] =           \
                    _mm512_setzero_ps();                                                   \
            for (int64_t q = 0; q < nch; q++) {                                            \
                __mmask16 m = (__mmask16)ch[q].mask;                                       \
                __m512 av[MI];                                                             \
                _Pragma("GCC unroll 4") for (int i = 0; i < MI; i++) av[i] =               \
                    _mm512_maskz_loadu_ps(m, ar[i] + ch[q].ka);                            \
                _Pragma("GCC unroll 9") for (int j = 0; j < NJ; j++) {                     \
                    __m512 bv = _mm512_maskz_loadu_ps(m, bc[j] + ch[q].kb);                \
                    _Pragma("GCC unroll 4") for (int i = 0; i < MI; i++) acc[i][j] =       \
                        _mm512_fmadd_ps(av[i], bv, acc[i][j]);                             \
                }                                                                          \
            }                                                                              \
            _Pragma("GCC unroll 4") for (int i = 0; i < MI; i++)                           \
                _Pragma("GCC unroll 9") for (int j = 0; j < NJ; j++) {                     \
                float *l = lanes + (i * n + j) * 16;                                       \
                _mm512_storeu_ps(l, _mm512_add_ps(_mm512_loadu_ps(l), acc[i][j]));         \
            }                                                                              \
        }
DOT_TILE(1, 1)
DOT_TILE(1, 2)
DOT_TILE(1, 3)
DOT_TILE(1, 4)
DOT_TILE(1, 5)
DOT_TILE(1, 6)
DOT_TILE(1, 7)
DOT_TILE(1, 8)
DOT_TILE(1, 9)
DOT_TILE(2, 1)
DOT_TILE(2, 2)
DOT_TILE(2, 3)
DOT_TILE(2, 4)
DOT_TILE(2, 5)
DOT_TILE(2, 6)
DOT_TILE(2, 7)
DOT_TILE(2, 8)
DOT_TILE(2, 9)
DOT_TILE(3, 1)
DOT_TILE(3, 2)
DOT_TILE(3, 3)
DOT_TILE(3, 4)
DOT_TILE(3, 5)
DOT_TILE(3, 6)
DOT_TILE(3, 7)
DOT_TILE(3, 8)
DOT_TILE(3, 9)
DOT_TILE(4, 1)
DOT_TILE(4, 2)
DOT_TILE(4, 3)
DOT_TILE(4, 4)
DOT_TILE(4, 5)
typedef void dot_fn(const float *const *, const float *const *, const kchunk *, int64_t, float *,
                    int64_t);
/* [rows - 1][columns - 1]: up to 9 columns for one to three rows (27 accumulators), 5 for four */
static dot_fn *const dot_tile[4][9] = {
    {dot_1_1, dot_1_2, dot_1_3, dot_1_4, dot_1_5, dot_1_6, dot_1_7, dot_1_8, dot_1_9},
    {dot_2_1, dot_2_2, dot_2_3, dot_2_4, dot_2_5, dot_2_6, dot_2_7, dot_2_8, dot_2_9},
    {dot_3_1, dot_3_2, dot_3_3, dot_3_4, dot_3_5, dot_3_6, dot_3_7, dot_3_8, dot_3_9},
    {dot_4_1, dot_4_2, dot_4_3, dot_4_4, dot_4_5, NULL, NULL, NULL, NULL}};

/* A B whose k is strided (a strided convolution's taps) goes block by block into the scratch
 * after the lanes' buffers, contiguous along k: N columns of SK_KB floats, for N up to this. */

void loom__skinny_gemm(int64_t M, int64_t N, int64_t K, const loom__gmat *a, const loom__gmat *b,
                       float *c, const loom__gdim *crow, const loom__gdim *ccol, bool accumulate,
                       void *scratch) {
    float *lanes = (float *)(((uintptr_t)scratch + 63) & ~(uintptr_t)63);
    int64_t *roff = (int64_t *)(lanes + 16 * SK_MAX), *coff = roff + SK_MAX;
    kchunk *ch = (kchunk *)(coff + SK_MAX);
    const float **ar = (const float **)(ch + SK_KB), **bc = ar + SK_MAX;
    bool pack = b->row.stride[b->row.n - 1] != 1;
    const float **bp = (const float **)((unsigned char *)scratch + SK_PACK_AT);
    int64_t *koff = (int64_t *)(bp + SK_MAX);
    float *blk = (float *)(((uintptr_t)(koff + SK_KB) + 63) & ~(uintptr_t)63);
    memset(lanes, 0, sizeof(float) * 16 * (size_t)(M * N));
    loom__gd_offsets(&a->row, 0, M, roff);
    loom__gd_offsets(&b->col, 0, N, coff);
    for (int64_t i = 0; i < M; i++)
        ar[i] = a->p + roff[i];
    for (int64_t j = 0; j < N; j++)
        bc[j] = b->p + coff[j];
    for (int64_t k0 = 0; k0 < K; k0 += SK_KB) {
        int64_t kc = K - k0 < SK_KB ? K - k0 : SK_KB, nch = 0;
        const float **bk = bc;
        if (pack) { /* the block's columns, contiguous, and chunks of 16 k along them */
            loom__gd_offsets(&b->row, k0, kc, koff);
            for (int64_t j = 0; j < N; j++) {
                float *d = blk + j * SK_KB;
                for (int64_t q = 0; q < kc; q++)
                    d[q] = bc[j][koff[q]];
                bp[j] = d;
            }
            for (int64_t q = 0; q < kc; q += 16)
                ch[nch++] = (kchunk){k0 + q, q, kc - q >= 16 ? 0xffffu : (1u << (kc - q)) - 1};
            bk = bp;
        } else {
            nch = chunks(&b->row, k0, k0 + kc, ch);
        }
        for (int64_t i = 0; i < M; i += SK_MI)
            for (int64_t j = 0; j < N; j += SK_NJ) {
                int64_t nj = N - j < SK_NJ ? N - j : SK_NJ;
                if (M - i >= SK_MI)
                    dot_tile[SK_MI - 1][nj - 1](ar + i, bk + j, ch, nch, lanes + (i * N + j) * 16,
                                                N);
                else
                    for (int64_t r = i; r < M; r++)
                        dot_tile[0][nj - 1](ar + r, bk + j, ch, nch, lanes + (r * N + j) * 16, N);
            }
    }
    loom__gd_offsets(crow, 0, M, roff);
    loom__gd_offsets(ccol, 0, N, coff);
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            float v = lane_sum(lanes + (i * N + j) * 16);
            float *d = c + roff[i] + coff[j];
            *d = accumulate ? *d + v : v;
        }
}

/* The dot-product path a row or two of A at a time (a pool gradient's rows as it makes them,
 * so that they are never written whole): B's chunks built once for all of K, and per row the same
 * blocks, chunks and lanes as loom__skinny_gemm, so the same bits. */
bool loom__dot_rows_ok(int64_t M, int64_t N, int64_t K, const loom__gmat *a, const loom__gmat *b) {
    return loom__gemm_available() && loom__gemm_choose(M, N, K, a, b) == LOOM_GEMM_DOT &&
           N <= LOOM_DOT_MAX_N && b->row.stride[b->row.n - 1] == 1; /* (B read in place) */
}

size_t loom__dot_rows_bytes(int64_t K) {
    return sizeof(kchunk) * (size_t)K + sizeof(int64_t) * (size_t)(K / SK_KB + 1) + 64;
}

void loom__dot_rows_begin(loom__dot_rows *s, const loom__gmat *b, int64_t N, int64_t K, void *buf) {
    kchunk *ch = (kchunk *)(((uintptr_t)buf + 63) & ~(uintptr_t)63);
    int64_t *bend = (int64_t *)(ch + K), coff[LOOM_DOT_MAX_N], n = 0, nb = 0;
    for (int64_t k0 = 0; k0 < K; k0 += SK_KB) {
        n += chunks(&b->row, k0, K - k0 < SK_KB ? K : k0 + SK_KB, ch + n);
        bend[nb++] = n;
    }
    *s = (loom__dot_rows){.N = N, .chunks = ch, .bend = bend, .nblocks = nb};
    loom__gd_offsets(&b->col, 0, N, coff);
    for (int64_t j = 0; j < N; j++)
        s->bc[j] = b->p + coff[j];
}

#    define DOT_ROWS 3 /* rows a tile: 27 accumulators, and 9 loads of B per 27 FMAs */
_Static_assert(LOOM_SINK_ROWS <= DOT_ROWS, "a pool gradient's rows go into one tile");
void loom__dot_rows_run(const loom__dot_rows *s, const float *a, int64_t lda, int64_t rows,
                        float *c) {
    float lanes[DOT_ROWS * 16 * LOOM_DOT_MAX_N];
    const kchunk *ch = s->chunks;
    for (int64_t i = 0; i < rows; i += DOT_ROWS) { /* the rows share each load of B */
        int64_t mi = rows - i < DOT_ROWS ? rows - i : DOT_ROWS;
        const float *ar[DOT_ROWS];
        for (int64_t r = 0; r < DOT_ROWS; r++)
            ar[r] = a + (i + (r < mi ? r : mi - 1)) * lda;
        memset(lanes, 0, sizeof(float) * 16 * (size_t)(mi * s->N));
        for (int64_t j = 0, g = (s->N + 8) / 9, w = (s->N + g - 1) / g; j < s->N; j += w) {
            int64_t nj = s->N - j < w ? s->N - j : w;
            for (int64_t bl = 0, q = 0; bl < s->nblocks; q = s->bend[bl++])
                dot_tile[mi - 1][nj - 1](ar, s->bc + j, ch + q, s->bend[bl] - q, lanes + 16 * j,
                                         s->N);
        }
        lane_sums(lanes, mi * s->N, c + i * s->N);
    }
}

/* Products narrower than 16 columns (a classifier's logits, N = 10) whose operands both run
 * contiguously along k: rows of dot products (loom__dot_rows) in place of panels that would be
 * mostly padding and a transposing pack of all of A. A block of rows at a time into the scratch,
 * then to C. */
void loom__narrow_gemm(int64_t M, int64_t N, int64_t K, const loom__gmat *a, const loom__gmat *b,
                       float *c, const loom__gdim *crow, const loom__gdim *ccol, bool accumulate,
                       void *scratch) {
    enum { ROWS = 48 }; /* a block (K <= 16384: its chunks fit the scratch after it) */
    float *out = (float *)(((uintptr_t)scratch + 63) & ~(uintptr_t)63);
    int64_t *roff = (int64_t *)(out + ROWS * 16), coff[16];
    loom__dot_rows s;
    loom__dot_rows_begin(&s, b, N, K, roff + ROWS);
    loom__gd_offsets(ccol, 0, N, coff);
    for (int64_t i0 = 0; i0 < M; i0 += ROWS) {
        int64_t rows = M - i0 < ROWS ? M - i0 : ROWS;
        loom__dot_rows_run(&s, a->p + i0 * a->row.stride[0], a->row.stride[0], rows, out);
        loom__gd_offsets(crow, i0, rows, roff);
        for (int64_t i = 0; i < rows; i++)
            for (int64_t j = 0; j < N; j++) {
                float *d = c + roff[i] + coff[j];
                *d = accumulate ? *d + out[i * N + j] : out[i * N + j];
            }
    }
}

#else
bool loom__dot_rows_ok(int64_t M, int64_t N, int64_t K, const loom__gmat *a, const loom__gmat *b) {
    (void)M, (void)N, (void)K, (void)a, (void)b;
    return false;
}
size_t loom__dot_rows_bytes(int64_t K) {
    (void)K;
    return 0;
}
void loom__dot_rows_begin(loom__dot_rows *s, const loom__gmat *b, int64_t N, int64_t K, void *buf) {
    (void)s, (void)b, (void)N, (void)K, (void)buf;
    LOOM_ASSERT(!"loom__dot_rows without AVX-512");
}
void loom__dot_rows_run(const loom__dot_rows *s, const float *a, int64_t lda, int64_t rows,
                        float *c) {
    (void)s, (void)a, (void)lda, (void)rows, (void)c;
    LOOM_ASSERT(!"loom__dot_rows without AVX-512");
}
#endif
