/*
 * pool_quad.c - a 2x2 pool gradient's sinks taken by windows (its QUAD form): its rows are
 * never made.
 */
#include "kernels.h"

/* ---- a pool gradient's sinks by windows (its QUAD form) -------------------------------------
 * The rows of a 2 x 2 pool gradient whose windows tile its planes are zero but at each window's
 * argmax, so the sinks take the windows instead, in the order (place in the window, window): the
 * sum of a row is the sum of its windows' gradients, and its product with an unfold's
 * B(k = (n, y, x), j = (c, kh, kw)) = x[n, c, y + kh, x + kw] is, for each place (a, b) in the
 * window, the windows' gradients (kept where the code names that place, +0 elsewhere) times the
 * image subsampled at (2 oy + a + kh, 2 ox + b + kw): one of (KH + 1)(KW + 1) images per input
 * channel, made once (for 3 x 3; for 5 x 5, a block of planes at a time), 16 windows of each image
 * side by side. The rows are never made; every
 * product of theirs is one of these (zeros included), summed in another fixed order (runs
 * repeat bitwise, both backends alike). */
typedef struct {
    const float *dy, *S;
    const uint8_t *codes;
    int64_t d0, d1, planes, OP, chunks; /* dy's planes: a row's and the next along it; windows a
                                         * plane, and 16 of them a chunk */
    bool relu;
} quad_run;

/* The kernels whose weight gradients it takes: 3 x 3 (two rows of the gradient at a time over
 * all the planes' images, 18 accumulators) and 5 x 5 (a row at a time, 25, over the images of a
 * block of planes at a time: 36 images a window would not stay in cache otherwise). */
static bool quad_kernel(int64_t kh, int64_t kw) {
    return kh == kw && (kh == 3 || kh == 5);
}

static bool quad_plan(const loom__program *p, int32_t id, int32_t *sum, int32_t *dot) {
    const loom__pnode *t = &p->nodes[id];
    const loom__form *sk = loom__sinks_of(p, id);
    if (t->op != LOOM_OP_POOLGRAD || t->dtype != LOOM_F32 || loom__pool_codes_of(p, id) < 0 ||
        t->epi >= 0 || !sk || sk->u.sinks.keep || !loom__pool512() ||
        !loom__pool2x2(&t->attr.win, 1))
        return false;
    const loom__pnode *d = &p->nodes[loom__pool_dy(p, id)];
    int64_t H = t->shape[2], W = t->shape[3], OH = d->shape[2], OW = d->shape[3];
    const loom__pnode *r = &p->nodes[sk->u.sinks.stream];
    if (H != 2 * OH || W != 2 * OW || d->lay.stride[3] != 1 || d->lay.stride[2] != OW ||
        r->shape[0] != t->shape[0] || r->shape[1] != t->shape[1] * H * W)
        return false;
    *sum = *dot = -1;
    for (int q = 0; q < sk->u.sinks.n; q++) {
        const loom__pnode *k = &p->nodes[sk->u.sinks.sink[q]];
        if (k->op == LOOM_OP_SUM && *sum < 0) {
            *sum = sk->u.sinks.sink[q];
            continue;
        }
        loom__gdim br, bc;
        loom__operand_dims(&p->nodes[k->src[1]], &br, &bc);
        if (k->op != LOOM_OP_MATMUL || *dot >= 0 || br.n != 3 || bc.n != 3 ||
            br.size[0] != t->shape[1] || br.size[1] != H || br.size[2] != W ||
            br.stride[1] != bc.stride[1] || br.stride[2] != bc.stride[2] ||
            !quad_kernel(bc.size[1], bc.size[2]))
            return false;
        *dot = sk->u.sinks.sink[q];
    }
    return true;
}

bool loom__pool_quad_ok(const loom__program *p, int32_t id) {
    int32_t sum, dot;
    return quad_plan(p, id, &sum, &dot);
}

/* The kernel's side K (3 where only a sum takes the windows). */
static int quad_k(const loom__program *p, int32_t dot) {
    loom__gdim br, bc;
    if (dot < 0)
        return 3;
    loom__operand_dims(&p->nodes[p->nodes[dot].src[1]], &br, &bc);
    return (int)bc.size[1];
}

enum { QUAD_BLOCK = 1 << 16 }; /* floats of a 5 x 5 kernel's block of images (256 KB) */

/* The planes whose images it makes at a time (all of them for 3 x 3), and a channel's images for
 * those: planes x chunks x (K + 1)^2 x 16 floats. */
