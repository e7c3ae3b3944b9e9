/*
 * prepare.c: CPU reference of gdp_decode_prepare / gdp_prefill_prepare (gdp-math.md 6).
 * q, k and v are byte copies of x (bitwise equal by construction); beta and g are
 * computed in float with the exact operation order of the eager PyTorch path
 * (gdp-math.md 6.5), so they differ from the CUDA results only by libm ulps.
 */
#include <math.h>
#include <string.h>

#include "cpu/cpu_ops.h"

/* torch.nn.functional.softplus at beta 1, threshold 20, in float: log1p keeps the
 * far-negative tail, where 1 + exp(x) would round to 1. */
static float softplus_f32(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

static float sigmoid_f32(float b) { return 1.0f / (1.0f + expf(-b)); }

/* Loads element `off` of a float tensor as float (exact for fp32, bf16 and fp16). */
static float load_f32(const gdp_tensor *t, int64_t off) { return (float)gdp_load_elem(t->data, t->dtype, off); }

gdp_status_t gdp_cpu_prepare(const gdp_prepare_args *a, int decode) {
    const int64_t M = a->num_householder, H = a->num_heads, G = a->num_groups, P = a->head_dim,
                  N = a->state_dim;
    const int64_t n = a->x.shape[0], T = a->x.shape[1];
    const int64_t heads_per_group = H / G;
    const int64_t k_base = M * H * P, q_base = M * H * P + M * G * N;
    const size_t es = gdp_dtype_size(a->x.dtype); /* q, k, v share x's dtype */
    const int64_t xs0 = gdp_tensor_stride(&a->x, 0), xs1 = gdp_tensor_stride(&a->x, 1);
    const int64_t bs0 = gdp_tensor_stride(&a->ba, 0), bs1 = gdp_tensor_stride(&a->ba, 1);
    const char *x = a->x.data;
    char *qo = a->query.data, *ko = a->key.data, *vo = a->value.data;
    float *go = a->g.data;
    gdp_tensor beta = a->beta; /* a writable copy of the view (args are const) */

    for (int64_t i = 0; i < n; i++) {
        for (int64_t t = 0; t < T; t++) {
            const char *xrow = x + (size_t)(i * xs0 + t * xs1) * es;
            const int64_t ba_row = i * bs0 + t * bs1;
            for (int64_t m = 0; m < M; m++) {
                const int64_t r = (i * T + t) * M + m; /* row of the expanded stream */
                for (int64_t h = 0; h < H; h++) {
                    const int64_t grp = h / heads_per_group;
                    memcpy(vo + (size_t)((r * H + h) * P) * es, xrow + (size_t)((m * H + h) * P) * es,
                           (size_t)P * es);
                    memcpy(ko + (size_t)((r * H + h) * N) * es, xrow + (size_t)(k_base + (m * G + grp) * N) * es,
                           (size_t)N * es);
                    const float b = load_f32(&a->ba, ba_row + m * H + h);
                    gdp_tensor_set(&beta, r * H + h, (double)sigmoid_f32(b));
                }
            }
            /* Query and decay: once per token in prefill; on copies M-1 and 0 in decode. */
            const int64_t q_row = decode ? (i * T + t) * M + (M - 1) : i * T + t;
            const int64_t g_row = decode ? (i * T + t) * M : i * T + t;
            if (decode) {
                for (int64_t m = 0; m < M; m++) {
                    const int64_t r = (i * T + t) * M + m;
                    if (r != q_row)
                        memset(qo + (size_t)(r * H * N) * es, 0, (size_t)(H * N) * es);
                    if (r != g_row)
                        memset(go + r * H, 0, (size_t)H * sizeof(float));
                }
            }
            for (int64_t h = 0; h < H; h++) {
                const int64_t grp = h / heads_per_group;
                memcpy(qo + (size_t)((q_row * H + h) * N) * es, xrow + (size_t)(q_base + grp * N) * es,
                       (size_t)N * es);
                /* x = fp32(a) + fp32(dt_bias) in float, then (-exp(A_log)) * softplus(x). */
                const float sum = load_f32(&a->ba, ba_row + M * H + h) + (float)gdp_tensor_get(&a->dt_bias, h);
                const float decay = -expf((float)gdp_tensor_get(&a->A_log, h));
                go[g_row * H + h] = decay * softplus_f32(sum);
            }
        }
    }
    return GDP_STATUS_SUCCESS;
}
