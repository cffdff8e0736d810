/*
 * tokenizer.c - the BPE tokenizers of tokenizer.json files as Hugging Face's `tokenizers` writes
 * them, in their two kinds:
 *   - byte-level (GPT-2, SmolLM): each piece of text cut into words by GPT-2's pattern
 *         's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 *     (matched by hand, the classes from unicode_classes.h), each word's bytes spelled as GPT-2's
 *     printable characters (bytes_to_unicode), decoded back byte for byte;
 *   - SentencePiece's (Llama 2, TinyLlama): spaces become U+2581 and one is put in front (the
 *     normalizer Prepend + Replace, or the Metaspace pre-tokenizer), a word's symbols are its
 *     characters, a character outside the vocabulary its bytes' <0xXX> tokens (byte_fallback) or
 *     the unknown token; decoding turns U+2581 back into spaces and <0xXX> into bytes, and drops
 *     the first space (the Strip decoder).
 * Both: the text split around the added tokens first (the longest at each place), each word
 * merged pair by pair, the lowest-ranked pair first (the leftmost of equals: a heap, so that a
 * word of a million symbols costs n log n), and the post-processor's template (the <s> in front)
 * when asked. Text that is not UTF-8 is read as Python's bytes.decode("utf-8", "replace") reads
 * it: each maximal ill-formed part one U+FFFD.
 *
 * What a tokenizer.json asks that this does not do (another model or pre-tokenizer, a regular
 * expression in a normalizer, a subword prefix) is refused naming the field.
 */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

#include "unicode_classes.h"

enum { CLS_OTHER, CLS_LETTER, CLS_NUMBER, CLS_SPACE };
enum { ID_BYTE = 0x100, ID_ADDED = 0x200, ID_SPECIAL = 0x400 }; /* decode_as: ID_BYTE | the byte */

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
    /* id -> how decoding takes it: ID_SPECIAL (skipped), ID_ADDED (its text as it is), the byte
     * of a <0xXX> token (with the ByteFallback decoder) */
    uint16_t *decode_as;
    int64_t nadded;
    bool ignore_merges;
    /* byte-level */
    bool byte_level, prefix_space, use_regex;
    /* SentencePiece's */
    bool prepend_norm;            /* a U+2581 in front of every piece (the Prepend normalizer) */
    bool prepend_each;            /* the same, unless it starts with a space (Metaspace always) */
    bool prepend_first;           /* that, for the text's first piece only (Metaspace first) */
    bool split_words;             /* Metaspace split: a word starts at each U+2581 */
    bool byte_fallback, fuse_unk; /* characters outside the vocabulary: their bytes, or unk */
    int32_t unk;                  /* the unknown token, -1 */
    int32_t byte_tok[256];        /* <0xXX> */
    bool strip_space;             /* the Strip decoder: the decoded text's first space dropped */
    bool byte_decode;             /* the ByteFallback decoder: <0xXX> decoded as its byte */
    /* the post-processor's template around a text's ids (TemplateProcessing's "single") */
    int32_t prefix[8], suffix[8];
    int nprefix, nsuffix;
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
                                         "dropout"};
    for (size_t k = 0; k < sizeof absent / sizeof *absent; k++)
        if (!null_or_false(loom__json_get(d, model, absent[k])))
            return refuse(path, absent[k], "loom's BPE reads tokenizers without it");
    t->byte_fallback = !null_or_false(loom__json_get(d, model, "byte_fallback"));
    t->fuse_unk = !null_or_false(loom__json_get(d, model, "fuse_unk"));
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

typedef loom_status (*step_reader)(loom_tokenizer *t, const char *path, const loom__jnode *n);

/* A Sequence's steps (the array list, of pipeline field `field`), each read by fn. */
static loom_status each(loom_tokenizer *t, const char *path, const loom__jnode *list,
                        const char *field, step_reader fn) {
    if (!list || list->kind != LOOM__JARR)
        return bad(path, field, "a Sequence's array of steps");
    loom_status s = LOOM_OK;
    for (const loom__jnode *e = loom__json_first(&t->doc, list); e && !s;
         e = loom__json_next(&t->doc, e))
        s = fn(t, path, e);
    return s;
}

