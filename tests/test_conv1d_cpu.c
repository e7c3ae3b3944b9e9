/*
 * test_conv1d_cpu.c: the CPU reference of gdp_causal_conv1d_varlen and gdp_causal_conv1d_update.
 *   - conv_varlen.safetensors (float64 loop; width 4, SiLU, carried state, a short and a
 *     zero-length request, a -1 request, padding rows): bf16 y within one bf16 ulp of
 *     y_ref, fp32 y within 1e-6 relative, padding rows 0, conv_state_after_ref bitwise;
 *   - the decode update of S tokens equals varlen over the same tokens from the same
 *     state (y and state bitwise), for widths 2, 4 and 8 with and without bias;
 *   - intermediate_conv_states rows equal the states after S single-token updates, and
 *     one S-token update gives the same y as S single-token ones; other rows untouched;
 *   - -1 rows: update gives y = 0 and touches no slot; a -1 varlen request equals one
 *     whose slot holds zeros and writes nothing;
 *   - bad inputs give INVALID_ARGUMENT and modify nothing;
 *   - in_proj with the decode front (gdp_gemm_decode_front) equals the GEMM and the front called
 *     in order, bit for bit; its refusals (an unknown GDP_GEMM_FRONT, NULL, a prepare not reading
 *     the conv's output, mismatched channels) write nothing.
 */
#include <string.h>

#include "backend.h"     /* gdp_gemm_nt_ex */
#include "decode_core.h" /* gdp_gemm_decode_front, gdp_decode_conv_prepare */
#include "internal.h"    /* defines: gdp_tensor_get/set */
#include "test_common.h"

static void golden(gdp_ctx_t ctx) {
    gdp_st_file *f = test_golden_open("conv_varlen.safetensors");
    if (f == NULL)
        return;
    gdp_tensor x, weight, state0, state_ref, idx, cu, y_ref;
    bool ok = test_st_tensor(f, "x", &x) && test_st_tensor(f, "weight", &weight) &&
              test_st_tensor(f, "conv_state", &state0) && test_st_tensor(f, "conv_state_after_ref", &state_ref) &&
              test_st_tensor(f, "state_indices", &idx) && test_st_tensor(f, "cu_seqlens", &cu) &&
              test_st_tensor(f, "y_ref", &y_ref);
    const int64_t width = (int64_t)test_st_meta_num(f, "width", 0);
    gdp_st_close(f);
    if (!ok)
        return;
    CHECK(width == weight.shape[1], "metadata width %lld vs weight [%lld, %lld]", (long long)width,
          (long long)weight.shape[0], (long long)weight.shape[1]);
    const int64_t T = x.shape[0], C = x.shape[1], N = cu.shape[0] - 1;
    const int32_t *cuv = cu.data;

    /* y in x's dtype (bf16), as the layer runs it. */
    gdp_tensor state = test_copy_as(&state0, state0.dtype);
    gdp_tensor y16 = test_tensor_alloc(GDP_DTYPE_BF16, 2, x.shape);
    test_fill_nan(&y16);
    gdp_conv1d_varlen_args a = {.x = x, .weight = weight, .conv_state = state, .state_indices = idx,
                                .cu_seqlens = cu, .silu = 1, .y = y16};
    CHECK_OK(gdp_causal_conv1d_varlen(ctx, &a));
    int64_t worst = 0;
    for (int64_t i = 0; i < T * C; i++) {
        const int64_t d = test_bf16_ulp_distance(((uint16_t *)y16.data)[i], gdp_double_to_bf16(gdp_tensor_get(&y_ref, i)));
        worst = d > worst ? d : worst;
    }
    CHECK(worst <= 1, "conv_varlen: bf16 y is %lld bf16 ulp from y_ref (bar 1)", (long long)worst);
    CHECK(memcmp(state.data, state_ref.data, test_tensor_bytes(&state)) == 0,
          "conv_varlen: conv_state after the call differs from conv_state_after_ref");
    int64_t tail_nonzero = 0;
    for (int64_t i = (int64_t)cuv[N] * C; i < T * C; i++)
        tail_nonzero += gdp_tensor_get(&y16, i) != 0.0;
    CHECK(tail_nonzero == 0, "conv_varlen: %lld padding outputs past cu_seqlens[N] are not 0", (long long)tail_nonzero);
    printf("conv_varlen (T=%lld, C=%lld, W=%lld, %lld requests): bf16 y within %lld bf16 ulp of y_ref, %lld "
           "padding rows 0, conv_state bitwise equal to conv_state_after_ref\n",
           (long long)T, (long long)C, (long long)width, (long long)N, (long long)worst,
           (long long)(T - cuv[N]));

    /* y in fp32 from the same starting state. */
    free(state.data);
    state = test_copy_as(&state0, state0.dtype);
    gdp_tensor y32 = test_tensor_alloc(GDP_DTYPE_FP32, 2, x.shape);
    test_fill_nan(&y32);
    a.conv_state = state;
    a.y = y32;
    CHECK_OK(gdp_causal_conv1d_varlen(ctx, &a));
    double *yd = test_tensor_f64(&y32), *yr = test_tensor_f64(&y_ref);
    test_compare("conv_varlen fp32 y", yd, yr, T * C, 1e-6, 0, 1e-6);
    printf("conv_varlen: fp32 y relative RMS %.2e vs y_ref (elementwise rtol 1e-6)\n", test_rel_rms(yd, yr, T * C));
    CHECK(memcmp(state.data, state_ref.data, test_tensor_bytes(&state)) == 0,
          "conv_varlen: conv_state after the fp32-y run differs from conv_state_after_ref");
    free(yd); free(yr);
    free(x.data); free(weight.data); free(state0.data); free(state_ref.data); free(idx.data); free(cu.data);
    free(y_ref.data); free(state.data); free(y16.data); free(y32.data);
}

