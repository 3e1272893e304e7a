/* Decode attention on the CPU over an f16 KV cache: one query token, all heads, keys [begin, end).
 *
 * Why C: torch has no product of fp32 queries with f16 keys, so the torch path copies the cache's
 * keys and values to fp32 at every step (and SDPA with grouped heads repeats them per query head):
 * at 32k positions that is hundreds of MB of traffic per layer and token. Here each K and V row is
 * read once, in f16, converted in registers, and used by every query head of its group.
 *
 * A sliding-window layer's ring (memory/kv_pool.py) is read in position order, its rows found by position % ring.
 *
 * Per KV head g and chunk of keys (chunks spread over the threads): scores s = q_h . k_t * scale
 * (softcap: cap * tanh(s / cap)), the chunk's max m, p = exp(s - m), l = sum p, acc_h = sum p v_t;
 * the chunks merge as flash-decoding's split-K does: out_h = sum_c acc_c e^(m_c - M) / sum_c l_c
 * e^(m_c - M). fp32 throughout; the order differs from torch's SDPA, so results agree to ~1e-6
 * relative, not bit for bit. Strides in elements; loaded by ctypes (c_attention.py).
 *
 * The AVX-512 chunk (and the AVX2 one, 8 lanes) does the portable chunk's arithmetic with its scores summed in
 * lanes (agreeing to ~1e-6, each code with itself bit for bit), blocked so that it is
 * not waiting on memory: heads and keys in registers, and K/V rows prefetched ahead of use (one thread's
 * loads alone do not keep enough cache misses in flight to stream the cache).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define TA_X86 1
#endif

#include "ggml_dot.h" /* tg_f16_to_f32, and this file's ta_attend_f16 as decode_layer.c calls it */

typedef struct {
    const float *q;            /* (n_heads, dk) */
    const uint16_t *k, *v;     /* cache bases */
    int64_t skh, skt, svh, svt; /* strides (elements) */
    int64_t ring, base, wrap;  /* a ring of `ring` rows holds position p in row p % ring (0: row p) */
    int group, dk, dv;
    float scale, softcap;
} ta_args_t;

/* the row holding position pos: pos % ring without a division (every position asked lies in [base, base + 2 ring)) */
static inline int64_t ta_slot(const ta_args_t *a, int64_t pos) {
    if (!a->ring) return pos;
    return pos < a->wrap ? pos - a->base : pos - a->wrap;
}

/* one f16 row to fp32 (each K/V row converted once, then used by every head of its group) */
static void ta_row_portable(float *dst, const uint16_t *src, int d) {
    for (int i = 0; i < d; i++) dst[i] = tg_f16_to_f32(src[i]);
}

static float ta_dot_portable(const float *a, const float *b, int d) {
    float s = 0.0f;
    for (int i = 0; i < d; i++) s += a[i] * b[i];
    return s;
}

static void ta_axpy_portable(float *acc, float p, const float *v, int d) {
    for (int i = 0; i < d; i++) acc[i] += p * v[i];
}

static int ta_use_simd = -1;

static int ta_best(void) {
#ifdef TA_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) return 2;
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c") ? 1 : 0;
#else
    return 0;
#endif
}

/* the code in use: 2 AVX-512, 1 AVX2, 0 portable */
int ta_simd(void) {
    if (ta_use_simd < 0) ta_use_simd = ta_best();
    return ta_use_simd;
}

/* the best code up to `level` (-1: no cap; tests run each) */
void ta_set_simd(int level) {
    const int best = ta_best();
    ta_use_simd = level < 0 || level > best ? best : level;
}

/* One (KV head, key chunk): m[h], l[h] and acc[h][dv] for the group's heads; s: scratch (group * n);
 * row: scratch for one converted K or V row (max(dk, dv) floats). */
