/*
 * ops_chunk.c: the front-ends of the chunk family: gdp_l2norm, gdp_chunk_local_cumsum,
 * gdp_chunk_gated_delta_product_varlen and its oracle gdp_gated_delta_product_recurrent_ref.
 * Each checks every argument rule that holds on all backends (shapes, dtypes, which
 * optional arguments go together), then, on the CPU backend only, the contents of the
 * host index arrays (cu_seqlens, descriptors, slot indices), and dispatches to the CPU
 * reference (src/cpu/) or to the CUDA launcher. On CUDA the index arrays are device
 * memory, so they are never read here: the launcher owns those checks.
 */
#include <math.h>
#include <string.h>

#include "cpu/cpu_ops.h"
#include "internal.h"

#ifdef GDP_HAVE_CUDA
#include "../kernels/gdp_kernels.h"
#endif

#define CHUNK GDP_CHUNK_SIZE

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }


/* Host cu_seqlens [N+1]: starts at 0, non-decreasing, ends at or before token T. */
static gdp_status_t check_cu_seqlens(const char *op, const int32_t *cu, int64_t N, int64_t T) {
    if (cu[0] != 0)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: cu_seqlens[0] is %d, must be 0 (cumulative token offsets)", op,
                 cu[0]);
    for (int64_t i = 0; i < N; i++)
        if (cu[i + 1] < cu[i])
            GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                     "%s: sequence %lld has negative length: cu_seqlens[%lld] = %d > cu_seqlens[%lld] = %d; "
                     "cu_seqlens must be non-decreasing",
                     op, (long long)i, (long long)i, cu[i], (long long)(i + 1), cu[i + 1]);
    if (cu[N] > T)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                 "%s: cu_seqlens[%lld] = %d tokens exceed the %lld packed tokens of the inputs; pad the inputs to "
                 "at least %d tokens or fix cu_seqlens",
                 op, (long long)N, cu[N], (long long)T, cu[N]);
    return GDP_STATUS_SUCCESS;
}

/* ==== L2 norm =========================================================================== */
gdp_status_t gdp_l2norm(gdp_ctx_t ctx, gdp_tensor *y, const gdp_tensor *x) {
    static const char *op = "gdp_l2norm";
    GDP_CHECK(gdp_ctx_check(ctx, op));
    if (x == NULL || y == NULL)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: x and y must not be NULL", op);
    if (x->ndim < 1 || x->ndim > GDP_MAX_DIMS)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: x has %d dims; it needs 1 to %d (rows..., row length)", op,
                 x->ndim, GDP_MAX_DIMS);
    GDP_CHECK(gdp_check_tensor(op, "x", x, x->ndim, x->shape, GDP_DT_FLOAT));
    GDP_CHECK(gdp_check_tensor(op, "y", y, x->ndim, x->shape, GDP_DT_FLOAT));
    GDP_CHECK(gdp_check_contiguous(op, "x", x));
    GDP_CHECK(gdp_check_contiguous(op, "y", y));
    /* In place is row by row, so only an exact alias (same start, same dtype) is safe. */
    const char *xb = x->data, *yb = y->data;
    const size_t x_bytes = (size_t)gdp_tensor_numel(x) * gdp_dtype_size(x->dtype);
    const size_t y_bytes = (size_t)gdp_tensor_numel(y) * gdp_dtype_size(y->dtype);
    const bool overlap = xb < yb + y_bytes && yb < xb + x_bytes;
    if (overlap && !(xb == yb && x->dtype == y->dtype))
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                 "%s: y (%s) overlaps x (%s) without being the same buffer and dtype; in place needs y.data == "
                 "x.data and equal dtypes, otherwise pass separate buffers",
                 op, gdp_dtype_name(y->dtype), gdp_dtype_name(x->dtype));
    GDP_CHECK(gdp_debug_check_values(ctx, op, "x", x, false));
    if (ctx->backend == GDP_BACKEND_CPU)
        return gdp_cpu_l2norm(y, x);
    GDP_CUDA_OP(op, gdp_cuda_l2norm(ctx, y, x));
}

