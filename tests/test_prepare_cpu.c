/*
 * test_prepare_cpu.c: the CPU reference of gdp_decode_prepare / gdp_prefill_prepare.
 *   - the four prepare_*.safetensors golden files (PyTorch CUDA eager results): query,
 *     key and value bitwise equal, beta and g within 4 ulp of the stored dtype;
 *   - the same inputs as fp16 (where the bf16 values are exact in fp16): q, k, v bitwise
 *     equal to the references converted to fp16, beta within 4 fp16 ulp, g within 4 ulp;
 *   - x and ba passed as strided row views: bitwise the same outputs as contiguous;
 *   - softplus tails a in {100, 20, 0, -20, -80}: g against double log1p(exp()) at rtol 1e-6;
 *   - bad inputs (H % G != 0, wrong widths, wrong output shape, n != 1 in prefill, a
 *     strided last dim): INVALID_ARGUMENT with a message, outputs untouched.
 */
#include <string.h>

#include "internal.h" /* defines: gdp_tensor_get/set */
#include "test_common.h"

#define SENTINEL_BYTE 0xA5 /* outputs start as this pattern, so unwritten zeros show */

/* Largest ulp distance (in the dtype of a and b) over n elements. */
static int64_t max_ulp(gdp_dtype_t dt, const void *a, const void *b, int64_t n, int64_t *where) {
    int64_t worst = 0;
    *where = -1;
    for (int64_t i = 0; i < n; i++) {
        int64_t d = test_ordered_bits(dt, a, i) - test_ordered_bits(dt, b, i);
        d = d < 0 ? -d : d;
        if (d > worst) {
            worst = d;
            *where = i;
        }
    }
    return worst;
}

/* The inputs, references and outputs of one prepare case. */
typedef struct prep_case {
    char name[96];
    int decode;
    gdp_prepare_args args;
    gdp_tensor ref[5]; /* query, key, value, beta, g */
} prep_case;

static const char *const OUT_NAMES[5] = {"query", "key", "value", "beta", "g"};

static gdp_tensor *out_slot(gdp_prepare_args *a, int i) {
    gdp_tensor *outs[5] = {&a->query, &a->key, &a->value, &a->beta, &a->g};
    return outs[i];
}

/* Allocates outputs shaped like the references and fills them with the sentinel. */
static void alloc_outputs(prep_case *c) {
    for (int i = 0; i < 5; i++) {
        gdp_tensor *o = out_slot(&c->args, i);
        *o = test_tensor_alloc(c->ref[i].dtype, c->ref[i].ndim, c->ref[i].shape);
        memset(o->data, SENTINEL_BYTE, test_tensor_bytes(o));
    }
}

static void free_case(prep_case *c) {
    free(c->args.x.data);
    free(c->args.ba.data);
    free(c->args.A_log.data);
    free(c->args.dt_bias.data);
    for (int i = 0; i < 5; i++) {
        free(out_slot(&c->args, i)->data);
        free(c->ref[i].data);
    }
}

static bool load_case(const char *file, prep_case *c) {
    memset(c, 0, sizeof *c);
    snprintf(c->name, sizeof c->name, "%s", file);
    gdp_st_file *f = test_golden_open(file);
    if (f == NULL)
        return false;
    const char *op = gdp_st_metadata(f, "op");
    CHECK(op != NULL, "%s: no op in the metadata", file);
    c->decode = op != NULL && strstr(op, "decode") != NULL;
    c->args.num_householder = (int32_t)test_st_meta_num(f, "num_householder", 0);
    c->args.num_heads = (int32_t)test_st_meta_num(f, "num_heads", 0);
    c->args.num_groups = (int32_t)test_st_meta_num(f, "num_groups", 0);
    c->args.head_dim = (int32_t)test_st_meta_num(f, "head_dim", 0);
    c->args.state_dim = (int32_t)test_st_meta_num(f, "state_dim", 0);
    bool ok = test_st_tensor(f, "x", &c->args.x) && test_st_tensor(f, "ba", &c->args.ba) &&
              test_st_tensor(f, "A_log", &c->args.A_log) && test_st_tensor(f, "dt_bias", &c->args.dt_bias) &&
              test_st_tensor(f, "query_ref", &c->ref[0]) && test_st_tensor(f, "key_ref", &c->ref[1]) &&
              test_st_tensor(f, "value_ref", &c->ref[2]) && test_st_tensor(f, "beta_ref", &c->ref[3]) &&
              test_st_tensor(f, "g_ref", &c->ref[4]);
    gdp_st_close(f);
    if (ok)
        alloc_outputs(c);
    return ok;
}

