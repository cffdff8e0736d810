/*
 * pool_back.c - a fold computing its convolution's backward from a pool gradient's codes
 * (its BACK form): the gradient made a block of columns at a time, fed to both products.
 */
#include "kernels.h"

/* Elements x[0 .. len) added into RED_LANES lanes as red_lanes_SUM_f32 adds them (x[k] into lane
 * k % RED_LANES), 16 at a time where the CPU has AVX-512. */
#ifdef HAVE_POOL512
__attribute__((target("avx512f")))
#endif
static void
sum_lanes(float *lane, const float *x, int64_t len) {
    int64_t k = 0;
#ifdef HAVE_POOL512
    _Static_assert(RED_LANES == 16, "a vector of lanes");
    __m512 l = _mm512_loadu_ps(lane);
    for (; k + 16 <= len; k += 16)
        l = _mm512_add_ps(l, _mm512_loadu_ps(x + k));
    _mm512_storeu_ps(lane, l);
#endif
    for (; k + RED_LANES <= len; k += RED_LANES)
        for (int j = 0; j < RED_LANES; j++)
            lane[j] += x[k + j];
    for (int j = 0; k + j < len; j++)
        lane[j] += x[k + j];
}

/* A fold computing its convolution's backward from a pool gradient (its BACK form): the fold's
 * product A, the weight gradient's B (an unfold), and the room made on either side of a row (a
 * plane: planes straddle the runs). */
typedef struct {
    const loom__pnode *fold, *prod, *pg, *w;
    const loom__form *x;
    loom__gmat a, b;
    int64_t K, pad;
    bool table;   /* the pool gradient's planes made by gt, else by rows */
    pool_gtab gt; /* (with table) */
} back_plan;

static back_plan back_plan_of(const loom__program *p, int32_t f) {
    back_plan q = {.fold = &p->nodes[f], .x = loom__form_get(p, f, LOOM_FORM_BACK)};
    q.pg = &p->nodes[q.x->u.back.grad];
    q.prod = &p->nodes[p->nodes[q.fold->src[0]].src[0]], q.w = &p->nodes[q.x->u.back.w];
    loom__operand_dims(&p->nodes[q.prod->src[0]], &q.a.row, &q.a.col);
    loom__operand_dims(&p->nodes[q.w->src[1]], &q.b.row, &q.b.col);
    q.K = loom__numel(q.a.col.n, q.a.col.size);
    /* a plane made whole by its table spills up to a plane on either side; made by rows, a
     * pair of rows */
    const loom__pnode *d = &p->nodes[loom__pool_dy(p, q.x->u.back.grad)];
    int64_t H = q.pg->shape[2], W = q.pg->shape[3];
    q.table = loom__pool_gtab_init(&q.gt, H, W, d->shape[2], d->shape[3]);
    q.pad = ((q.table ? H * W : 2 * W) + 15) / 16 * 16;
    return q;
}

size_t loom__fold_back_bytes(const loom__program *p, int32_t f) {
    back_plan q = back_plan_of(p, f);
    return sizeof(float) * (size_t)(q.K * RED_LANES) +
           loom__conv_back_bytes(q.prod->shape[1], q.K, q.w->shape[1], q.pad);
}

/* The pool gradient's rows (a row per channel, its planes one after another) made from the
 * argmax codes, and summed into the lanes of red_lanes_SUM_f32 (each column once: runs overlap). */
typedef struct {
    const float *dy;
    int64_t dys0, dys1; /* dy's planes: a row's, and the next along it */
    const uint8_t *codes;
    int64_t rows, planes, P, OP, summed;
    int64_t H, W, OH, OW;
    bool relu;
    const pool_gtab *gt; /* a whole plane at a time from it, or NULL: by rows */
    float *lanes;        /* RED_LANES a row, or NULL */
} back_rows;

