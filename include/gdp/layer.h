/*
 * layer.h: one GDP mixer layer's tensor- (and context-) parallel shard (gdp-layer.md
 * sections 1, 2, 3.1, 4):
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
 * With context parallelism (gdp_layer_init_cp, cp > 1) x holds 1/cp of the step's rows; an
 * all-to-all before the conv gives each CP rank every row of its H/(tp*cp) heads' sections,
 * and one after the recurrence returns y to the rank's rows (../../docs/cp.md).
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
 *          tp_size); NULL or a comm of size 1 for tp = 1, which are the same: the layer then
 *          adds its output into x in place, with no collective and no staging copy.
 *   mode : GDP_TP_MODE_ALLREDUCE (x holds every token on every rank) or
 *          GDP_TP_MODE_SEQUENCE_PARALLEL (x holds this rank's token_count / tp rows).
 * Errors (nothing allocated): INVALID_ARGUMENT naming the field (a weight tensor of the
 * wrong shape, comm rank/size not the shard's, an invalid mode), UNSUPPORTED on a backend
 * this libgdp was built without, SYSTEM_ERROR / CUDA_ERROR / CUBLAS_ERROR when memory runs
 * out or cuBLASLt cannot start. */
GDP_API gdp_status_t gdp_layer_init(gdp_layer_t *out, gdp_ctx_t ctx, gdp_comm_t comm,
                                    const gdp_layer_weights *weights, gdp_tp_mode_t mode);
/* The same for a context-parallel stack of tp x cp ranks (gdp-layer.md 3.1; ../../docs/cp.md):
 *   comm    : the TP group, as above (NULL or a comm of size 1 for tp = 1);
 *   cp_comm : the CP group (the ranks of the job with this rank's tp_rank; config.h's rank
 *             layout rank = tp_rank + tp * cp_rank); NULL or a comm of size 1 for cp = 1, which
 *             is exactly gdp_layer_init.
 * weights is this rank's TP shard, as for gdp_layer_init; the layer slices the mixer core's
 * parameters (conv V/K/Q channels, A_log, dt_bias) for its CP rank, gdp_cp_shard_init with
 * cp_comm's rank and size. With cp > 1, x holds this CP rank's contiguous 1/cp of the step's
 * padded rows; the forward runs in_proj on them, swaps sequence sharding for head sharding with
 * one all-to-all over cp_comm (the in_proj sections V_m, K_m, Q, b_m, a, each split by heads or
 * groups), runs conv, prepare and the recurrence on the whole step for the core's H/(tp*cp)
 * heads, swaps the output y back with a second all-to-all, and runs the gated norm, out_proj
 * and the TP collective on its rows. The cache must then be sized for the core
 * (gdp_cache_config_init_cp).
 * Errors (nothing allocated): those of gdp_layer_init, INVALID_ARGUMENT from gdp_cp_shard_init
 * (H/tp not divisible by cp; G/tp >= cp and not divisible by cp; G/tp < cp and cp not divisible
 * by G/tp), or cp_comm == comm with both of size > 1. */
GDP_API gdp_status_t gdp_layer_init_cp(gdp_layer_t *out, gdp_ctx_t ctx, gdp_comm_t comm, gdp_comm_t cp_comm,
                                       const gdp_layer_weights *weights, gdp_tp_mode_t mode);
/* A second layer over src's weights (not copied) with its own workspace, running on ctx: for
 * several streams of one device that serve different requests at once (micro-batches, replicas),
 * each with its own cache and plan. ctx must be on src's backend and device. The new layer is
 * src's shard at tp = cp = 1 (a layer of a TP or CP group would share its comm across streams,
 * whose collectives must keep one order: create each replica with gdp_layer_init and a comm of its
 * own instead). src (or the layer it shares) must outlive it: gdp_layer_free refuses a layer whose
 * weights others still share. Not thread-safe against another init or free of the same src.
 * Errors (nothing allocated): INVALID_ARGUMENT (NULL, a ctx on another backend or device),
 * INVALID_USAGE (src not a live layer), UNSUPPORTED (src of a TP or CP group), those of cuBLASLt's
 * start on ctx. */
GDP_API gdp_status_t gdp_layer_init_shared(gdp_layer_t *out, gdp_ctx_t ctx, gdp_layer_t src);
/* Frees the layer and its workspace (and its weights, unless they are another layer's).
 * GDP_STATUS_INVALID_USAGE, nothing freed, while layers made by gdp_layer_init_shared still
 * share its weights (free those first). NULL is a no-op. */
