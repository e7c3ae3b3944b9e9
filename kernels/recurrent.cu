/*
 * recurrent.cu: the CUDA kernel of gdp_fused_recurrent_gated_delta_rule_update, the decode
 * op (gdp-math.md 5, api-reference/fused_recurrent.md): per (request, head) the K x V state
 * walks the request's T = S*M steps (decay, delta-rule update, read-out), in place on the
 * cache slots or dense, with optional per-token snapshots (intermediate_states).
 *
 * Design (bandwidth first, decode is memory-bound by an order of magnitude):
 *   - one block of 128 threads owns one (request, head, block of BV value columns); the
 *     block's state tile is read once and written once, 16 bytes per thread access, and
 *     stays in registers across every step;
 *   - thread (row group rg, column group cg) holds rows rg + 16 i (i < R) of CW adjacent
 *     columns: CW = 4 for an fp32 state, 8 for bf16/fp16, so BV = 8 CW columns per block;
 *     R = ceil(K / 16) is a template (2, 4, 8, 16: K <= 256);
 *   - per step one fused reduction over K gives both S^T k and S^T q (after the decay),
 *     so o = S^T q + delta (k . q) needs one __syncthreads per step: butterflies inside a
 *     warp, then a fixed-order sum of the 4 warps' partials in shared memory (double
 *     buffered); no atomics, the same bits every run;
 *   - q, k (L2-normalized in fp32, never rounded; scale applied after the norm), v, beta and
 *     exp(g) of up to 8 steps at a time are staged in shared memory as fp32, every load of
 *     a round issued before the first store (one memory latency per tile);
 *   - each block prefetches into L2 the state tile and q/k/v rows of the block one
 *     generation of resident blocks ahead (prefetch.global.L2 holds no registers), so
 *     later blocks find their data in L2 and DRAM keeps requests queued;
 *   - no host synchronization and no allocation: the launch is graph-capturable.
 * A pipelined variant (resident grid, next tile streamed into shared memory by cp.async)
 * was measured slower on the H200 and removed (commit 7a961f2, NOTES-ops.md).
 * Splitting V across blocks keeps small batches spread over the GPU (B = 1, H = 16,
 * K = V = 128, fp32: 64 blocks).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <type_traits> /* std::integral_constant (with_k_and_m) */

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "device_info.h"
#include "dtype_access.cuh"
#include "mbarrier.cuh" /* the ring kernel's mbarriers and bulk copies */
#include "mma_tf32.cuh" /* the tensor-core kernel's tf32 products */
#include "gdp_kernels.h"
#include "norm_math.cuh"
#include "pdl.cuh"
#include "src/cuda_check.h"
#include "src/internal.h"

// CUDA kernels

namespace {

constexpr int REC_THREADS = 128;
constexpr int REC_WARPS = REC_THREADS / 32;
constexpr int REC_COL_GROUPS = 8;                            /* column groups per block */
constexpr int REC_ROW_GROUPS = REC_THREADS / REC_COL_GROUPS; /* 16 row groups          */
constexpr int REC_TILE_STEPS = 8;                            /* steps staged at a time */
/* Default L2 prefetch distance in generations of resident blocks (see prefetch_generations). */
constexpr double REC_PREFETCH_GENERATIONS = 1.0;

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
    int32_t T, H, K, V, steps_per_token, S, n_vblocks, tile_steps;
    float scale;
    int l2norm;
    int64_t prefetch_distance; /* block b prefetches block b + this into L2 (0: off) */
    int32_t ring_stages;       /* the ring kernel's stages (launch_recurrent_ring) */
    /* 1: the row and tensor-core kernels launch as programmatic dependents of the kernel ahead,
     * which writes q, k, v, g and beta but never the state (the layer's decode front: gdp_cuda_
     * recurrent_after_front); their first item's state load goes out before pdl_wait. */
    int after_front;
    /* The fused grouped gated RMSNorm of the decode end (gdp_decode_recurrent_norm): the
     * last of a (request, norm group)'s blocks to finish normalizes the group's outputs. */
    int norm_on;             /* 0: no norm in this launch                                   */
    int norm_chunks;         /* 8-element chunks a lane (1 or 2), as norm.cu's launch picks */
    int32_t norm_hpg;        /* heads per norm group (group = norm_hpg * V elements)        */
    int32_t norm_arrivals;   /* blocks per (request, group): norm_hpg * n_vblocks           */
    uint32_t *arrivals;      /* [B][H / norm_hpg] counters, 0 before and after the launch  */
    NormParams norm;         /* x = the last Householder copy of o (a row view), z, weight */
};

/* Bit-level storage of the state: load/store CW elements and convert to/from fp32. */
template <int SDT> struct StateStorage;
template <> struct StateStorage<GDP_DTYPE_FP32> {
    using Bits = uint32_t;
    static __device__ __forceinline__ float to_float(Bits b) { return __uint_as_float(b); }
    static __device__ __forceinline__ Bits from_float(float f) { return __float_as_uint(f); }
};
/* The 16-bit states also pack two values a word in one conversion (cvt.rn.bf16x2.f32 / .f16x2: the
 * same round-to-nearest-even bits as two single conversions, without the pack of their halves). */
template <> struct StateStorage<GDP_DTYPE_BF16> {
    using Bits = uint16_t;
    static __device__ __forceinline__ float to_float(Bits b) { return __uint_as_float((uint32_t)b << 16); }
    /* the two values of a loaded word: a shift and a mask, no extraction of the halves first */
    static __device__ __forceinline__ float2 unpack2(uint32_t w) {
        return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
    }
    static __device__ __forceinline__ Bits from_float(float f) { return __bfloat16_as_ushort(__float2bfloat16_rn(f)); }
    static __device__ __forceinline__ uint32_t pack2(float lo, float hi) {
        const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
        return *reinterpret_cast<const uint32_t *>(&v);
    }
};
template <> struct StateStorage<GDP_DTYPE_FP16> {
    using Bits = uint16_t;
    static __device__ __forceinline__ float to_float(Bits b) { return __half2float(__ushort_as_half(b)); }
    static __device__ __forceinline__ Bits from_float(float f) { return __half_as_ushort(__float2half_rn(f)); }
    static __device__ __forceinline__ uint32_t pack2(float lo, float hi) {
        const __half2 v = __floats2half2_rn(lo, hi);
        return *reinterpret_cast<const uint32_t *>(&v);
    }
};

/* CW consecutive elements: one 16-byte access when CW * sizeof(Bits) == 16, one 8-byte access
 * when it is 8 (four 16-bit elements: the shared-memory kernel's columns). */
template <int SDT, int CW>
__device__ __forceinline__ void load_columns(const typename StateStorage<SDT>::Bits *src, float (&dst)[CW]) {
    using Store = StateStorage<SDT>;
    using Bits = typename Store::Bits;
    if constexpr (SDT == GDP_DTYPE_BF16 && CW == 8) {
        const uint4 raw = *reinterpret_cast<const uint4 *>(src);
        const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const float2 f = Store::unpack2(w[j]);
            dst[2 * j] = f.x, dst[2 * j + 1] = f.y;
        }
    } else if constexpr (SDT == GDP_DTYPE_BF16 && CW == 4) {
        const uint2 raw = *reinterpret_cast<const uint2 *>(src);
        const float2 a = Store::unpack2(raw.x), b = Store::unpack2(raw.y);
        dst[0] = a.x, dst[1] = a.y, dst[2] = b.x, dst[3] = b.y;
    } else if constexpr (CW * sizeof(Bits) == 16) {
        union {
            uint4 raw;
            Bits e[CW];
        } u;
        u.raw = *reinterpret_cast<const uint4 *>(src);
#pragma unroll
        for (int c = 0; c < CW; c++)
            dst[c] = Store::to_float(u.e[c]);
    } else if constexpr (CW * sizeof(Bits) == 8) {
        union {
            uint2 raw;
            Bits e[CW];
        } u;
        u.raw = *reinterpret_cast<const uint2 *>(src);
#pragma unroll
        for (int c = 0; c < CW; c++)
            dst[c] = Store::to_float(u.e[c]);
    } else {
#pragma unroll
        for (int c = 0; c < CW; c++)
            dst[c] = Store::to_float(src[c]);
    }
}

template <int SDT, int CW>
__device__ __forceinline__ void store_columns(typename StateStorage<SDT>::Bits *dst, const float (&src)[CW]) {
    using Store = StateStorage<SDT>;
    using Bits = typename Store::Bits;
    if constexpr (sizeof(Bits) == 2 && CW * sizeof(Bits) == 16) { /* 16-bit: a word a pair */
        *reinterpret_cast<uint4 *>(dst) = make_uint4(Store::pack2(src[0], src[1]), Store::pack2(src[2], src[3]),
                                                     Store::pack2(src[4], src[5]), Store::pack2(src[6], src[7]));
    } else if constexpr (sizeof(Bits) == 2 && CW * sizeof(Bits) == 8) {
        *reinterpret_cast<uint2 *>(dst) = make_uint2(Store::pack2(src[0], src[1]), Store::pack2(src[2], src[3]));
    } else if constexpr (CW * sizeof(Bits) == 16) {
        union {
            uint4 raw;
            Bits e[CW];
        } u;
#pragma unroll
        for (int c = 0; c < CW; c++)
            u.e[c] = Store::from_float(src[c]);
        *reinterpret_cast<uint4 *>(dst) = u.raw;
    } else if constexpr (CW * sizeof(Bits) == 8) {
        union {
            uint2 raw;
            Bits e[CW];
        } u;
#pragma unroll
        for (int c = 0; c < CW; c++)
            u.e[c] = Store::from_float(src[c]);
        *reinterpret_cast<uint2 *>(dst) = u.raw;
    } else {
#pragma unroll
        for (int c = 0; c < CW; c++)
            dst[c] = Store::from_float(src[c]);
    }
}

/* CW fp32 values to an fp32 tensor: float4 stores when CW is a multiple of 4. */
template <int CW> __device__ __forceinline__ void store_columns_f32(float *dst, const float (&src)[CW]) {
    if constexpr (CW % 4 == 0) {
#pragma unroll
        for (int c = 0; c < CW; c += 4)
            *reinterpret_cast<float4 *>(dst + c) = make_float4(src[c], src[c + 1], src[c + 2], src[c + 3]);
    } else {
#pragma unroll
        for (int c = 0; c < CW; c++)
            dst[c] = src[c];
    }
}


__device__ __forceinline__ int gdp_dtype_size_device(gdp_dtype_t dtype) { return dtype == GDP_DTYPE_FP32 ? 4 : 2; }


constexpr int REC_STAGE_UNROLL = 4; /* elements per thread and array loaded before any is stored */

/* Stages steps [t0, t0 + ns) of q, k (rows padded to KP), v (this block's BV columns),
 * exp(g) and beta into shared memory as fp32, by the block's THREADS threads. Every load of
 * a round is issued before the first store, so the tile costs one memory latency, not one
 * per array and iteration. */
