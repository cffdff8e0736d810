/*
 * gemm_planes.c - a product whose columns fall in planes, a row and a plane at a time straight from
 * B (loom__conv_planes: a first convolution's few taps, pooled while in L1).
 */
#include "gemm_impl.h"

#include <string.h>

#ifdef LOOM_GEMM512

/* B's column offsets for plane 0 (P of them) and the offset between planes; false if B's columns
 * do not fall in planes of P. */
static bool plane_offsets(const loom__gdim *c, int64_t N, int64_t P, int64_t *off, int64_t *bps) {
    int64_t inner = 1;
    for (int s = 1; s < c->n; s++)
        inner *= c->size[s];
    if (P < 1 || N % P || (c->n > 1 && inner != P))
        return false;
    *bps = c->n > 1 ? c->stride[0] : P * c->stride[0];
    if (off)
        loom__gd_offsets(c, 0, P, off);
    return true;
}

bool loom__conv_planes_ok(int64_t M, int64_t N, int64_t K, const loom__gmat *a, const loom__gmat *b,
                          int64_t P) {
    int64_t bps, span = 0;
    if (!loom__gemm_available() || M < 1 || K < 1 || K > LOOM_CONV_MAX_K || N < 16 ||
        a->row.n != 1 || a->col.n != 1 || loom__gemm_choose(M, N, K, a, b) != LOOM_GEMM_PACKED ||
        !plane_offsets(&b->col, N, P, NULL, &bps))
        return false;
    for (int s = 0; s < b->col.n; s++) /* every offset fits the slots' 32 bits */
        span +=
            (b->col.size[s] - 1) * (b->col.stride[s] < 0 ? -b->col.stride[s] : b->col.stride[s]);
    for (int s = 0; s < b->row.n; s++)
        span +=
            (b->row.size[s] - 1) * (b->row.stride[s] < 0 ? -b->row.stride[s] : b->row.stride[s]);
    return span < INT32_MAX / 2;
}

size_t loom__conv_planes_bytes(int64_t P) {
    size_t slots = (size_t)P + 8; /* a slot has a column at least; a group's padding */
    return slots * (2 * sizeof(int32_t) + sizeof(uint16_t)) + sizeof(int64_t) * (size_t)P + 64;
}

void loom__conv_planes_begin(loom__conv_planes *s, const loom__gmat *a, const loom__gmat *b,
                             int64_t K, int64_t P, void *buf) {
    int64_t *coff = (int64_t *)(((uintptr_t)buf + 63) & ~(uintptr_t)63);
    int32_t *off = (int32_t *)(coff + P), *at = off + P + 8;
    uint16_t *mask = (uint16_t *)(at + P + 8);
    *s = (loom__conv_planes){.a = a->p,
                             .b = b->p,
                             .ars = a->row.stride[0],
                             .acs = a->col.stride[0],
                             .K = K,
                             .off = off,
                             .at = at,
                             .mask = mask};
    plane_offsets(&b->col, P, P, coff, &s->bps);
    loom__gd_offsets(&b->row, 0, K, s->koff);
    int64_t n = 0;
    for (int64_t j = 0, len; j < P; j += len, n++) {
        for (len = 1; j + len < P && len < 16 && coff[j + len] == coff[j] + len; len++)
            ;
        off[n] = (int32_t)coff[j], at[n] = (int32_t)j, mask[n] = (uint16_t)((1u << len) - 1);
    }
    for (; n % 4; n++) /* empty slots: nothing loaded or stored */
        off[n] = 0, at[n] = 0, mask[n] = 0;
    s->nslot = n;
}

/* Four rows of A (ar: their first elements, acs apart along k) against a group of 4 slots: the
 * image's loads shared by the rows, 16 independent sums (the FMA's latency covered); the first
 * `rows` rows stored, pitch apart. */
