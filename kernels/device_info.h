/*
 * device_info.h: facts of a CUDA device that the launchers size their grids by, queried once
 * per device and cached (kernels/context.cu). C++ (the .cu files of kernels/) only.
 */
#ifndef GDP_DEVICE_INFO_H
#define GDP_DEVICE_INFO_H

#include <cuda_runtime_api.h>

/* Multiprocessors of `device` into *sms, queried once per device and cached (the grid choices
 * of the chunk op's state sweep and of the decode row kernel need it on every call; the
 * attribute never changes). The runtime's error, with *sms = 0, when the query fails. */
cudaError_t gdp_device_sm_count(int device, int *sms);
/* The compute capability of `device` as 10 major + minor (90 for Hopper) into *cc, cached the same
 * way (the chunk op chooses its Hopper kernel and copy-engine copies by it on every call). The
 * runtime's error, with *cc = 0, when the query fails. */
cudaError_t gdp_device_cc(int device, int *cc);
/* The most dynamic shared memory a block of `device` may opt in to, in bytes, into *bytes, cached the
 * same way (the decode ring kernel sizes its ring of stages by it on every call). */
cudaError_t gdp_device_shared_optin(int device, int *bytes);

#endif /* GDP_DEVICE_INFO_H */