template <int KP, int BV, int THREADS = REC_THREADS>
__device__ __forceinline__ void stage_tile(const RecurrentParams &p, int64_t b, int h, int vb, int t0, int ns,
                                           float *qs, float *ks, float *vs, float *decay, float *betas) {
    static_assert(REC_TILE_STEPS * BV <= REC_STAGE_UNROLL * THREADS, "one round must cover a v tile");
    const int tid = threadIdx.x;
    /* one 64-bit base per tile, 32-bit offsets within it (j < 8 steps of H rows) */
    const int64_t bth0 = (b * p.T + t0) * p.H + h;
    const int64_t v_base = bth0 * p.V;
    float rv[REC_STAGE_UNROLL];
#pragma unroll
    for (int u = 0; u < REC_STAGE_UNROLL; u++) {
        const int idx = tid + u * THREADS;
        const int j = idx / BV, col = vb * BV + (idx - j * BV);
        rv[u] = idx < ns * BV && col < p.V ? load_as_float(p.v, p.qkv_dtype, v_base + (j * p.H * p.V + col)) : 0.0f;
    }
    float g_raw = 0.0f, beta = 1.0f;
    if (tid < ns) {
        const int64_t bth = (b * p.T + t0 + tid) * p.H + h;
        if (p.g != nullptr)
            g_raw = p.g[bth];
        if (p.beta != nullptr)
            beta = load_as_float(p.beta, p.beta_dtype, bth);
    }
    const int total = ns * KP;
    for (int base = 0; base < total; base += REC_STAGE_UNROLL * THREADS) {
        float rq[REC_STAGE_UNROLL], rk[REC_STAGE_UNROLL];
#pragma unroll
        for (int u = 0; u < REC_STAGE_UNROLL; u++) {
            const int idx = base + tid + u * THREADS;
            const int j = idx / KP, kk = idx - j * KP;
            const int64_t off = bth0 * p.K + (j * p.H * p.K + kk);
            const bool ok = idx < total && kk < p.K;
            rq[u] = ok ? load_as_float(p.q, p.qkv_dtype, off) : 0.0f;
            rk[u] = ok ? load_as_float(p.k, p.qkv_dtype, off) : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < REC_STAGE_UNROLL; u++) {
            const int idx = base + tid + u * THREADS;
            if (idx < total) {
                qs[idx] = rq[u];
                ks[idx] = rk[u];
            }
        }
    }
#pragma unroll
    for (int u = 0; u < REC_STAGE_UNROLL; u++) {
        const int idx = tid + u * THREADS;
        if (idx < ns * BV)
            vs[idx] = rv[u];
    }
    if (tid < ns) {
        decay[tid] = p.g != nullptr ? expf(g_raw) : 1.0f;
        betas[tid] = beta;
    }
}

/* Shared-memory floats of one block's step area: q, k tiles [TS][16 R], v tile [TS][BV],
 * exp(g), beta and k.q per step, and two reduction buffers [warps][2 BV], which start on a
 * 16-byte boundary (step_readout reads them as float4). */
__host__ __device__ constexpr int64_t recurrent_red_offset(int tile_steps, int kp, int bv) {
    return (int64_t)tile_steps * (2 * kp + bv) + ((3 * (int64_t)tile_steps + 3) & ~(int64_t)3);
}
__host__ __device__ constexpr int64_t recurrent_smem_floats(int tile_steps, int kp, int bv) {
    return recurrent_red_offset(tile_steps, kp, bv) + 2 * REC_WARPS * 2 * bv;
}

/* Compile-time geometry of one kernel instance. */
template <int SDT, int R, bool VEC> struct RecGeom {
    using Store = StateStorage<SDT>;
    using Bits = typename Store::Bits;
    static constexpr int CW = VEC ? (int)(16 / sizeof(Bits)) : 1; /* columns per thread */
    static constexpr int BV = REC_COL_GROUPS * CW;                 /* columns per block */
    static constexpr int KP = REC_ROW_GROUPS * R;                  /* K padded to the row tiling */
};

/* Blocks per SM the register budget must allow: 4 (<= 128 registers) when a thread holds
 * at most 32 state values, which keeps K = V = 128 fp32 at 64 KB of state per SM in flight. */
template <int SDT, int R, bool VEC> constexpr int recurrent_min_blocks() {
    return R * RecGeom<SDT, R, VEC>::CW <= 32 ? 4 : 1;
}

/* The (request, head, value block) of work item `item` (value blocks fastest). */
/* 32-bit: the launchers refuse grids past INT32_MAX items, and a 64-bit division by a
 * runtime value is a long IMAD sequence (ncu: the decode kernels issue-bound, integer work
 * a large share of it); two per block, for its item and its prefetch target. */
__device__ __forceinline__ void item_coords(const RecurrentParams &p, int64_t item, int64_t &b, int &h, int &vb) {
    const uint32_t i = (uint32_t)item, nv = (uint32_t)p.n_vblocks, nh = (uint32_t)p.H;
    const uint32_t bh = i / nv;
    vb = (int)(i - bh * nv);
    const uint32_t bq = bh / nh;
    h = (int)(bh - bq * nh);
    b = (int64_t)bq;
}

/* The state row of request b: its slot (cache mode; -1 and out-of-range slots count as
 * padding), or b itself (dense mode). */
__device__ __forceinline__ int64_t state_row(const RecurrentParams &p, int64_t b) {
    return p.cache && p.indices != nullptr ? (int64_t)p.indices[b] : b;
}
__device__ __forceinline__ bool row_is_padding(const RecurrentParams &p, int64_t row) {
    return p.cache && (row < 0 || row >= p.slots);
}

/* A block's item and the item it prefetches into L2 (one residency generation ahead): their
 * coordinates and slots, loaded first so their latency hides behind the staging. */
struct BlockItems {
    int64_t b, row, f_b, f_row;
    int h, vb, f_h, f_vb;
    bool has_future;
};
__device__ __forceinline__ BlockItems block_items(const RecurrentParams &p) {
    BlockItems it = {};
    item_coords(p, blockIdx.x, it.b, it.h, it.vb);
    it.row = state_row(p, it.b);
    const int64_t future = p.prefetch_distance > 0 ? (int64_t)blockIdx.x + p.prefetch_distance : -1;
    it.has_future = future >= 0 && future < (int64_t)gridDim.x;
    if (it.has_future) {
        item_coords(p, future, it.f_b, it.f_h, it.f_vb);
        it.f_row = state_row(p, it.f_b);
    }
    return it;
}

/* Padding request: output 0 for this block's columns, no slot read or written. */
template <int CW>
__device__ __forceinline__ void write_zero_output(const RecurrentParams &p, int64_t b, int h, int col0, bool col_ok,
                                                  int lt) {
    if (lt / REC_COL_GROUPS == 0 && col_ok) /* lt: the thread's index in its 128-thread group */
        for (int t = 0; t < p.T; t++)
#pragma unroll
            for (int c = 0; c < CW; c++)
                store_from_float(p.o, p.o_dtype, ((b * p.T + t) * p.H + h) * p.V + col0 + c, 0.0f);
}

/* Padding request of the resident-grid kernels: output 0 for the slice of BV columns from vb BV, all
 * T steps, the block's THREADS threads each taking every THREADS-th element. */
template <int BV, int THREADS>
__device__ __forceinline__ void zero_slice_outputs(const RecurrentParams &p, int64_t b, int h, int vb) {
    for (int x = threadIdx.x; x < p.T * BV; x += THREADS) {
        const int t = x / BV, c = x - t * BV;
        store_from_float(p.o, p.o_dtype, ((b * p.T + t) * p.H + h) * p.V + vb * BV + c, 0.0f);
    }
}

/* L2 prefetch of item (b, h, vb)'s q, k and v rows (and, with state, its state tile). */
template <int BV, typename Bits, int THREADS = REC_THREADS>
__device__ __forceinline__ void prefetch_item(const RecurrentParams &p, int64_t b, int h, int vb, const Bits *state) {
    const int tid = threadIdx.x, col = vb * BV;
    const int es = gdp_dtype_size_device(p.qkv_dtype);
    const int64_t cols = min(BV, p.V - col);
    if (state != nullptr)
        for (int kr = tid; kr < p.K; kr += THREADS)
            prefetch_l2(state + (int64_t)kr * p.V + col, cols * (int64_t)sizeof(Bits));
    const int64_t qk_bytes = (int64_t)p.K * es;
    for (int x = tid; x < 3 * p.T; x += THREADS) {
        const int t = x / 3, which = x - 3 * t;
        const int64_t bth = (b * p.T + t) * p.H + h;
        if (which == 0)
            prefetch_l2(static_cast<const char *>(p.q) + bth * qk_bytes, qk_bytes);
        else if (which == 1)
            prefetch_l2(static_cast<const char *>(p.k) + bth * qk_bytes, qk_bytes);
        else
            prefetch_l2(static_cast<const char *>(p.v) + (bth * p.V + col) * es, cols * es);
    }
}

/* Per step (one warp each) of a staged tile: the L2 norms of q and k in fp32, then the
 * scale, then k . q into kq. Shared by both kernels; the caller syncs after it. */
template <int KP, int WARPS = REC_WARPS>
__device__ __forceinline__ void normalize_steps(const RecurrentParams &p, int ns, float *qs, float *ks, float *kq) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int j = warp; j < ns; j += WARPS) {
        float *qj = qs + j * KP, *kj = ks + j * KP;
        float fq = 1.0f, fk = 1.0f;
        if (p.l2norm) {
            float ssq = 0.0f, ssk = 0.0f;
            for (int kk = lane; kk < KP; kk += 32) {
                ssq += qj[kk] * qj[kk];
                ssk += kj[kk] * kj[kk];
            }
            fq = 1.0f / sqrtf(warp_sum(ssq) + (float)GDP_L2NORM_EPS);
            fk = 1.0f / sqrtf(warp_sum(ssk) + (float)GDP_L2NORM_EPS);
        }
        float dot = 0.0f;
        for (int kk = lane; kk < KP; kk += 32) {
            const float qn = (qj[kk] * fq) * p.scale, kn = kj[kk] * fk;
            qj[kk] = qn;
            kj[kk] = kn;
            dot += kn * qn;
        }
        dot = warp_sum(dot);
        if (lane == 0)
            kq[j] = dot;
    }
}

/* One step's reduction and read-out, shared by both kernels: this thread's partial S^T k and
 * S^T q over its rows summed over the warp's 4 row groups (8 lanes apart), then a fixed-order
 * sum of the 4 warps' partials through buf (one __syncthreads), delta = beta (v - S^T k) and
 * o = S^T q + delta (k . q) (= (S + k delta^T)^T q), written by the first row group. */
template <int CW, int BV>
__device__ __forceinline__ void step_readout(const RecurrentParams &p, float (&sk)[CW], float (&sq)[CW], float *buf,
                                             const float *vj, float beta, float kqj, int64_t b, int h, int t,
                                             int col0, bool col_ok, float (&delta)[CW], int lt) {
    /* lt: the thread's index in its 128-thread group (the group's warps, lanes, column groups) */
    const int tid = lt, lane = tid & 31, warp = tid >> 5, cg = tid % REC_COL_GROUPS;
#pragma unroll
    for (int c = 0; c < CW; c++) {
        sk[c] += __shfl_xor_sync(0xffffffffu, sk[c], 8);
        sk[c] += __shfl_xor_sync(0xffffffffu, sk[c], 16);
        sq[c] += __shfl_xor_sync(0xffffffffu, sq[c], 8);
        sq[c] += __shfl_xor_sync(0xffffffffu, sq[c], 16);
    }
    if (lane < REC_COL_GROUPS) {
#pragma unroll
        for (int c = 0; c < CW; c++) {
            buf[warp * 2 * BV + cg * CW + c] = sk[c];
            buf[warp * 2 * BV + BV + cg * CW + c] = sq[c];
        }
    }
    __syncthreads();
    /* the same sums in the same order (warp 0 first), 4 columns per shared-memory access */
    float a[CW], q[CW];
    if constexpr (CW % 4 == 0) {
#pragma unroll
        for (int c = 0; c < CW; c += 4) {
            const float4 a0 = *reinterpret_cast<const float4 *>(buf + cg * CW + c);
            const float4 q0 = *reinterpret_cast<const float4 *>(buf + BV + cg * CW + c);
            a[c] = a0.x, a[c + 1] = a0.y, a[c + 2] = a0.z, a[c + 3] = a0.w;
            q[c] = q0.x, q[c + 1] = q0.y, q[c + 2] = q0.z, q[c + 3] = q0.w;
#pragma unroll
            for (int w = 1; w < REC_WARPS; w++) {
                const float4 aw = *reinterpret_cast<const float4 *>(buf + w * 2 * BV + cg * CW + c);
                const float4 qw = *reinterpret_cast<const float4 *>(buf + w * 2 * BV + BV + cg * CW + c);
                a[c] += aw.x, a[c + 1] += aw.y, a[c + 2] += aw.z, a[c + 3] += aw.w;
                q[c] += qw.x, q[c + 1] += qw.y, q[c + 2] += qw.z, q[c + 3] += qw.w;
            }
        }
    } else {
#pragma unroll
        for (int c = 0; c < CW; c++) {
            a[c] = buf[cg * CW + c], q[c] = buf[BV + cg * CW + c];
#pragma unroll
            for (int w = 1; w < REC_WARPS; w++) {
                a[c] += buf[w * 2 * BV + cg * CW + c];
                q[c] += buf[w * 2 * BV + BV + cg * CW + c];
            }
        }
    }
    float out[CW];
#pragma unroll
    for (int c = 0; c < CW; c++) {
        delta[c] = beta * (vj[cg * CW + c] - a[c]);
        out[c] = q[c] + delta[c] * kqj;
    }
    if (tid < REC_COL_GROUPS && col_ok) {
        const int64_t o_off = ((b * p.T + t) * p.H + h) * p.V + col0;
#pragma unroll
        for (int c = 0; c < CW; c++)
            store_from_float(p.o, p.o_dtype, o_off + c, out[c]);
    }
}

