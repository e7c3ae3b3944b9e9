/*
 * dtype_access.cuh: element access through a runtime gdp dtype, for kernels whose tensors
 * may be fp32, bf16 or fp16: loads widen to float, stores round to nearest even. Shared by
 * the prepare, recurrent, conv1d and norm kernels (device-side twin of gdp_load_elem).
 */
#ifndef GDP_DTYPE_ACCESS_CUH
#define GDP_DTYPE_ACCESS_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "gdp/gdp.h"

__device__ __forceinline__ float load_as_float(const void *base, gdp_dtype_t dtype, int64_t i) {
    switch (dtype) {
    case GDP_DTYPE_BF16: return __bfloat162float(static_cast<const __nv_bfloat16 *>(base)[i]);
    case GDP_DTYPE_FP16: return __half2float(static_cast<const __half *>(base)[i]);
    default: return static_cast<const float *>(base)[i];
    }
}

__device__ __forceinline__ void store_from_float(void *base, gdp_dtype_t dtype, int64_t i, float v) {
    switch (dtype) {
    case GDP_DTYPE_BF16: static_cast<__nv_bfloat16 *>(base)[i] = __float2bfloat16_rn(v); break;
    case GDP_DTYPE_FP16: static_cast<__half *>(base)[i] = __float2half_rn(v); break;
    default: static_cast<float *>(base)[i] = v; break;
    }
}

#endif /* GDP_DTYPE_ACCESS_CUH */
