/*
 * text.c - a character-level text dataset, as nanoGPT's shakespeare_char prepares it: the
 * vocabulary is the sorted distinct characters (Unicode code points) of a UTF-8 file, plain or
 * gzip'd; the first 90% of the characters train, the last 10% validate. A training step's batch
 * is `batch` windows of context + 1 tokens (inputs, and the next tokens as targets) at offsets
 * drawn from Philox stream (3, step) of the seed, or in file order; validation windows do not
 * overlap, so that every validation token is counted once.
 */
#include "internal.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#define MAX_TEXT_BYTES ((int64_t)1 << 31)

struct loom_text {
    int32_t *tokens; /* the whole file */
    int64_t n, ntrain;
    int32_t *chars; /* token -> code point, sorted */
    int64_t vocab;
};

/* The file's bytes (gzip'd or plain), NUL-terminated; *n the count. */
static loom_status read_all(const char *path, unsigned char **out, int64_t *n) {
    int64_t fsize;
    gzFile f;
    loom_status s = loom__gz_open(path, &f, &fsize);
    if (s)
        return s;
    unsigned char *buf = NULL;
    int64_t cap = 0, len = 0;
    for (;;) {
        if (len + 65536 + 1 > cap) {
            if (loom__grow((void **)&buf, &cap, len + 65536 + 1, 1)) {
                s = LOOM_ENOMEM;
                break;
            }
        }
        int r = gzread(f, buf + len, 65536);
        if (r < 0) {
            int errnum;
            s = loom__error(LOOM_EIO, "%s: read failed at byte %lld: %s", path, (long long)len,
                            gzerror(f, &errnum));
            break;
        }
        if (r == 0)
            break;
        len += r;
        if (len > MAX_TEXT_BYTES) {
            s = loom__error(LOOM_ERANGE, "%s: more than 2 GiB of text", path);
            break;
        }
    }
    gzclose(f);
    if (s) {
        loom__free(buf);
        return s;
    }
    buf[len] = 0;
    *out = buf, *n = len;
    return LOOM_OK;
}