/* Where a block's state tile lives, for the one step loop both kernels share (run_steps):
 * a thread's R rows of CW columns, read with get and written with put. RegisterTile: in the
 * thread's registers (the register kernel), decayed in place before the sums (a put there
 * costs nothing); SharedTile: the thread's own 16-byte cells of the shared-memory tile, PITCH
 * floats apart (the shared-memory kernel), where a put is a store, so the update recomputes
 * the decayed value instead (the same rounded product). */
template <int R, int CW> struct RegisterTile {
    static constexpr bool DECAY_IN_PLACE = true;
    float (&st)[R][CW];
    __device__ __forceinline__ void get(int i, float (&v)[CW]) const {
#pragma unroll
        for (int c = 0; c < CW; c++)
            v[c] = st[i][c];
    }
    __device__ __forceinline__ void put(int i, const float (&v)[CW]) const {
#pragma unroll
        for (int c = 0; c < CW; c++)
            st[i][c] = v[c];
    }
};
template <int PITCH> struct SharedTile {
    static constexpr bool DECAY_IN_PLACE = false;
    float *mine;
    __device__ __forceinline__ void get(int i, float (&v)[4]) const {
        const float4 raw = *reinterpret_cast<const float4 *>(mine + i * PITCH);
        v[0] = raw.x, v[1] = raw.y, v[2] = raw.z, v[3] = raw.w;
    }
    __device__ __forceinline__ void put(int i, const float (&v)[4]) const {
        *reinterpret_cast<float4 *>(mine + i * PITCH) = make_float4(v[0], v[1], v[2], v[3]);
    }
};

/* The steps of one item whose first input tile is already staged and whose state tile is in
 * `tile`: norms, the T steps (snapshots included), then the final state store. A block is
 * NVB groups of 128 threads, each owning BV columns (NVB = 1: the whole block). Per step each
 * row's state is decayed (one rounded product, kept or recomputed: see the tiles), summed
 * into S^T k and S^T q, read out, and updated. Every thread of the block calls it (it holds
 * __syncthreads). */
template <int SDT, int R, int CW, int BV, int NVB, typename Tile>
__device__ __forceinline__ void run_steps(const RecurrentParams &p, int64_t b, int h, int vb, int64_t row,
                                          const Tile &tile, float *area) {
    using Bits = typename StateStorage<SDT>::Bits;
    constexpr int KP = REC_ROW_GROUPS * R;
    constexpr int BVB = NVB * BV, THREADS = NVB * REC_THREADS; /* the block's columns and threads */
    const int sub = NVB == 1 ? 0 : (int)threadIdx.x / REC_THREADS; /* the group (NVB = 1: known 0) */
    const int lt = NVB == 1 ? (int)threadIdx.x : (int)threadIdx.x % REC_THREADS;
    const int cg = lt % REC_COL_GROUPS, rg = lt / REC_COL_GROUPS;
    const int col0 = vb * BVB + sub * BV + cg * CW;
    const bool col_ok = col0 < p.V; /* V % CW == 0 (16-byte columns) or CW = 1: a group is all in or out */
    const int64_t KV = (int64_t)p.K * p.V;
    const int TS = p.tile_steps;
    float *qs = area;             /* [TS][KP] normalized, scaled q  */
    float *ks = qs + TS * KP;     /* [TS][KP] normalized k          */
    float *vs = ks + TS * KP;     /* [TS][BVB] this block's columns */
    float *decay = vs + TS * BVB; /* [TS] exp(g)                    */
    float *betas = decay + TS;    /* [TS]                           */
    float *kq = betas + TS;       /* [TS] k . q                     */
    float *red = area + recurrent_red_offset(TS, KP, BVB); /* [2][NVB][warps][2 BV], 16-byte aligned */
    const bool has_g = p.g != nullptr;

    for (int t0 = 0; t0 < p.T; t0 += TS) {
        const int ns = min(TS, p.T - t0);
        if (t0 > 0) {
            __syncthreads(); /* every thread is done with the previous tile */
            stage_tile<KP, BVB, THREADS>(p, b, h, vb, t0, ns, qs, ks, vs, decay, betas);
        }
        __syncthreads();
        normalize_steps<KP, THREADS / 32>(p, ns, qs, ks, kq);
        __syncthreads();
        for (int j = 0; j < ns; j++) {
            const int t = t0 + j;
            const float *qj = qs + j * KP, *kj = ks + j * KP;
            float *buf = red + ((t & 1) * NVB + sub) * (REC_WARPS * 2 * BV);
            const float e = has_g ? decay[j] : 1.0f;
            /* S^T k and S^T q over this thread's rows, of the decayed state */
            float sk[CW], sq[CW];
#pragma unroll
            for (int c = 0; c < CW; c++)
                sk[c] = sq[c] = 0.0f;
#pragma unroll
            for (int i = 0; i < R; i++) {
                float st[CW];
                tile.get(i, st);
                if (has_g) {
#pragma unroll
                    for (int c = 0; c < CW; c++)
                        st[c] *= e;
                    if (Tile::DECAY_IN_PLACE)
                        tile.put(i, st);
                }
                const float kv = kj[rg + REC_ROW_GROUPS * i], qv = qj[rg + REC_ROW_GROUPS * i];
#pragma unroll
                for (int c = 0; c < CW; c++) {
                    sk[c] = fmaf(st[c], kv, sk[c]);
                    sq[c] = fmaf(st[c], qv, sq[c]);
                }
            }
            float delta[CW];
            step_readout<CW, BV>(p, sk, sq, buf, vs + j * BVB + sub * BV, betas[j], kq[j], b, h, t, col0, col_ok, delta,
                                 lt);
            /* the update, and the snapshot after token s = (t + 1) / M - 1 at [slot, s, h] */
            const bool snapshot = p.inter != nullptr && (t + 1) % p.steps_per_token == 0 && col_ok;
            Bits *snap = snapshot ? static_cast<Bits *>(p.inter) +
                                        ((row * p.S + ((t + 1) / p.steps_per_token - 1)) * p.H + h) * KV
                                  : nullptr;
#pragma unroll
            for (int i = 0; i < R; i++) {
                float st[CW];
                tile.get(i, st);
                const float kv = kj[rg + REC_ROW_GROUPS * i];
#pragma unroll
                for (int c = 0; c < CW; c++) {
                    if (has_g && !Tile::DECAY_IN_PLACE)
                        st[c] *= e;
                    st[c] = fmaf(kv, delta[c], st[c]);
                }
                tile.put(i, st);
                const int kr = rg + REC_ROW_GROUPS * i;
                if (snap != nullptr && kr < p.K)
                    store_columns<SDT, CW>(snap + (int64_t)kr * p.V + col0, st);
            }
        }
    }

    /* The final state: back into the slot (its dtype), or dense fp32. */
    if (p.state_out != nullptr && col_ok) {
#pragma unroll
        for (int i = 0; i < R; i++) {
            const int kr = rg + REC_ROW_GROUPS * i;
            if (kr >= p.K)
                continue;
            float st[CW];
            tile.get(i, st);
            const int64_t off = row * p.out_stride_row + h * p.out_stride_head + (int64_t)kr * p.V + col0;
            if (SDT == GDP_DTYPE_FP32 || p.out_fp32)
                store_columns_f32<CW>(static_cast<float *>(p.state_out) + off, st);
            else
                store_columns<SDT, CW>(static_cast<Bits *>(p.state_out) + off, st);
        }
    }
}

/* One block per item (request b, head h, value block vb); see the file comment. */
template <int SDT, int R, bool VEC>
__global__ void __launch_bounds__(REC_THREADS, recurrent_min_blocks<SDT, R, VEC>())
    recurrent_kernel(const RecurrentParams p) {
    using G = RecGeom<SDT, R, VEC>;
    using Bits = typename G::Bits;
    constexpr int CW = G::CW, BV = G::BV, KP = G::KP;
    extern __shared__ __align__(16) float smem[];
    const int tid = threadIdx.x;
    const int cg = tid % REC_COL_GROUPS, rg = tid / REC_COL_GROUPS;
    const BlockItems it = block_items(p);
    const int64_t b = it.b, row = it.row;
    const int h = it.h, vb = it.vb;
    const int col0 = vb * BV + cg * CW;
    const bool col_ok = col0 < p.V;

    /* 1. The first tile of inputs (one memory latency, overlapping the slot loads). */
    stage_tile<KP, BV>(p, b, h, vb, 0, min(p.tile_steps, p.T), smem, smem + p.tile_steps * KP,
                       smem + 2 * p.tile_steps * KP, smem + p.tile_steps * (2 * KP + BV),
                       smem + p.tile_steps * (2 * KP + BV + 1));
    if (row_is_padding(p, row)) {
        write_zero_output<CW>(p, b, h, col0, col_ok, tid);
        return;
    }

    /* 2. The state tile into registers: 16-byte loads, read once. */
    float st[R][CW];
    const Bits *in = p.state_in == nullptr
                         ? nullptr
                         : static_cast<const Bits *>(p.state_in) + row * p.in_stride_row + h * p.in_stride_head;
#pragma unroll
    for (int i = 0; i < R; i++) {
        const int kr = rg + REC_ROW_GROUPS * i;
        if (in != nullptr && kr < p.K && col_ok) {
            load_columns<SDT, CW>(in + (int64_t)kr * p.V + col0, st[i]);
        } else {
#pragma unroll
            for (int c = 0; c < CW; c++)
                st[i][c] = 0.0f;
        }
    }

    /* 3. Prefetch the block one residency generation ahead (by default) into L2: its state
     * tile and its q, k, v rows, so its loads hit L2 and DRAM always has requests queued. */
    if (it.has_future && !row_is_padding(p, it.f_row))
        prefetch_item<BV, Bits>(p, it.f_b, it.f_h, it.f_vb,
                                p.state_in == nullptr ? nullptr
                                                      : static_cast<const Bits *>(p.state_in) +
                                                            it.f_row * p.in_stride_row + it.f_h * p.in_stride_head);

    /* 4. Norms, steps, final state. */
    run_steps<SDT, R, CW, BV, 1>(p, b, h, vb, row, RegisterTile<R, CW>{st}, smem);
}

/* ---- the shared-memory state variant (GDP_DECODE_STATE=smem; 4 columns a thread) ----
 * The register kernel holds its 128 x 32 fp32 tile in 32 registers a thread across every
 * barrier: 122 registers, 4 blocks (64 KB of state) per SM, and a block's state bytes are in
 * flight only while it waits for them (a 16-bit state: 128 x 64 in 64 registers, 168-183
 * registers, 2-3 blocks). Here the tile lives in shared memory as fp32 (128 x 32, 16 KB a
 * block, 228 KB per SM), loaded by cp.async (no registers): 16 bytes a row and thread for
 * fp32, 8 bytes (4 elements) for bf16/fp16, widened to fp32 in place by the thread that
 * loaded them. A step reads each thread's own elements twice (for the sums, then for the
 * update: the decay is recomputed, the same rounded product) and writes them once; no state
 * value is live across a barrier, so the kernel fits recurrent_smem_min_blocks blocks. Every
 * thread touches only the tile elements it loaded, so the tile itself needs no barrier. The
 * arithmetic of each element is the register kernel's, in the same order (a column's sums
 * run over the same rows, lanes and warps whatever the column width): the results are
 * bit-identical, and the state is rounded to its dtype only where the register kernel
 * rounds it (snapshots, the final store). */

