/* The Mamba mixer's two recurrent ops on the CPU in C (TALLOW_CPU_C_SSM): the causal conv1d with its
 * SiLU, and the selective scan with the D skip and the SiLU(z) gate, as llama.cpp b11434's ggml-cpu
 * ssm_conv / ssm_scan and the graph around them (src/models/mamba-base.cpp) compute them; one C call
 * each per layer instead of the torch reference's dozens of small ops and its state copies
 * (kernels/cpu/ssm.py, which stays the reference). Both update the layer's states in place.
 *
 * What fixes the bits, and where they differ from the torch reference:
 *   - conv: sum = w0 x0, then sum + wk xk tap by tap (products rounded: -ffp-contract=off), + bias:
 *     the reference's bits. SiLU x / (1 + exp(-x)) by ggml_v_expf (ggml_silu's), not torch's exp.
 *   - softplus(dt): x itself above 20 (ggml_compute_softplus_f32's cut), else by ggml_v_expf and a
 *     log1p series (softplus_lane: ggml's libm log1pf(expf) was half of Mamba-1's scan); the decay
 *     exp(dt' A) by libm's expf for Mamba-2 (one per head, as ggml), by ggml_v_expf for Mamba-1 (one
 *     per channel and state: 3M a token on Mamba-1.4B, 16 lanes at a time; ggml calls libm there).
 *   - the state: s = (s * dA) + (B * x dt'), each product rounded, then the add: the reference's
 *     arithmetic (and ggml's AVX-512 path's) given the same dt' and dA.
 *   - y = sum over the states of s C. Mamba-2: ggml's AVX-512 order where d_state >= 64 (four
 *     accumulators of 16 lanes over steps of 64 values, fused multiply-adds, reduced (0+2)+(1+3)
 *     then the lane tree), the rest added one by one; Mamba-1: the 16 products rounded and summed
 *     by the lane tree. torch sums in its own order: these differ from the reference by float
 *     rounding of the sum only (tests/test_c_ssm.py bounds it).
 *   - y + x D (product rounded, then the add), then silu(z) * y (SiLU by ggml_v_expf): the reference's order.
 * The AVX-512 code and the portable C do the same float operations in the same order (the tests run
 * both). Heads are split over OpenMP threads as ggml splits them; each head's rows run in order, so
 * a prefill chunk leaves the state a token-by-token decode does, bit for bit.
 */
#include <stdint.h>
#include <stdlib.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#include "ggml_dot.h"  /* tg_plan_t, tg_linear_multi: the products of the whole-mixer step */
#include "ggml_math.h" /* GO_X86, GO_TGT, expf_lane, expf16, hsum16(_lanes) */

int go_simd(void); /* ggml_ops.c: 2 AVX-512, 1 AVX2, 0 portable (tests set it with go_set_simd) */

static inline float silu_lane(float x) { return x / (1.0f + expf_lane(0.0f - x)); }

/* softplus(x) = max(x, 0) + log1p(exp(-|x|)), x itself above 20 (ggml's cut). ggml calls libm's
 * log1pf(expf(x)): 4096 of each a token and layer on Mamba-1.4B, half its scan's time, so here the
 * exp is ggml_v_expf and log1p(t) = 2 atanh(t / (2 + t)) by its series to s^15 (s <= 1/3: the next
 * term is under 2^-26 of the sum), 16 lanes at a time; a few ulp from libm's. */
static const float SP_Q[7] = {(float)(1.0 / 15), (float)(1.0 / 13), (float)(1.0 / 11), (float)(1.0 / 9), (float)(1.0 / 7),
                              (float)(1.0 / 5), (float)(1.0 / 3)};

static inline float softplus_lane(float x) {
    const float t = expf_lane(0.0f - fabsf(x));
    const float s = t / (2.0f + t), s2 = s * s, two_s = s + s;
    float q = SP_Q[0];
    for (int k = 1; k < 7; k++) q = fmaf(q, s2, SP_Q[k]);
    const float y = fmaxf(x, 0.0f) + fmaf(two_s * s2, q, two_s);
    return x > 20.0f ? x : y;
}