__attribute__((target("avx512f"))) static inline void
conv_slots(const float *const *ar, int64_t acs, const int64_t *koff, int64_t K, const float *bq,
           const int32_t *off, const int32_t *at, const uint16_t *mk, int rows, float *out,
           int64_t pitch) {
    __mmask16 m0 = mk[0], m1 = mk[1], m2 = mk[2], m3 = mk[3];
    const float *b0 = bq + off[0], *b1 = bq + off[1], *b2 = bq + off[2], *b3 = bq + off[3];
    const float *a0 = ar[0], *a1 = ar[1], *a2 = ar[2], *a3 = ar[3];
    __m512 c00 = _mm512_setzero_ps(), c01 = c00, c02 = c00, c03 = c00, c10 = c00, c11 = c00,
           c12 = c00, c13 = c00, c20 = c00, c21 = c00, c22 = c00, c23 = c00, c30 = c00, c31 = c00,
           c32 = c00, c33 = c00;
    for (int64_t k = 0; k < K; k++) {
        int64_t o = koff[k];
        __m512 x0 = _mm512_maskz_loadu_ps(m0, b0 + o), x1 = _mm512_maskz_loadu_ps(m1, b1 + o);
        __m512 x2 = _mm512_maskz_loadu_ps(m2, b2 + o), x3 = _mm512_maskz_loadu_ps(m3, b3 + o);
        __m512 w = _mm512_set1_ps(a0[k * acs]);
        c00 = _mm512_fmadd_ps(w, x0, c00), c01 = _mm512_fmadd_ps(w, x1, c01);
        c02 = _mm512_fmadd_ps(w, x2, c02), c03 = _mm512_fmadd_ps(w, x3, c03);
        w = _mm512_set1_ps(a1[k * acs]);
        c10 = _mm512_fmadd_ps(w, x0, c10), c11 = _mm512_fmadd_ps(w, x1, c11);
        c12 = _mm512_fmadd_ps(w, x2, c12), c13 = _mm512_fmadd_ps(w, x3, c13);
        w = _mm512_set1_ps(a2[k * acs]);
        c20 = _mm512_fmadd_ps(w, x0, c20), c21 = _mm512_fmadd_ps(w, x1, c21);
        c22 = _mm512_fmadd_ps(w, x2, c22), c23 = _mm512_fmadd_ps(w, x3, c23);
        w = _mm512_set1_ps(a3[k * acs]);
        c30 = _mm512_fmadd_ps(w, x0, c30), c31 = _mm512_fmadd_ps(w, x1, c31);
        c32 = _mm512_fmadd_ps(w, x2, c32), c33 = _mm512_fmadd_ps(w, x3, c33);
    }
    __m512 c[4][4] = {
        {c00, c01, c02, c03}, {c10, c11, c12, c13}, {c20, c21, c22, c23}, {c30, c31, c32, c33}};
    __mmask16 m[4] = {m0, m1, m2, m3};
    for (int r = 0; r < rows; r++)
        for (int q = 0; q < 4; q++)
            _mm512_mask_storeu_ps(out + r * pitch + at[q], m[q], c[r][q]);
}

__attribute__((target("avx512f"))) void loom__conv_planes_run(const loom__conv_planes *s, int64_t i,
                                                              int rows, int64_t q, float *out,
                                                              int64_t pitch) {
    const float *ar[4], *bq = s->b + q * s->bps;
    for (int r = 0; r < 4; r++) /* a missing row computes the last one again, not stored */
        ar[r] = s->a + (i + (r < rows ? r : rows - 1)) * s->ars;
    for (int64_t s0 = 0; s0 < s->nslot; s0 += 4)
        conv_slots(ar, s->acs, s->koff, s->K, bq, s->off + s0, s->at + s0, s->mask + s0, rows, out,
                   pitch);
}

#else
bool loom__conv_planes_ok(int64_t M, int64_t N, int64_t K, const loom__gmat *a, const loom__gmat *b,
                          int64_t P) {
    (void)M, (void)N, (void)K, (void)a, (void)b, (void)P;
    return false;
}
size_t loom__conv_planes_bytes(int64_t P) {
    (void)P;
    return 0;
}
void loom__conv_planes_begin(loom__conv_planes *s, const loom__gmat *a, const loom__gmat *b,
                             int64_t K, int64_t P, void *buf) {
    (void)s, (void)a, (void)b, (void)K, (void)P, (void)buf;
    LOOM_ASSERT(!"loom__conv_planes without AVX-512");
}
void loom__conv_planes_run(const loom__conv_planes *s, int64_t i, int rows, int64_t q, float *out,
                           int64_t pitch) {
    (void)s, (void)i, (void)rows, (void)q, (void)out, (void)pitch;
    LOOM_ASSERT(!"loom__conv_planes without AVX-512");
}
#endif
