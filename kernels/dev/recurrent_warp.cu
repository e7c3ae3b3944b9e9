/*
 * recurrent_warp.cu: a RECORD, not built (kernels/NOTES-ops.md, "v4: one warp per tile"):
 * the warp-per-tile decode kernel measured on the H200 on 2026-12-01 and not adopted. It was
 * slower than the block kernel of kernels/recurrent.cu at every target row (B=256 fp32 249 us
 * at its default tile, 220 us at its best, 8x16; the block kernel 216 us) and it failed two
 * GPU test cases (K not a multiple of its k-group rows, beta absent: K=100 V=30 and K=48
 * V=40; o off by up to 3.8e-2) that a host emulation of this same source (32 threads per
 * warp, barriers at each shuffle) computed correctly: the cause was not found. Kept so the
 * next attempt starts from the measured tiles (GDP_DECODE_TILE, GDP_DECODE_WPB,
 * GDP_DECODE_PREFETCH10 below) rather than from scratch.
 *
 * What follows is kernels/recurrent.cu as it was measured.
 */
/*
 * recurrent.cu: the CUDA kernel of gdp_fused_recurrent_gated_delta_rule_update, the decode
 * op (gdp-math.md 5, api-reference/fused_recurrent.md): per (request, head) the K x V state
 * walks the request's T = S*M steps (decay, delta-rule update, read-out), in place on the
 * cache slots or dense, with optional per-token snapshots (intermediate_states).
 *
 * Design (decode is memory-bound by an order of magnitude: every state byte is read once
 * and written once, and the kernel's job is to keep enough of them in flight):
 *   - one warp owns one (request, head, block of WV value columns) for the whole call: all
 *     T steps (every Householder copy of every draft token), the snapshots after each token
 *     and the final state, with its K x WV tile in registers. No shared memory and no block
 *     barrier: blocks are 1-4 independent warps.
 *   - the state stays in the [K, V] layout callers pass (no transposed cache): lane
 *     (k group kg, column group vg) holds RK consecutive rows kg*RK.. x CW consecutive
 *     columns (CW = 8: two 16-byte fp32 loads or one 16-byte bf16 load per row). S^T k and
 *     S^T q are an in-thread sum over the lane's rows and then a butterfly (xor shuffles)
 *     across the k groups; every lane of a column group ends with the same bits, so the
 *     update S += k delta^T needs no broadcast. KG = 32 / VG k groups, the fewest whose RK
 *     rows cover K (K = 128, RK = 8: 16 k groups, 2 column groups, 16 columns per warp).
 *   - order of a warp's loads: its slot index first, then the raw q/k/v/g/beta words of its
 *     first DEC_TC steps (converted only when used, so they are all in flight together),
 *     then, once the slot is known, every 16-byte load of the state tile; the L2 norms and
 *     k.q of those steps are computed while the state is still arriving. Inputs of later
 *     steps are prefetched into L2 at the start (no registers held).
 *   - q of the zeroed Householder copies (GDP decode puts q on copy M-1 only): when a step's
 *     q is zero in the whole warp, S^T q and k.q are skipped (both are exactly +0 then, so
 *     the bits are the same as computing them, for any finite state).
 *   - optional L2 prefetch of the state tile of the warp a number of resident generations
 *     ahead (GDP_DECODE_PREFETCH, default off; NOTES-ops.md has the measurement).
 *   - fixed summation order, no atomics: the same bits every run; no host synchronization
 *     and no allocation: the launch is graph-capturable.
 * GDP_DECODE_TILE=CWxRK and GDP_DECODE_WPB=1|2|4 override the tile and warps per block
 * (for measurement; NOTES-ops.md). Earlier designs (block-wide reduction in shared memory,
 * a cp.async-pipelined resident grid) are in the history of this file and in NOTES-ops.md.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "dtype_access.cuh"
#include "gdp_kernels.h"
#include "src/internal.h"

// CUDA kernels

namespace {

constexpr int DEC_MAX_WARPS = 4; /* warps per block at most                          */
constexpr unsigned FULL_MASK = 0xffffffffu;

struct RecurrentParams {
    const void *q, *k, *v, *beta; /* [B, T, H, *], contiguous */
    const float *g;               /* [B, T, H] or NULL        */
    gdp_dtype_t qkv_dtype, beta_dtype, o_dtype;
    void *o; /* [B, T, H, V] */
    /* Where the state comes from and goes to; row = slot (cache) or request (dense). */
    const void *state_in; /* NULL: zeros */
    int64_t in_stride_row, in_stride_head;
    void *state_out; /* NULL: not written */
    int64_t out_stride_row, out_stride_head;
    int out_fp32; /* 1: state_out is fp32 (dense final_state), 0: the state's own dtype */
    void *inter;  /* [slots, S, H, K, V] in the state's dtype, or NULL */
    const int32_t *indices; /* [B] slots, or NULL (slot b) */
    int cache;              /* 1: cache mode (rows are slots; -1 skips) */
    int64_t slots;
    int64_t B;
    int64_t items; /* warps with work: B * H * n_vblocks */
    int32_t T, H, K, V, steps_per_token, S, n_vblocks;
    int32_t vg_bits; /* log2 of the column groups of a warp (32 / k groups) */
    float scale;
    int l2norm;
    int qk_vec, v_vec, o_vec;  /* rows 16-byte aligned: segment-wide loads / stores       */
    int64_t prefetch_distance; /* warp w prefetches warp w + this one's state (0: off)    */
};

