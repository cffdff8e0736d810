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
 * step). Double erf stays libm's.
 */
#ifndef LOOM_OPMATH_H
#define LOOM_OPMATH_H

#define LOOM_OPMATH_EMIT(...) __VA_ARGS__
#define LOOM_OPMATH_STR(...)  #__VA_ARGS__ "\n"

#define LOOM_OPMATH(X)                                                                             \
    X(static inline float loom_erff(float x) {                                                     \
        double d = (double)x;                                                                      \
        d = d > 4.0 ? 4.0 : d;                                                                     \
        d = d < -4.0 ? -4.0 : d;                                                                   \
        double z = d * d;                                                                          \
        double p =                                                                                 \
            ((((1.996494116540898e-06 * z + 0.000285129500232852) * z + 0.0038799412679121343) *   \
                  z +                                                                              \
              0.05309365944513625) *                                                               \
                 z +                                                                               \
             0.1933779142521109) *                                                                 \
                z +                                                                                \
            1.1283791413717612;                                                                    \
        double q =                                                                                 \
            ((((3.75502192662339e-05 * z + 0.0011859334184480676) * z + 0.01520003890764829) * z + \
              0.11529356968503457) *                                                               \
                 z +                                                                               \
             0.504709259889306) *                                                                  \
                z +                                                                                \
            1.0;                                                                                   \
        return (float)(d * p / q);                                                                 \
    })

#endif
