/* ggml's float helpers shared by the C files of the optional library (ggml_ops.c, ssm_step.c):
 * ggml_v_expf one lane at a time, 16 lanes at once and 8 (AVX2) (the same bits), and the lane tree of
 * _mm512_reduce_add_ps in portable C, AVX-512 and AVX2. Static inline: each file gets its own copy. */
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

/* AVX2: expf16's arithmetic on 8 lanes. vscalefps has no AVX2 form: where n lies in [-125, 127] the result
 * j * 2^n is normal (j in [0.70, 1.42]) and one multiply by 2^n makes it exactly; other lanes (tiny, huge,
 * NaN) take expf_lane, the same bits. */
#define GO_TGT2 __attribute__((target("avx2,fma,f16c")))

GO_TGT2 static inline __m256 expf8(__m256 x) {
    const __m256 shift = _mm256_set1_ps(0x1.8p23f);
    const __m256 n = _mm256_sub_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(0x1.715476p+0f), shift), shift);
    const __m256 b = _mm256_fnmadd_ps(n, _mm256_set1_ps(0x1.7f7d1cp-20f), _mm256_fnmadd_ps(n, _mm256_set1_ps(0x1.62e4p-1f), x));
    const __m256 u = _mm256_mul_ps(b, b);
    const __m256 hi = _mm256_fmadd_ps(_mm256_fmadd_ps(_mm256_set1_ps(0x1.0e4020p-7f), b, _mm256_set1_ps(0x1.573e2ep-5f)), u,
                                      _mm256_fmadd_ps(_mm256_set1_ps(0x1.555e66p-3f), b, _mm256_set1_ps(0x1.fffdb6p-2f)));
    const __m256 j = _mm256_fmadd_ps(hi, u, _mm256_fmadd_ps(_mm256_set1_ps(0x1.ffffecp-1f), b, _mm256_set1_ps(1.0f)));
    const __m256 ok = _mm256_and_ps(_mm256_cmp_ps(n, _mm256_set1_ps(-125.0f), _CMP_GE_OQ), _mm256_cmp_ps(n, _mm256_set1_ps(127.0f), _CMP_LE_OQ));
    const __m256 pow2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(_mm256_and_ps(n, ok)), _mm256_set1_epi32(127)), 23));
    const __m256 res = _mm256_mul_ps(j, pow2);
    const int mask = _mm256_movemask_ps(ok);
    if (mask == 0xff) return res;
    float xs[8], r[8];
    _mm256_storeu_ps(xs, x);
    _mm256_storeu_ps(r, res);
    for (int l = 0; l < 8; l++)
        if (!(mask >> l & 1)) r[l] = expf_lane(xs[l]);
    return _mm256_loadu_ps(r);
}

/* hsum16 of the 16 lanes lo (0..7) and hi (8..15): the same tree */
GO_TGT2 static inline float hsum16_halves(__m256 lo, __m256 hi) {
    const __m256 a = _mm256_add_ps(lo, hi);
    const __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    const __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
    return _mm_cvtss_f32(_mm_add_ss(c, _mm_movehdup_ps(c)));
}

GO_TGT static inline float hsum16(__m512 v) {
    const __m256 a = _mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    const __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    const __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b)); /* lanes 0+2, 1+3 */
    return _mm_cvtss_f32(_mm_add_ss(c, _mm_movehdup_ps(c)));
}
#endif

#endif
