/*
 * loom.h - the one public header of loom, a C11 library that trains neural networks.
 *
 * The model of computation: tensors are lazy. A builder such as loom_add() records a node in a step
 * graph and returns at once; nothing runs until loom_graph_run() ends the step. The whole step
 * (forward, backward, optimizer update) is one graph; it is hashed by structure, planned into a
 * program once and replayed from the program cache on every later step with the same structure.
 *
 * Lifetimes: a loom_model owns persistent tensors (parameters, their gradients, optimizer state) in
 * contiguous slabs. A loom_graph owns the nodes of the current step (rewound by
 * loom_graph_reset()), its program cache and its workspace. Handles of type loom_tensor are valid
 * until the next loom_graph_reset() of their graph.
 *
 * Errors: functions that touch the world return loom_status (0 ok, negative error) and leave a
 * detailed, thread-local message in loom_last_error(). Builders use a sticky error instead: given a
 * NULL input or bad shapes they return NULL and the graph keeps the first message, which
 * loom_graph_run() returns. No function prints or exits; messages go through the log hook.
 *
 * Thread safety: distinct objects may be used from distinct threads; one object is not shared
 * between threads without external locking unless its comment says otherwise.
 */
#ifndef LOOM_H
#define LOOM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#    define LOOM_API __attribute__((visibility("default")))
#else
#    define LOOM_API
#endif

#define LOOM_VERSION     "0.1.0"
#define LOOM_MAX_DIMS    6
/* The longest deadline of a step or a collective, in seconds (loom_devices_config.timeout_s,
 * loom_group_*_new): about 11.6 days. */
#define LOOM_MAX_TIMEOUT 1e6

/* ---- status ------------------------------------------------------------------------------- */

/* X(name, value, message): the one list of error codes. */
#define LOOM_STATUS_MAP(X)                   \
    X(OK, 0, "success")                      \
    X(EINVAL, -1, "invalid argument")        \
    X(ENOMEM, -2, "out of memory")           \
    X(EIO, -3, "input/output error")         \
    X(EFORMAT, -4, "malformed file")         \
    X(ESHAPE, -5, "shape or dtype mismatch") \
    X(ENOTFOUND, -6, "not found")            \
    X(EUNSUPPORTED, -7, "not supported")     \
    X(ERANGE, -8, "value out of range")      \
    X(EINTERNAL, -9, "internal error")       \
    X(ETIMEDOUT, -10, "deadline passed")     \
    X(EABORTED, -11, "aborted because another device failed")

typedef enum {
#define LOOM_STATUS_ENUM_(name, value, msg) LOOM_##name = value,
    LOOM_STATUS_MAP(LOOM_STATUS_ENUM_)
#undef LOOM_STATUS_ENUM_
} loom_status;

/* "EINVAL" etc.; "UNKNOWN" for values outside the map. Static strings, thread-safe. */
LOOM_API const char *loom_status_name(loom_status s);
/* A one-line English description of the code. Static string, thread-safe. */
LOOM_API const char *loom_status_str(loom_status s);
/* The detailed message of the last failure on this thread ("" if none). Valid until the next
 * failing call on this thread. */
LOOM_API const char *loom_last_error(void);

/* Whether the LOOM_* variables of the environment hold values they take (LOOM_METRICS,
 * LOOM_PROFILE, LOOM_CHECK: 0 or 1; LOOM_BACKEND: cpu or interp; LOOM_MATMUL: loom or blas): EINVAL
 * naming the first that does not and the values it takes. loom_graph_new, loom_graph_submit and
 * loom_devices_new fail the same way (LOOM_FAULT is checked by loom_devices_new, against its
 * devices). The environment is read once, at the first call of any of them. */
LOOM_API loom_status loom_env_check(void);

/* The most elements of one tensor or parameter (2^40): a shape with more is refused when it is
 * recorded or added, never allocated. */
#define LOOM_MAX_NUMEL ((int64_t)1 << 40)
/* The one checked multiplication of sizes that come from users (the library's and loom's CLI's):
 * *out = a * b and true when a >= 0, b >= 0 and the product is at most limit; false (*out
 * untouched) otherwise, whatever the operands, with no wrap. Thread-safe, no error message. */
LOOM_API bool loom_size_mul(int64_t a, int64_t b, int64_t limit, int64_t *out);

/* ---- hooks: allocation, logging, abort ---------------------------------------------------- */

typedef struct {
    void *(*malloc_fn)(size_t size, void *ud);
    void *(*realloc_fn)(void *ptr, size_t size, void *ud);
    void (*free_fn)(void *ptr, void *ud);
    void *ud;
} loom_allocator;

/* Replaces the allocator used for every allocation of the library; NULL restores malloc/free.
 * Call before creating any object. Not thread-safe. */
LOOM_API void loom_set_allocator(const loom_allocator *a);

typedef enum { LOOM_LOG_DEBUG, LOOM_LOG_INFO, LOOM_LOG_WARN, LOOM_LOG_ERROR } loom_log_level;
typedef void (*loom_log_fn)(loom_log_level level, const char *msg, void *ud);
/* Routes the library's messages; NULL restores the default (stderr, INFO and above). */
LOOM_API void loom_set_log_hook(loom_log_fn fn, void *ud);
/* Called when an internal invariant breaks (after the message is logged); default abort(). */
LOOM_API void loom_set_abort_hook(void (*fn)(const char *where, const char *what));

/* ---- random numbers ------------------------------------------------------------------------- */

/* Philox-4x32-10, counter-based. Key = seed (64 bits). Counter words = (counter low, counter high,
 * stream low, stream high). A draw is a pure function of (seed, stream, counter), so any value of a
 * run can be recomputed without replaying earlier draws. Streams used by loom (stream high word =
 * purpose): 1 = parameter init (low word = parameter index, counter = element index / 4),
 * 2 = data shuffling (low word = epoch, counter = position / 4), 3 = a text's training windows
 * (low word = step, counter = row), 4 = `loom sample`'s draws (counter = token / 4). */
LOOM_API void loom_philox(uint64_t seed, uint64_t stream, uint64_t counter, uint32_t out[4]);
/* A float uniform in [0, 1) with 24 random bits, from word `i % 4` of block `i / 4`. */
LOOM_API float loom_rand_uniform(uint64_t seed, uint64_t stream, uint64_t i);

/* ---- persistent tensors: the model --------------------------------------------------------- */

typedef enum { LOOM_F32, LOOM_F64, LOOM_I32 } loom_dtype;
typedef enum { LOOM_REDUCE_SUM, LOOM_REDUCE_MEAN } loom_reduce_op;

typedef struct loom_model loom_model;
typedef struct loom_param loom_param;

/* A new empty model; NULL when out of memory. Free with loom_model_free(). */
LOOM_API loom_model *loom_model_new(void);
LOOM_API void loom_model_free(loom_model *m);
/* Adds a trainable float32 parameter (zero-filled) with its gradient. Names are unique.
 * Returns a handle owned by the model, or NULL (EINVAL: duplicate name or bad shape, ENOMEM). */
LOOM_API loom_param *loom_model_add(loom_model *m, const char *name, int ndim,
                                    const int64_t *shape);
LOOM_API int loom_model_count(const loom_model *m);
LOOM_API loom_param *loom_model_at(const loom_model *m, int i);
LOOM_API loom_param *loom_model_find(const loom_model *m, const char *name);
LOOM_API int64_t loom_model_numel(const loom_model *m);
LOOM_API const char *loom_param_name(const loom_param *p);
LOOM_API int loom_param_ndim(const loom_param *p);
LOOM_API const int64_t *loom_param_shape(const loom_param *p);
LOOM_API int64_t loom_param_numel(const loom_param *p);
/* Tells the model that the host changed its values (through the pointers below): replicas on other
 * devices are refreshed from these before the next step. Loading and initialising do it. */
LOOM_API void loom_model_touch(loom_model *m);
/* Tied weights: `name` is another name of parameter p (a GPT's lm_head.weight is its
 * transformer.wte.weight). loom_model_save writes it as a tensor of its own holding p's values;
 * loom_model_load accepts it, with p's shape and values, or its absence. EINVAL for a name taken
 * or a parameter of another model. */
LOOM_API loom_status loom_model_tie(loom_model *m, const char *name, const loom_param *p);
/* Pointers into the model's slabs; valid until the next loom_model_add(). A step submitted on
 * the model's graph (loom_graph_submit) owns the slabs until it ends: these, loom_model_touch,
 * loom_model_add, loom_model_save and loom_model_load wait for it first, and a pointer taken
 * before the submit is not used until loom_graph_wait. */
LOOM_API float *loom_param_data(loom_param *p);
LOOM_API float *loom_param_grad(loom_param *p);

/* String metadata of the model, written in the safetensors header's "__metadata__" by
 * loom_model_save (beside "format": "pt" and "producer") and replaced by the file's by
 * loom_model_load: value copied, NULL removes the key. EINVAL for an empty key or one of those
 * two; ENOMEM. loom_model_meta gives the value (owned by m, valid until it changes) or NULL. */
LOOM_API loom_status loom_model_set_meta(loom_model *m, const char *key, const char *value);
LOOM_API const char *loom_model_meta(const loom_model *m, const char *key);
/* The value of "__metadata__" key in a file read by loom_tensor_file_read, or NULL. */
typedef struct loom_tensor_file loom_tensor_file;
LOOM_API const char *loom_tensor_file_meta(const loom_tensor_file *f, const char *key);
/* Writes the parameters as safetensors (names as given, F32, row-major), atomically: a temporary
 * file in the same directory (path.tmp.<pid>) is written, fsync'd and renamed; temporary files of
 * path left by killed writers are removed first. ERANGE, writing nothing, if a parameter holds a
 * NaN or an infinity (a diverged run is not saved); EIO on failure. */