static gdp_status_t run_prepare(gdp_ctx_t ctx, const prep_case *c) {
    return c->decode ? gdp_decode_prepare(ctx, &c->args) : gdp_prefill_prepare(ctx, &c->args);
}

/* q, k, v bitwise; beta and g within 4 ulp of their stored dtype. */
static void compare_to_refs(const prep_case *c, const gdp_tensor *refs, const char *what) {
    for (int i = 0; i < 5; i++) {
        const gdp_tensor *o = out_slot((gdp_prepare_args *)&c->args, i);
        const size_t bytes = test_tensor_bytes(o);
        CHECK(bytes == test_tensor_bytes(&refs[i]), "%s %s: %s has %zu bytes, reference %zu", c->name, what,
              OUT_NAMES[i], bytes, test_tensor_bytes(&refs[i]));
        if (bytes != test_tensor_bytes(&refs[i]))
            continue;
        if (i < 3) {
            CHECK(memcmp(o->data, refs[i].data, bytes) == 0, "%s %s: %s is not bitwise equal to its reference",
                  c->name, what, OUT_NAMES[i]);
        } else {
            int64_t where;
            const int64_t ulp = max_ulp(o->dtype, o->data, refs[i].data, gdp_tensor_numel(o), &where);
            CHECK(ulp <= 4, "%s %s: %s differs by %lld ulp at [%lld] (got %.9g, want %.9g); bar 4 ulp", c->name,
                  what, OUT_NAMES[i], (long long)ulp, (long long)where, gdp_tensor_get(o, where),
                  gdp_tensor_get(&refs[i], where));
            printf("  %s %s: %s max %lld ulp from the reference\n", c->name, what, OUT_NAMES[i], (long long)ulp);
        }
    }
}

static void golden_case(gdp_ctx_t ctx, const char *file) {
    prep_case c;
    if (!load_case(file, &c)) {
        free_case(&c);
        return;
    }
    CHECK_OK(run_prepare(ctx, &c));
    compare_to_refs(&c, c.ref, "golden");
    printf("%s (%s, M=%d H=%d G=%d P=%d N=%d, x %s): checked against the eager references\n", file,
           c.decode ? "decode" : "prefill", c.args.num_householder, c.args.num_heads, c.args.num_groups,
           c.args.head_dim, c.args.state_dim, gdp_dtype_name(c.args.x.dtype));
    free_case(&c);
}

/* A copy of `t` converted to `dt`; *exact = false when some value does not round-trip. */
static gdp_tensor convert(const gdp_tensor *t, gdp_dtype_t dt, bool *exact) {
    gdp_tensor r = test_tensor_alloc(dt, t->ndim, t->shape);
    for (int64_t i = 0; i < gdp_tensor_numel(t); i++) {
        const double v = gdp_tensor_get(t, i);
        gdp_tensor_set(&r, i, v);
        if (gdp_tensor_get(&r, i) != v)
            *exact = false;
    }
    return r;
}

/* The bf16 golden case re-run with fp16 x, ba and dt_bias: the same values (checked to be
 * exact in fp16 for ba and dt_bias), so q, k, v must be the references converted to fp16
 * and g the same fp32 reference;
 * beta is compared with the double sigmoid rounded to fp16. */
