/*
 * llama.c - a Llama as Hugging Face's LlamaForCausalLM writes it (SmolLM, TinyLlama): token
 * embeddings, `layers` pre-norm residual blocks of causal self-attention with rotary position
 * embeddings and grouped-query heads, and a SwiGLU MLP, RMSNorm everywhere, the output
 * projection its own or tied to the embedding. Built from the library's general ops; the
 * parameters carry transformers' state_dict names.
 *
 *   x = embed_tokens[idx]
 *   for each block:  x = x + o_proj(attn(rms(x) input_layernorm))
 *                    x = x + down_proj(silu(gate_proj(a)) * up_proj(a)), a = rms(x)
 * post_attention_layernorm logits = rms(x) norm lm_head^T rms(x) = x / sqrt(mean(x^2) + eps) attn:
 * q, k, v = q_proj, k_proj, v_proj of the input, each head's q and k rotated by position (HF's
 * rotate_half: x cos + (-x2, x1) sin, frequencies theta^(-2i/D)), the kv_heads key and value heads
 * each shared by heads / kv_heads query heads.
 *
 * The attention runs on loom_attention's packed (B, T, 3, H, D) layout: the queries, keys and
 * values are projected apart (the key and value heads only once each), rotated (by a (T, 1, D)
 * table of cosines and sines and the fixed matrix that maps x to rotate_half(x)), the key and
 * value heads repeated for their query heads (expand), and the three put side by side by two
 * selects over a (1, 3, 1) mask: elementwise work on the activations, none on the weights.
 */
#include "internal.h"

#include <math.h>
#include <string.h>

typedef struct {
    loom_param *in_norm, *q, *k, *v, *o, *post_norm, *gate, *up, *down;
} block;

struct loom_llama {
    loom_model *m;
    loom_llama_config c;
    loom_param *embed, *norm, *head; /* head: embed when tied */
    block *blocks;
    float *cos, *sin;          /* (context, 1, D) */
    float *rot;                /* (D, D): x rot = rotate_half(x) */
    float first[3], second[3]; /* the packing's masks: the queries' part, the keys' */
};

static loom_param *add(loom_model *m, const char *name, int ndim, int64_t d0, int64_t d1) {
    int64_t s[2] = {d0, d1};
    return loom_model_add(m, name, ndim, s);
}

/* The rotation's tables, in float32 as transformers computes them: inv_freq = 1 / theta^(2i /
 * D), angle = position inv_freq, cos and sin of it, the halves repeated. */
static void rope_tables(loom_llama *l) {
    int64_t D = l->c.width / l->c.heads, half = D / 2;
    for (int64_t t = 0; t < l->c.context; t++)
        for (int64_t i = 0; i < half; i++) {
            float inv = 1.0f / powf((float)l->c.rope_theta, (float)(2 * i) / (float)D);
            float a = (float)t * inv;
            l->cos[t * D + i] = l->cos[t * D + i + half] = cosf(a);
            l->sin[t * D + i] = l->sin[t * D + i + half] = sinf(a);
        }
    for (int64_t i = 0; i < half; i++) { /* rotate_half(x) = (-x[half:], x[:half]) */
        l->rot[(i + half) * D + i] = -1.0f;
        l->rot[i * D + i + half] = 1.0f;
    }
}

