/* Prefill products of Q4_K, Q5_K and Q6_K weights (many activation rows x many weight rows) in llama.cpp's
 * prompt arithmetic, with AVX-512 VNNI over a register tile.
 *
 * What it computes: each output exactly as ggml_dot.c's tiled row functions (dot_q4_k_tiled_*,
 * dot_q6_k_tiled_*), i.e. as llama.cpp b11434's tiled K-quant product (ggml-cpu/tiled), which
 * ggml_mul_mat takes for 8 or more activation rows: per super-block one exact integer s (Q4_K also the
 * mins' integer m), res = s * d (Q4_K: fma(-dmin, m, s * d)), acc = fma(res, dx, acc) super-block by
 * super-block. That order depends on nothing but the output itself, so a row gets the same bits in a
 * chunk of any length above 8 rows (engine/prefill_plan.py's row invariance).
 *
 * Why this order and not the decode rows' (vec_dot's eight float lanes): vec_dot needs each 4-value
 * partial sum scaled on its own, two instructions per 64 products (measured: ~41 products a cycle a
 * core at best, no faster than the bf16 path it would replace; docs/performance.md, session 14). With one
 * integer per super-block the 32-value block sums can be formed whole and scaled once: here the 16 int32
 * lanes of a register are 16 weight rows, dpbusd adds 4 products of one row per lane, eight of them make
 * each lane's 32-value block sum, and one multiply by the 16 rows' block scales applies them (64 products
 * per dpbusd, one scaling per 512).
 *
 * Layout: a panel of 16 weight rows is unpacked once per product into bytes (per 4-value unit of the
 * super-block, the 16 rows' 4 codes side by side: one 64-byte load), with the scales as int32 lanes; each
 * activation unit is one 32-bit broadcast. Q4_K's codes are unsigned (0..15) against the signed Q8_K
 * codes; Q6_K's are signed (code - 32), so its activations are offset to unsigned (x + 128) and the
 * offset's share, -128 * sum(scale * block's code sum), is each row's starting value.
 *
 * Q4_0, Q4_1, Q5_0 and Q8_0 (32-value blocks with one scale) keep vec_dot's order at every row count in llama.cpp
 * (llamafile's tinyBLAS for Q5_0/Q8_0 sums each output in that order too), so here as well: per block, eight
 * float lanes acc[l] = fma(dw * dx, lane l, acc[l]), Q4_1's summs = fma(m, s, summs), ggml's horizontal sum
 * -- the decode rows' bits. AVX-512: two weight rows share a register (lanes 0-7 and 8-15), dpbusd gives each
 * row's eight 4-value lanes of a block at once; Q5_0's and Q8_0's codes are stored unsigned (+16, +128) and each
 * lane starts at minus that offset times the activation's 4-value sum. AVX2: one row a register, maddubs and
 * madd (tile0_2; Q8_0 signed, by ggml's sign trick).
 *
 * Threads: OpenMP over the panels (16- or 8-row groups) of every part, static split.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "ggml_dot.h"
#ifdef _OPENMP
#include <omp.h>
#endif

enum { G_Q4_0 = 2, G_Q4_1 = 3, G_Q5_0 = 6, G_Q5_1 = 7, G_Q8_0 = 8, G_Q4_K = 12, G_Q5_K = 13, G_Q6_K = 14 };
#define QK 32
#define QKK 256
#define Q8K_BYTES 292 /* float d, int8 qs[256], int16 bsums[16] */
#define PANEL 16      /* weight rows per panel: the int32 lanes of a register */
#define TILE 6        /* activation rows per register tile: 4 registers each (two block sums, s, acc) */

static int g_gemm = 1; /* 0: tg_linear_multi keeps the row functions at every row count (tests, A/B) */

int tg_set_gemm(int on) {
    int old = g_gemm;
    if (on >= 0) g_gemm = on;
    return old;
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define TGT __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))
#define TGT2 __attribute__((target("avx2,fma,f16c"))) /* also what the AVX-512 code shares: unpacking */
#define UNROLL _Pragma("GCC unroll 8") /* registers, not arrays on the stack */

static int k_quant(int type) { return type == G_Q4_K || type == G_Q5_K || type == G_Q6_K; }
/* Q4_K and Q5_K: unsigned codes, a scale and a min per 32 values (their panels and tiles are one form) */
static int with_mins(int type) { return type == G_Q4_K || type == G_Q5_K; }
static int kq_bytes(int type) { return type == G_Q4_K ? 144 : type == G_Q5_K ? 176 : 210; }

int tg_simd(void); /* ggml_dot.c: 2 AVX-512 VNNI, 1 AVX2, 0 portable */

/* every type with AVX-512 VNNI or AVX2 */
int tg_gemm_takes(int type) {
    return g_gemm && tg_simd() >= 1 && (k_quant(type) || type == G_Q4_0 || type == G_Q4_1 || type == G_Q5_0 || type == G_Q5_1 || type == G_Q8_0);
}

/* One super-block of a 16-row panel. */
typedef struct {
    int32_t codes[64][PANEL]; /* 4-value unit u (values 4u..4u+3) of each row: 4 code bytes */
    int32_t sc[16][PANEL];    /* Q4_K: the 8 block scales (rows 0..7 used); Q6_K: the 16 sub-block scales */
    int32_t mn[4][PANEL];     /* Q4_K: the mins of blocks 2k, 2k+1 as two int16 */
    int32_t start[PANEL];     /* Q6_K: -128 * sum over sub-blocks of scale * code sum; Q4_K: 0 */
    float d[PANEL], ndmin[PANEL];
} panel_t;

