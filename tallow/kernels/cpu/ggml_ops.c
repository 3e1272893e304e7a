/* ggml's elementwise arithmetic for TALLOW_NUMERICS=ggml, in C: the decode step's RMSNorm, RoPE
 * rotation, SwiGLU/GeGLU and one-token attention over the f16 KV cache. The default C decode step
 * (decode_layer.c, TALLOW_CPU_GGML_STEP) calls the same functions.
 *
 * Each function gives the bits of its torch emulation in tallow/numerics.py (the reference, itself
 * bit-identical to llama.cpp b11434's CPU backend: flash attention off, f16 K/V), only without the
 * dozens of small torch calls per op. What fixes the bits, op by op:
 *   - RMSNorm: squares in float summed one by one in double, mean = (float)(sum / n),
 *     scale = 1 / sqrtf(mean + eps) (correctly rounded), then (x * scale) * w.
 *   - RoPE: rotate_pairs with GCC's contraction: fma(x0, cos, x1 * -sin) and fma(x0, sin, x1 * cos).
 *   - exp: ggml_v_expf (AVX-512 form): degree-5 polynomial, every multiply-add fused, j * 2^n rounded
 *     once; SiLU x / (1 + exp(-x)); SwiGLU silu(g) * u. GeGLU: ggml's fp16 GELU table (passed in).
 *   - attention, one query: Q rounded to f16; scores by ggml_vec_dot_f16 (4 accumulators of 16
 *     lanes over steps of 64 values, reduced (0+2)+(1+3), then the 16 lanes as GCC's
 *     _mm512_reduce_add_ps: halves, quarters, pairs), times the scale; softmax: exp(s - max) per
 *     block of 16, each block summed by the same lane tree in float, the block sums added in
 *     double, weights times (float)(1 / sum); weights rounded to f16; the V product by
 *     ggml_vec_dot_f16 over the keys (key i in lane i % 64, keys counted from the view's first).
 * Products of two f16 values are exact in float, so a fused multiply-add there is one rounded add
 * and only the order of the adds matters. The AVX-512 code and the portable C below do the same
 * float operations in the same order (tests/test_ggml_numerics.py runs both against the emulation).
 *
 * Built into the optional library with ggml_dot.c (-ffp-contract=off: a multiply-add is fused where
 * written as fmaf or an FMA intrinsic, nowhere else); loaded through ctypes by ggml_ops.py.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#include "ggml_math.h" /* GO_X86, GO_TGT, expf_lane, expf16, hsum16(_lanes) */

float tg_f16_to_f32(uint16_t h);  /* ggml_dot.c: the library's fp16 converters */
uint16_t tg_f32_to_f16(float f); /* round to nearest even, as vcvtps2ph */

static int go_use_simd = -1;

static int go_best(void) {
#if GO_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq")) return 2;
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c") ? 1 : 0;
#else
    return 0;
#endif
}

/* the code in use: 2 AVX-512, 1 AVX2, 0 portable (ssm_step.c reads it too) */
int go_simd(void) {
    if (go_use_simd < 0) go_use_simd = go_best();
    return go_use_simd;
}

/* the best code up to `level` (-1: no cap; tests run each); returns the level now in use */
int go_set_simd(int level) {
    const int best = go_best();
    go_use_simd = level < 0 || level > best ? best : level;
    return go_use_simd;
}

static inline float round_f16(float x) { return tg_f16_to_f32(tg_f32_to_f16(x)); }

/* ------------------------------------------------------------------ RMSNorm */

/* y (rows, n) = rms_norm(x rows (x_stride apart)) * w[row % w_rows] (w NULL: no weight). With d
 * (rows, n contiguous) not NULL the rows normed are x + d (one rounded add, as torch's), written to
 * sum (rows, n): the residual add before a block's norm, in the same call. */
void go_rms_norm(const float *x, int64_t x_stride, const float *d, float *sum_out, int64_t rows, int64_t n, const float *w,
                 int64_t w_rows, float eps, float *y) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * x_stride;
        float *yr = y + r * n;
        if (d) {
            float *sr = sum_out + r * n;
            for (int64_t i = 0; i < n; i++) sr[i] = xr[i] + d[r * n + i];
            xr = sr;
        }
        double sum = 0.0;
        for (int64_t i = 0; i < n; i++) sum += (double)(xr[i] * xr[i]);
        const float mean = (float)(sum / (double)n);
        const float scale = 1.0f / sqrtf(mean + eps);
        const float *wr = w ? w + (r % w_rows) * n : NULL;
        if (wr)
            for (int64_t i = 0; i < n; i++) yr[i] = (xr[i] * scale) * wr[i];
        else
            for (int64_t i = 0; i < n; i++) yr[i] = xr[i] * scale;
    }
}

/* ------------------------------------------------------------------ RoPE */

/* out (n_tok, heads, head_dim) contiguous from x (strides in floats, last dim contiguous): the first
 * rope_dim values of each head rotated by the token's table rows (cos_full, sin_signed: rope_dim
 * floats per token, sin negated on first members), the rest copied. neox: pairs (i, i + rd/2), else
 * (2i, 2i+1). */
void go_rope(const float *x, int64_t st_tok, int64_t st_head, int64_t n_tok, int64_t heads, int head_dim, int rope_dim,
             const float *cos_full, const float *sin_signed, int neox, float *out) {
    const int half = rope_dim / 2;
    for (int64_t t = 0; t < n_tok; t++) {
        const float *c = cos_full + t * rope_dim, *s = sin_signed + t * rope_dim;
        for (int64_t h = 0; h < heads; h++) {
            const float *xh = x + t * st_tok + h * st_head;
            float *o = out + (t * heads + h) * head_dim;
            for (int p = 0; p < half; p++) {
                const int i0 = neox ? p : 2 * p, i1 = neox ? p + half : 2 * p + 1;
                const float x0 = xh[i0], x1 = xh[i1];
                o[i0] = fmaf(x0, c[i0], x1 * s[i0]); /* x0 cos - x1 sin */
                o[i1] = fmaf(x0, s[i1], x1 * c[i1]); /* x0 sin + x1 cos */
            }
            if (rope_dim < head_dim) memcpy(o + rope_dim, xh + rope_dim, sizeof(float) * (size_t)(head_dim - rope_dim));
        }
    }
}

