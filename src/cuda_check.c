/*
 * cuda_check.c: the messages of cuda_check.h's checks (a CUDA build only).
 */
#ifdef GDP_HAVE_CUDA
#include <stdarg.h>
#include <stdio.h>

#include "cuda_check.h"

gdp_status_t gdp_cuda_error(cudaError_t err, const char *file, int line, const char *fmt, ...) {
    (void)cudaGetLastError();
    char what[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return gdp_set_error(GDP_STATUS_CUDA_ERROR, file, line, "%s: %s (%s)", what, cudaGetErrorName(err),
                         cudaGetErrorString(err));
}

gdp_status_t gdp_cuda_launch_error(cudaError_t err, const char *op, const char *file, int line, const char *fmt, ...) {
    char shape[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(shape, sizeof shape, fmt, ap);
    va_end(ap);
    return gdp_cuda_error(err, file, line, "%s: kernel launch failed (%s)", op, shape);
}
#endif
