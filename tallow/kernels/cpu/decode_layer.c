/* A whole decode step of the llama block (llama, qwen2, qwen3: smollm2, qwen2.5) or gemma3's in one C call: every layer's
 * add + RMSNorm, Q/K/V product (+ bias), RoPE, the K/V write into the f16 pool, attention, output
 * product, add + RMSNorm, gate/up product, SwiGLU and down product, for one token or the rows of a
 * speculative verification.
 *
 * Why: with the products, the norms and the attention already in C, a decode step of smollm2 (30
 * layers) still made ~13 Python-level calls a layer and ~25 torch calls around them (views, RoPE's
 * four kernels, the K/V casts, SiLU and its product, allocations): about as long as the products
 * themselves (docs/performance.md, session 12). Here the layers run back to back without Python.
 *
 * Same bits as the composed default path (models/llama.py's and gemma3.py's blocks with TALLOW_CPU_GGML_DOT,
 * TALLOW_CPU_C_NORM and TALLOW_CPU_C_ATTENTION on), because every step is either the same C function
 * it calls or the float operations torch performs there, in the same order:
 *   - norms: go_rms_norm (ggml_ops.c), the residual add in the same call, as ops.add_norm does;
 *   - products: tg_linear_multi with the layer's own plans (ggml_dot.py's _Products); a bias is one
 *     rounded add per output (Linear.__call__'s y + bias);
 *   - RoPE: RotaryTables.rotate's `rot * cos + swapped * sin`, three rounded operations per value (no
 *     fused multiply-add: built with -ffp-contract=off), over the tables' own rows (cos_full,
 *     sin_signed); the part of a head past rope_dim copied;
 *   - K/V: float to f16 rounded to nearest even (tg_f32_to_f16, as torch's .to(float16));
 *   - attention: ta_attend_f16 (decode_attention.c) over keys [max(0, end - window), end);
 *   - GeGLU (gemma3): layers.geglu's F.gelu(gate.half(), approximate="tanh") * up: gate rounded to f16, the
 *     GELU of that f16 value read from a table torch computed for all 65536 of them at load, times up;
 *   - gemma3's Q/K norm (one weight row per head) and post-attention / post-feed-forward norms: go_rms_norm
 *     where ops.norm and rms_norm call it;
 *   - SwiGLU: torch's CPU silu, x / (1 + exp(-x)): its AVX-512 loop takes 32 values at a time through
 *     Sleef's expf (u10, 16 lanes), the last n % 32 values through libm's expf; the exp here is that
 *     same Sleef function, its address handed over from torch's library (decode_layer.py) and checked
 *     against F.silu at load; then one rounded product with up. (Over the rows of a verification torch may
 *     split the values between threads, each piece with its own scalar tail: decode_layer.py takes only
 *     row counts whose pieces start on whole blocks of 32, where every value is computed as here.)
 * tests/test_decode_layer.py compares the logits of both paths bit for bit.
 *
 * Threads: the products and the attention open their own OpenMP regions as when called from Python;
 * the elementwise steps run on the calling thread (a few thousand values a layer).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "ggml_dot.h"
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define DL_X86 1
#define DL_TGT __attribute__((target("avx512f")))
#else
#define DL_X86 0
#endif

void go_rms_norm(const float *x, int64_t x_stride, const float *d, float *sum_out, int64_t rows, int64_t n, const float *w,
                 int64_t w_rows, float eps, float *y); /* ggml_ops.c */

/* One layer: its plans and norm weights (held by the Python side), its RoPE table, its cache rows. */
typedef struct {
    const tg_plan_t *qkv, *out, *gate_up, *down;
    const float *attn_norm, *ffn_norm;
    const float *qkv_bias;                     /* NULL: none */
    const float *qk_norm;                      /* (n_heads + n_kv, head_dim), one row per head; NULL: none */
    const float *post_attn_norm, *post_ffw_norm; /* gemma3's sandwich norms; NULL: none */
    const float *cos, *sin;                    /* RotaryTables' cos_full, sin_signed: rope_dim floats per position */
    uint16_t *k, *v;                           /* the pool's f16 tensors of this layer, (n_kv, n_ctx, dim) */
    int64_t skh, skt, svh, svt;
    int64_t window; /* 0: none */
} dl_layer_t;

typedef struct {
    int64_t n_layers, dim, n_heads, n_kv, head_dim, v_head_dim, rope_dim, ffn;
    int32_t neox, geglu; /* geglu: GELU(gate) * up through `gelu`, else SwiGLU */
    float eps, scale;
    const float *gelu; /* torch's fp16 GELU (tanh) of every fp16 value, as float (65536) */
    const dl_layer_t *layers;
} dl_model_t;

