/*
 * test_hf.c DIR - Hugging Face folders and tokenizers through loom's library, against the
 * fixtures tests/interop/hf_interop.py made in DIR with transformers and tokenizers themselves:
 * loom's logits of ref.safetensors' tokens equal transformers' within 1e-4 of the logits' scale,
 * for GPT-2 (a float32 folder, its shards, its bfloat16 and float16 copies) and Llama
 * (grouped-query heads with their own lm_head, float32 and bfloat16; plain heads with the head
 * tied); loom's ids of text.txt and of each hostileN.bin equal tokenizers' (text.ids,
 * hostileN.ids), and loom's decoding of them tokenizers' (text.dec, hostileN.dec).
 */
#include "harness.h"

#include <math.h>

static const char *dir;

static char *slurp(const char *name, int64_t *n) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)size + 1);
    *n = (int64_t)fread(b, 1, (size_t)size, f);
    b[*n] = 0;
    fclose(f);
    return b;
}

/* loom's logits of the reference tokens, from folder `name`, against reference `ref`. */
static void logits_match(const char *name, const char *ref) {
    char path[1024];
    snprintf(path, sizeof path, "%s/ref.safetensors", dir);
    loom_tensor_file *f;
    ASSERT_EQ(loom_tensor_file_read(path, &f), LOOM_OK);
    loom_dtype dt;
    int nd;
    const int64_t *ts, *ls;
    const int32_t *tokens = loom_tensor_file_get(f, "tokens", &dt, &nd, &ts);
    ASSERT(tokens && dt == LOOM_I32 && nd == 2);
    const float *want = loom_tensor_file_get(f, ref, &dt, &nd, &ls);
    ASSERT(want && dt == LOOM_F32 && nd == 3);
    snprintf(path, sizeof path, "%s/%s", dir, name);
    loom_model *m = loom_model_new();
    loom_hf *h;
    loom_status s = loom_hf_open(path, m, &h);
    if (s)
        FAILF("%s: %s", name, loom_last_error());
    ASSERT_EQ(loom_hf_vocab(h), ls[2]);
    loom_graph *g = loom_graph_new(m);
    loom_tensor *logits = loom_hf_forward(g, h, loom_input(g, LOOM_I32, 2, ts, tokens));
    loom_output(logits);
    ASSERT_EQ(loom_graph_run(g), LOOM_OK);
    const float *got = loom_tensor_data(logits);
    int64_t n = ls[0] * ls[1] * ls[2];
    double scale = 0, worst = 0;
    for (int64_t i = 0; i < n; i++)
        scale = fmax(scale, fabs(want[i]));
    for (int64_t i = 0; i < n; i++)
        worst = fmax(worst, fabs(got[i] - want[i]));
    printf("%s: logits within %.2e of transformers' (largest %.3f)\n", name, worst / scale, scale);
    ASSERT(scale > 0.1 && worst <= 1e-4 * scale);
    loom_graph_free(g);
    loom_hf_free(h);
    loom_model_free(m);
    loom_tensor_file_free(f);
}

TEST(gpt2_logits_equal_transformers) {
    logits_match("gpt2", "gpt2");
    logits_match("gpt2-sharded", "gpt2");
    logits_match("gpt2-bf16", "gpt2-bf16");
    logits_match("gpt2-f16", "gpt2-f16");
}

TEST(llama_logits_equal_transformers) {
    logits_match("llama-gqa", "llama-gqa"); /* 4 heads sharing 2 key and value heads, lm_head */
    logits_match("llama-gqa-bf16", "llama-gqa-bf16");
    logits_match("llama-tied", "llama-tied"); /* 4 and 4, the head tied to the embedding */
}

/* loom's ids of file `text` equal the ids file `ids`, and decoding them gives file `dec`'s
 * bytes (tokenizers' decode, special tokens skipped). */
static void ids_match(const loom_tokenizer *tok, const char *text, const char *ids,
                      const char *dec) {
    int64_t nt, ni, nd;
    char *t = slurp(text, &nt), *want = slurp(ids, &ni), *back_want = slurp(dec, &nd);
    ASSERT(t && want && back_want && ni % 4 == 0);
    int32_t *got;
    int64_t n;
    ASSERT_EQ(loom_tokenizer_encode(tok, t, nt, false, &got, &n), LOOM_OK);
    int64_t first = -1;
    for (int64_t i = 0; i < n && i < ni / 4 && first < 0; i++)
        if (got[i] != ((const int32_t *)(const void *)want)[i])
            first = i;
    if (n != ni / 4 || first >= 0)
        FAILF("%s: %lld ids, tokenizers' %lld; first different at %lld", text, (long long)n,
              (long long)(ni / 4), (long long)first);
    size_t len = loom_tokenizer_decode(tok, got, n, NULL, 0);
    char *back = malloc(len + 1);
    loom_tokenizer_decode(tok, got, n, back, len + 1);
    if ((int64_t)len != nd || memcmp(back, back_want, (size_t)nd))
        FAILF("%s: decoded to %zu bytes, tokenizers' decode %lld", text, len, (long long)nd);
    free(back);
    loom_tokenizer_ids_free(got);
    free(t), free(want), free(back_want);
}

/* Tokenizer `json` against the ids and decodings named with `prefix` (hf_interop.py's
 * write_cases). */
static void tokenizer_matches(const char *json, const char *prefix) {
    char path[1024], a[128], b[128], c[128];
    snprintf(path, sizeof path, "%s/%s", dir, json);
    loom_tokenizer *tok;
    if (loom_tokenizer_load(path, &tok))
        FAILF("%s: %s", json, loom_last_error());
    snprintf(a, sizeof a, "%stext.ids", prefix), snprintf(b, sizeof b, "%stext.dec", prefix);
    ids_match(tok, "text.txt", a, b);
    for (int i = 0;; i++) {
        char bin[64], p[1100];
        snprintf(bin, sizeof bin, "hostile%d.bin", i);
        snprintf(p, sizeof p, "%s/%s", dir, bin);
        FILE *f = fopen(p, "rb");
        if (!f) {
            ASSERT(i >= 9);
            break;
        }
        fclose(f);
        snprintf(a, sizeof a, "%shostile%d.ids", prefix, i);
        snprintf(c, sizeof c, "%shostile%d.dec", prefix, i);
        ids_match(tok, bin, a, c);
    }
    loom_tokenizer_free(tok);
}

TEST(tokenizer_ids_equal_tokenizers) {
    tokenizer_matches("tokenizer.json", "");             /* byte-level (GPT-2's) */
    tokenizer_matches("sp-norm.json", "sp-norm.");       /* Llama 2's: normalizers, byte fallback */
    tokenizer_matches("sp-meta.json", "sp-meta.");       /* the same by a Metaspace pre-tokenizer */
    tokenizer_matches("sp-metadec.json", "sp-metadec."); /* and decoder */
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: test_hf DIR (made by tests/interop/hf_interop.py)\n");
        return 2;
    }
    dir = argv[1];
    RUN(gpt2_logits_equal_transformers);
    RUN(llama_logits_equal_transformers);
    RUN(tokenizer_ids_equal_tokenizers);
    return HARNESS_EXIT();
}
