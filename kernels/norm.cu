/*
 * norm.cu: the CUDA kernels of the row norms: gdp_l2norm (y = x / sqrt(sum x^2 + 1e-6)),
 * gdp_gated_rmsnorm (grouped, x = y * silu(z), gdp-layer.md 1.5) and gdp_rmsnorm.
 *
 * Work split. The fast path (every vector a multiple of 8 elements, at most 16384, all
 * pointers 16-byte aligned: what the layer and the model pass) moves 8 elements per 16-byte
 * load (two for fp32) and keeps the vector in registers between the sum and the output:
 * one warp per vector up to 1024 elements (4 vectors per block), one 256-thread block per
 * vector above (the 8 warps' sums added in warp order through shared memory). All loads
 * of a thread are issued before the first use, so a step of few rows costs about one
 * memory round trip instead of one per 32 elements. Any other shape takes the general
 * path: one warp per vector, lanes striding over its elements, a second pass re-reading
 * the inputs. The gated norm's y and z may be row views (a row stride of their own); out
 * is contiguous. Both sum in a fixed order that depends only on the vector length, so a row's
 * bits never depend on its batch or the run; every thread writes only the elements it
 * read, so in-place calls are safe.
 * Math in fp32, following PyTorch eager's operation order (mamba_ssm's rms_norm_ref):
 * silu(z) = z / (1 + exp(-z)); rstd = 1 / sqrt(sum * (1/n) + eps); out = (x * rstd) * w.
 */
#include <math.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "dtype_access.cuh"
#include "gdp_kernels.h"
#include "norm_math.cuh"
#include "src/cuda_check.h"
#include "src/internal.h"

// CUDA kernels

