/*
 * fuzz_tokenizer.c - libFuzzer target: tokenizer.json files (the JSON reader, the BPE model's
 * checks) and the encoder. The first byte chooses: bit 0 clear, the rest is a tokenizer.json to
 * load (and, when it loads, to encode its own text with); set, the rest is text for a byte-level
 * tokenizer built here (every byte's character, merges over a few pairs, one added token). Ids
 * must lie below the vocabulary, and text that is UTF-8 must decode back from its ids. Nothing
 * may crash, leak or read past its buffers.
 */
#include "fuzz.h"
#include "loom.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* GPT-2's character for byte b as UTF-8 into out; its length. */
static int byte_char(int b, char *out) {
    int n = 0, c = b;
    for (int k = 0; k < 256; k++) {
        bool printable = (k >= '!' && k <= '~') || (k >= 0xA1 && k <= 0xAC) || k >= 0xAE;
        if (k == b) {
            c = printable ? k : 256 + n;
            break;
        }
        n += !printable;
    }
    if (c < 0x80)
        return out[0] = (char)c, 1;
    out[0] = (char)(0xC0 | c >> 6), out[1] = (char)(0x80 | (c & 0x3F));
    return 2;
}

static loom_tokenizer *byte_level(void) {
    static char json[16384];
    size_t k = (size_t)snprintf(json, sizeof json,
                                "{\"added_tokens\":[{\"id\":262,\"content\":\"<|end|>\"}],"
                                "\"pre_tokenizer\":{\"type\":\"ByteLevel\"},\"model\":{\"type\":"
                                "\"BPE\",\"vocab\":{");
    for (int b = 0; b < 256; b++) {
        char u[3] = {0};
        int n = byte_char(b, u);
        k += (size_t)snprintf(json + k, sizeof json - k, "%s\"%s%.*s\":%d", b ? "," : "",
                              b == '"' || b == '\\' ? "\\" : "", n, u, b);
    }
    k += (size_t)snprintf(json + k, sizeof json - k,
                          ",\"th\":256,\"the\":257,\"\\u0120t\":258,\"\\u0120the\":259,\"ee\":260,"
                          "\"eee\":261},\"merges\":[\"t h\",\"th e\",\"\\u0120 t\",\"\\u0120 the\","
                          "\"e e\",\"ee e\"]}}");
    const char *path = fuzz_file(1, ".json", (const uint8_t *)json, k);
    loom_tokenizer *t = NULL;
    if (loom_tokenizer_load(path, &t) != LOOM_OK)
        fprintf(stderr, "%s\n", loom_last_error()), abort(); /* (the target's own tokenizer) */
    return t;
}

/* Whether s (n bytes) is UTF-8 as Unicode defines it. */
static bool utf8(const uint8_t *s, size_t n) {
    for (size_t i = 0; i < n;) {
        unsigned c = s[i];
        int need = c < 0x80                 ? 0
                   : c >= 0xC2 && c <= 0xDF ? 1
                   : c >= 0xE0 && c <= 0xEF ? 2
                   : c >= 0xF0 && c <= 0xF4 ? 3
                                            : -1;
        if (need < 0 || n - i < (size_t)need + 1)
            return false;
        unsigned lo = c == 0xE0 ? 0xA0 : c == 0xF0 ? 0x90 : 0x80;
        unsigned hi = c == 0xED ? 0x9F : c == 0xF4 ? 0x8F : 0xBF;
        for (int k = 1; k <= need; k++)
            if (s[i + k] < (k == 1 ? lo : 0x80) || s[i + k] > (k == 1 ? hi : 0xBF))
                return false;
        i += 1 + (size_t)need;
    }
    return true;
}

static void encode(const loom_tokenizer *t, const uint8_t *s, size_t n, bool round) {
    int32_t *ids = NULL;
    int64_t count = 0;
    if (loom_tokenizer_encode(t, (const char *)s, (int64_t)n, false, &ids, &count) != LOOM_OK)
        abort();
    for (int64_t i = 0; i < count; i++)
        if (ids[i] < 0 || ids[i] >= loom_tokenizer_vocab(t))
            abort();
    if (round && utf8(s, n)) {
        size_t len = loom_tokenizer_decode(t, ids, count, NULL, 0);
        char *back = malloc(len + 1);
        if (!back || loom_tokenizer_decode(t, ids, count, back, len + 1) != len || len != n ||
            memcmp(back, s, n))
            abort();
        free(back);
    }
    loom_tokenizer_ids_free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static loom_tokenizer *fixed;
    if (size < 1)
        return 0;
    if (data[0] & 1) {
        if (!fixed)
            fixed = byte_level();
        encode(fixed, data + 1, size - 1, true);
        return 0;
    }
    const char *path = fuzz_file(0, ".json", data + 1, size - 1);
    loom_tokenizer *t = NULL;
    if (loom_tokenizer_load(path, &t) == LOOM_OK)
        encode(t, data + 1, size - 1, false);
    loom_tokenizer_free(t);
    return 0;
}
