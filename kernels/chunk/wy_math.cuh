/*
 * wy_math.cuh: the chunk's WY algebra both the WY stage (wy.cuh) and the fused kernel's aux
 * warps (fused.cuh) run, once: A = beta K K^T with decay (masked strictly lower) on tensor
 * cores, and (I + A)^-1: in fp32 on CUDA cores (wy_invert_in_place), or
 * with its off-diagonal blocks on tf32 tensor cores (wy_invert_tf32: the WY stage's default,
 * and the fused kernel's Ai = T((I + A)^-1 diag beta), wy_invert_ai).
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
    mma_rows_nk<T, KP>(acc, k, ldk, r0, k, ldk, 0, warp, lane); /* columns past the diagonal block are masked */
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

/* Column c = tid % 16 of the inverse of the unit lower-triangular diagonal block b = tid / 16
 * (threads 0-63, one a column) of I + A, by forward substitution in fp32 in index order: x[r] for
 * rows r of the block. Both inverses below start with it, so their diagonal blocks are the same bits.
 * ROW4: row r's entries read four to a 16-byte load (a 16-byte aligned: the Hopper kernel's tile),
 * a quarter of the loads on the aux warps' chain; the same products in the same order. */
template <bool ROW4 = false>
__device__ __forceinline__ void wy_diag_column(const float (*a)[CHUNK + 4], int tid, float (&x)[16]) {
    const int base = (tid >> 4) * 16, c = tid & 15;
#pragma unroll
    for (int r = 0; r < 16; r++) {
        float ar[16];
#pragma unroll
        for (int q4 = 0; q4 < 4; q4++) {
            if (4 * q4 >= r)
                break;
            if constexpr (ROW4) {
                const float4 t = *reinterpret_cast<const float4 *>(&a[base + r][base + 4 * q4]);
                ar[4 * q4] = t.x, ar[4 * q4 + 1] = t.y, ar[4 * q4 + 2] = t.z, ar[4 * q4 + 3] = t.w;
            } else {
#pragma unroll
                for (int i = 0; i < 4; i++)
                    ar[4 * q4 + i] = 4 * q4 + i < r ? a[base + r][base + 4 * q4 + i] : 0.0f;
            }
        }
        float v = (r == c) ? 1.0f : 0.0f;
#pragma unroll
        for (int q = 0; q < 16; q++)
            if (q < r)
                v -= ar[q] * x[q];
        x[r] = v;
    }
}

/* X = (I + A)^-1 for the strictly lower 64 x 64 A, by threads [0, 96) of a group whose barrier
 * is sync() (the caller's barrier after A is complete comes first): the 16 x 16 diagonal blocks
 * by forward substitution (one thread a column), then block row by block row, X_rc = -X_rr
 * sum_{c <= q < r} A_rq X_qc, each thread a 2-row x 4-column micro-tile (one float4 of X serves
 * 8 multiply-adds; sums in index order), X overwriting A in place. That works because row block
 * rb's blocks left of the diagonal still hold A when its sums are formed (all of them before any
 * is overwritten) and the rows above already hold X; the diagonal block's 16 threads sit in one
 * warp, which synchronizes before overwriting the A it read. */
