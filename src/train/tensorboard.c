/*
 * tensorboard.c - TensorBoard's event files (what torch.utils.tensorboard.SummaryWriter writes):
 * DIR/events.out.tfevents.<seconds>.<host>.<pid>.loom, a TFRecord stream of Event protocol
 * buffers. A record is its length (uint64, little-endian), the masked CRC-32C of those 8 bytes,
 * the data and the data's masked CRC-32C. The first event carries file_version "brain.Event:2";
 * each scalar is an event of its own: wall time, step and a Summary with one value (tag,
 * simple_value). A resumed run's file starts with a SessionLog START at its first step, which
 * tells TensorBoard to drop what an earlier file logged from that step on (the steps the resumed
 * run makes again). Records are kept whole in a buffer and written with write(2), checked; a
 * write that fails is cut off again, so the file always ends on a whole record.
 */
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

struct loom_tensorboard {
    int fd;
    off_t good; /* bytes of whole records written */
    unsigned char *buf;
    size_t len;
    int64_t cap;
    char path[4500]; /* (a 4096-byte directory, the host's name and the rest) */
};

static uint32_t masked_crc(const void *p, size_t n) {
    uint32_t c = loom__crc32c(0, p, n);
    return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

/* Protocol buffer encoding into b (room enough): a varint, a key, fixed-width little-endian. */
static size_t varint(unsigned char *b, uint64_t v) {
    size_t k = 0;
    do {
        b[k++] = (unsigned char)((v & 0x7F) | (v > 0x7F ? 0x80 : 0));
        v >>= 7;
    } while (v);
    return k;
}

static size_t fixed(unsigned char *b, uint64_t v, int bytes) {
    for (int i = 0; i < bytes; i++)
        b[i] = (unsigned char)(v >> (8 * i));
    return (size_t)bytes;
}

/* An Event: wall time, step, then `tail` (its other fields, encoded) into b; its length. */
static size_t event(unsigned char *b, int64_t step, const unsigned char *tail, size_t n) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    double wall = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
    uint64_t bits;
    memcpy(&bits, &wall, sizeof bits);
    size_t k = 0;
    b[k++] = 0x09; /* wall_time = 1, fixed64 */
    k += fixed(b + k, bits, 8);
    b[k++] = 0x10; /* step = 2, varint */
    k += varint(b + k, (uint64_t)step);
    memcpy(b + k, tail, n);
    return k + n;
}

/* Appends one record of n bytes to the buffer. */
static loom_status record(loom_tensorboard *w, const unsigned char *data, size_t n) {
    if (loom__grow((void **)&w->buf, &w->cap, (int64_t)(w->len + n + 16), 1))
        return LOOM_ENOMEM;
    unsigned char *r = w->buf + w->len;
    fixed(r, n, 8);
    fixed(r + 8, masked_crc(r, 8), 4);
    memcpy(r + 12, data, n);
    fixed(r + 12 + n, masked_crc(data, n), 4);
    w->len += n + 16;
    return LOOM_OK;
}

loom_status loom_tensorboard_flush(loom_tensorboard *w) {
    if (w && w->fd < 0)
        return loom__error(LOOM_EIO, "%s: not written after an earlier failure", w->path);
    if (!w || w->len == 0)
        return LOOM_OK;
    for (size_t k = 0; k < w->len;) {
        ssize_t n = write(w->fd, w->buf + k, w->len - k);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            int err = n < 0 ? errno : ENOSPC;
            int cut = ftruncate(w->fd, w->good); /* the file ends on a whole record */
            (void)cut;
            close(w->fd);
            w->fd = -1;
            return loom__error(LOOM_EIO, "%s: cannot write: %s", w->path, strerror(err));
        }
        k += (size_t)n;
    }
    w->good += (off_t)w->len;
    w->len = 0;
    return LOOM_OK;
}

loom_status loom_tensorboard_open(const char *dir, int64_t resumed, loom_tensorboard **out) {
    *out = NULL;
    char d[4096], host[256] = "localhost";
    snprintf(d, sizeof d, "%s", dir ? dir : "");
    if (!*d || !loom__mkdirs(d))
        return loom__error(LOOM_EIO, "%s: cannot create the log directory: %s", d,
                           *d ? strerror(errno) : "no path");
    gethostname(host, sizeof host - 1);
    loom_tensorboard *w = loom__calloc(1, sizeof *w);
    if (!w)
        return LOOM_ENOMEM;
    snprintf(w->path, sizeof w->path, "%s/events.out.tfevents.%lld.%s.%ld.loom", d,
             (long long)time(NULL), host, (long)getpid());
    w->fd = open(w->path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (w->fd < 0) {
        loom_status s = loom__error(LOOM_EIO, "%s: cannot create: %s", w->path, strerror(errno));
        loom__free(w);
        return s;
    }
    static const char version[] = "brain.Event:2";
    unsigned char tail[64], b[128];
    size_t n = 0;
    tail[n++] = 0x1a; /* file_version = 3 */
    n += varint(tail + n, sizeof version - 1);
    memcpy(tail + n, version, sizeof version - 1), n += sizeof version - 1;
    loom_status s = record(w, b, event(b, 0, tail, n));
    if (!s && resumed >= 0) { /* session_log = 7 { status = 1: START } at the first new step */
        static const unsigned char start[] = {0x3a, 0x02, 0x08, 0x01};
        s = record(w, b, event(b, resumed + 1, start, sizeof start));
    }
    if (!s)
        s = loom_tensorboard_flush(w);
    if (s) {
        loom_tensorboard_close(w);
        return s;
    }
    *out = w;
    return LOOM_OK;
}

loom_status loom_tensorboard_add(loom_tensorboard *w, const char *tag, int64_t step, double value) {
    if (!w || !tag)
        return loom__error(LOOM_EINVAL, "loom_tensorboard_add: NULL argument");
    size_t tl = strnlen(tag, 512);
    unsigned char v[600], sum[620], tail[640], b[700];
    size_t n = 0, m = 0, t = 0;
    v[n++] = 0x0a; /* Value.tag = 1 */
    n += varint(v + n, tl);
    memcpy(v + n, tag, tl), n += tl;
    float f = (float)value;
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    v[n++] = 0x15; /* Value.simple_value = 2, fixed32 */
    n += fixed(v + n, bits, 4);
    sum[m++] = 0x0a; /* Summary.value = 1 */
    m += varint(sum + m, n);
    memcpy(sum + m, v, n), m += n;
    tail[t++] = 0x2a; /* Event.summary = 5 */
    t += varint(tail + t, m);
    memcpy(tail + t, sum, m), t += m;
    loom_status s = record(w, b, event(b, step, tail, t));
    return !s && w->len >= 4096 ? loom_tensorboard_flush(w) : s;
}

const char *loom_tensorboard_path(const loom_tensorboard *w) {
    return w ? w->path : NULL;
}

loom_status loom_tensorboard_close(loom_tensorboard *w) {
    if (!w)
        return LOOM_OK;
    loom_status s = w->fd >= 0 ? loom_tensorboard_flush(w) : LOOM_OK;
    if (w->fd >= 0) {
        bool synced = fsync(w->fd) == 0, closed = close(w->fd) == 0;
        if ((!synced || !closed) && !s)
            s = loom__error(LOOM_EIO, "%s: cannot write: %s", w->path, strerror(errno));
    }
    loom__free(w->buf);
    loom__free(w);
    return s;
}
