/*
 * compile/internal.h - the compiler's stages shared between its files: fusion of elementwise ops
 * into kernels (fuse.c), C code generation for them (codegen.c), and the system compiler with its
 * disk cache (cc.c). Never installed.
 */
#ifndef LOOM_COMPILE_INTERNAL_H
#define LOOM_COMPILE_INTERNAL_H

#include "../backend/internal.h"

#include <stdio.h>

/* memplan.c, in this order: layouts of live nodes; stores computed in their slab place; workspace
 * offsets (with keep_all, no buffer reused: every value stays to the step's end) and the exec
 * list (last: scratch of p->n entries). */
void loom__assign_layouts(loom__program *p, const bool *live, const bool *is_out);
void loom__store_in_place(loom__program *p, const bool *live, const bool *is_out);
loom_status loom__place_buffers(loom__program *p, const bool *live, const bool *is_out,
                                bool keep_all, int64_t *last);
/* Whether layout l (of a node of shape nd, shape) touches elements [lo, hi) of slab `slab`; whether
 * node c reads them, or writes them as a store or a sync (not as a kernel's own output). */
bool loom__slab_touches(const loom__layout *l, int nd, const int64_t *shape, int32_t slab,
                        int64_t lo, int64_t hi);
bool loom__slab_accesses(const loom__program *p, const loom__pnode *c, int32_t slab, int64_t lo,
                         int64_t hi);

/* What the fusion rules see of a program being planned: its live nodes, the step's outputs, and
 * how many live nodes read each node (reading one twice counts twice; counted once, since no rule
 * changes a node's sources or liveness). */
typedef struct {
    const bool *live, *is_out;
    const int32_t *readers;
} loom__fuse_in;

/* A fusion rule (compile/fuse.c's table, loom__rules): the op pattern it matches, the condition
 * under which it may apply (shapes, strides, liveness, and which rules it follows), the kernel
 * form it produces and what it records of it (loom__form records, whose functions, forms[], the
 * planner asks; or the generic links fused_into, made_by, epi). The planner applies the table in
 * order: the rules that make generated kernels (`generated`) before the executor builds them and
 * only with a compiler, the others after; of either kind only those the program's executor runs
 * (loom__executor.forms). apply returns how many ops it fused, -1 out of memory. Adding a
 * fusion is adding a rule here and its case in tests/test_compile.c, which fails for a rule
 * without one. */
typedef struct loom__form_ops loom__form_ops;
typedef struct {
    const char *name, *matches, *when, *makes, *records;
    bool generated;
    int64_t (*apply)(loom__program *p, const loom__fuse_in *in);
    const loom__form_ops *forms[2]; /* the kinds of record it makes (NULL: none, or no second) */
} loom__rule;

/* memplan.c's placement of workspace buffers, as the forms see it: place(pl, bytes, owner)
 * returns where a buffer of that many bytes starts, alive as long as node owner's; place_node
 * places node id's own values (its ws_off) where they are in the workspace. */
typedef struct loom__placer loom__placer;
int64_t loom__place(loom__placer *pl, int64_t bytes, int32_t owner);
void loom__place_node(loom__placer *pl, loom__program *p, int32_t id);

/* What a kind of form (loom__form) tells the planner, the printer and the check, each function
 * asked in the order of the kinds, NULL where the form changes nothing. The executors run a form
 * by looking its record up in the kernel family it belongs to (backend/). */
struct loom__form_ops {
    loom__form_kind kind;
    /* the bytes of its node's own buffer, given what they are without it */
    int64_t (*own_bytes)(const loom__program *p, const loom__form *x, int64_t bytes);
    /* the buffers it writes besides its node's, placed just after it */
    void (*place)(loom__program *p, const loom__form *x, loom__placer *pl);
    /* its part of the node's line in LOOM_DUMP's schedule */
    void (*describe)(FILE *f, const loom__program *p, const loom__form *x);
    /* the values it leaves whole once its node has run, appended at out[n]; the new count */
    int (*values)(const loom__program *p, const loom__form *x, loom__value *out, int n);
    /* the backend's kernel its node runs instead of its op's (a form that makes the node's whole
     * kernel: pool-conv's, conv-back's, pool-quad's); NULL: the op's kernel reads the record */
    loom__kernel_fn run;
};
/* Node id's values where they are, computed by the op's own arithmetic (loom__value.exact). */
static inline loom__value loom__value_of(const loom__program *p, int32_t id) {
    return (loom__value){.id = id, .exact = true, .lay = p->nodes[id].lay};
}
/* form.c: a new form of kind k on node id, last in its list (its union zeroed); NULL out of
 * memory. Taken off again by loom__form_drop (a rule that takes over another's). */