static void back_rows_make(void *ctx, int64_t j0, int64_t n, float *r, int64_t ld) {
    back_rows *s = ctx;
    int64_t from = s->summed > j0 ? s->summed : j0; /* a multiple of the lanes, or the end */
    for (int64_t k = 0; k < s->rows; k++) {
        /* column j at row + j; whole planes, or pairs of rows, spill into the pad */
        float *row = r + k * ld - j0;
        for (int64_t pl = j0 / s->P; pl * s->P < j0 + n; pl++) {
            const float *gy = s->dy + k * s->dys0 + pl * s->dys1;
            const uint8_t *codes = s->codes + (k * s->planes + pl) * s->OP;
            if (s->gt) {
                loom__pool2_grad_plane_float(s->gt, gy, codes, s->relu, row + pl * s->P, s->OP);
                continue;
            }
            /* the window rows over the plane's columns in [j0, j0 + n) */
            int64_t lo = j0 - pl * s->P, hi = j0 + n - pl * s->P;
            lo = lo > 0 ? lo : 0, hi = hi < s->P ? hi : s->P;
            int64_t y1 = (hi + 2 * s->W - 1) / (2 * s->W);
            loom__pool2_grad_rows_float(gy, codes, s->relu, s->H, s->W, s->OH, s->OW,
                                        lo / (2 * s->W), y1 < s->OH ? y1 : s->OH,
                                        hi > 2 * s->OH * s->W, row + pl * s->P);
        }
        if (s->lanes && from < j0 + n)
            sum_lanes(s->lanes + k * RED_LANES, row + from, j0 + n - from);
    }
    s->summed = j0 + n > s->summed ? j0 + n : s->summed;
}

/* The fold's product reads the pool gradient's rows; here they are made a run of columns at a
 * time from the codes and go, while in cache, into the fold's product, the weight gradient and
 * the bias gradient's sum (its lanes carried from run to run, then red_lanes_SUM_f32's tree): the
 * pool gradient is never written, and each value is the one the three nodes compute alone. */
loom_status loom__fold_back(const loom__program *p, const loom__bind *b, int32_t id) {
    back_plan q = back_plan_of(p, id);
    int32_t mid = p->nodes[p->nodes[id].src[0]].src[0]; /* the product, through its reshape */
    const loom__pnode *g = q.pg, *t = q.fold;
    q.a.p = loom__addr(p, b, q.prod->src[0]), q.b.p = loom__addr(p, b, q.w->src[1]);
    int32_t gid = q.x->u.back.grad, dn = loom__pool_dy(p, gid);
    const loom__pnode *d = &p->nodes[dn];
    float *lanes = (float *)(b->ws + p->nodes[mid].ws_off);
    float *sum = q.x->u.back.sum >= 0 ? loom__addr(p, b, q.x->u.back.sum) : NULL;
    back_rows s = {.dy = loom__addr(p, b, dn),
                   .dys0 = d->lay.stride[0],
                   .dys1 = d->lay.stride[1],
                   .codes = loom__pool_codes(p, b, loom__pool_codes_of(p, gid)),
                   .rows = q.K,
                   .planes = g->shape[1],
                   .P = g->shape[2] * g->shape[3],
                   .OP = d->shape[2] * d->shape[3],
                   .H = g->shape[2],
                   .W = g->shape[3],
                   .OH = d->shape[2],
                   .OW = d->shape[3],
                   .relu = loom__form_get(p, gid, LOOM_FORM_RELU_DY) != NULL,
                   .gt = q.table ? &q.gt : NULL,
                   .lanes = sum ? lanes : NULL};
    memset(lanes, 0, sizeof(float) * (size_t)(q.K * RED_LANES));
    loom__gdim crow, ccol;
    loom__fold_dims(t, &crow, &ccol);
    float *x = loom__addr(p, b, id);
    memset(x, 0, sizeof(float) * (size_t)loom__numel(4, t->shape));
    loom__conv_back(q.prod->shape[0], q.prod->shape[1], q.K, &q.a, crow, ccol, x, q.w->shape[1],
                    &q.b, loom__addr(p, b, q.x->u.back.w), q.w->lay.stride[0], back_rows_make, &s,
                    q.pad, lanes + q.K * RED_LANES, b->ws + p->scratch);
    for (int64_t r = 0; sum && r < q.K; r++) {
        float *l = lanes + r * RED_LANES;
        for (int w = RED_LANES / 2; w >= 1; w /= 2)
            for (int j = 0; j < w; j++)
                l[j] += l[j + w];
        sum[r] = l[0];
    }
    return LOOM_OK;
}