LOOM_API loom_status loom_model_save(const loom_model *m, const char *path);
/* Reads parameters from a safetensors file (a regular file; header and data are read only once
 * checked against the file's size; where loom wrote it, each tensor against its CRC-32C). Every
 * parameter of the model must be present with its exact shape and dtype F32, and the file must
 * hold nothing else (but a checkpoint's optimizer state: loom_checkpoint_save); otherwise
 * EFORMAT/ENOTFOUND/ESHAPE naming the tensor, and the model is left unchanged. */
LOOM_API loom_status loom_model_load(loom_model *m, const char *path);

/* Any safetensors file, read whole and validated: header length within the file, well-formed JSON,
 * known dtypes (F32, F64 and I32 are readable), data_offsets inside the data and not overlapping,
 * each tensor's byte count equal to its shape's. EIO/EFORMAT/EUNSUPPORTED with the tensor and the
 * byte offset. Free with loom_tensor_file_free(). */
LOOM_API loom_status loom_tensor_file_read(const char *path, loom_tensor_file **out);
/* The same checks of the header alone, the data left unread (its names, shapes and metadata;
 * loom_tensor_file_get gives NULL): a file's configuration without reading its weights. */
LOOM_API loom_status loom_tensor_file_read_header(const char *path, loom_tensor_file **out);
LOOM_API void loom_tensor_file_free(loom_tensor_file *f);
LOOM_API int loom_tensor_file_count(const loom_tensor_file *f);
LOOM_API const char *loom_tensor_file_name(const loom_tensor_file *f, int i);
/* The elements of tensor `name` (aligned, owned by f) and its dtype and shape, or NULL. */
LOOM_API const void *loom_tensor_file_get(const loom_tensor_file *f, const char *name,
                                          loom_dtype *dt, int *ndim, const int64_t **shape);

/* ---- the step graph ---------------------------------------------------------------------------
 */

typedef struct loom_graph loom_graph;
typedef struct loom_tensor loom_tensor;

/* A graph recording steps over the persistent tensors of `m` (may be NULL for graphs without
 * parameters). The graph keeps a pointer to m; m outlives the graph. NULL when out of memory. */
LOOM_API loom_graph *loom_graph_new(loom_model *m);
/* Frees the graph, its programs and workspace; with LOOM_METRICS=1 logs its metrics first. */
LOOM_API void loom_graph_free(loom_graph *g);
/* Starts a new step: forgets every node (handles become invalid) and clears the sticky error.
 * Programs stay cached. */
LOOM_API void loom_graph_reset(loom_graph *g);
/* Ends the step: returns the sticky error if any; else hashes the graph, plans a program on a cache
 * miss, and executes it. After success, output tensors can be read until the next run or reset
 * of this graph, whatever other graphs run meanwhile on the same devices. */
LOOM_API loom_status loom_graph_run(loom_graph *g);
/* loom_graph_run in two halves, so that the next step is recorded while this one runs. Submit
 * ends the step as run does but, on devices (loom_graph_set_devices), returns once they have
 * it: loom_graph_reset() and the next step's recording may follow at once (the reset drops this
 * step's tensors; the step runs on). The step computes on its inputs' values at submit (copies,
 * but for borrowed inputs: loom_input_borrow), so the host may rewrite any input buffer
 * meanwhile; the model's slabs are the step's until it ends (loom_param_data and every other
 * access to the model waits for it). A graph has one step running at most: submitting the next
 * waits for it. Without devices the step runs here, before submit returns. */
LOOM_API loom_status loom_graph_submit(loom_graph *g);
/* Waits for the graph's submitted step and returns its status (that of the last step that ended,
 * when none is running); *loss (if not NULL) gets the value of its loss (the tensor loom_backward
 * started from; the mean over devices, as loom_item's), NAN if it had none or failed. A loss that
 * is NaN or infinite on any device is ERANGE naming the device: the step has run whole (its
 * update too; anomaly detection, loom_devices_config.detect_anomaly, stops a step at its loss
 * instead), its loss and outputs are readable, and the caller decides (the trainer and `loom
 * train` stop). Reading an output of a submitted step (loom_tensor_data, loom_item) waits for it,
 * until a reset. */
LOOM_API loom_status loom_graph_wait(loom_graph *g, double *loss);
/* Who runs programs: the reference interpreter, or generated C kernels (elementwise chains fused,
 * compiled by the system compiler, cached on disk; the rest interpreted). AUTO follows the
 * environment's LOOM_BACKEND (interp or cpu), cpu by default; without a C compiler, interp. */
typedef enum { LOOM_BACKEND_AUTO, LOOM_BACKEND_INTERP, LOOM_BACKEND_CPU } loom_backend;
LOOM_API void loom_graph_set_backend(loom_graph *g, loom_backend b);
/* The first builder error of this step, or NULL. */
LOOM_API const char *loom_graph_error(const loom_graph *g);

typedef struct {
    int64_t graphs_built;      /* steps run (each a graph hashed) */
    int64_t programs_built;    /* cache misses: programs planned */
    int64_t cache_hits;        /* steps that reused a program */
    int64_t nodes;             /* nodes of the last graph */
    int64_t kernels;           /* kernels executed by the last program */
    int64_t workspace_bytes;   /* peak workspace of the programs planned so far */
    double plan_seconds;       /* total time spent planning programs */
    double exec_seconds;       /* total time spent executing programs (device 0) */
    int64_t devices;           /* devices the graph ran on (0: here, on one) */
    int64_t allreduce_bytes;   /* bytes all-reduced, all devices together */
    double collective_seconds; /* time in collectives, per device on average (waiting included) */
    double device_compute_min, device_compute_max; /* per-device time outside collectives */
    int64_t fused_ops;      /* elementwise ops computed inside another op's kernel */
    int64_t compiles;       /* programs whose kernels the C compiler built */
    int64_t disk_hits;      /* programs whose kernels came from the disk cache */
    double compile_seconds; /* time in the C compiler */
    /* kernels of the last step that one device ran for all: updates of the parameters and
     * optimizer state, which the devices of a process share where the step allows it (0: each
     * device updated a replica of its own) */
    int64_t shared_updates;
    /* floating-point operations of the last step's products (2 m n k a matmul or convolution,
     * attention's), on one device: with the step's time, the share of the FMA peak it reaches */
    double flops;
} loom_metrics;
LOOM_API void loom_graph_metrics(const loom_graph *g, loom_metrics *out);
/* A multi-line human-readable report of the metrics into buf (always NUL-terminated). */
LOOM_API void loom_metrics_format(const loom_metrics *m, char *buf, size_t size);

/* Leaves. An input is `data`, numel elements of dtype, as it is when the step is submitted
 * (loom_graph_submit or loom_graph_run): a step that runs on after submit returns (on devices)
 * reads a copy taken at submit, so the caller may change or free the buffer as soon as submit
 * has returned, whatever the step still does. The address is not part of the program's identity,
 * so a new batch in a new buffer reuses the program. */
LOOM_API loom_tensor *loom_input(loom_graph *g, loom_dtype dt, int ndim, const int64_t *shape,
                                 const void *data);
/* A batch input: `shape` and `data` are the whole global batch (rows along dim 0), taken as
 * loom_input's (a copy at submit). On a graph running on D devices the node has ceil(rows / D)
 * rows and each device reads its own shard; the last shards are padded with masked rows when
 * rows do not divide by D. All batch inputs of a step have the same rows. On one device it is
 * loom_input. */
LOOM_API loom_tensor *loom_input_batch(loom_graph *g, loom_dtype dt, int ndim, const int64_t *shape,
                                       const void *data);
/* loom_input_batch shaped for a batch of `rows` rows (>= shape[0]; -1: shape[0]), of which the
 * first shape[0] are real and the rest padding that weighs nothing (as the shards' padding): a
 * short last batch padded to the full batch size runs the same program as the full ones. */
LOOM_API loom_tensor *loom_input_batch_padded(loom_graph *g, loom_dtype dt, int ndim,
                                              const int64_t *shape, const void *data, int64_t rows);
/* Lends input t's buffer to its step instead of having it copied at submit: the step reads it in
 * place while it runs, and the caller keeps it valid and unchanged until the step has ended
 * (loom_graph_wait, or loom_graph_run, has returned). For large inputs that stay put, such as a
 * loader's batches when each step is waited for before the second loom_loader_next after its
 * batch (the accelerator and the trainer lend theirs). No effect on other tensors or NULL. */
LOOM_API void loom_input_borrow(loom_tensor *t);
/* A scalar constant (shape ()); its value is part of the program's structure. */
LOOM_API loom_tensor *loom_scalar(loom_graph *g, double value, loom_dtype dt);
/* The current value of a parameter of the graph's model (shape of the parameter). */
LOOM_API loom_tensor *loom_parameter(loom_graph *g, loom_param *p);
/* Marks an input so that loom_grad() can differentiate with respect to it. */
LOOM_API void loom_requires_grad(loom_tensor *t);
/* Keeps the value of t after the run (for loom_tensor_data / loom_item). */
LOOM_API void loom_output(loom_tensor *t);

LOOM_API loom_dtype loom_tensor_dtype(const loom_tensor *t);
LOOM_API int loom_tensor_ndim(const loom_tensor *t);
LOOM_API const int64_t *loom_tensor_shape(const loom_tensor *t);
LOOM_API int64_t loom_tensor_numel(const loom_tensor *t);
/* After a successful run: the output's elements, contiguous row-major; NULL if t was not marked
 * with loom_output() or the step has not run. Owned by the graph. */
LOOM_API const void *loom_tensor_data(const loom_tensor *t);
/* Concatenates the real rows (dim 0) of output t from every device, without padding, into dst
 * (room for the global batch); returns the rows written, or -1. On one device: a copy of t. */
