/*
 * pool_conv.c - a max pooling computing the convolution that feeds it (its CONV form), plane by
 * plane or window by window, pooled while in L1.
 */
#include "kernels.h"

/* The product max pooling id computes (its CONV form). */
static int32_t product_of(const loom__program *p, int32_t id) {
    return loom__form_get(p, id, LOOM_FORM_CONV)->u.product;
}

/* A max pooling computing its product (its CONV form): the product's epilogue (or NULL) with
 * its operands (args[0]: root, where it writes), the argmax codes it keeps (or NULL) and where
 * its values go (its ReLU's buffer when it computes that). */
typedef struct {
    const loom__fused *k;
    void *args[LOOM_FUSED_MAX_ARGS];
    uint8_t *codes;
    float *o;
} pool_out;

static void pool_out_init(pool_out *po, const loom__program *p, const loom__bind *b, int32_t id,
                          float *root) {
    const loom__pnode *m = &p->nodes[product_of(p, id)];
    po->k = m->epi >= 0 ? &p->fused[m->epi] : NULL;
    po->args[0] = root;
    for (int a = 1; po->k && a < po->k->nargs; a++)
        po->args[a] = a == po->k->epi_arg ? NULL : loom__addr(p, b, po->k->args[a]);
    po->codes = loom__pool_keeps_codes(p, id) ? loom__pool_codes(p, b, id) : NULL;
    int32_t relu = loom__pool_relu_of(p, id);
    po->o = loom__addr(p, b, relu >= 0 ? relu : id);
}

/* ---- a pooling computing its convolution by windows ------------------------------------------
 * A K x K convolution of stride 1 (K up to QUAD_MAX_K) whose 2 x 2 pooling tiles its output planes
 * is made by windows: the output at place (a, b) of window (oy, ox) is the sum over taps of
 * w[c, ci, kh, kw] times image (ci, a + kh, b + kw) of loom__quad_images at (oy, ox), so 16
 * windows of all four places come from 16 aligned loads shared by four channels, and the pooling
 * is four vectors' maximum (no
 * shuffles, no gathers). Each output is the same chain of FMAs from zero, taps ascending, as
 * loom__conv_planes_run's, and the maximum the same rule: the same bits. The epilogue runs on a
 * plane of values in window order, so its other operands must not vary along the columns. */
typedef struct {
    int64_t Cin, OH, OW, chunks, N;
    int K;         /* the kernel's side: K x K taps, (K + 1)^2 images a channel */
    loom__gdim br; /* the unfold's rows (n, y, x), for loom__quad_images */
    int64_t sc;    /* its input channels' stride */
} conv_quad;

/* Whether epilogue k's operands (but the product's) are the same all along a row. */
static bool epilogue_by_rows(const loom__program *p, const loom__fused *k) {
    const loom__pnode *root = &p->nodes[k->root];
    for (int a = 1; a < k->nargs; a++) {
        const loom__pnode *l = &p->nodes[k->args[a]];
        bool one = loom__numel(l->ndim, l->shape) == 1;
        bool col = l->ndim == 2 && l->shape[0] == root->shape[0] &&
                   (l->shape[1] == 1 || l->lay.stride[1] == 0);
        if (a != k->epi_arg && !one && !col)
            return false;
    }
    return true;
}

