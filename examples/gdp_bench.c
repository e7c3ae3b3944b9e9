/*
 * gdp_bench.c: gdp-bench, the benchmark program. `gdp-bench ops` times the GDP ops on the
 * shapes of ../shared/docs/performance.md through the public API on one GPU, and prints an
 * nccl-tests-style table: '#' header lines (version, device, method, bounds), fixed-width
 * rows, and a footer with the count of wrong values.
 *
 *   gdp-bench ops [-o|--op all|prefill|decode|decode-key|prepare|gemm] [-i|--iters N] [-w|--warmup N]
 *   mpirun -n N gdp-bench layer|coll [options]   (examples/bench_layer.c)
 *
 * Per row: the median, min and max over N calls (CUDA events around each call; decode and
 * prepare replay a captured CUDA graph; L2 flushed by a 256 MB write before each call when
 * the working set is under twice the L2), tokens/s, achieved bytes/s and FLOP/s, the
 * shape's bound and the fraction of it reached, the peer's figure from performance.md and
 * peer/ours. Bounds: decode 2 K V bytes per (request, head) of state element size (fp32 8 KV,
 * bf16 4 KV; plus S K V for the snapshots of S > 1 draft tokens) over 4.17e12 B/s;
 * prefill F = M (6CK + 4CV + 2C^2/3 + 4KV) + 2KV FLOP per token and head over 7.9e14 FLOP/s;
 * prepare and gemm the bytes they must move over 4.17e12 B/s (gemm: the projection GEMM of a
 * decode step, src/backend.h, on its two paths: GDP_GEMM_SKINNY off (cuBLASLt) and on; then the
 * norm-GEMMs, src/decode_core.h, under GDP_NORM_GEMM chain, serial and pdl, rows 1 to 8).
 * Checks (#wrong): decode compares request 0 of the last call with the CPU backend (atol =
 * rtol = 1e-3) and counts non-finite outputs; prepare compares every output with the CPU
 * backend (q, k, v bitwise, beta and g within 4 ulp); prefill counts non-finite or unwritten
 * outputs. Under each prefill row a '#' line splits the op's time by stage (gdp/profile.h: the
 * cumsums, WY, the state sweep, the outputs; the one-kernel path whole): the median of N eager
 * calls, each profiled alone. Exit status 0 when every row ran and #wrong is 0, 1 otherwise; without a GPU it
 * prints why and exits 0. Options, timing loop, columns and footers: bench_common.h.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_common.h"
#include "backend.h"     /* gdp_gemm_nt_ex, the layer's projection GEMM (internal) */
#include "decode_core.h" /* gdp_norm_gemm, the layer's norm-GEMMs (internal) */
#include "gdp/gdp.h"
#include "gdp/profile.h"
#include "kernels/gdp_kernels.h" /* which chunk kernels a prefill row ran (gdp_cuda_chunk_hopper_*) */

#define COPY_BW 4.17e12   /* measured device-to-device copy, bytes read + written per second */
#define BF16_FLOPS 7.9e14 /* measured dense bf16 GEMM rate, FLOP/s */
#define CHUNK 64.0

/* gdp-bench ops's options. */
typedef struct ops_opts {
    const char *op;
    int iters, warmup;
} ops_opts;

static const char *const OPS_SYNOPSIS = "ops [options]\n"
                                        "       mpirun -n N gdp-bench layer|coll [options]   (layer steps and "
                                        "collectives across ranks;\n"
                                        "                                                     --help for their options)";

static int ops_table(ops_opts *o, bench_opt *t) {
    const bench_opt opts[] = {
        {"op", 'o', BENCH_OPT_CHOICE, "all", "which rows to run (decode-key: the four decode target rows)", &o->op, 0, 0,
         "all|prefill|decode|decode-key|prepare|gemm"},
        {"iters", 'i', BENCH_OPT_INT, "20", "timed calls per row", &o->iters, 10, 1000000, NULL},
        {"warmup", 'w', BENCH_OPT_INT, "3", "untimed calls before timing", &o->warmup, 0, 1000000, NULL},
    };
    _Static_assert(sizeof opts / sizeof opts[0] <= BENCH_MAX_OPTS, "the table outgrows BENCH_MAX_OPTS");
    memcpy(t, opts, sizeof opts);
    return (int)(sizeof opts / sizeof opts[0]);
}

#ifdef GDP_HAVE_CUDA

/* ---- helpers ------------------------------------------------------------------------ */

static int g_errors = 0; /* failed API or CUDA calls: a row that cannot run */

#define CUDA_TRY(call)                                                                                      \
    do {                                                                                                    \
        cudaError_t e_ = (call);                                                                            \
        if (e_ != cudaSuccess) {                                                                            \
            fprintf(stderr, "gdp-bench: %s failed: %s (%s:%d)\n", #call, cudaGetErrorString(e_), __FILE__, \
                    __LINE__);                                                                              \
            g_errors++;                                                                                     \
        }                                                                                                   \
    } while (0)

typedef struct bench_env {
    gdp_ctx_t gpu, cpu;
    cudaStream_t stream;
    void *flush;         /* written before each call to evict the L2 */
    size_t flush_bytes;
    size_t l2_bytes;
    int iters, warmup;
} bench_env;

static bench_env *g_env; /* the ops' function-pointer wrappers read the ctx from here */

