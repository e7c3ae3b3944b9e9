/*
 * gemv_math.cuh: the skinny projection's product, shared by the GEMV kernels (kernels/gemv.cu:
 * gemv_nt, the norm-GEMV) and the in_proj GEMV with the decode front as its epilogue
 * (kernels/gemv_front.cu), so that every one of them sums a column in the same order and gives
 * the same bits: lane l of the column's warp takes the 16-byte chunks l * 8 + 256 i of k in
 * increasing i (GEMV_U of them issued before the first use), fp32 multiply-adds in element order,
 * then one shuffle tree (warp_sum) per (row, column).
 */
#ifndef GDP_GEMV_MATH_CUH
#define GDP_GEMV_MATH_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include <type_traits>

#include "norm_math.cuh" /* warp_sum */

namespace {

constexpr int GEMV_WARPS = 8;     /* warps a block                                */
constexpr int GEMV_U = 4;         /* 16-byte chunks a lane loads per column ahead */
constexpr int GEMV_SPAN = 32 * 8; /* elements of k a warp covers per chunk        */
constexpr int GEMV_A_REG_ROWS = 2; /* rows of A whose chunks load with the weight's   */

template <typename T> struct Pair;
template <> struct Pair<__nv_bfloat16> {
    static __device__ __forceinline__ float2 f2(uint32_t w) {
        return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&w));
    }
    static __device__ __forceinline__ __nv_bfloat16 from_f(float x) { return __float2bfloat16_rn(x); }
    static __device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
};
template <> struct Pair<__half> {
    static __device__ __forceinline__ float2 f2(uint32_t w) { return __half22float2(*reinterpret_cast<const __half2 *>(&w)); }
    static __device__ __forceinline__ __half from_f(float x) { return __float2half_rn(x); }
    static __device__ __forceinline__ float to_f(__half x) { return __half2float(x); }
};

/* A weight chunk, streamed: read once per call, so it need not stay in L1. */
__device__ __forceinline__ uint4 load_stream(const void *p) {
    uint4 r;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
    return r;
}

/* acc += <a, b> over one chunk of 8 elements, in element order */
template <typename T> __device__ __forceinline__ float dot8(float acc, const uint4 &a, const uint4 &b) {
    const uint32_t aw[4] = {a.x, a.y, a.z, a.w}, bw[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
    for (int w = 0; w < 4; w++) {
        const float2 x = Pair<T>::f2(aw[w]), y = Pair<T>::f2(bw[w]);
        acc = fmaf(x.x, y.x, acc);
        acc = fmaf(x.y, y.y, acc);
    }
    return acc;
}

/* *dst = v (+ beta *dst when beta != 0; dst is not read at beta 0), rounded to C's dtype. */
template <typename T, typename TC> __device__ __forceinline__ void store_sum(TC *dst, float v, float beta) {
    if constexpr (std::is_same<TC, float>::value) {
        if (beta != 0.0f)
            v = fmaf(beta, *dst, v);
        *dst = v;
    } else {
        if (beta != 0.0f)
            v = fmaf(beta, Pair<T>::to_f(*dst), v);
        *dst = Pair<T>::from_f(v);
    }
}

/* A gemv_sums hook that does nothing. */
struct NoHook {
    __device__ __forceinline__ void operator()() const {}
};

/* The sums of columns col0 .. col0 + CPW - 1 (rows of B [n, k]) with rows 0 .. rows - 1 of A
 * (R >= rows, compiled): acc[r][c], the same total in every lane of the warp. A column past n
 * repeats col0 (its sums unused). hook() runs once, right after the first chunks of B are issued
 * (an epilogue's own loads can go out there without delaying the weight's stream). */
template <typename T, int R, int CPW, typename Hook = NoHook>
__device__ __forceinline__ void gemv_sums(int rows, int n, int k, const T *__restrict__ A, int64_t lda,
                                          const T *__restrict__ B, int64_t col0, int lane, float (&acc)[R][CPW],
                                          const Hook &hook = Hook()) {
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int c = 0; c < CPW; c++)
            acc[r][c] = 0.0f;
    const T *brow[CPW];
#pragma unroll
    for (int c = 0; c < CPW; c++)
        brow[c] = B + (col0 + c < n ? col0 + c : col0) * (int64_t)k;

    /* A's chunks of a trip go out with the weight's at up to GEMV_A_REG_ROWS rows (beyond, a chunk's
     * rows are read as it is multiplied: their registers would cost blocks an SM) */
    constexpr bool a_early = R <= GEMV_A_REG_ROWS;
    const uint32_t zero = (uint32_t)((uint64_t)lda >> 63); /* 0: lda >= k > 0 (the launcher checked) */
    for (int base = 0; base < k; base += GEMV_SPAN * GEMV_U) {
        uint4 bv[CPW][GEMV_U], av[a_early ? R : 1][GEMV_U];
#pragma unroll
        for (int u = 0; u < GEMV_U; u++) {
            const int idx = base + u * GEMV_SPAN + lane * 8;
#pragma unroll
            for (int c = 0; c < CPW; c++)
                bv[c][u] = idx < k ? load_stream(brow[c] + idx) : make_uint4(0u, 0u, 0u, 0u);
        }
        if constexpr (a_early) {
#pragma unroll
            for (int u = 0; u < GEMV_U; u++) {
                const int idx = base + u * GEMV_SPAN + lane * 8;
#pragma unroll
                for (int r = 0; r < R; r++) /* a row past `rows` reads row 0, unused */
                    av[r][u] = idx < k ? __ldg(reinterpret_cast<const uint4 *>(A + (r < rows ? r : 0) * lda + idx))
                                       : make_uint4(0u, 0u, 0u, 0u);
            }
        }
        /* The fence: every sum takes a word of every load of the trip (OR-ed in as x & 0 with a
         * run-time 0, so the bits do not change), so ptxas cannot sink a load between the
         * multiplies of earlier chunks, which it does to save registers (the SASS of gemv_nt had
         * one dependent trip to A a chunk; kernels/NOTES-ops.md, thirty-fourth session). */
        uint32_t dep = 0;
#pragma unroll
        for (int u = 0; u < GEMV_U; u++) {
#pragma unroll
            for (int c = 0; c < CPW; c++)
                dep ^= bv[c][u].x;
            if constexpr (a_early)
#pragma unroll
                for (int r = 0; r < R; r++)
                    dep ^= av[r][u].x;
        }
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int c = 0; c < CPW; c++)
                acc[r][c] = __uint_as_float(__float_as_uint(acc[r][c]) | (dep & zero));
        if (base == 0)
            hook();
#pragma unroll
        for (int u = 0; u < GEMV_U; u++) {
            const int idx = base + u * GEMV_SPAN + lane * 8;
            if (idx >= k)
                break;
#pragma unroll
            for (int r = 0; r < R; r++) {
                if (r < rows) {
                    uint4 a;
                    if constexpr (a_early)
                        a = av[r][u];
                    else
                        a = __ldg(reinterpret_cast<const uint4 *>(A + r * lda + idx));
#pragma unroll
                    for (int c = 0; c < CPW; c++)
                        acc[r][c] = dot8<T>(acc[r][c], a, bv[c][u]);
                }
            }
        }
    }
    /* one shuffle tree per (row, column): every lane ends with the same fixed-order total */
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int c = 0; c < CPW; c++)
            acc[r][c] = warp_sum(acc[r][c]);
}

/* Two columns a warp where that still leaves a few blocks per SM, else one. */
inline bool gemv_two_columns(int64_t n) { return n >= 2 * GEMV_WARPS * 512; }

} // namespace

#endif /* GDP_GEMV_MATH_CUH */
