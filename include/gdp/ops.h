/*
 * ops.h: the GDP ops, mirroring Megatron's core.ssm.ops.gdp API (names, arguments,
 * defaults and semantics; ../shared/docs/gdp-math.md is the contract).
 *
 * Every op is stateless and works on caller buffers. The ctx picks the backend:
 * on GDP_BACKEND_CPU all tensors are host memory and the call is synchronous; on
 * GDP_BACKEND_CUDA all tensors except those documented as host arrays are device
 * memory and the call returns once the work is enqueued on the ctx stream.
 *
 * Ops with many arguments take one argument struct, filled like Python keyword
 * arguments (designated initializers; a zeroed gdp_tensor is "None"). Shapes below
 * use the symbols of gdp-math.md: T tokens, M Householder copies, H heads, G groups,
 * K (= N) key dim, V (= P) value dim, N_seq sequences, S tokens per decode request.
 *
 * Failure modifies nothing: every argument is checked before the first write.
 *
 * Aliasing: no output may overlap (share any byte with) an input, another output or the
 * in-place cache of the call (state, conv_state): such a call fails with INVALID_ARGUMENT
 * naming both buffers. Inputs may overlap each other. Allowed aliases: the norms exactly in
 * place (gdp_l2norm y == x, gdp_rmsnorm out == x, gdp_gated_rmsnorm out == y or z: the same
 * data, dtype and shape; each row is read before it is written). The caches are read and
 * written in place by design.
 *
 * Debug checks (gdp_ctx_set_debug_checks, or GDP_DEBUG_CHECKS=1 in the environment when the
 * ctx is created): every op also refuses, before writing anything, float inputs holding NaN
 * or Inf and log decays g > 0 (a NaN or positive g, or a NaN beta, would otherwise land in a
 * cache slot), naming the tensor, the element and the value. On CUDA each checked input is
 * copied to the host (synchronizing the ctx stream; refused during CUDA graph capture), so
 * the mode is for debugging. docs/api.md states the contract.
 */
#ifndef GDP_OPS_H
#define GDP_OPS_H

#include "gdp/gdp.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Turns the debug-checked mode of ctx on (1) or off (0); see above. A new ctx starts with it
 * on when GDP_DEBUG_CHECKS is set to anything but "" or "0". */
GDP_API gdp_status_t gdp_ctx_set_debug_checks(gdp_ctx_t ctx, int32_t enabled);
GDP_API gdp_status_t gdp_ctx_get_debug_checks(gdp_ctx_t ctx, int32_t *enabled);

/* The chunk size of every chunked kernel and of prefix-cache alignment. */
#define GDP_CHUNK_SIZE 64
/* fp32 rounding of 1/ln 2 that upstream kernels multiply cumulative decays by. */
#define GDP_RCP_LN2 1.4426950216f
/* Largest key/value head dim (state rows/cols) any op accepts. */
#define GDP_MAX_HEAD_DIM 256
/* eps of the L2 norm, added inside the square root. */
#define GDP_L2NORM_EPS 1e-6

/* ==== chunk descriptors (host) ============================================
 * Worst-case descriptor rows for a padded step (gdp-math.md 4.3):
 *   max_chunks    = max_tokens / 64     + max_requests
 *   max_chunks_dp = max_tokens * M / 64 + max_requests
 * INVALID_ARGUMENT for negative sizes, num_householder < 1 or int32 overflow. */
GDP_API gdp_status_t gdp_max_chunk_counts(int64_t max_tokens, int64_t max_requests,
                                          int32_t num_householder, int64_t *max_chunks,
                                          int64_t *max_chunks_dp);

