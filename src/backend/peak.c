/*
 * peak.c - this machine's float32 FMA peak on one core, measured: independent chains of fused
 * multiply-adds on registers (no loads) in the widest vectors the CPU has (24 chains of AVX-512's
 * 16 lanes, or 12 of AVX2's 8: enough to cover the FMA units' latency either way), the best of
 * five runs of about 10 ms, in GFLOP/s (2 flops per lane per FMA). 0 on a CPU with neither.
 * Measured once a process; the
 * training command divides a step's product FLOP/s by it (the share of the peak nanoGPT calls
 * MFU) and bench/ reports its figures against it.
 */
#include "internal.h"

#include <pthread.h>

#if defined(__x86_64__) && defined(__GNUC__)
/* n rounds of 24 FMAs on 16 lanes */
__attribute__((target("avx512f"))) static void fmas(long n) {
    __asm__ volatile("vxorps %%xmm30, %%xmm30, %%xmm30\n\tvxorps %%xmm31, %%xmm31, %%xmm31" ::
                         : "xmm30", "xmm31");
    for (long i = 0; i < n; i++)
        __asm__ volatile(
#    define F(r) "vfmadd231ps %%zmm30, %%zmm31, %%zmm" #    r "\n\t"
            F(0) F(1) F(2) F(3) F(4) F(5) F(6) F(7) F(8) F(9) F(10) F(11) F(12) F(13) F(14) F(15)
                F(16) F(17) F(18) F(19) F(20) F(21) F(22) F(23)
#    undef F
                    ::
                        : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8",
                          "xmm9", "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", "xmm16",
                          "xmm17", "xmm18", "xmm19", "xmm20", "xmm21", "xmm22", "xmm23");
}
/* n rounds of 12 FMAs on 8 lanes */
__attribute__((target("avx2,fma"))) static void fmas256(long n) {
    __asm__ volatile("vxorps %%xmm14, %%xmm14, %%xmm14\n\tvxorps %%xmm15, %%xmm15, %%xmm15" ::
                         : "xmm14", "xmm15");
    for (long i = 0; i < n; i++)
        __asm__ volatile(
#    define F(r) "vfmadd231ps %%ymm14, %%ymm15, %%ymm" #    r "\n\t"
            F(0) F(1) F(2) F(3) F(4) F(5) F(6) F(7) F(8) F(9) F(10) F(11)
#    undef F
                ::
                    : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8",
                      "xmm9", "xmm10", "xmm11");
}
#endif

static double peak;

static void measure(void) {
#if defined(__x86_64__) && defined(__GNUC__)
    bool wide = __builtin_cpu_supports("avx512f");
    if (!wide && !(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")))
        return;
    for (int r = 0; r < 5; r++) {
        long n = 2000000;
        double t0 = loom__now();
        if (wide)
            fmas(n);
        else
            fmas256(n);
        double g = (double)n * (wide ? 24 * 32 : 12 * 16) / (loom__now() - t0) * 1e-9;
        peak = g > peak ? g : peak;
    }
#endif
}

double loom_fma_peak_gflops(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, measure);
    return peak;
}
