/*
 * tokenizer.c - the byte-level BPE of a tokenizer.json as Hugging Face's `tokenizers` writes it
 * (GPT-2's): the text split around the added tokens (the longest at each place), each piece cut
 * into words by GPT-2's pattern
 *
 *     's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 *
 * (matched by hand, the classes from unicode_classes.h), each word's bytes spelled as GPT-2's
 * printable characters (bytes_to_unicode) and merged pair by pair, the lowest-ranked pair first
 * (the leftmost of equals), as the merges list them. Decoding joins the tokens' strings and maps
 * the characters back to bytes. Text that is not UTF-8 is read as Python's
 * bytes.decode("utf-8", "replace") reads it: each maximal ill-formed part one U+FFFD.
 *
 * What a tokenizer.json asks that this does not do (a normalizer, another pre-tokenizer or model,
 * a subword prefix) is refused naming the field.
 */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

#include "unicode_classes.h"

enum { CLS_OTHER, CLS_LETTER, CLS_NUMBER, CLS_SPACE };

static int class_of(int32_t c) {
    int lo = 0, hi = (int)(sizeof unicode_classes / sizeof *unicode_classes) - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (c < unicode_classes[mid].lo)
            hi = mid - 1;
        else if (c > unicode_classes[mid].hi)
            lo = mid + 1;
        else
            return unicode_classes[mid].cls;
    }
    return CLS_OTHER;
}

/* ---- a hash table: string -> id, and pair of ids -> (rank, id) ------------------------------ */

typedef struct {
    uint64_t key; /* a string's hash, or a pair (a << 32 | b) */
    const char *s;
    int64_t len;
    int32_t id, rank; /* id + 1 (0: empty slot) */
} slot;

typedef struct {
    slot *v;
    int64_t mask;
} table;

