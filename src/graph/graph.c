/*
 * graph.c - the step graph: the op table read from ops.def, node creation from the bump arena,
 * leaves (inputs, constants, persistent tensors), the sticky error and tensor accessors.
 * Once a builder fails, the graph keeps the first message and every later builder returns NULL,
 * so model code stays straight-line; loom_graph_run() returns the error.
 */
#include "internal.h"

#include <math.h>
#include <string.h>

const loom__opinfo loom__ops[LOOM_OP_COUNT] = {
#define LOOM_LEAF(name, attr)          [LOOM_OP_##name] = {#name, LOOM_KIND_LEAF, 0, LOOM_ATTR_##attr},
#define LOOM_EW(name, arity, expr)     [LOOM_OP_##name] = {#name, LOOM_KIND_EW, arity, LOOM_ATTR_NONE},
#define LOOM_RED(name, combine, ident) [LOOM_OP_##name] = {#name, LOOM_KIND_RED, 1, LOOM_ATTR_AXIS},
#define LOOM_MOV(name, attr)           [LOOM_OP_##name] = {#name, LOOM_KIND_MOV, 1, LOOM_ATTR_##attr},
#define LOOM_OPQ(name, arity, attr) \
    [LOOM_OP_##name] = {#name, LOOM_KIND_OPQ, arity, LOOM_ATTR_##attr},
#include "ops.def"
};

size_t loom__dtype_size(loom_dtype dt) {
    return dt == LOOM_F64 ? 8 : 4;
}

const char *loom__dtype_name(loom_dtype dt) {
    switch (dt) {
        case LOOM_F32:
            return "f32";
        case LOOM_F64:
            return "f64";
        case LOOM_I32:
            return "i32";
    }
    return "?";
}

int64_t loom__numel(int ndim, const int64_t *shape) {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++)
        n *= shape[i];
    return n;
}

/* Whether a shape of dims >= 0 has at most LOOM_MAX_NUMEL elements (checked, with no wrap). */
static bool numel_ok(int ndim, const int64_t *shape) {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++)
        if (!loom_size_mul(n, shape[i], LOOM_MAX_NUMEL, &n))
            return false;
    return true;
}

void loom__shape_str(const loom_tensor *t, char *buf, size_t size) {
    if (!t) {
        snprintf(buf, size, "NULL");
        return;
    }
    size_t k = (size_t)snprintf(buf, size, "(");
    for (int i = 0; i < t->ndim && k < size; i++)
        k += (size_t)snprintf(buf + k, size - k, "%s%lld", i ? "," : "", (long long)t->shape[i]);
    if (k < size)
        snprintf(buf + k, size - k, ")");
}

loom_graph *loom_graph_new(loom_model *m) {
    if (loom_env_check())
        return NULL;
    loom_graph *g = loom__calloc(1, sizeof *g);
    if (g) {
        g->model = m;
        g->ndev = g->nlocal = 1;
        g->batch_rows = g->batch_cap = -1;
    }
    return g;
}

void loom_graph_free(loom_graph *g) {
    if (!g)
        return;
    loom__graph_settle(g); /* a submitted step reads the programs and the workspace */
    if (g->runner)
        g->runner->forget(g->runner_ctx, g);
    if (loom__getenv()->metrics) {
        char buf[1024];
        loom_metrics_format(&g->metrics, buf, sizeof buf);
        loom__log(LOOM_LOG_INFO, "%s", buf);
    }
    if (g->run)
        g->run_hooks->free(g);
    loom__arena_free(&g->arena);
    loom__free(g->nodes);
    loom__free(g);
}

void loom_graph_reset(loom_graph *g) {
    if (g->run)
        g->run_hooks->reset(g);
    loom__arena_reset(&g->arena);
    g->n = 0;
    g->ninputs = 0;
    g->persist_nodes = NULL, g->npersist = 0;
    g->err = LOOM_OK;
    g->errmsg[0] = 0;
    g->batch_rows = g->batch_cap = -1;
    g->mask_node = g->count_node = g->row0_node = NULL;
}

const char *loom_graph_error(const loom_graph *g) {
    return g->err ? g->errmsg : NULL;
}

void loom__graph_fail(loom_graph *g, loom_status s, const char *fmt, ...) {
    if (g->err)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g->errmsg, sizeof g->errmsg, fmt, ap);
    va_end(ap);
    g->err = s;
}

