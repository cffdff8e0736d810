/*
 * safetensors.c - the safetensors format (github.com/huggingface/safetensors): an 8-byte
 * little-endian header length N, N bytes of JSON mapping each tensor name to its dtype, shape and
 * [begin, end) data offsets (plus an optional "__metadata__" object of strings), then the data,
 * row-major, little-endian. Reading validates everything before anything is used; writing is atomic
 * (temporary file, fsync, rename), so a crash never leaves a half-written file under the name.
 */
#include "internal.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct {
    char name[256];
    loom_dtype dtype;
    int ndim;
    int64_t shape[LOOM_MAX_DIMS];
    uint64_t begin, end;
    void *data;
    int half; /* 0, or the file's 16-bit float (HALF_F16, HALF_BF16): read as F32 */
} entry;

enum { HALF_F16 = 1, HALF_BF16 };

struct loom_tensor_file {
    entry *e;
    int64_t n, cap;
    loom__meta meta; /* "__metadata__": string values only */
};

/* ---- a small JSON reader for the header --------------------------------------------------- */

typedef struct {
    const char *s;
    size_t n, i;
    const char *path;
    loom_status err;
} json;

static bool jfail(json *j, const char *what) {
    if (!j->err) {
        char found[16];
        if (j->i < j->n)
            snprintf(found, sizeof found, "'%c'", j->s[j->i]);
        else
            snprintf(found, sizeof found, "the end");
        j->err = loom__error(LOOM_EFORMAT,
                             "%s: malformed safetensors header at byte %zu: expected "
                             "%s, found %s",
                             j->path, 8 + j->i, what, found);
    }
    return false;
}

static void jws(json *j) {
    while (j->i < j->n && strchr(" \t\r\n", j->s[j->i]))
        j->i++;
}

static bool jpeek(json *j, char c) {
    jws(j);
    return j->i < j->n && j->s[j->i] == c;
}

static bool jexpect(json *j, char c) {
    char what[8] = {'\'', c, '\'', 0};
    if (!jpeek(j, c))
        return jfail(j, what);
    j->i++;
    return true;
}

/* Four hex digits at j->i into *v. */
static bool jhex4(json *j, unsigned *v) {
    *v = 0;
    for (int d = 0; d < 4; d++, j->i++) {
        char c = j->i < j->n ? j->s[j->i] : 0;
        int x = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                       : -1;
        if (x < 0)
            return jfail(j, "four hex digits");
        *v = *v << 4 | (unsigned)x;
    }
    return true;
}

/* The escape after a backslash (at j->i) as UTF-8 into b (4 bytes); its length, 0 on failure. */
static int junescape(json *j, char *b) {
    char c = j->i < j->n ? j->s[j->i++] : 0;
    const char *from = "\"\\/bfnrt", *to = "\"\\/\b\f\n\r\t";
    const char *at = c ? strchr(from, c) : NULL;
    if (at)
        return b[0] = to[at - from], 1;
    unsigned u, lo;
    if (c != 'u' || !jhex4(j, &u))
        return c == 'u' ? 0 : (jfail(j, "an escape (\\\" \\\\ \\/ \\b \\f \\n \\r \\t \\u)"), 0);
    if (u >= 0xD800 && u < 0xDC00) { /* a surrogate pair */
        if (j->i + 2 > j->n || j->s[j->i] != '\\' || j->s[j->i + 1] != 'u')
            return jfail(j, "the low half of a surrogate pair"), 0;
        j->i += 2;
        if (!jhex4(j, &lo) || lo < 0xDC00 || lo > 0xDFFF)
            return jfail(j, "the low half of a surrogate pair"), 0;
        u = 0x10000 + ((u - 0xD800) << 10) + (lo - 0xDC00);
    } else if (u >= 0xDC00 && u <= 0xDFFF) {
        return jfail(j, "no lone low surrogate"), 0;
    }
    return loom__utf8_put((int32_t)u, b);
}