template <int R> constexpr int recurrent_smem_min_blocks() { return R <= 8 ? 8 : 5; }

__device__ __forceinline__ void cp_async_16(void *smem_dst, const void *gmem_src) {
    const unsigned dst = (unsigned)__cvta_generic_to_shared(smem_dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(gmem_src) : "memory");
}
/* 8 bytes (.cg takes only 16; .ca also caches the line in L1, which a read-once tile does not need
 * but does not hurt). */
__device__ __forceinline__ void cp_async_8(void *smem_dst, const void *gmem_src) {
    const unsigned dst = (unsigned)__cvta_generic_to_shared(smem_dst);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(dst), "l"(gmem_src) : "memory");
}
/* "memory": no shared-memory access of the tile may move above the wait. */
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

/* The smem kernel's geometry: 4 fp32 columns a thread whatever the state's dtype; a group of
 * 128 threads owns BV = 32 value columns, and a block of NVB groups owns NVB * 32 (NVB = 1:
 * one block per 32 columns; NVB > 1, GDP_DECODE_STATE=head: one block per (request, head)
 * up to V = 32 NVB, so the q, k staging, the norms and the slot lookup are done once for
 * the head instead of once per 32 columns; each group's sums and read-out are its own, as in
 * NVB = 1, so the bits do not change). */
template <int R> using SmemGeom = RecGeom<GDP_DTYPE_FP32, R, true>;

/* The step area of a block of NVB groups: q, k [TS][KP], v [TS][32 NVB], exp(g), beta, k.q,
 * then two reduction buffers per group [2][NVB][warps][2 x 32] on a 16-byte boundary. */
__host__ __device__ constexpr int64_t smem_area_floats(int tile_steps, int kp, int nvb) {
    return recurrent_red_offset(tile_steps, kp, 32 * nvb) + 2 * (int64_t)nvb * REC_WARPS * 2 * 32;
}

/* The fused gated norm's tail, run by every block of the launch after its outputs are
 * written (padding rows included: the norm of their zeros is still the chain's output). Each
 * block makes its o stores visible, then counts itself in its (request, group); the last to
 * arrive resets the counter for the next launch and normalizes the group's vector with
 * norm.cu's own per-vector body (the same bits as gdp_gated_rmsnorm), reading y through L2
 * (other blocks wrote it). No block waits for another, so any schedule finishes. */
__device__ __forceinline__ void fused_norm_tail(const RecurrentParams &p, int64_t b, int h) {
    __shared__ int last;
    __threadfence();
    __syncthreads();
    const int grp = h / p.norm_hpg;
    if (threadIdx.x == 0) {
        uint32_t *count = p.arrivals + b * p.norm.groups + grp;
        const uint32_t before = atomicAdd(count, 1u);
        last = before + 1 == (uint32_t)p.norm_arrivals;
        if (last)
            *count = 0; /* every block of the group has counted: none touches it again */
    }
    __syncthreads();
    if (!last)
        return;
    __threadfence();
    if (threadIdx.x < 32) {
        const int64_t vec = b * p.norm.groups + grp;
        if (p.norm_chunks == 1)
            norm_fast_vector<false, true, false, 1, true>(p.norm, vec, (int)threadIdx.x);
        else
            norm_fast_vector<false, true, false, 2, true>(p.norm, vec, (int)threadIdx.x);
    }
}

/* One block per item (request, head, NVB * 32 value columns), as recurrent_kernel with NVB =
 * 1; dynamic shared memory: the groups' state tiles [NVB][KP][32] fp32, then the step area. */
/* Blocks per SM for NVB groups: the same registers a thread as NVB = 1 (64 up to R = 8). */
template <int R, int NVB> constexpr int recurrent_smem_block_bound() {
    return recurrent_smem_min_blocks<R>() / NVB > 0 ? recurrent_smem_min_blocks<R>() / NVB : 1;
}

template <int SDT, int R, int NVB>
__global__ void __launch_bounds__(NVB * REC_THREADS, (recurrent_smem_block_bound<R, NVB>()))
    recurrent_smem_kernel(const RecurrentParams p) {
    using G = SmemGeom<R>;
    using Bits = typename StateStorage<SDT>::Bits;
    constexpr int CW = G::CW, BV = G::BV, KP = G::KP, BVB = NVB * BV, THREADS = NVB * REC_THREADS;
    extern __shared__ __align__(16) float smem_tile[];
    float *area = smem_tile + NVB * KP * BV;
    const int sub = NVB == 1 ? 0 : (int)threadIdx.x / REC_THREADS; /* the group (NVB = 1: known 0) */
    const int lt = NVB == 1 ? (int)threadIdx.x : (int)threadIdx.x % REC_THREADS;
    const int cg = lt % REC_COL_GROUPS, rg = lt / REC_COL_GROUPS;
    const BlockItems it = block_items(p);
    const int64_t b = it.b, row = it.row;
    const int h = it.h, vb = it.vb;
    const int col0 = vb * BVB + sub * BV + cg * CW;
    const bool col_ok = col0 < p.V;
    const bool padding = row_is_padding(p, row);
    /* 1. The state tile into shared memory (cp.async: no registers held), then the inputs.
     *    A 16-bit row lands in the first 8 bytes of its 16-byte fp32 cell. */
    float *mine = smem_tile + sub * KP * BV + rg * BV + cg * CW;
    const Bits *in = p.state_in == nullptr || padding
                         ? nullptr
                         : static_cast<const Bits *>(p.state_in) + row * p.in_stride_row + h * p.in_stride_head;
#pragma unroll
    for (int i = 0; i < R; i++) {
        const int kr = rg + REC_ROW_GROUPS * i;
        float *cell = mine + i * REC_ROW_GROUPS * BV;
        if (!(in != nullptr && kr < p.K && col_ok))
            *reinterpret_cast<float4 *>(cell) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        else if constexpr (sizeof(Bits) == 4)
            cp_async_16(cell, in + (int64_t)kr * p.V + col0);
        else
            cp_async_8(cell, in + (int64_t)kr * p.V + col0);
    }
    asm volatile("cp.async.commit_group;\n" ::: "memory");
    stage_tile<KP, BVB, THREADS>(p, b, h, vb, 0, min(p.tile_steps, p.T), area, area + p.tile_steps * KP,
                                 area + 2 * p.tile_steps * KP, area + p.tile_steps * (2 * KP + BVB),
                                 area + p.tile_steps * (2 * KP + BVB + 1));
    if (padding) {
        cp_async_wait_all();
        write_zero_output<CW>(p, b, h, col0, col_ok, lt);
        if (p.norm_on)
            fused_norm_tail(p, b, h);
        return;
    }
    /* 2. The L2 prefetch of the block one generation ahead, as the register kernel. */
    if (it.has_future && !row_is_padding(p, it.f_row))
        prefetch_item<BVB, Bits, THREADS>(p, it.f_b, it.f_h, it.f_vb,
                                p.state_in == nullptr ? nullptr
                                                      : static_cast<const Bits *>(p.state_in) +
                                                            it.f_row * p.in_stride_row + it.f_h * p.in_stride_head);
    cp_async_wait_all();
    if constexpr (sizeof(Bits) != 4) { /* widen this thread's own rows in place */
#pragma unroll
        for (int i = 0; i < R; i++) {
            float *cell = mine + i * REC_ROW_GROUPS * BV;
            if (in != nullptr && rg + REC_ROW_GROUPS * i < p.K && col_ok) { /* the rows loaded above */
                float v[CW];
                load_columns<SDT, CW>(reinterpret_cast<const Bits *>(cell), v);
                *reinterpret_cast<float4 *>(cell) = make_float4(v[0], v[1], v[2], v[3]);
            }
        }
    }
    run_steps<SDT, R, CW, BV, NVB>(p, b, h, vb, row, SharedTile<REC_ROW_GROUPS * BV>{mine}, area);
    if (p.norm_on)
        fused_norm_tail(p, b, h);
}

/* Blocks of a kernel the whole device holds at once (0 if unknown), cached per device in
 * `cache` (one per kernel instance): occupancy is register-bound, so the first call's
 * shared-memory size serves. */
template <typename Kernel>
int64_t resident_blocks(Kernel kernel, int *cache, int device, size_t smem, int threads = REC_THREADS) {
    constexpr int MAX_DEVICES = 64;
    if (device < 0 || device >= MAX_DEVICES)
        return 0;
    if (cache[device] == 0) { /* 0: not computed yet; -1: unknown */
        int per_sm = 0, sms = 0;
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem) != cudaSuccess ||
            gdp_device_sm_count(device, &sms) != cudaSuccess || per_sm * sms <= 0) {
            (void)cudaGetLastError();
            cache[device] = -1;
        } else {
            cache[device] = per_sm * sms;
        }
    }
    return cache[device] > 0 ? cache[device] : 0;
}

/* How many generations of resident blocks ahead a block prefetches: GDP_DECODE_PREFETCH
 * (0..16, 0 = off), read once; default 1, the best of 0, 1, 2 and 4 on the H200 (B = 256:
 * 239, 215, 229 and 257 us; NOTES-ops.md). */
double prefetch_generations() {
    static const double g = [] {
        const char *e = getenv("GDP_DECODE_PREFETCH");
        const double v = e != nullptr ? atof(e) : REC_PREFETCH_GENERATIONS;
        return v >= 0.0 && v <= 16.0 ? v : REC_PREFETCH_GENERATIONS;
    }();
    return g;
}

/* The row kernel's grid for `items` items when the device holds `resident` blocks at once: a resident
 * grid (every block loops over items) by default. GDP_DECODE_BLOCKS_PER_SM (read once), an experiment's
 * switch: 1..8 caps the grid at that many blocks an SM, "items" launches a block an item (no loop); unset,
 * 0 or anything else: the default. A resident grid holds every SM for the whole launch, so work on other
 * streams (gdp-bench layer --split's micro-batches) can only share the GPU with a smaller grid or with
 * blocks that end. */
int64_t rows_grid(int64_t items, int64_t resident, int device) {
    static const int per_sm = [] { /* -1: a block an item */
        const char *e = getenv("GDP_DECODE_BLOCKS_PER_SM");
        if (e != nullptr && strcmp(e, "items") == 0)
            return -1;
        const int v = e != nullptr ? atoi(e) : 0;
        return v >= 1 && v <= 8 ? v : 0;
    }();
    int64_t grid = resident > 0 && resident < items ? resident : items;
    int sms = 0;
    if (per_sm < 0)
        grid = items;
    else if (per_sm > 0 && gdp_device_sm_count(device, &sms) == cudaSuccess && sms > 0 && (int64_t)per_sm * sms < grid)
        grid = (int64_t)per_sm * sms;
    return grid;
}

/* Whether a launch that follows the decode front (p.after_front) goes as its programmatic dependent:
 * where every item has a block of its own (grid == items), so the step's whole state load can start
 * under the front. Measured on the H100 (gdp-bench layer, 2 layers, graph us, two rounds, plain /
 * dependent; forty-third session): B=1 67.9, 67.4 / 66.5, 65.6; B=2 68.6, 68.6 / 67.7, 66.6; B=64
 * 182.6, 182.3 / 182.7, 182.0; B=128 291.2, 290.9 / 293.5, 292.6: the front's blocks hold the SMs a
 * resident grid of several items a block would take, and the first item is a small part of its load. */
bool launch_after_front(const RecurrentParams &p, int64_t items, int64_t grid) {
    return p.after_front != 0 && grid == items;
}

template <int SDT, int R, bool VEC>
cudaError_t launch_recurrent(const RecurrentParams &p, int device, cudaStream_t stream) {
    using G = RecGeom<SDT, R, VEC>;
    RecurrentParams q = p;
    q.n_vblocks = (p.V + G::BV - 1) / G::BV;
    const int64_t items = p.B * p.H * q.n_vblocks;
    if (items > INT32_MAX)
        return cudaErrorInvalidConfiguration;
    const size_t area = (size_t)recurrent_smem_floats(p.tile_steps, G::KP, G::BV) * sizeof(float);
    static int cache[64];
    q.prefetch_distance = (int64_t)(prefetch_generations() *
                                    (double)resident_blocks(recurrent_kernel<SDT, R, VEC>, cache, device, area));
    recurrent_kernel<SDT, R, VEC><<<(unsigned)items, REC_THREADS, area, stream>>>(q);
    return cudaGetLastError();
}

