/*
 * gdp.h: the public C API of gdp, a runtime for Gated DeltaProduct (GDP) layers.
 *
 * This header defines what every other public header shares: export and version
 * macros, status codes and error reporting, element types, the tensor view that
 * every op takes, backends and the context. It includes the op header at the end.
 *
 * Conventions (NCCL style):
 *   - every function returns gdp_status_t; results come back through out-pointers;
 *   - on failure gdp_last_error() holds a message naming what failed, the values
 *     involved, where (file:line) and what to do; nothing was modified;
 *   - arguments are handle, outputs, inputs, sizes, and the stream comes from the ctx;
 *   - tensors are views (gdp_tensor): the caller owns the memory.
 */
#ifndef GDP_GDP_H
#define GDP_GDP_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define GDP_API
#else
#define GDP_API __attribute__((visibility("default")))
#endif

/* ---- version --------------------------------------------------------- */
#define GDP_VERSION_MAJOR 0
#define GDP_VERSION_MINOR 1
#define GDP_VERSION_PATCH 0
/* Fixed forever: X*10000 + Y*100 + Z. */
#define GDP_VERSION(X, Y, Z) ((X) * 10000 + (Y) * 100 + (Z))
#define GDP_VERSION_CODE GDP_VERSION(GDP_VERSION_MAJOR, GDP_VERSION_MINOR, GDP_VERSION_PATCH)

/* Writes GDP_VERSION_CODE of the library actually linked (may differ from the header). */
GDP_API int gdp_get_version(int *version);

/* ---- status ---------------------------------------------------------- */
typedef enum gdp_status {
    GDP_STATUS_SUCCESS = 0,
    GDP_STATUS_INVALID_ARGUMENT, /* a shape, dtype, value or pointer is wrong: see gdp_last_error() */
    GDP_STATUS_INVALID_USAGE,    /* a valid call at the wrong time (e.g. freed handle)              */
    GDP_STATUS_UNSUPPORTED,      /* valid but not implemented on this backend/size/dtype           */
    GDP_STATUS_CUDA_ERROR,
    GDP_STATUS_CUBLAS_ERROR,
    GDP_STATUS_NCCL_ERROR,
    GDP_STATUS_MPI_ERROR,
    GDP_STATUS_SYSTEM_ERROR,     /* out of memory, I/O error                                        */
    GDP_STATUS_INTERNAL_ERROR,   /* a bug in gdp: please report it with gdp_last_error()            */
    GDP_STATUS_REMOTE_ERROR,     /* another rank failed                                             */
    GDP_STATUS_NUM               /* must be last */
} gdp_status_t;

/* A fixed string: what the status means and what to do next. Never NULL. */
GDP_API const char *gdp_status_string(gdp_status_t status);

/* The detailed message of the last failure in this thread ("" if none): the function,
 * the offending values, file:line and a hint. Valid until the next failing call. */
GDP_API const char *gdp_last_error(void);

/* ---- element types --------------------------------------------------- */
typedef enum gdp_dtype {
    GDP_DTYPE_FP32 = 0,
    GDP_DTYPE_BF16,
    GDP_DTYPE_FP16,
    GDP_DTYPE_INT32,
    GDP_DTYPE_NUM /* must be last */
} gdp_dtype_t;

/* Bytes per element; 0 for an invalid dtype. */
GDP_API size_t gdp_dtype_size(gdp_dtype_t dtype);
/* "fp32", "bf16", "fp16", "int32" or "invalid". */
GDP_API const char *gdp_dtype_name(gdp_dtype_t dtype);

/* Round-to-nearest-even conversions between float and the 16-bit storage types. */
GDP_API uint16_t gdp_float_to_bf16(float x);
GDP_API float    gdp_bf16_to_float(uint16_t x);
GDP_API uint16_t gdp_float_to_fp16(float x);
GDP_API float    gdp_fp16_to_float(uint16_t x);

/* ---- tensor views ---------------------------------------------------- */
#define GDP_MAX_DIMS 6

/* A strided view of caller memory (host memory on the CPU backend, device memory on
 * CUDA). data == NULL means "absent" (Python's None) for optional arguments.
 * Strides are in elements; a view whose strides are all 0 is row-major contiguous.
 * Ops say which tensors may be strided; all others must be contiguous. */
typedef struct gdp_tensor {
    void       *data;
    gdp_dtype_t dtype;
    int32_t     ndim;
    int64_t     shape[GDP_MAX_DIMS];
    int64_t     stride[GDP_MAX_DIMS];
} gdp_tensor;

/* Fills *t as a contiguous view of `data` with the given shape. */
GDP_API gdp_status_t gdp_tensor_init(gdp_tensor *t, void *data, gdp_dtype_t dtype,
                                     int32_t ndim, const int64_t *shape);
/* Product of the shape (1 for ndim == 0). */
GDP_API int64_t gdp_tensor_numel(const gdp_tensor *t);

/* ---- backends and context ---------------------------------------------- */
typedef enum gdp_backend {
    GDP_BACKEND_CPU = 0, /* plain C reference, double accumulation, host pointers */
    GDP_BACKEND_CUDA,    /* CUDA kernels, device pointers, asynchronous on the ctx stream */
    GDP_BACKEND_NUM
} gdp_backend_t;

typedef struct gdp_ctx *gdp_ctx_t;
#define GDP_CTX_NULL NULL

/* 1 if this build of the library has the backend, else 0. */
GDP_API int gdp_backend_available(gdp_backend_t backend);

/* Creates a context on `backend`. For CUDA, `device` is the CUDA device ordinal
 * (made current on the calling thread) and the stream is the default stream until
 * gdp_ctx_set_stream(); for the CPU backend `device` is ignored. */
GDP_API gdp_status_t gdp_ctx_init(gdp_ctx_t *ctx, gdp_backend_t backend, int32_t device);
/* Frees the context and the workspace it owns. NULL is a no-op. */
GDP_API gdp_status_t gdp_ctx_free(gdp_ctx_t ctx);
/* Sets the cudaStream_t (passed as void *) ops on this ctx enqueue on. */
GDP_API gdp_status_t gdp_ctx_set_stream(gdp_ctx_t ctx, void *stream);
GDP_API gdp_status_t gdp_ctx_get_backend(gdp_ctx_t ctx, gdp_backend_t *backend);

#ifdef __cplusplus
}
#endif

#include "gdp/ops.h"

#endif /* GDP_GDP_H */
