/*
 * decode_core.cu: the fused decode front of a layer, the conv update and the decode prepare
 * of one token per request in one launch (gdp_decode_conv_prepare, src/decode_core.c). The
 * chain it replaces writes the conv output y (the act dtype) and prepare then copies y's
 * bits into value, key (GQA-expanded, every Householder copy) and query (copy M-1, zeros
 * elsewhere) and computes beta and g from ba; here y never reaches memory.
 *
 * Work split: one thread per (request, VEC consecutive conv channels); VEC = 8 for 16-bit
 * activations (16 bytes), 4 for fp32. A thread computes its channels' conv exactly as
 * conv_update_kernel does (conv1d_math.cuh), writes their new windows back to the slot (the
 * only thread that touches those channels, so no ordering between threads is needed),
 * rounds the outputs to the act dtype, and stores them to every place prepare would copy
 * them to: value once, a key channel to each of its group's H/G heads, a query channel to
 * each of its group's heads on copy M-1 and zeros on the other copies. The last 2 M H units
 * of a request are its beta and g, as prepare computes them (prepare_math.cuh). Every
 * output element is written by one thread, in the chain's bits.
 *
 * Two variants: the generic one reads every dtype at run time (any combination the ops
 * allow; up to CORE_MAX_ROWS requests, the two ops above that), and a fast one compiled for
 * one 16-bit dtype of x, weight, bias, conv state and activations (the layer on CUDA), with
 * 4 channels a thread (FAST_VEC), raw loads widened at their use and the windows shifted in
 * their bits (fast_conv), which takes every batch (kernels/NOTES-ops.md, thirteenth session).
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "conv1d_math.cuh"
#include "dtype_access.cuh"
#include "gdp_kernels.h"
#include "pdl.cuh"
#include "prepare_math.cuh"
#include "src/cuda_check.h"
#include "src/internal.h"

// CUDA kernels

namespace {

constexpr int CORE_THREADS = 128;
constexpr int CORE_W = 4; /* the fused path's conv width (Megatron's); others take the chain */

struct CoreParams {
    /* conv */
    const void *x;             /* [n, 1, C] rows strided by x_row */
    int64_t x_row;
    const void *conv_w, *conv_b; /* [C, W], [C] or NULL */
    void *state;               /* [slots, C, W] */
    const int32_t *slots_idx;  /* [n] or NULL (identity) */
    int64_t slots, C;
    gdp_dtype_t x_dtype, w_dtype, b_dtype, state_dtype, act_dtype;
    bool w_vec, state_vec;
    bool runs_vec; /* x, bias, weight and state bases allow VEC-channel vector accesses */
    int silu;
    /* prepare */
    const void *ba;            /* [n, 1, M H + H] rows strided by ba_row */
    int64_t ba_row;
    gdp_dtype_t ba_dtype, dt_bias_dtype;
    const float *A_log;
    const void *dt_bias;
    void *query, *key, *value, *beta;
    float *g;
    int32_t M, H, G, P, N, hpg;
    int64_t k_base, q_base;    /* first key and query channel */
    int32_t conv_units, gate_units; /* per request: C / VEC, 2 M H */
};

/* The fast conv of one thread's VEC (4 or 8) channels when x, the weight, the bias, the state
 * and the act dtype are one 16-bit dtype DT and every run is aligned (runs_vec): raw 8- or
 * 16-byte loads, all issued before the first use, converted at their use (raw words instead of
 * floats in registers), and the new windows formed from the old ones' bits (a shift of 16-bit
 * halves: the chain stores the same values, rounded exactly). The arithmetic is conv_step's,
 * in its order, so y and the state are the chain's bits. ncu of the chain at 128 requests
 * (H200, 2026-12-03): the conv update executed 258 instructions a channel, most of them
 * runtime dtype switches and 64-bit index division, and was issue-bound (10.1 us, DRAM 0.6 %:
 * everything in L2). */
