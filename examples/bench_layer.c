/*
 * bench_layer.c: layer and collective benchmarks across the ranks of one tensor-parallel
 * group, printed in the nccl-tests format (# header with the version, config and rank map;
 * fixed-width columns; "# Out of bounds values" and "# Avg bus bandwidth" footers).
 *
 *   gdp-bench layer [options]  decode and prefill steps of a GDP layer stack (the
 *       layers' forward pass: GEMMs, GDP ops, the all-reduce per layer), TP over the ranks
 *       (with --cp C: tp = ranks / C TP groups x C CP ranks, docs/cp.md);
 *       #wrong counts output elements off the TP = 1 stack's by more than the bar of
 *       gdp-math.md 8.1 (layer deltas: 1e-5 max|ref| on the CPU, 2e-2 on CUDA)
 *   gdp-bench coll [options]   the TP collectives at layer message sizes (tokens x D):
 *       all-reduce (after out_proj), reduce-scatter and all-gather (sequence parallel), on
 *       integer-valued data whose sums are exact, so #wrong must be 0
 *
 * Bandwidths follow nccl-tests: algbw = bytes / time; busbw = algbw * 2(n-1)/n for the
 * all-reduce, (n-1)/n for reduce-scatter and all-gather. A layer step's bytes are those of
 * its all-reduces: layers x padded tokens x D x 4 (with --cp C: a rank's, padded tokens / C;
 * busbw then uses the TP group's size). Times are medians over the iterations
 * (the host clock around a synchronized call), eager and, where the comm allows, with the
 * step captured as one CUDA graph and replayed (as gdp-run runs it); the phase columns split
 * one eager step by the library's marks (include/gdp/profile.h), and under a step that ran the
 * chunk op a '#' line splits its time by stage (the layers together). gdp-bench (gdp_bench.c) calls
 * the entry points gdp_bench_layer_main and gdp_bench_coll_main; options, timing loops and
 * footers are bench_common.h's.
 */
#include <math.h>
#include <mpi.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_common.h"
#include "gdp/cache.h"
#include "gdp/checkpoint.h"
#include "gdp/comm.h"
#include "gdp/layer.h"
#include "gdp/plan.h"
#include "gdp/profile.h"

#ifdef GDP_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

/* ---- shared ----------------------------------------------------------------------------- */

typedef struct bench_env {
    int           rank, size;
    bool          own_mpi;  /* this entry point initialized MPI */
    gdp_backend_t backend;
    gdp_comm_t    comm;     /* NULL with one rank */
    gdp_ctx_t     ctx;
    int32_t       device;
    void         *stream;   /* the ctx's own stream (CUDA): graphs cannot capture the legacy one */
} bench_env;

/* Buffers of the backend: host memory on the CPU, device memory on CUDA. */
static void *buf_alloc(const bench_env *e, size_t bytes) {
#ifdef GDP_HAVE_CUDA
    if (e->backend == GDP_BACKEND_CUDA) {
        void *p = NULL;
        if (cudaMalloc(&p, bytes ? bytes : 1) != cudaSuccess)
            GDP_FATAL(e->comm, "cudaMalloc of %zu bytes failed", bytes);
        return p;
    }
#endif
    void *p = calloc(bytes ? bytes : 1, 1);
    if (p == NULL)
        GDP_FATAL(e->comm, "out of memory (%zu bytes)", bytes);
    return p;
}

static void buf_free(const bench_env *e, void *p) {
#ifdef GDP_HAVE_CUDA
    if (e->backend == GDP_BACKEND_CUDA) {
        cudaFree(p);
        return;
    }
#endif
    (void)e;
    free(p);
}

/* Copies run on the ctx's stream and wait for it: the ctx's non-blocking stream is not
 * ordered with the legacy stream a plain cudaMemcpy uses. */
static void buf_put(const bench_env *e, void *dst, const void *src, size_t bytes) {
#ifdef GDP_HAVE_CUDA
    if (e->backend == GDP_BACKEND_CUDA) {
        cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, (cudaStream_t)e->stream);
        cudaStreamSynchronize((cudaStream_t)e->stream);
        return;
    }
#endif
    (void)e;
    memcpy(dst, src, bytes);
}

static void buf_get(const bench_env *e, void *dst, const void *src, size_t bytes) {
#ifdef GDP_HAVE_CUDA
    if (e->backend == GDP_BACKEND_CUDA) {
        cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, (cudaStream_t)e->stream);
        cudaStreamSynchronize((cudaStream_t)e->stream);
        return;
    }
#endif
    (void)e;
    memcpy(dst, src, bytes);
}

static void sync_backend(const bench_env *e) {
#ifdef GDP_HAVE_CUDA
    if (e->backend == GDP_BACKEND_CUDA)
        cudaStreamSynchronize((cudaStream_t)e->stream);
#else
    (void)e;
#endif
}

#ifdef GDP_HAVE_CUDA
/* A non-blocking stream of its own for a CUDA ctx (graphs cannot capture the legacy one). */
static void *ctx_own_stream(gdp_comm_t comm, gdp_ctx_t ctx) {
    cudaStream_t st = NULL;
    if (cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking) != cudaSuccess)
        GDP_FATAL(comm, "cudaStreamCreateWithFlags failed");
    GDP_FATAL_IF_ERROR(comm, gdp_ctx_set_stream(ctx, st));
    return st;
}
#endif

/* MPI (if nobody did), the comm and the ctx on the requested backend ("auto": CUDA when this
 * build has it and every rank can create a CUDA context). */
static int env_init(bench_env *e, int *argc, char ***argv, const char *backend) {
    memset(e, 0, sizeof *e);
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited) {
        MPI_Init(argc, argv);
        e->own_mpi = true;
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &e->rank);
    MPI_Comm_size(MPI_COMM_WORLD, &e->size);
    bool cuda = !strcmp(backend, "cuda");
    if (!strcmp(backend, "auto")) {
        int ok = gdp_backend_available(GDP_BACKEND_CUDA);
        gdp_ctx_t probe = NULL;
        if (ok && gdp_ctx_init(&probe, GDP_BACKEND_CUDA, 0) != GDP_STATUS_SUCCESS)
            ok = 0;
        gdp_ctx_free(probe);
        int all = 0;
        MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
        cuda = all != 0;
    } else if (!cuda && strcmp(backend, "cpu")) {
        if (e->rank == 0)
            fprintf(stderr, "gdp-bench: backend '%s': use auto, cpu or cuda\n", backend);
        return 2;
    }
    e->backend = cuda ? GDP_BACKEND_CUDA : GDP_BACKEND_CPU;
    if (e->size > 1) {
        const gdp_comm_buffers_t where = cuda ? GDP_COMM_DEVICE_BUFFERS : GDP_COMM_HOST_BUFFERS;
        gdp_status_t st = GDP_STATUS_UNSUPPORTED;
        if (cuda && gdp_comm_backend_available(GDP_COMM_NCCL))
            st = gdp_comm_init(&e->comm, GDP_COMM_NCCL, NULL, where);
        if (st != GDP_STATUS_SUCCESS) /* the CPU, or more ranks than GPUs: host-staged MPI */
            GDP_FATAL_IF_ERROR(NULL, gdp_comm_init(&e->comm, GDP_COMM_MPI, NULL, where));
        if (cuda)
            gdp_comm_device(e->comm, &e->device);
    }
    GDP_FATAL_IF_ERROR(e->comm, gdp_ctx_init(&e->ctx, e->backend, e->device));
