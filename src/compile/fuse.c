/*
 * fuse.c - the schedule: which nodes become one kernel. An elementwise node whose only reader is
 * an elementwise consumer of the same shape (reading it directly, not through a view) is computed
 * inside that consumer's loop and never stored; chains and trees of such nodes become one kernel
 * rooted at the node that is stored. A reduction takes in the elementwise chain it reduces (each
 * element computed in its loop, never stored) and goes into an elementwise consumer of its own
 * shape (log(sum(exp(x))) is one kernel); one reduction per kernel. Views, broadcasts and constants
 * feeding a kernel are its leaves, read through their strides. Kernel roots are elementwise nodes
 * that own a workspace buffer, or that write their slab in place. Library kernels fuse too: a fold
 * (col2im) of a product's output computes that product itself and adds each result straight into
 * the image (a convolution's input gradient without its 17.8 MB column buffer), and so on: every
 * fusion is a rule of the table at the end of this file (loom__rules: its pattern, when it
 * applies, the kernel form it makes), applied in order by loom__apply_rules.
 */
#include "forms/forms.h"

#include <math.h>

#include <string.h>

void loom__unfuse(loom__program *p) {
    for (int64_t i = 0; i < p->n; i++)
        p->nodes[i].fused_into = -1, p->nodes[i].epi = -1, p->nodes[i].made_by = -1;
    loom__free(p->fused);
    loom__free(p->fused_of);
    p->fused = NULL, p->fused_of = NULL, p->nfused = 0;
    for (int r = 0; r < loom__nrules; r++)
        if (loom__rules[r].generated)
            p->rule_hits[r] = 0;
}

int32_t loom__fuse_root_of(const loom__program *p, int64_t i) {
    while (p->nodes[i].fused_into >= 0)
        i = p->nodes[i].fused_into;
    return (int32_t)i;
}

int32_t *loom__count_readers(const loom__program *p, const bool *live) {
    int32_t *readers = loom__calloc((size_t)p->n + 1, sizeof(int32_t));
    for (int64_t i = 0; readers && i < p->n; i++)
        for (int k = 0; k < 3 && live[i]; k++)
            if (p->nodes[i].src[k] >= 0)
                readers[p->nodes[i].src[k]]++;
    return readers;
}

/* The product a fold reads through a contiguous reshape, or -1. */
int32_t loom__fuse_folded_product(const loom__program *p, const loom__pnode *f) {
    const loom__pnode *v = &p->nodes[f->src[0]];
    if (v->op != LOOM_OP_RESHAPE || v->copy || v->lay.base != LOOM_BASE_WS || v->lay.offset != 0)
        return -1;
    const loom__pnode *m = &p->nodes[v->src[0]];
    return m->op == LOOM_OP_MATMUL && m->ndim == 2 && v->lay.index == v->src[0] ? v->src[0] : -1;
}

/* The live readers of node v, the last of them into *only. */
int32_t loom__fuse_readers_of(const loom__program *p, const bool *live, int32_t v, int32_t *only) {
    int32_t n = 0;
    for (int32_t c = v + 1; c < p->n; c++)
        for (int q = 0; q < 3 && live[c]; q++)
            if (p->nodes[c].src[q] == v)
                n++, *only = c;
    return n;
}

/* Whether node id is the constant +0 (through views). */
bool loom__fuse_is_zero(const loom__program *p, int32_t id) {
    while (id >= 0 && loom__is_view(&p->nodes[id]))
        id = p->nodes[id].src[0];
    return id >= 0 && p->nodes[id].op == LOOM_OP_CONST && p->nodes[id].attr.value == 0 &&
           !signbit(p->nodes[id].attr.value);
}

/* The node whose workspace buffer holds view or node id's data, or -1. */
int32_t loom__fuse_owner(const loom__program *p, int32_t id) {
    const loom__layout *l = &p->nodes[id].lay;
    return l->base == LOOM_BASE_WS ? l->index : -1;
}

/* Whether a node in (lo, hi), other than skip[0 .. nskip), writes a persistent slab (a store, a
 * sync, or a kernel computing into its slab place) or, with `reads`, reads one. */
bool loom__fuse_slab_touched_between(const loom__program *p, const bool *live, int64_t lo,
                                     int64_t hi, bool reads, const int32_t *skip, int nskip) {
    for (int64_t c = lo + 1; c < hi; c++) {
        const loom__pnode *t = &p->nodes[c];
        bool skipped = false;
        for (int q = 0; q < nskip; q++)
            skipped = skipped || skip[q] == c;
        if (!live[c] || skipped)
            continue;
        if ((t->op == LOOM_OP_STORE && !t->elided) || t->op == LOOM_OP_SYNC)
            return true;
        if (!loom__runs_kernel(t))
            continue;
        if (t->lay.base == LOOM_BASE_PERSIST)
            return true;
        if (reads && t->copy && t->src_lay.base == LOOM_BASE_PERSIST)
            return true;
        for (int k = 0; k < 3 && reads; k++)
            if (t->src[k] >= 0 && p->nodes[t->src[k]].lay.base == LOOM_BASE_PERSIST)
                return true;
    }
    return false;
}

