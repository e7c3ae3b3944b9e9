/*
 * bench_chunk.c: times the CUDA chunked prefill (gdp_chunk_gated_delta_product_varlen) on the
 * five prefill rows of docs/performance.md: bf16 q/k/v/beta, fp32 g and fp32 initial and final
 * states, in-kernel L2 norm, descriptors given (so a CUDA graph can replay the call). Prints, per
 * row, the median / min / max of eager calls and of graph replays (CUDA events, after warm-up),
 * tokens/s, the FLOP and byte floors of the shape and the fraction of the FLOP floor reached,
 * and Megatron's time with descriptors beside ours. "#wrong" counts non-finite outputs plus
 * elements that differ between the first and the last call (the op is deterministic).
 *   usage: bench_chunk [-n|--iters ITERS] [-r|--row ROW]   (ITERS: at least 10 are run, default 20;
 *                                                           ROW 1..5, 0 = all, the default)
 * Options, the event-timed loops and the column line: bench_common.h.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_common.h"
#include "gdp/gdp.h"

#ifdef GDP_HAVE_CUDA

#define CHUNK_C 64.0
#define PEAK_FLOPS 7.9e14 /* bf16 dense, measured 8192^3 GEMM on this H200 model (performance.md) */
#define PEAK_BYTES 4.17e12 /* device-to-device copy, read + write (performance.md) */

#define CUDA_RUN(call)                                                                               \
    do {                                                                                             \
        cudaError_t e_ = (call);                                                                     \
        if (e_ != cudaSuccess) {                                                                     \
            fprintf(stderr, "bench_chunk: %s failed: %s (%s:%d)\n", #call, cudaGetErrorString(e_),     \
                    __FILE__, __LINE__);                                                             \
            exit(1);                                                                                 \
        }                                                                                            \
    } while (0)
