/*
 * dataset.c - in-memory datasets of float samples with int32 labels, read from IDX files (the
 * MNIST format: big-endian magic 0x0000 08 NDIM, NDIM big-endian 32-bit dims, unsigned bytes),
 * gzip'd or plain (zlib reads both). Pixels are scaled to [0, 1] as torchvision's ToTensor does.
 * Every malformed input is reported with the file, the byte offset and what was expected. IDX
 * pixels stay bytes in memory (a quarter of the floats' size) and are scaled when a batch is
 * gathered, which gives the same floats as scaling them up front.
 */
#include "internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

struct loom_dataset {
    int64_t n;
    int ndim; /* of a sample */
    int64_t shape[LOOM_MAX_DIMS];
    int64_t sample_numel;
    float *x;    /* samples given as floats, or NULL */
    uint8_t *x8; /* samples read as bytes (IDX), scaled by 1/255 when gathered, or NULL */
    int32_t *y;
};

void loom_dataset_free(loom_dataset *d) {
    if (!d)
        return;
    loom__free(d->x);
    loom__free(d->x8);
    loom__free(d->y);
    loom__free(d);
}

int64_t loom_dataset_count(const loom_dataset *d) {
    return d->n;
}
int loom_dataset_sample_ndim(const loom_dataset *d) {
    return d->ndim;
}
const int64_t *loom_dataset_sample_shape(const loom_dataset *d) {
    return d->shape;
}

int64_t loom__dataset_sample_numel(const loom_dataset *d) {
    return d->sample_numel;
}

/* dst[k] = src[k] / 255 (as ToTensor does: a division, so bitwise the scalar loop's) 16 at a time
 * with AVX-512; returns how many it did (0 without AVX-512). */
#if defined(__x86_64__) && defined(__GNUC__)
#    include <immintrin.h>
__attribute__((target("avx512f"))) static int64_t bytes_to_floats512(const uint8_t *src, int64_t n,
                                                                     float *dst) {
    int64_t k = 0;
    __m512 scale = _mm512_set1_ps(255.0f);
    for (; k + 16 <= n; k += 16) {
        __m128i b = _mm_loadu_si128((const __m128i *)(const void *)(src + k));
        _mm512_storeu_ps(dst + k,
                         _mm512_div_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(b)), scale));
    }
    return k;
}
static int64_t bytes_to_floats(const uint8_t *src, int64_t n, float *dst) {
    return __builtin_cpu_supports("avx512f") ? bytes_to_floats512(src, n, dst) : 0;
}
#else
static int64_t bytes_to_floats(const uint8_t *src, int64_t n, float *dst) {
    (void)src, (void)n, (void)dst;
    return 0;
}
#endif

void loom__dataset_sample(const loom_dataset *d, int64_t i, float *dst) {
    int64_t n = d->sample_numel;
    if (d->x) {
        memcpy(dst, d->x + i * n, sizeof(float) * (size_t)n);
        return;
    }
    const uint8_t *src = d->x8 + i * n;
    int64_t k = bytes_to_floats(src, n, dst);
    for (; k < n; k++)
        dst[k] = (float)src[k] / 255.0f;
}
void loom__dataset_prefetch(const loom_dataset *d, int64_t i) {
    size_t es = d->x ? sizeof(float) : 1, bytes = es * (size_t)d->sample_numel;
    const char *at = d->x ? (const char *)(d->x + i * d->sample_numel)
                          : (const char *)(d->x8 + i * d->sample_numel);
    for (size_t b = 0; b < bytes; b += 64)
        __builtin_prefetch(at + b);
}

const int32_t *loom__dataset_y(const loom_dataset *d) {
    return d->y;
}

/* Reads exactly n bytes; EFORMAT naming the offset if the file ends early. */
static loom_status read_exact(gzFile f, const char *path, void *buf, size_t n, size_t at,
                              const char *what) {
    size_t got = 0;
    while (got < n) {
        unsigned chunk = n - got > (1u << 30) ? (1u << 30) : (unsigned)(n - got);
        int r = gzread(f, (unsigned char *)buf + got, chunk);
        if (r < 0) {
            int errnum;
            const char *msg = gzerror(f, &errnum);
            return loom__error(LOOM_EFORMAT, "%s: cannot decompress at byte %zu: %s", path,
                               at + got, msg);
        }
        if (r == 0)
            return loom__error(LOOM_EFORMAT,
                               "%s: truncated: expected %zu bytes of %s at byte "
                               "%zu, found %zu",
                               path, n, what, at, got);
        got += (size_t)r;
    }
    return LOOM_OK;
}

