/*
 * gemm_pack.c - the packing of loom's sgemm (gemm.c): an operand's lanes and k into panels, from
 * plain strides or compound views (an unfold read as a matrix: runs of contiguous lanes).
 */
#include "gemm_impl.h"

#ifdef LOOM_GEMM512
/* Offsets of indices from, from + 1, ... (count of them) of compound dimension d: runs along its
 * innermost sub-dimension, then a carry. */
void loom__gd_offsets(const loom__gdim *d, int64_t from, int64_t count, int64_t *out) {
    int64_t dig[LOOM_GDIM_MAX], off = 0, i = from;
    int last = d->n - 1;
    for (int s = last; s >= 0; s--) {
        dig[s] = i % d->size[s];
        i /= d->size[s];
        off += dig[s] * d->stride[s];
    }
    int64_t st = d->stride[last], len = d->size[last];
    for (int64_t k = 0; k < count;) {
        int64_t run = len - dig[last] < count - k ? len - dig[last] : count - k;
        for (int64_t q = 0; q < run; q++)
            out[k + q] = off + q * st;
        k += run, dig[last] += run, off += run * st;
        if (dig[last] < len)
            break;
        off -= st * len, dig[last] = 0;
        for (int s = last - 1; s >= 0; s--) {
            off += d->stride[s];
            if (++dig[s] < d->size[s])
                break;
            off -= d->stride[s] * d->size[s];
            dig[s] = 0;
        }
    }
}

/* Packing an operand contiguous along k (each lane a row of memory, rs apart) into
 * panels of w lanes: 16 lanes by 16 k at a time through a register transpose, masked at the edges;
 * a group of 16 lanes covers half a 32- or 48-wide panel, or two 8-wide ones. */
__attribute__((target("avx512f"))) static void pack_tr(int64_t lanes, int64_t kc, const float *src,
                                                       int64_t rs, int64_t w, float *dst) {
    int64_t total = (lanes + w - 1) / w * w; /* lanes past `lanes` are zeros */
    for (int64_t l0 = 0; l0 < total; l0 += 16) {
        int rows = (int)(lanes - l0 > 16 ? 16 : lanes - l0 < 0 ? 0 : lanes - l0);
        int64_t width = total - l0 < 16 ? total - l0 : 16;
        for (int64_t k0 = 0; k0 < kc; k0 += 16) {
            int kn = (int)(kc - k0 < 16 ? kc - k0 : 16);
            __mmask16 km = (__mmask16)((1u << kn) - 1);
            __m512 r[16];
            for (int i = 0; i < 16; i++)
                r[i] = i < rows ? _mm512_maskz_loadu_ps(km, src + (l0 + i) * rs + k0)
                                : _mm512_setzero_ps();
            loom__transpose16(r);
            for (int64_t q = 0; q < width; q += w < 16 ? w : 16) {
                int64_t at = l0 + q, off = at % w, len = w - off < width - q ? w - off : width - q;
                float *d = dst + at / w * w * kc + k0 * w + off;
                __mmask16 m = (__mmask16)((1u << len) - 1);
                for (int k = 0; k < kn; k++) /* lanes 8.. moved down for a second 8-wide panel */
                    _mm512_mask_storeu_ps(d + k * w, m,
                                          q ? _mm512_shuffle_f32x4(r[k], r[k], 0xee) : r[k]);
            }
        }
    }
}

/* The same for rows at their own offsets and runs of kn (<= 16) along k:
 * dst[k * dld + r] = src[loff[r] + k] for k < kn. */
__attribute__((target("avx512f"))) static void tr16_runs(const float *src, const int64_t *loff,
                                                         int rows, int kn, float *dst, int64_t dld,
                                                         int cols) {
    __m512 r[16];
    __mmask16 km = (__mmask16)((1u << kn) - 1);
    for (int i = 0; i < 16; i++)
        r[i] = i < rows ? _mm512_maskz_loadu_ps(km, src + loff[i]) : _mm512_setzero_ps();
    loom__transpose16(r);
    __mmask16 m = (__mmask16)((1u << cols) - 1);
    for (int k = 0; k < kn; k++)
        _mm512_mask_storeu_ps(dst + k * dld, m, r[k]);
}

/* Packs an operand into panels of w lanes (MR rows of A, NR columns of B): element (lane r, k)
 * of the operand is src[r * rs + k * ks]; panel p holds lanes p*w.. as dst[p*w*kc + k*w + r], with
 * zeros past the last lane. Runs along memory are kept: a panel contiguous along its lanes is
 * copied row by row, one contiguous along k by 16x16 register transposes (pack_tr), never as w
 * interleaved streams. */