/* Random conv problem: B requests of S tokens, C channels, width W, `slots` slots. */
typedef struct conv_problem {
    int64_t B, S, C, W, slots;
    gdp_tensor x, weight, bias, state; /* x [B, S, C]; state [slots, C, W] */
    int32_t idx[8];
} conv_problem;

static conv_problem make_problem(test_rng *r, int64_t B, int64_t S, int64_t C, int64_t W, int64_t slots, bool bias,
                                 const int32_t *idx) {
    conv_problem p = {.B = B, .S = S, .C = C, .W = W, .slots = slots};
    const int64_t xs[3] = {B, S, C}, ws[2] = {C, W}, bs[1] = {C}, ss[3] = {slots, C, W};
    p.x = test_tensor_alloc(GDP_DTYPE_FP32, 3, xs);
    p.weight = test_tensor_alloc(GDP_DTYPE_FP32, 2, ws);
    p.state = test_tensor_alloc(GDP_DTYPE_FP32, 3, ss);
    test_fill_uniform(&p.x, r, -2, 2);
    test_fill_uniform(&p.weight, r, -1, 1);
    test_fill_uniform(&p.state, r, -2, 2);
    if (bias) {
        p.bias = test_tensor_alloc(GDP_DTYPE_FP32, 1, bs);
        test_fill_uniform(&p.bias, r, -0.5, 0.5);
    }
    memcpy(p.idx, idx, (size_t)B * sizeof *idx);
    return p;
}

static void free_problem(conv_problem *p) {
    free(p->x.data);
    free(p->weight.data);
    free(p->bias.data);
    free(p->state.data);
}

static gdp_tensor idx_tensor(int32_t *idx, int64_t n) {
    gdp_tensor t;
    const int64_t shape[1] = {n};
    gdp_tensor_init(&t, idx, GDP_DTYPE_INT32, 1, shape);
    return t;
}

