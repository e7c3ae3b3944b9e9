/*
 * core.c: version, status strings and the thread-local last error, dtype conversions
 * (round-to-nearest-even bf16/fp16), tensor views and the helpers that check and
 * access them, and the context (backend, device, stream, workspace).
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "internal.h"

#ifdef GDP_HAVE_CUDA
#include "../kernels/gdp_kernels.h"
#endif

/* ---- version and status ---------------------------------------------------- */
int gdp_get_version(int *version) {
    if (version == NULL)
        return GDP_ERROR(GDP_STATUS_INVALID_ARGUMENT, "gdp_get_version: version is NULL");
    *version = GDP_VERSION_CODE;
    return GDP_STATUS_SUCCESS;
}

const char *gdp_status_string(gdp_status_t status) {
    switch (status) {
    case GDP_STATUS_SUCCESS: return "success";
    case GDP_STATUS_INVALID_ARGUMENT:
        return "invalid argument: a shape, dtype or value is wrong; gdp_last_error() names it";
    case GDP_STATUS_INVALID_USAGE:
        return "invalid usage: the call is not valid in this state (freed or foreign handle?); see gdp_last_error()";
    case GDP_STATUS_UNSUPPORTED:
        return "unsupported: valid but not implemented for this backend, size or dtype; see gdp_last_error()";
    case GDP_STATUS_CUDA_ERROR:
        return "CUDA error: check the driver and device; rerun with CUDA_LAUNCH_BLOCKING=1 to locate it";
    case GDP_STATUS_CUBLAS_ERROR: return "cuBLAS error: see gdp_last_error() for the failing call";
    case GDP_STATUS_NCCL_ERROR: return "NCCL error: rerun with NCCL_DEBUG=WARN for details";
    case GDP_STATUS_MPI_ERROR: return "MPI error: see gdp_last_error() for the failing call";
    case GDP_STATUS_SYSTEM_ERROR: return "system error: out of memory or an I/O failure; see gdp_last_error()";
    case GDP_STATUS_INTERNAL_ERROR: return "internal error: a bug in gdp, please report gdp_last_error()";
    case GDP_STATUS_REMOTE_ERROR: return "remote error: another rank failed; see that rank's output";
    default: return "unknown status code";
    }
}

static _Thread_local char g_last_error[2048];
static int g_error_rank = -1;

void gdp_set_error_rank(int rank) { g_error_rank = rank; }

gdp_status_t gdp_set_error(gdp_status_t status, const char *file, int line, const char *fmt, ...) {
    char msg[1800];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    const char *base = strrchr(file, '/');
    base = base ? base + 1 : file;
    if (g_error_rank >= 0)
        snprintf(g_last_error, sizeof g_last_error, "[rank %d] %s (%s:%d)", g_error_rank, msg, base, line);
    else
        snprintf(g_last_error, sizeof g_last_error, "%s (%s:%d)", msg, base, line);
    return status;
}

const char *gdp_last_error(void) { return g_last_error; }

/* ---- dtypes ------------------------------------------------------------------ */
size_t gdp_dtype_size(gdp_dtype_t dtype) {
    switch (dtype) {
    case GDP_DTYPE_FP32: return 4;
    case GDP_DTYPE_BF16: return 2;
    case GDP_DTYPE_FP16: return 2;
    case GDP_DTYPE_INT32: return 4;
    default: return 0;
    }
}

const char *gdp_dtype_name(gdp_dtype_t dtype) {
    switch (dtype) {
    case GDP_DTYPE_FP32: return "fp32";
    case GDP_DTYPE_BF16: return "bf16";
    case GDP_DTYPE_FP16: return "fp16";
    case GDP_DTYPE_INT32: return "int32";
    default: return "invalid";
    }
}

static uint32_t f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