typedef struct row_stats {
    int ran;          /* 0: unsupported or failed (reason in note) */
    double med_us, min_us, max_us;
    long long wrong;  /* elements that failed the row's check */
    char note[96];
} row_stats;

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
static double urand(void) { return (double)(bench_xorshift64s(&g_rng) >> 11) * 0x1.0p-53; } /* [0, 1) */
static double nrand(void) {
    double u1 = urand(), u2 = urand();
    if (u1 < 1e-300)
        u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

/* Host buffer of n elements of dtype dt filled by gen() (rounded to the dtype). */
static void *host_fill(gdp_dtype_t dt, int64_t n, double (*gen)(void *), void *ctx) {
    void *p = malloc((size_t)n * gdp_dtype_size(dt) + 1);
    for (int64_t i = 0; i < n; i++) {
        const double v = gen(ctx);
        switch (dt) {
        case GDP_DTYPE_FP32: ((float *)p)[i] = (float)v; break;
        case GDP_DTYPE_BF16: ((uint16_t *)p)[i] = gdp_float_to_bf16((float)v); break;
        case GDP_DTYPE_FP16: ((uint16_t *)p)[i] = gdp_float_to_fp16((float)v); break;
        default: ((int32_t *)p)[i] = (int32_t)v; break;
        }
    }
    return p;
}

/* The prefill rows' q, k and v: standard normals in bf16 from one host buffer, sliced per tensor and
 * shared by every row (each row's tensors are a prefix of it), grown, never regenerated, when a row
 * needs more; a pair of values a Box-Muller draw, in float. Drawn per tensor and row with nrand (one
 * double-precision draw a value, the other half thrown away), the five rows' 900 M values took most of
 * the 40 s that `ops --op prefill` ran, device time the kernels' measurement did not need. */
static uint16_t *g_normals;
static int64_t g_normals_n;
static const uint16_t *normals_bf16(int64_t n) {
    if (n <= g_normals_n)
        return g_normals;
    uint16_t *grown = realloc(g_normals, (size_t)(n + 1) * sizeof(uint16_t));
    if (grown == NULL) {
        fprintf(stderr, "gdp-bench: out of host memory for %lld bf16 inputs\n", (long long)n);
        exit(1);
    }
    for (int64_t i = g_normals_n; i < n; i += 2) {
        const float u1 = fmaxf((float)urand(), 1e-30f), u2 = (float)urand();
        const float r = sqrtf(-2.0f * logf(u1));
        grown[i] = gdp_float_to_bf16(r * cosf(6.2831853f * u2));
        grown[i + 1] = gdp_float_to_bf16(r * sinf(6.2831853f * u2)); /* the buffer holds n + 1: an odd n's last pair fits */
    }
    g_normals = grown;
    g_normals_n = n;
    return g_normals;
}

static double elem(const void *p, gdp_dtype_t dt, int64_t i) {
    switch (dt) {
    case GDP_DTYPE_FP32: return ((const float *)p)[i];
    case GDP_DTYPE_BF16: return gdp_bf16_to_float(((const uint16_t *)p)[i]);
    case GDP_DTYPE_FP16: return gdp_fp16_to_float(((const uint16_t *)p)[i]);
    default: return ((const int32_t *)p)[i];
    }
}

typedef struct range_gen {
    double lo, hi;
} range_gen;
static double gen_uniform(void *c) {
    const range_gen *r = c;
    return r->lo + (r->hi - r->lo) * urand();
}
static double gen_normal(void *c) { return *(const double *)c * nrand(); }

/* A device tensor (contiguous) holding a copy of host data (or poisoned if host is NULL). */
static gdp_tensor dev_tensor(gdp_dtype_t dt, int32_t ndim, const int64_t *shape, const void *host) {
    gdp_tensor t;
    gdp_tensor_init(&t, NULL, dt, ndim, shape);
    const size_t bytes = (size_t)gdp_tensor_numel(&t) * gdp_dtype_size(dt);
    CUDA_TRY(cudaMalloc(&t.data, bytes ? bytes : 1));
    if (host != NULL)
        CUDA_TRY(cudaMemcpy(t.data, host, bytes, cudaMemcpyHostToDevice));
    else
        CUDA_TRY(cudaMemset(t.data, 0xFF, bytes)); /* NaN in every float dtype: unwritten shows */
    return t;
}

static size_t tensor_bytes(const gdp_tensor *t) { return (size_t)gdp_tensor_numel(t) * gdp_dtype_size(t->dtype); }

static void dev_free(gdp_tensor *t) {
    if (t->data != NULL)
        cudaFree(t->data);
    t->data = NULL;
}

static void *download(const gdp_tensor *t) {
    void *h = malloc(tensor_bytes(t) + 1);
    CUDA_TRY(cudaMemcpy(h, t->data, tensor_bytes(t), cudaMemcpyDeviceToHost));
    return h;
}

static long long count_nonfinite(const gdp_tensor *t) {
    void *h = download(t);
    long long bad = 0;
    for (int64_t i = 0; i < gdp_tensor_numel(t); i++)
        bad += !isfinite(elem(h, t->dtype, i));
    free(h);
    return bad;
}

typedef gdp_status_t (*op_fn)(void *args);

/* One timed call of time_calls: the op or its graph (bench_time_events' call), after an L2
 * flush when asked (its before); the i-th flush writes byte i & 0xff. */
typedef struct timed_call {
    bench_env *e;
    op_fn fn;
    void *args;
    cudaGraphExec_t exec;
    int flush, i;
    gdp_status_t st; /* the op's failure, when timed_launch returns 1 */
} timed_call;

static int flush_l2(void *p) {
    timed_call *c = p;
    if (c->flush)
        CUDA_TRY(cudaMemsetAsync(c->e->flush, c->i & 0xff, c->e->flush_bytes, c->e->stream));
    c->i++;
    return 0;
}

static int timed_launch(void *p) {
    timed_call *c = p;
    if (c->exec != NULL) {
        CUDA_TRY(cudaGraphLaunch(c->exec, c->e->stream));
        return 0;
    }
    c->st = c->fn(c->args);
    return c->st != GDP_STATUS_SUCCESS;
}

/* Times iters calls of fn(args) (or of its captured graph): L2 flushed before each call
 * when asked, events around the call only. */
static void time_calls(bench_env *e, op_fn fn, void *args, int use_graph, int flush, row_stats *rs) {
    const int errors_before = g_errors;
    cudaGraphExec_t exec = NULL;
    /* One eager call first: lazy set-up (module load, cached occupancy) stays out of the capture. */
    const gdp_status_t first = fn(args);
    CUDA_TRY(cudaStreamSynchronize(e->stream));
    if (first != GDP_STATUS_SUCCESS) {
        snprintf(rs->note, sizeof rs->note, "%s", gdp_status_string(first));
        fprintf(stderr, "gdp-bench: %s\n", gdp_last_error());
        return;
    }
    if (use_graph) {
        cudaGraph_t graph = NULL;
        CUDA_TRY(cudaStreamBeginCapture(e->stream, cudaStreamCaptureModeGlobal));
        const gdp_status_t st = fn(args);
        CUDA_TRY(cudaStreamEndCapture(e->stream, &graph));
        if (st != GDP_STATUS_SUCCESS || graph == NULL) {
            snprintf(rs->note, sizeof rs->note, "capture failed: %.70s", gdp_last_error());
            if (graph != NULL)
                cudaGraphDestroy(graph);
            return;
        }
        CUDA_TRY(cudaGraphInstantiate(&exec, graph, 0));
        cudaGraphDestroy(graph);
    }
    double *t = calloc((size_t)e->iters, sizeof(double)); /* zeros where a failed loop stopped */
    timed_call tc = {.e = e, .fn = fn, .args = args, .exec = exec, .flush = flush, .st = GDP_STATUS_SUCCESS};
    const int rc = bench_time_events("gdp-bench", e->stream, e->warmup, e->iters, timed_launch, flush_l2, &tc, t);
    if (rc == -1)
        g_errors++;
    if (rc == 1) {
        snprintf(rs->note, sizeof rs->note, "%s", gdp_status_string(tc.st));
        fprintf(stderr, "gdp-bench: %s\n", gdp_last_error());
        free(t);
        if (exec != NULL)
            cudaGraphExecDestroy(exec);
        return;
    }
    rs->med_us = bench_median(t, e->iters);
    rs->min_us = t[0];
    rs->max_us = t[e->iters - 1];
    rs->ran = g_errors == errors_before;
    if (!rs->ran)
        snprintf(rs->note, sizeof rs->note, "a CUDA call failed while timing (see stderr)");
    free(t);
    if (exec != NULL)
        cudaGraphExecDestroy(exec);
}

static long long g_total_wrong = 0;
static int g_rows_failed = 0;

/* One table row. bytes/flops are per call; bound_us the shape's floor; peer_us 0 = none. */
static void print_row(const char *op, const char *shape, double tokens, double bytes, double flops, double bound_us,
                      double peer_us, const row_stats *rs) {
    if (!rs->ran) {
        printf("%-8s %-44s %7.0f  %-38s %s\n", op, shape, tokens, "unsupported", rs->note);
        g_rows_failed++;
        return;
    }
    const double s = rs->med_us * 1e-6;
    char peer[16] = "       -", ratio[16] = "      -";
    if (peer_us > 0) {
        snprintf(peer, sizeof peer, "%8.1f", peer_us);
        snprintf(ratio, sizeof ratio, "%7.2f", peer_us / rs->med_us);
    }
    printf("%-8s %-44s %7.0f %9.1f %9.1f %9.1f %10.3e %8.1f %7.1f %9.1f %6.1f %s %s %7lld\n", op, shape, tokens,
           rs->med_us, rs->min_us, rs->max_us, tokens / s, bytes / s / 1e9, flops / s / 1e12, bound_us,
           100.0 * bound_us / rs->med_us, peer, ratio, rs->wrong);
    g_total_wrong += rs->wrong;
}

/* ---- decode ---------------------------------------------------------------------------- */

static gdp_status_t decode_fn(void *a) { return gdp_fused_recurrent_gated_delta_rule_update(g_env->gpu, a); }

/* Request 0 of the last call against the CPU backend from the same starting slot (o and the
 * slot's state after the call, atol = rtol = 1e-3, plus one ulp of a 16-bit o or state). */
static long long decode_check(const gdp_recurrent_args *d, const void *hq, const void *hk, const void *hv,
                              const void *hg, const void *hb, const void *slot0_before, int64_t slot0) {
    const int64_t T = d->q.shape[1], H = d->q.shape[2], K = d->q.shape[3], V = d->v.shape[3];
    const gdp_dtype_t sdt = d->state.dtype;
    const size_t slot_bytes = gdp_dtype_size(sdt) * (size_t)(H * K * V);
    gdp_recurrent_args c = *d;
    const int64_t qs[4] = {1, T, H, K}, vs[4] = {1, T, H, V}, gs[3] = {1, T, H}, ss[4] = {1, H, K, V};
    gdp_tensor_init(&c.q, (void *)hq, d->q.dtype, 4, qs);
    gdp_tensor_init(&c.k, (void *)hk, d->k.dtype, 4, qs);
    gdp_tensor_init(&c.v, (void *)hv, d->v.dtype, 4, vs);
    gdp_tensor_init(&c.g, (void *)hg, GDP_DTYPE_FP32, 3, gs);
    gdp_tensor_init(&c.beta, (void *)hb, d->beta.dtype, 3, gs);
    void *state = malloc(slot_bytes);
    memcpy(state, slot0_before, slot_bytes);
    gdp_tensor_init(&c.state, state, sdt, 4, ss);
    memset(&c.state_indices, 0, sizeof c.state_indices);
    memset(&c.intermediate_states, 0, sizeof c.intermediate_states);
    float *o = malloc(sizeof(float) * (size_t)(T * H * V));
    gdp_tensor_init(&c.o, o, GDP_DTYPE_FP32, 4, vs);
    long long wrong = 0;
    if (gdp_fused_recurrent_gated_delta_rule_update(g_env->cpu, &c) != GDP_STATUS_SUCCESS) {
        fprintf(stderr, "gdp-bench: CPU decode check failed: %s\n", gdp_last_error());
        wrong = 1;
    } else {
        void *go = download(&d->o);
        void *gs_dev = malloc(slot_bytes);
        CUDA_TRY(cudaMemcpy(gs_dev, (char *)d->state.data + slot0 * slot_bytes, slot_bytes, cudaMemcpyDeviceToHost));
        for (int64_t i = 0; i < T * H * V; i++) {
            const double a = elem(go, d->o.dtype, i), b = o[i];
            wrong += !(fabs(a - b) <= 1e-3 + 1e-3 * fabs(b) + (d->o.dtype == GDP_DTYPE_BF16 ? fabs(b) / 128 : 0));
        }
        for (int64_t i = 0; i < H * K * V; i++) {
            const double a = elem(gs_dev, sdt, i), b = elem(state, sdt, i);
            wrong += !(fabs(a - b) <= 1e-3 + 1e-3 * fabs(b) + (sdt == GDP_DTYPE_BF16 ? fabs(b) / 128 : 0));
        }
        free(go);
        free(gs_dev);
    }
    free(state);
    free(o);
    return wrong;
}

/* One decode row: B requests of S tokens (M steps each) on H heads, the state in sdt (fp32 or
 * bf16) on distinct slots; S > 1 also writes the S per-token snapshots (drafts). */
static void bench_decode(bench_env *e, int64_t B, int64_t H, int64_t K, int64_t V, int64_t M, int64_t S,
                         gdp_dtype_t sdt, double peer_us) {
    const int64_t T = S * M, slots = B + 8;
    row_stats rs = {0};
    char shape[64];
    if (S > 1)
        snprintf(shape, sizeof shape, "B=%lld H=%lld K=%lld V=%lld M=%lld S=%lld %s", (long long)B, (long long)H,
                 (long long)K, (long long)V, (long long)M, (long long)S,
                 sdt == GDP_DTYPE_FP32 ? "fp32 st" : "bf16 st");
    else
        snprintf(shape, sizeof shape, "B=%lld H=%lld K=%lld V=%lld M=%lld %s state", (long long)B, (long long)H,
                 (long long)K, (long long)V, (long long)M, gdp_dtype_name(sdt));
    const int64_t qs[4] = {B, T, H, K}, vs[4] = {B, T, H, V}, gsh[3] = {B, T, H}, ss[4] = {slots, H, K, V};
    const int64_t is[1] = {B}, inter_shape[5] = {slots, S, H, K, V};
    double one = 1.0;
    range_gen g_range = {-1.0, 0.0}, b_range = {0.0, 1.0}, s_range = {-1.0, 1.0};
    void *hq = host_fill(GDP_DTYPE_BF16, B * T * H * K, gen_normal, &one);
    void *hk = host_fill(GDP_DTYPE_BF16, B * T * H * K, gen_normal, &one);
    void *hv = host_fill(GDP_DTYPE_BF16, B * T * H * V, gen_normal, &one);
    float *hg = host_fill(GDP_DTYPE_FP32, B * T * H, gen_uniform, &g_range);
    void *hb = host_fill(GDP_DTYPE_BF16, B * T * H, gen_uniform, &b_range);
    /* The GDP interleave: per token, q on copy M-1, the decay on copy 0. */
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < T; t++)
            for (int64_t h = 0; h < H; h++) {
                if (t % M != M - 1)
                    memset((uint16_t *)hq + ((b * T + t) * H + h) * K, 0, sizeof(uint16_t) * (size_t)K);
                if (t % M != 0)
                    hg[(b * T + t) * H + h] = 0.0f;
            }
    void *hs = host_fill(sdt, slots * H * K * V, gen_uniform, &s_range);
    int32_t *hidx = malloc(sizeof(int32_t) * (size_t)B);
    for (int64_t b = 0; b < B; b++)
        hidx[b] = (int32_t)((b * 5 + 3) % slots); /* distinct when slots is not a multiple of 5 */
    if (slots % 5 == 0)
        for (int64_t b = 0; b < B; b++)
            hidx[b] = (int32_t)(slots - 1 - b);

    gdp_recurrent_args a = {.scale = 0, .use_qk_l2norm_in_kernel = 1, .steps_per_token = (int32_t)M};
    a.q = dev_tensor(GDP_DTYPE_BF16, 4, qs, hq);
    a.k = dev_tensor(GDP_DTYPE_BF16, 4, qs, hk);
    a.v = dev_tensor(GDP_DTYPE_BF16, 4, vs, hv);
    a.g = dev_tensor(GDP_DTYPE_FP32, 3, gsh, hg);
    a.beta = dev_tensor(GDP_DTYPE_BF16, 3, gsh, hb);
    a.state = dev_tensor(sdt, 4, ss, hs);
    a.state_indices = dev_tensor(GDP_DTYPE_INT32, 1, is, hidx);
    if (S > 1)
        a.intermediate_states = dev_tensor(sdt, 5, inter_shape, NULL);
    a.o = dev_tensor(GDP_DTYPE_BF16, 4, vs, NULL);
    /* Bytes the op must move: the state read and written once, plus S snapshots. */
    const double es = (double)gdp_dtype_size(sdt);
    const double state_bytes = (2.0 + (S > 1 ? (double)S : 0.0)) * es * (double)(K * V) * (double)(B * H);
    const int flush = state_bytes < 2.0 * (double)e->l2_bytes;
    time_calls(e, decode_fn, &a, 1, flush, &rs);
    if (rs.ran) {
        /* Checked call: slot of request 0 before and after, o of request 0. */
        const size_t slot_bytes = (size_t)es * (size_t)(H * K * V);
        void *before = malloc(slot_bytes);
        CUDA_TRY(cudaMemcpy(before, (char *)a.state.data + (size_t)hidx[0] * slot_bytes, slot_bytes,
                            cudaMemcpyDeviceToHost));
        CUDA_TRY(cudaMemset(a.o.data, 0xFF, tensor_bytes(&a.o)));
        if (decode_fn(&a) != GDP_STATUS_SUCCESS)
            rs.wrong++;
        CUDA_TRY(cudaStreamSynchronize(e->stream));
        rs.wrong += count_nonfinite(&a.o);
        rs.wrong += decode_check(&a, hq, hk, hv, hg, hb, before, hidx[0]);
        free(before);
    }
    const double flops = (double)(4 * M + 3) * (double)S * (double)(K * V) * (double)(B * H);
    print_row("decode", shape, (double)(B * S), state_bytes, flops, state_bytes / COPY_BW * 1e6, peer_us, &rs);
    dev_free(&a.q), dev_free(&a.k), dev_free(&a.v), dev_free(&a.g), dev_free(&a.beta), dev_free(&a.state);
    dev_free(&a.state_indices), dev_free(&a.o), dev_free(&a.intermediate_states);
    free(hq), free(hk), free(hv), free(hg), free(hb), free(hs), free(hidx);
}

