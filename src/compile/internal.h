/*
 * compile/internal.h - the compiler's stages shared between its files: fusion of elementwise ops
 * into kernels (fuse.c), C code generation for them (codegen.c), and the system compiler with its
 * disk cache (cc.c). Never installed.
 */
#ifndef LOOM_COMPILE_INTERNAL_H
#define LOOM_COMPILE_INTERNAL_H

#include "../backend/internal.h"

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
 * form it produces and the program-node fields through which that form is run (backend/interp.c
 * reads them; compile/memplan.c sizes their buffers). The planner applies the table in order: the
 * rules that make generated kernels (`generated`) before the executor builds them and only with a
 * compiler, the others after; of either kind only those the program's executor runs
 * (loom__executor.forms). apply returns how many ops it fused, -1 out of memory. Adding a
 * fusion is adding a rule here and its case in tests/test_compile.c, which fails for a rule
 * without one. */
typedef struct {
    const char *name, *matches, *when, *makes, *fields;
    bool generated;
    int64_t (*apply)(loom__program *p, const loom__fuse_in *in);
} loom__rule;
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

/* The C source of p's fused kernels (functions loom_k<root>), with `key` written into it; owned by
 * the caller (loom__free). NULL out of memory. */
char *loom__codegen(const loom__program *p, uint64_t *key);

/* Builds source `src` (identified by key) into a shared object, or finds it in the disk cache,
 * and loads it. *compiled says whether the compiler ran. A missing compiler or a failed build is
 * reported once through the log and returns EUNSUPPORTED (the caller interprets). */
loom_status loom__cc_load(const char *src, uint64_t key, void **dl, bool *compiled);
/* Identity of the compiler and flags (part of every key); NULL when there is no compiler. */
const char *loom__cc_identity(void);
/* Whether the kernel cache entry at path is whole (a regular file whose trailer matches its
 * bytes): what is checked before dlopen. */
bool loom__cc_entry_intact(const char *path);

#endif