/* cosf and sinf of n angles, libm's, as ggml_rope_cache_init calls them: numerics.ggml_rope_cos_sin's tables in one
 * call (one ctypes call per value took seconds for a long context's tables). */
void go_cos_sin(const float *angles, int64_t n, float *c, float *s) {
    for (int64_t i = 0; i < n; i++) {
        c[i] = cosf(angles[i]);
        s[i] = sinf(angles[i]);
    }
}

/* ------------------------------------------------------------------ gated units */

#if GO_X86
/* the row's whole blocks of 16 in AVX-512; returns how many values it did */
GO_TGT static int64_t swiglu_avx512(const float *g, const float *u, int64_t n, float *y) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 x = _mm512_loadu_ps(g + i);
        const __m512 e = expf16(_mm512_sub_ps(_mm512_setzero_ps(), x));
        _mm512_storeu_ps(y + i, _mm512_mul_ps(_mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0f), e)), _mm512_loadu_ps(u + i)));
    }
    return i;
}

GO_TGT2 static int64_t swiglu_avx2(const float *g, const float *u, int64_t n, float *y) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 x = _mm256_loadu_ps(g + i);
        const __m256 e = expf8(_mm256_sub_ps(_mm256_setzero_ps(), x));
        _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), e)), _mm256_loadu_ps(u + i)));
    }
    return i;
}
#endif

/* y = silu(g) * u over rows (g, u, y row strides in floats); silu by ggml_v_expf on every value (the
 * emulation's choice; ggml's scalar tail for widths not a multiple of 16 would use libm's expf). */
void go_swiglu(const float *g, int64_t gs, const float *u, int64_t us, int64_t rows, int64_t n, float *y, int64_t ys) {
    const int simd = go_simd();
    for (int64_t r = 0; r < rows; r++) {
        const float *gr = g + r * gs, *ur = u + r * us;
        float *yr = y + r * ys;
        int64_t i = 0;
#if GO_X86
        if (simd == 2) i = swiglu_avx512(gr, ur, n, yr);
        else if (simd == 1) i = swiglu_avx2(gr, ur, n, yr);
#endif
        for (; i < n; i++) yr[i] = (gr[i] / (1.0f + expf_lane(0.0f - gr[i]))) * ur[i];
    }
}

#if GO_X86
/* Eight values at a time (AVX-512 machines run it too): F16C's rounding, which ggml's FP32_TO_FP16 is on such
 * CPUs and tg_f32_to_f16 mirrors, makes the table index; one gather reads the eight entries. */
GO_TGT2 static int64_t geglu_avx2(const float *g, const float *u, int64_t n, const float *table, float *y) {
    const __m256 lo = _mm256_set1_ps(-10.0f), hi = _mm256_set1_ps(10.0f);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 x = _mm256_loadu_ps(g + i), up = _mm256_loadu_ps(u + i);
        const __m256i idx = _mm256_cvtepu16_epi32(_mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
        __m256 v = _mm256_mul_ps(_mm256_i32gather_ps(table, idx, 4), up);
        v = _mm256_blendv_ps(v, _mm256_mul_ps(x, up), _mm256_cmp_ps(x, hi, _CMP_GE_OQ));
        _mm256_storeu_ps(y + i, _mm256_blendv_ps(v, _mm256_setzero_ps(), _mm256_cmp_ps(x, lo, _CMP_LE_OQ)));
    }
    return i;
}
#endif

/* y = gelu(g) * u by ggml's fp16 table (65536 floats): 0 where g <= -10, g * u where g >= 10. */
void go_geglu(const float *g, int64_t gs, const float *u, int64_t us, int64_t rows, int64_t n, const float *table, float *y,
              int64_t ys) {
    const int simd = go_simd();
    for (int64_t r = 0; r < rows; r++) {
        const float *gr = g + r * gs, *ur = u + r * us;
        float *yr = y + r * ys;
        int64_t i = 0;
#if GO_X86
        if (simd >= 1) i = geglu_avx2(gr, ur, n, table, yr);
#endif
        for (; i < n; i++) {
            const float x = gr[i];
            yr[i] = x <= -10.0f ? 0.0f : x >= 10.0f ? x * ur[i] : table[tg_f32_to_f16(x)] * ur[i];
        }
    }
}

/* ------------------------------------------------------------------ attention */

typedef struct {
    const float *q;                  /* query row r, head h at q + r * sqr + h * sqh */
    int64_t sqr, sqh;
    const uint16_t *k, *v;           /* f16 cache bases */
    int64_t skh, skt, svh, svt;      /* strides (elements) */
    int64_t cap, lo, n, start, window; /* key i: position lo + i, slot (lo + i) % cap; row r: position start + r */
    int64_t lo_slot;                 /* lo % cap (key i's slot: lo_slot + i, less cap past the end; i < n <= cap) */
    int n_q, n_heads, group, dk, dv, lanes;
    float scale;
    float *out;                      /* (n_q, n_heads, dv) */
} go_attn_t;

/* The product's lanes to one float. 64 lanes (ggml_vec_dot_f16, one query row): lane l + 16 j in
 * acc[j][l], reduced (0+2) + (1+3), then the 16 lanes; 16 lanes (llamafile's tinyBLAS, prompt rows):
 * the 16 lanes alone. */
static inline float lanes_sum(const float *acc, int64_t stride, int lanes) {
    float c[16];
    for (int l = 0; l < 16; l++)
        c[l] = lanes == 64 ? (acc[l * stride] + acc[(32 + l) * stride]) + (acc[(16 + l) * stride] + acc[(48 + l) * stride])
                           : acc[l * stride];
    return hsum16_lanes(c);
}

