/*
 * info.c - what this build of loom is and has: version, backends, BLAS, devices, the default
 * dataset.
 */
#include "../backend/internal.h"
#include "../compile/internal.h"

#include <sys/stat.h>

void loom_info(char *buf, size_t size) {
    const char *data =
        loom__getenv()->data ? loom__getenv()->data : "/usr/share/datasets/fashion-mnist";
    const char *cc = loom__cc_identity();
    const char *backend = loom__getenv()->backend;
    loom_devices *d = loom_devices_new(NULL);
    int devices = d ? loom_devices_count(d) : 1;
    loom_devices_free(d);
    struct stat st;
    snprintf(buf, size,
             "loom %s\n"
             "backends: interp (reference executor); cpu (generated C kernels) %s\n"
             "default backend: %s\n"
             "matmul: %s\n"
             "blas: %s (one thread per device)\n"
             "devices: %d (one per core this process may run on)\n"
             "dataset: %s (%s)\n",
             LOOM_VERSION, cc ? cc : "unavailable: no C compiler",
             backend ? backend
             : cc    ? "cpu"
                     : "interp",
             loom__use_own_gemm()     ? "loom's AVX-512 sgemm (float32), BLAS (float64)"
             : loom__gemm_available() ? "BLAS (LOOM_MATMUL=blas)"
                                      : "BLAS (no AVX-512)",
             loom__blas_name(), devices, data,
             stat(data, &st) == 0 ? "found" : "missing: apt-get install dataset-fashion-mnist");
}
