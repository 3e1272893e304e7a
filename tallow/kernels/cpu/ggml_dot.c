/* Block dot products over a GGUF file's own bytes, with llama.cpp b11434's x86 arithmetic.
 *
 * What it computes (loaded through ctypes by ggml_dot.py; no Python API used):
 *   - activation quantization to Q8_0 / Q8_1 / Q8_K, the bytes ggml's x86 from_float writes:
 *     Q8_0/Q8_1: d = fp16(amax / 127), codes = round-half-even(x * (127 / amax)),
 *                Q8_1's s = fp16((amax / 127) * sum(codes));
 *     Q8_K:      the first value of largest magnitude m, iscale = -127 / m,
 *                codes = min(127, round-half-even(x * iscale)), d = 1 / iscale, 16-value sums.
 *   - y[r] = dot(weight row r, quantized activations), in the order of ggml_vec_dot_* as llama.cpp
 *     runs it on x86 with weight repacking off (the configuration of tallow's conformance fixtures and
 *     TALLOW_NUMERICS=ggml; docs/performance.md, session 8): for Q4_1, Q5_0, Q8_0, Q6_K eight float
 *     lanes, lane l holding values 4l..4l+3 of every 32, one fused multiply-add per block and lane, then
 *     ggml's horizontal sum ((a0+a4)+(a2+a6)) + ((a1+a5)+(a3+a7)); for Q4_K the same eight lanes over
 *     the scaled 32-value groups, acc[l] = fma(d, lane, acc[l]) per super-block, and its mins in four
 *     more lanes, accm[u] = fma(-dmin, mins 2u..2u+1 times their activation sums, accm[u]), added last as
 *     ((m0+m2)+(m1+m3)). (With repacking on, llama.cpp's AVX2 default, Q4_K goes through the repacked
 *     ggml_gemv_q4_K_8x8_q8_K instead, another float order: not this one.)
 *   - for products of 8 or more activation rows (prompts), Q4_K, Q5_K and Q6_K in the order of llama.cpp's
 *     tiled K-quant product (ggml-cpu/tiled, which ggml_compute_forward_mul_mat takes first there):
 *     per super-block one integer dot, scaled by the weight's d (Q4_K: minus dmin times the mins' integer,
 *     fused), then acc = fma(that, dx, acc) block by block (see tiled_acc). Q4_0, Q4_1, Q5_0 and Q8_0 keep
 *     vec_dot's order at any row count (llamafile's tinyBLAS_Q0, which serves Q4_0/Q5_0/Q8_0 prompts, sums each
 *     output in that order).
 *   Integer sums are exact, so only the float steps above fix the result; the scalar code, the
 *   AVX-512 VNNI code and the AVX2 code below perform the same float operations in the same order and
 *   give the same bits (tests/test_ggml_dot.py checks that, and scripts/cpudot_vs_ggml.py checks each
 *   against libggml-cpu itself).
 *
 * No -march flag: the AVX-512 and AVX2 functions carry target attributes and are chosen at run time
 * (__builtin_cpu_supports), so one build runs on any x86-64. Build with -ffp-contract=off: a
 * multiply-add is fused exactly where ggml fuses it, nowhere else.
 *
 * Threads: OpenMP (see run_products), as many as the caller passes (torch's thread count); built
 * without OpenMP it runs on the calling thread.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "ggml_dot.h"
#ifdef _OPENMP
#include <omp.h>
#endif

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define TG_X86 1
#else
#define TG_X86 0
#endif

/* ggml type ids (ggml.h's enum ggml_type) */
enum { T_Q4_0 = 2, T_Q4_1 = 3, T_Q5_0 = 6, T_Q5_1 = 7, T_Q8_0 = 8, T_Q8_1 = 9, T_Q4_K = 12, T_Q5_K = 13, T_Q6_K = 14, T_Q8_K = 15 };

#define QK 32
#define QKK 256
#define Q8_0_BYTES 34
#define Q8_1_BYTES 36
#define Q8_K_BYTES 292 /* float d, int8 qs[256], int16 bsums[16] */

/* ---------------------------------------------------------------- fp16 */

static inline float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 31, man = h & 0x3ff, bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { /* subnormal: normalize */
            int e = -1;
            do { man <<= 1; e++; } while (!(man & 0x400));
            bits = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3ff) << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000 | (man << 13);
    } else {
        bits = sign | ((exp + 112) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* the same, exported for decode_attention.c (one converter in the library) */
float tg_f16_to_f32(uint16_t h) { return f16_to_f32(h); }

/* round to nearest even, as F16C's vcvtps2ph with imm 0 (ggml's GGML_CPU_FP32_TO_FP16 here) */
static inline uint16_t f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000, ax = x & 0x7fffffff;
    if (ax > 0x7f800000) return (uint16_t)(sign | 0x7e00);
    if (ax >= 0x477ff000) return (uint16_t)(sign | 0x7c00); /* >= 65520 rounds to infinity */
    if (ax >= 0x38800000) {                                /* normal half */
        uint32_t r = ax - 0x38000000;
        r = (r + 0xfff + ((r >> 13) & 1)) >> 13;
        return (uint16_t)(sign | r);
    }
    uint32_t e = ax >> 23;
    if (e < 102) return (uint16_t)sign; /* below 2^-25: zero */
    uint32_t m = (ax & 0x7fffff) | 0x800000, shift = 126 - e;
    uint32_t q = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1))) q++;
    return (uint16_t)(sign | q);
}

/* the same, exported for ggml_ops.c */
uint16_t tg_f32_to_f16(float f) { return f32_to_f16(f); }

static inline uint16_t rd16(const uint8_t *p) { uint16_t v; memcpy(&v, p, 2); return v; }
static inline float rdh(const uint8_t *p) { return f16_to_f32(rd16(p)); }

/* ggml's hsum_float_8 */
static inline float hsum8(const float a[8]) {
    float s0 = a[0] + a[4], s1 = a[1] + a[5], s2 = a[2] + a[6], s3 = a[3] + a[7];
    float t0 = s0 + s2, t1 = s1 + s3;
    return t0 + t1;
}

/* ---------------------------------------------------------------- activation quantization */

static void quantize_q8_01(const float *x, uint8_t *out, int64_t k, int with_sum) {
    const int bytes = with_sum ? Q8_1_BYTES : Q8_0_BYTES;
    for (int64_t b = 0; b < k / QK; b++, x += QK, out += bytes) {
        float amax = 0.0f;
        for (int i = 0; i < QK; i++) {
            float a = fabsf(x[i]);
            amax = a > amax ? a : amax;
        }
        const float d = amax / 127.f;
        const float id = amax != 0.0f ? 127.f / amax : 0.0f;
        int8_t *qs = (int8_t *)(out + (with_sum ? 4 : 2));
        int sum = 0;
        for (int i = 0; i < QK; i++) {
            int v = (int)nearbyintf(x[i] * id);
            v = v > 127 ? 127 : (v < -128 ? -128 : v);
            qs[i] = (int8_t)v;
            sum += v;
        }
        uint16_t dh = f32_to_f16(d);
        memcpy(out, &dh, 2);
        if (with_sum) {
            uint16_t sh = f32_to_f16(d * (float)sum);
            memcpy(out + 2, &sh, 2);
        }
    }
}

static void quantize_q8_k(const float *x, uint8_t *out, int64_t k) {
    for (int64_t b = 0; b < k / QKK; b++, x += QKK, out += Q8_K_BYTES) {
        float amax = 0.0f, max = 0.0f;
        for (int i = 0; i < QKK; i++) {
            float a = fabsf(x[i]);
            if (a > amax) { amax = a; max = x[i]; }
        }
        int8_t *qs = (int8_t *)(out + 4);
        int16_t bsums[16];
        float d = 0.0f;
        if (amax == 0.0f) {
            memset(qs, 0, QKK);
            memset(bsums, 0, sizeof bsums);
        } else {
            const float iscale = -127.f / max;
            for (int i = 0; i < QKK; i++) {
                int v = (int)nearbyintf(iscale * x[i]);
                qs[i] = (int8_t)(v > 127 ? 127 : v);
            }
            for (int j = 0; j < 16; j++) {
                int s = 0;
                for (int i = 0; i < 16; i++) s += qs[16 * j + i];
                bsums[j] = (int16_t)s;
            }
            d = 1 / iscale;
        }
        memcpy(out, &d, 4);
        memcpy(out + 4 + QKK, bsums, sizeof bsums);
    }
}

/* ---------------------------------------------------------------- scalar row dots */

/* Q4_1 x Q8_1: 20-byte blocks d, m, qs[16]; Q5_1: 24-byte blocks d, m, qh (32 bits: bit i the fifth bit of value
 * i), qs[16], the same arithmetic over the 5-bit codes (ggml_vec_dot_q5_1_q8_1's AVX2 form is Q4_1's) */
static inline __attribute__((always_inline)) float dot_q_1_scalar(const int type, const uint8_t *w, const uint8_t *x, int64_t nb) {
    float acc[8] = {0}, summs = 0.0f;
    const int five = type == T_Q5_1, qs = five ? 8 : 4;
    for (int64_t b = 0; b < nb; b++, w += five ? 24 : 20, x += Q8_1_BYTES) {
        const float d = rdh(w) * rdh(x);
        summs = fmaf(rdh(w + 2), rdh(x + 2), summs); /* ggml's `summs += m * s`, contracted by its build */
        uint32_t qh = 0;
        if (five) memcpy(&qh, w + 4, 4);
        const int8_t *q8 = (const int8_t *)(x + 4);
        for (int l = 0; l < 8; l++) {
            int s = 0;
            for (int i = 4 * l; i < 4 * l + 4; i++) {
                int q = (i < 16 ? (w[qs + i] & 15) : (w[qs + i - 16] >> 4)) | (int)(((qh >> i) & 1) << 4);
                s += q * q8[i];
            }
            acc[l] = fmaf(d, (float)s, acc[l]);
        }
    }
    return hsum8(acc) + summs;
}
static float dot_q4_1_scalar(const uint8_t *w, const uint8_t *x, int64_t nb) { return dot_q_1_scalar(T_Q4_1, w, x, nb); }
static float dot_q5_1_scalar(const uint8_t *w, const uint8_t *x, int64_t nb) { return dot_q_1_scalar(T_Q5_1, w, x, nb); }

