/*
 * test_ops_gpu.c: the CUDA backend of the prepare, decode (fused recurrent), conv1d and
 * norm ops, through the public API on device buffers, against the golden files and the
 * CPU backend (same API, host copies of the same inputs). One program, one family per
 * argument (prepare | decode | conv | norm | all); each family checks:
 *   prepare: the four prepare_*.safetensors files bitwise (q, k, v, beta, g); random
 *            shapes (decode and prefill, fp32/bf16/fp16, GQA, strided rows, the 16-byte
 *            and the scalar copy paths) vs the CPU: q, k, v bitwise, beta and g within
 *            4 ulp; CUDA-graph capture replayed with new data == eager, bitwise;
 *            two runs bitwise equal;
 *   decode:  the three decode_*.safetensors files: o, the cache and the snapshots within
 *            atol = rtol = 1e-3 (bf16 o: plus one bf16 ulp), unnamed slots and their
 *            snapshot rows bitwise unchanged, -1 rows exactly 0; random shapes covering
 *            every kernel instance (K 16..256, vector and scalar columns, fp32/bf16/fp16
 *            states, dense and cache modes, g and beta absent, L2 norm on/off) vs the
 *            CPU at 1e-3 (1e-4 with fp32 inputs and state) plus one ulp of a 16-bit
 *            output; graph replay with new data and a new padding pattern == eager;
 *            determinism; every decode kernel (GDP_DECODE_STATE regs | smem | head)
 *            bitwise equal on every random case; S tokens in one call
 *            == S one-token calls bitwise (o, every snapshot, the final fp32 cache); the
 *            fused decode end (decode op + grouped gated RMSNorm in one launch,
 *            src/decode_core.h) bitwise equal to the two ops, whether it fused asserted,
 *            graph replays (the arrival counters reset between them);
 *   conv:    conv_varlen.safetensors (y within one bf16 ulp, state exact); random varlen
 *            (zero, short and long sequences, -1 requests, padding rows, strided x,
 *            widths 2..8) and update (S tokens, snapshots, -1 rows) vs the CPU: states
 *            bitwise, fp32 y within 1e-5, 16-bit y within one ulp; graph replay;
 *            determinism; the fused decode front (conv update + decode prepare in one
 *            launch, src/decode_core.h) bitwise equal to the two ops in order;
 *   norm:    gated_norm.safetensors (bf16 within one ulp of out_bf16_ref, fp32 within
 *            1e-5 relative of out_ref); gated RMSNorm, RMSNorm and L2 norm on random
 *            shapes and dtypes vs the CPU (fp32 within 1e-5 relative, 16-bit within one
 *            ulp); the in-place L2 norm equals the out-of-place one bitwise; the gated norm
 *            on row views (fast and general path) vs the CPU and bitwise vs contiguous rows.
 * Without a CUDA build or a visible GPU it prints why and exits 77 (skip).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "decode_core.h"
#include "internal.h" /* defines: gdp_tensor_get/set, gdp_tensor_stride */
#include "test_common.h"

#ifdef GDP_HAVE_CUDA
#include <cuda_runtime_api.h>

#define SENTINEL_BYTE 0xA5 /* device outputs start as this pattern, so unwritten elements show */

