/*
 * gemv_front.cu: in_proj's GEMV for a few decode rows with the decode front as its epilogue
 * (gdp_cuda_gemv_front, gemv.h): C = A B^T in gemv_nt's sums and bits (gemv_math.cuh), then, from
 * each stored element of C, what gdp_decode_conv_prepare (kernels/decode_core.cu) would compute
 * from it, so that the front needs no launch of its own.
 *
 * Why it can be an epilogue: every output of the front is a function of one column of in_proj's
 * output and of inputs that no kernel of the step writes. A conv channel is one column of C (its
 * window in the cache slot is the only other state, and only that channel's unit touches it);
 * beta and g are one column of C's ba section each. So the lane that stores C[r, col] (gemv_nt's
 * epilogue: lane r * CPW + c of the column's warp) goes on to compute that column's unit for row
 * r, exactly as the front's thread for it does: conv_step on the rounded value (conv1d_math.cuh),
 * the new window back to the slot, prepare's copies (value once, a key channel to each head of its
 * group, a query channel to copy M-1 of each head of its group and zeros to the other copies), or
 * beta = sigmoid, g = the decay on copy 0 and zeros on the others (prepare_math.cuh). A conv
 * unit's slot index is loaded before the product and its window and conv weight are sent to L2
 * right after the product's first weight chunks (gemv_sums' hook), so the epilogue reads them from
 * L2 and no register is held across the product (holding them cost 16 registers a thread: 5
 * blocks an SM instead of 8 at one row, by ptxas). Padding rows (a slot outside the cache) get
 * zeros and leave the cache untouched, as in the front.
 *
 * The same bits as gdp_gemm_nt_ex on the skinny kernel (GDP_GEMM_SKINNY=on) followed by
 * gdp_decode_conv_prepare, in every output (C, query, key, value, beta, g and the conv state);
 * conv->y is not written (as the fused front leaves it).
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "conv1d_math.cuh"
#include "dtype_access.cuh"
#include "gemv.h"
#include "gemv_math.cuh"
#include "prepare_math.cuh"
#include "src/cuda_check.h"
#include "src/internal.h"

namespace {

constexpr int FRONT_W = 4; /* the conv width the front fuses (Megatron's) */

struct GemvFrontParams {
    int rows, n, k;
    const void *A, *B;
    int64_t lda, ldc;
    void *C;
    /* the front: C's columns [conv_col, conv_col + channels) are the conv's x, [ba_col, ba_col +
     * (M + 1) H) prepare's ba (b of every copy, then a) */
    int32_t conv_col, channels, ba_col;
    const void *conv_w, *conv_b;
    void *state; /* [slots, channels, FRONT_W] */
    const int32_t *slot_idx; /* [rows] or NULL: row r's slot is r */
    int64_t slots;
    int silu; /* every tensor of the front in C's 16-bit dtype T but g (fp32) and A_log (fp32) */
    const float *A_log;
    const void *dt_bias;
    void *query, *key, *value, *beta;
    float *g;
    int32_t M, H, G, P, N, hpg, k_base, q_base;
};

enum { UNIT_NONE = 0, UNIT_CONV, UNIT_BETA, UNIT_G };

/* The front's unit that reads column col of C: its kind and index (the conv channel, beta's index
 * m H + h, or g's head h). */
struct FrontUnit {
    int kind;
    int32_t j;
};

__device__ __forceinline__ FrontUnit front_unit_of(const GemvFrontParams &p, int64_t col) {
    const int64_t cc = col - p.conv_col, bc = col - p.ba_col, mh = (int64_t)p.M * p.H;
    if (cc >= 0 && cc < p.channels)
        return {UNIT_CONV, (int32_t)cc};
    if (bc >= 0 && bc < mh)
        return {UNIT_BETA, (int32_t)bc};
    if (bc >= mh && bc < mh + p.H)
        return {UNIT_G, (int32_t)(bc - mh)};
    return {UNIT_NONE, 0};
}

/* A conv unit's slot for row r, or -1 for a padding row (outside the cache). */
__device__ __forceinline__ int64_t front_slot(const GemvFrontParams &p, int r) {
    const int64_t slot = p.slot_idx != nullptr ? (int64_t)p.slot_idx[r] : (int64_t)r;
    return slot >= 0 && slot < p.slots ? slot : -1;
}

/* gemv_sums' hook, once the product's first weight chunks are out: a conv unit's slot, then its
 * window and conv weight into L2, so the epilogue finds them there. Nothing is held across the
 * product (the slot and the unit are found again after it: holding them, and the inputs, cost 8 to
 * 16 registers a thread, 5 or 6 blocks an SM instead of gemv_nt's 8 at one row, by ptxas). */
