/*
 * plan.h: the step plan. One step of the scheduler, as plain data (gdp_step_desc: which
 * requests decode S tokens, which prefill how many tokens, their slots, which slots are
 * released, which draft tokens are kept, which prefix snapshots are restored or saved),
 * broadcast from the deciding rank to every rank of the tensor-parallel group, and
 * turned by every rank into the same per-step metadata (gdp_step_metadata): slot index
 * arrays, cu_seqlens, the chunk descriptors and the conv per-token metadata, padded to
 * the step's bucket and packed in ONE contiguous host buffer, copied to the device in
 * one transfer per step on the CUDA backend.
 *
 * Per step, on every rank (../../docs/layer.md walks through it):
 *   gdp_plan_bcast(plan, comm, root, desc)    the root's desc reaches every rank
 *   gdp_plan_build(plan, cache, comm, &meta)  validate against the cache and a bucket,
 *                                             resolve new slots, build the metadata
 *   gdp_cache_apply_step(cache, meta)         release / roll back / claim+zero / restore
 *   gdp_layer_forward(layer_l, cache, meta, x) for every layer
 *
 * With context parallelism the plan is still global: every rank of the job (tp x cp) holds
 * the same step and metadata (bcast and build over the job's comm), and CP rank c's layers
 * take the c-th contiguous 1/cp of the rows below (gdp_plan_check_token_split: buckets whose
 * token_count divides).
 *
 * Token layout of a step's activations x [padded_token_count, D]: rows
 * [0, padded_decode_count * S) are the decode block (request r's token s at row r*S + s;
 * rows of padding requests are dead), rows [prefill_token_offset, padded_token_count)
 * are the prefill block: request i's tokens at prefill_token_offset + cu_seqlens[i] ..,
 * then padding rows. Every padded size depends only on the bucket and S, so the shapes
 * a CUDA graph captures repeat from step to step.
 */
#ifndef GDP_PLAN_H
#define GDP_PLAN_H

#include "gdp/comm.h"
#include "gdp/gdp.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct gdp_plan *gdp_plan_t;
#define GDP_PLAN_NULL NULL

struct gdp_cache; /* cache.h */

/* A new request's slot chosen by the cache: the lowest free slot at that point of the
 * step, so every rank picks the same one. */
#define GDP_SLOT_AUTO (-2)
/* gdp_step_desc.bucket: the smallest bucket the step fits. */
#define GDP_BUCKET_AUTO (-1)

/* gdp_prefill_request.flags */
#define GDP_PREFILL_NEW     1 /* the request's first slice: claim the slot, zeroed (or restored) */
#define GDP_PREFILL_RESTORE 2 /* with NEW: copy prefix snapshot restore_snapshot into the slot   */
#define GDP_PREFILL_SAVE    4 /* save the state after save_offset tokens into save_snapshot      */

/* A padded step shape. Buckets are what CUDA graphs are captured for. */
typedef struct gdp_step_bucket {
    int32_t decode_count;  /* decode requests (rows of the decode block: decode_count * S)     */
    int32_t prefill_count; /* prefill requests                                                 */
    int32_t token_count;   /* rows of x: decode_count * S + the prefill block (>= 1)           */
} gdp_step_bucket;

/* One prefill slice of one request. */
typedef struct gdp_prefill_request {
    int32_t slot;             /* its slot; with GDP_PREFILL_NEW a free slot or GDP_SLOT_AUTO */
    int32_t n_tokens;         /* tokens of this slice, >= 1                                  */
    int32_t flags;            /* GDP_PREFILL_* (0: a continuing request, chunked prefill)    */
    int32_t restore_snapshot; /* GDP_PREFILL_RESTORE: the snapshot copied into the new slot  */
    int32_t save_snapshot;    /* GDP_PREFILL_SAVE: the snapshot that receives the state      */
    int32_t save_offset;      /* GDP_PREFILL_SAVE: tokens of this slice before the save point:
                                 a multiple of 64 in [0, n_tokens], or n_tokens (the end).
                                 The scheduler starts slices at 64-token boundaries of the
                                 request so that save points are prefix-cache boundaries. */
} gdp_prefill_request;

/* Speculative decoding: keep the first n_accepted of the S tokens the slot's last decode
 * step ran (1 <= n_accepted <= S; gdp-math.md 5.3). */
typedef struct gdp_draft_accept {
    int32_t slot;
    int32_t n_accepted;
} gdp_draft_accept;

/* One step, as the deciding rank (root) describes it. Arrays are caller memory. Applied
 * in this order: accepts (roll back to the kept tokens), releases (slots freed), new
 * slots (claimed, zeroed or restored), then the forward pass over decode and prefill. */
