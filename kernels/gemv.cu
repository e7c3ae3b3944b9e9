/*
 * gemv.cu: the projection GEMM for a few rows (semantics in gemv.h). Memory-bound on the
 * weight: each warp owns CPW output columns (rows of B) and walks k with 16-byte loads, U of
 * them a column issued before the first use (B streamed past L1; A, a few KB shared by every
 * warp, through L1), fp32 multiply-adds in a fixed order, then a shuffle sum per (row, column).
 * No shared memory and no block barrier. Then the norm-GEMV: the same product, one column a warp,
 * with its input's norm formed first in shared memory (gemv.h).
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "dtype_access.cuh" /* aligned16 */
#include "gemv.h"
#include "gemv_math.cuh"
#include "norm_math.cuh"
#include "pdl.cuh"
#include "src/cuda_check.h"
#include "src/internal.h"

namespace {

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
    gemv_sums<T, R, CPW>(rows, n, k, GlobalRows<T, R>{A, lda, rows}, B, col0, lane, acc);
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int c = 0; c < CPW; c++)
            if (lane == r * CPW + c && r < rows && col0 + c < n)
                store_sum<T>(C + r * ldc + col0 + c, acc[r][c], beta);
}

template <typename T, typename TC, int R>
cudaError_t launch_rows(int rows, int64_t n, int64_t k, const void *A, int64_t lda, const void *B, float beta, void *C,
                        int64_t ldc, cudaStream_t stream) {
    const bool two = gemv_two_columns(n);
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


/* ---- the norm-GEMV: the input's norm formed in shared memory, then the product ---- */

constexpr int NG_U = 8;                  /* 16-byte chunks a lane loads per column at once: k 2048 */
constexpr int NG_SEG = GEMV_SPAN * NG_U; /* elements of a column a warp loads at once             */

struct NormGemvParams {
    NormParams norm; /* the prologue's norm; out is set to the block's shared rows */
    int rows, n, k;
    const void *B;
    float beta;
    void *C;
    int64_t ldc;
};

/* The RMSNorm of one row of more than 1024 elements by one warp, in the sum order of the norm
 * kernels' block body (norm_fast_vector<BLOCK>, NCH chunks a thread of 256): thread t = 32 w + lane
 * of that block sums chunks t, t + 256, ... in order, each warp's 32 sums are added by warp_sum,
 * then the 8 warp sums in warp order from 0. Here lane `lane` plays thread 32 w + lane for every w:
 * the same operations on the same values, so the same bits, with every row of a step in parallel
 * (one warp each) instead of one row after the other through the block. */
template <int NCH> __device__ void rms_row_block_order(const NormParams &q, int64_t row, int lane) {
    constexpr int W = FAST_BLOCK_THREADS / 32, LANES = FAST_BLOCK_THREADS;
    const int chunks = (int)(q.n / 8);
    const int64_t xb = row * q.x_row, base = row * q.n;
    float ss[W];
#pragma unroll
    for (int w = 0; w < W; w++)
        ss[w] = 0.0f;
#pragma unroll
    for (int c = 0; c < NCH; c++) { /* each thread's chain in its own order: chunk c of every w */
        float v[W][8];
#pragma unroll
        for (int w = 0; w < W; w++) {
            const int ch = 32 * w + lane + c * LANES;
            if (ch < chunks)
                load_vec_as_float<8>(q.x, q.x_dtype, xb + (int64_t)ch * 8, v[w]);
        }
#pragma unroll
        for (int w = 0; w < W; w++) {
            if (32 * w + lane + c * LANES < chunks) {
#pragma unroll
                for (int j = 0; j < 8; j++)
                    ss[w] = fmaf(v[w][j], v[w][j], ss[w]);
            }
        }
    }
    float total = 0.0f;
#pragma unroll
    for (int w = 0; w < W; w++)
        total += warp_sum(ss[w]);
    const float rstd = norm_rstd<false>(q, total);
#pragma unroll
    for (int c = 0; c < NCH; c++) {
#pragma unroll
        for (int w = 0; w < W; w++) {
            const int ch = 32 * w + lane + c * LANES;
            if (ch < chunks) {
                float v[8], wt[8], out[8];
                load_vec_as_float<8>(q.x, q.x_dtype, xb + (int64_t)ch * 8, v); /* again: an L1 hit */
                load_vec_as_float<8>(q.weight, q.w_dtype, (int64_t)ch * 8, wt);
#pragma unroll
                for (int j = 0; j < 8; j++)
                    out[j] = __fmul_rn(__fmul_rn(v[j], rstd), wt[j]);
                store_vec_from_float<8>(q.out, q.out_dtype, base + (int64_t)ch * 8, out);
            }
        }
    }
}

/* One warp a column (row of B), a block of 8 consecutive columns: gemv_nt_kernel's grid, which
 * keeps the SMs full as blocks end (a resident grid walking several columns a warp, measured
 * slower: kernels/NOTES-ops.md). The weight does not depend on the kernels ahead, so each warp
 * first issues its column's first NG_SEG elements (NG_U 16-byte chunks a lane) and sends the rest
 * of the column to L2, before the programmatic wait when launched as a dependent (pdl.cuh);
 * while they arrive the block forms the norm of every row in shared memory, with the norm
 * kernels' body and sum orders (the same A as the norm op writes): all of it gemv_sums' hook, A then
 * read from shared memory; so each warp multiplies in gemv_nt_kernel's per-column order (chunk
 * lane * 8 + 256 i in increasing i, then the shuffle tree): the same bits as the norm op followed
 * by gemv_nt. BLOCK: rows of more than 1024
 * elements (RMS: rms_row_block_order, a warp a row; GATED: the block body, one vector after the
 * other), else a warp a vector; NCH chunks a thread as the norm kernels. */
/* p is __grid_constant__: the hook takes it by reference, read in place from the parameter space. */
template <typename T, typename TC, int R, bool GATED, bool BLOCK, int NCH>
__global__ void __launch_bounds__(GEMV_WARPS * 32) norm_gemv_kernel(const __grid_constant__ NormGemvParams p) {
    extern __shared__ __align__(16) unsigned char norm_gemv_smem[];
    T *As = reinterpret_cast<T *>(norm_gemv_smem);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t col = (int64_t)blockIdx.x * GEMV_WARPS + warp;
    const bool has_col = col < p.n;
    pdl_trigger(); /* whatever follows may start as soon as it can: it waits for this grid itself */

    /* 1. The weight, independent of the kernels ahead: gemv_sums issues the column's first NG_SEG
     * elements, then runs the hook. */
    const int64_t col_read = has_col ? col : 0; /* a column past n reads column 0, its sum unused */
    const T *B = static_cast<const T *>(p.B);
    const T *brow = B + col_read * (int64_t)p.k;
    const auto prologue = [&]() {
        if (has_col && lane == 0 && p.k > NG_SEG) /* the rest of the column to L2 */
            prefetch_l2_bulk(brow + NG_SEG, (uint32_t)(p.k - NG_SEG) * (uint32_t)sizeof(T));
        /* 2. The input, written by the kernels ahead: its norm, every row, in shared memory. */
        pdl_wait();
        NormParams q = p.norm;
        q.out = As;
        if constexpr (GATED && BLOCK) {
            for (int64_t v = 0; v < q.vectors; v++) {
                norm_fast_vector<false, true, true, NCH>(q, v, (int)threadIdx.x);
                __syncthreads(); /* the body's partial sums are reused by the next vector */
            }
        } else if constexpr (BLOCK) {
            if (warp < p.rows)
                rms_row_block_order<NCH>(q, warp, lane);
        } else {
            for (int64_t v = warp; v < q.vectors; v += GEMV_WARPS)
                norm_fast_vector<false, GATED, false, NCH>(q, v, lane);
        }
        __syncthreads();
    };

    /* 3. The product, in gemv_nt_kernel's order, A from shared memory. */
    float acc[R][1];
    gemv_sums<T, R, 1, NG_U, true>(p.rows, p.n, p.k, SharedRows<T>{As, p.k}, B, col_read, lane, acc, prologue);
    if (!has_col)
        return;
#pragma unroll
    for (int r = 0; r < R; r++)
        if (lane == r && r < p.rows)
            store_sum<T>(static_cast<TC *>(p.C) + r * p.ldc + col, acc[r][0], p.beta);
}

template <typename T, typename TC, int R, bool GATED, bool BLOCK, int NCH>
cudaError_t launch_norm_gemv_inst(const NormGemvParams &p, bool pdl, cudaStream_t stream) {
    auto kernel = norm_gemv_kernel<T, TC, R, GATED, BLOCK, NCH>;
    const size_t smem = (size_t)p.rows * (size_t)p.k * sizeof(T);
    if (smem > 48 * 1024) {
        const cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (err != cudaSuccess)
            return err;
    }
    const dim3 grid((unsigned)(((int64_t)p.n + GEMV_WARPS - 1) / GEMV_WARPS)), block(GEMV_WARPS * 32);
    return launch_pdl(kernel, grid, block, smem, stream, pdl, p);
}

template <typename T, typename TC, int R, bool GATED>
cudaError_t launch_norm_gemv_shape(const NormGemvParams &p, bool pdl, cudaStream_t stream) {
    /* the norm kernels' own choice (norm_math.cuh), so the prologue sums as they do */
    const bool block = fast_block_vector(p.norm.n);
    if (fast_chunks_per_thread(p.norm.n, block) <= 1)
        return block ? launch_norm_gemv_inst<T, TC, R, GATED, true, 1>(p, pdl, stream)
                     : launch_norm_gemv_inst<T, TC, R, GATED, false, 1>(p, pdl, stream);
    return block ? launch_norm_gemv_inst<T, TC, R, GATED, true, 2>(p, pdl, stream)
                 : launch_norm_gemv_inst<T, TC, R, GATED, false, 2>(p, pdl, stream);
}

template <typename T, typename TC, bool GATED>
cudaError_t launch_norm_gemv_rows(const NormGemvParams &p, bool pdl, cudaStream_t stream) {
    if (p.rows <= 1)
        return launch_norm_gemv_shape<T, TC, 1, GATED>(p, pdl, stream);
    if (p.rows <= 2)
        return launch_norm_gemv_shape<T, TC, 2, GATED>(p, pdl, stream);
    if (p.rows <= 4)
        return launch_norm_gemv_shape<T, TC, 4, GATED>(p, pdl, stream);
    return launch_norm_gemv_shape<T, TC, 8, GATED>(p, pdl, stream);
}

/* The RMS prologue writes A's dtype (C too: in_proj); the gated one writes C in fp32 or A's dtype. */
template <typename T>
cudaError_t launch_norm_gemv_typed(const NormGemvParams &p, bool gated, gdp_dtype_t c_dtype, bool pdl,
                                   cudaStream_t stream) {
    if (!gated)
        return launch_norm_gemv_rows<T, T, false>(p, pdl, stream);
    return c_dtype == GDP_DTYPE_FP32 ? launch_norm_gemv_rows<T, float, true>(p, pdl, stream)
                                     : launch_norm_gemv_rows<T, T, true>(p, pdl, stream);
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
    /* the RMS prologue feeds in_proj, whose output is A's dtype; the gated one out_proj (fp32 or A's dtype) */
    const bool c_ok = a->c_dtype == a->ab_dtype || (gated && a->c_dtype == GDP_DTYPE_FP32);
    const int64_t group = gated ? a->group : a->k;
    const size_t xs = gdp_dtype_size(a->x_dtype), zs = gated ? gdp_dtype_size(a->z_dtype) : 0;
    return half && c_ok && a->rows >= 1 && a->rows <= GDP_GEMV_MAX_ROWS && a->n >= 1 && a->n <= INT32_MAX &&
           a->k % 8 == 0 && a->k <= INT32_MAX && group >= 8 && group % 8 == 0 && a->k % group == 0 &&
           fast_chunks_per_thread(group, fast_block_vector(group)) <= 2 &&
           (size_t)a->rows * (size_t)a->k * 2 <= GDP_NORM_GEMV_MAX_SMEM && aligned16(a->B) && aligned16(a->x) &&
           aligned16(a->norm_weight) && ((size_t)a->x_row * xs) % 16 == 0 &&
           (!gated || (aligned16(a->z) && ((size_t)a->z_row * zs) % 16 == 0));
}

extern "C" gdp_status_t gdp_cuda_norm_gemv(struct gdp_ctx *ctx, const gdp_norm_gemv_args *a, int pdl) {
    if (a->rows <= 0 || a->n <= 0)
        return GDP_STATUS_SUCCESS;
    const bool gated = a->kind == GDP_NORM_GEMV_GATED;
    NormGemvParams p = {};
    p.norm.x = a->x;
    p.norm.x_dtype = a->x_dtype;
    p.norm.x_row = a->x_row;
    p.norm.z = gated ? a->z : nullptr;
    p.norm.z_dtype = gated ? a->z_dtype : GDP_DTYPE_FP32;
    p.norm.z_row = gated ? a->z_row : 0;
    p.norm.weight = a->norm_weight;
    p.norm.w_dtype = a->w_dtype;
    p.norm.out_dtype = a->ab_dtype;
    p.norm.n = gated ? a->group : a->k;
    p.norm.groups = a->k / p.norm.n;
    p.norm.vectors = a->rows * p.norm.groups;
    /* as the norm ops: torch's mean multiplies by 1/n rounded once */
    p.norm.inv_n = 1.0f / (float)p.norm.n;
    p.norm.eps = (float)a->eps;
    p.rows = (int)a->rows;
    p.n = (int)a->n;
    p.k = (int)a->k;
    p.B = a->B;
    p.beta = a->beta;
    p.C = a->C;
    p.ldc = a->ldc;
    cudaStream_t stream = static_cast<cudaStream_t>(ctx->stream);
    const cudaError_t err = launch_norm_gemv_typed<__nv_bfloat16>(p, gated, a->c_dtype, pdl != 0, stream);
    GDP_CUDA_LAUNCH_CHECK(gated ? "gdp_gated_rmsnorm_gemm" : "gdp_rmsnorm_gemm", err, "rows %lld, n %lld, k %lld",
                          (long long)a->rows, (long long)a->n, (long long)a->k);
    return GDP_STATUS_SUCCESS;
}
