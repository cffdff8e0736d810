/*
 * model.c - persistent tensors: parameters, their gradients and optimizer state, each kind in one
 * contiguous float32 slab (llm.c's malloc_and_point_parameters). A parameter has the same offset
 * in the PARAM and GRAD slabs, so the gradient slab mirrors the parameter slab exactly and can be
 * all-reduced in a few contiguous buckets. A step submitted on devices reads and writes the slabs
 * until it ends: every way in for the host (a pointer, a touch, a new tensor, save and load) ends
 * it first (loom__model_settle).
 */
#include "internal.h"

#include <string.h>

void loom__model_settle(const loom_model *cm) {
    loom_model *m = (loom_model *)(uintptr_t)cm; /* (the host's view of m, made current) */
    if (m && m->running)
        loom__graph_settle(m->running);
    for (int s = 0; m && s < LOOM_SLAB_COUNT; s++)
        if (m->away[s]) {
            memcpy(m->slab[s], m->away[s], sizeof(float) * (size_t)m->len[s]);
            m->away[s] = NULL;
        }
}

loom_model *loom_model_new(void) {
    return loom__calloc(1, sizeof(loom_model));
}

loom_status loom__meta_set(loom__meta *md, const char *key, const char *val) {
    int64_t i = 0;
    while (i < md->n && strcmp(md->key[i], key) != 0)
        i++;
    if (!val) { /* removes key, keeping the order of the rest */
        if (i == md->n)
            return LOOM_OK;
        loom__free(md->key[i]), loom__free(md->val[i]);
        memmove(md->key + i, md->key + i + 1, sizeof *md->key * (size_t)(md->n - i - 1));
        memmove(md->val + i, md->val + i + 1, sizeof *md->val * (size_t)(md->n - i - 1));
        md->n--;
        return LOOM_OK;
    }
    char *v = loom__strdup(val), *k = i < md->n ? NULL : loom__strdup(key);
    int64_t cap = md->cap;
    bool room = i < md->n || (!loom__grow((void **)&md->key, &cap, md->n + 1, sizeof *md->key) &&
                              !loom__grow((void **)&md->val, &md->cap, md->n + 1, sizeof *md->val));
    if (!v || (i == md->n && (!k || !room))) {
        loom__free(v), loom__free(k);
        return loom__error(LOOM_ENOMEM, "metadata '%s': out of memory", key);
    }
    if (i < md->n) {
        loom__free(md->val[i]);
        md->val[i] = v;
    } else {
        md->key[md->n] = k, md->val[md->n++] = v;
    }
    return LOOM_OK;
}

const char *loom__meta_get(const loom__meta *md, const char *key) {
    for (int64_t i = 0; i < md->n; i++)
        if (!strcmp(md->key[i], key))
            return md->val[i];
    return NULL;
}

void loom__meta_free(loom__meta *md) {
    for (int64_t i = 0; i < md->n; i++)
        loom__free(md->key[i]), loom__free(md->val[i]);
    loom__free(md->key), loom__free(md->val);
    memset(md, 0, sizeof *md);
}

loom_status loom_model_set_meta(loom_model *m, const char *key, const char *value) {
    if (!m || !key || !*key || !strcmp(key, "format") || !strcmp(key, "producer"))
        return loom__error(LOOM_EINVAL,
                           "loom_model_set_meta: key '%s' (expected a name other "
                           "than format and producer)",
                           key ? key : "");
    return loom__meta_set(&m->meta, key, value);
}

const char *loom_model_meta(const loom_model *m, const char *key) {
    return m && key ? loom__meta_get(&m->meta, key) : NULL;
}

void loom_model_free(loom_model *m) {
    if (!m)
        return;
    loom__model_settle(m); /* (its graph should have been freed first) */
    if (m->lender)
        m->lent_end(m->lender, m);
    for (int64_t i = 0; i < m->n; i++) {
        loom__free(m->params[i]->name);
        loom__free(m->params[i]);
    }
    for (int64_t i = 0; i < m->nties; i++)
        loom__free(m->tie_name[i]);
    loom__free(m->tie_name);
    loom__free(m->tie_of);
    loom__free(m->params);
    for (int s = 0; s < LOOM_SLAB_COUNT; s++)
        loom__free(m->slab[s]);
    loom__meta_free(&m->meta);
    loom__free(m);
}

/* Appends numel zeroed floats to slab s; returns the offset or -1. */
static int64_t slab_append(loom_model *m, loom__slab s, int64_t numel) {
    loom__model_settle(m); /* the slab may move */
    int64_t off = m->len[s];
    if (loom__grow((void **)&m->slab[s], &m->slab_cap[s], off + numel, sizeof(float)))
        return -1;
    memset(m->slab[s] + off, 0, (size_t)numel * sizeof(float));
    m->len[s] = off + numel;
    m->version++;
    return off;
}