static inline int q5_0_value(const uint8_t *w, int i) {
    uint32_t qh;
    memcpy(&qh, w + 2, 4);
    int lo = i < 16 ? (w[6 + i] & 15) : (w[6 + i - 16] >> 4);
    return (lo | (int)(((qh >> i) & 1) << 4)) - 16;
}

static inline int q_0_bytes(int type) { return type == T_Q4_0 ? 18 : type == T_Q5_0 ? 22 : 34; }

static inline int q4_0_value(const uint8_t *w, int i) {
    return (i < 16 ? (w[2 + i] & 15) : (w[2 + i - 16] >> 4)) - 8;
}

/* Q5_0 x Q8_0: 22-byte blocks d, qh[4], qs[16]; Q4_0: 18-byte blocks d, qs[16]; Q8_0 x Q8_0: 34-byte blocks d, qs[32] */
static float dot_q5_0_q8_0_scalar(int type, const uint8_t *w, const uint8_t *x, int64_t nb) {
    float acc[8] = {0};
    const int wb = q_0_bytes(type);
    for (int64_t b = 0; b < nb; b++, w += wb, x += Q8_0_BYTES) {
        const float d = rdh(w) * rdh(x);
        const int8_t *q8 = (const int8_t *)(x + 2);
        for (int l = 0; l < 8; l++) {
            int s = 0;
            for (int i = 4 * l; i < 4 * l + 4; i++)
                s += (type == T_Q5_0 ? q5_0_value(w, i) : type == T_Q4_0 ? q4_0_value(w, i) : (int)(int8_t)w[2 + i]) * q8[i];
            acc[l] = fmaf(d, (float)s, acc[l]);
        }
    }
    return hsum8(acc);
}

/* Q6_K: 210-byte blocks ql[128], qh[64], scales[16] (int8), d */
static inline int q6_value(const uint8_t *w, int e) { /* 0..63, unbiased value minus 32 */
    const uint8_t *ql = w, *qh = w + 128;
    int j = e / 128, c = (e % 128) / 32, b = e % 32;
    int low = c & 1 ? ql[64 * j + 32 + b] : ql[64 * j + b];
    low = c >= 2 ? low >> 4 : low & 15;
    int high = (qh[32 * j + b] >> (2 * c)) & 3;
    return low | (high << 4);
}

/* Q6_K's eight integer lanes of one super-block: vec_dot's lanes (values 4l..4l+3 of every 32, scaled,
 * minus 32 times the scaled activation sums); their sum is the block's integer dot product */
static inline void q6_k_lanes_scalar(const uint8_t *w, const uint8_t *x, int32_t lanes[8]) {
    const int8_t *q8 = (const int8_t *)(x + 4), *sc = (const int8_t *)(w + 192);
    int16_t bs[16];
    memcpy(bs, x + 4 + QKK, sizeof bs);
    for (int l = 0; l < 8; l++) {
        int s = 0;
        for (int chunk = 0; chunk < 8; chunk++) { /* 32-value chunks; lane l holds values 4l..4l+3 */
            int scale = sc[2 * chunk + (l >= 4)];
            int p = 0;
            for (int i = 4 * l; i < 4 * l + 4; i++) p += q6_value(w, 32 * chunk + i) * q8[32 * chunk + i];
            s += scale * p;
        }
        lanes[l] = s - 32 * (bs[2 * l] * sc[2 * l] + bs[2 * l + 1] * sc[2 * l + 1]);
    }
}

static float dot_q6_k_scalar(const uint8_t *w, const uint8_t *x, int64_t nb) {
    float acc[8] = {0};
    for (int64_t b = 0; b < nb; b++, w += 210, x += Q8_K_BYTES) {
        float dx;
        memcpy(&dx, x, 4);
        const float d = dx * rdh(w + 208);
        int32_t lanes[8];
        q6_k_lanes_scalar(w, x, lanes);
        for (int l = 0; l < 8; l++) acc[l] = fmaf(d, (float)lanes[l], acc[l]);
    }
    return hsum8(acc);
}

/* llama.cpp's tiled K-quant product (ggml-cpu/tiled, b11434), which replaces vec_dot for a product of 8
 * or more activation rows (prompts): per super-block the whole integer dot s (and for Q4_K the mins'
 * integer m) in one int32, res = s * d (Q4_K: fma(-dmin, m, s * d)), and the output accumulates
 * acc = fma(res, dx, acc) over the super-blocks in order (the AVX-512 VNNI microkernel writes a multiply
 * and an add, which GCC contracts to one FMA: unfused, 35-52% of gemma3's Q4_K/Q6_K prompt outputs differ
 * from llama.cpp's; fused, none). */
static inline float tiled_acc(float res, float dx, float acc) { return fmaf(res, dx, acc); }

static float dot_q6_k_tiled_scalar(const uint8_t *w, const uint8_t *x, int64_t nb) {
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++, w += 210, x += Q8_K_BYTES) {
        float dx;
        memcpy(&dx, x, 4);
        int32_t lanes[8], s = 0;
        q6_k_lanes_scalar(w, x, lanes);
        for (int l = 0; l < 8; l++) s += lanes[l];
        acc = tiled_acc((float)s * rdh(w + 208), dx, acc);
    }
    return acc;
}

/* Q4_K: 144-byte blocks d, dmin, scales[12], qs[128] */
static inline void q4_k_scales(const uint8_t *q, uint8_t sc[8], uint8_t mn[8]) {
    for (int j = 0; j < 4; j++) {
        sc[j] = q[j] & 63;
        mn[j] = q[j + 4] & 63;
        sc[j + 4] = (q[j + 8] & 15) | ((q[j] >> 6) << 4);
        mn[j + 4] = (q[j + 8] >> 4) | ((q[j + 4] >> 6) << 4);
    }
}

/* Q4_K's integer lanes of one super-block as vec_dot holds them: lane l (of 8) the scaled sums of values
 * 4l..4l+3 of each of the eight 32-value groups; mins lane u (of 4) mins 2u, 2u+1 times their 32-value
 * activation sums */
static inline void qk_lanes_scalar(const uint8_t *w, const uint8_t *qh, const uint8_t *qs, const uint8_t *x, int32_t lanes[8],
                                   int32_t mins[4]) {
    uint8_t sc[8], mn[8];
    q4_k_scales(w + 4, sc, mn);
    const int8_t *q8 = (const int8_t *)(x + 4);
    int16_t bs[16];
    memcpy(bs, x + 4 + QKK, sizeof bs);
    for (int l = 0; l < 8; l++) {
        int s = 0;
        for (int j = 0; j < 4; j++) {
            int s0 = 0, s1 = 0;
            for (int i = 4 * l; i < 4 * l + 4; i++) {
                const int h0 = qh ? ((qh[i] >> (2 * j)) & 1) << 4 : 0, h1 = qh ? ((qh[i] >> (2 * j + 1)) & 1) << 4 : 0;
                s0 += ((qs[32 * j + i] & 15) | h0) * q8[64 * j + i];
                s1 += ((qs[32 * j + i] >> 4) | h1) * q8[64 * j + 32 + i];
            }
            s += sc[2 * j] * s0 + sc[2 * j + 1] * s1;
        }
        lanes[l] = s;
    }
    for (int u = 0; u < 4; u++)
        mins[u] = mn[2 * u] * (bs[4 * u] + bs[4 * u + 1]) + mn[2 * u + 1] * (bs[4 * u + 2] + bs[4 * u + 3]);
}

static inline void q4_k_lanes_scalar(const uint8_t *w, const uint8_t *x, int32_t lanes[8], int32_t mins[4]) {
    qk_lanes_scalar(w, 0, w + 16, x, lanes, mins);
}

/* Q5_K: 176-byte blocks d, dmin, scales[12], qh[32], qs[128]: Q4_K's codes with a fifth bit, bit 2j (low
 * nibbles) or 2j+1 (high nibbles) of qh[i] for value i of each 32 in the j-th 64-value chunk */
static inline void q5_k_lanes_scalar(const uint8_t *w, const uint8_t *x, int32_t lanes[8], int32_t mins[4]) {
    qk_lanes_scalar(w, w + 16, w + 48, x, lanes, mins);
}

/* ggml_vec_dot_q4_K_q8_K (AVX2 form): acc[l] = fma(d, lane l, acc[l]) per super-block,
 * accm[u] = fma(-dmin, mins lane u, accm[u]); then hsum8(acc) + ((accm0 + accm2) + (accm1 + accm3)). */
static float dot_q4_k_scalar(const uint8_t *w, const uint8_t *x, int64_t nb) {
    float acc[8] = {0}, accm[4] = {0};
    for (int64_t b = 0; b < nb; b++, w += 144, x += Q8_K_BYTES) {
        float dx;
        memcpy(&dx, x, 4);
        const float d = dx * rdh(w), dmin = -dx * rdh(w + 2);
        int32_t lanes[8], mins[4];
        q4_k_lanes_scalar(w, x, lanes, mins);
        for (int l = 0; l < 8; l++) acc[l] = fmaf(d, (float)lanes[l], acc[l]);
        for (int u = 0; u < 4; u++) accm[u] = fmaf(dmin, (float)mins[u], accm[u]);
    }
    return hsum8(acc) + ((accm[0] + accm[2]) + (accm[1] + accm[3]));
}

