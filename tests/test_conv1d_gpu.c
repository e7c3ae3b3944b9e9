/*
 * test_conv1d_gpu.c: the CUDA backend of the causal conv1d ops (varlen and update) and the
 * fused decode front, through the public API on device buffers, against the golden file and
 * the CPU backend (same API, host copies of the same inputs; the CPU side is
 * test_conv1d_cpu.c). Checked: conv_varlen.safetensors (y within one bf16 ulp, state exact);
 * random varlen (zero, short and long sequences, -1 requests, padding rows, strided x, widths
 * 2..8) and update (S tokens, snapshots, -1 rows) vs the CPU: states bitwise, fp32 y within
 * 1e-5, 16-bit y within one ulp; graph replay; determinism; the fused decode front (conv
 * update + decode prepare in one launch, src/decode_core.h) bitwise equal to the two ops in
 * order, and behind it the decode op as the layer runs it (gdp_decode_recurrent_after_front: the
 * front's programmatic dependent) bitwise equal to the plain op behind the two ops (o and the
 * recurrent-state cache, twice on the same buffers; an unknown GDP_DECODE_PDL refused); the prefill front (varlen conv +
 * prefill prepare as one op) bitwise equal to the two
 * ops in order; the varlen op's row output kernel (16-bit x and y, the default) bitwise equal to the
 * scalar one (GDP_CONV_KERNEL=scalar) on the same inputs, sequences starting inside and across
 * its 8-token tiles; GDP_CONV_KERNEL set to anything else refused; in_proj with the decode front as
 * its epilogue (gdp_gemm_decode_front, one launch) bitwise equal to the skinny GEMM and the front in
 * order, eager and graph-replayed, an unknown GDP_GEMM_FRONT refused with nothing written.
 * Device helpers: test_gpu.h. Without a CUDA build or a visible GPU it prints why and exits
 * 77 (skip).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h" /* gdp_gemm_acquire */
#include "decode_core.h"
#include "internal.h" /* defines: gdp_tensor_get/set, gdp_tensor_stride */
#include "test_gpu.h"

#ifdef GDP_HAVE_CUDA

static int64_t bf16_ulp_distance_values(double a, double b) {
    const uint16_t ua = gdp_double_to_bf16(a), ub = gdp_double_to_bf16(b);
    const int64_t oa = (ua & 0x8000u) ? -(int64_t)(ua & 0x7fffu) : ua, ob = (ub & 0x8000u) ? -(int64_t)(ub & 0x7fffu) : ub;
    return oa > ob ? oa - ob : ob - oa;
}

/* y vs a reference y of the same dtype: fp32 within 1e-5, 16-bit within one ulp. */
static void compare_y(const char *what, const gdp_tensor *got, const gdp_tensor *ref) {
    test_compare_fp32_or_1ulp(what, got, ref, 1e-5, 1e-5);
}

static void conv_golden(void) {
    gdp_st_file *f = test_golden_open("conv_varlen.safetensors");
    if (f == NULL)
        return;
    gdp_tensor x, weight, state0, state_ref, idx, cu, y_ref;
    const bool ok = test_st_tensor(f, "x", &x) && test_st_tensor(f, "weight", &weight) &&
                    test_st_tensor(f, "conv_state", &state0) &&
                    test_st_tensor(f, "conv_state_after_ref", &state_ref) &&
                    test_st_tensor(f, "state_indices", &idx) && test_st_tensor(f, "cu_seqlens", &cu) &&
                    test_st_tensor(f, "y_ref", &y_ref);
    gdp_st_close(f);
    if (!ok)
        return;
    gdp_tensor y = test_tensor_alloc(x.dtype, 2, x.shape);
    gdp_conv1d_varlen_args d = {.x = test_dev_clone(&x), .weight = test_dev_clone(&weight), .conv_state = test_dev_clone(&state0),
                                .state_indices = test_dev_clone(&idx), .cu_seqlens = test_dev_clone(&cu), .silu = 1,
                                .y = test_dev_poisoned(&y)};
    CHECK_OK(gdp_causal_conv1d_varlen(g_test_gpu, &d));
    gdp_tensor state = test_host_clone(&state0);
    test_dev_fetch(&y, &d.y);
    test_dev_fetch(&state, &d.conv_state);
    int64_t worst = 0;
    for (int64_t i = 0; i < gdp_tensor_numel(&y); i++) {
        const int64_t u = bf16_ulp_distance_values(gdp_tensor_get(&y, i), gdp_tensor_get(&y_ref, i));
        worst = u > worst ? u : worst;
    }
    CHECK(worst <= 1, "conv_varlen golden: bf16 y is %lld bf16 ulp from y_ref (bar 1)", (long long)worst);
    test_same_bytes("conv_varlen golden: conv_state vs conv_state_after_ref", &state, &state_ref);
    printf("conv_varlen.safetensors (T=%lld, C=%lld, W=%lld): bf16 y within %lld bf16 ulp of y_ref; conv_state %s\n",
           (long long)x.shape[0], (long long)x.shape[1], (long long)weight.shape[1], (long long)worst,
           memcmp(state.data, state_ref.data, test_span_bytes(&state)) == 0 ? "bitwise equal" : "DIFFERENT");
    test_dev_free(&d.x), test_dev_free(&d.weight), test_dev_free(&d.conv_state), test_dev_free(&d.state_indices);
    test_dev_free(&d.cu_seqlens), test_dev_free(&d.y);
    test_host_free(&x), test_host_free(&weight), test_host_free(&state0), test_host_free(&state_ref), test_host_free(&idx);
    test_host_free(&cu), test_host_free(&y_ref), test_host_free(&y), test_host_free(&state);
}

#define VARLEN_MAX_SEQS 16
typedef struct varlen_cfg {
    int64_t C, W, slots, pad_tokens, x_pad;
    int nseq;
    int32_t lens[VARLEN_MAX_SEQS];
    int32_t slot[VARLEN_MAX_SEQS]; /* -1: padding request */
    gdp_dtype_t x_dt, w_dt, state_dt, y_dt;
    bool bias, silu;
} varlen_cfg;

static gdp_conv1d_varlen_args varlen_random(test_rng *r, const varlen_cfg *c) {
    gdp_conv1d_varlen_args a = {.silu = c->silu};
    int32_t cu[VARLEN_MAX_SEQS + 1] = {0};
    for (int i = 0; i < c->nseq; i++)
        cu[i + 1] = cu[i] + c->lens[i];
    const int64_t T = cu[c->nseq] + c->pad_tokens;
    const int64_t xs[2] = {T, c->C}, ws[2] = {c->C, c->W}, bs[1] = {c->C}, ss[3] = {c->slots, c->C, c->W};
    a.x = test_alloc_rows(c->x_dt, 2, xs, c->x_pad);
    test_fill_normal(&a.x, r, 1.0);
    a.weight = test_tensor_alloc(c->w_dt, 2, ws);
    test_fill_uniform(&a.weight, r, -1, 1);
    if (c->bias) {
        a.bias = test_tensor_alloc(c->w_dt, 1, bs);
        test_fill_uniform(&a.bias, r, -0.5, 0.5);
    }
    a.conv_state = test_tensor_alloc(c->state_dt, 3, ss);
    test_fill_normal(&a.conv_state, r, 1.0);
    a.state_indices = test_int_tensor(c->slot, c->nseq);
    a.cu_seqlens = test_int_tensor(cu, c->nseq + 1);
    a.y = test_tensor_alloc(c->y_dt, 2, xs);
    return a;
}

#define VARLEN_TENSORS 7
static gdp_tensor *varlen_slot(gdp_conv1d_varlen_args *a, int i) {
    gdp_tensor *all[VARLEN_TENSORS] = {&a->x, &a->weight, &a->bias, &a->conv_state, &a->state_indices,
                                       &a->cu_seqlens, &a->y};
    return all[i];
}

