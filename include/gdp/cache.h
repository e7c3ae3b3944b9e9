/*
 * cache.h: the distributed state cache. Per layer and rank it holds the recurrent state
 * ssm_state [slots, H_t, K, V] (fp32 by default, bf16 selectable) and the conv state
 * conv_state [slots, conv_dim_t, W] (the last W pre-conv inputs, column W-1 newest) of
 * every live request, each rank holding its heads' share of every slot (with context
 * parallelism the heads its mixer core runs: H_c = H/(tp*cp), gdp_cache_config_init_cp).
 * Optionally:
 *   - draft-token states for speculative decoding: intermediate ssm and conv states
 *     [slots, S, ...] per layer, written by decode steps with S > 1 tokens, from which a
 *     later step's accept rolls a slot back to its n_accepted kept tokens (gdp-math.md 5.3);
 *   - prefix snapshots [n_snapshots, ...] per layer: a slot's ssm state and conv window at
 *     a 64-token boundary, saved during a prefill step and restored into a new slot.
 *
 * Slots are allocated, zeroed, restored, rolled back and freed only by the step plan
 * (gdp_cache_apply_step), identically on every rank; -1 is padding everywhere. On the
 * CUDA backend the states are device memory of the ctx's device.
 */
#ifndef GDP_CACHE_H
#define GDP_CACHE_H

#include "gdp/config.h"
#include "gdp/gdp.h"
#include "gdp/plan.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct gdp_cache *gdp_cache_t;
#define GDP_CACHE_NULL NULL

/* Sizes of one rank's cache. */
typedef struct gdp_cache_config {
    int32_t     num_layers;       /* layers whose state the cache holds (>= 1)                 */
    int32_t     n_slots;          /* requests live at once (>= 1)                              */
    int32_t     num_heads;        /* H_t, this rank's heads                                    */
    int32_t     state_dim;        /* K = N                                                     */
    int32_t     head_dim;         /* V = P                                                     */
    int32_t     conv_dim;         /* conv_dim_t = M*H_t*P + (M+1)*G_t*N                       */
    int32_t     conv_width;       /* W                                                         */
    gdp_dtype_t ssm_dtype;        /* fp32 (default) or bf16                                    */
    gdp_dtype_t conv_dtype;       /* fp32, bf16 or fp16                                        */
    int32_t     max_draft_tokens; /* S_max of the intermediate (draft-token) states; 0: none   */
    int32_t     n_snapshots;      /* prefix snapshots per layer; 0: none                       */
} gdp_cache_config;

/* Fills *out for rank shard->tp_rank of a layer stack: num_layers, H_t, K, V, conv_dim_t
 * and W from the shard, fp32 ssm and conv states, n_slots as given, no draft states and
 * no snapshots (set those fields afterwards). INVALID_ARGUMENT for n_slots < 1 or sizes
 * beyond int32. */
GDP_API gdp_status_t gdp_cache_config_init(gdp_cache_config *out, const gdp_tp_shard *shard, int32_t n_slots);
/* The same for a context-parallel layer stack (cp > 1): the cache of CP rank shard->cp_rank
 * holds only the states of the heads and groups its mixer core runs, H_c = H/(tp*cp) heads
 * and conv_dim_c = M*H_c*P + (M+1)*G_c*N channels (gdp_cp_shard). Every CP rank holds every
 * slot (the slots are the same on every rank of the job). With cp_size = 1 it equals
 * gdp_cache_config_init(out, &shard->tp, n_slots). Errors as gdp_cache_config_init. */
GDP_API gdp_status_t gdp_cache_config_init_cp(gdp_cache_config *out, const gdp_cp_shard *shard, int32_t n_slots);

/* Allocates the cache (every state zero, every slot free, no snapshot saved). Errors:
 * INVALID_ARGUMENT naming the field (a size < 1, a dtype not allowed, W < 2), SYSTEM_ERROR
 * or CUDA_ERROR when memory runs out (nothing stays allocated). */
GDP_API gdp_status_t gdp_cache_init(gdp_cache_t *out, gdp_ctx_t ctx, const gdp_cache_config *config);
/* Frees the cache. NULL is a no-op. */
GDP_API gdp_status_t gdp_cache_free(gdp_cache_t cache);
GDP_API gdp_status_t gdp_cache_get_config(gdp_cache_t cache, gdp_cache_config *config);

