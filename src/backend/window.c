/*
 * window.c - UNFOLD (im2col) and FOLD (col2im, its adjoint): windows over an image, a row at a
 * time; a fold whose product feeds it adds the product into the image as it goes.
 */
#include "kernels.h"

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
                           const int64_t *cs, const int64_t *cst, T *x, T *cols, bool fold,      \
                           int64_t c0, int64_t c1) {                                             \
        int64_t H = xs[2], W = xs[3], N = xs[0], OH = cs[4], OW = cs[5];                         \
        for (int64_t c = c0; c < c1; c++)                                                        \
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
 * and columns' strides: loom__contiguous_strides' of x (N,C,H,W) and cols (C,KH,KW,N,OH,OW) with
 * the columns' planes (N's stride) cst3 apart. */
enum { FOLD_TAPS = 64 }; /* window places whose ranges fold_planes works out once */
#define FOLD_PLANES(T)                                                                       \
    static void fold_planes_##T(const loom_window *w, const int64_t *xs, const int64_t *cs,  \
                                int64_t cst3, T *x, const T *cols, int64_t c0, int64_t c1) { \
        int64_t C = xs[1], H = xs[2], W = xs[3], N = xs[0], OH = cs[4], OW = cs[5];          \
        int64_t taps = (int64_t)w->kh * w->kw, sw = w->sw, rg[FOLD_TAPS][4], g[4];           \
        for (int64_t t = 0; t < taps && t < FOLD_TAPS; t++) {                                \
            window_range(H, OH, (int)(t / w->kw), w->sh, w->ph, &rg[t][0], &rg[t][1]);       \
            window_range(W, OW, (int)(t % w->kw), w->sw, w->pw, &rg[t][2], &rg[t][3]);       \
        }                                                                                    \
        for (int64_t c = c0; c < c1; c++)                                                    \
            for (int64_t n = 0; n < N; n++) {                                                \
                T *plane = x + (n * C + c) * H * W;                                          \
                for (int64_t t = 0; t < taps; t++) {                                         \
                    int i = (int)(t / w->kw), j = (int)(t % w->kw);                          \
                    const int64_t *e = t < FOLD_TAPS ? rg[t] : g;                            \
                    if (t >= FOLD_TAPS) {                                                    \
                        window_range(H, OH, i, w->sh, w->ph, &g[0], &g[1]);                  \
                        window_range(W, OW, j, w->sw, w->pw, &g[2], &g[3]);                  \
                    }                                                                        \
                    const T *cp = cols + ((c * taps + t) * N + n) * cst3;                    \
                    for (int64_t oy = e[0]; oy < e[1]; oy++) {                               \
                        T *restrict r =                                                      \
                            plane + (oy * w->sh - w->ph + i) * W + e[2] * sw - w->pw + j;    \
                        const T *restrict v = cp + oy * OW + e[2];                           \
                        if (sw == 1)                                                         \
                            for (int64_t q = 0; q < e[3] - e[2]; q++)                        \
                                r[q] += v[q];                                                \
                        else                                                                 \
                            for (int64_t q = 0; q < e[3] - e[2]; q++)                        \
                                r[q * sw] += v[q];                                           \
                    }                                                                        \
                }                                                                            \
            }                                                                                \
    }
FOLD_PLANES(float)
FOLD_PLANES(double)

/* Whether fold_planes can run a fold of columns s: their planes contiguous. */
static bool fold_planes_ok(const loom__pnode *s) {
    const int64_t *cs = s->shape, *st = s->lay.stride;
    return st[5] == 1 && st[4] == cs[5] && st[3] >= cs[4] * cs[5] && st[2] == cs[3] * st[3] &&
           st[1] == cs[2] * st[2] && st[0] == cs[1] * st[1];
}

typedef struct {
    const loom__program *p;
    const loom__bind *b;
    int32_t id;
    bool fold;
    int64_t xst[MAXD], cst[MAXD];
} window_job;

/* Channels [c0, c1) of an unfold or a fold: each channel's columns and image plane its own, so
 * that a device's cores may take channels apart. */
