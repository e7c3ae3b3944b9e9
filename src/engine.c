/*
 * engine.c: the serving engine (include/gdp/engine.h): init and free, the step loop every
 * rank runs, the device step (one CUDA graph per bucket), runs and the decode-vs-recompute
 * check. Scheduling is engine_sched.c, what the root does with sampled tokens is
 * engine_sample.c, the report is engine_report.c (engine_internal.h lists who does what).
 *
 * One step, on every rank (rank 0 of the comm, the root, schedules):
 *   root: compose the step (arrivals, releases, preemption, resumes, decode rows with drafts,
 *         prefill slices, the bucket, the rows the head samples) into the frame
 *   all : frame broadcast -> swap-outs / swap-ins of this rank's cache share -> plan
 *         broadcast, build (its one H2D copy of the metadata), apply -> the step buffer
 *         (row tokens, head rows, sampling parameters) filled from the frame and copied to
 *         the device in one H2D copy -> the device step: embedding gather, every layer, the
 *         vocab-parallel head and sampling (captured as ONE CUDA graph per bucket and
 *         replayed) -> the sampled records to pinned host memory (root) and an event
 *   root: emission (tokens, drafts, stop ids, failures), bookkeeping, progress line
 * Only token ids, margins and flags cross to the host.
 *
 * Pipelined (config.overlap): step n is launched, then the root composes step n + 1 while
 * the device runs it (a row whose input is step n's draw carries a reference to it, which
 * the embedding gather resolves on the device), every rank broadcasts, builds and launches
 * n + 1, and only then waits for step n's event (one wait per step) and the root consumes
 * it. Host buffers the copies read or write are double-buffered by step parity. Steps whose
 * next step depends on their outcome (drafts, check mode) are finished at once (F_WAIT_NOW),
 * and a compose that would depend on it asks every rank to finish it first (FRAME_SYNC).
 */
#include <unistd.h>

#include "engine_internal.h"

_Static_assert((int)GDP_PHASE_GEMM == GDP_MARK_GEMM && (int)GDP_PHASE_GDP_OPS == GDP_MARK_OPS &&
                   (int)GDP_PHASE_COLLECTIVE == GDP_MARK_COLLECTIVE && (int)GDP_PHASE_HEAD == GDP_MARK_HEAD &&
                   (int)GDP_PHASE_HOST == GDP_MARK_NUM,
               "the engine's phases and the phase recorder's marks must line up");

/* Device phases are split by their marks every PHASE_SAMPLE-th launch of a step shape's
 * graph (its marked graph: the event nodes between phases cost device time, about 0.1 ms of
 * an 8-layer decode step, and reading them host time); every step's device total is always
 * measured (the events around it, outside the graph). An eager step is always marked. */
#define PHASE_SAMPLE 8

#ifdef GDP_HAVE_CUDA
/* Whether the next launch of graph g is a sampled one (the marked graph). The first launches
 * are not: a shape used fewer than PHASE_SAMPLE times is captured once. (Graphs are CUDA's: a
 * build without it has no caller, which -Wunused-function reported.) */
static bool next_launch_sampled(const graph_entry *g) { return g->launches % PHASE_SAMPLE == PHASE_SAMPLE - 1; }
#endif

/* Waits for the backend's queued work (CUDA). With a comm the wait is bounded by the comm's
 * watchdog (gdp_comm_stream_wait): a hung GPU, or NCCL kernels waiting for a stalled peer,
 * fail the step naming the stalled rank instead of blocking forever. */
static gdp_status_t backend_sync(const struct gdp_engine *e) {
    gdp_ctx_t ctx = e->ctx;
#ifdef GDP_HAVE_CUDA
    if (ctx->backend == GDP_BACKEND_CUDA && e->comm != NULL) {
        const gdp_status_t st = gdp_comm_stream_wait(e->comm, ctx->stream);
        if (st == GDP_STATUS_CUDA_ERROR) {
            char why[1024];
            snprintf(why, sizeof why, "%s", gdp_last_error());
            GDP_FAIL(GDP_STATUS_CUDA_ERROR, "engine: the step failed on the device: %s", why);
        }
        return st;
    }
    if (ctx->backend == GDP_BACKEND_CUDA) {
        const cudaError_t err = cudaStreamSynchronize((cudaStream_t)ctx->stream);
        if (err != cudaSuccess)
            GDP_CUDA_FAIL(err, "engine: the step failed on the device");
    }
#else
    (void)ctx;
#endif
    return GDP_STATUS_SUCCESS;
}

static bool on_cuda(const struct gdp_engine *e) { return e->ctx->backend == GDP_BACKEND_CUDA; }

gdp_status_t eng_check(const struct gdp_engine *e, const char *op) {
    if (e == NULL)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: engine is NULL; create it with gdp_engine_init()", op);
    if (e->magic != GDP_ENGINE_MAGIC || e->magic_end != GDP_ENGINE_MAGIC)
        GDP_FAIL(GDP_STATUS_INVALID_USAGE, "%s: engine %p is not a live gdp engine (freed or corrupted)", op,
                 (const void *)e);
    return GDP_STATUS_SUCCESS;
}

const char *gdp_engine_phase_name(gdp_engine_phase_t phase) {
    switch (phase) {
    case GDP_PHASE_GEMM: return "GEMMs";
    case GDP_PHASE_GDP_OPS: return "GDP ops";
    case GDP_PHASE_COLLECTIVE: return "collectives";
    case GDP_PHASE_HEAD: return "head + sampling";
    case GDP_PHASE_HOST: return "host";
    default: return "invalid";
    }
}

gdp_status_t gdp_engine_config_default(gdp_engine_config *cfg) {
    if (cfg == NULL)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "gdp_engine_config_default: cfg is NULL");
    *cfg = (gdp_engine_config){.n_slots = 16, .max_step_tokens = 512, .prefill_chunk = 256,
                               .max_prefill_requests = 0, .draft_tokens = 0, .ngram = 3, .preempt = 1,
                               .preempt_after = 16, .preempt_wait_ms = 2000, .schedule = GDP_SCHEDULE_SHORTEST,
                               .schedule_age_ms = 2000, .max_candidates = 256,
                               .cuda_graphs = 1, .honor_arrivals = 1, .progress = 1, .check_requests = 0,
                               .debug_check = 0, .overlap = 1, .graphs_at_init = 1,
                               .ssm_dtype = GDP_DTYPE_FP32, .swap_on_device = 1};
    return GDP_STATUS_SUCCESS;
}

static gdp_status_t validate_config(const gdp_engine_config *c, const char *op) {
    if (c->n_slots < 1 || c->n_slots > (1 << 20))
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: config.n_slots is %d; the engine needs 1 .. 2^20 slots", op,
                 c->n_slots);
    if (c->draft_tokens < 0 || c->draft_tokens > MAX_DRAFTS - 1)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: config.draft_tokens is %d; use 0 (off) to %d", op,
                 c->draft_tokens, MAX_DRAFTS - 1);
    if (c->draft_tokens > 0 && c->ngram < 2)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: config.ngram is %d; the drafter matches n-grams of 2 or more "
                 "tokens", op, c->ngram);
    if (c->prefill_chunk < 0 || c->prefill_chunk % GDP_CHUNK_SIZE != 0)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                 "%s: config.prefill_chunk is %d; use a multiple of %d (slices start at chunk boundaries of the "
                 "prompt) or 0 for whole prompts", op, c->prefill_chunk, GDP_CHUNK_SIZE);
    const int64_t decode = (int64_t)c->n_slots * (1 + c->draft_tokens);
    const int64_t need = decode + (c->prefill_chunk > 0 ? c->prefill_chunk : 1);
    if (c->max_step_tokens < need || c->max_step_tokens > (1 << 24))
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                 "%s: config.max_step_tokens is %d; it must hold every slot's decode tokens (n_slots %d x (1 + "
                 "draft_tokens %d) = %lld) plus one prefill slice (%d), i.e. >= %lld (and <= 2^24)",
                 op, c->max_step_tokens, c->n_slots, c->draft_tokens, (long long)decode,
                 c->prefill_chunk > 0 ? c->prefill_chunk : 1, (long long)need);
    if (c->max_prefill_requests < 0)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: config.max_prefill_requests is %d; use >= 1, or 0 for n_slots",
                 op, c->max_prefill_requests);
    if (c->swap_on_device != 0 && c->swap_on_device != 1)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                 "%s: config.swap_on_device is %d; use 1 (preempted states in device memory) or 0 (pinned host "
                 "memory)", op, c->swap_on_device);
    if (c->preempt && (c->preempt_after < 1 || c->preempt_wait_ms < 0))
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                 "%s: config.preempt_after is %d and preempt_wait_ms %d; use >= 1 decode step and >= 0 ms", op,
                 c->preempt_after, c->preempt_wait_ms);
    if ((c->schedule != GDP_SCHEDULE_FCFS && c->schedule != GDP_SCHEDULE_SHORTEST) || c->schedule_age_ms < 0)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                 "%s: config.schedule is %d and schedule_age_ms %d; use GDP_SCHEDULE_FCFS (%d) or "
                 "GDP_SCHEDULE_SHORTEST (%d), and >= 0 ms", op, c->schedule, c->schedule_age_ms, GDP_SCHEDULE_FCFS,
                 GDP_SCHEDULE_SHORTEST);
    if (c->max_candidates < 1 || c->max_candidates > GDP_SAMPLING_MAX_CANDIDATES)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: config.max_candidates is %d; use 1 .. %d", op, c->max_candidates,
                 GDP_SAMPLING_MAX_CANDIDATES);
    if (c->overlap != 0 && c->overlap != 1)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: config.overlap is %d; use 1 (compose the next step while the "
                 "device runs) or 0 (one step at a time)", op, c->overlap);
    if (c->progress < 0 || c->check_requests < 0)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: config.progress (%d) and config.check_requests (%d) must be >= 0",
                 op, c->progress, c->check_requests);
    return GDP_STATUS_SUCCESS;
}

