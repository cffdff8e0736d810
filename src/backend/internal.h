/*
 * backend/internal.h - the executable form of a step: a program is the graph's nodes (copied, so
 * that it outlives the step), a layout per node (where its elements live and with which strides)
 * and the list of nodes that run a kernel, in order. compile/ builds programs; backends run them.
 *
 * Layout invariants: a node that runs a kernel writes a contiguous row-major buffer in the
 * workspace (or, for STORE, into a persistent slab); views (RESHAPE of contiguous data, PERMUTE,
 * EXPAND) only change strides and own no storage; a view that cannot be expressed by strides is
 * materialized by a copy kernel from its `src_lay`.
 */
#ifndef LOOM_BACKEND_INTERNAL_H
#define LOOM_BACKEND_INTERNAL_H

#include "../graph/internal.h"

typedef enum {
    LOOM_BASE_NONE,    /* STORE: no value of its own */
    LOOM_BASE_WS,      /* workspace, offset in bytes / element size */
    LOOM_BASE_INPUT,   /* the caller's buffer of input `index` */
    LOOM_BASE_CONST,   /* the program's constant slot `index` */
    LOOM_BASE_PERSIST, /* the model's slab `index` */
} loom__base;

typedef struct {
    uint8_t base;   /* loom__base */
    int32_t index;  /* input ordinal, constant slot, slab, or the node owning a workspace buffer */
    int64_t offset; /* in elements from the base */
    int64_t stride[LOOM_MAX_DIMS];
} loom__layout;

typedef struct {
    uint8_t op, dtype, ndim;
    bool copy;   /* a movement node materialized by copying src_lay (shape: copy_shape) */
    bool check;  /* anomaly detection: the run fails if this node's values are not finite */
    bool elided; /* a STORE whose source was computed in place */
    bool out;    /* an output of the step (read after it) */
    int64_t shape[LOOM_MAX_DIMS];
    int32_t src[3]; /* node ids, -1 for none */
    loom__attr attr;
    loom__layout lay;
    loom__layout src_lay;
    int64_t copy_shape[LOOM_MAX_DIMS];
    int copy_ndim;
    bool virt; /* an UNFOLD without padding run by no kernel: a strided view of its input */
    /* A grouped view (gndim > 0): a 2-D RESHAPE (or its PERMUTE) of a view no strides express,
     * such as an unfold read as a matrix. lay.stride[0..gndim) are the strides of the source's dims
     * gshape; dims [0, gsplit) form the rows, the rest the columns (swapped when gtrans). Only a
     * product reads one (its operand packing walks the dims); any other reader copies it first. */
    int8_t gndim, gsplit;
    bool gtrans;
    int64_t gshape[LOOM_MAX_DIMS];
    int32_t epi;        /* a product or pool gradient: the generated kernel (index in fused) it
                         * runs on each block of its output as that block is done, -1 for none */
    int64_t ws_off;     /* bytes: where this node's own workspace buffer starts */
    int32_t fused_into; /* the consumer computing this node in its kernel, -1 for none */
    int32_t made_by;    /* the producer whose kernel computes this node (a sum fed rows as a pool
                         * gradient makes them, the ReLU a pooling writes), -1 for none */
    int32_t form;       /* the first of the kernel forms it runs (index in the program's forms, each
                         * naming the next), -1 for none: see loom__form */
} loom__pnode;

/* A kernel form: what a fusion rule that is not a generated kernel (compile/forms/NAME.c, its row
 * in compile/fuse.c's loom__rules) made of a node, as a record on the program. A node refers to
 * its forms by one index (loom__pnode.form), the first of a list: a pool gradient may read codes,
 * take a ReLU's backward and feed sinks at once. Executors look up the form a kernel family runs
 * (loom__form_get); the planner and the program's printer ask the form's own functions
 * (compile/'s loom__form_ops) for its buffers, its line and the values it leaves. The kinds in the
 * order those functions are asked, each with the rule that makes it and what it holds: */
typedef enum {
    LOOM_FORM_ACT,        /* product-act, a MATMUL: its epilogue in registers as it stores */
    LOOM_FORM_RELU,       /* pool-relu, a POOLMAX: it writes the ReLU of its maxima instead */
    LOOM_FORM_CODES,      /* pool-codes, a POOLMAX: it keeps each window's argmax place */
    LOOM_FORM_CONV,       /* pool-conv, a POOLMAX: it computes its product plane by plane */
    LOOM_FORM_BACK,       /* conv-back, a FOLD: it makes a pool gradient's rows for its products */
    LOOM_FORM_CROP,       /* fold-crop, a FOLD: it writes its crop (a ReLU's backward of it) */
    LOOM_FORM_CODES_READ, /* pool-codes, a POOLGRAD: it reads a POOLMAX's codes, not its input */
    LOOM_FORM_RELU_DY,    /* pool-relu, a POOLGRAD: it reads x of where(relu > 0, x, 0) as dy */
    LOOM_FORM_SINKS,      /* pool-sinks, a POOLGRAD: it feeds its rows to sinks while in cache */
    LOOM_FORM_QUAD,       /* pool-quad, a POOLGRAD with sinks: they take its windows instead */
    LOOM_FORM_LNORM_KEEP, /* lnorm-keep, an LNORM: it keeps each row's rstd after its values */
    LOOM_FORM_LNORM_READ, /* lnorm-keep, an LNORMGRAD: it reads an LNORM's output and rstd, not x */
    LOOM_FORM_KINDS
} loom__form_kind;

