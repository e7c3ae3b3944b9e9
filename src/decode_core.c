/*
 * decode_core.c: the layer's fused ops (decode_core.h): gdp_decode_conv_prepare (the decode
 * front), gdp_decode_recurrent_after_front (the decode op behind it), gdp_decode_recurrent_norm
 * (the decode end) and gdp_prefill_conv_prepare (the prefill front). Both ops' front-end checks
 * run first, so a refused call is refused exactly as the two ops would refuse it and modifies
 * nothing; then the fused CUDA launches (kernels/decode_core.cu, kernels/recurrent.cu,
 * kernels/conv1d.cu) when the step fits them, else the two ops in order.
 * gdp_norm_gemm (a norm and the projection that reads it) likewise, with kernels/gemv.cu, and
 * gdp_gemm_decode_front (in_proj, then the decode front on its output) with kernels/gemv_front.cu.
 */
#include "decode_core.h"
#include "backend.h"
#include "internal.h"
#include "phase.h"
#include "cpu/cpu_ops.h"

#ifdef GDP_HAVE_CUDA
#include "kernels/gdp_kernels.h"
#include "kernels/gemv.h"
#endif

/* Both fronts' pairing rule: two argument structs, and the prepare reading the conv's output
 * (conv_y: the conv's y, NULL when the conv struct is missing). */
