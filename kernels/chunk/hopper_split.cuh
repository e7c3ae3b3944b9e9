/*
 * hopper_split.cuh: the exact segment split of the one-pass Hopper kernel (hopper.cuh's hop_run over
 * segments of a long sequence, kernels/NOTES-chunk.md, "Exact segments" and twenty-seventh session):
 * the plan of work items from cu_seqlens on the device, pass 1's MAIN and F runs, the fix-up scan of
 * the entering states, and the outputs' correction (or, with chunk states, pass 2). Included by
 * hopper.cu after hopper.cuh; compiled for sm_90a only.
 */
#ifndef GDP_CHUNK_HOPPER_SPLIT_CUH
#define GDP_CHUNK_HOPPER_SPLIT_CUH

#include "hopper.cuh"
#include "kernels/mma_tf32.cuh" /* the fix-up's products */
#include "kernels/pdl.cuh"

namespace {

/* ---- the exact segment split (kernels/NOTES-chunk.md, "Exact segments" and twenty-seventh session) ----
 * Sequence i's expanded chunks are cut into nseg[i] segments: the first 2 S chunks long, then S each
 * (S = seg_chunks; the last shorter; hop_seg_range). The first segment is twice as long because it
 * has no F item: its MAIN item runs while the SMs run two shorter items each, so a sequence's chain
 * is cut into fewer pieces for the same time (kernels/NOTES-chunk.md, thirty-ninth session).
 * Every segment runs once as a MAIN item: segment 0 from the initial state (its outputs are the op's,
 * its end state S_1 or the final state), a segment j >= 1 from zero (its end state is the map G_j, its
 * outputs o^G, written into o). Every segment j >= 1 also runs as an F item: the map F_j and the
 * outputs' part O^F (K columns a token). The two kinds are independent; each has its launch (both
 * bodies in one kernel spilled up to 576 bytes). Then
 * S_(j+1) = F_j S_j + G_j in fp32 (hop_fixup_kernel; the last is the final state) and o = o^G + O^F S_j
 * over segment j's tokens (hop_correct_kernel): each sequence's chain is run about twice in parallel
 * pieces instead of once in one piece. With chunk states asked, segments j >= 1 instead run again as
 * MAIN from S_j (pass 2), writing their outputs and chunk states over the MAIN items' and the final
 * state.
 * A segment j >= 1 of sequence i has slot e = seg_base[i] - i + j - 1 (seg_base: the segments of the
 * sequences before i) for S_j (entry) and G_j (gmap), fp32 [e][H][K][V]; slot_seq[e], slot_seg[e] name
 * it (-1 past the last), slot_fitem[e] its F item t, whose map F_j is at fmap [t][H][K][K] (K = 64 or
 * 128, as the kernel's; indexed by
 * the item, the F run's end address comes from its block index after the run: a slot's base computed
 * before it was held through the run and spilled). Items t: item_seq[t] = i (-1 past the last),
 * item_seg[t] = 2 j + 1 for F, 2 j for MAIN; the full-length segments' items first, then the short
 * last ones, so that no long item starts late. O^F (ofmap) is [T][H][K] in the inputs' type. */
struct HopSegPlan {
    const int *item_seq, *item_seg, *seg_base, *nseg, *slot_seq, *slot_seg, *slot_fitem;
    float *entry, *fmap, *gmap;
    void *ofmap;
    int seg_chunks;
    int max_items; /* the item arrays' length: a grid's blocks past it (its last z slice) have no item */
};
__device__ __forceinline__ int64_t hop_slot(const HopSegPlan &sp, int i, int j) {
    return (int64_t)sp.seg_base[i] - i + j - 1;
}
__device__ __forceinline__ int64_t hop_slot_base(const ChunkParams &p, const HopSegPlan &sp, int i, int j, int hd,
                                                 int cols) {
    return (hop_slot(sp, i, j) * p.H + hd) * p.K * cols;
}

/* Segment j's expanded chunks [cb, ce) of a sequence of C, for segments of S: the first 2 S, then S each. */
__host__ __device__ __forceinline__ void hop_seg_range(int j, int S, int C, int &cb, int &ce) {
    cb = j == 0 ? 0 : (j + 1) * S;
    ce = min((j + 2) * S, C);
}

/* Work item t of the split: sequence i (< 0 past the last item), its segment j of ns, that segment's
 * chunks [cb, ce), and whether it is the F item. */
struct HopItem {
    int i, j, ns, cb, ce;
    bool f;
};
__device__ __forceinline__ HopItem hop_item(const ChunkParams &p, const HopSegPlan &sp, int t) {
    HopItem it{t < sp.max_items ? sp.item_seq[t] : -1, 0, 0, 0, 0, false};
    if (it.i < 0)
        return it;
    const int code = sp.item_seg[t];
    it.j = code >> 1;
    it.f = (code & 1) != 0;
    it.ns = sp.nseg[it.i];
    hop_seg_range(it.j, sp.seg_chunks, hop_seq_chunks(p, it.i), it.cb, it.ce);
    return it;
}

/* The split's grids: head blockIdx.x of item blockIdx.y + gridDim.y blockIdx.z (head-fastest, so the
 * blocks start in the items' order; both special registers, which the long run reads again for free
 * where a computed head would hold a register: the item-major x of an earlier version spilled). */
__device__ __forceinline__ int hop_grid_item() { return (int)(blockIdx.y + gridDim.y * blockIdx.z); }

/* Developer hook: kernels/dev/chunk_stages.cu (--split-timeline) defines GDP_HOPPER_ITEM_MARK to record, for
 * every block of pass 1 that runs an item, its SM, its chunks and the global timer at its start (thread 0)
 * and its end (the first state thread: the aux warpgroup leaves hop_run early); the library's is empty. */
#ifndef GDP_HOPPER_ITEM_MARK
#define GDP_HOPPER_ITEM_MARK(kind, rec, chunks, begin) ((void)0)
#endif
/* The same lab's hook for the two launches after pass 1 (--split-timeline): GDP_HOPPER_TAIL_MARK(kind, rec,
 * slot, tag) records the global timer of block rec (its linear index in the grid) of the fix-up (kind 0: slot 0
 * at its start, slot j after its step j; tag its sequence) and of the correction (kind 1: slot 0 at its start,
 * 1 when S_j is in and its tiles begin, 2 at its end; tag its slot e); the library's is empty. */
#ifndef GDP_HOPPER_TAIL_MARK
#define GDP_HOPPER_TAIL_MARK(kind, rec, slot, tag) ((void)0)
#endif
__device__ __forceinline__ int hop_block_linear() {
    return (int)((blockIdx.x * gridDim.y + blockIdx.y) * gridDim.z + blockIdx.z);
}

/* Pass 1, one launch a kind (HOP_MAIN or HOP_MAP_F, whose instance takes VP = KP): its items (above);
 * the other kind's blocks exit. The F launch is a programmatic dependent of the MAIN launch (the two
 * are independent): every MAIN block lets it start at once (griddepcontrol.launch_dependents), so the
 * F blocks fill the SMs the MAIN launch's last wave leaves (on the mixed batch about a quarter of pass
 * 1). So that the F grid still completes after the MAIN grid (the fix-up, launched plainly after it,
 * reads both, and so does whatever the caller runs next), every F block that runs waits for the MAIN
 * grid's completion and flush (griddepcontrol.wait) after its run, and so does the F grid's last
 * block whatever its item: at least one block of it waits, and the blocks that leave at once hold no
 * SM. Both instructions are no-ops in a launch without the attribute. */
template <typename T, int KP, int VP, int COPY, int KIND>
__global__ void __launch_bounds__(HOP_THREADS, 1)
    chunk_hopper_seg_run_kernel(const ChunkParams p, const __grid_constant__ HopperMaps maps, const HopSegPlan sp) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ unsigned char smem_raw[];
    if constexpr (KIND == HOP_MAIN)
        pdl_trigger();
    const int hd = blockIdx.x;
    const HopItem it = hop_item(p, sp, hop_grid_item());
    const int i = it.i, j = it.j;
    if (i < 0 || it.f != (KIND == HOP_MAP_F)) {
        if (KIND == HOP_MAP_F && blockIdx.x + 1 == gridDim.x && blockIdx.y + 1 == gridDim.y && blockIdx.z + 1 == gridDim.z)
            pdl_wait();
        return;
    }
    if (threadIdx.x == 0)
        GDP_HOPPER_ITEM_MARK(KIND, hop_grid_item() * (int)gridDim.x + hd, it.ce - it.cb, 1);
    if constexpr (KIND == HOP_MAP_F) {
        hop_run<T, KP, KP, COPY, HOP_MAP_F>(
            p, maps, smem_raw, i, hd, it.cb, it.ce, HopStateSrc{nullptr, 0, 0},
            StateDest{sp.fmap, GDP_DTYPE_FP32, ((int64_t)hop_grid_item() * p.H + hd) * KP * KP},
            static_cast<T *>(sp.ofmap));
        if (threadIdx.x == HOP_AUX_THREADS)
            GDP_HOPPER_ITEM_MARK(KIND, hop_grid_item() * (int)gridDim.x + hd, it.ce - it.cb, 0);
        pdl_wait(); /* the aux warpgroup left hop_run early: every thread waits, none stores after */
    } else {
        const StateDest end = j > 0         ? StateDest{sp.gmap, GDP_DTYPE_FP32, hop_slot_base(p, sp, i, j, hd, VP)}
                              : it.ns == 1 ? final_state_dest(p, i, hd)
                                           : StateDest{sp.entry, GDP_DTYPE_FP32, hop_slot_base(p, sp, i, 1, hd, VP)};
        hop_run<T, KP, VP, COPY, HOP_MAIN>(p, maps, smem_raw, i, hd, it.cb, it.ce,
                                           j == 0 ? hop_h0(p, i, hd) : HopStateSrc{nullptr, 0, 0}, end, nullptr);
        if (threadIdx.x == HOP_AUX_THREADS)
            GDP_HOPPER_ITEM_MARK(KIND, hop_grid_item() * (int)gridDim.x + hd, it.ce - it.cb, 0);
    }
#endif
}