/* ---- prepare --------------------------------------------------------------------------- */

typedef struct prepare_job {
    gdp_prepare_args a;
    int decode;
} prepare_job;

static gdp_status_t prepare_fn(void *p) {
    prepare_job *j = p;
    return j->decode ? gdp_decode_prepare(g_env->gpu, &j->a) : gdp_prefill_prepare(g_env->gpu, &j->a);
}

/* Largest ulp distance between two buffers of one dtype. */
static long long ulp_diff_count(const void *a, const void *b, gdp_dtype_t dt, int64_t n, int64_t max_ulp) {
    long long bad = 0;
    for (int64_t i = 0; i < n; i++) {
        int64_t x, y;
        if (dt == GDP_DTYPE_FP32) {
            uint32_t u, v;
            memcpy(&u, (const char *)a + 4 * i, 4);
            memcpy(&v, (const char *)b + 4 * i, 4);
            x = (u & 0x80000000u) ? -(int64_t)(u & 0x7fffffffu) : (int64_t)u;
            y = (v & 0x80000000u) ? -(int64_t)(v & 0x7fffffffu) : (int64_t)v;
        } else {
            uint16_t u, v;
            memcpy(&u, (const char *)a + 2 * i, 2);
            memcpy(&v, (const char *)b + 2 * i, 2);
            x = (u & 0x8000u) ? -(int64_t)(u & 0x7fffu) : (int64_t)u;
            y = (v & 0x8000u) ? -(int64_t)(v & 0x7fffu) : (int64_t)v;
        }
        bad += llabs(x - y) > max_ulp;
    }
    return bad;
}