static void window_channels(void *ctx, int64_t c0, int64_t c1, int w) {
    const window_job *j = ctx;
    const loom__pnode *t = &j->p->nodes[j->id], *s = &j->p->nodes[t->src[0]];
    const loom__pnode *xn = j->fold ? t : s, *cn = j->fold ? s : t;
    void *x = loom__addr(j->p, j->b, j->fold ? j->id : t->src[0]);
    void *c = loom__addr(j->p, j->b, j->fold ? t->src[0] : j->id);
    (void)w;
    if (j->fold && fold_planes_ok(s)) {
        if (t->dtype == LOOM_F64)
            fold_planes_double(&t->attr.win, t->shape, s->shape, j->cst[3], x, c, c0, c1);
        else
            fold_planes_float(&t->attr.win, t->shape, s->shape, j->cst[3], x, c, c0, c1);
    } else if (t->dtype == LOOM_F64)
        window_double(&t->attr.win, xn->shape, j->xst, cn->shape, j->cst, x, c, j->fold, c0, c1);
    else
        window_float(&t->attr.win, xn->shape, j->xst, cn->shape, j->cst, x, c, j->fold, c0, c1);
}

static loom_status window_kernel(const loom__program *p, const loom__bind *b, int32_t id,
                                 bool fold) {
    const loom__pnode *t = &p->nodes[id], *s = &p->nodes[t->src[0]];
    window_job j = {.p = p, .b = b, .id = id, .fold = fold};
    if (fold) {
        loom__contiguous_strides(4, t->shape, j.xst);
        memcpy(j.cst, s->lay.stride, sizeof j.cst);
        memset(loom__addr(p, b, id), 0,
               (size_t)loom__numel(4, t->shape) * loom__dtype_size((loom_dtype)t->dtype));
    } else {
        memcpy(j.xst, s->lay.stride, sizeof j.xst);
        loom__contiguous_strides(6, t->shape, j.cst);
    }
    const loom__pnode *cn = fold ? s : t; /* the columns (C, KH, KW, N, OH, OW) */
    double work = (double)loom__numel(6, cn->shape);
    loom__team_for(work >= LOOM_SPLIT_MIN ? b->team : NULL, cn->shape[0], 1, window_channels, &j);
    return LOOM_OK;
}

loom_status loom__k_unfold(const loom__program *p, const loom__bind *b, int32_t id) {
    return window_kernel(p, b, id, false);
}
/* Where a fold adds its product's (c, i, j), (n, oy, ox) element: x(n, c, oy*sh + i, ox*sw + j). */
void loom__fold_dims(const loom__pnode *t, loom__gdim *crow, loom__gdim *ccol) {
    const loom_window *w = &t->attr.win;
    int64_t C = t->shape[1], H = t->shape[2], W = t->shape[3];
    int64_t OH = (H - w->kh) / w->sh + 1, OW = (W - w->kw) / w->sw + 1;
    *crow = (loom__gdim){.n = 3, .size = {C, w->kh, w->kw}, .stride = {H * W, W, 1}};
    *ccol = (loom__gdim){
        .n = 3, .size = {t->shape[0], OH, OW}, .stride = {C * H * W, W * w->sh, w->sw}};
}

/* A fold that computes its product (compile/fuse.c). loom's AVX-512 sgemm adds each result into
 * x (zeroed first) straight from its register tile, a place's taps in the product's order (stride
 * 1). On AVX2 loom__sgemm256_blocks (on AVX-512, for a strided fold, loom's sgemm on B's columns
 * narrowed to the block's images) makes the product a block of whole images at a time into the
 * scratch, and each block is folded from there (fold_rows_avx2 at stride 1, fold_planes at any
 * stride): every place's taps lie in its image's block, so it takes them in window order and x
 * has the bits of the product and the fold apart, without the product's columns written to
 * memory and read back. */
enum {
    FOLD_BLOCK = 1 << 18, /* floats of a block of the product (1 MB: about the L2) */
    FOLD_MAX = 1 << 20    /* floats of a block of one image at most */
};