/* Pass 2, only with chunk states asked (after hop_fixup_kernel): the MAIN items of segments j >= 1
 * again, from their entering states, over the outputs and chunk states of pass 1; the last segment's
 * end is the final state (the fix-up then leaves it: with no end state this kernel spilled). */
template <typename T, int KP, int VP, int COPY>
__global__ void __launch_bounds__(HOP_THREADS, 1)
    chunk_hopper_seg_pass2_kernel(const ChunkParams p, const __grid_constant__ HopperMaps maps, const HopSegPlan sp) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ unsigned char smem_raw[];
    const int hd = blockIdx.x;
    const HopItem it = hop_item(p, sp, hop_grid_item());
    if (it.i < 0 || it.j == 0 || it.f)
        return;
    const HopStateSrc init{sp.entry, GDP_DTYPE_FP32, hop_slot_base(p, sp, it.i, it.j, hd, VP)};
    hop_run<T, KP, VP, COPY, HOP_MAIN>(p, maps, smem_raw, it.i, hd, it.cb, it.ce, init,
                                       it.j == it.ns - 1 ? final_state_dest(p, it.i, hd) : StateDest{nullptr, 0, 0},
                                       nullptr);
#endif
}

/* An exclusive scan of x over the block (HOP_PLAN_THREADS threads; warp_sums: HOP_PLAN_THREADS / 32
 * ints of shared memory); total gets the block's sum. Every thread calls it. */