/* the tiled product's order for Q4_K and Q5_K (ggml-cpu/tiled unpacks both to bytes) */
static inline __attribute__((always_inline)) float dot_kmin_tiled_scalar(const int type, const uint8_t *w, const uint8_t *x,
                                                                         int64_t nb) {
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++, w += type == T_Q5_K ? 176 : 144, x += Q8_K_BYTES) {
        float dx;
        memcpy(&dx, x, 4);
        int32_t lanes[8], mins[4], s = 0, m = 0;
        qk_lanes_scalar(w, type == T_Q5_K ? w + 16 : 0, w + (type == T_Q5_K ? 48 : 16), x, lanes, mins);
        for (int l = 0; l < 8; l++) s += lanes[l];
        for (int u = 0; u < 4; u++) m += mins[u];
        acc = tiled_acc(fmaf(-rdh(w + 2), (float)m, (float)s * rdh(w)), dx, acc);
    }
    return acc;
}
static float dot_q4_k_tiled_scalar(const uint8_t *w, const uint8_t *x, int64_t nb) { return dot_kmin_tiled_scalar(T_Q4_K, w, x, nb); }

/* ggml_vec_dot_q5_K_q8_K (AVX2 form, which llama.cpp also runs on AVX-512 machines): acc[l] = fma(d, lane l,
 * acc[l]) per super-block as Q4_K, but the mins in one float, summs = fma(-dx * dmin, the whole mins integer,
 * summs) (GCC contracts ggml's `summs += dmin * m`); then hsum8(acc) + summs. */
static float dot_q5_k_scalar(const uint8_t *w, const uint8_t *x, int64_t nb) {
    float acc[8] = {0}, summs = 0.0f;
    for (int64_t b = 0; b < nb; b++, w += 176, x += Q8_K_BYTES) {
        float dx;
        memcpy(&dx, x, 4);
        const float d = dx * rdh(w), dmin = -dx * rdh(w + 2);
        int32_t lanes[8], mins[4];
        q5_k_lanes_scalar(w, x, lanes, mins);
        for (int l = 0; l < 8; l++) acc[l] = fmaf(d, (float)lanes[l], acc[l]);
        summs = fmaf(dmin, (float)(mins[0] + mins[1] + mins[2] + mins[3]), summs);
    }
    return hsum8(acc) + summs;
}

static float dot_q5_k_tiled_scalar(const uint8_t *w, const uint8_t *x, int64_t nb) { return dot_kmin_tiled_scalar(T_Q5_K, w, x, nb); }

/* ---------------------------------------------------------------- SIMD helpers (AVX2; the AVX-512 code inlines them too) */
#if TG_X86
#define TGT2 __attribute__((target("avx2,fma,f16c")))

TGT2 static inline float hsum8_v(__m256 v) {
    float a[8];
    _mm256_storeu_ps(a, v);
    return hsum8(a);
}

TGT2 static inline int32_t hsum_i32x8(__m256i v) {
    __m128i t = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4e));
    t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xb1));
    return _mm_cvtsi128_si32(t);
}

TGT2 static inline int32_t hsum_i32x4(__m128i v) {
    v = _mm_add_epi32(v, _mm_shuffle_epi32(v, 0x4e));
    return _mm_cvtsi128_si32(_mm_add_epi32(v, _mm_shuffle_epi32(v, 0xb1)));
}

/* a Q4_1 block's 16 code bytes as its 32 codes (0..15) in value order */
TGT2 static inline __m256i q4_1_codes(const uint8_t *qs) {
    const __m128i t = _mm_loadu_si128((const __m128i *)qs);
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(t, 4), t), _mm256_set1_epi8(15));
}

/* the 32 bits of a Q5_0/Q5_1 block's qh (at p) as bytes: byte i 0xFF where bit i is set, else 0 */
TGT2 static inline __m256i qh_bytes(const uint8_t *p) {
    const __m256i shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
    const __m256i bitsel = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    uint32_t qh;
    memcpy(&qh, p, 4);
    const __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32((int)qh), shuf);
    return _mm256_cmpeq_epi8(_mm256_and_si256(bytes, bitsel), bitsel);
}

/* a Q5_0 block's 32 values (-16..15) as int8 in value order: byte i gets 0xF0 where bit i of qh is clear,
 * and lo | 0xF0 = lo - 16 as int8 */
TGT2 static inline __m256i q5_0_codes(const uint8_t *w) {
    return _mm256_or_si256(q4_1_codes(w + 6), _mm256_andnot_si256(qh_bytes(w + 2), _mm256_set1_epi8((char)0xF0)));
}

/* a Q5_1 block's 32 codes (0..31) in value order: Q4_1's, and 16 where bit i of qh is set */
TGT2 static inline __m256i q5_1_codes(const uint8_t *w) {
    return _mm256_or_si256(q4_1_codes(w + 8), _mm256_and_si256(qh_bytes(w + 4), _mm256_set1_epi8(16)));
}

/* a Q4_0 block's 32 values (-8..7) as int8 in value order */
TGT2 static inline __m256i q4_0_codes(const uint8_t *w) {
    return _mm256_sub_epi8(q4_1_codes(w + 2), _mm256_set1_epi8(8));
}

/* Q4_0, Q5_0 and Q8_0 blocks (one d per 32 values, against Q8_0): their codes as int8 in value order, and
 * their bytes; `type` is a constant wherever these are inlined */
TGT2 static inline __m256i q_0_codes(const int type, const uint8_t *w) {
    return type == T_Q4_0 ? q4_0_codes(w) : type == T_Q5_0 ? q5_0_codes(w) : _mm256_loadu_si256((const __m256i *)(w + 2));
}

/* ---------------------------------------------------------------- AVX-512 VNNI row dots */
#define TGT __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))

/* sum of x[i]*y[i] per 4 bytes (signed x signed), as ggml's mul_sum_i8_pairs_float with VNNI */
TGT static inline __m256i dot_i8_lanes(__m256i x, __m256i y) {
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x));
}

TGT static inline __attribute__((always_inline)) float dot_q_1_avx512(const int type, const uint8_t *w, const uint8_t *x, int64_t nb) {
    __m256 acc = _mm256_setzero_ps();
    float summs = 0.0f;
    for (int64_t b = 0; b < nb; b++, w += type == T_Q5_1 ? 24 : 20, x += Q8_1_BYTES) {
        const float d = _cvtsh_ss(rd16(w)) * _cvtsh_ss(rd16(x));
        summs = fmaf(_cvtsh_ss(rd16(w + 2)), _cvtsh_ss(rd16(x + 2)), summs);
        __m256i qy = _mm256_loadu_si256((const __m256i *)(x + 4));
        const __m256i codes = type == T_Q5_1 ? q5_1_codes(w) : q4_1_codes(w + 4);
        __m256 p = _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(_mm256_setzero_si256(), codes, qy));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), p, acc);
    }
    return hsum8_v(acc) + summs;
}
TGT static float dot_q4_1_avx512(const uint8_t *w, const uint8_t *x, int64_t nb) { return dot_q_1_avx512(T_Q4_1, w, x, nb); }
TGT static float dot_q5_1_avx512(const uint8_t *w, const uint8_t *x, int64_t nb) { return dot_q_1_avx512(T_Q5_1, w, x, nb); }

/* Q4_0/Q5_0/Q8_0 x Q8_0: ggml's per-block d = dw * dx, then fma over eight lanes of 4-value integer sums */
TGT static inline __attribute__((always_inline)) float dot_q_0_avx512(const int type, const uint8_t *w, const uint8_t *x,
                                                                      int64_t nb) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++, w += q_0_bytes(type), x += Q8_0_BYTES) {
        const float d = _cvtsh_ss(rd16(w)) * _cvtsh_ss(rd16(x));
        __m256i qy = _mm256_loadu_si256((const __m256i *)(x + 2));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(dot_i8_lanes(q_0_codes(type, w), qy)), acc);
    }
    return hsum8_v(acc);
}
TGT static float dot_q4_0_avx512(const uint8_t *w, const uint8_t *x, int64_t nb) { return dot_q_0_avx512(T_Q4_0, w, x, nb); }
TGT static float dot_q5_0_avx512(const uint8_t *w, const uint8_t *x, int64_t nb) { return dot_q_0_avx512(T_Q5_0, w, x, nb); }
TGT static float dot_q8_0_avx512(const uint8_t *w, const uint8_t *x, int64_t nb) { return dot_q_0_avx512(T_Q8_0, w, x, nb); }




