/*
 * engine.c: the serving engine (include/gdp/engine.h). Rank 0 of the comm (the root)
 * schedules; every rank runs the same steps:
 *
 *   root: compose the step (arrivals, releases, preemption, resumes, decode with drafts,
 *         prefill slices under the token budget, the bucket) into a frame + a step desc
 *   all : frame broadcast -> swap-outs / swap-ins on this rank's cache share -> plan
 *         broadcast, build, apply -> embedding of the step's tokens -> agreement -> the
 *         layers (eagerly, or as a CUDA graph per bucket) -> root: LM head, greedy
 *         sampling, draft verification, bookkeeping, progress line
 *
 * Reproducibility is a design rule here: a request's tokens must not depend on the rest
 * of the batch (gdp-math.md 8.1: identical with and without preemption or graphs). So
 *   - prefill slices have a fixed length (prefill_chunk; slice starts at 64-token
 *     boundaries of the prompt) and a slice either fits a step or waits: the budget never
 *     shortens a slice, since the chunked op's summation depends on where slices start;
 *   - every GEMM has at least 2 rows (buckets and the LM head): a BLAS switches to a
 *     matrix-vector kernel for one row, whose summation order differs;
 *   - preemption copies the slot's exact state to host memory and back (no recompute).
 *
 * Preemption needs two cache operations the public cache API does not have (the plan
 * claims slots only for prefill slices): copying a slot's state out (or a pending draft
 * row), and claiming a slot with given contents. slot_save / slot_load below do them on
 * the cache's internals (layer_internal.h), between steps and identically on every rank;
 * they belong in cache.c as gdp_cache_swap_out / gdp_cache_swap_in.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "gdp/engine.h"
#include "layer_internal.h"

#ifdef GDP_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#define GDP_ENGINE_MAGIC 0x67646567u /* "gdeg" */

/* The step frame the root broadcasts: a header, swap-outs {slot, buffer, draft S, kept},
 * swap-ins {buffer, slot}, then the token id of every real row (decode rows in order,
 * then the prefill slices in order). */
enum { F_KIND = 0, F_STEP, F_SWAP_OUT, F_SWAP_IN, F_DECODE, F_S, F_PREFILL, F_TOKENS, F_RELEASE_ONLY, F_HEADER };
enum { FRAME_STEP = 1, FRAME_STOP, FRAME_ERROR };
#define SWAP_OUT_WORDS 4
#define SWAP_IN_WORDS 2

typedef enum rq_state { RQ_FUTURE = 0, RQ_QUEUED, RQ_PREFILL, RQ_DECODE, RQ_SWAPPED, RQ_DONE } rq_state;

/* One request on the root. */
typedef struct rq {
    const gdp_request_spec *spec;
    rq_state state;
    int32_t *tokens;          /* prompt + generated, capacity prompt + max_new + S_max  */
    int32_t  n_tokens;
    int32_t  n_fed;           /* tokens whose effect the slot (or swap buffer) holds    */
    int32_t  n_gen;
    float   *margin, *scale;  /* [max_new] top-2 margin and max |logit| per token        */
    double   last_token_s;
    int32_t  slot, swap_buf;
    int32_t  draft_S, draft_keep; /* a pending accept of the last draft step (keep < S) */
    int64_t  order;           /* FIFO position (admission or preemption)                */
    int32_t  run_steps;       /* decode steps since (re)admission                       */
    int32_t  preemptions, drafts_proposed, drafts_accepted;
    double   arrival, first_token, finish;
} rq;

/* The root's view of one run. */
typedef struct run {
    int32_t  n;
    rq      *r;
    int32_t *slot_owner;     /* [n_slots] request holding the slot, -1 free              */
    uint8_t *released_now;   /* [n_slots] released by the step being composed            */
    int32_t *release;        /* slots of requests that finished: released next step     */
    int32_t  n_release;
    int32_t *free_bufs;      /* swap buffer ids free for reuse                           */
    int32_t  n_free_bufs, n_bufs;
    int64_t  seq;
    int32_t  n_done;
    double  *itl;            /* gaps between consecutive tokens of a request             */
    int64_t  n_itl;
    int32_t  keep_logits;    /* requests [0, keep) keep their last (or first) logits     */
    float   *kept_logits;    /* [keep, vocab]                                            */
    int      first_logits;   /* check mode: keep the first token's logits, not the last  */
    int64_t  work_total, work_done; /* prompt + new tokens, for the progress ETA        */
} run;

/* A captured step shape. */
typedef struct graph_entry {
    int32_t captured;
    int64_t replays;
#ifdef GDP_HAVE_CUDA
    cudaGraphExec_t exec;
#endif
} graph_entry;

struct gdp_engine {
    uint32_t          magic;
    gdp_ctx_t         ctx;
    gdp_comm_t        comm;
    gdp_model_t       model;
    gdp_engine_config cfg;
    int32_t           rank, size;
    gdp_tp_shard      shard;
    gdp_cp_shard      cp;           /* the model's CP shard (cp_size 1 without CP)        */
    int64_t           D, vocab;
    int32_t           n_layers, S_max, max_prefill;
    gdp_cache_t       cache;
    gdp_plan_t        plan;
    size_t            cache_bytes;
    /* buckets: [S index][decode level][prefill level] -> plan bucket index (-1: none) */
    gdp_step_bucket  *buckets;
    int32_t           n_buckets, n_dec_levels, n_pre_levels;
    int32_t           dec_levels[40], pre_levels[40];
    int32_t          *bucket_of;
    int32_t          *bucket_S;     /* [n_buckets] the S each bucket was made for          */
    int32_t          *bucket_seen;
    graph_entry      *graphs;
    int               graphs_live;  /* graphs really captured (CUDA with NCCL or tp = 1)  */
    /* step buffers */
    int32_t          *frame;
    size_t            frame_words;
    int64_t           max_rows;     /* rows of the largest bucket                         */
    int32_t          *row_tokens;   /* [max_rows]                                         */
    void             *x;            /* [max_rows, D] backend                              */
    float            *logits;       /* [max_logit_rows, vocab] root                       */
    int32_t          *logit_rows;
    int32_t           max_logit_rows;
    /* swap pool (every rank) */
    char            **swap_bufs;
    int32_t           n_swap_bufs;
    size_t            swap_bytes;   /* one request's state on this rank                   */
    int32_t           swap_live, swap_live_peak;
    /* phase calibration: per layer, t_gemm(T) = ga + gb T, t_allreduce(T) = ca + cb T */
    double            ga, gb, ca, cb, agree_s;
    /* results */
    run               main;
    int               have_run;
    gdp_engine_report report;
    uint32_t          magic_end;
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Waits for the backend's queued work (CUDA), so host timers measure it. */
static void backend_sync(gdp_ctx_t ctx) {
#ifdef GDP_HAVE_CUDA
    if (ctx->backend == GDP_BACKEND_CUDA)
        (void)cudaStreamSynchronize((cudaStream_t)ctx->stream);
#else
    (void)ctx;
#endif
}

static gdp_status_t check_engine(const struct gdp_engine *e, const char *op) {
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
    case GDP_PHASE_HOST: return "host";
    default: return "invalid";
    }
}

gdp_status_t gdp_engine_config_default(gdp_engine_config *cfg) {
    if (cfg == NULL)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "gdp_engine_config_default: cfg is NULL");
    *cfg = (gdp_engine_config){.n_slots = 16, .max_step_tokens = 512, .prefill_chunk = 256,
                               .max_prefill_requests = 0, .draft_tokens = 0, .ngram = 3, .preempt = 1,
                               .preempt_after = 16, .cuda_graphs = 1, .honor_arrivals = 1, .progress = 1,
                               .check_requests = 0, .debug_check = 0};
    return GDP_STATUS_SUCCESS;
}

static gdp_status_t validate_config(const gdp_engine_config *c, const char *op) {
    if (c->n_slots < 1)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: config.n_slots is %d; the engine needs at least 1 slot", op,
                 c->n_slots);
    if (c->draft_tokens < 0 || c->draft_tokens > 15)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: config.draft_tokens is %d; use 0 (off) to 15", op,
                 c->draft_tokens);
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
    if (c->preempt && c->preempt_after < 1)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: config.preempt_after is %d; it must be >= 1 decode step", op,
                 c->preempt_after);
    if (c->progress < 0 || c->check_requests < 0)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: config.progress (%d) and config.check_requests (%d) must be >= 0",
                 op, c->progress, c->check_requests);
    return GDP_STATUS_SUCCESS;
}

/* ---- cache slots the plan cannot move: swap out / swap in (see the file comment) ---------- */

/* Copies slot `slot`'s state on every layer into host (ssm then conv, layer by layer). With
 * S > 0 the slot has a pending draft step and the state after its `keep` kept tokens is
 * draft row [slot, keep - 1] (what an accept would have copied back). */
static gdp_status_t slot_save(struct gdp_cache *c, int32_t slot, int32_t S, int32_t keep, char *host) {
    if (slot < 0 || slot >= c->cfg.n_slots || !c->slot_used[slot] || (S > 0 && c->draft_tokens[slot] != S) ||
        (S > 0 && (keep < 1 || keep > S)))
        GDP_FAIL(GDP_STATUS_INTERNAL_ERROR,
                 "engine: swap-out of slot %d (draft S %d, kept %d) does not match the cache (in use %d, pending "
                 "draft S %d)", slot, S, keep, slot >= 0 && slot < c->cfg.n_slots ? c->slot_used[slot] : -1,
                 slot >= 0 && slot < c->cfg.n_slots ? c->draft_tokens[slot] : -1);
    for (int32_t l = 0; l < c->cfg.num_layers; l++) {
        const size_t row = S > 0 ? (size_t)slot * (size_t)S + (size_t)(keep - 1) : (size_t)slot;
        const char *ssm = (const char *)(S > 0 ? c->draft_ssm[l] : c->ssm[l]) + row * c->ssm_bytes;
        const char *conv = (const char *)(S > 0 ? c->draft_conv[l] : c->conv[l]) + row * c->conv_bytes;
        GDP_CHECK(gdp_layer_buf_download(c->ctx, host, ssm, c->ssm_bytes));
        host += c->ssm_bytes;
        GDP_CHECK(gdp_layer_buf_download(c->ctx, host, conv, c->conv_bytes));
        host += c->conv_bytes;
    }
    return GDP_STATUS_SUCCESS;
}

