/*
 * backend.h: the primitives the library's objects need from a backend beyond the ops, so
 * that layer.c, cache.c, plan.c, model.c and engine.c stay one code for both backends:
 * buffers on the ctx's backend (allocate zeroed, zero, copy, 2-D copy, upload from and
 * download to the host), the projection GEMM C = A B^T + beta C, and the copies driven by
 * a step's index arrays (row gathers by slot, a snapshot's conv window, a step's slot
 * fills; semantics in kernels/copy_kernels.h). src/backend.c holds the CPU half and the
 * dispatch, src/backend_cuda.c the cuBLASLt GEMM, kernels/copy_kernels.cu the copies.
 */
#ifndef GDP_BACKEND_H
#define GDP_BACKEND_H

#include "internal.h"
#include "kernels/copy_kernels.h" /* gdp_copy_rows_args and the other copy args */

#ifdef __cplusplus
extern "C" {
#endif

/* ---- buffers on the ctx's backend (host memory on CPU, device memory on CUDA) ---- */
/* Allocates `bytes` zeroed bytes; *out = NULL and an error naming `what` on failure. */
gdp_status_t gdp_buf_alloc(gdp_ctx_t ctx, size_t bytes, void **out, const char *what);
/* Frees a buffer of gdp_buf_alloc (NULL is a no-op). */
void         gdp_buf_free(gdp_ctx_t ctx, void *buf);
gdp_status_t gdp_buf_zero(gdp_ctx_t ctx, void *buf, size_t bytes);
/* dst and src are buffers of the backend; they may not overlap. */
gdp_status_t gdp_buf_copy(gdp_ctx_t ctx, void *dst, const void *src, size_t bytes);
/* rows rows of width bytes from src (pitch spitch bytes) to dst (pitch dpitch bytes). */
gdp_status_t gdp_buf_copy2d(gdp_ctx_t ctx, void *dst, size_t dpitch, const void *src, size_t spitch,
                            size_t width, size_t rows);
/* Host memory -> a backend buffer (a plain copy on the CPU backend). */
gdp_status_t gdp_buf_upload(gdp_ctx_t ctx, void *dst, const void *host_src, size_t bytes);
/* A backend buffer -> host memory; waits for the ctx's stream on CUDA. */
gdp_status_t gdp_buf_download(gdp_ctx_t ctx, void *host_dst, const void *src, size_t bytes);

/* The projection GEMM of the layer: C[rows, n] = A[rows, k] . B[n, k]^T + beta * C,
 * row-major, A with row pitch lda elements, B (the weight) contiguous [n, k], C with row
 * pitch ldc; A and B in ab_dtype, C in c_dtype. CPU backend: all fp32 (cblas_sgemm). CUDA
 * backend (cuBLASLt on the ctx's stream, src/backend_cuda.c; needs the ctx's GEMM state, see
 * gdp_gemm_acquire): A and B bf16 or fp16 with C fp32 or ab_dtype, or all fp32;
 * fp32 accumulation always (no TF32). C may be updated in place (beta = 1 adds A B^T). */
gdp_status_t gdp_gemm_nt_ex(gdp_ctx_t ctx, int64_t rows, int64_t n, int64_t k, const void *A, int64_t lda,
                            const void *B, gdp_dtype_t ab_dtype, float beta, void *C, int64_t ldc,
                            gdp_dtype_t c_dtype);
/* The same with every operand in `dtype`. */
gdp_status_t gdp_gemm_nt(gdp_ctx_t ctx, int64_t rows, int64_t n, int64_t k, const void *A, int64_t lda,
                         const void *B, float beta, void *C, int64_t ldc, gdp_dtype_t dtype);
/* 1 if gdp_gemm_nt_ex runs on this ctx's backend with these dtypes, else 0 and an
 * UNSUPPORTED message in *why (static string). */
int gdp_gemm_supported_ex(gdp_ctx_t ctx, gdp_dtype_t ab_dtype, gdp_dtype_t c_dtype, const char **why);
int gdp_gemm_supported(gdp_ctx_t ctx, gdp_dtype_t dtype, const char **why);
/* The GEMM's backend state for layers on ctx: on CUDA one cuBLASLt handle and workspace
 * shared by every layer of the ctx (kept in ctx->gemm_blas, counted: the first acquire
 * creates it, the last release destroys it); a no-op on the CPU backend. Every layer holds
 * a reference, so anything that owns layers of the ctx may use the GEMM while they live. */
gdp_status_t gdp_gemm_acquire(gdp_ctx_t ctx);
void         gdp_gemm_release(gdp_ctx_t ctx);

/* ---- index-driven copies (semantics in kernels/copy_kernels.h); the index arrays
 *      live in the backend's memory (the metadata's `device` arrays) ---- */
gdp_status_t gdp_copy_rows(gdp_ctx_t ctx, const gdp_copy_rows_args *args);
gdp_status_t gdp_copy_snapshot_conv(gdp_ctx_t ctx, const gdp_copy_snapshot_conv_args *args);
gdp_status_t gdp_fill_slots(gdp_ctx_t ctx, const gdp_fill_slots_args *args);

/* CUDA half of the GEMM (src/backend_cuda.c), called by backend.c. */
gdp_status_t gdp_gemm_cuda_nt(gdp_ctx_t ctx, int64_t rows, int64_t n, int64_t k, const void *A, int64_t lda,
                              const void *B, gdp_dtype_t ab_dtype, float beta, void *C, int64_t ldc,
                              gdp_dtype_t c_dtype);
gdp_status_t gdp_gemm_cuda_acquire(gdp_ctx_t ctx);
void         gdp_gemm_cuda_release(gdp_ctx_t ctx);

#ifdef __cplusplus
}
#endif

#endif /* GDP_BACKEND_H */