template <int DT, int VEC>
__device__ __forceinline__ void fast_conv(const CoreParams &p, int64_t b, int64_t ch0, int64_t slot, float (&y)[VEC]) {
    static_assert(VEC == 4 || VEC == 8, "8- or 16-byte runs of x");
    constexpr int W = CORE_W, WORDS = VEC * W / 2; /* 8 or 16 words: 2 or 4 x 16 bytes */
    const uint4 *wq = reinterpret_cast<const uint4 *>(static_cast<const uint16_t *>(p.conv_w) + ch0 * W);
    uint4 *sq = reinterpret_cast<uint4 *>(static_cast<uint16_t *>(p.state) + (slot * p.C + ch0) * W);
    uint32_t wr[WORDS], sr[WORDS], xr[VEC / 2], br[VEC / 2];
#pragma unroll
    for (int k = 0; k < WORDS / 4; k++) {
        const uint4 a = wq[k], c = sq[k];
        wr[4 * k] = a.x, wr[4 * k + 1] = a.y, wr[4 * k + 2] = a.z, wr[4 * k + 3] = a.w;
        sr[4 * k] = c.x, sr[4 * k + 1] = c.y, sr[4 * k + 2] = c.z, sr[4 * k + 3] = c.w;
    }
    load_half_words<VEC>(static_cast<const uint16_t *>(p.x) + b * p.x_row + ch0, xr);
    if (p.conv_b != nullptr)
        load_half_words<VEC>(static_cast<const uint16_t *>(p.conv_b) + ch0, br);
    else
#pragma unroll
        for (int k = 0; k < VEC / 2; k++)
            br[k] = 0u; /* +0.0 in both 16-bit dtypes */
    uint32_t nr[WORDS]; /* the new windows */
#pragma unroll
    for (int c = 0; c < VEC; c++) {
        float w[W], win[W];
#pragma unroll
        for (int j = 0; j < W; j++) {
            w[j] = half_bits_as_float<DT>(wr[(c * W + j) / 2], j & 1);
            win[j] = half_bits_as_float<DT>(sr[(c * W + j) / 2], j & 1);
        }
        y[c] = conv_step<W>(win, w, half_bits_as_float<DT>(br[c / 2], c & 1), p.silu,
                            half_bits_as_float<DT>(xr[c / 2], c & 1));
        /* taps (1, 2) and (3, x): byte_perm picks bytes 2-3 of its first word and 0-1 (or 2-3)
         * of its second */
        const uint32_t w0 = sr[2 * c], w1 = sr[2 * c + 1];
        nr[2 * c] = __byte_perm(w0, w1, 0x5432);
        nr[2 * c + 1] = __byte_perm(w1, xr[c / 2], (c & 1) ? 0x7632 : 0x5432);
    }
#pragma unroll
    for (int k = 0; k < WORDS / 4; k++)
        sq[k] = make_uint4(nr[4 * k], nr[4 * k + 1], nr[4 * k + 2], nr[4 * k + 3]);
}

/* DT < 0: every dtype read from p (any combination the op allows); DT = a 16-bit dtype: the
 * fast conv above and that dtype compiled into every load and store. */
