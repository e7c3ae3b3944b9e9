/*
 * norm_math.cuh: the row norms' math and the fast path's per-vector body, shared by the norm
 * kernels (norm.cu) and the decode kernel's fused gated norm (recurrent.cu), so both give
 * the same bits: NormParams, the gate y * silu(z), the rstd, and norm_fast_vector (one
 * vector by one warp or one block: 16-byte loads, the vector in registers, a sum order fixed
 * by the vector length alone). See norm.cu for the work split.
 */
#ifndef GDP_NORM_MATH_CUH
#define GDP_NORM_MATH_CUH

#include "dtype_access.cuh"

namespace {

/* Butterfly sum over a warp: every lane ends with the same bits. */
__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1)
        x += __shfl_xor_sync(0xffffffffu, x, off);
    return x;
}

constexpr int NORM_THREADS = 128;
constexpr int NORM_WARPS = NORM_THREADS / 32;


struct NormParams {
    const void *x;      /* [vectors, n] contiguous (y of the gated norm) */
    const void *z;      /* gate, like x, or NULL */
    const void *weight; /* [d] or NULL (L2 norm) */
    void *out;
    gdp_dtype_t x_dtype, z_dtype, w_dtype, out_dtype;
    int64_t vectors;     /* rows * groups */
    int64_t n;           /* elements per vector */
    int64_t groups;      /* vectors per row (weight index = group * n + i) */
    int64_t x_row, z_row; /* elements between rows of x and z (groups * n when contiguous); out is contiguous */
    float inv_n, eps;
};

/* y * silu(z), silu(z) = z / (1 + exp(-z)), each operation rounded on its own. */
__device__ __forceinline__ float gated(float y, float z) { return __fmul_rn(y, __fdiv_rn(z, __fadd_rn(1.0f, expf(-z)))); }

/* 1 / the vector's norm from its sum of squares: L2 sqrt(sum + eps), else the RMS
 * sqrt(sum * (1/n) + eps). */
template <bool L2> __device__ __forceinline__ float norm_rstd(const NormParams &p, float ss) {
    return L2 ? __fdiv_rn(1.0f, sqrtf(__fadd_rn(ss, p.eps))) : __fdiv_rn(1.0f, sqrtf(__fadd_rn(__fmul_rn(ss, p.inv_n), p.eps)));
}

constexpr int FAST_WARP_CHUNKS = 4;     /* most 8-element chunks per lane: vectors <= 1024 */
constexpr int FAST_BLOCK_THREADS = 256; /* one block per vector above 1024 elements        */
constexpr int FAST_BLOCK_CHUNKS = 8;    /* most chunks per thread: vectors <= 16384        */
constexpr int64_t FAST_WARP_MAX = 32 * FAST_WARP_CHUNKS * 8;
constexpr int64_t FAST_BLOCK_MAX = FAST_BLOCK_THREADS * FAST_BLOCK_CHUNKS * 8;

/* Fast path body: vector vec by thread t of its warp (t = lane) or of its FAST_BLOCK_THREADS
 * block (BLOCK). Thread t holds chunks t, t + lanes, ... (at most CHUNKS, the launch's
 * smallest count that covers the vector: registers decide occupancy). Y_L2_ONLY: x (y) is
 * read through L2 only (written by other blocks of the calling kernel). */