static gdp_conv1d_varlen_args varlen_to_device(const gdp_conv1d_varlen_args *h) {
    gdp_conv1d_varlen_args d = *h;
    for (int i = 0; i < VARLEN_TENSORS; i++)
        *varlen_slot(&d, i) = i == 6 ? test_dev_poisoned(&h->y) : test_dev_clone(varlen_slot((gdp_conv1d_varlen_args *)h, i));
    return d;
}

static void varlen_free(gdp_conv1d_varlen_args *a, bool device) {
    for (int i = 0; i < VARLEN_TENSORS; i++)
        device ? test_dev_free(varlen_slot(a, i)) : test_host_free(varlen_slot(a, i));
}

static void conv_varlen_vs_cpu(test_rng *r, const varlen_cfg *c) {
    char label[160];
    snprintf(label, sizeof label, "conv varlen C=%lld W=%lld seqs=%d pad=%lld x %s state %s y %s%s%s%s",
             (long long)c->C, (long long)c->W, c->nseq, (long long)c->pad_tokens, gdp_dtype_name(c->x_dt),
             gdp_dtype_name(c->state_dt), gdp_dtype_name(c->y_dt), c->bias ? " bias" : "", c->silu ? " silu" : "",
             c->x_pad ? " strided" : "");
    gdp_conv1d_varlen_args h = varlen_random(r, c);
    gdp_conv1d_varlen_args d = varlen_to_device(&h);
    gdp_tensor y = test_host_clone(&h.y), state = test_host_clone(&h.conv_state), state0 = test_host_clone(&h.conv_state);
    CHECK_OK(gdp_causal_conv1d_varlen(g_test_cpu, &h));
    CHECK_OK(gdp_causal_conv1d_varlen(g_test_gpu, &d));
    test_dev_fetch(&y, &d.y);
    test_dev_fetch(&state, &d.conv_state);
    printf("%s:\n", label);
    const int before = g_test_failures;
    compare_y("y vs CPU", &y, &h.y);
    test_same_bytes("conv varlen: states vs CPU", &state, &h.conv_state);
    /* Determinism: the same inputs and starting states give the same bits. */
    test_dev_put(&d.conv_state, &state0);
    CUDA_OK(cudaMemset(d.y.data, TEST_SENTINEL_BYTE, test_span_bytes(&d.y)));
    CHECK_OK(gdp_causal_conv1d_varlen(g_test_gpu, &d));
    gdp_tensor y2 = test_host_clone(&y), state2 = test_host_clone(&state);
    test_dev_fetch(&y2, &d.y);
    test_dev_fetch(&state2, &d.conv_state);
    test_same_bytes("conv varlen determinism: y", &y2, &y);
    test_same_bytes("conv varlen determinism: states", &state2, &state);
    /* Each other output kernel on the same inputs: the same bits (where a 16-bit kernel took the
     * call above; elsewhere every run is the scalar kernel's). */
    static const char *const kernels[2] = {"rows", "scalar"};
    for (int k = 0; k < 2; k++) {
        setenv("GDP_CONV_KERNEL", kernels[k], 1);
        test_dev_put(&d.conv_state, &state0);
        CUDA_OK(cudaMemset(d.y.data, TEST_SENTINEL_BYTE, test_span_bytes(&d.y)));
        CHECK_OK(gdp_causal_conv1d_varlen(g_test_gpu, &d));
        unsetenv("GDP_CONV_KERNEL");
        test_dev_fetch(&y2, &d.y);
        test_dev_fetch(&state2, &d.conv_state);
        char what[96];
        snprintf(what, sizeof what, "conv varlen: GDP_CONV_KERNEL=%s vs the default: y", kernels[k]);
        test_same_bytes(what, &y2, &y);
        snprintf(what, sizeof what, "conv varlen: GDP_CONV_KERNEL=%s vs the default: states", kernels[k]);
        test_same_bytes(what, &state2, &state);
    }
    printf("  %s\n", g_test_failures == before ? "ok (states bitwise equal to the CPU's; second run, GDP_CONV_KERNEL=rows "
                                                 "and =scalar bitwise equal)"
                                               : "FAILED");
    test_host_free(&y), test_host_free(&state), test_host_free(&state0), test_host_free(&y2), test_host_free(&state2);
    varlen_free(&d, true);
    varlen_free(&h, false);
}

typedef struct update_cfg {
    int64_t B, S, C, W, slots, x_pad;
    int pad_every;
    bool identity, inter, bias, silu;
    gdp_dtype_t x_dt, state_dt, y_dt;
} update_cfg;

#define UPDATE_TENSORS 7
static gdp_tensor *update_slot(gdp_conv1d_update_args *a, int i) {
    gdp_tensor *all[UPDATE_TENSORS] = {&a->x, &a->weight, &a->bias, &a->conv_state, &a->conv_state_indices,
                                       &a->intermediate_conv_states, &a->y};
    return all[i];
}

static gdp_conv1d_update_args update_random(test_rng *r, const update_cfg *c) {
    gdp_conv1d_update_args a = {.silu = c->silu};
    const int64_t xs[3] = {c->B, c->S, c->C}, ws[2] = {c->C, c->W}, bs[1] = {c->C}, ss[3] = {c->slots, c->C, c->W};
    a.x = test_alloc_rows(c->x_dt, 3, xs, c->x_pad);
    test_fill_normal(&a.x, r, 1.0);
    a.weight = test_tensor_alloc(c->x_dt, 2, ws);
    test_fill_uniform(&a.weight, r, -1, 1);
    if (c->bias) {
        a.bias = test_tensor_alloc(GDP_DTYPE_FP32, 1, bs);
        test_fill_uniform(&a.bias, r, -0.5, 0.5);
    }
    a.conv_state = test_tensor_alloc(c->state_dt, 3, ss);
    test_fill_normal(&a.conv_state, r, 1.0);
    if (!c->identity) {
        int32_t idx[64];
        for (int64_t b = 0; b < c->B; b++)
            idx[b] = c->pad_every > 0 && b % c->pad_every == c->pad_every - 1 ? -1
                                                                              : (int32_t)((b * 7 + 3) % c->slots);
        a.conv_state_indices = test_int_tensor(idx, c->B);
    }
    if (c->inter) {
        const int64_t is[4] = {c->slots, c->S, c->C, c->W};
        a.intermediate_conv_states = test_tensor_alloc(c->state_dt, 4, is);
        test_fill_value(&a.intermediate_conv_states, 5.0);
    }
    a.y = test_tensor_alloc(c->y_dt, 3, xs);
    return a;
}

static gdp_conv1d_update_args update_to_device(const gdp_conv1d_update_args *h) {
    gdp_conv1d_update_args d = *h;
    for (int i = 0; i < UPDATE_TENSORS; i++)
        *update_slot(&d, i) = i == 6 ? test_dev_poisoned(&h->y) : test_dev_clone(update_slot((gdp_conv1d_update_args *)h, i));
    return d;
}

static void update_free(gdp_conv1d_update_args *a, bool device) {
    for (int i = 0; i < UPDATE_TENSORS; i++)
        device ? test_dev_free(update_slot(a, i)) : test_host_free(update_slot(a, i));
}