TGT2 static inline float h2f(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

/* one weight row's super-block b as 256 code bytes in value order, into the panel's lane c */
TGT2 static void unpack_row(int type, const uint8_t *q, panel_t *out, int c) {
    uint8_t v[QKK];
    if (with_mins(type)) { /* Q4_K, 144 bytes: d, dmin, scales[12], qs[128] (32 bytes: block 2j low nibbles, 2j+1 high);
                            * Q5_K, 176 bytes: qh[32] before qs, bit 2j (2j+1) of qh[i] the fifth bit of value i of block 2j (2j+1) */
        const __m256i m4 = _mm256_set1_epi8(15), one = _mm256_set1_epi8(1);
        const int five = type == G_Q5_K;
        const __m256i qh = five ? _mm256_loadu_si256((const __m256i *)(q + 16)) : _mm256_setzero_si256();
        for (int j = 0; j < 4; j++) {
            const __m256i raw = _mm256_loadu_si256((const __m256i *)(q + (five ? 48 : 16) + 32 * j));
            const __m256i h0 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * j), one), 4);
            const __m256i h1 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * j + 1), one), 4);
            _mm256_storeu_si256((__m256i *)(v + 64 * j), _mm256_or_si256(_mm256_and_si256(raw, m4), h0));
            _mm256_storeu_si256((__m256i *)(v + 64 * j + 32), _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(raw, 4), m4), h1));
        }
        for (int j = 0; j < 4; j++) {
            const int sc0 = q[4 + j] & 63, mn0 = q[8 + j] & 63;
            const int sc1 = (q[12 + j] & 15) | ((q[4 + j] >> 6) << 4), mn1 = (q[12 + j] >> 4) | ((q[8 + j] >> 6) << 4);
            out->sc[j][c] = sc0;
            out->sc[j + 4][c] = sc1;
            ((int16_t *)&out->mn[j / 2][c])[j & 1] = (int16_t)mn0;
            ((int16_t *)&out->mn[2 + j / 2][c])[j & 1] = (int16_t)mn1;
        }
        out->start[c] = 0;
        out->d[c] = h2f(q);
        out->ndmin[c] = -h2f(q + 2);
    } else { /* 210 bytes: ql[128], qh[64], scales[16] (int8), d; codes stored signed (value - 32) */
        const __m256i m4 = _mm256_set1_epi8(15), m3 = _mm256_set1_epi8(3), off = _mm256_set1_epi8(32);
        for (int j = 0; j < 2; j++) {
            const __m256i l0 = _mm256_loadu_si256((const __m256i *)(q + 64 * j));
            const __m256i l1 = _mm256_loadu_si256((const __m256i *)(q + 64 * j + 32));
            const __m256i hh = _mm256_loadu_si256((const __m256i *)(q + 128 + 32 * j));
            const __m256i lo[4] = {_mm256_and_si256(l0, m4), _mm256_and_si256(l1, m4), _mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                                   _mm256_and_si256(_mm256_srli_epi16(l1, 4), m4)};
            for (int s = 0; s < 4; s++) {
                const __m256i hi = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hh, 2 * s), m3), 4);
                _mm256_storeu_si256((__m256i *)(v + 128 * j + 32 * s), _mm256_sub_epi8(_mm256_or_si256(lo[s], hi), off));
            }
        }
        const int8_t *sc = (const int8_t *)(q + 192);
        int32_t start = 0;
        for (int k = 0; k < 16; k++) {
            int sum = 0;
            for (int i = 0; i < 16; i++) sum += (int8_t)v[16 * k + i];
            out->sc[k][c] = sc[k];
            start += sc[k] * sum;
        }
        out->start[c] = -128 * start;
        out->d[c] = h2f(q + 208);
        out->ndmin[c] = 0.0f;
    }
    for (int u = 0; u < 64; u++) memcpy(&out->codes[u][c], v + 4 * u, 4);
}

/* weight rows [c0, c0 + 16) of a K-quant part into the panel (past the part's end, its last row again); returns
 * how many are real */
TGT2 static int unpack_panel(const tg_gemm_part_t *pt, int64_t nsb, int64_t c0, panel_t *pan) {
    const int nc = pt->n - c0 < PANEL ? (int)(pt->n - c0) : PANEL;
    for (int c = 0; c < PANEL; c++) {
        const uint8_t *w = pt->w + (c0 + (c < nc ? c : nc - 1)) * pt->row_bytes;
        for (int64_t b = 0; b < nsb; b++) unpack_row((int)pt->type, w + b * kq_bytes((int)pt->type), pan + b, c);
    }
    return nc;
}

/* TILE activation rows x the panel's 16 rows over nsb super-blocks. Q4_K: x[i] the Q8_K rows, b8[i] their
 * 32-value block sums as int16 pairs; Q6_K: x[i] the codes + 128 (256 bytes a super-block), dx[i] the
 * Q8_K rows (for d). acc[i]: the 16 outputs of row i, carried in and out (super-blocks in order). */
