/*
 * gemv.cu: the projection GEMM for a few rows (semantics in gemv.h). Memory-bound on the
 * weight: each warp owns CPW output columns (rows of B) and walks k with 16-byte loads, U of
 * them a column issued before the first use (B streamed past L1; A, a few KB shared by every
 * warp, through L1), fp32 multiply-adds in a fixed order, then a shuffle sum per (row, column).
 * No shared memory and no block barrier.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <type_traits>

#include "dtype_access.cuh" /* aligned16 */
#include "gemv.h"
#include "src/cuda_check.h"
#include "src/internal.h"

namespace {

constexpr int GEMV_WARPS = 8;        /* warps a block                                */
constexpr int GEMV_U = 4;            /* 16-byte chunks a lane loads per column ahead */
constexpr int GEMV_SPAN = 32 * 8;    /* elements of k a warp covers per chunk        */

template <typename T> struct Pair;
template <> struct Pair<__nv_bfloat16> {
    static __device__ __forceinline__ float2 f2(uint32_t w) {
        return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&w));
    }
    static __device__ __forceinline__ __nv_bfloat16 from_f(float x) { return __float2bfloat16_rn(x); }
    static __device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
};
template <> struct Pair<__half> {
    static __device__ __forceinline__ float2 f2(uint32_t w) { return __half22float2(*reinterpret_cast<const __half2 *>(&w)); }
    static __device__ __forceinline__ __half from_f(float x) { return __float2half_rn(x); }
    static __device__ __forceinline__ float to_f(__half x) { return __half2float(x); }
};

/* A weight chunk, streamed: read once per call, so it need not stay in L1. */
__device__ __forceinline__ uint4 load_stream(const void *p) {
    uint4 r;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
    return r;
}

/* acc += <a, b> over one chunk of 8 elements, in element order */
template <typename T> __device__ __forceinline__ float dot8(float acc, const uint4 &a, const uint4 &b) {
    const uint32_t aw[4] = {a.x, a.y, a.z, a.w}, bw[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
    for (int w = 0; w < 4; w++) {
        const float2 x = Pair<T>::f2(aw[w]), y = Pair<T>::f2(bw[w]);
        acc = fmaf(x.x, y.x, acc);
        acc = fmaf(x.y, y.y, acc);
    }
    return acc;
}

/* R: rows rounded up to a compiled count (1, 2, 4, 8); CPW: columns a warp. */
template <typename T, typename TC, int R, int CPW>
__global__ void __launch_bounds__(GEMV_WARPS * 32) gemv_nt_kernel(int rows, int n, int k, const T *__restrict__ A,
                                                                 int64_t lda, const T *__restrict__ B, float beta,
                                                                 TC *__restrict__ C, int64_t ldc) {
    const int lane = threadIdx.x & 31;
    const int64_t col0 = ((int64_t)blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5)) * CPW;
    if (col0 >= n)
        return;
    float acc[R][CPW];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int c = 0; c < CPW; c++)
            acc[r][c] = 0.0f;
    const T *brow[CPW];
#pragma unroll
    for (int c = 0; c < CPW; c++)
        brow[c] = B + (col0 + c < n ? col0 + c : col0) * (int64_t)k; /* a column past n repeats col0, unused */

    for (int base = 0; base < k; base += GEMV_SPAN * GEMV_U) {
        uint4 bv[CPW][GEMV_U];
#pragma unroll
        for (int u = 0; u < GEMV_U; u++) {
            const int idx = base + u * GEMV_SPAN + lane * 8;
#pragma unroll
            for (int c = 0; c < CPW; c++)
                bv[c][u] = idx < k ? load_stream(brow[c] + idx) : make_uint4(0u, 0u, 0u, 0u);
        }
#pragma unroll
        for (int u = 0; u < GEMV_U; u++) {
            const int idx = base + u * GEMV_SPAN + lane * 8;
            if (idx >= k)
                break;
#pragma unroll
            for (int r = 0; r < R; r++) {
                if (r < rows) {
                    const uint4 av = __ldg(reinterpret_cast<const uint4 *>(A + r * lda + idx));
#pragma unroll
                    for (int c = 0; c < CPW; c++)
                        acc[r][c] = dot8<T>(acc[r][c], av, bv[c][u]);
                }
            }
        }
    }
    /* one shuffle tree per (row, column): every lane ends with the same fixed-order total */
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int c = 0; c < CPW; c++)
#pragma unroll
            for (int o = 16; o > 0; o >>= 1)
                acc[r][c] += __shfl_xor_sync(0xffffffffu, acc[r][c], o);
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int c = 0; c < CPW; c++) {
            if (lane == r * CPW + c && r < rows && col0 + c < n) {
                TC *dst = C + r * ldc + col0 + c;
                float v = acc[r][c];
                if constexpr (std::is_same<TC, float>::value) {
                    if (beta != 0.0f)
                        v = fmaf(beta, *dst, v);
                    *dst = v;
                } else {
                    if (beta != 0.0f)
                        v = fmaf(beta, Pair<T>::to_f(*dst), v);
                    *dst = Pair<T>::from_f(v);
                }
            }
        }
}