static void conv_update_vs_cpu(test_rng *r, const update_cfg *c) {
    char label[160];
    snprintf(label, sizeof label, "conv update B=%lld S=%lld C=%lld W=%lld x %s state %s y %s%s%s%s%s",
             (long long)c->B, (long long)c->S, (long long)c->C, (long long)c->W, gdp_dtype_name(c->x_dt),
             gdp_dtype_name(c->state_dt), gdp_dtype_name(c->y_dt), c->identity ? " identity" : "",
             c->inter ? " snapshots" : "", c->bias ? " bias" : "", c->x_pad ? " strided" : "");
    gdp_conv1d_update_args h = update_random(r, c);
    gdp_conv1d_update_args d = update_to_device(&h);
    gdp_tensor y = test_host_clone(&h.y), state = test_host_clone(&h.conv_state), state0 = test_host_clone(&h.conv_state);
    gdp_tensor inter = test_host_clone(&h.intermediate_conv_states);
    CHECK_OK(gdp_causal_conv1d_update(g_test_cpu, &h));
    CHECK_OK(gdp_causal_conv1d_update(g_test_gpu, &d));
    test_dev_fetch(&y, &d.y);
    test_dev_fetch(&state, &d.conv_state);
    if (c->inter)
        test_dev_fetch(&inter, &d.intermediate_conv_states);
    printf("%s:\n", label);
    const int before = g_test_failures;
    compare_y("y vs CPU", &y, &h.y);
    test_same_bytes("conv update: states vs CPU", &state, &h.conv_state);
    if (c->inter)
        test_same_bytes("conv update: snapshots vs CPU", &inter, &h.intermediate_conv_states);
    /* Determinism: rerun from the original state. */
    test_dev_put(&d.conv_state, &state0);
    CHECK_OK(gdp_causal_conv1d_update(g_test_gpu, &d));
    gdp_tensor y2 = test_host_clone(&y);
    test_dev_fetch(&y2, &d.y);
    test_same_bytes("conv update determinism: y", &y2, &y);
    printf("  %s\n", g_test_failures == before ? "ok (states and snapshots bitwise equal to the CPU's; second run "
                                                 "bitwise equal)"
                                               : "FAILED");
    test_host_free(&y), test_host_free(&y2), test_host_free(&state), test_host_free(&state0), test_host_free(&inter);
    update_free(&d, true);
    update_free(&h, false);
}

static gdp_status_t update_graph_fn(void *p) { return gdp_causal_conv1d_update(g_test_gpu, p); }
static gdp_status_t varlen_graph_fn(void *p) { return gdp_causal_conv1d_varlen(g_test_gpu, p); }

/* Capture, then replay with new inputs and states: each replay == an eager run, bitwise. */
static void conv_graphs(test_rng *r, const update_cfg *uc, const varlen_cfg *vc) {
    int ok_update = 0, ok_varlen = 0;
    gdp_conv1d_update_args uh = update_random(r, uc);
    gdp_conv1d_update_args ud = update_to_device(&uh);
    cudaGraphExec_t exec = test_graph_capture(update_graph_fn, &ud);
    for (int round = 0; round < 2; round++) {
        gdp_conv1d_update_args fresh = update_random(r, uc);
        for (int i = 0; i < 6; i++)
            if (gdp_tensor_present(update_slot(&fresh, i)))
                test_dev_put(update_slot(&ud, i), update_slot(&fresh, i));
        CHECK_OK(gdp_causal_conv1d_update(g_test_gpu, &ud));
        gdp_tensor ye = test_host_clone(&fresh.y), se = test_host_clone(&fresh.conv_state);
        test_dev_fetch(&ye, &ud.y);
        test_dev_fetch(&se, &ud.conv_state);
        test_dev_put(&ud.conv_state, &fresh.conv_state);
        CUDA_OK(cudaMemset(ud.y.data, TEST_SENTINEL_BYTE, test_span_bytes(&ud.y)));
        test_graph_replay(exec);
        gdp_tensor yr = test_host_clone(&fresh.y), sr = test_host_clone(&fresh.conv_state);
        test_dev_fetch(&yr, &ud.y);
        test_dev_fetch(&sr, &ud.conv_state);
        const int before = g_test_failures;
        test_same_bytes("conv update graph replay vs eager: y", &yr, &ye);
        test_same_bytes("conv update graph replay vs eager: state", &sr, &se);
        ok_update += g_test_failures == before;
        test_host_free(&ye), test_host_free(&se), test_host_free(&yr), test_host_free(&sr);
        update_free(&fresh, false);
    }
    if (exec != NULL)
        CUDA_OK(cudaGraphExecDestroy(exec));
    update_free(&ud, true);
    update_free(&uh, false);

    gdp_conv1d_varlen_args vh = varlen_random(r, vc);
    gdp_conv1d_varlen_args vd = varlen_to_device(&vh);
    exec = test_graph_capture(varlen_graph_fn, &vd);
    for (int round = 0; round < 2; round++) {
        gdp_conv1d_varlen_args fresh = varlen_random(r, vc);
        for (int i = 0; i < 6; i++)
            if (gdp_tensor_present(varlen_slot(&fresh, i)))
                test_dev_put(varlen_slot(&vd, i), varlen_slot(&fresh, i));
        CHECK_OK(gdp_causal_conv1d_varlen(g_test_gpu, &vd));
        gdp_tensor ye = test_host_clone(&fresh.y), se = test_host_clone(&fresh.conv_state);
        test_dev_fetch(&ye, &vd.y);
        test_dev_fetch(&se, &vd.conv_state);
        test_dev_put(&vd.conv_state, &fresh.conv_state);
        CUDA_OK(cudaMemset(vd.y.data, TEST_SENTINEL_BYTE, test_span_bytes(&vd.y)));
        test_graph_replay(exec);
        gdp_tensor yr = test_host_clone(&fresh.y), sr = test_host_clone(&fresh.conv_state);
        test_dev_fetch(&yr, &vd.y);
        test_dev_fetch(&sr, &vd.conv_state);
        const int before = g_test_failures;
        test_same_bytes("conv varlen graph replay vs eager: y", &yr, &ye);
        test_same_bytes("conv varlen graph replay vs eager: state", &sr, &se);
        ok_varlen += g_test_failures == before;
        test_host_free(&ye), test_host_free(&se), test_host_free(&yr), test_host_free(&sr);
        varlen_free(&fresh, false);
    }
    if (exec != NULL)
        CUDA_OK(cudaGraphExecDestroy(exec));
    varlen_free(&vd, true);
    varlen_free(&vh, false);
    printf("conv graphs: update %d of 2, varlen %d of 2 replays with new inputs bitwise equal to eager runs\n",
           ok_update, ok_varlen);
}

/* The fused decode front (gdp_decode_conv_prepare, src/decode_core.h) against the chain it
 * replaces, conv update then decode prepare, on the GPU from the same inputs: query, key,
 * value, beta, g and the conv state bit for bit. x and ba are row views of one wider
 * projection row, as in the layer; every third request is a -1 slot and the others name
 * distinct slots (two rows naming one slot race on it; the CPU backend refuses them). */
/* A fused op against the chain it replaces: query, key, value, beta, g (host shapes `likes`) and
 * the conv state (host shape st) fetched from both runs' device buffers and compared bytewise.
 * Prints and returns how many of the 6 are equal. */
static int fused_outputs_same(const char *what, const gdp_tensor *const likes[5], const gdp_tensor chain[5],
                              const gdp_tensor fused[5], const gdp_tensor *st, const gdp_tensor *st_chain,
                              const gdp_tensor *st_fused) {
    static const char *const names[5] = {"query", "key", "value", "beta", "g"};
    int same = 0;
    char label[96];
    for (int i = 0; i < 5; i++) {
        gdp_tensor a = test_host_clone(likes[i]), b = test_host_clone(likes[i]);
        test_dev_fetch(&a, &chain[i]);
        test_dev_fetch(&b, &fused[i]);
        snprintf(label, sizeof label, "%s: %s", what, names[i]);
        same += test_same_bytes(label, &b, &a);
        test_host_free(&a), test_host_free(&b);
    }
    gdp_tensor sa = test_host_clone(st), sb = test_host_clone(st);
    test_dev_fetch(&sa, st_chain);
    test_dev_fetch(&sb, st_fused);
    snprintf(label, sizeof label, "%s: conv state", what);
    same += test_same_bytes(label, &sb, &sa);
    test_host_free(&sa), test_host_free(&sb);
    printf("  %d of 6 outputs bitwise equal\n", same);
    return same;
}