/* Q6_K's eight integer lanes of one super-block (q6_k_lanes_scalar's) */
TGT static inline __attribute__((always_inline)) __m256i q6_k_lanes_avx512(const uint8_t *w, const uint8_t *x) {
    const __m512i m4 = _mm512_set1_epi8(15), m3 = _mm512_set1_epi8(3);
    const __m512i sh_a = _mm512_set_epi64(2, 2, 2, 2, 0, 0, 0, 0), sh_b = _mm512_set_epi64(6, 6, 6, 6, 4, 4, 4, 4);
    /* lane t of a 64-byte pair of chunks takes scale 2*chunk + t/4 (chunk = t/8 of the pair) */
    const __m512i idx0 = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
    const __m128i sc8 = _mm_loadu_si128((const __m128i *)(w + 192));
    const __m512i sc32 = _mm512_cvtepi8_epi32(sc8);
    __m512i sum = _mm512_setzero_si512();
    for (int j = 0; j < 2; j++) {
        __m512i ql = _mm512_loadu_si512((const void *)(w + 64 * j));
        __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(w + 128 + 32 * j)));
        __m512i h01 = _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi64(qh, sh_a), m3), 4);
        __m512i h23 = _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi64(qh, sh_b), m3), 4);
        __m512i q01 = _mm512_or_si512(_mm512_and_si512(ql, m4), h01);
        __m512i q23 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), m4), h23);
        __m512i y01 = _mm512_loadu_si512((const void *)(x + 4 + 128 * j));
        __m512i y23 = _mm512_loadu_si512((const void *)(x + 4 + 128 * j + 64));
        __m512i p01 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q01, y01);
        __m512i p23 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q23, y23);
        __m512i s01 = _mm512_permutexvar_epi32(_mm512_add_epi32(idx0, _mm512_set1_epi32(8 * j)), sc32);
        __m512i s23 = _mm512_permutexvar_epi32(_mm512_add_epi32(idx0, _mm512_set1_epi32(8 * j + 4)), sc32);
        sum = _mm512_add_epi32(sum, _mm512_add_epi32(_mm512_mullo_epi32(p01, s01), _mm512_mullo_epi32(p23, s23)));
    }
    __m256i lanes = _mm256_add_epi32(_mm512_castsi512_si256(sum), _mm512_extracti64x4_epi64(sum, 1));
    __m256i bsums = _mm256_loadu_si256((const __m256i *)(x + 4 + QKK));
    __m256i sub = _mm256_slli_epi32(_mm256_madd_epi16(bsums, _mm256_cvtepi8_epi16(sc8)), 5);
    return _mm256_sub_epi32(lanes, sub);
}

TGT static float dot_q6_k_avx512(const uint8_t *w, const uint8_t *x, int64_t nb) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++, w += 210, x += Q8_K_BYTES) {
        float dx;
        memcpy(&dx, x, 4);
        const float d = dx * _cvtsh_ss(rd16(w + 208));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(q6_k_lanes_avx512(w, x)), acc);
    }
    return hsum8_v(acc);
}

TGT static float dot_q6_k_tiled_avx512(const uint8_t *w, const uint8_t *x, int64_t nb) {
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++, w += 210, x += Q8_K_BYTES) {
        float dx;
        memcpy(&dx, x, 4);
        acc = tiled_acc((float)hsum_i32x8(q6_k_lanes_avx512(w, x)) * _cvtsh_ss(rd16(w + 208)), dx, acc);
    }
    return acc;
}

/* Q4_K's AVX-512 code reads the activations in a prepared layout (prep_q4_k): per super-block the
 * Q8_K scale, its codes reordered so that one 64-byte load meets the low (or high) nibbles of two
 * 32-byte groups, and the eight 32-value sums. Integer results are the same; only loads change. */
#define XP_BYTES 320 /* float d | 28 pad | 256 codes | 8 int16 sums | 16 pad */

static void prep_q4_k(const uint8_t *x, uint8_t *xp, int64_t nb) {
    for (int64_t b = 0; b < nb; b++, x += Q8_K_BYTES, xp += XP_BYTES) {
        memcpy(xp, x, 4);
        const uint8_t *q = x + 4;
        uint8_t *o = xp + 32;
        for (int pair = 0; pair < 2; pair++) /* groups 2p, 2p+1: [lo 2p | lo 2p+1], [hi 2p | hi 2p+1] */
            for (int half = 0; half < 2; half++)
                for (int g = 0; g < 2; g++, o += 32) memcpy(o, q + 64 * (2 * pair + g) + 32 * half, 32);
        int16_t bs[16], s8[8];
        memcpy(bs, x + 4 + QKK, sizeof bs);
        for (int j = 0; j < 8; j++) s8[j] = (int16_t)(bs[2 * j] + bs[2 * j + 1]);
        memcpy(xp + 288, s8, sizeof s8);
    }
}

/* the 8 six-bit scales (bytes 0..7) and mins (8..15) of a Q4_K block's 12 packed bytes */
static inline void q4_k_unpack(const uint8_t *q, uint32_t u[4]) {
    uint32_t a[3];
    memcpy(a, q, 12);
    const uint32_t six = 0x3f3f3f3f, low4 = 0x0f0f0f0f, top2 = 0x03030303;
    u[0] = a[0] & six;                                      /* scales 0..3 */
    u[1] = (a[2] & low4) | (((a[0] >> 6) & top2) << 4);     /* scales 4..7 */
    u[2] = a[1] & six;                                      /* mins 0..3 */
    u[3] = ((a[2] >> 4) & low4) | (((a[1] >> 6) & top2) << 4); /* mins 4..7 */
}

/* Q4_K's integer lanes of one super-block (q4_k_lanes_scalar's) from prep_q4_k's layout; *mins gets the
 * four mins lanes */
TGT static inline __attribute__((always_inline)) __m256i q4_k_lanes_avx512(const uint8_t *w, const uint8_t *xp, __m128i *mins) {
    const __m512i m4 = _mm512_set1_epi8(15);
    /* int16 lane t (0..31) of a group pair's products takes scale 2*(2p + t/16) + half */
    const __m512i i00 = _mm512_set_epi16(2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
    const __m512i one = _mm512_set1_epi16(1), four = _mm512_set1_epi16(4);
    uint32_t u[4];
    q4_k_unpack(w + 4, u);
    const __m128i sm16 = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)u)); /* scales as int16 */
    const __m512i sc = _mm512_castsi128_si512(sm16);
    const __m512i raw0 = _mm512_loadu_si512((const void *)(w + 16)), raw1 = _mm512_loadu_si512((const void *)(w + 80));
    const uint8_t *y = xp + 32;
    __m512i t0 = _mm512_madd_epi16(_mm512_maddubs_epi16(_mm512_and_si512(raw0, m4), _mm512_loadu_si512((const void *)y)),
                                   _mm512_permutexvar_epi16(i00, sc));
    __m512i t1 = _mm512_madd_epi16(_mm512_maddubs_epi16(_mm512_and_si512(_mm512_srli_epi16(raw0, 4), m4),
                                                        _mm512_loadu_si512((const void *)(y + 64))),
                                   _mm512_permutexvar_epi16(_mm512_add_epi16(i00, one), sc));
    __m512i t2 = _mm512_madd_epi16(_mm512_maddubs_epi16(_mm512_and_si512(raw1, m4), _mm512_loadu_si512((const void *)(y + 128))),
                                   _mm512_permutexvar_epi16(_mm512_add_epi16(i00, four), sc));
    __m512i t3 = _mm512_madd_epi16(_mm512_maddubs_epi16(_mm512_and_si512(_mm512_srli_epi16(raw1, 4), m4),
                                                        _mm512_loadu_si512((const void *)(y + 192))),
                                   _mm512_permutexvar_epi16(_mm512_add_epi16(i00, _mm512_add_epi16(four, one)), sc));
    const __m128i mins16 = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)(u + 2)));
    *mins = _mm_madd_epi16(mins16, _mm_loadu_si128((const __m128i *)(xp + 288)));
    /* lane k < 8 holds value lane k of the 64-value chunks 0 and 2, lane k + 8 that of chunks 1 and 3:
     * their sum is ggml's integer lane k (integer sums: any order gives the same) */
    const __m512i t = _mm512_add_epi32(_mm512_add_epi32(t0, t1), _mm512_add_epi32(t2, t3));
    return _mm256_add_epi32(_mm512_castsi512_si256(t), _mm512_extracti64x4_epi64(t, 1));
}

TGT static float dot_q4_k_avx512(const uint8_t *w, const uint8_t *xp, int64_t nb) {
    __m256 acc = _mm256_setzero_ps();
    __m128 accm = _mm_setzero_ps();
    for (int64_t b = 0; b < nb; b++, w += 144, xp += XP_BYTES) {
        float dx;
        memcpy(&dx, xp, 4);
        __m128i mins;
        const __m256i lanes = q4_k_lanes_avx512(w, xp, &mins);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(dx * _cvtsh_ss(rd16(w))), _mm256_cvtepi32_ps(lanes), acc);
        accm = _mm_fmadd_ps(_mm_set1_ps(-dx * _cvtsh_ss(rd16(w + 2))), _mm_cvtepi32_ps(mins), accm);
    }
    float m[4];
    _mm_storeu_ps(m, accm);
    return hsum8_v(acc) + ((m[0] + m[2]) + (m[1] + m[3]));
}

TGT static float dot_q4_k_tiled_avx512(const uint8_t *w, const uint8_t *xp, int64_t nb) {
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++, w += 144, xp += XP_BYTES) {
        float dx;
        memcpy(&dx, xp, 4);
        __m128i mins;
        const int32_t s = hsum_i32x8(q4_k_lanes_avx512(w, xp, &mins));
        acc = tiled_acc(fmaf(-_cvtsh_ss(rd16(w + 2)), (float)hsum_i32x4(mins), (float)s * _cvtsh_ss(rd16(w))), dx, acc);
    }
    return acc;
}

/* ---------------------------------------------------------------- AVX2 row dots
 * The same integer lanes and float steps as the code above, without VNNI: each 4-byte integer sum is
 * maddubs (unsigned x signed byte pairs into int16) then madd (int16 pairs into int32), as ggml's AVX2
 * code. No pair sum can saturate int16: the unsigned side is at most 63 (Q6_K), or the absolute value of
 * an int8 against at most 127 in magnitude (Q8_0, Q5_0). */

/* lane l: sum over bytes 4l..4l+3 of u[i] * s[i], u unsigned, s signed */
TGT2 static inline __m256i dot_u8_i8_avx2(__m256i u, __m256i s) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