/* A string, escapes decoded, into out (cap bytes) or, with dyn, a new buffer in *dyn. */
static bool jstr(json *j, char *out, size_t cap, char **dyn) {
    if (!jexpect(j, '"'))
        return false;
    size_t k = 0;
    int64_t dcap = 0;
    if (dyn)
        *dyn = NULL;
    while (j->i < j->n && j->s[j->i] != '"') {
        char b[4];
        int len = 1;
        b[0] = j->s[j->i++];
        if (b[0] == '\\' && !(len = junescape(j, b)))
            return dyn ? (loom__free(*dyn), *dyn = NULL, false) : false;
        if (dyn && loom__grow((void **)dyn, &dcap, (int64_t)(k + 5), 1)) {
            j->err = LOOM_ENOMEM;
            return false;
        }
        char *to = dyn ? *dyn : out;
        if (!dyn && k + (size_t)len >= cap)
            return jfail(j, "a shorter string");
        memcpy(to + k, b, (size_t)len);
        k += (size_t)len;
    }
    if (j->i >= j->n) {
        if (dyn)
            loom__free(*dyn), *dyn = NULL;
        return jfail(j, "'\"' closing the string");
    }
    j->i++;
    if (dyn && !*dyn && !(*dyn = loom__malloc(1))) {
        j->err = LOOM_ENOMEM;
        return false;
    }
    (dyn ? *dyn : out)[k] = 0;
    return true;
}

static bool jstring(json *j, char *out, size_t cap) {
    return jstr(j, out, cap, NULL);
}

static bool jskip(json *j);

/* After an object's member: past its ',' or at its closing '}'; false (a failure) at anything
 * else. */
static bool jafter_member(json *j) {
    if (!jpeek(j, ',') && !jpeek(j, '}'))
        return jfail(j, "',' or '}'");
    if (jpeek(j, ','))
        j->i++;
    return true;
}

/* "__metadata__": an object of strings (other values are skipped) into f's metadata. */
static bool jmeta(json *j, loom__meta *md) {
    if (jpeek(j, 'n')) /* null */
        return jskip(j);
    if (!jexpect(j, '{'))
        return false;
    while (!jpeek(j, '}')) {
        char key[256], *val = NULL;
        if (!jstring(j, key, sizeof key) || !jexpect(j, ':'))
            return false;
        if (jpeek(j, '"')) {
            if (!jstr(j, NULL, 0, &val))
                return false;
            loom_status s = loom__meta_set(md, key, val);
            loom__free(val);
            if (s)
                return j->err = s, false;
        } else if (!jskip(j)) {
            return false;
        }
        if (!jafter_member(j))
            return false;
    }
    j->i++;
    return true;
}

static bool jint(json *j, uint64_t *v) {
    jws(j);
    if (j->i >= j->n || j->s[j->i] < '0' || j->s[j->i] > '9')
        return jfail(j, "a non-negative integer");
    uint64_t r = 0;
    while (j->i < j->n && j->s[j->i] >= '0' && j->s[j->i] <= '9') {
        if (r > (UINT64_MAX - 9) / 10)
            return jfail(j, "a smaller integer");
        r = r * 10 + (uint64_t)(j->s[j->i++] - '0');
    }
    *v = r;
    return true;
}

/* Skips any value, nesting tracked by a counter (no recursion). */
static bool jskip(json *j) {
    int depth = 0;
    do {
        jws(j);
        if (j->i >= j->n)
            return jfail(j, "a value");
        char c = j->s[j->i];
        if (c == '"') {
            char *tmp;
            if (!jstr(j, NULL, 0, &tmp))
                return false;
            loom__free(tmp);
        } else if (c == '{' || c == '[') {
            depth++, j->i++;
            continue;
        } else if (c == '}' || c == ']') {
            depth--, j->i++;
        } else if (c == ',' || c == ':') {
            j->i++;
            continue;
        } else {
            while (j->i < j->n && !strchr(",}] \t\r\n", j->s[j->i]))
                j->i++;
        }
    } while (depth > 0);
    return depth == 0 || jfail(j, "balanced brackets");
}

static bool jint_array(json *j, uint64_t *v, int max, int *count) {
    if (!jexpect(j, '['))
        return false;
    *count = 0;
    if (jpeek(j, ']'))
        return jexpect(j, ']');
    do {
        if (*count >= max)
            return jfail(j, "fewer array elements");
        if (!jint(j, &v[(*count)++]))
            return false;
    } while (jpeek(j, ',') && jexpect(j, ','));
    return jexpect(j, ']');
}

