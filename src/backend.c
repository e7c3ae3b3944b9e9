/*
 * backend.c: the backend primitives of the layer, cache, plan, model and engine (backend.h):
 * buffers on the ctx's backend (allocate zeroed, zero, copy, 2-D copy, upload, download),
 * the projection GEMM C = A B^T + beta C, and the copies driven by the step's index arrays
 * (row gathers by slot, a snapshot's conv window, a step's slot fills). The CPU backend
 * uses host memory, cblas_sgemm and the plain loops below; the CUDA backend uses the CUDA
 * runtime on the ctx's stream for buffers, cuBLASLt for the GEMM (backend_cuda.c) and the
 * kernels of kernels/copy_kernels.cu, none of which synchronizes the host.
 */
#include <string.h>

#include <cblas.h>

#include "backend.h"
#include "phase.h"

#ifdef GDP_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "cuda_check.h"
#include "kernels/copy_kernels.h"
#endif

static bool on_cpu(gdp_ctx_t ctx) { return ctx->backend == GDP_BACKEND_CPU; }

#ifndef GDP_HAVE_CUDA
static gdp_status_t no_cuda(const char *what) {
    GDP_FAIL(GDP_STATUS_UNSUPPORTED, "%s: this libgdp was built without the CUDA backend; use GDP_BACKEND_CPU", what);
}
#endif

gdp_status_t gdp_buf_alloc(gdp_ctx_t ctx, size_t bytes, void **out, const char *what) {
    *out = NULL;
    if (on_cpu(ctx)) {
        *out = gdp_calloc(bytes ? bytes : 1, 1, what);
        return *out ? GDP_STATUS_SUCCESS : GDP_STATUS_SYSTEM_ERROR;
    }
#ifdef GDP_HAVE_CUDA
    void *p = NULL;
    cudaError_t err = cudaMalloc(&p, bytes ? bytes : 1);
    if (err != cudaSuccess)
        GDP_CUDA_FAIL(err, "cudaMalloc of %zu bytes for %s failed (use fewer slots or tokens)", bytes, what);
    err = cudaMemsetAsync(p, 0, bytes ? bytes : 1, (cudaStream_t)ctx->stream);
    if (err != cudaSuccess) {
        cudaFree(p);
        GDP_CUDA_FAIL(err, "cudaMemsetAsync zeroing %s failed", what);
    }
    *out = p;
    return GDP_STATUS_SUCCESS;
#else
    return no_cuda(what);
#endif
}

void gdp_buf_free(gdp_ctx_t ctx, void *buf) {
    if (buf == NULL)
        return;
    if (on_cpu(ctx)) {
        free(buf);
        return;
    }
#ifdef GDP_HAVE_CUDA
    (void)cudaFree(buf); /* teardown: a failure here has nobody left to report to */
#endif
}

gdp_status_t gdp_buf_zero(gdp_ctx_t ctx, void *buf, size_t bytes) {
    if (bytes == 0)
        return GDP_STATUS_SUCCESS;
    if (on_cpu(ctx)) {
        memset(buf, 0, bytes);
        return GDP_STATUS_SUCCESS;
    }
#ifdef GDP_HAVE_CUDA
    GDP_CUDA_CHECK(cudaMemsetAsync(buf, 0, bytes, (cudaStream_t)ctx->stream));
    return GDP_STATUS_SUCCESS;
#else
    return no_cuda("gdp_buf_zero");
#endif
}

/* Which memories a copy joins (the CUDA backend's copy kind). */
typedef enum { BUF_DEVICE_TO_DEVICE, BUF_HOST_TO_DEVICE, BUF_DEVICE_TO_HOST } buf_dir;

/* One copy of `bytes` on the ctx's backend: memcpy on the CPU; on CUDA a cudaMemcpyAsync on
 * the ctx's stream, then a wait when the host side is reused or read next. op names the
 * public call in a failure. */
static gdp_status_t buf_move(gdp_ctx_t ctx, void *dst, const void *src, size_t bytes, buf_dir dir, bool wait,
                             const char *op) {
    if (bytes == 0)
        return GDP_STATUS_SUCCESS;
    if (on_cpu(ctx)) {
        memcpy(dst, src, bytes);
        return GDP_STATUS_SUCCESS;
    }
#ifdef GDP_HAVE_CUDA
    const enum cudaMemcpyKind kind = dir == BUF_HOST_TO_DEVICE   ? cudaMemcpyHostToDevice
                                     : dir == BUF_DEVICE_TO_HOST ? cudaMemcpyDeviceToHost
                                                                 : cudaMemcpyDeviceToDevice;
    cudaError_t err = cudaMemcpyAsync(dst, src, bytes, kind, (cudaStream_t)ctx->stream);
    if (err == cudaSuccess && wait)
        err = cudaStreamSynchronize((cudaStream_t)ctx->stream);
    if (err != cudaSuccess)
        GDP_CUDA_FAIL(err, "%s: copying %zu bytes failed", op, bytes);
    return GDP_STATUS_SUCCESS;
#else
    (void)dir, (void)wait;
    return no_cuda(op);
#endif
}

