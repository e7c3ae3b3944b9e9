/*
 * dev_check.cuh: the developer tools' check of a CUDA runtime call (kernels/dev/*.cu, each built alone by
 * nvcc): CK(call) prints the call, the runtime's message and where, then exits (tools, not the library,
 * which never exits). Header-only, no library dependency.
 */
#ifndef GDP_DEV_CHECK_CUH
#define GDP_DEV_CHECK_CUH

#include <cstdio>
#include <cstdlib>

#include <cuda_runtime.h>

#define CK(call)                                                                                             \
    do {                                                                                                     \
        const cudaError_t e_ = (call);                                                                       \
        if (e_ != cudaSuccess) {                                                                             \
            fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_));    \
            exit(1);                                                                                         \
        }                                                                                                    \
    } while (0)

#endif /* GDP_DEV_CHECK_CUH */
