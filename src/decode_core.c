/*
 * decode_core.c: gdp_decode_conv_prepare, the layer's fused decode front (decode_core.h).
 * Both ops' front-end checks run first, so a refused call is refused exactly as the two ops
 * would refuse it and modifies nothing; then one CUDA launch (kernels/decode_core.cu) when
 * the step fits it, else the two ops in order.
 */
#include "decode_core.h"
#include "internal.h"

#ifdef GDP_HAVE_CUDA
#include "kernels/gdp_kernels.h"
#endif

gdp_status_t gdp_decode_conv_prepare(gdp_ctx_t ctx, const gdp_conv1d_update_args *conv, const gdp_prepare_args *prep) {
    static const char *op = "gdp_decode_conv_prepare";
    if (conv == NULL || prep == NULL)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: conv or prep is NULL; pass both argument structs", op);
    if (prep->x.data != conv->y.data || prep->x.dtype != conv->y.dtype)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: prep->x must be conv->y (the prepare reads the conv's output)", op);
    GDP_CHECK(gdp_conv1d_update_check(ctx, conv, "gdp_causal_conv1d_update"));
    GDP_CHECK(gdp_prepare_check(ctx, prep, 1, "gdp_decode_prepare"));
#ifdef GDP_HAVE_CUDA
    if (ctx->backend == GDP_BACKEND_CUDA && gdp_cuda_decode_core_fits(conv, prep))
        return gdp_cuda_decode_core(ctx, conv, prep);
#endif
    GDP_CHECK(gdp_causal_conv1d_update(ctx, conv));
    return gdp_decode_prepare(ctx, prep);
}