/* Claims free slot `slot` with the state slot_save wrote into host. */
static gdp_status_t slot_load(struct gdp_cache *c, int32_t slot, const char *host) {
    if (slot < 0 || slot >= c->cfg.n_slots || c->slot_used[slot])
        GDP_FAIL(GDP_STATUS_INTERNAL_ERROR, "engine: swap-in into slot %d, which is %s", slot,
                 slot < 0 || slot >= c->cfg.n_slots ? "out of range" : "in use");
    for (int32_t l = 0; l < c->cfg.num_layers; l++) {
        GDP_CHECK(gdp_layer_buf_upload(c->ctx, (char *)c->ssm[l] + (size_t)slot * c->ssm_bytes, host, c->ssm_bytes));
        host += c->ssm_bytes;
        GDP_CHECK(gdp_layer_buf_upload(c->ctx, (char *)c->conv[l] + (size_t)slot * c->conv_bytes, host,
                                       c->conv_bytes));
        host += c->conv_bytes;
    }
    c->slot_used[slot] = 1;
    c->draft_tokens[slot] = 0;
    return GDP_STATUS_SUCCESS;
}

/* The host buffer of swap id `id`, allocated on first use (ids are dense, chosen by the root). */
static gdp_status_t swap_buffer(struct gdp_engine *e, int32_t id, char **out) {
    if (id < 0 || id > e->n_swap_bufs)
        GDP_FAIL(GDP_STATUS_INTERNAL_ERROR, "engine: swap buffer id %d skips ahead of the %d allocated", id,
                 e->n_swap_bufs);
    if (id == e->n_swap_bufs) {
        char **list = realloc(e->swap_bufs, sizeof *list * (size_t)(id + 1));
        if (list == NULL)
            GDP_FAIL(GDP_STATUS_SYSTEM_ERROR, "engine: out of memory for the swap buffer list");
        e->swap_bufs = list;
        list[id] = gdp_calloc(e->swap_bytes, 1, "a preempted request's swapped state");
        if (list[id] == NULL)
            return GDP_STATUS_SYSTEM_ERROR;
        e->n_swap_bufs++;
    }
    *out = e->swap_bufs[id];
    return GDP_STATUS_SUCCESS;
}

/* ---- buckets -------------------------------------------------------------------------------- */

static int32_t level_at_least(const int32_t *levels, int32_t n, int32_t v) {
    for (int32_t i = 0; i < n; i++)
        if (levels[i] >= v)
            return i;
    return -1;
}

/* Buckets for S = 1 and S = S_max: decode counts 0, 1, 2, 4 .. n_slots x prefill tokens
 * 0, 64, 128, 256 .. budget; rows = max(2, decode * S + prefill) (never a one-row GEMM),
 * with CP at least 2 per CP rank and rounded up to a multiple of cp (equal row blocks). */
static gdp_status_t make_buckets(struct gdp_engine *e) {
    const gdp_engine_config *c = &e->cfg;
    int32_t nd = 0, np = 0;
    e->dec_levels[nd++] = 0;
    for (int32_t d = 1; d < c->n_slots; d *= 2)
        e->dec_levels[nd++] = d;
    e->dec_levels[nd++] = c->n_slots;
    e->pre_levels[np++] = 0;
    for (int32_t p = GDP_CHUNK_SIZE; p < c->max_step_tokens; p *= 2)
        e->pre_levels[np++] = p;
    e->pre_levels[np++] = c->max_step_tokens;
    e->n_dec_levels = nd, e->n_pre_levels = np;
    const int32_t n_s = e->S_max > 1 ? 2 : 1;
    e->bucket_of = gdp_calloc((size_t)(n_s * nd * np), sizeof(int32_t), "the engine's bucket table");
    e->buckets = gdp_calloc((size_t)(n_s * nd * np), sizeof *e->buckets, "the engine's buckets");
    e->bucket_S = gdp_calloc((size_t)(n_s * nd * np), sizeof(int32_t), "the engine's bucket S table");
    if (e->bucket_of == NULL || e->buckets == NULL || e->bucket_S == NULL)
        return GDP_STATUS_SYSTEM_ERROR;
    int32_t n = 0;
    for (int32_t si = 0; si < n_s; si++) {
        const int32_t S = si ? e->S_max : 1;
        for (int32_t di = 0; di < nd; di++)
            for (int32_t pi = 0; pi < np; pi++) {
                const int32_t dc = e->dec_levels[di], pt = e->pre_levels[pi];
                int32_t *slot = &e->bucket_of[(si * nd + di) * np + pi];
                if (dc == 0 && pt == 0) {
                    *slot = -1;
                    continue;
                }
                const int32_t cp = e->cp.cp_size, need = dc * S + pt < 2 * cp ? 2 * cp : dc * S + pt;
                const int32_t rows = (need + cp - 1) / cp * cp;
                e->buckets[n] = (gdp_step_bucket){.decode_count = dc, .prefill_count = pt ? e->max_prefill : 0,
                                                  .token_count = rows};
                if (rows > e->max_rows)
                    e->max_rows = rows;
                e->bucket_S[n] = S;
                *slot = n++;
            }
    }
    e->n_buckets = n;
    return GDP_STATUS_SUCCESS;
}

static int32_t bucket_for(const struct gdp_engine *e, int32_t S, int32_t n_decode, int32_t prefill_tokens) {
    const int32_t si = S > 1 ? 1 : 0;
    const int32_t di = level_at_least(e->dec_levels, e->n_dec_levels, n_decode);
    const int32_t pi = level_at_least(e->pre_levels, e->n_pre_levels, prefill_tokens);
    if (di < 0 || pi < 0 || (S > 1 && S != e->S_max))
        return -1;
    return e->bucket_of[(si * e->n_dec_levels + di) * e->n_pre_levels + pi];
}

/* ---- phase calibration ------------------------------------------------------------------ */

/* Per layer: the in_proj + out_proj GEMMs at T rows in the layer's dtypes (fp32 on the CPU;
 * bf16 operands on CUDA, out_proj adding into the fp32 residual), and the all-reduce of
 * T x D floats; plus one status agreement (the plan's per step). Timed at two sizes (best
 * of a few), fitted a + b T. */
static gdp_status_t calibrate(struct gdp_engine *e) {
    const int64_t D = e->D, P = e->shard.in_proj_dim, di = e->shard.d_inner;
    const gdp_dtype_t act = e->ctx->backend == GDP_BACKEND_CPU ? GDP_DTYPE_FP32 : GDP_DTYPE_BF16;
    const int64_t T1 = 16, T2 = 256;
    const size_t es = sizeof(float);
    void *a = NULL, *w1 = NULL, *w2 = NULL, *c = NULL;
    gdp_status_t st = gdp_layer_buf_alloc(e->ctx, (size_t)(T2 * (D > di ? D : di)) * es, &a, "calibration input");
    if (st == GDP_STATUS_SUCCESS)
        st = gdp_layer_buf_alloc(e->ctx, (size_t)(P * D) * es, &w1, "calibration in_proj");
    if (st == GDP_STATUS_SUCCESS)
        st = gdp_layer_buf_alloc(e->ctx, (size_t)(D * di) * es, &w2, "calibration out_proj");
    if (st == GDP_STATUS_SUCCESS)
        st = gdp_layer_buf_alloc(e->ctx, (size_t)(T2 * (P > D ? P : D)) * es, &c, "calibration output");
    double t_gemm[2] = {0, 0}, t_ar[2] = {0, 0};
    const int64_t Ts[2] = {T1, T2};
    for (int k = 0; k < 2 && st == GDP_STATUS_SUCCESS; k++) {
        double best = 1e30;
        for (int rep = 0; rep < 3 && st == GDP_STATUS_SUCCESS; rep++) {
            const double t0 = now_s();
            st = gdp_layer_gemm_nt_ex(e->ctx, Ts[k], P, D, a, D, w1, act, 0.0f, c, P, act);
            if (st == GDP_STATUS_SUCCESS)
                st = gdp_layer_gemm_nt_ex(e->ctx, Ts[k], D, di, a, di, w2, act, 1.0f, c, D, GDP_DTYPE_FP32);
            backend_sync(e->ctx);
            best = fmin(best, now_s() - t0);
        }
        t_gemm[k] = best;
    }
    /* The collectives run on every rank together (init is collective); a rank whose GEMMs
     * failed still joins them with its status, so nobody waits. */
    if (e->comm != NULL) {
        st = gdp_comm_agree(e->comm, st);
        for (int k = 0; k < 2 && st == GDP_STATUS_SUCCESS; k++) {
            double best = 1e30;
            for (int rep = 0; rep < 3 && st == GDP_STATUS_SUCCESS; rep++) {
                const double t0 = now_s();
                st = gdp_comm_allreduce(e->comm, c, c, (size_t)(Ts[k] * D), GDP_DTYPE_FP32, e->ctx->stream);
                backend_sync(e->ctx);
                best = fmin(best, now_s() - t0);
            }
            t_ar[k] = best;
        }
        double best = 1e30;
        for (int rep = 0; rep < 5 && st == GDP_STATUS_SUCCESS; rep++) {
            const double t0 = now_s();
            st = gdp_comm_agree(e->comm, GDP_STATUS_SUCCESS);
            best = fmin(best, now_s() - t0);
        }
        e->agree_s = st == GDP_STATUS_SUCCESS ? best : 0;
    }
    gdp_layer_buf_free(e->ctx, a);
    gdp_layer_buf_free(e->ctx, w1);
    gdp_layer_buf_free(e->ctx, w2);
    gdp_layer_buf_free(e->ctx, c);
    if (st != GDP_STATUS_SUCCESS)
        return st;
    e->gb = fmax(0, (t_gemm[1] - t_gemm[0]) / (double)(T2 - T1));
    e->ga = fmax(0, t_gemm[0] - e->gb * (double)T1);
    e->cb = fmax(0, (t_ar[1] - t_ar[0]) / (double)(T2 - T1));
    e->ca = fmax(0, t_ar[0] - e->cb * (double)T1);
    return GDP_STATUS_SUCCESS;
}

