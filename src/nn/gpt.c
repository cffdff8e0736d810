/*
 * gpt.c - a GPT as nanoGPT's model.py writes it (Radford et al. 2019, with bias-free LayerNorm
 * and Linear layers): token and position embeddings, `layers` pre-norm residual blocks of causal
 * multi-head self-attention and a GELU MLP, a final LayerNorm, and the output projection tied to
 * the token embedding (one parameter, its gradient summed from both uses). Built from the
 * library's general ops; the parameters carry nanoGPT's state_dict names, which are GPT-2's.
 * GPT-2 itself (Hugging Face's GPT2LMHeadModel) is the same model with biases, Linear weights
 * stored (in, out) (its Conv1D), GELU's tanh form and its own MLP width: the config's flags.
 *
 *   x = wte[idx] + wpe[0..T)
 *   for each block:  x = x + attn(ln_1(x));  x = x + mlp(ln_2(x))
 *   logits = ln_f(x) wte^T
 *   attn(a) = c_proj(softmax(causal(q k^T / sqrt(D))) v), q, k, v = the three thirds of c_attn(a)
 *             per head (loom_attention)
 *   mlp(a)  = c_proj(gelu(c_fc(a)))
 */
#include "internal.h"

#include <math.h>
#include <string.h>

/* A Linear layer or LayerNorm: its weight and bias (NULL without biases). */
typedef struct {
    loom_param *w, *b;
} layer;

typedef struct {
    layer ln_1, c_attn, attn_proj, ln_2, c_fc, mlp_proj;
} block;

struct loom_gpt {
    loom_model *m;
    loom_gpt_config c;
    loom_param *wte, *wpe;
    layer ln_f;
    block *blocks;
    int32_t *rows; /* 0 .. max(3 width, context) - 1: positions and c_attn's thirds */
    bool train;
    int32_t (*keys)[4]; /* each dropout site's key: seed, step, and the site (loom_dropout) */
};

static loom_param *add(loom_model *m, const char *name, int ndim, int64_t d0, int64_t d1) {
    int64_t s[2] = {d0, d1};
    return loom_model_add(m, name, ndim, s);
}

/* Layer "<prefix>" of `in` inputs and `out` outputs ("<prefix>.weight" (out, in), or (in, out)
 * with conv1d, and "<prefix>.bias" (out) with biases); a LayerNorm of out channels when in is 0. */
static bool add_layer(loom_model *m, const loom_gpt_config *c, layer *l, const char *prefix,
                      int64_t in, int64_t out) {
    char name[128];
    snprintf(name, sizeof name, "%s.weight", prefix);
    l->w = !in         ? add(m, name, 1, out, 0)
           : c->conv1d ? add(m, name, 2, in, out)
                       : add(m, name, 2, out, in);
    snprintf(name, sizeof name, "%s.bias", prefix);
    return l->w && (!c->bias || (l->b = add(m, name, 1, out, 0)));
}

