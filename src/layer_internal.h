/*
 * layer_internal.h: what the layer, the state cache and the step plan share inside the
 * library: the cache's struct (the plan validates steps against its slot state), and the
 * backend primitives they need beyond the ops: buffers on the ctx's backend (allocate
 * zeroed, zero, copy, 2-D copy, upload from the host), the projection GEMM, and the row
 * copies driven by the step's index arrays (src/layer_gemm.c; the CUDA halves are
 * src/layer_cuda.c for cuBLASLt and kernels/layer_util.cu for the index-driven copies).
 * Keeping these few primitives behind the ctx lets layer.c, cache.c and plan.c stay the
 * same code on both backends.
 */
#ifndef GDP_LAYER_INTERNAL_H
#define GDP_LAYER_INTERNAL_H

#include "gdp/cache.h"
#include "gdp/plan.h"
#include "internal.h"
#include "kernels/gdp_layer_kernels.h" /* defines: gdp_layer_copy_rows_args and the other copy args */

#ifdef __cplusplus
extern "C" {
#endif

#define GDP_CACHE_MAGIC 0x67647073u /* "gdps" */

struct gdp_cache {
    uint32_t         magic;
    uint64_t         serial;      /* n-th cache this process made: alike on every rank of an
                                   * SPMD job, unlike the address (the layer's pairing check) */
    gdp_ctx_t        ctx;
    gdp_cache_config cfg;
    size_t           ssm_bytes;   /* one slot's ssm state of one layer: H_t*K*V elements  */
    size_t           conv_bytes;  /* one slot's conv state of one layer: conv_dim_t*W     */
    void           **ssm;         /* [num_layers] -> [n_slots, H_t, K, V]                 */
    void           **conv;        /* [num_layers] -> [n_slots, conv_dim_t, W]             */
    void           **draft_ssm;   /* [num_layers] -> [n_slots * S_max * ssm] or NULL      */
    void           **draft_conv;  /* [num_layers] -> [n_slots * S_max * conv] or NULL     */
    void           **snap_ssm;    /* [num_layers] -> [n_snapshots, H_t, K, V] or NULL     */
    void           **snap_conv;   /* [num_layers] -> [n_snapshots, conv_dim_t, W] or NULL */
    uint8_t         *slot_used;   /* [n_slots] host bookkeeping, identical on every rank  */
    int32_t         *draft_tokens;/* [n_slots] S of the slot's pending draft step, 0: none */
    uint8_t         *snap_saved;  /* [n_snapshots]                                        */
    uint64_t         generation;  /* bumped by every applied step                         */
    void           **fill_tables; /* [GDP_FILL_TABLES * num_layers] the buffers above, in the
                                     backend's memory (device on CUDA) for gdp_layer_cache_fill */
    uint32_t         magic_end;
};

/* Validates a cache handle. */
gdp_status_t gdp_cache_check_handle(const struct gdp_cache *cache, const char *op);

/* ---- buffers on the ctx's backend (host memory on CPU, device memory on CUDA) ---- */
/* Allocates `bytes` zeroed bytes; *out = NULL and an error naming `what` on failure. */
gdp_status_t gdp_layer_buf_alloc(gdp_ctx_t ctx, size_t bytes, void **out, const char *what);
/* Frees a buffer of gdp_layer_buf_alloc (NULL is a no-op). */
void         gdp_layer_buf_free(gdp_ctx_t ctx, void *buf);
gdp_status_t gdp_layer_buf_zero(gdp_ctx_t ctx, void *buf, size_t bytes);
/* dst and src are buffers of the backend; they may not overlap. */
gdp_status_t gdp_layer_buf_copy(gdp_ctx_t ctx, void *dst, const void *src, size_t bytes);
/* rows rows of width bytes from src (pitch spitch bytes) to dst (pitch dpitch bytes). */
gdp_status_t gdp_layer_buf_copy2d(gdp_ctx_t ctx, void *dst, size_t dpitch, const void *src, size_t spitch,
                                  size_t width, size_t rows);
/* Host memory -> a backend buffer (a plain copy on the CPU backend). */
gdp_status_t gdp_layer_buf_upload(gdp_ctx_t ctx, void *dst, const void *host_src, size_t bytes);
/* A backend buffer -> host memory; waits for the ctx's stream on CUDA. */
gdp_status_t gdp_layer_buf_download(gdp_ctx_t ctx, void *host_dst, const void *src, size_t bytes);

/* The projection GEMM of the layer: C[rows, n] = A[rows, k] . B[n, k]^T + beta * C,
 * row-major, A with row pitch lda elements, B (the weight) contiguous [n, k], C with row
 * pitch ldc; A and B in ab_dtype, C in c_dtype. CPU backend: all fp32 (cblas_sgemm). CUDA
 * backend (cuBLASLt on the ctx's stream, src/layer_cuda.c; needs the ctx's GEMM state, see
 * gdp_layer_gemm_acquire): A and B bf16 or fp16 with C fp32 or ab_dtype, or all fp32;
 * fp32 accumulation always (no TF32). C may be updated in place (beta = 1 adds A B^T). */
gdp_status_t gdp_layer_gemm_nt_ex(gdp_ctx_t ctx, int64_t rows, int64_t n, int64_t k, const void *A, int64_t lda,
                                  const void *B, gdp_dtype_t ab_dtype, float beta, void *C, int64_t ldc,
                                  gdp_dtype_t c_dtype);
/* The same with every operand in `dtype`. */
gdp_status_t gdp_layer_gemm_nt(gdp_ctx_t ctx, int64_t rows, int64_t n, int64_t k, const void *A, int64_t lda,
                               const void *B, float beta, void *C, int64_t ldc, gdp_dtype_t dtype);
/* 1 if gdp_layer_gemm_nt_ex runs on this ctx's backend with these dtypes, else 0 and an
 * UNSUPPORTED message in *why (static string). */
int gdp_layer_gemm_supported_ex(gdp_ctx_t ctx, gdp_dtype_t ab_dtype, gdp_dtype_t c_dtype, const char **why);
int gdp_layer_gemm_supported(gdp_ctx_t ctx, gdp_dtype_t dtype, const char **why);
/* The GEMM's backend state for layers on ctx: on CUDA one cuBLASLt handle and workspace
 * shared by every layer of the ctx (kept in ctx->layer_blas, counted: the first acquire
 * creates it, the last release destroys it); a no-op on the CPU backend. Every layer holds
 * a reference, so anything that owns layers of the ctx may use the GEMM while they live. */
gdp_status_t gdp_layer_gemm_acquire(gdp_ctx_t ctx);
void         gdp_layer_gemm_release(gdp_ctx_t ctx);

/* ---- index-driven copies (semantics in kernels/gdp_layer_kernels.h); the index arrays
 *      live in the backend's memory (the metadata's `device` arrays) ---- */
gdp_status_t gdp_layer_copy_rows(gdp_ctx_t ctx, const gdp_layer_copy_rows_args *args);
gdp_status_t gdp_layer_snapshot_conv(gdp_ctx_t ctx, const gdp_layer_snapshot_conv_args *args);
gdp_status_t gdp_layer_cache_fill(gdp_ctx_t ctx, const gdp_layer_cache_fill_args *args);

/* ---- the plan's internal part of a step's metadata ---- */
/* The step's slot fills (gdp_layer_cache_fill_args.ops: [count][3] int32, distinct slots,
 * in the order of gdp_cache_apply_step), in host memory and in the backend's copy of the
 * metadata buffer. INVALID_ARGUMENT when meta holds no fill section (not from gdp_plan_build). */
gdp_status_t gdp_plan_meta_fills(const gdp_step_metadata *meta, const int32_t **host, const int32_t **device,
                                 int32_t *count);

/* CUDA half of the GEMM (src/layer_cuda.c), called by layer_gemm.c. */
gdp_status_t gdp_layer_cuda_gemm_nt(gdp_ctx_t ctx, int64_t rows, int64_t n, int64_t k, const void *A, int64_t lda,
                                    const void *B, gdp_dtype_t ab_dtype, float beta, void *C, int64_t ldc,
                                    gdp_dtype_t c_dtype);
gdp_status_t gdp_layer_cuda_gemm_acquire(gdp_ctx_t ctx);
void         gdp_layer_cuda_gemm_release(gdp_ctx_t ctx);

#ifdef __cplusplus
}
#endif

#endif /* GDP_LAYER_INTERNAL_H */