/* Splits the layers' time of a step of T rows into GEMMs, collectives and the rest. */
static void split_layers(const struct gdp_engine *e, double layers_s, int64_t T, double *gemm, double *coll,
                         double *ops) {
    double g = e->n_layers * (e->ga + e->gb * (double)T);
    double c = e->comm ? e->n_layers * (e->ca + e->cb * (double)T) : 0;
    if (g + c > layers_s && g + c > 0) { /* an estimate cannot exceed what was measured */
        const double f = layers_s / (g + c);
        g *= f, c *= f;
    }
    *gemm = g, *coll = c, *ops = layers_s - g - c;
}

/* ---- init / free ----------------------------------------------------------------------- */

static void engine_destroy(struct gdp_engine *e);
static gdp_status_t warm_up(struct gdp_engine *e);

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
    cc.max_draft_tokens = e->S_max > 1 ? e->S_max : 0;
    GDP_CHECK(gdp_cache_init(&e->cache, e->ctx, &cc));
    e->swap_bytes = (size_t)cc.num_layers * (e->cache->ssm_bytes + e->cache->conv_bytes);
    e->cache_bytes = (size_t)cc.num_layers * (e->cache->ssm_bytes + e->cache->conv_bytes) * (size_t)c->n_slots *
                     (size_t)(1 + cc.max_draft_tokens);

    GDP_CHECK(make_buckets(e));
    gdp_plan_config pc = {.num_householder = lc->num_householder, .n_slots = c->n_slots,
                          .max_decode_tokens = e->S_max, .n_buckets = e->n_buckets, .buckets = e->buckets,
                          .debug_check = c->debug_check};
    GDP_CHECK(gdp_plan_init(&e->plan, e->ctx, &pc));
    e->bucket_seen = gdp_calloc((size_t)e->n_buckets, sizeof(int32_t), "the engine's bucket use table");
    e->graphs = gdp_calloc((size_t)e->n_buckets, sizeof *e->graphs, "the engine's graph table");
    e->frame_words = F_HEADER + (size_t)c->n_slots * (SWAP_OUT_WORDS + SWAP_IN_WORDS) + (size_t)e->max_rows;
    e->frame = gdp_calloc(e->frame_words, sizeof(int32_t), "the engine's step frame");
    e->row_tokens = gdp_calloc((size_t)e->max_rows, sizeof(int32_t), "the engine's row tokens");
    e->max_logit_rows = c->n_slots * e->S_max + e->max_prefill;
    if (e->rank == 0) {
        e->logits = gdp_calloc((size_t)e->max_logit_rows * (size_t)e->vocab, sizeof(float), "the step's logits");
        e->logit_rows = gdp_calloc((size_t)e->max_logit_rows, sizeof(int32_t), "the step's logit rows");
        if (e->logits == NULL || e->logit_rows == NULL)
            return GDP_STATUS_SYSTEM_ERROR;
    }
    if (e->bucket_seen == NULL || e->graphs == NULL || e->frame == NULL || e->row_tokens == NULL)
        return GDP_STATUS_SYSTEM_ERROR;
    GDP_CHECK(gdp_layer_buf_alloc(e->ctx, (size_t)(e->max_rows * e->D) * sizeof(float), &e->x,
                                  "the engine's activations"));
#ifdef GDP_HAVE_CUDA
    if (e->ctx->backend == GDP_BACKEND_CUDA) {
        /* The chunk op's workspace is sized once for the largest step, so it never grows
         * (growing would invalidate captured graphs). */
        size_t ws = 0;
        GDP_CHECK(gdp_chunk_get_workspace_size(e->max_rows, e->max_prefill, lc->num_householder,
                                               (int32_t)e->shard.num_heads, (int32_t)lc->state_dim,
                                               (int32_t)lc->head_dim, &ws));
        GDP_CHECK(gdp_ctx_reserve_workspace(e->ctx, ws));
        /* Graphs replay only what is captured on the stream: a host-staged MPI collective is
         * not, so they need tp = 1 or NCCL, and a stream other than the legacy default. */
        gdp_comm_backend_t cb = GDP_COMM_NCCL;
        if (e->comm != NULL)
            GDP_CHECK(gdp_comm_get_backend(e->comm, &cb));
        e->graphs_live = c->cuda_graphs && cb == GDP_COMM_NCCL && e->ctx->stream != NULL;
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
    if (st == GDP_STATUS_SUCCESS)
        st = calibrate(e); /* collective; ends agreed */
    /* Also on the CPU, where nothing is captured: the same steps on every backend, and the
     * tests' graphs-on vs graphs-off comparison shows the warm-up leaves no trace. */
    if (st == GDP_STATUS_SUCCESS && e->cfg.cuda_graphs)
        st = warm_up(e); /* collective */
    if (st != GDP_STATUS_SUCCESS) {
        if (e != NULL)
            engine_destroy(e);
        return st;
    }
    *out = e;
    return GDP_STATUS_SUCCESS;
}

static void run_free(run *r) {
    for (int32_t i = 0; r->r != NULL && i < r->n; i++) {
        free(r->r[i].tokens);
        free(r->r[i].margin);
        free(r->r[i].scale);
    }
    free(r->r);
    free(r->slot_owner);
    free(r->released_now);
    free(r->release);
    free(r->free_bufs);
    free(r->itl);
    free(r->kept_logits);
    memset(r, 0, sizeof *r);
}

static void engine_destroy(struct gdp_engine *e) {
    run_free(&e->main);
    gdp_cache_free(e->cache);
    gdp_plan_free(e->plan);
#ifdef GDP_HAVE_CUDA
    for (int32_t b = 0; e->graphs != NULL && b < e->n_buckets; b++)
        if (e->graphs[b].exec != NULL)
            (void)cudaGraphExecDestroy(e->graphs[b].exec);
#endif
    free(e->buckets);
    free(e->bucket_of);
    free(e->bucket_S);
    free(e->bucket_seen);
    free(e->graphs);
    free(e->frame);
    free(e->row_tokens);
    if (e->x != NULL)
        gdp_layer_buf_free(e->ctx, e->x);
    free(e->logits);
    free(e->logit_rows);
    for (int32_t i = 0; i < e->n_swap_bufs; i++)
        free(e->swap_bufs[i]);
    free(e->swap_bufs);
    e->magic = e->magic_end = 0;
    free(e);
}

gdp_status_t gdp_engine_free(gdp_engine_t engine) {
    if (engine == NULL)
        return GDP_STATUS_SUCCESS;
    GDP_CHECK(check_engine(engine, "gdp_engine_free"));
    engine_destroy(engine);
    return GDP_STATUS_SUCCESS;
}

/* ---- the root's run state ---------------------------------------------------------------- */

/* Every rule a workload must meet, before anything is touched (the root). */
static gdp_status_t validate_workload(const struct gdp_engine *e, const gdp_workload *wl, int64_t *total_new) {
    static const char *op = "gdp_engine_run";
    if (wl == NULL || wl->n_requests < 1 || wl->requests == NULL)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: the root passed %s; pass a workload with at least one request", op,
                 wl == NULL ? "no workload" : "an empty workload");
    const gdp_engine_config *c = &e->cfg;
    *total_new = 0;
    for (int32_t i = 0; i < wl->n_requests; i++) {
        const gdp_request_spec *q = &wl->requests[i];
        if (q->prompt_len < 1 || q->prompt == NULL || q->max_new_tokens < 1 || !(q->arrival_s >= 0))
            GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                     "%s: request %lld has prompt_len %d, max_new_tokens %d, arrival %g; need >= 1, >= 1, >= 0", op,
                     (long long)q->id, q->prompt_len, q->max_new_tokens, q->arrival_s);
        if (c->prefill_chunk == 0 && q->prompt_len > c->max_step_tokens)
            GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                     "%s: request %lld has a prompt of %d tokens but whole-prompt prefill (prefill_chunk 0) must fit "
                     "one step of max_step_tokens %d; raise the budget or prefill in chunks", op, (long long)q->id,
                     q->prompt_len, c->max_step_tokens);
        for (int32_t t = 0; t < q->prompt_len; t++)
            if (q->prompt[t] < 0 || q->prompt[t] >= e->vocab)
                GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                         "%s: request %lld: prompt[%d] = %d is outside the model's vocabulary [0, %lld)", op,
                         (long long)q->id, t, q->prompt[t], (long long)e->vocab);
        if (i > 0 && q->arrival_s < wl->requests[i - 1].arrival_s)
            GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                     "%s: request %lld arrives at %g s, before its predecessor (%g s); sort the workload by arrival", op,
                     (long long)q->id, q->arrival_s, wl->requests[i - 1].arrival_s);
        *total_new += q->max_new_tokens;
    }
    return GDP_STATUS_SUCCESS;
}

/* The root's state of a run over a validated workload. */
static gdp_status_t run_init(struct gdp_engine *e, run *r, const gdp_workload *wl, int32_t keep_logits,
                             int first_logits) {
    memset(r, 0, sizeof *r);
    int64_t total_new = 0;
    GDP_CHECK(validate_workload(e, wl, &total_new));
    const gdp_engine_config *c = &e->cfg;
    r->n = wl->n_requests;
    r->r = gdp_calloc((size_t)r->n, sizeof *r->r, "the run's requests");
    r->slot_owner = gdp_calloc((size_t)c->n_slots, sizeof(int32_t), "the run's slot table");
    r->released_now = gdp_calloc((size_t)c->n_slots, 1, "the run's release marks");
    r->release = gdp_calloc((size_t)c->n_slots, sizeof(int32_t), "the run's releases");
    r->free_bufs = gdp_calloc((size_t)r->n, sizeof(int32_t), "the run's swap ids");
    r->itl = gdp_calloc((size_t)total_new, sizeof(double), "the run's token gaps");
    r->keep_logits = keep_logits < r->n ? keep_logits : r->n;
    if (r->keep_logits > 0)
        r->kept_logits = gdp_calloc((size_t)r->keep_logits * (size_t)e->vocab, sizeof(float), "the kept logits");
    if (r->r == NULL || r->slot_owner == NULL || r->released_now == NULL || r->release == NULL ||
        r->free_bufs == NULL || r->itl == NULL || (r->keep_logits > 0 && r->kept_logits == NULL))
        return GDP_STATUS_SYSTEM_ERROR;
    r->first_logits = first_logits;
    for (int32_t s = 0; s < c->n_slots; s++)
        r->slot_owner[s] = -1;
    for (int32_t i = 0; i < r->n; i++) {
        rq *q = &r->r[i];
        q->spec = &wl->requests[i];
        const int32_t cap = q->spec->prompt_len + q->spec->max_new_tokens + e->S_max;
        q->tokens = gdp_calloc((size_t)cap, sizeof(int32_t), "a request's tokens");
        q->margin = gdp_calloc((size_t)q->spec->max_new_tokens, sizeof(float), "a request's margins");
        q->scale = gdp_calloc((size_t)q->spec->max_new_tokens, sizeof(float), "a request's logit scales");
        if (q->tokens == NULL || q->margin == NULL || q->scale == NULL)
            return GDP_STATUS_SYSTEM_ERROR;
        memcpy(q->tokens, q->spec->prompt, sizeof(int32_t) * (size_t)q->spec->prompt_len);
        q->n_tokens = q->spec->prompt_len;
        q->slot = q->swap_buf = -1;
        q->arrival = c->honor_arrivals ? q->spec->arrival_s : 0;
        r->work_total += q->spec->prompt_len + q->spec->max_new_tokens;
    }
    return GDP_STATUS_SUCCESS;
}

