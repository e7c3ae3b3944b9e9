/*
 * dtype_access.cuh: element access through a runtime gdp dtype, for kernels whose tensors
 * may be fp32, bf16 or fp16: loads widen to float, stores round to nearest even. Shared by
 * the prepare, recurrent, conv1d and norm kernels (device-side twin of gdp_load_elem).
 * The vector forms move N = 4 or 8 consecutive elements in one access per 16 bytes (the
 * caller guarantees the address is aligned to the N elements' size): a warp then reads or
 * writes each line once, and all of a thread's loads can be in flight together. prefetch_l2
 * brings a span into L2 ahead of its loads (the decode and fused chunk kernels).
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

/* Host side: a pointer the 16-byte accesses may use (NULL counts as aligned: an absent
 * tensor does not constrain the access width). */
/* ptr a multiple of n bytes (n a power of two; NULL is). */
static inline bool aligned_to(const void *ptr, uintptr_t n) { return (reinterpret_cast<uintptr_t>(ptr) & (n - 1)) == 0; }
static inline bool aligned16(const void *ptr) { return aligned_to(ptr, 16); }

/* N 16-bit elements of dtype (bf16 or fp16), packed two to a word as loaded, as floats. */
template <int N>
__device__ __forceinline__ void halves_to_float(gdp_dtype_t dtype, const uint32_t (&w)[N / 2], float (&v)[N]) {
#pragma unroll
    for (int j = 0; j < N / 2; j++) {
        const uint16_t lo = (uint16_t)(w[j] & 0xffffu), hi = (uint16_t)(w[j] >> 16);
        if (dtype == GDP_DTYPE_BF16) { /* a bf16 value is the top half of its fp32: a shift and a mask */
            v[2 * j] = __uint_as_float(w[j] << 16);
            v[2 * j + 1] = __uint_as_float(w[j] & 0xffff0000u);
        } else {
            v[2 * j] = __half2float(__ushort_as_half(lo));
            v[2 * j + 1] = __half2float(__ushort_as_half(hi));
        }
    }
}

/* Half `half` (0: the low 16 bits, 1: the high) of a raw word of two 16-bit elements as float,
 * for a compile-time 16-bit dtype DT. */
template <int DT> __device__ __forceinline__ float half_bits_as_float(uint32_t word, int half) {
    const uint32_t bits = half ? word >> 16 : word & 0xffffu;
    if constexpr (DT == GDP_DTYPE_BF16)
        return __uint_as_float(bits << 16);
    else
        return __half2float(__ushort_as_half((unsigned short)bits));
}

/* VEC (4 or 8) 16-bit elements as raw words, in one 8- or 16-byte load (src aligned to it). */
template <int VEC> __device__ __forceinline__ void load_half_words(const uint16_t *src, uint32_t (&dst)[VEC / 2]) {
    if constexpr (VEC == 8) {
        const uint4 v = *reinterpret_cast<const uint4 *>(src);
        dst[0] = v.x, dst[1] = v.y, dst[2] = v.z, dst[3] = v.w;
    } else {
        const uint2 v = *reinterpret_cast<const uint2 *>(src);
        dst[0] = v.x, dst[1] = v.y;
    }
}

/* N (4 or 8) elements from element i of base, aligned to their N * size bytes. L2_ONLY:
 * loaded through L2 only (ld.global.cg), for data other blocks of the same kernel wrote
 * (the SM's L1 is not coherent with them). */
