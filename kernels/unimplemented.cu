/*
 * unimplemented.cu: CUDA launchers not written yet. Each returns GDP_STATUS_UNSUPPORTED
 * with a message, so the library links and a CUDA ctx fails cleanly on these ops. A
 * kernel family removes its entries from this file when its own .cu lands.
 */
#include "gdp_kernels.h"
#include "src/internal.h"

#define GDP_CUDA_TODO(op) \
    GDP_FAIL(GDP_STATUS_UNSUPPORTED, "%s: the CUDA backend does not implement this op yet; use GDP_BACKEND_CPU", op)

// kernel launchers

extern "C" gdp_status_t gdp_cuda_chunk_local_cumsum(struct gdp_ctx *, gdp_tensor *, gdp_tensor *, const gdp_tensor *,
                                                    const gdp_tensor *, int32_t) { GDP_CUDA_TODO("gdp_chunk_local_cumsum"); }
extern "C" gdp_status_t gdp_cuda_chunk(struct gdp_ctx *, const gdp_chunk_args *) { GDP_CUDA_TODO("gdp_chunk_gated_delta_product_varlen"); }