TGT static inline __attribute__((always_inline)) void tile(const int type, const panel_t *pan, int64_t nsb,
                                                           const uint8_t *const x[TILE], const int32_t *const b8[TILE],
                                                           const uint8_t *const dx[TILE], __m512 acc[TILE]) {
    const int xstride = type == G_Q4_K ? Q8K_BYTES : QKK, xoff = type == G_Q4_K ? 4 : 0;
    for (int64_t b = 0; b < nsb; b++, pan++) {
        __m512i s[TILE];
        const __m512i start = _mm512_loadu_si512(pan->start);
        UNROLL for (int i = 0; i < TILE; i++) s[i] = start;
        for (int j = 0; j < 8; j++) { /* 32-value blocks; Q6_K's sub-blocks 2j (units 0..3) and 2j+1 (4..7) */
            __m512i a0[TILE], a1[TILE];
            UNROLL for (int i = 0; i < TILE; i++) a0[i] = a1[i] = _mm512_setzero_si512();
            UNROLL for (int u = 0; u < 4; u++) {
                const __m512i w0 = _mm512_loadu_si512(pan->codes[8 * j + u]), w1 = _mm512_loadu_si512(pan->codes[8 * j + 4 + u]);
                UNROLL for (int i = 0; i < TILE; i++) {
                    const uint8_t *p = x[i] + b * xstride + xoff + 32 * j + 4 * u;
                    int32_t x0, x1;
                    memcpy(&x0, p, 4);
                    memcpy(&x1, p + 16, 4);
                    if (type == G_Q4_K) { /* unsigned weight codes x signed activations */
                        a0[i] = _mm512_dpbusd_epi32(a0[i], w0, _mm512_set1_epi32(x0));
                        a1[i] = _mm512_dpbusd_epi32(a1[i], w1, _mm512_set1_epi32(x1));
                    } else { /* unsigned activations (x + 128) x signed weight codes */
                        a0[i] = _mm512_dpbusd_epi32(a0[i], _mm512_set1_epi32(x0), w0);
                        a1[i] = _mm512_dpbusd_epi32(a1[i], _mm512_set1_epi32(x1), w1);
                    }
                }
            }
            if (type == G_Q4_K) {
                const __m512i sc = _mm512_loadu_si512(pan->sc[j]);
                UNROLL for (int i = 0; i < TILE; i++) s[i] = _mm512_add_epi32(s[i], _mm512_mullo_epi32(_mm512_add_epi32(a0[i], a1[i]), sc));
            } else {
                const __m512i sc0 = _mm512_loadu_si512(pan->sc[2 * j]), sc1 = _mm512_loadu_si512(pan->sc[2 * j + 1]);
                UNROLL for (int i = 0; i < TILE; i++)
                    s[i] = _mm512_add_epi32(s[i], _mm512_add_epi32(_mm512_mullo_epi32(a0[i], sc0), _mm512_mullo_epi32(a1[i], sc1)));
            }
        }
        const __m512 d = _mm512_loadu_ps(pan->d);
        if (type == G_Q4_K) {
            const __m512 nd = _mm512_loadu_ps(pan->ndmin);
            const __m512i mn0 = _mm512_loadu_si512(pan->mn[0]), mn1 = _mm512_loadu_si512(pan->mn[1]);
            const __m512i mn2 = _mm512_loadu_si512(pan->mn[2]), mn3 = _mm512_loadu_si512(pan->mn[3]);
            UNROLL for (int i = 0; i < TILE; i++) {
                const int32_t *bp = b8[i] + 4 * b;
                __m512i m = _mm512_dpwssd_epi32(_mm512_setzero_si512(), mn0, _mm512_set1_epi32(bp[0]));
                m = _mm512_dpwssd_epi32(m, mn1, _mm512_set1_epi32(bp[1]));
                m = _mm512_dpwssd_epi32(m, mn2, _mm512_set1_epi32(bp[2]));
                m = _mm512_dpwssd_epi32(m, mn3, _mm512_set1_epi32(bp[3]));
                float dxs;
                memcpy(&dxs, x[i] + b * Q8K_BYTES, 4);
                const __m512 res = _mm512_fmadd_ps(nd, _mm512_cvtepi32_ps(m), _mm512_mul_ps(_mm512_cvtepi32_ps(s[i]), d));
                acc[i] = _mm512_fmadd_ps(res, _mm512_set1_ps(dxs), acc[i]);
            }
        } else {
            UNROLL for (int i = 0; i < TILE; i++) {
                float dxs;
                memcpy(&dxs, dx[i] + b * Q8K_BYTES, 4);
                acc[i] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(s[i]), d), _mm512_set1_ps(dxs), acc[i]);
            }
        }
    }
}

TGT static void tile_q4_k(const panel_t *pan, int64_t nsb, const uint8_t *const x[TILE], const int32_t *const b8[TILE],
                          const uint8_t *const dx[TILE], __m512 acc[TILE]) {
    tile(G_Q4_K, pan, nsb, x, b8, dx, acc);
}

TGT static void tile_q6_k(const panel_t *pan, int64_t nsb, const uint8_t *const x[TILE], const int32_t *const b8[TILE],
                          const uint8_t *const dx[TILE], __m512 acc[TILE]) {
    tile(G_Q6_K, pan, nsb, x, b8, dx, acc);
}

/* AVX2 (no VNNI): the same integers, an 8-row half of the panel per register. A 4-byte unit's products
 * come from maddubs as two int16 pair sums per lane; those add up in int16 as far as they cannot
 * overflow (Q4_K: a 32-value block, at most 8 x 2 x 15 x 128 = 30720; Q6_K: two units, at most
 * 2 x 2 x 255 x 32 = 32640), then madd with the scale in both int16 halves gives the scaled int32. */
#define TILE2 4 /* activation rows per AVX2 tile: 3 registers each (int16 sums, s, acc) */

TGT2 static inline __m256i scale_pairs(const int32_t *sc) { /* int32 scales -> the scale in both int16 halves */
    const __m256i v = _mm256_loadu_si256((const __m256i *)sc);
    return _mm256_or_si256(_mm256_and_si256(v, _mm256_set1_epi32(0xffff)), _mm256_slli_epi32(v, 16));
}

