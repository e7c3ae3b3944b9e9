/*
 * norms.cu: the CUDA kernels of the row norms: gdp_l2norm (y = x / sqrt(sum x^2 + 1e-6)),
 * gdp_gated_rmsnorm (grouped, x = y * silu(z), gdp-layer.md 1.5) and gdp_rmsnorm.
 *
 * Work split: one warp per normalized vector (a row for the L2 norm and the RMSNorm, a
 * (row, group) pair for the gated norm): lanes stride over its elements, a butterfly of
 * shuffles sums the squares (fixed order: the same bits every run), and a second pass
 * re-reads the inputs (cached) and writes the outputs, so in-place calls are safe.
 * Math in fp32, following PyTorch eager's operation order (mamba_ssm's rms_norm_ref):
 * silu(z) = z / (1 + exp(-z)); rstd = 1 / sqrt(sum * (1/n) + eps); out = (x * rstd) * w.
 */
#include <math.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "dtype_access.cuh"
#include "gdp_kernels.h"
#include "src/internal.h"

// CUDA kernels

namespace {

constexpr int NORM_THREADS = 128;
constexpr int NORM_WARPS = NORM_THREADS / 32;


__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1)
        x += __shfl_xor_sync(0xffffffffu, x, off);
    return x;
}

struct NormParams {
    const void *x;      /* [vectors, n] contiguous (y of the gated norm) */
    const void *z;      /* gate, like x, or NULL */
    const void *weight; /* [d] or NULL (L2 norm) */
    void *out;
    gdp_dtype_t x_dtype, z_dtype, w_dtype, out_dtype;
    int64_t vectors;     /* rows * groups */
    int64_t n;           /* elements per vector */
    int64_t groups;      /* vectors per row (weight index = group * n + i) */
    float inv_n, eps;
};

/* The normalized input element: x, or y * silu(z) for the gated norm. */
template <bool GATED> __device__ __forceinline__ float norm_input(const NormParams &p, int64_t i) {
    const float x = load_as_float(p.x, p.x_dtype, i);
    if constexpr (GATED) {
        const float z = load_as_float(p.z, p.z_dtype, i);
        return __fmul_rn(x, __fdiv_rn(z, __fadd_rn(1.0f, expf(-z))));
    } else {
        return x;
    }
}

/* One warp per vector. L2 (the L2 norm): out = x * (1 / sqrt(sum x^2 + eps)); otherwise
 * the RMSNorm: out = (x * (1 / sqrt(sum x^2 * (1/n) + eps))) * weight. */
template <bool L2, bool GATED> __global__ void __launch_bounds__(NORM_THREADS) norm_kernel(const NormParams p) {
    const int lane = threadIdx.x & 31;
    const int64_t vec = (int64_t)blockIdx.x * NORM_WARPS + (threadIdx.x >> 5);
    if (vec >= p.vectors)
        return;
    const int64_t base = vec * p.n;
    float ss = 0.0f;
    for (int64_t i = lane; i < p.n; i += 32) {
        const float x = norm_input<GATED>(p, base + i);
        ss = fmaf(x, x, ss);
    }
    ss = warp_sum(ss);
    const float rstd = L2 ? __fdiv_rn(1.0f, sqrtf(__fadd_rn(ss, p.eps)))
                          : __fdiv_rn(1.0f, sqrtf(__fadd_rn(__fmul_rn(ss, p.inv_n), p.eps)));
    const int64_t w_base = (vec % p.groups) * p.n;
    for (int64_t i = lane; i < p.n; i += 32) {
        const float x = norm_input<GATED>(p, base + i);
        float out = __fmul_rn(x, rstd);
        if (!L2)
            out = __fmul_rn(out, load_as_float(p.weight, p.w_dtype, w_base + i));
        store_from_float(p.out, p.out_dtype, base + i, out);
    }
}