static inline const uint16_t *key_row(const go_attn_t *a, const uint16_t *base, int64_t st, int64_t i) {
    const int64_t slot = a->lo_slot + i;
    return base + (slot < a->cap ? slot : slot - a->cap) * st;
}

/* the keys row r sees: [*i0, *i1) of the view (the causal edge, and a window's) */
static inline void visible(const go_attn_t *a, int r, int64_t *i0, int64_t *i1) {
    const int64_t pos = a->start + r;
    *i1 = pos - a->lo + 1 < a->n ? pos - a->lo + 1 : a->n;
    *i0 = a->window > 0 && pos - a->window + 1 > a->lo ? pos - a->window + 1 - a->lo : 0;
}

/* this thread's `per` floats of a parallel region's scratch */
static inline float *thread_slice(float *scratch, int64_t per) {
#ifdef _OPENMP
    return scratch + per * omp_get_thread_num();
#else
    (void)per;
    return scratch;
#endif
}

/* softmax of p[0, n16) in place (n16 a multiple of 16, -inf past the keys): ggml_vec_soft_max_f32.
 * The keys past a row's causal edge are -inf in ggml's row too: their blocks add exact zeros. */
static void softmax_portable(float *p, int64_t n16) {
    float top = -INFINITY;
    for (int64_t i = 0; i < n16; i++) top = p[i] > top ? p[i] : top;
    if (!(top > -INFINITY)) top = 0.0f;
    double sum = 0.0;
    for (int64_t i = 0; i < n16; i += 16) {
        for (int l = 0; l < 16; l++) p[i + l] = expf_lane(p[i + l] - top);
        sum += (double)hsum16_lanes(p + i);
    }
    const float inv = (float)(1.0 / sum);
    for (int64_t i = 0; i < n16; i++) p[i] *= inv;
}

/* one (row, head), portable: p (n + 16 floats), acc (64 * dv floats) scratch */
static void head_portable(const go_attn_t *a, int r, int h, float *p, float *acc) {
    int64_t i0, i1;
    visible(a, r, &i0, &i1);
    const int64_t n16 = (i1 + 15) / 16 * 16;
    const int g = h / a->group, lanes = a->lanes;
    const float *q = a->q + r * a->sqr + h * a->sqh;
    const uint16_t *kb = a->k + g * a->skh, *vb = a->v + g * a->svh;
    for (int64_t i = 0; i < n16; i++) p[i] = -INFINITY;
    for (int64_t i = i0; i < i1; i++) {
        const uint16_t *kr = key_row(a, kb, a->skt, i);
        float s[64] = {0};
        for (int d = 0; d < a->dk; d++) s[d % lanes] += round_f16(q[d]) * tg_f16_to_f32(kr[d]); /* exact products */
        p[i] = lanes_sum(s, 1, lanes) * a->scale;
    }
    softmax_portable(p, n16);
    memset(acc, 0, sizeof(float) * (size_t)lanes * a->dv);
    for (int64_t i = i0; i < i1; i++) { /* masked keys add exact zeros: skipped */
        const float w = round_f16(p[i]);
        const uint16_t *vr = key_row(a, vb, a->svt, i);
        float *ac = acc + (i % lanes) * a->dv;
        for (int d = 0; d < a->dv; d++) ac[d] += w * tg_f16_to_f32(vr[d]);
    }
    float *o = a->out + ((int64_t)r * a->n_heads + h) * a->dv;
    for (int d = 0; d < a->dv; d++) o[d] = lanes_sum(acc + d, a->dv, lanes);
}

#if GO_X86
/* softmax_portable's arithmetic with 16 lanes at once, then each weight rounded to f16 (the V product's input) */
GO_TGT static void softmax_f16_avx512(float *p, int64_t n16) {
    __m512 mx = _mm512_set1_ps(-INFINITY);
    for (int64_t i = 0; i < n16; i += 16) mx = _mm512_max_ps(mx, _mm512_loadu_ps(p + i));
    float top = _mm512_reduce_max_ps(mx);
    if (!(top > -INFINITY)) top = 0.0f;
    double sum = 0.0;
    for (int64_t i = 0; i < n16; i += 16) {
        const __m512 e = expf16(_mm512_sub_ps(_mm512_loadu_ps(p + i), _mm512_set1_ps(top)));
        _mm512_storeu_ps(p + i, e);
        sum += (double)hsum16(e);
    }
    const __m512 inv = _mm512_set1_ps((float)(1.0 / sum));
    for (int64_t i = 0; i < n16; i += 16)
        _mm512_storeu_ps(p + i, _mm512_cvtph_ps(_mm512_cvtps_ph(_mm512_mul_ps(_mm512_loadu_ps(p + i), inv), _MM_FROUND_TO_NEAREST_INT)));
}

/* hsum16 of 16 vectors at once, result k = hsum16(t[k]): the same adds in the same tree (halves, quarters, pairs:
 * (l + l+8), then (+4), then (0+2) + (1+3)), 16 keys per add by shuffling the vectors' halves against each other
 * instead of one key's halves within one register. */
GO_TGT static inline __m512 hsum16x16(const __m512 *t) {
    __m512 x[8], y[4], z[2];
    for (int m = 0; m < 8; m++) /* 256-bit halves: [a(2m) | a(2m+1)], a_l = t_l + t_{l+8} */
        x[m] = _mm512_add_ps(_mm512_shuffle_f32x4(t[2 * m], t[2 * m + 1], 0x44), _mm512_shuffle_f32x4(t[2 * m], t[2 * m + 1], 0xEE));
    for (int n = 0; n < 4; n++) /* 128-bit lanes: b(4n + j) in lane j, b_l = a_l + a_{l+4} */
        y[n] = _mm512_add_ps(_mm512_shuffle_f32x4(x[2 * n], x[2 * n + 1], 0x88), _mm512_shuffle_f32x4(x[2 * n], x[2 * n + 1], 0xDD));
    for (int q = 0; q < 2; q++) /* lane j: [b0+b2, b1+b3] of keys 8q + j and 8q + 4 + j */
        z[q] = _mm512_add_ps(_mm512_shuffle_ps(y[2 * q], y[2 * q + 1], 0x44), _mm512_shuffle_ps(y[2 * q], y[2 * q + 1], 0xEE));
    /* (b0+b2) + (b1+b3): element 4j + e holds key 4e + j */
    const __m512 r = _mm512_add_ps(_mm512_shuffle_ps(z[0], z[1], 0x88), _mm512_shuffle_ps(z[0], z[1], 0xDD));
    const __m512i order = _mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0);
    return _mm512_permutexvar_ps(order, r);
}

