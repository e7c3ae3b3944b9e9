/*
 * test_recurrent_cpu.c: the CPU reference of gdp_fused_recurrent_gated_delta_rule_update.
 *   - the three decode_*.safetensors golden files (float64 recurrence): o, the cache after
 *     the call and the intermediate states within atol = rtol = 1e-3 and relative RMS
 *     < 1e-5; slots no request names bitwise unchanged; -1 rows exactly 0; a bf16 o
 *     within the same bar or one bf16 ulp;
 *   - state_indices absent == identity slots, bitwise;
 *   - dense mode (initial_state gathered from the slots, output_final_state) agrees
 *     bitwise with cache mode;
 *   - a bf16 cache: o bitwise equal to an fp32 cache holding the same values, states
 *     within one bf16 ulp of the fp32 cache's results;
 *   - bad inputs (steps_per_token not dividing T, cu_seqlens given, a slot named twice,
 *     a slot out of range, ...) give INVALID_ARGUMENT and modify nothing.
 */
#include <string.h>

#include "internal.h" /* defines: gdp_tensor_get/set */
#include "test_common.h"

/* One golden case: inputs, references and scalars from the metadata. */
typedef struct dec_case {
    char name[96];
    gdp_tensor q, k, v, g, beta, state, state_indices;
    gdp_tensor o_ref, state_after_ref, inter_ref;
    int32_t M, S, l2norm;
    double scale;
} dec_case;

static void free_case(dec_case *c) {
    gdp_tensor *all[] = {&c->q, &c->k, &c->v, &c->g, &c->beta, &c->state, &c->state_indices,
                         &c->o_ref, &c->state_after_ref, &c->inter_ref};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        free(all[i]->data);
}

static bool load_case(const char *file, dec_case *c) {
    memset(c, 0, sizeof *c);
    snprintf(c->name, sizeof c->name, "%s", file);
    gdp_st_file *f = test_golden_open(file);
    if (f == NULL)
        return false;
    c->M = (int32_t)test_st_meta_num(f, "num_householder", 0);
    c->S = (int32_t)test_st_meta_num(f, "tokens_per_request", 0);
    c->scale = test_st_meta_num(f, "scale", 0);
    c->l2norm = (int32_t)test_st_meta_num(f, "use_qk_l2norm_in_kernel", 0);
    bool ok = test_st_tensor(f, "q", &c->q) && test_st_tensor(f, "k", &c->k) && test_st_tensor(f, "v", &c->v) &&
              test_st_tensor(f, "g", &c->g) && test_st_tensor(f, "beta", &c->beta) &&
              test_st_tensor(f, "state", &c->state) && test_st_tensor(f, "state_indices", &c->state_indices) &&
              test_st_tensor(f, "o_ref", &c->o_ref) && test_st_tensor(f, "state_after_ref", &c->state_after_ref) &&
              test_st_tensor(f, "intermediate_states_ref", &c->inter_ref);
    gdp_st_close(f);
    CHECK(c->M >= 1 && c->S >= 1 && c->scale > 0, "%s: metadata M=%d S=%d scale=%g", file, c->M, c->S, c->scale);
    return ok;
}

/* Cache-mode arguments over the case's inputs; state, intermediate and o are the caller's. */
static gdp_recurrent_args cache_args(const dec_case *c, gdp_tensor state, gdp_tensor inter, gdp_tensor o) {
    gdp_recurrent_args a = {.q = c->q, .k = c->k, .v = c->v, .g = c->g, .beta = c->beta, .scale = c->scale,
                            .use_qk_l2norm_in_kernel = c->l2norm, .state = state,
                            .state_indices = c->state_indices, .intermediate_states = inter,
                            .steps_per_token = c->M, .o = o};
    return a;
}

static int64_t slot_of(const dec_case *c, int64_t b) { return ((const int32_t *)c->state_indices.data)[b]; }

static bool slot_named(const dec_case *c, int64_t s) {
    for (int64_t b = 0; b < c->q.shape[0]; b++)
        if (slot_of(c, b) == s)
            return true;
    return false;
}

/* bf16 RNE of x, through the library's own conversion. */
static double bf16_round(double x) { return gdp_bf16_to_float(gdp_double_to_bf16(x)); }
static double bf16_ulp(double x) {
    int e;
    frexp(x == 0 ? 1e-38 : x, &e); /* |x| in [2^(e-1), 2^e) */
    return ldexp(1.0, e - 1 - 7);
}