loom_tensor *loom__node(loom_graph *g, loom__op op, loom_dtype dt, int ndim, const int64_t *shape,
                        loom_tensor *a, loom_tensor *b, loom_tensor *c) {
    if (g->err)
        return NULL;
    if (ndim < 0 || ndim > LOOM_MAX_DIMS) {
        loom__graph_fail(g, LOOM_ESHAPE, "%s: %d dims, at most %d supported", loom__ops[op].name,
                         ndim, LOOM_MAX_DIMS);
        return NULL;
    }
    if (!numel_ok(ndim, shape)) {
        char s[256];
        size_t k = 0;
        for (int i = 0; i < ndim && k < sizeof s; i++)
            k += (size_t)snprintf(s + k, sizeof s - k, "%s%lld", i ? "," : "", (long long)shape[i]);
        loom__graph_fail(g, LOOM_ERANGE, "%s: shape (%s) has more than 2^40 elements",
                         loom__ops[op].name, s);
        return NULL;
    }
    if (loom__grow((void **)&g->nodes, &g->cap, g->n + 1, sizeof *g->nodes)) {
        loom__graph_fail(g, LOOM_ENOMEM, "%s: out of memory", loom__ops[op].name);
        return NULL;
    }
    loom_tensor *t = loom__arena_alloc(&g->arena, sizeof *t);
    if (!t) {
        loom__graph_fail(g, LOOM_ENOMEM, "%s: out of memory", loom__ops[op].name);
        return NULL;
    }
    t->g = g;
    t->id = (int32_t)g->n;
    t->op = (uint8_t)op;
    t->dtype = (uint8_t)dt;
    t->ndim = (uint8_t)ndim;
    for (int i = 0; i < ndim; i++)
        t->shape[i] = shape[i];
    t->src[0] = a, t->src[1] = b, t->src[2] = c;
    for (int i = 0; i < 3; i++)
        if (t->src[i] && t->src[i]->requires_grad)
            t->requires_grad = true;
    g->nodes[g->n++] = t;
    return t;
}

static bool check_shape(loom_graph *g, const char *what, int ndim, const int64_t *shape) {
    if (ndim < 0 || ndim > LOOM_MAX_DIMS || (ndim > 0 && !shape)) {
        loom__graph_fail(g, LOOM_ESHAPE, "%s: %d dims, expected 0 to %d", what, ndim,
                         LOOM_MAX_DIMS);
        return false;
    }
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0) {
            loom__graph_fail(g, LOOM_ESHAPE, "%s: dim %d is %lld, expected >= 0", what, i,
                             (long long)shape[i]);
            return false;
        }
    }
    return true;
}

loom_tensor *loom_input(loom_graph *g, loom_dtype dt, int ndim, const int64_t *shape,
                        const void *data) {
    if (!g || g->err || !check_shape(g, "loom_input", ndim, shape))
        return NULL;
    if (!data && loom__numel(ndim, shape) > 0) {
        loom__graph_fail(g, LOOM_EINVAL, "loom_input: NULL data for %lld elements",
                         (long long)loom__numel(ndim, shape));
        return NULL;
    }
    loom_tensor *t = loom__node(g, LOOM_OP_INPUT, dt, ndim, shape, NULL, NULL, NULL);
    if (t) {
        t->attr.input = g->ninputs++;
        t->data = data;
    }
    return t;
}

loom_tensor *loom_input_batch_padded(loom_graph *g, loom_dtype dt, int ndim, const int64_t *shape,
                                     const void *data, int64_t rows) {
    if (!g || g->err || !check_shape(g, "loom_input_batch", ndim, shape))
        return NULL;
    int64_t cap = rows < 0 ? shape[0] : rows;
    if (ndim < 1 || (g->batch_rows >= 0 && (shape[0] != g->batch_rows || cap != g->batch_cap)) ||
        cap < shape[0]) {
        loom__graph_fail(g, LOOM_ESHAPE, "loom_input_batch: %s",
                         ndim < 1         ? "expected a batch dim"
                         : cap < shape[0] ? "padded to fewer rows than the batch has"
                                          : "every batch input of a step needs the same number "
                                            "of rows (and the same padded rows)");
        return NULL;
    }
    int64_t local[LOOM_MAX_DIMS];
    memcpy(local, shape, sizeof(int64_t) * (size_t)ndim);
    local[0] = (cap + g->ndev - 1) / g->ndev; /* the last shards are padded */
    loom_tensor *t = loom_input(g, dt, ndim, local, data);
    if (t) {
        t->role = LOOM_ROLE_BATCH;
        g->batch_rows = shape[0], g->batch_cap = cap;
    }
    return t;
}

