/*
 * copy_kernels.cu: the CUDA kernels of the layer's, cache's and plan's index-driven data
 * movement (kernels/copy_kernels.h): row copies by slot index (a prefill's initial
 * states gathered from the cache, prefix-snapshot saves from the final or chunk states),
 * the conv window of a snapshot save, and the slot fills of a step (zero, draft rollback,
 * snapshot restore) on every layer in one launch. The indices are device arrays of the
 * step's metadata, so the launches and their grids depend only on the padded step shape,
 * never on a host copy of the indices: a step stays capturable in a CUDA graph.
 *
 * Work split: copies give each block one row (or one (op, layer, ssm|conv) pair) and a span of
 * its bytes, moved as 16-, 4- or 1-byte words by the block's threads, whichever the span's
 * alignment allows; the snapshot conv window is one thread per (request, channel).
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "copy_kernels.h"
#include "src/cuda_check.h"
#include "src/internal.h"

// CUDA kernels

namespace {

constexpr int LU_THREADS = 256;
constexpr int LU_MAX_SPANS = 64;          /* blocks sharing one row                        */
constexpr size_t LU_SPAN_MIN = 16 * 1024; /* bytes a block moves at least before splitting:
                                             one round of LU_UNROLL 16-byte loads a thread */
constexpr int LU_UNROLL = 4;              /* 16-byte loads a thread keeps in flight        */
constexpr int LU_MAX_WIDTH = 8;           /* conv widths the front-ends accept              */

/* The block's threads copy `bytes` bytes from src to dst (src == NULL: write zeros). */
__device__ __forceinline__ void block_copy(char *dst, const char *src, size_t bytes) {
    const uintptr_t align = reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src) | bytes;
    if ((align & 15u) == 0) {
        /* LU_UNROLL loads in flight before their stores: a store may alias the next load as far
         * as the compiler can tell, so a load-store loop pays one memory latency a 16 bytes
         * (ncu: a 1 MB state gather in 9.6 us) */
        uint4 *d = reinterpret_cast<uint4 *>(dst);
        const uint4 *s = reinterpret_cast<const uint4 *>(src);
        const size_t n = bytes / 16, stride = blockDim.x;
        for (size_t i = threadIdx.x; i < n; i += LU_UNROLL * stride) {
            uint4 v[LU_UNROLL];
#pragma unroll
            for (int k = 0; k < LU_UNROLL; k++)
                v[k] = s != nullptr && i + k * stride < n ? s[i + k * stride] : make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
            for (int k = 0; k < LU_UNROLL; k++)
                if (i + k * stride < n)
                    d[i + k * stride] = v[k];
        }
    } else if ((align & 3u) == 0) {
        uint32_t *d = reinterpret_cast<uint32_t *>(dst);
        const uint32_t *s = reinterpret_cast<const uint32_t *>(src);
        for (size_t i = threadIdx.x; i < bytes / 4; i += blockDim.x)
            d[i] = s != nullptr ? s[i] : 0u;
    } else {
        for (size_t i = threadIdx.x; i < bytes; i += blockDim.x)
            dst[i] = src != nullptr ? src[i] : static_cast<char>(0);
    }
}

/* Span `part` of `parts` of a row of `bytes` bytes: [*begin, *begin + *len), 16-byte multiples
 * apart so a 16-byte aligned row keeps its alignment in every span. */
__device__ __forceinline__ void row_span(size_t bytes, unsigned part, unsigned parts, size_t *begin, size_t *len) {
    size_t span = (bytes + parts - 1) / parts;
    span = (span + 15) / 16 * 16;
    const size_t b = (size_t)part * span;
    *begin = b < bytes ? b : bytes;
    *len = b < bytes ? (bytes - b < span ? bytes - b : span) : 0;
}

/* Block (row i, span y). */
__global__ void __launch_bounds__(LU_THREADS) copy_rows_kernel(const gdp_copy_rows_args a) {
    const int64_t i = blockIdx.x;
    const int64_t d = a.dst_idx != nullptr ? a.dst_idx[i] : i;
    if (d < 0 || d >= a.dst_rows)
        return;
    const int64_t s = a.src_idx != nullptr ? a.src_idx[i] : i;
    const bool have_src = s >= 0 && s < a.src_rows;
    if (!have_src && !a.zero_missing)
        return;
    size_t begin, len;
    row_span(a.row_bytes, blockIdx.y, gridDim.y, &begin, &len);
    char *dst = static_cast<char *>(a.dst) + (size_t)d * a.row_bytes + begin;
    const char *src = have_src ? static_cast<const char *>(a.src) + (size_t)s * a.row_bytes + begin : nullptr;
    block_copy(dst, src, len);
}

