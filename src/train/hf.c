/*
 * hf.c - Hugging Face model folders in and out: config.json names the model (GPT-2's
 * GPT2LMHeadModel, built as a loom_gpt with its flags; LlamaForCausalLM, a loom_llama),
 * model.safetensors or the shards that
 * model.safetensors.index.json lists hold its weights (float32, float16 or bfloat16, read as
 * float32), and a trained model is written back as a folder that transformers' from_pretrained
 * loads: model.safetensors (float32, with the tied lm_head.weight), config.json (the same
 * configuration, torch_dtype float32) and the tokenizer's files copied beside them.
 *
 * What a config asks that loom does not build is refused naming the field, never approximated.
 */
#include "internal.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct loom_hf {
    loom_model *m;
    loom_gpt *gpt;     /* model_type "gpt2" */
    loom_llama *llama; /* model_type "llama" */
    loom__json config;
    char dir[4096];
};

static loom_status config_fail(const char *path, const char *field, const char *fmt, ...)
    LOOM_PRINTF(3, 4);
static loom_status config_fail(const char *path, const char *field, const char *fmt, ...) {
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return loom__error(LOOM_EUNSUPPORTED, "%s: field \"%s\": %s", path, field, what);
}

/* Integer field `key` (or its older name `alt`) from 1 to max into *out; def when absent and def
 * > 0. */
static loom_status int_field(const loom__json *d, const char *path, const char *key,
                             const char *alt, int64_t def, int64_t max, int64_t *out) {
    const loom__jnode *root = loom__json_root(d), *v = loom__json_get(d, root, key);
    if (!v && alt)
        v = loom__json_get(d, root, key = alt);
    if (!v && def > 0)
        return *out = def, LOOM_OK;
    if (!v)
        return loom__error(LOOM_EFORMAT, "%s: field \"%s\" is missing", path, key);
    if (!loom__json_int(v, out) || *out < 1 || *out > max)
        return loom__error(LOOM_EFORMAT, "%s: field \"%s\": expected an integer from 1 to %lld",
                           path, key, (long long)max);
    return LOOM_OK;
}

/* Whether a boolean field, absent or null, is `want`: else unsupported. */
static loom_status bool_field(const loom__json *d, const char *path, const char *key, bool want) {
    const loom__jnode *v = loom__json_get(d, loom__json_root(d), key);
    if (!v || v->kind == LOOM__JNULL || (v->kind == LOOM__JBOOL && v->b == want))
        return LOOM_OK;
    return config_fail(path, key, "loom builds the model with %s only", want ? "true" : "false");
}

/* GPT-2's configuration (GPT2Config) into c. */
static loom_status gpt2_config(const loom__json *d, const char *path, loom_gpt_config *c) {
    const int64_t most = (int64_t)1 << 24;
    const loom__jnode *root = loom__json_root(d);
    *c = (loom_gpt_config){.bias = true, .conv1d = true};
    loom_status s = int_field(d, path, "vocab_size", NULL, 0, most, &c->vocab);
    if (!s)
        s = int_field(d, path, "n_positions", "n_ctx", 0, most, &c->context);
    if (!s)
        s = int_field(d, path, "n_embd", "hidden_size", 0, most, &c->width);
    if (!s)
        s = int_field(d, path, "n_layer", "num_hidden_layers", 0, most, &c->layers);
    if (!s)
        s = int_field(d, path, "n_head", "num_attention_heads", 0, most, &c->heads);
    const loom__jnode *inner = loom__json_get(d, root, "n_inner");
    if (!s && inner && inner->kind != LOOM__JNULL)
        s = int_field(d, path, "n_inner", NULL, 0, most, &c->inner);
    if (!s && c->width % c->heads != 0)
        s = loom__error(LOOM_EFORMAT, "%s: field \"n_head\": %lld heads do not divide n_embd %lld",
                        path, (long long)c->heads, (long long)c->width);
    const loom__jnode *act = loom__json_get(d, root, "activation_function");
    if (!s && act && !loom__json_is_str(act, "gelu_new") && !loom__json_is_str(act, "gelu") &&
        !loom__json_is_str(act, "gelu_pytorch_tanh"))
        s = config_fail(path, "activation_function",
                        "loom builds gelu_new, gelu_pytorch_tanh and gelu, not '%s'",
                        act->kind == LOOM__JSTR ? act->s : "(not a string)");
    c->gelu_tanh = !act || !loom__json_is_str(act, "gelu");
    const loom__jnode *eps = loom__json_get(d, root, "layer_norm_epsilon");
    if (!s && eps && (eps->kind != LOOM__JNUM || !(eps->num > 0 && eps->num < 1)))
        s = loom__error(LOOM_EFORMAT,
                        "%s: field \"layer_norm_epsilon\": expected a number in "
                        "(0, 1)",
                        path);
    c->eps = eps && !s ? eps->num : 1e-5;
    if (!s)
        s = bool_field(d, path, "scale_attn_weights", true);
    if (!s)
        s = bool_field(d, path, "scale_attn_by_inverse_layer_idx", false);
    if (!s)
        s = bool_field(d, path, "add_cross_attention", false);
    if (!s)
        s = bool_field(d, path, "tie_word_embeddings", true);
    return s;
}

