/*
 * gdp_run.c: the main program, for now the reference walk-through the README's first
 * command runs: on a built-in config it runs one prefill step (conv varlen + SiLU,
 * prepare, chunked GDP in cache mode, grouped gated RMSNorm) and one decode step (conv
 * update, decode prepare, recurrent update on the same slots) of the GDP mixer core on
 * the CPU reference backend, checks the decode step against recomputing the whole
 * sequences with the chunked op, and prints a short report. The serving engine
 * (continuous batching over a workload on N ranks) replaces it later.
 */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gdp/gdp.h"

#define M_COPIES 2
#define HEADS 4
#define GROUPS 2
#define HEAD_DIM 32  /* P = V */
#define STATE_DIM 64 /* N = K */
#define WIDTH 4
#define SLOTS 8
#define CONV_DIM (M_COPIES * HEADS * HEAD_DIM + (M_COPIES + 1) * GROUPS * STATE_DIM)
#define BA_DIM (M_COPIES * HEADS + HEADS)

static const int32_t prompt_lens[] = {100, 37, 200};
#define NREQ ((int32_t)(sizeof prompt_lens / sizeof prompt_lens[0]))

static void die(const char *what, gdp_status_t st) {
    fprintf(stderr, "gdp-run: %s failed: %s\n  %s\n", what, gdp_status_string(st), gdp_last_error());
    exit(1);
}
#define RUN(call)                          \
    do {                                   \
        gdp_status_t st_ = (call);         \
        if (st_ != GDP_STATUS_SUCCESS)     \
            die(#call, st_);               \
    } while (0)

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static double uniform(void) {
    rng_state ^= rng_state >> 12, rng_state ^= rng_state << 25, rng_state ^= rng_state >> 27;
    return (double)((rng_state * 2685821657736338717ull) >> 11) * 0x1.0p-53;
}

static float *alloc_f(int64_t n) { return calloc((size_t)(n ? n : 1), sizeof(float)); }
static gdp_tensor view(void *data, gdp_dtype_t dt, int32_t ndim, const int64_t *shape) {
    gdp_tensor t;
    gdp_tensor_init(&t, data, dt, ndim, shape);
    return t;
}
#define T1(p, a) view(p, GDP_DTYPE_FP32, 1, (int64_t[]){a})
#define T2(p, a, b) view(p, GDP_DTYPE_FP32, 2, (int64_t[]){a, b})
#define T3(p, a, b, c) view(p, GDP_DTYPE_FP32, 3, (int64_t[]){a, b, c})
#define T4(p, a, b, c, d) view(p, GDP_DTYPE_FP32, 4, (int64_t[]){a, b, c, d})
#define I1(p, a) view(p, GDP_DTYPE_INT32, 1, (int64_t[]){a})

/* The weights of one mixer core, shared by every run below. */
typedef struct {
    float conv_w[CONV_DIM * WIDTH], A_log[HEADS], dt_bias[HEADS], norm_w[HEADS * HEAD_DIM];
} weights;

/* Prefill of `n` requests with lengths lens (tokens x_raw/ba/z rows packed) into slots;
 * writes o_norm [T, H*P] and updates the caches. Returns the seconds per stage. */
typedef struct { double conv, prepare, chunk, norm; } stage_times;

static stage_times prefill(gdp_ctx_t ctx, const weights *w, int32_t n, const int32_t *lens, const float *x_raw,
                           const float *ba, const float *z, float *conv_state, float *ssm_state, const int32_t *slots,
                           float *o_norm) {
    stage_times tm = {0};
    int32_t cu[NREQ + 1] = {0};
    for (int32_t i = 0; i < n; i++)
        cu[i + 1] = cu[i] + lens[i];
    int64_t T = cu[n], H = HEADS, P = HEAD_DIM, N = STATE_DIM, M = M_COPIES;
    float *xc = alloc_f(T * CONV_DIM);
    double t0 = now();
    gdp_conv1d_varlen_args conv = {
        .x = T2((void *)x_raw, T, CONV_DIM), .weight = T2((void *)w->conv_w, CONV_DIM, WIDTH),
        .conv_state = T3(conv_state, SLOTS, CONV_DIM, WIDTH), .state_indices = I1((void *)slots, n),
        .cu_seqlens = I1(cu, n + 1), .silu = 1, .y = T2(xc, T, CONV_DIM)};
    RUN(gdp_causal_conv1d_varlen(ctx, &conv));
    double t1 = now();
    float *q = alloc_f(T * H * N), *k = alloc_f(T * M * H * N), *v = alloc_f(T * M * H * P);
    float *beta = alloc_f(T * M * H), *g = alloc_f(T * H);
    gdp_prepare_args prep = {
        .x = T3(xc, 1, T, CONV_DIM), .ba = T3((void *)ba, 1, T, BA_DIM), .A_log = T1((void *)w->A_log, H),
        .dt_bias = T1((void *)w->dt_bias, H), .num_householder = M, .num_heads = H, .num_groups = GROUPS,
        .head_dim = P, .state_dim = N, .query = T4(q, 1, T, H, N), .key = T4(k, 1, T * M, H, N),
        .value = T4(v, 1, T * M, H, P), .beta = T3(beta, 1, T * M, H), .g = T3(g, 1, T, H)};
    RUN(gdp_prefill_prepare(ctx, &prep));
    double t2 = now();
    int64_t nc, ncdp;
    RUN(gdp_max_chunk_counts(T, n, (int32_t)M, &nc, &ncdp));
    int32_t *ci = malloc(sizeof(int32_t) * 2 * nc), *cidp = malloc(sizeof(int32_t) * 2 * ncdp), off[NREQ + 1];
    RUN(gdp_build_chunk_descriptors(cu, n, (int32_t)M, T, ci, cidp, off, &nc, &ncdp));
    /* The chunk op never reads the cache: gather each slot's state as initial_state. */
    float *h0 = alloc_f(n * H * N * P), *o = alloc_f(T * H * P);
    for (int32_t i = 0; i < n; i++)
        memcpy(h0 + i * H * N * P, ssm_state + slots[i] * H * N * P, sizeof(float) * H * N * P);
    gdp_chunk_args ch = {
        .q = T4(q, 1, T, H, N), .k = T4(k, 1, T * M, H, N), .v = T4(v, 1, T * M, H, P), .g = T3(g, 1, T, H),
        .beta = T3(beta, 1, T * M, H), .num_householder = (int32_t)M, .cu_seqlens = I1(cu, n + 1),
        .initial_state = T4(h0, n, H, N, P), .use_qk_l2norm_in_kernel = 1,
        .chunk_indices = view(ci, GDP_DTYPE_INT32, 2, (int64_t[]){nc, 2}),
        .chunk_indices_dp = view(cidp, GDP_DTYPE_INT32, 2, (int64_t[]){ncdp, 2}), .chunk_offsets = I1(off, n + 1),
        .state = T4(ssm_state, SLOTS, H, N, P), .state_indices = I1((void *)slots, n), .o = T4(o, 1, T, H, P)};
    RUN(gdp_chunk_gated_delta_product_varlen(ctx, &ch));
    double t3 = now();
    gdp_tensor out = T2(o_norm, T, H * P), y = T2(o, T, H * P), zt = T2((void *)z, T, H * P);
    gdp_tensor wt = T1((void *)w->norm_w, H * P);
    RUN(gdp_gated_rmsnorm(ctx, &out, &y, &zt, &wt, (H / GROUPS) * P, 1e-5));
    double t4 = now();
    tm.conv = t1 - t0, tm.prepare = t2 - t1, tm.chunk = t3 - t2, tm.norm = t4 - t3;
    free(xc), free(q), free(k), free(v), free(beta), free(g), free(ci), free(cidp), free(h0), free(o);
    return tm;
}

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            printf("usage: gdp-run\n  Runs one prefill and one decode step of the GDP mixer core on the CPU reference\n"
                   "  backend with a built-in config and prints a report (the serving engine comes later).\n");
            return 0;
        }
        fprintf(stderr, "gdp-run: unknown argument '%s' (try --help)\n", argv[i]);
        return 2;
    }
    int version;
    gdp_get_version(&version);
    const int64_t H = HEADS, P = HEAD_DIM, N = STATE_DIM, M = M_COPIES;
    int32_t total = 0;
    for (int32_t i = 0; i < NREQ; i++)
        total += prompt_lens[i] + 1;
    printf("# gdp %d.%d.%d  gdp-run (reference walk-through; the serving engine comes later)\n", version / 10000,
           version / 100 % 100, version % 100);
    printf("# backend cpu  H=%lld G=%d P=%lld N=%lld M=%lld conv width %d  requests %d  prompts", (long long)H, GROUPS,
           (long long)P, (long long)N, (long long)M, WIDTH, NREQ);
    for (int32_t i = 0; i < NREQ; i++)
        printf(" %d", prompt_lens[i]);
    printf("  + 1 decode token each\n");

    weights w;
    for (int i = 0; i < CONV_DIM * WIDTH; i++)
        w.conv_w[i] = (float)((uniform() - 0.5) * 0.8);
    for (int h = 0; h < HEADS; h++) {
        w.A_log[h] = (float)log(1 + 15 * uniform());                          /* log U(1, 16) */
        double dt = exp(log(1e-3) + (log(0.1) - log(1e-3)) * uniform());      /* log-uniform */
        w.dt_bias[h] = (float)(dt + log(-expm1(-dt)));                        /* softplus^-1 */
    }
    for (int i = 0; i < HEADS * HEAD_DIM; i++)
        w.norm_w[i] = (float)(0.5 + uniform());

    /* Inputs of the full sequences (prompt + one decode token per request), per request. */
    float *seq_x[NREQ], *seq_ba[NREQ], *seq_z[NREQ];
    for (int32_t i = 0; i < NREQ; i++) {
        int32_t L = prompt_lens[i] + 1;
        seq_x[i] = alloc_f(L * CONV_DIM), seq_ba[i] = alloc_f(L * BA_DIM), seq_z[i] = alloc_f(L * H * P);
        for (int64_t j = 0; j < L * CONV_DIM; j++) seq_x[i][j] = (float)((uniform() - 0.5) * 2);
        for (int64_t j = 0; j < L * BA_DIM; j++) seq_ba[i][j] = (float)((uniform() - 0.5) * 4);
        for (int64_t j = 0; j < L * H * P; j++) seq_z[i][j] = (float)((uniform() - 0.5) * 2);
    }
    /* Packs the first lens[i] tokens of each request. */
    int32_t Tp = 0;
    for (int32_t i = 0; i < NREQ; i++) Tp += prompt_lens[i];
    float *px = alloc_f(Tp * CONV_DIM), *pba = alloc_f(Tp * BA_DIM), *pz = alloc_f(Tp * H * P);
    for (int32_t i = 0, t = 0; i < NREQ; t += prompt_lens[i], i++) {
        memcpy(px + (int64_t)t * CONV_DIM, seq_x[i], sizeof(float) * prompt_lens[i] * CONV_DIM);
        memcpy(pba + (int64_t)t * BA_DIM, seq_ba[i], sizeof(float) * prompt_lens[i] * BA_DIM);
        memcpy(pz + (int64_t)t * H * P, seq_z[i], sizeof(float) * prompt_lens[i] * H * P);
    }

    gdp_ctx_t ctx;
    RUN(gdp_ctx_init(&ctx, GDP_BACKEND_CPU, 0));
    const int32_t slots[NREQ] = {5, 0, 3};
    float *conv_state = alloc_f(SLOTS * CONV_DIM * WIDTH), *ssm = alloc_f(SLOTS * H * N * P);
    float *o_prefill = alloc_f(Tp * H * P);
    double t0 = now();
    stage_times st = prefill(ctx, &w, NREQ, prompt_lens, px, pba, pz, conv_state, ssm, slots, o_prefill);
    double t_prefill = now() - t0;

    /* Decode step: one token per request from the caches. */
    float *dx = alloc_f(NREQ * CONV_DIM), *dba = alloc_f(NREQ * BA_DIM), *dz = alloc_f(NREQ * H * P);
    for (int32_t i = 0; i < NREQ; i++) {
        memcpy(dx + i * CONV_DIM, seq_x[i] + (int64_t)prompt_lens[i] * CONV_DIM, sizeof(float) * CONV_DIM);
        memcpy(dba + i * BA_DIM, seq_ba[i] + (int64_t)prompt_lens[i] * BA_DIM, sizeof(float) * BA_DIM);
        memcpy(dz + i * H * P, seq_z[i] + (int64_t)prompt_lens[i] * H * P, sizeof(float) * H * P);
    }
    float *dxc = alloc_f(NREQ * CONV_DIM), *q = alloc_f(NREQ * M * H * N), *k = alloc_f(NREQ * M * H * N);
    float *v = alloc_f(NREQ * M * H * P), *beta = alloc_f(NREQ * M * H), *g = alloc_f(NREQ * M * H);
    float *o = alloc_f(NREQ * M * H * P), *o_last = alloc_f(NREQ * H * P), *o_dec = alloc_f(NREQ * H * P);
    t0 = now();
    gdp_conv1d_update_args cu = {
        .x = T3(dx, NREQ, 1, CONV_DIM), .weight = T2(w.conv_w, CONV_DIM, WIDTH),
        .conv_state = T3(conv_state, SLOTS, CONV_DIM, WIDTH), .conv_state_indices = I1((void *)slots, NREQ),
        .silu = 1, .y = T3(dxc, NREQ, 1, CONV_DIM)};
    RUN(gdp_causal_conv1d_update(ctx, &cu));
    gdp_prepare_args dp = {
        .x = T3(dxc, NREQ, 1, CONV_DIM), .ba = T3(dba, NREQ, 1, BA_DIM), .A_log = T1(w.A_log, H),
        .dt_bias = T1(w.dt_bias, H), .num_householder = (int32_t)M, .num_heads = (int32_t)H, .num_groups = GROUPS,
        .head_dim = (int32_t)P, .state_dim = (int32_t)N, .query = T4(q, NREQ, M, H, N), .key = T4(k, NREQ, M, H, N),
        .value = T4(v, NREQ, M, H, P), .beta = T3(beta, NREQ, M, H), .g = T3(g, NREQ, M, H)};
    RUN(gdp_decode_prepare(ctx, &dp));
    gdp_recurrent_args rec = {
        .q = T4(q, NREQ, M, H, N), .k = T4(k, NREQ, M, H, N), .v = T4(v, NREQ, M, H, P), .g = T3(g, NREQ, M, H),
        .beta = T3(beta, NREQ, M, H), .use_qk_l2norm_in_kernel = 1, .state = T4(ssm, SLOTS, H, N, P),
        .state_indices = I1((void *)slots, NREQ), .steps_per_token = (int32_t)M, .o = T4(o, NREQ, M, H, P)};
    RUN(gdp_fused_recurrent_gated_delta_rule_update(ctx, &rec));
    for (int32_t i = 0; i < NREQ; i++) /* token output = copy M-1 */
        memcpy(o_last + i * H * P, o + (i * M + M - 1) * H * P, sizeof(float) * H * P);
    gdp_tensor nout = T2(o_dec, NREQ, H * P), ny = T2(o_last, NREQ, H * P), nz = T2(dz, NREQ, H * P);
    gdp_tensor nw = T1(w.norm_w, H * P);
    RUN(gdp_gated_rmsnorm(ctx, &nout, &ny, &nz, &nw, (H / GROUPS) * P, 1e-5));
    double t_decode = now() - t0;

    /* Check: prefill the whole sequences (prompt + decode token) from fresh caches; the
     * last token's normed output must match the decode step (gdp-math.md 8.1:
     * max |a - b| <= 1e-4 max |b|). */
    int32_t full_lens[NREQ], Tf = 0;
    for (int32_t i = 0; i < NREQ; i++) full_lens[i] = prompt_lens[i] + 1, Tf += full_lens[i];
    float *fx = alloc_f(Tf * CONV_DIM), *fba = alloc_f(Tf * BA_DIM), *fz = alloc_f(Tf * H * P);
    for (int32_t i = 0, t = 0; i < NREQ; t += full_lens[i], i++) {
        memcpy(fx + (int64_t)t * CONV_DIM, seq_x[i], sizeof(float) * full_lens[i] * CONV_DIM);
        memcpy(fba + (int64_t)t * BA_DIM, seq_ba[i], sizeof(float) * full_lens[i] * BA_DIM);
        memcpy(fz + (int64_t)t * H * P, seq_z[i], sizeof(float) * full_lens[i] * H * P);
    }
    float *conv2 = alloc_f(SLOTS * CONV_DIM * WIDTH), *ssm2 = alloc_f(SLOTS * H * N * P), *of = alloc_f(Tf * H * P);
    prefill(ctx, &w, NREQ, full_lens, fx, fba, fz, conv2, ssm2, slots, of);
    double max_diff = 0, max_ref = 0, state_diff = 0, state_ref = 0;
    for (int32_t i = 0, t = 0; i < NREQ; t += full_lens[i], i++) {
        for (int64_t j = 0; j < H * P; j++) {
            double ref = of[(int64_t)(t + full_lens[i] - 1) * H * P + j];
            max_diff = fmax(max_diff, fabs(o_dec[i * H * P + j] - ref));
            max_ref = fmax(max_ref, fabs(ref));
        }
    }
    for (int64_t j = 0; j < SLOTS * H * N * P; j++) {
        state_diff = fmax(state_diff, fabs(ssm[j] - ssm2[j]));
        state_ref = fmax(state_ref, fabs(ssm2[j]));
    }
    bool ok = max_diff <= 1e-4 * max_ref && state_diff <= 1e-4 * state_ref;

    printf("#\n# %-26s %10s %12s\n", "step", "time(ms)", "tokens/s");
    printf("  %-26s %10.3f %12.0f\n", "prefill (all stages)", t_prefill * 1e3, Tp / t_prefill);
    printf("    %-24s %10.3f\n", "conv1d varlen + SiLU", st.conv * 1e3);
    printf("    %-24s %10.3f\n", "prefill prepare", st.prepare * 1e3);
    printf("    %-24s %10.3f\n", "chunked GDP (cache mode)", st.chunk * 1e3);
    printf("    %-24s %10.3f\n", "gated RMSNorm", st.norm * 1e3);
    printf("  %-26s %10.3f %12.0f\n", "decode step", t_decode * 1e3, NREQ / t_decode);
    printf("#\n# decode vs recomputing each sequence: max |diff| %.3e (max |ref| %.3e), states %.3e (max %.3e)\n",
           max_diff, max_ref, state_diff, state_ref);
    printf("# %s: prompt tokens %d, generated positions %d, bar 1e-4 x max|ref|\n", ok ? "OK" : "MISMATCH", Tp, NREQ);
    (void)total;
    gdp_ctx_free(ctx);
    return ok ? 0 : 1;
}
