/*
 * gdp_kernels.h: the C-callable launchers of the CUDA backend (the .cu files of kernels/). Each
 * op front-end in src/ validates arguments, then calls the launcher of its family on
 * the ctx's stream; launchers check their own launch and return a status, never abort.
 */
#ifndef GDP_KERNELS_H
#define GDP_KERNELS_H

#include "gdp/gdp.h"

#ifdef __cplusplus
extern "C" {
#endif

struct gdp_ctx;

/* Context set-up for the CUDA backend: selects the device, checks it is usable. */
gdp_status_t gdp_cuda_ctx_init(struct gdp_ctx *ctx);
gdp_status_t gdp_cuda_ctx_free(struct gdp_ctx *ctx);

#ifdef __cplusplus
}
#endif

#endif /* GDP_KERNELS_H */