/* Bit-level storage of the state: load/store VW elements and convert to/from fp32. */
template <int SDT> struct StateStorage;
template <> struct StateStorage<GDP_DTYPE_FP32> {
    using Bits = uint32_t;
    static __device__ __forceinline__ float to_float(Bits b) { return __uint_as_float(b); }
    static __device__ __forceinline__ Bits from_float(float f) { return __float_as_uint(f); }
};
template <> struct StateStorage<GDP_DTYPE_BF16> {
    using Bits = uint16_t;
    static __device__ __forceinline__ float to_float(Bits b) { return __uint_as_float((uint32_t)b << 16); }
    static __device__ __forceinline__ Bits from_float(float f) { return __bfloat16_as_ushort(__float2bfloat16_rn(f)); }
};
template <> struct StateStorage<GDP_DTYPE_FP16> {
    using Bits = uint16_t;
    static __device__ __forceinline__ float to_float(Bits b) { return __half2float(__ushort_as_half(b)); }
    static __device__ __forceinline__ Bits from_float(float f) { return __half_as_ushort(__float2half_rn(f)); }
};

/* N consecutive state elements: one 16-byte access when N * sizeof(Bits) == 16. */
template <int SDT, int N>
__device__ __forceinline__ void load_state(const typename StateStorage<SDT>::Bits *src, float *dst) {
    using Store = StateStorage<SDT>;
    using Bits = typename Store::Bits;
    if constexpr (N * sizeof(Bits) == 16) {
        union {
            uint4 raw;
            Bits e[N];
        } u;
        u.raw = *reinterpret_cast<const uint4 *>(src);
#pragma unroll
        for (int c = 0; c < N; c++)
            dst[c] = Store::to_float(u.e[c]);
    } else {
#pragma unroll
        for (int c = 0; c < N; c++)
            dst[c] = Store::to_float(src[c]);
    }
}

template <int SDT, int N>
__device__ __forceinline__ void store_state(typename StateStorage<SDT>::Bits *dst, const float *src) {
    using Store = StateStorage<SDT>;
    using Bits = typename Store::Bits;
    if constexpr (N * sizeof(Bits) == 16) {
        union {
            uint4 raw;
            Bits e[N];
        } u;
#pragma unroll
        for (int c = 0; c < N; c++)
            u.e[c] = Store::from_float(src[c]);
        *reinterpret_cast<uint4 *>(dst) = u.raw;
    } else {
#pragma unroll
        for (int c = 0; c < N; c++)
            dst[c] = Store::from_float(src[c]);
    }
}

/* N fp32 values to an fp32 tensor (dense final_state): float4 stores when N % 4 == 0. */
template <int N> __device__ __forceinline__ void store_state_f32(float *dst, const float *src) {
    if constexpr (N % 4 == 0) {
#pragma unroll
        for (int c = 0; c < N; c += 4)
            *reinterpret_cast<float4 *>(dst + c) = make_float4(src[c], src[c + 1], src[c + 2], src[c + 3]);
    } else {
#pragma unroll
        for (int c = 0; c < N; c++)
            dst[c] = src[c];
    }
}

/* N consecutive elements of a tensor of runtime dtype (element size es) as raw 32-bit
 * words: fp32 one element per word, 16-bit dtypes two per word (element j in the low half
 * of word j/2 when j is even). Converting later (raw_to_float) keeps every load of a
 * warp's inputs in flight at once: nothing waits for a load until its value is used.
 * vec: the segment is aligned to min(16, N es) bytes and whole (n_valid == N); otherwise
 * element loads, zeros past n_valid. */
template <int N>
__device__ __forceinline__ void load_raw(const void *base, int es, int64_t off, int n_valid, bool vec,
                                         uint32_t (&w)[N]) {
    if (es == 4) {
        const uint32_t *src = static_cast<const uint32_t *>(base) + off;
        if constexpr (N % 4 == 0) {
            if (vec) {
#pragma unroll
                for (int j = 0; j < N; j += 4) {
                    const uint4 x = *reinterpret_cast<const uint4 *>(src + j);
                    w[j] = x.x, w[j + 1] = x.y, w[j + 2] = x.z, w[j + 3] = x.w;
                }
                return;
            }
        }
#pragma unroll
        for (int j = 0; j < N; j++)
            w[j] = j < n_valid ? src[j] : 0u;
    } else {
        const uint16_t *src = static_cast<const uint16_t *>(base) + off;
        if constexpr (N % 8 == 0) {
            if (vec) {
#pragma unroll
                for (int j = 0; j < N; j += 8) {
                    const uint4 x = *reinterpret_cast<const uint4 *>(src + j);
                    w[j / 2] = x.x, w[j / 2 + 1] = x.y, w[j / 2 + 2] = x.z, w[j / 2 + 3] = x.w;
                }
                return;
            }
        } else if constexpr (N % 4 == 0) {
            if (vec) {
#pragma unroll
                for (int j = 0; j < N; j += 4) {
                    const uint2 x = *reinterpret_cast<const uint2 *>(src + j);
                    w[j / 2] = x.x, w[j / 2 + 1] = x.y;
                }
                return;
            }
        }
#pragma unroll
        for (int j = 0; j < N; j++) {
            const uint32_t e = j < n_valid ? (uint32_t)src[j] : 0u;
            if (j & 1)
                w[j / 2] |= e << 16;
            else
                w[j / 2] = e;
        }
    }
}