static uint32_t be32(const unsigned char *b) {
    return (uint32_t)b[0] << 24 | (uint32_t)b[1] << 16 | (uint32_t)b[2] << 8 | b[3];
}

/* The element count of dims[0..ndim) (each checked to be 1 to 2^28 as read), or -1 past 2^33:
 * the product is checked before every multiplication, so it cannot overflow. */
static int64_t idx_total(int ndim, const int64_t *dims) {
    int64_t total = 1;
    for (int i = 0; i < ndim; i++) {
        if (total > ((int64_t)1 << 33) / dims[i])
            return -1;
        total *= dims[i];
    }
    return total;
}

/* Reads `total` data bytes at byte `at` into a buffer that grows with what the file holds (a
 * gzip'd file's size says nothing of its contents), so a header claiming more than is there costs
 * no more memory than the data found. */
static loom_status read_data(gzFile f, const char *path, size_t total, size_t at,
                             unsigned char **data) {
    size_t cap = total < ((size_t)1 << 20) ? total : (size_t)1 << 20, got = 0;
    unsigned char *buf = loom__malloc(cap + 1);
    loom_status s = buf ? LOOM_OK : LOOM_ENOMEM;
    while (!s && got < total) {
        if (got == cap) {
            size_t more = cap * 2 < total ? cap * 2 : total;
            unsigned char *grown = loom__realloc(buf, more + 1);
            if (!grown) {
                s = LOOM_ENOMEM;
                break;
            }
            buf = grown, cap = more;
        }
        size_t want = cap - got < ((size_t)1 << 30) ? cap - got : (size_t)1 << 30;
        int r = gzread(f, buf + got, (unsigned)want);
        if (r < 0) {
            int errnum;
            s = loom__error(LOOM_EFORMAT, "%s: cannot decompress at byte %zu: %s", path, at + got,
                            gzerror(f, &errnum));
        } else if (r == 0) {
            s = loom__error(LOOM_EFORMAT,
                            "%s: truncated: expected %zu bytes of data at byte %zu, found %zu",
                            path, total, at, got);
        }
        got += r > 0 ? (size_t)r : 0;
    }
    if (s)
        loom__free(buf), buf = NULL;
    *data = buf;
    return s;
}

/* Reads an IDX file of unsigned bytes with `ndim` dims; *data is owned by the caller. Nothing
 * is allocated for the data before the header is checked: dims bounded, their product
 * overflow-checked, and a plain file's size equal to header + data. */
loom_status loom__gz_open(const char *path, gzFile *f, int64_t *size) {
    int fd;
    loom_status s = loom__open_regular(path, &fd, size);
    if (s)
        return s;
    if (!(*f = gzdopen(fd, "rb"))) {
        close(fd);
        return loom__error(LOOM_ENOMEM, "%s: cannot open: out of memory", path);
    }
    return LOOM_OK;
}

static loom_status read_idx_file(const char *path, int ndim, int64_t *dims, unsigned char **data) {
    *data = NULL;
    int64_t fsize;
    gzFile f;
    loom_status s = loom__gz_open(path, &f, &fsize);
    if (s)
        return s;
    unsigned char hdr[4 + 4 * 3];
    s = read_exact(f, path, hdr, 4, 0, "IDX magic");
    uint32_t magic = s ? 0 : be32(hdr), want = 0x0800u | (uint32_t)ndim;
    if (!s && magic != want)
        s = loom__error(LOOM_EFORMAT,
                        "%s: bad IDX magic 0x%08x at byte 0, expected 0x%08x "
                        "(unsigned bytes, %d dims)",
                        path, magic, want, ndim);
    if (!s)
        s = read_exact(f, path, hdr + 4, 4 * (size_t)ndim, 4, "IDX dimensions");
    for (int i = 0; i < ndim && !s; i++) {
        dims[i] = be32(hdr + 4 + 4 * i);
        if (dims[i] == 0 || dims[i] > (1 << 28))
            s = loom__error(LOOM_EFORMAT,
                            "%s: dimension %d is %lld at byte %d, expected 1 to "
                            "2^28",
                            path, i, (long long)dims[i], 4 + 4 * i);
    }
    int64_t total = s ? 0 : idx_total(ndim, dims);
    size_t at = 4 + 4 * (size_t)ndim;
    if (!s && total < 0)
        s = loom__error(LOOM_EFORMAT,
                        "%s: the dimensions at bytes 4-%zu give more than 2^33 "
                        "elements, too large",
                        path, at - 1);
    if (!s && gzdirect(f) && fsize != (int64_t)at + total) /* plain: the size must match */
        s = loom__error(LOOM_EFORMAT,
                        "%s: %s: the header at bytes 0-%zu says %lld bytes of data, the file has "
                        "%lld after it",
                        path, fsize < (int64_t)at + total ? "truncated" : "trailing data", at - 1,
                        (long long)total, (long long)(fsize - (int64_t)at));
    if (!s)
        s = read_data(f, path, (size_t)total, at, data);
    unsigned char extra;
    if (!s && gzread(f, &extra, 1) > 0)
        s = loom__error(LOOM_EFORMAT,
                        "%s: trailing data after byte %zu, expected the file to "
                        "end there",
                        path, at + (size_t)total);
    gzclose(f);
    if (s) {
        loom__free(*data);
        *data = NULL;
    }
    return s;
}