gdp_status_t gdp_buf_copy(gdp_ctx_t ctx, void *dst, const void *src, size_t bytes) {
    if (dst == src)
        return GDP_STATUS_SUCCESS;
    return buf_move(ctx, dst, src, bytes, BUF_DEVICE_TO_DEVICE, false, "gdp_buf_copy");
}

gdp_status_t gdp_buf_copy2d(gdp_ctx_t ctx, void *dst, size_t dpitch, const void *src, size_t spitch,
                            size_t width, size_t rows) {
    if (width == 0 || rows == 0)
        return GDP_STATUS_SUCCESS;
    if (on_cpu(ctx)) {
        for (size_t r = 0; r < rows; r++)
            memcpy((char *)dst + r * dpitch, (const char *)src + r * spitch, width);
        return GDP_STATUS_SUCCESS;
    }
#ifdef GDP_HAVE_CUDA
    GDP_CUDA_CHECK(cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, rows, cudaMemcpyDeviceToDevice,
                                     (cudaStream_t)ctx->stream));
    return GDP_STATUS_SUCCESS;
#else
    return no_cuda("gdp_buf_copy2d");
#endif
}

/* The host buffer is rewritten next step: the copy must have read it by then. */
gdp_status_t gdp_buf_upload(gdp_ctx_t ctx, void *dst, const void *host_src, size_t bytes) {
    return buf_move(ctx, dst, host_src, bytes, BUF_HOST_TO_DEVICE, true, "gdp_buf_upload");
}

gdp_status_t gdp_buf_download(gdp_ctx_t ctx, void *host_dst, const void *src, size_t bytes) {
    return buf_move(ctx, host_dst, src, bytes, BUF_DEVICE_TO_HOST, true, "gdp_buf_download");
}

int gdp_gemm_supported_ex(gdp_ctx_t ctx, gdp_dtype_t ab_dtype, gdp_dtype_t c_dtype, const char **why) {
    if (on_cpu(ctx)) {
        if (ab_dtype == GDP_DTYPE_FP32 && c_dtype == GDP_DTYPE_FP32)
            return 1;
        *why = "the CPU backend's projections run in fp32 (cblas_sgemm): pass fp32 activations and weights";
        return 0;
    }
#ifdef GDP_HAVE_CUDA
    if ((ab_dtype == GDP_DTYPE_BF16 || ab_dtype == GDP_DTYPE_FP16) &&
        (c_dtype == GDP_DTYPE_FP32 || c_dtype == ab_dtype))
        return 1;
    if (ab_dtype == GDP_DTYPE_FP32 && c_dtype == GDP_DTYPE_FP32)
        return 1;
    *why = "the CUDA backend's GEMMs (cuBLASLt) take bf16 or fp16 inputs with an fp32 or same-dtype output, or fp32 "
           "throughout";
    return 0;
#else
    *why = "this libgdp was built without the CUDA backend; use GDP_BACKEND_CPU";
    return 0;
#endif
}

gdp_status_t gdp_gemm_acquire(gdp_ctx_t ctx) {
    if (on_cpu(ctx))
        return GDP_STATUS_SUCCESS;
    return gdp_gemm_cuda_acquire(ctx);
}

void gdp_gemm_release(gdp_ctx_t ctx) {
    if (!on_cpu(ctx))
        gdp_gemm_cuda_release(ctx);
}

int gdp_gemm_supported(gdp_ctx_t ctx, gdp_dtype_t dtype, const char **why) {
    return gdp_gemm_supported_ex(ctx, dtype, dtype, why);
}

gdp_status_t gdp_gemm_nt(gdp_ctx_t ctx, int64_t rows, int64_t n, int64_t k, const void *A, int64_t lda,
                         const void *B, float beta, void *C, int64_t ldc, gdp_dtype_t dtype) {
    return gdp_gemm_nt_ex(ctx, rows, n, k, A, lda, B, dtype, beta, C, ldc, dtype);
}

gdp_status_t gdp_gemm_nt_ex(gdp_ctx_t ctx, int64_t rows, int64_t n, int64_t k, const void *A, int64_t lda,
                            const void *B, gdp_dtype_t ab_dtype, float beta, void *C, int64_t ldc,
                            gdp_dtype_t c_dtype) {
    const char *why = NULL;
    if (!gdp_gemm_supported_ex(ctx, ab_dtype, c_dtype, &why))
        GDP_FAIL(GDP_STATUS_UNSUPPORTED, "gdp_gemm_nt: %s", why);
    if (rows == 0 || n == 0)
        return GDP_STATUS_SUCCESS;
    gdp_phase_mark(ctx, GDP_MARK_GEMM); /* measured phases (phase.h): the GEMM, then back to ops */
    if (!on_cpu(ctx)) {
        const gdp_status_t st = gdp_gemm_cuda_nt(ctx, rows, n, k, A, lda, B, ab_dtype, beta, C, ldc, c_dtype);
        gdp_phase_mark(ctx, GDP_MARK_OPS);
        return st;
    }
    if (rows > INT32_MAX || n > INT32_MAX || k > INT32_MAX || lda > INT32_MAX || ldc > INT32_MAX)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                 "gdp_gemm_nt: sizes %lld x %lld x %lld exceed the BLAS int range; use fewer tokens per step",
                 (long long)rows, (long long)n, (long long)k);
    /* Row-major C[rows, n] = A[rows, k] . B[n, k]^T: B is the [out, in] weight as stored. */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)rows, (int)n, (int)k, 1.0f, (const float *)A, (int)lda,
                (const float *)B, (int)k, beta, (float *)C, (int)ldc);
    gdp_phase_mark(ctx, GDP_MARK_OPS);
    return GDP_STATUS_SUCCESS;
}