#if GO_X86
GO_TGT static int64_t softplus_avx512(const float *x, int64_t n, float *y) {
    const __m512 zero = _mm512_setzero_ps(), two = _mm512_set1_ps(2.0f);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 v = _mm512_loadu_ps(x + i);
        const __m512 t = expf16(_mm512_sub_ps(zero, _mm512_abs_ps(v)));
        const __m512 s = _mm512_div_ps(t, _mm512_add_ps(two, t)), s2 = _mm512_mul_ps(s, s), two_s = _mm512_add_ps(s, s);
        __m512 q = _mm512_set1_ps(SP_Q[0]);
        for (int k = 1; k < 7; k++) q = _mm512_fmadd_ps(q, s2, _mm512_set1_ps(SP_Q[k]));
        const __m512 r = _mm512_add_ps(_mm512_max_ps(v, zero), _mm512_fmadd_ps(_mm512_mul_ps(two_s, s2), q, two_s));
        _mm512_storeu_ps(y + i, _mm512_mask_blend_ps(_mm512_cmp_ps_mask(v, _mm512_set1_ps(20.0f), _CMP_GT_OQ), r, v));
    }
    return i;
}
#endif

#if GO_X86
/* AVX2: the same arithmetic, 8 lanes at a time (each value its own chain: any grouping gives the same bits) */
GO_TGT2 static inline __m256 softplus8(__m256 v) {
    const __m256 zero = _mm256_setzero_ps();
    const __m256 t = expf8(_mm256_sub_ps(zero, _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v)));
    const __m256 s = _mm256_div_ps(t, _mm256_add_ps(_mm256_set1_ps(2.0f), t)), s2 = _mm256_mul_ps(s, s), two_s = _mm256_add_ps(s, s);
    __m256 q = _mm256_set1_ps(SP_Q[0]);
    for (int k = 1; k < 7; k++) q = _mm256_fmadd_ps(q, s2, _mm256_set1_ps(SP_Q[k]));
    const __m256 r = _mm256_add_ps(_mm256_max_ps(v, zero), _mm256_fmadd_ps(_mm256_mul_ps(two_s, s2), q, two_s));
    return _mm256_blendv_ps(r, v, _mm256_cmp_ps(v, _mm256_set1_ps(20.0f), _CMP_GT_OQ));
}

GO_TGT2 static int64_t softplus_avx2(const float *x, int64_t n, float *y) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, softplus8(_mm256_loadu_ps(x + i)));
    return i;
}
#endif

/* y (n) = softplus of x (n); simd: go_simd()'s level */
static void softplus_row(const float *x, int64_t n, float *y, int simd) {
    int64_t i = 0;
#if GO_X86
    if (simd == 2) i = softplus_avx512(x, n, y);
    else if (simd == 1) i = softplus_avx2(x, n, y);
#endif
    for (; i < n; i++) y[i] = softplus_lane(x[i]);
}

/* ------------------------------------------------------------------ conv1d */

#if GO_X86
GO_TGT static int64_t silu_avx512(float *y, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 x = _mm512_loadu_ps(y + i);
        const __m512 e = expf16(_mm512_sub_ps(_mm512_setzero_ps(), x));
        _mm512_storeu_ps(y + i, _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0f), e)));
    }
    return i;
}

/* y = silu(z) * y over whole blocks of 16; returns how many values it did */
GO_TGT static int64_t gate_avx512(const float *z, float *y, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 v = _mm512_loadu_ps(z + i);
        const __m512 e = expf16(_mm512_sub_ps(_mm512_setzero_ps(), v));
        _mm512_storeu_ps(y + i, _mm512_mul_ps(_mm512_div_ps(v, _mm512_add_ps(_mm512_set1_ps(1.0f), e)), _mm512_loadu_ps(y + i)));
    }
    return i;
}

GO_TGT2 static inline __m256 silu8(__m256 x) {
    return _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), expf8(_mm256_sub_ps(_mm256_setzero_ps(), x))));
}

GO_TGT2 static int64_t silu_avx2(float *y, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, silu8(_mm256_loadu_ps(y + i)));
    return i;
}

GO_TGT2 static int64_t gate_avx2(const float *z, float *y, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_mul_ps(silu8(_mm256_loadu_ps(z + i)), _mm256_loadu_ps(y + i)));
    return i;
}
#endif

/* out (n, C) = silu(causal conv of the rows x (n, C; x_stride apart) after state (k - 1, C) + bias);
 * weight_t (k, C): the (C, k) kernel transposed, so each tap is a contiguous row and the channel loop
 * runs 16 lanes at a time. state becomes the last k - 1 rows of [state; x]. */
