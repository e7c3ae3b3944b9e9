/*
 * test_prepare_gpu.c: the CUDA backend of the prepare op (q, k, v, beta and g of decode and
 * prefill rows), through the public API on device buffers, against the golden files and the
 * CPU backend (same API, host copies of the same inputs; the CPU side is test_prepare_cpu.c).
 * Checked: the four prepare_*.safetensors files bitwise (q, k, v, beta, g); random shapes
 * (decode and prefill, fp32/bf16/fp16, GQA, strided rows, the 16-byte and the scalar copy
 * paths) vs the CPU: q, k, v bitwise, beta and g within 4 ulp; CUDA-graph capture replayed
 * with new data == eager, bitwise; two runs bitwise equal.
 * Device helpers: test_gpu.h. Without a CUDA build or a visible GPU it prints why and exits
 * 77 (skip).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h" /* defines: gdp_tensor_get/set, gdp_tensor_stride */
#include "test_gpu.h"

#ifdef GDP_HAVE_CUDA

static const char *const PREP_OUT[5] = {"query", "key", "value", "beta", "g"};

static gdp_tensor *prep_slot(gdp_prepare_args *a, int i) {
    gdp_tensor *outs[9] = {&a->query, &a->key, &a->value, &a->beta, &a->g, &a->x, &a->ba, &a->A_log, &a->dt_bias};
    return outs[i];
}

/* Device copies of the inputs and poisoned device outputs. */
static gdp_prepare_args prep_to_device(const gdp_prepare_args *h) {
    gdp_prepare_args d = *h;
    for (int i = 0; i < 9; i++)
        *prep_slot(&d, i) = i < 5 ? test_dev_poisoned(prep_slot((gdp_prepare_args *)h, i))
                                  : test_dev_clone(prep_slot((gdp_prepare_args *)h, i));
    return d;
}

static void prep_fetch(gdp_prepare_args *h, const gdp_prepare_args *d) {
    for (int i = 0; i < 5; i++)
        test_dev_fetch(prep_slot(h, i), prep_slot((gdp_prepare_args *)d, i));
}

static void prep_free(gdp_prepare_args *a, bool device) {
    for (int i = 0; i < 9; i++)
        device ? test_dev_free(prep_slot(a, i)) : test_host_free(prep_slot(a, i));
}

static gdp_status_t run_prepare(gdp_ctx_t ctx, const gdp_prepare_args *a, int decode) {
    return decode ? gdp_decode_prepare(ctx, a) : gdp_prefill_prepare(ctx, a);
}

static void prepare_golden(const char *file) {
    gdp_st_file *f = test_golden_open(file);
    if (f == NULL)
        return;
    gdp_prepare_args h = {0};
    gdp_tensor ref[5];
    const char *op = gdp_st_metadata(f, "op");
    const int decode = op != NULL && strstr(op, "decode") != NULL;
    h.num_householder = (int32_t)test_st_meta_num(f, "num_householder", 0);
    h.num_heads = (int32_t)test_st_meta_num(f, "num_heads", 0);
    h.num_groups = (int32_t)test_st_meta_num(f, "num_groups", 0);
    h.head_dim = (int32_t)test_st_meta_num(f, "head_dim", 0);
    h.state_dim = (int32_t)test_st_meta_num(f, "state_dim", 0);
    const bool ok = test_st_tensor(f, "x", &h.x) && test_st_tensor(f, "ba", &h.ba) &&
                    test_st_tensor(f, "A_log", &h.A_log) && test_st_tensor(f, "dt_bias", &h.dt_bias) &&
                    test_st_tensor(f, "query_ref", &ref[0]) && test_st_tensor(f, "key_ref", &ref[1]) &&
                    test_st_tensor(f, "value_ref", &ref[2]) && test_st_tensor(f, "beta_ref", &ref[3]) &&
                    test_st_tensor(f, "g_ref", &ref[4]);
    gdp_st_close(f);
    if (!ok)
        return;
    for (int i = 0; i < 5; i++)
        *prep_slot(&h, i) = test_tensor_alloc(ref[i].dtype, ref[i].ndim, ref[i].shape);
    gdp_prepare_args d = prep_to_device(&h);
    CHECK_OK(run_prepare(g_test_gpu, &d, decode));
    prep_fetch(&h, &d);
    int equal = 0;
    for (int i = 0; i < 5; i++) {
        char what[128];
        snprintf(what, sizeof what, "%s: %s vs the eager reference", file, PREP_OUT[i]);
        equal += test_same_bytes(what, prep_slot(&h, i), &ref[i]);
        test_host_free(&ref[i]);
    }
    printf("%s (%s, M=%d H=%d G=%d P=%d N=%d, %s): %d of 5 outputs bitwise equal to PyTorch CUDA eager\n", file,
           decode ? "decode" : "prefill", h.num_householder, h.num_heads, h.num_groups, h.head_dim, h.state_dim,
           gdp_dtype_name(h.x.dtype), equal);
    prep_free(&d, true);
    prep_free(&h, false);
}

