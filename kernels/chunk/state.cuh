/*
 * state.cuh: stage 2 of the chunk op, chunk_state_kernel: the sequential sweep over one
 * sequence's expanded chunks per (sequence, head, VB value columns), state in fp32 registers
 * (gdp-math.md 3.5): v_new = u - w S, S = 2^gl S + K^T (2^(gl - Gk) v_new). It stores the
 * 16-bit state entering each token chunk (for the output stage), the chunk states, and the
 * final state or the cache slot.
 *
 * The value-column block width VB (64, 32 or 16) only sets how many blocks share one
 * (sequence, head): the columns of S evolve independently (w, K and Gk act on S's rows), so a
 * narrower block computes exactly the same numbers per column, and the results are bitwise
 * equal for every VB. Why, through the m16n8k16 fragments (mma.cuh; g = lane / 4, t = lane % 4):
 *  - an m16n8k16 accumulates element (r, c) of its 16 x 8 tile from row r of A (16 k values),
 *    column c of B (the same 16 k values) and its own accumulator only; which n8 tile of which
 *    block a column sits in changes the registers it lives in, not what is added to it;
 *  - the k dimension (over K for w S, over the chunk's 64 rows for K^T v) is never split: each
 *    element still sees the same mma calls in the same k order (kk = 0, 16, ... KP - 16; ks = 0..3
 *    with the same skip of rows past the chunk's end), on the same 16-bit operands;
 *  - the A fragments (w rows, K^T rows) do not depend on the column block at all; the B
 *    fragments are the 16-bit state columns and the decayed v_new columns of this block, loaded
 *    by ldmatrix from rows of VB + PAD elements instead of 72 (frag_b_kn_x1 gives the same two
 *    registers as frag_b_kn's first tile where a warp owns a single n8 tile);
 *  - everything elementwise (the 16-bit rounding of S, u - w S, the decay factors exp2(gl - Gk),
 *    S *= 2^gl, the stores) is the same expression per element.
 * By induction over the chunks the fp32 state, v_new, the chunk-entry states and the final state
 * of each column are the same bits whatever VB is (tests/test_chunk_gpu.c checks it on the GPU).
 */
#ifndef GDP_CHUNK_STATE_CUH
#define GDP_CHUNK_STATE_CUH

#include <stdint.h>

#include "common.cuh"
#include "mma.cuh"

/* Developer hooks: kernels/dev/chunk_stages.cu (--state-phases) defines them to add up clock64
 * cycles per phase of two threads' chunk steps in registers (DECL at the kernel's start, MARK at
 * each phase's end, FLUSH once after the loop); empty in the library. */
#ifndef GDP_STATE_PHASE_MARK
#define GDP_STATE_PHASE_DECL() ((void)0)
#define GDP_STATE_PHASE_MARK(phase) ((void)0)
#define GDP_STATE_PHASE_FLUSH() ((void)0)
#endif

