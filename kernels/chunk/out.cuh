/*
 * out.cuh: stage 3 of the chunk op, chunk_out_kernel: outputs per (token chunk, head, 128 value
 * columns), o = scale (2^Gq (Q h) + sum_m ((Q K_m^T) . D) V_new,m) with the token-causal mask D
 * (gdp-math.md 3.6), which also zeroes the output rows past cu_seqlens[N] that no chunk owns
 * (ChunkParams.zero_tail); and zero_tail_kernel, which does only that, for the fused path and a
 * call without chunks.
 */
#ifndef GDP_CHUNK_OUT_CUH
#define GDP_CHUNK_OUT_CUH

#include <stddef.h>
#include <stdint.h>

#include "common.cuh"
#include "mma.cuh"
#include "tile.cuh"

namespace {

// CUDA kernels

constexpr int OW = 64;     /* value columns per warp in the output stage */
constexpr int OB = 2 * OW; /* value columns per output block */
template <typename T, int KP> struct OutLayout {
    static constexpr size_t q_bytes = sizeof(T) * CHUNK * (KP + PAD);
    static constexpr size_t h_bytes = sizeof(T) * KP * (OB + PAD);
    static constexpr size_t k_bytes = sizeof(T) * CHUNK * (KP + PAD);
    static constexpr size_t kv_bytes = k_bytes + sizeof(T) * CHUNK * (OB + PAD); /* K_m then V_new,m */
    /* region A holds h, then (after Q h) the K / V buffer of the odd copies; region B the even ones */
    static constexpr size_t a_bytes = h_bytes > kv_bytes ? h_bytes : kv_bytes;
    static constexpr size_t off_a = q_bytes, off_b = off_a + a_bytes, off_g = off_b + kv_bytes;
    /* the masked scores of the current copy in the A-fragment order of P V: per row group, per
     * 16-column k step, the four 32-bit words of each lane (2 x 16-bit each) */
    static constexpr size_t off_p = off_g + sizeof(float) * CHUNK;
    static constexpr int p_rg_words = 4 * 4 * 32; /* one row group's: 4 k steps x 4 words x 32 lanes */
    static constexpr size_t p_words = 4 * p_rg_words;
    static constexpr size_t total = off_p + sizeof(uint32_t) * p_words;
};

/* The masked scores P = (Q K_m^T) . D of a copy: row group rg (rows [16 rg, +16)) needs the n8
 * score tiles nt <= 2 rg + 1 (the mask is causal), 20 tiles in all, numbered row group by row
 * group (rg 0: tiles 0-1, rg 1: 2-5, rg 2: 6-11, rg 3: 12-19). Warp w forms tiles
 * [first, first + count) of them, chosen so that every warp does about the same tensor-core work:
 * a tile costs KP / 16 mma, a row group's P V 8 mma per 16-column step for each warp with value
 * columns, rg + 1 steps. Both column halves present: warp (rg, half) P V 8 (rg + 1), 4 - rg
 * tiles: 40 mma each (KP 128). One half (V <= 64): the four warps without columns take 4, 4, 3,
 * 3 tiles, the others 3, 2, 1, 0. */
__device__ __forceinline__ int out_score_tile_rg(int t) { return t < 2 ? 0 : t < 6 ? 1 : t < 12 ? 2 : 3; }
__device__ __forceinline__ void out_score_tiles(int warp, bool both_halves, int &first, int &count) {
    const int rg = warp & 3, vh = warp >> 2;
    if (both_halves) { /* warps 0-7: first 0, 4, 7, 9, 10, 14, 17, 19; count 4, 3, 2, 1 twice */
        first = 10 * vh + rg * (9 - rg) / 2;
        count = 4 - rg;
    } else if (vh == 0) { /* warps 0-3: first 0, 3, 5, 6; count 3, 2, 1, 0 */
        first = rg * (7 - rg) / 2;
        count = 3 - rg;
    } else { /* warps 4-7: first 6, 10, 14, 17; count 4, 4, 3, 3 */
        first = rg < 2 ? 6 + 4 * rg : 14 + 3 * (rg - 2);
        count = rg < 2 ? 4 : 3;
    }
}

/* Work split: one 256-thread block per (token chunk descriptor, head, 128 value columns); warp w
 * owns output rows [16 (w % 4), +16) and value columns [64 (w / 4), +64) of the block's slice.
 * Each copy's masked scores are formed once, each n8 tile by one warp (out_score_tiles: balanced
 * against the P V work, which grows with the row group), rounded to T and left in shared memory
 * in the A-fragment order of P V; after a block barrier each warp reads its row group's. Every
 * score has the sums it would have in the warp that uses it, so the bits are those of a warp
 * forming its own. The next copy's K_m and V_new,m tiles load while the current one is used
 * (two buffers, the first reusing h's space). */
template <typename T, int KP>
__global__ void __launch_bounds__(256, KP <= 128 ? 2 : 1) chunk_out_kernel(const ChunkParams p) {
    constexpr int NTH = 256;
    using L = OutLayout<T, KP>;
    constexpr int VPR = KP / 8;
    constexpr int NLK = CHUNK * VPR / NTH;       /* K vectors per thread and copy     */
    constexpr int NLV = CHUNK * (OB / 8) / NTH;  /* V_new vectors per thread and copy */
    extern __shared__ __align__(16) unsigned char smem_raw[];
    T *sq = reinterpret_cast<T *>(smem_raw);
    T *sh = reinterpret_cast<T *>(smem_raw + L::off_a);
    float *sg = reinterpret_cast<float *>(smem_raw + L::off_g);
    uint32_t *sp = reinterpret_cast<uint32_t *>(smem_raw + L::off_p);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t4 = lane & 3;
    const int rg = warp & 3, vh = warp >> 2;
    const int hd = blockIdx.y, H = p.H;
    const int zc = blockIdx.z * OB;           /* first value column of this block */
    const int cols_blk = min(OB, p.VP - zc);  /* 64 or 128 padded columns          */
    const bool has_cols = vh * OW < cols_blk; /* this warp's 64 columns exist      */
    if (p.zero_tail) {
        /* the output rows past cu_seqlens[N], which no chunk owns: block (x, hd, z) zeroes rows
         * end + x, end + x + gridDim.x, ... of head hd over its value columns (the grid covers
         * every head and column once), instead of a launch of its own */
        const int64_t end = p.N > 0 ? p.cu[p.N] : 0;
        const int vcols = min(OB, p.V - zc);
        for (int64_t t = end + blockIdx.x; t < p.T; t += gridDim.x) {
            uint16_t *row = static_cast<uint16_t *>(p.o) + (t * H + hd) * p.V + zc;
            for (int c = tid; c < vcols; c += NTH)
                row[c] = 0;
        }
    }
    const int i = p.cidx[2 * blockIdx.x], j = p.cidx[2 * blockIdx.x + 1];
    if (i < 0 || i >= p.N || j < 0)
        return;
    const int64_t bos = p.cu[i];
    const int64_t len = (int64_t)p.cu[i + 1] - bos;
    const int64_t start = (int64_t)j * CHUNK;
    if (start >= len)
        return; /* padding descriptor: inert */
    const int n = (int)min((int64_t)CHUNK, len - start);
    const int64_t t0 = bos + start;
    const int64_t hrow = (int64_t)p.coff[i] + j;
    if (hrow >= p.h_rows)
        return;

    const T *qsrc = static_cast<const T *>(p.q) + (t0 * H + hd) * p.K;
    if (p.q_vec)
        tile_async<T, NTH>(sq, KP + PAD, qsrc, (int64_t)H * p.K, n, KP, p.K, tid);
    else
        tile_scalar<T, NTH>(sq, KP + PAD, qsrc, (int64_t)H * p.K, n, KP, p.K, tid);
    {
        const T *hs = static_cast<const T *>(p.hs) + ((hrow * H + hd) * KP) * p.VP + zc;
        for (int e = tid; e < KP * (OB / 8); e += NTH) {
            const int r = e / (OB / 8), c = (e % (OB / 8)) * 8;
            const bool ok = c < cols_blk;
            cp_async16(sh + r * (OB + PAD) + c, ok ? hs + (int64_t)r * p.VP + c : hs, ok);
        }
    }
    if (tid < CHUNK)
        sg[tid] = tid < n ? p.gq[(t0 + tid) * H + hd] : 0.0f;

    /* this thread's copies of K_m / V_new,m rows (t0 + sigma) M + m: the same every copy but m */
    int64_t lk_glob[NLK], lv_glob[NLV];
    int lk_smem[NLK], lv_smem[NLV];
    bool lk_ok[NLK], lv_ok[NLV];
#pragma unroll
    for (int q = 0; q < NLK; q++) {
        const int e = tid + q * NTH, r = e / VPR, c = (e % VPR) * 8;
        lk_ok[q] = r < n;
        lk_smem[q] = r * (KP + PAD) + c;
        lk_glob[q] = (((t0 + (r < n ? r : 0)) * p.M) * H + hd) * KP + c;
    }
#pragma unroll
    for (int q = 0; q < NLV; q++) {
        const int e = tid + q * NTH, r = e / (OB / 8), c = (e % (OB / 8)) * 8;
        lv_ok[q] = r < n && c < cols_blk;
        lv_smem[q] = r * (OB + PAD) + c;
        lv_glob[q] = (((t0 + (r < n ? r : 0)) * p.M) * H + hd) * p.VP + zc + (c < cols_blk ? c : 0);
    }
    /* Starts the copies of copy m into the buffer at `buf` (K, then V_new) as one group. */
    auto issue = [&](int m, unsigned char *buf) {
        T *sk = reinterpret_cast<T *>(buf), *sv = reinterpret_cast<T *>(buf + L::k_bytes);
        const T *ksrc = static_cast<const T *>(p.kn) + (int64_t)m * H * KP;
        const T *vsrc = static_cast<const T *>(p.u) + (int64_t)m * H * p.VP;
#pragma unroll
        for (int q = 0; q < NLK; q++)
            cp_async16(sk + lk_smem[q], ksrc + lk_glob[q], lk_ok[q]);
#pragma unroll
        for (int q = 0; q < NLV; q++)
            cp_async16(sv + lv_smem[q], vsrc + lv_glob[q], lv_ok[q]);
        cp_async_commit();
    };
    unsigned char *buf_a = smem_raw + L::off_a, *buf_b = smem_raw + L::off_b;
    issue(0, buf_b); /* one group with q and h */
    cp_async_wait<0>();
    __syncthreads();
    if (p.l2norm) {
        l2norm_rows<T, KP, NTH / 32>(sq, KP + PAD, n, warp, lane);
        __syncthreads();
    }

    const int r0 = rg * 16, c0 = vh * OW;
    float acc[8][4];
    zero_tiles(acc);
    if (has_cols) /* Q h */
        mma_rows_kn<T, KP>(acc, sq, KP + PAD, r0, sh, OB + PAD, c0, lane);
    const float gq_lo = sg[r0 + g], gq_hi = sg[r0 + g + 8];
    int score_first, score_count;
    out_score_tiles(warp, cols_blk > OW, score_first, score_count);
    {
        const float f_lo = exp2f(gq_lo), f_hi = exp2f(gq_hi);
#pragma unroll
        for (int nt = 0; nt < 8; nt++) {
            acc[nt][0] *= f_lo;
            acc[nt][1] *= f_lo;
            acc[nt][2] *= f_hi;
            acc[nt][3] *= f_hi;
        }
    }
    __syncthreads(); /* h is no longer read: region A takes copy 1 */
    if (p.M > 1)
        issue(1, buf_a);
    else
        cp_async_commit();

    for (int m = 0; m < p.M; m++) {
        unsigned char *buf = (m & 1) ? buf_a : buf_b;
        const T *sk = reinterpret_cast<const T *>(buf), *sv = reinterpret_cast<const T *>(buf + L::k_bytes);
        if (m > 0) {
            cp_async_wait<1>(); /* copy m landed (the group after it may still be in flight) */
            __syncthreads();
        }
        /* this warp's score tiles (out_score_tiles): for tile (row group srg, n8 column tile nt),
         * the scores of rows [16 srg, +16) against token columns [8 nt, +8), then the
         * token-causal mask and decay ratio, rounded to T as P V's A operand, into srg's words of sp */
        for (int t = score_first; t < score_first + score_count; t++) {
            const int srg = out_score_tile_rg(t), nt = t - srg * (srg + 1), sr0 = srg * 16;
            float sc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
            for (int kk = 0; kk < KP; kk += 16) {
                uint32_t af[4], bf[2];
                frag_a(af, sq, KP + PAD, sr0, kk, lane);
                frag_b_nk_x1(bf, sk, KP + PAD, kk, nt * 8, lane);
                Elem<T>::mma(sc, af, bf[0], bf[1]);
            }
            const float s_lo = sg[sr0 + g], s_hi = sg[sr0 + g + 8];
            float pv[4];
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int tau = sr0 + g + (e >> 1) * 8, sig = nt * 8 + 2 * t4 + (e & 1);
                const float gt = (e >> 1) ? s_hi : s_lo;
                pv[e] = (sig <= tau && tau < n) ? sc[e] * exp2f(gt - sg[sig]) : 0.0f;
            }
            uint32_t *pw = sp + srg * L::p_rg_words + ((nt >> 1) * 4 + (nt & 1) * 2) * 32 + lane;
            pw[0] = Elem<T>::pack(pv[0], pv[1]);
            pw[32] = Elem<T>::pack(pv[2], pv[3]);
        }
        __syncthreads(); /* every score tile is in sp */
        if (has_cols) {
            const uint32_t *pw = sp + rg * L::p_rg_words + lane;
#pragma unroll
            for (int ks = 0; ks < 4; ks++) {
                if (ks <= rg) {
                    uint32_t pa[4];
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        pa[e] = pw[(ks * 4 + e) * 32];
#pragma unroll
                    for (int pp = 0; pp < 4; pp++) {
                        uint32_t bv[4];
                        frag_b_kn(bv, sv, OB + PAD, ks * 16, c0 + pp * 16, lane);
                        Elem<T>::mma(acc[2 * pp], pa, bv[0], bv[1]);
                        Elem<T>::mma(acc[2 * pp + 1], pa, bv[2], bv[3]);
                    }
                }
            }
        }
        __syncthreads(); /* every warp is done with this buffer and with sp */
        if (m + 2 < p.M)
            issue(m + 2, buf);
        else
            cp_async_commit();
    }
    cp_async_wait<0>();

