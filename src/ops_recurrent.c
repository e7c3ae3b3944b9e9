/*
 * ops_recurrent.c: front-end of gdp_fused_recurrent_gated_delta_rule_update, the decode
 * op (api-reference/fused_recurrent.md, gdp-math.md 5): checks every argument rule that
 * holds on all backends, then dispatches to the CPU reference (src/cpu/recurrent.c) or
 * the CUDA launcher gdp_cuda_recurrent. Slot values live in host memory only on the CPU
 * backend, so gdp_cpu_recurrent_update checks them there.
 */
#include <math.h>

#include "cpu/cpu_ops.h"
#include "decode_core.h"
#include "internal.h"

#ifdef GDP_HAVE_CUDA
#include "kernels/gdp_kernels.h"
#endif

static const char *const OP = "gdp_fused_recurrent_gated_delta_rule_update";

/* The cache: [slots, H, K, V] fp32 | bf16 whose last two dims are contiguous (slot and
 * head strides are free, as in Megatron's kernel). */
static gdp_status_t check_state_cache(const gdp_recurrent_args *a, int64_t H, int64_t K, int64_t V) {
    const int64_t shape[4] = {GDP_ANY, H, K, V};
    GDP_CHECK(gdp_check_tensor(OP, "state", &a->state, 4, shape,
                               GDP_DT(GDP_DTYPE_FP32) | GDP_DT(GDP_DTYPE_BF16)));
    if (gdp_tensor_stride(&a->state, 3) != 1 || gdp_tensor_stride(&a->state, 2) != V ||
        gdp_tensor_stride(&a->state, 1) < 0 || gdp_tensor_stride(&a->state, 0) < 0)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                 "%s: state has strides [%lld, %lld, %lld, %lld]; its last two dims must be contiguous (strides "
                 "[*, *, %lld, 1]) and the others non-negative",
                 OP, (long long)gdp_tensor_stride(&a->state, 0), (long long)gdp_tensor_stride(&a->state, 1),
                 (long long)gdp_tensor_stride(&a->state, 2), (long long)gdp_tensor_stride(&a->state, 3),
                 (long long)V);
    return GDP_STATUS_SUCCESS;
}

static gdp_status_t check_recurrent_args(const gdp_recurrent_args *a) {
    const int64_t qk_shape[4] = {GDP_ANY, GDP_ANY, GDP_ANY, GDP_ANY};
    GDP_CHECK(gdp_check_dense(OP, "q", &a->q, 4, qk_shape, GDP_DT_FLOAT));
    const int64_t B = a->q.shape[0], T = a->q.shape[1], H = a->q.shape[2], K = a->q.shape[3];
    GDP_CHECK(gdp_check_dense(OP, "k", &a->k, 4, a->q.shape, GDP_DT(a->q.dtype)));
    const int64_t v_shape[4] = {B, T, H, GDP_ANY};
    GDP_CHECK(gdp_check_dense(OP, "v", &a->v, 4, v_shape, GDP_DT(a->q.dtype)));
    const int64_t V = a->v.shape[3];
    if (K < 1 || K > GDP_MAX_HEAD_DIM || V < 1 || V > GDP_MAX_HEAD_DIM)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: head dims K = %lld and V = %lld must be in [1, %d]", OP,
                 (long long)K, (long long)V, GDP_MAX_HEAD_DIM);
    if (T < 1 || H < 1)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: q has %lld steps and %lld heads; both must be >= 1", OP,
                 (long long)T, (long long)H);
    const int64_t bth[3] = {B, T, H};
    GDP_CHECK(gdp_check_optional_dense(OP, "g", &a->g, 3, bth, GDP_DT(GDP_DTYPE_FP32)));
    GDP_CHECK(gdp_check_optional_dense(OP, "beta", &a->beta, 3, bth, GDP_DT_FLOAT));
    if (!isfinite(a->scale))
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: scale is %g; pass a finite value, or 0 for K^-0.5", OP,
                 a->scale);
    if (gdp_tensor_present(&a->cu_seqlens))
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                 "%s: cu_seqlens was given, but decode does not support variable lengths; pass every request "
                 "with the same T steps ([B, T, H, K]) and cu_seqlens absent",
                 OP);
    if (a->steps_per_token < 1 || T % a->steps_per_token != 0)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                 "%s: steps_per_token is %d, must be >= 1 and divide the %lld steps of q (M for GDP decode, 1 "
                 "for a plain gated delta rule)",
                 OP, a->steps_per_token, (long long)T);
    const int64_t o_shape[4] = {B, T, H, V};
    GDP_CHECK(gdp_check_dense(OP, "o", &a->o, 4, o_shape, GDP_DT_FLOAT));

    const int64_t bhkv[4] = {B, H, K, V};
    if (gdp_tensor_present(&a->state)) {
        /* Cache mode: the cache replaces initial_state / final_state. */
        if (gdp_tensor_present(&a->initial_state))
            GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                     "%s: both state (cache mode) and initial_state (dense mode) were given; the cache is read "
                     "in place, so pass only one of them",
                     OP);
        /* The final states go to the slots: a dense final state would be a second, silently
         * unwritten copy (the chunk op refuses the same mix). */
        if (a->output_final_state)
            GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                     "%s: cache mode (state given) with output_final_state set: the final states are written to "
                     "the cache slots, final_state would stay unwritten; pass output_final_state = 0, or drop state "
                     "for dense mode",
                     OP);
        GDP_CHECK(check_state_cache(a, H, K, V));
        const int64_t slots = a->state.shape[0];
        GDP_CHECK(gdp_check_slot_array(OP, "state_indices", &a->state_indices, B, slots));
        if (gdp_tensor_present(&a->intermediate_states)) {
            const int64_t S = T / a->steps_per_token;
            const int64_t inter_shape[5] = {slots, S, H, K, V};
            GDP_CHECK(gdp_check_dense(OP, "intermediate_states", &a->intermediate_states, 5, inter_shape,
                                      GDP_DT(a->state.dtype)));
        }
        return GDP_STATUS_SUCCESS;
    }
    /* Dense mode. */
    if (gdp_tensor_present(&a->state_indices))
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                 "%s: state_indices was given without state; pass the cache as state, or drop state_indices", OP);
    if (gdp_tensor_present(&a->intermediate_states))
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                 "%s: intermediate_states needs the cache (state + state_indices): its rows are indexed by slot",
                 OP);
    GDP_CHECK(gdp_check_optional_dense(OP, "initial_state", &a->initial_state, 4, bhkv, GDP_DT_FLOAT));
    if (a->output_final_state)
        GDP_CHECK(gdp_check_dense(OP, "final_state", &a->final_state, 4, bhkv, GDP_DT(GDP_DTYPE_FP32)));
    return GDP_STATUS_SUCCESS;
}

