/*
 * ops_norm.c: front-ends of the norms of the GDP layer: gdp_gated_rmsnorm (the grouped
 * gated RMSNorm after the recurrence, gdp-layer.md 1.5) and gdp_rmsnorm (plain RMSNorm
 * over the last dim). They check shapes, dtypes, group_size and eps on all backends,
 * then dispatch to the CPU reference (src/cpu/norm.c) or the CUDA launchers.
 */
#include <math.h>

#include "cpu/cpu_ops.h"
#include "decode_core.h"
#include "internal.h"

#ifdef GDP_HAVE_CUDA
#include "kernels/gdp_kernels.h"
#endif

/* `t` is a contiguous float tensor of exactly `ref`'s shape (ndim >= 1). */
static gdp_status_t check_like(const char *op, const char *name, const gdp_tensor *t, const gdp_tensor *ref) {
    return gdp_check_dense(op, name, t, ref->ndim, ref->shape, GDP_DT_FLOAT);
}

/* The normalized dim d (x's last extent) is >= 1, weight is [d], eps finite >= 0. */
static gdp_status_t check_norm_params(const char *op, const char *name, const gdp_tensor *x, const gdp_tensor *weight,
                                      double eps) {
    const int64_t d = x->shape[x->ndim - 1];
    if (d < 1)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: %s has last extent %lld; the normalized dim must be >= 1", op,
                 name, (long long)d);
    const int64_t w_shape[1] = {d};
    GDP_CHECK(gdp_check_dense(op, "weight", weight, 1, w_shape, GDP_DT_FLOAT));
    if (!(eps >= 0) || !isfinite(eps))
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: eps is %g; pass a finite eps >= 0 (the layer uses 1e-5)", op,
                 eps);
    return GDP_STATUS_SUCCESS;
}

/* The input (named `name`) is [..., d] with d >= 1, contiguous; weight is [d]. */
static gdp_status_t check_rows(const char *op, const char *name, const gdp_tensor *x, const gdp_tensor *weight,
                               double eps) {
    if (!gdp_tensor_present(x))
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: %s is missing (NULL data); pass a tensor", op, name);
    if (x->ndim < 1 || x->ndim > GDP_MAX_DIMS)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: %s has %d dims; it needs [..., d] with 1 to %d dims", op, name,
                 x->ndim, GDP_MAX_DIMS);
    GDP_CHECK(check_like(op, name, x, x)); /* dtype, non-negative extents, contiguity */
    return check_norm_params(op, name, x, weight, eps);
}

/* y or z of the gated norm: contiguous, or a 2-D row view [rows, d] whose rows do not
 * overlap (row stride >= d, last dim contiguous). */
static gdp_status_t check_gated_input(const char *op, const char *name, const gdp_tensor *t, const gdp_tensor *like) {
    if (!gdp_tensor_present(t))
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: %s is missing (NULL data); pass a tensor", op, name);
    if (gdp_tensor_is_contiguous(t))
        return check_like(op, name, t, like);
    if (t->ndim != 2)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                 "%s: %s is a strided view with %d dims; only a 2-D [rows, d] row view may be strided, pass a "
                 "contiguous tensor otherwise", op, name, t->ndim);
    GDP_CHECK(gdp_check_tensor(op, name, t, like->ndim, like->shape, GDP_DT_FLOAT));
    GDP_CHECK(gdp_check_row_view(op, name, t));
    if (t->shape[0] > 1 && gdp_tensor_stride(t, 0) < t->shape[1])
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: %s has row stride %lld < its %lld columns (rows overlap); pass "
                 "a row stride >= d", op, name, (long long)gdp_tensor_stride(t, 0), (long long)t->shape[1]);
    return GDP_STATUS_SUCCESS;
}

/* Every rule of gdp_gated_rmsnorm, without running it (also for the fused decode end,
 * decode_core.h). */
