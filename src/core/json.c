/*
 * json.c - a whole JSON document read into a tree (RFC 8259): the files of a Hugging Face model
 * folder (config.json, tokenizer.json, model.safetensors.index.json). Nodes live in one array and
 * point at their first child and next sibling by index; strings are unescaped into one copy of
 * the text (an unescaped string is never longer than its source), so a document costs its bytes
 * and 48 bytes a value. Numbers keep their source text beside their value, so that a document
 * written back (loom__json_write) says exactly what it said. Nesting deeper than 256 is refused
 * (no recursion without a bound). Errors name the file, the byte and what was expected there.
 */
#include "internal.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { MAX_DEPTH = 256 };

typedef struct {
    const char *src; /* the text */
    char *out;       /* its copy: strings unescaped in place */
    size_t n, i;
    const char *path;
    loom__json *doc;
    loom_status err;
} reader;

static bool fail(reader *r, const char *what) {
    if (!r->err) {
        char found[16];
        unsigned char c = r->i < r->n ? (unsigned char)r->src[r->i] : 0;
        if (r->i >= r->n)
            snprintf(found, sizeof found, "the end");
        else if (c >= 0x20 && c < 0x7f)
            snprintf(found, sizeof found, "'%c'", c);
        else
            snprintf(found, sizeof found, "byte 0x%02x", c);
        r->err = loom__error(LOOM_EFORMAT, "%s: malformed JSON at byte %zu: expected %s, found %s",
                             r->path, r->i, what, found);
    }
    return false;
}

static void skip_ws(reader *r) {
    while (r->i < r->n && (r->src[r->i] == ' ' || r->src[r->i] == '\t' || r->src[r->i] == '\n' ||
                           r->src[r->i] == '\r'))
        r->i++;
}

/* A new node of kind k; its index, -1 when out of memory. */
static int64_t node(reader *r, loom__jkind k) {
    loom__json *d = r->doc;
    if (loom__grow((void **)&d->v, &d->cap, d->n + 1, sizeof *d->v)) {
        r->err = LOOM_ENOMEM;
        return -1;
    }
    d->v[d->n] = (loom__jnode){.kind = k, .child = -1, .next = -1};
    return d->n++;
}

static int hex(char c) {
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
}

/* \uXXXX at r->i (past the "\u") into *u. */
static bool u4(reader *r, unsigned *u) {
    *u = 0;
    for (int k = 0; k < 4; k++, r->i++) {
        int x = r->i < r->n ? hex(r->src[r->i]) : -1;
        if (x < 0)
            return fail(r, "four hex digits after \\u");
        *u = *u << 4 | (unsigned)x;
    }
    return true;
}

/* The string at r->i (its opening quote), unescaped into r->out at the same offset: *s, *len. */
static bool string(reader *r, const char **s, int64_t *len) {
    if (r->i >= r->n || r->src[r->i] != '"')
        return fail(r, "'\"'");
    char *to = r->out + ++r->i, *start = to;
    for (;;) {
        if (r->i >= r->n)
            return fail(r, "'\"' closing the string");
        unsigned char c = (unsigned char)r->src[r->i];
        if (c == '"')
            break;
        if (c < 0x20)
            return fail(r, "no control character inside a string");
        if (c != '\\') {
            *to++ = (char)c, r->i++;
            continue;
        }
        r->i++;
        char e = r->i < r->n ? r->src[r->i] : 0;
        const char *at = e ? strchr("\"\\/bfnrt", e) : NULL;
        if (at) {
            *to++ = "\"\\/\b\f\n\r\t"[at - "\"\\/bfnrt"], r -> i++;
            continue;
        }
        unsigned u, lo;
        if (e != 'u')
            return fail(r, "an escape (\\\" \\\\ \\/ \\b \\f \\n \\r \\t \\u)");
        r->i++;
        if (!u4(r, &u))
            return false;
        if (u >= 0xD800 && u < 0xDC00) {
            if (r->i + 2 > r->n || r->src[r->i] != '\\' || r->src[r->i + 1] != 'u')
                return fail(r, "the low half of a surrogate pair");
            r->i += 2;
            if (!u4(r, &lo))
                return false;
            if (lo < 0xDC00 || lo > 0xDFFF)
                return fail(r, "the low half of a surrogate pair");
            u = 0x10000 + ((u - 0xD800) << 10) + (lo - 0xDC00);
        } else if (u >= 0xDC00 && u <= 0xDFFF) {
            return fail(r, "no lone low surrogate");
        }
        to += loom__utf8_put((int32_t)u, to); /* (6 source bytes, at most 4 written) */
    }
    r->i++;
    *to = 0; /* (the closing quote's place) */
    *s = start, *len = to - start;
    return true;
}