/* The decompressed copy of a large gzip'd file, kept under $XDG_CACHE_HOME/loom/data (or
 * ~/.cache/loom/data, or $LOOM_DATA_CACHE; "off" turns it off) and named by the file's path, size
 * and modification time, so that a warm start reads bytes instead of inflating them. Small files
 * are not cached. */
bool loom__data_cache_path(const char *path, uint64_t salt, const char *ext, int64_t min_bytes,
                           char *out, size_t size) {
    struct stat st;
    if (stat(path, &st) != 0 || st.st_size < min_bytes)
        return false;
    char dir[3000];
    const char *where = loom__getenv()->data_cache;
    if (where && strcmp(where, "off") == 0)
        return false;
    if (where)
        snprintf(dir, sizeof dir, "%s", where);
    if (where ? !loom__mkdirs(dir) : !loom__cache_dir("data", dir, sizeof dir))
        return false;
    loom__hash h;
    loom__hash_init(&h);
    loom__hash_bytes(&h, path, strlen(path));
    loom__hash_u64(&h, (uint64_t)st.st_size);
    loom__hash_u64(&h, (uint64_t)st.st_mtim.tv_sec);
    loom__hash_u64(&h, (uint64_t)st.st_mtim.tv_nsec);
    loom__hash_u64(&h, salt);
    snprintf(out, size, "%s/%016llx.%s", dir, (unsigned long long)loom__hash_final(&h), ext);
    return true;
}

/* Writes the decoded file to the cache (temp + rename); failures only cost the next start. */
static void cache_idx(const char *cached, int ndim, const int64_t *dims, const unsigned char *data,
                      int64_t total) {
    char tmp[4300];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", cached, (long)getpid());
    loom__remove_stale_temps(cached); /* a killed writer's */
    FILE *f = fopen(tmp, "wb");
    if (!f)
        return;
    unsigned char hdr[4 + 4 * 3] = {0, 0, 8, (unsigned char)ndim};
    for (int i = 0; i < ndim; i++)
        for (int b = 0; b < 4; b++)
            hdr[4 + 4 * i + b] = (unsigned char)(dims[i] >> (24 - 8 * b));
    bool ok = fwrite(hdr, 1, 4 + 4 * (size_t)ndim, f) == 4 + 4 * (size_t)ndim &&
              fwrite(data, 1, (size_t)total, f) == (size_t)total;
    ok = (fclose(f) == 0) && ok;
    if (!ok || rename(tmp, cached) != 0)
        unlink(tmp);
}

static loom_status read_idx(const char *path, int ndim, int64_t *dims, unsigned char **data) {
    char cached[4200];
    bool cacheable = loom__data_cache_path(path, 0, "idx", 1 << 20, cached, sizeof cached);
    if (cacheable && read_idx_file(cached, ndim, dims, data) == LOOM_OK)
        return LOOM_OK;
    loom_status s = read_idx_file(path, ndim, dims, data);
    if (!s && cacheable) /* dims are valid (and bounded) only after a successful read */
        cache_idx(cached, ndim, dims, *data, idx_total(ndim, dims));
    return s;
}

