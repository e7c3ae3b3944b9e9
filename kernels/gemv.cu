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
#include "norm_math.cuh"
#include "pdl.cuh"
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


/* ---- the norm-GEMV: the product with its input's norm folded in ---- */

constexpr int NG_U = 8;                  /* 16-byte chunks a lane loads per column at once: k 2048 */
constexpr int NG_SEG = GEMV_SPAN * NG_U; /* elements of a column a warp loads at once             */
constexpr int NG_MAX_GROUPS = 4;         /* norm groups a row (GATED): the lane's sums per group  */

struct NormGemvParams {
    const void *x, *z, *w; /* x (GATED: y) and z rows x_row / z_row elements apart; w [k] */
    gdp_dtype_t x_dtype, z_dtype, w_dtype;
    int64_t x_row, z_row;
    int groups, group; /* GATED: vectors a row and their length; RMS: 1 and k */
    float inv_n, eps;
    int rows, n, k;
    const void *B;
    float beta;
    void *C;
    int64_t ldc;
};

/* 8 consecutive elements of a row as floats (16-bit: one 16-byte load; fp32: two). */
__device__ __forceinline__ void load8(const void *base, gdp_dtype_t dt, int64_t i, float (&v)[8]) {
    load_vec_as_float<8>(base, dt, i, v);
}

/* One warp a column (row of B): a block takes 8 consecutive columns, as gemv_nt_kernel. The
 * norm is a scale of each row (RMS) or of each row's groups (GATED), so it need not come first:
 * the warp walks its column once and, for each of its chunks (lane * 8 + 256 i), forms the
 * input u = x * w (GATED: y silu(z) w) in fp32, adds b . u to the row's (group's) sum and x^2
 * (GATED: (y silu(z))^2) to its sum of squares; after the shuffle trees every lane holds both,
 * and C = rstd * sum (GATED: sum over the groups of rstd_g sum_g). So no block barrier, no
 * shared memory, and the weight's loads, issued first (before the programmatic wait when
 * launched as a dependent), never wait for the norm: the input chunks come from L1 / L2, read
 * by every warp of the block. The normalized input is never rounded to B's dtype (the chain
 * rounds it to bf16 before its GEMM): the result is within the fp32 accumulation bound of the
 * exact product, and one fixed order per element (the same bits every call, every batch). */
template <typename T, typename TC, int R, bool GATED>
__global__ void __launch_bounds__(GEMV_WARPS * 32) norm_gemv_kernel(const NormGemvParams p) {
    constexpr int G = GATED ? NG_MAX_GROUPS : 1;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t col = (int64_t)blockIdx.x * GEMV_WARPS + warp;
    pdl_trigger(); /* whatever follows may start as soon as it can: it waits for this grid itself */
    if (col >= p.n)
        return;
    const T *brow = static_cast<const T *>(p.B) + col * (int64_t)p.k;

    /* the column's first segment: independent of the kernels ahead */
    uint4 bv[NG_U];
#pragma unroll
    for (int u = 0; u < NG_U; u++) {
        const int idx = u * GEMV_SPAN + lane * 8;
        bv[u] = idx < p.k ? load_stream(brow + idx) : make_uint4(0u, 0u, 0u, 0u);
    }
    pdl_wait(); /* x, z: written by the kernels ahead */

    float acc[R][G], ss[R][G];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int g = 0; g < G; g++)
            acc[r][g] = 0.0f, ss[r][g] = 0.0f;
    for (int base = 0; base < p.k; base += NG_SEG) {
        if (base > 0) {
#pragma unroll
            for (int u = 0; u < NG_U; u++) {
                const int idx = base + u * GEMV_SPAN + lane * 8;
                bv[u] = idx < p.k ? load_stream(brow + idx) : make_uint4(0u, 0u, 0u, 0u);
            }
        }
#pragma unroll
        for (int u = 0; u < NG_U; u++) {
            const int idx = base + u * GEMV_SPAN + lane * 8;
            if (idx >= p.k)
                break;
            const int g = GATED ? idx / p.group : 0;
            float wt[8], b[8];
            load8(p.w, p.w_dtype, idx, wt);
            const uint32_t bw[4] = {bv[u].x, bv[u].y, bv[u].z, bv[u].w};
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const float2 f = Pair<T>::f2(bw[j]);
                b[2 * j] = f.x, b[2 * j + 1] = f.y;
            }
#pragma unroll
            for (int r = 0; r < R; r++) {
                if (r < p.rows) {
                    float xv[8];
                    load8(p.x, p.x_dtype, r * p.x_row + idx, xv);
                    if constexpr (GATED) {
                        float zv[8];
                        load8(p.z, p.z_dtype, r * p.z_row + idx, zv);
#pragma unroll
                        for (int j = 0; j < 8; j++)
                            xv[j] = gated(xv[j], zv[j]);
                    }
                    float a = 0.0f, q = 0.0f;
#pragma unroll
                    for (int j = 0; j < 8; j++) {
                        a = fmaf(b[j], __fmul_rn(xv[j], wt[j]), a);
                        q = fmaf(xv[j], xv[j], q);
                    }
#pragma unroll
                    for (int gg = 0; gg < G; gg++) /* a register index known at compile time */
                        if (gg == g)
                            acc[r][gg] += a, ss[r][gg] += q;
                }
            }
        }
    }
