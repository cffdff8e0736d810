/*
 * graph/internal.h - the node of a step graph, the op table, the graph object and the model's
 * persistent slabs, shared by graph/, compile/, backend/, nn/ and optim/. Never installed.
 *
 * Invariants: nodes of a graph are numbered 0..n-1 in creation order, and every input of a node
 * has a smaller id, so creation order is a topological order. A node's shape is final when it is
 * created (shape inference happens in the builder).
 */
#ifndef LOOM_GRAPH_INTERNAL_H
#define LOOM_GRAPH_INTERNAL_H

#include "../core/internal.h"

typedef enum {
#define LOOM_LEAF(name, attr)          LOOM_OP_##name,
#define LOOM_EW(name, arity, expr)     LOOM_OP_##name,
#define LOOM_RED(name, combine, ident) LOOM_OP_##name,
#define LOOM_MOV(name, attr)           LOOM_OP_##name,
#define LOOM_OPQ(name, arity, attr)    LOOM_OP_##name,
#include "ops.def"
    LOOM_OP_COUNT
} loom__op;

typedef enum {
    LOOM_KIND_LEAF,
    LOOM_KIND_EW,
    LOOM_KIND_RED,
    LOOM_KIND_MOV,
    LOOM_KIND_OPQ
} loom__kind;

/* Which field of loom__attr an op reads (declared per op in ops.def). */
typedef enum {
    LOOM_ATTR_NONE,
    LOOM_ATTR_AXIS,
    LOOM_ATTR_PERM,
    LOOM_ATTR_WINDOW,
    LOOM_ATTR_CLASSES,
    LOOM_ATTR_VALUE,
    LOOM_ATTR_REDUCE,
    LOOM_ATTR_INPUT,
    LOOM_ATTR_PERSIST
} loom__attrkind;

typedef struct {
    const char *name; /* "ADD" */
    loom__kind kind;
    int arity;
    loom__attrkind attr;
} loom__opinfo;
extern const loom__opinfo loom__ops[LOOM_OP_COUNT];

/* The three persistent slabs of a model. */
typedef enum { LOOM_SLAB_PARAM, LOOM_SLAB_GRAD, LOOM_SLAB_STATE, LOOM_SLAB_COUNT } loom__slab;

typedef union {
    /* one field per loom__attrkind; ops.def says which op reads which */
    int axis;                /* AXIS */
    int perm[LOOM_MAX_DIMS]; /* PERM */
    loom_window win;         /* WINDOW (strides already defaulted to >= 1) */
    int64_t classes;         /* CLASSES */
    double value;            /* VALUE */
    loom_reduce_op reduce;   /* REDUCE */
    int32_t input;           /* INPUT: ordinal among the graph's inputs */
    struct {
        int32_t slab;   /* loom__slab */
        int64_t offset; /* in elements */
    } persist;          /* PERSIST (of a STORE or SYNC: the target) */
} loom__attr;

/* What an INPUT is bound to when the step runs (per device under data parallelism). */
typedef enum {
    LOOM_ROLE_PLAIN, /* the caller's buffer, the same on every device */
    LOOM_ROLE_BATCH, /* the caller's global batch, split along dim 0 (last shard padded) */
    LOOM_ROLE_MASK,  /* per device: 1 for each real row of the batch shard, 0 for padding */
    LOOM_ROLE_COUNT, /* scalar: real rows of the global batch / devices */
    LOOM_ROLE_ROW0,  /* i32 scalar, per device: the global batch row of its shard's first row */
} loom__role;

struct loom_tensor {
    loom_graph *g;
    int32_t id;
    uint8_t op;    /* loom__op */
    uint8_t dtype; /* loom_dtype */
    uint8_t ndim;
    uint8_t role;       /* INPUT: loom__role */
    bool requires_grad; /* depends on a leaf that gradients are taken for */
    bool is_output;
    bool is_loss;  /* checked for NaN/Inf under anomaly detection */
    bool borrowed; /* INPUT: read in place when the step runs, not copied at submit */
    int64_t shape[LOOM_MAX_DIMS];
    loom_tensor *src[3];
    loom__attr attr;
    const void *data; /* INPUT: the caller's buffer, bound when the step runs */
};