/* A normalizer step of SentencePiece's kind: Prepend("\u2581") or Replace(" ", "\u2581"). */
static loom_status read_normalizer(loom_tokenizer *t, const char *path, const loom__jnode *n) {
    const loom__json *d = &t->doc;
    const loom__jnode *type = loom__json_get(d, n, "type");
    if (loom__json_is_str(type, "Sequence"))
        return each(t, path, loom__json_get(d, n, "normalizers"), "normalizer", read_normalizer);
    if (loom__json_is_str(type, "Prepend") &&
        loom__json_is_str(loom__json_get(d, n, "prepend"), "\xe2\x96\x81"))
        return t->prepend_norm = true, LOOM_OK;
    const loom__jnode *pattern = loom__json_get(d, n, "pattern");
    if (loom__json_is_str(type, "Replace") &&
        loom__json_is_str(loom__json_get(d, pattern, "String"), " ") &&
        loom__json_is_str(loom__json_get(d, n, "content"), "\xe2\x96\x81"))
        return LOOM_OK; /* (spaces become U+2581 in SentencePiece's kind anyway) */
    return refuse(path, "normalizer",
                  "loom reads no normalizer, or SentencePiece's Prepend and Replace of spaces by "
                  "U+2581");
}

/* A decoder: ByteLevel (byte-level); or SentencePiece's Replace(U+2581, " "), ByteFallback,
 * Fuse and Strip(" ", 1, 0), in a Sequence. */
static loom_status read_decoder(loom_tokenizer *t, const char *path, const loom__jnode *n) {
    const loom__json *d = &t->doc;
    const loom__jnode *type = loom__json_get(d, n, "type");
    if (loom__json_is_str(type, "ByteFallback"))
        return t->byte_decode = true, LOOM_OK;
    if (!n || n->kind == LOOM__JNULL || loom__json_is_str(type, "ByteLevel") ||
        loom__json_is_str(type, "Fuse") ||
        (loom__json_is_str(type, "Replace") &&
         loom__json_is_str(loom__json_get(d, n, "content"), " ")))
        return LOOM_OK;
    if (loom__json_is_str(type, "Metaspace"))
        return t->strip_space = true, LOOM_OK;
    int64_t start = 0, stop = 0;
    if (loom__json_is_str(type, "Strip") &&
        loom__json_is_str(loom__json_get(d, n, "content"), " ") &&
        loom__json_int(loom__json_get(d, n, "start"), &start) && start == 1 &&
        loom__json_int(loom__json_get(d, n, "stop"), &stop) && stop == 0)
        return t->strip_space = true, LOOM_OK;
    if (loom__json_is_str(type, "Sequence"))
        return each(t, path, loom__json_get(d, n, "decoders"), "decoder", read_decoder);
    return refuse(path, "decoder", "loom reads ByteLevel, and Replace, ByteFallback, Fuse, Strip");
}

/* The ids of special token `name` of a template into ids (at most 8 with *n). */
static loom_status template_ids(loom_tokenizer *t, const char *path, const loom__jnode *specials,
                                const loom__jnode *name, int32_t *ids, int *n) {
    const loom__json *d = &t->doc;
    if (!name || name->kind != LOOM__JSTR)
        return bad(path, "post_processor.single", "SpecialToken ids");
    const loom__jnode *list = loom__json_get(d, loom__json_get(d, specials, name->s), "ids");
    if (!list || list->kind != LOOM__JARR)
        return bad(path, "post_processor.special_tokens", "the ids of each special token");
    for (const loom__jnode *e = loom__json_first(d, list); e; e = loom__json_next(d, e)) {
        int64_t id;
        if (*n >= 8 || !loom__json_int(e, &id) || id < 0 || id >= t->n)
            return bad(path, "post_processor.special_tokens", "at most 8 ids of the vocabulary");
        ids[(*n)++] = (int32_t)id;
    }
    return LOOM_OK;
}

/* A post-processor: ByteLevel (nothing to the ids) or TemplateProcessing (its "single"), alone
 * or in a Sequence. */
