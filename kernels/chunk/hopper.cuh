/*
 * hopper.cuh: the chunk op in one pass on Hopper's warpgroup MMA (hop_run, chunk_hopper_kernel; the
 * exact segment split's kernels over hop_run are in hopper_split.cuh)
 * (GDP_CHUNK_PATH=hopper; kernels/NOTES-chunk.md, "The one-pass Hopper kernel"). The math and the
 * rounding points are the fused kernel's (fused.cuh: X' = V - 2^Gk (K S16), v_new = Ai X', o =
 * scale (2^Gk[r_t] Q S16 + P v_new), S = 2^gl S + K^T (2^(gl - Gk) v_new)); what changes is who
 * multiplies: every product is a wgmma (m64n64k16 or m64n128k16, fp32 accumulation) with both
 * operands in shared memory in the 128-byte-swizzled panel layout of wgmma.cuh, and the fp32 state
 * lives in the state warpgroups' accumulators.
 *
 * One block of three warpgroups per (sequence, head), or per segment of a long sequence under the
 * split (hopper_split.cuh: outputs by correction), K = KP = 64 or 128, V = VP = 64 or 128:
 *   WG0 (aux), one chunk ahead: the chunk's loads (its threads' cp.async into the panel layout, the
 *     next chunk's issued as soon as its stage is free; or tensor-map copies, GDP_CHUNK_HOPPER_COPY,
 *     the first two chunks' by its thread 0 and every later one's by the state side as it releases
 *     the stage), A = K K^T on wgmma with Gk's warp scan beside it, the
 *     keys' norms from A's diagonal (1 / |k_r|, a row scale wherever K's products are used: the
 *     key tile stays as loaded), A's decay, scales and mask, (I + A)^-1 on four warps
 *     (wy_invert_ai_doubling_at: the fused kernel's diagonal blocks and tf32 products, in two
 *     levels) into Ai = T(X diag beta);
 *   WG1, WG2 (state): at K = 128 each holds 64 of the state's 128 rows x all VP columns as one m64nVP
 *     accumulator (at K = 64: all 64 rows x its own VP / 2 value columns, m64n(VP/2), so that its
 *     update needs only its own columns of v_new), writes its block of S16, then on its own VP / 2
 *     value columns X' (KP / 16 k steps) and beside it the masked decayed scores P on its 32 key
 *     columns (m64n32k16), v_new (4), Q S16 (KP / 16) while the warpgroups meet, and on its block of
 *     the state the update (4 k steps, K^T read M-major from the same key tile) beside P v_new (4).
 *     P was the aux warpgroup's in the first version, whose chunk then bounded the kernel (ncu: the
 *     state warpgroups spent most of their time at FULL); Q's norms went with it, as row scales
 *     (1 / |q_r|) of the outputs, half of each warp's rows a warpgroup while v_new runs (s.qn).
 * Barriers: FULL[b] (named, 384: aux arrives when stage b is ready, the state warpgroups wait, and
 * their S16 stores are complete), EMPTY[b] (mbarrier: the state threads are done with stage b, each
 * arriving after the closing barrier; the aux waits for it before its own stores into the stage, and
 * the copy engine's tiles are issued by a state thread after that barrier),
 * loaded[b] (mbarrier, the copy engine's: stage b's tiles have landed),
 * AUX (named, 128), one named barrier per state warpgroup for its own X' panel, and STATE (named,
 * 256) where the two state warpgroups exchange v_new's panels and end a chunk.
 * Every tile a wgmma reads and a thread wrote is fenced (fence.proxy.async) before the barrier
 * that publishes it. Deterministic: fixed-order sums, no atomics.
 * Scope (hopper_fits): 16-bit q, k, v with K and V each 64 or 128, 16-byte aligned rows; any other
 * shape runs the fused or staged kernels. Compiled for sm_90a only (kernels/chunk/hopper.cu).
 */
#ifndef GDP_CHUNK_HOPPER_CUH
#define GDP_CHUNK_HOPPER_CUH

#include <stdint.h>

#include "common.cuh"
#include "kernels/dtype_access.cuh"
#include "mma.cuh"
#include "tile.cuh"
#include "wgmma.cuh"
#include "wy_math.cuh"

/* Developer hook: kernels/dev/chunk_stages.cu (--hopper-phases) defines GDP_HOPPER_PHASES and its own
 * HopPhases, which adds up clock64 deltas per phase (the marks below name them) in registers of one
 * thread of each role and stores them at the end; the library's marks are empty. */
/* Developer hook: GDP_HOPPER_DEV_SKIP (a compile definition of the lab's bench_hopper_skip builds,
 * examples/bench_chunk.cmake) leaves out a role's math and keeps its loads and barriers, so that the
 * other role's chain and the loads can be timed alone: 1 the aux warpgroup's (A, the norms, the
 * inverse), 2 the state warpgroups' (every product, epilogue and store), 3 both; or one block of the
 * aux chain, to weigh what taking it off the aux warpgroup would buy: 4 the inverse's level 64, 8 its
 * level 32 (wy_invert_tf32_levels), 16 the exponents of A's values. Outputs are then wrong by design.
 * The library: 0, nothing left out. */
#ifndef GDP_HOPPER_DEV_SKIP
#define GDP_HOPPER_DEV_SKIP 0
#endif

#ifndef GDP_HOPPER_PHASES
namespace {
struct HopPhases {
    __device__ __forceinline__ void mark(int) {}
    __device__ __forceinline__ void flush(int) {}
};
} // namespace
#endif