LOOM_API int64_t loom_tensor_gather(const loom_tensor *t, void *dst);
/* The first element of an output as double (NaN if unavailable); on several devices, the mean of
 * the devices' values (a loss of loom_cross_entropy is then the global mean). */
LOOM_API double loom_item(const loom_tensor *t);

/* Elementwise, with PyTorch's broadcasting. Shapes: any; result: the broadcast shape. */
LOOM_API loom_tensor *loom_add(loom_graph *g, loom_tensor *a, loom_tensor *b);
LOOM_API loom_tensor *loom_sub(loom_graph *g, loom_tensor *a, loom_tensor *b);
LOOM_API loom_tensor *loom_mul(loom_graph *g, loom_tensor *a, loom_tensor *b);
LOOM_API loom_tensor *loom_div(loom_graph *g, loom_tensor *a, loom_tensor *b);
LOOM_API loom_tensor *loom_cmpgt(loom_graph *g, loom_tensor *a, loom_tensor *b); /* 1 or 0 */
LOOM_API loom_tensor *loom_cmpeq(loom_graph *g, loom_tensor *a, loom_tensor *b); /* 1 or 0 */
LOOM_API loom_tensor *loom_where(loom_graph *g, loom_tensor *c, loom_tensor *a, loom_tensor *b);
LOOM_API loom_tensor *loom_neg(loom_graph *g, loom_tensor *a);
LOOM_API loom_tensor *loom_exp(loom_graph *g, loom_tensor *a);
LOOM_API loom_tensor *loom_log(loom_graph *g, loom_tensor *a);
LOOM_API loom_tensor *loom_sqrt(loom_graph *g, loom_tensor *a);
LOOM_API loom_tensor *loom_relu(loom_graph *g, loom_tensor *a);
LOOM_API loom_tensor *loom_tanh(loom_graph *g, loom_tensor *a);
LOOM_API loom_tensor *loom_erf(loom_graph *g, loom_tensor *a); /* the error function */

/* Reductions over one axis (negative counts from the end), keeping it with size 1. */
LOOM_API loom_tensor *loom_sum(loom_graph *g, loom_tensor *a, int axis);
LOOM_API loom_tensor *loom_max(loom_graph *g, loom_tensor *a, int axis);
/* 1 at the first maximum along axis, 0 elsewhere; same shape as a. */
LOOM_API loom_tensor *loom_maxmask(loom_graph *g, loom_tensor *a, int axis);
/* Sum and mean of all elements: shape (). */
LOOM_API loom_tensor *loom_sum_all(loom_graph *g, loom_tensor *a);
LOOM_API loom_tensor *loom_mean_all(loom_graph *g, loom_tensor *a);

/* Movement. reshape: same element count, one dim may be -1. permute: perm[i] = source axis of
 * output axis i. expand: size-1 dims grow (PyTorch's Tensor.expand, ndim may grow). */
LOOM_API loom_tensor *loom_reshape(loom_graph *g, loom_tensor *a, int ndim, const int64_t *shape);
LOOM_API loom_tensor *loom_permute(loom_graph *g, loom_tensor *a, const int *perm);
LOOM_API loom_tensor *loom_expand(loom_graph *g, loom_tensor *a, int ndim, const int64_t *shape);
LOOM_API loom_tensor *loom_transpose(loom_graph *g, loom_tensor *a); /* swaps the last two axes */

/* The element-wise sum or mean of t over the devices of the graph (t itself on one device). */
LOOM_API loom_tensor *loom_allreduce(loom_graph *g, loom_tensor *t, loom_reduce_op op);
/* (..., M, K) x (..., K, N) -> (..., M, N); batch dims broadcast. */
LOOM_API loom_tensor *loom_matmul(loom_graph *g, loom_tensor *a, loom_tensor *b);

typedef struct {
    int kh, kw; /* window */
    int sh, sw; /* stride (0 means 1) */
    int ph, pw; /* zero padding */
} loom_window;
/* Zero padding of the last two axes, ph rows above and below, pw columns left and right:
 * (..., H, W) -> (..., H + 2 ph, W + 2 pw), as torch.nn.functional.pad(x, (pw, pw, ph, ph)).
 * loom_crop2d is its adjoint: the interior, (..., H, W) -> (..., H - 2 ph, W - 2 pw). */
LOOM_API loom_tensor *loom_pad2d(loom_graph *g, loom_tensor *x, int ph, int pw);
LOOM_API loom_tensor *loom_crop2d(loom_graph *g, loom_tensor *x, int ph, int pw);
/* im2col: (N, C, H, W) -> (C, KH, KW, N, OH, OW). */
LOOM_API loom_tensor *loom_unfold(loom_graph *g, loom_tensor *x, loom_window w);
/* col2im, the adjoint of unfold (overlaps add): (C, KH, KW, N, OH, OW) -> (N, C, H, W). */
LOOM_API loom_tensor *loom_fold(loom_graph *g, loom_tensor *cols, loom_window w, int64_t h,
                                int64_t wd);
/* Max pooling: (N, C, H, W) -> (N, C, OH, OW), the first maximum of each window in row-major
 * window order (a NaN wins); padded positions are ignored, as PyTorch's -inf padding.
 * pool_max_grad: the gradient of pool_max at x for output gradient dy, (N, C, H, W): each window's
 * dy goes to its maximum's position (overlapping windows add). */
LOOM_API loom_tensor *loom_pool_max(loom_graph *g, loom_tensor *x, loom_window w);
LOOM_API loom_tensor *loom_pool_max_grad(loom_graph *g, loom_tensor *x, loom_tensor *dy,
                                         loom_window w);
/* (...) int32 class indices -> (..., n) of dtype dt. An index outside [0, n) fails the run. */
LOOM_API loom_tensor *loom_onehot(loom_graph *g, loom_tensor *idx, int64_t n, loom_dtype dt);
/* Rows of table (V, D) at i32 indices idx (...): (..., D), as torch.nn.functional.embedding (an
 * index outside [0, V) fails the step, naming it). Its gradient is loom_scatter_add. */
LOOM_API loom_tensor *loom_gather(loom_graph *g, loom_tensor *table, loom_tensor *idx);
/* (rows, D): row v the sum of the rows of src (..., D) whose index in idx (...) is v, added in
 * order (bitwise repeatable); zero where no index points. */
LOOM_API loom_tensor *loom_scatter_add(loom_graph *g, loom_tensor *src, loom_tensor *idx,
                                       int64_t rows);
/* x (..., T, S) with each row i's elements j > i + S - T (the keys a query may not attend to,
 * the last T of S positions being the queries') set to fill (-INFINITY before a softmax): a
 * causal mask with no mask tensor. */
LOOM_API loom_tensor *loom_causal_mask(loom_graph *g, loom_tensor *x, double fill);
/* Multi-head self-attention on packed projections: qkv (B, T, 3, H, D) holds each position's
 * query, key and value for each of H heads (a (B T, 3 H D) projection reshaped) -> (B, T, H, D),
 * each head softmax(q k^T / sqrt(D)) v, as torch.nn.functional.scaled_dot_product_attention(q, k,
 * v, is_causal=causal); causal: position i attends to positions <= i only. One kernel a head
 * forward and one backward; for the backward the forward keeps its probabilities (of a causal
 * head about half of T x T, in blocks of 16 queries; past 64 MB the backward recomputes them). */
LOOM_API loom_tensor *loom_attention(loom_graph *g, loom_tensor *qkv, bool causal);
/* Dropout (training): each element of x (rows along dim 0) zeroed with probability p, the others
 * divided by 1 - p. Element j of global batch row r is dropped when the uniform from Philox
 * stream (5, step) of seed at counter r x (elements a row) + j is below p, key being i32
 * {seed low, seed high, step low, step high} (an input the caller updates each step): the same
 * elements whatever the device count. p = 0 returns x. */
LOOM_API loom_tensor *loom_dropout(loom_graph *g, loom_tensor *x, double p, loom_tensor *key);

/* Compositions (their gradients come from the primitives). */
LOOM_API loom_tensor *loom_softmax(loom_graph *g, loom_tensor *x, int axis);
LOOM_API loom_tensor *loom_log_softmax(loom_graph *g, loom_tensor *x, int axis);
/* GELU, exact: x / 2 (1 + erf(x / sqrt 2)), as torch.nn.GELU() (approximate='none'). */
LOOM_API loom_tensor *loom_gelu(loom_graph *g, loom_tensor *x);
/* GELU's tanh form: x / 2 (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))), as
 * torch.nn.GELU(approximate='tanh') and GPT-2's gelu_new. */
LOOM_API loom_tensor *loom_gelu_tanh(loom_graph *g, loom_tensor *x);
/* Layer normalization over the last axis, as torch.nn.LayerNorm(x.shape[-1], eps): (x - mean) /
 * sqrt(var + eps) with the biased variance, times weight, plus bias; weight and bias (each NULL
 * for none) have the last axis's size. */
LOOM_API loom_tensor *loom_layer_norm(loom_graph *g, loom_tensor *x, loom_tensor *weight,
                                      loom_tensor *bias, double eps);
/* logits (..., C), labels (...) int32 -> mean negative log-likelihood over every position,
 * shape () (a sequence model's (B, T, C) and (B, T) as well as (B, C) and (B)). With labels from
 * loom_input_batch, padded rows weigh 0 and the sum is divided by the global real rows / devices,
 * so that the mean over devices (and the averaged gradient) is the global batch's. */
LOOM_API loom_tensor *loom_cross_entropy(loom_graph *g, loom_tensor *logits, loom_tensor *labels);
/* x (B, in), w (out, in), b (out) or NULL -> (B, out). */
LOOM_API loom_tensor *loom_linear(loom_graph *g, loom_tensor *x, loom_tensor *w, loom_tensor *b);
/* x (N, C, H, W), w (O, C, KH, KW), b (O) or NULL -> (N, O, OH, OW). */
LOOM_API loom_tensor *loom_conv2d(loom_graph *g, loom_tensor *x, loom_tensor *w, loom_tensor *b,
                                  int stride, int padding);
