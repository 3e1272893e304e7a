/* ggml's float helpers shared by the C files of the optional library (ggml_ops.c, ssm_step.c):
 * ggml_v_expf one lane at a time and 16 lanes at once (the same bits), and the lane tree of
 * _mm512_reduce_add_ps in portable C and AVX-512. Static inline: each file gets its own copy. */
#ifndef TALLOW_GGML_MATH_H
#define TALLOW_GGML_MATH_H

#include <math.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define GO_X86 1
#define GO_TGT __attribute__((target("avx512f,avx512dq,fma,f16c")))
#else
#define GO_X86 0
#endif

/* ------------------------------------------------------------------ exp, one lane */

/* ggml_v_expf on one value: n = round(x log2 e), b = x - n ln2 in two parts, p(b) by Estrin, p * 2^n */
static inline float expf_lane(float x) {
    const float shift = 0x1.8p23f;
    const float n = fmaf(x, 0x1.715476p+0f, shift) - shift;
    const float b = fmaf(-n, 0x1.7f7d1cp-20f, fmaf(-n, 0x1.62e4p-1f, x));
    const float u = b * b;
    const float j = fmaf(fmaf(fmaf(0x1.0e4020p-7f, b, 0x1.573e2ep-5f), u, fmaf(0x1.555e66p-3f, b, 0x1.fffdb6p-2f)), u,
                         fmaf(0x1.ffffecp-1f, b, 1.0f));
    if (n != n) return n;                                  /* NaN in, NaN out */
    if (fabsf(n) > 192.0f) return n <= 0.0f ? 0.0f : INFINITY; /* past scalef's reach: ggml's blend */
    return scalbnf(j, (int)n);                             /* j * 2^n rounded once, as vscalefps */
}

/* the lane tree of _mm512_reduce_add_ps (GCC): halves, quarters, pairs */
static inline float hsum16_lanes(const float *v) {
    float a[8], b[4];
    for (int l = 0; l < 8; l++) a[l] = v[l] + v[l + 8];
    for (int l = 0; l < 4; l++) b[l] = a[l] + a[l + 4];
    return (b[0] + b[2]) + (b[1] + b[3]);
}

#if GO_X86
GO_TGT static inline __m512 expf16(__m512 x) {
    const __m512 shift = _mm512_set1_ps(0x1.8p23f);
    const __m512 n = _mm512_sub_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(0x1.715476p+0f), shift), shift);
    const __m512 b = _mm512_fnmadd_ps(n, _mm512_set1_ps(0x1.7f7d1cp-20f), _mm512_fnmadd_ps(n, _mm512_set1_ps(0x1.62e4p-1f), x));
    const __m512 u = _mm512_mul_ps(b, b);
    const __m512 hi = _mm512_fmadd_ps(_mm512_fmadd_ps(_mm512_set1_ps(0x1.0e4020p-7f), b, _mm512_set1_ps(0x1.573e2ep-5f)), u,
                                      _mm512_fmadd_ps(_mm512_set1_ps(0x1.555e66p-3f), b, _mm512_set1_ps(0x1.fffdb6p-2f)));
    const __m512 j = _mm512_fmadd_ps(hi, u, _mm512_fmadd_ps(_mm512_set1_ps(0x1.ffffecp-1f), b, _mm512_set1_ps(1.0f)));
    const __m512 res = _mm512_scalef_ps(j, n);
    const __mmask16 far = _mm512_cmp_ps_mask(_mm512_abs_ps(n), _mm512_set1_ps(192.0f), _CMP_GT_OQ);
    if (!far) return res;
    const __mmask16 low = _mm512_cmp_ps_mask(n, _mm512_setzero_ps(), _CMP_LE_OQ);
    const __m512 edge = _mm512_mask_blend_ps(low, _mm512_set1_ps(INFINITY), _mm512_setzero_ps());
    return _mm512_mask_blend_ps(far, res, edge);
}

GO_TGT static inline float hsum16(__m512 v) {
    const __m256 a = _mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    const __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    const __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b)); /* lanes 0+2, 1+3 */
    return _mm_cvtss_f32(_mm_add_ss(c, _mm_movehdup_ps(c)));
}
#endif

#endif