loom_tensor *loom_input_batch(loom_graph *g, loom_dtype dt, int ndim, const int64_t *shape,
                              const void *data) {
    return loom_input_batch_padded(g, dt, ndim, shape, data, -1);
}

/* An input bound per device by the runner (no caller buffer). */
static loom_tensor *bound_input(loom_graph *g, loom__role role, int ndim, const int64_t *shape) {
    loom_dtype dt = role == LOOM_ROLE_ROW0 ? LOOM_I32 : LOOM_F32;
    loom_tensor *t = loom__node(g, LOOM_OP_INPUT, dt, ndim, shape, NULL, NULL, NULL);
    if (t) {
        t->attr.input = g->ninputs++;
        t->role = (uint8_t)role;
    }
    return t;
}

int64_t loom__local_rows(const loom_graph *g, int ndev) {
    int64_t cap = g->batch_cap > g->batch_rows ? g->batch_cap : g->batch_rows;
    return cap < 0 ? 0 : (cap + ndev - 1) / ndev;
}

int64_t loom__shard_rows(const loom_graph *g, int d, int ndev) {
    int64_t b = g->batch_rows < 0 ? 0 : g->batch_rows, local = loom__local_rows(g, ndev);
    int64_t r = b - d * local;
    return r < 0 ? 0 : r < local ? r : local;
}

loom_tensor *loom__batch_mask(loom_graph *g) {
    if (!g->mask_node && g->batch_rows >= 0) {
        int64_t local = loom__local_rows(g, g->ndev);
        g->mask_node = bound_input(g, LOOM_ROLE_MASK, 1, &local);
    }
    return g->mask_node;
}

loom_tensor *loom__batch_row0(loom_graph *g) {
    if (!g->row0_node)
        g->row0_node = bound_input(g, LOOM_ROLE_ROW0, 0, NULL);
    return g->row0_node;
}

loom_tensor *loom__batch_count(loom_graph *g) {
    if (!g->count_node && g->batch_rows >= 0)
        g->count_node = bound_input(g, LOOM_ROLE_COUNT, 0, NULL);
    return g->count_node;
}

loom_tensor *loom_scalar(loom_graph *g, double value, loom_dtype dt) {
    if (!g)
        return NULL;
    loom_tensor *t = loom__node(g, LOOM_OP_CONST, dt, 0, NULL, NULL, NULL, NULL);
    if (t)
        t->attr.value = value;
    return t;
}

loom_tensor *loom__scalar_like(loom_graph *g, loom_tensor *x, double v) {
    return x ? loom_scalar(g, v, (loom_dtype)x->dtype) : NULL;
}

loom_tensor *loom__persist(loom_graph *g, loom__slab slab, int64_t offset, int ndim,
                           const int64_t *shape) {
    loom_tensor *t = loom__node(g, LOOM_OP_PERSIST, LOOM_F32, ndim, shape, NULL, NULL, NULL);
    if (t) {
        t->attr.persist.slab = slab;
        t->attr.persist.offset = offset;
    }
    return t;
}

void loom__store(loom_graph *g, loom_tensor *v, loom__slab slab, int64_t offset) {
    if (!v)
        return;
    loom_tensor *t =
        loom__node(g, LOOM_OP_STORE, (loom_dtype)v->dtype, v->ndim, v->shape, v, NULL, NULL);
    if (t) {
        t->requires_grad = false;
        t->attr.persist.slab = slab;
        t->attr.persist.offset = offset;
    }
}