GDP_API gdp_status_t gdp_layer_free(gdp_layer_t layer);
/* The shard the layer runs (config, tp rank and size, TP-local sizes). */
GDP_API gdp_status_t gdp_layer_get_shard(gdp_layer_t layer, gdp_tp_shard *shard);
/* The dtype of its activations and GEMM weights: bf16 on CUDA, fp32 on the CPU backend. The
 * conv state holds the layer's pre-conv inputs, which are in this dtype: a cache whose
 * conv_dtype is this dtype (gdp_cache_config) holds the same values as an fp32 one in the
 * fewest bytes, and the layer's outputs and states are bitwise the same (half the conv
 * state's traffic of a decode step on CUDA; gdp-run and gdp-bench layer do so). */
GDP_API gdp_status_t gdp_layer_get_act_dtype(gdp_layer_t layer, gdp_dtype_t *dtype);
/* Its CP shard: the heads and groups its mixer core runs (cp_size 1 without context
 * parallelism: the TP shard's own), for gdp_cache_config_init_cp. */
GDP_API gdp_status_t gdp_layer_get_cp_shard(gdp_layer_t layer, gdp_cp_shard *shard);

/* Runs the layer on one step, in place on x:
 *   cache : this rank's cache, sized for this shard (gdp_cache_config_init), holding the
 *           layer's states at index weights->layer; the step must have been applied to
 *           it (gdp_plan_build, then gdp_cache_apply_step) and not another one since
 *   meta  : the step's metadata (gdp_plan_build)
 *   x     : in/out residual stream, fp32 (both backends; device memory on CUDA), contiguous:
 *           ALLREDUCE [padded_token_count, D] (the same on every rank);
 *           SEQUENCE_PARALLEL [padded_token_count / tp, D] (this rank's block of rows;
 *           padded_token_count % tp must be 0).
 *           With context parallelism (cp > 1) the rows are this CP rank's block of those:
 *           ALLREDUCE [padded_token_count / cp, D], rows cp_rank * T/cp ..;
 *           SEQUENCE_PARALLEL [padded_token_count / (cp * tp), D], the TP rank's block of
 *           them; padded_token_count must then divide by cp (by cp * tp with SP).
 *           Rows follow plan.h's token layout; rows of padding requests and the padded
 *           tail of the prefill block come out as x (the mixer adds 0 there).
 * CUDA: returns when the work is enqueued on the ctx's stream (the plan, the cache and the
 * layers of a stack must share that stream); the index arrays come from the metadata's
 * device copy. The layer's workspaces only grow: the first step of each larger bucket
 * allocates (and may wait on the device); run one step of the largest bucket before
 * capturing a CUDA graph.
 * Collective over the layer's comm: one all-reduce or reduce-scatter, plus one all-gather
 * with sequence parallel; with cp > 1 also two all-to-alls over cp_comm. The step was validated and agreed on by every rank in
 * gdp_plan_build; the forward adds a status agreement (gdp_comm_agree, host only) only
 * where one rank may fail alone: its first call with a cache, a workspace growth, and
 * every call when the environment sets GDP_PLAN_DEBUG=1 (with cp > 1 over the TP group, then
 * the CP group, so every rank of the job returns the same verdict). Its own arguments (x, the cache)
 * are checked on each rank: an SPMD program passes them alike everywhere.
 * Errors (checked before anything is written; nothing is modified): INVALID_ARGUMENT
 * naming the value (x's shape or dtype, a cache of other sizes, a layer index outside the
 * cache, padded_token_count not divisible by tp with sequence parallel, or by cp), INVALID_USAGE
 * (meta not applied to this cache), REMOTE_ERROR when another rank failed at an agreement.
 * After the checks: errors of the ops, the GEMM and the collective (e.g. CUDA_ERROR); the
 * ranks may then be apart (one inside a collective), so callers end the job (gdp_fatal). */
GDP_API gdp_status_t gdp_layer_forward(gdp_layer_t layer, gdp_cache_t cache, const gdp_step_metadata *meta,
                                       gdp_tensor *x);

#ifdef __cplusplus
}
#endif

#endif /* GDP_LAYER_H */
