/*
 * recurrent.c: CPU reference of gdp_fused_recurrent_gated_delta_rule_update (gdp-math.md
 * 5.1-5.3) in double, and gdp_cpu_check_slots, the host-side slot check the decode and
 * conv ops share. One (request, head) at a time: load its state (cache slot, dense
 * initial state or zeros), walk the T steps, write snapshots every steps_per_token steps,
 * then store the final state.
 */
#include <math.h>
#include <string.h>

#include "cpu/cpu_ops.h"

gdp_status_t gdp_cpu_check_slots(const char *op, const char *name, const gdp_tensor *indices, int64_t rows,
                                 int64_t slots) {
    if (!gdp_tensor_present(indices))
        return GDP_STATUS_SUCCESS; /* identity; rows <= slots was checked by the front-end */
    /* owner[s] = 1 + the first row naming slot s, 0 when none does yet. */
    int64_t *owner = gdp_calloc((size_t)slots, sizeof *owner, "the slot-ownership table of a slot check");
    if (owner == NULL)
        return GDP_STATUS_SYSTEM_ERROR;
    gdp_status_t st = GDP_STATUS_SUCCESS;
    for (int64_t b = 0; b < rows; b++) {
        const int64_t s = gdp_cpu_slot_of(indices, b);
        if (s == -1)
            continue;
        if (s < -1 || s >= slots) {
            st = GDP_ERROR(GDP_STATUS_INVALID_ARGUMENT,
                           "%s: %s[%lld] = %lld is out of range for a cache of %lld slots; use a slot in [0, %lld) "
                           "or -1 for padding",
                           op, name, (long long)b, (long long)s, (long long)slots, (long long)slots);
            break;
        }
        if (owner[s] != 0) {
            st = GDP_ERROR(GDP_STATUS_INVALID_ARGUMENT,
                           "%s: %s[%lld] and %s[%lld] both name slot %lld; each slot may be updated by one request "
                           "per call",
                           op, name, (long long)(owner[s] - 1), name, (long long)b, (long long)s);
            break;
        }
        owner[s] = b + 1;
    }
    free(owner);
    return st;
}

/* Element offset of state[slot, h, 0, 0]; the K*V block after it is contiguous. */
static int64_t state_block(const gdp_tensor *state, int64_t slot, int64_t h) {
    return slot * gdp_tensor_stride(state, 0) + h * gdp_tensor_stride(state, 1);
}

/* x /= sqrt(|x|^2 + eps): the in-kernel L2 norm, eps inside the root. */
static void l2_normalize(double *x, int64_t n) {
    double ss = 0;
    for (int64_t i = 0; i < n; i++)
        ss += x[i] * x[i];
    const double inv = 1.0 / sqrt(ss + GDP_L2NORM_EPS);
    for (int64_t i = 0; i < n; i++)
        x[i] *= inv;
}

/* Rounds n values to `dtype` and back (round to nearest even), in place. */
static void round_to_dtype(gdp_dtype_t dtype, double *x, int64_t n) {
    float buf;
    for (int64_t i = 0; i < n; i++) {
        gdp_store_elem(&buf, dtype, 0, x[i]);
        x[i] = gdp_load_elem(&buf, dtype, 0);
    }
}