static void ta_chunk_portable(const ta_args_t *a, int g, int64_t t0, int64_t t1, float *m, float *l, float *acc, float *s,
                     float *row) {
    const int64_t n = t1 - t0;
    const uint16_t *kb = a->k + g * a->skh, *vb = a->v + g * a->svh;
    for (int h = 0; h < a->group; h++) m[h] = -INFINITY;
    for (int64_t t = 0; t < n; t++) {
        ta_row_portable(row, kb + ta_slot(a, t0 + t) * a->skt, a->dk);
        for (int h = 0; h < a->group; h++) {
            float x = ta_dot_portable(a->q + (int64_t)(g * a->group + h) * a->dk, row, a->dk) * a->scale;
            if (a->softcap > 0.0f) x = a->softcap * tanhf(x / a->softcap);
            s[h * n + t] = x;
            if (x > m[h]) m[h] = x;
        }
    }
    memset(acc, 0, sizeof(float) * (size_t)a->group * a->dv);
    for (int h = 0; h < a->group; h++) {
        float sum = 0.0f;
        for (int64_t t = 0; t < n; t++) {
            float p = expf(s[h * n + t] - m[h]);
            s[h * n + t] = p;
            sum += p;
        }
        l[h] = sum;
    }
    for (int64_t t = 0; t < n; t++) {
        ta_row_portable(row, vb + ta_slot(a, t0 + t) * a->svt, a->dv);
        for (int h = 0; h < a->group; h++) ta_axpy_portable(acc + (int64_t)h * a->dv, s[h * n + t], row, a->dv);
    }
}

#ifdef TA_X86
/* The AVX-512 chunk: the portable chunk's arithmetic in its order (each score one accumulator over dk, then
 * the horizontal sum; each output element sum_t p_t v_t, t ascending, one fma per key), with heads and keys
 * blocked in registers. Scores: two keys x up to 8 heads per pass over dk, so each q slice loaded serves two
 * keys and each key slice every head. Values: a tile of keys at a time, per 32-wide slice of dv the heads'
 * accumulators stay in registers over the tile (the portable code loads and stores them per key). */
#define TA_HB 8       /* heads per register block */
#define TA_TILE 128   /* keys per value tile: its V rows stay in L2 across the dv slices */
#define TA_AHEAD 8    /* keys a score pass prefetches ahead (the values prefetch one tile ahead) */
#define TA_INLINE __attribute__((target("avx512f"), always_inline)) static inline

TA_INLINE __m512 ta_ld16(const uint16_t *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }

/* scores of keys [t0, t0 + n) for heads [h0, h0 + NH) of KV head g into s[h * n + t] */
TA_INLINE void ta_scores(const ta_args_t *a, const uint16_t *kb, int64_t t0, int64_t n, int h0, const int NH,
                         const float *q, float *s) {
    int64_t t = 0;
    for (; t + 2 <= n; t += 2) {
        const uint16_t *k0 = kb + ta_slot(a, t0 + t) * a->skt, *k1 = kb + ta_slot(a, t0 + t + 1) * a->skt;
        const uint16_t *p0 = kb + ta_slot(a, t0 + t + TA_AHEAD) * a->skt, *p1 = kb + ta_slot(a, t0 + t + TA_AHEAD + 1) * a->skt;
        __m512 c0[TA_HB], c1[TA_HB];
#pragma GCC unroll 8
        for (int h = 0; h < NH; h++) c0[h] = c1[h] = _mm512_setzero_ps();
        for (int i = 0; i < a->dk; i += 16) {
            _mm_prefetch((const char *)(p0 + i), _MM_HINT_T0); /* a hint: never faults, even past the cache */
            _mm_prefetch((const char *)(p1 + i), _MM_HINT_T0);
            const __m512 x0 = ta_ld16(k0 + i), x1 = ta_ld16(k1 + i);
#pragma GCC unroll 8
            for (int h = 0; h < NH; h++) {
                const __m512 qv = _mm512_loadu_ps(q + (int64_t)(h0 + h) * a->dk + i);
                c0[h] = _mm512_fmadd_ps(qv, x0, c0[h]);
                c1[h] = _mm512_fmadd_ps(qv, x1, c1[h]);
            }
        }
#pragma GCC unroll 8
        for (int h = 0; h < NH; h++) {
            s[(h0 + h) * n + t] = _mm512_reduce_add_ps(c0[h]) * a->scale;
            s[(h0 + h) * n + t + 1] = _mm512_reduce_add_ps(c1[h]) * a->scale;
        }
    }
    for (; t < n; t++) {
        const uint16_t *k0 = kb + ta_slot(a, t0 + t) * a->skt;
        __m512 c0[TA_HB];
#pragma GCC unroll 8
        for (int h = 0; h < NH; h++) c0[h] = _mm512_setzero_ps();
        for (int i = 0; i < a->dk; i += 16) {
            const __m512 x0 = ta_ld16(k0 + i);
#pragma GCC unroll 8
            for (int h = 0; h < NH; h++)
                c0[h] = _mm512_fmadd_ps(_mm512_loadu_ps(q + (int64_t)(h0 + h) * a->dk + i), x0, c0[h]);
        }
#pragma GCC unroll 8
        for (int h = 0; h < NH; h++) s[(h0 + h) * n + t] = _mm512_reduce_add_ps(c0[h]) * a->scale;
    }
}