/* Once a kernel instance and device (configured[device]): the most shared memory per SM (these
 * kernels read little through L1, so their register bound decides the blocks per SM), and above
 * 48 KB of dynamic shared memory a block's opt-in, for `most`, the largest any call asks. */
template <typename Kernel> cudaError_t opt_in_shared(Kernel kernel, int *configured, int device, size_t most) {
    if (configured[device])
        return cudaSuccess;
    cudaError_t err =
        cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, (int)cudaSharedmemCarveoutMaxShared);
    if (err == cudaSuccess && most > 48 * 1024)
        err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)most);
    if (err == cudaSuccess)
        configured[device] = 1;
    return err;
}

template <int SDT, int R, int NVB>
cudaError_t launch_recurrent_smem(const RecurrentParams &p, int device, cudaStream_t stream) {
    using G = SmemGeom<R>;
    constexpr int BVB = NVB * G::BV, THREADS = NVB * REC_THREADS;
    RecurrentParams q = p;
    q.n_vblocks = (p.V + BVB - 1) / BVB;
    q.norm_arrivals = q.norm_hpg * q.n_vblocks; /* the blocks of one (request, norm group) */
    const int64_t items = p.B * p.H * q.n_vblocks;
    if (items > INT32_MAX)
        return cudaErrorInvalidConfiguration;
    const size_t tile = (size_t)NVB * G::KP * G::BV;
    const size_t bytes = (tile + (size_t)smem_area_floats(p.tile_steps, G::KP, NVB)) * sizeof(float);
    static int cache[64];
    static int configured[64];
    if (device >= 0 && device < 64) { /* the register bound (recurrent_smem_block_bound) sets the blocks an SM */
        const size_t most = (tile + (size_t)smem_area_floats(REC_TILE_STEPS, G::KP, NVB)) *
                            sizeof(float); /* any tile_steps of a later call */
        const cudaError_t err = opt_in_shared(recurrent_smem_kernel<SDT, R, NVB>, configured, device, most);
        if (err != cudaSuccess)
            return err;
    }
    q.prefetch_distance = (int64_t)(prefetch_generations() * (double)resident_blocks(recurrent_smem_kernel<SDT, R, NVB>,
                                                                                     cache, device, bytes, THREADS));
    recurrent_smem_kernel<SDT, R, NVB><<<(unsigned)items, THREADS, bytes, stream>>>(q);
    return cudaGetLastError();
}

/* ---- a token's query mask and raw dot products (the row and ring kernels' closed form) ---- */

/* Which of a token's M staged queries (qs [M][KP] fp32) are nonzero, as bits t; the same answer in
 * every lane of the warp. */
template <int KP> __device__ __forceinline__ unsigned token_query_mask(const float *qs, int M, int lane) {
    unsigned qmask = 0;
    for (int t = 0; t < M; t++) {
        bool nz = false;
#pragma unroll
        for (int x = 0; x < KP / 32; x++)
            nz |= qs[t * KP + lane + 32 * x] != 0.0f;
        if (__any_sync(0xffffffffu, nz))
            qmask |= 1u << t;
    }
    return qmask;
}

/* Raw dot product f of a token's M steps, summed by one warp over the KP staged floats of q and k
 * ([M][KP] each): kk [j][t] for f < M M, kq [j][t] for f < 2 M M (j <= t), qq [t] after them. False,
 * and nothing summed, where no output reads it (j > t, or a zero query: its output is 0). */
template <int KP>
__device__ __forceinline__ bool token_dot(const float *qs, const float *ks, int M, unsigned qmask, int f, int lane,
                                          float &dot) {
    const float *x, *y;
    bool need;
    if (f < 2 * M * M) {
        const int e = f % (M * M), j = e / M, t = e - j * M;
        need = j <= t && (f < M * M || ((qmask >> t) & 1u));
        x = ks + j * KP;
        y = f < M * M ? ks + t * KP : qs + t * KP;
    } else {
        const int t = f - 2 * M * M;
        need = (qmask >> t) & 1u;
        x = y = qs + t * KP;
    }
    if (!need)
        return false;
    float acc = 0.0f;
#pragma unroll
    for (int xx = 0; xx < KP / 32; xx++)
        acc = fmaf(x[lane + 32 * xx], y[lane + 32 * xx], acc);
    dot = warp_sum(acc);
    return true;
}

/* A token's M steps in closed form for the C value columns a thread holds (the row and ring
 * kernels; recurrent_rows.cuh's file comment has the formulas). In: sum(v, u) gives the thread's
 * columns of S^T k_v for v < M and of S^T q_t for the nonzero queries after them (v = M + their
 * rank); the token's raw dots as token_dot lays them out; a[t] = exp(g) and beta[t] of each step;
 * vcol(t, c) the v of step t at the thread's column c. Each step's output goes to out(t, o) (0 for a
 * zero query); on return d holds the update's e_j = P(j, M-1) f_j d_j, and the result is P(-1, M-1). */
template <int C, int MAXM, typename Sum, typename VCol, typename Out>
__device__ __forceinline__ float token_closed_form(int M, unsigned qmask, const float *a, const float *beta,
                                                   const float *dots, bool l2norm, float scale, Sum sum, VCol vcol,
                                                   Out out, float (&d)[MAXM][C]) {
    const float eps = (float)GDP_L2NORM_EPS;
    const float *kk = dots, *kq = dots + M * M, *qq = dots + 2 * M * M;
    float fk[MAXM], pj[MAXM];
    float p0 = 1.0f; /* P(-1, t) */
    int qrank = 0;
#pragma unroll
    for (int t = 0; t < MAXM; t++) {
        if (t >= M)
            break;
        p0 *= a[t];
#pragma unroll
        for (int j = 0; j < t; j++)
            pj[j] *= a[t];
        pj[t] = 1.0f;
        fk[t] = l2norm ? 1.0f / sqrtf(kk[t * M + t] + eps) : 1.0f;
        float u[C];
        sum(t, u);
        const float cu = p0 * fk[t];
#pragma unroll
        for (int c = 0; c < C; c++)
            d[t][c] = fmaf(-cu, u[c], vcol(t, c));
#pragma unroll
        for (int j = 0; j < t; j++) {
            const float cj = pj[j] * fk[j] * fk[t] * kk[j * M + t];
#pragma unroll
            for (int c = 0; c < C; c++)
                d[t][c] = fmaf(-cj, d[j][c], d[t][c]);
        }
        const float bt = beta[t];
#pragma unroll
        for (int c = 0; c < C; c++)
            d[t][c] *= bt;
        float o[C];
#pragma unroll
        for (int c = 0; c < C; c++)
            o[c] = 0.0f;
        if ((qmask >> t) & 1u) {
            const float ht = (l2norm ? 1.0f / sqrtf(qq[t] + eps) : 1.0f) * scale;
            sum(M + qrank, o);
            qrank++;
            const float cw = p0 * ht;
#pragma unroll
            for (int c = 0; c < C; c++)
                o[c] *= cw;
#pragma unroll
            for (int j = 0; j <= t; j++) {
                const float cj = pj[j] * fk[j] * ht * kq[j * M + t];
#pragma unroll
                for (int c = 0; c < C; c++)
                    o[c] = fmaf(cj, d[j][c], o[c]);
            }
        }
        out(t, o);
    }
#pragma unroll
    for (int j = 0; j < MAXM; j++) {
        if (j >= M)
            break;
        const float e = pj[j] * fk[j];
#pragma unroll
        for (int c = 0; c < C; c++)
            d[j][c] *= e;
    }
    return p0;
}

#include "recurrent_rows.cuh" /* the row kernel (v10c): the default wherever it fits, GDP_DECODE_STATE=rows forces it */

template <int SDT, int R, int LPR, int MT, int DT>
cudaError_t launch_recurrent_rows(const RecurrentParams &p, int device, cudaStream_t stream) {
    using G = RowsGeom<LPR>;
    RecurrentParams q = p;
    q.n_vblocks = p.V / G::BV;
    const int64_t items = p.B * p.H * q.n_vblocks;
    if (items > INT32_MAX)
        return cudaErrorInvalidConfiguration;
    /* the step area (at most 34 KB: M = ROWS_MAX_M = 3, K = V = 128) and the state cells (64 KB at R = 16) */
    /* + token 0's raw words and the warps' slot words */
    const size_t cells = (size_t)R * ROWS_THREADS * 4 + ROWS_RAW_UNROLL * ROWS_THREADS + ROWS_SLOT_WORDS;
    const size_t bytes = ((size_t)rows_smem_floats(p.steps_per_token, G::ROUND * R, G::BV) + cells) * sizeof(float);
    const size_t most = ((size_t)rows_smem_floats(ROWS_MAX_M, G::ROUND * R, G::BV) + cells) * sizeof(float);
    static int cache[64];
    static int configured[64];
    if (device < 0 || device >= 64)
        return cudaErrorInvalidDevice;
    const cudaError_t err = opt_in_shared(recurrent_rows_kernel<SDT, R, LPR, MT, DT>, configured, device, most);
    if (err != cudaSuccess)
        return err;
    /* a resident grid: every block loops over items (recurrent_rows.cuh) */
    const int64_t resident = resident_blocks(recurrent_rows_kernel<SDT, R, LPR, MT, DT>, cache, device, most, ROWS_THREADS);
    const int64_t grid = rows_grid(items, resident, device);
    return launch_pdl(recurrent_rows_kernel<SDT, R, LPR, MT, DT>, dim3((unsigned)grid), dim3(ROWS_THREADS), bytes,
                      stream, launch_after_front(q, items, grid), q);
}

/* Whether the row kernel takes a launch (vec: 16-byte state columns, checked by the caller):
 * a whole number of 64- or 128-column slices, K <= 128, at most ROWS_MAX_M steps a token, an
 * fp32 or bf16 state, no fused norm, and q, k, v and g rows that 4-byte cp.async can copy. */
bool rows_fit(const RecurrentParams &p, int state_dtype) {
    const size_t es = gdp_dtype_size(p.qkv_dtype);
    return p.V % 64 == 0 && p.K <= 128 && p.steps_per_token <= ROWS_MAX_M &&
           (state_dtype == GDP_DTYPE_FP32 || state_dtype == GDP_DTYPE_BF16) && !p.norm_on && (p.K * es) % 4 == 0 &&
           aligned_to(p.q, 4) && aligned_to(p.k, 4) && aligned_to(p.v, 4) && aligned_to(p.g, 4);
}

/* K = 128 with bf16 q, k, v and o (the layer's decode) compiles M and the dtypes in
 * (recurrent_rows.cuh, rows_m / rows_qdt / rows_k); any other shape reads them at run time. */
template <int SDT, int R, int LPR>
cudaError_t launch_rows_spec(const RecurrentParams &p, int device, cudaStream_t stream) {
    constexpr int KP = RowsGeom<LPR>::ROUND * R;
    if (p.K == KP && p.qkv_dtype == GDP_DTYPE_BF16 && p.o_dtype == GDP_DTYPE_BF16 && aligned16(p.o)) {
        switch (p.steps_per_token) {
        case 1: return launch_recurrent_rows<SDT, R, LPR, 1, GDP_DTYPE_BF16>(p, device, stream);
        case 2: return launch_recurrent_rows<SDT, R, LPR, 2, GDP_DTYPE_BF16>(p, device, stream);
        case 3: return launch_recurrent_rows<SDT, R, LPR, 3, GDP_DTYPE_BF16>(p, device, stream);
        default: break;
        }
    }
    return launch_recurrent_rows<SDT, R, LPR, 0, -1>(p, device, stream);
}

#include "recurrent_mma.cuh" /* the tensor-core kernel (v11): GDP_DECODE_STATE=mma */

/* Launches of the tensor-core kernel (gdp_cuda_decode_mma_calls); relaxed: a test's counter. */
long long decode_mma_calls = 0;