static void bench_prepare(bench_env *e, int decode, int64_t n, int64_t T, int64_t M, int64_t H, int64_t G, int64_t P,
                          int64_t N) {
    row_stats rs = {0};
    char shape[64];
    snprintf(shape, sizeof shape, "%s n=%lld T=%lld M=%lld H=%lld G=%lld P=N=%lld", decode ? "dec" : "pre",
             (long long)n, (long long)T, (long long)M, (long long)H, (long long)G, (long long)P);
    const int64_t width = M * H * P + M * G * N + G * N, ba_width = M * H + H;
    const int64_t xs[3] = {n, T, width}, bs[3] = {n, T, ba_width}, hs[1] = {H};
    const int64_t rows_exp = T * M, rows_tok = decode ? T * M : T;
    const int64_t qsh[4] = {n, rows_tok, H, N}, ksh[4] = {n, rows_exp, H, N}, vsh[4] = {n, rows_exp, H, P};
    const int64_t betash[3] = {n, rows_exp, H}, gsh[3] = {n, rows_tok, H};
    double one = 1.0;
    range_gen ba_range = {-8.0, 8.0}, alog_range = {-4.0, 2.7}, dt_range = {-5.0, 2.0};
    void *hx = host_fill(GDP_DTYPE_BF16, n * T * width, gen_normal, &one);
    void *hba = host_fill(GDP_DTYPE_BF16, n * T * ba_width, gen_uniform, &ba_range);
    void *halog = host_fill(GDP_DTYPE_FP32, H, gen_uniform, &alog_range);
    void *hdt = host_fill(GDP_DTYPE_BF16, H, gen_uniform, &dt_range);
    prepare_job j = {.decode = decode};
    j.a = (gdp_prepare_args){.num_householder = (int32_t)M, .num_heads = (int32_t)H, .num_groups = (int32_t)G,
                             .head_dim = (int32_t)P, .state_dim = (int32_t)N};
    j.a.x = dev_tensor(GDP_DTYPE_BF16, 3, xs, hx);
    j.a.ba = dev_tensor(GDP_DTYPE_BF16, 3, bs, hba);
    j.a.A_log = dev_tensor(GDP_DTYPE_FP32, 1, hs, halog);
    j.a.dt_bias = dev_tensor(GDP_DTYPE_BF16, 1, hs, hdt);
    j.a.query = dev_tensor(GDP_DTYPE_BF16, 4, qsh, NULL);
    j.a.key = dev_tensor(GDP_DTYPE_BF16, 4, ksh, NULL);
    j.a.value = dev_tensor(GDP_DTYPE_BF16, 4, vsh, NULL);
    j.a.beta = dev_tensor(GDP_DTYPE_BF16, 3, betash, NULL);
    j.a.g = dev_tensor(GDP_DTYPE_FP32, 3, gsh, NULL);
    gdp_tensor *outs[5] = {&j.a.query, &j.a.key, &j.a.value, &j.a.beta, &j.a.g};
    double bytes = (double)(tensor_bytes(&j.a.x) + tensor_bytes(&j.a.ba));
    for (int i = 0; i < 5; i++)
        bytes += (double)tensor_bytes(outs[i]);
    time_calls(e, prepare_fn, &j, 1, bytes < 2.0 * (double)e->l2_bytes, &rs);
    if (rs.ran) {
        /* The last call's outputs against the CPU backend on the same inputs. */
        for (int i = 0; i < 5; i++)
            CUDA_TRY(cudaMemset(outs[i]->data, 0xFF, tensor_bytes(outs[i])));
        if (prepare_fn(&j) != GDP_STATUS_SUCCESS)
            rs.wrong++;
        CUDA_TRY(cudaStreamSynchronize(e->stream));
        gdp_prepare_args c = j.a;
        gdp_tensor_init(&c.x, hx, GDP_DTYPE_BF16, 3, xs);
        gdp_tensor_init(&c.ba, hba, GDP_DTYPE_BF16, 3, bs);
        gdp_tensor_init(&c.A_log, halog, GDP_DTYPE_FP32, 1, hs);
        gdp_tensor_init(&c.dt_bias, hdt, GDP_DTYPE_BF16, 1, hs);
        gdp_tensor *couts[5] = {&c.query, &c.key, &c.value, &c.beta, &c.g};
        for (int i = 0; i < 5; i++)
            couts[i]->data = malloc(tensor_bytes(outs[i]) + 1);
        const gdp_status_t st = decode ? gdp_decode_prepare(e->cpu, &c) : gdp_prefill_prepare(e->cpu, &c);
        if (st != GDP_STATUS_SUCCESS) {
            fprintf(stderr, "gdp-bench: CPU prepare check failed: %s\n", gdp_last_error());
            rs.wrong++;
        }
        for (int i = 0; i < 5 && st == GDP_STATUS_SUCCESS; i++) {
            void *got = download(outs[i]);
            rs.wrong += ulp_diff_count(got, couts[i]->data, outs[i]->dtype, gdp_tensor_numel(outs[i]), i < 3 ? 0 : 4);
            free(got);
        }
        for (int i = 0; i < 5; i++)
            free(couts[i]->data);
    }
    print_row("prepare", shape, (double)(n * T), bytes, 0.0, bytes / COPY_BW * 1e6, 0.0, &rs);
    dev_free(&j.a.x), dev_free(&j.a.ba), dev_free(&j.a.A_log), dev_free(&j.a.dt_bias);
    for (int i = 0; i < 5; i++)
        dev_free(outs[i]);
    free(hx), free(hba), free(halog), free(hdt);
}