static loom_status read_post(loom_tokenizer *t, const char *path, const loom__jnode *n) {
    const loom__json *d = &t->doc;
    const loom__jnode *type = loom__json_get(d, n, "type");
    if (!n || n->kind == LOOM__JNULL || loom__json_is_str(type, "ByteLevel"))
        return LOOM_OK;
    if (loom__json_is_str(type, "Sequence"))
        return each(t, path, loom__json_get(d, n, "processors"), "post_processor", read_post);
    if (!loom__json_is_str(type, "TemplateProcessing"))
        return refuse(path, "post_processor", "loom reads ByteLevel and TemplateProcessing");
    const loom__jnode *single = loom__json_get(d, n, "single");
    const loom__jnode *specials = loom__json_get(d, n, "special_tokens");
    if (!single || single->kind != LOOM__JARR)
        return bad(path, "post_processor.single", "an array");
    bool after = false;
    loom_status s = LOOM_OK;
    for (const loom__jnode *e = loom__json_first(d, single); e && !s; e = loom__json_next(d, e)) {
        const loom__jnode *sp = loom__json_get(d, e, "SpecialToken");
        if (loom__json_get(d, e, "Sequence"))
            after = true;
        else if (sp)
            s = after ? template_ids(t, path, specials, loom__json_get(d, sp, "id"), t->suffix,
                                     &t->nsuffix)
                      : template_ids(t, path, specials, loom__json_get(d, sp, "id"), t->prefix,
                                     &t->nprefix);
        else
            s = bad(path, "post_processor.single", "SpecialToken and Sequence items");
    }
    return s;
}

static loom_status read_pipeline(loom_tokenizer *t, const char *path) {
    const loom__json *d = &t->doc;
    const loom__jnode *root = loom__json_root(d);
    const loom__jnode *norm = loom__json_get(d, root, "normalizer");
    const loom__jnode *pre = loom__json_get(d, root, "pre_tokenizer");
    const loom__jnode *type = loom__json_get(d, pre, "type");
    loom_status s = LOOM_OK;
    if (loom__json_is_str(type, "ByteLevel")) {
        t->byte_level = true;
        t->prefix_space = !null_or_false(loom__json_get(d, pre, "add_prefix_space"));
        const loom__jnode *regex = loom__json_get(d, pre, "use_regex");
        t->use_regex = !regex || regex->kind != LOOM__JBOOL || regex->b;
        if (!null_or_false(norm))
            return refuse(path, "normalizer", "loom's byte-level BPE reads tokenizers without one");
    } else if (loom__json_is_str(type, "Metaspace")) {
        const loom__jnode *scheme = loom__json_get(d, pre, "prepend_scheme");
        const loom__jnode *split = loom__json_get(d, pre, "split");
        if (!loom__json_is_str(loom__json_get(d, pre, "replacement"), "\xe2\x96\x81"))
            return refuse(path, "pre_tokenizer.replacement", "loom reads U+2581");
        t->prepend_first = loom__json_is_str(scheme, "first");
        t->prepend_each = !scheme || loom__json_is_str(scheme, "always");
        if (scheme && !t->prepend_first && !t->prepend_each && !loom__json_is_str(scheme, "never"))
            return refuse(path, "pre_tokenizer.prepend_scheme", "loom reads first, always, never");
        t->split_words = !split || split->kind != LOOM__JBOOL || split->b;
    } else if (pre && pre->kind != LOOM__JNULL) {
        return refuse(path, "pre_tokenizer", "loom reads ByteLevel (GPT-2's) and Metaspace");
    }
    if (!t->byte_level && norm && norm->kind != LOOM__JNULL)
        s = read_normalizer(t, path, norm);
    if (!s && !t->byte_level && !t->prepend_norm && (!pre || pre->kind == LOOM__JNULL))
        s = refuse(path, "pre_tokenizer",
                   "loom reads ByteLevel, Metaspace, or none with "
                   "SentencePiece's Prepend normalizer");
    if (!s)
        s = read_decoder(t, path, loom__json_get(d, root, "decoder"));
    if (!s)
        s = read_post(t, path, loom__json_get(d, root, "post_processor"));
    return s;
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
            char u[8];
            int n = loom__utf8_put(t->char_of[b], u);
            t->byte_id[b] = vocab_id(t, u, n);
            snprintf(u, sizeof u, "<0x%02X>", b);
            t->byte_tok[b] = vocab_id(t, u, 6);
        }
        const loom__jnode *unk =
            loom__json_get(&t->doc, loom__json_get(&t->doc, root, "model"), "unk_token");
        t->unk = unk && unk->kind == LOOM__JSTR ? vocab_id(t, unk->s, unk->len) : -1;
        const loom__jnode *added = loom__json_get(&t->doc, root, "added_tokens");
        if (!(t->decode_as = loom__calloc((size_t)t->n, sizeof *t->decode_as)))
            s = LOOM_ENOMEM;
        for (int b = 0; !s && t->byte_decode && b < 256; b++)
            if (t->byte_tok[b] >= 0)
                t->decode_as[t->byte_tok[b]] = (uint16_t)(ID_BYTE | b);
        for (const loom__jnode *e = s ? NULL : loom__json_first(&t->doc, added); e;
             e = loom__json_next(&t->doc, e)) {
            int64_t id; /* (read_added checked each: an id of the vocabulary) */
            if (loom__json_int(loom__json_get(&t->doc, e, "id"), &id))
                t->decode_as[id] |=
                    null_or_false(loom__json_get(&t->doc, e, "special")) ? ID_ADDED : ID_SPECIAL;
        }
        if (unk && unk->kind == LOOM__JSTR && t->unk < 0)
            s = loom__error(LOOM_EFORMAT, "%s: \"model.unk_token\": '%s' is not in the vocabulary",
                            path, unk->s);
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
    loom__free(t->str), loom__free(t->slen), loom__free(t->added), loom__free(t->decode_as);
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
    /* a word while merging: its symbols, linked (prev, next: -1 at the ends; sym -1: merged
     * away), and the heap of candidate merges (rank, then place) */
    int32_t *sym;
    int64_t *prev, *next;
    uint64_t *heap;
    int64_t cap_word, nheap;
    loom_status err;
} out_ids;