static void fp16_case(gdp_ctx_t ctx, const char *file) {
    prep_case c;
    if (!load_case(file, &c)) {
        free_case(&c);
        return;
    }
    /* q, k, v are copies of x, so converting x and the references alike keeps them
     * comparable even where a value rounds; g needs a and dt_bias exact. */
    bool exact = true, copies_exact = true;
    gdp_tensor x16 = convert(&c.args.x, GDP_DTYPE_FP16, &copies_exact);
    gdp_tensor ba16 = convert(&c.args.ba, GDP_DTYPE_FP16, &exact);
    gdp_tensor dt16 = convert(&c.args.dt_bias, GDP_DTYPE_FP16, &exact);
    CHECK(exact, "%s: the golden ba or dt_bias values are not exact in fp16; the fp16 case needs other data", file);
    gdp_tensor refs[5];
    for (int i = 0; i < 3; i++)
        refs[i] = convert(&c.ref[i], GDP_DTYPE_FP16, &copies_exact);
    /* beta reference: sigmoid(b) in double, rounded once to fp16. */
    refs[3] = test_tensor_alloc(GDP_DTYPE_FP16, c.ref[3].ndim, c.ref[3].shape);
    const int64_t n = c.args.x.shape[0], T = c.args.x.shape[1], M = c.args.num_householder,
                  H = c.args.num_heads;
    for (int64_t i = 0; i < n * T; i++)
        for (int64_t j = 0; j < M * H; j++)
            gdp_tensor_set(&refs[3], i * M * H + j, 1.0 / (1.0 + exp(-gdp_tensor_get(&ba16, i * (M + 1) * H + j))));
    refs[4] = c.ref[4];
    free(c.args.x.data);
    free(c.args.ba.data);
    free(c.args.dt_bias.data);
    c.args.x = x16;
    c.args.ba = ba16;
    c.args.dt_bias = dt16;
    for (int i = 0; i < 4; i++) {
        gdp_tensor *o = out_slot(&c.args, i);
        free(o->data);
        *o = test_tensor_alloc(refs[i].dtype, refs[i].ndim, refs[i].shape);
        memset(o->data, SENTINEL_BYTE, test_tensor_bytes(o));
    }
    CHECK_OK(run_prepare(ctx, &c));
    compare_to_refs(&c, refs, "fp16");
    printf("%s as fp16: q, k, v bitwise, beta and g within 4 ulp\n", file);
    for (int i = 0; i < 4; i++)
        free(refs[i].data);
    free_case(&c);
}

/* A strided row view of `t` ([n, T, w]): rows pad_row elements apart beyond w, requests
 * pad_req more apart; the padding holds a pattern the op must not read into outputs. */
static gdp_tensor strided_copy(const gdp_tensor *t, int64_t pad_row, int64_t pad_req) {
    const int64_t n = t->shape[0], T = t->shape[1], w = t->shape[2];
    const int64_t rs = w + pad_row, ns = T * rs + pad_req;
    const size_t es = gdp_dtype_size(t->dtype);
    gdp_tensor v = *t;
    v.data = malloc((size_t)(n * ns) * es);
    memset(v.data, 0x5A, (size_t)(n * ns) * es);
    v.stride[0] = ns;
    v.stride[1] = rs;
    v.stride[2] = 1;
    for (int64_t i = 0; i < n; i++)
        for (int64_t r = 0; r < T; r++)
            memcpy((char *)v.data + (size_t)(i * ns + r * rs) * es, (const char *)t->data + (size_t)((i * T + r) * w) * es,
                   (size_t)w * es);
    return v;
}