constexpr int HOP_PLAN_THREADS = 1024;
__device__ __forceinline__ int hop_block_scan(int x, int *warp_sums, int &total) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int inc = x;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
        const int y = __shfl_up_sync(0xffffffffu, inc, d);
        if (lane >= d)
            inc += y;
    }
    if (lane == 31)
        warp_sums[warp] = inc;
    __syncthreads();
    if (warp == 0) {
        int w = warp_sums[lane];
#pragma unroll
        for (int d = 1; d < 32; d <<= 1) {
            const int y = __shfl_up_sync(0xffffffffu, w, d);
            if (lane >= d)
                w += y;
        }
        warp_sums[lane] = w; /* inclusive over the warps */
    }
    __syncthreads();
    const int excl = (warp > 0 ? warp_sums[warp - 1] : 0) + inc - x;
    total = warp_sums[HOP_PLAN_THREADS / 32 - 1];
    __syncthreads(); /* every thread has read warp_sums before the next scan writes it */
    return excl;
}

/* Sequence i's segments (hop_seg_range): ns in all, full of them at their whole length (2 S the first,
 * S the others; the rest, at most one and the last, shorter). */
__device__ __forceinline__ void hop_plan_counts(const int32_t *cu, int i, int M, int seg_chunks, int &ns, int &full) {
    const int64_t nexp = (((int64_t)cu[i + 1] - cu[i]) * M + CHUNK - 1) / CHUNK, S = seg_chunks;
    ns = nexp <= 2 * S ? 1 : (int)(1 + (nexp - 2 * S + S - 1) / S);
    full = nexp < 2 * S ? 0 : (int)(nexp / S - 1);
}