/* ---- host memory the device copies to and from (pinned on CUDA) -------------------------- */

static gdp_status_t host_alloc(const struct gdp_engine *e, size_t bytes, void **out, const char *what) {
    *out = NULL;
#ifdef GDP_HAVE_CUDA
    if (on_cuda(e)) {
        const cudaError_t err = cudaHostAlloc(out, bytes ? bytes : 1, cudaHostAllocDefault);
        if (err != cudaSuccess) {
            *out = NULL;
            GDP_CUDA_FAIL(err, "engine: cudaHostAlloc of %zu bytes for %s failed", bytes, what);
        }
        memset(*out, 0, bytes);
        return GDP_STATUS_SUCCESS;
    }
#endif
    (void)e;
    *out = gdp_calloc(bytes ? bytes : 1, 1, what);
    return *out != NULL ? GDP_STATUS_SUCCESS : GDP_STATUS_SYSTEM_ERROR;
}

static void host_free(const struct gdp_engine *e, void *p) {
    if (p == NULL)
        return;
#ifdef GDP_HAVE_CUDA
    if (on_cuda(e)) {
        (void)cudaFreeHost(p);
        return;
    }
#endif
    (void)e;
    free(p);
}

/* ---- swaps: the frame's swap-outs and swap-ins through the cache's swap API -------------- */

/* The buffer of swap id `id`, allocated on first use (ids are dense, chosen by the root): device
 * memory on CUDA with config.swap_on_device (the cache's swaps then copy device to device in stream
 * order and the host waits for none of them), else, or once the device has no room for one more,
 * pinned host memory (the cache tells the two apart itself; a run that preempts many requests may
 * hold some of each). */
static gdp_status_t swap_buffer(struct gdp_engine *e, int32_t id, char **out) {
    if (id < 0 || id > e->n_swap_bufs)
        GDP_FAIL(GDP_STATUS_INTERNAL_ERROR, "engine: swap buffer id %d skips ahead of the %d allocated", id,
                 e->n_swap_bufs);
    if (id == e->n_swap_bufs) {
        char **list = realloc(e->swap_bufs, sizeof *list * (size_t)(id + 1));
        if (list == NULL)
            GDP_FAIL(GDP_STATUS_SYSTEM_ERROR, "engine: out of memory for the swap buffer list");
        e->swap_bufs = list;
        unsigned char *dev = realloc(e->swap_dev, (size_t)(id + 1));
        if (dev == NULL)
            GDP_FAIL(GDP_STATUS_SYSTEM_ERROR, "engine: out of memory for the swap buffer list");
        e->swap_dev = dev;
        void *buf = NULL;
        dev[id] = 0;
        if (on_cuda(e) && e->cfg.swap_on_device) {
            if (gdp_buf_alloc(e->ctx, e->swap_bytes, &buf, "a preempted request's swapped state") ==
                GDP_STATUS_SUCCESS) {
                dev[id] = 1;
            } else {
#ifdef GDP_HAVE_CUDA
                (void)cudaGetLastError(); /* the failed cudaMalloc: not sticky, and handled here */
#endif
                e->swap_host_fallbacks++;
            }
        }
        if (!dev[id])
            GDP_CHECK(host_alloc(e, e->swap_bytes, &buf, "a preempted request's swapped state"));
        list[id] = buf;
        e->n_swap_bufs++;
    }
    *out = e->swap_bufs[id];
    return GDP_STATUS_SUCCESS;
}

/* Every rank: the frame's swaps on this rank's cache share. */
static gdp_status_t do_swaps(struct gdp_engine *e) {
    const int32_t *f = e->frame, *out = frame_swap_out(e), *in = frame_swap_in(e);
    for (int32_t k = 0; k < f[F_SWAP_OUT]; k++) {
        char *buf = NULL;
        const int32_t *w = out + SWAP_OUT_WORDS * k;
        GDP_CHECK(swap_buffer(e, w[1], &buf));
        GDP_CHECK(gdp_cache_swap_out(e->cache, w[0], w[2], w[3], buf));
        e->swap_live++;
    }
    for (int32_t k = 0; k < f[F_SWAP_IN]; k++) {
        char *buf = NULL;
        const int32_t *w = in + SWAP_IN_WORDS * k;
        GDP_CHECK(swap_buffer(e, w[0], &buf));
        GDP_CHECK(gdp_cache_swap_in(e->cache, w[1], buf));
        e->swap_live--;
    }
    e->swap_live_peak = e->swap_live > e->swap_live_peak ? e->swap_live : e->swap_live_peak;
    return GDP_STATUS_SUCCESS;
}

/* ---- the step buffer ---------------------------------------------------------------------- */

static const int32_t *step_tokens_dev(const struct gdp_engine *e) {
    return (const int32_t *)(e->step_dev + e->lay.tokens);
}

#ifdef GDP_HAVE_CUDA
static gdp_status_t record_event(const struct gdp_engine *e, void *ev, const char *what) {
    const cudaError_t err = cudaEventRecord((cudaEvent_t)ev, (cudaStream_t)e->ctx->stream);
    if (err != cudaSuccess)
        GDP_CUDA_FAIL(err, "engine: recording the event after %s failed", what);
    return GDP_STATUS_SUCCESS;
}

/* A copy between pinned host memory and the device, queued on the ctx's stream. */
static gdp_status_t async_copy(const struct gdp_engine *e, void *dst, const void *src, size_t bytes,
                               const char *what) {
    const cudaError_t err = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, (cudaStream_t)e->ctx->stream);
    if (err != cudaSuccess)
        GDP_CUDA_FAIL(err, "engine: copying %s failed", what);
    return GDP_STATUS_SUCCESS;
}
#endif

/* Every rank: the row tokens (padding rows -1, references <= -2) and the head's rows and
 * parameters of the step, from the frame, into host step buffer k; then its one copy to the
 * device. Buffer k's previous copy (two device steps ago) must have read it first. */
static gdp_status_t fill_step(struct gdp_engine *e, const gdp_step_metadata *m, int32_t k_buf) {
    char *host = e->step_host[k_buf];
#ifdef GDP_HAVE_CUDA
    if (on_cuda(e)) {
        const cudaError_t err = cudaEventSynchronize((cudaEvent_t)e->ev_copied[k_buf]);
        if (err != cudaSuccess)
            GDP_CUDA_FAIL(err, "engine: waiting for an earlier step buffer copy failed");
    }
#endif
    int32_t *tok = (int32_t *)(host + e->lay.tokens);
    const int32_t *src = frame_tokens(e);
    for (int32_t i = 0; i < m->padded_token_count; i++)
        tok[i] = -1;
    int32_t k = 0;
    for (int32_t i = 0; i < m->decode_count * m->decode_tokens; i++)
        tok[i] = src[k++];
    for (int32_t p = 0; p < m->prefill_count; p++)
        for (int32_t t = m->host.cu_seqlens[p]; t < m->host.cu_seqlens[p + 1]; t++)
            tok[m->prefill_token_offset + t] = src[k++];
    int32_t *rows = (int32_t *)(host + e->lay.head_rows);
    gdp_sample_row *par = (gdp_sample_row *)(host + e->lay.params);
    const int32_t *head = frame_head(e), n = e->frame[F_HEAD], nh = e->bucket_head[m->bucket];
    if (n > nh)
        GDP_FAIL(GDP_STATUS_INTERNAL_ERROR, "engine: %d rows to sample in a bucket of %d", n, nh);
    for (int32_t h = 0; h < nh; h++) {
        if (h < n) {
            rows[h] = head[HEAD_WORDS * h];
            memcpy(&par[h], head + HEAD_WORDS * h + 1, sizeof par[h]);
        } else { /* padding rows: a greedy draw of a zero row, never read */
            rows[h] = -1;
            par[h] = (gdp_sample_row){.temperature = 0.0f, .top_k = 0, .top_p = 1.0f, .position = 0, .seed = 0};
        }
    }
#ifdef GDP_HAVE_CUDA
    if (on_cuda(e)) {
        GDP_CHECK(async_copy(e, e->step_dev, host, e->lay.bytes, "the step buffer to the device"));
        return record_event(e, e->ev_copied[k_buf], "the step buffer's copy");
    }
#endif
    memcpy(e->step_dev, host, e->lay.bytes);
    return GDP_STATUS_SUCCESS;
}