/* lane l: sum over bytes 4l..4l+3 of x[i] * y[i], both signed (ggml's mul_sum_i8_pairs_float) */
TGT2 static inline __m256i dot_i8_avx2(__m256i x, __m256i y) {
    return dot_u8_i8_avx2(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x));
}

/* the largest of v's eight lanes (ggml's order of maxima) */
TGT2 static inline float hmax8_v(__m256 v) {
    __m128 m4 = _mm_max_ps(_mm256_extractf128_ps(v, 1), _mm256_castps256_ps128(v));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    return _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
}

/* 32 rounded values as int32 (four registers) -> 32 int8 codes in value order at out (saturating, as ggml) */
TGT2 static inline __m256i pack_codes_avx2(const __m256i q[4], uint8_t *out) {
    __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
    p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)); /* packs interleave the 128-bit lanes */
    _mm256_storeu_si256((__m256i *)out, p);
    return p;
}

/* quantize_q8_01 in ggml's AVX2 form (its quantize_row_q8_0/q8_1): the same max, scale, products and
 * round-to-nearest-even, so the same bytes for finite values (a block with an infinity or a NaN gets ggml's
 * AVX2 bytes, which differ from its scalar code's); eight values per instruction instead of a libm call each */
TGT2 static void quantize_q8_01_avx2(const float *x, uint8_t *out, int64_t k, int with_sum) {
    const int bytes = with_sum ? Q8_1_BYTES : Q8_0_BYTES;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int64_t b = 0; b < k / QK; b++, x += QK, out += bytes) {
        __m256 v[4];
        for (int j = 0; j < 4; j++) v[j] = _mm256_loadu_ps(x + 8 * j);
        const float amax = hmax8_v(_mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1])),
                                                 _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3]))));
        const float d = amax / 127.f;
        const __m256 id = _mm256_set1_ps(amax != 0.0f ? 127.f / amax : 0.0f);
        __m256i q[4];
        for (int j = 0; j < 4; j++)
            q[j] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v[j], id), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        const int32_t sum = hsum_i32x8(_mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3])));
        pack_codes_avx2(q, out + (with_sum ? 4 : 2));
        uint16_t dh = f32_to_f16(d);
        memcpy(out, &dh, 2);
        if (with_sum) {
            uint16_t sh = f32_to_f16(d * (float)sum);
            memcpy(out + 2, &sh, 2);
        }
    }
}

/* quantize_q8_k (ggml's quantize_row_q8_K_ref, which x86 builds use) with the products and rounding eight at a
 * time: the first value of the largest magnitude sets the scale, as the scalar loop's strict '>' picks it */
TGT2 static void quantize_q8_k_avx2(const float *x, uint8_t *out, int64_t k) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int64_t b = 0; b < k / QKK; b++, x += QKK, out += Q8_K_BYTES) {
        __m256 m = _mm256_setzero_ps(), bad = _mm256_setzero_ps();
        for (int j = 0; j < QKK; j += 8) {
            const __m256 a = _mm256_andnot_ps(sign, _mm256_loadu_ps(x + j));
            m = _mm256_max_ps(m, a);
            bad = _mm256_or_ps(bad, _mm256_cmp_ps(a, _mm256_set1_ps(INFINITY), _CMP_NLT_UQ)); /* an infinity or a NaN */
        }
        const float amax = hmax8_v(m);
        int8_t *qs = (int8_t *)(out + 4);
        int16_t bsums[16];
        float d = 0.0f;
        int first = 0;
        while (first < QKK && fabsf(x[first]) != amax) first++;
        if (first == QKK || _mm256_movemask_ps(bad)) { /* a NaN or an infinity in the block: the scalar loop's bytes */
            quantize_q8_k(x, out, QKK);
            continue;
        }
        if (amax == 0.0f) {
            memset(qs, 0, QKK);
            memset(bsums, 0, sizeof bsums);
        } else {
            const float iscale = -127.f / x[first];
            const __m256 is = _mm256_set1_ps(iscale);
            for (int j = 0; j < QKK; j += 32) {
                __m256i q[4];
                for (int u = 0; u < 4; u++)
                    q[u] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(is, _mm256_loadu_ps(x + j + 8 * u)),
                                                              _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
                const __m256i p = pack_codes_avx2(q, (uint8_t *)qs + j);
                /* the two 16-value sums of these 32 codes */
                const __m256i s16 = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), p), _mm256_set1_epi16(1));
                bsums[j / 16] = (int16_t)hsum_i32x4(_mm256_castsi256_si128(s16));
                bsums[j / 16 + 1] = (int16_t)hsum_i32x4(_mm256_extracti128_si256(s16, 1));
            }
            d = 1 / iscale;
        }
        memcpy(out, &d, 4);
        memcpy(out + 4 + QKK, bsums, sizeof bsums);
    }
}

/* one Q4_1 (Q5_1) block of a weight row against the activation block whose scale dx, sum sx and codes qy are given */
TGT2 static inline __attribute__((always_inline)) void q_1_block_avx2(const int type, const uint8_t *w, float dx, float sx, __m256i qy,
                                                                     __m256 *acc, float *summs) {
    *summs = fmaf(_cvtsh_ss(rd16(w + 2)), sx, *summs);
    const __m256i codes = type == T_Q5_1 ? q5_1_codes(w) : q4_1_codes(w + 4);
    *acc = _mm256_fmadd_ps(_mm256_set1_ps(_cvtsh_ss(rd16(w)) * dx), _mm256_cvtepi32_ps(dot_u8_i8_avx2(codes, qy)), *acc);
}

TGT2 static float dot_q4_1_avx2(const uint8_t *w, const uint8_t *x, int64_t nb) {
    __m256 acc = _mm256_setzero_ps();
    float summs = 0.0f;
    for (int64_t b = 0; b < nb; b++, w += 20, x += Q8_1_BYTES)
        q_1_block_avx2(T_Q4_1, w, _cvtsh_ss(rd16(x)), _cvtsh_ss(rd16(x + 2)), _mm256_loadu_si256((const __m256i *)(x + 4)), &acc, &summs);
    return hsum8_v(acc) + summs;
}

/* Q5_1: Q4_1's steps over the 5-bit codes */
TGT2 static float dot_q5_1_avx2(const uint8_t *w, const uint8_t *x, int64_t nb) {
    __m256 acc = _mm256_setzero_ps();
    float summs = 0.0f;
    for (int64_t b = 0; b < nb; b++, w += 24, x += Q8_1_BYTES)
        q_1_block_avx2(T_Q5_1, w, _cvtsh_ss(rd16(x)), _cvtsh_ss(rd16(x + 2)), _mm256_loadu_si256((const __m256i *)(x + 4)), &acc, &summs);
    return hsum8_v(acc) + summs;
}

/* dot_q4_1_avx2 of two weight rows against one activation row, interleaved: each row's operations and order
 * unchanged (so its bits), the activation block's load and scale conversions shared and the two rows'
 * chains overlapping (one-row products, decode) */
TGT2 static inline __attribute__((always_inline)) void dot2_q_1_avx2(const int type, const uint8_t *w0, const uint8_t *w1,
                                                                    const uint8_t *x, int64_t nb, float *y0, float *y1) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    float summs0 = 0.0f, summs1 = 0.0f;
    const int bytes = type == T_Q5_1 ? 24 : 20;
    for (int64_t b = 0; b < nb; b++, w0 += bytes, w1 += bytes, x += Q8_1_BYTES) {
        const float dx = _cvtsh_ss(rd16(x)), sx = _cvtsh_ss(rd16(x + 2));
        const __m256i qy = _mm256_loadu_si256((const __m256i *)(x + 4));
        q_1_block_avx2(type, w0, dx, sx, qy, &acc0, &summs0);
        q_1_block_avx2(type, w1, dx, sx, qy, &acc1, &summs1);
    }
    *y0 = hsum8_v(acc0) + summs0;
    *y1 = hsum8_v(acc1) + summs1;
}
TGT2 static void dot2_q4_1_avx2(const uint8_t *w0, const uint8_t *w1, const uint8_t *x, int64_t nb, float *y0, float *y1) {
    dot2_q_1_avx2(T_Q4_1, w0, w1, x, nb, y0, y1);
}
TGT2 static void dot2_q5_1_avx2(const uint8_t *w0, const uint8_t *w1, const uint8_t *x, int64_t nb, float *y0, float *y1) {
    dot2_q_1_avx2(T_Q5_1, w0, w1, x, nb, y0, y1);
}

/* Q4_0/Q5_0/Q8_0 x Q8_0: ggml's per-block d = dw * dx, then fma over eight lanes of 4-value integer sums */
TGT2 static inline __attribute__((always_inline)) float dot_q_0_avx2(const int type, const uint8_t *w, const uint8_t *x,
                                                                     int64_t nb) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++, w += q_0_bytes(type), x += Q8_0_BYTES) {
        const float d = _cvtsh_ss(rd16(w)) * _cvtsh_ss(rd16(x));
        __m256i qy = _mm256_loadu_si256((const __m256i *)(x + 2));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(dot_i8_avx2(q_0_codes(type, w), qy)), acc);
    }
    return hsum8_v(acc);
}
TGT2 static float dot_q4_0_avx2(const uint8_t *w, const uint8_t *x, int64_t nb) { return dot_q_0_avx2(T_Q4_0, w, x, nb); }
TGT2 static float dot_q5_0_avx2(const uint8_t *w, const uint8_t *x, int64_t nb) { return dot_q_0_avx2(T_Q5_0, w, x, nb); }
TGT2 static float dot_q8_0_avx2(const uint8_t *w, const uint8_t *x, int64_t nb) { return dot_q_0_avx2(T_Q8_0, w, x, nb); }




/* Q6_K's eight integer lanes of one super-block (q6_k_lanes_scalar's): per 32-value chunk the 4-byte sums,
 * each int16 pair times its 16-value scale (madd), summed over the chunks */