/* acc[h][j, j + 16 W) += sum over keys [tt, te) of p[h][t] v_t[j, j + 16 W), t ascending, for heads [h0, h0 + NH) */
TA_INLINE void ta_values(const ta_args_t *a, const uint16_t *vb, int64_t t0, int64_t n, int64_t tt, int64_t te,
                         int j, const int W, int h0, const int NH, const float *p, float *acc) {
    __m512 c[TA_HB][2];
#pragma GCC unroll 8
    for (int h = 0; h < NH; h++)
#pragma GCC unroll 2
        for (int w = 0; w < W; w++) c[h][w] = _mm512_loadu_ps(acc + (int64_t)(h0 + h) * a->dv + j + 16 * w);
    for (int64_t t = tt; t < te; t++) {
        const uint16_t *vr = vb + ta_slot(a, t0 + t) * a->svt + j;
        _mm_prefetch((const char *)(vb + ta_slot(a, t0 + t + TA_TILE) * a->svt + j), _MM_HINT_T0);
        __m512 x[2];
#pragma GCC unroll 2
        for (int w = 0; w < W; w++) x[w] = ta_ld16(vr + 16 * w);
#pragma GCC unroll 8
        for (int h = 0; h < NH; h++) {
            const __m512 pp = _mm512_set1_ps(p[(h0 + h) * n + t]);
#pragma GCC unroll 2
            for (int w = 0; w < W; w++) c[h][w] = _mm512_fmadd_ps(pp, x[w], c[h][w]);
        }
    }
#pragma GCC unroll 8
    for (int h = 0; h < NH; h++)
#pragma GCC unroll 2
        for (int w = 0; w < W; w++) _mm512_storeu_ps(acc + (int64_t)(h0 + h) * a->dv + j + 16 * w, c[h][w]);
}

/* one head block's scores and value sums, NH a constant after inlining */
TA_INLINE void ta_block(const ta_args_t *a, const uint16_t *kb, const uint16_t *vb, int64_t t0, int64_t n, int h0,
                        const int NH, const float *q, float *s, float *acc, int pass) {
    if (pass == 0) {
        ta_scores(a, kb, t0, n, h0, NH, q, s);
        return;
    }
    for (int64_t tt = 0; tt < n; tt += TA_TILE) {
        const int64_t te = tt + TA_TILE < n ? tt + TA_TILE : n;
        int j = 0;
        for (; j + 32 <= a->dv; j += 32) ta_values(a, vb, t0, n, tt, te, j, 2, h0, NH, s, acc);
        if (j < a->dv) ta_values(a, vb, t0, n, tt, te, j, 1, h0, NH, s, acc);
    }
}

__attribute__((target("avx512f"))) static void ta_block_any(const ta_args_t *a, const uint16_t *kb,
                                                            const uint16_t *vb, int64_t t0, int64_t n, int h0,
                                                            int nh, const float *q, float *s, float *acc, int pass) {
    switch (nh) {
    case 1: ta_block(a, kb, vb, t0, n, h0, 1, q, s, acc, pass); break;
    case 2: ta_block(a, kb, vb, t0, n, h0, 2, q, s, acc, pass); break;
    case 3: ta_block(a, kb, vb, t0, n, h0, 3, q, s, acc, pass); break;
    case 4: ta_block(a, kb, vb, t0, n, h0, 4, q, s, acc, pass); break;
    case 5: ta_block(a, kb, vb, t0, n, h0, 5, q, s, acc, pass); break;
    case 6: ta_block(a, kb, vb, t0, n, h0, 6, q, s, acc, pass); break;
    case 7: ta_block(a, kb, vb, t0, n, h0, 7, q, s, acc, pass); break;
    default: ta_block(a, kb, vb, t0, n, h0, 8, q, s, acc, pass); break;
    }
}