/* ---- the device step ------------------------------------------------------------------------ */

/* Embedding gather, the layers, the head and sampling: every launch depends only on the
 * bucket, never on host values of the step's indices (they are read from the device's
 * copies), so a graph replays it. References to the previous step's draws are resolved
 * from out_dev, which this step's sampling then overwrites (stream order). On CUDA the
 * gather's bound is out_dev's capacity (a constant of the graph); on the CPU the previous
 * step's real head rows, so a bad reference is refused. */
static gdp_status_t device_step(struct gdp_engine *e, const gdp_step_metadata *m, gdp_tensor *x) {
    const int32_t nh = e->bucket_head[m->bucket];
    GDP_CHECK(gdp_model_embed_device(e->model, x, step_tokens_dev(e), m->padded_token_count, e->out_dev,
                                     on_cuda(e) ? e->max_head : e->prev_head));
    GDP_CHECK(gdp_model_forward(e->model, e->cache, m, x));
    const gdp_model_head_args ha = {.x = x, .rows = (const int32_t *)(e->step_dev + e->lay.head_rows), .n_rows = nh,
                                    .params = (const gdp_sample_row *)(e->step_dev + e->lay.params),
                                    .out = e->out_dev};
    return gdp_model_sample(e->model, &ha);
}

/* After the device step k_buf was launched: (root) its records to out_host[k_buf], then the
 * event its wait waits for. Outside the graph, so the host buffer may alternate. */
static gdp_status_t step_tail(struct gdp_engine *e, const gdp_step_metadata *m, int32_t k_buf) {
    const size_t bytes = sizeof(gdp_sample_out) * (size_t)e->bucket_head[m->bucket];
#ifdef GDP_HAVE_CUDA
    if (on_cuda(e)) {
        if (e->rank == 0)
            GDP_CHECK(async_copy(e, e->out_host[k_buf], e->out_dev, bytes, "the sampled tokens to the host"));
        return record_event(e, e->ev_done[k_buf], "the device step");
    }
#endif
    if (e->rank == 0)
        memcpy(e->out_host[k_buf], e->out_dev, bytes);
    return GDP_STATUS_SUCCESS;
}

/* The step's activations x: [padded rows, D] fp32 over e->x. */
static gdp_status_t step_x(const struct gdp_engine *e, const gdp_step_metadata *m, gdp_tensor *x) {
    return gdp_tensor_init(x, e->x, GDP_DTYPE_FP32, 2, (const int64_t[]){m->padded_token_count, e->D});
}

/* The device step recorded into `marks` (NULL: no marks). */
static gdp_status_t recorded_step(struct gdp_engine *e, const gdp_step_metadata *m, gdp_tensor *x,
                                  gdp_phase_list *marks) {
    if (marks == NULL)
        return device_step(e, m, x);
    GDP_CHECK(gdp_phase_begin(e->ctx, marks, GDP_MARK_OPS));
    const gdp_status_t st = device_step(e, m, x);
    const gdp_status_t end = gdp_phase_end(e->ctx);
    return st != GDP_STATUS_SUCCESS ? st : end;
}

#ifdef GDP_HAVE_CUDA
/* Captures bucket m->bucket's graph, marked (its marks into the entry's list) or not; nothing
 * runs. The graph is uploaded, so its first launch costs no more than a replay. */
static gdp_status_t capture_graph(struct gdp_engine *e, const gdp_step_metadata *m, gdp_tensor *x, bool marked) {
    graph_entry *g = &e->graphs[m->bucket];
    cudaGraphExec_t *exec = marked ? &g->exec_marked : &g->exec;
    cudaStream_t s = (cudaStream_t)e->ctx->stream;
    cudaGraph_t cg = NULL;
    const cudaError_t begin = cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed);
    if (begin != cudaSuccess)
        GDP_CUDA_FAIL(begin, "engine: cudaStreamBeginCapture failed for bucket %d", m->bucket);
    *exec = NULL;
    const gdp_status_t st = recorded_step(e, m, x, marked ? &g->marks : NULL);
    const cudaError_t end = cudaStreamEndCapture(s, &cg);
    cudaError_t why = end;
    if (st == GDP_STATUS_SUCCESS && end == cudaSuccess && (why = cudaGraphInstantiate(exec, cg, 0)) == cudaSuccess)
        why = cudaGraphUpload(*exec, s);
    if (cg != NULL)
        cudaGraphDestroy(cg);
    if (st != GDP_STATUS_SUCCESS || why != cudaSuccess) {
        (void)cudaGetLastError();
        if (*exec != NULL)
            cudaGraphExecDestroy(*exec);
        *exec = NULL;
        if (st != GDP_STATUS_SUCCESS)
            return st;
        GDP_CUDA_FAIL(why, "engine: capturing the step of bucket %d as a CUDA graph failed (rerun with --no-graphs)",
                      m->bucket);
    }
    return GDP_STATUS_SUCCESS;
}
#endif

/* The device step, eagerly or as one of the bucket's graphs (each captured on its first
 * use, replayed after). *graph_out: the graph entry that ran, NULL for an eager step (marked
 * into e->eager_marks); *sampled: whether it ran marked (its marks split the device time once
 * it finished): every eager step, and a graph step every PHASE_SAMPLE-th launch of its shape. */
static gdp_status_t run_device_step(struct gdp_engine *e, const gdp_step_metadata *m, gdp_tensor *x,
                                    const graph_entry **graph_out, int *sampled) {
    graph_entry *g = &e->graphs[m->bucket];
    *graph_out = NULL;
    *sampled = 1;
    const bool graph = e->cfg.cuda_graphs && m->save_count == 0; /* a snapshot save adds launches */
#ifdef GDP_HAVE_CUDA
    if (graph && e->graphs_live) {
        cudaStream_t s = (cudaStream_t)e->ctx->stream;
        const bool marked = next_launch_sampled(g);
        cudaGraphExec_t *exec = marked ? &g->exec_marked : &g->exec;
        if (*exec == NULL) {
            GDP_CHECK(capture_graph(e, m, x, marked));
            if (!g->captured)
                e->report.graph_captures++;
            g->captured = 1;
        } else {
            g->replays++;
            e->report.graph_replays++;
        }
        g->launches++;
        const cudaError_t launched = cudaGraphLaunch(*exec, s);
        if (launched != cudaSuccess)
            GDP_CUDA_FAIL(launched, "engine: cudaGraphLaunch of bucket %d failed", m->bucket);
        *graph_out = g;
        *sampled = marked;
        return GDP_STATUS_SUCCESS;
    }
#endif
    /* No device graph (CPU backend, graphs off or unavailable): the hook records the shape's
     * captures and replays and runs the same launches eagerly, so the math is identical. The
     * step is marked like every eager step, so its marks always split it (sampling them like a
     * graph's left a CPU run's phases at 0 wherever no shape ran PHASE_SAMPLE times). */
    if (graph) {
        if (!g->captured) {
            g->captured = 1;
            e->report.graph_captures++;
        } else {
            g->replays++;
            e->report.graph_replays++;
        }
        g->launches++;
    }
    return recorded_step(e, m, x, &e->eager_marks);
}

/* After the step finished: its device time from its marks (every mark when split, else the
 * first and the last). Returns the step's device seconds. */
static double read_phases(struct gdp_engine *e, const gdp_phase_list *marks, bool split, bool record) {
    if (marks->n < 2)
        return 0;
    double sums[GDP_MARK_NUM] = {0}, total = 0;
    if (split) {
        if (gdp_phase_sum(e->ctx, marks, sums, &total) != GDP_STATUS_SUCCESS)
            return 0;
        if (record) {
            for (int p = 0; p < GDP_MARK_NUM; p++)
                e->dev_phase_s[p] += sums[p];
            e->dev_sampled_s += total;
        }
    } else {
        gdp_phase_list ends = {.n = 2, .cap = 2, .phase = (int8_t[]){0, -1},
                               .events = (void *[]){marks->events[0], marks->events[marks->n - 1]},
                               .t = (double[]){marks->t[0], marks->t[marks->n - 1]}};
        if (gdp_phase_sum(e->ctx, &ends, sums, &total) != GDP_STATUS_SUCCESS)
            return 0;
    }
    if (record)
        e->dev_all_s += total;
    return total;
}

/* The floor of a step (engine.h: GDP_FLOOR_*): weights once, the decode requests' states
 * read and written once, the GEMM FLOPs of its real rows. */
static void add_floor(struct gdp_engine *e, const gdp_step_metadata *m) {
    const double decode_rows = (double)m->decode_count * m->decode_tokens;
    double prefill_rows = 0;
    for (int32_t p = 0; p < m->prefill_count; p++)
        prefill_rows += m->host.cu_seqlens[p + 1] - m->host.cu_seqlens[p];
    const double rows = decode_rows + prefill_rows, head = e->frame[F_HEAD];
    const double bytes = e->floor_bytes_per_token + (m->decode_count + m->prefill_count) * e->floor_bytes_per_state;
    const double flops = e->floor_flops_per_token * rows + 2.0 * head * (double)e->vocab * (double)e->D;
    e->report.floor_bytes += bytes;
    e->report.floor_flops += flops;
    e->report.floor_s += fmax(bytes / GDP_FLOOR_BANDWIDTH, flops / GDP_FLOOR_PEAK);
}

