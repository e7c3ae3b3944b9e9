/*
 * fused.cuh: chunk_fused_kernel, the chunk op in one pass (GDP_CHUNK_PATH=fused): one block
 * per (sequence, head) walks the sequence's expanded chunks in order with the fp32 state in
 * registers, and nothing but the inputs, o and the states touches device memory (the staged
 * path moves keys, w, u, v_new and the chunk-entry states through the workspace: about 1.9 GB
 * on 8 x 2048, H 16, K = V = 128, M 2, against 0.4 GB here).
 *
 * Per expanded chunk c (64 rows of the expanded stream, rows t*M + m), with S the fp32 state
 * entering it and S16 its 16-bit copy (gdp-math.md 3, written without w and u):
 *   Gk     chunk-local cumsum of g (copy 0 of each token carries it), base 2, by a warp scan
 *   K, Q   L2-normalized in fp32 and rounded (if asked); Q holds the tokens whose LAST copy
 *          lies in this chunk (at most 64 of them)
 *   A      beta_r 2^(Gk_r - Gk_s) <k_r, k_s> for s < r, in fp32; X = (I + A)^-1 in place
 *   Ai     bf16(X diag(beta))
 *   P      the masked, decayed scores 2^(Gk[r_t] - Gk[r]) <q_t, k_r> for r <= r_t, rounded
 *   X'     V - 2^Gk (K S16), rounded (= Ai^-1 (u - w S) of the staged path: w and u are
 *   v_new  = Ai X'                     never formed; FlashQLA's form)
 *   o_t    scale (2^Gk[r_t] q_t S16 + (P v_new)_t), r_t the row of token t's last copy: exact
 *          for any M, since the chunk's rows before r_t are all of t's predecessors inside the
 *          chunk and S holds the rest
 *   S      2^gl S + K^T (2^(gl - Gk) v_new), gl = Gk of the chunk's last row
 * Chunk states (fp32, entering each token chunk = expanded chunk c with c % M == 0), the final
 * state or the cache slot are written as the staged sweep does.
 *
 * Warp specialization (two stages of per-chunk buffers):
 *   warps 0-3 (aux), one chunk ahead: Gk, K's norms, A, the inverse and Ai (wy_invert_ai, tf32
 *     tensor cores off the diagonal blocks): the chunk's serial part, which does not depend on
 *     S; on the way they start the
 *     cp.async loads of the NEXT chunk's K, V, Q, g and beta into the other stage, as soon as the
 *     state warps have released it, so the copies land while this chunk is inverted;
 *   warps 4-11 (state): Q's norms and P (which also do not depend on S, but the state warps
 *     would otherwise wait: f4 in kernels/NOTES-chunk.md), X', v_new, the outputs and the state
 *     update, the state in registers.
 * Barriers: FULL[b] (named; aux arrives when stage b is ready, state waits), EMPTY[b] (an
 * mbarrier; state arrives when it is done with stage b, aux tests it without blocking until it
 * has nothing else to do), AUX and STATE (named) for each group's own phases. Shared memory: two stages of K, V, Q, Ai, P and Gk plus S16, v_new, its decayed
 * copy and the fp32 A: 224.5 KB at K = V = 128, one block per SM.
 * Deterministic: fixed-order sums everywhere, no atomics.
 */
#ifndef GDP_CHUNK_FUSED_CUH
#define GDP_CHUNK_FUSED_CUH

#include <stdint.h>

#include "common.cuh"
#include "kernels/dtype_access.cuh" /* prefetch_l2 */
#include "mma.cuh"
#include "tile.cuh"
#include "wy_math.cuh"

/* Developer hook: kernels/dev/chunk_stages.cu (--fused-phases) defines it to add up clock64
 * deltas per phase for one thread of each role; the library leaves it empty. role 0 = aux,
 * 1 = state; a mark closes the phase it names (see the marks below). */
#ifndef GDP_FUSED_PHASE_MARK
#define GDP_FUSED_PHASE_MARK(role, phase) ((void)0)
#endif
/* Developer hook (chunk_stages.cu --fused-alone): true leaves out a role's math, keeping its
 * loads and barriers, so the other role's time can be measured alone; the library: never. */