#define CUDA_OK(call)                                                                                           \
    do {                                                                                                        \
        cudaError_t e_ = (call);                                                                                \
        CHECK(e_ == cudaSuccess, "%s: %s", #call, cudaGetErrorString(e_));                                      \
    } while (0)

static gdp_ctx_t g_gpu, g_cpu;
static cudaStream_t g_stream; /* the GPU ctx enqueues here (graphs need a non-default stream) */

/* ---- tensors on the host and the device ------------------------------------------ */

/* Bytes from the first to one past the last element of a (possibly strided) view. */
static size_t span_bytes(const gdp_tensor *t) {
    int64_t span = 1;
    for (int32_t d = 0; d < t->ndim; d++) {
        if (t->shape[d] == 0)
            return 0;
        span += (t->shape[d] - 1) * gdp_tensor_stride(t, d);
    }
    return (size_t)span * gdp_dtype_size(t->dtype);
}

/* A host copy of the view's whole span (same strides). Absent stays absent. */
static gdp_tensor host_clone(const gdp_tensor *t) {
    gdp_tensor r = *t;
    if (!gdp_tensor_present(t))
        return r;
    const size_t b = span_bytes(t);
    r.data = malloc(b ? b : 1);
    memcpy(r.data, t->data, b);
    return r;
}

/* A device copy of a host view (same strides). Absent stays absent. */
static gdp_tensor dev_clone(const gdp_tensor *h) {
    gdp_tensor d = *h;
    d.data = NULL;
    if (!gdp_tensor_present(h))
        return d;
    const size_t b = span_bytes(h);
    CUDA_OK(cudaMalloc(&d.data, b ? b : 1));
    CUDA_OK(cudaMemcpy(d.data, h->data, b, cudaMemcpyHostToDevice));
    return d;
}

static void dev_put(gdp_tensor *d, const gdp_tensor *h) {
    CUDA_OK(cudaMemcpy(d->data, h->data, span_bytes(h), cudaMemcpyHostToDevice));
}

static void dev_fetch(gdp_tensor *h, const gdp_tensor *d) {
    CUDA_OK(cudaStreamSynchronize(g_stream));
    CUDA_OK(cudaMemcpy(h->data, d->data, span_bytes(h), cudaMemcpyDeviceToHost));
}

/* A device buffer shaped like h, filled with the sentinel pattern. */
static gdp_tensor dev_poisoned(const gdp_tensor *h) {
    gdp_tensor d = *h;
    const size_t b = span_bytes(h);
    CUDA_OK(cudaMalloc(&d.data, b ? b : 1));
    CUDA_OK(cudaMemset(d.data, SENTINEL_BYTE, b));
    return d;
}

static void dev_free(gdp_tensor *d) {
    if (d->data != NULL)
        CUDA_OK(cudaFree(d->data));
    d->data = NULL;
}

static void host_free(gdp_tensor *h) {
    free(h->data);
    h->data = NULL;
}

/* A contiguous tensor whose rows are a view into wider rows: the last dim padded by pad. */
static gdp_tensor alloc_rows(gdp_dtype_t dt, int32_t ndim, const int64_t *shape, int64_t pad) {
    gdp_tensor t = test_tensor_alloc(dt, ndim, shape);
    if (pad == 0)
        return t;
    free(t.data);
    int64_t stride = 1;
    for (int32_t d = ndim - 1; d >= 0; d--) {
        t.stride[d] = stride;
        stride *= d == ndim - 1 ? shape[d] + pad : shape[d];
    }
    t.data = calloc((size_t)stride, gdp_dtype_size(dt));
    return t;
}

static void fill_normal(gdp_tensor *t, test_rng *r, double scale) {
    for (int64_t i = 0; i < gdp_tensor_numel(t); i++)
        gdp_tensor_set(t, i, scale * test_normal(r));
}

static void fill_value(gdp_tensor *t, double v) {
    for (int64_t i = 0; i < gdp_tensor_numel(t); i++)
        gdp_tensor_set(t, i, v);
}

static gdp_tensor int_tensor(const int32_t *vals, int64_t n) {
    const int64_t shape[1] = {n};
    gdp_tensor t = test_tensor_alloc(GDP_DTYPE_INT32, 1, shape);
    memcpy(t.data, vals, (size_t)n * sizeof(int32_t));
    return t;
}

/* ---- comparisons ------------------------------------------------------------------ */

/* Largest ulp distance between two contiguous tensors of one dtype. */
static int64_t max_ulp(const gdp_tensor *a, const gdp_tensor *b, int64_t *where) {
    int64_t worst = 0;
    *where = 0;
    for (int64_t i = 0; i < gdp_tensor_numel(a); i++) {
        int64_t d = test_ordered_bits(a->dtype, a->data, i) - test_ordered_bits(b->dtype, b->data, i);
        d = d < 0 ? -d : d;
        if (d > worst) {
            worst = d;
            *where = i;
        }
    }
    return worst;
}

/* One ulp of a 16-bit dtype at the magnitude of x (0 for fp32: no allowance). */
static double ulp_at(gdp_dtype_t dt, double x) {
    if (dt == GDP_DTYPE_FP32)
        return 0.0;
    const int mant = dt == GDP_DTYPE_BF16 ? 7 : 10;
    const int min_exp = dt == GDP_DTYPE_BF16 ? -126 : -14;
    int e;
    frexp(fabs(x), &e); /* |x| in [2^(e-1), 2^e) */
    int lead = e - 1;
    if (x == 0 || lead < min_exp)
        lead = min_exp;
    return ldexp(1.0, lead - mant);
}

/* |got - ref| <= atol + rtol |ref| + one ulp of `ulp_dtype` at ref, elementwise (NaN fails). */
static bool compare_bar(const char *what, const gdp_tensor *got, const gdp_tensor *ref, double atol, double rtol,
                        gdp_dtype_t ulp_dtype) {
    const int64_t n = gdp_tensor_numel(ref);
    CHECK(gdp_tensor_numel(got) == n, "%s: %lld elements, reference %lld", what, (long long)gdp_tensor_numel(got),
          (long long)n);
    int64_t bad = 0, worst = -1;
    double worst_excess = -1, max_abs = 0;
    for (int64_t i = 0; i < n && gdp_tensor_numel(got) == n; i++) {
        const double a = gdp_tensor_get(got, i), b = gdp_tensor_get(ref, i);
        const double d = fabs(a - b), bar = atol + rtol * fabs(b) + ulp_at(ulp_dtype, b);
        if (!(d <= bar)) {
            bad++;
            const double excess = isnan(d) ? INFINITY : d - bar;
            if (excess > worst_excess) {
                worst_excess = excess;
                worst = i;
            }
        }
        if (d > max_abs)
            max_abs = d;
    }
    CHECK(bad == 0, "%s: %lld of %lld elements outside atol %.0e rtol %.0e%s; worst [%lld] got %.9g want %.9g", what,
          (long long)bad, (long long)n, atol, rtol, ulp_dtype == GDP_DTYPE_FP32 ? "" : " + 1 ulp", (long long)worst,
          worst >= 0 ? gdp_tensor_get(got, worst) : 0.0, worst >= 0 ? gdp_tensor_get(ref, worst) : 0.0);
    printf("  %-58s max |diff| %.2e over %lld elements\n", what, max_abs, (long long)n);
    return bad == 0;
}

static bool same_bytes(const char *what, const gdp_tensor *a, const gdp_tensor *b) {
    const size_t na = span_bytes(a), nb = span_bytes(b);
    const bool ok = na == nb && memcmp(a->data, b->data, na) == 0;
    CHECK(ok, "%s: not bitwise equal (%zu vs %zu bytes)", what, na, nb);
    return ok;
}

/* ---- CUDA graphs ---------------------------------------------------------------------- */

typedef gdp_status_t (*op_fn)(void *args);

/* Captures one call of fn(args) on the GPU ctx stream into an executable graph. */
static cudaGraphExec_t capture(op_fn fn, void *args) {
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    CUDA_OK(cudaStreamBeginCapture(g_stream, cudaStreamCaptureModeGlobal));
    const gdp_status_t st = fn(args);
    CHECK(st == GDP_STATUS_SUCCESS, "op inside graph capture failed: %s", gdp_last_error());
    CUDA_OK(cudaStreamEndCapture(g_stream, &graph));
    if (graph != NULL) {
        CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
        CUDA_OK(cudaGraphDestroy(graph));
    }
    return exec;
}

static void replay(cudaGraphExec_t exec) {
    if (exec != NULL)
        CUDA_OK(cudaGraphLaunch(exec, g_stream));
    CUDA_OK(cudaStreamSynchronize(g_stream));
}

/* ==================================================================================== */
/* prepare                                                                              */
/* ==================================================================================== */

static const char *const PREP_OUT[5] = {"query", "key", "value", "beta", "g"};

static gdp_tensor *prep_slot(gdp_prepare_args *a, int i) {
    gdp_tensor *outs[9] = {&a->query, &a->key, &a->value, &a->beta, &a->g, &a->x, &a->ba, &a->A_log, &a->dt_bias};
    return outs[i];
}

/* Device copies of the inputs and poisoned device outputs. */
static gdp_prepare_args prep_to_device(const gdp_prepare_args *h) {
    gdp_prepare_args d = *h;
    for (int i = 0; i < 9; i++)
        *prep_slot(&d, i) = i < 5 ? dev_poisoned(prep_slot((gdp_prepare_args *)h, i))
                                  : dev_clone(prep_slot((gdp_prepare_args *)h, i));
    return d;
}

static void prep_fetch(gdp_prepare_args *h, const gdp_prepare_args *d) {
    for (int i = 0; i < 5; i++)
        dev_fetch(prep_slot(h, i), prep_slot((gdp_prepare_args *)d, i));
}

static void prep_free(gdp_prepare_args *a, bool device) {
    for (int i = 0; i < 9; i++)
        device ? dev_free(prep_slot(a, i)) : host_free(prep_slot(a, i));
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
    CHECK_OK(run_prepare(g_gpu, &d, decode));
    prep_fetch(&h, &d);
    int equal = 0;
    for (int i = 0; i < 5; i++) {
        char what[128];
        snprintf(what, sizeof what, "%s: %s vs the eager reference", file, PREP_OUT[i]);
        equal += same_bytes(what, prep_slot(&h, i), &ref[i]);
        host_free(&ref[i]);
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
    a.x = alloc_rows(c->x_dt, 3, xs, c->x_pad);
    a.ba = alloc_rows(c->ba_dt, 3, bs, c->ba_pad);
    a.A_log = test_tensor_alloc(GDP_DTYPE_FP32, 1, hs);
    a.dt_bias = test_tensor_alloc(c->dt_bias_dt, 1, hs);
    fill_normal(&a.x, r, 1.0);
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
            same_bytes(what, a, b);
        } else {
            int64_t where;
            const int64_t ulp = max_ulp(a, b, &where);
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
    CHECK_OK(run_prepare(g_cpu, &h, c->decode));
    gdp_prepare_args g = h; /* GPU results land in fresh host buffers */
    for (int i = 0; i < 5; i++)
        *prep_slot(&g, i) = host_clone(prep_slot(&h, i));
    CHECK_OK(run_prepare(g_gpu, &d, c->decode));
    prep_fetch(&g, &d);
    const int before = g_test_failures;
    prep_compare_cpu(label, &g, &h);

    /* Determinism: a second run writes the same bits. */
    gdp_prepare_args g2 = g;
    for (int i = 0; i < 5; i++)
        *prep_slot(&g2, i) = host_clone(prep_slot(&g, i));
    for (int i = 0; i < 5; i++)
        CUDA_OK(cudaMemset(prep_slot(&d, i)->data, SENTINEL_BYTE, span_bytes(prep_slot(&d, i))));
    CHECK_OK(run_prepare(g_gpu, &d, c->decode));
    prep_fetch(&g2, &d);
    for (int i = 0; i < 5; i++)
        same_bytes("prepare determinism (second run)", prep_slot(&g2, i), prep_slot(&g, i));
    printf("%s: %s (q, k, v bitwise, beta and g <= 4 ulp vs CPU; second run bitwise equal)\n", label,
           g_test_failures == before ? "ok" : "FAILED");
    for (int i = 0; i < 5; i++) {
        host_free(prep_slot(&g, i));
        host_free(prep_slot(&g2, i));
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
    return run_prepare(g_gpu, g->a, g->decode);
}

/* Capture once, then replay with two new sets of inputs: each replay == an eager run. */
static void prepare_graph(test_rng *r, const prep_cfg *c) {
    gdp_prepare_args h = prep_random(r, c);
    gdp_prepare_args d = prep_to_device(&h);
    prep_graph_args ga = {&d, c->decode};
    cudaGraphExec_t exec = capture(prep_graph_fn, &ga);
    gdp_prepare_args eager = h, replayed = h;
    for (int i = 0; i < 5; i++) {
        *prep_slot(&eager, i) = host_clone(prep_slot(&h, i));
        *prep_slot(&replayed, i) = host_clone(prep_slot(&h, i));
    }
    int rounds_ok = 0;
    for (int round = 0; round < 2; round++) {
        gdp_prepare_args fresh = prep_random(r, c);
        dev_put(&d.x, &fresh.x);
        dev_put(&d.ba, &fresh.ba);
        dev_put(&d.A_log, &fresh.A_log);
        dev_put(&d.dt_bias, &fresh.dt_bias);
        CHECK_OK(run_prepare(g_gpu, &d, c->decode));
        prep_fetch(&eager, &d);
        for (int i = 0; i < 5; i++)
            CUDA_OK(cudaMemset(prep_slot(&d, i)->data, SENTINEL_BYTE, span_bytes(prep_slot(&d, i))));
        replay(exec);
        prep_fetch(&replayed, &d);
        int eq = 0;
        for (int i = 0; i < 5; i++)
            eq += same_bytes("prepare graph replay vs eager", prep_slot(&replayed, i), prep_slot(&eager, i));
        rounds_ok += eq == 5;
        prep_free(&fresh, false);
    }
    printf("prepare %s graph (n=%lld T=%lld): %d of 2 replays with new inputs bitwise equal to eager runs\n",
           c->decode ? "decode" : "prefill", (long long)c->n, (long long)c->T, rounds_ok);
    if (exec != NULL)
        CUDA_OK(cudaGraphExecDestroy(exec));
    for (int i = 0; i < 5; i++) {
        host_free(prep_slot(&eager, i));
        host_free(prep_slot(&replayed, i));
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

/* ==================================================================================== */
/* decode (fused recurrent)                                                             */
/* ==================================================================================== */

/* Everything one decode call takes (host or device views). */
typedef struct dec_io {
    gdp_recurrent_args a;
} dec_io;

#define DEC_TENSORS 11
static gdp_tensor *dec_slot(gdp_recurrent_args *a, int i) {
    gdp_tensor *all[DEC_TENSORS] = {&a->q,     &a->k,     &a->v,     &a->g,   &a->beta,          &a->initial_state,
                                    &a->state, &a->state_indices, &a->intermediate_states, &a->o, &a->final_state};
    return all[i];
}
/* Outputs among the slots above (o and final_state are poisoned on the device). */
static bool dec_is_output(int i) { return i >= 9; }

static gdp_recurrent_args dec_to_device(const gdp_recurrent_args *h) {
    gdp_recurrent_args d = *h;
    for (int i = 0; i < DEC_TENSORS; i++) {
        gdp_tensor *src = dec_slot((gdp_recurrent_args *)h, i);
        *dec_slot(&d, i) = gdp_tensor_present(src) && dec_is_output(i) ? dev_poisoned(src) : dev_clone(src);
    }
    return d;
}

/* Fetches the tensors the op writes: o, final_state, state, intermediate_states. */
static void dec_fetch(gdp_recurrent_args *h, const gdp_recurrent_args *d) {
    const int written[4] = {6, 8, 9, 10};
    for (int j = 0; j < 4; j++)
        if (gdp_tensor_present(dec_slot(h, written[j])))
            dev_fetch(dec_slot(h, written[j]), dec_slot((gdp_recurrent_args *)d, written[j]));
}

static gdp_recurrent_args dec_host_clone(const gdp_recurrent_args *h) {
    gdp_recurrent_args c = *h;
    for (int i = 0; i < DEC_TENSORS; i++)
        *dec_slot(&c, i) = host_clone(dec_slot((gdp_recurrent_args *)h, i));
    return c;
}

static void dec_free(gdp_recurrent_args *a, bool device) {
    for (int i = 0; i < DEC_TENSORS; i++)
        device ? dev_free(dec_slot(a, i)) : host_free(dec_slot(a, i));
}

static int32_t slot_of(const gdp_recurrent_args *a, int64_t b) {
    return gdp_tensor_present(&a->state_indices) ? ((const int32_t *)a->state_indices.data)[b] : (int32_t)b;
}

/* Cache-mode invariants of a GPU result `got` started from `before`: rows of -1 requests
 * exactly 0; slots no request names, and their snapshot rows, bitwise as before. */
static void dec_check_untouched(const char *label, const gdp_recurrent_args *got, const gdp_recurrent_args *before) {
    const int64_t B = got->q.shape[0], T = got->q.shape[1], H = got->q.shape[2], V = got->v.shape[3];
    const int64_t slots = got->state.shape[0];
    int64_t nonzero = 0, changed = 0, inter_changed = 0, padded = 0;
    bool *named = calloc((size_t)slots, 1);
    for (int64_t b = 0; b < B; b++) {
        const int32_t s = slot_of(got, b);
        if (s >= 0) {
            named[s] = true;
            continue;
        }
        padded++;
        for (int64_t i = 0; i < T * H * V; i++)
            nonzero += gdp_tensor_get(&got->o, b * T * H * V + i) != 0.0;
    }
    const size_t slot_bytes = span_bytes(&got->state) / (size_t)slots;
    const bool inter = gdp_tensor_present(&got->intermediate_states);
    const size_t inter_bytes = inter ? span_bytes(&got->intermediate_states) / (size_t)slots : 0;
    for (int64_t s = 0; s < slots; s++) {
        if (named[s])
            continue;
        changed += memcmp((char *)got->state.data + s * slot_bytes, (char *)before->state.data + s * slot_bytes,
                          slot_bytes) != 0;
        if (inter)
            inter_changed += memcmp((char *)got->intermediate_states.data + s * inter_bytes,
                                    (char *)before->intermediate_states.data + s * inter_bytes, inter_bytes) != 0;
    }
    free(named);
    CHECK(nonzero == 0, "%s: %lld outputs of -1 rows are not exactly 0", label, (long long)nonzero);
    CHECK(changed == 0, "%s: %lld unnamed slots changed", label, (long long)changed);
    CHECK(inter_changed == 0, "%s: snapshot rows of %lld unnamed slots changed", label, (long long)inter_changed);
    printf("  %s: %lld -1 rows exactly 0; unnamed slots%s bitwise unchanged\n", label, (long long)padded,
           inter ? " and their snapshots" : "");
}

static void decode_golden(const char *file) {
    gdp_st_file *f = test_golden_open(file);
    if (f == NULL)
        return;
    gdp_recurrent_args h = {0};
    gdp_tensor o_ref, state_ref, inter_ref;
    const int32_t M = (int32_t)test_st_meta_num(f, "num_householder", 0);
    const int64_t S = (int64_t)test_st_meta_num(f, "tokens_per_request", 0);
    h.scale = test_st_meta_num(f, "scale", 0);
    h.use_qk_l2norm_in_kernel = (int32_t)test_st_meta_num(f, "use_qk_l2norm_in_kernel", 0);
    h.steps_per_token = M;
    const bool ok = test_st_tensor(f, "q", &h.q) && test_st_tensor(f, "k", &h.k) && test_st_tensor(f, "v", &h.v) &&
                    test_st_tensor(f, "g", &h.g) && test_st_tensor(f, "beta", &h.beta) &&
                    test_st_tensor(f, "state", &h.state) && test_st_tensor(f, "state_indices", &h.state_indices) &&
                    test_st_tensor(f, "o_ref", &o_ref) && test_st_tensor(f, "state_after_ref", &state_ref) &&
                    test_st_tensor(f, "intermediate_states_ref", &inter_ref);
    gdp_st_close(f);
    if (!ok)
        return;
    CHECK(M >= 1 && S >= 1 && h.q.shape[1] == S * M, "%s: metadata M=%d S=%lld vs q steps %lld", file, M,
          (long long)S, (long long)h.q.shape[1]);
    h.intermediate_states = test_tensor_alloc(GDP_DTYPE_FP32, inter_ref.ndim, inter_ref.shape); /* zero-filled */
    for (int pass = 0; pass < 2; pass++) {
        /* pass 0: fp32 o (atol = rtol = 1e-3); pass 1: bf16 o (plus one bf16 ulp). */
        const gdp_dtype_t odt = pass == 0 ? GDP_DTYPE_FP32 : GDP_DTYPE_BF16;
        gdp_recurrent_args run = h;
        run.o = test_tensor_alloc(odt, 4, o_ref.shape);
        gdp_recurrent_args before = dec_host_clone(&run);
        gdp_recurrent_args d = dec_to_device(&run);
        CHECK_OK(gdp_fused_recurrent_gated_delta_rule_update(g_gpu, &d));
        gdp_recurrent_args got = dec_host_clone(&run);
        dec_fetch(&got, &d);
        char what[160];
        printf("%s (M=%d, S=%lld, %s o):\n", file, M, (long long)S, gdp_dtype_name(odt));
        snprintf(what, sizeof what, "%s o (%s)", file, gdp_dtype_name(odt));
        compare_bar(what, &got.o, &o_ref, 1e-3, 1e-3, odt);
        snprintf(what, sizeof what, "%s state after", file);
        compare_bar(what, &got.state, &state_ref, 1e-3, 1e-3, GDP_DTYPE_FP32);
        snprintf(what, sizeof what, "%s intermediate_states", file);
        compare_bar(what, &got.intermediate_states, &inter_ref, 1e-3, 1e-3, GDP_DTYPE_FP32);
        dec_check_untouched(file, &got, &before);
        dec_free(&d, true);
        dec_free(&got, false);    /* clones: owns every buffer */
        dec_free(&before, false); /* likewise */
        host_free(&run.o);        /* the rest of run is h's */
    }
    dec_free(&h, false);
    host_free(&o_ref);
    host_free(&state_ref);
    host_free(&inter_ref);
}

typedef struct dec_cfg {
    int64_t B, S, M, H, K, V, slots;
    gdp_dtype_t in_dt, state_dt, o_dt;
    bool has_g, has_beta, l2norm;
    bool cache, identity, inter; /* cache mode: indices absent (identity), snapshots */
    bool dense_init, final;      /* dense mode: initial_state given (state_dt), output_final_state */
    bool gdp_pattern;            /* q only on copy M-1, g only on copy 0 */
    double scale;
    int pad_every; /* every pad_every-th request is -1 (0: none) */
} dec_cfg;

static gdp_recurrent_args dec_random(test_rng *r, const dec_cfg *c) {
    gdp_recurrent_args a = {.scale = c->scale, .use_qk_l2norm_in_kernel = c->l2norm,
                            .steps_per_token = (int32_t)c->M, .output_final_state = c->final};
    const int64_t T = c->S * c->M;
    const int64_t qs[4] = {c->B, T, c->H, c->K}, vs[4] = {c->B, T, c->H, c->V}, gs[3] = {c->B, T, c->H};
    a.q = test_tensor_alloc(c->in_dt, 4, qs);
    a.k = test_tensor_alloc(c->in_dt, 4, qs);
    a.v = test_tensor_alloc(c->in_dt, 4, vs);
    /* Without the in-kernel norm, keys of norm about 1 keep the recurrence contractive. */
    const double qk_scale = c->l2norm ? 1.0 : 1.0 / sqrt((double)c->K);
    fill_normal(&a.q, r, qk_scale);
    fill_normal(&a.k, r, qk_scale);
    fill_normal(&a.v, r, 1.0);
    if (c->has_g) {
        a.g = test_tensor_alloc(GDP_DTYPE_FP32, 3, gs);
        test_fill_uniform(&a.g, r, -1.0, 0.0);
    }
    if (c->has_beta) {
        a.beta = test_tensor_alloc(c->in_dt, 3, gs);
        test_fill_uniform(&a.beta, r, 0.0, 1.0);
    }
    if (c->gdp_pattern) {
        for (int64_t b = 0; b < c->B; b++)
            for (int64_t t = 0; t < T; t++)
                for (int64_t h = 0; h < c->H; h++) {
                    const int64_t row = (b * T + t) * c->H + h, m = t % c->M;
                    if (m != c->M - 1)
                        for (int64_t i = 0; i < c->K; i++)
                            gdp_tensor_set(&a.q, row * c->K + i, 0.0);
                    if (m != 0 && c->has_g)
                        gdp_tensor_set(&a.g, row, 0.0);
                }
    }
    a.o = test_tensor_alloc(c->o_dt, 4, vs);
    const int64_t bhkv[4] = {c->B, c->H, c->K, c->V};
    if (c->cache) {
        const int64_t ss[4] = {c->slots, c->H, c->K, c->V};
        a.state = test_tensor_alloc(c->state_dt, 4, ss);
        test_fill_uniform(&a.state, r, -1.0, 1.0);
        if (!c->identity) {
            /* Distinct slots from a shuffled pool, with -1 padding every pad_every rows. */
            int32_t *pool = malloc(sizeof(int32_t) * (size_t)c->slots), *idx = malloc(sizeof(int32_t) * (size_t)c->B);
            for (int64_t s = 0; s < c->slots; s++)
                pool[s] = (int32_t)s;
            for (int64_t s = c->slots - 1; s > 0; s--) {
                const int64_t j = (int64_t)(test_uniform(r) * (double)(s + 1));
                const int32_t t = pool[s];
                pool[s] = pool[j];
                pool[j] = t;
            }
            for (int64_t b = 0; b < c->B; b++)
                idx[b] = c->pad_every > 0 && b % c->pad_every == c->pad_every - 1 ? -1 : pool[b];
            a.state_indices = int_tensor(idx, c->B);
            free(pool);
            free(idx);
        }
        if (c->inter) {
            const int64_t is[5] = {c->slots, c->S, c->H, c->K, c->V};
            a.intermediate_states = test_tensor_alloc(c->state_dt, 5, is);
            fill_value(&a.intermediate_states, 7.0); /* rows nobody writes must keep this */
        }
    } else {
        if (c->dense_init) {
            a.initial_state = test_tensor_alloc(c->state_dt, 4, bhkv);
            test_fill_uniform(&a.initial_state, r, -1.0, 1.0);
        }
        if (c->final)
            a.final_state = test_tensor_alloc(GDP_DTYPE_FP32, 4, bhkv);
    }
    return a;
}

static void decode_vs_cpu(test_rng *r, const dec_cfg *c) {
    char label[200];
    snprintf(label, sizeof label,
             "decode B=%lld S=%lld M=%lld H=%lld K=%lld V=%lld in %s state %s o %s %s%s%s%s%s",
             (long long)c->B, (long long)c->S, (long long)c->M, (long long)c->H, (long long)c->K, (long long)c->V,
             gdp_dtype_name(c->in_dt), gdp_dtype_name(c->state_dt), gdp_dtype_name(c->o_dt),
             c->cache ? (c->identity ? "cache(identity)" : "cache") : (c->dense_init ? "dense(init)" : "dense"),
             c->l2norm ? " l2" : "", c->has_g ? "" : " no-g", c->has_beta ? "" : " no-beta",
             c->inter ? " snapshots" : "");
    gdp_recurrent_args h = dec_random(r, c);
    gdp_recurrent_args before = dec_host_clone(&h);
    gdp_recurrent_args d = dec_to_device(&h);
    CHECK_OK(gdp_fused_recurrent_gated_delta_rule_update(g_cpu, &h));
    CHECK_OK(gdp_fused_recurrent_gated_delta_rule_update(g_gpu, &d));
    gdp_recurrent_args got = dec_host_clone(&before);
    dec_fetch(&got, &d);

    const bool fp32 = c->in_dt == GDP_DTYPE_FP32 && c->state_dt == GDP_DTYPE_FP32;
    const double tol = fp32 ? 1e-4 : 1e-3;
    printf("%s (bar %.0e):\n", label, tol);
    const int before_failures = g_test_failures;
    compare_bar("o vs CPU", &got.o, &h.o, tol, tol, c->o_dt);
    if (c->cache) {
        compare_bar("state vs CPU", &got.state, &h.state, tol, tol, c->state_dt);
        if (c->inter)
            compare_bar("intermediate_states vs CPU", &got.intermediate_states, &h.intermediate_states, tol, tol,
                        c->state_dt);
        dec_check_untouched(label, &got, &before);
    } else if (c->final) {
        compare_bar("final_state vs CPU", &got.final_state, &h.final_state, tol, tol, GDP_DTYPE_FP32);
    }

    /* Determinism: the same inputs (state restored) give the same bits. */
    if (c->cache)
        dev_put(&d.state, &before.state);
    CHECK_OK(gdp_fused_recurrent_gated_delta_rule_update(g_gpu, &d));
    gdp_recurrent_args again = dec_host_clone(&before);
    dec_fetch(&again, &d);
    same_bytes("decode determinism: o", &again.o, &got.o);
    if (c->cache)
        same_bytes("decode determinism: state", &again.state, &got.state);
    if (c->final && !c->cache)
        same_bytes("decode determinism: final_state", &again.final_state, &got.final_state);

    /* Every decode kernel (GDP_DECODE_STATE=regs | smem | head: the register kernel, the
     * shared-memory one with a block per 32 value columns, or with a block per (request,
     * head); the last two for 16-byte columns; the default picks by batch and dtype,
     * recurrent.cu) from the same inputs gives the default's bits. */
    const char *home = getenv("GDP_DECODE_STATE");
    char *saved = home != NULL ? strdup(home) : NULL;
    static const char *const kernels[3] = {"regs", "smem", "head"};
    for (int kk = 0; kk < 3; kk++) {
        setenv("GDP_DECODE_STATE", kernels[kk], 1);
        if (c->cache)
            dev_put(&d.state, &before.state);
        CHECK_OK(gdp_fused_recurrent_gated_delta_rule_update(g_gpu, &d));
        gdp_recurrent_args other = dec_host_clone(&before);
        dec_fetch(&other, &d);
        char what[64];
        snprintf(what, sizeof what, "decode kernel %s: o", kernels[kk]);
        same_bytes(what, &other.o, &got.o);
        if (c->cache) {
            snprintf(what, sizeof what, "decode kernel %s: state", kernels[kk]);
            same_bytes(what, &other.state, &got.state);
            if (c->inter) {
                snprintf(what, sizeof what, "decode kernel %s: snapshots", kernels[kk]);
                same_bytes(what, &other.intermediate_states, &got.intermediate_states);
            }
        }
        if (c->final && !c->cache) {
            snprintf(what, sizeof what, "decode kernel %s: final_state", kernels[kk]);
            same_bytes(what, &other.final_state, &got.final_state);
        }
        dec_free(&other, false);
    }
    if (saved != NULL)
        setenv("GDP_DECODE_STATE", saved, 1);
    else
        unsetenv("GDP_DECODE_STATE");
    free(saved);
    printf("  %s\n", g_test_failures == before_failures
                          ? "ok (a second run and every decode kernel bitwise equal)" : "FAILED");
    dec_free(&again, false);
    dec_free(&got, false);
    dec_free(&d, true);
    dec_free(&before, false);
    dec_free(&h, false);
}

static gdp_status_t dec_graph_fn(void *p) { return gdp_fused_recurrent_gated_delta_rule_update(g_gpu, p); }

/* Capture once; replay with new q/k/v/g/beta, a new cache and a new padding pattern:
 * each replay bitwise equals an eager run from the same inputs. */
static void decode_graph(test_rng *r, const dec_cfg *c) {
    gdp_recurrent_args h = dec_random(r, c);
    gdp_recurrent_args d = dec_to_device(&h);
    cudaGraphExec_t exec = capture(dec_graph_fn, &d);
    int rounds_ok = 0;
    for (int round = 0; round < 2; round++) {
        dec_cfg c2 = *c;
        c2.pad_every = round == 0 ? 2 : 5; /* a different padding count each time */
        gdp_recurrent_args fresh = dec_random(r, &c2);
        for (int i = 0; i < 9; i++)
            if (gdp_tensor_present(dec_slot(&fresh, i)))
                dev_put(dec_slot(&d, i), dec_slot(&fresh, i));
        CHECK_OK(gdp_fused_recurrent_gated_delta_rule_update(g_gpu, &d));
        gdp_recurrent_args eager = dec_host_clone(&fresh);
        dec_fetch(&eager, &d);
        /* Back to the fresh inputs (the eager call updated the cache in place). */
        for (int i = 0; i < 9; i++)
            if (gdp_tensor_present(dec_slot(&fresh, i)))
                dev_put(dec_slot(&d, i), dec_slot(&fresh, i));
        CUDA_OK(cudaMemset(d.o.data, SENTINEL_BYTE, span_bytes(&d.o)));
        replay(exec);
        gdp_recurrent_args replayed = dec_host_clone(&fresh);
        dec_fetch(&replayed, &d);
        const int before = g_test_failures;
        same_bytes("decode graph replay vs eager: o", &replayed.o, &eager.o);
        same_bytes("decode graph replay vs eager: state", &replayed.state, &eager.state);
        if (c->inter)
            same_bytes("decode graph replay vs eager: snapshots", &replayed.intermediate_states,
                       &eager.intermediate_states);
        rounds_ok += g_test_failures == before;
        dec_free(&replayed, false);
        dec_free(&eager, false);
        dec_free(&fresh, false);
    }
    printf("decode graph (B=%lld S=%lld M=%lld H=%lld K=%lld V=%lld): %d of 2 replays with new inputs and padding "
           "bitwise equal to eager runs\n",
           (long long)c->B, (long long)c->S, (long long)c->M, (long long)c->H, (long long)c->K, (long long)c->V,
           rounds_ok);
    if (exec != NULL)
        CUDA_OK(cudaGraphExecDestroy(exec));
    dec_free(&d, true);
    dec_free(&h, false);
}

/* Steps [t0, t0 + n) of a contiguous host tensor [B, T, ...] as a new tensor [B, n, ...]. */
static gdp_tensor slice_steps(const gdp_tensor *src, int64_t t0, int64_t n) {
    if (!gdp_tensor_present(src))
        return *src;
    int64_t shape[GDP_MAX_DIMS];
    for (int32_t d = 0; d < src->ndim; d++)
        shape[d] = src->shape[d];
    shape[1] = n;
    gdp_tensor out = test_tensor_alloc(src->dtype, src->ndim, shape);
    const size_t row = gdp_dtype_size(src->dtype) * (size_t)(gdp_tensor_numel(src) / (src->shape[0] * src->shape[1]));
    for (int64_t b = 0; b < src->shape[0]; b++)
        memcpy((char *)out.data + (size_t)(b * n) * row, (const char *)src->data + (size_t)(b * src->shape[1] + t0) * row,
               (size_t)n * row);
    return out;
}

/* One call of S tokens (with snapshots) against S calls of one token from the same cache, on
 * the GPU with an fp32 cache (the state stays fp32 between tokens either way): o, the final
 * state and every snapshot bitwise equal to the token-by-token run (gdp-math.md 5.3). */
static void decode_tokens_vs_single(test_rng *r, const dec_cfg *c) {
    gdp_recurrent_args h = dec_random(r, c);
    const int64_t B = c->B, S = c->S, M = c->M, slots = c->slots;
    gdp_recurrent_args d = dec_to_device(&h);
    CHECK_OK(gdp_fused_recurrent_gated_delta_rule_update(g_gpu, &d));
    gdp_recurrent_args all = dec_host_clone(&h);
    dec_fetch(&all, &d);
    dec_free(&d, true);

    /* Token by token from the same starting cache. */
    gdp_tensor state_dev = dev_clone(&h.state);
    gdp_tensor idx_dev = dev_clone(&h.state_indices);
    const size_t slot_bytes = span_bytes(&h.state) / (size_t)slots;
    const size_t inter_row = slot_bytes; /* one [H, K, V] block of the snapshots */
    int64_t o_diff = 0, snap_diff = 0;
    gdp_tensor state_now = host_clone(&h.state);
    for (int64_t s = 0; s < S; s++) {
        gdp_recurrent_args one = {.scale = h.scale, .use_qk_l2norm_in_kernel = h.use_qk_l2norm_in_kernel,
                                  .steps_per_token = h.steps_per_token};
        gdp_tensor q = slice_steps(&h.q, s * M, M), k = slice_steps(&h.k, s * M, M), v = slice_steps(&h.v, s * M, M);
        gdp_tensor g = slice_steps(&h.g, s * M, M), beta = slice_steps(&h.beta, s * M, M);
        gdp_tensor o = slice_steps(&h.o, s * M, M);
        one.q = dev_clone(&q), one.k = dev_clone(&k), one.v = dev_clone(&v);
        one.g = dev_clone(&g), one.beta = dev_clone(&beta);
        one.o = dev_poisoned(&o);
        one.state = state_dev;
        one.state_indices = idx_dev;
        CHECK_OK(gdp_fused_recurrent_gated_delta_rule_update(g_gpu, &one));
        dev_fetch(&o, &one.o);
        dev_fetch(&state_now, &state_dev);
        /* o of token s in the S-token call. */
        gdp_tensor o_all_s = slice_steps(&all.o, s * M, M);
        o_diff += memcmp(o.data, o_all_s.data, span_bytes(&o)) != 0;
        /* Snapshot [slot, s] of every named slot == the slot after the s-th single call. */
        for (int64_t b = 0; b < B; b++) {
            const int32_t slot = slot_of(&h, b);
            if (slot < 0)
                continue;
            snap_diff += memcmp((char *)all.intermediate_states.data + (size_t)(slot * S + s) * inter_row,
                                (char *)state_now.data + (size_t)slot * slot_bytes, slot_bytes) != 0;
        }
        host_free(&o_all_s);
        dev_free(&one.q), dev_free(&one.k), dev_free(&one.v), dev_free(&one.g), dev_free(&one.beta);
        dev_free(&one.o);
        host_free(&q), host_free(&k), host_free(&v), host_free(&o);
        host_free(&g), host_free(&beta); /* absent ones hold NULL */
    }
    CHECK(o_diff == 0, "decode %lld tokens in one call vs one at a time: o of %lld tokens not bitwise equal",
          (long long)S, (long long)o_diff);
    CHECK(snap_diff == 0, "decode %lld tokens in one call vs one at a time: %lld snapshots not bitwise equal",
          (long long)S, (long long)snap_diff);
    same_bytes("decode S tokens in one call vs one at a time: final cache", &all.state, &state_now);
    printf("decode B=%lld S=%lld M=%lld H=%lld K=%lld V=%lld (%s cache): one call of %lld tokens == %lld one-token "
           "calls bitwise (o, every snapshot, the final cache)\n",
           (long long)B, (long long)S, (long long)M, (long long)c->H, (long long)c->K, (long long)c->V,
           gdp_dtype_name(c->state_dt), (long long)S, (long long)S);
    dev_free(&state_dev);
    dev_free(&idx_dev);
    host_free(&state_now);
    dec_free(&all, false);
    dec_free(&h, false);
}

/* The fused decode end (gdp_decode_recurrent_norm, src/decode_core.h) against the chain it
 * replaces, the decode op then the grouped gated RMSNorm of its last Householder copies, on
 * the GPU from the same inputs: o, the cache and the norm's output bit for bit; whether the
 * one launch ran is asserted (expect_fused). z is a row view of a wider buffer, as in the
 * layer. Then the fused call captured in a graph and replayed twice with a fresh cache: both
 * replays equal the eager call (the second one shows the arrival counters reset). */
typedef struct end_call {
    gdp_recurrent_args rec;
    gdp_tensor out, y, z, w;
    int64_t group;
} end_call;
static gdp_status_t end_graph_fn(void *p) {
    end_call *c = p;
    return gdp_decode_recurrent_norm(g_gpu, &c->rec, &c->out, &c->y, &c->z, &c->w, c->group, 1e-5);
}

static gdp_tensor last_copy_view(const gdp_recurrent_args *d, int64_t B, int64_t M, int64_t H, int64_t V) {
    const size_t es = gdp_dtype_size(d->o.dtype);
    return (gdp_tensor){.data = (char *)d->o.data + (size_t)((M - 1) * H * V) * es, .dtype = d->o.dtype, .ndim = 2,
                        .shape = {B, H * V}, .stride = {M * H * V, 1}};
}

static void decode_end_vs_chain(test_rng *r, const dec_cfg *c, int64_t hpg, bool expect_fused, const char *kernel) {
    const int64_t B = c->B, M = c->M, H = c->H, V = c->V, d = H * V, n = hpg * V, pitch = d + 16;
    gdp_recurrent_args h = dec_random(r, c);
    const int64_t z_shape[1] = {B * pitch}, w_shape[1] = {d}, out_shape[2] = {B, d};
    gdp_tensor zh = test_tensor_alloc(c->o_dt, 1, z_shape), wh = test_tensor_alloc(c->o_dt, 1, w_shape);
    gdp_tensor outh = test_tensor_alloc(c->o_dt, 2, out_shape);
    fill_normal(&zh, r, 1.0), fill_normal(&wh, r, 0.5);
    gdp_tensor zd = dev_clone(&zh), wd = dev_clone(&wh);
    const gdp_tensor z = {.data = zd.data, .dtype = c->o_dt, .ndim = 2, .shape = {B, d}, .stride = {pitch, 1}};
    const gdp_tensor w = {.data = wd.data, .dtype = c->o_dt, .ndim = 1, .shape = {d}, .stride = {1}};
    const char *home = getenv("GDP_DECODE_STATE");
    char *saved = home != NULL ? strdup(home) : NULL;
    if (kernel != NULL)
        setenv("GDP_DECODE_STATE", kernel, 1);

    gdp_recurrent_args d1 = dec_to_device(&h), d2 = dec_to_device(&h);
    gdp_tensor out1 = dev_poisoned(&outh), out2 = dev_poisoned(&outh);
    gdp_tensor y1 = last_copy_view(&d1, B, M, H, V), y2 = last_copy_view(&d2, B, M, H, V);
    CHECK_OK(gdp_fused_recurrent_gated_delta_rule_update(g_gpu, &d1));
    CHECK_OK(gdp_gated_rmsnorm(g_gpu, &out1, &y1, &z, &w, n, 1e-5));
    bool fused = false;
    CHECK_OK(gdp_decode_recurrent_norm_ex(g_gpu, &d2, &out2, &y2, &z, &w, n, 1e-5, &fused));
    CHECK(fused == expect_fused, "decode end (B %lld, H %lld, group of %lld heads, V %lld): fused %d, expected %d",
          (long long)B, (long long)H, (long long)hpg, (long long)V, (int)fused, (int)expect_fused);
    gdp_recurrent_args g1 = dec_host_clone(&h), g2 = dec_host_clone(&h);
    dec_fetch(&g1, &d1);
    dec_fetch(&g2, &d2);
    gdp_tensor o1 = host_clone(&outh), o2 = host_clone(&outh);
    dev_fetch(&o1, &out1);
    dev_fetch(&o2, &out2);
    const int before = g_test_failures;
    same_bytes("decode end fused vs chain: o", &g2.o, &g1.o);
    if (c->cache)
        same_bytes("decode end fused vs chain: state", &g2.state, &g1.state);
    same_bytes("decode end fused vs chain: norm out", &o2, &o1);

    /* graph: the fused call replayed twice from a fresh cache, each == the eager call */
    int replays_ok = 0;
    if (expect_fused) {
        end_call call = {.rec = d2, .out = out2, .y = y2, .z = z, .w = w, .group = n};
        cudaGraphExec_t exec = capture(end_graph_fn, &call);
        for (int round = 0; round < 2; round++) {
            if (c->cache)
                dev_put(&d2.state, &h.state);
            CUDA_OK(cudaMemset(out2.data, SENTINEL_BYTE, span_bytes(&out2)));
            replay(exec);
            gdp_tensor o3 = host_clone(&outh);
            dev_fetch(&o3, &out2);
            const int b0 = g_test_failures;
            same_bytes("decode end graph replay vs eager: norm out", &o3, &o1);
            replays_ok += g_test_failures == b0;
            host_free(&o3);
        }
        if (exec != NULL)
            CUDA_OK(cudaGraphExecDestroy(exec));
    }
    printf("decode end fused vs chain (B %lld, S %lld, M %lld, H %lld, heads per norm group %lld, K %lld, V %lld, "
           "state %s%s, GDP_DECODE_STATE %s): %s; fused %s; graph replays %d of %d\n",
           (long long)B, (long long)c->S, (long long)M, (long long)H, (long long)hpg, (long long)c->K, (long long)V,
           gdp_dtype_name(c->state_dt), c->pad_every ? ", -1 rows" : "", kernel ? kernel : "default",
           g_test_failures == before ? "bitwise equal" : "DIFFERENT", fused ? "yes" : "no (two ops)", replays_ok,
           expect_fused ? 2 : 0);
    if (saved != NULL)
        setenv("GDP_DECODE_STATE", saved, 1);
    else
        unsetenv("GDP_DECODE_STATE");
    free(saved);
    dec_free(&g1, false), dec_free(&g2, false);
    dec_free(&d1, true), dec_free(&d2, true);
    dev_free(&out1), dev_free(&out2), dev_free(&zd), dev_free(&wd);
    host_free(&o1), host_free(&o2), host_free(&zh), host_free(&wh), host_free(&outh);
    dec_free(&h, false);
}

static void decode_tests(test_rng *r) {
    const char *files[3] = {"decode_m1_k128.safetensors", "decode_m2_slots_pad.safetensors",
                            "decode_m3_draft3.safetensors"};
    for (int i = 0; i < 3; i++)
        decode_golden(files[i]);
    const gdp_dtype_t F32 = GDP_DTYPE_FP32, BF = GDP_DTYPE_BF16, F16 = GDP_DTYPE_FP16;
    const dec_cfg cases[] = {
        /* B, S, M, H, K, V, slots, in, state, o, g, beta, l2, cache, identity, inter, init, final, pattern, scale, pad */
        {8, 1, 2, 4, 128, 128, 12, BF, F32, BF, true, true, true, true, false, true, false, false, true, 0, 3},
        {5, 3, 3, 2, 64, 64, 9, BF, BF, F32, true, true, true, true, false, true, false, false, true, 0, 4},
        {4, 4, 1, 3, 32, 32, 4, F32, F32, F32, true, true, false, true, true, false, false, false, false, 0.3, 0},
        {3, 1, 2, 2, 256, 64, 5, F16, F32, F16, true, true, true, true, false, false, false, false, true, 0, 0},
        {2, 2, 1, 2, 256, 128, 3, BF, BF, BF, true, true, true, true, false, true, false, false, false, 0, 0},
        {3, 2, 2, 2, 100, 30, 6, F32, F32, F32, false, false, true, true, false, true, false, false, false, 0, 2},
        {4, 1, 3, 2, 16, 12, 4, BF, BF, F32, true, true, true, true, true, false, false, false, true, 0.5, 0},
        {4, 1, 2, 2, 64, 64, 0, F32, F32, F32, true, true, true, false, false, false, true, true, true, 0, 0},
        {3, 2, 2, 3, 128, 128, 0, BF, F32, F32, true, true, true, false, false, false, false, true, true, 0, 0},
        {2, 1, 2, 2, 64, 64, 0, F16, F16, F32, true, true, true, false, false, false, true, true, false, 0, 0},
        {2, 1, 2, 2, 48, 40, 0, BF, BF, F32, true, false, false, false, false, false, true, false, false, 0, 0},
        {64, 1, 2, 16, 128, 128, 80, BF, F32, BF, true, true, true, true, false, false, false, false, true, 0, 16},
        {6, 4, 2, 4, 128, 128, 10, BF, F32, BF, true, true, true, true, false, true, false, false, true, 0, 3},
        /* Grids larger than two generations of resident blocks: the L2 prefetch path. */
        {40, 1, 2, 16, 128, 128, 0, BF, F32, F32, true, true, true, false, false, false, true, true, true, 0, 0},
        {48, 1, 2, 16, 128, 128, 56, BF, BF, BF, true, true, true, true, false, false, false, false, true, 0, 7},
        /* The benchmark shapes: H=32, V=64, M=3; many requests of a bf16 cache with drafts. */
        {24, 1, 3, 32, 128, 64, 30, BF, F32, BF, true, true, true, true, false, false, false, false, true, 0, 5},
        {20, 2, 2, 16, 128, 128, 24, BF, BF, BF, true, true, true, true, false, true, false, false, true, 0, 6},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        decode_vs_cpu(r, &cases[i]);
    decode_graph(r, &cases[0]);
    decode_graph(r, &cases[12]);
    /* S tokens in one call == S one-token calls (fp32 cache, snapshots, -1 rows). */
    const dec_cfg multi[] = {
        {6, 4, 2, 4, 128, 128, 10, BF, F32, BF, true, true, true, true, false, true, false, false, true, 0, 3},
        {5, 3, 3, 2, 128, 64, 8, BF, F32, F32, true, true, true, true, false, true, false, false, true, 0, 4},
    };
    for (size_t i = 0; i < sizeof multi / sizeof multi[0]; i++)
        decode_tokens_vs_single(r, &multi[i]);
    /* The fused decode end: the layer's shapes (norm groups of 4 heads x 128 = 512, the
     * layer's B=1; GQA 2 with V 64 and -1 rows; a bf16 cache), a group of one head, and two
     * calls that do not fit (a 1024-element group; two tokens a request) and run the ops. */
    const dec_cfg ends[] = {
        {1, 1, 2, 16, 128, 128, 4, BF, F32, BF, true, true, true, true, false, false, false, false, true, 0, 0},
        {37, 1, 3, 8, 128, 64, 40, BF, F32, BF, true, true, true, true, false, false, false, false, true, 0, 3},
        {12, 1, 2, 8, 128, 128, 16, BF, BF, BF, true, true, true, true, false, false, false, false, true, 0, 5},
        {5, 1, 2, 4, 64, 64, 6, BF, F32, BF, true, true, true, true, false, false, false, false, true, 0, 0},
        {3, 1, 2, 8, 128, 128, 4, BF, F32, BF, true, true, true, true, false, false, false, false, true, 0, 0},
        {3, 2, 2, 4, 128, 128, 4, BF, F32, BF, true, true, true, true, false, false, false, false, true, 0, 0},
    };
    decode_end_vs_chain(r, &ends[0], 4, true, NULL);
    decode_end_vs_chain(r, &ends[1], 2, true, NULL);
    decode_end_vs_chain(r, &ends[1], 2, true, "head");
    decode_end_vs_chain(r, &ends[2], 4, true, NULL);
    decode_end_vs_chain(r, &ends[2], 4, true, "head");
    decode_end_vs_chain(r, &ends[3], 1, true, NULL);
    decode_end_vs_chain(r, &ends[4], 8, false, NULL); /* 8 x 128 = 1024 elements a group */
    decode_end_vs_chain(r, &ends[5], 4, false, NULL); /* two tokens a request */
}

/* ==================================================================================== */
/* conv1d                                                                               */
/* ==================================================================================== */

static int64_t bf16_ulp_distance_values(double a, double b) {
    const uint16_t ua = gdp_double_to_bf16(a), ub = gdp_double_to_bf16(b);
    const int64_t oa = (ua & 0x8000u) ? -(int64_t)(ua & 0x7fffu) : ua, ob = (ub & 0x8000u) ? -(int64_t)(ub & 0x7fffu) : ub;
    return oa > ob ? oa - ob : ob - oa;
}

/* y vs a reference y of the same dtype: fp32 within 1e-5, 16-bit within one ulp. */
static void compare_y(const char *what, const gdp_tensor *got, const gdp_tensor *ref) {
    if (got->dtype == GDP_DTYPE_FP32) {
        compare_bar(what, got, ref, 1e-5, 1e-5, GDP_DTYPE_FP32);
        return;
    }
    int64_t where;
    const int64_t ulp = max_ulp(got, ref, &where);
    CHECK(ulp <= 1, "%s: %lld ulp at [%lld] (got %.9g, want %.9g); bar 1 ulp", what, (long long)ulp, (long long)where,
          gdp_tensor_get(got, where), gdp_tensor_get(ref, where));
    printf("  %-58s max %lld ulp over %lld elements\n", what, (long long)ulp, (long long)gdp_tensor_numel(got));
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
    gdp_conv1d_varlen_args d = {.x = dev_clone(&x), .weight = dev_clone(&weight), .conv_state = dev_clone(&state0),
                                .state_indices = dev_clone(&idx), .cu_seqlens = dev_clone(&cu), .silu = 1,
                                .y = dev_poisoned(&y)};
    CHECK_OK(gdp_causal_conv1d_varlen(g_gpu, &d));
    gdp_tensor state = host_clone(&state0);
    dev_fetch(&y, &d.y);
    dev_fetch(&state, &d.conv_state);
    int64_t worst = 0;
    for (int64_t i = 0; i < gdp_tensor_numel(&y); i++) {
        const int64_t u = bf16_ulp_distance_values(gdp_tensor_get(&y, i), gdp_tensor_get(&y_ref, i));
        worst = u > worst ? u : worst;
    }
    CHECK(worst <= 1, "conv_varlen golden: bf16 y is %lld bf16 ulp from y_ref (bar 1)", (long long)worst);
    same_bytes("conv_varlen golden: conv_state vs conv_state_after_ref", &state, &state_ref);
    printf("conv_varlen.safetensors (T=%lld, C=%lld, W=%lld): bf16 y within %lld bf16 ulp of y_ref; conv_state %s\n",
           (long long)x.shape[0], (long long)x.shape[1], (long long)weight.shape[1], (long long)worst,
           memcmp(state.data, state_ref.data, span_bytes(&state)) == 0 ? "bitwise equal" : "DIFFERENT");
    dev_free(&d.x), dev_free(&d.weight), dev_free(&d.conv_state), dev_free(&d.state_indices);
    dev_free(&d.cu_seqlens), dev_free(&d.y);
    host_free(&x), host_free(&weight), host_free(&state0), host_free(&state_ref), host_free(&idx);
    host_free(&cu), host_free(&y_ref), host_free(&y), host_free(&state);
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
    a.x = alloc_rows(c->x_dt, 2, xs, c->x_pad);
    fill_normal(&a.x, r, 1.0);
    a.weight = test_tensor_alloc(c->w_dt, 2, ws);
    test_fill_uniform(&a.weight, r, -1, 1);
    if (c->bias) {
        a.bias = test_tensor_alloc(c->w_dt, 1, bs);
        test_fill_uniform(&a.bias, r, -0.5, 0.5);
    }
    a.conv_state = test_tensor_alloc(c->state_dt, 3, ss);
    fill_normal(&a.conv_state, r, 1.0);
    a.state_indices = int_tensor(c->slot, c->nseq);
    a.cu_seqlens = int_tensor(cu, c->nseq + 1);
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
        *varlen_slot(&d, i) = i == 6 ? dev_poisoned(&h->y) : dev_clone(varlen_slot((gdp_conv1d_varlen_args *)h, i));
    return d;
}

static void varlen_free(gdp_conv1d_varlen_args *a, bool device) {
    for (int i = 0; i < VARLEN_TENSORS; i++)
        device ? dev_free(varlen_slot(a, i)) : host_free(varlen_slot(a, i));
}

static void conv_varlen_vs_cpu(test_rng *r, const varlen_cfg *c) {
    char label[160];
    snprintf(label, sizeof label, "conv varlen C=%lld W=%lld seqs=%d pad=%lld x %s state %s y %s%s%s%s",
             (long long)c->C, (long long)c->W, c->nseq, (long long)c->pad_tokens, gdp_dtype_name(c->x_dt),
             gdp_dtype_name(c->state_dt), gdp_dtype_name(c->y_dt), c->bias ? " bias" : "", c->silu ? " silu" : "",
             c->x_pad ? " strided" : "");
    gdp_conv1d_varlen_args h = varlen_random(r, c);
    gdp_conv1d_varlen_args d = varlen_to_device(&h);
    gdp_tensor y = host_clone(&h.y), state = host_clone(&h.conv_state), state0 = host_clone(&h.conv_state);
    CHECK_OK(gdp_causal_conv1d_varlen(g_cpu, &h));
    CHECK_OK(gdp_causal_conv1d_varlen(g_gpu, &d));
    dev_fetch(&y, &d.y);
    dev_fetch(&state, &d.conv_state);
    printf("%s:\n", label);
    const int before = g_test_failures;
    compare_y("y vs CPU", &y, &h.y);
    same_bytes("conv varlen: states vs CPU", &state, &h.conv_state);
    /* Determinism: the same inputs and starting states give the same bits. */
    dev_put(&d.conv_state, &state0);
    CUDA_OK(cudaMemset(d.y.data, SENTINEL_BYTE, span_bytes(&d.y)));
    CHECK_OK(gdp_causal_conv1d_varlen(g_gpu, &d));
    gdp_tensor y2 = host_clone(&y), state2 = host_clone(&state);
    dev_fetch(&y2, &d.y);
    dev_fetch(&state2, &d.conv_state);
    same_bytes("conv varlen determinism: y", &y2, &y);
    same_bytes("conv varlen determinism: states", &state2, &state);
    printf("  %s\n", g_test_failures == before ? "ok (states bitwise equal to the CPU's; second run bitwise equal)"
                                               : "FAILED");
    host_free(&y), host_free(&state), host_free(&state0), host_free(&y2), host_free(&state2);
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
    a.x = alloc_rows(c->x_dt, 3, xs, c->x_pad);
    fill_normal(&a.x, r, 1.0);
    a.weight = test_tensor_alloc(c->x_dt, 2, ws);
    test_fill_uniform(&a.weight, r, -1, 1);
    if (c->bias) {
        a.bias = test_tensor_alloc(GDP_DTYPE_FP32, 1, bs);
        test_fill_uniform(&a.bias, r, -0.5, 0.5);
    }
    a.conv_state = test_tensor_alloc(c->state_dt, 3, ss);
    fill_normal(&a.conv_state, r, 1.0);
    if (!c->identity) {
        int32_t idx[64];
        for (int64_t b = 0; b < c->B; b++)
            idx[b] = c->pad_every > 0 && b % c->pad_every == c->pad_every - 1 ? -1
                                                                              : (int32_t)((b * 7 + 3) % c->slots);
        a.conv_state_indices = int_tensor(idx, c->B);
    }
    if (c->inter) {
        const int64_t is[4] = {c->slots, c->S, c->C, c->W};
        a.intermediate_conv_states = test_tensor_alloc(c->state_dt, 4, is);
        fill_value(&a.intermediate_conv_states, 5.0);
    }
    a.y = test_tensor_alloc(c->y_dt, 3, xs);
    return a;
}

static gdp_conv1d_update_args update_to_device(const gdp_conv1d_update_args *h) {
    gdp_conv1d_update_args d = *h;
    for (int i = 0; i < UPDATE_TENSORS; i++)
        *update_slot(&d, i) = i == 6 ? dev_poisoned(&h->y) : dev_clone(update_slot((gdp_conv1d_update_args *)h, i));
    return d;
}

static void update_free(gdp_conv1d_update_args *a, bool device) {
    for (int i = 0; i < UPDATE_TENSORS; i++)
        device ? dev_free(update_slot(a, i)) : host_free(update_slot(a, i));
}

static void conv_update_vs_cpu(test_rng *r, const update_cfg *c) {
    char label[160];
    snprintf(label, sizeof label, "conv update B=%lld S=%lld C=%lld W=%lld x %s state %s y %s%s%s%s%s",
             (long long)c->B, (long long)c->S, (long long)c->C, (long long)c->W, gdp_dtype_name(c->x_dt),
             gdp_dtype_name(c->state_dt), gdp_dtype_name(c->y_dt), c->identity ? " identity" : "",
             c->inter ? " snapshots" : "", c->bias ? " bias" : "", c->x_pad ? " strided" : "");
    gdp_conv1d_update_args h = update_random(r, c);
    gdp_conv1d_update_args d = update_to_device(&h);
    gdp_tensor y = host_clone(&h.y), state = host_clone(&h.conv_state), state0 = host_clone(&h.conv_state);
    gdp_tensor inter = host_clone(&h.intermediate_conv_states);
    CHECK_OK(gdp_causal_conv1d_update(g_cpu, &h));
    CHECK_OK(gdp_causal_conv1d_update(g_gpu, &d));
    dev_fetch(&y, &d.y);
    dev_fetch(&state, &d.conv_state);
    if (c->inter)
        dev_fetch(&inter, &d.intermediate_conv_states);
    printf("%s:\n", label);
    const int before = g_test_failures;
    compare_y("y vs CPU", &y, &h.y);
    same_bytes("conv update: states vs CPU", &state, &h.conv_state);
    if (c->inter)
        same_bytes("conv update: snapshots vs CPU", &inter, &h.intermediate_conv_states);
    /* Determinism: rerun from the original state. */
    dev_put(&d.conv_state, &state0);
    CHECK_OK(gdp_causal_conv1d_update(g_gpu, &d));
    gdp_tensor y2 = host_clone(&y);
    dev_fetch(&y2, &d.y);
    same_bytes("conv update determinism: y", &y2, &y);
    printf("  %s\n", g_test_failures == before ? "ok (states and snapshots bitwise equal to the CPU's; second run "
                                                 "bitwise equal)"
                                               : "FAILED");
    host_free(&y), host_free(&y2), host_free(&state), host_free(&state0), host_free(&inter);
    update_free(&d, true);
    update_free(&h, false);
}

static gdp_status_t update_graph_fn(void *p) { return gdp_causal_conv1d_update(g_gpu, p); }
static gdp_status_t varlen_graph_fn(void *p) { return gdp_causal_conv1d_varlen(g_gpu, p); }

/* Capture, then replay with new inputs and states: each replay == an eager run, bitwise. */
static void conv_graphs(test_rng *r, const update_cfg *uc, const varlen_cfg *vc) {
    int ok_update = 0, ok_varlen = 0;
    gdp_conv1d_update_args uh = update_random(r, uc);
    gdp_conv1d_update_args ud = update_to_device(&uh);
    cudaGraphExec_t exec = capture(update_graph_fn, &ud);
    for (int round = 0; round < 2; round++) {
        gdp_conv1d_update_args fresh = update_random(r, uc);
        for (int i = 0; i < 6; i++)
            if (gdp_tensor_present(update_slot(&fresh, i)))
                dev_put(update_slot(&ud, i), update_slot(&fresh, i));
        CHECK_OK(gdp_causal_conv1d_update(g_gpu, &ud));
        gdp_tensor ye = host_clone(&fresh.y), se = host_clone(&fresh.conv_state);
        dev_fetch(&ye, &ud.y);
        dev_fetch(&se, &ud.conv_state);
        dev_put(&ud.conv_state, &fresh.conv_state);
        CUDA_OK(cudaMemset(ud.y.data, SENTINEL_BYTE, span_bytes(&ud.y)));
        replay(exec);
        gdp_tensor yr = host_clone(&fresh.y), sr = host_clone(&fresh.conv_state);
        dev_fetch(&yr, &ud.y);
        dev_fetch(&sr, &ud.conv_state);
        const int before = g_test_failures;
        same_bytes("conv update graph replay vs eager: y", &yr, &ye);
        same_bytes("conv update graph replay vs eager: state", &sr, &se);
        ok_update += g_test_failures == before;
        host_free(&ye), host_free(&se), host_free(&yr), host_free(&sr);
        update_free(&fresh, false);
    }
    if (exec != NULL)
        CUDA_OK(cudaGraphExecDestroy(exec));
    update_free(&ud, true);
    update_free(&uh, false);

    gdp_conv1d_varlen_args vh = varlen_random(r, vc);
    gdp_conv1d_varlen_args vd = varlen_to_device(&vh);
    exec = capture(varlen_graph_fn, &vd);
    for (int round = 0; round < 2; round++) {
        gdp_conv1d_varlen_args fresh = varlen_random(r, vc);
        for (int i = 0; i < 6; i++)
            if (gdp_tensor_present(varlen_slot(&fresh, i)))
                dev_put(varlen_slot(&vd, i), varlen_slot(&fresh, i));
        CHECK_OK(gdp_causal_conv1d_varlen(g_gpu, &vd));
        gdp_tensor ye = host_clone(&fresh.y), se = host_clone(&fresh.conv_state);
        dev_fetch(&ye, &vd.y);
        dev_fetch(&se, &vd.conv_state);
        dev_put(&vd.conv_state, &fresh.conv_state);
        CUDA_OK(cudaMemset(vd.y.data, SENTINEL_BYTE, span_bytes(&vd.y)));
        replay(exec);
        gdp_tensor yr = host_clone(&fresh.y), sr = host_clone(&fresh.conv_state);
        dev_fetch(&yr, &vd.y);
        dev_fetch(&sr, &vd.conv_state);
        const int before = g_test_failures;
        same_bytes("conv varlen graph replay vs eager: y", &yr, &ye);
        same_bytes("conv varlen graph replay vs eager: state", &sr, &se);
        ok_varlen += g_test_failures == before;
        host_free(&ye), host_free(&se), host_free(&yr), host_free(&sr);
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
    fill_normal(&proj, r, 1.0);
    const int64_t w_shape[2] = {C, 4}, c_shape[1] = {C}, st_shape[3] = {c->slots, C, 4}, h_shape[1] = {c->H};
    gdp_tensor w = test_tensor_alloc(c->act, 2, w_shape), b = test_tensor_alloc(c->act, 1, c_shape);
    gdp_tensor st = test_tensor_alloc(c->state, 3, st_shape);
    gdp_tensor A_log = test_tensor_alloc(GDP_DTYPE_FP32, 1, h_shape), dtb = test_tensor_alloc(c->act, 1, h_shape);
    fill_normal(&w, r, 0.5), fill_normal(&b, r, 0.1), fill_normal(&st, r, 1.0);
    test_fill_uniform(&A_log, r, -1.0, 1.0), test_fill_uniform(&dtb, r, -0.5, 0.5);
    int32_t idx[64];
    for (int64_t i = 0; i < c->n; i++)
        idx[i] = i % 3 == 2 ? -1 : (int32_t)((i * 7 + 1) % c->slots); /* 7 is prime to every case's slots: distinct */
    gdp_tensor dproj = dev_clone(&proj), dw = dev_clone(&w), db = dev_clone(&b), dA = dev_clone(&A_log);
    gdp_tensor ddt = dev_clone(&dtb), dst_chain = dev_clone(&st), dst_fused = dev_clone(&st);
    gdp_tensor hidx = int_tensor(idx, c->n), didx = dev_clone(&hidx);
    const int64_t y_shape[3] = {c->n, c->S, C}, q_shape[4] = {c->n, E, c->H, c->N}, v_shape[4] = {c->n, E, c->H, c->P};
    const int64_t g_shape[3] = {c->n, E, c->H};
    gdp_tensor hy = test_tensor_alloc(c->act, 3, y_shape), hq = test_tensor_alloc(c->act, 4, q_shape);
    gdp_tensor hv = test_tensor_alloc(c->act, 4, v_shape), hbeta = test_tensor_alloc(c->act, 3, g_shape);
    gdp_tensor hg = test_tensor_alloc(GDP_DTYPE_FP32, 3, g_shape);
    gdp_tensor out[2][6]; /* chain, fused: q, k, v, beta, g, y */
    for (int f = 0; f < 2; f++) {
        out[f][0] = dev_poisoned(&hq), out[f][1] = dev_poisoned(&hq), out[f][2] = dev_poisoned(&hv);
        out[f][3] = dev_poisoned(&hbeta), out[f][4] = dev_poisoned(&hg), out[f][5] = dev_poisoned(&hy);
    }
    for (int f = 0; f < 2; f++) {
        gdp_conv1d_update_args cu = {
            .x = {.data = (char *)dproj.data, .dtype = c->act, .ndim = 3, .shape = {c->n, c->S, C},
                  .stride = {c->S * pitch, pitch, 1}},
            .weight = dw, .conv_state = f == 0 ? dst_chain : dst_fused, .conv_state_indices = didx, .silu = 1,
            .y = out[f][5]};
        if (c->bias)
            cu.bias = db;
        gdp_prepare_args pr = {
            .x = cu.y,
            .ba = {.data = (char *)dproj.data + (size_t)C * gdp_dtype_size(c->act), .dtype = c->act, .ndim = 3,
                   .shape = {c->n, c->S, BA}, .stride = {c->S * pitch, pitch, 1}},
            .A_log = dA, .dt_bias = ddt, .num_householder = (int32_t)c->M, .num_heads = (int32_t)c->H,
            .num_groups = (int32_t)c->G, .head_dim = (int32_t)c->P, .state_dim = (int32_t)c->N,
            .query = out[f][0], .key = out[f][1], .value = out[f][2], .beta = out[f][3], .g = out[f][4]};
        if (f == 0) {
            CHECK_OK(gdp_causal_conv1d_update(g_gpu, &cu));
            CHECK_OK(gdp_decode_prepare(g_gpu, &pr));
        } else {
            CHECK_OK(gdp_decode_conv_prepare(g_gpu, &cu, &pr));
        }
    }
    printf("decode conv + prepare fused vs the chain (n %lld, S %lld, M %lld, H %lld, G %lld, P %lld, N %lld, act %s, "
           "state %s%s):\n", (long long)c->n, (long long)c->S, (long long)c->M, (long long)c->H, (long long)c->G,
           (long long)c->P, (long long)c->N, gdp_dtype_name(c->act), gdp_dtype_name(c->state), c->bias ? ", bias" : "");
    const char *names[5] = {"query", "key", "value", "beta", "g"};
    const gdp_tensor *likes[5] = {&hq, &hq, &hv, &hbeta, &hg};
    int same = 0;
    for (int i = 0; i < 5; i++) {
        gdp_tensor a = host_clone(likes[i]), bb = host_clone(likes[i]);
        dev_fetch(&a, &out[0][i]);
        dev_fetch(&bb, &out[1][i]);
        char what[64];
        snprintf(what, sizeof what, "fused vs chain: %s", names[i]);
        same += same_bytes(what, &bb, &a);
        host_free(&a), host_free(&bb);
    }
    gdp_tensor sa = host_clone(&st), sb = host_clone(&st);
    dev_fetch(&sa, &dst_chain);
    dev_fetch(&sb, &dst_fused);
    same += same_bytes("fused vs chain: conv state", &sb, &sa);
    printf("  %d of 6 outputs bitwise equal\n", same);
    host_free(&sa), host_free(&sb);
    for (int f = 0; f < 2; f++)
        for (int i = 0; i < 6; i++)
            dev_free(&out[f][i]);
    dev_free(&dproj), dev_free(&dw), dev_free(&db), dev_free(&dA), dev_free(&ddt), dev_free(&dst_chain);
    dev_free(&dst_fused), dev_free(&didx);
    host_free(&proj), host_free(&w), host_free(&b), host_free(&st), host_free(&A_log), host_free(&dtb);
    host_free(&hidx), host_free(&hy), host_free(&hq), host_free(&hv), host_free(&hbeta), host_free(&hg);
}

static void conv_tests(test_rng *r) {
    conv_golden();
    const gdp_dtype_t FB = GDP_DTYPE_BF16, FF = GDP_DTYPE_FP32, FH = GDP_DTYPE_FP16;
    const fuse_cfg fcases[] = {
        /* n, S, M, H, G, P, N, slots, act, state, bias */
        {1, 1, 2, 16, 4, 128, 128, 4, FB, FB, false},   /* the layer's decode shape at B = 1 */
        {37, 1, 3, 8, 2, 64, 32, 40, FB, FF, true},     /* GQA 4, M 3, fp32 conv state, -1 slots */
        {9, 1, 1, 4, 4, 16, 16, 12, FF, FF, true},      /* fp32 activations (4-element runs) */
        {6, 1, 2, 6, 3, 24, 40, 8, FH, FH, false},      /* fp16 */
        {5, 2, 2, 8, 2, 32, 32, 8, FB, FB, true},       /* two tokens: the chain itself (fallback) */
    };
    for (size_t i = 0; i < sizeof fcases / sizeof fcases[0]; i++)
        decode_core_vs_chain(r, &fcases[i]);
    const gdp_dtype_t F32 = GDP_DTYPE_FP32, BF = GDP_DTYPE_BF16, F16 = GDP_DTYPE_FP16;
    const varlen_cfg vcases[] = {
        /* C, W, slots, pad tokens, x pad, nseq, lens, slots, x, w, state, y, bias, silu */
        {24, 4, 8, 5, 0, 6, {0, 1, 2, 3, 40, 100}, {3, 0, -1, 5, 7, 1}, BF, BF, BF, BF, false, true},
        {130, 4, 4, 0, 6, 3, {33, 64, 65}, {2, -1, 0}, F32, F32, F32, F32, true, true},
        {64, 2, 3, 31, 0, 3, {1, 0, 70}, {1, 2, 0}, BF, F32, BF, F32, true, false},
        {40, 8, 6, 2, 3, 5, {7, 8, 9, 0, 200}, {5, 4, -1, 3, 2}, F16, F16, F32, F16, false, true},
        {16, 3, 2, 40, 0, 1, {0}, {1}, F32, F32, F32, F32, false, true}, /* only padding tokens */
    };
    for (size_t i = 0; i < sizeof vcases / sizeof vcases[0]; i++)
        conv_varlen_vs_cpu(r, &vcases[i]);
    const update_cfg ucases[] = {
        /* B, S, C, W, slots, x pad, pad every, identity, inter, bias, silu, x, state, y */
        {6, 1, 96, 4, 9, 0, 3, false, false, false, true, BF, BF, BF},
        {5, 3, 40, 4, 8, 8, 2, false, true, true, true, F32, F32, F32},
        {3, 2, 130, 8, 3, 0, 0, true, true, false, false, BF, F32, F32},
        {4, 4, 33, 2, 6, 1, 4, false, true, true, true, F16, F16, F16},
    };
    for (size_t i = 0; i < sizeof ucases / sizeof ucases[0]; i++)
        conv_update_vs_cpu(r, &ucases[i]);
    conv_graphs(r, &ucases[1], &vcases[0]);
}

/* ==================================================================================== */
/* norms                                                                                */
/* ==================================================================================== */

static void norm_golden(void) {
    gdp_st_file *f = test_golden_open("gated_norm.safetensors");
    if (f == NULL)
        return;
    gdp_tensor y, z, w, ref32, ref16;
    const bool ok = test_st_tensor(f, "y", &y) && test_st_tensor(f, "z", &z) && test_st_tensor(f, "weight", &w) &&
                    test_st_tensor(f, "out_ref", &ref32) && test_st_tensor(f, "out_bf16_ref", &ref16);
    const double eps = test_st_meta_num(f, "eps", -1);
    const int64_t group = (int64_t)test_st_meta_num(f, "group_size", 0);
    gdp_st_close(f);
    if (!ok)
        return;
    gdp_tensor dy = dev_clone(&y), dz = dev_clone(&z), dw = dev_clone(&w);
    gdp_tensor o16 = test_tensor_alloc(GDP_DTYPE_BF16, y.ndim, y.shape), o32 = test_tensor_alloc(GDP_DTYPE_FP32, y.ndim, y.shape);
    gdp_tensor d16 = dev_poisoned(&o16), d32 = dev_poisoned(&o32);
    CHECK_OK(gdp_gated_rmsnorm(g_gpu, &d16, &dy, &dz, &dw, group, eps));
    CHECK_OK(gdp_gated_rmsnorm(g_gpu, &d32, &dy, &dz, &dw, group, eps));
    dev_fetch(&o16, &d16);
    dev_fetch(&o32, &d32);
    int64_t where, exact = 0;
    const int64_t ulp = max_ulp(&o16, &ref16, &where);
    for (int64_t i = 0; i < gdp_tensor_numel(&o16); i++)
        exact += ((uint16_t *)o16.data)[i] == ((uint16_t *)ref16.data)[i];
    CHECK(ulp <= 1, "gated_norm golden: bf16 out %lld ulp from out_bf16_ref at [%lld] (bar 1)", (long long)ulp,
          (long long)where);
    printf("gated_norm.safetensors (group %lld, eps %g):\n", (long long)group, eps);
    compare_bar("fp32 out vs out_ref (rtol 1e-5)", &o32, &ref32, 0, 1e-5, GDP_DTYPE_FP32);
    printf("  bf16 out: %lld of %lld bitwise equal to out_bf16_ref, max %lld ulp\n", (long long)exact,
           (long long)gdp_tensor_numel(&o16), (long long)ulp);
    dev_free(&dy), dev_free(&dz), dev_free(&dw), dev_free(&d16), dev_free(&d32);
    host_free(&y), host_free(&z), host_free(&w), host_free(&ref32), host_free(&ref16), host_free(&o16);
    host_free(&o32);
}

/* out vs a CPU out of the same dtype: fp32 within 1e-5 relative, 16-bit within one ulp. */
static void compare_norm_out(const char *what, const gdp_tensor *got, const gdp_tensor *ref) {
    if (got->dtype == GDP_DTYPE_FP32) {
        compare_bar(what, got, ref, 0, 1e-5, GDP_DTYPE_FP32);
        return;
    }
    int64_t where;
    const int64_t ulp = max_ulp(got, ref, &where);
    CHECK(ulp <= 1, "%s: %lld ulp at [%lld] (got %.9g, want %.9g); bar 1 ulp", what, (long long)ulp, (long long)where,
          gdp_tensor_get(got, where), gdp_tensor_get(ref, where));
    printf("  %-58s max %lld ulp over %lld elements\n", what, (long long)ulp, (long long)gdp_tensor_numel(got));
}

typedef struct norm_cfg {
    int kind; /* 0 gated RMSNorm, 1 RMSNorm, 2 L2 norm */
    int64_t rows, d, group;
    gdp_dtype_t in_dt, w_dt, out_dt;
} norm_cfg;

static void norm_vs_cpu(test_rng *r, const norm_cfg *c) {
    static const char *kinds[3] = {"gated rmsnorm", "rmsnorm", "l2norm"};
    char label[160];
    snprintf(label, sizeof label, "%s rows=%lld d=%lld group=%lld in %s out %s", kinds[c->kind], (long long)c->rows,
             (long long)c->d, (long long)c->group, gdp_dtype_name(c->in_dt), gdp_dtype_name(c->out_dt));
    const int64_t shape[2] = {c->rows, c->d}, ws[1] = {c->d};
    gdp_tensor x = test_tensor_alloc(c->in_dt, 2, shape), z = test_tensor_alloc(c->in_dt, 2, shape);
    gdp_tensor w = test_tensor_alloc(c->w_dt, 1, ws);
    gdp_tensor out = test_tensor_alloc(c->out_dt, 2, shape), got = test_tensor_alloc(c->out_dt, 2, shape);
    fill_normal(&x, r, 2.0);
    fill_normal(&z, r, 2.0);
    test_fill_uniform(&w, r, 0.5, 1.5);
    gdp_tensor dx = dev_clone(&x), dz = dev_clone(&z), dw = dev_clone(&w), dout = dev_poisoned(&out);
    const double eps = 1e-5;
    switch (c->kind) {
    case 0:
        CHECK_OK(gdp_gated_rmsnorm(g_cpu, &out, &x, &z, &w, c->group, eps));
        CHECK_OK(gdp_gated_rmsnorm(g_gpu, &dout, &dx, &dz, &dw, c->group, eps));
        break;
    case 1:
        CHECK_OK(gdp_rmsnorm(g_cpu, &out, &x, &w, eps));
        CHECK_OK(gdp_rmsnorm(g_gpu, &dout, &dx, &dw, eps));
        break;
    default:
        CHECK_OK(gdp_l2norm(g_cpu, &out, &x));
        CHECK_OK(gdp_l2norm(g_gpu, &dout, &dx));
        break;
    }
    dev_fetch(&got, &dout);
    printf("%s:\n", label);
    compare_norm_out("out vs CPU", &got, &out);
    if (c->kind == 2 && c->in_dt == c->out_dt) {
        /* In place (y == x) gives the out-of-place bits. */
        CHECK_OK(gdp_l2norm(g_gpu, &dx, &dx));
        gdp_tensor inplace = host_clone(&got);
        dev_fetch(&inplace, &dx);
        same_bytes("l2norm in place vs out of place", &inplace, &got);
        printf("  in place: %s\n", memcmp(inplace.data, got.data, span_bytes(&got)) == 0 ? "bitwise equal" : "DIFFERENT");
        host_free(&inplace);
    }
    dev_free(&dx), dev_free(&dz), dev_free(&dw), dev_free(&dout);
    host_free(&x), host_free(&z), host_free(&w), host_free(&out), host_free(&got);
}

/* The gated norm on row views (y and z 2-D slices of wider rows: the layer reads the gate
 * from its projection and y from the decode op's last copies): the GPU vs the CPU on the
 * same views, and bitwise equal to the GPU on the rows made contiguous. Pitches whose rows
 * stay 16-byte aligned take the fast path, the others the general one. */
static void norm_row_views(test_rng *r) {
    const int64_t rows = 6, d = 2048, group = 512, shape[2] = {rows, d}, ws[1] = {d};
    const int64_t pitches[2][2] = {{2048 + 64, 7680}, {2048 + 4, 2048 + 12}}; /* aligned; not aligned */
    for (int k = 0; k < 2; k++) {
        gdp_tensor view[2], packed[2];
        for (int v = 0; v < 2; v++) {
            const int64_t flat[1] = {rows * pitches[k][v]};
            gdp_tensor buf = test_tensor_alloc(GDP_DTYPE_BF16, 1, flat);
            fill_normal(&buf, r, 2.0);
            view[v] = (gdp_tensor){.data = buf.data, .dtype = GDP_DTYPE_BF16, .ndim = 2, .shape = {rows, d},
                                   .stride = {pitches[k][v], 1}};
            packed[v] = test_tensor_alloc(GDP_DTYPE_BF16, 2, shape);
            for (int64_t i = 0; i < rows * d; i++)
                gdp_tensor_set(&packed[v], i, gdp_tensor_get(&view[v], i));
        }
        gdp_tensor w = test_tensor_alloc(GDP_DTYPE_BF16, 1, ws);
        test_fill_uniform(&w, r, 0.5, 1.5);
        gdp_tensor out = test_tensor_alloc(GDP_DTYPE_BF16, 2, shape), got = test_tensor_alloc(GDP_DTYPE_BF16, 2, shape);
        gdp_tensor got_packed = test_tensor_alloc(GDP_DTYPE_BF16, 2, shape);
        gdp_tensor dy = dev_clone(&view[0]), dz = dev_clone(&view[1]), dw = dev_clone(&w);
        gdp_tensor dyp = dev_clone(&packed[0]), dzp = dev_clone(&packed[1]);
        gdp_tensor dout = dev_poisoned(&out), doutp = dev_poisoned(&out);
        CHECK_OK(gdp_gated_rmsnorm(g_cpu, &out, &view[0], &view[1], &w, group, 1e-5));
        CHECK_OK(gdp_gated_rmsnorm(g_gpu, &dout, &dy, &dz, &dw, group, 1e-5));
        CHECK_OK(gdp_gated_rmsnorm(g_gpu, &doutp, &dyp, &dzp, &dw, group, 1e-5));
        dev_fetch(&got, &dout);
        dev_fetch(&got_packed, &doutp);
        printf("gated rmsnorm on row views (y pitch %lld, z pitch %lld, %s path):\n", (long long)pitches[k][0],
               (long long)pitches[k][1], k == 0 ? "fast" : "general");
        compare_norm_out("out vs CPU on the same views", &got, &out);
        same_bytes("row views vs the same rows contiguous", &got, &got_packed);
        dev_free(&dy), dev_free(&dz), dev_free(&dw), dev_free(&dyp), dev_free(&dzp), dev_free(&dout), dev_free(&doutp);
        for (int v = 0; v < 2; v++)
            free(view[v].data), host_free(&packed[v]);
        host_free(&w), host_free(&out), host_free(&got), host_free(&got_packed);
    }
}

static void norm_tests(test_rng *r) {
    norm_golden();
    norm_row_views(r);
    const gdp_dtype_t F32 = GDP_DTYPE_FP32, BF = GDP_DTYPE_BF16, F16 = GDP_DTYPE_FP16;
    const norm_cfg cases[] = {
        {0, 33, 512, 128, BF, BF, BF}, {0, 7, 256, 256, F32, F32, F32}, {0, 50, 96, 32, F16, BF, F32},
        {0, 4, 48, 12, BF, F32, F16},  {1, 7, 4096, 4096, BF, BF, BF},  {1, 100, 33, 33, F32, F32, F32},
        {2, 35, 128, 128, BF, BF, BF}, {2, 300, 100, 100, F32, F32, F32}, {2, 64, 256, 256, F16, F16, F32},
        /* every chunk count of the fast path (norms.cu): warp per vector with 2 and 4 chunks
         * per lane, block per vector with 1, 4 and 8; the layer's pre-norm (fp32 residual in,
         * bf16 out) and its gated norm shape (groups of 512) */
        {0, 5, 2048, 512, BF, BF, BF},  {0, 3, 2048, 1024, F16, F16, F16}, {1, 9, 2048, 2048, F32, BF, BF},
        {1, 3, 8192, 8192, BF, BF, BF}, {1, 2, 16384, 16384, BF, F32, F32}, {2, 4, 1000, 1000, BF, BF, BF},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        norm_vs_cpu(r, &cases[i]);
}

/* ==================================================================================== */

int main(int argc, char **argv) {
    const char *family = argc > 1 ? argv[1] : "all";
    char name[64];
    snprintf(name, sizeof name, "test_ops_gpu %s", family);
    int count = 0;
    const cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess || count == 0) {
        printf("%s: skipped: no CUDA device (%s)\n", name, err != cudaSuccess ? cudaGetErrorString(err) : "0 devices");
        return TEST_SKIP;
    }
    CHECK_OK(gdp_ctx_init(&g_gpu, GDP_BACKEND_CUDA, 0));
    CHECK_OK(gdp_ctx_init(&g_cpu, GDP_BACKEND_CPU, 0));
    if (g_gpu == NULL || g_cpu == NULL)
        return test_finish(name);
    /* A blocking stream: the test's plain cudaMemcpy/cudaMemset calls (legacy default stream)
     * are ordered with the work the ops enqueue on it. */
    CUDA_OK(cudaStreamCreate(&g_stream));
    CHECK_OK(gdp_ctx_set_stream(g_gpu, g_stream));
    test_rng rng;
    test_rng_seed(&rng, 20261129);
    const bool all = strcmp(family, "all") == 0;
    bool known = all;
    if (all || strcmp(family, "prepare") == 0) {
        known = true;
        prepare_tests(&rng);
    }
    if (all || strcmp(family, "decode") == 0) {
        known = true;
        decode_tests(&rng);
    }
    if (all || strcmp(family, "conv") == 0) {
        known = true;
        conv_tests(&rng);
    }
    if (all || strcmp(family, "norm") == 0) {
        known = true;
        norm_tests(&rng);
    }
    CHECK(known, "unknown family '%s' (prepare, decode, conv, norm or all)", family);
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaStreamDestroy(g_stream));
    gdp_ctx_free(g_gpu);
    gdp_ctx_free(g_cpu);
    return test_finish(name);
}

#else /* !GDP_HAVE_CUDA */

int main(int argc, char **argv) {
    printf("test_ops_gpu %s: skipped: this libgdp was built without the CUDA backend\n", argc > 1 ? argv[1] : "all");
    return TEST_SKIP;
}

#endif
