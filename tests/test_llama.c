/*
 * test_llama.c - the Llama (loom_llama_*) and Hugging Face folders (loom_hf_*) without Python (so
 * that the sanitizer builds run them; tests/interop/hf_interop.py holds them to transformers):
 *   - the logits of a small Llama with grouped-query heads equal an independent naive forward in
 *     double (RMSNorm, rotate_half rotary embeddings, causal softmax attention with each key and
 *     value head shared by two query heads, SwiGLU);
 *   - its gradients equal central finite differences of that naive forward's loss;
 *   - a folder of it (config.json, model.safetensors) opens with loom_hf_open to bitwise the same
 *     logits, loom_hf_save writes one that opens again the same (torch_dtype float32), and bad
 *     folders are refused naming the field or the tensor.
 */
#include "harness.h"

#include <math.h>
#include <sys/stat.h>
#include <unistd.h>

static const loom_llama_config cfg = {.vocab = 11,
                                      .context = 8,
                                      .layers = 2,
                                      .heads = 4,
                                      .kv_heads = 2,
                                      .width = 16,
                                      .inner = 24,
                                      .eps = 1e-5,
                                      .rope_theta = 100.0,
                                      .tied = false};
enum { B = 2, T = 7 };
static const int32_t tokens[B * T] = {1, 5, 2, 9, 10, 0, 3, 4, 4, 7, 1, 6, 8, 2};
static const int32_t labels[B * T] = {5, 2, 9, 10, 0, 3, 4, 4, 7, 1, 6, 8, 2, 3};

static loom_llama *model(loom_model *m) {
    loom_llama *l = loom_llama_new(m, &cfg);
    for (int i = 0; l && i < loom_model_count(m); i++) { /* (norm weights away from 1 too) */
        loom_param *p = loom_model_at(m, i);
        bool norm = loom_param_ndim(p) == 1;
        test_fill(loom_param_data(p), loom_param_numel(p), 70 + (uint64_t)i, norm ? 0.5 : -0.3,
                  norm ? 1.5 : 0.3);
    }
    if (l)
        loom_model_touch(m);
    return l;
}

static const float *param(loom_model *m, const char *fmt, int layer) {
    char name[128];
    snprintf(name, sizeof name, fmt, layer);
    loom_param *p = loom_model_find(m, name);
    return p ? loom_param_data(p) : NULL;
}

/* y (n) = W (n, k) x (k), in double. */
static void matvec(const float *w, const double *x, int n, int k, double *y) {
    for (int i = 0; i < n; i++) {
        double s = 0;
        for (int j = 0; j < k; j++)
            s += (double)w[i * k + j] * x[j];
        y[i] = s;
    }
}

static void rms(const double *x, const float *w, double *y) {
    double s = 0;
    for (int j = 0; j < cfg.width; j++)
        s += x[j] * x[j];
    double r = 1 / sqrt(s / (double)cfg.width + cfg.eps);
    for (int j = 0; j < cfg.width; j++)
        y[j] = x[j] * r * w[j];
}

/* rotate_half's rotation of one head's vector v (D) at position t. */
static void rope(double *v, int t, int D) {
    double out[16];
    for (int i = 0; i < D; i++) {
        int f = i % (D / 2);
        double a = t / pow(cfg.rope_theta, 2.0 * f / D);
        double rot = i < D / 2 ? -v[i + D / 2] : v[i - D / 2];
        out[i] = v[i] * cos(a) + rot * sin(a);
    }
    memcpy(v, out, sizeof(double) * (size_t)D);
}