template <int VEC, int DT> __global__ void __launch_bounds__(CORE_THREADS) decode_core_kernel(const CoreParams p) {
    /* the layer's decode op launches as this kernel's programmatic dependent
     * (gdp_cuda_recurrent_after_front): it may take its SMs and load its first states now, and
     * reads what this kernel writes only after its pdl_wait */
    pdl_trigger();
    constexpr int W = CORE_W;
    const gdp_dtype_t act = DT >= 0 ? static_cast<gdp_dtype_t>(DT) : p.act_dtype;
    const int64_t b = blockIdx.y;
    const int32_t u = (int32_t)(blockIdx.x * CORE_THREADS + threadIdx.x);
    if (u >= p.conv_units + p.gate_units)
        return;
    const int32_t M = p.M, H = p.H, N = p.N;
    if (u >= p.conv_units) { /* beta, then g: prepare's scalar units */
        const int32_t j = u - p.conv_units;
        const int64_t ba_row = b * p.ba_row;
        if (j < M * H) { /* beta[(m), h] = sigmoid(b[m*H + h]) in ba's dtype */
            const float bv = load_as_float(p.ba, p.ba_dtype, ba_row + j);
            store_from_float(p.beta, p.ba_dtype, b * (int64_t)(M * H) + j, eager_sigmoid(bv));
        } else { /* g[(m), h]: copy 0 only */
            const int32_t gi = j - M * H, h = gi % H, m = gi / H;
            float gv = 0.0f;
            if (m == 0) {
                const float a = load_as_float(p.ba, p.ba_dtype, ba_row + (int64_t)M * H + h);
                gv = eager_decay(a, load_as_float(p.dt_bias, p.dt_bias_dtype, h), p.A_log[h]);
            }
            p.g[b * (int64_t)(M * H) + gi] = gv;
        }
        return;
    }

    /* the conv of channels [ch0, ch0 + VEC), as conv_update_kernel computes them */
    const int64_t ch0 = (int64_t)u * VEC;
    const int64_t slot = p.slots_idx != nullptr ? (int64_t)p.slots_idx[b] : b;
    const bool has_slot = slot >= 0 && slot < p.slots;
    /* Every load of the VEC channels is issued before the first store: the state may alias
     * nothing the compiler can prove, so a store between them would make each channel's
     * loads wait for the previous channel's store (one memory latency per channel; ncu,
     * decode B=1: 8.0 us for about 20 KB). */
    float y[VEC];
    if constexpr (DT >= 0) {
        if (has_slot)
            fast_conv<DT, VEC>(p, b, ch0, slot, y);
        else
#pragma unroll
            for (int c = 0; c < VEC; c++)
                y[c] = 0.0f; /* the chain's padding row: y = 0 */
    } else if (has_slot) {
        float w[VEC][W], win[VEC][W], x_in[VEC], bias[VEC];
        const int64_t st0 = (slot * p.C + ch0) * W;
        if (p.runs_vec) { /* the VEC channels' weights and windows are VEC * W consecutive elements */
            float *wf = &w[0][0], *sf = &win[0][0];
#pragma unroll
            for (int k = 0; k < VEC * W; k += 8) {
                load_vec_as_float<8>(p.conv_w, p.w_dtype, ch0 * W + k, *reinterpret_cast<float(*)[8]>(wf + k));
                load_vec_as_float<8>(p.state, p.state_dtype, st0 + k, *reinterpret_cast<float(*)[8]>(sf + k));
            }
            load_vec_as_float<VEC>(p.x, p.x_dtype, b * p.x_row + ch0, x_in);
            if (p.conv_b != nullptr)
                load_vec_as_float<VEC>(p.conv_b, p.b_dtype, ch0, bias);
            else
#pragma unroll
                for (int c = 0; c < VEC; c++)
                    bias[c] = 0.0f;
        } else {
#pragma unroll
            for (int c = 0; c < VEC; c++) {
                const int64_t ch = ch0 + c;
                load_window<W>(p.conv_w, p.w_dtype, ch * W, p.w_vec, w[c]);
                bias[c] = p.conv_b != nullptr ? load_as_float(p.conv_b, p.b_dtype, ch) : 0.0f;
                load_window<W>(p.state, p.state_dtype, st0 + c * W, p.state_vec, win[c]);
                x_in[c] = load_as_float(p.x, p.x_dtype, b * p.x_row + ch);
            }
        }
#pragma unroll
        for (int c = 0; c < VEC; c++)
            y[c] = conv_step<W>(win[c], w[c], bias[c], p.silu, x_in[c]);
        if (p.runs_vec) {
            const float *sf = &win[0][0];
#pragma unroll
            for (int k = 0; k < VEC * W; k += 8)
                store_vec_from_float<8>(p.state, p.state_dtype, st0 + k, *reinterpret_cast<const float(*)[8]>(sf + k));
        } else {
#pragma unroll
            for (int c = 0; c < VEC; c++)
                store_window<W>(p.state, p.state_dtype, st0 + c * W, p.state_vec, win[c]);
        }
    } else {
#pragma unroll
        for (int c = 0; c < VEC; c++)
            y[c] = 0.0f; /* the chain's padding row: y = 0 */
    }

    /* prepare's copies of those channels (y in the act dtype: store_vec rounds as the chain's
     * store did) */
    float zero[VEC];
#pragma unroll
    for (int k = 0; k < VEC; k++)
        zero[k] = 0.0f;
    prepare_copy_targets(u * VEC, b, M, H, p.G, p.P, N, p.hpg, p.k_base, p.q_base, p.value, p.key, p.query,
                         [&](void *dst, int64_t at, bool z) { /* two calls, not a choice of arrays: that would
                                                                 put both on the stack */
                             if (z)
                                 store_vec_from_float<VEC>(dst, act, at, zero);
                             else
                                 store_vec_from_float<VEC>(dst, act, at, y);
                         });
}

} // namespace