/* The conv and prepare parameters both fused fronts take, host and device: conv weights [C, 4]
 * and bias [C], a conv-state cache [slots, C, 4] in the state dtype, A_log and dt_bias [H]. */
typedef struct front_params {
    gdp_tensor w, b, st, A_log, dtb; /* host */
    gdp_tensor dw, db, dA, ddt;      /* device copies (the cache is cloned per run by the caller) */
} front_params;

static front_params front_params_make(test_rng *r, int64_t C, int64_t H, int64_t slots, gdp_dtype_t act,
                                      gdp_dtype_t state) {
    front_params f;
    const int64_t w_shape[2] = {C, 4}, c_shape[1] = {C}, st_shape[3] = {slots, C, 4}, h_shape[1] = {H};
    f.w = test_tensor_alloc(act, 2, w_shape), f.b = test_tensor_alloc(act, 1, c_shape);
    f.st = test_tensor_alloc(state, 3, st_shape);
    f.A_log = test_tensor_alloc(GDP_DTYPE_FP32, 1, h_shape), f.dtb = test_tensor_alloc(act, 1, h_shape);
    test_fill_normal(&f.w, r, 0.5), test_fill_normal(&f.b, r, 0.1), test_fill_normal(&f.st, r, 1.0);
    test_fill_uniform(&f.A_log, r, -1.0, 1.0), test_fill_uniform(&f.dtb, r, -0.5, 0.5);
    f.dw = test_dev_clone(&f.w), f.db = test_dev_clone(&f.b), f.dA = test_dev_clone(&f.A_log), f.ddt = test_dev_clone(&f.dtb);
    return f;
}

static void front_params_free(front_params *f) {
    test_dev_free(&f->dw), test_dev_free(&f->db), test_dev_free(&f->dA), test_dev_free(&f->ddt);
    test_host_free(&f->w), test_host_free(&f->b), test_host_free(&f->st), test_host_free(&f->A_log);
    test_host_free(&f->dtb);
}

typedef struct fuse_cfg {
    int64_t n, S, M, H, G, P, N, slots;
    gdp_dtype_t act, state;
    bool bias;
} fuse_cfg;

static void decode_core_vs_chain(test_rng *r, const fuse_cfg *c) {
    const int64_t C = c->M * c->H * c->P + (c->M + 1) * c->G * c->N, BA = c->M * c->H + c->H, pitch = C + BA + 24;
    const int64_t rows = c->n * c->S, E = c->S * c->M;
    const int64_t proj_shape[1] = {rows * pitch};
    gdp_tensor proj = test_tensor_alloc(c->act, 1, proj_shape);
    test_fill_normal(&proj, r, 1.0);
    front_params fp = front_params_make(r, C, c->H, c->slots, c->act, c->state);
    int32_t idx[256];
    for (int64_t i = 0; i < c->n; i++)
        idx[i] = i % 3 == 2 ? -1 : (int32_t)((i * 7 + 1) % c->slots); /* 7 is prime to every case's slots: distinct */
    gdp_tensor dproj = test_dev_clone(&proj), dst_chain = test_dev_clone(&fp.st), dst_fused = test_dev_clone(&fp.st);
    gdp_tensor hidx = test_int_tensor(idx, c->n), didx = test_dev_clone(&hidx);
    const int64_t y_shape[3] = {c->n, c->S, C}, q_shape[4] = {c->n, E, c->H, c->N}, v_shape[4] = {c->n, E, c->H, c->P};
    const int64_t g_shape[3] = {c->n, E, c->H};
    gdp_tensor hy = test_tensor_alloc(c->act, 3, y_shape), hq = test_tensor_alloc(c->act, 4, q_shape);
    gdp_tensor hv = test_tensor_alloc(c->act, 4, v_shape), hbeta = test_tensor_alloc(c->act, 3, g_shape);
    gdp_tensor hg = test_tensor_alloc(GDP_DTYPE_FP32, 3, g_shape);
    gdp_tensor out[2][6]; /* chain, fused: q, k, v, beta, g, y */
    for (int f = 0; f < 2; f++) {
        out[f][0] = test_dev_poisoned(&hq), out[f][1] = test_dev_poisoned(&hq), out[f][2] = test_dev_poisoned(&hv);
        out[f][3] = test_dev_poisoned(&hbeta), out[f][4] = test_dev_poisoned(&hg), out[f][5] = test_dev_poisoned(&hy);
    }
    /* The decode op behind each front, as the layer runs it: the plain op after the chain, and
     * gdp_decode_recurrent_after_front after the fused front (the row or tensor-core kernel as the
     * front's programmatic dependent: a read of q, k, v, g or beta before the front's writes land
     * would see the poison), on copies of one recurrent-state cache: o and the cache bit for bit.
     * The B = 128 case keeps a bf16 state (the tensor-core kernel from 256 (request, head) pairs). */
    const gdp_dtype_t ssm_dtype = c->n >= 128 ? GDP_DTYPE_BF16 : GDP_DTYPE_FP32;
    const int64_t ssm_shape[4] = {c->slots, c->H, c->N, c->P};
    gdp_tensor hssm = test_tensor_alloc(ssm_dtype, 4, ssm_shape), ho = test_tensor_alloc(c->act, 4, v_shape);
    test_fill_normal(&hssm, r, 0.5);
    gdp_tensor ssm[2] = {test_dev_clone(&hssm), test_dev_clone(&hssm)}, o[2] = {test_dev_poisoned(&ho), test_dev_poisoned(&ho)};
    /* Two passes on the same buffers, the second with a new projection row over the states the first
     * left: a dependent that read a buffer through a cache the kernel ahead's writes do not reach would
     * see the first pass's values there (the layer's second layer reads what its first one read). */
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1) {
            test_fill_normal(&proj, r, 1.0);
            test_dev_put(&dproj, &proj);
        }
        for (int f = 0; f < 2; f++) {
            gdp_conv1d_update_args cu = {
                .x = {.data = (char *)dproj.data, .dtype = c->act, .ndim = 3, .shape = {c->n, c->S, C},
                      .stride = {c->S * pitch, pitch, 1}},
                .weight = fp.dw, .conv_state = f == 0 ? dst_chain : dst_fused, .conv_state_indices = didx, .silu = 1,
                .y = out[f][5]};
            if (c->bias)
                cu.bias = fp.db;
            gdp_prepare_args pr = {
                .x = cu.y,
                .ba = {.data = (char *)dproj.data + (size_t)C * gdp_dtype_size(c->act), .dtype = c->act, .ndim = 3,
                       .shape = {c->n, c->S, BA}, .stride = {c->S * pitch, pitch, 1}},
                .A_log = fp.dA, .dt_bias = fp.ddt, .num_householder = (int32_t)c->M, .num_heads = (int32_t)c->H,
                .num_groups = (int32_t)c->G, .head_dim = (int32_t)c->P, .state_dim = (int32_t)c->N,
                .query = out[f][0], .key = out[f][1], .value = out[f][2], .beta = out[f][3], .g = out[f][4]};
            if (f == 0) {
                CHECK_OK(gdp_causal_conv1d_update(g_test_gpu, &cu));
                CHECK_OK(gdp_decode_prepare(g_test_gpu, &pr));
            } else {
                /* a switch value it does not know is refused before anything runs (the state
                 * compared below would show a partial write) */
                const char *names[2] = {"GDP_DECODE_FRONT", "GDP_DECODE_FRONT_VEC"};
                for (int e = 0; e < 2 && c->n == 1 && pass == 0; e++) {
                    char *saved = test_env_swap(names[e], "sideways");
                    CHECK(gdp_decode_conv_prepare(g_test_gpu, &cu, &pr) == GDP_STATUS_INVALID_USAGE,
                          "%s=sideways: gdp_decode_conv_prepare must refuse it", names[e]);
                    test_env_restore(names[e], saved);
                }
                CHECK_OK(gdp_decode_conv_prepare(g_test_gpu, &cu, &pr));
            }
            gdp_recurrent_args rc = {.q = out[f][0], .k = out[f][1], .v = out[f][2], .g = out[f][4], .beta = out[f][3],
                                     .use_qk_l2norm_in_kernel = 1, .state = ssm[f], .state_indices = didx,
                                     .steps_per_token = (int32_t)c->M, .o = o[f]};
            if (f == 0) {
                CHECK_OK(gdp_fused_recurrent_gated_delta_rule_update(g_test_gpu, &rc));
            } else {
                if (c->n == 1 && pass == 0) {
                    /* an unknown GDP_DECODE_PDL is refused before anything runs (the cache compared below) */
                    char *saved = test_env_swap("GDP_DECODE_PDL", "sideways");
                    CHECK(gdp_decode_recurrent_after_front(g_test_gpu, &rc) == GDP_STATUS_INVALID_USAGE,
                          "GDP_DECODE_PDL=sideways: gdp_decode_recurrent_after_front must refuse it");
                    test_env_restore("GDP_DECODE_PDL", saved);
                }
                CHECK_OK(gdp_decode_recurrent_after_front(g_test_gpu, &rc));
            }
        }
        printf("decode conv + prepare fused vs the chain (n %lld, S %lld, M %lld, H %lld, G %lld, P %lld, N %lld, act %s, "
               "state %s%s):\n", (long long)c->n, (long long)c->S, (long long)c->M, (long long)c->H, (long long)c->G,
               (long long)c->P, (long long)c->N, gdp_dtype_name(c->act), gdp_dtype_name(c->state), c->bias ? ", bias" : "");
        const gdp_tensor *likes[5] = {&hq, &hq, &hv, &hbeta, &hg};
        (void)fused_outputs_same("fused vs chain", likes, out[0], out[1], &fp.st, &dst_chain, &dst_fused);
        {
            gdp_tensor oa = test_host_clone(&ho), ob = test_host_clone(&ho), sa = test_host_clone(&hssm),
                       sb = test_host_clone(&hssm);
            test_dev_fetch(&oa, &o[0]), test_dev_fetch(&ob, &o[1]);
            test_dev_fetch(&sa, &ssm[0]), test_dev_fetch(&sb, &ssm[1]);
            const bool same_o = test_same_bytes("decode op after the front vs plain: o", &ob, &oa);
            const bool same_s = test_same_bytes("decode op after the front vs plain: recurrent state", &sb, &sa);
            printf("  decode op after the front (%s state, pass %d): o %s, state %s\n", gdp_dtype_name(ssm_dtype), pass,
                   same_o ? "bitwise equal" : "DIFFERS", same_s ? "bitwise equal" : "DIFFERS");
            test_host_free(&oa), test_host_free(&ob), test_host_free(&sa), test_host_free(&sb);
        }
    }
    for (int f = 0; f < 2; f++)
        test_dev_free(&ssm[f]), test_dev_free(&o[f]);
    test_host_free(&hssm), test_host_free(&ho);
    for (int f = 0; f < 2; f++)
        for (int i = 0; i < 6; i++)
            test_dev_free(&out[f][i]);
    test_dev_free(&dproj), test_dev_free(&dst_chain), test_dev_free(&dst_fused), test_dev_free(&didx);
    front_params_free(&fp);
    test_host_free(&proj);
    test_host_free(&hidx), test_host_free(&hy), test_host_free(&hq), test_host_free(&hv), test_host_free(&hbeta), test_host_free(&hg);
}

