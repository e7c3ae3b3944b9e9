/*
 * common.cuh: what every stage of the CUDA chunk op (kernels/chunk/) shares: the tile constants,
 * ChunkParams (everything a stage kernel reads, passed by value) and element access in any
 * storage dtype. Included only into kernels/chunk/launch.cu, the folder's one translation unit,
 * so the anonymous namespace and the template instances are the same as in one file.
 */
#ifndef GDP_CHUNK_COMMON_CUH
#define GDP_CHUNK_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "gdp/gdp.h"

namespace {

constexpr int CHUNK = GDP_CHUNK_SIZE; /* 64 rows per chunk on both streams */
constexpr int PAD = 8;                /* 16-bit elements of row padding: ldmatrix rows hit distinct banks */
/* The state sweep's value-column block width VB (64, 32 or 16) is a template parameter of
 * chunk_state_kernel (state.cuh), chosen per call in stages.cuh; the output stage has its own
 * fixed widths (OW, OB in out.cuh). Neither the workspace layout nor the output stage depends on
 * VB: the chunk-entry states are stored [row][head][KP][VP] whatever block wrote them. */

/* Everything the stage kernels read, passed by value. */
struct ChunkParams {
    const void *q, *k, *v, *beta, *h0;
    const int32_t *cu, *cidx, *cidx_dp, *coff, *slots;
    const float *gq, *gk;
    const float *g_raw; /* g itself [T, H] or NULL: the fused path takes its own cumsum */
    void *kn, *w, *u, *hs; /* workspace: keys, w, u (then v_new), states entering chunks */
    void *o, *state, *final_state, *chunk_states;
    int64_t T, n_slots, state_stride_slot, state_stride_head, cs_rows, h_rows;
    int N, H, K, V, M, KP, VP;
    int beta_dtype, h0_dtype, state_dtype, final_dtype, cs_dtype;
    float scale;
    int l2norm;
    int q_vec, k_vec, v_vec; /* 16-byte loads allowed for the input tiles */
    int o_vec;               /* 16-byte stores allowed for the output rows (V % 8 == 0, o aligned) */
    int zero_tail;           /* the output stage zeroes o's rows past cu_seqlens[N] (out.cuh) */
};

/* 2^x by the special function unit alone (ex2.approx.ftz.f32): results below 2^-126 flush to 0,
 * where exp2f (ex2.approx.f32) adds a range test and two scalings a call to keep them denormal, the
 * same value otherwise. For the one-pass Hopper kernel's decay factors, whose products are rounded
 * to 16 bits next, the flushed tail lies far below that rounding. */
__device__ __forceinline__ float exp2_ftz(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}
/* ---- element access in any storage dtype ---- */
__device__ __forceinline__ float load_any(const void *p, int dtype, int64_t i) {
    switch (dtype) {
    case GDP_DTYPE_FP32: return static_cast<const float *>(p)[i];
    case GDP_DTYPE_BF16: return __bfloat162float(static_cast<const __nv_bfloat16 *>(p)[i]);
    case GDP_DTYPE_FP16: return __half2float(static_cast<const __half *>(p)[i]);
    default: return 0.0f;
    }
}
/* Element i's bits (16-bit ones zero-extended, which the load itself does) and their value, for a
 * load whose value is needed much later: load_any converts at once, and the conversion makes the
 * thread wait out the load's latency where it stands (the Hopper kernel's next-chunk loads waited
 * there, in the aux warpgroup's critical path); carried as bits, the value is converted where used. */
__device__ __forceinline__ uint32_t load_bits_any(const void *p, int dtype, int64_t i) {
    return dtype == GDP_DTYPE_FP32 ? static_cast<const uint32_t *>(p)[i]
                                   : (uint32_t) static_cast<const uint16_t *>(p)[i];
}
__device__ __forceinline__ float bits_to_float(uint32_t bits, int dtype) {
    switch (dtype) {
    case GDP_DTYPE_FP32: return __uint_as_float(bits);
    case GDP_DTYPE_BF16: return __uint_as_float(bits << 16);
    case GDP_DTYPE_FP16: return __half2float(__ushort_as_half((unsigned short)bits));
    default: return 0.0f;
    }
}
__device__ __forceinline__ void store_any(void *p, int dtype, int64_t i, float x) {
    switch (dtype) {
    case GDP_DTYPE_FP32: static_cast<float *>(p)[i] = x; break;
    case GDP_DTYPE_BF16: static_cast<__nv_bfloat16 *>(p)[i] = __float2bfloat16_rn(x); break;
    case GDP_DTYPE_FP16: static_cast<__half *>(p)[i] = __float2half_rn(x); break;
    default: break;
    }
}

/* ---- the chunk's decay, shared by the one-pass kernels (fused.cuh, hopper.cuh) ----
 * Gk in place over a chunk's 64 per-row g values (copy 0 of each token carries g, the others 0):
 * the chunk-local cumulative sum in base 2 (the cumsum kernel's order: a warp scan, two rows a lane)
 * into gk, and 2^Gk into gam. Run by one whole warp. */
__device__ __forceinline__ void chunk_gk_scan(float *gk, float *gam, int lane) {
    const float a0 = gk[2 * lane], a1 = gk[2 * lane + 1];
    float x = a0 + a1;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
        const float y = __shfl_up_sync(0xffffffffu, x, d);
        if (lane >= d)
            x += y;
    }
    float ex = __shfl_up_sync(0xffffffffu, x, 1);
    if (lane == 0)
        ex = 0.0f;
    const float g0 = (ex + a0) * GDP_RCP_LN2, g1 = ((ex + a0) + a1) * GDP_RCP_LN2;
    gk[2 * lane] = g0;
    gk[2 * lane + 1] = g1;
    gam[2 * lane] = exp2f(g0);
    gam[2 * lane + 1] = exp2f(g1);
}