static bool conv_quad_of(const loom__program *p, int32_t id, conv_quad *q) {
    const loom__pnode *t = &p->nodes[id], *x = &p->nodes[t->src[0]],
                      *m = &p->nodes[product_of(p, id)];
    loom__gdim br, bc;
    loom__operand_dims(&p->nodes[m->src[1]], &bc, &br); /* B: rows (ci, kh, kw), cols (n, y, x) */
    int64_t OH = t->shape[2], OW = t->shape[3];
    int64_t K = bc.n == 3 ? bc.size[1] : 0;
    if (!loom__pool512() || !loom__pool2x2(&t->attr.win, 1) || bc.n != 3 || br.n != 3 || K < 1 ||
        K > QUAD_MAX_K || bc.size[2] != K || bc.size[0] * K * K > LOOM_CONV_MAX_K ||
        br.size[1] != 2 * OH || br.size[2] != 2 * OW || x->shape[2] != 2 * OH ||
        x->shape[3] != 2 * OW || br.stride[1] != bc.stride[1] || br.stride[2] != bc.stride[2] ||
        (m->epi >= 0 && !epilogue_by_rows(p, &p->fused[m->epi])))
        return false;
    *q = (conv_quad){.Cin = bc.size[0],
                     .K = (int)K,
                     .OH = OH,
                     .OW = OW,
                     .chunks = (OH * OW + 15) / 16,
                     .N = br.size[0],
                     .br = br,
                     .sc = bc.stride[0]};
    q->br.size[0] = 1; /* (one image at a time) */
    return true;
}

/* Floats of a pooling's scratch by windows: the images of one input image, a plane of each (for
 * loom__quad_images), four channels' products and their epilogue's, all by windows. */
static int64_t conv_quad_floats(const conv_quad *q) {
    int64_t imgs = (q->K + 1) * (q->K + 1);
    return 16 * q->chunks * (q->Cin * imgs + imgs + 4 * 4 + 4 * 4);
}

/* ---- a pooling computing a convolution that runs by its transpose, by windows ----------------
 * a convolution's forward inside its 2 x 2 pooling: the product's columns are taken in window order
 * (per image, the four places of the pooling windows, each over all windows) through
 * loom__gemm_t_cols, a few images at a time, so the positions no window covers (an odd plane's last
 * row and column) are never computed and the pooling is four vectors' maximum. Each value is the
 * product's own (the same k blocks and order), its epilogue the same function on the same value
 * (its other operands constant along a row): the same bits as the product, its epilogue and the
 * pooling run one after the other. */
typedef struct {
    int64_t N, PP, G; /* images, windows an image, images a block */
    int64_t sn, sy, sx;
} conv_t;

static bool conv_t_of(const loom__program *p, int32_t id, conv_t *q) {
    const loom__pnode *t = &p->nodes[id], *x = &p->nodes[t->src[0]],
                      *m = &p->nodes[product_of(p, id)];
    loom__gmat ga = {NULL, {0}, {0}}, gb = {NULL, {0}, {0}};
    loom__operand_dims(&p->nodes[m->src[0]], &ga.row, &ga.col);
    loom__operand_dims(&p->nodes[m->src[1]], &gb.row, &gb.col);
    int64_t PH = t->shape[2], PW = t->shape[3], PP = PH * PW;
    if (!loom__pool512() || !loom__pool2x2(&t->attr.win, 1) || gb.col.n != 3 ||
        gb.col.size[1] != x->shape[2] || gb.col.size[2] != x->shape[3] || PP < 1 ||
        4 * PP > LOOM_GEMM_NC ||
        !loom__gemm_t_ok(m->shape[0], m->shape[1], loom__numel(ga.col.n, ga.col.size), &ga, &gb) ||
        (m->epi >= 0 && !epilogue_by_rows(p, &p->fused[m->epi])))
        return false;
    *q = (conv_t){.N = gb.col.size[0],
                  .PP = PP,
                  .G = LOOM_GEMM_NC / (4 * PP),
                  .sn = gb.col.stride[0],
                  .sy = gb.col.stride[1],
                  .sx = gb.col.stride[2]};
    return true;
}

/* Bytes of its scratch: the columns' offsets, a block of the product and of its epilogue (each
 * with 16 floats to spare: a window chunk's loads run past the last place). */
static size_t conv_t_bytes(const loom__program *p, int32_t id, const conv_t *q) {
    int64_t cols = q->G * 4 * q->PP, M = p->nodes[product_of(p, id)].shape[0];
    return sizeof(int64_t) * (size_t)cols + 2 * sizeof(float) * (size_t)(M * cols + 16) + 128;
}

