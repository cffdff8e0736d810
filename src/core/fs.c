/*
 * fs.c - the on-disk cache directory shared by compiled kernels and decompressed datasets:
 * $XDG_CACHE_HOME/loom/<sub> (or ~/.cache/loom/<sub>), created with its parents on demand.
 * (LOOM_DATA_CACHE can move or turn off the data part: see data/dataset.c.)
 */
#include "internal.h"

#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

/* Removes the regular files of dir that loom writes (.so, .c, .log, .idx). */
static loom_status clear_dir(const char *dir, int64_t *files, int64_t *bytes) {
    DIR *d = opendir(dir);
    if (!d)
        return errno == ENOENT ? LOOM_OK
                               : loom__error(LOOM_EIO, "%s: cannot read: %s", dir, strerror(errno));
    struct dirent *e;
    while ((e = readdir(d))) {
        char path[4200];
        struct stat st;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        bool ours = ends_with(e->d_name, ".so") || ends_with(e->d_name, ".log") ||
                    ends_with(e->d_name, ".idx") || ends_with(e->d_name, ".c");
        if (!ours || stat(path, &st) != 0 || !S_ISREG(st.st_mode) || unlink(path) != 0)
            continue;
        (*files)++;
        *bytes += (int64_t)st.st_size;
    }
    closedir(d);
    return LOOM_OK;
}

loom_status loom_cache_clear(int64_t *files, int64_t *bytes) {
    char dir[4096], data[4200];
    *files = *bytes = 0;
    if (!loom__cache_dir("", dir, sizeof dir))
        return loom__error(LOOM_EIO, "%s: cannot create or open the cache directory", dir);
    const char *where = loom__getenv()->data_cache;
    if (where && strcmp(where, "off") != 0)
        snprintf(data, sizeof data, "%s", where);
    else
        snprintf(data, sizeof data, "%s/data", dir);
    loom_status s = clear_dir(dir, files, bytes);
    return s ? s : clear_dir(data, files, bytes);
}
