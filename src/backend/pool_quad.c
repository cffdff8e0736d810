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
 * channel, made once, 16 windows of each image side by side. The rows are never made; every
 * product of theirs is one of these (zeros included), summed in another fixed order (runs
 * repeat bitwise, both backends alike). */
typedef struct {
    const float *dy, *S;
    const uint8_t *codes;
    int64_t d0, d1, planes, OP, chunks; /* dy's planes: a row's and the next along it; windows a
                                         * plane, and 16 of them a chunk */
    bool relu;
} quad_run;

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
            br.stride[1] != bc.stride[1] || br.stride[2] != bc.stride[2] || bc.size[1] != 3 ||
            bc.size[2] != 3) /* (the kernel's window: 3 x 3) */
            return false;
        *dot = sk->u.sinks.sink[q];
    }
    return true;
}

bool loom__pool_quad_ok(const loom__program *p, int32_t id) {
    int32_t sum, dot;
    return quad_plan(p, id, &sum, &dot);
}

/* A channel's images: planes x chunks x QUAD_IMGS x 16 floats. */
static int64_t quad_image_floats(const loom__program *p, int32_t id) {
    const loom__pnode *t = &p->nodes[id];
    return t->shape[1] * ((t->shape[2] * t->shape[3] / 4 + 15) / 16) * QUAD_IMGS * 16;
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
    const loom__pnode *t = &p->nodes[id]; /* and a plane of an image (loom__quad_images) */
    return sizeof(float) *
               (size_t)(C * quad_image_floats(p, id) + t->shape[2] * t->shape[3] / 4 + 16) +
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

/* Two rows (channels c and c + dc) against a 3 x 3 kernel's nine columns of one input channel:
 * every window's gradient, masked to its code's place (a, b) and to the ReLU's, times image
 * (a + kh, b + kw); 16 lanes per element; the sums of the windows' gradients too. */
__attribute__((target("avx512f"))) static void quad_tile(const quad_run *s, int64_t c, int64_t dc,
                                                         float *dot, float *sum) {
    __m512 acc[2][9], bs[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
#    pragma GCC unroll 2
    for (int i = 0; i < 2; i++)
#    pragma GCC unroll 9
        for (int j = 0; j < 9; j++)
            acc[i][j] = _mm512_setzero_ps();
    const float *g0 = s->dy + c * s->d0, *g1 = s->dy + (c + dc) * s->d0;
    const uint8_t *k0 = s->codes + c * s->planes * s->OP;
    const uint8_t *k1 = s->codes + (c + dc) * s->planes * s->OP;
    const float *sp = s->S;
    for (int64_t n = 0; n < s->planes; n++)
        for (int64_t w = 0; w < s->OP; w += 16, sp += QUAD_IMGS * 16) {
            __mmask16 m = (__mmask16)(s->OP - w >= 16 ? 0xffff : (1u << (s->OP - w)) - 1);
            __m512 a0 = _mm512_maskz_loadu_ps(m, g0 + n * s->d1 + w);
            __m512 a1 = _mm512_maskz_loadu_ps(m, g1 + n * s->d1 + w);
            /* the planes two on (a row's planes lie far apart: no hardware prefetch) */
            _mm_prefetch((const char *)(g0 + (n + 2) * s->d1 + w), _MM_HINT_T0);
            _mm_prefetch((const char *)(g1 + (n + 2) * s->d1 + w), _MM_HINT_T0);
            /* 16 codes: past a plane's last, within the 16 the buffer spares */
            __m512i q0 =
                _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(k0 + n * s->OP + w)));
            __m512i q1 =
                _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(k1 + n * s->OP + w)));
            if (s->relu) {
                a0 = _mm512_maskz_mov_ps(_mm512_test_epi32_mask(q0, _mm512_set1_epi32(4)), a0);
                a1 = _mm512_maskz_mov_ps(_mm512_test_epi32_mask(q1, _mm512_set1_epi32(4)), a1);
            }
            bs[0] = _mm512_add_ps(bs[0], a0), bs[1] = _mm512_add_ps(bs[1], a1);
            q0 = _mm512_and_si512(q0, _mm512_set1_epi32(3));
            q1 = _mm512_and_si512(q1, _mm512_set1_epi32(3));
            __m512 p0[4], p1[4]; /* the gradients at each place */
#    pragma GCC unroll 4
            for (int q = 0; q < 4; q++) {
                p0[q] = _mm512_maskz_mov_ps(_mm512_cmpeq_epi32_mask(q0, _mm512_set1_epi32(q)), a0);
                p1[q] = _mm512_maskz_mov_ps(_mm512_cmpeq_epi32_mask(q1, _mm512_set1_epi32(q)), a1);
            }
#    pragma GCC unroll 16
            for (int i = 0; i < QUAD_IMGS;
                 i++) { /* image (a', b'): places (a, b), taps (a' - a, b' - b) */
                __m512 v = _mm512_load_ps(sp + 16 * i);
#    pragma GCC unroll 4
                for (int q = 0; q < 4; q++) {
                    int kh = i / 4 - q / 2, kw = i % 4 - q % 2;
                    if (kh < 0 || kh > 2 || kw < 0 || kw > 2)
                        continue;
                    acc[0][kh * 3 + kw] = _mm512_fmadd_ps(p0[q], v, acc[0][kh * 3 + kw]);
                    acc[1][kh * 3 + kw] = _mm512_fmadd_ps(p1[q], v, acc[1][kh * 3 + kw]);
                }
            }
        }
#    pragma GCC unroll 2
    for (int i = 0; i < 2; i++) {
        _mm512_storeu_ps(sum + 16 * i, bs[i]);
#    pragma GCC unroll 9
        for (int j = 0; j < 9; j++)
            _mm512_storeu_ps(dot + 16 * (i * 9 + j), acc[i][j]);
    }
}
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
    int64_t C = 1, per = quad_image_floats(p, id);
    const float *x = NULL;
    if (dot >= 0) {
        loom__operand_dims(&p->nodes[p->nodes[dot].src[1]], &br, &bc);
        x = loom__addr(p, b, p->nodes[dot].src[1]), C = bc.size[0];
        for (int64_t ci = 0; ci < C; ci++)
            loom__quad_images(S + ci * per, S + C * per, x, &br, ci * bc.stride[0], d->shape[2],
                              d->shape[3], chunks, 4);
    } else { /* a sum alone: images of zeros, products not stored */
        memset(S, 0, sizeof(float) * (size_t)per);
    }
    float *so = sum >= 0 ? loom__addr(p, b, sum) : NULL;
    float *po = dot >= 0 ? loom__addr(p, b, dot) : NULL;
    float lanes[2 * 16 * 9], bl[2 * 16];
    for (int64_t c = 0; c < t->shape[0]; c += 2) {
        int64_t dc = c + 1 < t->shape[0] ? 1 : 0; /* a last row alone: itself again */
        for (int64_t ci = 0; ci < C; ci++) {
            s.S = S + ci * per;
            quad_tile(&s, c, dc, lanes, bl);
            for (int64_t i = 0; i <= dc; i++) {
                if (so && ci == 0)
                    so[c + i] = lanes_tree(bl + 16 * i);
                for (int64_t j = 0; po && j < 9; j++)
                    po[(c + i) * 9 * C + ci * 9 + j] = lanes_tree(lanes + 16 * (i * 9 + j));
            }
        }
    }
    return LOOM_OK;
#else
    (void)p, (void)b, (void)id;
    return LOOM_OK;
#endif
}