template <int SDT, int KP, int M, int NW>
cudaError_t launch_recurrent_mma(const RecurrentParams &p, int device, cudaStream_t stream) {
    using G = MmaGeom<KP, M, NW>;
    RecurrentParams q = p;
    q.n_vblocks = p.V / G::BV;
    const int64_t items = p.B * p.H * q.n_vblocks;
    if (items > INT32_MAX)
        return cudaErrorInvalidConfiguration;
    if (device < 0 || device >= 64 || p.S < 1 || p.S > MMA_MAX_S)
        return cudaErrorInvalidValue;
    /* the state rows (68 KB at K = 128, 8 warps, fp32) and the two halves of the input area */
    constexpr size_t cells = (size_t)mma_state_words<SDT, KP, NW>();
    const size_t bytes = (cells + 2 * (size_t)p.S * G::TOKEN_WORDS) * sizeof(uint32_t);
    const size_t most = (cells + 2 * (size_t)MMA_MAX_S * G::TOKEN_WORDS) * sizeof(uint32_t);
    static int resident_by_s[MMA_MAX_S + 1][64]; /* resident blocks by S: the area's size sets them */
    static int configured[64];
    const cudaError_t set = opt_in_shared(recurrent_mma_kernel<SDT, KP, M, NW>, configured, device, most);
    if (set != cudaSuccess)
        return set;
    const int64_t resident = resident_blocks(recurrent_mma_kernel<SDT, KP, M, NW>, resident_by_s[p.S], device, bytes,
                                             G::THREADS);
    const int64_t grid = rows_grid(items, resident, device);
    const cudaError_t err = launch_pdl(recurrent_mma_kernel<SDT, KP, M, NW>, dim3((unsigned)grid), dim3(G::THREADS),
                                       bytes, stream, launch_after_front(q, items, grid), q);
    if (err == cudaSuccess)
        __atomic_fetch_add(&decode_mma_calls, 1, __ATOMIC_RELAXED);
    return err;
}

/* Whether the tensor-core kernel takes a launch (vec: 16-byte state columns, checked by the
 * caller): K 64 or 128, V a multiple of 16, at most MMA_MAX_M steps and MMA_MAX_S tokens,
 * bf16 q, k and v (exact in tf32) with 4-byte aligned rows, an fp32 or bf16 state, no fused
 * norm, and o aligned for a two-column store. */
bool mma_fit(const RecurrentParams &p, int state_dtype) {
    return (p.K == 64 || p.K == 128) && p.V % 16 == 0 && p.steps_per_token >= 1 &&
           p.steps_per_token <= MMA_MAX_M && p.S >= 1 && p.S <= MMA_MAX_S &&
           (state_dtype == GDP_DTYPE_FP32 || state_dtype == GDP_DTYPE_BF16) && !p.norm_on &&
           p.qkv_dtype == GDP_DTYPE_BF16 && aligned_to(p.q, 4) && aligned_to(p.k, 4) && aligned_to(p.v, 4) &&
           aligned_to(p.g, 4) && aligned_to(p.o, p.o_dtype == GDP_DTYPE_FP32 ? 8 : 4);
}

/* The row kernel's value slice: GDP_DECODE_ROWS_COLS = 16 | 32 | 64 | 128 asks for one, unset,
 * empty or auto lets rows_cols pick. Read at every launch; -1 for any other value (refused by
 * recurrent_run). */
int rows_cols_choice() {
    static const char *const spell[5] = {"auto", "16", "32", "64", "128"};
    static const int value[5] = {0, 16, 32, 64, 128};
    return gdp_env_choice("GDP_DECODE_ROWS_COLS", spell, value, 5, 0, nullptr);
}

/* Whether a slice of cols value columns holds the shape: V a multiple of it, and for 16 and 32
 * 64 < K <= 128 (their R of 2 and 4 rows a thread cover 128 rows). */
bool rows_cols_fit(const RecurrentParams &p, int cols) {
    return p.V % cols == 0 && (cols >= 64 || (p.K > 64 && p.K <= 128));
}

/* The value columns of a row (or tensor-core) kernel item: the asked slice (GDP_DECODE_ROWS_COLS)
 * where it fits; else (auto, or an asked slice that does not fit) the widest slice whose items fill
 * the SMs once, down to the narrowest that fits. Measured (gdp-bench ops --op decode, H 16, K = V = 128, M 2, session 11; us, slices
 * 128 / 64 / 32 / 16): B=1 (16 pairs) - / 7.7 / 7.6 / 7.5 (the register kernel 8.8), B=64 43.8 /
 * 49.6 / 69.2 / 118.1: narrow slices repeat an item's per-token work for less state, so they pay
 * only where whole rows leave SMs idle. */
template <typename Fit> int slice_cols(const RecurrentParams &p, int device, int narrowest, Fit fit) {
    const int asked = rows_cols_choice();
    if (asked > 0 && fit(asked))
        return asked;
    static const int widest_first[4] = {128, 64, 32, 16};
    int sms = 0; /* 0 if unknown: then the widest slice that fits */
    if (gdp_device_sm_count(device, &sms) != cudaSuccess)
        (void)cudaGetLastError();
    int cols = narrowest; /* a slice the kernel always holds */
    for (int i = 0; i < 4; i++) {
        if (!fit(widest_first[i]))
            continue;
        cols = widest_first[i];
        if (p.B * p.H * (p.V / cols) >= sms)
            break;
    }
    return cols;
}
int rows_cols(const RecurrentParams &p, int device) { /* rows_fit: V is a multiple of 64 */
    return slice_cols(p, device, 64, [&](int cols) { return rows_cols_fit(p, cols); });
}

/* Slices of 4 LPR columns (LPR lanes a row); R the fewest rows a thread. */
template <int SDT> cudaError_t dispatch_rows_kernel(const RecurrentParams &p, int device, cudaStream_t stream) {
    switch (rows_cols(p, device)) {
    case 16: return launch_rows_spec<SDT, 2, 4>(p, device, stream);
    case 32: return launch_rows_spec<SDT, 4, 8>(p, device, stream);
    case 128:
        if (p.K <= 32)
            return launch_recurrent_rows<SDT, 4, 32, 0, -1>(p, device, stream);
        if (p.K <= 64)
            return launch_recurrent_rows<SDT, 8, 32, 0, -1>(p, device, stream);
        return launch_rows_spec<SDT, 16, 32>(p, device, stream);
    default: break;
    }
    if (p.K <= 32)
        return launch_recurrent_rows<SDT, 2, 16, 0, -1>(p, device, stream);
    if (p.K <= 64)
        return launch_recurrent_rows<SDT, 4, 16, 0, -1>(p, device, stream);
    return launch_rows_spec<SDT, 8, 16>(p, device, stream);
}

/* launch(kp, m) with K (64, else 128) and M (1, 2, else 3) as compile-time constants (std::integral_constant):
 * the instances of the kernels that compile both in (the tensor-core and ring kernels; their fit
 * functions hold K to 64 or 128 and M to 1..3). */
template <typename Launch> cudaError_t with_k_and_m(const RecurrentParams &p, Launch launch) {
    const auto with_m = [&](auto kp) {
        switch (p.steps_per_token) {
        case 1: return launch(kp, std::integral_constant<int, 1>{});
        case 2: return launch(kp, std::integral_constant<int, 2>{});
        default: return launch(kp, std::integral_constant<int, 3>{});
        }
    };
    return p.K == 64 ? with_m(std::integral_constant<int, 64>{}) : with_m(std::integral_constant<int, 128>{});
}

#include "recurrent_ring.cuh" /* the copy-engine ring kernel (v12): GDP_DECODE_STATE=ring */

/* Launches of the ring kernel (gdp_cuda_decode_ring_calls); relaxed: a test's counter. */
long long decode_ring_calls = 0;

/* The most dynamic shared memory a block of `device` may opt in to (0 if unknown; device_info.h caches it). */
size_t shared_optin_bytes(int device) {
    int v = 0;
    if (gdp_device_shared_optin(device, &v) != cudaSuccess || v <= 0) {
        (void)cudaGetLastError();
        return 0;
    }
    return (size_t)v;
}

/* The K-row split of the ring kernel (KS threads a column): GDP_DECODE_RING_KSPLIT = 1 | 2 (read at
 * every launch; unset or empty: 1), -1 for any other value (refused by recurrent_run). */
int ring_ksplit_choice() {
    static const char *const spell[2] = {"1", "2"};
    static const int value[2] = {1, 2};
    return gdp_env_choice("GDP_DECODE_RING_KSPLIT", spell, value, 2, 1, nullptr);
}

/* The ring kernel's shared memory for a launch of BV-column items, KS threads a column, a state of
 * state_es bytes an element (its groups: the block's warps over KS BV / 32 warps a group). */
RingLayout ring_layout(const RecurrentParams &p, int state_es, int BV, int KS) {
    return RingLayout(p.S, p.steps_per_token, p.K, BV, state_es, RING_CONSUMER_WARPS * 32 / (KS * BV), KS);
}
/* The ring's stages: as many as the block's shared memory holds past the layout's fixed area, at
 * most RING_MAX_STAGES; 0 if not even one fits. */
int ring_stages(const RingLayout &layout, int device) {
    const int64_t room = (int64_t)shared_optin_bytes(device) - layout.fixed;
    const int64_t n = room > 0 ? room / layout.stage_bytes : 0;
    return (int)(n < RING_MAX_STAGES ? n : RING_MAX_STAGES);
}

template <int SDT, int KP, int MT, int NGW, int KS>
cudaError_t launch_recurrent_ring(const RecurrentParams &p, int device, cudaStream_t stream) {
    constexpr int BV = 32 * NGW / KS;
    RecurrentParams q = p;
    q.n_vblocks = p.V / BV;
    const int64_t items = p.B * p.H * q.n_vblocks;
    if (items > INT32_MAX)
        return cudaErrorInvalidConfiguration;
    if (device < 0 || device >= 64)
        return cudaErrorInvalidDevice;
    const RingLayout layout = ring_layout(p, (int)sizeof(typename StateStorage<SDT>::Bits), BV, KS);
    q.ring_stages = ring_stages(layout, device);
    if (q.ring_stages < 1) /* ring_fit checks this first */
        return cudaErrorInvalidValue;
    const size_t bytes = (size_t)(layout.fixed + q.ring_stages * layout.stage_bytes);
    static int configured[64];
    const cudaError_t set =
        opt_in_shared(recurrent_ring_kernel<SDT, KP, MT, NGW, KS>, configured, device, shared_optin_bytes(device));
    if (set != cudaSuccess)
        return set;
    int sms = 0;
    if (gdp_device_sm_count(device, &sms) != cudaSuccess || sms <= 0)
        return cudaErrorInvalidDevice;
    const int64_t grid = items < sms ? items : sms; /* one block an SM, each looping over items */
    recurrent_ring_kernel<SDT, KP, MT, NGW, KS><<<(unsigned)grid, RING_THREADS, bytes, stream>>>(q);
    const cudaError_t err = cudaGetLastError();
    if (err == cudaSuccess)
        __atomic_fetch_add(&decode_ring_calls, 1, __ATOMIC_RELAXED);
    return err;
}

/* Whether the ring kernel takes a launch on `device`: an sm_90 copy engine, K 64 or 128, V a
 * multiple of 32, at most RING_MAX_M steps and RING_MAX_S tokens, bf16 q, k and v with 16-byte
 * aligned rows, an fp32 or bf16 state whose items start 16-byte aligned, no fused norm, and a
 * ring of at least two stages of 32-column items in the block's shared memory. */