namespace {

/* Keys KP = 64 or 128 columns, values VP = 64 or 128 (template parameters), the segment split's
 * kernels included (its maps F are KP x KP). */
constexpr int HOP_AUX_THREADS = 128, HOP_STATE_THREADS = 256;
constexpr int HOP_THREADS = HOP_AUX_THREADS + HOP_STATE_THREADS;
/* Registers a thread of each role holds after the split (setmaxnreg): the block starts at 168 each
 * (65,536 / 384, rounded down to 8); the aux warpgroup gives 48 a thread back and the two state
 * warpgroups take 24 a thread more, for their 64 fp32 state values, the products' accumulators and
 * the operand descriptors. */
constexpr int HOP_AUX_REGS = 120, HOP_STATE_REGS = 192;
/* setmaxnreg moves registers within the block's launch allocation (168 x 384 = 64,512, not the file's
 * 65,536): a split over it would leave the state warpgroups waiting in setmaxnreg.inc for ever */
constexpr int HOP_LAUNCH_REGS = 65536 / HOP_THREADS / 8 * 8;
static_assert(HOP_AUX_THREADS * HOP_AUX_REGS + HOP_STATE_THREADS * HOP_STATE_REGS <= HOP_THREADS * HOP_LAUNCH_REGS,
              "the block's registers");
/* named barriers (0 is __syncthreads) */
constexpr int HOP_BAR_FULL0 = 1, HOP_BAR_AUX = 3, HOP_BAR_STATE = 4, HOP_BAR_WG0 = 5;

/* One stage: the tiles of one chunk, 16-bit, each in the panel layout (1024-byte aligned). */
template <typename T, int KP, int VP> struct alignas(1024) HopperStage {
    T k[CHUNK * KP];     /* keys as loaded (their norms are the kinv scales)        */
    T q[CHUNK * KP];     /* queries of the tokens ending in the chunk, as loaded   */
    T v[CHUNK * VP];     /* V, turned into X' in place by the state warpgroups     */
    T ai[CHUNK * CHUNK]; /* T(X diag beta)                                          */
    T p[CHUNK * CHUNK];  /* masked decayed scores                                   */
    float gk[CHUNK];     /* g per row (copy 0 of a token), then Gk                  */
    float gam[CHUNK];    /* 2^Gk                                                    */
    float beta[CHUNK];
    float kinv[CHUNK];   /* 1 / |k_r| under the in-kernel norm (else 1): K stays raw */
};
template <typename T, int KP, int VP> struct alignas(1024) HopperSmem {
    HopperStage<T, KP, VP> st[2];
    T s16[KP * VP];           /* S16: the state entering the chunk, [k][v]  */
    T vn[CHUNK * VP];         /* v_new [row][v]                             */
    T vd[CHUNK * VP];         /* 2^(gl - Gk) v_new, the update's operand    */
    float a[CHUNK][CHUNK + 4]; /* A, then X = (I + A)^-1 (aux only)          */
    float qn[CHUNK];           /* the queries' scales 1 / |q_r| (state side)  */
    float scratch[4 * WY_INV2_SCRATCH]; /* the inverse's warp tiles (wy_invert_tf32_levels) */
    uint64_t empty[2];
    uint64_t loaded[2]; /* TMA copies: stage b's tiles have landed (one arrival and their bytes) */
};

/* The tensor maps of the copy-engine loads (HOP_COPY_TMA; hopper.cu encodes them): K as [T M][H KP],
 * V as [T M][H VP], Q as [T][H KP], 16-bit elements, boxes of 64 rows x 64 columns (one panel) landing
 * with the 128-byte swizzle, so a copy writes a panel of the layout above as it is. */
struct alignas(64) HopperMaps {
    unsigned char k[128], v[128], q[128]; /* CUtensorMap each */
};
/* What a run of chunks computes (hop_run): the op itself (MAIN: outputs, chunk states, the state at
 * the end; from a zero state, a segment's map G and its outputs' part o^G for the exact segment split,
 * kernels/NOTES-chunk.md, "Exact segments"), or a segment's map F: the run from I (a K x K state, VP =
 * 128) with the values taken as 0, whose end state is F and whose outputs O^F (K columns a token) are
 * the outputs' linear part in the segment's entering state S: o = o^G + O^F S. */
constexpr int HOP_MAIN = 0, HOP_MAP_F = 1;
/* Who moves a chunk's K, V and Q tiles: the aux threads by cp.async (16 bytes a copy, 24 a thread),
 * or thread 0 by six tensor-map copies of the copy engine (GDP_CHUNK_HOPPER_COPY=tma). */
constexpr int HOP_COPY_THREADS = 0, HOP_COPY_TMA = 1;

/* The rows of chunk c of a sequence of len tokens (fused.cuh's FusedChunk in 32-bit arithmetic:
 * hopper_fits asks T M < 2^31; the 64-bit divisions by M were 3 % of the kernel's instructions):
 * n expanded rows from local row lo, the nq tokens from tf whose last copy lies in them. */
struct HopChunk {
    int lo, n, tf, nq;
};
__device__ __forceinline__ HopChunk hop_chunk(int c, int len, int M) {
    HopChunk ch;
    ch.lo = c * CHUNK;
    ch.n = min(CHUNK, len * M - ch.lo);
    ch.tf = ch.lo / M;
    const int tl = min(len - 1, (ch.lo + ch.n - M) / M);
    ch.nq = tl - ch.tf + 1;
    return ch;
}
/* The chunk row of query qi's token's last copy, or -1 past the chunk's queries. */
__device__ __forceinline__ int hop_query_row(const HopChunk &ch, int qi, int M) {
    return qi < ch.nq ? (ch.tf + qi) * M + M - 1 - ch.lo : -1;
}

/* Element pointer of (r, c) in a panel-layout tile of `rows` rows. */
template <typename T> __device__ __forceinline__ T *hop_at(T *tile, int rows, int r, int c) {
    return reinterpret_cast<T *>(reinterpret_cast<unsigned char *>(tile) + wg_offset(rows, r, c));
}

/* 1 / |q_r| under the in-kernel norm for rows r0 + 8 pass .. r0 + 8 pass + 7 of a 64-row, KP-column
 * panel-layout tile, into qn[r] (shared memory): lane l sums the KP / 4 columns of part l / 8 of row
 * r0 + 8 pass + l % 8 (KP / 32 16-byte vectors: a quarter warp's lie in distinct banks under the swizzle),
 * the four parts meet by two shuffles, and lanes 0-7 store a row each. fp32 sums of the 16-bit values in
 * the order of the aux warpgroup's former pass: the same bits. */
template <typename T, int KP>
__device__ __forceinline__ void hop_query_scale_pass(const T *tile, int r0, int pass, int lane, float *qn) {
    const int c0 = (KP / 4) * (lane >> 3);
    const int r = r0 + 8 * pass + (lane & 7);
    float ss = 0.0f;
#pragma unroll
    for (int v = 0; v < KP / 32; v++) {
        const uint4 x = *reinterpret_cast<const uint4 *>(hop_at(const_cast<T *>(tile), CHUNK, r, c0 + 8 * v));
        const T *e = reinterpret_cast<const T *>(&x);
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const float f = Elem<T>::to_f(e[i]);
            ss += f * f;
        }
    }
    ss += __shfl_xor_sync(0xffffffffu, ss, 8);
    ss += __shfl_xor_sync(0xffffffffu, ss, 16);
    if (lane < 8)
        qn[r] = 1.0f / sqrtf(ss + (float)GDP_L2NORM_EPS);
}