void ss_conv(const float *x, int64_t x_stride, int64_t n, int64_t C, int k, float *state, const float *weight_t,
             const float *bias, float *out) {
    const int simd = go_simd();
    for (int64_t t = 0; t < n; t++) {
        float *o = out + t * C;
        for (int j = 0; j < k; j++) { /* tap j reads row t + j of [state; x] */
            const int64_t row = t + j;
            const float *r = row < k - 1 ? state + row * C : x + (row - (k - 1)) * x_stride;
            const float *w = weight_t + (int64_t)j * C;
            if (j == 0)
                for (int64_t c = 0; c < C; c++) o[c] = r[c] * w[c];
            else
                for (int64_t c = 0; c < C; c++) o[c] = o[c] + r[c] * w[c];
        }
        for (int64_t c = 0; c < C; c++) o[c] = o[c] + bias[c];
        int64_t c = 0;
#if GO_X86
        if (simd == 2) c = silu_avx512(o, C);
        else if (simd == 1) c = silu_avx2(o, C);
#endif
        for (; c < C; c++) o[c] = silu_lane(o[c]);
    }
    /* the new state: rows n .. n + k - 2 of [state; x]; ascending, a row of state is read before it
     * is overwritten (sources lie n >= 1 rows further on) */
    for (int j = 0; j < k - 1; j++) {
        const int64_t row = n + j;
        const float *src = row < k - 1 ? state + row * C : x + (row - (k - 1)) * x_stride;
        for (int64_t c = 0; c < C; c++) state[j * C + c] = src[c];
    }
}

/* ------------------------------------------------------------------ scan */

/* the scalar end of a row (states i..ds-1, past the vector blocks), added to sum in order */
static inline float row2_tail(float *s, const float *B, const float *Cm, int64_t i, int64_t ds, float dA, float x_dt, float sum) {
    for (; i < ds; i++) {
        const float v = s[i] * dA + B[i] * x_dt;
        sum = sum + v * Cm[i];
        s[i] = v;
    }
    return sum;
}

static inline float row1_tail(float *s, const float *A, const float *B, const float *Cm, int64_t i, int64_t ds, float sp, float x_dt,
                              float sum) {
    for (; i < ds; i++) {
        const float v = s[i] * expf_lane(sp * A[i]) + B[i] * x_dt;
        sum = sum + v * Cm[i];
        s[i] = v;
    }
    return sum;
}

/* Mamba-2, one row of a head: s (ds) updated, returns sum of s C (ggml's AVX-512 order). */
static inline float row2_portable(float *s, const float *B, const float *Cm, int64_t ds, float dA, float x_dt) {
    const int64_t np = ds & ~(int64_t)63;
    float acc[64] = {0};
    for (int64_t i = 0; i < np; i += 64)
        for (int l = 0; l < 64; l++) {
            const float v = s[i + l] * dA + B[i + l] * x_dt;
            acc[l] = fmaf(v, Cm[i + l], acc[l]);
            s[i + l] = v;
        }
    float lanes[16];
    for (int l = 0; l < 16; l++) lanes[l] = (acc[l] + acc[l + 32]) + (acc[l + 16] + acc[l + 48]);
    float sum = np ? hsum16_lanes(lanes) : 0.0f;
    return row2_tail(s, B, Cm, np, ds, dA, x_dt, sum);
}

/* Mamba-1, one channel: decays per state; the products by the lane tree per 16, blocks added in order. */
static inline float row1_portable(float *s, const float *A, const float *B, const float *Cm, int64_t ds, float sp, float x_dt) {
    float sum = 0.0f, p[16];
    int64_t i = 0;
    for (; i + 16 <= ds; i += 16) {
        for (int l = 0; l < 16; l++) {
            const float v = s[i + l] * expf_lane(sp * A[i + l]) + B[i + l] * x_dt;
            p[l] = v * Cm[i + l];
            s[i + l] = v;
        }
        sum = sum + hsum16_lanes(p);
    }
    return row1_tail(s, A, B, Cm, i, ds, sp, x_dt, sum);
}

#if GO_X86
GO_TGT static inline float row2_avx512(float *s, const float *B, const float *Cm, int64_t ds, float dA, float x_dt) {
    const int64_t np = ds & ~(int64_t)63;
    const __m512 va = _mm512_set1_ps(dA), vx = _mm512_set1_ps(x_dt);
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    for (int64_t i = 0; i < np; i += 64)
        for (int j = 0; j < 4; j++) {
            const int64_t o = i + 16 * j;
            const __m512 v = _mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(s + o), va), _mm512_mul_ps(_mm512_loadu_ps(B + o), vx));
            acc[j] = _mm512_fmadd_ps(v, _mm512_loadu_ps(Cm + o), acc[j]);
            _mm512_storeu_ps(s + o, v);
        }
    float sum = np ? hsum16(_mm512_add_ps(_mm512_add_ps(acc[0], acc[2]), _mm512_add_ps(acc[1], acc[3]))) : 0.0f;
    return row2_tail(s, B, Cm, np, ds, dA, x_dt, sum);
}

