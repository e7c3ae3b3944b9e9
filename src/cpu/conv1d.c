/*
 * conv1d.c: CPU reference of the causal depthwise conv1d ops (gdp-layer.md 1.2) with
 * double accumulation. Both ops run the same per-channel window: a token shifts the
 * window left by one and appends itself, and its output is act(bias + sum_j w_j win_j).
 * The update op starts from the slot's W columns; the varlen op likewise, which makes
 * token t's window the last W-1 state columns followed by the sequence, and leaves the
 * last W columns of (state ++ tokens) as the new state.
 */
#include <math.h>
#include <string.h>

#include "cpu/cpu_ops.h"

/* Largest width the front-ends accept: sizes the per-channel window arrays. */
#define CONV_WIDTH_CAP 8

/* One token through a channel's window; returns its output. */
static double conv_step(double *win, int64_t W, const double *wc, double bias, int silu, double x_in) {
    memmove(win, win + 1, (size_t)(W - 1) * sizeof(double));
    win[W - 1] = x_in;
    double acc = bias;
    for (int64_t j = 0; j < W; j++)
        acc += wc[j] * win[j];
    return silu ? acc / (1.0 + exp(-acc)) : acc;
}

/* Weights and bias of channel c as doubles. */
static void channel_params(const gdp_tensor *weight, const gdp_tensor *bias, int64_t c, int64_t W, double *wc,
                           double *bc) {
    gdp_tensor_read_f64(weight, c * W, W, wc);
    *bc = gdp_tensor_present(bias) ? gdp_tensor_get(bias, c) : 0.0;
}

gdp_status_t gdp_cpu_conv1d_update(const gdp_conv1d_update_args *a) {
    static const char *op = "gdp_causal_conv1d_update";
    const int64_t B = a->x.shape[0], S = a->x.shape[1], C = a->x.shape[2], W = a->weight.shape[1];
    const int64_t xs0 = gdp_tensor_stride(&a->x, 0), xs1 = gdp_tensor_stride(&a->x, 1);
    GDP_CHECK(gdp_cpu_check_slots(op, "conv_state_indices", &a->conv_state_indices, B, a->conv_state.shape[0]));
    gdp_tensor y = a->y, state = a->conv_state, inter = a->intermediate_conv_states;
    const bool snapshots = gdp_tensor_present(&inter);
    double win[CONV_WIDTH_CAP], wc[CONV_WIDTH_CAP], bc;

    for (int64_t b = 0; b < B; b++) {
        const int64_t slot = gdp_cpu_slot_of(&a->conv_state_indices, b);
        if (slot < 0) {
            /* Padding: y = 0, no slot read or written. */
            for (int64_t i = 0; i < S * C; i++)
                gdp_tensor_set(&y, b * S * C + i, 0.0);
            continue;
        }
        for (int64_t c = 0; c < C; c++) {
            channel_params(&a->weight, &a->bias, c, W, wc, &bc);
            gdp_cpu_load_run(&state, (slot * C + c) * W, W, win);
            for (int64_t s = 0; s < S; s++) {
                const double x_in = gdp_load_elem(a->x.data, a->x.dtype, b * xs0 + s * xs1 + c);
                gdp_tensor_set(&y, (b * S + s) * C + c, conv_step(win, W, wc, bc, a->silu, x_in));
                if (snapshots)
                    gdp_cpu_store_run(&inter, ((slot * S + s) * C + c) * W, W, win);
            }
            gdp_cpu_store_run(&state, (slot * C + c) * W, W, win);
        }
    }
    return GDP_STATUS_SUCCESS;
}

/* cu_seqlens (host) must start at 0, never decrease and end within the T rows of x. */
static gdp_status_t check_cu_seqlens(const char *op, const gdp_tensor *cu, int64_t N, int64_t T) {
    const int32_t *v = cu->data;
    if (v[0] != 0)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: cu_seqlens[0] is %d, must be 0", op, v[0]);
    for (int64_t i = 0; i < N; i++)
        if (v[i + 1] < v[i])
            GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                     "%s: cu_seqlens[%lld] = %d < cu_seqlens[%lld] = %d; cu_seqlens must be non-decreasing", op,
                     (long long)(i + 1), v[i + 1], (long long)i, v[i]);
    if (v[N] > T)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                 "%s: cu_seqlens[%lld] = %d exceeds the %lld rows of x; pass x (and y) with at least %d rows", op,
                 (long long)N, v[N], (long long)T, v[N]);
    return GDP_STATUS_SUCCESS;
}

gdp_status_t gdp_cpu_conv1d_varlen(const gdp_conv1d_varlen_args *a) {
    static const char *op = "gdp_causal_conv1d_varlen";
    const int64_t T = a->x.shape[0], C = a->x.shape[1], W = a->weight.shape[1];
    const int64_t N = a->cu_seqlens.shape[0] - 1;
    const int64_t xs0 = gdp_tensor_stride(&a->x, 0);
    GDP_CHECK(check_cu_seqlens(op, &a->cu_seqlens, N, T));
    GDP_CHECK(gdp_cpu_check_slots(op, "state_indices", &a->state_indices, N, a->conv_state.shape[0]));
    const int32_t *cu = a->cu_seqlens.data;
    gdp_tensor y = a->y, state = a->conv_state;
    double win[CONV_WIDTH_CAP], wc[CONV_WIDTH_CAP], bc;

    for (int64_t i = 0; i < N; i++) {
        const int64_t slot = gdp_cpu_slot_of(&a->state_indices, i);
        const int64_t start = cu[i], len = (int64_t)cu[i + 1] - cu[i];
        if (len == 0)
            continue; /* the state is kept as it is */
        for (int64_t c = 0; c < C; c++) {
            channel_params(&a->weight, &a->bias, c, W, wc, &bc);
            if (slot >= 0)
                gdp_cpu_load_run(&state, (slot * C + c) * W, W, win);
            else
                memset(win, 0, sizeof win); /* -1: a fresh request's zero window */
            for (int64_t p = 0; p < len; p++) {
                const double x_in = gdp_load_elem(a->x.data, a->x.dtype, (start + p) * xs0 + c);
                gdp_tensor_set(&y, (start + p) * C + c, conv_step(win, W, wc, bc, a->silu, x_in));
            }
            if (slot >= 0)
                gdp_cpu_store_run(&state, (slot * C + c) * W, W, win);
        }
    }
    /* Padding tokens past the last sequence. */
    for (int64_t r = (int64_t)cu[N] * C; r < T * C; r++)
        gdp_tensor_set(&y, r, 0.0);
    return GDP_STATUS_SUCCESS;
}
