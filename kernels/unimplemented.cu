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

