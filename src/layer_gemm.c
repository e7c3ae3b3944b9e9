/*
 * layer_gemm.c: the backend primitives of the layer, cache and plan (layer_internal.h):
 * buffers on the ctx's backend (allocate zeroed, zero, copy, 2-D copy, upload, download)
 * and the projection GEMM C = A B^T + beta C. The CPU backend uses host memory and
 * cblas_sgemm; the CUDA backend uses the CUDA runtime on the ctx's stream for buffers,
 * and its GEMM (cuBLASLt) is not implemented yet, so it returns UNSUPPORTED.
 */
#include <string.h>

#include <cblas.h>

#include "layer_internal.h"

#ifdef GDP_HAVE_CUDA
#include <cuda_runtime_api.h>

/* Records a failing CUDA runtime call with its error string, then returns. */
#define LAYER_CUDA_CHECK(call)                                                                          \
    do {                                                                                                \
        cudaError_t layer_cuda_err_ = (call);                                                           \
        if (layer_cuda_err_ != cudaSuccess) {                                                           \
            (void)cudaGetLastError();                                                                   \
            GDP_FAIL(GDP_STATUS_CUDA_ERROR, "%s failed: %s (%s)", #call, cudaGetErrorName(layer_cuda_err_), \
                     cudaGetErrorString(layer_cuda_err_));                                              \
        }                                                                                               \
    } while (0)
#endif

static bool on_cpu(gdp_ctx_t ctx) { return ctx->backend == GDP_BACKEND_CPU; }

#ifndef GDP_HAVE_CUDA
static gdp_status_t no_cuda(const char *what) {
    GDP_FAIL(GDP_STATUS_UNSUPPORTED, "%s: this libgdp was built without the CUDA backend; use GDP_BACKEND_CPU", what);
}
#endif

gdp_status_t gdp_layer_buf_alloc(gdp_ctx_t ctx, size_t bytes, void **out, const char *what) {
    *out = NULL;
    if (on_cpu(ctx)) {
        *out = gdp_calloc(bytes ? bytes : 1, 1, what);
        return *out ? GDP_STATUS_SUCCESS : GDP_STATUS_SYSTEM_ERROR;
    }
#ifdef GDP_HAVE_CUDA
    void *p = NULL;
    cudaError_t err = cudaMalloc(&p, bytes ? bytes : 1);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        GDP_FAIL(GDP_STATUS_CUDA_ERROR, "cudaMalloc of %zu bytes for %s failed: %s; use fewer slots or tokens", bytes,
                 what, cudaGetErrorString(err));
    }
    err = cudaMemsetAsync(p, 0, bytes ? bytes : 1, (cudaStream_t)ctx->stream);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        cudaFree(p);
        GDP_FAIL(GDP_STATUS_CUDA_ERROR, "cudaMemsetAsync zeroing %s failed: %s", what, cudaGetErrorString(err));
    }
    *out = p;
    return GDP_STATUS_SUCCESS;
#else
    return no_cuda(what);
#endif
}

void gdp_layer_buf_free(gdp_ctx_t ctx, void *buf) {
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

gdp_status_t gdp_layer_buf_zero(gdp_ctx_t ctx, void *buf, size_t bytes) {
    if (bytes == 0)
        return GDP_STATUS_SUCCESS;
    if (on_cpu(ctx)) {
        memset(buf, 0, bytes);
        return GDP_STATUS_SUCCESS;
    }
#ifdef GDP_HAVE_CUDA
    LAYER_CUDA_CHECK(cudaMemsetAsync(buf, 0, bytes, (cudaStream_t)ctx->stream));
    return GDP_STATUS_SUCCESS;
#else
    return no_cuda("gdp_layer_buf_zero");
#endif
}

gdp_status_t gdp_layer_buf_copy(gdp_ctx_t ctx, void *dst, const void *src, size_t bytes) {
    if (bytes == 0 || dst == src)
        return GDP_STATUS_SUCCESS;
    if (on_cpu(ctx)) {
        memcpy(dst, src, bytes);
        return GDP_STATUS_SUCCESS;
    }
#ifdef GDP_HAVE_CUDA
    LAYER_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, (cudaStream_t)ctx->stream));
    return GDP_STATUS_SUCCESS;