// kernel launchers

/* Rows up to which the generic fused launch runs; above, the two ops. Measured on the H200
 * (ncu over gdp-bench layer, H 16, G 4, P = N = 128, M 2, bf16): B=1 fused 5.9 us vs the
 * chain's 7.6 (conv 4.0 + prepare 3.6), B=64 11.4 us (the chain not measured there; about 12
 * by the conv's line between B=1 and 256), B=256 33 us vs 25.6 (conv 20.2 + prepare 5.4): one
 * thread per 8 channels with 94 registers and runtime dtypes keeps too little in flight once
 * the batch fills the GPU; kernels/NOTES-ops.md. The fast variant (one compiled 16-bit dtype,
 * fast_conv) runs at every batch. */
constexpr int64_t CORE_MAX_ROWS = 64;

/* Whether every run of a thread's VEC channels is whole aligned 16-byte accesses: 16-byte
 * aligned bases, rows of x that keep the alignment, contiguous x channels (the weight's and
 * the state's [C, W] rows are contiguous by the op's front end). */
static bool core_runs_vec(const gdp_conv1d_update_args *conv) {
    const int64_t xs = (int64_t)gdp_dtype_size(conv->x.dtype);
    return aligned16(conv->x.data) && (gdp_tensor_stride(&conv->x, 0) * xs) % 16 == 0 &&
           gdp_tensor_stride(&conv->x, 2) == 1 && aligned16(conv->weight.data) && aligned16(conv->conv_state.data) &&
           aligned16(gdp_tensor_present(&conv->bias) ? conv->bias.data : nullptr);
}

/* The fast variant's 16-bit dtype, or -1: x, weight, bias (when present), conv state and the
 * activations all in one 16-bit dtype, with 16-byte runs. */
static int core_fast_dtype(const gdp_conv1d_update_args *conv, const gdp_prepare_args *prep) {
    const gdp_dtype_t dt = prep->query.dtype;
    if (dt != GDP_DTYPE_BF16 && dt != GDP_DTYPE_FP16)
        return -1;
    const bool same = conv->x.dtype == dt && conv->weight.dtype == dt && conv->conv_state.dtype == dt &&
                      (!gdp_tensor_present(&conv->bias) || conv->bias.dtype == dt);
    return same && core_runs_vec(conv) ? (int)dt : -1;
}

/* Channels a thread of the fast launch takes: 8 (16-byte runs) or 4 (8-byte runs: twice the
 * warps, each with half the chain; ncu at 128 requests put the 8-channel launch at 28 %
 * achieved occupancy and 75 % of cycles with no eligible warp; the layer bench then gained 1-2 %
 * with 4). GDP_DECODE_FRONT_VEC=4|8 picks for the A/B; unset, empty or auto: FAST_VEC; -1 for
 * any other value (refused by gdp_decode_conv_prepare before anything runs). */
constexpr int FAST_VEC = 4;
extern "C" int gdp_cuda_decode_front_vec(void) {
    static const char *const spell[3] = {"auto", "4", "8"};
    static const int value[3] = {FAST_VEC, 4, 8};
    return gdp_env_choice("GDP_DECODE_FRONT_VEC", spell, value, 3, FAST_VEC, nullptr);
}

extern "C" bool gdp_cuda_decode_core_fits(const gdp_conv1d_update_args *conv, const gdp_prepare_args *prep,
                                          gdp_decode_front_mode mode) {
    const int64_t es = (int64_t)gdp_dtype_size(prep->query.dtype), vec = 16 / es;
    const bool can = conv->x.shape[1] == 1 && !gdp_tensor_present(&conv->intermediate_conv_states) &&
                     conv->weight.shape[1] == CORE_W && conv->y.dtype == prep->query.dtype &&
                     prep->head_dim % vec == 0 && prep->state_dim % vec == 0 && aligned16(prep->query.data) &&
                     aligned16(prep->key.data) && aligned16(prep->value.data);
    if (!can || mode == GDP_DECODE_FRONT_CHAIN)
        return false;
    return mode == GDP_DECODE_FRONT_FUSED || core_fast_dtype(conv, prep) >= 0 || conv->x.shape[0] <= CORE_MAX_ROWS;
}

