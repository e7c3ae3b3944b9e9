/*
 * tile.cuh: block-wide tile helpers of the chunk op shared by the WY and output stages: a
 * 64-row input tile into shared memory (cp.async or plain loads, zero-filled past the valid
 * rows and columns), the deterministic in-place L2 norm of its rows, and the coalesced store of
 * warps' accumulator tiles through shared memory.
 */
#ifndef GDP_CHUNK_TILE_CUH
#define GDP_CHUNK_TILE_CUH

#include <stdint.h>

#include "common.cuh"
#include "gdp/gdp.h"
#include "mma.cuh"

namespace {

/* Starts copying rows [0, 64) x cols [0, COLS) of a row-major global matrix (row stride ld_g)
 * into smem with 16-byte cp.async; rows >= nrows and cols >= ncols (a multiple of 8) become 0. */
template <typename T, int NTH>
__device__ __forceinline__ void tile_async(T *dst, int ld_s, const T *__restrict__ src, int64_t ld_g, int nrows,
                                           int cols, int ncols, int tid) {
    const int vpr = cols >> 3;
    for (int e = tid; e < CHUNK * vpr; e += NTH) {
        const int r = e / vpr, c = (e - r * vpr) * 8;
        const bool ok = r < nrows && c < ncols;
        cp_async16(dst + r * ld_s + c, ok ? src + r * ld_g + c : src, ok);
    }
}

/* The same with plain element loads, for any ncols and alignment. */
template <typename T, int NTH>
__device__ __forceinline__ void tile_scalar(T *dst, int ld_s, const T *__restrict__ src, int64_t ld_g, int nrows,
                                            int cols, int ncols, int tid) {
    for (int e = tid; e < CHUNK * cols; e += NTH) {
        const int r = e / cols, c = e - r * cols;
        dst[r * ld_s + c] = (r < nrows && c < ncols) ? src[r * ld_g + c] : Elem<T>::from_f(0.0f);
    }
}

/* In-place L2 norm of rows [0, nrows) of a 64 x KP smem tile: x / sqrt(sum x^2 + 1e-6) in fp32,
 * rounded to T. 8 lanes per row (4 rows per warp at a time), 16-byte vectors; each row's partial
 * sums meet in a fixed shuffle tree, so the result is deterministic. The tile is row-major with a
 * row stride of ld elements. U row groups a warp at a
 * time (U = 1: one; the fused kernel's 4 aux warps take 4, so 16 independent rows are in flight
 * instead of a chain of 16 dependent iterations); every row's arithmetic is the same for any U. */
template <typename T, int KP, int NW, int U = 1>
__device__ __forceinline__ void l2norm_rows(T *s, int ld, int nrows, int warp, int lane) {
    const auto off = [ld](int r, int v) { return r * ld + v * 8; }; /* row r's 16-byte vector v */
    constexpr int VPL = KP / 64; /* 16-byte vectors per lane */
    for (int r0 = warp * 4; r0 < nrows; r0 += NW * 4 * U) {
        const int l8 = lane & 7;
        uint4 vals[U][VPL];
        float ss[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int r = r0 + u * NW * 4 + (lane >> 3);
            ss[u] = 0.0f;
#pragma unroll
            for (int j = 0; j < VPL; j++) {
                vals[u][j] = (U == 1 || r < CHUNK) ? *reinterpret_cast<const uint4 *>(s + off(r, j * 8 + l8))
                                                   : make_uint4(0u, 0u, 0u, 0u);
                const T *x = reinterpret_cast<const T *>(&vals[u][j]);
#pragma unroll
                for (int e = 0; e < 8; e++) {
                    const float f = Elem<T>::to_f(x[e]);
                    ss[u] += f * f;
                }
            }
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            ss[u] += __shfl_xor_sync(0xffffffffu, ss[u], 4);
            ss[u] += __shfl_xor_sync(0xffffffffu, ss[u], 2);
            ss[u] += __shfl_xor_sync(0xffffffffu, ss[u], 1);
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int r = r0 + u * NW * 4 + (lane >> 3);
            if (r < nrows) {
                const float inv = 1.0f / sqrtf(ss[u] + (float)GDP_L2NORM_EPS);
#pragma unroll
                for (int j = 0; j < VPL; j++) {
                    T *x = reinterpret_cast<T *>(&vals[u][j]);
#pragma unroll
                    for (int e = 0; e < 8; e++)
                        x[e] = Elem<T>::from_f(Elem<T>::to_f(x[e]) * inv);
                    *reinterpret_cast<uint4 *>(s + off(r, j * 8 + l8)) = vals[u][j];
                }
            }
        }
    }
}


/* ---- coalesced tile stores: a warp's accumulators through shared memory ----
 * The m16n8 accumulator layout gives each thread two adjacent columns of a row, so storing
 * straight from registers takes one 4-byte (or 2-byte) store per pair, eight rows apart across the
 * warp: many store instructions, each touching a few bytes of eight rows (the LG-throttle stalls
 * of the output stage's profile). Staging the tile in shared memory first lets the block write
 * whole 16-byte vectors of consecutive columns. The rounding is the same expression as a direct
 * store (Elem<T>::pack of acc * scale), so the stored bits do not change. */

/* NTS of one warp's accumulator tiles from acc[nt0] on (tile nt0 + j: rows r0 + g + {0, 8},
 * columns c0 + 8 j + 2 t4 + {0, 1}), times scale and rounded to T, into the row-major smem tile s
 * (row stride ld elements). */
template <int NTS, typename T, int NT>
__device__ __forceinline__ void stage_acc_tile(T *s, int ld, const float (&acc)[NT][4], int nt0, float scale, int r0,
                                               int c0, int lane) {
    const int g = lane >> 2, t4 = lane & 3;
#pragma unroll
    for (int j = 0; j < NTS; j++)
#pragma unroll
        for (int hh = 0; hh < 2; hh++)
            *reinterpret_cast<uint32_t *>(s + (r0 + g + hh * 8) * ld + c0 + j * 8 + 2 * t4) =
                Elem<T>::pack(acc[nt0 + j][2 * hh] * scale, acc[nt0 + j][2 * hh + 1] * scale);
}

/* Rows [0, nrows) x columns [0, ncols) of a 64-row smem tile (row stride ld_s; ncols a multiple
 * of 8, at most cols) to global memory at dst (row stride ld_g elements, 16-byte aligned rows),
 * 16-byte vectors spread over the block's NTH threads. */
template <typename T, int NTH>
__device__ __forceinline__ void tile_store(T *dst, int64_t ld_g, const T *src, int ld_s, int nrows, int cols,
                                           int ncols, int tid) {
    const int vpr = cols >> 3;
    for (int e = tid; e < CHUNK * vpr; e += NTH) {
        const int r = e / vpr, c = (e - r * vpr) * 8;
        if (r < nrows && c < ncols)
            *reinterpret_cast<uint4 *>(dst + r * ld_g + c) = *reinterpret_cast<const uint4 *>(src + r * ld_s + c);
    }
}

} // namespace

#endif /* GDP_CHUNK_TILE_CUH */
