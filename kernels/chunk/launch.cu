/*
 * launch.cu: the CUDA chunked prefill op chunk_gated_delta_product_varlen (gdp-math.md 3, 4).
 *
 * Stages, each one kernel, all on tensor cores (mma.sync m16n8k16, 16-bit inputs, fp32
 * accumulation) except the small triangular solve:
 *   cumsum (../cumsum.cu) Gq, Gk: chunk-local base-2 cumulative decays of both streams
 *   chunk_wy_kernel     per expanded chunk: keys (L2-normalized if asked, rounded to the
 *                       input dtype), A = beta K K^T with decay, Ai = (I + A)^-1 in fp32
 *                       (off-diagonal products on tf32 tensor cores unless
 *                       GDP_CHUNK_WY_INVERSE=fp32), w = Ai (beta 2^Gk K), u = Ai (beta V)
 *   chunk_state_kernel  per (sequence, head, VB value columns; VB = 64, 32 or 16 so that few
 *                       sequences still fill the device, GDP_CHUNK_STATE_VB forces one): the
 *                       sequential sweep over the sequence's expanded chunks, state in
 *                       registers, bitwise the same for every VB; v_new = u - w S,
 *                       S = 2^gl S + K^T (2^(gl - Gk) v_new); stores the state entering each
 *                       token chunk, chunk states, the final state or the cache slot
 *   chunk_out_kernel    per (token chunk, head, 128 value columns): o = scale (2^Gq (Q h) +
 *                       sum_m ((Q K_m^T) . D) V_new,m) with the token-causal mask D
 *   zero_tail_kernel    output rows past cu_seqlens[N] = 0 (on the staged path with chunks, the
 *                       output stage's blocks do it: one launch fewer)
 * Intermediates live in the ctx workspace (src/workspace.h), padded to the tile sizes. With
 * descriptors given nothing is allocated and nothing waits for the host, and the grids
 * depend only on (num_chunks, num_chunks_dp, T, N, H) and, for the state sweep's column blocks,
 * the device's SM count and GDP_CHUNK_STATE_VB, so the call can be graph-captured.
 * Rounding points follow upstream (gdp-math.md 3.3-3.6): keys, Ai, w, u, v_new, the decayed
 * v_new, the states fed to w S and to the output stage, and the masked scores are 16-bit.
 *
 * This file is the folder's one translation unit: it holds the extern "C" launcher
 * gdp_cuda_chunk (checks, descriptors, ChunkParams, the enqueue of every stage) and includes
 * the stage headers, so all kernels and template instances live in one anonymous namespace as
 * before. The files of kernels/chunk/:
 *   common.cuh  tile constants, ChunkParams, element access in any dtype
 *   mma.cuh     Elem<T> and mma.sync, ldmatrix, cp.async, fragment loaders
 *   tile.cuh    64-row tile loads and the row L2 norm
 *   wy.cuh      chunk_wy_kernel (stage 1)
 *   wy_math.cuh A = beta K K^T and (I + A)^-1, shared by the WY stage and the fused kernel
 *   state.cuh   chunk_state_kernel (stage 2)
 *   out.cuh     chunk_out_kernel (stage 3), zero_tail_kernel
 *   fused.cuh   chunk_fused_kernel: the whole op in one pass (GDP_CHUNK_PATH=fused)
 *   hopper.cuh  chunk_hopper_kernel: the one pass on wgmma (GDP_CHUNK_PATH=hopper), in its own
 *               translation unit hopper.cu (sm_90a only), reached through hopper.h
 *   wgmma.cuh   the warpgroup MMA helpers and the swizzled panel layout hopper.cuh uses
 *   stages.cuh  Stages<T, KP>, launch_stages<T>: the templated dispatch
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/device_info.h"
#include "kernels/dtype_access.cuh" /* aligned16 */
#include "kernels/gdp_kernels.h"
#include "src/cuda_check.h"
#include "src/internal.h"
#include "src/workspace.h"

#include "hopper.h"
#include "stages.cuh"