#ifdef GDP_HAVE_CUDA
    if (cuda)
        e->stream = ctx_own_stream(e->comm, e->ctx);
#endif
    return 0;
}

static void env_free(bench_env *e) {
    gdp_ctx_free(e->ctx);
#ifdef GDP_HAVE_CUDA
    if (e->stream != NULL)
        cudaStreamDestroy((cudaStream_t)e->stream);
#endif
    gdp_comm_free(e->comm);
    if (e->own_mpi)
        MPI_Finalize();
}

/* "# rank host device" lines of every rank (nccl-tests' rank map). */
static void print_rank_map(const bench_env *e) {
    char me[96], host[64] = "";
    gethostname(host, sizeof host - 1);
    snprintf(me, sizeof me, "#  rank %3d  host %-20.20s  device %s", e->rank, host,
             e->backend == GDP_BACKEND_CUDA ? "" : "cpu");
    if (e->backend == GDP_BACKEND_CUDA)
        snprintf(me + strlen(me), sizeof me - strlen(me), "cuda:%d", e->device);
    char *all = e->rank == 0 ? calloc((size_t)e->size, sizeof me) : NULL;
    MPI_Gather(me, sizeof me, MPI_CHAR, all, sizeof me, MPI_CHAR, 0, MPI_COMM_WORLD);
    for (int r = 0; e->rank == 0 && r < e->size; r++)
        printf("%s\n", all + (size_t)r * sizeof me);
    free(all);
}

static const char *comm_name(const bench_env *e) {
    const char *name = "none (1 rank)";
    if (e->comm != NULL)
        gdp_comm_name(e->comm, &name);
    return name;
}

/* ---- the layer benchmark ------------------------------------------------------------------ */

#define MAX_CASES 32

_Static_assert(MAX_CASES <= BENCH_MAX_LIST, "a case list holds MAX_CASES entries");

typedef struct layer_opts {
    const char      *backend;
    const char      *conv_state; /* act | fp32: the cache's conv state dtype */
    const char      *ssm_state;  /* fp32 | bf16: the cache's recurrent state dtype */
    gdp_layer_config cfg;
    bench_list       decode, prefill;
    int              warmup, iters, check;
    int              cp;    /* context-parallel size; tp = ranks / cp */
    int              split; /* decode micro-batches on their own streams in one graph (CUDA, one rank) */
    int              hidden, layers, heads, groups, head_dim, state_dim, householder; /* into cfg */
} layer_opts;

/* A layer stack on this rank with its cache and plan (tp = size of comm, or 1; with cp_comm a
 * CP stack: x holds every row, the layers run on this CP rank's block of them). */
typedef struct stack {
    gdp_comm_t    comm;      /* the plan's: every rank of the stack (the job), NULL for one rank */
    gdp_comm_t    cp_comm;   /* NULL: cp = 1                                                     */
    int32_t       cp_rank, cp_size;
    gdp_layer_t  *layers;
    int32_t       n_layers;
    gdp_cache_t   cache;
    gdp_plan_t    plan;
    gdp_tp_shard  shard;
} stack;

/* A stack's cache (sized for its layers' core, conv windows in the act dtype unless conv_fp32) and plan. */
static void stack_finish(stack *s, const bench_env *e, gdp_ctx_t ctx, const gdp_step_bucket *buckets, int n_buckets,
                         int32_t n_slots, bool conv_fp32, gdp_dtype_t ssm_dtype) {
    gdp_cp_shard cs;
    GDP_FATAL_IF_ERROR(e->comm, gdp_layer_get_cp_shard(s->layers[0], &cs));
    gdp_cache_config cc;
    GDP_FATAL_IF_ERROR(e->comm, gdp_cache_config_init_cp(&cc, &cs, n_slots));
    /* conv windows in the act dtype: the same values as fp32 ones, half the bytes (as gdp-run) */
    if (!conv_fp32)
        GDP_FATAL_IF_ERROR(e->comm, gdp_layer_get_act_dtype(s->layers[0], &cc.conv_dtype));
    cc.ssm_dtype = ssm_dtype;
    GDP_FATAL_IF_ERROR(e->comm, gdp_cache_init(&s->cache, ctx, &cc));
    gdp_plan_config pc = {.num_householder = s->shard.config.num_householder, .n_slots = n_slots,
                          .max_decode_tokens = 1, .n_buckets = n_buckets, .buckets = buckets};
    GDP_FATAL_IF_ERROR(e->comm, gdp_plan_init(&s->plan, ctx, &pc));
}

static void stack_init(stack *s, const bench_env *e, gdp_comm_t comm, gdp_comm_t tp_comm, gdp_comm_t cp_comm,
                       gdp_ctx_t ctx, const char *path, const gdp_step_bucket *buckets, int n_buckets,
                       int32_t n_slots, bool conv_fp32, gdp_dtype_t ssm_dtype) {
    memset(s, 0, sizeof *s);
    s->comm = comm;
    s->cp_comm = cp_comm;
    s->cp_size = 1;
    int32_t rank = 0, size = 1;
    if (tp_comm != NULL) {
        gdp_comm_rank(tp_comm, &rank);
        gdp_comm_size(tp_comm, &size);
    }
    if (cp_comm != NULL) {
        gdp_comm_rank(cp_comm, &s->cp_rank);
        gdp_comm_size(cp_comm, &s->cp_size);
    }
    gdp_checkpoint_t ck;
    GDP_FATAL_IF_ERROR(e->comm, gdp_checkpoint_open(&ck, path));
    gdp_layer_config cfg;
    gdp_checkpoint_get_config(ck, &cfg);
    s->n_layers = cfg.num_layers;
    s->layers = calloc((size_t)cfg.num_layers, sizeof *s->layers);
    for (int32_t l = 0; l < cfg.num_layers; l++) {
        gdp_layer_weights w;
        memset(&w, 0, sizeof w);
        GDP_FATAL_IF_ERROR(e->comm, gdp_checkpoint_load_layer_shard(ck, &w, l, rank, size));
        GDP_FATAL_IF_ERROR(e->comm,
                           gdp_layer_init_cp(&s->layers[l], ctx, tp_comm, cp_comm, &w, GDP_TP_MODE_ALLREDUCE));
        s->shard = w.shard;
        gdp_layer_weights_free(&w);
    }
    gdp_checkpoint_free(ck);
    stack_finish(s, e, ctx, buckets, n_buckets, n_slots, conv_fp32, ssm_dtype);
}

/* A stack over src's weights (gdp_layer_init_shared: tp = cp = 1) on ctx, with its own cache and plan. */
static void stack_init_shared(stack *s, const bench_env *e, const stack *src, gdp_ctx_t ctx,
                              const gdp_step_bucket *buckets, int n_buckets, int32_t n_slots, bool conv_fp32,
                              gdp_dtype_t ssm_dtype) {
    memset(s, 0, sizeof *s);
    s->cp_size = 1;
    s->n_layers = src->n_layers;
    s->layers = calloc((size_t)s->n_layers, sizeof *s->layers);
    for (int32_t l = 0; l < s->n_layers; l++)
        GDP_FATAL_IF_ERROR(e->comm, gdp_layer_init_shared(&s->layers[l], ctx, src->layers[l]));
    s->shard = src->shard;
    stack_finish(s, e, ctx, buckets, n_buckets, n_slots, conv_fp32, ssm_dtype);
}

static void stack_free(stack *s) {
    for (int32_t l = 0; l < s->n_layers; l++)
        gdp_layer_free(s->layers[l]);
    free(s->layers);
    gdp_cache_free(s->cache);
    gdp_plan_free(s->plan);
}

