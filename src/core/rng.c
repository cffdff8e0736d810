/*
 * rng.c - Philox-4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11).
 * A block of four 32-bit words is a pure function of (key, counter); loom's key is the 64-bit
 * seed and its counter is (counter low, counter high, stream low, stream high). See loom.h for
 * the streams in use. Verified against the published known-answer vectors in tests/test_core.c.
 */
#include "internal.h"

static inline uint32_t mulhilo(uint32_t a, uint32_t b, uint32_t *hi) {
    uint64_t p = (uint64_t)a * b;
    *hi = (uint32_t)(p >> 32);
    return (uint32_t)p;
}

void loom_philox(uint64_t seed, uint64_t stream, uint64_t counter, uint32_t out[4]) {
    uint32_t c0 = (uint32_t)counter, c1 = (uint32_t)(counter >> 32);
    uint32_t c2 = (uint32_t)stream, c3 = (uint32_t)(stream >> 32);
    uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    for (int r = 0; r < 10; r++) {
        uint32_t hi0, hi1;
        uint32_t lo0 = mulhilo(0xD2511F53u, c0, &hi0);
        uint32_t lo1 = mulhilo(0xCD9E8D57u, c2, &hi1);
        uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
        c0 = n0, c1 = n1, c2 = n2, c3 = n3;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    out[0] = c0, out[1] = c1, out[2] = c2, out[3] = c3;
}

float loom_rand_uniform(uint64_t seed, uint64_t stream, uint64_t i) {
    uint32_t w[4];
    loom_philox(seed, stream, i / 4, w);
    return (float)(w[i % 4] >> 8) * (1.0f / 16777216.0f);
}