TGT2 static inline int32_t x4(const uint8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* TILE2 activation rows x rows h*8..h*8+7 of the panel over nsb super-blocks (tile's arguments) */
TGT2 static inline __attribute__((always_inline)) void tile2(const int type, const panel_t *pan, int h, int64_t nsb,
                                                             const uint8_t *const x[TILE2], const int32_t *const b8[TILE2],
                                                             const uint8_t *const dx[TILE2], __m256 acc[TILE2]) {
    const int xstride = with_mins(type) ? Q8K_BYTES : QKK, xoff = with_mins(type) ? 4 : 0;
    const int c = 8 * h;
    /* units summed in int16 before they widen: 8 for Q4_K (16 products of at most 15 x 127 each), 4 for Q5_K
     * (codes up to 31) */
    const int span = type == G_Q5_K ? 4 : 8;
    for (int64_t b = 0; b < nsb; b++, pan++) {
        __m256i s[TILE2];
        const __m256i start = _mm256_loadu_si256((const __m256i *)(pan->start + c));
        UNROLL for (int i = 0; i < TILE2; i++) s[i] = start;
        if (with_mins(type)) {
            for (int j = 0; j < 8; j++) { /* 32-value blocks: units 8j..8j+7 */
                const __m256i sc = scale_pairs(pan->sc[j] + c);
                UNROLL for (int u0 = 0; u0 < 8; u0 += span) {
                    __m256i a[TILE2];
                    UNROLL for (int i = 0; i < TILE2; i++) a[i] = _mm256_setzero_si256();
                    UNROLL for (int u = u0; u < u0 + span; u++) {
                        const __m256i w = _mm256_loadu_si256((const __m256i *)(pan->codes[8 * j + u] + c));
                        UNROLL for (int i = 0; i < TILE2; i++)
                            a[i] = _mm256_add_epi16(a[i], _mm256_maddubs_epi16(w, _mm256_set1_epi32(x4(x[i] + b * xstride + xoff + 32 * j + 4 * u))));
                    }
                    UNROLL for (int i = 0; i < TILE2; i++) s[i] = _mm256_add_epi32(s[i], _mm256_madd_epi16(a[i], sc));
                }
            }
        } else {
            for (int k = 0; k < 16; k++) { /* 16-value sub-blocks: units 4k..4k+3, two at a time */
                const __m256i sc = scale_pairs(pan->sc[k] + c);
                UNROLL for (int half = 0; half < 2; half++) {
                    const int u = 4 * k + 2 * half;
                    const __m256i w0 = _mm256_loadu_si256((const __m256i *)(pan->codes[u] + c));
                    const __m256i w1 = _mm256_loadu_si256((const __m256i *)(pan->codes[u + 1] + c));
                    UNROLL for (int i = 0; i < TILE2; i++) {
                        const uint8_t *p = x[i] + b * xstride + 4 * u;
                        const __m256i a = _mm256_add_epi16(_mm256_maddubs_epi16(_mm256_set1_epi32(x4(p)), w0),
                                                           _mm256_maddubs_epi16(_mm256_set1_epi32(x4(p + 4)), w1));
                        s[i] = _mm256_add_epi32(s[i], _mm256_madd_epi16(a, sc));
                    }
                }
            }
        }
        const __m256 d = _mm256_loadu_ps(pan->d + c);
        if (with_mins(type)) {
            const __m256 nd = _mm256_loadu_ps(pan->ndmin + c);
            const __m256i mn0 = _mm256_loadu_si256((const __m256i *)(pan->mn[0] + c)), mn1 = _mm256_loadu_si256((const __m256i *)(pan->mn[1] + c));
            const __m256i mn2 = _mm256_loadu_si256((const __m256i *)(pan->mn[2] + c)), mn3 = _mm256_loadu_si256((const __m256i *)(pan->mn[3] + c));
            UNROLL for (int i = 0; i < TILE2; i++) {
                const int32_t *bp = b8[i] + 4 * b;
                __m256i m = _mm256_add_epi32(_mm256_madd_epi16(mn0, _mm256_set1_epi32(bp[0])), _mm256_madd_epi16(mn1, _mm256_set1_epi32(bp[1])));
                m = _mm256_add_epi32(m, _mm256_add_epi32(_mm256_madd_epi16(mn2, _mm256_set1_epi32(bp[2])),
                                                         _mm256_madd_epi16(mn3, _mm256_set1_epi32(bp[3]))));
                float dxs;
                memcpy(&dxs, x[i] + b * Q8K_BYTES, 4);
                const __m256 res = _mm256_fmadd_ps(nd, _mm256_cvtepi32_ps(m), _mm256_mul_ps(_mm256_cvtepi32_ps(s[i]), d));
                acc[i] = _mm256_fmadd_ps(res, _mm256_set1_ps(dxs), acc[i]);
            }
        } else {
            UNROLL for (int i = 0; i < TILE2; i++) {
                float dxs;
                memcpy(&dxs, dx[i] + b * Q8K_BYTES, 4);
                acc[i] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(s[i]), d), _mm256_set1_ps(dxs), acc[i]);
            }
        }
    }
}

TGT2 static void tile2_q4_k(const panel_t *pan, int h, int64_t nsb, const uint8_t *const x[TILE2], const int32_t *const b8[TILE2],
                            const uint8_t *const dx[TILE2], __m256 acc[TILE2]) {
    tile2(G_Q4_K, pan, h, nsb, x, b8, dx, acc);
}

TGT2 static void tile2_q5_k(const panel_t *pan, int h, int64_t nsb, const uint8_t *const x[TILE2], const int32_t *const b8[TILE2],
                            const uint8_t *const dx[TILE2], __m256 acc[TILE2]) {
    tile2(G_Q5_K, pan, h, nsb, x, b8, dx, acc);
}

TGT2 static void tile2_q6_k(const panel_t *pan, int h, int64_t nsb, const uint8_t *const x[TILE2], const int32_t *const b8[TILE2],
                            const uint8_t *const dx[TILE2], __m256 acc[TILE2]) {
    tile2(G_Q6_K, pan, h, nsb, x, b8, dx, acc);
}

/* the activations in the layouts the tiles read: Q4_K's 32-value block sums (from Q8_K's 16-value sums) as
 * int16 pairs, Q6_K's codes + 128 */
static void prep_q4_k_sums(const uint8_t *xq, int64_t xq_stride, int64_t m, int64_t nsb, int32_t *out) {
    for (int64_t i = 0; i < m; i++)
        for (int64_t b = 0; b < nsb; b++) {
            int16_t bs[16], s8[8];
            memcpy(bs, xq + i * xq_stride + b * Q8K_BYTES + 4 + QKK, sizeof bs);
            for (int j = 0; j < 8; j++) s8[j] = (int16_t)(bs[2 * j] + bs[2 * j + 1]);
            memcpy(out + (i * nsb + b) * 4, s8, sizeof s8);
        }
}

static void prep_q6_k_codes(const uint8_t *xq, int64_t xq_stride, int64_t m, int64_t nsb, uint8_t *out) {
    for (int64_t i = 0; i < m; i++)
        for (int64_t b = 0; b < nsb; b++) {
            const uint8_t *q = xq + i * xq_stride + b * Q8K_BYTES + 4;
            uint8_t *o = out + (i * nsb + b) * QKK;
            for (int t = 0; t < QKK; t++) o[t] = q[t] ^ 0x80; /* int8 x -> x + 128 as uint8 */
        }
}

/* ---------------------------------------------------------------- Q4_1, Q5_0, Q8_0: vec_dot's order */

