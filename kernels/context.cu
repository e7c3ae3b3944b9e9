/*
 * context.cu: CUDA backend set-up: device selection and validation for a gdp ctx,
 * the device memory the ctx owns (workspace, the fused decode norm's counters), and the
 * cached device facts of device_info.h.
 */
#include <cuda_runtime.h>
#include <atomic>

#include "device_info.h"
#include "gdp_kernels.h"
#include "src/cuda_check.h"
#include "src/internal.h"

// kernel launchers

extern "C" gdp_status_t gdp_cuda_ctx_init(struct gdp_ctx *ctx) {
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess)
        GDP_CUDA_FAIL(err, "gdp_ctx_init: no usable CUDA device (use GDP_BACKEND_CPU)");
    if (count == 0)
        GDP_FAIL(GDP_STATUS_CUDA_ERROR, "gdp_ctx_init: no usable CUDA device (0 devices); use GDP_BACKEND_CPU");
    if (ctx->device < 0 || ctx->device >= count)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "gdp_ctx_init: device %d does not exist (this node has %d GPUs)",
                 ctx->device, count);
    GDP_CUDA_CHECK(cudaSetDevice(ctx->device));
    return GDP_STATUS_SUCCESS;
}

extern "C" gdp_status_t gdp_cuda_ctx_free(struct gdp_ctx *ctx) {
    if (ctx->arrivals != NULL) {
        cudaFree(ctx->arrivals);
        ctx->arrivals = NULL;
    }
    if (ctx->workspace != NULL) {
        cudaFree(ctx->workspace);
        ctx->workspace = NULL;
        ctx->workspace_bytes = 0;
    }
    return GDP_STATUS_SUCCESS;
}

/* One attribute of a device, queried once per device and cached (value + 1, so that 0 marks "not
 * queried yet" and a real 0, a minor version, is cached too). */
template <cudaDeviceAttr ATTR> static cudaError_t cached_attribute(int device, int *value) {
    constexpr int MAX_DEVICES = 64;
    static std::atomic<int> cache[MAX_DEVICES];
    const bool cacheable = device >= 0 && device < MAX_DEVICES;
    int stored = cacheable ? cache[device].load(std::memory_order_relaxed) : 0;
    if (stored > 0) {
        *value = stored - 1;
        return cudaSuccess;
    }
    *value = 0;
    const cudaError_t err = cudaDeviceGetAttribute(value, ATTR, device);
    if (err == cudaSuccess && cacheable && *value >= 0)
        cache[device].store(*value + 1, std::memory_order_relaxed);
    return err;
}

cudaError_t gdp_device_sm_count(int device, int *sms) {
    return cached_attribute<cudaDevAttrMultiProcessorCount>(device, sms);
}

cudaError_t gdp_device_shared_optin(int device, int *bytes) {
    return cached_attribute<cudaDevAttrMaxSharedMemoryPerBlockOptin>(device, bytes);
}

cudaError_t gdp_device_cc(int device, int *cc) {
    int major = 0, minor = 0;
    cudaError_t err = cached_attribute<cudaDevAttrComputeCapabilityMajor>(device, &major);
    if (err == cudaSuccess)
        err = cached_attribute<cudaDevAttrComputeCapabilityMinor>(device, &minor);
    *cc = err == cudaSuccess ? 10 * major + minor : 0;
    return err;
}