/* Element j of a load_raw segment as fp32. */
template <int N> __device__ __forceinline__ float raw_to_float(const uint32_t (&w)[N], gdp_dtype_t dt, int j) {
    if (dt == GDP_DTYPE_FP32)
        return __uint_as_float(w[j]);
    const uint32_t h = (j & 1) ? w[j >> 1] >> 16 : w[j >> 1] & 0xffffu;
    return dt == GDP_DTYPE_BF16 ? __uint_as_float(h << 16) : __half2float(__ushort_as_half((unsigned short)h));
}

/* N fp32 values to a tensor of runtime dtype: one or two 16-byte (or one 8-byte) stores
 * when vec (segment aligned and whole), else element stores up to n_valid. */
template <int N>
__device__ __forceinline__ void store_out(void *base, gdp_dtype_t dt, int64_t off, const float (&x)[N], int n_valid,
                                          bool vec) {
    if (dt == GDP_DTYPE_FP32) {
        if constexpr (N % 4 == 0) {
            if (vec) {
                float *dst = static_cast<float *>(base) + off;
#pragma unroll
                for (int j = 0; j < N; j += 4)
                    *reinterpret_cast<float4 *>(dst + j) = make_float4(x[j], x[j + 1], x[j + 2], x[j + 3]);
                return;
            }
        }
    } else if constexpr (N % 4 == 0) {
        if (vec) {
            uint32_t w[N / 2];
#pragma unroll
            for (int j = 0; j < N; j += 2) {
                uint32_t lo, hi;
                if (dt == GDP_DTYPE_BF16) {
                    lo = __bfloat16_as_ushort(__float2bfloat16_rn(x[j]));
                    hi = __bfloat16_as_ushort(__float2bfloat16_rn(x[j + 1]));
                } else {
                    lo = __half_as_ushort(__float2half_rn(x[j]));
                    hi = __half_as_ushort(__float2half_rn(x[j + 1]));
                }
                w[j / 2] = lo | (hi << 16);
            }
            uint16_t *dst = static_cast<uint16_t *>(base) + off;
            if constexpr (N % 8 == 0) {
#pragma unroll
                for (int j = 0; j < N / 2; j += 4)
                    *reinterpret_cast<uint4 *>(dst + 2 * j) = make_uint4(w[j], w[j + 1], w[j + 2], w[j + 3]);
            } else {
#pragma unroll
                for (int j = 0; j < N / 2; j += 2)
                    *reinterpret_cast<uint2 *>(dst + 2 * j) = make_uint2(w[j], w[j + 1]);
            }
            return;
        }
    }
#pragma unroll
    for (int j = 0; j < N; j++)
        if (j < n_valid)
            store_from_float(base, dt, off + j, x[j]);
}

/* Brings the 128-byte lines of [ptr, ptr + bytes) into L2 without occupying registers. */
__device__ __forceinline__ void prefetch_l2(const void *ptr, int64_t bytes) {
    const uintptr_t first = reinterpret_cast<uintptr_t>(ptr) & ~(uintptr_t)127;
    const uintptr_t last = reinterpret_cast<uintptr_t>(ptr) + (uintptr_t)bytes - 1;
    for (uintptr_t a = first; a <= last; a += 128)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(a));
}

/* Sum over the k groups of a warp (lanes vg_count apart): a butterfly, so every lane of a
 * column group ends with the same bits. */
__device__ __forceinline__ float kgroup_sum(float x, int vg_count) {
    for (int off = vg_count; off < 32; off <<= 1)
        x += __shfl_xor_sync(FULL_MASK, x, off);
    return x;
}

/* The raw inputs of one step for one lane: its RK rows of q and k, its CW columns of v. */
template <int RK, int CW> struct StepRaw {
    uint32_t q[RK], k[RK], v[CW], g, beta;
};
/* One step ready for the state: normalized k, normalized and scaled q, k.q, exp(g), beta. */
template <int RK, int CW> struct StepIn {
    float k[RK], q[RK], v[CW];
    float decay, beta, kq;
    bool q_zero; /* q is zero in the whole warp: S^T q and k.q are +0 */
};

/* Where one warp works: its (request, head, value block) and its lane's rows and columns. */
struct WarpPos {
    int64_t b;
    int h, vg_count, kg, row0, nk, col0, nv;
};

template <int RK, int CW>
__device__ __forceinline__ void load_step(const RecurrentParams &p, const WarpPos &w, int es, int t,
                                          StepRaw<RK, CW> &r) {
    const int64_t bth = (w.b * p.T + t) * p.H + w.h;
    const bool qk_whole = p.qk_vec && w.nk == RK;
    load_raw<RK>(p.q, es, bth * p.K + w.row0, w.nk, qk_whole, r.q);
    load_raw<RK>(p.k, es, bth * p.K + w.row0, w.nk, qk_whole, r.k);
    load_raw<CW>(p.v, es, bth * p.V + w.col0, w.nv, p.v_vec && w.nv == CW, r.v);
    r.g = p.g != nullptr ? __float_as_uint(p.g[bth]) : 0u;
    if (p.beta == nullptr)
        r.beta = 0u;
    else if (p.beta_dtype == GDP_DTYPE_FP32)
        r.beta = static_cast<const uint32_t *>(p.beta)[bth];
    else
        r.beta = static_cast<const uint16_t *>(p.beta)[bth];
}

