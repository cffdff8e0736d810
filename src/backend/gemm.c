/*
 * gemm.c - loom's own float32 matrix multiply for CPUs with AVX-512: C = A B, BLIS-style. B is
 * packed in panels of KC x 48 columns (32 for the last two where 48 + 16 would be left, 16 or 32
 * for a last narrow one: panel_at), A in panels of MR x KC, both in the caller's scratch, and an
 * 8 x 48 register-blocked microkernel (24 accumulators, three loads and eight broadcasts per k;
 * 8 x 32 and 8 x 16 on narrower panels) does the arithmetic with FMA. 8 rows: the common batch
 * and channel counts (multiples of 8) need no padded tile; 48 columns: 24 FMAs per 11 loads
 * (bench/gemm.c measures the forms; bench/RESULTS.md has the figures, against the OpenBLAS kernel
 * that runs under OPENBLAS_CORETYPE=Haswell). The default where AVX-512 exists (LOOM_MATMUL=blas
 * selects OpenBLAS); without it the caller uses BLAS. Operands may be compound views (internal.h:
 * an unfold read as a matrix): their panels are packed straight from the image by runs of
 * contiguous lanes, and a compound C (a fold's) is gathered a block at a time and added into its
 * places row by row (C += A B). A dense layer's epilogue (a bias row, a ReLU) may be applied in
 * registers as the last k block stores C's final values (loom__sgemm_act), so that C is written
 * once, already activated (or, for a product run as its transpose, nt_by_transpose, as C^T is
 * transposed into C); a residual (a matrix added) likewise. A product with a small C and a long K
 * (a first convolution's weight gradient: few input channels, every position of the batch) is dot
 * products along K instead (gemm_dot.c). Every element is summed in a fixed order (k ascending
 * within KC blocks; on the dot-product path 16 lanes of k and a fixed tree), so runs repeat
 * bitwise.
 */
#include "gemm_impl.h"

#include <stdlib.h>
#include <string.h>
#include <tgmath.h>

#include "../graph/opmath.h"

_Static_assert(NC % 48 == 0 && NC % 32 == 0, "column blocks are whole panels");

size_t loom__gemm_scratch_bytes(void) {
    return sizeof(float) * ((size_t)PA + (size_t)KC * (NC + 2 * NR) + (size_t)(MC + MR) * NC) +
           sizeof(int64_t) * (KC + NR + (MC + MR) + (NC + 2 * NR)) + 128;
}

#ifdef LOOM_GEMM512

/* The epilogue in registers on 16 final values of C from column j of the tile (those of lanes m:
 * the others are not read): the bias's element added (C + bias, as the generated ADD), then the
 * ReLU (a <= 0 ? 0 : a, NaN kept). */
__attribute__((target("avx512f"))) static inline __m512
act_vec(const loom__gemm_act *act, int64_t i, int64_t j, __mmask16 m, __m512 v) {
    if (act->mask)
        return _mm512_maskz_mov_ps(
            _mm512_cmp_ps_mask(_mm512_maskz_loadu_ps(m, act->mask + i * act->ldm + j),
                               _mm512_setzero_ps(), _CMP_GT_OQ),
            v);
    if (act->bias)
        v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, act->bias + j));
    if (act->addend)
        v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, act->addend + i * act->ldm + j));
    if (act->relu)
        v = _mm512_mask_mov_ps(v, _mm512_cmp_ps_mask(v, _mm512_setzero_ps(), _CMP_LE_OQ),
                               _mm512_setzero_ps());
    return v;
}

/* The op table's scalar expressions in float (op_ADD, op_RELU, ...), as the interpreter and the
 * generated kernels compute them (with the functions they call). */
LOOM_OPMATH(LOOM_OPMATH_EMIT)
#    define LOOM_EW(NAME, ARITY, EXPR)                             \
        static inline float op_##NAME(float a, float b, float c) { \
            (void)a, (void)b, (void)c;                             \
            return (float)(EXPR);                                  \
        }
#    include "../graph/ops.def"

/* ... on one value (ragged tiles), by the op table's expressions */
static inline float act_one(const loom__gemm_act *act, int64_t i, int64_t j, float v) {
    if (act->mask)
        return op_WHERE(op_CMPGT(act->mask[i * act->ldm + j], 0, 0), v, 0);
    if (act->bias)
        v = op_ADD(v, act->bias[j], 0);
    if (act->addend)
        v = op_ADD(v, act->addend[i * act->ldm + j], 0);
    return act->relu ? op_RELU(v, 0, 0) : v;
}

/* A full MR x (16 NV) tile of a row-major C (ldc apart) = (or +=) A panel x packed B panel over kc:
 * micro2 for 32-wide panels, micro3 for 48-wide ones; micro1 (and micro2 on a 48-wide panel) for
 * the first columns of a panel that a ragged edge of C leaves narrower (pbs: the panel's width,
 * its k rows apart). A is a packed panel (A(r, k) at pa[k MR + r]) or, for the _d kernels, read
 * where it is (an operand contiguous along k: A(r, k) at pa[r lda + k], its rows broadcast
 * straight from memory, no pack). Each element is the same chain of FMAs whatever the width. */
#    define MICRO(NV, SUF, AS, AK)                                                             \
        __attribute__((target("avx512f"))) static void micro##NV##SUF(                         \
            int64_t kc, const float *pa, int64_t lda, const float *pb, int64_t pbs, float *c,  \
            int64_t ldc, bool accumulate, const loom__gemm_act *act) {                         \
            (void)lda;                                                                         \
            __m512 acc[MR][NV];                                                                \
            _Pragma("GCC unroll 16") for (int r = 0; r < MR; r++) for (int v = 0; v < NV; v++) \
                _mm_prefetch((const char *)(c + r * ldc + 16 * v), _MM_HINT_T0),               \
                acc[r][v] = _mm512_setzero_ps();                                               \
            _Pragma("GCC unroll 4") for (int64_t k = 0; k < kc; k++, pb += pbs) {              \
                __m512 bv[NV];                                                                 \
                _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) bv[v] =                   \
                    _mm512_loadu_ps(pb + 16 * v);                                              \
                _Pragma("GCC unroll 16") for (int r = 0; r < MR; r++) {                        \
                    __m512 av = _mm512_set1_ps(pa[r * (AS) + k * (AK)]);                       \
                    _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) acc[r][v] =           \
                        _mm512_fmadd_ps(av, bv[v], acc[r][v]);                                 \
                }                                                                              \
            }                                                                                  \
            _Pragma("GCC unroll 16") for (int r = 0; r < MR; r++) {                            \
                float *cr = c + r * ldc;                                                       \
                for (int v = 0; v < NV; v++) {                                                 \
                    if (accumulate)                                                            \
                        acc[r][v] = _mm512_add_ps(acc[r][v], _mm512_loadu_ps(cr + 16 * v));    \
                    if (act)                                                                   \
                        acc[r][v] = act_vec(act, r, 16 * v, 0xffff, acc[r][v]);                \
                    _mm512_storeu_ps(cr + 16 * v, acc[r][v]);                                  \
                }                                                                              \
            }                                                                                  \
            for (int v = 0; act && act->colsum && v < NV; v++) { /* rows in order */           \
                __m512 sum = _mm512_loadu_ps(act->colsum + 16 * v);                            \
                _Pragma("GCC unroll 16") for (int r = 0; r < MR; r++) sum =                    \
                    _mm512_add_ps(sum, acc[r][v]);                                             \
                _mm512_storeu_ps(act->colsum + 16 * v, sum);                                   \
            }                                                                                  \
        }
