/*
 * fs.c - the on-disk cache directory shared by compiled kernels and decompressed datasets:
 * $XDG_CACHE_HOME/loom/<sub> (or ~/.cache/loom/<sub>), created with its parents on demand.
 * (LOOM_DATA_CACHE can move or turn off the data part: see data/dataset.c.)
 */
#include "internal.h"

#include <errno.h>
#include <stdlib.h>
#include <sys/stat.h>

bool loom__mkdirs(char *path) {
    for (char *s = path + 1; *s; s++) {
        if (*s != '/')
            continue;
        *s = 0;
        mkdir(path, 0777);
        *s = '/';
    }
    return mkdir(path, 0777) == 0 || errno == EEXIST;
}

bool loom__cache_dir(const char *sub, char *out, size_t size) {
    const char *x = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    if (x && *x)
        snprintf(out, size, "%s/loom%s%s", x, *sub ? "/" : "", sub);
    else
        snprintf(out, size, "%s/.cache/loom%s%s", home && *home ? home : "/tmp", *sub ? "/" : "",
                 sub);
    return loom__mkdirs(out);
}
