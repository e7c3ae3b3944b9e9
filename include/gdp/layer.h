/*
 * layer.h: one GDP mixer layer's tensor-parallel shard (gdp-layer.md sections 1, 2, 4):
 *
 *   x [T, D] (residual) -> RMSNorm + in_proj (one GEMM; column-parallel):
 *        z | V_0..V_{M-1} | K_0..K_{M-1} | Q | b_0..b_{M-1} | a
 *     -> decode block (first padded_decode_count * S rows): conv update + SiLU on V|K|Q,
 *        decode prepare, recurrent update in place on the cache slots (draft-token states
 *        when S > 1 and the cache keeps them)
 *     -> prefill block (the rows after it): varlen conv + SiLU with carried conv state,
 *        prefill prepare, chunked GDP from the slots' states, final states in place
 *        (chunk states when the step saves a prefix snapshot)
 *     -> grouped gated RMSNorm (x * silu(z), per GQA group) -> out_proj (row-parallel)
 *     -> the tensor-parallel collective (all-reduce, or reduce-scatter with sequence
 *        parallel) -> + residual, written back into x.
 *
 * The code above the ops is the same on both backends: the ops pick theirs from the ctx.
 * The residual stream x is fp32 on both. The CPU backend runs everything in fp32 with the
 * GEMMs in cblas_sgemm. The CUDA backend keeps weights and activations in bf16 (A_log and
 * the states fp32), runs the GEMMs on cuBLASLt with fp32 accumulation (out_proj adds into
 * the fp32 x), and only enqueues work on the ctx's stream: in the steady state a forward
 * pass never waits for the device (../../docs/layer.md, "The CUDA backend").
 */
#ifndef GDP_LAYER_H
#define GDP_LAYER_H

#include "gdp/cache.h"
#include "gdp/checkpoint.h"
#include "gdp/comm.h"
#include "gdp/gdp.h"
#include "gdp/plan.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct gdp_layer *gdp_layer_t;
#define GDP_LAYER_NULL NULL

/* Creates layer weights->layer of the stack on this rank: copies the shard's weights
 * (gdp_checkpoint_load_layer_shard; any float dtype, converted to the backend's compute
 * dtype: fp32 on the CPU, bf16 on CUDA, A_log fp32 on both) into buffers the layer owns,
 * so *weights may be freed afterwards. On CUDA the layers of a ctx share one cuBLASLt
 * handle and workspace (32 MiB), created by the first layer and freed with the last.
 *   comm : the tensor-parallel group (its rank and size must be the shard's tp_rank and
 *          tp_size); NULL for tp = 1.
 *   mode : GDP_TP_MODE_ALLREDUCE (x holds every token on every rank) or
 *          GDP_TP_MODE_SEQUENCE_PARALLEL (x holds this rank's token_count / tp rows).
 * Errors (nothing allocated): INVALID_ARGUMENT naming the field (a weight tensor of the
 * wrong shape, comm rank/size not the shard's, an invalid mode), UNSUPPORTED on a backend
 * this libgdp was built without, SYSTEM_ERROR / CUDA_ERROR / CUBLAS_ERROR when memory runs
 * out or cuBLASLt cannot start. */
GDP_API gdp_status_t gdp_layer_init(gdp_layer_t *out, gdp_ctx_t ctx, gdp_comm_t comm,
                                    const gdp_layer_weights *weights, gdp_tp_mode_t mode);
/* Frees the layer and its workspace. NULL is a no-op. */
GDP_API gdp_status_t gdp_layer_free(gdp_layer_t layer);
/* The shard the layer runs (config, tp rank and size, TP-local sizes). */
GDP_API gdp_status_t gdp_layer_get_shard(gdp_layer_t layer, gdp_tp_shard *shard);

/* Runs the layer on one step, in place on x:
 *   cache : this rank's cache, sized for this shard (gdp_cache_config_init), holding the
 *           layer's states at index weights->layer; the step must have been applied to
 *           it (gdp_plan_build, then gdp_cache_apply_step) and not another one since
 *   meta  : the step's metadata (gdp_plan_build)
 *   x     : in/out residual stream, fp32 (both backends; device memory on CUDA), contiguous:
 *           ALLREDUCE [padded_token_count, D] (the same on every rank);
 *           SEQUENCE_PARALLEL [padded_token_count / tp, D] (this rank's block of rows;
 *           padded_token_count % tp must be 0).
 *           Rows follow plan.h's token layout; rows of padding requests and the padded
 *           tail of the prefill block come out as x (the mixer adds 0 there).
 * CUDA: returns when the work is enqueued on the ctx's stream (the plan, the cache and the
 * layers of a stack must share that stream); the index arrays come from the metadata's
 * device copy. The layer's workspaces only grow: the first step of each larger bucket
 * allocates (and may wait on the device); run one step of the largest bucket before
 * capturing a CUDA graph.
 * Collective over the layer's comm: one all-reduce or reduce-scatter, plus one all-gather
 * with sequence parallel. The step was validated and agreed on by every rank in
 * gdp_plan_build; the forward adds a status agreement (gdp_comm_agree, host only) only
 * where one rank may fail alone: its first call with a cache, a workspace growth, and
 * every call when the environment sets GDP_PLAN_DEBUG=1. Its own arguments (x, the cache)
 * are checked on each rank: an SPMD program passes them alike everywhere.
 * Errors (checked before anything is written; nothing is modified): INVALID_ARGUMENT
 * naming the value (x's shape or dtype, a cache of other sizes, a layer index outside the
 * cache, padded_token_count not divisible by tp with sequence parallel), INVALID_USAGE
 * (meta not applied to this cache), REMOTE_ERROR when another rank failed at an agreement.
 * After the checks: errors of the ops, the GEMM and the collective (e.g. CUDA_ERROR); the
 * ranks may then be apart (one inside a collective), so callers end the job (gdp_fatal). */
GDP_API gdp_status_t gdp_layer_forward(gdp_layer_t layer, gdp_cache_t cache, const gdp_step_metadata *meta,
                                       gdp_tensor *x);

#ifdef __cplusplus
}
#endif

#endif /* GDP_LAYER_H */