size_t loom__pool_conv_bytes(const loom__program *p, int32_t f) {
    int64_t plane = p->nodes[p->nodes[f].src[0]].lay.stride[1];
    size_t rows = 64 + (LOOM_CONV_ROWS + 1) * (size_t)(plane + 16) * sizeof(float) +
                  loom__conv_planes_bytes(plane);
    conv_quad q;
    conv_t ct;
    size_t quad = conv_quad_of(p, f, &q) ? 64 + sizeof(float) * (size_t)conv_quad_floats(&q) : 0;
    size_t cols = conv_t_of(p, f, &ct) ? conv_t_bytes(p, f, &ct) : 0;
    size_t most = quad > rows ? quad : rows;
    return cols > most ? cols : most;
}

bool loom__pool_conv_t_ok(const loom__program *p, int32_t f) {
    conv_t q;
    return conv_t_of(p, f, &q);
}

#ifdef HAVE_POOL512
/* Four channels (rows a[r] of A) of image S's windows, chunk by chunk: out + (r 4 + place) cp; a
 * K x K kernel, its (K + 1)^2 images a channel. Built for K = 3 (its taps unrolled) and for any
 * K: the same FMAs in the same order. */
__attribute__((target("avx512f"), always_inline)) static inline void
quad_rows(const float *const *a, int64_t acs, int64_t Cin, const float *S, int64_t chunks,
          float *out, int64_t cp, int K) {
    int side = K + 1, taps = K * K;
    for (int64_t ch = 0; ch < chunks; ch++) {
        __m512 acc[4][4];
#    pragma GCC unroll 4
        for (int r = 0; r < 4; r++)
#    pragma GCC unroll 4
            for (int pl = 0; pl < 4; pl++)
                acc[r][pl] = _mm512_setzero_ps();
        for (int64_t ci = 0; ci < Cin; ci++) {
            const float *sp = S + (ci * chunks + ch) * side * side * 16;
#    pragma GCC unroll 9
            for (int k = 0; k < taps; k++) { /* taps ascending: (ci, kh, kw) */
                int kh = k / K, kw = k % K;
                int64_t at = (ci * taps + k) * acs;
                __m512 w[4] = {_mm512_set1_ps(a[0][at]), _mm512_set1_ps(a[1][at]),
                               _mm512_set1_ps(a[2][at]), _mm512_set1_ps(a[3][at])};
#    pragma GCC unroll 4
                for (int pl = 0; pl < 4; pl++) {
                    __m512 v = _mm512_load_ps(sp + ((pl / 2 + kh) * side + pl % 2 + kw) * 16);
#    pragma GCC unroll 4
                    for (int r = 0; r < 4; r++)
                        acc[r][pl] = _mm512_fmadd_ps(w[r], v, acc[r][pl]);
                }
            }
        }
#    pragma GCC unroll 4
        for (int r = 0; r < 4; r++)
#    pragma GCC unroll 4
            for (int pl = 0; pl < 4; pl++)
                _mm512_store_ps(out + (r * 4 + pl) * cp + 16 * ch, acc[r][pl]);
    }
}

__attribute__((target("avx512f"))) static void conv_quad_rows(const float *const *a, int64_t acs,
                                                              int64_t Cin, const float *S,
                                                              int64_t chunks, float *out,
                                                              int64_t cp, int K) {
    if (K == 3)
        quad_rows(a, acs, Cin, S, chunks, out, cp, 3);
    else
        quad_rows(a, acs, Cin, S, chunks, out, cp, K);
}

/* The pooling of one channel's plane by windows: place pl's values at v + pl cp (the last
 * chunk's loads run up to 15 floats past a place). */
__attribute__((target("avx512f"))) static void
pool_quad_plane(const float *v, int64_t cp, int64_t OP, bool relu, float *o, uint8_t *codes) {
    for (int64_t w = 0; w < OP; w += 16) {
        __mmask16 mn = (__mmask16)(OP - w >= 16 ? 0xffff : (1u << (OP - w)) - 1);
        pool_windows(_mm512_loadu_ps(v + w), _mm512_loadu_ps(v + cp + w),
                     _mm512_loadu_ps(v + 2 * cp + w), _mm512_loadu_ps(v + 3 * cp + w), mn, relu,
                     o + w, codes ? codes + w : NULL);
    }
}

