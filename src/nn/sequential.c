/*
 * sequential.c - models as a list of layers, named and initialised exactly as
 * torch.nn.Sequential does: layer i's tensors are "i.weight" and "i.bias"; linear weights are
 * (out, in), conv weights (out, in, kh, kw); weights are kaiming-uniform with a = sqrt(5) (a bound
 * of 1/sqrt(fan_in)) and biases uniform in +-1/sqrt(fan_in).
 */
#include "../graph/internal.h"

#include <math.h>
#include <stdio.h>

typedef struct {
    loom_layer spec;
    loom_param *w, *b;
} layer;

struct loom_sequential {
    loom_model *m;
    int n;
    layer *layers;
};

static loom_param *add_param(loom_model *m, int i, const char *what, int nd, const int64_t *s) {
    char name[64];
    snprintf(name, sizeof name, "%d.%s", i, what);
    return loom_model_add(m, name, nd, s);
}

static bool build_layer(loom_model *m, int i, layer *l) {
    const loom_layer *s = &l->spec;
    switch (s->kind) {
        case LOOM_LAYER_LINEAR: {
            int64_t ws[2] = {s->out, s->in}, bs[1] = {s->out};
            if (s->in < 1 || s->out < 1)
                break;
            l->w = add_param(m, i, "weight", 2, ws);
            l->b = l->w ? add_param(m, i, "bias", 1, bs) : NULL;
            return l->b != NULL;
        }
        case LOOM_LAYER_CONV2D: {
            int64_t ws[4] = {s->out, s->in, s->kernel, s->kernel}, bs[1] = {s->out};
            if (s->in < 1 || s->out < 1 || s->kernel < 1 || s->stride < 0 || s->padding < 0)
                break;
            l->w = add_param(m, i, "weight", 4, ws);
            l->b = l->w ? add_param(m, i, "bias", 1, bs) : NULL;
            return l->b != NULL;
        }
        case LOOM_LAYER_MAXPOOL:
            if (s->kernel < 1 || s->stride < 0 || s->padding < 0)
                break;
            if (2 * s->padding > s->kernel) {
                loom__error(LOOM_EINVAL,
                            "loom_sequential_new: layer %d: max pooling padding %d, expected at "
                            "most half its window %d",
                            i, s->padding, s->kernel);
                return false;
            }
            return true;
        case LOOM_LAYER_RELU:
        case LOOM_LAYER_FLATTEN:
            return true;
        case LOOM_LAYER_END:
            break;
    }
    if (!*loom_last_error() || s->kind != LOOM_LAYER_END)
        loom__error(LOOM_EINVAL, "loom_sequential_new: layer %d (kind %d) has invalid sizes", i,
                    (int)s->kind);
    return false;
}

loom_sequential *loom_sequential_new(loom_model *m, const loom_layer *layers) {
    if (!m || !layers) {
        loom__error(LOOM_EINVAL, "loom_sequential_new: NULL argument");
        return NULL;
    }
    int n = 0;
    while (layers[n].kind != LOOM_LAYER_END)
        n++;
    loom_sequential *s = loom__calloc(1, sizeof *s);
    layer *ls = loom__calloc((size_t)n + 1, sizeof *ls);
    if (!s || !ls) {
        loom__free(s), loom__free(ls);
        return NULL;
    }
    s->m = m, s->n = n, s->layers = ls;
    for (int i = 0; i < n; i++) {
        ls[i].spec = layers[i];
        if (!build_layer(m, i, &ls[i])) {
            loom_sequential_free(s);
            return NULL;
        }
    }
    return s;
}

void loom_sequential_free(loom_sequential *s) {
    if (!s)
        return;
    loom__free(s->layers);
    loom__free(s);
}

static void fill_uniform(loom_param *p, uint64_t seed, double bound) {
    float *d = loom_param_data(p);
    uint64_t stream = (1ull << 32) | (uint64_t)p->index;
    for (int64_t j = 0; j < p->numel; j++)
        d[j] = (float)((2.0 * loom_rand_uniform(seed, stream, (uint64_t)j) - 1.0) * bound);
}

void loom_sequential_init(loom_sequential *s, uint64_t seed) {
    loom_model_touch(s->m);
    for (int i = 0; i < s->n; i++) {
        layer *l = &s->layers[i];
        if (!l->w)
            continue;
        int64_t fan_in = l->spec.in;
        if (l->spec.kind == LOOM_LAYER_CONV2D)
            fan_in *= (int64_t)l->spec.kernel * l->spec.kernel;
        double bound = 1.0 / sqrt((double)fan_in);
        fill_uniform(l->w, seed, bound);
        fill_uniform(l->b, seed, bound);
    }
}

/* A max pooling layer's window: square, its stride the kernel unless given (PyTorch's). */
static loom_tensor *max_pool(loom_graph *g, loom_tensor *x, const loom_layer *l) {
    int st = l->stride ? l->stride : l->kernel;
    return loom_pool_max(g, x, (loom_window){l->kernel, l->kernel, st, st, l->padding, l->padding});
}

loom_tensor *loom_sequential_forward(loom_graph *g, loom_sequential *s, loom_tensor *x) {
    for (int i = 0; i < s->n && x; i++) {
        const layer *l = &s->layers[i];
        switch (l->spec.kind) {
            case LOOM_LAYER_LINEAR:
                x = loom_linear(g, x, loom_parameter(g, l->w), loom_parameter(g, l->b));
                break;
            case LOOM_LAYER_CONV2D:
                x = loom_conv2d(g, x, loom_parameter(g, l->w), loom_parameter(g, l->b),
                                l->spec.stride ? l->spec.stride : 1, l->spec.padding);
                break;
            case LOOM_LAYER_MAXPOOL:
                x = max_pool(g, x, &l->spec);
                break;
            case LOOM_LAYER_RELU:
                /* ReLU then max pooling is computed as pooling then ReLU: the same values and
                 * gradients (both pick, ReLU keeps order; where the max is <= 0 both give 0 and
                 * no gradient), with the ReLU and its backward on the pooled tensor (a quarter
                 * of the size), and the pooling's backward reading no ReLU mask */
                if (i + 1 < s->n && s->layers[i + 1].spec.kind == LOOM_LAYER_MAXPOOL) {
                    x = loom_relu(g, max_pool(g, x, &s->layers[++i].spec));
                    break;
                }
                x = loom_relu(g, x);
                break;
            case LOOM_LAYER_FLATTEN:
                x = loom_flatten(g, x);
                break;
            case LOOM_LAYER_END:
                break;
        }
    }
    return x;
}
