/* Decode attention on the CPU over an f16 KV cache: one query token, all heads, keys [begin, end).
 *
 * Why C: torch has no product of fp32 queries with f16 keys, so the torch path copies the cache's
 * keys and values to fp32 at every step (and SDPA with grouped heads repeats them per query head):
 * at 32k positions that is hundreds of MB of traffic per layer and token. Here each K and V row is
 * read once, in f16, converted in registers, and used by every query head of its group.
 *
 * Per KV head g and chunk of keys (chunks spread over the threads): scores s = q_h . k_t * scale
 * (softcap: cap * tanh(s / cap)), the chunk's max m, p = exp(s - m), l = sum p, acc_h = sum p v_t;
 * the chunks merge as flash-decoding's split-K does: out_h = sum_c acc_c e^(m_c - M) / sum_c l_c
 * e^(m_c - M). fp32 throughout; the order differs from torch's SDPA, so results agree to ~1e-6
 * relative, not bit for bit. Strides in elements; loaded by ctypes (c_attention.py).
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

float tg_f16_to_f32(uint16_t h); /* ggml_dot.c: the library's one fp16 converter */

typedef struct {
    const float *q;            /* (n_heads, dk) */
    const uint16_t *k, *v;     /* cache bases */
    int64_t skh, skt, svh, svt; /* strides (elements) */
    int group, dk, dv;
    float scale, softcap;
} ta_args_t;

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

#ifdef TA_X86
__attribute__((target("avx512f"))) static void ta_row_avx512(float *dst, const uint16_t *src, int d) {
    int i = 0;
    for (; i + 16 <= d; i += 16) _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(src + i))));
    for (; i < d; i++) dst[i] = tg_f16_to_f32(src[i]);
}

__attribute__((target("avx512f"))) static float ta_dot_avx512(const float *a, const float *b, int d) {
    __m512 s = _mm512_setzero_ps();
    int i = 0;
    for (; i + 16 <= d; i += 16) s = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s);
    float t = _mm512_reduce_add_ps(s);
    for (; i < d; i++) t += a[i] * b[i];
    return t;
}

__attribute__((target("avx512f"))) static void ta_axpy_avx512(float *acc, float p, const float *v, int d) {
    __m512 pp = _mm512_set1_ps(p);
    int i = 0;
    for (; i + 16 <= d; i += 16) _mm512_storeu_ps(acc + i, _mm512_fmadd_ps(pp, _mm512_loadu_ps(v + i), _mm512_loadu_ps(acc + i)));
    for (; i < d; i++) acc[i] += p * v[i];
}
#define TA_CALL(simd, name, ...) ((simd) ? name##_avx512(__VA_ARGS__) : name##_portable(__VA_ARGS__))
#else
#define TA_CALL(simd, name, ...) (name##_portable(__VA_ARGS__))
#endif

static int ta_use_simd = -1;

int ta_simd(void) {
    if (ta_use_simd < 0) {
#ifdef TA_X86
        __builtin_cpu_init();
        ta_use_simd = __builtin_cpu_supports("avx512f") ? 1 : 0;
#else
        ta_use_simd = 0;
#endif
    }
    return ta_use_simd;
}

/* 0: the portable C, 1: AVX-512 where the CPU has it (tests run both) */
void ta_set_simd(int on) { ta_use_simd = on ? -1 : 0; if (on) ta_simd(); }

/* One (KV head, key chunk): m[h], l[h] and acc[h][dv] for the group's heads; s: scratch (group * n);
 * row: scratch for one converted K or V row (max(dk, dv) floats). */
static void ta_chunk(const ta_args_t *a, int g, int64_t t0, int64_t t1, float *m, float *l, float *acc, float *s,
                     float *row) {
    const int simd = ta_simd();
    const int64_t n = t1 - t0;
    const uint16_t *kb = a->k + g * a->skh, *vb = a->v + g * a->svh;
    for (int h = 0; h < a->group; h++) m[h] = -INFINITY;
    for (int64_t t = 0; t < n; t++) {
        TA_CALL(simd, ta_row, row, kb + (t0 + t) * a->skt, a->dk);
        for (int h = 0; h < a->group; h++) {
            float x = TA_CALL(simd, ta_dot, a->q + (int64_t)(g * a->group + h) * a->dk, row, a->dk) * a->scale;
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
        TA_CALL(simd, ta_row, row, vb + (t0 + t) * a->svt, a->dv);
        for (int h = 0; h < a->group; h++) TA_CALL(simd, ta_axpy, acc + (int64_t)h * a->dv, s[h * n + t], row, a->dv);
    }
}

/* out (n_heads, dv) fp32. Returns 0, or -1 when scratch could not be allocated. */
int ta_attend_f16(const float *q, int n_heads, int n_kv, int dk, int dv, const uint16_t *k, const uint16_t *v,
                  int64_t skh, int64_t skt, int64_t svh, int64_t svt, int64_t begin, int64_t end, float scale,
                  float softcap, float *out, int nthreads) {
    const int group = n_heads / n_kv;
    const int64_t n = end - begin;
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
    ta_args_t a = {q, k, v, skh, skt, svh, svt, group, dk, dv, scale, softcap};
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
        ta_chunk(&a, g, t0, t1, ml + it * group * 2, ml + it * group * 2 + group, acc + it * group * dv,
                 s + it * group * per, rows + it * width);
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