/* x (N, C, H, W) -> (N, C, H/k, W/k) with window k and stride k (PyTorch's default). */
LOOM_API loom_tensor *loom_max_pool2d(loom_graph *g, loom_tensor *x, int k);
/* (N, ...) -> (N, prod(...)). */
LOOM_API loom_tensor *loom_flatten(loom_graph *g, loom_tensor *x);

/* Autograd. loom_grad records the gradient of a scalar `loss` with respect to `wrt` (an input
 * marked with loom_requires_grad, or a parameter node); zeros if loss does not depend on it.
 * loom_backward records, for every parameter of the model that loss depends on, the store of its
 * gradient into the model's gradient slab (overwriting it; others are set to zero). */
LOOM_API loom_tensor *loom_grad(loom_graph *g, loom_tensor *loss, loom_tensor *wrt);
/* The gradients of loss with respect to each of wrt[0..n) into out, from one backward walk. */
LOOM_API void loom_grads(loom_graph *g, loom_tensor *loss, int n, loom_tensor *const *wrt,
                         loom_tensor **out);
LOOM_API void loom_backward(loom_graph *g, loom_tensor *loss);
/* Gradient accumulation (Lightning's accumulate_grad_batches, nanoGPT's gradient_accumulation_
 * steps): loom_backward of one micro-batch of an optimizer step, its gradients times `weight`
 * (its share of the step's samples, in (0, 1]) and, but for the first micro-batch, added to the
 * slab's (each device its own); all-reduced across devices only with the last, whose step
 * records the optimizer's update. The micro-batches' steps without `last` run no collective. */
LOOM_API void loom_backward_accumulate(loom_graph *g, loom_tensor *loss, double weight, bool first,
                                       bool last);

/* Records p := v at the end of the step (v has p's shape and f32): the way to write an update rule
 * of one's own. */
LOOM_API void loom_assign(loom_graph *g, loom_param *p, loom_tensor *v);

/* ---- nn: sequential models with PyTorch's names and initialisation -------------------------- */

typedef enum {
    LOOM_LAYER_END = 0,
    LOOM_LAYER_LINEAR,  /* in, out */
    LOOM_LAYER_CONV2D,  /* in, out, kernel, stride, padding */
    LOOM_LAYER_MAXPOOL, /* kernel, stride (0: the kernel), padding (at most half the kernel) */
    LOOM_LAYER_RELU,
    LOOM_LAYER_FLATTEN,
} loom_layer_kind;

typedef struct {
    loom_layer_kind kind;
    int64_t in, out;
    int kernel, stride, padding;
} loom_layer;

/* Initialisers for arrays of layers: loom_layer net[] = {LOOM_LINEAR(784, 10), LOOM_END}; */
#define LOOM_LINEAR(i, o) \
    { .kind = LOOM_LAYER_LINEAR, .in = (i), .out = (o) }
#define LOOM_CONV2D(i, o, k, s, p)                                                      \
    {                                                                                   \
        .kind = LOOM_LAYER_CONV2D, .in = (i), .out = (o), .kernel = (k), .stride = (s), \
        .padding = (p)                                                                  \
    }
#define LOOM_MAXPOOL2D(k) \
    { .kind = LOOM_LAYER_MAXPOOL, .kernel = (k) }
/* torch.nn.MaxPool2d(k, stride=s, padding=p) */
#define LOOM_MAXPOOL2D_STRIDED(k, s, p) \
    { .kind = LOOM_LAYER_MAXPOOL, .kernel = (k), .stride = (s), .padding = (p) }
#define LOOM_RELU \
    { .kind = LOOM_LAYER_RELU }
#define LOOM_FLATTEN \
    { .kind = LOOM_LAYER_FLATTEN }
#define LOOM_END \
    { .kind = LOOM_LAYER_END }

/* The layers of a built-in recipe ("fmnist-mlp", "fmnist-cnn"), terminated by LOOM_LAYER_END;
 * *flatten_input says whether images are flattened to (B, H*W) first. NULL (ENOTFOUND) if unknown.
 * Static storage, thread-safe. */
LOOM_API const loom_layer *loom_recipe(const char *name, bool *flatten_input);

typedef struct loom_sequential loom_sequential;
/* Builds the layers (terminated by LOOM_LAYER_END) into m with names "<index>.weight" and
 * "<index>.bias", as torch.nn.Sequential names them. NULL on error (loom_last_error). */
LOOM_API loom_sequential *loom_sequential_new(loom_model *m, const loom_layer *layers);
LOOM_API void loom_sequential_free(loom_sequential *s);
/* PyTorch's default init: weights kaiming-uniform(a=sqrt(5)), biases U(-1/sqrt(fan_in), ..),
 * drawn from Philox stream (1, parameter index) of `seed`. */
LOOM_API void loom_sequential_init(loom_sequential *s, uint64_t seed);
/* The layers in order on x; a ReLU followed by max pooling is built as pooling then ReLU (the
 * same values and gradients, the ReLU on the pooled quarter). */
LOOM_API loom_tensor *loom_sequential_forward(loom_graph *g, loom_sequential *s, loom_tensor *x);

/* A GPT as nanoGPT's model.py (bias-free LayerNorm and Linear layers, GELU MLP, output projection
 * tied to the token embedding): `layers` blocks of causal self-attention with `heads` heads over
 * `width` channels, positions up to `context`, tokens below `vocab`. Its parameters carry
 * nanoGPT's state_dict names (transformer.wte.weight, transformer.wpe.weight,
 * transformer.h.N.{ln_1, attn.c_attn, attn.c_proj, ln_2, mlp.c_fc, mlp.c_proj}.weight,
 * transformer.ln_f.weight; lm_head.weight is transformer.wte.weight). */
typedef struct {
    int64_t vocab, context, layers, heads, width;
    double dropout; /* nanoGPT's four places: embeddings, attention weights, both residuals */
    /* GPT-2 as Hugging Face's GPT2LMHeadModel (and nanoGPT's bias=True) has it; all zero:
     * nanoGPT's shakespeare model. */
    bool bias;      /* a bias on every Linear and LayerNorm: "<name>.bias" beside each weight */
    bool conv1d;    /* Linear weights stored (in, out), as GPT-2's Conv1D layers keep them */
    bool gelu_tanh; /* the MLP's GELU in its tanh form (gelu_new, loom_gelu_tanh) */
    int64_t inner;  /* the MLP's hidden width; 0: 4 width */
    double eps;     /* the LayerNorms' epsilon; 0: 1e-5 */
} loom_gpt_config;
typedef struct loom_gpt loom_gpt;
/* Adds the parameters to m; NULL on bad sizes (EINVAL: each from 1 to 2^24; ERANGE: a parameter
 * past LOOM_MAX_NUMEL) or ENOMEM. */
LOOM_API loom_gpt *loom_gpt_new(loom_model *m, const loom_gpt_config *c);
LOOM_API void loom_gpt_free(loom_gpt *gpt);
LOOM_API const loom_gpt_config *loom_gpt_get_config(const loom_gpt *gpt);
/* nanoGPT's init: normal(0, 0.02) for the embeddings and linear weights, 0.02 / sqrt(2 layers)
 * for the two residual projections (attn.c_proj, mlp.c_proj), ones for the LayerNorms; drawn
 * from Philox stream (1, parameter index) of seed. */
LOOM_API void loom_gpt_init(loom_gpt *gpt, uint64_t seed);
/* Training mode (dropout on, keyed by seed and step: the same elements whatever the devices) for
 * the forwards recorded from now on, or evaluation (off). Evaluation at first. */
LOOM_API void loom_gpt_set_train(loom_gpt *gpt, bool train, uint64_t seed, int64_t step);
/* Logits (B, T, vocab) of tokens idx (B, T), i32, T <= context. */
LOOM_API loom_tensor *loom_gpt_forward(loom_graph *g, loom_gpt *gpt, loom_tensor *idx);

/* A Llama as transformers' LlamaForCausalLM (SmolLM, TinyLlama): RMSNorm (eps), rotary position
 * embeddings (rope_theta, HF's rotate_half layout), grouped-query attention (kv_heads key and
 * value heads, each shared by heads / kv_heads query heads), a SwiGLU MLP of width inner, no
 * biases, the output projection lm_head.weight or (tied) the embedding. Parameters carry
 * transformers' names (model.embed_tokens.weight, model.layers.N.{input_layernorm,
 * self_attn.{q,k,v,o}_proj, post_attention_layernorm, mlp.{gate,up,down}_proj}.weight,
 * model.norm.weight, lm_head.weight). */
typedef struct {
    int64_t vocab, context, layers, heads, kv_heads, width, inner;
    double eps, rope_theta;
    bool tied;
} loom_llama_config;
typedef struct loom_llama loom_llama;
/* Adds the parameters to m; NULL (EINVAL) on bad sizes, or ENOMEM. */
LOOM_API loom_llama *loom_llama_new(loom_model *m, const loom_llama_config *c);
LOOM_API void loom_llama_free(loom_llama *l);
LOOM_API const loom_llama_config *loom_llama_get_config(const loom_llama *l);
/* normal(0, 0.02) for the embeddings and linear weights, ones for the norms (transformers'
 * initializer_range), from Philox stream (1, parameter index) of seed. */
LOOM_API void loom_llama_init(loom_llama *l, uint64_t seed);
/* Logits (B, T, vocab) of tokens idx (B, T), i32, T <= context. */
LOOM_API loom_tensor *loom_llama_forward(loom_graph *g, loom_llama *l, loom_tensor *idx);

