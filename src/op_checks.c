/*
 * op_checks.c: checks every op front-end (src/ops_*.c) runs beyond shapes and dtypes, so both
 * backends get them:
 *   - aliasing: no output may overlap an input or another output (an op reads its inputs
 *     while it writes, so an aliased output returns success with clobbered data); the
 *     in-place caches (state, conv_state) count as outputs, read and written by the op itself;
 *     the norms may run exactly in place (each row is read before it is written);
 *   - the debug-checked mode (gdp_ctx_set_debug_checks, or GDP_DEBUG_CHECKS=1 when the ctx is
 *     made): the float inputs must be finite and the log decays g <= 0, checked before the op
 *     writes anything, so a NaN never reaches a cache slot. On CUDA the values are copied to
 *     the host (a synchronizing copy per input: a debugging aid, not for production).
 * docs/api.md ("Aliasing" and "Debug checks") is the contract.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "gdp/ops.h"
#include "internal.h"

#ifdef GDP_HAVE_CUDA
#include <cuda_runtime_api.h> /* defines: cudaMemcpyAsync, cudaStreamIsCapturing (host copies of inputs) */

#include "cuda_check.h"
#endif

/* ---- byte spans --------------------------------------------------------------------------- */
/* The element offsets [lo, hi] a view addresses relative to its data pointer; false when it
 * holds no element. Sizes were checked by gdp_check_tensor, so nothing here overflows. */
static bool element_span(const gdp_tensor *t, int64_t *lo, int64_t *hi) {
    if (!gdp_tensor_present(t) || gdp_tensor_numel(t) == 0)
        return false;
    int64_t a = 0, b = 0;
    for (int32_t d = 0; d < t->ndim; d++) {
        const int64_t step = (t->shape[d] - 1) * gdp_tensor_stride(t, d);
        if (step < 0)
            a += step;
        else
            b += step;
    }
    *lo = a, *hi = b;
    return true;
}

static bool byte_span(const gdp_tensor *t, uintptr_t *first, uintptr_t *end) {
    int64_t lo, hi;
    if (!element_span(t, &lo, &hi))
        return false;
    const int64_t es = (int64_t)gdp_dtype_size(t->dtype);
    *first = (uintptr_t)t->data + (uintptr_t)(lo * es);
    *end = (uintptr_t)t->data + (uintptr_t)((hi + 1) * es);
    return true;
}

/* `out` is exactly input `in` (same start, dtype and shape, both contiguous) and `in` allows it. */
static bool exact_in_place(const gdp_op_buffer *out, const gdp_op_buffer *in) {
    if (out->role != GDP_BUF_OUT || in->role != GDP_BUF_IN || !in->in_place_ok)
        return false;
    const gdp_tensor *a = out->t, *b = in->t;
    bool same = a->data == b->data && a->dtype == b->dtype && a->ndim == b->ndim && gdp_tensor_is_contiguous(a) &&
                gdp_tensor_is_contiguous(b);
    for (int32_t d = 0; same && d < a->ndim; d++)
        same = a->shape[d] == b->shape[d];
    return same;
}

static const char *role_name(gdp_buffer_role role) {
    return role == GDP_BUF_IN ? "input" : role == GDP_BUF_OUT ? "output" : "in-place buffer";
}

gdp_status_t gdp_check_aliasing(const char *op, const gdp_op_buffer *bufs, int32_t n) {
    for (int32_t i = 0; i < n; i++) {
        uintptr_t a0, a1;
        if (!byte_span(bufs[i].t, &a0, &a1))
            continue;
        for (int32_t j = 0; j < i; j++) {
            if (bufs[i].role == GDP_BUF_IN && bufs[j].role == GDP_BUF_IN)
                continue; /* inputs may share memory: they are only read */
            uintptr_t b0, b1;
            if (!byte_span(bufs[j].t, &b0, &b1) || a1 <= b0 || b1 <= a0)
                continue;
            if (exact_in_place(&bufs[i], &bufs[j]) || exact_in_place(&bufs[j], &bufs[i]))
                continue;
            /* Name the one written first in the message (the output, else the in-place one). */
            const gdp_op_buffer *w = bufs[i].role != GDP_BUF_IN ? &bufs[i] : &bufs[j];
            const gdp_op_buffer *r = w == &bufs[i] ? &bufs[j] : &bufs[i];
            GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                     "%s: %s %s (%p, %zu bytes) overlaps %s %s (%p, %zu bytes): an op reads its inputs while it "
                     "writes, so an output may not alias an input, another output or the in-place cache; pass "
                     "separate buffers (docs/api.md, Aliasing)",
                     op, role_name(w->role), w->name, w->t->data, (size_t)(w == &bufs[i] ? a1 - a0 : b1 - b0),
                     role_name(r->role), r->name, r->t->data, (size_t)(r == &bufs[i] ? a1 - a0 : b1 - b0));
        }
    }
    return GDP_STATUS_SUCCESS;
}

/* ---- the debug-checked mode ---------------------------------------------------------------- */
gdp_status_t gdp_ctx_set_debug_checks(gdp_ctx_t ctx, int32_t enabled) {
    GDP_CHECK(gdp_ctx_check(ctx, "gdp_ctx_set_debug_checks"));
    ctx->debug_checks = enabled != 0;
    return GDP_STATUS_SUCCESS;
}

