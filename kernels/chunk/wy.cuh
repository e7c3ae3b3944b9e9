/*
 * wy.cuh: stage 1 of the chunk op, chunk_wy_kernel: the WY factors per expanded chunk
 * (gdp-math.md 3.2-3.4). Keys (L2-normalized if asked, rounded to the input dtype) go to the
 * workspace for the later stages; A = beta K K^T with decay, Ai = (I + A)^-1 in fp32 with its
 * off-diagonal blocks on tf32 tensor cores (TF32, the default) or all on CUDA cores, then
 * w = Ai (beta 2^Gk K) and u = Ai (beta V) on tensor cores.
 */
#ifndef GDP_CHUNK_WY_CUH
#define GDP_CHUNK_WY_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "common.cuh"
#include "mma.cuh"
#include "tile.cuh"
#include "wy_math.cuh"

namespace {

// CUDA kernels

/* 55 KB at K = V = 128 (bf16), so four blocks share an SM (three while the inverse had a tile of
 * its own: the stage is latency-bound, kernels/NOTES-chunk.md, sixteenth session). */
template <typename T, int KP> struct WySmem {
    T k[CHUNK][KP + PAD];      /* keys, then beta 2^Gk K                                       */
    float a[CHUNK][CHUNK + 4]; /* A, then (I + A)^-1 in place (fp32), then Ai in T and the      *
                                * warps' store staging tiles (WY_STAGE_*) over the same bytes  */
    float tmp[16][WY_TMP_LD];  /* one block row of sum_q A_rq X_qc, all its column blocks    */
    float beta[CHUNK];
    float fk[CHUNK]; /* beta 2^Gk: the row factor of w's right-hand side */
    float gk[CHUNK];
}; /* dynamic smem continues with V [CHUNK][VP + PAD] in T, later scaled by beta */
static_assert(sizeof(WySmem<__nv_bfloat16, 64>) % 16 == 0 && sizeof(WySmem<__half, 128>) % 16 == 0 &&
                  sizeof(WySmem<__nv_bfloat16, 256>) % 16 == 0,
              "the V tile after WySmem needs 16-byte alignment");
/* After the solve, A's bytes hold Ai in T ([64][64 + PAD]) and behind it one staging tile a warp
 * for the coalesced stores of w and u: 16 rows x 32 columns (+ PAD), one half of a 64-column block. */
constexpr int WY_STAGE_COLS = 32, WY_STAGE_LD = WY_STAGE_COLS + PAD, WY_STAGE_ELEMS = 16 * WY_STAGE_LD;
static_assert(sizeof(float) * CHUNK * (CHUNK + 4) >=
                  sizeof(__nv_bfloat16) * (CHUNK * (CHUNK + PAD) + 4 * WY_STAGE_ELEMS),
              "Ai and the four staging tiles in T must fit in A's storage");
static_assert((sizeof(__nv_bfloat16) * CHUNK * (CHUNK + PAD)) % 16 == 0 && (WY_STAGE_LD * 2) % 16 == 0,
              "the staging tiles need 16-byte aligned rows");
static_assert(16 * WY_TMP_LD >= 4 * WY_INV_SCRATCH, "the tf32 inverse's four warp scratches must fit in tmp");

/* Work split: one 128-thread block per (expanded chunk descriptor, head); warp w owns rows
 * [16w, 16w+16) of A, w and u; the 64x64 triangular inverse in fp32, its off-diagonal blocks'
 * products on tf32 tensor cores (TF32: three block barriers; wy_invert_tf32) or all on CUDA
 * cores (seven; wy_invert_in_place). K and V arrive together (cp.async) at the start, so no load waits
 * after the solve. */
template <typename T, int KP, bool TF32>
__global__ void __launch_bounds__(128) chunk_wy_kernel(const ChunkParams p) {
    constexpr int NTH = 128;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    WySmem<T, KP> &s = *reinterpret_cast<WySmem<T, KP> *>(smem_raw);
    T *sv = reinterpret_cast<T *>(smem_raw + sizeof(WySmem<T, KP>));
    T(*ai)[CHUNK + PAD] = reinterpret_cast<T(*)[CHUNK + PAD]>(&s.a[0][0]);
    const int ldv = p.VP + PAD;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int hd = blockIdx.y, H = p.H;

    const int i = p.cidx_dp[2 * blockIdx.x], j = p.cidx_dp[2 * blockIdx.x + 1];
    if (i < 0 || i >= p.N || j < 0)
        return;
    const int64_t bos = p.cu[i];
    const int64_t len_dp = ((int64_t)p.cu[i + 1] - bos) * p.M;
    const int64_t start = (int64_t)j * CHUNK;
    if (start >= len_dp)
        return; /* padding descriptor: inert */
    const int n = (int)min((int64_t)CHUNK, len_dp - start);
    const int64_t row0 = bos * p.M + start; /* global expanded row of local row 0 */

    /* keys and values (both at once), beta, Gk */
    const T *ksrc = static_cast<const T *>(p.k) + (row0 * H + hd) * p.K;
    const T *vsrc = static_cast<const T *>(p.v) + (row0 * H + hd) * p.V;
    if (p.k_vec)
        tile_async<T, NTH>(&s.k[0][0], KP + PAD, ksrc, (int64_t)H * p.K, n, KP, p.K, tid);
    else
        tile_scalar<T, NTH>(&s.k[0][0], KP + PAD, ksrc, (int64_t)H * p.K, n, KP, p.K, tid);
    if (p.v_vec)
        tile_async<T, NTH>(sv, ldv, vsrc, (int64_t)H * p.V, n, p.VP, p.V, tid);
    else
        tile_scalar<T, NTH>(sv, ldv, vsrc, (int64_t)H * p.V, n, p.VP, p.V, tid);
    cp_async_commit();
    if (tid < CHUNK) {
        float b = 0.0f, gk = 0.0f;
        if (tid < n) {
            b = load_any(p.beta, p.beta_dtype, (row0 + tid) * H + hd);
            gk = p.gk[(row0 + tid) * H + hd];
        }
        s.beta[tid] = b;
        s.gk[tid] = gk;
        s.fk[tid] = b * exp2f(gk);
    }
    cp_async_wait<0>();
    __syncthreads();
    if (p.l2norm) {
        l2norm_rows<T, KP, NTH / 32>(&s.k[0][0], KP + PAD, n, warp, lane);
        __syncthreads();
    }
    /* The keys the later stages use (normalized and rounded like upstream's separate pass). */
    {
        T *kn = static_cast<T *>(p.kn) + (row0 * H + hd) * KP;
        constexpr int VPR = KP / 8;
        for (int e = tid; e < n * VPR; e += NTH) {
            const int r = e / VPR, c = (e % VPR) * 8;
            *reinterpret_cast<uint4 *>(kn + (int64_t)r * H * KP + c) = *reinterpret_cast<const uint4 *>(&s.k[r][c]);
        }
    }

    /* A[r][s] = beta_r 2^(Gk_r - Gk_s) <k_r, k_s> for s < r < n, else 0, the whole tile written:
     * its blocks above the diagonal are zero, as the in-place inverse needs (wy_math.cuh) */
    wy_build_a<T, KP>(s.a, &s.k[0][0], KP + PAD, s.gk, s.beta, n, warp, lane);
    __syncthreads();

    /* (I + A)^-1 in place, 16x16 blocks (wy_math.cuh). fp32: the same sums in the same order as
     * into a tile of its own, so the same bits. tf32: X's blocks left of the diagonal land
     * transposed into the upper triangle (wy_invert_tf32), read back below. */
    if constexpr (TF32) {
        const auto none = [](int, int, float) {};
        const auto none_pair = [](int, int, float, float) {};
        wy_invert_tf32(s.a, &s.tmp[0][0] + warp * WY_INV_SCRATCH, tid, [] { __syncthreads(); }, none, none_pair,
                       [](int) {});
        __syncthreads(); /* the last block row of X is complete */
    } else {
        wy_invert_in_place(s.a, s.tmp, tid, [] { __syncthreads(); });
    }
    /* Ai rounded to T over the same bytes: every thread reads its X values before any Ai is written.
     * K becomes beta 2^Gk K and V beta V (rounded to T) in between. */
    constexpr int XV = CHUNK * CHUNK / 4 / NTH; /* float4 of X per thread */
    float4 xv[XV];
#pragma unroll
    for (int q = 0; q < XV; q++) {
        const int e = tid + q * NTH, r = e >> 4, c = (e & 15) * 4;
        if (!TF32 || (r >> 4) == (c >> 4)) /* in place */
            xv[q] = *reinterpret_cast<const float4 *>(&s.a[r][c]);
        else if ((c >> 4) < (r >> 4)) /* transposed (tf32) */
            xv[q] = make_float4(s.a[c][r], s.a[c + 1][r], s.a[c + 2][r], s.a[c + 3][r]);
        else /* above the diagonal blocks, where the tf32 inverse keeps X's transposed blocks */
            xv[q] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    {
        constexpr int VPR = KP / 8;
        for (int e = tid; e < CHUNK * VPR; e += NTH) {
            const int r = e / VPR, c = (e % VPR) * 8;
            uint4 val = *reinterpret_cast<const uint4 *>(&s.k[r][c]);
            T *x = reinterpret_cast<T *>(&val);
            const float f = s.fk[r];
#pragma unroll
            for (int q = 0; q < 8; q++)
                x[q] = Elem<T>::from_f(f * Elem<T>::to_f(x[q]));
            *reinterpret_cast<uint4 *>(&s.k[r][c]) = val;
        }
        const int vpr = p.VP >> 3;
        for (int e = tid; e < CHUNK * vpr; e += NTH) {
            const int r = e / vpr, c = (e - r * vpr) * 8;
            uint4 val = *reinterpret_cast<const uint4 *>(sv + r * ldv + c);
            T *x = reinterpret_cast<T *>(&val);
            const float f = s.beta[r];
#pragma unroll
            for (int q = 0; q < 8; q++)
                x[q] = Elem<T>::from_f(f * Elem<T>::to_f(x[q]));
            *reinterpret_cast<uint4 *>(sv + r * ldv + c) = val;
        }
    }
    __syncthreads(); /* X is read */
#pragma unroll
    for (int q = 0; q < XV; q++) {
        const int e = tid + q * NTH, r = e >> 4, c = (e & 15) * 4;
        *reinterpret_cast<uint2 *>(&ai[r][c]) =
            make_uint2(Elem<T>::pack(xv[q].x, xv[q].y), Elem<T>::pack(xv[q].z, xv[q].w));
    }
    __syncthreads();

    /* w = Ai (beta 2^Gk K), u = Ai (beta V), 64 columns at a time; Ai is lower triangular, so
     * only k-steps up to the warp's rows. */
    const int r0 = warp * 16;
    T *stage = &ai[0][0] + CHUNK * (CHUNK + PAD) + warp * WY_STAGE_ELEMS;
    const int nblk_w = KP / 64, nblk = nblk_w + p.VP / 64;
    for (int cb = 0; cb < nblk; cb++) {
        const bool is_w = cb < nblk_w;
        const T *rhs = is_w ? &s.k[0][0] : sv;
        const int ld = is_w ? KP + PAD : ldv;
        const int col0 = is_w ? cb * 64 : (cb - nblk_w) * 64;
        float acc[8][4];
        zero_tiles(acc);
        mma_rows_tri<T>(acc, &ai[0][0], CHUNK + PAD, r0, r0, rhs, ld, col0, lane);
        const int64_t ldg = is_w ? (int64_t)H * KP : (int64_t)H * p.VP;
        T *dst = is_w ? static_cast<T *>(p.w) + (row0 * H + hd) * KP + col0
                      : static_cast<T *>(p.u) + (row0 * H + hd) * p.VP + col0;
        /* rows r0 .. r0 + 15 through the warp's own staging tile, 32 columns at a time, then
         * 16-byte stores: lane l writes row l / 4 (and + 8), vector l % 4 */
#pragma unroll
        for (int half = 0; half < 2; half++) {
            stage_acc_tile<4>(stage, WY_STAGE_LD, acc, 4 * half, 1.0f, 0, 0, lane);
            __syncwarp();
#pragma unroll
            for (int hh = 0; hh < 2; hh++) {
                const int r = (lane >> 2) + hh * 8, c = (lane & 3) * 8;
                if (r0 + r < n)
                    *reinterpret_cast<uint4 *>(dst + (int64_t)(r0 + r) * ldg + half * WY_STAGE_COLS + c) =
                        *reinterpret_cast<const uint4 *>(stage + r * WY_STAGE_LD + c);
            }
            __syncwarp(); /* the tile is free for the next half */
        }
    }
}

} // namespace

#endif /* GDP_CHUNK_WY_CUH */