/* Into L2 (no registers): the lane's q/k rows and v columns of step t. */
__device__ __forceinline__ void prefetch_step(const RecurrentParams &p, const WarpPos &w, int es, int t) {
    const int64_t bth = (w.b * p.T + t) * p.H + w.h;
    if (w.nk > 0 && (threadIdx.x & (w.vg_count - 1)) == 0) { /* one lane per k group */
        prefetch_l2(static_cast<const char *>(p.q) + (bth * p.K + w.row0) * es, (int64_t)w.nk * es);
        prefetch_l2(static_cast<const char *>(p.k) + (bth * p.K + w.row0) * es, (int64_t)w.nk * es);
    }
    if (w.nv > 0 && w.kg == 0)
        prefetch_l2(static_cast<const char *>(p.v) + (bth * p.V + w.col0) * es, (int64_t)w.nv * es);
}

/* Converts a step's raw inputs and computes what does not depend on the state: the L2
 * norms (fp32, never rounded; eps inside the root), the scale (after the norm), k.q. */
template <int RK, int CW>
__device__ __forceinline__ void prepare_step(const RecurrentParams &p, const WarpPos &w, const StepRaw<RK, CW> &r,
                                             StepIn<RK, CW> &s) {
    const gdp_dtype_t dt = p.qkv_dtype;
    bool lane_q_zero = true;
    float ssq = 0.0f, ssk = 0.0f;
#pragma unroll
    for (int i = 0; i < RK; i++) {
        s.q[i] = raw_to_float(r.q, dt, i);
        s.k[i] = raw_to_float(r.k, dt, i);
        lane_q_zero = lane_q_zero && s.q[i] == 0.0f;
        ssq = fmaf(s.q[i], s.q[i], ssq);
        ssk = fmaf(s.k[i], s.k[i], ssk);
    }
    s.q_zero = __all_sync(FULL_MASK, lane_q_zero);
    float fq = 1.0f, fk = 1.0f;
    if (p.l2norm) {
        fq = 1.0f / sqrtf(kgroup_sum(ssq, w.vg_count) + (float)GDP_L2NORM_EPS);
        fk = 1.0f / sqrtf(kgroup_sum(ssk, w.vg_count) + (float)GDP_L2NORM_EPS);
    }
    float kq = 0.0f;
#pragma unroll
    for (int i = 0; i < RK; i++) {
        s.q[i] = (s.q[i] * fq) * p.scale;
        s.k[i] = s.k[i] * fk;
        kq = fmaf(s.k[i], s.q[i], kq);
    }
    s.kq = s.q_zero ? 0.0f : kgroup_sum(kq, w.vg_count);
#pragma unroll
    for (int c = 0; c < CW; c++)
        s.v[c] = raw_to_float(r.v, dt, c);
    s.decay = p.g != nullptr ? expf(__uint_as_float(r.g)) : 1.0f;
    if (p.beta == nullptr)
        s.beta = 1.0f;
    else if (p.beta_dtype == GDP_DTYPE_FP32)
        s.beta = __uint_as_float(r.beta);
    else if (p.beta_dtype == GDP_DTYPE_BF16)
        s.beta = __uint_as_float(r.beta << 16);
    else
        s.beta = __half2float(__ushort_as_half((unsigned short)r.beta));
}

/* The state row of request b: its slot (cache mode; -1 and out-of-range slots count as
 * padding), or b itself (dense mode). */
__device__ __forceinline__ int64_t state_row(const RecurrentParams &p, int64_t b) {
    return p.cache && p.indices != nullptr ? (int64_t)p.indices[b] : b;
}
__device__ __forceinline__ bool row_is_padding(const RecurrentParams &p, int64_t row) {
    return p.cache && (row < 0 || row >= p.slots);
}

/* Warp `item`'s (request, head, value block); items < 2^31 (the launcher checks), so the
 * divisions are 32-bit. */
__device__ __forceinline__ void item_coords(const RecurrentParams &p, int64_t item, int64_t &b, int &h, int &vb) {
    const uint32_t it = (uint32_t)item, nvb = (uint32_t)p.n_vblocks, H = (uint32_t)p.H;
    const uint32_t bh = it / nvb;
    vb = (int)(it - bh * nvb);
    const uint32_t bb = bh / H;
    h = (int)(bh - bb * H);
    b = (int64_t)bb;
}

/* Blocks of DEC_MAX_WARPS warps the register budget must allow per SM: a lane's state tile
 * of CW x RK fp32 values plus about 100 registers of inputs, sums and indices. */
__host__ __device__ constexpr int dec_min_blocks(int cw, int rk) { return cw * rk <= 32 ? 4 : cw * rk <= 64 ? 3 : 2; }
/* Steps whose inputs a lane holds (and whose norms it computes) at once: two for small tiles,
 * so a two-step token's norms all overlap the state loads; one for large tiles, whose
 * registers go to the state. */