/* ==== chunk-local cumsums ================================================================== */
gdp_status_t gdp_chunk_local_cumsum(gdp_ctx_t ctx, gdp_tensor *g_cumsum, gdp_tensor *g_cumsum_dp,
                                    const gdp_tensor *g, const gdp_tensor *cu_seqlens, int32_t num_householder) {
    static const char *op = "gdp_chunk_local_cumsum";
    GDP_CHECK(gdp_ctx_check(ctx, op));
    const bool cpu = ctx->backend == GDP_BACKEND_CPU;
    if (num_householder < 1)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: num_householder is %d, must be >= 1", op, num_householder);
    const int64_t any3[3] = {1, GDP_ANY, GDP_ANY}, any1[1] = {GDP_ANY};
    /* The CPU reads any float g exactly; the CUDA kernels take fp32 as upstream. */
    GDP_CHECK(gdp_check_tensor(op, "g", g, 3, any3, cpu ? GDP_DT_FLOAT : GDP_DT(GDP_DTYPE_FP32)));
    GDP_CHECK(gdp_check_contiguous(op, "g", g));
    const int64_t T = g->shape[1], H = g->shape[2], M = num_householder;
    if (T > INT64_MAX / M)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: T = %lld tokens x M = %lld overflows", op, (long long)T,
                 (long long)M);
    GDP_CHECK(gdp_check_tensor(op, "cu_seqlens", cu_seqlens, 1, any1, GDP_DT_INT32));
    GDP_CHECK(gdp_check_contiguous(op, "cu_seqlens", cu_seqlens));
    if (cu_seqlens->shape[0] < 1)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: cu_seqlens has 0 entries; it needs N+1 >= 1 ([0] for no sequence)",
                 op);
    const int64_t N = cu_seqlens->shape[0] - 1;
    if (!gdp_tensor_present(g_cumsum) && !gdp_tensor_present(g_cumsum_dp))
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: g_cumsum and g_cumsum_dp are both absent; pass at least one", op);
    if (gdp_tensor_present(g_cumsum)) {
        const int64_t shape[3] = {1, T, H};
        GDP_CHECK(gdp_check_tensor(op, "g_cumsum", g_cumsum, 3, shape, GDP_DT(GDP_DTYPE_FP32)));
        GDP_CHECK(gdp_check_contiguous(op, "g_cumsum", g_cumsum));
    }
    if (gdp_tensor_present(g_cumsum_dp)) {
        const int64_t shape[3] = {1, T * M, H};
        GDP_CHECK(gdp_check_tensor(op, "g_cumsum_dp", g_cumsum_dp, 3, shape, GDP_DT(GDP_DTYPE_FP32)));
        GDP_CHECK(gdp_check_contiguous(op, "g_cumsum_dp", g_cumsum_dp));
    }
    const gdp_op_buffer bufs[] = {{"g", g, GDP_BUF_IN, false},
                                  {"cu_seqlens", cu_seqlens, GDP_BUF_IN, false},
                                  {"g_cumsum", g_cumsum, GDP_BUF_OUT, false},
                                  {"g_cumsum_dp", g_cumsum_dp, GDP_BUF_OUT, false}};
    GDP_CHECK(gdp_check_aliasing(op, bufs, 4));
    GDP_CHECK(gdp_debug_check_values(ctx, op, "g", g, true));
    if (cpu) {
        const int32_t *cu = cu_seqlens->data;
        GDP_CHECK(check_cu_seqlens(op, cu, N, T));
        return gdp_cpu_chunk_local_cumsum(g_cumsum, g_cumsum_dp, g, cu, N, num_householder);
    }
    GDP_CUDA_OP(op, gdp_cuda_chunk_local_cumsum(ctx, g_cumsum, g_cumsum_dp, g, cu_seqlens, num_householder));
}

/* ==== chunked prefill and its oracle ========================================================= */

/* Checks one descriptor table's real rows (sequence-major, row offset[i] + j == (i, j))
 * and its padding rows ((i, j) with i a sequence and chunk j starting past its end, so a
 * kernel reading the row finds nothing to do). lens are in the table's stream units. */
