/*
 * harness.h - a minimal test harness in the style of libuv's task.h: TEST functions, ASSERT
 * macros that print both values with file:line and return from the test, and a main that runs the
 * listed tests and exits non-zero if any failed.
 */
#ifndef LOOM_TEST_HARNESS_H
#define LOOM_TEST_HARNESS_H

#include "loom.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int harness_failed;
static const char *harness_current;

#define TEST(name) static void name(void)

#define FAILF(...)                                                                 \
    do {                                                                           \
        fprintf(stderr, "FAIL %s (%s:%d): ", harness_current, __FILE__, __LINE__); \
        fprintf(stderr, __VA_ARGS__);                                              \
        fputc('\n', stderr);                                                       \
        harness_failed++;                                                          \
        return;                                                                    \
    } while (0)

#define ASSERT(c)            \
    do {                     \
        if (!(c))            \
            FAILF("%s", #c); \
    } while (0)

#define ASSERT_EQ(a, b)                                      \
    do {                                                     \
        long long a_ = (long long)(a), b_ = (long long)(b);  \
        if (a_ != b_)                                        \
            FAILF("%s == %s: %lld != %lld", #a, #b, a_, b_); \
    } while (0)

#define ASSERT_STR_CONTAINS(s, sub)                                         \
    do {                                                                    \
        const char *s_ = (s);                                               \
        if (!s_ || !strstr(s_, (sub)))                                      \
            FAILF("'%s' does not contain '%s'", s_ ? s_ : "(null)", (sub)); \
    } while (0)

/* |a - b| <= tol * max(1, |b|) */
#define ASSERT_NEAR(a, b, tol)                                                     \
    do {                                                                           \
        double a_ = (double)(a), b_ = (double)(b);                                 \
        double lim_ = (tol) * (fabs(b_) > 1.0 ? fabs(b_) : 1.0);                   \
        if (!(fabs(a_ - b_) <= lim_))                                              \
            FAILF("%s ~ %s: %.9g vs %.9g (tolerance %.3g)", #a, #b, a_, b_, lim_); \
    } while (0)

/* Runs a test; with TEST_ONLY=substring in the environment, only the tests whose names hold it. */
#define RUN(name)                                \
    do {                                         \
        int before_ = harness_failed;            \
        const char *only_ = getenv("TEST_ONLY"); \
        harness_current = #name;                 \
        if (only_ && !strstr(#name, only_))      \
            break;                               \
        name();                                  \
        if (harness_failed == before_)           \
            fprintf(stderr, "ok   %s\n", #name); \
    } while (0)

#define HARNESS_EXIT() (harness_failed ? (fprintf(stderr, "%d failed\n", harness_failed), 1) : 0)

/* A deterministic double in [lo, hi) for test data. */
static inline double test_rand(uint64_t stream, uint64_t i, double lo, double hi) {
    return lo + (hi - lo) * (double)loom_rand_uniform(12345, stream, i);
}

/* n floats of test_rand(stream, i, lo, hi) into x. */
static inline void test_fill(float *x, int64_t n, uint64_t stream, double lo, double hi) {
    for (int64_t i = 0; i < n; i++)
        x[i] = (float)test_rand(stream, (uint64_t)i, lo, hi);
}

/* A per-test temporary path under $LOOM_TEST_TMP (or /tmp). */
static inline void test_tmp(char *buf, size_t size, const char *name) {
    const char *d = getenv("LOOM_TEST_TMP");
    snprintf(buf, size, "%s/%s", d && *d ? d : "/tmp", name);
}

#endif