/* Rows [0, 64) x COLS (64 or 128) columns of a row-major global matrix (row stride ld elements) into
 * a 64-row panel-layout tile by 16-byte cp.async; rows >= nrows become 0. */
template <typename T, int COLS>
__device__ __forceinline__ void hop_tile_async(T *dst, const T *__restrict__ src, int64_t ld, int nrows, int tid) {
    /* thread tid copies 16-byte chunk j = tid % CPR of rows tid / CPR + RP i: the swizzled chunk is
     * the same for every i (RP is a multiple of 8, so row % 8 does not change): one base and a step */
    constexpr int CPR = COLS / 8, RP = HOP_AUX_THREADS / CPR; /* chunks a row, rows a pass */
    const int r0 = tid / CPR, j = tid % CPR;
    unsigned char *d = reinterpret_cast<unsigned char *>(dst) + wg_offset(CHUNK, r0, 8 * j);
    const T *g = src + r0 * ld + 8 * j;
#pragma unroll
    for (int i = 0; i < CHUNK / RP; i++) {
        const bool ok = r0 + RP * i < nrows;
        cp_async16(d + RP * WG_ROW_BYTES * i, ok ? g + RP * i * ld : src, ok);
    }
}

/* g and beta of row t of chunk c (threads t < n; 0 past them) by plain loads into gr and be (beta's
 * bits: load_bits_any), which the aux stores into the stage when the chunk starts (hop_aux_chunk):
 * stored or converted here, each thread would wait out their global latency in the aux warpgroup's
 * critical path. */
__device__ __forceinline__ void hop_row_values(const ChunkParams &p, int c, int64_t bos, int64_t len, int hd, int t,
                                               float &gr, uint32_t &be) {
    const int M = p.M;
    const HopChunk ch = hop_chunk(c, (int)len, M);
    gr = 0.0f;
    be = 0u;
    if (t < ch.n) {
        const int lr = ch.lo + t;
        if (p.g_raw != nullptr && lr % M == 0)
            gr = p.g_raw[(bos + lr / M) * p.H + hd];
        be = load_bits_any(p.beta, p.beta_dtype, ((bos * M + ch.lo) + t) * p.H + hd);
    }
}

/* Chunk c's tiles into stage sb, by the 128 threads t of one warpgroup: K, V and Q by cp.async (one
 * group: the aux's) or by thread 0's tensor-map copies (counted on loaded[sb]), the chunk after it
 * into L2 (fused_aux_issue_loads' order and values). */
template <typename T, int KP, int VP, int COPY, int MODE>
__device__ __forceinline__ void hop_issue_tiles(const ChunkParams &p, const HopperMaps &maps, HopperSmem<T, KP, VP> &s,
                                                int sb, int c, int64_t bos, int64_t len, int hd, int c_end, int t) {
    constexpr bool WITH_V = MODE == HOP_MAIN; /* F: the values are 0 */
    HopperStage<T, KP, VP> &st = s.st[sb];
    const int H = p.H, M = p.M;
    const HopChunk ch = hop_chunk(c, (int)len, M);
    const int64_t rowc = bos * M + ch.lo;
    const int64_t ld = (int64_t)H * KP;
    if constexpr (COPY == HOP_COPY_TMA) {
        /* whole boxes land, rows past the chunk included (they hold the next sequence's rows or
         * padding): hop_aux_chunk zeroes K's and V's rows past n once landed; Q's rows past nq are
         * never used (masked scores, discarded outputs) */
        if (t == 0) {
            constexpr int COLS = 2 * KP + (WITH_V ? VP : 0);
            mbar_arrive_expect_tx(&s.loaded[sb], (uint32_t)(CHUNK * COLS * sizeof(T)));
            const int yk = (int)rowc, yq = (int)(bos + ch.tf);
            constexpr int PANEL = CHUNK * WG_PANEL_COLS; /* elements of a panel */
#pragma unroll
            for (int pn = 0; pn < KP / WG_PANEL_COLS; pn++) {
                tma_load_2d(st.k + pn * PANEL, maps.k, hd * KP + pn * WG_PANEL_COLS, yk, &s.loaded[sb]);
                tma_load_2d(st.q + pn * PANEL, maps.q, hd * KP + pn * WG_PANEL_COLS, yq, &s.loaded[sb]);
            }
            if constexpr (WITH_V)
#pragma unroll
                for (int pn = 0; pn < VP / WG_PANEL_COLS; pn++)
                    tma_load_2d(st.v + pn * PANEL, maps.v, hd * VP + pn * WG_PANEL_COLS, yk, &s.loaded[sb]);
        }
    } else {
        hop_tile_async<T, KP>(st.k, static_cast<const T *>(p.k) + (rowc * H + hd) * KP, ld, ch.n, t);
        if constexpr (WITH_V)
            hop_tile_async<T, VP>(st.v, static_cast<const T *>(p.v) + (rowc * H + hd) * VP, (int64_t)H * VP, ch.n, t);
        hop_tile_async<T, KP>(st.q, static_cast<const T *>(p.q) + ((bos + ch.tf) * H + hd) * KP, ld, ch.nq, t);
        cp_async_commit();
    }
    if (c + 1 < c_end) {
        const HopChunk nx = hop_chunk(c + 1, (int)len, M);
        const int64_t rown = bos * M + nx.lo;
        const int bytes = KP * (int)sizeof(T);
        if (t < nx.n) {
            prefetch_l2(static_cast<const T *>(p.k) + ((rown + t) * H + hd) * KP, bytes);
            if constexpr (WITH_V)
                prefetch_l2(static_cast<const T *>(p.v) + ((rown + t) * H + hd) * VP, VP * (int)sizeof(T));
        } else if (t >= 64 && t - 64 < nx.nq) {
            prefetch_l2(static_cast<const T *>(p.q) + ((bos + nx.tf + t - 64) * H + hd) * KP, bytes);
        }
    }
}

/* Chunk c's loads by the aux warpgroup: its tiles into stage sb and its rows' g and beta into gr, be. */
template <typename T, int KP, int VP, int COPY, int MODE>
__device__ __forceinline__ void hop_issue_loads(const ChunkParams &p, const HopperMaps &maps, HopperSmem<T, KP, VP> &s,
                                                int sb, int c, int64_t bos, int64_t len, int hd, int c_end,
                                                float &gr, uint32_t &be) {
    hop_row_values(p, c, bos, len, hd, (int)threadIdx.x, gr, be);
    hop_issue_tiles<T, KP, VP, COPY, MODE>(p, maps, s, sb, c, bos, len, hd, c_end, (int)threadIdx.x);
}

