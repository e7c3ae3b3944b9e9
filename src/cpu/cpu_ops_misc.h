/*
 * cpu_ops_misc.h: the CPU reference of the prepare, decode (fused recurrent), causal
 * conv1d and norm ops (src/cpu/{prepare,recurrent,conv,norm}.c), plus the argument
 * checks their front-ends (src/ops_{prepare,recurrent,conv,norm}.c) share.
 *
 * The gdp_cpu_* functions are called after the front-end has checked every shape and
 * dtype rule that holds on all backends. They add the checks that need host data
 * (slot indices, cu_seqlens values), all before their first write, so a failing call
 * still modifies nothing.
 */
#ifndef GDP_CPU_OPS_MISC_H
#define GDP_CPU_OPS_MISC_H

#include "internal.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- argument checks shared by the front-ends ---------------------------------- */

/* A tensor whose rows may be a strided view (e.g. a slice of a wider activation): the
 * last dim must be contiguous (stride 1) and no stride may be negative. */
static inline gdp_status_t gdp_check_row_view(const char *op, const char *name, const gdp_tensor *t) {
    if (t->ndim < 1 || gdp_tensor_stride(t, t->ndim - 1) != 1)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                 "%s: %s has last-dim stride %lld; only its rows may be strided, the last dim must be "
                 "contiguous (stride 1)",
                 op, name, (long long)(t->ndim >= 1 ? gdp_tensor_stride(t, t->ndim - 1) : 0));
    for (int32_t d = 0; d < t->ndim - 1; d++)
        if (gdp_tensor_stride(t, d) < 0)
            GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: %s has negative stride %lld in dim %d; pass a view with "
                     "non-negative strides", op, name, (long long)gdp_tensor_stride(t, d), d);
    return GDP_STATUS_SUCCESS;
}

/* gdp_check_tensor followed by gdp_check_contiguous: the usual rule for every tensor an
 * op does not document as strided. */
static inline gdp_status_t gdp_check_dense(const char *op, const char *name, const gdp_tensor *t, int32_t ndim,
                                           const int64_t *shape, uint32_t dtypes) {
    GDP_CHECK(gdp_check_tensor(op, name, t, ndim, shape, dtypes));
    return gdp_check_contiguous(op, name, t);
}

/* An optional argument: absent (NULL data) passes, otherwise gdp_check_dense. */
static inline gdp_status_t gdp_check_optional_dense(const char *op, const char *name, const gdp_tensor *t,
                                                    int32_t ndim, const int64_t *shape, uint32_t dtypes) {
    if (!gdp_tensor_present(t))
        return GDP_STATUS_SUCCESS;
    return gdp_check_dense(op, name, t, ndim, shape, dtypes);
}

/* An int32 [rows] slot-index array (absent allowed: row b uses slot b, which needs
 * rows <= slots). Values are checked on the host by gdp_cpu_check_slots. */
static inline gdp_status_t gdp_check_slot_array(const char *op, const char *name, const gdp_tensor *indices,
                                                int64_t rows, int64_t slots) {
    if (!gdp_tensor_present(indices)) {
        if (rows > slots)
            GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                     "%s: %s is absent, so request b uses slot b, but there are %lld requests and only %lld "
                     "slots; pass %s or a larger cache",
                     op, name, (long long)rows, (long long)slots, name);
        return GDP_STATUS_SUCCESS;
    }
    const int64_t shape[1] = {rows};
    return gdp_check_dense(op, name, indices, 1, shape, GDP_DT_INT32);
}

/* ---- host-side checks of the CPU backend --------------------------------------- */

/* The slot of request `row`: indices[row], or row itself when indices is absent. */
static inline int64_t gdp_cpu_slot_of(const gdp_tensor *indices, int64_t row) {
    if (!gdp_tensor_present(indices))
        return row;
    return ((const int32_t *)indices->data)[gdp_tensor_offset(indices, row)];
}

/* Checks the values of a slot-index array of `rows` requests (host memory) against a
 * cache of `slots` slots: each is -1 (padding) or in [0, slots), and no slot is named
 * by two requests (their in-place updates would race). Names the row and value. */
gdp_status_t gdp_cpu_check_slots(const char *op, const char *name, const gdp_tensor *indices, int64_t rows,
                                 int64_t slots);

/* ---- the CPU reference ops ------------------------------------------------------- */

/* gdp_decode_prepare (decode != 0) / gdp_prefill_prepare: copies and float gating. */
gdp_status_t gdp_cpu_prepare(const gdp_prepare_args *args, int decode);

/* gdp_fused_recurrent_gated_delta_rule_update in double. */
gdp_status_t gdp_cpu_recurrent_update(const gdp_recurrent_args *args);

/* gdp_causal_conv1d_update / gdp_causal_conv1d_varlen, double accumulation. */
gdp_status_t gdp_cpu_conv1d_update(const gdp_conv1d_update_args *args);
gdp_status_t gdp_cpu_conv1d_varlen(const gdp_conv1d_varlen_args *args);

/* gdp_gated_rmsnorm / gdp_rmsnorm in double; rows = numel / d, d = last extent. */
gdp_status_t gdp_cpu_gated_rmsnorm(gdp_tensor *out, const gdp_tensor *y, const gdp_tensor *z,
                                   const gdp_tensor *weight, int64_t group_size, double eps);
gdp_status_t gdp_cpu_rmsnorm(gdp_tensor *out, const gdp_tensor *x, const gdp_tensor *weight, double eps);

#ifdef __cplusplus
}
#endif

#endif /* GDP_CPU_OPS_MISC_H */