/* The plan of the split, from cu_seqlens on the device (no host sync; one block of 1024 threads):
 * nseg[i] from hop_plan_counts (a sequence of no token still has its MAIN item: its final state is its
 * initial state), seg_base by a block scan, the items (full-length
 * ones by one scan, after them the short ones by another) and the slots; -1 in item_seq and
 * slot_seq past the last of max_items and max_slots. */
__global__ void __launch_bounds__(HOP_PLAN_THREADS)
    hop_plan_kernel(const int32_t *cu, int N, int M, int seg_chunks, int max_items, int max_slots, int *item_seq,
                    int *item_seg, int *seg_base, int *nseg, int *slot_seq, int *slot_seg, int *slot_fitem) {
    __shared__ int warp_sums[HOP_PLAN_THREADS / 32];
    const int tid = threadIdx.x;
    for (int t = tid; t < max_items; t += HOP_PLAN_THREADS) {
        item_seq[t] = -1;
        item_seg[t] = 0;
    }
    for (int e = tid; e < max_slots; e += HOP_PLAN_THREADS) {
        slot_seq[e] = -1;
        slot_seg[e] = 0;
        slot_fitem[e] = 0;
    }
    /* the full-length items of all sequences come first: their count */
    int full_items = 0;
    for (int base = 0; base < N; base += HOP_PLAN_THREADS) {
        int ns = 0, full = 0, sum;
        if (base + tid < N)
            hop_plan_counts(cu, base + tid, M, seg_chunks, ns, full);
        hop_block_scan(full + max(full - 1, 0), warp_sums, sum); /* MAIN j < full, F 1 <= j < full */
        full_items += sum;
    }
    __syncthreads(); /* the item and slot markers above are written before any item below */
    int seg_carry = 0, full_carry = 0, short_carry = 0;
    for (int base = 0; base < N; base += HOP_PLAN_THREADS) {
        const int i = base + tid;
        int ns = 0, full = 0, sum;
        if (i < N)
            hop_plan_counts(cu, i, M, seg_chunks, ns, full);
        const bool has_short = ns > full;
        const int nfull = full + max(full - 1, 0), nshort = has_short ? (ns > 1 ? 2 : 1) : 0;
        const int sb = seg_carry + hop_block_scan(ns, warp_sums, sum);
        seg_carry += sum;
        const int fpos = full_carry + hop_block_scan(nfull, warp_sums, sum);
        full_carry += sum;
        const int spos = full_items + short_carry + hop_block_scan(nshort, warp_sums, sum);
        short_carry += sum;
        if (i >= N)
            continue;
        seg_base[i] = sb;
        nseg[i] = ns;
        const auto put = [&](int t, int code) {
            if (t < max_items) {
                item_seq[t] = i;
                item_seg[t] = code;
            }
        };
        for (int j = 0; j < full; j++)
            put(fpos + j, 2 * j);
        if (has_short)
            put(spos, 2 * (ns - 1));
        for (int j = 1; j < ns; j++) { /* the F items, and the slots */
            const int t = j < full ? fpos + full + j - 1 : spos + 1;
            put(t, 2 * j + 1);
            const int e = sb - i + j - 1;
            if (e < max_slots) {
                slot_seq[e] = i;
                slot_seg[e] = j;
                slot_fitem[e] = t;
            }
        }
    }
}