static void push(out_ids *o, int32_t id) {
    if (o->err || (o->n >= o->cap &&
                   (o->err = loom__grow((void **)&o->ids, &o->cap, o->n + 1, sizeof *o->ids))))
        return;
    o->ids[o->n++] = id;
}

/* Room for a word of n symbols. */
static bool word_room(out_ids *o, int64_t n) {
    if (n <= o->cap_word)
        return true;
    loom__free(o->sym), loom__free(o->prev), loom__free(o->next), loom__free(o->heap);
    o->sym = loom__malloc(sizeof *o->sym * (size_t)n);
    o->prev = loom__malloc(sizeof *o->prev * (size_t)n);
    o->next = loom__malloc(sizeof *o->next * (size_t)n);
    o->heap = loom__malloc(sizeof *o->heap * (size_t)n * 2);
    o->cap_word = o->sym && o->prev && o->next && o->heap ? n : 0;
    if (!o->cap_word)
        o->err = LOOM_ENOMEM;
    return o->cap_word > 0;
}

/* The merge of the pair at symbol i (with its next), when there is one: pushed as rank << 32 |
 * i (a word has fewer than 2^32 symbols: its text is at most 2^31 bytes). */
static void candidate(const loom_tokenizer *t, out_ids *o, int64_t i) {
    int64_t j = o->next[i];
    if (j < 0)
        return;
    uint64_t key = (uint64_t)(uint32_t)o->sym[i] << 32 | (uint32_t)o->sym[j];
    const slot *e = table_at(&t->merges, key, NULL, 0);
    if (!e->id)
        return;
    uint64_t v = (uint64_t)(uint32_t)e->rank << 32 | (uint64_t)i, *h = o->heap;
    int64_t k = o->nheap++;
    for (; k > 0 && h[(k - 1) / 2] > v; k = (k - 1) / 2)
        h[k] = h[(k - 1) / 2];
    h[k] = v;
}

