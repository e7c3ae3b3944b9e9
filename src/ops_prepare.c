/*
 * ops_prepare.c: front-ends of gdp_decode_prepare and gdp_prefill_prepare (gdp-math.md 6):
 * checks every argument rule that holds on all backends, then dispatches to the CPU
 * reference (src/cpu/prepare.c) or the CUDA launcher gdp_cuda_prepare.
 */
#include "cpu/cpu_ops.h"
#include "internal.h"

#ifdef GDP_HAVE_CUDA
#include "kernels/gdp_kernels.h"
#endif

static gdp_status_t check_prepare_args(const char *op, const gdp_prepare_args *a, int decode) {
    const int32_t M = a->num_householder, H = a->num_heads, G = a->num_groups, P = a->head_dim,
                  N = a->state_dim;
    if (M < 1 || H < 1 || G < 1 || P < 1 || N < 1)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                 "%s: num_householder %d, num_heads %d, num_groups %d, head_dim %d and state_dim %d must all be "
                 ">= 1",
                 op, M, H, G, P, N);
    if (H % G != 0)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                 "%s: num_heads %d is not a multiple of num_groups %d; each group must serve H/G whole heads", op,
                 H, G);

    /* x and ba: [n, T, width] with any row strides. */
    const int64_t x_width = (int64_t)M * H * P + (int64_t)M * G * N + (int64_t)G * N;
    const int64_t ba_width = (int64_t)M * H + H;
    const int64_t x_shape[3] = {GDP_ANY, GDP_ANY, x_width};
    GDP_CHECK(gdp_check_tensor(op, "x", &a->x, 3, x_shape, GDP_DT_FLOAT));
    GDP_CHECK(gdp_check_row_view(op, "x", &a->x));
    const int64_t n = a->x.shape[0], T = a->x.shape[1];
    if (!decode && n != 1)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                 "%s: x has %lld requests in dim 0; prefill packs every request into n == 1 (shape [1, T, %lld])",
                 op, (long long)n, (long long)x_width);
    const int64_t ba_shape[3] = {n, T, ba_width};
    GDP_CHECK(gdp_check_tensor(op, "ba", &a->ba, 3, ba_shape, GDP_DT_FLOAT));
    GDP_CHECK(gdp_check_row_view(op, "ba", &a->ba));
    const int64_t h_shape[1] = {H};
    GDP_CHECK(gdp_check_dense(op, "A_log", &a->A_log, 1, h_shape, GDP_DT(GDP_DTYPE_FP32)));
    GDP_CHECK(gdp_check_dense(op, "dt_bias", &a->dt_bias, 1, h_shape, GDP_DT_FLOAT));

    /* Outputs: contiguous; q, k, v in x's dtype, beta in ba's, g fp32. */
    const uint32_t x_dt = GDP_DT(a->x.dtype), ba_dt = GDP_DT(a->ba.dtype);
    const int64_t rows_exp = T * M;            /* expanded stream: token-copy pairs */
    const int64_t rows_tok = decode ? T * M : T; /* decode interleaves q and g onto the copies */
    const int64_t q_shape[4] = {n, rows_tok, H, N}, k_shape[4] = {n, rows_exp, H, N};
    const int64_t v_shape[4] = {n, rows_exp, H, P}, beta_shape[3] = {n, rows_exp, H};
    const int64_t g_shape[3] = {n, rows_tok, H};
    GDP_CHECK(gdp_check_dense(op, "query", &a->query, 4, q_shape, x_dt));
    GDP_CHECK(gdp_check_dense(op, "key", &a->key, 4, k_shape, x_dt));
    GDP_CHECK(gdp_check_dense(op, "value", &a->value, 4, v_shape, x_dt));
    GDP_CHECK(gdp_check_dense(op, "beta", &a->beta, 3, beta_shape, ba_dt));
    GDP_CHECK(gdp_check_dense(op, "g", &a->g, 3, g_shape, GDP_DT(GDP_DTYPE_FP32)));
    return GDP_STATUS_SUCCESS;
}

gdp_status_t gdp_prepare_check(gdp_ctx_t ctx, const gdp_prepare_args *args, int decode, const char *op) {
    GDP_CHECK(gdp_ctx_check(ctx, op));
    if (args == NULL)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: args is NULL; pass a filled gdp_prepare_args", op);
    GDP_CHECK(check_prepare_args(op, args, decode));
    const gdp_prepare_args *a = args;
    const gdp_op_buffer bufs[] = {
        {"x", &a->x, GDP_BUF_IN, false},           {"ba", &a->ba, GDP_BUF_IN, false},
        {"A_log", &a->A_log, GDP_BUF_IN, false},   {"dt_bias", &a->dt_bias, GDP_BUF_IN, false},
        {"query", &a->query, GDP_BUF_OUT, false},  {"key", &a->key, GDP_BUF_OUT, false},
        {"value", &a->value, GDP_BUF_OUT, false},  {"beta", &a->beta, GDP_BUF_OUT, false},
        {"g", &a->g, GDP_BUF_OUT, false},
    };
    GDP_CHECK(gdp_check_aliasing(op, bufs, (int32_t)(sizeof bufs / sizeof bufs[0])));
    for (int i = 0; i < 4; i++)
        GDP_CHECK(gdp_debug_check_values(ctx, op, bufs[i].name, bufs[i].t, false));
    return GDP_STATUS_SUCCESS;
}

static gdp_status_t prepare_dispatch(const char *op, gdp_ctx_t ctx, const gdp_prepare_args *args, int decode) {
    GDP_CHECK(gdp_prepare_check(ctx, args, decode, op));
    if (ctx->backend == GDP_BACKEND_CUDA) {
        GDP_CUDA_OP(op, gdp_cuda_prepare(ctx, args, decode));
    }
    return gdp_cpu_prepare(args, decode);
}

gdp_status_t gdp_decode_prepare(gdp_ctx_t ctx, const gdp_prepare_args *args) {
    return prepare_dispatch("gdp_decode_prepare", ctx, args, 1);
}

gdp_status_t gdp_prefill_prepare(gdp_ctx_t ctx, const gdp_prepare_args *args) {
    return prepare_dispatch("gdp_prefill_prepare", ctx, args, 0);
}
