/*
 * copy_kernels.h: the small data-movement primitives of the layer, the state cache and
 * the step plan that are driven by index arrays (kernels/copy_kernels.cu on CUDA, plain loops
 * in src/backend.c on the CPU): gathering rows by slot index (initial states of a
 * prefill, snapshot saves), the conv window of a prefix snapshot, and the slot fills of a
 * step (zero, draft-token rollback, snapshot restore). Every index array is read where the
 * backend's kernels read it: device memory on CUDA (the step's metadata buffer, copied to
 * the device once per step), so no launch depends on a host copy of the indices.
 *
 * Indices are never trusted: an index outside its buffer's rows is treated like -1 (the
 * host validated them when it built the step; the device cannot report a bad one without a
 * sync, and must not write outside a buffer).
 */
#ifndef GDP_COPY_KERNELS_H
#define GDP_COPY_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "gdp/gdp.h"

#ifdef __cplusplus
extern "C" {
#endif

struct gdp_ctx;

/* Row copies: for i < n, with d = dst_idx ? dst_idx[i] : i and s = src_idx ? src_idx[i] : i:
 *   d outside [0, dst_rows)          -> nothing;
 *   s inside [0, src_rows)           -> dst row d = src row s (row_bytes bytes);
 *   s outside it and zero_missing    -> dst row d = zeros; otherwise nothing.
 * dst and src must not overlap. */
typedef struct gdp_copy_rows_args {
    int64_t        n;          /* rows to consider                                     */
    size_t         row_bytes;  /* bytes per row (the same in dst and src)              */
    void          *dst;        /* [dst_rows, row_bytes]                                */
    const int32_t *dst_idx;    /* [n] or NULL (identity)                               */
    int64_t        dst_rows;
    const void    *src;        /* [src_rows, row_bytes]                                */
    const int32_t *src_idx;    /* [n] or NULL (identity)                               */
    int64_t        src_rows;
    int32_t        zero_missing;
} gdp_copy_rows_args;

/* The conv window of each prefix-snapshot save (gdp-layer.md 1.2, the carry rule): for every
 * request i < n whose snapshot[i] is in [0, n_snapshots):
 *   snap_conv[snapshot[i], c, j] = element offset[i] + j of (the slot's incoming window
 *                                  conv[slots[i], c, 0..W-1] ++ the request's tokens),
 * the tokens being x rows cu_seqlens[i] + u (u = 0, 1, ...). A slot outside [0, n_slots)
 * contributes a zero window. Reads the slot's window, so it must run before the prefill's
 * conv moves the slot on. */
typedef struct gdp_copy_snapshot_conv_args {
    int64_t        n;            /* requests (padded prefill count)                       */
    int64_t        channels;     /* C = conv_dim_t                                        */
    int32_t        width;        /* W                                                     */
    const void    *x;            /* pre-conv activations: row t at x + t * x_pitch elems  */
    gdp_dtype_t    x_dtype;
    int64_t        x_pitch;      /* elements between rows                                 */
    const void    *conv;         /* [n_slots, C, W] the cache's conv states               */
    void          *snap_conv;    /* [n_snapshots, C, W]                                   */
    gdp_dtype_t    conv_dtype;   /* of conv and snap_conv                                 */
    int64_t        n_slots, n_snapshots;
    const int32_t *slots;        /* [n] the requests' slots                               */
    const int32_t *snapshot;     /* [n] the snapshot each request saves into, or -1       */
    const int32_t *offset;       /* [n] tokens of the slice before the save point         */
    const int32_t *cu_seqlens;   /* [n + 1] first x row of each request                   */
} gdp_copy_snapshot_conv_args;

/* The slot fills of a step, on every layer: op k (3 int32 words: slot, source, row) sets
 * slot `slot` of the ssm and conv states of every layer to
 *   source 0: zeros;
 *   source 1: draft row `row` ([n_slots * S_max] rows of the draft-token buffers);
 *   source 2: prefix snapshot `row`.
 * The ops name distinct slots (the plan merges a slot's operations, last one wins), so they
 * run in parallel. tables holds 6 * num_layers pointers (in the backend's memory): ssm, conv,
 * draft ssm, draft conv, snapshot ssm, snapshot conv, num_layers each, NULL where absent. */
typedef struct gdp_fill_slots_args {
    int32_t        num_layers;
    void *const   *tables;       /* [6][num_layers]                                     */
    const int32_t *ops;          /* [n_ops][3]                                          */
    int32_t        n_ops;
    size_t         ssm_bytes, conv_bytes; /* one slot's state of one layer            */
    int64_t        n_slots, draft_rows, n_snapshots;
} gdp_fill_slots_args;

/* Table indices of gdp_fill_slots_args.tables (times num_layers). */
enum { GDP_FILL_SSM = 0, GDP_FILL_CONV, GDP_FILL_DRAFT_SSM, GDP_FILL_DRAFT_CONV, GDP_FILL_SNAP_SSM,
       GDP_FILL_SNAP_CONV, GDP_FILL_TABLES };
/* gdp_fill_slots_args op sources. */
enum { GDP_FILL_ZERO = 0, GDP_FILL_FROM_DRAFT = 1, GDP_FILL_FROM_SNAPSHOT = 2 };

/* CUDA launchers (kernels/copy_kernels.cu): enqueue on ctx->stream, check the launch, return a
 * status; they never synchronize. */
gdp_status_t gdp_cuda_copy_rows(struct gdp_ctx *ctx, const gdp_copy_rows_args *args);
gdp_status_t gdp_cuda_copy_snapshot_conv(struct gdp_ctx *ctx, const gdp_copy_snapshot_conv_args *args);
gdp_status_t gdp_cuda_fill_slots(struct gdp_ctx *ctx, const gdp_fill_slots_args *args);

#ifdef __cplusplus
}
#endif

#endif /* GDP_COPY_KERNELS_H */
