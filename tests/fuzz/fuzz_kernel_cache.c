/*
 * fuzz_kernel_cache.c - libFuzzer target: any bytes as a compiled-kernel cache entry, through the
 * check that stands before dlopen (a truncated entry once made dlopen die of SIGBUS). The check
 * must never crash and must refuse everything but a whole entry.
 */
#include "../../src/compile/internal.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    (void)loom__cc_entry_intact(fuzz_file(0, ".so", data, size));
    return 0;
}