static loom_status pool_conv_quad(const loom__program *p, const loom__bind *b, int32_t id,
                                  const conv_quad *q) {
    const loom__pnode *m = &p->nodes[product_of(p, id)];
    loom__gmat ga, gb;
    loom__product_operands(p, b, product_of(p, id), &ga, &gb);
    int64_t cp = 16 * q->chunks, OP = q->OH * q->OW, O = m->shape[0];
    float *S = (float *)(((uintptr_t)(b->ws + m->ws_off) + 63) & ~(uintptr_t)63);
    int64_t imgs = (q->K + 1) * (q->K + 1);
    float *tmp = S + q->Cin * imgs * cp, *prod = tmp + imgs * cp, *root = prod + 16 * cp;
    pool_out po;
    pool_out_init(&po, p, b, id, root);
    for (int64_t n = 0; n < q->N; n++) {
        for (int64_t ci = 0; ci < q->Cin; ci++)
            loom__quad_images(S + ci * imgs * cp, tmp, gb.p + n * gb.col.stride[0], &q->br,
                              ci * q->sc, q->OH, q->OW, q->chunks, q->K + 1);
        for (int64_t c = 0; c < O; c += 4) {
            int64_t rows = O - c < 4 ? O - c : 4;
            const float *a[4]; /* a missing channel computes the last one again, not kept */
            for (int64_t r = 0; r < 4; r++)
                a[r] = ga.p + (c + (r < rows ? r : rows - 1)) * ga.row.stride[0];
            conv_quad_rows(a, ga.col.stride[0], q->Cin, S, q->chunks, prod, cp, q->K);
            /* the epilogue on each channel (its operands the same along the row: columns 0..
             * will do), then the poolings (their loads well after the epilogue's stores) */
            for (int64_t r = 0; po.k && r < rows; r++)
                po.args[0] = root + r * 4 * cp,
                po.k->part(po.args, c + r, 0, 4 * cp, prod + r * 4 * cp);
            for (int64_t r = 0; r < rows; r++) {
                int64_t pl = (c + r) * q->N + n;
                pool_quad_plane((po.k ? root : prod) + r * 4 * cp, cp, OP,
                                loom__pool_relu_of(p, id) >= 0, po.o + pl * OP,
                                po.codes ? po.codes + pl * OP : NULL);
            }
        }
    }
    return LOOM_OK;
}
#endif

/* A max pooling computing its input (its CONV form): each plane of the product made from the
 * image, through the product's epilogue (conv bias), then pooled (with its ReLU and codes) while
 * it is in L1; the product's output is never written. The same values as the product, its
 * epilogue and the pooling run one after the other. */