/* Broadcast (every rank built the same desc), build, apply. */
static const gdp_step_metadata *stack_step(stack *s, const bench_env *e, const gdp_step_desc *d) {
    const gdp_step_metadata *m = NULL;
    GDP_FATAL_IF_ERROR(e->comm, gdp_plan_bcast(s->plan, s->comm, 0, d));
    GDP_FATAL_IF_ERROR(e->comm, gdp_plan_build(s->plan, s->cache, s->comm, &m));
    GDP_FATAL_IF_ERROR(e->comm, gdp_cache_apply_step(s->cache, m));
    return m;
}

/* This rank's rows of x [T, D] in the stack: all of them, or the CP rank's block. */
static void stack_rows(const stack *s, int64_t T, int64_t *first, int64_t *count) {
    *count = T / s->cp_size;
    *first = s->cp_rank * *count;
}

static void stack_forward(stack *s, const bench_env *e, const gdp_step_metadata *m, void *x, int64_t D) {
    int64_t first, count;
    stack_rows(s, m->padded_token_count, &first, &count);
    gdp_tensor xt;
    gdp_tensor_init(&xt, (float *)x + first * D, GDP_DTYPE_FP32, 2, (const int64_t[]){count, D});
    for (int32_t l = 0; l < s->n_layers; l++)
        GDP_FATAL_IF_ERROR(e->comm, gdp_layer_forward(s->layers[l], s->cache, m, &xt));
}

/* Every rank at the same point before a timed call (bench_time_host's before). */
static int barrier(void *p) {
    const bench_env *e = *(const bench_env *const *)p;
    if (e->comm)
        gdp_comm_barrier(e->comm, NULL);
    return 0;
}

#ifdef GDP_HAVE_CUDA
typedef struct graph_replay {
    const bench_env *e; /* first: barrier() reads it */
    cudaGraphExec_t exec;
} graph_replay;

static int replay_graph(void *p) {
    const graph_replay *r = p;
    cudaGraphLaunch(r->exec, (cudaStream_t)r->e->stream);
    cudaStreamSynchronize((cudaStream_t)r->e->stream);
    return 0;
}
#endif

/* The step's forward captured as one CUDA graph and replayed: the median seconds of iters
 * replays, or -1 where a graph cannot hold the step (CPU, host-staged MPI collectives, CP). */
static double graph_time(stack *s, const bench_env *e, const gdp_step_metadata *m, void *x, int64_t D, int iters,
                         double *times) {
#ifdef GDP_HAVE_CUDA
    gdp_comm_backend_t cb = GDP_COMM_NCCL;
    if (e->comm != NULL)
        gdp_comm_get_backend(e->comm, &cb);
    if (e->backend != GDP_BACKEND_CUDA || cb != GDP_COMM_NCCL || s->cp_size > 1)
        return -1;
    cudaStream_t st = (cudaStream_t)e->stream;
    cudaGraph_t g = NULL;
    cudaGraphExec_t ge = NULL;
    if (cudaStreamBeginCapture(st, cudaStreamCaptureModeRelaxed) != cudaSuccess)
        GDP_FATAL(e->comm, "cudaStreamBeginCapture failed");
    stack_forward(s, e, m, x, D);
    if (cudaStreamEndCapture(st, &g) != cudaSuccess || cudaGraphInstantiate(&ge, g, 0) != cudaSuccess)
        GDP_FATAL(e->comm, "capturing the layer step as a CUDA graph failed: %s", cudaGetErrorString(cudaGetLastError()));
    graph_replay r = {.e = e, .exec = ge};
    bench_time_host(3, iters, replay_graph, barrier, &r, times);
    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(g);
    if (cudaGetLastError() != cudaSuccess)
        GDP_FATAL(e->comm, "replaying the layer step's graph failed");
    return bench_median(times, iters);
#else
    (void)s, (void)e, (void)m, (void)x, (void)D, (void)iters, (void)times;
    return -1;
#endif
}

/* One eager forward of the step with the phase marks on (profile.h). */
static gdp_phase_times step_phases(stack *s, const bench_env *e, const gdp_step_metadata *m, void *x, int64_t D) {
    gdp_phase_times pt;
    sync_backend(e);
    GDP_FATAL_IF_ERROR(e->comm, gdp_profile_begin(e->ctx));
    stack_forward(s, e, m, x, D);
    GDP_FATAL_IF_ERROR(e->comm, gdp_profile_end(e->ctx, &pt));
    return pt;
}

/* Seeded token rows ~ N(0, 0.05^2) (test_layer_tp's scale: the residual is then of the order
 * of a layer's output, so comparing deltas measures the layers). */
static void fill_rows(float *x, int64_t rows, int64_t D, uint64_t seed) {
    uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
    for (int64_t i = 0; i < rows * D; i += 2) {
        const double u1 = ((double)(bench_xorshift64s(&s) >> 11) + 0.5) * 0x1.0p-53;
        const double u2 = ((double)(bench_xorshift64s(&s) >> 11) + 0.5) * 0x1.0p-53;
        const double r = 0.05 * sqrt(-2 * log(u1));
        x[i] = (float)(r * cos(6.283185307179586 * u2));
        if (i + 1 < rows * D)
            x[i + 1] = (float)(r * sin(6.283185307179586 * u2));
    }
}

/* Elements of the TP stack's layer delta off the reference's by more than bar * max|ref|. */
static int64_t count_wrong(const float *in, const float *a, const float *b, int64_t n, double bar) {
    double mb = 0;
    for (int64_t i = 0; i < n; i++)
        mb = fmax(mb, fabs((double)b[i] - in[i]));
    int64_t wrong = 0;
    for (int64_t i = 0; i < n; i++) {
        const double d = fabs(((double)a[i] - in[i]) - ((double)b[i] - in[i]));
        wrong += !(d <= bar * mb);
    }
    return wrong;
}

/* The --split experiment: a decode batch as micro-batches, each on its own stack (the main
 * stack's weights, shared: gdp_layer_init_shared; its own cache, plan and workspaces), ctx and
 * stream, captured as the parallel branches of one graph. Rows never meet inside a layer at one
 * rank, so the branches are independent; the question is how much of one micro-batch's launch-
 * and latency-bound kernels the GPU hides behind another's. */
#define MAX_SPLIT 8

typedef struct micro_batches {
    int       n;                 /* 0: off */
    gdp_ctx_t ctx[MAX_SPLIT];    /* [0] is the bench's own ctx */
    void     *stream[MAX_SPLIT]; /* [0] is the bench's own stream */
    stack     st[MAX_SPLIT];
    void     *x[MAX_SPLIT];
} micro_batches;

#ifdef GDP_HAVE_CUDA
static void split_init(micro_batches *mb, const bench_env *e, int n, const stack *src, const gdp_step_bucket *buckets,
                       int n_buckets, int32_t n_slots, int64_t rows, int64_t D, bool conv_fp32, gdp_dtype_t ssm_dtype) {
    memset(mb, 0, sizeof *mb);
    mb->n = n;
    for (int s = 0; s < n; s++) {
        if (s == 0) {
            mb->ctx[0] = e->ctx, mb->stream[0] = e->stream;
        } else {
            GDP_FATAL_IF_ERROR(e->comm, gdp_ctx_init(&mb->ctx[s], GDP_BACKEND_CUDA, e->device));
            mb->stream[s] = ctx_own_stream(e->comm, mb->ctx[s]);
        }
        stack_init_shared(&mb->st[s], e, src, mb->ctx[s], buckets, n_buckets, n_slots, conv_fp32, ssm_dtype);
        mb->x[s] = buf_alloc(e, sizeof(float) * (size_t)(rows * D));
    }
}