extern "C" gdp_status_t gdp_cuda_decode_core(struct gdp_ctx *ctx, const gdp_conv1d_update_args *conv,
                                             const gdp_prepare_args *prep) {
    static const char *op = "gdp_decode_conv_prepare";
    const int64_t n = conv->x.shape[0];
    if (n == 0)
        return GDP_STATUS_SUCCESS;
    CoreParams p = {};
    p.x = conv->x.data;
    p.x_row = gdp_tensor_stride(&conv->x, 0);
    p.conv_w = conv->weight.data;
    p.conv_b = gdp_tensor_present(&conv->bias) ? conv->bias.data : nullptr;
    p.state = conv->conv_state.data;
    p.slots_idx = gdp_tensor_present(&conv->conv_state_indices) ? static_cast<const int32_t *>(conv->conv_state_indices.data)
                                                                 : nullptr;
    p.slots = conv->conv_state.shape[0];
    p.C = conv->x.shape[2];
    p.x_dtype = conv->x.dtype;
    p.w_dtype = conv->weight.dtype;
    p.b_dtype = conv->bias.dtype;
    p.state_dtype = conv->conv_state.dtype;
    p.act_dtype = prep->query.dtype;
    p.w_vec = window_aligned(conv->weight);
    p.state_vec = window_aligned(conv->conv_state);
    /* A thread's VEC channels start at a multiple of VEC (C is one, by _fits), so with 16-byte
     * aligned bases, a row stride of x that keeps rows aligned, and contiguous [C, W] rows of
     * weight and state (checked by the op's front end), every run is one or more aligned
     * 16-byte accesses. */
    p.runs_vec = core_runs_vec(conv);
    p.silu = conv->silu;
    p.ba = prep->ba.data;
    p.ba_row = gdp_tensor_stride(&prep->ba, 0);
    p.ba_dtype = prep->ba.dtype;
    p.dt_bias_dtype = prep->dt_bias.dtype;
    p.A_log = static_cast<const float *>(prep->A_log.data);
    p.dt_bias = prep->dt_bias.data;
    p.query = prep->query.data;
    p.key = prep->key.data;
    p.value = prep->value.data;
    p.beta = prep->beta.data;
    p.g = static_cast<float *>(prep->g.data);
    p.M = prep->num_householder, p.H = prep->num_heads, p.G = prep->num_groups, p.P = prep->head_dim;
    p.N = prep->state_dim, p.hpg = p.H / p.G;
    p.k_base = (int64_t)p.M * p.H * p.P;
    p.q_base = p.k_base + (int64_t)p.M * p.G * p.N;
    const int fast = core_fast_dtype(conv, prep);
    const int vec = fast >= 0 ? gdp_cuda_decode_front_vec() : 16 / (int)gdp_dtype_size(p.act_dtype);
    p.conv_units = (int32_t)(p.C / vec);
    p.gate_units = 2 * p.M * p.H;
    const int64_t units = (int64_t)p.conv_units + p.gate_units;
    const dim3 grid((unsigned)((units + CORE_THREADS - 1) / CORE_THREADS), (unsigned)n);
    cudaStream_t stream = static_cast<cudaStream_t>(ctx->stream);
    if (fast == GDP_DTYPE_BF16 && vec == 4)
        decode_core_kernel<4, GDP_DTYPE_BF16><<<grid, CORE_THREADS, 0, stream>>>(p);
    else if (fast == GDP_DTYPE_BF16)
        decode_core_kernel<8, GDP_DTYPE_BF16><<<grid, CORE_THREADS, 0, stream>>>(p);
    else if (fast == GDP_DTYPE_FP16 && vec == 4)
        decode_core_kernel<4, GDP_DTYPE_FP16><<<grid, CORE_THREADS, 0, stream>>>(p);
    else if (fast == GDP_DTYPE_FP16)
        decode_core_kernel<8, GDP_DTYPE_FP16><<<grid, CORE_THREADS, 0, stream>>>(p);
    else if (vec == 8)
        decode_core_kernel<8, -1><<<grid, CORE_THREADS, 0, stream>>>(p);
    else
        decode_core_kernel<4, -1><<<grid, CORE_THREADS, 0, stream>>>(p);
    GDP_CUDA_LAUNCH_CHECK(op, cudaGetLastError(), "%lld requests, %lld channels", (long long)n, (long long)p.C);
    return GDP_STATUS_SUCCESS;
}
