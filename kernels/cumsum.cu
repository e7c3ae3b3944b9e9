/*
 * cumsum.cu: chunk-local cumulative decays in base 2 (gdp-math.md 3.1) on the CUDA backend:
 * the token-stream sum Gq and the expanded-stream sum Gk (g placed on copy 0 of each token),
 * restarted every 64 positions of each sequence, summed in fp32 in index order, then
 * multiplied by GDP_RCP_LN2. The chunk op (chunk/launch.cu) uses the same launcher.
 */
#include <cuda_runtime.h>
#include <stdint.h>

#include "gdp_kernels.h"
#include "src/cuda_check.h"
#include "src/internal.h"

namespace {

// CUDA kernels

/* The sequence holding stream position r: the largest i with start(i) <= r, where
 * start(i) = cu_seqlens[i] * scale (scale = M on the expanded stream). Requires r < start(N). */
__device__ __forceinline__ int find_sequence(const int32_t *__restrict__ cu_seqlens, int n_seq, int64_t r,
                                             int64_t scale) {
    int lo = 0, hi = n_seq - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) >> 1;
        if ((int64_t)cu_seqlens[mid] * scale <= r)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

constexpr int CUMSUM_THREADS = 256;

/* Work split: one thread per (stream position, head) of the launch grid, but only the thread
 * at a chunk's first row works: it scans that chunk's (at most 64) positions in index order and
 * writes all of them. Every output therefore has one fixed summation order (deterministic, and
 * the same bits whichever grid computes it); threads past cu_seqlens[N] write 0. g == NULL
 * means no decay (zeros). */
template <bool EXPANDED>
__device__ __forceinline__ void chunk_local_cumsum_at(int64_t idx, float *__restrict__ out, const float *__restrict__ g,
                                                      const int32_t *__restrict__ cu_seqlens, int n_seq, int64_t rows,
                                                      int heads, int m) {
    if (idx >= rows * heads)
        return;
    int64_t r = idx / heads;
    int h = (int)(idx - r * heads);
    int64_t scale = EXPANDED ? m : 1;
    int64_t total = n_seq > 0 ? (int64_t)cu_seqlens[n_seq] * scale : 0;
    if (r >= total || g == nullptr) {
        out[idx] = 0.0f;
        return;
    }
    int i = find_sequence(cu_seqlens, n_seq, r, scale);
    int64_t bos = cu_seqlens[i];
    int64_t local = r - bos * scale;
    if (local & (GDP_CHUNK_SIZE - 1))
        return; /* written by the thread at this chunk's first row */
    int n = (int)min((int64_t)GDP_CHUNK_SIZE, ((int64_t)cu_seqlens[i + 1] - bos) * scale - local);
    float sum = 0.0f;
    if (!EXPANDED) {
#pragma unroll 8
        for (int j = 0; j < n; j++) {
            sum += g[(r + j) * heads + h];
            out[(r + j) * heads + h] = sum * GDP_RCP_LN2;
        }
    } else {
        /* Only copy 0 of each token carries its decay: local positions that are multiples of M. */
        int copy = (int)(local % m);
        int64_t token = bos + local / m;
        for (int j = 0; j < n; j++) {
            if (copy == 0)
                sum += g[token * heads + h];
            out[(r + j) * heads + h] = sum * GDP_RCP_LN2;
            if (++copy == m) {
                copy = 0;
                token++;
            }
        }
    }
}

/* Both streams in one launch (they are independent; two launches cost a second ramp and drain
 * of a kernel whose working threads are one in 64): the first q_blocks blocks write Gq (when
 * gq is not NULL), the rest Gk (when gk is not NULL). */
__global__ void __launch_bounds__(CUMSUM_THREADS) chunk_local_cumsum_kernel(float *__restrict__ gq, float *__restrict__ gk,
                                                                            const float *__restrict__ g,
                                                                            const int32_t *__restrict__ cu_seqlens,
                                                                            int n_seq, int64_t tokens, int heads, int m,
                                                                            unsigned q_blocks) {
    if (blockIdx.x < q_blocks)
        chunk_local_cumsum_at<false>((int64_t)blockIdx.x * CUMSUM_THREADS + threadIdx.x, gq, g, cu_seqlens, n_seq,
                                     tokens, heads, m);
    else
        chunk_local_cumsum_at<true>((int64_t)(blockIdx.x - q_blocks) * CUMSUM_THREADS + threadIdx.x, gk, g,
                                    cu_seqlens, n_seq, tokens * m, heads, m);
}

} // namespace