/* The images in a block of the AVX2 fold's product of `rows` rows: as many as FOLD_BLOCK and
 * LOOM_GEMM256_NC columns take, at least one. */
static int64_t fold_images(const loom__pnode *t, int64_t rows) {
    loom__gdim crow, ccol;
    loom__fold_dims(t, &crow, &ccol);
    int64_t plane = ccol.size[1] * ccol.size[2], n = FOLD_BLOCK / (rows * plane);
    n = n < LOOM_GEMM256_NC / plane ? n : LOOM_GEMM256_NC / plane;
    n = n < t->shape[0] ? n : t->shape[0];
    return n > 1 ? n : 1;
}

/* Whether B's columns (n, place) take a block of whole images by narrowing them: plain, or the
 * images their outermost sub-dimension. */
static bool image_cols(const loom__gdim *col, int64_t N) {
    return col->n == 1 ? col->size[0] % N == 0 : col->size[0] == N;
}

/* B's columns narrowed to images [n0, n0 + nb) of N. */
static void narrow_images(loom__gmat *b, int64_t N, int64_t n0, int64_t nb) {
    int64_t per = b->col.n == 1 ? b->col.size[0] / N : 1;
    b->p += n0 * per * b->col.stride[0];
    b->col.size[0] = nb * per;
}

bool loom__fold_blocks_ok(const loom__program *p, int32_t fold, int32_t product) {
    const loom__pnode *t = &p->nodes[fold], *m = &p->nodes[product];
    int64_t plane = m->shape[1] / t->shape[0];
    if (m->shape[0] * plane > FOLD_MAX)
        return false;
    if (!loom__use_own_gemm())
        return loom__product_blocks_ok(p, product, fold_images(t, m->shape[0]) * plane);
    /* AVX-512: the blocks by the packed form, which the product alone takes too (B's rows plain:
     * never as its transpose), so that each element is the product's own */
    loom__gmat a = {0}, b = {0};
    loom__operand_dims(&p->nodes[m->src[0]], &a.row, &a.col);
    loom__operand_dims(&p->nodes[m->src[1]], &b.row, &b.col);
    return m->dtype == LOOM_F32 && m->ndim == 2 && b.row.n == 1 &&
           image_cols(&b.col, t->shape[0]) &&
           loom__gemm_choose(m->shape[0], m->shape[1], loom__numel(a.col.n, a.col.size), &a, &b) ==
               LOOM_GEMM_PACKED;
}

/* (a part of r of its rows takes r plane fold_images(t, r) floats: at most FOLD_BLOCK, or one
 * image's) */
size_t loom__fold_blocks_bytes(const loom__program *p, int32_t fold, int32_t product) {
    const loom__pnode *m = &p->nodes[product];
    int64_t floats = m->shape[0] * (m->shape[1] / p->nodes[fold].shape[0]);
    return sizeof(float) * (size_t)(floats > FOLD_BLOCK ? floats : FOLD_BLOCK) + 64;
}

#if defined(__x86_64__) && defined(__GNUC__)
#    include <immintrin.h>

/* A stride-1, unpadded fold of a block of nb images' columns, its channels' planes made whole:
 * each place x(y, x) is its taps' terms summed in window order from +0.0, as fold_planes adds them
 * into a zeroed image, so the same bits, but 32 places of a row at a time in four chains of
 * registers and each place stored once (fold_planes reads and writes the plane once a tap). A
 * term a tap does not have is +0.0 (read through a mask), which changes no such sum: a sum that
 * starts from +0.0 is never -0.0. Columns: (channel, tap) rows of nb images' planes of OH x OW;
 * the image's planes (n, c) at x + (n C + c) H W, channels [0, nch). */
