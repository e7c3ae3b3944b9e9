/*
 * conv1d_math.cuh: the causal conv1d's per-channel math, shared by the conv kernels
 * (conv1d.cu) and the fused decode core (decode_core.cu), so both compute the same bits:
 * a channel's W-wide window read and written as one access where it can be, and one
 * step of the window (shift, append, bias + sum_j w_j win_j in that order, SiLU as
 * x / (1 + exp(-x))), and the host's test of when a window may be one access.
 */
#ifndef GDP_CONV1D_MATH_CUH
#define GDP_CONV1D_MATH_CUH

#include "dtype_access.cuh"
#include "src/internal.h" /* gdp_tensor_is_contiguous (window_aligned) */

namespace {

/* W consecutive elements at element offset `off` (a multiple of W) as floats. With vec
 * (the host checked the base is aligned to W elements) a width-4 window is one 16-byte
 * (fp32) or 8-byte (16-bit) access instead of four, so a warp reads and writes each state
 * line once instead of four times (decode B=256 of the layer bench: 28 -> 20 us). */
template <int W>
__device__ __forceinline__ void load_window(const void *base, gdp_dtype_t dtype, int64_t off, bool vec, float (&v)[W]) {
    if constexpr (W == 4) {
        if (vec) {
            load_vec_as_float<4>(base, dtype, off, v);
            return;
        }
    }
#pragma unroll
    for (int j = 0; j < W; j++)
        v[j] = load_as_float(base, dtype, off + j);
}

template <int W>
__device__ __forceinline__ void store_window(void *base, gdp_dtype_t dtype, int64_t off, bool vec, const float (&v)[W]) {
    if constexpr (W == 4) {
        if (vec) {
            store_vec_from_float<4>(base, dtype, off, v);
            return;
        }
    }
#pragma unroll
    for (int j = 0; j < W; j++)
        store_from_float(base, dtype, off + j, v[j]);
}

/* Shift the window left by one, append x_in, return act(bias + sum_j w_j win_j). */
template <int W>
__device__ __forceinline__ float conv_step(float (&win)[W], const float (&w)[W], float bias, int silu, float x_in) {
#pragma unroll
    for (int j = 0; j < W - 1; j++)
        win[j] = win[j + 1];
    win[W - 1] = x_in;
    float acc = bias;
#pragma unroll
    for (int j = 0; j < W; j++)
        acc = fmaf(w[j], win[j], acc);
    return silu ? __fdiv_rn(acc, __fadd_rn(1.0f, expf(-acc))) : acc;
}

/* Host side: a tensor of [..., W] rows whose base is aligned to a whole row, so that
 * load_window and store_window may move a row in one access (vec). */
inline bool window_aligned(const gdp_tensor &t) {
    const size_t row = (size_t)t.shape[t.ndim - 1] * gdp_dtype_size(t.dtype);
    return t.data != nullptr && (row == 8 || row == 16) && reinterpret_cast<uintptr_t>(t.data) % row == 0 &&
           gdp_tensor_is_contiguous(&t);
}

} // namespace

#endif /* GDP_CONV1D_MATH_CUH */
