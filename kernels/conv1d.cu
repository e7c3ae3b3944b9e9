/*
 * conv1d.cu: the CUDA kernels of the causal depthwise conv1d ops (gdp-layer.md 1.2):
 * gdp_causal_conv1d_update (decode: S tokens per request from the slot's window, with
 * optional per-token window snapshots) and gdp_causal_conv1d_varlen (packed prefill whose
 * window is carried through the cache). Accumulation is fp32 in the CPU reference's
 * order (bias, then w_0 win_0 ... w_{W-1} win_{W-1}), SiLU as x / (1 + exp(-x)).
 *
 * Work split: one thread per (request or token tile, channel), the W-wide window in
 * registers; consecutive threads take consecutive channels, so every row access of x, y
 * and the state is coalesced. The varlen outputs of 16-bit activations take the row kernel
 * (thread: 8 tokens x 4 channels, 8-byte accesses, the tile's rows loaded before the first
 * store; GDP_CONV_KERNEL=scalar for the A/B). The varlen op is two launches: the outputs first
 * (they read the incoming states), then the state write-back, so no block can overwrite a
 * window another block still reads. Slots are device values the host cannot check without a
 * sync: a slot outside [0, slots) is treated like -1 (no slot read or written).
 */
#include <stdlib.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "conv1d_math.cuh"
#include "dtype_access.cuh"
#include "gdp_kernels.h"
#include "src/cuda_check.h"
#include "src/internal.h"

// CUDA kernels