/* Applies the slot operations of a built step (gdp_plan_build against this cache), on
 * every layer, in order: accepts (copy the state after the n_accepted-th token of the
 * slot's last draft step back into the slot), releases (slots freed), new slots (claimed
 * and zeroed, or restored from a prefix snapshot). Also marks the decode slots of a step
 * with S > 1 as holding a pending draft step, and the snapshots the step saves as saved.
 * The state copies run on the cache's backend, driven by the fills the plan put in the
 * metadata (CUDA: one kernel launch for every layer, enqueued on the ctx's stream, which
 * the layers must share; nothing waits for the device).
 * Call once per step, after gdp_plan_build and before the layers' forward passes.
 * INVALID_USAGE (nothing modified) if meta was built against another cache or another
 * state of this one (every step must be built, then applied, once). */
GDP_API gdp_status_t gdp_cache_apply_step(gdp_cache_t cache, const gdp_step_metadata *meta);

/* Slot bookkeeping (host-side, the same on every rank). */
GDP_API gdp_status_t gdp_cache_free_slot_count(gdp_cache_t cache, int32_t *n_free);
/* *in_use = 1 if the slot is claimed by a request. INVALID_ARGUMENT outside [0, n_slots). */
GDP_API gdp_status_t gdp_cache_slot_in_use(gdp_cache_t cache, int32_t slot, int32_t *in_use);
/* *saved = 1 if snapshot id has been saved by some step. */
GDP_API gdp_status_t gdp_cache_snapshot_saved(gdp_cache_t cache, int32_t snapshot, int32_t *saved);

/* Swapping a slot's state to memory outside the cache and back (preemption). Between steps,
 * identically on every rank (each rank moves its own share). The buffer holds
 * gdp_cache_swap_bytes: every layer's ssm then conv state, layer by layer. It is host memory
 * (pinned memory makes the copies on CUDA run at full speed) or, on CUDA, device memory of the
 * cache's device (device-to-device copies, an order of magnitude faster than over the bus).
 *   swap_out: copies slot `slot`'s state into buf; with pending_S > 0 the slot has a
 *             pending draft step of pending_S tokens of which `keep` (1..pending_S) are
 *             kept, and the state after the kept tokens is what is saved (what the accept
 *             would have made); with pending_S 0, the slot's own state. The slot stays
 *             claimed: a step's release frees it.
 *   swap_in:  claims free slot `slot` with the state in buf (no pending draft step).
 * On CUDA the copies are queued on the cache's stream after the work queued on it. With a host
 * buffer both calls wait for them; with a device buffer neither waits: the stream orders the
 * copies before any later work on it (a step that reads the swapped-in slot, a step that writes
 * the swapped-out one), and the buffer may be reused by a later swap on the same stream.
 * Errors (nothing modified): INVALID_ARGUMENT naming the slot and its state (a free slot to
 * swap out, a claimed one to swap in, a pending draft step that does not match, NULL buf). */
GDP_API gdp_status_t gdp_cache_swap_bytes(gdp_cache_t cache, size_t *bytes);
GDP_API gdp_status_t gdp_cache_swap_out(gdp_cache_t cache, int32_t slot, int32_t pending_S, int32_t keep, void *buf);
GDP_API gdp_status_t gdp_cache_swap_in(gdp_cache_t cache, int32_t slot, const void *buf);

/* Views of layer `layer`'s buffers (device memory on CUDA), valid while the cache lives:
 *   ssm [n_slots, H_t, K, V] ssm_dtype;  conv [n_slots, conv_dim_t, W] conv_dtype. */
GDP_API gdp_status_t gdp_cache_state_views(gdp_cache_t cache, int32_t layer, gdp_tensor *ssm, gdp_tensor *conv);
/* Prefix snapshots of the layer: ssm [n_snapshots, H_t, K, V], conv [n_snapshots, conv_dim_t, W].
 * INVALID_ARGUMENT when the cache has no snapshots. */
GDP_API gdp_status_t gdp_cache_snapshot_views(gdp_cache_t cache, int32_t layer, gdp_tensor *ssm, gdp_tensor *conv);
/* Draft-token states of the layer for steps of S tokens (1 <= S <= max_draft_tokens):
 * ssm [n_slots, S, H_t, K, V], conv [n_slots, S, conv_dim_t, W] (the buffers reinterpreted
 * with S, so row [slot, s] is where a step of S tokens writes token s's state).
 * INVALID_ARGUMENT when the cache keeps no draft states or S is out of range. */
GDP_API gdp_status_t gdp_cache_draft_views(gdp_cache_t cache, int32_t layer, int32_t S, gdp_tensor *ssm,
                                           gdp_tensor *conv);

#ifdef __cplusplus
}
#endif

#endif /* GDP_CACHE_H */