/* ---- the n-gram drafter ------------------------------------------------------------------- */

/* Prompt lookup: the most recent earlier occurrence of the last n tokens (n = nmax .. 2)
 * proposes the up to k tokens that followed it. Returns how many it proposes. */
static int32_t ngram_draft(const int32_t *h, int32_t len, int32_t nmax, int32_t k, int32_t *out) {
    for (int32_t n = nmax < len - 1 ? nmax : len - 1; n >= 2; n--) {
        const int32_t *suffix = h + len - n;
        for (int32_t j = len - n - 1; j >= 0; j--) {
            if (memcmp(h + j, suffix, sizeof(int32_t) * (size_t)n) != 0)
                continue;
            int32_t m = 0;
            while (m < k && j + n + m < len)
                out[m] = h[j + n + m], m++;
            if (m > 0)
                return m;
        }
    }
    return 0;
}

/* ---- one step ------------------------------------------------------------------------------ */

/* What the root composed for the step besides the frame (arrays sized at run start). */
typedef struct step_plan {
    gdp_step_desc        desc;
    int32_t             *dec_req;    /* [n_slots] request of each decode entry              */
    int32_t             *n_drafts;   /* [n_slots] real drafts of each decode request        */
    int32_t             *drafts;     /* [n_slots, 16] the drafts                             */
    int32_t             *dec_slots;  /* [n_slots]                                           */
    int32_t             *releases;   /* [n_slots]                                           */
    gdp_draft_accept    *accepts;    /* [n_slots]                                           */
    int32_t             *freed_bufs; /* [n_slots] swap ids free again after this step      */
    int32_t              n_freed_bufs;
    int32_t             *pre_req;    /* [max_prefill] request of each prefill entry         */
    gdp_prefill_request *prefill;    /* [max_prefill]                                       */
    double               idle_s;     /* time the root slept waiting for arrivals            */
} step_plan;

#define MAX_DRAFTS 16

static void step_plan_free(step_plan *sp) {
    if (sp == NULL)
        return;
    free(sp->dec_req), free(sp->n_drafts), free(sp->drafts), free(sp->dec_slots), free(sp->releases);
    free(sp->accepts), free(sp->freed_bufs), free(sp->pre_req), free(sp->prefill);
    free(sp);
}

static step_plan *step_plan_alloc(const struct gdp_engine *e) {
    step_plan *sp = gdp_calloc(1, sizeof *sp, "the step plan scratch");
    if (sp == NULL)
        return NULL;
    const size_t n = (size_t)e->cfg.n_slots, np = (size_t)e->max_prefill;
    sp->dec_req = calloc(n, sizeof(int32_t)), sp->n_drafts = calloc(n, sizeof(int32_t));
    sp->drafts = calloc(n * MAX_DRAFTS, sizeof(int32_t)), sp->dec_slots = calloc(n, sizeof(int32_t));
    sp->releases = calloc(n, sizeof(int32_t)), sp->accepts = calloc(n, sizeof(gdp_draft_accept));
    sp->freed_bufs = calloc(n, sizeof(int32_t)), sp->pre_req = calloc(np, sizeof(int32_t));
    sp->prefill = calloc(np, sizeof(gdp_prefill_request));
    if (!sp->dec_req || !sp->n_drafts || !sp->drafts || !sp->dec_slots || !sp->releases || !sp->accepts ||
        !sp->freed_bufs || !sp->pre_req || !sp->prefill) {
        step_plan_free(sp);
        gdp_set_error(GDP_STATUS_SYSTEM_ERROR, __FILE__, __LINE__, "engine: out of memory for the step plan");
        return NULL;
    }
    return sp;
}

static double elapsed(double t0) { return now_s() - t0; }

/* Composes the next step on the root: fills e->frame (kind STEP, or STOP when every request
 * is done and every slot released) and sp. Sleeps while only future arrivals remain. */