/* ggml's hsum_float_8 */
static inline float hsum8(const float *a) {
    float s0 = a[0] + a[4], s1 = a[1] + a[5], s2 = a[2] + a[6], s3 = a[3] + a[7];
    float t0 = s0 + s2, t1 = s1 + s3;
    return t0 + t1;
}

#define PAIRS 4 /* weight rows per 32-value panel: 4 registers of two rows */
#define TILE0 4 /* activation rows per register tile */

/* One 32-value block of an 8-row panel. */
typedef struct {
    uint8_t codes[PAIRS][64]; /* pair p: [row 2p's 32 codes | row 2p+1's], unsigned */
    float dw[PAIRS][16];      /* each row's d, 8 times */
    float mw[8];              /* Q4_1: each row's m */
    float pad[8];
} panel0_t;

/* the activations of one block: each lane's starting value (minus the codes' offset times its 4-value sum,
 * for both rows of a register), d, and Q4_1's s */
typedef struct {
    int32_t start[16];
    float d, s;
    float pad[14];
} act0_t;

/* Q4_1 and Q5_1: unsigned codes, d and m, against Q8_1 (after unpacking, one panel form and one tile) */
static int q8_1_form(int type) { return type == G_Q4_1 || type == G_Q5_1; }
static int block_bytes(int type) { return type == G_Q4_0 ? 18 : type == G_Q4_1 ? 20 : type == G_Q5_0 ? 22 : type == G_Q5_1 ? 24 : 34; }
static int act_bytes0(int type) { return q8_1_form(type) ? 36 : 34; }  /* Q8_1 or Q8_0 */
static int act_codes0(int type) { return q8_1_form(type) ? 4 : 2; }   /* where the 32 codes start */

/* a 32-value block's codes in value order: the low nibbles of qs[16], then the high ones, each with bit i of
 * the block's qh (Q5_0/Q5_1; qh NULL: none) as 16 */
static inline void nibble_codes(const uint8_t *qs, const uint8_t *qh, uint8_t v[32]) {
    uint32_t bits = 0;
    if (qh) memcpy(&bits, qh, 4);
    for (int i = 0; i < 32; i++) v[i] = (uint8_t)((i < 16 ? qs[i] & 15 : qs[i - 16] >> 4) | (((bits >> i) & 1) << 4));
}

/* signed8: Q8_0's codes as they are (the AVX2 tile's sign trick) instead of offset to unsigned (dpbusd's).
 * Blocks: Q4_0 d, qs; Q4_1 d, m, qs; Q5_0 d, qh, qs; Q5_1 d, m, qh, qs; Q8_0 d, 32 int8 */
TGT2 static void unpack_row0(int type, const uint8_t *q, panel0_t *out, int c, int signed8) {
    uint8_t *v = &out->codes[c >> 1][32 * (c & 1)];
    out->mw[c] = q8_1_form(type) ? h2f(q + 2) : 0.0f;
    if (type == G_Q4_0 || type == G_Q4_1) {
        nibble_codes(q + (type == G_Q4_1 ? 4 : 2), 0, v);
    } else if (type == G_Q5_0 || type == G_Q5_1) {
        const int qh = type == G_Q5_1 ? 4 : 2;
        nibble_codes(q + qh + 4, q + qh, v);
    } else {
        for (int i = 0; i < 32; i++) v[i] = signed8 ? q[2 + i] : q[2 + i] ^ 0x80; /* int8 w -> w + 128 */
    }
    const float d = h2f(q);
    for (int t = 0; t < 8; t++) out->dw[c >> 1][8 * (c & 1) + t] = d;
}

static void prep_act0(int type, const uint8_t *xq, int64_t xq_stride, int64_t m, int64_t nb, act0_t *out, int signed8) {
    const int off = q8_1_form(type) ? 0 : type == G_Q4_0 ? 8 : type == G_Q5_0 ? 16 : signed8 ? 0 : 128, ab = act_bytes0(type), co = act_codes0(type);
    for (int64_t i = 0; i < m; i++)
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *x = xq + i * xq_stride + b * ab;
            act0_t *o = out + i * nb + b;
            const int8_t *q = (const int8_t *)(x + co);
            for (int l = 0; l < 8; l++) {
                const int sum = q[4 * l] + q[4 * l + 1] + q[4 * l + 2] + q[4 * l + 3];
                o->start[l] = o->start[8 + l] = -off * sum;
            }
            uint16_t h;
            memcpy(&h, x, 2);
            o->d = tg_f16_to_f32(h);
            memcpy(&h, x + 2, 2);
            o->s = q8_1_form(type) ? tg_f16_to_f32(h) : 0.0f;
        }
}

TGT static inline __attribute__((always_inline)) void tile0(const int type, const panel0_t *pan, int64_t nb,
                                                            const uint8_t *const x[TILE0], const act0_t *const a[TILE0],
                                                            int xstride, float y[TILE0][8]) {
    __m512 acc[TILE0][PAIRS], sm[TILE0 / 2];
    UNROLL for (int i = 0; i < TILE0; i++) UNROLL for (int p = 0; p < PAIRS; p++) acc[i][p] = _mm512_setzero_ps();
    UNROLL for (int i = 0; i < TILE0 / 2; i++) sm[i] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++, pan++) {
        UNROLL for (int i = 0; i < TILE0; i++) {
            const __m512i xv = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(x[i] + b * xstride)));
            const __m512i st = type == G_Q4_1 ? _mm512_setzero_si512() : _mm512_loadu_si512(a[i][b].start);
            const __m512 dx = _mm512_set1_ps(a[i][b].d);
            UNROLL for (int p = 0; p < PAIRS; p++) {
                const __m512i lanes = _mm512_dpbusd_epi32(st, _mm512_loadu_si512(pan->codes[p]), xv);
                acc[i][p] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_loadu_ps(pan->dw[p]), dx), _mm512_cvtepi32_ps(lanes), acc[i][p]);
            }
        }
        if (type == G_Q4_1) { /* lanes: row pair i (0-7 the first activation row's 8 outputs, 8-15 the second's) */
            const __m512 mw = _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_castps_pd(_mm256_loadu_ps(pan->mw))));
            UNROLL for (int i = 0; i < TILE0 / 2; i++) {
                const __m512 sx = _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castps_pd(_mm512_set1_ps(a[2 * i][b].s)),
                                                                         _mm256_castps_pd(_mm256_set1_ps(a[2 * i + 1][b].s)), 1));
                sm[i] = _mm512_fmadd_ps(mw, sx, sm[i]);
            }
        }
    }
    UNROLL for (int i = 0; i < TILE0; i++) {
        float l[PAIRS][16], s[16];
        UNROLL for (int p = 0; p < PAIRS; p++) _mm512_storeu_ps(l[p], acc[i][p]);
        _mm512_storeu_ps(s, sm[i / 2]);
        for (int c = 0; c < 8; c++) {
            const float v = hsum8(&l[c >> 1][8 * (c & 1)]);
            y[i][c] = type == G_Q4_1 ? v + s[8 * (i & 1) + c] : v;
        }
    }
}