    /* o = scale * acc, rows < n, columns < V: staged in region B (every warp is past its last
     * read of it, and no copy is in flight), then 16-byte stores; else element by element */
    if (p.o_vec) {
        T *so = reinterpret_cast<T *>(buf_b);
        if (has_cols)
            stage_acc_tile<8>(so, OB + PAD, acc, 0, p.scale, r0, c0, lane);
        __syncthreads();
        tile_store<T, NTH>(static_cast<T *>(p.o) + (t0 * H + hd) * p.V + zc, (int64_t)H * p.V, so, OB + PAD, n, OB,
                           min(OB, p.V - zc), tid);
    } else if (has_cols) {
        T *o = static_cast<T *>(p.o) + (t0 * H + hd) * p.V;
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int r = r0 + g + (e >> 1) * 8, c = zc + c0 + nt * 8 + 2 * t4 + (e & 1);
                if (r < n && c < p.V)
                    o[(int64_t)r * H * p.V + c] = Elem<T>::from_f(acc[nt][e] * p.scale);
            }
    }
}

/* Work split: a fixed grid strides over the token rows from cu_seqlens[N] on (padding tokens,
 * which no chunk owns) and zeroes their H * V elements; real rows are never touched. */
__global__ void __launch_bounds__(256) zero_tail_kernel(uint16_t *__restrict__ o, const int32_t *__restrict__ cu,
                                                        int n_seq, int64_t rows, int64_t row_elems) {
    const int64_t end = n_seq > 0 ? cu[n_seq] : 0;
    for (int64_t t = end + blockIdx.x; t < rows; t += gridDim.x)
        for (int64_t e = threadIdx.x; e < row_elems; e += blockDim.x)
            o[t * row_elems + e] = 0;
}

} // namespace

#endif /* GDP_CHUNK_OUT_CUH */