static gdp_status_t compose(struct gdp_engine *e, run *r, step_plan *sp, double t0, int64_t step_no) {
    const gdp_engine_config *c = &e->cfg;
    int32_t *f = e->frame;
    sp->idle_s = 0;
    for (;;) {
        memset(f, 0, sizeof(int32_t) * F_HEADER);
        memset(&sp->desc, 0, sizeof sp->desc);
        memset(r->released_now, 0, (size_t)c->n_slots);
        sp->n_freed_bufs = 0;
        int32_t *swap_out = f + F_HEADER, *swap_in = swap_out + SWAP_OUT_WORDS * c->n_slots;
        int32_t *tok = swap_in + SWAP_IN_WORDS * c->n_slots;
        int32_t n_out = 0, n_in = 0, n_rel = 0, n_acc = 0, n_dec = 0, n_pre = 0, n_tok = 0;
        const double now = elapsed(t0);

        /* 1. arrivals */
        for (int32_t i = 0; i < r->n; i++)
            if (r->r[i].state == RQ_FUTURE && r->r[i].arrival <= now) {
                r->r[i].state = RQ_QUEUED;
                r->r[i].order = r->seq++;
            }
        /* 2. releases of the requests that finished last step */
        for (int32_t k = 0; k < r->n_release; k++) {
            sp->releases[n_rel++] = r->release[k];
            r->released_now[r->release[k]] = 1;
        }
        r->n_release = 0;
        int32_t free_total = 0, waiting = 0; /* slots free after this step's releases */
        for (int32_t s = 0; s < c->n_slots; s++)
            free_total += r->slot_owner[s] < 0;
        for (int32_t i = 0; i < r->n; i++)
            waiting += r->r[i].state == RQ_QUEUED || r->r[i].state == RQ_SWAPPED;

        /* 3. preemption: requests wait and not even this step's releases leave a slot */
        if (c->preempt && waiting > 0 && free_total == 0) {
            int32_t cap = c->n_slots / 4 > 1 ? c->n_slots / 4 : 1;
            cap = cap < waiting ? cap : waiting;
            for (int32_t v = 0; v < cap; v++) {
                int32_t best = -1;
                for (int32_t i = 0; i < r->n; i++) {
                    const rq *q = &r->r[i];
                    if (q->state == RQ_DECODE && q->run_steps >= c->preempt_after &&
                        (best < 0 || q->run_steps > r->r[best].run_steps))
                        best = i;
                }
                if (best < 0)
                    break;
                rq *q = &r->r[best];
                const int32_t buf = r->n_free_bufs > 0 ? r->free_bufs[--r->n_free_bufs] : r->n_bufs++;
                const int32_t pending = q->draft_S > 0;
                int32_t *w = swap_out + SWAP_OUT_WORDS * n_out++;
                w[0] = q->slot, w[1] = buf, w[2] = pending ? q->draft_S : 0, w[3] = pending ? q->draft_keep : 0;
                sp->releases[n_rel++] = q->slot;
                r->released_now[q->slot] = 1;
                r->slot_owner[q->slot] = -1;
                q->slot = -1, q->swap_buf = buf, q->draft_S = q->draft_keep = 0;
                q->state = RQ_SWAPPED, q->order = r->seq++, q->preemptions++;
                e->report.preemptions++;
            }
        }
        /* 4. resumes (preemption order) into slots that were free before this step */
        for (;;) {
            int32_t best = -1, slot = -1;
            for (int32_t i = 0; i < r->n; i++)
                if (r->r[i].state == RQ_SWAPPED && (best < 0 || r->r[i].order < r->r[best].order))
                    best = i;
            for (int32_t s = 0; s < c->n_slots && slot < 0; s++)
                if (r->slot_owner[s] < 0 && !r->released_now[s])
                    slot = s;
            if (best < 0 || slot < 0)
                break;
            rq *q = &r->r[best];
            int32_t *w = swap_in + SWAP_IN_WORDS * n_in++;
            w[0] = q->swap_buf, w[1] = slot;
            sp->freed_bufs[sp->n_freed_bufs++] = q->swap_buf;
            r->slot_owner[slot] = best;
            q->slot = slot, q->swap_buf = -1, q->state = RQ_DECODE, q->run_steps = 0;
            e->report.resumes++;
        }
        /* 5. decode: every running request, S = 1 + the most drafts any of them has */
        int32_t S = 1;
        for (int32_t i = 0; i < r->n; i++) {
            rq *q = &r->r[i];
            if (q->state != RQ_DECODE)
                continue;
            sp->dec_req[n_dec] = i;
            sp->dec_slots[n_dec] = q->slot;
            int32_t k = 0;
            const int32_t room = q->spec->max_new_tokens - q->n_gen - 1; /* the last token needs no draft */
            if (c->draft_tokens > 0 && room > 0)
                k = ngram_draft(q->tokens, q->n_tokens, c->ngram, c->draft_tokens < room ? c->draft_tokens : room,
                                sp->drafts + (size_t)n_dec * MAX_DRAFTS);
            sp->n_drafts[n_dec] = k;
            S = 1 + k > S ? 1 + k : S;
            if (q->draft_S > 0) {
                sp->accepts[n_acc++] = (gdp_draft_accept){.slot = q->slot, .n_accepted = q->draft_keep};
                q->draft_S = q->draft_keep = 0;
            }
            n_dec++;
        }
        if (S > 1)
            S = e->S_max; /* one padded shape per S keeps the buckets (and graphs) few */
        for (int32_t d = 0; d < n_dec; d++) {
            const rq *q = &r->r[sp->dec_req[d]];
            tok[n_tok++] = q->tokens[q->n_fed];
            for (int32_t s = 1; s < S; s++) /* past the real drafts: filler, verified like any draft */
                tok[n_tok] = s <= sp->n_drafts[d] ? sp->drafts[(size_t)d * MAX_DRAFTS + s - 1] : tok[n_tok - 1], n_tok++;
        }
        /* 6. prefill slices: running prefills first, then new requests while slots last */
        int32_t budget = c->max_step_tokens - n_dec * S, slots_left = 0, pre_tokens = 0;
        for (int32_t sl = 0; sl < c->n_slots; sl++) /* new requests may also take this step's releases */
            slots_left += r->slot_owner[sl] < 0;
        for (int pass = 0; pass < 2; pass++) {
            for (;;) {
                int32_t best = -1;
                for (int32_t i = 0; i < r->n; i++) {
                    const rq *q = &r->r[i];
                    const bool cand = pass == 0 ? q->state == RQ_PREFILL : q->state == RQ_QUEUED;
                    bool taken = false;
                    for (int32_t p = 0; p < n_pre && !taken; p++)
                        taken = sp->pre_req[p] == i;
                    if (cand && !taken && (best < 0 || q->order < r->r[best].order)) {
                        const int32_t rem = q->spec->prompt_len - q->n_fed;
                        const int32_t slice = c->prefill_chunk > 0 && rem > c->prefill_chunk ? c->prefill_chunk : rem;
                        if (slice <= budget)
                            best = i;
                    }
                }
                if (best < 0 || n_pre >= e->max_prefill || (pass == 1 && slots_left <= 0))
                    break;
                rq *q = &r->r[best];
                const int32_t rem = q->spec->prompt_len - q->n_fed;
                const int32_t slice = c->prefill_chunk > 0 && rem > c->prefill_chunk ? c->prefill_chunk : rem;
                const bool is_new = q->state == RQ_QUEUED;
                sp->pre_req[n_pre] = best;
                sp->prefill[n_pre] = (gdp_prefill_request){.slot = is_new ? GDP_SLOT_AUTO : q->slot,
                                                           .n_tokens = slice, .flags = is_new ? GDP_PREFILL_NEW : 0};
                n_pre++;
                memcpy(tok + n_tok, q->tokens + q->n_fed, sizeof(int32_t) * (size_t)slice);
                n_tok += slice;
                budget -= slice;
                pre_tokens += slice;
                if (is_new) {
                    q->state = RQ_PREFILL;
                    q->order = r->seq++;
                    slots_left--;
                }
            }
        }

        sp->desc = (gdp_step_desc){.decode_count = n_dec, .decode_tokens = S, .decode_slots = sp->dec_slots,
                                   .prefill_count = n_pre, .prefill = sp->prefill, .release_count = n_rel,
                                   .release_slots = sp->releases, .accept_count = n_acc, .accept = sp->accepts,
                                   .bucket = GDP_BUCKET_AUTO};
        f[F_STEP] = (int32_t)step_no, f[F_SWAP_OUT] = n_out, f[F_SWAP_IN] = n_in, f[F_DECODE] = n_dec, f[F_S] = S;
        f[F_PREFILL] = n_pre, f[F_TOKENS] = n_tok;
        if (n_dec > 0 || n_pre > 0) {
            sp->desc.bucket = bucket_for(e, S, n_dec, pre_tokens);
            if (sp->desc.bucket < 0)
                GDP_FAIL(GDP_STATUS_INTERNAL_ERROR, "engine: no bucket for S %d, %d decode requests, %d prefill tokens",
                         S, n_dec, pre_tokens);
            f[F_KIND] = FRAME_STEP;
            break;
        }
        if (n_out > 0 || n_in > 0 || n_rel > 0 || n_acc > 0) {
            f[F_KIND] = FRAME_STEP; /* slot work but no tokens: apply without a forward pass */
            f[F_RELEASE_ONLY] = 1;
            break;
        }
        if (r->n_done == r->n) {
            f[F_KIND] = FRAME_STOP;
            break;
        }
        /* Only future arrivals remain: wait for the next one. */
        double next = 1e30;
        for (int32_t i = 0; i < r->n; i++)
            if (r->r[i].state == RQ_FUTURE && r->r[i].arrival < next)
                next = r->r[i].arrival;
        if (next > 1e29)
            GDP_FAIL(GDP_STATUS_INTERNAL_ERROR, "engine: %d of %d requests are done, none can be scheduled", r->n_done,
                     r->n);
        const double wait = next - elapsed(t0);
        if (wait > 0) {
            struct timespec ts = {.tv_sec = (time_t)wait, .tv_nsec = (long)((wait - floor(wait)) * 1e9)};
            const double ti = now_s();
            nanosleep(&ts, NULL);
            sp->idle_s += now_s() - ti;
        }
    }
    for (int32_t k = 0; k < sp->n_freed_bufs; k++)
        r->free_bufs[r->n_free_bufs++] = sp->freed_bufs[k];
    return GDP_STATUS_SUCCESS;
}

/* Greedy choice with its top-2 margin and the logits' max |value|. */
static int32_t argmax(const float *l, int64_t V, float *margin, float *scale) {
    int32_t best = 0, second = -1;
    float mx = fabsf(l[0]);
    for (int64_t v = 1; v < V; v++) {
        mx = fabsf(l[v]) > mx ? fabsf(l[v]) : mx;
        if (l[v] > l[best]) {
            second = best;
            best = (int32_t)v;
        } else if (second < 0 || l[v] > l[second]) {
            second = (int32_t)v;
        }
    }
    *margin = second >= 0 ? l[best] - l[second] : INFINITY;
    *scale = mx;
    return best;
}

/* Appends a generated token to a request on the root. */
static void emit(struct gdp_engine *e, run *r, int32_t index, int32_t token, float margin, float scale,
                 const float *logits, double t) {
    rq *q = &r->r[index];
    q->tokens[q->n_tokens++] = token;
    q->margin[q->n_gen] = margin;
    q->scale[q->n_gen] = scale;
    if (q->n_gen == 0)
        q->first_token = t;
    else
        r->itl[r->n_itl++] = t - q->last_token_s;
    q->last_token_s = t;
    q->n_gen++;
    r->work_done++;
    if (index < r->keep_logits && (!r->first_logits || q->n_gen == 1))
        memcpy(r->kept_logits + (size_t)index * (size_t)e->vocab, logits, sizeof(float) * (size_t)e->vocab);
}

static void finish(run *r, int32_t index, double t) {
    rq *q = &r->r[index];
    q->state = RQ_DONE;
    q->finish = t;
    r->release[r->n_release++] = q->slot;
    r->slot_owner[q->slot] = -1;
    q->slot = -1;
    q->draft_S = q->draft_keep = 0;
    r->n_done++;
}

/* After the forward pass, on the root: logits, greedy tokens, draft verification. */
static gdp_status_t sample(struct gdp_engine *e, run *r, const step_plan *sp, const gdp_step_metadata *m,
                           double t0, double *head_s) {
    const int32_t S = m->decode_tokens, n_dec = m->decode_count, n_pre = m->prefill_count;
    int32_t n = 0;
    for (int32_t d = 0; d < n_dec; d++)
        for (int32_t s = 0; s < S; s++)
            e->logit_rows[n++] = d * S + s;
    const int32_t first_prefill_row = n;
    for (int32_t p = 0; p < n_pre; p++) {
        const rq *q = &r->r[sp->pre_req[p]];
        if (q->n_fed + sp->prefill[p].n_tokens == q->spec->prompt_len)
            e->logit_rows[n++] = m->prefill_token_offset + m->host.cu_seqlens[p] + sp->prefill[p].n_tokens - 1;
    }
    if (n > 0) {
        gdp_tensor xt;
        GDP_CHECK(gdp_tensor_init(&xt, e->x, GDP_DTYPE_FP32, 2, (const int64_t[]){m->padded_token_count, e->D}));
        const double th = now_s();
        GDP_CHECK(gdp_model_logits(e->model, e->logits, &xt, e->logit_rows, n));
        *head_s += now_s() - th;
    }
    const double t = elapsed(t0);
    const int64_t V = e->vocab;
    for (int32_t d = 0; d < n_dec; d++) {
        const int32_t i = sp->dec_req[d];
        rq *q = &r->r[i];
        const int32_t *inputs = e->frame + F_HEADER + (SWAP_OUT_WORDS + SWAP_IN_WORDS) * e->cfg.n_slots + d * S;
        int32_t kept = 0;
        for (int32_t s = 0; s < S && q->n_gen < q->spec->max_new_tokens; s++) {
            const float *l = e->logits + (size_t)(d * S + s) * (size_t)V;
            float margin, scale;
            const int32_t tokn = argmax(l, V, &margin, &scale);
            emit(e, r, i, tokn, margin, scale, l, t);
            kept++;
            if (s + 1 >= S || tokn != inputs[s + 1])
                break; /* the next input was not the greedy token: the rest is rejected */
        }
        q->drafts_proposed += sp->n_drafts[d];
        q->drafts_accepted += kept - 1 < sp->n_drafts[d] ? kept - 1 : sp->n_drafts[d];
        e->report.drafts_proposed += sp->n_drafts[d];
        e->report.drafts_accepted += kept - 1 < sp->n_drafts[d] ? kept - 1 : sp->n_drafts[d];
        q->n_fed += kept; /* inputs whose state is kept: the pending token and kept - 1 drafts */
        q->run_steps++;
        if (q->n_gen >= q->spec->max_new_tokens) {
            finish(r, i, t);
        } else if (kept < S) {
            q->draft_S = S, q->draft_keep = kept; /* rolled back by next step's accept */
        }
    }
    int32_t row = first_prefill_row;
    for (int32_t p = 0; p < n_pre; p++) {
        const int32_t i = sp->pre_req[p];
        rq *q = &r->r[i];
        if (sp->prefill[p].flags & GDP_PREFILL_NEW) {
            q->slot = m->step->prefill[p].slot; /* resolved from GDP_SLOT_AUTO by the plan */
            r->slot_owner[q->slot] = i;
        }
        q->n_fed += sp->prefill[p].n_tokens;
        r->work_done += sp->prefill[p].n_tokens;
        if (q->n_fed < q->spec->prompt_len)
            continue;
        const float *l = e->logits + (size_t)(row++) * (size_t)V;
        float margin, scale;
        const int32_t first = argmax(l, V, &margin, &scale);
        emit(e, r, i, first, margin, scale, l, t);
        q->state = RQ_DECODE;
        q->run_steps = 0;
        if (q->n_gen >= q->spec->max_new_tokens)
            finish(r, i, t);
    }
    return GDP_STATUS_SUCCESS;
}