static gdp_status_t front_pair_check(const char *op, const gdp_tensor *conv_y, const gdp_prepare_args *prep) {
    if (conv_y == NULL || prep == NULL)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: conv or prep is NULL; pass both argument structs", op);
    if (prep->x.data != conv_y->data || prep->x.dtype != conv_y->dtype)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: prep->x must be conv->y (the prepare reads the conv's output)", op);
    return GDP_STATUS_SUCCESS;
}

gdp_status_t gdp_decode_conv_prepare(gdp_ctx_t ctx, const gdp_conv1d_update_args *conv, const gdp_prepare_args *prep) {
    static const char *op = "gdp_decode_conv_prepare";
    GDP_CHECK(front_pair_check(op, conv != NULL ? &conv->y : NULL, prep));
    GDP_CHECK(gdp_conv1d_update_check(ctx, conv, "gdp_causal_conv1d_update"));
    /* with debug checks the prepare's value checks read conv->y, which the conv writes first: the two
     * ops in order, each with its own checks (as the prefill front) */
    if (ctx->debug_checks) {
        GDP_CHECK(gdp_causal_conv1d_update(ctx, conv));
        return gdp_decode_prepare(ctx, prep);
    }
    GDP_CHECK(gdp_prepare_check(ctx, prep, 1, "gdp_decode_prepare"));
#ifdef GDP_HAVE_CUDA
    if (ctx->backend == GDP_BACKEND_CUDA) {
        /* GDP_DECODE_FRONT, read at every call (a getenv, far below a launch) so that a test or
         * a benchmark can compare the two in one process */
        static const char *const spell[3] = {"auto", "fused", "chain"};
        static const int value[3] = {GDP_DECODE_FRONT_AUTO, GDP_DECODE_FRONT_FUSED, GDP_DECODE_FRONT_CHAIN};
        const char *text = NULL;
        const int mode = gdp_env_choice("GDP_DECODE_FRONT", spell, value, 3, GDP_DECODE_FRONT_AUTO, &text);
        if (mode < 0)
            GDP_FAIL(GDP_STATUS_INVALID_USAGE,
                     "%s: GDP_DECODE_FRONT=%s is not known; use auto (or leave it unset or empty), fused or chain", op,
                     text);
        if (gdp_cuda_decode_front_vec() < 0)
            GDP_FAIL(GDP_STATUS_INVALID_USAGE,
                     "%s: GDP_DECODE_FRONT_VEC=%s is not known; use 4 or 8 (or leave it unset, empty or auto)", op,
                     getenv("GDP_DECODE_FRONT_VEC"));
        if (gdp_cuda_decode_core_fits(conv, prep, (gdp_decode_front_mode)mode))
            return gdp_cuda_decode_core(ctx, conv, prep);
    }
#endif
    GDP_CHECK(gdp_causal_conv1d_update(ctx, conv));
    return gdp_decode_prepare(ctx, prep);
}

/* GDP_PREFILL_FRONT: 1 for auto or fused (and unset or empty), 0 for chain, -1 for anything else. */
static int prefill_front_choice(const char **text) {
    static const char *const spell[3] = {"auto", "fused", "chain"};
    static const int value[3] = {1, 1, 0};
    return gdp_env_choice("GDP_PREFILL_FRONT", spell, value, 3, 1, text);
}

bool gdp_prefill_conv_prepare_fuses(gdp_ctx_t ctx, const gdp_conv1d_varlen_args *conv, const gdp_prepare_args *prep) {
#ifdef GDP_HAVE_CUDA
    return ctx != NULL && ctx->backend == GDP_BACKEND_CUDA && !ctx->debug_checks && conv != NULL && prep != NULL &&
           prefill_front_choice(NULL) == 1 && gdp_cuda_prefill_front_fits(conv, prep);
#else
    (void)ctx, (void)conv, (void)prep;
    return false;
#endif
}

gdp_status_t gdp_prefill_conv_prepare(gdp_ctx_t ctx, const gdp_conv1d_varlen_args *conv, const gdp_prepare_args *prep) {
    static const char *op = "gdp_prefill_conv_prepare";
    GDP_CHECK(front_pair_check(op, conv != NULL ? &conv->y : NULL, prep));
    const char *text = NULL;
    if (prefill_front_choice(&text) < 0)
        GDP_FAIL(GDP_STATUS_INVALID_USAGE,
                 "%s: GDP_PREFILL_FRONT=%s is not known; use auto (or leave it unset or empty), fused or chain", op,
                 text);
    GDP_CHECK(gdp_conv1d_varlen_check(ctx, conv, "gdp_causal_conv1d_varlen"));
    /* with debug checks the prepare's value checks read conv->y, so it must exist: the two ops */
    if (!ctx->debug_checks)
        GDP_CHECK(gdp_prepare_check(ctx, prep, 0, "gdp_prefill_prepare"));
#ifdef GDP_HAVE_CUDA
    if (gdp_prefill_conv_prepare_fuses(ctx, conv, prep))
        return gdp_cuda_prefill_front(ctx, conv, prep);
#endif
    GDP_CHECK(gdp_causal_conv1d_varlen(ctx, conv));
    return gdp_prefill_prepare(ctx, prep);
}

gdp_status_t gdp_decode_recurrent_after_front(gdp_ctx_t ctx, const gdp_recurrent_args *rec) {
    GDP_CHECK(gdp_recurrent_check(ctx, rec));
#ifdef GDP_HAVE_CUDA
    if (ctx->backend == GDP_BACKEND_CUDA)
        return gdp_cuda_recurrent_after_front(ctx, rec);
#endif
    return gdp_cpu_recurrent_update(rec);
}

gdp_status_t gdp_decode_recurrent_norm(gdp_ctx_t ctx, const gdp_recurrent_args *rec, gdp_tensor *out,
                                       const gdp_tensor *y, const gdp_tensor *z, const gdp_tensor *weight,
                                       int64_t group_size, double eps) {
    return gdp_decode_recurrent_norm_ex(ctx, rec, out, y, z, weight, group_size, eps, NULL);
}

gdp_status_t gdp_decode_recurrent_norm_ex(gdp_ctx_t ctx, const gdp_recurrent_args *rec, gdp_tensor *out,
                                          const gdp_tensor *y, const gdp_tensor *z, const gdp_tensor *weight,
                                          int64_t group_size, double eps, bool *fused_out) {
    static const char *op = "gdp_decode_recurrent_norm";
    if (fused_out != NULL)
        *fused_out = false;
    if (rec == NULL || out == NULL || y == NULL || z == NULL || weight == NULL)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: rec, out, y, z and weight must not be NULL", op);
    GDP_CHECK(gdp_ctx_check(ctx, op));
    if (ctx->debug_checks) { /* the norm's value checks read y, which the decode op writes first */
        GDP_CHECK(gdp_fused_recurrent_gated_delta_rule_update(ctx, rec));
        return gdp_gated_rmsnorm(ctx, out, y, z, weight, group_size, eps);
    }
    GDP_CHECK(gdp_recurrent_check(ctx, rec));
    /* y must lie inside o (it is read after the decode op writes it); the norm's own rules
     * apply to the view as given */
    const size_t o_bytes = (size_t)gdp_tensor_numel(&rec->o) * gdp_dtype_size(rec->o.dtype);
    const char *o0 = (const char *)rec->o.data, *y0 = (const char *)y->data;
    if (y->dtype != rec->o.dtype || y0 < o0 || y0 >= o0 + o_bytes)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: y must be a view of rec->o (the norm reads the decode op's output)",
                 op);
    GDP_CHECK(gdp_gated_rmsnorm_check(ctx, out, y, z, weight, group_size, eps));
#ifdef GDP_HAVE_CUDA
    if (ctx->backend == GDP_BACKEND_CUDA) {
        bool fused = false;
        GDP_CHECK(gdp_cuda_recurrent_norm(ctx, rec, out, y, z, weight, group_size, eps, &fused));
        if (fused_out != NULL)
            *fused_out = fused;
        if (fused)
            return GDP_STATUS_SUCCESS;
    }
#endif
    GDP_CHECK(gdp_fused_recurrent_gated_delta_rule_update(ctx, rec));
    return gdp_gated_rmsnorm(ctx, out, y, z, weight, group_size, eps);
}

/* ---- the norm-GEMMs ---- */

enum { NORM_GEMM_CHAIN = 0, NORM_GEMM_AUTO, NORM_GEMM_SERIAL, NORM_GEMM_PDL };

/* Where auto takes the one launch: the gated norm with out_proj at up to 2 rows, measured faster
 * than the norm op and cuBLASLt there (H100, graph-replayed, L2 flushed: 12.6 against 14.7 us at
 * one row, 13.8 against 14.8 at two) and slower from 4 rows; the pre-RMSNorm with in_proj was
 * slower at every row count in every form tried (kernels/NOTES-ops.md, thirty-second session). */
#define NORM_GEMM_AUTO_ROWS 2

/* GDP_NORM_GEMM: NORM_GEMM_* (unset or empty: auto), -1 for anything else. */
static int norm_gemm_choice(const char **text) {
    static const char *const spell[4] = {"auto", "serial", "pdl", "chain"};
    static const int value[4] = {NORM_GEMM_AUTO, NORM_GEMM_SERIAL, NORM_GEMM_PDL, NORM_GEMM_CHAIN};
    return gdp_env_choice("GDP_NORM_GEMM", spell, value, 4, NORM_GEMM_AUTO, text);
}

#ifdef GDP_HAVE_CUDA
/* The kernel's arguments for a (checked) call: [rows, k] the norm output's shape. */
static gdp_norm_gemv_args norm_gemv_args(const gdp_norm_gemm_args *a) {
    const bool gated = a->z != NULL;
    const int64_t k = a->out->shape[a->out->ndim - 1], rows = k > 0 ? gdp_tensor_numel(a->out) / k : 0;
    /* a 2-D row view (the gated norm allows one for y and z) or contiguous rows */
    const int64_t x_row = a->x->ndim == 2 ? gdp_tensor_stride(a->x, 0) : k;
    return (gdp_norm_gemv_args){
        .kind = gated ? GDP_NORM_GEMV_GATED : GDP_NORM_GEMV_RMS,
        .rows = rows, .k = k, .group = gated ? a->group_size : k,
        .x = a->x->data, .x_dtype = a->x->dtype, .x_row = x_row,
        .z = gated ? a->z->data : NULL, .z_dtype = gated ? a->z->dtype : GDP_DTYPE_FP32,
        .z_row = gated ? (a->z->ndim == 2 ? gdp_tensor_stride(a->z, 0) : k) : 0,
        .norm_weight = a->weight->data, .w_dtype = a->weight->dtype, .eps = a->eps,
        .n = a->n, .B = a->B, .ab_dtype = a->out->dtype,
        .beta = a->beta, .C = a->C, .ldc = a->ldc, .c_dtype = a->c_dtype,
    };
}
#endif

/* How a checked call runs: NORM_GEMM_SERIAL or _PDL (the one launch), or _CHAIN. */
static int norm_gemm_mode(gdp_ctx_t ctx, const gdp_norm_gemm_args *a) {
    const int mode = norm_gemm_choice(NULL);
#ifdef GDP_HAVE_CUDA
    if (mode != NORM_GEMM_CHAIN && ctx->backend == GDP_BACKEND_CUDA && !ctx->debug_checks && a->ldc >= a->n) {
        const gdp_norm_gemv_args g = norm_gemv_args(a);
        if (gdp_cuda_norm_gemv_fits(&g) &&
            (mode != NORM_GEMM_AUTO || (g.kind == GDP_NORM_GEMV_GATED && g.rows <= NORM_GEMM_AUTO_ROWS)))
            return mode == NORM_GEMM_PDL ? NORM_GEMM_PDL : NORM_GEMM_SERIAL;
    }
#else
    (void)ctx, (void)a, (void)mode;
#endif
    return NORM_GEMM_CHAIN;
}

/* Both ops' rules, without running either. */
static gdp_status_t norm_gemm_check(gdp_ctx_t ctx, const gdp_norm_gemm_args *a) {
    static const char *op = "gdp_norm_gemm";
    if (a == NULL || a->out == NULL || a->x == NULL || a->weight == NULL)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: the arguments, out, x and weight must not be NULL", op);
    const char *text = NULL;
    if (norm_gemm_choice(&text) < 0)
        GDP_FAIL(GDP_STATUS_INVALID_USAGE,
                 "%s: GDP_NORM_GEMM=%s is not known; use auto (or leave it unset or empty), serial, pdl or chain",
                 op, text);
    if (a->z != NULL)
        GDP_CHECK(gdp_gated_rmsnorm_check(ctx, a->out, a->x, a->z, a->weight, a->group_size, a->eps));
    else
        GDP_CHECK(gdp_rmsnorm_check(ctx, a->out, a->x, a->weight, a->eps));
    const char *why = NULL;
    if (!gdp_gemm_supported_ex(ctx, a->out->dtype, a->c_dtype, &why))
        GDP_FAIL(GDP_STATUS_UNSUPPORTED, "gdp_gemm_nt: %s", why);
    return GDP_STATUS_SUCCESS;
}

bool gdp_norm_gemm_fuses(gdp_ctx_t ctx, const gdp_norm_gemm_args *a) {
    /* with debug checks the norm's value checks would read x now (the layer asks before the
     * decode op writes y), and the chain runs anyway */
    return gdp_ctx_check(ctx, "gdp_norm_gemm") == GDP_STATUS_SUCCESS && !ctx->debug_checks &&
           norm_gemm_check(ctx, a) == GDP_STATUS_SUCCESS && norm_gemm_mode(ctx, a) != NORM_GEMM_CHAIN;
}

gdp_status_t gdp_norm_gemm(gdp_ctx_t ctx, const gdp_norm_gemm_args *a) {
    GDP_CHECK(gdp_ctx_check(ctx, "gdp_norm_gemm"));
    GDP_CHECK(norm_gemm_check(ctx, a));
    const int mode = norm_gemm_mode(ctx, a);
#ifdef GDP_HAVE_CUDA
    if (mode != NORM_GEMM_CHAIN) {
        const gdp_norm_gemv_args g = norm_gemv_args(a);
        gdp_phase_mark(ctx, GDP_MARK_GEMM); /* measured phases (phase.h): a GEMM with its input's norm */
        const gdp_status_t st = gdp_cuda_norm_gemv(ctx, &g, mode == NORM_GEMM_PDL);
        gdp_phase_mark(ctx, GDP_MARK_OPS);
        return st;
    }
#else
    (void)mode;
#endif
    if (a->z != NULL)
        GDP_CHECK(gdp_gated_rmsnorm(ctx, a->out, a->x, a->z, a->weight, a->group_size, a->eps));
    else
        GDP_CHECK(gdp_rmsnorm(ctx, a->out, a->x, a->weight, a->eps));
    const int64_t k = a->out->shape[a->out->ndim - 1], rows = k > 0 ? gdp_tensor_numel(a->out) / k : 0;
    return gdp_gemm_nt_ex(ctx, rows, a->n, k, a->out->data, k, a->B, a->out->dtype, a->beta, a->C, a->ldc,
                          a->c_dtype);
}

/* ---- in_proj with the decode front ---- */

enum { GEMM_FRONT_CHAIN = 0, GEMM_FRONT_AUTO, GEMM_FRONT_FUSED };

/* GDP_GEMM_FRONT: GEMM_FRONT_* (unset or empty: auto), -1 for anything else. */
static int gemm_front_choice(const char **text) {
    static const char *const spell[3] = {"auto", "fused", "chain"};
    static const int value[3] = {GEMM_FRONT_AUTO, GEMM_FRONT_FUSED, GEMM_FRONT_CHAIN};
    return gdp_env_choice("GDP_GEMM_FRONT", spell, value, 3, GEMM_FRONT_AUTO, text);
}

/* The call's own rules: the arguments, GDP_GEMM_FRONT, the front's pairing. */
static gdp_status_t gemm_front_check_call(const gdp_gemm_front_args *a) {
    static const char *op = "gdp_gemm_decode_front";
    if (a == NULL)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: the arguments must not be NULL", op);
    const char *text = NULL;
    if (gemm_front_choice(&text) < 0)
        GDP_FAIL(GDP_STATUS_INVALID_USAGE,
                 "%s: GDP_GEMM_FRONT=%s is not known; use auto (or leave it unset or empty), fused or chain", op,
                 text);
    return front_pair_check(op, a->conv != NULL ? &a->conv->y : NULL, a->prep);
}

/* Both ops' rules, without running either (no debug checks: their value checks would read C). */
static gdp_status_t gemm_front_check(gdp_ctx_t ctx, const gdp_gemm_front_args *a) {
    GDP_CHECK(gemm_front_check_call(a));
    GDP_CHECK(gdp_conv1d_update_check(ctx, a->conv, "gdp_causal_conv1d_update"));
    GDP_CHECK(gdp_prepare_check(ctx, a->prep, 1, "gdp_decode_prepare"));
    const char *why = NULL;
    if (!gdp_gemm_supported_ex(ctx, a->ab_dtype, a->ab_dtype, &why))
        GDP_FAIL(GDP_STATUS_UNSUPPORTED, "gdp_gemm_nt: %s", why);
    return GDP_STATUS_SUCCESS;
}

#ifdef GDP_HAVE_CUDA
static gdp_gemv_front_args gemv_front_args(const gdp_gemm_front_args *a) {
    return (gdp_gemv_front_args){.rows = a->rows, .n = a->n, .k = a->k, .A = a->A, .lda = a->lda, .B = a->B,
                                 .ab_dtype = a->ab_dtype, .C = a->C, .ldc = a->ldc, .conv = a->conv,
                                 .prep = a->prep};
}
#endif

/* Whether a checked call takes the one launch. */
static bool gemm_front_one_launch(gdp_ctx_t ctx, const gdp_gemm_front_args *a) {
#ifdef GDP_HAVE_CUDA
    if (gemm_front_choice(NULL) == GEMM_FRONT_FUSED && ctx->backend == GDP_BACKEND_CUDA) {
        const gdp_gemv_front_args g = gemv_front_args(a);
        return gdp_cuda_gemv_front_fits(&g) != 0;
    }
#else
    (void)ctx, (void)a;
#endif
    return false;
}

bool gdp_gemm_decode_front_fuses(gdp_ctx_t ctx, const gdp_gemm_front_args *a) {
    /* the switch first: the layer asks every decode step, and auto never fuses */
    return gemm_front_choice(NULL) == GEMM_FRONT_FUSED && gdp_ctx_check(ctx, "gdp_gemm_decode_front") == GDP_STATUS_SUCCESS &&
           !ctx->debug_checks && gemm_front_check(ctx, a) == GDP_STATUS_SUCCESS && gemm_front_one_launch(ctx, a);
}

gdp_status_t gdp_gemm_decode_front(gdp_ctx_t ctx, const gdp_gemm_front_args *a) {
    GDP_CHECK(gdp_ctx_check(ctx, "gdp_gemm_decode_front"));
    /* with debug checks, the two ops in order, each with its own checks: the front's read C once the GEMM wrote it */
    GDP_CHECK(ctx->debug_checks ? gemm_front_check_call(a) : gemm_front_check(ctx, a));
#ifdef GDP_HAVE_CUDA
    if (!ctx->debug_checks && gemm_front_one_launch(ctx, a)) {
        const gdp_gemv_front_args g = gemv_front_args(a);
        gdp_phase_mark(ctx, GDP_MARK_GEMM); /* measured phases (phase.h): a GEMM with the front after it */
        const gdp_status_t st = gdp_cuda_gemv_front(ctx, &g);
        gdp_phase_mark(ctx, GDP_MARK_OPS);
        return st;
    }
#endif
    GDP_CHECK(gdp_gemm_nt_ex(ctx, a->rows, a->n, a->k, a->A, a->lda, a->B, a->ab_dtype, 0.0f, a->C, a->ldc,
                             a->ab_dtype));
    return gdp_decode_conv_prepare(ctx, a->conv, a->prep);
}