/* Whether bucket a is at least as large as bucket b in every size a step's workspaces follow:
 * its rows, its prefill entries (initial states, chunk descriptors) and its decode rows. */
static bool bucket_covers(const struct gdp_engine *e, int32_t a, int32_t b) {
    const gdp_step_bucket *x = &e->buckets[a], *y = &e->buckets[b];
    return x->token_count >= y->token_count && x->prefill_count >= y->prefill_count &&
           x->decode_count * e->bucket_S[a] >= y->decode_count * e->bucket_S[b];
}

/* Before any capture: one step of the largest bucket (one token of a throwaway request,
 * then its release), so every workspace and buffer has its final size and address;
 * growing one later would leave captured graphs pointing at freed memory. The largest is the
 * one that covers every other (bucket_covers): several share the most rows (the budget's level
 * comes twice, with fewer prefill entries first), and a step of one with fewer entries would
 * size the initial states' gather for those. Collective. */
static gdp_status_t warm_up(struct gdp_engine *e) {
    int32_t big = 0;
    for (int32_t b = 1; b < e->n_buckets; b++)
        if (!bucket_covers(e, big, b))
            big = b;
    for (int32_t b = 0; b < e->n_buckets; b++)
        if (!bucket_covers(e, big, b))
            GDP_FAIL(GDP_STATUS_INTERNAL_ERROR,
                     "engine: no bucket covers every other (bucket %d: %d rows, %d prefill entries, %d decode "
                     "requests; bucket %d: %d, %d, %d), so the warm-up step cannot size the workspaces before "
                     "graphs are captured", big, e->buckets[big].token_count, e->buckets[big].prefill_count,
                     e->buckets[big].decode_count, b, e->buckets[b].token_count, e->buckets[b].prefill_count,
                     e->buckets[b].decode_count);
    gdp_prefill_request p = {.slot = GDP_SLOT_AUTO, .n_tokens = 1, .flags = GDP_PREFILL_NEW};
    gdp_step_desc d = {.decode_tokens = e->bucket_S[big], .prefill_count = 1, .prefill = &p, .bucket = big};
    const gdp_step_metadata *m = NULL;
    GDP_CHECK(gdp_plan_bcast(e->plan, e->comm, 0, &d));
    GDP_CHECK(gdp_plan_build(e->plan, e->cache, e->comm, &m));
    GDP_CHECK(gdp_cache_apply_step(e->cache, m));
    const int32_t slot = m->step->prefill[0].slot;
    memset(e->frame, 0, sizeof(int32_t) * F_HEADER);
    frame_tokens(e)[0] = 0;
    e->frame[F_HEAD] = 0; /* every head row padding */
    gdp_tensor x;
    GDP_CHECK(step_x(e, m, &x));
    gdp_status_t st = fill_step(e, m, 0);
    if (e->comm != NULL)
        st = gdp_comm_agree(e->comm, st);
    if (st == GDP_STATUS_SUCCESS)
        st = recorded_step(e, m, &x, &e->eager_marks);
    if (st == GDP_STATUS_SUCCESS)
        st = backend_sync(e);
    if (st != GDP_STATUS_SUCCESS)
        return st;
    gdp_step_desc rel = {.decode_tokens = 1, .release_count = 1, .release_slots = &slot, .bucket = GDP_BUCKET_AUTO};
    GDP_CHECK(gdp_plan_bcast(e->plan, e->comm, 0, &rel));
    GDP_CHECK(gdp_plan_build(e->plan, e->cache, e->comm, &m));
    GDP_CHECK(gdp_cache_apply_step(e->cache, m));
    return backend_sync(e);
}

/* No step after the warm-up may grow a workspace: a graph captured before would replay into the
 * freed one (on the CPU nothing is captured, but the warm-up's promise is the same, so the CPU
 * tests catch a bucket it does not cover). */
static gdp_status_t check_no_growth(const struct gdp_engine *e, const char *when) {
    const int64_t grown = gdp_model_workspace_grows(e->model) - e->ws_grows_warm;
    if (grown == 0)
        return GDP_STATUS_SUCCESS;
    GDP_FAIL(GDP_STATUS_INTERNAL_ERROR,
             "engine: %lld step workspace(s) grew %s, after the warm-up step sized them for the largest bucket: "
             "a bucket is larger than the warm-up's in a size it did not cover, or a call outside the engine grew "
             "a workspace of its ctx (graphs captured before would replay into freed memory)", (long long)grown,
             when);
}

/* With graphs_at_init: both graphs of every bucket, captured from an empty step of the bucket
 * (a step's launches depend only on its bucket, so any step of it is the graph of all), before
 * any run, so no step waits for a capture. Collective: every rank builds the same plans and
 * agrees after each bucket. */
static gdp_status_t capture_all(struct gdp_engine *e) {
#ifdef GDP_HAVE_CUDA
    if (!on_cuda(e) || !e->graphs_live || !e->cfg.graphs_at_init)
        return GDP_STATUS_SUCCESS;
    const double t0 = eng_now();
    for (int32_t b = 0; b < e->n_buckets; b++) {
        const gdp_step_desc d = {.decode_tokens = e->bucket_S[b], .bucket = b};
        const gdp_step_metadata *m = NULL;
        GDP_CHECK(gdp_plan_bcast(e->plan, e->comm, 0, &d));
        GDP_CHECK(gdp_plan_build(e->plan, e->cache, e->comm, &m));
        GDP_CHECK(gdp_cache_apply_step(e->cache, m));
        gdp_tensor x;
        gdp_status_t st = step_x(e, m, &x);
        if (st == GDP_STATUS_SUCCESS)
            st = capture_graph(e, m, &x, false);
        if (st == GDP_STATUS_SUCCESS)
            st = capture_graph(e, m, &x, true);
        if (e->comm != NULL)
            st = gdp_comm_agree(e->comm, st);
        if (st != GDP_STATUS_SUCCESS)
            return st;
        e->graphs[b].captured = 1;
    }
    e->graphs_at_init = e->n_buckets;
    e->graphs_init_s = eng_now() - t0;
#else
    (void)e;
#endif
    return GDP_STATUS_SUCCESS;
}

/* ---- init / free ----------------------------------------------------------------------- */

static void engine_destroy(struct gdp_engine *e) {
#ifdef GDP_HAVE_CUDA
    if (on_cuda(e)) { /* nothing queued may still read or write what is freed below */
        (void)cudaStreamSynchronize((cudaStream_t)e->ctx->stream);
        (void)cudaGetLastError();
        for (int k = 0; k < 2; k++) {
            void *evs[] = {e->ev_copied[k], e->ev_start[k], e->ev_done[k]};
            for (int j = 0; j < 3; j++)
                if (evs[j] != NULL)
                    (void)cudaEventDestroy((cudaEvent_t)evs[j]);
        }
        if (e->trace_ev != NULL)
            (void)cudaEventDestroy((cudaEvent_t)e->trace_ev);
    }
#endif
    eng_run_free(&e->main);
    gdp_cache_free(e->cache);
    gdp_plan_free(e->plan);
    for (int32_t b = 0; e->graphs != NULL && b < e->n_buckets; b++) {
#ifdef GDP_HAVE_CUDA
        if (e->graphs[b].exec != NULL)
            (void)cudaGraphExecDestroy(e->graphs[b].exec);
        if (e->graphs[b].exec_marked != NULL)
            (void)cudaGraphExecDestroy(e->graphs[b].exec_marked);
#endif
        gdp_phase_list_free(&e->graphs[b].marks);
    }
    gdp_phase_list_free(&e->eager_marks);
    free(e->buckets);
    free(e->bucket_of);
    free(e->bucket_S);
    free(e->bucket_head);
    free(e->bucket_seen);
    free(e->graphs);
    free(e->frame);
    if (e->x != NULL)
        gdp_buf_free(e->ctx, e->x);
    if (on_cuda(e)) {
        gdp_buf_free(e->ctx, e->step_dev);
        gdp_buf_free(e->ctx, e->out_dev);
    } else {
        host_free(e, e->step_dev);
        host_free(e, e->out_dev);
    }
    for (int k = 0; k < 2; k++) {
        host_free(e, e->out_host[k]);
        host_free(e, e->step_host[k]);
    }
    free(e->logits);
    free(e->logit_rows);
    for (int32_t i = 0; i < e->n_swap_bufs; i++) {
        if (e->swap_dev[i])
            gdp_buf_free(e->ctx, e->swap_bufs[i]);
        else
            host_free(e, e->swap_bufs[i]);
    }
    free(e->swap_bufs);
    free(e->swap_dev);
    e->magic = e->magic_end = 0;
    free(e);
}