/* one (row, head) of a prompt (tinyBLAS's 16 lanes), AVX-512 (dk, dv multiples of 16); q16: dk floats of scratch */
GO_TGT static void head_avx512(const go_attn_t *a, int r, int h, float *p, float *q16) {
    int64_t i0, i1;
    visible(a, r, &i0, &i1);
    const int64_t n16 = (i1 + 15) / 16 * 16;
    const int g = h / a->group;
    const float *q = a->q + r * a->sqr + h * a->sqh;
    const uint16_t *kb = a->k + g * a->skh, *vb = a->v + g * a->svh;
    for (int d = 0; d < a->dk; d += 16) /* Q to f16 and back, once */
        _mm512_storeu_ps(q16 + d, _mm512_cvtph_ps(_mm512_cvtps_ph(_mm512_loadu_ps(q + d), _MM_FROUND_TO_NEAREST_INT)));
    for (int64_t i = 0; i < n16; i++) p[i] = -INFINITY;
    const __m512 scale = _mm512_set1_ps(a->scale);
    for (int64_t c0 = i0; c0 < i1; c0 += 16) { /* 16 keys at a time, each one accumulator (tinyBLAS's 16 lanes) */
        const int nk = i1 - c0 < 16 ? (int)(i1 - c0) : 16;
        const uint16_t *kr[16];
        for (int k = 0; k < 16; k++) kr[k] = key_row(a, kb, a->skt, c0 + (k < nk ? k : 0)); /* past nk: masked below */
        __m512 t[16];
        for (int k = 0; k < 16; k++) t[k] = _mm512_setzero_ps();
        for (int d = 0; d < a->dk; d += 16) { /* the 16 chains interleaved: independent, they overlap */
            const __m512 qd = _mm512_loadu_ps(q16 + d);
#define GO_K(l) t[l] = _mm512_fmadd_ps(qd, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(kr[l] + d))), t[l]);
            GO_K(0) GO_K(1) GO_K(2) GO_K(3) GO_K(4) GO_K(5) GO_K(6) GO_K(7)
            GO_K(8) GO_K(9) GO_K(10) GO_K(11) GO_K(12) GO_K(13) GO_K(14) GO_K(15)
#undef GO_K
        }
        /* each key's hsum16 (hsum16x16 keeps the keys apart: element k sums t[k] alone) */
        _mm512_mask_storeu_ps(p + c0, (__mmask16)((1u << nk) - 1), _mm512_mul_ps(hsum16x16(t), scale));
    }
    softmax_f16_avx512(p, n16);
    /* V, 16 output columns at a time: lane l of them sums the products of the keys i with i % 16 == l, in key
     * order, from +0 (a lane no key reaches stays +0, which adds nothing: a lane's sum is never -0); the 16
     * lanes stay in registers over all keys, then reduce as tinyBLAS's tree (halves, quarters, (0+2) + (1+3)) */
    float *o = a->out + ((int64_t)r * a->n_heads + h) * a->dv;
    const int64_t first = i0 / 16 * 16;
    for (int d = 0; d < a->dv; d += 16) {
        __m512 c[16];
        for (int l = 0; l < 16; l++) c[l] = _mm512_setzero_ps();
        for (int64_t b = first; b < i1; b += 16) {
#define GO_V(l)                                                                                                        \
    if (b + (l) >= i0 && b + (l) < i1)                                                                                 \
        c[l] = _mm512_fmadd_ps(_mm512_set1_ps(p[b + (l)]),                                                             \
                               _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(key_row(a, vb, a->svt, b + (l)) + d))), c[l]);
            GO_V(0) GO_V(1) GO_V(2) GO_V(3) GO_V(4) GO_V(5) GO_V(6) GO_V(7)
            GO_V(8) GO_V(9) GO_V(10) GO_V(11) GO_V(12) GO_V(13) GO_V(14) GO_V(15)
#undef GO_V
        }
        for (int l = 0; l < 8; l++) c[l] = _mm512_add_ps(c[l], c[l + 8]);
        for (int l = 0; l < 4; l++) c[l] = _mm512_add_ps(c[l], c[l + 4]);
        _mm512_storeu_ps(o + d, _mm512_add_ps(_mm512_add_ps(c[0], c[2]), _mm512_add_ps(c[1], c[3])));
    }
}
#endif

#if GO_X86
/* One query row (a decode step), heads h0..h1-1 of one KV group, AVX-512: each head's arithmetic is head_portable's
 * for one row (ggml_vec_dot_f16's 64 lanes), operation for operation, only the loops are turned: keys go in blocks of GO_KEY_BLOCK, and a block's
 * K rows (then V rows), read from memory once, serve every head of the range from the L1 cache. Head by head the
 * group's cache was read once per query head (6 times on qwen2.5): at a depth of 4096 that cost more than the step's
 * products. p: (h1 - h0) * n16 floats, acc: (h1 - h0) * 64 * dv, q16: (h1 - h0) * dk. */
#define GO_KEY_BLOCK 32 /* a multiple of 16 */

