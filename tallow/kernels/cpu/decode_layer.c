/* A whole decode step of the llama block (llama, qwen2, qwen3: smollm2, qwen2.5), gemma3's, dense Gemma 4's (see
 * dl_decode) or Falcon-H1's (the llama block with a Mamba-2 mixer beside the attention) in one C call: every layer's
 * add + RMSNorm, Q/K/V product (+ bias), RoPE, the K/V write into the f16 pool, attention, output
 * product, add + RMSNorm, gate/up product, SwiGLU and down product, for one token or the rows of a
 * speculative verification.
 *
 * Why: with the products, the norms and the attention already in C, a decode step of smollm2 (30
 * layers) still made ~13 Python-level calls a layer and ~25 torch calls around them (views, RoPE's
 * four kernels, the K/V casts, SiLU and its product, allocations): about as long as the products
 * themselves (docs/performance.md, session 12). Here the layers run back to back without Python.
 *
 * Two arithmetics. With TALLOW_CPU_GGML_STEP=1, for the llama block and gemma3's (dl_model_t.ggml_ops): ggml-cpu's,
 * llama.cpp b11434's decode step bit for bit (flash attention off, f16 K/V, repacking off) — the products and norms
 * below, then RoPE over ggml's angle tables with rotate_pairs' fmas (go_rope), Q scaled before the score product where
 * llama.cpp does so (gemma3), the one-query attention with Q and the softmax weights rounded to f16 in ggml_vec_dot_f16's
 * lanes (go_attend), SiLU by ggml_v_expf (go_swiglu), GeGLU by ggml's fp16 table (go_geglu): the functions
 * TALLOW_NUMERICS=ggml calls (ggml_ops.c), every row of a verification as its decode step. Why: with torch's
 * arithmetic between ggml's products a decode step agreed with llama.cpp's on the top-1 token at only 95-96% of
 * teacher-forced positions (the Q8 rounding of every product's input amplifies a last-bit difference; session 14).
 *
 * Otherwise (the default; always for Gemma 4 and Falcon-H1) torch's:
 * same bits as the composed default path (models/llama.py's, gemma3.py's and gemma4.py's blocks with TALLOW_CPU_GGML_DOT,
 * TALLOW_CPU_C_NORM and TALLOW_CPU_C_ATTENTION on), because every step is either the same C function
 * it calls or the float operations torch performs there, in the same order:
 *   - norms: go_rms_norm (ggml_ops.c), the residual add in the same call, as ops.add_norm does;
 *   - products: tg_linear_multi with the layer's own plans (ggml_dot.py's _Products); a bias is one
 *     rounded add per output (Linear.__call__'s y + bias);
 *   - RoPE: RotaryTables.rotate's `rot * cos + swapped * sin`, three rounded operations per value (no
 *     fused multiply-add: built with -ffp-contract=off), over the tables' own rows (cos_full,
 *     sin_signed); the part of a head past rope_dim copied;
 *   - K/V: float to f16 rounded to nearest even (tg_f32_to_f16, as torch's .to(float16));
 *   - attention: ta_attend_f16 (decode_attention.c) over keys [max(0, end - window), end), a sliding-window ring's
 *     rows (position p in row p % ring, where the K/V write puts it) in position order;
 *   - Falcon-H1's mixer (one decode row): ss_mixer_step (ssm_step.c), the call models/falcon_h1.py's block makes, over
 *     the in-projection's outputs that the Q/K/V product computed beside Q/K/V (the same fused plan), then
 *     attn_output(...) + mixer(...) as one rounded add per value;
 *   - GeGLU (gemma3): layers.geglu's F.gelu(gate.half(), approximate="tanh") * up: gate rounded to f16, the
 *     GELU of that f16 value read from a table torch computed for all 65536 of them at load, times up;
 *   - gemma3's Q/K norm (one weight row per head) and post-attention / post-feed-forward norms: go_rms_norm
 *     where ops.norm and rms_norm call it;
 *   - SwiGLU: torch's CPU silu, x / (1 + exp(-x)): its AVX-512 loop takes 32 values at a time through
 *     Sleef's expf (u10, 16 lanes; with torch's AVX2 kernels 16 values through its 8-lane expf), the last
 *     ones through libm's expf; the exp here is that
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
void go_geglu(const float *g, int64_t gs, const float *u, int64_t us, int64_t rows, int64_t n, const float *table, float *y,
              int64_t ys); /* ggml_ops.c: layers.ggml_table_geglu */