#pragma unroll
    for (int r = 0; r < R; r++) {
        float out = 0.0f;
#pragma unroll
        for (int g = 0; g < G; g++) {
            if (g < p.groups) {
                const float sum = warp_sum(acc[r][g]), sq = warp_sum(ss[r][g]);
                const float rstd = __fdiv_rn(1.0f, sqrtf(__fadd_rn(__fmul_rn(sq, p.inv_n), p.eps)));
                out = fmaf(rstd, sum, out);
            }
        }
        if (lane == r && r < p.rows) {
            TC *dst = static_cast<TC *>(p.C) + r * p.ldc + col;
            if constexpr (std::is_same<TC, float>::value) {
                if (p.beta != 0.0f)
                    out = fmaf(p.beta, *dst, out);
                *dst = out;
            } else {
                if (p.beta != 0.0f)
                    out = fmaf(p.beta, Pair<T>::to_f(*dst), out);
                *dst = Pair<T>::from_f(out);
            }
        }
    }
}

template <typename T, typename TC, int R, bool GATED>
cudaError_t launch_norm_gemv_inst(const NormGemvParams &p, bool pdl, cudaStream_t stream) {
    auto kernel = norm_gemv_kernel<T, TC, R, GATED>;
    const dim3 grid((unsigned)(((int64_t)p.n + GEMV_WARPS - 1) / GEMV_WARPS)), block(GEMV_WARPS * 32);
    if (pdl)
        return launch_pdl(kernel, grid, block, 0, stream, p);
    kernel<<<grid, block, 0, stream>>>(p);
    return cudaGetLastError();
}

template <typename T, typename TC, bool GATED>
cudaError_t launch_norm_gemv_rows(const NormGemvParams &p, bool pdl, cudaStream_t stream) {
    if (p.rows <= 1)
        return launch_norm_gemv_inst<T, TC, 1, GATED>(p, pdl, stream);
    if (p.rows <= 2)
        return launch_norm_gemv_inst<T, TC, 2, GATED>(p, pdl, stream);
    if (p.rows <= 4)
        return launch_norm_gemv_inst<T, TC, 4, GATED>(p, pdl, stream);
    return launch_norm_gemv_inst<T, TC, 8, GATED>(p, pdl, stream);
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

extern "C" int gdp_cuda_norm_gemv_fits(const gdp_norm_gemv_args *a) {
    const bool gated = a->kind == GDP_NORM_GEMV_GATED;
    /* bf16 only: the CUDA layer's activations and weights (gdp_backend_act_dtype) */
    const bool half = a->ab_dtype == GDP_DTYPE_BF16;
    /* the RMS form feeds in_proj, whose output is A's dtype; the gated one out_proj (fp32 or A's dtype) */
    const bool c_ok = a->c_dtype == a->ab_dtype || (gated && a->c_dtype == GDP_DTYPE_FP32);
    const int64_t group = gated ? a->group : a->k;
    const size_t xs = gdp_dtype_size(a->x_dtype), zs = gated ? gdp_dtype_size(a->z_dtype) : 0;
    return half && c_ok && a->rows >= 1 && a->rows <= GDP_GEMV_MAX_ROWS && a->n >= 1 && a->n <= INT32_MAX &&
           a->k >= 8 && a->k % 8 == 0 && a->k <= INT32_MAX && group >= 8 && group % 8 == 0 && a->k % group == 0 &&
           a->k / group <= NG_MAX_GROUPS && aligned16(a->B) && aligned16(a->x) && aligned16(a->norm_weight) &&
           ((size_t)a->x_row * xs) % 16 == 0 && (!gated || (aligned16(a->z) && ((size_t)a->z_row * zs) % 16 == 0));
}

extern "C" gdp_status_t gdp_cuda_norm_gemv(struct gdp_ctx *ctx, const gdp_norm_gemv_args *a, int pdl) {
    if (a->rows <= 0 || a->n <= 0)
        return GDP_STATUS_SUCCESS;
    const bool gated = a->kind == GDP_NORM_GEMV_GATED;
    NormGemvParams p = {};
    p.x = a->x;
    p.x_dtype = a->x_dtype;
    p.x_row = a->x_row;
    p.z = gated ? a->z : nullptr;
    p.z_dtype = gated ? a->z_dtype : GDP_DTYPE_FP32;
    p.z_row = gated ? a->z_row : 0;
    p.w = a->norm_weight;
    p.w_dtype = a->w_dtype;
    p.group = (int)(gated ? a->group : a->k);
    p.groups = (int)(a->k / p.group);
    /* as the norm ops: torch's mean multiplies by 1/n rounded once */
    p.inv_n = 1.0f / (float)p.group;
    p.eps = (float)a->eps;
    p.rows = (int)a->rows;
    p.n = (int)a->n;
    p.k = (int)a->k;
    p.B = a->B;
    p.beta = a->beta;
    p.C = a->C;
    p.ldc = a->ldc;
    cudaStream_t stream = static_cast<cudaStream_t>(ctx->stream);
    using bf16 = __nv_bfloat16;
    const cudaError_t err = !gated ? launch_norm_gemv_rows<bf16, bf16, false>(p, pdl != 0, stream)
                            : a->c_dtype == GDP_DTYPE_FP32 ? launch_norm_gemv_rows<bf16, float, true>(p, pdl != 0, stream)
                                                           : launch_norm_gemv_rows<bf16, bf16, true>(p, pdl != 0, stream);
    GDP_CUDA_LAUNCH_CHECK(gated ? "gdp_norm_gemm (gated)" : "gdp_norm_gemm (rms)", err, "rows %lld, n %lld, k %lld",
                          (long long)a->rows, (long long)a->n, (long long)a->k);
    return GDP_STATUS_SUCCESS;
}