/* Hugging Face model folders (transformers' save_pretrained): config.json names the model,
 * model.safetensors or the shards of model.safetensors.index.json hold its weights (F32, F16 or
 * BF16: read as float32). Built: GPT-2 (model_type "gpt2", GPT2LMHeadModel: a loom_gpt with
 * biases, Conv1D weights and the activation the config names). A field loom does not build (another
 * model_type, untied embeddings, cross-attention ...) is EUNSUPPORTED naming it; a tensor
 * missing (ENOTFOUND), of another shape than the config's (ESHAPE) or unknown to the model
 * (EFORMAT) names the file and the tensor. The parameters are added to m with the folder's names
 * and values. */
typedef struct loom_hf loom_hf;
LOOM_API loom_status loom_hf_open(const char *dir, loom_model *m, loom_hf **out);
LOOM_API void loom_hf_free(loom_hf *h);
LOOM_API int64_t loom_hf_vocab(const loom_hf *h);
LOOM_API int64_t loom_hf_context(const loom_hf *h);
/* As loom_gpt_set_train and loom_gpt_forward: logits (B, T, vocab) of tokens (B, T). */
LOOM_API void loom_hf_set_train(loom_hf *h, bool train, uint64_t seed, int64_t step);
LOOM_API loom_tensor *loom_hf_forward(loom_graph *g, loom_hf *h, loom_tensor *idx);
/* The model (its current values) as a folder that transformers' from_pretrained loads:
 * model.safetensors (F32, tied names included), config.json (the one read, torch_dtype
 * "float32"), and the tokenizer's files of the folder read (tokenizer.json, tokenizer_config.json,
 * special_tokens_map.json, generation_config.json, vocab.json, merges.txt) where it had them.
 * The folder is made if need be; each file is written atomically. */
LOOM_API loom_status loom_hf_save(const loom_hf *h, const char *dir);

/* ---- optimizers ---------------------------------------------------------------------------------
 */

typedef struct loom_optim loom_optim;
typedef struct {
    double lr;           /* 0 means 0.01 */
    double momentum;     /* SGD */
    double weight_decay; /* SGD: L2 added to the gradient; AdamW: decoupled */
    bool nesterov;       /* SGD */
    double beta1, beta2; /* AdamW: 0 means 0.9, 0.999 */
    double eps;          /* AdamW: 0 means 1e-8 */
    /* The learning rate's schedule over the steps (t = 0, 1, ... : loom_optim_step's calls), as
     * nanoGPT's: lr (t + 1) / (warmup_steps + 1) while t < warmup_steps; then, with decay_steps,
     * a cosine from lr down to min_lr at step decay_steps, and min_lr after; else lr. */
    int64_t warmup_steps, decay_steps;
    double min_lr;
    /* Clips the gradients' global norm (over every parameter, after they are averaged across
     * devices, inside the step) to clip_norm, as torch.nn.utils.clip_grad_norm_: each gradient
     * times min(1, clip_norm / (norm + 1e-6)); 0: no clipping. The update uses the clipped
     * gradients; the gradient slab keeps the averaged ones. */
    double clip_norm;
} loom_optim_config;
/* Optimizers over every parameter of m, with PyTorch's update formulas. State (momentum buffers,
 * moments) lives in m's persistent slabs. NULL on bad config (loom_last_error). */
LOOM_API loom_optim *loom_sgd_new(loom_model *m, const loom_optim_config *c);
LOOM_API loom_optim *loom_adamw_new(loom_model *m, const loom_optim_config *c);
LOOM_API void loom_optim_free(loom_optim *o);
LOOM_API void loom_optim_set_lr(loom_optim *o, double lr);
/* Parameter groups (PyTorch's param_groups, for the weight decay): p takes weight decay wd
 * instead of the config's. EINVAL for a parameter of another model or a negative wd. */
LOOM_API loom_status loom_optim_set_weight_decay(loom_optim *o, const loom_param *p, double wd);
/* nanoGPT's groups: weight decay wd on the parameters of 2 dims or more, none on the others
 * (biases, norms' weights). */
LOOM_API void loom_optim_decay_matrices_only(loom_optim *o, double wd);
/* The learning rate of the step recorded last (after the schedule); before any, the base. */
LOOM_API double loom_optim_lr(const loom_optim *o);
/* The learning rate of step t (0-based: loom_optim_step's call t + 1) by the schedule. */
LOOM_API double loom_optim_lr_at(const loom_optim *o, int64_t t);
/* Records the update of every parameter from its gradient slab into graph g, as step t+1 (t counts
 * previous calls). Must follow loom_backward() in the same step. */
LOOM_API void loom_optim_step(loom_graph *g, loom_optim *o);
/* The optimizer's state, as PyTorch's optimizer.state_dict() names it: "adamw" or "sgd"; the
 * keys each parameter has (AdamW: "exp_avg", "exp_avg_sq"; SGD with momentum: "momentum_buffer";
 * plain SGD: none), key k's name, and parameter p's values for key k (p's shape; a pointer into
 * the model's STATE slab, valid as loom_param_data's; NULL for a bad p or k). After writing into
 * them, loom_model_touch() the model. */
LOOM_API const char *loom_optim_name(const loom_optim *o);
LOOM_API int loom_optim_state_keys(const loom_optim *o);
LOOM_API const char *loom_optim_state_key(const loom_optim *o, int k);
LOOM_API float *loom_optim_state(loom_optim *o, const loom_param *p, int k);
/* loom_optim_step's calls so far (the t of the schedule and of AdamW's bias corrections); set it
 * to continue a run from a checkpoint (EINVAL for t < 0). */
LOOM_API int64_t loom_optim_steps(const loom_optim *o);
LOOM_API loom_status loom_optim_set_steps(loom_optim *o, int64_t t);

/* ---- data -------------------------------------------------------------------------------------
 */

typedef struct loom_dataset loom_dataset;
/* Reads an IDX image file (unsigned bytes, 3 dims) and label file (1 dim), gzip'd or plain.
 * Pixels become float32 in [0, 1], shape (N, 1, H, W); labels int32 and must be < num_classes.
 * EIO/EFORMAT with the file, the offset and what was expected. */
LOOM_API loom_status loom_dataset_load_idx(const char *images, const char *labels, int num_classes,
                                           loom_dataset **out);
/* Fashion-MNIST from dir (NULL: $LOOM_DATA or /usr/share/datasets/fashion-mnist): "train" or
 * "test". ENOTFOUND says which package to install or flag to pass. */
LOOM_API loom_status loom_dataset_fmnist(const char *dir, const char *split, loom_dataset **out);
/* A dataset from caller arrays (copied): x is (n, sample dims...), y is (n). */
LOOM_API loom_dataset *loom_dataset_from_arrays(int64_t n, int sample_ndim,
                                                const int64_t *sample_shape, const float *x,
                                                const int32_t *y);
LOOM_API void loom_dataset_free(loom_dataset *d);

/* A character-level text (nanoGPT's shakespeare_char): a UTF-8 file, plain or gzip'd (one or
 * more members), of at most LOOM_TEXT_MAX_BYTES once decompressed; the vocabulary is its sorted
 * distinct characters (code points), the first 90% of the characters train and the last 10%
 * validate. EFORMAT for an empty file, one distinct character, bytes that are not UTF-8, a gzip
 * stream cut short, corrupt or followed by other bytes (each naming the byte); ERANGE for a
 * larger text. Memory: the file's bytes while loading, then 1 byte a character (2 past 256
 * distinct characters, 4 past 65536). */
#define LOOM_TEXT_MAX_BYTES ((int64_t)1 << 30)
typedef struct loom_text loom_text;
LOOM_API loom_status loom_text_load(const char *path, loom_text **out);
LOOM_API void loom_text_free(loom_text *t);
LOOM_API int64_t loom_text_vocab(const loom_text *t);
/* The number of tokens of the training (val false) or validation split. */
LOOM_API int64_t loom_text_count(const loom_text *t, bool val);
/* Tokens [at, at + n) of that split into out (int32); EINVAL if they are not all in it. */
LOOM_API loom_status loom_text_tokens(const loom_text *t, bool val, int64_t at, int64_t n,
                                      int32_t *out);
/* The tokens of UTF-8 text s into tokens (room for strlen(s); a tokenized text's: 3 strlen(s) +
 * 16, with its tokenizer's special tokens around them), *n of them; EINVAL naming the first
 * character outside the vocabulary. */
LOOM_API loom_status loom_text_encode(const loom_text *t, const char *s, int32_t *tokens,
                                      int64_t *n);
/* The text of n tokens into buf (NUL-terminated, cut to size); the bytes written. */
LOOM_API size_t loom_text_decode(const loom_text *t, const int32_t *tokens, int64_t n, char *buf,
                                 size_t size);
/* Step `step`'s batch of the training split: x and y (batch, context) int32, row r the window of
 * context tokens at an offset from Philox stream (3, step) of seed, and the next tokens; without
 * shuffle, row r of step s is the window at token (s batch + r) context (modulo the split's
 * windows). EINVAL when the context is not shorter than the split. */
LOOM_API loom_status loom_text_batch(const loom_text *t, int64_t step, int64_t batch,
                                     int64_t context, uint64_t seed, bool shuffle, int32_t *x,
                                     int32_t *y);
/* A tokenizer.json as Hugging Face's `tokenizers` writes it, BPE of two kinds: byte-level (GPT-2's
 * ByteLevel pre-tokenizer and decoder) and SentencePiece's (Llama 2's: spaces as U+2581 by the
 * Prepend and Replace normalizers or the Metaspace pre-tokenizer, byte fallback to <0xXX>
 * tokens, the unknown token); added tokens matched first, a TemplateProcessing post-processor.
 * Encoding gives the ids tokenizers' encode(text).ids gives; text that is not UTF-8 is read as
 * Python's decode("utf-8", "replace") reads it. EFORMAT naming the field for a malformed file,
 * EUNSUPPORTED naming the field for what loom does not read (another model or pre-tokenizer, a
 * normalizer with a regular expression). */