loom_gpt *loom_gpt_new(loom_model *m, const loom_gpt_config *c) {
    const int64_t most = (int64_t)1 << 24; /* each size: no product of two of them wraps */
    if (!m || !c || c->vocab < 1 || c->context < 1 || c->layers < 1 || c->heads < 1 ||
        c->width < 1 || c->vocab > most || c->context > most || c->layers > most ||
        c->heads > most || c->width > most || c->width % c->heads != 0 ||
        !(c->dropout >= 0 && c->dropout < 1) || c->inner < 0 || c->inner > most ||
        !(c->eps >= 0 && c->eps < 1)) {
        loom__error(LOOM_EINVAL,
                    "loom_gpt_new: vocabulary %lld, context %lld, %lld layers, %lld heads, width "
                    "%lld: expected sizes from 1 to 2^24, a width that the heads divide, 0 <= "
                    "dropout < 1, an MLP width up to 2^24, 0 <= eps < 1",
                    c ? (long long)c->vocab : 0, c ? (long long)c->context : 0,
                    c ? (long long)c->layers : 0, c ? (long long)c->heads : 0,
                    c ? (long long)c->width : 0);
        return NULL;
    }
    loom_gpt *gpt = loom__calloc(1, sizeof *gpt);
    int64_t C = c->width, nrows = 3 * C > c->context ? 3 * C : c->context;
    if (gpt) {
        gpt->blocks = loom__calloc((size_t)c->layers, sizeof *gpt->blocks);
        gpt->rows = loom__calloc((size_t)nrows, sizeof *gpt->rows);
        gpt->keys = loom__calloc((size_t)(1 + 3 * c->layers), sizeof *gpt->keys);
    }
    if (!gpt || !gpt->blocks || !gpt->rows || !gpt->keys) {
        loom_gpt_free(gpt);
        return NULL;
    }
    gpt->m = m, gpt->c = *c;
    for (int64_t i = 0; i < nrows; i++)
        gpt->rows[i] = (int32_t)i;
    bool ok = (gpt->wte = add(m, "transformer.wte.weight", 2, c->vocab, C)) &&
              (gpt->wpe = add(m, "transformer.wpe.weight", 2, c->context, C));
    int64_t F = c->inner ? c->inner : 4 * C;
    for (int64_t l = 0; ok && l < c->layers; l++) {
        block *b = &gpt->blocks[l];
        char name[96];
#define ADD(field, suffix, in, out)                                              \
    (snprintf(name, sizeof name, "transformer.h.%lld.%s", (long long)l, suffix), \
     add_layer(m, c, &b->field, name, in, out))
        ok = ADD(ln_1, "ln_1", 0, C) && ADD(c_attn, "attn.c_attn", C, 3 * C) &&
             ADD(attn_proj, "attn.c_proj", C, C) && ADD(ln_2, "ln_2", 0, C) &&
             ADD(c_fc, "mlp.c_fc", C, F) && ADD(mlp_proj, "mlp.c_proj", F, C);
#undef ADD
    }
    if (!ok || !add_layer(m, c, &gpt->ln_f, "transformer.ln_f", 0, C) ||
        loom_model_tie(m, "lm_head.weight", gpt->wte)) {
        loom_gpt_free(gpt);
        return NULL;
    }
    return gpt;
}

void loom_gpt_free(loom_gpt *gpt) {
    if (!gpt)
        return;
    loom__free(gpt->blocks);
    loom__free(gpt->rows);
    loom__free(gpt->keys);
    loom__free(gpt);
}

const loom_gpt_config *loom_gpt_get_config(const loom_gpt *gpt) {
    return &gpt->c;
}