/* setenv(name, value) for one measurement: the previous value to give env_restore. */
static char *env_swap(const char *name, const char *value) {
    const char *prev = getenv(name);
    char *saved = prev != NULL ? strdup(prev) : NULL;
    setenv(name, value, 1);
    return saved;
}

static void env_restore(const char *name, char *saved) {
    if (saved != NULL) {
        setenv(name, saved, 1);
        free(saved);
    } else {
        unsetenv(name);
    }
}

/* ---- the projection GEMM (src/backend.h; internal: gdp-bench links gdp_static) ------------- */

typedef struct gemm_job {
    int64_t rows, n, k;
    const void *a, *b;
    void *c;
    gdp_dtype_t c_dtype;
    float beta;
} gemm_job;

static gdp_status_t gemm_fn(void *p) {
    const gemm_job *j = p;
    return gdp_gemm_nt_ex(g_env->gpu, j->rows, j->n, j->k, j->a, j->k, j->b, GDP_DTYPE_BF16, j->beta, j->c, j->n,
                          j->c_dtype);
}

/* One GEMM shape of a decode step (bf16 A and weight, fp32 accumulation) on each path: "off"
 * cuBLASLt (GDP_GEMM_SKINNY=off GDP_GEMM_SPLITK=off), "on" the skinny kernel where it fits
 * (GDP_GEMM_SKINNY=on), "splitk" the cluster split-k kernel where it splits (GDP_GEMM_SPLITK=on),
 * graph-replayed, L2 flushed. Bound: the weight, A and C bytes once over the copy bandwidth.
 * #wrong: elements whose difference from cuBLASLt's result exceeds 1e-2 of the output's largest
 * value. */
static void bench_gemm(bench_env *e, const char *what, int64_t rows, int64_t n, int64_t k, gdp_dtype_t c_dtype,
                       float beta) {
    enum { MODES = 3 };
    static const char *const modes[MODES] = {"off", "on", "splitk"};
    static const char *const skinny_of[MODES] = {"off", "on", "off"}, *const splitk_of[MODES] = {"off", "off", "on"};
    const int64_t as[2] = {rows, k}, bs[2] = {n, k}, cs[2] = {rows, n};
    double one = 1.0, small = 1.0 / sqrt((double)k);
    void *ha = host_fill(GDP_DTYPE_BF16, rows * k, gen_normal, &one);
    void *hb = host_fill(GDP_DTYPE_BF16, n * k, gen_normal, &small);
    void *hc = host_fill(c_dtype, rows * n, gen_normal, &one);
    gdp_tensor da = dev_tensor(GDP_DTYPE_BF16, 2, as, ha), db = dev_tensor(GDP_DTYPE_BF16, 2, bs, hb);
    gdp_tensor dc = dev_tensor(c_dtype, 2, cs, hc);
    gemm_job j = {.rows = rows, .n = n, .k = k, .a = da.data, .b = db.data, .c = dc.data, .c_dtype = c_dtype,
                  .beta = beta};
    const double bytes = (double)(tensor_bytes(&da) + tensor_bytes(&db) + tensor_bytes(&dc) * (beta != 0.0f ? 2 : 1));
    void *result[MODES] = {NULL, NULL, NULL};
    for (int m = 0; m < MODES; m++) {
        row_stats rs = {0};
        char shape[64];
        snprintf(shape, sizeof shape, "%s rows=%lld n=%lld k=%lld %s", what, (long long)rows, (long long)n,
                 (long long)k, modes[m]);
        char *saved = env_swap("GDP_GEMM_SKINNY", skinny_of[m]), *saved_splitk = env_swap("GDP_GEMM_SPLITK", splitk_of[m]);
        time_calls(e, gemm_fn, &j, 1, bytes < 2.0 * (double)e->l2_bytes, &rs);
        if (rs.ran) { /* one call from the starting C (beta 1 accumulates across the timed calls) */
            CUDA_TRY(cudaMemcpy(dc.data, hc, tensor_bytes(&dc), cudaMemcpyHostToDevice));
            if (gemm_fn(&j) != GDP_STATUS_SUCCESS)
                rs.wrong++;
            CUDA_TRY(cudaStreamSynchronize(e->stream));
            result[m] = download(&dc);
        }
        env_restore("GDP_GEMM_SPLITK", saved_splitk);
        env_restore("GDP_GEMM_SKINNY", saved);
        if (m > 0 && result[0] != NULL && result[m] != NULL) {
            double peak = 0.0;
            for (int64_t i = 0; i < rows * n; i++)
                peak = fmax(peak, fabs(elem(result[0], c_dtype, i)));
            for (int64_t i = 0; i < rows * n; i++) {
                const double d = fabs(elem(result[m], c_dtype, i) - elem(result[0], c_dtype, i));
                rs.wrong += !(d <= 1e-2 * peak);
            }
        }
        print_row("gemm", shape, (double)rows, bytes, 2.0 * (double)(rows * n * k), bytes / COPY_BW * 1e6, 0.0, &rs);
    }
    for (int m = 0; m < MODES; m++)
        free(result[m]);
    dev_free(&da), dev_free(&db), dev_free(&dc);
    free(ha), free(hb), free(hc);
}

/* ---- the norm-GEMMs (src/decode_core.h; internal) ------------------------------------------ */

typedef struct norm_gemm_job {
    gdp_tensor x, z, w, out, b, c;
    gdp_norm_gemm_args a;
} norm_gemm_job;

static gdp_status_t norm_gemm_fn(void *p) { return gdp_norm_gemm(g_env->gpu, &((norm_gemm_job *)p)->a); }

