/*
 * wy_math.cuh: the chunk's WY algebra both the WY stage (wy.cuh) and the fused kernel's aux
 * warps (fused.cuh) run, once: A = beta K K^T with decay (masked strictly lower) on tensor
 * cores, and (I + A)^-1 in fp32 on CUDA cores, in place or into its own tile.
 */
#ifndef GDP_CHUNK_WY_MATH_CUH
#define GDP_CHUNK_WY_MATH_CUH

#include "common.cuh"
#include "mma.cuh"

namespace {

constexpr int WY_TMP_LD = 3 * 16 + 4; /* the inverse's scratch: one block row, 3 column blocks */

/* Rows [16 warp, 16 warp + 16) of A[r][s] = beta_r 2^(Gk_r - Gk_s) <k_r, k_s> for s < r < n, else 0,
 * every column of them written (the blocks above the diagonal too); k: the chunk's keys, 64
 * rows x KP, row-major; gk, beta: per row. Warps 0-3 together write the whole 64 x 64 tile. */
template <typename T, int KP>
__device__ __forceinline__ void wy_build_a(float (*a)[CHUNK + 4], const T *k, int ldk, const float *gk,
                                           const float *beta, int n, int warp, int lane) {
    const int g = lane >> 2, t4 = lane & 3, r0 = warp * 16;
    float acc[8][4];
    zero_tiles(acc);
    mma_rows_nk<T, KP>(acc, k, ldk, r0, k, ldk, warp, lane); /* columns past the diagonal block are masked */
#pragma unroll
    for (int nt = 0; nt < 8; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int r = r0 + g + (e >> 1) * 8, c = nt * 8 + 2 * t4 + (e & 1);
            float val = 0.0f;
            if (c < r && r < n) /* exponent <= 0 here: no overflow */
                val = acc[nt][e] * exp2f(gk[r] - gk[c]) * beta[r];
            a[r][c] = val;
        }
}

/* X = (I + A)^-1 for the strictly lower 64 x 64 A, by threads [0, 96) of a group whose barrier
 * is sync() (the caller's barrier after A is complete comes first): the 16 x 16 diagonal blocks
 * by forward substitution (one thread a column), then block row by block row, X_rc = -X_rr
 * sum_{c <= q < r} A_rq X_qc, each thread a 2-row x 4-column micro-tile (one float4 of X serves
 * 8 multiply-adds; sums in index order). IN_PLACE: x == a. That works because row block rb's
 * blocks left of the diagonal still hold A when its sums are formed (all of them before any is
 * overwritten) and the rows above already hold X; the diagonal block's 16 threads sit in one
 * warp, which synchronizes before overwriting the A it read. Otherwise x's blocks above the
 * diagonal must be zero already. */
template <bool IN_PLACE, typename Sync>
__device__ __forceinline__ void wy_invert(float (*a)[CHUNK + 4], float (*x)[CHUNK + 4], float (*tmp)[WY_TMP_LD],
                                          int tid, Sync sync) {
    if (tid < 64) {
        const int b = tid >> 4, c = tid & 15, base = b * 16;
        float xc[16];
#pragma unroll
        for (int r = 0; r < 16; r++) {
            float v = (r == c) ? 1.0f : 0.0f;
#pragma unroll
            for (int q = 0; q < 16; q++)
                if (q < r)
                    v -= a[base + r][base + q] * xc[q];
            xc[r] = v;
        }
        if (IN_PLACE)
            __syncwarp();
#pragma unroll
        for (int r = 0; r < 16; r++)
            x[base + r][base + c] = xc[r];
    }
    sync();
#pragma unroll
    for (int rb = 1; rb < 4; rb++) {
        const int rp = tid & 7, cq = tid >> 3, cb = cq >> 2, col = cq * 4; /* col = 16 cb + 4 (cq % 4) */
        const bool active = tid < 32 * rb;
        if (active) {
            float acc[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
            for (int jb = cb; jb < rb; jb++) {
#pragma unroll
                for (int q = 0; q < 16; q++) {
                    const float4 xv = *reinterpret_cast<const float4 *>(&x[jb * 16 + q][col]);
                    const float a0 = a[rb * 16 + 2 * rp][jb * 16 + q], a1 = a[rb * 16 + 2 * rp + 1][jb * 16 + q];
                    acc[0][0] += a0 * xv.x; acc[0][1] += a0 * xv.y; acc[0][2] += a0 * xv.z; acc[0][3] += a0 * xv.w;
                    acc[1][0] += a1 * xv.x; acc[1][1] += a1 * xv.y; acc[1][2] += a1 * xv.z; acc[1][3] += a1 * xv.w;
                }
            }
            *reinterpret_cast<float4 *>(&tmp[2 * rp][col]) = make_float4(acc[0][0], acc[0][1], acc[0][2], acc[0][3]);
            *reinterpret_cast<float4 *>(&tmp[2 * rp + 1][col]) = make_float4(acc[1][0], acc[1][1], acc[1][2], acc[1][3]);
        }
        sync();
        if (active) {
            float acc[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
            for (int q = 0; q < 16; q++) {
                const float4 tv = *reinterpret_cast<const float4 *>(&tmp[q][col]);
                const float d0 = x[rb * 16 + 2 * rp][rb * 16 + q], d1 = x[rb * 16 + 2 * rp + 1][rb * 16 + q];
                acc[0][0] += d0 * tv.x; acc[0][1] += d0 * tv.y; acc[0][2] += d0 * tv.z; acc[0][3] += d0 * tv.w;
                acc[1][0] += d1 * tv.x; acc[1][1] += d1 * tv.y; acc[1][2] += d1 * tv.z; acc[1][3] += d1 * tv.w;
            }
            *reinterpret_cast<float4 *>(&x[rb * 16 + 2 * rp][col]) =
                make_float4(-acc[0][0], -acc[0][1], -acc[0][2], -acc[0][3]);
            *reinterpret_cast<float4 *>(&x[rb * 16 + 2 * rp + 1][col]) =
                make_float4(-acc[1][0], -acc[1][1], -acc[1][2], -acc[1][3]);
        }
        sync();
    }
}

} // namespace

#endif /* GDP_CHUNK_WY_MATH_CUH */
