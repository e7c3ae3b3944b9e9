/*
 * gemv.h: the projection GEMM for a few rows (decode at small batch): C[rows, n] = A[rows, k]
 * B[n, k]^T + beta C with 16-bit A and B, fp32 accumulation and C fp32 or A's dtype
 * (kernels/gemv.cu): the weight B read once, 16 bytes a lane with several loads in flight, for
 * rows <= GDP_GEMV_MAX_ROWS. src/backend_cuda.c runs it by default at up to GDP_GEMV_AUTO_ROWS
 * rows (GDP_GEMM_SKINNY=on: up to GDP_GEMV_MAX_ROWS): with a trip's loads all issued before its
 * multiplies (gemv_math.cuh's fence) it streams the weight at a plain read's rate at one and two
 * rows and beats cuBLASLt there, and loses to it from four rows on (kernels/NOTES-ops.md,
 * "Skinny GEMM" and the thirty-fifth session).
 * The norm-GEMV is the same product with its input's norm folded in (the layer's pre-RMSNorm
 * before in_proj, its grouped gated RMSNorm before out_proj): one launch instead of two, the
 * norm's output kept in shared memory, each warp's weight loads issued before the norm is formed
 * (and, launched as a programmatic dependent, before it waits for the kernels ahead:
 * kernels/pdl.cuh). src/decode_core.c takes it by default only for the gated norm at one or two
 * rows, where it was measured faster than the two ops (kernels/NOTES-ops.md).
 * The GEMV with the decode front as its epilogue (in_proj's output read by the conv update and the
 * decode prepare without a launch of their own) is kernels/gemv_front.cu, behind
 * gdp_gemm_decode_front (src/decode_core.h).
 */
#ifndef GDP_GEMV_H
#define GDP_GEMV_H

#include <stdint.h>

#include "gdp/gdp.h"
#include "gdp/ops.h" /* the front's argument structs */

#ifdef __cplusplus
extern "C" {
#endif

#define GDP_GEMV_MAX_ROWS 8
#define GDP_GEMV_AUTO_ROWS 2 /* the rows GDP_GEMM_SKINNY=auto sends to it */

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

/* The norm-GEMV: C[r, j] = sum_i A[r, i] B[j, i] (+ beta C[r, j]) with A = the norm of x rounded
 * to B's dtype, as gdp_rmsnorm (RMS: one vector a row of k) or gdp_gated_rmsnorm (GATED: x is y,
 * gated by z, vectors of `group` elements) would write it. */
typedef enum { GDP_NORM_GEMV_RMS = 0, GDP_NORM_GEMV_GATED = 1 } gdp_norm_gemv_kind;

#define GDP_NORM_GEMV_MAX_SMEM (96 * 1024) /* rows * k * 2 bytes: the norm's rows in shared memory */

typedef struct gdp_norm_gemv_args {
    gdp_norm_gemv_kind kind;
    int64_t rows, k, group;  /* group: elements a norm vector (GATED; RMS normalizes whole rows) */
    const void *x;           /* [rows, k], x_row elements apart (RMS: x; GATED: y)          */
    gdp_dtype_t x_dtype;
    int64_t x_row;
    const void *z;           /* GATED: the gate, like y, z_row elements apart                 */
    gdp_dtype_t z_dtype;
    int64_t z_row;
    const void *norm_weight; /* [k] */
    gdp_dtype_t w_dtype;
    double eps;
    int64_t n;               /* columns of C: rows of B [n, k]                               */
    const void *B;
    gdp_dtype_t ab_dtype;
    float beta;
    void *C;
    int64_t ldc;
    gdp_dtype_t c_dtype;
} gdp_norm_gemv_args;

/* Whether gdp_cuda_norm_gemv takes these arguments: bf16 B (the CUDA layer's weights), C in B's
 * dtype (or fp32 for GATED), 1 <= rows <= GDP_GEMV_MAX_ROWS, rows * k * 2 <= GDP_NORM_GEMV_MAX_SMEM,
 * the norm on its fast path with at most two 8-element chunks a thread, 16-byte aligned rows. */
int gdp_cuda_norm_gemv_fits(const gdp_norm_gemv_args *a);

/* The norm-GEMV on the ctx's stream, one launch; pdl: as a programmatic dependent of the work
 * ahead (kernels/pdl.cuh). The same bits as the norm op followed by gdp_cuda_gemv_nt. The caller
 * checked gdp_cuda_norm_gemv_fits. */
gdp_status_t gdp_cuda_norm_gemv(struct gdp_ctx *ctx, const gdp_norm_gemv_args *a, int pdl);

/* in_proj's GEMV for decode rows with the decode front as its epilogue (kernels/gemv_front.cu):
 * C = A B^T (gdp_cuda_gemv_nt's sums, C in A's dtype, beta 0), then what
 * gdp_decode_conv_prepare(conv, prep) computes when conv->x and prep->ba are column views of C
 * (one token a request): query, key, value, beta, g and the conv state, bit for bit; conv->y is
 * not written. */
typedef struct gdp_gemv_front_args {
    int64_t rows, n, k;
    const void *A;
    int64_t lda;
    const void *B;
    gdp_dtype_t ab_dtype;
    void *C;
    int64_t ldc;
    const gdp_conv1d_update_args *conv; /* conv->x [rows, 1, channels]: columns of C, pitch ldc */
    const gdp_prepare_args *prep;       /* prep->ba [rows, 1, (M + 1) H]: columns of C          */
} gdp_gemv_front_args;

/* Whether gdp_cuda_gemv_front takes these arguments: gdp_cuda_gemv_fits (C in A's dtype), conv->x
 * and prep->ba views of C's rows (its dtype and pitch) inside its n columns, one token a request,
 * conv width 4 without snapshots, the front's channel layout (value, key, query: M H P + M G N +
 * G N channels), query, key, value and beta in C's dtype. The front ops' own rules are the
 * caller's (gdp_gemm_decode_front checks them first). */
int gdp_cuda_gemv_front_fits(const gdp_gemv_front_args *a);

/* The one launch on the ctx's stream. The caller checked gdp_cuda_gemv_front_fits. */
gdp_status_t gdp_cuda_gemv_front(struct gdp_ctx *ctx, const gdp_gemv_front_args *a);

#ifdef __cplusplus
}
#endif

#endif /* GDP_GEMV_H */
