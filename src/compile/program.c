/*
 * program.c - from step graph to program, and the program cache.
 *
 * loom_graph_run() hashes the graph by structure only (ops, dtypes, shapes, attributes, the input
 * ordinals and persistent offsets, which nodes are outputs; never data or addresses). On a cache
 * hit the stored program runs with this step's input buffers; on a miss the graph is planned:
 * liveness (only nodes that reach an output or a store are kept), layouts and buffers
 * (memplan.c), fusion (fuse.c), and the graph's executor builds the generated kernels (the CPU's:
 * cpu.c, codegen.c, cc.c). The graph is the recorded step; what running it keeps (the programs,
 * the workspace, the step in flight, the last step's results) is its loom__steps, here alone.
 */
#include "internal.h"

#include <sys/stat.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* A graph's run state (loom_graph.run). */
struct loom__steps {
    const loom__executor *x;  /* what builds and runs its programs */
    loom__program **programs; /* the programs built for it: the cache */
    int64_t nprograms, programs_cap;
    loom__program *last; /* program of the last successful run, NULL before */
    /* a step submitted and not yet waited for (loom_graph_submit): its program, whether the
     * graph was reset since (its tensors are gone), its loss node (-1: none) and dtype; then the
     * status and loss of the last step that ended */
    loom__program *inflight;
    bool inflight_reset;
    int32_t loss_id;
    uint8_t loss_dtype;
    loom_status ended_status;
    double ended_loss;
    const void **last_inputs; /* its input bindings (in the graph's arena) */
    const void **kept; /* last's outputs once kept off the devices (loom__graph_keep), or NULL */
    void *workspace;   /* of the steps run on this thread */
    size_t workspace_size;
    bool warned_recompile;
};

/* The members kernel k stores too. */
static void stored_too(FILE *f, const loom__program *p, const loom__fused *k) {
    for (int q = 0; q < k->nout; q++)
        fprintf(f, ", storing %s#%d too", loom__ops[p->nodes[k->outs[q]].op].name, k->outs[q]);
}

/* Whether op's library kernel has float32 forms only (loom's products, the pooling rows and
 * their fused forms, the windows', row and attention kernels in AVX-512 or AVX2): in float64 it
 * runs the portable loops (products: BLAS's dgemm), and its line says so. */
static bool float32_kernels(int op) {
    switch (op) {
        case LOOM_OP_MATMUL:
        case LOOM_OP_UNFOLD:
        case LOOM_OP_FOLD:
        case LOOM_OP_POOLMAX:
        case LOOM_OP_POOLGRAD:
        case LOOM_OP_SOFTMAX:
        case LOOM_OP_LNORM:
        case LOOM_OP_LNORMGRAD:
        case LOOM_OP_ATTENTION:
        case LOOM_OP_ATTENTIONGRAD:
            return true;
        default:
            return false;
    }
}

void loom__kernel_line(FILE *f, const loom__program *p, int32_t id) {
    const loom__pnode *t = &p->nodes[id];
    loom_tensor shape = {.ndim = t->ndim};
    char s[96];
    memcpy(shape.shape, t->shape, sizeof shape.shape);
    loom__shape_str(&shape, s, sizeof s);
    fprintf(f, "node %d %s %s", id, loom__ops[t->op].name, s);
    if (p->fused_of && p->fused_of[id] >= 0) {
        fprintf(f, "  generated loom_k%d, fusing", id);
        for (int64_t m = 0; m < id; m++) {
            int64_t r = m;
            while (p->nodes[r].fused_into >= 0)
                r = p->nodes[r].fused_into;
            if (r == id && m != id)
                fprintf(f, " %s#%lld", loom__ops[p->nodes[m].op].name, (long long)m);
        }
        stored_too(f, p, &p->fused[p->fused_of[id]]);
    } else {
        fprintf(f, "  interpreted%s", t->elided ? " (elided store)" : "");
        for (int64_t m = 0; m < id; m++)
            if (p->nodes[m].fused_into == id)
                fprintf(f, ", computing %s#%lld", loom__ops[p->nodes[m].op].name, (long long)m);
        if (t->epi >= 0) {
            fprintf(f, ", epilogue loom_k%d into %s#%d", p->fused[t->epi].root,
                    loom__ops[p->nodes[p->fused[t->epi].root].op].name, p->fused[t->epi].root);
            stored_too(f, p, &p->fused[t->epi]);
        }
        loom__forms_describe(f, p, id);
        if (t->dtype == LOOM_F64 && float32_kernels(t->op))
            fprintf(f, ", float64: %s",
                    t->op == LOOM_OP_MATMUL ? "BLAS's dgemm" : "portable loops");
    }
    fputc('\n', f);
}