int dl_abi_version(void) { return 2; }

/* ------------------------------------------------------------------ SiLU as torch computes it */

#if DL_X86
typedef __m512 (*dl_vexp_fn)(__m512);
static dl_vexp_fn g_vexp; /* torch's Sleef_expf16_u10 */
#endif

/* Hand over torch's 16-lane expf (NULL: none); returns whether SwiGLU can run here. */
int dl_set_vexp(void *fn) {
#if DL_X86
    g_vexp = (dl_vexp_fn)fn;
    return g_vexp != 0;
#else
    (void)fn;
    return 0;
#endif
}

#if DL_X86
/* y = silu(g) * u over n values: torch's vectorized loop (Loops.h) takes whole blocks of 2 x 16
 * lanes, the rest one value at a time with the scalar op (libm's expf). */
DL_TGT static void swiglu_torch(const float *g, const float *u, float *y, int64_t n) {
    const int64_t nv = n - n % 32;
    const __m512 one = _mm512_set1_ps(1.0f);
    int64_t i = 0;
    for (; i < nv; i += 16) {
        const __m512 x = _mm512_loadu_ps(g + i);
        const __m512 e = g_vexp(_mm512_sub_ps(_mm512_setzero_ps(), x)); /* x.neg(): the sign flipped, exact */
        const __m512 s = _mm512_div_ps(x, _mm512_add_ps(one, e));
        _mm512_storeu_ps(y + i, _mm512_mul_ps(s, _mm512_loadu_ps(u + i)));
    }
    for (; i < n; i++) {
        const float s = g[i] / (1.0f + expf(-g[i]));
        y[i] = s * u[i];
    }
}
#endif

/* Test hook: the SwiGLU above on its own (tests compare it with torch's F.silu(g) * u). */
int dl_swiglu(const float *g, const float *u, float *y, int64_t n) {
#if DL_X86
    if (!g_vexp) return -1;
    swiglu_torch(g, u, y, n);
    return 0;
#else
    (void)g; (void)u; (void)y; (void)n;
    return -1;
#endif
}

/* ------------------------------------------------------------------ one step */

/* out (heads, head_dim) from x (heads, head_dim): RotaryTables.rotate at one position */
static void rope_heads(const dl_model_t *M, const float *x, float *out, int64_t heads, const float *cos, const float *sin) {
    const int64_t hd = M->head_dim, rd = M->rope_dim, half = rd / 2;
    for (int64_t h = 0; h < heads; h++) {
        const float *src = x + h * hd;
        float *dst = out + h * hd;
        for (int64_t j = 0; j < rd; j++) {
            const float swapped = M->neox ? src[j < half ? j + half : j - half] : src[j ^ 1];
            const float a = src[j] * cos[j], b = swapped * sin[j];
            dst[j] = a + b;
        }
        for (int64_t j = rd; j < hd; j++) dst[j] = src[j];
    }
}

static float *scratch_floats(int64_t n) {
    static __thread float *buf;
    static __thread int64_t have;
    if (n > have) {
        free(buf);
        buf = aligned_alloc(64, (size_t)((n * 4 + 63) / 64 * 64));
        have = buf ? n : 0;
    }
    return buf;
}

/* m consecutive tokens at positions pos.. through every layer: one decode token (m = 1), or the rows of a
 * speculative verification (m <= 8), each row computed as its own decode step computes it (the products
 * take every row in vec_dot's order whatever m is; row i attends keys ..pos + i, as the composed
 * verification's query-by-query attention does). x (m, dim): the residual stream (the embeddings in; the
 * stream before the last layer's delta out, in place); delta (m, dim): the last layer's down product,
 * left unadded as the composed blocks leave it (the output norm adds it). Returns 0; -1 without torch's exp, -2
 * when scratch cannot be allocated, -3 when a product refuses. */