template <typename T> struct FrontPrefetch {
    const GemvFrontParams &p;
    bool mine;
    int r;
    int64_t col;
    __device__ __forceinline__ void operator()() const {
        if (!mine)
            return;
        const FrontUnit unit = front_unit_of(p, col);
        const int64_t slot = unit.kind == UNIT_CONV ? front_slot(p, r) : -1;
        if (slot < 0)
            return;
        prefetch_l2(static_cast<const T *>(p.state) + (slot * p.channels + unit.j) * FRONT_W, FRONT_W * sizeof(T));
        prefetch_l2(static_cast<const T *>(p.conv_w) + (int64_t)unit.j * FRONT_W, FRONT_W * sizeof(T));
    }
};

/* A width-4 window of 16-bit elements (8 bytes, aligned: the host checked) as floats; its raw words in *raw. */
template <typename T> __device__ __forceinline__ void load_window4(const T *at, float (&v)[FRONT_W], uint2 *raw) {
    const uint2 w = *reinterpret_cast<const uint2 *>(at);
    const float2 lo = Pair<T>::f2(w.x), hi = Pair<T>::f2(w.y);
    v[0] = lo.x, v[1] = lo.y, v[2] = hi.x, v[3] = hi.y;
    if (raw != nullptr)
        *raw = w;
}

/* The front's unit of row b for the value x it reads from C (decode_core_kernel's arithmetic and
 * stores for one channel or one gate unit, its fast variant's dtype T everywhere). */
template <typename T>
__device__ __forceinline__ void front_unit(const GemvFrontParams &p, int64_t b, float x, FrontUnit unit, int64_t slot) {
    const int32_t M = p.M, H = p.H, N = p.N;
    if (unit.kind == UNIT_BETA) { /* beta[(m), h] = sigmoid(b[m*H + h]) in ba's dtype */
        static_cast<T *>(p.beta)[b * (int64_t)(M * H) + unit.j] = Pair<T>::from_f(eager_sigmoid(x));
        return;
    }
    if (unit.kind == UNIT_G) { /* g[(m), h]: the decay on copy 0, zeros on the others */
        const float dt_bias = Pair<T>::to_f(static_cast<const T *>(p.dt_bias)[unit.j]);
        p.g[b * (int64_t)(M * H) + unit.j] = eager_decay(x, dt_bias, p.A_log[unit.j]);
        for (int32_t m = 1; m < M; m++)
            p.g[b * (int64_t)(M * H) + (int64_t)m * H + unit.j] = 0.0f;
        return;
    }
    T y = Pair<T>::from_f(0.0f); /* the chain's padding row: y = 0, the cache untouched */
    if (slot >= 0) {
        T *win_at = static_cast<T *>(p.state) + (slot * p.channels + unit.j) * FRONT_W;
        float win[FRONT_W], w[FRONT_W];
        uint2 old;
        load_window4<T>(win_at, win, &old);
        load_window4<T>(static_cast<const T *>(p.conv_w) + (int64_t)unit.j * FRONT_W, w, nullptr);
        const float bias = p.conv_b != nullptr ? Pair<T>::to_f(static_cast<const T *>(p.conv_b)[unit.j]) : 0.0f;
        y = Pair<T>::from_f(conv_step<FRONT_W>(win, w, bias, p.silu, x));
        /* the shifted window in its bits, as the fast front forms it (taps 1, 2 | 3, x): no NaN payload is
         * rewritten by a round trip through fp32 */
        const T xin = Pair<T>::from_f(x);
        const uint32_t xbits = *reinterpret_cast<const uint16_t *>(&xin);
        *reinterpret_cast<uint2 *>(win_at) = make_uint2((old.x >> 16) | (old.y << 16), (old.y >> 16) | (xbits << 16));
    }
    const T zero = Pair<T>::from_f(0.0f);
    prepare_copy_targets(unit.j, b, M, H, p.G, p.P, N, p.hpg, p.k_base, p.q_base, p.value, p.key, p.query,
                         [&](void *dst, int64_t at, bool z) { static_cast<T *>(dst)[at] = z ? zero : y; });
}

/* Blocks an SM the launch bounds ask for: 6 (40 registers, no spill by ptxas) where one column a
 * warp and three or four rows leave it room (at one or two rows A's chunks are held beside the
 * weight's, gemv_math.cuh, and 40 registers spill); ptxas's own choice elsewhere (the epilogue needs 46-59
 * registers at one row unbounded, against gemv_nt's 32; at 32 registers it spills). */
template <int R, int CPW> constexpr int front_min_blocks() {
    return CPW == 1 && R > GEMV_A_REG_ROWS && R <= 4 ? 6 : 1; /* A's chunks in registers: ptxas's own count */
}