/* The naive forward in double: logits (B, T, vocab), and the mean cross entropy. */
static double naive(loom_model *m, double *logits) {
    enum { C = 16, H = 4, K = 2, D = 4, F = 24, V = 11 };
    static double x[B][T][C], q[T][H * D], k[T][K * D], v[T][K * D];
    double a[C], o[C], g[F], u[F], h[F], y[C];
    const float *embed = param(m, "model.embed_tokens.weight", 0);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int j = 0; j < C; j++)
                x[b][t][j] = embed[tokens[b * T + t] * C + j];
    for (int l = 0; l < cfg.layers; l++)
        for (int b = 0; b < B; b++) {
            for (int t = 0; t < T; t++) {
                rms(x[b][t], param(m, "model.layers.%d.input_layernorm.weight", l), a);
                matvec(param(m, "model.layers.%d.self_attn.q_proj.weight", l), a, H * D, C, q[t]);
                matvec(param(m, "model.layers.%d.self_attn.k_proj.weight", l), a, K * D, C, k[t]);
                matvec(param(m, "model.layers.%d.self_attn.v_proj.weight", l), a, K * D, C, v[t]);
                for (int hh = 0; hh < H; hh++)
                    rope(q[t] + hh * D, t, D);
                for (int hh = 0; hh < K; hh++)
                    rope(k[t] + hh * D, t, D);
            }
            for (int t = 0; t < T; t++) {
                double att[C] = {0};
                for (int hh = 0; hh < H; hh++) {
                    int kv = hh / (H / K);
                    double p[T], mx = -INFINITY, sum = 0;
                    for (int s = 0; s <= t; s++) {
                        double dot = 0;
                        for (int d = 0; d < D; d++)
                            dot += q[t][hh * D + d] * k[s][kv * D + d];
                        p[s] = dot / sqrt((double)D), mx = fmax(mx, p[s]);
                    }
                    for (int s = 0; s <= t; s++)
                        sum += (p[s] = exp(p[s] - mx));
                    for (int s = 0; s <= t; s++)
                        for (int d = 0; d < D; d++)
                            att[hh * D + d] += p[s] / sum * v[s][kv * D + d];
                }
                matvec(param(m, "model.layers.%d.self_attn.o_proj.weight", l), att, C, C, o);
                for (int j = 0; j < C; j++)
                    x[b][t][j] += o[j];
            }
            for (int t = 0; t < T; t++) {
                rms(x[b][t], param(m, "model.layers.%d.post_attention_layernorm.weight", l), a);
                matvec(param(m, "model.layers.%d.mlp.gate_proj.weight", l), a, F, C, g);
                matvec(param(m, "model.layers.%d.mlp.up_proj.weight", l), a, F, C, u);
                for (int j = 0; j < F; j++)
                    h[j] = g[j] / (1 + exp(-g[j])) * u[j];
                matvec(param(m, "model.layers.%d.mlp.down_proj.weight", l), h, C, F, y);
                for (int j = 0; j < C; j++)
                    x[b][t][j] += y[j];
            }
        }
    double loss = 0;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            double *z = logits + (b * T + t) * V, mx = -INFINITY, sum = 0;
            rms(x[b][t], param(m, "model.norm.weight", 0), a);
            matvec(param(m, "lm_head.weight", 0), a, V, C, z);
            for (int j = 0; j < V; j++)
                mx = fmax(mx, z[j]);
            for (int j = 0; j < V; j++)
                sum += exp(z[j] - mx);
            loss += mx + log(sum) - z[labels[b * T + t]];
        }
    return loss / (B * T);
}

/* loom's logits of the tokens (B, T, vocab) into out, from a forward of `forward`. */
static void loom_logits(loom_model *m, loom_tensor *(*forward)(loom_graph *, void *, loom_tensor *),
                        void *net, float *out) {
    int64_t s[2] = {B, T};
    loom_graph *g = loom_graph_new(m);
    loom_tensor *z = forward(g, net, loom_input(g, LOOM_I32, 2, s, tokens));
    loom_output(z);
    ASSERT_EQ(loom_graph_run(g), LOOM_OK);
    memcpy(out, loom_tensor_data(z), sizeof(float) * B * T * 11);
    loom_graph_free(g);
}

static loom_tensor *llama_fwd(loom_graph *g, void *l, loom_tensor *x) {
    return loom_llama_forward(g, l, x);
}

static loom_tensor *hf_fwd(loom_graph *g, void *h, loom_tensor *x) {
    return loom_hf_forward(g, h, x);
}

TEST(logits_equal_a_naive_forward) {
    loom_model *m = loom_model_new();
    loom_llama *l = model(m);
    ASSERT(l);
    static float got[B * T * 11];
    static double want[B * T * 11];
    loom_logits(m, llama_fwd, l, got);
    naive(m, want);
    double worst = 0, scale = 0;
    for (int i = 0; i < B * T * 11; i++)
        worst = fmax(worst, fabs(got[i] - want[i])), scale = fmax(scale, fabs(want[i]));
    fprintf(stderr, "logits within %.2e of the naive forward's (largest %.3f)\n", worst / scale,
            scale);
    ASSERT(scale > 0.1 && worst <= 1e-5 * scale);
    loom_llama_free(l);
    loom_model_free(m);
}