static gdp_status_t check_descriptor_rows(const char *op, const char *name, const int32_t *rows, int64_t n_rows,
                                          const int32_t *cu, int64_t N, int64_t M) {
    int64_t r = 0;
    for (int64_t i = 0; i < N; i++) {
        const int64_t len = ((int64_t)cu[i + 1] - cu[i]) * M;
        for (int64_t j = 0; j < ceil_div(len, CHUNK); j++, r++)
            if (rows[2 * r] != i || rows[2 * r + 1] != j)
                GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                         "%s: %s row %lld is (%d, %d), expected (%lld, %lld): real rows must list every chunk of "
                         "every sequence in order; rebuild the descriptors with gdp_build_chunk_descriptors from "
                         "the same cu_seqlens",
                         op, name, (long long)r, rows[2 * r], rows[2 * r + 1], (long long)i, (long long)j);
    }
    for (; r < n_rows; r++) {
        const int32_t i = rows[2 * r], j = rows[2 * r + 1];
        const int64_t len = N > 0 && i >= 0 && i < N ? ((int64_t)cu[i + 1] - cu[i]) * M : 0;
        if (i < 0 || i >= (N > 0 ? N : 1) || j < 0 || (int64_t)j * CHUNK < len)
            GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                     "%s: %s padding row %lld is (%d, %d), which addresses data or no sequence (N = %lld); "
                     "padding rows must name a sequence and a chunk past its end (as gdp_build_chunk_descriptors "
                     "writes them)",
                     op, name, (long long)r, i, j, (long long)N);
    }
    return GDP_STATUS_SUCCESS;
}

/* Content checks of the host index arrays (CPU backend only). */
static gdp_status_t check_chunk_contents(const char *op, const gdp_chunk_args *a, int64_t N, int64_t T, int64_t M) {
    const int32_t *cu = a->cu_seqlens.data;
    GDP_CHECK(check_cu_seqlens(op, cu, N, T));
    int64_t n_chunks = 0, n_chunks_dp = 0;
    for (int64_t i = 0; i < N; i++) {
        n_chunks += ceil_div((int64_t)cu[i + 1] - cu[i], CHUNK);
        n_chunks_dp += ceil_div(((int64_t)cu[i + 1] - cu[i]) * M, CHUNK);
    }

    if (gdp_tensor_present(&a->chunk_offsets)) {
        const int32_t *offsets = a->chunk_offsets.data;
        int64_t expect = 0;
        for (int64_t i = 0; i <= N; i++) {
            if (offsets[i] != expect)
                GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                         "%s: chunk_offsets[%lld] is %d, expected %lld from cu_seqlens (the running sum of "
                         "ceil(length / 64)); rebuild the descriptors with gdp_build_chunk_descriptors",
                         op, (long long)i, offsets[i], (long long)expect);
            if (i < N)
                expect += ceil_div((int64_t)cu[i + 1] - cu[i], CHUNK);
        }
        const int64_t rows = a->chunk_indices.shape[0], rows_dp = a->chunk_indices_dp.shape[0];
        if (rows < n_chunks)
            GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                     "%s: chunk_indices has %lld rows, fewer than the %lld chunks of cu_seqlens; size it with "
                     "gdp_max_chunk_counts",
                     op, (long long)rows, (long long)n_chunks);
        if (rows_dp < n_chunks_dp)
            GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                     "%s: chunk_indices_dp has %lld rows, fewer than the %lld expanded chunks of cu_seqlens x M=%lld; "
                     "size it with gdp_max_chunk_counts",
                     op, (long long)rows_dp, (long long)n_chunks_dp, (long long)M);
        GDP_CHECK(check_descriptor_rows(op, "chunk_indices", a->chunk_indices.data, rows, cu, N, 1));
        GDP_CHECK(check_descriptor_rows(op, "chunk_indices_dp", a->chunk_indices_dp.data, rows_dp, cu, N, M));
    }

    if (gdp_tensor_present(&a->state_indices)) {
        const int32_t *slots = a->state_indices.data;
        const int64_t n_slots = a->state.shape[0];
        for (int64_t i = 0; i < N; i++) {
            if (slots[i] < -1 || slots[i] >= n_slots)
                GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                         "%s: state_indices[%lld] is %d, outside [0, %lld) (the slots of state); use -1 for a "
                         "request whose state is not stored",
                         op, (long long)i, slots[i], (long long)n_slots);
            for (int64_t e = 0; e < i && slots[i] >= 0; e++)
                if (slots[e] == slots[i])
                    GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                             "%s: state_indices[%lld] and state_indices[%lld] both name slot %d; each slot takes "
                             "the final state of at most one request",
                             op, (long long)e, (long long)i, slots[i]);
        }
    }

    if (a->return_chunk_states && a->chunk_states.shape[0] < n_chunks)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                 "%s: chunk_states has %lld rows, fewer than the %lld chunks of cu_seqlens (chunk_offsets[N]); "
                 "give it at least that many rows (e.g. num_chunks from gdp_max_chunk_counts)",
                 op, (long long)a->chunk_states.shape[0], (long long)n_chunks);
    return GDP_STATUS_SUCCESS;
}