/* Whether node s can take root r a row at a time: a sum along its rows (on the lanes path) or a
 * product r B on the dot-product path, its output contiguous, B ready before library node L. */
bool loom__fuse_sinkable(const loom__program *p, int32_t s, int32_t r, int32_t L) {
    const loom__pnode *t = &p->nodes[s], *root = &p->nodes[r];
    int64_t rows = root->shape[0], cols = root->shape[1];
    if (t->dtype != LOOM_F32 || t->check || t->copy || t->src[0] != r ||
        !((t->lay.base == LOOM_BASE_WS && t->lay.index == s) || t->lay.base == LOOM_BASE_PERSIST))
        return false;
    if (t->op == LOOM_OP_SUM) /* (rows, 1) or (rows): one value a row */
        return t->attr.axis == 1 && cols >= 64 && loom__numel(t->ndim, t->shape) == rows &&
               (rows == 1 || t->lay.stride[0] == 1);
    if (t->op != LOOM_OP_MATMUL || t->ndim != 2 || t->lay.stride[0] != t->shape[1] ||
        t->lay.stride[1] != 1)
        return false;
    const loom__pnode *b = &p->nodes[t->src[1]];
    int32_t bo = b->lay.base == LOOM_BASE_WS ? b->lay.index : -1;
    if (bo >= L || b->dtype != LOOM_F32)
        return false;
    loom__gmat ga = {NULL, {1, {rows}, {cols}}, {1, {cols}, {1}}}, gb = {NULL, {0}, {0}};
    loom__operand_dims(b, &gb.row, &gb.col);
    return loom__dot_rows_ok(rows, t->shape[1], cols, &ga, &gb);
}