__attribute__((target("avx512f"))) void loom__gemm_pack(int64_t lanes, int64_t kc, const float *src,
                                                        int64_t rs, int64_t ks, int64_t w,
                                                        float *dst) {
    if (ks == 1 && rs != 1) {
        pack_tr(lanes, kc, src, rs, w, dst);
        return;
    }
    if (rs == 1 && w <= 16) {
        /* narrow panels of an operand contiguous along its lanes (A of a weight gradient, X^T):
         * k outermost, so that each row of memory is read once, in order, into every panel, where
         * panel by panel each would reread the same lines, a row apart (2 KB for a 512-wide
         * activation: few of L1's sets, so they were gone by the next panel) */
        __mmask16 wm = (__mmask16)((1u << w) - 1);
        for (int64_t k = 0; k < kc; k++)
            for (int64_t i = 0; i < lanes; i += w) {
                int64_t m = lanes - i < w ? lanes - i : w;
                if (k + 8 < kc) /* rows apart: too far for the hardware's prefetch */
                    _mm_prefetch((const char *)(src + (k + 8) * ks + i), _MM_HINT_T0);
                __mmask16 lm = (__mmask16)((1u << m) - 1);
                _mm512_mask_storeu_ps(dst + i * kc + k * w, wm,
                                      _mm512_maskz_loadu_ps(lm, src + k * ks + i));
            }
        return;
    }
    for (int64_t i = 0; i < lanes; i += w, dst += w * kc) {
        int64_t m = lanes - i < w ? lanes - i : w;
        const float *s = src + i * rs;
        for (int64_t k = 0; k < kc; k++) {
            if (rs == 1 && m == w && w % 16 == 0) { /* 16 at a time (memcpy was a rep movs) */
                for (int64_t q = 0; q < w; q += 16)
                    _mm512_storeu_ps(dst + k * w + q, _mm512_loadu_ps(s + k * ks + q));
                continue;
            }
            for (int64_t r = 0; r < m; r++)
                dst[k * w + r] = s[r * rs + k * ks];
            for (int64_t r = m; r < w; r++)
                dst[k * w + r] = 0;
        }
    }
}

/* Packing compound operands: lane offsets are grouped into runs contiguous in memory
 * (up to 16), each copied per k by one masked load and store. */
__attribute__((target("avx512f"))) static void pack_runs(const float *src, const int64_t *loff,
                                                         int64_t m, const int64_t *koff, int64_t kc,
                                                         int64_t w, float *dst) {
    int64_t r0[NR], len[NR], nr = 0;
    for (int64_t r = 0; r < m; r += len[nr++]) {
        r0[nr] = r, len[nr] = 1;
        while (r + len[nr] < m && len[nr] < 16 && loff[r + len[nr]] == loff[r] + len[nr])
            len[nr]++;
    }
    for (int64_t k = 0; k < kc; k++) {
        const float *s = src + koff[k];
        float *d = dst + k * w;
        for (int64_t q = 0; q < nr; q++) {
            __mmask16 mk = (__mmask16)((1u << len[q]) - 1);
            _mm512_mask_storeu_ps(d + r0[q], mk, _mm512_maskz_loadu_ps(mk, s + loff[r0[q]]));
        }
        for (int64_t r = m; r < w; r++)
            d[r] = 0;
    }
}

/* Packs lanes [i0, i0 + lanes) x k [k0, k0 + kc) of operand x (lanes along dimension ld, k along
 * kd) into panels of w lanes; koff and loff are scratch. */
void loom__gemm_pack_g(const float *x, const loom__gdim *ld, int64_t i0, int64_t lanes,
                       const loom__gdim *kd, int64_t k0, int64_t kc, int64_t w, float *dst,
                       int64_t *koff, int64_t *loff) {
    if (ld->n == 1 && kd->n == 1) {
        loom__gemm_pack(lanes, kc, x + i0 * ld->stride[0] + k0 * kd->stride[0], ld->stride[0],
                        kd->stride[0], w, dst);
        return;
    }
    loom__gd_offsets(kd, k0, kc, koff);
    int64_t kruns = 1; /* runs contiguous along k, against runs across the lanes below */
    for (int64_t k = 1; k < kc; k++)
        kruns += koff[k] != koff[k - 1] + 1;
    for (int64_t i = 0; i < lanes; i += w, dst += w * kc) {
        int64_t m = lanes - i < w ? lanes - i : w, lruns = 1;
        loom__gd_offsets(ld, i0 + i, m, loff);
        for (int64_t r = 1; r < m; r++)
            lruns += loff[r] != loff[r - 1] + 1;
        if (kc * lruns > m * kruns) { /* longer runs along k (a weight gradient's image) */
            for (int64_t k = 0, kn; k < kc; k += kn) {
                for (kn = 1; k + kn < kc && kn < 16 && koff[k + kn] == koff[k] + kn; kn++)
                    ;
                for (int64_t r0 = 0; r0 < w; r0 += 16)
                    tr16_runs(x + koff[k], loff + r0,
                              (int)(m - r0 < 0    ? 0
                                    : m - r0 > 16 ? 16
                                                  : m - r0),
                              (int)kn, dst + k * w + r0, w, (int)(w - r0 < 16 ? w - r0 : 16));
            }
            continue;
        }
        pack_runs(x, loff, m, koff, kc, w, dst);
    }
}

#endif
