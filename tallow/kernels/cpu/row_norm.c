/* RMSNorm of fp32 rows in ggml's arithmetic (ggml_compute_forward_rms_norm_f32, then ggml_mul by the
 * weight): each square rounded to float and summed in double in index order, the mean rounded to
 * float, scale = 1/sqrtf(mean + eps) in float (sqrtss: correctly rounded), y = (x * scale) * w.
 * One C call for what torch runs as ~6 ops (~18 us a decode row on the 2-core machine); the
 * same bits for a row whatever the number of rows (rows split over threads, never a row).
 * Built with -ffp-contract=off: no fused multiply-add may merge the two products.
 *
 * w: NULL (weightless), or w_rows rows of n: row r of x uses weight row r % w_rows (a per-head
 * weight broadcast over tokens). add: NULL, or rows of n added after the weight (x_out = add + y,
 * the residual stream joining a normed branch); then mul: NULL or one float the sum is scaled by.
 */
#include <math.h>
#include <stdint.h>
#ifdef _OPENMP
#include <omp.h>
#endif

static void rn_row(const float *x, int64_t n, const float *w, float eps, const float *add, const float *mul, float *y) {
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) {
        float sq = x[i] * x[i];
        sum += (double)sq;
    }
    const float mean = (float)(sum / (double)n);
    const float scale = 1.0f / sqrtf(mean + eps);
    for (int64_t i = 0; i < n; i++) {
        float v = x[i] * scale;
        if (w) v = v * w[i];
        if (add) {
            v = add[i] + v;
            if (mul) v = v * mul[0];
        }
        y[i] = v;
    }
}

/* Row r of x starts at (r / inner) * s_outer + (r % inner) * s_inner (a (rows / inner, inner, n) view
 * with a contiguous last dim: heads sliced out of a projection); add and y: rows of n, contiguous.
 * Rows split over nthreads when there are many. */
void rn_rms_norm(const float *x, int64_t rows, int64_t n, int64_t inner, int64_t s_outer, int64_t s_inner,
                 const float *w, int64_t w_rows, float eps, const float *add, const float *mul, float *y,
                 int nthreads) {
    if (nthreads < 1 || rows < 64) nthreads = 1;
#pragma omp parallel for num_threads(nthreads) schedule(static) if (nthreads > 1)
    for (int64_t r = 0; r < rows; r++) {
        const float *wr = w ? w + (w_rows > 1 ? (r % w_rows) * n : 0) : 0;
        const float *xr = x + (r / inner) * s_outer + (r % inner) * s_inner;
        rn_row(xr, n, wr, eps, add ? add + r * n : 0, mul, y + r * n);
    }
}