/* gemv_nt_kernel's grid and product (TC = T), then each stored element's front unit. */
template <typename T, int R, int CPW>
__global__ void __launch_bounds__(GEMV_WARPS * 32, front_min_blocks<R, CPW>()) gemv_front_kernel(const GemvFrontParams p) {
    const int lane = threadIdx.x & 31;
    const int64_t col0 = ((int64_t)blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5)) * CPW;
    if (col0 >= p.n)
        return;
    const int r = lane / CPW, c = lane % CPW; /* the (row, column) whose element this lane stores */
    const bool mine = lane < R * CPW && r < p.rows && col0 + c < p.n;
    float acc[R][CPW];
    gemv_sums<T, R, CPW>(p.rows, p.n, p.k, GlobalRows<T, R>{static_cast<const T *>(p.A), p.lda, p.rows},
                         static_cast<const T *>(p.B), col0, lane, acc, FrontPrefetch<T>{p, mine, r, col0 + c});
    float v = 0.0f;
#pragma unroll
    for (int rr = 0; rr < R; rr++)
#pragma unroll
        for (int cc = 0; cc < CPW; cc++)
            if (lane == rr * CPW + cc)
                v = acc[rr][cc];
    if (!mine)
        return;
    T *dst = static_cast<T *>(p.C) + r * p.ldc + col0 + c;
    store_sum<T>(dst, v, 0.0f);
    const FrontUnit unit = front_unit_of(p, col0 + c);
    if (unit.kind != UNIT_NONE) /* on the value the front would read back from C */
        front_unit<T>(p, r, Pair<T>::to_f(Pair<T>::from_f(v)), unit, unit.kind == UNIT_CONV ? front_slot(p, r) : -1);
}

template <typename T, int R>
cudaError_t launch_front_rows(const GemvFrontParams &p, cudaStream_t stream) {
    const bool two = gemv_two_columns(p.n);
    const int64_t warps = two ? ((int64_t)p.n + 1) / 2 : p.n;
    const unsigned blocks = (unsigned)((warps + GEMV_WARPS - 1) / GEMV_WARPS);
    if (two)
        gemv_front_kernel<T, R, 2><<<blocks, GEMV_WARPS * 32, 0, stream>>>(p);
    else
        gemv_front_kernel<T, R, 1><<<blocks, GEMV_WARPS * 32, 0, stream>>>(p);
    return cudaGetLastError();
}

template <typename T> cudaError_t launch_front_typed(const GemvFrontParams &p, cudaStream_t stream) {
    if (p.rows <= 1)
        return launch_front_rows<T, 1>(p, stream);
    if (p.rows <= 2)
        return launch_front_rows<T, 2>(p, stream);
    if (p.rows <= 4)
        return launch_front_rows<T, 4>(p, stream);
    return launch_front_rows<T, 8>(p, stream);
}

/* Column offset of a view whose data lies in row 0 of C, or -1 (elements of C's dtype). */
int64_t column_of(const void *view, const void *C, int64_t n, size_t es) {
    const char *v = static_cast<const char *>(view), *c = static_cast<const char *>(C);
    if (v < c || (size_t)(v - c) % es != 0 || (int64_t)((size_t)(v - c) / es) >= n)
        return -1;
    return (int64_t)((size_t)(v - c) / es);
}

} // namespace

// kernel launchers