/* in_proj with the decode front (gdp_gemm_decode_front, src/decode_core.h) on the layer's layout:
 * C's columns are [z | conv channels | ba] (plus a pitch gap), conv->x and prep->ba views of them.
 * The one launch (GDP_GEMM_FRONT=fused) against the two ops (chain, with the skinny GEMM: the bits
 * the one launch promises): C, query, key, value, beta, g and the conv state bytewise; whether it
 * fuses as the shape says; auto runs the two ops; an unknown GDP_GEMM_FRONT writes nothing; and a
 * captured one launch replayed with a new A gives the chain's bits on that A. */
typedef struct gemm_front_cfg {
    int64_t rows, M, H, G, P, N, z_cols, k, slots;
    gdp_dtype_t act;
    bool bias, fuses;
} gemm_front_cfg;

typedef struct gemm_front_run {
    gdp_gemm_front_args args;
    gdp_conv1d_update_args cu;
    gdp_prepare_args pr;
} gemm_front_run;

/* args' C, conv state and outputs are the caller's device buffers; conv and prep point into *g. */
static void gemm_front_bind(gemm_front_run *g, const gemm_front_cfg *c, const front_params *fp, gdp_tensor *dA,
                            gdp_tensor *dB, gdp_tensor *dC, gdp_tensor *dst, gdp_tensor *didx, gdp_tensor out[6],
                            int64_t ldc) {
    const int64_t C = c->M * c->H * c->P + (c->M + 1) * c->G * c->N, BA = (c->M + 1) * c->H;
    const size_t es = gdp_dtype_size(c->act);
    char *cbase = (char *)dC->data;
    g->cu = (gdp_conv1d_update_args){
        .x = {.data = cbase + (size_t)c->z_cols * es, .dtype = c->act, .ndim = 3, .shape = {c->rows, 1, C},
              .stride = {ldc, ldc, 1}},
        .weight = fp->dw, .conv_state = *dst, .conv_state_indices = *didx, .silu = 1, .y = out[5]};
    if (c->bias)
        g->cu.bias = fp->db;
    g->pr = (gdp_prepare_args){
        .x = g->cu.y,
        .ba = {.data = cbase + (size_t)(c->z_cols + C) * es, .dtype = c->act, .ndim = 3, .shape = {c->rows, 1, BA},
               .stride = {ldc, ldc, 1}},
        .A_log = fp->dA, .dt_bias = fp->ddt, .num_householder = (int32_t)c->M, .num_heads = (int32_t)c->H,
        .num_groups = (int32_t)c->G, .head_dim = (int32_t)c->P, .state_dim = (int32_t)c->N,
        .query = out[0], .key = out[1], .value = out[2], .beta = out[3], .g = out[4]};
    g->args = (gdp_gemm_front_args){.rows = c->rows, .n = c->z_cols + C + BA, .k = c->k, .A = dA->data, .lda = c->k,
                                    .B = dB->data, .ab_dtype = c->act, .C = dC->data, .ldc = ldc, .conv = &g->cu,
                                    .prep = &g->pr};
}

static gdp_status_t gemm_front_call(void *p) {
    gemm_front_run *g = p;
    return gdp_gemm_decode_front(g_test_gpu, &g->args);
}

