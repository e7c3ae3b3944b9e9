/*
 * model.h: a whole GDP language model on one tensor-parallel rank:
 *
 *   token ids -> embedding [vocab, D] -> L x (RMSNorm -> GDP mixer -> + residual)
 *             -> final RMSNorm -> LM head (tied: logits = x . embedding^T) -> logits [vocab]
 *
 * The L layers are gdp_layer shards (layer.h) of one checkpoint (checkpoint.h, with
 * vocab_size > 0); the embedding and the final norm are replicated on every rank. A step
 * runs as in layer.h (plan, cache, metadata): gdp_model_embed fills x, gdp_model_forward
 * runs the layers on it (collective over the comm), gdp_model_logits turns chosen rows of
 * x into logits on the calling rank only (no communication; the engine calls it on the
 * rank that samples).
 *
 * Backends: everything above the ops and GEMMs is backend-neutral. The CPU backend runs
 * fp32 with the GEMMs in cblas_sgemm; the CUDA backend uses the layer's cuBLASLt GEMMs.
 * gdp-run's steps take the device path at the end of this file (embedding gather from
 * device token ids, vocab-parallel head, sampling on the device); gdp_model_embed and
 * gdp_model_logits are the host-side forms (checks and tests).
 */
#ifndef GDP_MODEL_H
#define GDP_MODEL_H

#include "gdp/cache.h"
#include "gdp/checkpoint.h"
#include "gdp/comm.h"
#include "gdp/gdp.h"
#include "gdp/layer.h"
#include "gdp/plan.h"
#include "gdp/sampling.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct gdp_model *gdp_model_t;
#define GDP_MODEL_NULL NULL

/* Loads this rank's shard of every layer of ckpt (rank and size from comm; comm == NULL:
 * tp = 1) and the replicated embedding and final norm, converted to the backend's compute
 * dtype (fp32), in buffers the model owns. Tensor parallelism is the all-reduce mode
 * (every rank holds every token row). Collective over comm (the layers agree on errors).
 * Errors (nothing allocated, *out = NULL): INVALID_ARGUMENT when the checkpoint has no
 * vocabulary (vocab_size 0) or a tensor is wrong (named), or H, G do not divide by the
 * TP size; UNSUPPORTED on a backend without the layer's GEMMs; SYSTEM/CUDA errors. */
GDP_API gdp_status_t gdp_model_init(gdp_model_t *out, gdp_ctx_t ctx, gdp_comm_t comm, gdp_checkpoint_t ckpt);
/* The same with context parallelism (docs/cp.md): comm is this rank's TP group (NULL for
 * tp = 1), cp_comm its CP group (config.h's rank layout; NULL or size 1: gdp_model_init).
 * The layers are gdp_layer_init_cp shards. x keeps every row on every rank: the forward runs
 * the layers on this CP rank's contiguous 1/cp of the rows (padded_token_count must divide by
 * cp) and all-gathers the blocks back over cp_comm. Errors: those of gdp_model_init and of
 * gdp_layer_init_cp (the CP group rule), agreed over both comms. */
GDP_API gdp_status_t gdp_model_init_cp(gdp_model_t *out, gdp_ctx_t ctx, gdp_comm_t comm, gdp_comm_t cp_comm,
                                       gdp_checkpoint_t ckpt);
/* Frees the model and its layers. NULL is a no-op. */
GDP_API gdp_status_t gdp_model_free(gdp_model_t model);

/* The shard of layer 0 (config with vocab_size, tp rank and size, TP-local sizes): what
 * gdp_cache_config_init needs. */
GDP_API gdp_status_t gdp_model_get_shard(gdp_model_t model, gdp_tp_shard *shard);
/* Its CP shard (cp_size 1 without context parallelism): what gdp_cache_config_init_cp needs. */
GDP_API gdp_status_t gdp_model_get_cp_shard(gdp_model_t model, gdp_cp_shard *shard);
/* Bytes of backend memory the model's weights take on this rank. */
GDP_API gdp_status_t gdp_model_weight_bytes(gdp_model_t model, size_t *bytes);

/* x [n, D] (backend memory, fp32, contiguous) <- the embedding rows of tokens[0..n)
 * (host memory); a token of -1 gives a row of zeros (padding). Errors (x unchanged):
 * INVALID_ARGUMENT for x's shape or dtype, or a token outside [-1, vocab_size) (named
 * with its index). */