GO_TGT static void group_one_row_avx512(const go_attn_t *a, int h0, int h1, float *p, float *acc, float *q16, float *kf) {
    int64_t i0, i1;
    visible(a, 0, &i0, &i1);
    const int64_t n16 = (i1 + 15) / 16 * 16, dv = a->dv;
    const int nh = h1 - h0, dk = a->dk, g = h0 / a->group;
    const uint16_t *kb = a->k + g * a->skh, *vb = a->v + g * a->svh;
    for (int j = 0; j < nh; j++) {
        const float *q = a->q + (int64_t)(h0 + j) * a->sqh;
        float *qj = q16 + (int64_t)j * dk, *pj = p + j * n16;
        for (int d = 0; d < dk; d += 16) /* Q to f16 and back, once */
            _mm512_storeu_ps(qj + d, _mm512_cvtph_ps(_mm512_cvtps_ph(_mm512_loadu_ps(q + d), _MM_FROUND_TO_NEAREST_INT)));
        for (int64_t i = 0; i < n16; i++) pj[i] = -INFINITY;
    }
    const __m512 scale = _mm512_set1_ps(a->scale);
    for (int64_t b0 = i0; b0 < i1; b0 += GO_KEY_BLOCK) { /* scores: ggml_vec_dot_f16's 4 x 16 lanes */
        const int64_t b1 = b0 + GO_KEY_BLOCK < i1 ? b0 + GO_KEY_BLOCK : i1;
        for (int64_t i = b0; i < b1; i++) { /* the block's K rows to float once (exact), for every head */
            const uint16_t *kr = key_row(a, kb, a->skt, i);
            for (int d = 0; d < dk; d += 16)
                _mm512_storeu_ps(kf + (i - b0) * dk + d, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(kr + d))));
        }
        for (int j = 0; j < nh; j++) {
            const float *qj = q16 + (int64_t)j * dk;
            float *pj = p + j * n16;
            for (int64_t c0 = b0; c0 < b1; c0 += 16) { /* 16 keys' dot products, reduced together */
                const int nk = b1 - c0 < 16 ? (int)(b1 - c0) : 16;
                __m512 t[16];
                for (int k = 0; k < 16; k++) {
                    if (k >= nk) {
                        t[k] = _mm512_setzero_ps();
                        continue;
                    }
                    const float *kk = kf + (c0 - b0 + k) * dk;
                    __m512 s[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
                    for (int d = 0; d < dk; d += 16)
                        s[(d / 16) % 4] = _mm512_fmadd_ps(_mm512_loadu_ps(qj + d), _mm512_loadu_ps(kk + d), s[(d / 16) % 4]);
                    t[k] = _mm512_add_ps(_mm512_add_ps(s[0], s[2]), _mm512_add_ps(s[1], s[3]));
                }
                _mm512_mask_storeu_ps(pj + c0, (__mmask16)((1u << nk) - 1), _mm512_mul_ps(hsum16x16(t), scale));
            }
        }
    }
    for (int j = 0; j < nh; j++) softmax_f16_avx512(p + j * n16, n16);
    const int used = i1 < 64 ? (int)i1 : 64; /* lanes that take a key (head_avx512's `used`) */
    for (int j = 0; j < nh; j++) memset(acc + (int64_t)j * 64 * dv, 0, sizeof(float) * (size_t)used * dv);
    for (int64_t b0 = i0; b0 < i1; b0 += GO_KEY_BLOCK) { /* V: key i in lane i % 64, keys in order within each lane */
        const int64_t b1 = b0 + GO_KEY_BLOCK < i1 ? b0 + GO_KEY_BLOCK : i1;
        for (int j = 0; j < nh; j++) {
            const float *pj = p + j * n16;
            float *accj = acc + (int64_t)j * 64 * dv;
            for (int64_t i = b0; i < b1; i++) {
                const __m512 w = _mm512_set1_ps(pj[i]);
                const uint16_t *vr = key_row(a, vb, a->svt, i);
                float *ac = accj + (i % 64) * dv;
                for (int64_t d = 0; d < dv; d += 16)
                    _mm512_storeu_ps(ac + d, _mm512_fmadd_ps(w, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(vr + d))), _mm512_loadu_ps(ac + d)));
            }
        }
    }
    for (int j = 0; j < nh; j++) { /* the lane reduction, as head_avx512 */
        const float *accj = acc + (int64_t)j * 64 * dv;
        float *o = a->out + (int64_t)(h0 + j) * dv;
        for (int64_t d = 0; d < dv; d += 16) {
            __m512 c[16];
            const float *col = accj + d;
#define GO_LANE(l) ((l) < used ? _mm512_loadu_ps(col + (l) * dv) : _mm512_setzero_ps())
            for (int l = 0; l < 16; l++) c[l] = _mm512_add_ps(_mm512_add_ps(GO_LANE(l), GO_LANE(32 + l)), _mm512_add_ps(GO_LANE(16 + l), GO_LANE(48 + l)));
#undef GO_LANE
            for (int l = 0; l < 8; l++) c[l] = _mm512_add_ps(c[l], c[l + 8]);
            for (int l = 0; l < 4; l++) c[l] = _mm512_add_ps(c[l], c[l + 4]);
            _mm512_storeu_ps(o + d, _mm512_add_ps(_mm512_add_ps(c[0], c[2]), _mm512_add_ps(c[1], c[3])));
        }
    }
}

GO_TGT2 static void group_one_row_avx2(const go_attn_t *a, int h0, int h1, float *p, float *acc, float *q16, float *kf);

/* go_attend for one query row on AVX-512 (or AVX2): (KV group, range of its heads) items over the threads, each group's heads
 * split into as few ranges as keep every thread busy. */
