/*
 * checkpoint.h: GDP layer checkpoints. A checkpoint is one safetensors file holding the
 * global (TP = 1) tensors of every layer plus the config as metadata; each rank loads
 * only its tensor-parallel shard, slicing every in_proj and conv section separately
 * (never a contiguous slice of the fused tensor) and reading just those bytes. So one
 * checkpoint serves every TP size. docs/checkpoint.md documents the names, shapes,
 * dtypes and metadata; gdp-ckpt (examples/gdp_ckpt.c) writes and inspects them.
 *
 * Tensors of layer l (D hidden, H heads, G groups, P head dim, N state dim, M copies,
 * W conv width; "wt" is the weight dtype: fp32, bf16 or fp16, one per file):
 *   layers.{l}.norm.weight      [D]        wt    pre-norm (RMSNorm) weight
 *   layers.{l}.in_proj.z        [H*P, D]   wt
 *   layers.{l}.in_proj.V{m}     [H*P, D]   wt    m = 0..M-1
 *   layers.{l}.in_proj.K{m}     [G*N, D]   wt    m = 0..M-1
 *   layers.{l}.in_proj.Q        [G*N, D]   wt
 *   layers.{l}.in_proj.b{m}     [H, D]     wt    m = 0..M-1
 *   layers.{l}.in_proj.a        [H, D]     wt
 *   layers.{l}.conv.V{m}        [H*P, W]   wt    m = 0..M-1
 *   layers.{l}.conv.K{m}        [G*N, W]   wt    m = 0..M-1
 *   layers.{l}.conv.Q           [G*N, W]   wt
 *   layers.{l}.A_log            [H]        fp32
 *   layers.{l}.dt_bias          [H]        wt
 *   layers.{l}.out_norm.weight  [H*P]      wt    grouped gated RMSNorm weight
 *   layers.{l}.out_proj         [D, H*P]   wt
 * and, when the metadata's vocab_size V is > 0 (a whole model, not just a layer stack):
 *   embedding                   [V, D]     wt    token embedding, tied to the LM head
 *   final_norm.weight           [D]        wt    RMSNorm before the LM head
 */
#ifndef GDP_CHECKPOINT_H
#define GDP_CHECKPOINT_H

#include "gdp/config.h"
#include "gdp/gdp.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct gdp_checkpoint *gdp_checkpoint_t;
#define GDP_CHECKPOINT_NULL NULL

/* One rank's weights of one layer, in host memory owned by the struct (free with
 * gdp_layer_weights_free). Every tensor is contiguous, in the checkpoint's weight dtype
 * except A_log (fp32). Sizes are TP-local: H_t, G_t, d_t = H_t*P, conv_dim_t and
 * in_proj_dim_t as in shard (gdp_tp_shard). Fused tensors are the rank-local
 * concatenation of the per-section slices, in semantic order (shard sections say where
 * each one starts). */
typedef struct gdp_layer_weights {
    gdp_tp_shard shard;        /* which layer shard this is (config, rank, sizes)      */
    int32_t      layer;        /* layer index in the checkpoint                        */
    gdp_dtype_t  dtype;        /* weight dtype (all but A_log)                         */
    gdp_tensor   norm_weight;  /* [D]                     pre-norm weight (replicated) */
    gdp_tensor   in_proj;      /* [in_proj_dim_t, D]      z|V0..|K0..|Q|b0..|a rows    */
    gdp_tensor   conv;         /* [conv_dim_t, W]         V0..|K0..|Q rows             */
    gdp_tensor   A_log;        /* [H_t] fp32                                           */
    gdp_tensor   dt_bias;      /* [H_t]                                                */
    gdp_tensor   out_norm_weight; /* [d_t]                gated-norm weight            */
    gdp_tensor   out_proj;     /* [D, d_t]                this rank's input columns    */
} gdp_layer_weights;

/* The model tensors outside the layers, whole (they are replicated on every rank), in
 * host memory owned by the struct (free with gdp_model_weights_free), in the
 * checkpoint's weight dtype. */
typedef struct gdp_model_weights {
    gdp_dtype_t dtype;             /* weight dtype                                   */
    gdp_tensor  embedding;         /* [vocab_size, D] token embedding = LM head rows */
    gdp_tensor  final_norm_weight; /* [D]             final RMSNorm weight           */
} gdp_model_weights;

/* Opens a checkpoint: parses the safetensors header and the config metadata (no tensor
 * data is read). Errors (*out = NULL): SYSTEM_ERROR (cannot open), INVALID_ARGUMENT
 * naming the file and the problem (not safetensors, truncated, overlapping or duplicate
 * tensors, metadata key missing or not a finite number, vocab_size outside [0, 2^31),
 * invalid config). */