template <bool L2, bool GATED> cudaError_t launch_norm(const NormParams &p, cudaStream_t stream) {
    const int64_t blocks = (p.vectors + NORM_WARPS - 1) / NORM_WARPS;
    if (blocks > INT32_MAX)
        return cudaErrorInvalidConfiguration;
    if (blocks > 0)
        norm_kernel<L2, GATED><<<(unsigned)blocks, NORM_THREADS, 0, stream>>>(p);
    return cudaGetLastError();
}

gdp_status_t finish_launch(const char *op, cudaError_t err, const NormParams &p) {
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        GDP_FAIL(GDP_STATUS_CUDA_ERROR, "%s: kernel launch failed: %s (%lld vectors of %lld)", op,
                 cudaGetErrorString(err), (long long)p.vectors, (long long)p.n);
    }
    return GDP_STATUS_SUCCESS;
}

/* Elements of the last dim, and how many rows the leading dims hold. */
void row_shape(const gdp_tensor *t, int64_t *rows, int64_t *d) {
    *d = t->ndim > 0 ? t->shape[t->ndim - 1] : 1;
    const int64_t numel = gdp_tensor_numel(t);
    *rows = *d > 0 ? numel / *d : 0;
}

} // namespace

// kernel launchers

extern "C" gdp_status_t gdp_cuda_l2norm(struct gdp_ctx *ctx, gdp_tensor *y, const gdp_tensor *x) {
    NormParams p = {};
    int64_t rows, d;
    row_shape(x, &rows, &d);
    p.x = x->data;
    p.x_dtype = x->dtype;
    p.out = y->data;
    p.out_dtype = y->dtype;
    p.vectors = d > 0 ? rows : 0;
    p.n = d;
    p.groups = 1;
    p.eps = (float)GDP_L2NORM_EPS;
    return finish_launch("gdp_l2norm", launch_norm<true, false>(p, static_cast<cudaStream_t>(ctx->stream)), p);
}

extern "C" gdp_status_t gdp_cuda_gated_rmsnorm(struct gdp_ctx *ctx, gdp_tensor *out, const gdp_tensor *y,
                                               const gdp_tensor *z, const gdp_tensor *weight, int64_t group_size,
                                               double eps) {
    static const char *op = "gdp_gated_rmsnorm";
    int64_t rows, d;
    row_shape(y, &rows, &d);
    if (group_size <= 0 || d % group_size != 0)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: group_size %lld does not divide the last dim %lld", op,
                 (long long)group_size, (long long)d);
    NormParams p = {};
    p.x = y->data;
    p.x_dtype = y->dtype;
    p.z = z->data;
    p.z_dtype = z->dtype;
    p.weight = weight->data;
    p.w_dtype = weight->dtype;
    p.out = out->data;
    p.out_dtype = out->dtype;
    p.groups = d / group_size;
    p.vectors = rows * p.groups;
    p.n = group_size;
    /* torch's mean multiplies the sum by float(outputs) / numel, i.e. 1/n rounded once. */
    p.inv_n = 1.0f / (float)group_size;
    p.eps = (float)eps;
    return finish_launch(op, launch_norm<false, true>(p, static_cast<cudaStream_t>(ctx->stream)), p);
}

extern "C" gdp_status_t gdp_cuda_rmsnorm(struct gdp_ctx *ctx, gdp_tensor *out, const gdp_tensor *x,
                                         const gdp_tensor *weight, double eps) {
    int64_t rows, d;
    row_shape(x, &rows, &d);
    NormParams p = {};
    p.x = x->data;
    p.x_dtype = x->dtype;
    p.weight = weight->data;
    p.w_dtype = weight->dtype;
    p.out = out->data;
    p.out_dtype = out->dtype;
    p.vectors = d > 0 ? rows : 0;
    p.n = d;
    p.groups = 1;
    p.inv_n = d > 0 ? 1.0f / (float)d : 0.0f;
    p.eps = (float)eps;
    return finish_launch("gdp_rmsnorm", launch_norm<false, false>(p, static_cast<cudaStream_t>(ctx->stream)), p);
}