struct loom__bind;
/* A kernel: node id of program p, on the buffers of bind b. */
typedef loom_status (*loom__kernel_fn)(const loom__program *p, const struct loom__bind *b,
                                       int32_t id);

typedef struct {
    uint8_t kind; /* loom__form_kind */
    int32_t node; /* the node whose kernel runs it */
    int32_t next; /* the node's next form, -1 for none */
    /* the kernel its node runs in place of its op's (its kind's run, compile/'s loom__form_ops),
     * NULL for none: then its op's kernel reads the record */
    loom__kernel_fn run;
    /* the node its node's kernel reads in place of operand `operand` (-1 for none): CODES_READ the
     * POOLMAX keeping them (for x), RELU_DY the gradient x of where(relu > 0, x, 0) (for the
     * WHERE), LNORM_READ the LNORM keeping its rstd (for x) */
    struct {
        int8_t operand;
        int32_t node;
    } reads;
    union {
        /* ACT: the bias row or matrix added (-1 for none) and then the ReLU; or, with mask >= 0,
         * where(mask > 0, product, 0); written into the epilogue's root; sum: a SUM over axis 0
         * of that root made too (by columns as rows are stored), or -1 */
        struct {
            bool relu;
            int32_t add, mask, sum;
        } act;
        int32_t relu;    /* RELU: the RELU node it writes (its own values then never are) */
        int32_t product; /* CONV: the MATMUL it computes (naming the POOLMAX as fused_into) */
        /* BACK: the POOLGRAD whose rows it makes, the weight gradient (a MATMUL of the rows and an
         * unfold) and the sum along them (or -1) it feeds; each names the FOLD as fused_into */
        struct {
            int32_t grad, w, sum;
        } back;
        /* CROP: the CROP of the fold (made_by it) and the node its planes are written into
         * cropped: that CROP, or the copy of its (C,N) permute as (C, N H W) (cn); with mask >= 0,
         * where(mask > 0, that, 0) made_by it too, written into its WHERE */
        struct {
            int32_t crop, into, mask;
            bool cn;
        } crop;
        /* SINKS: the sinks (a sum along the rows, a product on the dot-product path), the node
         * whose 2-D rows they read, and keep: others read the rows too, so they are written
         * whole (else two rows at a time are held) */
        struct {
            int32_t sink[2], n, stream;
            bool keep;
        } sinks;
    } u;
} loom__form;

/* A view: strides over another node's values, no kernel (a MOV op not materialized, or an unfold
 * without padding read in place). */
static inline bool loom__is_view(const loom__pnode *t) {
    return !t->copy && (loom__ops[t->op].kind == LOOM_KIND_MOV || t->virt);
}
/* Whether node t runs a kernel of its own (neither a leaf nor a view). */
static inline bool loom__runs_kernel(const loom__pnode *t) {
    return !loom__is_view(t) && loom__ops[t->op].kind != LOOM_KIND_LEAF;
}

#define LOOM_FUSED_MAX_ARGS 16
#define LOOM_RULES_MAX      16 /* fusion rules (compile/fuse.c's table) */
#define LOOM_FUSED_MAX_OUTS 4

/* A generated kernel: args[0] is the root node (the output), the rest its leaves; fn(args, lo, hi)
 * computes the outputs of indices [lo, hi) of its outermost loop, [0, extent) all of them, each
 * as the whole would (so that a device's cores may split it: loom__team_for); work: its elements'
 * operations, for choosing whether to split. An epilogue
 * (epi_of >= 0) runs inside library kernel epi_of instead of on its own: part(args, i, j0, j1, v)
 * computes row i, columns [j0, j1) of its 2-D root into args[0][0 .. j1 - j0), reading leaf
 * epi_arg (the library kernel's output) from v[0 .. j1 - j0) while that block is still in cache. */
typedef void (*loom__kfn)(void *const *args, int64_t lo, int64_t hi);
typedef void (*loom__kpart)(void *const *args, int64_t i, int64_t j0, int64_t j1, const void *v);
typedef struct {
    int32_t root;
    int32_t nargs;
    int32_t args[LOOM_FUSED_MAX_ARGS];
    loom__kfn fn;
    int64_t extent;
    double work;
    int32_t epi_of, epi_arg;
    loom__kpart part;
    /* Members also stored, each into its slab place (an optimizer's moments, read by the update
     * that is the root): outs[q] as argument out_args[q], q < nout. Same shape, contiguous. */
    int32_t nout;
    int32_t outs[LOOM_FUSED_MAX_OUTS], out_args[LOOM_FUSED_MAX_OUTS];
} loom__fused;

/* Whether argument a of kernel k is a stored member's (written, not read). */
static inline bool loom__fused_out_arg(const loom__fused *k, int a) {
    for (int q = 0; q < k->nout; q++)
        if (k->out_args[q] == a)
            return true;
    return false;
}

/* A value that a kernel leaves whole in memory: node id's elements at lay (its shape and dtype;
 * a STORE's or SYNC's: the slab range it wrote). exact: the same arithmetic in the same order as
 * the op alone computes it, so the same bits (false: a fold adding its product into the image as
 * the product goes sums the taps in another order; a pool gradient's sinks by windows take the
 * sums and products in another order). */