/* update(S tokens) == varlen(same tokens, cu = 0, S, 2S, ...) from the same state. */
static void update_vs_varlen(gdp_ctx_t ctx, test_rng *r, int64_t W, bool bias) {
    const int32_t idx[3] = {2, 0, 4};
    conv_problem p = make_problem(r, 3, 3, 6, W, 5, bias, idx);
    gdp_tensor su = test_copy_as(&p.state, GDP_DTYPE_FP32), sv = test_copy_as(&p.state, GDP_DTYPE_FP32);
    gdp_tensor yu = test_tensor_alloc(GDP_DTYPE_FP32, 3, p.x.shape);
    const int64_t flat[2] = {p.B * p.S, p.C};
    gdp_tensor yv = test_tensor_alloc(GDP_DTYPE_FP32, 2, flat), xv = p.x;
    xv.ndim = 2;
    xv.shape[0] = flat[0];
    xv.shape[1] = flat[1];
    xv.shape[2] = 0;
    int32_t cu[4] = {0, 3, 6, 9};
    const int64_t cu_shape[1] = {4};
    gdp_tensor cut;
    gdp_tensor_init(&cut, cu, GDP_DTYPE_INT32, 1, cu_shape);
    gdp_conv1d_update_args u = {.x = p.x, .weight = p.weight, .bias = p.bias, .conv_state = su,
                                .conv_state_indices = idx_tensor(p.idx, p.B), .silu = 1, .y = yu};
    gdp_conv1d_varlen_args v = {.x = xv, .weight = p.weight, .bias = p.bias, .conv_state = sv,
                                .state_indices = idx_tensor(p.idx, p.B), .cu_seqlens = cut, .silu = 1, .y = yv};
    CHECK_OK(gdp_causal_conv1d_update(ctx, &u));
    CHECK_OK(gdp_causal_conv1d_varlen(ctx, &v));
    CHECK(memcmp(yu.data, yv.data, test_tensor_bytes(&yu)) == 0, "W=%lld bias=%d: update y differs from varlen y",
          (long long)W, bias);
    CHECK(memcmp(su.data, sv.data, test_tensor_bytes(&su)) == 0,
          "W=%lld bias=%d: update state differs from varlen state", (long long)W, bias);
    CHECK(memcmp(su.data, p.state.data, test_tensor_bytes(&su)) != 0, "W=%lld: the update changed no state",
          (long long)W);
    printf("update of %lld tokens == varlen over the same tokens (W=%lld, bias %s): y and state bitwise\n",
           (long long)p.S, (long long)W, bias ? "on" : "off");
    free(su.data); free(sv.data); free(yu.data); free(yv.data);
    free_problem(&p);
}

/* One update of S tokens with snapshots vs S updates of one token each. */
static void intermediate_rows(gdp_ctx_t ctx, test_rng *r) {
    const int32_t idx[3] = {3, -1, 1};
    conv_problem p = make_problem(r, 3, 4, 5, 4, 5, true, idx);
    const int64_t B = p.B, S = p.S, C = p.C, W = p.W;
    gdp_tensor s_all = test_copy_as(&p.state, GDP_DTYPE_FP32), s_step = test_copy_as(&p.state, GDP_DTYPE_FP32);
    const int64_t ishape[4] = {p.slots, S, C, W};
    gdp_tensor inter = test_tensor_alloc(GDP_DTYPE_FP32, 4, ishape);
    test_fill_nan(&inter); /* untouched rows must stay NaN */
    gdp_tensor y_all = test_tensor_alloc(GDP_DTYPE_FP32, 3, p.x.shape);
    test_fill_nan(&y_all);
    gdp_conv1d_update_args u = {.x = p.x, .weight = p.weight, .bias = p.bias, .conv_state = s_all,
                                .conv_state_indices = idx_tensor(p.idx, B), .intermediate_conv_states = inter,
                                .silu = 1, .y = y_all};
    CHECK_OK(gdp_causal_conv1d_update(ctx, &u));

    /* Token by token: x viewed as [B, 1, C] rows with stride S*C (a strided row view). */
    const int64_t y1s[3] = {B, 1, C};
    gdp_tensor y1 = test_tensor_alloc(GDP_DTYPE_FP32, 3, y1s);
    int64_t bad_inter = 0, bad_y = 0;
    for (int64_t s = 0; s < S; s++) {
        gdp_tensor xs = p.x;
        xs.data = (float *)p.x.data + s * C;
        xs.shape[1] = 1;
        xs.stride[0] = S * C;
        xs.stride[1] = C;
        xs.stride[2] = 1;
        gdp_conv1d_update_args one = {.x = xs, .weight = p.weight, .bias = p.bias, .conv_state = s_step,
                                      .conv_state_indices = idx_tensor(p.idx, B), .silu = 1, .y = y1};
        CHECK_OK(gdp_causal_conv1d_update(ctx, &one));
        for (int64_t b = 0; b < B; b++) {
            bad_y += memcmp((float *)y1.data + b * C, (float *)y_all.data + (b * S + s) * C, (size_t)C * 4) != 0;
            if (p.idx[b] < 0)
                continue;
            bad_inter += memcmp((float *)inter.data + ((p.idx[b] * S + s) * C) * W,
                                (float *)s_step.data + p.idx[b] * C * W, (size_t)(C * W) * 4) != 0;
        }
    }
    CHECK(bad_y == 0, "%lld (request, token) outputs of one S-token update differ from single-token updates",
          (long long)bad_y);
    CHECK(bad_inter == 0, "%lld intermediate_conv_states rows differ from the state after that token",
          (long long)bad_inter);
    CHECK(memcmp(s_all.data, s_step.data, test_tensor_bytes(&s_all)) == 0,
          "the final state of one S-token update differs from S single-token updates");
    /* Rows of slots nobody names (0, 2, 4) keep their NaN. */
    int64_t touched = 0;
    for (int64_t slot = 0; slot < p.slots; slot++) {
        if (slot == 3 || slot == 1)
            continue;
        for (int64_t i = 0; i < S * C * W; i++)
            touched += !isnan(((float *)inter.data)[slot * S * C * W + i]);
    }
    CHECK(touched == 0, "%lld intermediate_conv_states elements of unnamed slots were written", (long long)touched);
    printf("intermediate_conv_states [slots, %lld, %lld, %lld]: row [slot, s] == state after token s, unnamed rows "
           "untouched, one %lld-token update == %lld single-token updates\n",
           (long long)S, (long long)C, (long long)W, (long long)S, (long long)S);
    free(s_all.data); free(s_step.data); free(inter.data); free(y_all.data); free(y1.data);
    free_problem(&p);
}