/* A number field (absent: def) into *out, within (lo, hi). */
static loom_status num_field(const loom__json *d, const char *path, const char *key, double def,
                             double lo, double hi, double *out) {
    const loom__jnode *v = loom__json_get(d, loom__json_root(d), key);
    if (!v || v->kind == LOOM__JNULL)
        return *out = def, LOOM_OK;
    if (v->kind != LOOM__JNUM || !(v->num > lo && v->num < hi))
        return loom__error(LOOM_EFORMAT, "%s: field \"%s\": expected a number in (%g, %g)", path,
                           key, lo, hi);
    *out = v->num;
    return LOOM_OK;
}

/* Llama's configuration (LlamaConfig) into c. */
static loom_status llama_config(const loom__json *d, const char *path, loom_llama_config *c) {
    const int64_t most = (int64_t)1 << 24;
    const loom__jnode *root = loom__json_root(d);
    *c = (loom_llama_config){0};
    loom_status s = int_field(d, path, "vocab_size", NULL, 0, most, &c->vocab);
    if (!s)
        s = int_field(d, path, "max_position_embeddings", NULL, 0, most, &c->context);
    if (!s)
        s = int_field(d, path, "hidden_size", NULL, 0, most, &c->width);
    if (!s)
        s = int_field(d, path, "intermediate_size", NULL, 0, most, &c->inner);
    if (!s)
        s = int_field(d, path, "num_hidden_layers", NULL, 0, most, &c->layers);
    if (!s)
        s = int_field(d, path, "num_attention_heads", NULL, 0, most, &c->heads);
    if (!s)
        s = int_field(d, path, "num_key_value_heads", NULL, c->heads, most, &c->kv_heads);
    if (!s)
        s = num_field(d, path, "rms_norm_eps", 1e-6, 0, 1, &c->eps);
    if (!s)
        s = num_field(d, path, "rope_theta", 10000, 0, 1e30, &c->rope_theta);
    if (!s && (c->width % c->heads || c->heads % c->kv_heads || (c->width / c->heads) % 2))
        s = loom__error(LOOM_EFORMAT,
                        "%s: field \"num_attention_heads\": %lld heads (%lld key and value heads) "
                        "of hidden_size %lld: expected heads dividing it into even widths and key "
                        "and value heads dividing the heads",
                        path, (long long)c->heads, (long long)c->kv_heads, (long long)c->width);
    int64_t hd;
    const loom__jnode *head_dim = loom__json_get(d, root, "head_dim");
    if (!s && head_dim && head_dim->kind != LOOM__JNULL &&
        (!loom__json_int(head_dim, &hd) || hd != c->width / c->heads))
        s = config_fail(path, "head_dim", "loom builds heads of hidden_size / num_attention_heads");
    const loom__jnode *act = loom__json_get(d, root, "hidden_act");
    if (!s && act && !loom__json_is_str(act, "silu"))
        s = config_fail(path, "hidden_act", "loom builds silu");
    const loom__jnode *scaling = loom__json_get(d, root, "rope_scaling");
    if (!s && scaling && scaling->kind != LOOM__JNULL)
        s = config_fail(path, "rope_scaling", "loom builds rotary embeddings without scaling");
    int64_t tp = 1;
    const loom__jnode *ptp = loom__json_get(d, root, "pretraining_tp");
    if (!s && ptp && ptp->kind != LOOM__JNULL && (!loom__json_int(ptp, &tp) || tp != 1))
        s = config_fail(path, "pretraining_tp", "loom builds pretraining_tp 1");
    if (!s)
        s = bool_field(d, path, "attention_bias", false);
    if (!s)
        s = bool_field(d, path, "mlp_bias", false);
    const loom__jnode *tie = loom__json_get(d, root, "tie_word_embeddings");
    c->tied = tie && tie->kind == LOOM__JBOOL && tie->b; /* (LlamaConfig's default: false) */
    return s;
}

