/*
 * product.c - products (MATMUL): loom's sgemm (gemm.c) where the CPU has AVX-512, else float32
 * products by gemm256.c where it has AVX2 and FMA (through the BLAS path's blocks), BLAS otherwise,
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

/* LOOM_MATMUL=blas: OpenBLAS for every product. */
static bool blas_asked(void) {
    const char *m = loom__getenv()->matmul;
    return m && strcmp(m, "blas") == 0;
}

bool loom__use_own_gemm(void) {
    return loom__gemm_available() && !blas_asked();
}

bool loom__use_gemm256(void) {
    return !loom__gemm_available() && loom__gemm256_available() && !blas_asked();
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

int64_t loom__epilogue_buffer_cols(void) {
    return loom__use_own_gemm() ? LOOM_GEMM_NC : 0;
}

/* A block of columns [jc, jc + nc) of the product, its rows ld apart in e->buf
 * (loom__sgemm_blocks': LOOM_GEMM_NC; loom__sgemm256_blocks': nc), through the epilogue. */
static void block_done(epilogue *e, int64_t jc, int64_t nc, int64_t ld) {
    for (int64_t i = 0; i < e->rows_of; i++)
        epilogue_range(e, i * e->n_of + jc, i * e->n_of + jc + nc, e->buf + i * ld);
}

static void product_block_done256(void *ctx, int64_t jc, int64_t nc) {
    block_done(ctx, jc, nc, nc);
}

/* A product with an epilogue on AVX2, its columns split across a device's cores: each worker
 * its blocks in its own scratch (loom__product_scratch_bytes) and its own epilogue state. */
typedef struct {
    const loom__program *p;
    const loom__bind *b;
    loom__gmat ga, gb;
    int64_t k, m;
    epilogue e;
} epi_job;

static void epi_part(void *ctx, int64_t lo, int64_t hi, int w) {
    const epi_job *j = ctx;
    unsigned char *scratch = loom__scratch_of(j->p, j->b, w);
    epilogue e = j->e;
    float *buf = loom__gemm256_room(scratch);
    e.buf = buf;
    loom__sgemm256_blocks(j->m, hi - lo, j->k, &j->ga, &j->gb, lo, buf,
                          hi - lo < LOOM_GEMM256_NC ? hi - lo : LOOM_GEMM256_NC,
                          product_block_done256, &e, scratch);
}

static loom__gdim gd1(int64_t size, int64_t stride) {
    return (loom__gdim){.n = 1, .size = {size}, .stride = {stride}};
}

/* A product on loom's AVX-512 sgemm (one of its batch at most), split or not across a device's
 * cores: blocks of C's rows or columns (loom__gemm_split: each computed alone as the whole is),
 * by worker w in its own scratch; an epilogue's blocks, when split, in the room after it
 * (loom__product_scratch_bytes), unsplit in the node's buffer as before. */
typedef struct {
    const loom__program *p;
    const loom__bind *b;
    loom__gemm_via via;
    int64_t m, n, k, block;
    bool rows, split;
    loom__gmat ga, gb;
    float *c;
    loom__gdim crow, ccol;
    loom__gemm_act act; /* via ACT */
    epilogue e;         /* via BLOCKS */
} own_job;

typedef struct {
    epilogue e;
    int64_t at; /* the part's first column */
} part_epilogue;

static void part_block_done(void *ctx, int64_t jc, int64_t nc) {
    part_epilogue *x = ctx;
    block_done(&x->e, x->at + jc, nc, LOOM_GEMM_NC);
}

static void own_part(void *ctx, int64_t lo, int64_t hi, int w) {
    const own_job *j = ctx;
    unsigned char *scratch = loom__scratch_of(j->p, j->b, w);
    int64_t extent = j->rows ? j->m : j->n;
    for (int64_t q = lo; q < hi; q++) {
        int64_t at = q * j->block, len = extent - at < j->block ? extent - at : j->block;
        int64_t m = j->m, n = j->n, i0 = j->rows ? at : 0, j0 = j->rows ? 0 : at;
        loom__gmat a = j->ga, b = j->gb;
        float *c = j->c;
        loom__gdim crow = j->crow, ccol = j->ccol;
        loom__gemm_part(j->rows, at, len, &m, &n, &a, &b, &c, &crow, &ccol);
        if (j->via == LOOM_GEMM_VIA_G) {
            loom__sgemm_g(m, n, j->k, &a, &b, c, crow, ccol, false, scratch);
        } else if (j->via == LOOM_GEMM_VIA_ACT) {
            loom__gemm_act act = j->act;
            act.bias = act.bias ? act.bias + j0 : NULL;
            act.mask = act.mask ? act.mask + i0 * act.ldm + j0 : NULL;
            act.addend = act.addend ? act.addend + i0 * act.ldm + j0 : NULL;
            act.colsum = act.colsum ? act.colsum + j0 : NULL;
            loom__sgemm_act(m, n, j->k, &a, &b, c, crow.stride[0], &act, scratch);
        } else {
            float *buf = j->split ? loom__gemm_room(scratch) : j->c;
            part_epilogue x = {j->e, at};
            x.e.buf = buf;
            loom__sgemm_blocks(m, n, j->k, &a, &b, buf, LOOM_GEMM_NC, part_block_done, &x, scratch);
        }
    }
}

/* The job of an M x N product into row-major c (rows ldc apart), via loom__sgemm_g, _act or
 * _blocks (its act or e then set). */
static own_job own_job_of(const loom__program *p, const loom__bind *b, loom__gemm_via via,
                          int64_t m, int64_t n, int64_t k, const loom__gmat *ga,
                          const loom__gmat *gb, float *c, int64_t ldc) {
    return (own_job){.p = p,
                     .b = b,
                     .via = via,
                     .m = m,
                     .n = n,
                     .k = k,
                     .ga = *ga,
                     .gb = *gb,
                     .c = c,
                     .crow = gd1(m, ldc),
                     .ccol = gd1(n, 1)};
}

/* Products of fewer multiply-adds stay on one core: handing half to a helper costs more. */
#define OWN_SPLIT_MIN (2 * LOOM_SPLIT_MIN)

static void own_product(own_job *j, loom__team *team) {
    double work = (double)j->m * (double)j->n * (double)j->k;
    int parts = work >= OWN_SPLIT_MIN && !(j->via == LOOM_GEMM_VIA_BLOCKS && j->e.sinks)
                    ? loom__team_size(team)
                    : 1;
    j->block = loom__gemm_split(j->m, j->n, j->k, &j->ga, &j->gb, j->crow, j->ccol, false, j->via,
                                j->act.colsum != NULL, parts, &j->rows);
    j->split = j->block > 0;
    if (!j->split) {
        j->rows = false, j->block = j->n;
        own_part(j, 0, 1, 0);
        return;
    }
    int64_t extent = j->rows ? j->m : j->n;
    loom__team_for(team, (extent + j->block - 1) / j->block, 1, own_part, j);
}

bool loom__product_blocks_ok(const loom__program *p, int32_t id, int64_t nc) {
    const loom__pnode *m = &p->nodes[id];
    loom__gmat a = {0}, b = {0};
    loom__operand_dims(&p->nodes[m->src[0]], &a.row, &a.col);
    loom__operand_dims(&p->nodes[m->src[1]], &b.row, &b.col);
    return loom__use_gemm256() && m->dtype == LOOM_F32 && loom__gemm256_blocks_ok(&a, &b, nc);
}

size_t loom__product_scratch_bytes(const loom__program *p, int32_t id) {
    const loom__pnode *t = &p->nodes[id];
    int32_t f = t->fused_into;
    if (loom__use_own_gemm()) /* and a block of all its rows for its epilogue, split (own_part),
                               * or a strided fold's blocks */
        return loom__gemm_scratch_bytes() +
               (t->epi >= 0 && !loom__form_get(p, id, LOOM_FORM_ACT)
                    ? sizeof(float) * (size_t)(t->shape[0] * LOOM_GEMM_NC) + 64
                : f >= 0 && p->nodes[f].op == LOOM_OP_FOLD &&
                        (p->nodes[f].attr.win.sh > 1 || p->nodes[f].attr.win.sw > 1)
                    ? loom__fold_blocks_bytes(p, f, id)
                    : 0);
    if (!loom__use_gemm256())
        return 0;
    size_t room =
        t->epi >= 0 /* a block of all its rows, for its epilogue (epi_part) */
            ? sizeof(float) * (size_t)(t->shape[0] * LOOM_GEMM256_NC) + 64
            : f >= 0 && p->nodes[f].op == LOOM_OP_FOLD ? loom__fold_blocks_bytes(p, f, id) : 0;
    bool view = room > 0 || p->nodes[t->src[1]].gndim;
    return loom__gemm256_scratch_bytes() + (view ? loom__gemm256_view_bytes() : 0) + room;
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

/* A product through BLAS, over its batch dims, split or not across a device's cores. */
#define BLAS_BLOCKS 4
typedef enum { SPLIT_NONE, SPLIT_BATCH, SPLIT_ROWS, SPLIT_COLS } blas_split;
typedef struct {
    const loom__program *p;
    const loom__bind *b;
    const loom__pnode *t, *A, *B;
    int64_t m, n, k, lda, ldb, batch, block;
    bool ta, tb, own; /* own: float32 by loom__sgemm256 */
    bool view;        /* B a compound view (gb), read by loom__sgemm256_view */
    loom__gmat gb;
    size_t es;
    unsigned char *o;
    const unsigned char *pa, *pb;
    blas_split split;
} blas_job;

/* One product: rows [i0, i0 + m) and columns [j0, j0 + n) of the output at po (n_all columns a
 * row), from the operands at pa, pb (their first elements), by worker w. */
static void blas_one(const blas_job *j, unsigned char *po, const unsigned char *pa,
                     const unsigned char *pb, int64_t i0, int64_t m, int64_t j0, int64_t n, int w) {
    size_t es = j->es;
    int64_t ldc = j->n > 1 ? j->n : 1;
    po += (size_t)(i0 * j->n + j0) * es;
    pa += (size_t)(i0 * (j->ta ? 1 : j->lda)) * es;
    pb += j->view ? 0 : (size_t)(j0 * (j->tb ? j->ldb : 1)) * es;
    if (m * n == 0)
        return;
    if (j->view) {
        loom__sgemm256_view(j->ta, m, n, j->k, (const float *)pa, j->lda, &j->gb, j0, (float *)po,
                            ldc, loom__scratch_of(j->p, j->b, w));
    } else if (j->k == 0) {
        for (int64_t i = 0; i < m; i++)
            memset(po + (size_t)(i * j->n) * es, 0, (size_t)n * es);
    } else if (j->own) {
        loom__sgemm256(j->ta, j->tb, m, n, j->k, (const float *)pa, j->lda, (const float *)pb,
                       j->ldb, (float *)po, ldc, loom__scratch_of(j->p, j->b, w));
    } else if (j->t->dtype == LOOM_F64) {
        cblas_dgemm(CblasRowMajor, j->ta ? CblasTrans : CblasNoTrans,
                    j->tb ? CblasTrans : CblasNoTrans, (int)m, (int)n, (int)j->k, 1.0,
                    (const double *)pa, (int)j->lda, (const double *)pb, (int)j->ldb, 0.0,
                    (double *)po, (int)ldc);
    } else {
        cblas_sgemm(CblasRowMajor, j->ta ? CblasTrans : CblasNoTrans,
                    j->tb ? CblasTrans : CblasNoTrans, (int)m, (int)n, (int)j->k, 1.0f,
                    (const float *)pa, (int)j->lda, (const float *)pb, (int)j->ldb, 0.0f,
                    (float *)po, (int)ldc);
    }
}

/* Blocks [lo, hi): products of the batch, or blocks of rows or columns of the one product. */
static void blas_part(void *ctx, int64_t lo, int64_t hi, int w) {
    const blas_job *j = ctx;
    int nd = j->t->ndim;
    if (j->split == SPLIT_ROWS || j->split == SPLIT_COLS) {
        bool rows = j->split == SPLIT_ROWS;
        for (int64_t q = lo; q < hi; q++) {
            int64_t at = q * j->block, len = (rows ? j->m : j->n) - at;
            len = len < j->block ? len : j->block;
            blas_one(j, j->o, j->pa, j->pb, rows ? at : 0, rows ? len : j->m, rows ? 0 : at,
                     rows ? j->n : len, w);
        }
        return;
    }
    int64_t idx[MAXD] = {0}, oa = 0, ob = 0, r = lo;
    for (int d = nd - 3; d >= 0; d--) { /* batch index lo's operands */
        idx[d] = r % j->t->shape[d], r /= j->t->shape[d];
        oa += idx[d] * j->A->lay.stride[d], ob += idx[d] * j->B->lay.stride[d];
    }
    for (r = lo; r < hi; r++) {
        blas_one(j, j->o + (size_t)(r * j->m * j->n) * j->es, j->pa + (size_t)oa * j->es,
                 j->pb + (size_t)ob * j->es, 0, j->m, 0, j->n, w);
        next_batch(nd - 2, j->t->shape, j->A->lay.stride, j->B->lay.stride, idx, &oa, &ob);
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
        own_job j = own_job_of(p, b, LOOM_GEMM_VIA_ACT, t->shape[0], t->shape[1], k, &ga, &gb,
                               loom__addr(p, b, p->fused[t->epi].root), t->shape[1]);
        j.act = act;
        own_product(&j, b->team);
        return LOOM_OK;
    }
    if (t->epi >= 0) { /* column blocks into the node's buffer, each then through the epilogue */
        loom__gmat ga, gb;
        int64_t k = loom__product_operands(p, b, id, &ga, &gb);
        epilogue e = {0};
        loom__epilogue_init(&e, p, b, id);
        e.rows_of = t->shape[0], e.n_of = t->shape[1];
        if (!loom__use_own_gemm()) { /* AVX2: the device's cores take columns apart */
            epi_job j = {p, b, ga, gb, k, t->shape[0], e};
            double work = (double)t->shape[0] * (double)t->shape[1] * (double)k;
            loom__team_for(work >= 2 * LOOM_SPLIT_MIN ? b->team : NULL, t->shape[1], 16, epi_part,
                           &j);
            return LOOM_OK;
        }
        own_job j = own_job_of(p, b, LOOM_GEMM_VIA_BLOCKS, t->shape[0], t->shape[1], k, &ga, &gb,
                               (float *)(b->ws + t->ws_off), /* unsplit: the node's buffer */
                               LOOM_GEMM_NC);
        j.e = e;
        own_product(&j, b->team);
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
        if (batch == 1 && m * n > 0) {
            own_job j = own_job_of(p, b, LOOM_GEMM_VIA_G, m, n, k, &ga, &gb, o, n);
            own_product(&j, b->team);
            return LOOM_OK;
        }
        for (int64_t r = 0; r < batch; r++) {
            ga.p = a0 + oa, gb.p = b0 + ob;
            if (m * n > 0)
                loom__sgemm_g(m, n, k, &ga, &gb, o + r * m * n, crow, ccol, false,
                              b->ws + p->scratch);
            next_batch(nd - 2, t->shape, A->lay.stride, B->lay.stride, idx, &oa, &ob);
        }
        return LOOM_OK;
    }
    blas_job j = {.p = p,
                  .b = b,
                  .own = t->dtype == LOOM_F32 && loom__use_gemm256(),
                  .t = t,
                  .A = A,
                  .B = B,
                  .m = t->shape[nd - 2],
                  .n = t->shape[nd - 1],
                  .k = A->shape[nd - 1],
                  .es = loom__dtype_size((loom_dtype)t->dtype),
                  .o = loom__addr(p, b, id),
                  .pa = loom__addr(p, b, t->src[0]),
                  .pb = loom__addr(p, b, t->src[1]),
                  .batch = loom__numel(nd - 2, t->shape)};
    bool ok =
        loom__blas_layout(j.m, j.k, A->lay.stride[nd - 2], A->lay.stride[nd - 1], &j.ta, &j.lda);
    /* B a grouped view (an unfold read in place) goes to loom__sgemm256_view */
    j.view = j.own && B->gndim;
    if (j.view)
        loom__operand_dims(B, &j.gb.row, &j.gb.col), j.gb.p = loom__addr(p, b, t->src[1]);
    else
        ok = ok && loom__blas_layout(j.k, j.n, B->lay.stride[nd - 2], B->lay.stride[nd - 1], &j.tb,
                                     &j.ldb);
    LOOM_ASSERT(ok); /* the planner materializes other layouts */
    /* A large product is computed in blocks: one product's rows or columns (the longer), in at
     * most BLAS_BLOCKS blocks of a multiple of 16 (at least 64), or the products of its batch;
     * the device's cores take blocks. The blocks depend on the shape alone: BLAS may round an
     * element otherwise in another block of another size, so that its values stay the same
     * whatever the cores. loom__sgemm256's elements do not depend on the blocks: one block a
     * core, in multiples of 16. */
    bool big = (double)j.batch * (double)(j.m * j.n) * (double)j.k >= 2 * LOOM_SPLIT_MIN;
    j.split = !big ? SPLIT_NONE : j.batch > 1 ? SPLIT_BATCH : j.m >= j.n ? SPLIT_ROWS : SPLIT_COLS;
    bool cut = j.split == SPLIT_ROWS || j.split == SPLIT_COLS;
    int64_t extent = j.split == SPLIT_ROWS ? j.m : j.split == SPLIT_COLS ? j.n : j.batch;
    int64_t parts = j.own ? loom__team_size(b->team) : BLAS_BLOCKS;
    int64_t block = (extent + parts * 16 - 1) / (parts * 16) * 16;
    j.block = !cut ? 1 : j.own || block >= 64 ? block : 64;
    loom__team_for(j.split == SPLIT_NONE ? NULL : b->team, (extent + j.block - 1) / j.block, 1,
                   blas_part, &j);
    return LOOM_OK;
}