gdp_status_t gdp_cpu_recurrent_update(const gdp_recurrent_args *a) {
    static const char *op = "gdp_fused_recurrent_gated_delta_rule_update";
    const int64_t B = a->q.shape[0], T = a->q.shape[1], H = a->q.shape[2], K = a->q.shape[3];
    const int64_t V = a->v.shape[3], KV = K * V;
    const int64_t M = a->steps_per_token, S = T / M;
    const bool cache = gdp_tensor_present(&a->state);
    const bool snapshots = cache && gdp_tensor_present(&a->intermediate_states);
    const double scale = a->scale != 0 ? a->scale : 1.0 / sqrt((double)K);
    if (cache)
        GDP_CHECK(gdp_cpu_check_slots(op, "state_indices", &a->state_indices, B, a->state.shape[0]));

    double *st = gdp_calloc((size_t)KV + 2 * (size_t)K + 2 * (size_t)V, sizeof(double), "the decode state");
    if (st == NULL)
        return GDP_STATUS_SYSTEM_ERROR;
    double *q = st + KV, *k = q + K, *v = k + K, *delta = v + V;
    gdp_tensor o = a->o, state = a->state, inter = a->intermediate_states, final_state = a->final_state;

    for (int64_t b = 0; b < B; b++) {
        const int64_t slot = cache ? gdp_cpu_slot_of(&a->state_indices, b) : b;
        if (cache && slot < 0) {
            /* Padding: output 0, no slot read or written. */
            for (int64_t i = 0; i < T * H * V; i++)
                gdp_tensor_set(&o, b * T * H * V + i, 0.0);
            continue;
        }
        for (int64_t h = 0; h < H; h++) {
            if (cache)
                gdp_cpu_load_run(&state, state_block(&state, slot, h), KV, st);
            else if (gdp_tensor_present(&a->initial_state))
                gdp_tensor_read_f64(&a->initial_state, (b * H + h) * KV, KV, st);
            else
                memset(st, 0, (size_t)KV * sizeof(double));

            for (int64_t t = 0; t < T; t++) {
                const int64_t row = (b * T + t) * H + h; /* index of (b, t, h) */
                gdp_tensor_read_f64(&a->q, row * K, K, q);
                gdp_tensor_read_f64(&a->k, row * K, K, k);
                gdp_tensor_read_f64(&a->v, row * V, V, v);
                if (a->use_qk_l2norm_in_kernel) {
                    l2_normalize(q, K);
                    l2_normalize(k, K);
                }
                for (int64_t i = 0; i < K; i++)
                    q[i] *= scale;
                if (gdp_tensor_present(&a->g)) {
                    const double decay = exp(gdp_tensor_get(&a->g, row));
                    for (int64_t i = 0; i < KV; i++)
                        st[i] *= decay;
                }
                const double beta = gdp_tensor_present(&a->beta) ? gdp_tensor_get(&a->beta, row) : 1.0;
                /* delta = beta (v - S^T k);  S += k (x) delta;  o = S^T q. */
                for (int64_t j = 0; j < V; j++)
                    delta[j] = v[j];
                for (int64_t i = 0; i < K; i++)
                    for (int64_t j = 0; j < V; j++)
                        delta[j] -= st[i * V + j] * k[i];
                for (int64_t j = 0; j < V; j++)
                    delta[j] *= beta;
                for (int64_t i = 0; i < K; i++)
                    for (int64_t j = 0; j < V; j++)
                        st[i * V + j] += k[i] * delta[j];
                for (int64_t j = 0; j < V; j++) {
                    double acc = 0;
                    for (int64_t i = 0; i < K; i++)
                        acc += st[i * V + j] * q[i];
                    gdp_tensor_set(&o, row * V + j, acc);
                }
                if (snapshots && (t + 1) % M == 0) {
                    const int64_t s = (t + 1) / M - 1; /* the token this step completes */
                    gdp_cpu_store_run(&inter, ((slot * S + s) * H + h) * KV, KV, st);
                }
                /* Cache mode: between tokens the state is rounded to fp32, as the CUDA kernel
                 * holds it, so with the default fp32 cache a step of S tokens equals S steps of
                 * one token bit for bit (drafts on vs off, keeping n_acc of S vs running only
                 * those). Within a token's copies it stays double. */
                if (cache && (t + 1) % M == 0 && t + 1 < T)
                    round_to_dtype(GDP_DTYPE_FP32, st, KV);
            }

            if (cache)
                gdp_cpu_store_run(&state, state_block(&state, slot, h), KV, st);
            else if (a->output_final_state)
                gdp_tensor_write_f64(&final_state, (b * H + h) * KV, KV, st);
        }
    }
    free(st);
    return GDP_STATUS_SUCCESS;
}