static int one_row_grouped(const go_attn_t *a, int n_kv, int nthreads) {
    const int group = a->group, n16 = (int)((a->n + 15) / 16 * 16);
    int split = nthreads > n_kv ? (nthreads + n_kv - 1) / n_kv : 1;
    if (split > group) split = group;
    const int per_range = (group + split - 1) / split, items = n_kv * split;
    if (nthreads > items) nthreads = items;
    const int64_t per = (int64_t)per_range * (n16 + 64 * (int64_t)a->dv + a->dk) + (int64_t)GO_KEY_BLOCK * a->dk;
    float *scratch = malloc(sizeof(float) * (size_t)(per * (nthreads > 1 ? nthreads : 1)));
    if (!scratch) return -1;
#pragma omp parallel for num_threads(nthreads) schedule(dynamic, 1) if (nthreads > 1)
    for (int it = 0; it < items; it++) {
        float *s = thread_slice(scratch, per);
        const int g = it / split, part = it % split;
        const int h0 = g * group + part * group / split, h1 = g * group + (part + 1) * group / split;
        if (h1 > h0) {
            const int nh = h1 - h0;
            float *acc = s + (int64_t)nh * n16, *q16 = acc + (int64_t)nh * 64 * a->dv;
            if (go_simd() == 2) group_one_row_avx512(a, h0, h1, s, acc, q16, q16 + (int64_t)nh * a->dk);
            else group_one_row_avx2(a, h0, h1, s, acc, q16, q16 + (int64_t)nh * a->dk);
        }
    }
    free(scratch);
    return 0;
}
#endif

#if GO_X86
/* AVX2: the AVX-512 attention's arithmetic, operation for operation, each 16-lane vector as two 8-lane halves
 * (lanes 0..7 and 8..15: every multiply-add lane by lane, every reduction hsum16's tree). */
GO_TGT2 static inline __m256 go2_ld8(const uint16_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }
GO_TGT2 static inline __m256 go2_f16(__m256 x) { return _mm256_cvtph_ps(_mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT)); }

/* softmax_f16_avx512's arithmetic */
GO_TGT2 static void softmax_f16_avx2(float *p, int64_t n16) {
    __m256 mx = _mm256_set1_ps(-INFINITY);
    for (int64_t i = 0; i < n16; i += 8) mx = _mm256_max_ps(mx, _mm256_loadu_ps(p + i));
    float m8[8], top = -INFINITY;
    _mm256_storeu_ps(m8, mx);
    for (int l = 0; l < 8; l++) top = m8[l] > top ? m8[l] : top;
    if (!(top > -INFINITY)) top = 0.0f;
    const __m256 t = _mm256_set1_ps(top);
    double sum = 0.0;
    for (int64_t i = 0; i < n16; i += 16) {
        const __m256 lo = expf8(_mm256_sub_ps(_mm256_loadu_ps(p + i), t)), hi = expf8(_mm256_sub_ps(_mm256_loadu_ps(p + i + 8), t));
        _mm256_storeu_ps(p + i, lo);
        _mm256_storeu_ps(p + i + 8, hi);
        sum += (double)hsum16_halves(lo, hi);
    }
    const __m256 inv = _mm256_set1_ps((float)(1.0 / sum));
    for (int64_t i = 0; i < n16; i += 8) _mm256_storeu_ps(p + i, go2_f16(_mm256_mul_ps(_mm256_loadu_ps(p + i), inv)));
}

/* head_avx512 (a prompt row, tinyBLAS's 16 lanes) for nh = 1 or 2 heads h0.. of one KV group, which share each
 * key's and value's f16 row as it is widened: p (nh * n16), q16 (nh * dk), acc (nh * 16 * dv floats of scratch).
 * Each score, softmax and output is the one-head computation's, operation for operation. The small loops are
 * unrolled so their accumulators stay in registers (at -O2 GCC kept them on the stack, each multiply-add a store
 * and a reload). */