MICRO(1, , 1, MR)
MICRO(2, , 1, MR)
MICRO(3, , 1, MR)
MICRO(1, _d, lda, 1)
MICRO(2, _d, lda, 1)
MICRO(3, _d, lda, 1)

typedef void micro_fn(int64_t, const float *, int64_t, const float *, int64_t, float *, int64_t,
                      bool, const loom__gemm_act *);
static micro_fn *const micros[2][3] = {{micro1, micro2, micro3}, {micro1_d, micro2_d, micro3_d}};

/* The first n (<= 48) columns of a tile from B's rows pbs apart (a packed panel: its width), 16
 * at a time. lda > 0: A read in place, its rows lda apart; 0: a packed panel. */
static void micro(int64_t pbs, int64_t n, int64_t kc, const float *pa, int64_t lda, const float *pb,
                  float *c, int64_t ldc, bool accumulate, const loom__gemm_act *act) {
    micros[lda != 0][(n + 15) / 16 - 1](kc, pa, lda, pb, pbs, c, ldc, accumulate, act);
}

/* Runs of columns contiguous in C (at most `most` each, for one masked access): the first
 * column and length of each into j0, len (room for n); returns how many. */
static int64_t column_runs(const int64_t *coff, int64_t n, int64_t most, int64_t *j0,
                           int64_t *len) {
    int64_t nr = 0;
    for (int64_t j = 0; j < n; j += len[nr++]) {
        j0[nr] = j, len[nr] = 1;
        while (j + len[nr] < n && len[nr] < most && coff[j + len[nr]] == coff[j] + len[nr])
            len[nr]++;
    }
    return nr;
}

/* Rows of t (ld apart) to C at row offsets roff and column offsets coff, by the given runs (a
 * masked load, add and store each): per element the operations of one at a time, in order. */
__attribute__((target("avx512f"))) static void
put_runs(const float *t, int64_t ld, float *c, const int64_t *roff, const int64_t *coff, int64_t m,
         const int64_t *j0, const int64_t *len, int64_t nr, bool accumulate) {
    for (int64_t r = 0; r < m; r++) {
        float *cr = c + roff[r];
        /* even runs, then odd ones: neighbouring runs can share a 64-byte span, and a masked load
         * within the span of a masked store just issued waits for it (measured); a row's runs
         * are disjoint, so the order does not change any sum */
        for (int64_t q0 = 0; q0 < 2; q0++)
            for (int64_t q = q0; q < nr; q += 2) {
                __mmask16 mk = (__mmask16)((1u << len[q]) - 1);
                float *d = cr + coff[j0[q]];
                __m512 v = _mm512_maskz_loadu_ps(mk, t + r * ld + j0[q]);
                if (accumulate)
                    v = _mm512_add_ps(_mm512_maskz_loadu_ps(mk, d), v);
                _mm512_mask_storeu_ps(d, mk, v);
            }
    }
}

/* The m x n corner of a tile to C: by runs when rows cannot overlap or nothing is added, else
 * one element at a time (a masked load of what the previous row just stored would wait). */
static void put_tile(const float *tile, float *c, const int64_t *roff, const int64_t *coff,
                     int64_t m, int64_t n, bool accumulate, bool disjoint) {
    if (!accumulate || disjoint) {
        int64_t j0[NR], len[NR], nr = column_runs(coff, n, 16, j0, len);
        put_runs(tile, NR, c, roff, coff, m, j0, len, nr, accumulate);
        return;
    }
    for (int64_t r = 0; r < m; r++) {
        float *cr = c + roff[r];
        const float *t = tile + r * NR;
        for (int64_t j = 0; j < n; j++)
            cr[coff[j]] += t[j];
    }
}

/* Adds g rows of t (ld apart) whose offsets in C go up by one (a fold's kernel columns) into C,
 * run by run: each run's g rows, shifted, are added to C's values in registers in row order and
 * stored once, instead of g passes that each load what the last one just stored (a masked load
 * waits for an overlapping masked store). Per element the same additions in the same order; the
 * runs' spans (a run and the g - 1 columns after it) must not overlap. */
__attribute__((target("avx512f"))) static void put_group(const float *t, int64_t ld, float *c,
                                                         const int64_t *coff, int64_t g,
                                                         const int64_t *j0, const int64_t *len,
                                                         int64_t nr) {
    for (int64_t q0 = 0; q0 < 2; q0++) /* even runs, then odd ones, as in put_runs */
        for (int64_t q = q0; q < nr; q += 2) {
            __mmask16 run = (__mmask16)((1u << len[q]) - 1);
            __mmask16 span = (__mmask16)((1u << (len[q] + g - 1)) - 1);
            float *d = c + coff[j0[q]];
            __m512 v = _mm512_maskz_loadu_ps(span, d);
            for (int64_t r = 0; r < g; r++) { /* row r's run lands r columns on */
                __mmask16 mk = (__mmask16)(run << r);
                v = _mm512_mask_add_ps(v, mk, v, _mm512_maskz_loadu_ps(mk, t + r * ld + j0[q] - r));
            }
            _mm512_mask_storeu_ps(d, span, v);
        }
}

/* An m x n block of C gathered in cb (NC apart) added to C (or written) a whole row at a time;
 * rows whose offsets go up by one (a fold's kernel columns) a group at a time (put_group). */
static void put_block(const float *cb, float *c, const int64_t *roff, const int64_t *coff,
                      int64_t m, int64_t n, bool accumulate) {
    enum { G = 4 }; /* rows a group at most */
    int64_t j0[NC], len[NC], nr = column_runs(coff, n, 16 - (G - 1), j0, len);
    int64_t most = accumulate ? G : 1; /* rows a group: the runs' gaps in C, plus one */
    for (int64_t q = 0; most > 1 && q + 1 < nr; q++) {
        int64_t gap = coff[j0[q + 1]] - coff[j0[q]] - len[q];
        most = gap < 0 ? 1 : gap + 1 < most ? gap + 1 : most;
    }
    for (int64_t r = 0, g; r < m; r += g) {
        for (g = 1; g < most && r + g < m && roff[r + g] == roff[r] + g; g++)
            ;
        if (g > 1)
            put_group(cb + r * NC, NC, c + roff[r], coff, g, j0, len, nr);
        else
            put_runs(cb + r * NC, NC, c, roff + r, coff, 1, j0, len, nr, accumulate);
    }
}

