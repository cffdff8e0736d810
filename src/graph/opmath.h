/*
 * opmath.h - scalar functions that the op table's expressions (ops.def) call where the C library
 * has none fit for a vector loop, written once for every place that evaluates them: the
 * interpreter and loom's matmul epilogues compile LOOM_OPMATH(LOOM_OPMATH_EMIT), and the
 * generated kernels get the same text as a string (LOOM_OPMATH(LOOM_OPMATH_STR)), so compiled
 * and interpreted values stay bitwise equal.
 *
 * loom_erff: erf in float32 as x P(x^2) / Q(x^2), evaluated in double (P of degree 5, Q of
 * degree 5 in x^2, fitted to erf on [0, 4] to 0.38 ulp of a float), |x| clamped at 4 (where the
 * float erf is 1), NaN passing through: faithfully rounded (at most 0.88 ulp from erf over every
 * float tried, tests/test_ops.c), and branch-free, so a compiler makes vector code of a loop of
 * it (libm's erff is a call an element: 3 ns here, a GELU's forward and backward 18% of a GPT's
 * step). loom_expf: exp in float32 as 2^k exp(r), k = x / ln 2 rounded (the 1.5 2^52 trick, k
 * read from the sum's bits), exp(r) by its Taylor series to r^8 in double (|r| <= ln 2 / 2:
 * 2e-10 relative), x clamped to [-110, 89] (0 and infinity after rounding to float), NaN kept:
 * faithfully rounded (tests/test_ops.c), branch-free. For GELU and its gradient, where erf is
 * added to 1, both in float (16 lanes, not 8, a float division): loom_erff_sp, loom_erff's
 * rational evaluated in float (6.1 ulp from erf at most over a seventh of the floats of [-6, 6],
 * where erf nears 1; a GELU then within 3.7 units of 2^-24 max(|x|, |GELU|)), and loom_expf_sp,
 * loom_expf's method in float (the 1.5 2^23 trick, ln 2 in two parts, Taylor to r^7; 0.94 ulp
 * over a seventh of the floats of [-87, 87], clamped there); tests/test_ops.c holds the gradient
 * to its definition. They halve GELU's time and its gradient's. Their polynomials are fused
 * multiply-adds (fmaf: one rounding each, exact wherever it runs, so the interpreter's libm calls
 * and the generated kernels' instructions agree to the bit), half the operations of a multiply
 * and an add (and closer: 7.3 ulp and 1.2 ulp without). loom_tanhf: tanh in float32 from
 * double, branch-free: below |x| = 0.625 its Taylor series to x^21 (1.4e-9 relative at 0.625),
 * above it 1 - 2 / (exp(2 |x|) + 1) with loom_expf's exp, |x| clamped at 10 (where the float
 * tanh is 1), the sign copied back (-0 kept), NaN kept: faithfully rounded (tests/test_ops.c);
 * libm's tanhf is a call an element (GPT-2's GELU and Llama's SiLU: 6% of a step). The double
 * versions stay libm's.
 */
#ifndef LOOM_OPMATH_H
#define LOOM_OPMATH_H

#define LOOM_OPMATH_EMIT(...) __VA_ARGS__
#define LOOM_OPMATH_STR(...)  #__VA_ARGS__ "\n"