static bool value(reader *r, int depth);

/* An array or object's members after its opening bracket, children of node `at`. */
static bool members(reader *r, int64_t at, bool object, int depth) {
    char close = object ? '}' : ']';
    int64_t last = -1;
    skip_ws(r);
    if (r->i < r->n && r->src[r->i] == close)
        return r->i++, true;
    for (;;) {
        const char *key = NULL;
        int64_t klen = 0;
        skip_ws(r);
        if (object) {
            if (!string(r, &key, &klen))
                return false;
            skip_ws(r);
            if (r->i >= r->n || r->src[r->i] != ':')
                return fail(r, "':' after the key");
            r->i++;
        }
        int64_t child = r->doc->n;
        if (!value(r, depth + 1))
            return false;
        loom__jnode *v = r->doc->v;
        v[child].key = key, v[child].klen = klen;
        if (last < 0)
            v[at].child = child;
        else
            v[last].next = child;
        last = child, v[at].count++;
        skip_ws(r);
        char c = r->i < r->n ? r->src[r->i] : 0;
        if (c == close)
            return r->i++, true;
        if (c != ',')
            return fail(r, object ? "',' or '}'" : "',' or ']'");
        r->i++;
    }
}

static bool number(reader *r, int64_t k) {
    size_t b = r->i;
    const char *s = r->src;
#define DIGITS(at) ((at) < r->n && s[at] >= '0' && s[at] <= '9')
    if (r->i < r->n && s[r->i] == '-')
        r->i++;
    if (!DIGITS(r->i))
        return fail(r, "a value");
    if (s[r->i] == '0')
        r->i++;
    else
        while (DIGITS(r->i))
            r->i++;
    if (r->i < r->n && s[r->i] == '.') {
        r->i++;
        if (!DIGITS(r->i))
            return fail(r, "a digit after '.'");
        while (DIGITS(r->i))
            r->i++;
    }
    if (r->i < r->n && (s[r->i] == 'e' || s[r->i] == 'E')) {
        r->i++;
        if (r->i < r->n && (s[r->i] == '+' || s[r->i] == '-'))
            r->i++;
        if (!DIGITS(r->i))
            return fail(r, "a digit in the exponent");
        while (DIGITS(r->i))
            r->i++;
    }
#undef DIGITS
    /* (strtod reads the copy, where the number is followed by what follows it in the text) */
    char save = r->out[r->i];
    r->out[r->i] = 0;
    loom__jnode *v = &r->doc->v[k];
    v->num = strtod(r->out + b, NULL);
    v->s = r->out + b, v->len = (int64_t)(r->i - b);
    r->out[r->i] = save;
    return true;
}