typedef struct loom__program loom__program;
typedef struct loom__executor loom__executor;
typedef struct loom__steps loom__steps;
typedef struct {
    loom_status (*finish)(loom_graph *g); /* ends g's submitted step, if any */
    void (*reset)(loom_graph *g);         /* the step's tensors go; a step in flight runs on */
    void (*free)(loom_graph *g);          /* its step in flight ended first */
} loom__steps_hooks;

/* Runs programs on several devices (dist/devices.c); NULL in a graph means one device, here.
 * submit starts g's step (program p) and returns; wait ends it (LOOM_OK if g has none running).
 * The devices hold the results of the last step they ran until another graph's step starts:
 * then they have that step's graph keep its outputs (loom__graph_keep) first. */
typedef struct {
    loom_status (*submit)(void *ctx, loom_graph *g, loom__program *p);
    loom_status (*wait)(void *ctx, loom_graph *g);
    /* device d's copy of node id of program p after its step */
    const void *(*data)(void *ctx, const loom__program *p, int32_t id, int d);
    /* g (its steps ended) leaves these devices: freed, or set to run elsewhere */
    void (*forget)(void *ctx, const loom_graph *g);
    /* all = every process's `bytes` of `mine`, in process order (a collective across the
     * processes when the devices span several; a copy otherwise) */
    loom_status (*allgather)(void *ctx, const void *mine, size_t bytes, void *all);
} loom__runner;

struct loom_graph {
    loom_model *model;
    loom__arena arena;
    loom_tensor **nodes;
    int64_t n, cap;
    int32_t ninputs;
    loom_tensor **persist_nodes; /* per model parameter, this step's PERSIST node or NULL */
    int64_t npersist;            /* ... for the parameters [0, npersist) */
    loom_status err;
    char errmsg[512];
    /* what running its steps keeps: programs, workspace, the step in flight and the last one's
     * results (compile/program.c's alone, made on the first step; NULL before), and how the graph,
     * which knows nothing of compiling, ends a step in flight, resets that state and frees it */
    loom__steps *run;
    const loom__steps_hooks *run_hooks;
    loom_metrics metrics;
    loom_backend backend;
    /* devices: set by loom_graph_set_devices() before the first node */
    const loom__runner *runner;
    void *runner_ctx;
    int ndev;   /* devices the batch is split over: those of every process */
    int nlocal; /* of which this process runs nlocal, from device index dev0 on */
    int dev0;
    int64_t bucket_bytes;
    bool detect_anomaly;
    /* this step's batch: global rows (-1 before a batch input), its mask and count inputs */
    int64_t batch_rows; /* the real rows of the step's batch inputs (-1: none) */
    int64_t batch_cap;  /* the rows they are shaped for (loom_input_batch_padded; -1: their rows) */
    loom_tensor *mask_node, *count_node, *row0_node;
};

struct loom_param {
    loom_model *m;
    char *name;
    int index;
    int ndim;
    int64_t shape[LOOM_MAX_DIMS];
    int64_t numel;
    int64_t offset; /* in elements, in both the PARAM and GRAD slabs */
};

/* String metadata, key -> value (a safetensors header's "__metadata__"): copies, in the order
 * set. */
typedef struct {
    char **key, **val;
    int64_t n, cap;
} loom__meta;
loom_status loom__meta_set(loom__meta *md, const char *key, const char *val); /* NULL: removes */
const char *loom__meta_get(const loom__meta *md, const char *key);
void loom__meta_free(loom__meta *md);

struct loom_model {
    loom_param **params;
    int64_t n, cap;
    float *slab[LOOM_SLAB_COUNT];
    int64_t len[LOOM_SLAB_COUNT], slab_cap[LOOM_SLAB_COUNT];
    uint64_t version;    /* bumped when the host changes slabs: replicas resynchronize */
    loom_graph *running; /* the graph whose submitted step reads and writes the slabs, or NULL */
    /* A slab may be lent to the devices that run m's steps, which keep it in memory of their
     * own (device 0's gradients, where other processes read them in place: dist/devices.c):
     * away[s], when set, holds its current values, and the host's next look copies them back.
     * lender is who lent it; lent_end(lender, m) ends the loan when m is freed. */
    float *away[LOOM_SLAB_COUNT];
    /* other names of parameters (loom_model_tie): tie_name[i] is params[tie_of[i]] */
    char **tie_name;
    int64_t *tie_of, nties;
    void *lender;
    void (*lent_end)(void *lender, loom_model *m);
    loom__meta meta; /* written by loom_model_save, replaced by loom_model_load */
};