#    define FOLD_TERM(A, Q)                                                                    \
        A = _mm256_add_ps(A, _mm256_maskload_ps(src + x0 + 8 * (Q),                            \
                                                _mm256_and_si256(_mm256_cmpgt_epi32(v##Q, lo), \
                                                                 _mm256_cmpgt_epi32(hi, v##Q))))
__attribute__((target("avx2,fma"))) static void fold_rows_avx2(const loom_window *w, int64_t nb,
                                                               int64_t C, int64_t H, int64_t W,
                                                               int64_t nch, const float *cols,
                                                               float *x) {
    int64_t kh = w->kh, kw = w->kw, OH = H - kh + 1, OW = W - kw + 1, plane = OH * OW;
    int64_t tap = nb * plane; /* a tap's row of columns */
    const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    for (int64_t c = 0; c < nch; c++)
        for (int64_t n = 0; n < nb; n++) {
            const float *cb = cols + c * kh * kw * tap + n * plane;
            float *xp = x + (n * C + c) * H * W;
            for (int64_t y = 0; y < H; y++) {
                int64_t ilo = y - OH + 1 > 0 ? y - OH + 1 : 0, ihi = y < kh - 1 ? y : kh - 1;
                for (int64_t x0 = 0; x0 < W; x0 += 32) {
                    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
                    __m256i v0 = _mm256_add_epi32(_mm256_set1_epi32((int)x0), iota);
                    __m256i v1 = _mm256_add_epi32(v0, _mm256_set1_epi32(8));
                    __m256i v2 = _mm256_add_epi32(v0, _mm256_set1_epi32(16));
                    __m256i v3 = _mm256_add_epi32(v0, _mm256_set1_epi32(24));
                    for (int64_t i = ilo; i <= ihi; i++)
                        for (int64_t j = 0; j < kw; j++) {
                            /* place x's term of tap (i, j) at src[x]: x - j in [0, OW) */
                            const float *src = cb + (i * kw + j) * tap + (y - i) * OW - j;
                            __m256i lo = _mm256_set1_epi32((int)j - 1),
                                    hi = _mm256_set1_epi32((int)(j + OW));
                            FOLD_TERM(a0, 0);
                            FOLD_TERM(a1, 1);
                            FOLD_TERM(a2, 2);
                            FOLD_TERM(a3, 3);
                        }
                    float *d = xp + y * W + x0;
                    if (x0 + 32 <= W) {
                        _mm256_storeu_ps(d, a0), _mm256_storeu_ps(d + 8, a1);
                        _mm256_storeu_ps(d + 16, a2), _mm256_storeu_ps(d + 24, a3);
                        continue;
                    }
                    float t[32];
                    _mm256_storeu_ps(t, a0), _mm256_storeu_ps(t + 8, a1);
                    _mm256_storeu_ps(t + 16, a2), _mm256_storeu_ps(t + 24, a3);
                    memcpy(d, t, sizeof(float) * (size_t)(W - x0));
                }
            }
        }
}
#endif

/* Whether fold_rows_s2 takes a fold of window w: columns 2 apart, unpadded, on AVX-512. */
static bool rows_s2_ok(const loom_window *w) {
    return w->sw == 2 && w->kw <= 16 && !w->ph && !w->pw && loom__pool512();
}

/* Where a fold's planes go: plane (n, c) at x + n sn + c sc, of rows [ph, ph + H) and columns
 * [pw, pw + W) of the fold's (all of them but for fold-crop), as where(mask > 0, place, 0) with a
 * mask laid out as they are (NULL: none). */
typedef struct {
    float *x;
    const float *mask;
    int64_t sn, sc, ph, pw, H, W;
} fold_out;

#ifdef HAVE_POOL512
/* Lanes l of 16 with lo <= from + l < hi. */
static inline __mmask16 lanes_in(int64_t from, int64_t lo, int64_t hi) {
    int64_t a = lo - from > 0 ? lo - from : 0, b = hi - from < 16 ? hi - from : 16;
    return b <= a ? 0 : (__mmask16)(((1u << b) - 1) & ~((1u << a) - 1));
}

/* The same for columns 2 apart (any row stride, unpadded) on AVX-512: a row's even and odd
 * places are two phases, each 16 places of consecutive columns of its taps (j even, j odd), summed
 * in window order from +0.0 (a tap a place lacks reads +0.0) and interleaved as they are stored,
 * so the bits of fold_planes' adds into a zeroed plane, each place written once (into o, images
 * [n0, n0 + nb) and channels [c0, c0 + nch); rows and places o crops off are never made). */
__attribute__((target("avx512f"))) static void fold_rows_s2(const loom_window *w, int64_t nb,
                                                            int64_t H, int64_t W, int64_t nch,
                                                            const float *cols, const fold_out *o,
                                                            int64_t n0, int64_t c0) {
    int64_t kh = w->kh, kw = w->kw, sh = w->sh, OH = (H - kh) / sh + 1, OW = (W - kw) / 2 + 1;
    int64_t plane = OH * OW, tap = nb * plane;
    const __m512i even = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(8));
    const __m512 zero = _mm512_setzero_ps();
    for (int64_t c = 0; c < nch; c++)
        for (int64_t n = 0; n < nb; n++) {
            const float *cb = cols + c * kh * kw * tap + n * plane;
            int64_t at = (n0 + n) * o->sn + (c0 + c) * o->sc - o->pw; /* place (ph, 0) */
            for (int64_t x0 = 0; x0 < W; x0 += 32) {
                __mmask16 in[16]; /* tap column j's places in range: ox = x0 / 2 + l - j / 2 */
                for (int64_t j = 0; j < kw && j < 16; j++)
                    in[j] = lanes_in(x0 / 2 - j / 2, 0, OW);
                __mmask16 s[2] = {lanes_in(x0, o->pw, o->pw + o->W),
                                  lanes_in(x0 + 16, o->pw, o->pw + o->W)};
                for (int64_t y = o->ph; y < o->ph + o->H; y++) {
                    __m512 a[2] = {zero, zero};
                    for (int64_t i = y % sh; i < kh && i <= y; i += sh) {
                        int64_t oy = (y - i) / sh;
                        if (oy >= OH)
                            continue;
                        const float *row = cb + i * kw * tap + oy * OW + x0 / 2;
                        for (int64_t j = 0; j < kw; j++)
                            a[j & 1] = _mm512_add_ps(
                                a[j & 1], _mm512_maskz_loadu_ps(in[j], row + j * tap - j / 2));
                    }
                    __m512 v[2] = {_mm512_permutex2var_ps(a[0], even, a[1]),
                                   _mm512_permutex2var_ps(a[0], odd, a[1])};
                    for (int h = 0; h < 2; h++) {
                        int64_t d = at + (y - o->ph) * o->W + x0 + 16 * h;
                        if (o->mask)
                            v[h] = _mm512_maskz_mov_ps(
                                _mm512_mask_cmp_ps_mask(s[h],
                                                        _mm512_maskz_loadu_ps(s[h], o->mask + d),
                                                        zero, _CMP_GT_OQ),
                                v[h]);
                        _mm512_mask_storeu_ps(o->x + d, s[h], v[h]);
                    }
                }
            }
        }
}
#endif

#ifdef HAVE_POOL512
/* PAD of float planes on AVX-512 (rows contiguous: false where not), each row of the padded plane
 * 16 places at a time from a masked load of x's (zeros around it), no place written twice; a
 * device's cores take planes apart. (CROP keeps the plain rows: its rows of 14 and 28 places ran
 * 0-15% slower so.) */
typedef struct {
    const loom__pnode *t, *x;
    const float *src;
    float *out;
} pad_job;

__attribute__((target("avx512f"))) static void pad_planes(void *ctx, int64_t q0, int64_t q1,
                                                          int w) {
    const pad_job *j = ctx;
    const loom__pnode *t = j->t, *x = j->x;
    int nd = t->ndim;
    int64_t ph = t->attr.win.ph, pw = t->attr.win.pw, H = x->shape[nd - 2], W = x->shape[nd - 1];
    int64_t BH = H + 2 * ph, BW = W + 2 * pw, rs = x->lay.stride[nd - 2];
    (void)w;
    for (int64_t q = q0; q < q1; q++) {
        const float *xs = j->src + loom__row_offset(x, q * H);
        float *d = j->out + q * BH * BW;
        for (int64_t i = 0; i < BH; i++, d += BW)
            for (int64_t x0 = 0; x0 < BW; x0 += 16) {
                __mmask16 in = i < ph || i >= ph + H ? 0 : lanes_in(x0, pw, pw + W);
                _mm512_mask_storeu_ps(d + x0, lanes_in(x0, 0, BW),
                                      _mm512_maskz_loadu_ps(in, xs + (i - ph) * rs + x0 - pw));
            }
    }
}
#endif

bool loom__pad_planes(const loom__program *p, const loom__bind *b, int32_t id) {
#ifdef HAVE_POOL512
    const loom__pnode *t = &p->nodes[id], *x = &p->nodes[t->src[0]];
    int nd = t->ndim;
    if (!loom__pool512() || t->dtype != LOOM_F32 || x->lay.stride[nd - 1] != 1)
        return false;
    int64_t H = x->shape[nd - 2], W = x->shape[nd - 1];
    int64_t planes = H && W ? loom__numel(nd, x->shape) / (H * W) : 0;
    pad_job j = {t, x, loom__addr(p, b, t->src[0]), loom__addr(p, b, id)};
    double work = (double)loom__numel(nd, t->shape);
    loom__team_for(work >= LOOM_SPLIT_MIN ? b->team : NULL, planes, 1, pad_planes, &j);
    return true;
#else
    (void)p, (void)b, (void)id;
    return false;
#endif
}

bool loom__fold_crop_ok(const loom__pnode *t) {
    return loom__use_own_gemm() && t->dtype == LOOM_F32 && rows_s2_ok(&t->attr.win);
}

typedef struct {
    const loom__program *p;
    const loom__bind *b;
    const loom__pnode *t;
    loom__gmat ga, gb;
    int64_t n, k, taps;
    fold_out o;
} fold_job;

typedef struct {
    const fold_job *j;
    int64_t c0, c1;
    float *buf;
} fold_part;

/* Columns [jc, jc + nc) of a part's product (whole images) folded into its channels' planes. */
static void fold_block(void *ctx, int64_t jc, int64_t nc) {
    const fold_part *f = ctx;
    const loom__pnode *t = f->j->t;
    const loom_window *w = &t->attr.win;
    loom__gdim crow, ccol;
    loom__fold_dims(t, &crow, &ccol);
    int64_t C = t->shape[1], H = t->shape[2], W = t->shape[3], OH = ccol.size[1], OW = ccol.size[2],
            n0 = jc / (OH * OW), nb = nc / (OH * OW);
    const fold_out *o = &f->j->o;
#ifdef HAVE_POOL512
    if (rows_s2_ok(w)) {
        fold_rows_s2(w, nb, H, W, f->c1 - f->c0, f->buf, o, n0, f->c0);
        return;
    }
#endif
    float *x = o->x + (n0 * C + f->c0) * H * W; /* (uncropped: loom__fold_crop_ok) */
#if defined(__x86_64__) && defined(__GNUC__)
    if (w->sh == 1 && w->sw == 1) {
        fold_rows_avx2(w, nb, C, H, W, f->c1 - f->c0, f->buf, x);
        return;
    }
#endif
    for (int64_t n = 0; n < nb; n++) /* (a strided fold: places no window takes stay zeros) */
        memset(x + n * C * H * W, 0, sizeof(float) * (size_t)((f->c1 - f->c0) * H * W));
    int64_t xs[4] = {nb, C, H, W}, cs[6] = {C, w->kh, w->kw, nb, OH, OW};
    fold_planes_float(w, xs, cs, OH * OW, x, f->buf, 0, f->c1 - f->c0);
}

/* Channels [c0, c1) of the image on AVX2 (on AVX-512, a strided fold): their taps' rows of the
 * product, a block at a time, folded into their planes. A place's sum does not depend on the
 * channels taken together, so a device's cores take channels apart. */
static void fold_channels(void *ctx, int64_t c0, int64_t c1, int w) {
    const fold_job *j = ctx;
    unsigned char *scratch = loom__scratch_of(j->p, j->b, w);
    bool own = loom__use_own_gemm();
    fold_part f = {j, c0, c1, own ? loom__gemm_room(scratch) : loom__gemm256_room(scratch)};
    loom__gmat ga = j->ga;
    ga.p += c0 * j->taps * ga.row.stride[0];
    ga.row.size[0] = (c1 - c0) * j->taps;
    int64_t rows = (c1 - c0) * j->taps, plane = j->n / j->t->shape[0];
    if (own) { /* AVX-512: blocks of images by the packed form (loom__fold_blocks_ok) */
        int64_t N = j->t->shape[0], nb = fold_images(j->t, rows);
        for (int64_t n0 = 0; n0 < N; n0 += nb) {
            int64_t k = N - n0 < nb ? N - n0 : nb;
            loom__gmat gb = j->gb;
            narrow_images(&gb, N, n0, k);
            loom__gdim crow = {1, {rows}, {k * plane}}, ccol = {1, {k * plane}, {1}};
            loom__sgemm_form(LOOM_GEMM_PACKED, rows, k * plane, j->k, &ga, &gb, f.buf, crow, ccol,
                             false, scratch);
            fold_block(&f, n0 * plane, k * plane);
        }
        return;
    }
    loom__sgemm256_blocks(rows, j->n, j->k, &ga, &j->gb, 0, f.buf, fold_images(j->t, rows) * plane,
                          fold_block, &f, scratch);
}

static loom_status fold_product(const loom__program *p, const loom__bind *b, int32_t id,
                                int32_t mid) {
    const loom__pnode *t = &p->nodes[id], *m = &p->nodes[mid];
    int64_t N = t->shape[0], C = t->shape[1], H = t->shape[2], W = t->shape[3];
    fold_job j = {.p = p, .b = b, .t = t, .n = m->shape[1]};
    j.o = (fold_out){loom__addr(p, b, id), NULL, C * H * W, H * W, 0, 0, H, W};
    const loom__form *x = loom__form_get(p, id, LOOM_FORM_CROP);
    if (x) { /* fold-crop: the planes cropped into another node's buffer */
        const loom__pnode *cr = &p->nodes[x->u.crop.crop];
        int64_t h = cr->shape[2], wd = cr->shape[3];
        j.o = (fold_out){loom__addr(p, b, x->u.crop.into),
                         x->u.crop.mask >= 0 ? loom__addr(p, b, x->u.crop.mask) : NULL,
                         x->u.crop.cn ? h * wd : C * h * wd,
                         x->u.crop.cn ? N * h * wd : h * wd,
                         cr->attr.win.ph,
                         cr->attr.win.pw,
                         h,
                         wd};
    }
    j.k = loom__product_operands(p, b, mid, &j.ga, &j.gb);
    j.taps = t->attr.win.kh * t->attr.win.kw;
    if (!loom__use_own_gemm() || t->attr.win.sh > 1 || t->attr.win.sw > 1) {
        double work = (double)m->shape[0] * (double)m->shape[1] * (double)j.k;
        loom__team_for(work >= LOOM_SPLIT_MIN ? b->team : NULL, t->shape[1], 1, fold_channels, &j);
        return LOOM_OK;
    }
    loom__gdim crow, ccol;
    loom__fold_dims(t, &crow, &ccol);
    memset(j.o.x, 0, sizeof(float) * (size_t)loom__numel(4, t->shape));
    loom__sgemm_g(m->shape[0], j.n, j.k, &j.ga, &j.gb, j.o.x, crow, ccol, true, b->ws + p->scratch);
    return LOOM_OK;
}

loom_status loom__k_fold(const loom__program *p, const loom__bind *b, int32_t id) {
    int32_t v = p->nodes[id].src[0], m = p->nodes[v].src[0];
    if (m >= 0 && p->nodes[m].fused_into == id)
        return fold_product(p, b, id, m);
    return window_kernel(p, b, id, true);
}