uint16_t gdp_float_to_bf16(float x) {
    uint32_t u = f32_bits(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: keep it quiet and signed */
        return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest, ties to even */
    return (uint16_t)(u >> 16);
}

float gdp_bf16_to_float(uint16_t x) { return bits_f32((uint32_t)x << 16); }

uint16_t gdp_double_to_bf16(double x) {
    float f = (float)x;
    /* (float)x rounded already; a second rounding to bf16 is wrong only when f sits
     * exactly on a bf16 midpoint that x did not: nudge f toward x, then round. */
    if ((double)f != x && isfinite(f) && (f32_bits(f) & 0xffffu) == 0x8000u)
        f = nextafterf(f, (double)f < x ? INFINITY : -INFINITY);
    return gdp_float_to_bf16(f);
}

uint16_t gdp_float_to_fp16(float x) {
    _Float16 h = (_Float16)x;
    uint16_t u;
    memcpy(&u, &h, 2);
    return u;
}

float gdp_fp16_to_float(uint16_t x) {
    _Float16 h;
    memcpy(&h, &x, 2);
    return (float)h;
}

static uint16_t double_to_fp16(double x) {
    _Float16 h = (_Float16)x; /* GCC converts double to _Float16 directly, RNE */
    uint16_t u;
    memcpy(&u, &h, 2);
    return u;
}

double gdp_load_elem(const void *base, gdp_dtype_t dtype, int64_t off) {
    switch (dtype) {
    case GDP_DTYPE_FP32: return ((const float *)base)[off];
    case GDP_DTYPE_BF16: return gdp_bf16_to_float(((const uint16_t *)base)[off]);
    case GDP_DTYPE_FP16: return gdp_fp16_to_float(((const uint16_t *)base)[off]);
    case GDP_DTYPE_INT32: return ((const int32_t *)base)[off];
    default: return NAN;
    }
}

void gdp_store_elem(void *base, gdp_dtype_t dtype, int64_t off, double v) {
    switch (dtype) {
    case GDP_DTYPE_FP32: ((float *)base)[off] = (float)v; break;
    case GDP_DTYPE_BF16: ((uint16_t *)base)[off] = gdp_double_to_bf16(v); break;
    case GDP_DTYPE_FP16: ((uint16_t *)base)[off] = double_to_fp16(v); break;
    case GDP_DTYPE_INT32: ((int32_t *)base)[off] = (int32_t)v; break;
    default: break;
    }
}

/* ---- tensors ------------------------------------------------------------------- */
gdp_status_t gdp_tensor_init(gdp_tensor *t, void *data, gdp_dtype_t dtype, int32_t ndim,
                             const int64_t *shape) {
    if (t == NULL)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "gdp_tensor_init: t is NULL");
    if (ndim < 0 || ndim > GDP_MAX_DIMS)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "gdp_tensor_init: ndim %d is outside [0, %d]", ndim,
                 GDP_MAX_DIMS);
    if ((int)dtype < 0 || dtype >= GDP_DTYPE_NUM)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "gdp_tensor_init: dtype %d is not a gdp_dtype_t", (int)dtype);
    for (int32_t d = 0; d < ndim; d++)
        if (shape == NULL || shape[d] < 0)
            GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "gdp_tensor_init: extent %d is negative or missing", d);
    int64_t numel = 0;
    size_t bytes = 0;
    if (!gdp_shape_numel(ndim, shape, &numel) || !gdp_bytes_of(numel, gdp_dtype_size(dtype), &bytes)) {
        char text[160];
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                 "gdp_tensor_init: shape %s of %s holds more than 2^63 bytes; a size from a file or a user "
                 "overflowed (check the dimensions)",
                 gdp_shape_str(text, sizeof text, ndim, shape), gdp_dtype_name(dtype));
    }
    memset(t, 0, sizeof *t);
    t->data = data;
    t->dtype = dtype;
    t->ndim = ndim;
    for (int32_t d = 0; d < ndim; d++)
        t->shape[d] = shape[d];
    return GDP_STATUS_SUCCESS;
}

int64_t gdp_tensor_numel(const gdp_tensor *t) {
    if (t == NULL || t->ndim < 0 || t->ndim > GDP_MAX_DIMS)
        return 0;
    /* A view filled by hand may hold any extents: saturate instead of overflowing (the op
     * front-ends refuse such views in gdp_check_tensor). */
    int64_t n = 0;
    return gdp_shape_numel(t->ndim, t->shape, &n) ? n : INT64_MAX;
}

static bool strides_unset(const gdp_tensor *t) {
    for (int32_t d = 0; d < t->ndim; d++)
        if (t->stride[d] != 0)
            return false;
    return true;
}

int64_t gdp_tensor_stride(const gdp_tensor *t, int32_t d) {
    if (!strides_unset(t))
        return t->stride[d];
    int64_t s = 1;
    for (int32_t e = t->ndim - 1; e > d; e--)
        s *= t->shape[e];
    return s;
}

bool gdp_tensor_is_contiguous(const gdp_tensor *t) {
    if (strides_unset(t))
        return true;
    int64_t s = 1;
    for (int32_t d = t->ndim - 1; d >= 0; d--) {
        if (t->shape[d] != 1 && t->stride[d] != s)
            return false;
        s *= t->shape[d];
    }
    return true;
}

