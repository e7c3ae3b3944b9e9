/*
 * cuda_check.h: the one way gdp checks the CUDA runtime, NCCL-style. A failure records its
 * message with the rank and file:line (gdp_set_error), clears the runtime's last error (a
 * non-sticky failure must not surface in the next, unrelated check), and returns
 * GDP_STATUS_CUDA_ERROR from the caller:
 *   GDP_CUDA_CHECK(call)                      a runtime API call (memcpy, event, attribute...):
 *                                             "<function>: <call> failed: <name> (<string>)"
 *   GDP_CUDA_LAUNCH_CHECK(op, err, fmt, ...)  a kernel launch's cudaError_t (a launcher's
 *                                             return, or cudaGetLastError() after <<<>>>) under
 *                                             the op's public name with the launch's shape:
 *                                             "<op>: kernel launch failed (<shape>): <name> (<string>)"
 *   GDP_CUDA_FAIL(err, fmt, ...)              a failure already caught, for a path that must
 *                                             clean up first or say more (as GDP_FAIL does):
 *                                             "<fmt ...>: <name> (<string>)"
 * For host C files and .cu files alike; include it only where the CUDA headers are found.
 */
#ifndef GDP_CUDA_CHECK_H
#define GDP_CUDA_CHECK_H

#include <cuda_runtime_api.h>

#include "internal.h"

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define GDP_CUDA_PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define GDP_CUDA_PRINTF(f, a)
#endif

/* The messages of the three forms above (src/cuda_check.c). */
gdp_status_t gdp_cuda_error(cudaError_t err, const char *file, int line, const char *fmt, ...) GDP_CUDA_PRINTF(4, 5);
gdp_status_t gdp_cuda_launch_error(cudaError_t err, const char *op, const char *file, int line, const char *fmt, ...)
    GDP_CUDA_PRINTF(5, 6);

#define GDP_CUDA_CHECK(call)                                                                    \
    do {                                                                                        \
        cudaError_t gdp_cuda_err_ = (call);                                                     \
        if (gdp_cuda_err_ != cudaSuccess)                                                       \
            return gdp_cuda_error(gdp_cuda_err_, __FILE__, __LINE__, "%s: %s failed", __func__, #call); \
    } while (0)

#define GDP_CUDA_LAUNCH_CHECK(op, err, ...)                                                    \
    do {                                                                                       \
        cudaError_t gdp_launch_err_ = (err);                                                   \
        if (gdp_launch_err_ != cudaSuccess)                                                    \
            return gdp_cuda_launch_error(gdp_launch_err_, (op), __FILE__, __LINE__, __VA_ARGS__); \
    } while (0)

#define GDP_CUDA_FAIL(err, ...) return gdp_cuda_error((err), __FILE__, __LINE__, __VA_ARGS__)

#ifdef __cplusplus
}
#endif

#endif /* GDP_CUDA_CHECK_H */