int64_t loom__model_state(loom_model *m, int64_t numel) {
    return slab_append(m, LOOM_SLAB_STATE, numel);
}

loom_param *loom_model_add(loom_model *m, const char *name, int ndim, const int64_t *shape) {
    if (!m || !name || !*name || ndim < 0 || ndim > LOOM_MAX_DIMS || (ndim && !shape)) {
        loom__error(LOOM_EINVAL, "loom_model_add: bad arguments for '%s'", name ? name : "");
        return NULL;
    }
    if (loom_model_find(m, name)) {
        loom__error(LOOM_EINVAL, "loom_model_add: a parameter named '%s' exists", name);
        return NULL;
    }
    for (int i = 0; i < ndim; i++) {
        if (shape[i] <= 0) {
            loom__error(LOOM_EINVAL, "loom_model_add: '%s' dim %d is %lld, expected > 0", name, i,
                        (long long)shape[i]);
            return NULL;
        }
    }
    int64_t numel = 1, total;
    for (int i = 0; i < ndim; i++)
        if (!loom_size_mul(numel, shape[i], LOOM_MAX_NUMEL, &numel) ||
            !loom_size_mul(1, m->len[LOOM_SLAB_PARAM] + numel, LOOM_MAX_NUMEL, &total)) {
            loom__error(LOOM_ERANGE, "loom_model_add: '%s' would take the model past 2^40 elements",
                        name);
            return NULL;
        }
    if (loom__grow((void **)&m->params, &m->cap, m->n + 1, sizeof *m->params))
        return NULL;
    loom_param *p = loom__calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->name = loom__strdup(name);
    p->numel = numel;
    int64_t off = p->name ? slab_append(m, LOOM_SLAB_PARAM, p->numel) : -1;
    int64_t goff = off >= 0 ? slab_append(m, LOOM_SLAB_GRAD, p->numel) : -1;
    if (goff < 0) {
        loom__free(p->name);
        loom__free(p);
        return NULL;
    }
    LOOM_ASSERT(off == goff);
    p->m = m;
    p->index = (int)m->n;
    p->ndim = ndim;
    memcpy(p->shape, shape, sizeof(int64_t) * (size_t)ndim);
    p->offset = off;
    m->params[m->n++] = p;
    return p;
}

int loom_model_count(const loom_model *m) {
    return (int)m->n;
}
loom_param *loom_model_at(const loom_model *m, int i) {
    return i >= 0 && i < m->n ? m->params[i] : NULL;
}
loom_param *loom_model_find(const loom_model *m, const char *name) {
    for (int64_t i = 0; i < m->n; i++)
        if (strcmp(m->params[i]->name, name) == 0)
            return m->params[i];
    return NULL;
}
int64_t loom_model_numel(const loom_model *m) {
    return m->len[LOOM_SLAB_PARAM];
}
const char *loom_param_name(const loom_param *p) {
    return p->name;
}
int loom_param_ndim(const loom_param *p) {
    return p->ndim;
}
const int64_t *loom_param_shape(const loom_param *p) {
    return p->shape;
}
int64_t loom_param_numel(const loom_param *p) {
    return p->numel;
}
float *loom_param_data(loom_param *p) {
    loom__model_settle(p->m);
    return p->m->slab[LOOM_SLAB_PARAM] + p->offset;
}
float *loom_param_grad(loom_param *p) {
    loom__model_settle(p->m);
    return p->m->slab[LOOM_SLAB_GRAD] + p->offset;
}

loom_status loom_model_tie(loom_model *m, const char *name, const loom_param *p) {
    if (!m || !name || !*name || !p || p->m != m || loom_model_find(m, name))
        return loom__error(LOOM_EINVAL, "loom_model_tie: '%s': %s", name ? name : "",
                           !m || !p || !name || !*name ? "NULL or empty argument"
                           : p->m != m                 ? "a parameter of another model"
                                                       : "a parameter has that name");
    for (int64_t i = 0; i < m->nties; i++)
        if (!strcmp(m->tie_name[i], name))
            return loom__error(LOOM_EINVAL, "loom_model_tie: '%s' is tied already", name);
    char **names = loom__realloc(m->tie_name, sizeof(char *) * (size_t)(m->nties + 1));
    if (names)
        m->tie_name = names;
    int64_t *of = names ? loom__realloc(m->tie_of, sizeof(int64_t) * (size_t)(m->nties + 1)) : NULL;
    if (of)
        m->tie_of = of;
    char *copy = of ? loom__strdup(name) : NULL;
    if (!copy)
        return LOOM_ENOMEM;
    m->tie_name[m->nties] = copy, m->tie_of[m->nties++] = p->index;
    return LOOM_OK;
}

void loom_model_touch(loom_model *m) {
    loom__model_settle(m);
    m->version++;
}
