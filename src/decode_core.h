/*
 * decode_core.h: the layer's fused decode front (src/decode_core.c): the conv update and
 * the decode prepare of one step's decode rows as one op.
 */
#ifndef GDP_DECODE_CORE_H
#define GDP_DECODE_CORE_H

#include "gdp/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The front-end checks of the two ops it fuses (src/ops_conv.c, src/ops_prepare.c): every
 * rule the op itself applies, without running it. */
gdp_status_t gdp_conv1d_update_check(gdp_ctx_t ctx, const gdp_conv1d_update_args *args, const char *op);
gdp_status_t gdp_prepare_check(gdp_ctx_t ctx, const gdp_prepare_args *args, int decode, const char *op);

/* gdp_causal_conv1d_update(conv) then gdp_decode_prepare(prep), where prep->x is conv->y:
 * the same outputs (query, key, value, beta, g and the conv state) bit for bit. On CUDA,
 * with one token per request, no conv snapshots, width 4, 16-byte runs and at most 64
 * requests (measured: faster there, slower at 256; kernels/decode_core.cu), one launch
 * that never writes conv->y (its contents are then unspecified); otherwise the two ops. */
gdp_status_t gdp_decode_conv_prepare(gdp_ctx_t ctx, const gdp_conv1d_update_args *conv, const gdp_prepare_args *prep);

#ifdef __cplusplus
}
#endif

#endif /* GDP_DECODE_CORE_H */