typedef struct {
    int32_t id;
    bool exact;
    loom__layout lay;
} loom__value;
#define LOOM_ENTRY_VALUES_MAX 8
/* What the planner (compile/program.c, above the executors) lends every program it plans, so that
 * an executor reaches the compiler only through it: the CPU executor (the one a check executor
 * builds with), a program's reference twin (the same ids, shapes and outputs, planned with nothing
 * fused: each op its own interpreted kernel, every value in its own buffer to the step's end;
 * NULL out of memory) and how to free one. */
typedef struct {
    const loom__executor *cpu;
    loom__program *(*reference)(const loom__program *p, const loom__executor *x);
    void (*free)(loom__program *p);
    /* the values exec entry e of p leaves whole in memory (loom__entry_values) */
    int (*values)(const loom__program *p, int64_t e, loom__value *out);
} loom__planner;

struct loom__program {
    uint64_t hash;
    const loom__planner *planner;
    int64_t n; /* nodes */
    loom__pnode *nodes;
    int32_t *exec; /* ids of nodes that run, in order */
    int64_t nexec;
    double *consts; /* constant slots (8 bytes each, holding the node's dtype) */
    int64_t nconsts;
    size_t ws_bytes; /* workspace needed */
    double flops;    /* of its products (matmuls, attention): loom_metrics.flops */
    size_t scratch;  /* workspace offset of the library kernels' scratch (loom's products' packing,
                      * the attention's heads), which each uses while it runs; 0 with none */
    loom__fused *fused; /* generated kernels */
    int64_t nfused;
    int32_t *fused_of; /* per node: index in fused, -1 where the interpreter runs it */
    loom__form *forms; /* the kernel forms of its nodes (loom__pnode.form) */
    int32_t nforms, forms_cap;
    const loom__executor *x; /* the executor that built it and runs it */
    void *target;            /* what x's build made for it (the CPU's: the loaded object) */
    uint64_t *prof_ns; /* LOOM_PROFILE: nanoseconds per exec entry summed over devices, then runs */
    /* ... and per exec entry the times of its last LOOM_PROF_KEEP runs (ns, a ring; the count of
     * runs recorded in prof_seen), for the median: this machine's speed has spikes that move a
     * mean by 10% */
    uint32_t *prof_keep;
    uint64_t *prof_seen;
    /* The devices of a process share the PARAM and STATE slabs when `share` (loom__plan_owners):
     * entries with own[e] > 0 (the elements they write, all into those slabs: an optimizer's
     * updates) are each run by one device, the others by every device; own NULL where none. */
    bool share;
    int64_t *own;
    int32_t rule_hits[LOOM_RULES_MAX]; /* ops each fusion rule fused (compile/fuse.c's table) */
};
#define LOOM_PROF_KEEP 256

/* Node id's form of kind k, or NULL. */
static inline const loom__form *loom__form_get(const loom__program *p, int32_t id,
                                               loom__form_kind k) {
    for (int32_t f = p->nodes[id].form; f >= 0; f = p->forms[f].next)
        if (p->forms[f].kind == k)
            return &p->forms[f];
    return NULL;
}
/* The kernel node id's forms run in place of its op's, or NULL (the first form with one). */
static inline loom__kernel_fn loom__form_kernel(const loom__program *p, int32_t id) {
    for (int32_t f = p->nodes[id].form; f >= 0; f = p->forms[f].next)
        if (p->forms[f].run)
            return p->forms[f].run;
    return NULL;
}
/* What the pooling forms hold, asked often: the RELU a POOLMAX writes (-1 for none), the POOLMAX
 * whose codes a pool gradient reads (-1), the gradient it reads as dy (its WHERE's x, or its own
 * second operand), and whether a POOLMAX keeps codes. */
static inline int32_t loom__pool_relu_of(const loom__program *p, int32_t id) {
    const loom__form *x = loom__form_get(p, id, LOOM_FORM_RELU);
    return x ? x->u.relu : -1;
}
static inline int32_t loom__pool_codes_of(const loom__program *p, int32_t id) {
    const loom__form *x = loom__form_get(p, id, LOOM_FORM_CODES_READ);
    return x ? x->reads.node : -1;
}
static inline int32_t loom__pool_dy(const loom__program *p, int32_t id) {
    const loom__form *x = loom__form_get(p, id, LOOM_FORM_RELU_DY);
    return x ? x->reads.node : p->nodes[id].src[1];
}
static inline bool loom__pool_keeps_codes(const loom__program *p, int32_t id) {
    return loom__form_get(p, id, LOOM_FORM_CODES) != NULL;
}
/* Node id's sinks (NULL for none), and whether they alone read its rows: then two rows at a
 * time are held, never all (loom__form.u.sinks.keep false). */
static inline const loom__form *loom__sinks_of(const loom__program *p, int32_t id) {
    return loom__form_get(p, id, LOOM_FORM_SINKS);
}
static inline bool loom__rows_streamed(const loom__program *p, int32_t id) {
    const loom__form *x = loom__sinks_of(p, id);
    return x && !x->u.sinks.keep;
}

/* Collectives of the device running a program (set by dist/; NULL on a single device, where a
 * collective over one device is the identity). */
typedef loom_status (*loom__allreduce_fn)(void *comm, float *buf, int64_t n, loom_reduce_op op);

typedef struct loom__bind {
    unsigned char *ws;
    const void *const *inputs;
    float *slab[LOOM_SLAB_COUNT];
    loom__allreduce_fn allreduce;
    void *comm;
    /* per exec entry, the device that runs it for all (loom__owners), -1 for every device; or
     * NULL: every entry runs here. `device`: this one's index. */
    const int32_t *owner;
    int device;
    /* the device's cores (NULL: one), which split the outputs of its larger kernels */
    loom__team *team;
} loom__bind;