static void padding_rows(gdp_ctx_t ctx, test_rng *r) {
    /* Update: a -1 row writes y = 0 and leaves every slot it could name alone. */
    const int32_t idx[2] = {-1, 2};
    conv_problem p = make_problem(r, 2, 2, 4, 4, 4, false, idx);
    gdp_tensor state = test_copy_as(&p.state, GDP_DTYPE_FP32);
    gdp_tensor y = test_tensor_alloc(GDP_DTYPE_FP32, 3, p.x.shape);
    test_fill_nan(&y);
    gdp_conv1d_update_args u = {.x = p.x, .weight = p.weight, .conv_state = state,
                                .conv_state_indices = idx_tensor(p.idx, 2), .silu = 1, .y = y};
    CHECK_OK(gdp_causal_conv1d_update(ctx, &u));
    int64_t nonzero = 0;
    for (int64_t i = 0; i < p.S * p.C; i++)
        nonzero += ((float *)y.data)[i] != 0.0f;
    CHECK(nonzero == 0, "update: %lld outputs of the -1 row are not 0", (long long)nonzero);
    const int64_t per = p.C * p.W;
    for (int64_t s = 0; s < p.slots; s++)
        if (s != 2)
            CHECK(memcmp((float *)state.data + s * per, (float *)p.state.data + s * per, (size_t)per * 4) == 0,
                  "update with a -1 row changed slot %lld", (long long)s);

    /* Varlen: request 0 (-1) vs the same tokens from a zeroed slot 3. */
    const int64_t flat[2] = {p.B * p.S, p.C};
    gdp_tensor xv = p.x;
    xv.ndim = 2;
    xv.shape[0] = flat[0];
    xv.shape[1] = flat[1];
    int32_t cu[3] = {0, 2, 4};
    const int64_t cu_shape[1] = {3};
    gdp_tensor cut;
    gdp_tensor_init(&cut, cu, GDP_DTYPE_INT32, 1, cu_shape);
    gdp_tensor s_pad = test_copy_as(&p.state, GDP_DTYPE_FP32), s_zero = test_copy_as(&p.state, GDP_DTYPE_FP32);
    memset((float *)s_zero.data + 3 * per, 0, (size_t)per * 4);
    gdp_tensor y_pad = test_tensor_alloc(GDP_DTYPE_FP32, 2, flat), y_zero = test_tensor_alloc(GDP_DTYPE_FP32, 2, flat);
    int32_t with_pad[2] = {-1, 2}, with_zero[2] = {3, 2};
    gdp_conv1d_varlen_args v = {.x = xv, .weight = p.weight, .conv_state = s_pad,
                                .state_indices = idx_tensor(with_pad, 2), .cu_seqlens = cut, .silu = 1, .y = y_pad};
    CHECK_OK(gdp_causal_conv1d_varlen(ctx, &v));
    v.conv_state = s_zero;
    v.state_indices = idx_tensor(with_zero, 2);
    v.y = y_zero;
    CHECK_OK(gdp_causal_conv1d_varlen(ctx, &v));
    CHECK(memcmp(y_pad.data, y_zero.data, test_tensor_bytes(&y_pad)) == 0,
          "varlen: a -1 request's y differs from the same request from a zeroed slot");
    for (int64_t s = 0; s < p.slots; s++)
        if (s != 2)
            CHECK(memcmp((float *)s_pad.data + s * per, (float *)p.state.data + s * per, (size_t)per * 4) == 0,
                  "varlen with a -1 request changed slot %lld", (long long)s);
    printf("-1 rows: update gives y = 0 and touches no slot; a -1 varlen request runs from a zero window and "
           "writes no slot\n");
    free(state.data); free(y.data); free(s_pad.data); free(s_zero.data); free(y_pad.data); free(y_zero.data);
    free_problem(&p);
}