GDP_API gdp_status_t gdp_checkpoint_open(gdp_checkpoint_t *out, const char *path);
/* Closes it. NULL is a no-op. Weights loaded from it stay valid. */
GDP_API gdp_status_t gdp_checkpoint_free(gdp_checkpoint_t ckpt);
/* Whether the loaders (gdp_checkpoint_load_layer_shard, gdp_checkpoint_load_model_weights,
 * and so gdp_model_init) refuse weights holding NaN or Inf: on (1) for every opened
 * checkpoint; 0 turns it off (gdp-run --no-finite-check), e.g. to load a model known to be
 * poisoned for debugging. The check reads every element a rank loads once (no extra I/O); a
 * refused load fails with INVALID_ARGUMENT naming the tensor, the index of its first bad
 * element in the checkpoint tensor and the value. Each rank checks the slices it reads, so
 * in a TP job the rank holding the bad element reports it (the others see it through
 * gdp_model_init's agreement). docs/limits.md. */
GDP_API gdp_status_t gdp_checkpoint_set_finite_check(gdp_checkpoint_t ckpt, int32_t enabled);
/* The config stored in the checkpoint's metadata. */
GDP_API gdp_status_t gdp_checkpoint_get_config(gdp_checkpoint_t ckpt, gdp_layer_config *cfg);
/* The weight dtype (metadata "dtype"; every weight but A_log has it). */
GDP_API gdp_status_t gdp_checkpoint_get_dtype(gdp_checkpoint_t ckpt, gdp_dtype_t *dtype);

/* Validates every layer for tensor-parallel size tp_size without reading tensor data:
 * H and G divisible by tp_size, and each tensor present with the expected shape and
 * dtype (with vocab_size > 0 also the embedding and the final norm). Errors as
 * gdp_checkpoint_load_layer_shard (the first problem found). */
GDP_API gdp_status_t gdp_checkpoint_check(gdp_checkpoint_t ckpt, int32_t tp_size);

/* Loads rank tp_rank's shard of layer `layer` at tensor-parallel size tp_size into *out:
 * the in_proj and conv sections sliced one by one (rank r's heads or groups of each),
 * A_log, dt_bias and out_norm.weight sliced by heads, out_proj by its input columns,
 * norm.weight whole. Only those bytes are read (pread per slice).
 * Everything is validated before anything is allocated: layer in range, tp_rank in
 * [0, tp_size), H and G divisible by tp_size, and for each of the layer's tensors that
 * it exists, has the expected shape and dtype. Errors: INVALID_ARGUMENT naming the
 * tensor and the expected vs found shape or dtype, or the numbers that do not divide;
 * SYSTEM_ERROR on a read failure or out of memory. On failure nothing is allocated and
 * *out is not modified. Every rank reading the same file gets the same error. */
GDP_API gdp_status_t gdp_checkpoint_load_layer_shard(gdp_checkpoint_t ckpt, gdp_layer_weights *out, int32_t layer,
                                                     int32_t tp_rank, int32_t tp_size);
/* Frees the buffers of *w and zeroes it. A zeroed struct is a no-op. */
GDP_API gdp_status_t gdp_layer_weights_free(gdp_layer_weights *w);

/* Loads the embedding [vocab_size, D] and final_norm.weight [D] whole into *out (every
 * rank holds them). Errors (nothing allocated, *out untouched): INVALID_ARGUMENT when the
 * checkpoint has vocab_size 0 (a layer stack without a vocabulary) or a tensor is missing
 * or has the wrong shape or dtype (named); SYSTEM_ERROR on a read failure or out of memory. */
GDP_API gdp_status_t gdp_checkpoint_load_model_weights(gdp_checkpoint_t ckpt, gdp_model_weights *out);
/* Frees the buffers of *w and zeroes it. A zeroed struct is a no-op. */
GDP_API gdp_status_t gdp_model_weights_free(gdp_model_weights *w);

/* Writes a seeded synthetic checkpoint with cfg->num_layers layers and Megatron's
 * initial distributions (the same seed gives the same bytes):
 *   in_proj ~ N(0, 0.02);  out_proj ~ N(0, 0.02 / sqrt(2 * num_layers)) (scaled init);
 *   conv ~ U(-1/sqrt(W), 1/sqrt(W)) (PyTorch's default for a depthwise conv);
 *   A_log = log(U(0, 16)), the uniform drawn from the open interval so A_log is finite;
 *   dt_bias = softplus^-1(dt), dt = exp(U(log 1e-3, log 0.1)) floored at 1e-4;
 *   norm.weight = out_norm.weight = 1;
 *   with cfg->vocab_size > 0 also embedding ~ N(0, 0.005) and final_norm.weight = 1 (the
 *   embedding is tied to the LM head; at 0.02 a random model's greedy decoding only
 *   repeats its input token, see checkpoint.c).
 * dtype (fp32, bf16 or fp16) is the weight dtype; A_log is always fp32. The file is
 * written to a temporary name and renamed, so `path` never holds a partial file; the
 * whole checkpoint is built in memory first. Errors: INVALID_ARGUMENT (config, dtype),
 * SYSTEM_ERROR (memory, I/O). */
GDP_API gdp_status_t gdp_checkpoint_write_synthetic(const char *path, const gdp_layer_config *cfg, uint64_t seed,
                                                    gdp_dtype_t dtype);

#ifdef __cplusplus
}
#endif

#endif /* GDP_CHECKPOINT_H */