/* Kernels of fewer operations than this run on one core: splitting costs more than it saves. */
#define LOOM_SPLIT_MIN 32768.0

/* The scratch worker w of a kernel split by loom__team_for uses (loom__team_scratch; the
 * program's own for the caller): each its own, as large. */
static inline unsigned char *loom__scratch_of(const loom__program *p, const loom__bind *b, int w) {
    return w > 0 ? (unsigned char *)loom__team_scratch(b->team, w) : b->ws + p->scratch;
}

/* Whether exec entry e runs on the device bound by b (not another device's shared update). */
static inline bool loom__runs_here(const loom__bind *b, int64_t e) {
    return !b->owner || b->owner[e] < 0 || b->owner[e] == b->device;
}

/* An executor runs programs on one kind of device. The planner (compile/program.c) records the
 * graph, decides fusion and memory, and hands each new program to its graph's executor once:
 * build renders the generated kernels (p->fused) for the target and loads them; a failure
 * leaves the program's ops to run one by one. Whoever runs a step (one device on the caller's
 * thread, or dist/devices.c's device threads, concurrently) calls run with that device's
 * bindings; release frees what build made when the program is freed. Nothing above this
 * interface knows the target: loom__cpu_executor (compile/cpu.c: C rendered by codegen.c, built by
 * cc.c, run with interp.c's kernels) runs steps; loom__check_executor (check.c) is a second,
 * which checks every kernel of a step against the reference interpreter. */
struct loom__executor {
    const char *name;
    /* The fusion rules (compile/fuse.c's table, by name) whose kernel forms this executor runs,
     * NULL-terminated; the planner applies no other, so that an executor for another target takes
     * the forms it implements and is handed every other op as its own kernel. NULL: every rule.
     * A rule finds what it builds on in the records that earlier rules made, so one whose
     * groundwork an executor does not take finds nothing to fuse (tests/test_compile.c leaves out
     * each). */
    const char *const *forms;
    /* *compiled: whether a compiler ran (else the build came from a cache) */
    loom_status (*build)(const loom__executor *x, loom__program *p, bool *compiled);
    loom_status (*run)(const loom__executor *x, const loom__program *p, const loom__bind *b);
    void (*release)(const loom__executor *x, loom__program *p);
    void *ctx;
};
/* backend/check.c: the check executor, each kernel's values against the reference interpreter's
 * (LOOM_CHECK=1 makes it every graph's); what it compared over all runs (atomic counts), and
 * corrupt_entry >= 0 flips a bit of that exec entry's first value before comparing (a test that
 * the check can fail). */
extern const loom__executor loom__check_executor;
typedef struct {
    int64_t kernels, values;
    int64_t corrupt_entry;
} loom__check_counts;
extern loom__check_counts loom__check;

/* The executable entries of a program one at a time: exec entry e with bindings b. */
loom_status loom__interp_entry(const loom__program *p, const loom__bind *b, int64_t e);

/* out = x[0 .. n) combined by OP(acc, a) in LOOM_LANES lanes (element j into lane j % LOOM_LANES,
 * each lane starting from IDENT), the lanes then folded in a fixed tree (lane j with lane j + 8,
 * then + 4, + 2, + 1): independent chains that vectorize, in a fixed order, so repeatable bitwise.
 * A macro so that a row kernel built for AVX-512 has it inline (a call from one made LayerNorm's
 * kernels 2.3-3.8x slower). */
#define LOOM_LANES 16
#define LOOM_LANE_REDUCE(T, IDENT, OP, x, n, out)        \
    do {                                                 \
        T l_[LOOM_LANES];                                \
        for (int j_ = 0; j_ < LOOM_LANES; j_++)          \
            l_[j_] = (IDENT);                            \
        int64_t q_ = 0;                                  \
        for (; q_ + LOOM_LANES <= (n); q_ += LOOM_LANES) \
            for (int j_ = 0; j_ < LOOM_LANES; j_++)      \
                l_[j_] = OP(l_[j_], (x)[q_ + j_]);       \
        for (int j_ = 0; q_ + j_ < (n); j_++)            \
            l_[j_] = OP(l_[j_], (x)[q_ + j_]);           \
        for (int w_ = LOOM_LANES / 2; w_ >= 1; w_ /= 2)  \
            for (int j_ = 0; j_ < w_; j_++)              \
                l_[j_] = OP(l_[j_], l_[j_ + w_]);        \
        (out) = l_[0];                                   \
    } while (0)
#define LOOM_LANE_ADD(acc, a) ((acc) + (a))
/* attention.c: the kernels of ATTENTION and ATTENTIONGRAD. An ATTENTION node that an
 * ATTENTIONGRAD reads (loom__attention_keeps: up to 64 MB of them) keeps its probabilities for it
 * in its buffer, after its values: loom__attention_kept_bytes of them at byte
 * loom__attention_kept_at (the memory plan makes the room); the gradient then reads them instead
 * of making them again. */