bool loom__gemm_available(void) {
    return __builtin_cpu_supports("avx512f");
}

typedef struct {
    void (*fn)(void *ctx, int64_t jc, int64_t nc);
    void *ctx;
} done_fn;

/* The width of the panel at column jr of a column block of nc: 48 (24 FMAs per 11 loads, against
 * 16 per 10 at 32: 198 against 189 GFLOP/s in L1 here), the last one only as wide as the vectors
 * left, and the last 64 columns two 32-wide panels rather than 48 + 16 (8 FMAs per 9 loads):
 * N = 256 is 4 x 48 + 2 x 32, N = 128 2 x 48 + 32. Every element is the same chain of FMAs
 * whatever its panel, so the widths never change a bit of C. */
static int64_t panel_at(int64_t nc, int64_t jr) {
    int64_t v = (nc + 15) / 16, left = (nc - jr + 15) / 16 * 16;
    if (v % 3 == 1 && v > 3 && left <= 64)
        return 32;
    return left < NR ? left : NR;
}

/* ---- products whose B is an image read through an unfold (a convolution's forward and weight
 * gradient) computed as their transpose, C^T = B^T A^T, so that the image is the broadcast
 * operand: B^T's rows are read where they lie (row j at b + col(j), element k at + row(k)), with
 * no packed panels; A^T is packed in panels of 64 lanes. A 6 x 64 tile of C^T (24 accumulators,
 * four loads and six broadcasts per k) goes to a staging block of C^T, which 16 x 16 register
 * transposes then write into C. k ascending in equal blocks of at most KT, each block's sum added
 * to the last: a fixed order (not gemm()'s blocks; both backends take this path, so they agree). */
#    define TR 6  /* rows of C^T (columns of C) a tile */
#    define TW 64 /* columns of C^T (rows of C) a tile: four vectors */
/* k a block: A^T's 96 x 64 panel (24 KB) and the block's image rows fit the L1 together */
#    define KT 96

__attribute__((target("avx512f"))) static void micro_t(int64_t kc, const float *const *rp,
                                                       const int64_t *aoff, const float *pb,
                                                       float *t, int64_t ldt, bool accumulate) {
    __m512 acc[TR][4];
    for (int r = 0; r < TR; r++)
        for (int v = 0; v < 4; v++)
            acc[r][v] = _mm512_setzero_ps();
    const float *r0 = rp[0], *r1 = rp[1], *r2 = rp[2], *r3 = rp[3], *r4 = rp[4], *r5 = rp[5];
    for (int64_t k = 0; k < kc; k++, pb += TW) {
        __m512 b0 = _mm512_loadu_ps(pb), b1 = _mm512_loadu_ps(pb + 16);
        __m512 b2 = _mm512_loadu_ps(pb + 32), b3 = _mm512_loadu_ps(pb + 48);
        int64_t o = aoff[k];
        const float *row[TR] = {r0 + o, r1 + o, r2 + o, r3 + o, r4 + o, r5 + o};
        for (int r = 0; r < TR; r++) {
            __m512 av = _mm512_set1_ps(*row[r]);
            acc[r][0] = _mm512_fmadd_ps(av, b0, acc[r][0]);
            acc[r][1] = _mm512_fmadd_ps(av, b1, acc[r][1]);
            acc[r][2] = _mm512_fmadd_ps(av, b2, acc[r][2]);
            acc[r][3] = _mm512_fmadd_ps(av, b3, acc[r][3]);
        }
    }
    for (int r = 0; r < TR; r++)
        for (int v = 0; v < 4; v++) {
            if (accumulate)
                acc[r][v] = _mm512_add_ps(acc[r][v], _mm512_loadu_ps(t + r * ldt + 16 * v));
            _mm512_storeu_ps(t + r * ldt + 16 * v, acc[r][v]);
        }
}

/* Rows [0, n) x columns [0, m) of t (rows ld apart) transposed into c (rows ldc apart), with the
 * epilogue act (a bias, a ReLU; or NULL) on C's values as they are stored. */
__attribute__((target("avx512f"))) static void put_transposed(const float *t, int64_t ld, int64_t n,
                                                              int64_t m, float *c, int64_t ldc,
                                                              const loom__gemm_act *act) {
    for (int64_t j0 = 0; j0 < n; j0 += 16)
        for (int64_t i0 = 0; i0 < m; i0 += 16) {
            int rows = (int)(n - j0 < 16 ? n - j0 : 16), cols = (int)(m - i0 < 16 ? m - i0 : 16);
            __mmask16 lm = (__mmask16)((1u << cols) - 1), sm = (__mmask16)((1u << rows) - 1);
            __m512 r[16];
            for (int q = 0; q < 16; q++)
                r[q] = q < rows ? _mm512_maskz_loadu_ps(lm, t + (j0 + q) * ld + i0)
                                : _mm512_setzero_ps();
            loom__transpose16(r);
            for (int q = 0; q < cols; q++)
                _mm512_mask_storeu_ps(c + (i0 + q) * ldc + j0, sm,
                                      act ? act_vec(act, i0 + q, j0, sm, r[q]) : r[q]);
        }
}

/* Whether gemm() runs a product as its transpose with the image broadcast: B compound along
 * both its dims (an unfold's windows: a broadcast row's elements lie close together, where a
 * flattened (C,N,H,W) activation's are a batch row apart), A plain, C row-major and written (not
 * added to), M wide enough to fill most of a tile's 64 lanes. */
static bool by_transpose(int64_t M, int64_t N, const loom__gmat *a, const loom__gmat *b,
                         const loom__gdim *crow, const loom__gdim *ccol, bool accumulate) {
    return b->row.n > 1 && b->col.n > 1 && a->row.n == 1 && a->col.n == 1 && crow->n == 1 &&
           ccol->n == 1 && ccol->stride[0] == 1 && !accumulate && M >= 48 && M <= 2 * TW && N >= TR;
}

/* k blocks of a product of K run by its transpose: equal, of at most KT (as gemm()'s of KC). */
static int64_t t_kstep(int64_t K) {
    int64_t kb = (K + KT - 1) / KT;
    return (K + kb - 1) / kb;
}

/* k block [pc, pc + kc) of C^T (its first nc rows, mpad apart in the staging block tb) from A^T's
 * panels packed at pp and B's columns at offsets coff: added to what the blocks before it left
 * there (written by the first). koff is scratch. */
static void t_kblock(int64_t nc, int64_t mpad, int64_t pc, int64_t kc, const float *pp,
                     const loom__gmat *b, const int64_t *coff, int64_t *koff, float *tb) {
    loom__gd_offsets(&b->row, pc, kc, koff);
    for (int64_t ic = 0; ic < mpad; ic += TW)
        for (int64_t jr = 0; jr < nc; jr += TR) {
            const float *rp[TR];
            for (int r = 0; r < TR; r++) /* past the block: its last row again */
                rp[r] = b->p + coff[jr + r < nc ? jr + r : nc - 1];
            micro_t(kc, rp, koff, pp + ic * kc, tb + jr * mpad + ic, mpad, pc > 0);
        }
}