__host__ __device__ constexpr int dec_steps_held(int cw, int rk) { return cw * rk <= 16 ? 2 : 1; }

/* One warp per item (request b, head h, value block vb); see the file comment. */
template <int SDT, int CW, int RK, bool VEC, int MINB>
__global__ void __launch_bounds__(32 * DEC_MAX_WARPS, MINB > 0 ? MINB : dec_min_blocks(CW, RK))
    recurrent_kernel(const RecurrentParams p) {
    using Store = StateStorage<SDT>;
    using Bits = typename Store::Bits;
    constexpr int VW = VEC ? (int)(16 / sizeof(Bits)) : 1; /* elements per state access */
    static_assert(CW % VW == 0, "a lane's columns are whole state accesses");
    const int lane = threadIdx.x & 31;
    const int64_t item = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (item >= p.items)
        return; /* the whole warp: shuffles below use the full mask */

    WarpPos w;
    int vb;
    item_coords(p, item, w.b, w.h, vb);
    w.vg_count = 1 << p.vg_bits;
    w.kg = lane >> p.vg_bits;
    w.row0 = w.kg * RK;
    w.nk = max(0, min(RK, p.K - w.row0));
    w.col0 = (vb * w.vg_count + (lane & (w.vg_count - 1))) * CW;
    w.nv = max(0, min(CW, p.V - w.col0));
    const int es = p.qkv_dtype == GDP_DTYPE_FP32 ? 4 : 2;
    const int64_t KV = (int64_t)p.K * p.V;
    constexpr int DEC_TC = dec_steps_held(CW, RK);

    /* 1. The slot (the state loads wait for it), and that of the warp this one prefetches. */
    const int64_t row = state_row(p, w.b);
    const int64_t future = p.prefetch_distance > 0 ? item + p.prefetch_distance : p.items;
    int64_t f_b = 0, f_row = -1;
    int f_h = 0, f_vb = 0;
    if (future < p.items) {
        item_coords(p, future, f_b, f_h, f_vb);
        f_row = state_row(p, f_b);
    }

    /* 2. The first steps' inputs, raw, all in flight; later steps' into L2. */
    StepRaw<RK, CW> raw[DEC_TC];
#pragma unroll
    for (int j = 0; j < DEC_TC; j++)
        if (j < p.T)
            load_step<RK, CW>(p, w, es, j, raw[j]);
    for (int t = DEC_TC; t < p.T; t++)
        prefetch_step(p, w, es, t);

    /* 3. Padding request: output 0, no slot read or written. */
    if (row_is_padding(p, row)) {
        if (w.kg == 0 && w.nv > 0) {
            float zero[CW];
#pragma unroll
            for (int c = 0; c < CW; c++)
                zero[c] = 0.0f;
            for (int t = 0; t < p.T; t++)
                store_out<CW>(p.o, p.o_dtype, ((w.b * p.T + t) * p.H + w.h) * p.V + w.col0, zero, w.nv,
                              p.o_vec && w.nv == CW);
        }
        return;
    }

    /* 4. The state tile: every 16-byte load issued before any is used. */
    float st[RK][CW];
    const Bits *in = p.state_in == nullptr
                         ? nullptr
                         : static_cast<const Bits *>(p.state_in) + row * p.in_stride_row + w.h * p.in_stride_head;
#pragma unroll
    for (int i = 0; i < RK; i++)
#pragma unroll
        for (int j = 0; j < CW; j += VW) {
            if (in != nullptr && i < w.nk && j < w.nv) /* VEC: V % VW == 0, vectors whole */
                load_state<SDT, VW>(in + (int64_t)(w.row0 + i) * p.V + w.col0 + j, &st[i][j]);
            else
#pragma unroll
                for (int c = 0; c < VW; c++)
                    st[i][j + c] = 0.0f;
        }

    /* 5. L2 prefetch of a later warp's tile (rows lane, lane + 32, ..: one line each). */
    if (future < p.items && !row_is_padding(p, f_row) && p.state_in != nullptr) {
        const int f_col = f_vb * w.vg_count * CW;
        const int64_t bytes = (int64_t)min(w.vg_count * CW, p.V - f_col) * (int64_t)sizeof(Bits);
        const Bits *f_in =
            static_cast<const Bits *>(p.state_in) + f_row * p.in_stride_row + f_h * p.in_stride_head + f_col;
        for (int kr = lane; kr < p.K; kr += 32)
            prefetch_l2(f_in + (int64_t)kr * p.V, bytes);
    }

    /* 6. The steps, DEC_TC at a time: norms first (independent of the state), then the
     * decay, S^T k and S^T q, delta, the read-out, the update and the snapshots. */
    for (int t0 = 0; t0 < p.T; t0 += DEC_TC) {
        if (t0 > 0) {
#pragma unroll
            for (int j = 0; j < DEC_TC; j++)
                if (t0 + j < p.T)
                    load_step<RK, CW>(p, w, es, t0 + j, raw[j]);
        }
        StepIn<RK, CW> s[DEC_TC];
#pragma unroll
        for (int j = 0; j < DEC_TC; j++)
            if (t0 + j < p.T)
                prepare_step<RK, CW>(p, w, raw[j], s[j]);
#pragma unroll
        for (int j = 0; j < DEC_TC; j++) {
            const int t = t0 + j;
            if (t >= p.T)
                break;
            if (s[j].decay != 1.0f) { /* g = 0 (every copy but the first in GDP decode): x * 1 = x */
#pragma unroll
                for (int i = 0; i < RK; i++)
#pragma unroll
                    for (int c = 0; c < CW; c++)
                        st[i][c] *= s[j].decay;
            }
            float sk[CW], sq[CW];
#pragma unroll
            for (int c = 0; c < CW; c++)
                sk[c] = sq[c] = 0.0f;
            if (s[j].q_zero) {
#pragma unroll
                for (int i = 0; i < RK; i++)
#pragma unroll
                    for (int c = 0; c < CW; c++)
                        sk[c] = fmaf(st[i][c], s[j].k[i], sk[c]);
                for (int off = w.vg_count; off < 32; off <<= 1)
#pragma unroll
                    for (int c = 0; c < CW; c++)
                        sk[c] += __shfl_xor_sync(FULL_MASK, sk[c], off);
            } else {
#pragma unroll
                for (int i = 0; i < RK; i++)
#pragma unroll
                    for (int c = 0; c < CW; c++) {
                        sk[c] = fmaf(st[i][c], s[j].k[i], sk[c]);
                        sq[c] = fmaf(st[i][c], s[j].q[i], sq[c]);
                    }
                for (int off = w.vg_count; off < 32; off <<= 1)
#pragma unroll
                    for (int c = 0; c < CW; c++) {
                        sk[c] += __shfl_xor_sync(FULL_MASK, sk[c], off);
                        sq[c] += __shfl_xor_sync(FULL_MASK, sq[c], off);
                    }
            }
            float delta[CW], out[CW];
#pragma unroll
            for (int c = 0; c < CW; c++) {
                delta[c] = s[j].beta * (s[j].v[c] - sk[c]);
                out[c] = sq[c] + delta[c] * s[j].kq; /* (S + k delta^T)^T q */
            }
            if (w.kg == 0 && w.nv > 0)
                store_out<CW>(p.o, p.o_dtype, ((w.b * p.T + t) * p.H + w.h) * p.V + w.col0, out, w.nv,
                              p.o_vec && w.nv == CW);
#pragma unroll
            for (int i = 0; i < RK; i++)
#pragma unroll
                for (int c = 0; c < CW; c++)
                    st[i][c] = fmaf(s[j].k[i], delta[c], st[i][c]);
            if (p.inter != nullptr && (t + 1) % p.steps_per_token == 0) {
                /* Snapshot after token s = (t + 1) / M - 1, at [slot, s, h]. */
                const int tok = (t + 1) / p.steps_per_token - 1;
                Bits *dst = static_cast<Bits *>(p.inter) + ((row * p.S + tok) * p.H + w.h) * KV;
#pragma unroll
                for (int i = 0; i < RK; i++)
#pragma unroll
                    for (int jj = 0; jj < CW; jj += VW)
                        if (i < w.nk && jj < w.nv)
                            store_state<SDT, VW>(dst + (int64_t)(w.row0 + i) * p.V + w.col0 + jj, &st[i][jj]);
            }
        }
    }

    /* 7. The final state: back into the slot, or dense fp32. */
    if (p.state_out != nullptr) {
#pragma unroll
        for (int i = 0; i < RK; i++)
#pragma unroll
            for (int j = 0; j < CW; j += VW) {
                if (i >= w.nk || j >= w.nv)
                    continue;
                const int64_t off =
                    row * p.out_stride_row + w.h * p.out_stride_head + (int64_t)(w.row0 + i) * p.V + w.col0 + j;
                if (p.out_fp32)
                    store_state_f32<VW>(static_cast<float *>(p.state_out) + off, &st[i][j]);
                else
                    store_state<SDT, VW>(static_cast<Bits *>(p.state_out) + off, &st[i][j]);
            }
    }
}