static void gemm_front_vs_chain(test_rng *r, const gemm_front_cfg *c) {
    const int64_t C = c->M * c->H * c->P + (c->M + 1) * c->G * c->N, BA = (c->M + 1) * c->H;
    const int64_t n = c->z_cols + C + BA, ldc = n + 8, E = c->M;
    front_params fp = front_params_make(r, C, c->H, c->slots, c->act, c->act);
    const int64_t a_shape[2] = {c->rows, c->k}, b_shape[2] = {n, c->k}, c_shape[2] = {c->rows, ldc};
    gdp_tensor hA = test_tensor_alloc(c->act, 2, a_shape), hB = test_tensor_alloc(c->act, 2, b_shape);
    gdp_tensor hC = test_tensor_alloc(c->act, 2, c_shape);
    test_fill_normal(&hA, r, 1.0), test_fill_normal(&hB, r, 1.0 / sqrt((double)c->k));
    int32_t idx[64];
    for (int64_t i = 0; i < c->rows; i++)
        idx[i] = i % 3 == 2 ? -1 : (int32_t)((i * 7 + 1) % c->slots); /* distinct slots, every third a padding row */
    gdp_tensor hidx = test_int_tensor(idx, c->rows), didx = test_dev_clone(&hidx);
    const int64_t y_shape[3] = {c->rows, 1, C}, q_shape[4] = {c->rows, E, c->H, c->N}, v_shape[4] = {c->rows, E, c->H, c->P};
    const int64_t g_shape[3] = {c->rows, E, c->H};
    gdp_tensor hy = test_tensor_alloc(c->act, 3, y_shape), hq = test_tensor_alloc(c->act, 4, q_shape);
    gdp_tensor hv = test_tensor_alloc(c->act, 4, v_shape), hbeta = test_tensor_alloc(c->act, 3, g_shape);
    gdp_tensor hg = test_tensor_alloc(GDP_DTYPE_FP32, 3, g_shape);
    gdp_tensor dA = test_dev_clone(&hA), dB = test_dev_clone(&hB);
    /* runs: 0 chain, 1 fused, 2 auto, 3 a refused switch value */
    gdp_tensor dC[4], dst[4], out[4][6];
    gemm_front_run g[4];
    for (int f = 0; f < 4; f++) {
        dC[f] = test_dev_poisoned(&hC), dst[f] = test_dev_clone(&fp.st);
        out[f][0] = test_dev_poisoned(&hq), out[f][1] = test_dev_poisoned(&hq), out[f][2] = test_dev_poisoned(&hv);
        out[f][3] = test_dev_poisoned(&hbeta), out[f][4] = test_dev_poisoned(&hg), out[f][5] = test_dev_poisoned(&hy);
        gemm_front_bind(&g[f], c, &fp, &dA, &dB, &dC[f], &dst[f], &didx, out[f], ldc);
    }
    static const char *const modes[4] = {"chain", "fused", "auto", "sideways"};
    char *saved_skinny = test_env_swap("GDP_GEMM_SKINNY", "on");
    for (int f = 0; f < 4; f++) {
        char *saved = test_env_swap("GDP_GEMM_FRONT", modes[f]);
        const bool fuses = gdp_gemm_decode_front_fuses(g_test_gpu, &g[f].args);
        CHECK(fuses == (f == 1 && c->fuses), "GDP_GEMM_FRONT=%s, %lld rows: the one launch %s", modes[f],
              (long long)c->rows, fuses ? "would run" : "would not run");
        if (f == 3) {
            CHECK_STATUS(gdp_gemm_decode_front(g_test_gpu, &g[f].args), GDP_STATUS_INVALID_USAGE);
            CHECK(strstr(gdp_last_error(), "GDP_GEMM_FRONT") != NULL && strstr(gdp_last_error(), "sideways") != NULL,
                  "the refusal names neither GDP_GEMM_FRONT nor its value: %s", gdp_last_error());
        } else {
            CHECK_OK(gdp_gemm_decode_front(g_test_gpu, &g[f].args));
        }
        test_env_restore("GDP_GEMM_FRONT", saved);
    }
    CUDA_OK(cudaStreamSynchronize(g_test_stream));
    printf("in_proj + decode front, one launch vs the chain (rows %lld, M %lld, H %lld, G %lld, P %lld, N %lld, k %lld, "
           "%s%s, fuses %d):\n", (long long)c->rows, (long long)c->M, (long long)c->H, (long long)c->G, (long long)c->P,
           (long long)c->N, (long long)c->k, gdp_dtype_name(c->act), c->bias ? ", bias" : "", c->fuses);
    const gdp_tensor *likes[5] = {&hq, &hq, &hv, &hbeta, &hg};
    for (int f = 1; f < 3; f++) {
        char what[48];
        snprintf(what, sizeof what, "GDP_GEMM_FRONT=%s vs chain", modes[f]);
        (void)fused_outputs_same(what, likes, out[0], out[f], &fp.st, &dst[0], &dst[f]);
        gdp_tensor ca = test_host_clone(&hC), cb = test_host_clone(&hC);
        test_dev_fetch(&ca, &dC[0]), test_dev_fetch(&cb, &dC[f]);
        snprintf(what, sizeof what, "GDP_GEMM_FRONT=%s vs chain: C", modes[f]);
        test_same_bytes(what, &cb, &ca);
        test_host_free(&ca), test_host_free(&cb);
    }
    { /* the refused call wrote nothing: C and outputs still poisoned, the cache as it was */
        gdp_tensor c0 = test_host_clone(&hC), p0 = test_host_clone(&hC), s0 = test_host_clone(&fp.st);
        test_dev_fetch(&c0, &dC[3]);
        memset(p0.data, TEST_SENTINEL_BYTE, (size_t)gdp_tensor_numel(&hC) * gdp_dtype_size(c->act));
        test_same_bytes("refused GDP_GEMM_FRONT: C untouched", &c0, &p0);
        test_dev_fetch(&s0, &dst[3]);
        test_same_bytes("refused GDP_GEMM_FRONT: conv state untouched", &s0, &fp.st);
        test_host_free(&c0), test_host_free(&p0), test_host_free(&s0);
    }
    /* captured (fused), replayed on a new A and a fresh cache: the chain's bits on that A */
    if (c->fuses) {
        char *saved = test_env_swap("GDP_GEMM_FRONT", "fused");
        cudaGraphExec_t exec = test_graph_capture(gemm_front_call, &g[1]);
        test_env_restore("GDP_GEMM_FRONT", saved);
        CHECK(exec != NULL, "in_proj + decode front did not capture");
        if (exec != NULL) {
            test_fill_normal(&hA, r, 1.0);
            test_dev_put(&dA, &hA);
            test_dev_put(&dst[1], &fp.st), test_dev_put(&dst[0], &fp.st);
            test_graph_replay(exec);
            saved = test_env_swap("GDP_GEMM_FRONT", "chain");
            CHECK_OK(gdp_gemm_decode_front(g_test_gpu, &g[0].args));
            test_env_restore("GDP_GEMM_FRONT", saved);
            CUDA_OK(cudaStreamSynchronize(g_test_stream));
            (void)fused_outputs_same("graph replay vs chain", likes, out[0], out[1], &fp.st, &dst[0], &dst[1]);
            CUDA_OK(cudaGraphExecDestroy(exec));
        }
    }
    test_env_restore("GDP_GEMM_SKINNY", saved_skinny);
    for (int f = 0; f < 4; f++) {
        test_dev_free(&dC[f]), test_dev_free(&dst[f]);
        for (int i = 0; i < 6; i++)
            test_dev_free(&out[f][i]);
    }
    test_dev_free(&dA), test_dev_free(&dB), test_dev_free(&didx);
    test_host_free(&hA), test_host_free(&hB), test_host_free(&hC), test_host_free(&hidx), test_host_free(&hy);
    test_host_free(&hq), test_host_free(&hv), test_host_free(&hbeta), test_host_free(&hg);
    front_params_free(&fp);
}

/* The prefill front (gdp_prefill_conv_prepare, src/decode_core.h): the varlen conv and the
 * prefill prepare as one op against the two ops in order, on the layer's layout (x and ba strided
 * views of one projection row, sequences with a -1 slot, an empty one and padding rows): query,
 * key, value, beta, g and the conv state bitwise equal; `fuses` says whether the one pass must
 * take the call. */