static bool value(reader *r, int depth) {
    skip_ws(r);
    if (depth > MAX_DEPTH)
        return fail(r, "nesting at most 256 deep");
    char c = r->i < r->n ? r->src[r->i] : 0;
    static const struct {
        const char *word;
        loom__jkind kind;
        bool b;
    } words[] = {
        {"true", LOOM__JBOOL, true}, {"false", LOOM__JBOOL, false}, {"null", LOOM__JNULL, 0}};
    for (size_t w = 0; w < 3; w++) {
        size_t len = strlen(words[w].word);
        if (c == words[w].word[0]) {
            if (r->n - r->i < len || memcmp(r->src + r->i, words[w].word, len) != 0)
                return fail(r, words[w].word);
            int64_t k = node(r, words[w].kind);
            if (k < 0)
                return false;
            r->doc->v[k].b = words[w].b, r->i += len;
            return true;
        }
    }
    int64_t k = node(r, c == '"'   ? LOOM__JSTR
                        : c == '[' ? LOOM__JARR
                        : c == '{' ? LOOM__JOBJ
                                   : LOOM__JNUM);
    if (k < 0)
        return false;
    if (c == '"') {
        const char *s;
        int64_t len;
        if (!string(r, &s, &len))
            return false;
        r->doc->v[k].s = s, r->doc->v[k].len = len;
        return true;
    }
    if (c == '[' || c == '{')
        return r->i++, members(r, k, c == '{', depth);
    return number(r, k);
}

loom_status loom__json_parse(const char *text, size_t n, const char *path, loom__json *out) {
    memset(out, 0, sizeof *out);
    reader r = {.src = text, .n = n, .path = path, .doc = out};
    if (!(out->text = r.out = loom__malloc(n + 1)))
        return loom__error(LOOM_ENOMEM, "%s: out of memory for %zu bytes of JSON", path, n);
    memcpy(r.out, text, n);
    r.out[n] = 0;
    out->size = n;
    bool ok = value(&r, 0);
    if (ok) {
        skip_ws(&r);
        if (r.i < r.n)
            ok = fail(&r, "the end after the value");
    }
    if (!ok) {
        loom_status s = r.err == LOOM_ENOMEM
                            ? loom__error(LOOM_ENOMEM, "%s: out of memory reading JSON", path)
                            : r.err;
        loom__json_free(out);
        return s;
    }
    return LOOM_OK;
}

loom_status loom__json_read(const char *path, loom__json *out) {
    int fd;
    int64_t size;
    memset(out, 0, sizeof *out);
    loom_status s = loom__open_regular(path, &fd, &size);
    if (s)
        return s;
    char *buf = size < ((int64_t)1 << 31) ? loom__malloc((size_t)size + 1) : NULL;
    if (!buf)
        s = loom__error(size < ((int64_t)1 << 31) ? LOOM_ENOMEM : LOOM_ERANGE,
                        "%s: %lld bytes, expected a JSON file of at most 2 GiB", path,
                        (long long)size);
    if (!s && size)
        s = loom__read_at(fd, path, buf, (size_t)size, 0, "the JSON text");
    close(fd);
    if (!s)
        s = loom__json_parse(buf, (size_t)size, path, out);
    loom__free(buf);
    return s;
}

void loom__json_free(loom__json *d) {
    loom__free(d->v);
    loom__free(d->text);
    memset(d, 0, sizeof *d);
}

const loom__jnode *loom__json_root(const loom__json *d) {
    return d->n ? &d->v[0] : NULL;
}

const loom__jnode *loom__json_first(const loom__json *d, const loom__jnode *v) {
    return v && v->child >= 0 ? &d->v[v->child] : NULL;
}

const loom__jnode *loom__json_next(const loom__json *d, const loom__jnode *v) {
    return v && v->next >= 0 ? &d->v[v->next] : NULL;
}

const loom__jnode *loom__json_get(const loom__json *d, const loom__jnode *obj, const char *key) {
    if (!obj || obj->kind != LOOM__JOBJ)
        return NULL;
    size_t klen = strlen(key);
    const loom__jnode *found = NULL; /* (the last of equal keys, as Python's json reads them) */
    for (const loom__jnode *c = loom__json_first(d, obj); c; c = loom__json_next(d, c))
        if ((size_t)c->klen == klen && !memcmp(c->key, key, klen))
            found = c;
    return found;
}

bool loom__json_is_str(const loom__jnode *v, const char *s) {
    return v && v->kind == LOOM__JSTR && (size_t)v->len == strlen(s) && !memcmp(v->s, s, v->len);
}