static int64_t quad_planes(const loom__program *p, int32_t id, int k) {
    const loom__pnode *t = &p->nodes[id];
    int64_t per = ((t->shape[2] * t->shape[3] / 4 + 15) / 16) * (k + 1) * (k + 1) * 16;
    int64_t n = k == 3 ? t->shape[1] : QUAD_BLOCK / per;
    return n < 1 ? 1 : n > t->shape[1] ? t->shape[1] : n;
}

static int64_t quad_image_floats(const loom__program *p, int32_t id, int k) {
    const loom__pnode *t = &p->nodes[id];
    return quad_planes(p, id, k) * ((t->shape[2] * t->shape[3] / 4 + 15) / 16) * (k + 1) * (k + 1) *
           16;
}

size_t loom__pool_quad_bytes(const loom__program *p, int32_t id) {
    int32_t sum = -1, dot = -1;
    quad_plan(p, id, &sum, &dot);
    int64_t C = 1;
    if (dot >= 0) {
        loom__gdim br, bc;
        loom__operand_dims(&p->nodes[p->nodes[dot].src[1]], &br, &bc);
        C = bc.size[0];
    }
    /* and a plane of each image (loom__quad_images), and a 5 x 5 kernel's rows' accumulators
     * between blocks */
    const loom__pnode *t = &p->nodes[id];
    int k = quad_k(p, dot);
    int64_t keep = k == 3 ? 0 : t->shape[0] * C * (k * k + 1) * 16;
    return sizeof(float) * (size_t)(C * quad_image_floats(p, id, k) + keep +
                                    (k + 1) * (k + 1) * (t->shape[2] * t->shape[3] / 4 + 16)) +
           64;
}

#ifdef HAVE_POOL512
/* Input channel c's images (a', b') = x[n, c, 2 oy + a', 2 ox + b'] for a', b' in 0..side - 1
 * (strides of the unfold's B: rows (n, y, x), columns (c, kh, kw)), each plane's windows 16 a
 * chunk: image i = a' side + b' of chunk q of plane n at S + ((n chunks + q) side^2 + i) 16,
 * zeros past the windows. A plane of each image at a time through tmp (side^2 planes of OH x OW,
 * zeros to the chunk), all of them written before any is read back (a load of what masked stores
 * just wrote waits). */
__attribute__((target("avx512f"))) void loom__quad_images(float *S, float *tmp, const float *x,
                                                          const loom__gdim *br, int64_t sc,
                                                          int64_t OH, int64_t OW, int64_t chunks,
                                                          int side) {
    int64_t sy = br->stride[1], sx = br->stride[2], cp = 16 * chunks, imgs = side * side;
    __m512i ie = _mm512_loadu_si512(loom__pool_even);
    memset(tmp, 0, sizeof(float) * (size_t)(imgs * cp)); /* (the rows leave the pads) */
    for (int64_t n = 0; n < br->size[0]; n++) {
        for (int i = 0; i < imgs; i++) {
            float *t = tmp + i * cp;
            /* rows i, i + imgs, ... of the next image: its first reads miss otherwise */
            for (int64_t y = i; sx == 1 && y < 2 * OH + side - 2; y += imgs)
                for (int64_t o = 0; o < 2 * OW + side - 2; o += 16)
                    _mm_prefetch((const char *)(x + (n + 1) * br->stride[0] + sc + y * sy + o),
                                 _MM_HINT_T0);
            for (int64_t oy = 0; oy < OH; oy++) {
                const float *r =
                    x + n * br->stride[0] + sc + (2 * oy + i / side) * sy + i % side * sx;
                if (sx == 1) { /* the even ones of 2 OW - 1 floats (nothing read past), 16
                                * windows at a time */
                    for (int64_t ox = 0; ox < OW; ox += 16) {
                        int64_t f = 2 * (OW - ox < 16 ? OW - ox : 16) - 1; /* floats */
                        __mmask16 lo = (__mmask16)(f >= 16 ? 0xffff : (1u << f) - 1);
                        __mmask16 hi = (__mmask16)(f <= 16 ? 0 : (1u << (f - 16)) - 1);
                        __m512 v0 = _mm512_maskz_loadu_ps(lo, r + 2 * ox),
                               v1 = _mm512_maskz_loadu_ps(hi, r + 2 * ox + 16);
                        _mm512_mask_storeu_ps(t + oy * OW + ox,
                                              (__mmask16)((1u << (f + 1) / 2) - 1),
                                              _mm512_permutex2var_ps(v0, ie, v1));
                    }
                } else {
                    for (int64_t ox = 0; ox < OW; ox++)
                        t[oy * OW + ox] = r[2 * ox * sx];
                }
            }
        }
        for (int64_t q = 0; q < chunks; q++)
            for (int i = 0; i < imgs; i++)
                _mm512_store_ps(S + ((n * chunks + q) * imgs + i) * 16,
                                _mm512_loadu_ps(tmp + i * cp + 16 * q));
    }
}