bool loom__attention_keeps(const loom__program *p, int32_t id);
/* The scratch bytes LNORM or LNORMGRAD node t uses while it runs (at p->scratch). */
size_t loom__lnorm_scratch_bytes(const loom__pnode *t);
/* The scratch bytes ATTENTION or ATTENTIONGRAD node id uses while it runs (at p->scratch). */
size_t loom__attention_scratch_bytes(const loom__program *p, int32_t id);
int64_t loom__attention_kept_at(const loom__pnode *t);
int64_t loom__attention_kept_bytes(const loom__pnode *t);
loom_status loom__k_attention(const loom__program *p, const loom__bind *b, int32_t id);
loom_status loom__k_attention_grad(const loom__program *p, const loom__bind *b, int32_t id);
/* Address of node id's first element (which may be strided). */
void *loom__addr(const loom__program *p, const loom__bind *b, int32_t id);
void *loom__lay_addr(const loom__program *p, const loom__bind *b, const loom__layout *l,
                     size_t elem);
/* Runs every kernel of p in order; a failing kernel (e.g. a label out of range) stops the run with
 * its status and message. */
loom_status loom__interp_run(const loom__program *p, const loom__bind *b);
/* How BLAS can read a (rows x cols) matrix with these strides: false if it cannot. */
bool loom__blas_layout(int64_t rows, int64_t cols, int64_t srow, int64_t scol, bool *trans,
                       int64_t *ld);
/* gemm.c: loom's AVX-512 sgemm. A matrix dimension may be compound: index i splits into digits
 * over up to LOOM_GDIM_MAX sub-dimensions (size[0] outermost) and addresses sum digit * stride. An
 * unfold viewed as a matrix is one: rows (C,KH,KW) and columns (N,OH,OW) over the image, so a
 * convolution's product reads the image itself (no im2col buffer), and its input gradient can be
 * added straight into the image (C += A B). */
#define LOOM_GDIM_MAX 4
typedef struct {
    int n;
    int64_t size[LOOM_GDIM_MAX], stride[LOOM_GDIM_MAX];
} loom__gdim;
typedef struct {
    const float *p;
    loom__gdim row, col;
} loom__gmat;
/* The forms a product runs in (gemm.c: packed panels, the packed form on the transpose, dot
 * products along K, rows of dot products); loom__gemm_choose is the one place the form of
 * loom__sgemm_g is chosen (from shapes and layouts alone: the dot forms sum in another order),
 * loom__gemm_form_ok whether a form can run a product, loom__sgemm_form runs it in that form
 * (build/bench_gemm times each). */
typedef enum {
    LOOM_GEMM_PACKED,
    LOOM_GEMM_TRANSPOSED,
    LOOM_GEMM_DOT,
    LOOM_GEMM_DOT_ROWS,
    LOOM_GEMM_FORMS
} loom__gemm_form;
/* C (=, or += with accumulate) A B for (M x K) A and (K x N) B, C(i,j) at c + crow(i) + ccol(j);
 * scratch holds
 * loom__gemm_scratch_bytes(). Every element is summed in a fixed order. Only where
 * loom__gemm_available() (the interpreter falls back to BLAS otherwise). */
bool loom__gemm_available(void);
size_t loom__gemm_scratch_bytes(void);
/* The scratch past loom__gemm_scratch_bytes() (64-byte aligned): where a caller keeps blocks of
 * a product (loom__product_scratch_bytes counts them). */
static inline float *loom__gemm_room(void *scratch) {
    return (float *)(((uintptr_t)scratch + loom__gemm_scratch_bytes() + 63) & ~(uintptr_t)63);
}
void loom__sgemm_g(int64_t M, int64_t N, int64_t K, const loom__gmat *a, const loom__gmat *b,
                   float *c, loom__gdim crow, loom__gdim ccol, bool accumulate, void *scratch);
bool loom__gemm_form_ok(loom__gemm_form f, int64_t M, int64_t N, int64_t K, const loom__gmat *a,
                        const loom__gmat *b);
loom__gemm_form loom__gemm_choose(int64_t M, int64_t N, int64_t K, const loom__gmat *a,
                                  const loom__gmat *b);
void loom__sgemm_form(loom__gemm_form f, int64_t M, int64_t N, int64_t K, const loom__gmat *a,
                      const loom__gmat *b, float *c, loom__gdim crow, loom__gdim ccol,
                      bool accumulate, void *scratch);
/* The product in column blocks: columns [jc, jc + nc) of C are written at c + crow(i) + j - jc
 * (a buffer of M x LOOM_GEMM_NC at most) and then handed to done(ctx, jc, nc). Row-major A, B of
 * any strides; not for products narrower than 16 columns. */
#define LOOM_GEMM_NC 288
void loom__sgemm_blocks(int64_t M, int64_t N, int64_t K, const loom__gmat *a, const loom__gmat *b,
                        float *c, int64_t ldc, void (*done)(void *ctx, int64_t jc, int64_t nc),
                        void *ctx, void *scratch);
/* A product's epilogue done in registers as C's final values are stored: the bias (a row of N,
 * added: C + bias, or NULL) or the addend (an M x N matrix, rows ldm apart: C + addend, or NULL)
 * and then the ReLU (a <= 0 ? 0 : a); or, with a mask (an M x N matrix, rows ldm apart),
 * where(mask > 0, C, 0) (a ReLU's backward). The same operations as the generated ADD, RELU,
 * CMPGT and WHERE, so the same bits (the ACT form). */
typedef struct {
    const float *bias;
    bool relu;
    const float *mask;
    int64_t ldm;
    float *colsum; /* or NULL: C's final columns summed down its rows, in row order from 0 (a
                    * bias gradient, as the SUM over axis 0 adds them), into N floats */
    const float *addend;
} loom__gemm_act;
void loom__sgemm_act(int64_t M, int64_t N, int64_t K, const loom__gmat *a, const loom__gmat *b,
                     float *c, int64_t ldc, const loom__gemm_act *act, void *scratch);