/* A's decay 2^x, 1 in the lab's build without A's exponents (GDP_HOPPER_DEV_SKIP 16). Called where the
 * exponent stood (a decay formed apart from its element's test lengthened the aux's live ranges: spills). */
__device__ __forceinline__ float hop_a_decay(float x) { return (GDP_HOPPER_DEV_SKIP & 16) != 0 ? 1.0f : exp2_ftz(x); }

/* The two diagonal entries a thread with t4 == g / 2 holds in A's m64n64 accumulator: rows
 * r = 16 warp + g + 8 hh at column r sit at j = 2 warp + hh, e = 2 hh + g % 2 (acc[4 j + e]). The warp
 * is a run-time value, so each case names its accumulators as constants: an index of them by a
 * run-time value would put them in local memory. */
__device__ __forceinline__ void hop_acc_diag(const float (&acc)[32], int warp, int odd, float &d0, float &d1) {
    switch (warp) {
    case 0: d0 = odd ? acc[1] : acc[0], d1 = odd ? acc[7] : acc[6]; break;
    case 1: d0 = odd ? acc[9] : acc[8], d1 = odd ? acc[15] : acc[14]; break;
    case 2: d0 = odd ? acc[17] : acc[16], d1 = odd ? acc[23] : acc[22]; break;
    default: d0 = odd ? acc[25] : acc[24], d1 = odd ? acc[31] : acc[30]; break;
    }
}

/* ---- the aux warpgroup: stage b for chunk c ---- */
/* lc: the chunk's index in the run (stage b = lc % 2, the parities), count: the run's chunks, c_end:
 * its end (the run is chunks [c_end - count, c_end) of the sequence). */