/* Block (op * num_layers + layer, span y, z = 0 ssm | 1 conv). */
__global__ void __launch_bounds__(LU_THREADS) cache_fill_kernel(const gdp_fill_slots_args a) {
    const int32_t op = (int32_t)(blockIdx.x / (unsigned)a.num_layers);
    const int32_t layer = (int32_t)(blockIdx.x % (unsigned)a.num_layers);
    const bool conv = blockIdx.z == 1;
    const int32_t slot = a.ops[3 * op], source = a.ops[3 * op + 1], row = a.ops[3 * op + 2];
    const size_t bytes = conv ? a.conv_bytes : a.ssm_bytes;
    char *dst_base = static_cast<char *>(a.tables[(conv ? GDP_FILL_CONV : GDP_FILL_SSM) * a.num_layers + layer]);
    if (slot < 0 || slot >= a.n_slots || dst_base == nullptr)
        return;
    const char *src_base = nullptr;
    if (source == GDP_FILL_FROM_DRAFT) {
        src_base = static_cast<const char *>(
            a.tables[(conv ? GDP_FILL_DRAFT_CONV : GDP_FILL_DRAFT_SSM) * a.num_layers + layer]);
        if (row < 0 || row >= a.draft_rows || src_base == nullptr)
            return;
    } else if (source == GDP_FILL_FROM_SNAPSHOT) {
        src_base = static_cast<const char *>(
            a.tables[(conv ? GDP_FILL_SNAP_CONV : GDP_FILL_SNAP_SSM) * a.num_layers + layer]);
        if (row < 0 || row >= a.n_snapshots || src_base == nullptr)
            return;
    } else if (source != GDP_FILL_ZERO) {
        return;
    }
    size_t begin, len;
    row_span(bytes, blockIdx.y, gridDim.y, &begin, &len);
    block_copy(dst_base + (size_t)slot * bytes + begin,
               src_base != nullptr ? src_base + (size_t)row * bytes + begin : nullptr, len);
}

__device__ __forceinline__ float load_f(const void *base, gdp_dtype_t dtype, int64_t i) {
    switch (dtype) {
    case GDP_DTYPE_BF16: return __bfloat162float(static_cast<const __nv_bfloat16 *>(base)[i]);
    case GDP_DTYPE_FP16: return __half2float(static_cast<const __half *>(base)[i]);
    default: return static_cast<const float *>(base)[i];
    }
}

__device__ __forceinline__ void store_f(void *base, gdp_dtype_t dtype, int64_t i, float v) {
    switch (dtype) {
    case GDP_DTYPE_BF16: static_cast<__nv_bfloat16 *>(base)[i] = __float2bfloat16_rn(v); break;
    case GDP_DTYPE_FP16: static_cast<__half *>(base)[i] = __float2half_rn(v); break;
    default: static_cast<float *>(base)[i] = v; break;
    }
}

/* Thread (request i, channel c): the W columns of the window after offset[i] tokens. The
 * values are those the varlen conv would store (x converted to the conv dtype), so a
 * snapshot restores exactly the window an uninterrupted run holds at that token. */
__global__ void __launch_bounds__(LU_THREADS) snapshot_conv_kernel(const gdp_copy_snapshot_conv_args a) {
    const int64_t idx = (int64_t)blockIdx.x * LU_THREADS + threadIdx.x;
    if (idx >= a.n * a.channels)
        return;
    const int64_t i = idx / a.channels, c = idx % a.channels;
    const int64_t snap = a.snapshot[i];
    if (snap < 0 || snap >= a.n_snapshots)
        return;
    const int64_t slot = a.slots[i], off = a.offset[i], start = a.cu_seqlens[i];
    const bool have_slot = slot >= 0 && slot < a.n_slots;
    const int W = a.width;
    float col[LU_MAX_WIDTH];
    for (int j = 0; j < W; j++) {
        const int64_t u = off + j; /* position in (window ++ tokens) */
        if (u < W)
            col[j] = have_slot ? load_f(a.conv, a.conv_dtype, (slot * a.channels + c) * W + u) : 0.0f;
        else
            col[j] = load_f(a.x, a.x_dtype, (start + u - W) * a.x_pitch + c);
    }
    for (int j = 0; j < W; j++)
        store_f(a.snap_conv, a.conv_dtype, (snap * a.channels + c) * W + j, col[j]);
}