typedef struct loom_tokenizer loom_tokenizer;
LOOM_API loom_status loom_tokenizer_load(const char *path, loom_tokenizer **out);
LOOM_API void loom_tokenizer_free(loom_tokenizer *t);
/* The number of ids (1 + the largest). */
LOOM_API int64_t loom_tokenizer_vocab(const loom_tokenizer *t);
/* The ids of n bytes of text into *ids (allocated by loom's allocator: free them with
 * loom_tokenizer_ids_free), *count of them; with special, the post-processor's special tokens
 * around them (Llama's <s> in front), as tokenizers' encode(text, add_special_tokens=True). */
LOOM_API loom_status loom_tokenizer_encode(const loom_tokenizer *t, const char *text, int64_t n,
                                           bool special, int32_t **ids, int64_t *count);
LOOM_API void loom_tokenizer_ids_free(int32_t *ids);
/* The bytes of n ids into buf (NUL-terminated, cut to size); the bytes the whole would take.
 * Unknown ids and special tokens are skipped (tokenizers' decode(skip_special_tokens=True)); byte
 * tokens give their bytes as they are (a character may be split between calls). */
LOOM_API size_t loom_tokenizer_decode(const loom_tokenizer *t, const int32_t *ids, int64_t n,
                                      char *buf, size_t size);
/* A text (as loom_text_load: plain or gzip'd, the first 90% of its tokens train, the last 10%
 * validate) cut into tokens by a tokenizer; loom_text_decode and loom_text_encode then go
 * through the tokenizer, which must outlive the text. The tokens are kept in the data cache
 * (as Fashion-MNIST's decoded copy), keyed by the file and the tokenizer. */
LOOM_API loom_status loom_text_load_tokenized(const char *path, const loom_tokenizer *tok,
                                              loom_text **out);
LOOM_API int64_t loom_dataset_count(const loom_dataset *d);
/* Sample dims (without the leading N). */
LOOM_API int loom_dataset_sample_ndim(const loom_dataset *d);
LOOM_API const int64_t *loom_dataset_sample_shape(const loom_dataset *d);

typedef struct {
    int64_t batch_size; /* 0 means 128 */
    uint64_t seed;
    bool no_shuffle; /* batches in file order */
    bool drop_last;  /* drop the final short batch (default: keep it) */
} loom_loader_config;

typedef struct {
    const float *x;   /* (n, sample dims...) contiguous */
    const int32_t *y; /* (n) */
    int64_t n;        /* samples in this batch */
    int ndim;         /* of x, including the batch dim */
    int64_t shape[LOOM_MAX_DIMS];
} loom_batch;

typedef struct loom_loader loom_loader;
/* A loader over d (which must outlive it). NULL on bad config. */
LOOM_API loom_loader *loom_loader_new(const loom_dataset *d, const loom_loader_config *c);
LOOM_API void loom_loader_free(loom_loader *l);
/* Starts epoch e (0-based): the order is a permutation drawn from Philox stream (2, e) of the seed,
 * or file order with no_shuffle. */
LOOM_API void loom_loader_start_epoch(loom_loader *l, int64_t epoch);
/* loom_loader_start_epoch(l, epoch), then past its first `batch` batches (all of them when batch
 * is the epoch's count or more): the batches a run resumed there trains on. */
LOOM_API void loom_loader_seek(loom_loader *l, int64_t epoch, int64_t batch);
/* The next batch of the epoch into *b (buffers owned by the loader, valid until the second call
 * after this one: a step submitted on a batch may still read it while the next one is taken);
 * false at the end of the epoch, after which the loader is at the start of the next epoch (its
 * permutation drawn from (seed, epoch + 1)): loops over epochs need no call in between. */
LOOM_API bool loom_loader_next(loom_loader *l, loom_batch *b);
LOOM_API int64_t loom_loader_batches(const loom_loader *l);
/* The configured batch size (the rows of every batch but an epoch's short last one). */
LOOM_API int64_t loom_loader_batch_size(const loom_loader *l);
/* The rows of batch j (0-based) of every epoch: the batch size, but for a short last one; 0 for a
 * j past the epoch's batches. */
LOOM_API int64_t loom_loader_batch_rows(const loom_loader *l, int64_t j);
/* The epoch the loader is in (0-based). */
LOOM_API int64_t loom_loader_epoch(const loom_loader *l);

/* ---- process groups: collectives between ranks ------------------------------------------------
 */

/* A group of `world` ranks. The local backend's ranks are threads of this process that share
 * memory; each collective is entered by every rank (each from its own thread, with its own
 * loom_comm handle) with the same arguments except the buffers. Results are bitwise identical on
 * every rank and from run to run: every reduction adds the ranks in order 0..world-1. */
typedef struct loom_group loom_group;
typedef struct loom_comm loom_comm;
/* timeout_s: how long a rank waits in a collective for the others before the group is aborted
 * with ETIMEDOUT, naming the ranks that did not arrive (0 means 60 s). NULL on bad arguments. */
LOOM_API loom_group *loom_group_local_new(int world, double timeout_s);
LOOM_API void loom_group_free(loom_group *g);
/* The group of the processes of an MPI job (started by mpirun or mpiexec): one rank per process,
 * MPI's rank and size. Its collectives are the local group's, entered by every process, and give
 * bitwise the same results (each rank reduces 1/world of the elements, adding ranks in order); a
 * collective that does not complete within timeout_s (0: 60 s), an MPI error and
 * loom_comm_abort end the whole job (MPI_Abort) after one line naming this rank (host, pid), the
 * collective and the reason, so no rank is left blocked. The first call initialises MPI (threads
 * may call it), which is finalised at exit. NULL with EUNSUPPORTED when loom was built without
 * MPI. loom_group_comm(g, r) gives this process's handle, r being its rank. */
LOOM_API loom_group *loom_group_mpi_new(double timeout_s);
/* The MPI launcher that started this process, from its environment ("mpirun (Open MPI)", ...), or
 * NULL. Static string, thread-safe. */
LOOM_API const char *loom_mpi_launcher(void);
/* Memory for buffers that g's collectives work on (as MPI_Alloc_mem): where g's ranks are
 * processes of one machine, memory every one of them maps, which the all-reduce reads and writes
 * in place when every rank's buffer is such memory (no copies through MPI); elsewhere ordinary
 * memory. Any buffer works with every collective; these are the fastest. NULL: out of memory.
 * Release with loom_group_release (same size), before freeing g. */
LOOM_API void *loom_group_alloc(loom_group *g, size_t bytes);
LOOM_API void loom_group_release(loom_group *g, void *p, size_t bytes);
/* Rank r's handle, owned by the group; one thread uses it at a time. */
LOOM_API loom_comm *loom_group_comm(loom_group *g, int rank);
LOOM_API int loom_comm_rank(const loom_comm *c);
LOOM_API int loom_comm_world(const loom_comm *c);
/* In place over buf (n floats on every rank): sum, or sum / world. Each rank reduces 1/world of
 * the elements and writes them to every rank (reduce-scatter + all-gather in shared memory). */
LOOM_API loom_status loom_comm_allreduce(loom_comm *c, float *buf, int64_t n, loom_reduce_op op);
/* Copies root's n floats into every other rank's buf. */
LOOM_API loom_status loom_comm_broadcast(loom_comm *c, float *buf, int64_t n, int root);
/* out (world * n floats) = the n floats of in from rank 0, then rank 1, ... */
LOOM_API loom_status loom_comm_allgather(loom_comm *c, const float *in, int64_t n, float *out);
LOOM_API loom_status loom_comm_barrier(loom_comm *c);
/* Fails the group: every rank waiting in or later entering a collective gets EABORTED, and
 * loom_last_error() on that thread carries `reason`. Thread-safe. */
LOOM_API void loom_comm_abort(loom_comm *c, const char *reason);
/* Collectives entered by this rank so far (the sequence number the watchdog reports). Safe to
 * read from any thread. */
LOOM_API uint64_t loom_comm_seq(const loom_comm *c);

/* ---- devices: data parallelism inside one process ---------------------------------------------
 */

/* Devices are worker threads, each pinned to a core (or spanning several: helper threads pinned
 * to the next cores split its kernels' outputs with it), each with its own gradients (its own
 * parameters too, or shared: loom_share) and its own workspace; a graph set to run on them is
 * compiled once and run by every device on its shard of each batch, gradients averaged by
 * all-reduces inside the step. */
typedef struct loom_devices loom_devices;
/* Which processes the devices span: AUTO, those of the MPI job that started this process (an MPI
 * launcher's environment, loom_mpi_launcher(), and loom built with MPI), else this process
 * alone; LOCAL, this process alone; MPI, the MPI job's (EUNSUPPORTED without MPI). */
typedef enum { LOOM_DIST_AUTO, LOOM_DIST_LOCAL, LOOM_DIST_MPI } loom_dist;
/* Whether a process's devices share the parameters and the optimizer's state (each update run by
 * one device for all, the state held once) where a step allows it, or each updates a replica of
 * its own: AUTO times both on each program's first steps and keeps the faster; ALWAYS; NEVER.
 * The results are bitwise the same either way. */
