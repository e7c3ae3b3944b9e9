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

/* Where gemv_sums reads A [rows, k]: global memory with a row pitch (its chunks of a trip go out
 * with the weight's at up to GEMV_A_REG_ROWS rows; beyond, a chunk's rows are read as it is
 * multiplied: their registers would cost blocks an SM), or shared memory of pitch k that the
 * hook fills (read as multiplied, after the hook: the norm-GEMV's normalized rows). */
template <typename T, int R> struct GlobalRows {
    static constexpr bool early = R <= GEMV_A_REG_ROWS;
    const T *A;
    int64_t lda;
    int rows;
    __device__ __forceinline__ uint4 operator()(int r, int idx) const {
        return __ldg(reinterpret_cast<const uint4 *>(A + r * lda + idx));
    }
    /* early, every compiled row: a row past `rows` reads row 0, unused */
    __device__ __forceinline__ uint4 clamped(int r, int idx) const { return (*this)(r < rows ? r : 0, idx); }
    /* 0 (lda >= k > 0: the launcher checked), from a value the compiler cannot bound */
    __device__ __forceinline__ uint32_t fence_zero() const { return (uint32_t)((uint64_t)lda >> 63); }
};
template <typename T> struct SharedRows {
    static constexpr bool early = false;
    const T *As;
    int k;
    __device__ __forceinline__ uint4 operator()(int r, int idx) const {
        return *reinterpret_cast<const uint4 *>(As + (int64_t)r * k + idx);
    }
    /* no fence: the hook's barrier and programmatic wait already keep the weight's loads ahead */
    __device__ __forceinline__ uint32_t fence_zero() const { return 0u; }
};

/* The sums of columns col0 .. col0 + CPW - 1 (rows of B [n, k]) with rows 0 .. rows - 1 of A
 * (R >= rows, compiled; read through a_rows, GlobalRows or SharedRows): acc[r][c], the same total
 * in every lane of the warp. A column past n repeats col0 (its sums unused). U 16-byte chunks of
 * each column a lane go out a trip. hook() runs once, right after the first trip's chunks of B are
 * issued (an epilogue's own loads can go out there without delaying the weight's stream; the
 * norm-GEMV forms its A there). PEEL: the first trip outside the loop, so a large hook's registers
 * are not the loop's (the norm-GEMV's RMS prologue took 30 more in the loop: 138 against 108). */
template <typename T, int R, int CPW, int U = GEMV_U, bool PEEL = false, typename ARows, typename Hook = NoHook>
__device__ __forceinline__ void gemv_sums(int rows, int n, int k, const ARows &a_rows, const T *__restrict__ B,
                                          int64_t col0, int lane, float (&acc)[R][CPW], const Hook &hook = Hook()) {
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int c = 0; c < CPW; c++)
            acc[r][c] = 0.0f;
    const T *brow[CPW];
#pragma unroll
    for (int c = 0; c < CPW; c++)
        brow[c] = B + (col0 + c < n ? col0 + c : col0) * (int64_t)k;

    constexpr bool a_early = ARows::early;
    const uint32_t zero = a_rows.fence_zero();
    /* one trip: its loads, the fence, then (the first trip only) the hook, then its multiplies */
    const auto trip = [&](int base, auto first) {
        uint4 bv[CPW][U];
        [[maybe_unused]] uint4 av[a_early ? R : 1][U]; /* the early rows of A (GlobalRows) */
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int idx = base + u * GEMV_SPAN + lane * 8;
#pragma unroll
            for (int c = 0; c < CPW; c++)
                bv[c][u] = idx < k ? load_stream(brow[c] + idx) : make_uint4(0u, 0u, 0u, 0u);
        }
        if constexpr (a_early) {
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int idx = base + u * GEMV_SPAN + lane * 8;
#pragma unroll
                for (int r = 0; r < R; r++)
                    av[r][u] = idx < k ? a_rows.clamped(r, idx) : make_uint4(0u, 0u, 0u, 0u);
            }
        }
        /* The fence: every sum takes a word of every load of the trip (OR-ed in as x & 0 with a
         * run-time 0, so the bits do not change), so ptxas cannot sink a load between the
         * multiplies of earlier chunks, which it does to save registers (the SASS of gemv_nt had
         * one dependent trip to A a chunk; kernels/NOTES-ops.md, thirty-fourth session). */
        uint32_t dep = 0;
#pragma unroll
        for (int u = 0; u < U; u++) {
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
        if constexpr (std::is_same<decltype(first), bool>::value) {
            if (first)
                hook();
        } else if constexpr (decltype(first)::value) {
            hook();
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
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
                        a = a_rows(r, idx);
#pragma unroll
                    for (int c = 0; c < CPW; c++)
                        acc[r][c] = dot8<T>(acc[r][c], a, bv[c][u]);
                }
            }
        }
    };
    if constexpr (PEEL) {
        trip(0, std::true_type{});
        for (int base = GEMV_SPAN * U; base < k; base += GEMV_SPAN * U)
            trip(base, std::false_type{});
    } else {
        for (int base = 0; base < k; base += GEMV_SPAN * U)
            trip(base, base == 0);
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
