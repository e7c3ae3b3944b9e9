/*
 * hopper.h: the entry points of kernels/chunk/hopper.cu, the chunk op's one-pass Hopper kernel
 * (hopper.cuh), for launch.cu. hopper.cu is its own translation unit, compiled for sm_90a only
 * (wgmma has no plain sm_90 form), so launch.cu reaches it through these functions and passes
 * its ChunkParams by address: both files take the struct from common.cuh, so its layout is one.
 */
#ifndef GDP_CHUNK_HOPPER_H
#define GDP_CHUNK_HOPPER_H

#include <cuda_runtime_api.h>

/* Whether the Hopper kernel takes these ChunkParams (16-bit q, k, v with K and V each 64 or 128,
 * 16-byte aligned rows and outputs, T M < 2^31). The device must also have compute capability 9.0: the caller checks. */
bool gdp_chunk_hopper_fits(const void *chunk_params);
/* The exact segment split of long sequences (kernels/NOTES-chunk.md, "Exact segments"): segments of
 * seg_chunks expanded chunks (0: none, one block per sequence and head), at most max_segs segments in
 * all (gdp_chunk_hopper_split_segments), the split's scratch at ws (gdp_chunk_hopper_split_bytes). */
struct GdpHopperSplit {
    int seg_chunks;
    int max_segs;
    void *ws;
};
/* The bound on the split's segments for T padded tokens, N sequences, M copies (every sequence has at
 * least one, and a sequence of E expanded chunks ceil(E / seg_chunks)). */
long long gdp_chunk_hopper_split_segments(long long T, long long N, int M, int seg_chunks);
/* The scratch the split takes for these ChunkParams and max_segs: the plan's item and slot arrays,
 * in fp32 the entering states and the maps F and G of every segment past a sequence's first, and the
 * outputs' part O^F of every token (K columns, 16-bit). */
size_t gdp_chunk_hopper_split_bytes(const void *chunk_params, long long max_segs);
/* Enqueues the kernel on `stream`; bf16: q, k, v and o are bf16, else fp16; tma: the chunks' K, V and
 * Q tiles by tensor-map copies of the copy engine (else, or if the driver cannot encode the maps,
 * by the aux threads' cp.async; the same bits). split NULL or seg_chunks 0: one block per sequence
 * and head; else the split's four launches (plan, pass 1, fix-up, then the outputs' correction or,
 * with chunk states, pass 2). Returns the first launch error. */
cudaError_t gdp_chunk_hopper_launch(const void *chunk_params, bool bf16, bool tma, const GdpHopperSplit *split,
                                    cudaStream_t stream);

#endif /* GDP_CHUNK_HOPPER_H */