static void gemm_t(int64_t M, int64_t N, int64_t K, const loom__gmat *a, const loom__gmat *b,
                   float *c, int64_t ldc, const done_fn *done, void *scratch) {
    float *pa = (float *)(((uintptr_t)scratch + 63) & ~(uintptr_t)63);
    float *pb = pa + (size_t)PA;                 /* A^T's panels */
    float *tb = pb + (size_t)KC * (NC + 2 * NR); /* a block of C^T, NC (+ a tile) x mpad */
    int64_t *koff = (int64_t *)(tb + (size_t)(MC + MR) * NC), *coff = koff + KC + NR + MC + MR;
    int64_t kstep = t_kstep(K), mpad = (M + TW - 1) / TW * TW;
    bool once = mpad * K <= (int64_t)KC * (NC + 2 * NR); /* A^T packed once for every block */
    for (int64_t pc = 0; once && pc < K; pc += kstep)
        loom__gemm_pack(M, K - pc < kstep ? K - pc : kstep, a->p + pc * a->col.stride[0],
                        a->row.stride[0], a->col.stride[0], TW, pb + mpad * pc);
    for (int64_t jc = 0; jc < N; jc += NC) {
        int64_t nc = N - jc < NC ? N - jc : NC;
        loom__gd_offsets(&b->col, jc, nc, coff);
        for (int64_t pc = 0; pc < K; pc += kstep) {
            int64_t kc = K - pc < kstep ? K - pc : kstep;
            if (!once)
                loom__gemm_pack(M, kc, a->p + pc * a->col.stride[0], a->row.stride[0],
                                a->col.stride[0], TW, pb);
            t_kblock(nc, mpad, pc, kc, once ? pb + mpad * pc : pb, b, coff, koff, tb);
        }
        float *cb = done ? c : c + jc;
        put_transposed(tb, mpad, nc, M, cb, ldc, NULL);
        if (done)
            done->fn(done->ctx, jc, nc);
    }
}

/* Whether gemm() runs a product of two operands contiguous along k (a dense layer's forward: X
 * times a weight read transposed) as its transpose, C^T = B^T A^T, into a staging block of C^T
 * that is then transposed into C with the epilogue: B would need a transposing pack of N lanes,
 * the transposed product packs A^T's M instead. Where N > 2 M (a wide layer on few rows); at
 * N = 2 M the transposed store costs what the smaller pack saves (bench/RESULTS.md). Each element
 * is the same chain of FMAs over k (a product's factors commute exactly), so C's bits are the
 * direct product's. */
static bool nt_by_transpose(int64_t M, int64_t N, int64_t K, const loom__gmat *a,
                            const loom__gmat *b, const loom__gdim *crow, const loom__gdim *ccol,
                            bool accumulate, const loom__gemm_act *act) {
    return N > 2 * M && M >= 16 && K >= 16 && N * M <= (int64_t)(MC + MR) * NC && !accumulate &&
           (!act || (!act->mask && !act->colsum)) && crow->n == 1 && ccol->n == 1 &&
           ccol->stride[0] == 1 && a->row.n == 1 && a->col.n == 1 && a->col.stride[0] == 1 &&
           b->row.n == 1 && b->col.n == 1 && b->row.stride[0] == 1 && b->col.stride[0] != 1;
}

/* N in equal blocks of about NC, multiples of nr (300 = 192 + 108, not 288 + 12). */
static int64_t column_step(int64_t N, int64_t nr) {
    int64_t nb = (N + NC - 1) / NC;
    return ((N + nb - 1) / nb + nr - 1) / nr * nr;
}

/* Columns [j0, j0 + N) of a product of nfull columns (loom__conv_back): panels and column blocks
 * as the whole product has them, C's columns counted from j0; a_ready: A's panels are still in
 * the scratch from the previous part. */
typedef struct {
    int64_t j0, nfull;
    bool a_ready;
} gemm_part;

/* act (with a plain C, whole, no done or part): the epilogue applied to C's final values as
 * they are stored (act_vec). */
