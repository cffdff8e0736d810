/*
 * forms/pool_quad.c - the fusion rule "pool-quad" (its row in compile/fuse.c's loom__rules: what it
 * matches, when it applies, the kernel form it makes and what it records of it).
 */
#include "forms.h"

#include <string.h>

int64_t loom__rule_pool_quad(loom__program *p, const loom__fuse_in *in) {
    const bool *live = in->live;
    int64_t n = 0;
    for (int32_t L = 0; L < p->n; L++)
        if (live[L] && p->nodes[L].op == LOOM_OP_POOLGRAD && loom__pool_quad_ok(p, L)) {
            if (!loom__form_add(p, L, LOOM_FORM_QUAD))
                return -1;
            n++;
        }
    return n;
}

/* Its images, after the gradient's own buffer. */
static int64_t quad_bytes(const loom__program *p, const loom__form *x, int64_t bytes) {
    return bytes + (int64_t)loom__pool_quad_bytes(p, x->node);
}

/* (its sinks' line says they take windows) */
const loom__form_ops loom__form_quad = {
    .kind = LOOM_FORM_QUAD, .own_bytes = quad_bytes, .run = loom__pool_quad};