/* Runs a call expected to give INVALID_ARGUMENT; checks y and the state did not change. */
#define EXPECT_REJECTED(call, y, state, what)                                                               \
    do {                                                                                                    \
        void *yb_ = malloc(test_tensor_bytes(&(y))), *sb_ = malloc(test_tensor_bytes(&(state)));           \
        memcpy(yb_, (y).data, test_tensor_bytes(&(y)));                                                     \
        memcpy(sb_, (state).data, test_tensor_bytes(&(state)));                                             \
        CHECK_STATUS(call, GDP_STATUS_INVALID_ARGUMENT);                                                    \
        printf("  rejected %s: %s\n", what, gdp_last_error());                                              \
        CHECK(memcmp(yb_, (y).data, test_tensor_bytes(&(y))) == 0 &&                                        \
                  memcmp(sb_, (state).data, test_tensor_bytes(&(state))) == 0,                              \
              "%s: y or conv_state was modified", what);                                                    \
        free(yb_);                                                                                          \
        free(sb_);                                                                                          \
    } while (0)

static void bad_inputs(gdp_ctx_t ctx, test_rng *r) {
    printf("bad inputs:\n");
    const int32_t idx[3] = {0, 2, 1};
    conv_problem p = make_problem(r, 3, 2, 4, 4, 3, true, idx);
    gdp_tensor y = test_tensor_alloc(GDP_DTYPE_FP32, 3, p.x.shape);
    test_fill_nan(&y);
    int32_t sidx[3];
    memcpy(sidx, idx, sizeof sidx);
    const gdp_conv1d_update_args good = {.x = p.x, .weight = p.weight, .bias = p.bias, .conv_state = p.state,
                                         .conv_state_indices = idx_tensor(sidx, 3), .silu = 1, .y = y};
    gdp_conv1d_update_args u = good;
    u.weight.shape[1] = 1;
    EXPECT_REJECTED(gdp_causal_conv1d_update(ctx, &u), y, p.state, "weight of width 1");
    u = good;
    u.conv_state.shape[2] = 2;
    EXPECT_REJECTED(gdp_causal_conv1d_update(ctx, &u), y, p.state, "conv_state narrower than the weight");
    u = good;
    u.y.shape[1] = 1;
    EXPECT_REJECTED(gdp_causal_conv1d_update(ctx, &u), y, p.state, "y of the wrong shape");
    u = good;
    u.bias.shape[0] = p.C - 1;
    EXPECT_REJECTED(gdp_causal_conv1d_update(ctx, &u), y, p.state, "bias of the wrong length");
    u = good;
    sidx[2] = 3;
    EXPECT_REJECTED(gdp_causal_conv1d_update(ctx, &u), y, p.state, "a slot == slots");
    sidx[2] = 0;
    EXPECT_REJECTED(gdp_causal_conv1d_update(ctx, &u), y, p.state, "two requests naming slot 0");
    memcpy(sidx, idx, sizeof sidx);
    u = good;
    u.conv_state_indices = (gdp_tensor){0};
    u.conv_state.shape[0] = 2; /* identity slots need B <= slots */
    EXPECT_REJECTED(gdp_causal_conv1d_update(ctx, &u), y, p.state, "no indices and fewer slots than requests");
    u = good;
    u.x.stride[0] = p.S * p.C * 2;
    u.x.stride[1] = p.C * 2;
    u.x.stride[2] = 2;
    EXPECT_REJECTED(gdp_causal_conv1d_update(ctx, &u), y, p.state, "x with a strided last dim");

    const int64_t flat[2] = {p.B * p.S, p.C};
    gdp_tensor xv = p.x, yv = y;
    xv.ndim = yv.ndim = 2;
    xv.shape[0] = yv.shape[0] = flat[0];
    xv.shape[1] = yv.shape[1] = flat[1];
    int32_t cu[4] = {0, 2, 4, 6};
    const int64_t cu_shape[1] = {4};
    gdp_tensor cut;
    gdp_tensor_init(&cut, cu, GDP_DTYPE_INT32, 1, cu_shape);
    const gdp_conv1d_varlen_args vgood = {.x = xv, .weight = p.weight, .bias = p.bias, .conv_state = p.state,
                                          .state_indices = idx_tensor(sidx, 3), .cu_seqlens = cut, .silu = 1,
                                          .y = yv};
    gdp_conv1d_varlen_args v = vgood;
    cu[2] = 1; /* 0, 2, 1, 6 */
    EXPECT_REJECTED(gdp_causal_conv1d_varlen(ctx, &v), y, p.state, "decreasing cu_seqlens");
    cu[2] = 4;
    cu[3] = 7;
    EXPECT_REJECTED(gdp_causal_conv1d_varlen(ctx, &v), y, p.state, "cu_seqlens[N] past the rows of x");
    cu[3] = 6;
    cu[0] = 1;
    EXPECT_REJECTED(gdp_causal_conv1d_varlen(ctx, &v), y, p.state, "cu_seqlens[0] != 0");
    cu[0] = 0;
    sidx[0] = -3;
    EXPECT_REJECTED(gdp_causal_conv1d_varlen(ctx, &v), y, p.state, "a slot of -3");
    sidx[0] = 0;
    v.cu_seqlens.shape[0] = 3; /* 2 requests, 3 indices */
    EXPECT_REJECTED(gdp_causal_conv1d_varlen(ctx, &v), y, p.state, "state_indices longer than the requests");
    v = vgood;
    v.weight.shape[1] = 9;
    EXPECT_REJECTED(gdp_causal_conv1d_varlen(ctx, &v), y, p.state, "weight of width 9");
    CHECK_OK(gdp_causal_conv1d_varlen(ctx, &vgood)); /* the unbroken call still works */
    free(y.data);
    free_problem(&p);
}

