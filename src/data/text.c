/*
 * text.c - a character-level text dataset, as nanoGPT's shakespeare_char prepares it: the
 * vocabulary is the sorted distinct characters (Unicode code points) of a UTF-8 file, plain or
 * gzip'd; the first 90% of the characters train, the last 10% validate. A training step's batch
 * is `batch` windows of context + 1 tokens (inputs, and the next tokens as targets) at offsets
 * drawn from Philox stream (3, step) of the seed, or in file order; validation windows do not
 * overlap, so that every validation token is counted once.
 *
 * Loading costs the file's bytes and one byte a character (two past 256 distinct characters,
 * four past 65536): the vocabulary comes from one pass marking a bitmap over the code points up
 * to the largest (no sort), the tokens from another. A gzip'd file is inflated here, member by
 * member, so that a stream cut short or followed by other bytes is an error naming the byte, never
 * half the text.
 */
#include "internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

struct loom_text {
    void *tokens; /* the whole file, tsize bytes a token: the least that holds the vocabulary */
    int tsize;
    int64_t n, ntrain;
    int32_t *chars; /* token -> code point, sorted */
    int64_t vocab;
    const loom_tokenizer *tok; /* a tokenized text's (loom_text_load_tokenized): no chars */
};

/* The whole of a plain file, its size checked against the limit before anything is read. */
static loom_status read_plain(int fd, const char *path, int64_t size, unsigned char **out) {
    if (size > LOOM_TEXT_MAX_BYTES)
        return loom__error(LOOM_ERANGE, "%s: %lld bytes, expected at most %lld (1 GiB) of text",
                           path, (long long)size, (long long)LOOM_TEXT_MAX_BYTES);
    unsigned char *buf = loom__malloc((size_t)size + 1);
    if (!buf)
        return loom__error(LOOM_ENOMEM, "%s: out of memory for %lld bytes", path, (long long)size);
    loom_status s = size ? loom__read_at(fd, path, buf, (size_t)size, 0, "the text") : LOOM_OK;
    if (s)
        loom__free(buf);
    else
        *out = buf;
    return s;
}

/* The decompressed bytes of a gzip file (one member or several, concatenated), at most
 * LOOM_TEXT_MAX_BYTES: a stream that ends early, is corrupt, or is followed by bytes that are not
 * another member is EFORMAT naming the compressed byte where it went wrong. */
static loom_status read_gzip(int fd, const char *path, int64_t size, unsigned char **out,
                             int64_t *n) {
    enum { CHUNK = 1 << 16 };
    unsigned char *in = loom__malloc(CHUNK), *buf = NULL;
    int64_t cap = 0, len = 0, at = 0; /* at: compressed bytes read */
    z_stream z;
    memset(&z, 0, sizeof z);
    loom_status s = in && inflateInit2(&z, 16 + MAX_WBITS) == Z_OK ? LOOM_OK : LOOM_ENOMEM;
    int zr = Z_OK;
    bool member_ended = false;
    while (!s) {
        if (z.avail_in == 0 && at < size) {
            size_t want = size - at < CHUNK ? (size_t)(size - at) : CHUNK;
            if ((s = loom__read_at(fd, path, in, want, (uint64_t)at, "the gzip stream")))
                break;
            z.next_in = in, z.avail_in = (uInt)want, at += (int64_t)want;
        }
        int64_t consumed = at - z.avail_in;
        if (member_ended) { /* what follows a member: the end, or another member */
            if (z.avail_in == 0)
                break;
            if (z.next_in[0] != 0x1f) { /* (a bad second byte: inflate finds the header bad) */
                s = loom__error(LOOM_EFORMAT,
                                "%s: trailing data at byte %lld after the gzip stream, expected "
                                "the file to end there",
                                path, (long long)consumed);
                break;
            }
            inflateReset(&z), member_ended = false;
        }
        if (len + CHUNK + 1 > cap && loom__grow((void **)&buf, &cap, len + CHUNK + 1, 1)) {
            s = loom__error(LOOM_ENOMEM, "%s: out of memory at %lld bytes of text", path,
                            (long long)len);
            break;
        }
        z.next_out = buf + len, z.avail_out = CHUNK;
        zr = inflate(&z, Z_NO_FLUSH);
        len += CHUNK - (int64_t)z.avail_out;
        if (len > LOOM_TEXT_MAX_BYTES)
            s = loom__error(LOOM_ERANGE,
                            "%s: more than %lld bytes (1 GiB) of text once "
                            "decompressed",
                            path, (long long)LOOM_TEXT_MAX_BYTES);
        else if (zr == Z_STREAM_END)
            member_ended = true;
        else if (zr == Z_BUF_ERROR && z.avail_in == 0 && at == size)
            s = loom__error(LOOM_EFORMAT,
                            "%s: the gzip stream ends early at byte %lld (the file's end), after "
                            "%lld bytes of text: truncated",
                            path, (long long)size, (long long)len);
        else if (zr != Z_OK && zr != Z_BUF_ERROR)
            s = loom__error(LOOM_EFORMAT, "%s: corrupt gzip stream near byte %lld: %s", path,
                            (long long)(at - z.avail_in), z.msg ? z.msg : "inflate failed");
    }
    inflateEnd(&z);
    loom__free(in);
    if (s) {
        loom__free(buf);
        return s;
    }
    if (!buf && !(buf = loom__malloc(1)))
        return LOOM_ENOMEM;
    *out = buf, *n = len;
    return LOOM_OK;
}