/* The code point at s (UTF-8), its length in *len; -1 if the bytes are not UTF-8. */
static int32_t utf8_next(const unsigned char *s, int64_t left, int *len) {
    unsigned c = s[0];
    int n = c < 0x80             ? 1
            : (c & 0xE0) == 0xC0 ? 2
            : (c & 0xF0) == 0xE0 ? 3
            : (c & 0xF8) == 0xF0 ? 4
                                 : 0;
    if (n == 0 || n > left)
        return -1;
    int32_t v = n == 1 ? (int32_t)c : (int32_t)(c & (0x7F >> n));
    for (int i = 1; i < n; i++) {
        if ((s[i] & 0xC0) != 0x80)
            return -1;
        v = v << 6 | (s[i] & 0x3F);
    }
    static const int32_t least[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (v < least[n] || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF))
        return -1;
    *len = n;
    return v;
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* The token of code point c, or -1. */
static int32_t token_of(const loom_text *t, int32_t c) {
    const int32_t *p = bsearch(&c, t->chars, (size_t)t->vocab, sizeof c, cmp_i32);
    return p ? (int32_t)(p - t->chars) : -1;
}

loom_status loom_text_load(const char *path, loom_text **out) {
    *out = NULL;
    unsigned char *bytes = NULL;
    int64_t nb = 0;
    loom_status s =
        path ? read_all(path, &bytes, &nb) : loom__error(LOOM_EINVAL, "loom_text_load: NULL path");
    if (s)
        return s;
    loom_text *t = loom__calloc(1, sizeof *t);
    int32_t *cp = loom__malloc(sizeof(int32_t) * (size_t)(nb + 1));
    int64_t n = 0;
    for (int64_t i = 0; t && cp && i < nb && !s;) {
        int len;
        int32_t c = utf8_next(bytes + i, nb - i, &len);
        if (c < 0)
            s = loom__error(LOOM_EFORMAT, "%s: byte %lld (0x%02x) is not UTF-8 text", path,
                            (long long)i, bytes[i]);
        else
            cp[n++] = c, i += len;
    }
    loom__free(bytes);
    if (!s && (!t || !cp))
        s = LOOM_ENOMEM;
    int32_t *sorted = s ? NULL : loom__malloc(sizeof(int32_t) * (size_t)(n + 1));
    if (!s && !sorted)
        s = LOOM_ENOMEM;
    if (!s) {
        memcpy(sorted, cp, sizeof(int32_t) * (size_t)n);
        qsort(sorted, (size_t)n, sizeof *sorted, cmp_i32);
        int64_t v = 0;
        for (int64_t i = 0; i < n; i++)
            if (i == 0 || sorted[i] != sorted[v - 1])
                sorted[v++] = sorted[i];
        t->chars = sorted, t->vocab = v;
        if (n == 0)
            s = loom__error(LOOM_EFORMAT, "%s: empty: expected text to train on", path);
        else if (v < 2)
            s = loom__error(LOOM_EFORMAT,
                            "%s: one distinct character in %lld: expected at least two to "
                            "predict between",
                            path, (long long)n);
    }
    for (int64_t i = 0; !s && i < n; i++)
        cp[i] = token_of(t, cp[i]);
    if (s) {
        loom__free(cp);
        loom_text_free(t);
        return s;
    }
    t->tokens = cp, t->n = n, t->ntrain = (int64_t)((double)n * 0.9); /* nanoGPT's int(n * 0.9) */
    *out = t;
    return LOOM_OK;
}

void loom_text_free(loom_text *t) {
    if (!t)
        return;
    loom__free(t->tokens);
    loom__free(t->chars);
    loom__free(t);
}

int64_t loom_text_vocab(const loom_text *t) {
    return t->vocab;
}

const int32_t *loom_text_split(const loom_text *t, bool val, int64_t *n) {
    *n = val ? t->n - t->ntrain : t->ntrain;
    return val ? t->tokens + t->ntrain : t->tokens;
}

loom_status loom_text_encode(const loom_text *t, const char *s, int32_t *tokens, int64_t *n) {
    int64_t len = (int64_t)strlen(s), k = 0;
    for (int64_t i = 0; i < len;) {
        int l;
        int32_t c = utf8_next((const unsigned char *)s + i, len - i, &l), tok = -1;
        if (c < 0)
            return loom__error(LOOM_EFORMAT, "byte %lld of the text is not UTF-8", (long long)i);
        if ((tok = token_of(t, c)) < 0)
            return loom__error(LOOM_EINVAL,
                               "character %lld of the text (U+%04X '%.*s') is not in the "
                               "vocabulary of %lld characters",
                               (long long)k, (unsigned)c, l, s + i, (long long)t->vocab);
        tokens[k++] = tok, i += l;
    }
    *n = k;
    return LOOM_OK;
}

/* The UTF-8 of code point c into b (4 bytes at most); its length. */
static int utf8_put(int32_t c, char *b) {
    if (c < 0x80)
        return b[0] = (char)c, 1;
    if (c < 0x800)
        return b[0] = (char)(0xC0 | c >> 6), b[1] = (char)(0x80 | (c & 0x3F)), 2;
    if (c < 0x10000)
        return b[0] = (char)(0xE0 | c >> 12), b[1] = (char)(0x80 | (c >> 6 & 0x3F)),
               b[2] = (char)(0x80 | (c & 0x3F)), 3;
    return b[0] = (char)(0xF0 | c >> 18), b[1] = (char)(0x80 | (c >> 12 & 0x3F)),
           b[2] = (char)(0x80 | (c >> 6 & 0x3F)), b[3] = (char)(0x80 | (c & 0x3F)), 4;
}

size_t loom_text_decode(const loom_text *t, const int32_t *tokens, int64_t n, char *buf,
                        size_t size) {
    size_t k = 0;
    for (int64_t i = 0; i < n; i++) {
        char b[4];
        int l = tokens[i] >= 0 && tokens[i] < t->vocab ? utf8_put(t->chars[tokens[i]], b) : 0;
        if (k + (size_t)l + 1 > size)
            break;
        memcpy(buf + k, b, (size_t)l);
        k += (size_t)l;
    }
    if (size)
        buf[k] = 0;
    return k;
}

loom_status loom_text_batch(const loom_text *t, int64_t step, int64_t batch, int64_t context,
                            uint64_t seed, bool shuffle, int32_t *x, int32_t *y) {
    int64_t span = t->ntrain - context; /* windows start in [0, span) */
    if (context < 1 || batch < 1 || span < 1)
        return loom__error(LOOM_EINVAL,
                           "text batch: context %lld with %lld training tokens: expected a "
                           "context shorter than the training split",
                           (long long)context, (long long)t->ntrain);
    for (int64_t r = 0; r < batch; r++) {
        int64_t at;
        if (shuffle) {
            uint32_t w[4];
            loom_philox(seed, (3ull << 32) | (uint64_t)step, (uint64_t)r, w);
            at = (int64_t)((((uint64_t)w[0] << 32) | w[1]) % (uint64_t)span);
        } else {
            at = ((step * batch + r) * context) % span;
        }
        memcpy(x + r * context, t->tokens + at, sizeof(int32_t) * (size_t)context);
        memcpy(y + r * context, t->tokens + at + 1, sizeof(int32_t) * (size_t)context);
    }
    return LOOM_OK;
}
