/*
 * info.c - what this build of loom is and has: version, backends, BLAS, the default dataset.
 */
#include "../backend/internal.h"

#include <sys/stat.h>

void loom_info(char *buf, size_t size) {
    const char *data =
        loom__getenv()->data ? loom__getenv()->data : "/usr/share/datasets/fashion-mnist";
    struct stat st;
    snprintf(buf, size,
             "loom %s\n"
             "backends: interp (reference executor, BLAS matmul)\n"
             "blas: %s (one thread per device)\n"
             "dataset: %s (%s)\n",
             LOOM_VERSION, loom__blas_name(), data,
             stat(data, &st) == 0 ? "found" : "missing: apt-get install dataset-fashion-mnist");
}
