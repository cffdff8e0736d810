/*
 * optim.c - SGD (momentum, nesterov, weight decay) and AdamW with PyTorch 1.13's update formulas
 * (torch/optim/sgd.py and adamw.py, single-tensor paths), recorded into the step graph. Values
 * that change from step to step (the learning rate, AdamW's bias corrections) are scalar inputs
 * read from this struct when the step runs, so they never change the program. State (momentum
 * buffers, moments) starts at zero in the model's STATE slab; with zero-initialised buffers,
 * PyTorch's first-step special case (buf = grad) gives the same values as the general formula.
 * The schedule (warm-up, cosine decay) sets the learning-rate input of each step; weight decay
 * is per parameter (parameter groups); gradient clipping is recorded into the step, after the
 * gradients' all-reduce, as torch.nn.utils.clip_grad_norm_ computes it.
 */
#include "../graph/internal.h"

#include <math.h>

#define M_PI_VALUE 3.14159265358979323846

typedef enum { OPT_SGD, OPT_ADAMW } opt_kind;

enum { H_LR, H_DECAY, H_STEP_SIZE, H_BC2_SQRT, H_COUNT };

struct loom_optim {
    opt_kind kind;
    loom_optim_config c;
    loom_model *m;
    int64_t n; /* the parameters it updates: those m had when it was made */
    int64_t t;
    int64_t *state; /* per parameter: up to two offsets in the STATE slab */
    double *decay;  /* per parameter: its weight decay (the config's unless set) */
    float *pdecay;  /* per parameter: AdamW's 1 - lr decay, where its decay is not the config's */
    float hyper[H_COUNT];
    double lr; /* of the step recorded last */
};

static loom_optim *optim_new(loom_model *m, const loom_optim_config *c, opt_kind kind) {
    loom_optim_config cfg = c ? *c : (loom_optim_config){0};
    if (cfg.lr == 0)
        cfg.lr = 0.01;
    if (kind == OPT_ADAMW) {
        cfg.beta1 = cfg.beta1 == 0 ? 0.9 : cfg.beta1;
        cfg.beta2 = cfg.beta2 == 0 ? 0.999 : cfg.beta2;
        cfg.eps = cfg.eps == 0 ? 1e-8 : cfg.eps;
    }
    if (!m || !(cfg.lr > 0) || cfg.momentum < 0 || cfg.weight_decay < 0 || cfg.beta1 < 0 ||
        cfg.beta1 >= 1 || cfg.beta2 < 0 || cfg.beta2 >= 1 || cfg.eps < 0 ||
        (cfg.nesterov && cfg.momentum <= 0)) {
        loom__error(LOOM_EINVAL,
                    "optimizer: invalid configuration (lr %g, momentum %g, weight "
                    "decay %g, nesterov %d)",
                    cfg.lr, cfg.momentum, cfg.weight_decay, (int)cfg.nesterov);
        return NULL;
    }
    if (cfg.warmup_steps < 0 || cfg.decay_steps < 0 || cfg.min_lr < 0 || cfg.clip_norm < 0 ||
        (cfg.decay_steps > 0 && cfg.decay_steps <= cfg.warmup_steps)) {
        loom__error(LOOM_EINVAL,
                    "optimizer: invalid schedule (warm-up %lld steps, decay to step %lld, min "
                    "lr %g, clip norm %g): expected decay_steps > warmup_steps >= 0",
                    (long long)cfg.warmup_steps, (long long)cfg.decay_steps, cfg.min_lr,
                    cfg.clip_norm);
        return NULL;
    }
    loom_optim *o = loom__calloc(1, sizeof *o);
    int64_t *st = loom__calloc((size_t)(2 * m->n + 1), sizeof *st);
    double *decay = loom__calloc((size_t)(m->n + 1), sizeof *decay);
    float *pdecay = loom__calloc((size_t)(m->n + 1), sizeof *pdecay);
    if (!o || !st || !decay || !pdecay) {
        loom__free(o), loom__free(st), loom__free(decay), loom__free(pdecay);
        return NULL;
    }
    o->kind = kind, o->c = cfg, o->m = m, o->state = st, o->decay = decay, o->pdecay = pdecay;
    o->lr = cfg.lr, o->n = m->n;
    for (int64_t i = 0; i < m->n; i++)
        decay[i] = cfg.weight_decay;
    int nstate = kind == OPT_ADAMW ? 2 : cfg.momentum != 0 ? 1 : 0;
    for (int64_t i = 0; i < m->n; i++) {
        for (int k = 0; k < nstate; k++) {
            st[2 * i + k] = loom__model_state(m, m->params[i]->numel);
            if (st[2 * i + k] < 0) {
                loom_optim_free(o);
                return NULL;
            }
        }
    }
    return o;
}