namespace {

// CUDA kernels

template <typename T, int KP, int STAGES, int VB> struct StateSmem {
    T w[STAGES][CHUNK][KP + PAD];
    T k[STAGES][CHUNK][KP + PAD];
    T u[STAGES][CHUNK][VB + PAD]; /* u of the chunk, overwritten by the decayed v_new */
    T s[KP][VB + PAD];            /* 16-bit copy of the running state                */
    float g[STAGES][CHUNK];
    uint64_t full[STAGES], empty[STAGES]; /* the producer warp's stage signals (producer modes only) */
};

/* Who issues the sweep's copies (GDP_CHUNK_STATE_COPY, launch.cu): every warp (warps), one producer
 * warp by cp.async (producer), or one producer warp by the copy engine, one 2-D tensor-map copy a
 * tile (tma; K <= 128 only: a box row is KP + PAD elements, at most 256). */
constexpr int STATE_COPY_WARPS = 0, STATE_COPY_PRODUCER = 1, STATE_COPY_TMA = 2;

/* The TMA mode's tensor maps (launch.cu, make_state_maps): w and the keys as [T M rows][H KP columns],
 * u as [T M rows][H VP columns], 16-bit elements; the boxes are 64 rows of KP + PAD (w, K) and VB +
 * PAD (u) columns from the tile's first column, so a copy writes the stage's padded rows as they
 * are (the PAD columns get the next head's or column block's first elements, or zeros past the
 * last, and are never read). Passed by value as a __grid_constant__ parameter (zeros in the other
 * modes). */
struct alignas(64) StateMaps {
    unsigned char w[128], k[128], u[128]; /* CUtensorMap each (128 bytes, 64-byte aligned) */
};

/* Work split: one block of KP / 16 warps per (sequence, head, VB value columns), looping over the
 * sequence's expanded chunks in order with STAGES - 1 chunks of w, K, u, Gk in flight; warp w
 * keeps state rows [16w, 16w+16) x the block's VB columns in fp32 registers and computes a
 * 16-row x (VB / CGV)-column piece of the chunk's v_new (4 row tiles x CGV column groups cover
 * the 64 x VB tile; warps past CGV column groups, KP = 256 with VB = 16 only, skip that product). */
/* COPY != STATE_COPY_WARPS (PW below; GDP_CHUNK_STATE_COPY=warps turns it off): one more warp, the producer, issues every copy
 * of the sweep STAGES - 1 chunks ahead (cp.async, completion on the stage's FULL mbarrier) and
 * waits for the stage's EMPTY mbarrier (every consumer thread arrives after its last read of the
 * stage) before it refills it; the consumer warps
 * only compute and sync among themselves by named barriers. Why: the issue of the next chunk's
 * copies by every warp was the largest phase of a chunk step of one long sequence
 * (kernels/NOTES-chunk.md, sixteenth session); taking it off them made the 1 x 16384 sweep 12 %
 * faster (seventeenth session). The arithmetic is the same, so the same bits.
 * STATE_COPY_TMA: lane 0 of the producer moves a whole chunk's w, K and u tiles by three tensor-map
 * copies (the bytes announced on FULL: its arrival is FULL's 33rd) instead of 16-byte cp.async (70 a
 * lane a chunk at K = 128, with their addresses: the producer, sharing a scheduler with two
 * consumer warps, was barely ahead of them on one long sequence; ncu, twentieth session); a
 * sequence's last, partial chunk still goes by cp.async, whose zero fill the rows past its end need
 * (past the last sequence the workspace rows are unwritten). The same bytes land in the rows and
 * columns that are read, so the same bits. */
template <typename T, int KP, int STAGES, int VB, int COPY>
__global__ void __launch_bounds__(KP * 2 + (COPY != STATE_COPY_WARPS ? 32 : 0))
    chunk_state_kernel(const ChunkParams p, const __grid_constant__ StateMaps maps) {
    constexpr bool PW = COPY != STATE_COPY_WARPS, TMA = COPY == STATE_COPY_TMA;
    static_assert(!TMA || KP + PAD <= 256, "a tensor-map box row holds at most 256 elements");
    /* the copy engine writes 128-byte aligned tiles: every stage tile starts on a multiple of 128 */
    static_assert(!TMA || ((CHUNK * (KP + PAD) * sizeof(T)) % 128 == 0 && (CHUNK * (VB + PAD) * sizeof(T)) % 128 == 0),
                  "stage tiles 128-byte aligned");
    static_assert(VB == 64 || VB == 32 || VB == 16, "state column blocks of 64, 32 or 16");
    constexpr int NW = KP / 16, NTH = NW * 32;
    constexpr int SNT = VB / 8;     /* n8 tiles of state per warp                            */
    constexpr int CG = NW / 4;      /* warp column groups: 1 (KP 64), 2 (128), 4 (256)       */
    constexpr int CGV = CG < SNT ? CG : SNT; /* column groups with v_new work               */
    constexpr int VNT = SNT / CGV;  /* n8 tiles of v_new per working warp: 1, 2, 4 or 8      */
    constexpr int VPR = KP / 8;     /* 16-byte vectors per row of w and K                    */
    constexpr int NLK = CHUNK * VPR / NTH;          /* w / K vectors per thread and chunk */
    constexpr int NUV = CHUNK * (VB / 8);           /* u vectors per chunk                */
    constexpr int NLU = (NUV + NTH - 1) / NTH;      /* u vectors per thread and chunk     */
    static_assert(NLK * NTH == CHUNK * VPR, "load split");
    static_assert(CGV * VNT == SNT && (VNT == 1 || VNT % 2 == 0), "v_new split");
    /* the block's dynamic shared memory, named apart from the other stages' (16-byte aligned)
     * declarations: the copy engine's tiles need 128-byte alignment */
    extern __shared__ __align__(128) unsigned char state_smem_raw[];
    StateSmem<T, KP, STAGES, VB> &s = *reinterpret_cast<StateSmem<T, KP, STAGES, VB> *>(state_smem_raw);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t4 = lane & 3;
    const int vb = blockIdx.x, hd = blockIdx.y, i = blockIdx.z, H = p.H;
    const int64_t bos = p.cu[i];
    const int64_t len_dp = ((int64_t)p.cu[i + 1] - bos) * p.M;
    const int nt_dp = (int)((len_dp + CHUNK - 1) / CHUNK);
    const int64_t coff = p.coff[i];
    const int vr0 = (warp & 3) * 16;          /* v_new tile rows of this warp    */
    const int vc0 = (warp >> 2) * (VB / CGV); /* v_new tile columns of this warp */
    const bool vnew_warp = CGV == CG || (warp >> 2) < CGV; /* this warp has a v_new piece */
    const int sr0 = warp * 16;                /* state rows of this warp         */
    GDP_STATE_PHASE_DECL();
    constexpr int BAR_S16 = 1, BAR_VNEW = 2; /* the consumer warps' named barriers (PW) */
    if constexpr (PW) {
        if (tid == 0) {
            for (int b = 0; b < STAGES; b++) {
                /* the producer's 32 lanes, each once its cp.async copies landed (and, TMA, lane 0's
                 * arrival with the tensor-map copies' byte count) */
                mbar_init(&s.full[b], TMA ? 33 : 32);
                mbar_init(&s.empty[b], NTH); /* one arrival per consumer thread */
            }
            if constexpr (TMA)
                fence_mbar_init();
        }
        __syncthreads(); /* the only block-wide barrier: the producer leaves after its loop */
        if (warp == NW) {
            for (int ct = 0; ct < nt_dp; ct++) {
                const int b = ct % STAGES;
                if (ct >= STAGES)
                    mbar_wait(&s.empty[b], (ct / STAGES - 1) & 1); /* consumers are done with chunk ct - STAGES */
                const int64_t rowc = bos * p.M + (int64_t)ct * CHUNK;
                const int nc = (int)min((int64_t)CHUNK, len_dp - (int64_t)ct * CHUNK);
                const T *wsrc = static_cast<const T *>(p.w) + rowc * H * KP;
                const T *ksrc = static_cast<const T *>(p.kn) + rowc * H * KP;
                const T *usrc = static_cast<const T *>(p.u) + rowc * H * p.VP;
                if (TMA && nc == CHUNK) {
                    if (lane == 0) {
                        constexpr uint32_t tile_kb = CHUNK * (KP + PAD) * sizeof(T), tile_ub = CHUNK * (VB + PAD) * sizeof(T);
                        mbar_arrive_expect_tx(&s.full[b], 2 * tile_kb + tile_ub);
                        const int y = (int)rowc;
                        tma_load_2d(&s.w[b][0][0], maps.w, hd * KP, y, &s.full[b]);
                        tma_load_2d(&s.k[b][0][0], maps.k, hd * KP, y, &s.full[b]);
                        tma_load_2d(&s.u[b][0][0], maps.u, hd * p.VP + vb * VB, y, &s.full[b]);
                    }
                } else {
                    for (int e = lane; e < CHUNK * VPR; e += 32) {
                        const int r = e / VPR, c = (e % VPR) * 8;
                        const bool ok = r < nc;
                        const int so = r * (KP + PAD) + c, go = ok ? (r * H + hd) * KP + c : 0;
                        cp_async16(&s.w[b][0][0] + so, wsrc + go, ok);
                        cp_async16(&s.k[b][0][0] + so, ksrc + go, ok);
                    }
                    for (int e = lane; e < NUV; e += 32) {
                        const int r = e / (VB / 8), c = (e % (VB / 8)) * 8;
                        const bool ok = r < nc;
                        cp_async16(&s.u[b][0][0] + r * (VB + PAD) + c,
                                   usrc + (ok ? (r * H + hd) * p.VP + vb * VB + c : 0), ok);
                    }
                    if (TMA && lane == 0)
                        mbar_arrive(&s.full[b]); /* FULL's 33rd arrival, no bytes announced */
                }
                for (int r = lane; r < CHUNK; r += 32)
                    cp_async4z(&s.g[b][r], p.gk + (rowc + (r < nc ? r : 0)) * H + hd, r < nc);
                cp_async_mbar_arrive(&s.full[b]);
            }
            cp_async_wait_all();
            return;
        }
    }

    /* state in registers: S[nt] covers rows sr0 + {g, g+8}, cols 8 nt + 2 t4 + {0, 1} */
    float S[SNT][4];
#pragma unroll
    for (int nt = 0; nt < SNT; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int r = sr0 + g + (e >> 1) * 8, c = vb * VB + nt * 8 + 2 * t4 + (e & 1);
            float x = 0.0f;
            if (p.h0 != nullptr && r < p.K && c < p.V)
                x = load_any(p.h0, p.h0_dtype, (((int64_t)i * H + hd) * p.K + r) * p.V + c);
            S[nt][e] = x;
        }

    /* this thread's copies, the same every chunk: row, smem offset and global offset from the
     * chunk's first row (the offsets fit int32: 64 rows x H x 256 < 2^31 for H < 2^17) */
    int lk_row[NLK], lk_smem[NLK], lk_glob[NLK], lu_row[NLU], lu_smem[NLU], lu_glob[NLU];
#pragma unroll
    for (int q = 0; q < (PW ? 0 : NLK); q++) {
        const int e = tid + q * NTH, r = e / VPR, c = (e % VPR) * 8;
        lk_row[q] = r;
        lk_smem[q] = r * (KP + PAD) + c;
        lk_glob[q] = (r * H + hd) * KP + c;
    }
#pragma unroll
    for (int q = 0; q < (PW ? 0 : NLU); q++) { /* NUV < NTH (VB 16 at KP 128; 16, 32 at KP 256): some copy none */
        const int e = tid + q * NTH, r = e / (VB / 8), c = (e % (VB / 8)) * 8;
        lu_row[q] = e < NUV ? r : -1;
        lu_smem[q] = r * (VB + PAD) + c;
        lu_glob[q] = (r * H + hd) * p.VP + vb * VB + c;
    }

    /* Starts the copies of chunk ct into stage b and commits them as one group. */
    auto issue = [&](int ct, int b) {
        const int64_t rowc = bos * p.M + (int64_t)ct * CHUNK;
        const int nc = (int)min((int64_t)CHUNK, len_dp - (int64_t)ct * CHUNK);
        const T *wsrc = static_cast<const T *>(p.w) + rowc * H * KP;
        const T *ksrc = static_cast<const T *>(p.kn) + rowc * H * KP;
        const T *usrc = static_cast<const T *>(p.u) + rowc * H * p.VP;
#pragma unroll
        for (int q = 0; q < NLK; q++) {
            const bool ok = lk_row[q] < nc;
            cp_async16(&s.w[b][0][0] + lk_smem[q], wsrc + (ok ? lk_glob[q] : 0), ok);
            cp_async16(&s.k[b][0][0] + lk_smem[q], ksrc + (ok ? lk_glob[q] : 0), ok);
        }
#pragma unroll
        for (int q = 0; q < NLU; q++) {
            if (NUV % NTH != 0 && lu_row[q] < 0)
                continue;
            const bool ok = lu_row[q] < nc;
            cp_async16(&s.u[b][0][0] + lu_smem[q], usrc + (ok ? lu_glob[q] : 0), ok);
        }
        for (int r = tid; r < CHUNK; r += NTH) {
            if (r < nc)
                cp_async4(&s.g[b][r], p.gk + (rowc + r) * H + hd);
            else
                s.g[b][r] = 0.0f;
        }
        cp_async_commit();
    };

    /* prologue: STAGES - 1 groups in flight (empty groups past the end keep the count uniform) */
#pragma unroll
    for (int c = 0; c < (PW ? 0 : STAGES - 1); c++) {
        if (c < nt_dp)
            issue(c, c);
        else
            cp_async_commit();
    }
    for (int ct = 0; ct < nt_dp; ct++) {
        const int b = ct % STAGES;
        const int nc = (int)min((int64_t)CHUNK, len_dp - (int64_t)ct * CHUNK);
        const bool store_h = (ct % p.M) == 0;
        const int64_t hrow = coff + ct / p.M;
        /* 16-bit state for w S (and the output stage); fp32 chunk states straight from registers */
#pragma unroll
        for (int nt = 0; nt < SNT; nt++)
#pragma unroll
            for (int hh = 0; hh < 2; hh++) {
                const int r = sr0 + g + hh * 8, c = nt * 8 + 2 * t4;
                *reinterpret_cast<uint32_t *>(&s.s[r][c]) = Elem<T>::pack(S[nt][2 * hh], S[nt][2 * hh + 1]);
            }
        if (store_h && p.chunk_states != nullptr && hrow < p.cs_rows)
            store_state_tile(p.chunk_states, p.cs_dtype, S, sr0, vb * VB, p.K, p.V, lane,
                             [&](int r, int c) { return ((hrow * H + hd) * p.K + r) * p.V + c; });
        GDP_STATE_PHASE_MARK(0); /* 16-bit state, chunk states */
        if constexpr (PW) {
            mbar_wait(&s.full[b], (ct / STAGES) & 1);
            GDP_STATE_PHASE_MARK(1); /* waiting for chunk ct's copies */
            bar_sync(BAR_S16, NTH); /* s.s complete */
            GDP_STATE_PHASE_MARK(2); /* barrier */
        } else {
            cp_async_wait<STAGES - 2>();
            GDP_STATE_PHASE_MARK(1); /* waiting for chunk ct's copies */
            __syncthreads(); /* chunk ct landed, s.s complete, every warp done with chunk ct - 1 */
            GDP_STATE_PHASE_MARK(2); /* barrier */
            if (ct + STAGES - 1 < nt_dp)
                issue(ct + STAGES - 1, (ct + STAGES - 1) % STAGES); /* the stage chunk ct - 1 used */
            else
                cp_async_commit();
        }
        GDP_STATE_PHASE_MARK(3); /* next copies issued */
        if (store_h && hrow < p.h_rows) {
            T *hs = static_cast<T *>(p.hs) + ((hrow * H + hd) * KP) * p.VP + vb * VB;
            for (int e = tid; e < KP * (VB / 8); e += NTH) {
                const int r = e / (VB / 8), c = (e % (VB / 8)) * 8;
                *reinterpret_cast<uint4 *>(hs + (int64_t)r * p.VP + c) = *reinterpret_cast<const uint4 *>(&s.s[r][c]);
            }
        }

        GDP_STATE_PHASE_MARK(4); /* chunk-entry state stored */
        /* v_new = u - w S over this warp's 16 x (VB / CGV) piece */
        const float gl = s.g[b][nc - 1];
        if (vnew_warp) {
            float P[VNT][4];
#pragma unroll
            for (int nt = 0; nt < VNT; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    P[nt][e] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < KP; kk += 16) {
                uint32_t a[4];
                frag_a(a, &s.w[b][0][0], KP + PAD, vr0, kk, lane);
                if constexpr (VNT == 1) {
                    uint32_t bb[2];
                    frag_b_kn_x1(bb, &s.s[0][0], VB + PAD, kk, vc0, lane);
                    Elem<T>::mma(P[0], a, bb[0], bb[1]);
                } else {
#pragma unroll
                    for (int pp = 0; pp < VNT / 2; pp++) {
                        uint32_t bb[4];
                        frag_b_kn(bb, &s.s[0][0], VB + PAD, kk, vc0 + pp * 16, lane);
                        Elem<T>::mma(P[2 * pp], a, bb[0], bb[1]);
                        Elem<T>::mma(P[2 * pp + 1], a, bb[2], bb[3]);
                    }
                }
            }
            T *vnew = static_cast<T *>(p.u) + ((bos * p.M + (int64_t)ct * CHUNK) * H + hd) * p.VP + vb * VB;
#pragma unroll
            for (int hh = 0; hh < 2; hh++) {
                const int r = vr0 + g + hh * 8;
                const bool ok = r < nc;
                const float f = ok ? exp2f(gl - s.g[b][r]) : 0.0f;
#pragma unroll
                for (int nt = 0; nt < VNT; nt++) {
                    const int c = vc0 + nt * 8 + 2 * t4;
                    T *up = &s.u[b][r][c];
                    const float v0 = Elem<T>::to_f(up[0]) - P[nt][2 * hh];
                    const float v1 = Elem<T>::to_f(up[1]) - P[nt][2 * hh + 1];
                    if (ok)
                        *reinterpret_cast<uint32_t *>(vnew + (int64_t)r * H * p.VP + c) = Elem<T>::pack(v0, v1);
                    *reinterpret_cast<uint32_t *>(up) = Elem<T>::pack(v0 * f, v1 * f);
                }
            }
        }
        GDP_STATE_PHASE_MARK(5); /* v_new */
        if constexpr (PW)
            bar_sync(BAR_VNEW, NTH); /* decayed v_new complete */
        else
            __syncthreads(); /* decayed v_new complete */
        GDP_STATE_PHASE_MARK(6); /* barrier */

        /* S = 2^gl S + K^T (decayed v_new) */
        state_decay_update<T>(S, exp2f(gl), &s.k[b][0][0], KP + PAD, sr0, nc, &s.u[b][0][0], VB + PAD, 0, lane);
        GDP_STATE_PHASE_MARK(7); /* state update */
        /* this thread's last reads of stage b are done. Every consumer thread arrives (a release
         * of its own reads): lane 0 alone after a __syncwarp orders them too, but racecheck does
         * not follow that chain and reported the producer's refills as races (150 errors);
         * with every thread arriving it reports none, at the same speed (NOTES-chunk.md,
         * seventeenth session). */
        if constexpr (PW) {
            if constexpr (TMA) /* this thread wrote the decayed v_new into stage b's u, which the copy
                                * engine refills next */
                fence_proxy_async_smem();
            mbar_arrive(&s.empty[b]);
        }
    }
    GDP_STATE_PHASE_FLUSH();
    if constexpr (!PW)
        cp_async_wait<0>(); /* no copy may land after the block exits */

    /* final state: the cache slot (in place, cache dtype) or the dense final_state */
    const StateDest d = final_state_dest(p, i, hd);
    if (d.dst != nullptr)
        store_state_tile(d.dst, d.dtype, S, sr0, vb * VB, p.K, p.V, lane,
                         [&](int r, int c) { return d.base + (int64_t)r * p.V + c; });
}

} // namespace

#endif /* GDP_CHUNK_STATE_CUH */