/* ---- the state's stores, shared by the state sweep and the fused kernel ----
 * Where sequence i's final state goes: the cache slot (in place, the cache's dtype; nothing for
 * a -1 or out-of-range slot) in cache mode, else the dense final_state if asked. dst == nullptr:
 * nothing to store. Element (r, c) of head hd lives at base + r * V + c. */
struct StateDest {
    void *dst;
    int dtype;
    int64_t base;
};
__device__ __forceinline__ StateDest final_state_dest(const ChunkParams &p, int i, int hd) {
    StateDest d = {nullptr, 0, 0};
    if (p.state != nullptr) {
        const int slot = p.slots != nullptr ? p.slots[i] : i;
        if (slot >= 0 && slot < p.n_slots) {
            d.dst = p.state;
            d.dtype = p.state_dtype;
            d.base = (int64_t)slot * p.state_stride_slot + (int64_t)hd * p.state_stride_head;
        }
    } else if (p.final_state != nullptr) {
        d.dst = p.final_state;
        d.dtype = p.final_dtype;
        d.base = ((int64_t)i * p.H + hd) * p.K * p.V;
    }
    return d;
}

/* A warp's fp32 state fragments S[nt] (m16n8 accumulators: rows r0 + g + {0, 8}, columns
 * c0 + 8 nt + 2 t4 + {0, 1}) into dst in dtype at index(r, c), rows < K and columns < V only. */
template <int NT, typename Index>
__device__ __forceinline__ void store_state_tile(void *dst, int dtype, const float (&S)[NT][4], int r0, int c0, int K,
                                                 int V, int lane, Index index) {
    const int g = lane >> 2, t4 = lane & 3;
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int r = r0 + g + (e >> 1) * 8, c = c0 + nt * 8 + 2 * t4 + (e & 1);
            if (r < K && c < V)
                store_any(dst, dtype, index(r, c), S[nt][e]);
        }
}

} // namespace

#endif /* GDP_CHUNK_COMMON_CUH */