static uint64_t pop(out_ids *o) {
    uint64_t *h = o->heap, top = h[0], last = h[--o->nheap];
    int64_t k = 0, n = o->nheap;
    for (;;) {
        int64_t c = 2 * k + 1;
        if (c >= n)
            break;
        if (c + 1 < n && h[c + 1] < h[c])
            c++;
        if (h[c] >= last)
            break;
        h[k] = h[c], k = c;
    }
    h[k] = last;
    return top;
}

/* The word's symbols o->sym[0, m) merged: the lowest rank first, the leftmost of equals (as
 * tokenizers' Word::merge_all); the result pushed to the ids. */
static void merge_all(const loom_tokenizer *t, out_ids *o, int64_t m) {
    for (int64_t i = 0; i < m; i++)
        o->prev[i] = i - 1, o->next[i] = i + 1 < m ? i + 1 : -1;
    o->nheap = 0;
    for (int64_t i = 0; i + 1 < m; i++)
        candidate(t, o, i);
    while (o->nheap) {
        uint64_t top = pop(o);
        int64_t i = (int64_t)(uint32_t)top, j = o->sym[i] >= 0 ? o->next[i] : -1;
        if (j < 0)
            continue;
        uint64_t key = (uint64_t)(uint32_t)o->sym[i] << 32 | (uint32_t)o->sym[j];
        const slot *e = table_at(&t->merges, key, NULL, 0);
        if (!e->id || (uint32_t)e->rank != (uint32_t)(top >> 32))
            continue; /* (stale: a symbol of the pair merged since) */
        o->sym[i] = e->id - 1, o->sym[j] = -1;
        o->next[i] = o->next[j];
        if (o->next[j] >= 0)
            o->prev[o->next[j]] = i;
        if (o->prev[i] >= 0)
            candidate(t, o, o->prev[i]);
        candidate(t, o, i);
    }
    for (int64_t i = 0; m > 0 && i >= 0; i = o->next[i])
        push(o, o->sym[i]);
}

/* A byte-level word (UTF-8 bytes, already well-formed) into o. */
static void bpe_bytes(const loom_tokenizer *t, const unsigned char *w, int64_t n, out_ids *o) {
    if (t->ignore_merges) { /* (the whole word, when it is a token: tokenizers' ignore_merges) */
        char buf[1024];
        int64_t k = 0;
        for (int64_t i = 0; i < n && 4 * n < (int64_t)sizeof buf; i++)
            k += loom__utf8_put(t->char_of[w[i]], buf + k);
        int32_t id = 4 * n < (int64_t)sizeof buf ? vocab_id(t, buf, k) : -1;
        if (id >= 0) {
            push(o, id);
            return;
        }
    }
    if (!word_room(o, n))
        return;
    int64_t m = 0;
    for (int64_t i = 0; i < n; i++) /* (a byte without a token is dropped, as tokenizers does) */
        if (t->byte_id[w[i]] >= 0)
            o->sym[m++] = t->byte_id[w[i]];
    merge_all(t, o, m);
}

/* A SentencePiece word (its spaces already U+2581) into o: its characters, each a token, or its
 * bytes' <0xXX> tokens, or the unknown token (consecutive ones fused with fuse_unk). */