loom__form *loom__form_add(loom__program *p, int32_t id, loom__form_kind k);
void loom__form_drop(loom__program *p, int32_t id, loom__form_kind k);
/* For a form whose node writes another node's buffer, never its own (into): no bytes of its own
 * (own_bytes), and into's values in place of the node's (values' body). */
int64_t loom__form_no_buffer(const loom__program *p, const loom__form *x, int64_t bytes);
int loom__form_values_into(const loom__program *p, const loom__form *x, int32_t into,
                           loom__value *out, int n);
/* The functions of kind k (from the rule that makes it). */
const loom__form_ops *loom__form_ops_of(loom__form_kind k);
/* Node id's forms asked in kind order: its own buffer's bytes, its other buffers, the node its
 * kernel reads as operand k (a form's reads, else that source), its line's parts. */
int64_t loom__forms_own_bytes(const loom__program *p, int32_t id, int64_t bytes);
void loom__forms_place(loom__program *p, int32_t id, loom__placer *pl);
int32_t loom__forms_source(const loom__program *p, int32_t id, int k);
void loom__forms_describe(FILE *f, const loom__program *p, int32_t id);
/* The values exec entry e of p leaves whole in memory once it has run (its node's, an epilogue's
 * root, members stored, and its forms'), into out (LOOM_ENTRY_VALUES_MAX); returns how many. */
int loom__entry_values(const loom__program *p, int64_t e, loom__value *out);
extern const loom__rule loom__rules[];
extern const int loom__nrules;
/* How many ops each rule has fused in every program planned so far (atomic; for tests). */
extern int64_t loom__rule_fired[LOOM_RULES_MAX];
/* Applies the table's rules of the one kind (generated or not) that p's executor runs
 * (loom__executor_runs) to p in order, adding each one's count into p->rule_hits. Returns the ops
 * fused, -1 out of memory. */
int64_t loom__apply_rules(loom__program *p, const loom__fuse_in *in, bool generated);
/* How many live nodes read each node (loom__fuse_in.readers); NULL out of memory. loom__free()
 * it. */
int32_t *loom__count_readers(const loom__program *p, const bool *live);
/* Undoes the generated rules (when no compiler can build the kernels). */
void loom__unfuse(loom__program *p);

/* Whether strides st lay out shape row-major without gaps (dims of size 1 free). */
static inline bool loom__contiguous(int nd, const int64_t *shape, const int64_t *st) {
    int64_t s = 1;
    for (int d = nd - 1; d >= 0; d--) {
        if (shape[d] != 1 && st[d] != s)
            return false;
        s *= shape[d];
    }
    return true;
}
/* Whether node i is the root of a generated kernel run as a library kernel's epilogue. */
static inline bool loom__epilogue_root(const loom__program *p, int64_t i) {
    return p->fused_of && p->fused_of[i] >= 0 && p->fused[p->fused_of[i]].epi_of >= 0;
}

/* cpu.c: the CPU executor (C rendered by codegen.c, built by cc.c, run with backend/'s kernels),
 * and the choice of executor. */
extern const loom__executor loom__cpu_executor;
/* Whether executor x runs the kernel form of fusion rule `rule` (x or its forms NULL: yes). */
bool loom__executor_runs(const loom__executor *x, const char *rule);
/* The executor of graphs planned from now on (NULL: loom__cpu_executor, or loom__check_executor
 * under LOOM_CHECK=1); not thread-safe. */
void loom__set_executor(const loom__executor *x);
const loom__executor *loom__executor_default(void);