/* Builds the padded descriptors of one prefill step (gdp-math.md 4.4), on the host.
 *   cu_seqlens       : [prefill_count + 1] int32, non-decreasing, cu_seqlens[0] == 0,
 *                      cu_seqlens[prefill_count] <= padded_token_count
 *   chunk_indices    : out, capacity 2 * max_chunks int32 ((seq, chunk) pairs)
 *   chunk_indices_dp : out, capacity 2 * max_chunks_dp int32
 *   chunk_offsets    : out, prefill_count + 1 int32
 *   num_chunks, num_chunks_dp : out, the padded row counts (== gdp_max_chunk_counts(
 *                      padded_token_count, prefill_count, num_householder))
 * Real rows come first, in sequence order, then padding rows (0, tokens/64 + 1) and
 * (0, (tokens/64 + 1) * M + 1) that address no token. Errors (nothing written):
 * INVALID_ARGUMENT naming the sequence and numbers for a negative length, decreasing
 * cu_seqlens, cu_seqlens[N] > padded_token_count, overflow, num_householder < 1. */
GDP_API gdp_status_t gdp_build_chunk_descriptors(const int32_t *cu_seqlens, int32_t prefill_count,
                                                 int32_t num_householder, int64_t padded_token_count,
                                                 int32_t *chunk_indices, int32_t *chunk_indices_dp,
                                                 int32_t *chunk_offsets, int64_t *num_chunks,
                                                 int64_t *num_chunks_dp);

/* ==== prepare ===============================================================
 * Split, reshape and gate post-conv activations (gdp-math.md 6).
 *   x       : [n, T, M*H*P + M*G*N + G*N], fp32 | bf16 | fp16; rows may be strided
 *             (stride[2] == 1 required)
 *   ba      : [n, T, M*H + H], fp32 | bf16 | fp16; rows may be strided
 *   A_log   : [H] fp32;  dt_bias : [H] any float dtype
 * Outputs (contiguous; q, k, v in x's dtype, beta in ba's dtype, g fp32):
 *   decode  (S = T): query [n, S*M, H, N] (only copy M-1 nonzero), key [n, S*M, H, N],
 *                    value [n, S*M, H, P], beta [n, S*M, H], g [n, S*M, H] (copy 0 only)
 *   prefill (n == 1): query [n, T, H, N], key [n, T*M, H, N], value [n, T*M, H, P],
 *                    beta [n, T*M, H], g [n, T, H]
 * beta = 1 / (1 + exp(-b)); g = (-exp(A_log)) * softplus(a + dt_bias), softplus with a
 * strict > 20 threshold and log1p: the exact operation order of gdp-math.md 6.5. */
typedef struct gdp_prepare_args {
    gdp_tensor x, ba, A_log, dt_bias;
    int32_t    num_householder, num_heads, num_groups, head_dim, state_dim;
    gdp_tensor query, key, value, beta, g; /* outputs */
} gdp_prepare_args;

GDP_API gdp_status_t gdp_decode_prepare(gdp_ctx_t ctx, const gdp_prepare_args *args);
GDP_API gdp_status_t gdp_prefill_prepare(gdp_ctx_t ctx, const gdp_prepare_args *args);

/* ==== L2 norm =================================================================
 * y[r] = x[r] / sqrt(sum x[r]^2 + 1e-6) over the last dim, for every row r.
 *   x, y : same shape, any float dtype each, contiguous. In place if y.data == x.data
 *          with equal dtypes. */
GDP_API gdp_status_t gdp_l2norm(gdp_ctx_t ctx, gdp_tensor *y, const gdp_tensor *x);

/* ==== chunk-local cumulative decays (base 2) ===================================
 * gdp-math.md 3.1: per sequence, chunks of 64 on each stream, inclusive sums restarted
 * at every chunk start, summed in fp32 (CPU: double) then multiplied by GDP_RCP_LN2.
 *   g          : [1, T, H] fp32 (natural-log decays)
 *   cu_seqlens : [N+1] int32 (host array on the CPU backend, device on CUDA)
 *   g_cumsum   : out [1, T, H] fp32, token stream (Gq); may be absent
 *   g_cumsum_dp: out [1, T*M, H] fp32, expanded stream with g on copy 0 (Gk); may be absent
 * Rows past cu_seqlens[N] are set to 0. */