/* the chunk's scores s[h * n + t] (softcapped here) to exp(s - m[h]), l[h] their sum: the portable order */
static void ta_weights(const ta_args_t *a, int64_t n, float *s, float *m, float *l) {
    for (int h = 0; h < a->group; h++) {
        float mx = -INFINITY, sum = 0.0f;
        float *sh = s + h * n;
        for (int64_t t = 0; t < n; t++) {
            if (a->softcap > 0.0f) sh[t] = a->softcap * tanhf(sh[t] / a->softcap);
            if (sh[t] > mx) mx = sh[t];
        }
        for (int64_t t = 0; t < n; t++) {
            sh[t] = expf(sh[t] - mx);
            sum += sh[t];
        }
        m[h] = mx;
        l[h] = sum;
    }
}

static void ta_chunk_avx512(const ta_args_t *a, int g, int64_t t0, int64_t t1, float *m, float *l, float *acc,
                            float *s) {
    const int64_t n = t1 - t0;
    const uint16_t *kb = a->k + g * a->skh, *vb = a->v + g * a->svh;
    const float *q = a->q + (int64_t)g * a->group * a->dk; /* the group's heads, relative to h0 = 0 */
    for (int h0 = 0; h0 < a->group; h0 += TA_HB)
        ta_block_any(a, kb, vb, t0, n, h0, a->group - h0 < TA_HB ? a->group - h0 : TA_HB, q, s, acc, 0);
    ta_weights(a, n, s, m, l);
    memset(acc, 0, sizeof(float) * (size_t)a->group * a->dv);
    for (int h0 = 0; h0 < a->group; h0 += TA_HB)
        ta_block_any(a, kb, vb, t0, n, h0, a->group - h0 < TA_HB ? a->group - h0 : TA_HB, q, s, acc, 1);
}

/* The AVX2 chunk: the AVX-512 chunk's blocking with 8 lanes (each score an 8-lane accumulator, then its
 * horizontal sum; values as there), 4 heads per register block (16 registers). */
#define TA2_HB 4
#define TA2_INLINE __attribute__((target("avx2,fma,f16c"), always_inline)) static inline

TA2_INLINE __m256 ta2_ld8(const uint16_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }

TA2_INLINE float ta2_hsum(__m256 v) {
    const __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 b = _mm_add_ps(a, _mm_movehl_ps(a, a));
    return _mm_cvtss_f32(_mm_add_ss(b, _mm_movehdup_ps(b)));
}

TA2_INLINE void ta2_scores(const ta_args_t *a, const uint16_t *kb, int64_t t0, int64_t n, int h0, const int NH,
                           const float *q, float *s) {
    int64_t t = 0;
    for (; t + 2 <= n; t += 2) {
        const uint16_t *k0 = kb + ta_slot(a, t0 + t) * a->skt, *k1 = kb + ta_slot(a, t0 + t + 1) * a->skt;
        const uint16_t *p0 = kb + ta_slot(a, t0 + t + TA_AHEAD) * a->skt, *p1 = kb + ta_slot(a, t0 + t + TA_AHEAD + 1) * a->skt;
        __m256 c0[TA2_HB], c1[TA2_HB];
#pragma GCC unroll 4
        for (int h = 0; h < NH; h++) c0[h] = c1[h] = _mm256_setzero_ps();
        for (int i = 0; i < a->dk; i += 8) {
            if (i % 32 == 0) {
                _mm_prefetch((const char *)(p0 + i), _MM_HINT_T0);
                _mm_prefetch((const char *)(p1 + i), _MM_HINT_T0);
            }
            const __m256 x0 = ta2_ld8(k0 + i), x1 = ta2_ld8(k1 + i);
#pragma GCC unroll 4
            for (int h = 0; h < NH; h++) {
                const __m256 qv = _mm256_loadu_ps(q + (int64_t)(h0 + h) * a->dk + i);
                c0[h] = _mm256_fmadd_ps(qv, x0, c0[h]);
                c1[h] = _mm256_fmadd_ps(qv, x1, c1[h]);
            }
        }
#pragma GCC unroll 4
        for (int h = 0; h < NH; h++) {
            s[(h0 + h) * n + t] = ta2_hsum(c0[h]) * a->scale;
            s[(h0 + h) * n + t + 1] = ta2_hsum(c1[h]) * a->scale;
        }
    }
    for (; t < n; t++) {
        const uint16_t *k0 = kb + ta_slot(a, t0 + t) * a->skt;
        __m256 c0[TA2_HB];
#pragma GCC unroll 4
        for (int h = 0; h < NH; h++) c0[h] = _mm256_setzero_ps();
        for (int i = 0; i < a->dk; i += 8) {
            const __m256 x0 = ta2_ld8(k0 + i);
#pragma GCC unroll 4
            for (int h = 0; h < NH; h++)
                c0[h] = _mm256_fmadd_ps(_mm256_loadu_ps(q + (int64_t)(h0 + h) * a->dk + i), x0, c0[h]);
        }
#pragma GCC unroll 4
        for (int h = 0; h < NH; h++) s[(h0 + h) * n + t] = ta2_hsum(c0[h]) * a->scale;
    }
}