namespace {

/* The normalized input element: x, or y * silu(z) for the gated norm. */
template <bool GATED> __device__ __forceinline__ float norm_input(const NormParams &p, int64_t i, int64_t iz) {
    const float x = load_as_float(p.x, p.x_dtype, i);
    if constexpr (GATED)
        return gated(x, load_as_float(p.z, p.z_dtype, iz));
    else
        return x;
}

/* One warp per vector. L2 (the L2 norm): out = x * (1 / sqrt(sum x^2 + eps)); otherwise
 * the RMSNorm: out = (x * (1 / sqrt(sum x^2 * (1/n) + eps))) * weight. */
template <bool L2, bool GATED> __global__ void __launch_bounds__(NORM_THREADS) norm_kernel(const NormParams p) {
    const int lane = threadIdx.x & 31;
    const int64_t vec = (int64_t)blockIdx.x * NORM_WARPS + (threadIdx.x >> 5);
    if (vec >= p.vectors)
        return;
    const int64_t row = vec / p.groups, group = vec - row * p.groups;
    const int64_t xb = row * p.x_row + group * p.n, zb = row * p.z_row + group * p.n, base = vec * p.n;
    float ss = 0.0f;
    for (int64_t i = lane; i < p.n; i += 32) {
        const float x = norm_input<GATED>(p, xb + i, zb + i);
        ss = fmaf(x, x, ss);
    }
    const float rstd = norm_rstd<L2>(p, warp_sum(ss));
    const int64_t w_base = group * p.n;
    for (int64_t i = lane; i < p.n; i += 32) {
        const float x = norm_input<GATED>(p, xb + i, zb + i);
        float out = __fmul_rn(x, rstd);
        if (!L2)
            out = __fmul_rn(out, load_as_float(p.weight, p.w_dtype, w_base + i));
        store_from_float(p.out, p.out_dtype, base + i, out);
    }
}

/* Fast path. BLOCK: one FAST_BLOCK_THREADS block per vector; otherwise one warp per vector,
 * NORM_WARPS vectors per block. Thread t holds chunks t, t + lanes, ... (at most CHUNKS,
 * the launch's smallest count that covers the vector: registers decide occupancy). */
template <bool L2, bool GATED, bool BLOCK, int CHUNKS>
__global__ void __launch_bounds__(BLOCK ? FAST_BLOCK_THREADS : NORM_THREADS) norm_fast_kernel(const NormParams p) {
    const int t = BLOCK ? (int)threadIdx.x : (int)(threadIdx.x & 31);
    const int64_t vec = BLOCK ? (int64_t)blockIdx.x : (int64_t)blockIdx.x * NORM_WARPS + (threadIdx.x >> 5);
    if (vec >= p.vectors) /* uniform over the block (BLOCK) or the warp */
        return;
    norm_fast_vector<L2, GATED, BLOCK, CHUNKS>(p, vec, t);
}

/* The fast kernel with the fewest chunks per thread (1, 2, 4, or 8 for a block) that cover n. */
template <bool L2, bool GATED, bool BLOCK>
void launch_fast(const NormParams &p, unsigned blocks, cudaStream_t stream) {
    const int64_t per_thread = fast_chunks_per_thread(p.n, BLOCK); /* <= 4 (warp) or 8 (block): fast_path_fits */
    const unsigned threads = BLOCK ? FAST_BLOCK_THREADS : NORM_THREADS;
    if (per_thread <= 1)
        norm_fast_kernel<L2, GATED, BLOCK, 1><<<blocks, threads, 0, stream>>>(p);
    else if (per_thread <= 2)
        norm_fast_kernel<L2, GATED, BLOCK, 2><<<blocks, threads, 0, stream>>>(p);
    else if (!BLOCK || per_thread <= 4)
        norm_fast_kernel<L2, GATED, BLOCK, 4><<<blocks, threads, 0, stream>>>(p);
    else if constexpr (BLOCK)
        norm_fast_kernel<L2, GATED, BLOCK, FAST_BLOCK_CHUNKS><<<blocks, threads, 0, stream>>>(p);
}

template <bool L2, bool GATED> cudaError_t launch_norm(const NormParams &p, cudaStream_t stream) {
    if (p.vectors <= 0)
        return cudaGetLastError();
    if (fast_path_fits(p) && fast_block_vector(p.n)) {
        if (p.vectors > INT32_MAX)
            return cudaErrorInvalidConfiguration;
        launch_fast<L2, GATED, true>(p, (unsigned)p.vectors, stream);
        return cudaGetLastError();
    }
    const int64_t blocks = (p.vectors + NORM_WARPS - 1) / NORM_WARPS;
    if (blocks > INT32_MAX)
        return cudaErrorInvalidConfiguration;
    if (fast_path_fits(p))
        launch_fast<L2, GATED, false>(p, (unsigned)blocks, stream);
    else
        norm_kernel<L2, GATED><<<(unsigned)blocks, NORM_THREADS, 0, stream>>>(p);
    return cudaGetLastError();
}

/* The op's status after its launch: the one launch check, with the norm's shape in the message. */
gdp_status_t check_norm_launch(const char *op, cudaError_t err, const NormParams &p) {
    GDP_CUDA_LAUNCH_CHECK(op, err, "%lld vectors of %lld", (long long)p.vectors, (long long)p.n);
    return GDP_STATUS_SUCCESS;
}

/* Elements of the last dim, and how many rows the leading dims hold. */
void row_shape(const gdp_tensor *t, int64_t *rows, int64_t *d) {
    *d = t->ndim > 0 ? t->shape[t->ndim - 1] : 1;
    const int64_t numel = gdp_tensor_numel(t);
    *rows = *d > 0 ? numel / *d : 0;
}

/* The parameters of a norm over whole rows of x (one vector a row, contiguous rows) into out. */
NormParams whole_row_params(const gdp_tensor *x, gdp_tensor *out) {
    NormParams p = {};
    int64_t rows, d;
    row_shape(x, &rows, &d);
    p.x = x->data;
    p.x_dtype = x->dtype;
    p.out = out->data;
    p.out_dtype = out->dtype;
    p.vectors = d > 0 ? rows : 0;
    p.n = d;
    p.groups = 1;
    p.x_row = d;
    return p;
}

} // namespace

// kernel launchers

extern "C" gdp_status_t gdp_cuda_l2norm(struct gdp_ctx *ctx, gdp_tensor *y, const gdp_tensor *x) {
    NormParams p = whole_row_params(x, y);
    p.eps = (float)GDP_L2NORM_EPS;
    return check_norm_launch("gdp_l2norm", launch_norm<true, false>(p, static_cast<cudaStream_t>(ctx->stream)), p);
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
    /* a 2-D row view (the front-end allows it for y and z) or contiguous rows */
    p.x_row = y->ndim == 2 ? gdp_tensor_stride(y, 0) : d;
    p.z_row = z->ndim == 2 ? gdp_tensor_stride(z, 0) : d;
    /* torch's mean multiplies the sum by float(outputs) / numel, i.e. 1/n rounded once. */
    p.inv_n = 1.0f / (float)group_size;
    p.eps = (float)eps;
    return check_norm_launch(op, launch_norm<false, true>(p, static_cast<cudaStream_t>(ctx->stream)), p);
}

extern "C" gdp_status_t gdp_cuda_rmsnorm(struct gdp_ctx *ctx, gdp_tensor *out, const gdp_tensor *x,
                                         const gdp_tensor *weight, double eps) {
    NormParams p = whole_row_params(x, out);
    p.weight = weight->data;
    p.w_dtype = weight->dtype;
    p.inv_n = p.n > 0 ? 1.0f / (float)p.n : 0.0f;
    p.eps = (float)eps;
    return check_norm_launch("gdp_rmsnorm", launch_norm<false, false>(p, static_cast<cudaStream_t>(ctx->stream)), p);
}