GO_TGT static inline float row1_avx512(float *s, const float *A, const float *B, const float *Cm, int64_t ds, float sp, float x_dt) {
    const __m512 vsp = _mm512_set1_ps(sp), vx = _mm512_set1_ps(x_dt);
    float sum = 0.0f;
    int64_t i = 0;
    for (; i + 16 <= ds; i += 16) {
        const __m512 dA = expf16(_mm512_mul_ps(vsp, _mm512_loadu_ps(A + i)));
        const __m512 v = _mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(s + i), dA), _mm512_mul_ps(_mm512_loadu_ps(B + i), vx));
        _mm512_storeu_ps(s + i, v);
        sum = sum + hsum16(_mm512_mul_ps(v, _mm512_loadu_ps(Cm + i)));
    }
    return row1_tail(s, A, B, Cm, i, ds, sp, x_dt, sum);
}
#endif

#if GO_X86
GO_TGT2 static inline float row2_avx2(float *s, const float *B, const float *Cm, int64_t ds, float dA, float x_dt) {
    const int64_t np = ds & ~(int64_t)63;
    const __m256 va = _mm256_set1_ps(dA), vx = _mm256_set1_ps(x_dt);
    __m256 acc[8]; /* row2_avx512's acc[j], lanes 0..7 in acc[2j], 8..15 in acc[2j + 1] */
    for (int j = 0; j < 8; j++) acc[j] = _mm256_setzero_ps();
    for (int64_t i = 0; i < np; i += 64)
        for (int j = 0; j < 8; j++) {
            const int64_t o = i + 8 * j;
            const __m256 v = _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(s + o), va), _mm256_mul_ps(_mm256_loadu_ps(B + o), vx));
            acc[j] = _mm256_fmadd_ps(v, _mm256_loadu_ps(Cm + o), acc[j]);
            _mm256_storeu_ps(s + o, v);
        }
    float sum = 0.0f;
    if (np) {
        const __m256 lo = _mm256_add_ps(_mm256_add_ps(acc[0], acc[4]), _mm256_add_ps(acc[2], acc[6]));
        const __m256 hi = _mm256_add_ps(_mm256_add_ps(acc[1], acc[5]), _mm256_add_ps(acc[3], acc[7]));
        sum = hsum16_halves(lo, hi);
    }
    return row2_tail(s, B, Cm, np, ds, dA, x_dt, sum);
}

GO_TGT2 static inline float row1_avx2(float *s, const float *A, const float *B, const float *Cm, int64_t ds, float sp, float x_dt) {
    const __m256 vsp = _mm256_set1_ps(sp), vx = _mm256_set1_ps(x_dt);
    float sum = 0.0f;
    int64_t i = 0;
    for (; i + 16 <= ds; i += 16) {
        __m256 p[2];
        for (int e = 0; e < 2; e++) {
            const int64_t o = i + 8 * e;
            const __m256 dA = expf8(_mm256_mul_ps(vsp, _mm256_loadu_ps(A + o)));
            const __m256 v = _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(s + o), dA), _mm256_mul_ps(_mm256_loadu_ps(B + o), vx));
            _mm256_storeu_ps(s + o, v);
            p[e] = _mm256_mul_ps(v, _mm256_loadu_ps(Cm + o));
        }
        sum = sum + hsum16_halves(p[0], p[1]);
    }
    return row1_tail(s, A, B, Cm, i, ds, sp, x_dt, sum);
}
#endif

/* One scan call's inputs (ss_scan's arguments), handed to the per-thread loops. */
typedef struct {
    float *state, *y;
    const float *x, *sps, *A, *B, *Cm, *D;
    int64_t nh, hd, ds, per_group, xs, bs, cs, n;
    int a_per_state;
} ScanArgs;

/* heads h0..h1-1, every row in order; ROW1 / ROW2 the Mamba-1 / Mamba-2 row of one instruction set
 * (a macro, so each instruction set's loop is compiled with its rows inlined) */
