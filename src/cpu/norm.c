/*
 * norm.c: CPU reference of gdp_gated_rmsnorm and gdp_rmsnorm in double. Each row is
 * read into doubles before anything is written, so out may alias its input when the
 * dtypes are equal.
 */
#include <math.h>

#include "cpu/cpu_ops.h"

/* Normalizes x[0..n) in place by its root mean square and scales by w[0..n). */
static void rms_scale(double *x, const double *w, int64_t n, double eps) {
    double ss = 0;
    for (int64_t i = 0; i < n; i++)
        ss += x[i] * x[i];
    const double inv = 1.0 / sqrt(ss / (double)n + eps);
    for (int64_t i = 0; i < n; i++)
        x[i] = x[i] * inv * w[i];
}

gdp_status_t gdp_cpu_gated_rmsnorm(gdp_tensor *out, const gdp_tensor *y, const gdp_tensor *z,
                                   const gdp_tensor *weight, int64_t group_size, double eps) {
    const int64_t d = y->shape[y->ndim - 1], rows = d ? gdp_tensor_numel(y) / d : 0;
    double *buf = gdp_calloc(3 * (size_t)d, sizeof(double), "a gated RMSNorm row");
    if (buf == NULL)
        return GDP_STATUS_SYSTEM_ERROR;
    double *x = buf, *gate = buf + d, *w = buf + 2 * d;
    gdp_tensor_read_f64(weight, 0, d, w);
    for (int64_t r = 0; r < rows; r++) {
        gdp_tensor_read_f64(y, r * d, d, x);
        gdp_tensor_read_f64(z, r * d, d, gate);
        for (int64_t i = 0; i < d; i++)
            x[i] = x[i] * (gate[i] / (1.0 + exp(-gate[i]))); /* y * silu(z) */
        for (int64_t g0 = 0; g0 < d; g0 += group_size)
            rms_scale(x + g0, w + g0, group_size, eps);
        gdp_tensor_write_f64(out, r * d, d, x);
    }
    free(buf);
    return GDP_STATUS_SUCCESS;
}

gdp_status_t gdp_cpu_rmsnorm(gdp_tensor *out, const gdp_tensor *x, const gdp_tensor *weight, double eps) {
    const int64_t d = x->shape[x->ndim - 1], rows = d ? gdp_tensor_numel(x) / d : 0;
    double *buf = gdp_calloc(2 * (size_t)d, sizeof(double), "an RMSNorm row");
    if (buf == NULL)
        return GDP_STATUS_SYSTEM_ERROR;
    double *row = buf, *w = buf + d;
    gdp_tensor_read_f64(weight, 0, d, w);
    for (int64_t r = 0; r < rows; r++) {
        gdp_tensor_read_f64(x, r * d, d, row);
        rms_scale(row, w, d, eps);
        gdp_tensor_write_f64(out, r * d, d, row);
    }
    free(buf);
    return GDP_STATUS_SUCCESS;
}