template <typename T, int KP, int VP, int COPY, int MODE>
__device__ __forceinline__ void hop_aux_chunk(const ChunkParams &p, const HopperMaps &maps, HopperSmem<T, KP, VP> &s,
                                              int b, int c, int lc, int count, int c_end, int64_t bos, int64_t len,
                                              int hd, float &pend_g, uint32_t &pend_b, HopPhases &ph) {
    HopperStage<T, KP, VP> &st = s.st[b];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t4 = lane & 3;
    const int n = hop_chunk(c, (int)len, p.M).n;
    /* this chunk's g and beta, loaded a chunk ahead, into the stage (the barrier after the tiles' wait
     * publishes them): the threads' copies' at once, since the aux issued them itself once the stage was
     * released; the copy engine's only after the tiles' wait, since the aux may start chunk c while the
     * state side still reads stage b for chunk c - 2 (the state side issues the tiles once it has
     * released the stage, and nothing else holds the aux back) */
    const auto store_rows = [&] {
        if (tid < CHUNK) {
            st.gk[tid] = pend_g;
            st.beta[tid] = bits_to_float(pend_b, p.beta_dtype);
        }
    };
    if constexpr (COPY != HOP_COPY_TMA)
        store_rows();
    /* chunk c + 1's loads into the other stage once it is released. The copy engine's are issued by the
     * state side as it releases the stage (release_stage in hop_run): the aux loads only chunk c + 1's g
     * and beta, below, for its next start. The threads' copies are the aux's own, at its test points
     * (NextChunkLoads, mma.cuh; fused.cuh's points). */
    NextChunkLoads next(&s.empty[b ^ 1], lc, COPY == HOP_COPY_TMA ? 0 : count);
    auto issue_next_if_free = [&](bool block) {
        next.try_issue(block, [&] {
            hop_issue_loads<T, KP, VP, COPY, MODE>(p, maps, s, b ^ 1, c + 1, bos, len, hd, c_end, pend_g, pend_b);
        });
    };
    /* the copy engine's path: chunk c + 1's g and beta for the next start (its tiles are the state side's) */
    const auto load_next_rows = [&] {
        if (COPY == HOP_COPY_TMA && c + 1 < c_end)
            hop_row_values(p, c + 1, bos, len, hd, tid, pend_g, pend_b);
    };

    if constexpr (COPY == HOP_COPY_TMA) {
        mbar_wait(&s.loaded[b], (lc >> 1) & 1); /* stage b's (lc / 2)-th fill */
        constexpr int RC = (KP > VP ? KP : VP) / 8; /* 16-byte chunks a row of the wider tile */
        if (n < CHUNK) /* the rows past the sequence's end: zeros, as cp.async's fill writes them */
            for (int e = tid; e < (CHUNK - n) * RC; e += HOP_AUX_THREADS) {
                const int r = n + (int)((unsigned)e / RC), cc = (int)((unsigned)e % RC) * 8; /* e >= 0: shifts */
                if (cc < KP)
                    *reinterpret_cast<uint4 *>(hop_at(st.k, CHUNK, r, cc)) = make_uint4(0u, 0u, 0u, 0u);
                if (MODE != HOP_MAP_F && cc < VP)
                    *reinterpret_cast<uint4 *>(hop_at(st.v, CHUNK, r, cc)) = make_uint4(0u, 0u, 0u, 0u);
            }
    } else {
        cp_async_wait<0>();
    }
    if constexpr (COPY == HOP_COPY_TMA) {
        /* EMPTY[b]: every state thread's own reads of chunk c - 2 are done (each arrives after the closing
         * barrier). Complete by now (the tiles went out after it): a wait that costs a test, which makes the
         * order of these generic stores after those reads each reader's own release, not one issuing thread's
         * release after a named barrier (the same order in PTX's model; compute-sanitizer racecheck follows
         * only the former: 32 hazards reported on K = 64 without it, fifty-first session) */
        if (lc >= 2)
            mbar_wait(&s.empty[b], ((lc >> 1) - 1) & 1);
        store_rows();
    }
    fence_proxy_async_smem(); /* the landed (or zeroed) tiles may be read by wgmma */
    bar_sync(HOP_BAR_AUX, HOP_AUX_THREADS);
    ph.mark(0); /* aux 0: waiting for the chunk's loads */
    if constexpr ((GDP_HOPPER_DEV_SKIP & 1) != 0) { /* the lab's aux-less build: the loads only */
        load_next_rows();
        issue_next_if_free(true);
        return;
    }

    /* A's products on the raw keys: the in-kernel norm is a row scale, 1 / |k_r|, applied where K's
     * products are used (A's values here; X', the scores and the update's operand on the state side)
     * instead of a pass that rewrites the key tile, and |k_r|^2 is A's own diagonal (fp32 sums of
     * the exact products of the 16-bit values; the reference rounds normalized keys nowhere either). */
    float acc[32];
    const auto keys = [&](int ks) { return wg_desc_kmajor(st.k, CHUNK, 0, ks * 16); };
    wg_gemm<CHUNK, 0, 0, T, KP / 16, true>(acc, keys, keys);
    /* Gk beside it: a warp scan over the 64 rows, base 2 (fused.cuh's) */
    if (warp == 0)
        chunk_gk_scan(st.gk, st.gam, lane);
    wg_wait<0>();
    /* |k_r|^2, row r's diagonal, is held by one thread of the warp that owns row r: it parks the value
     * in kinv (no root), and one lane a row then takes the root. Under the test of every element ptxas
     * evaluated the root 32 times a thread, predicated (3 % of the stall samples, twenty-second
     * session); a select of the two values by a run-time index put the accumulators in local memory; a
     * test of all 32 elements a thread cost the aux chain 64 instructions a chunk: hop_acc_diag names
     * the two, a constant index in each of its cases. */
    if (t4 == (g >> 1)) { /* row r = 16 warp + g + 8 hh's diagonal: j = 2 warp + hh, e = 2 hh + g % 2 */
        float d0, d1;
        hop_acc_diag(acc, warp, g & 1, d0, d1);
        st.kinv[16 * warp + g] = d0;
        st.kinv[16 * warp + g + 8] = d1;
    }
    __syncwarp();
    if (lane < 16) {
        const int r = 16 * warp + lane;
        st.kinv[r] = p.l2norm ? 1.0f / sqrtf(st.kinv[r] + (float)GDP_L2NORM_EPS) : 1.0f;
    }
    bar_sync(HOP_BAR_AUX, HOP_AUX_THREADS); /* Gk, 2^Gk and the key scales complete */
    ph.mark(1); /* aux 1: A's products, Gk and the key scales */

    /* A[r][c] = beta_r 2^(Gk_r - Gk_c) <k_r, k_c> / (|k_r| |k_c|) for c < r < n, else 0 (wy_build_a's
     * values). The per-row and per-column factors are read into registers first: read inside the
     * loop, each is read again after every store to s.a (the compiler cannot tell the arrays apart),
     * a shared-memory latency an element on the aux warpgroup's critical path (the ncu card of the
     * twenty-second session: this loop held 6 % of the kernel's stall samples). */
    float gk_c[16], kinv_c[16], gk_r[2], fac_r[2];
#pragma unroll
    for (int j = 0; j < 8; j++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
            gk_c[2 * j + e] = st.gk[8 * j + 2 * t4 + e];
            kinv_c[2 * j + e] = st.kinv[8 * j + 2 * t4 + e];
        }
#pragma unroll
    for (int hh = 0; hh < 2; hh++) {
        const int r = 16 * warp + g + hh * 8;
        gk_r[hh] = st.gk[r];
        fac_r[hh] = st.beta[r] * st.kinv[r];
    }
#pragma unroll
    for (int j = 0; j < 8; j++)
#pragma unroll
        for (int hh = 0; hh < 2; hh++) { /* the column pair (cc, cc + 1) of row r, one 8-byte store */
            const int r = 16 * warp + g + hh * 8, cc = 8 * j + 2 * t4;
            float val[2];
#pragma unroll
            for (int x = 0; x < 2; x++) {
                const int ci = 2 * j + x;
                val[x] = cc + x < r && r < n
                             ? acc[4 * j + 2 * hh + x] * hop_a_decay(gk_r[hh] - gk_c[ci]) * fac_r[hh] * kinv_c[ci]
                             : 0.0f;
            }
            *reinterpret_cast<float2 *>(&s.a[r][cc]) = make_float2(val[0], val[1]);
        }
    __syncwarp(); /* the warp's rows of A, which hold its diagonal block */
    /* the next chunk's g and beta here, where A's accumulators are dead and the inverse's length hides
     * their latency (loaded at the chunk's start, they were live through A's values: K = 128, V = 64's F
     * run spilled 272 bytes) */
    load_next_rows();
    ph.mark(2); /* aux 2: A's values */

    /* Ai = T((I + A)^-1 diag beta) by recursive doubling (wy_invert_ai_doubling_at): each warp inverts
     * the diagonal block in its own rows of A at once, then, after the one barrier that completes A and
     * those blocks (where the block barrier after A was), the two levels' tf32 products, the four warps
     * evenly loaded */
    T *ai = st.ai;
    wy_invert_ai_doubling_at<T>(
        s.a, [=](int r, int cc) { return hop_at(ai, CHUNK, r, cc); }, st.beta, s.scratch + warp * WY_INV2_SCRATCH,
        tid,
        [&] {
            bar_sync(HOP_BAR_AUX, HOP_AUX_THREADS); /* A and X's diagonal blocks complete */
            ph.mark(3); /* aux 3: the diagonal blocks */
            issue_next_if_free(false);
        },
        [] { bar_sync(HOP_BAR_AUX, HOP_AUX_THREADS); });
    ph.mark(4); /* aux 4: the inverse and Ai */
    fence_proxy_async_smem(); /* Ai is read by the state warpgroups' wgmma */
    issue_next_if_free(false);
    ph.mark(5); /* aux 5: testing (and maybe issuing) the next chunk's loads */
    issue_next_if_free(true);
    ph.mark(6); /* aux 6: waiting to start the next chunk's loads */
}

/* The state's accumulator (m64nVP: rows 16 wi + g + {0, 8} of the warpgroup's 64, column pairs
 * 8 j + 2 t4) seen as store_state_tile's fragments S[j][e]. */
template <int NA> __device__ __forceinline__ float (&hop_frags(float (&S)[NA]))[NA / 4][4] {
    return *reinterpret_cast<float(*)[NA / 4][4]>(&S[0]);
}

/* Where a run's state comes from: element (r, c) at src + base + r * VP + c in dtype (the initial
 * state, or a segment's entering state in the workspace), or, with src NULL, zeros (the identity in
 * mode F). */
struct HopStateSrc {
    const void *src;
    int dtype;
    int64_t base;
};

/* Chunks [cb, ce) of sequence i (its rows from bos, len tokens), head hd, by one block: the loop of
 * both roles, from the state init to the state end (StateDest: dst NULL stores nothing), the outputs
 * of the tokens whose last copy lies in those chunks into [T][H][VP] in T: the op's o (HOP_MAIN, which
 * also writes the chunk states of its chunks) or f_out, the split's O^F (HOP_MAP_F: from I with the
 * values taken as 0, above; MAIN passes NULL: o read from p at its use, as before the split had F
 * outputs, keeps the op's own kernel as it was). Every thread of the block calls it (it starts with a
 * block barrier). */
