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
#include "tensor_map.h"

namespace {

template <typename T, int VP, int COPY>
cudaError_t launch_hopper(const ChunkParams &p, const HopperMaps &maps, cudaStream_t stream) {
    const size_t smem = sizeof(HopperSmem<T, VP>) + 1024; /* + the alignment of the panels */
    cudaError_t err = cudaFuncSetAttribute(chunk_hopper_kernel<T, VP, COPY>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (err != cudaSuccess)
        return err;
    if (p.N > 0 && p.H > 0)
        chunk_hopper_kernel<T, VP, COPY>
            <<<dim3(1u, (unsigned)p.H, (unsigned)p.N), HOP_THREADS, smem, stream>>>(p, maps);
    return cudaGetLastError();
}
template <typename T, int COPY>
cudaError_t launch_hopper_v(const ChunkParams &p, const HopperMaps &maps, cudaStream_t st) {
    return p.VP == 64 ? launch_hopper<T, 64, COPY>(p, maps, st) : launch_hopper<T, 128, COPY>(p, maps, st);
}

/* The copy-engine loads' maps (HopperMaps); false if the driver cannot encode them. */
bool make_hopper_maps(const ChunkParams &p, HopperMaps *m) {
    const int64_t cols = (int64_t)p.H * HOP_KP;
    return encode_tile_map(m->k, p.k, p.T * p.M, cols, WG_PANEL_COLS, CHUNK, CU_TENSOR_MAP_SWIZZLE_128B) &&
           encode_tile_map(m->v, p.v, p.T * p.M, (int64_t)p.H * p.VP, WG_PANEL_COLS, CHUNK,
                           CU_TENSOR_MAP_SWIZZLE_128B) &&
           encode_tile_map(m->q, p.q, p.T, cols, WG_PANEL_COLS, CHUNK, CU_TENSOR_MAP_SWIZZLE_128B);
}

} // namespace

bool gdp_chunk_hopper_fits(const void *chunk_params) {
    const ChunkParams &p = *static_cast<const ChunkParams *>(chunk_params);
    return p.K == HOP_KP && p.KP == HOP_KP && (p.V == 64 || p.V == 128) && p.VP == p.V && p.q_vec && p.k_vec &&
           p.v_vec && p.o_vec && p.T * p.M < ((int64_t)1 << 31); /* a sequence's expanded rows in 32 bits (hop_chunk) */
}

cudaError_t gdp_chunk_hopper_launch(const void *chunk_params, bool bf16, bool tma, cudaStream_t stream) {
    const ChunkParams &p = *static_cast<const ChunkParams *>(chunk_params);
    HopperMaps maps{};
    if (tma && make_hopper_maps(p, &maps)) /* a driver without the encoder: the threads' copies */
        return bf16 ? launch_hopper_v<__nv_bfloat16, HOP_COPY_TMA>(p, maps, stream)
                    : launch_hopper_v<__half, HOP_COPY_TMA>(p, maps, stream);
    return bf16 ? launch_hopper_v<__nv_bfloat16, HOP_COPY_THREADS>(p, maps, stream)
                : launch_hopper_v<__half, HOP_COPY_THREADS>(p, maps, stream);
}