/* What the floor counts per step (add_floor), from the shard and the cache's dtypes. */
static void floor_rates(struct gdp_engine *e, const gdp_cache_config *cc) {
    const gdp_layer_config *lc = &e->shard.config;
    const double D = (double)e->D, layer_params = (double)e->shard.in_proj_dim * D + D * (double)e->shard.d_inner;
    const double wsize = on_cuda(e) ? 2.0 : 4.0; /* bf16 GEMM weights on CUDA, fp32 on the CPU */
    const double v_local = ceil((double)e->vocab / e->shard.tp_size);
    e->floor_bytes_per_token = e->n_layers * layer_params * wsize + v_local * D * wsize;
    e->floor_bytes_per_state = 2.0 * e->n_layers * (double)cc->num_heads * lc->state_dim * lc->head_dim *
                               (double)gdp_dtype_size(cc->ssm_dtype);
    /* 2 FLOPs per weight and row, plus the chunked GDP op's executed FLOPs (performance.md) */
    const double C = GDP_CHUNK_SIZE, K = lc->state_dim, V = lc->head_dim, M = lc->num_householder;
    const double gdp_flops = M * (6 * C * K + 4 * C * V + 2 * C * C / 3 + 4 * K * V) + 2 * K * V;
    e->floor_flops_per_token = e->n_layers * (2.0 * layer_params + cc->num_heads * gdp_flops);
}

static gdp_status_t engine_build(struct gdp_engine *e) {
    const gdp_engine_config *c = &e->cfg;
    GDP_CHECK(gdp_model_get_shard(e->model, &e->shard));
    GDP_CHECK(gdp_model_get_cp_shard(e->model, &e->cp));
    /* With CP the engine's comm is the whole job: rank = tp_rank + tp * cp_rank (config.h). */
    if (e->shard.tp_size * e->cp.cp_size != e->size ||
        e->shard.tp_rank + e->shard.tp_size * e->cp.cp_rank != e->rank)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                 "gdp_engine_init: the model is the shard of tp rank %d of %d (cp rank %d of %d) but the comm is rank "
                 "%d of %d; create the model with the same comm (with CP: the TP and CP groups of this comm, rank = "
                 "tp_rank + tp * cp_rank)",
                 e->shard.tp_rank, e->shard.tp_size, e->cp.cp_rank, e->cp.cp_size, e->rank, e->size);
    const gdp_layer_config *lc = &e->shard.config;
    e->D = lc->hidden_size, e->vocab = lc->vocab_size, e->n_layers = lc->num_layers;
    e->S_max = 1 + c->draft_tokens;
    e->max_prefill = c->max_prefill_requests > 0 ? c->max_prefill_requests : c->n_slots;

    gdp_cache_config cc;
    GDP_CHECK(gdp_cache_config_init_cp(&cc, &e->cp, c->n_slots));
    /* the conv windows hold pre-conv inputs, already in the act dtype: exact in it, and half
     * the conv state's bytes of an fp32 one on CUDA (gdp_layer_get_act_dtype) */
    cc.conv_dtype = gdp_backend_act_dtype(e->ctx->backend);
    cc.ssm_dtype = c->ssm_dtype; /* gdp_cache_init refuses what is neither fp32 nor bf16 */
    cc.max_draft_tokens = e->S_max > 1 ? e->S_max : 0;
    GDP_CHECK(gdp_cache_init(&e->cache, e->ctx, &cc));
    GDP_CHECK(gdp_cache_swap_bytes(e->cache, &e->swap_bytes));
    e->cache_bytes = e->swap_bytes * (size_t)c->n_slots * (size_t)(1 + cc.max_draft_tokens);
    floor_rates(e, &cc);

    GDP_CHECK(eng_make_buckets(e));
    gdp_plan_config pc = {.num_householder = lc->num_householder, .n_slots = c->n_slots,
                          .max_decode_tokens = e->S_max, .n_buckets = e->n_buckets, .buckets = e->buckets,
                          .debug_check = c->debug_check};
    GDP_CHECK(gdp_plan_init(&e->plan, e->ctx, &pc));
    e->bucket_seen = gdp_calloc((size_t)e->n_buckets, sizeof(int32_t), "the engine's bucket use table");
    e->graphs = gdp_calloc((size_t)e->n_buckets, sizeof *e->graphs, "the engine's graph table");
    e->frame_words = F_HEADER + (size_t)c->n_slots * (SWAP_OUT_WORDS + SWAP_IN_WORDS) + (size_t)e->max_rows +
                     (size_t)e->max_head * HEAD_WORDS;
    e->frame = gdp_calloc(e->frame_words, sizeof(int32_t), "the engine's step frame");
    if (e->bucket_seen == NULL || e->graphs == NULL || e->frame == NULL)
        return GDP_STATUS_SYSTEM_ERROR;
    if (e->rank == 0 && c->check_requests > 0) {
        e->logits = gdp_calloc((size_t)e->max_head * (size_t)e->vocab, sizeof(float), "the kept logits of a step");
        e->logit_rows = gdp_calloc((size_t)e->max_head, sizeof(int32_t), "the step's logit rows");
        if (e->logits == NULL || e->logit_rows == NULL)
            return GDP_STATUS_SYSTEM_ERROR;
    }
    GDP_CHECK(gdp_buf_alloc(e->ctx, (size_t)(e->max_rows * e->D) * sizeof(float), &e->x,
                            "the engine's activations"));
    /* the step buffer: row tokens | head rows | sampling parameters (8-byte aligned) */
    e->lay.tokens = 0;
    e->lay.head_rows = sizeof(int32_t) * (size_t)e->max_rows;
    e->lay.params = (e->lay.head_rows + sizeof(int32_t) * (size_t)e->max_head + 7) / 8 * 8;
    e->lay.bytes = e->lay.params + sizeof(gdp_sample_row) * (size_t)e->max_head;
    void *p = NULL;
    const size_t out_bytes = sizeof(gdp_sample_out) * (size_t)e->max_head;
    for (int k = 0; k < 2; k++) {
        GDP_CHECK(host_alloc(e, e->lay.bytes, &p, "the engine's step buffer"));
        e->step_host[k] = p;
        GDP_CHECK(host_alloc(e, out_bytes, &p, "the sampled tokens (host)"));
        e->out_host[k] = p;
    }
    /* The CPU keeps the device's layout too (its own step and record buffers, copied like
     * the device's), so the pipelined loop runs the same bookkeeping on both backends. */
    if (on_cuda(e)) {
        GDP_CHECK(gdp_buf_alloc(e->ctx, e->lay.bytes, &p, "the engine's device step buffer"));
        e->step_dev = p;
        GDP_CHECK(gdp_buf_alloc(e->ctx, out_bytes, &p, "the sampled tokens"));
        e->out_dev = p;
    } else {
        GDP_CHECK(host_alloc(e, e->lay.bytes, &p, "the engine's step buffer (backend)"));
        e->step_dev = p;
        GDP_CHECK(host_alloc(e, out_bytes, &p, "the sampled tokens (backend)"));
        e->out_dev = p;
    }
#ifdef GDP_HAVE_CUDA
    if (on_cuda(e))
        for (int k = 0; k < 2; k++) {
            cudaEvent_t a = NULL, b = NULL, c2 = NULL;
            const cudaError_t err = cudaEventCreateWithFlags(&a, cudaEventDisableTiming);
            const cudaError_t err2 = cudaEventCreate(&b), err3 = cudaEventCreate(&c2);
            e->ev_copied[k] = a, e->ev_start[k] = b, e->ev_done[k] = c2;
            if (err != cudaSuccess || err2 != cudaSuccess || err3 != cudaSuccess)
                GDP_CUDA_FAIL(err != cudaSuccess ? err : (err2 != cudaSuccess ? err2 : err3),
                              "engine: creating the step events failed");
        }
#endif
    GDP_CHECK(gdp_model_reserve_head(e->model, e->max_head, c->max_candidates));
#ifdef GDP_HAVE_CUDA
    if (on_cuda(e)) {
        /* The chunk op's workspace is sized once for the largest step, so it never grows
         * (growing would invalidate captured graphs). */
        size_t ws = 0;
        GDP_CHECK(gdp_chunk_get_workspace_size(e->max_rows, e->max_prefill, lc->num_householder,
                                               (int32_t)e->shard.num_heads, (int32_t)lc->state_dim,
                                               (int32_t)lc->head_dim, &ws));
        GDP_CHECK(gdp_ctx_reserve_workspace(e->ctx, ws));
        /* Graphs replay only what is captured on the stream: a host-staged MPI collective is
         * not, so they need tp = 1 or NCCL, no CP group, and a stream other than the legacy
         * default. */
        gdp_comm_backend_t cb = GDP_COMM_NCCL;
        if (e->comm != NULL)
            GDP_CHECK(gdp_comm_get_backend(e->comm, &cb));
        e->graphs_live = c->cuda_graphs && cb == GDP_COMM_NCCL && e->cp.cp_size == 1 && e->ctx->stream != NULL;
    }