loom_llama *loom_llama_new(loom_model *m, const loom_llama_config *c) {
    const int64_t most = (int64_t)1 << 24;
    bool sizes = c && c->vocab >= 1 && c->context >= 1 && c->layers >= 1 && c->heads >= 1 &&
                 c->kv_heads >= 1 && c->width >= 1 && c->inner >= 1 && c->vocab <= most &&
                 c->context <= most && c->layers <= most && c->heads <= most && c->width <= most &&
                 c->inner <= most;
    if (!m || !sizes || c->width % c->heads != 0 || (c->width / c->heads) % 2 != 0 ||
        c->heads % c->kv_heads != 0 || !(c->eps > 0 && c->eps < 1) || !(c->rope_theta > 0)) {
        loom__error(LOOM_EINVAL,
                    "loom_llama_new: vocabulary %lld, context %lld, %lld layers, %lld heads (%lld "
                    "key and value heads), width %lld, MLP %lld: expected sizes from 1 to 2^24, an "
                    "even head width, key and value heads dividing the heads, 0 < eps < 1, "
                    "rope_theta > 0",
                    c ? (long long)c->vocab : 0, c ? (long long)c->context : 0,
                    c ? (long long)c->layers : 0, c ? (long long)c->heads : 0,
                    c ? (long long)c->kv_heads : 0, c ? (long long)c->width : 0,
                    c ? (long long)c->inner : 0);
        return NULL;
    }
    int64_t C = c->width, D = C / c->heads, HD = C, KD = c->kv_heads * D;
    loom_llama *l = loom__calloc(1, sizeof *l);
    if (l) {
        l->m = m, l->c = *c;
        l->blocks = loom__calloc((size_t)c->layers, sizeof *l->blocks);
        l->cos = loom__malloc(sizeof(float) * 2 * (size_t)(c->context * D));
        l->rot = loom__calloc((size_t)(D * D), sizeof(float));
    }
    if (!l || !l->blocks || !l->cos || !l->rot) {
        loom_llama_free(l);
        return NULL;
    }
    l->sin = l->cos + c->context * D;
    l->first[0] = 1, l->second[1] = 1;
    rope_tables(l);
    bool ok = (l->embed = add(m, "model.embed_tokens.weight", 2, c->vocab, C)) != NULL;
    for (int64_t i = 0; ok && i < c->layers; i++) {
        block *b = &l->blocks[i];
        char name[96];
#define ADD(field, suffix, nd, d0, d1)                                          \
    (snprintf(name, sizeof name, "model.layers.%lld.%s", (long long)i, suffix), \
     (b->field = add(m, name, nd, d0, d1)) != NULL)
        ok = ADD(in_norm, "input_layernorm.weight", 1, C, 0) &&
             ADD(q, "self_attn.q_proj.weight", 2, HD, C) &&
             ADD(k, "self_attn.k_proj.weight", 2, KD, C) &&
             ADD(v, "self_attn.v_proj.weight", 2, KD, C) &&
             ADD(o, "self_attn.o_proj.weight", 2, C, HD) &&
             ADD(post_norm, "post_attention_layernorm.weight", 1, C, 0) &&
             ADD(gate, "mlp.gate_proj.weight", 2, c->inner, C) &&
             ADD(up, "mlp.up_proj.weight", 2, c->inner, C) &&
             ADD(down, "mlp.down_proj.weight", 2, C, c->inner);
#undef ADD
    }
    ok = ok && (l->norm = add(m, "model.norm.weight", 1, C, 0)) != NULL;
    if (ok && c->tied)
        ok = !loom_model_tie(m, "lm_head.weight", l->embed), l->head = l->embed;
    else if (ok)
        ok = (l->head = add(m, "lm_head.weight", 2, c->vocab, C)) != NULL;
    if (!ok) {
        loom_llama_free(l);
        return NULL;
    }
    return l;
}

void loom_llama_free(loom_llama *l) {
    if (!l)
        return;
    loom__free(l->blocks);
    loom__free(l->cos);
    loom__free(l->rot);
    loom__free(l);
}

const loom_llama_config *loom_llama_get_config(const loom_llama *l) {
    return &l->c;
}

void loom_llama_init(loom_llama *l, uint64_t seed) {
    loom__fill_normal(l->embed, seed, 0.02);
    for (int64_t i = 0; i < l->c.layers; i++) {
        block *b = &l->blocks[i];
        loom_param *w[] = {b->q, b->k, b->v, b->o, b->gate, b->up, b->down};
        for (size_t k = 0; k < sizeof w / sizeof *w; k++)
            loom__fill_normal(w[k], seed, 0.02);
        loom__fill_ones(b->in_norm), loom__fill_ones(b->post_norm);
    }
    loom__fill_ones(l->norm);
    if (l->head != l->embed)
        loom__fill_normal(l->head, seed, 0.02);
    loom_model_touch(l->m);
}

/* x / sqrt(mean(x^2) + eps) times the weight, along the last axis of x (R, C). */
static loom_tensor *rms(loom_graph *g, const loom_llama *l, loom_tensor *x, loom_param *w) {
    loom_tensor *ms = loom_mul(g, loom_sum(g, loom_mul(g, x, x), -1),
                               loom_scalar(g, 1.0 / (double)l->c.width, LOOM_F32));
    loom_tensor *r = loom_sqrt(g, loom_add(g, ms, loom_scalar(g, l->c.eps, LOOM_F32)));
    return loom_mul(g, loom_div(g, x, r), loom_parameter(g, w));
}

/* x W^T for a weight W (out, in). */
static loom_tensor *proj(loom_graph *g, loom_tensor *x, loom_param *w) {
    return loom_matmul(g, x, loom_transpose(g, loom_parameter(g, w)));
}

/* x sigmoid(x), the sigmoid as (1 + tanh(x / 2)) / 2: finite gradients for any x. */
static loom_tensor *silu(loom_graph *g, loom_tensor *x) {
    loom_tensor *t = loom_tanh(g, loom_mul(g, x, loom_scalar(g, 0.5, LOOM_F32)));
    return loom_mul(g, loom_mul(g, x, loom_scalar(g, 0.5, LOOM_F32)),
                    loom_add(g, t, loom_scalar(g, 1.0, LOOM_F32)));
}

