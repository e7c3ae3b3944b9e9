/*
 * ops_conv1d.c: front-ends of the causal depthwise conv1d ops (gdp-layer.md 1.2):
 * gdp_causal_conv1d_update (decode, S tokens per request from the slot's window) and
 * gdp_causal_conv1d_varlen (packed prefill with the window carried through the cache).
 * They check every argument rule that holds on all backends, then dispatch to the CPU
 * reference (src/cpu/conv1d.c) or the CUDA launchers. Slot and cu_seqlens values live in
 * host memory only on the CPU backend, so the CPU reference checks those.
 */
#include "cpu/cpu_ops.h"
#include "internal.h"

#ifdef GDP_HAVE_CUDA
#include "kernels/gdp_kernels.h"
#endif

/* Narrowest and widest kernel the ops accept (Megatron uses W = 4). */
#define CONV_MIN_WIDTH 2
#define CONV_MAX_WIDTH 8

/* weight [C, W] with W in [2, 8], optional bias [C], conv_state [slots, C, W]. */
static gdp_status_t check_conv_params(const char *op, const gdp_tensor *weight, const gdp_tensor *bias,
                                      const gdp_tensor *conv_state, int64_t C) {
    const int64_t w_shape[2] = {C, GDP_ANY};
    GDP_CHECK(gdp_check_dense(op, "weight", weight, 2, w_shape, GDP_DT_FLOAT));
    const int64_t W = weight->shape[1];
    if (W < CONV_MIN_WIDTH || W > CONV_MAX_WIDTH)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: weight has width %lld (shape [%lld, %lld]); the width must be in "
                 "[%d, %d]", op, (long long)W, (long long)C, (long long)W, CONV_MIN_WIDTH, CONV_MAX_WIDTH);
    const int64_t c_shape[1] = {C};
    GDP_CHECK(gdp_check_optional_dense(op, "bias", bias, 1, c_shape, GDP_DT_FLOAT));
    const int64_t s_shape[3] = {GDP_ANY, C, W};
    GDP_CHECK(gdp_check_dense(op, "conv_state", conv_state, 3, s_shape, GDP_DT_FLOAT));
    return GDP_STATUS_SUCCESS;
}

static gdp_status_t check_update_args(const char *op, const gdp_conv1d_update_args *a) {
    const int64_t x_shape[3] = {GDP_ANY, GDP_ANY, GDP_ANY};
    GDP_CHECK(gdp_check_tensor(op, "x", &a->x, 3, x_shape, GDP_DT_FLOAT));
    GDP_CHECK(gdp_check_row_view(op, "x", &a->x));
    const int64_t B = a->x.shape[0], S = a->x.shape[1], C = a->x.shape[2];
    if (S < 1 || C < 1)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: x has shape [%lld, %lld, %lld]; tokens per request and "
                 "channels must be >= 1", op, (long long)B, (long long)S, (long long)C);
    GDP_CHECK(check_conv_params(op, &a->weight, &a->bias, &a->conv_state, C));
    const int64_t slots = a->conv_state.shape[0], W = a->weight.shape[1];
    GDP_CHECK(gdp_check_slot_array(op, "conv_state_indices", &a->conv_state_indices, B, slots));
    const int64_t i_shape[4] = {slots, S, C, W};
    GDP_CHECK(gdp_check_optional_dense(op, "intermediate_conv_states", &a->intermediate_conv_states, 4, i_shape,
                                       GDP_DT_FLOAT));
    GDP_CHECK(gdp_check_dense(op, "y", &a->y, 3, a->x.shape, GDP_DT_FLOAT));
    return GDP_STATUS_SUCCESS;
}