static void strided_case(gdp_ctx_t ctx, const char *file) {
    prep_case c;
    if (!load_case(file, &c)) {
        free_case(&c);
        return;
    }
    CHECK_OK(run_prepare(ctx, &c));
    void *contiguous[5];
    for (int i = 0; i < 5; i++) {
        gdp_tensor *o = out_slot(&c.args, i);
        contiguous[i] = malloc(test_tensor_bytes(o));
        memcpy(contiguous[i], o->data, test_tensor_bytes(o));
        memset(o->data, SENTINEL_BYTE, test_tensor_bytes(o));
    }
    gdp_tensor x = c.args.x, ba = c.args.ba;
    c.args.x = strided_copy(&x, 13, 7);
    c.args.ba = strided_copy(&ba, 5, 3);
    CHECK_OK(run_prepare(ctx, &c));
    for (int i = 0; i < 5; i++) {
        gdp_tensor *o = out_slot(&c.args, i);
        CHECK(memcmp(o->data, contiguous[i], test_tensor_bytes(o)) == 0,
              "%s: %s from strided x/ba differs from the contiguous run", file, OUT_NAMES[i]);
        free(contiguous[i]);
    }
    printf("%s: strided x (row stride %lld) and ba (row stride %lld) give bitwise the contiguous outputs\n", file,
           (long long)c.args.x.stride[1], (long long)c.args.ba.stride[1]);
    free(c.args.x.data);
    free(c.args.ba.data);
    c.args.x = x;
    c.args.ba = ba;
    free_case(&c);
}

/* g = (-exp(A_log)) * softplus(a + dt_bias) with A_log = 0, so g = -softplus(a + dt_bias),
 * one head per tail value; a + dt_bias is exact in float. */
static void softplus_tails(gdp_ctx_t ctx) {
    const double targets[5] = {100, 20, 0, -20, -80};
    const int64_t H = 5;
    const int64_t x_shape[3] = {1, 1, 1 * H * 1 + 1 * 1 * 1 + 1}, ba_shape[3] = {1, 1, 2 * H}, h_shape[1] = {H};
    gdp_prepare_args a = {.num_householder = 1, .num_heads = (int32_t)H, .num_groups = 1, .head_dim = 1,
                          .state_dim = 1};
    a.x = test_tensor_alloc(GDP_DTYPE_FP32, 3, x_shape);
    a.ba = test_tensor_alloc(GDP_DTYPE_FP32, 3, ba_shape);
    a.A_log = test_tensor_alloc(GDP_DTYPE_FP32, 1, h_shape);
    a.dt_bias = test_tensor_alloc(GDP_DTYPE_FP32, 1, h_shape);
    for (int64_t h = 0; h < H; h++) {
        gdp_tensor_set(&a.ba, H + h, targets[h] - 0.5); /* the a slot follows the H b entries */
        gdp_tensor_set(&a.dt_bias, h, 0.5);
    }
    const int64_t q_shape[4] = {1, 1, H, 1}, s_shape[3] = {1, 1, H};
    a.query = test_tensor_alloc(GDP_DTYPE_FP32, 4, q_shape);
    a.key = test_tensor_alloc(GDP_DTYPE_FP32, 4, q_shape);
    a.value = test_tensor_alloc(GDP_DTYPE_FP32, 4, q_shape);
    a.beta = test_tensor_alloc(GDP_DTYPE_FP32, 3, s_shape);
    a.g = test_tensor_alloc(GDP_DTYPE_FP32, 3, s_shape);
    CHECK_OK(gdp_prefill_prepare(ctx, &a));
    for (int64_t h = 0; h < H; h++) {
        const double want = -log1p(exp(targets[h]));
        const double got = gdp_tensor_get(&a.g, h);
        CHECK(fabs(got - want) <= 1e-6 * fabs(want), "softplus tail a = %g: g = %.9g, double gives %.9g (rtol 1e-6)",
              targets[h], got, want);
    }
    printf("softplus tails a in {100, 20, 0, -20, -80}: g within rtol 1e-6 of double -log1p(exp(a))\n");
    void *bufs[] = {a.x.data, a.ba.data, a.A_log.data, a.dt_bias.data, a.query.data, a.key.data,
                    a.value.data, a.beta.data, a.g.data};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        free(bufs[i]);
}

/* Runs `bad` (a copy of `good` with one argument broken, sharing its buffers), expects
 * INVALID_ARGUMENT and checks that no output byte changed. */