static void split_free(micro_batches *mb, const bench_env *e) {
    for (int s = 0; s < mb->n; s++) {
        stack_free(&mb->st[s]);
        buf_free(e, mb->x[s]);
        if (s > 0) {
            gdp_ctx_free(mb->ctx[s]);
            cudaStreamDestroy((cudaStream_t)mb->stream[s]);
        }
    }
}

/* Median seconds of iters replays of one graph whose branches decode v / n requests each
 * (claimed here with one token, released at the end); *bad counts non-finite outputs. */
static double split_graph_time(micro_batches *mb, const bench_env *e, int32_t v, int64_t D, int iters, double *times,
                               float *host, int64_t *bad) {
    const int32_t vb = v / mb->n;
    int32_t *slots = calloc((size_t)mb->n * (size_t)vb, sizeof *slots);
    gdp_prefill_request *pre = calloc((size_t)vb, sizeof *pre);
    const gdp_step_metadata *m[MAX_SPLIT];
    for (int s = 0; s < mb->n; s++) {
        for (int32_t i = 0; i < vb; i++)
            pre[i] = (gdp_prefill_request){.slot = GDP_SLOT_AUTO, .n_tokens = 1, .flags = GDP_PREFILL_NEW};
        gdp_step_desc claim = {.prefill_count = vb, .prefill = pre, .decode_tokens = 1, .bucket = GDP_BUCKET_AUTO};
        const gdp_step_metadata *mc = stack_step(&mb->st[s], e, &claim);
        for (int32_t i = 0; i < vb; i++)
            slots[s * vb + i] = mc->step->prefill[i].slot;
        fill_rows(host, mc->padded_token_count, D, 77 + (uint64_t)s);
        cudaMemcpy(mb->x[s], host, sizeof(float) * (size_t)(mc->padded_token_count * D), cudaMemcpyHostToDevice);
        stack_forward(&mb->st[s], e, mc, mb->x[s], D);
        gdp_step_desc dec = {.decode_count = vb, .decode_tokens = 1, .decode_slots = slots + s * vb,
                             .bucket = GDP_BUCKET_AUTO};
        m[s] = stack_step(&mb->st[s], e, &dec);
        fill_rows(host, m[s]->padded_token_count, D, 1000 + (uint64_t)s);
        cudaMemcpy(mb->x[s], host, sizeof(float) * (size_t)(m[s]->padded_token_count * D), cudaMemcpyHostToDevice);
        stack_forward(&mb->st[s], e, m[s], mb->x[s], D); /* eager first: the layers size their workspaces */
    }
    if (cudaDeviceSynchronize() != cudaSuccess)
        GDP_FATAL(e->comm, "the micro-batches' claim steps failed");
    cudaStream_t s0 = (cudaStream_t)mb->stream[0];
    cudaEvent_t fork = NULL, join[MAX_SPLIT] = {NULL};
    cudaEventCreateWithFlags(&fork, cudaEventDisableTiming);
    for (int s = 1; s < mb->n; s++)
        cudaEventCreateWithFlags(&join[s], cudaEventDisableTiming);
    cudaGraph_t g = NULL;
    cudaGraphExec_t ge = NULL;
    if (cudaStreamBeginCapture(s0, cudaStreamCaptureModeRelaxed) != cudaSuccess)
        GDP_FATAL(e->comm, "cudaStreamBeginCapture failed");
    cudaEventRecord(fork, s0);
    for (int s = 1; s < mb->n; s++)
        cudaStreamWaitEvent((cudaStream_t)mb->stream[s], fork, 0);
    for (int s = 0; s < mb->n; s++)
        stack_forward(&mb->st[s], e, m[s], mb->x[s], D);
    for (int s = 1; s < mb->n; s++) {
        cudaEventRecord(join[s], (cudaStream_t)mb->stream[s]);
        cudaStreamWaitEvent(s0, join[s], 0);
    }
    if (cudaStreamEndCapture(s0, &g) != cudaSuccess || cudaGraphInstantiate(&ge, g, 0) != cudaSuccess)
        GDP_FATAL(e->comm, "capturing the micro-batches as one CUDA graph failed: %s",
                  cudaGetErrorString(cudaGetLastError()));
    graph_replay r = {.e = e, .exec = ge};
    bench_time_host(3, iters, replay_graph, barrier, &r, times);
    *bad = 0;
    for (int s = 0; s < mb->n; s++) {
        cudaMemcpy(host, mb->x[s], sizeof(float) * (size_t)(vb * D), cudaMemcpyDeviceToHost);
        for (int64_t i = 0; i < vb * D; i++)
            *bad += !isfinite(host[i]);
        gdp_step_desc rel = {.release_count = vb, .release_slots = slots + s * vb, .decode_tokens = 1,
                             .bucket = GDP_BUCKET_AUTO};
        stack_step(&mb->st[s], e, &rel);
    }
    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(g);
    cudaEventDestroy(fork);
    for (int s = 1; s < mb->n; s++)
        cudaEventDestroy(join[s]);
    if (cudaGetLastError() != cudaSuccess)
        GDP_FATAL(e->comm, "replaying the micro-batches' graph failed");
    free(slots), free(pre);
    return bench_median(times, iters);
}
#endif

static const char *const LAYER_SYNOPSIS = "[options]   (under mpirun)";

/* The layer benchmark's options (defaults: a small stack that runs anywhere). */
static int layer_table(layer_opts *o, bench_opt *t) {
    const long big = 1 << 24;
    const bench_opt opts[] = {
        {"backend", 'b', BENCH_OPT_CHOICE, "auto", "the backend (auto: CUDA when every rank has a GPU)", &o->backend,
         0, 0, "auto|cpu|cuda"},
        {"hidden", 'd', BENCH_OPT_INT, "256", "hidden size D", &o->hidden, 1, big, NULL},
        {"layers", 'l', BENCH_OPT_INT, "2", "layers L", &o->layers, 1, 1024, NULL},
        {"heads", 'H', BENCH_OPT_INT, "16", "heads H", &o->heads, 1, big, NULL},
        {"groups", 'g', BENCH_OPT_INT, "4", "key groups G", &o->groups, 1, big, NULL},
        {"head-dim", 'p', BENCH_OPT_INT, "64", "head dimension P", &o->head_dim, 1, big, NULL},
        {"state-dim", 'n', BENCH_OPT_INT, "64", "state dimension N", &o->state_dim, 1, big, NULL},
        {"householder", 'm', BENCH_OPT_INT, "2", "Householder steps M", &o->householder, 1, 64, NULL},
        {"decode", 'D', BENCH_OPT_LIST, "1,4,16,64", "decode batches, e.g. 1,8,64", &o->decode, 1, MAX_CASES * 64,
         NULL},
        {"prefill", 'P', BENCH_OPT_LIST, "64,256,1024", "prefill tokens, e.g. 64,1024", &o->prefill, 1, big, NULL},
        {"warmup", 'w', BENCH_OPT_INT, "2", "untimed steps before timing", &o->warmup, 0, 1000000, NULL},
        {"iters", 'i', BENCH_OPT_INT, "10", "timed steps (median)", &o->iters, 1, 1000000, NULL},
        {"conv-state", 's', BENCH_OPT_CHOICE, "act",
         "the cache's conv state dtype (act: the layers' activation dtype, bf16 on CUDA; the same bits as fp32)",
         &o->conv_state, 0, 0, "act|fp32"},
        {"ssm-state", 'S', BENCH_OPT_CHOICE, "fp32", "the cache's recurrent state dtype (as gdp-run --ssm-state)",
         &o->ssm_state, 0, 0, "fp32|bf16"},
        {"check", 'c', BENCH_OPT_INT, "1", "compare with a TP = 1 stack (#wrong)", &o->check, 0, 1, NULL},
        {"cp", 'C', BENCH_OPT_INT, "1",
         "context parallelism: tp = ranks / C, each rank's layer core on H/(tp*C) heads of every row, its block of "
         "T/C rows around it (docs/cp.md; CP groups over MPI)",
         &o->cp, 1, 1 << 20, NULL},
        {"split", 'x', BENCH_OPT_INT, "1",
         "also time each decode batch as this many micro-batches, each on its own stack (the weights shared), ctx and "
         "stream, the branches of one graph (CUDA, one rank): how much of a step the small kernels of one micro-batch "
         "can hide behind another's",
         &o->split, 1, 8, NULL},
    };
    _Static_assert(sizeof opts / sizeof opts[0] <= BENCH_MAX_OPTS, "the table outgrows BENCH_MAX_OPTS");
    memcpy(t, opts, sizeof opts);
    return (int)(sizeof opts / sizeof opts[0]);
}