GO_TGT2 static inline __attribute__((always_inline)) void heads_avx2(const go_attn_t *a, int r, int h0, const int nh, float *p,
                                                                      float *q16, float *acc) {
    int64_t i0, i1;
    visible(a, r, &i0, &i1);
    const int64_t n16 = (i1 + 15) / 16 * 16, dk = a->dk, dv = a->dv;
    const int g = h0 / a->group;
    const uint16_t *kb = a->k + g * a->skh, *vb = a->v + g * a->svh;
    for (int j = 0; j < nh; j++) {
        const float *q = a->q + r * a->sqr + (h0 + j) * a->sqh;
        for (int64_t d = 0; d < dk; d += 8) _mm256_storeu_ps(q16 + j * dk + d, go2_f16(_mm256_loadu_ps(q + d)));
        for (int64_t i = 0; i < n16; i++) p[j * n16 + i] = -INFINITY;
    }
    const float *qa = q16, *qb = q16 + dk; /* nh is a constant (heads1_avx2, heads2_avx2): one head's code has no b sums */
    for (int64_t c0 = i0; c0 < i1; c0 += 2) { /* 2 keys x 2 heads at a time, each sum its 16 lanes as two halves */
        const int nk = i1 - c0 < 2 ? 1 : 2;
        const uint16_t *k0 = key_row(a, kb, a->skt, c0), *k1 = key_row(a, kb, a->skt, c0 + nk - 1);
        __m256 a0l = _mm256_setzero_ps(), a0h = a0l, a1l = a0l, a1h = a0l, b0l = a0l, b0h = a0l, b1l = a0l, b1h = a0l;
        for (int64_t d = 0; d < dk; d += 16) {
            const __m256 x0l = go2_ld8(k0 + d), x0h = go2_ld8(k0 + d + 8), x1l = go2_ld8(k1 + d), x1h = go2_ld8(k1 + d + 8);
            const __m256 ql = _mm256_loadu_ps(qa + d), qh = _mm256_loadu_ps(qa + d + 8);
            a0l = _mm256_fmadd_ps(ql, x0l, a0l);
            a0h = _mm256_fmadd_ps(qh, x0h, a0h);
            a1l = _mm256_fmadd_ps(ql, x1l, a1l);
            a1h = _mm256_fmadd_ps(qh, x1h, a1h);
            if (nh > 1) {
                const __m256 rl = _mm256_loadu_ps(qb + d), rh = _mm256_loadu_ps(qb + d + 8);
                b0l = _mm256_fmadd_ps(rl, x0l, b0l);
                b0h = _mm256_fmadd_ps(rh, x0h, b0h);
                b1l = _mm256_fmadd_ps(rl, x1l, b1l);
                b1h = _mm256_fmadd_ps(rh, x1h, b1h);
            }
        }
        p[c0] = hsum16_halves(a0l, a0h) * a->scale;
        if (nk > 1) p[c0 + 1] = hsum16_halves(a1l, a1h) * a->scale;
        if (nh > 1) {
            p[n16 + c0] = hsum16_halves(b0l, b0h) * a->scale;
            if (nk > 1) p[n16 + c0 + 1] = hsum16_halves(b1l, b1h) * a->scale;
        }
    }
    for (int j = 0; j < nh; j++) softmax_f16_avx2(p + j * n16, n16);
    /* V: lane l of the 16 sums the keys i % 16 == l in order, into acc row l of each head. Lane by lane and 32
     * columns at a time, the sums stay in registers over the lane's keys and each widened value serves both heads. */
    const float *pa = p, *pb = p + n16;
    for (int l = 0; l < 16; l++) {
        const int64_t first = i0 + (((l - i0) % 16) + 16) % 16;
        for (int64_t d0 = 0; d0 < dv; d0 += 32) {
            const int w = dv - d0 >= 32 ? 4 : 2; /* dv is a multiple of 16 */
            __m256 ca[4], cb[4];
#pragma GCC unroll 4
            for (int u = 0; u < 4; u++) ca[u] = cb[u] = _mm256_setzero_ps();
            for (int64_t i = first; i < i1; i += 16) {
                const uint16_t *vr = key_row(a, vb, a->svt, i) + d0;
                const __m256 wa = _mm256_set1_ps(pa[i]), wb = nh > 1 ? _mm256_set1_ps(pb[i]) : wa;
#pragma GCC unroll 4
                for (int u = 0; u < 4; u++)
                    if (u < w) {
                        const __m256 x = go2_ld8(vr + 8 * u);
                        ca[u] = _mm256_fmadd_ps(wa, x, ca[u]);
                        if (nh > 1) cb[u] = _mm256_fmadd_ps(wb, x, cb[u]);
                    }
            }
#pragma GCC unroll 4
            for (int u = 0; u < 4; u++)
                if (u < w) {
                    _mm256_storeu_ps(acc + l * dv + d0 + 8 * u, ca[u]);
                    if (nh > 1) _mm256_storeu_ps(acc + (16 + l) * dv + d0 + 8 * u, cb[u]);
                }
        }
    }
    for (int j = 0; j < nh; j++) {
        float *o = a->out + ((int64_t)r * a->n_heads + h0 + j) * dv;
        const float *accj = acc + (int64_t)j * 16 * dv;
        for (int64_t d = 0; d < dv; d += 8) {
            __m256 c[16];
#pragma GCC unroll 16
            for (int l = 0; l < 16; l++) c[l] = _mm256_loadu_ps(accj + l * dv + d);
#pragma GCC unroll 8
            for (int l = 0; l < 8; l++) c[l] = _mm256_add_ps(c[l], c[l + 8]);
#pragma GCC unroll 4
            for (int l = 0; l < 4; l++) c[l] = _mm256_add_ps(c[l], c[l + 4]);
            _mm256_storeu_ps(o + d, _mm256_add_ps(_mm256_add_ps(c[0], c[2]), _mm256_add_ps(c[1], c[3])));
        }
    }
}

GO_TGT2 static void heads1_avx2(const go_attn_t *a, int r, int h, float *p, float *q16, float *acc) {
    heads_avx2(a, r, h, 1, p, q16, acc);
}
GO_TGT2 static void heads2_avx2(const go_attn_t *a, int r, int h0, float *p, float *q16, float *acc) {
    heads_avx2(a, r, h0, 2, p, q16, acc);
}