static void golden_case(gdp_ctx_t ctx, const char *file) {
    dec_case c;
    if (!load_case(file, &c)) {
        free_case(&c);
        return;
    }
    const int64_t B = c.q.shape[0], T = c.q.shape[1], H = c.q.shape[2], V = c.v.shape[3];
    const int64_t slots = c.state.shape[0], slot_elems = gdp_tensor_numel(&c.state) / slots;
    CHECK(T == (int64_t)c.S * c.M, "%s: T = %lld is not S*M = %d*%d", file, (long long)T, c.S, c.M);

    gdp_tensor state = test_copy_as(&c.state, GDP_DTYPE_FP32);
    gdp_tensor inter = test_tensor_alloc(GDP_DTYPE_FP32, c.inter_ref.ndim, c.inter_ref.shape); /* zero-filled */
    gdp_tensor o = test_tensor_alloc(GDP_DTYPE_FP32, c.o_ref.ndim, c.o_ref.shape);
    test_fill_nan(&o); /* so that rows the op leaves unwritten fail */
    gdp_recurrent_args a = cache_args(&c, state, inter, o);
    CHECK_OK(gdp_fused_recurrent_gated_delta_rule_update(ctx, &a));

    char what[160];
    double *od = test_tensor_f64(&o), *oref = test_tensor_f64(&c.o_ref);
    snprintf(what, sizeof what, "%s o", file);
    test_compare(what, od, oref, gdp_tensor_numel(&o), 1e-5, 1e-3, 1e-3);
    printf("%s: o relative RMS %.2e vs the float64 reference\n", file, test_rel_rms(od, oref, gdp_tensor_numel(&o)));
    double *sd = test_tensor_f64(&state), *sref = test_tensor_f64(&c.state_after_ref);
    snprintf(what, sizeof what, "%s state after", file);
    test_compare(what, sd, sref, gdp_tensor_numel(&state), 1e-5, 1e-3, 1e-3);
    printf("%s: state relative RMS %.2e\n", file, test_rel_rms(sd, sref, gdp_tensor_numel(&state)));
    double *id = test_tensor_f64(&inter), *iref = test_tensor_f64(&c.inter_ref);
    snprintf(what, sizeof what, "%s intermediate_states", file);
    test_compare(what, id, iref, gdp_tensor_numel(&inter), 1e-5, 1e-3, 1e-3);
    printf("%s: intermediate_states relative RMS %.2e\n", file, test_rel_rms(id, iref, gdp_tensor_numel(&inter)));

    /* Unnamed slots bitwise unchanged, -1 rows exactly 0. */
    int unnamed = 0, pad_rows = 0;
    for (int64_t s = 0; s < slots; s++) {
        if (slot_named(&c, s))
            continue;
        unnamed++;
        CHECK(memcmp((float *)state.data + s * slot_elems, (float *)c.state.data + s * slot_elems,
                     (size_t)slot_elems * sizeof(float)) == 0,
              "%s: slot %lld is named by no request but changed", file, (long long)s);
    }
    for (int64_t b = 0; b < B; b++) {
        if (slot_of(&c, b) != -1)
            continue;
        pad_rows++;
        int64_t nonzero = 0;
        for (int64_t i = 0; i < T * H * V; i++)
            nonzero += ((float *)o.data)[b * T * H * V + i] != 0.0f;
        CHECK(nonzero == 0, "%s: -1 row %lld has %lld non-zero outputs", file, (long long)b, (long long)nonzero);
    }
    printf("%s: %d unnamed slots bitwise unchanged, %d padding rows exactly 0\n", file, unnamed, pad_rows);

    /* o in v's dtype (bf16), from the same starting cache: the bar or one bf16 ulp. */
    gdp_tensor state2 = test_copy_as(&c.state, GDP_DTYPE_FP32);
    gdp_tensor o16 = test_tensor_alloc(GDP_DTYPE_BF16, c.o_ref.ndim, c.o_ref.shape);
    a = cache_args(&c, state2, (gdp_tensor){0}, o16);
    CHECK_OK(gdp_fused_recurrent_gated_delta_rule_update(ctx, &a));
    int64_t bad = 0;
    for (int64_t i = 0; i < gdp_tensor_numel(&o16); i++) {
        const double got = gdp_tensor_get(&o16, i), want = oref[i];
        bad += !(fabs(got - want) <= 1e-3 + 1e-3 * fabs(want) || fabs(got - bf16_round(want)) <= bf16_ulp(want));
    }
    CHECK(bad == 0, "%s: %lld bf16 outputs outside the bar and one bf16 ulp", file, (long long)bad);
    CHECK(memcmp(state2.data, state.data, test_tensor_bytes(&state)) == 0,
          "%s: the cache after a bf16-o run differs from the fp32-o run", file);

    free(od); free(oref); free(sd); free(sref); free(id); free(iref);
    free(state.data); free(inter.data); free(o.data); free(state2.data); free(o16.data);
    free_case(&c);
}