static void gemm(int64_t M, int64_t N, int64_t K, const loom__gmat *a, const loom__gmat *b,
                 float *c, const loom__gdim *crow, const loom__gdim *ccol, bool accumulate,
                 const done_fn *done, void *scratch, const gemm_part *part,
                 const loom__gemm_act *act) {
    float *pa = (float *)(((uintptr_t)scratch + 63) & ~(uintptr_t)63);
    float *pb = pa + (size_t)PA;
    float *cb = pb + (size_t)KC * (NC + 2 * NR); /* a block of C, (MC + MR) x NC */
    int64_t *koff = (int64_t *)(cb + (size_t)(MC + MR) * NC), *loff = koff + KC;
    int64_t *roff = loff + NR, *coff = roff + MC + MR;
    /* a row-major C takes full tiles straight from the registers */
    bool plain = crow->n == 1 && ccol->n == 1 && ccol->stride[0] == 1;
    int64_t ldc = crow->stride[0];
    if (K > 0 && !part && !act && by_transpose(M, N, a, b, crow, ccol, accumulate)) {
        gemm_t(M, N, K, a, b, c, ldc, done, scratch);
        return;
    }
    if (!part && !done && nt_by_transpose(M, N, K, a, b, crow, ccol, accumulate, act)) {
        loom__gmat at = {a->p, a->col, a->row}, bt = {b->p, b->col, b->row};
        loom__gdim trow = {1, {N}, {M}}, tcol = {1, {M}, {1}};
        gemm(N, M, K, &bt, &at, cb, &trow, &tcol, false, NULL, scratch, NULL, NULL);
        put_transposed(cb, M, N, M, c, ldc, act); /* (the inner gemm leaves cb alone) */
        return;
    }
    for (int64_t j = 0; act && act->colsum && j < N; j++) /* a sum starts from 0 */
        act->colsum[j] = 0;
    if (K == 0) {
        for (int64_t i = 0; i < M && !accumulate; i++) {
            loom__gd_offsets(crow, i, 1, roff);
            for (int64_t j = 0; j < N; j++) {
                loom__gd_offsets(ccol, j, 1, coff);
                c[roff[0] + coff[0]] = act ? act_one(act, i, j, 0) : 0;
                if (act && act->colsum)
                    act->colsum[j] = act->colsum[j] + c[roff[0] + coff[0]];
            }
        }
        return;
    }
    /* K in equal blocks of at most KC (288 = 2 x 144, not 192 + 96: a thin last block would pay a
     * full pass over C for little arithmetic). */
    int64_t kb = (K + KC - 1) / KC, kstep = (K + kb - 1) / kb;
    int64_t nfull = part ? part->nfull : N, j0 = part ? part->j0 : 0;
    int64_t nstep = column_step(nfull, NR);
    float tile[MR * NR];
    /* A compound C computed in one k block (a fold's) is gathered a block at a time and written
     * out row by row (measured faster than tile by tile: a fold's rows overlap in C). */
    bool gathered = !plain && kb == 1;
    /* A packed once for every column block when all of it fits (a convolution's weights); else,
     * contiguous along k, read in place (its full panels; a ragged last one is packed); else
     * packed a block at a time */
    int64_t mpad = (M + MR - 1) / MR * MR, lda = a->row.stride[0];
    /* B's rows read in place (its full panels) where few row tiles would reuse a packed panel:
     * the pack would cost more than it saves (a classifier's weight gradient, M = 10) */
    bool b_rows = M <= 2 * MR && b->row.n == 1 && b->col.n == 1 && b->col.stride[0] == 1;
    /* With one block of rows, B is packed a panel at a time just before its tiles use it: the
     * panel (kc x 48 at most, 36 KB) is made and read in L1, where a whole block of panels went out
     * to L2 and came back (the transposing pack of a weight was bound by that traffic) */
    bool by_panel = !b_rows && M <= MC && !(!plain && kb == 1);
    bool a_rows = a->row.n == 1 && a->col.n == 1 && a->col.stride[0] == 1; /* along k */
    bool a_once = mpad * K <= (int64_t)(a_rows ? PA_ONCE : PA);
    bool direct = !a_once && a_rows;
    for (int64_t pc = 0; a_once && !(part && part->a_ready) && pc < K; pc += kstep)
        loom__gemm_pack_g(a->p, &a->row, 0, M, &a->col, pc, K - pc < kstep ? K - pc : kstep, MR,
                          pa + mpad * pc, koff, loff);
    for (int64_t jc = 0; jc < N; jc += nstep) {
        int64_t nc = N - jc < nstep ? N - jc : nstep;
        loom__gd_offsets(ccol, j0 + jc, nc, coff);
        for (int64_t j = nc - 1; done && j >= 0; j--) /* the block's own buffer */
            coff[j] -= coff[0];
        for (int64_t pc = 0; pc < K; pc += kstep) {
            int64_t kc = K - pc < kstep ? K - pc : kstep;
            bool acc = accumulate || pc > 0;
            bool fin = act && pc + kc == K; /* C's final values are stored now */
            for (int64_t jr = 0, w; !b_rows && !by_panel && jr < nc; jr += w) {
                w = panel_at(nc, jr); /* the block's panels, one after another */
                loom__gemm_pack_g(b->p, &b->col, jc + jr, nc - jr < w ? nc - jr : w, &b->row, pc,
                                  kc, w, pb + jr * kc, koff, loff);
            }
            for (int64_t ic = 0; ic < M; ic += MC) {
                int64_t mc = M - ic < MC ? M - ic : MC;
                const float *pap = a_once ? pa + mpad * pc + ic * kc : pa;
                int64_t full = direct ? mc / MR * MR : 0; /* panels read in place */
                if (!a_once && full < mc)
                    loom__gemm_pack_g(a->p, &a->row, ic + full, mc - full, &a->col, pc, kc, MR, pa,
                                      koff, loff);
                loom__gd_offsets(crow, ic, mc, roff);
                for (int64_t jr = 0, w; jr < nc; jr += w) {
                    w = panel_at(nc, jr);
                    int64_t n = nc - jr < w ? nc - jr : w;
                    /* into the panel buffer, just before its tiles read it (read in place: only
                     * a ragged last panel is packed) */
                    if (by_panel || (b_rows && n < w))
                        loom__gemm_pack_g(b->p, &b->col, jc + jr, n, &b->row, pc, kc, w, pb, koff,
                                          loff);
                    for (int64_t ir = 0; ir < mc; ir += MR) {
                        int64_t m = mc - ir < MR ? mc - ir : MR;
                        const float *bp = pb + (b_rows || by_panel ? 0 : jr * kc),
                                    *ap = pap + (ir - full) * kc;
                        int64_t ld = ir < full ? lda : 0, pbs = w;
                        if (b_rows && n == w)
                            bp = b->p + pc * b->row.stride[0] + jc + jr, pbs = b->row.stride[0];
                        if (ld)
                            ap = a->p + (ic + ir) * lda + pc;
                        loom__gemm_act ta = {
                            fin && act->bias ? act->bias + jc + jr : NULL,
                            fin && act->relu,
                            fin && act->mask ? act->mask + (ic + ir) * act->ldm + jc + jr : NULL,
                            fin ? act->ldm : 0,
                            fin && act->colsum ? act->colsum + jc + jr : NULL,
                            fin && act->addend ? act->addend + (ic + ir) * act->ldm + jc + jr
                                               : NULL};
                        if (plain && m == MR && n == w) {
                            micro(pbs, w, kc, ap, ld, bp, c + roff[ir] + coff[jr], ldc, acc,
                                  fin ? &ta : NULL);
                        } else if (gathered) { /* into the block, written out below */
                            micro(pbs, w, kc, ap, ld, bp, cb + ir * NC + jr, NC, false, NULL);
                        } else { /* only the vectors that hold C's columns */
                            micro(pbs, n, kc, ap, ld, bp, tile, NR, false, NULL);
                            put_tile(tile, c, roff + ir, coff + jr, m, n, acc, plain);
                            for (int64_t r = 0; fin && r < m; r++) /* plain: coff[j] = j */
                                for (int64_t j = 0; j < n; j++) {
                                    float *d = c + roff[ir + r] + coff[jr + j];
                                    *d = act_one(&ta, r, j, *d);
                                    if (ta.colsum)
                                        ta.colsum[j] = ta.colsum[j] + *d;
                                }
                        }
                    }
                }
                if (gathered)
                    put_block(cb, c, roff, coff, mc, nc, acc);
            }
        }
        if (done)
            done->fn(done->ctx, jc, nc);
    }
}

static loom__gdim gd1(int64_t size, int64_t stride) {
    return (loom__gdim){.n = 1, .size = {size}, .stride = {stride}};
}

static loom__gmat transposed(const loom__gmat *x) {
    return (loom__gmat){.p = x->p, .row = x->col, .col = x->row};
}

/* ---- the one place a product's form is chosen ----------------------------------------------
 * loom__sgemm_g runs a product in one of four forms: packed (gemm(): panels and the 8 x 48
 * microkernel, with its own variants by layout, all the same sums), transposed (the packed form
 * on C^T = B^T A^T: the same sums in the same order), dot (skinny_gemm: dot products along K in
 * 16 lanes and a fixed tree) and dot rows (narrow_gemm: the dot form a block of rows at a time,
 * the same sums as dot). The dot forms sum in another order than the packed ones, so the choice
 * is made from the shapes and layouts alone, never from timing: every run, device and backend
 * takes the same one. loom__gemm_form_ok says which forms can run a product (layouts, sizes
 * their scratch holds); loom__gemm_choose picks among them by the rules below, each measured
 * (build/bench_gemm times every legal form of its shapes; bench/RESULTS.md). The fused kernels'
 * conditions (loom__dot_rows_ok, loom__gemm_t_ok, loom__conv_back_ok, loom__conv_planes_ok) ask
 * it too, so that they compute what the product alone would. */
