/*
 * fuzz_text.c - libFuzzer target: the text reader (loom_text_load), plain and gzip'd. The first
 * byte chooses: bit 0 writes the rest gzip-compressed (so mutations reach the text), bit 1 as
 * it is, a gzip stream of its own to be mutated. An accepted text must hold what the reader
 * promises: at least two distinct characters, splits that add up, tokens below the vocabulary
 * that decode to UTF-8 that encodes back to them, batches within the training split. Nothing may
 * crash, leak or allocate past what the file holds.
 */
#include "fuzz.h"
#include "loom.h"

#include <zlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(const loom_text *t) {
    int64_t v = loom_text_vocab(t), ntr = loom_text_count(t, false), nva = loom_text_count(t, true);
    if (v < 2 || ntr < 0 || nva < 0 || ntr + nva < 1)
        abort();
    int32_t tok[64], back[64 * 4 + 1];
    int64_t n = ntr < 64 ? ntr : 64, m = 0;
    if (n > 0 && loom_text_tokens(t, false, 0, n, tok))
        abort();
    for (int64_t i = 0; i < n; i++)
        if (tok[i] < 0 || tok[i] >= v)
            abort();
    char text[64 * 4 + 1];
    size_t bytes = loom_text_decode(t, tok, n, text, sizeof text);
    bool nul = strlen(text) != bytes; /* (a U+0000 in the text: C strings end there) */
    if (!nul && (loom_text_encode(t, text, back, &m) || m != n ||
                 memcmp(back, tok, sizeof *tok * (size_t)n)))
        abort();
    if (loom_text_tokens(t, true, nva, 1, tok) != LOOM_EINVAL)
        abort();
    int32_t x[3 * 4], y[3 * 4];
    loom_status s = loom_text_batch(t, 1, 3, 4, 7, true, x, y);
    if (s == LOOM_OK)
        for (int i = 0; i < 12; i++)
            if (x[i] < 0 || x[i] >= v || y[i] < 0 || y[i] >= v)
                abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1)
        return 0;
    const char *path;
    if (data[0] & 1) {
        path = fuzz_file(0, ".gz", NULL, 0);
        gzFile f = gzopen(path, "wb");
        if (!f)
            abort();
        if (size > 1)
            gzwrite(f, data + 1, (unsigned)(size - 1));
        gzclose(f);
    } else {
        path = fuzz_file(0, ".txt", data + 1, size - 1);
    }
    loom_text *t = NULL;
    if (loom_text_load(path, &t) == LOOM_OK)
        check(t);
    loom_text_free(t);
    return 0;
}