/* clang-format off */
#define LOOM_OPMATH(X)                                                                         \
    X(static inline float loom_erff(float x) {                                                 \
        double d = (double)x;                                                                  \
        d = d > 4.0 ? 4.0 : d;                                                                 \
        d = d < -4.0 ? -4.0 : d;                                                               \
        double z = d * d;                                                                      \
        double p = ((((1.996494116540898e-06 * z + 0.000285129500232852) * z +                 \
                      0.0038799412679121343) * z + 0.05309365944513625) * z +                  \
                    0.1933779142521109) * z + 1.1283791413717612;                              \
        double q = ((((3.75502192662339e-05 * z + 0.0011859334184480676) * z +                 \
                      0.01520003890764829) * z + 0.11529356968503457) * z +                    \
                    0.504709259889306) * z + 1.0;                                              \
        return (float)(d * p / q);                                                             \
    }                                                                                          \
    static inline float loom_erff_sp(float x) {                                                \
        float d = x > 4.0f ? 4.0f : x;                                                         \
        d = d < -4.0f ? -4.0f : d;                                                             \
        float z = d * d;                                                                       \
        float p = fmaf(fmaf(fmaf(fmaf(fmaf(1.996494116540898e-06f, z, 0.000285129500232852f),  \
                     z, 0.0038799412679121343f), z, 0.05309365944513625f), z,                  \
                     0.1933779142521109f), z, 1.1283791413717612f);                            \
        float q = fmaf(fmaf(fmaf(fmaf(fmaf(3.75502192662339e-05f, z, 0.0011859334184480676f), \
                     z, 0.01520003890764829f), z, 0.11529356968503457f), z,                    \
                     0.504709259889306f), z, 1.0f);                                            \
        return d * p / q;                                                                      \
    }                                                                                          \
    static inline float loom_expf_sp(float x) {                                                \
        float d = x > 88.0f ? 88.0f : x;                                                       \
        d = d < -87.0f ? -87.0f : d;                                                           \
        union { float f; uint32_t u; } t, s;                                                   \
        t.f = d * 1.44269504f + 12582912.0f;                                                   \
        float k = t.f - 12582912.0f;                                                           \
        float r = (d - k * 0.693145752f) - k * 1.42860677e-06f;                                \
        float p = fmaf(r, fmaf(r, fmaf(r, fmaf(r, fmaf(r, fmaf(r, fmaf(r, 0.000198412701f,    \
                  0.00138888892f), 0.00833333377f), 0.0416666679f), 0.166666672f), 0.5f),     \
                  1.0f), 1.0f);                                                                \
        s.u = (t.u - 0x4b400000u + 127u) << 23;                                                \
        float y = p * s.f;                                                                     \
        return x != x ? x : y;                                                                 \
    }                                                                                          \
    static inline float loom_expf(float x) {                                                   \
        double d = (double)x;                                                                  \
        d = d > 89.0 ? 89.0 : d;                                                               \
        d = d < -110.0 ? -110.0 : d;                                                           \
        union { double f; uint64_t u; } t, s;                                                  \
        t.f = d * 1.4426950408889634 + 6755399441055744.0;                                     \
        double k = t.f - 6755399441055744.0, r = d - k * 0.6931471805599453;                   \
        double p = 1.0 + r * (1.0 + r * (0.5 + r * (1.0 / 6 + r * (1.0 / 24 + r * (1.0 / 120 +  \
                   r * (1.0 / 720 + r * (1.0 / 5040 + r * (1.0 / 40320))))))));                 \
        s.u = (t.u - 0x4338000000000000ull + 1023) << 52;                                      \
        float y = (float)(p * s.f);                                                            \
        return x != x ? x : y;                                                                 \
    }                                                                                          \
    static inline float loom_tanhf(float x) {                                                  \
        double d = (double)x, a = fabs(d);                                                     \
        a = a > 10.0 ? 10.0 : a;                                                               \
        double z = a * a;                                                                      \
        double p = a * (1.0 + z * (-1.0 / 3 + z * (2.0 / 15 + z * (-17.0 / 315 + z *           \
                   (62.0 / 2835 + z * (-1382.0 / 155925 + z * (21844.0 / 6081075 + z *         \
                   (-929569.0 / 638512875 + z * (6404582.0 / 10854718875 + z *                 \
                   (-443861162.0 / 1856156927625 + z * (18888466084.0 /                        \
                   194896477400625)))))))))));                                                 \
        union { double f; uint64_t u; } t, s;                                                  \
        t.f = 2.0 * a * 1.4426950408889634 + 6755399441055744.0;                               \
        double k = t.f - 6755399441055744.0, r = 2.0 * a - k * 0.6931471805599453;             \
        double q = 1.0 + r * (1.0 + r * (0.5 + r * (1.0 / 6 + r * (1.0 / 24 + r * (1.0 / 120 +  \
                   r * (1.0 / 720 + r * (1.0 / 5040 + r * (1.0 / 40320))))))));                 \
        s.u = (t.u - 0x4338000000000000ull + 1023) << 52;                                      \
        double y = a < 0.625 ? p : 1.0 - 2.0 / (q * s.f + 1.0);                                \
        return x != x ? x : (float)copysign(y, d);                                             \
    })
/* clang-format on */

#endif