template <typename T, int KP, int VP, int COPY, int MODE>
__device__ __forceinline__ void hop_run(const ChunkParams &p, const HopperMaps &maps, unsigned char *smem_raw, int i,
                                        int hd, int cb, int ce, const HopStateSrc init, const StateDest end, T *f_out) {
    static_assert(KP == 64 || KP == 128, "keys of 64 or 128 columns");
    static_assert(MODE != HOP_MAP_F || VP == KP, "a transfer map F is K x K");
    /* 1024-byte aligned panels: the swizzle is a function of the address bits */
    const uint32_t pad = (1024u - (smem_u32(smem_raw) & 1023u)) & 1023u;
    HopperSmem<T, KP, VP> &s = *reinterpret_cast<HopperSmem<T, KP, VP> *>(smem_raw + pad);
    const int H = p.H, M = p.M;
    const int64_t bos = p.cu[i];
    const int64_t len = (int64_t)p.cu[i + 1] - bos;
    const int count = ce - cb; /* the run's chunks */

    if (threadIdx.x == 0) {
        mbar_init(&s.empty[0], HOP_STATE_THREADS);
        mbar_init(&s.empty[1], HOP_STATE_THREADS);
        mbar_init(&s.loaded[0], 1);
        mbar_init(&s.loaded[1], 1);
        fence_mbar_init();
    }
    __syncthreads();
    /* the warpgroup's index through a shuffle, so that the compiler sees a warp-uniform role (a role
     * branch it takes for divergent makes ptxas serialize every wgmma: warning C7520) */
    const int wgi = __shfl_sync(0xffffffffu, (int)threadIdx.x / 128, 0);
    HopPhases ph;
    if (wgi == 0) {
        setmaxnreg_dec<HOP_AUX_REGS>();
        /* Ai's zeros right of its diagonal blocks, once for both stages: no chunk writes there (the
         * inverse leaves them to this, wy_invert_ai_doubling_at); the fence before each FULL
         * arrival publishes them to the state warpgroups' wgmma */
#pragma unroll
        for (int sb = 0; sb < 2; sb++) {
            T *ai = s.st[sb].ai;
            const auto at = [=](int r, int cc) { return hop_at(ai, CHUNK, r, cc); };
            AiStores<T, decltype(at)>{at, nullptr}.zero_upper_by((int)threadIdx.x, HOP_AUX_THREADS);
        }
        float pend_g = 0.0f; /* the next chunk's g and beta (its bits) of the thread's row */
        uint32_t pend_b = 0u;
        if (count > 0)
            hop_issue_loads<T, KP, VP, COPY, MODE>(p, maps, s, 0, cb, bos, len, hd, ce, pend_g, pend_b);
        /* the copy engine's second fill too: both stages are free (the later ones are the state side's) */
        if (COPY == HOP_COPY_TMA && count > 1)
            hop_issue_tiles<T, KP, VP, COPY, MODE>(p, maps, s, 1, cb + 1, bos, len, hd, ce, (int)threadIdx.x);
        for (int lc = 0; lc < count; lc++) {
            const int b = lc & 1;
            hop_aux_chunk<T, KP, VP, COPY, MODE>(p, maps, s, b, cb + lc, lc, count, ce, bos, len, hd, pend_g, pend_b,
                                                 ph);
            bar_arrive(HOP_BAR_FULL0 + b, HOP_THREADS);
            ph.mark(7); /* aux 7: the arrival and the loop */
        }
        ph.flush(0);
        return;
    }

    setmaxnreg_inc<HOP_STATE_REGS>();
    const int tid = threadIdx.x - HOP_AUX_THREADS, lane = tid & 31, wg = wgi - 1, wi = (tid >> 5) & 3;
    const int g = lane >> 2, t4 = lane & 3;
    const int64_t coff = p.coff[i];
    constexpr int CW = VP / 2, NJ = CW / 8; /* the warpgroup's value columns for X', v_new and o, n8 tiles */
    const int c0 = CW * wg;                 /* the first of those columns                                  */
    const int r0 = 16 * wi;                 /* the warp's chunk rows in those products                     */
    /* The warpgroup's block of the state: at K = 128, key rows 64 wg .. 64 wg + 63 x all VP columns; at
     * K = 64 (one m64 row block) all 64 key rows x its own CW value columns, those of X', v_new and o,
     * so that its update reads only its own columns of v_new. One m64nSW accumulator either way. */
    constexpr bool ROW_HALVES = KP == 128;
    constexpr int SW = ROW_HALVES ? VP : CW; /* the block's value columns                                  */
    constexpr int NS = SW / 2;               /* state accumulators a thread                                 */
    const int kr0 = ROW_HALVES ? 64 * wg : 0; /* the block's first key row                                  */
    const int sc0 = ROW_HALVES ? 0 : c0;      /* the block's first value column                             */
    const int sr0 = kr0 + 16 * wi;            /* the thread's state rows sr0 + g + {0, 8}                    */

    float S[NS];
#pragma unroll
    for (int j = 0; j < SW / 8; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int r = sr0 + g + (e >> 1) * 8, cc = sc0 + 8 * j + 2 * t4 + (e & 1);
            if constexpr (MODE == HOP_MAP_F)
                S[4 * j + e] = r == cc ? 1.0f : 0.0f;
            else
                S[4 * j + e] = init.src != nullptr ? load_any(init.src, init.dtype, init.base + (int64_t)r * VP + cc) : 0.0f;
        }

    /* Stage b, read to the end for chunk c (the closing barrier): chunk c + 2's tiles go into it at once, by
     * the first state warpgroup (thread 0 the copy engine's, the L2 prefetch of chunk c + 3 spread), so that
     * they are in flight from the moment the stage is free, and neither the aux's test for the release nor
     * the copies' issue sits in the aux warpgroup's chain; the threads' copies are the aux's (EMPTY). */
    const auto release_stage = [&](int b, int c) {
        if (c + 2 >= ce)
            return;
        mbar_arrive(&s.empty[b]); /* the aux's stores into stage b (g, beta; the threads' copies) wait for it */
        if constexpr (COPY == HOP_COPY_TMA) {
            if (wg == 0)
                hop_issue_tiles<T, KP, VP, COPY, MODE>(p, maps, s, b, c + 2, bos, len, hd, ce, tid);
        }
    };
    for (int lc = 0; lc < count; lc++) {
        const int c = cb + lc, b = lc & 1;
        if constexpr ((GDP_HOPPER_DEV_SKIP & 2) != 0) { /* the lab's state-less build: its barriers only */
            bar_sync(HOP_BAR_FULL0 + b, HOP_THREADS);
            bar_sync(HOP_BAR_WG0 + wg, 128);
            bar_sync(HOP_BAR_STATE, HOP_STATE_THREADS);
            bar_sync(HOP_BAR_STATE, HOP_STATE_THREADS);
            release_stage(b, c);
            continue;
        }
        HopperStage<T, KP, VP> &st = s.st[b];
        const HopChunk ch = hop_chunk(c, (int)len, M);
        const int n = ch.n, nq = ch.nq;
        /* S16 (this warpgroup's block), and the fp32 state entering token chunk c / M */
#pragma unroll
        for (int j = 0; j < SW / 8; j++)
#pragma unroll
            for (int hh = 0; hh < 2; hh++)
                *reinterpret_cast<uint32_t *>(hop_at(s.s16, KP, sr0 + g + hh * 8, sc0 + 8 * j + 2 * t4)) =
                    Elem<T>::pack(S[4 * j + 2 * hh], S[4 * j + 2 * hh + 1]);
        fence_proxy_async_smem();
        if (MODE == HOP_MAIN && c % M == 0 && p.chunk_states != nullptr) {
            const int64_t hrow = coff + c / M;
            if (hrow < p.cs_rows)
                store_state_tile(p.chunk_states, p.cs_dtype, hop_frags(S), sr0, sc0, KP, VP, lane,
                                 [&](int r, int cc) { return ((hrow * H + hd) * KP + r) * VP + cc; });
        }
        ph.mark(7); /* state 7: S16, the chunk states and the loop */
        bar_sync(HOP_BAR_FULL0 + b, HOP_THREADS); /* stage b holds chunk c; both blocks of S16 are in */
        ph.mark(0); /* state 0: waiting for the aux warpgroup (FULL) */

        /* X' = V - 2^Gk (K S16) on the warpgroup's CW columns, in place over V */
        /* the operands by k step: keys, queries and Ai K-major; S16's, X''s and v_new's own columns N-major */
        const auto keys = [&](int ks) { return wg_desc_kmajor(st.k, CHUNK, 0, ks * 16); };
        const auto queries = [&](int ks) { return wg_desc_kmajor(st.q, CHUNK, 0, ks * 16); };
        const auto s16_cols = [&](int ks) { return wg_desc_mnmajor(s.s16, KP, ks * 16, c0); };
        float acc[CW / 2];
        wg_gemm<CW, 0, 1, T, KP / 16, true>(acc, keys, s16_cols);
        /* beside it the scores P = masked decayed Q K^T on this warpgroup's 32 key columns
         * (the aux warpgroup's work at first, which bounded the chunk: kernels/NOTES-chunk.md,
         * twenty-first session) */
        float sc[16];
        wg_gemm<32, 0, 0, T, KP / 16, true>(sc, queries,
                                                 [&](int ks) { return wg_desc_kmajor(st.k, CHUNK, 32 * wg, ks * 16); });
        wg_wait<1>(); /* X' */
        ph.mark(1); /* state 1: K S16 (the scores' products issued beside it) */
        /* X' in place over V; a transfer map F takes the values as 0 */
#pragma unroll
        for (int hh = 0; hh < 2; hh++) {
            const int r = r0 + g + hh * 8;
            const float f = st.gam[r] * st.kinv[r]; /* K S16's row r, of the raw keys */
#pragma unroll
            for (int j = 0; j < NJ; j++) {
                T *vp = hop_at(st.v, CHUNK, r, c0 + 8 * j + 2 * t4);
                float v0 = 0.0f, v1 = 0.0f; /* the pair by one 32-bit load */
                if (MODE != HOP_MAP_F)
                    Elem<T>::unpack(*reinterpret_cast<const uint32_t *>(vp), v0, v1);
                *reinterpret_cast<uint32_t *>(vp) =
                    Elem<T>::pack(v0 - f * acc[4 * j + 2 * hh], v1 - f * acc[4 * j + 2 * hh + 1]);
            }
        }
        /* the scores' column factors (Gk and the raw keys' scales) into registers before any store to P
         * (read in the loop, each would be read again after every store: see A's values) */
        float gk_c[8], kinv_c[8];
#pragma unroll
        for (int x = 0; x < 8; x++) {
            const int cc = 32 * wg + 8 * (x >> 1) + 2 * t4 + (x & 1);
            gk_c[x] = st.gk[cc];
            kinv_c[x] = st.kinv[cc];
        }
        wg_wait<0>(); /* the scores */
#pragma unroll
        for (int hh = 0; hh < 2; hh++) {
            const int qi = r0 + g + hh * 8;
            const int row = hop_query_row(ch, qi, M);
            const float gt = row >= 0 ? st.gk[row] : 0.0f;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const int cc = 32 * wg + 8 * j + 2 * t4;
                const float p0 = cc <= row ? sc[4 * j + 2 * hh] * exp2_ftz(gt - gk_c[2 * j]) * kinv_c[2 * j] : 0.0f;
                const float p1 =
                    cc + 1 <= row ? sc[4 * j + 2 * hh + 1] * exp2_ftz(gt - gk_c[2 * j + 1]) * kinv_c[2 * j + 1] : 0.0f;
                *reinterpret_cast<uint32_t *>(hop_at(st.p, CHUNK, qi, cc)) = Elem<T>::pack(p0, p1);
            }
        }
        fence_proxy_async_smem(); /* X' (read next by this warpgroup) and P (by both, after the v_new barrier) */
        bar_sync(HOP_BAR_WG0 + wg, 128); /* the warpgroup's X' panel complete */
        ph.mark(2); /* state 2: X' stored, the scores masked and stored, the warpgroup's barrier */

        /* v_new = Ai X' on the warpgroup's columns; its decayed copy for the update */
        const float gl = st.gk[n - 1];
        wg_gemm<CW, 0, 1, T, CHUNK / 16, true>(acc, [&](int ks) { return wg_desc_kmajor(st.ai, CHUNK, 0, ks * 16); },
                                                [&](int ks) { return wg_desc_mnmajor(st.v, CHUNK, ks * 16, c0); });
        /* while v_new runs, the queries' scales (1 / |q_r| under the in-kernel norm; the query tile stays as
         * loaded): each state warpgroup forms half of its warps' rows (hop_query_scale_pass, pass wg) into
         * s.qn, which the barrier after v_new publishes. They scale the outputs at the end, not the scores:
         * o = scale (2^Gk Q S16 + P v_new) has the row's scale as a factor of both terms, so the scores
         * and the outputs' first term go without it (kernels/NOTES-chunk.md, forty-ninth session) */
        if (p.l2norm)
            hop_query_scale_pass<T, KP>(st.q, r0, wg, lane, s.qn);
        wg_wait<0>();
#pragma unroll
        for (int hh = 0; hh < 2; hh++) {
            const int r = r0 + g + hh * 8;
            const float f = r < n ? exp2_ftz(gl - st.gk[r]) * st.kinv[r] : 0.0f; /* the update's K^T is of the raw keys */
#pragma unroll
            for (int j = 0; j < NJ; j++) {
                const int cc = c0 + 8 * j + 2 * t4;
                const float v0 = acc[4 * j + 2 * hh], v1 = acc[4 * j + 2 * hh + 1];
                *reinterpret_cast<uint32_t *>(hop_at(s.vn, CHUNK, r, cc)) = Elem<T>::pack(v0, v1);
                *reinterpret_cast<uint32_t *>(hop_at(s.vd, CHUNK, r, cc)) = Elem<T>::pack(v0 * f, v1 * f);
            }
        }
        fence_proxy_async_smem();
        /* the outputs' first term Q S16 into v_new's registers, now free, while the warpgroups meet
         * (it was issued after the barrier, alone: the update now runs beside it and beside P v_new) */
        wg_gemm<CW, 0, 1, T, KP / 16, true>(acc, queries, s16_cols);
        bar_sync(HOP_BAR_STATE, HOP_STATE_THREADS); /* v_new and its decayed copy complete (both halves) */
        ph.mark(3); /* state 3: v_new */

        /* S = 2^gl S + K^T (decayed v_new) on the warpgroup's block of the state, beside the outputs */
        const float dec = exp2f(gl);
#pragma unroll
        for (int x = 0; x < NS; x++)
            S[x] *= dec;
        wg_gemm<SW, 1, 1, T, CHUNK / 16, false>(
            S, [&](int ks) { return wg_desc_mnmajor(st.k, CHUNK, ks * 16, kr0); },
            [&](int ks) { return wg_desc_mnmajor(s.vd, CHUNK, ks * 16, sc0); });
        /* o = scale (2^Gk[r_t] Q S16 + P v_new) on the warpgroup's columns (also when no query ends in
         * the chunk, nq = 0: a wgmma under a branch makes ptxas serialize them all, warning C7520) */
        wg_wait<1>(); /* Q S16; the update may still run */
        const int ra = hop_query_row(ch, r0 + g, M), rb = hop_query_row(ch, r0 + g + 8, M);
        const float fa = ra >= 0 ? st.gam[ra] : 0.0f, fb = rb >= 0 ? st.gam[rb] : 0.0f;
#pragma unroll
        for (int j = 0; j < NJ; j++) {
            acc[4 * j] *= fa;
            acc[4 * j + 1] *= fa;
            acc[4 * j + 2] *= fb;
            acc[4 * j + 3] *= fb;
        }
        wg_gemm<CW, 0, 1, T, CHUNK / 16, false>(
            acc, [&](int ks) { return wg_desc_kmajor(st.p, CHUNK, 0, ks * 16); },
            [&](int ks) { return wg_desc_mnmajor(s.vn, CHUNK, ks * 16, c0); });
        /* the outputs' row scales: p.scale and the query's 1 / |q_r| (s.qn, above) */
        float os[2] = {p.scale, p.scale};
        if (p.l2norm) {
            os[0] = p.scale * s.qn[r0 + g];
            os[1] = p.scale * s.qn[r0 + g + 8];
        }
        wg_wait<0>(); /* P v_new and the update */
        ph.mark(6); /* state 6: the update and the outputs' products, to their wait */
        T *o = (MODE == HOP_MAP_F ? f_out : static_cast<T *>(p.o)) + ((bos + ch.tf) * H + hd) * VP;
#pragma unroll
        for (int hh = 0; hh < 2; hh++) {
            const int qi = r0 + g + hh * 8;
            if (qi < nq)
#pragma unroll
                for (int j = 0; j < NJ; j++)
                    *reinterpret_cast<uint32_t *>(o + (int64_t)qi * H * VP + c0 + 8 * j + 2 * t4) =
                        Elem<T>::pack(acc[4 * j + 2 * hh] * os[hh], acc[4 * j + 2 * hh + 1] * os[hh]);
        }
        ph.mark(4); /* state 4: the outputs' stores */
        /* every read of stage b, S16, v_new and its decayed copy is done */
        bar_sync(HOP_BAR_STATE, HOP_STATE_THREADS);
        ph.mark(5); /* state 5: the closing barrier */
        release_stage(b, c);
    }

    ph.flush(1);
    if (end.dst != nullptr)
        store_state_tile(end.dst, end.dtype, hop_frags(S), sr0, sc0, KP, VP, lane,
                         [&](int r, int cc) { return end.base + (int64_t)r * VP + cc; });
}