static uint64_t hash_str(const char *s, int64_t n) {
    uint64_t h = 1469598103934665603ull;
    for (int64_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h;
}

static uint64_t mix(uint64_t x) {
    x ^= x >> 33, x *= 0xff51afd7ed558ccdull, x ^= x >> 33;
    return x;
}

static bool table_init(table *t, int64_t n) {
    int64_t cap = 16;
    while (cap < 2 * n + 16)
        cap *= 2;
    t->mask = cap - 1;
    return (t->v = loom__calloc((size_t)cap, sizeof *t->v)) != NULL;
}

/* The slot of key (string s of len when s): where it is, or the empty slot where it goes. */
static slot *table_at(const table *t, uint64_t key, const char *s, int64_t len) {
    for (uint64_t i = mix(key) & (uint64_t)t->mask;; i = (i + 1) & (uint64_t)t->mask) {
        slot *e = &t->v[i];
        if (!e->id || (e->key == key && (!s || (e->len == len && !memcmp(e->s, s, (size_t)len)))))
            return e;
    }
}

struct loom_tokenizer {
    loom__json doc;
    table vocab;      /* token string -> id */
    table merges;     /* pair -> rank, merged id */
    const char **str; /* id -> its string (in doc), NULL for ids not used */
    int64_t *slen;
    int64_t n;                 /* ids: 1 + the largest */
    int32_t byte_id[256];      /* the token of each byte's character, -1 if none */
    int32_t byte_of[324];      /* GPT-2's character (code point < 324) -> its byte, -1 if none */
    int32_t char_of[256];      /* byte -> GPT-2's character */
    const loom__jnode **added; /* the added tokens, longest first */
    int64_t nadded;
    bool prefix_space, use_regex, ignore_merges;
};

/* ---- loading ------------------------------------------------------------------------------- */

static loom_status refuse(const char *path, const char *field, const char *what) {
    return loom__error(LOOM_EUNSUPPORTED, "%s: \"%s\": %s", path, field, what);
}

static loom_status bad(const char *path, const char *field, const char *what) {
    return loom__error(LOOM_EFORMAT, "%s: \"%s\": expected %s", path, field, what);
}

/* GPT-2's bytes_to_unicode: printable bytes stand for themselves, the others for 256 + n. */
static void byte_chars(loom_tokenizer *t) {
    int n = 0;
    for (int b = 0; b < 256; b++) {
        bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
        t->char_of[b] = printable ? b : 256 + n++;
    }
    for (int c = 0; c < 324; c++)
        t->byte_of[c] = -1;
    for (int b = 0; b < 256; b++)
        t->byte_of[t->char_of[b]] = b;
}

static loom_status add_vocab(loom_tokenizer *t, const char *path, const char *s, int64_t len,
                             int64_t id) {
    if (id < 0 || id >= ((int64_t)1 << 30))
        return bad(path, "model.vocab", "ids from 0 to 2^30");
    slot *e = table_at(&t->vocab, hash_str(s, len), s, len);
    if (e->id)
        return loom__error(LOOM_EFORMAT, "%s: \"model.vocab\": token '%.*s' twice", path,
                           (int)(len < 64 ? len : 64), s);
    *e = (slot){hash_str(s, len), s, len, (int32_t)id + 1, 0};
    if (id >= t->n)
        t->n = id + 1;
    return LOOM_OK;
}

static int32_t vocab_id(const loom_tokenizer *t, const char *s, int64_t len) {
    const slot *e = table_at(&t->vocab, hash_str(s, len), s, len);
    return e->id - 1;
}

/* Merge `rank` ("a b", or ["a", "b"]): a, b and a b must be tokens. */
static loom_status add_merge(loom_tokenizer *t, const char *path, const loom__jnode *m,
                             int32_t rank) {
    const char *a, *b;
    int64_t la, lb;
    if (m->kind == LOOM__JSTR) {
        const char *sp = memchr(m->s, ' ', (size_t)m->len);
        if (!sp)
            return bad(path, "model.merges", "pairs \"a b\"");
        a = m->s, la = sp - m->s, b = sp + 1, lb = m->len - la - 1;
    } else if (m->kind == LOOM__JARR && m->count == 2 &&
               loom__json_first(&t->doc, m)->kind == LOOM__JSTR &&
               loom__json_next(&t->doc, loom__json_first(&t->doc, m))->kind == LOOM__JSTR) {
        const loom__jnode *x = loom__json_first(&t->doc, m), *y = loom__json_next(&t->doc, x);
        a = x->s, la = x->len, b = y->s, lb = y->len;
    } else {
        return bad(path, "model.merges", "pairs \"a b\" or [\"a\", \"b\"]");
    }
    char buf[512];
    int32_t ia = vocab_id(t, a, la), ib = vocab_id(t, b, lb), ic = -1;
    if (la + lb < (int64_t)sizeof buf) {
        memcpy(buf, a, (size_t)la), memcpy(buf + la, b, (size_t)lb);
        ic = vocab_id(t, buf, la + lb);
    }
    if (ia < 0 || ib < 0 || ic < 0)
        return loom__error(LOOM_EFORMAT,
                           "%s: \"model.merges\": merge %d ('%.*s' '%.*s') names a token not in "
                           "model.vocab",
                           path, rank, (int)(la < 64 ? la : 64), a, (int)(lb < 64 ? lb : 64), b);
    uint64_t key = (uint64_t)(uint32_t)ia << 32 | (uint32_t)ib;
    slot *e = table_at(&t->merges, key, NULL, 0);
    if (!e->id) /* (a pair listed twice keeps its first rank, as tokenizers does) */
        *e = (slot){key, NULL, 0, ic + 1, rank};
    return LOOM_OK;
}

static bool null_or_false(const loom__jnode *v) {
    return !v || v->kind == LOOM__JNULL || (v->kind == LOOM__JBOOL && !v->b);
}

static loom_status read_model(loom_tokenizer *t, const char *path, const loom__jnode *model) {
    const loom__json *d = &t->doc;
    if (!model || model->kind != LOOM__JOBJ)
        return bad(path, "model", "an object");
    if (!loom__json_is_str(loom__json_get(d, model, "type"), "BPE"))
        return refuse(path, "model.type", "loom reads BPE models");
    static const char *const absent[] = {"continuing_subword_prefix", "end_of_word_suffix",
                                         "dropout", "unk_token"};
    for (size_t k = 0; k < sizeof absent / sizeof *absent; k++)
        if (!null_or_false(loom__json_get(d, model, absent[k])))
            return refuse(path, absent[k], "loom's BPE reads tokenizers without it");
    if (!null_or_false(loom__json_get(d, model, "byte_fallback")))
        return refuse(path, "model.byte_fallback", "loom reads byte-level BPE (GPT-2's)");
    t->ignore_merges = !null_or_false(loom__json_get(d, model, "ignore_merges"));
    const loom__jnode *vocab = loom__json_get(d, model, "vocab");
    const loom__jnode *merges = loom__json_get(d, model, "merges");
    if (!vocab || vocab->kind != LOOM__JOBJ)
        return bad(path, "model.vocab", "an object");
    if (!merges || merges->kind != LOOM__JARR)
        return bad(path, "model.merges", "an array");
    if (!table_init(&t->vocab, vocab->count + 1024) || !table_init(&t->merges, merges->count))
        return LOOM_ENOMEM;
    loom_status s = LOOM_OK;
    for (const loom__jnode *e = loom__json_first(d, vocab); e && !s; e = loom__json_next(d, e)) {
        int64_t id;
        s = loom__json_int(e, &id) ? add_vocab(t, path, e->key, e->klen, id)
                                   : bad(path, "model.vocab", "integer ids");
    }
    int32_t rank = 0;
    for (const loom__jnode *e = loom__json_first(d, merges); e && !s; e = loom__json_next(d, e))
        s = add_merge(t, path, e, rank++);
    return s;
}

static int cmp_longer(const void *a, const void *b) {
    const loom__jnode *x = *(const loom__jnode *const *)a, *y = *(const loom__jnode *const *)b;
    return x->len < y->len ? 1 : x->len > y->len ? -1 : 0;
}

/* The added tokens: each an id and its content (a token of its own when the vocabulary lacks
 * it), matched in the raw text before anything else. */
static loom_status read_added(loom_tokenizer *t, const char *path, const loom__jnode *list) {
    const loom__json *d = &t->doc;
    if (!list || list->kind == LOOM__JNULL)
        return LOOM_OK;
    if (list->kind != LOOM__JARR)
        return bad(path, "added_tokens", "an array");
    if (!(t->added = loom__calloc((size_t)list->count + 1, sizeof *t->added)))
        return LOOM_ENOMEM;
    for (const loom__jnode *e = loom__json_first(d, list); e; e = loom__json_next(d, e)) {
        const loom__jnode *content = loom__json_get(d, e, "content");
        int64_t id;
        if (!loom__json_int(loom__json_get(d, e, "id"), &id) || !content ||
            content->kind != LOOM__JSTR || !content->len)
            return bad(path, "added_tokens", "objects with an integer \"id\" and a \"content\"");
        static const char *const flags[] = {"single_word", "lstrip", "rstrip"};
        for (size_t k = 0; k < 3; k++)
            if (!null_or_false(loom__json_get(d, e, flags[k])))
                return refuse(path, flags[k], "loom matches added tokens exactly, without it");
        int32_t have = vocab_id(t, content->s, content->len);
        if (have >= 0 && have != id)
            return loom__error(LOOM_EFORMAT,
                               "%s: \"added_tokens\": '%s' is id %lld there, %d in "
                               "model.vocab",
                               path, content->s, (long long)id, have);
        loom_status s = have >= 0 ? LOOM_OK : add_vocab(t, path, content->s, content->len, id);
        if (s)
            return s;
        t->added[t->nadded++] = content;
    }
    qsort(t->added, (size_t)t->nadded, sizeof *t->added, cmp_longer);
    return LOOM_OK;
}

static loom_status read_pipeline(loom_tokenizer *t, const char *path) {
    const loom__json *d = &t->doc;
    const loom__jnode *root = loom__json_root(d);
    if (!null_or_false(loom__json_get(d, root, "normalizer")))
        return refuse(path, "normalizer", "loom's byte-level BPE reads tokenizers without one");
    const loom__jnode *pre = loom__json_get(d, root, "pre_tokenizer");
    if (!pre || !loom__json_is_str(loom__json_get(d, pre, "type"), "ByteLevel"))
        return refuse(path, "pre_tokenizer", "loom reads GPT-2's ByteLevel pre-tokenizer");
    t->prefix_space = !null_or_false(loom__json_get(d, pre, "add_prefix_space"));
    const loom__jnode *regex = loom__json_get(d, pre, "use_regex");
    t->use_regex = !regex || regex->kind != LOOM__JBOOL || regex->b;
    const loom__jnode *dec = loom__json_get(d, root, "decoder");
    if (dec && dec->kind != LOOM__JNULL &&
        !loom__json_is_str(loom__json_get(d, dec, "type"), "ByteLevel"))
        return refuse(path, "decoder", "loom reads GPT-2's ByteLevel decoder");
    const loom__jnode *post = loom__json_get(d, root, "post_processor");
    if (post && post->kind != LOOM__JNULL &&
        !loom__json_is_str(loom__json_get(d, post, "type"), "ByteLevel"))
        return refuse(path, "post_processor", "loom reads GPT-2's ByteLevel post-processor");
    return LOOM_OK;
}

loom_status loom_tokenizer_load(const char *path, loom_tokenizer **out) {
    *out = NULL;
    loom_tokenizer *t = loom__calloc(1, sizeof *t);
    if (!t)
        return LOOM_ENOMEM;
    loom_status s = loom__json_read(path, &t->doc);
    const loom__jnode *root = s ? NULL : loom__json_root(&t->doc);
    if (!s && root->kind != LOOM__JOBJ)
        s = loom__error(LOOM_EFORMAT, "%s: expected a JSON object", path);
    if (!s)
        s = read_model(t, path, loom__json_get(&t->doc, root, "model"));
    if (!s)
        s = read_added(t, path, loom__json_get(&t->doc, root, "added_tokens"));
    if (!s)
        s = read_pipeline(t, path);
    if (!s && !(t->str = loom__calloc((size_t)t->n, sizeof *t->str)))
        s = LOOM_ENOMEM;
    if (!s && !(t->slen = loom__calloc((size_t)t->n, sizeof *t->slen)))
        s = LOOM_ENOMEM;
    if (!s) {
        byte_chars(t);
        for (int64_t i = 0; i <= t->vocab.mask; i++) {
            const slot *e = &t->vocab.v[i];
            if (e->id)
                t->str[e->id - 1] = e->s, t->slen[e->id - 1] = e->len;
        }
        for (int b = 0; b < 256; b++) {
            char u[4];
            int n = loom__utf8_put(t->char_of[b], u);
            t->byte_id[b] = vocab_id(t, u, n);
        }
    }
    if (s)
        loom_tokenizer_free(t);
    else
        *out = t;
    return s;
}

void loom_tokenizer_free(loom_tokenizer *t) {
    if (!t)
        return;
    loom__json_free(&t->doc);
    loom__free(t->vocab.v), loom__free(t->merges.v);
    loom__free(t->str), loom__free(t->slen), loom__free(t->added);
    loom__free(t);
}

int64_t loom_tokenizer_vocab(const loom_tokenizer *t) {
    return t->n;
}

/* ---- encoding ------------------------------------------------------------------------------ */

/* The code point at s (n bytes left) and its length: well-formed UTF-8 (Unicode's Table 3-7), or
 * U+FFFD for the maximal ill-formed part there (at least one byte). */
static int32_t next_char(const unsigned char *s, int64_t n, int *len) {
    unsigned c = s[0];
    if (c < 0x80)
        return *len = 1, (int32_t)c;
    int need = c >= 0xC2 && c <= 0xDF   ? 1
               : c >= 0xE0 && c <= 0xEF ? 2
               : c >= 0xF0 && c <= 0xF4 ? 3
                                        : 0;
    unsigned lo = 0x80, hi = 0xBF; /* the second byte's range */
    if (c == 0xE0)
        lo = 0xA0;
    else if (c == 0xED)
        hi = 0x9F;
    else if (c == 0xF0)
        lo = 0x90;
    else if (c == 0xF4)
        hi = 0x8F;
    int32_t v = (int32_t)(c & (0x3F >> need));
    int k = 1;
    for (; k <= need; k++) {
        if (k >= n)
            break;
        unsigned b = s[k];
        if (b < (k == 1 ? lo : 0x80) || b > (k == 1 ? hi : 0xBF))
            break;
        v = v << 6 | (int32_t)(b & 0x3F);
    }
    if (need && k == need + 1)
        return *len = k, v;
    return *len = k, 0xFFFD; /* (k: the lead byte and the continuation bytes that fit) */
}

typedef struct {
    int32_t *ids;
    int64_t n, cap;
    int32_t *sym; /* a word's symbols while merging */
    int64_t symcap;
    loom_status err;
} out_ids;

static void push(out_ids *o, int32_t id) {
    if (o->err || (o->n >= o->cap &&
                   (o->err = loom__grow((void **)&o->ids, &o->cap, o->n + 1, sizeof *o->ids))))
        return;
    o->ids[o->n++] = id;
}

/* One word (UTF-8 bytes, already well-formed) by byte-level BPE into o. */
static void bpe_word(const loom_tokenizer *t, const unsigned char *w, int64_t n, out_ids *o) {
    if (t->ignore_merges) { /* (the whole word, when it is a token: tokenizers' ignore_merges) */
        char buf[1024];
        int64_t k = 0;
        for (int64_t i = 0; i < n && k + 4 < (int64_t)sizeof buf; i++)
            k += loom__utf8_put(t->char_of[w[i]], buf + k);
        int32_t id = 4 * n < (int64_t)sizeof buf ? vocab_id(t, buf, k) : -1;
        if (id >= 0) {
            push(o, id);
            return;
        }
    }
    if (n > o->symcap && (o->err = loom__grow((void **)&o->sym, &o->symcap, n, sizeof *o->sym)))
        return;
    int32_t *s = o->sym;
    int64_t m = 0;
    for (int64_t i = 0; i < n; i++) /* (a byte without a token is dropped, as tokenizers does) */
        if (t->byte_id[w[i]] >= 0)
            s[m++] = t->byte_id[w[i]];
    for (;;) {
        int64_t best = -1;
        int32_t best_rank = INT32_MAX, best_id = -1;
        for (int64_t i = 0; i + 1 < m; i++) {
            uint64_t key = (uint64_t)(uint32_t)s[i] << 32 | (uint32_t)s[i + 1];
            const slot *e = table_at(&t->merges, key, NULL, 0);
            if (e->id && e->rank < best_rank)
                best = i, best_rank = e->rank, best_id = e->id - 1;
        }
        if (best < 0)
            break;
        s[best] = best_id;
        memmove(s + best + 1, s + best + 2, sizeof *s * (size_t)(m - best - 2));
        m--;
    }
    for (int64_t i = 0; i < m; i++)
        push(o, s[i]);
}

/* GPT-2's pattern's match at s[i] (of n bytes): its end. */
static int64_t match_word(const unsigned char *s, int64_t i, int64_t n) {
    if (s[i] == '\'' && i + 1 < n) {
        char a = (char)s[i + 1], b = i + 2 < n ? (char)s[i + 2] : 0;
        if (a == 's' || a == 't' || a == 'm' || a == 'd')
            return i + 2;
        if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l'))
            return i + 3;
    }
    int len;
    int64_t j = i + (s[i] == ' ' && i + 1 < n ? 1 : 0);
    int cls = class_of(next_char(s + j, n - j, &len));
    if (j > i && cls == CLS_SPACE) /* (" " then a space: no " ?X" alternative matches) */
        j = i, cls = CLS_SPACE;
    if (cls != CLS_SPACE) { /* ` ?\p{L}+`, ` ?\p{N}+` or ` ?[^\s\p{L}\p{N}]+` */
        int64_t k = j;
        while (k < n) {
            int c2 = class_of(next_char(s + k, n - k, &len));
            if (c2 != cls)
                break;
            k += len;
        }
        return k;
    }
    /* `\s+(?!\S)|\s+`: the run of spaces, but its last when more follows it */
    int64_t k = i, last = i;
    while (k < n && class_of(next_char(s + k, n - k, &len)) == CLS_SPACE)
        last = k, k += len;
    return k == n || last == i ? k : last;
}

/* A piece of text between added tokens: its words by BPE. */
static void encode_piece(const loom_tokenizer *t, const unsigned char *s, int64_t n, out_ids *o) {
    if (n == 0)
        return;
    unsigned char *tmp = NULL;
    if (t->prefix_space && s[0] != ' ') {
        if (!(tmp = loom__malloc((size_t)n + 1))) {
            o->err = LOOM_ENOMEM;
            return;
        }
        tmp[0] = ' ', memcpy(tmp + 1, s, (size_t)n);
        s = tmp, n++;
    }
    for (int64_t i = 0; i < n && !o->err;) {
        int64_t end = t->use_regex ? match_word(s, i, n) : n;
        bpe_word(t, s + i, end - i, o);
        i = end;
    }
    loom__free(tmp);
}

/* The text as well-formed UTF-8 (ill-formed parts U+FFFD), malloc'd into *out, *m bytes. */
static loom_status well_formed(const char *text, int64_t n, unsigned char **out, int64_t *m) {
    const unsigned char *s = (const unsigned char *)text;
    unsigned char *w = loom__malloc((size_t)n * 3 + 1); /* (a byte becomes at most 3) */
    if (!w)
        return loom__error(LOOM_ENOMEM, "out of memory for %lld bytes of text", (long long)n);
    int64_t k = 0;
    for (int64_t i = 0; i < n;) {
        int len;
        int32_t c = next_char(s + i, n - i, &len);
        if (c == 0xFFFD && !(len == 3 && s[i] == 0xEF && s[i + 1] == 0xBF && s[i + 2] == 0xBD))
            k += loom__utf8_put(0xFFFD, (char *)w + k);
        else
            memcpy(w + k, s + i, (size_t)len), k += len;
        i += len;
    }
    *out = w, *m = k;
    return LOOM_OK;
}

loom_status loom_tokenizer_encode(const loom_tokenizer *t, const char *text, int64_t n,
                                  int32_t **ids, int64_t *count) {
    *ids = NULL, *count = 0;
    if (!t || (!text && n) || n < 0)
        return loom__error(LOOM_EINVAL, "loom_tokenizer_encode: expected a tokenizer and text");
    unsigned char *s = NULL;
    int64_t m = 0;
    loom_status st = well_formed(text ? text : "", n, &s, &m);
    if (st)
        return st;
    out_ids o = {0};
    int64_t from = 0;
    for (int64_t i = 0; i < m && !o.err;) {
        const loom__jnode *hit = NULL;
        for (int64_t a = 0; a < t->nadded && !hit; a++) /* (longest first) */
            if (t->added[a]->len <= m - i &&
                !memcmp(s + i, t->added[a]->s, (size_t)t->added[a]->len))
                hit = t->added[a];
        if (!hit) {
            i++;
            continue;
        }
        encode_piece(t, s + from, i - from, &o);
        push(&o, vocab_id(t, hit->s, hit->len));
        i += hit->len, from = i;
    }
    encode_piece(t, s + from, m - from, &o);
    loom__free(s), loom__free(o.sym);
    if (o.err) {
        loom__free(o.ids);
        return loom__error(LOOM_ENOMEM, "out of memory for the tokens of %lld bytes", (long long)n);
    }
    *ids = o.ids, *count = o.n;
    return LOOM_OK;
}

void loom_tokenizer_ids_free(int32_t *ids) {
    loom__free(ids);
}

uint64_t loom__tokenizer_hash(const loom_tokenizer *t) {
    loom__hash h;
    loom__hash_init(&h);
    loom__hash_large(&h, t->doc.text, t->doc.size);
    return loom__hash_final(&h);
}

/* ---- decoding ------------------------------------------------------------------------------ */

size_t loom_tokenizer_decode(const loom_tokenizer *t, const int32_t *ids, int64_t n, char *buf,
                             size_t size) {
    size_t k = 0;
    for (int64_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= t->n || !t->str[ids[i]])
            continue;
        const unsigned char *s = (const unsigned char *)t->str[ids[i]];
        int64_t len = t->slen[ids[i]];
        bool added = false;
        for (int64_t a = 0; a < t->nadded && !added; a++)
            added = t->added[a]->s == (const char *)s;
        for (int64_t j = 0; j < len;) {
            int cl;
            int32_t c = next_char(s + j, len - j, &cl);
            char one[4];
            int m = 1;
            if (!added && c < 324 && t->byte_of[c] >= 0)
                one[0] = (char)t->byte_of[c];
            else
                m = cl, memcpy(one, s + j, (size_t)cl);
            if (k + (size_t)m < size)
                memcpy(buf + k, one, (size_t)m);
            k += (size_t)m, j += cl;
        }
    }
    if (size)
        buf[k < size ? k : size - 1] = 0;
    return k;
}