#else
    return no_cuda("gdp_layer_buf_copy");
#endif
}

gdp_status_t gdp_layer_buf_copy2d(gdp_ctx_t ctx, void *dst, size_t dpitch, const void *src, size_t spitch,
                                  size_t width, size_t rows) {
    if (width == 0 || rows == 0)
        return GDP_STATUS_SUCCESS;
    if (on_cpu(ctx)) {
        for (size_t r = 0; r < rows; r++)
            memcpy((char *)dst + r * dpitch, (const char *)src + r * spitch, width);
        return GDP_STATUS_SUCCESS;
    }
#ifdef GDP_HAVE_CUDA
    LAYER_CUDA_CHECK(cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, rows, cudaMemcpyDeviceToDevice,
                                       (cudaStream_t)ctx->stream));
    return GDP_STATUS_SUCCESS;
#else
    return no_cuda("gdp_layer_buf_copy2d");
#endif
}

gdp_status_t gdp_layer_buf_upload(gdp_ctx_t ctx, void *dst, const void *host_src, size_t bytes) {
    if (bytes == 0)
        return GDP_STATUS_SUCCESS;
    if (on_cpu(ctx)) {
        memcpy(dst, host_src, bytes);
        return GDP_STATUS_SUCCESS;
    }
#ifdef GDP_HAVE_CUDA
    LAYER_CUDA_CHECK(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, (cudaStream_t)ctx->stream));
    /* The host buffer is rewritten next step: the copy must have read it by then. */
    LAYER_CUDA_CHECK(cudaStreamSynchronize((cudaStream_t)ctx->stream));
    return GDP_STATUS_SUCCESS;
#else
    return no_cuda("gdp_layer_buf_upload");
#endif
}

gdp_status_t gdp_layer_buf_download(gdp_ctx_t ctx, void *host_dst, const void *src, size_t bytes) {
    if (bytes == 0)
        return GDP_STATUS_SUCCESS;
    if (on_cpu(ctx)) {
        memcpy(host_dst, src, bytes);
        return GDP_STATUS_SUCCESS;
    }
#ifdef GDP_HAVE_CUDA
    LAYER_CUDA_CHECK(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, (cudaStream_t)ctx->stream));
    LAYER_CUDA_CHECK(cudaStreamSynchronize((cudaStream_t)ctx->stream));
    return GDP_STATUS_SUCCESS;
#else
    return no_cuda("gdp_layer_buf_download");
#endif
}

int gdp_layer_gemm_supported(gdp_ctx_t ctx, gdp_dtype_t dtype, const char **why) {
    if (on_cpu(ctx)) {
        if (dtype == GDP_DTYPE_FP32)
            return 1;
        *why = "the CPU backend's projections run in fp32 (cblas_sgemm): pass fp32 activations";
        return 0;
    }
    *why = "the CUDA backend's projection GEMMs (cuBLASLt) are not implemented yet: run the layer on "
           "GDP_BACKEND_CPU";
    return 0;
}

gdp_status_t gdp_layer_gemm_nt(gdp_ctx_t ctx, int64_t rows, int64_t n, int64_t k, const void *A, int64_t lda,
                               const void *B, float beta, void *C, int64_t ldc, gdp_dtype_t dtype) {
    const char *why = NULL;
    if (!gdp_layer_gemm_supported(ctx, dtype, &why))
        GDP_FAIL(GDP_STATUS_UNSUPPORTED, "gdp_layer_gemm_nt: %s", why);
    if (rows == 0 || n == 0)
        return GDP_STATUS_SUCCESS;
    if (rows > INT32_MAX || n > INT32_MAX || k > INT32_MAX || lda > INT32_MAX || ldc > INT32_MAX)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                 "gdp_layer_gemm_nt: sizes %lld x %lld x %lld exceed the BLAS int range; use fewer tokens per step",
                 (long long)rows, (long long)n, (long long)k);
    /* Row-major C[rows, n] = A[rows, k] . B[n, k]^T: B is the [out, in] weight as stored. */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)rows, (int)n, (int)k, 1.0f, (const float *)A, (int)lda,
                (const float *)B, (int)k, beta, (float *)C, (int)ldc);
    return GDP_STATUS_SUCCESS;
}