void go_swiglu(const float *g, int64_t gs, const float *u, int64_t us, int64_t rows, int64_t n, float *y, int64_t ys);
void go_rope(const float *x, int64_t st_tok, int64_t st_head, int64_t n_tok, int64_t heads, int head_dim, int rope_dim,
             const float *cos_full, const float *sin_signed, int neox, float *out);
int go_attend(const float *q, int64_t sqr, int64_t sqh, int n_q, int n_heads, int n_kv, int dk, int dv, const uint16_t *k,
              const uint16_t *v, int64_t skh, int64_t skt, int64_t svh, int64_t svt, int64_t cap, int64_t lo, int64_t n,
              int64_t start, int64_t window, float scale, float *out, int nthreads); /* ggml_ops.c */
int ss_mixer_step(const void *m, const float *h, const float *proj, float *conv_state, float *ssm_state,
                  uint8_t *act_scratch, float *out, int threads); /* ssm_step.c (its ss_mixer_t *m) */

/* One layer: its plans and norm weights (held by the Python side), its shape, its RoPE table, its cache rows. */
typedef struct {
    const tg_plan_t *qkv, *out, *gate_up, *down; /* qkv: Q alone for a layer that reads another's cache */
    const tg_plan_t *ple_gate, *ple_proj;      /* Gemma 4's per-layer input gate (dim -> d) and projection (d -> dim); NULL: none */
    const float *attn_norm, *ffn_norm;
    const float *qkv_bias;                     /* NULL: none */
    const float *qk_norm;  /* one row per Q and K head, (n_heads + n_kv, head_dim); with writes_kv 0 one row for every Q head; NULL: none */
    const float *v_norm;   /* Gemma 4's weightless V norm (a row of ones, x * 1 exact); NULL: none */
    const float *post_attn_norm, *post_ffw_norm, *ple_post_norm; /* sandwich norms, the per-layer branch's norm; NULL: none */
    const float *out_scale;                    /* Gemma 4's layer output scale (1 float); NULL: none */
    const float *cos, *sin;                    /* RotaryTables' cos_full, sin_signed: rope_dim floats per position */
    uint16_t *k, *v;                           /* the pool's f16 tensors of this layer (or of its KV source), (n_kv, slots, dim) */
    int64_t skh, skt, svh, svt;
    int64_t window; /* 0: none */
    int64_t ring;   /* a sliding-window ring's rows, position p in row p % ring (memory/kv_pool.py); 0: row p */
    int64_t n_heads, n_kv, head_dim, v_head_dim, rope_dim, ffn;
    int32_t writes_kv; /* 0: Gemma 4's shared-KV layer: Q only, attends over its source layer's cache */
    int32_t v_is_k;    /* V is the K projection before K's norm (Gemma 4 without attn_v) */
    /* Falcon-H1's Mamba-2 mixer beside the attention (NULL: none): its ss_mixer_t (ssm_step.c), its in-projection's
     * mixer_in outputs after Q/K/V in the qkv product, its states, its out-projection's activation scratch (bytes) */
    const void *mixer;
    float *conv_state, *ssm_state;
    int64_t mixer_in, mixer_act;
    const float *gcos, *gsin; /* ggml's RoPE tables (RotaryTables with ggml's angles), for ggml_ops */
} dl_layer_t;