typedef struct front_cfg {
    int64_t M, H, G, P, N, slots, pad_rows;
    int nseq;
    int32_t lens[6];
    int32_t slot[6];
    gdp_dtype_t act, state;
    bool bias, fuses;
} front_cfg;

static void prefill_front_vs_chain(test_rng *r, const front_cfg *c) {
    const int64_t C = c->M * c->H * c->P + (c->M + 1) * c->G * c->N, BA = c->M * c->H + c->H;
    const int64_t pitch = (C + BA + 24 + 7) / 8 * 8; /* 16-byte rows of 16-bit x, as the layer's */
    int32_t cu[7] = {0};
    for (int i = 0; i < c->nseq; i++)
        cu[i + 1] = cu[i] + c->lens[i];
    const int64_t R = cu[c->nseq] + c->pad_rows;
    const int64_t proj_shape[1] = {R * pitch};
    gdp_tensor proj = test_tensor_alloc(c->act, 1, proj_shape);
    test_fill_normal(&proj, r, 1.0);
    front_params fp = front_params_make(r, C, c->H, c->slots, c->act, c->state);
    gdp_tensor hcu = test_int_tensor(cu, c->nseq + 1), hidx = test_int_tensor(c->slot, c->nseq);
    gdp_tensor dproj = test_dev_clone(&proj), dcu = test_dev_clone(&hcu), didx = test_dev_clone(&hidx);
    gdp_tensor dst[2] = {test_dev_clone(&fp.st), test_dev_clone(&fp.st)};
    const int64_t y_shape[2] = {R, C}, q_shape[4] = {1, R, c->H, c->N}, k_shape[4] = {1, R * c->M, c->H, c->N};
    const int64_t v_shape[4] = {1, R * c->M, c->H, c->P}, beta_shape[3] = {1, R * c->M, c->H}, g_shape[3] = {1, R, c->H};
    gdp_tensor hy = test_tensor_alloc(c->act, 2, y_shape), hq = test_tensor_alloc(c->act, 4, q_shape);
    gdp_tensor hk = test_tensor_alloc(c->act, 4, k_shape), hv = test_tensor_alloc(c->act, 4, v_shape);
    gdp_tensor hbeta = test_tensor_alloc(c->act, 3, beta_shape), hg = test_tensor_alloc(GDP_DTYPE_FP32, 3, g_shape);
    const gdp_tensor *likes[5] = {&hq, &hk, &hv, &hbeta, &hg};
    gdp_tensor out[2][6]; /* chain, one op: q, k, v, beta, g, y */
    for (int f = 0; f < 2; f++) {
        for (int i = 0; i < 5; i++)
            out[f][i] = test_dev_poisoned(likes[i]);
        out[f][5] = test_dev_poisoned(&hy);
    }
    for (int f = 0; f < 2; f++) {
        gdp_conv1d_varlen_args cv = {
            .x = {.data = dproj.data, .dtype = c->act, .ndim = 2, .shape = {R, C}, .stride = {pitch, 1}},
            .weight = fp.dw, .conv_state = dst[f], .state_indices = didx, .cu_seqlens = dcu, .silu = 1,
            .y = out[f][5]};
        if (c->bias)
            cv.bias = fp.db;
        gdp_tensor px = out[f][5];
        px.ndim = 3, px.shape[0] = 1, px.shape[1] = R, px.shape[2] = C, px.stride[0] = R * C, px.stride[1] = C,
        px.stride[2] = 1;
        gdp_prepare_args pr = {
            .x = px,
            .ba = {.data = (char *)dproj.data + (size_t)C * gdp_dtype_size(c->act), .dtype = c->act, .ndim = 3,
                   .shape = {1, R, BA}, .stride = {R * pitch, pitch, 1}},
            .A_log = fp.dA, .dt_bias = fp.ddt, .num_householder = (int32_t)c->M, .num_heads = (int32_t)c->H,
            .num_groups = (int32_t)c->G, .head_dim = (int32_t)c->P, .state_dim = (int32_t)c->N,
            .query = out[f][0], .key = out[f][1], .value = out[f][2], .beta = out[f][3], .g = out[f][4]};
        if (f == 0) {
            CHECK_OK(gdp_causal_conv1d_varlen(g_test_gpu, &cv));
            CHECK_OK(gdp_prefill_prepare(g_test_gpu, &pr));
            continue;
        }
        /* a GDP_PREFILL_FRONT it does not know is refused before anything runs (the state
         * compared below would show a partial write); chain never takes the one pass */
        char *saved = test_env_swap("GDP_PREFILL_FRONT", "sideways");
        CHECK(gdp_prefill_conv_prepare(g_test_gpu, &cv, &pr) == GDP_STATUS_INVALID_USAGE,
              "GDP_PREFILL_FRONT=sideways: gdp_prefill_conv_prepare must refuse it");
        setenv("GDP_PREFILL_FRONT", "chain", 1);
        CHECK(!gdp_prefill_conv_prepare_fuses(g_test_gpu, &cv, &pr), "GDP_PREFILL_FRONT=chain still fuses");
        test_env_restore("GDP_PREFILL_FRONT", saved);
        CHECK(gdp_prefill_conv_prepare_fuses(g_test_gpu, &cv, &pr) == c->fuses, "the one pass %s the call",
              c->fuses ? "must take" : "must not take");
        CHECK_OK(gdp_prefill_conv_prepare(g_test_gpu, &cv, &pr));
    }
    printf("prefill conv + prepare as one op vs the chain (lens");
    for (int i = 0; i < c->nseq; i++)
        printf(" %d", c->lens[i]);
    printf(", %lld padding rows, M %lld, H %lld, G %lld, P %lld, N %lld, act %s, state %s%s; %s):\n",
           (long long)c->pad_rows, (long long)c->M, (long long)c->H, (long long)c->G, (long long)c->P, (long long)c->N,
           gdp_dtype_name(c->act), gdp_dtype_name(c->state), c->bias ? ", bias" : "",
           c->fuses ? "one pass" : "the two ops");
    (void)fused_outputs_same("prefill front vs chain", likes, out[0], out[1], &fp.st, &dst[0], &dst[1]);
    for (int f = 0; f < 2; f++) {
        for (int i = 0; i < 6; i++)
            test_dev_free(&out[f][i]);
        test_dev_free(&dst[f]);
    }
    test_dev_free(&dproj), test_dev_free(&dcu), test_dev_free(&didx);
    front_params_free(&fp);
    test_host_free(&proj), test_host_free(&hcu), test_host_free(&hidx), test_host_free(&hy), test_host_free(&hq);
    test_host_free(&hk), test_host_free(&hv), test_host_free(&hbeta), test_host_free(&hg);
}