#endif
    return GDP_STATUS_SUCCESS;
}

gdp_status_t gdp_engine_init(gdp_engine_t *out, gdp_ctx_t ctx, gdp_comm_t comm, gdp_model_t model,
                             const gdp_engine_config *config) {
    static const char *op = "gdp_engine_init";
    if (out == NULL || model == NULL || config == NULL)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: out, model and config must not be NULL", op);
    *out = NULL;
    GDP_CHECK(gdp_ctx_check(ctx, op));
    int32_t rank = 0, size = 1;
    if (comm != NULL) {
        GDP_CHECK(gdp_comm_rank(comm, &rank));
        GDP_CHECK(gdp_comm_size(comm, &size));
    }
    gdp_status_t st = validate_config(config, op);
    struct gdp_engine *e = NULL;
    if (st == GDP_STATUS_SUCCESS) {
        e = gdp_calloc(1, sizeof *e, "gdp_engine");
        st = e ? GDP_STATUS_SUCCESS : GDP_STATUS_SYSTEM_ERROR;
    }
    if (e != NULL) {
        e->magic = e->magic_end = GDP_ENGINE_MAGIC;
        e->ctx = ctx, e->comm = comm, e->model = model, e->cfg = *config, e->rank = rank, e->size = size;
        st = engine_build(e);
    }
    if (comm != NULL)
        st = gdp_comm_agree(comm, st);
    /* Also on the CPU, where nothing is captured: the same steps on every backend, and the
     * tests' graphs-on vs graphs-off comparison shows the warm-up leaves no trace. */
    if (st == GDP_STATUS_SUCCESS)
        st = warm_up(e); /* collective */
    if (st == GDP_STATUS_SUCCESS)
        e->ws_grows_warm = gdp_model_workspace_grows(e->model);
    if (st == GDP_STATUS_SUCCESS)
        st = capture_all(e); /* collective */
    if (st == GDP_STATUS_SUCCESS)
        st = check_no_growth(e, "while the buckets' graphs were captured");
    if (st != GDP_STATUS_SUCCESS) {
        if (e != NULL)
            engine_destroy(e);
        return st;
    }
    *out = e;
    return GDP_STATUS_SUCCESS;
}

gdp_status_t gdp_engine_free(gdp_engine_t engine) {
    if (engine == NULL)
        return GDP_STATUS_SUCCESS;
    GDP_CHECK(eng_check(engine, "gdp_engine_free"));
    engine_destroy(engine);
    return GDP_STATUS_SUCCESS;
}

/* ---- the step loop ------------------------------------------------------------------------ */

/* Sends the root's failure to the others in the next frame (they are waiting for one). */
static gdp_status_t send_failure(struct gdp_engine *e, gdp_status_t st) {
    e->frame[F_KIND] = FRAME_ERROR;
    if (e->comm != NULL) {
        (void)gdp_comm_host_bcast(e->comm, e->frame, e->frame_words * sizeof(int32_t), 0);
        st = gdp_comm_agree(e->comm, st);
    }
    return st;
}

/* A launched device step that was not waited for yet. */
typedef struct pending {
    int                live;
    int32_t            k;           /* its buffer parity                                   */
    const graph_entry *graph;       /* the graph that ran (NULL: eager)                    */
    int                sampled;     /* it ran marked: its marks split its device time      */
    step_plan         *sp;          /* the root's plan of it                               */
    int                phases_read; /* its device time is taken (CPU: at once)             */
    double             device_s;
    gdp_status_t       launch_st;   /* this rank's launch status, agreed at its wait      */
    double             t_loop, t_composed, t_planned, t_launched; /* the trace's host times */
} pending;

/* ---- the step trace (GDP_ENGINE_TRACE=path, the root) -------------------------------------
 * One CSV line a device step (its bucket, decode requests, prefill slices, whether it ran the
 * marked graph), times in us since the run's start: the host's loop start,
 * composed, planned (plan and cache applied), launched, the wait for it begun and ended, its
 * tokens consumed; the device's start and end of the step (its events, on the host's clock
 * through an event recorded and waited for at the start: within a few us). The gaps say
 * whether the device waited for the host (gpu_start after the previous gpu_end) and which
 * host stage was slow. */
static void trace_open(struct gdp_engine *e, double t0) {
    const char *path = getenv("GDP_ENGINE_TRACE");
    e->trace = NULL;
    if (e->rank != 0 || path == NULL || path[0] == '\0')
        return;
    e->trace = fopen(path, "w");
    if (e->trace == NULL) {
        fprintf(stderr, "gdp engine: cannot write the step trace %s; running without it\n", path);
        return;
    }
    fprintf(e->trace, "step,bucket,decode,prefill,marked,t_loop,t_composed,t_planned,t_launched,t_wait_begin,t_wait_end,"
                      "t_consumed,gpu_start,gpu_end\n");
#ifdef GDP_HAVE_CUDA
    if (on_cuda(e) && e->trace_ev == NULL && cudaEventCreate((cudaEvent_t *)&e->trace_ev) != cudaSuccess)
        e->trace_ev = NULL;
    if (e->trace_ev != NULL && cudaEventRecord((cudaEvent_t)e->trace_ev, (cudaStream_t)e->ctx->stream) == cudaSuccess)
        (void)cudaEventSynchronize((cudaEvent_t)e->trace_ev);
#endif
    e->trace_zero_s = eng_elapsed(t0);
}

/* The host time (since t0) for the trace; 0 when there is none (no clock read). */
static double trace_now(const struct gdp_engine *e, double t0) { return e->trace != NULL ? eng_elapsed(t0) : 0; }

/* The device time (since t0) of event ev of a finished step; -1 without one. */
static double trace_device_time(const struct gdp_engine *e, void *ev) {
#ifdef GDP_HAVE_CUDA
    float ms = 0;
    if (e->trace_ev != NULL && cudaEventElapsedTime(&ms, (cudaEvent_t)e->trace_ev, (cudaEvent_t)ev) == cudaSuccess)
        return e->trace_zero_s + 1e-3 * ms;
    (void)cudaGetLastError();
#else
    (void)e, (void)ev;
#endif
    return -1;
}

static void trace_step(const struct gdp_engine *e, const pending *p, int64_t step_no, double wait_begin,
                       double wait_end, double consumed) {
    const double g0 = trace_device_time(e, e->ev_start[p->k]), g1 = trace_device_time(e, e->ev_done[p->k]);
    const double us = 1e6;
    fprintf(e->trace, "%lld,%d,%d,%d,%d,%.1f,%.1f,%.1f,%.1f,%.1f,%.1f,%.1f,%.1f,%.1f\n", (long long)step_no,
            p->sp->desc.bucket, p->sp->desc.decode_count, p->sp->desc.prefill_count, p->sampled, us * p->t_loop,
            us * p->t_composed, us * p->t_planned, us * p->t_launched, us * wait_begin, us * wait_end, us * consumed,
            g0 < 0 ? -1 : us * g0, g1 < 0 ? -1 : us * g1);
}

static void trace_close(struct gdp_engine *e) {
    if (e->trace != NULL)
        fclose(e->trace);
    e->trace = NULL;
}

/* Waits for device step k's event (CUDA; bounded by the comm's watchdog). Local. */
static gdp_status_t wait_step(const struct gdp_engine *e, int32_t k) {
#ifdef GDP_HAVE_CUDA
    if (on_cuda(e)) {
        if (e->comm != NULL) {
            const gdp_status_t st = gdp_comm_event_wait(e->comm, e->ev_done[k]);
            if (st == GDP_STATUS_CUDA_ERROR) {
                char why[1024];
                snprintf(why, sizeof why, "%s", gdp_last_error());
                GDP_FAIL(GDP_STATUS_CUDA_ERROR, "engine: the step failed on the device: %s", why);
            }
            return st;
        }
        const cudaError_t err = cudaEventSynchronize((cudaEvent_t)e->ev_done[k]);
        if (err != cudaSuccess)
            GDP_CUDA_FAIL(err, "engine: the step failed on the device");
    }
#else
    (void)e, (void)k;
#endif
    return GDP_STATUS_SUCCESS;
}

/* The pending step's device time, once it finished: a marked step's from its marks (an eager
 * step's are re-recorded by the next launch, so they are read before it; the CPU's at once,
 * its step ran at launch), an unmarked graph step's from the events around it (CUDA). */
static void take_phases(struct gdp_engine *e, pending *p, bool record) {
    if (p->phases_read)
        return;
    p->phases_read = 1;
    p->device_s = 0;
#ifdef GDP_HAVE_CUDA
    if (on_cuda(e) && !p->sampled) {
        float ms = 0;
        if (cudaEventElapsedTime(&ms, (cudaEvent_t)e->ev_start[p->k], (cudaEvent_t)e->ev_done[p->k]) != cudaSuccess) {
            (void)cudaGetLastError();
            return;
        }
        p->device_s = 1e-3 * ms;
        if (record)
            e->dev_all_s += p->device_s;
        return;
    }
#endif
    p->device_s = read_phases(e, p->graph != NULL ? &p->graph->marks : &e->eager_marks, p->sampled, record);
}

