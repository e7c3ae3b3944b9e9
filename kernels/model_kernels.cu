/*
 * model_kernels.cu: the embedding gather, the LM head's input rows and the fp32 -> bf16
 * conversion of the head's weight (semantics in model_kernels.h). Memory-bound row
 * kernels: one block per row, float4 accesses where D allows. The gather resolves a
 * reference to the previous step's draw (a token <= -2) from the device's sample records.
 */
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "model_kernels.h"
#include "src/cuda_check.h"
#include "src/internal.h"

namespace {

constexpr int MK_THREADS = 256;

__global__ void embed_gather_kernel(gdp_embed_gather_args a) {
    const int64_t i = blockIdx.x;
    int64_t t = a.tokens[i];
    if (t <= -2) { /* a reference to the previous step's draw (stream order: it is written) */
        const int64_t h = -2 - t;
        t = a.prev != nullptr && h < a.n_prev ? (int64_t)a.prev[h].token : -1;
    }
    float *dst = a.x + i * a.D;
    const bool ok = t >= 0 && t < a.vocab;
    const float *src = a.embedding + (ok ? (int64_t)t : 0) * a.D;
    if ((a.D & 3) == 0) {
        float4 *d4 = reinterpret_cast<float4 *>(dst);
        const float4 *s4 = reinterpret_cast<const float4 *>(src);
        for (int64_t k = threadIdx.x; k < a.D / 4; k += blockDim.x)
            d4[k] = ok ? s4[k] : make_float4(0.f, 0.f, 0.f, 0.f);
    } else {
        for (int64_t k = threadIdx.x; k < a.D; k += blockDim.x)
            dst[k] = ok ? src[k] : 0.f;
    }
}

__device__ float block_sum(float v) {
    __shared__ float part[MK_THREADS / 32];
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    if ((threadIdx.x & 31) == 0)
        part[threadIdx.x >> 5] = v;
    __syncthreads();
    float s = 0.f;
    for (int w = 0; w < MK_THREADS / 32; w++) /* every thread sums the parts in one order */
        s += part[w];
    return s;
}

__global__ void head_rows_kernel(gdp_head_rows_args a) {
    const int64_t i = blockIdx.x;
    const int32_t r = a.rows[i];
    const bool ok = r >= 0 && r < a.x_rows;
    const float *x = a.x + (ok ? (int64_t)r : 0) * a.D;
    float ss = 0.f;
    for (int64_t k = threadIdx.x; k < a.D; k += blockDim.x)
        ss += x[k] * x[k];
    const float total = block_sum(ss);
    const float inv = rsqrtf(total / (float)a.D + a.eps);
    __nv_bfloat16 *out = reinterpret_cast<__nv_bfloat16 *>(a.out) + i * a.D;
    for (int64_t k = threadIdx.x; k < a.D; k += blockDim.x)
        out[k] = __float2bfloat16_rn(ok ? x[k] * inv * a.weight[k] : 0.f);
}

__global__ void f32_to_bf16_kernel(__nv_bfloat16 *dst, const float *src, int64_t count) {
    for (int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; k < count; k += (int64_t)gridDim.x * blockDim.x)
        dst[k] = __float2bfloat16_rn(src[k]);
}


} // namespace

// kernel launchers

extern "C" gdp_status_t gdp_cuda_embed_gather(struct gdp_ctx *ctx, const gdp_embed_gather_args *a) {
    if (a->n <= 0)
        return GDP_STATUS_SUCCESS;
    if (a->n > INT32_MAX)
        GDP_FAIL(GDP_STATUS_UNSUPPORTED, "gdp_model_embed: %lld rows exceed the grid", (long long)a->n);
    embed_gather_kernel<<<(unsigned)a->n, MK_THREADS, 0, static_cast<cudaStream_t>(ctx->stream)>>>(*a);
    GDP_CUDA_LAUNCH_CHECK("gdp_model_embed", cudaGetLastError(), "%lld rows", (long long)a->n);
    return GDP_STATUS_SUCCESS;
}

extern "C" gdp_status_t gdp_cuda_head_rows(struct gdp_ctx *ctx, const gdp_head_rows_args *a) {
    if (a->n <= 0)
        return GDP_STATUS_SUCCESS;
    if (a->n > INT32_MAX)
        GDP_FAIL(GDP_STATUS_UNSUPPORTED, "gdp_model_sample: %lld head rows exceed the grid", (long long)a->n);
    head_rows_kernel<<<(unsigned)a->n, MK_THREADS, 0, static_cast<cudaStream_t>(ctx->stream)>>>(*a);
    GDP_CUDA_LAUNCH_CHECK("gdp_model_sample (head rows)", cudaGetLastError(), "%lld rows", (long long)a->n);
    return GDP_STATUS_SUCCESS;
}

extern "C" gdp_status_t gdp_cuda_f32_to_bf16(struct gdp_ctx *ctx, uint16_t *dst, const float *src, int64_t count) {
    if (count <= 0)
        return GDP_STATUS_SUCCESS;
    const int64_t blocks = (count + MK_THREADS - 1) / MK_THREADS;
    f32_to_bf16_kernel<<<(unsigned)(blocks < 65536 ? blocks : 65536), MK_THREADS, 0,
                         static_cast<cudaStream_t>(ctx->stream)>>>(reinterpret_cast<__nv_bfloat16 *>(dst), src,
                                                                   count);
    GDP_CUDA_LAUNCH_CHECK("gdp_model_init (bf16 head weight)", cudaGetLastError(), "%lld values", (long long)count);
    return GDP_STATUS_SUCCESS;
}
