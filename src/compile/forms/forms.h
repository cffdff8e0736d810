/*
 * compile/forms/forms.h - what the fusion rules share: one file per rule here (forms/NAME.c:
 * its match, the records it makes and their functions), the table that orders them in
 * compile/fuse.c (loom__rules), and the helpers several rules use (fuse.c). Never installed.
 */
#ifndef LOOM_COMPILE_FORMS_H
#define LOOM_COMPILE_FORMS_H

#include "../internal.h"

static inline bool loom__fuse_is_ew(const loom__pnode *t) {
    return loom__ops[t->op].kind == LOOM_KIND_EW && !t->copy;
}
static inline bool loom__fuse_is_red(const loom__pnode *t) {
    return loom__ops[t->op].kind == LOOM_KIND_RED;
}
/* fuse.c: the node computing node i in its kernel, following fused_into to the root. */
int32_t loom__fuse_root_of(const loom__program *p, int64_t i);
/* The product a fold reads through a contiguous reshape, or -1. */
int32_t loom__fuse_folded_product(const loom__program *p, const loom__pnode *f);
/* The live readers of node v, the last of them into *only. */
int32_t loom__fuse_readers_of(const loom__program *p, const bool *live, int32_t v, int32_t *only);
/* Whether node id is the constant +0 (through views). */
bool loom__fuse_is_zero(const loom__program *p, int32_t id);
/* The node whose workspace buffer holds view or node id's data, or -1. */
int32_t loom__fuse_owner(const loom__program *p, int32_t id);
/* Whether a node in (lo, hi), other than skip[0 .. nskip), writes a persistent slab (a store, a
 * sync, or a kernel computing into its slab place) or, with `reads`, reads one. */
bool loom__fuse_slab_touched_between(const loom__program *p, const bool *live, int64_t lo,
                                     int64_t hi, bool reads, const int32_t *skip, int nskip);
/* Whether node s can take root r a row at a time (a sum along its rows, or a product r B on the
 * dot-product path), B ready before library node L. */
bool loom__fuse_sinkable(const loom__program *p, int32_t s, int32_t r, int32_t L);

/* The rules, one a file (their rows in fuse.c's loom__rules say what each matches and when). */
int64_t loom__rule_conv_back(loom__program *p, const loom__fuse_in *in);
int64_t loom__rule_elementwise(loom__program *p, const loom__fuse_in *in);
int64_t loom__rule_epilogue(loom__program *p, const loom__fuse_in *in);
int64_t loom__rule_fold_crop(loom__program *p, const loom__fuse_in *in);
int64_t loom__rule_fold_product(loom__program *p, const loom__fuse_in *in);
int64_t loom__rule_lnorm_keep(loom__program *p, const loom__fuse_in *in);
int64_t loom__rule_pool_codes(loom__program *p, const loom__fuse_in *in);
int64_t loom__rule_pool_conv(loom__program *p, const loom__fuse_in *in);
int64_t loom__rule_pool_quad(loom__program *p, const loom__fuse_in *in);
int64_t loom__rule_pool_relu(loom__program *p, const loom__fuse_in *in);
int64_t loom__rule_pool_sinks(loom__program *p, const loom__fuse_in *in);
int64_t loom__rule_product_act(loom__program *p, const loom__fuse_in *in);
/* The kinds of record they make (loom__form_ops, each in the file of the rule making it). */
extern const loom__form_ops loom__form_act, loom__form_relu, loom__form_codes, loom__form_conv,
    loom__form_back, loom__form_crop, loom__form_codes_read, loom__form_relu_dy, loom__form_sinks,
    loom__form_quad, loom__form_lnorm_keep, loom__form_lnorm_read;

#endif