TGT static void tile0_q4_1(const panel0_t *pan, int64_t nb, const uint8_t *const x[TILE0], const act0_t *const a[TILE0], float y[TILE0][8]) {
    tile0(G_Q4_1, pan, nb, x, a, 36, y);
}
TGT static void tile0_q4_0(const panel0_t *pan, int64_t nb, const uint8_t *const x[TILE0], const act0_t *const a[TILE0], float y[TILE0][8]) {
    tile0(G_Q4_0, pan, nb, x, a, 34, y);
}
TGT static void tile0_q5_0(const panel0_t *pan, int64_t nb, const uint8_t *const x[TILE0], const act0_t *const a[TILE0], float y[TILE0][8]) {
    tile0(G_Q5_0, pan, nb, x, a, 34, y);
}
TGT static void tile0_q8_0(const panel0_t *pan, int64_t nb, const uint8_t *const x[TILE0], const act0_t *const a[TILE0], float y[TILE0][8]) {
    tile0(G_Q8_0, pan, nb, x, a, 34, y);
}

/* AVX2: a register holds one row's 32 codes; maddubs (unsigned x signed byte pairs into int16, which no pair
 * here can saturate: Q4_1's codes are at most 15, Q5_0's and Q5_1's 31, against |x| <= 127) then madd by ones give its
 * eight 4-value lanes, as ggml's AVX2 vec_dot. Q8_0's +128 offset could saturate, so its codes stay signed
 * and each product takes ggml's sign trick (|w| against x with w's sign). Rows 4h..4h+3 of the panel. */
#define TILE0_2 2 /* activation rows per AVX2 tile: 8 accumulators for 4 rows x 2 */

TGT2 static inline __attribute__((always_inline)) void tile0_2(const int type, const panel0_t *pan, int h, int64_t nb,
                                                              const uint8_t *const x[TILE0_2], const act0_t *const a[TILE0_2],
                                                              int xstride, float y[TILE0_2][4]) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[TILE0_2][4];
    __m128 sm[TILE0_2];
    UNROLL for (int i = 0; i < TILE0_2; i++) {
        UNROLL for (int r = 0; r < 4; r++) acc[i][r] = _mm256_setzero_ps();
        sm[i] = _mm_setzero_ps();
    }
    for (int64_t b = 0; b < nb; b++, pan++) {
        __m256i xv[TILE0_2], st[TILE0_2];
        __m256 dx[TILE0_2];
        UNROLL for (int i = 0; i < TILE0_2; i++) {
            xv[i] = _mm256_loadu_si256((const __m256i *)(x[i] + b * xstride));
            st[i] = _mm256_loadu_si256((const __m256i *)a[i][b].start);
            dx[i] = _mm256_set1_ps(a[i][b].d);
        }
        UNROLL for (int r = 0; r < 4; r++) {
            const int c = 4 * h + r;
            const __m256i w = _mm256_loadu_si256((const __m256i *)&pan->codes[c >> 1][32 * (c & 1)]);
            const __m256 dw = _mm256_loadu_ps(&pan->dw[c >> 1][8 * (c & 1)]);
            const __m256i aw = _mm256_sign_epi8(w, w);
            UNROLL for (int i = 0; i < TILE0_2; i++) {
                const __m256i lanes = type == G_Q8_0
                    ? _mm256_madd_epi16(_mm256_maddubs_epi16(aw, _mm256_sign_epi8(xv[i], w)), ones)
                    : _mm256_add_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(w, xv[i]), ones), st[i]);
                acc[i][r] = _mm256_fmadd_ps(_mm256_mul_ps(dw, dx[i]), _mm256_cvtepi32_ps(lanes), acc[i][r]);
            }
        }
        if (type == G_Q4_1) {
            const __m128 mw = _mm_loadu_ps(pan->mw + 4 * h);
            UNROLL for (int i = 0; i < TILE0_2; i++) sm[i] = _mm_fmadd_ps(mw, _mm_set1_ps(a[i][b].s), sm[i]);
        }
    }
    UNROLL for (int i = 0; i < TILE0_2; i++) {
        float s[4];
        _mm_storeu_ps(s, sm[i]);
        UNROLL for (int r = 0; r < 4; r++) {
            float l[8];
            _mm256_storeu_ps(l, acc[i][r]);
            y[i][r] = type == G_Q4_1 ? hsum8(l) + s[r] : hsum8(l);
        }
    }
}

TGT2 static void tile0_2_q4_1(const panel0_t *pan, int h, int64_t nb, const uint8_t *const x[TILE0_2], const act0_t *const a[TILE0_2],
                              float y[TILE0_2][4]) {
    tile0_2(G_Q4_1, pan, h, nb, x, a, 36, y);
}
TGT2 static void tile0_2_q4_0(const panel0_t *pan, int h, int64_t nb, const uint8_t *const x[TILE0_2], const act0_t *const a[TILE0_2],
                              float y[TILE0_2][4]) {
    tile0_2(G_Q4_0, pan, h, nb, x, a, 34, y);
}
TGT2 static void tile0_2_q5_0(const panel0_t *pan, int h, int64_t nb, const uint8_t *const x[TILE0_2], const act0_t *const a[TILE0_2],
                              float y[TILE0_2][4]) {
    tile0_2(G_Q5_0, pan, h, nb, x, a, 34, y);
}
TGT2 static void tile0_2_q8_0(const panel0_t *pan, int h, int64_t nb, const uint8_t *const x[TILE0_2], const act0_t *const a[TILE0_2],
                              float y[TILE0_2][4]) {
    tile0_2(G_Q8_0, pan, h, nb, x, a, 34, y);
}