typedef struct prep_cfg {
    int decode;
    int64_t n, T, M, H, G, P, N;
    gdp_dtype_t x_dt, ba_dt, dt_bias_dt;
    int64_t x_pad, ba_pad; /* extra elements per row: strided row views */
} prep_cfg;

/* Host inputs (random) and zeroed host outputs for one configuration. */
static gdp_prepare_args prep_random(test_rng *r, const prep_cfg *c) {
    gdp_prepare_args a = {.num_householder = (int32_t)c->M, .num_heads = (int32_t)c->H,
                          .num_groups = (int32_t)c->G, .head_dim = (int32_t)c->P, .state_dim = (int32_t)c->N};
    const int64_t width = c->M * c->H * c->P + c->M * c->G * c->N + c->G * c->N, ba_width = c->M * c->H + c->H;
    const int64_t xs[3] = {c->n, c->T, width}, bs[3] = {c->n, c->T, ba_width}, hs[1] = {c->H};
    a.x = test_alloc_rows(c->x_dt, 3, xs, c->x_pad);
    a.ba = test_alloc_rows(c->ba_dt, 3, bs, c->ba_pad);
    a.A_log = test_tensor_alloc(GDP_DTYPE_FP32, 1, hs);
    a.dt_bias = test_tensor_alloc(c->dt_bias_dt, 1, hs);
    test_fill_normal(&a.x, r, 1.0);
    /* b spans sigmoid's saturation; a + dt_bias crosses softplus's threshold 20 and its far-negative tail. */
    for (int64_t i = 0; i < c->n * c->T; i++)
        for (int64_t j = 0; j < ba_width; j++)
            gdp_tensor_set(&a.ba, i * ba_width + j,
                           j < c->M * c->H ? test_uniform_range(r, -12, 12) : test_uniform_range(r, -40, 30));
    test_fill_uniform(&a.A_log, r, -4, 2.7);
    test_fill_uniform(&a.dt_bias, r, -5, 2);
    const int64_t rows_exp = c->T * c->M, rows_tok = c->decode ? c->T * c->M : c->T;
    const int64_t qs[4] = {c->n, rows_tok, c->H, c->N}, ks[4] = {c->n, rows_exp, c->H, c->N};
    const int64_t vs[4] = {c->n, rows_exp, c->H, c->P}, betas[3] = {c->n, rows_exp, c->H};
    const int64_t gs[3] = {c->n, rows_tok, c->H};
    a.query = test_tensor_alloc(c->x_dt, 4, qs);
    a.key = test_tensor_alloc(c->x_dt, 4, ks);
    a.value = test_tensor_alloc(c->x_dt, 4, vs);
    a.beta = test_tensor_alloc(c->ba_dt, 3, betas);
    a.g = test_tensor_alloc(GDP_DTYPE_FP32, 3, gs);
    return a;
}