/* With identity slots [0, 1, ..., B-1], state_indices absent must give the same bits. */
static void identity_slots(gdp_ctx_t ctx) {
    dec_case c;
    if (!load_case("decode_m1_k128.safetensors", &c)) {
        free_case(&c);
        return;
    }
    const int64_t B = c.q.shape[0];
    bool identity = true;
    for (int64_t b = 0; b < B; b++)
        identity = identity && slot_of(&c, b) == b;
    CHECK(identity, "decode_m1_k128 no longer has identity slots; pick another case");
    gdp_tensor s1 = test_copy_as(&c.state, GDP_DTYPE_FP32), s2 = test_copy_as(&c.state, GDP_DTYPE_FP32);
    gdp_tensor o1 = test_tensor_alloc(GDP_DTYPE_FP32, c.o_ref.ndim, c.o_ref.shape);
    gdp_tensor o2 = test_tensor_alloc(GDP_DTYPE_FP32, c.o_ref.ndim, c.o_ref.shape);
    gdp_recurrent_args a = cache_args(&c, s1, (gdp_tensor){0}, o1);
    CHECK_OK(gdp_fused_recurrent_gated_delta_rule_update(ctx, &a));
    a = cache_args(&c, s2, (gdp_tensor){0}, o2);
    a.state_indices = (gdp_tensor){0};
    CHECK_OK(gdp_fused_recurrent_gated_delta_rule_update(ctx, &a));
    CHECK(memcmp(o1.data, o2.data, test_tensor_bytes(&o1)) == 0 &&
              memcmp(s1.data, s2.data, test_tensor_bytes(&s1)) == 0,
          "state_indices absent differs from identity slots");
    printf("decode_m1_k128: state_indices absent == identity slots, bitwise\n");
    free(s1.data); free(s2.data); free(o1.data); free(o2.data);
    free_case(&c);
}

/* Dense mode from the gathered slots must reproduce cache mode bit for bit. */
static void dense_vs_cache(gdp_ctx_t ctx) {
    dec_case c;
    if (!load_case("decode_m2_slots_pad.safetensors", &c)) {
        free_case(&c);
        return;
    }
    const int64_t B = c.q.shape[0], T = c.q.shape[1], H = c.q.shape[2], K = c.q.shape[3], V = c.v.shape[3];
    const int64_t per = H * K * V;
    gdp_tensor state = test_copy_as(&c.state, GDP_DTYPE_FP32);
    gdp_tensor oc = test_tensor_alloc(GDP_DTYPE_FP32, c.o_ref.ndim, c.o_ref.shape);
    gdp_recurrent_args a = cache_args(&c, state, (gdp_tensor){0}, oc);
    CHECK_OK(gdp_fused_recurrent_gated_delta_rule_update(ctx, &a));

    const int64_t bhkv[4] = {B, H, K, V};
    gdp_tensor init = test_tensor_alloc(GDP_DTYPE_FP32, 4, bhkv), fin = test_tensor_alloc(GDP_DTYPE_FP32, 4, bhkv);
    for (int64_t b = 0; b < B; b++)
        if (slot_of(&c, b) >= 0)
            memcpy((float *)init.data + b * per, (float *)c.state.data + slot_of(&c, b) * per, (size_t)per * 4);
    gdp_tensor od = test_tensor_alloc(GDP_DTYPE_FP32, c.o_ref.ndim, c.o_ref.shape);
    gdp_recurrent_args d = {.q = c.q, .k = c.k, .v = c.v, .g = c.g, .beta = c.beta, .scale = c.scale,
                            .use_qk_l2norm_in_kernel = c.l2norm, .initial_state = init,
                            .output_final_state = 1, .steps_per_token = c.M, .o = od, .final_state = fin};
    CHECK_OK(gdp_fused_recurrent_gated_delta_rule_update(ctx, &d));
    int rows = 0;
    for (int64_t b = 0; b < B; b++) {
        const int64_t s = slot_of(&c, b);
        if (s < 0)
            continue;
        rows++;
        CHECK(memcmp((float *)od.data + b * T * H * V, (float *)oc.data + b * T * H * V, (size_t)(T * H * V) * 4) == 0,
              "dense o of row %lld differs from cache mode", (long long)b);
        CHECK(memcmp((float *)fin.data + b * per, (float *)state.data + s * per, (size_t)per * 4) == 0,
              "dense final_state of row %lld differs from cache slot %lld", (long long)b, (long long)s);
    }
    printf("decode_m2_slots_pad: dense mode (gathered initial_state, output_final_state) == cache mode on %d rows, "
           "bitwise\n",
           rows);
    free(state.data); free(oc.data); free(init.data); free(fin.data); free(od.data);
    free_case(&c);
}