/* The fix-up scan of the split, one block of 256 threads per (sequence, head, HOP_FIX_COLS value columns):
 * S_(j+1) = F_j S_j + G_j for j = 1 .. nseg - 1 in order, in fp32, from S_1 (segment 0's end) to the
 * entering states of segments 2 .. nseg - 1 and, last, the sequence's final state (its slot or
 * final_state, in its dtype; nothing for a -1 slot; with chunk states asked pass 2 writes it instead).
 * A column block needs only its own columns of S_j, so the blocks of one sequence and head run side
 * by side. The product runs on the tensor cores (mma.sync m16n8k8, tf32, fp32 sums): F_j and S_j each
 * split into a tf32 high part and the rest, three mmas a tile (hi hi, hi lo, lo hi; the dropped lo lo
 * is about 2^-22 of the product), a warp owning 16 rows of F_j and HOP_FIX_COLS / CG of the block's columns, in k
 * order from 0, then G_j added (deterministic). F_j (64 KB at K = 128, written by pass 1, read from L2)
 * comes into registers one step ahead, so its latency runs under the previous step's product, and lands
 * in shared memory row-major with rows padded to a bank offset of 4 (a fragment's 32 words in 32 banks).
 * Why not fp32 FMAs (the form until the fifty-second session, a thread's K / 32 x 2 tile over k, eight
 * FMAs a k against one vector read of F and one of S, shared by eight and four lanes): its steps took
 * about 5 us on the H100 (49 us for the 8 steps of 1 x 16384, 39.5 for the mixed batch's 3 at two blocks
 * an SM) where its FMAs alone are about 1 us; the tensor cores take a tenth of its instructions a step
 * (kernels/NOTES-chunk.md, fifty-second session). The form before that read F_j by a scalar loop whose
 * every load waited for the one before (about 14 us a step, thirty-ninth session). */