bool ring_fit(const RecurrentParams &p, int state_dtype, int device) {
    int cc = 0;
    if (gdp_device_cc(device, &cc) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    const int64_t es = state_dtype == GDP_DTYPE_FP32 ? 4 : 2;
    const bool state_ok = p.state_in == nullptr || (aligned16(p.state_in) && (p.in_stride_row * es) % 16 == 0 &&
                                                    (p.in_stride_head * es) % 16 == 0);
    if (!(cc >= 90 && (p.K == 64 || p.K == 128) && p.V % 32 == 0 && p.steps_per_token >= 1 &&
          p.steps_per_token <= RING_MAX_M && p.S >= 1 && p.S <= RING_MAX_S &&
          (state_dtype == GDP_DTYPE_FP32 || state_dtype == GDP_DTYPE_BF16) && !p.norm_on &&
          p.qkv_dtype == GDP_DTYPE_BF16 && aligned16(p.q) && aligned16(p.k) && aligned16(p.v) && aligned_to(p.g, 4) &&
          state_ok))
        return false;
    return ring_stages(ring_layout(p, (int)es, 32, 1), device) >= 2;
}

/* The ring kernel's value slice (a group of KS cols / 32 warps an item): slice_cols over the
 * slices of at most 128 columns that V holds (ring_fit: V is a multiple of 32), and whose ring has
 * two stages. */
template <int SDT> int ring_cols(const RecurrentParams &p, int KS, int device) {
    return slice_cols(p, device, 32, [&](int cols) {
        return cols <= 128 && p.V % cols == 0 &&
               ring_stages(ring_layout(p, (int)sizeof(typename StateStorage<SDT>::Bits), cols, KS), device) >= 2;
    });
}
template <int SDT, int KP, int M, int KS>
cudaError_t dispatch_ring_split(const RecurrentParams &p, int device, cudaStream_t stream) {
    switch (ring_cols<SDT>(p, KS, device)) {
    case 128: return launch_recurrent_ring<SDT, KP, M, 4 * KS, KS>(p, device, stream);
    case 64: return launch_recurrent_ring<SDT, KP, M, 2 * KS, KS>(p, device, stream);
    default: return launch_recurrent_ring<SDT, KP, M, KS, KS>(p, device, stream);
    }
}
/* K rows split over GDP_DECODE_RING_KSPLIT threads a column: 2 halves an item's serial chain (and its
 * state registers) for a partial-sum exchange at the group's second barrier; 1 (the default until
 * measured) keeps a whole column a thread. */
template <int SDT, int KP, int M>
cudaError_t dispatch_ring_cols(const RecurrentParams &p, int device, cudaStream_t stream) {
    return ring_ksplit_choice() == 2 ? dispatch_ring_split<SDT, KP, M, 2>(p, device, stream)
                                     : dispatch_ring_split<SDT, KP, M, 1>(p, device, stream);
}
template <int SDT> cudaError_t dispatch_ring_kernel(const RecurrentParams &p, int device, cudaStream_t stream) {
    return with_k_and_m(p, [&](auto kp, auto m) { return dispatch_ring_cols<SDT, kp.value, m.value>(p, device, stream); });
}

/* The tensor-core kernel's value slice (16 NW columns): slice_cols over the slices V holds (mma_fit:
 * V is a multiple of 16). */
int mma_cols(const RecurrentParams &p, int device) {
    return slice_cols(p, device, 16, [&](int cols) { return p.V % cols == 0; });
}

template <int SDT, int KP, int M>
cudaError_t dispatch_mma_cols(const RecurrentParams &p, int device, cudaStream_t stream) {
    switch (mma_cols(p, device)) {
    case 128: return launch_recurrent_mma<SDT, KP, M, 8>(p, device, stream);
    case 64: return launch_recurrent_mma<SDT, KP, M, 4>(p, device, stream);
    case 32: return launch_recurrent_mma<SDT, KP, M, 2>(p, device, stream);
    default: return launch_recurrent_mma<SDT, KP, M, 1>(p, device, stream);
    }
}
template <int SDT> cudaError_t dispatch_mma_kernel(const RecurrentParams &p, int device, cudaStream_t stream) {
    return with_k_and_m(p, [&](auto kp, auto m) { return dispatch_mma_cols<SDT, kp.value, m.value>(p, device, stream); });
}

/* Which kernel runs. GDP_DECODE_STATE=regs | smem | head forces the register kernel, the
 * shared-memory kernel with one block per 32 value columns, or the shared-memory kernel with
 * one block per (request, head) (up to 128 columns a block; not the default until measured).
 * By default an fp32 state takes the shared-memory kernel once the batch has at least
 * REC_SMEM_MIN_PAIRS (request, head) pairs. Measured on the H200 (gdp-bench ops --op decode,
 * H 16, K = V = 128, M 2; NOTES-ops.md v5): smem B=64 57.5 us vs 61.6, B=256 191.4 vs 217.5,
 * B=1024 726.1 vs 840.2, H 32 V 64 M 3 B=256 233.2 vs 253.7; at B=1 (16 pairs, 16 of 132 SMs
 * busy whichever kernel) the register kernel's 8.9 us beats 9.6. A 16-bit state always takes
 * the shared-memory kernel: the register kernel holds 64 state values a thread there
 * (168-183 registers, 2-3 blocks per SM) and ran slower than fp32 (B=256 285 us). Read at
 * every launch (a getenv, far below a launch's cost), so a test can compare the kernels in
 * one process; all give the same bits. Any other value than those three, auto or empty is
 * refused (GDP_STATUS_INVALID_USAGE) before anything runs. */
constexpr int64_t REC_SMEM_MIN_PAIRS = 128;

enum DecodeKernel { DECODE_REGS, DECODE_SMEM, DECODE_HEAD, DECODE_ROWS, DECODE_MMA, DECODE_RING };

/* GDP_DECODE_STATE: one of the kernels (regs, smem, head, rows, mma, ring), DECODE_AUTO (unset, empty
 * or auto: the op chooses), or -1 for any other value (gdp_env_choice, src/internal.h). */
constexpr int DECODE_AUTO = -2;
int decode_state_choice() {
    static const char *const spell[7] = {"auto", "regs", "smem", "head", "rows", "mma", "ring"};
    static const int value[7] = {DECODE_AUTO, DECODE_REGS, DECODE_SMEM, DECODE_HEAD, DECODE_ROWS, DECODE_MMA, DECODE_RING};
    return gdp_env_choice("GDP_DECODE_STATE", spell, value, 7, DECODE_AUTO, nullptr);
}

/* A bf16 state from this many (request, head) pairs takes the tensor-core kernel (recurrent_mma.cuh)
 * where it fits: on the H100 (gdp-bench ops --op decode, H 16, K = V = 128, M 2; NOTES-ops.md,
 * fortieth session; us, mma / rows) B=64 37.3 / 38.0, B=256 118.9 / 126.2, B=1024 457 / 485; at
 * B=1 it loses (10.1 / 7.5), and an fp32 state loses at every batch (B=256 222 / 208). The layer's
 * bf16 decode step (gdp-bench layer -S bf16, 2 layers, graph) crosses between 8 requests (83.0 /
 * 81.2) and 16 (92.8 / 95.1). */
constexpr int64_t MMA_MIN_PAIRS_BF16 = 256;

/* The default: the row kernel wherever it fits (rows_fit), at every batch (rows_cols narrows
 * its slices where whole rows leave SMs idle); elsewhere the shared-memory kernel for 16-bit
 * states and for fp32 from REC_SMEM_MIN_PAIRS pairs, the register kernel below. Measured on the
 * H200 (gdp-bench ops --op decode, NOTES-ops.md v10, v10b and session 11; us, rows vs smem):
 * fp32 B=64 43.6 vs 56.9, B=256 149.2 vs 186.7, B=1024 570.2 vs 701.1, H 32 V 64 M 3 182.0 vs
 * 226.4; bf16 state B=256 128.8 vs 192.5; B=1 (16 pairs) 7.5 on 16-column slices against the
 * register kernel's 8.8 (bf16 state 7.9 against smem's 10.1). The layer step (gdp-bench layer,
 * 2 layers, graph-replayed; v10) B=64 172 vs 191, B=256 437 vs 475. */
DecodeKernel decode_kernel_auto(const RecurrentParams &p, int state_dtype) {
    if (state_dtype == GDP_DTYPE_BF16 && p.B * p.H >= MMA_MIN_PAIRS_BF16 && mma_fit(p, state_dtype))
        return DECODE_MMA;
    if (rows_fit(p, state_dtype))
        return DECODE_ROWS;
    return state_dtype != GDP_DTYPE_FP32 || p.B * p.H >= REC_SMEM_MIN_PAIRS ? DECODE_SMEM : DECODE_REGS;
}

/* The kernel for a launch; recurrent_run has refused an unknown GDP_DECODE_STATE already. */
DecodeKernel decode_kernel(const RecurrentParams &p, int state_dtype, int device) {
    const int forced = decode_state_choice();
    if (p.norm_on) /* the fused norm's tail lives in the shared-memory kernel only */
        return forced == DECODE_HEAD ? DECODE_HEAD : DECODE_SMEM;
    if ((forced == DECODE_ROWS && !rows_fit(p, state_dtype)) || (forced == DECODE_MMA && !mma_fit(p, state_dtype)) ||
        (forced == DECODE_RING && !ring_fit(p, state_dtype, device)))
        return decode_kernel_auto(p, state_dtype); /* a shape it does not hold: as auto */
    if (forced >= 0)
        return static_cast<DecodeKernel>(forced);
    return decode_kernel_auto(p, state_dtype);
}

template <int SDT, int NVB> cudaError_t dispatch_rows_smem(const RecurrentParams &p, int device, cudaStream_t stream) {
    if (p.K <= 2 * REC_ROW_GROUPS)
        return launch_recurrent_smem<SDT, 2, NVB>(p, device, stream);
    if (p.K <= 4 * REC_ROW_GROUPS)
        return launch_recurrent_smem<SDT, 4, NVB>(p, device, stream);
    if (p.K <= 8 * REC_ROW_GROUPS)
        return launch_recurrent_smem<SDT, 8, NVB>(p, device, stream);
    return launch_recurrent_smem<SDT, 16, NVB>(p, device, stream);
}

/* The shared-memory kernel with the block width the choice asks for: one group (32 columns),
 * or for DECODE_HEAD as many groups as cover V up to 4 (V > 128 takes several blocks a head). */
template <int SDT> cudaError_t dispatch_smem(const RecurrentParams &p, DecodeKernel k, int device, cudaStream_t stream) {
    if (k == DECODE_HEAD && p.V > 2 * 32)
        return dispatch_rows_smem<SDT, 4>(p, device, stream);
    if (k == DECODE_HEAD && p.V > 32)
        return dispatch_rows_smem<SDT, 2>(p, device, stream);
    return dispatch_rows_smem<SDT, 1>(p, device, stream);
}

/* R = rows per thread, the smallest of 2, 4, 8, 16 with 16 R >= K. */
template <int SDT, bool VEC> cudaError_t dispatch_rows(const RecurrentParams &p, int device, cudaStream_t stream) {
    if (p.K <= 2 * REC_ROW_GROUPS)
        return launch_recurrent<SDT, 2, VEC>(p, device, stream);
    if (p.K <= 4 * REC_ROW_GROUPS)
        return launch_recurrent<SDT, 4, VEC>(p, device, stream);
    if (p.K <= 8 * REC_ROW_GROUPS)
        return launch_recurrent<SDT, 8, VEC>(p, device, stream);
    return launch_recurrent<SDT, 16, VEC>(p, device, stream);
}

/* vec (16-byte columns) implies the shared-memory kernel's 16- or 8-byte accesses. */
template <int SDT> cudaError_t dispatch_vec(const RecurrentParams &p, bool vec, int device, cudaStream_t stream) {
    const DecodeKernel k = decode_kernel(p, SDT, device);
    if constexpr (SDT != GDP_DTYPE_FP16) {
        if (vec && k == DECODE_ROWS)
            return dispatch_rows_kernel<SDT>(p, device, stream);
        if (vec && k == DECODE_MMA)
            return dispatch_mma_kernel<SDT>(p, device, stream);
        if (k == DECODE_RING) /* ring_fit: every row 16-byte aligned */
            return dispatch_ring_kernel<SDT>(p, device, stream);
    }
    if (vec && k != DECODE_REGS)
        return dispatch_smem<SDT>(p, k, device, stream);
    return vec ? dispatch_rows<SDT, true>(p, device, stream) : dispatch_rows<SDT, false>(p, device, stream);
}

/* The fused norm's arguments (gdp_cuda_recurrent_norm), NULL for the plain op. */
struct FusedNorm {
    gdp_tensor *out;
    const gdp_tensor *y, *z, *weight;
    int64_t group;
    double eps;
};

} // namespace