/* A bf16 cache: start from the golden cache rounded to bf16, once as bf16 and once as fp32
 * holding the same values. o must agree bitwise (same double math from the same values);
 * the bf16 cache and snapshots within one bf16 ulp of the fp32 results. */
static void bf16_cache(gdp_ctx_t ctx) {
    dec_case c;
    if (!load_case("decode_m3_draft3.safetensors", &c)) {
        free_case(&c);
        return;
    }
    gdp_tensor s16 = test_copy_as(&c.state, GDP_DTYPE_BF16);
    gdp_tensor s32 = test_copy_as(&s16, GDP_DTYPE_FP32);
    gdp_tensor i16 = test_tensor_alloc(GDP_DTYPE_BF16, c.inter_ref.ndim, c.inter_ref.shape);
    gdp_tensor i32 = test_tensor_alloc(GDP_DTYPE_FP32, c.inter_ref.ndim, c.inter_ref.shape);
    gdp_tensor o16 = test_tensor_alloc(GDP_DTYPE_FP32, c.o_ref.ndim, c.o_ref.shape);
    gdp_tensor o32 = test_tensor_alloc(GDP_DTYPE_FP32, c.o_ref.ndim, c.o_ref.shape);
    gdp_recurrent_args a = cache_args(&c, s16, i16, o16);
    CHECK_OK(gdp_fused_recurrent_gated_delta_rule_update(ctx, &a));
    a = cache_args(&c, s32, i32, o32);
    CHECK_OK(gdp_fused_recurrent_gated_delta_rule_update(ctx, &a));
    CHECK(memcmp(o16.data, o32.data, test_tensor_bytes(&o16)) == 0, "o from a bf16 cache differs from fp32");
    const gdp_tensor *pairs[2][2] = {{&s16, &s32}, {&i16, &i32}};
    const char *names[2] = {"state", "intermediate_states"};
    for (int p = 0; p < 2; p++) {
        int64_t bad = 0, n = gdp_tensor_numel(pairs[p][0]);
        for (int64_t i = 0; i < n; i++) {
            const double got = gdp_tensor_get(pairs[p][0], i), want = gdp_tensor_get(pairs[p][1], i);
            bad += !(fabs(got - want) <= bf16_ulp(want));
        }
        CHECK(bad == 0, "bf16 cache: %lld of %lld %s elements beyond one bf16 ulp of the fp32 cache", (long long)bad,
              (long long)n, names[p]);
    }
    /* And the bf16 run still tracks the float64 reference at bf16 level. */
    double *sd = test_tensor_f64(&s16), *sref = test_tensor_f64(&c.state_after_ref);
    test_compare("bf16 cache vs state_after_ref", sd, sref, gdp_tensor_numel(&s16), 8e-3, -1, 0);
    printf("decode_m3_draft3 with a bf16 cache: o bitwise equal to the fp32 cache, state and snapshots within one "
           "bf16 ulp, state relative RMS %.2e vs the reference\n",
           test_rel_rms(sd, sref, gdp_tensor_numel(&s16)));
    free(sd); free(sref);
    free(s16.data); free(s32.data); free(i16.data); free(i32.data); free(o16.data); free(o32.data);
    free_case(&c);
}

/* Expects INVALID_ARGUMENT and that none of o, state and intermediate changed. */
static void expect_rejected(gdp_ctx_t ctx, const gdp_recurrent_args *a, const gdp_tensor *o, const gdp_tensor *state,
                            const gdp_tensor *inter, const char *what) {
    const gdp_tensor *outs[3] = {o, state, inter};
    void *before[3];
    for (int i = 0; i < 3; i++) {
        before[i] = malloc(test_tensor_bytes(outs[i]));
        memcpy(before[i], outs[i]->data, test_tensor_bytes(outs[i]));
    }
    CHECK_STATUS(gdp_fused_recurrent_gated_delta_rule_update(ctx, a), GDP_STATUS_INVALID_ARGUMENT);
    printf("  rejected %s: %s\n", what, gdp_last_error());
    for (int i = 0; i < 3; i++) {
        CHECK(memcmp(before[i], outs[i]->data, test_tensor_bytes(outs[i])) == 0, "%s: %s was modified", what,
              i == 0 ? "o" : i == 1 ? "state" : "intermediate_states");
        free(before[i]);
    }
}