/* Every rule of gdp_chunk_args (ops.h); content checks on the CPU backend only. */
static gdp_status_t validate_chunk_args(gdp_ctx_t ctx, const gdp_chunk_args *a, const char *op) {
    const bool cpu = ctx->backend == GDP_BACKEND_CPU;
    if (a == NULL)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: args is NULL", op);
    if (a->num_householder < 1)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: num_householder is %d, must be >= 1", op, a->num_householder);
    const int64_t M = a->num_householder;

    /* q fixes T, H, K; v fixes V. */
    const int64_t any4[4] = {1, GDP_ANY, GDP_ANY, GDP_ANY};
    GDP_CHECK(gdp_check_tensor(op, "q", &a->q, 4, any4, GDP_DT_FLOAT));
    const int64_t T = a->q.shape[1], H = a->q.shape[2], K = a->q.shape[3];
    if (H < 1 || K < 1)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: q has %lld heads and key dim %lld; both must be >= 1", op,
                 (long long)H, (long long)K);
    if (T > INT32_MAX / M)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                 "%s: T = %lld tokens x M = %lld copies overflows the int32 indices of the descriptors; split the "
                 "step",
                 op, (long long)T, (long long)M);
    if (a->max_seqlen < 0 || a->max_seqlen > T)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                 "%s: max_seqlen is %lld; it is the longest sequence's tokens (<= T = %lld), or 0 for unknown", op,
                 (long long)a->max_seqlen, (long long)T);
    const uint32_t qkv_dtype = GDP_DT(a->q.dtype); /* k and v must match q */
    const int64_t k_shape[4] = {1, T * M, H, K};
    GDP_CHECK(gdp_check_tensor(op, "k", &a->k, 4, k_shape, qkv_dtype));
    const int64_t v_shape[4] = {1, T * M, H, GDP_ANY};
    GDP_CHECK(gdp_check_tensor(op, "v", &a->v, 4, v_shape, qkv_dtype));
    const int64_t V = a->v.shape[3];
    if (V < 1)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: v has value dim 0; it must be >= 1", op);
    if (K > GDP_MAX_HEAD_DIM || V > GDP_MAX_HEAD_DIM)
        GDP_FAIL(GDP_STATUS_UNSUPPORTED,
                 "%s: key dim K = %lld and value dim V = %lld; at most %d each is supported (the state sweep "
                 "holds K in 64-wide blocks, as upstream)",
                 op, (long long)K, (long long)V, GDP_MAX_HEAD_DIM);
    const int64_t g_shape[3] = {1, T, H}, beta_shape[3] = {1, T * M, H};
    /* The CPU reads any float g exactly; the CUDA kernels take fp32 as upstream. */
    GDP_CHECK(gdp_check_tensor(op, "g", &a->g, 3, g_shape, cpu ? GDP_DT_FLOAT : GDP_DT(GDP_DTYPE_FP32)));
    GDP_CHECK(gdp_check_tensor(op, "beta", &a->beta, 3, beta_shape, GDP_DT_FLOAT));
    const int64_t any1[1] = {GDP_ANY};
    GDP_CHECK(gdp_check_tensor(op, "cu_seqlens", &a->cu_seqlens, 1, any1, GDP_DT_INT32));
    if (a->cu_seqlens.shape[0] < 1)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: cu_seqlens has 0 entries; it needs N+1 >= 1", op);
    const int64_t N = a->cu_seqlens.shape[0] - 1;
    if (!isfinite(a->scale))
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: scale is %g; pass a finite value, or 0 for K^-0.5", op,
                 a->scale);

    const int64_t state_shape[4] = {N, H, K, V};
    if (gdp_tensor_present(&a->initial_state))
        GDP_CHECK(gdp_check_tensor(op, "initial_state", &a->initial_state, 4, state_shape, GDP_DT_FLOAT));

    const int n_desc = gdp_tensor_present(&a->chunk_indices) + gdp_tensor_present(&a->chunk_indices_dp) +
                       gdp_tensor_present(&a->chunk_offsets);
    if (n_desc != 0 && n_desc != 3)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                 "%s: chunk_indices %s, chunk_indices_dp %s, chunk_offsets %s: pass all three descriptors "
                 "(gdp_build_chunk_descriptors) or none",
                 op, gdp_tensor_present(&a->chunk_indices) ? "given" : "absent",
                 gdp_tensor_present(&a->chunk_indices_dp) ? "given" : "absent",
                 gdp_tensor_present(&a->chunk_offsets) ? "given" : "absent");
    if (n_desc == 3) {
        const int64_t pairs[2] = {GDP_ANY, 2}, offsets_shape[1] = {N + 1};
        GDP_CHECK(gdp_check_tensor(op, "chunk_indices", &a->chunk_indices, 2, pairs, GDP_DT_INT32));
        GDP_CHECK(gdp_check_tensor(op, "chunk_indices_dp", &a->chunk_indices_dp, 2, pairs, GDP_DT_INT32));
        GDP_CHECK(gdp_check_tensor(op, "chunk_offsets", &a->chunk_offsets, 1, offsets_shape, GDP_DT_INT32));
    }

    const bool has_state = gdp_tensor_present(&a->state), has_slots = gdp_tensor_present(&a->state_indices);
    if (has_slots && !has_state)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                 "%s: state_indices is given without state; pass the cache [slots, H, K, V] as state, or drop "
                 "state_indices",
                 op);
    if (has_state && !has_slots)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                 "%s: state is given without state_indices; pass the slot of each sequence ([N] int32, -1 for none)",
                 op);
    if (has_state) {
        const int64_t cache_shape[4] = {GDP_ANY, H, K, V}, slots_shape[1] = {N};
        GDP_CHECK(gdp_check_tensor(op, "state", &a->state, 4, cache_shape,
                                   GDP_DT(GDP_DTYPE_FP32) | GDP_DT(GDP_DTYPE_BF16)));
        if (gdp_tensor_stride(&a->state, 3) != 1 || gdp_tensor_stride(&a->state, 2) != V)
            GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                     "%s: state has strides (.., %lld, %lld) on its last two dims, expected (.., %lld, 1): each "
                     "[K, V] state must be contiguous (slot and head strides are free)",
                     op, (long long)gdp_tensor_stride(&a->state, 2), (long long)gdp_tensor_stride(&a->state, 3),
                     (long long)V);
        GDP_CHECK(gdp_check_tensor(op, "state_indices", &a->state_indices, 1, slots_shape, GDP_DT_INT32));
        if (n_desc != 3)
            GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                     "%s: cache mode (state + state_indices) needs the three chunk descriptors, as upstream; build "
                     "them with gdp_build_chunk_descriptors",
                     op);
    }
    /* Cache mode writes the final states to the slots; like the recurrent op, refuse a dense
     * final_state beside it (it used to be silently left unwritten). */
    if (has_state && a->output_final_state)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                 "%s: cache mode (state + state_indices) with output_final_state set: the final states are written "
                 "to the cache slots, final_state would stay unwritten; pass output_final_state = 0, or drop state "
                 "for dense mode",
                 op);
    if (!has_state && a->output_final_state)
        GDP_CHECK(gdp_check_tensor(op, "final_state (output_final_state is set)", &a->final_state, 4, state_shape,
                                   GDP_DT(GDP_DTYPE_FP32)));
    if (a->return_chunk_states) {
        const int64_t states_shape[4] = {GDP_ANY, H, K, V};
        GDP_CHECK(gdp_check_tensor(op, "chunk_states (return_chunk_states is set)", &a->chunk_states, 4,
                                   states_shape, GDP_DT_FLOAT));
    }
    const int64_t o_shape[4] = {1, T, H, V};
    /* The CPU rounds o to any float dtype; the CUDA kernels write q's dtype, as upstream. */
    GDP_CHECK(gdp_check_tensor(op, "o", &a->o, 4, o_shape, cpu ? GDP_DT_FLOAT : qkv_dtype));

    /* Everything but the cache is a plain contiguous tensor. */
    const struct { const char *name; const gdp_tensor *t; } dense[] = {
        {"q", &a->q}, {"k", &a->k}, {"v", &a->v}, {"g", &a->g}, {"beta", &a->beta},
        {"cu_seqlens", &a->cu_seqlens}, {"initial_state", &a->initial_state},
        {"chunk_indices", &a->chunk_indices}, {"chunk_indices_dp", &a->chunk_indices_dp},
        {"chunk_offsets", &a->chunk_offsets}, {"state_indices", &a->state_indices}, {"o", &a->o},
        {"final_state", !has_state && a->output_final_state ? &a->final_state : NULL},
        {"chunk_states", a->return_chunk_states ? &a->chunk_states : NULL},
    };
    for (size_t d = 0; d < sizeof dense / sizeof dense[0]; d++)
        if (gdp_tensor_present(dense[d].t))
            GDP_CHECK(gdp_check_contiguous(op, dense[d].name, dense[d].t));

    if (cpu)
        GDP_CHECK(check_chunk_contents(op, a, N, T, M));

    /* No output may alias an input, another output or the cache. */
    const gdp_op_buffer bufs[] = {
        {"q", &a->q, GDP_BUF_IN, false},
        {"k", &a->k, GDP_BUF_IN, false},
        {"v", &a->v, GDP_BUF_IN, false},
        {"beta", &a->beta, GDP_BUF_IN, false},
        {"initial_state", &a->initial_state, GDP_BUF_IN, false},
        {"g", &a->g, GDP_BUF_IN, false},
        {"cu_seqlens", &a->cu_seqlens, GDP_BUF_IN, false},
        {"chunk_indices", &a->chunk_indices, GDP_BUF_IN, false},
        {"chunk_indices_dp", &a->chunk_indices_dp, GDP_BUF_IN, false},
        {"chunk_offsets", &a->chunk_offsets, GDP_BUF_IN, false},
        {"state_indices", &a->state_indices, GDP_BUF_IN, false},
        {"state", &a->state, GDP_BUF_INOUT, false},
        {"o", &a->o, GDP_BUF_OUT, false},
        {"final_state", !has_state && a->output_final_state ? &a->final_state : NULL, GDP_BUF_OUT, false},
        {"chunk_states", a->return_chunk_states ? &a->chunk_states : NULL, GDP_BUF_OUT, false},
    };
    GDP_CHECK(gdp_check_aliasing(op, bufs, (int32_t)(sizeof bufs / sizeof bufs[0])));
    for (int i = 0; i < 6; i++) /* q, k, v, beta, initial_state finite; g also <= 0 */
        GDP_CHECK(gdp_debug_check_values(ctx, op, bufs[i].name, bufs[i].t, i == 5));
    return GDP_STATUS_SUCCESS;
}