int64_t gdp_tensor_offset(const gdp_tensor *t, int64_t flat) {
    if (strides_unset(t))
        return flat;
    int64_t off = 0;
    for (int32_t d = t->ndim - 1; d >= 0; d--) {
        int64_t ext = t->shape[d] > 0 ? t->shape[d] : 1;
        off += (flat % ext) * t->stride[d];
        flat /= ext;
    }
    return off;
}

void gdp_tensor_read_f64(const gdp_tensor *t, int64_t start, int64_t n, double *dst) {
    if (strides_unset(t)) {
        for (int64_t i = 0; i < n; i++)
            dst[i] = gdp_load_elem(t->data, t->dtype, start + i);
        return;
    }
    for (int64_t i = 0; i < n; i++)
        dst[i] = gdp_tensor_get(t, start + i);
}

void gdp_tensor_write_f64(gdp_tensor *t, int64_t start, int64_t n, const double *src) {
    if (strides_unset(t)) {
        for (int64_t i = 0; i < n; i++)
            gdp_store_elem(t->data, t->dtype, start + i, src[i]);
        return;
    }
    for (int64_t i = 0; i < n; i++)
        gdp_tensor_set(t, start + i, src[i]);
}

void *gdp_calloc(size_t count, size_t size, const char *what) {
    void *p = calloc(count ? count : 1, size ? size : 1);
    if (p == NULL)
        GDP_ERROR(GDP_STATUS_SYSTEM_ERROR, "out of memory allocating %zu x %zu bytes for %s", count, size,
                  what);
    return p;
}

double *gdp_tensor_to_f64(const gdp_tensor *t) {
    int64_t n = gdp_tensor_numel(t);
    double *buf = gdp_calloc((size_t)n, sizeof(double), "a double copy of a tensor");
    if (buf != NULL)
        gdp_tensor_read_f64(t, 0, n, buf);
    return buf;
}

const char *gdp_shape_str(char *buf, size_t n, int32_t ndim, const int64_t *shape) {
    size_t used = 0;
    used += (size_t)snprintf(buf + used, n - used, "[");
    for (int32_t d = 0; d < ndim && used < n; d++) {
        if (shape[d] == GDP_ANY)
            used += (size_t)snprintf(buf + used, n - used, "%s*", d ? ", " : "");
        else
            used += (size_t)snprintf(buf + used, n - used, "%s%lld", d ? ", " : "", (long long)shape[d]);
    }
    if (used < n)
        snprintf(buf + used, n - used, "]");
    return buf;
}

static void dtype_mask_str(char *buf, size_t n, uint32_t mask) {
    size_t used = 0;
    buf[0] = 0;
    for (int d = 0; d < GDP_DTYPE_NUM && used < n; d++)
        if (mask & GDP_DT(d))
            used += (size_t)snprintf(buf + used, n - used, "%s%s", used ? " or " : "",
                                     gdp_dtype_name((gdp_dtype_t)d));
}

gdp_status_t gdp_check_tensor(const char *op, const char *name, const gdp_tensor *t, int32_t ndim,
                              const int64_t *shape, uint32_t dtypes) {
    char got[160], want[160], dts[64];
    if (!gdp_tensor_present(t))
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: %s is missing (NULL data); pass a tensor", op, name);
    if ((int)t->dtype < 0 || t->dtype >= GDP_DTYPE_NUM)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: %s has invalid dtype %d", op, name, (int)t->dtype);
    if (!(dtypes & GDP_DT(t->dtype))) {
        dtype_mask_str(dts, sizeof dts, dtypes);
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: %s has dtype %s, expected %s", op, name,
                 gdp_dtype_name(t->dtype), dts);
    }
    bool ok = t->ndim == ndim;
    for (int32_t d = 0; ok && d < ndim; d++)
        ok = t->shape[d] >= 0 && (shape[d] == GDP_ANY || t->shape[d] == shape[d]);
    if (!ok) {
        int32_t gn = t->ndim < 0 ? 0 : (t->ndim > GDP_MAX_DIMS ? GDP_MAX_DIMS : t->ndim);
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: %s has shape %s, expected %s", op, name,
                 gdp_shape_str(got, sizeof got, gn, t->shape), gdp_shape_str(want, sizeof want, ndim, shape));
    }
    /* Wildcard extents come from the caller: the tensor's size (and every offset into it)
     * must fit int64, and each stride must be addressable without overflow. */
    int64_t numel = 0;
    size_t bytes = 0;
    bool fits = gdp_shape_numel(t->ndim, t->shape, &numel) && gdp_bytes_of(numel, gdp_dtype_size(t->dtype), &bytes);
    for (int32_t d = 0; fits && numel > 0 && d < t->ndim; d++) {
        int64_t span = 0;
        const int64_t stride = t->stride[d] < 0 ? -t->stride[d] : t->stride[d];
        fits = t->stride[d] != INT64_MIN && gdp_mul_i64(t->shape[d] - 1, stride, &span) &&
               gdp_bytes_of(span, gdp_dtype_size(t->dtype), &bytes);
    }
    if (!fits)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                 "%s: %s has shape %s (or strides) whose byte extent overflows 64 bits; the sizes are wrong", op, name,
                 gdp_shape_str(got, sizeof got, t->ndim, t->shape));
    return GDP_STATUS_SUCCESS;
}