/* The expanded chunks of sequence i (len tokens, M copies a token). */
__device__ __forceinline__ int hop_seq_chunks(const ChunkParams &p, int i) {
    return (int)((((int64_t)p.cu[i + 1] - p.cu[i]) * p.M + CHUNK - 1) / CHUNK);
}
/* The initial state of sequence i, head hd, as a run's source (zeros without one). */
__device__ __forceinline__ HopStateSrc hop_h0(const ChunkParams &p, int i, int hd) {
    return HopStateSrc{p.h0, p.h0_dtype, ((int64_t)i * p.H + hd) * p.K * p.V};
}

/* The op in one pass: block (0, hd, i) runs every chunk of sequence i from its initial state. */
template <typename T, int KP, int VP, int COPY>
__global__ void __launch_bounds__(HOP_THREADS, 1)
    chunk_hopper_kernel(const ChunkParams p, const __grid_constant__ HopperMaps maps) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ unsigned char smem_raw[];
    const int hd = blockIdx.y, i = blockIdx.z;
    hop_run<T, KP, VP, COPY, HOP_MAIN>(p, maps, smem_raw, i, hd, 0, hop_seq_chunks(p, i), hop_h0(p, i, hd),
                                       final_state_dest(p, i, hd), nullptr);
#endif
}

} // namespace

#endif /* GDP_CHUNK_HOPPER_CUH */