/* activation rows [m0, m) against weight rows [c0, c0 + 8) of a Q4_0/Q4_1/Q5_0/Q8_0 part, with the AVX-512 tile or
 * (avx2) the AVX2 one over each 4-row half */
TGT2 static void run_panel0(const tg_gemm_part_t *pt, int64_t nb, int64_t c0, int64_t m0, int64_t m, const act0_t *act,
                            panel0_t *pan, float *y, int64_t y_stride, int avx2) {
    const int type = (int)pt->type, nc = pt->n - c0 < 8 ? (int)(pt->n - c0) : 8;
    for (int c = 0; c < 8; c++) {
        const uint8_t *w = pt->w + (c0 + (c < nc ? c : nc - 1)) * pt->row_bytes;
        for (int64_t b = 0; b < nb; b++) unpack_row0(type, w + b * block_bytes(type), pan + b, c, avx2);
    }
    const int tile = avx2 ? TILE0_2 : TILE0;
    for (int64_t i0 = m0; i0 < m; i0 += tile) {
        const uint8_t *x[TILE0];
        const act0_t *a[TILE0];
        for (int i = 0; i < tile; i++) {
            const int64_t row = i0 + i < m ? i0 + i : m - 1;
            x[i] = pt->xq + row * pt->xq_stride + act_codes0(type);
            a[i] = act + row * nb;
        }
        float out[TILE0][8];
        if (avx2) {
            for (int h = 0; h < 2 && 4 * h < nc; h++) {
                float half[TILE0_2][4];
                if (q8_1_form(type)) tile0_2_q4_1(pan, h, nb, x, a, half);
                else if (type == G_Q4_0) tile0_2_q4_0(pan, h, nb, x, a, half);
                else if (type == G_Q5_0) tile0_2_q5_0(pan, h, nb, x, a, half);
                else tile0_2_q8_0(pan, h, nb, x, a, half);
                for (int i = 0; i < TILE0_2; i++) memcpy(&out[i][4 * h], half[i], sizeof half[i]);
            }
        } else if (q8_1_form(type)) tile0_q4_1(pan, nb, x, a, out);
        else if (type == G_Q4_0) tile0_q4_0(pan, nb, x, a, out);
        else if (type == G_Q5_0) tile0_q5_0(pan, nb, x, a, out);
        else tile0_q8_0(pan, nb, x, a, out);
        for (int i = 0; i < tile && i0 + i < m; i++) memcpy(y + (i0 + i) * y_stride + pt->col + c0, out[i], sizeof(float) * (size_t)nc);
    }
}

/* super-blocks per pass over the activation rows: the panel's share (KC * 5.5 KB) stays in L1 while every
 * row runs past it; the 16 outputs of each row wait in `carry` between passes (the order is unchanged) */
#define KC 4

/* activation rows [m0, m) against weight rows [c0, c0 + 16) of one part (fewer at its end: the last repeated) */
TGT static void run_panel(const tg_gemm_part_t *pt, int64_t nsb, int64_t c0, int64_t m0, int64_t m, const int32_t *sums,
                          const uint8_t *codes, panel_t *pan, float *carry, float *y, int64_t y_stride) {
    const int nc = unpack_panel(pt, nsb, c0, pan);
    const __mmask16 keep = (__mmask16)((1u << nc) - 1);
    for (int64_t b0 = 0; b0 < nsb; b0 += KC) {
        const int64_t nb = nsb - b0 < KC ? nsb - b0 : KC;
        const int last = b0 + nb == nsb;
        for (int64_t i0 = m0; i0 < m; i0 += TILE) {
            const uint8_t *x[TILE], *dx[TILE];
            const int32_t *b8[TILE];
            __m512 acc[TILE];
            for (int i = 0; i < TILE; i++) {
                const int64_t row = i0 + i < m ? i0 + i : m - 1;
                dx[i] = pt->xq + row * pt->xq_stride + b0 * Q8K_BYTES;
                x[i] = with_mins((int)pt->type) ? dx[i] : codes + (row * nsb + b0) * QKK;
                b8[i] = sums ? sums + (row * nsb + b0) * 4 : 0;
                acc[i] = b0 ? _mm512_loadu_ps(carry + row * PANEL) : _mm512_setzero_ps();
            }
            if (with_mins((int)pt->type)) tile_q4_k(pan + b0, nb, x, b8, dx, acc);
            else tile_q6_k(pan + b0, nb, x, b8, dx, acc);
            for (int i = 0; i < TILE && i0 + i < m; i++) {
                if (last) _mm512_mask_storeu_ps(y + (i0 + i) * y_stride + pt->col + c0, keep, acc[i]);
                else _mm512_storeu_ps(carry + (i0 + i) * PANEL, acc[i]);
            }
        }
    }
}