/* R rows (channels c, c + dc) against a K x K kernel's K^2 columns of one input channel, over
 * planes [0, planes) of s (its images S): every window's gradient, masked to its code's place
 * (a, b) and to the ReLU's, times image (a + kh, b + kw); 16 lanes per element, added to the
 * lanes in dot (R x K^2 of them) and sum (R); the sums of the windows' gradients too. */
#    define QUAD_TILE(K, R)                                                                        \
        __attribute__((target("avx512f"))) static void quad_tile_##K(                              \
            const quad_run *s, int64_t c, int64_t dc, int64_t planes, float *dot, float *sum) {    \
            enum { SIDE = K + 1, IMGS = SIDE * SIDE };                                             \
            __m512 acc[R][K * K], bs[R];                                                           \
            const float *g[R];                                                                     \
            const uint8_t *k[R];                                                                   \
            _Pragma("GCC unroll 2") for (int i = 0; i < R; i++) {                                  \
                bs[i] = _mm512_loadu_ps(sum + 16 * i);                                             \
                g[i] = s->dy + (c + i * dc) * s->d0;                                               \
                k[i] = s->codes + (c + i * dc) * s->planes * s->OP;                                \
                _Pragma("GCC unroll 25") for (int j = 0; j < K * K; j++) acc[i][j] =               \
                    _mm512_loadu_ps(dot + 16 * (i * K * K + j));                                   \
            }                                                                                      \
            const float *sp = s->S;                                                                \
            for (int64_t n = 0; n < planes; n++)                                                   \
                for (int64_t w = 0; w < s->OP; w += 16, sp += IMGS * 16) {                         \
                    __mmask16 m = (__mmask16)(s->OP - w >= 16 ? 0xffff : (1u << (s->OP - w)) - 1); \
                    __m512 pl[R][4]; /* the gradients at each place */                             \
                    _Pragma("GCC unroll 2") for (int i = 0; i < R; i++) {                          \
                        __m512 a = _mm512_maskz_loadu_ps(m, g[i] + n * s->d1 + w);                 \
                        /* the planes two on (a row's planes lie far apart: no hardware            \
                         * prefetch) */                                                            \
                        _mm_prefetch((const char *)(g[i] + (n + 2) * s->d1 + w), _MM_HINT_T0);     \
                        /* 16 codes: past a plane's last, within the 16 the buffer spares */       \
                        __m512i q = _mm512_cvtepu8_epi32(                                          \
                            _mm_loadu_si128((const __m128i *)(k[i] + n * s->OP + w)));             \
                        if (s->relu)                                                               \
                            a = _mm512_maskz_mov_ps(                                               \
                                _mm512_test_epi32_mask(q, _mm512_set1_epi32(4)), a);               \
                        bs[i] = _mm512_add_ps(bs[i], a);                                           \
                        q = _mm512_and_si512(q, _mm512_set1_epi32(3));                             \
                        _Pragma("GCC unroll 4") for (int e = 0; e < 4; e++) pl[i][e] =             \
                            _mm512_maskz_mov_ps(_mm512_cmpeq_epi32_mask(q, _mm512_set1_epi32(e)),  \
                                                a);                                                \
                    }                                                                              \
                    /* image (a', b'): places (a, b), taps (a' - a, b' - b) */                     \
                    _Pragma("GCC unroll 36") for (int im = 0; im < IMGS; im++) {                   \
                        __m512 v = _mm512_load_ps(sp + 16 * im);                                   \
                        _Pragma("GCC unroll 4") for (int e = 0; e < 4; e++) {                      \
                            int kh = im / SIDE - e / 2, kw = im % SIDE - e % 2;                    \
                            if (kh < 0 || kh >= K || kw < 0 || kw >= K)                            \
                                continue;                                                          \
                            _Pragma("GCC unroll 2") for (int i = 0; i < R; i++)                    \
                                acc[i][kh * K + kw] =                                              \
                                    _mm512_fmadd_ps(pl[i][e], v, acc[i][kh * K + kw]);             \
                        }                                                                          \
                    }                                                                              \
                }                                                                                  \
            _Pragma("GCC unroll 2") for (int i = 0; i < R; i++) {                                  \
                _mm512_storeu_ps(sum + 16 * i, bs[i]);                                             \
                _Pragma("GCC unroll 25") for (int j = 0; j < K * K; j++)                           \
                    _mm512_storeu_ps(dot + 16 * (i * K * K + j), acc[i][j]);                       \
            }                                                                                      \
        }