/* q, k, v bitwise; beta and g within 4 ulp (CUDA's and glibc's libm each within 2 ulp). */
static void prep_compare_cpu(const char *label, const gdp_prepare_args *gpu, const gdp_prepare_args *cpu) {
    for (int i = 0; i < 5; i++) {
        char what[256];
        snprintf(what, sizeof what, "%s: %s vs CPU", label, PREP_OUT[i]);
        const gdp_tensor *a = prep_slot((gdp_prepare_args *)gpu, i), *b = prep_slot((gdp_prepare_args *)cpu, i);
        if (i < 3) {
            test_same_bytes(what, a, b);
        } else {
            int64_t where;
            const int64_t ulp = test_max_ulp(a, b, &where);
            CHECK(ulp <= 4, "%s: %lld ulp at [%lld] (got %.9g, want %.9g); bar 4", what, (long long)ulp,
                  (long long)where, gdp_tensor_get(a, where), gdp_tensor_get(b, where));
        }
    }
}

static void prepare_vs_cpu(test_rng *r, const prep_cfg *c) {
    char label[160];
    snprintf(label, sizeof label, "%s n=%lld T=%lld M=%lld H=%lld G=%lld P=%lld N=%lld x %s ba %s pad %lld/%lld",
             c->decode ? "decode" : "prefill", (long long)c->n, (long long)c->T, (long long)c->M, (long long)c->H,
             (long long)c->G, (long long)c->P, (long long)c->N, gdp_dtype_name(c->x_dt), gdp_dtype_name(c->ba_dt),
             (long long)c->x_pad, (long long)c->ba_pad);
    gdp_prepare_args h = prep_random(r, c);
    gdp_prepare_args d = prep_to_device(&h);
    CHECK_OK(run_prepare(g_test_cpu, &h, c->decode));
    gdp_prepare_args g = h; /* GPU results land in fresh host buffers */
    for (int i = 0; i < 5; i++)
        *prep_slot(&g, i) = test_host_clone(prep_slot(&h, i));
    CHECK_OK(run_prepare(g_test_gpu, &d, c->decode));
    prep_fetch(&g, &d);
    const int before = g_test_failures;
    prep_compare_cpu(label, &g, &h);

    /* Determinism: a second run writes the same bits. */
    gdp_prepare_args g2 = g;
    for (int i = 0; i < 5; i++)
        *prep_slot(&g2, i) = test_host_clone(prep_slot(&g, i));
    for (int i = 0; i < 5; i++)
        CUDA_OK(cudaMemset(prep_slot(&d, i)->data, TEST_SENTINEL_BYTE, test_span_bytes(prep_slot(&d, i))));
    CHECK_OK(run_prepare(g_test_gpu, &d, c->decode));
    prep_fetch(&g2, &d);
    for (int i = 0; i < 5; i++)
        test_same_bytes("prepare determinism (second run)", prep_slot(&g2, i), prep_slot(&g, i));
    printf("%s: %s (q, k, v bitwise, beta and g <= 4 ulp vs CPU; second run bitwise equal)\n", label,
           g_test_failures == before ? "ok" : "FAILED");
    for (int i = 0; i < 5; i++) {
        test_host_free(prep_slot(&g, i));
        test_host_free(prep_slot(&g2, i));
    }
    prep_free(&d, true);
    prep_free(&h, false);
}

typedef struct prep_graph_args {
    gdp_prepare_args *a;
    int decode;
} prep_graph_args;

static gdp_status_t prep_graph_fn(void *p) {
    prep_graph_args *g = p;
    return run_prepare(g_test_gpu, g->a, g->decode);
}

