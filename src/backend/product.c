/*
 * product.c - products (MATMUL): loom's sgemm (gemm.c) where the CPU has AVX-512, BLAS otherwise,
 * with the epilogues a product or a pool gradient runs on each block of its output while in cache.
 */
#include "kernels.h"

/* ---- matmul through BLAS ----------------------------------------------------------------------
 */

bool loom__blas_layout(int64_t rows, int64_t cols, int64_t srow, int64_t scol, bool *trans,
                       int64_t *ld) {
    if (rows == 0 || cols == 0) { /* nothing is read */
        *trans = false, *ld = cols > 1 ? cols : 1;
        return true;
    }
    if (cols <= 1 || scol == 1) {
        int64_t l = rows <= 1 ? (cols > 1 ? cols : 1) : srow;
        if (rows <= 1 || l >= (cols > 1 ? cols : 1)) {
            *trans = false, *ld = l;
            return true;
        }
    }
    if (rows <= 1 || srow == 1) {
        int64_t l = cols <= 1 ? (rows > 1 ? rows : 1) : scol;
        if (cols <= 1 || l >= (rows > 1 ? rows : 1)) {
            *trans = true, *ld = l;
            return true;
        }
    }
    return false;
}

static void blas_once(void) {
    openblas_set_num_threads(1);
}

void loom__blas_init(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, blas_once);
}

const char *loom__blas_name(void) {
    return openblas_get_config();
}

bool loom__use_own_gemm(void) {
    const char *m = loom__getenv()->matmul;
    return loom__gemm_available() && !(m && strcmp(m, "blas") == 0);
}

/* ---- epilogues: a generated kernel run on each block of a library kernel's output ------------
 */

/* The epilogue of library node id (its generated kernel, and its sinks); with sinks but no
 * generated kernel the rows are the node's own values, copied into its rows buffer. */
void loom__epilogue_init(epilogue *e, const loom__program *p, const loom__bind *b, int32_t id) {
    const loom__pnode *t = &p->nodes[id];
    const loom__form *x = loom__sinks_of(p, id);
    int32_t nsinks = x ? x->u.sinks.n : 0;
    bool keep = x && x->u.sinks.keep;
    e->k = t->epi >= 0 ? &p->fused[t->epi] : NULL;
    for (int a = 0; e->k && a < e->k->nargs; a++)
        e->args[a] = a == e->k->epi_arg ? NULL : loom__addr(p, b, e->k->args[a]);
    const loom__pnode *r = &p->nodes[x ? x->u.sinks.stream : e->k->root];
    e->rows = r->shape[0], e->cols = r->shape[1];
    e->root = e->k   ? e->args[0] /* the pool gradient's plane, dy scratch, then the rows */
              : keep ? loom__addr(p, b, id) /* or its own values, whole */
                     : (float *)(b->ws + t->ws_off) + t->shape[2] * t->shape[3] +
                           loom__numel(4, p->nodes[t->src[1]].shape);
    for (int q = 0; q < nsinks; q++) {
        int32_t s = x->u.sinks.sink[q];
        const loom__pnode *sk = &p->nodes[s];
        if (sk->op == LOOM_OP_SUM) {
            e->sum_out = loom__addr(p, b, s);
            continue;
        }
        loom__gmat gb = {loom__addr(p, b, sk->src[1]), {0}, {0}};
        loom__operand_dims(&p->nodes[sk->src[1]], &gb.row, &gb.col);
        e->dot_out = loom__addr(p, b, s), e->dot_n = sk->shape[1];
        loom__dot_rows_begin(&e->dot, &gb, sk->shape[1], e->cols,
                             e->root + LOOM_SINK_ROWS * e->cols);
    }
    e->sinks = nsinks > 0, e->keep = keep;
}

/* The epilogue over flat elements [lo, hi) of the library kernel's output, values at v. With
 * sinks, each row once complete goes into them while it is still in cache: the sum along it (the
 * reduction kernel's own lanes path) and, LOOM_SINK_ROWS rows at a time, its product rows. */