/* Per-device figures the launch needs, read once per (kernel instance, block size):
 * SMs, and resident blocks per SM (0 if unknown). */
template <typename Kernel> int resident_blocks_per_sm(Kernel kernel, int *cache, int device, int threads) {
    constexpr int MAX_DEVICES = 64;
    if (device < 0 || device >= MAX_DEVICES)
        return 0;
    const int slot = device * (DEC_MAX_WARPS + 1) + threads / 32;
    if (cache[slot] == 0) { /* 0: not computed yet; -1: unknown */
        int per_sm = 0;
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, 0) != cudaSuccess ||
            per_sm <= 0) {
            (void)cudaGetLastError();
            cache[slot] = -1;
        } else {
            cache[slot] = per_sm;
        }
    }
    return cache[slot] > 0 ? cache[slot] : 0;
}

int device_sms(int device) {
    static int sms[64];
    if (device < 0 || device >= 64)
        return 132;
    if (sms[device] == 0) {
        int n = 0;
        if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device) != cudaSuccess || n <= 0) {
            (void)cudaGetLastError();
            n = 132;
        }
        sms[device] = n;
    }
    return sms[device];
}

/* An integer from the environment in [lo, hi], read once per name by the caller. */
int env_int(const char *name, int fallback, int lo, int hi) {
    const char *e = getenv(name);
    if (e == nullptr || *e == '\0')
        return fallback;
    const int v = atoi(e);
    return v >= lo && v <= hi ? v : fallback;
}