typedef enum { LOOM_SHARE_AUTO, LOOM_SHARE_ALWAYS, LOOM_SHARE_NEVER } loom_share;
#define LOOM_CORES_AUTO (-1)
typedef struct {
    int count;            /* 0 means one per `cores` cores this process may run on (its CPU
                           * affinity; across processes, its share among those on its machine) */
    int cores;            /* the cores each device spans (0 means 1, at most 64): its kernels'
                           * outputs are split among them, each output computed as on one core,
                           * so that the results are bitwise those of one-core devices;
                           * LOOM_CORES_AUTO: the CPUs of this process over `count` devices (one
                           * device of them all when count is 0) */
    double timeout_s;     /* deadline of a step and of each collective (0 means 60 s) */
    int64_t bucket_bytes; /* gradients are all-reduced in buckets of about this size (0: 1 MiB) */
    bool detect_anomaly;  /* a NaN or Inf loss fails the step, naming the device */
    bool no_pin;          /* leave the worker threads unpinned */
    loom_dist dist;       /* across processes: see loom_dist */
    loom_share share;     /* the parameters and the optimizer's state: see loom_share */
} loom_devices_config;
/* Starts the worker threads. NULL on bad config or failure (loom_last_error). Steps are counted
 * from 1 over every run on these devices (training and evaluation alike). For testing failure
 * handling, the environment's LOOM_FAULT=D:S makes device D fail at step S (counted from 1), and
 * LOOM_FAULT=D:S:hang makes it stop answering for twice the deadline plus 2 s. */
LOOM_API loom_devices *loom_devices_new(const loom_devices_config *c);
/* Stops the workers. Graphs using d must be freed first. */
LOOM_API void loom_devices_free(loom_devices *d);
/* The devices of this process, and the cores each spans (loom_devices_config.cores). */
LOOM_API int loom_devices_count(const loom_devices *d);
LOOM_API int loom_devices_cores(const loom_devices *d);
/* Across the processes of an MPI job (loom_dist): every process's devices (world = processes x
 * count; every process has as many), and this process's rank (0 alone). A batch is split over
 * the world's devices, device p * count + i being process p's i-th; gradients are averaged over
 * all of them (summed in shared memory within a process, then across processes in process
 * order); replicas are broadcast from process 0 and compared by checksum across processes; a
 * failure in any process ends the whole job (MPI_Abort) after one line naming it. Under MPI,
 * loom_graph_wait, loom_item and loom_tensor_gather are collectives: every process calls them,
 * in the same order (the loss and the gathered rows are the whole world's). */
LOOM_API int loom_devices_world(const loom_devices *d);
LOOM_API int loom_devices_process(const loom_devices *d);
/* Whether any process passed true: a collective across the processes of an MPI job (every
 * process calls it, in the same order), `mine` itself alone. For decisions every process must
 * take at the same step, such as stopping on a signal one of them received. */
LOOM_API bool loom_devices_any(loom_devices *d, bool mine);
/* Whether every process of an MPI job runs the same configuration: items are its n "name=value"
 * strings (at most 128), in the same order in every process. Process 0 broadcasts their hashes,
 * each process compares its own, and all learn the first process that differs (in rank order)
 * and the first item it differs at: EINVAL on every process, the message naming that process
 * and the item's name and this process's value ("the processes disagree: process 2's --seed
 * differs from process 0's (--seed=0 here, on process 0)"). A collective (every process calls
 * it, at the same point); OK at once on one process. */
LOOM_API loom_status loom_devices_agree(loom_devices *d, const char *const *items, int n);
/* Fails the devices for `reason`: every device waiting in or entering a step stops (EABORTED);
 * across the processes of an MPI job the whole job ends (MPI_Abort) after one line naming this
 * process (rank, host, pid) and the reason, and this call does not return. */
LOOM_API void loom_devices_abort(loom_devices *d, const char *reason);
/* Runs g's steps on d from now on; call before recording the first node of a step (shards depend
 * on the device count). g's model is replicated from device 0 (the model's own slabs) at the next
 * run and whenever loom_model_touch() says it changed; replicas are verified by checksum. A
 * failed step (any device) fails every device within the deadline: loom_graph_run returns its
 * status naming the device, the step and the reason; d cannot run further steps. Setting other
 * devices ends a step still running on the old ones first. */
LOOM_API loom_status loom_graph_set_devices(loom_graph *g, loom_devices *d);

/* ---- checkpoints: the whole state of a run -----------------------------------------------------
 */

/* Writes the model's parameters (as loom_model_save) and the optimizer's state as one safetensors
 * file, atomically (loom_model_save's way, and the directory fsync'd after the rename): each
 * state tensor as "optimizer.<parameter name>.<key>" (loom_optim_state_key: PyTorch's keys),
 * F32; in "__metadata__" the model's metadata (where the caller keeps the rest of its run's state:
 * step, epoch, seed...), "optimizer" (loom_optim_name), "optimizer.step" (steps: the optimizer
 * steps whose updates the state holds, a step recorded but not run not counted) and
 * "loom.checkpoint". ERANGE (nothing written) for NaN or infinite values; EIO (the previous file
 * intact) when it cannot be written. Ends a step running on m first. */
LOOM_API loom_status loom_checkpoint_save(const char *path, const loom_model *m, loom_optim *o,
                                          int64_t steps);
/* Reads a checkpoint into m and o: parameters, state, the optimizer's step count (loom_optim_set_
 * steps, and *steps when not NULL) and the metadata (replacing m's). Everything is checked before
 * anything changes: EIO/EFORMAT for a file cut short or corrupt (every tensor's CRC-32C is
 * compared), EFORMAT for a weights file that is no checkpoint, EINVAL for another optimizer's,
 * ENOTFOUND/ESHAPE/EFORMAT naming the first tensor that does not match m or o. */
LOOM_API loom_status loom_checkpoint_load(const char *path, loom_model *m, loom_optim *o,
                                          int64_t *steps);
/* Where a run is, as its checkpoints keep it in the model's metadata (loom.step, loom.epoch,
 * loom.batch, loom.monitor, loom.best, loom.val_loss, loom.val_acc, loom.world): the trainer and
 * the command write and read it through these, so a checkpoint of either resumes in the other. */
typedef struct {
    int64_t step;         /* optimizer steps done */
    int64_t epoch, batch; /* the next batch: its epoch (0-based) and the batches of it done; -1 for
                           * none (a run without epochs) */
    const char *monitor;  /* what `best` is of: "val_loss" or "val_acc"; NULL: none */
    double best, val_loss, val_accuracy; /* the best monitored value, the last validation's (NaN) */
    int world;                           /* the devices of every process */
} loom_run_position;
/* Writes p into m's metadata (the keys of absent parts removed). ENOMEM. */
LOOM_API loom_status loom_run_position_set(loom_model *m, const loom_run_position *p);
/* Reads it back (a loaded checkpoint's); p->monitor points into m's metadata. EFORMAT when
 * loom.step is missing or a part is not a number. */
LOOM_API loom_status loom_run_position_get(const loom_model *m, loom_run_position *p);
/* A directory of checkpoints, as Lightning's ModelCheckpoint keeps them. */
typedef struct {
    const char *dir; /* created with its parents when missing */
    int64_t keep;    /* the newest `keep` checkpoints are kept (0: all), and the best */
    bool maximize;   /* the monitored value is better when larger (accuracy), else smaller */
} loom_checkpoint_config;
/* Writes DIR/step-<steps, 6 digits or more>.safetensors (loom_checkpoint_save), then the
 * directory's index (DIR/index.tsv: file, step and monitored value of each checkpoint kept, oldest
 * first, written atomically) with this one (`monitored`: NaN for none) and without the ones no
 * longer kept (and any of later steps: a run resumed from before them), then removes those. The
 * file's path into path (cap bytes). A process killed at any point leaves an index whose every
 * checkpoint is whole. EIO/ENOMEM; EFORMAT for an index that is not loom's (nothing written). */
LOOM_API loom_status loom_checkpoint_write(const loom_checkpoint_config *c, const loom_model *m,
                                           loom_optim *o, int64_t steps, double monitored,
                                           char *path, size_t cap);
/* loom_checkpoint_load of `where`: a checkpoint file, or a directory's newest checkpoint that
 * reads whole (one that does not is skipped with a warning through the log hook); its path into
 * path. ENOTFOUND when nothing is at `where` or the directory has no checkpoint. */
LOOM_API loom_status loom_checkpoint_resume(const char *where, loom_model *m, loom_optim *o,
                                            int64_t *steps, char *path, size_t cap);

/* ---- TensorBoard: event files of scalars --------------------------------------------------------
 */

/* A writer of TensorBoard's event files, as torch.utils.tensorboard.SummaryWriter's add_scalar:
 * DIR/events.out.tfevents.<seconds>.<host>.<pid>.loom (DIR made with its parents), TFRecord
 * framing with masked CRC-32C, Event and Summary protocol buffers. resumed >= 0: a run resumed
 * after that step (its file tells TensorBoard to drop an earlier file's later steps); -1: new.
 * Scalars are buffered and written whole (every 4 KiB, at loom_tensorboard_flush and _close);
 * EIO names the file and the reason, and the file ends on a whole record. Not thread-safe. */
typedef struct loom_tensorboard loom_tensorboard;
LOOM_API loom_status loom_tensorboard_open(const char *dir, int64_t resumed,
                                           loom_tensorboard **out);
LOOM_API loom_status loom_tensorboard_add(loom_tensorboard *w, const char *tag, int64_t step,
                                          double value);
LOOM_API loom_status loom_tensorboard_flush(loom_tensorboard *w);
LOOM_API const char *loom_tensorboard_path(const loom_tensorboard *w);
/* Flushes, syncs and frees w (NULL: nothing). */
LOOM_API loom_status loom_tensorboard_close(loom_tensorboard *w);

/* ---- accelerator: the mid-level API (the loop is the user's) -----------------------------------
 */

/* Like Hugging Face Accelerate: prepare the model, optimizer and loader once; then each batch comes
 * as tensors already sharded over the devices, loom_accelerator_backward() records the gradients
 * (averaged across devices inside the step) and loom_accelerator_step() the update, and runs the
 * step. The same program runs unchanged on 1 or N devices. */