/* A product split across a device's cores (product.c): blocks of `block` rows (*rows) or columns
 * of C, the last one shorter or not, each computed alone as the whole is (the same path through
 * gemm.c: the same bits), via loom__sgemm_g, loom__sgemm_act (colsum: with a column sum, which
 * rows would reorder) or loom__sgemm_blocks (columns only); 0 where it cannot be split so, into
 * `parts` blocks of at least 64 and a multiple of 16. loom__gemm_part narrows a product's M or N,
 * A's rows or B's columns and C's places (c, unless NULL) to rows (columns) [at, at + len). */
typedef enum { LOOM_GEMM_VIA_G, LOOM_GEMM_VIA_ACT, LOOM_GEMM_VIA_BLOCKS } loom__gemm_via;
int64_t loom__gemm_split(int64_t M, int64_t N, int64_t K, const loom__gmat *a, const loom__gmat *b,
                         loom__gdim crow, loom__gdim ccol, bool accumulate, loom__gemm_via via,
                         bool colsum, int parts, bool *rows);
void loom__gemm_part(bool rows, int64_t at, int64_t len, int64_t *M, int64_t *N, loom__gmat *a,
                     loom__gmat *b, float **c, loom__gdim *crow, loom__gdim *ccol);
/* The plain case: A(i,k) = a[i*ars + k*acs], B(k,j) = b[k*brs + j*bcs], C row-major (ldc). */
void loom__sgemm(int64_t M, int64_t N, int64_t K, const float *a, int64_t ars, int64_t acs,
                 const float *b, int64_t brs, int64_t bcs, float *c, int64_t ldc, void *scratch);
/* Offsets of indices from, from + 1, ... (count of them) of compound dimension d (runs along
 * its innermost sub-dimension, then a carry): gemm_pack.c, on x86-64 (gemm.c's and gemm256.c's
 * packs). */
void loom__gd_offsets(const loom__gdim *d, int64_t from, int64_t count, int64_t *out);
/* Rows and columns of a product's operand (the last two dims), compound for a grouped view. */
static inline void loom__operand_dims(const loom__pnode *s, loom__gdim *row, loom__gdim *col) {
    int nd = s->ndim;
    if (!s->gndim) {
        *row = (loom__gdim){.n = 1, .size = {s->shape[nd - 2]}, .stride = {s->lay.stride[nd - 2]}};
        *col = (loom__gdim){.n = 1, .size = {s->shape[nd - 1]}, .stride = {s->lay.stride[nd - 1]}};
        return;
    }
    loom__gdim g[2] = {{0}, {0}};
    for (int d = 0; d < s->gndim; d++) {
        loom__gdim *x = &g[d >= s->gsplit];
        x->size[x->n] = s->gshape[d];
        x->stride[x->n++] = s->lay.stride[d];
    }
    *row = g[s->gtrans], *col = g[!s->gtrans];
}

/* A product on the dot-product path (small C, long K) a few rows of A at a time: B's chunks built
 * once (loom__dot_rows_bytes(K) of buf, which must outlive the rows), then rows of C from rows of
 * A, each contiguous: the same sums in the same order as loom__sgemm_g gives the product, so the
 * same bits. For M x N x K products with loom__dot_rows_ok. */
#define LOOM_DOT_MAX_N 64
typedef struct {
    int64_t N, nblocks;
    const void *chunks;
    const int64_t *bend;
    const float *bc[LOOM_DOT_MAX_N];
} loom__dot_rows;
bool loom__dot_rows_ok(int64_t M, int64_t N, int64_t K, const loom__gmat *a, const loom__gmat *b);
size_t loom__dot_rows_bytes(int64_t K);
void loom__dot_rows_begin(loom__dot_rows *s, const loom__gmat *b, int64_t N, int64_t K, void *buf);
/* C(i, 0 .. N) for `rows` rows of A (lda apart), to c (N apart) */
void loom__dot_rows_run(const loom__dot_rows *s, const float *a, int64_t lda, int64_t rows,
                        float *c);

/* A product whose columns fall in planes of P (a convolution's output planes: the columns'
 * outermost sub-dimension, or runs of P of a plain B) computed a row and a plane at a time
 * straight from B (a small K: a first convolution's few taps), so that a consumer (max pooling)
 * takes each plane while it is in L1 and the output is never written whole. Each element is the sum
 * loom__sgemm_g forms (k ascending from zero in one k block), so the same bits.
 * loom__conv_planes_bytes(P) of buf must outlive the planes. */
#define LOOM_CONV_MAX_K 32
typedef struct {
    const float *a, *b;
    int64_t ars, acs, bps; /* A(i, k) at a + i ars + k acs; plane q of B's columns at b + q bps */
    int64_t K, nslot;      /* slots: 16 columns or fewer contiguous in B, padded to groups of 4 */
    int64_t koff[LOOM_CONV_MAX_K];
    int32_t *off, *at; /* per slot: its first column in B (plane 0) and in the plane */
    uint16_t *mask;
} loom__conv_planes;
bool loom__conv_planes_ok(int64_t M, int64_t N, int64_t K, const loom__gmat *a, const loom__gmat *b,
                          int64_t P);
size_t loom__conv_planes_bytes(int64_t P);
void loom__conv_planes_begin(loom__conv_planes *s, const loom__gmat *a, const loom__gmat *b,
                             int64_t K, int64_t P, void *buf);
/* Plane q of rows i .. i + rows - 1 (rows <= LOOM_CONV_ROWS) of the product, P values each, to
 * out, pitch apart. */
