/*
 * hopper.cu: the translation unit of the chunk op's one-pass Hopper kernel (hopper.cuh), compiled
 * for sm_90a alone (CMakeLists.txt: its own object library), and its entry points (hopper.h): the
 * shape test, the segment split's segment bound and scratch size, and the launch (one block per
 * sequence and head, or the split's plan, pass 1, fix-up and correction). launch.cu takes this path
 * under GDP_CHUNK_PATH=hopper on a compute capability 9.0 device.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "hopper.cuh"
#include "hopper.h"
#include "hopper_split.cuh"
#include "tensor_map.h"
#include "src/phase.h" /* GDP_CHUNK_STAGE_MARK: the split's launches end its three profile stages */
#include "src/workspace.h"

namespace {

template <typename T, int KP, int VP> constexpr size_t hop_smem_bytes() {
    return sizeof(HopperSmem<T, KP, VP>) + 1024; /* + the alignment of the panels */
}
/* An sm_90 block's dynamic shared memory is at most 227 KB (222,208 bytes at K = V = 128 now): a layout
 * past it would fail only at launch, in cudaFuncSetAttribute. */
static_assert(hop_smem_bytes<__nv_bfloat16, 128, 128>() <= 227u * 1024u &&
                  hop_smem_bytes<__half, 128, 128>() <= 227u * 1024u,
              "the Hopper kernel's shared memory exceeds sm_90's 227 KB a block");

template <typename T, int KP, int VP, int COPY>
cudaError_t launch_hopper(const ChunkParams &p, const HopperMaps &maps, cudaStream_t stream) {
    const size_t smem = hop_smem_bytes<T, KP, VP>();
    cudaError_t err = cudaFuncSetAttribute(chunk_hopper_kernel<T, KP, VP, COPY>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (err != cudaSuccess)
        return err;
    if (p.N > 0 && p.H > 0)
        chunk_hopper_kernel<T, KP, VP, COPY>
            <<<dim3(1u, (unsigned)p.H, (unsigned)p.N), HOP_THREADS, smem, stream>>>(p, maps);
    return cudaGetLastError();
}

/* The split's scratch, carved in order from ws by the chunk workspace's own gdp_ws_add: item_seq,
 * item_seg [max_items], seg_base, nseg [N], slot_seq, slot_seg, slot_fitem [max_slots] (int), then
 * entry, gmap (fp32, max_slots slots each), fmap (fp32, max_items: by F item) and O^F ([T][H][K],
 * 16-bit), for at most max_segs segments
 * (max_items = 2 max_segs - N: a MAIN item each and an F item each past a sequence's first; max_slots
 * = max_segs - N). total is SIZE_MAX when the sizes overflow. */
struct SplitLayout {
    size_t item_seq, item_seg, seg_base, nseg, slot_seq, slot_seg, slot_fitem, entry, gmap, fmap, ofmap, total;
    long long max_items, max_slots;
};
SplitLayout split_layout(const ChunkParams &p, long long max_segs) { /* K = KP = 64 or 128 */
    SplitLayout l{};
    size_t cur = 0;
    l.max_items = 2 * max_segs - p.N;
    l.max_slots = max_segs - p.N;
    const int64_t kv = (int64_t)p.H * p.KP * p.VP, kk = (int64_t)p.H * p.KP * p.KP;
    const bool ok = gdp_ws_add(&cur, &l.item_seq, l.max_items, sizeof(int)) &&
                    gdp_ws_add(&cur, &l.item_seg, l.max_items, sizeof(int)) &&
                    gdp_ws_add(&cur, &l.seg_base, p.N, sizeof(int)) && gdp_ws_add(&cur, &l.nseg, p.N, sizeof(int)) &&
                    gdp_ws_add(&cur, &l.slot_seq, l.max_slots, sizeof(int)) &&
                    gdp_ws_add(&cur, &l.slot_seg, l.max_slots, sizeof(int)) &&
                    gdp_ws_add(&cur, &l.slot_fitem, l.max_slots, sizeof(int)) &&
                    gdp_ws_add(&cur, &l.entry, l.max_slots * kv, sizeof(float)) &&
                    gdp_ws_add(&cur, &l.gmap, l.max_slots * kv, sizeof(float)) &&
                    gdp_ws_add(&cur, &l.fmap, l.max_items * kk, sizeof(float)) &&
                    gdp_ws_add(&cur, &l.ofmap, p.T * p.H * p.KP, 2);
    l.total = ok ? gdp_ws_end(cur) : SIZE_MAX;
    return l;
}

/* The split's launches: the plan, pass 1 (the MAIN items' launch, the F items'), the fix-up, then the
 * outputs' correction, or pass 2 where chunk states are asked (hopper.cuh, "the exact segment split"). */
template <typename T, int KP, int VP, int COPY>
cudaError_t launch_hopper_split(const ChunkParams &p, const HopperMaps &maps, const GdpHopperSplit &split,
                                cudaStream_t stream) {
    const SplitLayout l = split_layout(p, split.max_segs);
    unsigned char *ws = static_cast<unsigned char *>(split.ws);
    int *item_seq = reinterpret_cast<int *>(ws + l.item_seq), *item_seg = reinterpret_cast<int *>(ws + l.item_seg);
    int *seg_base = reinterpret_cast<int *>(ws + l.seg_base), *nseg = reinterpret_cast<int *>(ws + l.nseg);
    int *slot_seq = reinterpret_cast<int *>(ws + l.slot_seq), *slot_seg = reinterpret_cast<int *>(ws + l.slot_seg);
    int *slot_fitem = reinterpret_cast<int *>(ws + l.slot_fitem);
    HopSegPlan sp;
    sp.item_seq = item_seq;
    sp.item_seg = item_seg;
    sp.seg_base = seg_base;
    sp.nseg = nseg;
    sp.slot_seq = slot_seq;
    sp.slot_seg = slot_seg;
    sp.slot_fitem = slot_fitem;
    sp.entry = reinterpret_cast<float *>(ws + l.entry);
    sp.fmap = reinterpret_cast<float *>(ws + l.fmap);
    sp.gmap = reinterpret_cast<float *>(ws + l.gmap);
    sp.ofmap = ws + l.ofmap;
    sp.seg_chunks = split.seg_chunks;
    sp.max_items = (int)l.max_items;
    if (p.N <= 0 || p.H <= 0)
        return cudaSuccess;
    constexpr size_t smem = hop_smem_bytes<T, KP, VP>(), smem_f = hop_smem_bytes<T, KP, KP>();
    constexpr size_t smem_fix = hop_fixup_smem<KP>(), smem_cor = hop_correct_smem<T, KP, VP>();
    const bool with_cs = p.chunk_states != nullptr;
    cudaError_t err = cudaFuncSetAttribute(chunk_hopper_seg_run_kernel<T, KP, VP, COPY, HOP_MAIN>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (err == cudaSuccess)
        err = cudaFuncSetAttribute(chunk_hopper_seg_run_kernel<T, KP, KP, COPY, HOP_MAP_F>,
                                   cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_f);
    if (err == cudaSuccess && with_cs)
        err = cudaFuncSetAttribute(chunk_hopper_seg_pass2_kernel<T, KP, VP, COPY>,
                                   cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (err == cudaSuccess)
        err = cudaFuncSetAttribute(hop_fixup_kernel<KP, VP>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   (int)smem_fix);
    if (err == cudaSuccess && !with_cs)
        err = cudaFuncSetAttribute(hop_correct_kernel<T, KP, VP>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   (int)smem_cor);
    if (err != cudaSuccess)
        return err;
    hop_plan_kernel<<<1, HOP_PLAN_THREADS, 0, stream>>>(p.cu, p.N, p.M, split.seg_chunks, (int)l.max_items,
                                                        (int)l.max_slots, item_seq, item_seg, seg_base, nseg,
                                                        slot_seq, slot_seg, slot_fitem);
    if ((err = cudaGetLastError()) != cudaSuccess)
        return err;
    /* head-fastest grids over the items (hop_grid_item: y up to 65,535, z beyond) */
    const unsigned ny = (unsigned)(l.max_items < 65535 ? l.max_items : 65535);
    const dim3 items((unsigned)p.H, ny, (unsigned)((l.max_items + ny - 1) / ny));
    chunk_hopper_seg_run_kernel<T, KP, VP, COPY, HOP_MAIN><<<items, HOP_THREADS, smem, stream>>>(p, maps, sp);
    /* the F items run K x K whatever V is: one instance a K; a programmatic dependent of the MAIN launch
     * (hopper.cuh, chunk_hopper_seg_run_kernel: its blocks start as the MAIN launch's drain) */
    err = launch_pdl(chunk_hopper_seg_run_kernel<T, KP, KP, COPY, HOP_MAP_F>, items, dim3(HOP_THREADS), smem_f, stream,
                     true, p, maps, sp);
    if (err != cudaSuccess)
        return err;
    GDP_CHUNK_STAGE_MARK(GDP_CHUNK_MARK_SPLIT_RUNS, stream); /* after the F launch: PDL pairs it with MAIN */
    hop_fixup_kernel<KP, VP>
        <<<dim3((unsigned)p.N, (unsigned)p.H, VP / HOP_FIX_COLS), HOP_FIX_THREADS, smem_fix, stream>>>(p, sp);
    if ((err = cudaGetLastError()) != cudaSuccess)
        return err;
    GDP_CHUNK_STAGE_MARK(GDP_CHUNK_MARK_SPLIT_FIXUP, stream);
    if (l.max_slots <= 0) /* no sequence can have a second segment */
        return cudaSuccess;
    if (with_cs) {
        chunk_hopper_seg_pass2_kernel<T, KP, VP, COPY><<<items, HOP_THREADS, smem, stream>>>(p, maps, sp);
    } else {
        const dim3 grid((unsigned)l.max_slots, (unsigned)p.H, hop_correct_blocks_z(split.seg_chunks, p.M));
        hop_correct_kernel<T, KP, VP><<<grid, HOP_COR_THREADS, smem_cor, stream>>>(p, sp);
    }
    if ((err = cudaGetLastError()) != cudaSuccess)
        return err;
    GDP_CHUNK_STAGE_MARK(GDP_CHUNK_MARK_SPLIT_CORRECT, stream);
    return cudaSuccess;
}

/* The instance for p's K and V, unsplit or split. */
template <typename T, int COPY>
cudaError_t launch_hopper_v(const ChunkParams &p, const HopperMaps &maps, const GdpHopperSplit *split,
                            cudaStream_t st) {
    if (split != nullptr && split->seg_chunks > 0) {
        if (p.KP == 64)
            return p.VP == 64 ? launch_hopper_split<T, 64, 64, COPY>(p, maps, *split, st)
                              : launch_hopper_split<T, 64, 128, COPY>(p, maps, *split, st);
        return p.VP == 64 ? launch_hopper_split<T, 128, 64, COPY>(p, maps, *split, st)
                          : launch_hopper_split<T, 128, 128, COPY>(p, maps, *split, st);
    }
    if (p.KP == 64)
        return p.VP == 64 ? launch_hopper<T, 64, 64, COPY>(p, maps, st) : launch_hopper<T, 64, 128, COPY>(p, maps, st);
    return p.VP == 64 ? launch_hopper<T, 128, 64, COPY>(p, maps, st) : launch_hopper<T, 128, 128, COPY>(p, maps, st);
}

/* The copy-engine loads' maps (HopperMaps); false if the driver cannot encode them. */
bool make_hopper_maps(const ChunkParams &p, HopperMaps *m) {
    const int64_t cols = (int64_t)p.H * p.KP;
    return encode_tile_map(m->k, p.k, p.T * p.M, cols, WG_PANEL_COLS, CHUNK, CU_TENSOR_MAP_SWIZZLE_128B) &&
           encode_tile_map(m->v, p.v, p.T * p.M, (int64_t)p.H * p.VP, WG_PANEL_COLS, CHUNK,
                           CU_TENSOR_MAP_SWIZZLE_128B) &&
           encode_tile_map(m->q, p.q, p.T, cols, WG_PANEL_COLS, CHUNK, CU_TENSOR_MAP_SWIZZLE_128B);
}

} // namespace

bool gdp_chunk_hopper_fits(const void *chunk_params) {
    const ChunkParams &p = *static_cast<const ChunkParams *>(chunk_params);
    return (p.K == 64 || p.K == 128) && p.KP == p.K && (p.V == 64 || p.V == 128) && p.VP == p.V && p.q_vec && p.k_vec &&
           p.v_vec && p.o_vec && p.T * p.M < ((int64_t)1 << 31); /* a sequence's expanded rows in 32 bits (hop_chunk) */
}

long long gdp_chunk_hopper_split_segments(long long T, long long N, int M, int seg_chunks) {
    /* sum_i max(1, ceil(E_i / S)) <= sum_i (E_i / S + 1), and E_i <= L_i M / 64 + 1 with sum L_i <= T:
     * at most N + (ceil(T M / 64) + N) / S segments */
    const long long expanded = (T * M + CHUNK - 1) / CHUNK + N;
    return N + (expanded + seg_chunks - 1) / seg_chunks;
}

size_t gdp_chunk_hopper_split_bytes(const void *chunk_params, long long max_segs) {
    return split_layout(*static_cast<const ChunkParams *>(chunk_params), max_segs).total;
}

cudaError_t gdp_chunk_hopper_launch(const void *chunk_params, bool bf16, bool tma, const GdpHopperSplit *split,
                                    cudaStream_t stream) {
    const ChunkParams &p = *static_cast<const ChunkParams *>(chunk_params);
    HopperMaps maps{};
    if (tma && make_hopper_maps(p, &maps)) /* a driver without the encoder: the threads' copies */
        return bf16 ? launch_hopper_v<__nv_bfloat16, HOP_COPY_TMA>(p, maps, split, stream)
                    : launch_hopper_v<__half, HOP_COPY_TMA>(p, maps, split, stream);
    return bf16 ? launch_hopper_v<__nv_bfloat16, HOP_COPY_THREADS>(p, maps, split, stream)
                : launch_hopper_v<__half, HOP_COPY_THREADS>(p, maps, split, stream);
}
