/*
 * cuda_check.c: the messages of cuda_check.h's two checks (a CUDA build only).
 */
#ifdef GDP_HAVE_CUDA
#include <stdarg.h>
#include <stdio.h>

#include "cuda_check.h"

gdp_status_t gdp_cuda_fail(cudaError_t err, const char *func, const char *call, const char *file, int line) {
    (void)cudaGetLastError();
    return gdp_set_error(GDP_STATUS_CUDA_ERROR, file, line, "%s: %s failed: %s (%s)", func, call,
                         cudaGetErrorName(err), cudaGetErrorString(err));
}

gdp_status_t gdp_cuda_launch_fail(cudaError_t err, const char *op, const char *file, int line, const char *fmt, ...) {
    (void)cudaGetLastError();
    char shape[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(shape, sizeof shape, fmt, ap);
    va_end(ap);
    return gdp_set_error(GDP_STATUS_CUDA_ERROR, file, line, "%s: kernel launch failed: %s (%s)%s%s%s", op,
                         cudaGetErrorName(err), cudaGetErrorString(err), shape[0] ? " (" : "", shape,
                         shape[0] ? ")" : "");
}
#endif