/* Every rank: the pending step's wait (after `local`, this rank's status of what it did
 * since), the ranks' agreement, then (root) its consumption and the step's counts. A
 * failure is returned on every rank (the root's consume failure through an error frame). */
static gdp_status_t finish_pending(struct gdp_engine *e, run *r, pending *p, gdp_status_t local, double t0,
                                   bool record, int64_t step_no, double *last_progress, double *device_s) {
    if (local == GDP_STATUS_SUCCESS)
        local = p->launch_st;
    const double wait_begin = trace_now(e, t0);
    if (local == GDP_STATUS_SUCCESS)
        local = wait_step(e, p->k);
    const double wait_end = trace_now(e, t0);
    /* a rank whose device step failed must not leave the others in the next collective */
    gdp_status_t st = e->comm != NULL ? gdp_comm_agree(e->comm, local) : local;
    if (st != GDP_STATUS_SUCCESS)
        return st;
    p->live = 0;
    take_phases(e, p, record);
    *device_s += p->device_s;
    if (e->rank != 0)
        return GDP_STATUS_SUCCESS;
    st = eng_consume(e, r, p->sp, e->out_host[p->k], t0);
    if (st != GDP_STATUS_SUCCESS)
        return send_failure(e, st);
    if (e->trace != NULL && record)
        trace_step(e, p, step_no, wait_begin, wait_end, eng_elapsed(t0));
    if (record) {
        gdp_engine_report *rep = &e->report;
        rep->steps++;
        const bool dec = p->sp->desc.decode_count > 0, pre = p->sp->desc.prefill_count > 0;
        rep->decode_only_steps += dec && !pre;
        rep->prefill_only_steps += pre && !dec;
        rep->mixed_steps += dec && pre;
    }
    const double t = eng_elapsed(t0);
    if (e->cfg.progress > 0 && record && t - *last_progress >= e->cfg.progress) {
        eng_progress_line(e, r, t, step_no, false);
        *last_progress = t;
    }
    return GDP_STATUS_SUCCESS;
}

/* After a failure: lets the queued work end (best effort; a fired watchdog returns at once,
 * its comm aborted) before the caller frees what it reads. */
static void drain(const struct gdp_engine *e) { (void)backend_sync(e); }

/* Every rank: fill the step buffer, launch the device step, its tail (records, event). */
static gdp_status_t launch_step(struct gdp_engine *e, const gdp_step_metadata *m, int32_t k,
                                const graph_entry **graph, int *sampled) {
    gdp_tensor x;
    GDP_CHECK(step_x(e, m, &x));
    GDP_CHECK(fill_step(e, m, k));
#ifdef GDP_HAVE_CUDA
    if (on_cuda(e))
        GDP_CHECK(record_event(e, e->ev_start[k], "the step buffer"));
#endif
    GDP_CHECK(run_device_step(e, m, &x, graph, sampled));
    return step_tail(e, m, k);
}

/* The step loop of a run (every rank; r is the root's run state, NULL elsewhere). */
static gdp_status_t run_loop(struct gdp_engine *e, run *r, bool record) {
    const bool root = e->rank == 0;
    step_plan *sps[2] = {root ? eng_step_plan_alloc(e) : NULL, root ? eng_step_plan_alloc(e) : NULL};
    gdp_status_t st = root && (sps[0] == NULL || sps[1] == NULL) ? GDP_STATUS_SYSTEM_ERROR : GDP_STATUS_SUCCESS;
    if (e->comm != NULL)
        st = gdp_comm_agree(e->comm, st);
    if (st != GDP_STATUS_SUCCESS) {
        eng_step_plan_free(sps[0]), eng_step_plan_free(sps[1]);
        return st;
    }
    /* The root decides; every rank follows the frame. With drafts every step finishes at
     * once (the next step's drafts are this step's draws). */
    const bool overlap = root && e->cfg.overlap && e->cfg.draft_tokens == 0;
    gdp_engine_report *rep = &e->report;
    const double t0 = eng_now();
    double last_progress = 0;
    int64_t step_no = 0;
    pending pend = {0};
    if (record)
        trace_open(e, t0);
    e->dev_steps = 0, e->prev_head = 0;
    for (;;) {
        const double ts = eng_now();
        double device = 0;
        gdp_watchdog_set_step(step_no + 1); /* named by the watchdog and gdp-run's signal line */
        /* 1. the root composes (ahead of the pending step when there is one); a failure
         *    travels in the frame */
        gdp_status_t local = GDP_STATUS_SUCCESS;
        step_plan *sp = NULL;
        if (root) {
            sp = pend.live && pend.sp == sps[0] ? sps[1] : sps[0];
            local = eng_compose(e, r, sp, t0, step_no + 1, pend.live);
            if (local != GDP_STATUS_SUCCESS)
                e->frame[F_KIND] = FRAME_ERROR;
            else if (sp->need_sync)
                e->frame[F_KIND] = FRAME_SYNC;
            e->frame[F_WAIT_NOW] = !overlap;
        }
        const double idle = root ? sp->idle_s : 0;
        const double t_composed = trace_now(e, t0);
        if (record)
            rep->idle_s += idle;
        if (e->comm != NULL) {
            st = gdp_comm_host_bcast(e->comm, e->frame, e->frame_words * sizeof(int32_t), 0);
            if (st != GDP_STATUS_SUCCESS)
                break;
        }
        const int32_t kind = e->frame[F_KIND];
        if (kind == FRAME_ERROR) {
            st = e->comm != NULL ? gdp_comm_agree(e->comm, local) : local;
            break;
        }
        if (kind == FRAME_SYNC || kind == FRAME_STOP) { /* finish the pending step first */
            if (pend.live) {
                st = finish_pending(e, r, &pend, GDP_STATUS_SUCCESS, t0, record, step_no, &last_progress, &device);
                if (st != GDP_STATUS_SUCCESS)
                    break;
            }
            if (record)
                rep->phase_s[GDP_PHASE_HOST] += fmax(0.0, eng_now() - ts - idle - device);
            if (kind == FRAME_STOP)
                break;
            continue;
        }
        step_no++;
        /* 2. every rank: swaps, the plan, the step buffer; a failed swap must reach every
         *    rank before the plan's collectives */
        local = do_swaps(e);
        st = e->comm != NULL ? gdp_comm_agree(e->comm, local) : local;
        if (st != GDP_STATUS_SUCCESS)
            break;
        st = gdp_plan_bcast(e->plan, e->comm, 0, root ? &sp->desc : NULL);
        const gdp_step_metadata *m = NULL;
        if (st == GDP_STATUS_SUCCESS)
            st = gdp_plan_build(e->plan, e->cache, e->comm, &m); /* ends with the ranks' agreement */
        if (st == GDP_STATUS_SUCCESS)
            st = gdp_cache_apply_step(e->cache, m);
        if (st != GDP_STATUS_SUCCESS)
            break; /* build errors are the same on every rank; apply only fails on misuse */
        const double t_planned = trace_now(e, t0);
        if (e->frame[F_RELEASE_ONLY]) { /* slot work but no tokens: no device step */
            if (root && record)
                rep->steps++;
            if (record)
                rep->phase_s[GDP_PHASE_HOST] += fmax(0.0, eng_now() - ts - idle);
            continue;
        }
        /* 3. the device step: an eager pending step's marks are read before this launch
         *    re-records them, and its kept logits (check mode) before its activations are
         *    (a graph's marks are its own: a marked graph is not launched twice in a row) */
        local = GDP_STATUS_SUCCESS;
        if (pend.live && !pend.phases_read && pend.sampled && pend.graph == NULL &&
            wait_step(e, pend.k) == GDP_STATUS_SUCCESS)
            take_phases(e, &pend, record);
        if (root && pend.live && pend.sp->n_logit > 0 && !pend.sp->logits_done) {
            local = wait_step(e, pend.k);
            if (local == GDP_STATUS_SUCCESS)
                local = eng_keep_logits(e, pend.sp);
        }
        if (root) {
            eng_advance(e, r, sp, m);
            rep->overlapped_steps += record && pend.live; /* composed ahead of the pending step */
        }
        const int32_t k = (int32_t)(e->dev_steps & 1);
        const graph_entry *graph = NULL;
        int sampled = 1;
        if (local == GDP_STATUS_SUCCESS)
            local = launch_step(e, m, k, &graph, &sampled);
        const double t_launched = trace_now(e, t0);
        e->dev_steps++;
        e->prev_head = e->frame[F_HEAD];
        if (record && !e->bucket_seen[m->bucket]) {
            e->bucket_seen[m->bucket] = 1;
            rep->buckets_used++;
        }
        if (record)
            add_floor(e, m);
        /* 4. the one wait of the step: for the step before this one (or, finishing at once,
         *    this one), agreed by every rank */
        if (pend.live) {
            st = finish_pending(e, r, &pend, local, t0, record, step_no - 1, &last_progress, &device);
            local = GDP_STATUS_SUCCESS;
            if (st != GDP_STATUS_SUCCESS)
                break;
        }
        pend = (pending){.live = 1, .k = k, .graph = graph, .sampled = sampled, .sp = sp, .launch_st = local,
                         .t_loop = ts - t0,
                         .t_composed = t_composed, .t_planned = t_planned, .t_launched = t_launched};
        if (!on_cuda(e)) /* the CPU step ran at launch: its clocks now, before the next one */
            take_phases(e, &pend, record);
        if (e->frame[F_WAIT_NOW]) {
            st = finish_pending(e, r, &pend, GDP_STATUS_SUCCESS, t0, record, step_no, &last_progress, &device);
            if (st != GDP_STATUS_SUCCESS)
                break;
        }
        if (record)
            rep->phase_s[GDP_PHASE_HOST] += fmax(0.0, eng_now() - ts - idle - device);
    }
    if (st != GDP_STATUS_SUCCESS && pend.live)
        drain(e);
    if (st == GDP_STATUS_SUCCESS && root && record) {
        if (e->cfg.progress > 0)
            eng_progress_line(e, r, eng_elapsed(t0), step_no, true);
        eng_finish_report(e, r, eng_elapsed(t0));
    }
    if (st == GDP_STATUS_SUCCESS)
        gdp_watchdog_set_step(-1); /* between runs: no step (a failure keeps the step it failed in) */
    trace_close(e);
    eng_step_plan_free(sps[0]), eng_step_plan_free(sps[1]);
    return st;
}

