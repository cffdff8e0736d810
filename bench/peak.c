/*
 * peak.c - prints this machine's float32 FMA peak on one core in GFLOP/s, as the library measures
 * it (loom_fma_peak_gflops: AVX-512 or AVX2 FMAs on registers, best of five runs; 0 with neither).
 * bench/run.sh divides the training FLOP/s by this figure. Built as build/bench_peak.
 */
#include <loom.h>
#include <stdio.h>

int main(void) {
    printf("%.1f\n", loom_fma_peak_gflops());
    return 0;
}