bool loom__gemm_form_ok(loom__gemm_form f, int64_t M, int64_t N, int64_t K, const loom__gmat *a,
                        const loom__gmat *b) {
    bool a_k = a->col.n == 1 && a->col.stride[0] == 1; /* A contiguous along k */
    switch (f) {
        case LOOM_GEMM_PACKED:
        case LOOM_GEMM_TRANSPOSED:
            return true;
        case LOOM_GEMM_DOT: /* B's k its innermost row sub-dimension, of stride 1 (or B copied a
                             * block at a time); the lanes of C */
            return M * N <= SK_MAX && a_k && (b->row.stride[b->row.n - 1] == 1 || N <= SK_PACK_N);
        case LOOM_GEMM_DOT_ROWS: /* B plain, contiguous along k; K's chunks in the scratch */
            return N < 16 && K <= 16384 && a_k && a->row.n == 1 && b->row.n == 1 &&
                   b->row.stride[0] == 1 && b->col.n == 1;
        default:
            return false;
    }
}

loom__gemm_form loom__gemm_choose(int64_t M, int64_t N, int64_t K, const loom__gmat *a,
                                  const loom__gmat *b) {
    /* a small C and a long K (a first convolution's weight gradient): panels would be mostly
     * padding (a side under 16) and the packs would cost more than the arithmetic */
    if ((M < 16 || N < 16 || M * N <= SK_MAX) && K >= 64 * (M > N ? M : N) &&
        loom__gemm_form_ok(LOOM_GEMM_DOT, M, N, K, a, b))
        return LOOM_GEMM_DOT;
    /* narrower than 16 columns on more rows (a classifier's logits): rows of dot products instead
     * of panels that are mostly padding and a transposing pack of all of A */
    if (M > N && K >= 16 && loom__gemm_form_ok(LOOM_GEMM_DOT_ROWS, M, N, K, a, b))
        return LOOM_GEMM_DOT_ROWS;
    /* narrower than half a panel on more rows (a weight gradient over few input taps): its
     * transpose fills the panels */
    if (N < 16 && M > N)
        return LOOM_GEMM_TRANSPOSED;
    return LOOM_GEMM_PACKED;
}

void loom__sgemm_form(loom__gemm_form f, int64_t M, int64_t N, int64_t K, const loom__gmat *a,
                      const loom__gmat *b, float *c, loom__gdim crow, loom__gdim ccol,
                      bool accumulate, void *scratch) {
    LOOM_ASSERT(loom__gemm_form_ok(f, M, N, K, a, b));
    if (f == LOOM_GEMM_DOT) {
        loom__skinny_gemm(M, N, K, a, b, c, &crow, &ccol, accumulate, scratch);
    } else if (f == LOOM_GEMM_DOT_ROWS) {
        loom__narrow_gemm(M, N, K, a, b, c, &crow, &ccol, accumulate, scratch);
    } else if (f == LOOM_GEMM_TRANSPOSED) {
        loom__gmat at = transposed(a), bt = transposed(b);
        gemm(N, M, K, &bt, &at, c, &ccol, &crow, accumulate, NULL, scratch, NULL, NULL);
    } else {
        gemm(M, N, K, a, b, c, &crow, &ccol, accumulate, NULL, scratch, NULL, NULL);
    }
}

/* ---- a product split across a device's cores -------------------------------------------------
 * The path a product takes: its form (loom__sgemm_g's choice; gemm() itself under
 * loom__sgemm_act and loom__sgemm_blocks) and, on the packed forms, whether gemm() runs it as
 * gemm_t, which sums k in other blocks. Every other choice (panels, column and row blocks, packs,
 * nt_by_transpose) leaves each element the same chain of FMAs, so a block of C's rows or columns
 * computed alone gives the whole's bits exactly when it takes the whole's path. */
static int path_of(int64_t M, int64_t N, int64_t K, const loom__gmat *a, const loom__gmat *b,
                   const loom__gdim *crow, const loom__gdim *ccol, bool accumulate,
                   loom__gemm_via via) {
    loom__gemm_form f =
        via == LOOM_GEMM_VIA_G ? loom__gemm_choose(M, N, K, a, b) : LOOM_GEMM_PACKED;
    bool t = false;
    if (K > 0 && via != LOOM_GEMM_VIA_ACT && f == LOOM_GEMM_PACKED)
        t = by_transpose(M, N, a, b, crow, ccol, accumulate);
    if (K > 0 && f == LOOM_GEMM_TRANSPOSED) {
        loom__gmat at = transposed(a), bt = transposed(b);
        t = by_transpose(N, M, &bt, &at, ccol, crow, accumulate);
    }
    return 2 * (int)f + t;
}

void loom__gemm_part(bool rows, int64_t at, int64_t len, int64_t *M, int64_t *N, loom__gmat *a,
                     loom__gmat *b, float **c, loom__gdim *crow, loom__gdim *ccol) {
    loom__gmat *x = rows ? a : b;
    loom__gdim *xd = rows ? &x->row : &x->col, *cd = rows ? crow : ccol;
    x->p += at * xd->stride[0];
    *c = *c ? *c + at * cd->stride[0] : NULL;
    xd->size[0] = cd->size[0] = len;
    *(rows ? M : N) = len;
}

int64_t loom__gemm_split(int64_t M, int64_t N, int64_t K, const loom__gmat *a, const loom__gmat *b,
                         loom__gdim crow, loom__gdim ccol, bool accumulate, loom__gemm_via via,
                         bool colsum, int parts, bool *rows) {
    int path = path_of(M, N, K, a, b, &crow, &ccol, accumulate, via);
    if (parts < 2 || path / 2 == LOOM_GEMM_DOT || path / 2 == LOOM_GEMM_DOT_ROWS)
        return 0;
    for (int pass = 0; pass < 2; pass++) {
        bool r = (M > N) == (pass == 0); /* the longer side first */
        bool can = r ? a->row.n == 1 && crow.n == 1 && !colsum && via != LOOM_GEMM_VIA_BLOCKS
                     : b->col.n == 1 && ccol.n == 1;
        int64_t extent = r ? M : N, block = (extent + 16 * parts - 1) / (16 * parts) * 16;
        block = block < 64 ? 64 : block;
        if (!can || extent <= block)
            continue;
        int64_t lens[2] = {block, extent - (extent - 1) / block * block}; /* the last block */
        bool same = true;
        for (int i = 0; i < 2; i++) {
            int64_t m = M, n = N;
            loom__gmat pa = *a, pb = *b;
            float *c = NULL;
            loom__gdim pr = crow, pcl = ccol;
            loom__gemm_part(r, 0, lens[i], &m, &n, &pa, &pb, &c, &pr, &pcl);
            same = same && path_of(m, n, K, &pa, &pb, &pr, &pcl, accumulate, via) == path;
        }
        if (same) {
            *rows = r;
            return block;
        }
    }
    return 0;
}

