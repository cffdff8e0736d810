/*
 * form.c - the kernel forms' records (loom__form) and what the planner asks of them: a rule adds a
 * record to the node whose kernel runs it (last in the node's list), and the memory plan, the
 * schedule's lines and the check's values ask each of a node's forms in the order of the kinds,
 * through the functions of its kind (loom__form_ops, in the rule's own file). Nothing here knows
 * a rule.
 */
#include "internal.h"

#include <string.h>

loom__form *loom__form_add(loom__program *p, int32_t id, loom__form_kind k) {
    if (p->nforms == p->forms_cap) {
        int32_t cap = p->forms_cap ? 2 * p->forms_cap : 16;
        loom__form *f = loom__realloc(p->forms, sizeof *f * (size_t)cap);
        if (!f)
            return NULL;
        p->forms = f, p->forms_cap = cap;
    }
    int32_t at = p->nforms++, *link = &p->nodes[id].form;
    while (*link >= 0)
        link = &p->forms[*link].next;
    *link = at;
    loom__form *x = &p->forms[at];
    memset(x, 0, sizeof *x);
    x->kind = (uint8_t)k, x->node = id, x->next = -1, x->reads.operand = -1;
    const loom__form_ops *ops = loom__form_ops_of(k);
    x->run = ops ? ops->run : NULL;
    return x;
}

void loom__form_drop(loom__program *p, int32_t id, loom__form_kind k) {
    for (int32_t *link = &p->nodes[id].form; *link >= 0; link = &p->forms[*link].next)
        if (p->forms[*link].kind == k) {
            *link = p->forms[*link].next; /* (the record stays, unreferenced) */
            return;
        }
}

const loom__form_ops *loom__form_ops_of(loom__form_kind k) {
    for (int r = 0; r < loom__nrules; r++)
        for (int q = 0; q < 2; q++)
            if (loom__rules[r].forms[q] && loom__rules[r].forms[q]->kind == k)
                return loom__rules[r].forms[q];
    return NULL;
}

/* Node id's forms in the order of their kinds, each with its functions, into x and ops (of
 * LOOM_FORM_KINDS); returns how many. */
static int in_order(const loom__program *p, int32_t id, const loom__form **x,
                    const loom__form_ops **ops) {
    int n = 0;
    for (int k = 0; k < LOOM_FORM_KINDS && p->nodes[id].form >= 0; k++)
        if ((x[n] = loom__form_get(p, id, (loom__form_kind)k)))
            ops[n++] = loom__form_ops_of((loom__form_kind)k);
    return n;
}

int64_t loom__forms_own_bytes(const loom__program *p, int32_t id, int64_t bytes) {
    const loom__form *x[LOOM_FORM_KINDS];
    const loom__form_ops *ops[LOOM_FORM_KINDS];
    for (int q = 0, n = in_order(p, id, x, ops); q < n; q++)
        if (ops[q]->own_bytes)
            bytes = ops[q]->own_bytes(p, x[q], bytes);
    return bytes;
}

void loom__forms_place(loom__program *p, int32_t id, loom__placer *pl) {
    const loom__form *x[LOOM_FORM_KINDS];
    const loom__form_ops *ops[LOOM_FORM_KINDS];
    for (int q = 0, n = in_order(p, id, x, ops); q < n; q++)
        if (ops[q]->place)
            ops[q]->place(p, x[q], pl);
}

int32_t loom__forms_source(const loom__program *p, int32_t id, int k) {
    for (int32_t f = p->nodes[id].form; f >= 0 && p->nodes[id].src[k] >= 0; f = p->forms[f].next)
        if (p->forms[f].reads.operand == k)
            return p->forms[f].reads.node;
    return p->nodes[id].src[k];
}

int64_t loom__form_no_buffer(const loom__program *p, const loom__form *x, int64_t bytes) {
    (void)p, (void)x, (void)bytes;
    return 0;
}

int loom__form_values_into(const loom__program *p, const loom__form *x, int32_t into,
                           loom__value *out, int n) {
    int w = 0;
    for (int k = 0; k < n; k++)
        if (out[k].id != x->node)
            out[w++] = out[k];
    out[w++] = loom__value_of(p, into);
    return w;
}

void loom__forms_describe(FILE *f, const loom__program *p, int32_t id) {
    const loom__form *x[LOOM_FORM_KINDS];
    const loom__form_ops *ops[LOOM_FORM_KINDS];
    for (int q = 0, n = in_order(p, id, x, ops); q < n; q++)
        if (ops[q]->describe)
            ops[q]->describe(f, p, x[q]);
}

/* A slab range as a value: node id's shape, contiguous from the slab's offset. */
static loom__value slab_value(const loom__pnode *t, int32_t id) {
    loom__value v = {.id = id,
                     .exact = true,
                     .lay = {.base = LOOM_BASE_PERSIST,
                             .index = t->attr.persist.slab,
                             .offset = t->attr.persist.offset}};
    for (int64_t d = t->ndim - 1, s = 1; d >= 0; d--)
        v.lay.stride[d] = s, s *= t->shape[d];
    return v;
}

int loom__entry_values(const loom__program *p, int64_t e, loom__value *out) {
    int32_t id = p->exec[e];
    const loom__pnode *t = &p->nodes[id];
    int n = 0;
#define VALUE(node) (out[n++] = loom__value_of(p, node))
    if (p->fused_of && p->fused_of[id] >= 0) { /* a generated kernel: its root and stores */
        const loom__fused *k = &p->fused[p->fused_of[id]];
        VALUE(id);
        for (int q = 0; q < k->nout; q++)
            VALUE(k->outs[q]);
        return n;
    }
    if (t->op == LOOM_OP_STORE || t->op == LOOM_OP_SYNC) {
        out[n++] = slab_value(t, id);
        return n;
    }
    /* a library kernel's own buffer holds blocks or planes of its values where an epilogue or
     * sinks take them (and its forms may say it holds nothing) */
    if (!loom__pool_by_plane(p, id) && t->epi < 0)
        VALUE(id);
    int32_t m = t->op == LOOM_OP_FOLD ? p->nodes[t->src[0]].src[0] : -1;
    /* (AVX-512: its product's columns added in the product's order; AVX2: the fold's order) */
    if (n > 0 && m >= 0 && p->nodes[m].fused_into == id)
        out[0].exact = !loom__use_own_gemm();
    if (t->epi >= 0 && !loom__rows_streamed(p, id))
        VALUE(p->fused[t->epi].root);
#undef VALUE
    const loom__form *x[LOOM_FORM_KINDS];
    const loom__form_ops *ops[LOOM_FORM_KINDS];
    for (int q = 0, nf = in_order(p, id, x, ops); q < nf; q++)
        if (ops[q]->values)
            n = ops[q]->values(p, x[q], out, n);
    return n;
}