static gdp_status_t check_varlen_args(const char *op, const gdp_conv1d_varlen_args *a) {
    const int64_t x_shape[2] = {GDP_ANY, GDP_ANY};
    GDP_CHECK(gdp_check_tensor(op, "x", &a->x, 2, x_shape, GDP_DT_FLOAT));
    GDP_CHECK(gdp_check_row_view(op, "x", &a->x));
    const int64_t C = a->x.shape[1];
    if (C < 1)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: x has %lld channels; must be >= 1", op, (long long)C);
    GDP_CHECK(check_conv_params(op, &a->weight, &a->bias, &a->conv_state, C));
    const int64_t cu_shape[1] = {GDP_ANY};
    GDP_CHECK(gdp_check_dense(op, "cu_seqlens", &a->cu_seqlens, 1, cu_shape, GDP_DT_INT32));
    const int64_t N = a->cu_seqlens.shape[0] - 1;
    if (N < 0)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: cu_seqlens is empty; it needs N + 1 >= 1 entries", op);
    GDP_CHECK(gdp_check_slot_array(op, "state_indices", &a->state_indices, N, a->conv_state.shape[0]));
    GDP_CHECK(gdp_check_dense(op, "y", &a->y, 2, a->x.shape, GDP_DT_FLOAT));
    return GDP_STATUS_SUCCESS;
}

gdp_status_t gdp_conv1d_update_check(gdp_ctx_t ctx, const gdp_conv1d_update_args *args, const char *op) {
    GDP_CHECK(gdp_ctx_check(ctx, op));
    if (args == NULL)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: args is NULL; pass a filled gdp_conv1d_update_args", op);
    GDP_CHECK(check_update_args(op, args));
    const gdp_op_buffer bufs[] = {
        {"x", &args->x, GDP_BUF_IN, false},
        {"weight", &args->weight, GDP_BUF_IN, false},
        {"bias", &args->bias, GDP_BUF_IN, false},
        {"conv_state_indices", &args->conv_state_indices, GDP_BUF_IN, false},
        {"conv_state", &args->conv_state, GDP_BUF_INOUT, false},
        {"intermediate_conv_states", &args->intermediate_conv_states, GDP_BUF_OUT, false},
        {"y", &args->y, GDP_BUF_OUT, false},
    };
    GDP_CHECK(gdp_check_aliasing(op, bufs, (int32_t)(sizeof bufs / sizeof bufs[0])));
    for (int i = 0; i < 3; i++)
        GDP_CHECK(gdp_debug_check_values(ctx, op, bufs[i].name, bufs[i].t, false));
    return GDP_STATUS_SUCCESS;
}

gdp_status_t gdp_causal_conv1d_update(gdp_ctx_t ctx, const gdp_conv1d_update_args *args) {
    static const char *op = "gdp_causal_conv1d_update";
    GDP_CHECK(gdp_conv1d_update_check(ctx, args, op));
    if (ctx->backend == GDP_BACKEND_CUDA) {
        GDP_CUDA_OP(op, gdp_cuda_conv1d_update(ctx, args));
    }
    return gdp_cpu_conv1d_update(args);
}

gdp_status_t gdp_conv1d_varlen_check(gdp_ctx_t ctx, const gdp_conv1d_varlen_args *args, const char *op) {
    GDP_CHECK(gdp_ctx_check(ctx, op));
    if (args == NULL)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: args is NULL; pass a filled gdp_conv1d_varlen_args", op);
    GDP_CHECK(check_varlen_args(op, args));
    const gdp_op_buffer bufs[] = {
        {"x", &args->x, GDP_BUF_IN, false},
        {"weight", &args->weight, GDP_BUF_IN, false},
        {"bias", &args->bias, GDP_BUF_IN, false},
        {"state_indices", &args->state_indices, GDP_BUF_IN, false},
        {"cu_seqlens", &args->cu_seqlens, GDP_BUF_IN, false},
        {"conv_state", &args->conv_state, GDP_BUF_INOUT, false},
        {"y", &args->y, GDP_BUF_OUT, false},
    };
    GDP_CHECK(gdp_check_aliasing(op, bufs, (int32_t)(sizeof bufs / sizeof bufs[0])));
    for (int i = 0; i < 3; i++)
        GDP_CHECK(gdp_debug_check_values(ctx, op, bufs[i].name, bufs[i].t, false));
    return GDP_STATUS_SUCCESS;
}

gdp_status_t gdp_causal_conv1d_varlen(gdp_ctx_t ctx, const gdp_conv1d_varlen_args *args) {
    static const char *op = "gdp_causal_conv1d_varlen";
    GDP_CHECK(gdp_conv1d_varlen_check(ctx, args, op));
    if (ctx->backend == GDP_BACKEND_CUDA) {
        GDP_CUDA_OP(op, gdp_cuda_conv1d_varlen(ctx, args));
    }
    return gdp_cpu_conv1d_varlen(args);
}