/* x (B T, n D) with each of its n heads rotated by position: x cos + rotate_half(x) sin. */
static loom_tensor *rotate(loom_graph *g, const loom_llama *l, loom_tensor *x, int64_t B, int64_t T,
                           int64_t n) {
    int64_t D = l->c.width / l->c.heads, heads[4] = {B, T, n, D}, rows[2] = {B * T * n, D};
    int64_t table[3] = {T, 1, D}, dd[2] = {D, D}, flat[2] = {B * T, n * D};
    loom_tensor *turned =
        loom_matmul(g, loom_reshape(g, x, 2, rows), loom_input(g, LOOM_F32, 2, dd, l->rot));
    loom_tensor *y = loom_add(
        g, loom_mul(g, loom_reshape(g, x, 4, heads), loom_input(g, LOOM_F32, 3, table, l->cos)),
        loom_mul(g, loom_reshape(g, turned, 4, heads), loom_input(g, LOOM_F32, 3, table, l->sin)));
    return loom_reshape(g, y, 2, flat);
}

/* x (R, kv_heads D) with each key or value head repeated for its heads / kv_heads query heads
 * (transformers' repeat_kv), as (R, 1, H D) ready to be expanded into the packing. */
static loom_tensor *repeated(loom_graph *g, const loom_llama *l, loom_tensor *x, int64_t R) {
    int64_t H = l->c.heads, K = l->c.kv_heads, D = l->c.width / H;
    int64_t one[4] = {R, K, 1, D}, many[4] = {R, K, H / K, D}, out[3] = {R, 1, H * D};
    if (K != H)
        x = loom_expand(g, loom_reshape(g, x, 4, one), 4, many);
    return loom_reshape(g, x, 3, out);
}

static loom_tensor *attention(loom_graph *g, const loom_llama *l, const block *b, loom_tensor *a,
                              int64_t B, int64_t T) {
    int64_t C = l->c.width, H = l->c.heads, D = C / H, R = B * T;
    int64_t q1[3] = {R, 1, C}, three[3] = {R, 3, C}, mask[3] = {1, 3, 1};
    int64_t pk[5] = {B, T, 3, H, D}, out[2] = {R, C};
    loom_tensor *q = rotate(g, l, proj(g, a, b->q), B, T, H);
    loom_tensor *k = repeated(g, l, rotate(g, l, proj(g, a, b->k), B, T, l->c.kv_heads), R);
    loom_tensor *v = repeated(g, l, proj(g, a, b->v), R);
    loom_tensor *qkv =
        loom_where(g, loom_input(g, LOOM_F32, 3, mask, l->first),
                   loom_expand(g, loom_reshape(g, q, 3, q1), 3, three),
                   loom_where(g, loom_input(g, LOOM_F32, 3, mask, l->second),
                              loom_expand(g, k, 3, three), loom_expand(g, v, 3, three)));
    loom_tensor *y = loom_attention(g, loom_reshape(g, qkv, 5, pk), true); /* (B, T, H, D) */
    return proj(g, loom_reshape(g, y, 2, out), b->o);
}

loom_tensor *loom_llama_forward(loom_graph *g, loom_llama *l, loom_tensor *idx) {
    if (!g || g->err)
        return NULL;
    const loom_llama_config *c = &l->c;
    if (!idx || idx->dtype != LOOM_I32 || idx->ndim != 2 || idx->shape[1] < 1 ||
        idx->shape[1] > c->context) {
        char s[96];
        loom__shape_str(idx, s, sizeof s);
        loom__graph_fail(g, LOOM_ESHAPE,
                         "loom_llama_forward: tokens %s, expected i32 (B, T) with 1 <= T <= the "
                         "context, %lld",
                         s, (long long)c->context);
        return NULL;
    }
    int64_t B = idx->shape[0], T = idx->shape[1], flat[2] = {B * T, c->width};
    int64_t out[3] = {B, T, c->vocab};
    loom_tensor *x = loom_reshape(g, loom_gather(g, loom_parameter(g, l->embed), idx), 2, flat);
    for (int64_t i = 0; i < c->layers; i++) {
        const block *b = &l->blocks[i];
        x = loom_add(g, x, attention(g, l, b, rms(g, l, x, b->in_norm), B, T));
        loom_tensor *a = rms(g, l, x, b->post_norm);
        loom_tensor *h = loom_mul(g, silu(g, proj(g, a, b->gate)), proj(g, a, b->up));
        x = loom_add(g, x, proj(g, h, b->down));
    }
    x = rms(g, l, x, l->norm);
    return loom_reshape(g, proj(g, x, l->head), 3, out);
}