TGT2 static inline __attribute__((always_inline)) __m256i q6_k_lanes_avx2(const uint8_t *w, const uint8_t *x) {
    const __m256i m4 = _mm256_set1_epi8(15), m3 = _mm256_set1_epi8(3);
    const __m128i sc8 = _mm_loadu_si128((const __m128i *)(w + 192));
    const __m256i sc16 = _mm256_cvtepi8_epi16(sc8);
    /* scales 0..7 and 8..15 as int16 in both register halves: chunk c's pair (2c, 2c+1) is one in-lane byte shuffle */
    const __m256i sc_lo = _mm256_permute2x128_si256(sc16, sc16, 0x00), sc_hi = _mm256_permute2x128_si256(sc16, sc16, 0x11);
    const uint8_t *y = x + 4;
    __m256i sum = _mm256_setzero_si256();
    for (int j = 0; j < 2; j++) {
        const __m256i ql0 = _mm256_loadu_si256((const __m256i *)(w + 64 * j));
        const __m256i ql1 = _mm256_loadu_si256((const __m256i *)(w + 64 * j + 32));
        const __m256i qh = _mm256_loadu_si256((const __m256i *)(w + 128 + 32 * j));
        __m256i q[4];
        q[0] = _mm256_or_si256(_mm256_and_si256(ql0, m4), _mm256_slli_epi16(_mm256_and_si256(qh, m3), 4));
        q[1] = _mm256_or_si256(_mm256_and_si256(ql1, m4), _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), m3), 4));
        q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
                               _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), m3), 4));
        q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                               _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), m3), 4));
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) {
            const int chunk = 4 * j + c, e = 2 * chunk % 8; /* int16 index of scale 2*chunk within its half */
            const __m256i p = _mm256_maddubs_epi16(q[c], _mm256_loadu_si256((const __m256i *)(y + 32 * chunk)));
            const __m256i pick = _mm256_set_m128i(_mm_set1_epi16((short)(((2 * e + 3) << 8) | (2 * e + 2))),
                                                  _mm_set1_epi16((short)(((2 * e + 1) << 8) | (2 * e))));
            const __m256i s = _mm256_shuffle_epi8(j ? sc_hi : sc_lo, pick);
            sum = _mm256_add_epi32(sum, _mm256_madd_epi16(p, s));
        }
    }
    const __m256i bsums = _mm256_loadu_si256((const __m256i *)(x + 4 + QKK));
    return _mm256_sub_epi32(sum, _mm256_slli_epi32(_mm256_madd_epi16(bsums, sc16), 5));
}

TGT2 static float dot_q6_k_avx2(const uint8_t *w, const uint8_t *x, int64_t nb) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++, w += 210, x += Q8_K_BYTES) {
        float dx;
        memcpy(&dx, x, 4);
        const float d = dx * _cvtsh_ss(rd16(w + 208));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(q6_k_lanes_avx2(w, x)), acc);
    }
    return hsum8_v(acc);
}

TGT2 static float dot_q6_k_tiled_avx2(const uint8_t *w, const uint8_t *x, int64_t nb) {
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++, w += 210, x += Q8_K_BYTES) {
        float dx;
        memcpy(&dx, x, 4);
        acc = tiled_acc((float)hsum_i32x8(q6_k_lanes_avx2(w, x)) * _cvtsh_ss(rd16(w + 208)), dx, acc);
    }
    return acc;
}

/* Q4_K's integer lanes of one super-block (q4_k_lanes_scalar's) over the plain Q8_K layout; *mins gets
 * the four mins lanes */
TGT2 static inline __attribute__((always_inline)) __m256i qk_lanes_avx2(const int type, const uint8_t *w, const uint8_t *x,
                                                                        __m128i *mins) {
    const __m256i m4 = _mm256_set1_epi8(15);
    const int qs = type == T_Q5_K ? 48 : 16;
    const __m256i hbits = type == T_Q5_K ? _mm256_loadu_si256((const __m256i *)(w + 16)) : _mm256_setzero_si256();
    uint32_t u[4];
    q4_k_unpack(w + 4, u);
    /* the scales as int16 in both register halves, each broadcast by a byte shuffle: kept in registers, not stored
     * and read back a byte at a time (which waited on store forwarding; docs/performance.md, session 23) */
    const __m256i sc16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_set_epi32(0, 0, (int)u[1], (int)u[0])));
    const uint8_t *y = x + 4;
    __m256i sum = _mm256_setzero_si256();
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) {
        const __m256i raw = _mm256_loadu_si256((const __m256i *)(w + qs + 32 * j));
        __m256i c_lo = _mm256_and_si256(raw, m4), c_hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
        if (type == T_Q5_K) { /* bit 2j of qh[i] onto byte i's low code, bit 2j+1 onto its high code, as 16 */
            const __m256i one = _mm256_set1_epi8(1);
            c_lo = _mm256_or_si256(c_lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hbits, 2 * j), one), 4));
            c_hi = _mm256_or_si256(c_hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hbits, 2 * j + 1), one), 4));
        }
        const __m256i lo = _mm256_maddubs_epi16(c_lo, _mm256_loadu_si256((const __m256i *)(y + 64 * j)));
        const __m256i hi = _mm256_maddubs_epi16(c_hi, _mm256_loadu_si256((const __m256i *)(y + 64 * j + 32)));
        const __m256i s_lo = _mm256_shuffle_epi8(sc16, _mm256_set1_epi16((short)(((4 * j + 1) << 8) | (4 * j))));
        const __m256i s_hi = _mm256_shuffle_epi8(sc16, _mm256_set1_epi16((short)(((4 * j + 3) << 8) | (4 * j + 2))));
        sum = _mm256_add_epi32(sum, _mm256_add_epi32(_mm256_madd_epi16(lo, s_lo), _mm256_madd_epi16(hi, s_hi)));
    }
    /* 32-value activation sums (pairs of the 16-value ones) against the mins, two per lane */
    const __m256i bs = _mm256_loadu_si256((const __m256i *)(x + 4 + QKK));
    const __m256i s32 = _mm256_madd_epi16(bs, _mm256_set1_epi16(1));
    const __m128i s8 = _mm_packs_epi32(_mm256_castsi256_si128(s32), _mm256_extracti128_si256(s32, 1));
    *mins = _mm_madd_epi16(_mm_cvtepu8_epi16(_mm_set_epi32(0, 0, (int)u[3], (int)u[2])), s8);
    return sum;
}
TGT2 static inline __attribute__((always_inline)) __m256i q4_k_lanes_avx2(const uint8_t *w, const uint8_t *x, __m128i *mins) {
    return qk_lanes_avx2(T_Q4_K, w, x, mins);
}

TGT2 static float dot_q4_k_avx2(const uint8_t *w, const uint8_t *x, int64_t nb) {
    __m256 acc = _mm256_setzero_ps();
    __m128 accm = _mm_setzero_ps();
    for (int64_t b = 0; b < nb; b++, w += 144, x += Q8_K_BYTES) {
        float dx;
        memcpy(&dx, x, 4);
        __m128i mins;
        const __m256i lanes = q4_k_lanes_avx2(w, x, &mins);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(dx * _cvtsh_ss(rd16(w))), _mm256_cvtepi32_ps(lanes), acc);
        accm = _mm_fmadd_ps(_mm_set1_ps(-dx * _cvtsh_ss(rd16(w + 2))), _mm_cvtepi32_ps(mins), accm);
    }
    float m[4];
    _mm_storeu_ps(m, accm);
    return hsum8_v(acc) + ((m[0] + m[2]) + (m[1] + m[3]));
}

TGT2 static inline __attribute__((always_inline)) float dot_kmin_tiled_avx2(const int type, const uint8_t *w, const uint8_t *x,
                                                                             int64_t nb) {
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++, w += type == T_Q5_K ? 176 : 144, x += Q8_K_BYTES) {
        float dx;
        memcpy(&dx, x, 4);
        __m128i mins;
        const int32_t s = hsum_i32x8(qk_lanes_avx2(type, w, x, &mins));
        acc = tiled_acc(fmaf(-_cvtsh_ss(rd16(w + 2)), (float)hsum_i32x4(mins), (float)s * _cvtsh_ss(rd16(w))), dx, acc);
    }
    return acc;
}
TGT2 static float dot_q4_k_tiled_avx2(const uint8_t *w, const uint8_t *x, int64_t nb) { return dot_kmin_tiled_avx2(T_Q4_K, w, x, nb); }

/* Q5_K (dot_q5_k_scalar's steps); the AVX-512 level runs these too, as llama.cpp does */
TGT2 static float dot_q5_k_avx2(const uint8_t *w, const uint8_t *x, int64_t nb) {
    __m256 acc = _mm256_setzero_ps();
    float summs = 0.0f;
    for (int64_t b = 0; b < nb; b++, w += 176, x += Q8_K_BYTES) {
        float dx;
        memcpy(&dx, x, 4);
        __m128i mins;
        const __m256i lanes = qk_lanes_avx2(T_Q5_K, w, x, &mins);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(dx * _cvtsh_ss(rd16(w))), _mm256_cvtepi32_ps(lanes), acc);
        summs = fmaf(-dx * _cvtsh_ss(rd16(w + 2)), (float)hsum_i32x4(mins), summs);
    }
    return hsum8_v(acc) + summs;
}

TGT2 static float dot_q5_k_tiled_avx2(const uint8_t *w, const uint8_t *x, int64_t nb) { return dot_kmin_tiled_avx2(T_Q5_K, w, x, nb); }
#endif

/* ---------------------------------------------------------------- dispatch */

typedef float (*row_dot_fn)(const uint8_t *, const uint8_t *, int64_t);