#define LOOM_CONV_ROWS 4
void loom__conv_planes_run(const loom__conv_planes *s, int64_t i, int rows, int64_t q, float *out,
                           int64_t pitch);

/* A convolution's backward from its output gradient R (K x N: a row per output channel, a
 * column per output position) that rows(ctx, j0, n, r, ld) makes a run of columns at a time
 * (R(k, j0 + j) at r[k ld + j]; a pool gradient, from its codes) and that is never written
 * whole: each run goes, while in cache, into the input gradient's product (a fold's: C += A R,
 * A M x K, C compound) and the weight gradient (W = R B, K x WN row-major, B an unfold). Runs
 * ascend and may overlap (columns made again); pad floats on either side of each row are rows'
 * to write. The same sums in the same order as loom__sgemm_g's two products, so the same bits.
 * Where loom__conv_back_ok; buf of loom__conv_back_bytes() and the product scratch. */
typedef void (*loom__rows_fn)(void *ctx, int64_t j0, int64_t n, float *r, int64_t ld);
bool loom__conv_back_ok(int64_t M, int64_t N, int64_t K, const loom__gmat *a, int64_t WN,
                        const loom__gmat *b);
size_t loom__conv_back_bytes(int64_t N, int64_t K, int64_t WN, int64_t pad);
void loom__conv_back(int64_t M, int64_t N, int64_t K, const loom__gmat *a, loom__gdim crow,
                     loom__gdim ccol, float *c, int64_t WN, const loom__gmat *b, float *w,
                     int64_t ldw, loom__rows_fn rows, void *ctx, int64_t pad, void *buf,
                     void *scratch);

/* The columns of a product that loom__sgemm_g runs by its transpose (loom__gemm_t_ok: a
 * convolution's forward, B an unfold) at B's column offsets coff[0 .. n), in that order: C's
 * columns to c (M rows, ldc apart), each the same sums in the same order as the whole product's.
 * packed: A^T's panels are still in the scratch from the previous call. */
bool loom__gemm_t_ok(int64_t M, int64_t N, int64_t K, const loom__gmat *a, const loom__gmat *b);
void loom__gemm_t_cols(int64_t M, int64_t K, const loom__gmat *a, const loom__gmat *b,
                       const int64_t *coff, int64_t n, float *c, int64_t ldc, bool packed,
                       void *scratch);

/* Whether float32 products use loom__sgemm (and attention.c its AVX-512 tiles): on a CPU with
 * AVX-512 unless LOOM_MATMUL=blas (BLAS then, and always for float64 and on other CPUs; attention's
 * plain loops). The one place this choice is made. */
bool loom__use_own_gemm(void);
/* gemm256.c: C = A B (float32, row-major, each operand read as stored or transposed as
 * cblas_sgemm takes them) on CPUs with AVX2 and FMA; scratch holds loom__gemm256_scratch_bytes().
 * Each element is summed in an order that depends on K alone. loom__use_gemm256: whether the
 * products BLAS would run go there instead (no AVX-512 sgemm, and not LOOM_MATMUL=blas). */
bool loom__gemm256_available(void);
/* The 8 x 8 block at x (rows ldx apart) transposed into y (rows ldy apart), through registers
 * (AVX2 CPUs only: where loom__gemm256_available). */
void loom__transpose8x8(const float *x, int64_t ldx, float *y, int64_t ldy);
size_t loom__gemm256_scratch_bytes(void);
void loom__sgemm256(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float *a, int64_t lda,
                    const float *b, int64_t ldb, float *c, int64_t ldc, void *scratch);
/* Columns [j0, j0 + N) of C = A B where B is a compound view (an unfold read as a matrix, or its
 * transpose), c at C's column j0, read where it lies: the same packed panels and sums, so the
 * same bits, as loom__sgemm256 over B copied out. The scratch holds
 * loom__gemm256_scratch_bytes() + loom__gemm256_view_bytes(). */
size_t loom__gemm256_view_bytes(void);
void loom__sgemm256_view(bool ta, int64_t M, int64_t N, int64_t K, const float *a, int64_t lda,
                         const loom__gmat *b, int64_t j0, float *c, int64_t ldc, void *scratch);
/* Columns [j0, j0 + N) of C = A B a block of columns at a time (nc, at most LOOM_GEMM256_NC),
 * each written at c (rows as many apart as the block has columns) and then handed to
 * done(ctx, jc, nc) (jc from j0): A plain, B plain or a compound view that loom__sgemm256_view
 * gathers by its columns (loom__gemm256_blocks_ok). The same sums as loom__sgemm256. Same scratch
 * as loom__sgemm256_view. */
#define LOOM_GEMM256_NC 1024
bool loom__gemm256_blocks_ok(const loom__gmat *a, const loom__gmat *b, int64_t nc);
/* The scratch past loom__sgemm256_view's (64-byte aligned): where a caller of
 * loom__sgemm256_blocks keeps its blocks (loom__product_scratch_bytes counts it). */
float *loom__gemm256_room(void *scratch);
void loom__sgemm256_blocks(int64_t M, int64_t N, int64_t K, const loom__gmat *a,
                           const loom__gmat *b, int64_t j0, float *c, int64_t nc,
                           void (*done)(void *ctx, int64_t jc, int64_t nc), void *ctx,
                           void *scratch);