namespace {

/* GDP_CHUNK_STATE_VB = 64, 32 or 16 forces the state sweep's value-column block width (for
 * measurement and the bitwise test across widths); unset, empty or 0 lets stages.cuh choose.
 * Read on every call (gdp_env_choice, src/internal.h). Returns the width, 0 for "choose", or -1
 * for any other value. */
int state_vb_from_env(const char **text) {
    static const char *const spell[4] = {"0", "64", "32", "16"};
    static const int value[4] = {0, 64, 32, 16};
    return gdp_env_choice("GDP_CHUNK_STATE_VB", spell, value, 4, 0, text);
}

/* Which kernels run the op: the staged chain (cumsums, WY, state sweep, outputs), the one-pass
 * fused kernel (fused.cuh, mma.sync) or the one-pass Hopper kernel (hopper.cuh, wgmma) where the
 * shape and the device allow it. GDP_CHUNK_PATH = staged | fused | hopper forces one (a shape or
 * device the asked kernel does not take runs the next: hopper -> fused -> staged); unset, empty
 * or auto lets the op choose: the Hopper kernel, unsplit or split into segments, where
 * gdp_chunk_auto_choose (descriptors.c) expects it to win from the work's shape and the longest
 * sequence's length (args' max_seqlen, or the lengths read when no descriptors are given), else the
 * staged chain, or the fused kernel under
 * FUSED_BY_DEFAULT (off: measured slower, kernels/NOTES-chunk.md).
 * Returns 0 staged, 1 fused, 2 auto, 3 hopper, -1 for any other value. */
constexpr bool FUSED_BY_DEFAULT = false;
int chunk_path_from_env(const char **text) {
    static const char *const spell[4] = {"auto", "staged", "fused", "hopper"};
    static const int value[4] = {2, 0, 1, 3};
    return gdp_env_choice("GDP_CHUNK_PATH", spell, value, 4, 2, text);
}

/* Whether the Hopper kernel can run these params on a device of capability cc: built (CUDA 12 or
 * later), a compute capability 9.0 device (its code is sm_90a only), and a shape it takes. */
bool hopper_runs(const ChunkParams &p, int cc) {
#ifdef GDP_HAVE_CHUNK_HOPPER
    return cc == 90 && gdp_chunk_hopper_fits(&p);
#else
    (void)p;
    (void)cc;
    return false;
#endif
}

/* Who issues the state sweep's copies (state.cuh's STATE_COPY_*): one producer warp moving each
 * chunk's tiles by three tensor-map copies of the copy engine (tma, the default on compute
 * capability 9.0 and later: measured 8 % faster state stage on one 16384-token sequence and 2-7 %
 * on the others; kernels/NOTES-chunk.md, twenty-first session; K = 256, an older device or a
 * driver without the map encoder take producer), one producer warp by cp.async (producer: 12 %
 * faster on the long sequence than every warp, seventeenth session), or every warp (warps, the
 * earlier kernel). GDP_CHUNK_STATE_COPY; returns the STATE_COPY_* value, or -1 for any other value. */
int state_copy_from_env(const char **text) {
    static const char *const spell[3] = {"warps", "producer", "tma"};
    static const int value[3] = {STATE_COPY_WARPS, STATE_COPY_PRODUCER, STATE_COPY_TMA};
    return gdp_env_choice("GDP_CHUNK_STATE_COPY", spell, value, 3, STATE_COPY_TMA, text);
}

/* Who moves the Hopper kernel's K, V and Q tiles (GDP_CHUNK_HOPPER_COPY): the aux warpgroup's
 * threads by cp.async (threads) or its thread 0 by tensor-map copies (tma; the same bits); unset,
 * empty or auto: tma at V = 128, threads at V = 64, as measured once the aux warpgroup's chain set the
 * chunk's period (kernels/NOTES-chunk.md, forty-eighth session, H100: tma 1-3 % faster on the V = 128
 * rows, where the aux threads' copy instructions sat on that chain; no faster at V = 64). Returns 1
 * (tma), 0 (threads), 2 (auto), or -1 for any other value. */
int hopper_copy_from_env(const char **text) {
    static const char *const spell[3] = {"auto", "threads", "tma"};
    static const int value[3] = {2, 0, 1};
    return gdp_env_choice("GDP_CHUNK_HOPPER_COPY", spell, value, 3, 2, text);
}

/* The Hopper kernel's exact segment split (GDP_CHUNK_SEGMENT; kernels/NOTES-chunk.md, "Exact
 * segments"): unset, 0 or auto lets the op choose the segment length from the work (hopper_segment),
 * off never splits (one block per sequence and head, the kernel before the split), a whole number
 * from 1 to 512 forces that many expanded chunks a segment (the first segment of a sequence twice
 * that: hopper_split.cuh; the tests' short segments, or auto's choice replayed). Returns 0 (auto),
 * -2 (off), the forced length, or -1 for any other value. */
int hopper_segment_from_env(const char **text) {
    static const char *const spell[3] = {"0", "auto", "off"};
    static const int value[3] = {0, 0, -2};
    const int named = gdp_env_choice("GDP_CHUNK_SEGMENT", spell, value, 3, 0, text);
    if (named != -1)
        return named;
    char *end = nullptr;
    const long n = strtol(*text, &end, 10);
    return end != *text && *end == '\0' && n >= 1 && n <= 512 ? (int)n : -1;
}

/* The segment length the split takes: the forced one, else gdp_chunk_split_segment's (descriptors.c:
 * the length whose items' waves end first), doubled while the split's scratch does not fit in the
 * staged path's intermediates (which the Hopper path does not use) or its items overflow int indices;
 * 0 for off and when no sequence is longer than its first segment, 2 S chunks (the longest's expanded
 * chunks from max_len, its tokens, else from T: a batch whose sequences all fit in a first segment
 * runs unsplit, not through the split's plan and empty F items). */
#ifdef GDP_HAVE_CHUNK_HOPPER
int hopper_segment(const ChunkParams &p, int forced, int sms, int64_t num_chunks_dp, int64_t max_len, void *ws,
                   size_t ws_bytes, GdpHopperSplit *split) {
    if (forced == -2) /* off: unsplit */
        return 0;
    const int64_t longest = ((max_len > 0 ? max_len : p.T) * p.M + CHUNK - 1) / CHUNK; /* expanded chunks */
    long long seg = forced != 0 ? forced : gdp_chunk_split_segment(num_chunks_dp, p.H, longest, sms);
    for (; 2 * seg < longest; seg *= 2) {
        const long long segs = gdp_chunk_hopper_split_segments(p.T, p.N, p.M, (int)seg);
        /* at most 2 segs - N items (int indices) */
        if (2 * segs - p.N < (1ll << 31) && gdp_chunk_hopper_split_bytes(&p, segs) <= ws_bytes) {
            split->seg_chunks = (int)seg;
            split->max_segs = (int)segs;
            split->ws = ws;
            return (int)seg;
        }
    }
    return 0;
}
#endif

/* How WY inverts I + A: the off-diagonal blocks' products on tf32 tensor cores (tf32, the
 * default: measured 5 % faster WY, kernels/NOTES-chunk.md, nineteenth session; fp32
 * accumulation, Ai then rounded to the 16-bit input type) or every product on CUDA cores in
 * fp32 (fp32, the earlier kernel, kept for A/B runs; not the same bits). GDP_CHUNK_WY_INVERSE;
 * returns 1 (tf32), 0 (fp32), or -1 for any other value. */
int wy_inverse_from_env(const char **text) {
    static const char *const spell[2] = {"fp32", "tf32"};
    static const int value[2] = {0, 1};
    return gdp_env_choice("GDP_CHUNK_WY_INVERSE", spell, value, 2, 1, text);
}

} // namespace

