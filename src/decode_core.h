/*
 * decode_core.h: the layer's fused ops (src/decode_core.c): the decode front (the conv update
 * and the decode prepare of one step's decode rows as one op), the decode end (the decode op and
 * the grouped gated RMSNorm of its outputs as one op), the prefill front (the varlen conv and
 * the prefill prepare as one op), the norm-GEMMs (a norm and the projection that reads it) and
 * in_proj with the decode front.
 */
#ifndef GDP_DECODE_CORE_H
#define GDP_DECODE_CORE_H

#include <stdbool.h>

#include "gdp/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The front-end checks of the two ops it fuses (src/ops_conv1d.c, src/ops_prepare.c): every
 * rule the op itself applies, without running it. */
gdp_status_t gdp_conv1d_update_check(gdp_ctx_t ctx, const gdp_conv1d_update_args *args, const char *op);
gdp_status_t gdp_conv1d_varlen_check(gdp_ctx_t ctx, const gdp_conv1d_varlen_args *args, const char *op);
gdp_status_t gdp_prepare_check(gdp_ctx_t ctx, const gdp_prepare_args *args, int decode, const char *op);
/* The same for the decode op (src/ops_recurrent.c) and the gated norm (src/ops_norm.c). */
gdp_status_t gdp_recurrent_check(gdp_ctx_t ctx, const gdp_recurrent_args *args);
gdp_status_t gdp_rmsnorm_check(gdp_ctx_t ctx, const gdp_tensor *out, const gdp_tensor *x, const gdp_tensor *weight,
                               double eps);
gdp_status_t gdp_gated_rmsnorm_check(gdp_ctx_t ctx, const gdp_tensor *out, const gdp_tensor *y, const gdp_tensor *z,
                                     const gdp_tensor *weight, int64_t group_size, double eps);

/* gdp_causal_conv1d_update(conv) then gdp_decode_prepare(prep), where prep->x is conv->y:
 * the same outputs (query, key, value, beta, g and the conv state) bit for bit. On CUDA,
 * with one token per request, no conv snapshots, width 4, 16-byte runs and at most 64
 * requests (measured: faster there, slower at 256; kernels/decode_core.cu), one launch
 * that never writes conv->y (its contents are then unspecified); otherwise, and with debug checks
 * on (the prepare's value checks read conv->y), the two ops. */
gdp_status_t gdp_decode_conv_prepare(gdp_ctx_t ctx, const gdp_conv1d_update_args *conv, const gdp_prepare_args *prep);

/* gdp_causal_conv1d_varlen(conv) then gdp_prefill_prepare(prep), where prep->x is conv->y
 * viewed as [1, T, C]: the same outputs (query, key, value, beta, g and the conv state) bit for
 * bit. On CUDA, when the conv's row kernel takes the call (x and y of one 16-bit dtype, width <=
 * 4, aligned rows; kernels/conv1d.cu) and value, key and query are contiguous in y's dtype, the
 * conv writes its outputs straight into value, key and query (GQA-expanded) and never writes
 * conv->y (its contents are then unspecified), and one launch more computes beta and g; otherwise,
 * and with debug checks on, the two ops. GDP_PREFILL_FRONT=auto|fused|chain, read at every call:
 * chain forces the two ops (the A/B), auto and fused (and unset or empty) take the one pass
 * where it fits; any other value is GDP_STATUS_INVALID_USAGE before anything runs. Both ops'
 * checks run first, so a refused call writes nothing (with debug checks on, the prepare's run
 * after the conv: its value checks read conv->y). */
gdp_status_t gdp_prefill_conv_prepare(gdp_ctx_t ctx, const gdp_conv1d_varlen_args *conv, const gdp_prepare_args *prep);
/* Whether gdp_prefill_conv_prepare(ctx, conv, prep) would take the one pass (the tests assert it
 * where they expect it). */
bool gdp_prefill_conv_prepare_fuses(gdp_ctx_t ctx, const gdp_conv1d_varlen_args *conv, const gdp_prepare_args *prep);

/* gdp_fused_recurrent_gated_delta_rule_update(rec), called by the layer's decode block right after
 * its decode front (gdp_decode_conv_prepare, or the chain or in_proj epilogue that stands for it),
 * which writes rec's q, k, v, g and beta and never its state: on CUDA, where every item of the
 * row or tensor-core kernel has a block of its own, it launches as a programmatic dependent of the
 * kernel ahead, takes its SMs while that finishes and loads the states before it waits for its
 * outputs (the same bits as the plain op; GDP_DECODE_PDL=off launches it plainly). A caller whose
 * kernel ahead may write the state must call the plain op. */
gdp_status_t gdp_decode_recurrent_after_front(gdp_ctx_t ctx, const gdp_recurrent_args *rec);

/* gdp_fused_recurrent_gated_delta_rule_update(rec) then gdp_gated_rmsnorm(out, y, z, weight,
 * group_size, eps), where y is a row view [B, H*V] of rec->o's last Householder copy of each
 * request's token: the same outputs (o, the states, out) bit for bit. On CUDA, with one token
 * per request, 16-byte state columns and a norm group of whole heads of at most 512
 * elements on the norm's fast path, it can run as one launch (the shared-memory decode
 * kernel; the last block of each (request, group) normalizes it); by default it does not
 * (measured slower than the two ops at every batch from 8 to 256 in the layer step) and runs
 * the two ops. GDP_DECODE_END, read at every call, overrides that: fused (one launch
 * wherever it fits), split (always the two ops), auto (unset or empty: the default); any other
 * value is GDP_STATUS_INVALID_USAGE (kernels/recurrent.cu). Both ops' checks run first, so a
 * refused call writes nothing. */