/* The family that config.json names: 0, or EUNSUPPORTED naming model_type. */
static loom_status build(loom_hf *h, const char *path) {
    const loom__json *d = &h->config;
    const loom__jnode *root = loom__json_root(d), *type = loom__json_get(d, root, "model_type");
    if (!root || root->kind != LOOM__JOBJ)
        return loom__error(LOOM_EFORMAT, "%s: expected a JSON object", path);
    if (!type)
        return loom__error(LOOM_EFORMAT, "%s: field \"model_type\" is missing", path);
    if (loom__json_is_str(type, "llama")) {
        loom_llama_config c;
        loom_status s = llama_config(d, path, &c);
        if (!s && !(h->llama = loom_llama_new(h->m, &c)))
            s = loom__error(LOOM_EINVAL, "%s: %s", path, loom_last_error());
        return s;
    }
    if (!loom__json_is_str(type, "gpt2"))
        return config_fail(path, "model_type", "'%s': loom builds gpt2 and llama",
                           type->kind == LOOM__JSTR ? type->s : "(not a string)");
    loom_gpt_config c;
    loom_status s = gpt2_config(d, path, &c);
    if (!s && !(h->gpt = loom_gpt_new(h->m, &c)))
        s = loom__error(LOOM_EINVAL, "%s: %s", path, loom_last_error());
    return s;
}

/* ---- weights --------------------------------------------------------------------------------- */

/* Buffers a file may hold that are no parameters: GPT-2's causal masks, Llama's inverse
 * frequencies (older versions of transformers wrote them). */
static bool ignored(const char *name) {
    static const char *const ends[] = {".attn.bias", ".attn.masked_bias", ".rotary_emb.inv_freq"};
    size_t n = strlen(name);
    for (size_t k = 0; k < sizeof ends / sizeof *ends; k++)
        if (n > strlen(ends[k]) && !strcmp(name + n - strlen(ends[k]), ends[k]))
            return true;
    return false;
}

/* The files the weights are in: model.safetensors, or the shards of the index, each once. */
typedef struct {
    char **files;
    int n;
    loom__json index;
} shards;

static void shards_free(shards *sh) {
    for (int i = 0; i < sh->n; i++)
        loom__free(sh->files[i]);
    loom__free(sh->files);
    loom__json_free(&sh->index);
}

static loom_status shard_add(shards *sh, const char *dir, const char *name, const char *index) {
    if (!*name || strchr(name, '/') || !strcmp(name, ".."))
        return loom__error(LOOM_EFORMAT,
                           "%s: weight_map names file '%s', expected a file of the "
                           "folder",
                           index, name);
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    for (int i = 0; i < sh->n; i++)
        if (!strcmp(sh->files[i], path))
            return LOOM_OK;
    int64_t cap = sh->n;
    char **grown = loom__realloc(sh->files, sizeof *grown * (size_t)(cap + 1));
    if (!grown || !(grown[sh->n] = loom__strdup(path)))
        return sh->files = grown ? grown : sh->files, LOOM_ENOMEM;
    sh->files = grown, sh->n++;
    return LOOM_OK;
}

static loom_status find_shards(const char *dir, shards *sh) {
    char single[4200], index[4200];
    struct stat st;
    snprintf(single, sizeof single, "%s/model.safetensors", dir);
    snprintf(index, sizeof index, "%s/model.safetensors.index.json", dir);
    if (stat(single, &st) == 0 || stat(index, &st) != 0) {
        if (stat(single, &st) != 0)
            return loom__error(LOOM_ENOTFOUND,
                               "%s: no model.safetensors nor "
                               "model.safetensors.index.json (the weights)",
                               dir);
        return shard_add(sh, dir, "model.safetensors", index);
    }
    loom_status s = loom__json_read(index, &sh->index);
    const loom__jnode *map =
        s ? NULL : loom__json_get(&sh->index, loom__json_root(&sh->index), "weight_map");
    if (!s && (!map || map->kind != LOOM__JOBJ))
        s = loom__error(LOOM_EFORMAT, "%s: expected an object \"weight_map\"", index);
    for (const loom__jnode *e = s ? NULL : loom__json_first(&sh->index, map); e && !s;
         e = loom__json_next(&sh->index, e))
        s = e->kind == LOOM__JSTR
                ? shard_add(sh, dir, e->s, index)
                : loom__error(LOOM_EFORMAT, "%s: weight_map's \"%s\": expected a file name", index,
                              e->key);
    return s;
}