/* ---- dtypes -----------------------------------------------------------------------------------
 */

static loom_status parse_dtype(const char *path, const char *name, const char *s, loom_dtype *dt,
                               int *half) {
    static const char *const other[] = {"F8_E4M3", "F8_E5M2", "I64", "I16", "I8",
                                        "U64",     "U32",     "U16", "U8",  "BOOL"};
    *half = !strcmp(s, "F16") ? HALF_F16 : !strcmp(s, "BF16") ? HALF_BF16 : 0;
    if (strcmp(s, "F32") == 0 || strcmp(s, "F64") == 0 || strcmp(s, "I32") == 0 || *half) {
        *dt = s[0] == 'I' ? LOOM_I32 : s[1] == '6' ? LOOM_F64 : LOOM_F32;
        return LOOM_OK;
    }
    for (size_t i = 0; i < sizeof other / sizeof *other; i++)
        if (strcmp(s, other[i]) == 0)
            return loom__error(LOOM_EUNSUPPORTED,
                               "%s: tensor '%s' has dtype %s; loom reads F32, "
                               "F64, I32, and F16 and BF16 as F32",
                               path, name, s);
    return loom__error(LOOM_EFORMAT, "%s: tensor '%s' has unknown dtype '%s'", path, name, s);
}

static bool parse_entry(json *j, entry *e) {
    char key[64], dt[32] = "";
    bool has_shape = false, has_off = false;
    if (!jexpect(j, '{'))
        return false;
    while (!jpeek(j, '}')) {
        if (!jstring(j, key, sizeof key) || !jexpect(j, ':'))
            return false;
        if (strcmp(key, "dtype") == 0) {
            if (!jstring(j, dt, sizeof dt))
                return false;
        } else if (strcmp(key, "shape") == 0) {
            uint64_t v[LOOM_MAX_DIMS];
            if (!jint_array(j, v, LOOM_MAX_DIMS, &e->ndim))
                return false;
            for (int d = 0; d < e->ndim; d++)
                e->shape[d] = (int64_t)(v[d] > (1ull << 40) ? (1ull << 40) : v[d]);
            has_shape = true;
        } else if (strcmp(key, "data_offsets") == 0) {
            uint64_t v[2];
            int n;
            if (!jint_array(j, v, 2, &n))
                return false;
            if (n != 2)
                return jfail(j, "two data_offsets");
            e->begin = v[0], e->end = v[1];
            has_off = true;
        } else if (!jskip(j)) {
            return false;
        }
        if (!jafter_member(j))
            return false;
    }
    j->i++;
    if (!*dt || !has_shape || !has_off) {
        j->err =
            loom__error(LOOM_EFORMAT, "%s: tensor '%s' lacks %s in the header", j->path, e->name,
                        !*dt         ? "a dtype"
                        : !has_shape ? "a shape"
                                     : "data_offsets");
        return false;
    }
    j->err = parse_dtype(j->path, e->name, dt, &e->dtype, &e->half);
    return !j->err;
}

static bool parse_header(json *j, loom_tensor_file *f) {
    if (!jexpect(j, '{'))
        return false;
    while (!jpeek(j, '}')) {
        char name[256];
        if (!jstring(j, name, sizeof name) || !jexpect(j, ':'))
            return false;
        if (strcmp(name, "__metadata__") == 0) {
            if (!jmeta(j, &f->meta))
                return false;
        } else {
            if (loom__grow((void **)&f->e, &f->cap, f->n + 1, sizeof *f->e)) {
                j->err = LOOM_ENOMEM;
                return false;
            }
            entry *e = &f->e[f->n++];
            memset(e, 0, sizeof *e);
            memcpy(e->name, name, sizeof name);
            if (!parse_entry(j, e))
                return false;
        }
        if (!jafter_member(j))
            return false;
    }
    j->i++;
    jws(j);
    return j->i == j->n || jfail(j, "the end of the header");
}

/* ---- reading ----------------------------------------------------------------------------------
 */

