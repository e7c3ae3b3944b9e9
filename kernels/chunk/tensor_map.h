/*
 * tensor_map.h: 2-D tensor maps of 16-bit row-major matrices for the copy engine (sm_90 TMA), host
 * side: the driver's cuTensorMapEncodeTiled found once through the runtime (no link to libcuda), and
 * one encoder for a [rows][cols] matrix copied in boxes of box_rows x box_cols. Used by the state
 * sweep's producer (stages.cuh, no swizzle), the Hopper kernel's loads (hopper.cu),
 * kernels/dev/wgmma_check.cu (both with the 128-byte swizzle of wgmma.cuh's panel layout) and the
 * split-k GEMM's stages (kernels/gemm_splitk.cu, 128-byte swizzle, row pitches wider than k).
 */
#ifndef GDP_CHUNK_TENSOR_MAP_H
#define GDP_CHUNK_TENSOR_MAP_H

#include <cuda.h> /* CUtensorMap and its enums */
#include <cudaTypedefs.h>
#include <cuda_runtime.h>
#include <stdint.h>

/* cuTensorMapEncodeTiled from the driver, or null if it has none. */
inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
    static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
        void *f = nullptr;
        cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q) != cudaSuccess ||
            q != cudaDriverEntryPointSuccess)
            f = nullptr;
        return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
    }();
    return fn;
}

/* A map of a row-major [rows][cols] matrix of 16-bit elements at base, rows ld elements apart (0:
 * cols), whose copies are boxes of box_rows x box_cols, landing with the given swizzle; elements
 * outside the matrix read as zeros. False if the driver has no encoder or refuses the map. */
inline bool encode_tile_map(void *map, const void *base, int64_t rows, int64_t cols, int box_cols, int box_rows,
                            CUtensorMapSwizzle swizzle = CU_TENSOR_MAP_SWIZZLE_NONE, int64_t ld = 0) {
    const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
    if (encode == nullptr)
        return false;
    const cuuint64_t dim[2] = {(cuuint64_t)cols, (cuuint64_t)rows};
    const cuuint64_t stride[1] = {(cuuint64_t)(ld > 0 ? ld : cols) * 2u};
    const cuuint32_t box[2] = {(cuuint32_t)box_cols, (cuuint32_t)box_rows}, elem_stride[2] = {1, 1};
    return encode(static_cast<CUtensorMap *>(map), CU_TENSOR_MAP_DATA_TYPE_UINT16, 2, const_cast<void *>(base), dim,
                  stride, box, elem_stride, CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                  CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

#endif /* GDP_CHUNK_TENSOR_MAP_H */
