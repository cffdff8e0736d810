/*
 * check.c - the check executor (LOOM_CHECK=1, or loom__set_executor(&loom__check_executor)): a
 * second implementation of the executor interface (internal.h) that builds a program as the CPU
 * executor does and runs each step beside the program's reference twin (its planner's reference:
 * the same nodes, nothing fused, every op its own interpreted kernel, every value kept), which
 * writes copies of the slabs. After each of the program's kernels (on the real bindings) the
 * twin runs up to the nodes that kernel made, and every value the kernel leaves whole
 * (the planner's values, loom__entry_values) is compared with the twin's, bit for bit; a value of
 * other arithmetic (a fold summing its taps in its product's order, a pool gradient's sinks by
 * windows) within a normwise bound, the twin then going on from the program's bits. The first
 * difference fails the step with one line naming the node, its kernel and the element: a
 * miscompiled or wrong fast kernel is found where it happens, not as a loss that drifts. Steps take
 * several times as long. Graphs, trainers and devices running with it show that nothing above the
 * interface depends on the CPU executor (tests/test_matrix.c, tests/test_gpt.c, tests/test_cli.sh).
 */
#include "internal.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define CHECK_TWINS 256

/* Program `of`'s twin q, and what its runs that passed compared (atomic). */
typedef struct {
    const loom__program *of;
    loom__program *q;
    int64_t runs, values;
} twin;

static struct {
    pthread_mutex_t mu;
    twin *twin[CHECK_TWINS];
    int n;
} check = {PTHREAD_MUTEX_INITIALIZER, {0}, 0};

loom__check_counts loom__check = {0, 0, -1};

/* p's twin, made at its first run (devices run concurrently). */
static twin *check_twin(const loom__program *p) {
    pthread_mutex_lock(&check.mu);
    twin *t = NULL;
    for (int i = 0; i < check.n && !t; i++)
        if (check.twin[i]->of == p)
            t = check.twin[i];
    if (!t && check.n < CHECK_TWINS && (t = loom__calloc(1, sizeof *t))) {
        t->of = p;
        if ((t->q = p->planner->reference(p, p->planner->cpu)))
            check.twin[check.n++] = t;
        else
            loom__free(t), t = NULL;
    }
    pthread_mutex_unlock(&check.mu);
    return t;
}

static loom_status check_build(const loom__executor *x, loom__program *p, bool *compiled) {
    (void)x;
    return p->planner->cpu->build(p->planner->cpu, p, compiled);
}

static void check_release(const loom__executor *x, loom__program *p) {
    (void)x;
    pthread_mutex_lock(&check.mu);
    for (int i = 0; i < check.n; i++)
        if (check.twin[i]->of == p) {
            twin *t = check.twin[i];
            loom__log(LOOM_LOG_INFO,
                      "executor check: program %016llx: %lld values its kernels made in %lld "
                      "runs agreed with the reference interpreter's",
                      (unsigned long long)p->hash, (long long)t->values, (long long)t->runs);
            p->planner->free(t->q);
            loom__free(t);
            check.twin[i] = check.twin[--check.n];
            break;
        }
    pthread_mutex_unlock(&check.mu);
    p->planner->cpu->release(p->planner->cpu, p);
}

/* Element i (row-major over the node's shape) of value v's elements, bound by b in p. */
static const unsigned char *check_elem(const loom__program *p, const loom__bind *b,
                                       const loom__value *v, int64_t i) {
    const loom__pnode *t = &p->nodes[v->id];
    size_t es = loom__dtype_size((loom_dtype)t->dtype);
    int64_t off = 0;
    for (int d = t->ndim - 1; d >= 0; d--)
        off += (i % t->shape[d]) * v->lay.stride[d], i /= t->shape[d];
    return (const unsigned char *)loom__lay_addr(p, b, &v->lay, es) + (size_t)off * es;
}

/* Value v's elements in p as one run of memory (row-major, no gaps: most values), or NULL where
 * its layout has gaps or another order (then element by element, check_elem). */
static const unsigned char *check_dense(const loom__program *p, const loom__bind *b,
                                        const loom__value *v) {
    const loom__pnode *t = &p->nodes[v->id];
    int64_t run = 1;
    for (int d = t->ndim - 1; d >= 0; d--) {
        if (t->shape[d] != 1 && v->lay.stride[d] != run)
            return NULL;
        run *= t->shape[d];
    }
    return loom__lay_addr(p, b, &v->lay, loom__dtype_size((loom_dtype)t->dtype));
}