void loom__sgemm_g(int64_t M, int64_t N, int64_t K, const loom__gmat *a, const loom__gmat *b,
                   float *c, loom__gdim crow, loom__gdim ccol, bool accumulate, void *scratch) {
    loom__sgemm_form(loom__gemm_choose(M, N, K, a, b), M, N, K, a, b, c, crow, ccol, accumulate,
                     scratch);
}

void loom__sgemm_blocks(int64_t M, int64_t N, int64_t K, const loom__gmat *a, const loom__gmat *b,
                        float *c, int64_t ldc, void (*done)(void *ctx, int64_t jc, int64_t nc),
                        void *ctx, void *scratch) {
    done_fn d = {done, ctx};
    loom__gdim crow = gd1(M, ldc), ccol = gd1(N, 1);
    gemm(M, N, K, a, b, c, &crow, &ccol, false, &d, scratch, NULL, NULL);
}

void loom__sgemm_act(int64_t M, int64_t N, int64_t K, const loom__gmat *a, const loom__gmat *b,
                     float *c, int64_t ldc, const loom__gemm_act *act, void *scratch) {
    loom__gdim crow = gd1(M, ldc), ccol = gd1(N, 1);
    gemm(M, N, K, a, b, c, &crow, &ccol, false, NULL, scratch, NULL, act);
}

void loom__sgemm(int64_t M, int64_t N, int64_t K, const float *a, int64_t ars, int64_t acs,
                 const float *b, int64_t brs, int64_t bcs, float *c, int64_t ldc, void *scratch) {
    loom__gmat ga = {a, gd1(M, ars), gd1(K, acs)}, gb = {b, gd1(K, brs), gd1(N, bcs)};
    loom__sgemm_g(M, N, K, &ga, &gb, c, gd1(M, ldc), gd1(N, 1), false, scratch);
}

/* ---- a convolution's backward from its output gradient made a block of columns at a time ---- */

/* The gradient's rows as a matrix: K rows ld apart, n columns. */
static loom__gmat rows_of(const float *r, int64_t K, int64_t ld, int64_t n) {
    return (loom__gmat){r, gd1(K, ld), gd1(n, 1)};
}

/* The fold's column blocks taken a span at a time: whole blocks, at least 512 columns. */
static int64_t back_span(int64_t N) {
    int64_t nstep = column_step(N, NR), span = nstep; /* as gemm() takes them */
    while (span < 512)
        span += nstep;
    return span;
}

bool loom__conv_back_ok(int64_t M, int64_t N, int64_t K, const loom__gmat *a, int64_t WN,
                        const loom__gmat *b) {
    loom__gmat r = rows_of(NULL, K, N, N);
    loom__gdim wrow = gd1(K, WN), wcol = gd1(WN, 1);
    /* the fold's product: one k block, by gemm() (as loom__sgemm_g runs it); the weight
     * gradient: by its transpose, all of C^T in one staging block */
    return loom__gemm_available() && K >= 1 && K <= KC && N >= 16 && a->row.n == 1 &&
           a->col.n == 1 && loom__gemm_choose(M, N, K, a, &r) == LOOM_GEMM_PACKED && WN <= NC &&
           loom__gemm_choose(K, WN, N, &r, b) == LOOM_GEMM_PACKED &&
           by_transpose(K, WN, &r, b, &wrow, &wcol, false);
}

/* The rows' pitch: a span and a k block of the weight gradient, pad on either side. */
static int64_t back_pitch(int64_t N, int64_t pad) {
    return (back_span(N) + t_kstep(N) + 2 * pad + 15) / 16 * 16;
}

size_t loom__conv_back_bytes(int64_t N, int64_t K, int64_t WN, int64_t pad) {
    return sizeof(float) * (size_t)(K * back_pitch(N, pad) + (K + TW - 1) / TW * TW * WN) +
           sizeof(int64_t) * (size_t)WN + 128;
}

void loom__conv_back(int64_t M, int64_t N, int64_t K, const loom__gmat *a, loom__gdim crow,
                     loom__gdim ccol, float *c, int64_t WN, const loom__gmat *b, float *w,
                     int64_t ldw, loom__rows_fn rows, void *ctx, int64_t pad, void *buf,
                     void *scratch) {
    float *pa = (float *)(((uintptr_t)scratch + 63) & ~(uintptr_t)63);
    float *pb = pa + (size_t)PA; /* the gradient's k blocks as A^T's panels (gemm_t) */
    int64_t *koff = (int64_t *)(pb + (size_t)KC * (NC + 2 * NR) + (size_t)(MC + MR) * NC);
    int64_t ld = back_pitch(N, pad), mpad = (K + TW - 1) / TW * TW;
    int64_t span = back_span(N), kstep = t_kstep(N);
    float *r = (float *)(((uintptr_t)buf + 63) & ~(uintptr_t)63) + pad;
    float *tb = r - pad + K * ld; /* the weight gradient's transpose, summed over k blocks */
    int64_t *coff = (int64_t *)(tb + mpad * WN);
    loom__gd_offsets(&b->col, 0, WN, coff);
    /* spans of the fold's columns; the rows from the first k block not yet done (lo), so that
     * every k block of the weight gradient lies in the rows made for it */
    for (int64_t fj = 0, pc = 0; fj < N; fj += span) {
        int64_t hi = N - fj < span ? N : fj + span, lo = pc < fj ? pc : fj;
        rows(ctx, lo, hi - lo, r, ld);
        for (int64_t kc; pc < N && pc + (kc = N - pc < kstep ? N - pc : kstep) <= hi; pc += kc) {
            loom__gemm_pack(K, kc, r + (pc - lo), ld, 1, TW, pb);
            t_kblock(WN, mpad, pc, kc, pb, b, coff, koff, tb);
        }
        loom__gmat rb = rows_of(r + (fj - lo), K, ld, hi - fj);
        gemm(M, hi - fj, K, a, &rb, c, &crow, &ccol, true, NULL, scratch,
             &(gemm_part){fj, N, fj > 0}, NULL);
    }
    put_transposed(tb, mpad, WN, K, w, ldw, NULL);
}
/* ---- a product by its transpose over chosen columns (a pooling's windows, place by place) ---- */

bool loom__gemm_t_ok(int64_t M, int64_t N, int64_t K, const loom__gmat *a, const loom__gmat *b) {
    loom__gdim crow = gd1(M, N), ccol = gd1(N, 1);
    int64_t mpad = (M + TW - 1) / TW * TW;
    /* as loom__sgemm_g runs it (gemm_t), with A^T packed once */
    return loom__gemm_available() && K >= 1 &&
           loom__gemm_choose(M, N, K, a, b) == LOOM_GEMM_PACKED &&
           by_transpose(M, N, a, b, &crow, &ccol, false) && mpad * K <= (int64_t)KC * (NC + 2 * NR);
}

