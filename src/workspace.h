/*
 * workspace.h: the layout of the device scratch the CUDA chunk op carves out of the ctx
 * workspace (gdp_ctx_reserve_workspace). One function computes it, so the public size
 * query (gdp_chunk_get_workspace_size) and the launcher (kernels/chunk/launch.cu) always agree.
 */
#ifndef GDP_WORKSPACE_H
#define GDP_WORKSPACE_H

#include <stddef.h>
#include <stdint.h>

#include "gdp/gdp.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Byte offsets inside the workspace; every region starts on a 256-byte boundary.
 * Matrices are stored with K and V padded to the kernels' tiles (kp, vp) so that every
 * workspace row is 16-byte aligned and needs no bounds checks. */
typedef struct gdp_chunk_workspace_layout {
    int64_t kp, vp;        /* K rounded up to 64, 128 or 256; V rounded up to a multiple of 64 */
    int64_t h_rows;        /* chunk-state rows: tokens / 64 + requests (>= sum ceil(L_i / 64)) */
    int64_t desc_rows;     /* derived descriptor rows: gdp_max_chunk_counts(tokens, requests, M) */
    int64_t desc_rows_dp;
    size_t  off_gq;        /* [T, H] fp32 token-stream cumsum (Gq)                  */
    size_t  off_gk;        /* [T*M, H] fp32 expanded-stream cumsum (Gk)             */
    size_t  off_kn;        /* [T*M, H, kp] 16-bit keys (L2-normalized if requested) */
    size_t  off_w;         /* [T*M, H, kp] 16-bit WY factor w                       */
    size_t  off_u;         /* [T*M, H, vp] 16-bit WY factor u, overwritten by v_new */
    size_t  off_h;         /* [h_rows, H, kp, vp] 16-bit states entering each chunk */
    size_t  off_desc;      /* int32 derived descriptors (no-descriptor path only)   */
    size_t  total;         /* bytes                                                 */
} gdp_chunk_workspace_layout;

/* Carves count elements of elem bytes at the next 256-byte boundary past *cursor (cuBLASLt picks
 * its fastest kernels for 256-byte aligned operands; the copies take 16-byte vectors): their offset
 * into *offset, their end into *cursor. 0 on a negative count or size_t overflow (nothing changed).
 * The chunk workspace's regions, the Hopper kernel's segment-split scratch inside it, and the
 * layer's step workspace (layer.c). */
int gdp_ws_add(size_t *cursor, size_t *offset, int64_t count, size_t elem);
/* The bytes of a layout whose last region ends at cursor: cursor rounded up to the same boundary. */
size_t gdp_ws_end(size_t cursor);

/* Fills *out for a call with `tokens` (padded T), `requests` (N), M, H, K, V.
 * INVALID_ARGUMENT for non-positive head sizes, K or V > GDP_MAX_HEAD_DIM, negative counts,
 * M < 1, or a size that overflows. */
gdp_status_t gdp_chunk_workspace_plan(int64_t tokens, int64_t requests, int32_t num_householder,
                                      int32_t num_heads, int32_t key_dim, int32_t value_dim,
                                      gdp_chunk_workspace_layout *out);

#ifdef __cplusplus
}
#endif

#endif /* GDP_WORKSPACE_H */