#define SCAN_HEADS(ROW1, ROW2)                                                                                  \
    for (int64_t h = h0; h < h1; h++) {                                                                          \
        const int64_t g = h / a->per_group, ds = a->ds, hd = a->hd;                                              \
        for (int64_t t = 0; t < a->n; t++) {                                                                     \
            const float sp = a->sps[t * a->nh + h];                                                              \
            const float dA = a->a_per_state ? 0.0f : expf(sp * a->A[h]);                                         \
            const float *Bt = a->B + t * a->bs + g * ds, *Ct = a->Cm + t * a->cs + g * ds;                       \
            for (int64_t i = 0; i < hd; i++) {                                                                   \
                const int64_t ch = h * hd + i;                                                                   \
                const float xv = a->x[t * a->xs + ch];                                                           \
                const float x_dt = xv * sp;                                                                      \
                float *s = a->state + ch * ds;                                                                   \
                const float out = a->a_per_state ? ROW1(s, a->A + h * ds, Bt, Ct, ds, sp, x_dt)                  \
                                                 : ROW2(s, Bt, Ct, ds, dA, x_dt);                                \
                a->y[t * a->nh * hd + ch] = a->D ? out + xv * a->D[h] : out;                                     \
            }                                                                                                    \
        }                                                                                                        \
    }

static void heads_portable(const ScanArgs *a, int64_t h0, int64_t h1) { SCAN_HEADS(row1_portable, row2_portable) }

#if GO_X86
GO_TGT static void heads_avx512(const ScanArgs *a, int64_t h0, int64_t h1) { SCAN_HEADS(row1_avx512, row2_avx512) }
GO_TGT2 static void heads_avx2(const ScanArgs *a, int64_t h0, int64_t h1) { SCAN_HEADS(row1_avx2, row2_avx2) }
#endif

/* y (n, nh * hd) = (scan + x D) * silu(z) over n rows, in order; state (nh, hd, ds) updated.
 * x (n, nh * hd), dt (n, nh), B and C (n, ng * ds), z (n, nh * hd): row strides in floats.
 * dt_bias (nh), D (nh), z: NULL for none. A: (nh, ds) when a_per_state (Mamba-1), else (nh).
 * Returns 0, or -1 when its n * nh floats of scratch could not be allocated (nothing changed). */
int ss_scan(float *state, int64_t nh, int64_t hd, int64_t ds, int64_t ng, const float *x, int64_t xs, const float *dt,
            int64_t dts, const float *dt_bias, const float *A, int a_per_state, const float *B, int64_t bs,
            const float *Cm, int64_t cs, const float *D, const float *z, int64_t zs, int64_t n, float *y, int threads) {
    const int simd = go_simd();
    float *sps = malloc(sizeof(float) * (size_t)(n * nh)); /* softplus(dt + dt_bias), (n, nh) */
    if (!sps) return -1;
    for (int64_t t = 0; t < n; t++) {
        float *r = sps + t * nh;
        for (int64_t h = 0; h < nh; h++) r[h] = dt_bias ? dt[t * dts + h] + dt_bias[h] : dt[t * dts + h];
        softplus_row(r, nh, r, simd);
    }
    const ScanArgs args = {state, y, x, sps, A, B, Cm, D, nh, hd, ds, nh / ng, xs, bs, cs, n, a_per_state};
    /* heads split in contiguous ranges, one per thread, as ggml splits them */
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
        int nt = 1, it = 0;
#ifdef _OPENMP
        nt = omp_get_num_threads();
        it = omp_get_thread_num();
#endif
        const int64_t per = (nh + nt - 1) / nt, h0 = per * it, h1 = h0 + per < nh ? h0 + per : nh;
        if (h0 < h1) {
#if GO_X86
            if (simd == 2)
                heads_avx512(&args, h0, h1);
            else if (simd == 1)
                heads_avx2(&args, h0, h1);
            else
#endif
                heads_portable(&args, h0, h1);
        }
    }
    free(sps);
    if (!z) return 0;
    for (int64_t t = 0; t < n; t++) { /* the gate, 16 lanes at a time */
        const float *zt = z + t * zs;
        float *yt = y + t * nh * hd;
        int64_t i = 0;
#if GO_X86
        if (simd == 2) i = gate_avx512(zt, yt, nh * hd);
        else if (simd == 1) i = gate_avx2(zt, yt, nh * hd);
#endif
        for (; i < nh * hd; i++) yt[i] = silu_lane(zt[i]) * yt[i];
    }
    return 0;
}

/* ------------------------------------------------------------------ the whole mixer, one decode row */