QUAD_TILE(3, 2)
QUAD_TILE(5, 1)
#endif

/* red_lanes_SUM_f32's tree over 16 lanes. */
static float lanes_tree(float *l) {
    for (int w = RED_LANES / 2; w >= 1; w /= 2)
        for (int j = 0; j < w; j++)
            l[j] += l[j + w];
    return l[0];
}

loom_status loom__pool_quad(const loom__program *p, const loom__bind *b, int32_t id) {
#ifdef HAVE_POOL512
    const loom__pnode *t = &p->nodes[id];
    int32_t sum = -1, dot = -1;
    quad_plan(p, id, &sum, &dot);
    int32_t dn = loom__pool_dy(p, id);
    const loom__pnode *d = &p->nodes[dn];
    int64_t OP = d->shape[2] * d->shape[3], chunks = (OP + 15) / 16;
    quad_run s = {.dy = loom__addr(p, b, dn),
                  .codes = loom__pool_codes(p, b, loom__pool_codes_of(p, id)),
                  .d0 = d->lay.stride[0],
                  .d1 = d->lay.stride[1],
                  .planes = t->shape[1],
                  .OP = OP,
                  .chunks = chunks,
                  .relu = loom__form_get(p, id, LOOM_FORM_RELU_DY) != NULL};
    float *S = (float *)(((uintptr_t)(b->ws + t->ws_off) + 63) & ~(uintptr_t)63);
    loom__gdim br = {0}, bc = {0};
    int K = quad_k(p, dot), R = K == 3 ? 2 : 1; /* (rows at a time: quad_tile_K's) */
    int64_t C = 1, per = quad_image_floats(p, id, K), block = quad_planes(p, id, K);
    int64_t taps = (int64_t)K * K, rows = t->shape[0];
    const float *x = NULL;
    if (dot >= 0) {
        loom__operand_dims(&p->nodes[p->nodes[dot].src[1]], &br, &bc);
        x = loom__addr(p, b, p->nodes[dot].src[1]), C = bc.size[0];
    }
    /* each row's lanes (K^2 products' and the sum's per input channel): in registers for 3 x 3,
     * kept between blocks of planes for 5 x 5 */
    float one[2 * (9 + 1) * 16]; /* (3 x 3: two rows' nine products and sum) */
    float *keep =
        K == 3 ? one : S + C * per + (K + 1) * (K + 1) * (t->shape[2] * t->shape[3] / 4 + 16);
    float *so = sum >= 0 ? loom__addr(p, b, sum) : NULL;
    float *po = dot >= 0 ? loom__addr(p, b, dot) : NULL;
    if (K != 3)
        memset(keep, 0, sizeof(float) * (size_t)(rows * C * (taps + 1) * 16));
    for (int64_t n0 = 0; n0 < t->shape[1]; n0 += block) {
        int64_t nb = t->shape[1] - n0 < block ? t->shape[1] - n0 : block;
        quad_run sb = s;
        sb.dy += n0 * s.d1, sb.codes += n0 * s.OP;
        if (dot >= 0) {
            loom__gdim bn = br;
            bn.size[0] = nb;
            for (int64_t ci = 0; ci < C; ci++)
                loom__quad_images(S + ci * per, S + C * per, x + n0 * br.stride[0], &bn,
                                  ci * bc.stride[0], d->shape[2], d->shape[3], chunks, K + 1);
        } else { /* a sum alone: images of zeros, products not stored */
            memset(S, 0, sizeof(float) * (size_t)per);
        }
        for (int64_t c = 0; c < rows; c += R) {
            int64_t dc = R > 1 && c + 1 < rows ? 1 : 0; /* a last row alone: itself again */
            for (int64_t ci = 0; ci < C; ci++) {
                sb.S = S + ci * per;
                float *lk = K == 3 ? one : keep + (c * C + ci) * (taps + 1) * 16;
                if (K == 3) {
                    memset(one, 0, sizeof one);
                    quad_tile_3(&sb, c, dc, nb, one, one + 2 * taps * 16);
                } else {
                    quad_tile_5(&sb, c, dc, nb, lk, lk + taps * 16);
                }
                if (n0 + nb < t->shape[1])
                    continue;
                for (int64_t i = 0; i < R && i <= dc; i++) {
                    if (so && ci == 0)
                        so[c + i] = lanes_tree(lk + (R * taps + i) * 16);
                    for (int64_t j = 0; po && j < taps; j++)
                        po[(c + i) * taps * C + ci * taps + j] =
                            lanes_tree(lk + 16 * (i * taps + j));
                }
            }
        }
    }
    return LOOM_OK;
#else
    (void)p, (void)b, (void)id;
    return LOOM_OK;
#endif
}