void loom__fill_normal(loom_param *p, uint64_t seed, double std) {
    float *d = loom_param_data(p);
    uint64_t stream = (1ull << 32) | (uint64_t)p->index;
    for (int64_t j = 0; j < p->numel; j++) {
        double u1 = loom_rand_uniform(seed, stream, 2 * (uint64_t)j) + 1.0 / 33554432.0;
        double u2 = loom_rand_uniform(seed, stream, 2 * (uint64_t)j + 1);
        d[j] = (float)(std * sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
    }
}

void loom__fill_ones(loom_param *p) {
    float *d = loom_param_data(p);
    for (int64_t j = 0; j < p->numel; j++)
        d[j] = 1.0f;
}

static void fill_zeros(loom_param *p) {
    if (p)
        memset(loom_param_data(p), 0, sizeof(float) * (size_t)p->numel);
}

/* A LayerNorm: ones and zeros; a Linear layer: normal(0, std) and zeros. */
static void init_layer(const layer *l, uint64_t seed, double std) {
    if (std > 0)
        loom__fill_normal(l->w, seed, std);
    else
        loom__fill_ones(l->w);
    fill_zeros(l->b);
}

void loom_gpt_init(loom_gpt *gpt, uint64_t seed) {
    const loom_gpt_config *c = &gpt->c;
    double proj = 0.02 / sqrt(2.0 * (double)c->layers);
    loom__fill_normal(gpt->wte, seed, 0.02);
    loom__fill_normal(gpt->wpe, seed, 0.02);
    for (int64_t l = 0; l < c->layers; l++) {
        block *b = &gpt->blocks[l];
        init_layer(&b->ln_1, seed, 0), init_layer(&b->ln_2, seed, 0);
        init_layer(&b->c_attn, seed, 0.02);
        init_layer(&b->attn_proj, seed, proj);
        init_layer(&b->c_fc, seed, 0.02);
        init_layer(&b->mlp_proj, seed, proj);
    }
    init_layer(&gpt->ln_f, seed, 0);
    loom_model_touch(gpt->m);
}

void loom_gpt_set_train(loom_gpt *gpt, bool train, uint64_t seed, int64_t step) {
    gpt->train = train;
    for (int64_t s = 0; s < 1 + 3 * gpt->c.layers; s++) {
        int32_t *k = gpt->keys[s];
        k[0] = (int32_t)(uint32_t)seed, k[1] = (int32_t)(uint32_t)(seed >> 32);
        k[2] = (int32_t)(uint32_t)step, k[3] = (int32_t)s; /* (the step's high word: the site) */
    }
}

/* Dropout site `site` on x, whose dim 0 has B * (some) rows: viewed as (B, rest) so that its
 * rows are the batch's samples (the key counts positions from the sample). */
static loom_tensor *drop(loom_graph *g, loom_gpt *gpt, loom_tensor *x, int64_t B, int64_t site) {
    if (!gpt->train || gpt->c.dropout == 0 || !x)
        return x;
    int64_t k4 = 4, flat[2] = {B, loom_tensor_numel(x) / B}, shape[LOOM_MAX_DIMS];
    int nd = x->ndim;
    memcpy(shape, x->shape, sizeof(int64_t) * (size_t)nd);
    loom_tensor *key = loom_input(g, LOOM_I32, 1, &k4, gpt->keys[site]);
    return loom_reshape(g, loom_dropout(g, loom_reshape(g, x, 2, flat), gpt->c.dropout, key), nd,
                        shape);
}

/* x (R, in) through layer l: (R, out). */
static loom_tensor *linear(loom_graph *g, const loom_gpt *gpt, loom_tensor *x, const layer *l) {
    loom_tensor *w = loom_parameter(g, l->w);
    loom_tensor *y = loom_matmul(g, x, gpt->c.conv1d ? w : loom_transpose(g, w));
    return l->b ? loom_add(g, y, loom_parameter(g, l->b)) : y;
}

static loom_tensor *norm(loom_graph *g, const loom_gpt *gpt, loom_tensor *x, const layer *l) {
    return loom_layer_norm(g, x, loom_parameter(g, l->w), l->b ? loom_parameter(g, l->b) : NULL,
                           gpt->c.eps > 0 ? gpt->c.eps : 1e-5);
}

/* The rows [k n, (k + 1) n) of w, as a graph tensor. */
static loom_tensor *rows_of(loom_graph *g, loom_gpt *gpt, loom_tensor *w, int64_t k, int64_t n) {
    return loom_gather(g, w, loom_input(g, LOOM_I32, 1, &n, gpt->rows + k * n));
}

/* Outputs [k C, (k + 1) C) of c_attn on a: the queries, keys or values (R, C). */
static loom_tensor *third(loom_graph *g, loom_gpt *gpt, const layer *l, loom_tensor *a, int64_t k) {
    int64_t C = gpt->c.width, col[2] = {3 * C, 1};
    loom_tensor *w = loom_parameter(g, l->w); /* (3 C, C), or (C, 3 C) with conv1d */
    loom_tensor *y = loom_matmul(
        g, a, loom_transpose(g, rows_of(g, gpt, gpt->c.conv1d ? loom_transpose(g, w) : w, k, C)));
    if (!l->b)
        return y;
    loom_tensor *b = rows_of(g, gpt, loom_reshape(g, loom_parameter(g, l->b), 2, col), k, C);
    return loom_add(g, y, loom_reshape(g, b, 1, &C));
}

/* (B T, C) -> (B, H, T, D) */
static loom_tensor *heads(loom_graph *g, loom_tensor *x, int64_t B, int64_t T, int64_t H,
                          int64_t D) {
    int64_t s[4] = {B, T, H, D};
    return loom_permute(g, loom_reshape(g, x, 4, s), (int[]){0, 2, 1, 3});
}

/* With dropout on the attention's probabilities (training, dropout > 0) the attention is
 * composed from its ops; otherwise it is loom_attention, one kernel a head, on c_attn's output
 * (B T, 3 C) viewed as (B, T, 3, H, D): the same function. */
static loom_tensor *attention(loom_graph *g, loom_gpt *gpt, const block *b, loom_tensor *a,
                              int64_t B, int64_t T, int64_t site) {
    int64_t C = gpt->c.width, H = gpt->c.heads, D = C / H, s[2] = {B * T, C};
    loom_tensor *y;
    if (!gpt->train || gpt->c.dropout == 0) {
        int64_t packed[5] = {B, T, 3, H, D};
        y = loom_attention(g, loom_reshape(g, linear(g, gpt, a, &b->c_attn), 5, packed), true);
    } else {
        loom_tensor *q = heads(g, third(g, gpt, &b->c_attn, a, 0), B, T, H, D);
        loom_tensor *k = heads(g, third(g, gpt, &b->c_attn, a, 1), B, T, H, D);
        loom_tensor *v = heads(g, third(g, gpt, &b->c_attn, a, 2), B, T, H, D);
        loom_tensor *att = loom_mul(g, loom_matmul(g, q, loom_transpose(g, k)),
                                    loom_scalar(g, 1.0 / sqrt((double)D), LOOM_F32));
        att = drop(g, gpt, loom_softmax(g, loom_causal_mask(g, att, -INFINITY), 3), B, site);
        y = loom_permute(g, loom_matmul(g, att, v), (int[]){0, 2, 1, 3});
    }
    return drop(g, gpt, linear(g, gpt, loom_reshape(g, y, 2, s), &b->attn_proj), B, site + 1);
}

loom_tensor *loom_gpt_forward(loom_graph *g, loom_gpt *gpt, loom_tensor *idx) {
    if (!g || g->err)
        return NULL;
    const loom_gpt_config *c = &gpt->c;
    if (!idx || idx->dtype != LOOM_I32 || idx->ndim != 2 || idx->shape[1] < 1 ||
        idx->shape[1] > c->context) {
        char s[96];
        loom__shape_str(idx, s, sizeof s);
        loom__graph_fail(g, LOOM_ESHAPE,
                         "loom_gpt_forward: tokens %s, expected i32 (B, T) with 1 <= T <= the "
                         "context, %lld",
                         s, (long long)c->context);
        return NULL;
    }
    int64_t B = idx->shape[0], T = idx->shape[1], C = c->width;
    loom_tensor *wte = loom_parameter(g, gpt->wte);
    loom_tensor *pos = rows_of(g, gpt, loom_parameter(g, gpt->wpe), 0, T); /* (T, C) */
    int64_t flat[2] = {B * T, C}, out[3] = {B, T, c->vocab};
    loom_tensor *x =
        loom_reshape(g, drop(g, gpt, loom_add(g, loom_gather(g, wte, idx), pos), B, 0), 2, flat);
    for (int64_t l = 0; l < c->layers; l++) {
        const block *b = &gpt->blocks[l];
        x = loom_add(g, x, attention(g, gpt, b, norm(g, gpt, x, &b->ln_1), B, T, 1 + 3 * l));
        loom_tensor *h = linear(g, gpt, norm(g, gpt, x, &b->ln_2), &b->c_fc);
        h = c->gelu_tanh ? loom_gelu_tanh(g, h) : loom_gelu(g, h);
        x = loom_add(g, x, drop(g, gpt, linear(g, gpt, h, &b->mlp_proj), B, 3 + 3 * l));
    }
    x = norm(g, gpt, x, &gpt->ln_f);
    return loom_reshape(g, loom_matmul(g, x, loom_transpose(g, wte)), 3, out);
}
