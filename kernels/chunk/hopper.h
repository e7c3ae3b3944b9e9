/*
 * hopper.h: the entry points of kernels/chunk/hopper.cu, the chunk op's one-pass Hopper kernel
 * (hopper.cuh), for launch.cu. hopper.cu is its own translation unit, compiled for sm_90a only
 * (wgmma has no plain sm_90 form), so launch.cu reaches it through these two functions and passes
 * its ChunkParams by address: both files take the struct from common.cuh, so its layout is one.
 */
#ifndef GDP_CHUNK_HOPPER_H
#define GDP_CHUNK_HOPPER_H

#include <cuda_runtime_api.h>

/* Whether the Hopper kernel takes these ChunkParams (16-bit q, k, v with K = 128 and V = 64 or 128,
 * 16-byte aligned rows and outputs, T M < 2^31). The device must also have compute capability 9.0: the caller checks. */
bool gdp_chunk_hopper_fits(const void *chunk_params);
/* Enqueues the kernel on `stream` (one block per sequence and head); bf16: q, k, v and o are bf16,
 * else fp16; tma: the chunks' K, V and Q tiles by tensor-map copies of the copy engine (else, or if
 * the driver cannot encode the maps, by the aux threads' cp.async; the same bits). Returns the
 * launch's error. */
cudaError_t gdp_chunk_hopper_launch(const void *chunk_params, bool bf16, bool tma, cudaStream_t stream);

#endif /* GDP_CHUNK_HOPPER_H */