typedef struct {
    int64_t n_layers, dim, ple_dim; /* ple_dim: Gemma 4's per-layer input width (0: none) */
    int32_t neox, geglu; /* geglu: GELU(gate) * up through `gelu`, else SwiGLU */
    float eps, scale;
    const float *gelu;      /* torch's fp16 GELU (tanh) of every fp16 value, as float (65536) */
    const float *gelu_ggml; /* ggml's fp16 GELU table (numerics.ggml_gelu_table): the per-layer gate's, and GeGLU's with ggml_ops */
    const dl_layer_t *layers;
    /* ggml_ops (TALLOW_CPU_GGML_STEP): RoPE, SwiGLU/GeGLU and attention in ggml-cpu's arithmetic (ggml_ops.c, the
     * functions TALLOW_NUMERICS=ggml calls), not torch's: llama.cpp's decode step bit for bit, with the products'
     * vec_dot order. prescaled_q: llama.cpp scales Q before the score product (gemma3: ggml_scale(Qcur)), not the
     * scores in the softmax. A bit mask, so that scripts can measure each op's share: DL_GGML_ROPE | DL_GGML_ATTENTION
     * | DL_GGML_GLU in use; 0: torch's arithmetic throughout. */
    int32_t ggml_ops, prescaled_q;
} dl_model_t;

enum { DL_GGML_ROPE = 1, DL_GGML_ATTENTION = 2, DL_GGML_GLU = 4 };

int dl_abi_version(void) { return 6; }

/* ------------------------------------------------------------------ SiLU as torch computes it */

#if DL_X86
typedef __m512 (*dl_vexp16_fn)(__m512);
typedef __m256 (*dl_vexp8_fn)(__m256);
static void *g_vexp;    /* torch's Sleef_expf16_u10 (AVX-512 kernels) or Sleef_expf8_u10 (AVX2 kernels) */
static int g_vexp_lanes; /* 16 or 8 */
#endif

/* Hand over torch's expf of `lanes` (16 or 8) floats (NULL: none); returns whether SwiGLU can run here. */
int dl_set_vexp(void *fn, int lanes) {
#if DL_X86
    g_vexp = lanes == 16 || lanes == 8 ? fn : 0;
    g_vexp_lanes = lanes;
    return g_vexp != 0;
#else
    (void)fn; (void)lanes;
    return 0;
#endif
}

#if DL_X86
/* y = silu(g) * u over n values: torch's vectorized loop (Loops.h) takes whole blocks of 2 vectors (2 x 16
 * lanes with AVX-512, 2 x 8 with AVX2), the rest one value at a time with the scalar op (libm's expf). */
static void swiglu_tail(const float *g, const float *u, float *y, int64_t i, int64_t n) {
    for (; i < n; i++) {
        const float s = g[i] / (1.0f + expf(-g[i]));
        y[i] = s * u[i];
    }
}

DL_TGT static void swiglu_torch16(const float *g, const float *u, float *y, int64_t n) {
    const int64_t nv = n - n % 32;
    const __m512 one = _mm512_set1_ps(1.0f);
    int64_t i = 0;
    for (; i < nv; i += 16) {
        const __m512 x = _mm512_loadu_ps(g + i);
        const __m512 e = ((dl_vexp16_fn)g_vexp)(_mm512_sub_ps(_mm512_setzero_ps(), x)); /* x.neg(): the sign flipped, exact */
        const __m512 s = _mm512_div_ps(x, _mm512_add_ps(one, e));
        _mm512_storeu_ps(y + i, _mm512_mul_ps(s, _mm512_loadu_ps(u + i)));
    }
    swiglu_tail(g, u, y, i, n);
}

__attribute__((target("avx2"))) static void swiglu_torch8(const float *g, const float *u, float *y, int64_t n) {
    const int64_t nv = n - n % 16;
    const __m256 one = _mm256_set1_ps(1.0f);
    int64_t i = 0;
    for (; i < nv; i += 8) {
        const __m256 x = _mm256_loadu_ps(g + i);
        const __m256 e = ((dl_vexp8_fn)g_vexp)(_mm256_sub_ps(_mm256_setzero_ps(), x));
        const __m256 s = _mm256_div_ps(x, _mm256_add_ps(one, e));
        _mm256_storeu_ps(y + i, _mm256_mul_ps(s, _mm256_loadu_ps(u + i)));
    }
    swiglu_tail(g, u, y, i, n);
}

