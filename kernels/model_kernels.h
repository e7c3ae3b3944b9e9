/*
 * model_kernels.h: the model's own device primitives around the layer stack (kernels/
 * model_kernels.cu on CUDA; src/model.c has the CPU loops): the embedding gather of a
 * step's tokens, and the LM head's input rows (gather by row index, final RMSNorm, and the
 * conversion to the head GEMM's bf16 operand). Both read their index arrays from device
 * memory, so a captured CUDA graph replays them with each step's new indices.
 *
 * Indices are not trusted: a token outside [0, vocab) or a row outside [0, x_rows) gives
 * a row of zeros (the host validated them; the device must never read out of bounds).
 */
#ifndef GDP_MODEL_KERNELS_H
#define GDP_MODEL_KERNELS_H

#include <stdint.h>

#include "gdp/gdp.h"
#include "gdp/sampling.h"

#ifdef __cplusplus
extern "C" {
#endif

struct gdp_ctx;

/* x[i, :] = embedding[t, :] (fp32 [vocab, D]) for i < n, t = tokens[i], or for a reference
 * (tokens[i] <= -2) t = prev[-2 - tokens[i]].token, the previous step's draw read on the
 * device; zeros for a bad token, a padding row (-1) and a reference outside [0, n_prev). */
typedef struct gdp_embed_gather_args {
    float                *x;          /* [n, D]                                  */
    const float          *embedding;  /* [vocab, D]                              */
    const int32_t        *tokens;     /* [n] device memory                       */
    int64_t               n, D, vocab;
    const gdp_sample_out *prev;       /* [n_prev] device memory, NULL: none      */
    int64_t               n_prev;
} gdp_embed_gather_args;
gdp_status_t gdp_cuda_embed_gather(struct gdp_ctx *ctx, const gdp_embed_gather_args *args);

/* out[i, :] = rmsnorm(x[rows[i], :]) * weight, in bf16, for i < n (zeros for a bad row);
 * the norm in fp32: x / sqrt(mean(x^2) + eps). */
typedef struct gdp_head_rows_args {
    uint16_t      *out;        /* [n, D] bf16                */
    const float   *x;          /* [x_rows, D] fp32           */
    const int32_t *rows;       /* [n] device memory          */
    const float   *weight;     /* [D] fp32                   */
    int64_t        n, D, x_rows;
    float          eps;
} gdp_head_rows_args;
gdp_status_t gdp_cuda_head_rows(struct gdp_ctx *ctx, const gdp_head_rows_args *args);

/* dst[i, :] = bf16(src[i, :]) for an fp32 [n, D] matrix (the head's bf16 weight copy). */
gdp_status_t gdp_cuda_f32_to_bf16(struct gdp_ctx *ctx, uint16_t *dst, const float *src, int64_t count);

#ifdef __cplusplus
}
#endif

#endif /* GDP_MODEL_KERNELS_H */