void loom__gemm_t_cols(int64_t M, int64_t K, const loom__gmat *a, const loom__gmat *b,
                       const int64_t *coff, int64_t n, float *c, int64_t ldc, bool packed,
                       void *scratch) {
    float *pa = (float *)(((uintptr_t)scratch + 63) & ~(uintptr_t)63);
    float *pb = pa + (size_t)PA;                 /* A^T's panels, every k block */
    float *tb = pb + (size_t)KC * (NC + 2 * NR); /* a block of C^T */
    int64_t *koff = (int64_t *)(tb + (size_t)(MC + MR) * NC);
    int64_t kstep = t_kstep(K), mpad = (M + TW - 1) / TW * TW;
    for (int64_t pc = 0; !packed && pc < K; pc += kstep)
        loom__gemm_pack(M, K - pc < kstep ? K - pc : kstep, a->p + pc * a->col.stride[0],
                        a->row.stride[0], a->col.stride[0], TW, pb + mpad * pc);
    for (int64_t jc = 0; jc < n; jc += NC) {
        int64_t nc = n - jc < NC ? n - jc : NC;
        for (int64_t pc = 0; pc < K; pc += kstep)
            t_kblock(nc, mpad, pc, K - pc < kstep ? K - pc : kstep, pb + mpad * pc, b, coff + jc,
                     koff, tb);
        put_transposed(tb, mpad, nc, M, c + jc, ldc, NULL);
    }
}
#    undef TR
#    undef TW
#    undef KT
#else
bool loom__gemm_available(void) {
    return false;
}
void loom__sgemm_g(int64_t M, int64_t N, int64_t K, const loom__gmat *a, const loom__gmat *b,
                   float *c, loom__gdim crow, loom__gdim ccol, bool accumulate, void *scratch) {
    (void)M, (void)N, (void)K, (void)a, (void)b, (void)c, (void)crow, (void)ccol;
    (void)accumulate, (void)scratch;
    LOOM_ASSERT(!"loom__sgemm_g without AVX-512");
}
void loom__sgemm_blocks(int64_t M, int64_t N, int64_t K, const loom__gmat *a, const loom__gmat *b,
                        float *c, int64_t ldc, void (*done)(void *ctx, int64_t jc, int64_t nc),
                        void *ctx, void *scratch) {
    (void)M, (void)N, (void)K, (void)a, (void)b, (void)c, (void)ldc, (void)done, (void)ctx;
    (void)scratch;
    LOOM_ASSERT(!"loom__sgemm_blocks without AVX-512");
}
void loom__sgemm_act(int64_t M, int64_t N, int64_t K, const loom__gmat *a, const loom__gmat *b,
                     float *c, int64_t ldc, const loom__gemm_act *act, void *scratch) {
    (void)M, (void)N, (void)K, (void)a, (void)b, (void)c, (void)ldc, (void)act, (void)scratch;
    LOOM_ASSERT(!"loom__sgemm_act without AVX-512");
}
void loom__sgemm(int64_t M, int64_t N, int64_t K, const float *a, int64_t ars, int64_t acs,
                 const float *b, int64_t brs, int64_t bcs, float *c, int64_t ldc, void *scratch) {
    (void)M, (void)N, (void)K, (void)a, (void)ars, (void)acs, (void)b, (void)brs, (void)bcs;
    (void)c, (void)ldc, (void)scratch;
    LOOM_ASSERT(!"loom__sgemm without AVX-512");
}
int64_t loom__gemm_split(int64_t M, int64_t N, int64_t K, const loom__gmat *a, const loom__gmat *b,
                         loom__gdim crow, loom__gdim ccol, bool accumulate, loom__gemm_via via,
                         bool colsum, int parts, bool *rows) {
    (void)M, (void)N, (void)K, (void)a, (void)b, (void)crow, (void)ccol, (void)accumulate;
    (void)via, (void)colsum, (void)parts, (void)rows;
    return 0;
}
void loom__gemm_part(bool rows, int64_t at, int64_t len, int64_t *M, int64_t *N, loom__gmat *a,
                     loom__gmat *b, float **c, loom__gdim *crow, loom__gdim *ccol) {
    (void)rows, (void)at, (void)len, (void)M, (void)N, (void)a, (void)b, (void)c, (void)crow;
    (void)ccol;
}
bool loom__gemm_form_ok(loom__gemm_form f, int64_t M, int64_t N, int64_t K, const loom__gmat *a,
                        const loom__gmat *b) {
    (void)f, (void)M, (void)N, (void)K, (void)a, (void)b;
    return false;
}
loom__gemm_form loom__gemm_choose(int64_t M, int64_t N, int64_t K, const loom__gmat *a,
                                  const loom__gmat *b) {
    (void)M, (void)N, (void)K, (void)a, (void)b;
    return LOOM_GEMM_PACKED;
}
void loom__sgemm_form(loom__gemm_form f, int64_t M, int64_t N, int64_t K, const loom__gmat *a,
                      const loom__gmat *b, float *c, loom__gdim crow, loom__gdim ccol,
                      bool accumulate, void *scratch) {
    (void)f, (void)M, (void)N, (void)K, (void)a, (void)b, (void)c, (void)crow, (void)ccol;
    (void)accumulate, (void)scratch;
    LOOM_ASSERT(!"loom__sgemm_form without AVX-512");
}
bool loom__gemm_t_ok(int64_t M, int64_t N, int64_t K, const loom__gmat *a, const loom__gmat *b) {
    (void)M, (void)N, (void)K, (void)a, (void)b;
    return false;
}
void loom__gemm_t_cols(int64_t M, int64_t K, const loom__gmat *a, const loom__gmat *b,
                       const int64_t *coff, int64_t n, float *c, int64_t ldc, bool packed,
                       void *scratch) {
    (void)M, (void)K, (void)a, (void)b, (void)coff, (void)n, (void)c, (void)ldc, (void)packed;
    (void)scratch;
}
bool loom__conv_back_ok(int64_t M, int64_t N, int64_t K, const loom__gmat *a, int64_t WN,
                        const loom__gmat *b) {
    (void)M, (void)N, (void)K, (void)a, (void)WN, (void)b;
    return false;
}
size_t loom__conv_back_bytes(int64_t N, int64_t K, int64_t WN, int64_t pad) {
    (void)N, (void)K, (void)WN, (void)pad;
    return 0;
}
void loom__conv_back(int64_t M, int64_t N, int64_t K, const loom__gmat *a, loom__gdim crow,
                     loom__gdim ccol, float *c, int64_t WN, const loom__gmat *b, float *w,
                     int64_t ldw, loom__rows_fn rows, void *ctx, int64_t pad, void *buf,
                     void *scratch) {
    (void)M, (void)N, (void)K, (void)a, (void)crow, (void)ccol, (void)c, (void)WN, (void)b;
    (void)w, (void)ldw, (void)rows, (void)ctx, (void)pad, (void)buf, (void)scratch;
}
#endif