static int cmp_begin(const void *a, const void *b) {
    const entry *x = *(const entry *const *)a, *y = *(const entry *const *)b;
    return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : 0;
}

/* Offsets inside the data, byte counts matching shapes, no overlaps. */
static loom_status check_entries(const char *path, loom_tensor_file *f, uint64_t data_size) {
    entry **sorted = loom__malloc(sizeof(entry *) * (size_t)(f->n + 1));
    if (!sorted)
        return LOOM_ENOMEM;
    loom_status s = LOOM_OK;
    for (int64_t i = 0; i < f->n && !s; i++) {
        entry *e = &f->e[i];
        sorted[i] = e;
        uint64_t bytes = e->half ? 2 : loom__dtype_size(e->dtype);
        for (int d = 0; d < e->ndim; d++) /* past 2^64: more than any file holds */
            if (__builtin_mul_overflow(bytes, (uint64_t)e->shape[d], &bytes))
                bytes = UINT64_MAX;
        if (e->end < e->begin || e->end > data_size)
            s = loom__error(LOOM_EFORMAT,
                            "%s: tensor '%s' has data_offsets [%llu, %llu] outside "
                            "the %llu bytes of data",
                            path, e->name, (unsigned long long)e->begin, (unsigned long long)e->end,
                            (unsigned long long)data_size);
        else if (e->end - e->begin != bytes)
            s = loom__error(LOOM_EFORMAT,
                            "%s: tensor '%s' has %llu bytes of data, its shape "
                            "needs %llu",
                            path, e->name, (unsigned long long)(e->end - e->begin),
                            (unsigned long long)bytes);
        for (int64_t k = 0; k < i && !s; k++)
            if (strcmp(f->e[k].name, e->name) == 0)
                s = loom__error(LOOM_EFORMAT, "%s: tensor '%s' appears twice", path, e->name);
    }
    if (!s && f->n > 1) {
        qsort(sorted, (size_t)f->n, sizeof *sorted, cmp_begin);
        for (int64_t i = 1; i < f->n && !s; i++)
            if (sorted[i]->begin < sorted[i - 1]->end)
                s = loom__error(LOOM_EFORMAT, "%s: tensors '%s' and '%s' overlap in the data", path,
                                sorted[i - 1]->name, sorted[i]->name);
    }
    loom__free(sorted);
    return s;
}

/* The tensors against the CRC-32C list loom writes in the metadata ("loom.crc32c", one a tensor
 * in data order), where the file has one: EFORMAT naming the first tensor whose bytes differ. */
static loom_status check_crcs(const char *path, const loom_tensor_file *f, uint64_t data_at) {
    const char *list = loom__meta_get(&f->meta, "loom.crc32c");
    if (!list)
        return LOOM_OK;
    entry **sorted = loom__malloc(sizeof(entry *) * (size_t)(f->n + 1));
    if (!sorted)
        return LOOM_ENOMEM;
    for (int64_t i = 0; i < f->n; i++)
        sorted[i] = &f->e[i];
    qsort(sorted, (size_t)f->n, sizeof *sorted, cmp_begin);
    loom_status s = LOOM_OK;
    const char *c = list;
    for (int64_t i = 0; i < f->n && !s; i++) {
        char *end;
        unsigned long want = strtoul(c, &end, 16);
        const entry *e = sorted[i];
        if (end != c + 8 || (*end != ',' && *end != 0) || (*end == 0) != (i == f->n - 1))
            s = loom__error(LOOM_EFORMAT,
                            "%s: the metadata's loom.crc32c does not list one checksum for each "
                            "of the %lld tensors",
                            path, (long long)f->n);
        else if (loom__crc32c(0, e->data, e->end - e->begin) != (uint32_t)want)
            s = loom__error(LOOM_EFORMAT,
                            "%s: tensor '%s' (bytes %llu to %llu of the file) fails its checksum: "
                            "the file is corrupt",
                            path, e->name, (unsigned long long)(data_at + e->begin),
                            (unsigned long long)(data_at + e->end));
        c = end + (*end == ',');
    }
    if (!s && f->n == 0 && *list)
        s = loom__error(LOOM_EFORMAT, "%s: the metadata's loom.crc32c lists checksums of no tensor",
                        path);
    loom__free(sorted);
    return s;
}