gdp_status_t gdp_ctx_get_debug_checks(gdp_ctx_t ctx, int32_t *enabled) {
    GDP_CHECK(gdp_ctx_check(ctx, "gdp_ctx_get_debug_checks"));
    if (enabled == NULL)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "gdp_ctx_get_debug_checks: enabled is NULL");
    *enabled = ctx->debug_checks;
    return GDP_STATUS_SUCCESS;
}

bool gdp_debug_checks_from_env(void) {
    const char *v = getenv("GDP_DEBUG_CHECKS");
    return v != NULL && v[0] != '\0' && strcmp(v, "0") != 0;
}

int gdp_env_choice(const char *name, const char *const *spell, const int *value, int n, int unset, const char **text) {
    const char *e = getenv(name);
    if (text != NULL)
        *text = e;
    if (e == NULL || e[0] == '\0')
        return unset;
    for (int i = 0; i < n; i++)
        if (strcmp(e, spell[i]) == 0)
            return value[i];
    return -1;
}

/* Host bytes of the view's span: the data itself on the CPU, a copy on CUDA (*copy to free). */
static gdp_status_t host_view(gdp_ctx_t ctx, const char *op, const char *name, const gdp_tensor *t, int64_t lo,
                              int64_t hi, const char **base, void **copy) {
    *copy = NULL;
    const size_t es = gdp_dtype_size(t->dtype);
    if (ctx->backend == GDP_BACKEND_CPU) {
        *base = (const char *)t->data + lo * (int64_t)es;
        return GDP_STATUS_SUCCESS;
    }
#ifdef GDP_HAVE_CUDA
    cudaStream_t stream = (cudaStream_t)ctx->stream;
    enum cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream, &capture) == cudaSuccess && capture != cudaStreamCaptureStatusNone)
        GDP_FAIL(GDP_STATUS_INVALID_USAGE,
                 "%s: debug checks copy %s to the host, which a CUDA graph capture cannot hold; turn them off "
                 "(gdp_ctx_set_debug_checks(ctx, 0), GDP_DEBUG_CHECKS unset) or run eagerly (gdp-run --no-graphs)",
                 op, name);
    const size_t bytes = (size_t)(hi - lo + 1) * es;
    void *h = gdp_calloc(bytes, 1, "a debug-check copy");
    if (h == NULL)
        return GDP_STATUS_SYSTEM_ERROR;
    cudaError_t e = cudaMemcpyAsync(h, (const char *)t->data + lo * (int64_t)es, bytes, cudaMemcpyDeviceToHost,
                                    stream);
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(stream);
    if (e != cudaSuccess) {
        free(h);
        GDP_CUDA_FAIL(e, "%s: debug checks: copying %s (%zu bytes) to the host failed", op, name, bytes);
    }
    *base = h;
    *copy = h;
    return GDP_STATUS_SUCCESS;
#else
    (void)hi;
    GDP_FAIL(GDP_STATUS_UNSUPPORTED, "%s: debug checks: this libgdp has no CUDA backend", op);
#endif
}

gdp_status_t gdp_debug_check_values(gdp_ctx_t ctx, const char *op, const char *name, const gdp_tensor *t,
                                    bool nonpositive) {
    if (!ctx->debug_checks || !gdp_tensor_present(t) || t->dtype == GDP_DTYPE_INT32)
        return GDP_STATUS_SUCCESS;
    int64_t lo, hi;
    if (!element_span(t, &lo, &hi))
        return GDP_STATUS_SUCCESS;
    const char *base = NULL;
    void *copy = NULL;
    GDP_CHECK(host_view(ctx, op, name, t, lo, hi, &base, &copy));
    const int64_t n = gdp_tensor_numel(t);
    int64_t bad = -1;
    double value = 0;
    for (int64_t i = 0; i < n && bad < 0; i++) {
        value = gdp_load_elem(base, t->dtype, gdp_tensor_offset(t, i) - lo);
        if (!isfinite(value) || (nonpositive && value > 0))
            bad = i;
    }
    free(copy);
    if (bad < 0)
        return GDP_STATUS_SUCCESS;
    char where[160];
    int used = snprintf(where, sizeof where, "[");
    for (int32_t d = 0; d < t->ndim && used < (int)sizeof where; d++) {
        int64_t inner = 1;
        for (int32_t e = d + 1; e < t->ndim; e++)
            inner *= t->shape[e];
        used += snprintf(where + used, sizeof where - (size_t)used, "%s%lld", d ? ", " : "",
                         (long long)(bad / inner % t->shape[d]));
    }
    if (used < (int)sizeof where)
        snprintf(where + used, sizeof where - (size_t)used, "]");
    GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
             "%s: debug checks: %s%s = %g %s; nothing was written (the op would put %s into its outputs and cache "
             "slots). Fix the producer of %s, or turn the checks off (docs/api.md, Debug checks)",
             op, name, where, value,
             isfinite(value) ? "is positive, but a log decay must be <= 0 (a positive g grows the state)"
                             : "is not finite",
             isfinite(value) ? "a growing state" : "NaN", name);
}