// kernel launchers

extern "C" gdp_status_t gdp_cuda_chunk_local_cumsum(struct gdp_ctx *ctx, gdp_tensor *g_cumsum,
                                                    gdp_tensor *g_cumsum_dp, const gdp_tensor *g,
                                                    const gdp_tensor *cu_seqlens, int32_t num_householder) {
    static const char *op = "gdp_chunk_local_cumsum";
    if (num_householder < 1)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: num_householder is %d, must be >= 1", op, num_householder);
    if (!gdp_tensor_present(cu_seqlens) || cu_seqlens->dtype != GDP_DTYPE_INT32 || cu_seqlens->ndim != 1 ||
        cu_seqlens->shape[0] < 1)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: cu_seqlens must be a [N+1] int32 device array", op);
    const bool have_g = gdp_tensor_present(g);
    if (have_g && (g->dtype != GDP_DTYPE_FP32 || g->ndim != 3 || !gdp_tensor_is_contiguous(g)))
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: g must be a contiguous [1, T, H] fp32 tensor", op);
    const gdp_tensor *outs[2] = {g_cumsum, g_cumsum_dp};
    const gdp_tensor *shape_src = have_g ? g : (gdp_tensor_present(g_cumsum) ? g_cumsum : NULL);
    if (shape_src == NULL && !gdp_tensor_present(g_cumsum_dp))
        return GDP_STATUS_SUCCESS; /* nothing to write */
    int64_t T, H;
    if (shape_src != NULL) {
        T = shape_src->shape[1];
        H = shape_src->shape[2];
    } else {
        T = g_cumsum_dp->shape[1] / num_householder;
        H = g_cumsum_dp->shape[2];
    }
    for (int s = 0; s < 2; s++) {
        const gdp_tensor *o = outs[s];
        if (!gdp_tensor_present(o))
            continue;
        int64_t rows = s == 0 ? T : T * num_householder;
        if (o->dtype != GDP_DTYPE_FP32 || o->ndim != 3 || o->shape[0] != 1 || o->shape[1] != rows ||
            o->shape[2] != H || !gdp_tensor_is_contiguous(o))
            GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: %s must be a contiguous [1, %lld, %lld] fp32 tensor", op,
                     s == 0 ? "g_cumsum" : "g_cumsum_dp", (long long)rows, (long long)H);
    }
    if (H < 1 || H > INT32_MAX)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: %lld heads; expected 1 .. 2^31-1", op, (long long)H);

    cudaStream_t stream = (cudaStream_t)ctx->stream;
    const int n_seq = (int)(cu_seqlens->shape[0] - 1);
    const float *gp = have_g ? (const float *)g->data : nullptr;
    const int32_t *cu = (const int32_t *)cu_seqlens->data;
    const bool want_q = gdp_tensor_present(g_cumsum), want_k = gdp_tensor_present(g_cumsum_dp);
    const int64_t q_blocks = want_q ? (T * H + CUMSUM_THREADS - 1) / CUMSUM_THREADS : 0;
    const int64_t k_blocks = want_k ? (T * num_householder * H + CUMSUM_THREADS - 1) / CUMSUM_THREADS : 0;
    if (q_blocks + k_blocks > INT32_MAX)
        GDP_FAIL(GDP_STATUS_UNSUPPORTED, "%s: %lld tokens x %lld heads x M %d exceed one launch's grid", op,
                 (long long)T, (long long)H, num_householder);
    if (q_blocks + k_blocks > 0)
        chunk_local_cumsum_kernel<<<(unsigned)(q_blocks + k_blocks), CUMSUM_THREADS, 0, stream>>>(
            want_q ? (float *)g_cumsum->data : nullptr, want_k ? (float *)g_cumsum_dp->data : nullptr, gp, cu, n_seq, T,
            (int)H, num_householder, (unsigned)q_blocks);
    GDP_CUDA_LAUNCH_CHECK(op, cudaGetLastError(), "T %lld, H %lld", (long long)T, (long long)H);
    return GDP_STATUS_SUCCESS;
}
