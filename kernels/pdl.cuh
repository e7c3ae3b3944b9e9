/*
 * pdl.cuh: programmatic dependent launch (sm_90), the device side and one host launcher.
 *
 * A kernel launched with cudaLaunchAttributeProgrammaticStreamSerialization may start before
 * the kernel ahead of it on the stream has finished: as soon as every block of that kernel
 * has run pdl_trigger() or exited. Whatever it does before pdl_wait() must not read what
 * the earlier kernels write, nor write what they read; pdl_wait() returns once the kernel
 * ahead has completed and its memory is visible (and so, each kernel waiting before it
 * completes, every kernel before it). Captured into a CUDA graph the launch keeps its
 * programmatic edge. On a launch without the attribute, or before sm_90, both calls are
 * no-ops and the launch is an ordinary one.
 */
#ifndef GDP_PDL_CUH
#define GDP_PDL_CUH

#include <cuda_runtime.h>

/* Let the next kernel on the stream start (if it was launched as a programmatic dependent). */
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/* Wait until the kernel ahead on the stream has completed and its writes are visible. */
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

/* Start bringing bytes [ptr, ptr + bytes) into L2 (a hint: no registers, no completion to
 * wait for). ptr 16-byte aligned, bytes a multiple of 16; sm_90 (a no-op before). */
__device__ __forceinline__ void prefetch_l2_bulk(const void *ptr, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(ptr), "r"(bytes) : "memory");
#endif
}

/* kernel<<<grid, block, smem, stream>>>(args...), as a programmatic dependent of the work ahead on
 * the stream when `dependent` (the kernel must call pdl_wait() before it touches that work's data),
 * else a plain launch; the launch's error. */
template <typename... KArgs, typename... Args>
cudaError_t launch_pdl(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                       bool dependent, Args &&...args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = dependent ? 1 : 0;
    return cudaLaunchKernelEx(&cfg, kernel, static_cast<Args &&>(args)...);
}

#endif /* GDP_PDL_CUH */