bool loom__json_int(const loom__jnode *v, int64_t *out) {
    if (!v || v->kind != LOOM__JNUM || !(fabs(v->num) < 9007199254740992.0) ||
        v->num != floor(v->num))
        return false;
    *out = (int64_t)v->num;
    return true;
}

loom_status loom__json_set_str(loom__json *d, const loom__jnode *obj, const char *key,
                               const char *value) {
    int64_t o = obj - d->v, last = -1;
    size_t klen = strlen(key);
    for (int64_t c = d->v[o].child; c >= 0; last = c, c = d->v[c].next)
        if ((size_t)d->v[c].klen == klen && !memcmp(d->v[c].key, key, klen)) {
            d->v[c] = (loom__jnode){.kind = LOOM__JSTR,
                                    .s = value,
                                    .len = (int64_t)strlen(value),
                                    .key = d->v[c].key,
                                    .klen = d->v[c].klen,
                                    .child = -1,
                                    .next = d->v[c].next};
            return LOOM_OK;
        }
    if (loom__grow((void **)&d->v, &d->cap, d->n + 1, sizeof *d->v))
        return LOOM_ENOMEM;
    d->v[d->n] = (loom__jnode){.kind = LOOM__JSTR,
                               .s = value,
                               .len = (int64_t)strlen(value),
                               .key = key,
                               .klen = (int64_t)klen,
                               .child = -1,
                               .next = -1};
    if (last < 0)
        d->v[o].child = d->n;
    else
        d->v[last].next = d->n;
    d->v[o].count++, d->n++;
    return LOOM_OK;
}

/* ---- writing ------------------------------------------------------------------------------ */

static void put_string(loom__strbuf *b, const char *s, int64_t len) {
    loom__strbuf_add(b, "\"", 1);
    for (int64_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        char esc[8];
        if (c == '"' || c == '\\')
            esc[0] = '\\', esc[1] = (char)c, loom__strbuf_add(b, esc, 2);
        else if (c < 0x20)
            snprintf(esc, sizeof esc, "\\u%04x", c), loom__strbuf_add(b, esc, 6);
        else
            loom__strbuf_add(b, (const char *)&s[i], 1);
    }
    loom__strbuf_add(b, "\"", 1);
}

static void indent(loom__strbuf *b, int depth) {
    loom__strbuf_add(b, "\n", 1);
    for (int k = 0; k < depth; k++)
        loom__strbuf_add(b, "  ", 2);
}

void loom__json_write(loom__strbuf *b, const loom__json *d, const loom__jnode *v, int depth) {
    switch (v->kind) {
        case LOOM__JNULL:
            loom__strbuf_add(b, "null", 4);
            return;
        case LOOM__JBOOL:
            loom__strbuf_add(b, v->b ? "true" : "false", v->b ? 4 : 5);
            return;
        case LOOM__JNUM:
            loom__strbuf_add(b, v->s, (size_t)v->len);
            return;
        case LOOM__JSTR:
            put_string(b, v->s, v->len);
            return;
        case LOOM__JARR:
        case LOOM__JOBJ:
            break;
    }
    bool obj = v->kind == LOOM__JOBJ;
    loom__strbuf_add(b, obj ? "{" : "[", 1);
    for (const loom__jnode *c = loom__json_first(d, v); c; c = loom__json_next(d, c)) {
        indent(b, depth + 1);
        if (obj)
            put_string(b, c->key, c->klen), loom__strbuf_add(b, ": ", 2);
        loom__json_write(b, d, c, depth + 1);
        if (c->next >= 0)
            loom__strbuf_add(b, ",", 1);
    }
    if (v->count)
        indent(b, depth);
    loom__strbuf_add(b, obj ? "}" : "]", 1);
}

void loom__strbuf_add(loom__strbuf *b, const char *s, size_t n) {
    if (b->err)
        return;
    if (loom__grow((void **)&b->s, &b->cap, b->len + (int64_t)n + 1, 1)) {
        b->err = true;
        return;
    }
    memcpy(b->s + b->len, s, n);
    b->len += (int64_t)n;
    b->s[b->len] = 0;
}