loom_tensor *loom_parameter(loom_graph *g, loom_param *p) {
    if (!g || g->err)
        return NULL;
    if (!p || p->m != g->model) {
        loom__graph_fail(g, LOOM_EINVAL, "loom_parameter: %s",
                         p ? "parameter belongs to another model" : "NULL parameter");
        return NULL;
    }
    if (p->index >= g->npersist) { /* parameters added since the step took its first */
        int64_t n = g->model->n;
        loom_tensor **t = loom__arena_alloc(&g->arena, sizeof(loom_tensor *) * (size_t)(n + 1));
        if (!t) {
            loom__graph_fail(g, LOOM_ENOMEM, "loom_parameter: out of memory");
            return NULL;
        }
        for (int64_t i = 0; i < n; i++)
            t[i] = i < g->npersist ? g->persist_nodes[i] : NULL;
        g->persist_nodes = t, g->npersist = n;
    }
    loom_tensor *t = g->persist_nodes[p->index];
    if (!t) {
        t = loom__persist(g, LOOM_SLAB_PARAM, p->offset, p->ndim, p->shape);
        if (t)
            t->requires_grad = true;
        g->persist_nodes[p->index] = t;
    }
    return t;
}

void loom_input_borrow(loom_tensor *t) {
    if (t && t->op == LOOM_OP_INPUT)
        t->borrowed = true;
}

void loom_requires_grad(loom_tensor *t) {
    if (t)
        t->requires_grad = true;
}

void loom_output(loom_tensor *t) {
    if (t)
        t->is_output = true;
}

loom_dtype loom_tensor_dtype(const loom_tensor *t) {
    return (loom_dtype)t->dtype;
}
int loom_tensor_ndim(const loom_tensor *t) {
    return t->ndim;
}
const int64_t *loom_tensor_shape(const loom_tensor *t) {
    return t->shape;
}
int64_t loom_tensor_numel(const loom_tensor *t) {
    return loom__numel(t->ndim, t->shape);
}

double loom__first_value(loom_dtype dt, const void *p) {
    switch (dt) {
        case LOOM_F32:
            return *(const float *)p;
        case LOOM_F64:
            return *(const double *)p;
        case LOOM_I32:
            return *(const int32_t *)p;
    }
    return NAN;
}

void loom_graph_metrics(const loom_graph *g, loom_metrics *out) {
    *out = g->metrics;
}

void loom_metrics_format(const loom_metrics *m, char *buf, size_t size) {
    int k =
        snprintf(buf, size,
                 "metrics: graphs built %lld, programs built %lld, cache hits %lld, nodes %lld, "
                 "kernels/step %lld, ops fused %lld, compiles %lld (%.2f s), disk cache hits "
                 "%lld, peak workspace %.1f MiB, plan %.3f s, execute %.3f s",
                 (long long)m->graphs_built, (long long)m->programs_built, (long long)m->cache_hits,
                 (long long)m->nodes, (long long)m->kernels, (long long)m->fused_ops,
                 (long long)m->compiles, m->compile_seconds, (long long)m->disk_hits,
                 (double)m->workspace_bytes / 1048576.0, m->plan_seconds, m->exec_seconds);
    if (m->devices > 0 && k > 0 && (size_t)k < size)
        snprintf(buf + k, size - (size_t)k,
                 "\nmetrics: %lld devices, all-reduced %.1f MiB, %.3f s in collectives per device, "
                 "compute per device %.3f to %.3f s (imbalance %.1f%%), %lld updates shared",
                 (long long)m->devices, (double)m->allreduce_bytes / 1048576.0,
                 m->collective_seconds, m->device_compute_min, m->device_compute_max,
                 m->device_compute_min > 0
                     ? 100.0 * (m->device_compute_max / m->device_compute_min - 1.0)
                     : 0.0,
                 (long long)m->shared_updates);
}

void loom_assign(loom_graph *g, loom_param *p, loom_tensor *v) {
    if (!g || g->err)
        return;
    if (!p || p->m != g->model || !v || v->dtype != LOOM_F32 || v->ndim != p->ndim ||
        memcmp(v->shape, p->shape, sizeof(int64_t) * (size_t)p->ndim) != 0) {
        char sv[96];
        loom__shape_str(v, sv, sizeof sv);
        loom__graph_fail(g, LOOM_ESHAPE,
                         "loom_assign: value %s for parameter '%s', expected f32 of "
                         "the parameter's shape",
                         sv, p ? p->name : "NULL");
        return;
    }
    loom__store(g, v, LOOM_SLAB_PARAM, p->offset);
}

void loom_graph_set_backend(loom_graph *g, loom_backend b) {
    g->backend = b;
}