GDP_API gdp_status_t gdp_model_embed(gdp_model_t model, gdp_tensor *x, const int32_t *tokens, int64_t n);

/* Runs every layer on x [padded_token_count, D] in place (layer.h: the step must have
 * been built and applied to cache). Collective over the model's comm (and cp_comm: the
 * layers on this CP rank's rows, then one all-gather of the rows). */
GDP_API gdp_status_t gdp_model_forward(gdp_model_t model, gdp_cache_t cache, const gdp_step_metadata *meta,
                                       gdp_tensor *x);

/* logits [n_rows, vocab_size] (host memory, fp32) <- the LM head of rows rows[0..n_rows)
 * of x [T, D]: final RMSNorm (eps = config.norm_eps) then x . embedding^T. Local: no
 * communication. The rows run in fixed blocks of 16 (the last padded): a BLAS picks its
 * kernel by the matrix sizes (a matrix-vector kernel for one row, a small-matrix kernel
 * below some size), each summing in its own order, and a request's logits must not depend
 * on how many other requests share its step. Errors (nothing written): INVALID_ARGUMENT
 * for x's shape or dtype, a row outside [0, T), n_rows < 1, NULL pointers. */
GDP_API gdp_status_t gdp_model_logits(gdp_model_t model, float *logits, const gdp_tensor *x, const int32_t *rows,
                                      int64_t n_rows);

/* ---- the device path of a step (what gdp-run runs, CUDA-graph capturable) ---- */

/* x [n, D] (backend memory, fp32) <- the embedding rows of tokens[0..n) in BACKEND memory
 * (device memory on CUDA; host memory on the CPU backend, where the tokens are checked as in
 * gdp_model_embed). A token of -1 is a padding row (zeros). A token t <= -2 is a REFERENCE
 * to a token sampled on the device: the token of prev[-2 - t], one of the n_prev
 * gdp_sample_out records in backend memory that gdp_model_sample wrote (the engine's next
 * step reads its previous step's draws without waiting for them; prev may be NULL when no
 * token refers). On the CPU backend a reference without prev, outside [0, n_prev), or to a
 * record whose token is outside [0, vocab) is refused (INVALID_ARGUMENT naming the row,
 * nothing written). On CUDA nothing is checked (the device cannot report): a token or a
 * referenced token outside [0, vocab), and a reference outside [0, n_prev), give a row of
 * zeros; prev is read on the device when the gather runs (stream order), so a graph that
 * captured this launch replays it with each step's new records. */
GDP_API gdp_status_t gdp_model_embed_device(gdp_model_t model, gdp_tensor *x, const int32_t *tokens, int64_t n,
                                            const gdp_sample_out *prev, int64_t n_prev);

/* Sizes the head's buffers for steps of up to max_rows sampled rows and candidate records of
 * max_candidates (sampling.h: the top-k / top-p limit). Call before capturing a graph that
 * samples (a later larger reserve moves the buffers). */
GDP_API gdp_status_t gdp_model_reserve_head(gdp_model_t model, int64_t max_rows, int32_t max_candidates);

/* The LM head and sampling of a step (docs/gdp-run.md, "The step pipeline"):
 *   final RMSNorm of rows rows[i] of x -> logits of this rank's vocabulary slice (one GEMM
 *   per block of rows; bf16 operands with fp32 accumulation on CUDA, fp32 on the CPU) ->
 *   candidate records (gdp_sample_candidates) -> all-gather of the records over the TP comm
 *   -> merge (gdp_sample_merge) -> out[i] on every rank.
 * rows, params and out are backend memory of n_rows entries; a row of -1 (padding) gives
 * an unspecified outcome. Vocab-parallel: rank r holds rows [r ceil(V/tp), ...) of the tied
 * embedding, so only the records (a few KB per row) cross ranks. Collective over the
 * model's TP comm. Nothing waits for the device. */
typedef struct gdp_model_head_args {
    const gdp_tensor     *x;      /* [T, D] fp32, backend memory (after the layers)   */
    const int32_t        *rows;   /* [n_rows] rows of x                               */
    int64_t               n_rows; /* 1 .. the reserved rows                           */
    const gdp_sample_row *params; /* [n_rows]                                         */
    gdp_sample_out       *out;    /* [n_rows]                                         */
} gdp_model_head_args;
GDP_API gdp_status_t gdp_model_sample(gdp_model_t model, const gdp_model_head_args *args);

#ifdef __cplusplus
}
#endif

#endif /* GDP_MODEL_H */