/* Blocks sharing one row of `bytes` bytes: enough that each moves at least LU_SPAN_MIN. */
unsigned spans_for(size_t bytes) {
    size_t s = (bytes + LU_SPAN_MIN - 1) / LU_SPAN_MIN;
    return (unsigned)(s < 1 ? 1 : (s > LU_MAX_SPANS ? LU_MAX_SPANS : s));
}

} // namespace

// kernel launchers

extern "C" gdp_status_t gdp_cuda_copy_rows(struct gdp_ctx *ctx, const gdp_copy_rows_args *a) {
    static const char *op = "gdp_copy_rows";
    if (a->n <= 0 || a->row_bytes == 0)
        return GDP_STATUS_SUCCESS;
    if (a->n > INT32_MAX)
        GDP_FAIL(GDP_STATUS_UNSUPPORTED, "%s: %lld rows exceed the grid (at most %d)", op, (long long)a->n,
                 INT32_MAX);
    const dim3 grid((unsigned)a->n, spans_for(a->row_bytes));
    copy_rows_kernel<<<grid, LU_THREADS, 0, static_cast<cudaStream_t>(ctx->stream)>>>(*a);
    GDP_CUDA_LAUNCH_CHECK(op, cudaGetLastError(), "%lld rows of %zu bytes", (long long)a->n, a->row_bytes);
    return GDP_STATUS_SUCCESS;
}

extern "C" gdp_status_t gdp_cuda_copy_snapshot_conv(struct gdp_ctx *ctx, const gdp_copy_snapshot_conv_args *a) {
    static const char *op = "gdp_copy_snapshot_conv";
    if (a->width < 1 || a->width > LU_MAX_WIDTH)
        GDP_FAIL(GDP_STATUS_UNSUPPORTED, "%s: conv width %d; the kernel takes 1..%d", op, a->width, LU_MAX_WIDTH);
    const int64_t threads = a->n * a->channels;
    if (threads <= 0)
        return GDP_STATUS_SUCCESS;
    const int64_t blocks = (threads + LU_THREADS - 1) / LU_THREADS;
    if (blocks > INT32_MAX)
        GDP_FAIL(GDP_STATUS_UNSUPPORTED, "%s: %lld requests x %lld channels exceed the grid", op, (long long)a->n,
                 (long long)a->channels);
    snapshot_conv_kernel<<<(unsigned)blocks, LU_THREADS, 0, static_cast<cudaStream_t>(ctx->stream)>>>(*a);
    GDP_CUDA_LAUNCH_CHECK(op, cudaGetLastError(), "%lld blocks", (long long)blocks);
    return GDP_STATUS_SUCCESS;
}

extern "C" gdp_status_t gdp_cuda_fill_slots(struct gdp_ctx *ctx, const gdp_fill_slots_args *a) {
    static const char *op = "gdp_fill_slots";
    if (a->n_ops <= 0 || a->num_layers <= 0)
        return GDP_STATUS_SUCCESS;
    const int64_t pairs = (int64_t)a->n_ops * a->num_layers;
    if (pairs > INT32_MAX)
        GDP_FAIL(GDP_STATUS_UNSUPPORTED, "%s: %d slot fills x %d layers exceed the grid", op, a->n_ops,
                 a->num_layers);
    const size_t larger = a->ssm_bytes > a->conv_bytes ? a->ssm_bytes : a->conv_bytes;
    const dim3 grid((unsigned)pairs, spans_for(larger), 2);
    cache_fill_kernel<<<grid, LU_THREADS, 0, static_cast<cudaStream_t>(ctx->stream)>>>(*a);
    GDP_CUDA_LAUNCH_CHECK(op, cudaGetLastError(), "%d fills over %d layers", (int)a->n_ops, (int)a->num_layers);
    return GDP_STATUS_SUCCESS;
}