/* Every rank: the frame's swaps on this rank's cache share. */
static gdp_status_t do_swaps(struct gdp_engine *e) {
    const int32_t *f = e->frame, *out = f + F_HEADER, *in = out + SWAP_OUT_WORDS * e->cfg.n_slots;
    for (int32_t k = 0; k < f[F_SWAP_OUT]; k++) {
        char *buf = NULL;
        const int32_t *w = out + SWAP_OUT_WORDS * k;
        GDP_CHECK(swap_buffer(e, w[1], &buf));
        GDP_CHECK(slot_save(e->cache, w[0], w[2], w[3], buf));
        e->swap_live++;
    }
    for (int32_t k = 0; k < f[F_SWAP_IN]; k++) {
        char *buf = NULL;
        const int32_t *w = in + SWAP_IN_WORDS * k;
        GDP_CHECK(swap_buffer(e, w[0], &buf));
        GDP_CHECK(slot_load(e->cache, w[1], buf));
        e->swap_live--;
    }
    e->swap_live_peak = e->swap_live > e->swap_live_peak ? e->swap_live : e->swap_live_peak;
    return GDP_STATUS_SUCCESS;
}

/* Every rank: the step's token ids into their rows (padding rows: -1, embedded as zeros). */
static void place_tokens(struct gdp_engine *e, const gdp_step_metadata *m) {
    const int32_t *tok = e->frame + F_HEADER + (SWAP_OUT_WORDS + SWAP_IN_WORDS) * e->cfg.n_slots;
    for (int32_t i = 0; i < m->padded_token_count; i++)
        e->row_tokens[i] = -1;
    int32_t k = 0;
    for (int32_t i = 0; i < m->decode_count * m->decode_tokens; i++)
        e->row_tokens[i] = tok[k++];
    for (int32_t p = 0; p < m->prefill_count; p++)
        for (int32_t t = m->host.cu_seqlens[p]; t < m->host.cu_seqlens[p + 1]; t++)
            e->row_tokens[m->prefill_token_offset + t] = tok[k++];
}

/* The layers, eagerly or through the step shape's graph (captured on the shape's first
 * step, replayed after). Every launch of a forward depends only on the bucket and S (each
 * bucket has one S), never on host values of the step's indices (docs/layer.md). */
static gdp_status_t forward(struct gdp_engine *e, const gdp_step_metadata *m, gdp_tensor *x) {
    graph_entry *g = &e->graphs[m->bucket];
    if (!e->cfg.cuda_graphs || m->save_count > 0) /* a snapshot save adds launches: never captured */
        return gdp_model_forward(e->model, e->cache, m, x);
#ifdef GDP_HAVE_CUDA
    if (e->graphs_live) {
        cudaStream_t s = (cudaStream_t)e->ctx->stream;
        if (g->exec == NULL) {
            cudaGraph_t graph = NULL;
            if (cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed) != cudaSuccess)
                GDP_FAIL(GDP_STATUS_CUDA_ERROR, "engine: cudaStreamBeginCapture failed for bucket %d: %s", m->bucket,
                         cudaGetErrorString(cudaGetLastError()));
            const gdp_status_t st = gdp_model_forward(e->model, e->cache, m, x);
            const cudaError_t end = cudaStreamEndCapture(s, &graph);
            if (st != GDP_STATUS_SUCCESS) {
                if (graph != NULL)
                    cudaGraphDestroy(graph);
                return st;
            }
            if (end != cudaSuccess || cudaGraphInstantiate(&g->exec, graph, 0) != cudaSuccess) {
                if (graph != NULL)
                    cudaGraphDestroy(graph);
                GDP_FAIL(GDP_STATUS_CUDA_ERROR, "engine: capturing the layers of bucket %d as a CUDA graph failed: %s;"
                         " rerun with --no-graphs", m->bucket, cudaGetErrorString(cudaGetLastError()));
            }
            cudaGraphDestroy(graph);
            g->captured = 1;
            e->report.graph_captures++;
        } else {
            g->replays++;
            e->report.graph_replays++;
        }
        if (cudaGraphLaunch(g->exec, s) != cudaSuccess)
            GDP_FAIL(GDP_STATUS_CUDA_ERROR, "engine: cudaGraphLaunch of bucket %d failed: %s", m->bucket,
                     cudaGetErrorString(cudaGetLastError()));
        return GDP_STATUS_SUCCESS;
    }
#endif
    /* No device graph (CPU backend, or graphs unavailable): the hook records the shape's
     * capture and replays and runs the same layers eagerly, so the math is identical. */
    if (!g->captured) {
        g->captured = 1;
        e->report.graph_captures++;
    } else {
        g->replays++;
        e->report.graph_replays++;
    }
    return gdp_model_forward(e->model, e->cache, m, x);
}

/* Before any capture: one eager step of the largest bucket (one token of a throwaway
 * request, then its release), so every layer's workspace has its final size and address;
 * growing it later would leave captured graphs pointing at freed memory. Collective. */
static gdp_status_t warm_up(struct gdp_engine *e) {
    int32_t big = 0;
    for (int32_t b = 1; b < e->n_buckets; b++)
        if (e->buckets[b].token_count > e->buckets[big].token_count)
            big = b;
    gdp_prefill_request p = {.slot = GDP_SLOT_AUTO, .n_tokens = 1, .flags = GDP_PREFILL_NEW};
    gdp_step_desc d = {.decode_tokens = e->bucket_S[big], .prefill_count = 1, .prefill = &p, .bucket = big};
    const gdp_step_metadata *m = NULL;
    GDP_CHECK(gdp_plan_bcast(e->plan, e->comm, 0, &d));
    GDP_CHECK(gdp_plan_build(e->plan, e->cache, e->comm, &m));
    GDP_CHECK(gdp_cache_apply_step(e->cache, m));
    const int32_t slot = m->step->prefill[0].slot;
    for (int32_t i = 0; i < m->padded_token_count; i++)
        e->row_tokens[i] = i == m->prefill_token_offset ? 0 : -1;
    gdp_tensor x;
    GDP_CHECK(gdp_tensor_init(&x, e->x, GDP_DTYPE_FP32, 2, (const int64_t[]){m->padded_token_count, e->D}));
    gdp_status_t st = gdp_model_embed(e->model, &x, e->row_tokens, m->padded_token_count);
    if (e->comm != NULL)
        st = gdp_comm_agree(e->comm, st);
    if (st == GDP_STATUS_SUCCESS)
        st = gdp_model_forward(e->model, e->cache, m, &x);
    if (st != GDP_STATUS_SUCCESS)
        return st;
    gdp_step_desc rel = {.decode_tokens = 1, .release_count = 1, .release_slots = &slot, .bucket = GDP_BUCKET_AUTO};
    GDP_CHECK(gdp_plan_bcast(e->plan, e->comm, 0, &rel));
    GDP_CHECK(gdp_plan_build(e->plan, e->cache, e->comm, &m));
    GDP_CHECK(gdp_cache_apply_step(e->cache, m));
    backend_sync(e->ctx);
    return GDP_STATUS_SUCCESS;
}