/* A 16-bit float's bits as float32 (exact: every F16 and BF16 value is a float32). */
static float from_f16(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31, e = (h >> 10) & 31, m = h & 1023, bits;
    if (e == 31) /* infinities and NaNs (the payload kept) */
        bits = sign | 0x7F800000u | m << 13;
    else if (e) /* normal */
        bits = sign | (e + 112) << 23 | m << 13;
    else if (!m) /* zero */
        bits = sign;
    else { /* subnormal: m 2^-24, normal in float32 */
        int shift = 0;
        while (!(m & 1024))
            m <<= 1, shift++;
        bits = sign | (uint32_t)(113 - shift) << 23 | (m & 1023) << 13;
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* An F16 or BF16 tensor's data replaced by its values as F32 (little-endian files). */
static loom_status widen(entry *e) {
    if (!e->half)
        return LOOM_OK;
    uint64_t n = (e->end - e->begin) / 2;
    float *to = loom__malloc(sizeof(float) * n + 1);
    if (!to)
        return loom__error(LOOM_ENOMEM, "out of memory widening tensor '%s' to float32", e->name);
    const unsigned char *b = e->data;
    for (uint64_t k = 0; k < n; k++) {
        uint16_t h = (uint16_t)(b[2 * k] | b[2 * k + 1] << 8);
        uint32_t bits = (uint32_t)h << 16;
        if (e->half == HALF_F16)
            to[k] = from_f16(h);
        else
            memcpy(&to[k], &bits, 4);
    }
    loom__free(e->data);
    e->data = to;
    return LOOM_OK;
}

/* safetensors' own bound on the header (MAX_HEADER_SIZE in the reference reader). */
#define MAX_HEADER 100000000u

/* The file is read in the order it is checked: the header length against the file's size, the
 * header, the entries against the data's size, and only then the tensors, each into a buffer of
 * its checked size; nothing is allocated that the file does not hold. */
/* loom_tensor_file_read, the tensors' data too unless header_only. */
static loom_status read_file(const char *path, bool header_only, loom_tensor_file **out) {
    *out = NULL;
    int fd;
    int64_t size;
    loom_status s = loom__open_regular(path, &fd, &size);
    if (s)
        return s;
    unsigned char len8[8];
    uint64_t hlen = 0;
    if (size < 8)
        s = loom__error(LOOM_EFORMAT,
                        "%s: truncated: %lld bytes, a safetensors file starts with "
                        "an 8-byte header length",
                        path, (long long)size);
    else
        s = loom__read_at(fd, path, len8, 8, 0, "header length");
    for (int i = 0; !s && i < 8; i++)
        hlen |= (uint64_t)len8[i] << (8 * i);
    if (!s && hlen > (uint64_t)size - 8)
        s = loom__error(LOOM_EFORMAT,
                        "%s: truncated: header length %llu at byte 0 exceeds the "
                        "%lld bytes that follow",
                        path, (unsigned long long)hlen, (long long)size - 8);
    else if (!s && hlen > MAX_HEADER)
        s = loom__error(LOOM_EFORMAT, "%s: header length %llu at byte 0 is over %u bytes", path,
                        (unsigned long long)hlen, MAX_HEADER);
    char *hdr = s ? NULL : loom__malloc((size_t)hlen + 1);
    if (!s && !hdr)
        s = LOOM_ENOMEM;
    if (!s)
        s = loom__read_at(fd, path, hdr, (size_t)hlen, 8, "header");
    loom_tensor_file *f = s ? NULL : loom__calloc(1, sizeof *f);
    if (!s && !f)
        s = LOOM_ENOMEM;
    if (!s) {
        json j = {hdr, (size_t)hlen, 0, path, LOOM_OK};
        if (!parse_header(&j, f))
            s = j.err ? j.err : LOOM_EFORMAT;
    }
    if (!s)
        s = check_entries(path, f, (size_t)size - 8 - hlen);
    for (int64_t i = 0; f && !s && !header_only && i < f->n; i++) {
        entry *e = &f->e[i];
        if (!(e->data = loom__malloc(e->end - e->begin + 1)))
            s = LOOM_ENOMEM;
        else
            s = loom__read_at(fd, path, e->data, e->end - e->begin, 8 + hlen + e->begin, e->name);
    }
    close(fd);
    loom__free(hdr);
    if (!s && !header_only)
        s = check_crcs(path, f, 8 + hlen);
    for (int64_t i = 0; f && !s && !header_only && i < f->n; i++)
        s = widen(&f->e[i]);
    if (s)
        loom_tensor_file_free(f);
    else
        *out = f;
    return s;
}

loom_status loom_tensor_file_read(const char *path, loom_tensor_file **out) {
    return read_file(path, false, out);
}

loom_status loom_tensor_file_read_header(const char *path, loom_tensor_file **out) {
    return read_file(path, true, out);
}

void loom_tensor_file_free(loom_tensor_file *f) {
    if (!f)
        return;
    for (int64_t i = 0; i < f->n; i++)
        loom__free(f->e[i].data);
    loom__free(f->e);
    loom__meta_free(&f->meta);
    loom__free(f);
}

const char *loom_tensor_file_meta(const loom_tensor_file *f, const char *key) {
    return f && key ? loom__meta_get(&f->meta, key) : NULL;
}

int loom_tensor_file_count(const loom_tensor_file *f) {
    return (int)f->n;
}

const char *loom_tensor_file_name(const loom_tensor_file *f, int i) {
    return i >= 0 && i < f->n ? f->e[i].name : NULL;
}

static const entry *find(const loom_tensor_file *f, const char *name) {
    for (int64_t i = 0; i < f->n; i++)
        if (strcmp(f->e[i].name, name) == 0)
            return &f->e[i];
    return NULL;
}

const void *loom_tensor_file_get(const loom_tensor_file *f, const char *name, loom_dtype *dt,
                                 int *ndim, const int64_t **shape) {
    const entry *e = find(f, name);
    if (!e)
        return NULL;
    if (dt)
        *dt = e->dtype;
    if (ndim)
        *ndim = e->ndim;
    if (shape)
        *shape = e->shape;
    return e->data;
}

void loom__dims_str(int nd, const int64_t *s, char *buf, size_t size) {
    loom_tensor t = {.ndim = (uint8_t)nd};
    memcpy(t.shape, s, sizeof(int64_t) * (size_t)nd);
    loom__shape_str(&t, buf, size);
}

/* Whether f holds m's parameters (present, F32, their shapes), its tied names equal to their
 * parameters (or absent), and nothing else but tensors named with `other` in front (NULL: none).
 * ENOTFOUND/ESHAPE/EFORMAT naming the first tensor that does not match. */
loom_status loom__model_check_file(const loom_model *m, const loom_tensor_file *f, const char *path,
                                   const char *other) {
    loom_status s = LOOM_OK;
    for (int64_t i = 0; i < m->n && !s; i++) {
        const loom_param *p = m->params[i];
        const entry *e = find(f, p->name);
        char a[96], b[96];
        if (!e) {
            s = loom__error(LOOM_ENOTFOUND, "%s: tensor '%s' is missing (the model needs it)", path,
                            p->name);
        } else if (e->dtype != LOOM_F32 || e->ndim != p->ndim ||
                   memcmp(e->shape, p->shape, sizeof(int64_t) * (size_t)p->ndim) != 0) {
            loom__dims_str(e->ndim, e->shape, a, sizeof a);
            loom__dims_str(p->ndim, p->shape, b, sizeof b);
            s = loom__error(LOOM_ESHAPE, "%s: tensor '%s' is %s %s, the model expects f32 %s", path,
                            p->name, loom__dtype_name(e->dtype), a, b);
        }
    }
    for (int64_t i = 0; i < f->n && !s; i++) {
        int64_t t = 0;
        while (t < m->nties && strcmp(m->tie_name[t], f->e[i].name) != 0)
            t++;
        if (t < m->nties) { /* a tied name: the very values of its parameter */
            const loom_param *p = m->params[m->tie_of[t]];
            const entry *e = &f->e[i], *own = find(f, p->name);
            if (e->dtype != LOOM_F32 || e->ndim != p->ndim ||
                memcmp(e->shape, p->shape, sizeof(int64_t) * (size_t)p->ndim) != 0 ||
                memcmp(e->data, own->data, sizeof(float) * (size_t)p->numel) != 0)
                s = loom__error(LOOM_EFORMAT,
                                "%s: tensor '%s' differs from '%s', the parameter it is tied to",
                                path, e->name, p->name);
        } else if (!loom_model_find(m, f->e[i].name) &&
                   !(other && !strncmp(f->e[i].name, other, strlen(other)))) {
            s = loom__error(LOOM_EFORMAT, "%s: tensor '%s' is not a parameter of the model", path,
                            f->e[i].name);
        }
    }
    return s;
}

void loom__model_take_file(loom_model *m, loom_tensor_file *f) {
    for (int64_t i = 0; i < m->n; i++)
        memcpy(loom_param_data(m->params[i]), find(f, m->params[i]->name)->data,
               sizeof(float) * (size_t)m->params[i]->numel);
    loom_model_touch(m);
    loom__meta_free(&m->meta); /* the file's metadata, but for what every writer sets */
    m->meta = f->meta;
    memset(&f->meta, 0, sizeof f->meta);
    static const char *const writers[] = {"format",          "producer",  "loom.crc32c",
                                          "loom.checkpoint", "optimizer", "optimizer.step"};
    for (int k = 0; k < 6; k++)
        loom__meta_set(&m->meta, writers[k], NULL);
}

loom_status loom_model_load(loom_model *m, const char *path) {
    loom_tensor_file *f;
    loom_status s = loom_tensor_file_read(path, &f);
    if (s)
        return s;
    /* a checkpoint's weights (its optimizer's state beside them is not needed here) */
    const char *other = loom_tensor_file_meta(f, "loom.checkpoint") ? "optimizer." : NULL;
    s = loom__model_check_file(m, f, path, other);
    if (!s)
        loom__model_take_file(m, f);
    loom_tensor_file_free(f);
    return s;
}

/* ---- writing ----------------------------------------------------------------------------------
 */

/* s as a JSON string (quoted, escaped; UTF-8 passed through) at h + k; the new k. h has room:
 * 6 bytes a byte of s and 2 more. */
static size_t jwrite(char *h, size_t k, const char *s) {
    h[k++] = '"';
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        if (*c == '"' || *c == '\\')
            h[k++] = '\\', h[k++] = (char)*c;
        else if (*c < 0x20)
            k += (size_t)sprintf(h + k, "\\u%04x", *c);
        else
            h[k++] = (char)*c;
    }
    h[k++] = '"';
    return k;
}

/* The header of the n tensors, their data in this order, with the metadata and each tensor's
 * CRC-32C ("loom.crc32c": 8 hex digits a tensor, in data order, comma-separated). */
static loom_status build_header(const loom__st_tensor *t, int64_t n, const loom__meta *md,
                                const char *crcs, char **out, size_t *len) {
    size_t cap = 256 + strlen(crcs), k = 0;
    for (int64_t i = 0; i < n; i++)
        cap += 6 * strlen(t[i].name) + 64 + 24 * (size_t)t[i].ndim;
    for (int64_t i = 0; i < md->n; i++)
        cap += 6 * (strlen(md->key[i]) + strlen(md->val[i])) + 8;
    char *h = loom__malloc(cap);
    if (!h)
        return LOOM_ENOMEM;
    k += (size_t)snprintf(h + k, cap - k,
                          "{\"__metadata__\":{\"format\":\"pt\",\"producer\":\"loom %s\","
                          "\"loom.crc32c\":\"%s\"",
                          LOOM_VERSION, crcs);
    for (int64_t i = 0; i < md->n; i++) {
        h[k++] = ',';
        k = jwrite(h, k, md->key[i]);
        h[k++] = ':';
        k = jwrite(h, k, md->val[i]);
    }
    h[k++] = '}';
    uint64_t off = 0;
    for (int64_t i = 0; i < n; i++) {
        h[k++] = ',';
        k = jwrite(h, k, t[i].name);
        k += (size_t)snprintf(h + k, cap - k, ":{\"dtype\":\"F32\",\"shape\":[");
        for (int d = 0; d < t[i].ndim; d++)
            k += (size_t)snprintf(h + k, cap - k, "%s%lld", d ? "," : "", (long long)t[i].shape[d]);
        uint64_t end = off + 4 * (uint64_t)t[i].numel;
        k += (size_t)snprintf(h + k, cap - k, "],\"data_offsets\":[%llu,%llu]}",
                              (unsigned long long)off, (unsigned long long)end);
        off = end;
    }
    k += (size_t)snprintf(h + k, cap - k, "}");
    while (k % 8 != 0 && k + 1 < cap) /* pad with spaces so the data is 8-byte aligned */
        h[k++] = ' ';
    h[k] = 0;
    *out = h;
    *len = k;
    return LOOM_OK;
}

/* ERANGE naming the first element of the tensors that is NaN or infinite. */
static loom_status check_finite(const loom__st_tensor *t, int64_t n, const char *path) {
    for (int64_t i = 0; i < n; i++) {
        int64_t bad = 0, first = -1;
        for (int64_t k = 0; k < t[i].numel; k++)
            if (!isfinite(t[i].data[k]))
                bad++, first = first < 0 ? k : first;
        if (bad)
            return loom__error(LOOM_ERANGE,
                               "%s: not written: '%s' holds %lld NaN or infinite values of %lld "
                               "(the first at element %lld: %g); the training diverged",
                               path, t[i].name, (long long)bad, (long long)t[i].numel,
                               (long long)first, (double)t[i].data[first]);
    }
    return LOOM_OK;
}

loom_status loom__safetensors_write(const char *path, const loom__st_tensor *t, int64_t n,
                                    const loom__meta *md) {
    loom_status s = check_finite(t, n, path);
    char *crcs = s ? NULL : loom__malloc(9 * (size_t)n + 1);
    loom__part *parts = s ? NULL : loom__malloc(sizeof *parts * (size_t)(n + 2));
    if (!s && (!crcs || !parts))
        s = LOOM_ENOMEM;
    size_t k = 0;
    if (crcs)
        crcs[0] = 0;
    for (int64_t i = 0; !s && i < n; i++) /* x86-64, aarch64: little-endian as written */
        k += (size_t)snprintf(crcs + k, 10, "%s%08x", i ? "," : "",
                              loom__crc32c(0, t[i].data, sizeof(float) * (size_t)t[i].numel));
    char *h = NULL;
    size_t hlen = 0;
    if (!s)
        s = build_header(t, n, md, crcs, &h, &hlen);
    unsigned char len8[8];
    for (int i = 0; i < 8; i++)
        len8[i] = (unsigned char)((uint64_t)hlen >> (8 * i));
    if (!s) {
        parts[0] = (loom__part){len8, 8}, parts[1] = (loom__part){h, hlen};
        for (int64_t i = 0; i < n; i++)
            parts[2 + i] = (loom__part){t[i].data, sizeof(float) * (size_t)t[i].numel};
        s = loom__write_atomic(path, parts, (int)(n + 2));
    }
    loom__free(h), loom__free(crcs), loom__free(parts);
    return s;
}

/* The model's tensors as written: the parameters, then the tied names (+ room for `more`). */
loom__st_tensor *loom__model_tensors(const loom_model *m, int64_t more, int64_t *n) {
    loom__st_tensor *t = loom__malloc(sizeof *t * (size_t)(m->n + m->nties + more + 1));
    *n = m->n + m->nties;
    for (int64_t i = 0; t && i < *n; i++) {
        const loom_param *p = m->params[i < m->n ? i : m->tie_of[i - m->n]];
        t[i] = (loom__st_tensor){i < m->n ? p->name : m->tie_name[i - m->n], p->ndim, p->shape,
                                 m->slab[LOOM_SLAB_PARAM] + p->offset, p->numel};
    }
    return t;
}

loom_status loom_model_save(const loom_model *m, const char *path) {
    loom__model_settle(m); /* a step running on m ends first */
    int64_t n;
    loom__st_tensor *t = loom__model_tensors(m, 0, &n);
    loom_status s = t ? loom__safetensors_write(path, t, n, &m->meta) : LOOM_ENOMEM;
    loom__free(t);
    return s;
}