/* Ends the step running on m, if any, and brings back slabs away, before the host reads or
 * changes m's slabs. */
void loom__model_settle(const loom_model *m);

/* model.c: optimizer state, zero-filled; returns its offset in the STATE slab or -1 (ENOMEM). */
int64_t loom__model_state(loom_model *m, int64_t numel);

/* graph.c */
loom_tensor *loom__node(loom_graph *g, loom__op op, loom_dtype dt, int ndim, const int64_t *shape,
                        loom_tensor *a, loom_tensor *b, loom_tensor *c);
void loom__graph_fail(loom_graph *g, loom_status s, const char *fmt, ...) LOOM_PRINTF(3, 4);
/* "(2,3)" for a tensor of shape (2, 3), "NULL" for none. */
void loom__shape_str(const loom_tensor *t, char *buf, size_t size);
int64_t loom__numel(int ndim, const int64_t *shape);
size_t loom__dtype_size(loom_dtype dt);
const char *loom__dtype_name(loom_dtype dt);
/* A PERSIST node reading `numel` elements of a slab at offset, viewed with the given shape. */
loom_tensor *loom__persist(loom_graph *g, loom__slab slab, int64_t offset, int ndim,
                           const int64_t *shape);
/* Records the store of v into a slab (a side effect: always executed). */
void loom__store(loom_graph *g, loom_tensor *v, loom__slab slab, int64_t offset);
/* A scalar of x's dtype broadcast against nothing (shape ()). */
loom_tensor *loom__scalar_like(loom_graph *g, loom_tensor *x, double v);
/* GELU's derivative at x (GELUD); loom_gelu makes it beside GELU where a gradient may be taken. */
loom_tensor *loom__gelu_deriv(loom_graph *g, loom_tensor *x);
/* ATTENTION y's gradient (B, T, 3, H, D) from its input qkv and the output's gradient gy. */
loom_tensor *loom__attention_grad(loom_graph *g, loom_tensor *qkv, loom_tensor *gy, loom_tensor *y,
                                  bool causal);
/* Layer normalization without weight or bias (LNORM) and its input gradient (LNORMGRAD) from x
 * and the output's gradient gy: row kernels along the last axis. */
loom_tensor *loom__lnorm(loom_graph *g, loom_tensor *x, double eps);
loom_tensor *loom__lnorm_grad(loom_graph *g, loom_tensor *x, loom_tensor *gy, double eps);

/* The real rows (not padding) of device d's shard when this step's batch is split over ndev
 * devices (0 without a batch input). */
int64_t loom__shard_rows(const loom_graph *g, int d, int ndev);
/* The rows of each device's shard of the step's batch on ndev devices (its padded rows too). */
int64_t loom__local_rows(const loom_graph *g, int ndev);
/* The batch's mask (local rows) and count (scalar) inputs; see loom__role. */
loom_tensor *loom__batch_mask(loom_graph *g);
loom_tensor *loom__batch_count(loom_graph *g);
/* The i32 scalar input holding, on each device, the global batch row of its shard's first row (0
 * without devices or a batch). */
loom_tensor *loom__batch_row0(loom_graph *g);

/* autograd.c: gradients of loss w.r.t. each of wrt[0..n) into out (NULL where no path); `ready`
 * (may be NULL) is called as each becomes final during the walk, last-used first. */
typedef void (*loom__grad_ready)(void *ctx, int i, loom_tensor *grad);
void loom__grads(loom_graph *g, loom_tensor *loss, int n, loom_tensor *const *wrt,
                 loom_tensor **out, loom__grad_ready ready, void *ctx);

/* Ends the step running on g, if any (through g->run_hooks: graph/ calls nothing above it). */
static inline void loom__graph_settle(loom_graph *g) {
    if (g->run)
        g->run_hooks->finish(g);
}

/* The first element of a tensor's data of dtype dt, as a double. */
double loom__first_value(loom_dtype dt, const void *p);
#endif