#ifndef GDP_FUSED_DEV_SKIP
#define GDP_FUSED_DEV_SKIP(role) false
#endif

namespace {

// CUDA kernels

constexpr int FUSED_AUX_THREADS = 128;   /* warps 0-3  */
constexpr int FUSED_STATE_THREADS = 256; /* warps 4-11 */
constexpr int FUSED_THREADS = FUSED_AUX_THREADS + FUSED_STATE_THREADS;
/* named barriers (0 is __syncthreads, unused here) */
constexpr int BAR_FULL0 = 1, BAR_AUX = 5, BAR_STATE = 6;

/* One stage: what the aux warps prepare for one chunk. */
template <typename T, int KP, int VB> struct FusedStage {
    T k[CHUNK][KP + PAD];     /* keys (normalized)                                          */
    T q[CHUNK][KP + PAD];     /* queries of the tokens ending in the chunk                  */
    T v[CHUNK][VB + PAD];     /* V; the state warps turn it into X' = V - 2^Gk (K S16)       */
    T ai[CHUNK][CHUNK + PAD]; /* bf16(X diag beta)                                           */
    T p[CHUNK][CHUNK + PAD];  /* masked decayed scores; before them the inverse's scratch  */
    float gk[CHUNK];          /* g per row (copy 0 of a token), then Gk                     */
    float gam[CHUNK];         /* 2^Gk                                                       */
    float beta[CHUNK];
};
template <typename T, int KP, int VB> struct FusedSmem {
    FusedStage<T, KP, VB> st[2];
    T s[KP][VB + PAD];         /* S16: the state entering the chunk                */
    T vn[CHUNK][VB + PAD];     /* v_new                                            */
    T vd[CHUNK][VB + PAD];     /* 2^(gl - Gk) v_new, the state update's operand    */
    float a[CHUNK][CHUNK + 4]; /* A, then X = (I + A)^-1 (aux only; wy_invert_ai)   */
    uint64_t empty[2];         /* EMPTY[b]: the state warps are done with stage b  */
};
static_assert(sizeof(float) * WY_INV_SCRATCH <= sizeof(__nv_bfloat16) * 16 * (CHUNK + PAD),
              "each aux warp's inverse scratch must fit in its own 16 rows of a stage's score tile");

/* The rows of chunk c of a sequence: n expanded rows from local row lo; the nq tokens from tf
 * whose last copy lies in them. */
struct FusedChunk {
    int64_t lo;
    int n, tf, nq;
};
__device__ __forceinline__ FusedChunk fused_chunk(int c, int64_t len, int M) {
    FusedChunk ch;
    ch.lo = (int64_t)c * CHUNK;
    const int64_t len_dp = len * M;
    ch.n = (int)min((int64_t)CHUNK, len_dp - ch.lo);
    ch.tf = (int)(ch.lo / M);
    const int64_t tl = min(len - 1, (ch.lo + ch.n - M) / M);
    ch.nq = (int)(tl - ch.tf + 1);
    return ch;
}
/* The chunk row of query qi's token's last copy, or -1 past the chunk's queries. */
__device__ __forceinline__ int fused_query_row(const FusedChunk &ch, int qi, int M) {
    return qi < ch.nq ? (int)((int64_t)(ch.tf + qi) * M + M - 1 - ch.lo) : -1;
}

/* ---- the aux warps ---- */

/* Starts chunk c's loads into stage st: K, V and Q by cp.async (one group, zero-filled past the
 * chunk; plain loads where 16-byte copies are not allowed), g and beta by plain loads, and the
 * chunk after it into L2. The aux warps issue it one chunk ahead (fused_aux_chunk), so the
 * copies land while the chunk before is inverted. */
template <typename T, int KP, int VB>
__device__ __forceinline__ void fused_aux_issue_loads(const ChunkParams &p, FusedStage<T, KP, VB> &st, int c,
                                                      int64_t bos, int64_t len, int hd, int nchunks) {
    constexpr int NTH = FUSED_AUX_THREADS;
    const int tid = threadIdx.x;
    const int H = p.H, M = p.M;
    const FusedChunk ch = fused_chunk(c, len, M);
    const int n = ch.n, nq = ch.nq;
    const int64_t rowc = bos * M + ch.lo;
    const int64_t ld_k = (int64_t)H * p.K, ld_v = (int64_t)H * p.V;
    float gr = 0.0f, be = 0.0f; /* loaded first, stored last: their latency hides behind the copies */
    if (tid < n) {
        const int64_t lr = ch.lo + tid;
        if (p.g_raw != nullptr && lr % M == 0)
            gr = p.g_raw[(bos + lr / M) * H + hd];
        be = load_any(p.beta, p.beta_dtype, (rowc + tid) * H + hd);
    }
    const T *ksrc = static_cast<const T *>(p.k) + (rowc * H + hd) * p.K;
    const T *vsrc = static_cast<const T *>(p.v) + (rowc * H + hd) * p.V;
    const T *qsrc = static_cast<const T *>(p.q) + ((bos + ch.tf) * H + hd) * p.K;
    if (p.k_vec)
        tile_async<T, NTH>(&st.k[0][0], KP + PAD, ksrc, ld_k, n, KP, p.K, tid);
    else
        tile_scalar<T, NTH>(&st.k[0][0], KP + PAD, ksrc, ld_k, n, KP, p.K, tid);
    if (p.v_vec)
        tile_async<T, NTH>(&st.v[0][0], VB + PAD, vsrc, ld_v, n, VB, p.V, tid);
    else
        tile_scalar<T, NTH>(&st.v[0][0], VB + PAD, vsrc, ld_v, n, VB, p.V, tid);
    if (p.q_vec)
        tile_async<T, NTH>(&st.q[0][0], KP + PAD, qsrc, ld_k, nq, KP, p.K, tid);
    else
        tile_scalar<T, NTH>(&st.q[0][0], KP + PAD, qsrc, ld_k, nq, KP, p.K, tid);
    cp_async_commit();
    if (c + 1 < nchunks) {
        const FusedChunk nx = fused_chunk(c + 1, len, M);
        const int64_t rown = bos * M + nx.lo;
        const int es = (int)sizeof(T);
        if (tid < nx.n) {
            prefetch_l2(static_cast<const T *>(p.k) + ((rown + tid) * H + hd) * p.K, p.K * es);
            prefetch_l2(static_cast<const T *>(p.v) + ((rown + tid) * H + hd) * p.V, p.V * es);
        } else if (tid >= 64 && tid - 64 < nx.nq) {
            prefetch_l2(static_cast<const T *>(p.q) + ((bos + nx.tf + tid - 64) * H + hd) * p.K, p.K * es);
        }
    }
    if (tid < CHUNK) {
        st.gk[tid] = gr;
        st.beta[tid] = be;
    }
}

/* Stage b for chunk c, whose loads were started by the chunk before (or the prologue); on the
 * way, chunk c + 1's loads into the other stage once the state warps have released it. */
template <typename T, int KP, int VB>
__device__ __forceinline__ void fused_aux_chunk(const ChunkParams &p, FusedSmem<T, KP, VB> &s, int b, int c,
                                                int64_t bos, int64_t len, int hd, int nchunks) {
    constexpr int NTH = FUSED_AUX_THREADS, NW = NTH / 32;
    FusedStage<T, KP, VB> &st = s.st[b];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int n = fused_chunk(c, len, p.M).n;

    /* chunk c + 1's loads go into the other stage once the state warps are done with chunk c - 1
     * there (NextChunkLoads, mma.cuh): tested without blocking after A and after the inverse,
     * waited for only at the end (testing after each of the inverse's barriers measured slower: f5
     * in kernels/NOTES-chunk.md). */
    NextChunkLoads next(&s.empty[b ^ 1], c, nchunks);
    auto issue_next_if_free = [&](bool block) {
        next.try_issue(block, [&] { fused_aux_issue_loads<T, KP, VB>(p, s.st[b ^ 1], c + 1, bos, len, hd, nchunks); });
    };

    cp_async_wait<0>();
    bar_sync(BAR_AUX, NTH);
    GDP_FUSED_PHASE_MARK(0, 1); /* aux 1: waiting for the chunk's loads */
    if (GDP_FUSED_DEV_SKIP(0)) { /* developer lab only: the aux warps' math left out */
        issue_next_if_free(true);
        return;
    }

    /* Gk: a warp scan over the 64 rows (two per lane), base 2 as the cumsum kernel; the norms */
    if (warp == 0)
        chunk_gk_scan(st.gk, st.gam, lane);
    if (p.l2norm) {
        l2norm_rows<T, KP, NW, 4>(&st.k[0][0], KP + PAD, n, warp, lane); /* Q: the state warps */
    }
    bar_sync(BAR_AUX, NTH);
    GDP_FUSED_PHASE_MARK(0, 2); /* aux 2: Gk and K's norms */

    /* A[r][s] = beta_r 2^(Gk_r - Gk_s) <k_r, k_s> for s < r < n, else 0 (wy_math.cuh) */
    wy_build_a<T, KP>(s.a, &st.k[0][0], KP + PAD, st.gk, st.beta, n, warp, lane);
    bar_sync(BAR_AUX, NTH);
    GDP_FUSED_PHASE_MARK(0, 3); /* aux 3: A */

    issue_next_if_free(false);
    GDP_FUSED_PHASE_MARK(0, 6); /* aux 6: testing (and maybe issuing) the next chunk's loads */

    /* Ai = bf16((I + A)^-1 diag beta), the off-diagonal blocks on tf32 tensor cores (wy_math.cuh);
     * its scratch is the stage's score tile, which the state warps write only after FULL */
    wy_invert_ai<T>(s.a, &st.ai[0][0], CHUNK + PAD, st.beta, reinterpret_cast<float *>(&st.p[warp * 16][0]), tid,
                    [] { bar_sync(BAR_AUX, FUSED_AUX_THREADS); });
    GDP_FUSED_PHASE_MARK(0, 4); /* aux 4: the inverse and Ai */
    issue_next_if_free(false);
    GDP_FUSED_PHASE_MARK(0, 0); /* aux 0: testing (and maybe issuing) the next chunk's loads */
    issue_next_if_free(true);
}

template <typename T, int KP, int VB>
__global__ void __launch_bounds__(FUSED_THREADS, 1) chunk_fused_kernel(const ChunkParams p) {
    constexpr int NTH = FUSED_STATE_THREADS;
    constexpr int RT = KP / 16;     /* state row tiles: 4 (K 64) or 8 (K 128)      */
    constexpr int CGW = 8 / RT;     /* state warps per row tile: 2 or 1            */
    constexpr int SCOLS = VB / CGW; /* state columns per warp                      */
    constexpr int SNT = SCOLS / 8;  /* n8 tiles of state per warp: 4, 8 or 16      */
    constexpr int HNT = VB / 16;    /* n8 tiles of a half-row block (X', v_new, o) */
    static_assert(RT * CGW == 8 && SNT % 2 == 0 && HNT % 2 == 0, "state split");
    extern __shared__ __align__(16) unsigned char smem_raw[];
    FusedSmem<T, KP, VB> &s = *reinterpret_cast<FusedSmem<T, KP, VB> *>(smem_raw);
    const int hd = blockIdx.y, i = blockIdx.z, H = p.H, M = p.M;
    const int64_t bos = p.cu[i];
    const int64_t len = (int64_t)p.cu[i + 1] - bos;
    const int nchunks = (int)((len * M + CHUNK - 1) / CHUNK);

    if (threadIdx.x == 0) {
        mbar_init(&s.empty[0], FUSED_STATE_THREADS);
        mbar_init(&s.empty[1], FUSED_STATE_THREADS);
    }
    __syncthreads(); /* the mbarriers are initialized before any thread uses them */
    if (threadIdx.x < FUSED_AUX_THREADS) {
        if (nchunks > 0)
            fused_aux_issue_loads<T, KP, VB>(p, s.st[0], 0, bos, len, hd, nchunks);
        for (int c = 0; c < nchunks; c++) {
            const int b = c & 1;
            GDP_FUSED_PHASE_MARK(0, 7); /* aux 7: the arrive and the loop */
            fused_aux_chunk<T, KP, VB>(p, s, b, c, bos, len, hd, nchunks);
            GDP_FUSED_PHASE_MARK(0, 5); /* aux 5: waiting to start the next chunk's loads */
            /* Every aux warp's last accesses of the chunk (Ai's stores, the inverse's scratch)
             * behind an aux barrier before the arrive: racecheck does not credit bar.arrive
             * with ordering them (18 hazards in the first 6 launches without it, 0 with it;
             * the fused rows moved by 0-2 %, kernels/NOTES-chunk.md, thirty-first session). */
            bar_sync(BAR_AUX, FUSED_AUX_THREADS);
            bar_arrive(BAR_FULL0 + b, FUSED_THREADS);
        }
        return;
    }

    const int tid = threadIdx.x - FUSED_AUX_THREADS, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t4 = lane & 3;
    const int64_t coff = p.coff[i];
    const int sr0 = (warp % RT) * 16, sc0 = (warp / RT) * SCOLS;
    const int r0 = (warp & 3) * 16, c0 = (warp >> 2) * (VB / 2); /* X', v_new and o pieces */

    /* state in registers: S[nt] covers rows sr0 + {g, g+8}, columns sc0 + 8 nt + 2 t4 + {0, 1} */
    float S[SNT][4];
#pragma unroll
    for (int nt = 0; nt < SNT; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int r = sr0 + g + (e >> 1) * 8, cc = sc0 + nt * 8 + 2 * t4 + (e & 1);
            float x = 0.0f;
            if (p.h0 != nullptr && r < p.K && cc < p.V)
                x = load_any(p.h0, p.h0_dtype, (((int64_t)i * H + hd) * p.K + r) * p.V + cc);
            S[nt][e] = x;
        }

    for (int c = 0; c < nchunks; c++) {
        const int b = c & 1;
        FusedStage<T, KP, VB> &st = s.st[b];
        const FusedChunk ch = fused_chunk(c, len, M);
        const int n = ch.n, nq = ch.nq;
        /* S16 for this chunk, and the fp32 state entering token chunk c / M */
#pragma unroll
        for (int nt = 0; nt < SNT; nt++)
#pragma unroll
            for (int hh = 0; hh < 2; hh++) {
                const int r = sr0 + g + hh * 8, cc = sc0 + nt * 8 + 2 * t4;
                *reinterpret_cast<uint32_t *>(&s.s[r][cc]) = Elem<T>::pack(S[nt][2 * hh], S[nt][2 * hh + 1]);
            }
        if (c % M == 0 && p.chunk_states != nullptr) {
            const int64_t hrow = coff + c / M;
            if (hrow < p.cs_rows)
                store_state_tile(p.chunk_states, p.cs_dtype, S, sr0, sc0, p.K, p.V, lane,
                                 [&](int r, int cc) { return ((hrow * H + hd) * p.K + r) * p.V + cc; });
        }
        GDP_FUSED_PHASE_MARK(1, 7); /* state 7: S16, chunk states and the loop */
        bar_sync(BAR_FULL0 + b, FUSED_THREADS); /* stage b holds chunk c (and S16 is complete) */
        GDP_FUSED_PHASE_MARK(1, 0); /* state 0: waiting for the aux warps */
        if (GDP_FUSED_DEV_SKIP(1)) { /* developer lab only: the state warps' math left out */
            if (c + 2 < nchunks)
                mbar_arrive(&s.empty[b]);
            continue;
        }

        /* Q's norms, then P: the scores of query rows r0.. against key rows <= r_t over the warp's
         * 32 key columns c0 / 4.., masked, decayed, rounded; every element of the rows written
         * (zeros outside the mask). Done here, not by the aux warps, because the state warps
         * would otherwise wait for them (kernels/NOTES-chunk.md, f4). */
        if (p.l2norm) {
            l2norm_rows<T, KP, NTH / 32, 2>(&st.q[0][0], KP + PAD, nq, warp, lane);
            bar_sync(BAR_STATE, NTH);
        }
        if (r0 < nq) {
            const int ra = fused_query_row(ch, r0 + g, M), rb_ = fused_query_row(ch, r0 + g + 8, M);
            const int rmax = fused_query_row(ch, min(r0 + 15, nq - 1), M);
            const float ga = ra >= 0 ? st.gk[ra] : 0.0f, gb = rb_ >= 0 ? st.gk[rb_] : 0.0f;
            const int k0 = (warp >> 2) * 32;
            float sc[4][4];
            zero_tiles(sc);
            mma_rows_nk<T, KP>(sc, &st.q[0][0], KP + PAD, r0, &st.k[0][0], KP + PAD, k0 / 16, rmax / 16, lane);
#pragma unroll
            for (int nt = 0; nt < 4; nt++)
#pragma unroll
                for (int hh = 0; hh < 2; hh++) {
                    const int row = hh ? rb_ : ra, cc = k0 + nt * 8 + 2 * t4;
                    const float gt = hh ? gb : ga;
                    const float p0 = cc <= row ? sc[nt][2 * hh] * exp2f(gt - st.gk[cc]) : 0.0f;
                    const float p1 = cc + 1 <= row ? sc[nt][2 * hh + 1] * exp2f(gt - st.gk[cc + 1]) : 0.0f;
                    *reinterpret_cast<uint32_t *>(&st.p[r0 + g + hh * 8][cc]) = Elem<T>::pack(p0, p1);
                }
        }
        GDP_FUSED_PHASE_MARK(1, 5); /* state 5: Q's norms and P (complete at the X' barrier) */

        /* X' = V - 2^Gk (K S16) over rows r0.., columns c0.., in place over V */
        {
            float acc[HNT][4];
            zero_tiles(acc);
            mma_rows_kn<T, KP>(acc, &st.k[0][0], KP + PAD, r0, &s.s[0][0], VB + PAD, c0, lane);
#pragma unroll
            for (int hh = 0; hh < 2; hh++) {
                const int r = r0 + g + hh * 8;
                const float f = st.gam[r];
#pragma unroll
                for (int nt = 0; nt < HNT; nt++) {
                    T *vp = &st.v[r][c0 + nt * 8 + 2 * t4];
                    const float x0 = Elem<T>::to_f(vp[0]) - f * acc[nt][2 * hh];
                    const float x1 = Elem<T>::to_f(vp[1]) - f * acc[nt][2 * hh + 1];
                    *reinterpret_cast<uint32_t *>(vp) = Elem<T>::pack(x0, x1);
                }
            }
        }
        bar_sync(BAR_STATE, NTH); /* X' complete */
        GDP_FUSED_PHASE_MARK(1, 1); /* state 1: X' */

        /* v_new = Ai X' over rows r0.., columns c0..; the triangle ends at the warp's rows */
        const float gl = st.gk[n - 1];
        {
            float acc[HNT][4];
            zero_tiles(acc);
            mma_rows_tri<T>(acc, &st.ai[0][0], CHUNK + PAD, r0, r0, &st.v[0][0], VB + PAD, c0, lane);
#pragma unroll
            for (int hh = 0; hh < 2; hh++) {
                const int r = r0 + g + hh * 8;
                const float f = r < n ? exp2f(gl - st.gk[r]) : 0.0f;
#pragma unroll
                for (int nt = 0; nt < HNT; nt++) {
                    const int cc = c0 + nt * 8 + 2 * t4;
                    const float v0 = acc[nt][2 * hh], v1 = acc[nt][2 * hh + 1];
                    *reinterpret_cast<uint32_t *>(&s.vn[r][cc]) = Elem<T>::pack(v0, v1);
                    *reinterpret_cast<uint32_t *>(&s.vd[r][cc]) = Elem<T>::pack(v0 * f, v1 * f);
                }
            }
        }
        bar_sync(BAR_STATE, NTH); /* v_new and its decayed copy complete */
        GDP_FUSED_PHASE_MARK(1, 2); /* state 2: v_new */

        /* o = scale (2^Gk[r_t] Q S16 + P v_new) over query rows r0.., columns c0.. */
        if (r0 < nq) {
            const int ra = fused_query_row(ch, r0 + g, M), rb_ = fused_query_row(ch, r0 + g + 8, M);
            const int rmax = fused_query_row(ch, min(r0 + 15, nq - 1), M);
            float acc[HNT][4];
            zero_tiles(acc);
            mma_rows_kn<T, KP>(acc, &st.q[0][0], KP + PAD, r0, &s.s[0][0], VB + PAD, c0, lane);
            const float fa = ra >= 0 ? st.gam[ra] : 0.0f, fb = rb_ >= 0 ? st.gam[rb_] : 0.0f;
#pragma unroll
            for (int nt = 0; nt < HNT; nt++) {
                acc[nt][0] *= fa;
                acc[nt][1] *= fa;
                acc[nt][2] *= fb;
                acc[nt][3] *= fb;
            }
            mma_rows_tri<T>(acc, &st.p[0][0], CHUNK + PAD, r0, rmax, &s.vn[0][0], VB + PAD, c0, lane);
            T *o = static_cast<T *>(p.o) + ((bos + ch.tf) * H + hd) * p.V;
#pragma unroll
            for (int nt = 0; nt < HNT; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int qi = r0 + g + (e >> 1) * 8, cc = c0 + nt * 8 + 2 * t4 + (e & 1);
                    if (qi < nq && cc < p.V)
                        o[(int64_t)qi * H * p.V + cc] = Elem<T>::from_f(acc[nt][e] * p.scale);
                }
        }

        GDP_FUSED_PHASE_MARK(1, 3); /* state 3: the outputs */
        /* S = 2^gl S + K^T (decayed v_new) */
        state_decay_update<T>(S, exp2f(gl), &st.k[0][0], KP + PAD, sr0, n, &s.vd[0][0], VB + PAD, sc0, lane);
        /* every read of stage b, S16, v_new and its decayed copy is done: stage b goes back to
         * the aux warps (they wait for it only if a chunk c + 2 exists), S16 may be rewritten */
        bar_sync(BAR_STATE, NTH);
        GDP_FUSED_PHASE_MARK(1, 4); /* state 4: the state update */
        if (c + 2 < nchunks)
            mbar_arrive(&s.empty[b]);
    }

    /* final state: the cache slot (in place, cache dtype) or the dense final_state */
    const StateDest d = final_state_dest(p, i, hd);
    if (d.dst != nullptr)
        store_state_tile(d.dst, d.dtype, S, sr0, sc0, p.K, p.V, lane,
                         [&](int r, int cc) { return d.base + (int64_t)r * p.V + cc; });
}

/* The fused path takes 16-bit inputs with K <= 128 and V <= 128 (padded K and V 64 or 128);
 * anything else runs the staged kernels. */
inline bool fused_fits(const ChunkParams &p) { return (p.KP == 64 || p.KP == 128) && (p.VP == 64 || p.VP == 128); }

template <typename T, int KP, int VB> cudaError_t launch_fused_kv(const ChunkParams &p, cudaStream_t st) {
    const size_t smem = sizeof(FusedSmem<T, KP, VB>);
    cudaError_t err =
        cudaFuncSetAttribute(chunk_fused_kernel<T, KP, VB>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (err != cudaSuccess)
        return err;
    if (p.N > 0)
        chunk_fused_kernel<T, KP, VB><<<dim3(1u, (unsigned)p.H, (unsigned)p.N), FUSED_THREADS, smem, st>>>(p);
    return cudaGetLastError();
}

template <typename T> cudaError_t launch_fused(const ChunkParams &p, cudaStream_t st) {
    if (p.KP == 64)
        return p.VP == 64 ? launch_fused_kv<T, 64, 64>(p, st) : launch_fused_kv<T, 64, 128>(p, st);
    return p.VP == 64 ? launch_fused_kv<T, 128, 64>(p, st) : launch_fused_kv<T, 128, 128>(p, st);
}

} // namespace

#endif /* GDP_CHUNK_FUSED_CUH */