/* Capture once, then replay with two new sets of inputs: each replay == an eager run. */
static void prepare_graph(test_rng *r, const prep_cfg *c) {
    gdp_prepare_args h = prep_random(r, c);
    gdp_prepare_args d = prep_to_device(&h);
    prep_graph_args ga = {&d, c->decode};
    cudaGraphExec_t exec = test_graph_capture(prep_graph_fn, &ga);
    gdp_prepare_args eager = h, replayed = h;
    for (int i = 0; i < 5; i++) {
        *prep_slot(&eager, i) = test_host_clone(prep_slot(&h, i));
        *prep_slot(&replayed, i) = test_host_clone(prep_slot(&h, i));
    }
    int rounds_ok = 0;
    for (int round = 0; round < 2; round++) {
        gdp_prepare_args fresh = prep_random(r, c);
        test_dev_put(&d.x, &fresh.x);
        test_dev_put(&d.ba, &fresh.ba);
        test_dev_put(&d.A_log, &fresh.A_log);
        test_dev_put(&d.dt_bias, &fresh.dt_bias);
        CHECK_OK(run_prepare(g_test_gpu, &d, c->decode));
        prep_fetch(&eager, &d);
        for (int i = 0; i < 5; i++)
            CUDA_OK(cudaMemset(prep_slot(&d, i)->data, TEST_SENTINEL_BYTE, test_span_bytes(prep_slot(&d, i))));
        test_graph_replay(exec);
        prep_fetch(&replayed, &d);
        int eq = 0;
        for (int i = 0; i < 5; i++)
            eq += test_same_bytes("prepare graph replay vs eager", prep_slot(&replayed, i), prep_slot(&eager, i));
        rounds_ok += eq == 5;
        prep_free(&fresh, false);
    }
    printf("prepare %s graph (n=%lld T=%lld): %d of 2 replays with new inputs bitwise equal to eager runs\n",
           c->decode ? "decode" : "prefill", (long long)c->n, (long long)c->T, rounds_ok);
    if (exec != NULL)
        CUDA_OK(cudaGraphExecDestroy(exec));
    for (int i = 0; i < 5; i++) {
        test_host_free(prep_slot(&eager, i));
        test_host_free(prep_slot(&replayed, i));
    }
    prep_free(&d, true);
    prep_free(&h, false);
}

static void prepare_tests(test_rng *r) {
    const char *files[4] = {"prepare_decode_bf16.safetensors", "prepare_decode_draft_fp32.safetensors",
                            "prepare_prefill_bf16.safetensors", "prepare_prefill_fp32_gqa4.safetensors"};
    for (int i = 0; i < 4; i++)
        prepare_golden(files[i]);
    const prep_cfg cases[] = {
        /* decode, n, T, M, H, G, P, N, x, ba, dt_bias, pads */
        {1, 7, 1, 2, 8, 2, 64, 64, GDP_DTYPE_BF16, GDP_DTYPE_BF16, GDP_DTYPE_BF16, 0, 0},
        {1, 3, 4, 3, 4, 1, 8, 16, GDP_DTYPE_FP32, GDP_DTYPE_FP32, GDP_DTYPE_FP32, 8, 5},   /* strided, 16-byte */
        {1, 2, 2, 1, 6, 3, 12, 20, GDP_DTYPE_FP16, GDP_DTYPE_FP16, GDP_DTYPE_FP32, 0, 0}, /* scalar copies */
        {1, 256, 1, 2, 16, 4, 128, 128, GDP_DTYPE_BF16, GDP_DTYPE_BF16, GDP_DTYPE_BF16, 0, 0},
        {0, 1, 300, 3, 8, 8, 16, 32, GDP_DTYPE_BF16, GDP_DTYPE_BF16, GDP_DTYPE_BF16, 3, 1}, /* strided, scalar */
        {0, 1, 129, 2, 16, 4, 128, 128, GDP_DTYPE_FP32, GDP_DTYPE_FP32, GDP_DTYPE_FP32, 0, 0},
        {0, 1, 1000, 2, 16, 4, 128, 128, GDP_DTYPE_BF16, GDP_DTYPE_FP32, GDP_DTYPE_BF16, 16, 0},
        {0, 1, 37, 1, 4, 2, 24, 40, GDP_DTYPE_FP16, GDP_DTYPE_BF16, GDP_DTYPE_FP16, 0, 2},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        prepare_vs_cpu(r, &cases[i]);
    prepare_graph(r, &cases[3]);
    prepare_graph(r, &cases[6]);
}

#endif /* GDP_HAVE_CUDA */

TEST_GPU_MAIN("test_prepare_gpu", prepare_tests, 20261129)