static void swiglu_torch(const float *g, const float *u, float *y, int64_t n) {
    if (g_vexp_lanes == 16) swiglu_torch16(g, u, y, n);
    else swiglu_torch8(g, u, y, n);
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
static void rope_heads(const dl_model_t *M, const dl_layer_t *L, const float *x, float *out, int64_t heads, const float *cos,
                       const float *sin) {
    const int64_t hd = L->head_dim, rd = L->rope_dim, half = rd / 2;
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
 * left unadded as the composed blocks leave it (the output norm adds it); ple (m, n_layers, ple_dim): Gemma 4's
 * per-layer inputs (models/gemma4.py per_layer_inputs), NULL without. Returns 0 with a delta pending, 1 when
 * the last layer joined it to the stream (Gemma 4's per-layer branch or output scale: delta holds nothing);
 * -1 without torch's exp, -2 when scratch cannot be allocated, -3 when a product refuses, -4 when a layer with a
 * mixer is given more than one row.
 *
 * Gemma 4's block (models/gemma4.py Gemma4Model.block, in its order): the attention norm; Q/K/V (Q only
 * for a shared-KV layer); Q/K per-head norms, V's weightless norm (V being K's raw projection without
 * attn_v), RoPE, the K/V write; attention over the layer's cache (a shared-KV layer's source); the output
 * product, its post-attention norm joined to the stream, the MLP norm, GeGLU MLP, the post-MLP norm; then
 * with per-layer inputs: joined to the stream (x + norm(mlp)), gate = ggml_geglu(ple_gate(x), input), its
 * projection normed and joined, times the output scale; without: times the output scale where there is
 * one, else left pending as gemma3's. ops.norm_add's `x + rms_norm(b)` then `* scale` are two rounded
 * operations per value, as here. */
