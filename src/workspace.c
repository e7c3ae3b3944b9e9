/*
 * workspace.c: the device workspace a ctx owns (gdp_ctx_reserve_workspace) and the size the
 * CUDA chunk op needs from it (gdp_chunk_get_workspace_size, gdp_chunk_workspace_plan).
 * Reserving is the only place the chunk op's scratch is allocated, so a step whose
 * descriptors are given allocates nothing and can be captured in a CUDA graph.
 */
#include <string.h>

#include "internal.h"
#include "workspace.h"

#ifdef GDP_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "cuda_check.h"
#endif

#define WS_ALIGN 256u

int gdp_ws_add(size_t *cursor, size_t *offset, int64_t count, size_t elem) {
    size_t start = (*cursor + (WS_ALIGN - 1)) & ~(size_t)(WS_ALIGN - 1);
    if (count < 0 || (count > 0 && (size_t)count > (SIZE_MAX - start) / elem))
        return 0;
    *offset = start;
    *cursor = start + (size_t)count * elem;
    return 1;
}

size_t gdp_ws_end(size_t cursor) {
    return (cursor + (WS_ALIGN - 1)) & ~(size_t)(WS_ALIGN - 1);
}

gdp_status_t gdp_chunk_workspace_plan(int64_t tokens, int64_t requests, int32_t num_householder,
                                      int32_t num_heads, int32_t key_dim, int32_t value_dim,
                                      gdp_chunk_workspace_layout *out) {
    static const char *op = "gdp_chunk_get_workspace_size";
    if (out == NULL)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: the output pointer is NULL", op);
    if (num_heads < 1 || key_dim < 1 || value_dim < 1 || key_dim > GDP_MAX_HEAD_DIM ||
        value_dim > GDP_MAX_HEAD_DIM)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                 "%s: num_heads %d, key_dim %d and value_dim %d must be >= 1, head dims at most %d", op,
                 num_heads, key_dim, value_dim, GDP_MAX_HEAD_DIM);
    int64_t max_chunks = 0, max_chunks_dp = 0;
    GDP_CHECK(gdp_max_chunk_counts(tokens, requests, num_householder, &max_chunks, &max_chunks_dp));

    gdp_chunk_workspace_layout l;
    memset(&l, 0, sizeof l);
    l.kp = key_dim <= 64 ? 64 : (key_dim <= 128 ? 128 : 256);
    l.vp = (value_dim + 63) / 64 * 64;
    l.h_rows = tokens / GDP_CHUNK_SIZE + requests;
    l.desc_rows = max_chunks;
    l.desc_rows_dp = max_chunks_dp;
    int64_t rows = tokens * num_householder * (int64_t)num_heads; /* expanded rows x heads */
    size_t cur = 0;
    int ok = gdp_ws_add(&cur, &l.off_gq, tokens * num_heads, sizeof(float)) &&
             gdp_ws_add(&cur, &l.off_gk, rows, sizeof(float)) && gdp_ws_add(&cur, &l.off_kn, rows * l.kp, 2) &&
             gdp_ws_add(&cur, &l.off_w, rows * l.kp, 2) && gdp_ws_add(&cur, &l.off_u, rows * l.vp, 2) &&
             gdp_ws_add(&cur, &l.off_h, l.h_rows * num_heads * l.kp * l.vp, 2) &&
             gdp_ws_add(&cur, &l.off_desc, 2 * max_chunks + 2 * max_chunks_dp + requests + 1, sizeof(int32_t));
    if (!ok)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: %lld tokens x %d heads overflow the workspace size; split the step",
                 op, (long long)tokens, num_heads);
    l.total = gdp_ws_end(cur);
    *out = l;
    return GDP_STATUS_SUCCESS;
}

gdp_status_t gdp_chunk_get_workspace_size(int64_t max_tokens, int64_t max_requests, int32_t num_householder,
                                          int32_t num_heads, int32_t key_dim, int32_t value_dim, size_t *bytes) {
    if (bytes == NULL)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "gdp_chunk_get_workspace_size: bytes is NULL");
    gdp_chunk_workspace_layout l = {0};
    GDP_CHECK(gdp_chunk_workspace_plan(max_tokens, max_requests, num_householder, num_heads, key_dim, value_dim,
                                       &l));
    *bytes = l.total;
    return GDP_STATUS_SUCCESS;
}

gdp_status_t gdp_ctx_reserve_workspace(gdp_ctx_t ctx, size_t bytes) {
    GDP_CHECK(gdp_ctx_check(ctx, "gdp_ctx_reserve_workspace"));
    if (ctx->backend != GDP_BACKEND_CUDA || bytes <= ctx->workspace_bytes)
        return GDP_STATUS_SUCCESS; /* the CPU backend needs no device scratch */
#ifdef GDP_HAVE_CUDA
    /* cudaFree waits for work still using the old buffer; graphs captured with it are invalid after this. */
    if (ctx->workspace != NULL) {
        cudaError_t ferr = cudaFree(ctx->workspace);
        ctx->workspace = NULL;
        ctx->workspace_bytes = 0;
        if (ferr != cudaSuccess)
            GDP_CUDA_FAIL(ferr, "gdp_ctx_reserve_workspace: freeing the old workspace failed");
    }
    void *p = NULL;
    cudaError_t err = cudaMalloc(&p, bytes);
    if (err != cudaSuccess)
        GDP_CUDA_FAIL(err, "gdp_ctx_reserve_workspace: cudaMalloc(%zu bytes) failed (reserve for fewer tokens per step)",
                      bytes);
    ctx->workspace = p;
    ctx->workspace_bytes = bytes;
    ctx->workspace_grows++;
    return GDP_STATUS_SUCCESS;
#else
    GDP_FAIL(GDP_STATUS_UNSUPPORTED, "gdp_ctx_reserve_workspace: this libgdp was built without CUDA");
#endif
}