gdp_status_t gdp_gated_rmsnorm_check(gdp_ctx_t ctx, const gdp_tensor *out, const gdp_tensor *y, const gdp_tensor *z,
                                     const gdp_tensor *weight, int64_t group_size, double eps) {
    static const char *op = "gdp_gated_rmsnorm";
    GDP_CHECK(gdp_ctx_check(ctx, op));
    if (!gdp_tensor_present(y))
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: y is missing (NULL data); pass a tensor", op);
    if (gdp_tensor_is_contiguous(y)) {
        GDP_CHECK(check_rows(op, "y", y, weight, eps));
    } else { /* a row view: the same rules on its shape, weight and eps */
        GDP_CHECK(check_gated_input(op, "y", y, y));
        GDP_CHECK(check_norm_params(op, "y", y, weight, eps));
    }
    GDP_CHECK(check_gated_input(op, "z", z, y));
    GDP_CHECK(check_like(op, "out", out, y));
    const int64_t d = y->shape[y->ndim - 1];
    if (group_size < 1 || d % group_size != 0)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                 "%s: group_size %lld must be >= 1 and divide the %lld channels of y (the layer uses "
                 "H*P/G = (H/G)*P)",
                 op, (long long)group_size, (long long)d);
    /* Exactly in place (out == y or out == z) is allowed: both backends read a row's y and z
     * elements before they write them. */
    const gdp_op_buffer bufs[] = {{"y", y, GDP_BUF_IN, true},
                                  {"z", z, GDP_BUF_IN, true},
                                  {"weight", weight, GDP_BUF_IN, false},
                                  {"out", out, GDP_BUF_OUT, false}};
    GDP_CHECK(gdp_check_aliasing(op, bufs, 4));
    for (int i = 0; i < 3; i++)
        GDP_CHECK(gdp_debug_check_values(ctx, op, bufs[i].name, bufs[i].t, false));
    return GDP_STATUS_SUCCESS;
}

gdp_status_t gdp_gated_rmsnorm(gdp_ctx_t ctx, gdp_tensor *out, const gdp_tensor *y, const gdp_tensor *z,
                               const gdp_tensor *weight, int64_t group_size, double eps) {
    GDP_CHECK(gdp_gated_rmsnorm_check(ctx, out, y, z, weight, group_size, eps));
    if (ctx->backend == GDP_BACKEND_CUDA) {
        GDP_CUDA_OP("gdp_gated_rmsnorm", gdp_cuda_gated_rmsnorm(ctx, out, y, z, weight, group_size, eps));
    }
    return gdp_cpu_gated_rmsnorm(out, y, z, weight, group_size, eps);
}

/* Every rule of gdp_rmsnorm, without running it (also for the fused norm-GEMM, decode_core.h). */
gdp_status_t gdp_rmsnorm_check(gdp_ctx_t ctx, const gdp_tensor *out, const gdp_tensor *x, const gdp_tensor *weight,
                               double eps) {
    static const char *op = "gdp_rmsnorm";
    GDP_CHECK(gdp_ctx_check(ctx, op));
    GDP_CHECK(check_rows(op, "x", x, weight, eps));
    GDP_CHECK(check_like(op, "out", out, x));
    const gdp_op_buffer bufs[] = {
        {"x", x, GDP_BUF_IN, true}, {"weight", weight, GDP_BUF_IN, false}, {"out", out, GDP_BUF_OUT, false}};
    GDP_CHECK(gdp_check_aliasing(op, bufs, 3));
    for (int i = 0; i < 2; i++)
        GDP_CHECK(gdp_debug_check_values(ctx, op, bufs[i].name, bufs[i].t, false));
    return GDP_STATUS_SUCCESS;
}

gdp_status_t gdp_rmsnorm(gdp_ctx_t ctx, gdp_tensor *out, const gdp_tensor *x, const gdp_tensor *weight,
                         double eps) {
    GDP_CHECK(gdp_rmsnorm_check(ctx, out, x, weight, eps));
    if (ctx->backend == GDP_BACKEND_CUDA) {
        GDP_CUDA_OP("gdp_rmsnorm", gdp_cuda_rmsnorm(ctx, out, x, weight, eps));
    }
    return gdp_cpu_rmsnorm(out, x, weight, eps);
}