static void epilogue_range(epilogue *e, int64_t lo, int64_t hi, const float *v) {
    while (lo < hi) {
        int64_t i = lo / e->cols, j0 = lo % e->cols;
        int64_t j1 = hi - lo < e->cols - j0 ? j0 + (hi - lo) : e->cols;
        int64_t held = i % LOOM_SINK_ROWS; /* with sinks, the rows kept */
        float *row = e->root + (e->sinks && !e->keep ? held : i) * e->cols;
        e->args[0] = row + j0;
        if (e->k)
            e->k->part(e->args, i, j0, j1, v);
        else if (v != row + j0) /* (pool_float may have written it there: loom__plane_place) */
            memcpy(row + j0, v, sizeof(float) * (size_t)(j1 - j0));
        if (e->sinks && j1 == e->cols && e->sum_out)
            LOOM_LANE_REDUCE(float, 0, LOOM_LANE_ADD, row, e->cols, e->sum_out[i]);
        if (e->sinks && j1 == e->cols && e->dot_out &&
            (held == LOOM_SINK_ROWS - 1 || i == e->rows - 1))
            loom__dot_rows_run(&e->dot, e->root, e->cols, held + 1,
                               e->dot_out + (i - held) * e->dot_n);
        v += j1 - j0, lo += j1 - j0;
    }
}

static void product_block_done(void *ctx, int64_t jc, int64_t nc) {
    epilogue *e = ctx;
    for (int64_t i = 0; i < e->rows_of; i++)
        epilogue_range(e, i * e->n_of + jc, i * e->n_of + jc + nc, e->buf + i * LOOM_GEMM_NC);
}

void loom__plane_done(void *ctx, int64_t plane, const float *v) {
    epilogue *e = ctx;
    epilogue_range(e, plane * e->plane, (plane + 1) * e->plane, v);
}

/* Where a pool gradient with sinks but no generated kernel writes a plane: in place in the rows
 * it keeps (a plane lies within a row there), so that nothing is copied. */
float *loom__plane_place(void *ctx, int64_t plane) {
    epilogue *e = ctx;
    int64_t lo = plane * e->plane, i = lo / e->cols;
    return e->root + (e->keep ? i : i % LOOM_SINK_ROWS) * e->cols + lo % e->cols;
}

/* Product node id's operands as matrices (their first elements, rows and columns); returns K. */
int64_t loom__product_operands(const loom__program *p, const loom__bind *b, int32_t id,
                               loom__gmat *ga, loom__gmat *gb) {
    const loom__pnode *t = &p->nodes[id];
    ga->p = loom__addr(p, b, t->src[0]), gb->p = loom__addr(p, b, t->src[1]);
    loom__operand_dims(&p->nodes[t->src[0]], &ga->row, &ga->col);
    loom__operand_dims(&p->nodes[t->src[1]], &gb->row, &gb->col);
    return loom__numel(ga->col.n, ga->col.size);
}

/* The next index over a product's nb batch dims (an odometer) and its operands' offsets. */
static void next_batch(int nb, const int64_t *shape, const int64_t *sa, const int64_t *sb,
                       int64_t *idx, int64_t *oa, int64_t *ob) {
    for (int d = nb - 1; d >= 0; d--) {
        idx[d]++;
        *oa += sa[d], *ob += sb[d];
        if (idx[d] < shape[d])
            return;
        *oa -= sa[d] * shape[d], *ob -= sb[d] * shape[d];
        idx[d] = 0;
    }
}