GDP_API gdp_status_t gdp_chunk_local_cumsum(gdp_ctx_t ctx, gdp_tensor *g_cumsum, gdp_tensor *g_cumsum_dp,
                                            const gdp_tensor *g, const gdp_tensor *cu_seqlens,
                                            int32_t num_householder);

/* ==== chunked prefill: chunk_gated_delta_product_varlen =========================
 *   q    : [1, T, H, K]      bf16 | fp16 (CPU also fp32)
 *   k    : [1, T*M, H, K]    same dtype as q
 *   v    : [1, T*M, H, V]    same dtype as q
 *   g    : [1, T, H]         fp32 natural-log decays (<= 0)
 *   beta : [1, T*M, H]       any float dtype
 *   cu_seqlens : [N+1] int32 over the token stream (CPU: host; CUDA: device)
 *   scale : 0 selects the default K^-0.5
 *   initial_state : [N, H, K, V] any float dtype, or absent (zeros). The op never reads
 *                   the cache: gather slot rows into initial_state yourself.
 *   chunk_indices [num_chunks, 2], chunk_indices_dp [num_chunks_dp, 2],
 *   chunk_offsets [N+1]: int32 descriptors from gdp_build_chunk_descriptors; all three
 *                   or none (none: derived inside, which costs a host sync on CUDA).
 *                   Required when state_indices is given.
 *   state, state_indices : cache mode: state [slots, H, K, V] (fp32 | bf16, last two
 *                   dims contiguous), state_indices [N] int32. The final state of
 *                   sequence i is written in place to state[state_indices[i]] in the
 *                   cache dtype; -1 writes nothing. Slots nobody names are untouched.
 *                   A -1 request of nonzero length computes its outputs from its
 *                   initial state like any other.
 *   output_final_state : dense mode (no state): write fp32 final states to final_state; with
 *                   state (cache mode) it is refused (the final states go to the slots)
 *   return_chunk_states: write chunk_states [num_chunks_or_NT, H, K, V]; row
 *                   chunk_offsets[i] + c = state of sequence i after its first 64c tokens
 *                   (rows past chunk_offsets[N] untouched).
 *   exact_log2e : CPU-reference knob: use the exact 1/ln 2 instead of GDP_RCP_LN2.
 *   max_seqlen : the longest sequence's tokens, 0 for unknown (0 <= max_seqlen <= T; as
 *                   flash-attn's max_seqlen). A hint for the CUDA op's choice of kernels
 *                   (GDP_CHUNK_PATH unset or auto): with descriptors given the host never
 *                   sees the lengths, and the one-pass Hopper kernel, fastest where every
 *                   sequence is about as long as the longest, is chosen only when this says
 *                   so. Without descriptors the lengths are read anyway and the hint is not
 *                   needed. A wrong hint costs speed, never correctness.
 * Outputs:
 *   o : [1, T, H, V] in q's dtype (CPU: any float dtype); rows past cu_seqlens[N] = 0. */
typedef struct gdp_chunk_args {
    gdp_tensor q, k, v, g, beta;
    int32_t    num_householder;
    gdp_tensor cu_seqlens;
    double     scale;
    gdp_tensor initial_state;
    int32_t    output_final_state;
    int32_t    use_qk_l2norm_in_kernel;
    gdp_tensor chunk_indices, chunk_indices_dp, chunk_offsets;
    gdp_tensor state, state_indices;
    int32_t    return_chunk_states;
    int32_t    exact_log2e;
    int64_t    max_seqlen;
    gdp_tensor o, final_state, chunk_states; /* outputs */
} gdp_chunk_args;

GDP_API gdp_status_t gdp_chunk_gated_delta_product_varlen(gdp_ctx_t ctx, const gdp_chunk_args *args);