/* in_proj with the decode front (gdp_gemm_decode_front, src/decode_core.h) on the CPU: the GEMM and
 * the front in order (the CPU has no one launch), on the layer's layout (conv->x and prep->ba column
 * views of C); equal bit for bit to calling the two ops; never reported as fused; an unknown
 * GDP_GEMM_FRONT, NULL arguments and a prepare not reading the conv's output are refused with
 * nothing written. */
typedef struct gemm_front_bufs {
    gdp_tensor A, B, C, st, w, b, A_log, dtb, idx, y, q, k, v, beta, g;
    gdp_conv1d_update_args cu;
    gdp_prepare_args pr;
    gdp_gemm_front_args args;
} gemm_front_bufs;

enum { GF_ROWS = 3, GF_M = 2, GF_H = 4, GF_G = 2, GF_P = 8, GF_N = 8, GF_Z = 4, GF_K = 16, GF_SLOTS = 4 };

static void gemm_front_bufs_make(gemm_front_bufs *t, uint64_t seed) {
    test_rng r;
    test_rng_seed(&r, seed);
    const int64_t C = GF_M * GF_H * GF_P + (GF_M + 1) * GF_G * GF_N, BA = (GF_M + 1) * GF_H, n = GF_Z + C + BA;
    const int64_t ldc = n + 2, E = GF_M, f = GDP_DTYPE_FP32;
    t->A = test_tensor_alloc(f, 2, (const int64_t[]){GF_ROWS, GF_K});
    t->B = test_tensor_alloc(f, 2, (const int64_t[]){n, GF_K});
    t->C = test_tensor_alloc(f, 2, (const int64_t[]){GF_ROWS, ldc});
    t->st = test_tensor_alloc(f, 3, (const int64_t[]){GF_SLOTS, C, 4});
    t->w = test_tensor_alloc(f, 2, (const int64_t[]){C, 4});
    t->b = test_tensor_alloc(f, 1, (const int64_t[]){C});
    t->A_log = test_tensor_alloc(f, 1, (const int64_t[]){GF_H});
    t->dtb = test_tensor_alloc(f, 1, (const int64_t[]){GF_H});
    t->y = test_tensor_alloc(f, 3, (const int64_t[]){GF_ROWS, 1, C});
    t->q = test_tensor_alloc(f, 4, (const int64_t[]){GF_ROWS, E, GF_H, GF_N});
    t->k = test_tensor_alloc(f, 4, (const int64_t[]){GF_ROWS, E, GF_H, GF_N});
    t->v = test_tensor_alloc(f, 4, (const int64_t[]){GF_ROWS, E, GF_H, GF_P});
    t->beta = test_tensor_alloc(f, 3, (const int64_t[]){GF_ROWS, E, GF_H});
    t->g = test_tensor_alloc(f, 3, (const int64_t[]){GF_ROWS, E, GF_H});
    test_fill_normal(&t->A, &r, 1.0), test_fill_normal(&t->B, &r, 0.25), test_fill_normal(&t->st, &r, 1.0);
    test_fill_normal(&t->w, &r, 0.5), test_fill_normal(&t->b, &r, 0.1);
    test_fill_uniform(&t->A_log, &r, -1.0, 1.0), test_fill_uniform(&t->dtb, &r, -0.5, 0.5);
    gdp_tensor *outs[7] = {&t->C, &t->y, &t->q, &t->k, &t->v, &t->beta, &t->g};
    for (int i = 0; i < 7; i++)
        test_fill_nan(outs[i]);
    static const int32_t slots[GF_ROWS] = {2, -1, 0}; /* a padding row between two requests */
    t->idx = test_int_tensor(slots, GF_ROWS);
    float *c0 = t->C.data;
    t->cu = (gdp_conv1d_update_args){
        .x = {.data = c0 + GF_Z, .dtype = GDP_DTYPE_FP32, .ndim = 3, .shape = {GF_ROWS, 1, C}, .stride = {ldc, ldc, 1}},
        .weight = t->w, .bias = t->b, .conv_state = t->st, .conv_state_indices = t->idx, .silu = 1, .y = t->y};
    t->pr = (gdp_prepare_args){
        .x = t->y,
        .ba = {.data = c0 + GF_Z + C, .dtype = GDP_DTYPE_FP32, .ndim = 3, .shape = {GF_ROWS, 1, BA},
               .stride = {ldc, ldc, 1}},
        .A_log = t->A_log, .dt_bias = t->dtb, .num_householder = GF_M, .num_heads = GF_H, .num_groups = GF_G,
        .head_dim = GF_P, .state_dim = GF_N, .query = t->q, .key = t->k, .value = t->v, .beta = t->beta, .g = t->g};
    t->args = (gdp_gemm_front_args){.rows = GF_ROWS, .n = n, .k = GF_K, .A = t->A.data, .lda = GF_K, .B = t->B.data,
                                    .ab_dtype = GDP_DTYPE_FP32, .C = t->C.data, .ldc = ldc, .conv = &t->cu,
                                    .prep = &t->pr};
}

