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

/* Marks elementwise nodes computed inside their single consumer's kernel (pnode.fused_into, -1
 * for none) and fills p->fused (one entry per kernel root, its leaves as arguments). Returns the
 * number of ops fused away, -1 out of memory. */
int64_t loom__fuse(loom__program *p, const bool *live, const bool *is_out);
/* How many live nodes read each node (reading one twice counts twice); NULL out of memory. The
 * passes below take it: none changes a node's sources or liveness, so it is counted once.
 * loom__free() it. */
int32_t *loom__count_readers(const loom__program *p, const bool *live);
/* Library kernels that compute their producer: a FOLD of a product's output (padding 0) runs the
 * product itself, adding into its image (the product's fused_into names the fold). Returns the
 * number fused. After loom__fuse. */
int64_t loom__fuse_products(loom__program *p, const bool *live, const bool *is_out,
                            const int32_t *readers);
/* Generated kernels that run as the epilogue of the library kernel (a product, a pool gradient)
 * whose whole output they read: loom__fused.epi_of and that node's epi. After loom__fuse, before
 * code generation. Returns how many. */
int64_t loom__fuse_epilogues(loom__program *p, const bool *live, const bool *is_out,
                             const int32_t *readers);
/* A max pooling's backward over the same input as a POOLMAX reads that POOLMAX's argmax codes
 * instead of the input (loom__pnode.codes_of); returns how many. */
int64_t loom__fuse_pool_codes(loom__program *p, const bool *live);
/* A 2x2 max pooling whose only reader is a ReLU of it writes that ReLU itself (loom__pnode.relu);
 * returns how many. */
int64_t loom__fuse_pool_relu(loom__program *p, const bool *live, const bool *is_out);
/* Sinks: a pool gradient whose rows (its epilogue's root, or a 2-D view of its output) only a sum
 * along them and a product on the dot-product path read computes those too, a row at a time
 * (loom__pnode.sinks); returns how many. */
int64_t loom__fuse_sinks(loom__program *p, const bool *live, const bool *is_out,
                         const int32_t *readers);
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
/* Max pooling computing its input product (and the product's epilogue) a plane at a time
 * (loom__pnode.conv). After the other passes. Returns the number fused. */
int64_t loom__fuse_pool_conv(loom__program *p, const bool *live, const bool *is_out,
                             const int32_t *readers);
/* A fold computing its convolution's backward from a pool gradient made a block at a time
 * (loom__pnode.back): the fold's product, the weight gradient and the bias gradient's sum. After
 * loom__fuse_pool_conv. Returns the number fused. */
int64_t loom__fuse_conv_back(loom__program *p, const bool *live, const bool *is_out,
                             const int32_t *readers);
/* Pool gradients whose sinks take their windows instead of their rows (loom__pnode.quad). Last
 * of the passes. Returns the number. */
int64_t loom__fuse_pool_quad(loom__program *p, const bool *live);
/* Products whose epilogue is a bias row and/or a ReLU do it in registers (loom__pnode.act).
 * Last of the passes. Returns how many. */
int64_t loom__fuse_product_act(loom__program *p, const bool *live);
/* Undoes loom__fuse (when no compiler can build the kernels). */
void loom__unfuse(loom__program *p);

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
