/* What ggml_dot.c and decode_attention.c export to the rest of the library (decode_layer.c): the
 * product plan and the calls that run it, the fp16 converters, the decode attention. Python reaches
 * the same functions through ctypes (ggml_dot.py, c_attention.py), whose _Plan mirrors tg_plan_t. */
#ifndef TALLOW_GGML_DOT_H
#define TALLOW_GGML_DOT_H
#include <stdint.h>

/* Up to TG_MAX_PARTS weights sharing the input x (Q/K/V, gate/up): x is quantized once per activation
 * type the parts need, and one parallel region splits all their rows by bytes; y (m, sum n) holds the
 * parts' outputs side by side. Built once per layer by the caller (ggml_dot.py) and passed by address. */
#define TG_MAX_PARTS 8
typedef struct {
    int32_t nparts;
    int32_t row_invariant; /* 1: every row in vec_dot's order; 0: llama.cpp's choice (tiled from 8 rows) */
    int64_t k;
    int64_t types[TG_MAX_PARTS];
    const uint8_t *w[TG_MAX_PARTS];
    int64_t row_bytes[TG_MAX_PARTS];
    int64_t n[TG_MAX_PARTS];
} tg_plan_t;

int64_t tg_plan_scratch(const tg_plan_t *p, int64_t m);
int tg_linear_multi(const tg_plan_t *p, const float *x, int64_t m, uint8_t *scratch, float *y, int nthreads);

/* ggml_gemm.c: the prefill product over a register tile of activation rows x weight rows, each output in the
 * row kernel's (vec_dot's) order. One part: a weight (type, rows) and its quantized activations (m rows of
 * xq_stride bytes); y[i * y_stride + col + r]. tg_gemm_takes: whether it runs a type (and is switched on). */
typedef struct {
    int64_t type;
    const uint8_t *w;
    int64_t row_bytes, n;
    const uint8_t *xq;
    int64_t xq_stride, col;
} tg_gemm_part_t;
int tg_gemm_takes(int type);
int tg_gemm_run(const tg_gemm_part_t *parts, int nparts, int64_t k, int64_t m, float *y, int64_t y_stride, int nthreads);
float tg_f16_to_f32(uint16_t h);
uint16_t tg_f32_to_f16(float f); /* round to nearest even, as vcvtps2ph */
int ta_attend_f16(const float *q, int n_heads, int n_kv, int dk, int dv, const uint16_t *k, const uint16_t *v,
                  int64_t skh, int64_t skt, int64_t svh, int64_t svt, int64_t begin, int64_t end, int64_t ring,
                  float scale, float softcap, float *out, int nthreads);
#endif