typedef struct gdp_step_desc {
    int32_t decode_count;                /* decode requests                                 */
    int32_t decode_tokens;               /* S = 1 + draft tokens per decode request; 0 = 1  */
    const int32_t *decode_slots;         /* [decode_count] their slots (in use)             */
    int32_t prefill_count;               /* prefill requests                                */
    const gdp_prefill_request *prefill;  /* [prefill_count]                                 */
    int32_t release_count;               /* slots freed before the step (finished requests) */
    const int32_t *release_slots;        /* [release_count]                                 */
    int32_t accept_count;                /* draft verifications of the previous step        */
    const gdp_draft_accept *accept;      /* [accept_count]                                  */
    int32_t bucket;                      /* GDP_BUCKET_AUTO or an index into the buckets    */
} gdp_step_desc;

typedef struct gdp_plan_config {
    int32_t num_householder;        /* M: chunk descriptors of the expanded stream            */
    int32_t n_slots;                /* the cache's slots: bounds releases and accepts         */
    int32_t max_decode_tokens;      /* largest S a step may use (1 without draft tokens)      */
    int32_t n_buckets;              /* >= 1                                                   */
    const gdp_step_bucket *buckets; /* [n_buckets], copied                                    */
    int32_t debug_check;            /* 1: gdp_plan_build checks with a hash all-reduce that
                                       every rank built identical metadata (also on when the
                                       environment sets GDP_PLAN_DEBUG=1)                     */
} gdp_plan_config;

/* Host (or, in `device`, device) pointers to the arrays of one step's metadata. On the
 * CPU backend device == host. Sizes: pd = padded_decode_count, pp = padded_prefill_count,
 * TP = prefill_rows. */
typedef struct gdp_step_arrays {
    const int32_t *decode_slots;     /* [pd] slots, then -1                                       */
    const int32_t *prefill_slots;    /* [pp] slots, then -1                                       */
    const int32_t *cu_seqlens;       /* [pp + 1] prefill-block token offsets, padding repeats the last */
    const int32_t *chunk_indices;    /* [num_chunks, 2]                                            */
    const int32_t *chunk_indices_dp; /* [num_chunks_dp, 2]                                         */
    const int32_t *chunk_offsets;    /* [pp + 1]                                                   */
    const int32_t *seq_idx;          /* [TP] request of each prefill-block row, -1 for padding     */
    const int32_t *conv_seq_idx;     /* [TP] request of each row, 0 for padding (upstream)         */
    const int32_t *conv_seq_start;   /* [TP] first row of the row's request, 0 for padding         */
    const int32_t *save_snapshot;    /* [pp] snapshot a request saves into, or -1                  */
    const int32_t *save_offset;      /* [pp] tokens of the slice before the save point (0 if none) */
    const int32_t *save_chunk_row;   /* [pp] row of the chunk states holding the saved state; -1:
                                        the final state (save at the slice end) or no save       */
    const int32_t *save_cu_seqlens;  /* [pp, 2] {0, save_offset}: the conv window at the save point */
} gdp_step_arrays;

/* One step's metadata, identical on every rank. Valid until the next gdp_plan_build. */
typedef struct gdp_step_metadata {
    int32_t bucket;               /* index of the bucket the step is padded to              */
    int32_t decode_count;         /* real decode requests                                   */
    int32_t decode_tokens;        /* S                                                      */
    int32_t prefill_count;        /* real prefill requests                                  */
    int32_t padded_decode_count;  /* pd                                                     */
    int32_t padded_prefill_count; /* pp                                                     */
    int32_t padded_token_count;   /* rows of x                                              */
    int32_t prefill_token_offset; /* first row of the prefill block = pd * S                */
    int32_t prefill_rows;         /* rows of the prefill block = padded_token_count - pd * S */
    int32_t prefill_tokens;       /* real prefill tokens                                    */
    int32_t save_count;           /* prefill requests that save a snapshot                  */
    int32_t chunk_state_saves;    /* of those, saves read from the chunk states             */
    int64_t num_chunks;           /* rows of chunk_indices (padded)                         */
    int64_t num_chunks_dp;        /* rows of chunk_indices_dp (padded)                      */
    int32_t num_householder;      /* M                                                      */
    gdp_step_arrays host;
    gdp_step_arrays device;       /* == host on the CPU backend                             */
    const void *host_buffer;      /* the one host buffer holding every array above          */
    size_t      buffer_bytes;     /* its size (hashed by the debug check)                   */
    const gdp_step_desc *step;    /* the step as built: GDP_SLOT_AUTO replaced by the slots
                                     chosen, bucket resolved; arrays owned by the plan      */
    const void *cache_id;         /* the cache it was built against (internal)              */
    uint64_t cache_generation;    /* and that cache's state (internal)                      */
} gdp_step_metadata;