bool loom__use_gemm256(void);
/* The columns of each row that a product with an epilogue holds in its own buffer: a block's,
 * LOOM_GEMM_NC, with loom's AVX-512 sgemm; none on AVX2, where each core makes its blocks in its
 * scratch. */
int64_t loom__epilogue_buffer_cols(void);
/* product.c: whether product id can run by loom__sgemm256_blocks in blocks of nc columns (AVX2,
 * float32, its operands as loom__gemm256_blocks_ok takes them); the scratch product id's kernel
 * takes: loom's sgemm's, or on AVX2 gemm256's, with the view's offsets where it reads a view or
 * makes blocks, and the room its blocks take (an epilogue's, a fused fold's). */
bool loom__product_blocks_ok(const loom__program *p, int32_t id, int64_t nc);
size_t loom__product_scratch_bytes(const loom__program *p, int32_t id);
/* window.c: whether a fold (unpadded) can compute its product on AVX2 (a block of
 * whole images at a time by loom__sgemm256_blocks, folded from the scratch), and the scratch that
 * takes beyond the product's. */
bool loom__fold_blocks_ok(const loom__program *p, int32_t fold, int32_t product);
size_t loom__fold_blocks_bytes(const loom__program *p, int32_t fold, int32_t product);
/* The kernels that forms run as their node's whole kernel (loom__form.run): pool_conv.c's max
 * pooling computing its convolution (CONV), pool_back.c's fold computing its convolution's
 * backward from a pool gradient (BACK), pool_quad.c's pool gradient whose sinks take its windows
 * (QUAD). */
loom_status loom__pool_conv(const loom__program *p, const loom__bind *b, int32_t id);
loom_status loom__fold_back(const loom__program *p, const loom__bind *b, int32_t id);
loom_status loom__pool_quad(const loom__program *p, const loom__bind *b, int32_t id);
/* window.c: whether fold t, computing its product, can write its planes cropped, in (C,N) order
 * and masked (fold-crop: its AVX-512 rows at column stride 2) */
bool loom__fold_crop_ok(const loom__pnode *t);
/* Rows a pool gradient with sinks keeps at a time (its SINKS form): the product's sink runs
 * on that many rows at once, sharing each load of B (three rows of a wide image and the image fit
 * a 2 MB L2; gemm.c's dot-product tiles take up to three rows of nine columns). */
#define LOOM_SINK_ROWS 3
/* Whether pool gradient t's own buffer holds one plane of its values at a time (they go into
 * its epilogue, or into the rows its sinks alone read), not all of them. */
static inline bool loom__pool_by_plane(const loom__program *p, int32_t id) {
    return p->nodes[id].epi >= 0 || loom__rows_streamed(p, id);
}
/* The 2x2, stride-2, unpadded window over unit-stride rows: max pooling's own row kernels (their
 * codes 0-3, bit 2 the ReLU's mask; other windows' are places i kw + j, bit 7 the mask). */
static inline bool loom__pool2x2(const loom_window *w, int64_t row_stride) {
    return w->kh == 2 && w->kw == 2 && w->sh == 2 && w->sw == 2 && w->ph == 0 && w->pw == 0 &&
           row_stride == 1;
}
/* Whether pool gradient id's sinks can take its windows (its QUAD form; its sinks, codes and
 * ReLU's backward decided; a product sink: a 3 x 3 or 5 x 5 convolution's weight gradient), and the
 * scratch it then needs. */
bool loom__pool_quad_ok(const loom__program *p, int32_t id);
size_t loom__pool_quad_bytes(const loom__program *p, int32_t id);
/* The scratch of max pooling f computing its convolution (its CONV form); whether it can
 * compute one that runs by its transpose (more channels than taps) window by window. */
size_t loom__pool_conv_bytes(const loom__program *p, int32_t f);
bool loom__pool_conv_t_ok(const loom__program *p, int32_t f);
/* The scratch of fold f computing its convolution's backward (its BACK form). */
size_t loom__fold_back_bytes(const loom__program *p, int32_t f);
/* Whether the 2x2 max pooling's own row kernels can keep argmax codes, take a ReLU and read the
 * codes in its gradient (backend/interp.c; the CODES and RELU forms). */
bool loom__pool_codes_available(void);
/* Whether max pooling over window w (input rows row_stride apart) of dtype dt can keep argmax
 * codes (a byte a window: its maximum's place in the window, i kw + j) that its gradient reads
 * instead of its input: any window of up to 256 places, any dtype (the 2x2 rows keep them on
 * the AVX-512 path, the general loops elsewhere). */
bool loom__pool_codes_ok(const loom_window *w, int64_t row_stride, loom_dtype dt);
/* Whether a float max pooling over window w can write the ReLU of its maxima (its RELU form)
 * and mark in its codes where it passes: the 2x2 rows where available (bit 2), any window of up
 * to 128 places (bit 7). */
bool loom__pool_relu_ok(const loom_window *w, int64_t row_stride);
/* Where POOLMAX m keeps its argmax codes: after its values, or first when it writes a ReLU. */
static inline uint8_t *loom__pool_codes(const loom__program *p, const loom__bind *b, int32_t m) {
    const loom__pnode *t = &p->nodes[m];
    return (uint8_t *)loom__addr(p, b, m) +
           (loom__pool_relu_of(p, m) >= 0
                ? 0
                : loom__numel(t->ndim, t->shape) * (int64_t)loom__dtype_size((loom_dtype)t->dtype));
}

/* One-time BLAS setup (one thread per device). Thread-safe. */
void loom__blas_init(void);
const char *loom__blas_name(void);

#endif