template <int N, bool L2_ONLY = false>
__device__ __forceinline__ void load_vec_as_float(const void *base, gdp_dtype_t dtype, int64_t i, float (&v)[N]) {
    static_assert(N == 4 || N == 8, "4 or 8 elements");
    if (dtype == GDP_DTYPE_FP32) {
        const float4 *q = reinterpret_cast<const float4 *>(static_cast<const float *>(base) + i);
#pragma unroll
        for (int k = 0; k < N / 4; k++) {
            const float4 a = L2_ONLY ? __ldcg(q + k) : q[k];
            v[4 * k] = a.x, v[4 * k + 1] = a.y, v[4 * k + 2] = a.z, v[4 * k + 3] = a.w;
        }
        return;
    }
    uint32_t w[N / 2];
    if constexpr (N == 8) {
        const uint4 *q = reinterpret_cast<const uint4 *>(static_cast<const uint16_t *>(base) + i);
        const uint4 u = L2_ONLY ? __ldcg(q) : *q;
        w[0] = u.x, w[1] = u.y, w[2] = u.z, w[3] = u.w;
    } else {
        const uint2 *q = reinterpret_cast<const uint2 *>(static_cast<const uint16_t *>(base) + i);
        const uint2 u = L2_ONLY ? __ldcg(q) : *q;
        w[0] = u.x, w[1] = u.y;
    }
    halves_to_float<N>(dtype, w, v);
}

__device__ __forceinline__ uint16_t round_to_half_bits(gdp_dtype_t dtype, float v) {
    return dtype == GDP_DTYPE_BF16 ? __bfloat16_as_ushort(__float2bfloat16_rn(v)) : __half_as_ushort(__float2half_rn(v));
}

/* Two values rounded to a 16-bit dtype in one conversion (cvt.rn.bf16x2.f32 / .f16x2), packed as they
 * are stored: lo in the low half. The bits of round_to_half_bits on each, without the pack. */
__device__ __forceinline__ uint32_t round_pair_to_half_bits(gdp_dtype_t dtype, float lo, float hi) {
    if (dtype == GDP_DTYPE_BF16) {
        const __nv_bfloat162 p = __floats2bfloat162_rn(lo, hi);
        return *reinterpret_cast<const uint32_t *>(&p);
    }
    const __half2 p = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t *>(&p);
}

template <int N> __device__ __forceinline__ void store_vec_from_float(void *base, gdp_dtype_t dtype, int64_t i, const float (&v)[N]) {
    static_assert(N == 2 || N == 4 || N == 8, "2, 4 or 8 elements");
    if (dtype == GDP_DTYPE_FP32) {
        if constexpr (N == 2) {
            *reinterpret_cast<float2 *>(static_cast<float *>(base) + i) = make_float2(v[0], v[1]);
        } else {
            float4 *q = reinterpret_cast<float4 *>(static_cast<float *>(base) + i);
#pragma unroll
            for (int k = 0; k < N / 4; k++)
                q[k] = make_float4(v[4 * k], v[4 * k + 1], v[4 * k + 2], v[4 * k + 3]);
        }
        return;
    }
    uint32_t w[N / 2];
#pragma unroll
    for (int j = 0; j < N / 2; j++)
        w[j] = round_pair_to_half_bits(dtype, v[2 * j], v[2 * j + 1]);
    if constexpr (N == 8)
        *reinterpret_cast<uint4 *>(static_cast<uint16_t *>(base) + i) = make_uint4(w[0], w[1], w[2], w[3]);
    else if constexpr (N == 4)
        *reinterpret_cast<uint2 *>(static_cast<uint16_t *>(base) + i) = make_uint2(w[0], w[1]);
    else
        *reinterpret_cast<uint32_t *>(static_cast<uint16_t *>(base) + i) = w[0];
}

/* Brings the 128-byte lines of [ptr, ptr + bytes) into L2 without occupying registers. */
__device__ __forceinline__ void prefetch_l2(const void *ptr, int64_t bytes) {
    const uintptr_t first = reinterpret_cast<uintptr_t>(ptr) & ~(uintptr_t)127;
    const uintptr_t last = reinterpret_cast<uintptr_t>(ptr) + (uintptr_t)bytes - 1;
    for (uintptr_t a = first; a <= last; a += 128)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(a));
}

#endif /* GDP_DTYPE_ACCESS_CUH */