static void bad_inputs(gdp_ctx_t ctx) {
    dec_case c;
    if (!load_case("decode_m3_draft3.safetensors", &c)) {
        free_case(&c);
        return;
    }
    printf("bad inputs:\n");
    const int64_t B = c.q.shape[0], slots = c.state.shape[0];
    gdp_tensor state = test_copy_as(&c.state, GDP_DTYPE_FP32);
    gdp_tensor inter = test_tensor_alloc(GDP_DTYPE_FP32, c.inter_ref.ndim, c.inter_ref.shape);
    gdp_tensor o = test_tensor_alloc(GDP_DTYPE_FP32, c.o_ref.ndim, c.o_ref.shape);
    test_fill_nan(&o);
    const gdp_recurrent_args good = cache_args(&c, state, inter, o);

    gdp_recurrent_args a = good;
    a.steps_per_token = 2; /* T = 9 */
    expect_rejected(ctx, &a, &o, &state, &inter, "steps_per_token 2 with T = 9");
    a = good;
    a.steps_per_token = 0;
    expect_rejected(ctx, &a, &o, &state, &inter, "steps_per_token 0");
    int32_t cu[2] = {0, 9};
    const int64_t cu_shape[1] = {2};
    a = good;
    gdp_tensor_init(&a.cu_seqlens, cu, GDP_DTYPE_INT32, 1, cu_shape);
    expect_rejected(ctx, &a, &o, &state, &inter, "cu_seqlens given");

    /* Slot values: copies of the golden indices with one entry broken. */
    int32_t *idx = malloc((size_t)B * sizeof *idx);
    const int64_t idx_shape[1] = {B};
    a = good;
    gdp_tensor_init(&a.state_indices, idx, GDP_DTYPE_INT32, 1, idx_shape);
    memcpy(idx, c.state_indices.data, (size_t)B * sizeof *idx);
    idx[B - 1] = idx[0];
    expect_rejected(ctx, &a, &o, &state, &inter, "two requests naming the same slot");
    CHECK(strstr(gdp_last_error(), "slot") != NULL, "duplicate-slot message lacks the slot: %s", gdp_last_error());
    memcpy(idx, c.state_indices.data, (size_t)B * sizeof *idx);
    idx[1] = (int32_t)slots;
    expect_rejected(ctx, &a, &o, &state, &inter, "a slot == slots");
    CHECK(strstr(gdp_last_error(), "state_indices[1]") != NULL, "out-of-range message lacks the row: %s",
          gdp_last_error());
    idx[1] = -2;
    expect_rejected(ctx, &a, &o, &state, &inter, "a slot of -2");
    free(idx);

    a = good;
    a.state.shape[3] += 1;
    expect_rejected(ctx, &a, &o, &state, &inter, "state with the wrong V");
    a = good;
    a.intermediate_states.shape[1] = 1;
    expect_rejected(ctx, &a, &o, &state, &inter, "intermediate_states with the wrong S");
    a = good;
    a.intermediate_states.dtype = GDP_DTYPE_BF16;
    expect_rejected(ctx, &a, &o, &state, &inter, "intermediate_states not in the cache's dtype");
    a = good;
    a.k.dtype = GDP_DTYPE_FP32;
    expect_rejected(ctx, &a, &o, &state, &inter, "k in another dtype than q");
    a = good;
    a.initial_state = state;
    expect_rejected(ctx, &a, &o, &state, &inter, "initial_state together with state");
    a = good;
    a.state = (gdp_tensor){0};
    expect_rejected(ctx, &a, &o, &state, &inter, "state_indices without state");
    a = good;
    a.scale = NAN;
    expect_rejected(ctx, &a, &o, &state, &inter, "scale NaN");
    free(state.data); free(inter.data); free(o.data);
    free_case(&c);
}

int main(void) {
    gdp_ctx_t ctx = NULL;
    CHECK_OK(gdp_ctx_init(&ctx, GDP_BACKEND_CPU, 0));
    golden_case(ctx, "decode_m1_k128.safetensors");
    golden_case(ctx, "decode_m2_slots_pad.safetensors");
    golden_case(ctx, "decode_m3_draft3.safetensors");
    identity_slots(ctx);
    dense_vs_cache(ctx);
    bf16_cache(ctx);
    bad_inputs(ctx);
    gdp_ctx_free(ctx);
    return test_finish("test_recurrent_cpu");
}
