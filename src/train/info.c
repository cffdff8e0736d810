/*
 * info.c - what this build of loom is and has: version, backends, BLAS, devices, MPI and the
 * launcher that started this process, the default dataset.
 */
#include "../backend/internal.h"
#include "../compile/internal.h"
#include "../dist/internal.h"

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
             "backends: interp (the interpreter's kernels alone); cpu (generated C kernels) %s\n"
             "default backend: %s\n"
             "executor: %s (LOOM_CHECK=1: check, every kernel against the reference "
             "interpreter)\n"
             "matmul: %s\n"
             "blas: %s (one thread per device)\n"
             "devices: %d (one per core this process may run on)\n"
             "mpi: %s; launcher: %s\n"
             "dataset: %s (%s)\n",
             LOOM_VERSION, cc ? cc : "unavailable: no C compiler",
             backend ? backend
             : cc    ? "cpu"
                     : "interp",
             loom__executor_default()->name,
             loom__use_own_gemm()  ? "loom's AVX-512 sgemm (float32), BLAS (float64)"
             : loom__use_gemm256() ? "loom's AVX2 sgemm (float32), BLAS (float64)"
             : loom__gemm_available() || loom__gemm256_available() ? "BLAS (LOOM_MATMUL=blas)"
                                                                   : "BLAS (no AVX2)",
             loom__blas_name(), devices,
             loom__mpi_version() ? loom__mpi_version()
                                 : "not built in (install libopenmpi-dev, rebuild)",
             loom_mpi_launcher() ? loom_mpi_launcher() : "none (not started by mpirun or mpiexec)",
             data,
             stat(data, &st) == 0 ? "found" : "missing: apt-get install dataset-fashion-mnist");
}
