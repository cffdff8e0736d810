/*
 * rows.c - row kernels along the last axis: softmax and LayerNorm (LNORM, LNORMGRAD), each built
 * twice, the second for AVX-512 (the same operations in the same order: the same values).
 */
#include "kernels.h"

#include "../graph/opmath.h"
LOOM_OPMATH(LOOM_OPMATH_EMIT)

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

/* The gradient from what the forward kept (its LNORM_KEEP form): its output row y, which is xhat
 * (the same (x - mean) rstd), and the row's rstd: the gradient's last two passes below (LNORM_ROW
 * ends with them), so the same values, without the statistics' two passes or x. */
#define LNORM_GRAD_KEPT(NAME, T)                                                 \
    static void NAME(const T *y, const T *gr, T *tmp, T *o, int64_t n, T rstd) { \
        T gsum, gdot;                                                            \
        LANE_SUM(T, gr, n, gsum);                                                \
        for (int64_t j = 0; j < n; j++)                                          \
            tmp[j] = gr[j] * y[j];                                               \
        LANE_SUM(T, tmp, n, gdot);                                               \
        T gm = gsum / (T)n, dm = gdot / (T)n;                                    \
        for (int64_t j = 0; j < n; j++)                                          \
            o[j] = rstd * (gr[j] - gm - y[j] * dm);                              \
    }
LNORM_GRAD_KEPT(lnorm_grad_kept_float, float)
LNORM_GRAD_KEPT(lnorm_grad_kept_double, double)
/* Layer normalization along the last axis, a row at a time (rows gathered into contiguous
 * scratch first where strided; the AVX-512 row reads contiguous ones in place): the mean (a sum
 * in RED_LANES lanes and a fixed tree, over n), the biased variance of x - mean the same way,
 * rstd = 1 / sqrt(var + eps);
 *   forward:  y = (x - mean) rstd
 *   gradient: gx = rstd (gy - mean(gy) - xhat mean(gy xhat)), xhat = (x - mean) rstd
 * the statistics recomputed from x exactly as the forward computes them. These plain rows serve
 * float64 and CPUs without AVX2; the float rows run as lnorm_row_float512 where the CPU has
 * AVX-512, and as lnorm_row_f32a and lnorm_grad_kept_f32a below where it has AVX2 (a GPT step's
 * LNORM 0.65 -> 0.38 ms, LNORMGRAD 0.60 -> 0.27; a gradient that recomputes its statistics as the
 * forward's row, then the kept gradient's): the same operations in the same order, so the same
 * values. */
#define LNORM_ROW(NAME, T, KEPT)                                                         \
    /* xr: the row (n), centred in place; gr: its gradient (NULL: forward), tmp: n more; \
     * keep: where the forward writes rstd (NULL: nowhere) */                            \
    static void NAME(T *xr, const T *gr, T *tmp, T *o, int64_t n, T eps, T *keep) {      \
        T sum, sq, mean, rstd;                                                           \
        LANE_SUM(T, xr, n, sum);                                                         \
        mean = sum / (T)n;                                                               \
        for (int64_t j = 0; j < n; j++)                                                  \
            xr[j] -= mean, tmp[j] = xr[j] * xr[j];                                       \
        LANE_SUM(T, tmp, n, sq);                                                         \
        rstd = (T)1 / sqrt(sq / (T)n + eps);                                             \
        if (!gr) {                                                                       \
            for (int64_t j = 0; j < n; j++)                                              \
                o[j] = xr[j] * rstd;                                                     \
            if (keep)                                                                    \
                *keep = rstd;                                                            \
            return;                                                                      \
        }                                                                                \
        for (int64_t j = 0; j < n; j++)                                                  \
            xr[j] *= rstd; /* xhat */                                                    \
        KEPT(xr, gr, tmp, o, n, rstd);                                                   \
    }
LNORM_ROW(lnorm_row_float, float, lnorm_grad_kept_float)
LNORM_ROW(lnorm_row_double, double, lnorm_grad_kept_double)
#if defined(__x86_64__) && defined(__GNUC__)
/* Whether the float rows run on 8 lanes (a CPU with AVX2 and FMA; the AVX-512 row where it has
 * that). */