template <bool L2, bool GATED, bool BLOCK, int CHUNKS, bool Y_L2_ONLY = false>
__device__ __forceinline__ void norm_fast_vector(const NormParams &p, int64_t vec, int t) {
    constexpr int LANES = BLOCK ? FAST_BLOCK_THREADS : 32;
    const int64_t row = vec / p.groups, group = vec - row * p.groups;
    const int64_t xb = row * p.x_row + group * p.n, zb = row * p.z_row + group * p.n, base = vec * p.n;
    const int chunks = (int)(p.n / 8);
    /* With few chunks the weights load with the inputs (one latency, not two in a row). */
    constexpr bool EARLY_W = !L2 && CHUNKS <= 2;
    const int64_t w_base = group * p.n;
    float v[CHUNKS][8];
    float zv[GATED ? CHUNKS : 1][8];
    float wv[EARLY_W ? CHUNKS : 1][8];
#pragma unroll
    for (int c = 0; c < CHUNKS; c++) {
        const int ch = t + c * LANES;
        if (ch < chunks) {
            load_vec_as_float<8, Y_L2_ONLY>(p.x, p.x_dtype, xb + (int64_t)ch * 8, v[c]);
            if constexpr (GATED)
                load_vec_as_float<8>(p.z, p.z_dtype, zb + (int64_t)ch * 8, zv[c]);
            if constexpr (EARLY_W)
                load_vec_as_float<8>(p.weight, p.w_dtype, w_base + (int64_t)ch * 8, wv[c]);
        }
    }
    float ss = 0.0f;
#pragma unroll
    for (int c = 0; c < CHUNKS; c++) {
        if (t + c * LANES < chunks) {
#pragma unroll
            for (int j = 0; j < 8; j++) {
                if constexpr (GATED)
                    v[c][j] = gated(v[c][j], zv[c][j]);
                ss = fmaf(v[c][j], v[c][j], ss);
            }
        }
    }
    ss = warp_sum(ss);
    if constexpr (BLOCK) {
        __shared__ float part[FAST_BLOCK_THREADS / 32];
        if ((threadIdx.x & 31) == 0)
            part[threadIdx.x >> 5] = ss;
        __syncthreads();
        ss = 0.0f;
#pragma unroll
        for (int w = 0; w < FAST_BLOCK_THREADS / 32; w++)
            ss += part[w];
    }
    const float rstd = norm_rstd<L2>(p, ss);
#pragma unroll
    for (int c = 0; c < CHUNKS; c++) {
        const int ch = t + c * LANES;
        if (ch < chunks) {
            float w[8], out[8];
            if constexpr (EARLY_W) {
#pragma unroll
                for (int j = 0; j < 8; j++)
                    w[j] = wv[c][j];
            } else if constexpr (!L2) {
                load_vec_as_float<8>(p.weight, p.w_dtype, w_base + (int64_t)ch * 8, w);
            }
#pragma unroll
            for (int j = 0; j < 8; j++) {
                out[j] = __fmul_rn(v[c][j], rstd);
                if constexpr (!L2)
                    out[j] = __fmul_rn(out[j], w[j]);
            }
            store_vec_from_float<8>(p.out, p.out_dtype, base + (int64_t)ch * 8, out);
        }
    }
}

/* The fast path's work split for vectors of n elements: a block per vector above
 * FAST_WARP_MAX, else a warp; and the chunks a thread holds (the body's CHUNKS, the smallest
 * count that covers the vector). The norm kernels and the norm-GEMV's prologue (gemv.cu)
 * both choose by these, so both sum in the same order. */
inline bool fast_block_vector(int64_t n) { return n > FAST_WARP_MAX; }
inline int64_t fast_chunks_per_thread(int64_t n, bool block) {
    const int64_t lanes = block ? FAST_BLOCK_THREADS : 32;
    return (n / 8 + lanes - 1) / lanes;
}

/* The fast path's shapes: 8-element chunks, registers enough, 16-byte aligned rows. */
inline bool fast_path_fits(const NormParams &p) {
    const size_t xs = gdp_dtype_size(p.x_dtype), zs = p.z != nullptr ? gdp_dtype_size(p.z_dtype) : 0;
    return p.n % 8 == 0 && p.n <= FAST_BLOCK_MAX && aligned16(p.x) && aligned16(p.out) && aligned16(p.z) &&
           aligned16(p.weight) && ((size_t)p.x_row * xs) % 16 == 0 && ((size_t)p.z_row * zs) % 16 == 0;
}

} // namespace

#endif /* GDP_NORM_MATH_CUH */