gdp_status_t gdp_decode_recurrent_norm(gdp_ctx_t ctx, const gdp_recurrent_args *rec, gdp_tensor *out,
                                       const gdp_tensor *y, const gdp_tensor *z, const gdp_tensor *weight,
                                       int64_t group_size, double eps);
/* The same; *fused (may be NULL) says whether the one launch ran (the tests assert it). */
gdp_status_t gdp_decode_recurrent_norm_ex(gdp_ctx_t ctx, const gdp_recurrent_args *rec, gdp_tensor *out,
                                          const gdp_tensor *y, const gdp_tensor *z, const gdp_tensor *weight,
                                          int64_t group_size, double eps, bool *fused);

/* A norm and the projection that reads it: out = norm(x), then C = out B^T + beta C over out's
 * [rows, k] (gdp_gemm_nt_ex with A = out, lda = k, B [n, k] in out's dtype). z == NULL: the
 * pre-RMSNorm (gdp_rmsnorm(out, x, weight, eps)); otherwise the grouped gated RMSNorm
 * (gdp_gated_rmsnorm(out, x, z, weight, group_size, eps): x is y). */
typedef struct gdp_norm_gemm_args {
    gdp_tensor *out; /* the norm's output; unspecified after the one launch (below) */
    const gdp_tensor *x, *z, *weight;
    int64_t group_size;
    double eps;
    int64_t n;
    const void *B;
    float beta;
    void *C;
    int64_t ldc;
    gdp_dtype_t c_dtype;
} gdp_norm_gemm_args;

/* The norm op then the GEMM: the same C. On CUDA, where the norm-GEMV takes the call
 * (kernels/gemv.h: at most GDP_GEMV_MAX_ROWS rows, bf16), one launch that never writes out and
 * whose products are gdp_cuda_gemv_nt's (not cuBLASLt's). GDP_NORM_GEMM, read at every call:
 * auto (unset or empty) takes the one launch for the gated norm at up to 2 rows (where it was
 * measured faster; the pre-RMSNorm's one launch was measured slower), serial wherever it fits, pdl likewise as a programmatic dependent of the work ahead (its
 * weight's first columns loaded before it waits), chain the two ops; any other value is
 * GDP_STATUS_INVALID_USAGE before anything runs. Both ops' checks run first, so a refused
 * call writes nothing. */
gdp_status_t gdp_norm_gemm(gdp_ctx_t ctx, const gdp_norm_gemm_args *a);
/* Whether gdp_norm_gemm(ctx, a) would take the one launch (the layer then leaves the gated norm
 * out of its decode end; the tests assert it where they expect it). */
bool gdp_norm_gemm_fuses(gdp_ctx_t ctx, const gdp_norm_gemm_args *a);

/* in_proj then the decode front: C = A B^T (gdp_gemm_nt_ex, beta 0, C in A's dtype), then
 * gdp_decode_conv_prepare(conv, prep), where conv->x and prep->ba are columns of C (the layer's
 * conv and ba sections of in_proj's output). On CUDA, where the GEMV with the front as its epilogue
 * takes the call (kernels/gemv.h gdp_cuda_gemv_front_fits: at most GDP_GEMV_MAX_ROWS rows, one
 * token a request, width 4, every tensor of the front in C's 16-bit dtype), one launch: the skinny
 * kernel's product (not cuBLASLt's) and then the front, bit for bit, with conv->y left unwritten.
 * GDP_GEMM_FRONT, read at every call: fused takes the one launch wherever it fits, chain the two
 * ops, auto (unset or empty) the two ops (the one launch measured no faster in the layer step than
 * the skinny GEMM and the front, both slower than cuBLASLt and the front: kernels/NOTES-ops.md,
 * thirty-fourth session); any other value is GDP_STATUS_INVALID_USAGE before
 * anything runs. Both ops' checks run first, so a refused call writes nothing (with debug checks
 * on, the two ops run in order, each with its own checks: the front's read C after the GEMM). */
typedef struct gdp_gemm_front_args {
    int64_t rows, n, k;
    const void *A; /* [rows, k], lda elements apart */
    int64_t lda;
    const void *B; /* [n, k] */
    gdp_dtype_t ab_dtype;
    void *C; /* [rows, n], ldc elements apart, in ab_dtype */
    int64_t ldc;
    const gdp_conv1d_update_args *conv;
    const gdp_prepare_args *prep;
} gdp_gemm_front_args;

gdp_status_t gdp_gemm_decode_front(gdp_ctx_t ctx, const gdp_gemm_front_args *a);
/* Whether gdp_gemm_decode_front(ctx, a) would take the one launch (the layer then leaves the front
 * out of its decode block; the tests assert it where they expect it). */
bool gdp_gemm_decode_front_fuses(gdp_ctx_t ctx, const gdp_gemm_front_args *a);

#ifdef __cplusplus
}
#endif

#endif /* GDP_DECODE_CORE_H */