int dl_decode(const dl_model_t *M, float *x, float *delta, const float *ple, int64_t m, int64_t pos, int nthreads) {
    const int ggml_rope = M->ggml_ops & DL_GGML_ROPE, ggml_att = M->ggml_ops & DL_GGML_ATTENTION,
              ggml_glu = M->ggml_ops & DL_GGML_GLU;
#if DL_X86
    if (!g_vexp && !ggml_glu) return -1;
#else
    if (!ggml_glu) return -1;
#endif
    const int64_t dim = M->dim, pd = M->ple_dim;
    int64_t act = 0, wq = 0, wqkv = 0, watt = 0, wffn = 0, wv = 0; /* the widest of each part over the layers */
    for (int64_t l = 0; l < M->n_layers; l++) {
        const dl_layer_t *L = &M->layers[l];
        const tg_plan_t *plans[6] = {L->qkv, L->out, L->gate_up, L->down, L->ple_gate, L->ple_proj};
        for (int i = 0; i < 6; i++) {
            const int64_t b = plans[i] ? tg_plan_scratch(plans[i], m) : 0;
            if (b > act) act = b; /* the products' quantized activations, in bytes */
        }
        if (L->mixer && L->mixer_act * m > act) act = L->mixer_act * m;
        const int64_t nqk = (L->n_heads + L->n_kv) * L->head_dim, nqkv = nqk + L->n_kv * L->v_head_dim + L->mixer_in;
        if (nqk > wq) wq = nqk;
        if (nqkv > wqkv) wqkv = nqkv;
        if (L->n_heads * L->v_head_dim > watt) watt = L->n_heads * L->v_head_dim;
        if (L->ffn > wffn) wffn = L->ffn;
        if (L->n_kv * L->v_head_dim > wv) wv = L->n_kv * L->v_head_dim;
    }
    const int64_t floats = m * (dim + wqkv + wq + watt + dim + 3 * wffn + wqkv + wv + 2 * pd + dim) + (act + 3) / 4 + 64;
    float *buf = scratch_floats(floats);
    if (!buf) return -2;
    float *h = buf, *qkv = h + m * dim, *qk = qkv + m * wqkv, *att = qk + m * wq, *o = att + m * watt;
    float *gu = o + m * dim, *g = gu + m * 2 * wffn, *normed = g + m * wffn, *vn = normed + m * wqkv;
    float *pg = vn + m * wv, *pgg = pg + m * pd, *mo = pgg + m * pd;
    uint8_t *xq = (uint8_t *)(mo + m * dim);
    int pending = 0; /* delta holds the previous layer's branch, not yet added */
    for (int64_t l = 0; l < M->n_layers; l++) {
        const dl_layer_t *L = &M->layers[l];
        const int64_t nh = L->n_heads, nkv = L->n_kv, hd = L->head_dim, vhd = L->v_head_dim, ffn = L->ffn;
        const int64_t nrot = L->writes_kv ? nh + nkv : nh;      /* heads normed and rotated */
        const int64_t nqk = nrot * hd;                          /* Q (and K) in the projection */
        const int64_t nqkv = nqk + (L->writes_kv && !L->v_is_k ? nkv * vhd : 0); /* Q/K/V's width */
        const int64_t nrow = nqkv + (L->mixer ? L->mixer_in : 0); /* the product's: Falcon-H1's mixer input after Q/K/V */
        const int64_t rd = L->rope_dim;
        /* x, h = add_norm(x, delta, attn_norm): nothing pending before the first layer or after a joined one */
        go_rms_norm(x, dim, pending ? delta : NULL, pending ? x : NULL, m, dim, L->attn_norm, 1, M->eps, h);
        if (tg_linear_multi(L->qkv, h, m, xq, qkv, nthreads)) return -3;
        for (int64_t r = 0; r < m; r++) {
            float *row = qkv + r * nrow, *rot = qk + r * nqk;
            if (L->qkv_bias)
                for (int64_t i = 0; i < nqkv; i++) row[i] = row[i] + L->qkv_bias[i];
            const float *heads = row;
            if (L->qk_norm) { /* rms_norm over each Q and K head, head h with weight row h (or one row for all) */
                go_rms_norm(row, hd, NULL, NULL, nrot, hd, L->qk_norm, L->writes_kv ? nrot : 1, M->eps, normed + r * nqkv);
                heads = normed + r * nqkv;
            }
            const int64_t at = pos + r;
            if (ggml_rope) /* ggml's angles (float recurrence, libm's cosf/sinf) and rotate_pairs' two fmas */
                go_rope(heads, 0, hd, 1, nrot, (int)hd, (int)rd, L->gcos + at * rd, L->gsin + at * rd, M->neox, rot);
            else
                rope_heads(M, L, heads, rot, nrot, L->cos + at * rd, L->sin + at * rd);
            if (ggml_att && M->prescaled_q)
                for (int64_t i = 0; i < nh * hd; i++) rot[i] = rot[i] * M->scale; /* ggml_scale(Qcur) */
            if (!L->writes_kv) continue;
            const float *vsrc = L->v_is_k ? row + nh * hd : row + nqk; /* V: K's raw projection, or its own */
            if (L->v_norm) {
                go_rms_norm(vsrc, vhd, NULL, NULL, nkv, vhd, L->v_norm, 1, M->eps, vn + r * nkv * vhd);
                vsrc = vn + r * nkv * vhd;
            }
            const int64_t slot = L->ring ? at % L->ring : at;
            for (int64_t kh = 0; kh < nkv; kh++) {
                uint16_t *kr = L->k + kh * L->skh + slot * L->skt, *vr = L->v + kh * L->svh + slot * L->svt;
                const float *ks = rot + (nh + kh) * hd, *vs = vsrc + kh * vhd;
                for (int64_t j = 0; j < hd; j++) kr[j] = tg_f32_to_f16(ks[j]);
                for (int64_t j = 0; j < vhd; j++) vr[j] = tg_f32_to_f16(vs[j]);
            }
        }
        for (int64_t r = 0; r < m; r++) { /* every row's K/V is written: row r sees keys ..pos + r */
            const int64_t end = pos + r + 1, begin = L->window && end > L->window ? end - L->window : 0;
            if (ggml_att) { /* one query row as EagerAttention.ggml_attend: keys from kv.window_start (a ring's window edge, else 0) */
                const int64_t lo = L->ring && L->window && end > L->window ? end - L->window : 0;
                const float sc = M->prescaled_q ? 1.0f : M->scale;
                if (go_attend(qk + r * nqk, nqk, hd, 1, (int)nh, (int)nkv, (int)hd, (int)vhd, L->k, L->v, L->skh, L->skt,
                              L->svh, L->svt, L->ring ? L->ring : end, lo, end - lo, end - 1, L->window, sc,
                              att + r * nh * vhd, nthreads))
                    return -2;
                continue;
            }
            if (ta_attend_f16(qk + r * nqk, (int)nh, (int)nkv, (int)hd, (int)vhd, L->k, L->v, L->skh, L->skt, L->svh,
                              L->svt, begin, end, L->ring, M->scale, 0.0f, att + r * nh * vhd, nthreads))
                return -2;
        }
        if (tg_linear_multi(L->out, att, m, xq, o, nthreads)) return -3;
        if (L->mixer) { /* Falcon-H1: attention + mixer on the same normed input (one row: applies() takes no more) */
            if (m != 1) return -4;
            if (ss_mixer_step(L->mixer, NULL, qkv + nqkv, L->conv_state, L->ssm_state, xq, mo, nthreads)) return -2;
            for (int64_t i = 0; i < dim; i++) o[i] = o[i] + mo[i]; /* attn_output(...) + mixer(...) */
        }
        if (L->post_attn_norm) go_rms_norm(o, dim, NULL, NULL, m, dim, L->post_attn_norm, 1, M->eps, o); /* in place */
        go_rms_norm(x, dim, o, x, m, dim, L->ffn_norm, 1, M->eps, h);
        if (tg_linear_multi(L->gate_up, h, m, xq, gu, nthreads)) return -3;
        for (int64_t r = 0; r < m; r++) {
            const float *gr = gu + r * 2 * ffn, *ur = gr + ffn;
            float *yr = g + r * ffn;
            if (ggml_glu && M->geglu) {
                go_geglu(gr, ffn, ur, ffn, 1, ffn, M->gelu_ggml, yr, ffn);
            } else if (ggml_glu) {
                go_swiglu(gr, ffn, ur, ffn, 1, ffn, yr, ffn);
            } else if (M->geglu) {
                for (int64_t i = 0; i < ffn; i++) yr[i] = M->gelu[tg_f32_to_f16(gr[i])] * ur[i];
            } else {
#if DL_X86
                swiglu_torch(gr, ur, yr, ffn);
#endif
            }
        }
        if (tg_linear_multi(L->down, g, m, xq, delta, nthreads)) return -3;
        if (L->post_ffw_norm) go_rms_norm(delta, dim, NULL, NULL, m, dim, L->post_ffw_norm, 1, M->eps, delta);
        pending = 1;
        if (L->ple_gate) { /* x + norm(mlp), then the per-layer branch: ple_proj(ggml_geglu(ple_gate(x), input)) */
            for (int64_t i = 0; i < m * dim; i++) x[i] = x[i] + delta[i];
            if (tg_linear_multi(L->ple_gate, x, m, xq, pg, nthreads)) return -3;
            go_geglu(pg, pd, ple + l * pd, M->n_layers * pd, m, pd, M->gelu_ggml, pgg, pd);
            if (tg_linear_multi(L->ple_proj, pgg, m, xq, o, nthreads)) return -3;
            go_rms_norm(o, dim, NULL, NULL, m, dim, L->ple_post_norm, 1, M->eps, o);
            for (int64_t i = 0; i < m * dim; i++) x[i] = x[i] + o[i];
            pending = 0;
        } else if (L->out_scale) {
            for (int64_t i = 0; i < m * dim; i++) x[i] = x[i] + delta[i];
            pending = 0;
        }
        if (L->out_scale) {
            const float s = *L->out_scale;
            for (int64_t i = 0; i < m * dim; i++) x[i] = x[i] * s;
        }
    }
    return pending ? 0 : 1;
}
