/*
 * cuda_check.h: the one way gdp checks the CUDA runtime, NCCL-style: a call that fails
 * records "<function>: <call> failed: <error name> (<error string>)" with the rank and
 * file:line (gdp_set_error), clears the runtime's last error (a non-sticky failure must not
 * surface in the next unrelated check), and returns GDP_STATUS_CUDA_ERROR from the caller.
 *   GDP_CUDA_CHECK(call)                      a runtime API call (memcpy, event, attribute...)
 *   GDP_CUDA_LAUNCH_CHECK(op, err, fmt, ...)  a kernel launch's cudaError_t (a launcher's
 *                                             return, or cudaGetLastError() after <<<>>>),
 *                                             reported under the op's public name with the
 *                                             launch's shape (a printf format and its values)
 * For host C files and .cu files alike; include it only where the CUDA headers are found.
 */
#ifndef GDP_CUDA_CHECK_H
#define GDP_CUDA_CHECK_H

#include <cuda_runtime_api.h>

#include "internal.h"

#ifdef __cplusplus
extern "C" {
#endif

gdp_status_t gdp_cuda_fail(cudaError_t err, const char *func, const char *call, const char *file, int line);
gdp_status_t gdp_cuda_launch_fail(cudaError_t err, const char *op, const char *file, int line, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 5, 6)))
#endif
    ;

#define GDP_CUDA_CHECK(call)                                                            \
    do {                                                                                \
        cudaError_t gdp_cuda_err_ = (call);                                             \
        if (gdp_cuda_err_ != cudaSuccess)                                               \
            return gdp_cuda_fail(gdp_cuda_err_, __func__, #call, __FILE__, __LINE__);   \
    } while (0)

#define GDP_CUDA_LAUNCH_CHECK(op, err, ...)                                                  \
    do {                                                                                     \
        cudaError_t gdp_launch_err_ = (err);                                                 \
        if (gdp_launch_err_ != cudaSuccess)                                                  \
            return gdp_cuda_launch_fail(gdp_launch_err_, (op), __FILE__, __LINE__, __VA_ARGS__); \
    } while (0)

#ifdef __cplusplus
}
#endif

#endif /* GDP_CUDA_CHECK_H */