/* A decode step's norm-GEMM at D 2048 (H 16, G 4, P 128, M 2): the pre-RMSNorm of the fp32
 * residual with in_proj (7728 wide, bf16 out), or the gated norm (groups of 512, y and z bf16)
 * with out_proj (fp32 C, beta 1), under GDP_NORM_GEMM = chain (the norm op and cuBLASLt), serial
 * and pdl (the norm-GEMV without and with programmatic dependent launch); graph-replayed, L2
 * flushed, so the weight comes from memory (a programmatic dependent's prefetch has nothing to
 * overlap here: the layer bench shows that). Bound: the weight, input and C bytes once. #wrong:
 * elements farther than 1e-2 of the largest from the chain's. */
static void bench_norm_gemm(bench_env *e, int gated, int64_t rows) {
    static const char *const modes[3] = {"chain", "serial", "pdl"};
    const int64_t k = 2048, n = gated ? 2048 : 7728;
    const gdp_dtype_t x_dt = gated ? GDP_DTYPE_BF16 : GDP_DTYPE_FP32, c_dt = gated ? GDP_DTYPE_FP32 : GDP_DTYPE_BF16;
    const int64_t xs[2] = {rows, k}, ws[1] = {k}, bs[2] = {n, k}, cs[2] = {rows, n};
    double one = 1.0, small = 1.0 / sqrt((double)k);
    void *hx = host_fill(x_dt, rows * k, gen_normal, &one), *hz = host_fill(GDP_DTYPE_BF16, rows * k, gen_normal, &one);
    void *hw = host_fill(GDP_DTYPE_BF16, k, gen_normal, &one), *hb = host_fill(GDP_DTYPE_BF16, n * k, gen_normal, &small);
    void *hc = host_fill(c_dt, rows * n, gen_normal, &one);
    norm_gemm_job j;
    j.x = dev_tensor(x_dt, 2, xs, hx), j.z = dev_tensor(GDP_DTYPE_BF16, 2, xs, hz), j.w = dev_tensor(GDP_DTYPE_BF16, 1, ws, hw);
    j.out = dev_tensor(GDP_DTYPE_BF16, 2, xs, NULL), j.b = dev_tensor(GDP_DTYPE_BF16, 2, bs, hb), j.c = dev_tensor(c_dt, 2, cs, hc);
    j.a = (gdp_norm_gemm_args){.out = &j.out, .x = &j.x, .z = gated ? &j.z : NULL, .weight = &j.w,
                               .group_size = 512, .eps = 1e-6, .n = n, .B = j.b.data, .beta = gated ? 1.0f : 0.0f,
                               .C = j.c.data, .ldc = n, .c_dtype = c_dt};
    const double bytes = (double)(tensor_bytes(&j.b) + tensor_bytes(&j.x) + (gated ? tensor_bytes(&j.z) : 0) +
                                  tensor_bytes(&j.c) * (gated ? 2 : 1));
    void *result[3] = {NULL, NULL, NULL};
    for (int m = 0; m < 3; m++) {
        row_stats rs = {0};
        char shape[64];
        snprintf(shape, sizeof shape, "%s rows=%lld %s", gated ? "gated+out_proj" : "rms+in_proj", (long long)rows,
                 modes[m]);
        char *saved = env_swap("GDP_NORM_GEMM", modes[m]);
        time_calls(e, norm_gemm_fn, &j, 1, bytes < 2.0 * (double)e->l2_bytes, &rs);
        if (rs.ran) { /* one call from the starting C (beta 1 accumulates across the timed calls) */
            CUDA_TRY(cudaMemcpy(j.c.data, hc, tensor_bytes(&j.c), cudaMemcpyHostToDevice));
            if (norm_gemm_fn(&j) != GDP_STATUS_SUCCESS)
                rs.wrong++;
            CUDA_TRY(cudaStreamSynchronize(e->stream));
            result[m] = download(&j.c);
        }
        env_restore("GDP_NORM_GEMM", saved);
        if (m > 0 && result[0] != NULL && result[m] != NULL) {
            double peak = 0.0;
            for (int64_t i = 0; i < rows * n; i++)
                peak = fmax(peak, fabs(elem(result[0], c_dt, i)));
            for (int64_t i = 0; i < rows * n; i++)
                rs.wrong += !(fabs(elem(result[m], c_dt, i) - elem(result[0], c_dt, i)) <= 1e-2 * peak);
        }
        print_row("normgemm", shape, (double)rows, bytes, 2.0 * (double)(rows * n * k), bytes / COPY_BW * 1e6, 0.0, &rs);
    }
    for (int m = 0; m < 3; m++)
        free(result[m]);
    dev_free(&j.x), dev_free(&j.z), dev_free(&j.w), dev_free(&j.out), dev_free(&j.b), dev_free(&j.c);
    free(hx), free(hz), free(hw), free(hb), free(hc);
}

/* ---- prefill (chunk op) ------------------------------------------------------------------- */

static gdp_status_t chunk_fn(void *a) { return gdp_chunk_gated_delta_product_varlen(g_env->gpu, a); }

/* The chunk op's time by stage (gdp/profile.h): into us[GDP_CHUNK_STAGE_NUM] the median over
 * e->iters eager calls of fn(args), each alone in a profile; 0 if the profile failed. */
static void chunk_stage_times(bench_env *e, op_fn fn, void *args, double *us) {
    const int n = e->iters;
    double *t = calloc((size_t)n * GDP_CHUNK_STAGE_NUM, sizeof(double));
    for (int i = 0; i < n; i++) {
        gdp_phase_times pt;
        if (gdp_profile_begin(e->gpu) != GDP_STATUS_SUCCESS || fn(args) != GDP_STATUS_SUCCESS ||
            gdp_profile_end(e->gpu, &pt) != GDP_STATUS_SUCCESS) {
            fprintf(stderr, "gdp-bench: stage profile: %s\n", gdp_last_error());
            g_errors++;
            free(t);
            return;
        }
        for (int s = 0; s < GDP_CHUNK_STAGE_NUM; s++)
            t[s * n + i] = pt.chunk_s[s] * 1e6;
    }
    for (int s = 0; s < GDP_CHUNK_STAGE_NUM; s++)
        us[s] = bench_median(t + s * n, n);
    free(t);
}