gdp_status_t gdp_chunk_gated_delta_product_varlen(gdp_ctx_t ctx, const gdp_chunk_args *args) {
    static const char *op = "gdp_chunk_gated_delta_product_varlen";
    GDP_CHECK(gdp_ctx_check(ctx, op));
    GDP_CHECK(validate_chunk_args(ctx, args, op));
    if (ctx->backend == GDP_BACKEND_CPU)
        return gdp_cpu_chunk_varlen(args, gdp_cpu_chunked_seq_head);
    GDP_CUDA_OP(op, gdp_cuda_chunk(ctx, args));
}

gdp_status_t gdp_gated_delta_product_recurrent_ref(gdp_ctx_t ctx, const gdp_chunk_args *args) {
    static const char *op = "gdp_gated_delta_product_recurrent_ref";
    GDP_CHECK(gdp_ctx_check(ctx, op));
    if (ctx->backend != GDP_BACKEND_CPU)
        GDP_FAIL(GDP_STATUS_UNSUPPORTED,
                 "%s: the recurrent oracle runs on the CPU backend only; call it with a GDP_BACKEND_CPU ctx on "
                 "host copies",
                 op);
    GDP_CHECK(validate_chunk_args(ctx, args, op));
    return gdp_cpu_chunk_varlen(args, gdp_cpu_recurrent_seq_head);
}