template <typename Sync>
__device__ __forceinline__ void wy_invert_in_place(float (*a)[CHUNK + 4], float (*tmp)[WY_TMP_LD], int tid, Sync sync) {
    float(*const x)[CHUNK + 4] = a; /* X, written over A */
    if (tid < 64) {
        const int c = tid & 15, base = (tid >> 4) * 16;
        float xc[16];
        wy_diag_column(a, tid, xc);
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

/* ---- the fused kernel's inverse on tensor cores (tf32) ---- */

__device__ __forceinline__ uint32_t tf32_bits(float x) {
    uint32_t r;
    asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
    return r;
}
/* c += a b, m16n8k8 on tf32 with fp32 accumulation. g = lane / 4, t = lane % 4: a holds the
 * 16 x 8 tile's (g, t), (g + 8, t), (g, t + 4), (g + 8, t + 4); b the 8 x 8 tile's (t, g), (t + 4, g);
 * c the 16 x 8 result's (g, 2t), (g, 2t + 1), (g + 8, 2t), (g + 8, 2t + 1) as in m16n8k16. */
__device__ __forceinline__ void mma_tf32(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
                 "{%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
/* The A operand of m16n8k8 from rows [r0, r0 + 16), columns [k0, k0 + 8) of the fp32 tile. */
__device__ __forceinline__ void frag_a_tf32(uint32_t af[4], const float (*a)[CHUNK + 4], int r0, int k0, int g, int t4) {
    af[0] = tf32_bits(a[r0 + g][k0 + t4]);
    af[1] = tf32_bits(a[r0 + g + 8][k0 + t4]);
    af[2] = tf32_bits(a[r0 + g][k0 + t4 + 4]);
    af[3] = tf32_bits(a[r0 + g + 8][k0 + t4 + 4]);
}

constexpr int WY_INV_SCRATCH_LD = 9;                   /* a warp's 16 x 8 product tile, padded */
constexpr int WY_INV_SCRATCH = 16 * WY_INV_SCRATCH_LD; /* floats of scratch a warp             */
/* A 16 x 8 product tile (m16n8's c fragment) into rows [0, 16) of a warp's scratch, and the B
 * operand of m16n8k8 from its rows [k0, k0 + 8): how the inverses hand a product to the next. */
__device__ __forceinline__ void wy_scratch_put(float *sc, const float (&y)[4], int g, int t4) {
    sc[g * WY_INV_SCRATCH_LD + 2 * t4] = y[0];
    sc[g * WY_INV_SCRATCH_LD + 2 * t4 + 1] = y[1];
    sc[(g + 8) * WY_INV_SCRATCH_LD + 2 * t4] = y[2];
    sc[(g + 8) * WY_INV_SCRATCH_LD + 2 * t4 + 1] = y[3];
}
__device__ __forceinline__ void wy_scratch_b(const float *sc, int k0, int g, int t4, uint32_t &b0, uint32_t &b1) {
    b0 = tf32_bits(sc[(k0 + t4) * WY_INV_SCRATCH_LD + g]);
    b1 = tf32_bits(sc[(k0 + t4 + 4) * WY_INV_SCRATCH_LD + g]);
}
/* X's 16 x 8 tile at rows [r0, r0 + 16), columns [n0, n0 + 8), left of the diagonal blocks, from the
 * fragment xr = -X: into a's upper triangle transposed (a[c][r] = X[r][c]) and to the caller. */
template <typename EmitPair>
__device__ __forceinline__ void wy_put_x_tile(float (*a)[CHUNK + 4], const float (&xr)[4], int r0, int n0, int g, int t4,
                                              EmitPair emit_pair) {
    const int cc = n0 + 2 * t4;
    a[cc][r0 + g] = -xr[0];
    a[cc + 1][r0 + g] = -xr[1];
    a[cc][r0 + g + 8] = -xr[2];
    a[cc + 1][r0 + g + 8] = -xr[3];
    emit_pair(r0 + g, cc, -xr[0], -xr[1]);
    emit_pair(r0 + g + 8, cc, -xr[2], -xr[3]);
}

/* X = (I + A)^-1 for the strictly lower 64 x 64 A in a (fp32), by the four warps of a group whose
 * barrier is sync() (the caller's barrier after A is complete comes first), in three steps
 * where wy_invert_in_place takes seven barriers:
 *  - the 16 x 16 diagonal blocks X_bb by forward substitution, one thread a column, in fp32 and
 *    in the same order as wy_invert_in_place (threads 0-63; meanwhile threads 64-127 run idle(tid));
 *  - block rows rb = 1, 2, 3 in turn: X_rb,c = -X_rr (A_rb,<rb X_<rb,c), each 8-column tile of it
 *    by one warp on tf32 tensor cores (fp32 accumulation), the inner product through the warp's
 *    own scratch sc (WY_INV_SCRATCH floats, each warp its own) and a __syncwarp, no block barrier.
 * X's diagonal blocks replace A's in place; its off-diagonal blocks are stored transposed in a's
 * upper triangle (a[c][r] = X[r][c]), which nothing reads as A, so A's lower blocks stay intact
 * for the later block rows and each block row needs one barrier, not two (a reader of X takes
 * X[r][c] from a[c][r] left of the diagonal blocks, and 0 right of them).
 * Each value is also handed to the caller as it is formed: emit_diag(r, c, x) for the diagonal
 * blocks' elements, emit_pair(r, c, x0, x1) for X[r][c], X[r][c + 1] left of them (c even).
 * tf32 keeps 11 significant bits where X is then rounded to 8 (bf16) or 11 (fp16), so its
 * products move Ai by well under Ai's own rounding (kernels/NOTES-chunk.md, f4 and the
 * nineteenth session). No barrier after the last block row: the caller's comes next. */
/* Column c of the 16 x 16 diagonal block at rows and columns [base, base + 16): X's values xc
 * (wy_diag_column) in place of A's, each also handed to the caller (emit_diag). */
template <typename EmitDiag>
__device__ __forceinline__ void wy_store_diag_column(float (*a)[CHUNK + 4], int base, int c, const float (&xc)[16],
                                                     EmitDiag emit_diag) {
#pragma unroll
    for (int r = 0; r < 16; r++) {
        a[base + r][base + c] = xc[r];
        emit_diag(base + r, base + c, xc[r]);
    }
}

template <typename Sync, typename EmitDiag, typename EmitPair, typename Idle>
__device__ __forceinline__ void wy_invert_tf32(float (*a)[CHUNK + 4], float *sc, int tid, Sync sync,
                                               EmitDiag emit_diag, EmitPair emit_pair, Idle idle) {
    const int lane = tid & 31, warp = tid >> 5, g = lane >> 2, t4 = lane & 3;
    if (tid < 64) {
        const int c = tid & 15, base = (tid >> 4) * 16;
        float xc[16];
        wy_diag_column(a, tid, xc);
        __syncwarp(); /* the warp's two blocks have read the A they overwrite */
        wy_store_diag_column(a, base, c, xc, emit_diag);
    } else {
        idle(tid);
    }
    sync();
#pragma unroll
    for (int rb = 1; rb < 4; rb++) {
        const int r0 = rb * 16;
        for (int j = warp; j < 2 * rb; j += 4) { /* the block row's 8-column tiles left of the diagonal */
            const int n0 = j * 8, cb = j >> 1;
            /* Y = A[r0 .., k] X[k, n0 ..] over k in [16 cb, r0): X is zero above its diagonal */
            float y[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            for (int kk = 16 * cb; kk < r0; kk += 8) {
                uint32_t af[4];
                frag_a_tf32(af, a, r0, kk, g, t4);
                const bool diag = (kk >> 4) == cb; /* X's diagonal block sits in place, the others transposed */
                const float x0 = diag ? a[kk + t4][n0 + g] : a[n0 + g][kk + t4];
                const float x1 = diag ? a[kk + t4 + 4][n0 + g] : a[n0 + g][kk + t4 + 4];
                mma_tf32(y, af, tf32_bits(x0), tf32_bits(x1));
            }
            wy_scratch_put(sc, y, g, t4);
            __syncwarp();
            /* X[r0 .., n0 ..] = -X_rr Y */
            float xr[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
            for (int k0 = 0; k0 < 16; k0 += 8) {
                uint32_t af[4];
                frag_a_tf32(af, a, r0, r0 + k0, g, t4);
                uint32_t b0, b1;
                wy_scratch_b(sc, k0, g, t4, b0, b1);
                mma_tf32(xr, af, b0, b1);
            }
            __syncwarp(); /* the scratch is free for the warp's next tile */
            wy_put_x_tile(a, xr, r0, n0, g, t4, emit_pair);
        }
        if (rb < 3)
            sync(); /* block row rb of X is complete before the next one reads it */
    }
}

/* The A operand of m16n8k8 from X's block stored transposed (X[r][k] at a[k][r]): rows [r0, r0 + 16),
 * columns [k0, k0 + 8) of X. */
__device__ __forceinline__ void frag_a_tf32_t(uint32_t af[4], const float (*a)[CHUNK + 4], int r0, int k0, int g,
                                              int t4) {
    af[0] = tf32_bits(a[k0 + t4][r0 + g]);
    af[1] = tf32_bits(a[k0 + t4][r0 + g + 8]);
    af[2] = tf32_bits(a[k0 + t4 + 4][r0 + g]);
    af[3] = tf32_bits(a[k0 + t4 + 4][r0 + g + 8]);
}
/* X[k][n] for k, n < 64 under wy_invert_tf32's storage: diagonal blocks in place, blocks left of them
 * transposed into a's upper triangle (the caller never asks right of them: those are zero). */
__device__ __forceinline__ float wy_x_at(const float (*a)[CHUNK + 4], int k, int n) {
    return (k >> 4) == (n >> 4) ? a[k][n] : a[n][k];
}

constexpr int WY_INV2_SCRATCH = 32 * WY_INV_SCRATCH_LD; /* floats a warp: a 32 x 8 product tile, padded */
/* The Hopper lab's builds that leave a level of the inverse out (GDP_HOPPER_DEV_SKIP 4, 8, a compile
 * definition: hopper.cuh); 0 in the library, which includes this before hopper.cuh defines its default */
#ifdef GDP_HOPPER_DEV_SKIP
constexpr int WY_LAB_SKIP = GDP_HOPPER_DEV_SKIP;
#else
constexpr int WY_LAB_SKIP = 0;
#endif

/* X = (I + A)^-1 as wy_invert_tf32 (the same storage, callbacks, diagonal blocks and tf32 products)
 * by recursive doubling instead of block rows, in two calls:
 *  - wy_diag_blocks_by_warp: warp b inverts the 16 x 16 diagonal block b, which lies in its own rows of
 *    A, by forward substitution (wy_diag_column, lanes 0-15: the same bits), so it needs only its own
 *    rows stored and a __syncwarp, not the block barrier after the whole of A (lanes 16-31 wait: Ai's
 *    zeros right of the diagonal blocks, wy_invert_tf32's idle work, are the caller's, once a tile);
 *  - after a block barrier, wy_invert_tf32_levels: level 32, the blocks X_10 and X_32 of the two
 *    32 x 32 diagonal blocks: X_10 = -X_11 (A_10 X_00), X_32 = -X_33 (A_32 X_22), an 8-column tile a
 *    warp; then level 64, the lower-left 32 x 32 block: X_LL = -X_LR (A_LL X_UL) with X_UL, X_LR the two
 *    32 x 32 diagonal blocks of X, 8 of its columns a warp (two 16-row tiles of the product through the
 *    warp's scratch, WY_INV2_SCRATCH floats, and a __syncwarp).
 * Two block barriers where wy_invert_tf32 takes three plus the caller's after A, and each warp gets
 * the same share (block row 1 of wy_invert_tf32 keeps two of the four warps idle, block row 3 gives
 * two of them two tiles). Each product is the same sum as wy_invert_tf32's in exact arithmetic
 * (X_30's three terms are X_32's and X_33's parts here); the roundings differ (kernels/NOTES-chunk.md,
 * twenty-third session). A's lower blocks stay intact throughout: X's off-diagonal blocks go to the
 * upper triangle (a[c][r] = X[r][c]), level 32's to a[0..15][16..31] and a[32..47][48..63], level
 * 64's to a[0..31][32..63], which no product of the same level reads. No barrier after level 64. */
template <typename EmitDiag>
__device__ __forceinline__ void wy_diag_blocks_by_warp(float (*a)[CHUNK + 4], int warp, int lane, EmitDiag emit_diag) {
    const int base = 16 * warp, c = lane & 15;
    float xc[16];
    if (lane < 16)
        wy_diag_column<true>(a, base + c, xc);
    __syncwarp(); /* the block's A is read before it is overwritten */
    if (lane < 16)
        wy_store_diag_column(a, base, c, xc, emit_diag);
}
template <typename Sync, typename EmitPair>
__device__ __forceinline__ void wy_invert_tf32_levels(float (*a)[CHUNK + 4], float *sc, int tid, Sync sync,
                                                      EmitPair emit_pair) {
    const int lane = tid & 31, warp = tid >> 5, g = lane >> 2, t4 = lane & 3;
    if constexpr ((WY_LAB_SKIP & 8) == 0) { /* level 32: warp w forms columns [n0, n0 + 8) of X_10 (w = 0, 1) or X_32 (w = 2, 3) */
        const int d0 = 32 * (warp >> 1), r0 = d0 + 16, n0 = d0 + 8 * (warp & 1);
        float y[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int k0 = 0; k0 < 16; k0 += 8) { /* Y = A_rd X_dd: X_dd in place */
            uint32_t af[4];
            frag_a_tf32(af, a, r0, d0 + k0, g, t4);
            mma_tf32(y, af, tf32_bits(a[d0 + k0 + t4][n0 + g]), tf32_bits(a[d0 + k0 + t4 + 4][n0 + g]));
        }
        wy_scratch_put(sc, y, g, t4);
        __syncwarp();
        float xr[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int k0 = 0; k0 < 16; k0 += 8) { /* X = -X_rr Y: X_rr in place */
            uint32_t af[4];
            frag_a_tf32(af, a, r0, r0 + k0, g, t4);
            uint32_t b0, b1;
            wy_scratch_b(sc, k0, g, t4, b0, b1);
            mma_tf32(xr, af, b0, b1);
        }
        wy_put_x_tile(a, xr, r0, n0, g, t4, emit_pair);
    }
    sync(); /* X_UL and X_LR complete */
    if constexpr ((WY_LAB_SKIP & 4) == 0) { /* level 64: warp w forms columns [n0, n0 + 8) of X_LL (rows 32-63), n0 = 8 w */
        const int n0 = 8 * warp, kb = 16 * (warp >> 1); /* X_UL[k][n0 ..] is zero for k < kb */
        float y[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
        for (int k0 = 0; k0 < 32; k0 += 8) { /* Y = A_LL X_UL, both 16-row tiles beside each other */
            if (k0 < kb)
                continue;
            const uint32_t b0 = tf32_bits(wy_x_at(a, k0 + t4, n0 + g)), b1 = tf32_bits(wy_x_at(a, k0 + t4 + 4, n0 + g));
#pragma unroll
            for (int mt = 0; mt < 2; mt++) {
                uint32_t af[4];
                frag_a_tf32(af, a, 32 + 16 * mt, k0, g, t4);
                mma_tf32(y[mt], af, b0, b1);
            }
        }
#pragma unroll
        for (int mt = 0; mt < 2; mt++)
            wy_scratch_put(sc + 16 * mt * WY_INV_SCRATCH_LD, y[mt], g, t4);
        __syncwarp();
        /* X = -X_LR Y: rows 32-47 see X_22 (in place) only; rows 48-63 see X_32 (transposed) and X_33 */
        float xr[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
        for (int k0 = 0; k0 < 32; k0 += 8) {
            uint32_t b0, b1, af[4];
            wy_scratch_b(sc, k0, g, t4, b0, b1);
            if (k0 < 16) {
                frag_a_tf32(af, a, 32, 32 + k0, g, t4); /* X_22 */
                mma_tf32(xr[0], af, b0, b1);
                frag_a_tf32_t(af, a, 48, 32 + k0, g, t4); /* X_32 */
            } else {
                frag_a_tf32(af, a, 48, 32 + k0, g, t4); /* X_33 */
            }
            mma_tf32(xr[1], af, b0, b1);
        }
#pragma unroll
        for (int mt = 0; mt < 2; mt++)
            wy_put_x_tile(a, xr[mt], 32 + 16 * mt, n0, g, t4, emit_pair);
    }
}

/* Ai's stores as the inverses hand X's values over: Ai(r, c) = X[r][c] beta[c] in T at at(r, c), the
 * address of Ai's element (r, c) in whatever layout the caller keeps it (row-major in the fused
 * kernel, the swizzled panel of the Hopper kernel), and the zero blocks right of the diagonal blocks
 * (rows 0-47, 8 columns a store, by threads t = 64 .. 127). */
template <typename T, typename At> struct AiStores {
    At at;
    const float *beta;
    __device__ __forceinline__ void diag(int r, int c, float x) const { diag_by(r, c, x, beta[c]); }
    /* the same with column c's beta already read (beta_c) */
    __device__ __forceinline__ void diag_by(int r, int c, float x, float beta_c) const {
        *at(r, c) = Elem<T>::from_f(x * beta_c);
    }
    __device__ __forceinline__ void pair(int r, int c, float x0, float x1) const {
        pair_by(r, c, x0, x1, beta[c], beta[c + 1]);
    }
    /* the same with columns c's and c + 1's betas already read */
    __device__ __forceinline__ void pair_by(int r, int c, float x0, float x1, float beta0, float beta1) const {
        *reinterpret_cast<uint32_t *>(at(r, c)) = Elem<T>::pack(x0 * beta0, x1 * beta1);
    }
    __device__ __forceinline__ void zero_upper(int t) const { zero_upper_by(t - 64, 64); }
    /* the same zeros by thread t of nt */
    __device__ __forceinline__ void zero_upper_by(int t, int nt) const {
        for (int e = t; e < 48 * 8; e += nt) {
            const int r = e >> 3, c8 = (e & 7) * 8;
            if (c8 >= ((r >> 4) + 1) * 16)
                *reinterpret_cast<uint4 *>(at(r, c8)) = make_uint4(0u, 0u, 0u, 0u);
        }
    }
};

/* Ai = T((I + A)^-1 diag(beta)) for the strictly lower 64 x 64 A in a (fp32), by wy_invert_tf32
 * (same group, same barriers); the one-pass kernels' aux warps (AiStores: at). Warps 2-3 zero Ai
 * right of the diagonal blocks while warps 0-1 solve those blocks. */
template <typename T, typename At, typename Sync>
__device__ __forceinline__ void wy_invert_ai_at(float (*a)[CHUNK + 4], At at, const float *beta, float *sc, int tid,
                                                Sync sync) {
    const AiStores<T, At> out{at, beta};
    wy_invert_tf32(
        a, sc, tid, sync, [&](int r, int c, float x) { out.diag(r, c, x); },
        [&](int r, int c, float x0, float x1) { out.pair(r, c, x0, x1); }, [&](int t) { out.zero_upper(t); });
}
/* The same by recursive doubling (wy_diag_blocks_by_warp, then wy_invert_tf32_levels; sc:
 * WY_INV2_SCRATCH floats a warp): the Hopper kernel's aux warpgroup. The caller has stored its
 * warp's rows of A and run a __syncwarp, no block barrier; between() runs after the diagonal blocks
 * and must end in the group's barrier (the caller's, so that it can add work there). Ai's zeros right
 * of the diagonal blocks are the caller's, once a tile (AiStores::zero_upper_by): no chunk changes
 * them, and their stores beside the diagonal blocks sat on the aux chain (the warp's lanes 16-31
 * branch apart from the forward substitution's 0-15, so the warp issued both). */
template <typename T, typename At, typename Between, typename Sync>
__device__ __forceinline__ void wy_invert_ai_doubling_at(float (*a)[CHUNK + 4], At at, const float *beta, float *sc,
                                                         int tid, Between between, Sync sync) {
    const AiStores<T, At> out{at, beta};
    /* the lane's column of the diagonal blocks, 16 warp + lane % 16, has one beta: read once (out.diag
     * would read it again after each of the column's stores to a, which it cannot tell from beta) */
    const float beta_c = beta[16 * (tid >> 5) + (tid & 15)];
    /* likewise the two column pairs the lane's level-32 and level-64 tiles store (wy_invert_tf32_levels: warp w's
     * columns 32 (w / 2) + 8 (w % 2) and 8 w, + 2 (lane % 4)), read here, off the levels' tails */
    const int w = tid >> 5, c32 = 32 * (w >> 1) + 8 * (w & 1) + 2 * (tid & 3), c64 = 8 * w + 2 * (tid & 3);
    const float b32a = beta[c32], b32b = beta[c32 + 1], b64a = beta[c64], b64b = beta[c64 + 1];
    wy_diag_blocks_by_warp(a, w, tid & 31, [&](int r, int c, float x) { out.diag_by(r, c, x, beta_c); });
    between();
    wy_invert_tf32_levels(a, sc, tid, sync, [&](int r, int c, float x0, float x1) {
        const bool l32 = c == c32;
        out.pair_by(r, c, x0, x1, l32 ? b32a : b64a, l32 ? b32b : b64b);
    });
}
/* The same into a row-major Ai (row stride ldai elements): the fused kernel's. */
template <typename T, typename Sync>
__device__ __forceinline__ void wy_invert_ai(float (*a)[CHUNK + 4], T *ai, int ldai, const float *beta, float *sc,
                                             int tid, Sync sync) {
    wy_invert_ai_at<T>(a, [=](int r, int c) { return ai + r * ldai + c; }, beta, sc, tid, sync);
}

} // namespace

#endif /* GDP_CHUNK_WY_MATH_CUH */