static void expect_rejected(gdp_ctx_t ctx, prep_case *good, prep_case *bad, const char *what) {
    void *before[5];
    for (int i = 0; i < 5; i++) {
        gdp_tensor *o = out_slot(&good->args, i);
        before[i] = malloc(test_tensor_bytes(o));
        memcpy(before[i], o->data, test_tensor_bytes(o));
    }
    CHECK_STATUS(run_prepare(ctx, bad), GDP_STATUS_INVALID_ARGUMENT);
    CHECK(strlen(gdp_last_error()) > 0, "%s: no error message", what);
    printf("  rejected %s: %s\n", what, gdp_last_error());
    for (int i = 0; i < 5; i++) {
        gdp_tensor *o = out_slot(&good->args, i);
        CHECK(memcmp(before[i], o->data, test_tensor_bytes(o)) == 0, "%s: output %s was modified", what,
              OUT_NAMES[i]);
        free(before[i]);
    }
}

static void bad_inputs(gdp_ctx_t ctx) {
    prep_case c;
    if (!load_case("prepare_decode_bf16.safetensors", &c)) {
        free_case(&c);
        return;
    }
    printf("bad inputs:\n");
    prep_case bad = c;
    bad.args.num_groups = 3; /* 8 heads in 3 groups */
    expect_rejected(ctx, &c, &bad, "num_heads % num_groups != 0");
    bad = c;
    bad.args.x.shape[2] += 1;
    expect_rejected(ctx, &c, &bad, "x one wider than M*H*P + M*G*N + G*N");
    bad = c;
    bad.args.ba.shape[2] -= 1;
    expect_rejected(ctx, &c, &bad, "ba one narrower than M*H + H");
    bad = c;
    bad.args.query.shape[1] = 1; /* decode wants S*M rows */
    expect_rejected(ctx, &c, &bad, "query with the prefill layout in decode");
    bad = c;
    bad.args.value.shape[3] = bad.args.value.shape[3] * 2;
    expect_rejected(ctx, &c, &bad, "value of the wrong head dim");
    bad = c;
    bad.args.g.dtype = GDP_DTYPE_BF16;
    expect_rejected(ctx, &c, &bad, "g not fp32");
    bad = c;
    bad.args.beta.dtype = GDP_DTYPE_FP32;
    expect_rejected(ctx, &c, &bad, "beta not in ba's dtype");
    bad = c;
    bad.args.x.stride[0] = bad.args.x.shape[1] * bad.args.x.shape[2] * 2;
    bad.args.x.stride[1] = bad.args.x.shape[2] * 2;
    bad.args.x.stride[2] = 2;
    expect_rejected(ctx, &c, &bad, "x with a strided last dim");
    bad = c;
    bad.args.state_dim = 0;
    expect_rejected(ctx, &c, &bad, "state_dim 0");
    bad = c;
    bad.decode = 0; /* 5 requests: prefill needs n == 1 */
    expect_rejected(ctx, &c, &bad, "prefill with n = 5");
    CHECK_STATUS(gdp_decode_prepare(ctx, NULL), GDP_STATUS_INVALID_ARGUMENT);
    free_case(&c);
}

int main(void) {
    gdp_ctx_t ctx = NULL;
    CHECK_OK(gdp_ctx_init(&ctx, GDP_BACKEND_CPU, 0));
    const char *files[4] = {"prepare_decode_bf16.safetensors", "prepare_decode_draft_fp32.safetensors",
                            "prepare_prefill_bf16.safetensors", "prepare_prefill_fp32_gqa4.safetensors"};
    for (int i = 0; i < 4; i++)
        golden_case(ctx, files[i]);
    fp16_case(ctx, "prepare_decode_bf16.safetensors");
    fp16_case(ctx, "prepare_prefill_bf16.safetensors");
    strided_case(ctx, "prepare_decode_draft_fp32.safetensors");
    strided_case(ctx, "prepare_prefill_bf16.safetensors");
    softplus_tails(ctx);
    bad_inputs(ctx);
    gdp_ctx_free(ctx);
    return test_finish("test_prepare_cpu");
}