/* L2 prefetch distance in generations of resident warps (GDP_DECODE_PREFETCH x 10, so 5 =
 * half a generation; default 0 = off). */
int prefetch_tenths() {
    static const int v = env_int("GDP_DECODE_PREFETCH10", 0, 0, 160);
    return v;
}
/* Warps per block (GDP_DECODE_WPB = 1, 2 or 4; 0 = by grid size). */
int forced_wpb() {
    static const int v = env_int("GDP_DECODE_WPB", 0, 0, DEC_MAX_WARPS);
    return v == 3 ? 0 : v;
}

template <int SDT, int CW, int RK, bool VEC, int MINB = 0>
cudaError_t launch_tile(RecurrentParams p, int device, cudaStream_t stream) {
    int kgroups = 1;
    while (kgroups * RK < p.K)
        kgroups <<= 1;
    if (kgroups > 32)
        return cudaErrorInvalidValue; /* the dispatcher picks a tile whose rows cover K */
    int vg_bits = 0;
    while ((kgroups << vg_bits) < 32)
        vg_bits++;
    p.vg_bits = vg_bits;
    const int wv = (1 << vg_bits) * CW; /* columns per warp */
    p.n_vblocks = (p.V + wv - 1) / wv;
    p.items = p.B * p.H * p.n_vblocks;
    const int sms = device_sms(device);
    /* Several warps per block once the grid is large: fewer, fuller blocks. Small grids take
     * one warp per block so they spread over every SM. */
    int wpb = forced_wpb();
    if (wpb == 0)
        wpb = p.items >= (int64_t)sms * 32 ? DEC_MAX_WARPS : 1;
    if (p.items > INT32_MAX)
        return cudaErrorInvalidConfiguration;
    const int64_t blocks = (p.items + wpb - 1) / wpb;
    p.prefetch_distance = 0;
    if (prefetch_tenths() > 0) {
        static int cache[64 * (DEC_MAX_WARPS + 1)];
        const int per_sm = resident_blocks_per_sm(recurrent_kernel<SDT, CW, RK, VEC, MINB>, cache, device, 32 * wpb);
        p.prefetch_distance = (int64_t)per_sm * sms * wpb * prefetch_tenths() / 10;
    }
    recurrent_kernel<SDT, CW, RK, VEC, MINB><<<(unsigned)blocks, 32 * wpb, 0, stream>>>(p);
    return cudaGetLastError();
}

/* The tile (columns CW x rows RK per lane) of a call: GDP_DECODE_TILE=CWxRK when that tile
 * is compiled for the state dtype and covers K, else the default 8 x 8 (vector paths) or
 * 1 x 8 (element path). */
void decode_tile(int *cw, int *rk) {
    static int env_cw = -1, env_rk = -1;
    if (env_cw < 0) {
        const char *e = getenv("GDP_DECODE_TILE");
        int a = 0, b = 0;
        if (e != nullptr && sscanf(e, "%dx%d", &a, &b) == 2) {
            env_cw = a;
            env_rk = b;
        } else {
            env_cw = env_rk = 0;
        }
    }
    *cw = env_cw;
    *rk = env_rk;
}

template <int SDT> cudaError_t dispatch_tile(const RecurrentParams &p, bool vec, int device, cudaStream_t stream) {
    if (!vec)
        return launch_tile<SDT, 1, 8, false>(p, device, stream);
    int cw, rk;
    decode_tile(&cw, &rk);
    if (cw == 88 && rk == 4) /* "88x4": the 8 x 8 tile held to 128 registers (16 warps per SM) */
        return launch_tile<SDT, 8, 8, true, 4>(p, device, stream);
    if constexpr (SDT == GDP_DTYPE_FP32) {
        if (cw == 4 && rk == 16 && p.K <= 32 * 16)
            return launch_tile<SDT, 4, 16, true>(p, device, stream);
        if (cw == 4 && rk == 8)
            return launch_tile<SDT, 4, 8, true>(p, device, stream);
        if (cw == 4 && rk == 4 && p.K <= 32 * 4)
            return launch_tile<SDT, 4, 4, true>(p, device, stream);
        if (cw == 8 && rk == 16)
            return launch_tile<SDT, 8, 16, true>(p, device, stream);
    } else if constexpr (SDT == GDP_DTYPE_BF16) {
        if (cw == 16 && rk == 4 && p.K <= 32 * 4)
            return launch_tile<SDT, 16, 4, true>(p, device, stream);
        if (cw == 8 && rk == 16)
            return launch_tile<SDT, 8, 16, true>(p, device, stream);
        if (cw == 16 && rk == 8)
            return launch_tile<SDT, 16, 8, true>(p, device, stream);
    }
    return launch_tile<SDT, 8, 8, true>(p, device, stream); /* K <= 256 = 32 k groups x 8 */
}

/* NULL counts as aligned: an absent tensor does not constrain the access width. */
bool aligned16(const void *ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15u) == 0; }

} // namespace

// kernel launchers