/* ta_values with 8 lanes: acc[h][j, j + 8 W) */
TA2_INLINE void ta2_values(const ta_args_t *a, const uint16_t *vb, int64_t t0, int64_t n, int64_t tt, int64_t te,
                           int j, const int W, int h0, const int NH, const float *p, float *acc) {
    __m256 c[TA2_HB][2];
#pragma GCC unroll 4
    for (int h = 0; h < NH; h++)
#pragma GCC unroll 2
        for (int w = 0; w < W; w++) c[h][w] = _mm256_loadu_ps(acc + (int64_t)(h0 + h) * a->dv + j + 8 * w);
    for (int64_t t = tt; t < te; t++) {
        const uint16_t *vr = vb + ta_slot(a, t0 + t) * a->svt + j;
        _mm_prefetch((const char *)(vb + ta_slot(a, t0 + t + TA_TILE) * a->svt + j), _MM_HINT_T0);
        __m256 x[2];
#pragma GCC unroll 2
        for (int w = 0; w < W; w++) x[w] = ta2_ld8(vr + 8 * w);
#pragma GCC unroll 4
        for (int h = 0; h < NH; h++) {
            const __m256 pp = _mm256_set1_ps(p[(h0 + h) * n + t]);
#pragma GCC unroll 2
            for (int w = 0; w < W; w++) c[h][w] = _mm256_fmadd_ps(pp, x[w], c[h][w]);
        }
    }
#pragma GCC unroll 4
    for (int h = 0; h < NH; h++)
#pragma GCC unroll 2
        for (int w = 0; w < W; w++) _mm256_storeu_ps(acc + (int64_t)(h0 + h) * a->dv + j + 8 * w, c[h][w]);
}

TA2_INLINE void ta2_block(const ta_args_t *a, const uint16_t *kb, const uint16_t *vb, int64_t t0, int64_t n, int h0,
                          const int NH, const float *q, float *s, float *acc, int pass) {
    if (pass == 0) {
        ta2_scores(a, kb, t0, n, h0, NH, q, s);
        return;
    }
    for (int64_t tt = 0; tt < n; tt += TA_TILE) {
        const int64_t te = tt + TA_TILE < n ? tt + TA_TILE : n;
        int j = 0;
        for (; j + 16 <= a->dv; j += 16) ta2_values(a, vb, t0, n, tt, te, j, 2, h0, NH, s, acc);
        if (j < a->dv) ta2_values(a, vb, t0, n, tt, te, j, 1, h0, NH, s, acc);
    }
}

__attribute__((target("avx2,fma,f16c"))) static void ta2_block_any(const ta_args_t *a, const uint16_t *kb,
                                                                   const uint16_t *vb, int64_t t0, int64_t n, int h0,
                                                                   int nh, const float *q, float *s, float *acc, int pass) {
    switch (nh) {
    case 1: ta2_block(a, kb, vb, t0, n, h0, 1, q, s, acc, pass); break;
    case 2: ta2_block(a, kb, vb, t0, n, h0, 2, q, s, acc, pass); break;
    case 3: ta2_block(a, kb, vb, t0, n, h0, 3, q, s, acc, pass); break;
    default: ta2_block(a, kb, vb, t0, n, h0, 4, q, s, acc, pass); break;
    }
}