/* run_panel with the AVX2 tiles: each 8-row half of the panel in turn */
TGT2 static void run_panel2(const tg_gemm_part_t *pt, int64_t nsb, int64_t c0, int64_t m0, int64_t m, const int32_t *sums,
                            const uint8_t *codes, panel_t *pan, float *carry, float *y, int64_t y_stride) {
    const int nc = unpack_panel(pt, nsb, c0, pan);
    for (int h = 0; h < 2 && 8 * h < nc; h++) {
        const int keep = nc - 8 * h < 8 ? nc - 8 * h : 8;
        for (int64_t b0 = 0; b0 < nsb; b0 += KC) {
            const int64_t nb = nsb - b0 < KC ? nsb - b0 : KC;
            const int last = b0 + nb == nsb;
            for (int64_t i0 = m0; i0 < m; i0 += TILE2) {
                const uint8_t *x[TILE2], *dx[TILE2];
                const int32_t *b8[TILE2];
                __m256 acc[TILE2];
                for (int i = 0; i < TILE2; i++) {
                    const int64_t row = i0 + i < m ? i0 + i : m - 1;
                    dx[i] = pt->xq + row * pt->xq_stride + b0 * Q8K_BYTES;
                    x[i] = with_mins((int)pt->type) ? dx[i] : codes + (row * nsb + b0) * QKK;
                    b8[i] = sums ? sums + (row * nsb + b0) * 4 : 0;
                    acc[i] = b0 ? _mm256_loadu_ps(carry + row * PANEL + 8 * h) : _mm256_setzero_ps();
                }
                if (pt->type == G_Q5_K) tile2_q5_k(pan + b0, h, nb, x, b8, dx, acc);
                else if (pt->type == G_Q4_K) tile2_q4_k(pan + b0, h, nb, x, b8, dx, acc);
                else tile2_q6_k(pan + b0, h, nb, x, b8, dx, acc);
                for (int i = 0; i < TILE2 && i0 + i < m; i++) {
                    if (last) {
                        float out[8];
                        _mm256_storeu_ps(out, acc[i]);
                        memcpy(y + (i0 + i) * y_stride + pt->col + c0 + 8 * h, out, sizeof(float) * (size_t)keep);
                    } else {
                        _mm256_storeu_ps(carry + (i0 + i) * PANEL + 8 * h, acc[i]);
                    }
                }
            }
        }
    }
}

int tg_gemm_run(const tg_gemm_part_t *parts, int nparts, int64_t k, int64_t m, float *y, int64_t y_stride, int nthreads) {
    if (nparts < 1 || nparts > TG_MAX_PARTS) return -1;
    const int64_t nsb = k / QKK, nb = k / QK;
    const int avx512 = tg_simd() == 2;
    void *prep[TG_MAX_PARTS] = {0}; /* the activations in the layout each part's tiles read */
    int owner[TG_MAX_PARTS];       /* parts that share activations and a layout share the buffer */
    int64_t panels[TG_MAX_PARTS + 1];
    panels[0] = 0;
    size_t pan_bytes = 64;
    int failed = 0;
    for (int i = 0; i < nparts; i++) {
        const int type = (int)parts[i].type;
        if (!tg_gemm_takes(type) || k % (k_quant(type) ? QKK : QK)) return -1;
        panels[i + 1] = panels[i] + (k_quant(type) ? (parts[i].n + PANEL - 1) / PANEL : (parts[i].n + 7) / 8);
        const size_t pb = k_quant(type) ? sizeof(panel_t) * (size_t)nsb : sizeof(panel0_t) * (size_t)nb;
        pan_bytes = pb > pan_bytes ? pb : pan_bytes;
        owner[i] = i;
        for (int e = 0; e < i; e++)
            if (owner[i] == i && parts[e].xq == parts[i].xq && parts[e].type == parts[i].type) owner[i] = e;
    }
    for (int i = 0; i < nparts && !failed; i++) {
        if (owner[i] != i) continue;
        const int type = (int)parts[i].type;
        const tg_gemm_part_t *pt = &parts[i];
        if (with_mins(type)) {
            if (!(prep[i] = malloc((size_t)(m * nsb * 4) * sizeof(int32_t)))) failed = 1;
            else prep_q4_k_sums(pt->xq, pt->xq_stride, m, nsb, prep[i]);
        } else if (type == G_Q6_K) {
            if (!(prep[i] = malloc((size_t)(m * nsb * QKK)))) failed = 1;
            else prep_q6_k_codes(pt->xq, pt->xq_stride, m, nsb, prep[i]);
        } else {
            if (!(prep[i] = aligned_alloc(64, sizeof(act0_t) * (size_t)(m * nb)))) failed = 1;
            else prep_act0(type, pt->xq, pt->xq_stride, m, nb, prep[i], !avx512);
        }
    }
    /* One pass of all rows per panel: passes of ~100 rows (their Q8_K bytes in L2, each panel unpacked again
     * per pass) measured slower for qwen2.5's 8960-wide products (docs/performance.md, session 14). */
    if (!failed) {
        const int64_t m0 = 0, m1 = m;
#ifdef _OPENMP
#pragma omp parallel num_threads(nthreads > 0 ? nthreads : 1)
#endif
        {
            void *pan = aligned_alloc(64, (pan_bytes + 63) / 64 * 64);
            float *carry = nsb > KC ? aligned_alloc(64, sizeof(float) * PANEL * (size_t)m) : 0;
            if (!pan || (nsb > KC && !carry)) {
#ifdef _OPENMP
#pragma omp atomic write
#endif
                failed = 1;
            }
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
            for (int64_t g = 0; g < panels[nparts]; g++) {
                if (!pan || (nsb > KC && !carry)) continue;
                int i = 0;
                while (g >= panels[i + 1]) i++;
                const tg_gemm_part_t *pt = &parts[i];
                const void *pp = prep[owner[i]];
                if (k_quant((int)pt->type))
                    (avx512 ? run_panel : run_panel2)(pt, nsb, PANEL * (g - panels[i]), m0, m1, with_mins((int)pt->type) ? pp : 0,
                                                      pt->type == G_Q6_K ? pp : 0, pan, carry, y, y_stride);
                else
                    run_panel0(pt, nb, 8 * (g - panels[i]), m0, m1, pp, pan, y, y_stride, !avx512);
            }
            free(pan);
            free(carry);
        }
    }
    for (int i = 0; i < nparts; i++) free(prep[i]);
    return failed ? -2 : 0;
}
#else
int tg_gemm_takes(int type) { (void)type; return 0; }
int tg_gemm_run(const tg_gemm_part_t *parts, int nparts, int64_t k, int64_t m, float *y, int64_t y_stride, int nthreads) {
    (void)parts; (void)nparts; (void)k; (void)m; (void)y; (void)y_stride; (void)nthreads;
    return -1;
}
#endif