namespace {

constexpr int CONV_THREADS = 128;
constexpr int CONV_TOKEN_TILE = 32; /* tokens per thread in the varlen output kernel */
constexpr int CONV_MAX_WIDTH = 8;
/* The row kernel's thread: CONV_ROWS_VEC channels x CONV_ROWS_TILE tokens. Measured on the H200
 * (kernels/NOTES-ops.md, fourteenth session; ncu with warm caches, the layer's 2048- and
 * 16384-token prefill): 4 x 8 25.4 / 134 us, 4 x 16 32.6 / 147, 8 x 8 34.8 / 169, 8 x 16 51 / 194,
 * the scalar kernel 47.4 / 281 (62, 78, 106 and 138 registers: the fewer, the more warps hide
 * the loads' latency). */
constexpr int CONV_ROWS_VEC = 4, CONV_ROWS_TILE = 8;
constexpr int CONV_ROWS_MAX_WIDTH = 4; /* widths the row kernel takes */
constexpr int CONV_ROWS_MIN_C = 8;     /* its fit: C a multiple of this (the kernel needs CONV_ROWS_VEC; 8 is what the tests cover) */
/* The varlen op's output kernels: one channel a thread (any dtype), and for 16-bit x and y the row kernel. */
enum ConvOut { OUT_SCALAR, OUT_ROWS };


/* A tensor pointer with its dtype. */
struct TensorRef {
    const void *data;
    gdp_dtype_t dtype;
};
struct TensorOut {
    void *data;
    gdp_dtype_t dtype;
};

struct ConvCommon {
    TensorRef x;       /* rows may be strided */
    int64_t x_stride_b, x_stride_s; /* update: [B, S, C]; varlen: x_stride_b is the token stride */
    TensorRef weight;  /* [C, W] */
    TensorRef bias;    /* [C] or data NULL */
    TensorOut state;   /* [slots, C, W] */
    TensorOut y;       /* contiguous */
    const int32_t *indices; /* slots, or NULL (identity) */
    int64_t slots, C;
    int silu;
    bool weight_vec, state_vec; /* weight / state rows aligned for load_window's one access */
};

struct ConvUpdateParams {
    ConvCommon c;
    TensorOut inter; /* [slots, S, C, W] or data NULL */
    bool inter_vec;
    int64_t B;
    int32_t S;
};

/* The prefill front (gdp_cuda_prefill_front): the row kernel's outputs go straight to the
 * prefill prepare's value, key and query (gdp-math.md 6), GQA-expanded, instead of y. */
struct PrepRoute {
    void *value, *key, *query; /* NULL value: outputs to y */
    int32_t H, G, N, heads_per_group;
    int64_t k_base, q_base; /* first key and query channel (M H P, M H P + M G N) */
    int64_t key_row;        /* key elements a token: M H N */
};

struct ConvVarlenParams {
    ConvCommon c;
    const int32_t *cu_seqlens; /* [N + 1], device */
    int64_t T;
    int32_t N;
    int out_kernel; /* ConvOut: which output kernel takes the call */
    PrepRoute route;
};


template <int W> __device__ __forceinline__ void load_params(const ConvCommon &p, int64_t ch, float (&w)[W], float &bias) {
    load_window<W>(p.weight.data, p.weight.dtype, ch * W, p.weight_vec, w);
    bias = p.bias.data != nullptr ? load_as_float(p.bias.data, p.bias.dtype, ch) : 0.0f;
}

/* One thread per (request b, channel c): the slot's window walks the S tokens. */
template <int W> __global__ void __launch_bounds__(CONV_THREADS) conv_update_kernel(const ConvUpdateParams p) {
    const int64_t idx = (int64_t)blockIdx.x * CONV_THREADS + threadIdx.x;
    if (idx >= p.B * p.c.C)
        return;
    const int64_t ch = idx % p.c.C, b = idx / p.c.C;
    const int64_t slot = p.c.indices != nullptr ? p.c.indices[b] : b;
    if (slot < 0 || slot >= p.c.slots) {
        for (int s = 0; s < p.S; s++)
            store_from_float(p.c.y.data, p.c.y.dtype, (b * p.S + s) * p.c.C + ch, 0.0f);
        return;
    }
    float w[W], win[W], bias;
    load_params<W>(p.c, ch, w, bias);
    const int64_t st_off = (slot * p.c.C + ch) * W;
    load_window<W>(p.c.state.data, p.c.state.dtype, st_off, p.c.state_vec, win);
    for (int s = 0; s < p.S; s++) {
        const float x_in = load_as_float(p.c.x.data, p.c.x.dtype, b * p.c.x_stride_b + s * p.c.x_stride_s + ch);
        const float out = conv_step<W>(win, w, bias, p.c.silu, x_in);
        store_from_float(p.c.y.data, p.c.y.dtype, (b * p.S + s) * p.c.C + ch, out);
        if (p.inter.data != nullptr)
            store_window<W>(p.inter.data, p.inter.dtype, ((slot * p.S + s) * p.c.C + ch) * W, p.inter_vec, win);
    }
    store_window<W>(p.c.state.data, p.c.state.dtype, st_off, p.c.state_vec, win);
}

/* The window just before local token tau of sequence `seq` (start `start`): positions
 * tau - W .. tau - 1, read from x (>= 0) or the slot's columns W + u (< 0; zeros for a
 * -1 request). */
template <int W>
__device__ __forceinline__ void varlen_window(const ConvVarlenParams &p, int64_t ch, int seq, int64_t start,
                                              int64_t tau, float (&win)[W]) {
    const int64_t slot = p.c.indices != nullptr ? p.c.indices[seq] : seq;
    const bool has_slot = slot >= 0 && slot < p.c.slots;
#pragma unroll
    for (int j = 0; j < W; j++) {
        const int64_t u = tau - W + j;
        if (u >= 0)
            win[j] = load_as_float(p.c.x.data, p.c.x.dtype, (start + u) * p.c.x_stride_b + ch);
        else
            win[j] = has_slot ? load_as_float(p.c.state.data, p.c.state.dtype, (slot * p.c.C + ch) * W + W + u)
                              : 0.0f;
    }
}

/* The sequence holding token t (t < cu_seqlens[N]): the last i with cu[i] <= t, so that
 * cu[i + 1] > t; empty sequences before it are skipped. */
__device__ __forceinline__ int varlen_sequence_of(const ConvVarlenParams &p, int64_t t) {
    int lo = 0, hi = p.N; /* cu[lo] <= t < cu[hi] */
    while (hi - lo > 1) {
        const int mid = (lo + hi) >> 1;
        if (p.cu_seqlens[mid] <= t)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

/* Outputs: thread (tile of CONV_TOKEN_TILE tokens, channel). Reads incoming states only. */
template <int W> __global__ void __launch_bounds__(CONV_THREADS) conv_varlen_out_kernel(const ConvVarlenParams p) {
    const int64_t ch = (int64_t)blockIdx.y * CONV_THREADS + threadIdx.x;
    if (ch >= p.c.C)
        return;
    const int64_t t_begin = (int64_t)blockIdx.x * CONV_TOKEN_TILE;
    const int64_t t_end = min(p.T, t_begin + CONV_TOKEN_TILE);
    const int64_t total = p.cu_seqlens[p.N];

    int seq = -1;
    float w[W], win[W], bias = 0.0f;
    if (t_begin < total) {
        seq = varlen_sequence_of(p, t_begin);
        load_params<W>(p.c, ch, w, bias);
        varlen_window<W>(p, ch, seq, p.cu_seqlens[seq], t_begin - p.cu_seqlens[seq], win);
    }
    int64_t seq_end = seq >= 0 ? p.cu_seqlens[seq + 1] : 0;
    for (int64_t t = t_begin; t < t_end; t++) {
        if (t >= total) {
            store_from_float(p.c.y.data, p.c.y.dtype, t * p.c.C + ch, 0.0f); /* padding rows */
            continue;
        }
        if (t >= seq_end) {
            /* Next non-empty sequence starts at t: its window comes from its slot. */
            while (p.cu_seqlens[seq + 1] <= t)
                seq++;
            seq_end = p.cu_seqlens[seq + 1];
            varlen_window<W>(p, ch, seq, t, 0, win);
        }
        const float x_in = load_as_float(p.c.x.data, p.c.x.dtype, t * p.c.x_stride_b + ch);
        store_from_float(p.c.y.data, p.c.y.dtype, t * p.c.C + ch, conv_step<W>(win, w, bias, p.c.silu, x_in));
    }
}

/* The row output kernel (x and y of one 16-bit dtype DT, C a multiple of CONV_ROWS_MIN_C, W <=
 * CONV_ROWS_MAX_WIDTH, aligned rows): thread (tile of TILE tokens, VEC consecutive channels). A
 * tile whose tokens and their W - 1 predecessors all lie in one sequence (every tile of a long
 * prefill but its first) loads its TILE + W - 1 rows of x as raw 2 VEC-byte words, all before
 * the first store, and reads each token's window from them: no window is shifted and no sequence
 * bound is tested per token. Other tiles (a sequence's start, padding, short varlen sequences) go
 * token by token, each window position from x or from the slot's columns. Each output is
 * conv_step's sum in its order (bias, then w[j] x[t - W + 1 + j] by fmaf for j = 0 .. W - 1,
 * then SiLU), so the bits are the scalar kernel's. */

/* Where a thread's outputs go: token t's run of VEC channels lands at element t * stride of out,
 * and again `copies - 1` more times `step` elements apart (the heads of a key or query group). */
struct RowDest {
    uint16_t *out;
    int64_t stride;
    int32_t copies, step;
};

/* y (no route), or the prepare's layouts for channels [ch0, ch0 + VEC) (a run never crosses a
 * head: P and N are multiples of VEC, checked by the launcher):
 *   value[(t M + m), h, p] = y[t, (m H + h) P + p]: element t M H P + ch0;
 *   key[(t M + m), h, c]   = y[t, k_base + (m G + h / hpg) N + c], every h of the group;
 *   query[t, h, c]         = y[t, q_base + (h / hpg) N + c], every h of the group. */
__device__ __forceinline__ RowDest row_dest(const ConvVarlenParams &p, int64_t ch0) {
    const PrepRoute &r = p.route;
    if (r.value == nullptr)
        return {static_cast<uint16_t *>(p.c.y.data) + ch0, p.c.C, 1, 0};
    if (ch0 < r.k_base)
        return {static_cast<uint16_t *>(r.value) + ch0, r.k_base, 1, 0};
    const int32_t gn = r.G * r.N;
    if (ch0 < r.q_base) {
        const int32_t kc = (int32_t)(ch0 - r.k_base), m = kc / gn, grp = (kc - m * gn) / r.N;
        const int32_t c = kc - m * gn - grp * r.N;
        return {static_cast<uint16_t *>(r.key) + ((int64_t)m * r.H + (int64_t)grp * r.heads_per_group) * r.N + c,
                r.key_row, r.heads_per_group, r.N};
    }
    const int32_t qc = (int32_t)(ch0 - r.q_base), grp = qc / r.N, c = qc - grp * r.N;
    return {static_cast<uint16_t *>(r.query) + (int64_t)grp * r.heads_per_group * r.N + c, (int64_t)r.H * r.N,
            r.heads_per_group, r.N};
}

/* Token t's VEC values rounded to DT (nearest even, as store_vec_from_float) to every copy of d. */
template <int DT, int VEC> __device__ __forceinline__ void rows_put(const RowDest &d, int64_t t, const float (&v)[VEC]) {
    static_assert(VEC == 4, "8-byte runs");
    const gdp_dtype_t dt = static_cast<gdp_dtype_t>(DT);
    const uint2 w = make_uint2((uint32_t)round_to_half_bits(dt, v[0]) | ((uint32_t)round_to_half_bits(dt, v[1]) << 16),
                               (uint32_t)round_to_half_bits(dt, v[2]) | ((uint32_t)round_to_half_bits(dt, v[3]) << 16));
    uint16_t *o = d.out + t * d.stride;
    for (int32_t i = 0; i < d.copies; i++)
        *reinterpret_cast<uint2 *>(o + (int64_t)i * d.step) = w;
}

/* Token t's VEC sums through SiLU (when on), to d. */
template <int DT, int VEC>
__device__ __forceinline__ void rows_out_store(const ConvVarlenParams &p, const RowDest &d, int64_t t, float (&acc)[VEC]) {
#pragma unroll
    for (int c = 0; c < VEC; c++)
        if (p.c.silu)
            acc[c] = __fdiv_rn(acc[c], __fadd_rn(1.0f, expf(-acc[c])));
    rows_put<DT, VEC>(d, t, acc);
}

template <int W, int DT, int VEC, int TILE>
__global__ void __launch_bounds__(CONV_THREADS) conv_varlen_out_rows_kernel(const ConvVarlenParams p) {
    const int64_t ch0 = ((int64_t)blockIdx.y * CONV_THREADS + threadIdx.x) * VEC;
    if (ch0 >= p.c.C)
        return;
    const int64_t t_begin = (int64_t)blockIdx.x * TILE;
    const int64_t t_end = min(p.T, t_begin + TILE);
    const int64_t total = p.cu_seqlens[p.N];
    const uint16_t *x = static_cast<const uint16_t *>(p.c.x.data) + ch0;
    int seq = 0;
    int64_t seq_start = 0, seq_end = 0;
    if (t_begin < total) {
        seq = varlen_sequence_of(p, t_begin);
        seq_start = p.cu_seqlens[seq];
        seq_end = p.cu_seqlens[seq + 1];
    }
    const bool inside = t_begin < total && t_begin - (W - 1) >= seq_start && t_begin + TILE <= seq_end;
    uint32_t rows[TILE + W - 1][VEC / 2];
    if (inside) /* issued before anything else: the tile's whole input */
#pragma unroll
        for (int r = 0; r < TILE + W - 1; r++)
            load_half_words<VEC>(x + (t_begin - (W - 1) + r) * p.c.x_stride_b, rows[r]);
    float w[VEC][W], bias[VEC];
    {
        float flat[VEC * W];
#pragma unroll
        for (int k = 0; k < W; k++)
            load_vec_as_float<VEC>(p.c.weight.data, p.c.weight.dtype, ch0 * W + k * VEC,
                                   *reinterpret_cast<float(*)[VEC]>(flat + k * VEC));
#pragma unroll
        for (int c = 0; c < VEC; c++)
#pragma unroll
            for (int j = 0; j < W; j++)
                w[c][j] = flat[c * W + j];
    }
    if (p.c.bias.data != nullptr)
        load_vec_as_float<VEC>(p.c.bias.data, p.c.bias.dtype, ch0, bias);
    else
#pragma unroll
        for (int c = 0; c < VEC; c++)
            bias[c] = 0.0f;
    const RowDest dest = row_dest(p, ch0);
    if (inside) {
#pragma unroll
        for (int k = 0; k < TILE; k++) {
            float acc[VEC];
#pragma unroll
            for (int c = 0; c < VEC; c++) {
                acc[c] = bias[c];
#pragma unroll
                for (int j = 0; j < W; j++)
                    acc[c] = fmaf(w[c][j], half_bits_as_float<DT>(rows[k + j][c >> 1], c & 1), acc[c]);
            }
            rows_out_store<DT, VEC>(p, dest, t_begin + k, acc);
        }
        return;
    }
    /* token by token: position u of the window of token t in [seq_start, seq_end) is x's row
     * when u >= seq_start, else the slot's column W + u - seq_start (zeros for a -1 request) */
    for (int64_t t = t_begin; t < t_end; t++) {
        float acc[VEC];
        if (t >= total) {
#pragma unroll
            for (int c = 0; c < VEC; c++)
                acc[c] = 0.0f; /* padding rows: y = 0 */
            rows_put<DT, VEC>(dest, t, acc);
            continue;
        }
        while (p.cu_seqlens[seq + 1] <= t) /* skips empty sequences too */
            seq++;
        seq_start = p.cu_seqlens[seq];
        const int64_t slot = p.c.indices != nullptr ? p.c.indices[seq] : seq;
        const bool has_slot = slot >= 0 && slot < p.c.slots;
#pragma unroll
        for (int c = 0; c < VEC; c++)
            acc[c] = bias[c];
#pragma unroll
        for (int j = 0; j < W; j++) {
            const int64_t u = t - (W - 1) + j;
            float v[VEC];
            if (u >= seq_start) {
                uint32_t word[VEC / 2];
                load_half_words<VEC>(x + u * p.c.x_stride_b, word);
#pragma unroll
                for (int c = 0; c < VEC; c++)
                    v[c] = half_bits_as_float<DT>(word[c >> 1], c & 1);
            } else {
#pragma unroll
                for (int c = 0; c < VEC; c++)
                    v[c] = has_slot ? load_as_float(p.c.state.data, p.c.state.dtype,
                                                    (slot * p.c.C + ch0 + c) * W + W + (u - seq_start))
                                    : 0.0f;
            }
#pragma unroll
            for (int c = 0; c < VEC; c++)
                acc[c] = fmaf(w[c][j], v[c], acc[c]);
        }
        rows_out_store<DT, VEC>(p, dest, t, acc);
    }
}

/* New states: thread (sequence, channel). Column j of the new state is element L + j of
 * (old state ++ the L tokens): old columns carry over when L < W; L == 0 keeps the state. */
template <int W> __global__ void __launch_bounds__(CONV_THREADS) conv_varlen_state_kernel(const ConvVarlenParams p) {
    const int64_t idx = (int64_t)blockIdx.x * CONV_THREADS + threadIdx.x;
    if (idx >= (int64_t)p.N * p.c.C)
        return;
    const int64_t ch = idx % p.c.C;
    const int seq = (int)(idx / p.c.C);
    const int64_t slot = p.c.indices != nullptr ? p.c.indices[seq] : seq;
    const int64_t start = p.cu_seqlens[seq], len = (int64_t)p.cu_seqlens[seq + 1] - start;
    if (slot < 0 || slot >= p.c.slots || len == 0)
        return;
    const int64_t st_off = (slot * p.c.C + ch) * W;
    float cols[W];
#pragma unroll
    for (int j = 0; j < W; j++)
        cols[j] = len + j < W ? load_as_float(p.c.state.data, p.c.state.dtype, st_off + len + j)
                              : load_as_float(p.c.x.data, p.c.x.dtype, (start + len + j - W) * p.c.x_stride_b + ch);
#pragma unroll
    for (int j = 0; j < W; j++)
        store_from_float(p.c.state.data, p.c.state.dtype, st_off + j, cols[j]);
}

template <int W> cudaError_t launch_update(const ConvUpdateParams &p, cudaStream_t stream) {
    const int64_t blocks = (p.B * p.c.C + CONV_THREADS - 1) / CONV_THREADS;
    if (blocks > INT32_MAX)
        return cudaErrorInvalidConfiguration;
    conv_update_kernel<W><<<(unsigned)blocks, CONV_THREADS, 0, stream>>>(p);
    return cudaGetLastError();
}

template <int W, int DT, int VEC, int TILE> cudaError_t launch_varlen_rows(const ConvVarlenParams &p, cudaStream_t stream) {
    const int64_t tiles = (p.T + TILE - 1) / TILE;
    const int64_t blocks = (p.c.C / VEC + CONV_THREADS - 1) / CONV_THREADS;
    if (tiles > INT32_MAX || blocks > 65535)
        return cudaErrorInvalidConfiguration;
    conv_varlen_out_rows_kernel<W, DT, VEC, TILE><<<dim3((unsigned)tiles, (unsigned)blocks), CONV_THREADS, 0, stream>>>(p);
    return cudaGetLastError();
}

template <int W> cudaError_t launch_varlen_out(const ConvVarlenParams &p, cudaStream_t stream) {
    if constexpr (W <= CONV_ROWS_MAX_WIDTH) {
        if (p.out_kernel != OUT_SCALAR)
            return p.c.x.dtype == GDP_DTYPE_BF16
                       ? launch_varlen_rows<W, GDP_DTYPE_BF16, CONV_ROWS_VEC, CONV_ROWS_TILE>(p, stream)
                       : launch_varlen_rows<W, GDP_DTYPE_FP16, CONV_ROWS_VEC, CONV_ROWS_TILE>(p, stream);
    }
    const int64_t tiles = (p.T + CONV_TOKEN_TILE - 1) / CONV_TOKEN_TILE;
    const int64_t ch_blocks = (p.c.C + CONV_THREADS - 1) / CONV_THREADS;
    if (tiles > INT32_MAX || ch_blocks > 65535)
        return cudaErrorInvalidConfiguration;
    conv_varlen_out_kernel<W><<<dim3((unsigned)tiles, (unsigned)ch_blocks), CONV_THREADS, 0, stream>>>(p);
    return cudaGetLastError();
}

template <int W> cudaError_t launch_varlen(const ConvVarlenParams &p, cudaStream_t stream) {
    const int64_t st_blocks = ((int64_t)p.N * p.c.C + CONV_THREADS - 1) / CONV_THREADS;
    if (st_blocks > INT32_MAX)
        return cudaErrorInvalidConfiguration;
    if (p.T > 0) {
        const cudaError_t err = launch_varlen_out<W>(p, stream);
        if (err != cudaSuccess)
            return err;
    }
    if (st_blocks > 0)
        conv_varlen_state_kernel<W><<<(unsigned)st_blocks, CONV_THREADS, 0, stream>>>(p);
    return cudaGetLastError();
}

/* Compile-time width from the runtime one (the front-end allows 2..8). */
template <typename Params, template <int> class Launch>
cudaError_t dispatch_width(int64_t W, const Params &p, cudaStream_t stream) {
    switch (W) {
    case 2: return Launch<2>::run(p, stream);
    case 3: return Launch<3>::run(p, stream);
    case 4: return Launch<4>::run(p, stream);
    case 5: return Launch<5>::run(p, stream);
    case 6: return Launch<6>::run(p, stream);
    case 7: return Launch<7>::run(p, stream);
    case 8: return Launch<8>::run(p, stream);
    default: return cudaErrorNotSupported;
    }
}
template <int W> struct UpdateLauncher {
    static cudaError_t run(const ConvUpdateParams &p, cudaStream_t s) { return launch_update<W>(p, s); }
};
template <int W> struct VarlenLauncher {
    static cudaError_t run(const ConvVarlenParams &p, cudaStream_t s) { return launch_varlen<W>(p, s); }
};

ConvCommon common_params(const gdp_tensor &x, const gdp_tensor &weight, const gdp_tensor &bias,
                         const gdp_tensor &state, const gdp_tensor &indices, const gdp_tensor &y, int silu) {
    ConvCommon c = {};
    c.x = {x.data, x.dtype};
    c.weight = {weight.data, weight.dtype};
    c.bias = {gdp_tensor_present(&bias) ? bias.data : nullptr, bias.dtype};
    c.state = {state.data, state.dtype};
    c.y = {y.data, y.dtype};
    c.indices = gdp_tensor_present(&indices) ? static_cast<const int32_t *>(indices.data) : nullptr;
    c.slots = state.shape[0];
    c.silu = silu;
    c.weight_vec = window_aligned(weight);
    c.state_vec = window_aligned(state);
    return c;
}

/* GDP_CONV_KERNEL: auto (unset or empty: the row kernel where it fits), rows (the same), scalar
 * (never the row kernel: the A/B and the tests of both), -1 for any other value. Read at every call. */
int conv_kernel_choice() {
    static const char *const spell[3] = {"auto", "rows", "scalar"};
    static const int value[3] = {OUT_ROWS, OUT_ROWS, OUT_SCALAR};
    return gdp_env_choice("GDP_CONV_KERNEL", spell, value, 3, OUT_ROWS, nullptr);
}

/* Whether the row output kernel takes the call: x and y of one 16-bit dtype, C a multiple of
 * CONV_ROWS_MIN_C, a width it holds, 16-byte aligned x and y rows, weight and bias (each thread's VEC
 * channels' W-element weight runs are then aligned to their size), contiguous weight and state. */
bool varlen_rows_fit(const gdp_conv1d_varlen_args &a, int64_t W) {
    const bool x16 = a.x.dtype == GDP_DTYPE_BF16 || a.x.dtype == GDP_DTYPE_FP16;
    const int64_t C = a.x.shape[1];
    return x16 && a.y.dtype == a.x.dtype && W <= CONV_ROWS_MAX_WIDTH && C % CONV_ROWS_MIN_C == 0 &&
           gdp_tensor_stride(&a.x, 1) == 1 && (gdp_tensor_stride(&a.x, 0) * 2) % 16 == 0 && aligned16(a.x.data) &&
           aligned16(a.y.data) && aligned16(a.weight.data) && gdp_tensor_is_contiguous(&a.weight) &&
           (!gdp_tensor_present(&a.bias) || aligned16(a.bias.data)) && gdp_tensor_is_contiguous(&a.conv_state);
}

} // namespace

// kernel launchers

extern "C" gdp_status_t gdp_cuda_conv1d_update(struct gdp_ctx *ctx, const gdp_conv1d_update_args *a) {
    static const char *op = "gdp_causal_conv1d_update";
    const int64_t W = a->weight.shape[1];
    if (W < 2 || W > CONV_MAX_WIDTH)
        GDP_FAIL(GDP_STATUS_UNSUPPORTED, "%s: width %lld; the CUDA kernels take widths 2..%d", op, (long long)W,
                 CONV_MAX_WIDTH);
    if (a->x.shape[1] > INT32_MAX)
        GDP_FAIL(GDP_STATUS_UNSUPPORTED, "%s: %lld tokens per request exceed int32", op, (long long)a->x.shape[1]);
    ConvUpdateParams p = {};
    p.c = common_params(a->x, a->weight, a->bias, a->conv_state, a->conv_state_indices, a->y, a->silu);
    p.c.C = a->x.shape[2];
    p.c.x_stride_b = gdp_tensor_stride(&a->x, 0);
    p.c.x_stride_s = gdp_tensor_stride(&a->x, 1);
    p.inter = {gdp_tensor_present(&a->intermediate_conv_states) ? a->intermediate_conv_states.data : nullptr,
               a->intermediate_conv_states.dtype};
    p.inter_vec = p.inter.data != nullptr && window_aligned(a->intermediate_conv_states);
    p.B = a->x.shape[0];
    p.S = (int32_t)a->x.shape[1];
    if (p.B == 0)
        return GDP_STATUS_SUCCESS;
    const cudaError_t err =
        dispatch_width<ConvUpdateParams, UpdateLauncher>(W, p, static_cast<cudaStream_t>(ctx->stream));
    GDP_CUDA_LAUNCH_CHECK(op, err, "B %lld, S %d, C %lld, W %lld", (long long)p.B, p.S, (long long)p.c.C,
                          (long long)W);
    return GDP_STATUS_SUCCESS;
}

/* The varlen launch's parameters from the op's arguments (widths and sequence counts checked by
 * the callers), with the output kernel GDP_CONV_KERNEL and the fit allow. */
static ConvVarlenParams varlen_params(const gdp_conv1d_varlen_args *a, int kernel) {
    ConvVarlenParams p = {};
    p.c = common_params(a->x, a->weight, a->bias, a->conv_state, a->state_indices, a->y, a->silu);
    p.c.C = a->x.shape[1];
    p.c.x_stride_b = gdp_tensor_stride(&a->x, 0);
    p.c.x_stride_s = 0;
    p.cu_seqlens = static_cast<const int32_t *>(a->cu_seqlens.data);
    p.T = a->x.shape[0];
    p.N = (int32_t)(a->cu_seqlens.shape[0] - 1);
    p.out_kernel = varlen_rows_fit(*a, a->weight.shape[1]) ? kernel : OUT_SCALAR;
    return p;
}

extern "C" gdp_status_t gdp_cuda_conv1d_varlen(struct gdp_ctx *ctx, const gdp_conv1d_varlen_args *a) {
    static const char *op = "gdp_causal_conv1d_varlen";
    const int64_t W = a->weight.shape[1];
    if (W < 2 || W > CONV_MAX_WIDTH)
        GDP_FAIL(GDP_STATUS_UNSUPPORTED, "%s: width %lld; the CUDA kernels take widths 2..%d", op, (long long)W,
                 CONV_MAX_WIDTH);
    const int64_t N = a->cu_seqlens.shape[0] - 1;
    if (N > INT32_MAX - 1)
        GDP_FAIL(GDP_STATUS_UNSUPPORTED, "%s: %lld sequences exceed int32", op, (long long)N);
    const int kernel = conv_kernel_choice();
    if (kernel < 0)
        GDP_FAIL(GDP_STATUS_INVALID_USAGE,
                 "%s: GDP_CONV_KERNEL is \"%s\"; use auto, rows or scalar (or leave it unset)", op,
                 getenv("GDP_CONV_KERNEL"));
    const ConvVarlenParams p = varlen_params(a, kernel);
    if (N == 0) {
        /* No sequence: every row is padding. */
        if (p.T * p.c.C > 0) {
            GDP_CUDA_CHECK(cudaMemsetAsync(a->y.data, 0, (size_t)(p.T * p.c.C) * gdp_dtype_size(a->y.dtype),
                                           static_cast<cudaStream_t>(ctx->stream)));
        }
        return GDP_STATUS_SUCCESS;
    }
    const cudaError_t err =
        dispatch_width<ConvVarlenParams, VarlenLauncher>(W, p, static_cast<cudaStream_t>(ctx->stream));
    GDP_CUDA_LAUNCH_CHECK(op, err, "T %lld, C %lld, N %lld, W %lld", (long long)p.T, (long long)p.c.C, (long long)N,
                          (long long)W);
    return GDP_STATUS_SUCCESS;
}

extern "C" bool gdp_cuda_prefill_front_fits(const gdp_conv1d_varlen_args *cv, const gdp_prepare_args *pr) {
    const int64_t M = pr->num_householder, H = pr->num_heads, G = pr->num_groups, P = pr->head_dim,
                  N = pr->state_dim;
    const int64_t C = cv->x.shape[1], R = cv->x.shape[0];
    const gdp_dtype_t dt = cv->y.dtype;
    const auto same_dense = [dt](const gdp_tensor &t) {
        return t.dtype == dt && gdp_tensor_is_contiguous(&t) && aligned16(t.data);
    };
    return conv_kernel_choice() == OUT_ROWS && varlen_rows_fit(*cv, cv->weight.shape[1]) &&
           cv->cu_seqlens.shape[0] >= 2 && pr->x.ndim == 3 && pr->x.shape[0] == 1 && pr->x.shape[1] == R &&
           C == M * H * P + (M + 1) * G * N && P % CONV_ROWS_VEC == 0 && N % CONV_ROWS_VEC == 0 &&
           same_dense(pr->value) && same_dense(pr->key) && same_dense(pr->query);
}

extern "C" gdp_status_t gdp_cuda_prefill_front(struct gdp_ctx *ctx, const gdp_conv1d_varlen_args *cv,
                                               const gdp_prepare_args *pr) {
    static const char *op = "gdp_prefill_conv_prepare";
    const int64_t M = pr->num_householder, H = pr->num_heads, G = pr->num_groups, P = pr->head_dim,
                  N = pr->state_dim;
    if (!gdp_cuda_prefill_front_fits(cv, pr))
        GDP_FAIL(GDP_STATUS_INTERNAL_ERROR, "%s: called for arguments gdp_cuda_prefill_front_fits refuses", op);
    ConvVarlenParams p = varlen_params(cv, OUT_ROWS);
    p.route.value = pr->value.data;
    p.route.key = pr->key.data;
    p.route.query = pr->query.data;
    p.route.H = (int32_t)H, p.route.G = (int32_t)G, p.route.N = (int32_t)N;
    p.route.heads_per_group = (int32_t)(H / G);
    p.route.k_base = M * H * P;
    p.route.q_base = M * H * P + M * G * N;
    p.route.key_row = M * H * N;
    const cudaError_t err =
        dispatch_width<ConvVarlenParams, VarlenLauncher>(cv->weight.shape[1], p, static_cast<cudaStream_t>(ctx->stream));
    GDP_CUDA_LAUNCH_CHECK(op, err, "T %lld, C %lld, N %lld", (long long)p.T, (long long)p.c.C, (long long)p.N);
    /* beta and g: the prefill prepare's gate units alone */
    return gdp_cuda_prepare_gates(ctx, pr);
}