static void ta_chunk_avx2(const ta_args_t *a, int g, int64_t t0, int64_t t1, float *m, float *l, float *acc, float *s) {
    const int64_t n = t1 - t0;
    const uint16_t *kb = a->k + g * a->skh, *vb = a->v + g * a->svh;
    const float *q = a->q + (int64_t)g * a->group * a->dk;
    for (int h0 = 0; h0 < a->group; h0 += TA2_HB)
        ta2_block_any(a, kb, vb, t0, n, h0, a->group - h0 < TA2_HB ? a->group - h0 : TA2_HB, q, s, acc, 0);
    ta_weights(a, n, s, m, l);
    memset(acc, 0, sizeof(float) * (size_t)a->group * a->dv);
    for (int h0 = 0; h0 < a->group; h0 += TA2_HB)
        ta2_block_any(a, kb, vb, t0, n, h0, a->group - h0 < TA2_HB ? a->group - h0 : TA2_HB, q, s, acc, 1);
}
#endif

/* out (n_heads, dv) fp32; keys of positions [begin, end), in rows p % ring of a ring (ring 0: rows p).
 * Returns 0, -1 when scratch could not be allocated, -2 when the positions do not fit the ring. */
int ta_attend_f16(const float *q, int n_heads, int n_kv, int dk, int dv, const uint16_t *k, const uint16_t *v,
                  int64_t skh, int64_t skt, int64_t svh, int64_t svt, int64_t begin, int64_t end, int64_t ring,
                  float scale, float softcap, float *out, int nthreads) {
    const int group = n_heads / n_kv;
    const int64_t n = end - begin;
    if (ring && n > ring) return -2;
    if (n <= 0) {
        memset(out, 0, sizeof(float) * (size_t)n_heads * dv);
        return 0;
    }
    if (nthreads < 1) nthreads = 1;
    /* chunks per KV head: enough for every thread, none shorter than 256 keys */
    int64_t chunks = (nthreads + n_kv - 1) / n_kv;
    if (chunks > (n + 255) / 256) chunks = (n + 255) / 256;
    if (chunks < 1) chunks = 1;
    const int64_t per = (n + chunks - 1) / chunks, items = (int64_t)n_kv * chunks;
    const int64_t base = ring ? begin - begin % ring : 0;
    ta_args_t a = {q, k, v, skh, skt, svh, svt, ring, base, base + ring, group, dk, dv, scale, softcap};
    const int simd = dk % 16 == 0 && dv % 16 == 0 ? ta_simd() : 0;
    float *ml = malloc(sizeof(float) * (size_t)items * group * 2);
    float *acc = malloc(sizeof(float) * (size_t)items * group * dv);
    float *s = malloc(sizeof(float) * (size_t)items * group * per);
    const int64_t width = dk > dv ? dk : dv;
    float *rows = malloc(sizeof(float) * (size_t)items * width);
    if (!ml || !acc || !s || !rows) {
        free(ml); free(acc); free(s); free(rows);
        return -1;
    }
#pragma omp parallel for num_threads(nthreads) schedule(static) if (items > 1 && nthreads > 1)
    for (int64_t it = 0; it < items; it++) {
        int g = (int)(it / chunks);
        int64_t c = it % chunks, t0 = begin + c * per, t1 = t0 + per < end ? t0 + per : end;
        float *mi = ml + it * group * 2, *li = mi + group, *ai = acc + it * group * dv, *si = s + it * group * per;
#ifdef TA_X86
        if (simd == 2) {
            ta_chunk_avx512(&a, g, t0, t1, mi, li, ai, si);
            continue;
        }
        if (simd == 1) {
            ta_chunk_avx2(&a, g, t0, t1, mi, li, ai, si);
            continue;
        }
#endif
        ta_chunk_portable(&a, g, t0, t1, mi, li, ai, si, rows + it * width);
    }
    for (int g = 0; g < n_kv; g++) {
        for (int h = 0; h < group; h++) {
            float M = -INFINITY, L = 0.0f;
            for (int64_t c = 0; c < chunks; c++) {
                float mc = ml[(g * chunks + c) * group * 2 + h];
                if (mc > M) M = mc;
            }
            float *o = out + (int64_t)(g * group + h) * dv;
            memset(o, 0, sizeof(float) * (size_t)dv);
            for (int64_t c = 0; c < chunks; c++) {
                int64_t it = g * chunks + c;
                float w = expf(ml[it * group * 2 + h] - M);
                L += ml[it * group * 2 + group + h] * w;
                const float *ac = acc + (it * group + h) * dv;
                for (int i = 0; i < dv; i++) o[i] += ac[i] * w;
            }
            for (int i = 0; i < dv; i++) o[i] /= L;
        }
    }
    free(ml); free(acc); free(s); free(rows);
    return 0;
}