/* Calls that ran the Hopper kernel (gdp_cuda_chunk_hopper_calls); relaxed: a test's counter. */
static long long hopper_calls = 0;
extern "C" long long gdp_cuda_chunk_hopper_calls(void) { return __atomic_load_n(&hopper_calls, __ATOMIC_RELAXED); }
static int hopper_last_segment = 0; /* gdp_cuda_chunk_hopper_last_segment */
extern "C" int gdp_cuda_chunk_hopper_last_segment(void) { return __atomic_load_n(&hopper_last_segment, __ATOMIC_RELAXED); }

// kernel launchers

extern "C" gdp_status_t gdp_cuda_chunk(struct gdp_ctx *ctx, const gdp_chunk_args *a) {
    static const char *op = "gdp_chunk_gated_delta_product_varlen";
    /* ---- CUDA-only rules (the front-end checked shapes and dtypes common to all backends) ---- */
    if (a->q.dtype != GDP_DTYPE_BF16 && a->q.dtype != GDP_DTYPE_FP16)
        GDP_FAIL(GDP_STATUS_UNSUPPORTED,
                 "%s: q has dtype %s; the CUDA chunk op takes bf16 or fp16 q, k, v (as upstream); cast the inputs "
                 "or use GDP_BACKEND_CPU",
                 op, gdp_dtype_name(a->q.dtype));
    if (a->k.dtype != a->q.dtype || a->v.dtype != a->q.dtype || a->o.dtype != a->q.dtype)
        GDP_FAIL(GDP_STATUS_UNSUPPORTED, "%s: k (%s), v (%s) and o (%s) must have q's dtype %s on the CUDA backend",
                 op, gdp_dtype_name(a->k.dtype), gdp_dtype_name(a->v.dtype), gdp_dtype_name(a->o.dtype),
                 gdp_dtype_name(a->q.dtype));
    if (a->q.ndim != 4 || a->v.ndim != 4 || a->cu_seqlens.ndim != 1 || a->cu_seqlens.shape[0] < 1)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: q, v must be 4-d and cu_seqlens [N+1]", op);
    const int64_t T = a->q.shape[1], H = a->q.shape[2], K = a->q.shape[3], V = a->v.shape[3];
    const int64_t N = a->cu_seqlens.shape[0] - 1;
    const int32_t M = a->num_householder;
    if (K < 1 || V < 1 || K > GDP_MAX_HEAD_DIM || V > GDP_MAX_HEAD_DIM || H < 1 || M < 1)
        GDP_FAIL(GDP_STATUS_UNSUPPORTED, "%s: K = %lld, V = %lld, H = %lld, M = %d; the CUDA op takes 1 <= K, V <= %d",
                 op, (long long)K, (long long)V, (long long)H, M, GDP_MAX_HEAD_DIM);
    if (H > 65535 || N > 65535)
        GDP_FAIL(GDP_STATUS_UNSUPPORTED, "%s: %lld heads and %lld sequences; the CUDA grids take at most 65535 each",
                 op, (long long)H, (long long)N);
    const gdp_tensor *dense[] = {&a->q, &a->k, &a->v, &a->g, &a->beta, &a->o, &a->cu_seqlens, &a->initial_state,
                                 &a->final_state, &a->chunk_states, &a->chunk_indices, &a->chunk_indices_dp,
                                 &a->chunk_offsets, &a->state_indices};
    const char *dense_names[] = {"q", "k", "v", "g", "beta", "o", "cu_seqlens", "initial_state", "final_state",
                                 "chunk_states", "chunk_indices", "chunk_indices_dp", "chunk_offsets",
                                 "state_indices"};
    for (size_t d = 0; d < sizeof dense / sizeof dense[0]; d++)
        if (gdp_tensor_present(dense[d]) && !gdp_tensor_is_contiguous(dense[d]))
            GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: %s must be contiguous on the CUDA backend; pass a contiguous copy",
                     op, dense_names[d]);
    const bool have_state = gdp_tensor_present(&a->state);
    if (have_state) {
        if (a->state.ndim != 4 || gdp_tensor_stride(&a->state, 3) != 1 || gdp_tensor_stride(&a->state, 2) != V)
            GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                     "%s: state must be [slots, H, K, V] with its last two dims contiguous (strides %lld, 1 expected "
                     "%lld, 1)",
                     op, (long long)gdp_tensor_stride(&a->state, 2), (long long)V);
        if (a->state.dtype == GDP_DTYPE_INT32)
            GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: state must be fp32 or bf16", op);
    }
    const gdp_tensor *fl[] = {&a->initial_state, &a->final_state, &a->chunk_states, &a->beta};
    const char *fl_names[] = {"initial_state", "final_state", "chunk_states", "beta"};
    for (int d = 0; d < 4; d++)
        if (gdp_tensor_present(fl[d]) && fl[d]->dtype == GDP_DTYPE_INT32)
            GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: %s must be a float tensor", op, fl_names[d]);
    if (gdp_tensor_present(&a->g) && a->g.dtype != GDP_DTYPE_FP32)
        GDP_FAIL(GDP_STATUS_UNSUPPORTED, "%s: g has dtype %s; the CUDA op takes fp32 g", op, gdp_dtype_name(a->g.dtype));
    const bool have_desc = gdp_tensor_present(&a->chunk_indices) && gdp_tensor_present(&a->chunk_indices_dp) &&
                           gdp_tensor_present(&a->chunk_offsets);
    const bool any_desc = gdp_tensor_present(&a->chunk_indices) || gdp_tensor_present(&a->chunk_indices_dp) ||
                          gdp_tensor_present(&a->chunk_offsets);
    if (any_desc && !have_desc)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: pass all three descriptors (chunk_indices, chunk_indices_dp, "
                 "chunk_offsets) or none", op);
    if (gdp_tensor_present(&a->state_indices) && !have_desc)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: state_indices needs the three descriptors (as upstream); build them "
                 "with gdp_build_chunk_descriptors", op);
    const bool want_cs = a->return_chunk_states && gdp_tensor_present(&a->chunk_states);
    const char *vb_text = nullptr;
    const int state_vb = state_vb_from_env(&vb_text);
    if (state_vb < 0)
        GDP_FAIL(GDP_STATUS_INVALID_USAGE,
                 "%s: GDP_CHUNK_STATE_VB is \"%s\"; it takes 64, 32 or 16 (the state sweep's value-column block), "
                 "or 0 / unset to let the op choose",
                 op, vb_text);
    const char *copy_text = nullptr;
    const int state_copy = state_copy_from_env(&copy_text);
    if (state_copy < 0)
        GDP_FAIL(GDP_STATUS_INVALID_USAGE, "%s: GDP_CHUNK_STATE_COPY is \"%s\"; it takes tma, producer or warps (unset: tma)",
                 op, copy_text);
    const char *inverse_text = nullptr;
    const int wy_inverse = wy_inverse_from_env(&inverse_text);
    if (wy_inverse < 0)
        GDP_FAIL(GDP_STATUS_INVALID_USAGE, "%s: GDP_CHUNK_WY_INVERSE is \"%s\"; it takes tf32 or fp32 (unset: tf32)",
                 op, inverse_text);
    const char *hopper_copy_text = nullptr;
    const int hopper_copy = hopper_copy_from_env(&hopper_copy_text);
    if (hopper_copy < 0)
        GDP_FAIL(GDP_STATUS_INVALID_USAGE,
                 "%s: GDP_CHUNK_HOPPER_COPY is \"%s\"; it takes auto, threads or tma (unset: auto)", op, hopper_copy_text);
    const char *segment_text = nullptr;
    const int hopper_seg_env = hopper_segment_from_env(&segment_text);
    if (hopper_seg_env == -1)
        GDP_FAIL(GDP_STATUS_INVALID_USAGE,
                 "%s: GDP_CHUNK_SEGMENT is \"%s\"; it takes auto (or 0, unset), off, or a whole number from 1 to 512 "
                 "(expanded chunks a segment of the Hopper kernel's split)",
                 op, segment_text);
    const char *path_text = nullptr;
    const int path = chunk_path_from_env(&path_text);
    if (path < 0)
        GDP_FAIL(GDP_STATUS_INVALID_USAGE,
                 "%s: GDP_CHUNK_PATH is \"%s\"; it takes staged, fused, hopper or auto (unset: auto)", op, path_text);

    gdp_chunk_workspace_layout lay;
    GDP_CHECK(gdp_chunk_workspace_plan(T, N, M, (int32_t)H, (int32_t)K, (int32_t)V, &lay));
    if (have_desc && ctx->workspace_bytes < lay.total)
        GDP_FAIL(GDP_STATUS_INVALID_USAGE,
                 "%s: the ctx workspace holds %zu bytes and this call needs %zu; with descriptors given the op never "
                 "allocates: call gdp_chunk_get_workspace_size(%lld, %lld, %d, %lld, %lld, %lld, &bytes) and "
                 "gdp_ctx_reserve_workspace(ctx, bytes) once before the first call (and before graph capture)",
                 op, ctx->workspace_bytes, lay.total, (long long)T, (long long)N, M, (long long)H, (long long)K,
                 (long long)V);

    cudaStream_t stream = (cudaStream_t)ctx->stream;
    int sms = 0;
    cudaError_t err = gdp_device_sm_count(ctx->device, &sms);
    if (err != cudaSuccess)
        GDP_CUDA_FAIL(err, "%s: reading the multiprocessor count", op);
    int cc = 0; /* compute capability, 10 major + minor: the Hopper kernel and the copy engine's copies */
    err = gdp_device_cc(ctx->device, &cc);
    if (err != cudaSuccess)
        GDP_CUDA_FAIL(err, "%s: reading the compute capability", op);
    int64_t num_chunks, num_chunks_dp;
    int64_t max_len = a->max_seqlen; /* the longest sequence (0: unknown): auto's choice of kernels */
    const int32_t *cidx, *cidx_dp, *coff;
    if (have_desc) {
        num_chunks = a->chunk_indices.shape[0];
        num_chunks_dp = a->chunk_indices_dp.shape[0];
        cidx = (const int32_t *)a->chunk_indices.data;
        cidx_dp = (const int32_t *)a->chunk_indices_dp.data;
        coff = (const int32_t *)a->chunk_offsets.data;
    } else {
        /* Derive the descriptors on the host (FLA's path): one sync, grids from the real lengths. */
        GDP_CHECK(gdp_ctx_reserve_workspace(ctx, lay.total));
        int32_t *host = (int32_t *)gdp_calloc((size_t)(N + 1 + 2 * lay.desc_rows + 2 * lay.desc_rows_dp + N + 1),
                                              sizeof(int32_t), "the chunk descriptors");
        if (host == NULL)
            return GDP_STATUS_SYSTEM_ERROR;
        int32_t *cu_h = host, *ci_h = cu_h + N + 1, *cidp_h = ci_h + 2 * lay.desc_rows,
                *off_h = cidp_h + 2 * lay.desc_rows_dp;
        err = cudaMemcpyAsync(cu_h, a->cu_seqlens.data, (size_t)(N + 1) * sizeof(int32_t), cudaMemcpyDeviceToHost,
                              stream);
        if (err == cudaSuccess)
            err = cudaStreamSynchronize(stream);
        if (err != cudaSuccess) {
            free(host);
            GDP_CUDA_FAIL(err, "%s: reading cu_seqlens", op);
        }
        gdp_status_t st = gdp_build_chunk_descriptors(cu_h, (int32_t)N, M, T, ci_h, cidp_h, off_h, &num_chunks,
                                                      &num_chunks_dp);
        max_len = 0; /* the lengths themselves, over any hint */
        for (int64_t i = 0; st == GDP_STATUS_SUCCESS && i < N; i++) /* validated: nondecreasing */
            max_len = cu_h[i + 1] - cu_h[i] > max_len ? cu_h[i + 1] - cu_h[i] : max_len;
        if (st != GDP_STATUS_SUCCESS) {
            free(host);
            return st;
        }
        int32_t *dev = (int32_t *)((char *)ctx->workspace + lay.off_desc);
        err = cudaMemcpyAsync(dev, ci_h, (size_t)(2 * num_chunks) * sizeof(int32_t), cudaMemcpyHostToDevice, stream);
        if (err == cudaSuccess)
            err = cudaMemcpyAsync(dev + 2 * num_chunks, cidp_h, (size_t)(2 * num_chunks_dp) * sizeof(int32_t),
                                  cudaMemcpyHostToDevice, stream);
        if (err == cudaSuccess)
            err = cudaMemcpyAsync(dev + 2 * num_chunks + 2 * num_chunks_dp, off_h, (size_t)(N + 1) * sizeof(int32_t),
                                  cudaMemcpyHostToDevice, stream);
        if (err == cudaSuccess)
            err = cudaStreamSynchronize(stream); /* the host arrays are freed next */
        free(host);
        if (err != cudaSuccess)
            GDP_CUDA_FAIL(err, "%s: uploading the derived descriptors", op);
        cidx = dev;
        cidx_dp = dev + 2 * num_chunks;
        coff = dev + 2 * num_chunks + 2 * num_chunks_dp;
    }

    char *ws = (char *)ctx->workspace;
    ChunkParams p;
    memset(&p, 0, sizeof p);
    p.q = a->q.data;
    p.k = a->k.data;
    p.v = a->v.data;
    p.beta = a->beta.data;
    p.beta_dtype = a->beta.dtype;
    p.h0 = gdp_tensor_present(&a->initial_state) ? a->initial_state.data : nullptr;
    p.h0_dtype = p.h0 ? a->initial_state.dtype : 0;
    p.cu = (const int32_t *)a->cu_seqlens.data;
    p.cidx = cidx;
    p.cidx_dp = cidx_dp;
    p.coff = coff;
    p.gq = (const float *)(ws + lay.off_gq);
    p.gk = (const float *)(ws + lay.off_gk);
    p.kn = ws + lay.off_kn;
    p.w = ws + lay.off_w;
    p.u = ws + lay.off_u;
    p.hs = ws + lay.off_h;
    p.o = a->o.data;
    if (have_state) {
        p.state = a->state.data;
        p.state_dtype = a->state.dtype;
        p.n_slots = a->state.shape[0];
        p.state_stride_slot = gdp_tensor_stride(&a->state, 0);
        p.state_stride_head = gdp_tensor_stride(&a->state, 1);
        p.slots = gdp_tensor_present(&a->state_indices) ? (const int32_t *)a->state_indices.data : nullptr;
    } else if (a->output_final_state && gdp_tensor_present(&a->final_state)) {
        p.final_state = a->final_state.data;
        p.final_dtype = a->final_state.dtype;
    }
    if (want_cs) {
        p.chunk_states = a->chunk_states.data;
        p.cs_dtype = a->chunk_states.dtype;
        p.cs_rows = a->chunk_states.shape[0];
    }
    p.T = T;
    p.h_rows = lay.h_rows;
    p.N = (int)N;
    p.H = (int)H;
    p.K = (int)K;
    p.V = (int)V;
    p.M = M;
    p.KP = (int)lay.kp;
    p.VP = (int)lay.vp;
    p.scale = (float)(a->scale != 0.0 ? a->scale : 1.0 / sqrt((double)K));
    p.l2norm = a->use_qk_l2norm_in_kernel ? 1 : 0;
    p.q_vec = (K % 8 == 0) && aligned16(a->q.data);
    p.k_vec = (K % 8 == 0) && aligned16(a->k.data);
    p.v_vec = (V % 8 == 0) && aligned16(a->v.data);
    p.o_vec = (V % 8 == 0) && aligned16(a->o.data);
    p.g_raw = gdp_tensor_present(&a->g) ? (const float *)a->g.data : nullptr;
    /* exact_log2e is a CPU-reference knob: in fp32 1/ln 2 rounds to GDP_RCP_LN2 anyway. */

    /* ---- enqueue: the fused kernel, or the cumsums, WY, state sweep and outputs; then the zero tail ---- */
    GDP_CHUNK_STAGE_MARK(GDP_CHUNK_MARK_BEGIN, stream);
    /* auto: the Hopper kernel, unsplit or split, where the work's shape says it wins (gdp_chunk_auto_choose,
     * descriptors.c: the longest sequence must be known, from max_seqlen or the lengths read above) */
    const bool hopper_fits = hopper_runs(p, cc);
    const gdp_chunk_auto_path auto_path =
        hopper_fits && path == 2 ? gdp_chunk_auto_choose(num_chunks_dp, N, H, M, K, V, max_len, sms).path
                                 : GDP_CHUNK_AUTO_STAGED;
    const bool auto_hopper = auto_path != GDP_CHUNK_AUTO_STAGED;
    if (hopper_fits && (path == 3 || auto_hopper)) {
        int seg_ran = 0; /* the split's segment length, 0 unsplit */
#ifdef GDP_HAVE_CHUNK_HOPPER
        /* the split's scratch: the staged path's intermediates (keys, w, u, chunk-entry states), which this
         * path does not use, or what the ctx holds past the op's workspace if that is larger */
        char *split_ws = ws + lay.off_kn;
        size_t split_bytes = lay.off_desc - lay.off_kn;
        if (ctx->workspace_bytes > lay.total && ctx->workspace_bytes - lay.total > split_bytes) {
            split_ws = ws + lay.total;
            split_bytes = ctx->workspace_bytes - lay.total;
        }
        GdpHopperSplit split{0, 0, nullptr};
        /* GDP_CHUNK_SEGMENT forces a length or off; else auto's choice says split or not, and a forced Hopper
         * path splits where a sequence is longer than a segment */
        const int seg_ask = hopper_seg_env != 0 || !auto_hopper ? hopper_seg_env
                            : auto_path == GDP_CHUNK_AUTO_HOPPER_SPLIT ? 0
                                                                       : -2;
        hopper_segment(p, seg_ask, sms, num_chunks_dp, max_len, split_ws, split_bytes, &split);
        seg_ran = split.seg_chunks;
        __atomic_store_n(&hopper_last_segment, seg_ran, __ATOMIC_RELAXED);
        const bool tma = hopper_copy == 1 || (hopper_copy == 2 && p.VP == 128);
        err = gdp_chunk_hopper_launch(&p, a->q.dtype == GDP_DTYPE_BF16, tma, &split, stream);
#endif
        GDP_CUDA_LAUNCH_CHECK(op, err, "the Hopper chunk kernel: N %lld, H %lld, K %lld, V %lld", (long long)N,
                              (long long)H, (long long)K, (long long)V);
        __atomic_fetch_add(&hopper_calls, 1, __ATOMIC_RELAXED);
        if (seg_ran == 0) /* the split marked its own stages (hopper.cu) */
            GDP_CHUNK_STAGE_MARK(GDP_CHUNK_MARK_FUSED, stream);
    } else if (fused_fits(p) && (path == 1 || path == 3 || (path == 2 && FUSED_BY_DEFAULT))) {
        err = a->q.dtype == GDP_DTYPE_BF16 ? launch_fused<__nv_bfloat16>(p, stream) : launch_fused<__half>(p, stream);
        GDP_CUDA_LAUNCH_CHECK(op, err, "the fused chunk kernel: N %lld, H %lld, K %lld, V %lld", (long long)N,
                              (long long)H, (long long)K, (long long)V);
        GDP_CHUNK_STAGE_MARK(GDP_CHUNK_MARK_FUSED, stream);
    } else {
        gdp_tensor gq_view, gk_view;
        int64_t gq_shape[3] = {1, T, H}, gk_shape[3] = {1, T * M, H};
        gdp_tensor_init(&gq_view, ws + lay.off_gq, GDP_DTYPE_FP32, 3, gq_shape);
        gdp_tensor_init(&gk_view, ws + lay.off_gk, GDP_DTYPE_FP32, 3, gk_shape);
        GDP_CHECK(gdp_cuda_chunk_local_cumsum(ctx, &gq_view, &gk_view, gdp_tensor_present(&a->g) ? &a->g : NULL,
                                              &a->cu_seqlens, M));
        GDP_CHUNK_STAGE_MARK(GDP_CHUNK_MARK_CUMSUM, stream);
        p.zero_tail = num_chunks > 0; /* the output stage's grid then covers every head and column */
        /* the copy engine's tensor maps need sm_90 (the tma copies are compiled there only) */
        const StageOptions opt = {state_vb, state_copy == STATE_COPY_TMA && cc < 90 ? STATE_COPY_PRODUCER : state_copy,
                                  wy_inverse == 1};
        err = a->q.dtype == GDP_DTYPE_BF16 ? launch_stages<__nv_bfloat16>(p, num_chunks, num_chunks_dp, sms, opt, stream)
                                           : launch_stages<__half>(p, num_chunks, num_chunks_dp, sms, opt, stream);
        if (err == cudaErrorNotSupported && state_copy == STATE_COPY_TMA) /* nothing was launched */
            GDP_FAIL(GDP_STATUS_UNSUPPORTED,
                     "%s: GDP_CHUNK_STATE_COPY=tma needs the driver's cuTensorMapEncodeTiled, which is missing or "
                     "refused the state sweep's tensor maps; unset it (producer)",
                     op);
        GDP_CUDA_LAUNCH_CHECK(op, err, "the chunk stages: %lld chunks, H %lld, K %lld, V %lld",
                              (long long)num_chunks, (long long)H, (long long)K, (long long)V);
    }
    if (T > 0 && !p.zero_tail) {
        zero_tail_kernel<<<(unsigned)(T < 256 ? T : 256), 256, 0, stream>>>((uint16_t *)a->o.data, p.cu, p.N, T,
                                                                            H * V);
        GDP_CUDA_LAUNCH_CHECK(op, cudaGetLastError(), "the tail zero-fill: T %lld", (long long)T);
    }
    GDP_CHUNK_STAGE_MARK(GDP_CHUNK_MARK_END, stream);
    return GDP_STATUS_SUCCESS;
}