constexpr int HOP_FIX_THREADS = 256, HOP_FIX_COLS = 16;
template <int KP> struct HopFixGeom {
    static constexpr int FLD = KP + 4;                /* F_j's row stride (floats): a0..a3 at bank 4 g + t4 */
    static constexpr int SLD = HOP_FIX_COLS + 8;      /* S_j's row stride: b0, b1 at bank SLD t4 + g, mod 32 */
    static constexpr int RB = KP / 16;                /* 16-row blocks of F_j                              */
    static constexpr int CG = HOP_FIX_THREADS / 32 / RB; /* warps a row block: column groups              */
    static constexpr int NT = HOP_FIX_COLS / 8 / CG;  /* 8-column tiles a warp                             */
    static constexpr int NF4 = KP * KP / 4 / HOP_FIX_THREADS; /* F_j's float4 a thread                   */
    static_assert(RB * CG == HOP_FIX_THREADS / 32 && NT * CG * 8 == HOP_FIX_COLS, "the warps' tiling");
};
template <int KP> constexpr size_t hop_fixup_smem() {
    using G = HopFixGeom<KP>;
    return sizeof(float) * ((size_t)KP * G::FLD + 2 * (size_t)KP * G::SLD);
}
template <int KP, int VP>
__global__ void __launch_bounds__(HOP_FIX_THREADS) hop_fixup_kernel(const ChunkParams p, const HopSegPlan sp) {
    using G = HopFixGeom<KP>;
    constexpr int FLD = G::FLD, SLD = G::SLD, NT = G::NT, NF4 = G::NF4;
    extern __shared__ __align__(16) float fix_smem[];
    float *Fs = fix_smem;      /* [KP][FLD]: F_j                                  */
    float *Sb = Fs + KP * FLD; /* [2][KP][SLD]: the block's columns of S_j, S_(j+1) */
    const int i = blockIdx.x, hd = blockIdx.y, cbase = blockIdx.z * HOP_FIX_COLS, tid = threadIdx.x;
    const int ns = sp.nseg[i];
    if (ns < 2)
        return; /* one segment: its run wrote the final state */
    if (tid == 0)
        GDP_HOPPER_TAIL_MARK(0, hop_block_linear(), 0, i);
    const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
    const int row0 = 16 * (warp % G::RB), col0 = 8 * NT * (warp / G::RB); /* the warp's rows and (block) columns */
    {
        const float *s1 = sp.entry + hop_slot_base(p, sp, i, 1, hd, VP);
        for (int e = tid; e < KP * HOP_FIX_COLS; e += HOP_FIX_THREADS)
            Sb[(e / HOP_FIX_COLS) * SLD + e % HOP_FIX_COLS] = s1[(e / HOP_FIX_COLS) * VP + cbase + e % HOP_FIX_COLS];
    }
    /* float4 q of the thread: row e / (KP / 4), columns 4 (e % (KP / 4)) .. + 3 of F_j (e = tid + 256 q): a
     * warp's lanes read and store whole rows, 16 bytes each */
    float4 fr[NF4];
    const auto load_f = [&](int j) {
        const float4 *f = reinterpret_cast<const float4 *>(
            sp.fmap + ((int64_t)sp.slot_fitem[hop_slot(sp, i, j)] * p.H + hd) * KP * KP);
#pragma unroll
        for (int q = 0; q < NF4; q++)
            fr[q] = f[tid + HOP_FIX_THREADS * q];
    };
    load_f(1);
    const StateDest fin = p.chunk_states != nullptr ? StateDest{nullptr, 0, 0} : final_state_dest(p, i, hd);
    for (int j = 1; j < ns; j++) {
        const float *Scur = Sb + ((j - 1) & 1) * KP * SLD;
        float *Snext = Sb + (j & 1) * KP * SLD;
#pragma unroll
        for (int q = 0; q < NF4; q++) { /* every read of F_(j-1) is done: the last step's closing barrier */
            const int e = tid + HOP_FIX_THREADS * q;
            *reinterpret_cast<float4 *>(Fs + (e / (KP / 4)) * FLD + 4 * (e % (KP / 4))) = fr[q];
        }
        if (j + 1 < ns)
            load_f(j + 1); /* in flight under this step's product */
        const float *gm = sp.gmap + hop_slot_base(p, sp, i, j, hd, VP);
        float2 gv[NT][2]; /* G_j at the accumulators' places: rows g and g + 8, columns 2 t4, + 1 */
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int hh = 0; hh < 2; hh++)
                gv[nt][hh] = *reinterpret_cast<const float2 *>(gm + (int64_t)(row0 + g + 8 * hh) * VP + cbase + col0 +
                                                                8 * nt + 2 * t4);
        __syncthreads(); /* F_j and S_j in */
        float acc[NT][4];
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int x = 0; x < 4; x++)
                acc[nt][x] = 0.0f;
        const float *fa = Fs + (row0 + g) * FLD + t4, *sbk = Scur + t4 * SLD + col0 + g;
#pragma unroll 4
        for (int k0 = 0; k0 < KP; k0 += 8) {
            uint32_t ah[4], al[4]; /* rows g, g + 8 at column t4, then at t4 + 4 */
            mma_tf32_split(fa[k0], ah[0], al[0]);
            mma_tf32_split(fa[k0 + 8 * FLD], ah[1], al[1]);
            mma_tf32_split(fa[k0 + 4], ah[2], al[2]);
            mma_tf32_split(fa[k0 + 8 * FLD + 4], ah[3], al[3]);
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                uint32_t bh0, bl0, bh1, bl1; /* S_j rows k0 + t4 and k0 + t4 + 4 at column 8 nt + g */
                mma_tf32_split(sbk[k0 * SLD + 8 * nt], bh0, bl0);
                mma_tf32_split(sbk[(k0 + 4) * SLD + 8 * nt], bh1, bl1);
                mma_tf32(acc[nt], al[0], al[1], al[2], al[3], bh0, bh1);
                mma_tf32(acc[nt], ah[0], ah[1], ah[2], ah[3], bl0, bl1);
                mma_tf32(acc[nt], ah[0], ah[1], ah[2], ah[3], bh0, bh1);
            }
        }
        float *next = j + 1 < ns ? sp.entry + hop_slot_base(p, sp, i, j + 1, hd, VP) : nullptr;
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int hh = 0; hh < 2; hh++) {
                const int r = row0 + g + 8 * hh, cc = col0 + 8 * nt + 2 * t4;
                const float2 v = make_float2(acc[nt][2 * hh] + gv[nt][hh].x, acc[nt][2 * hh + 1] + gv[nt][hh].y);
                const int64_t e = (int64_t)r * VP + cbase + cc;
                if (next != nullptr)
                    *reinterpret_cast<float2 *>(next + e) = v;
                else if (fin.dst != nullptr) {
                    store_any(fin.dst, fin.dtype, fin.base + e, v.x);
                    store_any(fin.dst, fin.dtype, fin.base + e + 1, v.y);
                }
                *reinterpret_cast<float2 *>(Snext + r * SLD + cc) = v;
            }
        __syncthreads(); /* every read of F_j done; S_(j+1) in */
        if (tid == 0)
            GDP_HOPPER_TAIL_MARK(0, hop_block_linear(), j, i);
    }
}