static bool rows_avx2(void) {
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}
#else
static bool rows_avx2(void) {
    return false;
}
#endif
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
__attribute__((target("avx512f"))) static void
lnorm_row_float512(const float *x, const float *g, float *o, int64_t n, float eps, float *keep) {
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
    float rs = 1.0f / sqrtf(lane_tree(acc) / (float)n + eps);
    __m512 rstd = _mm512_set1_ps(rs);
#    define XHAT(q, m) _mm512_mul_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + (q)), mean), rstd)
    if (!g) {
        for (int64_t q = 0; q < n; q += 16) {
            __mmask16 m = ROW_LANES(q, n);
            _mm512_mask_storeu_ps(o + q, m, XHAT(q, m));
        }
        if (keep)
            *keep = rs;
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

/* The float rows on 8 lanes for CPUs with AVX2 and FMA but no AVX-512, read in place like
 * lnorm_row_float512: LANE_SUM's 16 lanes as two vectors (lanes 0-7 and 8-15), the ragged end's
 * elements added into the first lanes, its missing ones as +0.0 (which changes no sum: a lane's
 * sum is never -0.0) or left out by mask where they would not be 0, the tree by loom__tree_add8;
 * the same operations in the same order as lnorm_row_float and lnorm_grad_kept_float, so the
 * same values, without the row's copies (the macro's rows for AVX2 copied x and gy first and
 * made x - mean in place). The forward's row, and the gradient from what it kept. */
__attribute__((target("avx2,fma"), always_inline)) static inline __m256 add8n(__m256 acc, __m256 v,
                                                                              int64_t left) {
    __m256 s = _mm256_add_ps(acc, v);
    return left >= 8 ? s : _mm256_blendv_ps(acc, s, loom__in8(left));
}
__attribute__((target("avx2,fma"))) static void lnorm_row_f32a(const float *x, float *o, int64_t n,
                                                               float eps, float *keep) {
    __m256 lo = _mm256_setzero_ps(), hi = lo;
    for (int64_t q = 0; q < n; q += 16)
        lo = _mm256_add_ps(lo, loom__load8n(x + q, n - q)),
        hi = _mm256_add_ps(hi, loom__load8n(x + q + 8, n - q - 8));
    __m256 mean = _mm256_set1_ps(loom__tree_add8(lo, hi) / (float)n);
    lo = hi = _mm256_setzero_ps();
    for (int64_t q = 0; q < n; q += 16) {
        __m256 d0 = _mm256_sub_ps(loom__load8n(x + q, n - q), mean),
               d1 = _mm256_sub_ps(loom__load8n(x + q + 8, n - q - 8), mean);
        lo = add8n(lo, _mm256_mul_ps(d0, d0), n - q);
        hi = add8n(hi, _mm256_mul_ps(d1, d1), n - q - 8);
    }
    float rs = 1.0f / sqrtf(loom__tree_add8(lo, hi) / (float)n + eps);
    __m256 rstd = _mm256_set1_ps(rs);
    for (int64_t q = 0; q < n; q += 8)
        loom__store8n(o + q, n - q,
                      _mm256_mul_ps(_mm256_sub_ps(loom__load8n(x + q, n - q), mean), rstd));
    if (keep)
        *keep = rs;
}
__attribute__((target("avx2,fma"))) static void
lnorm_grad_kept_f32a(const float *y, const float *g, float *o, int64_t n, float rstd) {
    __m256 slo = _mm256_setzero_ps(), shi = slo, dlo = slo, dhi = slo;
    for (int64_t q = 0; q < n; q += 16) {
        __m256 g0 = loom__load8n(g + q, n - q), g1 = loom__load8n(g + q + 8, n - q - 8);
        slo = _mm256_add_ps(slo, g0), shi = _mm256_add_ps(shi, g1);
        dlo = _mm256_add_ps(dlo, _mm256_mul_ps(g0, loom__load8n(y + q, n - q)));
        dhi = _mm256_add_ps(dhi, _mm256_mul_ps(g1, loom__load8n(y + q + 8, n - q - 8)));
    }
    __m256 gm = _mm256_set1_ps(loom__tree_add8(slo, shi) / (float)n);
    __m256 dm = _mm256_set1_ps(loom__tree_add8(dlo, dhi) / (float)n), r = _mm256_set1_ps(rstd);
    for (int64_t q = 0; q < n; q += 8) {
        __m256 v = _mm256_sub_ps(_mm256_sub_ps(loom__load8n(g + q, n - q), gm),
                                 _mm256_mul_ps(loom__load8n(y + q, n - q), dm));
        loom__store8n(o + q, n - q, _mm256_mul_ps(r, v));
    }
}
#endif

/* Offset of row r (its first element along the last axis) of node x. */
int64_t loom__row_offset(const loom__pnode *x, int64_t r) {
    int64_t off = 0;
    for (int d = x->ndim - 2; d >= 0; d--) {
        off += r % x->shape[d] * x->lay.stride[d];
        r /= x->shape[d];
    }
    return off;
}

/* Row r of node x (n elements along the last axis) into dst, contiguous. */
#define GATHER_ROW(T, src, x, r, n, dst)                         \
    do {                                                         \
        const T *s_ = (const T *)(src) + loom__row_offset(x, r); \
        int64_t cs_ = (x)->lay.stride[(x)->ndim - 1];            \
        for (int64_t j_ = 0; j_ < (n); j_++)                     \
            (dst)[j_] = s_[j_ * cs_];                            \
    } while (0)

/* Row r of float node x (n elements), where it lies if they are contiguous, else gathered into
 * buf. */
static const float *row_of(const void *src, const loom__pnode *x, int64_t r, int64_t n,
                           float *buf) {
    if (x->lay.stride[x->ndim - 1] == 1)
        return (const float *)src + loom__row_offset(x, r);
    GATHER_ROW(float, src, x, r, n, buf);
    return buf;
}

size_t loom__lnorm_scratch_bytes(const loom__pnode *t) {
    return loom__dtype_size((loom_dtype)t->dtype) * (size_t)(3 * t->shape[t->ndim - 1]);
}

/* A row kernel's job: node id of program p bound by b, the node another form makes it read (-1:
 * none), whether a gradient. */
typedef struct {
    const loom__program *p;
    const loom__bind *b;
    int32_t id, m;
    bool grad;
} rows_job;

/* Rows [lo, hi) of LNORMGRAD id from its LNORM_READ form: the forward's output rows (contiguous)
 * and rstd. */
static void lnorm_grad_kept(void *ctx, int64_t lo, int64_t hi, int w) {
    const rows_job *j = ctx;
    const loom__program *p = j->p;
    const loom__bind *b = j->b;
    const loom__pnode *t = &p->nodes[j->id], *gy = &p->nodes[t->src[1]];
    int64_t n = t->shape[t->ndim - 1];
    const void *gs = loom__addr(p, b, t->src[1]);
    const unsigned char *y = loom__addr(p, b, j->m);
    void *o = loom__addr(p, b, j->id);
    unsigned char *tmp = loom__scratch_of(p, b, w); /* loom__lnorm_scratch_bytes: a row's copies */
    size_t es = loom__dtype_size((loom_dtype)t->dtype);
    const unsigned char *rstd = y + (size_t)loom__numel(t->ndim, t->shape) * es;
    bool avx2 = rows_avx2();
    (void)avx2; /* (no AVX2 row off x86) */
    for (int64_t r = lo; r < hi; r++) {
        if (t->dtype == LOOM_F64) {
            double *gr = (double *)(void *)tmp;
            GATHER_ROW(double, gs, gy, r, n, gr);
            lnorm_grad_kept_double((const double *)(const void *)y + r * n, gr, gr + n,
                                   (double *)o + r * n, n, ((const double *)(const void *)rstd)[r]);
        } else {
            float *gr = (float *)(void *)tmp;
            const float *yr = (const float *)(const void *)y + r * n;
            float *o_r = (float *)o + r * n, rs = ((const float *)(const void *)rstd)[r];
            const float *gw = row_of(gs, gy, r, n, gr);
#if defined(__x86_64__) && defined(__GNUC__)
            if (avx2) {
                lnorm_grad_kept_f32a(yr, gw, o_r, n, rs);
                continue;
            }
#endif
            lnorm_grad_kept_float(yr, gw, gr + n, o_r, n, rs);
        }
    }
}

/* Rows [lo, hi) of LNORM or LNORMGRAD id. */
static void lnorm_rows(void *ctx, int64_t lo, int64_t hi, int w) {
    const rows_job *j = ctx;
    const loom__program *p = j->p;
    const loom__bind *b = j->b;
    bool grad = j->grad;
    const loom__pnode *t = &p->nodes[j->id], *x = &p->nodes[t->src[0]];
    const loom__pnode *gy = grad ? &p->nodes[t->src[1]] : NULL;
    int64_t n = t->shape[t->ndim - 1];
    const void *xs = loom__addr(p, b, t->src[0]), *gs = grad ? loom__addr(p, b, t->src[1]) : NULL;
    void *o = loom__addr(p, b, j->id);
    unsigned char *tmp = loom__scratch_of(p, b, w); /* loom__lnorm_scratch_bytes: a row's copies */
    /* the forward's rstd, a row's after its values, where its gradient reads them */
    unsigned char *keep = !grad && loom__form_get(p, j->id, LOOM_FORM_LNORM_KEEP)
                              ? (unsigned char *)o + (size_t)loom__numel(t->ndim, t->shape) *
                                                         loom__dtype_size((loom_dtype)t->dtype)
                              : NULL;
#if defined(__x86_64__) && defined(__GNUC__)
    bool wide = __builtin_cpu_supports("avx512f");
#else
    bool wide = false;
#endif
    bool avx2 = rows_avx2();
    for (int64_t r = lo; r < hi; r++) {
        if (t->dtype == LOOM_F64) {
            double *xr = (double *)(void *)tmp, *gr = grad ? xr + n : NULL,
                   *o_r = (double *)o + r * n;
            GATHER_ROW(double, xs, x, r, n, xr);
            if (grad)
                GATHER_ROW(double, gs, gy, r, n, gr);
            lnorm_row_double(xr, gr, xr + 2 * n, o_r, n, t->attr.value,
                             keep ? (double *)(void *)keep + r : NULL);
        } else {
            float *xr = (float *)(void *)tmp, *gr = grad ? xr + n : NULL, *o_r = (float *)o + r * n;
            float *kr = keep ? (float *)(void *)keep + r : NULL;
#if defined(__x86_64__) && defined(__GNUC__)
            if (wide || avx2) { /* rows read in place where their elements are contiguous */
                const float *xw = row_of(xs, x, r, n, xr);
                const float *gw = grad ? row_of(gs, gy, r, n, gr) : NULL;
                float eps = (float)t->attr.value, rs, *xhat = xr + 2 * n;
                if (wide)
                    lnorm_row_float512(xw, gw, o_r, n, eps, kr);
                else if (!grad)
                    lnorm_row_f32a(xw, o_r, n, eps, kr);
                else /* the statistics again, as the forward made them, then the kept gradient */
                    lnorm_row_f32a(xw, xhat, n, eps, &rs),
                        lnorm_grad_kept_f32a(xhat, gw, o_r, n, rs);
                continue;
            }
#endif
            GATHER_ROW(float, xs, x, r, n, xr);
            if (grad)
                GATHER_ROW(float, gs, gy, r, n, gr);
            (void)wide, (void)avx2;
            lnorm_row_float(xr, gr, xr + 2 * n, o_r, n, (float)t->attr.value, kr);
        }
    }
}

static loom_status k_lnorm(const loom__program *p, const loom__bind *b, int32_t id, bool grad) {
    const loom__pnode *t = &p->nodes[id];
    const loom__form *kept = grad ? loom__form_get(p, id, LOOM_FORM_LNORM_READ) : NULL;
    int64_t n = t->shape[t->ndim - 1], rows = n ? loom__numel(t->ndim, t->shape) / n : 0;
    rows_job j = {p, b, id, kept ? kept->reads.node : -1, grad};
    loom__team *team = (double)(rows * n) * (grad ? 8 : 5) >= LOOM_SPLIT_MIN ? b->team : NULL;
    loom__team_for(team, rows, 1, kept ? lnorm_grad_kept : lnorm_rows, &j);
    return LOOM_OK;
}

loom_status loom__k_lnorm(const loom__program *p, const loom__bind *b, int32_t id) {
    return k_lnorm(p, b, id, false);
}

loom_status loom__k_lnormgrad(const loom__program *p, const loom__bind *b, int32_t id) {
    return k_lnorm(p, b, id, true);
}

/* Rows [lo, hi) of SOFTMAX id whose rows are evenly spaced (contiguous, or any layout whose
 * leading dims merge): one loop over them. */
static void softmax_even(void *ctx, int64_t lo, int64_t hi, int w) {
    const rows_job *j = ctx;
    const loom__pnode *t = &j->p->nodes[j->id], *x = &j->p->nodes[t->src[0]];
    int64_t n = t->shape[t->ndim - 1], cs = x->lay.stride[x->ndim - 1];
    int64_t rs = x->ndim >= 2 ? x->lay.stride[x->ndim - 2] : n;
    size_t es = loom__dtype_size((loom_dtype)t->dtype);
    const char *xr = (const char *)loom__addr(j->p, j->b, t->src[0]) + (size_t)(lo * rs) * es;
    char *yr = (char *)loom__addr(j->p, j->b, j->id) + (size_t)(lo * n) * es;
    (void)w;
    if (t->dtype == LOOM_F64)
        softmax_rows_double((const double *)(const void *)xr, rs, cs, (double *)(void *)yr, hi - lo,
                            n);
    else
        softmax_rows_f32((const float *)(const void *)xr, rs, cs, (float *)(void *)yr, hi - lo, n);
}

loom_status loom__k_softmax(const loom__program *p, const loom__bind *b, int32_t id) {
    const loom__pnode *t = &p->nodes[id], *x = &p->nodes[t->src[0]];
    int64_t n = t->shape[t->ndim - 1], rows = n ? loom__numel(t->ndim, t->shape) / n : 0;
    bool even = true;
    for (int d = x->ndim - 3; d >= 0 && even; d--)
        even = x->shape[d] == 1 || x->lay.stride[d] == x->lay.stride[d + 1] * x->shape[d + 1];
    rows_job j = {p, b, id, -1, false};
    if (even) {
        loom__team_for((double)(rows * n) * 4 >= LOOM_SPLIT_MIN ? b->team : NULL, rows, 1,
                       softmax_even, &j);
        return LOOM_OK;
    }
    const void *src = loom__addr(p, b, t->src[0]); /* others a row at a time */
    void *o = loom__addr(p, b, id);
    int64_t cs = x->lay.stride[x->ndim - 1], rs = x->ndim >= 2 ? x->lay.stride[x->ndim - 2] : n;
    size_t es = loom__dtype_size((loom_dtype)t->dtype);
    int64_t ix[MAXD] = {0}, off = 0;
    for (int64_t r = 0; r < rows; r++) {
        const char *xr = (const char *)src + (size_t)off * es;
        char *yr = (char *)o + (size_t)(r * n) * es;
        if (t->dtype == LOOM_F64)
            softmax_rows_double((const double *)(const void *)xr, rs, cs, (double *)(void *)yr, 1,
                                n);
        else
            softmax_rows_f32((const float *)(const void *)xr, rs, cs, (float *)(void *)yr, 1, n);
        off += (n - 1) * cs, ix[x->ndim - 1] = n - 1; /* to the next row's first element */
        loom__next_strided(x, ix, &off);
    }
    return LOOM_OK;
}