loom_optim *loom_sgd_new(loom_model *m, const loom_optim_config *c) {
    return optim_new(m, c, OPT_SGD);
}

loom_optim *loom_adamw_new(loom_model *m, const loom_optim_config *c) {
    return optim_new(m, c, OPT_ADAMW);
}

void loom_optim_free(loom_optim *o) {
    if (!o)
        return;
    loom__free(o->state);
    loom__free(o->decay);
    loom__free(o->pdecay);
    loom__free(o);
}

loom_status loom_optim_set_weight_decay(loom_optim *o, const loom_param *p, double wd) {
    if (!o || !p || p->m != o->m || p->index >= o->n || !(wd >= 0))
        return loom__error(LOOM_EINVAL, "loom_optim_set_weight_decay: %s",
                           !o || !p     ? "NULL argument"
                           : !(wd >= 0) ? "negative weight decay"
                                        : "a parameter of another model");
    o->decay[p->index] = wd;
    return LOOM_OK;
}

void loom_optim_decay_matrices_only(loom_optim *o, double wd) {
    for (int64_t i = 0; o && i < o->n; i++)
        o->decay[i] = o->m->params[i]->ndim >= 2 ? wd : 0.0;
}

double loom_optim_lr(const loom_optim *o) {
    return o ? o->lr : NAN;
}

/* The learning rate at step t (0-based) of the schedule. */
static double scheduled_lr(const loom_optim_config *c, int64_t t) {
    if (t < c->warmup_steps)
        return c->lr * (double)(t + 1) / (double)(c->warmup_steps + 1);
    if (c->decay_steps <= 0)
        return c->lr;
    if (t > c->decay_steps)
        return c->min_lr;
    double ratio = (double)(t - c->warmup_steps) / (double)(c->decay_steps - c->warmup_steps);
    return c->min_lr + 0.5 * (1.0 + cos(M_PI_VALUE * ratio)) * (c->lr - c->min_lr);
}

double loom_optim_lr_at(const loom_optim *o, int64_t t) {
    return scheduled_lr(&o->c, t < 0 ? 0 : t);
}

void loom_optim_set_lr(loom_optim *o, double lr) {
    if (lr > 0)
        o->c.lr = lr;
}

static loom_tensor *hyper(loom_graph *g, loom_optim *o, int which) {
    return loom_input(g, LOOM_F32, 0, NULL, &o->hyper[which]);
}

static loom_tensor *k(loom_graph *g, double v) {
    return loom_scalar(g, v, LOOM_F32);
}

static void sgd_update(loom_graph *g, loom_optim *o, loom_param *p, loom_tensor *w,
                       loom_tensor *grad, loom_tensor *lr) {
    const loom_optim_config *c = &o->c;
    loom_tensor *d = grad;
    double wd = o->decay[p->index];
    if (wd != 0)
        d = loom_add(g, d, loom_mul(g, k(g, wd), w));
    if (c->momentum != 0) {
        int64_t off = o->state[2 * p->index];
        loom_tensor *buf = loom__persist(g, LOOM_SLAB_STATE, off, p->ndim, p->shape);
        loom_tensor *nb = loom_add(g, loom_mul(g, buf, k(g, c->momentum)), d);
        loom__store(g, nb, LOOM_SLAB_STATE, off);
        d = c->nesterov ? loom_add(g, d, loom_mul(g, k(g, c->momentum), nb)) : nb;
    }
    loom__store(g, loom_sub(g, w, loom_mul(g, lr, d)), LOOM_SLAB_PARAM, p->offset);
}

static void adamw_update(loom_graph *g, loom_optim *o, loom_param *p, loom_tensor *w,
                         loom_tensor *grad, loom_tensor *const *h) {
    const loom_optim_config *c = &o->c;
    int64_t o1 = o->state[2 * p->index], o2 = o->state[2 * p->index + 1];
    loom_tensor *m1 = loom__persist(g, LOOM_SLAB_STATE, o1, p->ndim, p->shape);
    loom_tensor *m2 = loom__persist(g, LOOM_SLAB_STATE, o2, p->ndim, p->shape);
    double decay = o->decay[p->index];
    loom_tensor *wd = decay == c->weight_decay ? loom_mul(g, w, h[H_DECAY])
                      : decay == 0
                          ? w /* (PyTorch multiplies by 1.0: the same) */
                          : loom_mul(g, w, loom_input(g, LOOM_F32, 0, NULL, &o->pdecay[p->index]));
    loom_tensor *n1 =
        loom_add(g, loom_mul(g, m1, k(g, c->beta1)), loom_mul(g, k(g, 1.0 - c->beta1), grad));
    loom_tensor *n2 = loom_add(g, loom_mul(g, m2, k(g, c->beta2)),
                               loom_mul(g, k(g, 1.0 - c->beta2), loom_mul(g, grad, grad)));
    loom__store(g, n1, LOOM_SLAB_STATE, o1);
    loom__store(g, n2, LOOM_SLAB_STATE, o2);
    loom_tensor *denom = loom_add(g, loom_div(g, loom_sqrt(g, n2), h[H_BC2_SQRT]), k(g, c->eps));
    loom_tensor *upd = loom_mul(g, h[H_STEP_SIZE], loom_div(g, n1, denom));
    loom__store(g, loom_sub(g, wd, upd), LOOM_SLAB_PARAM, p->offset);
}