/* The outputs' correction of the split: o += O^F S_j over the tokens of segment j >= 1 (those whose
 * last copy lies in its chunks; o holds o^G from pass 1), one block of four warps per (slot, head,
 * HOP_COR_TILES tiles of 64 tokens): S_j rounded to T once (as the kernel's own S16), then per tile
 * O^F's rows and o^G's by cp.async into shared memory, two tiles deep (the next tile's copies in
 * flight under this tile's product), the product on mma.sync with fp32 sums, o^G added in place and
 * the sum rounded once, then the tile's rows stored by whole 16-byte vectors. The first form loaded a
 * tile only when the one before was done and read-modify-wrote o by 4-byte accesses straight from the
 * accumulators (112 us on 1 x 16384 on the H100, about twice its bytes' time; thirty-ninth session). Eight
 * tiles a block (S_j read and rounded once for 512 tokens): 1 x 16384 80.8 -> 73.9 us, the mixed batch 41.4 ->
 * 35.0 against four; sixteen lost on the mixed batch (57.2: too few blocks). */
constexpr int HOP_COR_THREADS = 128, HOP_COR_TILES = 8;
template <typename T, int KP, int VP> struct HopCorrectSmem {
    T s16[KP][VP + PAD];      /* S_j                           */
    T of[2][CHUNK][KP + PAD]; /* O^F's rows of a tile, 2 deep  */
    T og[2][CHUNK][VP + PAD]; /* o's rows of a tile: o^G, then o */
};
template <typename T, int KP, int VP> constexpr size_t hop_correct_smem() { return sizeof(HopCorrectSmem<T, KP, VP>); }
/* The correction's grid z for segments of seg_chunks expanded chunks: at most seg_chunks 64 / M + 1
 * tokens a corrected segment (j >= 1; one token straddling its start), HOP_COR_TILES tiles of 64 a block. */