#ifdef HAVE_POOL512
static loom_status pool_conv_t(const loom__program *p, const loom__bind *b, int32_t id,
                               const conv_t *q) {
    const loom__pnode *t = &p->nodes[id], *m = &p->nodes[product_of(p, id)];
    loom__gmat ga, gb;
    int64_t K = loom__product_operands(p, b, product_of(p, id), &ga, &gb), M = m->shape[0];
    int64_t PP = q->PP, PW = t->shape[3], cols = q->G * 4 * PP;
    int64_t *coff = (int64_t *)(((uintptr_t)(b->ws + m->ws_off) + 63) & ~(uintptr_t)63);
    float *prod = (float *)(coff + cols), *root = prod + M * cols + 16;
    for (int64_t j = 0; j < q->G; j++) /* image j of a block: place (a, b) of each window */
        for (int64_t pl = 0; pl < 4; pl++)
            for (int64_t w = 0; w < PP; w++)
                coff[(j * 4 + pl) * PP + w] =
                    j * q->sn + (2 * (w / PW) + pl / 2) * q->sy + (2 * (w % PW) + pl % 2) * q->sx;
    pool_out po;
    pool_out_init(&po, p, b, id, root);
    const float *b0 = gb.p;
    for (int64_t n0 = 0; n0 < q->N; n0 += q->G) {
        int64_t g = q->N - n0 < q->G ? q->N - n0 : q->G;
        gb.p = b0 + n0 * q->sn;
        loom__gemm_t_cols(M, K, &ga, &gb, coff, g * 4 * PP, prod, cols, n0 > 0, b->ws + p->scratch);
        /* the epilogue on every row (its operands the same along a row: columns 0.. will do),
         * then the poolings (their loads well after the epilogue's stores) */
        for (int64_t r = 0; po.k && r < M; r++)
            po.args[0] = root + r * cols, po.k->part(po.args, r, 0, g * 4 * PP, prod + r * cols);
        for (int64_t r = 0; r < M; r++)
            for (int64_t j = 0; j < g; j++) {
                int64_t pl = r * q->N + n0 + j;
                pool_quad_plane((po.k ? root : prod) + r * cols + j * 4 * PP, PP, PP,
                                loom__pool_relu_of(p, id) >= 0, po.o + pl * PP,
                                po.codes ? po.codes + pl * PP : NULL);
            }
    }
    return LOOM_OK;
}
#endif

loom_status loom__pool_conv(const loom__program *p, const loom__bind *b, int32_t id) {
#ifdef HAVE_POOL512
    conv_quad cq;
    if (conv_quad_of(p, id, &cq))
        return pool_conv_quad(p, b, id, &cq);
    conv_t ct;
    if (conv_t_of(p, id, &ct))
        return pool_conv_t(p, b, id, &ct);
#endif
    const loom__pnode *t = &p->nodes[id], *x = &p->nodes[t->src[0]],
                      *m = &p->nodes[product_of(p, id)];
    loom__gmat ga, gb;
    int64_t K = loom__product_operands(p, b, product_of(p, id), &ga, &gb), P = x->lay.stride[1];
    int64_t per_row = m->shape[1] / P, OP = t->shape[2] * t->shape[3];
    float *prod = (float *)(((uintptr_t)(b->ws + m->ws_off) + 63) & ~(uintptr_t)63);
    int64_t pitch = (P + 15) / 16 * 16; /* LOOM_CONV_ROWS planes of the product, one of the root */
    float *root = prod + LOOM_CONV_ROWS * pitch;
    loom__conv_planes cp;
    loom__conv_planes_begin(&cp, &ga, &gb, K, P, root + pitch);
    pool_out po;
    pool_out_init(&po, p, b, id, root);
    /* one plane as an image of its own; its strides leave the pooling's prefetch off */
    int64_t xs[4] = {1, 1, x->shape[2], x->shape[3]}, xst[4] = {0, 0, x->shape[3], 1};
    int64_t ys[4] = {1, 1, t->shape[2], t->shape[3]};
    for (int64_t i0 = 0; i0 < x->shape[0]; i0 += LOOM_CONV_ROWS) /* rows of the product */
        for (int64_t q = 0; q < per_row; q++) {
            int rows = (int)(x->shape[0] - i0 < LOOM_CONV_ROWS ? x->shape[0] - i0 : LOOM_CONV_ROWS);
            loom__conv_planes_run(&cp, i0, rows, q, prod, pitch);
            for (int r = 0; r < rows; r++) {
                int64_t pl = (i0 + r) * per_row + q;
                if (po.k)
                    po.k->part(po.args, i0 + r, q * P, (q + 1) * P, prod + r * pitch);
                loom__pool_float(&t->attr.win, xs, xst, ys, po.k ? root : prod + r * pitch, NULL,
                                 NULL, po.o + pl * OP, false, po.codes ? po.codes + pl * OP : NULL,
                                 loom__pool_relu_of(p, id) >= 0, NULL, NULL, NULL);
            }
        }
    return LOOM_OK;
}