static void bench_prefill(bench_env *e, int64_t H, int64_t K, int64_t V, int64_t M, const int32_t *lens, int nseq,
                          const char *lens_desc, double peer_us) {
    row_stats rs = {0};
    double stage_us[GDP_CHUNK_STAGE_NUM] = {0};
    char shape[64], kernels[64] = "";
    snprintf(shape, sizeof shape, "H=%lld K=%lld V=%lld M=%lld %s", (long long)H, (long long)K, (long long)V,
             (long long)M, lens_desc);
    int32_t *cu = malloc(sizeof(int32_t) * (size_t)(nseq + 1));
    cu[0] = 0;
    int64_t longest = 0; /* max_seqlen: the op's auto choice of kernels reads it */
    for (int i = 0; i < nseq; i++) {
        cu[i + 1] = cu[i] + lens[i];
        longest = lens[i] > longest ? lens[i] : longest;
    }
    const int64_t T = cu[nseq];
    int64_t nc = 0, ncdp = 0;
    int32_t *ci = NULL, *cidp = NULL, *co = NULL;
    gdp_chunk_args a = {.num_householder = (int32_t)M, .scale = 0, .output_final_state = 1,
                        .use_qk_l2norm_in_kernel = 1, .max_seqlen = longest};
    size_t ws = 0;
    gdp_status_t st = gdp_max_chunk_counts(T, nseq, (int32_t)M, &nc, &ncdp);
    if (st == GDP_STATUS_SUCCESS) {
        ci = malloc(sizeof(int32_t) * (size_t)(2 * nc));
        cidp = malloc(sizeof(int32_t) * (size_t)(2 * ncdp));
        co = malloc(sizeof(int32_t) * (size_t)(nseq + 1));
        st = gdp_build_chunk_descriptors(cu, nseq, (int32_t)M, T, ci, cidp, co, &nc, &ncdp);
    }
    if (st == GDP_STATUS_SUCCESS)
        st = gdp_chunk_get_workspace_size(T, nseq, (int32_t)M, (int32_t)H, (int32_t)K, (int32_t)V, &ws);
    if (st == GDP_STATUS_SUCCESS)
        st = gdp_ctx_reserve_workspace(e->gpu, ws);
    if (st != GDP_STATUS_SUCCESS) {
        snprintf(rs.note, sizeof rs.note, "set-up failed: %.70s", gdp_last_error());
    } else {
        range_gen g_range = {-0.1, 0.0}, b_range = {0.0, 1.0};
        const int64_t qs[4] = {1, T, H, K}, ks[4] = {1, T * M, H, K}, vs[4] = {1, T * M, H, V};
        const int64_t os[4] = {1, T, H, V}, gs[3] = {1, T, H}, bs[3] = {1, T * M, H}, fs[4] = {nseq, H, K, V};
        const int64_t cus[1] = {nseq + 1}, cis[2] = {nc, 2}, cidps[2] = {ncdp, 2};
        const uint16_t *hq = normals_bf16(T * H * (K + M * K + M * V)), *hk = hq + T * H * K, *hv = hk + T * M * H * K;
        void *hg = host_fill(GDP_DTYPE_FP32, T * H, gen_uniform, &g_range);
        void *hb = host_fill(GDP_DTYPE_BF16, T * M * H, gen_uniform, &b_range);
        a.q = dev_tensor(GDP_DTYPE_BF16, 4, qs, hq);
        a.k = dev_tensor(GDP_DTYPE_BF16, 4, ks, hk);
        a.v = dev_tensor(GDP_DTYPE_BF16, 4, vs, hv);
        a.g = dev_tensor(GDP_DTYPE_FP32, 3, gs, hg);
        a.beta = dev_tensor(GDP_DTYPE_BF16, 3, bs, hb);
        a.cu_seqlens = dev_tensor(GDP_DTYPE_INT32, 1, cus, cu);
        a.chunk_indices = dev_tensor(GDP_DTYPE_INT32, 2, cis, ci);
        a.chunk_indices_dp = dev_tensor(GDP_DTYPE_INT32, 2, cidps, cidp);
        a.chunk_offsets = dev_tensor(GDP_DTYPE_INT32, 1, cus, co);
        a.o = dev_tensor(GDP_DTYPE_BF16, 4, os, NULL);
        a.final_state = dev_tensor(GDP_DTYPE_FP32, 4, fs, NULL);
        free(hg), free(hb);
        time_calls(e, chunk_fn, &a, 0, 0, &rs);
        if (rs.ran) {
            CUDA_TRY(cudaMemset(a.o.data, 0xFF, tensor_bytes(&a.o)));
            CUDA_TRY(cudaMemset(a.final_state.data, 0xFF, tensor_bytes(&a.final_state)));
            const long long hopper_before = gdp_cuda_chunk_hopper_calls();
            if (chunk_fn(&a) != GDP_STATUS_SUCCESS)
                rs.wrong++;
            if (gdp_cuda_chunk_hopper_calls() == hopper_before)
                snprintf(kernels, sizeof kernels, "the staged chain");
            else if (gdp_cuda_chunk_hopper_last_segment() > 0)
                snprintf(kernels, sizeof kernels, "the Hopper kernel, segments of %d expanded chunks",
                         gdp_cuda_chunk_hopper_last_segment());
            else
                snprintf(kernels, sizeof kernels, "the Hopper kernel, unsplit");
            CUDA_TRY(cudaStreamSynchronize(e->stream));
            rs.wrong += count_nonfinite(&a.o) + count_nonfinite(&a.final_state);
            chunk_stage_times(e, chunk_fn, &a, stage_us);
        }
        gdp_tensor *all[] = {&a.q, &a.k, &a.v, &a.g, &a.beta, &a.cu_seqlens, &a.chunk_indices, &a.chunk_indices_dp,
                             &a.chunk_offsets, &a.o, &a.final_state};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
            dev_free(all[i]);
    }
    const double C = CHUNK, Kd = (double)K, Vd = (double)V, Md = (double)M;
    const double F = Md * (6 * C * Kd + 4 * C * Vd + 2 * C * C / 3 + 4 * Kd * Vd) + 2 * Kd * Vd;
    const double flops = F * (double)T * (double)H;
    const double bytes = (2 * Kd + 2 * Md * Kd + 2 * Md * Vd + 2 * Vd + 4 * Md + 4) * (double)T * (double)H;
    print_row("prefill", shape, (double)T, bytes, flops, flops / BF16_FLOPS * 1e6, peer_us, &rs);
    if (rs.ran) {
        const char *path = getenv("GDP_CHUNK_PATH");
        printf("#   ran %s (GDP_CHUNK_PATH %s)\n", kernels, path != NULL && *path != '\0' ? path : "unset: auto");
        bench_print_chunk_stages("eager, median", stage_us, rs.med_us);
    }
    free(cu), free(ci), free(cidp), free(co);
}

/* ---- main ------------------------------------------------------------------------------------- */

