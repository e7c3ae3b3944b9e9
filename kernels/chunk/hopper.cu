/*
 * hopper.cu: the translation unit of the chunk op's one-pass Hopper kernel (hopper.cuh), compiled
 * for sm_90a alone (CMakeLists.txt: its own object library), and its entry points (hopper.h): the
 * shape test, the segment split's item bound and scratch size, and the launch (one block per
 * sequence and head, or the split's plan, pass 1, fix-up and pass 2). launch.cu takes this path
 * under GDP_CHUNK_PATH=hopper on a compute capability 9.0 device.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "hopper.cuh"
#include "hopper.h"
#include "tensor_map.h"
#include "src/workspace.h"

namespace {

template <typename T, int KP, int VP> constexpr size_t hop_smem_bytes() {
    return sizeof(HopperSmem<T, KP, VP>) + 1024; /* + the alignment of the panels */
}
/* An sm_90 block's dynamic shared memory is at most 227 KB (224,256 bytes at K = V = 128 now): a layout
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
 * item_seg [max_items], seg_first, nseg [N] (int), then entry, fmap, gmap (fp32, extras = max_items -
 * N slots each). total is SIZE_MAX when the sizes overflow. */
struct SplitLayout {
    size_t item_seq, item_seg, seg_first, nseg, entry, fmap, gmap, total;
};
SplitLayout split_layout(const ChunkParams &p, long long max_items) {
    SplitLayout l{};
    size_t cur = 0;
    const int64_t extras = max_items - p.N, kv = (int64_t)p.H * HOP_KP * p.VP, kk = (int64_t)p.H * HOP_KP * HOP_KP;
    const bool ok = gdp_ws_add(&cur, &l.item_seq, max_items, sizeof(int)) &&
                    gdp_ws_add(&cur, &l.item_seg, max_items, sizeof(int)) &&
                    gdp_ws_add(&cur, &l.seg_first, p.N, sizeof(int)) && gdp_ws_add(&cur, &l.nseg, p.N, sizeof(int)) &&
                    gdp_ws_add(&cur, &l.entry, extras * kv, sizeof(float)) &&
                    gdp_ws_add(&cur, &l.fmap, extras * kk, sizeof(float)) &&
                    gdp_ws_add(&cur, &l.gmap, extras * kv, sizeof(float));
    l.total = ok ? gdp_ws_end(cur) : SIZE_MAX;
    return l;
}

template <typename T, int VP, int COPY>
cudaError_t launch_hopper_split(const ChunkParams &p, const HopperMaps &maps, const GdpHopperSplit &split,
                                cudaStream_t stream) {
    const SplitLayout l = split_layout(p, split.max_items);
    unsigned char *ws = static_cast<unsigned char *>(split.ws);
    HopSegPlan sp;
    sp.item_seq = reinterpret_cast<const int *>(ws + l.item_seq);
    sp.item_seg = reinterpret_cast<const int *>(ws + l.item_seg);
    sp.seg_first = reinterpret_cast<const int *>(ws + l.seg_first);
    sp.nseg = reinterpret_cast<const int *>(ws + l.nseg);
    sp.entry = reinterpret_cast<float *>(ws + l.entry);
    sp.fmap = reinterpret_cast<float *>(ws + l.fmap);
    sp.gmap = reinterpret_cast<float *>(ws + l.gmap);
    sp.seg_chunks = split.seg_chunks;
    if (p.N <= 0 || p.H <= 0)
        return cudaSuccess;
    constexpr size_t smem = hop_smem_bytes<T, HOP_KP, VP>();
    constexpr size_t smem_f = hop_smem_bytes<T, HOP_KP, HOP_KP>(); /* F: K x K */
    constexpr size_t smem_fix = sizeof(float) * (size_t)HOP_KP * (HOP_FIX_LD + VP + 4);
    cudaError_t err = cudaFuncSetAttribute(chunk_hopper_seg_pass1_kernel<T, VP, COPY, HOP_MAIN>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (err == cudaSuccess)
        err = cudaFuncSetAttribute(chunk_hopper_seg_pass1_kernel<T, VP, COPY, HOP_MAP_F>,
                                   cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_f);
    if (err == cudaSuccess)
        err = cudaFuncSetAttribute(chunk_hopper_seg_pass1_kernel<T, VP, COPY, HOP_MAP_G>,
                                   cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (err == cudaSuccess)
        err = cudaFuncSetAttribute(chunk_hopper_seg_pass2_kernel<T, VP, COPY>,
                                   cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (err == cudaSuccess)
        err = cudaFuncSetAttribute(hop_fixup_kernel<VP>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_fix);
    if (err != cudaSuccess)
        return err;
    hop_plan_kernel<<<1, HOP_PLAN_THREADS, 0, stream>>>(
        p.cu, p.N, p.M, split.seg_chunks, split.max_items, reinterpret_cast<int *>(ws + l.item_seq),
        reinterpret_cast<int *>(ws + l.item_seg), reinterpret_cast<int *>(ws + l.seg_first),
        reinterpret_cast<int *>(ws + l.nseg));
    if ((err = cudaGetLastError()) != cudaSuccess)
        return err;
    const dim3 items((unsigned)split.max_items, (unsigned)p.H);
    chunk_hopper_seg_pass1_kernel<T, VP, COPY, HOP_MAIN><<<items, HOP_THREADS, smem, stream>>>(p, maps, sp);
    chunk_hopper_seg_pass1_kernel<T, VP, COPY, HOP_MAP_F><<<items, HOP_THREADS, smem_f, stream>>>(p, maps, sp);
    chunk_hopper_seg_pass1_kernel<T, VP, COPY, HOP_MAP_G><<<items, HOP_THREADS, smem, stream>>>(p, maps, sp);
    if ((err = cudaGetLastError()) != cudaSuccess)
        return err;
    hop_fixup_kernel<VP><<<dim3((unsigned)p.N, (unsigned)p.H), HOP_FIX_THREADS, smem_fix, stream>>>(p, sp);
    if ((err = cudaGetLastError()) != cudaSuccess)
        return err;
    chunk_hopper_seg_pass2_kernel<T, VP, COPY><<<items, HOP_THREADS, smem, stream>>>(p, maps, sp);
    return cudaGetLastError();
}

/* The instance for p's K and V; the split at K = 128 only (gdp_chunk_hopper_split_fits). */
template <typename T, int COPY>
cudaError_t launch_hopper_v(const ChunkParams &p, const HopperMaps &maps, const GdpHopperSplit *split,
                            cudaStream_t st) {
    if (split != nullptr && split->seg_chunks > 0 && p.KP == HOP_KP)
        return p.VP == 64 ? launch_hopper_split<T, 64, COPY>(p, maps, *split, st)
                          : launch_hopper_split<T, 128, COPY>(p, maps, *split, st);
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

bool gdp_chunk_hopper_split_fits(const void *chunk_params) {
    return static_cast<const ChunkParams *>(chunk_params)->KP == HOP_KP;
}

long long gdp_chunk_hopper_split_items(long long T, long long N, int M, int seg_chunks) {
    /* sum_i max(1, ceil(E_i / S)) <= sum_i (E_i / S + 1), and E_i <= L_i M / 64 + 1 with sum L_i <= T:
     * at most N + (ceil(T M / 64) + N) / S items */
    const long long expanded = (T * M + CHUNK - 1) / CHUNK + N;
    return N + (expanded + seg_chunks - 1) / seg_chunks;
}

size_t gdp_chunk_hopper_split_bytes(const void *chunk_params, long long max_items) {
    return split_layout(*static_cast<const ChunkParams *>(chunk_params), max_items).total;
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