/* group_one_row_avx512 (one query row, ggml_vec_dot_f16's 64 lanes), heads h0..h1-1 of one KV group; kf unused */
GO_TGT2 static void group_one_row_avx2(const go_attn_t *a, int h0, int h1, float *p, float *acc, float *q16, float *kf) {
    (void)kf;
    int64_t i0, i1;
    visible(a, 0, &i0, &i1);
    const int64_t n16 = (i1 + 15) / 16 * 16, dv = a->dv;
    const int nh = h1 - h0, dk = a->dk, g = h0 / a->group;
    const uint16_t *kb = a->k + g * a->skh, *vb = a->v + g * a->svh;
    for (int j = 0; j < nh; j++) {
        const float *q = a->q + (int64_t)(h0 + j) * a->sqh;
        float *qj = q16 + (int64_t)j * dk, *pj = p + j * n16;
        for (int d = 0; d < dk; d += 8) _mm256_storeu_ps(qj + d, go2_f16(_mm256_loadu_ps(q + d)));
        for (int64_t i = 0; i < n16; i++) pj[i] = -INFINITY;
    }
    for (int64_t i = i0; i < i1; i++) { /* each key's row read once for every head */
        const uint16_t *kr = key_row(a, kb, a->skt, i);
        for (int j = 0; j < nh; j++) {
            const float *qj = q16 + (int64_t)j * dk;
            __m256 lo[4], hi[4]; /* accumulator (d / 16) % 4, lanes 0..7 and 8..15 */
#pragma GCC unroll 4
            for (int e = 0; e < 4; e++) lo[e] = hi[e] = _mm256_setzero_ps();
            int d = 0;
            for (; d + 64 <= dk; d += 64) /* e = 0..3 spelled out: a computed index kept the eight on the stack */
#pragma GCC unroll 4
                for (int e = 0; e < 4; e++) {
                    lo[e] = _mm256_fmadd_ps(_mm256_loadu_ps(qj + d + 16 * e), go2_ld8(kr + d + 16 * e), lo[e]);
                    hi[e] = _mm256_fmadd_ps(_mm256_loadu_ps(qj + d + 16 * e + 8), go2_ld8(kr + d + 16 * e + 8), hi[e]);
                }
#pragma GCC unroll 4
            for (int e = 0; e < 4; e++)
                if (d + 16 * e < dk) {
                    lo[e] = _mm256_fmadd_ps(_mm256_loadu_ps(qj + d + 16 * e), go2_ld8(kr + d + 16 * e), lo[e]);
                    hi[e] = _mm256_fmadd_ps(_mm256_loadu_ps(qj + d + 16 * e + 8), go2_ld8(kr + d + 16 * e + 8), hi[e]);
                }
            const __m256 tl = _mm256_add_ps(_mm256_add_ps(lo[0], lo[2]), _mm256_add_ps(lo[1], lo[3]));
            const __m256 th = _mm256_add_ps(_mm256_add_ps(hi[0], hi[2]), _mm256_add_ps(hi[1], hi[3]));
            p[j * n16 + i] = hsum16_halves(tl, th) * a->scale;
        }
    }
    for (int j = 0; j < nh; j++) softmax_f16_avx2(p + j * n16, n16);
    const int used = i1 < 64 ? (int)i1 : 64;
    for (int j = 0; j < nh; j++) memset(acc + (int64_t)j * 64 * dv, 0, sizeof(float) * (size_t)used * dv);
    for (int64_t i = i0; i < i1; i++) { /* V: key i in lane i % 64, keys in order within each lane */
        const uint16_t *vr = key_row(a, vb, a->svt, i);
        for (int j = 0; j < nh; j++) {
            const __m256 w = _mm256_set1_ps(p[j * n16 + i]);
            float *ac = acc + (int64_t)j * 64 * dv + (i % 64) * dv;
            for (int64_t d = 0; d < dv; d += 8)
                _mm256_storeu_ps(ac + d, _mm256_fmadd_ps(w, go2_ld8(vr + d), _mm256_loadu_ps(ac + d)));
        }
    }
    for (int j = 0; j < nh; j++) {
        const float *accj = acc + (int64_t)j * 64 * dv;
        float *o = a->out + (int64_t)(h0 + j) * dv;
        for (int64_t d = 0; d < dv; d += 8) {
            __m256 c[16];
            const float *col = accj + d;
#define GO_LANE2(l) ((l) < used ? _mm256_loadu_ps(col + (l) * dv) : _mm256_setzero_ps())
            for (int l = 0; l < 16; l++) c[l] = _mm256_add_ps(_mm256_add_ps(GO_LANE2(l), GO_LANE2(32 + l)), _mm256_add_ps(GO_LANE2(16 + l), GO_LANE2(48 + l)));
#undef GO_LANE2
            for (int l = 0; l < 8; l++) c[l] = _mm256_add_ps(c[l], c[l + 8]);
            for (int l = 0; l < 4; l++) c[l] = _mm256_add_ps(c[l], c[l + 4]);
            _mm256_storeu_ps(o + d, _mm256_add_ps(_mm256_add_ps(c[0], c[2]), _mm256_add_ps(c[1], c[3])));
        }
    }
}
#endif

/* out (n_q, n_heads, dv) float32: query rows r = 0..n_q-1 at positions start + r (row r, head h at
 * q + r * sqr + h * sqh) over keys i = 0..n-1 at positions lo + i, slots (lo + i) % cap of the f16
 * caches (K head g at k + g * skh, slot t at + t * skt; V likewise); row r sees the keys at positions
 * up to its own and, with window > 0, after pos - window; query head h reads KV head h / (n_heads /
 * n_kv). One row: ggml_vec_dot_f16's 64 lanes; more: tinyBLAS's 16. (row, head) pairs spread over
 * nthreads. Returns 0, -1 without memory. */
int go_attend(const float *q, int64_t sqr, int64_t sqh, int n_q, int n_heads, int n_kv, int dk, int dv, const uint16_t *k,
              const uint16_t *v, int64_t skh, int64_t skt, int64_t svh, int64_t svt, int64_t cap, int64_t lo, int64_t n,
              int64_t start, int64_t window, float scale, float *out, int nthreads) {
    go_attn_t a = {q, sqr, sqh, k, v, skh, skt, svh, svt, cap, lo, n, start, window, lo % cap,
                   n_q, n_heads, n_heads / n_kv, dk, dv, n_q > 1 ? 16 : 64, scale, out};
    const int simd = GO_X86 && dk % 16 == 0 && dv % 16 == 0 ? go_simd() : 0;
    const int64_t n16 = (n + 15) / 16 * 16;
    /* a parallel region costs a few microseconds: only where each thread gets real work */
    const double work = (double)n_q * n_heads * (double)n * (double)(dk + dv);
    if (nthreads < 1 || work < 1.5e5) nthreads = 1;
#if GO_X86
    if (simd && n_q == 1) return one_row_grouped(&a, n_kv, nthreads);
#endif
    /* an item: a query row and a head, or on AVX2 a pair of heads of one KV group (each key's row widened once for both) */
    const int pairs = (a.group + 1) / 2, paired = simd == 1;
    const int64_t units = paired ? (int64_t)n_kv * pairs : n_heads, items = (int64_t)n_q * units;
    const int64_t per = paired ? 2 * (n16 + dk + 16 * (int64_t)dv) : n16 + 64 * (int64_t)dv + dk;
    if (nthreads > items) nthreads = (int)items;
    float *scratch = malloc(sizeof(float) * (size_t)(per * nthreads));
    if (!scratch) return -1;
#pragma omp parallel for num_threads(nthreads) schedule(dynamic, 1) if (nthreads > 1)
    for (int64_t it = 0; it < items; it++) {
        float *s = thread_slice(scratch, per);
        const int r = (int)(it / units), u = (int)(it % units);
#if GO_X86
        if (paired) {
            const int h0 = u / pairs * a.group + 2 * (u % pairs);
            if (a.group - 2 * (u % pairs) < 2) heads1_avx2(&a, r, h0, s, s + 2 * n16, s + 2 * (n16 + dk));
            else heads2_avx2(&a, r, h0, s, s + 2 * n16, s + 2 * (n16 + dk));
            continue;
        }
        if (simd == 2) {
            head_avx512(&a, r, u, s, s + n16);
            continue;
        }
#endif
        head_portable(&a, r, u, s, s + n16);
    }
    free(scratch);
    return 0;
}
