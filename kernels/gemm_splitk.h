/*
 * gemm_splitk.h: the projection GEMM of 3 to 256 rows split along k across a thread-block cluster
 * (kernels/gemm_splitk.cu): C[rows, n] = A[rows, k] B[n, k]^T + beta C with 16-bit A and B, fp32
 * accumulation, C fp32 or A's dtype, on Hopper (sm_90) and later. An experiment, not the default:
 * measured slower than cuBLASLt at every row count on the H100 (kernels/NOTES-ops.md, thirty-eighth
 * session: out_proj 17.7-31.2 us against 9.6-10.8, in_proj 24-26 against 19-22 in gdp-bench ops), so
 * src/backend_cuda.c runs it only under GDP_GEMM_SPLITK=auto (from GDP_GEMM_SPLITK_AUTO_MIN_ROWS rows
 * wherever it splits: a grid of at most one CTA an SM with 2 to 8 CTAs a 128 x 128 tile) or on (from
 * one row); off, or unset, never.
 */
#ifndef GDP_GEMM_SPLITK_H
#define GDP_GEMM_SPLITK_H

#include <stdint.h>

#include "gdp/gdp.h"

#ifdef __cplusplus
extern "C" {
#endif

#define GDP_GEMM_SPLITK_MAX_ROWS 256
#define GDP_GEMM_SPLITK_AUTO_MIN_ROWS 3 /* one and two rows: the skinny GEMV (kernels/gemv.h) */

struct gdp_ctx;

/* The CTAs a tile (2, 4 or 8) gdp_cuda_gemm_splitk_nt would split this call over on the ctx's
 * device, or 0 where it does not take it: A and B bf16 or fp16, C fp32 or A's dtype, 1 <= rows <=
 * GDP_GEMM_SPLITK_MAX_ROWS, k % 64 == 0, lda % 8 == 0, A and B 16-byte aligned, compute
 * capability >= 9.0, and a split whose grid fits one CTA an SM. */
int gdp_cuda_gemm_splitk_ways(struct gdp_ctx *ctx, int64_t rows, int64_t n, int64_t k, const void *A, int64_t lda,
                              const void *B, gdp_dtype_t ab_dtype, const void *C, int64_t ldc, gdp_dtype_t c_dtype);

/* C[r, j] = sum_i A[r, i] B[j, i] (+ beta C[r, j] when beta != 0; C is not read at beta 0) for
 * r < rows, j < n, on the ctx's stream, the k range split `ways` ways (gdp_cuda_gemm_splitk_ways'
 * answer). Each element's partial sums are added in a fixed order: the same bits every call. */
gdp_status_t gdp_cuda_gemm_splitk_nt(struct gdp_ctx *ctx, int ways, int64_t rows, int64_t n, int64_t k,
                                     const void *A, int64_t lda, const void *B, gdp_dtype_t ab_dtype, float beta,
                                     void *C, int64_t ldc, gdp_dtype_t c_dtype);

#ifdef __cplusplus
}
#endif

#endif /* GDP_GEMM_SPLITK_H */