TEST(gradients_equal_finite_differences) {
    loom_model *m = loom_model_new();
    loom_llama *l = model(m);
    ASSERT(l);
    int64_t s[2] = {B, T};
    loom_graph *g = loom_graph_new(m);
    loom_tensor *loss =
        loom_cross_entropy(g, loom_llama_forward(g, l, loom_input(g, LOOM_I32, 2, s, tokens)),
                           loom_input(g, LOOM_I32, 2, s, labels));
    loom_backward(g, loss);
    ASSERT_EQ(loom_graph_run(g), LOOM_OK);
    static double z[B * T * 11];
    double worst = 0;
    int checked = 0;
    for (int i = 0; i < loom_model_count(m); i++) { /* three elements of every parameter */
        loom_param *p = loom_model_at(m, i);
        for (int64_t e = 0; e < loom_param_numel(p); e += loom_param_numel(p) / 3 + 1) {
            float *w = loom_param_data(p), keep = w[e];
            double h = 1e-2, up, down;
            w[e] = keep + (float)h;
            up = naive(m, z);
            w[e] = keep - (float)h;
            down = naive(m, z);
            w[e] = keep;
            double fd = (up - down) / (2 * h), got = loom_param_grad(p)[e];
            worst = fmax(worst, fabs(got - fd) / (fabs(fd) + 1e-3));
            checked++;
        }
    }
    fprintf(stderr, "%d gradients within %.2e (relative) of central differences\n", checked, worst);
    ASSERT(checked > 40 && worst < 2e-3);
    loom_graph_free(g);
    loom_llama_free(l);
    loom_model_free(m);
}

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    ASSERT(f);
    fputs(text, f);
    fclose(f);
}

/* The file at path, NUL-terminated, into text (at most size - 1 bytes); false if unread. */
static bool read_text(const char *path, char *text, size_t size) {
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(text, 1, size - 1, f) : 0;
    if (f)
        fclose(f);
    text[n] = 0;
    return n > 0;
}

static const char config[] =
    "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", \"vocab_size\": 11,\n"
    " \"hidden_size\": 16, \"intermediate_size\": 24, \"num_hidden_layers\": 2,\n"
    " \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"max_position_embeddings\": 8,\n"
    " \"rms_norm_eps\": 1e-05, \"rope_theta\": 100.0, \"hidden_act\": \"silu\",\n"
    " \"tie_word_embeddings\": false, \"torch_dtype\": \"bfloat16\", \"rope_scaling\": null}\n";

/* A folder of dir/name with config.json (text) and the model's weights. */
static void folder(const char *dir, const char *text, loom_model *m) {
    char path[1024];
    mkdir(dir, 0777);
    snprintf(path, sizeof path, "%s/config.json", dir);
    write_text(path, text);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    ASSERT_EQ(loom_model_save(m, path), LOOM_OK);
}

/* loom_hf_open of dir fails with status s and a message holding `what`. */
static void refused(const char *dir, loom_status s, const char *what) {
    loom_model *m = loom_model_new();
    loom_hf *h;
    ASSERT_EQ(loom_hf_open(dir, m, &h), s);
    ASSERT_STR_CONTAINS(loom_last_error(), what);
    ASSERT(h == NULL);
    loom_model_free(m);
}