/* How far into each slab the nodes of q reach. */
static void check_extents(const loom__program *q, int64_t *ext) {
    for (int s = 0; s < LOOM_SLAB_COUNT; s++)
        ext[s] = 0;
    for (int64_t i = 0; i < q->n; i++) {
        const loom__pnode *t = &q->nodes[i];
        int64_t end = -1;
        int s = -1;
        if (t->op == LOOM_OP_STORE || t->op == LOOM_OP_SYNC)
            s = t->attr.persist.slab, end = t->attr.persist.offset + loom__numel(t->ndim, t->shape);
        else if (t->lay.base == LOOM_BASE_PERSIST) {
            s = t->lay.index, end = t->lay.offset + 1;
            for (int d = 0; d < t->ndim; d++)
                end += (t->shape[d] - 1) * t->lay.stride[d];
        }
        if (s >= 0 && end > ext[s])
            ext[s] = end;
    }
}

/* The reference's state in one step: its bindings, and per node the value it made (a copy of
 * its elements, taken as it was made: a later all-reduce or store may change them in place), its
 * place, and the entry that made it. */
typedef struct {
    const loom__program *q;
    loom__bind b;
    int64_t next; /* its next entry */
    unsigned char **snap;
    loom__value *at;
    int64_t *made;
} check_ref;

/* The reference's entries up to node `upto`, each value it makes copied. */
static loom_status check_advance(check_ref *r, int32_t upto) {
    loom__value v[LOOM_ENTRY_VALUES_MAX];
    for (; r->next < r->q->nexec && r->q->exec[r->next] <= upto; r->next++) {
        loom_status st = loom__interp_entry(r->q, &r->b, r->next);
        for (int k = 0, nv = st ? 0 : r->q->planner->values(r->q, r->next, v); k < nv && !st; k++) {
            const loom__pnode *t = &r->q->nodes[v[k].id];
            size_t es = loom__dtype_size((loom_dtype)t->dtype);
            int64_t n = loom__numel(t->ndim, t->shape);
            unsigned char **snap = &r->snap[v[k].id];
            loom__free(*snap);
            if (!(*snap = loom__malloc((size_t)n * es + 1)))
                return LOOM_ENOMEM;
            const unsigned char *dense = check_dense(r->q, &r->b, &v[k]);
            if (dense)
                memcpy(*snap, dense, (size_t)n * es);
            for (int64_t i = 0; !dense && i < n; i++)
                memcpy(*snap + (size_t)i * es, check_elem(r->q, &r->b, &v[k], i), es);
            r->at[v[k].id] = v[k], r->made[v[k].id] = r->next;
        }
        if (st)
            return st;
    }
    return LOOM_OK;
}

/* One line on element i of node id differing: what each has. */
static loom_status check_differs(const loom__program *p, int64_t e, int32_t id, int64_t i,
                                 const unsigned char *got, const unsigned char *want,
                                 const char *why) {
    const loom__pnode *t = &p->nodes[id];
    double g = loom__first_value((loom_dtype)t->dtype, got),
           w = loom__first_value((loom_dtype)t->dtype, want);
    return loom__error(LOOM_EINTERNAL,
                       "executor check: node %d (%s), made by kernel #%lld (node %d, %s), "
                       "element %lld is %.9g where the reference has %.9g%s",
                       id, loom__ops[t->op].name, (long long)e, p->exec[e],
                       p->fused_of && p->fused_of[p->exec[e]] >= 0 ? "generated" : "library",
                       (long long)i, g, w, why);
}

/* The bound on a value whose arithmetic differs from the reference's (sums in another order):
 * ||got - ref|| <= CHECK_NORMWISE ||ref||, 2^-16, 256 units of float's rounding of the norm (a
 * bias gradient's sum of 86528 terms in another order differs by 1e-6 of its value). */
#define CHECK_NORMWISE 0x1p-16

/* Whether the reference has run an all-reduce or a store since entry `since` (which may have
 * changed a value of its slabs in place). */
static bool check_wrote_slabs(const check_ref *r, int64_t since) {
    for (int64_t e = since + 1; e < r->next; e++) {
        const loom__pnode *t = &r->q->nodes[r->q->exec[e]];
        if (t->op == LOOM_OP_SYNC || t->op == LOOM_OP_STORE)
            return true;
    }
    return false;
}

/* Value v (entry e of p) against the reference's: the same bits, or where v is not exact within
 * the normwise bound, and then the reference goes on from p's bits (its later kernels read what
 * p's read). */