static void bpe_chars(const loom_tokenizer *t, const unsigned char *w, int64_t n, out_ids *o) {
    int32_t whole = t->ignore_merges ? vocab_id(t, (const char *)w, n) : -1;
    if (whole >= 0) {
        push(o, whole);
        return;
    }
    if (!word_room(o, n))
        return;
    int64_t m = 0;
    for (int64_t i = 0; i < n;) {
        int len;
        next_char(w + i, n - i, &len);
        int32_t id = vocab_id(t, (const char *)w + i, len);
        bool bytes = id < 0 && t->byte_fallback;
        for (int k = 0; bytes && k < len; k++)
            bytes = t->byte_tok[w[i + k]] >= 0;
        if (id >= 0)
            o->sym[m++] = id;
        else if (bytes)
            for (int k = 0; k < len; k++)
                o->sym[m++] = t->byte_tok[w[i + k]];
        else if (t->unk >= 0 && !(t->fuse_unk && m > 0 && o->sym[m - 1] == t->unk))
            o->sym[m++] = t->unk;
        i += len;
    }
    merge_all(t, o, m);
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

/* A piece of text between added tokens (`first`: at the text's start): its words by BPE. */
static void encode_piece(const loom_tokenizer *t, const unsigned char *s, int64_t n, bool first,
                         out_ids *o) {
    if (n == 0)
        return;
    if (t->byte_level) {
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
            bpe_bytes(t, s + i, end - i, o);
            i = end;
        }
        loom__free(tmp);
        return;
    }
    /* SentencePiece's: U+2581 (3 bytes) for each space and, as the pipeline asks, in front */
    int64_t spaces = 0;
    for (int64_t i = 0; i < n; i++)
        spaces += s[i] == ' ';
    unsigned char *w = loom__malloc((size_t)(n + 2 * spaces + 3));
    if (!w) {
        o->err = LOOM_ENOMEM;
        return;
    }
    static const unsigned char meta[3] = {0xE2, 0x96, 0x81};
    int64_t k = 0;
    if (t->prepend_norm || ((t->prepend_each || (t->prepend_first && first)) && s[0] != ' '))
        memcpy(w, meta, 3), k = 3;
    for (int64_t i = 0; i < n; i++)
        if (s[i] == ' ')
            memcpy(w + k, meta, 3), k += 3;
        else
            w[k++] = s[i];
    for (int64_t i = 0; i < k && !o->err;) { /* words: the whole, or from each U+2581 on */
        int64_t end = i + 1;
        while (t->split_words && end < k && !(end + 3 <= k && !memcmp(w + end, meta, 3)))
            end++;
        if (!t->split_words)
            end = k;
        bpe_chars(t, w + i, end - i, o);
        i = end;
    }
    loom__free(w);
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
                                  bool special, int32_t **ids, int64_t *count) {
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
    for (int k = 0; special && k < t->nprefix; k++)
        push(&o, t->prefix[k]);
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
        encode_piece(t, s + from, i - from, from == 0, &o);
        push(&o, vocab_id(t, hit->s, hit->len));
        i += hit->len, from = i;
    }
    encode_piece(t, s + from, m - from, from == 0, &o);
    for (int k = 0; special && k < t->nsuffix; k++)
        push(&o, t->suffix[k]);
    loom__free(s), loom__free(o.sym), loom__free(o.prev), loom__free(o.next), loom__free(o.heap);
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
    bool start = true; /* (SentencePiece's: the text's first space is dropped) */
    for (int64_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= t->n || !t->str[ids[i]] || t->decode_as[ids[i]] & ID_SPECIAL)
            continue;
        const unsigned char *s = (const unsigned char *)t->str[ids[i]];
        int64_t len = t->slen[ids[i]];
        bool added = t->decode_as[ids[i]] & ID_ADDED;
        int byte = t->decode_as[ids[i]] & ID_BYTE ? t->decode_as[ids[i]] & 0xFF : -1;
        for (int64_t j = 0; j < len;) {
            int cl;
            int32_t c = next_char(s + j, len - j, &cl);
            char one[4];
            int m = 1;
            if (byte >= 0)
                one[0] = (char)byte, cl = (int)len; /* (<0xXX>: its byte) */
            else if (t->byte_level && !added && c < 324 && t->byte_of[c] >= 0)
                one[0] = (char)t->byte_of[c];
            else if (!t->byte_level && c == 0x2581)
                one[0] = ' ';
            else
                m = cl, memcpy(one, s + j, (size_t)cl);
            j += cl;
            if (start && t->strip_space && m == 1 && one[0] == ' ') {
                start = false;
                continue;
            }
            start = false;
            if (k + (size_t)m < size)
                memcpy(buf + k, one, (size_t)m);
            k += (size_t)m;
        }
    }
    if (size)
        buf[k < size ? k : size - 1] = 0;
    return k;
}