/* The rules, in the order the planner applies them (each may rely on those above it). */
const loom__rule loom__rules[] = {
    {"elementwise",
     "elementwise ops (and at most one reduction) feeding each other",
     "a value read by one consumer of its shape (or by every reader inside one kernel), not an "
     "output, in the workspace or its slab place; a kernel's leaves at most 16, in-place writes "
     "read only where written",
     "a generated kernel (p->fused) rooted at the value stored; members stored into their slabs",
     "fused_into, fused_of",
     true,
     loom__rule_elementwise,
     {NULL}},
    {"epilogue",
     "a generated kernel reading the whole output of a product or a pool gradient",
     "float, a 2-D root, no reduction or stored member, the output contiguous and read by that "
     "kernel alone, every other leaf ready before the library kernel, no slab it reads written "
     "in between",
     "the kernel's part() run on each block of the library kernel's output while in cache",
     "epi, loom__fused.epi_of",
     true,
     loom__rule_epilogue,
     {NULL}},
    {"fold-product",
     "FOLD (col2im) of a product's output through a contiguous reshape",
     "float, no padding, loom's own products (AVX-512: stride 1, or strided with B's columns "
     "by images and the packed form; AVX2: A plain, an image's columns in a block), the product "
     "and its reshape read by the fold alone",
     "the product adding each result straight into the image (AVX-512, stride 1), or made a "
     "block of whole images at a time and folded from the cache (AVX2, and AVX-512 strided; the "
     "fold's bits): no column buffer",
     "fused_into",
     false,
     loom__rule_fold_product,
     {NULL}},
    {"pool-sinks",
     "a pool gradient whose 2-D rows only a sum along them and a dot-path product read",
     "after epilogue; its rows (its epilogue's root or a 2-D view of it) read by nothing else, "
     "or by others too (then written whole, keep)",
     "the pool gradient feeding each row to its sinks while in cache",
     "a SINKS record; made_by",
     false,
     loom__rule_pool_sinks,
     {&loom__form_sinks}},
    {"pool-codes",
     "POOLGRAD(x, dy) and a POOLMAX(x) of the same window and dtype",
     "the window's places fit a byte (loom__pool_codes_ok: up to 256), the POOLMAX's own "
     "workspace buffer",
     "the POOLMAX keeping each window's argmax place, the gradient reading it instead of x",
     "CODES and CODES_READ records",
     false,
     loom__rule_pool_codes,
     {&loom__form_codes, &loom__form_codes_read}},
    {"pool-relu",
     "RELU(POOLMAX(x)), the ReLU the pooling's only reader",
     "after pool-codes; float, a window of up to 128 places or 2x2 on the AVX-512 rows "
     "(loom__pool_relu_ok), neither an output, the ReLU a kernel of its own; with the ReLU's "
     "backward where(relu > 0, d, 0) read only by the pool gradient reading these codes (and, "
     "but for 2x2 windows, d in its planes' order), that too",
     "the pooling writing the ReLU (codes carrying its mask); the gradient reading d",
     "RELU and RELU_DY records; made_by",
     false,
     loom__rule_pool_relu,
     {&loom__form_relu, &loom__form_relu_dy}},
    {"pool-conv",
     "POOLMAX of a product's output (or its epilogue's root), read by it alone",
     "after pool-relu; the reshape contiguous and read by no one else (but gradients taking "
     "this pooling's codes), the product made a plane at a time (loom__conv_planes_ok) or "
     "window by window by its transpose (loom__pool_conv_t_ok), no slab written in between",
     "the pooling computing the product plane by plane, each pooled while in L1",
     "a CONV record; fused_into",
     false,
     loom__rule_pool_conv,
     {&loom__form_conv}},
    {"conv-back",
     "FOLD of a product whose B is a 2-D view of a POOLGRAD with codes",
     "after fold-product (which runs that product), pool-codes and pool-sinks (whose sinks it "
     "takes over); 2x2 windows; the rows read only by the product, a weight gradient (rows x an "
     "unfold) and a sum along them, none read before the fold, planes of any size made from "
     "the codes (the AVX-512 pooling rows), loom__conv_back_ok",
     "the fold making the pool gradient a block of columns at a time into its product, the "
     "weight gradient and the bias sum",
     "a BACK record; fused_into",
     false,
     loom__rule_conv_back,
     {&loom__form_back}},
    {"fold-crop",
     "CROP of a FOLD computing its product; the copy of the crop's (C,N) permute; "
     "where(mask > 0, that, 0)",
     "after fold-product and conv-back (whose folds it leaves); float, columns 2 apart "
     "(loom__fold_crop_ok: the AVX-512 rows), each the only reader of the one before, none an "
     "output, each a kernel into its own contiguous buffer; the WHERE's kernel nothing but its "
     "comparison, its mask laid out as it",
     "the fold writing its planes cropped (rows and places cropped off never made), in (C,N) "
     "order and masked where those nodes ask: none of them runs",
     "a CROP record; made_by",
     false,
     loom__rule_fold_crop,
     {&loom__form_crop}},
    {"pool-quad",
     "a pool gradient with sinks whose windows tile its planes",
     "after conv-back; 2x2 windows, codes read, a product sink a 3x3 or 5x5 convolution's weight "
     "gradient (loom__pool_quad_ok)",
     "the sinks taking the windows; the rows never made",
     "a QUAD record",
     false,
     loom__rule_pool_quad,
     {&loom__form_quad}},
    {"product-act",
     "a product's epilogue: RELU, ADD of a bias row or a matrix, both, or "
     "where(h > 0, product, 0)",
     "after the others; the epilogue's root 2-D and contiguous, nothing else in the kernel",
     "the epilogue done in registers as the product stores (loom__sgemm_act), a SUM over axis 0 "
     "of it too",
     "an ACT record; made_by",
     false,
     loom__rule_product_act,
     {&loom__form_act}},
    {"lnorm-keep",
     "LNORMGRAD(x, dy) and an LNORM(x) of the same eps and dtype",
     "the LNORM's own workspace buffer; it relies on no other rule, and none on it",
     "the LNORM keeping each row's rstd after its values, the gradient reading them and the "
     "LNORM's output (xhat) instead of x",
     "LNORM_KEEP and LNORM_READ records",
     false,
     loom__rule_lnorm_keep,
     {&loom__form_lnorm_keep, &loom__form_lnorm_read}},
};
const int loom__nrules = (int)(sizeof loom__rules / sizeof *loom__rules);
_Static_assert(sizeof loom__rules / sizeof *loom__rules <= LOOM_RULES_MAX, "LOOM_RULES_MAX");

int64_t loom__rule_fired[LOOM_RULES_MAX];

int64_t loom__apply_rules(loom__program *p, const loom__fuse_in *in, bool generated) {
    int64_t total = 0;
    for (int r = 0; r < loom__nrules; r++) {
        if (loom__rules[r].generated != generated ||
            !loom__executor_runs(p->x, loom__rules[r].name))
            continue;
        int64_t n = loom__rules[r].apply(p, in);
        if (n < 0)
            return -1;
        p->rule_hits[r] += (int32_t)n;
        total += n;
    }
    return total;
}