/* The per-token recurrence of gdp-math.md 2 with the same arguments and outputs as
 * gdp_chunk_gated_delta_product_varlen (descriptors are ignored; chunk_states are
 * the states after every 64 tokens). CPU backend only: the test oracle. */
GDP_API gdp_status_t gdp_gated_delta_product_recurrent_ref(gdp_ctx_t ctx, const gdp_chunk_args *args);

/* ==== decode: fused_recurrent_gated_delta_rule_update ============================
 * api-reference/fused_recurrent.md; gdp-math.md 5.
 *   q, k : [B, T, H, K]; v : [B, T, H, V]; fp32 | bf16 | fp16 (all the same dtype)
 *   g    : [B, T, H] fp32 natural-log decays, or absent (no decay)
 *   beta : [B, T, H] like q, or absent (1)
 *   scale: 0 selects K^-0.5; applied after the optional L2 norm
 *   initial_state [B, H, K, V] / output_final_state: dense mode (with state both are refused)
 *   cu_seqlens : must be absent (variable lengths are not supported in decode)
 *   state [slots, H, K, V] fp32 | bf16, state_indices [B] int32 (absent: slot b = row b):
 *     read at the start, written at the end, in place. -1 rows: output 0, no slot
 *     read or written.
 *   intermediate_states [slots, S, H, K, V] in the cache's dtype, S = T / steps_per_token:
 *     row [slot, s] receives the state after token s; other rows untouched.
 *   steps_per_token : M for GDP decode (>= 1, divides T)
 * Outputs: o [B, T, H, V] in v's dtype (CPU: any float dtype); final_state [B, H, K, V]
 * fp32 when output_final_state and no state.
 * Numerics: the state stays in registers (CUDA: fp32; CPU: double within a token's steps,
 * rounded to fp32 between tokens in cache mode), so with an fp32 cache one call of S tokens
 * equals S calls of one token bit for bit. */
typedef struct gdp_recurrent_args {
    gdp_tensor q, k, v, g, beta;
    double     scale;
    gdp_tensor initial_state;
    int32_t    output_final_state;
    int32_t    use_qk_l2norm_in_kernel;
    gdp_tensor cu_seqlens;
    gdp_tensor state, state_indices;
    gdp_tensor intermediate_states;
    int32_t    steps_per_token;
    gdp_tensor o, final_state; /* outputs */
} gdp_recurrent_args;

GDP_API gdp_status_t gdp_fused_recurrent_gated_delta_rule_update(gdp_ctx_t ctx,
                                                                 const gdp_recurrent_args *args);

/* ==== causal depthwise conv1d (width W) + optional SiLU ===========================
 * The conv state of a slot holds the last W pre-conv inputs, column W-1 newest.
 *
 * Decode update, S tokens per request:
 *   x      : [B, S, C] any float dtype; rows may be strided (stride[2] == 1)
 *   weight : [C, W]; bias : [C] or absent
 *   conv_state : [slots, C, W] in place; conv_state_indices : [B] int32 (absent: b)
 *   intermediate_conv_states : [slots, S, C, W] or absent: row [slot, s] = window after
 *                token s
 *   y      : out [B, S, C]; -1 rows: y = 0, no slot read or written.
 * For each token: shift the window left by one, append x, y = act(bias + sum_j w_j s_j). */
typedef struct gdp_conv1d_update_args {
    gdp_tensor x, weight, bias;
    gdp_tensor conv_state, conv_state_indices, intermediate_conv_states;
    int32_t    silu;
    gdp_tensor y; /* output */
} gdp_conv1d_update_args;

GDP_API gdp_status_t gdp_causal_conv1d_update(gdp_ctx_t ctx, const gdp_conv1d_update_args *args);