typedef struct loom_accelerator loom_accelerator;
typedef struct {
    int devices;          /* 0 means one per `cores_per_device` available cores */
    int cores_per_device; /* 0 means 1: loom_devices_config.cores */
    double timeout_s;     /* 0 means 60 */
    bool detect_anomaly;  /* a NaN/Inf loss fails the step */
} loom_accelerator_config;
LOOM_API loom_accelerator *loom_accelerator_new(const loom_accelerator_config *c);
LOOM_API void loom_accelerator_free(loom_accelerator *a);
LOOM_API int loom_accelerator_devices(const loom_accelerator *a);
/* Takes (does not own) the model, its optimizer and the training loader. */
LOOM_API loom_status loom_accelerator_prepare(loom_accelerator *a, loom_model *m, loom_optim *o,
                                              loom_loader *train);
/* The next batch of `l` (NULL: the prepared training loader), as a new step: *g is the step's
 * graph, *x the samples (B, ...) and *y the labels (B), both sharded over the devices. false at
 * the end of the epoch. */
LOOM_API bool loom_accelerator_next(loom_accelerator *a, loom_loader *l, loom_graph **g,
                                    loom_tensor **x, loom_tensor **y);
LOOM_API void loom_accelerator_backward(loom_accelerator *a, loom_tensor *loss);
/* Gradient accumulation in the user's loop: loom_backward_accumulate on the step's graph (weight:
 * the batch's share of the optimizer step's samples); the step that follows records the
 * optimizer's update only when `last`. */
LOOM_API void loom_accelerator_backward_accumulate(loom_accelerator *a, loom_tensor *loss,
                                                   double weight, bool first, bool last);
/* Records the optimizer update and runs the step. */
LOOM_API loom_status loom_accelerator_step(loom_accelerator *a);
/* Runs the step as recorded (evaluation: no update). */
LOOM_API loom_status loom_accelerator_run(loom_accelerator *a);

/* ---- trainer: the high-level API (the loop is the library's) ------------------------------------
 */

/* Like PyTorch Lightning: the user gives the steps, the trainer runs epochs on the devices,
 * validates, logs progress and keeps metrics. */
typedef struct {
    /* the loss of a batch; x (B, ...) and y (B) are sharded over the devices */
    loom_tensor *(*training_step)(void *ctx, loom_graph *g, loom_tensor *x, loom_tensor *y);
    /* the logits (B, classes) of a batch; the trainer counts correct argmaxes (may be NULL) */
    loom_tensor *(*validation_step)(void *ctx, loom_graph *g, loom_tensor *x, loom_tensor *y);
    void *ctx;
} loom_module_fns;
typedef struct {
    int64_t max_epochs;   /* 0 means 1 */
    int64_t max_steps;    /* stop after this many steps (0: no limit) */
    int devices;          /* 0 means one per `cores_per_device` available cores */
    int cores_per_device; /* 0 means 1: loom_devices_config.cores */
    double timeout_s;     /* 0 means 60 */
    bool detect_anomaly;
    int64_t log_every; /* a progress line every N steps (0: 100; negative: quiet) */
    /* Gradient accumulation (Lightning's accumulate_grad_batches): this many loader batches per
     * optimizer step (0, 1: one), the gradients all-reduced once; max_steps, checkpoint_every
     * and the schedule count optimizer steps. */
    int64_t accumulate;
    /* Checkpoints (Lightning's ModelCheckpoint), by the job's process 0: into checkpoint_dir
     * (NULL: none) every checkpoint_every steps (0: after each validation) and at the end,
     * keeping the newest `keep` (0: all) and the best by validation loss (or accuracy, with
     * monitor_accuracy); loom_checkpoint_write. */
    const char *checkpoint_dir;
    int64_t checkpoint_every, keep;
    bool monitor_accuracy;
    /* A checkpoint file or directory (its newest) to continue from: the parameters, the
     * optimizer, the step count and the position in the epoch, so that the run ends with the
     * parameters it would have had uninterrupted, bitwise on the same devices (NULL: none). */
    const char *resume;
    /* TensorBoard event files (loom_tensorboard_*) into this directory, by process 0: train/loss
     * each step, val/loss and val/accuracy after each validation (NULL: none). */
    const char *log_dir;
} loom_trainer_config;
typedef struct {
    int64_t steps, epochs; /* steps: optimizer steps, those before a resume included */
    double last_loss;
    double val_accuracy, val_loss; /* after the last validation; NaN before one */
    double best;                   /* the best monitored validation value; NaN before one */
    double samples_per_s;
    bool stopped;           /* loom_trainer_stop() ended the run */
    const char *checkpoint; /* the newest checkpoint's path (owned by the trainer), or NULL */
} loom_trainer_metrics;
typedef struct loom_trainer loom_trainer;
LOOM_API loom_trainer *loom_trainer_new(const loom_trainer_config *c);
LOOM_API void loom_trainer_free(loom_trainer *t);
/* Ends loom_trainer_fit after the step running (no validation), with a checkpoint when it
 * writes them (metrics: stopped). Async-signal-safe: a SIGTERM or SIGINT handler may call it. */
LOOM_API void loom_trainer_stop(loom_trainer *t);
/* Callbacks (Lightning's Callback hooks): called on every process at each event with the
 * trainer's state; returning true stops the run (trainer.should_stop): after the step that
 * ended, or, from a validation or epoch's end, before the next epoch; the processes of an MPI
 * job stop together when any of them says so. */
typedef enum {
    LOOM_ON_FIT_START,       /* before the first step (a resumed run's: at its step) */
    LOOM_ON_TRAIN_BATCH_END, /* a step has ended: step, loss, lr */
    LOOM_ON_VALIDATION_END,  /* val_loss, val_accuracy, best */
    LOOM_ON_EPOCH_END,       /* an epoch is whole, after its validation */
    LOOM_ON_FIT_END          /* the run has ended (stopped or not), its last checkpoint written */
} loom_trainer_event;
typedef struct {
    loom_trainer_event event;
    int64_t epoch;                       /* 0-based */
    int64_t step;                        /* optimizer steps done */
    double loss, lr;                     /* the last step's loss and learning rate */
    double val_loss, val_accuracy, best; /* NaN before a validation */
    int world;                           /* devices across processes */
    bool first_process;                  /* the job's process 0: the one that reports */
    loom_tensorboard *tb;                /* config.log_dir's writer on process 0, else NULL */
} loom_trainer_state;
typedef bool (*loom_trainer_callback)(const loom_trainer_state *s, void *user);
/* Adds fn (called with user) after those added before it; EINVAL past 16. */
LOOM_API loom_status loom_trainer_add_callback(loom_trainer *t, loom_trainer_callback fn,
                                               void *user);
/* Lightning's EarlyStopping: stops the run once `patience` validations in a row (0: 3) have not
 * improved the monitored value (val_loss, or val_accuracy with monitor_accuracy) on the best so
 * far by more than min_delta. The same on every process (validation sees every sample). */
typedef struct {
    bool monitor_accuracy;
    int64_t patience;
    double min_delta;
} loom_early_stopping_config;
LOOM_API loom_status loom_trainer_early_stopping(loom_trainer *t,
                                                 const loom_early_stopping_config *c);
/* Lightning's LearningRateMonitor: each step's learning rate as train/lr in config.log_dir's
 * TensorBoard file, and through the log hook every `every` steps (0: never). */
LOOM_API loom_status loom_trainer_lr_monitor(loom_trainer *t, int64_t every);
/* Trains m with o over `train` for max_epochs, validating on `val` (may be NULL) after each
 * epoch. Progress goes to the log hook. Returns the first failure (a resume's refusal
 * included: loom_checkpoint_resume's). */
LOOM_API loom_status loom_trainer_fit(loom_trainer *t, loom_model *m, loom_optim *o,
                                      const loom_module_fns *fns, loom_loader *train,
                                      loom_loader *val);
/* Accuracy (and the mean loss: loom_trainer_get_metrics' val_loss) over the whole of val. */
LOOM_API loom_status loom_trainer_validate(loom_trainer *t, const loom_module_fns *fns,
                                           loom_loader *val, double *accuracy);
LOOM_API void loom_trainer_get_metrics(const loom_trainer *t, loom_trainer_metrics *out);

/* How many rows of logits (rows x classes, row-major) have their first maximum at the row's label:
 * the count behind an accuracy. Pure, thread-safe. */
LOOM_API int64_t loom_count_correct(const float *logits, int64_t rows, int64_t classes,
                                    const int32_t *labels);
/* The cross-entropy of the rows of logits (rows x classes) against their labels, summed over the
 * rows, in double (log-sum-exp from the row's maximum): the sum behind a validation loss. Pure. */
LOOM_API double loom_cross_entropy_sum(const float *logits, int64_t rows, int64_t classes,
                                       const int32_t *labels);

/* ---- information ------------------------------------------------------------------------------
 */

/* This machine's float32 FMA peak on one core in GFLOP/s, measured the first time (about 50 ms of
 * FMAs on registers in AVX-512, or AVX2 where the CPU has no AVX-512: call it while the devices
 * are idle); 0 with neither. */
LOOM_API double loom_fma_peak_gflops(void);
/* Library version, backends and BLAS, one fact per line, into buf (always NUL-terminated). */
LOOM_API void loom_info(char *buf, size_t size);
/* Removes loom's cached files (compiled kernels, decompressed datasets and tokenized texts) and
 * says how many and how large through *files and *bytes. EIO if the directory cannot be read. */
LOOM_API loom_status loom_cache_clear(int64_t *files, int64_t *bytes);

#ifdef __cplusplus
}
#endif
#endif /* LOOM_H */