/* Parameter (or tied name) `name`'s values from the files: found (*got) and its shape checked. */
static loom_status take(loom_tensor_file *const *f, const shards *sh, const char *name, float *dst,
                        int ndim, const int64_t *shape, bool *got) {
    const char *base = strncmp(name, "transformer.", 12) ? NULL : name + 12;
    for (int i = 0; i < sh->n; i++) {
        loom_dtype dt;
        int nd;
        const int64_t *fs;
        const void *src = loom_tensor_file_get(f[i], name, &dt, &nd, &fs);
        if (!src && base) /* (GPT2Model's files: no "transformer." in front) */
            src = loom_tensor_file_get(f[i], base, &dt, &nd, &fs);
        if (!src)
            continue;
        bool same = nd == ndim;
        for (int k = 0; same && k < nd; k++)
            same = fs[k] == shape[k];
        if (!same || dt == LOOM_I32) {
            char sa[96], sb[96];
            loom__dims_str(nd, fs, sa, sizeof sa), loom__dims_str(ndim, shape, sb, sizeof sb);
            return loom__error(LOOM_ESHAPE, "%s: tensor '%s' is %s %s, config.json makes it %s",
                               sh->files[i], name, dt == LOOM_I32 ? "i32" : "float", sa, sb);
        }
        int64_t n = 1;
        for (int k = 0; k < nd; k++)
            n *= fs[k];
        for (int64_t k = 0; k < n; k++)
            dst[k] = dt == LOOM_F64 ? (float)((const double *)src)[k] : ((const float *)src)[k];
        *got = true;
        return LOOM_OK;
    }
    *got = false;
    return LOOM_OK;
}

/* Every tensor of every file is a parameter, a tied name or an ignored buffer: else EFORMAT. */
static loom_status unexpected(const loom_hf *h, loom_tensor_file *const *f, const shards *sh) {
    for (int i = 0; i < sh->n; i++)
        for (int k = 0; k < loom_tensor_file_count(f[i]); k++) {
            const char *name = loom_tensor_file_name(f[i], k);
            char full[300];
            snprintf(full, sizeof full, "transformer.%s", name);
            bool known = ignored(name) || loom_model_find(h->m, name) ||
                         loom_model_find(h->m, full) || !strcmp(name, "lm_head.weight");
            if (!known)
                return loom__error(LOOM_EFORMAT,
                                   "%s: tensor '%s' is not a parameter of the "
                                   "model config.json describes",
                                   sh->files[i], name);
        }
    return LOOM_OK;
}

static loom_status load_weights(loom_hf *h) {
    shards sh = {0};
    loom_status s = find_shards(h->dir, &sh);
    loom_tensor_file **f = s ? NULL : loom__calloc((size_t)sh.n + 1, sizeof *f);
    if (!s && !f)
        s = LOOM_ENOMEM;
    for (int i = 0; !s && i < sh.n; i++)
        s = loom_tensor_file_read(sh.files[i], &f[i]);
    if (!s)
        s = unexpected(h, f, &sh);
    for (int i = 0; !s && i < loom_model_count(h->m); i++) {
        loom_param *p = loom_model_at(h->m, i);
        bool got;
        s = take(f, &sh, loom_param_name(p), loom_param_data(p), loom_param_ndim(p),
                 loom_param_shape(p), &got);
        if (!s && !got)
            s = loom__error(LOOM_ENOTFOUND, "%s: tensor '%s' is missing from %s%s", h->dir,
                            loom_param_name(p), sh.n > 1 ? "the shards of " : "",
                            sh.n > 1 ? "model.safetensors.index.json" : "model.safetensors");
    }
    for (int i = 0; f && i < sh.n; i++)
        loom_tensor_file_free(f[i]);
    loom__free(f);
    shards_free(&sh);
    if (!s)
        loom_model_touch(h->m);
    return s;
}

