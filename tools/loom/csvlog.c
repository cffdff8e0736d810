/*
 * csvlog.c - `--log-dir DIR`: DIR/metrics.csv, a row at a time, and TensorBoard's event file of
 * the same scalars beside it (loom_tensorboard_*). Every row is formatted whole and
 * written with write(2), and every write and the close are checked: a row that cannot be written
 * (a full disk, a quota, an I/O error) is cut off again, so the file always ends on a whole row,
 * and the run stops with one line naming the file and the reason; with --log-errors warn it says
 * so once and trains on without the log. Also --save's check before training.
 */
#include "cli.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct cli_log {
    loom_tensorboard *tb; /* DIR's TensorBoard event file (NULL once given up) */
    int fd;               /* -1 once given up (warn_only) */
    off_t good;           /* bytes of whole rows written */
    bool warn_only;       /* a failed write warns once and logging stops; else the run stops */
    char path[4200];
};

/* Gives up on both files of the log after a failure (`what`): 1 after one line, or 0 after a
 * warning when warn_only (and the run trains on without either). */
static int give_up(cli_log *l, const char *what) {
    if (l->fd >= 0) {
        int cut = ftruncate(l->fd, l->good); /* the file ends on a whole row */
        (void)cut;
        close(l->fd);
    }
    l->fd = -1;
    loom_tensorboard_close(l->tb); /* (its file ends on a whole record) */
    l->tb = NULL;
    if (!l->warn_only)
        return cli_fail("--log-dir: %s", what);
    fprintf(stderr, "loom: --log-dir: %s; training on without the log\n", what);
    return 0;
}

/* give_up for metrics.csv's failure `why`. */
static int csv_give_up(cli_log *l, const char *why) {
    char what[4400];
    snprintf(what, sizeof what, "cannot write '%s': %s", l->path, why);
    return give_up(l, what);
}

/* give_up for the TensorBoard file's failure (loom_last_error names it). */
static int tb_give_up(cli_log *l) {
    char what[1024];
    snprintf(what, sizeof what, "%s", loom_last_error());
    return give_up(l, what);
}

static int write_all(cli_log *l, const char *buf, size_t n) {
    for (size_t k = 0; k < n;) {
        ssize_t w = write(l->fd, buf + k, n - k);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return csv_give_up(l, w < 0 ? strerror(errno) : "nothing written");
        k += (size_t)w;
    }
    l->good += (off_t)n;
    return 0;
}

/* A resumed run's log: the rows of metrics.csv up to step `upto` (its first column) are kept,
 * those after it (the resumed run makes them again) cut off; a file of another header is started
 * anew. Returns the bytes kept (0: none). */
static off_t kept_rows(int fd, const char *header, int64_t upto) {
    struct stat st;
    if (upto < 0 || fstat(fd, &st) != 0 || st.st_size <= 0 || st.st_size > ((off_t)1 << 30))
        return 0;
    char *text = malloc((size_t)st.st_size + 1);
    ssize_t got = text ? pread(fd, text, (size_t)st.st_size, 0) : -1;
    off_t keep = 0;
    size_t hl = strlen(header);
    if (got == st.st_size && (size_t)got >= hl && !memcmp(text, header, hl)) {
        text[got] = 0;
        keep = (off_t)hl;
        for (char *row = text + hl, *nl; (nl = strchr(row, '\n')); row = nl + 1) {
            if (strtoll(row, NULL, 10) > upto)
                break;
            keep = (off_t)(nl + 1 - text);
        }
    }
    free(text);
    return keep;
}

cli_log *cli_log_open(const char *dir, const char *header, bool warn_only, int64_t resumed) {
    if (mkdir(dir, 0777) != 0 && errno != EEXIST) {
        cli_fail("--log-dir: cannot create '%s': %s", dir, strerror(errno));
        return NULL;
    }
    cli_log *l = calloc(1, sizeof *l);
    if (!l) {
        cli_fail("--log-dir: out of memory");
        return NULL;
    }
    snprintf(l->path, sizeof l->path, "%s/metrics.csv", dir);
    l->warn_only = warn_only;
    l->fd = open(l->path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    off_t keep = l->fd >= 0 ? kept_rows(l->fd, header, resumed) : 0;
    if (l->fd < 0 || ftruncate(l->fd, keep) != 0 || lseek(l->fd, keep, SEEK_SET) != keep) {
        cli_fail("--log-dir: cannot write '%s': %s", l->path, strerror(errno));
        if (l->fd >= 0)
            close(l->fd);
        free(l);
        return NULL;
    }
    l->good = keep;
    l->warn_only = false; /* the header must be there: a log that cannot start stops the run */
    if (!keep && write_all(l, header, strlen(header))) {
        free(l);
        return NULL;
    }
    l->warn_only = warn_only;
    if (loom_tensorboard_open(dir, resumed, &l->tb)) {
        cli_fail("--log-dir: %s", loom_last_error());
        close(l->fd);
        free(l);
        return NULL;
    }
    return l;
}

int cli_log_scalar(cli_log *l, const char *tag, int64_t step, double value) {
    if (!l || !l->tb || !loom_tensorboard_add(l->tb, tag, step, value))
        return 0;
    return tb_give_up(l);
}

int cli_log_flush(cli_log *l) {
    if (!l || !l->tb || !loom_tensorboard_flush(l->tb))
        return 0;
    return tb_give_up(l);
}

int cli_log_row(cli_log *l, const char *fmt, ...) {
    if (!l || l->fd < 0)
        return 0;
    char row[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(row, sizeof row, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof row)
        return csv_give_up(l, "a row longer than 511 bytes");
    return write_all(l, row, (size_t)n);
}

int cli_log_close(cli_log *l) {
    if (!l)
        return 0;
    loom_tensorboard *tb = l->tb;
    l->tb = NULL;
    int rc = tb && loom_tensorboard_close(tb) ? tb_give_up(l) : 0;
    if (!rc && l->fd >= 0 && fsync(l->fd) != 0)
        rc = csv_give_up(l, strerror(errno)); /* (closes it) */
    if (l->fd >= 0 && close(l->fd) != 0 && !rc) {
        l->fd = -1;
        rc = csv_give_up(l, strerror(errno));
    }
    free(l);
    return rc;
}

/* Whether the weights can be written where --save says, before any training: a temporary file
 * beside the target is created, a block written to it and synced (so that a full disk is found
 * now), and removed. */
int cli_check_save(const char *path) {
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
        return cli_fail("--save: '%s' is a directory, expected a file path", path);
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0)
        return cli_fail("--save: cannot write '%s': %s", path, strerror(errno));
    static const char block[4096];
    ssize_t w = write(fd, block, sizeof block);
    int err = w < 0 ? errno : w < (ssize_t)sizeof block ? ENOSPC : fsync(fd) ? errno : 0;
    err = close(fd) && !err ? errno : err;
    unlink(tmp);
    if (err)
        return cli_fail("--save: cannot write '%s': %s", path, strerror(err));
    return 0;
}