TEST(folders_open_save_and_refuse) {
    loom_model *m = loom_model_new();
    loom_llama *l = model(m);
    ASSERT(l);
    static float want[B * T * 11], got[B * T * 11];
    loom_logits(m, llama_fwd, l, want);
    char dir[512], out[512], bad[600], path[1100];
    test_tmp(dir, sizeof dir, "llama-folder");
    test_tmp(out, sizeof out, "llama-saved");
    folder(dir, config, m);
    for (int round = 0; round < 2; round++) { /* the folder, then loom's copy of it */
        loom_model *m2 = loom_model_new();
        loom_hf *h;
        if (loom_hf_open(round ? out : dir, m2, &h))
            FAILF("%s", loom_last_error());
        ASSERT(loom_hf_vocab(h) == 11 && loom_hf_context(h) == 8);
        loom_logits(m2, hf_fwd, h, got);
        ASSERT(!memcmp(got, want, sizeof got));
        if (!round)
            ASSERT_EQ(loom_hf_save(h, out), LOOM_OK);
        loom_hf_free(h);
        loom_model_free(m2);
    }
    { /* the copy's config: the same, but for torch_dtype */
        char text[4096];
        snprintf(path, sizeof path, "%s/config.json", out);
        ASSERT(read_text(path, text, sizeof text));
        ASSERT_STR_CONTAINS(text, "\"torch_dtype\": \"float32\"");
        ASSERT_STR_CONTAINS(text, "\"rope_theta\": 100.0");
    }
    { /* a config without torch_dtype: the saved one says float32 all the same */
        char plain[sizeof config], path2[700];
        const char *at = strstr(config, ", \"torch_dtype\": \"bfloat16\"");
        ASSERT(at);
        snprintf(plain, sizeof plain, "%.*s%s", (int)(at - config), config,
                 at + strlen(", \"torch_dtype\": \"bfloat16\""));
        snprintf(bad, sizeof bad, "%s-nodtype", dir);
        folder(bad, plain, m);
        loom_model *m2 = loom_model_new();
        loom_hf *h;
        ASSERT_EQ(loom_hf_open(bad, m2, &h), LOOM_OK);
        snprintf(path2, sizeof path2, "%s-saved", bad);
        ASSERT_EQ(loom_hf_save(h, path2), LOOM_OK);
        char text[4096];
        snprintf(path, sizeof path, "%s/config.json", path2);
        ASSERT(read_text(path, text, sizeof text));
        ASSERT_STR_CONTAINS(text, "\"rope_scaling\": null,\n  \"torch_dtype\": \"float32\"\n}");
        loom_hf_free(h);
        loom_model_free(m2);
    }
    const struct {
        const char *from, *to;
        loom_status s;
        const char *what;
    } cases[] = {
        {"\"model_type\": \"llama\"", "\"model_type\": \"bert\"", LOOM_EUNSUPPORTED,
         "field \"model_type\": 'bert'"},
        {"\"rope_scaling\": null", "\"rope_scaling\": {\"factor\": 2}", LOOM_EUNSUPPORTED,
         "field \"rope_scaling\""},
        {"\"num_key_value_heads\": 2", "\"num_key_value_heads\": 3", LOOM_EFORMAT,
         "field \"num_attention_heads\""},
        {"\"intermediate_size\": 24", "\"intermediate_size\": 20", LOOM_ESHAPE,
         "tensor 'model.layers.0.mlp.gate_proj.weight' is float (24,16), config.json makes it "
         "(20,16)"},
        {"\"hidden_act\": \"silu\"", "\"hidden_act\": \"gelu\"", LOOM_EUNSUPPORTED,
         "field \"hidden_act\""},
        {"\"vocab_size\": 11,", "\"vocab_size\": 11", LOOM_EFORMAT, "malformed JSON at byte"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        char text[sizeof config + 64];
        const char *at = strstr(config, cases[c].from);
        ASSERT(at);
        snprintf(text, sizeof text, "%.*s%s%s", (int)(at - config), config, cases[c].to,
                 at + strlen(cases[c].from));
        snprintf(bad, sizeof bad, "%s-bad%zu", dir, c);
        folder(bad, text, m);
        refused(bad, cases[c].s, cases[c].what);
    }
    snprintf(bad, sizeof bad, "%s-bad0", dir); /* a folder without weights */
    snprintf(path, sizeof path, "%s/model.safetensors", bad);
    unlink(path);
    snprintf(path, sizeof path, "%s/config.json", bad);
    write_text(path, config);
    refused(bad, LOOM_ENOTFOUND, "no model.safetensors nor model.safetensors.index.json");
    loom_llama_free(l);
    loom_model_free(m);
}

int main(void) {
    RUN(logits_equal_a_naive_forward);
    RUN(gradients_equal_finite_differences);
    RUN(folders_open_save_and_refuse);
    return HARNESS_EXIT();
}