/* Every rule of the op, without running it (also for the fused decode end, decode_core.h). */
gdp_status_t gdp_recurrent_check(gdp_ctx_t ctx, const gdp_recurrent_args *args) {
    GDP_CHECK(gdp_ctx_check(ctx, OP));
    if (args == NULL)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: args is NULL; pass a filled gdp_recurrent_args", OP);
    GDP_CHECK(check_recurrent_args(args));
    const gdp_recurrent_args *a = args;
    const bool dense_final = !gdp_tensor_present(&a->state) && a->output_final_state;
    const gdp_op_buffer bufs[] = {
        {"q", &a->q, GDP_BUF_IN, false},
        {"k", &a->k, GDP_BUF_IN, false},
        {"v", &a->v, GDP_BUF_IN, false},
        {"beta", &a->beta, GDP_BUF_IN, false},
        {"initial_state", &a->initial_state, GDP_BUF_IN, false},
        {"g", &a->g, GDP_BUF_IN, false},
        {"state_indices", &a->state_indices, GDP_BUF_IN, false},
        {"state", &a->state, GDP_BUF_INOUT, false},
        {"intermediate_states", &a->intermediate_states, GDP_BUF_OUT, false},
        {"o", &a->o, GDP_BUF_OUT, false},
        {"final_state", dense_final ? &a->final_state : NULL, GDP_BUF_OUT, false},
    };
    GDP_CHECK(gdp_check_aliasing(OP, bufs, (int32_t)(sizeof bufs / sizeof bufs[0])));
    for (int i = 0; i < 6; i++) /* q, k, v, beta, initial_state finite; g also <= 0 */
        GDP_CHECK(gdp_debug_check_values(ctx, OP, bufs[i].name, bufs[i].t, i == 5));
    return GDP_STATUS_SUCCESS;
}

gdp_status_t gdp_fused_recurrent_gated_delta_rule_update(gdp_ctx_t ctx, const gdp_recurrent_args *args) {
    GDP_CHECK(gdp_recurrent_check(ctx, args));
    if (ctx->backend == GDP_BACKEND_CUDA) {
        GDP_CUDA_OP(OP, gdp_cuda_recurrent(ctx, args));
    }
    return gdp_cpu_recurrent_update(args);
}