static void progress_line(const struct gdp_engine *e, const run *r, double t, int64_t steps, bool last) {
    const double rate = t > 0 ? (double)r->work_done / t : 0;
    const double eta = rate > 0 ? (double)(r->work_total - r->work_done) / rate : 0;
    int32_t running = 0, waiting = 0;
    for (int32_t i = 0; i < r->n; i++) {
        running += r->r[i].state == RQ_DECODE || r->r[i].state == RQ_PREFILL;
        waiting += r->r[i].state == RQ_QUEUED || r->r[i].state == RQ_SWAPPED;
    }
    const bool tty = isatty(fileno(stderr));
    fprintf(stderr, "%s[gdp-run] %6.1f s  step %lld  requests %d/%d done, %d running, %d waiting  %.0f tok/s  ETA %.1f s%s",
            tty ? "\r" : "", t, (long long)steps, r->n_done, r->n, running, waiting, rate, last ? 0.0 : eta,
            tty && !last ? "   " : "\n");
    fflush(stderr);
    (void)e;
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Nearest-rank percentile of n sorted values. */
static double percentile(const double *v, int64_t n, double p) {
    if (n <= 0)
        return 0;
    int64_t k = (int64_t)ceil(p / 100.0 * (double)n) - 1;
    k = k < 0 ? 0 : k >= n ? n - 1 : k;
    return v[k];
}

static void finish_report(struct gdp_engine *e, const run *r, double wall) {
    gdp_engine_report *rep = &e->report;
    rep->wall_s = wall;
    rep->requests = r->n_done;
    rep->prompt_tokens = rep->generated_tokens = 0;
    double *ttft = calloc((size_t)r->n + 1, sizeof(double)), *tpot = calloc((size_t)r->n + 1, sizeof(double));
    int64_t n_tpot = 0;
    for (int32_t i = 0; i < r->n; i++) {
        const rq *q = &r->r[i];
        rep->prompt_tokens += q->spec->prompt_len;
        rep->generated_tokens += q->n_gen;
        if (ttft != NULL)
            ttft[i] = q->first_token - q->arrival;
        if (tpot != NULL && q->n_gen > 1)
            tpot[n_tpot++] = (q->last_token_s - q->first_token) / (q->n_gen - 1);
    }
    if (ttft != NULL && tpot != NULL) {
        qsort(ttft, (size_t)r->n, sizeof(double), cmp_double);
        qsort(tpot, (size_t)n_tpot, sizeof(double), cmp_double);
        qsort(r->itl, (size_t)r->n_itl, sizeof(double), cmp_double);
        rep->ttft_p50_s = percentile(ttft, r->n, 50), rep->ttft_p99_s = percentile(ttft, r->n, 99);
        rep->tpot_p50_s = percentile(tpot, n_tpot, 50), rep->tpot_p99_s = percentile(tpot, n_tpot, 99);
        rep->itl_p50_s = percentile(r->itl, r->n_itl, 50), rep->itl_p99_s = percentile(r->itl, r->n_itl, 99);
    }
    free(ttft);
    free(tpot);
    rep->generated_per_s = wall > 0 ? (double)rep->generated_tokens / wall : 0;
    rep->tokens_per_s = wall > 0 ? (double)(rep->generated_tokens + rep->prompt_tokens) / wall : 0;
    rep->requests_per_s = wall > 0 ? r->n_done / wall : 0;
}

/* The step loop of a run (every rank; r is the root's run state, NULL elsewhere). */
static gdp_status_t run_loop(struct gdp_engine *e, run *r, bool record) {
    const bool root = e->rank == 0;
    step_plan *sp = root ? step_plan_alloc(e) : NULL;
    gdp_status_t st = root && sp == NULL ? GDP_STATUS_SYSTEM_ERROR : GDP_STATUS_SUCCESS;
    if (e->comm != NULL)
        st = gdp_comm_agree(e->comm, st);
    if (st != GDP_STATUS_SUCCESS) {
        step_plan_free(sp);
        return st;
    }
    gdp_engine_report *rep = &e->report;
    const double t0 = now_s();
    double last_progress = 0;
    int64_t step_no = 0;
    for (;;) {
        double ph[GDP_PHASE_NUM] = {0, 0, 0, 0};
        const double ts = now_s();
        /* 1. the root composes; a failure travels in the frame */
        gdp_status_t local = GDP_STATUS_SUCCESS;
        if (root) {
            local = compose(e, r, sp, t0, step_no + 1);
            if (local != GDP_STATUS_SUCCESS)
                e->frame[F_KIND] = FRAME_ERROR;
        }
        const double tc = now_s();
        const double idle = root ? sp->idle_s : 0;
        ph[GDP_PHASE_HOST] += tc - ts - idle;
        if (record)
            rep->idle_s += idle;
        if (e->comm != NULL)
            GDP_CHECK(gdp_comm_host_bcast(e->comm, e->frame, e->frame_words * sizeof(int32_t), 0));
        if (e->frame[F_KIND] == FRAME_ERROR) {
            st = e->comm != NULL ? gdp_comm_agree(e->comm, local) : local;
            break;
        }
        if (e->frame[F_KIND] == FRAME_STOP)
            break;
        step_no++;
        /* 2. every rank: swaps, the plan, the tokens */
        const double tb = now_s();
        ph[GDP_PHASE_COLLECTIVE] += tb - tc;
        local = do_swaps(e);
        double tp0 = now_s();
        ph[GDP_PHASE_HOST] += tp0 - tb;
        /* a failed swap must reach every rank before the plan's collectives */
        if (e->comm != NULL)
            st = gdp_comm_agree(e->comm, local);
        else
            st = local;
        if (st != GDP_STATUS_SUCCESS)
            break;
        st = gdp_plan_bcast(e->plan, e->comm, 0, root ? &sp->desc : NULL);
        const double tp1 = now_s();
        ph[GDP_PHASE_COLLECTIVE] += tp1 - tp0;
        const gdp_step_metadata *m = NULL;
        if (st == GDP_STATUS_SUCCESS)
            st = gdp_plan_build(e->plan, e->cache, e->comm, &m);
        /* the build ends with the ranks' agreement on its validation: a collective */
        const double agree = fmin(e->agree_s, now_s() - tp1);
        ph[GDP_PHASE_COLLECTIVE] += agree;
        ph[GDP_PHASE_HOST] -= agree;
        if (st == GDP_STATUS_SUCCESS)
            st = gdp_cache_apply_step(e->cache, m);
        if (st != GDP_STATUS_SUCCESS)
            break; /* build errors are the same on every rank; apply only fails on misuse */
        const bool release_only = e->frame[F_RELEASE_ONLY] != 0;
        gdp_tensor x;
        if (!release_only) {
            place_tokens(e, m);
            local = gdp_tensor_init(&x, e->x, GDP_DTYPE_FP32, 2, (const int64_t[]){m->padded_token_count, e->D});
            if (local == GDP_STATUS_SUCCESS)
                local = gdp_model_embed(e->model, &x, e->row_tokens, m->padded_token_count);
        }
        const double te = now_s();
        ph[GDP_PHASE_HOST] += te - tp1;
        if (e->comm != NULL && !release_only)
            local = gdp_comm_agree(e->comm, local);
        if (local != GDP_STATUS_SUCCESS) {
            st = local;
            break;
        }
        if (release_only) {
            if (root && record)
                rep->steps++;
            for (int p = 0; p < GDP_PHASE_NUM; p++)
                rep->phase_s[p] += record ? ph[p] : 0;
            continue;
        }
        const double ta = now_s();
        ph[GDP_PHASE_COLLECTIVE] += ta - te;
        /* 3. the layers */
        st = forward(e, m, &x);
        backend_sync(e->ctx);
        const double tf = now_s();
        if (st != GDP_STATUS_SUCCESS)
            break;
        double g, c, o;
        split_layers(e, tf - ta, m->padded_token_count, &g, &c, &o);
        ph[GDP_PHASE_GEMM] += g, ph[GDP_PHASE_COLLECTIVE] += c, ph[GDP_PHASE_GDP_OPS] += o;
        if (record && !e->bucket_seen[m->bucket]) {
            e->bucket_seen[m->bucket] = 1;
            rep->buckets_used++;
        }
        /* 4. the root samples */
        if (root) {
            double head = 0;
            st = sample(e, r, sp, m, t0, &head);
            ph[GDP_PHASE_GEMM] += head;
            ph[GDP_PHASE_HOST] += now_s() - tf - head;
            if (st != GDP_STATUS_SUCCESS) {
                /* the next frame carries the failure to the others */
                e->frame[F_KIND] = FRAME_ERROR;
                if (e->comm != NULL) {
                    gdp_comm_host_bcast(e->comm, e->frame, e->frame_words * sizeof(int32_t), 0);
                    st = gdp_comm_agree(e->comm, st);
                }
                break;
            }
            if (record) {
                rep->steps++;
                const bool dec = m->decode_count > 0, pre = m->prefill_count > 0;
                rep->decode_only_steps += dec && !pre;
                rep->prefill_only_steps += pre && !dec;
                rep->mixed_steps += dec && pre;
            }
            const double t = elapsed(t0);
            if (e->cfg.progress > 0 && record && t - last_progress >= e->cfg.progress) {
                progress_line(e, r, t, step_no, false);
                last_progress = t;
            }
        }
        for (int p = 0; p < GDP_PHASE_NUM; p++)
            rep->phase_s[p] += record ? ph[p] : 0;
    }
    if (st == GDP_STATUS_SUCCESS && root && record) {
        if (e->cfg.progress > 0)
            progress_line(e, r, elapsed(t0), step_no, true);
        finish_report(e, r, elapsed(t0));
    }
    step_plan_free(sp);
    return st;
}

static size_t peak_rss_bytes(void) {
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0)
        return 0;
    return (size_t)ru.ru_maxrss * 1024u; /* Linux reports kilobytes */
}

gdp_status_t gdp_engine_run(gdp_engine_t engine, const gdp_workload *workload) {
    static const char *op = "gdp_engine_run";
    GDP_CHECK(check_engine(engine, op));
    struct gdp_engine *e = engine;
    /* The workload is checked (on the root, agreed everywhere) before the last run's
     * results and report are dropped: a refused run leaves them as they were. */
    int64_t total_new = 0;
    gdp_status_t st = e->rank == 0 ? validate_workload(e, workload, &total_new) : GDP_STATUS_SUCCESS;
    if (e->comm != NULL)
        st = gdp_comm_agree(e->comm, st);
    if (st != GDP_STATUS_SUCCESS)
        return st;
    run_free(&e->main);
    e->have_run = 0;
    memset(&e->report, 0, sizeof e->report);
    e->report.tp_size = e->shard.tp_size;
    for (int32_t b = 0; b < e->n_buckets; b++)
        e->bucket_seen[b] = 0;
    if (e->rank == 0)
        st = run_init(e, &e->main, workload, e->cfg.check_requests, 0);
    if (e->comm != NULL)
        st = gdp_comm_agree(e->comm, st);
    if (st == GDP_STATUS_SUCCESS)
        st = run_loop(e, e->rank == 0 ? &e->main : NULL, true);
    gdp_engine_report *rep = &e->report;
    for (int p = 0; p < GDP_PHASE_NUM; p++)
        rep->step_s += rep->phase_s[p];
    gdp_model_weight_bytes(e->model, &rep->weight_bytes);
    rep->cache_bytes = e->cache_bytes;
    rep->swap_peak_bytes = (size_t)e->swap_live_peak * e->swap_bytes;
    rep->peak_rss_bytes = peak_rss_bytes();
#ifdef GDP_HAVE_CUDA
    if (e->ctx->backend == GDP_BACKEND_CUDA) {
        size_t free_b = 0, total_b = 0;
        if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess)
            rep->device_bytes = total_b - free_b;
    }
#endif
    e->have_run = st == GDP_STATUS_SUCCESS;
    return st;
}

gdp_status_t gdp_engine_get_report(gdp_engine_t engine, gdp_engine_report *report) {
    GDP_CHECK(check_engine(engine, "gdp_engine_get_report"));
    if (report == NULL)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "gdp_engine_get_report: report out-pointer is NULL");
    *report = engine->report;
    return GDP_STATUS_SUCCESS;
}