template <typename T, typename TC, int R>
cudaError_t launch_rows(int rows, int64_t n, int64_t k, const void *A, int64_t lda, const void *B, float beta, void *C,
                        int64_t ldc, cudaStream_t stream) {
    /* two columns a warp where that still leaves a few blocks per SM, else one */
    const bool two = n >= 2 * GEMV_WARPS * 512;
    const int64_t warps = two ? (n + 1) / 2 : n;
    const int64_t blocks = (warps + GEMV_WARPS - 1) / GEMV_WARPS;
    if (blocks > INT32_MAX)
        return cudaErrorInvalidConfiguration;
    if (two)
        gemv_nt_kernel<T, TC, R, 2><<<(unsigned)blocks, GEMV_WARPS * 32, 0, stream>>>(
            rows, (int)n, (int)k, static_cast<const T *>(A), lda, static_cast<const T *>(B), beta,
            static_cast<TC *>(C), ldc);
    else
        gemv_nt_kernel<T, TC, R, 1><<<(unsigned)blocks, GEMV_WARPS * 32, 0, stream>>>(
            rows, (int)n, (int)k, static_cast<const T *>(A), lda, static_cast<const T *>(B), beta,
            static_cast<TC *>(C), ldc);
    return cudaGetLastError();
}

template <typename T, typename TC>
cudaError_t launch_typed(int rows, int64_t n, int64_t k, const void *A, int64_t lda, const void *B, float beta,
                         void *C, int64_t ldc, cudaStream_t stream) {
    if (rows <= 1)
        return launch_rows<T, TC, 1>(rows, n, k, A, lda, B, beta, C, ldc, stream);
    if (rows <= 2)
        return launch_rows<T, TC, 2>(rows, n, k, A, lda, B, beta, C, ldc, stream);
    if (rows <= 4)
        return launch_rows<T, TC, 4>(rows, n, k, A, lda, B, beta, C, ldc, stream);
    return launch_rows<T, TC, 8>(rows, n, k, A, lda, B, beta, C, ldc, stream);
}

} // namespace

// kernel launchers

extern "C" int gdp_cuda_gemv_fits(int64_t rows, int64_t k, const void *A, int64_t lda, const void *B,
                                  gdp_dtype_t ab_dtype, gdp_dtype_t c_dtype) {
    const bool half = ab_dtype == GDP_DTYPE_BF16 || ab_dtype == GDP_DTYPE_FP16;
    return half && (c_dtype == GDP_DTYPE_FP32 || c_dtype == ab_dtype) && rows >= 1 && rows <= GDP_GEMV_MAX_ROWS &&
           k % 8 == 0 && k <= INT32_MAX && lda % 8 == 0 && aligned16(A) && aligned16(B);
}

extern "C" gdp_status_t gdp_cuda_gemv_nt(struct gdp_ctx *ctx, int64_t rows, int64_t n, int64_t k, const void *A,
                                         int64_t lda, const void *B, gdp_dtype_t ab_dtype, float beta, void *C,
                                         int64_t ldc, gdp_dtype_t c_dtype) {
    if (rows <= 0 || n <= 0)
        return GDP_STATUS_SUCCESS;
    if (n > INT32_MAX)
        GDP_FAIL(GDP_STATUS_UNSUPPORTED, "gdp_gemm_nt (skinny): n %lld exceeds the grid", (long long)n);
    cudaStream_t stream = static_cast<cudaStream_t>(ctx->stream);
    const int r = (int)rows;
    cudaError_t err;
    if (ab_dtype == GDP_DTYPE_BF16)
        err = c_dtype == GDP_DTYPE_FP32
                  ? launch_typed<__nv_bfloat16, float>(r, n, k, A, lda, B, beta, C, ldc, stream)
                  : launch_typed<__nv_bfloat16, __nv_bfloat16>(r, n, k, A, lda, B, beta, C, ldc, stream);
    else
        err = c_dtype == GDP_DTYPE_FP32 ? launch_typed<__half, float>(r, n, k, A, lda, B, beta, C, ldc, stream)
                                        : launch_typed<__half, __half>(r, n, k, A, lda, B, beta, C, ldc, stream);
    GDP_CUDA_LAUNCH_CHECK("gdp_gemm_nt (skinny)", err, "rows %lld, n %lld, k %lld", (long long)rows, (long long)n,
                          (long long)k);
    return GDP_STATUS_SUCCESS;
}