inline unsigned hop_correct_blocks_z(int seg_chunks, int M) {
    const long long tiles = ((long long)seg_chunks * CHUNK / M + 1 + CHUNK - 1) / CHUNK;
    return (unsigned)((tiles + HOP_COR_TILES - 1) / HOP_COR_TILES);
}
template <typename T, int KP, int VP>
__global__ void __launch_bounds__(HOP_COR_THREADS) hop_correct_kernel(const ChunkParams p, const HopSegPlan sp) {
    extern __shared__ __align__(16) unsigned char cor_smem[];
    HopCorrectSmem<T, KP, VP> &s = *reinterpret_cast<HopCorrectSmem<T, KP, VP> *>(cor_smem);
    const int e = blockIdx.x, hd = blockIdx.y, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int i = sp.slot_seq[e];
    if (i < 0)
        return;
    const int j = sp.slot_seg[e], H = p.H, M = p.M;
    const int64_t bos = p.cu[i];
    const int len = (int)((int64_t)p.cu[i + 1] - bos);
    int cb, ce;
    hop_seg_range(j, sp.seg_chunks, hop_seq_chunks(p, i), cb, ce);
    const HopChunk first = hop_chunk(cb, len, M), last = hop_chunk(ce - 1, len, M);
    const int tb = first.tf + (int)blockIdx.z * HOP_COR_TILES * CHUNK;      /* the block's tokens [tb, te) */
    const int te = min(last.tf + last.nq, tb + HOP_COR_TILES * CHUNK);
    if (tb >= te)
        return;
    if (tid == 0)
        GDP_HOPPER_TAIL_MARK(1, hop_block_linear(), 0, e);
    const int ntiles = (te - tb + CHUNK - 1) / CHUNK;
    T *o = static_cast<T *>(p.o);
    const T *ofm = static_cast<const T *>(sp.ofmap);
    const auto issue_tile = [&](int t) { /* tile t's rows of O^F and o into buffer t % 2, one cp.async group */
        const int t0 = tb + t * CHUNK, rows = min(CHUNK, te - t0);
        tile_async<T, HOP_COR_THREADS>(&s.of[t & 1][0][0], KP + PAD, ofm + ((bos + t0) * H + hd) * KP, (int64_t)H * KP,
                                       rows, KP, KP, tid);
        tile_async<T, HOP_COR_THREADS>(&s.og[t & 1][0][0], VP + PAD, o + ((bos + t0) * H + hd) * VP, (int64_t)H * VP,
                                       rows, VP, VP, tid);
        cp_async_commit();
    };
    issue_tile(0);
    const float *sj = sp.entry + hop_slot_base(p, sp, i, j, hd, VP);
    for (int x = tid; x < KP * VP / 4; x += HOP_COR_THREADS) {
        const float4 v = reinterpret_cast<const float4 *>(sj)[x];
        const int r = (4 * x) / VP, c = (4 * x) % VP;
        uint32_t *d = reinterpret_cast<uint32_t *>(&s.s16[r][c]);
        d[0] = Elem<T>::pack(v.x, v.y);
        d[1] = Elem<T>::pack(v.z, v.w);
    }
    const int g = lane >> 2, t4 = lane & 3;
    if (tid == 0)
        GDP_HOPPER_TAIL_MARK(1, hop_block_linear(), 1, e);
    for (int t = 0; t < ntiles; t++) {
        const int t0 = tb + t * CHUNK, rows = min(CHUNK, te - t0), b = t & 1;
        __syncthreads(); /* the stores of tile t - 1 have read buffer (t + 1) % 2 */
        if (t + 1 < ntiles) {
            issue_tile(t + 1);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads(); /* tile t's rows in (and S_j, at the first) */
        float acc[VP / 8][4];
        zero_tiles(acc);
        mma_rows_kn<T, KP, VP / 8>(acc, &s.of[b][0][0], KP + PAD, 16 * warp, &s.s16[0][0], VP + PAD, 0, lane);
#pragma unroll
        for (int hh = 0; hh < 2; hh++) {
            const int r = 16 * warp + g + 8 * hh; /* rows past the tile's end: zeros, never stored */
#pragma unroll
            for (int nt = 0; nt < VP / 8; nt++) {
                uint32_t *at = reinterpret_cast<uint32_t *>(&s.og[b][r][8 * nt + 2 * t4]);
                const T *x = reinterpret_cast<const T *>(at);
                *at = Elem<T>::pack(Elem<T>::to_f(x[0]) + acc[nt][2 * hh], Elem<T>::to_f(x[1]) + acc[nt][2 * hh + 1]);
            }
        }
        __syncthreads(); /* the tile's sums in */
        constexpr int VPR = VP / 8; /* 16-byte vectors a row */
        for (int x = tid; x < rows * VPR; x += HOP_COR_THREADS) {
            const int r = x / VPR, c = (x % VPR) * 8;
            *reinterpret_cast<uint4 *>(o + ((bos + t0 + r) * H + hd) * VP + c) =
                *reinterpret_cast<const uint4 *>(&s.og[b][r][c]);
        }
    }
    if (tid == 0)
        GDP_HOPPER_TAIL_MARK(1, hop_block_linear(), 2, e);
}

} // namespace

#endif /* GDP_CHUNK_HOPPER_SPLIT_CUH */