gdp_status_t gdp_engine_get_result(gdp_engine_t engine, int32_t index, gdp_request_result *out) {
    static const char *op = "gdp_engine_get_result";
    GDP_CHECK(check_engine(engine, op));
    if (out == NULL)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: out is NULL", op);
    if (engine->rank != 0 || !engine->have_run)
        GDP_FAIL(GDP_STATUS_INVALID_USAGE, "%s: results live on the root (rank 0 of the comm) after a successful "
                 "gdp_engine_run; this is rank %d%s", op, engine->rank, engine->have_run ? "" : " (no run yet)");
    const run *r = &engine->main;
    if (index < 0 || index >= r->n)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: index %d is outside [0, %d) (the workload's requests)", op, index,
                 r->n);
    const rq *q = &r->r[index];
    *out = (gdp_request_result){.id = q->spec->id, .prompt_len = q->spec->prompt_len, .n_generated = q->n_gen,
                                .tokens = q->tokens + q->spec->prompt_len, .margin = q->margin,
                                .logit_scale = q->scale, .arrival_s = q->arrival, .first_token_s = q->first_token,
                                .finish_s = q->finish, .preemptions = q->preemptions,
                                .drafts_proposed = q->drafts_proposed, .drafts_accepted = q->drafts_accepted};
    return GDP_STATUS_SUCCESS;
}

gdp_status_t gdp_engine_write_results(gdp_engine_t engine, const char *path) {
    static const char *op = "gdp_engine_write_results";
    GDP_CHECK(check_engine(engine, op));
    if (path == NULL)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: path is NULL", op);
    if (engine->rank != 0 || !engine->have_run)
        GDP_FAIL(GDP_STATUS_INVALID_USAGE, "%s: results live on the root after a successful gdp_engine_run", op);
    FILE *f = fopen(path, "w");
    if (f == NULL)
        GDP_FAIL(GDP_STATUS_SYSTEM_ERROR, "%s: cannot write %s", op, path);
    const run *r = &engine->main;
    int bad = 0;
    for (int32_t i = 0; i < r->n && !bad; i++) {
        const rq *q = &r->r[i];
        json_t *toks = json_array();
        for (int32_t k = 0; k < q->n_gen; k++)
            json_array_append_new(toks, json_integer(q->tokens[q->spec->prompt_len + k]));
        json_t *o = json_pack("{s:I, s:i, s:o, s:f, s:f, s:i}", "id", (json_int_t)q->spec->id, "prompt_len",
                              q->spec->prompt_len, "tokens", toks, "ttft_s", q->first_token - q->arrival,
                              "latency_s", q->finish - q->arrival, "preemptions", q->preemptions);
        bad = o == NULL || json_dumpf(o, f, JSON_COMPACT) != 0 || fputc('\n', f) == EOF;
        json_decref(o);
    }
    bad |= fclose(f) != 0;
    if (bad)
        GDP_FAIL(GDP_STATUS_SYSTEM_ERROR, "%s: writing %s failed", op, path);
    return GDP_STATUS_SUCCESS;
}

gdp_status_t gdp_engine_check(gdp_engine_t engine, double *worst, int32_t *checked, int32_t *mismatches) {
    static const char *op = "gdp_engine_check";
    GDP_CHECK(check_engine(engine, op));
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
            st = run_init(e, &cr, &wl, n, 1);
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
            for (int64_t v = 0; v < e->vocab; v++) {
                md = fmax(md, fabs((double)a[v] - b[v]));
                mb = fmax(mb, fabs((double)b[v]));
            }
            w = fmax(w, mb > 0 ? md / mb : md);
            float ma, sa, mr, sr;
            const int32_t ta = argmax(a, e->vocab, &ma, &sa), tb = argmax(b, e->vocab, &mr, &sr);
            if (ta != tb && ma >= bar * sa && mr >= bar * sr)
                bad++;
        }
        *worst = w, *checked = n, *mismatches = bad;
    }
    run_free(&cr);
    gdp_workload_free(&wl);
    return st;
}

/* ---- the report ------------------------------------------------------------------------- */

typedef struct rank_memory {
    uint64_t weight, cache, swap, rss, device;
    char     host[64];
} rank_memory;

static void mb(char *buf, size_t n, uint64_t bytes) { snprintf(buf, n, "%.1f MB", (double)bytes / (1 << 20)); }

gdp_status_t gdp_engine_print_report(gdp_engine_t engine, FILE *out, const char *title) {
    static const char *op = "gdp_engine_print_report";
    GDP_CHECK(check_engine(engine, op));
    const struct gdp_engine *e = engine;
    const gdp_engine_report *r = &e->report;
    rank_memory *mem = gdp_calloc((size_t)e->size, sizeof *mem, "the per-rank memory table");
    gdp_status_t st = mem ? GDP_STATUS_SUCCESS : GDP_STATUS_SYSTEM_ERROR;
    if (e->comm != NULL)
        st = gdp_comm_agree(e->comm, st);
    if (st != GDP_STATUS_SUCCESS) {
        free(mem);
        return st;
    }
    for (int32_t k = 0; k < e->size; k++) {
        rank_memory me = {.weight = r->weight_bytes, .cache = r->cache_bytes, .swap = r->swap_peak_bytes,
                          .rss = r->peak_rss_bytes, .device = r->device_bytes};
        gethostname(me.host, sizeof me.host - 1);
        if (k == e->rank)
            mem[k] = me;
        if (e->comm != NULL)
            GDP_CHECK(gdp_comm_host_bcast(e->comm, &mem[k], sizeof mem[k], k));
    }
    if (e->rank != 0 || out == NULL) {
        free(mem);
        return GDP_STATUS_SUCCESS;
    }
    const gdp_engine_config *c = &e->cfg;
    fprintf(out, "# gdp-run report\n");
    if (title != NULL)
        fprintf(out, "%s", title);
    char prefill[64];
    if (c->prefill_chunk)
        snprintf(prefill, sizeof prefill, "in slices of %d tokens", c->prefill_chunk);
    else
        snprintf(prefill, sizeof prefill, "of whole prompts");
    fprintf(out, "#   engine   : %d slots, step budget %d tokens, prefill %s, cuda graphs %s\n", c->n_slots,
            c->max_step_tokens, prefill, c->cuda_graphs ? (e->graphs_live ? "on" : "on (hooks only)") : "off");
    if (c->draft_tokens)
        fprintf(out, "#   drafts   : up to %d per step from %d..2-gram prompt lookup\n", c->draft_tokens, c->ngram);
    else
        fprintf(out, "#   drafts   : off\n");
    if (c->preempt)
        fprintf(out, "#   preempt  : after %d decode steps, slot state swapped to host memory and back\n",
                c->preempt_after);
    else
        fprintf(out, "#   preempt  : off\n");
    fprintf(out, "%-22s %d\n", "requests", r->requests);
    fprintf(out, "%-22s %lld\n", "prompt tokens", (long long)r->prompt_tokens);
    fprintf(out, "%-22s %lld\n", "generated tokens", (long long)r->generated_tokens);
    fprintf(out, "%-22s %.3f s (idle waiting for arrivals %.3f s)\n", "wall time", r->wall_s, r->idle_s);
    fprintf(out, "%-22s %.1f generated tok/s, %.1f total tok/s, %.2f req/s\n", "throughput", r->generated_per_s,
            r->tokens_per_s, r->requests_per_s);
    fprintf(out, "%-22s p50 %8.2f ms   p99 %8.2f ms\n", "time to first token", r->ttft_p50_s * 1e3,
            r->ttft_p99_s * 1e3);
    fprintf(out, "%-22s p50 %8.2f ms   p99 %8.2f ms\n", "time per output token", r->tpot_p50_s * 1e3,
            r->tpot_p99_s * 1e3);
    fprintf(out, "%-22s p50 %8.2f ms   p99 %8.2f ms\n", "inter-token latency", r->itl_p50_s * 1e3,
            r->itl_p99_s * 1e3);
    fprintf(out, "%-22s %lld (decode-only %lld, mixed %lld, prefill-only %lld), %d step shapes (buckets)\n", "steps",
            (long long)r->steps, (long long)r->decode_only_steps, (long long)r->mixed_steps,
            (long long)r->prefill_only_steps, r->buckets_used);
    fprintf(out, "%-22s %lld (resumed %lld)\n", "preemptions", (long long)r->preemptions, (long long)r->resumes);
    if (c->draft_tokens)
        fprintf(out, "%-22s proposed %lld, accepted %lld (%.1f%%)\n", "draft tokens", (long long)r->drafts_proposed,
                (long long)r->drafts_accepted,
                r->drafts_proposed ? 100.0 * (double)r->drafts_accepted / (double)r->drafts_proposed : 0.0);
    if (e->graphs_live)
        fprintf(out, "%-22s %lld captured, %lld replays\n", "graphs (step shapes)", (long long)r->graph_captures,
                (long long)r->graph_replays);
    else /* CPU backend or MPI comm: the bucket hooks run, no CUDA graph is captured */
        fprintf(out, "%-22s none captured (%s); bucket hooks: %lld first uses, %lld repeats\n",
                "graphs (step shapes)", c->cuda_graphs ? "not on this backend/comm" : "off",
                (long long)r->graph_captures, (long long)r->graph_replays);
    fprintf(out, "step time by phase (rank 0, summed over %lld steps; the layers' GEMM and collective shares are "
                 "estimated from rates calibrated at start-up):\n", (long long)r->steps);
    for (int p = 0; p < GDP_PHASE_NUM; p++)
        fprintf(out, "  %-20s %9.3f s  %5.1f%%\n", gdp_engine_phase_name((gdp_engine_phase_t)p), r->phase_s[p],
                r->step_s > 0 ? 100.0 * r->phase_s[p] / r->step_s : 0.0);
    fprintf(out, "  %-20s %9.3f s\n", "total", r->step_s);
    fprintf(out, "memory per rank:\n  %-5s %-20s %12s %12s %12s %12s %12s\n", "rank", "host", "weights", "cache",
            "swap (peak)", "peak RSS", "device used");
    for (int32_t k = 0; k < e->size; k++) {
        char w[32], ca[32], sw[32], rs[32], dv[32];
        mb(w, sizeof w, mem[k].weight), mb(ca, sizeof ca, mem[k].cache), mb(sw, sizeof sw, mem[k].swap);
        mb(rs, sizeof rs, mem[k].rss);
        if (mem[k].device)
            mb(dv, sizeof dv, mem[k].device);
        else
            snprintf(dv, sizeof dv, "-");
        fprintf(out, "  %-5d %-20.20s %12s %12s %12s %12s %12s\n", k, mem[k].host, w, ca, sw, rs, dv);
    }
    fflush(out);
    free(mem);
    return GDP_STATUS_SUCCESS;
}