loom_status loom_hf_open(const char *dir, loom_model *m, loom_hf **out) {
    *out = NULL;
    if (!dir || !m || strlen(dir) > 4000)
        return loom__error(LOOM_EINVAL, "loom_hf_open: expected a folder and a model");
    loom_hf *h = loom__calloc(1, sizeof *h);
    if (!h)
        return LOOM_ENOMEM;
    h->m = m;
    snprintf(h->dir, sizeof h->dir, "%s", dir);
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    loom_status s = loom__json_read(path, &h->config);
    if (!s)
        s = build(h, path);
    if (!s) /* (the parameters are float32 whatever the files held: so says a saved config) */
        s = loom__json_set_str(&h->config, loom__json_root(&h->config), "torch_dtype", "float32");
    if (!s)
        s = load_weights(h);
    if (s)
        loom_hf_free(h);
    else
        *out = h;
    return s;
}

void loom_hf_free(loom_hf *h) {
    if (!h)
        return;
    loom_gpt_free(h->gpt);
    loom_llama_free(h->llama);
    loom__json_free(&h->config);
    loom__free(h);
}

int64_t loom_hf_vocab(const loom_hf *h) {
    return h->gpt ? loom_gpt_get_config(h->gpt)->vocab : loom_llama_get_config(h->llama)->vocab;
}

int64_t loom_hf_context(const loom_hf *h) {
    return h->gpt ? loom_gpt_get_config(h->gpt)->context : loom_llama_get_config(h->llama)->context;
}

void loom_hf_set_train(loom_hf *h, bool train, uint64_t seed, int64_t step) {
    if (h->gpt) /* (Llama: no dropout) */
        loom_gpt_set_train(h->gpt, train, seed, step);
}

loom_tensor *loom_hf_forward(loom_graph *g, loom_hf *h, loom_tensor *idx) {
    return h->gpt ? loom_gpt_forward(g, h->gpt, idx) : loom_llama_forward(g, h->llama, idx);
}

/* ---- writing back -------------------------------------------------------------------------- */

/* config.json as read (its torch_dtype made "float32" by loom_hf_open), indented as
 * save_pretrained writes it. */
static loom_status write_config(const loom_hf *h, const char *path) {
    loom__strbuf b = {0};
    loom__json_write(&b, &h->config, loom__json_root(&h->config), 0);
    loom__strbuf_add(&b, "\n", 1);
    loom_status s =
        b.err ? LOOM_ENOMEM : loom__write_atomic(path, &(loom__part){b.s, (size_t)b.len}, 1);
    loom__free(b.s);
    return s;
}

/* A file of the source folder copied into the new one, when it is there. */
static loom_status copy_file(const char *from_dir, const char *to_dir, const char *name) {
    char from[4200], to[4200];
    snprintf(from, sizeof from, "%s/%s", from_dir, name);
    snprintf(to, sizeof to, "%s/%s", to_dir, name);
    struct stat st;
    if (stat(from, &st) != 0)
        return LOOM_OK;
    int fd;
    int64_t size;
    loom_status s = loom__open_regular(from, &fd, &size);
    if (s)
        return s;
    void *buf = loom__malloc((size_t)size + 1);
    s = buf ? size ? loom__read_at(fd, from, buf, (size_t)size, 0, "the file") : LOOM_OK
            : LOOM_ENOMEM;
    close(fd);
    if (!s)
        s = loom__write_atomic(to, &(loom__part){buf, (size_t)size}, 1);
    loom__free(buf);
    return s;
}

loom_status loom_hf_save(const loom_hf *h, const char *dir) {
    if (!h || !dir || strlen(dir) > 4000)
        return loom__error(LOOM_EINVAL, "loom_hf_save: expected a model and a folder");
    char path[4200];
    snprintf(path, sizeof path, "%s", dir);
    if (!loom__mkdirs(path))
        return loom__error(LOOM_EIO, "%s: cannot create the folder: %s", dir, strerror(errno));
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    loom_status s = loom_model_save(h->m, path);
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (!s)
        s = write_config(h, path);
    static const char *const tokenizer_files[] = {"tokenizer.json",
                                                  "tokenizer_config.json",
                                                  "special_tokens_map.json",
                                                  "generation_config.json",
                                                  "vocab.json",
                                                  "merges.txt"};
    bool same = !strcmp(dir, h->dir);
    for (size_t i = 0; !s && !same && i < sizeof tokenizer_files / sizeof *tokenizer_files; i++)
        s = copy_file(h->dir, dir, tokenizer_files[i]);
    return s;
}