gdp_status_t gdp_check_contiguous(const char *op, const char *name, const gdp_tensor *t) {
    if (!gdp_tensor_is_contiguous(t))
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: %s must be contiguous (row-major); pass a contiguous copy",
                 op, name);
    return GDP_STATUS_SUCCESS;
}

/* ---- context ------------------------------------------------------------------ */
int gdp_backend_available(gdp_backend_t backend) {
    if (backend == GDP_BACKEND_CPU)
        return 1;
#ifdef GDP_HAVE_CUDA
    if (backend == GDP_BACKEND_CUDA)
        return 1;
#endif
    return 0;
}

gdp_status_t gdp_ctx_init(gdp_ctx_t *out, gdp_backend_t backend, int32_t device) {
    if (out == NULL)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "gdp_ctx_init: ctx out-pointer is NULL");
    *out = NULL;
    if ((int)backend < 0 || backend >= GDP_BACKEND_NUM)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "gdp_ctx_init: backend %d is not a gdp_backend_t", (int)backend);
    if (!gdp_backend_available(backend))
        GDP_FAIL(GDP_STATUS_UNSUPPORTED,
                 "gdp_ctx_init: this libgdp was built without the CUDA backend; rebuild with nvcc on PATH "
                 "and -DGDP_WITH_CUDA=ON, or use GDP_BACKEND_CPU");
    struct gdp_ctx *ctx = gdp_calloc(1, sizeof *ctx, "gdp_ctx");
    if (ctx == NULL)
        return GDP_STATUS_SYSTEM_ERROR;
    ctx->magic = ctx->magic_end = GDP_CTX_MAGIC;
    ctx->backend = backend;
    ctx->device = device;
    ctx->debug_checks = gdp_debug_checks_from_env();
#ifdef GDP_HAVE_CUDA
    if (backend == GDP_BACKEND_CUDA) {
        gdp_status_t st = gdp_cuda_ctx_init(ctx);
        if (st != GDP_STATUS_SUCCESS) {
            free(ctx);
            return st;
        }
    }
#endif
    *out = ctx;
    return GDP_STATUS_SUCCESS;
}

gdp_status_t gdp_ctx_check(gdp_ctx_t ctx, const char *op) {
    if (ctx == NULL)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: ctx is NULL; create one with gdp_ctx_init()", op);
    if (ctx->magic != GDP_CTX_MAGIC || ctx->magic_end != GDP_CTX_MAGIC)
        GDP_FAIL(GDP_STATUS_INVALID_USAGE, "%s: ctx %p is not a live gdp context (freed or corrupted)", op,
                 (void *)ctx);
    return GDP_STATUS_SUCCESS;
}

gdp_status_t gdp_ctx_free(gdp_ctx_t ctx) {
    if (ctx == NULL)
        return GDP_STATUS_SUCCESS;
    GDP_CHECK(gdp_ctx_check(ctx, "gdp_ctx_free"));
    gdp_status_t st = GDP_STATUS_SUCCESS;
#ifdef GDP_HAVE_CUDA
    if (ctx->backend == GDP_BACKEND_CUDA)
        st = gdp_cuda_ctx_free(ctx);
#endif
    ctx->magic = ctx->magic_end = 0;
    free(ctx);
    return st;
}

gdp_status_t gdp_ctx_set_stream(gdp_ctx_t ctx, void *stream) {
    GDP_CHECK(gdp_ctx_check(ctx, "gdp_ctx_set_stream"));
    ctx->stream = stream;
    return GDP_STATUS_SUCCESS;
}

gdp_status_t gdp_ctx_get_backend(gdp_ctx_t ctx, gdp_backend_t *backend) {
    GDP_CHECK(gdp_ctx_check(ctx, "gdp_ctx_get_backend"));
    if (backend == NULL)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "gdp_ctx_get_backend: backend out-pointer is NULL");
    *backend = ctx->backend;
    return GDP_STATUS_SUCCESS;
}