static void conv_tests(test_rng *r) {
    conv_golden();
    const gdp_dtype_t FB = GDP_DTYPE_BF16, FF = GDP_DTYPE_FP32, FH = GDP_DTYPE_FP16;
    const fuse_cfg fcases[] = {
        /* n, S, M, H, G, P, N, slots, act, state, bias */
        {1, 1, 2, 16, 4, 128, 128, 4, FB, FB, false},   /* the layer's decode shape at B = 1 */
        {128, 1, 2, 16, 4, 128, 128, 160, FB, FB, true}, /* at B = 128 with a bias: the fast bf16 launch */
        {40, 1, 2, 8, 2, 64, 64, 48, FH, FH, true},     /* the fast fp16 launch (16-byte rows of x) */
        {37, 1, 3, 8, 2, 64, 32, 40, FB, FF, true},     /* GQA 4, M 3, fp32 conv state, -1 slots */
        {9, 1, 1, 4, 4, 16, 16, 12, FF, FF, true},      /* fp32 activations (4-element runs) */
        {6, 1, 2, 6, 3, 24, 40, 8, FH, FH, false},      /* fp16 */
        {5, 2, 2, 8, 2, 32, 32, 8, FB, FB, true},       /* two tokens: the chain itself (fallback) */
    };
    /* the fast launch with 4 and with 8 channels a thread (GDP_DECODE_FRONT_VEC, kernels/decode_core.cu) */
    for (int v = 0; v < 2; v++) {
        setenv("GDP_DECODE_FRONT_VEC", v == 0 ? "4" : "8", 1);
        printf("GDP_DECODE_FRONT_VEC=%s\n", v == 0 ? "4" : "8");
        for (size_t i = 0; i < sizeof fcases / sizeof fcases[0]; i++)
            decode_core_vs_chain(r, &fcases[i]);
    }
    unsetenv("GDP_DECODE_FRONT_VEC");
    const gdp_dtype_t F32 = GDP_DTYPE_FP32, BF = GDP_DTYPE_BF16, F16 = GDP_DTYPE_FP16;
    const varlen_cfg vcases[] = {
        /* C, W, slots, pad tokens, x pad, nseq, lens, slots, x, w, state, y, bias, silu */
        {24, 4, 8, 5, 0, 6, {0, 1, 2, 3, 40, 100}, {3, 0, -1, 5, 7, 1}, BF, BF, BF, BF, false, true},
        {130, 4, 4, 0, 6, 3, {33, 64, 65}, {2, -1, 0}, F32, F32, F32, F32, true, true},
        {64, 2, 3, 31, 0, 3, {1, 0, 70}, {1, 2, 0}, BF, F32, BF, F32, true, false},
        {40, 8, 6, 2, 3, 5, {7, 8, 9, 0, 200}, {5, 4, -1, 3, 2}, F16, F16, F32, F16, false, true},
        {16, 3, 2, 40, 0, 1, {0}, {1}, F32, F32, F32, F32, false, true}, /* only padding tokens */
        /* the row output kernel (16-bit x and y, C a multiple of 8, W <= 4): sequences starting
         * inside and across its 8-token tiles (tau < W at a tile start), -1 requests, empty ones,
         * strided rows, fp32 and 16-bit states, widths 2..4 */
        {176, 4, 10, 5, 8, 9, {1, 7, 8, 9, 3, 0, 17, 64, 2}, {4, 0, -1, 9, 2, 7, 1, -1, 3}, BF, BF, F32, BF, true, true},
        {32, 3, 4, 0, 0, 3, {2, 5, 11}, {1, 3, 0}, F16, F16, F16, F16, false, true},
        {1104, 2, 3, 3, 16, 2, {1, 300}, {2, 0}, BF, F32, BF, BF, true, false},
        {8, 4, 2, 0, 0, 1, {13}, {-1}, BF, BF, BF, BF, true, true},
        /* the row kernel's whole tiles: long sequences (tiles inside them) after short ones */
        {64, 4, 4, 7, 0, 4, {3, 100, 1, 61}, {2, 0, 3, -1}, F16, F16, F16, F16, true, true},
        {40, 3, 3, 0, 8, 2, {50, 77}, {1, 2}, BF, F32, BF, BF, false, true},
    };
    for (size_t i = 0; i < sizeof vcases / sizeof vcases[0]; i++)
        conv_varlen_vs_cpu(r, &vcases[i]);
    const update_cfg ucases[] = {
        /* B, S, C, W, slots, x pad, pad every, identity, inter, bias, silu, x, state, y */
        {6, 1, 96, 4, 9, 0, 3, false, false, false, true, BF, BF, BF},
        {5, 3, 40, 4, 8, 8, 2, false, true, true, true, F32, F32, F32},
        {3, 2, 130, 8, 3, 0, 0, true, true, false, false, BF, F32, F32},
        {4, 4, 33, 2, 6, 1, 4, false, true, true, true, F16, F16, F16},
        /* channels over many 128-thread blocks (the last partial), -1 rows */
        {9, 1, 1100, 4, 12, 0, 4, false, false, true, true, BF, F32, BF},
        {3, 2, 1537, 3, 4, 2, 0, true, true, true, false, F32, F32, F32},
    };
    for (size_t i = 0; i < sizeof ucases / sizeof ucases[0]; i++)
        conv_update_vs_cpu(r, &ucases[i]);
    conv_graphs(r, &ucases[1], &vcases[0]);
    const gdp_dtype_t BF16 = GDP_DTYPE_BF16, FP16 = GDP_DTYPE_FP16, FP32 = GDP_DTYPE_FP32;
    const front_cfg front[] = {
        /* M, H, G, P, N, slots, pad rows, nseq, lens, slots, act, state, bias, fuses */
        {2, 8, 2, 32, 32, 6, 11, 4, {100, 37, 0, 64}, {2, -1, 0, 5}, BF16, BF16, true, true}, /* the layer's form */
        {3, 4, 4, 16, 16, 4, 0, 3, {9, 1, 40}, {3, 1, 0}, FP16, FP32, false, true},          /* M 3, no GQA */
        {2, 16, 4, 128, 128, 2, 5, 1, {300}, {1}, BF16, BF16, true, true},                     /* the layer's heads */
        {1, 2, 1, 8, 8, 2, 3, 2, {20, 6}, {0, 1}, FP32, FP32, true, false},                   /* fp32: the two ops */
    };
    for (size_t i = 0; i < sizeof front / sizeof front[0]; i++)
        prefill_front_vs_chain(r, &front[i]);
    CHECK_OK(gdp_gemm_acquire(g_test_gpu)); /* the chain's GEMM (cuBLASLt past the skinny kernel's rows) */
    const gemm_front_cfg gf[] = {
        /* rows, M, H, G, P, N, z cols, k, slots, act, bias, fuses */
        {1, 2, 16, 4, 128, 128, 2048, 2048, 4, BF16, false, true}, /* the layer's in_proj at B = 1 */
        {2, 2, 16, 4, 128, 128, 2048, 2048, 6, BF16, false, true},
        {8, 2, 16, 4, 128, 128, 2048, 2048, 12, BF16, true, true}, /* the kernel's row limit, -1 rows */
        {3, 3, 8, 2, 64, 32, 64, 520, 5, FP16, true, true},        /* M 3, GQA 4, fp16, k not a multiple of 256 */
        {5, 1, 4, 4, 16, 16, 8, 64, 9, BF16, true, true},          /* M 1, no GQA, two blocks of columns */
        {9, 2, 8, 2, 32, 32, 16, 256, 12, BF16, true, false},      /* past the row limit: the two ops */
    };
    for (size_t i = 0; i < sizeof gf / sizeof gf[0]; i++)
        gemm_front_vs_chain(r, &gf[i]);
    gdp_gemm_release(g_test_gpu);
    /* a GDP_CONV_KERNEL the op does not know: refused before any launch */
    gdp_conv1d_varlen_args h = varlen_random(r, &vcases[0]);
    gdp_conv1d_varlen_args d = varlen_to_device(&h);
    setenv("GDP_CONV_KERNEL", "fast", 1);
    CHECK_STATUS(gdp_causal_conv1d_varlen(g_test_gpu, &d), GDP_STATUS_INVALID_USAGE);
    unsetenv("GDP_CONV_KERNEL");
    CHECK(strstr(gdp_last_error(), "GDP_CONV_KERNEL") != NULL, "the refusal names GDP_CONV_KERNEL: %s",
          gdp_last_error());
    varlen_free(&d, true);
    varlen_free(&h, false);
}

#endif /* GDP_HAVE_CUDA */

TEST_GPU_MAIN("test_conv1d_gpu", conv_tests, 20261129)