/* Creates a plan: copies the config, sizes the serialized step and the metadata buffers
 * for the largest bucket (host, and device on CUDA). Errors: INVALID_ARGUMENT naming the
 * field (M < 1, n_slots < 1, max_decode_tokens < 1, no bucket, a bucket with a negative
 * count or no rows, int32 overflow of the descriptor sizes), SYSTEM_ERROR/CUDA_ERROR. */
GDP_API gdp_status_t gdp_plan_init(gdp_plan_t *out, gdp_ctx_t ctx, const gdp_plan_config *config);
/* Frees it. NULL is a no-op. */
GDP_API gdp_status_t gdp_plan_free(gdp_plan_t plan);

/* The step reaches every rank: rank `root` of `comm` passes `desc` (others pass NULL or
 * anything: it is ignored there), serialized into one flat int32 frame of a size fixed
 * by the config and broadcast once. Afterwards every rank's plan holds the root's step.
 * comm == NULL: a single process, desc is just copied. Collective over comm.
 * Errors, on EVERY rank (the root broadcasts its failure instead of the step, so no
 * rank waits): INVALID_ARGUMENT when the root's desc exceeds the frame (more decode or
 * prefill requests than the largest bucket holds, more releases or accepts than slots,
 * S > max_decode_tokens) or has NULL arrays for non-zero counts; the other ranks return
 * REMOTE_ERROR carrying the root's message. Nothing is modified on failure. */
GDP_API gdp_status_t gdp_plan_bcast(gdp_plan_t plan, gdp_comm_t comm, int32_t root, const gdp_step_desc *desc);

/* The step the plan holds (after gdp_plan_bcast), as received. */
GDP_API gdp_status_t gdp_plan_get_step(gdp_plan_t plan, const gdp_step_desc **desc);

/* Builds the step's metadata from the step the plan holds and the cache's slot state (the
 * same on every rank, since every rank applies the same steps): validates the step,
 * resolves GDP_SLOT_AUTO to the lowest free slots, picks the bucket, fills the host
 * buffer, copies it to the device (CUDA: one copy), and with debug_check compares a hash
 * of it across comm (comm may be NULL). *meta stays owned by the plan.
 * Everything is validated before anything is written; the cache is only read. With a
 * comm the ranks then agree on the outcome (gdp_comm_agree: one host all-reduce), so a
 * step refused by one rank is refused by all (the others return REMOTE_ERROR carrying its
 * message) and the layers' forward passes need no agreement of their own. The metadata
 * also carries the step's slot fills (zero, draft rollback, snapshot restore), which
 * gdp_cache_apply_step runs on the device from the same single copy. Errors
 * (INVALID_ARGUMENT, the same on every rank, naming the numbers):
 *   - slot exhaustion: more new requests than free slots ("3 new requests need slots but
 *     only 2 of 8 slots are free");
 *   - a step that does not fit its bucket (decode requests, prefill requests, or tokens
 *     pd * S + prefill tokens over the bucket's), or fits no bucket with GDP_BUCKET_AUTO;
 *   - a slot outside [0, n_slots), a decode or continuing prefill slot not in use, a new
 *     slot in use, a slot named twice, a released slot not in use, an accept without a
 *     pending draft step or with n_accepted outside [1, S];
 *   - n_tokens < 1, a save offset that is not a multiple of 64 (or n_tokens) or exceeds
 *     n_tokens, a snapshot id outside [0, n_snapshots), a restore of a never-saved
 *     snapshot or without GDP_PREFILL_NEW.
 * INVALID_USAGE on every rank when debug_check finds ranks with different metadata. */
GDP_API gdp_status_t gdp_plan_build(gdp_plan_t plan, struct gdp_cache *cache, gdp_comm_t comm,
                                    const gdp_step_metadata **meta);

/* Layers that shard a step's rows over ranks (context parallelism: cp ranks; with sequence
 * parallelism inside: tp * cp ranks) give each rank an equal contiguous slice of the padded
 * rows, so every bucket's token_count must be a multiple of `ranks`. Checks every bucket of
 * the plan (they are fixed at gdp_plan_init, so every step it builds then splits);
 * INVALID_ARGUMENT naming the first bucket that does not split, and how to pad it. Local (no
 * communication); call it once after gdp_plan_init. ranks = 1 always succeeds. */
GDP_API gdp_status_t gdp_plan_check_token_split(gdp_plan_t plan, int32_t ranks);

/* Compares a hash of the metadata's host buffer across comm (gdp_comm_check_consistent):
 * SUCCESS on every rank if all ranks hold identical bytes, else INVALID_USAGE on every
 * rank naming the ranks' hashes. Collective. */
GDP_API gdp_status_t gdp_plan_check_consistent(const gdp_step_metadata *meta, gdp_comm_t comm);

#ifdef __cplusplus
}
#endif

#endif /* GDP_PLAN_H */
