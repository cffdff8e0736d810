/*
 * forms/pool_quad.c - the fusion rule "pool-quad" (its row in compile/fuse.c's loom__rules: what it
 * matches, when it applies, the kernel form it makes and the fields that form is run through).
 */
#include "forms.h"

#include <string.h>

int64_t loom__rule_pool_quad(loom__program *p, const loom__fuse_in *in) {
    const bool *live = in->live;
    int64_t n = 0;
    for (int32_t L = 0; L < p->n; L++)
        if (live[L] && p->nodes[L].op == LOOM_OP_POOLGRAD && loom__pool_quad_ok(p, L))
            p->nodes[L].quad = true, n++;
    return n;
}