static int run_ops(const char *which, int iters, int warmup) {
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess || count == 0) {
        printf("# gdp-bench ops: no CUDA device (%s); nothing to time\n",
               err != cudaSuccess ? cudaGetErrorString(err) : "0 devices");
        return 0;
    }
    bench_env e = {.iters = iters, .warmup = warmup};
    g_env = &e;
    if (gdp_ctx_init(&e.gpu, GDP_BACKEND_CUDA, 0) != GDP_STATUS_SUCCESS ||
        gdp_ctx_init(&e.cpu, GDP_BACKEND_CPU, 0) != GDP_STATUS_SUCCESS) {
        fprintf(stderr, "gdp-bench: %s\n", gdp_last_error());
        return 1;
    }
    struct cudaDeviceProp prop;
    CUDA_TRY(cudaGetDeviceProperties(&prop, 0));
    CUDA_TRY(cudaStreamCreate(&e.stream));
    gdp_ctx_set_stream(e.gpu, e.stream);
    e.l2_bytes = (size_t)prop.l2CacheSize;
    e.flush_bytes = (size_t)256 << 20;
    CUDA_TRY(cudaMalloc(&e.flush, e.flush_bytes));
    int driver = 0, runtime = 0;
    char version[32];
    bench_version(version, sizeof version);
    cudaDriverGetVersion(&driver);
    cudaRuntimeGetVersion(&runtime);
    printf("# gdp-bench ops: gdp %s, CUDA runtime %d, driver %d\n", version, runtime, driver);
    printf("# device 0: %s, sm_%d%d, %d SMs, L2 %.0f MB, %.1f GiB\n", prop.name, prop.major, prop.minor,
           prop.multiProcessorCount, prop.l2CacheSize / 1e6, prop.totalGlobalMem / 1073741824.0);
    printf("# rank 0 -> device 0 (one process)\n");
    printf("# method: median/min/max of %d calls after %d warm-up calls, CUDA events around each call; decode and\n"
           "#   prepare replay a captured CUDA graph; L2 flushed (256 MB write) before each call when the working\n"
           "#   set is under 2x L2; prefill uses gdp_build_chunk_descriptors and max_seqlen (which the op's auto\n"
           "#   choice of kernels reads), bf16 q/k/v, L2 norm in kernel\n",
           iters, warmup);
    printf("# bounds: decode (2 + S snapshots) KV state elements/(request, head) over %.3g B/s; prefill\n"
           "#   F = M(6CK + 4CV + 2C^2/3 + 4KV) + 2KV FLOP/(token, head) over %.3g FLOP/s; prepare bytes moved\n"
           "#   over %.3g B/s. GB/s and TFLOP/s use the same counts (prefill bytes: 2K + 2MK + 2MV + 2V + 4M + 4\n"
           "#   per token and head); peer = performance.md (decode: Megatron, graph replay; prefill: Megatron +\n"
           "#   descriptors); peer/ours > 1 is faster\n",
           COPY_BW, BF16_FLOPS, COPY_BW);
    printf("#\n");
    static const bench_col cols[] = {{"# op", -8},    {"shape", -44},    {"tokens", 7},    {"time(us)", 9},
                                     {"min(us)", 9},  {"max(us)", 9},    {"tok/s", 10},    {"GB/s", 8},
                                     {"TFLOP/s", 7},  {"bound(us)", 9},  {"%bound", 6},    {"peer(us)", 8},
                                     {"peer/us", 7},  {"#wrong", 7}};
    bench_print_columns("", cols, (int)(sizeof cols / sizeof cols[0]));
    const int all = strcmp(which, "all") == 0;
    if (all || strcmp(which, "prefill") == 0) {
        static const int32_t eight[8] = {2048, 2048, 2048, 2048, 2048, 2048, 2048, 2048};
        static const int32_t one[1] = {16384};
        static const int32_t mixed[8] = {1000, 37, 5000, 64, 2500, 7000, 400, 299};
        bench_prefill(&e, 16, 128, 128, 2, eight, 8, "8x2048", 1250.0);
        bench_prefill(&e, 16, 128, 128, 3, eight, 8, "8x2048", 1840.0);
        bench_prefill(&e, 16, 128, 128, 2, one, 1, "1x16384", 2130.0);
        bench_prefill(&e, 16, 128, 128, 2, mixed, 8, "mixed 16300", 1680.0);
        bench_prefill(&e, 32, 128, 64, 3, eight, 4, "4x2048", 1370.0);
        /* K = 64 (issue 13's other key width; no peer figure was measured): the Hopper kernel's other
         * state layout, and the row auto's K = 64 constants would come from */
        bench_prefill(&e, 16, 64, 128, 2, eight, 8, "8x2048", 0.0);
    }
    const gdp_dtype_t F32 = GDP_DTYPE_FP32, BF16 = GDP_DTYPE_BF16;
    if (all || strcmp(which, "decode") == 0) {
        bench_decode(&e, 1, 16, 128, 128, 2, 1, F32, 16.4);
        bench_decode(&e, 64, 16, 128, 128, 2, 1, F32, 71.6);
        bench_decode(&e, 256, 16, 128, 128, 2, 1, F32, 234.0);
        bench_decode(&e, 1024, 16, 128, 128, 2, 1, F32, 890.0);
        bench_decode(&e, 256, 32, 128, 64, 3, 1, F32, 273.0);
        bench_decode(&e, 1, 16, 128, 128, 2, 1, BF16, 0);
        bench_decode(&e, 64, 16, 128, 128, 2, 1, BF16, 0);
        bench_decode(&e, 256, 16, 128, 128, 2, 1, BF16, 0);
        bench_decode(&e, 1024, 16, 128, 128, 2, 1, BF16, 0);
        bench_decode(&e, 64, 16, 128, 128, 2, 4, F32, 0); /* 3 drafts: 4 tokens, 4 snapshots */
    }
    if (strcmp(which, "decode-key") == 0) { /* the target rows only (tile sweeps) */
        bench_decode(&e, 1, 16, 128, 128, 2, 1, F32, 16.4);
        bench_decode(&e, 256, 16, 128, 128, 2, 1, F32, 234.0);
        bench_decode(&e, 256, 32, 128, 64, 3, 1, F32, 273.0);
        bench_decode(&e, 256, 16, 128, 128, 2, 1, BF16, 0);
    }
    if (all || strcmp(which, "gemm") == 0) {
        /* a decode step's projections at D 2048, H 16, G 4, P = N 128, M 2 (in_proj 7728 wide) and
         * the LM head (vocab 32000, fp32 logits) */
        if (gdp_gemm_acquire(e.gpu) != GDP_STATUS_SUCCESS) {
            fprintf(stderr, "gdp-bench: %s\n", gdp_last_error());
            g_errors++;
        } else {
            static const int64_t batch[6] = {1, 4, 8, 64, 128, 256};
            for (int i = 0; i < 6; i++) {
                bench_gemm(&e, "in_proj", batch[i], 7728, 2048, BF16, 0.0f);
                bench_gemm(&e, "out_proj", batch[i], 2048, 2048, F32, 1.0f);
                bench_gemm(&e, "head", batch[i], 32000, 2048, F32, 0.0f);
            }
            static const int64_t few[4] = {1, 2, 4, 8};
            for (int i = 0; i < 4; i++) {
                bench_norm_gemm(&e, 0, few[i]);
                bench_norm_gemm(&e, 1, few[i]);
            }
            gdp_gemm_release(e.gpu);
        }
    }
    if (all || strcmp(which, "prepare") == 0) {
        bench_prepare(&e, 0, 1, 16384, 2, 16, 4, 128, 128);
        bench_prepare(&e, 1, 256, 1, 2, 16, 4, 128, 128);
    }
    bench_print_wrong_footer(g_total_wrong);
    printf("# Rows not run : %d\n", g_rows_failed);
    free(g_normals);
    cudaFree(e.flush);
    gdp_ctx_free(e.gpu);
    gdp_ctx_free(e.cpu);
    cudaStreamDestroy(e.stream);
    return g_total_wrong == 0 && g_errors == 0 ? 0 : 1;
}

#endif /* GDP_HAVE_CUDA */

int main(int argc, char **argv) {
    if (argc >= 2 && strcmp(argv[1], "layer") == 0)
        return gdp_bench_layer_main(argc - 1, argv + 1);
    if (argc >= 2 && strcmp(argv[1], "coll") == 0)
        return gdp_bench_coll_main(argc - 1, argv + 1);
    ops_opts o;
    bench_opt table[BENCH_MAX_OPTS];
    const int n_opts = ops_table(&o, table);
    if (argc < 2 || strcmp(argv[1], "ops") != 0) {
        bench_usage(argc < 2 ? stderr : stdout, "gdp-bench", OPS_SYNOPSIS, table, n_opts);
        if (argc >= 2 && (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0))
            return 0;
        fprintf(stderr, "gdp-bench: unknown benchmark '%s' (ops, layer or coll)\n", argc >= 2 ? argv[1] : "");
        return 2;
    }
    const int parsed = bench_parse("gdp-bench ops", OPS_SYNOPSIS, table, n_opts, argc, argv, 2, true);
    if (parsed != BENCH_PARSE_OK)
        return parsed == BENCH_PARSE_HELP ? 0 : 2;
#ifdef GDP_HAVE_CUDA
    return run_ops(o.op, o.iters, o.warmup);
#else
    printf("# gdp-bench ops: this libgdp was built without the CUDA backend; nothing to time\n");
    return 0;
#endif
}