/* memplan.c: whether p can run on devices that share the PARAM and STATE slabs (p->share, p->own):
 * every entry writing into them writes nothing else and reads them only where it writes (so that
 * one device can run it for all), no two write the same element, and a collective (SYNC: every
 * device is past it only once all have reached it) lies between the last entry reading them
 * otherwise and the first writing them. After the exec list. */
loom_status loom__plan_owners(loom__program *p, const bool *live);
/* For n devices sharing the slabs: owner[e] (of p->nexec) the device that runs owned entry e, -1
 * for the entries every device runs. The largest first, each onto the least loaded device (the
 * lowest on ties). Returns how many entries are owned, -1 out of memory. */
int64_t loom__owners(const loom__program *p, int n, int32_t *owner);

/* program.c: the planner of every program (loom__program.planner, whose functions these are): a
 * twin of p planned from its nodes with nothing fused, run by executor x (loom__planner), and a
 * program's end. */
extern const loom__planner loom__the_planner;
loom__program *loom__program_reference(const loom__program *p, const loom__executor *x);
void loom__program_free(loom__program *p);

/* The C source of p's fused kernels (functions loom_k<root>), with `key` written into it; owned by
 * the caller (loom__free). NULL out of memory. */
char *loom__codegen(const loom__program *p, uint64_t *key);
/* The extent of the range kernel k's function takes (loom__kfn: its outermost loop, 1 where it
 * runs whole) and in *work its elements' operations (the root's elements, times the reduced
 * length under a reduction). */
int64_t loom__kernel_extent(const loom__program *p, const loom__fused *k, double *work);

/* Builds source `src` (identified by key) into a shared object, or finds it in the disk cache,
 * and loads it. *compiled says whether the compiler ran. A missing compiler or a failed build is
 * reported once through the log and returns EUNSUPPORTED (the caller interprets). */
loom_status loom__cc_load(const char *src, uint64_t key, void **dl, bool *compiled);
/* Identity of the compiler and flags (part of every key); NULL when there is no compiler. */
const char *loom__cc_identity(void);
/* Whether the kernel cache entry at path is whole (a regular file whose trailer matches its
 * bytes): what is checked before dlopen. */
bool loom__cc_entry_intact(const char *path);

/* program.c, for dist/ above it (the graph reaches it only through loom_graph.run_hooks): the
 * program of g's last step that ran (NULL before). */
const loom__program *loom__graph_last(const loom_graph *g);
/* One kernel of the schedule (LOOM_DUMP, LOOM_PROFILE): its node, op, shape, whether it is
 * generated (with the nodes it fuses) or interpreted (with its forms; in float64, the float32
 * kernels it goes without), and a newline. */
void loom__kernel_line(FILE *f, const loom__program *p, int32_t id);
/* The buffers g's step reads its caller-supplied inputs from, by input ordinal, into src. With
 * `copy` (a step that runs on after submit returns), every input but a borrowed one is copied
 * into `a` now (a batch input: the whole global batch), so that the step reads its inputs' values
 * at submit whatever the host does meanwhile; without, the caller's buffers. */
loom_status loom__input_sources(const loom_graph *g, loom__arena *a, bool copy, const void **src);
/* Input pointers for device d of ndev, from the sources above (padded shards, masks and counts
 * built in the arena). */
loom_status loom__bind_inputs(const loom_graph *g, loom__arena *a, int d, int ndev,
                              const void *const *src, const void **inputs);
/* Ends g's submitted step, if any (loom_graph_wait without the loss); devices call it to end
 * another graph's step before starting one. */
loom_status loom__graph_finish(loom_graph *g);
/* Copies the outputs of g's last step off its devices into g's arena, where they are read until
 * g's next step or reset: another graph's step is about to use the devices' memory. If out of
 * memory, the outputs become unreadable (loom_tensor_data NULL), never stale. */
void loom__graph_keep(loom_graph *g);
/* Local device d's copy of node id of program p after its step (the graph's own without
 * devices), and the mean of its first element over every device of every process (a loss:
 * normalised so that this is global; across processes a collective). */
const void *loom__node_data(const loom_graph *g, const loom__program *p, int32_t id, int d);
double loom__node_mean(const loom_graph *g, const loom__program *p, int32_t id, loom_dtype dt);

#endif