// kernel launchers

/* Counters of the fused norm: one zeroed allocation per ctx, made at the first fused call
 * outside graph capture and kept until the ctx is freed (a captured graph holds its
 * address). A step with more (request, group) pairs than it holds runs the two ops. */
constexpr int64_t REC_ARRIVAL_COUNTERS = 1 << 16;

static bool arrivals_ready(struct gdp_ctx *ctx, int64_t needed) {
    if (needed > REC_ARRIVAL_COUNTERS)
        return false;
    if (ctx->arrivals != nullptr)
        return true;
    cudaStream_t stream = static_cast<cudaStream_t>(ctx->stream);
    cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream, &cap) != cudaSuccess || cap != cudaStreamCaptureStatusNone) {
        (void)cudaGetLastError();
        return false;
    }
    void *buf = nullptr;
    if (cudaMalloc(&buf, REC_ARRIVAL_COUNTERS * sizeof(uint32_t)) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    if (cudaMemsetAsync(buf, 0, REC_ARRIVAL_COUNTERS * sizeof(uint32_t), stream) != cudaSuccess) {
        (void)cudaGetLastError();
        cudaFree(buf);
        return false;
    }
    ctx->arrivals = buf;
    return true;
}

namespace {

/* Whether the decode end may fuse at all, before fused_norm_fits asks whether it can:
 * GDP_DECODE_END=fused fuses whenever the call fits (the behaviour of commit 837c0da), split
 * never does (the caller runs the two ops), auto (unset or empty) only for batches of at most
 * REC_FUSED_END_MAX_BATCH requests, which is 0: measured on the H200 (gdp-bench layer, 2
 * layers, D 2048, H 16, G 4, P = N = 128, M 2, graph-replayed decode step, 2026-12-02;
 * NOTES-ops.md), the one launch is slower than the two at every batch that takes it: B = 8,
 * 16, 32, 64, 128, 256 took 92.5, 106.2, 140.2, 197.6, 301.6, 523.7 us fused against 86.9,
 * 104.3, 138.7, 191.1, 281.1, 474.5 us split. The fused tail (the last block of a group
 * normalizes it) costs more than the launch it saves. Read at every call (a getenv, far below
 * a launch's cost), so a test can compare the ends in one process. */
constexpr int64_t REC_FUSED_END_MAX_BATCH = 0;

enum DecodeEnd { END_AUTO, END_FUSED, END_SPLIT };

/* false for a value it does not know (*mode untouched). */
bool decode_end(DecodeEnd *mode) {
    static const char *const spell[3] = {"auto", "fused", "split"};
    static const int value[3] = {END_AUTO, END_FUSED, END_SPLIT};
    const int v = gdp_env_choice("GDP_DECODE_END", spell, value, 3, END_AUTO, nullptr);
    if (v < 0)
        return false;
    *mode = static_cast<DecodeEnd>(v);
    return true;
}

bool decode_end_wanted(DecodeEnd mode, int64_t B) {
    return mode == END_FUSED || (mode == END_AUTO && B <= REC_FUSED_END_MAX_BATCH);
}

/* The fused norm fits when y is exactly the row view of o's last Householder copy, a norm
 * group is whole heads of at most 512 elements on norm.cu's warp fast path, the state has
 * 16-byte columns (the shared-memory kernel) and the counters are there. Fills the params. */
bool fused_norm_fits(struct gdp_ctx *ctx, const gdp_recurrent_args *a, const FusedNorm &f, const RecurrentParams &p,
                     bool vec, RecurrentParams *q) {
    const int64_t B = p.B, H = p.H, V = p.V, T = p.T;
    const size_t es = gdp_dtype_size(a->o.dtype);
    const int64_t n = f.group, d = H * V;
    if (!vec || p.S != 1 || n % V != 0 || n % 8 != 0 || n > 512 || d % n != 0)
        return false;
    const gdp_tensor *y = f.y, *z = f.z;
    const bool y_is_last_copy = y->ndim == 2 && y->shape[0] == B && y->shape[1] == d && y->dtype == a->o.dtype &&
                                gdp_tensor_stride(y, 1) == 1 && gdp_tensor_stride(y, 0) == T * d &&
                                y->data == static_cast<const char *>(a->o.data) + (size_t)((T - 1) * d) * es;
    if (!y_is_last_copy || z->ndim != 2 || gdp_tensor_stride(z, 1) != 1 || !gdp_tensor_is_contiguous(f.out))
        return false;
    NormParams np = {};
    np.x = y->data;
    np.x_dtype = y->dtype;
    np.z = z->data;
    np.z_dtype = z->dtype;
    np.weight = f.weight->data;
    np.w_dtype = f.weight->dtype;
    np.out = f.out->data;
    np.out_dtype = f.out->dtype;
    np.groups = d / n;
    np.vectors = B * np.groups;
    np.n = n;
    np.x_row = gdp_tensor_stride(y, 0);
    np.z_row = gdp_tensor_stride(z, 0);
    np.inv_n = 1.0f / (float)n; /* as gdp_cuda_gated_rmsnorm */
    np.eps = (float)f.eps;
    if (!fast_path_fits(np) || !arrivals_ready(ctx, np.vectors))
        return false;
    *q = p;
    q->norm_on = 1;
    q->norm_chunks = n / 8 <= 32 ? 1 : 2; /* launch_fast's count for a warp */
    q->norm_hpg = (int32_t)(n / V);
    q->arrivals = static_cast<uint32_t *>(ctx->arrivals);
    q->norm = np;
    return true;
}

/* GDP_DECODE_PDL: whether the layer's decode op launches as the decode front's programmatic
 * dependent (gdp_cuda_recurrent_after_front): on (unset or empty: the default) or off; -1 for any
 * other value (refused by recurrent_run). */
int decode_pdl_choice() {
    static const char *const spell[2] = {"on", "off"};
    static const int value[2] = {1, 0};
    return gdp_env_choice("GDP_DECODE_PDL", spell, value, 2, 1, nullptr);
}

/* after_front: the call follows the layer's decode front on the stream (gdp_cuda_recurrent_after_front). */
gdp_status_t recurrent_run(struct gdp_ctx *ctx, const gdp_recurrent_args *a, const FusedNorm *fuse, bool *fused,
                           bool after_front) {
    static const char *op = "gdp_fused_recurrent_gated_delta_rule_update";
    const int64_t B = a->q.shape[0], T = a->q.shape[1], H = a->q.shape[2], K = a->q.shape[3];
    const int64_t V = a->v.shape[3];
    const bool cache = gdp_tensor_present(&a->state);
    if (fused != nullptr)
        *fused = false;
    DecodeEnd end = END_AUTO;
    if (fuse != nullptr && !decode_end(&end)) /* refused before anything runs, at any shape */
        GDP_FAIL(GDP_STATUS_INVALID_USAGE,
                 "gdp_decode_recurrent_norm: GDP_DECODE_END=%s is not known; use auto (or leave it unset or empty), "
                 "fused or split",
                 getenv("GDP_DECODE_END"));
    if (ring_ksplit_choice() == -1)
        GDP_FAIL(GDP_STATUS_INVALID_USAGE,
                 "%s: GDP_DECODE_RING_KSPLIT=%s is not known; use 1 or 2 (or leave it unset or empty: 1)",
                 fuse != nullptr ? "gdp_decode_recurrent_norm" : op, getenv("GDP_DECODE_RING_KSPLIT"));
    const int pdl_choice = decode_pdl_choice();
    if (pdl_choice == -1)
        GDP_FAIL(GDP_STATUS_INVALID_USAGE, "%s: GDP_DECODE_PDL=%s is not known; use on or off (or leave it unset or empty: on)",
                 fuse != nullptr ? "gdp_decode_recurrent_norm" : op, getenv("GDP_DECODE_PDL"));
    if (rows_cols_choice() == -1)
        GDP_FAIL(GDP_STATUS_INVALID_USAGE,
                 "%s: GDP_DECODE_ROWS_COLS=%s is not known; use 16, 32, 64 or 128 (or leave it unset, empty or auto: "
                 "the op chooses)",
                 fuse != nullptr ? "gdp_decode_recurrent_norm" : op, getenv("GDP_DECODE_ROWS_COLS"));
    if (decode_state_choice() == -1)
        GDP_FAIL(GDP_STATUS_INVALID_USAGE,
                 "%s: GDP_DECODE_STATE=%s is not known; use regs, smem, head, rows, mma or ring (or leave it unset, empty or auto: "
                 "the op chooses)",
                 fuse != nullptr ? "gdp_decode_recurrent_norm" : op, getenv("GDP_DECODE_STATE"));
    if (K > REC_ROW_GROUPS * 16)
        GDP_FAIL(GDP_STATUS_UNSUPPORTED, "%s: K = %lld; the CUDA decode kernel holds at most %d state rows", op,
                 (long long)K, REC_ROW_GROUPS * 16);
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
    p.tile_steps = (int32_t)(T < REC_TILE_STEPS ? T : REC_TILE_STEPS);
    p.after_front = after_front && pdl_choice == 1;

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
    const int cw = state_dtype == GDP_DTYPE_FP32 ? 4 : 8;
    const bool vec = V % cw == 0 && p.in_stride_row % cw == 0 && p.in_stride_head % cw == 0 &&
                     p.out_stride_row % cw == 0 && p.out_stride_head % cw == 0 && aligned16(p.state_in) &&
                     aligned16(p.state_out) && aligned16(p.inter);

    if (fuse != nullptr) {
        RecurrentParams q;
        if (!decode_end_wanted(end, B) || !fused_norm_fits(ctx, a, *fuse, p, vec, &q))
            return GDP_STATUS_SUCCESS; /* nothing launched: the caller runs the two ops */
        p = q;
        *fused = true;
    }
    cudaStream_t stream = static_cast<cudaStream_t>(ctx->stream);
    cudaError_t err;
    switch (state_dtype) {
    case GDP_DTYPE_FP32: err = dispatch_vec<GDP_DTYPE_FP32>(p, vec, ctx->device, stream); break;
    case GDP_DTYPE_BF16: err = dispatch_vec<GDP_DTYPE_BF16>(p, vec, ctx->device, stream); break;
    case GDP_DTYPE_FP16: err = dispatch_vec<GDP_DTYPE_FP16>(p, vec, ctx->device, stream); break;
    default:
        GDP_FAIL(GDP_STATUS_UNSUPPORTED, "%s: state dtype %s is not supported by the CUDA kernel (fp32, bf16, fp16)",
                 op, gdp_dtype_name(state_dtype));
    }
    GDP_CUDA_LAUNCH_CHECK(op, err, "B %lld, H %lld, K %lld, V %lld, T %lld", (long long)B, (long long)H, (long long)K,
                          (long long)V, (long long)T);
    return GDP_STATUS_SUCCESS;
}

} // namespace

extern "C" long long gdp_cuda_decode_mma_calls(void) { return __atomic_load_n(&decode_mma_calls, __ATOMIC_RELAXED); }
extern "C" long long gdp_cuda_decode_ring_calls(void) { return __atomic_load_n(&decode_ring_calls, __ATOMIC_RELAXED); }

extern "C" gdp_status_t gdp_cuda_recurrent(struct gdp_ctx *ctx, const gdp_recurrent_args *a) {
    return recurrent_run(ctx, a, nullptr, nullptr, false);
}

extern "C" gdp_status_t gdp_cuda_recurrent_after_front(struct gdp_ctx *ctx, const gdp_recurrent_args *a) {
    return recurrent_run(ctx, a, nullptr, nullptr, true);
}

extern "C" gdp_status_t gdp_cuda_recurrent_norm(struct gdp_ctx *ctx, const gdp_recurrent_args *a, gdp_tensor *out,
                                                const gdp_tensor *y, const gdp_tensor *z, const gdp_tensor *weight,
                                                int64_t group_size, double eps, bool *fused) {
    const FusedNorm f = {out, y, z, weight, group_size, eps};
    return recurrent_run(ctx, a, &f, fused, false);
}

