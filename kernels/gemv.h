/*
 * gemv.h: the projection GEMM for a few rows (decode at small batch): C[rows, n] = A[rows, k]
 * B[n, k]^T + beta C with 16-bit A and B, fp32 accumulation and C fp32 or A's dtype
 * (kernels/gemv.cu): the weight B read once, 16 bytes a lane with several loads in flight, for
 * rows <= GDP_GEMV_MAX_ROWS. src/backend_cuda.c runs it only under GDP_GEMM_SKINNY=on: measured
 * on the H200 it matched cuBLASLt at one row (both about half the copy bandwidth) and lost from
 * four rows on (kernels/NOTES-ops.md, "Skinny GEMM"), so cuBLASLt stays the default.
 */
#ifndef GDP_GEMV_H
#define GDP_GEMV_H

#include <stdint.h>

#include "gdp/gdp.h"

#ifdef __cplusplus
extern "C" {
#endif

#define GDP_GEMV_MAX_ROWS 8

struct gdp_ctx;

/* Whether gdp_cuda_gemv_nt takes this call: 1 <= rows <= GDP_GEMV_MAX_ROWS, A and B bf16 or
 * fp16, C fp32 or A's dtype, k % 8 == 0, lda % 8 == 0, A and B 16-byte aligned. */
int gdp_cuda_gemv_fits(int64_t rows, int64_t k, const void *A, int64_t lda, const void *B, gdp_dtype_t ab_dtype,
                       gdp_dtype_t c_dtype);

/* C[r, j] = sum_i A[r, i] B[j, i] (+ beta C[r, j] when beta != 0; C is not read at beta 0) for
 * r < rows, j < n, on the ctx's stream. Each element is one fixed-order fp32 sum: the same
 * bits every call. The caller checked gdp_cuda_gemv_fits. */
gdp_status_t gdp_cuda_gemv_nt(struct gdp_ctx *ctx, int64_t rows, int64_t n, int64_t k, const void *A, int64_t lda,
                              const void *B, gdp_dtype_t ab_dtype, float beta, void *C, int64_t ldc,
                              gdp_dtype_t c_dtype);

#ifdef __cplusplus
}
#endif

#endif /* GDP_GEMV_H */