/* The file's bytes (gzip'd or plain), NUL-terminated; *n the count. */
static loom_status read_all(const char *path, unsigned char **out, int64_t *n) {
    int fd;
    int64_t size;
    loom_status s = loom__open_regular(path, &fd, &size);
    if (s)
        return s;
    unsigned char magic[2] = {0, 0};
    if (size >= 2)
        s = loom__read_at(fd, path, magic, 2, 0, "the first bytes");
    bool gz = !s && magic[0] == 0x1f && magic[1] == 0x8b;
    if (!s)
        s = gz ? read_gzip(fd, path, size, out, n) : read_plain(fd, path, size, out);
    if (!s && !gz)
        *n = size;
    close(fd);
    if (!s)
        (*out)[*n] = 0;
    return s;
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

/* The token of code point c, or -1. */
static int32_t token_of(const loom_text *t, int32_t c) {
    int64_t lo = 0, hi = t->vocab;
    while (lo < hi) {
        int64_t mid = (lo + hi) / 2;
        if (t->chars[mid] < c)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < t->vocab && t->chars[lo] == c ? (int32_t)lo : -1;
}

static int32_t token_at(const loom_text *t, int64_t i) {
    return t->tsize == 1   ? ((const uint8_t *)t->tokens)[i]
           : t->tsize == 2 ? ((const uint16_t *)t->tokens)[i]
                           : ((const int32_t *)t->tokens)[i];
}

/* The code point at b[i] and its length: ASCII at once, else utf8_next (-1: not UTF-8). */
static int32_t char_at(const unsigned char *b, int64_t i, int64_t nb, int *len) {
    if (b[i] < 0x80)
        return *len = 1, b[i];
    return utf8_next(b + i, nb - i, len);
}

/* The first pass over the bytes: checks that they are UTF-8; the characters into *n, the
 * largest code point into *top. */
static loom_status scan(const char *path, const unsigned char *b, int64_t nb, int64_t *n,
                        int32_t *top) {
    int64_t k = 0;
    int32_t hi = 0;
    for (int64_t i = 0; i < nb; k++) {
        int len;
        int32_t c = char_at(b, i, nb, &len);
        if (c < 0)
            return loom__error(LOOM_EFORMAT, "%s: byte %lld (0x%02x) is not UTF-8 text", path,
                               (long long)i, b[i]);
        hi = c > hi ? c : hi;
        i += len;
    }
    *n = k, *top = hi;
    return LOOM_OK;
}

/* The vocabulary and the tokens: a second pass marks the code points seen in a bitmap up to the
 * largest (the vocabulary is the marks, sorted by construction), a third writes each character's
 * token (the marks below it), t->tsize bytes each. */
static loom_status tokenize(loom_text *t, const unsigned char *b, int64_t nb, int32_t top) {
    int64_t words = top / 64 + 1, v = 0;
    uint64_t *seen = loom__calloc((size_t)words, sizeof *seen);
    int32_t *base = loom__malloc(sizeof(int32_t) * (size_t)words); /* tokens before word w */
    if (!seen || !base) {
        loom__free(seen), loom__free(base);
        return LOOM_ENOMEM;
    }
    for (int64_t i = 0; i < nb;) {
        int len;
        int32_t c = char_at(b, i, nb, &len);
        seen[c >> 6] |= 1ull << (c & 63);
        i += len;
    }
    for (int64_t w = 0; w < words; w++)
        v += __builtin_popcountll(seen[w]);
    t->vocab = v;
    t->tsize = v <= 256 ? 1 : v <= 65536 ? 2 : 4;
    t->chars = loom__malloc(sizeof(int32_t) * (size_t)(v ? v : 1));
    t->tokens = loom__malloc((size_t)t->tsize * (size_t)(t->n ? t->n : 1));
    if (!t->chars || !t->tokens) {
        loom__free(seen), loom__free(base);
        return LOOM_ENOMEM;
    }
    int32_t k = 0;
    for (int64_t w = 0; w < words; w++) {
        base[w] = k;
        for (uint64_t m = seen[w]; m; m &= m - 1)
            t->chars[k++] = (int32_t)(w * 64 + __builtin_ctzll(m));
    }
    for (int64_t i = 0, j = 0; i < nb; j++) {
        int len;
        int32_t c = char_at(b, i, nb, &len);
        int32_t tok = base[c >> 6] + __builtin_popcountll(seen[c >> 6] & ((1ull << (c & 63)) - 1));
        if (t->tsize == 1)
            ((uint8_t *)t->tokens)[j] = (uint8_t)tok;
        else if (t->tsize == 2)
            ((uint16_t *)t->tokens)[j] = (uint16_t)tok;
        else
            ((int32_t *)t->tokens)[j] = tok;
        i += len;
    }
    loom__free(seen), loom__free(base);
    return LOOM_OK;
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
    int32_t top = 0;
    s = t ? scan(path, bytes, nb, &t->n, &top) : LOOM_ENOMEM;
    if (!s && t->n == 0)
        s = loom__error(LOOM_EFORMAT, "%s: empty: expected text to train on", path);
    if (!s && (s = tokenize(t, bytes, nb, top)))
        loom__error(s, "%s: out of memory for %lld tokens", path, (long long)t->n);
    if (!s && t->vocab < 2)
        s = loom__error(LOOM_EFORMAT,
                        "%s: one distinct character in %lld: expected at least two to predict "
                        "between",
                        path, (long long)t->n);
    if (s == LOOM_ENOMEM && !t)
        loom__error(s, "%s: out of memory", path);
    loom__free(bytes);
    if (s) {
        loom_text_free(t);
        return s;
    }
    t->ntrain = (int64_t)((double)t->n * 0.9); /* nanoGPT's int(n * 0.9) */
    *out = t;
    return LOOM_OK;
}
/* ---- a text cut by a tokenizer ---------------------------------------------------------------
 * The cached tokens: "LOOMTOK1", their count (8 bytes, little-endian), the tokens (int32), and
 * the CRC-32C of the tokens (4 bytes). */

static const char tok_magic[8] = "LOOMTOK1";

static bool read_cached_tokens(const char *cached, loom_text *t) {
    int fd;
    int64_t size;
    if (loom__open_regular(cached, &fd, &size))
        return false;
    unsigned char hdr[16];
    uint64_t n = 0;
    bool ok = size >= 20 && !loom__read_at(fd, cached, hdr, 16, 0, "the header") &&
              !memcmp(hdr, tok_magic, 8);
    for (int b = 0; ok && b < 8; b++)
        n |= (uint64_t)hdr[8 + b] << (8 * b);
    ok = ok && n > 0 && (uint64_t)size == 20 + 4 * n;
    int32_t *tok = ok ? loom__malloc(4 * (size_t)n) : NULL;
    uint32_t crc = 0;
    ok = tok && !loom__read_at(fd, cached, tok, 4 * (size_t)n, 16, "the tokens") &&
         !loom__read_at(fd, cached, &crc, 4, 16 + 4 * n, "the checksum") &&
         loom__crc32c(0, tok, 4 * (size_t)n) == crc;
    for (uint64_t i = 0; ok && i < n; i++)
        ok = tok[i] >= 0 && tok[i] < t->vocab;
    close(fd);
    if (!ok) {
        loom__free(tok);
        return false;
    }
    t->tokens = tok, t->n = (int64_t)n;
    return true;
}

/* The tokens into the cache (temporary file, rename); a failure costs the next start only. */
static void cache_tokens(const char *cached, const loom_text *t) {
    char tmp[4300];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", cached, (long)getpid());
    loom__remove_stale_temps(cached);
    FILE *f = fopen(tmp, "wb");
    if (!f)
        return;
    unsigned char hdr[16];
    memcpy(hdr, tok_magic, 8);
    for (int b = 0; b < 8; b++)
        hdr[8 + b] = (unsigned char)((uint64_t)t->n >> (8 * b));
    uint32_t crc = loom__crc32c(0, t->tokens, 4 * (size_t)t->n);
    bool ok = fwrite(hdr, 1, 16, f) == 16 &&
              fwrite(t->tokens, 4, (size_t)t->n, f) == (size_t)t->n && fwrite(&crc, 4, 1, f) == 1;
    ok = (fclose(f) == 0) && ok;
    if (!ok || rename(tmp, cached) != 0)
        unlink(tmp);
}

loom_status loom_text_load_tokenized(const char *path, const loom_tokenizer *tok, loom_text **out) {
    *out = NULL;
    if (!path || !tok)
        return loom__error(LOOM_EINVAL,
                           "loom_text_load_tokenized: expected a path and a tokenizer");
    loom_text *t = loom__calloc(1, sizeof *t);
    if (!t)
        return loom__error(LOOM_ENOMEM, "%s: out of memory", path);
    t->tok = tok, t->vocab = loom_tokenizer_vocab(tok), t->tsize = 4;
    char cached[4200];
    bool cacheable =
        loom__data_cache_path(path, loom__tokenizer_hash(tok), "tokens", 0, cached, sizeof cached);
    loom_status s = LOOM_OK;
    if (!cacheable || !read_cached_tokens(cached, t)) {
        unsigned char *bytes = NULL;
        int64_t nb = 0;
        s = read_all(path, &bytes, &nb);
        if (!s)
            s = loom_tokenizer_encode(tok, (const char *)bytes, nb, false, (int32_t **)&t->tokens,
                                      &t->n);
        loom__free(bytes);
        if (!s && t->n < 2)
            s = loom__error(LOOM_EFORMAT, "%s: %lld tokens: expected text to train on", path,
                            (long long)t->n);
        if (!s && cacheable)
            cache_tokens(cached, t);
    }
    if (s) {
        loom_text_free(t);
        return s;
    }
    t->ntrain = (int64_t)((double)t->n * 0.9);
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

int64_t loom_text_count(const loom_text *t, bool val) {
    return val ? t->n - t->ntrain : t->ntrain;
}

/* Tokens [at, at + n) of the whole text as int32. */
static void copy_tokens(const loom_text *t, int64_t at, int64_t n, int32_t *out) {
    if (t->tsize == 4)
        memcpy(out, (const int32_t *)t->tokens + at, sizeof(int32_t) * (size_t)n);
    else
        for (int64_t i = 0; i < n; i++)
            out[i] = token_at(t, at + i);
}

loom_status loom_text_tokens(const loom_text *t, bool val, int64_t at, int64_t n, int32_t *out) {
    int64_t count = loom_text_count(t, val);
    if (at < 0 || n < 0 || at > count || n > count - at)
        return loom__error(LOOM_EINVAL, "loom_text_tokens: tokens %lld to %lld of a split of %lld",
                           (long long)at, (long long)at + n, (long long)count);
    copy_tokens(t, (val ? t->ntrain : 0) + at, n, out);
    return LOOM_OK;
}

loom_status loom_text_encode(const loom_text *t, const char *s, int32_t *tokens, int64_t *n) {
    int64_t len = (int64_t)strlen(s), k = 0;
    if (t->tok) { /* (at most a token a byte) */
        int32_t *ids;
        loom_status st = loom_tokenizer_encode(t->tok, s, len, true, &ids, &k);
        if (!st)
            memcpy(tokens, ids, sizeof(int32_t) * (size_t)k), *n = k;
        loom_tokenizer_ids_free(ids);
        return st;
    }
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

size_t loom_text_decode(const loom_text *t, const int32_t *tokens, int64_t n, char *buf,
                        size_t size) {
    size_t k = 0;
    if (t->tok) {
        k = loom_tokenizer_decode(t->tok, tokens, n, buf, size);
        return k < size ? k : size ? size - 1 : 0;
    }
    for (int64_t i = 0; i < n; i++) {
        char b[4];
        int l = tokens[i] >= 0 && tokens[i] < t->vocab ? loom__utf8_put(t->chars[tokens[i]], b) : 0;
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
        copy_tokens(t, at, context, x + r * context);
        copy_tokens(t, at + 1, context, y + r * context);
    }
    return LOOM_OK;
}