/* ---- index-driven copies: CPU loops with the semantics of kernels/copy_kernels.h ---- */

gdp_status_t gdp_copy_rows(gdp_ctx_t ctx, const gdp_copy_rows_args *a) {
    if (!on_cpu(ctx)) {
#ifdef GDP_HAVE_CUDA
        return gdp_cuda_copy_rows(ctx, a);
#else
        return no_cuda("gdp_copy_rows");
#endif
    }
    for (int64_t i = 0; i < a->n; i++) {
        const int64_t d = a->dst_idx ? a->dst_idx[i] : i, s = a->src_idx ? a->src_idx[i] : i;
        if (d < 0 || d >= a->dst_rows)
            continue;
        char *dst = (char *)a->dst + (size_t)d * a->row_bytes;
        if (s >= 0 && s < a->src_rows)
            memcpy(dst, (const char *)a->src + (size_t)s * a->row_bytes, a->row_bytes);
        else if (a->zero_missing)
            memset(dst, 0, a->row_bytes);
    }
    return GDP_STATUS_SUCCESS;
}

gdp_status_t gdp_copy_snapshot_conv(gdp_ctx_t ctx, const gdp_copy_snapshot_conv_args *a) {
    if (!on_cpu(ctx)) {
#ifdef GDP_HAVE_CUDA
        return gdp_cuda_copy_snapshot_conv(ctx, a);
#else
        return no_cuda("gdp_copy_snapshot_conv");
#endif
    }
    const int64_t C = a->channels, W = a->width;
    for (int64_t i = 0; i < a->n; i++) {
        const int64_t snap = a->snapshot[i], slot = a->slots[i], off = a->offset[i], start = a->cu_seqlens[i];
        if (snap < 0 || snap >= a->n_snapshots)
            continue;
        const bool have_slot = slot >= 0 && slot < a->n_slots;
        for (int64_t c = 0; c < C; c++)
            for (int64_t j = 0; j < W; j++) {
                const int64_t u = off + j; /* position in (window ++ tokens) */
                double v = 0.0;
                if (u >= W)
                    v = gdp_load_elem(a->x, a->x_dtype, (start + u - W) * a->x_pitch + c);
                else if (have_slot)
                    v = gdp_load_elem(a->conv, a->conv_dtype, (slot * C + c) * W + u);
                gdp_store_elem(a->snap_conv, a->conv_dtype, (snap * C + c) * W + j, v);
            }
    }
    return GDP_STATUS_SUCCESS;
}

gdp_status_t gdp_fill_slots(gdp_ctx_t ctx, const gdp_fill_slots_args *a) {
    if (!on_cpu(ctx)) {
#ifdef GDP_HAVE_CUDA
        return gdp_cuda_fill_slots(ctx, a);
#else
        return no_cuda("gdp_fill_slots");
#endif
    }
    const int32_t L = a->num_layers;
    for (int32_t k = 0; k < a->n_ops; k++) {
        const int32_t slot = a->ops[3 * k], source = a->ops[3 * k + 1], row = a->ops[3 * k + 2];
        if (slot < 0 || slot >= a->n_slots)
            continue;
        for (int32_t l = 0; l < L; l++)
            for (int part = 0; part < 2; part++) {
                const size_t bytes = part ? a->conv_bytes : a->ssm_bytes;
                char *dst = a->tables[(part ? GDP_FILL_CONV : GDP_FILL_SSM) * L + l];
                const char *src = NULL;
                if (source == GDP_FILL_FROM_DRAFT && row >= 0 && row < a->draft_rows)
                    src = a->tables[(part ? GDP_FILL_DRAFT_CONV : GDP_FILL_DRAFT_SSM) * L + l];
                else if (source == GDP_FILL_FROM_SNAPSHOT && row >= 0 && row < a->n_snapshots)
                    src = a->tables[(part ? GDP_FILL_SNAP_CONV : GDP_FILL_SNAP_SSM) * L + l];
                else if (source != GDP_FILL_ZERO)
                    continue;
                if (dst == NULL || (source != GDP_FILL_ZERO && src == NULL))
                    continue;
                if (src == NULL)
                    memset(dst + (size_t)slot * bytes, 0, bytes);
                else
                    memcpy(dst + (size_t)slot * bytes, src + (size_t)row * bytes, bytes);
            }
    }
    return GDP_STATUS_SUCCESS;
}