/* clip_grad_norm_'s factor: min(1, clip / (||(||g_1||, ..., ||g_n||)|| + 1e-6)), a scalar. */
static loom_tensor *clip_coef(loom_graph *g, loom_optim *o) {
    loom_tensor *sq = NULL;
    for (int64_t i = 0; i < o->n; i++) {
        loom_param *p = o->m->params[i];
        loom_tensor *gr = loom__persist(g, LOOM_SLAB_GRAD, p->offset, p->ndim, p->shape);
        loom_tensor *norm = loom_sqrt(g, loom_sum_all(g, loom_mul(g, gr, gr)));
        loom_tensor *n2 = loom_mul(g, norm, norm);
        sq = sq ? loom_add(g, sq, n2) : n2;
    }
    if (!sq)
        return NULL;
    loom_tensor *coef =
        loom_div(g, k(g, o->c.clip_norm), loom_add(g, loom_sqrt(g, sq), k(g, 1e-6)));
    return loom_where(g, loom_cmpgt(g, coef, k(g, 1.0)), k(g, 1.0), coef);
}

void loom_optim_step(loom_graph *g, loom_optim *o) {
    if (!g || g->err)
        return;
    if (!o || g->model != o->m) {
        loom__graph_fail(g, LOOM_EINVAL, "loom_optim_step: %s",
                         o ? "optimizer and graph have different models" : "NULL optimizer");
        return;
    }
    const loom_optim_config *c = &o->c;
    double lr = o->lr = scheduled_lr(c, o->t), t = (double)++o->t;
    o->hyper[H_LR] = (float)lr;
    o->hyper[H_DECAY] = (float)(1.0 - lr * c->weight_decay);
    o->hyper[H_STEP_SIZE] = (float)(lr / (1.0 - pow(c->beta1, t)));
    o->hyper[H_BC2_SQRT] = (float)sqrt(1.0 - pow(c->beta2, t));
    for (int64_t i = 0; i < o->n; i++)
        o->pdecay[i] = (float)(1.0 - lr * o->decay[i]);
    loom_tensor *h[H_COUNT];
    for (int i = 0; i < H_COUNT; i++)
        h[i] = hyper(g, o, i);
    loom_tensor *clip = c->clip_norm > 0 ? clip_coef(g, o) : NULL;
    /* the last parameter first: the first layer's update then runs last in the step, and its
     * weight is still in cache when the next step's forward starts with it */
    for (int64_t i = o->n - 1; i >= 0; i--) {
        loom_param *p = o->m->params[i];
        loom_tensor *w = loom_parameter(g, p);
        loom_tensor *grad = loom__persist(g, LOOM_SLAB_GRAD, p->offset, p->ndim, p->shape);
        if (clip)
            grad = loom_mul(g, grad, clip);
        if (o->kind == OPT_SGD)
            sgd_update(g, o, p, w, grad, h[H_LR]);
        else
            adamw_update(g, o, p, w, grad, h);
    }
}

const char *loom_optim_name(const loom_optim *o) {
    return o->kind == OPT_ADAMW ? "adamw" : "sgd";
}

int loom_optim_state_keys(const loom_optim *o) {
    return o->kind == OPT_ADAMW ? 2 : o->c.momentum != 0 ? 1 : 0;
}

const char *loom_optim_state_key(const loom_optim *o, int k) {
    if (k < 0 || k >= loom_optim_state_keys(o))
        return NULL;
    return o->kind == OPT_SGD ? "momentum_buffer" : k == 0 ? "exp_avg" : "exp_avg_sq";
}

float *loom_optim_state(loom_optim *o, const loom_param *p, int k) {
    if (!p || p->m != o->m || p->index >= o->n || k < 0 || k >= loom_optim_state_keys(o))
        return NULL;
    loom__model_settle(o->m);
    return o->m->slab[LOOM_SLAB_STATE] + o->state[2 * p->index + k];
}

int64_t loom_optim_steps(const loom_optim *o) {
    return o->t;
}

loom_status loom_optim_set_steps(loom_optim *o, int64_t t) {
    if (t < 0)
        return loom__error(LOOM_EINVAL, "loom_optim_set_steps: %lld steps", (long long)t);
    o->t = t;
    o->lr = t > 0 ? scheduled_lr(&o->c, t - 1) : o->c.lr;
    return LOOM_OK;
}
