/*
 * fs.c - the on-disk cache directory shared by compiled kernels and decompressed datasets:
 * $XDG_CACHE_HOME/loom/<sub> (or ~/.cache/loom/<sub>), created with its parents on demand.
 * (LOOM_DATA_CACHE can move or turn off the data part: see data/dataset.c.) Also the two
 * safeguards of every file loom reads or writes: only regular files are opened for reading (a
 * FIFO would block, a directory reads as garbage), read at an offset to the byte asked for, and
 * a writer's stale temporary files go.
 */
#include "internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
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

/* Whether name is a temporary file (<name>.tmp.<pid>[.<anything>]) whose writer still runs, or
 * that is of no such form (then it is nobody's to remove). */
static bool writer_alive(const char *tmp) {
    char *end;
    long pid = strtol(tmp + 5, &end, 10);
    return (*end && *end != '.') || pid <= 0 || kill((pid_t)pid, 0) == 0 || errno != ESRCH;
}

/* Removes the regular files of dir that loom writes and has finished (.so, .log, .idx), and the
 * temporary files of writers that have died; a writer's files in progress are left to it. */
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
        const char *tmp = strstr(e->d_name, ".tmp.");
        bool ours = tmp ? !writer_alive(tmp)
                        : ends_with(e->d_name, ".so") || ends_with(e->d_name, ".log") ||
                              ends_with(e->d_name, ".idx") || ends_with(e->d_name, ".tokens");
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

static const char *file_kind(mode_t m) {
    return S_ISDIR(m)                 ? "a directory"
           : S_ISFIFO(m)              ? "a FIFO"
           : S_ISSOCK(m)              ? "a socket"
           : S_ISCHR(m) || S_ISBLK(m) ? "a device"
                                      : "not a regular file";
}

loom_status loom__open_regular(const char *path, int *fd, int64_t *size) {
    *fd = -1, *size = 0;
    int f = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC); /* a FIFO opens without a writer */
    if (f < 0)
        return loom__error(errno == ENOENT ? LOOM_ENOTFOUND : LOOM_EIO, "%s: cannot open: %s", path,
                           strerror(errno));
    struct stat st;
    if (fstat(f, &st) != 0 || !S_ISREG(st.st_mode)) {
        loom_status s = loom__error(LOOM_EIO, "%s: is %s, expected a regular file", path,
                                    fstat(f, &st) == 0 ? file_kind(st.st_mode) : strerror(errno));
        close(f);
        return s;
    }
    int flags = fcntl(f, F_GETFL);
    if (flags >= 0)
        fcntl(f, F_SETFL, flags & ~O_NONBLOCK);
    *fd = f, *size = (int64_t)st.st_size;
    return LOOM_OK;
}

int loom__remove_stale_temps(const char *path) {
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    const char *base = slash ? slash + 1 : path;
    if (slash)
        *slash = 0;
    DIR *d = opendir(slash ? (*dir ? dir : "/") : ".");
    if (!d)
        return 0;
    size_t blen = strlen(base);
    int removed = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        const char *n = e->d_name;
        if (strncmp(n, base, blen) != 0 || strncmp(n + blen, ".tmp.", 5) != 0)
            continue;
        if (writer_alive(n + blen))
            continue; /* not of this form, or its writer still runs */
        char stale[8300];
        snprintf(stale, sizeof stale, "%s/%s", slash ? (*dir ? dir : "") : ".", n);
        removed += unlink(stale) == 0;
    }
    closedir(d);
    return removed;
}

loom_status loom__read_at(int fd, const char *path, void *buf, size_t n, uint64_t at,
                          const char *what) {
    size_t got = 0;
    while (got < n) {
        ssize_t r = pread(fd, (char *)buf + got, n - got, (off_t)(at + got));
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return loom__error(LOOM_EIO, "%s: cannot read %zu bytes of %s at byte %llu: %s", path,
                               n, what, (unsigned long long)at,
                               r < 0 ? strerror(errno) : "the file ended");
        got += (size_t)r;
    }
    return LOOM_OK;
}

/* Writes n bytes at p to fd, whole (a short write is continued); false with errno set. */
static bool write_all(int fd, const void *p, size_t n) {
    const char *b = p;
    while (n > 0) {
        ssize_t w = write(fd, b, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            errno = w < 0 ? errno : ENOSPC;
            return false;
        }
        b += w, n -= (size_t)w;
    }
    return true;
}

/* fsync of path's directory, so that a rename into it survives a crash. */
static bool sync_dir_of(const char *path) {
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash)
        *(slash == dir ? slash + 1 : slash) = 0;
    int fd = open(slash ? dir : ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return false;
    bool ok = fsync(fd) == 0 || errno == EINVAL; /* (some file systems cannot sync a directory) */
    close(fd);
    return ok;
}

/* The fault of LOOM_FAULT_WRITE: this call is the K-th. */
static bool fault_now(void) {
    static int64_t calls; /* (atomic writes are made by one thread of a process at a time) */
    int64_t k = loom__getenv()->fault_write;
    return k > 0 && __atomic_add_fetch(&calls, 1, __ATOMIC_RELAXED) == k;
}

loom_status loom__write_atomic(const char *path, const loom__part *parts, int n) {
    loom__remove_stale_temps(path); /* left by a writer of this path that was killed */
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return loom__error(LOOM_EIO, "%s: cannot create: %s", tmp, strerror(errno));
    size_t total = 0, half;
    for (int i = 0; i < n; i++)
        total += parts[i].n;
    half = fault_now() ? total / 2 : SIZE_MAX;
    bool ok = true;
    size_t done = 0;
    for (int i = 0; i < n && ok; i++) {
        size_t first = parts[i].n;
        if (done + first > half) /* the fault: half the bytes on disk, then the end */
            first = half - done;
        ok = write_all(fd, parts[i].p, first);
        done += first;
        if (ok && done == half) {
            fsync(fd);
            raise(SIGKILL);
        }
        ok = ok && write_all(fd, (const char *)parts[i].p + first, parts[i].n - first);
    }
    int err = ok ? 0 : errno;
    if (ok && fsync(fd) != 0)
        ok = false, err = errno;
    if (close(fd) != 0 && ok)
        ok = false, err = errno;
    if (ok && rename(tmp, path) != 0)
        ok = false, err = errno;
    if (!ok) {
        unlink(tmp);
        return loom__error(LOOM_EIO, "%s: cannot write: %s", path, strerror(err));
    }
    if (!sync_dir_of(path))
        return loom__error(LOOM_EIO, "%s: written, but its directory cannot be synced: %s", path,
                           strerror(errno));
    return LOOM_OK;
}