extern "C" int gdp_cuda_gemv_front_fits(const gdp_gemv_front_args *a) {
    const gdp_conv1d_update_args *conv = a->conv;
    const gdp_prepare_args *prep = a->prep;
    if (conv == NULL || prep == NULL || a->A == NULL || a->B == NULL || a->C == NULL || a->rows < 1 ||
        a->n > INT32_MAX || a->ldc < a->n || a->lda < a->k ||
        !gdp_cuda_gemv_fits(a->rows, a->k, a->A, a->lda, a->B, a->ab_dtype, a->ab_dtype))
        return 0;
    const size_t es = gdp_dtype_size(a->ab_dtype);
    const int64_t conv_col = column_of(conv->x.data, a->C, a->n, es), ba_col = column_of(prep->ba.data, a->C, a->n, es);
    const int64_t M = prep->num_householder, H = prep->num_heads, G = prep->num_groups, P = prep->head_dim,
                  N = prep->state_dim, C = conv->x.ndim == 3 ? conv->x.shape[2] : -1;
    /* one token a request, the rows of C, in C's dtype, with C's pitch; the front's channel layout
     * (value, key, query) and conv width; q, k, v and beta in C's dtype (the front's outputs) */
    const bool x_ok = conv->x.ndim == 3 && conv->x.shape[0] == a->rows && conv->x.shape[1] == 1 &&
                      conv->x.dtype == a->ab_dtype && gdp_tensor_stride(&conv->x, 0) == a->ldc &&
                      gdp_tensor_stride(&conv->x, 2) == 1 && conv_col >= 0 && conv_col + C <= a->n;
    const bool ba_ok = prep->ba.ndim == 3 && prep->ba.shape[0] == a->rows && prep->ba.shape[1] == 1 &&
                       prep->ba.shape[2] == (M + 1) * H && prep->ba.dtype == a->ab_dtype &&
                       gdp_tensor_stride(&prep->ba, 0) == a->ldc && gdp_tensor_stride(&prep->ba, 2) == 1 &&
                       ba_col >= 0 && ba_col + (M + 1) * H <= a->n;
    /* each column feeds one unit at most: the conv and ba sections of C do not overlap */
    const bool apart = ba_col >= conv_col + C || ba_col + (M + 1) * H <= conv_col;
    const bool shape_ok = apart && G > 0 && H % G == 0 && C == M * H * P + M * G * N + G * N && conv->weight.ndim == 2 &&
                          conv->weight.shape[1] == FRONT_W && !gdp_tensor_present(&conv->intermediate_conv_states) &&
                          C <= INT32_MAX && (M + 1) * H <= INT32_MAX;
    /* every tensor of the front in C's dtype (as the fused front's fast variant), windows in one
     * aligned 8-byte access */
    const gdp_dtype_t dt = a->ab_dtype;
    const bool dtype_ok = conv->weight.dtype == dt && conv->conv_state.dtype == dt &&
                          (!gdp_tensor_present(&conv->bias) || conv->bias.dtype == dt) && prep->query.dtype == dt &&
                          prep->key.dtype == dt && prep->value.dtype == dt && prep->beta.dtype == dt &&
                          prep->dt_bias.dtype == dt && prep->A_log.dtype == GDP_DTYPE_FP32 &&
                          prep->g.dtype == GDP_DTYPE_FP32 && window_aligned(conv->weight) &&
                          window_aligned(conv->conv_state);
    return x_ok && ba_ok && shape_ok && dtype_ok;
}

extern "C" gdp_status_t gdp_cuda_gemv_front(struct gdp_ctx *ctx, const gdp_gemv_front_args *a) {
    static const char *op = "gdp_gemm_decode_front";
    if (a->rows <= 0 || a->n <= 0)
        return GDP_STATUS_SUCCESS;
    const gdp_conv1d_update_args *conv = a->conv;
    const gdp_prepare_args *prep = a->prep;
    const size_t es = gdp_dtype_size(a->ab_dtype);
    GemvFrontParams p = {};
    p.rows = (int)a->rows, p.n = (int)a->n, p.k = (int)a->k;
    p.A = a->A, p.B = a->B, p.lda = a->lda, p.ldc = a->ldc, p.C = a->C;
    p.conv_col = (int32_t)column_of(conv->x.data, a->C, a->n, es);
    p.ba_col = (int32_t)column_of(prep->ba.data, a->C, a->n, es);
    p.channels = (int32_t)conv->x.shape[2];
    p.conv_w = conv->weight.data;
    p.conv_b = gdp_tensor_present(&conv->bias) ? conv->bias.data : nullptr;
    p.state = conv->conv_state.data;
    p.slot_idx = gdp_tensor_present(&conv->conv_state_indices)
                     ? static_cast<const int32_t *>(conv->conv_state_indices.data)
                     : nullptr;
    p.slots = conv->conv_state.shape[0];
    p.silu = conv->silu;
    p.A_log = static_cast<const float *>(prep->A_log.data);
    p.dt_bias = prep->dt_bias.data;
    p.query = prep->query.data, p.key = prep->key.data, p.value = prep->value.data, p.beta = prep->beta.data;
    p.g = static_cast<float *>(prep->g.data);
    p.M = prep->num_householder, p.H = prep->num_heads, p.G = prep->num_groups, p.P = prep->head_dim;
    p.N = prep->state_dim, p.hpg = p.H / p.G;
    p.k_base = p.M * p.H * p.P;
    p.q_base = p.k_base + p.M * p.G * p.N;
    cudaStream_t stream = static_cast<cudaStream_t>(ctx->stream);
    const cudaError_t err = a->ab_dtype == GDP_DTYPE_BF16 ? launch_front_typed<__nv_bfloat16>(p, stream)
                                                          : launch_front_typed<__half>(p, stream);
    GDP_CUDA_LAUNCH_CHECK(op, err, "rows %lld, n %lld, k %lld, %d conv channels", (long long)a->rows,
                          (long long)a->n, (long long)a->k, p.channels);
    return GDP_STATUS_SUCCESS;
}