/* This process's rank when MPI is up already (gdp-bench's caller may have started it), else 0. */
static int rank_if_inited(void) {
    int rank = 0, inited = 0;
    MPI_Initialized(&inited);
    if (inited)
        MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    return rank;
}

int gdp_bench_layer_main(int argc, char **argv) {
    layer_opts o;
    memset(&o, 0, sizeof o);
    bench_opt table[BENCH_MAX_OPTS];
    const int n_opts = layer_table(&o, table);
    const int parsed = bench_parse("gdp-bench layer", LAYER_SYNOPSIS, table, n_opts, argc, argv, 1, rank_if_inited() == 0);
    if (parsed != BENCH_PARSE_OK)
        return parsed == BENCH_PARSE_HELP ? 0 : 2;
    gdp_layer_config_default(&o.cfg);
    o.cfg.hidden_size = o.hidden, o.cfg.num_layers = o.layers, o.cfg.num_heads = o.heads;
    o.cfg.num_groups = o.groups, o.cfg.head_dim = o.head_dim, o.cfg.state_dim = o.state_dim;
    o.cfg.num_householder = o.householder;
    if (gdp_layer_config_validate(&o.cfg) != GDP_STATUS_SUCCESS) {
        fprintf(stderr, "gdp-bench layer: bad options (%s)\n", gdp_last_error());
        return 2;
    }
    bench_env e;
    int rc = env_init(&e, &argc, &argv, o.backend);
    if (rc != 0) {
        if (e.own_mpi)
            MPI_Finalize();
        return rc;
    }
    const int64_t D = o.cfg.hidden_size;
    const double bar = e.backend == GDP_BACKEND_CPU ? 1e-5 : 2e-2;
    /* CP: the TP group of this rank (the ranks with its cp_rank) and its CP group (its
     * tp_rank), rank = tp_rank + tp * cp_rank. Over the MPI comm: gdp_comm_init binds GPUs by
     * a sub-communicator's own node-local rank, which NCCL would need to be this rank's GPU. */
    const int32_t cp = o.cp, tp_size = e.size % cp == 0 ? e.size / cp : 0;
    if (tp_size == 0)
        GDP_FATAL(e.comm, "gdp-bench layer: --cp %d does not divide the %d ranks", cp, e.size);
    gdp_comm_t tp_comm = e.comm, cp_comm = NULL;
    MPI_Comm tp_mpi = MPI_COMM_NULL, cp_mpi = MPI_COMM_NULL;
    if (cp > 1) {
        int32_t tp_rank = 0, cp_rank = 0, cp_size = 1;
        GDP_FATAL_IF_ERROR(e.comm, gdp_parallel_ranks(e.rank, e.size, tp_size, &tp_rank, &cp_rank, &cp_size));
        MPI_Comm_split(MPI_COMM_WORLD, cp_rank, tp_rank, &tp_mpi);
        MPI_Comm_split(MPI_COMM_WORLD, tp_rank, cp_rank, &cp_mpi);
        const gdp_comm_buffers_t where = e.backend == GDP_BACKEND_CUDA ? GDP_COMM_DEVICE_BUFFERS
                                                                       : GDP_COMM_HOST_BUFFERS;
        tp_comm = NULL;
        if (tp_size > 1)
            GDP_FATAL_IF_ERROR(e.comm, gdp_comm_init(&tp_comm, GDP_COMM_MPI, &tp_mpi, where));
        GDP_FATAL_IF_ERROR(e.comm, gdp_comm_init(&cp_comm, GDP_COMM_MPI, &cp_mpi, where));
#ifdef GDP_HAVE_CUDA
        if (e.backend == GDP_BACKEND_CUDA && cudaSetDevice(e.device) != cudaSuccess) /* the comms bound theirs */
            GDP_FATAL(e.comm, "cudaSetDevice(%d) failed after creating the TP and CP comms", e.device);
#endif
    }

    /* one checkpoint per node, written by the node's first rank */
    char path[512] = "";
    MPI_Comm node;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
    int local = 0;
    MPI_Comm_rank(node, &local);
    long job = (long)getpid();
    MPI_Bcast(&job, 1, MPI_LONG, 0, MPI_COMM_WORLD);
    snprintf(path, sizeof path, "%s/gdp_bench_layer_%ld.safetensors", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp",
             job);
    if (local == 0)
        GDP_FATAL_IF_ERROR(e.comm, gdp_checkpoint_write_synthetic(path, &o.cfg, 1234, GDP_DTYPE_FP32));
    MPI_Barrier(MPI_COMM_WORLD);

    /* buckets: claims of b one-token requests, decode of b, prefill of t tokens; rows at least
     * 2 per CP rank (never a one-row GEMM) and a multiple of cp (equal row blocks) */
    gdp_step_bucket buckets[3 * MAX_CASES];
    int nb = 0, pre_bucket[MAX_CASES];
    int32_t max_batch = 1, max_rows = 2;
#define ROWS(n) (((n) < 2 * cp ? 2 * cp : (n)) + cp - 1) / cp * cp
    for (int i = 0; i < o.decode.n; i++) {
        const int32_t b = o.decode.v[i], rows = ROWS(b);
        buckets[nb++] = (gdp_step_bucket){.decode_count = 0, .prefill_count = b, .token_count = rows};
        /* a decode entry for every row (padding ones slot -1), as the engine's decode-only buckets:
         * the layer then reads the decode op's output in place at one request too */
        buckets[nb++] = (gdp_step_bucket){.decode_count = cp == 1 ? rows : b, .prefill_count = 0, .token_count = rows};
        max_batch = b > max_batch ? b : max_batch;
        max_rows = rows > max_rows ? rows : max_rows;
    }
    for (int i = 0; i < o.prefill.n; i++) {
        const int32_t rows = ROWS(o.prefill.v[i]);
        pre_bucket[i] = nb; /* named in the step: a claim bucket of as many rows would fit too */
        buckets[nb++] = (gdp_step_bucket){.decode_count = 0, .prefill_count = 1, .token_count = rows};
        max_rows = rows > max_rows ? rows : max_rows;
    }
#undef ROWS
    stack tp, ref;
    const bool conv_fp32 = strcmp(o.conv_state, "fp32") == 0;
    const gdp_dtype_t ssm_dtype = strcmp(o.ssm_state, "bf16") == 0 ? GDP_DTYPE_BF16 : GDP_DTYPE_FP32;
    stack_init(&tp, &e, e.comm, tp_comm, cp_comm, e.ctx, path, buckets, nb, max_batch + 1, conv_fp32, ssm_dtype);
    if (o.check)
        stack_init(&ref, &e, NULL, NULL, NULL, e.ctx, path, buckets, nb, max_batch + 1, conv_fp32, ssm_dtype);
    micro_batches mb = {.n = 0};
    if (o.split > 1) {
#ifdef GDP_HAVE_CUDA
        if (e.backend != GDP_BACKEND_CUDA || e.size != 1 || cp != 1)
            GDP_FATAL(e.comm, "gdp-bench layer: --split %d needs the CUDA backend on one rank without --cp", o.split);
        gdp_step_bucket mbuckets[2 * MAX_CASES];
        int nmb = 0;
        int32_t max_vb = 1;
        for (int i = 0; i < o.decode.n; i++) {
            const int32_t vb = o.decode.v[i] / o.split, rows = vb < 2 ? 2 : vb;
            if (vb < 1 || o.decode.v[i] % o.split != 0)
                continue;
            mbuckets[nmb++] = (gdp_step_bucket){.decode_count = 0, .prefill_count = vb, .token_count = rows};
            mbuckets[nmb++] = (gdp_step_bucket){.decode_count = vb, .prefill_count = 0, .token_count = rows};
            max_vb = vb > max_vb ? vb : max_vb;
        }
        if (nmb == 0)
            GDP_FATAL(e.comm, "gdp-bench layer: --split %d divides none of the decode batches", o.split);
        split_init(&mb, &e, o.split, &tp, mbuckets, nmb, max_vb + 1, max_vb < 2 ? 2 : max_vb, D, conv_fp32,
                   ssm_dtype);
#else
        GDP_FATAL(e.comm, "gdp-bench layer: --split needs a build with CUDA");
#endif
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (local == 0)
        remove(path);

    char version[32];
    bench_version(version, sizeof version);
    if (e.rank == 0) {
        printf("# gdp-bench layer: gdp %s, %d ranks, backend %s, comm %s\n", version, e.size,
               e.backend == GDP_BACKEND_CUDA ? "cuda" : "cpu", comm_name(&e));
        printf("# config: D=%lld L=%d H=%lld G=%lld P=%lld N=%lld M=%d, tp %d x cp %d (heads per rank %lld), "
               "activations %s, "
               "warmup %d, iters %d (median), check %s\n",
               (long long)D, o.cfg.num_layers, (long long)o.cfg.num_heads, (long long)o.cfg.num_groups,
               (long long)o.cfg.head_dim, (long long)o.cfg.state_dim, o.cfg.num_householder, tp_size, cp,
               (long long)tp.shard.num_heads / cp, e.backend == GDP_BACKEND_CUDA ? "bf16" : "fp32", o.warmup, o.iters,
               o.check ? "vs TP = 1" : "off");
    }
    print_rank_map(&e);
    if (e.rank == 0) {
        printf("#\n# time: eager (host clock around a synchronized forward); graph: the step as one CUDA graph\n"
               "# replayed (the way gdp-run runs it; - where a graph cannot hold it); gemm/ops/coll: the eager\n"
               "# step's phases from the library's marks (profile.h), in %% of it\n");
        static const bench_col cols[] = {{"step", 8},       {"tokens", 8},       {"batch", 6},        {"dtype", 6},
                                         {"time(us)", 11},  {"graph(us)", 11},   {"tok/s", 12},       {"algbw(GB/s)", 12},
                                         {"busbw(GB/s)", 12}, {"gemm", 5},       {"ops", 5},          {"coll", 5},
                                         {"#wrong", 7}};
        bench_print_columns("# ", cols, (int)(sizeof cols / sizeof cols[0]));
    }

    float *host_in = malloc(sizeof(float) * (size_t)(max_rows * D));
    float *host_a = malloc(sizeof(float) * (size_t)(max_rows * D)), *host_b = malloc(sizeof(float) * (size_t)(max_rows * D));
    void *x = buf_alloc(&e, sizeof(float) * (size_t)(max_rows * D));
    void *xr = buf_alloc(&e, sizeof(float) * (size_t)(max_rows * D));
    double *times = calloc((size_t)o.iters, sizeof(double));
    int64_t wrong_total = 0;
    double bus_sum = 0;
    int n_rows_printed = 0;
    const double bus_factor = tp_size > 1 ? 2.0 * (tp_size - 1) / tp_size : 0.0; /* the TP all-reduce's */
    int32_t slots[MAX_CASES * 64], rel[1] = {-1};
    for (int phase = 0; phase < 2; phase++) {
        const int n_cases = phase == 0 ? o.decode.n : o.prefill.n;
        for (int c = 0; c < n_cases; c++) {
            const int32_t v = phase == 0 ? o.decode.v[c] : o.prefill.v[c];
            const int32_t batch = phase == 0 ? v : 1;
            int64_t wrong = 0, T = 0;
            if (phase == 0) { /* claim v slots with one token each, then decode them */
                gdp_prefill_request pre[MAX_CASES * 64];
                for (int32_t i = 0; i < v; i++)
                    pre[i] = (gdp_prefill_request){.slot = GDP_SLOT_AUTO, .n_tokens = 1, .flags = GDP_PREFILL_NEW};
                gdp_step_desc d = {.prefill_count = v, .prefill = pre, .decode_tokens = 1, .bucket = GDP_BUCKET_AUTO};
                const gdp_step_metadata *m = stack_step(&tp, &e, &d);
                for (int32_t i = 0; i < v; i++)
                    slots[i] = m->step->prefill[i].slot;
                fill_rows(host_in, m->padded_token_count, D, 77);
                buf_put(&e, x, host_in, sizeof(float) * (size_t)(m->padded_token_count * D));
                stack_forward(&tp, &e, m, x, D);
                if (o.check) {
                    const gdp_step_metadata *mr = stack_step(&ref, &e, &d);
                    buf_put(&e, xr, host_in, sizeof(float) * (size_t)(mr->padded_token_count * D));
                    stack_forward(&ref, &e, mr, xr, D);
                }
            }
            const gdp_step_metadata *last = NULL;
            for (int it = 0; it < o.warmup + o.iters; it++) {
                gdp_prefill_request pre = {.slot = GDP_SLOT_AUTO, .n_tokens = v, .flags = GDP_PREFILL_NEW};
                gdp_step_desc d = phase == 0
                    ? (gdp_step_desc){.decode_count = v, .decode_tokens = 1, .decode_slots = slots,
                                      .bucket = GDP_BUCKET_AUTO}
                    : (gdp_step_desc){.prefill_count = 1, .prefill = &pre, .decode_tokens = 1,
                                      .release_count = rel[0] >= 0, .release_slots = rel, .bucket = pre_bucket[c]};
                const gdp_step_metadata *m = stack_step(&tp, &e, &d);
                T = m->padded_token_count;
                fill_rows(host_in, T, D, 1000 + (uint64_t)it);
                buf_put(&e, x, host_in, sizeof(float) * (size_t)(T * D));
                if (e.comm)
                    gdp_comm_barrier(e.comm, NULL);
                sync_backend(&e);
                const double t0 = bench_now_s();
                stack_forward(&tp, &e, m, x, D);
                sync_backend(&e);
                const double t = bench_now_s() - t0;
                if (it >= o.warmup)
                    times[it - o.warmup] = t;
                if (o.check) {
                    const gdp_step_metadata *mr = stack_step(&ref, &e, &d);
                    buf_put(&e, xr, host_in, sizeof(float) * (size_t)(T * D));
                    stack_forward(&ref, &e, mr, xr, D);
                    if (it == o.warmup) {
                        buf_get(&e, host_a, x, sizeof(float) * (size_t)(T * D));
                        buf_get(&e, host_b, xr, sizeof(float) * (size_t)(T * D));
                        int64_t first, count; /* this rank's rows (its CP block) */
                        stack_rows(&tp, T, &first, &count);
                        wrong = count_wrong(host_in + first * D, host_a + first * D, host_b + first * D, count * D,
                                            bar);
                    }
                }
                if (phase == 1)
                    rel[0] = m->step->prefill[0].slot;
                last = m;
            }
            const double t_eager = bench_median(times, o.iters); /* before the graph reuses times */
            /* the last step again: its phases, then as a replayed graph */
            const gdp_phase_times pt = step_phases(&tp, &e, last, x, D);
            double tg = graph_time(&tp, &e, last, x, D, o.iters, times), tg_max = tg;
            MPI_Allreduce(&tg, &tg_max, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
            double t_split = -1;
            int64_t split_bad = 0;
#ifdef GDP_HAVE_CUDA
            if (phase == 0 && mb.n > 1 && v % mb.n == 0)
                t_split = split_graph_time(&mb, &e, v, D, o.iters, times, host_in, &split_bad);
#endif
            /* free the case's slots (a release-only step: no forward pass) */
            gdp_step_desc d = {.release_count = phase == 0 ? v : 1, .release_slots = phase == 0 ? slots : rel,
                               .decode_tokens = 1, .bucket = GDP_BUCKET_AUTO};
            stack_step(&tp, &e, &d);
            if (o.check)
                stack_step(&ref, &e, &d);
            rel[0] = -1;
            /* the slowest rank's median is the step's time */
            double t = t_eager, t_max = t;
            int64_t wrong_all = wrong;
            MPI_Allreduce(&t, &t_max, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
            MPI_Allreduce(&wrong, &wrong_all, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
            const double bytes = (double)o.cfg.num_layers * (double)(T / cp) * (double)D * 4.0; /* per rank */
            const double algbw = bytes / t_max / 1e9, busbw = algbw * bus_factor;
            wrong_total += wrong_all + split_bad;
            bus_sum += busbw;
            n_rows_printed++;
            if (e.rank == 0) {
                char graph[24];
                if (tg_max > 0)
                    snprintf(graph, sizeof graph, "%.1f", tg_max * 1e6);
                else
                    snprintf(graph, sizeof graph, "-");
                const double pct = pt.total_s > 0 ? 100.0 / pt.total_s : 0;
                printf("  %8s %8d %6d %6s %11.1f %11s %12.0f %12.3f %12.3f %5.1f %5.1f %5.1f %7lld\n",
                       phase == 0 ? "decode" : "prefill", v, batch, e.backend == GDP_BACKEND_CUDA ? "bf16" : "fp32",
                       t_max * 1e6, graph, (double)v / t_max, algbw, busbw, pt.gemm_s * pct, pt.ops_s * pct,
                       pt.collective_s * pct, (long long)wrong_all);
                double stage_us[GDP_CHUNK_STAGE_NUM];
                for (int st = 0; st < GDP_CHUNK_STAGE_NUM; st++)
                    stage_us[st] = pt.chunk_s[st] * 1e6;
                bench_print_chunk_stages("the eager step's layers together", stage_us, t_max * 1e6);
                if (t_split > 0)
                    printf("#   split: %d micro-batches of %d, each on its own stream, one graph: %.1f us "
                           "(%lld non-finite outputs)\n",
                           mb.n, v / mb.n, t_split * 1e6, (long long)split_bad);
            }
            fflush(stdout);
        }
    }
    if (e.rank == 0) {
        bench_print_wrong_footer((long long)wrong_total);
        bench_print_busbw_footer(n_rows_printed ? bus_sum / n_rows_printed : 0.0);
    }
    free(host_in), free(host_a), free(host_b), free(times);
    buf_free(&e, x), buf_free(&e, xr);
#ifdef GDP_HAVE_CUDA
    if (mb.n > 1) /* before tp: they share its weights */
        split_free(&mb, &e);
#endif
    stack_free(&tp);
    if (o.check)
        stack_free(&ref);
    MPI_Comm_free(&node);
    if (cp > 1) {
        gdp_comm_free(cp_comm);
        gdp_comm_free(tp_comm);
        MPI_Comm_free(&cp_mpi);
        MPI_Comm_free(&tp_mpi);
    }
    env_free(&e);
    return wrong_total ? 1 : 0;
}

/* ---- the collective benchmark ------------------------------------------------------------- */

typedef enum coll_op { COLL_ALLREDUCE = 0, COLL_REDUCE_SCATTER, COLL_ALLGATHER, COLL_NUM } coll_op;
static const char *const k_coll_names[COLL_NUM] = {"allreduce", "reduce_scatter", "allgather"};

/* Send value i of rank r: (r + 1) * (i % K + 1), small integers whose sums over the ranks
 * are exact in fp32 and in bf16 (K = 3: at most 3 * n(n+1)/2 <= 256 for n <= 12). */
static int32_t coll_period(gdp_dtype_t dt) { return dt == GDP_DTYPE_FP32 ? 13 : 3; }

static void coll_fill(void *host, size_t count, gdp_dtype_t dt, int rank, size_t offset) {
    for (size_t i = 0; i < count; i++) {
        const float v = (float)((rank + 1) * (int)((offset + i) % (size_t)coll_period(dt) + 1));
        if (dt == GDP_DTYPE_FP32)
            ((float *)host)[i] = v;
        else
            ((uint16_t *)host)[i] = gdp_float_to_bf16(v);
    }
}

static float coll_get(const void *host, size_t i, gdp_dtype_t dt) {
    return dt == GDP_DTYPE_FP32 ? ((const float *)host)[i] : gdp_bf16_to_float(((const uint16_t *)host)[i]);
}

typedef struct coll_opts {
    const char *backend, *op, *dtype;
    int hidden, warmup, iters;
    bench_list tokens;
} coll_opts;

static int coll_table(coll_opts *o, bench_opt *t) {
    const bench_opt opts[] = {
        {"backend", 'b', BENCH_OPT_CHOICE, "auto", "the backend (auto: CUDA when every rank has a GPU)", &o->backend,
         0, 0, "auto|cpu|cuda"},
        {"hidden", 'd', BENCH_OPT_INT, "256", "row width D of a token", &o->hidden, 1, 1 << 24, NULL},
        {"tokens", 'T', BENCH_OPT_LIST, "1,4,16,64,256,1024,4096", "message sizes in tokens", &o->tokens, 1, 1 << 24,
         NULL},
        {"op", 'o', BENCH_OPT_CHOICE, "all", "the collective", &o->op, 0, 0, "allreduce|reduce_scatter|allgather|all"},
        {"dtype", 't', BENCH_OPT_CHOICE, "fp32", "element type", &o->dtype, 0, 0, "fp32|bf16"},
        {"warmup", 'w', BENCH_OPT_INT, "5", "untimed calls before timing", &o->warmup, 0, 1000000, NULL},
        {"iters", 'i', BENCH_OPT_INT, "20", "timed calls (median)", &o->iters, 1, 1000000, NULL},
    };
    _Static_assert(sizeof opts / sizeof opts[0] <= BENCH_MAX_OPTS, "the table outgrows BENCH_MAX_OPTS");
    memcpy(t, opts, sizeof opts);
    return (int)(sizeof opts / sizeof opts[0]);
}

/* One timed collective of the benchmark (bench_time_host's call), waited for. */
typedef struct coll_call {
    const bench_env *e; /* first: barrier() reads it */
    coll_op k;
    void *send, *recv;
    size_t count, piece;
    gdp_dtype_t dt;
} coll_call;

static int run_collective(void *p) {
    const coll_call *c = p;
    gdp_status_t st = c->k == COLL_ALLREDUCE      ? gdp_comm_allreduce(c->e->comm, c->send, c->recv, c->count, c->dt, NULL)
                      : c->k == COLL_REDUCE_SCATTER ? gdp_comm_reduce_scatter(c->e->comm, c->send, c->recv, c->piece,
                                                                               c->dt, NULL)
                                                     : gdp_comm_allgather(c->e->comm, c->send, c->recv, c->piece, c->dt,
                                                                          NULL);
    sync_backend(c->e);
    GDP_FATAL_IF_ERROR(c->e->comm, st);
    return 0;
}

int gdp_bench_coll_main(int argc, char **argv) {
    coll_opts o;
    memset(&o, 0, sizeof o);
    bench_opt table[BENCH_MAX_OPTS];
    const int n_opts = coll_table(&o, table);
    const int parsed = bench_parse("gdp-bench coll", "[options]   (under mpirun)", table, n_opts, argc, argv, 1,
                                   rank_if_inited() == 0);
    if (parsed != BENCH_PARSE_OK)
        return parsed == BENCH_PARSE_HELP ? 0 : 2;
    const char *backend = o.backend, *op_name = o.op, *dtype_name = o.dtype;
    const int64_t D = o.hidden;
    const int32_t *tokens = o.tokens.v;
    const int n_tokens = o.tokens.n, warmup = o.warmup, iters = o.iters;
    const gdp_dtype_t dt = !strcmp(dtype_name, "bf16") ? GDP_DTYPE_BF16 : GDP_DTYPE_FP32;
    int op_first = -1;
    for (int k = 0; k < COLL_NUM; k++)
        op_first = !strcmp(op_name, k_coll_names[k]) ? k : op_first;
    if (n_tokens < 1) {
        fprintf(stderr, "gdp-bench coll: --tokens names no message size (try --help)\n");
        return 2;
    }
    bench_env e;
    int rc = env_init(&e, &argc, &argv, backend);
    if (rc != 0) {
        if (e.own_mpi)
            MPI_Finalize();
        return rc;
    }
    const int n = e.size;
    const size_t es = gdp_dtype_size(dt);
    char version[32];
    bench_version(version, sizeof version);
    if (e.rank == 0)
        printf("# gdp-bench coll: gdp %s, %d ranks, backend %s, comm %s\n# messages: tokens x D = %lld, "
               "%s, warmup %d, iters %d (median)\n",
               version, n, e.backend == GDP_BACKEND_CUDA ? "cuda" : "cpu", comm_name(&e), (long long)D,
               gdp_dtype_name(dt), warmup, iters);
    print_rank_map(&e);
    if (e.comm == NULL) {
        if (e.rank == 0)
            printf("# one rank: no collective to time (run with -n 2 or more)\n");
        env_free(&e);
        return 0;
    }
    if (e.rank == 0) {
        static const bench_col cols[] = {{"op", 14},       {"tokens", 8},       {"size(B)", 12}, {"count", 12},
                                         {"type", 6},      {"redop", 6},        {"time(us)", 11}, {"algbw(GB/s)", 12},
                                         {"busbw(GB/s)", 12}, {"#wrong", 7}};
        bench_print_columns("#\n# ", cols, (int)(sizeof cols / sizeof cols[0]));
    }
    int64_t wrong_total = 0;
    double bus_sum = 0;
    int rows = 0;
    double *times = calloc((size_t)iters, sizeof(double));
    for (int k = 0; k < COLL_NUM; k++) {
        if (op_first >= 0 && k != op_first)
            continue;
        for (int c = 0; c < n_tokens; c++) {
            size_t count = (size_t)tokens[c] * (size_t)D; /* the whole [tokens, D] tensor */
            count = (count + (size_t)n - 1) / (size_t)n * (size_t)n; /* blocks of equal size per rank */
            const size_t piece = count / (size_t)n;
            void *host_send = malloc(count * es), *host_recv = malloc(count * es);
            void *send = buf_alloc(&e, count * es), *recv = buf_alloc(&e, count * es);
            if (k == COLL_ALLGATHER)
                coll_fill(host_send, piece, dt, e.rank, (size_t)e.rank * piece);
            else
                coll_fill(host_send, count, dt, e.rank, 0);
            buf_put(&e, send, host_send, (k == COLL_ALLGATHER ? piece : count) * es);
            int64_t wrong = 0;
            coll_call call = {.e = &e, .k = (coll_op)k, .send = send, .recv = recv, .count = count, .piece = piece,
                              .dt = dt};
            bench_time_host(warmup, iters, run_collective, barrier, &call, times);
            const size_t out = k == COLL_REDUCE_SCATTER ? piece : count;
            buf_get(&e, host_recv, recv, out * es);
            const float tri = (float)n * (float)(n + 1) / 2.0f;
            for (size_t i = 0; i < out; i++) {
                float want;
                if (k == COLL_ALLGATHER) {
                    const size_t r = i / piece;
                    want = (float)((r + 1) * (i % (size_t)coll_period(dt) + 1));
                } else {
                    const size_t g = k == COLL_REDUCE_SCATTER ? (size_t)e.rank * piece + i : i;
                    want = tri * (float)(g % (size_t)coll_period(dt) + 1);
                }
                wrong += coll_get(host_recv, i, dt) != want;
            }
            double t = bench_median(times, iters), t_max = t;
            int64_t wrong_all = 0;
            MPI_Allreduce(&t, &t_max, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
            MPI_Allreduce(&wrong, &wrong_all, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
            const double bytes = (double)(count * es), algbw = bytes / t_max / 1e9;
            const double factor = k == COLL_ALLREDUCE ? 2.0 * (n - 1) / n : (double)(n - 1) / n;
            wrong_total += wrong_all;
            bus_sum += algbw * factor;
            rows++;
            if (e.rank == 0)
                printf("  %14s %8d %12zu %12zu %6s %6s %11.1f %12.3f %12.3f %7lld\n", k_coll_names[k], tokens[c],
                       count * es, count, gdp_dtype_name(dt), k == COLL_ALLGATHER ? "none" : "sum", t_max * 1e6,
                       algbw, algbw * factor, (long long)wrong_all);
            fflush(stdout);
            free(host_send), free(host_recv);
            buf_free(&e, send), buf_free(&e, recv);
        }
    }
    if (e.rank == 0) {
        bench_print_wrong_footer((long long)wrong_total);
        bench_print_busbw_footer(rows ? bus_sum / rows : 0.0);
    }
    free(times);
    env_free(&e);
    return wrong_total ? 1 : 0;
}
