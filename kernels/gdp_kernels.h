/*
 * gdp_kernels.h: the C-callable launchers of the CUDA backend (the .cu files of kernels/). Each
 * op front-end in src/ validates arguments, then calls the launcher of its family on
 * the ctx's stream; launchers check their own launch and return a status, never abort.
 */
#ifndef GDP_KERNELS_H
#define GDP_KERNELS_H

#include <stdbool.h>

#include "gdp/gdp.h"
#include "gdp/sampling.h"

#ifdef __cplusplus
extern "C" {
#endif

struct gdp_ctx;

/* Context set-up for the CUDA backend: selects the device, checks it is usable. */
gdp_status_t gdp_cuda_ctx_init(struct gdp_ctx *ctx);
gdp_status_t gdp_cuda_ctx_free(struct gdp_ctx *ctx);

/* One launcher per op family. The front-end (src/ops_*.c) has already checked every
 * shape and dtype rule that holds on all backends; a launcher adds the CUDA-only rules
 * (e.g. fp32 q in the chunk op: GDP_STATUS_UNSUPPORTED) and enqueues on ctx->stream. */
gdp_status_t gdp_cuda_prepare(struct gdp_ctx *ctx, const gdp_prepare_args *args, int decode);
/* The prefill prepare's beta and g alone (the prefill front writes q, k and v). */
gdp_status_t gdp_cuda_prepare_gates(struct gdp_ctx *ctx, const gdp_prepare_args *args);
gdp_status_t gdp_cuda_l2norm(struct gdp_ctx *ctx, gdp_tensor *y, const gdp_tensor *x);
gdp_status_t gdp_cuda_chunk_local_cumsum(struct gdp_ctx *ctx, gdp_tensor *g_cumsum, gdp_tensor *g_cumsum_dp,
                                         const gdp_tensor *g, const gdp_tensor *cu_seqlens,
                                         int32_t num_householder);
gdp_status_t gdp_cuda_chunk(struct gdp_ctx *ctx, const gdp_chunk_args *args);
/* How many chunk-op calls of this process ran the one-pass Hopper kernel (GDP_CHUNK_PATH=hopper on a
 * compute capability 9.0 device, kernels/chunk/hopper.cuh): test_chunk_gpu checks that it ran. */
long long gdp_cuda_chunk_hopper_calls(void);
/* How many decode-op launches of this process ran the tensor-core kernel (GDP_DECODE_STATE=mma, or a
 * bf16 state's default, kernels/recurrent_mma.cuh): test_recurrent_gpu checks when it ran. */
long long gdp_cuda_decode_mma_calls(void);
/* How many decode-op launches of this process ran the ring kernel (GDP_DECODE_STATE=ring,
 * kernels/recurrent_ring.cuh): test_recurrent_gpu checks when it ran. */
long long gdp_cuda_decode_ring_calls(void);
/* The segment length (expanded chunks) of the last call that ran the Hopper kernel's exact segment
 * split, 0 when that call ran unsplit (GDP_CHUNK_SEGMENT): test_chunk_gpu checks that the split ran. */
int gdp_cuda_chunk_hopper_last_segment(void);
gdp_status_t gdp_cuda_recurrent(struct gdp_ctx *ctx, const gdp_recurrent_args *args);
/* The same op right after the layer's decode front on the stream (gdp_decode_recurrent_after_front,
 * src/decode_core.h): where every item of the row or tensor-core kernel has a block of its own, it
 * launches as the front's programmatic dependent and loads the state before it waits for the front
 * (GDP_DECODE_PDL=off: as gdp_cuda_recurrent). */
gdp_status_t gdp_cuda_recurrent_after_front(struct gdp_ctx *ctx, const gdp_recurrent_args *args);
/* The decode op and the grouped gated RMSNorm of its outputs in one launch
 * (gdp_decode_recurrent_norm, src/decode_core.h), when the call fits it and GDP_DECODE_END
 * allows it (fused; auto, the default, never fuses: measured slower); *fused says whether it ran (false:
 * nothing was launched, run the two ops). An unknown GDP_DECODE_END: INVALID_USAGE, nothing
 * launched. */
gdp_status_t gdp_cuda_recurrent_norm(struct gdp_ctx *ctx, const gdp_recurrent_args *args, gdp_tensor *out,
                                     const gdp_tensor *y, const gdp_tensor *z, const gdp_tensor *weight,
                                     int64_t group_size, double eps, bool *fused);
gdp_status_t gdp_cuda_conv1d_update(struct gdp_ctx *ctx, const gdp_conv1d_update_args *args);
gdp_status_t gdp_cuda_conv1d_varlen(struct gdp_ctx *ctx, const gdp_conv1d_varlen_args *args);
/* kernels/conv1d.cu: the prefill front, the varlen conv with its outputs written straight into
 * the prefill prepare's value, key and query (the row kernel), then the prepare's beta and g;
 * fits: the row kernel takes the conv, GDP_CONV_KERNEL allows it, prep->x is [1, T, C] with C
 * the layer's conv channels, and value, key and query are contiguous, aligned and of y's dtype. */
bool gdp_cuda_prefill_front_fits(const gdp_conv1d_varlen_args *conv, const gdp_prepare_args *prep);
gdp_status_t gdp_cuda_prefill_front(struct gdp_ctx *ctx, const gdp_conv1d_varlen_args *conv,
                                    const gdp_prepare_args *prep);
/* kernels/decode_core.cu: the conv update and the decode prepare in one launch, for the
 * steps that fit it (one token per request, width 4, 16-byte runs; src/decode_core.c).
 * mode (GDP_DECODE_FRONT): auto takes the launch where it is measured faster, fused wherever
 * the call fits, chain never. */
typedef enum { GDP_DECODE_FRONT_AUTO, GDP_DECODE_FRONT_FUSED, GDP_DECODE_FRONT_CHAIN } gdp_decode_front_mode;
bool gdp_cuda_decode_core_fits(const gdp_conv1d_update_args *conv, const gdp_prepare_args *prep,
                               gdp_decode_front_mode mode);
/* The fast front's channels a thread from GDP_DECODE_FRONT_VEC (4 or 8), -1 for a value it does not know. */
int gdp_cuda_decode_front_vec(void);
gdp_status_t gdp_cuda_decode_core(struct gdp_ctx *ctx, const gdp_conv1d_update_args *conv,
                                  const gdp_prepare_args *prep);
gdp_status_t gdp_cuda_gated_rmsnorm(struct gdp_ctx *ctx, gdp_tensor *out, const gdp_tensor *y,
                                    const gdp_tensor *z, const gdp_tensor *weight, int64_t group_size,
                                    double eps);
gdp_status_t gdp_cuda_rmsnorm(struct gdp_ctx *ctx, gdp_tensor *out, const gdp_tensor *x,
                              const gdp_tensor *weight, double eps);
/* kernels/sampling.cu: stage 1 (candidate records) and stage 2 (merge) of token sampling. */
gdp_status_t gdp_cuda_sample_candidates(struct gdp_ctx *ctx, const gdp_sample_candidates_args *args);
gdp_status_t gdp_cuda_sample_merge(struct gdp_ctx *ctx, const gdp_sample_merge_args *args);

#ifdef __cplusplus
}
#endif

#endif /* GDP_KERNELS_H */