#define GDP_RUN(call)                                                                                \
    do {                                                                                             \
        gdp_status_t s_ = (call);                                                                    \
        if (s_ != GDP_STATUS_SUCCESS) {                                                              \
            fprintf(stderr, "bench_chunk: %s failed: %s\n", #call, gdp_last_error());                \
            exit(1);                                                                                 \
        }                                                                                            \
    } while (0)

typedef struct bench_row {
    const char *label;
    int H, K, V, M, n_seq;
    int lens[8];
    double megatron_ms; /* Megatron + descriptors, performance.md */
} bench_row;

static const bench_row ROWS[5] = {
    {"H16 K128 V128 M2 8x2048", 16, 128, 128, 2, 8, {2048, 2048, 2048, 2048, 2048, 2048, 2048, 2048}, 1.25},
    {"H16 K128 V128 M3 8x2048", 16, 128, 128, 3, 8, {2048, 2048, 2048, 2048, 2048, 2048, 2048, 2048}, 1.84},
    {"H16 K128 V128 M2 1x16384", 16, 128, 128, 2, 1, {16384}, 2.13},
    {"H16 K128 V128 M2 varlen(8)", 16, 128, 128, 2, 8, {1000, 37, 5000, 64, 2500, 7000, 400, 299}, 1.68},
    {"H32 K128 V64 M3 4x2048", 32, 128, 64, 3, 4, {2048, 2048, 2048, 2048}, 1.37},
};

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static float rng_uniform(float lo, float hi) {
    return lo + (hi - lo) * (float)((bench_xorshift64s(&rng_state) >> 40) * 0x1.0p-24);
}

static void *upload_bf16(int64_t n, float lo, float hi) {
    uint16_t *h = malloc((size_t)n * 2);
    for (int64_t i = 0; i < n; i++)
        h[i] = gdp_float_to_bf16(rng_uniform(lo, hi));
    void *d;
    CUDA_RUN(cudaMalloc(&d, (size_t)n * 2));
    CUDA_RUN(cudaMemcpy(d, h, (size_t)n * 2, cudaMemcpyHostToDevice));
    free(h);
    return d;
}

static void *upload_f32(int64_t n, float lo, float hi) {
    float *h = malloc((size_t)n * 4);
    for (int64_t i = 0; i < n; i++)
        h[i] = rng_uniform(lo, hi);
    void *d;
    CUDA_RUN(cudaMalloc(&d, (size_t)n * 4));
    CUDA_RUN(cudaMemcpy(d, h, (size_t)n * 4, cudaMemcpyHostToDevice));
    free(h);
    return d;
}

static void *upload_i32(const int32_t *h, int64_t n) {
    void *d;
    CUDA_RUN(cudaMalloc(&d, (size_t)(n ? n : 1) * 4));
    CUDA_RUN(cudaMemcpy(d, h, (size_t)n * 4, cudaMemcpyHostToDevice));
    return d;
}

static gdp_tensor view(void *data, gdp_dtype_t dt, int32_t ndim, int64_t a, int64_t b, int64_t c, int64_t d) {
    int64_t shape[4] = {a, b, c, d};
    gdp_tensor t;
    gdp_tensor_init(&t, data, dt, ndim, shape);
    return t;
}

/* One timed call (bench_time_events'): the op eagerly, or its graph replayed. */
typedef struct chunk_call {
    gdp_ctx_t ctx;
    gdp_chunk_args *a;
    cudaGraphExec_t exec;
    cudaStream_t stream;
} chunk_call;

static int eager_call(void *p) {
    const chunk_call *c = p;
    GDP_RUN(gdp_chunk_gated_delta_product_varlen(c->ctx, c->a));
    return 0;
}

static int graph_call(void *p) {
    const chunk_call *c = p;
    CUDA_RUN(cudaGraphLaunch(c->exec, c->stream));
    return 0;
}

/* Times `iters` eager calls and `iters` graph replays (us, sorted: the printed median is the
 * upper middle value). */
static void time_row(const bench_row *row, int iters) {
    const int64_t H = row->H, K = row->K, V = row->V, M = row->M, N = row->n_seq;
    int32_t cu[9] = {0};
    for (int i = 0; i < N; i++)
        cu[i + 1] = cu[i] + row->lens[i];
    const int64_t T = cu[N];
    int64_t nc, ncdp;
    GDP_RUN(gdp_max_chunk_counts(T, N, (int32_t)M, &nc, &ncdp));
    int32_t *ci = malloc((size_t)nc * 8), *cidp = malloc((size_t)ncdp * 8), co[9];
    GDP_RUN(gdp_build_chunk_descriptors(cu, (int32_t)N, (int32_t)M, T, ci, cidp, co, &nc, &ncdp));

    void *q = upload_bf16(T * H * K, -1, 1), *k = upload_bf16(T * M * H * K, -1, 1);
    void *v = upload_bf16(T * M * H * V, -1, 1), *beta = upload_bf16(T * M * H, 0, 1);
    void *g = upload_f32(T * H, -0.1f, 0.0f), *h0 = upload_f32(N * H * K * V, -0.5f, 0.5f);
    void *d_cu = upload_i32(cu, N + 1), *d_ci = upload_i32(ci, 2 * nc), *d_cidp = upload_i32(cidp, 2 * ncdp);
    void *d_co = upload_i32(co, N + 1);
    void *o, *fs;
    CUDA_RUN(cudaMalloc(&o, (size_t)(T * H * V) * 2));
    CUDA_RUN(cudaMalloc(&fs, (size_t)(N * H * K * V) * 4));

    /* the legacy-stream uploads above have landed before the non-blocking stream reads them */
    CUDA_RUN(cudaDeviceSynchronize());
    gdp_ctx_t ctx;
    GDP_RUN(gdp_ctx_init(&ctx, GDP_BACKEND_CUDA, 0));
    cudaStream_t stream;
    CUDA_RUN(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    GDP_RUN(gdp_ctx_set_stream(ctx, stream));
    size_t ws = 0;
    GDP_RUN(gdp_chunk_get_workspace_size(T, N, (int32_t)M, (int32_t)H, (int32_t)K, (int32_t)V, &ws));
    GDP_RUN(gdp_ctx_reserve_workspace(ctx, ws));

    gdp_chunk_args a;
    memset(&a, 0, sizeof a);
    a.q = view(q, GDP_DTYPE_BF16, 4, 1, T, H, K);
    a.k = view(k, GDP_DTYPE_BF16, 4, 1, T * M, H, K);
    a.v = view(v, GDP_DTYPE_BF16, 4, 1, T * M, H, V);
    a.g = view(g, GDP_DTYPE_FP32, 3, 1, T, H, 0);
    a.beta = view(beta, GDP_DTYPE_BF16, 3, 1, T * M, H, 0);
    a.num_householder = (int32_t)M;
    a.cu_seqlens = view(d_cu, GDP_DTYPE_INT32, 1, N + 1, 0, 0, 0);
    a.initial_state = view(h0, GDP_DTYPE_FP32, 4, N, H, K, V);
    a.output_final_state = 1;
    a.use_qk_l2norm_in_kernel = 1;
    a.chunk_indices = view(d_ci, GDP_DTYPE_INT32, 2, nc, 2, 0, 0);
    a.chunk_indices_dp = view(d_cidp, GDP_DTYPE_INT32, 2, ncdp, 2, 0, 0);
    a.chunk_offsets = view(d_co, GDP_DTYPE_INT32, 1, N + 1, 0, 0, 0);
    a.o = view(o, GDP_DTYPE_BF16, 4, 1, T, H, V);
    a.final_state = view(fs, GDP_DTYPE_FP32, 4, N, H, K, V);

    const size_t o_bytes = (size_t)(T * H * V) * 2;
    uint16_t *first = malloc(o_bytes), *last = malloc(o_bytes);
    for (int w = 0; w < 3; w++)
        GDP_RUN(gdp_chunk_gated_delta_product_varlen(ctx, &a));
    CUDA_RUN(cudaStreamSynchronize(stream));
    CUDA_RUN(cudaMemcpy(first, o, o_bytes, cudaMemcpyDeviceToHost));

    double *eager = malloc(sizeof(double) * (size_t)iters), *graph = malloc(sizeof(double) * (size_t)iters);
    chunk_call call = {.ctx = ctx, .a = &a, .exec = NULL, .stream = stream};
    if (bench_time_events("bench_chunk", stream, 0, iters, eager_call, NULL, &call, eager) != 0)
        exit(1);
    cudaGraph_t gr;
    cudaGraphExec_t ex;
    CUDA_RUN(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    GDP_RUN(gdp_chunk_gated_delta_product_varlen(ctx, &a));
    CUDA_RUN(cudaStreamEndCapture(stream, &gr));
    CUDA_RUN(cudaGraphInstantiate(&ex, gr, 0));
    CUDA_RUN(cudaGraphLaunch(ex, stream));
    call.exec = ex;
    if (bench_time_events("bench_chunk", stream, 0, iters, graph_call, NULL, &call, graph) != 0)
        exit(1);
    CUDA_RUN(cudaMemcpy(last, o, o_bytes, cudaMemcpyDeviceToHost));
    int64_t wrong = 0;
    for (int64_t i = 0; i < (int64_t)(o_bytes / 2); i++) {
        float x = gdp_bf16_to_float(last[i]);
        wrong += !isfinite(x) || first[i] != last[i];
    }
    bench_sort(eager, iters);
    bench_sort(graph, iters);

    const double C = CHUNK_C;
    const double flop_tok = M * (6 * C * K + 4 * C * V + 2 * C * C / 3 + 4.0 * K * V) + 2.0 * K * V;
    const double bytes_tok = 2.0 * K + 2.0 * M * K + 2.0 * M * V + 2.0 * V + 4.0 * M + 4;
    const double t_flop = (double)T * H * flop_tok / PEAK_FLOPS * 1e3, t_byte = (double)T * H * bytes_tok / PEAK_BYTES * 1e3;
    const double med = graph[iters / 2] * 1e-3; /* ms */
    printf("%-28s %6lld %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f %8.2f %8.1f %7.1f%% %8.1f %6.2fx %6lld\n", row->label,
           (long long)T, eager[iters / 2], eager[0], eager[iters - 1], med * 1e3, graph[0], graph[iters - 1],
           T / (med * 1e-3) / 1e6, t_flop * 1e3, 100.0 * t_flop / med, t_byte * 1e3, row->megatron_ms / med,
           (long long)wrong);
    fflush(stdout);

    cudaGraphExecDestroy(ex);
    cudaGraphDestroy(gr);
    gdp_ctx_free(ctx);
    cudaStreamDestroy(stream);
    void *bufs[] = {q, k, v, beta, g, h0, d_cu, d_ci, d_cidp, d_co, o, fs};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        cudaFree(bufs[i]);
    free(ci); free(cidp); free(first); free(last); free(eager); free(graph);
}

int main(int argc, char **argv) {
    int iters = 20, only = 0;
    const bench_opt opts[] = {
        {"iters", 'n', BENCH_OPT_INT, "20", "calls per row, eager and replayed (at least 10 are run)", &iters, 1,
         1000000, NULL},
        {"row", 'r', BENCH_OPT_INT, "0", "the one row to run, 1..5 (0: all)", &only, 0, 5, NULL},
    };
    const int parsed = bench_parse("bench_chunk", "[options]", opts, 2, argc, argv, 1, true);
    if (parsed != BENCH_PARSE_OK)
        return parsed == BENCH_PARSE_HELP ? 0 : 2;
    if (iters < 10)
        iters = 10;
    int dev = 0;
    struct cudaDeviceProp prop;
    CUDA_RUN(cudaGetDevice(&dev));
    CUDA_RUN(cudaGetDeviceProperties(&prop, dev));
    int version = 0;
    gdp_get_version(&version);
    printf("# bench_chunk: gdp %d, chunk_gated_delta_product_varlen on GPU %d (%s, %d SMs)\n", version, dev, prop.name,
           prop.multiProcessorCount);
    printf("# bf16 q/k/v/beta, fp32 g / initial / final state, L2 norm in kernel, descriptors given; %d calls each\n",
           iters);
    printf("# floors: FLOP = T H (M (6CK + 4CV + 2C^2/3 + 4KV) + 2KV) at 790 TFLOP/s; bytes = T H (2K + 2MK + 2MV + "
           "2V + 4M + 4) at 4.17 TB/s\n");
    static const bench_col cols[] = {{"# shape", -28}, {"tokens", 6},  {"eager_us", 9}, {"min", 9},     {"max", 9},
                                     {"graph_us", 9},  {"min", 9},     {"max", 9},      {"Mtok/s", 8},  {"flop_us", 8},
                                     {"%flop", 8},     {"byte_us", 8}, {"vsMeg", 7},    {"#wrong", 6}};
    bench_print_columns("", cols, (int)(sizeof cols / sizeof cols[0]));
    for (int r = 0; r < 5; r++)
        if (only == 0 || only == r + 1)
            time_row(&ROWS[r], iters);
    printf("# vsMeg: Megatron-with-descriptors time (performance.md) / our graph median\n");
    return 0;
}

#else

int main(void) {
    printf("bench_chunk: this libgdp was built without the CUDA backend\n");
    return 0;
}

#endif
