/*
 * hopper.cu: the translation unit of the chunk op's one-pass Hopper kernel (hopper.cuh), compiled
 * for sm_90a alone (CMakeLists.txt: its own object library), and its two entry points (hopper.h).
 * launch.cu takes this path under GDP_CHUNK_PATH=hopper on a compute capability 9.0 device.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "hopper.cuh"
#include "hopper.h"

namespace {

template <typename T> cudaError_t launch_hopper(const ChunkParams &p, cudaStream_t stream) {
    const size_t smem = sizeof(HopperSmem<T>) + 1024; /* + the alignment of the panels */
    cudaError_t err =
        cudaFuncSetAttribute(chunk_hopper_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (err != cudaSuccess)
        return err;
    if (p.N > 0 && p.H > 0)
        chunk_hopper_kernel<T><<<dim3(1u, (unsigned)p.H, (unsigned)p.N), HOP_THREADS, smem, stream>>>(p);
    return cudaGetLastError();
}

} // namespace

bool gdp_chunk_hopper_fits(const void *chunk_params) {
    const ChunkParams &p = *static_cast<const ChunkParams *>(chunk_params);
    return p.K == HOP_KP && p.V == HOP_VP && p.KP == HOP_KP && p.VP == HOP_VP && p.q_vec && p.k_vec && p.v_vec &&
           p.o_vec && p.T * p.M < ((int64_t)1 << 31); /* a sequence's expanded rows in 32 bits (hop_chunk) */
}

cudaError_t gdp_chunk_hopper_launch(const void *chunk_params, bool bf16, cudaStream_t stream) {
    const ChunkParams &p = *static_cast<const ChunkParams *>(chunk_params);
    return bf16 ? launch_hopper<__nv_bfloat16>(p, stream) : launch_hopper<__half>(p, stream);
}