/* The device phases of the run: the marks' split of the sampled steps scaled to the device
 * time of every step. */
static void device_phases(struct gdp_engine *e) {
    gdp_engine_report *rep = &e->report;
    rep->device_s = e->dev_all_s;
    const double scale = e->dev_sampled_s > 0 ? e->dev_all_s / e->dev_sampled_s : 0;
    for (int p = 0; p < GDP_MARK_NUM; p++)
        rep->phase_s[p] = e->dev_phase_s[p] * scale;
}

gdp_status_t gdp_engine_run(gdp_engine_t engine, const gdp_workload *workload) {
    static const char *op = "gdp_engine_run";
    GDP_CHECK(eng_check(engine, op));
    struct gdp_engine *e = engine;
    /* The workload is checked (on the root, agreed everywhere) before the last run's
     * results and report are dropped: a refused run leaves them as they were. */
    int64_t total_new = 0;
    gdp_status_t st = e->rank == 0 ? eng_validate_workload(e, workload, &total_new) : GDP_STATUS_SUCCESS;
    if (e->comm != NULL)
        st = gdp_comm_agree(e->comm, st);
    if (st != GDP_STATUS_SUCCESS)
        return st;
    eng_run_free(&e->main);
    e->have_run = 0;
    memset(&e->report, 0, sizeof e->report);
    e->dev_all_s = e->dev_sampled_s = 0;
    memset(e->dev_phase_s, 0, sizeof e->dev_phase_s);
    e->report.tp_size = e->shard.tp_size;
    e->report.graphs_at_init = e->graphs_at_init, e->report.graphs_init_s = e->graphs_init_s;
    for (int32_t b = 0; b < e->n_buckets; b++)
        e->bucket_seen[b] = 0;
    if (e->rank == 0) {
        st = eng_run_init(e, &e->main, workload, e->cfg.check_requests, 0);
        e->main.stream_results = 1;
    }
    if (e->comm != NULL)
        st = gdp_comm_agree(e->comm, st);
    if (st == GDP_STATUS_SUCCESS)
        st = run_loop(e, e->rank == 0 ? &e->main : NULL, true);
    if (st == GDP_STATUS_SUCCESS)
        st = check_no_growth(e, "during the run");
    gdp_engine_report *rep = &e->report;
    device_phases(e);
    for (int p = 0; p < GDP_PHASE_NUM; p++)
        rep->step_s += rep->phase_s[p];
    gdp_model_weight_bytes(e->model, &rep->weight_bytes);
    rep->cache_bytes = e->cache_bytes;
    rep->swap_peak_bytes = (size_t)e->swap_live_peak * e->swap_bytes;
    rep->peak_rss_bytes = eng_peak_rss_bytes();
#ifdef GDP_HAVE_CUDA
    if (on_cuda(e)) {
        size_t free_b = 0, total_b = 0;
        if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess)
            rep->device_bytes = total_b - free_b;
    }
#endif
    e->have_run = st == GDP_STATUS_SUCCESS;
    return st;
}

gdp_status_t gdp_engine_check(gdp_engine_t engine, double *worst, int32_t *checked, int32_t *mismatches) {
    static const char *op = "gdp_engine_check";
    GDP_CHECK(eng_check(engine, op));
    struct gdp_engine *e = engine;
    const bool root = e->rank == 0;
    gdp_status_t st = GDP_STATUS_SUCCESS;
    if (root && (worst == NULL || checked == NULL || mismatches == NULL))
        st = GDP_ERROR(GDP_STATUS_INVALID_ARGUMENT, "%s: worst, checked and mismatches must not be NULL", op);
    else if (root && (!e->have_run || e->main.keep_logits == 0))
        st = GDP_ERROR(GDP_STATUS_INVALID_USAGE,
                       "%s: the last run kept no logits; set config.check_requests > 0 and run first", op);
    /* The recompute workload: prompt + all generated tokens but the last, one new token. */
    gdp_workload wl;
    memset(&wl, 0, sizeof wl);
    run cr;
    memset(&cr, 0, sizeof cr);
    const int32_t n = root && st == GDP_STATUS_SUCCESS ? e->main.keep_logits : 0;
    if (n > 0) {
        wl.requests = gdp_calloc((size_t)n, sizeof *wl.requests, "the check's requests");
        st = wl.requests ? GDP_STATUS_SUCCESS : GDP_STATUS_SYSTEM_ERROR;
        for (int32_t i = 0; i < n && st == GDP_STATUS_SUCCESS; i++) {
            const rq *q = &e->main.r[i];
            gdp_request_spec *s = &wl.requests[i];
            s->id = q->spec->id;
            s->prompt_len = q->spec->prompt_len + q->n_gen - 1;
            s->max_new_tokens = 1;
            s->sampling = q->spec->sampling;
            s->prompt = gdp_calloc((size_t)s->prompt_len, sizeof(int32_t), "a check prompt");
            if (s->prompt == NULL)
                st = GDP_STATUS_SYSTEM_ERROR;
            else
                memcpy(s->prompt, q->tokens, sizeof(int32_t) * (size_t)s->prompt_len);
            wl.n_requests = i + 1;
        }
        /* the budget may be smaller than a recomputed sequence in whole-prompt mode */
        for (int32_t i = 0; i < n && st == GDP_STATUS_SUCCESS && e->cfg.prefill_chunk == 0; i++)
            if (wl.requests[i].prompt_len > e->cfg.max_step_tokens)
                st = GDP_ERROR(GDP_STATUS_UNSUPPORTED,
                               "%s: request %lld's %d tokens exceed a whole-prompt step (max_step_tokens %d); check "
                               "with a prefill chunk", op, (long long)wl.requests[i].id, wl.requests[i].prompt_len,
                               e->cfg.max_step_tokens);
        if (st == GDP_STATUS_SUCCESS) {
            gdp_engine_config keep = e->cfg;
            e->cfg.honor_arrivals = 0;
            st = eng_run_init(e, &cr, &wl, n, 1);
            e->cfg = keep;
        }
    }
    if (e->comm != NULL)
        st = gdp_comm_agree(e->comm, st);
    if (st == GDP_STATUS_SUCCESS) {
        const int32_t progress = e->cfg.progress;
        e->cfg.progress = 0;
        st = run_loop(e, root ? &cr : NULL, false);
        e->cfg.progress = progress;
    }
    if (st == GDP_STATUS_SUCCESS && root) {
        const double bar = e->ctx->backend == GDP_BACKEND_CPU ? 1e-4 : 5e-2;
        double w = 0;
        int32_t bad = 0;
        for (int32_t i = 0; i < n; i++) {
            const float *a = e->main.kept_logits + (size_t)i * (size_t)e->vocab;
            const float *b = cr.kept_logits + (size_t)i * (size_t)e->vocab;
            double md = 0, mb = 0;
            bool finite = true;
            for (int64_t v = 0; v < e->vocab; v++) {
                finite = finite && isfinite(a[v]) && isfinite(b[v]);
                md = fmax(md, fabs((double)a[v] - b[v]));
                mb = fmax(mb, fabs((double)b[v]));
            }
            /* NaN or Inf never passes (fmax would drop a NaN) */
            w = !finite ? INFINITY : fmax(w, mb > 0 ? md / mb : md);
            float ma, sa, mr, sr;
            const int32_t ta = eng_argmax(a, e->vocab, &ma, &sa), tb = eng_argmax(b, e->vocab, &mr, &sr);
            if (!finite || (ta != tb && ma >= bar * sa && mr >= bar * sr))
                bad++;
        }
        *worst = w, *checked = n, *mismatches = bad;
    }
    eng_run_free(&cr);
    gdp_workload_free(&wl);
    return st;
}