/* LOOM_DUMP: the schedule of a program, one line per kernel in execution order. */
static void dump_schedule(const loom__program *p) {
    const char *dir = loom__getenv()->dump;
    if (!dir)
        return;
    char path[4200];
    mkdir(dir, 0777);
    snprintf(path, sizeof path, "%s/%016llx.schedule", dir, (unsigned long long)p->hash);
    FILE *f = fopen(path, "w");
    if (!f)
        return;
    fprintf(f, "# program %016llx: %lld nodes, %lld kernels, workspace %zu bytes; devices %s\n",
            (unsigned long long)p->hash, (long long)p->n, (long long)p->nexec, p->ws_bytes,
            p->share ? "share the parameters and state" : "hold replicas");
    fprintf(f, "# fusion rules applied (ops fused):");
    for (int r = 0; r < loom__nrules; r++)
        if (p->rule_hits[r])
            fprintf(f, " %s %d", loom__rules[r].name, (int)p->rule_hits[r]);
    fprintf(f, "\n");
    for (int64_t e = 0; e < p->nexec; e++) {
        fprintf(f, "%4lld %s ", (long long)e, p->own && p->own[e] ? "1" : " ");
        loom__kernel_line(f, p, p->exec[e]);
    }
    fclose(f);
}

static int cmp_u32(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

/* The median of exec entry e's recorded times, in ms. */
static double median_ms(const loom__program *p, int64_t e) {
    uint32_t t[LOOM_PROF_KEEP];
    uint64_t n = p->prof_seen[e] < LOOM_PROF_KEEP ? p->prof_seen[e] : LOOM_PROF_KEEP;
    if (n == 0)
        return 0;
    memcpy(t, p->prof_keep + e * LOOM_PROF_KEEP, sizeof(uint32_t) * n);
    qsort(t, n, sizeof *t, cmp_u32);
    return 1e-6 * (n % 2 ? (double)t[n / 2] : 0.5 * ((double)t[n / 2 - 1] + (double)t[n / 2]));
}

/* LOOM_PROFILE: the kernels of a program that ran, slowest first, with their share of its time,
 * their mean time per run and their median over the last runs. */
static void print_profile(const loom__program *p) {
    int64_t runs = p->prof_ns ? (int64_t)p->prof_ns[p->nexec] : 0;
    if (runs == 0)
        return;
    int64_t *order = loom__calloc((size_t)p->nexec + 1, sizeof *order);
    if (!order)
        return;
    uint64_t total = 0;
    for (int64_t e = 0; e < p->nexec; e++) { /* insertion sort: a few hundred kernels */
        int64_t k = e;
        for (; k > 0 && p->prof_ns[order[k - 1]] < p->prof_ns[e]; k--)
            order[k] = order[k - 1];
        order[k] = e, total += p->prof_ns[e];
    }
    double median = 0;
    for (int64_t e = 0; e < p->nexec; e++)
        median += median_ms(p, e);
    fprintf(stderr,
            "profile: program %016llx, %lld runs (all devices), %.3f ms per run in %lld kernels "
            "(kernels' medians over the last %d runs: %.3f ms)\n",
            (unsigned long long)p->hash, (long long)runs, 1e-6 * (double)total / (double)runs,
            (long long)p->nexec, LOOM_PROF_KEEP, median);
    for (int64_t k = 0; k < p->nexec; k++) {
        int64_t e = order[k];
        fprintf(stderr, "profile: %5.1f%% %8.3f ms (median %.3f)  #%-3lld ",
                total ? 100.0 * (double)p->prof_ns[e] / (double)total : 0.0,
                1e-6 * (double)p->prof_ns[e] / (double)runs, median_ms(p, e), (long long)e);
        loom__kernel_line(stderr, p, p->exec[e]);
    }
    loom__free(order);
}

static bool use_compiler(const loom_graph *g) {
    if (g->backend != LOOM_BACKEND_AUTO)
        return g->backend == LOOM_BACKEND_CPU;
    const char *b = loom__getenv()->backend;
    return !b || strcmp(b, "interp") != 0;
}

static uint64_t graph_hash(const loom_graph *g) {
    loom__hash h;
    loom__hash_init(&h);
    loom__hash_u64(&h, (uint64_t)g->n);
    loom__hash_u64(&h, (uint64_t)g->detect_anomaly);
    loom__hash_u64(&h, (uint64_t)use_compiler(g));
    for (int64_t i = 0; i < g->n; i++) {
        const loom_tensor *t = g->nodes[i];
        loom__hash_u64(&h, (uint64_t)t->op | (uint64_t)t->dtype << 8 | (uint64_t)t->ndim << 16 |
                               (uint64_t)t->is_output << 24 | (uint64_t)t->is_loss << 25 |
                               (uint64_t)t->role << 32);
        for (int d = 0; d < t->ndim; d++)
            loom__hash_u64(&h, (uint64_t)t->shape[d]);
        for (int k = 0; k < 3; k++)
            loom__hash_u64(&h, t->src[k] ? (uint64_t)t->src[k]->id : ~0ull);
        switch (loom__ops[t->op].attr) { /* the attribute ops.def says this op reads */
            case LOOM_ATTR_VALUE: {
                uint64_t bits;
                memcpy(&bits, &t->attr.value, sizeof bits);
                loom__hash_u64(&h, bits);
                break;
            }
            case LOOM_ATTR_PERSIST:
                loom__hash_u64(&h, (uint64_t)t->attr.persist.slab);
                loom__hash_u64(&h, (uint64_t)t->attr.persist.offset);
                break;
            case LOOM_ATTR_INPUT:
                loom__hash_u64(&h, (uint64_t)t->attr.input);
                break;
            case LOOM_ATTR_PERM:
                for (int d = 0; d < t->ndim; d++)
                    loom__hash_u64(&h, (uint64_t)t->attr.perm[d]);
                break;
            case LOOM_ATTR_WINDOW: {
                const loom_window *w = &t->attr.win;
                loom__hash_u64(&h, (uint64_t)w->kh << 48 | (uint64_t)w->kw << 32 |
                                       (uint64_t)w->sh << 16 | (uint64_t)w->sw);
                loom__hash_u64(&h, (uint64_t)w->ph << 32 | (uint64_t)w->pw);
                break;
            }
            case LOOM_ATTR_CLASSES:
                loom__hash_u64(&h, (uint64_t)t->attr.classes);
                break;
            case LOOM_ATTR_REDUCE:
                loom__hash_u64(&h, (uint64_t)t->attr.reduce);
                break;
            case LOOM_ATTR_AXIS:
                loom__hash_u64(&h, (uint64_t)t->attr.axis);
                break;
            case LOOM_ATTR_NONE:
                break;
        }
    }
    return loom__hash_final(&h);
}

void loom__program_free(loom__program *p) {
    if (!p)
        return;
    print_profile(p);
    loom__free(p->prof_ns);
    loom__free(p->prof_seen);
    loom__free(p->prof_keep);
    if (p->x && p->x->release)
        p->x->release(p->x, p);
    loom__free(p->fused);
    loom__free(p->fused_of);
    loom__free(p->forms);
    loom__free(p->nodes);
    loom__free(p->exec);
    loom__free(p->own);
    loom__free(p->consts);
    loom__free(p);
}

/* Fuses elementwise chains and has p's executor build their kernels; where it cannot (no
 * compiler, a failed build) the program stays interpreted. */
static void compile_kernels(loom__program *p, const loom__fuse_in *in, loom_metrics *m) {
    int64_t fused = loom__apply_rules(p, in, true);
    if (fused < 0 || p->nfused == 0) {
        loom__unfuse(p);
        return;
    }
    bool compiled = false;
    double t0 = loom__now();
    if (p->x->build(p->x, p, &compiled)) {
        loom__unfuse(p);
        return;
    }
    m->compiles += compiled;
    m->disk_hits += !compiled;
    m->compile_seconds += compiled ? loom__now() - t0 : 0;
    m->fused_ops += fused;
}

const loom__planner loom__the_planner = {&loom__cpu_executor, loom__program_reference,
                                         loom__program_free, loom__entry_values};

/* A program of n nodes (zeroed) for executor x; NULL out of memory. */
static loom__program *program_new(int64_t n, const loom__executor *x) {
    loom__program *p = loom__calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->n = n, p->x = x, p->planner = &loom__the_planner;
    p->nodes = loom__calloc((size_t)n + 1, sizeof *p->nodes);
    p->exec = loom__calloc((size_t)n + 1, sizeof *p->exec);
    p->consts = loom__calloc((size_t)n + 1, sizeof *p->consts);
    if (!p->nodes || !p->exec || !p->consts) {
        loom__program_free(p);
        return NULL;
    }
    return p;
}

/* Plans p from what its nodes say of themselves (op, dtype, shape, attribute, sources, out,
 * check): liveness (nodes that reach an output or a side effect), layouts, then with `fuse` the
 * generated kernels (built by p->x where `compile`) and the library kernels' fusions, then
 * buffers (without `fuse`, the reference: none reused). false out of memory. */
static bool plan_nodes(loom__program *p, bool compile, bool fuse, loom_metrics *m) {
    int64_t n = p->n;
    bool *flags = loom__calloc((size_t)(2 * n + 1), sizeof(bool));
    int64_t *last = loom__calloc((size_t)n + 1, sizeof(int64_t));
    int32_t *readers = NULL;
    bool ok = false;
    if (!flags || !last)
        goto done;
    bool *live = flags, *is_out = flags + n;
    for (int64_t i = n - 1; i >= 0; i--) {
        loom__pnode *q = &p->nodes[i];
        is_out[i] = q->out;
        live[i] = live[i] || q->out || q->op == LOOM_OP_STORE || q->op == LOOM_OP_SYNC;
        for (int k = 0; k < 3 && live[i]; k++)
            if (q->src[k] >= 0)
                live[q->src[k]] = true;
    }
    loom__assign_layouts(p, live, is_out);
    loom__store_in_place(p, live, is_out);
    for (int64_t i = 0; i < n; i++)
        p->nodes[i].fused_into = -1, p->nodes[i].epi = -1, p->nodes[i].made_by = -1,
        p->nodes[i].form = -1;
    p->nforms = 0;
    if (!(readers = loom__count_readers(p, live)))
        goto done;
    loom__fuse_in in = {live, is_out, readers};
    if (fuse && compile && n > 0)
        compile_kernels(p, &in, m);
    if (fuse) {
        int64_t fused = loom__apply_rules(p, &in, false);
        if (fused < 0)
            goto done;
        m->fused_ops += fused;
    }
    ok = !loom__place_buffers(p, live, is_out, !fuse, last) && !loom__plan_owners(p, live);
done:
    loom__free(flags);
    loom__free(last);
    loom__free(readers);
    return ok;
}

static loom__program *plan(loom_graph *g, uint64_t hash) {
    int64_t n = g->n;
    loom__program *p = program_new(n, g->run->x);
    if (!p)
        return NULL;
    p->hash = hash;
    for (int64_t i = 0; i < n; i++) {
        const loom_tensor *t = g->nodes[i];
        loom__pnode *q = &p->nodes[i];
        q->op = t->op, q->dtype = t->dtype, q->ndim = t->ndim;
        memcpy(q->shape, t->shape, sizeof q->shape);
        q->attr = t->attr;
        for (int k = 0; k < 3; k++)
            q->src[k] = t->src[k] ? t->src[k]->id : -1;
        q->out = t->is_output;
        q->check = t->is_loss && g->detect_anomaly;
    }
    if (!plan_nodes(p, use_compiler(g), true, &g->metrics)) {
        loom__program_free(p);
        return NULL;
    }
    for (int r = 0; r < loom__nrules; r++)
        __atomic_fetch_add(&loom__rule_fired[r], p->rule_hits[r], __ATOMIC_RELAXED);
    dump_schedule(p);
    if (loom__getenv()->profile &&
        (!(p->prof_ns = loom__calloc((size_t)p->nexec + 1, 8)) ||
         !(p->prof_seen = loom__calloc((size_t)p->nexec + 1, 8)) ||
         !(p->prof_keep = loom__calloc((size_t)(p->nexec + 1) * LOOM_PROF_KEEP, 4)))) {
        loom__program_free(p);
        return NULL;
    }
    return p;
}

loom__program *loom__program_reference(const loom__program *p, const loom__executor *x) {
    loom__program *q = program_new(p->n, x);
    if (!q)
        return NULL;
    q->hash = p->hash;
    for (int64_t i = 0; i < p->n; i++) {
        const loom__pnode *s = &p->nodes[i];
        loom__pnode *t = &q->nodes[i];
        t->op = s->op, t->dtype = s->dtype, t->ndim = s->ndim, t->attr = s->attr;
        memcpy(t->shape, s->shape, sizeof t->shape);
        memcpy(t->src, s->src, sizeof t->src);
        t->out = s->out, t->check = s->check;
    }
    loom_metrics m = {0};
    if (!plan_nodes(q, false, false, &m)) {
        loom__program_free(q);
        return NULL;
    }
    return q;
}

static loom_status steps_finish(loom_graph *g);

static void steps_free(loom_graph *g) {
    steps_finish(g); /* a submitted step reads the programs and the workspace */
    loom__steps *r = g->run;
    for (int64_t i = 0; i < r->nprograms; i++)
        loom__program_free(r->programs[i]);
    loom__free(r->programs);
    loom__free(r->workspace);
    loom__free(r);
    g->run = NULL;
}

static void steps_reset(loom_graph *g) {
    if (g->run->inflight) /* a submitted step runs on (its bindings are the devices') */
        g->run->inflight_reset = true;
    g->run->last = NULL, g->run->kept = NULL;
}

static const loom__steps_hooks steps_hooks = {steps_finish, steps_reset, steps_free};

/* g's run state, made on its first step (graph/ knows it only through steps_hooks); NULL out of
 * memory. */
static loom__steps *steps_of(loom_graph *g) {
    if (!g->run && (g->run = loom__calloc(1, sizeof *g->run))) {
        g->run->ended_loss = NAN;
        g->run_hooks = &steps_hooks;
    }
    return g->run;
}

const loom__program *loom__graph_last(const loom_graph *g) {
    return g->run ? g->run->last : NULL;
}

/* A new program after the first: if a cached program has the same ops and only input shapes differ
 * (the usual cause: a short last batch), say so once, naming the input and both shapes. */
static void warn_recompile(loom_graph *g) {
    for (int64_t k = 0; k < g->run->nprograms && !g->run->warned_recompile; k++) {
        const loom__program *p = g->run->programs[k];
        int64_t diff = -1;
        for (int64_t i = 0; p->n == g->n && i < g->n; i++) {
            const loom_tensor *t = g->nodes[i];
            if (t->op != p->nodes[i].op)
                break;
            if (diff < 0 && t->op == LOOM_OP_INPUT &&
                memcmp(t->shape, p->nodes[i].shape, sizeof(int64_t) * t->ndim) != 0)
                diff = i;
            if (i == g->n - 1 && diff >= 0) {
                const loom_tensor *in = g->nodes[diff];
                loom_tensor old = {.ndim = in->ndim};
                memcpy(old.shape, p->nodes[diff].shape, sizeof old.shape);
                char now_s[96], old_s[96];
                loom__shape_str(in, now_s, sizeof now_s);
                loom__shape_str(&old, old_s, sizeof old_s);
                loom__log(LOOM_LOG_WARN,
                          "step %lld built a new program: input %d is %s%s where the cached "
                          "program has %s; a short last batch does this: drop it (--drop-last) "
                          "or pad it to keep one program",
                          (long long)g->metrics.graphs_built, in->attr.input, now_s,
                          in->role == LOOM_ROLE_BATCH ? " per device" : "", old_s);
                g->run->warned_recompile = true;
            }
        }
    }
}

/* The floating-point operations of g's products on one device, as nanoGPT's estimate counts
 * them: 2 m n k a matmul (a convolution's too: it is one), 4 T^2 D a head of attention forward
 * (its two products) and twice that backward. */
static double product_flops(const loom_graph *g) {
    double f = 0;
    for (int64_t i = 0; i < g->n; i++) {
        const loom_tensor *t = g->nodes[i];
        if (t->op == LOOM_OP_MATMUL && t->src[0] && t->src[0]->ndim >= 2)
            f += 2.0 * (double)loom__numel(t->ndim, t->shape) *
                 (double)t->src[0]->shape[t->src[0]->ndim - 1];
        else if ((t->op == LOOM_OP_ATTENTION || t->op == LOOM_OP_ATTENTIONGRAD) && t->src[0] &&
                 t->src[0]->ndim == 5) { /* qkv (B, T, 3, H, D) */
            const int64_t *q = t->src[0]->shape;
            double fwd =
                4.0 * (double)q[0] * (double)q[3] * (double)q[1] * (double)q[1] * (double)q[4];
            f += t->op == LOOM_OP_ATTENTION ? fwd : 2 * fwd;
        }
    }
    return f;
}

static loom__program *lookup_or_plan(loom_graph *g, loom_status *st) {
    if (!g->run->x)
        g->run->x = loom__executor_default();
    uint64_t h = graph_hash(g);
    for (int64_t i = 0; i < g->run->nprograms; i++) {
        if (g->run->programs[i]->hash == h && g->run->programs[i]->n == g->n) {
            g->metrics.cache_hits++;
            return g->run->programs[i];
        }
    }
    warn_recompile(g);
    double t0 = loom__now();
    loom__program *p = NULL;
    if (loom__grow((void **)&g->run->programs, &g->run->programs_cap, g->run->nprograms + 1,
                   sizeof(void *)) ||
        !(p = plan(g, h))) {
        *st = loom__error(LOOM_ENOMEM, "loom_graph_run: out of memory planning %lld nodes",
                          (long long)g->n);
        return NULL;
    }
    g->run->programs[g->run->nprograms++] = p;
    p->flops = product_flops(g);
    g->metrics.programs_built++;
    g->metrics.plan_seconds += loom__now() - t0;
    if ((int64_t)p->ws_bytes > g->metrics.workspace_bytes)
        g->metrics.workspace_bytes = (int64_t)p->ws_bytes;
    return p;
}

loom_status loom__input_sources(const loom_graph *g, loom__arena *a, bool copy, const void **src) {
    for (int64_t i = 0; i < g->n; i++) {
        const loom_tensor *t = g->nodes[i];
        if (t->op != LOOM_OP_INPUT || (t->role != LOOM_ROLE_PLAIN && t->role != LOOM_ROLE_BATCH))
            continue;
        int64_t numel = t->role == LOOM_ROLE_BATCH
                            ? g->batch_rows * loom__numel(t->ndim - 1, t->shape + 1)
                            : loom__numel(t->ndim, t->shape);
        size_t bytes = loom__dtype_size((loom_dtype)t->dtype) * (size_t)numel;
        const void *data = t->data;
        if (copy && !t->borrowed && data && !(data = loom__arena_copy(a, t->data, bytes)))
            return loom__error(LOOM_ENOMEM,
                               "loom_graph_submit: out of memory copying input %d (%zu bytes)",
                               t->attr.input, bytes);
        src[t->attr.input] = data;
    }
    return LOOM_OK;
}

loom_status loom__bind_inputs(const loom_graph *g, loom__arena *a, int d, int ndev,
                              const void *const *src, const void **inputs) {
    int64_t b = g->batch_rows < 0 ? 0 : g->batch_rows, local = loom__local_rows(g, ndev);
    int64_t start = d * local, real = loom__shard_rows(g, d, ndev);
    for (int64_t i = 0; i < g->n; i++) {
        const loom_tensor *t = g->nodes[i];
        if (t->op != LOOM_OP_INPUT)
            continue;
        const void **slot = &inputs[t->attr.input];
        const char *data = src[t->attr.input];
        size_t row = t->ndim ? loom__dtype_size((loom_dtype)t->dtype) *
                                   (size_t)loom__numel(t->ndim - 1, t->shape + 1)
                             : 0;
        if (t->role == LOOM_ROLE_PLAIN) {
            *slot = data;
        } else if (t->role == LOOM_ROLE_BATCH && real == local) {
            *slot = data + (size_t)start * row;
        } else if (t->role == LOOM_ROLE_BATCH) { /* a padded shard: real rows then zeros */
            char *buf = loom__arena_alloc(a, (size_t)local * row + 1);
            if (!buf)
                return LOOM_ENOMEM;
            if (real > 0)
                memcpy(buf, data + (size_t)start * row, (size_t)real * row);
            *slot = buf;
        } else if (t->role == LOOM_ROLE_MASK) {
            float *m = loom__arena_alloc(a, sizeof(float) * (size_t)(local + 1));
            if (!m)
                return LOOM_ENOMEM;
            for (int64_t k = 0; k < real; k++)
                m[k] = 1.0f;
            *slot = m;
        } else if (t->role == LOOM_ROLE_ROW0) {
            int32_t *r0 = loom__arena_alloc(a, sizeof(int32_t));
            if (!r0)
                return LOOM_ENOMEM;
            *r0 = (int32_t)start;
            *slot = r0;
        } else {
            float *c = loom__arena_alloc(a, sizeof(float));
            if (!c)
                return LOOM_ENOMEM;
            *c = (float)((double)b / ndev);
            *slot = c;
        }
    }
    return LOOM_OK;
}

/* The bindings of a step run here: the graph's workspace and the model's slabs (made current:
 * a step of another graph on devices ends first, and slabs lent to devices come back). */
static loom__bind here_bind(const loom_graph *g, const void **inputs) {
    loom__model_settle(g->model);
    loom__bind b = {.ws = g->run->workspace, .inputs = inputs};
    for (int s = 0; s < LOOM_SLAB_COUNT; s++)
        b.slab[s] = g->model ? g->model->slab[s] : NULL;
    return b;
}

void loom__graph_keep(loom_graph *g) {
    const loom__program *p = loom__graph_last(g);
    if (!p || g->run->kept || !g->runner)
        return;
    const void **kept = loom__arena_alloc(&g->arena, sizeof(void *) * (size_t)(g->n * g->nlocal));
    for (int64_t i = 0; kept && i < g->n; i++) {
        const loom_tensor *t = g->nodes[i];
        size_t bytes = loom__dtype_size((loom_dtype)t->dtype) * (size_t)loom_tensor_numel(t);
        for (int d = 0; kept && t->is_output && d < g->nlocal; d++)
            if (!(kept[i * g->nlocal + d] = loom__arena_copy(
                      &g->arena, g->runner->data(g->runner_ctx, p, (int32_t)i, d), bytes)))
                kept = NULL;
    }
    g->run->kept = kept;
    if (!kept)
        g->run->last = NULL;
}

const void *loom__node_data(const loom_graph *g, const loom__program *p, int32_t id, int d) {
    if (g->run->kept && p == g->run->last)
        return g->run->kept[id * g->nlocal + d];
    if (g->runner)
        return g->runner->data(g->runner_ctx, p, id, d);
    loom__bind b = here_bind(g, g->run->last_inputs);
    return loom__addr(p, &b, id);
}

/* The first element of node id of p on every device of every process, in device order (across
 * processes, a collective): in buf (room for 256) up to 256 devices, beyond in memory the caller
 * frees (not buf); NULL if it cannot be had. No allocation in a step of up to 256 devices. */
static double *device_values(const loom_graph *g, const loom__program *p, int32_t id, loom_dtype dt,
                             double *buf) {
    double *all = g->ndev <= 256 ? buf : loom__malloc(sizeof(double) * (size_t)g->ndev);
    double mine[256], *here = g->nlocal == g->ndev ? all : mine;
    for (int d = 0; all && d < g->nlocal; d++)
        here[d] = loom__first_value(dt, loom__node_data(g, p, id, d));
    if (all && here == mine &&
        g->runner->allgather(g->runner_ctx, mine, sizeof(double) * (size_t)g->nlocal, all)) {
        if (all != buf)
            loom__free(all);
        return NULL;
    }
    return all;
}

double loom__node_mean(const loom_graph *g, const loom__program *p, int32_t id, loom_dtype dt) {
    double buf[256], sum = 0, *all = device_values(g, p, id, dt, buf);
    for (int d = 0; all && d < g->ndev; d++)
        sum += all[d];
    if (all && all != buf)
        loom__free(all);
    return all ? sum / g->ndev : NAN;
}

/* One device, on this thread. */
static loom_status run_here(loom_graph *g, loom__program *p) {
    if (loom__scratch(&g->run->workspace, &g->run->workspace_size, p->ws_bytes))
        return LOOM_ENOMEM;
    size_t slots = sizeof(void *) * (size_t)(g->ninputs + 1);
    const void **inputs = loom__arena_alloc(&g->arena, slots);
    const void **src = loom__arena_alloc(&g->arena, slots);
    if (!inputs || !src)
        return loom__error(LOOM_ENOMEM, "loom_graph_run: out of memory");
    /* the step ends before submit returns: it reads the caller's buffers in place */
    loom_status st = loom__input_sources(g, &g->arena, false, src);
    if (!st)
        st = loom__bind_inputs(g, &g->arena, 0, 1, src, inputs);
    if (st)
        return st;
    loom__bind b = here_bind(g, inputs);
    double t0 = loom__now();
    st = p->x->run(p->x, p, &b);
    g->metrics.exec_seconds += loom__now() - t0;
    g->run->last_inputs = inputs;
    return st;
}

loom_status loom_graph_submit(loom_graph *g) {
    if (!g)
        return loom__error(LOOM_EINVAL, "loom_graph_submit: NULL graph");
    loom_status st = loom__graph_finish(g); /* the step before, if still running */
    if (!st)
        st = loom_env_check();
    if (!st && !steps_of(g))
        st = loom__error(LOOM_ENOMEM, "loom_graph_submit: out of memory");
    if (st)
        return st;
    g->run->last = NULL, g->run->kept = NULL;
    if (g->err)
        return loom__error(g->err, "%s", g->errmsg);
    g->metrics.graphs_built++;
    g->metrics.nodes = g->n;
    loom__program *p = lookup_or_plan(g, &st);
    if (!p)
        return st;
    g->metrics.kernels = p->nexec;
    g->metrics.flops = p->flops;
    g->run->loss_id = -1;
    for (int64_t i = g->n - 1; i >= 0 && g->run->loss_id < 0; i--)
        if (g->nodes[i]->is_loss)
            g->run->loss_id = (int32_t)i, g->run->loss_dtype = g->nodes[i]->dtype;
    if (!g->runner) { /* one device, on this thread: the step ends here */
        g->run->inflight = p, g->run->inflight_reset = false;
        g->run->ended_status = run_here(g, p);
        return loom__graph_finish(g);
    }
    st = g->runner->submit(g->runner_ctx, g, p);
    if (st)
        return st;
    g->run->inflight = p, g->run->inflight_reset = false;
    if (g->model) /* the host's ways into the model's slabs end this step first */
        g->model->running = g;
    return LOOM_OK;
}

/* The mean of the loss over every device (node id of p; *mean), and ERANGE naming the first
 * device whose loss is NaN or infinite. Such a step has run whole (anomaly detection is what
 * stops one at its loss), so the caller stops training. Across processes, a collective. */
static loom_status step_loss(const loom_graph *g, const loom__program *p, int32_t id,
                             double *mean) {
    int first = -1, bad = 0;
    double v = 0, sum = 0, buf[256],
           *all = device_values(g, p, id, (loom_dtype)g->run->loss_dtype, buf);
    *mean = NAN;
    if (!all)
        return loom__error(LOOM_ENOMEM, "the loss of every device: out of memory");
    for (int d = 0; d < g->ndev; d++) {
        sum += all[d];
        if (!isfinite(all[d]))
            first = first < 0 ? d : first, v = first == d ? all[d] : v, bad++;
    }
    if (all != buf)
        loom__free(all);
    *mean = sum / g->ndev;
    if (!bad)
        return LOOM_OK;
    char where[64] = "";
    if (g->runner)
        snprintf(where, sizeof where, " on device %d%s", first, bad > 1 ? " (and others)" : "");
    return loom__error(LOOM_ERANGE, "the loss is %s%s; the step's update has run",
                       isnan(v) ? "NaN"
                       : v > 0  ? "+Inf"
                                : "-Inf",
                       where);
}

loom_status loom__graph_finish(loom_graph *g) {
    return g->run ? steps_finish(g) : LOOM_OK;
}

static loom_status steps_finish(loom_graph *g) {
    loom__program *p = g->run->inflight;
    if (!p)
        return LOOM_OK;
    loom_status st = g->runner ? g->runner->wait(g->runner_ctx, g) : g->run->ended_status;
    bool ran = !st;
    g->run->ended_loss = NAN;
    if (ran && g->run->loss_id >= 0)
        st = step_loss(g, p, g->run->loss_id, &g->run->ended_loss);
    g->run->ended_status = st;
    if (ran && !g->run->inflight_reset) /* (a non-finite loss's outputs stay readable) */
        g->run->last = p;
    g->run->inflight = NULL;
    if (g->model && g->model->running == g)
        g->model->running = NULL;
    return st;
}

loom_status loom_graph_wait(loom_graph *g, double *loss) {
    if (!g)
        return loom__error(LOOM_EINVAL, "loom_graph_wait: NULL graph");
    if (!g->run) { /* no step yet */
        if (loss)
            *loss = NAN;
        return LOOM_OK;
    }
    loom_status st = g->run->inflight ? loom__graph_finish(g) : g->run->ended_status;
    if (loss)
        *loss = g->run->ended_loss;
    return st;
}

loom_status loom_graph_run(loom_graph *g) {
    if (!g)
        return loom__error(LOOM_EINVAL, "loom_graph_run: NULL graph");
    loom_status st = loom_graph_submit(g);
    return st ? st : loom_graph_wait(g, NULL);
}

const void *loom_tensor_data(const loom_tensor *t) {
    if (!t)
        return NULL;
    loom_graph *g = t->g;
    if (!g->run)
        return NULL;
    if (g->run->inflight && !g->run->inflight_reset) /* its step, submitted: it ends first */
        loom__graph_finish(g);
    const loom__program *p = g->run->last;
    if (!p || !t->is_output || t->id >= p->n)
        return NULL;
    return loom__node_data(g, p, t->id, 0);
}

double loom_item(const loom_tensor *t) {
    const void *p = t ? loom_tensor_data(t) : NULL;
    if (!p || loom_tensor_numel(t) < 1)
        return NAN;
    /* the mean over devices (a loss is normalised so that this is global) */
    return loom__node_mean(t->g, loom__graph_last(t->g), t->id, (loom_dtype)t->dtype);
}

int64_t loom_tensor_gather(const loom_tensor *t, void *dst) {
    if (!t || !t->ndim || !loom_tensor_data(t))
        return -1;
    const loom_graph *g = t->g;
    size_t block = loom__dtype_size((loom_dtype)t->dtype) * (size_t)loom_tensor_numel(t);
    size_t row = block / (size_t)(t->shape[0] ? t->shape[0] : 1);
    bool across = g->nlocal < g->ndev; /* devices of other processes: everyone's copies, first */
    char *mine = across ? loom__malloc(block * (size_t)g->nlocal + 1) : NULL;
    char *all = across ? loom__malloc(block * (size_t)g->ndev + 1) : NULL;
    for (int d = 0; across && mine && d < g->nlocal; d++)
        memcpy(mine + (size_t)d * block, loom__node_data(g, loom__graph_last(g), t->id, d), block);
    if (across && (!mine || !all ||
                   g->runner->allgather(g->runner_ctx, mine, block * (size_t)g->nlocal, all))) {
        loom__free(mine), loom__free(all);
        return -1;
    }
    int64_t rows = 0;
    for (int d = 0; d < (across ? g->ndev : g->nlocal); d++) {
        int64_t r = loom__shard_rows(g, across ? d : g->dev0 + d, g->ndev);
        r = r < t->shape[0] ? r : t->shape[0];
        const char *src =
            across ? all + (size_t)d * block : loom__node_data(g, loom__graph_last(g), t->id, d);
        memcpy((char *)dst + (size_t)rows * row, src, (size_t)r * row);
        rows += r;
    }
    loom__free(mine), loom__free(all);
    return rows;
}