extern "C" gdp_status_t gdp_cuda_recurrent(struct gdp_ctx *ctx, const gdp_recurrent_args *a) {
    static const char *op = "gdp_fused_recurrent_gated_delta_rule_update";
    const int64_t B = a->q.shape[0], T = a->q.shape[1], H = a->q.shape[2], K = a->q.shape[3];
    const int64_t V = a->v.shape[3];
    const bool cache = gdp_tensor_present(&a->state);
    if (K > 256)
        GDP_FAIL(GDP_STATUS_UNSUPPORTED, "%s: K = %lld; the CUDA decode kernel holds at most 256 state rows", op,
                 (long long)K);
    if (T > INT32_MAX || H > INT32_MAX)
        GDP_FAIL(GDP_STATUS_UNSUPPORTED, "%s: T = %lld, H = %lld exceed the kernel's int32 indexing", op,
                 (long long)T, (long long)H);
    if (B == 0)
        return GDP_STATUS_SUCCESS;

    RecurrentParams p = {};
    p.q = a->q.data;
    p.k = a->k.data;
    p.v = a->v.data;
    p.beta = gdp_tensor_present(&a->beta) ? a->beta.data : nullptr;
    p.g = gdp_tensor_present(&a->g) ? static_cast<const float *>(a->g.data) : nullptr;
    p.qkv_dtype = a->q.dtype;
    p.beta_dtype = gdp_tensor_present(&a->beta) ? a->beta.dtype : GDP_DTYPE_FP32;
    p.o = a->o.data;
    p.o_dtype = a->o.dtype;
    p.B = B;
    p.T = (int32_t)T;
    p.H = (int32_t)H;
    p.K = (int32_t)K;
    p.V = (int32_t)V;
    p.steps_per_token = a->steps_per_token;
    p.S = (int32_t)(T / a->steps_per_token);
    p.scale = a->scale != 0 ? (float)a->scale : (float)(1.0 / sqrt((double)K));
    p.l2norm = a->use_qk_l2norm_in_kernel != 0;
    const int es = (int)gdp_dtype_size(a->q.dtype), es_o = (int)gdp_dtype_size(a->o.dtype);
    p.qk_vec = aligned16(p.q) && aligned16(p.k) && (K * es) % 16 == 0;
    p.v_vec = aligned16(p.v) && (V * es) % 16 == 0;
    p.o_vec = aligned16(p.o) && (V * es_o) % 16 == 0;

    gdp_dtype_t state_dtype;
    if (cache) {
        state_dtype = a->state.dtype;
        p.cache = 1;
        p.slots = a->state.shape[0];
        p.indices = gdp_tensor_present(&a->state_indices) ? static_cast<const int32_t *>(a->state_indices.data)
                                                          : nullptr;
        p.state_in = a->state.data;
        p.state_out = a->state.data;
        p.in_stride_row = p.out_stride_row = gdp_tensor_stride(&a->state, 0);
        p.in_stride_head = p.out_stride_head = gdp_tensor_stride(&a->state, 1);
        p.out_fp32 = 0;
        p.inter = gdp_tensor_present(&a->intermediate_states) ? a->intermediate_states.data : nullptr;
    } else {
        const bool has_init = gdp_tensor_present(&a->initial_state);
        state_dtype = has_init ? a->initial_state.dtype : GDP_DTYPE_FP32;
        p.state_in = has_init ? a->initial_state.data : nullptr;
        p.in_stride_row = H * K * V;
        p.in_stride_head = K * V;
        p.state_out = a->output_final_state ? a->final_state.data : nullptr;
        p.out_stride_row = H * K * V;
        p.out_stride_head = K * V;
        p.out_fp32 = 1;
        p.slots = B;
    }

    /* 16-byte state accesses when columns, strides and pointers allow them. */
    const int vw = state_dtype == GDP_DTYPE_FP32 ? 4 : 8;
    const bool vec = V % vw == 0 && p.in_stride_row % vw == 0 && p.in_stride_head % vw == 0 &&
                     p.out_stride_row % vw == 0 && p.out_stride_head % vw == 0 && aligned16(p.state_in) &&
                     aligned16(p.state_out) && aligned16(p.inter);

    cudaStream_t stream = static_cast<cudaStream_t>(ctx->stream);
    cudaError_t err;
    switch (state_dtype) {
    case GDP_DTYPE_FP32: err = dispatch_tile<GDP_DTYPE_FP32>(p, vec, ctx->device, stream); break;
    case GDP_DTYPE_BF16: err = dispatch_tile<GDP_DTYPE_BF16>(p, vec, ctx->device, stream); break;
    case GDP_DTYPE_FP16: err = dispatch_tile<GDP_DTYPE_FP16>(p, vec, ctx->device, stream); break;
    default:
        GDP_FAIL(GDP_STATUS_UNSUPPORTED, "%s: state dtype %s is not supported by the CUDA kernel (fp32, bf16, fp16)",
                 op, gdp_dtype_name(state_dtype));
    }
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        GDP_FAIL(GDP_STATUS_CUDA_ERROR, "%s: kernel launch failed: %s (B %lld, H %lld, K %lld, V %lld, T %lld)", op,
                 cudaGetErrorString(err), (long long)B, (long long)H, (long long)K, (long long)V, (long long)T);
    }
    return GDP_STATUS_SUCCESS;
}