static loom_status check_value(const loom__program *p, const loom__bind *b, int64_t e,
                               const loom__value *v, check_ref *r) {
    const loom__pnode *t = &p->nodes[v->id];
    size_t es = loom__dtype_size((loom_dtype)t->dtype);
    int64_t n = loom__numel(t->ndim, t->shape), first = -1;
    unsigned char *ref = r->snap[v->id];
    const unsigned char *dense = check_dense(p, b, v);
    if (dense && memcmp(dense, ref, (size_t)n * es) == 0) /* (the same bits: most values) */
        return LOOM_OK;
    double err = 0, norm = 0;
    for (int64_t i = 0; i < n; i++) {
        const unsigned char *got = check_elem(p, b, v, i), *want = ref + (size_t)i * es;
        bool same = memcmp(got, want, es) == 0;
        if (v->exact && same)
            continue;
        if (v->exact)
            return check_differs(p, e, v->id, i, got, want, "");
        first = !same && first < 0 ? i : first;
        double g = loom__first_value((loom_dtype)t->dtype, got),
               w = loom__first_value((loom_dtype)t->dtype, want);
        err += (g - w) * (g - w), norm += w * w;
    }
    if (first < 0)
        return LOOM_OK;
    if (t->dtype != LOOM_F32 || !(sqrt(err) <= CHECK_NORMWISE * sqrt(norm)))
        return check_differs(p, e, v->id, first, check_elem(p, b, v, first),
                             ref + (size_t)first * es, " (beyond the normwise bound)");
    /* (a value in a slab since changed in place by the reference's own kernels stays) */
    bool into_twin =
        r->at[v->id].lay.base != LOOM_BASE_PERSIST || !check_wrote_slabs(r, r->made[v->id]);
    for (int64_t i = 0; i < n; i++) {
        memcpy(ref + (size_t)i * es, check_elem(p, b, v, i), es);
        if (into_twin)
            memcpy((void *)(uintptr_t)check_elem(r->q, &r->b, &r->at[v->id], i), ref + i * es, es);
    }
    return LOOM_OK;
}

static loom_status check_run(const loom__executor *x, const loom__program *p, const loom__bind *b) {
    (void)x;
    twin *t = check_twin(p);
    check_ref r = {.q = t ? t->q : NULL, .b = *b};
    r.b.team = NULL; /* (the reference runs on one core) */
    if (!r.q)
        return loom__error(
            LOOM_ENOMEM,
            "executor check: no reference program (out of memory, or %d programs alive)",
            CHECK_TWINS);
    int64_t ext[LOOM_SLAB_COUNT], n = r.q->n + 1;
    check_extents(r.q, ext);
    r.snap = loom__calloc((size_t)n, sizeof *r.snap);
    r.at = loom__calloc((size_t)n, sizeof *r.at);
    r.made = loom__calloc((size_t)n, sizeof *r.made);
    r.b.ws = loom__malloc(r.q->ws_bytes + 64);
    loom_status st = r.snap && r.at && r.made && r.b.ws ? LOOM_OK : LOOM_ENOMEM;
    for (int s = 0; s < LOOM_SLAB_COUNT; s++) { /* the reference writes copies of the slabs */
        r.b.slab[s] = NULL;
        if (!st && ext[s] > 0 && !(r.b.slab[s] = loom__malloc(sizeof(float) * (size_t)ext[s])))
            st = LOOM_ENOMEM;
        if (r.b.slab[s])
            memcpy(r.b.slab[s], b->slab[s], sizeof(float) * (size_t)ext[s]);
    }
    loom__value v[LOOM_ENTRY_VALUES_MAX];
    int64_t kernels = 0, values = 0;
    for (int64_t e = 0; !st && e < p->nexec; e++) {
        if (!loom__runs_here(b, e)) /* another device's (its reference values go unchecked) */
            continue;
        if ((st = loom__interp_entry(p, b, e)))
            break;
        int nv = p->planner->values(p, e, v);
        int32_t upto = p->exec[e];
        for (int k = 0; k < nv; k++)
            upto = v[k].id > upto ? v[k].id : upto;
        if ((st = check_advance(&r, upto)))
            break;
        kernels++;
        if (e == loom__check.corrupt_entry && nv > 0)
            *(unsigned char *)(uintptr_t)check_elem(p, b, &v[0], 0) ^= 1;
        for (int k = 0; k < nv && !st; k++, values++)
            st = r.snap[v[k].id] ? check_value(p, b, e, &v[k], &r)
                                 : loom__error(LOOM_EINTERNAL,
                                               "executor check: node %d (%s), made by kernel "
                                               "#%lld (node %d), has no reference value",
                                               v[k].id, loom__ops[p->nodes[v[k].id].op].name,
                                               (long long)e, p->exec[e]);
    }
    __atomic_fetch_add(&loom__check.kernels, kernels, __ATOMIC_RELAXED);
    __atomic_fetch_add(&loom__check.values, values, __ATOMIC_RELAXED);
    if (!st) {
        __atomic_fetch_add(&t->runs, 1, __ATOMIC_RELAXED);
        __atomic_fetch_add(&t->values, values, __ATOMIC_RELAXED);
    }
    for (int64_t i = 0; r.snap && i < n; i++)
        loom__free(r.snap[i]);
    loom__free(r.snap), loom__free(r.at), loom__free(r.made), loom__free(r.b.ws);
    for (int s = 0; s < LOOM_SLAB_COUNT; s++)
        loom__free(r.b.slab[s]);
    return st == LOOM_ENOMEM ? loom__error(st, "executor check: out of memory") : st;
}

const loom__executor loom__check_executor = {
    .name = "check", .build = check_build, .run = check_run, .release = check_release};