loom_status loom_dataset_load_idx(const char *images, const char *labels, int num_classes,
                                  loom_dataset **out) {
    *out = NULL;
    int64_t di[3], dl[1];
    unsigned char *img = NULL, *lab = NULL;
    loom_status s = read_idx(images, 3, di, &img);
    if (!s)
        s = read_idx(labels, 1, dl, &lab);
    if (!s && dl[0] != di[0])
        s = loom__error(LOOM_EFORMAT, "%s has %lld labels but %s has %lld images", labels,
                        (long long)dl[0], images, (long long)di[0]);
    for (int64_t i = 0; !s && i < dl[0]; i++)
        if (lab[i] >= num_classes)
            s = loom__error(LOOM_EFORMAT, "%s: label %d at byte %lld is not below %d classes",
                            labels, lab[i], (long long)(8 + i), num_classes);
    loom_dataset *d = s ? NULL : loom__calloc(1, sizeof *d);
    if (!s && !d)
        s = LOOM_ENOMEM;
    if (!s) {
        d->n = di[0], d->ndim = 3;
        d->shape[0] = 1, d->shape[1] = di[1], d->shape[2] = di[2];
        d->sample_numel = di[1] * di[2];
        d->y = loom__malloc(sizeof(int32_t) * (size_t)d->n);
        if (!d->y)
            s = LOOM_ENOMEM;
    }
    if (!s) {
        d->x8 = img; /* the dataset keeps the bytes */
        img = NULL;
        for (int64_t i = 0; i < d->n; i++)
            d->y[i] = lab[i];
        *out = d;
    } else {
        loom_dataset_free(d);
    }
    loom__free(img);
    loom__free(lab);
    return s;
}

static bool exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

/* dir/stem, or dir/stem.gz if only that exists. */
static void find_file(const char *dir, const char *stem, char *out, size_t size) {
    snprintf(out, size, "%s/%s", dir, stem);
    if (!exists(out))
        snprintf(out, size, "%s/%s.gz", dir, stem);
}

loom_status loom_dataset_fmnist(const char *dir, const char *split, loom_dataset **out) {
    *out = NULL;
    bool train = split && strcmp(split, "train") == 0;
    if (!split || (!train && strcmp(split, "test") != 0))
        return loom__error(LOOM_EINVAL,
                           "loom_dataset_fmnist: split '%s', expected 'train' or "
                           "'test'",
                           split ? split : "(null)");
    if (!dir)
        dir = loom__getenv()->data ? loom__getenv()->data : "/usr/share/datasets/fashion-mnist";
    char img[4096], lab[4096];
    find_file(dir, train ? "train-images-idx3-ubyte" : "t10k-images-idx3-ubyte", img, sizeof img);
    find_file(dir, train ? "train-labels-idx1-ubyte" : "t10k-labels-idx1-ubyte", lab, sizeof lab);
    if (!exists(img) || !exists(lab))
        return loom__error(LOOM_ENOTFOUND,
                           "Fashion-MNIST not found in %s (no %s): install it with "
                           "'apt-get install dataset-fashion-mnist', or pass --data DIR or set "
                           "LOOM_DATA to a directory with the IDX files",
                           dir, exists(img) ? lab : img);
    return loom_dataset_load_idx(img, lab, 10, out);
}

loom_dataset *loom_dataset_from_arrays(int64_t n, int sample_ndim, const int64_t *sample_shape,
                                       const float *x, const int32_t *y) {
    if (n < 0 || sample_ndim < 0 || sample_ndim >= LOOM_MAX_DIMS || !x || !y) {
        loom__error(LOOM_EINVAL, "loom_dataset_from_arrays: bad arguments");
        return NULL;
    }
    loom_dataset *d = loom__calloc(1, sizeof *d);
    if (!d)
        return NULL;
    d->n = n, d->ndim = sample_ndim, d->sample_numel = 1;
    for (int i = 0; i < sample_ndim; i++) {
        d->shape[i] = sample_shape[i];
        d->sample_numel *= sample_shape[i];
    }
    d->x = loom__malloc(sizeof(float) * (size_t)(n * d->sample_numel));
    d->y = loom__malloc(sizeof(int32_t) * (size_t)n);
    if (!d->x || !d->y) {
        loom_dataset_free(d);
        return NULL;
    }
    memcpy(d->x, x, sizeof(float) * (size_t)(n * d->sample_numel));
    memcpy(d->y, y, sizeof(int32_t) * (size_t)n);
    return d;
}