int dl_decode(const dl_model_t *M, float *x, float *delta, int64_t m, int64_t pos, int nthreads) {
#if DL_X86
    if (!g_vexp) return -1;
#else
    return -1;
#endif
    const int64_t dim = M->dim, nh = M->n_heads, nkv = M->n_kv, hd = M->head_dim, vhd = M->v_head_dim, ffn = M->ffn;
    const int64_t rd = M->rope_dim, nqk = (nh + nkv) * hd, nqkv = nqk + nkv * vhd;
    int64_t act = 0; /* the products' quantized activations, in bytes, for the largest plan */
    for (int64_t l = 0; l < M->n_layers; l++) {
        const dl_layer_t *L = &M->layers[l];
        const tg_plan_t *plans[4] = {L->qkv, L->out, L->gate_up, L->down};
        for (int i = 0; i < 4; i++) {
            const int64_t b = tg_plan_scratch(plans[i], m);
            if (b > act) act = b;
        }
    }
    const int64_t floats = m * (dim + 2 * nqkv + nqk + nh * vhd + dim + 3 * ffn) + (act + 3) / 4 + 64;
    float *buf = scratch_floats(floats);
    if (!buf) return -2;
    float *h = buf, *qkv = h + m * dim, *qk = qkv + m * nqkv, *att = qk + m * nqk, *o = att + m * nh * vhd;
    float *gu = o + m * dim, *g = gu + m * 2 * ffn, *normed = g + m * ffn;
    uint8_t *xq = (uint8_t *)(normed + m * nqkv);
    for (int64_t l = 0; l < M->n_layers; l++) {
        const dl_layer_t *L = &M->layers[l];
        /* x, h = add_norm(x, delta, attn_norm): nothing pending before the first layer */
        go_rms_norm(x, dim, l ? delta : NULL, l ? x : NULL, m, dim, L->attn_norm, 1, M->eps, h);
        if (tg_linear_multi(L->qkv, h, m, xq, qkv, nthreads)) return -3;
        for (int64_t r = 0; r < m; r++) {
            float *row = qkv + r * nqkv, *rot = qk + r * nqk;
            if (L->qkv_bias)
                for (int64_t i = 0; i < nqkv; i++) row[i] = row[i] + L->qkv_bias[i];
            const float *heads = row;
            if (L->qk_norm) { /* rms_norm over each Q and K head, head h with weight row h */
                go_rms_norm(row, hd, NULL, NULL, nh + nkv, hd, L->qk_norm, nh + nkv, M->eps, normed + r * nqkv);
                heads = normed + r * nqkv;
            }
            const int64_t at = pos + r;
            rope_heads(M, heads, rot, nh + nkv, L->cos + at * rd, L->sin + at * rd);
            for (int64_t kh = 0; kh < nkv; kh++) {
                uint16_t *kr = L->k + kh * L->skh + (pos + r) * L->skt, *vr = L->v + kh * L->svh + (pos + r) * L->svt;
                const float *ks = rot + (nh + kh) * hd, *vs = row + nqk + kh * vhd;
                for (int64_t j = 0; j < hd; j++) kr[j] = tg_f32_to_f16(ks[j]);
                for (int64_t j = 0; j < vhd; j++) vr[j] = tg_f32_to_f16(vs[j]);
            }
        }
        for (int64_t r = 0; r < m; r++) { /* every row's K/V is written: row r sees keys ..pos + r */
            const int64_t end = pos + r + 1, begin = L->window && end > L->window ? end - L->window : 0;
            if (ta_attend_f16(qk + r * nqk, (int)nh, (int)nkv, (int)hd, (int)vhd, L->k, L->v, L->skh, L->skt, L->svh,
                              L->svt, begin, end, 0, M->scale, 0.0f, att + r * nh * vhd, nthreads))
                return -2;
        }
        if (tg_linear_multi(L->out, att, m, xq, o, nthreads)) return -3;
        if (L->post_attn_norm) go_rms_norm(o, dim, NULL, NULL, m, dim, L->post_attn_norm, 1, M->eps, o); /* in place */
        go_rms_norm(x, dim, o, x, m, dim, L->ffn_norm, 1, M->eps, h);
        if (tg_linear_multi(L->gate_up, h, m, xq, gu, nthreads)) return -3;
        for (int64_t r = 0; r < m; r++) {
            const float *gr = gu + r * 2 * ffn, *ur = gr + ffn;
            float *yr = g + r * ffn;
            if (M->geglu) {
                for (int64_t i = 0; i < ffn; i++) yr[i] = M->gelu[tg_f32_to_f16(gr[i])] * ur[i];
            } else {
#if DL_X86
                swiglu_torch(gr, ur, yr, ffn);
#endif
            }
        }
        if (tg_linear_multi(L->down, g, m, xq, delta, nthreads)) return -3;
        if (L->post_ffw_norm) go_rms_norm(delta, dim, NULL, NULL, m, dim, L->post_ffw_norm, 1, M->eps, delta);
    }
    return 0;
}