/* ggml_ops.c's RMSNorm, the one the composed mixer reaches through layers.rms_norm. */
void go_rms_norm(const float *x, int64_t x_stride, const float *d, float *sum_out, int64_t rows, int64_t n, const float *w,
                 int64_t w_rows, float eps, float *y);

/* One layer's mixer (c_ssm.py's _Mixer mirrors it): its product plans (tg_plan_t addresses, built by
 * ggml_dot.py), its fixed tensors and its sizes. The states are passed per call (the memory owns them). */
typedef struct {
    int32_t version, n_norm_rows; /* 1 or 2; Mamba-2's grouped norm: n_group rows, 0 for none */
    int64_t dim, d_inner, channels, n_head, head_dim, d_state, n_group, dt_rank, d_conv, d_in_proj;
    float eps;
    const tg_plan_t *in_plan, *x_plan, *dt_plan, *out_plan; /* x_plan, dt_plan: Mamba-1 only */
    const float *dt_lin_bias;                          /* Mamba-1: ssm_dt's bias (d_inner), or NULL */
    const float *conv_wt, *conv_b, *A, *D, *dt_b, *norm_w;
} ss_mixer_t;

/* out (dim) = the Mamba mixer of one row h (dim), models/mamba.py's MambaModel.mixer step for step and
 * with its bits (the same C products, conv, scan and norm, called in the same order with the same
 * inputs); proj: the in-projection's output when the caller has it (falcon-h1 runs it in one product
 * with Q/K/V), else NULL and h goes through in_plan. conv_state, ssm_state updated in place.
 * Returns 0, or -1 (a product refused, or scratch not allocated: nothing to trust). */
int ss_mixer_step(const ss_mixer_t *m, const float *h, const float *proj, float *conv_state, float *ssm_state,
                  uint8_t *act_scratch, float *out, int threads) {
    const int64_t d = m->d_inner, ch = m->channels, ds = m->d_state, r = m->dt_rank;
    const int64_t nf = (proj ? 0 : m->d_in_proj) + ch + (r + 2 * ds) + d + 2 * d;
    float *buf = malloc(sizeof(float) * (size_t)nf);
    if (!buf) return -1;
    float *p = buf, *own_proj = proj ? NULL : p;
    p += proj ? 0 : m->d_in_proj;
    float *xc = p, *xdb = p + ch, *dt = xdb + r + 2 * ds, *y = dt + d, *yn = y + d;
    int rc = 0;
    if (!proj) {
        rc = tg_linear_multi(m->in_plan, h, 1, act_scratch, own_proj, threads);
        proj = own_proj;
    }
    if (rc) goto done;
    if (m->version == 1) {
        ss_conv(proj, m->d_in_proj, 1, ch, (int)m->d_conv, conv_state, m->conv_wt, m->conv_b, xc);
        if ((rc = tg_linear_multi(m->x_plan, xc, 1, act_scratch, xdb, threads))) goto done;
        if ((rc = tg_linear_multi(m->dt_plan, xdb, 1, act_scratch, dt, threads))) goto done;
        if (m->dt_lin_bias)
            for (int64_t i = 0; i < d; i++) dt[i] = dt[i] + m->dt_lin_bias[i];
        rc = ss_scan(ssm_state, m->n_head, m->head_dim, ds, m->n_group, xc, ch, dt, d, NULL, m->A, 1, xdb + r, r + 2 * ds,
                     xdb + r + ds, r + 2 * ds, m->D, proj + d, m->d_in_proj, 1, y, threads);
    } else {
        const int64_t gds = m->n_group * ds;
        ss_conv(proj + d, m->d_in_proj, 1, ch, (int)m->d_conv, conv_state, m->conv_wt, m->conv_b, xc);
        rc = ss_scan(ssm_state, m->n_head, m->head_dim, ds, m->n_group, xc, ch, proj + d + ch, m->n_head, m->dt_b, m->A, 0,
                     xc + d, ch, xc + d + gds, ch, m->D, proj, m->d_in_proj, 1, y, threads);
    }
    if (rc) goto done;
    const float *mixed = y;
    if (m->n_norm_rows) { /* rows of d / n_group, each with its group's weight row */
        const int64_t rows = m->n_norm_rows, n = d / rows;
        go_rms_norm(y, n, NULL, NULL, rows, n, m->norm_w, rows, m->eps, yn);
        mixed = yn;
    }
    rc = tg_linear_multi(m->out_plan, mixed, 1, act_scratch, out, threads);
done:
    free(buf);
    return rc ? -1 : 0;
}