loom_status loom__k_matmul(const loom__program *p, const loom__bind *b, int32_t id) {
    const loom__pnode *t = &p->nodes[id], *A = &p->nodes[t->src[0]], *B = &p->nodes[t->src[1]];
    int nd = t->ndim;
    const loom__form *x = t->epi >= 0 ? loom__form_get(p, id, LOOM_FORM_ACT) : NULL;
    if (x) { /* straight into the epilogue's root, done as it stores */
        loom__gmat ga, gb;
        int64_t k = loom__product_operands(p, b, id, &ga, &gb);
        /* the leaf added: a bias row (broadcast down: row stride 0) or a matrix */
        int32_t add = x->u.act.add, mask = x->u.act.mask, sum = x->u.act.sum;
        const loom__pnode *v = add >= 0 ? &p->nodes[add] : NULL;
        const float *vp = v ? loom__addr(p, b, add) : NULL;
        bool matrix = v && v->lay.stride[0] != 0;
        loom__gemm_act act = {.bias = v && !matrix ? vp : NULL,
                              .relu = x->u.act.relu,
                              .mask = mask >= 0 ? loom__addr(p, b, mask) : NULL,
                              .ldm = mask >= 0 ? p->nodes[mask].lay.stride[0]
                                     : matrix  ? v->lay.stride[0]
                                               : 0,
                              .colsum = sum >= 0 ? loom__addr(p, b, sum) : NULL,
                              .addend = matrix ? vp : NULL};
        loom__sgemm_act(t->shape[0], t->shape[1], k, &ga, &gb,
                        loom__addr(p, b, p->fused[t->epi].root), t->shape[1], &act,
                        b->ws + p->scratch);
        return LOOM_OK;
    }
    if (t->epi >= 0) { /* column blocks into the node's buffer, each then through the epilogue */
        loom__gmat ga, gb;
        int64_t k = loom__product_operands(p, b, id, &ga, &gb);
        epilogue e = {0};
        loom__epilogue_init(&e, p, b, id);
        e.rows_of = t->shape[0], e.n_of = t->shape[1];
        float *buf = (float *)(b->ws + t->ws_off);
        e.buf = buf;
        loom__sgemm_blocks(t->shape[0], t->shape[1], k, &ga, &gb, buf, LOOM_GEMM_NC,
                           product_block_done, &e, b->ws + p->scratch);
        return LOOM_OK;
    }
    if (t->dtype == LOOM_F32 && loom__use_own_gemm()) { /* any strides, grouped views too */
        int64_t batch = loom__numel(nd - 2, t->shape), idx[MAXD] = {0}, oa = 0, ob = 0;
        int64_t m = t->shape[nd - 2], n = t->shape[nd - 1];
        loom__gmat ga, gb;
        int64_t k = loom__product_operands(p, b, id, &ga, &gb);
        float *o = loom__addr(p, b, id);
        loom__gdim crow = {.n = 1, .size = {m}, .stride = {n}},
                   ccol = {.n = 1, .size = {n}, .stride = {1}};
        const float *a0 = ga.p, *b0 = gb.p;
        for (int64_t r = 0; r < batch; r++) {
            ga.p = a0 + oa, gb.p = b0 + ob;
            if (m * n > 0)
                loom__sgemm_g(m, n, k, &ga, &gb, o + r * m * n, crow, ccol, false,
                              b->ws + p->scratch);
            next_batch(nd - 2, t->shape, A->lay.stride, B->lay.stride, idx, &oa, &ob);
        }
        return LOOM_OK;
    }
    int64_t m = t->shape[nd - 2], n = t->shape[nd - 1], k = A->shape[nd - 1];
    bool ta = false, tb = false;
    int64_t lda = 1, ldb = 1;
    bool ok = loom__blas_layout(m, k, A->lay.stride[nd - 2], A->lay.stride[nd - 1], &ta, &lda) &&
              loom__blas_layout(k, n, B->lay.stride[nd - 2], B->lay.stride[nd - 1], &tb, &ldb);
    LOOM_ASSERT(ok); /* the planner materializes other layouts */
    size_t es = loom__dtype_size((loom_dtype)t->dtype);
    unsigned char *o = loom__addr(p, b, id);
    const unsigned char *pa = loom__addr(p, b, t->src[0]), *pb = loom__addr(p, b, t->src[1]);
    int64_t batch = loom__numel(nd - 2, t->shape), idx[MAXD] = {0}, oa = 0, ob = 0;
    for (int64_t r = 0; r < batch; r++) {
        unsigned char *po = o + (size_t)(r * m * n) * es;
        if (k == 0 && m * n > 0) {
            memset(po, 0, (size_t)(m * n) * es);
        } else if (m * n > 0 && t->dtype == LOOM_F64) {
            cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans,
                        tb ? CblasTrans : CblasNoTrans, (int)m, (int)n, (int)k, 1.0,
                        (const double *)(pa + (size_t)oa * es), (int)lda,
                        (const double *)(pb + (size_t)ob * es), (int)ldb, 0.0, (double *)po,
                        (int)(n > 1 ? n : 1));
        } else if (m * n > 0) {
            cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans,
                        tb ? CblasTrans : CblasNoTrans, (int)m, (int)n, (int)k, 1.0f,
                        (const float *)(pa + (size_t)oa * es), (int)lda,
                        (const float *)(pb + (size_t)ob * es), (int)ldb, 0.0f, (float *)po,
                        (int)(n > 1 ? n : 1));
        }
        next_batch(nd - 2, t->shape, A->lay.stride, B->lay.stride, idx, &oa, &ob);
    }
    return LOOM_OK;
}