/* Varlen prefill with carried state (gdp-layer.md 1.2):
 *   x      : [T, C], rows may be strided; tokens of sequence i are rows
 *            [cu_seqlens[i], cu_seqlens[i+1])
 *   weight : [C, W]; bias : [C] or absent
 *   conv_state : [slots, C, W] in place; state_indices : [N] int32
 *   cu_seqlens : [N+1] int32 (CPU: host; CUDA: device)
 *   y      : out [T, C]; rows past cu_seqlens[N] are 0.
 * Token t's window is the last W-1 columns of the slot's state followed by the
 * sequence; the new state is the last W columns of (state ++ tokens), so a sequence
 * shorter than W carries old columns and a zero-length one keeps its state. A -1
 * request starts from a zero window and writes no state. */
typedef struct gdp_conv1d_varlen_args {
    gdp_tensor x, weight, bias;
    gdp_tensor conv_state, state_indices, cu_seqlens;
    int32_t    silu;
    gdp_tensor y; /* output */
} gdp_conv1d_varlen_args;

GDP_API gdp_status_t gdp_causal_conv1d_varlen(gdp_ctx_t ctx, const gdp_conv1d_varlen_args *args);

/* ==== norms ====================================================================
 * Grouped gated RMSNorm (gdp-layer.md 1.5): x = y * silu(z); for each group of
 * group_size consecutive channels, out = x / sqrt(mean(x^2) + eps) * weight.
 *   y, z, out : [rows, d] (rows may be any leading shape), weight : [d];
 *   d % group_size == 0. Math in fp32 (CPU: double), out in its own dtype.
 *   y and z may also be 2-D row views [rows, d] with a row stride >= d and a contiguous
 *   last dim (e.g. the gate columns of a wider projection); out is contiguous. */
GDP_API gdp_status_t gdp_gated_rmsnorm(gdp_ctx_t ctx, gdp_tensor *out, const gdp_tensor *y,
                                       const gdp_tensor *z, const gdp_tensor *weight,
                                       int64_t group_size, double eps);

/* Plain RMSNorm over the last dim: out = x / sqrt(mean(x^2) + eps) * weight. */
GDP_API gdp_status_t gdp_rmsnorm(gdp_ctx_t ctx, gdp_tensor *out, const gdp_tensor *x,
                                 const gdp_tensor *weight, double eps);

/* ==== workspace of the CUDA chunk op ==============================================
 * The CUDA gdp_chunk_gated_delta_product_varlen keeps its intermediates (cumulative decays,
 * normalized keys, WY factors, v_new, chunk states) in a device workspace owned by the ctx.
 * With the three descriptors given the op never allocates: reserve once, before the first
 * call (and before capturing a CUDA graph), for the largest step:
 *   size_t bytes;
 *   gdp_chunk_get_workspace_size(max_tokens, max_requests, M, H, K, V, &bytes);
 *   gdp_ctx_reserve_workspace(ctx, bytes);
 * A call whose descriptors are given and whose ctx workspace is too small fails with
 * GDP_STATUS_INVALID_USAGE and writes nothing; without descriptors the op grows the
 * workspace itself (it synchronizes the host anyway on that path). */

/* Bytes of ctx workspace one chunk call needs for q of max_tokens (padded) tokens and
 * cu_seqlens of max_requests + 1 entries; monotone in both, so the largest step covers all.
 * Host-only arithmetic; INVALID_ARGUMENT for bad sizes (K or V > 256, M < 1, overflow). */
GDP_API gdp_status_t gdp_chunk_get_workspace_size(int64_t max_tokens, int64_t max_requests,
                                                  int32_t num_householder, int32_t num_heads,
                                                  int32_t key_dim, int32_t value_dim, size_t *bytes);

/* Grows the ctx's device workspace to at least `bytes` (never shrinks it). A no-op on the CPU
 * backend. Growing frees the old buffer (waiting for work that uses it): CUDA graphs captured
 * before a growing call must be captured again. CUDA_ERROR when cudaMalloc fails. */
GDP_API gdp_status_t gdp_ctx_reserve_workspace(gdp_ctx_t ctx, size_t bytes);

#ifdef __cplusplus
}
#endif

#endif /* GDP_OPS_H */