static void gemm_front_bufs_free(gemm_front_bufs *t) {
    gdp_tensor *all[15] = {&t->A, &t->B, &t->C, &t->st, &t->w, &t->b, &t->A_log, &t->dtb, &t->idx,
                           &t->y, &t->q, &t->k, &t->v, &t->beta, &t->g};
    for (int i = 0; i < 15; i++)
        test_host_free(all[i]);
}

/* Whether every output of two runs (C, the cache, q, k, v, beta, g) has the same bytes. */
static void gemm_front_same(const char *what, const gemm_front_bufs *a, const gemm_front_bufs *b) {
    const gdp_tensor *x[7] = {&a->C, &a->st, &a->q, &a->k, &a->v, &a->beta, &a->g};
    const gdp_tensor *y[7] = {&b->C, &b->st, &b->q, &b->k, &b->v, &b->beta, &b->g};
    static const char *const names[7] = {"C", "conv state", "query", "key", "value", "beta", "g"};
    char label[96];
    for (int i = 0; i < 7; i++) {
        snprintf(label, sizeof label, "%s: %s", what, names[i]);
        test_same_bytes(label, x[i], y[i]);
    }
}

static void gemm_front_cpu(gdp_ctx_t ctx) {
    gemm_front_bufs one, two, bad;
    gemm_front_bufs_make(&one, 7), gemm_front_bufs_make(&two, 7), gemm_front_bufs_make(&bad, 7);
    CHECK(!gdp_gemm_decode_front_fuses(ctx, &one.args), "the CPU has no one launch for in_proj + the front");
    CHECK_OK(gdp_gemm_decode_front(ctx, &one.args));
    CHECK_OK(gdp_gemm_nt_ex(ctx, two.args.rows, two.args.n, two.args.k, two.args.A, two.args.lda, two.args.B,
                            GDP_DTYPE_FP32, 0.0f, two.args.C, two.args.ldc, GDP_DTYPE_FP32));
    CHECK_OK(gdp_decode_conv_prepare(ctx, &two.cu, &two.pr));
    gemm_front_same("gdp_gemm_decode_front vs the GEMM and the front", &one, &two);
    /* refusals, each with nothing written (bad is still as made: compare with a fresh copy) */
    gemm_front_bufs fresh;
    gemm_front_bufs_make(&fresh, 7);
    char *saved = test_env_swap("GDP_GEMM_FRONT", "sideways");
    CHECK_STATUS(gdp_gemm_decode_front(ctx, &bad.args), GDP_STATUS_INVALID_USAGE);
    CHECK(strstr(gdp_last_error(), "GDP_GEMM_FRONT") != NULL && strstr(gdp_last_error(), "sideways") != NULL,
          "the GDP_GEMM_FRONT refusal names neither the variable nor its value: %s", gdp_last_error());
    test_env_restore("GDP_GEMM_FRONT", saved);
    CHECK_STATUS(gdp_gemm_decode_front(ctx, NULL), GDP_STATUS_INVALID_ARGUMENT);
    bad.pr.x = bad.q; /* the prepare must read the conv's output */
    CHECK_STATUS(gdp_gemm_decode_front(ctx, &bad.args), GDP_STATUS_INVALID_ARGUMENT);
    bad.pr.x = bad.y;
    bad.cu.x.shape[2] -= 1; /* a conv whose channels do not match its weight */
    CHECK(gdp_gemm_decode_front(ctx, &bad.args) != GDP_STATUS_SUCCESS, "a conv of %lld channels over weights of %lld",
          (long long)bad.cu.x.shape[2], (long long)bad.w.shape[0]);
    gemm_front_same("refused gdp_gemm_decode_front calls wrote nothing", &bad, &fresh);
    gemm_front_bufs_free(&one), gemm_front_bufs_free(&two), gemm_front_bufs_free(&bad), gemm_front_bufs_free(&fresh);
}

int main(void) {
    gdp_ctx_t ctx = NULL;
    CHECK_OK(gdp_ctx_init(&ctx, GDP_BACKEND_CPU, 0));
    test_rng rng;
    test_rng_seed(&rng, 20260901);
    golden(ctx);
    const int64_t widths[3] = {2, 4, 8};
    for (int i = 0; i < 3; i++) {
        update_vs_varlen(ctx, &rng, widths[i], false);
        update_vs_varlen(ctx, &rng, widths[i], true);
    }
    intermediate_rows(ctx, &rng);
    padding_rows(ctx, &rng);
    bad_inputs(ctx, &rng);
    gemm_front_cpu(ctx);
    gdp_ctx_free(ctx);
    return test_finish("test_conv1d_cpu");
}