static float dot_q4_0_s(const uint8_t *w, const uint8_t *x, int64_t nb) { return dot_q5_0_q8_0_scalar(T_Q4_0, w, x, nb); }
static float dot_q5_0_s(const uint8_t *w, const uint8_t *x, int64_t nb) { return dot_q5_0_q8_0_scalar(T_Q5_0, w, x, nb); }
static float dot_q8_0_s(const uint8_t *w, const uint8_t *x, int64_t nb) { return dot_q5_0_q8_0_scalar(T_Q8_0, w, x, nb); }

/* The code level in use: the detected best unless capped by tg_set_simd. */
enum { SIMD_PORTABLE = 0, SIMD_AVX2 = 1, SIMD_AVX512 = 2 };
static int g_simd = -1;

static int simd_supported(void) {
#if TG_X86
    __builtin_cpu_init();
    if (!(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c"))) return SIMD_PORTABLE;
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx512vnni") ? SIMD_AVX512 : SIMD_AVX2;
#else
    return SIMD_PORTABLE;
#endif
}

/* llama.cpp b11434 takes the tiled K-quant product (ggml-cpu/tiled) for 8 or more activation rows */
#define TG_TILED_MIN_ROWS 8

static row_dot_fn pick(int type, int simd, int64_t rows) {
    const int tiled = rows >= TG_TILED_MIN_ROWS;
#if TG_X86
    if (simd == SIMD_AVX512) {
        switch (type) {
        case T_Q4_0: return dot_q4_0_avx512;
        case T_Q4_1: return dot_q4_1_avx512;
        case T_Q5_1: return dot_q5_1_avx512;
        case T_Q5_0: return dot_q5_0_avx512;
        case T_Q8_0: return dot_q8_0_avx512;
        case T_Q6_K: return tiled ? dot_q6_k_tiled_avx512 : dot_q6_k_avx512;
        case T_Q4_K: return tiled ? dot_q4_k_tiled_avx512 : dot_q4_k_avx512; /* read prep_q4_k's layout */
        case T_Q5_K: return tiled ? dot_q5_k_tiled_avx2 : dot_q5_k_avx2;
        }
    }
    if (simd == SIMD_AVX2) {
        switch (type) {
        case T_Q4_0: return dot_q4_0_avx2;
        case T_Q4_1: return dot_q4_1_avx2;
        case T_Q5_1: return dot_q5_1_avx2;
        case T_Q5_0: return dot_q5_0_avx2;
        case T_Q8_0: return dot_q8_0_avx2;
        case T_Q6_K: return tiled ? dot_q6_k_tiled_avx2 : dot_q6_k_avx2;
        case T_Q4_K: return tiled ? dot_q4_k_tiled_avx2 : dot_q4_k_avx2;
        case T_Q5_K: return tiled ? dot_q5_k_tiled_avx2 : dot_q5_k_avx2;
        }
    }
#endif
    switch (type) {
    case T_Q4_0: return dot_q4_0_s;
    case T_Q4_1: return dot_q4_1_scalar;
    case T_Q5_1: return dot_q5_1_scalar;
    case T_Q5_0: return dot_q5_0_s;
    case T_Q8_0: return dot_q8_0_s;
    case T_Q6_K: return tiled ? dot_q6_k_tiled_scalar : dot_q6_k_scalar;
    case T_Q4_K: return tiled ? dot_q4_k_tiled_scalar : dot_q4_k_scalar;
    case T_Q5_K: return tiled ? dot_q5_k_tiled_scalar : dot_q5_k_scalar;
    }
    return 0;
}

static int k_quant(int type) { return type == T_Q4_K || type == T_Q5_K || type == T_Q6_K; }
static int act_type(int type) { return type == T_Q4_1 || type == T_Q5_1 ? T_Q8_1 : k_quant(type) ? T_Q8_K : T_Q8_0; }
static int act_block(int atype) { return atype == T_Q8_K ? QKK : QK; }
static int act_bytes(int atype) { return atype == T_Q8_K ? Q8_K_BYTES : atype == T_Q8_1 ? Q8_1_BYTES : Q8_0_BYTES; }

/* ---------------------------------------------------------------- threads */

typedef struct {
    row_dot_fn fn;
    const uint8_t *w;
    int64_t row_bytes, n, nb;
    const uint8_t *xq;
    int64_t xq_stride, m;
    float *y;
    int64_t y_stride;
} job_t;

/* Weight bytes prefetched ahead of the row being read (0: none). The rows stream from DRAM once per
 * token; on the Intel Xeon VM of session 10 the hardware prefetchers alone left one core at ~3 GB/s on
 * small-block rows (all of smollm2's products in file order, one thread: 29.9 ms; 2 KiB ahead 19.1 ms,
 * two threads 18.1 -> 12.0 ms; qwen2.5's 1.1 GB, two threads, 116 -> 100 ms; 4 KiB and more was no
 * better; docs/performance.md). Results are unchanged: it only touches memory earlier. */
static int64_t g_prefetch = 2048;

/* set the prefetch distance (bytes >= 0) or read it (-1); returns the previous value. For measurements. */
int64_t tg_set_prefetch(int64_t bytes) {
    int64_t old = g_prefetch;
    if (bytes >= 0) g_prefetch = bytes;
    return old;
}

typedef void (*row_dot2_fn)(const uint8_t *, const uint8_t *, const uint8_t *, int64_t, float *, float *);

/* the two-row form of a row function, where there is one (TALLOW_CPU_ROW_PAIRS: tg_set_row_pairs) */
static int g_row_pairs = 1;

int tg_set_row_pairs(int on) {
    const int old = g_row_pairs;
    if (on >= 0) g_row_pairs = on;
    return old;
}

static row_dot2_fn pair_of(row_dot_fn fn) {
#if TG_X86
    if (g_row_pairs && fn == dot_q4_1_avx2) return dot2_q4_1_avx2;
    if (g_row_pairs && fn == dot_q5_1_avx2) return dot2_q5_1_avx2;
#endif
    (void)fn;
    return 0;
}

static void run_rows(const job_t *j, int64_t r0, int64_t r1) {
    const uint8_t *end = j->w + r1 * j->row_bytes;
    const uint8_t *pf = j->w + r0 * j->row_bytes + g_prefetch;
    const row_dot2_fn fn2 = j->m == 1 ? pair_of(j->fn) : 0;
    for (int64_t r = r0; r < r1; r++) { /* a weight row stays in L1 across the m activation rows */
        const int two = fn2 && r + 1 < r1;
        if (g_prefetch) {
            const uint8_t *stop = j->w + (r + 1 + two) * j->row_bytes + g_prefetch;
            for (; pf < stop && pf < end; pf += 64) __builtin_prefetch(pf, 0, 0);
        }
        if (two) {
            fn2(j->w + r * j->row_bytes, j->w + (r + 1) * j->row_bytes, j->xq, j->nb, j->y + r, j->y + r + 1);
            r++;
            continue;
        }
        for (int64_t i = 0; i < j->m; i++)
            j->y[i * j->y_stride + r] = j->fn(j->w + r * j->row_bytes, j->xq + i * j->xq_stride, j->nb);
    }
}

/* ---------------------------------------------------------------- exported API */

/* Products of fewer weight bytes (times activation rows) than this run on the calling thread: below
 * it a parallel region's fork and join costs more than the second thread saves. 1 MiB kept most of a
 * small model's products on one of two cores (smollm2: all but the output); 64-256 KiB
 * measured best on the 2-core machine (docs/performance.md, session 9). */
static int64_t g_par_min = 256 << 10;

int64_t tg_set_par_min(int64_t bytes) {
    int64_t old = g_par_min;
    if (bytes >= 0) g_par_min = bytes;
    return old;
}

int tg_abi_version(void) { return 10; }

/* the code in use: 2 AVX-512 VNNI, 1 AVX2, 0 portable */
int tg_simd(void) {
    if (g_simd < 0) g_simd = simd_supported();
    return g_simd;
}

/* use the best code this CPU runs up to `level` (-1: no cap); returns the level now in use */
int tg_set_simd(int level) {
    const int best = simd_supported();
    g_simd = level < 0 || level > best ? best : level;
    return g_simd;
}

int tg_supported(int type) { return pick(type, 0, 1) != 0; }
int tg_act_type(int type) { return act_type(type); }
int64_t tg_act_row_bytes(int type, int64_t k) { int a = act_type(type); return k / act_block(a) * act_bytes(a); }

/* threads for quantizing many rows: OpenMP's default, i.e. torch's thread count (one runtime, see run_products) */
static int nthreads_for_rows(void) {
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

/* x (m, k) float32 rows -> out (m, tg_act_row_bytes) bytes of `atype` (8 Q8_0, 9 Q8_1, 15 Q8_K) */
int tg_quantize(int atype, const float *x, uint8_t *out, int64_t m, int64_t k) {
    if (k % act_block(atype)) return -1;
    if (atype != T_Q8_K && atype != T_Q8_0 && atype != T_Q8_1) return -1;
    const int64_t rb = k / act_block(atype) * act_bytes(atype);
    /* prompts: the rows on the two threads (torch's thread count; each row's bytes are its own) */
#pragma omp parallel for schedule(static) if (m * k >= (1 << 16)) num_threads(nthreads_for_rows())
    for (int64_t i = 0; i < m; i++) {
#if TG_X86
        if (tg_simd() >= SIMD_AVX2) {
            if (atype == T_Q8_K) quantize_q8_k_avx2(x + i * k, out + i * rb, k);
            else quantize_q8_01_avx2(x + i * k, out + i * rb, k, atype == T_Q8_1);
            continue;
        }
#endif
        if (atype == T_Q8_K) quantize_q8_k(x + i * k, out + i * rb, k);
        else quantize_q8_01(x + i * k, out + i * rb, k, atype == T_Q8_1);
    }
    return 0;
}

/* ---------------------------------------------------------------- several products over one input */

/* tg_plan_t: up to TG_MAX_PARTS weights over one input (ggml_dot.h) */

static int act_slot(int atype) { return atype == T_Q8_0 ? 0 : atype == T_Q8_1 ? 1 : 2; }

#if TG_X86
/* m Q8_K activation rows (xq_stride bytes apart) in Q4_K's AVX-512 layout (prep_q4_k), in a buffer of the
 * calling thread's that grows as needed; NULL when it cannot be allocated. */
static const uint8_t *q4k_prepared(const uint8_t *xq, int64_t xq_stride, int64_t m, int64_t k) {
    static __thread uint8_t *prep;
    static __thread int64_t prep_size;
    const int64_t need = m * (k / QKK) * XP_BYTES;
    if (need > prep_size) {
        free(prep);
        prep = aligned_alloc(64, (size_t)((need + 63) / 64 * 64));
        prep_size = prep ? need : 0;
        if (!prep) return 0;
    }
    for (int64_t i = 0; i < m; i++) prep_q4_k(xq + i * xq_stride, prep + i * (k / QKK) * XP_BYTES, k / QKK);
    return prep;
}
#endif

/* scratch bytes tg_linear_multi needs for m activation rows (every activation type's rows) */
int64_t tg_plan_scratch(const tg_plan_t *p, int64_t m) {
    int64_t total = 0;
    int seen[3] = {0, 0, 0};
    for (int i = 0; i < p->nparts; i++) {
        const int a = act_type((int)p->types[i]);
        if (!seen[act_slot(a)]) {
            seen[act_slot(a)] = 1;
            total += m * (p->k / act_block(a) * act_bytes(a));
        }
    }
    return total;
}

typedef struct {
    job_t jobs[TG_MAX_PARTS];
    int64_t off[TG_MAX_PARTS + 1]; /* byte offset of each part in the concatenated weights */
    int nparts;
} multi_t;

/* first row of `part` at or after byte `at` of the concatenation, rounded up to 16 rows */
static int64_t part_row(const multi_t *mj, int part, int64_t at) {
    const job_t *j = &mj->jobs[part];
    if (at <= mj->off[part]) return 0;
    int64_t r = (at - mj->off[part] + j->row_bytes - 1) / j->row_bytes;
    r = (r + 15) / 16 * 16;
    return r < j->n ? r : j->n;
}

/* thread t of nt takes the t-th share of the bytes (whole 16-row groups) */
static void run_multi_share(const multi_t *mj, int t, int nt) {
    const int64_t total = mj->off[mj->nparts];
    const int64_t b0 = total / nt * t, b1 = t == nt - 1 ? total : total / nt * (t + 1);
    for (int i = 0; i < mj->nparts; i++) {
        if (mj->off[i + 1] <= b0 || mj->off[i] >= b1) continue;
        const int64_t r0 = part_row(mj, i, b0), r1 = t == nt - 1 ? mj->jobs[i].n : part_row(mj, i, b1);
        if (r0 < r1) run_rows(&mj->jobs[i], r0, r1);
    }
}

/* Runs mj's parts: OpenMP's static split over the bytes (each thread streams one contiguous share;
 * a dynamic split in 32 KiB chunks over a pool of this library's own threads was slower here:
 * docs/performance.md, session 9), or the calling thread alone for small products. OpenMP, because
 * torch's CPU wheels ship libgomp.so.1 and this library, loaded after torch, binds to that same
 * runtime: its threads are torch's intra-op threads, not a second pool spinning against them. */
static void run_products(multi_t *mj, int m, int nthreads) {
    const int parts = (double)mj->off[mj->nparts] * (double)m < (double)g_par_min ? 1 : nthreads;
#ifdef _OPENMP
    if (parts > 1) {
#pragma omp parallel num_threads(parts)
        run_multi_share(mj, omp_get_thread_num(), omp_get_num_threads());
        return;
    }
#endif
    (void)parts;
    run_multi_share(mj, 0, 1);
}

int tg_linear_multi(const tg_plan_t *p, const float *x, int64_t m, uint8_t *scratch, float *y, int nthreads) {
    if (p->nparts < 1 || p->nparts > TG_MAX_PARTS) return -1;
    const int simd = tg_simd();
    const int64_t k = p->k;
    uint8_t *act[3] = {0, 0, 0};
    uint8_t *next = scratch;
    int64_t ntot = 0;
    for (int i = 0; i < p->nparts; i++) {
        const int a = act_type((int)p->types[i]);
        if (!pick((int)p->types[i], 0, 1) || k % act_block(a)) return -1;
        if (!act[act_slot(a)]) {
            act[act_slot(a)] = next;
            tg_quantize(a, x, next, m, k);
            next += m * (k / act_block(a) * act_bytes(a));
        }
        ntot += p->n[i];
    }
    /* Prompts: the K-quants in llama.cpp's tiled order through ggml_gemm.c's register-tiled product (the bits of
     * the tiled row functions below). From 9 rows by default: up to 8 rows (decode, speculative verification)
     * every row keeps vec_dot's order; under TALLOW_NUMERICS=ggml (row_invariant 0) from 8, as llama.cpp. */
    if (m >= TG_TILED_MIN_ROWS + (p->row_invariant ? 1 : 0) && simd >= SIMD_AVX2) {
        tg_gemm_part_t gp[TG_MAX_PARTS];
        int all = 1;
        for (int i = 0, col = 0; i < p->nparts; col += (int)p->n[i], i++) {
            const int a = act_type((int)p->types[i]);
            all &= tg_gemm_takes((int)p->types[i]);
            gp[i] = (tg_gemm_part_t){p->types[i], p->w[i], p->row_bytes[i], p->n[i], act[act_slot(a)],
                                     k / act_block(a) * act_bytes(a), col};
        }
        if (all) return tg_gemm_run(gp, p->nparts, k, m, y, ntot, nthreads);
    }
    const uint8_t *q4k = 0; /* Q4_K's prepared activation layout, made once for all its parts */
    int64_t q4k_stride = 0;
#if TG_X86
    for (int i = 0; i < p->nparts && simd == SIMD_AVX512 && !q4k; i++) {
        if (p->types[i] != T_Q4_K) continue;
        if (!(q4k = q4k_prepared(act[2], k / QKK * Q8_K_BYTES, m, k))) return -2;
        q4k_stride = (k / QKK) * XP_BYTES;
    }
#endif
    multi_t mj;
    mj.nparts = p->nparts;
    mj.off[0] = 0;
    int64_t col = 0;
    for (int i = 0; i < p->nparts; i++) {
        const int type = (int)p->types[i], a = act_type(type);
        job_t *j = &mj.jobs[i];
        j->fn = pick(type, simd, p->row_invariant ? 1 : m);
        j->w = p->w[i];
        j->row_bytes = p->row_bytes[i];
        j->n = p->n[i];
        j->nb = k / (k_quant(type) ? QKK : QK);
        if (type == T_Q4_K && q4k) {
            j->xq = q4k;
            j->xq_stride = q4k_stride;
        } else {
            j->xq = act[act_slot(a)];
            j->xq_stride = k / act_block(a) * act_bytes(a);
        }
        j->m = m;
        j->y = y + col;
        j->y_stride = ntot;
        col += p->n[i];
        mj.off[i + 1] = mj.off[i] + p->n[i] * p->row_bytes[i];
    }
    run_products(&mj, (int)m, nthreads);
    return 0;
}

/* y[i, r] = dot(weight row r, quantized activation row i) for r < n, i < m.
 * w: n rows of row_bytes; xq: m rows of tg_act_row_bytes(type, k); y: (m, n) float32. */
int tg_gemv_q(int type, const uint8_t *w, int64_t row_bytes, int64_t n, int64_t k, const uint8_t *xq, int64_t m, float *y,
              int nthreads) {
    row_dot_fn fn = pick(type, tg_simd(), m);
    const int a = act_type(type);
    if (!fn || k % act_block(a)) return -1;
    int64_t xq_stride = k / act_block(a) * act_bytes(a);
    if (m >= TG_TILED_MIN_ROWS && tg_simd() >= SIMD_AVX2 && tg_gemm_takes(type)) { /* the tiled order: ggml_gemm.c, same bits */
        const tg_gemm_part_t part = {type, w, row_bytes, n, xq, xq_stride, 0};
        return tg_gemm_run(&part, 1, k, m, y, n, nthreads);
    }
#if TG_X86
    if (type == T_Q4_K && tg_simd() == SIMD_AVX512) {
        if (!(xq = q4k_prepared(xq, xq_stride, m, k))) return -2;
        xq_stride = (k / QKK) * XP_BYTES;
    }
#endif
    multi_t mj;
    mj.nparts = 1;
    mj.jobs[0] = (job_t){fn, w, row_bytes, n, k / (k_quant(type) ? QKK : QK), xq, xq_stride, m, y, n};
    mj.off[0] = 0;
    mj.off[1] = n * row_bytes;
    run_products(&mj, (int)m, nthreads);
    return 0;
}

/* quantize x (m, k) into scratch (m * tg_act_row_bytes bytes) and run tg_gemv_q: one call per product */
int tg_linear(int type, const uint8_t *w, int64_t row_bytes, int64_t n, int64_t k, const float *x, int64_t m, uint8_t *scratch,
              float *y, int nthreads) {
    if (!pick(type, 0, 1) || tg_quantize(act_type(type), x, scratch, m, k)) return -1;
    return tg_gemv_q(type, w, row_bytes, n, k, scratch, m, y, nthreads);
}
